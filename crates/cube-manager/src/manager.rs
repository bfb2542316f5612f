//! The manager: the API's facade over the cluster's state ([`Cluster`], `cluster.rs`) and
//! the place that builds and starts the controllers. Its operations are what the API calls:
//! submissions, stops, reads, node reports, removals, and the poller of each static worker.
//!
//! The controllers are values over an `Arc<Cluster>`, each in a file of its own and on the
//! controller framework's runner (`cube_controller::runner`) or a timer: the task controller
//! (`task_controller.rs`), the placement pass (`placement.rs`), the job controller
//! (`job_controller.rs`), the queue controller (`queue_controller.rs`), liveness and the
//! resync (`liveness.rs`), the followers of the workers' task lists (`followers.rs`) and the
//! garbage collector (`gc.rs`). How the state is held and written (one lock, writes durable
//! before they are acknowledged, what a write wakes) is `cluster.rs`'s module comment.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use cube_api::ApiClient;
use cube_scheduler::Scheduler;
use cube_store::StoreError;
use cube_types::{Node, NodeReport, NodeStatus, RestartBy, State, Task, TaskEvent};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::cluster::{
    Cluster, ClusterSettings, EPOCH_KEY, ManagerStores, NodeChange, Retrying, Shared, Writes, lock,
};
use crate::events::EventBroker;
use crate::followers::Followers;
use crate::job_records::JobRecords;
use crate::nodes::{NodeSource, node_status_event};
use crate::paging::{PagePosition, PageStart};

/// Settings that do not change while the manager runs.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// The shards whose records this manager holds and acts on (`cube_types::shard`): every
    /// shard of the ring for a manager on its own store, and for the leader of managers on
    /// etcd, which acts for all today. Records of other shards are neither loaded nor
    /// accepted ([`ManagerError::NotOwner`]).
    pub shards: cube_types::shard::ShardScope,
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
    /// The projects' secrets and registry logins, sealed (`secrets.rs`).
    pub secrets: Arc<crate::secrets::Secrets>,
    /// With `--shard-controllers`: where the nodes' claims are kept and the fence of the
    /// shards held (`shard_claims.rs`); `None` counts a node's load from this manager's
    /// tasks alone, which then are every task placed.
    pub claims: Option<crate::shard_claims::ClaimsSettings>,
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
        // Each call names the node meant: whatever answers at a stale address (another worker
        // given the port or the address since) refuses it rather than have its tasks judged
        // as this node's.
        Ok(
            ApiClient::of_one_of_many(address, self.request_timeout, tls)?
                .with_token(token.as_deref())
                .with_node(node),
        )
    }
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
    #[error("no project named {0:?} (cube project list; cube project create {0})")]
    ProjectNotFound(String),
    /// The project's records are in a shard another manager holds.
    #[error(
        "project {project:?} is in shard {shard} of the ring, which this manager does not \
         hold: send the request to the manager holding shard {shard} (cube node managers, \
         GET /shards)"
    )]
    NotOwner { project: String, shard: u32 },
    /// The request could never fit its project's quota.
    #[error("{0}")]
    OverQuota(String),
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

impl From<crate::cluster::AcceptError> for ManagerError {
    fn from(err: crate::cluster::AcceptError) -> Self {
        match err {
            crate::cluster::AcceptError::Exists(_) => ManagerError::Conflict(err.to_string()),
            crate::cluster::AcceptError::Store(err) => ManagerError::Store(err),
        }
    }
}

impl From<crate::job_controller::ConvergeError> for ManagerError {
    fn from(err: crate::job_controller::ConvergeError) -> Self {
        match err {
            crate::job_controller::ConvergeError::Store(err) => ManagerError::Store(err),
            crate::job_controller::ConvergeError::Accept(err) => err.into(),
        }
    }
}

impl From<crate::gc::RemoveError> for ManagerError {
    fn from(err: crate::gc::RemoveError) -> Self {
        match err {
            crate::gc::RemoveError::Unavailable(message) => ManagerError::Unavailable(message),
            crate::gc::RemoveError::Store(err) => ManagerError::Store(err),
        }
    }
}

impl From<crate::cluster::NodeUpdateError> for ManagerError {
    fn from(err: crate::cluster::NodeUpdateError) -> Self {
        match err {
            crate::cluster::NodeUpdateError::NotFound(name) => ManagerError::NodeNotFound(name),
            crate::cluster::NodeUpdateError::Store(err) => ManagerError::Store(err),
        }
    }
}

/// What a submission did: created a task (with warnings: why no node could hold it today),
/// or found it already there.
#[derive(Debug, Clone, PartialEq)]
pub enum Submitted {
    Created(Task, Vec<String>),
    Existing(Task),
}

/// The manager: the API's facade over the cluster's state ([`Cluster`]), and the place that
/// builds and starts the controllers.
pub struct Manager {
    pub(crate) config: ManagerConfig,
    /// The stores, the observed records, the change log and the controllers' wakes, shared
    /// with every controller.
    pub(crate) cluster: Arc<Cluster>,
    /// The jobs' write side, shared with the job controller (`job_records.rs`).
    pub(crate) job_records: Arc<JobRecords>,
    /// The followers of the workers' task lists (`followers.rs`).
    pub(crate) followers: Arc<Followers>,
    /// Node reports whose write failed (answered 503, which a front telling every manager
    /// writes only at debug level): a warning at most once per 10 s.
    unwritten_reports: crate::log_limit::LogLimit,
    /// Cancelled when the manager stops; every loop watches it.
    pub(crate) shutdown: CancellationToken,
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
        let settings = ClusterSettings {
            heartbeat_grace: config.heartbeat_grace,
            max_concurrent_reconciles: config.max_concurrent_reconciles,
            scope: config.shards.clone(),
            fence: config
                .claims
                .as_ref()
                .and_then(|claims| claims.fence.clone()),
        };
        let cluster = Cluster::open(stores, scheduler, epoch, settings, &|name, address| {
            config.worker_client(Some(name), address)
        })?;
        let cluster = Arc::new(cluster);
        Ok(Arc::new(Manager {
            config,
            job_records: Arc::new(JobRecords::new(cluster.clone())),
            followers: Arc::new(Followers::new(cluster.clone(), shutdown.clone())),
            unwritten_reports: crate::log_limit::LogLimit::new(Duration::from_secs(10)),
            cluster,
            shutdown,
        }))
    }

    /// The interval asked of every node's heartbeats now ([`heartbeat_floor`] of the nodes
    /// known).
    pub fn heartbeat_floor(&self) -> Duration {
        self.cluster.heartbeat_floor()
    }

    pub fn scheduler_name(&self) -> &'static str {
        lock(&self.cluster.state).scheduler.name()
    }

    /// `Ok` while the stores take writes; once one has failed, the error every write gets.
    pub fn store_health(&self) -> Result<(), ManagerError> {
        self.cluster.stores.tasks.health()?;
        self.cluster.stores.nodes.health()?;
        self.cluster.stores.jobs.health()?;
        self.cluster.stores.job_versions.health()?;
        self.cluster.stores.deployments.health()?;
        self.cluster.stores.queue.health()?;
        Ok(())
    }

    /// A number that moves with every write to the manager's stores, and only then: the sum
    /// of their revisions (the tables of one store file share one revision, so there the sum
    /// moves by five per write; it is a witness of writes, not a count). A test of a quiet
    /// cluster reads it.
    pub fn store_revision(&self) -> Result<u64, ManagerError> {
        Ok(self.cluster.stores.tasks.revision()?
            + self.cluster.stores.jobs.revision()?
            + self.cluster.stores.nodes.revision()?
            + self.cluster.stores.job_versions.revision()?
            + self.cluster.stores.deployments.revision()?
            + self.cluster.stores.queue.revision()?)
    }

    /// A consistent copy of the manager's store file (its tables share one file), to read.
    pub fn backup_store(&self) -> Result<std::fs::File, ManagerError> {
        Ok(self.cluster.stores.tasks.backup()?)
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
            let state = lock(&self.cluster.state);
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
        let spec = &event.task.spec;
        self.check_quota(
            &spec.project,
            &cube_types::project::Usage::of_task(spec.cpu, spec.memory, spec.disk),
        )?;
        crate::routes::refuse_taken_hosts(
            &lock(&self.cluster.state),
            &[("this task", spec.route.as_ref())],
            None,
        )?;
        let warnings = self.fits_nowhere_today(&[(&event.task, 1)]);
        // The manager owns placement and observation: whatever the submission said about
        // them (state, restarts, history, ...) is not the manager's to believe.
        let task = event.task.clone();
        let task = self.accept_task(task, Some(&event)).await?;
        Ok(Submitted::Created(task, warnings))
    }

    /// Stores a new task `Pending` (durably) and asks for a placement pass: what a submission
    /// does. `event` is the `TaskEvent` a submission came in; its timestamp, if it has one,
    /// is the task's `CreatedTime`.
    pub(crate) async fn accept_task(
        &self,
        task: Task,
        event: Option<&cube_types::TaskEvent>,
    ) -> Result<Task, ManagerError> {
        let created = event.and_then(|event| event.timestamp);
        let mut accepted = self.cluster.accept_tasks(vec![task], created).await?;
        accepted
            .pop()
            .ok_or_else(|| ManagerError::BadRequest("no task to accept".to_string()))
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
    /// user asked): [`Cluster::stop_tasks`].
    pub(crate) async fn stop_tasks(
        &self,
        ids: &[Uuid],
        reason: Option<&str>,
    ) -> Result<Vec<Task>, ManagerError> {
        Ok(self.cluster.stop_tasks(ids, reason).await?)
    }

    pub fn task(&self, id: Uuid) -> Result<Arc<Task>, ManagerError> {
        let task = lock(&self.cluster.state)
            .cache
            .shared(&id)
            .ok_or(ManagerError::NotFound(id))?;
        Ok(self.with_attempts(task, &lock(&self.cluster.failures)))
    }

    /// A page of tasks, oldest first (see `TaskCache::page`), and where the next one starts.
    /// `None` when `start` names no task.
    pub fn tasks_page(
        &self,
        start: Option<PageStart>,
        limit: usize,
        keep: impl Fn(&Task) -> bool,
    ) -> Option<(Vec<Arc<Task>>, Option<PagePosition>)> {
        let (page, next) = lock(&self.cluster.state).cache.page(start, limit, keep)?;
        let failures = lock(&self.cluster.failures);
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

    pub fn nodes(&self) -> Vec<Node> {
        let state = lock(&self.cluster.state);
        let now = Instant::now();
        state
            .nodes
            .entries()
            .map(|entry| self.cluster.node_view(&state, entry, now))
            .collect()
    }

    pub fn node(&self, name: &str) -> Result<Node, ManagerError> {
        let state = lock(&self.cluster.state);
        let entry = state
            .nodes
            .get(name)
            .ok_or_else(|| ManagerError::NodeNotFound(name.to_string()))?;
        Ok(self.cluster.node_view(&state, entry, Instant::now()))
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
        let (mut client, mut fresh) = match known_client(&lock(&self.cluster.state)) {
            Some(client) => (client, false),
            None => (build(&report.address)?, true),
        };
        let mut node_write = None;
        let (effect, view, wake) = loop {
            let mut state = lock(&self.cluster.state);
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
                .map(|entry| entry.status(now, self.cluster.heartbeat_grace()));
            let effect = state.nodes.report(
                report,
                source,
                || client.clone(),
                now,
                self.cluster.heartbeat_grace(),
            );
            // What the report changed wakes (`Cluster::wake_for_node`) once it is durable.
            let change = if effect.more_room {
                Some(NodeChange::Room)
            } else {
                effect.changed.then_some(NodeChange::Facts)
            };
            let wake = change.map(|change| self.cluster.node_changed(&mut state, &name, change));
            self.cluster.count_nodes(&state);
            let Some(entry) = state.nodes.get(&name) else {
                return Err(ManagerError::NodeNotFound(name));
            };
            let view = self.cluster.node_view(&state, entry, now);
            let unwritten = state
                .nodes
                .get_mut(&name)
                .map(|entry| std::mem::take(&mut entry.unwritten))
                .unwrap_or(false);
            if effect.changed || unwritten {
                node_write = Some(
                    self.cluster
                        .stores
                        .nodes
                        .put_queued(&name, &view)
                        .inspect_err(|_| {
                            if let Some(entry) = state.nodes.get_mut(&name) {
                                entry.unwritten = true;
                            }
                        })?,
                );
                tracing::info!(node = %name, address = %view.address, source = source.as_str(), "node joined or changed");
                if let Some(warning) = &view.version_warning {
                    tracing::warn!(node = %name, "{warning}");
                }
            }
            // A heartbeat that changes only the stats is no event.
            if let Some(kind) = node_report_event(before, view.status, effect.changed) {
                self.cluster.publish_node(&state, &name, kind);
            }
            break (effect, view, wake);
        };
        // A new or moved node is followed from now on; one that is back from silence is
        // followed afresh, so that its full task list (and any run replaced meanwhile) is
        // seen at once rather than when an old blocking query times out. And any node that
        // reports with no follower is followed: the registry took the report above whether or
        // not its write below becomes durable, so tasks are placed there either way, and a
        // node whose first report's write failed was otherwise never followed (its next
        // beats neither move nor grow it), its tasks `Scheduled` here while they ran there.
        if effect.moved || effect.more_room || !self.followers.follows(&name) {
            let client = if effect.moved {
                client
            } else {
                lock(&self.cluster.state)
                    .nodes
                    .get(&name)
                    .map(|entry| entry.client.clone())
                    .unwrap_or(client)
            };
            self.followers.follow(name.clone(), client);
        }
        if let Some(commit) = node_write
            && let Err(err) = commit.durable().await
        {
            if let Some(entry) = lock(&self.cluster.state).nodes.get_mut(&name) {
                entry.unwritten = true;
            }
            if let Some(left_out) = self.unwritten_reports.admit(Instant::now()) {
                tracing::warn!(node = %name, error = %err, left_out, "a node's report was taken but could not be written; its next report writes it");
            }
            return Err(err.into());
        }
        if let Some(wake) = wake {
            self.cluster.wake_for_node(wake);
        }
        Ok(view)
    }

    // ----- writes -----

    /// `POST /tasks/{id}/restart` (`cube restart`): a task that ended (`Completed`, `Failed`,
    /// stopped by the user) or was lost runs again as a new run. It goes back to `Pending` by
    /// the one explicit way back (`State::restart`), with one more `RestartCount` (the worker
    /// makes the new run a new container, `...-r<N>`), wanted running again and its failure
    /// streak forgotten (the user asked for a fresh start, not a policy's backoff). Stored
    /// before the answer, as any acknowledged write.
    ///
    /// A task that has not ended is refused (409), not stopped first: a restart never ends a
    /// run, so a mistyped name cannot kill work that runs. A job's copy is refused too: the job
    /// controller owns its copies (it replaces one that ended by its own rules).
    pub async fn restart_task(&self, id: Uuid) -> Result<Task, ManagerError> {
        let mut writes = Writes::default();
        let restarted = {
            let mut state = lock(&self.cluster.state);
            let known = state.cache.get(&id).ok_or(ManagerError::NotFound(id))?;
            if !known.spec.job.is_empty() {
                return Err(ManagerError::Conflict(format!(
                    "task {} ({id}) is a copy of job {:?} (group {:?}): the job controller owns \
                     its copies and replaces those that end by the job's rules; restart the \
                     job instead (cube job stop {job}, then cube job run with its file)",
                    known.name,
                    known.spec.job,
                    known.spec.group,
                    job = known.spec.job,
                )));
            }
            let mut task = known.clone();
            let message = task.restart(RestartBy::User, Utc::now()).map_err(|_| {
                ManagerError::Conflict(format!(
                    "task {} ({id}) is {} and has not ended: only a task that ended \
                     (Completed, Failed or Lost) can be restarted; stop it first (cube stop \
                     --wait {}), then restart it",
                    known.name, known.status.state, known.name
                ))
            })?;
            tracing::info!(task = %id, name = %task.name, %message, "restarting a task");
            self.cluster
                .save(&mut state, &mut writes, task.clone())
                .map(|()| task)
        };
        // What was queued is waited for even when the write could not be queued.
        self.cluster.settle(writes).await?;
        let task = restarted?;
        // Pending again: the placement pass takes it from here (the write asked for it).
        self.cluster.wakes.tasks.push(id);
        Ok(task)
    }

    /// Why no node known today could hold these tasks ([`crate::placement::fits_nowhere_today`]).
    pub(crate) fn fits_nowhere_today(&self, tasks: &[(&Task, usize)]) -> Vec<String> {
        let state = lock(&self.cluster.state);
        // One task that fits a node of today, empty, is told nothing: found at the first such
        // node, not after a view of every node (with 10,000 nodes, that view was a third of
        // the manager's time while bare tasks came in).
        if let [(task, 1)] = tasks {
            let request = cube_scheduler::TaskRequest::for_task(task);
            if self
                .cluster
                .each_node_view(&state)
                .any(|view| cube_scheduler::explain::fits_empty(&request, &view))
            {
                return Vec::new();
            }
        }
        let views = self.cluster.node_views(&state);
        crate::placement::fits_nowhere_today(&views, tasks)
    }

    /// Where the task could go now, node by node: `GET /tasks/{id}/placement`. With
    /// `--shard-controllers`, on the nodes as the last placement pass saw them: this
    /// manager's tasks and what the other shards claimed.
    pub fn placement(&self, id: Uuid) -> Result<crate::placement::Placement, ManagerError> {
        let others = Arc::clone(&lock(&self.cluster.others_claims));
        let state = lock(&self.cluster.state);
        let task = state.cache.get(&id).ok_or(ManagerError::NotFound(id))?;
        let mut views = self.cluster.node_views(&state);
        crate::placement::add_others_claims(&mut views, &others);
        Ok(crate::placement::explain(task, &views))
    }

    // ----- static workers -----

    /// Asks a static worker for its report every poll interval, as a registered worker would
    /// send it. The worker is recorded under the address the manager reaches it at.
    pub(crate) async fn poll_static_worker(self: Arc<Self>, address: String) {
        let client = match self.config.worker_client(None, &address) {
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

    // ----- removals -----

    /// `DELETE /tasks/{id}?purge=true`: removes an ended task now, with its container.
    pub async fn remove_task(&self, id: Uuid) -> Result<Task, ManagerError> {
        let task = {
            let state = lock(&self.cluster.state);
            let task = state.cache.get(&id).ok_or(ManagerError::NotFound(id))?;
            let job = state.jobs.get(&task.spec.job).map(|record| &**record);
            if let Some(why) = crate::gc::removable(task, job) {
                return Err(ManagerError::Conflict(why));
            }
            task.clone()
        };
        self.garbage_collector().purge(&task).await?;
        Ok(task)
    }

    /// `POST /tasks/prune`: removes now every task that may be removed (and the stopped jobs
    /// left without tasks) that ended at least `older_than` ago.
    pub async fn prune(&self, older_than: Duration) -> crate::gc::Pruned {
        self.garbage_collector().prune(older_than).await
    }

    /// The garbage collector, with the manager's `--gc-after`.
    pub(crate) fn garbage_collector(&self) -> crate::gc::GarbageCollector {
        crate::gc::GarbageCollector::new(
            self.cluster.clone(),
            self.job_records.clone(),
            self.config.gc_after,
        )
    }

    // ----- the loops -----

    /// The queue controller.
    pub(crate) fn queue_controller(&self) -> crate::queue_controller::QueueController {
        crate::queue_controller::QueueController::new(
            self.cluster.clone(),
            self.job_records.clone(),
        )
    }

    /// The placement pass, with the manager's `--max-claimed-per-owner`.
    pub(crate) fn placement_controller(&self) -> crate::placement::PlacementController {
        crate::placement::PlacementController::new(
            self.cluster.clone(),
            self.config.max_claimed_per_owner,
            self.config.claims.clone(),
        )
    }

    /// Starts the control loops: the runners of the task controller, the placement pass and
    /// the job controller, node liveness, the resync, a follower for every known node and a
    /// poller for every static worker. Each ends on shutdown; the followers, started and
    /// replaced as nodes come and go, are waited for by the last loop in the set.
    pub fn start(self: &Arc<Self>) -> JoinSet<()> {
        let mut loops = JoinSet::new();
        let tasks = crate::task_controller::TaskController::new(self.cluster.clone());
        loops.spawn(tasks.run(self.shutdown.clone()));
        loops.spawn(self.placement_controller().run(self.shutdown.clone()));
        let jobs = crate::job_controller::JobController::new(
            self.cluster.clone(),
            self.job_records.clone(),
        );
        loops.spawn(jobs.run(self.shutdown.clone()));
        loops.spawn(self.queue_controller().run(self.shutdown.clone()));
        let routes = crate::routes::RouteWatch::new(self.cluster.clone());
        loops.spawn(routes.run(self.shutdown.clone()));
        let resync =
            crate::liveness::Resync::new(self.cluster.clone(), self.config.resync_interval);
        loops.spawn(resync.run(self.shutdown.clone()));
        let liveness = crate::liveness::Liveness::new(self.cluster.clone());
        loops.spawn(liveness.run(self.shutdown.clone()));
        loops.spawn(self.garbage_collector().run(self.shutdown.clone()));
        for address in self.config.static_workers.clone() {
            loops.spawn(self.clone().poll_static_worker(address));
        }
        let known: Vec<(String, ApiClient)> = lock(&self.cluster.state)
            .nodes
            .entries()
            .map(|entry| (entry.name.clone(), entry.client.clone()))
            .collect();
        for (name, client) in known {
            self.followers.follow(name, client);
        }
        let background = self.followers.background.clone();
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
    /// `--shard-controllers`: takes the shards of `scope` this manager does not hold yet,
    /// in place: their tasks, jobs, versions, deployments and waiting-list entries are read
    /// from the store and added to the state, under `fence` (the writes' fence of the whole
    /// new set) from then on; the controllers are woken for them and every node's tasks are
    /// listed again (what its workers said of them while another manager held them). What
    /// was held already is neither read again nor stopped: a manager that takes a dead one's
    /// shards keeps placing its own meanwhile, and reads only what it takes.
    ///
    /// Blocking (it reads the store). `false`, and nothing done, when `scope` does not hold
    /// every shard held now: giving one back means opening the state again. Several shards
    /// may be taken one call at a time (the first asked for first); `follow_again` on the
    /// last call only: each node's list is read again once, after the last.
    pub fn take_shards(
        &self,
        scope: cube_types::shard::ShardScope,
        fence: Option<cube_store::Fence>,
        follow_again: bool,
    ) -> Result<bool, ManagerError> {
        let held = lock(&self.cluster.state).scope.clone();
        if held.ring() != scope.ring() || held.shards().iter().any(|shard| !scope.holds(*shard)) {
            return Ok(false);
        }
        let taken = cube_types::shard::ShardScope::of(
            scope.ring(),
            scope
                .shards()
                .into_iter()
                .filter(|shard| !held.holds(*shard)),
        );
        let started = std::time::Instant::now();
        let mut tasks = Vec::new();
        let records = crate::cluster::read_records(&self.cluster.stores, &taken, &mut |task| {
            tasks.push(task)
        })?;
        let read_in = started.elapsed();
        let now = Utc::now();
        let count = tasks.len();
        let in_doubt: Vec<Uuid> = tasks
            .iter()
            .filter(|task| crate::liveness::in_doubt(task, now))
            .map(|task| task.id)
            .collect();
        // Only the taken jobs are looked at: a take changes nothing of the jobs held (with
        // a take shard by shard, a look at every job would come once a shard).
        let taken_jobs: Vec<String> = records.jobs.keys().cloned().collect();
        let jobs = taken_jobs.len();
        let known: Vec<(String, ApiClient)> = {
            let mut state = lock(&self.cluster.state);
            // The queue controller looks at the taken requests: their entries, and those of
            // their tasks still waiting for a node, whose entry may not be written yet (a look
            // at every request would read the whole list, as long as the tasks).
            for key in records.queue.keys() {
                state.queue_dirty.mark_key(key);
            }
            for task in tasks
                .iter()
                .filter(|task| task.status.state == State::Pending)
            {
                state.queue_dirty.mark_task(task);
            }
            for task in tasks {
                let id = task.id;
                let previous = state.cache.insert(task);
                if let Some(now) = state.cache.shared(&id) {
                    crate::events::publish_task(&self.cluster.events, previous.as_deref(), &now);
                }
            }
            state.jobs.extend(records.jobs);
            state.histories.extend(records.histories);
            state.deployments.extend(records.deployments);
            state.queue.extend(records.queue);
            state.queue_number = state.queue_number.max(records.queue_number);
            state.scope = scope;
            state.fence = fence;
            if !follow_again {
                Vec::new()
            } else {
                state
                    .nodes
                    .entries()
                    .map(|entry| (entry.name.clone(), entry.client.clone()))
                    .collect()
            }
        };
        tracing::info!(
            shards = %cube_types::shard::format_shards(&taken.shards()),
            tasks = count,
            jobs,
            read_in = ?read_in,
            "took shards in place: their records are read in"
        );
        for id in in_doubt {
            self.cluster.wakes.tasks.push(id);
        }
        for name in &taken_jobs {
            self.cluster.mark_job_dirty(name);
        }
        self.cluster.wakes.queue.push(());
        self.cluster.push_waiting();
        // Each follower starts again with the node's whole list (after the last of several
        // takes): the taken shards' tasks were skipped until now.
        for (name, client) in known {
            self.followers.follow(name, client);
        }
        Ok(true)
    }

    /// `GET /routes`: every route (`routes.rs`).
    pub fn routes(&self) -> Vec<cube_types::route::RouteView> {
        crate::routes::routes(&lock(&self.cluster.state))
    }

    /// The manager's events, for the API.
    pub fn events(&self) -> &EventBroker {
        &self.cluster.events
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
        self.cluster
            .events
            .wait_for(since, wait, &self.shutdown, relevant)
            .await;
    }

    /// `GET /metrics`: the gauges read from the state, under one hold of its lock, then every
    /// metric as text.
    pub fn metrics_text(&self) -> Result<String, std::fmt::Error> {
        let now = Instant::now();
        {
            let state = lock(&self.cluster.state);
            let metrics = &self.cluster.metrics;
            metrics.set_tasks(state.cache.tasks().map(|task| task.status.state));
            metrics.set_jobs(state.jobs.values().map(|record| &**record));
            metrics.set_waiting(state.cache.waiting().count());
            metrics.set_queue(state.queue.values().map(|entry| &**entry));
            let mut projects: std::collections::BTreeSet<&str> =
                state.projects.keys().map(String::as_str).collect();
            projects.insert(cube_types::project::DEFAULT_PROJECT);
            projects.extend(state.cache.usages().keys().map(String::as_str));
            metrics.set_projects(
                projects
                    .into_iter()
                    .map(|project| (project, state.cache.usage_of(project))),
                state
                    .projects
                    .values()
                    .map(|record| (record.name.as_str(), &record.quota)),
            );
            metrics.set_nodes(
                state
                    .nodes
                    .entries()
                    .map(|entry| (entry, self.cluster.node_view(&state, entry, now))),
                now,
            );
        }
        self.cluster.metrics.text()
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

/// A manager on memory stores, with no loop started, for the unit tests of its parts.
#[cfg(test)]
pub(crate) fn manager_for_tests() -> Arc<Manager> {
    manager_on(test_config(), ManagerStores::in_memory())
}

/// A manager of `config` on `stores`, with no loop started, for the unit tests.
#[cfg(test)]
pub(crate) fn manager_on(config: ManagerConfig, stores: ManagerStores) -> Arc<Manager> {
    let scheduler = cube_scheduler::scheduler_by_name("roundrobin").expect("a scheduler");
    Manager::open(config, stores, scheduler, CancellationToken::new())
        .expect("a manager on the stores given")
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
    let report = crate::nodes::test_report(name, address, 2.0, memory);
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
            .placement_controller()
            .placement_pass(&mut writes)
            .expect("a placement pass"),
        vec![id]
    );
    manager
        .cluster
        .settle(writes)
        .await
        .expect("durable writes");
    id
}

#[cfg(test)]
pub(crate) fn test_config() -> ManagerConfig {
    ManagerConfig {
        shards: cube_types::shard::ShardScope::all(cube_types::shard::DEFAULT_RING),
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
        secrets: Arc::new(crate::secrets::Secrets::in_memory()),
        claims: None,
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
            volumes: Vec::new(),
        };
        let base = |manager: &Manager| {
            lock(&manager.cluster.state)
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
        task.status.node_name = "gone".into();
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

    /// A manager holding half of the ring, opened on the store a manager holding all of it
    /// wrote: it reads in only its shards' tasks, jobs and waiting requests, and refuses a
    /// new one for a project of another shard (421, naming the shard) while taking one of
    /// its own.
    #[tokio::test]
    async fn a_manager_holding_some_shards_reads_and_takes_only_their_records() {
        use cube_types::shard::{ShardScope, shard_of};
        let ring = cube_types::shard::DEFAULT_RING;
        // A request to run a task in `project`.
        let run_in = |project: &str| {
            let mut task = Task::new("t", "cube-sample:latest");
            task.spec.project = project.to_string();
            TaskEvent {
                id: Uuid::new_v4(),
                state: State::Running,
                timestamp: None,
                task,
            }
        };
        let stores = ManagerStores::in_memory();
        let whole = manager_on(test_config(), stores.clone());
        let projects: Vec<String> = (0..12).map(|n| format!("team-{n}")).collect();
        let mut tasks = Vec::new();
        for project in &projects {
            whole
                .create_project(cube_types::project::ProjectRequest {
                    name: project.clone(),
                    quota: Default::default(),
                })
                .await
                .unwrap();
            let event = run_in(project);
            let id = match whole.submit(event).await.unwrap() {
                Submitted::Created(task, _) | Submitted::Existing(task) => task.id,
            };
            tasks.push((project.clone(), id));
            let job: cube_types::Job = serde_json::from_value(serde_json::json!({
                "Name": "web", "Type": "service", "Project": project,
                "Groups": [{"Name": "api", "Count": 2, "Task": {"Image": "cube-sample:latest"}}]
            }))
            .unwrap();
            whole.submit_job(job).await.unwrap();
        }
        let held = |project: &str| shard_of(project, ring) < ring / 2;
        assert!(
            projects.iter().any(|p| held(p)) && projects.iter().any(|p| !held(p)),
            "the projects fall on both halves of the ring"
        );
        drop(whole);

        let mut config = test_config();
        config.shards = ShardScope::of(ring, 0..ring / 2);
        let half = manager_on(config, stores.clone());
        for (project, id) in &tasks {
            assert_eq!(half.task(*id).is_ok(), held(project), "task of {project}");
            let key = cube_types::job::job_key(project, "web");
            assert_eq!(half.job(&key).is_ok(), held(project), "job {key}");
        }
        let copies = lock(&half.cluster.state).cache.tasks().count();
        let held_projects = projects.iter().filter(|p| held(p)).count();
        // The jobs' copies are the job controller's to make; it does not run here.
        assert_eq!(copies, held_projects, "one task per held project");

        let other = projects.iter().find(|p| !held(p)).unwrap();
        let event = run_in(other);
        let refused = half.submit(event).await.unwrap_err();
        assert!(
            matches!(&refused, ManagerError::NotOwner { project, shard }
                if project == other && *shard == shard_of(other, ring)),
            "{refused:?}"
        );
        let answer = cube_api::server::ApiError::from(refused);
        assert_eq!(answer.status, axum::http::StatusCode::MISDIRECTED_REQUEST);
        assert!(
            answer.message.contains("does not hold"),
            "{}",
            answer.message
        );
        assert_eq!(
            stores.tasks.list().unwrap().len(),
            tasks.len(),
            "nothing written"
        );

        let mine = projects.iter().find(|p| held(p)).unwrap();
        let event = run_in(mine);
        half.submit(event).await.unwrap();
    }
}
