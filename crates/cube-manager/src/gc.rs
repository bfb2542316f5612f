//! Garbage collection: what ended goes, so that what the manager holds does not grow with
//! every task ever run. A task that ended for good (`Completed`, or `Failed` with no restart
//! to come; a stopped task is `Completed`) is removed `--gc-after` after it ended, with its
//! container on its worker (which held its logs until then); `cube rm` (`DELETE
//! /tasks/{id}?purge=true`) and `cube prune` (`POST /tasks/prune`) remove at once. A stopped
//! job goes once it has no task left.
//!
//! What is kept on purpose: a task waiting out its restart backoff, a `Lost` task (nobody
//! knows whether it still runs; removing its node fails it), and the ended copies of a batch
//! job that was not stopped, which are its record of the work done (removed, the job would
//! run them again). The decision is [`removable`], pure; removal asks the task's worker first
//! (its container and record go), then forgets the task here, so that a worker that cannot
//! be reached only delays a removal, never loses a container.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use cube_api::ClientError;
use cube_store::StoreError;
use cube_types::job::{JobRecord, JobType};
use cube_types::{NodeStatus, State, Task};
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::cluster::{Cluster, lock};
use crate::events::{Payload, Topic};
use crate::job_records::JobRecords;
use crate::jobs::is_live;

/// Why a task may not be removed now, in words; `None` when it may.
pub fn removable(task: &Task, job: Option<&JobRecord>) -> Option<String> {
    if !matches!(task.status.state, State::Completed | State::Failed) {
        return Some(format!(
            "task {} ({}) is {}: stop it first (cube stop {})",
            task.name,
            task.short_id(),
            task.status.state,
            task.short_id()
        ));
    }
    if is_live(task) || task.status.next_restart.is_some() {
        return Some(format!(
            "task {} ({}) ended {} and waits to restart: stop it first (cube stop {})",
            task.name,
            task.short_id(),
            task.status.state,
            task.short_id()
        ));
    }
    if let Some(job) = job
        && job.job.job_type == JobType::Batch
        && !job.stopped
    {
        return Some(format!(
            "task {} belongs to batch job {}, whose ended copies are its record of the work \
             done (removed, they would run again): stop the job first (cube job stop {})",
            task.name, job.job.name, job.job.name
        ));
    }
    None
}

/// When a task ended: its run's finish time, else its last history entry, else its
/// creation.
pub fn ended_at(task: &Task) -> Option<DateTime<Utc>> {
    task.status
        .run
        .finish_time
        .or_else(|| task.status.history.last().map(|entry| entry.time))
        .or(task.status.created_time)
}

/// What `POST /tasks/prune` (and one pass of the garbage collector) removed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Pruned {
    /// The tasks removed, with their containers.
    #[serde(rename = "Tasks")]
    pub tasks: Vec<PrunedTask>,
    /// The stopped jobs removed (they had no task left).
    #[serde(rename = "Jobs")]
    pub jobs: Vec<String>,
    /// Tasks that could not be removed now, and why (their worker could not be reached).
    #[serde(rename = "Errors")]
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PrunedTask {
    #[serde(rename = "ID")]
    pub id: Uuid,
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "NodeName")]
    pub node_name: String,
}

/// Why a task could not be removed now (nothing was removed; a later try may).
#[derive(Debug, thiserror::Error)]
pub(crate) enum RemoveError {
    /// Its worker could not be asked to remove its containers, or the removal stopped.
    #[error("{0}")]
    Unavailable(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The garbage collector (see the module comment).
///
/// | reads | woken by | writes |
/// |---|---|---|
/// | the ended tasks, the stopped jobs | a tick, every quarter of `--gc-after` (500 ms–1 min); `cube rm`, `cube prune` | purges on the tasks' workers, then the tasks forgotten (`Removed`); stopped jobs left without tasks removed (`JobRemoved`) |
pub(crate) struct GarbageCollector {
    cluster: Arc<Cluster>,
    records: Arc<JobRecords>,
    /// `--gc-after`.
    after: Duration,
}

impl GarbageCollector {
    pub(crate) fn new(
        cluster: Arc<Cluster>,
        records: Arc<JobRecords>,
        after: Duration,
    ) -> GarbageCollector {
        GarbageCollector {
            cluster,
            records,
            after,
        }
    }

    /// `POST /tasks/prune` (`older_than` none) and the garbage collector (`--gc-after`):
    /// removes every task that may be removed and ended at least `older_than` ago, then the
    /// stopped jobs left without tasks (`older_than` after they were submitted).
    pub(crate) async fn prune(&self, older_than: Duration) -> Pruned {
        self.prune_in(older_than, &|_| true).await
    }

    /// [`GarbageCollector::prune`] of the tasks and jobs of the projects `in_projects` admits.
    pub(crate) async fn prune_in(
        &self,
        older_than: Duration,
        in_projects: &(dyn Fn(&str) -> bool + Sync),
    ) -> Pruned {
        let now = Utc::now();
        let older_than = chrono::Duration::from_std(older_than).unwrap_or(chrono::Duration::MAX);
        let due: Vec<Task> = {
            let state = lock(&self.cluster.state);
            state
                .cache
                .tasks()
                .filter(|task| in_projects(&task.spec.project))
                .filter(|task| {
                    let job = state.jobs.get(&task.spec.job).map(|record| &**record);
                    removable(task, job).is_none()
                        && ended_at(task).is_none_or(|ended| ended + older_than <= now)
                })
                .cloned()
                .collect()
        };
        let mut pruned = Pruned::default();
        for task in due {
            match self.purge(&task).await {
                Ok(()) => pruned.tasks.push(PrunedTask {
                    id: task.id,
                    name: task.name.clone(),
                    node_name: task.status.node_name.to_string(),
                }),
                Err(err) => pruned
                    .errors
                    .push(format!("task {} ({}): {err}", task.name, task.id)),
            }
        }
        pruned.jobs = self.prune_jobs(now, older_than, in_projects).await;
        if !pruned.tasks.is_empty() || !pruned.jobs.is_empty() {
            tracing::info!(
                tasks = pruned.tasks.len(),
                jobs = pruned.jobs.len(),
                errors = pruned.errors.len(),
                "removed what ended"
            );
        }
        pruned
    }

    /// Removes the stopped jobs that have no task left and were submitted at least
    /// `older_than` ago: their record, their versions and their last deployment.
    async fn prune_jobs(
        &self,
        now: DateTime<Utc>,
        older_than: chrono::Duration,
        in_projects: &(dyn Fn(&str) -> bool + Sync),
    ) -> Vec<String> {
        let _writing = self.records.hold().await;
        let due: Vec<String> = {
            let state = lock(&self.cluster.state);
            state
                .jobs
                .values()
                .filter(|record| {
                    record.stopped
                        && in_projects(record.job.project())
                        && state.cache.of_job(&record.job.key()).is_empty()
                        && record
                            .submit_time
                            .is_none_or(|submitted| submitted + older_than <= now)
                })
                .map(|record| record.job.key())
                .collect()
        };
        let mut removed = Vec::new();
        for name in due {
            let stores = self.cluster.stores.clone();
            let key = name.clone();
            let deleted = tokio::task::spawn_blocking(move || {
                stores.jobs.delete(&key)?;
                stores.job_versions.delete(&key)?;
                stores.deployments.delete(&key)
            })
            .await;
            match deleted {
                Ok(Ok(_)) => {}
                Ok(Err(err)) => {
                    tracing::warn!(job = %name, error = %err, "cannot remove a stopped job");
                    continue;
                }
                Err(err) => {
                    tracing::warn!(job = %name, error = %err, "cannot remove a stopped job");
                    continue;
                }
            }
            let mut state = lock(&self.cluster.state);
            state.queue_dirty.mark_job(&name);
            let project = state
                .jobs
                .remove(&name)
                .map(|record| record.job.project().to_string());
            state.histories.remove(&name);
            state.deployments.remove(&name);
            self.cluster.publish(
                Topic::Job,
                "JobRemoved",
                &name,
                Some(&name),
                project.as_deref(),
                serde_json::json!({"Name": name}),
            );
            removed.push(name);
        }
        if !removed.is_empty() {
            self.cluster.push_queue();
        }
        removed
    }

    /// Removes one task: its worker forgets it and removes its containers (a node that is
    /// `Down` or gone is skipped: its worker purges what the manager no longer knows when it
    /// next reports), then it is forgotten here, durably.
    pub(crate) async fn purge(&self, task: &Task) -> Result<(), RemoveError> {
        let client = {
            let state = lock(&self.cluster.state);
            state.nodes.get(&task.status.node_name).and_then(|entry| {
                let status =
                    entry.status(std::time::Instant::now(), self.cluster.heartbeat_grace());
                (status != NodeStatus::Down).then(|| entry.client.clone())
            })
        };
        if let Some(client) = client {
            match client
                .delete(&format!("/tasks/{}?purge=true", task.id))
                .await
            {
                Ok(()) => {}
                Err(ClientError::Status { status, .. }) if status.as_u16() == 404 => {}
                Err(err) => {
                    return Err(RemoveError::Unavailable(format!(
                        "cannot remove task {}'s container on node {}: {}; nothing was removed, \
                         try again",
                        task.name,
                        task.status.node_name,
                        err.cause()
                    )));
                }
            }
        }
        self.forget(task.id).await
    }

    /// Forgets a task here: out of the cache (with a `Removed` event), then out of the store,
    /// durably; put back when the store could not delete it.
    async fn forget(&self, id: Uuid) -> Result<(), RemoveError> {
        let key = {
            let mut state = lock(&self.cluster.state);
            let Some(removed) = state.cache.remove(&id) else {
                return Ok(());
            };
            let key = self.cluster.stores.layout.task_of(&removed);
            state.queue_dirty.mark_task(&removed);
            self.cluster.events.publish(
                Topic::Task,
                std::borrow::Cow::Borrowed("Removed"),
                id.to_string(),
                crate::events::Belongs {
                    job: (!removed.spec.job.is_empty()).then(|| removed.spec.job.clone()),
                    project: Some(removed.spec.project.clone()),
                },
                Payload::Task(removed),
                false,
            );
            key
        };
        lock(&self.cluster.failures).remove(&id);
        self.cluster.wakes.tasks.forget(&id);
        // The waiting list forgets a request that is gone.
        self.cluster.push_queue();
        let tasks = self.cluster.stores.tasks.clone();
        let deleted = tokio::task::spawn_blocking(move || tasks.delete(&key)).await;
        match deleted {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(err)) => {
                self.cluster.reload_task(id);
                Err(err.into())
            }
            Err(err) => {
                self.cluster.reload_task(id);
                Err(RemoveError::Unavailable(format!(
                    "the removal of task {id} stopped: {err}"
                )))
            }
        }
    }

    /// Removes what ended `--gc-after` ago, every quarter of that (between 500 ms and 1
    /// minute), until `shutdown`.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let every = (self.after / 4).clamp(Duration::from_millis(500), Duration::from_secs(60));
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticks.tick() => {}
            }
            let pruned = tokio::select! {
                _ = shutdown.cancelled() => return,
                pruned = self.prune(self.after) => pruned,
            };
            for error in pruned.errors {
                tracing::debug!(%error, "not removed yet; the next pass tries again");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(state: State) -> Task {
        let mut task = Task::new("t", "img");
        task.status.state = state;
        task.status.run.finish_time = Some(Utc::now());
        task
    }

    #[test]
    fn only_a_task_that_ended_for_good_may_be_removed() {
        assert!(removable(&ended(State::Completed), None).is_none());
        assert!(removable(&ended(State::Failed), None).is_none());
        let running = removable(&ended(State::Running), None).unwrap();
        assert!(running.contains("stop it first"), "{running}");
        assert!(removable(&ended(State::Lost), None).is_some());
        let mut restarting = ended(State::Failed);
        restarting.spec.restart_policy = cube_types::RestartPolicy::OnFailure;
        let why = removable(&restarting, None).unwrap();
        assert!(why.contains("waits to restart"), "{why}");
        restarting.spec.desired_state = State::Completed;
        assert!(removable(&restarting, None).is_none(), "a stop is final");
    }

    #[test]
    fn a_running_batch_jobs_ended_copies_stay() {
        let record: JobRecord = serde_json::from_value(serde_json::json!({
            "Job": {"Name": "b", "Type": "batch",
                    "Groups": [{"Name": "g", "Count": 1, "Task": {"Image": "img"}}]},
            "Version": 1
        }))
        .unwrap();
        let mut copy = ended(State::Completed);
        copy.spec.job = "b".into();
        assert!(removable(&copy, Some(&record)).is_some());
        let mut stopped = record.clone();
        stopped.stopped = true;
        assert!(removable(&copy, Some(&stopped)).is_none());
    }
}

#[cfg(test)]
mod collector_tests {
    use std::sync::Arc;
    use std::time::Duration;

    use chrono::Utc;
    use cube_types::{State, Task};

    use super::GarbageCollector;
    use crate::cluster::{ManagerStores, cluster_for_tests, lock};
    use crate::job_records::JobRecords;

    #[tokio::test]
    async fn what_ended_long_enough_ago_goes_and_what_runs_or_ended_lately_stays() {
        // No `Manager`, and no node: nothing is asked of a worker (none is known).
        let stores = ManagerStores::in_memory();
        let task = |name: &str, state: State, ended_ago: Option<chrono::Duration>| {
            let mut task = Task::new(name, "cube-sample:latest");
            task.status.state = state;
            task.status.run.finish_time = ended_ago.map(|ago| Utc::now() - ago);
            stores
                .tasks
                .put(&task.id.to_string(), &task)
                .expect("stored");
            task.id
        };
        let old = task("old", State::Completed, Some(chrono::Duration::hours(2)));
        let recent = task(
            "recent",
            State::Completed,
            Some(chrono::Duration::seconds(1)),
        );
        let running = task("running", State::Running, None);
        let cluster = cluster_for_tests(stores, Duration::from_secs(60));
        let collector = GarbageCollector::new(
            cluster.clone(),
            Arc::new(JobRecords::new(cluster.clone())),
            Duration::from_secs(3600),
        );

        let pruned = collector.prune(Duration::from_secs(3600)).await;
        assert!(pruned.errors.is_empty(), "{:?}", pruned.errors);
        let names: Vec<&str> = pruned.tasks.iter().map(|task| task.name.as_str()).collect();
        assert_eq!(names, vec!["old"]);
        let stored = |id: uuid::Uuid| cluster.stores.tasks.get(&id.to_string()).expect("a read");
        assert!(stored(old).is_none(), "the store forgot it");
        assert!(
            lock(&cluster.state).cache.get(&old).is_none(),
            "so did the cache"
        );
        assert!(stored(recent).is_some());
        assert!(stored(running).is_some());
    }
}
