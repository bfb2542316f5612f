//! The reconcile: the worker's one control loop, on the framework's [`Runner`] of task IDs.
//! Docker's events (`events.rs`), the resync (`resync.rs`), the API (a submission, a stop)
//! and the health loop (`probes.rs`) push a task's ID; the reconcile reads the task, asks
//! the engine about its containers when that matters, lets [`decide`] say what to do and
//! carries it out. The runner keeps one pending entry per task and never reconciles one task
//! twice at once: a push while its reconcile runs is held back and reconciled after it, so a
//! stop asked for during a start is carried out once the start is recorded.

use std::sync::Arc;

use cube_controller::runner::{self, ErrorPolicy, Failure, ReadyGate, Runner, RunnerConfig};
use cube_runtime::Runtime;
use cube_types::Task;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::decide::{self, Action, Observed, Seen, decide};
use super::probes::count_probes;
use super::{Worker, WorkerError};

/// A failed reconcile is logged and left: the next event or resync of the task reconciles it
/// again (as a failed command was, before the worker ran on the runner).
struct LogFailure;

impl ErrorPolicy<Uuid, WorkerError> for LogFailure {
    fn on_failure(&self, id: &Uuid, failure: &Failure<WorkerError>, _: u32) -> runner::Action {
        tracing::error!(task = %id, error = %failure, "reconcile failed");
        runner::Action::Done
    }
}

/// The runner the reconciles of a worker allowed `max_concurrent` operations at once run on.
pub(super) fn runner_for(max_concurrent: usize) -> Runner<Uuid> {
    Runner::new(RunnerConfig {
        max_concurrent: max_concurrent.max(1),
        shutdown_grace: crate::SHUTDOWN_GRACE,
    })
}

impl<R: Runtime> Worker<R> {
    /// Reconciles the tasks pushed, up to `max_concurrent_operations` at once, until
    /// `shutdown`; then lets the reconciles under way finish for at most the shutdown grace.
    /// Tasks still waiting are left: their desired state is in the store, and the next
    /// start's resync hands them to the reconcile again.
    pub async fn run_reconciles(self: Arc<Self>, shutdown: CancellationToken) {
        let runner = self.runner.clone();
        let worker = self.clone();
        runner
            .run(
                move |id| {
                    let worker = worker.clone();
                    async move {
                        worker.reconcile(id).await?;
                        Ok(runner::Action::Done)
                    }
                },
                LogFailure,
                ReadyGate::open(),
                shutdown,
            )
            .await;
        self.config.pods.plugins.shutdown();
    }

    /// One look at a task: its record and, when [`decide`] needs it, its containers; then
    /// what [`decide`] says, carried out.
    async fn reconcile(&self, id: Uuid) -> Result<(), WorkerError> {
        let outcomes = self.probe_outcomes.take(id);
        let Some(mut task) = self.tasks.get(&id.to_string())? else {
            return Ok(());
        };
        let (counted, unhealthy) = count_probes(&mut task, outcomes);
        if counted && unhealthy.is_none() {
            self.save(&task)?;
        }
        let containers = if decide::looks_at_containers(&task) {
            self.look(&task).await
        } else {
            Seen::NotAsked
        };
        let action = decide(
            &task,
            Observed {
                containers,
                unhealthy,
            },
        );
        tracing::trace!(task = %id, ?action, "reconcile");
        match action {
            Action::Start => self.start(task).await,
            Action::Stop => self.stop(task).await,
            Action::Record(info) => self.observe(task, info),
            Action::RecordPod(containers) => self.record_pod(task, &containers).await,
            Action::Fail(reason) => self.fail(task, reason),
            Action::FailUnhealthy(reason) => self.fail_unhealthy(task, reason).await,
            Action::Nothing => Ok(()),
        }
    }

    /// What the engine says of the task's containers: a pod's each, or a single container's.
    async fn look(&self, task: &Task) -> Seen {
        if task.spec.pod.is_some() {
            match self.pod_containers(task).await {
                Ok(containers) => Seen::Pod(containers),
                Err(err) => {
                    tracing::warn!(task = %task.id, error = %err, "cannot inspect a pod's container");
                    Seen::Unanswered
                }
            }
        } else {
            match self.find_container(task).await {
                Ok(info) => Seen::Container(info),
                Err(err) => {
                    tracing::warn!(task = %task.id, error = %err, "cannot inspect the container");
                    Seen::Unanswered
                }
            }
        }
    }

    /// Stops a container whose health checks failed too often, and fails its task.
    async fn fail_unhealthy(&self, mut task: Task, reason: String) -> Result<(), WorkerError> {
        tracing::warn!(task = %task.id, name = %task.name, %reason, "stopping an unhealthy task");
        if let Err(err) = self
            .runtime
            .stop(&task.status.run.container_id, self.config.stop_timeout)
            .await
        {
            tracing::warn!(task = %task.id, error = %err, "cannot stop the unhealthy container");
        }
        if let Ok(Some(info)) = self.runtime.inspect(&task.status.run.container_id).await {
            task.status.run.exit_code = info.exit_code;
            task.status.run.finish_time = info.finished_at;
        }
        self.fail(task, reason)
    }
}
