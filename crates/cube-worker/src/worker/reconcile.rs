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
            let mut containers = match self.pod_containers(task).await {
                Ok(containers) => containers,
                Err(err) => {
                    tracing::warn!(task = %task.id, error = %err, "cannot inspect a pod's container");
                    return Seen::Unanswered;
                }
            };
            if task.status.state.is_terminal() {
                // Of a pod that ended, every container labelled for it: a start cut short (the
                // worker killed while it created the pod) leaves some its record never named.
                let listed = match self.runtime.list_managed(&self.config.name).await {
                    Ok(listed) => listed,
                    Err(err) => {
                        tracing::warn!(task = %task.id, error = %err, "cannot list a pod's containers");
                        return Seen::Unanswered;
                    }
                };
                for info in listed
                    .into_iter()
                    .filter(|info| info.task_id == Some(task.id))
                {
                    let named = containers.iter().any(|(_, _, known)| {
                        known.as_ref().is_some_and(|known| known.id == info.id)
                    });
                    if !named {
                        let service = info.pod_container.clone().unwrap_or_default();
                        containers.push((service, false, Some(info)));
                    }
                }
            }
            Seen::Pod(containers)
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use cube_runtime::{
        ContainerInfo, ContainerSpec, LABEL_NODE, LABEL_TASK_ID, RuntimeError, RuntimeEvent,
    };
    use cube_store::MemoryStore;
    use cube_types::{Labels, Resources, State, TaskEvent};
    use futures_util::StreamExt;
    use futures_util::stream::BoxStream;
    use tokio::sync::{Notify, Semaphore};

    use super::*;
    use crate::config::PodSettings;
    use crate::stats::StatsCollector;
    use crate::worker::WorkerConfig;

    /// An engine in memory whose starts wait until the test lets them through, and which
    /// notes whether a stop ever came while a start was under way.
    struct EngineState {
        containers: Mutex<HashMap<String, ContainerInfo>>,
        /// A start takes a permit: none until the test adds one.
        starts: Semaphore,
        /// Notified when a start has begun (and waits for its permit).
        start_begun: Notify,
        starting: AtomicBool,
        stopped_while_starting: AtomicBool,
    }

    impl Default for EngineState {
        fn default() -> Self {
            EngineState {
                containers: Mutex::default(),
                starts: Semaphore::new(0),
                start_begun: Notify::new(),
                starting: AtomicBool::new(false),
                stopped_while_starting: AtomicBool::new(false),
            }
        }
    }

    #[derive(Clone, Default)]
    struct GatedEngine(Arc<EngineState>);

    impl std::ops::Deref for GatedEngine {
        type Target = EngineState;
        fn deref(&self) -> &EngineState {
            &self.0
        }
    }

    impl EngineState {
        fn containers(&self) -> std::sync::MutexGuard<'_, HashMap<String, ContainerInfo>> {
            self.containers.lock().unwrap()
        }
    }

    impl Runtime for GatedEngine {
        async fn ensure_image(&self, _image: &str) -> Result<(), RuntimeError> {
            Ok(())
        }
        async fn create(&self, spec: &ContainerSpec) -> Result<String, RuntimeError> {
            let info = ContainerInfo {
                id: spec.name.clone(),
                name: spec.name.clone(),
                task_id: spec
                    .labels
                    .get(LABEL_TASK_ID)
                    .and_then(|id| id.parse().ok()),
                node: spec.labels.get(LABEL_NODE).cloned(),
                ..ContainerInfo::default()
            };
            self.containers().insert(spec.name.clone(), info);
            Ok(spec.name.clone())
        }
        async fn start(&self, container_id: &str) -> Result<(), RuntimeError> {
            self.starting.store(true, Ordering::SeqCst);
            self.start_begun.notify_one();
            self.starts.acquire().await.unwrap().forget();
            if let Some(info) = self.containers().get_mut(container_id) {
                info.running = true;
            }
            self.starting.store(false, Ordering::SeqCst);
            Ok(())
        }
        async fn stop(&self, container_id: &str, _timeout: Duration) -> Result<(), RuntimeError> {
            if self.starting.load(Ordering::SeqCst) {
                self.stopped_while_starting.store(true, Ordering::SeqCst);
            }
            if let Some(info) = self.containers().get_mut(container_id)
                && info.running
            {
                info.running = false;
                info.exit_code = Some(143);
            }
            Ok(())
        }
        async fn remove(&self, container_id: &str) -> Result<(), RuntimeError> {
            self.containers().remove(container_id);
            Ok(())
        }
        async fn inspect(&self, container_id: &str) -> Result<Option<ContainerInfo>, RuntimeError> {
            Ok(self.containers().get(container_id).cloned())
        }
        async fn list_managed(&self, node: &str) -> Result<Vec<ContainerInfo>, RuntimeError> {
            Ok(self
                .containers()
                .values()
                .filter(|info| info.node.as_deref() == Some(node))
                .cloned()
                .collect())
        }
        fn events_since(
            &self,
            _node: &str,
            _since_unix_secs: i64,
        ) -> BoxStream<'static, Result<RuntimeEvent, RuntimeError>> {
            futures_util::stream::pending().boxed()
        }
    }

    fn worker(engine: GatedEngine, data_dir: &std::path::Path) -> Arc<Worker<GatedEngine>> {
        let config = WorkerConfig {
            name: "w1".to_string(),
            address: "http://127.0.0.1:1".to_string(),
            capacity: Resources {
                cpu: 4.0,
                memory: 1 << 30,
                disk: 1 << 30,
            },
            stop_timeout: Duration::from_secs(1),
            max_concurrent_operations: 4,
            labels: Labels::default(),
            pods: PodSettings::default(),
        };
        Worker::new(
            config,
            Arc::new(MemoryStore::new()),
            engine,
            StatsCollector::new(data_dir),
        )
    }

    /// Waits (at most 10 s) until the task is in `state`.
    async fn await_state(worker: &Worker<GatedEngine>, id: Uuid, state: State) -> Task {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let mut changes = worker.observed.subscribe();
            let task = worker.task(id).unwrap();
            if task.status.state == state {
                return task;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "task still {} (error: {:?}), waited for {state}",
                task.status.state,
                task.status.run.error
            );
            let _ = tokio::time::timeout_at(deadline, changes.changed()).await;
        }
    }

    #[tokio::test]
    async fn a_stop_asked_during_a_start_is_carried_out_after_it_and_never_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let engine = GatedEngine::default();
        let worker = worker(engine.clone(), dir.path());
        let shutdown = CancellationToken::new();
        let reconciles = tokio::spawn(worker.clone().run_reconciles(shutdown.clone()));

        let task = Task::new("web", "img");
        let id = task.id;
        let event = TaskEvent {
            id: Uuid::new_v4(),
            state: cube_types::State::Running,
            timestamp: None,
            task,
        };
        worker.submit(event).await.unwrap();
        engine.start_begun.notified().await;
        // The start waits in the engine; the stop is recorded now and its reconcile waits
        // for the start's.
        let asked = worker.request_stop(id).await.unwrap();
        assert_eq!(asked.spec.desired_state, State::Completed);
        assert!(
            worker.runner.is_running(&id),
            "the start is still under way"
        );
        engine.starts.add_permits(1);

        let stopped = await_state(&worker, id, State::Completed).await;
        assert_eq!(
            stopped.spec.desired_state,
            State::Completed,
            "the stop asked for is kept"
        );
        assert!(
            !engine.stopped_while_starting.load(Ordering::SeqCst),
            "the stop ran while the start was under way"
        );
        let container = engine
            .containers()
            .get(&stopped.status.run.container_id)
            .cloned();
        assert!(
            container.is_some_and(|info| !info.running),
            "the container is kept, stopped"
        );
        shutdown.cancel();
        reconciles.await.unwrap();
    }
}
