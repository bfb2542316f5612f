//! The observed-state store: one collection as last seen (kube-runtime's reflector store, and
//! the field report's "store": where a change is found to be a create, an update, a delete or
//! nothing at all).
//!
//! An [`ObservedStore`] holds items by key behind [`Arc`] (readers copy references, never
//! values), counts every real change with an index that only grows, keeps the last changes in
//! a bounded log for [`ObservedStore::changes_since`], wakes subscribers when its index moves,
//! and says whether it is in sync: loaded from a first listing and following its source. A
//! (re-)listing goes through [`ObservedStore::replace_all`], which yields what the listing
//! changed, so readers see a re-list as ordinary changes.
//!
//! It knows nothing of where the items come from (a watch of the store, a manager's
//! own writes, a worker's change log) and does no IO.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

/// A change to apply to a store.
#[derive(Debug, Clone, PartialEq)]
pub enum Change<K, V> {
    /// The item under `key` is now this one (created or updated).
    Put(K, Arc<V>),
    /// There is no item under `key` any more.
    Delete(K),
}

impl<K, V> Change<K, V> {
    /// A [`Change::Put`] of a value not yet behind an [`Arc`].
    pub fn put(key: K, value: V) -> Self {
        Change::Put(key, Arc::new(value))
    }
}

/// A change the store recorded: its index and the item before and after. `before: None` is a
/// create, `after: None` a delete.
#[derive(Debug, PartialEq)]
pub struct Delta<K, V> {
    pub index: u64,
    pub key: K,
    pub before: Option<Arc<V>>,
    pub after: Option<Arc<V>>,
}

impl<K: Clone, V> Clone for Delta<K, V> {
    fn clone(&self) -> Self {
        Delta {
            index: self.index,
            key: self.key.clone(),
            before: self.before.clone(),
            after: self.after.clone(),
        }
    }
}

/// Every item of a store at one index.
#[derive(Debug)]
pub struct Snapshot<K, V> {
    pub index: u64,
    pub items: BTreeMap<K, Arc<V>>,
}

/// Why [`ObservedStore::changes_since`] cannot answer: the reader must list again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error(
        "changes after index {since} are no longer kept (the log starts after {forgotten_through}): list again"
    )]
    Expired { since: u64, forgotten_through: u64 },
    #[error("index {since} is ahead of the store's index {index}: list again")]
    Ahead { since: u64, index: u64 },
}

/// One observed collection, shared: clones are handles on the same store.
pub struct ObservedStore<K, V> {
    shared: Arc<Shared<K, V>>,
}

impl<K, V> Clone for ObservedStore<K, V> {
    fn clone(&self) -> Self {
        ObservedStore {
            shared: self.shared.clone(),
        }
    }
}

impl<K, V> std::fmt::Debug for ObservedStore<K, V> {
    /// The index, the size and the in-sync flag: the items may be many.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (index, len) = {
            let state = self
                .shared
                .state
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            (state.index, state.items.len())
        };
        f.debug_struct("ObservedStore")
            .field("index", &index)
            .field("len", &len)
            .field("synced", &*self.shared.synced.borrow())
            .finish()
    }
}

struct Shared<K, V> {
    /// A `std` mutex: every operation is map work and never awaits.
    state: Mutex<State<K, V>>,
    /// The index after the last change; subscribers are woken when it moves.
    index: watch::Sender<u64>,
    /// Whether the store holds a full listing and follows its source.
    synced: watch::Sender<bool>,
}

struct State<K, V> {
    items: BTreeMap<K, Arc<V>>,
    /// The index of the last change; 0 before any.
    index: u64,
    /// The last changes, oldest first, at most `log_capacity`.
    log: VecDeque<Delta<K, V>>,
    log_capacity: usize,
    /// The highest index dropped from the log: a reader at an index below it missed changes.
    forgotten_through: u64,
}

/// Changes kept for [`ObservedStore::changes_since`] by [`ObservedStore::default`].
pub const DEFAULT_LOG_CAPACITY: usize = 1024;

impl<K: Ord + Clone, V: PartialEq> Default for ObservedStore<K, V> {
    fn default() -> Self {
        ObservedStore::new(DEFAULT_LOG_CAPACITY)
    }
}

impl<K: Ord + Clone, V: PartialEq> ObservedStore<K, V> {
    /// An empty store, out of sync, that keeps the last `log_capacity` changes.
    pub fn new(log_capacity: usize) -> Self {
        ObservedStore {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    items: BTreeMap::new(),
                    index: 0,
                    log: VecDeque::new(),
                    log_capacity,
                    forgotten_through: 0,
                }),
                index: watch::Sender::new(0),
                synced: watch::Sender::new(false),
            }),
        }
    }

    /// A store holding `items` at `index`, out of sync, that keeps the last `log_capacity`
    /// changes from there on. For a collection whose index continues one kept elsewhere (a
    /// worker's tasks, numbered from its task store's persisted index): no change at or
    /// before `index` is kept, so a reader from before it lists again, and a reader at it is
    /// told exactly what came after.
    pub fn starting_at(
        index: u64,
        items: impl IntoIterator<Item = (K, Arc<V>)>,
        log_capacity: usize,
    ) -> Self {
        ObservedStore {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    items: items.into_iter().collect(),
                    index,
                    log: VecDeque::new(),
                    log_capacity,
                    forgotten_through: index,
                }),
                index: watch::Sender::new(index),
                synced: watch::Sender::new(false),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State<K, V>> {
        // Each operation leaves the map, the index and the log consistent before it could
        // panic (a panic in `V::eq` happens before anything is written).
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Applies one change. True when it changed something: a put of an equal value, or a
    /// delete of a missing key, changes nothing and moves no index.
    pub fn apply(&self, change: Change<K, V>) -> bool {
        self.apply_all([change]) == 1
    }

    /// Applies changes in order, waking subscribers once. The number that changed something.
    pub fn apply_all(&self, changes: impl IntoIterator<Item = Change<K, V>>) -> usize {
        let (changed, index) = {
            let mut state = self.state();
            let mut changed = 0;
            for change in changes {
                if state.apply(change).is_some() {
                    changed += 1;
                }
            }
            (changed, state.index)
        };
        if changed > 0 {
            self.shared.index.send_replace(index);
        }
        changed
    }

    /// Replaces the whole collection with a listing, and returns what that changed (empty if
    /// nothing did). Does not touch the in-sync flag: the caller says when it is in sync.
    pub fn replace_all(&self, items: impl IntoIterator<Item = (K, Arc<V>)>) -> Vec<Delta<K, V>> {
        let listed: BTreeMap<K, Arc<V>> = items.into_iter().collect();
        let (deltas, index) = {
            let mut state = self.state();
            let gone: Vec<K> = state
                .items
                .keys()
                .filter(|key| !listed.contains_key(key))
                .cloned()
                .collect();
            let changes = gone.into_iter().map(Change::Delete).chain(
                listed
                    .into_iter()
                    .map(|(key, value)| Change::Put(key, value)),
            );
            let deltas: Vec<_> = changes.filter_map(|change| state.apply(change)).collect();
            (deltas, state.index)
        };
        if !deltas.is_empty() {
            self.shared.index.send_replace(index);
        }
        deltas
    }

    /// The item under `key`.
    pub fn get(&self, key: &K) -> Option<Arc<V>> {
        self.state().items.get(key).cloned()
    }

    /// Every item, and the index they are at.
    pub fn snapshot(&self) -> Snapshot<K, V> {
        let state = self.state();
        Snapshot {
            index: state.index,
            items: state.items.clone(),
        }
    }

    pub fn len(&self) -> usize {
        self.state().items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.state().items.is_empty()
    }

    /// The index of the last change (0 before any).
    pub fn index(&self) -> u64 {
        self.state().index
    }

    /// The changes after `since`, oldest first; an error when the log no longer holds them all
    /// (the reader lists again with [`ObservedStore::snapshot`]).
    pub fn changes_since(&self, since: u64) -> Result<Vec<Delta<K, V>>, StoreError> {
        let state = self.state();
        if since > state.index {
            return Err(StoreError::Ahead {
                since,
                index: state.index,
            });
        }
        if since < state.forgotten_through {
            return Err(StoreError::Expired {
                since,
                forgotten_through: state.forgotten_through,
            });
        }
        let newer = state.log.partition_point(|delta| delta.index <= since);
        Ok(state.log.range(newer..).cloned().collect())
    }

    /// The changes after `since`, waiting while there are none (a blocking query; bound the
    /// wait with `tokio::time::timeout`).
    pub async fn wait_changes_since(&self, since: u64) -> Result<Vec<Delta<K, V>>, StoreError> {
        let mut index = self.subscribe();
        // The sender lives in `self`, so the wait cannot fail while `self` is borrowed; an
        // index that stops short of `since` is answered by `changes_since` below.
        let _ = index.wait_for(|index| *index != since).await;
        self.changes_since(since)
    }

    /// A receiver of the index, woken whenever it moves.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.shared.index.subscribe()
    }

    /// Says whether the store holds a full listing and follows its source. Subscribers of
    /// [`ObservedStore::synced`] are woken only when the flag flips.
    pub fn set_synced(&self, synced: bool) {
        self.shared.synced.send_if_modified(|current| {
            let flips = *current != synced;
            *current = synced;
            flips
        });
    }

    pub fn is_synced(&self) -> bool {
        *self.shared.synced.borrow()
    }

    /// A receiver of the in-sync flag (for a [`crate::runner::ReadyGate`]).
    pub fn synced(&self) -> watch::Receiver<bool> {
        self.shared.synced.subscribe()
    }

    /// Waits until the store is in sync.
    pub async fn wait_synced(&self) {
        let mut synced = self.synced();
        // The sender lives in `self`, so the wait cannot fail while `self` is borrowed.
        let _ = synced.wait_for(|synced| *synced).await;
    }
}

impl<K: Ord + Clone, V: PartialEq> State<K, V> {
    /// Applies one change; the recorded delta when it changed something.
    fn apply(&mut self, change: Change<K, V>) -> Option<Delta<K, V>> {
        let (key, after) = match change {
            Change::Put(key, value) => {
                // The same `Arc` again is equal without looking inside.
                if self
                    .items
                    .get(&key)
                    .is_some_and(|old| Arc::ptr_eq(old, &value) || **old == *value)
                {
                    return None;
                }
                (key, Some(value))
            }
            Change::Delete(key) => {
                if !self.items.contains_key(&key) {
                    return None;
                }
                (key, None)
            }
        };
        let before = match &after {
            Some(value) => self.items.insert(key.clone(), value.clone()),
            None => self.items.remove(&key),
        };
        self.index += 1;
        let delta = Delta {
            index: self.index,
            key,
            before,
            after,
        };
        self.log.push_back(delta.clone());
        while self.log.len() > self.log_capacity {
            if let Some(dropped) = self.log.pop_front() {
                self.forgotten_through = dropped.index;
            }
        }
        Some(delta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys<'a>(deltas: &[Delta<&'a str, u32>]) -> Vec<(u64, &'a str, Option<u32>, Option<u32>)> {
        deltas
            .iter()
            .map(|d| {
                (
                    d.index,
                    d.key,
                    d.before.as_deref().copied(),
                    d.after.as_deref().copied(),
                )
            })
            .collect()
    }

    #[test]
    fn an_update_that_changes_nothing_is_not_a_change() {
        let store = ObservedStore::default();
        assert!(store.apply(Change::put("a", 1)));
        assert!(!store.apply(Change::put("a", 1)), "same value");
        assert!(!store.apply(Change::Delete("b")), "missing key");
        assert_eq!(store.index(), 1);
        assert!(store.apply(Change::put("a", 2)));
        assert!(store.apply(Change::Delete("a")));
        assert_eq!(store.index(), 3);
        assert!(store.is_empty());
    }

    #[test]
    fn changes_since_gives_what_came_after_with_before_and_after() {
        let store = ObservedStore::default();
        store.apply_all([
            Change::put("a", 1),
            Change::put("b", 1),
            Change::put("a", 2),
        ]);
        let changes = store.changes_since(1).unwrap();
        assert_eq!(
            keys(&changes),
            [(2, "b", None, Some(1)), (3, "a", Some(1), Some(2))]
        );
        assert!(store.changes_since(3).unwrap().is_empty());
        assert_eq!(
            store.changes_since(4),
            Err(StoreError::Ahead { since: 4, index: 3 })
        );
    }

    #[test]
    fn the_change_log_is_bounded_and_an_older_index_means_list_again() {
        let store = ObservedStore::new(2);
        for value in 0..5 {
            store.apply(Change::put("a", value));
        }
        assert_eq!(store.changes_since(3).unwrap().len(), 2);
        assert_eq!(
            store.changes_since(2),
            Err(StoreError::Expired {
                since: 2,
                forgotten_through: 3
            })
        );
        let snapshot = store.snapshot();
        assert_eq!(snapshot.index, 5);
        assert_eq!(snapshot.items.get("a").map(|v| **v), Some(4));
    }

    #[test]
    fn replace_all_yields_the_diff_of_a_listing() {
        let store = ObservedStore::default();
        store.apply_all([
            Change::put("a", 1),
            Change::put("b", 1),
            Change::put("c", 1),
        ]);
        let listing = [("a", Arc::new(1)), ("b", Arc::new(2)), ("d", Arc::new(1))];
        let diff = store.replace_all(listing.clone());
        assert_eq!(
            keys(&diff),
            [
                (4, "c", Some(1), None),
                (5, "b", Some(1), Some(2)),
                (6, "d", None, Some(1))
            ]
        );
        assert!(
            store.replace_all(listing).is_empty(),
            "the same listing again"
        );
        assert_eq!(store.len(), 3);
    }

    #[test]
    fn a_store_started_at_an_index_answers_exactly_from_there_and_lists_before_it() {
        let store = ObservedStore::starting_at(7, [("a", Arc::new(1))], 16);
        assert_eq!(store.index(), 7);
        assert_eq!(store.get(&"a").as_deref(), Some(&1));
        assert!(!store.is_synced(), "the caller says when it is in sync");
        assert!(store.changes_since(7).unwrap().is_empty());
        assert_eq!(
            store.changes_since(6),
            Err(StoreError::Expired {
                since: 6,
                forgotten_through: 7
            }),
            "what came before the start is not known"
        );
        store.apply(Change::put("a", 2));
        assert_eq!(
            keys(&store.changes_since(7).unwrap()),
            [(8, "a", Some(1), Some(2))]
        );
    }

    #[tokio::test]
    async fn subscribers_are_woken_by_real_changes_only() {
        let store = ObservedStore::default();
        let mut index = store.subscribe();
        store.apply(Change::put("a", 1));
        assert!(index.has_changed().unwrap());
        assert_eq!(*index.borrow_and_update(), 1);
        store.apply(Change::put("a", 1));
        store.replace_all([("a", Arc::new(1))]);
        assert!(!index.has_changed().unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn a_blocking_query_answers_when_a_change_comes() {
        let store = ObservedStore::default();
        store.apply(Change::put("a", 1));
        let query = tokio::spawn({
            let store = store.clone();
            async move { store.wait_changes_since(1).await }
        });
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        assert!(!query.is_finished(), "no change after 1 yet");
        store.apply(Change::put("a", 2));
        let changes = query.await.unwrap().unwrap();
        assert_eq!(keys(&changes), [(2, "a", Some(1), Some(2))]);
        assert_eq!(
            store.wait_changes_since(9).await,
            Err(StoreError::Ahead { since: 9, index: 2 }),
            "an index from another life answers at once"
        );
    }

    #[tokio::test]
    async fn the_in_sync_flag_can_be_waited_for() {
        let store: ObservedStore<&str, u32> = ObservedStore::default();
        assert!(!store.is_synced());
        let waiter = tokio::spawn({
            let store = store.clone();
            async move { store.wait_synced().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        store.set_synced(true);
        waiter.await.unwrap();
        let synced = store.synced();
        store.set_synced(true);
        assert!(!synced.has_changed().unwrap(), "no flip, no wake");
        store.set_synced(false);
        assert!(synced.has_changed().unwrap());
    }
}
