//! Revisions and compare-and-put: what a writer expects of a key, and what it is told when
//! the key has moved on.

use crate::StoreError;
use crate::commit::Commit;

/// What a [`put_if`](crate::Store::put_if) expects the key to be when its write commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    /// The key holds nothing: the put creates it.
    Absent,
    /// The key holds a value last changed at this revision (its `mod_revision`).
    Revision(u64),
}

impl Expected {
    /// Whether a key whose last change was at `current` (`None`: absent) meets this.
    pub(crate) fn is_met_by(self, current: Option<u64>) -> bool {
        match self {
            Expected::Absent => current.is_none(),
            Expected::Revision(revision) => current == Some(revision),
        }
    }
}

/// A [`put_if`](crate::Store::put_if) that did not write because the key was not as
/// expected: an expected outcome (someone else wrote first), not an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the key has changed: its revision is {current:?}")]
pub struct Conflict {
    /// The key's revision when the write was tried; `None` when it was absent.
    pub current: Option<u64>,
}

/// Every value of a store with the revision of its key's last change, and the store's
/// revision as of the same moment: watching from that revision misses nothing after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing<V> {
    /// `(key, value, mod_revision)`, in key order.
    pub entries: Vec<(String, V, u64)>,
    /// The store's revision when the list was read.
    pub revision: u64,
}

/// A queued [`put_if`](crate::Store::put_if_queued): it is decided (written or in conflict)
/// and, when written, durable once [`ConditionalCommit::wait`] or
/// [`ConditionalCommit::durable`] answers.
#[must_use = "a write is not durable until its commit is waited for"]
pub struct ConditionalCommit {
    inner: Decision,
}

enum Decision {
    /// Decided at once (a store that keeps nothing on disk).
    Answered(Result<u64, Conflict>),
    /// Decided inside the transaction that commits it.
    Queued(Commit),
}

impl ConditionalCommit {
    pub(crate) fn answered(outcome: Result<u64, Conflict>) -> ConditionalCommit {
        ConditionalCommit {
            inner: Decision::Answered(outcome),
        }
    }

    pub(crate) fn queued(commit: Commit) -> ConditionalCommit {
        ConditionalCommit {
            inner: Decision::Queued(commit),
        }
    }

    /// Blocks the thread until the write is decided and durable: the store's revision of
    /// the write, or the conflict that stopped it.
    pub fn wait(self) -> Result<Result<u64, Conflict>, StoreError> {
        match self.inner {
            Decision::Answered(outcome) => Ok(outcome),
            Decision::Queued(commit) => commit.wait_written().map(|written| written.decided()),
        }
    }

    /// The same, waiting without blocking the thread: the commit happens on the store's
    /// commit thread.
    pub async fn durable(self) -> Result<Result<u64, Conflict>, StoreError> {
        match self.inner {
            Decision::Answered(outcome) => Ok(outcome),
            Decision::Queued(commit) => commit
                .durable_written()
                .await
                .map(|written| written.decided()),
        }
    }
}
