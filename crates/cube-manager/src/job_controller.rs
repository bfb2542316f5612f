//! The job controller: keeps each job's copies what the job asks for.
//!
//! | reads | woken by | writes |
//! |---|---|---|
//! | a job's record, kept versions and last deployment, its copies in the task cache, every node's facts | the job's name: its record written (`JobRecords::store_job`), one of its copies written (`Cluster::save`), a node that joins, leaves or changes (system jobs), a drain, the resync; its own deadlines (a deployment's `MinHealthyTime`) as delays | new copies (`Cluster::accept_tasks`), stops (`Cluster::stop_tasks`), the deployment, a version marked stable, an automatic revert (`JobRecords`) |
//!
//! The runner keeps one pending entry per job, never converges one job twice at once, and
//! retries a job that did not converge with its backoff. A look reads the job, its tasks and
//! the nodes under the cluster's lock, asks the pure transformer ([`crate::jobs::plan`]) what
//! to create and stop, and carries that out through the task operations every task goes
//! through: placement, dispatch, restarts and liveness stay the task controller's. A look
//! that finds nothing to do writes nothing, so a converged cluster is quiet. The API's side
//! (submitting, scaling, stopping and planning a job, and its views) is `job_api.rs`.

use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use cube_controller::runner::{Action, ExponentialBackoff, ReadyGate};
use cube_store::StoreError;
use cube_types::Task;
use cube_types::deployment::{Deployment, DeploymentState};
use cube_types::job::JobRecord;
use tokio_util::sync::CancellationToken;

use crate::cluster::{AcceptError, Cluster, lock};
use crate::job_records::JobRecords;
use crate::jobs::{JobLook, NodeFacts, plan};

/// What the job transformer reads for one job: the record, every node's facts, the tasks
/// the job owns, its last deployment and its newest stable version before the current one.
struct JobInputs {
    record: Arc<JobRecord>,
    nodes: Vec<NodeFacts>,
    tasks: Vec<Arc<Task>>,
    deployment: Option<Arc<Deployment>>,
    last_stable: Option<u64>,
}

/// Why a look at a job did not converge (the runner tries again with its backoff).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConvergeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Accept(#[from] AcceptError),
}

/// The job controller (see the module comment).
pub(crate) struct JobController {
    cluster: Arc<Cluster>,
    records: Arc<JobRecords>,
}

impl JobController {
    pub(crate) fn new(cluster: Arc<Cluster>, records: Arc<JobRecords>) -> JobController {
        JobController { cluster, records }
    }

    /// Converges the jobs pushed to the cluster's `wakes.jobs` until `shutdown`, every
    /// stored job first (a manager that starts, a new leader, converges each job at once).
    /// One job's look is a few map reads and, when something is missing, a few task
    /// submissions.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let cluster = self.cluster.clone();
        cluster.mark_all_jobs_dirty();
        let controller = Arc::new(self);
        let converge = move |name: String| {
            let controller = controller.clone();
            async move {
                let started = Instant::now();
                let converged = controller.converge(&name).await;
                controller.cluster.metrics.reconciled("job", started);
                converged
                    .map(|again| again.map_or(Action::Done, Action::RequeueAfter))
                    .map_err(|err| {
                        tracing::warn!(job = %name, error = %err, "a job did not converge; trying again");
                        err.to_string()
                    })
            }
        };
        // The jobs are in memory before the controller exists: nothing to wait for.
        cluster
            .wakes
            .jobs
            .run(
                converge,
                ExponentialBackoff::default(),
                ReadyGate::open(),
                shutdown,
            )
            .await;
    }

    /// The transformer's inputs for one job: the record, the nodes and the job's tasks, each
    /// read in a short hold of the lock; a change between them wakes the job again, and the
    /// next look sees it.
    fn job_inputs(&self, name: &str) -> Option<JobInputs> {
        let state = lock(&self.cluster.state);
        let record = state.jobs.get(name)?.clone();
        let nodes = self.cluster.node_facts(&state, record.job.job_type);
        let (tasks, deployment, last_stable) = state.job_look_inputs(name, record.version);
        Some(JobInputs {
            record,
            nodes,
            tasks,
            deployment,
            last_stable,
        })
    }

    /// One look at a job: plan, then carry the plan out — the deployment first (so that what
    /// is done is recorded before it is done), then the stops, the new copies, and a version
    /// marked stable or gone back to. Returns when to look again if nothing else happens.
    pub(crate) async fn converge(
        &self,
        name: &str,
    ) -> Result<Option<std::time::Duration>, ConvergeError> {
        let Some(JobInputs {
            record,
            nodes,
            tasks,
            deployment,
            last_stable,
        }) = self.job_inputs(name)
        else {
            return Ok(None);
        };
        let owned: Vec<&Task> = tasks.iter().map(|task| &**task).collect();
        let now = Utc::now();
        let look = JobLook {
            record: &record,
            deployment: deployment.as_deref(),
            last_stable,
            nodes: &nodes,
            owned: &owned,
            now,
        };
        let planned = plan(&look);
        let again = planned
            .look_again_at
            .and_then(|at| (at - now).to_std().ok())
            // A deadline a few milliseconds off is looked at a little late, not early.
            .map(|wait| wait + std::time::Duration::from_millis(20));
        if let Some(changed) = &planned.deployment {
            self.records
                .store_deployment(changed, deployment.as_deref())
                .await?;
            if changed.state == DeploymentState::Successful {
                self.records.mark_stable(name, changed.version).await?;
            }
        }
        if !planned.is_empty() {
            tracing::info!(job = %name, create = planned.create.len(), stop = planned.stop.len(), "converging a job");
            // Each side is one commit, however many copies it holds.
            for stop in &planned.stop {
                tracing::info!(job = %name, task = %stop.id, name = %stop.name, reason = %stop.reason, "stopping a copy");
            }
            let stops: Vec<_> = planned.stop.iter().map(|stop| stop.id).collect();
            self.cluster.stop_tasks(&stops, None).await?;
            if !planned.create.is_empty() {
                self.cluster.accept_tasks(planned.create, None).await?;
            }
        }
        if let Some(stable) = planned.revert_to {
            self.records
                .revert_after_failure(name, record.version, stable)
                .await?;
        }
        Ok(again)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use cube_types::State;
    use cube_types::job::{Job, JobRecord};
    use tokio_util::sync::CancellationToken;

    use super::JobController;
    use crate::cluster::{Cluster, ManagerStores, cluster_for_tests, lock};
    use crate::job_records::JobRecords;

    /// A service job of one group of `count` copies.
    fn record(count: u32) -> JobRecord {
        let job: Job = serde_json::from_value(serde_json::json!({
            "Name": "web", "Type": "service",
            "Groups": [{"Name": "api", "Count": count, "Task": {"Image": "cube-sample:latest"}}]
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

    /// A cluster on memory stores holding `stored` as a job, and its job controller: no
    /// `Manager` is built.
    fn controller_with(stored: JobRecord) -> (Arc<Cluster>, JobController) {
        let stores = ManagerStores::in_memory();
        stores.jobs.put("web", &stored).expect("stored");
        let cluster = cluster_for_tests(stores, Duration::from_secs(60));
        let records = Arc::new(JobRecords::new(cluster.clone()));
        (cluster.clone(), JobController::new(cluster, records))
    }

    /// The job's copies as the store has them, wanted running or not.
    fn stored_copies(cluster: &Cluster) -> Vec<cube_types::Task> {
        cluster
            .stores
            .tasks
            .list()
            .expect("a store that lists")
            .into_iter()
            .filter(|task| task.spec.job == "web")
            .collect()
    }

    #[tokio::test]
    async fn a_job_stored_before_the_controller_starts_gets_its_copies_at_once() {
        // A new leader (or a restarted manager) converges every stored job when its job
        // controller starts, not at its next resync.
        let (cluster, controller) = controller_with(record(2));
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(controller.run(shutdown.clone()));
        let started = tokio::time::Instant::now();
        while stored_copies(&cluster).len() < 2 {
            // A generous bound for a state that comes: no resync runs here.
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "the stored job got no copies"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let copies = stored_copies(&cluster);
        assert_eq!(copies.len(), 2);
        assert!(
            copies
                .iter()
                .all(|copy| copy.status.state == State::Pending)
        );
        let mut indexes: Vec<_> = copies.iter().map(|copy| copy.spec.index).collect();
        indexes.sort();
        assert_eq!(indexes, vec![Some(0), Some(1)]);
        shutdown.cancel();
        running.await.expect("the controller ends on shutdown");
    }

    #[tokio::test]
    async fn a_second_look_at_a_converged_job_writes_nothing() {
        let (cluster, controller) = controller_with(record(3));
        controller.converge("web").await.expect("a look");
        assert_eq!(stored_copies(&cluster).len(), 3);
        // The look after the copies were made records them in the deployment's counts.
        controller.converge("web").await.expect("a look");
        let revision = cluster.store_revision_for_tests();
        controller.converge("web").await.expect("a look");
        assert_eq!(cluster.store_revision_for_tests(), revision, "a quiet look");
        assert_eq!(stored_copies(&cluster).len(), 3);
    }

    #[tokio::test]
    async fn a_copys_write_wakes_its_job_after_a_delay_that_grows_with_the_job() {
        let (cluster, controller) = controller_with(record(3));
        controller.converge("web").await.expect("a look");
        cluster.wakes.jobs.forget(&"web".to_string());
        let mut copy = stored_copies(&cluster).remove(0);
        copy.status.state = State::Scheduled;
        let before = tokio::time::Instant::now();
        cluster.store_for_tests(copy).await;
        let due = cluster
            .wakes
            .jobs
            .deadline(&"web".to_string())
            .expect("a copy's write wakes its job");
        assert!(
            due >= before + crate::cluster::look_delay(3),
            "{:?}",
            due - before
        );
        assert!(due <= tokio::time::Instant::now() + crate::cluster::look_delay(3));
        assert_eq!(
            crate::cluster::look_delay(10_000),
            std::time::Duration::from_secs(1)
        );
    }

    #[tokio::test]
    async fn a_job_scaled_down_has_its_surplus_copy_stopped_and_its_controller_woken() {
        let (cluster, controller) = controller_with(record(2));
        controller.converge("web").await.expect("a look");
        let records = JobRecords::new(cluster.clone());
        records.store_job(record(1)).await.expect("stored");
        assert!(
            cluster.wakes.jobs.deadline(&"web".to_string()).is_some(),
            "a job record's write wakes its job"
        );
        assert_eq!(
            lock(&cluster.state).jobs["web"].job.groups[0].count,
            Some(1)
        );
        controller.converge("web").await.expect("a look");
        let copies = stored_copies(&cluster);
        let wanted: Vec<_> = copies
            .iter()
            .filter(|copy| copy.spec.desired_state == State::Running)
            .collect();
        assert_eq!(wanted.len(), 1, "{copies:?}");
        assert_eq!(wanted[0].spec.index, Some(0), "the lowest index is kept");
    }
}
