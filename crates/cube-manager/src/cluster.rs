//! The cluster as the manager's controllers share it: the stores, the records observed in
//! memory behind one lock ([`Shared`]), the numbered change log, the metrics, and the runners
//! that wake each controller ([`Wakes`]). A controller holds an `Arc<Cluster>` and nothing of
//! the API, so that it can be built and tested on memory stores without a `Manager`.
//!
//! Everything in memory sits behind one `std` mutex ([`Cluster::state`]): each operation
//! holds it for a few map operations, never across an `.await` or an fsync, so placements see
//! a consistent view of every node's allocations. A write is queued to the store under the
//! lock (queued writes keep their order) and applied to the cache at once; it is waited for
//! after the lock is let go ([`Writes`], [`Cluster::settle`]), and nothing is acknowledged to
//! a client or sent to a worker before it is durable. Concurrent writes share one commit.
//! Every write of a task goes through [`Cluster::save`] (or [`Cluster::reload_task`]), and
//! what a task's change wakes is declared there once: its job and the queue controller
//! ([`Cluster::wake_for_task`]), and the placement pass, recorded in [`Writes`] and asked for
//! by [`Cluster::settle`] once the writes are durable. What a node's change wakes is declared
//! once too, by the kind of change ([`NodeChange`], [`Cluster::wake_for_node`]).

use cube_types::shard::ShardScope;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use chrono::Utc;
use cube_api::ApiClient;
use cube_controller::runner::{Runner, RunnerConfig};
use cube_scheduler::Scheduler;
use cube_store::{Commit, Store, StoreError};
use cube_types::deployment::Deployment;
use cube_types::job::{JobHistory, JobRecord, JobType};
use cube_types::project::ProjectRecord;
use cube_types::queue::QueueEntry;
use cube_types::{Node, Receiver, State, Task};
use uuid::Uuid;

use crate::cache::TaskCache;
use crate::events::{EventBroker, Payload, Topic, publish_task};
use crate::nodes::NodeRegistry;

/// The key in the `meta` table of the manager's epoch: how many times it has started on this
/// store. Its events are numbered from epoch × 10^12 (`events.rs`), so that an index never
/// means two events, whatever restarts came between.
pub const EPOCH_KEY: &str = "epoch";

/// The key in the `meta` table of the highest queue number given so far: numbers keep
/// growing across restarts even when the newest entries are gone.
pub const QUEUE_NUMBER_KEY: &str = "queue";

/// How long a runner waits for its running reconciles at shutdown before it aborts them
/// (they are idempotent: the next start does them again). Below `crate::SHUTDOWN_GRACE`.
const RUNNER_SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

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
    /// The projects made with `cube project create`, by name, with their quotas (`default`
    /// is there only once its quota is set).
    pub projects: Arc<dyn Store<ProjectRecord>>,
    /// Where the tasks and the waiting list keep their records (under their shard on etcd).
    pub layout: crate::layout::KeyLayout,
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
            projects: Arc::new(cube_store::MemoryStore::new()),
            layout: crate::layout::KeyLayout::Plain,
        }
    }

    /// The task `id`, from the store: under its project's key when `project` is known,
    /// under any shard's otherwise.
    pub fn stored_task(&self, id: Uuid, project: Option<&str>) -> Result<Option<Task>, StoreError> {
        match project {
            Some(project) => self.tasks.get(&self.layout.task(project, id)),
            None => self.tasks.get_first(&self.layout.task_anywhere(id)),
        }
    }
}

/// The writes one operation queued under the lock, to be waited for once it let go, and the
/// placement pass's wakes they call for, given once they are durable ([`Cluster::settle`]).
#[derive(Default)]
#[must_use = "queued writes must be waited for before anything is acknowledged"]
pub(crate) struct Writes {
    commits: Vec<(Uuid, Commit)>,
    /// Tasks these writes made wait for a node (new, or a new run): the placement pass reads
    /// their requests once the writes are durable, not before (a pass must not place a task
    /// whose submission could still fail).
    to_place: Vec<Uuid>,
    /// Whether these writes freed room on a node (a task ended, or left its node): the
    /// waiting requests are marked under the lock where the room appears (`cache_task`);
    /// the pass is asked for once the writes are durable.
    room_freed: bool,
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
    /// Every project made, as stored, by name (`default` is there only once its quota was
    /// set; it exists all the same).
    pub(crate) projects: BTreeMap<String, Arc<ProjectRecord>>,
    /// Requests a placement pass let in whose entry does not say so yet (the queue
    /// controller writes it after), by key, with their owner: counted against
    /// `--max-claimed-per-owner` meanwhile. Emptied as the entries catch up.
    pub(crate) just_admitted: HashMap<String, String>,
    /// The requests whose entry the queue controller looks at next (`queue_controller.rs`).
    pub(crate) queue_dirty: crate::queue::QueueDirty,
    /// The waiting tasks the next placement pass reads, with their requests, or every one
    /// (`placement.rs`).
    pub(crate) placement_dirty: cube_controller::marks::Marks<Uuid>,
    /// The shards whose records this state holds (`ManagerConfig::shards`, grown by
    /// `Manager::take_shards`): a task a worker reports of another shard is another
    /// manager's to judge.
    pub(crate) scope: ShardScope,
    /// With `--shard-controllers`: the fence of the held shards' writes, which the claims'
    /// transactions carry too (`shard_claims.rs`); changed with `scope`.
    pub(crate) fence: Option<cube_store::Fence>,
}

impl Shared {
    /// What a look at job `name` reads besides its record and the nodes: its copies, its last
    /// deployment, and its newest stable version before `version` (the job controller's look
    /// and `POST /jobs/plan` alike).
    pub(crate) fn job_look_inputs(
        &self,
        name: &str,
        version: u64,
    ) -> (Vec<Arc<Task>>, Option<Arc<Deployment>>, Option<u64>) {
        let last_stable = self
            .histories
            .get(name)
            .and_then(|history| history.last_stable_before(version))
            .map(|stable| stable.version);
        (
            self.cache.of_job(name),
            self.deployments.get(name).cloned(),
            last_stable,
        )
    }

    /// Why the request a task belongs to (itself, or its job) expired in the queue, if it did:
    /// the task controller ends such a task `Failed` with this as its error, where a stop the
    /// user asked for ends it `Completed`.
    pub(crate) fn expiry_of(&self, task: &Task) -> Option<String> {
        let entry = self.queue.get(&crate::queue::QueueDirty::key_of(task))?;
        let version = self.jobs.get(&task.spec.job).map(|record| record.version);
        // A job submitted again after it expired is a new request: its copies did not expire.
        let same_request = task.spec.job.is_empty() || entry.version == version;
        (entry.state == cube_types::queue::QueueState::Expired && same_request)
            .then(|| entry.reason.clone())
    }
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Each critical section updates the store before the cache, and the cache in one call,
    // so a panic inside one leaves nothing half-written that a later reader could trip on.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What the cluster's state is built with, from the manager's flags.
#[derive(Debug, Clone)]
pub(crate) struct ClusterSettings {
    /// `--heartbeat-grace`.
    pub(crate) heartbeat_grace: Duration,
    /// `--max-concurrent-reconciles`: how many tasks the task controller reconciles at once.
    pub(crate) max_concurrent_reconciles: usize,
    /// The shards whose records are read in (`ManagerConfig::shards`).
    pub(crate) scope: ShardScope,
    /// The fence of their writes, for the claims (`ManagerConfig::claims`).
    pub(crate) fence: Option<cube_store::Fence>,
}

/// A client for a node's worker, by name and address.
pub(crate) type WorkerClientFor<'a> =
    &'a dyn Fn(&str, &str) -> Result<ApiClient, cube_api::ClientError>;

/// How long the queue controller's look waits after a task's write, for more writes.
pub(crate) const QUEUE_LOOK_DELAY: Duration = Duration::from_millis(50);

/// How long a look at a job waits after a change of one of its copies, for the changes of
/// others: a look reads every copy (about 0.5 µs each), so its cost grows with the job.
/// 100 µs a copy: while all the copies of a job of 10,000 start, it is looked at once a
/// second, not once per copy (which kept a core busy looking), and 100 such jobs take half a
/// core; a job of 10 copies is looked at within a millisecond.
pub(crate) fn look_delay(copies: usize) -> Duration {
    Duration::from_micros(100).saturating_mul(u32::try_from(copies).unwrap_or(u32::MAX))
}

impl Cluster {
    /// The cluster as `stores` hold it: every task, job, version, deployment, waiting-list
    /// entry and node read into memory, the events numbered in `epoch`. A stored node whose
    /// address no client can be made for (`worker_client`) is forgotten, and its tasks are
    /// `Lost`.
    pub(crate) fn open(
        stores: ManagerStores,
        scheduler: Box<dyn Scheduler>,
        epoch: u64,
        settings: ClusterSettings,
        worker_client: WorkerClientFor<'_>,
    ) -> Result<Cluster, StoreError> {
        let events = EventBroker::for_epoch(epoch);
        // Only the records of the shards this manager holds are read in; every one of them
        // for a manager alone. Projects and nodes are the whole cluster's.
        let scope = &settings.scope;
        let started = std::time::Instant::now();
        let mut cache = TaskCache::default();
        let records = read_records(&stores, scope, &mut |task| {
            cache.insert(task);
        })?;
        let mut projects = BTreeMap::new();
        stores.projects.scan(&mut |record: ProjectRecord| {
            projects.insert(record.name.clone(), Arc::new(record));
        })?;
        let mut nodes = NodeRegistry::default();
        for node in stores.nodes.list()? {
            match worker_client(&node.name, &node.address) {
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
        tracing::info!(
            tasks_read = records.tasks_read,
            tasks_held = records.tasks_held,
            nodes = nodes.len(),
            took = ?started.elapsed(),
            "the state is read in (with several managers on etcd, of the shards held)"
        );
        let runner = |max_concurrent: usize| RunnerConfig {
            max_concurrent: max_concurrent.max(1),
            shutdown_grace: RUNNER_SHUTDOWN_GRACE,
        };
        let max_concurrent = settings.max_concurrent_reconciles;
        let wakes = Wakes {
            tasks: Runner::new(runner(max_concurrent)),
            placement: Runner::new(runner(1)),
            jobs: Runner::new(runner(max_concurrent.min(4))),
            queue: Runner::new(runner(1)),
        };
        let state = Shared {
            cache,
            nodes,
            scheduler,
            jobs: records.jobs,
            histories: records.histories,
            deployments: records.deployments,
            queue: records.queue,
            queue_number: records.queue_number,
            projects,
            just_admitted: HashMap::new(),
            queue_dirty: crate::queue::QueueDirty::everything(),
            placement_dirty: cube_controller::marks::Marks::everything(),
            scope: settings.scope,
            fence: settings.fence,
        };
        Ok(Cluster::new(
            stores,
            state,
            events,
            wakes,
            settings.heartbeat_grace,
        ))
    }
}

/// What [`read_records`] read besides the tasks.
pub(crate) struct ShardRecords {
    pub(crate) jobs: BTreeMap<String, Arc<JobRecord>>,
    pub(crate) histories: BTreeMap<String, Arc<JobHistory>>,
    pub(crate) deployments: BTreeMap<String, Arc<Deployment>>,
    pub(crate) queue: BTreeMap<String, Arc<QueueEntry>>,
    /// The highest queue number given, of every shard: numbers are given in one order for
    /// the whole cluster.
    pub(crate) queue_number: u64,
    /// The tasks read, and of them those handed on.
    pub(crate) tasks_read: usize,
    pub(crate) tasks_held: usize,
}

/// The tasks, jobs, job versions, deployments and waiting-list entries of the projects of
/// `shards`, read from `stores`: each task handed to `task` as it is read (a large store is
/// never held twice), the rest returned. The tasks are read on this thread and the rest on
/// another at the same time (on etcd each table is a read of its own, and the waiting list
/// of a cluster of bare tasks is as long as its tasks). On etcd the tasks and the waiting
/// list are read under the shards' prefixes only (`layout.rs`).
pub(crate) fn read_records(
    stores: &ManagerStores,
    shards: &ShardScope,
    task: &mut dyn FnMut(Task),
) -> Result<ShardRecords, StoreError> {
    let holds = &|project: &str| shards.holds_project(project);
    let prefixes = stores.layout.prefixes(shards);
    let (mut tasks_read, mut tasks_held) = (0, 0);
    let (tasks, rest) = std::thread::scope(|scope| {
        let rest = scope.spawn(|| read_all_but_tasks(stores, holds, prefixes.as_deref()));
        let tasks = scan_under(&*stores.tasks, prefixes.as_deref(), &mut |read: Task| {
            tasks_read += 1;
            if holds(&read.spec.project) {
                tasks_held += 1;
                task(read);
            }
        });
        // A panic there is a defect of this process: carried on, as without the thread.
        let rest = rest
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (tasks, rest)
    });
    tasks?;
    Ok(ShardRecords {
        tasks_read,
        tasks_held,
        ..rest?
    })
}

/// Every value of `store` under one of `prefixes`, or every value (`None`).
fn scan_under<V>(
    store: &dyn Store<V>,
    prefixes: Option<&[String]>,
    visit: &mut dyn FnMut(V),
) -> Result<(), StoreError> {
    match prefixes {
        None => store.scan(visit),
        Some(prefixes) => prefixes
            .iter()
            .try_for_each(|prefix| store.scan_prefix(prefix, visit)),
    }
}

/// [`read_records`]' jobs, versions, deployments and waiting list (no task counted).
fn read_all_but_tasks(
    stores: &ManagerStores,
    holds: &(dyn Fn(&str) -> bool + Sync),
    prefixes: Option<&[String]>,
) -> Result<ShardRecords, StoreError> {
    let mut jobs = BTreeMap::new();
    stores.jobs.scan(&mut |record: JobRecord| {
        if holds(record.job.project()) {
            jobs.insert(record.job.key(), Arc::new(record));
        }
    })?;
    let mut histories = BTreeMap::new();
    stores.job_versions.scan(&mut |history: JobHistory| {
        if let Some(newest) = history.versions.last()
            && holds(newest.job.project())
        {
            histories.insert(newest.job.key(), Arc::new(history));
        }
    })?;
    let mut deployments = BTreeMap::new();
    stores.deployments.scan(&mut |deployment: Deployment| {
        if holds(cube_types::job::project_of_key(&deployment.job)) {
            deployments.insert(deployment.job.clone(), Arc::new(deployment));
        }
    })?;
    let mut queue = BTreeMap::new();
    let mut queue_number = stores.meta.get(QUEUE_NUMBER_KEY)?.unwrap_or(0);
    scan_under(&*stores.queue, prefixes, &mut |entry: QueueEntry| {
        queue_number = queue_number.max(entry.queue);
        if holds(entry.project()) {
            queue.insert(entry.key(), Arc::new(entry));
        }
    })?;
    Ok(ShardRecords {
        jobs,
        histories,
        deployments,
        queue,
        queue_number,
        tasks_read: 0,
        tasks_held: 0,
    })
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
        stores.tasks.put(&stores.layout.task_of(&lost), &lost)?;
        let previous = cache.insert(lost);
        if let Some(held) = cache.shared(&id) {
            publish_task(events, previous.as_deref(), &held);
        }
    }
    Ok(())
}

/// What a task's change in the cache means for the placement pass.
#[derive(Debug, Default, Clone, Copy)]
struct CacheChange {
    /// The task held room on a node and holds none there now.
    freed_room: bool,
    /// The task waits for a node now and did not before (new, or a new run).
    began_waiting: bool,
}

/// Why a node's entry could not be changed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NodeUpdateError {
    #[error("no node named {0:?}")]
    NotFound(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why new tasks were not accepted.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AcceptError {
    /// Two submissions of one new ID raced; the first one won.
    #[error("task {0} exists already")]
    Exists(Uuid),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The runners that wake the controllers, one per controller: a push asks for a look at a
/// key, and a runner never runs two looks at one key at once.
pub(crate) struct Wakes {
    /// The task controller's: task IDs to reconcile (`task_controller.rs`), with the restart
    /// backoffs and error retries as its delays.
    pub(crate) tasks: Runner<Uuid>,
    /// The placement pass's, with its one key (`placement.rs`): every push while a pass is
    /// waiting or running comes down to one more pass.
    pub(crate) placement: Runner<()>,
    /// The job controller's: job names to converge (`job_controller.rs`).
    pub(crate) jobs: Runner<String>,
    /// The queue controller's, with its one key (`queue_controller.rs`).
    pub(crate) queue: Runner<()>,
}

/// The cluster's state, shared by the manager's API and its controllers (see the module
/// comment).
pub(crate) struct Cluster {
    pub(crate) stores: ManagerStores,
    /// The task cache, the node registry, the scheduler, the jobs and the waiting list.
    pub(crate) state: Mutex<Shared>,
    /// Every change as a numbered event (`events.rs`): published under the state lock where
    /// the change is applied, read by `GET /events` and the blocking queries.
    pub(crate) events: EventBroker,
    /// What `GET /metrics` shows (`metrics.rs`).
    pub(crate) metrics: crate::metrics::ManagerMetrics,
    pub(crate) wakes: Wakes,
    /// Tasks whose reconcile keeps failing (a node that cannot be reached, a store error):
    /// the last error and the next attempt, which the API shows on the task
    /// (`DispatchError`, `NextAttempt`). Written by the task controller's error policy and
    /// cleared by its next success. Not stored: it describes this process's attempts. A
    /// `std` mutex: map access only.
    pub(crate) failures: Mutex<HashMap<Uuid, Retrying>>,
    /// Tasks this process has handed to their worker, so that a task is not sent again on
    /// every reconcile while it starts. Forgotten on restart: sending again is harmless.
    /// Written by the task controller; a task's write that is not `Scheduled` clears it.
    pub(crate) dispatched: Mutex<HashSet<Uuid>>,
    /// `--heartbeat-grace`.
    heartbeat_grace_setting: Duration,
    /// How many nodes the registry knows, for the heartbeat floor and the grace that
    /// follows from it; set under the state lock where the registry changes.
    known_nodes: AtomicUsize,
    /// With `--shard-controllers`: what the other shards claimed of each node at the last
    /// placement pass, which `GET /tasks/{id}/placement` explains with as the pass planned.
    pub(crate) others_claims: OthersClaims,
}

/// Each node's claims of the shards another manager holds (`ShardClaims::others`).
pub(crate) type OthersClaims = Mutex<Arc<HashMap<String, cube_types::claims::NodeClaims>>>;

/// A task whose reconcile keeps failing: the last error and when the runner tries again.
#[derive(Debug, Clone)]
pub(crate) struct Retrying {
    pub(crate) error: String,
    pub(crate) next_attempt: chrono::DateTime<chrono::Utc>,
}

impl Cluster {
    /// A cluster of what `stores` hold, already read into `state`, woken by `wakes`.
    pub(crate) fn new(
        stores: ManagerStores,
        state: Shared,
        events: EventBroker,
        wakes: Wakes,
        heartbeat_grace: Duration,
    ) -> Cluster {
        let known_nodes = AtomicUsize::new(state.nodes.len());
        Cluster {
            stores,
            state: Mutex::new(state),
            events,
            metrics: crate::metrics::ManagerMetrics::default(),
            wakes,
            failures: Mutex::new(HashMap::new()),
            dispatched: Mutex::new(HashSet::new()),
            heartbeat_grace_setting: heartbeat_grace,
            known_nodes,
            others_claims: Mutex::new(Arc::new(HashMap::new())),
        }
    }

    /// Records how many nodes the registry knows; called under the state lock where the
    /// registry changes.
    pub(crate) fn count_nodes(&self, state: &Shared) {
        self.known_nodes.store(state.nodes.len(), Ordering::Relaxed);
    }

    /// The interval asked of every node's heartbeats now ([`heartbeat_floor`] of the nodes
    /// known).
    pub(crate) fn heartbeat_floor(&self) -> Duration {
        heartbeat_floor(self.known_nodes.load(Ordering::Relaxed))
    }

    /// How long a node may be silent before it is `Down`: `--heartbeat-grace`, or three
    /// heartbeat floors when the cluster is so large that heartbeats were spaced out more.
    pub(crate) fn heartbeat_grace(&self) -> Duration {
        self.heartbeat_grace_setting.max(self.heartbeat_floor() * 3)
    }

    /// A node as the API shows it, with what a drain of it still has to move.
    pub(crate) fn node_view(
        &self,
        state: &Shared,
        entry: &crate::nodes::NodeEntry,
        now: Instant,
    ) -> Node {
        let job_type = |name: &str| state.jobs.get(name).map(|record| record.job.job_type);
        let mut node = entry.view(&state.cache, now, self.heartbeat_grace(), &job_type);
        // A manager acting for some shards holds only their tasks: what the other shards
        // placed there is added from their claims (as of this manager's last placement
        // pass), so that every manager shows what the node holds, not its own share of it
        // (tried as a new user would: `cube node` said 4 tasks of a node running 8).
        if !state.scope.is_whole()
            && let Some(claims) = lock(&self.others_claims).get(&node.name)
        {
            claims.add_to(&mut node.allocated, &mut node.task_count);
        }
        node
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
        warn_if_older(state, &task);
        let commit = self
            .stores
            .tasks
            .put_queued(&self.stores.layout.task_of(&task), &task)?;
        writes.commits.push((task.id, commit));
        if task.status.state != State::Scheduled {
            // Only a `Scheduled` task is ever dispatched; keep the set small.
            lock(&self.dispatched).remove(&task.id);
        }
        self.wake_for_task(state, &task);
        let id = task.id;
        let changed = self.cache_task(state, task);
        if changed.began_waiting {
            writes.to_place.push(id);
        }
        writes.room_freed |= changed.freed_room;
        Ok(())
    }

    /// What a write of a task wakes, declared once: its job's controller looks again (a
    /// copy changed state), after [`look_delay`] so that the changes of many copies make one
    /// look; and so does the queue controller (`cache_task` marks the task's request), after
    /// [`QUEUE_LOOK_DELAY`] for the same reason (a look reads every copy of a marked job).
    /// Both are level-triggered: a look that finds nothing to do writes nothing. The placement
    /// pass is woken by [`Cluster::settle`] for a task that began to wait and for room that a
    /// write freed (see [`Writes`]); the task controller by whoever asks for a reconcile of
    /// the task.
    fn wake_for_task(&self, state: &Shared, task: &Task) {
        if !task.spec.job.is_empty() {
            let delay = look_delay(state.cache.job_len(&task.spec.job));
            self.wakes.jobs.push_after(task.spec.job.clone(), delay);
        }
        self.wakes.queue.push_after((), QUEUE_LOOK_DELAY);
    }

    /// Declares a node's change where it is applied, under the lock: when the node has room it
    /// did not have, every waiting request is marked from this hold of the lock on (as
    /// `cache_task` does for room a task freed), so that a placement pass in between reads them
    /// all in the waiting list's order. What the change wakes comes once it is durable: hand
    /// the answer to [`Cluster::wake_for_node`].
    pub(crate) fn node_changed(
        &self,
        state: &mut Shared,
        name: &str,
        change: NodeChange,
    ) -> NodeWake {
        if change.frees_room() {
            state.placement_dirty.mark_everything();
        }
        NodeWake {
            name: name.to_string(),
            change,
        }
    }

    /// What a node's change wakes, declared here once for every kind of change (see
    /// [`NodeChange`]); called once the change is durable.
    pub(crate) fn wake_for_node(&self, wake: NodeWake) {
        let NodeWake { name, change } = wake;
        match change {
            NodeChange::Room => {
                // Stops to deliver and lost runs to report there; what waits may go there
                // (`node_changed` marked every waiting request already); system jobs may want
                // a copy there.
                self.push_node_tasks(&name);
                self.wakes.placement.push(());
                self.mark_system_jobs_dirty();
            }
            // System jobs may want a copy there, or no longer want the one they have.
            NodeChange::Facts | NodeChange::Removed => self.mark_system_jobs_dirty(),
            NodeChange::Enabled => {
                // What waits may go there (marked by `node_changed`); jobs may place copies
                // there again.
                self.wakes.placement.push(());
                self.mark_all_jobs_dirty();
            }
            // Its job copies move (a drain) or stay where they are, but no new one goes there.
            NodeChange::OutOfService => self.mark_all_jobs_dirty(),
            // Down: its tasks' writes (`Lost`) wake their jobs and the queue, and whoever lost
            // them wakes the task controller for each. Drained: nothing is left to move.
            NodeChange::Down | NodeChange::Drained => {}
        }
    }

    /// Asks the job controller to look at job `name` (again).
    pub(crate) fn mark_job_dirty(&self, name: &str) {
        self.wakes.jobs.push(name.to_string());
    }

    /// Wakes the task controller for every task placed on `node`.
    pub(crate) fn push_node_tasks(&self, node: &str) {
        let placed_here: Vec<Uuid> = lock(&self.state)
            .cache
            .load(node)
            .map(|load| load.tasks.iter().copied().collect())
            .unwrap_or_default();
        for id in placed_here {
            self.wakes.tasks.push(id);
        }
    }

    /// Wakes the job controller for every system job (a node joined, left, came back or
    /// changed its labels).
    pub(crate) fn mark_system_jobs_dirty(&self) {
        let system: Vec<String> = lock(&self.state)
            .jobs
            .values()
            .filter(|record| record.job.job_type == JobType::System && !record.stopped)
            .map(|record| record.job.key())
            .collect();
        for name in system {
            self.mark_job_dirty(&name);
        }
    }

    /// Wakes the job controller for every job (at start, at each resync, after a drain).
    pub(crate) fn mark_all_jobs_dirty(&self) {
        let names: Vec<String> = lock(&self.state).jobs.keys().cloned().collect();
        for name in names {
            self.mark_job_dirty(&name);
        }
    }

    /// The scheduler's snapshot of every node: what it offers, what is placed there.
    pub(crate) fn node_views(&self, state: &Shared) -> Vec<cube_scheduler::NodeView> {
        self.each_node_view(state).collect()
    }

    /// [`Cluster::node_views`] one at a time, for a look that may stop at the first node.
    pub(crate) fn each_node_view<'a>(
        &'a self,
        state: &'a Shared,
    ) -> impl Iterator<Item = cube_scheduler::NodeView> + 'a {
        let now = Instant::now();
        state.nodes.entries().map(move |entry| {
            let load = state.cache.load(&entry.name);
            cube_scheduler::NodeView {
                name: entry.name.clone(),
                ready: entry.is_ready(now, self.heartbeat_grace()),
                ineligible: !entry.eligible,
                capacity: entry.capacity,
                allocated: load.map(|load| load.allocated).unwrap_or_default(),
                task_count: load.map(|load| load.tasks.len()).unwrap_or(0),
                host_ports_taken: load
                    .map(|load| load.host_ports.keys().copied().collect())
                    .unwrap_or_default(),
                labels: entry.labels.clone(),
                host_policy: entry.host_policy.clone(),
            }
        })
    }

    /// What the job controller's plan needs of each node.
    ///
    /// A system job's look reads every node (a copy on each); any other job's only the
    /// draining ones (its copies there move): with 10,000 nodes, the facts of every node at
    /// every look of a service job were a tenth of the manager's time.
    pub(crate) fn node_facts(
        &self,
        state: &Shared,
        job_type: JobType,
    ) -> Vec<crate::jobs::NodeFacts> {
        let now = Instant::now();
        let every_node = job_type == JobType::System;
        state
            .nodes
            .entries()
            .filter(|entry| every_node || entry.drain.is_some())
            .map(|entry| crate::jobs::NodeFacts {
                name: entry.name.clone(),
                ready: entry.is_ready(now, self.heartbeat_grace()),
                labels: entry.labels.clone(),
                eligible: entry.eligible,
                drain: entry.drain.as_ref().map(|drain| drain.deadline),
            })
            .collect()
    }

    /// Records that these tasks are wanted stopped, with why in each one's history (`reason`;
    /// none: the user asked), in one hold of the lock and one wait for the store (one commit
    /// for them all), and wakes the task controller for each. Returns the tasks found; an ID
    /// no task has is left out.
    pub(crate) async fn stop_tasks(
        &self,
        ids: &[Uuid],
        reason: Option<&str>,
    ) -> Result<Vec<Task>, StoreError> {
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
            self.wakes.tasks.push(task.id);
        }
        Ok(stopped)
    }

    /// Stores new tasks `Pending` (durably), in one hold of the lock and one wait for the
    /// store (one commit for them all), and asks for a placement pass over them: what a
    /// submission does, and how a job's new copies are stored. `created` is
    /// the submission's own time, if it gave one.
    pub(crate) async fn accept_tasks(
        &self,
        tasks: Vec<Task>,
        created: Option<chrono::DateTime<Utc>>,
    ) -> Result<Vec<Task>, AcceptError> {
        let mut writes = Writes::default();
        let mut accepted = Vec::with_capacity(tasks.len());
        let stored = {
            let mut state = lock(&self.state);
            tasks.into_iter().try_for_each(|mut task| {
                let id = task.id;
                if state.cache.get(&id).is_some() {
                    // Two submissions of one new ID raced; the first one won.
                    return Err(AcceptError::Exists(id));
                }
                task.clear_status(Receiver::Manager);
                task.status.created_time = Some(created.unwrap_or_else(Utc::now));
                let why = if task.spec.job.is_empty() {
                    String::new()
                } else {
                    format!("by job {}", task.spec.job)
                };
                task.record(Utc::now(), "Submitted", why);
                self.save(&mut state, &mut writes, task.clone())?;
                accepted.push(task);
                Ok(())
            })
        };
        // What was queued is waited for even when a later task was refused; once durable,
        // the new tasks ask for a placement pass (`Writes`).
        self.settle(writes).await?;
        stored?;
        Ok(accepted)
    }

    /// Asks the queue controller for a look at the requests marked since its last one.
    pub(crate) fn push_queue(&self) {
        self.wakes.queue.push(());
    }

    /// Asks for a placement pass over every waiting task: room may have appeared.
    pub(crate) fn push_waiting(&self) {
        lock(&self.state).placement_dirty.mark_everything();
        self.wakes.placement.push(());
    }

    /// Asks for a placement pass over these new waiting tasks (and the requests they belong
    /// to): nothing else changed, so what waited before still does not fit, and a pass need
    /// not read it again (with 10,000 tasks waiting for room, a submission costs a look at
    /// its own request, not at all of them).
    pub(crate) fn push_to_place(&self, ids: impl IntoIterator<Item = Uuid>) {
        {
            let mut state = lock(&self.state);
            for id in ids {
                state.placement_dirty.mark(id);
            }
        }
        self.wakes.placement.push(());
    }

    /// Applies a task to the cache and, when that changed it, publishes the change: every
    /// write of a task to the cache goes through here (or [`Cluster::reload_task`]). Returns
    /// what the change means for the placement pass.
    fn cache_task(&self, state: &mut Shared, task: Task) -> CacheChange {
        let id = task.id;
        state.queue_dirty.mark_task(&task);
        let previous = state.cache.insert(task);
        let Some(held) = state.cache.shared(&id) else {
            return CacheChange::default();
        };
        // An equal task changes nothing: the cache keeps (and returns) the one it held.
        if previous
            .as_ref()
            .is_some_and(|previous| Arc::ptr_eq(previous, &held))
        {
            return CacheChange::default();
        }
        let began_waiting = held.status.state == State::Pending
            && previous
                .as_deref()
                .is_none_or(|previous| previous.status.state != State::Pending);
        // Room this change frees is in the cache (and so in the next placement pass's
        // snapshot) from now on: every waiting request is marked in the same hold of the
        // lock, so that a pass that starts before this write's `settle` asks for one still
        // reads them in the waiting list's order, rather than giving the room to a request
        // that arrived after them (found by `cube-bench chaos`).
        let freed = previous.as_deref().is_some_and(|previous| {
            crate::cache::holds_resources(previous)
                && (!crate::cache::holds_resources(&held)
                    || previous.status.node_name != held.status.node_name)
        });
        if freed {
            state.placement_dirty.mark_everything();
        }
        publish_task(&self.events, previous.as_deref(), &held);
        CacheChange {
            freed_room: freed,
            began_waiting,
        }
    }

    /// Runs `operation` (which takes the lock itself and queues its writes), then waits for
    /// its writes to be durable. A write that did not become durable is the error, before
    /// whatever `operation` returned.
    pub(crate) async fn with_writes<T, E: From<StoreError>>(
        &self,
        operation: impl FnOnce(&mut Writes) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut writes = Writes::default();
        let result = operation(&mut writes);
        self.settle(writes).await?;
        result
    }

    /// Waits until every write in `writes` is durable, then asks for the placement pass the
    /// writes call for (see [`Writes`]). A write that cannot be made durable
    /// puts the store's version of its task back in the cache (or forgets a task the store
    /// never had), so that nothing is shown or acted on that a restart would not know. Returns
    /// the first error.
    pub(crate) async fn settle(&self, writes: Writes) -> Result<(), StoreError> {
        let mut first_error = None;
        let started = Instant::now();
        let waited = !writes.commits.is_empty();
        for (id, commit) in writes.commits {
            if let Err(err) = commit.durable().await {
                tracing::error!(task = %id, error = %err, "a write did not become durable");
                self.reload_task(id);
                first_error.get_or_insert(err);
            }
        }
        if waited {
            self.metrics
                .commits
                .observe(started.elapsed().as_secs_f64());
        }
        if !writes.to_place.is_empty() {
            // A write that did not become durable was put back above; marking its task is
            // harmless (a pass reads only what waits).
            self.push_to_place(writes.to_place);
        } else if writes.room_freed {
            self.wakes.placement.push(());
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Puts the store's version of a task back in the cache (a write or a removal that
    /// failed).
    pub(crate) fn reload_task(&self, id: Uuid) {
        let project = lock(&self.state)
            .cache
            .get(&id)
            .map(|task| task.spec.project.clone());
        let stored = self.stores.stored_task(id, project.as_deref());
        let mut state = lock(&self.state);
        match stored {
            Ok(Some(task)) => {
                self.cache_task(&mut state, task);
            }
            Ok(None) => {
                if let Some(forgotten) = state.cache.remove(&id) {
                    state.queue_dirty.mark_task(&forgotten);
                    self.events.publish(
                        Topic::Task,
                        Cow::Borrowed("Removed"),
                        id.to_string(),
                        crate::events::Belongs {
                            job: (!forgotten.spec.job.is_empty())
                                .then(|| forgotten.spec.job.clone()),
                            project: Some(forgotten.spec.project.clone()),
                        },
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

    /// Publishes an event (see the module comment): `kind` is its `Type`, `key` the object's
    /// ID or name, `job` the job it belongs to. Never waits; call it where the change is
    /// applied, under the state lock, so that events keep the order of the changes.
    pub(crate) fn publish(
        &self,
        topic: Topic,
        kind: &str,
        key: &str,
        job: Option<&str>,
        project: Option<&str>,
        object: serde_json::Value,
    ) {
        self.events.publish(
            topic,
            Cow::Owned(kind.to_string()),
            key.to_string(),
            crate::events::Belongs {
                job: job.map(str::to_string),
                project: project.map(str::to_string),
            },
            Payload::Value(object),
            false,
        );
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
            None,
            serde_json::to_value(&view).unwrap_or_default(),
        );
    }

    /// Changes a node's entry with `change` under the lock; when it says what changed (the
    /// event's type), stores the node and publishes the event. Returns whether it changed.
    pub(crate) async fn update_node(
        &self,
        name: &str,
        change: impl FnOnce(&mut crate::nodes::NodeEntry) -> Option<&'static str>,
    ) -> Result<bool, NodeUpdateError> {
        let (commit, wake) = {
            let mut state = lock(&self.state);
            let entry = state
                .nodes
                .get_mut(name)
                .ok_or_else(|| NodeUpdateError::NotFound(name.to_string()))?;
            let Some(kind) = change(entry) else {
                return Ok(false);
            };
            let wake = NodeChange::of_event(kind)
                .map(|change| self.node_changed(&mut state, name, change));
            let Some(entry) = state.nodes.get(name) else {
                return Ok(false);
            };
            let view = self.node_view(&state, entry, Instant::now());
            let commit = self.stores.nodes.put_queued(name, &view)?;
            self.publish_node(&state, name, kind);
            (commit, wake)
        };
        commit.durable().await?;
        if let Some(wake) = wake {
            self.wake_for_node(wake);
        }
        Ok(true)
    }
}

/// What changed about a node, by what it means for the controllers: [`Cluster::wake_for_node`]
/// says once what each kind wakes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NodeChange {
    /// It joined, came back (from `Down` or `Unreachable`) or grew: it has room it did not have.
    Room,
    /// Its address, labels or version changed, and no room appeared.
    Facts,
    /// It takes work again (eligible again; a drain under way ends).
    Enabled,
    /// It takes no new work: ineligible, or draining.
    OutOfService,
    /// Its drain ended with nothing left to move.
    Drained,
    /// It stopped reporting: its tasks are lost.
    Down,
    /// It was forgotten.
    Removed,
}

impl NodeChange {
    /// The change a node event made by [`Cluster::update_node`] stands for.
    fn of_event(kind: &str) -> Option<NodeChange> {
        match kind {
            "NodeEligible" => Some(NodeChange::Enabled),
            "NodeIneligible" | "NodeDrain" => Some(NodeChange::OutOfService),
            "NodeDrained" => Some(NodeChange::Drained),
            _ => None,
        }
    }

    /// Whether the node has room it did not have.
    fn frees_room(self) -> bool {
        matches!(self, NodeChange::Room | NodeChange::Enabled)
    }
}

/// A node's change whose wakes are still to come ([`Cluster::node_changed`]).
#[must_use = "a node's change wakes the controllers only through Cluster::wake_for_node, once durable"]
pub(crate) struct NodeWake {
    name: String,
    change: NodeChange,
}

/// Says, loudly, when a save would put an older version of a task over the one the cache
/// holds: the same run with fewer history entries (a change only ever adds entries, and the
/// history's limit keeps its length; putting the stored version back after a failed write,
/// `reload_task`, is not a save). Nothing should do this; a new leader was seen to serve a
/// task as it was placed after its follower had recorded it running, with no error, under a
/// heavy Docker load (`the_leader_killed_with_200_submissions_in_flight…` in
/// `crates/cube/tests/etcd.rs`): the stack says which path saved the older version.
fn warn_if_older(state: &Shared, task: &Task) {
    let Some(held) = state.cache.get(&task.id) else {
        return;
    };
    if held.status.restart_count == task.status.restart_count
        && task.status.history.len() < held.status.history.len()
    {
        tracing::error!(
            task = %task.id,
            held = %held.status.state,
            saved = %task.status.state,
            held_entries = held.status.history.len(),
            saved_entries = task.status.history.len(),
            stack = %std::backtrace::Backtrace::force_capture(),
            "an older version of a task is saved over the one held"
        );
    }
}

/// A cluster on memory stores, read from `stores`, for the unit tests of one controller
/// (no `Manager` is built; nothing is ever sent to a node's address).
#[cfg(test)]
pub(crate) fn cluster_for_tests(stores: ManagerStores, heartbeat_grace: Duration) -> Arc<Cluster> {
    let scheduler = cube_scheduler::scheduler_by_name("roundrobin").expect("a scheduler");
    let settings = ClusterSettings {
        heartbeat_grace,
        max_concurrent_reconciles: 4,
        scope: ShardScope::all(cube_types::shard::DEFAULT_RING),
        fence: None,
    };
    let client = |_: &str, address: &str| ApiClient::new(address, Duration::from_millis(200));
    Arc::new(
        Cluster::open(stores, scheduler, 1, settings, &client).expect("a cluster on memory stores"),
    )
}

#[cfg(test)]
impl Cluster {
    /// Stores `task` as a controller would, durably, for the unit tests.
    pub(crate) async fn store_for_tests(&self, task: Task) {
        self.with_writes(|writes| {
            let mut state = lock(&self.state);
            self.save(&mut state, writes, task)
        })
        .await
        .expect("a task the store takes");
    }

    /// The sum of the tables' revisions: it moves with every write, and only then.
    pub(crate) fn store_revision_for_tests(&self) -> u64 {
        self.stores.tasks.revision().expect("a revision")
            + self.stores.jobs.revision().expect("a revision")
            + self.stores.deployments.revision().expect("a revision")
            + self.stores.queue.revision().expect("a revision")
    }
}

/// Registers node `name` (2 cores, 1 GiB) as reporting at `now`, for the unit tests.
#[cfg(test)]
pub(crate) fn report_test_node(cluster: &Cluster, name: &str, now: Instant) {
    let report = crate::nodes::test_report(name, "127.0.0.1:9", 2.0, 1 << 30);
    let grace = cluster.heartbeat_grace();
    let mut state = lock(&cluster.state);
    let client = || ApiClient::new("127.0.0.1:9", Duration::from_millis(200)).expect("a client");
    state.nodes.report(
        report,
        crate::nodes::NodeSource::Registered,
        client,
        now,
        grace,
    );
    cluster.count_nodes(&state);
}
