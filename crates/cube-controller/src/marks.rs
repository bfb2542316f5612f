//! What the next pass of a controller that looks at many keys in one pass must read: the
//! keys marked since the last pass, or everything.
//!
//! A pass over a whole collection (the placement pass, the waiting list's look) costs what
//! the collection holds; run for every change, it costs the square of it. Each change marks
//! its key instead, and the pass takes the marks and reads those keys alone. Everything is
//! read at start, after a pass that failed (what it took is not done), and when a change may
//! matter to every key (`mark_everything`).

use std::collections::BTreeSet;

/// Marked keys, or everything. Kept with the state the keys describe, under the same lock,
/// so that a change and its mark are seen together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marks<K: Ord> {
    everything: bool,
    keys: BTreeSet<K>,
}

impl<K: Ord> Default for Marks<K> {
    /// Nothing marked.
    fn default() -> Self {
        Marks {
            everything: false,
            keys: BTreeSet::new(),
        }
    }
}

impl<K: Ord> Marks<K> {
    /// Everything to read: a controller that starts.
    pub fn everything() -> Self {
        Marks {
            everything: true,
            keys: BTreeSet::new(),
        }
    }

    /// One key to read again.
    pub fn mark(&mut self, key: K) {
        if !self.everything {
            self.keys.insert(key);
        }
    }

    /// Every key to read again.
    pub fn mark_everything(&mut self) {
        self.everything = true;
        self.keys.clear();
    }

    /// Whether the next pass reads everything.
    pub fn is_everything(&self) -> bool {
        self.everything
    }

    /// The keys marked (empty when everything is).
    pub fn keys(&self) -> &BTreeSet<K> {
        &self.keys
    }

    /// What the next pass reads, leaving nothing marked: `None` for everything, else the
    /// keys marked.
    pub fn take(&mut self) -> Option<BTreeSet<K>> {
        let everything = std::mem::take(&mut self.everything);
        let keys = std::mem::take(&mut self.keys);
        (!everything).then_some(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_taken_once_and_everything_covers_any_key() {
        let mut marks = Marks::everything();
        marks.mark(1);
        assert_eq!(marks.take(), None, "everything, at start");
        assert_eq!(marks.take(), Some(BTreeSet::new()), "then nothing");
        marks.mark(2);
        marks.mark(3);
        marks.mark(2);
        assert_eq!(marks.take(), Some(BTreeSet::from([2, 3])));
        marks.mark(4);
        marks.mark_everything();
        marks.mark(5);
        assert!(marks.is_everything());
        assert_eq!(marks.take(), None);
        assert_eq!(marks.take(), Some(BTreeSet::new()));
    }
}
