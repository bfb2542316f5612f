//! The worker's state and the operations on it.
//!
//! Desired state arrives through the API and is stored first (durably, with the persistent
//! store); then the task's ID is pushed to the reconcile (`worker/reconcile.rs`), which runs
//! on the framework's `Runner` of task IDs: several tasks at a time, one reconcile per task
//! at a time. A reconcile compares the stored task with its containers (`worker/decide.rs`,
//! pure) and starts, stops or records. Docker's events (`worker/events.rs`) push a task
//! within milliseconds of its container's exit; a periodic resync (`worker/resync.rs`)
//! catches whatever an event missed; the health loop (`worker/probes.rs`) hands its probes'
//! outcomes to the reconcile; the launch and the kill are `worker/launch.rs`.
//!
//! Who writes what of a record: the API writes a new task or run (`submit`) and the desired
//! state (`request_stop`), each a read-modify-write under the task's write lock; the
//! reconcile writes what the run shows, through [`Worker::save`], which keeps the desired
//! state the API wrote meanwhile and writes nothing over a new run or a purge.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use cube_controller::runner::Runner;
use cube_controller::store::{Change, ObservedStore};
use cube_runtime::{
    ContainerInfo, EngineVersion, ExecSession, LogOptions, OutputChunk, Runtime, RuntimeError,
    container_name,
};
use cube_store::{Store, StoreError};
use cube_types::{
    Health, Labels, NodeReport, Receiver, Resources, State, Task, TaskEvent, Transition,
};
use futures_util::stream::BoxStream;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::config::PodSettings;
use crate::first_check::FirstChecks;
use crate::health::HealthSchedule;
use crate::metrics::{Metered, WorkerMetrics};
use crate::room::Held;
use crate::stats::{StatsCollector, StatsError};

mod decide;
mod events;
mod launch;
mod probes;
mod reconcile;
mod resync;
mod secrets;

/// How many locks the writes of task records are spread over (see `Worker::writes`).
const WRITE_STRIPES: usize = 64;

/// How often the worker compares its tasks with Docker even when no event said anything.
pub const RESYNC_INTERVAL: Duration = Duration::from_secs(30);

/// How many changes the worker keeps for its followers: one that falls further behind (or
/// asks with an index from before this run) is sent every task. A follower asks again as soon
/// as it is answered, so it is rarely more than a few changes behind; each kept change holds
/// the task's version before it (about 1 KB), so the log is kept short.
const CHANGE_LOG_CAPACITY: usize = 1024;

/// Settings that do not change while the worker runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The node name: in container labels and in every task's `NodeName`.
    pub name: String,
    /// Where a manager reaches this worker's API: `http://HOST:PORT`.
    pub address: String,
    /// What the worker offers to tasks, as it tells the manager.
    pub capacity: Resources,
    /// How long a stopped container gets to exit before it is killed.
    pub stop_timeout: Duration,
    /// How many tasks may be started or stopped at once.
    pub max_concurrent_operations: usize,
    /// The operator's labels for this node (`--label zone=eu`), sent with every report.
    pub labels: Labels,
    /// How containers are launched, watched and killed, and the plugin chain
    /// (`cube worker --config FILE`).
    pub pods: PodSettings,
}

/// Why a request was refused or failed. Turned into an HTTP status in one place, `api.rs`.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("no task with ID {0} on this worker")]
    NotFound(Uuid),
    #[error("task {id}: {transition}")]
    Conflict { id: Uuid, transition: Transition },
    /// The request needs the task in another state (logs of a task not started yet, a
    /// command in one that does not run, the purge of one that did not end).
    #[error("{0}")]
    WrongState(String),
    #[error("{0}")]
    BadRequest(String),
    /// The task asks for more of the host than the worker's configuration allows.
    #[error("{0}")]
    Refused(String),
    /// The run does not fit beside what the worker holds now (`room.rs`).
    #[error("{0}")]
    NoRoom(String),
    #[error("the worker is shutting down")]
    ShuttingDown,
    #[error("{0}")]
    Runtime(String),
    #[error("task store failed: {0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Stats(#[from] StatsError),
}

/// What a submission did: created a task, or found it already there.
#[derive(Debug, Clone, PartialEq)]
pub enum Submitted {
    Created(Task),
    Existing(Task),
}

/// What a follower is sent: the tasks that changed after the index it gave, or all of them.
#[derive(Debug)]
pub enum TaskChanges {
    /// Every task that changed after `since`, once each, as it is now (none that did not).
    Since { since: u64, tasks: Vec<Arc<Task>> },
    /// Every task: the index asked for is not one this worker can answer changes after.
    All(Vec<Arc<Task>>),
}

/// One worker: its tasks, its container runtime and the runner of its reconciles.
pub struct Worker<R> {
    config: WorkerConfig,
    tasks: Arc<dyn Store<Task>>,
    /// The container engine, each call timed for `GET /metrics`.
    runtime: Metered<R>,
    stats: StatsCollector,
    /// The reconcile's queue of task IDs (`worker/reconcile.rs`): one pending entry per task
    /// (so at most one per task, whatever pushes), never two reconciles of one task at once.
    runner: Runner<Uuid>,
    /// Each read-modify-write of a task record holds the lock of its task's stripe, so that
    /// the API's writes and the reconcile's never lose one another's. `std` mutexes held for
    /// a read and a write of the store, never across an await; striped so that their number
    /// stays fixed however many tasks come and go.
    writes: [Mutex<()>; WRITE_STRIPES],
    /// The health probes' outcomes, waiting for the reconcile to count them.
    probe_outcomes: probes::ProbeOutcomes,
    /// Every task as last saved, numbered by change, so that a manager following this worker
    /// is sent what changed since it last asked (not every task), and a blocking `GET /tasks`
    /// answers the moment a task changes. Its index starts at the task store's index, which
    /// only grows, survives restarts and is never below the index of an earlier run on the
    /// same store (each change here follows a write there); no change from before the start
    /// is kept. So "what changed after N" is exact for any N a manager got from this store
    /// in this run, and is every task when N is from before this run or from another store.
    /// In sync once loaded from the task store.
    observed: ObservedStore<Uuid, Task>,
    /// The tasks that are `Running` (a heartbeat counts them without walking every task) and
    /// the resources of those held, `Scheduled` or `Running`, which a new run must fit beside
    /// (`room.rs`). A `std` mutex: one update per save, never held across an await.
    held: Mutex<Held>,
    /// When each running, health-checked task is probed next.
    health: HealthSchedule,
    /// Pod containers' first health checks, run as they start (`first_check.rs`).
    first_checks: FirstChecks,
    /// The worker's metrics, for `GET /metrics`.
    metrics: WorkerMetrics,
    /// The container engine's version, once it answered (asked again until it does).
    engine: Mutex<Option<EngineVersion>>,
    /// Cancelled when the worker stops: long answers (followed logs, commands) end with it,
    /// so that they do not hold the server's graceful shutdown open.
    closing: CancellationToken,
    /// The managers this worker reports to (set by its heartbeat): where a run's secrets and
    /// registry login are fetched (`worker/secrets.rs`).
    managers: Mutex<Vec<cube_api::ApiClient>>,
}

impl<R: Runtime> Worker<R> {
    /// A worker; [`Worker::run_reconciles`] carries out what it is asked.
    pub fn new(
        config: WorkerConfig,
        tasks: Arc<dyn Store<Task>>,
        runtime: R,
        stats: StatsCollector,
    ) -> Arc<Worker<R>> {
        let runner = reconcile::runner_for(config.max_concurrent_operations);
        let (observed, held) = load_observed(tasks.as_ref());
        let metrics = WorkerMetrics::default();
        let worker = Worker {
            config,
            tasks,
            runtime: Metered::new(runtime, metrics.docker_calls.clone()),
            stats,
            runner,
            writes: std::array::from_fn(|_| Mutex::new(())),
            probe_outcomes: probes::ProbeOutcomes::default(),
            observed,
            held: Mutex::new(held),
            health: HealthSchedule::default(),
            first_checks: FirstChecks::default(),
            metrics,
            engine: Mutex::new(None),
            closing: CancellationToken::new(),
            managers: Mutex::new(Vec::new()),
        };
        Arc::new(worker)
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// `Ok` while the task store takes writes; once it has failed, the error every write gets.
    pub fn store_health(&self) -> Result<(), WorkerError> {
        Ok(self.tasks.health()?)
    }

    pub fn stats(&self) -> &StatsCollector {
        &self.stats
    }

    pub fn metrics(&self) -> &WorkerMetrics {
        &self.metrics
    }

    /// Cancelled once the worker stops.
    pub fn closing(&self) -> &CancellationToken {
        &self.closing
    }

    /// The container engine's version, asked once it is known (and again while not).
    pub async fn engine_version(&self) -> Option<EngineVersion> {
        if let Some(known) = lock_engine(&self.engine).clone() {
            return Some(known);
        }
        match self.runtime.engine_version().await {
            Ok(version) => {
                *lock_engine(&self.engine) = Some(version.clone());
                Some(version)
            }
            Err(err) => {
                tracing::debug!(error = %err, "cannot read the engine's version");
                None
            }
        }
    }

    /// This worker's build and, when known, its engine's version.
    pub async fn version(&self) -> cube_types::version::VersionInfo {
        let mut info = cube_types::version::VersionInfo::this_build();
        if let Some(engine) = self.engine_version().await {
            info.docker = Some(engine.version);
            info.docker_api_version = Some(engine.api_version);
        }
        info
    }

    // ----- requests from the API -----

    /// Takes a `TaskEvent`: `Running` (or `Scheduled`) asks for the task to run, `Completed`
    /// for it to stop. A new task is stored as `Scheduled` before this returns.
    pub async fn submit(&self, event: TaskEvent) -> Result<Submitted, WorkerError> {
        match event.state {
            State::Running | State::Scheduled => self.submit_run(event.task).await,
            State::Completed => self
                .request_stop(event.task.id)
                .await
                .map(Submitted::Existing),
            other => Err(WorkerError::BadRequest(format!(
                "State: a TaskEvent asks for Running (or Scheduled) to run a task or Completed to stop it; \
                 {other} cannot be asked for"
            ))),
        }
    }

    async fn submit_run(&self, mut task: Task) -> Result<Submitted, WorkerError> {
        // Refused before anything is stored: the manager fails the task with these words.
        self.config
            .pods
            .host_access
            .check(&task)
            .map_err(WorkerError::Refused)?;
        let _write = self.write_lock(task.id);
        if let Some(current) = self.tasks.get(&task.id.to_string())? {
            let new_run = current.status.state.is_terminal()
                && task.status.restart_count > current.status.restart_count;
            if !new_run {
                // Asking again for a task that runs or is starting changes nothing.
                checked_transition(&current, State::Running)?;
                return Ok(Submitted::Existing(current));
            }
            // The manager restarts a task that ended here (its restart count says so). The new
            // run's container has a name of its own; what is left of the last run's is
            // removed once the new one runs (`tidy`), off the restart's path.
            current
                .status
                .state
                .restart()
                .map_err(|transition| WorkerError::Conflict {
                    id: current.id,
                    transition,
                })?;
            tracing::info!(task = %task.id, restart = task.status.restart_count, "a new run of a task that ended here");
        }
        // The worker owns what it observes: whatever the submission said about a container
        // (or the manager's own records) is not this worker's to believe or keep; the run
        // number is the manager's and is kept.
        task.clear_status(Receiver::Worker);
        task.status.state = checked_transition(&task, State::Scheduled)?;
        task.status.node_name = self.config.name.as_str().into();
        if task.status.created_time.is_none() {
            task.status.created_time = Some(Utc::now());
        }
        lock_held(&self.held)
            .admit(&task, self.config.capacity)
            .map_err(|why| {
                WorkerError::NoRoom(format!(
                    "no room on {} for task {} ({}) now: {why}, counting every task it holds \
                     (runs being stopped among them); try again once they end",
                    self.config.name, task.name, task.id
                ))
            })?;
        if let Err(err) = self.put(&task) {
            lock_held(&self.held).forget(task.id);
            return Err(err);
        }
        self.runner.push(task.id);
        self.unless_closing()?;
        Ok(Submitted::Created(task))
    }

    /// Records that the user wants the task stopped and has the reconcile stop it. Stopping a task
    /// that already ended changes nothing (its stopped container stays until the task is
    /// purged).
    pub async fn request_stop(&self, id: Uuid) -> Result<Task, WorkerError> {
        self.request_stop_of_run(id, None).await
    }

    /// [`Worker::request_stop`] of one run of the task (its `RestartCount`), when `run` names
    /// one: a stop the manager sent for a run it replaced must not stop the new run that
    /// took its place here meanwhile. A stop of another run changes nothing.
    pub async fn request_stop_of_run(
        &self,
        id: Uuid,
        run: Option<u32>,
    ) -> Result<Task, WorkerError> {
        let _write = self.write_lock(id);
        let mut task = self
            .tasks
            .get(&id.to_string())?
            .ok_or(WorkerError::NotFound(id))?;
        if run.is_some_and(|run| run != task.status.restart_count) {
            tracing::info!(task = %id, ?run, current = task.status.restart_count, "a stop of another run of the task: nothing to do");
            return Ok(task);
        }
        if !task.status.state.is_terminal() && task.spec.desired_state != State::Completed {
            checked_transition(&task, State::Completed)?;
            task.spec.desired_state = State::Completed;
            self.put(&task)?;
        }
        // Of a task that ended, the reconcile makes sure that nothing of it still runs.
        self.runner.push(id);
        self.unless_closing()?;
        Ok(task)
    }

    pub fn task(&self, id: Uuid) -> Result<Task, WorkerError> {
        self.tasks
            .get(&id.to_string())?
            .ok_or(WorkerError::NotFound(id))
    }

    pub fn list_tasks(&self) -> Result<Vec<Task>, WorkerError> {
        Ok(self.tasks.list()?)
    }

    /// The index of the last change: it grows with every task saved that changed.
    pub fn change_index(&self) -> u64 {
        self.observed.index()
    }

    /// The tasks that changed after `since`, and the change index they bring the caller to.
    /// Index 0, an index from before this run or further back than the change log reaches,
    /// and one this worker never reached (the caller followed another store) get every task.
    pub fn tasks_changed_since(&self, since: u64) -> Result<(TaskChanges, u64), WorkerError> {
        if since == 0 {
            return self.all_tasks();
        }
        // `Expired` and `Ahead` both mean the caller must take every task.
        let Ok(deltas) = self.observed.changes_since(since) else {
            return self.all_tasks();
        };
        // Every change is in the log from `since` on, so the last one is the store's index.
        let index = deltas.last().map_or(since, |delta| delta.index);
        // A task changed twice is sent once, as it is now; the order is that of last changes.
        let mut seen = HashSet::new();
        let mut tasks = Vec::new();
        for delta in deltas.iter().rev() {
            if !seen.insert(delta.key) {
                continue;
            }
            match &delta.after {
                Some(task) => tasks.push(task.clone()),
                // A change list cannot say that a task is gone; the whole list can.
                None => return self.all_tasks(),
            }
        }
        tasks.reverse();
        Ok((TaskChanges::Since { since, tasks }, index))
    }

    /// Every task and the index it is at. From the observed tasks once they are loaded (one
    /// consistent snapshot); from the task store if they could not be loaded, reading the
    /// index first so that a change in between is sent again rather than missed.
    fn all_tasks(&self) -> Result<(TaskChanges, u64), WorkerError> {
        if self.observed.is_synced() {
            let snapshot = self.observed.snapshot();
            let tasks = snapshot.items.into_values().collect();
            return Ok((TaskChanges::All(tasks), snapshot.index));
        }
        let index = self.observed.index();
        let tasks = self.tasks.list()?.into_iter().map(Arc::new).collect();
        Ok((TaskChanges::All(tasks), index))
    }

    /// Waits until a task changed after `index`, or `wait` is over. An index this worker
    /// never reached (the caller followed another store, or this worker's store was
    /// replaced) is answered at once.
    /// A worker that stops answers at once, so that a manager's open query does not hold
    /// the server's graceful shutdown for the rest of its wait.
    pub async fn wait_for_change(&self, index: u64, wait: Duration) {
        let mut changes = self.observed.subscribe();
        tokio::select! {
            _ = self.closing.cancelled() => {}
            _ = tokio::time::timeout(wait, changes.wait_for(|current| *current != index)) => {}
        }
    }

    /// What this worker says about itself in heartbeats and on `GET /node`.
    pub fn node_report(&self) -> Result<NodeReport, WorkerError> {
        let stats = self.stats.collect(self.running_task_count()?)?;
        Ok(NodeReport {
            name: self.config.name.clone(),
            address: self.config.address.clone(),
            capacity: self.config.capacity,
            stats: Some(stats),
            labels: self.config.labels.clone(),
            host_policy: Some(self.config.pods.host_access.policy()),
            // Filled in by the heartbeat, which may ask the engine (`Worker::volumes`).
            volumes: Vec::new(),
            version: Some({
                let mut info = cube_types::version::VersionInfo::this_build();
                if let Some(engine) = lock_engine(&self.engine).clone() {
                    info.docker = Some(engine.version);
                    info.docker_api_version = Some(engine.api_version);
                }
                info
            }),
        })
    }

    /// `ShuttingDown` once the worker stops: what was stored is carried out by the next
    /// start's resync, not now, and the caller is told so (a manager sends it again).
    fn unless_closing(&self) -> Result<(), WorkerError> {
        if self.closing.is_cancelled() {
            return Err(WorkerError::ShuttingDown);
        }
        Ok(())
    }

    /// The write lock of the task's stripe (see `Worker::writes`).
    fn write_lock(&self, id: Uuid) -> std::sync::MutexGuard<'_, ()> {
        let stripe = (id.as_u128() % WRITE_STRIPES as u128) as usize;
        // Held for a read and a write of the store; nothing in between can panic half-way.
        self.writes[stripe]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Stores what the reconcile observed of a run (`task`, read before its calls to the
    /// engine), over the record as it is now: with the desired state the record has (a stop
    /// asked for meanwhile is kept, and carried out by the reconcile that follows), and not
    /// at all when the task was purged meanwhile or sent anew (another `RestartCount`).
    fn save(&self, task: &Task) -> Result<(), WorkerError> {
        let _write = self.write_lock(task.id);
        let Some(current) = self.tasks.get(&task.id.to_string())? else {
            tracing::debug!(task = %task.id, "removed meanwhile: not recorded");
            return Ok(());
        };
        if current.status.restart_count != task.status.restart_count {
            tracing::debug!(task = %task.id, run = task.status.restart_count, current = current.status.restart_count, "a new run arrived meanwhile: the old run's observation is not recorded");
            return Ok(());
        }
        if current.spec.desired_state == task.spec.desired_state {
            return self.put(task);
        }
        let mut merged = task.clone();
        merged.spec.desired_state = current.spec.desired_state;
        self.put(&merged)
    }

    /// Stores the task, then records it as observed, which wakes the blocking queries
    /// waiting for a change. Callers hold the task's write lock, so the two happen in the
    /// same order for one task.
    fn put(&self, task: &Task) -> Result<(), WorkerError> {
        self.tasks.put(&task.id.to_string(), task)?;
        lock_held(&self.held).record(task);
        self.health.track(task);
        self.observed.apply(Change::put(task.id, task.clone()));
        Ok(())
    }

    /// How many tasks are `Running`, as the worker last recorded them.
    pub fn running_task_count(&self) -> Result<usize, WorkerError> {
        Ok(lock_held(&self.held).running())
    }

    // ----- output, commands and purges -----

    /// The output of the task's container (of its current run), as the engine kept it,
    /// and with `follow` what it writes until it stops. A task whose container was never
    /// created has none yet.
    pub fn logs(
        &self,
        id: Uuid,
        options: &LogOptions,
        container: Option<&str>,
    ) -> Result<BoxStream<'static, Result<OutputChunk, RuntimeError>>, WorkerError> {
        let task = self.task(id)?;
        let container_id = Worker::<R>::container_for(&task, container)?;
        if task.status.run.container_id.is_empty() {
            return Err(WorkerError::WrongState(format!(
                "task {} ({id}) has no container yet: it is {}{}",
                task.name,
                task.status.state,
                task.status
                    .run
                    .error
                    .as_deref()
                    .map(|error| format!(" ({error})"))
                    .unwrap_or_default()
            )));
        }
        Ok(self.runtime.logs(&container_id, options))
    }

    /// The task once its run has ended, waiting at most `bound` for the worker to record the
    /// end (a followed log ends when the container stops; the record follows within
    /// milliseconds, from Docker's `die` event). The task as it is when the bound is over.
    pub async fn await_end(&self, id: Uuid, bound: Duration) -> Result<Task, WorkerError> {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let mut changes = self.observed.subscribe();
            let task = self.task(id)?;
            if task.status.state.is_terminal() || tokio::time::Instant::now() >= deadline {
                return Ok(task);
            }
            tokio::select! {
                _ = self.closing.cancelled() => return Ok(task),
                _ = tokio::time::sleep_until(deadline) => {}
                _ = changes.changed() => {}
            }
        }
    }

    /// Starts `cmd` in the task's running container; of a pod's, the one named `container`
    /// (a service's name), or its first service's.
    pub async fn exec(
        &self,
        id: Uuid,
        cmd: &[String],
        container: Option<&str>,
        tty: bool,
        stdin: bool,
    ) -> Result<ExecSession, WorkerError> {
        let task = self.task(id)?;
        if task.status.state != State::Running || task.status.run.container_id.is_empty() {
            return Err(WorkerError::WrongState(format!(
                "task {} ({id}) is {}: a command runs only in a Running task",
                task.name, task.status.state
            )));
        }
        if cmd.is_empty() {
            return Err(WorkerError::BadRequest(
                "Cmd: the command to run is empty".to_string(),
            ));
        }
        // A pod's command runs in the service named, or its first.
        let container_id = match &task.spec.pod {
            Some(pod) => Worker::<R>::container_for(
                &task,
                container.or_else(|| pod.service_names().first().copied()),
            )?,
            None => Worker::<R>::container_for(&task, container)?,
        };
        self.runtime
            .exec(&container_id, cmd, tty, stdin)
            .await
            .map_err(|err| match err {
                // The record says Running a moment before the engine's end is recorded.
                RuntimeError::NotRunning(_) | RuntimeError::NotFound(_) => {
                    WorkerError::WrongState(format!(
                        "task {} ({id}): its container is not running (it has just ended or \
                         is stopping): a command runs only in a running container",
                        task.name
                    ))
                }
                other => WorkerError::Runtime(other.to_string()),
            })
    }

    /// The exit code of a command [`Worker::exec`] started, once the engine has it: asked
    /// when its output has ended, which is when the engine is about to record the exit; it is
    /// asked again a few times, 20 ms apart, before giving up with `None`.
    pub async fn exec_exit_code(&self, exec_id: &str) -> Option<i64> {
        for _ in 0..50 {
            match self.runtime.exec_exit_code(exec_id).await {
                Ok(Some(code)) => return Some(code),
                Ok(None) => tokio::time::sleep(Duration::from_millis(20)).await,
                Err(err) => {
                    tracing::warn!(exec = exec_id, error = %err, "cannot read a command's exit code");
                    return None;
                }
            }
        }
        None
    }

    /// Sets the terminal size of a command started with a terminal.
    pub async fn resize_exec(&self, exec_id: &str, width: u16, height: u16) {
        if let Err(err) = self.runtime.resize_exec(exec_id, width, height).await {
            tracing::debug!(exec = exec_id, error = %err, "cannot resize a command's terminal");
        }
    }

    /// Forgets a task that ended: removes every container it has on this node (its output
    /// with them) and its record. A task that has not ended is refused: stop it first.
    /// Purging a task this worker does not have changes nothing.
    pub async fn purge(&self, id: Uuid) -> Result<(), WorkerError> {
        let Some(task) = self.tasks.get(&id.to_string())? else {
            return Ok(());
        };
        if !task.status.state.is_terminal() {
            return Err(WorkerError::WrongState(format!(
                "task {} ({id}) is {}: stop it before it is removed",
                task.name, task.status.state
            )));
        }
        let containers = self
            .runtime
            .list_managed(&self.config.name)
            .await
            .map_err(|err| WorkerError::Runtime(err.to_string()))?;
        for container in containers.iter().filter(|info| info.task_id == Some(id)) {
            self.runtime
                .remove(&container.id)
                .await
                .map_err(|err| WorkerError::Runtime(err.to_string()))?;
        }
        {
            let _write = self.write_lock(id);
            // A new run sent while the containers were removed is kept (its record says so).
            match self.tasks.get(&id.to_string())? {
                Some(current)
                    if current.status.state.is_terminal()
                        && current.status.restart_count == task.status.restart_count => {}
                Some(_) => {
                    tracing::warn!(task = %id, "a new run arrived while the task was removed: kept");
                    return Ok(());
                }
                None => return Ok(()),
            }
            self.tasks.delete(&id.to_string())?;
            lock_held(&self.held).forget(id);
            self.observed.apply(Change::Delete(id));
        }
        self.runner.forget(&id);
        self.probe_outcomes.take(id);
        tracing::info!(task = %id, name = %task.name, "task removed with its containers");
        Ok(())
    }

    /// How many tasks this worker has in each state, and how many containers it keeps
    /// (running, or stopped with their output), for `GET /metrics`.
    pub fn task_counts(&self) -> (Vec<(State, usize)>, usize, usize) {
        let snapshot = self.observed.snapshot();
        let mut counts: HashMap<State, usize> = HashMap::new();
        let (mut running, mut exited) = (0, 0);
        for task in snapshot.items.values() {
            *counts.entry(task.status.state).or_default() += 1;
            if task.status.run.container_id.is_empty() {
                continue;
            }
            if task.status.state == State::Running {
                running += 1;
            } else if task.status.state.is_terminal() {
                exited += 1;
            }
        }
        let counts = cube_types::state::ALL_STATES
            .into_iter()
            .map(|state| (state, counts.get(&state).copied().unwrap_or(0)))
            .collect();
        (counts, running, exited)
    }

    // ----- what the reconcile records -----

    /// Removes the containers of the task's earlier runs on this node: every container
    /// labelled with the task but not the current run's (recorded in `task`).
    async fn tidy(&self, task: &Task) -> Result<(), WorkerError> {
        let containers = self
            .runtime
            .list_managed(&self.config.name)
            .await
            .map_err(|err| WorkerError::Runtime(err.to_string()))?;
        let current = Worker::<R>::current_containers(task);
        for leftover in containers
            .iter()
            .filter(|info| info.task_id == Some(task.id) && !current.contains(&info.id))
        {
            if let Err(err) = self.runtime.remove(&leftover.id).await {
                tracing::warn!(task = %task.id, container = %leftover.id, error = %err, "cannot remove an earlier run's container");
            }
        }
        Ok(())
    }

    /// The task's container: by the ID recorded, else by the name derived from the task and
    /// this node, and only if its labels say it is this task's on this node (another worker
    /// on the same Docker engine may run a copy of the task, and a container is never handed
    /// to a task it was not made for, whatever its name).
    async fn find_container(&self, task: &Task) -> Result<Option<ContainerInfo>, RuntimeError> {
        let mine = |info: &ContainerInfo| {
            info.node.as_deref() == Some(self.config.name.as_str()) && info.task_id == Some(task.id)
        };
        if !task.status.run.container_id.is_empty()
            && let Some(info) = self.runtime.inspect(&task.status.run.container_id).await?
            && mine(&info)
        {
            return Ok(Some(info));
        }
        Ok(self
            .runtime
            .inspect(&container_name(task, &self.config.name))
            .await?
            .filter(mine))
    }

    /// Records what the container shows: running, or exited with a code.
    fn observe(&self, mut task: Task, info: ContainerInfo) -> Result<(), WorkerError> {
        let next = if info.running {
            State::Running
        } else if info.exit_code == Some(0) && !info.oom_killed {
            State::Completed
        } else {
            State::Failed
        };
        let before = task.status.state;
        if let Err(transition) = task.move_to(next) {
            tracing::debug!(task = %task.id, %transition, "observation ignored");
            return Ok(());
        }
        // An ended run's ports are no longer bound, whatever the engine still lists for the
        // stopped container: a task that ended shows none.
        let host_ports = if next == State::Running {
            info.host_ports.clone()
        } else {
            Default::default()
        };
        let changed = before != next
            || task.status.run.container_id != info.id
            || task.status.run.host_ports != host_ports;
        if next == State::Running && task.has_health_check() && task.status.run.health.is_none() {
            // Not healthy until a probe says so.
            task.status.run.health = Some(Health::Starting);
        }
        task.status.run.container_id = info.id.clone();
        task.status.run.host_ports = host_ports;
        task.status.run.start_time = info.started_at.or(task.status.run.start_time);
        if next != State::Running {
            task.status.run.exit_code = info.exit_code;
            task.status.run.finish_time = info.finished_at.or_else(|| Some(Utc::now()));
            task.status.run.error = (next == State::Failed).then(|| exit_reason(&info, &task));
        }
        if changed {
            self.save(&task)?;
            tracing::info!(task = %task.id, name = %task.name, state = %task.status.state, exit_code = ?task.status.run.exit_code, "task state changed");
        }
        Ok(())
    }

    /// The task failed for `reason`, unless it had already ended.
    fn fail(&self, mut task: Task, reason: String) -> Result<(), WorkerError> {
        if task.move_to(State::Failed).is_err() {
            return Ok(());
        }
        tracing::warn!(task = %task.id, name = %task.name, %reason, "task failed");
        // The container's own finish time, when it had one, is the truth; now otherwise.
        task.status.run.finish_time.get_or_insert_with(Utc::now);
        task.status.run.error = Some(reason);
        // The run is over (or never began): no port of it stays bound.
        task.status.run.host_ports.clear();
        self.save(&task)?;
        Ok(())
    }

    /// An operation that did not go through: the task keeps its state, and says why.
    fn record_error(&self, mut task: Task, reason: String) -> Result<(), WorkerError> {
        tracing::warn!(task = %task.id, %reason, "operation failed; the next resync tries again");
        task.status.run.error = Some(reason);
        self.save(&task)?;
        Ok(())
    }
}

/// The observed tasks, loaded from the task store and numbered from its index (see
/// `Worker::observed`), and the ones that are `Running`. A store that cannot be read leaves
/// them empty and out of sync: every-task answers then read the store itself.
fn load_observed(tasks: &dyn Store<Task>) -> (ObservedStore<Uuid, Task>, Held) {
    let index = tasks.index().unwrap_or(0);
    let stored = match tasks.list() {
        Ok(stored) => Some(stored),
        Err(err) => {
            tracing::error!(error = %err, "cannot read the task store to load the tasks");
            None
        }
    };
    let held = Held::of(stored.iter().flatten());
    let loaded = stored.is_some();
    let items = stored
        .into_iter()
        .flatten()
        .map(|task| (task.id, Arc::new(task)));
    let observed = ObservedStore::starting_at(index, items, CHANGE_LOG_CAPACITY);
    observed.set_synced(loaded);
    (observed, held)
}

fn lock_engine(
    engine: &Mutex<Option<EngineVersion>>,
) -> std::sync::MutexGuard<'_, Option<EngineVersion>> {
    // Held for a clone or an assignment.
    engine
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn lock_held(held: &Mutex<Held>) -> std::sync::MutexGuard<'_, Held> {
    // Each critical section is one admission or one record, with no await inside.
    held.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The table's answer for moving `task` to `next`, as the error the API turns into a 409.
fn checked_transition(task: &Task, next: State) -> Result<State, WorkerError> {
    task.status
        .state
        .transition(next)
        .map_err(|transition| WorkerError::Conflict {
            id: task.id,
            transition,
        })
}

/// Why a container ended badly, in words.
fn exit_reason(info: &ContainerInfo, task: &Task) -> String {
    if info.oom_killed {
        return format!(
            "killed for using more than its memory limit of {} bytes",
            task.spec.memory
        );
    }
    let mut reason = match info.exit_code {
        Some(137) => "killed (exit code 137, SIGKILL)".to_string(),
        Some(code) => format!("exited with code {code}"),
        None => "ended without an exit code".to_string(),
    };
    if !info.error.is_empty() {
        reason.push_str(": ");
        reason.push_str(&info.error);
    }
    reason
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use cube_runtime::{ContainerSpec, RuntimeEvent};
    use cube_store::{PersistentDb, PersistentStore};
    use futures_util::StreamExt;
    use futures_util::stream::BoxStream;

    use super::*;

    /// A runtime the tests below never reach: they only store tasks and queue commands.
    struct NoRuntime;

    fn unused() -> RuntimeError {
        RuntimeError::Unavailable("no container runtime in this test".to_string())
    }

    impl Runtime for NoRuntime {
        async fn ensure_image(&self, _image: &str) -> Result<(), RuntimeError> {
            Err(unused())
        }
        async fn create(&self, _spec: &ContainerSpec) -> Result<String, RuntimeError> {
            Err(unused())
        }
        async fn start(&self, _container_id: &str) -> Result<(), RuntimeError> {
            Err(unused())
        }
        async fn stop(&self, _container_id: &str, _timeout: Duration) -> Result<(), RuntimeError> {
            Err(unused())
        }
        async fn remove(&self, _container_id: &str) -> Result<(), RuntimeError> {
            Err(unused())
        }
        async fn inspect(
            &self,
            _container_id: &str,
        ) -> Result<Option<ContainerInfo>, RuntimeError> {
            Err(unused())
        }
        async fn list_managed(&self, _node: &str) -> Result<Vec<ContainerInfo>, RuntimeError> {
            Err(unused())
        }
        fn events_since(
            &self,
            _node: &str,
            _since_unix_secs: i64,
        ) -> BoxStream<'static, Result<RuntimeEvent, RuntimeError>> {
            futures_util::stream::empty().boxed()
        }
    }

    /// A worker on the redb file at `path` whose reconciles do not run (nothing carries out
    /// what it is asked).
    fn worker_on(path: &Path) -> Arc<Worker<NoRuntime>> {
        let db = PersistentDb::open(path).unwrap();
        let tasks = Arc::new(PersistentStore::<Task>::new(db, "tasks").unwrap());
        let config = WorkerConfig {
            name: "w1".to_string(),
            address: "http://127.0.0.1:1".to_string(),
            capacity: Resources::default(),
            stop_timeout: Duration::from_secs(1),
            max_concurrent_operations: 1,
            labels: Labels::default(),
            pods: PodSettings::default(),
        };
        let data_dir = path.parent().unwrap_or(path);
        Worker::new(config, tasks, NoRuntime, StatsCollector::new(data_dir))
    }

    /// The worker's `GET /tasks` over HTTP, with `?ring=16&shards=` a manager acting for
    /// some shards sends: only those shards' tasks, in the whole list and in the changes
    /// after an index alike; a scope it cannot read is a 400 naming what is wrong.
    #[tokio::test]
    async fn a_list_asked_for_some_shards_holds_only_their_tasks() {
        let dir = tempfile::tempdir().unwrap();
        let worker = worker_on(&dir.path().join("worker.redb"));
        let ring = cube_types::shard::DEFAULT_RING;
        let shard = |project: &str| cube_types::shard::shard_of(project, ring);
        // Two projects of two shards.
        let first = "alpha";
        let second = (0..)
            .map(|n| format!("p-{n}"))
            .find(|project| shard(project) != shard(first))
            .unwrap();
        let mut ids = std::collections::HashMap::new();
        for project in [first, second.as_str()] {
            let mut task = Task::new(project, "img");
            task.spec.project = project.to_string();
            ids.insert(project.to_string(), task.id);
            let event = TaskEvent {
                id: Uuid::new_v4(),
                state: State::Running,
                timestamp: None,
                task,
            };
            worker.submit(event).await.unwrap();
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server =
            tokio::spawn(
                async move { axum::serve(listener, crate::api::router(worker.clone())).await },
            );
        let client = cube_api::ApiClient::new(&base, Duration::from_secs(5)).unwrap();
        let listed = |path: String| {
            let client = client.clone();
            async move {
                let (tasks, _) = client
                    .get_blocking::<Vec<Task>>(&path, 0, Duration::ZERO)
                    .await
                    .unwrap();
                tasks.into_iter().map(|task| task.id).collect::<Vec<_>>()
            }
        };
        let of_first = format!("/tasks?ring={ring}&shards={}", shard(first));
        assert_eq!(listed(of_first.clone()).await, vec![ids[first]]);
        let both =
            cube_types::shard::ShardScope::of(ring, [shard(first), shard(&second)]).to_param();
        let mut all = listed(format!("/tasks?ring={ring}&shards={both}")).await;
        all.sort();
        let mut expected: Vec<Uuid> = ids.values().copied().collect();
        expected.sort();
        assert_eq!(all, expected);
        assert!(
            listed(format!("/tasks?ring={ring}&shards="))
                .await
                .is_empty()
        );
        let changes = client
            .get_changes::<Vec<Task>>(&of_first, 0, Duration::ZERO)
            .await
            .unwrap();
        assert!(changes.complete);
        let changed: Vec<Uuid> = changes.body.iter().map(|task| task.id).collect();
        assert_eq!(changed, vec![ids[first]]);
        for (bad, named) in [
            (format!("/tasks?ring={ring}&shards={ring}"), "past the end"),
            ("/tasks?shards=1".to_string(), "go together"),
            (format!("/tasks?ring={ring}&shards=x"), "not a shard number"),
            ("/tasks?ring=4000000000&shards=1".to_string(), "1 to 4096"),
        ] {
            let err = client.get::<Vec<Task>>(&bad).await.unwrap_err();
            assert_eq!(
                err.status(),
                Some(axum::http::StatusCode::BAD_REQUEST),
                "{bad}"
            );
            assert!(err.to_string().contains(named), "{bad}: {err}");
        }
        server.abort();
    }

    async fn submit(worker: &Worker<NoRuntime>, name: &str) -> Uuid {
        let task = Task::new(name, "img");
        let event = TaskEvent {
            id: Uuid::new_v4(),
            state: State::Running,
            timestamp: None,
            task: task.clone(),
        };
        worker.submit(event).await.unwrap();
        task.id
    }

    fn since(worker: &Worker<NoRuntime>, index: u64) -> (Option<Vec<Uuid>>, u64) {
        match worker.tasks_changed_since(index).unwrap() {
            (TaskChanges::Since { tasks, .. }, index) => {
                (Some(tasks.iter().map(|task| task.id).collect()), index)
            }
            (TaskChanges::All(_), index) => (None, index),
        }
    }

    #[tokio::test]
    async fn changes_after_an_index_stay_exact_across_a_restart_on_the_same_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("worker.redb");

        let worker = worker_on(&path);
        assert!(worker.observed.is_synced());
        let first = submit(&worker, "first").await;
        let before_second = worker.change_index();
        let second = submit(&worker, "second").await;
        worker.request_stop(first).await.unwrap();
        let (changed, last_index) = since(&worker, before_second);
        assert_eq!(
            changed,
            Some(vec![second, first]),
            "in the order they last changed"
        );
        assert_eq!(last_index, worker.change_index());
        assert_eq!(since(&worker, last_index), (Some(vec![]), last_index));
        drop(worker);

        let worker = worker_on(&path);
        assert!(worker.observed.is_synced());
        assert_eq!(worker.running_task_count().unwrap(), 0);
        assert_eq!(
            since(&worker, last_index),
            (Some(vec![]), worker.change_index()),
            "nothing changed after the last index of the run before"
        );
        assert_eq!(
            since(&worker, before_second).0,
            None,
            "changes from before this run are not kept: every task"
        );
        let restarted_at = worker.change_index();
        worker.request_stop(second).await.unwrap();
        assert_eq!(
            since(&worker, restarted_at),
            (Some(vec![second]), restarted_at + 1)
        );
        assert_eq!(since(&worker, 0).0, None, "index 0 asks for every task");
        assert_eq!(
            since(&worker, restarted_at + 100).0,
            None,
            "an index this store never reached"
        );
        match worker.tasks_changed_since(0).unwrap().0 {
            TaskChanges::All(tasks) => assert_eq!(tasks.len(), 2),
            other => panic!("expected every task, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_blocking_query_answers_when_a_task_changes() {
        let dir = tempfile::tempdir().unwrap();
        let worker = worker_on(&dir.path().join("worker.redb"));
        let id = submit(&worker, "t").await;
        let index = worker.change_index();
        let started = tokio::time::Instant::now();
        let query = tokio::spawn({
            let worker = worker.clone();
            async move { worker.wait_for_change(index, Duration::from_secs(60)).await }
        });
        tokio::task::yield_now().await;
        assert!(!query.is_finished(), "nothing changed after {index} yet");
        worker.request_stop(id).await.unwrap();
        query.await.unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "woken by the change"
        );
        let ahead = worker.change_index() + 5;
        worker.wait_for_change(ahead, Duration::from_secs(60)).await;
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "an index never reached answers at once"
        );
    }
}
