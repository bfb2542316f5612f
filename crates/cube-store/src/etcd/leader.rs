//! Leader election on etcd: one key, `PREFIX/leader`, held under a lease.
//!
//! A campaign grants a lease of the leader TTL and creates the key under it, in one
//! transaction that succeeds only when the key is absent; whoever creates it leads, and the
//! revision it was created at is the [`Fence`] (of that one key) its writes are conditioned
//! on. The leader keeps its lease alive (every third of the TTL); the others wait, on an
//! etcd watch of the key, for it to go, and campaign again. A leader that dies stops
//! renewing: etcd deletes the key when the lease expires, within the TTL, and another leads.
//!
//! A leader learns it lost when a renewal says the lease is gone, or when it has not been
//! able to renew for a whole TTL (it may have been paused: it cannot know it still leads).
//! And whatever it believes, its writes are fenced: once another holds the key, they are
//! refused (`writer.rs`).

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, WatchOptions};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::EtcdDb;
use super::leased::Lease;
use super::members::Members;
use super::writer::Fence;
use crate::StoreError;

/// This process leads: the fence of its writes, and the lease the leader key is held
/// under. Dropping it ends the lease's renewal; [`Leadership::resign`] also gives the key
/// up at once.
pub struct Leadership {
    fence: Fence,
    lease: Lease,
}

impl Leadership {
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// Resolves once the leadership is lost (the lease expired, or could not be renewed
    /// for a whole TTL).
    pub async fn lost(&self) {
        self.lease.lost().await
    }

    /// Gives the leadership up now: the lease is revoked, the key goes, another leads
    /// without waiting for the TTL.
    pub async fn resign(self) {
        self.lease.revoke().await
    }
}

impl EtcdDb {
    /// The leader key.
    fn leader_key(&self) -> String {
        leader_key(&self.inner.root)
    }

    /// Who leads now: the value the leader wrote (its address), if anyone leads.
    pub async fn leader(&self) -> Result<Option<String>, StoreError> {
        let members = self.inner.members.clone();
        let key = self.leader_key();
        self.on_runtime(async move {
            let mut response = members
                .call(|mut client| {
                    let key = key.clone();
                    async move { client.get(key, None).await }
                })
                .await?;
            Ok(response
                .take_kvs()
                .into_iter()
                .next()
                .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
        })
        .await
    }

    /// Campaigns until this process leads (with `me`, its address, as the key's value), or
    /// until `shutdown` (then `None`).
    pub async fn campaign(
        &self,
        me: &str,
        ttl: Duration,
        shutdown: &CancellationToken,
    ) -> Result<Option<Leadership>, StoreError> {
        let members = self.inner.members.clone();
        let key = self.leader_key();
        let me = me.to_string();
        let shutdown = shutdown.clone();
        let won = self
            .on_runtime(async move { campaign(&members, &key, &me, ttl, &shutdown).await })
            .await?;
        let Some((fence, lease)) = won else {
            return Ok(None);
        };
        let lease = self.keep_lease(lease, ttl, "the leader lease").await;
        Ok(Some(Leadership { fence, lease }))
    }
}

/// The leader key under `root` (`PREFIX/`).
pub(super) fn leader_key(root: &str) -> String {
    format!("{root}leader")
}

/// Whole seconds of a TTL, at least one (etcd's unit).
pub(super) fn ttl_seconds(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX)
}

async fn campaign(
    members: &Members,
    key: &str,
    me: &str,
    ttl: Duration,
    shutdown: &CancellationToken,
) -> Result<Option<(Fence, i64)>, StoreError> {
    loop {
        if shutdown.is_cancelled() {
            return Ok(None);
        }
        let lease = members
            .call(|mut client| async move { client.lease_grant(ttl_seconds(ttl), None).await })
            .await?
            .id();
        let txn = Txn::new()
            .when([Compare::version(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key,
                me,
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(key, None)]);
        let response = super::leased::send_txn(members, txn).await?;
        let revision = response.header().map_or(0, |header| header.revision());
        if response.succeeded() {
            return Ok(Some((Fence::one(key, revision), lease)));
        }
        // Someone leads: give this lease back and wait for the key to go.
        let _ = members
            .call(|mut client| async move { client.lease_revoke(lease).await })
            .await;
        wait_until_gone(members, key, revision, ttl, shutdown).await;
    }
}

/// Returns once the key was deleted after `revision` (or the watch broke, or a TTL passed
/// without news: the caller looks again either way), or at shutdown.
async fn wait_until_gone(
    members: &Members,
    key: &str,
    revision: i64,
    ttl: Duration,
    shutdown: &CancellationToken,
) {
    let options = WatchOptions::new().with_start_revision(revision + 1);
    let opened = members
        .call(|mut client| {
            let options = options.clone();
            async move { client.watch(key, Some(options)).await }
        })
        .await;
    let Ok(mut stream) = opened else {
        // No member could open a watch: look again after a pause (a retry's backoff).
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = tokio::time::sleep(ttl / 2) => {}
        }
        return;
    };
    loop {
        let message = tokio::select! {
            _ = shutdown.cancelled() => return,
            message = tokio::time::timeout(ttl, stream.message()) => message,
        };
        match message {
            Ok(Ok(Some(response))) => {
                if response.canceled()
                    || response
                        .events()
                        .iter()
                        .any(|event| event.event_type() == EventType::Delete)
                {
                    return;
                }
            }
            // Broken, ended, or quiet for a TTL: look at the key again.
            _ => return,
        }
    }
}

/// Renews the lease every third of the TTL until `lost` is cancelled; cancels it when etcd
/// says the lease is gone or when no renewal succeeded for a whole TTL.
pub(super) async fn keep_alive(
    members: Arc<Members>,
    lease: i64,
    ttl: Duration,
    lost: CancellationToken,
    what: &'static str,
) {
    let period = (ttl / 3).max(Duration::from_millis(100));
    let mut renewed = Instant::now();
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = lost.cancelled() => return,
            _ = ticks.tick() => {}
        }
        // etcd decides: a renewal of a lease that expired (this process was paused, or cut
        // off, past the TTL) answers TTL 0, and one that is still alive renews it. Only when
        // etcd cannot be asked does the clock decide: no renewal for a whole TTL, and another
        // may lead by now.
        let renewal = members.call(|mut client| async move {
            let (mut keeper, mut stream) = client.lease_keep_alive(lease).await?;
            keeper.keep_alive().await?;
            stream.message().await
        });
        let left = ttl.saturating_sub(renewed.elapsed()).max(period);
        let answer = tokio::time::timeout(left, renewal).await;
        match answer {
            Ok(Ok(Some(response))) if response.ttl() > 0 => renewed = Instant::now(),
            Ok(Ok(_)) => {
                tracing::warn!(lease, "{what} expired: no longer held");
                lost.cancel();
                return;
            }
            Ok(Err(err)) => {
                tracing::warn!(lease, error = %err, "cannot renew {what}");
            }
            Err(_) => tracing::warn!(lease, "no answer to the renewal of {what}"),
        }
        if renewed.elapsed() >= ttl {
            tracing::warn!(
                lease,
                "{what} could not be renewed for a whole TTL: no longer held"
            );
            lost.cancel();
            return;
        }
    }
}
