//! A store in memory: fast, and gone when the process ends.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::revision::{ConditionalCommit, Conflict, Expected, Listing};
use crate::watch::{Change, ChangeHub, Watch};
use crate::{Commit, Store, StoreError};

/// Values behind one `std` mutex: every operation is a short map access that never awaits,
/// so an async mutex would add cost and nothing else.
pub struct MemoryStore<V> {
    inner: Mutex<Inner<V>>,
}

struct Inner<V> {
    /// Each value with the revision of its key's last change.
    values: BTreeMap<String, (V, u64)>,
    /// Moved by one with every change. In memory there is one store per counter, so this is
    /// both the store's [`index`](Store::index) and its [`revision`](Store::revision).
    revision: u64,
    /// The recent changes and the watchers; under the store's lock, so changes reach it in
    /// revision order.
    hub: ChangeHub<V>,
}

impl<V> MemoryStore<V> {
    pub fn new() -> Self {
        MemoryStore {
            inner: Mutex::new(Inner {
                values: BTreeMap::new(),
                revision: 0,
                hub: ChangeHub::new(0),
            }),
        }
    }

    /// A store nothing watches from the past: each change reaches the watches open at the time
    /// and none is kept, so a watch starts at the current revision or is told it is too old.
    /// A worker's own tasks: nothing watches them, and a history of the last 10,000 changes
    /// held every task of a simulated worker several times over.
    pub fn without_history() -> Self {
        let store = MemoryStore::new();
        store.lock().hub = ChangeHub::with_limits(0, 0, crate::watch::CHANNEL);
        store
    }

    #[cfg(test)]
    pub(crate) fn with_watch_limits(history: usize, channel: usize) -> Self {
        let store = MemoryStore::new();
        store.lock().hub = ChangeHub::with_limits(0, history, channel);
        store
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<V>> {
        // A panic while holding the lock cannot leave the map half-written (each operation is
        // one map call), so a poisoned lock is still safe to use.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl<V: Clone> Inner<V> {
    fn put(&mut self, key: &str, value: &V) -> u64 {
        self.revision += 1;
        self.values
            .insert(key.to_string(), (value.clone(), self.revision));
        self.hub.publish(Change::Put {
            key: key.to_string(),
            value: value.clone(),
            revision: self.revision,
        });
        self.revision
    }
}

impl<V> Default for MemoryStore<V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V: Clone + Send + 'static> Store<V> for MemoryStore<V> {
    fn put_queued(&self, key: &str, value: &V) -> Result<Commit, StoreError> {
        Ok(Commit::done(self.lock().put(key, value)))
    }

    fn put_if_queued(
        &self,
        key: &str,
        value: &V,
        expected: Expected,
    ) -> Result<ConditionalCommit, StoreError> {
        let mut inner = self.lock();
        let current = inner.values.get(key).map(|(_, revision)| *revision);
        if !expected.is_met_by(current) {
            return Ok(ConditionalCommit::answered(Err(Conflict { current })));
        }
        Ok(ConditionalCommit::answered(Ok(inner.put(key, value))))
    }

    fn get(&self, key: &str) -> Result<Option<V>, StoreError> {
        Ok(self.lock().values.get(key).map(|(value, _)| value.clone()))
    }

    fn get_with_revision(&self, key: &str) -> Result<Option<(V, u64)>, StoreError> {
        Ok(self.lock().values.get(key).cloned())
    }

    fn list(&self) -> Result<Vec<V>, StoreError> {
        Ok(self
            .lock()
            .values
            .values()
            .map(|(value, _)| value.clone())
            .collect())
    }

    fn list_with_revision(&self) -> Result<Listing<V>, StoreError> {
        let inner = self.lock();
        Ok(Listing {
            entries: inner
                .values
                .iter()
                .map(|(key, (value, revision))| (key.clone(), value.clone(), *revision))
                .collect(),
            revision: inner.revision,
        })
    }

    fn count(&self) -> Result<u64, StoreError> {
        Ok(self.lock().values.len() as u64)
    }

    fn delete(&self, key: &str) -> Result<bool, StoreError> {
        let mut inner = self.lock();
        let removed = inner.values.remove(key).is_some();
        if removed {
            inner.revision += 1;
            let revision = inner.revision;
            inner.hub.publish(Change::Delete {
                key: key.to_string(),
                revision,
            });
        }
        Ok(removed)
    }

    fn index(&self) -> Result<u64, StoreError> {
        Ok(self.lock().revision)
    }

    fn revision(&self) -> Result<u64, StoreError> {
        Ok(self.lock().revision)
    }

    fn watch(&self, prefix: &str, from_revision: u64) -> Result<Watch<V>, StoreError> {
        let subscription = self.lock().hub.subscribe(prefix, from_revision);
        Ok(Watch::new(subscription, |_key, value| Ok(value)))
    }
}
