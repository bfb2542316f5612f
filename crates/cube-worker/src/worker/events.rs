//! Docker's events for this node's containers: an event about a task's container (its
//! process ended, it was removed, its health changed) hands the task's ID to the reconcile,
//! so that an exit is recorded within milliseconds. Every (re)connection of the stream, and
//! every pod monitor interval, is followed by a resync (`resync.rs`), which catches whatever
//! an event missed.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use cube_runtime::Runtime;
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::{Worker, launch};

/// How long to wait before reconnecting to Docker's event stream after it ended.
const EVENTS_RECONNECT_DELAY: Duration = Duration::from_secs(1);

/// How far back a (re)connected event stream replays, so that an exit during the resync that
/// follows a connection is not missed.
const EVENTS_REPLAY_SECS: i64 = 5;

impl<R: Runtime> Worker<R> {
    /// Watches Docker's events for this node's containers until `shutdown`. Every
    /// (re)connection is followed by a resync, and so is every pod monitor interval
    /// (`PodSettings::monitor_interval`).
    pub async fn run_event_watcher(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            let since = Utc::now().timestamp() - EVENTS_REPLAY_SECS;
            let mut events = self.runtime.events_since(&self.config.name, since);
            if let Err(err) = self.resync().await {
                tracing::warn!(error = %err, "resync with Docker failed");
            }
            // The pod monitor's safety net: every task compared with its containers at this
            // interval, whether or not an event said anything.
            let mut resync = tokio::time::interval(self.config.pods.monitor_interval);
            resync.tick().await; // The first tick is immediate; the resync just ran.
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = resync.tick() => {
                        if let Err(err) = self.resync().await {
                            tracing::warn!(error = %err, "resync with Docker failed");
                        }
                    }
                    event = events.next() => match event {
                        Some(Ok(event)) => {
                            if let Some(id) = event.task_id().filter(|_| launch::wakes_the_monitor(&event)) {
                                self.runner.push(id);
                            }
                        }
                        Some(Err(err)) => {
                            tracing::warn!(error = %err, "Docker event stream failed; reconnecting");
                            break;
                        }
                        None => {
                            tracing::warn!("Docker event stream ended; reconnecting");
                            break;
                        }
                    },
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(EVENTS_RECONNECT_DELAY) => {}
            }
        }
    }
}
