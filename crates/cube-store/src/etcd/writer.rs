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
//! **Fencing.** While the process holds a [`Fence`] (keys it created under its lease, each
//! with the revision it was created at: the leadership key, or every shard of the ring it
//! holds), every transaction is conditioned on each of those keys being still the one it
//! created. A process that lost its lease (it was paused, cut off), or any one of its keys,
//! has every write refused with [`StoreError::Fenced`](crate::StoreError::Fenced), naming a
//! key it lost, whatever it still believes.

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

/// One key a [`Fence`] holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceKey {
    /// The whole etcd key, prefix included ([`EtcdDb::fence_key`](super::EtcdDb::fence_key)
    /// makes one from a key relative to the prefix).
    pub key: String,
    /// The revision this process created the key at; 0 would mean "absent", which no held
    /// key is.
    pub create_revision: i64,
}

/// The keys this process holds (a leadership key, the shards of the ring it holds): its
/// writes are done only while *every* one of them is still the one it created.
///
/// A fence holds at least one key. A fence of none would let every write through, which is
/// what no fence at all does, so there is no such `Fence`: [`Fence::all`] refuses it and
/// the caller says what holding nothing means (for the writes of the tables,
/// `set_fence(None)` is "unfenced"; a caller that must not write without a key should not
/// write).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// In the order given, without a key twice: the first that moved is the one a refusal
    /// names.
    keys: Vec<FenceKey>,
}

/// Why a [`Fence`] cannot be built from the keys given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FenceError {
    #[error("a fence holds at least one key (no key: set no fence)")]
    Empty,
    /// Every key is one comparison (and one read, to name the key that moved) of each
    /// transaction, which etcd bounds.
    #[error("a fence of {keys} keys is more than one etcd transaction can compare: at most {most}")]
    TooMany { keys: usize, most: usize },
    /// The same key at two revisions: no write could ever pass such a fence.
    #[error("the fence key {key} is given twice, created at {first} and at {second}")]
    TwoRevisions {
        key: String,
        first: i64,
        second: i64,
    },
}

impl Fence {
    /// The most keys one fence holds: each transaction compares every key and the one
    /// conditional write it may carry, within etcd's default `--max-txn-ops`.
    pub const MAX_KEYS: usize = MAX_TXN_OPS - 1;

    /// A fence of one key (the leadership key): `key` is the whole etcd key.
    pub fn one(key: impl Into<String>, create_revision: i64) -> Fence {
        Fence {
            keys: vec![FenceKey {
                key: key.into(),
                create_revision,
            }],
        }
    }

    /// A fence of every key of `keys` (a key given twice at the same revision counts once).
    /// Refused when there is none (see [`Fence`]), more than [`Fence::MAX_KEYS`], or a key
    /// at two revisions.
    pub fn all(keys: impl IntoIterator<Item = FenceKey>) -> Result<Fence, FenceError> {
        let mut held: Vec<FenceKey> = Vec::new();
        for key in keys {
            match held.iter().find(|seen| seen.key == key.key) {
                Some(seen) if seen.create_revision == key.create_revision => {}
                Some(seen) => {
                    return Err(FenceError::TwoRevisions {
                        first: seen.create_revision,
                        second: key.create_revision,
                        key: key.key,
                    });
                }
                None => held.push(key),
            }
        }
        if held.is_empty() {
            return Err(FenceError::Empty);
        }
        if held.len() > Fence::MAX_KEYS {
            return Err(FenceError::TooMany {
                keys: held.len(),
                most: Fence::MAX_KEYS,
            });
        }
        Ok(Fence { keys: held })
    }

    /// The keys, in the order given.
    pub fn keys(&self) -> &[FenceKey] {
        &self.keys
    }

    /// One comparison per key: still at the revision it was created at.
    pub(crate) fn compares(&self) -> impl Iterator<Item = Compare> + '_ {
        self.keys.iter().map(|held| {
            Compare::create_revision(held.key.clone(), CompareOp::Equal, held.create_revision)
        })
    }

    /// One read per key, for a refused transaction's failure branch: what [`Fence::moved`]
    /// is given back.
    pub(crate) fn reads(&self) -> impl Iterator<Item = TxnOp> + '_ {
        self.keys
            .iter()
            .map(|held| TxnOp::get(held.key.clone(), None))
    }

    /// The first key that is no longer the one its holder created, given what
    /// [`Fence::reads`] read, in its order. An absent key was created at revision 0, as
    /// etcd's comparison has it, so the key named is one the comparison failed on.
    pub(crate) fn moved(&self, read: &[Option<&etcd_client::KeyValue>]) -> Option<&FenceKey> {
        self.keys.iter().enumerate().find_map(|(index, held)| {
            let now = read
                .get(index)
                .copied()
                .flatten()
                .map_or(0, |kv| kv.create_revision());
            (now != held.create_revision).then_some(held)
        })
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
    leader_key: String,
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
            // The leader's words are kept as they were: operators (and `cube`'s tests) look
            // for them.
            let lost = if *key == leader_key {
                "the leadership key"
            } else {
                "a key its writes are fenced on"
            };
            tracing::warn!(
                key = %key,
                writes = batch.len(),
                "a write was refused: this manager no longer holds {lost}"
            );
            refused.cancel();
        }
        answer(batch, outcomes, seen.clone(), settle_timeout);
    }
}

/// What a transaction did, for each of its writes.
type Outcomes = Result<Vec<Written>, Refused>;

async fn send(members: &Members, batch: &[QueuedWrite], fence: Option<&Fence>) -> Outcomes {
    let mut compares: Vec<Compare> = fence.into_iter().flat_map(Fence::compares).collect();
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
    // After the conditional write's read: `refusal` finds the fence's reads last.
    failure.extend(fence.into_iter().flat_map(Fence::reads));
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

/// Why a transaction's condition failed: the fence (nothing written, every write refused;
/// the first fenced key that moved is named), or a conditional write's key (a conflict, an
/// expected outcome).
fn refusal(batch: &[QueuedWrite], fence: Option<&Fence>, responses: &[TxnOpResponse]) -> Outcomes {
    let gets: Vec<Option<&etcd_client::KeyValue>> = responses
        .iter()
        .map(|response| match response {
            TxnOpResponse::Get(get) => get.kvs().first(),
            _ => None,
        })
        .collect();
    // `send` reads the conditional write's key first, when the batch is one, then every
    // fenced key.
    let conditional = usize::from(matches!(batch, [write] if write.expected.is_some()));
    if let Some(fence) = fence
        && let Some(moved) = fence.moved(gets.get(conditional..).unwrap_or_default())
    {
        return Err(Refused::Fenced {
            key: moved.key.clone(),
        });
    }
    let current = gets
        .first()
        .copied()
        .flatten()
        .filter(|_| conditional == 1)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn held(key: &str, create_revision: i64) -> FenceKey {
        FenceKey {
            key: key.to_string(),
            create_revision,
        }
    }

    #[test]
    fn a_fence_of_several_keys_keeps_them_in_order_and_each_once() {
        let fence = Fence::all([
            held("/cube/ring/shards/00007", 12),
            held("/cube/ring/shards/00003", 9),
            held("/cube/ring/shards/00007", 12),
        ])
        .unwrap();
        assert_eq!(
            fence.keys(),
            [
                held("/cube/ring/shards/00007", 12),
                held("/cube/ring/shards/00003", 9)
            ]
        );
        assert_eq!(
            Fence::all([held("/cube/leader", 4)]).unwrap(),
            Fence::one("/cube/leader", 4)
        );
    }

    #[test]
    fn a_fence_of_no_key_too_many_or_one_key_twice_is_refused() {
        assert_eq!(Fence::all([]), Err(FenceError::Empty));
        let most = (0..Fence::MAX_KEYS).map(|shard| held(&format!("/cube/ring/shards/{shard}"), 5));
        assert!(Fence::all(most).is_ok());
        let beyond =
            (0..=Fence::MAX_KEYS).map(|shard| held(&format!("/cube/ring/shards/{shard}"), 5));
        assert_eq!(
            Fence::all(beyond),
            Err(FenceError::TooMany {
                keys: MAX_TXN_OPS,
                most: MAX_TXN_OPS - 1
            })
        );
        assert_eq!(
            Fence::all([
                held("/cube/ring/shards/1", 5),
                held("/cube/ring/shards/1", 6)
            ]),
            Err(FenceError::TwoRevisions {
                key: "/cube/ring/shards/1".to_string(),
                first: 5,
                second: 6
            })
        );
    }
}
