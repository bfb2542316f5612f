//! The store's one watch of etcd: every change under the prefix, handed to the watchers of
//! its table.
//!
//! An etcd store keeps, per table, the same [`ChangeHub`] a redb file has (the recent
//! changes and the local watchers, bounded the same way), and one etcd watch of the whole
//! prefix feeds every hub. So a [`Store::watch`](crate::Store::watch) behaves alike on both:
//! a snapshot (`list_with_revision`) at revision R, then every change after R, in order.
//!
//! When the etcd watch breaks (its member died, lost its raft leader, the connection
//! stalled), it is opened again on another member from the revision after the last one
//! delivered: etcd keeps its history, so nothing is missed. If etcd has compacted that
//! history meanwhile, the changes in between are lost to the store: every local watch ends
//! with [`WatchError::Missed`](crate::WatchError::Missed) — a *lost sync* — and its
//! watcher lists the table again and watches from the list's revision.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{EventType, GetOptions, WatchOptions};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::members::Members;
use crate::commit::TableHub;
use crate::watch::{Change, ChangeHub, History};

/// Every table's hub, and how far the feed has delivered.
pub(crate) struct Hubs {
    /// Tables by name; a `std` mutex held to publish one etcd response or to add a hub.
    tables: Mutex<HashMap<String, TableHub>>,
    /// The revision up to which every change under the prefix is in the hubs; moved under
    /// `tables`' lock, so a hub added at this revision misses nothing after it.
    seen: watch::Sender<u64>,
    /// `PREFIX/`: the start of every key of the store.
    root: String,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Each critical section is a map access or a publication that cannot be left halfway.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Hubs {
    pub(crate) fn new(root: String, revision: u64) -> Hubs {
        Hubs {
            tables: Mutex::new(HashMap::new()),
            seen: watch::Sender::new(revision),
            root,
        }
    }

    pub(crate) fn seen(&self) -> watch::Receiver<u64> {
        self.seen.subscribe()
    }

    /// The hub of `table`, made now if it has none.
    pub(crate) fn hub(&self, table: &str, history: History) -> TableHub {
        let mut tables = lock(&self.tables);
        let hub = tables
            .entry(table.to_string())
            .or_insert_with(|| {
                Arc::new(Mutex::new(ChangeHub::of_bytes(
                    *self.seen.borrow(),
                    history,
                )))
            })
            .clone();
        lock(&hub).keep_history(history);
        hub
    }

    /// Hands one etcd watch response's events to their tables' hubs.
    fn publish(&self, events: &[etcd_client::Event]) {
        let tables = lock(&self.tables);
        let mut reached = *self.seen.borrow();
        for event in events {
            let Some(kv) = event.kv() else { continue };
            let revision = u64::try_from(kv.mod_revision()).unwrap_or(0);
            reached = reached.max(revision);
            let Some((table, key)) = std::str::from_utf8(kv.key())
                .ok()
                .and_then(|key| key.strip_prefix(&self.root))
                .and_then(|rest| rest.split_once('/'))
            else {
                continue;
            };
            let Some(hub) = tables.get(table) else {
                continue;
            };
            let change = match event.event_type() {
                EventType::Put => Change::Put {
                    key: key.to_string(),
                    value: Arc::from(kv.value()),
                    revision,
                },
                EventType::Delete => Change::Delete {
                    key: key.to_string(),
                    revision,
                },
            };
            lock(hub).publish(change);
        }
        self.seen.send_replace(reached);
    }

    /// Everything up to `revision` is known to have been delivered (a progress notice).
    fn reached(&self, revision: u64) {
        let _tables = lock(&self.tables);
        self.seen.send_if_modified(|seen| {
            let moved = revision > *seen;
            *seen = (*seen).max(revision);
            moved
        });
    }

    /// The changes between the last delivered and `revision` are lost: every watch ends
    /// with a lost sync, and the feed goes on from `revision`.
    fn lose_sync(&self, revision: u64) {
        let tables = lock(&self.tables);
        for hub in tables.values() {
            lock(hub).lose_sync(revision);
        }
        self.seen.send_replace(revision);
    }

    /// Every watch ends: the store is closing.
    pub(crate) fn close(&self) {
        for hub in lock(&self.tables).values() {
            lock(hub).close();
        }
    }
}

/// Follows etcd's changes under the prefix into `hubs` until `shutdown`.
pub(crate) async fn run(members: Arc<Members>, hubs: Arc<Hubs>, shutdown: CancellationToken) {
    let mut pause = Duration::from_millis(50);
    while !shutdown.is_cancelled() {
        let from = *hubs.seen.borrow() + 1;
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(i64::try_from(from).unwrap_or(i64::MAX))
            .with_progress_notify();
        let root = hubs.root.clone();
        let opened = tokio::select! {
            _ = shutdown.cancelled() => return,
            opened = members.call_at(|mut client| {
                let (root, options) = (root.clone(), options.clone());
                async move { client.watch(root, Some(options)).await }
            }) => opened,
        };
        let (mut stream, member) = match opened {
            Ok(opened) => opened,
            Err(err) => {
                tracing::warn!(error = %err, "cannot watch etcd; trying again");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    // A retry's backoff: no member could open a watch.
                    _ = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        loop {
            let message = tokio::select! {
                _ = shutdown.cancelled() => return,
                message = stream.message() => message,
            };
            let response = match message {
                Ok(Some(response)) => response,
                Ok(None) => {
                    tracing::info!("the etcd watch ended; opening it again on another member");
                    members.skip(member);
                    break;
                }
                Err(err) => {
                    tracing::info!(error = %err, "the etcd watch broke; opening it again on another member");
                    members.skip(member);
                    break;
                }
            };
            if response.compact_revision() > 0 {
                let compacted = u64::try_from(response.compact_revision()).unwrap_or(0);
                let current = current_revision(&members, &hubs.root)
                    .await
                    .unwrap_or(compacted);
                tracing::warn!(
                    compacted,
                    "etcd compacted changes the store had not seen: every watcher lists again"
                );
                hubs.lose_sync(current.max(compacted));
                break;
            }
            if response.canceled() {
                tracing::info!(
                    reason = response.cancel_reason(),
                    "etcd cancelled the watch; opening it again"
                );
                members.skip(member);
                break;
            }
            pause = Duration::from_millis(50);
            if response.events().is_empty() {
                if !response.created()
                    && let Some(header) = response.header()
                {
                    hubs.reached(u64::try_from(header.revision()).unwrap_or(0));
                }
            } else {
                hubs.publish(response.events());
            }
        }
    }
}

/// The cluster's revision now.
pub(crate) async fn current_revision(
    members: &Members,
    root: &str,
) -> Result<u64, crate::StoreError> {
    let response = members
        .call(|mut client| {
            let root = root.to_string();
            async move {
                client
                    .get(
                        root,
                        Some(GetOptions::new().with_prefix().with_count_only()),
                    )
                    .await
            }
        })
        .await?;
    Ok(response
        .header()
        .map_or(0, |header| u64::try_from(header.revision()).unwrap_or(0)))
}
