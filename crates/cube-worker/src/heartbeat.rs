//! Registration and heartbeats: a worker started with `--manager` tells the manager who it is,
//! where its API is and what it offers, then repeats it with fresh stats every interval.

use std::sync::Arc;
use std::time::Duration;

use cube_api::ApiClient;
use cube_runtime::Runtime;
use cube_types::Node;
use tokio_util::sync::CancellationToken;

use crate::worker::Worker;

/// Where to report and how often.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    pub manager: ApiClient,
    pub interval: Duration,
}

impl Heartbeat {
    /// Sends a heartbeat (`PUT /nodes/{name}` with a [`cube_types::NodeReport`]) every
    /// interval until `shutdown`. The first one, sent at once, registers the worker. A
    /// manager that cannot be reached is logged once per outage, not once per beat, and
    /// tried again at the next beat.
    pub async fn run<R: Runtime>(self, worker: Arc<Worker<R>>, shutdown: CancellationToken) {
        let path = format!("/nodes/{}", worker.name());
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reachable = None;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticks.tick() => {}
            }
            let report = match worker.node_report() {
                Ok(report) => report,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot read this node's stats for the heartbeat");
                    continue;
                }
            };
            let sent = tokio::select! {
                _ = shutdown.cancelled() => return,
                sent = self.manager.put::<_, Node>(&path, &report) => sent,
            };
            match (sent, reachable) {
                (Ok(_), Some(true)) => {}
                (Ok(node), _) => {
                    tracing::info!(manager = %self.manager.base(), "registered with the manager");
                    if let Some(warning) = &node.version_warning {
                        tracing::warn!(manager = %self.manager.base(), "{warning}");
                    }
                    reachable = Some(true);
                }
                (Err(err), Some(false)) => tracing::debug!(error = %err, "heartbeat failed"),
                (Err(err), _) => {
                    tracing::warn!(error = %err, "cannot reach the manager; retrying every heartbeat");
                    reachable = Some(false);
                }
            }
        }
    }
}
