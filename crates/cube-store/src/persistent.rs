//! A store in a redb file: every write durable (fsynced) before it is acknowledged, with
//! writes from concurrent callers sharing commits (see [`crate::commit`]).

use std::marker::PhantomData;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::commit::{Commit, Committer, META, Slot, Write};
use crate::{Store, StoreError};

/// What redb may keep of the file in memory (its default is 1 GiB). Cube reads its stores
/// whole only when a process starts (the manager serves from its own cache), and the kernel
/// keeps the file's pages anyway; a larger cache would only raise the resident memory.
const CACHE_BYTES: usize = 4 * 1024 * 1024;

/// One open redb file, shared by the stores that keep their tables in it, and the thread
/// that commits their writes. redb allows one process to open a file at a time, which also
/// keeps two workers off the same data.
#[derive(Clone)]
pub struct PersistentDb {
    inner: Arc<DbInner>,
}

struct DbInner {
    committer: Arc<Committer>,
    /// The thread that commits what nobody waits for.
    background: Option<JoinHandle<()>>,
}

impl Drop for DbInner {
    fn drop(&mut self) {
        // The background thread commits what is queued and ends; the file is closed once it
        // has, so the next open of it in this process succeeds.
        self.committer.close();
        if let Some(background) = self.background.take() {
            let _ = background.join();
        }
    }
}

impl PersistentDb {
    /// Opens the file, creating it (not its directory) when missing.
    pub fn open(path: &Path) -> Result<PersistentDb, StoreError> {
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create(path)
            .map_err(|err| StoreError::Open {
            path: path.display().to_string(),
            reason: match err {
                redb::DatabaseError::DatabaseAlreadyOpen => {
                    "it is in use by another process (is another Cube process using the same data directory?)"
                        .to_string()
                }
                other => other.to_string(),
            },
        })?;
        let committer = Arc::new(Committer::new(Arc::new(db)));
        let background = std::thread::Builder::new()
            .name("cube-store-commit".to_string())
            .spawn({
                let committer = committer.clone();
                move || committer.run()
            })
            .map_err(|err| StoreError::Open {
                path: path.display().to_string(),
                reason: format!("cannot start the commit thread: {err}"),
            })?;
        Ok(PersistentDb {
            inner: Arc::new(DbInner {
                committer,
                background: Some(background),
            }),
        })
    }

    /// Queues a write; its [`Commit`] says when it is durable.
    fn queue(&self, table: &str, key: &str, value: Option<Vec<u8>>) -> Result<Commit, StoreError> {
        let slot = Arc::new(Slot::default());
        let write = Write {
            table: table.to_string(),
            key: key.to_string(),
            value,
            slot: slot.clone(),
        };
        self.inner.committer.queue(write)?;
        Ok(Commit::queued(self.inner.committer.clone(), slot))
    }
}

/// Values of type `V` in one table of a [`PersistentDb`], stored as JSON.
pub struct PersistentStore<V> {
    db: PersistentDb,
    table: String,
    _values: PhantomData<fn() -> V>,
}

impl<V> PersistentStore<V> {
    /// A store over the table `table`, created now so that reads of an empty store succeed.
    pub fn new(db: PersistentDb, table: &str) -> Result<PersistentStore<V>, StoreError> {
        let store = PersistentStore {
            db,
            table: table.to_string(),
            _values: PhantomData,
        };
        let txn = store.database().begin_write().map_err(redb::Error::from)?;
        txn.open_table(store.definition())
            .map_err(redb::Error::from)?;
        txn.open_table(META).map_err(redb::Error::from)?;
        txn.commit().map_err(redb::Error::from)?;
        Ok(store)
    }

    fn database(&self) -> &Database {
        self.db.inner.committer.database()
    }

    fn definition(&self) -> TableDefinition<'_, &'static str, &'static [u8]> {
        TableDefinition::new(&self.table)
    }
}

impl<V: Serialize + DeserializeOwned + Send> Store<V> for PersistentStore<V> {
    fn put_queued(&self, key: &str, value: &V) -> Result<Commit, StoreError> {
        let bytes = serde_json::to_vec(value).map_err(|source| StoreError::Encode {
            key: key.to_string(),
            source,
        })?;
        self.db.queue(&self.table, key, Some(bytes))
    }

    fn get(&self, key: &str) -> Result<Option<V>, StoreError> {
        let txn = self.database().begin_read().map_err(redb::Error::from)?;
        let table = txn
            .open_table(self.definition())
            .map_err(redb::Error::from)?;
        match table.get(key).map_err(redb::Error::from)? {
            Some(bytes) => serde_json::from_slice(bytes.value())
                .map(Some)
                .map_err(|source| StoreError::Decode {
                    key: key.to_string(),
                    source,
                }),
            None => Ok(None),
        }
    }

    fn list(&self) -> Result<Vec<V>, StoreError> {
        let mut values = Vec::new();
        self.scan(&mut |value| values.push(value))?;
        Ok(values)
    }

    fn scan(&self, visit: &mut dyn FnMut(V)) -> Result<(), StoreError> {
        let txn = self.database().begin_read().map_err(redb::Error::from)?;
        let table = txn
            .open_table(self.definition())
            .map_err(redb::Error::from)?;
        for entry in table.iter().map_err(redb::Error::from)? {
            let (key, bytes) = entry.map_err(redb::Error::from)?;
            let value =
                serde_json::from_slice(bytes.value()).map_err(|source| StoreError::Decode {
                    key: key.value().to_string(),
                    source,
                })?;
            visit(value);
        }
        Ok(())
    }

    fn count(&self) -> Result<u64, StoreError> {
        let txn = self.database().begin_read().map_err(redb::Error::from)?;
        let table = txn
            .open_table(self.definition())
            .map_err(redb::Error::from)?;
        Ok(table.len().map_err(redb::Error::from)?)
    }

    fn delete(&self, key: &str) -> Result<bool, StoreError> {
        Ok(self
            .db
            .queue(&self.table, key, None)?
            .wait_written()?
            .changed)
    }

    fn index(&self) -> Result<u64, StoreError> {
        let txn = self.database().begin_read().map_err(redb::Error::from)?;
        let meta = txn.open_table(META).map_err(redb::Error::from)?;
        Ok(meta
            .get(self.table.as_str())
            .map_err(redb::Error::from)?
            .map(|v| v.value())
            .unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_was_put_is_there_after_the_file_is_opened_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cube.redb");
        {
            let store = PersistentStore::<String>::new(PersistentDb::open(&path).unwrap(), "tasks")
                .unwrap();
            store.put("t1", &"running".to_string()).unwrap();
        }
        let store =
            PersistentStore::<String>::new(PersistentDb::open(&path).unwrap(), "tasks").unwrap();
        assert_eq!(store.get("t1").unwrap().as_deref(), Some("running"));
        assert_eq!(store.index().unwrap(), 1);
    }

    #[test]
    fn a_file_open_elsewhere_is_refused_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cube.redb");
        let _first = PersistentDb::open(&path).unwrap();
        let err = PersistentDb::open(&path).err().unwrap().to_string();
        assert!(err.contains("in use by another process"), "{err}");
    }

    #[test]
    fn stores_in_one_file_keep_their_own_values_and_index() {
        let dir = tempfile::tempdir().unwrap();
        let db = PersistentDb::open(&dir.path().join("cube.redb")).unwrap();
        let tasks = PersistentStore::<u32>::new(db.clone(), "tasks").unwrap();
        let events = PersistentStore::<u32>::new(db, "events").unwrap();
        tasks.put("a", &1).unwrap();
        tasks.put("b", &2).unwrap();
        events.put("a", &9).unwrap();
        assert_eq!((tasks.index().unwrap(), events.index().unwrap()), (2, 1));
        assert_eq!(events.list().unwrap(), vec![9]);
    }
}

#[cfg(test)]
mod group_commit {
    use super::*;

    fn store(dir: &tempfile::TempDir) -> PersistentStore<u32> {
        let db = PersistentDb::open(&dir.path().join("cube.redb")).unwrap();
        PersistentStore::new(db, "tasks").unwrap()
    }

    #[test]
    fn queued_writes_of_one_key_keep_their_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let commits: Vec<Commit> = (1..=100)
            .map(|n| store.put_queued("k", &n).unwrap())
            .collect();
        let indexes: Vec<u64> = commits.into_iter().map(|c| c.wait().unwrap()).collect();
        assert_eq!(indexes, (1..=100).collect::<Vec<u64>>());
        assert_eq!(store.get("k").unwrap(), Some(100));
    }

    #[test]
    fn concurrent_writers_are_all_durable_and_counted_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cube.redb");
        {
            let store = Arc::new(
                PersistentStore::<u32>::new(PersistentDb::open(&path).unwrap(), "tasks").unwrap(),
            );
            let writers: Vec<_> = (0..8)
                .map(|writer| {
                    let store = store.clone();
                    std::thread::spawn(move || {
                        for n in 0..50 {
                            store.put(&format!("{writer}-{n}"), &n).unwrap();
                        }
                    })
                })
                .collect();
            for writer in writers {
                writer.join().unwrap();
            }
        }
        // Everything acknowledged is in the file once it is opened again.
        let store = store(&dir);
        assert_eq!(store.count().unwrap(), 400);
        assert_eq!(store.index().unwrap(), 400);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_commit_can_be_awaited_without_blocking_the_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let first = store.put_queued("a", &1).unwrap();
        let second = store.put_queued("b", &2).unwrap();
        assert_eq!(second.durable().await.unwrap(), 2);
        assert_eq!(first.durable().await.unwrap(), 1);
        assert!(store.delete("a").unwrap());
        assert_eq!(store.list().unwrap(), vec![2]);
    }
}
