//! Cube's key-value stores: where the manager and the workers keep their state.
//!
//! A [`Store`] holds values of one type under string keys (task IDs, node names), with the
//! book's `put`/`get`/`list`/`count`, plus `delete` and an [`index`](Store::index) that grows by
//! one with every write, so that a watcher can ask "has anything changed since N".
//!
//! Two implementations: [`MemoryStore`] (lost when the process ends) and [`PersistentStore`]
//! (a redb file; every `put` and `delete` is durable, fsynced, before it returns, so whatever
//! an API acknowledged after a write survives a crash). A caller that holds a lock while it
//! writes can queue the write under the lock ([`Store::put_queued`]) and wait for it after
//! letting go: writes keep their order, and concurrent ones share one commit.
//!
//! A store file is never served as if it were fine when it is not: [`PersistentDb::open`]
//! refuses an existing file that is empty, is not a redb store, fails redb's integrity check
//! or holds a record that does not read back ([`StoreError::Damaged`]), and only a missing
//! file becomes a new store. While running, a commit that panics or fails in the storage
//! fails the store ([`StoreError::Failed`]): every write is refused from then on, and
//! [`PersistentDb::failed`] tells the process, which stops.
//!
//! This crate knows nothing of tasks or HTTP; values are stored as JSON.

mod check;
mod commit;
mod memory;
mod persistent;

pub use commit::Commit;
pub use memory::MemoryStore;
pub use persistent::{PersistentDb, PersistentStore};

/// A store of values of type `V` under string keys.
///
/// Reads are synchronous. A durable commit costs 0.3 to 6 ms on the machines Cube is measured
/// on (it is one fsync), so writes are queued to a committer that gives many writers one
/// commit: [`Store::put`] blocks the thread until its write is durable,
/// [`Store::put_queued`] returns a [`Commit`] to wait on later, with or without blocking.
pub trait Store<V>: Send + Sync {
    /// Inserts or replaces the value under `key` and waits until that is durable; returns
    /// the store's new index.
    fn put(&self, key: &str, value: &V) -> Result<u64, StoreError> {
        self.put_queued(key, value)?.wait()
    }
    /// Queues the insert or replacement of `key`, behind every write queued before it; it is
    /// durable (and the index it returns known) once the [`Commit`] says so. Reads may not
    /// see it before then.
    fn put_queued(&self, key: &str, value: &V) -> Result<Commit, StoreError>;
    fn get(&self, key: &str) -> Result<Option<V>, StoreError>;
    /// Every value, in key order.
    fn list(&self) -> Result<Vec<V>, StoreError>;
    /// Every value, in key order, handed to `visit` one at a time: a process that loads a
    /// large store at start never holds it twice.
    fn scan(&self, visit: &mut dyn FnMut(V)) -> Result<(), StoreError> {
        self.list()?.into_iter().for_each(visit);
        Ok(())
    }
    fn count(&self) -> Result<u64, StoreError>;
    /// Removes the value under `key`; returns whether there was one.
    fn delete(&self, key: &str) -> Result<bool, StoreError>;
    /// Grows by one with every `put` and every `delete` that removed something.
    fn index(&self) -> Result<u64, StoreError>;
    /// `Ok` while the store takes writes; the error every write gets once it has failed.
    fn health(&self) -> Result<(), StoreError> {
        Ok(())
    }
    /// A consistent copy of the whole store file this store lives in (every table, as of one
    /// commit), as an open file to read from; the copy has no name on disk any more.
    fn backup(&self) -> Result<std::fs::File, StoreError> {
        Err(StoreError::InMemory)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the data file {path}: {reason}")]
    Open { path: String, reason: String },
    /// Another process has the file open (redb locks it).
    #[error(
        "cannot open the data file {path}: it is in use by another process (is another Cube process using the same data directory?)"
    )]
    InUse { path: String },
    /// The file exists but is not a sound store; nothing in it is served.
    #[error("the store file {path} is damaged: {reason}")]
    Damaged { path: String, reason: String },
    /// The store failed while running and takes no more writes (see [`PersistentDb::failed`]).
    #[error("the store file {path} failed and takes no more writes: {cause}")]
    Failed { path: String, cause: String },
    #[error("the store is kept in memory: there is no store file to copy")]
    InMemory,
    #[error("data file error: {0}")]
    Persistent(#[from] redb::Error),
    #[error("data file commit failed: {0}")]
    Commit(String),
    #[error("cannot encode the value for key {key:?}: {source}")]
    Encode {
        key: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("the stored value under key {key:?} in {path} is unreadable: {source}")]
    Decode {
        path: String,
        key: String,
        #[source]
        source: serde_json::Error,
    },
}

#[cfg(test)]
mod contract {
    //! The same behaviour asked of both stores.

    use super::*;

    pub fn behaves_like_a_store(store: &dyn Store<String>) {
        assert_eq!(store.count().unwrap(), 0);
        assert_eq!(store.index().unwrap(), 0);
        assert_eq!(store.get("a").unwrap(), None);

        assert_eq!(store.put("b", &"two".to_string()).unwrap(), 1);
        assert_eq!(store.put("a", &"one".to_string()).unwrap(), 2);
        assert_eq!(store.get("a").unwrap().as_deref(), Some("one"));
        assert_eq!(
            store.list().unwrap(),
            vec!["one".to_string(), "two".to_string()]
        );
        assert_eq!(store.count().unwrap(), 2);

        assert_eq!(store.put("a", &"uno".to_string()).unwrap(), 3);
        assert_eq!(store.get("a").unwrap().as_deref(), Some("uno"));
        assert_eq!(store.count().unwrap(), 2);

        assert!(store.delete("a").unwrap());
        assert!(!store.delete("a").unwrap());
        assert_eq!(
            store.index().unwrap(),
            4,
            "a delete of nothing does not move the index"
        );
        assert_eq!(store.list().unwrap(), vec!["two".to_string()]);
    }

    #[test]
    fn memory_store_keeps_the_contract() {
        behaves_like_a_store(&MemoryStore::<String>::new());
    }

    #[test]
    fn persistent_store_keeps_the_contract() {
        let dir = tempfile::tempdir().unwrap();
        let db = PersistentDb::open(&dir.path().join("cube.redb")).unwrap();
        behaves_like_a_store(&PersistentStore::<String>::new(db, "things").unwrap());
    }
}
