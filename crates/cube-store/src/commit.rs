//! Group commit: writes from many callers share one durable commit.
//!
//! A write is queued; whoever commits next takes every write waiting at that moment (up to
//! [`MAX_BATCH`]), applies them in the order they were queued in one redb transaction,
//! commits it durably (one fsync), and tells each caller through its [`Commit`]. A caller
//! learns its write is durable only after the commit that holds it, so nothing acknowledged
//! can be lost; what is shared is the fsync, which costs the same for one write or a
//! thousand.
//!
//! Who commits: a thread blocked on its write ([`Commit::wait`]) commits the queue itself
//! when nobody else is committing (so a lone write costs what a direct commit costs, with no
//! hand-off to another thread); when someone is, it waits, and the writes queued meanwhile go
//! into the next commit. A background thread commits whatever is queued and not waited for,
//! and whatever is awaited ([`Commit::durable`]): an async task never commits, so no fsync
//! runs on a runtime's thread.
//!
//! Each change also moves the file's revision (in [`META`]) and records the key's revision
//! (in [`REVISIONS`]); a conditional write is checked against the key inside the same
//! transaction, after the writes queued before it. Once committed, the changes are published
//! to their table's [`ChangeHub`] (for watchers) before any writer is answered, by the holder
//! of the right to commit, so watchers see them in revision order.
//!
//! Writes are applied in the order they were queued, so a caller that queues two writes of
//! the same key (under its own lock) knows the later one wins, even without waiting for the
//! first.
//!
//! A commit that panics (inside redb) or fails in the storage itself (an I/O error, a damaged
//! page) *fails the store*: every write of that commit, every write waiting, and every later
//! write is answered with [`StoreError::Failed`], and whoever watches
//! [`Committer::failed`] learns the cause. redb refuses further writes after such an error
//! until the file is opened again, so a store that carried on would only be a process that
//! answers reads and silently loses every write.

use std::collections::{HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Condvar, Mutex, TryLockError};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::StoreError;
use crate::revision::{Conflict, Expected};
use crate::watch::{Change, ChangeHub, History};

/// Each store's index, under the store's table name, and the file's revision under
/// [`REVISION_KEY`].
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("cube_meta");

/// The key in [`META`] of the file's revision: one counter for every table, moved by one
/// with every change, as etcd's revision is. No table name starts with a NUL.
pub(crate) const REVISION_KEY: &str = "\u{0}revision";

/// The revision of each key's last change (its `mod_revision`), under (table, key). A key
/// written before revisions were kept has none here, and counts as changed at revision 0.
pub(crate) const REVISIONS: TableDefinition<(&str, &str), u64> =
    TableDefinition::new("cube_revisions");

/// The changes of one table, for its watchers; a `std` mutex because it is held only to
/// copy a change into bounded channels, never across an await.
pub(crate) type TableHub = Arc<Mutex<ChangeHub<Arc<[u8]>>>>;

/// The most writes one commit takes; more wait for the next.
const MAX_BATCH: usize = 4096;

/// What one write did once committed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Written {
    /// A put always changes (unless its condition failed); a delete only when the key was
    /// there.
    pub(crate) changed: bool,
    /// The store's index after this write.
    pub(crate) index: u64,
    /// The file's revision after this write: the write's own when it changed something.
    pub(crate) revision: u64,
    /// Set when the write had a condition that the key did not meet: nothing was written.
    pub(crate) conflict: Option<Conflict>,
}

impl Written {
    /// What a conditional write answers: its revision, or the conflict.
    pub(crate) fn decided(self) -> Result<u64, Conflict> {
        match self.conflict {
            Some(conflict) => Err(conflict),
            None => Ok(self.revision),
        }
    }
}

/// One write waiting for the committer: `value` `None` deletes the key; with `expected`,
/// the write happens only if the key is as expected when its transaction reads it.
pub(crate) struct Write {
    pub(crate) table: String,
    pub(crate) key: String,
    pub(crate) value: Option<Arc<[u8]>>,
    pub(crate) expected: Option<Expected>,
    pub(crate) slot: Arc<Slot>,
}

/// Why a write was not committed.
#[derive(Debug, Clone)]
pub(crate) enum Refused {
    /// This commit failed; the store goes on.
    Commit(String),
    /// The store failed (see the module comment): this write and every later one are refused.
    StoreFailed { path: String, cause: String },
    /// No member of the etcd cluster answered (see [`StoreError::Unavailable`]).
    Unavailable { endpoints: String, reason: String },
    /// The write was conditioned on keys this process held, and `key` (one of them) it no
    /// longer holds.
    Fenced { key: String },
}

impl From<Refused> for StoreError {
    fn from(refused: Refused) -> StoreError {
        match refused {
            Refused::Commit(reason) => StoreError::Commit(reason),
            Refused::StoreFailed { path, cause } => StoreError::Failed { path, cause },
            Refused::Unavailable { endpoints, reason } => {
                StoreError::Unavailable { endpoints, reason }
            }
            Refused::Fenced { key } => StoreError::Fenced { key },
        }
    }
}

/// Where the committer leaves a write's outcome, for a thread that blocks on it or a task
/// that awaits it.
#[derive(Default)]
pub(crate) struct Slot {
    outcome: Mutex<Option<Result<Written, Refused>>>,
    filled: Condvar,
    notify: tokio::sync::Notify,
}

impl Slot {
    pub(crate) fn fill(&self, outcome: Result<Written, Refused>) {
        *lock(&self.outcome) = Some(outcome);
        self.filled.notify_all();
        // `notify_one` keeps a permit when nobody awaits yet, so no wake-up is lost.
        self.notify.notify_one();
    }

    fn take(&self) -> Option<Result<Written, Refused>> {
        lock(&self.outcome).take()
    }

    /// Blocks until the write is durable, committing the queue itself when nobody else is.
    pub(crate) fn wait(&self, committer: &Committer) -> Result<Written, StoreError> {
        loop {
            if let Some(outcome) = self.take() {
                return outcome.map_err(StoreError::from);
            }
            if committer.commit_if_free() {
                continue;
            }
            // Someone is committing. If our write is not in that commit, the background
            // thread (woken when it was queued) commits it next.
            let mut outcome = lock(&self.outcome);
            while outcome.is_none() {
                outcome = self
                    .filled
                    .wait(outcome)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
        }
    }

    /// Blocks until someone else (a remote store's writer) fills the slot.
    fn wait_filled(&self) -> Result<Written, StoreError> {
        let mut outcome = lock(&self.outcome);
        loop {
            if let Some(filled) = outcome.take() {
                return filled.map_err(StoreError::from);
            }
            outcome = self
                .filled
                .wait(outcome)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// The same without blocking the thread: the background thread (woken when the write
    /// was queued) commits it, so no fsync happens on an async runtime's thread.
    async fn durable(&self) -> Result<Written, StoreError> {
        loop {
            if let Some(outcome) = self.take() {
                return outcome.map_err(StoreError::from);
            }
            self.notify.notified().await;
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every critical section is one assignment or take: nothing is ever left half-written.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A write that has been queued. It is durable once [`Commit::wait`] or [`Commit::durable`]
/// returns `Ok`; until then nothing may be acknowledged on its strength.
#[must_use = "a write is not durable until its commit is waited for"]
pub struct Commit {
    inner: Inner,
}

enum Inner {
    /// Already durable (or a store that keeps nothing on disk).
    Done(u64),
    Queued(Arc<Committer>, Arc<Slot>),
    /// Sent to a store elsewhere (etcd), whose writer fills the slot once the cluster
    /// committed the write or refused it.
    Remote(Arc<Slot>),
}

impl Commit {
    /// A write that needs no waiting: the store's index after it.
    pub fn done(index: u64) -> Commit {
        Commit {
            inner: Inner::Done(index),
        }
    }

    pub(crate) fn queued(committer: Arc<Committer>, slot: Arc<Slot>) -> Commit {
        Commit {
            inner: Inner::Queued(committer, slot),
        }
    }

    pub(crate) fn remote(slot: Arc<Slot>) -> Commit {
        Commit {
            inner: Inner::Remote(slot),
        }
    }

    /// Blocks the thread until the write is durable; the store's index after it.
    pub fn wait(self) -> Result<u64, StoreError> {
        self.wait_written().map(|written| written.index)
    }

    /// Blocks the thread until the write is durable; what it did.
    pub(crate) fn wait_written(self) -> Result<Written, StoreError> {
        match self.inner {
            Inner::Done(index) => Ok(Written {
                changed: true,
                index,
                revision: index,
                conflict: None,
            }),
            Inner::Queued(committer, slot) => slot.wait(&committer),
            Inner::Remote(slot) => slot.wait_filled(),
        }
    }

    /// Waits, without blocking the thread, until the write is durable; the store's index
    /// after it. The commit itself happens on the store's commit thread.
    pub async fn durable(self) -> Result<u64, StoreError> {
        self.durable_written().await.map(|written| written.index)
    }

    /// Waits, without blocking the thread, until the write is durable; what it did.
    pub(crate) async fn durable_written(self) -> Result<Written, StoreError> {
        match self.inner {
            Inner::Done(index) => Ok(Written {
                changed: true,
                index,
                revision: index,
                conflict: None,
            }),
            // The committer is kept alive until the write is answered.
            Inner::Queued(_committer, slot) => slot.durable().await,
            Inner::Remote(slot) => slot.durable().await,
        }
    }
}

/// The queue of writes of one database, and the right to commit them.
pub(crate) struct Committer {
    db: Arc<Database>,
    /// The file, for the errors that name it.
    path: String,
    queue: Mutex<Queue>,
    /// Signalled when a write is queued or the queue closes; the background thread waits here.
    queued: Condvar,
    /// Held by whoever takes a batch off the queue and commits it, so commits keep the
    /// queue's order.
    committing: Mutex<()>,
    /// The cause once the store has failed, for those who wait for that to happen (the
    /// process that serves the store stops on it); `None` while it is sound.
    failure: tokio::sync::watch::Sender<Option<String>>,
    /// The watched tables' changes, by table name; each is published to under `committing`,
    /// so in revision order. A table gets its hub when its first store is made.
    hubs: Mutex<HashMap<String, TableHub>>,
    /// Makes the next commit panic, as a bug or a damaged page inside redb would.
    #[cfg(test)]
    pub(crate) panic_next_commit: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Queue {
    writes: VecDeque<Write>,
    closed: bool,
    /// Why the store failed: set once, never cleared. Kept under the queue's lock so that no
    /// write can be queued after the failure and never be answered.
    failed: Option<String>,
}

impl Committer {
    pub(crate) fn new(db: Arc<Database>, path: String) -> Committer {
        Committer {
            db,
            path,
            queue: Mutex::new(Queue::default()),
            queued: Condvar::new(),
            committing: Mutex::new(()),
            failure: tokio::sync::watch::Sender::new(None),
            hubs: Mutex::new(HashMap::new()),
            #[cfg(test)]
            panic_next_commit: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub(crate) fn path(&self) -> &str {
        &self.path
    }

    /// The error every write gets once the store has failed; `Ok` while it is sound.
    pub(crate) fn health(&self) -> Result<(), StoreError> {
        match &lock(&self.queue).failed {
            None => Ok(()),
            Some(cause) => Err(self.failed_error(cause)),
        }
    }

    /// Resolves with the cause when the store fails (at once if it has).
    pub(crate) async fn failed(&self) -> String {
        let mut failure = self.failure.subscribe();
        // The guard `wait_for` returns is not `Send`: the cause is copied out at once.
        let cause = failure
            .wait_for(Option::is_some)
            .await
            .map(|cause| cause.clone());
        match cause {
            Ok(cause) => cause.unwrap_or_default(),
            // The sender lives as long as `self`, which the caller borrows.
            Err(_) => std::future::pending().await,
        }
    }

    fn failed_error(&self, cause: &str) -> StoreError {
        StoreError::Failed {
            path: self.path.clone(),
            cause: cause.to_string(),
        }
    }

    pub(crate) fn database(&self) -> &Database {
        &self.db
    }

    /// The hub of `table`'s changes, made on first use: it knows every change committed from
    /// then on. Made while nobody commits, so that its start is exactly the file's revision.
    pub(crate) fn hub(&self, table: &str, history: History) -> Result<TableHub, StoreError> {
        let _committing = lock(&self.committing);
        let mut hubs = lock(&self.hubs);
        if let Some(hub) = hubs.get(table) {
            lock(hub).keep_history(history);
            return Ok(hub.clone());
        }
        let revision = read_revision(&self.db)?;
        let hub: TableHub = Arc::new(Mutex::new(ChangeHub::of_bytes(revision, history)));
        if lock(&self.queue).failed.is_some() {
            lock(&hub).close();
        }
        hubs.insert(table.to_string(), hub.clone());
        Ok(hub)
    }

    /// Hands each change of a committed batch to its table's watchers, in the batch's
    /// order; the caller holds the right to commit, so batches are published in order too.
    fn publish(&self, batch: &[Write], outcomes: &[Written]) {
        let hubs = lock(&self.hubs);
        for (write, written) in batch.iter().zip(outcomes) {
            if !written.changed {
                continue;
            }
            let Some(hub) = hubs.get(&write.table) else {
                continue;
            };
            let change = match &write.value {
                Some(value) => Change::Put {
                    key: write.key.clone(),
                    value: value.clone(),
                    revision: written.revision,
                },
                None => Change::Delete {
                    key: write.key.clone(),
                    revision: written.revision,
                },
            };
            lock(hub).publish(change);
        }
    }

    /// Queues a write behind every write queued before it.
    pub(crate) fn queue(&self, write: Write) -> Result<(), StoreError> {
        let mut queue = lock(&self.queue);
        if let Some(cause) = &queue.failed {
            return Err(self.failed_error(cause));
        }
        if queue.closed {
            return Err(StoreError::Commit("the store is closing".to_string()));
        }
        queue.writes.push_back(write);
        self.queued.notify_one();
        Ok(())
    }

    /// Commits one batch of the queue unless someone else is committing; says whether it
    /// did (an empty queue counts: there was nothing to wait for).
    fn commit_if_free(&self) -> bool {
        let guard = match self.committing.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return false,
        };
        self.commit_batch(&guard);
        true
    }

    /// Takes up to [`MAX_BATCH`] queued writes and commits them; `_committing` proves the
    /// caller holds the right to.
    fn commit_batch(&self, _committing: &std::sync::MutexGuard<'_, ()>) {
        let batch: Vec<Write> = {
            let mut queue = lock(&self.queue);
            let count = queue.writes.len().min(MAX_BATCH);
            queue.writes.drain(..count).collect()
        };
        if batch.is_empty() {
            return;
        }
        // A panic is caught here, in whichever thread commits, so that it can neither end the
        // background thread silently nor unwind into a caller that only wanted its write.
        let applied = catch_unwind(AssertUnwindSafe(|| {
            #[cfg(test)]
            if self
                .panic_next_commit
                .swap(false, std::sync::atomic::Ordering::SeqCst)
            {
                panic!("a test asked this commit to panic");
            }
            apply(&self.db, &batch)
        }));
        match applied {
            Ok(Ok(outcomes)) => {
                // Watchers hear of a change before its writer is answered: whoever the
                // writer tells next may start a watch and must not miss it.
                self.publish(&batch, &outcomes);
                for (write, outcome) in batch.iter().zip(outcomes) {
                    write.slot.fill(Ok(outcome));
                }
            }
            Ok(Err(err)) if fails_the_store(&err) => {
                self.fail(format!("a commit failed: {err}"), batch);
            }
            Ok(Err(err)) => {
                let reason = err.to_string();
                for write in &batch {
                    write.slot.fill(Err(Refused::Commit(reason.clone())));
                }
            }
            Err(panic) => {
                let message = crate::check::panic_message(&*panic);
                self.fail(format!("a commit panicked: {message}"), batch);
            }
        }
    }

    /// Marks the store failed with `cause` and refuses `batch`, every write still queued, and
    /// (in [`Committer::queue`]) every later one.
    fn fail(&self, cause: String, batch: Vec<Write>) {
        let waiting: Vec<Write> = {
            let mut queue = lock(&self.queue);
            queue.failed.get_or_insert_with(|| cause.clone());
            queue.writes.drain(..).collect()
        };
        let refused = Refused::StoreFailed {
            path: self.path.clone(),
            cause: cause.clone(),
        };
        // Nothing more will be committed: the watchers are told so, before the writers (as a
        // change reaches watchers before its writer is answered).
        for hub in lock(&self.hubs).values() {
            lock(hub).close();
        }
        for write in batch.iter().chain(&waiting) {
            write.slot.fill(Err(refused.clone()));
        }
        self.failure.send_if_modified(|failure| {
            let first = failure.is_none();
            failure.get_or_insert(cause);
            first
        });
    }

    /// The background thread: commits whatever is queued, until the queue is closed and
    /// empty.
    pub(crate) fn run(&self) {
        loop {
            {
                let mut queue = lock(&self.queue);
                while queue.writes.is_empty() && !queue.closed {
                    queue = self
                        .queued
                        .wait(queue)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                }
                if queue.writes.is_empty() {
                    return;
                }
            }
            let guard = lock(&self.committing);
            self.commit_batch(&guard);
        }
    }

    /// Refuses new writes; the background thread commits those queued and ends.
    pub(crate) fn close(&self) {
        lock(&self.queue).closed = true;
        self.queued.notify_all();
    }
}

/// Whether `err` comes from the storage under redb rather than from one commit: after an
/// I/O error redb takes no more writes until the file is opened again, and a damaged page
/// stays damaged.
fn fails_the_store(err: &redb::Error) -> bool {
    matches!(
        err,
        redb::Error::Io(_)
            | redb::Error::Corrupted(_)
            | redb::Error::PreviousIo
            | redb::Error::LockPoisoned(_)
            | redb::Error::DatabaseClosed
    )
}

/// One table of values, open for writing.
type ValuesTable<'txn> = redb::Table<'txn, &'static str, &'static [u8]>;

/// The file's revision as of the last commit.
pub(crate) fn read_revision(db: &Database) -> Result<u64, StoreError> {
    let txn = db.begin_read().map_err(redb::Error::from)?;
    let meta = match txn.open_table(META) {
        Ok(meta) => meta,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
        Err(err) => return Err(redb::Error::from(err).into()),
    };
    Ok(meta
        .get(REVISION_KEY)
        .map_err(redb::Error::from)?
        .map_or(0, |stored| stored.value()))
}

/// Applies `batch` in queue order in one transaction: each change moves its table's index
/// and the file's revision by one and records the key's revision; a conditional write whose
/// key is not as expected changes nothing. Commits durably.
fn apply(db: &Database, batch: &[Write]) -> Result<Vec<Written>, redb::Error> {
    let txn = db.begin_write()?;
    let mut outcomes = Vec::with_capacity(batch.len());
    {
        let mut meta = txn.open_table(META)?;
        let mut revisions = txn.open_table(REVISIONS)?;
        let mut revision = meta.get(REVISION_KEY)?.map_or(0, |stored| stored.value());
        // The tables this batch writes, open at once, each with its index.
        let mut tables: Vec<(&str, ValuesTable<'_>, u64)> = Vec::new();
        for write in batch {
            let name = write.table.as_str();
            let at = match tables.iter().position(|(open, ..)| *open == name) {
                Some(at) => at,
                None => {
                    let table = txn.open_table(TableDefinition::<&str, &[u8]>::new(name))?;
                    let index = meta.get(name)?.map_or(0, |stored| stored.value());
                    tables.push((name, table, index));
                    tables.len() - 1
                }
            };
            let (_, table, index) = &mut tables[at];
            let key = write.key.as_str();
            if let Some(expected) = write.expected {
                let current = match table.get(key)? {
                    None => None,
                    Some(_) => Some(
                        revisions
                            .get((name, key))?
                            .map_or(0, |stored| stored.value()),
                    ),
                };
                if !expected.is_met_by(current) {
                    outcomes.push(Written {
                        changed: false,
                        index: *index,
                        revision,
                        conflict: Some(Conflict { current }),
                    });
                    continue;
                }
            }
            let changed = match &write.value {
                Some(bytes) => {
                    table.insert(key, &**bytes)?;
                    revisions.insert((name, key), revision + 1)?;
                    true
                }
                None => {
                    revisions.remove((name, key))?;
                    table.remove(key)?.is_some()
                }
            };
            if changed {
                *index += 1;
                revision += 1;
            }
            outcomes.push(Written {
                changed,
                index: *index,
                revision,
                conflict: None,
            });
        }
        for (name, _, index) in &tables {
            meta.insert(*name, *index)?;
        }
        meta.insert(REVISION_KEY, revision)?;
    }
    txn.commit()?;
    Ok(outcomes)
}
