//! Group commit: writes from many callers share one durable commit.
//!
//! A write is handed to the database's committer thread, which takes every write waiting at
//! that moment (up to [`MAX_BATCH`]), applies them in the order they were handed over in one
//! redb transaction, commits it durably (one fsync), and then tells each caller through its
//! [`Commit`]. A caller learns its write is durable only after the commit that holds it, so
//! nothing acknowledged can be lost; what is shared is the fsync, which costs the same for
//! one write or a thousand.
//!
//! Writes are applied in the order they were queued, so a caller that queues two writes of
//! the same key (under its own lock) knows the later one wins, even without waiting for the
//! first.

use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};

use redb::{Database, ReadableTable, TableDefinition};

use crate::StoreError;

/// Each store's index, under the store's table name.
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("cube_meta");

/// The most writes one commit takes; more wait for the next.
const MAX_BATCH: usize = 4096;

/// What one write did once committed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Written {
    /// A put always changes; a delete only when the key was there.
    pub(crate) changed: bool,
    /// The store's index after this write.
    pub(crate) index: u64,
}

/// One write waiting for the committer: `value` `None` deletes the key.
pub(crate) struct Write {
    pub(crate) table: String,
    pub(crate) key: String,
    pub(crate) value: Option<Vec<u8>>,
    pub(crate) slot: Arc<Slot>,
}

/// Where the committer leaves a write's outcome, for a thread that blocks on it or a task
/// that awaits it.
#[derive(Default)]
pub(crate) struct Slot {
    outcome: Mutex<Option<Result<Written, String>>>,
    filled: Condvar,
    notify: tokio::sync::Notify,
}

impl Slot {
    fn fill(&self, outcome: Result<Written, String>) {
        *lock(&self.outcome) = Some(outcome);
        self.filled.notify_all();
        // `notify_one` keeps a permit when nobody awaits yet, so no wake-up is lost.
        self.notify.notify_one();
    }

    fn take(&self) -> Option<Result<Written, String>> {
        lock(&self.outcome).take()
    }

    pub(crate) fn wait(&self) -> Result<Written, StoreError> {
        let mut outcome = lock(&self.outcome);
        loop {
            if let Some(outcome) = outcome.take() {
                return outcome.map_err(StoreError::Commit);
            }
            outcome = self
                .filled
                .wait(outcome)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    async fn durable(&self) -> Result<Written, StoreError> {
        loop {
            if let Some(outcome) = self.take() {
                return outcome.map_err(StoreError::Commit);
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
    Queued(Arc<Slot>),
}

impl Commit {
    /// A write that needs no waiting: the store's index after it.
    pub fn done(index: u64) -> Commit {
        Commit {
            inner: Inner::Done(index),
        }
    }

    pub(crate) fn queued(slot: Arc<Slot>) -> Commit {
        Commit {
            inner: Inner::Queued(slot),
        }
    }

    /// Blocks the thread until the write is durable; the store's index after it.
    pub fn wait(self) -> Result<u64, StoreError> {
        match self.inner {
            Inner::Done(index) => Ok(index),
            Inner::Queued(slot) => slot.wait().map(|written| written.index),
        }
    }

    /// Waits, without blocking the thread, until the write is durable; the store's index
    /// after it.
    pub async fn durable(self) -> Result<u64, StoreError> {
        match self.inner {
            Inner::Done(index) => Ok(index),
            Inner::Queued(slot) => slot.durable().await.map(|written| written.index),
        }
    }
}

/// Takes writes off `writes` until every sender is gone, committing them in batches.
pub(crate) fn run_committer(db: Arc<Database>, writes: mpsc::Receiver<Write>) {
    while let Ok(first) = writes.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match writes.try_recv() {
                Ok(write) => batch.push(write),
                Err(_) => break,
            }
        }
        match apply(&db, &batch) {
            Ok(outcomes) => {
                for (write, outcome) in batch.iter().zip(outcomes) {
                    write.slot.fill(Ok(outcome));
                }
            }
            Err(err) => {
                let reason = err.to_string();
                for write in &batch {
                    write.slot.fill(Err(reason.clone()));
                }
            }
        }
    }
}

/// Applies `batch` in order in one transaction, bumping each table's index once per change,
/// and commits durably.
fn apply(db: &Database, batch: &[Write]) -> Result<Vec<Written>, redb::Error> {
    let txn = db.begin_write()?;
    let mut outcomes = vec![Written::default(); batch.len()];
    {
        let mut tables: Vec<&str> = Vec::new();
        for write in batch {
            if !tables.contains(&write.table.as_str()) {
                tables.push(&write.table);
            }
        }
        let mut meta = txn.open_table(META)?;
        for name in tables {
            let mut table = txn.open_table(TableDefinition::<&str, &[u8]>::new(name))?;
            let mut index = meta.get(name)?.map(|stored| stored.value()).unwrap_or(0);
            for (at, write) in batch
                .iter()
                .enumerate()
                .filter(|(_, write)| write.table == name)
            {
                let changed = match &write.value {
                    Some(bytes) => {
                        table.insert(write.key.as_str(), bytes.as_slice())?;
                        true
                    }
                    None => table.remove(write.key.as_str())?.is_some(),
                };
                if changed {
                    index += 1;
                }
                outcomes[at] = Written { changed, index };
            }
            meta.insert(name, index)?;
        }
    }
    txn.commit()?;
    Ok(outcomes)
}
