//! Keys held under a lease, for what several managers divide among themselves beside the
//! tables (the shard ring, in `cube`'s `ring.rs`): a lease kept alive while its process
//! lives, keys created under it only where absent, deleted only by their holder, and a
//! wait for the next change under a prefix. A process that dies stops renewing; etcd deletes
//! its keys when the lease expires, and the others, waiting on a watch, see them go.
//!
//! Keys here are relative to the store's prefix, as table names are.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use tokio_util::sync::CancellationToken;

use super::members::Members;
use super::{EtcdDb, prefix_end};
use crate::StoreError;

/// A lease of this process's, renewed every third of its TTL until it is dropped or
/// revoked, or until etcd says it expired (or it could not be renewed for a whole TTL).
pub struct Lease {
    id: i64,
    lost: CancellationToken,
    db: EtcdDb,
}

/// One key read under a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeasedKey {
    /// The key without the store's prefix.
    pub key: String,
    pub value: Vec<u8>,
    /// The revision the key was created at: the fence of whoever created it.
    pub create_revision: i64,
    /// The lease it is held under (0: none).
    pub lease: i64,
}

impl Lease {
    pub fn id(&self) -> i64 {
        self.id
    }

    /// Resolves once the lease is lost: its keys are gone, or may be by now.
    pub async fn lost(&self) {
        self.lost.cancelled().await
    }

    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Gives the lease up now: its keys go at once instead of after the TTL.
    pub async fn revoke(self) {
        self.lost.cancel();
        let members = self.db.inner.members.clone();
        let id = self.id;
        let _ = self
            .db
            .on_runtime(async move {
                members
                    .call(|mut client| async move { client.lease_revoke(id).await })
                    .await
            })
            .await;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.lost.cancel();
    }
}

impl EtcdDb {
    /// The whole etcd key of a key relative to the prefix.
    pub(super) fn whole(&self, key: &str) -> String {
        format!("{}{key}", self.inner.root)
    }

    /// Grants a lease of `ttl` (whole seconds, at least one) and keeps it alive; `what` names
    /// it in the warnings of its renewal.
    pub async fn grant_lease(
        &self,
        ttl: Duration,
        what: &'static str,
    ) -> Result<Lease, StoreError> {
        let members = self.inner.members.clone();
        let id = self
            .on_runtime(async move {
                Ok(members
                    .call(|mut client| async move {
                        client
                            .lease_grant(super::leader::ttl_seconds(ttl), None)
                            .await
                    })
                    .await?
                    .id())
            })
            .await?;
        Ok(self.keep_lease(id, ttl, what).await)
    }

    /// Keeps the granted lease `id` alive, every third of `ttl`, until the [`Lease`] is
    /// dropped or revoked, or etcd says it expired.
    pub(super) async fn keep_lease(&self, id: i64, ttl: Duration, what: &'static str) -> Lease {
        let lost = CancellationToken::new();
        let members = self.inner.members.clone();
        let keeping = lost.clone();
        let _ = self
            .on_runtime(async move {
                tokio::spawn(super::leader::keep_alive(members, id, ttl, keeping, what));
                Ok(())
            })
            .await;
        Lease {
            id,
            lost,
            db: self.clone(),
        }
    }

    /// Every key under `prefix`, in key order, and the revision they were read at.
    pub async fn read_prefix(&self, prefix: &str) -> Result<(Vec<LeasedKey>, i64), StoreError> {
        let root_length = self.inner.root.len();
        let (kvs, revision) = self.range_of(prefix).await?;
        let keys = kvs
            .into_iter()
            .map(|kv| LeasedKey {
                key: relative_key(root_length, &kv),
                value: kv.value().to_vec(),
                create_revision: kv.create_revision(),
                lease: kv.lease(),
            })
            .collect();
        Ok((keys, revision))
    }

    /// Every etcd key-value under `prefix` (relative to the store's prefix), in key order,
    /// and the revision they were read at.
    pub(super) async fn range_of(
        &self,
        prefix: &str,
    ) -> Result<(Vec<etcd_client::KeyValue>, i64), StoreError> {
        let members = self.inner.members.clone();
        let start = self.whole(prefix);
        self.on_runtime(async move {
            let end = prefix_end(&start);
            let mut response = members
                .call(|mut client| {
                    let (start, end) = (start.clone(), end.clone());
                    async move {
                        client
                            .get(start, Some(GetOptions::new().with_range(end)))
                            .await
                    }
                })
                .await?;
            let revision = response.header().map_or(0, |header| header.revision());
            Ok((response.take_kvs(), revision))
        })
        .await
    }

    /// Creates `key` with `value` under `lease` (none: 0) unless it exists. The revision it
    /// was created at, or `None` when it was there already.
    pub async fn create_if_absent(
        &self,
        key: &str,
        value: Vec<u8>,
        lease: i64,
    ) -> Result<Option<i64>, StoreError> {
        self.create_keys(vec![(key.to_string(), value)], lease, None)
            .await
    }

    /// Creates every key of `entries` with its value under `lease`, all or none: none when
    /// one exists **or any key under `prefix` (relative to the store's prefix) was written
    /// after `revision`**. Keys chosen from what `prefix` held at `revision` are created only
    /// if that is still what it holds (keys deleted since are not seen: a deletion frees
    /// room, it takes none). The revision they were created at, or `None` when they were not.
    pub async fn create_all_if_absent_since(
        &self,
        entries: Vec<(String, Vec<u8>)>,
        lease: i64,
        prefix: &str,
        revision: i64,
    ) -> Result<Option<i64>, StoreError> {
        self.create_keys(entries, lease, Some((prefix, revision)))
            .await
    }

    /// Creates every key of `entries` under `lease` in one transaction, only if none exists
    /// and, given `(prefix, revision)`, no key under `prefix` was written after `revision`.
    async fn create_keys(
        &self,
        entries: Vec<(String, Vec<u8>)>,
        lease: i64,
        unchanged_since: Option<(&str, i64)>,
    ) -> Result<Option<i64>, StoreError> {
        let members = self.inner.members.clone();
        let entries: Vec<(String, Vec<u8>)> = entries
            .into_iter()
            .map(|(key, value)| (self.whole(&key), value))
            .collect();
        let unchanged = unchanged_since.map(|(prefix, revision)| (self.whole(prefix), revision));
        self.on_runtime(async move {
            let options = (lease != 0).then(|| PutOptions::new().with_lease(lease));
            let mut compares = Vec::with_capacity(entries.len() + 1);
            if let Some((start, revision)) = unchanged {
                let end = prefix_end(&start);
                // Every key of the range: an empty range compares as unwritten.
                compares.push(
                    Compare::mod_revision(start, CompareOp::Less, revision + 1).with_range(end),
                );
            }
            let mut puts = Vec::with_capacity(entries.len());
            for (key, value) in entries {
                compares.push(Compare::version(key.clone(), CompareOp::Equal, 0));
                puts.push(TxnOp::put(key, value, options.clone()));
            }
            let txn = Txn::new().when(compares).and_then(puts);
            let response = send_txn(&members, txn).await?;
            let revision = response.header().map_or(0, |header| header.revision());
            Ok(response.succeeded().then_some(revision))
        })
        .await
    }

    /// The value of `key`, creating it with `value` (no lease) when absent: what the first
    /// to ask set.
    pub async fn get_or_create(&self, key: &str, value: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        let members = self.inner.members.clone();
        let key = self.whole(key);
        self.on_runtime(async move {
            let txn = Txn::new()
                .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key.clone(), value.clone(), None)])
                .or_else([TxnOp::get(key.clone(), None)]);
            let response = send_txn(&members, txn).await?;
            if response.succeeded() {
                return Ok(value);
            }
            let existing = response.op_responses().into_iter().find_map(|op| match op {
                TxnOpResponse::Get(mut get) => get.take_kvs().into_iter().next(),
                _ => None,
            });
            existing
                .map(|kv| kv.value().to_vec())
                .ok_or_else(|| StoreError::Etcd(format!("{key} was neither absent nor readable")))
        })
        .await
    }

    /// Deletes `key` if it is held under `lease`; whether it was.
    pub async fn delete_if_held(&self, key: &str, lease: i64) -> Result<bool, StoreError> {
        let members = self.inner.members.clone();
        let key = self.whole(key);
        self.on_runtime(async move {
            let txn = Txn::new()
                .when([Compare::lease(key.clone(), CompareOp::Equal, lease)])
                .and_then([TxnOp::delete(key.clone(), None)]);
            let response = send_txn(&members, txn).await?;
            Ok(response.succeeded())
        })
        .await
    }

    /// Returns once a key under `prefix` changed after `revision`, after `timeout` without a
    /// change (or with the watch broken: the caller reads again either way), or at
    /// `shutdown`.
    pub async fn wait_for_change(
        &self,
        prefix: &str,
        revision: i64,
        timeout: Duration,
        shutdown: &CancellationToken,
    ) {
        let members: Arc<Members> = self.inner.members.clone();
        let start = self.whole(prefix);
        let watching = self.on_runtime(async move {
            let options = WatchOptions::new()
                .with_range(prefix_end(&start))
                .with_start_revision(revision + 1);
            let opened = members
                .call(|mut client| {
                    let (start, options) = (start.clone(), options.clone());
                    async move { client.watch(start, Some(options)).await }
                })
                .await;
            let Ok(mut stream) = opened else {
                // No member could open a watch: the caller reads again after the timeout.
                tokio::time::sleep(timeout).await;
                return Ok(());
            };
            loop {
                match tokio::time::timeout(timeout, stream.message()).await {
                    Ok(Ok(Some(response))) if response.events().is_empty() => {
                        if response.canceled() {
                            return Ok(());
                        }
                    }
                    // A change, a broken or ended watch, or a quiet timeout.
                    _ => return Ok(()),
                }
            }
        });
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = watching => {}
        }
    }
}

/// A key read from etcd without the store's prefix (`root_length` bytes).
pub(super) fn relative_key(root_length: usize, kv: &etcd_client::KeyValue) -> String {
    String::from_utf8_lossy(&kv.key()[root_length.min(kv.key().len())..]).into_owned()
}

/// Sends one transaction to the members (again to the next while one cannot answer).
pub(super) async fn send_txn(
    members: &Members,
    txn: Txn,
) -> Result<etcd_client::TxnResponse, StoreError> {
    members
        .call(|mut client| {
            let txn = txn.clone();
            async move { client.txn(txn).await }
        })
        .await
}
