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
use crate::commit::{Commit, Committer, META, REVISION_KEY, REVISIONS, Slot, TableHub, Write};
use crate::revision::{ConditionalCommit, Expected, Listing};
use crate::watch::{History, Watch};
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

    /// Removes the table `table` and what it holds, if the file has it: for a table an older
    /// Cube wrote that nothing reads any more. True when there was one. Call it before any
    /// store is opened on that table.
    pub fn drop_table(&self, table: &str) -> Result<bool, StoreError> {
        let txn = self
            .inner
            .committer
            .database()
            .begin_write()
            .map_err(redb::Error::from)?;
        let dropped = txn
            .delete_table(TableDefinition::<&str, &[u8]>::new(table))
            .map_err(redb::Error::from)?;
        txn.commit().map_err(redb::Error::from)?;
        Ok(dropped)
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

    /// Queues a write, done only if the key is as `expected` when it commits; its
    /// [`Commit`] says when it is durable.
    fn queue(
        &self,
        table: &str,
        key: &str,
        value: Option<Vec<u8>>,
        expected: Option<Expected>,
    ) -> Result<Commit, StoreError> {
        let slot = Arc::new(Slot::default());
        let write = Write {
            table: table.to_string(),
            key: key.to_string(),
            value: value.map(Arc::from),
            expected,
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
    /// The table's changes for its watchers, shared by every store of the table.
    hub: TableHub,
    _values: PhantomData<fn() -> V>,
}

impl<V> PersistentStore<V> {
    /// A store over the table `table`, created now so that reads of an empty store succeed.
    /// It keeps its recent changes (at most 8 MiB) for watches that start in the past.
    pub fn new(db: PersistentDb, table: &str) -> Result<PersistentStore<V>, StoreError> {
        PersistentStore::open(db, table, History::Kept)
    }

    /// A store over the table `table` that nothing watches from the past: each change
    /// reaches the watches open at the time, and none is kept in memory (unless another
    /// store of the table keeps them).
    pub fn unwatched(db: PersistentDb, table: &str) -> Result<PersistentStore<V>, StoreError> {
        PersistentStore::open(db, table, History::None)
    }

    fn open(
        db: PersistentDb,
        table: &str,
        history: History,
    ) -> Result<PersistentStore<V>, StoreError> {
        let txn = db
            .inner
            .committer
            .database()
            .begin_write()
            .map_err(redb::Error::from)?;
        txn.open_table(TableDefinition::<&str, &[u8]>::new(table))
            .map_err(redb::Error::from)?;
        txn.open_table(META).map_err(redb::Error::from)?;
        txn.open_table(REVISIONS).map_err(redb::Error::from)?;
        txn.commit().map_err(redb::Error::from)?;
        let hub = db.inner.committer.hub(table, history)?;
        Ok(PersistentStore {
            db,
            table: table.to_string(),
            hub,
            _values: PhantomData,
        })
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

impl<V: Serialize + DeserializeOwned + Send + 'static> Store<V> for PersistentStore<V> {
    fn put_queued(&self, key: &str, value: &V) -> Result<Commit, StoreError> {
        let bytes = crate::encode(key, value)?;
        self.db.queue(&self.table, key, Some(bytes), None)
    }

    fn put_if_queued(
        &self,
        key: &str,
        value: &V,
        expected: Expected,
    ) -> Result<ConditionalCommit, StoreError> {
        let bytes = crate::encode(key, value)?;
        let commit = self
            .db
            .queue(&self.table, key, Some(bytes), Some(expected))?;
        Ok(ConditionalCommit::queued(commit))
    }

    fn revision(&self) -> Result<u64, StoreError> {
        crate::commit::read_revision(self.database())
    }

    fn get_with_revision(&self, key: &str) -> Result<Option<(V, u64)>, StoreError> {
        let txn = self.database().begin_read().map_err(redb::Error::from)?;
        let table = txn
            .open_table(self.definition())
            .map_err(redb::Error::from)?;
        let Some(bytes) = table.get(key).map_err(redb::Error::from)? else {
            return Ok(None);
        };
        let value = serde_json::from_slice(bytes.value())
            .map_err(|source| self.decode_error(key, source))?;
        let revisions = txn.open_table(REVISIONS).map_err(redb::Error::from)?;
        let revision = revisions
            .get((self.table.as_str(), key))
            .map_err(redb::Error::from)?
            .map_or(0, |stored| stored.value());
        Ok(Some((value, revision)))
    }

    fn list_with_revision(&self) -> Result<Listing<V>, StoreError> {
        // One read transaction: the values, their revisions and the file's revision are
        // of one commit.
        let txn = self.database().begin_read().map_err(redb::Error::from)?;
        let table = txn
            .open_table(self.definition())
            .map_err(redb::Error::from)?;
        let revisions = txn.open_table(REVISIONS).map_err(redb::Error::from)?;
        let meta = txn.open_table(META).map_err(redb::Error::from)?;
        let revision = meta
            .get(REVISION_KEY)
            .map_err(redb::Error::from)?
            .map_or(0, |stored| stored.value());
        let mut entries = Vec::new();
        for entry in table.iter().map_err(redb::Error::from)? {
            let (key, bytes) = entry.map_err(redb::Error::from)?;
            let key = key.value();
            let value = serde_json::from_slice(bytes.value())
                .map_err(|source| self.decode_error(key, source))?;
            let changed_at = revisions
                .get((self.table.as_str(), key))
                .map_err(redb::Error::from)?
                .map_or(0, |stored| stored.value());
            entries.push((key.to_string(), value, changed_at));
        }
        Ok(Listing { entries, revision })
    }

    fn watch(&self, prefix: &str, from_revision: u64) -> Result<Watch<V>, StoreError> {
        // A `std` mutex held only to copy the history's matching changes.
        let subscription = self
            .hub
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .subscribe(prefix, from_revision);
        Ok(Watch::new(subscription, |_key, bytes: Arc<[u8]>| {
            serde_json::from_slice(&bytes).map_err(|err| err.to_string())
        }))
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
            .queue(&self.table, key, None, None)?
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
mod revisions {
    use super::*;
    use crate::{Change, Conflict, WatchError};

    fn open(path: &Path, table: &str) -> PersistentStore<String> {
        PersistentStore::new(PersistentDb::open(path).unwrap(), table).unwrap()
    }

    #[test]
    fn revisions_and_key_revisions_survive_reopening_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cube.redb");
        {
            let store = open(&path, "tasks");
            store.put("a", &"one".to_string()).unwrap();
            store.put("b", &"two".to_string()).unwrap();
            assert!(store.delete("a").unwrap());
            assert_eq!(store.revision().unwrap(), 3);
        }
        let store = open(&path, "tasks");
        assert_eq!(store.revision().unwrap(), 3);
        assert_eq!(
            store.get_with_revision("b").unwrap(),
            Some(("two".to_string(), 2))
        );
        assert_eq!(
            store
                .put_if("b", &"stale".to_string(), Expected::Revision(1))
                .unwrap(),
            Err(Conflict { current: Some(2) })
        );
        assert_eq!(
            store.put("c", &"three".to_string()).unwrap(),
            4,
            "the index"
        );
        assert_eq!(store.revision().unwrap(), 4, "goes on from where it was");
    }

    #[test]
    fn one_revision_counts_the_changes_of_every_table_in_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let db = PersistentDb::open(&dir.path().join("cube.redb")).unwrap();
        let tasks = PersistentStore::<u32>::new(db.clone(), "tasks").unwrap();
        let nodes = PersistentStore::<u32>::new(db, "nodes").unwrap();
        let mut task_watch = tasks.watch("", 0).unwrap();
        tasks.put("t", &1).unwrap();
        nodes.put("n", &2).unwrap();
        tasks.put("t", &3).unwrap();
        assert_eq!(
            (tasks.revision().unwrap(), nodes.revision().unwrap()),
            (3, 3)
        );
        assert_eq!((tasks.index().unwrap(), nodes.index().unwrap()), (2, 1));
        assert_eq!(nodes.get_with_revision("n").unwrap(), Some((2, 2)));
        let seen: Vec<u64> = std::iter::from_fn(|| task_watch.try_next())
            .map(|change| change.unwrap().revision())
            .collect();
        assert_eq!(seen, vec![1, 3], "a table's watch sees its own changes");
    }

    #[test]
    fn a_watch_from_before_the_file_was_opened_says_relist() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cube.redb");
        open(&path, "tasks").put("a", &"one".to_string()).unwrap();
        let store = open(&path, "tasks");
        let err = store.watch("", 0).unwrap().try_next().unwrap().unwrap_err();
        assert_eq!(
            err,
            WatchError::Compacted {
                requested: 0,
                oldest: 1
            }
        );
        let listing = store.list_with_revision().unwrap();
        assert_eq!(listing.revision, 1);
        let mut watch = store.watch("", listing.revision).unwrap();
        store.put("b", &"two".to_string()).unwrap();
        assert_eq!(
            watch.try_next().unwrap().unwrap(),
            Change::Put {
                key: "b".to_string(),
                value: "two".to_string(),
                revision: 2
            }
        );
    }

    #[test]
    fn a_conditional_write_in_a_shared_commit_sees_the_writes_queued_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir.path().join("cube.redb"), "tasks");
        let first = store.put_queued("k", &"first".to_string()).unwrap();
        let created = store
            .put_if_queued("k", &"second".to_string(), Expected::Absent)
            .unwrap();
        assert_eq!(first.wait().unwrap(), 1);
        assert_eq!(created.wait().unwrap(), Err(Conflict { current: Some(1) }));
        assert_eq!(store.index().unwrap(), 1, "a conflict moves nothing");
    }

    #[test]
    fn a_failed_store_ends_its_watches() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir.path().join("cube.redb"), "tasks");
        let mut watch = store.watch("", 0).unwrap();
        store
            .db
            .inner
            .committer
            .panic_next_commit
            .store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(store.put("a", &"one".to_string()).is_err());
        assert_eq!(watch.try_next().unwrap(), Err(WatchError::Closed));
    }

    #[test]
    fn a_backup_keeps_the_revisions() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir.path().join("cube.redb"), "tasks");
        store.put("a", &"one".to_string()).unwrap();
        store.put("a", &"two".to_string()).unwrap();
        let copy = dir.path().join("copy.redb");
        store.db.backup_to(&copy).unwrap();
        PersistentDb::check(&copy).unwrap();
        let restored = open(&copy, "tasks");
        assert_eq!(restored.revision().unwrap(), 2);
        assert_eq!(
            restored.get_with_revision("a").unwrap(),
            Some(("two".to_string(), 2))
        );
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
        // The background thread may commit (and fail) before the last writes are queued:
        // a write queued after the failure is refused at once, with the same failure.
        let queued: Vec<Result<Commit, StoreError>> = (0..50)
            .map(|n| store.put_queued(&n.to_string(), &n))
            .collect();
        for queued in queued {
            let answer = queued.and_then(Commit::wait);
            assert!(
                matches!(answer, Err(StoreError::Failed { .. })),
                "{answer:?}"
            );
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
