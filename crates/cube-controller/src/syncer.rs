//! The syncer's decision: what to do to bring an observed collection to a desired one (the
//! field report's syncer, with its `CanProceedWithDeletion`). A controller plans its desired
//! collection, diffs it here and writes the actions as one batch (the waiting-list controller
//! does); carrying the actions out is the controller's own IO.
//!
//! [`diff`] is the pure decision: which desired keys to create, which observed items to update
//! and which to delete. Observed items are keyed by their own identity (`I`) and answer to a
//! desired key (`K`) through `key_of`; only items the controller owns (`owns`) are compared or
//! deleted, so a controller never deletes what another controller, or a user, made. Two owned items answering to one desired key are a duplicate:
//! one is kept (one that already matches, if any) and the others are deleted.

use std::collections::BTreeMap;

/// One thing to do to bring the observed collection to the desired one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncAction<K, I> {
    /// Make the desired item `K`; nothing owned answers to it.
    Create(K),
    /// Make observed item `I` like desired item `K`.
    Update(K, I),
    /// Remove observed item `I`, which answers to `K`: `K` is not desired, or `I` is a
    /// duplicate.
    Delete(K, I),
}

impl<K, I> SyncAction<K, I> {
    /// The desired key the action is about (the key it is queued and serialised under).
    pub fn key(&self) -> &K {
        match self {
            SyncAction::Create(key) | SyncAction::Update(key, _) | SyncAction::Delete(key, _) => {
                key
            }
        }
    }
}

/// Compares `desired` with `observed`; actions sorted by desired key, then by observed id.
pub fn diff<K: Ord + Clone, D, I: Ord + Clone, O>(
    desired: &BTreeMap<K, D>,
    observed: &BTreeMap<I, O>,
    key_of: impl Fn(&I, &O) -> K,
    owns: impl Fn(&O) -> bool,
    same: impl Fn(&D, &O) -> bool,
) -> Vec<SyncAction<K, I>> {
    let mut answering: BTreeMap<K, Vec<(&I, &O)>> = BTreeMap::new();
    for (id, item) in observed.iter().filter(|(_, item)| owns(item)) {
        answering
            .entry(key_of(id, item))
            .or_default()
            .push((id, item));
    }
    let mut actions = Vec::new();
    for (key, wanted) in desired {
        let Some(items) = answering.remove(key) else {
            actions.push(SyncAction::Create(key.clone()));
            continue;
        };
        let keeper = items
            .iter()
            .position(|(_, item)| same(wanted, item))
            .unwrap_or(0);
        for (at, (id, item)) in items.iter().enumerate() {
            if at != keeper {
                actions.push(SyncAction::Delete(key.clone(), (*id).clone()));
            } else if !same(wanted, item) {
                actions.push(SyncAction::Update(key.clone(), (*id).clone()));
            }
        }
    }
    for (key, items) in answering {
        for (id, _) in items {
            actions.push(SyncAction::Delete(key.clone(), id.clone()));
        }
    }
    actions.sort_by(|a, b| a.key().cmp(b.key()));
    actions
}

/// [`diff`] when observed items are keyed like desired ones.
pub fn diff_by_key<K: Ord + Clone, D, O>(
    desired: &BTreeMap<K, D>,
    observed: &BTreeMap<K, O>,
    owns: impl Fn(&O) -> bool,
    same: impl Fn(&D, &O) -> bool,
) -> Vec<SyncAction<K, K>> {
    diff(desired, observed, |key, _| key.clone(), owns, same)
}

#[cfg(test)]
mod tests {
    use super::*;

    use SyncAction::{Create, Delete, Update};

    /// An observed item: which desired key it answers to, its value, and who made it.
    #[derive(Debug, Clone, PartialEq)]
    struct Item {
        key: char,
        value: u32,
        ours: bool,
    }

    fn item(key: char, value: u32) -> Item {
        Item {
            key,
            value,
            ours: true,
        }
    }

    fn compare(
        desired: &BTreeMap<char, u32>,
        observed: &BTreeMap<u32, Item>,
    ) -> Vec<SyncAction<char, u32>> {
        diff(
            desired,
            observed,
            |_, item| item.key,
            |item| item.ours,
            |wanted, item| *wanted == item.value,
        )
    }

    #[test]
    fn diff_creates_updates_and_deletes() {
        let desired = BTreeMap::from([('a', 1), ('b', 2), ('c', 3)]);
        let observed = BTreeMap::from([(10, item('b', 2)), (11, item('c', 0)), (12, item('d', 4))]);
        assert_eq!(
            compare(&desired, &observed),
            [Create('a'), Update('c', 11), Delete('d', 12)]
        );
    }

    #[test]
    fn diff_never_touches_what_it_does_not_own() {
        let desired = BTreeMap::from([('a', 1)]);
        let foreign = Item {
            ours: false,
            ..item('a', 9)
        };
        let observed = BTreeMap::from([
            (10, foreign.clone()),
            (
                11,
                Item {
                    key: 'z',
                    ..foreign
                },
            ),
        ]);
        assert_eq!(compare(&desired, &observed), [Create('a')]);
    }

    #[test]
    fn duplicates_keep_the_one_that_matches_and_delete_the_others() {
        let desired = BTreeMap::from([('a', 1), ('b', 2)]);
        let observed = BTreeMap::from([
            (10, item('a', 0)),
            (11, item('a', 1)),
            (12, item('a', 1)),
            (20, item('b', 7)),
            (21, item('b', 8)),
        ]);
        assert_eq!(
            compare(&desired, &observed),
            [
                Delete('a', 10),
                Delete('a', 12),
                Update('b', 20),
                Delete('b', 21)
            ]
        );
    }

    proptest::proptest! {
        /// Carrying out a diff leaves exactly one owned item, as desired, per desired key, no
        /// owned item for any other key, every item not owned untouched, and nothing to do.
        #[test]
        fn carrying_out_a_diff_converges_and_spares_what_is_not_owned(
            desired in proptest::collection::btree_map(0u8..6, 0u32..3, 0..6),
            observed in proptest::collection::btree_map(
                0u32..40,
                (0u8..8, 0u32..3, proptest::bool::weighted(0.8)),
                0..12,
            ),
        ) {
            let keys = ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'];
            let desired: BTreeMap<char, u32> =
                desired.into_iter().map(|(k, v)| (keys[k as usize], v)).collect();
            let mut world: BTreeMap<u32, Item> = observed
                .into_iter()
                .map(|(id, (k, value, ours))| (id, Item { key: keys[k as usize], value, ours }))
                .collect();
            let before = world.clone();
            let mut next_id = 1000;
            for action in compare(&desired, &world) {
                match action {
                    Create(key) => {
                        next_id += 1;
                        world.insert(next_id, item(key, desired[&key]));
                    }
                    Update(key, id) => {
                        proptest::prop_assert!(world[&id].ours);
                        world.get_mut(&id).unwrap().value = desired[&key];
                    }
                    Delete(_, id) => {
                        proptest::prop_assert!(world[&id].ours);
                        world.remove(&id);
                    }
                }
            }
            for (key, value) in &desired {
                let answering: Vec<_> =
                    world.values().filter(|i| i.ours && i.key == *key).collect();
                proptest::prop_assert_eq!(answering.len(), 1);
                proptest::prop_assert_eq!(answering[0].value, *value);
            }
            for item in world.values().filter(|i| i.ours) {
                proptest::prop_assert!(desired.contains_key(&item.key));
            }
            let foreign = |w: &BTreeMap<u32, Item>| {
                w.iter().filter(|(_, i)| !i.ours).map(|(id, i)| (*id, i.clone())).collect::<Vec<_>>()
            };
            proptest::prop_assert_eq!(foreign(&before), foreign(&world));
            proptest::prop_assert!(compare(&desired, &world).is_empty());
        }
    }

    #[test]
    fn diff_by_key_is_diff_with_one_key() {
        let desired = BTreeMap::from([('a', 1), ('b', 2)]);
        let observed = BTreeMap::from([('b', 3), ('c', 3)]);
        assert_eq!(
            diff_by_key(&desired, &observed, |_| true, |d, o| d == o),
            [Create('a'), Update('b', 'b'), Delete('c', 'c')]
        );
    }
}
