//! Cube's key-value stores: where the manager and the workers keep their state.
//!
//! A [`Store`] holds values of one type under string keys (task IDs, node names), with the
//! book's `put`/`get`/`list`/`count`, plus `delete` and an [`index`](Store::index) that grows by
//! one with every write, so that a watcher can ask "has anything changed since N".
//!
//! Three implementations: [`MemoryStore`] (lost when the process ends), [`PersistentStore`]
//! (a redb file; every `put` and `delete` is durable, fsynced, before it returns, so whatever
//! an API acknowledged after a write survives a crash) and [`EtcdStore`] (one etcd key per
//! value under a prefix, for several managers sharing one state; a write is answered once
//! the cluster committed it; see `etcd/mod.rs`). A caller that holds a lock while it
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
//! **Revisions and watches**, as etcd has them, so that a controller written against this
//! trait can later run on an etcd store unchanged. Every committed change (a put, or a
//! delete that removed something) gets the next [`revision`](Store::revision) of its store:
//! one counter per [`MemoryStore`], one per store file for the [`PersistentStore`]s in it
//! (kept in the file, so it survives restarts and never goes back). Each key remembers the
//! revision of its last change ([`Store::get_with_revision`], [`Store::list_with_revision`]).
//! [`Store::put_if`] writes only if the key is [`Expected::Absent`] or still at
//! [`Expected::Revision`]; the check is made inside the committing transaction, so two
//! writers racing on one revision cannot both win, and the loser gets a [`Conflict`] (a
//! value, not an error). [`Store::watch`] gives every change of the keys under a prefix after
//! a revision, in order, then each one as it commits ([`Watch::next`] is async). The last
//! 10,000 changes of each store (at most 8 MiB of them in a store file's table) are kept in
//! memory for watches that start in the past; an
//! older start, or a watcher that lets 1,024 changes pile up unread, gets a
//! [`WatchError`] that [`needs_relist`](WatchError::needs_relist): list again, watch from the
//! list's revision. A watch never holds up a commit, and no fsync or redb write runs on an
//! async runtime's thread when a commit is awaited ([`Commit::durable`],
//! [`ConditionalCommit::durable`]): the store's commit thread does it.
//!
//! This crate knows nothing of tasks or HTTP; values are stored as JSON.

mod check;
mod commit;
mod etcd;
mod memory;
mod persistent;
mod revision;
mod watch;

/// A value as the file and etcd stores keep it: its JSON, or an error naming its key.
fn encode<V: serde::Serialize>(key: &str, value: &V) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|source| StoreError::Encode {
        key: key.to_string(),
        source,
    })
}

pub use commit::Commit;
pub use etcd::{
    EtcdConfig, EtcdDb, EtcdStore, Fence, FenceError, FenceKey, Leadership, Lease, LeasedKey,
    Optimistic, Quiet, Unchanged, Versioned, normalize_prefix,
};
pub use memory::MemoryStore;
pub use persistent::{PersistentDb, PersistentStore};
pub use revision::{ConditionalCommit, Conflict, Expected, Listing};
pub use watch::{Change, Watch, WatchError};

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
    /// Every value whose key starts with `prefix`, in key order, handed to `visit` one at a
    /// time. A store that keeps keys in order (etcd) reads only those keys; the others read
    /// every key and skip the rest.
    fn scan_prefix(&self, prefix: &str, visit: &mut dyn FnMut(V)) -> Result<(), StoreError> {
        for (key, value, _) in self.list_with_revision()?.entries {
            if key.starts_with(prefix) {
                visit(value);
            }
        }
        Ok(())
    }
    /// The value under the first of `keys` that holds one: a record that may be under any
    /// of a few keys (a task under its shard's prefix, its project unknown). etcd asks for
    /// them all at once.
    fn get_first(&self, keys: &[String]) -> Result<Option<V>, StoreError> {
        for key in keys {
            if let Some(value) = self.get(key)? {
                return Ok(Some(value));
            }
        }
        Ok(None)
    }
    fn count(&self) -> Result<u64, StoreError>;
    /// Removes the value under `key`; returns whether there was one.
    fn delete(&self, key: &str) -> Result<bool, StoreError>;
    /// Grows by one with every `put` and every `delete` that removed something.
    fn index(&self) -> Result<u64, StoreError>;

    /// The store's revision: moved by one with every committed change (a put, or a delete
    /// that removed something) of any store in the same file, never back, kept across
    /// restarts. Each change is known by the revision it made.
    fn revision(&self) -> Result<u64, StoreError>;
    /// The value under `key` and the revision of the key's last change (its
    /// `mod_revision`; 0 for a key written before revisions were kept).
    fn get_with_revision(&self, key: &str) -> Result<Option<(V, u64)>, StoreError>;
    /// Every value with its key and `mod_revision`, in key order, and the store's revision
    /// as of the same moment: a [`watch`](Store::watch) from it misses nothing.
    fn list_with_revision(&self) -> Result<Listing<V>, StoreError>;
    /// Puts `value` under `key` only if the key is as `expected` when the write commits
    /// (the check is made inside the committing transaction, so of two racing writers
    /// expecting the same revision one wins); waits until it is durable. The revision of the
    /// write, or the [`Conflict`] that stopped it.
    fn put_if(
        &self,
        key: &str,
        value: &V,
        expected: Expected,
    ) -> Result<Result<u64, Conflict>, StoreError> {
        self.put_if_queued(key, value, expected)?.wait()
    }
    /// [`put_if`](Store::put_if), queued: decided and durable once the
    /// [`ConditionalCommit`] answers.
    fn put_if_queued(
        &self,
        key: &str,
        value: &V,
        expected: Expected,
    ) -> Result<ConditionalCommit, StoreError>;
    /// Every committed change of the keys starting with `prefix` made after
    /// `from_revision`, in order, then each one as it commits. A start older than the
    /// changes the store keeps in memory (the last 10,000 per store, at most 8 MiB of them
    /// in a store file, none from before it was opened) and a watcher that falls more than
    /// 1,024 changes behind get [`WatchError::needs_relist`]: list again
    /// with [`list_with_revision`](Store::list_with_revision) and watch from its revision.
    /// A watch never holds up a commit.
    fn watch(&self, prefix: &str, from_revision: u64) -> Result<Watch<V>, StoreError>;
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
    /// No member of the etcd cluster answered in time; what was asked may or may not have
    /// been done.
    #[error("the etcd cluster ({endpoints}) did not answer: {reason}")]
    Unavailable { endpoints: String, reason: String },
    /// etcd refused a request as such (not for want of a member to answer it).
    #[error("etcd: {0}")]
    Etcd(String),
    /// The write was conditioned on keys this process held (its [`Fence`]: the leadership
    /// key, the shards of the ring it holds), and `key`, the whole etcd key, is gone or
    /// held by another: this process no longer leads, or no longer holds that shard, and
    /// nothing was written.
    #[error(
        "the write was refused: this manager no longer holds the fence key {key} (its lease \
         ended, or another manager holds it now)"
    )]
    Fenced { key: String },
    /// The store lives elsewhere (etcd): there is no file to copy.
    #[error("{0}")]
    NoFile(String),
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

    /// A store that keeps no history: a watch from now sees the next change; one from before
    /// the last change is told it is too old.
    pub fn keeps_no_change_for_a_watch_from_the_past(store: &dyn Store<String>) {
        let before = store.revision().unwrap();
        store.put("k", &text("1")).unwrap();
        let mut now = store.watch("", store.revision().unwrap()).unwrap();
        let revision = store.put("k", &text("2")).unwrap();
        let change = now.try_next().expect("a change is there now").unwrap();
        assert_eq!(change.revision(), revision);
        assert!(
            matches!(
                store.watch("", before + 1).unwrap().try_next(),
                Some(Err(WatchError::Compacted { .. }))
            ),
            "a watch from before the last change is told it is too old"
        );
    }

    /// The book's operations. Indexes and revisions are counted from the store's revision
    /// at the start (0 for a new memory or redb store; etcd's revision is the cluster's).
    pub fn behaves_like_a_store(store: &dyn Store<String>) {
        let base = store.revision().unwrap();
        assert_eq!(store.count().unwrap(), 0);
        assert_eq!(store.index().unwrap(), base);
        assert_eq!(store.get("a").unwrap(), None);

        assert_eq!(store.put("b", &"two".to_string()).unwrap(), base + 1);
        assert_eq!(store.put("a", &"one".to_string()).unwrap(), base + 2);
        assert_eq!(store.get("a").unwrap().as_deref(), Some("one"));
        assert_eq!(
            store.list().unwrap(),
            vec!["one".to_string(), "two".to_string()]
        );
        assert_eq!(store.count().unwrap(), 2);

        assert_eq!(store.put("a", &"uno".to_string()).unwrap(), base + 3);
        assert_eq!(store.get("a").unwrap().as_deref(), Some("uno"));
        assert_eq!(store.count().unwrap(), 2);

        assert!(store.delete("a").unwrap());
        assert!(!store.delete("a").unwrap());
        assert_eq!(
            store.index().unwrap(),
            base + 4,
            "a delete of nothing does not move the index"
        );
        assert_eq!(store.list().unwrap(), vec!["two".to_string()]);

        // Reads of the keys under a prefix, and of the first of a few keys that holds one.
        for (key, value) in [
            ("0003/x", "x3"),
            ("0003/y", "y3"),
            ("0012/x", "x12"),
            ("0003x", "no"),
        ] {
            store.put(key, &text(value)).unwrap();
        }
        let mut under = Vec::new();
        store
            .scan_prefix("0003/", &mut |value| under.push(value))
            .unwrap();
        assert_eq!(under, vec![text("x3"), text("y3")]);
        let mut none = Vec::new();
        store
            .scan_prefix("0007/", &mut |value| none.push(value))
            .unwrap();
        assert!(none.is_empty());
        let keys = |keys: &[&str]| keys.iter().map(|key| key.to_string()).collect::<Vec<_>>();
        assert_eq!(
            store
                .get_first(&keys(&["0000/x", "0012/x", "0003/x"]))
                .unwrap(),
            Some(text("x12"))
        );
        assert_eq!(store.get_first(&keys(&["0000/x", "0001/x"])).unwrap(), None);
    }

    fn text(value: &str) -> String {
        value.to_string()
    }

    fn next_now(watch: &mut Watch<String>) -> Change<String> {
        watch
            .try_next()
            .expect("a change is there now")
            .expect("the watch goes on")
    }

    fn put_of(key: &str, value: &str, revision: u64) -> Change<String> {
        Change::Put {
            key: text(key),
            value: text(value),
            revision,
        }
    }

    /// Revisions, compare-and-put and watches, on a new, empty store.
    pub fn keeps_revisions_and_can_be_watched(store: &dyn Store<String>) {
        let r = store.revision().unwrap();
        let mut from_start = store.watch("", r).unwrap();
        assert!(from_start.try_next().is_none(), "nothing yet");

        let first = store.put("tasks/a", &text("one")).unwrap();
        assert_eq!(store.revision().unwrap(), r + 1, "index {first}");
        store.put("nodes/w1", &text("ready")).unwrap();
        store.put("tasks/b", &text("two")).unwrap();
        assert!(store.delete("tasks/a").unwrap());
        assert!(!store.delete("tasks/a").unwrap());
        assert_eq!(
            store.revision().unwrap(),
            r + 4,
            "a put and a delete each move the revision, a delete of nothing does not"
        );
        assert_eq!(
            store.get_with_revision("tasks/b").unwrap(),
            Some((text("two"), r + 3))
        );
        assert_eq!(store.get_with_revision("tasks/a").unwrap(), None);
        assert_eq!(
            store.list_with_revision().unwrap(),
            Listing {
                entries: vec![
                    (text("nodes/w1"), text("ready"), r + 2),
                    (text("tasks/b"), text("two"), r + 3)
                ],
                revision: r + 4,
            }
        );

        // Compare-and-put.
        assert_eq!(
            store
                .put_if("tasks/b", &text("stale"), Expected::Revision(r + 1))
                .unwrap(),
            Err(Conflict {
                current: Some(r + 3)
            })
        );
        assert_eq!(
            store
                .put_if("tasks/b", &text("new"), Expected::Absent)
                .unwrap(),
            Err(Conflict {
                current: Some(r + 3)
            })
        );
        assert_eq!(
            store
                .put_if("tasks/a", &text("again"), Expected::Revision(r + 1))
                .unwrap(),
            Err(Conflict { current: None }),
            "a deleted key has no revision"
        );
        assert_eq!(
            store.revision().unwrap(),
            r + 4,
            "a conflict changes nothing"
        );
        assert_eq!(
            store
                .put_if("tasks/b", &text("three"), Expected::Revision(r + 3))
                .unwrap(),
            Ok(r + 5)
        );
        assert_eq!(
            store
                .put_if("tasks/c", &text("new"), Expected::Absent)
                .unwrap(),
            Ok(r + 6)
        );
        assert_eq!(store.get("tasks/b").unwrap(), Some(text("three")));

        // The watch from 0 saw every change, in order, and goes on with live ones.
        let seen: Vec<Change<String>> = (0..6).map(|_| next_now(&mut from_start)).collect();
        assert_eq!(
            seen,
            vec![
                put_of("tasks/a", "one", r + 1),
                put_of("nodes/w1", "ready", r + 2),
                put_of("tasks/b", "two", r + 3),
                Change::Delete {
                    key: text("tasks/a"),
                    revision: r + 4
                },
                put_of("tasks/b", "three", r + 5),
                put_of("tasks/c", "new", r + 6),
            ]
        );
        assert!(from_start.try_next().is_none());
        store.put("tasks/d", &text("live")).unwrap();
        assert_eq!(next_now(&mut from_start), put_of("tasks/d", "live", r + 7));

        // From the middle: only the later changes; with a prefix: only its keys.
        let mut from_middle = store.watch("", r + 4).unwrap();
        let later: Vec<u64> = (0..3)
            .map(|_| next_now(&mut from_middle).revision())
            .collect();
        assert_eq!(later, vec![r + 5, r + 6, r + 7]);
        assert!(from_middle.try_next().is_none());
        let mut nodes = store.watch("nodes/", r).unwrap();
        assert_eq!(next_now(&mut nodes), put_of("nodes/w1", "ready", r + 2));
        assert!(nodes.try_next().is_none());
        store.put("tasks/e", &text("not a node")).unwrap();
        assert!(store.delete("nodes/w1").unwrap());
        assert_eq!(
            next_now(&mut nodes),
            Change::Delete {
                key: text("nodes/w1"),
                revision: r + 9
            }
        );
    }

    /// Eight threads increment one counter by compare-and-put: each revision is won by one.
    pub fn racing_put_ifs_win_once_per_revision(store: &dyn Store<String>) {
        store.put("counter", &text("0")).unwrap();
        let wins_per_thread = 25;
        let won: Vec<(u64, u64)> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..8)
                .map(|_| {
                    scope.spawn(|| {
                        let mut won = Vec::new();
                        while won.len() < wins_per_thread {
                            let (value, expected) =
                                store.get_with_revision("counter").unwrap().unwrap();
                            let next = (value.parse::<u64>().unwrap() + 1).to_string();
                            if let Ok(revision) = store
                                .put_if("counter", &next, Expected::Revision(expected))
                                .unwrap()
                            {
                                won.push((expected, revision));
                            }
                        }
                        won
                    })
                })
                .collect();
            threads
                .into_iter()
                .flat_map(|thread| thread.join().unwrap())
                .collect()
        });
        let total = 8 * wins_per_thread;
        let mut expected: Vec<u64> = won.iter().map(|(expected, _)| *expected).collect();
        expected.sort_unstable();
        expected.dedup();
        assert_eq!(expected.len(), total, "no revision was won twice");
        assert_eq!(store.get("counter").unwrap(), Some(total.to_string()));
    }

    /// A watcher that reads nothing does not hold up commits; it is told it lagged.
    pub fn a_slow_watcher_is_dropped_not_waited_for(store: &dyn Store<String>) {
        let mut slow = store.watch("", store.revision().unwrap()).unwrap();
        let commits: Vec<Commit> = (0..watch::CHANNEL + 10)
            .map(|n| store.put_queued(&format!("k{n}"), &n.to_string()).unwrap())
            .collect();
        for commit in commits {
            commit.wait().unwrap();
        }
        let mut prompt = store.watch("", store.revision().unwrap()).unwrap();
        store.put("after", &text("more")).unwrap();
        assert_eq!(next_now(&mut prompt).key(), "after");
        let lagged = slow.try_next().unwrap().unwrap_err();
        assert!(matches!(lagged, WatchError::Lagged { .. }), "{lagged}");
        assert!(lagged.needs_relist());
        assert_eq!(slow.try_next().unwrap(), Err(lagged), "said again");
    }

    fn persistent(dir: &tempfile::TempDir) -> PersistentStore<String> {
        let db = PersistentDb::open(&dir.path().join("cube.redb")).unwrap();
        PersistentStore::<String>::new(db, "things").unwrap()
    }

    #[test]
    fn memory_store_keeps_the_contract() {
        behaves_like_a_store(&MemoryStore::<String>::new());
        keeps_revisions_and_can_be_watched(&MemoryStore::<String>::new());
        racing_put_ifs_win_once_per_revision(&MemoryStore::<String>::new());
        a_slow_watcher_is_dropped_not_waited_for(&MemoryStore::<String>::new());
    }

    #[test]
    fn persistent_store_keeps_the_contract() {
        behaves_like_a_store(&persistent(&tempfile::tempdir().unwrap()));
        keeps_revisions_and_can_be_watched(&persistent(&tempfile::tempdir().unwrap()));
    }

    #[test]
    fn persistent_put_ifs_racing_from_eight_threads_win_once_per_revision() {
        racing_put_ifs_win_once_per_revision(&persistent(&tempfile::tempdir().unwrap()));
    }

    #[test]
    fn a_slow_watcher_of_a_persistent_store_does_not_block_its_commits() {
        a_slow_watcher_is_dropped_not_waited_for(&persistent(&tempfile::tempdir().unwrap()));
    }

    /// A watch of `store` from `from` ends at once, told to relist from `oldest`.
    fn assert_compacted(store: &dyn Store<String>, from: u64, oldest: u64) {
        let err = store
            .watch("", from)
            .unwrap()
            .try_next()
            .unwrap()
            .unwrap_err();
        assert_eq!(
            err,
            WatchError::Compacted {
                requested: from,
                oldest
            }
        );
    }

    #[test]
    fn a_watch_older_than_the_kept_changes_says_relist() {
        let store = MemoryStore::<String>::with_watch_limits(3, 16);
        for n in 1..=5 {
            store.put("k", &n.to_string()).unwrap();
        }
        assert_compacted(&store, 1, 2);
        let listing = store.list_with_revision().unwrap();
        let mut relisted = store.watch("", listing.revision).unwrap();
        store.put("k", &text("6")).unwrap();
        assert_eq!(next_now(&mut relisted).revision(), 6);
    }

    #[test]
    fn a_store_without_history_reaches_its_watches_and_keeps_no_change() {
        keeps_no_change_for_a_watch_from_the_past(&MemoryStore::<String>::without_history());
        behaves_like_a_store(&MemoryStore::<String>::without_history());
    }

    #[test]
    fn a_file_table_nothing_watches_from_the_past_keeps_no_change_until_a_store_of_it_asks() {
        let dir = tempfile::tempdir().unwrap();
        let db = PersistentDb::open(&dir.path().join("cube.redb")).unwrap();
        let unwatched = PersistentStore::<String>::unwatched(db.clone(), "tasks").unwrap();
        keeps_no_change_for_a_watch_from_the_past(&unwatched);
        let fresh = tempfile::tempdir().unwrap();
        let fresh = PersistentDb::open(&fresh.path().join("cube.redb")).unwrap();
        behaves_like_a_store(&PersistentStore::<String>::unwatched(fresh, "things").unwrap());
        // A store of the same table that wants a history gets one, from then on, for both.
        let watched = PersistentStore::<String>::new(db, "tasks").unwrap();
        let from = watched.revision().unwrap();
        unwatched.put("k", &text("3")).unwrap();
        let mut from_past = watched.watch("", from).unwrap();
        assert_eq!(next_now(&mut from_past), put_of("k", "3", from + 1));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_watch_waits_for_the_next_commit_without_blocking_the_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let store = std::sync::Arc::new(persistent(&dir));
        let mut watch = store.watch("", 0).unwrap();
        let writer = std::thread::spawn({
            let store = store.clone();
            move || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                store.put("late", &text("value")).unwrap()
            }
        });
        let change = tokio::time::timeout(std::time::Duration::from_secs(10), watch.next())
            .await
            .expect("the change arrives")
            .unwrap();
        assert_eq!(change, put_of("late", "value", 1));
        writer.join().unwrap();
        let conditional = store
            .put_if_queued("late", &text("newer"), Expected::Revision(1))
            .unwrap();
        assert_eq!(conditional.durable().await.unwrap(), Ok(2));
        assert_eq!(watch.next().await.unwrap().revision(), 2);
    }
}
