//! The manager's state and the operations on it: submissions, stops, node reports,
//! observations from workers, and the task controller that reconciles desired against
//! observed state.
//!
//! Everything in memory sits behind one `std` mutex ([`Manager::state`]): each operation
//! holds it for a few map operations, never across an `.await` or an fsync, so placements see
//! a consistent view of every node's allocations. A write is queued to the store under the
//! lock (queued writes keep their order) and applied to the cache at once; it is waited for
//! after the lock is let go ([`Writes`]), and nothing is acknowledged to a client or sent to
//! a worker before it is durable. Concurrent writes share one commit. Calls to workers are
//! made outside the lock.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use cube_api::{ApiClient, Changes, ClientError};
use cube_scheduler::{
    Decision, FilterChain, NodeView, Scheduler, TaskRequest, summarize_rejections,
};
use cube_store::{Commit, Store, StoreError};
use cube_types::job::JobRecord;
use cube_types::{Health, Node, NodeReport, State, Task, TaskEvent};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::cache::{TaskCache, holds_resources};
use crate::log_limit::LogLimit;
use crate::nodes::{NodeRegistry, NodeSource};
use crate::queue::WorkQueue;
use crate::reconcile::{Action, reconcile};

/// The history event recorded when the restart limit stops further restarts.
pub const GAVE_UP: &str = "RestartLimit";

/// How long a blocking query to a worker waits before the worker answers anyway.
const FOLLOW_WAIT: Duration = Duration::from_secs(30);

/// How long to wait before following a worker again after its API could not be reached.
const FOLLOW_RETRY: Duration = Duration::from_secs(1);

/// How many nodes' whole task lists are read at once (see `Manager::complete_lists`).
const COMPLETE_LISTS_AT_ONCE: usize = 2;

/// The first delay before a failed reconcile is tried again; it doubles up to the cap.
const RETRY_FIRST: Duration = Duration::from_millis(250);
const RETRY_CAP: Duration = Duration::from_secs(10);

/// Settings that do not change while the manager runs.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// A node that has not reported for this long is `Down`: nothing new is placed on it.
    pub heartbeat_grace: Duration,
    /// How often the manager asks a static (`-w`) worker for its report.
    pub poll_interval: Duration,
    /// How often every task is reconciled even if no event asked for it (anti-entropy).
    pub resync_interval: Duration,
    /// Workers the manager reaches itself (`-w host:port,...`), the book's way.
    pub static_workers: Vec<String>,
    /// The timeout of every request to a worker (blocking queries add their wait).
    pub request_timeout: Duration,
    /// How many tasks are reconciled at the same time (each may wait on a worker).
    pub max_concurrent_reconciles: usize,
}

/// Where the manager keeps its state: tasks (desired and observed state, and the node each
/// is placed on), every `TaskEvent` received, and the nodes that joined.
#[derive(Clone)]
pub struct ManagerStores {
    pub tasks: Arc<dyn Store<Task>>,
    pub events: Arc<dyn Store<TaskEvent>>,
    pub nodes: Arc<dyn Store<Node>>,
    pub jobs: Arc<dyn Store<JobRecord>>,
}

/// Why a request was refused or failed. Turned into an HTTP status in one place, `api.rs`.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error("no task with ID {0}")]
    NotFound(Uuid),
    #[error("no node named {0:?}")]
    NodeNotFound(String),
    #[error("no job named {0:?}")]
    JobNotFound(String),
    #[error("{0}")]
    BadRequest(String),
    /// The request contradicts what is stored (a task ID resubmitted with another spec).
    #[error("{0}")]
    Conflict(String),
    #[error("store failed: {0}")]
    Store(#[from] StoreError),
}

/// What a submission did: created a task, or found it already there.
#[derive(Debug, Clone, PartialEq)]
pub enum Submitted {
    Created(Task),
    Existing(Task),
}

/// How a reconcile ended: converged (for now), to be looked at again after a wait it chose
/// (a restart's backoff), or failed and to be tried again after the error backoff.
#[derive(Debug)]
enum Outcome {
    Done,
    After(Duration),
    Retry(String),
}

/// Where a task could go now: `GET /tasks/{id}/placement`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Placement {
    #[serde(rename = "ID")]
    pub id: Uuid,
    #[serde(rename = "State")]
    pub state: State,
    /// The node it is placed on, if it is.
    #[serde(rename = "NodeName")]
    pub node_name: String,
    /// When no node fits: the reasons, counted (what `PendingReason` says).
    #[serde(rename = "Summary", skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Every node, whether it could take the task now, and why not.
    #[serde(rename = "Nodes")]
    pub nodes: Vec<NodePlacement>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct NodePlacement {
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Fits")]
    pub fits: bool,
    #[serde(rename = "Reason", skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A task whose reconcile keeps failing.
#[derive(Debug, Clone)]
struct Retrying {
    attempts: u32,
    error: String,
    next_attempt: DateTime<Utc>,
}

/// The writes one operation queued under the lock, to be waited for once it let go.
#[derive(Default)]
#[must_use = "queued writes must be waited for before anything is acknowledged"]
pub(crate) struct Writes(Vec<(Uuid, Commit)>);

impl Writes {
    pub(crate) fn push(&mut self, id: Uuid, commit: Commit) {
        self.0.push((id, commit));
    }
}

/// The manager.
pub struct Manager {
    pub(crate) config: ManagerConfig,
    pub(crate) stores: ManagerStores,
    /// The task cache, the node registry and the scheduler; see the module comment.
    pub(crate) state: Mutex<Shared>,
    /// Task IDs to reconcile.
    pub(crate) queue: WorkQueue,
    /// Tasks whose reconcile keeps failing (a node that cannot be reached, a store error):
    /// the attempts for the backoff, the last error and the next attempt, which the API shows
    /// on the task (`DispatchError`, `NextAttempt`). Not stored: it describes this process's
    /// attempts. A `std` mutex: map access only.
    failures: Mutex<HashMap<Uuid, Retrying>>,
    /// Tasks this process has handed to their worker, so that a task is not sent again on
    /// every reconcile while it starts. Forgotten on restart: sending again is harmless.
    dispatched: Mutex<HashSet<Uuid>>,
    /// The loop following each node's tasks, by node name, to stop it when the node moves.
    followers: Mutex<HashMap<String, CancellationToken>>,
    /// Permits to read a node's whole task list. A manager that starts, or that many nodes
    /// come back to, would otherwise hold every node's list in memory at once.
    complete_lists: tokio::sync::Semaphore,
    /// Cancelled when the manager stops; every loop watches it.
    pub(crate) shutdown: CancellationToken,
    /// "reconcile did not converge", written at most once every 5 s.
    retry_warnings: LogLimit,
    /// Jobs to look at again (their spec, their tasks or the nodes changed), and the wake-up
    /// of the job controller (`job_controller.rs`). A `std` mutex: set operations only.
    pub(crate) jobs_dirty: Mutex<BTreeSet<String>>,
    pub(crate) jobs_wake: tokio::sync::Notify,
}

pub(crate) struct Shared {
    pub(crate) cache: TaskCache,
    pub(crate) nodes: NodeRegistry,
    pub(crate) scheduler: Box<dyn Scheduler>,
    /// Every job by name, as stored.
    pub(crate) jobs: BTreeMap<String, Arc<JobRecord>>,
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Each critical section updates the store before the cache, and the cache in one call,
    // so a panic inside one leaves nothing half-written that a later reader could trip on.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Manager {
    /// A manager with every task and node in `stores` loaded.
    pub fn open(
        config: ManagerConfig,
        stores: ManagerStores,
        scheduler: Box<dyn Scheduler>,
        shutdown: CancellationToken,
    ) -> Result<Arc<Manager>, ManagerError> {
        let mut cache = TaskCache::default();
        stores.tasks.scan(&mut |task| {
            cache.insert(task);
        })?;
        let mut jobs = BTreeMap::new();
        stores.jobs.scan(&mut |record: JobRecord| {
            jobs.insert(record.job.name.clone(), Arc::new(record));
        })?;
        let mut nodes = NodeRegistry::default();
        for node in stores.nodes.list()? {
            match ApiClient::new(&node.address, config.request_timeout) {
                Ok(client) => nodes.load(&node, client),
                Err(err) => {
                    tracing::warn!(node = %node.name, error = %err, "forgetting a stored node")
                }
            }
        }
        Ok(Arc::new(Manager {
            config,
            stores,
            state: Mutex::new(Shared {
                cache,
                nodes,
                scheduler,
                jobs,
            }),
            jobs_dirty: Mutex::new(BTreeSet::new()),
            jobs_wake: tokio::sync::Notify::new(),
            queue: WorkQueue::default(),
            failures: Mutex::new(HashMap::new()),
            dispatched: Mutex::new(HashSet::new()),
            followers: Mutex::new(HashMap::new()),
            complete_lists: tokio::sync::Semaphore::new(COMPLETE_LISTS_AT_ONCE),
            shutdown,
            retry_warnings: LogLimit::new(Duration::from_secs(5)),
        }))
    }

    pub fn scheduler_name(&self) -> &'static str {
        lock(&self.state).scheduler.name()
    }

    /// `Ok` while the stores take writes; once one has failed, the error every write gets.
    pub fn store_health(&self) -> Result<(), ManagerError> {
        self.stores.tasks.health()?;
        self.stores.events.health()?;
        self.stores.nodes.health()?;
        self.stores.jobs.health()?;
        Ok(())
    }

    /// A number that moves with every write to the manager's stores, and only then: the sum
    /// of their revisions (the tables of one store file share one revision, so there the sum
    /// moves by four per write; it is a witness of writes, not a count). A test of a quiet
    /// cluster reads it.
    pub fn store_revision(&self) -> Result<u64, ManagerError> {
        Ok(self.stores.tasks.revision()?
            + self.stores.jobs.revision()?
            + self.stores.nodes.revision()?
            + self.stores.events.revision()?)
    }

    /// A consistent copy of the manager's store file (its tables share one file), to read.
    pub fn backup_store(&self) -> Result<std::fs::File, ManagerError> {
        Ok(self.stores.tasks.backup()?)
    }

    // ----- requests from the API -----

    /// Takes a `TaskEvent`: `Running` (or `Scheduled`) asks for a task to run, `Completed`
    /// for it to stop. A new task is stored `Pending` (durably, with the persistent store)
    /// before this returns, and queued for placement.
    pub async fn submit(&self, event: TaskEvent) -> Result<Submitted, ManagerError> {
        match event.state {
            State::Running | State::Scheduled => {}
            State::Completed => {
                return self
                    .request_stop(event.task.id)
                    .await
                    .map(Submitted::Existing);
            }
            other => {
                return Err(ManagerError::BadRequest(format!(
                    "State: a TaskEvent asks for Running to run a task or Completed to stop it; \
                     {other} cannot be asked for"
                )));
            }
        }
        let id = event.task.id;
        {
            let state = lock(&self.state);
            if let Some(existing) = state.cache.get(&id) {
                // The same submission again is a no-op; a changed one is not an update.
                let differences = existing.spec_differences(&event.task);
                if differences.is_empty() {
                    return Ok(Submitted::Existing(existing.clone()));
                }
                return Err(ManagerError::Conflict(format!(
                    "task {id} exists and this submission differs from it in {}; a task's spec \
                     does not change once submitted: stop it and submit the new spec without an \
                     ID (or with a new one), or run it as a job (cube job run), whose spec \
                     may change",
                    differences.join(", ")
                )));
            }
        }
        if !event.task.job.is_empty() || !event.task.group.is_empty() || event.task.index.is_some()
        {
            return Err(ManagerError::BadRequest(
                "Job, Group, Index: set by Cube on the tasks of a job; submit a job with POST \
                 /jobs (cube job run) instead"
                    .to_string(),
            ));
        }
        // The manager owns placement and observation: whatever the submission said about
        // them (state, restarts, history, ...) is not the manager's to believe.
        let task = event.task.clone();
        let task = self.accept_task(task, Some(&event)).await?;
        Ok(Submitted::Created(task))
    }

    /// Records that the user wants the task stopped and queues the stop.
    pub async fn request_stop(&self, id: Uuid) -> Result<Task, ManagerError> {
        let mut writes = Writes::default();
        let task = {
            let mut state = lock(&self.state);
            let mut task = state
                .cache
                .get(&id)
                .cloned()
                .ok_or(ManagerError::NotFound(id))?;
            // A stop is final at any moment: also for a run that ended and waits out its
            // restart backoff, whose restart it cancels (the policy would restart it while
            // the desired state says Running).
            if task.desired_state != State::Completed {
                let message = if task.next_restart.is_some() {
                    "the restart it waited for is cancelled"
                } else {
                    ""
                };
                task.desired_state = State::Completed;
                task.next_restart = None;
                task.record(Utc::now(), "StopRequested", message);
                self.save(&mut state, &mut writes, task.clone())?;
            }
            task
        };
        self.settle(writes).await?;
        self.queue.push(id);
        Ok(task)
    }

    pub fn task(&self, id: Uuid) -> Result<Arc<Task>, ManagerError> {
        let task = lock(&self.state)
            .cache
            .shared(&id)
            .ok_or(ManagerError::NotFound(id))?;
        Ok(self.with_attempts(task, &lock(&self.failures)))
    }

    /// A page of tasks, oldest first (see `TaskCache::page`), and where the next one starts.
    /// `None` when `start` names no task.
    pub fn tasks_page(
        &self,
        start: Option<Uuid>,
        limit: usize,
        keep: impl Fn(&Task) -> bool,
    ) -> Option<(Vec<Arc<Task>>, Option<Uuid>)> {
        let (page, next) = lock(&self.state).cache.page(start, limit, keep)?;
        let failures = lock(&self.failures);
        let page = page
            .into_iter()
            .map(|task| self.with_attempts(task, &failures))
            .collect();
        Some((page, next))
    }

    /// The task with the manager's failing attempts to act on it, if any: what keeps it
    /// `Scheduled` (or stopping) is shown with it, not only in the manager's log.
    fn with_attempts(&self, task: Arc<Task>, failures: &HashMap<Uuid, Retrying>) -> Arc<Task> {
        match failures.get(&task.id) {
            Some(retrying) if !task.state.is_terminal() || task.next_restart.is_some() => {
                let mut shown = (*task).clone();
                shown.dispatch_error = Some(retrying.error.clone());
                shown.next_attempt = Some(retrying.next_attempt);
                Arc::new(shown)
            }
            _ => task,
        }
    }

    pub fn nodes(&self) -> Vec<Node> {
        let state = lock(&self.state);
        let now = Instant::now();
        state
            .nodes
            .entries()
            .map(|entry| entry.view(&state.cache, now, self.config.heartbeat_grace))
            .collect()
    }

    pub fn node(&self, name: &str) -> Result<Node, ManagerError> {
        let state = lock(&self.state);
        let entry = state
            .nodes
            .get(name)
            .ok_or_else(|| ManagerError::NodeNotFound(name.to_string()))?;
        Ok(entry.view(&state.cache, Instant::now(), self.config.heartbeat_grace))
    }

    /// A worker's registration or heartbeat (or a static worker's answer to the manager's
    /// poll). A new node, or one whose address changed, is followed from now on; a node that
    /// can take more work than before gets the tasks waiting for room.
    pub async fn report_node(
        self: &Arc<Self>,
        report: NodeReport,
        source: NodeSource,
    ) -> Result<Node, ManagerError> {
        let findings = report.validate();
        if !findings.is_empty() {
            return Err(ManagerError::BadRequest(format!(
                "invalid node report: {}",
                findings.join("; ")
            )));
        }
        let client = ApiClient::new(&report.address, self.config.request_timeout)
            .map_err(|err| ManagerError::BadRequest(format!("Address: {err}")))?;
        let name = report.name.clone();
        let mut node_write = None;
        let (effect, view) = {
            let mut state = lock(&self.state);
            let effect = state.nodes.report(
                report,
                source,
                || client.clone(),
                Instant::now(),
                self.config.heartbeat_grace,
            );
            let Some(entry) = state.nodes.get(&name) else {
                return Err(ManagerError::NodeNotFound(name));
            };
            let view = entry.view(&state.cache, Instant::now(), self.config.heartbeat_grace);
            if effect.changed {
                node_write = Some(self.stores.nodes.put_queued(&name, &view)?);
                tracing::info!(node = %name, address = %view.address, source = source.as_str(), "node joined or changed");
            }
            (effect, view)
        };
        if let Some(commit) = node_write {
            commit.durable().await?;
        }
        if effect.moved || effect.more_room {
            // A new or moved node is followed from now on; one that is back from silence is
            // followed afresh, so that its full task list (and any run replaced meanwhile)
            // is seen at once rather than when an old blocking query times out.
            let client = if effect.moved {
                client
            } else {
                lock(&self.state)
                    .nodes
                    .get(&name)
                    .map(|entry| entry.client.clone())
                    .unwrap_or(client)
            };
            self.follow(name.clone(), client);
        }
        if effect.more_room {
            // A node that is back may have stops to deliver and lost tasks to report.
            self.push_node_tasks(&name);
            self.push_waiting();
        }
        if effect.more_room || effect.changed {
            // A node joined, came back or changed: system jobs may want a copy there, or no
            // longer want the one they have.
            self.mark_system_jobs_dirty();
        }
        Ok(view)
    }

    // ----- observations from workers -----

    /// Applies a worker's task list: each task placed on `node` takes the state the worker
    /// saw. When the list is `complete` (every task the worker has, not only those that
    /// changed), a task the manager placed there that the worker does not list is sent again
    /// when it was only `Scheduled`, and has failed when it was `Running` (the worker lost
    /// its store).
    ///
    /// Returns the strays: runs the worker still has going that the manager has replaced or
    /// ended (the node was lost and came back), for the caller to stop there.
    async fn observe(&self, node: &str, reported: Vec<Task>, complete: bool) -> Vec<Uuid> {
        let mut writes = Writes::default();
        let mut to_reconcile = Vec::new();
        let mut strays = Vec::new();
        let mut freed = false;
        {
            let mut state = lock(&self.state);
            let mut listed = HashSet::with_capacity(reported.len());
            for observed in reported {
                listed.insert(observed.id);
                let Some(known) = state.cache.get(&observed.id) else {
                    continue;
                };
                if is_stray(known, &observed, node) {
                    strays.push(observed.id);
                    continue;
                }
                if known.node_name != node {
                    continue;
                }
                let Some(merged) = merge_observation(known, &observed, Utc::now()) else {
                    continue;
                };
                freed |= holds_resources(known) && !holds_resources(&merged);
                tracing::info!(task = %merged.id, name = %merged.name, node, state = %merged.state, "task state changed");
                if let Err(err) = self.save(&mut state, &mut writes, merged) {
                    tracing::error!(task = %observed.id, error = %err, "cannot store an observed state");
                }
                to_reconcile.push(observed.id);
            }
            let placed_here: Vec<Uuid> = if complete {
                state
                    .cache
                    .load(node)
                    .map(|load| load.tasks.iter().copied().collect())
                    .unwrap_or_default()
            } else {
                Vec::new()
            };
            for id in placed_here.into_iter().filter(|id| !listed.contains(id)) {
                let Some(known) = state.cache.get(&id) else {
                    continue;
                };
                match known.state {
                    State::Scheduled => {
                        lock(&self.dispatched).remove(&id);
                        to_reconcile.push(id);
                    }
                    State::Running => {
                        let mut failed = known.clone();
                        failed.state = State::Failed;
                        failed.finish_time = Some(Utc::now());
                        failed.error = Some(format!(
                            "worker {node} no longer has this task (its store was lost?)"
                        ));
                        tracing::warn!(task = %id, node, "the worker no longer has a running task");
                        if let Err(err) = self.save(&mut state, &mut writes, failed) {
                            tracing::error!(task = %id, error = %err, "cannot store a failure");
                        }
                        freed = true;
                        to_reconcile.push(id);
                    }
                    _ => {}
                }
            }
        }
        // Errors are logged, and the cache put back, by `settle`; the worker reports again.
        let _ = self.settle(writes).await;
        for id in to_reconcile {
            self.queue.push(id);
        }
        if freed {
            self.push_waiting();
        }
        strays
    }

    // ----- the controller -----

    /// Queues every task placed on `node`.
    fn push_node_tasks(&self, node: &str) {
        let placed_here: Vec<Uuid> = lock(&self.state)
            .cache
            .load(node)
            .map(|load| load.tasks.iter().copied().collect())
            .unwrap_or_default();
        for id in placed_here {
            self.queue.push(id);
        }
    }

    /// Queues every task that waits for room on a node.
    fn push_waiting(&self) {
        let waiting: Vec<Uuid> = lock(&self.state).cache.waiting().collect();
        for id in waiting {
            self.queue.push(id);
        }
    }

    /// Queues every task that has not ended: at start, and every resync interval.
    fn push_unfinished(&self) {
        let unfinished: Vec<Uuid> = lock(&self.state)
            .cache
            .tasks()
            .filter(|task| !task.state.is_terminal())
            .map(|task| task.id)
            .collect();
        for id in unfinished {
            self.queue.push(id);
        }
    }

    /// Reconciles queued tasks, up to `max_concurrent_reconciles` at once, until shutdown.
    pub async fn run_controller(self: Arc<Self>) {
        let limit = self.config.max_concurrent_reconciles.max(1);
        let mut running = JoinSet::new();
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => break,
                Some(_) = running.join_next(), if !running.is_empty() => {}
                id = self.queue.pop(), if running.len() < limit => {
                    let manager = self.clone();
                    running.spawn(async move {
                        let outcome = manager.reconcile_task(id).await;
                        manager.queue.done(id);
                        manager.after_reconcile(id, outcome);
                    });
                }
            }
        }
        // Calls to workers under way are abandoned: every action is idempotent, and the
        // next start reconciles every unfinished task again.
        running.abort_all();
    }

    fn after_reconcile(self: &Arc<Self>, id: Uuid, outcome: Outcome) {
        match outcome {
            Outcome::Done => {
                lock(&self.failures).remove(&id);
            }
            Outcome::After(wait) => {
                lock(&self.failures).remove(&id);
                self.push_after(id, wait);
            }
            Outcome::Retry(reason) => {
                let (attempts, delay) = {
                    let mut failures = lock(&self.failures);
                    let attempts = failures.get(&id).map_or(0, |r| r.attempts) + 1;
                    let delay = RETRY_FIRST
                        .saturating_mul(1 << attempts.min(16).saturating_sub(1))
                        .min(RETRY_CAP);
                    let next_attempt = Utc::now()
                        + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::zero());
                    failures.insert(
                        id,
                        Retrying {
                            attempts,
                            error: reason.clone(),
                            next_attempt,
                        },
                    );
                    (attempts, delay)
                };
                if let Some(left_out) = self.retry_warnings.admit(Instant::now()) {
                    tracing::warn!(task = %id, %reason, attempts, retry_in = ?delay, left_out, "reconcile did not converge (at most one such warning every 5 s; left_out counts the others)");
                } else {
                    tracing::debug!(task = %id, %reason, attempts, retry_in = ?delay, "reconcile did not converge");
                }
                self.push_after(id, delay);
            }
        }
    }

    /// Queues `id` again once `wait` is over (a timer, not a poll: nothing else will say when
    /// a backoff ends).
    fn push_after(self: &Arc<Self>, id: Uuid, wait: Duration) {
        if wait.is_zero() {
            self.queue.push(id);
            return;
        }
        let manager = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = manager.shutdown.cancelled() => {}
                _ = tokio::time::sleep(wait) => manager.queue.push(id),
            }
        });
    }

    /// One reconcile of one task: decide, act, and decide again while the action moved the
    /// task on (a placement is followed by its dispatch at once).
    async fn reconcile_task(&self, id: Uuid) -> Outcome {
        loop {
            let (task, client) = {
                let state = lock(&self.state);
                let Some(task) = state.cache.get(&id) else {
                    return Outcome::Done;
                };
                let client = state
                    .nodes
                    .get(&task.node_name)
                    .map(|node| node.client.clone());
                (task.clone(), client)
            };
            let outcome = match reconcile(&task, Utc::now()) {
                Action::Nothing => Outcome::Done,
                Action::GiveUp => match self.with_writes(|writes| self.give_up(id, writes)).await {
                    Ok(()) => Outcome::Done,
                    Err(err) => Outcome::Retry(err.to_string()),
                },
                Action::Restart { wait, at, .. } if !wait.is_zero() => {
                    match self
                        .with_writes(|writes| self.note_next_restart(id, at, writes))
                        .await
                    {
                        Ok(()) => Outcome::After(wait),
                        Err(err) => Outcome::Retry(err.to_string()),
                    }
                }
                Action::Restart { streak, .. } => match self
                    .with_writes(|writes| self.restart(id, streak, writes))
                    .await
                {
                    Ok(true) => continue,
                    Ok(false) => Outcome::Done,
                    Err(err) => Outcome::Retry(err.to_string()),
                },
                Action::CompleteUnplaced => match self
                    .with_writes(|writes| self.complete_unplaced(id, writes))
                    .await
                {
                    Ok(()) => Outcome::Done,
                    Err(err) => Outcome::Retry(err.to_string()),
                },
                Action::Place => match self.with_writes(|writes| self.place(id, writes)).await {
                    Ok(true) => continue,
                    Ok(false) => Outcome::Done,
                    Err(err) => Outcome::Retry(err.to_string()),
                },
                Action::Dispatch => self.dispatch(task, client).await,
                Action::Stop => self.stop_on_node(task, client).await,
            };
            return outcome;
        }
    }

    /// Places a `Pending` task; returns whether it was placed. When no node fits, the
    /// reasons are kept on the task for the API to show.
    fn place(&self, id: Uuid, writes: &mut Writes) -> Result<bool, ManagerError> {
        let mut state = lock(&self.state);
        let Some(task) = state.cache.get(&id) else {
            return Ok(false);
        };
        if task.state != State::Pending || task.desired_state != State::Running {
            return Ok(false);
        }
        let mut task = task.clone();
        let views = self.node_views(&state);
        let request = TaskRequest::for_task(&task);
        // A restarted task goes back to the node it ran on when that node is ready and has
        // room (its image is there, its data may be); otherwise the scheduler chooses.
        let previous = views
            .iter()
            .position(|view| view.name == task.node_name)
            .filter(|index| {
                let one = std::slice::from_ref(&views[*index]);
                !state
                    .scheduler
                    .select_candidate_nodes(&request, one)
                    .0
                    .is_empty()
            });
        let decision = match previous {
            Some(index) => Decision::Placed {
                index,
                name: views[index].name.clone(),
            },
            None => state.scheduler.place(&request, &views),
        };
        match decision {
            Decision::Placed { name, .. } => {
                tracing::info!(task = %id, name = %task.name, node = %name, "task placed");
                task.record(Utc::now(), "Placed", format!("on {name}"));
                task.state = State::Scheduled;
                task.node_name = name;
                task.pending_reason = None;
                self.save(&mut state, writes, task)?;
                Ok(true)
            }
            Decision::NoFit { reasons } => {
                let reason = summarize_rejections(&request, &views, &reasons);
                if task.pending_reason.as_deref() != Some(reason.as_str()) {
                    tracing::info!(task = %id, name = %task.name, %reason, "task waits for room");
                    task.pending_reason = Some(reason);
                    self.save(&mut state, writes, task)?;
                }
                Ok(false)
            }
        }
    }

    /// The scheduler's snapshot of every node: what it offers, what is placed there.
    fn node_views(&self, state: &Shared) -> Vec<NodeView> {
        let now = Instant::now();
        state
            .nodes
            .entries()
            .map(|entry| {
                let load = state.cache.load(&entry.name);
                NodeView {
                    name: entry.name.clone(),
                    ready: entry.is_ready(now, self.config.heartbeat_grace),
                    capacity: entry.capacity,
                    allocated: load.map(|load| load.allocated).unwrap_or_default(),
                    task_count: load.map(|load| load.tasks.len()).unwrap_or(0),
                    host_ports_taken: load
                        .map(|load| load.host_ports.keys().copied().collect())
                        .unwrap_or_default(),
                    labels: entry.labels.clone(),
                }
            })
            .collect()
    }

    /// Where the task could go now, node by node: `GET /tasks/{id}/placement`, the long form
    /// of a waiting task's `PendingReason`.
    pub fn placement(&self, id: Uuid) -> Result<Placement, ManagerError> {
        let state = lock(&self.state);
        let task = state.cache.get(&id).ok_or(ManagerError::NotFound(id))?;
        let views = self.node_views(&state);
        let request = TaskRequest::for_task(task);
        let chain = FilterChain::standard();
        let nodes = views
            .iter()
            .map(|view| {
                let reason = chain.check(&request, view).err();
                NodePlacement {
                    name: view.name.clone(),
                    fits: reason.is_none(),
                    reason,
                }
            })
            .collect();
        let rejections = chain.rejections(&request, &views);
        Ok(Placement {
            id,
            state: task.state,
            node_name: task.node_name.clone(),
            summary: if rejections.len() == views.len() {
                Some(summarize_rejections(&request, &views, &rejections))
            } else {
                None
            },
            nodes,
        })
    }

    /// Begins a new run of a task that ended or was lost: back to `Pending` (the one explicit
    /// way back, `State::restart`), one more restart counted, the node it ran on kept as the
    /// first choice for the placement that follows at once.
    fn restart(&self, id: Uuid, streak: u32, writes: &mut Writes) -> Result<bool, ManagerError> {
        let mut state = lock(&self.state);
        let Some(task) = state.cache.get(&id) else {
            return Ok(false);
        };
        // Decided again under the lock: the task may have changed since.
        if !matches!(reconcile(task, Utc::now()), Action::Restart { wait, .. } if wait.is_zero()) {
            return Ok(false);
        }
        let mut task = task.clone();
        let Ok(pending) = task.state.restart() else {
            return Ok(false);
        };
        let why = match (task.state, &task.error) {
            (State::Lost, _) => format!("node {} was lost", task.node_name),
            (_, Some(error)) => error.clone(),
            (ended, None) => format!("it ended {ended}"),
        };
        let limit = task
            .max_restarts
            .map(|max| format!(" of {max}"))
            .unwrap_or_default();
        task.state = pending;
        task.restart_count += 1;
        task.failure_streak = streak;
        task.clear_observed();
        let message = format!("restart {}{limit}; the last run: {why}", task.restart_count);
        tracing::info!(task = %id, name = %task.name, %message, "restarting a task");
        task.record(Utc::now(), "Restart", message);
        self.save(&mut state, writes, task)?;
        Ok(true)
    }

    /// Records when a task that waits out its restart backoff will be restarted, so that the
    /// API shows a restart to come rather than a run that ended for good.
    fn note_next_restart(
        &self,
        id: Uuid,
        at: DateTime<Utc>,
        writes: &mut Writes,
    ) -> Result<(), StoreError> {
        let mut state = lock(&self.state);
        let Some(task) = state.cache.get(&id) else {
            return Ok(());
        };
        if task.next_restart == Some(at) || task.desired_state != State::Running {
            return Ok(());
        }
        let mut task = task.clone();
        task.next_restart = Some(at);
        self.save(&mut state, writes, task)
    }

    /// The restart limit is reached: the task keeps its state and last error; the history
    /// says why nothing more happens (once).
    fn give_up(&self, id: Uuid, writes: &mut Writes) -> Result<(), StoreError> {
        let mut state = lock(&self.state);
        let Some(task) = state.cache.get(&id) else {
            return Ok(());
        };
        if task
            .history
            .last()
            .is_some_and(|entry| entry.event == GAVE_UP)
        {
            return Ok(());
        }
        let mut task = task.clone();
        task.next_restart = None;
        let message = format!(
            "restart limit reached ({} restarts); the task stays {}",
            task.restart_count, task.state
        );
        tracing::warn!(task = %id, name = %task.name, %message, "not restarting");
        task.record(Utc::now(), GAVE_UP, message);
        self.save(&mut state, writes, task)
    }

    fn complete_unplaced(&self, id: Uuid, writes: &mut Writes) -> Result<(), StoreError> {
        let mut state = lock(&self.state);
        let Some(task) = state.cache.get(&id) else {
            return Ok(());
        };
        if task.state != State::Pending || task.desired_state != State::Completed {
            return Ok(());
        }
        let mut task = task.clone();
        task.state = State::Completed;
        task.finish_time = Some(Utc::now());
        task.pending_reason = None;
        self.save(&mut state, writes, task)
    }

    /// Sends a `Scheduled` task to its node, once per manager process unless the node is
    /// seen to have lost it.
    async fn dispatch(&self, task: Task, client: Option<ApiClient>) -> Outcome {
        if lock(&self.dispatched).contains(&task.id) {
            return Outcome::Done;
        }
        let Some(client) = client else {
            return Outcome::Retry(format!("node {:?} is not known", task.node_name));
        };
        let event = TaskEvent {
            id: Uuid::new_v4(),
            state: State::Running,
            timestamp: Some(Utc::now()),
            task: task.clone(),
        };
        match client.post::<_, Task>("/tasks", &event).await {
            Ok((_, observed)) => {
                lock(&self.dispatched).insert(task.id);
                self.observe_one(&task.node_name, observed).await;
                Outcome::Done
            }
            // The worker has the task and it already ended there: its report says how.
            Err(ClientError::Status { status, .. }) if status.as_u16() == 409 => Outcome::Done,
            Err(ClientError::Status {
                status, message, ..
            }) if status.is_client_error() => {
                self.fail(
                    task.id,
                    format!("worker {} refused the task: {message}", task.node_name),
                )
                .await;
                Outcome::Done
            }
            Err(err) => Outcome::Retry(err.to_string()),
        }
    }

    /// Asks the task's node to stop it. The worker reports the end through the follower;
    /// a worker that never had the task means nothing runs: the task is `Completed` here.
    async fn stop_on_node(&self, task: Task, client: Option<ApiClient>) -> Outcome {
        let Some(client) = client else {
            return Outcome::Retry(format!("node {:?} is not known", task.node_name));
        };
        match client.delete(&format!("/tasks/{}", task.id)).await {
            Ok(()) => Outcome::Done,
            Err(ClientError::Status { status, .. }) if status.as_u16() == 404 => {
                let mut writes = Writes::default();
                let stopped = {
                    let mut state = lock(&self.state);
                    match state.cache.get(&task.id) {
                        Some(known) if !known.state.is_terminal() => {
                            let mut stopped = known.clone();
                            stopped.state = State::Completed;
                            stopped.finish_time = Some(Utc::now());
                            self.save(&mut state, &mut writes, stopped).map(|()| true)
                        }
                        _ => Ok(false),
                    }
                };
                match (stopped, self.settle(writes).await) {
                    (Err(err), _) | (_, Err(err)) => Outcome::Retry(err.to_string()),
                    (Ok(stopped), Ok(())) => {
                        if stopped {
                            self.push_waiting();
                        }
                        Outcome::Done
                    }
                }
            }
            Err(err) => Outcome::Retry(err.to_string()),
        }
    }

    /// One task as a worker answered it (after a dispatch).
    async fn observe_one(&self, node: &str, observed: Task) {
        let mut writes = Writes::default();
        {
            let mut state = lock(&self.state);
            let Some(known) = state.cache.get(&observed.id) else {
                return;
            };
            if known.node_name != node {
                return;
            }
            if let Some(merged) = merge_observation(known, &observed, Utc::now())
                && let Err(err) = self.save(&mut state, &mut writes, merged)
            {
                tracing::error!(task = %observed.id, error = %err, "cannot store an observed state");
            }
        }
        let _ = self.settle(writes).await;
    }

    async fn fail(&self, id: Uuid, reason: String) {
        let mut writes = Writes::default();
        let freed = {
            let mut state = lock(&self.state);
            let Some(known) = state.cache.get(&id) else {
                return;
            };
            if known.state.transition(State::Failed).is_err() {
                return;
            }
            tracing::warn!(task = %id, %reason, "task failed");
            let mut failed = known.clone();
            failed.state = State::Failed;
            failed.finish_time = Some(Utc::now());
            failed.error = Some(reason);
            let freed = holds_resources(known);
            if let Err(err) = self.save(&mut state, &mut writes, failed) {
                tracing::error!(task = %id, error = %err, "cannot store a failure");
            }
            freed
        };
        let _ = self.settle(writes).await;
        if freed {
            self.push_waiting();
        }
    }

    /// Queues the write of a task to the store (into `writes`, to be waited for once the
    /// lock is let go) and applies it to the cache. A task the store cannot even encode is
    /// not applied.
    pub(crate) fn save(
        &self,
        state: &mut Shared,
        writes: &mut Writes,
        task: Task,
    ) -> Result<(), StoreError> {
        writes.push(
            task.id,
            self.stores.tasks.put_queued(&task.id.to_string(), &task)?,
        );
        if task.state != State::Scheduled {
            // Only a `Scheduled` task is ever dispatched; keep the set small.
            lock(&self.dispatched).remove(&task.id);
        }
        if !task.job.is_empty() {
            // Its job looks again: a copy changed state (level-triggered: a look that finds
            // nothing to do writes nothing).
            self.mark_job_dirty(&task.job);
        }
        state.cache.insert(task);
        Ok(())
    }

    /// Runs `operation` (which takes the lock itself and queues its writes), then waits for
    /// its writes to be durable.
    async fn with_writes<T, E>(
        &self,
        operation: impl FnOnce(&mut Writes) -> Result<T, E>,
    ) -> Result<T, ManagerError>
    where
        ManagerError: From<E>,
    {
        let mut writes = Writes::default();
        let result = operation(&mut writes);
        self.settle(writes).await?;
        Ok(result?)
    }

    /// Waits until every write in `writes` is durable. A write that cannot be made durable
    /// puts the store's version of its task back in the cache (or forgets a task the store
    /// never had), so that nothing is shown or acted on that a restart would not know. Returns
    /// the first error.
    pub(crate) async fn settle(&self, writes: Writes) -> Result<(), StoreError> {
        let mut first_error = None;
        for (id, commit) in writes.0 {
            if let Err(err) = commit.durable().await {
                tracing::error!(task = %id, error = %err, "a write did not become durable");
                self.reload(id);
                first_error.get_or_insert(err);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Puts the store's version of a task back in the cache.
    fn reload(&self, id: Uuid) {
        let stored = self.stores.tasks.get(&id.to_string());
        let mut state = lock(&self.state);
        match stored {
            Ok(Some(task)) => {
                state.cache.insert(task);
            }
            Ok(None) => {
                state.cache.remove(&id);
            }
            Err(err) => {
                tracing::error!(task = %id, error = %err, "cannot read a task back from the store")
            }
        }
    }

    // ----- the loops that watch the outside -----

    /// Starts the background loops: the controller, the resync, a follower for every known
    /// node and a poller for every static worker. They end on shutdown.
    pub fn start(self: &Arc<Self>) -> JoinSet<()> {
        let mut loops = JoinSet::new();
        loops.spawn(self.clone().run_controller());
        loops.spawn(self.clone().run_job_controller());
        loops.spawn(self.clone().run_resync());
        loops.spawn(self.clone().run_liveness());
        for address in self.config.static_workers.clone() {
            loops.spawn(self.clone().poll_static_worker(address));
        }
        let known: Vec<(String, ApiClient)> = lock(&self.state)
            .nodes
            .entries()
            .map(|entry| (entry.name.clone(), entry.client.clone()))
            .collect();
        for (name, client) in known {
            self.follow(name, client);
        }
        loops
    }

    /// Watches the nodes' reports: a node silent for longer than the grace period is `Down`,
    /// and its unfinished tasks are `Lost`, to be replaced according to their restart policy.
    async fn run_liveness(self: Arc<Self>) {
        let tick = (self.config.heartbeat_grace / 10)
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
            let _ = self.settle(writes).await;
            for id in lost {
                self.queue.push(id);
            }
        }
    }

    /// Marks the nodes that stopped reporting `Down` (once each) and their tasks `Lost`;
    /// returns those tasks.
    fn mark_silent_nodes_down(&self, now: Instant, writes: &mut Writes) -> Vec<Uuid> {
        let grace = self.config.heartbeat_grace;
        let mut state = lock(&self.state);
        let newly_down = state.nodes.mark_down(now, grace);
        let mut lost = Vec::new();
        for name in newly_down {
            tracing::warn!(node = %name, ?grace, "node stopped reporting: Down; its tasks are Lost");
            let placed_here: Vec<Uuid> = state
                .cache
                .load(&name)
                .map(|load| load.tasks.iter().copied().collect())
                .unwrap_or_default();
            for id in placed_here {
                let Some(task) = state.cache.get(&id) else {
                    continue;
                };
                let Ok(next) = task.state.transition(State::Lost) else {
                    continue;
                };
                if next == task.state {
                    continue;
                }
                let mut task = task.clone();
                let message = format!("node {name} sent nothing for longer than {grace:?}");
                task.state = next;
                task.error = Some(message.clone());
                task.record(Utc::now(), "Lost", message);
                if let Err(err) = self.save(&mut state, writes, task) {
                    tracing::error!(task = %id, error = %err, "cannot store a lost task");
                    continue;
                }
                lost.push(id);
            }
        }
        lost
    }

    async fn run_resync(self: Arc<Self>) {
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

    /// Follows a node's tasks with blocking queries, replacing any follower it had.
    fn follow(self: &Arc<Self>, name: String, client: ApiClient) {
        let stop = self.shutdown.child_token();
        if let Some(previous) = lock(&self.followers).insert(name.clone(), stop.clone()) {
            previous.cancel();
        }
        tokio::spawn(self.clone().run_follower(name, client, stop));
    }

    /// Keeps a blocking `GET /tasks?index=N&changes=true` open on the worker: it answers the
    /// moment a task changes there, with the tasks that changed since the last answer, so the
    /// manager's view lags the container by one HTTP round trip and each change costs what
    /// changed, not the worker's whole list. The first answer (index 0), and any after the
    /// worker's store was replaced, hold every task.
    async fn run_follower(
        self: Arc<Self>,
        name: String,
        client: ApiClient,
        stop: CancellationToken,
    ) {
        let mut index = 0;
        let mut reachable = true;
        loop {
            // Index 0 asks for every task, at once (there is nothing to wait for): wait for a
            // permit first, and keep it until they are applied.
            let _permit = if index == 0 {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    permit = self.complete_lists.acquire() => permit.ok(),
                }
            } else {
                None
            };
            let answer = tokio::select! {
                _ = stop.cancelled() => return,
                answer = client.get_changes::<Vec<Task>>(
                    "/tasks",
                    index,
                    if index == 0 { Duration::ZERO } else { FOLLOW_WAIT },
                ) => answer,
            };
            let pause = match answer {
                Ok(Changes {
                    body: tasks,
                    index: reported_index,
                    complete,
                }) => {
                    if !reachable {
                        tracing::info!(node = %name, "following the node's tasks again");
                        reachable = true;
                        let back = lock(&self.state).nodes.set_unreachable(&name, None);
                        if back {
                            // It can take work again, and what waits to be sent there can go.
                            self.push_node_tasks(&name);
                            self.push_waiting();
                            self.mark_system_jobs_dirty();
                        }
                    }
                    for stray in self.observe(&name, tasks, complete).await {
                        // Another run replaced this one while the node was away: stop it,
                        // so that the task does not run twice.
                        tracing::warn!(task = %stray, node = %name, "stopping a run that was replaced elsewhere");
                        if let Err(err) = client.delete(&format!("/tasks/{stray}")).await {
                            tracing::warn!(task = %stray, node = %name, error = %err, "cannot stop a replaced run");
                        }
                    }
                    match reported_index {
                        Some(reported) => {
                            index = reported;
                            None
                        }
                        // A server that does not report an index cannot be followed by
                        // blocking queries; ask again after a pause instead of spinning.
                        None => Some(FOLLOW_RETRY),
                    }
                }
                Err(err) => {
                    if reachable {
                        tracing::warn!(node = %name, error = %err, "cannot follow the node's tasks; retrying");
                        reachable = false;
                    }
                    // Not `Ready` while it cannot be reached: nothing placed there could be
                    // sent, and `cube node` says why.
                    lock(&self.state)
                        .nodes
                        .set_unreachable(&name, Some(err.cause()));
                    index = 0;
                    Some(FOLLOW_RETRY)
                }
            };
            if let Some(pause) = pause {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(pause) => {}
                }
            }
        }
    }

    /// Asks a static worker for its report every poll interval, as a registered worker would
    /// send it. The worker is recorded under the address the manager reaches it at.
    async fn poll_static_worker(self: Arc<Self>, address: String) {
        let client = match ApiClient::new(&address, self.config.request_timeout) {
            Ok(client) => client,
            Err(err) => {
                tracing::error!(%address, error = %err, "cannot poll a static worker");
                return;
            }
        };
        let mut ticks = tokio::time::interval(self.config.poll_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reachable = true;
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = ticks.tick() => {}
            }
            let answer = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                answer = client.get::<NodeReport>("/node") => answer,
            };
            match answer {
                Ok(mut report) => {
                    reachable = true;
                    report.address = client.base().to_string();
                    if let Err(err) = self.report_node(report, NodeSource::Static).await {
                        tracing::warn!(%address, error = %err, "static worker's report refused");
                    }
                }
                Err(err) if reachable => {
                    tracing::warn!(%address, error = %err, "cannot reach a static worker");
                    reachable = false;
                }
                Err(_) => {}
            }
        }
    }
}

/// Whether a run a worker reports is one the manager no longer wants there: it still runs,
/// but the task was placed elsewhere, restarted since (a higher count), or ended.
fn is_stray(known: &Task, observed: &Task, node: &str) -> bool {
    matches!(observed.state, State::Scheduled | State::Running)
        && (known.node_name != node
            || observed.restart_count < known.restart_count
            || known.state.is_terminal()
            || known.state == State::Pending)
}

/// The manager's task with what a worker observed, or `None` when nothing changed, the
/// report is of an earlier run (a lower restart count), or the change is not allowed by the
/// transition table (an old report arriving late). What changed goes into the history.
fn merge_observation(known: &Task, observed: &Task, now: DateTime<Utc>) -> Option<Task> {
    if observed.restart_count < known.restart_count {
        return None;
    }
    let same = known.state == observed.state
        && known.container_id == observed.container_id
        && known.host_ports == observed.host_ports
        && known.start_time == observed.start_time
        && known.finish_time == observed.finish_time
        && known.exit_code == observed.exit_code
        && known.error == observed.error
        && known.health == observed.health
        && known.health_failures == observed.health_failures;
    if same {
        return None;
    }
    if let Err(transition) = known.state.transition(observed.state) {
        tracing::debug!(task = %known.id, %transition, "observation ignored");
        return None;
    }
    let mut merged = known.clone();
    merged.state = observed.state;
    merged.container_id = observed.container_id.clone();
    merged.host_ports = observed.host_ports.clone();
    merged.start_time = observed.start_time;
    merged.finish_time = observed.finish_time;
    merged.exit_code = observed.exit_code;
    merged.error = observed.error.clone();
    merged.health = observed.health;
    merged.health_failures = observed.health_failures;
    if known.state != observed.state {
        let message = match (observed.state, &observed.error) {
            (State::Failed, Some(error)) => error.clone(),
            (State::Running, _) => format!("on {}", observed.node_name),
            (_, _) => observed
                .exit_code
                .map(|code| format!("exit code {code}"))
                .unwrap_or_default(),
        };
        merged.record(now, observed.state.to_string(), message);
    } else if observed.health_failures > known.health_failures {
        let message = observed.error.clone().unwrap_or_default();
        merged.record(now, "Health", message);
    }
    if known.health != observed.health && observed.health == Some(Health::Healthy) {
        merged.record(now, "Health", "healthy");
    }
    Some(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_observation_moves_a_task_only_along_the_table() {
        let mut known = Task::new("t", "img");
        known.state = State::Running;
        known.node_name = "w1".into();
        let mut observed = known.clone();
        let now = Utc::now();
        assert_eq!(
            merge_observation(&known, &observed, now),
            None,
            "nothing new"
        );

        observed.state = State::Failed;
        observed.exit_code = Some(137);
        observed.error = Some("killed".into());
        let merged = merge_observation(&known, &observed, now).unwrap();
        assert_eq!((merged.state, merged.exit_code), (State::Failed, Some(137)));
        let entry = merged.history.last().unwrap();
        assert_eq!(
            (&*entry.event, entry.message.as_str()),
            ("Failed", "killed")
        );

        let mut late = known.clone();
        late.state = State::Scheduled;
        assert_eq!(
            merge_observation(&merged, &late, now),
            None,
            "a late report cannot bring back an ended task"
        );
    }

    #[test]
    fn a_report_of_an_earlier_run_is_ignored() {
        let mut known = Task::new("t", "img");
        known.state = State::Scheduled;
        known.node_name = "w1".into();
        known.restart_count = 2;
        let mut old_run = known.clone();
        old_run.restart_count = 1;
        old_run.state = State::Failed;
        assert_eq!(merge_observation(&known, &old_run, Utc::now()), None);
    }
}
