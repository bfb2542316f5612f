//! Registration and heartbeats: a worker started with `--manager` tells the manager who it is,
//! where its API is and what it offers, then repeats it with fresh stats every interval.
//!
//! Several managers may be given (`--manager a:5555,b:5555,c:5555`, managers sharing one
//! etcd cluster): a beat goes to the one that answered last, and to the next in turn when it
//! cannot be reached or answers 503 (it is stopping, or cannot reach the leader), so a worker
//! whose manager died beats to another at its next beat.
//!
//! **Rate.** The manager's answer says the shortest interval it wants between beats
//! (`X-Cube-Heartbeat-Interval`: the number of nodes / 50 per second, see
//! `cube_manager::heartbeat_floor`); the worker beats every `max(--heartbeat-interval, that)`.
//! So all nodes together send at most 50 beats a second once there are more than
//! `50 × --heartbeat-interval` nodes, and one every `--heartbeat-interval` each below that.
//! A beat that no manager took (a leader is being elected) is tried again after an eighth of
//! the interval (at least 250 ms).

use std::sync::Arc;
use std::time::Duration;

use cube_api::{ApiClient, ClientError};
use cube_runtime::Runtime;
use cube_types::Node;
use tokio_util::sync::CancellationToken;

use crate::worker::Worker;

/// Where to report and how often.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    /// Every manager to try, in order; the one that answered last is asked first.
    pub managers: Vec<ApiClient>,
    pub interval: Duration,
    /// When the worker joined with a token: where the worker-command token the manager
    /// answers with is kept, for the API's gate (`gate.rs`).
    pub gate: Option<Arc<crate::gate::CommandGate>>,
}

/// Whether a failed beat should be tried at once on the next manager.
fn try_another(err: &ClientError) -> bool {
    matches!(err, ClientError::Unreachable { .. })
        || err.status().map(|status| status.as_u16()) == Some(503)
}

/// How soon a beat that no manager took is tried again: an eighth of the interval, at least
/// 250 ms, at most the interval.
fn retry_after(interval: Duration) -> Duration {
    (interval / 8).max(Duration::from_millis(250)).min(interval)
}

impl Heartbeat {
    /// Sends a heartbeat (`PUT /nodes/{name}` with a [`cube_types::NodeReport`]) every
    /// interval until `shutdown`. The first one, sent at once, registers the worker. A
    /// manager that cannot be reached is logged once per outage, not once per beat, and
    /// tried again at the next beat.
    pub async fn run<R: Runtime>(self, worker: Arc<Worker<R>>, shutdown: CancellationToken) {
        let path = format!("/nodes/{}", worker.name());
        worker.set_managers(self.managers.clone());
        let mut current = 0;
        let mut interval = self.interval;
        let mut reachable = None;
        let mut next_beat = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep_until(next_beat) => {}
            }
            next_beat = tokio::time::Instant::now() + interval;
            let report = match worker.node_report() {
                Ok(mut report) => {
                    match worker.engine_volumes().await {
                        Ok(volumes) => report.volumes = volumes,
                        Err(err) => {
                            tracing::debug!(error = %err, "cannot list this node's volumes for the heartbeat");
                        }
                    }
                    report
                }
                Err(err) => {
                    tracing::warn!(error = %err, "cannot read this node's stats for the heartbeat");
                    continue;
                }
            };
            // Each manager at most once per beat, starting with the last that answered.
            let mut sent = Err(None);
            for offset in 0..self.managers.len() {
                let index = (current + offset) % self.managers.len();
                let manager = &self.managers[index];
                let answer = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    answer = manager.put_heartbeat::<_, Node>(&path, &report) => answer,
                };
                match answer {
                    Ok((node, floor, worker_token)) => {
                        match (&self.gate, &worker_token) {
                            (Some(gate), Some(token)) => gate.learn(token),
                            (Some(_), None) if reachable != Some(true) => tracing::error!(
                                manager = %manager.base(),
                                "the manager took this worker's token but gave no \
                                 worker-command token: it does not run with --acl; this \
                                 worker, joined with --token, refuses every request but \
                                 GET /health (join without --token, or start the manager \
                                 with --acl)"
                            ),
                            _ => {}
                        }
                        if index != current || reachable != Some(true) {
                            tracing::info!(manager = %manager.base(), "registered with the manager");
                            if let Some(warning) = &node.version_warning {
                                tracing::warn!(manager = %manager.base(), "{warning}");
                            }
                        }
                        current = index;
                        sent = Ok(floor);
                        break;
                    }
                    Err(err) => {
                        let again = try_another(&err);
                        sent = Err(Some(err));
                        if !again {
                            break;
                        }
                    }
                }
            }
            match sent {
                Ok(floor) => {
                    reachable = Some(true);
                    let wanted = floor.map_or(self.interval, |floor| floor.max(self.interval));
                    if wanted != interval {
                        tracing::info!(interval = ?wanted, "heartbeat interval set by the manager");
                        next_beat = next_beat - interval + wanted;
                        interval = wanted;
                    }
                }
                Err(err) => {
                    if reachable == Some(false) {
                        tracing::debug!(error = ?err, "heartbeat failed");
                    } else {
                        let error =
                            err.map_or_else(|| "no manager given".to_string(), |e| e.to_string());
                        tracing::warn!(%error, "cannot reach a manager; retrying");
                        reachable = Some(false);
                    }
                    // No manager took the beat (they are electing a leader, or down): the
                    // next try comes sooner, so that a new leader learns of this node soon
                    // after it leads, yet no faster than 4 a second and an eighth of the
                    // interval the manager asked for.
                    next_beat = tokio::time::Instant::now() + retry_after(interval);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_beat_no_manager_took_is_tried_again_sooner_but_not_in_a_hurry() {
        assert_eq!(
            retry_after(Duration::from_secs(2)),
            Duration::from_millis(250)
        );
        assert_eq!(
            retry_after(Duration::from_secs(20)),
            Duration::from_millis(2500)
        );
        assert_eq!(
            retry_after(Duration::from_millis(100)),
            Duration::from_millis(100)
        );
    }
}
