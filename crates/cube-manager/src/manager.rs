//! The manager's state and the operations on it that the API calls: submissions, stops,
//! reads, node reports. The control loops live in files of their own, each on the controller
//! framework's runner (`cube_controller::runner`): the task controller
//! (`task_controller.rs`), the placement pass (`placement.rs`), the job controller
//! (`job_controller.rs`), node liveness and the resync (`liveness.rs`), and the followers of
//! the workers' task lists with the stray handling (`followers.rs`).
//!
//! Everything in memory sits behind one `std` mutex ([`Manager::state`]): each operation
//! holds it for a few map operations, never across an `.await` or an fsync, so placements see
//! a consistent view of every node's allocations. A write is queued to the store under the
//! lock (queued writes keep their order) and applied to the cache at once; it is waited for
//! after the lock is let go ([`Writes`]), and nothing is acknowledged to a client or sent to
//! a worker before it is durable. Concurrent writes share one commit. Calls to workers are
//! made outside the lock.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use cube_api::ApiClient;
use cube_controller::runner::{Runner, RunnerConfig};
use cube_controller::store::ObservedStore;
use cube_scheduler::Scheduler;
use cube_store::{Commit, Store, StoreError};
use cube_types::deployment::Deployment;
use cube_types::job::{JobHistory, JobRecord};
use cube_types::queue::QueueEntry;
use cube_types::{Node, NodeReport, NodeStatus, State, Task, TaskEvent};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::cache::TaskCache;
use crate::events::{EventBroker, Payload, Topic, publish_task};
use crate::log_limit::LogLimit;
use crate::nodes::{NodeRegistry, NodeSource};

/// At most this many heartbeats a second are asked of the nodes, however many there are
/// (Nomad's `max_heartbeats_per_second` default): past `50 × --heartbeat-interval` nodes the
/// manager asks each node to beat less often (see [`heartbeat_floor`]).
pub const MAX_HEARTBEATS_PER_SECOND: u64 = 50;

/// The shortest interval the manager asks of each node's heartbeats when it knows `nodes`
/// nodes: `nodes / MAX_HEARTBEATS_PER_SECOND` seconds, so that all of them together send at
/// most [`MAX_HEARTBEATS_PER_SECOND`]. A worker keeps its own `--heartbeat-interval` when
/// that is longer.
pub fn heartbeat_floor(nodes: usize) -> Duration {
    Duration::from_millis(nodes as u64 * 1000 / MAX_HEARTBEATS_PER_SECOND)
}

/// The history event recorded when the restart limit stops further restarts.
pub const GAVE_UP: &str = "RestartLimit";

/// How many nodes' whole task lists are read at once (see `Manager::complete_lists`).
pub(crate) const COMPLETE_LISTS_AT_ONCE: usize = 2;

/// How long a runner waits for its running reconciles at shutdown before it aborts them
/// (they are idempotent: the next start does them again). Below `crate::SHUTDOWN_GRACE`.
const RUNNER_SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

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
    /// How long an ended task (and a stopped job left without tasks) is kept before the
    /// garbage collector removes it (`gc.rs`).
    pub gc_after: Duration,
    /// At most this many requests of one owner let in (`pending-N` or `claimed`) at once;
    /// the owner's next request waits, saying so (`--max-claimed-per-owner`). None: no limit.
    pub max_claimed_per_owner: Option<usize>,
    /// Tokens and roles (`--acl`): `None` lets every request through. With it, every call
    /// to a worker carries that node's worker-command token (`acl.rs`).
    pub acl: Option<Arc<crate::acl::Acl>>,
    /// The audit file under the data directory, when there is one (`acl.rs`).
    pub audit: Option<Arc<crate::acl::AuditLog>>,
    /// Mutual TLS (`--tls`): `None` speaks plain HTTP. With it, every call to a worker is
    /// HTTPS with the manager's certificate (`tls.rs`).
    pub tls: Option<Arc<crate::tls::ManagerTls>>,
}

impl ManagerConfig {
    /// A client for the worker of node `node` at `address`, with that node's worker-command
    /// token when ACL is on (`None`: a static worker not yet known by name, which has no gate
    /// and is sent no token).
    pub(crate) fn worker_client(
        &self,
        node: Option<&str>,
        address: &str,
    ) -> Result<ApiClient, cube_api::ClientError> {
        let tls = self.tls.as_ref().map(|tls| tls.client.clone());
        let token = match (&self.acl, node) {
            (Some(acl), Some(node)) => Some(acl.worker_token(node)),
            _ => None,
        };
        Ok(ApiClient::with_tls(address, self.request_timeout, tls)?.with_token(token.as_deref()))
    }
}

/// Where the manager keeps its state: tasks (desired and observed state, and the node each
/// is placed on), the nodes that joined, the jobs, their kept versions, the last deployment
/// of each service job, and numbers about the manager itself.
#[derive(Clone)]
pub struct ManagerStores {
    pub tasks: Arc<dyn Store<Task>>,
    pub nodes: Arc<dyn Store<Node>>,
    pub jobs: Arc<dyn Store<JobRecord>>,
    /// Every job's kept versions, under the job's name.
    pub job_versions: Arc<dyn Store<JobHistory>>,
    /// Each service job's last deployment, under the job's name.
    pub deployments: Arc<dyn Store<Deployment>>,
    /// Numbers about the manager itself: the epoch its events are numbered from, under
    /// [`EPOCH_KEY`], and the last queue number given, under [`QUEUE_NUMBER_KEY`].
    pub meta: Arc<dyn Store<u64>>,
    /// The waiting list: one entry per request, under `task/<id>` or `job/<name>`.
    pub queue: Arc<dyn Store<QueueEntry>>,
}

impl ManagerStores {
    /// Every table in memory: for tests and benchmarks.
    pub fn in_memory() -> ManagerStores {
        ManagerStores {
            tasks: Arc::new(cube_store::MemoryStore::new()),
            nodes: Arc::new(cube_store::MemoryStore::new()),
            jobs: Arc::new(cube_store::MemoryStore::new()),
            job_versions: Arc::new(cube_store::MemoryStore::new()),
            deployments: Arc::new(cube_store::MemoryStore::new()),
            meta: Arc::new(cube_store::MemoryStore::new()),
            queue: Arc::new(cube_store::MemoryStore::new()),
        }
    }
}

/// The key in the `meta` table of the manager's epoch: how many times it has started on this
/// store. Its events are numbered from epoch × 10^12 (`events.rs`), so that an index never
/// means two events, whatever restarts came between.
pub const EPOCH_KEY: &str = "epoch";

/// The key in the `meta` table of the highest queue number given so far: numbers keep
/// growing across restarts even when the newest entries are gone.
pub const QUEUE_NUMBER_KEY: &str = "queue";

/// Why a request was refused or failed. Turned into an HTTP status in one place, `api.rs`.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error("no task with ID {0}")]
    NotFound(Uuid),
    #[error("no node named {0:?}")]
    NodeNotFound(String),
    #[error("no job named {0:?}")]
    JobNotFound(String),
    /// The job exists but has no deployment to show.
    #[error("{0}")]
    NoDeployment(String),
    #[error("{0}")]
    BadRequest(String),
    /// The request contradicts what is stored (a task ID resubmitted with another spec).
    #[error("{0}")]
    Conflict(String),
    /// Something the request needs cannot be reached now (the task's worker).
    #[error("{0}")]
    Unavailable(String),
    /// The request is well-formed but would make more than Cube lets one request make (a
    /// job whose copies together are over `MAX_EXPANDED_BYTES`).
    #[error("{0}")]
    TooLarge(String),
    #[error("store failed: {0}")]
    Store(#[from] StoreError),
}

/// What a submission did: created a task (with warnings: why no node could hold it today),
/// or found it already there.
#[derive(Debug, Clone, PartialEq)]
pub enum Submitted {
    Created(Task, Vec<String>),
    Existing(Task),
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

/// A task whose reconcile keeps failing: the last error and when the runner tries again.
#[derive(Debug, Clone)]
pub(crate) struct Retrying {
    pub(crate) error: String,
    pub(crate) next_attempt: DateTime<Utc>,
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
    /// The task controller's runner: task IDs to reconcile (`task_controller.rs`), with the
    /// restart backoffs and error retries as its delays.
    pub(crate) tasks_runner: Runner<Uuid>,
    /// The placement pass's runner, with its one key (`placement.rs`): every push while a
    /// pass is waiting or running comes down to one more pass.
    pub(crate) placement_runner: Runner<()>,
    /// The job controller's runner: job names to converge (`job_controller.rs`).
    pub(crate) jobs_runner: Runner<String>,
    /// The queue controller's runner, with its one key (`queue_controller.rs`).
    pub(crate) queue_runner: Runner<()>,
    /// Held by every read-modify-write of a job record and its versions (submit, scale,
    /// stop, promote, revert, a version marked stable, an automatic revert), so that two of
    /// them never both start from the same record. A `tokio` mutex: held across the durable
    /// write.
    pub(crate) job_writes: tokio::sync::Mutex<()>,
    /// The jobs as the store's watch delivers them (`store_source.rs`): every change of a
    /// job record, whoever wrote it, reaches the job controller through it, and the job
    /// controller starts no look before it is in sync.
    pub(crate) jobs_observed: ObservedStore<String, JobRecord>,
    /// Tasks whose reconcile keeps failing (a node that cannot be reached, a store error):
    /// the last error and the next attempt, which the API shows on the task
    /// (`DispatchError`, `NextAttempt`). Written by the task controller's error policy and
    /// cleared by its next success. Not stored: it describes this process's attempts. A
    /// `std` mutex: map access only.
    pub(crate) failures: Mutex<HashMap<Uuid, Retrying>>,
    /// Tasks this process has handed to their worker, so that a task is not sent again on
    /// every reconcile while it starts. Forgotten on restart: sending again is harmless.
    pub(crate) dispatched: Mutex<HashSet<Uuid>>,
    /// The loop following each node's tasks, by node name, to stop it when the node moves.
    pub(crate) followers: Mutex<HashMap<String, CancellationToken>>,
    /// Every follower's task: shutdown waits for them (`Manager::start`).
    pub(crate) background: TaskTracker,
    /// Permits to read a node's whole task list. A manager that starts, or that many nodes
    /// come back to, would otherwise hold every node's list in memory at once.
    pub(crate) complete_lists: tokio::sync::Semaphore,
    /// Cancelled when the manager stops; every loop watches it.
    pub(crate) shutdown: CancellationToken,
    /// Every change as a numbered event (`events.rs`): published under the state lock where
    /// the change is applied, read by `GET /events` and the blocking queries.
    pub(crate) events: EventBroker,
    /// "reconcile did not converge", written at most once every 5 s.
    pub(crate) retry_warnings: LogLimit,
    /// What `GET /metrics` shows (`metrics.rs`).
    pub(crate) metrics: crate::metrics::ManagerMetrics,
    /// How many nodes the registry knows, for the heartbeat floor and the grace that
    /// follows from it; set under the state lock where the registry changes.
    pub(crate) known_nodes: std::sync::atomic::AtomicUsize,
}

pub(crate) struct Shared {
    pub(crate) cache: TaskCache,
    pub(crate) nodes: NodeRegistry,
    pub(crate) scheduler: Box<dyn Scheduler>,
    /// Every job by name, as stored.
    pub(crate) jobs: BTreeMap<String, Arc<JobRecord>>,
    /// Every job's kept versions, as stored.
    pub(crate) histories: BTreeMap<String, Arc<JobHistory>>,
    /// Each service job's last deployment, as stored (written by the job controller, and
    /// by nothing else).
    pub(crate) deployments: BTreeMap<String, Arc<Deployment>>,
    /// The waiting list as stored, by key (`task/<id>`, `job/<name>`): written by the queue
    /// controller, and by nothing else.
    pub(crate) queue: BTreeMap<String, Arc<QueueEntry>>,
    /// The highest queue number given (stored in `meta` under [`QUEUE_NUMBER_KEY`]).
    pub(crate) queue_number: u64,
    /// Requests a placement pass let in whose entry does not say so yet (the queue
    /// controller writes it after), by key, with their owner: counted against
    /// `--max-claimed-per-owner` meanwhile. Emptied as the entries catch up.
    pub(crate) just_admitted: HashMap<String, String>,
    /// The requests whose entry the queue controller looks at next (`queue_controller.rs`).
    pub(crate) queue_dirty: crate::queue::QueueDirty,
    /// The waiting tasks the next placement pass reads, with their requests, or every one
    /// (`placement.rs`).
    pub(crate) placement_dirty: cube_controller::marks::Marks<Uuid>,
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
        // A new epoch, durable before any event of it is numbered.
        let epoch = stores.meta.get(EPOCH_KEY)?.unwrap_or(0) + 1;
        stores.meta.put(EPOCH_KEY, &epoch)?;
        let events = EventBroker::for_epoch(epoch);
        let mut cache = TaskCache::default();
        stores.tasks.scan(&mut |task| {
            cache.insert(task);
        })?;
        let mut jobs = BTreeMap::new();
        stores.jobs.scan(&mut |record: JobRecord| {
            jobs.insert(record.job.name.clone(), Arc::new(record));
        })?;
        let mut histories = BTreeMap::new();
        stores.job_versions.scan(&mut |history: JobHistory| {
            if let Some(newest) = history.versions.last() {
                histories.insert(newest.job.name.clone(), Arc::new(history));
            }
        })?;
        let mut deployments = BTreeMap::new();
        stores.deployments.scan(&mut |deployment: Deployment| {
            deployments.insert(deployment.job.clone(), Arc::new(deployment));
        })?;
        let mut queue = BTreeMap::new();
        let mut queue_number = stores.meta.get(QUEUE_NUMBER_KEY)?.unwrap_or(0);
        stores.queue.scan(&mut |entry: QueueEntry| {
            queue_number = queue_number.max(entry.queue);
            queue.insert(entry.key(), Arc::new(entry));
        })?;
        let mut nodes = NodeRegistry::default();
        for node in stores.nodes.list()? {
            match config.worker_client(Some(&node.name), &node.address) {
                Ok(client) => nodes.load(&node, client),
                Err(err) => {
                    // A node that cannot be reached at its address will never report: what
                    // was placed there is lost now, not held there for good.
                    tracing::warn!(node = %node.name, address = %node.address, error = %err, "forgetting a stored node whose address cannot be used; its tasks are Lost");
                    let reason = format!(
                        "node {}'s stored address {:?} cannot be used: {err}",
                        node.name, node.address
                    );
                    lose_tasks_of_forgotten_node(
                        &stores, &mut cache, &events, &node.name, &reason,
                    )?;
                }
            }
        }
        let runner = |max_concurrent: usize| RunnerConfig {
            max_concurrent: max_concurrent.max(1),
            shutdown_grace: RUNNER_SHUTDOWN_GRACE,
        };
        let max_concurrent = config.max_concurrent_reconciles;
        let known_nodes = nodes.len();
        Ok(Arc::new(Manager {
            config,
            stores,
            state: Mutex::new(Shared {
                cache,
                nodes,
                scheduler,
                jobs,
                histories,
                deployments,
                queue,
                queue_number,
                just_admitted: HashMap::new(),
                queue_dirty: crate::queue::QueueDirty::everything(),
                placement_dirty: cube_controller::marks::Marks::everything(),
            }),
            tasks_runner: Runner::new(runner(max_concurrent)),
            placement_runner: Runner::new(runner(1)),
            jobs_runner: Runner::new(runner(max_concurrent.min(4))),
            queue_runner: Runner::new(runner(1)),
            job_writes: tokio::sync::Mutex::new(()),
            jobs_observed: ObservedStore::default(),
            failures: Mutex::new(HashMap::new()),
            dispatched: Mutex::new(HashSet::new()),
            followers: Mutex::new(HashMap::new()),
            background: TaskTracker::new(),
            complete_lists: tokio::sync::Semaphore::new(COMPLETE_LISTS_AT_ONCE),
            shutdown,
            events,
            retry_warnings: LogLimit::new(Duration::from_secs(5)),
            metrics: crate::metrics::ManagerMetrics::default(),
            known_nodes: std::sync::atomic::AtomicUsize::new(known_nodes),
        }))
    }

    /// The interval asked of every node's heartbeats now ([`heartbeat_floor`] of the nodes
    /// known).
    pub fn heartbeat_floor(&self) -> Duration {
        heartbeat_floor(self.known_nodes.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// How long a node may be silent before it is `Down`: `--heartbeat-grace`, or three
    /// heartbeat floors when the cluster is so large that heartbeats were spaced out more.
    pub(crate) fn heartbeat_grace(&self) -> Duration {
        self.config.heartbeat_grace.max(self.heartbeat_floor() * 3)
    }

    pub fn scheduler_name(&self) -> &'static str {
        lock(&self.state).scheduler.name()
    }

    /// `Ok` while the stores take writes; once one has failed, the error every write gets.
    pub fn store_health(&self) -> Result<(), ManagerError> {
        self.stores.tasks.health()?;
        self.stores.nodes.health()?;
        self.stores.jobs.health()?;
        self.stores.job_versions.health()?;
        self.stores.deployments.health()?;
        self.stores.queue.health()?;
        Ok(())
    }

    /// A number that moves with every write to the manager's stores, and only then: the sum
    /// of their revisions (the tables of one store file share one revision, so there the sum
    /// moves by five per write; it is a witness of writes, not a count). A test of a quiet
    /// cluster reads it.
    pub fn store_revision(&self) -> Result<u64, ManagerError> {
        Ok(self.stores.tasks.revision()?
            + self.stores.jobs.revision()?
            + self.stores.nodes.revision()?
            + self.stores.job_versions.revision()?
            + self.stores.deployments.revision()?
            + self.stores.queue.revision()?)
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
        if !event.task.spec.job.is_empty()
            || !event.task.spec.group.is_empty()
            || event.task.spec.index.is_some()
        {
            return Err(ManagerError::BadRequest(
                "Job, Group, Index: set by Cube on the tasks of a job; submit a job with POST \
                 /jobs (cube job run) instead"
                    .to_string(),
            ));
        }
        // A request no node could hold today is accepted and waits, with a warning: nodes
        // join later (a bigger one, one with the right labels, one back from maintenance).
        let warnings = self.fits_nowhere_today(&[(&event.task, 1)]);
        // The manager owns placement and observation: whatever the submission said about
        // them (state, restarts, history, ...) is not the manager's to believe.
        let task = event.task.clone();
        let task = self.accept_task(task, Some(&event)).await?;
        Ok(Submitted::Created(task, warnings))
    }

    /// Records that the user wants the task stopped and queues the stop.
    pub async fn request_stop(&self, id: Uuid) -> Result<Task, ManagerError> {
        let mut stopped = self.request_stops(&[id]).await?;
        stopped.pop().ok_or(ManagerError::NotFound(id))
    }

    /// Records that the user (or a job) wants these tasks stopped, in one hold of the lock and
    /// one wait for the store (one commit for them all), and queues the stops. Returns the
    /// tasks found; an ID no task has is left out.
    pub(crate) async fn request_stops(&self, ids: &[Uuid]) -> Result<Vec<Task>, ManagerError> {
        self.stop_tasks(ids, None).await
    }

    /// [`Manager::request_stops`], with why in each task's history (`reason`; none: the
    /// user asked).
    pub(crate) async fn stop_tasks(
        &self,
        ids: &[Uuid],
        reason: Option<&str>,
    ) -> Result<Vec<Task>, ManagerError> {
        let mut writes = Writes::default();
        let mut stopped = Vec::with_capacity(ids.len());
        let marked = {
            let mut state = lock(&self.state);
            ids.iter().try_for_each(|id| {
                let Some(known) = state.cache.get(id) else {
                    return Ok(());
                };
                let mut task = known.clone();
                // A stop is final at any moment: also for a run that ended and waits out its
                // restart backoff, whose restart it cancels (the policy would restart it
                // while the desired state says Running).
                if task.spec.desired_state != State::Completed {
                    let message = match reason {
                        Some(reason) => reason,
                        None if task.status.next_restart.is_some() => {
                            "the restart it waited for is cancelled"
                        }
                        None => "",
                    };
                    task.spec.desired_state = State::Completed;
                    task.status.next_restart = None;
                    task.record(Utc::now(), "StopRequested", message);
                    self.save(&mut state, &mut writes, task.clone())?;
                }
                stopped.push(task);
                Ok::<(), StoreError>(())
            })
        };
        // What was queued is waited for even when a later write could not be queued.
        self.settle(writes).await?;
        marked?;
        for task in &stopped {
            self.tasks_runner.push(task.id);
        }
        Ok(stopped)
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
            Some(retrying)
                if !task.status.state.is_terminal() || task.status.next_restart.is_some() =>
            {
                let mut shown = (*task).clone();
                shown.status.dispatch_error = Some(retrying.error.clone());
                shown.status.next_attempt = Some(retrying.next_attempt);
                Arc::new(shown)
            }
            _ => task,
        }
    }

    /// A node as the API shows it, with what a drain of it still has to move.
    pub(crate) fn node_view(
        &self,
        state: &Shared,
        entry: &crate::nodes::NodeEntry,
        now: Instant,
    ) -> Node {
        let job_type = |name: &str| state.jobs.get(name).map(|record| record.job.job_type);
        entry.view(&state.cache, now, self.heartbeat_grace(), &job_type)
    }

    pub fn nodes(&self) -> Vec<Node> {
        let state = lock(&self.state);
        let now = Instant::now();
        state
            .nodes
            .entries()
            .map(|entry| self.node_view(&state, entry, now))
            .collect()
    }

    pub fn node(&self, name: &str) -> Result<Node, ManagerError> {
        let state = lock(&self.state);
        let entry = state
            .nodes
            .get(name)
            .ok_or_else(|| ManagerError::NodeNotFound(name.to_string()))?;
        Ok(self.node_view(&state, entry, Instant::now()))
    }

    /// A worker's registration or heartbeat (or a static worker's answer to the manager's
    /// poll). A new node, or one whose address changed, is followed from now on; a node that
    /// can take more work than before gets the tasks waiting for room.
    /// Whether [`Manager::report_node`] would take `report` as it is (its fields, and an
    /// address the manager can call), without taking it: checked before a node token claims
    /// its name.
    pub fn check_report(&self, report: &NodeReport) -> Result<(), ManagerError> {
        let findings = report.validate();
        if !findings.is_empty() {
            return Err(ManagerError::BadRequest(format!(
                "invalid node report: {}",
                findings.join("; ")
            )));
        }
        self.config
            .worker_client(Some(&report.name), &report.address)
            .map_err(|err| ManagerError::BadRequest(format!("Address: {err}")))?;
        Ok(())
    }

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
        let name = report.name.clone();
        let build = |address: &str| {
            self.config
                .worker_client(Some(&name), address)
                .map_err(|err| ManagerError::BadRequest(format!("Address: {err}")))
        };
        // The client for the report's address: the node's own when it is known there (a
        // heartbeat; a client is a connection pool and TLS settings, not made every beat),
        // else a new one, made outside the lock.
        let known_client = |state: &Shared| {
            state
                .nodes
                .get(&name)
                .filter(|entry| entry.address == report.address)
                .map(|entry| entry.client.clone())
        };
        let (mut client, mut fresh) = match known_client(&lock(&self.state)) {
            Some(client) => (client, false),
            None => (build(&report.address)?, true),
        };
        let mut node_write = None;
        let (effect, view) = loop {
            let mut state = lock(&self.state);
            if !fresh && known_client(&state).is_none() {
                // The node moved or went since the look above: a client for this address.
                drop(state);
                client = build(&report.address)?;
                fresh = true;
                continue;
            }
            let now = Instant::now();
            let before = state
                .nodes
                .get(&name)
                .map(|entry| entry.status(now, self.heartbeat_grace()));
            let effect = state.nodes.report(
                report,
                source,
                || client.clone(),
                now,
                self.heartbeat_grace(),
            );
            if effect.more_room {
                // As in `cache_task`: the room is visible from this hold of the lock on.
                state.placement_dirty.mark_everything();
            }
            self.known_nodes
                .store(state.nodes.len(), std::sync::atomic::Ordering::Relaxed);
            let Some(entry) = state.nodes.get(&name) else {
                return Err(ManagerError::NodeNotFound(name));
            };
            let view = self.node_view(&state, entry, now);
            if effect.changed {
                node_write = Some(self.stores.nodes.put_queued(&name, &view)?);
                tracing::info!(node = %name, address = %view.address, source = source.as_str(), "node joined or changed");
                if let Some(warning) = &view.version_warning {
                    tracing::warn!(node = %name, "{warning}");
                }
            }
            // A heartbeat that changes only the stats is no event.
            if let Some(kind) = node_report_event(before, view.status, effect.changed) {
                self.publish_node(&state, &name, kind);
            }
            break (effect, view);
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

    // ----- writes -----

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
        if task.status.state != State::Scheduled {
            // Only a `Scheduled` task is ever dispatched; keep the set small.
            lock(&self.dispatched).remove(&task.id);
        }
        if !task.spec.job.is_empty() {
            // Its job looks again: a copy changed state (level-triggered: a look that finds
            // nothing to do writes nothing).
            self.mark_job_dirty(&task.spec.job);
        }
        // So does the waiting list (a look that finds no entry changed writes nothing);
        // `cache_task` marks the task's request.
        self.push_queue();
        self.cache_task(state, task);
        Ok(())
    }

    /// Applies a task to the cache and, when that changed it, publishes the change: every
    /// write of a task to the cache goes through here (or [`Manager::reload`]).
    fn cache_task(&self, state: &mut Shared, task: Task) {
        let id = task.id;
        state.queue_dirty.mark_task(&task);
        let previous = state.cache.insert(task);
        let Some(held) = state.cache.shared(&id) else {
            return;
        };
        // An equal task changes nothing: the cache keeps (and returns) the one it held.
        if previous
            .as_ref()
            .is_some_and(|previous| Arc::ptr_eq(previous, &held))
        {
            return;
        }
        // Room this change frees is in the cache (and so in the next placement pass's
        // snapshot) from now on: every waiting request is marked in the same hold of the
        // lock, so that a pass that starts before the caller's `push_waiting` still reads
        // them in the waiting list's order, rather than giving the room to a request that
        // arrived after them (found by `cube-bench chaos`).
        if previous.as_deref().is_some_and(|previous| {
            crate::cache::holds_resources(previous)
                && (!crate::cache::holds_resources(&held)
                    || previous.status.node_name != held.status.node_name)
        }) {
            state.placement_dirty.mark_everything();
        }
        publish_task(&self.events, previous.as_deref(), &held);
    }

    /// Runs `operation` (which takes the lock itself and queues its writes), then waits for
    /// its writes to be durable.
    pub(crate) async fn with_writes<T, E>(
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
        let started = Instant::now();
        let waited = !writes.0.is_empty();
        for (id, commit) in writes.0 {
            if let Err(err) = commit.durable().await {
                tracing::error!(task = %id, error = %err, "a write did not become durable");
                self.reload(id);
                first_error.get_or_insert(err);
            }
        }
        if waited {
            self.metrics
                .commits
                .observe(started.elapsed().as_secs_f64());
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Puts the store's version of a task back in the cache (a removal that failed).
    pub(crate) fn reload_task(&self, id: Uuid) {
        self.reload(id);
    }

    /// Puts the store's version of a task back in the cache.
    fn reload(&self, id: Uuid) {
        let stored = self.stores.tasks.get(&id.to_string());
        let mut state = lock(&self.state);
        match stored {
            Ok(Some(task)) => self.cache_task(&mut state, task),
            Ok(None) => {
                if let Some(forgotten) = state.cache.remove(&id) {
                    state.queue_dirty.mark_task(&forgotten);
                    self.events.publish(
                        Topic::Task,
                        Cow::Borrowed("Removed"),
                        id.to_string(),
                        (!forgotten.spec.job.is_empty()).then(|| forgotten.spec.job.clone()),
                        Payload::Task(forgotten),
                        true,
                    );
                }
            }
            Err(err) => {
                tracing::error!(task = %id, error = %err, "cannot read a task back from the store")
            }
        }
    }

    // ----- the loops -----

    /// Starts the control loops: the runners of the task controller, the placement pass and
    /// the job controller, node liveness, the resync, a follower for every known node and a
    /// poller for every static worker. Each ends on shutdown; the followers, started and
    /// replaced as nodes come and go, are waited for by the last loop in the set.
    pub fn start(self: &Arc<Self>) -> JoinSet<()> {
        let mut loops = JoinSet::new();
        loops.spawn(self.clone().run_task_controller());
        loops.spawn(self.clone().run_placement());
        loops.spawn(self.clone().run_job_controller());
        loops.spawn(self.clone().run_queue_controller());
        loops.spawn(self.clone().run_jobs_watcher());
        loops.spawn(self.clone().run_resync());
        loops.spawn(self.clone().run_liveness());
        loops.spawn(self.clone().run_gc());
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
        let background = self.background.clone();
        let shutdown = self.shutdown.clone();
        loops.spawn(async move {
            shutdown.cancelled().await;
            background.close();
            background.wait().await;
        });
        loops
    }
}

impl Manager {
    /// Publishes an event (see the module comment): `kind` is its `Type`, `key` the object's
    /// ID or name, `job` the job it belongs to. Never waits; call it where the change is
    /// applied, under the state lock, so that events keep the order of the changes.
    pub(crate) fn publish(
        &self,
        topic: Topic,
        kind: &str,
        key: &str,
        job: Option<&str>,
        object: serde_json::Value,
    ) {
        self.events.publish(
            topic,
            Cow::Owned(kind.to_string()),
            key.to_string(),
            job.map(str::to_string),
            Payload::Value(object),
            false,
        );
    }

    /// The manager's events, for the API.
    pub fn events(&self) -> &EventBroker {
        &self.events
    }

    /// Publishes a node's event (`NodeRegistered`, `NodeDown`, ...) with its view; called
    /// under the state lock.
    pub(crate) fn publish_node(&self, state: &Shared, name: &str, kind: &str) {
        let Some(entry) = state.nodes.get(name) else {
            return;
        };
        let view = self.node_view(state, entry, Instant::now());
        self.publish(
            Topic::Node,
            kind,
            name,
            None,
            serde_json::to_value(&view).unwrap_or_default(),
        );
    }

    /// Waits until an event after `since` that `relevant` admits is published, `wait` is
    /// over, or the manager stops: the wait of a blocking query (see
    /// [`EventBroker::wait_for`]).
    pub(crate) async fn wait_for_event(
        &self,
        since: u64,
        wait: Duration,
        relevant: impl Fn(&crate::events::Event) -> bool,
    ) {
        self.events
            .wait_for(since, wait, &self.shutdown, relevant)
            .await;
    }

    /// `GET /metrics`: the gauges read from the state, under one hold of its lock, then every
    /// metric as text.
    pub fn metrics_text(&self) -> Result<String, std::fmt::Error> {
        let now = Instant::now();
        {
            let state = lock(&self.state);
            let metrics = &self.metrics;
            metrics.set_tasks(state.cache.tasks().map(|task| task.status.state));
            metrics.set_jobs(state.jobs.values().map(|record| &**record));
            metrics.set_waiting(state.cache.waiting().count());
            metrics.set_queue(state.queue.values().map(|entry| &**entry));
            metrics.set_nodes(
                state
                    .nodes
                    .entries()
                    .map(|entry| (entry, self.node_view(&state, entry, now))),
                now,
            );
        }
        self.metrics.text()
    }
}

/// The event a node's report makes, if any: `NodeRegistered` for a node never seen, the new
/// status when it moved (`NodeReady` back from silence), `NodeUpdated` when its address,
/// capacity, labels or source changed. A heartbeat that changes only the stats makes none.
fn node_report_event(
    before: Option<NodeStatus>,
    after: NodeStatus,
    changed: bool,
) -> Option<&'static str> {
    match before {
        None => Some("NodeRegistered"),
        Some(before) if before != after => Some(node_status_event(after)),
        Some(_) if changed => Some("NodeUpdated"),
        Some(_) => None,
    }
}

/// The event of a node that moved to `status`.
pub(crate) fn node_status_event(status: NodeStatus) -> &'static str {
    match status {
        NodeStatus::Ready => "NodeReady",
        NodeStatus::Down => "NodeDown",
        NodeStatus::Unreachable => "NodeUnreachable",
    }
}

/// Marks `Lost` the tasks placed on a stored node the manager cannot use (its address no
/// longer parses), at start, so that they stop holding resources on a node that will never
/// report and are replaced by their restart policy.
fn lose_tasks_of_forgotten_node(
    stores: &ManagerStores,
    cache: &mut TaskCache,
    events: &EventBroker,
    node: &str,
    reason: &str,
) -> Result<(), StoreError> {
    let placed: Vec<Uuid> = cache
        .load(node)
        .map(|load| load.tasks.iter().copied().collect())
        .unwrap_or_default();
    for id in placed {
        let Some(task) = cache.get(&id) else {
            continue;
        };
        let mut lost = task.clone();
        // A task already lost at an earlier start is left as it is.
        if lost
            .end(State::Lost, Some(reason.to_string()), Utc::now())
            .is_err()
        {
            continue;
        }
        stores.tasks.put(&id.to_string(), &lost)?;
        let previous = cache.insert(lost);
        if let Some(held) = cache.shared(&id) {
            publish_task(events, previous.as_deref(), &held);
        }
    }
    Ok(())
}

/// A manager on memory stores, with no loop started, for the unit tests of its parts.
#[cfg(test)]
pub(crate) fn manager_for_tests() -> Arc<Manager> {
    let stores = ManagerStores::in_memory();
    let scheduler = cube_scheduler::scheduler_by_name("roundrobin").expect("a scheduler");
    Manager::open(test_config(), stores, scheduler, CancellationToken::new())
        .expect("a manager on memory stores")
}

/// Registers a node with `memory` bytes and 2 cores, at an address where nothing answers
/// (its follower fails and waits; nothing is ever sent there), for the unit tests.
#[cfg(test)]
pub(crate) async fn join_test_node(manager: &Arc<Manager>, name: &str, memory: u64) {
    join_test_node_at(manager, name, memory, "127.0.0.1:9").await;
}

/// [`join_test_node`] at `address` (a test's own server standing in for the worker).
#[cfg(test)]
pub(crate) async fn join_test_node_at(
    manager: &Arc<Manager>,
    name: &str,
    memory: u64,
    address: &str,
) {
    let report = NodeReport {
        name: name.to_string(),
        address: address.to_string(),
        capacity: cube_types::Resources {
            cpu: 2.0,
            memory,
            disk: 0,
        },
        stats: None,
        labels: Default::default(),
        version: None,
        host_policy: None,
    };
    manager
        .report_node(report, NodeSource::Registered)
        .await
        .expect("a node report the manager takes");
}

/// A task accepted and placed by one placement pass, its writes durable; its ID.
#[cfg(test)]
pub(crate) async fn placed_test_task(manager: &Arc<Manager>) -> uuid::Uuid {
    let id = manager
        .accept_task(Task::new("t", "cube-sample:latest"), None)
        .await
        .expect("a task the manager takes")
        .id;
    let mut writes = Writes::default();
    assert_eq!(
        manager
            .placement_pass(&mut writes)
            .expect("a placement pass"),
        vec![id]
    );
    manager.settle(writes).await.expect("durable writes");
    id
}

#[cfg(test)]
pub(crate) fn test_config() -> ManagerConfig {
    ManagerConfig {
        heartbeat_grace: Duration::from_secs(60),
        poll_interval: Duration::from_secs(60),
        resync_interval: Duration::from_secs(60),
        static_workers: Vec::new(),
        request_timeout: Duration::from_millis(200),
        max_concurrent_reconciles: 4,
        gc_after: Duration::from_secs(3600),
        max_claimed_per_owner: None,
        acl: None,
        audit: None,
        tls: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_node_that_reports_from_a_new_address_is_reached_there_and_a_bad_one_refused() {
        let manager = manager_for_tests();
        join_test_node(&manager, "w1", 1 << 30).await;
        let report = |address: &str| NodeReport {
            name: "w1".to_string(),
            address: address.to_string(),
            capacity: cube_types::Resources {
                cpu: 2.0,
                memory: 1 << 30,
                disk: 0,
            },
            stats: None,
            labels: Default::default(),
            version: None,
            host_policy: None,
        };
        let base = |manager: &Manager| {
            lock(&manager.state)
                .nodes
                .get("w1")
                .map(|entry| entry.client.base().to_string())
        };
        // A heartbeat at the same address keeps the node's client.
        manager
            .report_node(report("127.0.0.1:9"), NodeSource::Registered)
            .await
            .unwrap();
        assert_eq!(base(&manager).as_deref(), Some("http://127.0.0.1:9"));
        manager
            .report_node(report("127.0.0.1:10"), NodeSource::Registered)
            .await
            .unwrap();
        assert_eq!(
            base(&manager).as_deref(),
            Some("http://127.0.0.1:10"),
            "the node moved: its client follows"
        );
        let refused = manager
            .report_node(report("not an address"), NodeSource::Registered)
            .await;
        assert!(
            matches!(&refused, Err(ManagerError::BadRequest(why)) if why.starts_with("Address")),
            "{refused:?}"
        );
        assert_eq!(base(&manager).as_deref(), Some("http://127.0.0.1:10"));
    }

    #[test]
    fn the_tasks_of_a_stored_node_whose_address_no_longer_parses_are_lost_at_start() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "Name": "gone", "Address": "not an address", "Status": "Ready",
            "Capacity": {}, "Allocated": {}, "TaskCount": 1, "Source": "registered"
        }))
        .unwrap();
        let mut task = Task::new("t", "cube-sample:latest");
        task.status.state = State::Running;
        task.status.node_name = "gone".to_string();
        let stores = ManagerStores::in_memory();
        stores.nodes.put("gone", &node).unwrap();
        stores.tasks.put(&task.id.to_string(), &task).unwrap();
        let scheduler = cube_scheduler::scheduler_by_name("roundrobin").unwrap();
        let manager = Manager::open(
            test_config(),
            stores.clone(),
            scheduler,
            CancellationToken::new(),
        )
        .unwrap();
        let lost = manager.task(task.id).unwrap();
        assert_eq!(lost.status.state, State::Lost);
        assert!(
            lost.status
                .run
                .error
                .as_deref()
                .unwrap_or_default()
                .contains("not an address"),
            "{:?}",
            lost.status.run.error
        );
        let stored = stores.tasks.get(&task.id.to_string()).unwrap().unwrap();
        assert_eq!(stored.status.state, State::Lost, "and so it is stored");
        assert!(manager.node("gone").is_err());
        // Started again on the same store: the task was lost once, and says so once.
        drop(manager);
        let again = Manager::open(
            test_config(),
            stores.clone(),
            cube_scheduler::scheduler_by_name("roundrobin").unwrap(),
            CancellationToken::new(),
        )
        .unwrap();
        let lost = again.task(task.id).unwrap();
        let entries: Vec<&str> = lost
            .status
            .history
            .iter()
            .map(|entry| entry.event.as_ref())
            .collect();
        assert_eq!(entries, ["Lost"], "{:?}", lost.status.history);
    }
}
