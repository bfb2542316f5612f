//! Optimistic writes of several keys at once: read keys with their `mod_revision`, then
//! write a set of keys only if none of the read ones changed since (Omega's shared state,
//! the placement of several managers at once: `cube_types::claims`). A transaction that
//! loses the race answers with the keys as they are now, read in the same round trip, so
//! the writer plans again at once on the fresher values.
//!
//! Keys here are relative to the store's prefix, as table names are: `tasks/ID` is a task
//! record of the `tasks` table, and its watchers see the write as any other.

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};

use super::EtcdDb;
use super::leased::{relative_key, send_txn};
use super::writer::{Fence, MAX_TXN_OPS};
use crate::StoreError;

/// A key as read, with the revision it was last changed at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned {
    /// The key without the store's prefix.
    pub key: String,
    pub value: Vec<u8>,
    pub mod_revision: i64,
}

/// A key that must still be as it was read for a write to go through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unchanged {
    /// The key without the store's prefix.
    pub key: String,
    /// Its `mod_revision` when read; 0: it must still be absent.
    pub mod_revision: i64,
}

/// How an optimistic write went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Optimistic {
    /// Every write was done, at this revision (every key written has it as `mod_revision`).
    Committed { revision: i64 },
    /// Some key was changed by another: nothing was written. The compared keys as they are
    /// now (those that no longer exist are left out).
    Changed { now: Vec<Versioned> },
}

impl EtcdDb {
    /// Every key under `prefix` with its value and `mod_revision`, in key order, and the
    /// revision they were read at.
    pub async fn read_versioned(&self, prefix: &str) -> Result<(Vec<Versioned>, i64), StoreError> {
        let root_length = self.inner.root.len();
        let (kvs, revision) = self.range_of(prefix).await?;
        Ok((
            kvs.iter().map(|kv| versioned(root_length, kv)).collect(),
            revision,
        ))
    }

    /// Writes `puts` (`None` deletes the key) in one transaction, if every key of
    /// `unchanged` is still at the revision it was read at and, when `fence` is given, the
    /// fence's key is still the one its holder created. A refused fence is
    /// [`StoreError::Fenced`]: the writer no longer holds what it wrote for.
    pub async fn write_if_unchanged(
        &self,
        unchanged: &[Unchanged],
        puts: Vec<(String, Option<Vec<u8>>)>,
        fence: Option<&Fence>,
    ) -> Result<Optimistic, StoreError> {
        if unchanged.len() + usize::from(fence.is_some()) > MAX_TXN_OPS || puts.len() > MAX_TXN_OPS
        {
            return Err(StoreError::Etcd(format!(
                "an optimistic write of {} keys on {} compared ones is more than one etcd \
                 transaction takes ({MAX_TXN_OPS} of each)",
                puts.len(),
                unchanged.len()
            )));
        }
        let mut compares: Vec<Compare> = unchanged
            .iter()
            .map(|key| {
                let whole = self.whole(&key.key);
                if key.mod_revision == 0 {
                    Compare::version(whole, CompareOp::Equal, 0)
                } else {
                    Compare::mod_revision(whole, CompareOp::Equal, key.mod_revision)
                }
            })
            .collect();
        if let Some(fence) = fence {
            compares.push(Compare::create_revision(
                fence.key.clone(),
                CompareOp::Equal,
                fence.create_revision,
            ));
        }
        let writes: Vec<TxnOp> = puts
            .into_iter()
            .map(|(key, value)| match value {
                Some(value) => TxnOp::put(self.whole(&key), value, None),
                None => TxnOp::delete(self.whole(&key), None),
            })
            .collect();
        let reads: Vec<TxnOp> = unchanged
            .iter()
            .map(|key| TxnOp::get(self.whole(&key.key), None))
            .collect();
        let txn = Txn::new().when(compares).and_then(writes).or_else(reads);
        let members = self.inner.members.clone();
        let root_length = self.inner.root.len();
        let response = self
            .on_runtime(async move { send_txn(&members, txn).await })
            .await?;
        let revision = response.header().map_or(0, |header| header.revision());
        if response.succeeded() {
            return Ok(Optimistic::Committed { revision });
        }
        let now: Vec<Versioned> = response
            .op_responses()
            .into_iter()
            .filter_map(|op| match op {
                TxnOpResponse::Get(mut get) => get.take_kvs().into_iter().next(),
                _ => None,
            })
            .map(|kv| versioned(root_length, &kv))
            .collect();
        let all_as_read = unchanged.iter().all(|key| {
            let current = now
                .iter()
                .find(|read| read.key == key.key)
                .map_or(0, |read| read.mod_revision);
            current == key.mod_revision
        });
        if all_as_read && let Some(fence) = fence {
            return Err(StoreError::Fenced {
                key: fence.key.clone(),
            });
        }
        Ok(Optimistic::Changed { now })
    }
}

fn versioned(root_length: usize, kv: &etcd_client::KeyValue) -> Versioned {
    Versioned {
        key: relative_key(root_length, kv),
        value: kv.value().to_vec(),
        mod_revision: kv.mod_revision(),
    }
}
