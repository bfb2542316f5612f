//! A store in a redb file: every write durable (fsynced) before it is acknowledged, with
//! writes from concurrent callers sharing commits (see [`crate::commit`]).

use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::check;
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
    path: PathBuf,
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
    /// Opens the file, creating it (not its directory) only when missing. An existing file is
    /// checked first (redb's integrity check, then every record read once) and refused with
    /// [`StoreError::Damaged`] when it is empty, not a store, or damaged.
    pub fn open(path: &Path) -> Result<PersistentDb, StoreError> {
        let db = check::open_checked(path, CACHE_BYTES)?;
        let committer = Arc::new(Committer::new(Arc::new(db), path.display().to_string()));
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
                path: path.to_path_buf(),
                background: Some(background),
            }),
        })
    }

    /// [`PersistentDb::open`] of a file that exists; `None` when there is none (nothing is
    /// created).
    pub fn open_existing(path: &Path) -> Result<Option<PersistentDb>, StoreError> {
        if !path.exists() {
            return Ok(None);
        }
        PersistentDb::open(path).map(Some)
    }

    /// Checks the store file at `path` as [`PersistentDb::open`] does (it must exist), and
    /// closes it again: for a file about to replace a store.
    pub fn check(path: &Path) -> Result<(), StoreError> {
        check::check_file(path)
    }

    /// The store file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// `Ok` while the store takes writes; once it has failed, the error every write gets.
    pub fn health(&self) -> Result<(), StoreError> {
        self.inner.committer.health()
    }

    /// Resolves with the cause once the store has failed (a commit panicked, or the storage
    /// failed under it): nothing written after that is kept, and the process should stop.
    pub async fn failed(&self) -> String {
        self.inner.committer.failed().await
    }

    /// Writes a consistent copy of the whole file (every table as of one commit) to a new
    /// store file at `destination`, which must not exist. Writes go on meanwhile.
    pub fn backup_to(&self, destination: &Path) -> Result<(), StoreError> {
        check::copy_database(self.inner.committer.database(), destination)
    }

    /// [`PersistentDb::backup_to`] a file next to the store, opened for reading and then
    /// removed, so that nothing is left behind however the reader ends.
    pub fn backup(&self) -> Result<std::fs::File, StoreError> {
        static BACKUPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let number = BACKUPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut name = self.inner.path.as_os_str().to_owned();
        name.push(format!(".backup-{}-{number}", std::process::id()));
        let temporary = PathBuf::from(name);
        let opened = self.backup_to(&temporary).and_then(|()| {
            std::fs::File::open(&temporary).map_err(|err| StoreError::Open {
                path: temporary.display().to_string(),
                reason: err.to_string(),
            })
        });
        // Removed whether the copy succeeded or not (it may not exist: nothing to report).
        let _ = std::fs::remove_file(&temporary);
        opened
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

    fn decode_error(&self, key: &str, source: serde_json::Error) -> StoreError {
        StoreError::Decode {
            path: self.db.inner.committer.path().to_string(),
            key: key.to_string(),
            source,
        }
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
                .map_err(|source| self.decode_error(key, source)),
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
            let value = serde_json::from_slice(bytes.value())
                .map_err(|source| self.decode_error(key.value(), source))?;
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

    fn health(&self) -> Result<(), StoreError> {
        self.db.health()
    }

    fn backup(&self) -> Result<std::fs::File, StoreError> {
        self.db.backup()
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

    fn make_the_next_commit_panic(store: &PersistentStore<u32>) {
        store
            .db
            .inner
            .committer
            .panic_next_commit
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    #[test]
    fn a_commit_that_panics_fails_the_store_and_every_write_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        store.put("before", &1).unwrap();
        make_the_next_commit_panic(&store);

        let err = store.put("during", &2).unwrap_err();
        assert!(matches!(err, StoreError::Failed { .. }), "{err}");
        assert!(
            err.to_string().contains("cube.redb"),
            "names the file: {err}"
        );
        assert!(err.to_string().contains("panicked"), "says why: {err}");

        let later = store.put_queued("after", &3).err().unwrap();
        assert!(matches!(later, StoreError::Failed { .. }), "{later}");
        assert!(matches!(
            store.delete("before"),
            Err(StoreError::Failed { .. })
        ));
        assert!(matches!(store.health(), Err(StoreError::Failed { .. })));
        assert_eq!(store.get("before").unwrap(), Some(1), "reads still answer");
    }

    #[test]
    fn writes_waiting_when_the_store_fails_are_all_answered_with_the_failure() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        make_the_next_commit_panic(&store);
        let commits: Vec<Commit> = (0..50)
            .map(|n| store.put_queued(&n.to_string(), &n).unwrap())
            .collect();
        for commit in commits {
            assert!(matches!(commit.wait(), Err(StoreError::Failed { .. })));
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_failure_is_announced_to_whoever_watches_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let db = PersistentDb::open(&dir.path().join("cube.redb")).unwrap();
        let store = PersistentStore::<u32>::new(db.clone(), "tasks").unwrap();
        assert!(db.health().is_ok());
        let watcher = tokio::spawn({
            let db = db.clone();
            async move { db.failed().await }
        });
        make_the_next_commit_panic(&store);
        // Nobody waits for this write: the background thread commits it, and must not die
        // silently when the commit panics.
        let _unwaited = store.put_queued("a", &1).unwrap();
        let cause = tokio::time::timeout(std::time::Duration::from_secs(10), watcher)
            .await
            .expect("the failure is announced")
            .unwrap();
        assert!(cause.contains("panicked"), "{cause}");
        assert!(db.health().is_err());
    }

    #[test]
    fn a_backup_holds_every_table_and_passes_the_check() {
        let dir = tempfile::tempdir().unwrap();
        let db = PersistentDb::open(&dir.path().join("cube.redb")).unwrap();
        let tasks = PersistentStore::<u32>::new(db.clone(), "tasks").unwrap();
        let nodes = PersistentStore::<u32>::new(db.clone(), "nodes").unwrap();
        for n in 0..100 {
            tasks.put(&format!("t{n}"), &n).unwrap();
        }
        nodes.put("w1", &7).unwrap();
        let copy = dir.path().join("copy.redb");
        db.backup_to(&copy).unwrap();
        tasks.put("written-after", &1000).unwrap();

        PersistentDb::check(&copy).unwrap();
        let restored = PersistentDb::open(&copy).unwrap();
        let tasks = PersistentStore::<u32>::new(restored.clone(), "tasks").unwrap();
        let nodes = PersistentStore::<u32>::new(restored, "nodes").unwrap();
        assert_eq!(tasks.count().unwrap(), 100);
        assert_eq!((tasks.index().unwrap(), nodes.index().unwrap()), (100, 1));
        assert_eq!(nodes.get("w1").unwrap(), Some(7));
    }

    #[test]
    fn a_backup_file_is_readable_and_leaves_nothing_behind() {
        use std::io::Read;
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        store.put("a", &1).unwrap();
        let mut bytes = Vec::new();
        store.backup().unwrap().read_to_end(&mut bytes).unwrap();
        let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(files.len(), 1, "only the store itself: {files:?}");
        let copy = dir.path().join("copy.redb");
        std::fs::write(&copy, bytes).unwrap();
        PersistentDb::check(&copy).unwrap();
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
