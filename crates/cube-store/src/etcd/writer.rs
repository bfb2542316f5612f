//! The writes of an etcd store: in the order they were queued, many in one transaction.
//!
//! One task sends the writes. It takes what is queued, as many consecutive unconditional
//! writes of distinct keys as one etcd transaction may hold ([`MAX_TXN_OPS`]), or one
//! conditional write alone, and sends them as one transaction; the next transaction leaves
//! only once this one is answered, so writes are applied in the order they were queued,
//! and concurrent writers share one raft round (etcd's group commit, as redb's commit thread
//! gives one fsync to many).
//!
//! A write is answered once etcd committed it *and* the store's own feed of etcd's changes
//! has delivered it to the store's watchers (see `feed.rs`): as with redb, a change reaches
//! watchers before its writer hears it is done.
//!
//! **Fencing.** While the process holds a [`Fence`] (a leadership key and the revision it
//! was created at), every transaction is conditioned on that key being still the one it
//! created. A process that lost its lease (it was paused, cut off) has every write refused
//! with [`StoreError::Fenced`], whatever it still believes.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::members::Members;
use crate::commit::{Refused, Slot, Written};
use crate::revision::{Conflict, Expected};

/// etcd's default `--max-txn-ops`.
pub(crate) const MAX_TXN_OPS: usize = 128;

/// A leadership key held by this process: its writes are done only while the key is still
/// the one it created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The whole etcd key, prefix included.
    pub key: String,
    /// The revision the key was created at by this process's campaign.
    pub create_revision: i64,
}

impl Fence {
    fn compare(&self) -> Compare {
        Compare::create_revision(self.key.clone(), CompareOp::Equal, self.create_revision)
    }
}

/// The fence every write is conditioned on, if any, and the token cancelled when a write
/// conditioned on it is refused; a `std` mutex held to clone them.
pub(crate) type FenceCell = Arc<Mutex<Option<(Fence, CancellationToken)>>>;

/// One write waiting to be sent.
pub(crate) struct QueuedWrite {
    /// The whole etcd key.
    pub(crate) key: String,
    /// `None` deletes the key.
    pub(crate) value: Option<Vec<u8>>,
    pub(crate) expected: Option<Expected>,
    pub(crate) answer: Answer,
}

/// Where a write's outcome goes. A write dropped unanswered (the store closed under it) is
/// answered with an error, so no caller waits for ever.
pub(crate) struct Answer(Option<Arc<Slot>>);

impl Answer {
    pub(crate) fn new(slot: Arc<Slot>) -> Answer {
        Answer(Some(slot))
    }

    fn send(mut self, outcome: Result<Written, Refused>) {
        if let Some(slot) = self.0.take() {
            slot.fill(outcome);
        }
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if let Some(slot) = self.0.take() {
            slot.fill(Err(Refused::Commit(
                "the etcd store closed before the write was answered".to_string(),
            )));
        }
    }
}

/// Sends queued writes until every sender of the queue is gone.
pub(crate) async fn run(
    members: Arc<Members>,
    mut queue: mpsc::UnboundedReceiver<QueuedWrite>,
    fence: FenceCell,
    seen: watch::Receiver<u64>,
    settle_timeout: Duration,
) {
    let mut held: Option<QueuedWrite> = None;
    loop {
        let first = match held.take() {
            Some(write) => write,
            None => match queue.recv().await {
                Some(write) => write,
                None => return,
            },
        };
        let mut batch = vec![first];
        if batch[0].expected.is_none() {
            let mut keys: HashSet<String> = HashSet::from([batch[0].key.clone()]);
            while batch.len() < MAX_TXN_OPS {
                let Ok(next) = queue.try_recv() else { break };
                // etcd refuses one key twice in a transaction; a conditional write goes
                // alone. Either waits for the next transaction, keeping the order.
                if next.expected.is_some() || !keys.insert(next.key.clone()) {
                    held = Some(next);
                    break;
                }
                batch.push(next);
            }
        }
        let fence = fence.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let outcomes = send(&members, &batch, fence.as_ref().map(|(fence, _)| fence)).await;
        if let (Err(Refused::Fenced { key }), Some((_, refused))) = (&outcomes, &fence) {
            tracing::warn!(
                key = %key,
                writes = batch.len(),
                "a write was refused: this manager no longer holds the leadership key"
            );
            refused.cancel();
        }
        answer(batch, outcomes, seen.clone(), settle_timeout);
    }
}

/// What a transaction did, for each of its writes.
type Outcomes = Result<Vec<Written>, Refused>;

async fn send(members: &Members, batch: &[QueuedWrite], fence: Option<&Fence>) -> Outcomes {
    let mut compares: Vec<Compare> = fence.iter().map(|fence| fence.compare()).collect();
    let mut failure = Vec::new();
    if let [write] = batch
        && let Some(expected) = write.expected
    {
        compares.push(match expected {
            Expected::Absent => Compare::version(write.key.clone(), CompareOp::Equal, 0),
            Expected::Revision(revision) => Compare::mod_revision(
                write.key.clone(),
                CompareOp::Equal,
                i64::try_from(revision).unwrap_or(i64::MAX),
            ),
        });
        failure.push(TxnOp::get(write.key.clone(), None));
    }
    if let Some(fence) = fence {
        failure.push(TxnOp::get(fence.key.clone(), None));
    }
    let operations: Vec<TxnOp> = batch
        .iter()
        .map(|write| match &write.value {
            Some(value) => TxnOp::put(write.key.clone(), value.clone(), None),
            None => TxnOp::delete(write.key.clone(), None),
        })
        .collect();
    let txn = Txn::new()
        .when(compares)
        .and_then(operations)
        .or_else(failure);
    let response = members
        .call(|mut client| {
            let txn = txn.clone();
            async move { client.txn(txn).await }
        })
        .await;
    let response = match response {
        Ok(response) => response,
        Err(err) => {
            return Err(match err {
                crate::StoreError::Unavailable { endpoints, reason } => {
                    Refused::Unavailable { endpoints, reason }
                }
                other => Refused::Commit(other.to_string()),
            });
        }
    };
    let revision = response
        .header()
        .map_or(0, |header| u64::try_from(header.revision()).unwrap_or(0));
    let responses = response.op_responses();
    if !response.succeeded() {
        return refusal(batch, fence, &responses);
    }
    Ok(responses
        .iter()
        .map(|response| {
            let changed = match response {
                TxnOpResponse::Delete(deleted) => deleted.deleted() > 0,
                _ => true,
            };
            Written {
                changed,
                index: revision,
                revision,
                conflict: None,
            }
        })
        .collect())
}

/// Why a transaction's condition failed: the fence (nothing written, every write refused),
/// or a conditional write's key (a conflict, an expected outcome).
fn refusal(batch: &[QueuedWrite], fence: Option<&Fence>, responses: &[TxnOpResponse]) -> Outcomes {
    let gets: Vec<Option<&etcd_client::KeyValue>> = responses
        .iter()
        .map(|response| match response {
            TxnOpResponse::Get(get) => get.kvs().first(),
            _ => None,
        })
        .collect();
    if let Some(fence) = fence {
        let holder = gets.last().copied().flatten();
        if holder.map(|kv| kv.create_revision()) != Some(fence.create_revision) {
            return Err(Refused::Fenced {
                key: fence.key.clone(),
            });
        }
    }
    let current = gets
        .first()
        .copied()
        .flatten()
        .map(|kv| u64::try_from(kv.mod_revision()).unwrap_or(0));
    Ok(batch
        .iter()
        .map(|_| Written {
            changed: false,
            index: 0,
            revision: 0,
            conflict: Some(Conflict { current }),
        })
        .collect())
}

/// Answers each write of a batch, once the store's feed has delivered its changes to the
/// watchers (or has not within `settle_timeout`: the write is durable all the same, so it
/// is answered, and the delay is logged).
fn answer(
    batch: Vec<QueuedWrite>,
    outcomes: Outcomes,
    mut seen: watch::Receiver<u64>,
    settle_timeout: Duration,
) {
    let changed_at = match &outcomes {
        Ok(written) => written
            .iter()
            .filter(|written| written.changed)
            .map(|written| written.revision)
            .max(),
        Err(_) => None,
    };
    let deliver = move || match outcomes {
        Ok(written) => {
            for (write, written) in batch.into_iter().zip(written) {
                write.answer.send(Ok(written));
            }
        }
        Err(refused) => {
            for write in batch {
                write.answer.send(Err(refused.clone()));
            }
        }
    };
    let Some(revision) = changed_at else {
        deliver();
        return;
    };
    tokio::spawn(async move {
        let settled = tokio::time::timeout(
            settle_timeout,
            seen.wait_for(|reached| *reached >= revision),
        )
        .await;
        if !matches!(settled, Ok(Ok(_))) {
            tracing::warn!(
                revision,
                "a write committed in etcd was not seen by the store's watch in time; answered anyway"
            );
        }
        deliver();
    });
}
