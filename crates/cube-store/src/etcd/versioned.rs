//! Optimistic writes of several keys at once: read keys with their `mod_revision`, then
//! write a set of keys only if none of the read ones changed since (Omega's shared state,
//! the placement of several managers at once: `cube_types::claims`). A transaction that
//! loses the race answers with the keys as they are now, read in the same round trip, so
//! the writer plans again at once on the fresher values.
//!
//! Keys here are relative to the store's prefix, as table names are: `tasks/ID` is a task
//! record of the `tasks` table, and its watchers see the write as any other.

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};

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

/// A prefix under which no key may have been written after `revision` for a write to go
/// through: one comparison however many keys it holds. A key created or changed since
/// refuses the write; a key deleted since does not (etcd compares the keys that exist).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quiet {
    /// The prefix without the store's prefix, ending in `/`.
    pub prefix: String,
    /// The revision up to which the writer knows every key under it.
    pub revision: i64,
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
    /// revision they were read at: read as a table is (`read_table`: the keys, then the
    /// values in pages at that revision). One answer of every value was refused past gRPC's
    /// 4 MiB: the claims of 2,000 nodes by 16 shards, 32,000 keys, grew past it at 150,000
    /// tasks, and a manager whose watch of them ended could never read them again (its
    /// placement stopped).
    pub async fn read_versioned(&self, prefix: &str) -> Result<(Vec<Versioned>, i64), StoreError> {
        let members = self.inner.members.clone();
        let start = self.whole(prefix);
        let (entries, revision) = self
            .on_runtime(async move { super::read_table(&members, &start).await })
            .await?;
        Ok((
            entries
                .into_iter()
                .map(|(key, value, mod_revision)| Versioned {
                    key: format!("{prefix}{key}"),
                    value,
                    mod_revision: i64::try_from(mod_revision).unwrap_or(i64::MAX),
                })
                .collect(),
            i64::try_from(revision).unwrap_or(i64::MAX),
        ))
    }

    /// Writes `puts` (`None` deletes the key) in one transaction, if every key of
    /// `unchanged` is still at the revision it was read at and, when `fence` is given, every
    /// key of the fence is still the one its holder created. A refused fence is
    /// [`StoreError::Fenced`], naming a fenced key that moved, whatever the compared keys
    /// did: the writer no longer holds what it wrote for, and planning again would not help.
    /// (Unlike the writes of the tables, this does not cancel the token of
    /// [`EtcdDb::set_fence`]: the fence is the caller's, which may be another.)
    pub async fn write_if_unchanged(
        &self,
        unchanged: &[Unchanged],
        puts: Vec<(String, Option<Vec<u8>>)>,
        fence: Option<&Fence>,
    ) -> Result<Optimistic, StoreError> {
        // Each fenced key is one comparison and one read of the failure branch, as each
        // compared key is.
        let fenced = fence.map_or(0, |fence| fence.keys().len());
        if unchanged.len() + fenced > MAX_TXN_OPS || puts.len() > MAX_TXN_OPS {
            return Err(StoreError::Etcd(format!(
                "an optimistic write of {} keys on {} compared ones and {fenced} fenced ones is \
                 more than one etcd transaction takes ({MAX_TXN_OPS} of each, the compared and \
                 fenced together)",
                puts.len(),
                unchanged.len()
            )));
        }
        let compares: Vec<Compare> = unchanged
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
        // The compared keys, then the fenced ones: the answer is split at `unchanged.len()`.
        let reads: Vec<TxnOp> = unchanged
            .iter()
            .map(|key| TxnOp::get(self.whole(&key.key), None))
            .collect();
        self.optimistic(compares, reads, puts, fence).await
    }

    /// Writes `puts` (`None` deletes the key) in one transaction, if no key under any prefix
    /// of `quiet` changed after the revision given with it and, when `fence` is given, every
    /// key of the fence is still the one its holder created. Refused, it answers every key
    /// under those prefixes as they are now (and a refused fence as
    /// [`EtcdDb::write_if_unchanged`] does).
    pub async fn write_if_quiet(
        &self,
        quiet: &[Quiet],
        puts: Vec<(String, Option<Vec<u8>>)>,
        fence: Option<&Fence>,
    ) -> Result<Optimistic, StoreError> {
        let fenced = fence.map_or(0, |fence| fence.keys().len());
        if quiet.len() + fenced > MAX_TXN_OPS || puts.len() > MAX_TXN_OPS {
            return Err(StoreError::Etcd(format!(
                "an optimistic write of {} keys under {} quiet prefixes and {fenced} fenced keys \
                 is more than one etcd transaction takes ({MAX_TXN_OPS} of each, the prefixes \
                 and fenced keys together)",
                puts.len(),
                quiet.len()
            )));
        }
        let compares: Vec<Compare> = quiet
            .iter()
            .map(|quiet| {
                let whole = self.whole(&quiet.prefix);
                let end = super::prefix_end(&whole);
                Compare::mod_revision(whole, CompareOp::Less, quiet.revision.saturating_add(1))
                    .with_range(end)
            })
            .collect();
        let reads: Vec<TxnOp> = quiet
            .iter()
            .map(|quiet| {
                TxnOp::get(
                    self.whole(&quiet.prefix),
                    Some(GetOptions::new().with_prefix()),
                )
            })
            .collect();
        self.optimistic(compares, reads, puts, fence).await
    }

    /// One optimistic transaction: `puts` if every comparison (then the fence's) holds; else
    /// the `reads` (one per comparison), then the fence's keys, answered as
    /// [`Optimistic::Changed`] or a refused fence.
    async fn optimistic(
        &self,
        mut compares: Vec<Compare>,
        mut reads: Vec<TxnOp>,
        puts: Vec<(String, Option<Vec<u8>>)>,
        fence: Option<&Fence>,
    ) -> Result<Optimistic, StoreError> {
        let compared = reads.len();
        compares.extend(fence.into_iter().flat_map(Fence::compares));
        reads.extend(fence.into_iter().flat_map(Fence::reads));
        let writes: Vec<TxnOp> = puts
            .into_iter()
            .map(|(key, value)| match value {
                Some(value) => TxnOp::put(self.whole(&key), value, None),
                None => TxnOp::delete(self.whole(&key), None),
            })
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
        let read: Vec<Vec<etcd_client::KeyValue>> = response
            .op_responses()
            .into_iter()
            .map(|op| match op {
                TxnOpResponse::Get(mut get) => get.take_kvs(),
                _ => Vec::new(),
            })
            .collect();
        refused(read, compared, fence, root_length)
    }
}

/// The answer of a refused optimistic write, from the reads of its failure branch: the
/// first `compared` of them are the compared keys (or prefixes), the rest the fence's.
fn refused(
    mut read: Vec<Vec<etcd_client::KeyValue>>,
    compared: usize,
    fence: Option<&Fence>,
    root_length: usize,
) -> Result<Optimistic, StoreError> {
    let fence_read = read.split_off(compared.min(read.len()));
    if let Some(fence) = fence {
        let fence_read: Vec<Option<&etcd_client::KeyValue>> =
            fence_read.iter().map(|kvs| kvs.first()).collect();
        if let Some(moved) = fence.moved(&fence_read) {
            return Err(StoreError::Fenced {
                key: moved.key.clone(),
            });
        }
    }
    let now: Vec<Versioned> = read
        .iter()
        .flatten()
        .map(|kv| versioned(root_length, kv))
        .collect();
    Ok(Optimistic::Changed { now })
}

fn versioned(root_length: usize, kv: &etcd_client::KeyValue) -> Versioned {
    Versioned {
        key: relative_key(root_length, kv),
        value: kv.value().to_vec(),
        mod_revision: kv.mod_revision(),
    }
}
