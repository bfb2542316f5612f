//! Two controllers on timers. **Liveness**: a node silent for longer than the heartbeat
//! grace is `Down` and its tasks `Lost` (the task controller replaces them by their restart
//! policy), and a drain with nothing left to move ends. **Resync**: every resync interval
//! every unfinished task and every job is looked at again, in case an event was missed
//! (anti-entropy; a look that finds nothing to do writes nothing).
//!
//! | controller | reads | woken by | writes |
//! |---|---|---|---|
//! | [`Liveness`] | the node registry, the task cache | a tick (a tenth of the grace, 50 ms–1 s) | nodes `Down` (an event), their tasks `Lost` (then wakes the task controller for each), a drain's end (`NodeDrained`) |
//! | [`Resync`] | the task cache, the jobs | a tick (`--resync-interval`), the first at once | nothing: it wakes the task controller for every unfinished task, a placement pass, and the job controller for every job |

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use cube_types::State;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::cluster::{Cluster, NodeChange, NodeWake, Writes, lock};
use crate::nodes::drain_counts;

/// The liveness controller (see the module comment).
pub(crate) struct Liveness {
    cluster: Arc<Cluster>,
}

impl Liveness {
    pub(crate) fn new(cluster: Arc<Cluster>) -> Liveness {
        Liveness { cluster }
    }

    /// Looks for silent nodes and finished drains until `shutdown`.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let tick = (self.cluster.heartbeat_grace() / 10)
            .clamp(Duration::from_millis(50), Duration::from_secs(1));
        let mut ticks = tokio::time::interval(tick);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticks.tick() => {}
            }
            self.look(Instant::now()).await;
        }
    }

    /// One look at `now`: marks the silent nodes `Down` and their tasks `Lost` (durably, then
    /// wakes the task controller for each), and ends the drains with nothing left to move.
    pub(crate) async fn look(&self, now: Instant) {
        let mut writes = Writes::default();
        let (lost, down) = self.mark_silent_nodes_down(now, &mut writes);
        let _ = self.cluster.settle(writes).await;
        for id in lost {
            self.cluster.wakes.tasks.push(id);
        }
        for wake in down {
            self.cluster.wake_for_node(wake);
        }
        self.finish_drains().await;
    }

    /// Marks the nodes that stopped reporting `Down` (once each) and their tasks `Lost`;
    /// returns those tasks, and the nodes' changes.
    fn mark_silent_nodes_down(
        &self,
        now: Instant,
        writes: &mut Writes,
    ) -> (Vec<Uuid>, Vec<NodeWake>) {
        let cluster = &self.cluster;
        let grace = cluster.heartbeat_grace();
        let mut state = lock(&cluster.state);
        let newly_down = state.nodes.mark_down(now, grace);
        let mut lost = Vec::new();
        let mut down = Vec::new();
        for name in newly_down {
            tracing::warn!(node = %name, ?grace, "node stopped reporting: Down; its tasks are Lost");
            cluster.publish_node(&state, &name, "NodeDown");
            down.push(cluster.node_changed(&mut state, &name, NodeChange::Down));
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
                if let Err(err) = cluster.save(&mut state, writes, task) {
                    tracing::error!(task = %id, error = %err, "cannot store a lost task");
                    continue;
                }
                lost.push(id);
            }
        }
        (lost, down)
    }

    /// Ends the drains that have nothing left to move (after each look for silent nodes): the
    /// node stays ineligible; a `NodeDrained` event says the drain is over.
    async fn finish_drains(&self) {
        let done: Vec<String> = {
            let state = lock(&self.cluster.state);
            let job_type = |name: &str| state.jobs.get(name).map(|record| record.job.job_type);
            state
                .nodes
                .entries()
                .filter(|entry| entry.drain.is_some())
                .filter(|entry| drain_counts(&state.cache, &entry.name, &job_type).0 == 0)
                .map(|entry| entry.name.clone())
                .collect()
        };
        for name in done {
            let result = self
                .cluster
                .update_node(&name, |entry| entry.drain.take().map(|_| "NodeDrained"))
                .await;
            match result {
                Ok(true) => {
                    tracing::info!(node = %name, "drain complete: the node stays ineligible")
                }
                Ok(false) => {}
                Err(err) => {
                    tracing::warn!(node = %name, error = %err, "cannot record the end of a drain")
                }
            }
        }
    }
}

/// The resync (see the module comment).
pub(crate) struct Resync {
    cluster: Arc<Cluster>,
    interval: Duration,
}

impl Resync {
    pub(crate) fn new(cluster: Arc<Cluster>, interval: Duration) -> Resync {
        Resync { cluster, interval }
    }

    /// Wakes everything every interval until `shutdown`; the first time at once: a
    /// restarted manager resumes every task.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let mut ticks = tokio::time::interval(self.interval);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticks.tick() => self.wake_everything(),
            }
        }
    }

    /// Wakes the task controller for every task that has not ended and that it would act on
    /// now, a placement pass over every waiting task, and the job controller for every job.
    /// A task the controller would leave as it is (running as wanted: the decision is
    /// `Nothing`) is not woken: with a million running, waking each every interval was an
    /// eighth of the manager's time, for nothing.
    fn wake_everything(&self) {
        let now = Utc::now();
        let in_doubt: Vec<Uuid> = lock(&self.cluster.state)
            .cache
            .tasks()
            .filter(|task| in_doubt(task, now))
            .map(|task| task.id)
            .collect();
        for id in in_doubt {
            self.cluster.wakes.tasks.push(id);
        }
        self.cluster.push_waiting();
        self.cluster.mark_all_jobs_dirty();
    }
}

/// Whether the task controller would act on `task` now: it has not ended and is not as
/// wanted (the decision is not `Nothing`). What a resync, or a manager that takes a shard,
/// wakes it for.
pub(crate) fn in_doubt(task: &cube_types::Task, now: chrono::DateTime<Utc>) -> bool {
    !task.status.state.is_terminal()
        && crate::reconcile::reconcile(task, now) != crate::reconcile::Action::Nothing
}

#[cfg(test)]
mod liveness_tests {
    use std::time::{Duration, Instant};

    use cube_types::{State, Task};

    use super::Liveness;
    use crate::cluster::{ManagerStores, cluster_for_tests, lock, report_test_node};
    use crate::events::Received;

    const GRACE: Duration = Duration::from_secs(10);

    /// A cluster with node `w1` reporting at `then` and task `t` running there.
    async fn one_running_task(then: Instant) -> (std::sync::Arc<crate::cluster::Cluster>, Task) {
        let cluster = cluster_for_tests(ManagerStores::in_memory(), GRACE);
        report_test_node(&cluster, "w1", then);
        let mut task = Task::new("t", "cube-sample:latest");
        task.status.state = State::Running;
        task.status.node_name = "w1".into();
        cluster.store_for_tests(task.clone()).await;
        (cluster, task)
    }

    #[tokio::test]
    async fn a_node_silent_past_the_grace_is_down_and_its_running_task_lost_and_handed_on() {
        let then = Instant::now();
        let (cluster, task) = one_running_task(then).await;
        let mut events = cluster.events.subscribe(None).expect("a subscription");
        let liveness = Liveness::new(cluster.clone());

        // Within the grace nothing changes.
        liveness.look(then + GRACE / 2).await;
        let stored = cluster
            .stores
            .tasks
            .get(&task.id.to_string())
            .unwrap()
            .unwrap();
        assert_eq!(stored.status.state, State::Running);
        assert!(cluster.wakes.tasks.deadline(&task.id).is_none());

        liveness.look(then + GRACE + Duration::from_secs(1)).await;
        let stored = cluster
            .stores
            .tasks
            .get(&task.id.to_string())
            .unwrap()
            .unwrap();
        assert_eq!(
            stored.status.state,
            State::Lost,
            "the store has the task Lost"
        );
        assert!(
            stored
                .status
                .run
                .error
                .as_deref()
                .is_some_and(|error| error.contains("node w1 sent nothing")),
            "the task says why: {:?}",
            stored.status.run.error
        );
        assert_eq!(
            stored
                .status
                .history
                .last()
                .map(|entry| entry.event.as_ref()),
            Some("Lost"),
            "the history records the loss"
        );
        assert_eq!(
            lock(&cluster.state)
                .cache
                .get(&task.id)
                .map(|task| task.status.state),
            Some(State::Lost),
            "the cache agrees with the store"
        );
        assert!(
            cluster.wakes.tasks.deadline(&task.id).is_some(),
            "the task controller is woken for the lost task"
        );
        let mut kinds = Vec::new();
        while let Some(Received::Event(event)) = events.try_next() {
            kinds.push((event.key.clone(), event.kind.to_string()));
        }
        assert!(
            kinds.contains(&("w1".to_string(), "NodeDown".to_string())),
            "{kinds:?}"
        );

        // Down once: a second look writes nothing more.
        let revision = cluster.stores.tasks.revision().unwrap();
        liveness.look(then + GRACE * 2).await;
        assert_eq!(cluster.stores.tasks.revision().unwrap(), revision);
    }
    #[tokio::test]
    async fn the_resync_wakes_the_tasks_in_doubt_a_placement_pass_and_every_job() {
        let then = Instant::now();
        let (cluster, running) = one_running_task(then).await;
        let mut done = Task::new("done", "cube-sample:latest");
        done.status.state = State::Completed;
        let mut scheduled = Task::new("sent", "cube-sample:latest");
        scheduled.status.state = State::Scheduled;
        scheduled.status.node_name = "w1".into();
        let waiting = Task::new("waiting", "cube-sample:latest");
        let mut stopping = running.clone();
        stopping.id = uuid::Uuid::new_v4();
        stopping.spec.desired_state = State::Completed;
        for task in [&done, &scheduled, &waiting, &stopping] {
            cluster.store_for_tests(task.clone()).await;
        }
        let record: cube_types::job::JobRecord = serde_json::from_value(serde_json::json!({
            "Job": {"Name": "web", "Groups": [{"Name": "api", "Task": {"Image": "cube-sample:latest"}}]},
            "Version": 1
        }))
        .expect("a job record");
        lock(&cluster.state)
            .jobs
            .insert("web".to_string(), std::sync::Arc::new(record));
        let resync = super::Resync::new(cluster.clone(), Duration::from_secs(60));

        resync.wake_everything();
        let woken = |task: &Task| cluster.wakes.tasks.deadline(&task.id).is_some();
        assert!(!woken(&done), "an ended task is not looked at again");
        assert!(
            !woken(&running),
            "a task running as wanted: the controller would do nothing"
        );
        assert!(woken(&scheduled), "sent to its node again");
        assert!(woken(&waiting), "handed to the placement pass again");
        assert!(woken(&stopping), "its stop sent again");
        assert!(cluster.wakes.jobs.deadline(&"web".to_string()).is_some());
        assert!(cluster.wakes.placement.deadline(&()).is_some());
    }
}
