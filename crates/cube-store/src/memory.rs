//! A store in memory: fast, and gone when the process ends.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::{Commit, Store, StoreError};

/// Values behind one `std` mutex: every operation is a short map access that never awaits,
/// so an async mutex would add cost and nothing else.
pub struct MemoryStore<V> {
    inner: Mutex<Inner<V>>,
}

struct Inner<V> {
    values: BTreeMap<String, V>,
    index: u64,
}

impl<V> MemoryStore<V> {
    pub fn new() -> Self {
        MemoryStore {
            inner: Mutex::new(Inner {
                values: BTreeMap::new(),
                index: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<V>> {
        // A panic while holding the lock cannot leave the map half-written (each operation is
        // one map call), so a poisoned lock is still safe to use.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl<V> Default for MemoryStore<V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V: Clone + Send> Store<V> for MemoryStore<V> {
    fn put_queued(&self, key: &str, value: &V) -> Result<Commit, StoreError> {
        let mut inner = self.lock();
        inner.values.insert(key.to_string(), value.clone());
        inner.index += 1;
        Ok(Commit::done(inner.index))
    }

    fn get(&self, key: &str) -> Result<Option<V>, StoreError> {
        Ok(self.lock().values.get(key).cloned())
    }

    fn list(&self) -> Result<Vec<V>, StoreError> {
        Ok(self.lock().values.values().cloned().collect())
    }

    fn count(&self) -> Result<u64, StoreError> {
        Ok(self.lock().values.len() as u64)
    }

    fn delete(&self, key: &str) -> Result<bool, StoreError> {
        let mut inner = self.lock();
        let removed = inner.values.remove(key).is_some();
        if removed {
            inner.index += 1;
        }
        Ok(removed)
    }

    fn index(&self) -> Result<u64, StoreError> {
        Ok(self.lock().index)
    }
}
