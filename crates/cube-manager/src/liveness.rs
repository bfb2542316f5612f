//! Node liveness and the resync: a node silent for longer than the heartbeat grace is
//! `Down` and its tasks `Lost` (the task controller replaces them by their restart policy);
//! every resync interval every unfinished task and every job is looked at again, in case an
//! event was missed (anti-entropy; a look that finds nothing to do writes nothing).

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use cube_types::State;
use uuid::Uuid;

use crate::manager::Manager;

use crate::cluster::{Writes, lock};

impl Manager {
    /// Watches the nodes' reports: a node silent for longer than the grace period is `Down`,
    /// and its unfinished tasks are `Lost`, to be replaced according to their restart policy.
    pub(crate) async fn run_liveness(self: Arc<Self>) {
        let tick = (self.cluster.heartbeat_grace() / 10)
            .clamp(Duration::from_millis(50), Duration::from_secs(1));
        let mut ticks = tokio::time::interval(tick);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = ticks.tick() => {}
            }
            let mut writes = Writes::default();
            let lost = self.mark_silent_nodes_down(Instant::now(), &mut writes);
            let _ = self.cluster.settle(writes).await;
            for id in lost {
                self.cluster.wakes.tasks.push(id);
            }
            self.finish_drains().await;
        }
    }

    /// Marks the nodes that stopped reporting `Down` (once each) and their tasks `Lost`;
    /// returns those tasks.
    fn mark_silent_nodes_down(&self, now: Instant, writes: &mut Writes) -> Vec<Uuid> {
        let grace = self.cluster.heartbeat_grace();
        let mut state = lock(&self.cluster.state);
        let newly_down = state.nodes.mark_down(now, grace);
        let mut lost = Vec::new();
        for name in newly_down {
            tracing::warn!(node = %name, ?grace, "node stopped reporting: Down; its tasks are Lost");
            self.cluster.publish_node(&state, &name, "NodeDown");
            let placed_here: Vec<Uuid> = state
                .cache
                .load(&name)
                .map(|load| load.tasks.iter().copied().collect())
                .unwrap_or_default();
            for id in placed_here {
                let Some(task) = state.cache.get(&id) else {
                    continue;
                };
                let mut task = task.clone();
                let message = format!("node {name} sent nothing for longer than {grace:?}");
                // A task already lost (or ended) is left as it is.
                if task.end(State::Lost, Some(message), Utc::now()).is_err() {
                    continue;
                }
                if let Err(err) = self.cluster.save(&mut state, writes, task) {
                    tracing::error!(task = %id, error = %err, "cannot store a lost task");
                    continue;
                }
                lost.push(id);
            }
        }
        lost
    }

    pub(crate) async fn run_resync(self: Arc<Self>) {
        let mut ticks = tokio::time::interval(self.config.resync_interval);
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                // The first tick is at once: a restarted manager resumes every task.
                _ = ticks.tick() => {
                    self.push_unfinished();
                    self.mark_all_jobs_dirty();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use cube_types::job::{Job, JobRecord};
    use tokio_util::sync::CancellationToken;

    use crate::manager::{Manager, test_config};

    use crate::cluster::ManagerStores;

    /// A service job stored before the manager opens, as a new leader finds it in etcd.
    fn stored_job() -> JobRecord {
        let job: Job = serde_json::from_value(serde_json::json!({
            "Name": "web", "Type": "service",
            "Groups": [{"Name": "api", "Count": 2, "Task": {"Image": "cube-sample:latest"}}]
        }))
        .expect("a job");
        JobRecord {
            job,
            version: 1,
            submit_time: None,
            stopped: false,
            promoted: false,
            revert_of: None,
        }
    }

    #[tokio::test]
    async fn a_manager_that_starts_looks_at_every_stored_job_once_its_jobs_are_listed() {
        // A new leader (or a restarted manager) must look at every job at once, not at its
        // next resync, whatever order its loops start in. The jobs watcher lists the table
        // in its first step (the stores' listing does not wait), which raced with the
        // follower of its changes: when the listing came first, no job was marked, and the
        // look at start had found the observed jobs still empty. Each round is a fresh
        // manager; the race went either way, about half of the time each.
        for round in 0..30 {
            let stores = ManagerStores::in_memory();
            stores.jobs.put("web", &stored_job()).expect("stored");
            let scheduler = cube_scheduler::scheduler_by_name("roundrobin").expect("a scheduler");
            let shutdown = CancellationToken::new();
            let manager = Manager::open(test_config(), stores, scheduler, shutdown.clone())
                .expect("a manager on memory stores");
            assert!(
                manager
                    .cluster
                    .wakes
                    .jobs
                    .deadline(&"web".to_string())
                    .is_none()
            );
            let watcher = tokio::spawn(manager.clone().run_jobs_watcher());
            manager.jobs_observed.wait_synced().await;
            let listed = tokio::time::Instant::now();
            while manager
                .cluster
                .wakes
                .jobs
                .deadline(&"web".to_string())
                .is_none()
            {
                // A generous bound for a state that comes: no resync runs here to mark the
                // job in the watcher's stead.
                assert!(
                    listed.elapsed() < Duration::from_secs(20),
                    "round {round}: the stored job was listed but not marked for a look"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            shutdown.cancel();
            let _ = watcher.await;
        }
    }
}
