//! The placement pass: every task that waits for a node, in one pass over one snapshot of
//! the nodes, on the controller framework's runner with one key (so that the pushes of many
//! freed slots or new tasks come down to one pass, never to reconciles racing for the lock).
//!
//! The waiting tasks go by request (a bare task, or a job's copies together), in the waiting
//! list's order: higher priority first, then the lower queue number. A request is placed
//! whole or not at all (admission). Each placement is added to the snapshot at once
//! (`NodeView::add_task`), so the next task sees the room that is left. A task that fits
//! nowhere keeps the reasons in its `PendingReason`, written only when they change. What was
//! placed goes to the task controller's runner to be sent to its node.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use cube_controller::runner::{Action, ExponentialBackoff, ReadyGate};
use cube_scheduler::{
    Decision, FilterChain, NodeView, TaskRequest, fits_no_node_today, summarize_rejections,
};
use cube_store::StoreError;
use cube_types::job::{Constraint, DEFAULT_PRIORITY, JobType};
use cube_types::project::Usage;
use cube_types::queue::RequestKind;
use cube_types::task::ANONYMOUS;
use cube_types::{HostPort, Resources, State, Task};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::cluster::{Cluster, Shared, Writes, lock};
use crate::shard_claims::{ByShard, ClaimsSettings, ShardClaims};

/// How often a manager acting for its shards takes in the other shards' claims between
/// placement passes, for the node views (`follow_others_claims`).
const OTHERS_CLAIMS_EVERY: Duration = Duration::from_secs(2);

/// The placement pass as a controller (see the module comment).
///
/// | reads | woken by | writes |
/// |---|---|---|
/// | the waiting tasks (those marked since the last pass, or every one), the waiting list's order, every node's snapshot | a task that waits (`Cluster::push_to_place`), room that appeared (`Cluster::push_waiting`: a task ended, a node joined, came back, grew or was let take work again) | the tasks placed (`Scheduled`, `NodeName`) or their `PendingReason`; then wakes the task controller for each task placed |
pub(crate) struct PlacementController {
    cluster: Arc<Cluster>,
    /// `--max-claimed-per-owner`.
    max_claimed_per_owner: Option<usize>,
    /// With `--shard-controllers`: the claims of every node on etcd (`shard_claims.rs`),
    /// read at the first pass; a placement commits its nodes' claims before its tasks.
    claims: Option<(ClaimsSettings, tokio::sync::Mutex<Option<ShardClaims>>)>,
    /// A pass that failed is written as a warning, at most once per interval: the runner
    /// tries it again after a backoff and says so only at debug level, and placement that
    /// keeps failing leaves every waiting request waiting.
    failures: crate::log_limit::LogLimit,
}

/// How many times in a row a pass is planned again at once after losing the race for a
/// node's claims, before it looks again after [`REPLAN_PAUSE`].
const REPLANS: usize = 16;

const REPLAN_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);

/// How many nodes' claims one commit of a pass holds at most: a commit another manager's
/// claim on one of its nodes refuses sends only its requests back to be planned again.
const NODES_PER_CLAIM: usize = 16;

/// The requests a pass placed, in groups of at most [`NODES_PER_CLAIM`] nodes (a request
/// on more nodes is a group of its own).
fn claim_groups(planned: Vec<Planned>) -> Vec<Vec<Planned>> {
    let mut groups: Vec<Vec<Planned>> = Vec::new();
    let mut nodes: BTreeSet<String> = BTreeSet::new();
    for request in planned {
        let mut with: BTreeSet<String> = nodes.clone();
        with.extend(
            request
                .iter()
                .map(|(_, task)| task.status.node_name.to_string()),
        );
        match groups.last_mut() {
            Some(group) if with.len() <= NODES_PER_CLAIM => {
                group.push(request);
                nodes = with;
            }
            _ => {
                nodes = request
                    .iter()
                    .map(|(_, task)| task.status.node_name.to_string())
                    .collect();
                groups.push(vec![request]);
            }
        }
    }
    groups
}

/// What one pass decided.
#[derive(Default)]
pub(crate) struct Pass {
    /// The tasks placed and written.
    pub(crate) placed: Vec<Uuid>,
    /// With claims: each request placed, not written yet, to be written once its nodes'
    /// claims are.
    pub(crate) planned: Vec<Planned>,
}

/// A request placed by a pass with claims: its tasks as they were read and as placed.
pub(crate) type Planned = Vec<(Arc<Task>, Task)>;

impl PlacementController {
    pub(crate) fn new(
        cluster: Arc<Cluster>,
        max_claimed_per_owner: Option<usize>,
        claims: Option<ClaimsSettings>,
    ) -> PlacementController {
        PlacementController {
            cluster,
            max_claimed_per_owner,
            claims: claims.map(|settings| (settings, tokio::sync::Mutex::new(None))),
            failures: crate::log_limit::LogLimit::new(std::time::Duration::from_secs(10)),
        }
    }

    /// Runs placement passes until `shutdown`, whenever one is asked for
    /// ([`Cluster::push_waiting`], [`Cluster::push_to_place`]).
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let cluster = self.cluster.clone();
        let controller = Arc::new(self);
        if controller.claims.is_some() {
            tokio::spawn(controller.clone().follow_others_claims(shutdown.clone()));
        }
        let pass = move |()| {
            let controller = controller.clone();
            async move {
                let started = Instant::now();
                let placed = controller.place_waiting().await;
                controller.cluster.metrics.reconciled("placement", started);
                if let Err(error) = &placed
                    && let Some(left_out) = controller.failures.admit(Instant::now())
                {
                    tracing::warn!(%error, left_out, "a placement pass failed; trying again");
                }
                placed
            }
        };
        cluster
            .wakes
            .placement
            .run(
                pass,
                ExponentialBackoff::default(),
                ReadyGate::open(),
                shutdown,
            )
            .await;
    }

    /// With `--shard-controllers`: keeps `Cluster::others_claims` (what the other shards
    /// placed on each node, which the API's node views add to this manager's own tasks)
    /// fresh between placement passes, every [`OTHERS_CLAIMS_EVERY`], taking the claims'
    /// watch in as a pass does first. A pass under way has it: this look waits for the next.
    async fn follow_others_claims(self: Arc<Self>, shutdown: CancellationToken) {
        let Some((_, claims)) = &self.claims else {
            return;
        };
        let mut every = tokio::time::interval(OTHERS_CLAIMS_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = every.tick() => {}
            }
            let Ok(mut held) = claims.try_lock() else {
                continue;
            };
            let Some(claims) = held.as_mut() else {
                continue;
            };
            if let Err(err) = claims.catch_up().await {
                tracing::debug!(error = %err, "cannot follow the other shards' claims now");
                continue;
            }
            let scope = lock(&self.cluster.state).scope.clone();
            *lock(&self.cluster.others_claims) = Arc::new(claims.others(&scope));
        }
    }

    /// One placement pass: places what it can, waits for those writes, and hands the placed
    /// tasks to the task controller for dispatch.
    async fn place_waiting(&self) -> Result<Action, String> {
        if let Some((settings, claims)) = &self.claims {
            let mut claims = claims.lock().await;
            let placed = self.place_claiming(settings, &mut claims).await;
            if placed.is_err() {
                // A pass that failed after taking in what changed (a claims or task write
                // refused, etcd not answering) did not place it: the next one reads every
                // waiting task, or those requests would wait until something else changed.
                lock(&self.cluster.state).placement_dirty.mark_everything();
            }
            return placed.map_err(|err| err.to_string());
        }
        let mut writes = Writes::default();
        let placed = self.placement_pass(&mut writes);
        let settled = self.cluster.settle(writes).await;
        if placed.is_err() || settled.is_err() {
            // What this pass took in is not done: the next one reads every waiting task.
            lock(&self.cluster.state).placement_dirty.mark_everything();
        }
        settled.map_err(|err| err.to_string())?;
        let placed = placed.map_err(|err| err.to_string())?;
        for id in placed {
            self.cluster.wakes.tasks.push(id);
        }
        Ok(Action::Done)
    }

    /// One placement pass of a manager acting for its shards (`shard_claims.rs`): the
    /// claims followed, its own written down where its tasks ended, the pass planned on its
    /// tasks and the other shards' claims, the placed nodes' claims committed, then the
    /// tasks. A pass that lost a node to another manager is planned again at once.
    async fn place_claiming(
        &self,
        settings: &ClaimsSettings,
        claims: &mut Option<ShardClaims>,
    ) -> Result<Action, StoreError> {
        let (scope, fence) = {
            let state = lock(&self.cluster.state);
            (state.scope.clone(), state.fence.clone())
        };
        let mut first = claims.is_none();
        if first {
            let settings = ClaimsSettings {
                db: settings.db.clone(),
                fence: fence.clone(),
            };
            *claims = Some(ShardClaims::open(settings).await?);
        }
        let Some(claims) = claims.as_mut() else {
            return Ok(Action::Done);
        };
        // Shards taken since the last pass (`Manager::take_shards`): their claims are
        // written under the new fence, and rewritten whole from the tasks read in, as a new
        // owner's first pass does.
        if claims.fence() != fence.as_ref() {
            claims.set_fence(fence);
            first = true;
        }
        for attempt in 0..REPLANS {
            claims.catch_up().await?;
            let stale = claims.stale(&lock(&self.cluster.state), &scope, first && attempt == 0);
            if !stale.is_empty() {
                // Lost to another: written at a later pass.
                claims.write(stale, &scope).await?;
            }
            let others = Arc::new(claims.others(&scope));
            *lock(&self.cluster.others_claims) = Arc::clone(&others);
            let mut writes = Writes::default();
            let pass = self.pass(&mut writes, Some(&others));
            let settled = self.cluster.settle(writes).await;
            if pass.is_err() || settled.is_err() {
                lock(&self.cluster.state).placement_dirty.mark_everything();
            }
            settled?;
            let pass = pass?;
            if pass.planned.is_empty() {
                return Ok(Action::Done);
            }
            // The requests placed, a few nodes' claims at a time: a group whose nodes another
            // manager claimed on first is planned again; the others are written.
            let mut lost = false;
            // The nodes of the groups lost: a later group on one of them was planned on
            // claims the refusal showed stale, and the refusal made them known again, so its
            // commit would no longer be refused; it is planned again with the lost ones.
            let mut lost_nodes: HashSet<String> = HashSet::new();
            let mut writes = Writes::default();
            let mut placed = Vec::new();
            for group in claim_groups(pass.planned) {
                let nodes: HashSet<String> = group
                    .iter()
                    .flatten()
                    .map(|(_, task)| task.status.node_name.to_string())
                    .collect();
                if !nodes.is_disjoint(&lost_nodes) {
                    lost_nodes.extend(nodes);
                    continue;
                }
                let wanted: Vec<(String, ByShard)> = {
                    let state = lock(&self.cluster.state);
                    let mut by_node: HashMap<String, ByShard> = HashMap::new();
                    for (_, task) in group.iter().flatten() {
                        let node = task.status.node_name.to_string();
                        let own = by_node.entry(node.clone()).or_insert_with(|| {
                            crate::shard_claims::own_on_node(&state, &node, &scope)
                        });
                        own.entry(scope.shard_of(&task.spec.project))
                            .or_default()
                            .add(&crate::shard_claims::claim_of_task(task));
                    }
                    by_node.into_iter().collect()
                };
                let started = Instant::now();
                let won = claims.write(wanted, &scope).await?;
                self.cluster
                    .metrics
                    .claims_writes
                    .observe(started.elapsed().as_secs_f64());
                if !won {
                    self.cluster.metrics.placement_conflicts.inc();
                    lost = true;
                    lost_nodes.extend(nodes);
                    continue;
                }
                let mut state = lock(&self.cluster.state);
                for (read, task) in group.into_iter().flatten() {
                    // A task changed since it was planned (stopped, say) is not placed: its
                    // claim is written down at the next pass.
                    if state
                        .cache
                        .shared(&task.id)
                        .is_none_or(|now| !Arc::ptr_eq(&now, &read))
                    {
                        continue;
                    }
                    placed.push(task.id);
                    self.cluster.metrics.placements.inc();
                    self.cluster.save(&mut state, &mut writes, task)?;
                }
            }
            self.cluster.settle(writes).await?;
            for id in placed {
                self.cluster.wakes.tasks.push(id);
            }
            if !lost {
                return Ok(Action::Done);
            }
            // Lost a node to another manager: every waiting request is read again, on the
            // claims etcd answered with, at once.
            lock(&self.cluster.state).placement_dirty.mark_everything();
        }
        // Another manager won every race: look again in a moment, not after an error's
        // backoff.
        Ok(Action::RequeueAfter(REPLAN_PAUSE))
    }

    /// Decides every waiting request's placement under one hold of the lock and queues the
    /// writes; returns the tasks placed.
    ///
    /// The waiting tasks are taken by request (a bare task alone, a job's copies together),
    /// in the waiting list's order: higher priority first, then the lower queue number (a
    /// request the queue controller has not numbered yet goes last, oldest first). A request
    /// is placed whole or not at all: its copies are tried one after the other on the
    /// snapshot, and if one fits nowhere the ones tried are taken back off it. A request that
    /// does not fit does not hold up the ones behind it that do. A request not yet let in
    /// whose owner already has `--max-claimed-per-owner` requests in waits, saying so.
    ///
    /// The pass reads the requests of the tasks marked since the last one
    /// ([`Cluster::push_to_place`]), or every waiting request after a change that may have
    /// made room ([`Cluster::push_waiting`]). Reading only the marked ones decides what a
    /// whole pass would: room only shrinks between passes that nothing marked everything,
    /// so a request that did not fit at the last whole look still does not, and a request
    /// that does not fit holds up none behind it.
    pub(crate) fn placement_pass(&self, writes: &mut Writes) -> Result<Vec<Uuid>, StoreError> {
        self.pass(writes, None).map(|pass| pass.placed)
    }

    /// [`PlacementController::placement_pass`], on the nodes as the tasks here hold them
    /// plus, with `others`, what the other shards claim of each node: then the requests
    /// placed are returned planned, not written ([`Pass::planned`]).
    fn pass(
        &self,
        writes: &mut Writes,
        others: Option<&HashMap<String, cube_types::claims::NodeClaims>>,
    ) -> Result<Pass, StoreError> {
        let mut state = lock(&self.cluster.state);
        let marked = state.placement_dirty.take();
        let requests = waiting_requests(
            &state,
            marked.as_ref(),
            self.max_claimed_per_owner.is_some(),
        );
        if requests.is_empty() {
            return Ok(Pass::default());
        }
        let mut views = self.cluster.node_views(&state);
        if let Some(others) = others {
            add_others_claims(&mut views, others);
        }
        // Counted only when there is a limit: it reads the whole list.
        let mut admitted_by_owner = if self.max_claimed_per_owner.is_some() {
            admitted_by_owner(&state)
        } else {
            HashMap::new()
        };
        let mut failed_shapes: HashMap<Shape, String> = HashMap::new();
        // Each project with a quota met in this pass: its usage, with what the pass placed.
        let mut project_usage: HashMap<String, Usage> = HashMap::new();
        let mut updates = Vec::new();
        let mut placed = Vec::new();
        let mut planned = Vec::new();
        for request in requests {
            // Shared, not copied: most requests only wait, and a task is copied only when
            // it is placed or its reason changes.
            let tasks: Vec<Arc<Task>> = request
                .tasks
                .iter()
                .filter_map(|id| state.cache.shared(id))
                .collect();
            if tasks.is_empty() {
                continue;
            }
            if request.is_new
                && let Some(limit) = self.max_claimed_per_owner
                && admitted_by_owner.get(&request.owner).copied().unwrap_or(0) >= limit
            {
                let reason = format!(
                    "owner {} already has {limit} request{} in (--max-claimed-per-owner {limit})",
                    request.owner,
                    if limit == 1 { "" } else { "s" }
                );
                note_reasons(&mut updates, &tasks, &reason);
                continue;
            }
            // The project's quota: what its placed tasks declare, with what this pass
            // placed, plus this request, within every limit set.
            let project = tasks[0].spec.project.as_str();
            let quota = if state.projects.is_empty() {
                None
            } else {
                state
                    .projects
                    .get(project)
                    .map(|record| record.quota)
                    .filter(|quota| !quota.is_unlimited())
            };
            let adding = match quota {
                Some(_) => request_usage(&tasks),
                None => Usage::default(),
            };
            let was_held = tasks[0]
                .status
                .pending_reason
                .as_deref()
                .is_some_and(|reason| reason.starts_with(QUOTA_REASON_PREFIX));
            if let Some(quota) = &quota {
                if !project_usage.contains_key(project) {
                    project_usage.insert(project.to_string(), state.cache.usage_of(project));
                }
                let Some(used) = project_usage.get_mut(project) else {
                    continue;
                };
                let mut counted = adding;
                counted.remove(&rollout_allowance(&state, &tasks));
                if let Some(why) = quota.exceeded(used, &counted) {
                    let reason = quota_reason(project, &why);
                    if !was_held {
                        self.publish_quota(&request, &tasks[0], "QuotaWaiting", &reason);
                    }
                    note_reasons(&mut updates, &tasks, &reason);
                    continue;
                }
            }
            if was_held {
                self.publish_quota(&request, &tasks[0], "QuotaAdmitted", "");
            }
            match self.place_request(&mut state, &mut views, &tasks, &mut failed_shapes) {
                Ok(nodes) => {
                    if quota.is_some()
                        && let Some(used) = project_usage.get_mut(&tasks[0].spec.project)
                    {
                        used.add(&adding);
                    }
                    if request.is_new {
                        *admitted_by_owner.entry(request.owner.clone()).or_default() += 1;
                        state
                            .just_admitted
                            .insert(request.key.entry_key(), request.owner.clone());
                    }
                    let mut request_planned = Vec::new();
                    for (read, name) in tasks.iter().zip(nodes) {
                        let mut task = (**read).clone();
                        if task.move_to(State::Scheduled).is_err() {
                            continue;
                        }
                        tracing::info!(task = %task.id, name = %task.name, node = %name, "task placed");
                        let holds = state.nodes.get(&name).is_some_and(|entry| {
                            cube_types::secret::holds_volumes_of(&entry.volumes, &task)
                        });
                        let placed_on = if holds {
                            let volumes: Vec<String> =
                                cube_types::secret::volumes_of(&task).collect();
                            format!("on {name}, which holds its volume {}", volumes.join(", "))
                        } else {
                            format!("on {name}")
                        };
                        task.record(Utc::now(), "Placed", placed_on);
                        task.status.node_name = name.into();
                        task.status.pending_reason = None;
                        if others.is_some() {
                            request_planned.push((read.clone(), task));
                            continue;
                        }
                        placed.push(task.id);
                        updates.push(task);
                        self.cluster.metrics.placements.inc();
                    }
                    if !request_planned.is_empty() {
                        planned.push(request_planned);
                    }
                }
                Err(reason) => {
                    let reason = if tasks.len() > 1 {
                        format!(
                            "waits for room for all {} of its copies (the whole request or \
                             none): {reason}",
                            tasks.len()
                        )
                    } else {
                        reason
                    };
                    note_reasons(&mut updates, &tasks, &reason);
                }
            }
        }
        for task in updates {
            self.cluster.save(&mut state, writes, task)?;
        }
        Ok(Pass { placed, planned })
    }

    /// A `Quota` event: `request` starts or stops waiting for its project's quota.
    fn publish_quota(&self, request: &WaitingRequest, task: &Task, kind: &str, reason: &str) {
        let key = request.key.entry_key();
        let job = (!task.spec.job.is_empty()).then_some(task.spec.job.as_str());
        self.cluster.publish(
            crate::events::Topic::Quota,
            kind,
            &key,
            job,
            Some(&task.spec.project),
            serde_json::json!({"Request": key, "Project": task.spec.project, "Reason": reason}),
        );
    }

    /// Places every task of one request on `views`, or none: the node of each, in order, or
    /// why one fits nowhere (with the tasks tried taken back off the snapshot). A single
    /// task whose shape already failed in this pass fails again at once: within a pass, room
    /// only shrinks.
    fn place_request(
        &self,
        state: &mut Shared,
        views: &mut [NodeView],
        tasks: &[Arc<Task>],
        failed_shapes: &mut HashMap<Shape, String>,
    ) -> Result<Vec<String>, String> {
        let shape = (tasks.len() == 1 && tasks[0].status.node_name.is_empty())
            .then(|| Shape::of(&tasks[0]));
        if let Some(reason) = shape.as_ref().and_then(|shape| failed_shapes.get(shape)) {
            return Err(reason.clone());
        }
        // The views a multi-task request changed, as they were: put back if one task fails.
        let mut touched: Vec<(usize, NodeView)> = Vec::new();
        let mut nodes = Vec::with_capacity(tasks.len());
        for task in tasks {
            let request = TaskRequest::for_task(task);
            // A restarted task goes back to the node it ran on when that node is ready and
            // has room (its image is there, its data may be); otherwise the scheduler
            // chooses.
            // A task new to placement whose named volumes a node holds (a job's copy started
            // again) goes back there the same way: its data is there.
            let holder = if task.status.node_name.is_empty() && !task.spec.volumes.is_empty() {
                state
                    .nodes
                    .entries()
                    .find(|entry| cube_types::secret::holds_volumes_of(&entry.volumes, task))
                    .map(|entry| entry.name.clone())
            } else {
                None
            };
            let back_to = holder.as_deref().unwrap_or(task.status.node_name.as_str());
            let previous = views
                .iter()
                .position(|view| view.name == back_to)
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
                None => state.scheduler.place(&request, views),
            };
            match decision {
                Decision::Placed { index, name } => {
                    if tasks.len() > 1 && !touched.iter().any(|(at, _)| *at == index) {
                        touched.push((index, views[index].clone()));
                    }
                    views[index].add_task(&request);
                    nodes.push(name);
                }
                Decision::NoFit { reasons } => {
                    self.cluster.metrics.placement_failed(&reasons);
                    let reason = summarize_rejections(&request, views, &reasons);
                    for (index, view) in touched {
                        views[index] = view;
                    }
                    let reason = match fits_on_nodes_that_are_away(views, tasks) {
                        Some(away) => format!(
                            "it could fit only on nodes that are not Ready now ({away}): it \
                             waits for them to come back; {reason}"
                        ),
                        None => reason,
                    };
                    if let Some(shape) = shape {
                        failed_shapes.insert(shape, reason.clone());
                    }
                    return Err(reason);
                }
            }
        }
        Ok(nodes)
    }
}

/// What a request's tasks declare together, as its project's quota counts it.
pub(crate) fn request_usage(tasks: &[Arc<Task>]) -> Usage {
    let mut usage = Usage::default();
    for task in tasks {
        usage.add(&Usage::of_task(
            task.spec.cpu,
            task.spec.memory,
            task.spec.disk,
        ));
    }
    usage
}

/// How far a service job that already has copies placed may go over its project's quota
/// while it replaces them: the declared use of up to `MaxParallel` of its waiting copies (the
/// old copies they replace still hold theirs until the new ones are healthy). A job placed
/// for the first time gets none.
fn rollout_allowance(state: &Shared, tasks: &[Arc<Task>]) -> Usage {
    let job = tasks[0].spec.job.as_str();
    let Some(record) = (!job.is_empty()).then(|| state.jobs.get(job)).flatten() else {
        return Usage::default();
    };
    if record.job.job_type != JobType::Service
        || !state
            .cache
            .of_job(job)
            .iter()
            .any(|copy| crate::cache::holds_resources(copy))
    {
        return Usage::default();
    }
    let parallel: usize = record
        .job
        .groups
        .iter()
        .map(|group| {
            group
                .update
                .as_ref()
                .and_then(|update| update.max_parallel)
                .unwrap_or(cube_types::deployment::DEFAULT_MAX_PARALLEL) as usize
        })
        .sum();
    request_usage(&tasks[..parallel.min(tasks.len())])
}

/// What a request held by its project's quota waits for (its `PendingReason`, the waiting
/// list's `WaitingFor`): `quota of team-a: memory 15.5/16 GiB`.
pub(crate) fn quota_reason(project: &str, why: &str) -> String {
    format!("{QUOTA_REASON_PREFIX}{project}: {why}")
}

/// How every reason [`quota_reason`] writes begins.
pub(crate) const QUOTA_REASON_PREFIX: &str = "quota of ";

/// Which request a waiting task belongs to, borrowed from the pass's state: no string is
/// built per task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum RequestRef<'a> {
    /// A bare task: its own request.
    Task(Uuid),
    /// A job's copies: one request.
    Job(&'a str),
    /// A system job's copy: placed on its own node, alone, and not queued.
    System(Uuid),
}

impl RequestRef<'_> {
    /// The key of its entry in the waiting list (`task/<id>`, `job/<name>`).
    fn entry_key(self) -> String {
        match self {
            RequestRef::Task(id) | RequestRef::System(id) => RequestKind::Task.key(&id.to_string()),
            RequestRef::Job(name) => RequestKind::Job.key(name),
        }
    }
}

/// [`RequestRef`], owned: what a [`WaitingRequest`] keeps (a job's name is the only string).
#[derive(Debug, Clone, PartialEq, Eq)]
enum RequestKey {
    Task(Uuid),
    Job(String),
    System(Uuid),
}

impl RequestKey {
    /// The key of its entry in the waiting list (`task/<id>`, `job/<name>`), built only for
    /// a request let in.
    fn entry_key(&self) -> String {
        match self {
            RequestKey::Task(id) => RequestRef::Task(*id).entry_key(),
            RequestKey::System(id) => RequestRef::System(*id).entry_key(),
            RequestKey::Job(name) => RequestRef::Job(name).entry_key(),
        }
    }
}

/// One request with tasks waiting for a node, in the waiting list's order.
struct WaitingRequest {
    key: RequestKey,
    /// Its tasks that wait, oldest first.
    tasks: Vec<Uuid>,
    owner: String,
    /// Not let in yet (its entry is waiting, or there is none): the owner limit applies.
    is_new: bool,
}

/// The requests with waiting tasks, in the order the pass takes them: higher priority first,
/// then the lower queue number (none yet: last), then the oldest. The waiting list is read
/// once, into maps by task ID and by job name, not looked up by key string per task. The
/// owners are kept `with_owners` only (the limit is set). `only`: the requests of these
/// tasks alone (a job's: with every copy of it that waits), else every waiting request.
fn waiting_requests(
    state: &Shared,
    only: Option<&BTreeSet<Uuid>>,
    with_owners: bool,
) -> Vec<WaitingRequest> {
    type Order<'a> = (
        Reverse<u8>,
        u64,
        Option<chrono::DateTime<Utc>>,
        RequestRef<'a>,
    );
    /// A request being gathered: its order, its tasks, its owner and whether it is new.
    type Gathered<'a> = (Order<'a>, Vec<Uuid>, &'a str, bool);
    let mut by_request: HashMap<RequestRef, Gathered> = HashMap::new();
    let candidates: Box<dyn Iterator<Item = Uuid> + '_> = match only {
        None => Box::new(state.cache.waiting()),
        Some(marked) => Box::new(marked_and_their_jobs(state, marked).into_iter()),
    };
    for id in candidates {
        let Some(task) = state.cache.get(&id) else {
            continue;
        };
        if task.status.state != State::Pending || task.spec.desired_state != State::Running {
            continue;
        }
        let record = state.jobs.get(&task.spec.job);
        let (key, priority, owner) = match record {
            None => (
                RequestRef::Task(task.id),
                task.spec.priority.unwrap_or(DEFAULT_PRIORITY),
                task.spec.owner.as_str(),
            ),
            Some(record) if record.job.job_type == JobType::System => (
                RequestRef::System(task.id),
                record.job.priority,
                record.job.owner.as_str(),
            ),
            Some(record) => (
                // The job's key, as its copies carry it.
                RequestRef::Job(task.spec.job.as_str()),
                record.job.priority,
                record.job.owner.as_str(),
            ),
        };
        let (order, tasks, _, _) = by_request.entry(key).or_insert_with(|| {
            // The request's own entry, looked up (once per request): the list also holds
            // every claimed request, far more than wait.
            let entry = match key {
                RequestRef::System(_) => None,
                key => state.queue.get(&key.entry_key()).map(|entry| &**entry),
            };
            let let_in = entry.is_some_and(|entry| entry.state.is_admitted())
                || (!state.just_admitted.is_empty()
                    && state.just_admitted.contains_key(&key.entry_key()));
            let owner = if owner.is_empty() { ANONYMOUS } else { owner };
            (
                (
                    Reverse(priority),
                    entry.map_or(u64::MAX, |entry| entry.queue),
                    task.status.created_time,
                    key,
                ),
                Vec::new(),
                owner,
                !let_in,
            )
        });
        order.2 = order.2.min(task.status.created_time);
        tasks.push(id);
    }
    let mut requests: Vec<Gathered> = by_request.into_values().collect();
    requests.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    requests
        .into_iter()
        .map(|(order, mut tasks, owner, is_new)| {
            if tasks.len() > 1 {
                tasks.sort_by_key(|id| {
                    state
                        .cache
                        .get(id)
                        .map(|task| (task.status.created_time, task.spec.index))
                });
            }
            let key = match order.3 {
                RequestRef::Task(id) => RequestKey::Task(id),
                RequestRef::System(id) => RequestKey::System(id),
                RequestRef::Job(name) => RequestKey::Job(name.to_string()),
            };
            WaitingRequest {
                key,
                tasks,
                // Read only for the owner limit: not copied for every request without it.
                owner: if with_owners {
                    owner.to_string()
                } else {
                    String::new()
                },
                is_new,
            }
        })
        .collect()
}

/// The marked tasks, and every waiting copy of the (non-system) jobs they belong to: a job's
/// copies are one request, placed together.
fn marked_and_their_jobs(state: &Shared, marked: &BTreeSet<Uuid>) -> BTreeSet<Uuid> {
    let mut ids = marked.clone();
    let mut jobs_seen: BTreeSet<&str> = BTreeSet::new();
    for id in marked {
        let Some(task) = state.cache.get(id) else {
            continue;
        };
        let job = task.spec.job.as_str();
        if job.is_empty()
            || jobs_seen.contains(job)
            || state
                .jobs
                .get(job)
                .is_some_and(|record| record.job.job_type == JobType::System)
        {
            continue;
        }
        jobs_seen.insert(job);
        ids.extend(
            state
                .cache
                .of_job(job)
                .iter()
                .filter(|copy| copy.status.state == State::Pending)
                .map(|copy| copy.id),
        );
    }
    ids
}

/// How many requests each owner has let in (`pending-N` or `claimed`): from the waiting
/// list, and the requests let in since it was last written.
fn admitted_by_owner(state: &Shared) -> HashMap<String, usize> {
    let mut counts: HashMap<String, usize> = HashMap::new();
    for (key, entry) in &state.queue {
        if entry.state.is_admitted() && !state.just_admitted.contains_key(key) {
            *counts.entry(entry.owner.clone()).or_default() += 1;
        }
    }
    for owner in state.just_admitted.values() {
        *counts.entry(owner.clone()).or_default() += 1;
    }
    counts
}

/// Whether the tasks would fit (first fit, whole) if the nodes that are not ready now were
/// back with what they hold: their names, or `None` when that would not help either.
fn fits_on_nodes_that_are_away(views: &[NodeView], tasks: &[Arc<Task>]) -> Option<String> {
    let away: Vec<&str> = views
        .iter()
        .filter(|view| !view.ready)
        .map(|view| view.name.as_str())
        .collect();
    if away.is_empty() {
        return None;
    }
    let mut back: Vec<NodeView> = views.to_vec();
    for view in &mut back {
        view.ready = true;
    }
    let chain = FilterChain::standard();
    for task in tasks {
        let request = TaskRequest::for_task(task);
        let index = back
            .iter()
            .position(|view| chain.check(&request, view).is_ok())?;
        back[index].add_task(&request);
    }
    let mut named: Vec<&str> = away.iter().take(3).copied().collect();
    if away.len() > 3 {
        named.push("...");
    }
    Some(named.join(", "))
}

/// Writes `reason` as the `PendingReason` of each task whose reason it is not yet.
fn note_reasons(updates: &mut Vec<Task>, tasks: &[Arc<Task>], reason: &str) {
    for task in tasks {
        if task.status.pending_reason.as_deref() != Some(reason) {
            tracing::info!(task = %task.id, name = %task.name, %reason, "task waits for room");
            let mut task = (**task).clone();
            task.status.pending_reason = Some(reason.to_string());
            updates.push(task);
        }
    }
}

/// What a task asks of a node, as a key: two tasks of one shape fit the same nodes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Shape {
    cpu_bits: u64,
    memory: u64,
    disk: u64,
    host_ports: Vec<HostPort>,
    constraints: Vec<Constraint>,
}

impl Shape {
    fn of(task: &Task) -> Shape {
        let request = TaskRequest::for_task(task);
        Shape {
            cpu_bits: request.cpu_cores().to_bits(),
            memory: request.memory,
            disk: request.disk,
            host_ports: request.host_ports.into_iter().collect(),
            constraints: request.constraints,
        }
    }
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

/// Why no node known today (`views`) could hold a request, whatever runs now: the warnings a
/// submission is answered with (empty when it could fit, or when no node has joined yet,
/// so nothing can be said). The request is accepted all the same and waits with the
/// reason, since nodes join later (autoscaling, a bigger node, one back from
/// maintenance). A request fits nowhere today when one of its tasks fits no known node
/// even empty (ready or not: a node that is down may come back), or when it asks for
/// more CPU, memory or disk in all than every known node has together. Only what is
/// certain is said: a request that might fit with a better packing waits in silence.
pub(crate) fn fits_nowhere_today(views: &[NodeView], tasks: &[(&Task, usize)]) -> Vec<String> {
    let copies: usize = tasks.iter().map(|(_, count)| count).sum();
    if views.is_empty() || copies == 0 {
        return Vec::new();
    }
    let mut warnings = Vec::new();
    for (task, count) in tasks {
        if *count == 0 {
            continue;
        }
        if let Some(why) = fits_no_node_today(&TaskRequest::for_task(task), views) {
            // Among several, say which: a job's group, or the task.
            warnings.push(match (copies > 1, task.spec.group.as_str()) {
                (false, _) => why,
                (true, "") => format!("{}: {why}", task.name),
                (true, group) => format!("group {group}: {why}"),
            });
        }
    }
    if copies == 1 || !warnings.is_empty() {
        return warnings;
    }
    let asked = |of: fn(&Task) -> f64| {
        tasks
            .iter()
            .map(|(task, count)| of(task) * *count as f64)
            .sum::<f64>()
    };
    let total =
        |of: fn(&Resources) -> f64| views.iter().map(|view| of(&view.capacity)).sum::<f64>();
    let too_much = [
        (
            "CPU",
            asked(|t| t.spec.cpu.max(0.0)),
            total(|r| r.cpu),
            false,
        ),
        (
            "memory",
            asked(|t| t.spec.memory as f64),
            total(|r| r.memory as f64),
            true,
        ),
        (
            "disk",
            asked(|t| t.spec.disk as f64),
            total(|r| r.disk as f64),
            true,
        ),
    ]
    .into_iter()
    .find(|(_, need, has, _)| *need > *has + 1e-6);
    warnings.extend(too_much.map(|(what, need, has, bytes)| {
        let shown = |value: f64| {
            if bytes {
                cube_types::size::format_size(value as u64)
            } else {
                format!("{value}")
            }
        };
        format!(
            "no node could hold it today: its {copies} copies need {} {what} in all, and \
             every node together has {}",
            shown(need),
            shown(has)
        )
    }));
    warnings
}

/// Where `task` could go now, node by node, on `views`: `GET /tasks/{id}/placement`, the
/// long form of a waiting task's `PendingReason`.
/// Adds to each node's view what the other shards claimed of it (`others`): the node as
/// every manager's placements hold it.
pub(crate) fn add_others_claims(
    views: &mut [NodeView],
    others: &HashMap<String, cube_types::claims::NodeClaims>,
) {
    if others.is_empty() {
        return;
    }
    for view in views {
        if let Some(claims) = others.get(&view.name) {
            claims.add_to(&mut view.allocated, &mut view.task_count);
            view.host_ports_taken.extend(claims.host_ports());
        }
    }
}

pub(crate) fn explain(task: &Task, views: &[NodeView]) -> Placement {
    let id = task.id;
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
    let rejections = chain.rejections(&request, views);
    Placement {
        id,
        state: task.status.state,
        node_name: task.status.node_name.to_string(),
        summary: if rejections.len() == views.len() {
            Some(summarize_rejections(&request, views, &rejections))
        } else {
            None
        },
        nodes,
    }
}

#[cfg(test)]
mod controller_tests {
    use std::time::{Duration, Instant};

    use cube_types::{State, Task};

    use super::PlacementController;
    use crate::cluster::{ManagerStores, Writes, cluster_for_tests, report_test_node};

    #[tokio::test]
    async fn a_pass_places_what_fits_and_says_why_the_rest_waits() {
        // No `Manager`: the placement pass alone, on a cluster of one node of 1 GiB.
        let cluster = cluster_for_tests(ManagerStores::in_memory(), Duration::from_secs(60));
        report_test_node(&cluster, "w1", Instant::now());
        let small = Task::new("small", "cube-sample:latest");
        let mut big = Task::new("big", "cube-sample:latest");
        big.spec.memory = 2 << 30;
        let (small_id, big_id) = (small.id, big.id);
        cluster
            .accept_tasks(vec![small, big], None)
            .await
            .expect("accepted");
        let placement = PlacementController::new(cluster.clone(), None, None);
        let mut writes = Writes::default();
        let placed = placement.placement_pass(&mut writes).expect("a pass");
        cluster.settle(writes).await.expect("durable");
        assert_eq!(placed, vec![small_id]);
        let stored = |id: uuid::Uuid| {
            cluster
                .stores
                .tasks
                .get(&id.to_string())
                .expect("a store that reads")
                .expect("stored")
        };
        let small = stored(small_id);
        assert_eq!(small.status.state, State::Scheduled);
        assert_eq!(small.status.node_name, "w1");
        let big = stored(big_id);
        assert_eq!(big.status.state, State::Pending);
        let reason = big.status.pending_reason.unwrap_or_default();
        assert!(reason.contains("memory"), "{reason}");
        // Nothing marked since: the next pass reads nothing and writes nothing.
        let revision = cluster.store_revision_for_tests();
        let mut writes = Writes::default();
        assert!(
            placement
                .placement_pass(&mut writes)
                .expect("a pass")
                .is_empty()
        );
        cluster.settle(writes).await.expect("durable");
        assert_eq!(cluster.store_revision_for_tests(), revision);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use cube_types::job::JobRecord;
    use cube_types::{State, Task};

    use crate::manager::Manager;

    use crate::cluster::{Writes, lock};

    const MIB: u64 = 1 << 20;

    fn manager() -> Arc<Manager> {
        crate::manager::manager_for_tests()
    }

    /// A pass of a manager acting for its shards whose claims write is refused (its fence
    /// does not hold yet) after it took in the request: the next pass, once the fence holds,
    /// places it, whatever else changed or did not.
    #[tokio::test]
    async fn a_claiming_pass_that_failed_leaves_its_requests_to_the_next_one() {
        let etcd = cube_test_support::EtcdCluster::start(1);
        let db = cube_store::EtcdDb::connect(cube_store::EtcdConfig::new(
            etcd.endpoints(),
            "/placement-failed-pass",
        ))
        .unwrap();
        let (_, revision) = db.read_versioned("held").await.unwrap();
        // Fenced on a key etcd creates two writes from now: until then every claims write is
        // refused.
        let fence = cube_store::Fence::one(db.fence_key("held", 0).key, revision + 2);
        let mut config = crate::manager::test_config();
        config.claims = Some(crate::shard_claims::ClaimsSettings {
            db: db.clone(),
            fence: Some(fence),
        });
        let manager =
            crate::manager::manager_on(config, crate::cluster::ManagerStores::in_memory());
        // A worker with no task that its follower reaches, so that the node stays `Ready`.
        let worker = axum::Router::new().route(
            "/tasks",
            axum::routing::get(|query: axum::extract::RawQuery| async move {
                if !query.0.unwrap_or_default().contains("wait=0ms") {
                    tokio::time::sleep(std::time::Duration::from_secs(60)).await;
                }
                ([(cube_api::INDEX_HEADER, "0")], "[]")
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move { axum::serve(listener, worker).await });
        crate::manager::join_test_node_at(&manager, "w1", 1 << 30, &address).await;
        let controller = manager.placement_controller();
        let id = manager
            .accept_task(Task::new("t", "cube-sample:latest"), None)
            .await
            .unwrap()
            .id;
        let refused = controller.place_waiting().await;
        assert!(
            refused.is_err(),
            "{refused:?} {:?}",
            manager.task(id).unwrap().status
        );
        assert_eq!(manager.task(id).unwrap().status.state, State::Pending);
        // The fence holds from now on; nothing else changed.
        db.get_or_create("unrelated", b"1".to_vec()).await.unwrap();
        db.get_or_create("held", b"1".to_vec()).await.unwrap();
        controller.place_waiting().await.unwrap();
        assert_eq!(manager.task(id).unwrap().status.state, State::Scheduled);
        manager.shutdown.cancel();
        server.abort();
    }

    /// A request placed on `nodes`, one task on each.
    fn placed_on(nodes: &[&str]) -> super::Planned {
        nodes
            .iter()
            .map(|node| {
                let mut task = Task::new("t", "img");
                task.status.node_name = (*node).into();
                (Arc::new(task.clone()), task)
            })
            .collect()
    }

    fn nodes_of(group: &[super::Planned]) -> std::collections::BTreeSet<String> {
        group
            .iter()
            .flatten()
            .map(|(_, task)| task.status.node_name.to_string())
            .collect()
    }

    #[test]
    fn a_pass_claims_a_few_nodes_at_a_time_and_never_splits_a_request() {
        let names: Vec<String> = (0..40).map(|n| format!("n{n}")).collect();
        let mut planned: Vec<super::Planned> = names.iter().map(|n| placed_on(&[n])).collect();
        // A request on the same node as an earlier one adds no node to its group.
        planned.insert(3, placed_on(&["n0"]));
        // A request on more nodes than a group holds is a group of its own.
        let wide: Vec<&str> = names.iter().take(20).map(String::as_str).collect();
        planned.push(placed_on(&wide));
        let groups = super::claim_groups(planned);
        let requests: usize = groups.iter().map(Vec::len).sum();
        assert_eq!(requests, 42, "every request once");
        for group in &groups[..groups.len() - 1] {
            assert!(
                nodes_of(group).len() <= super::NODES_PER_CLAIM,
                "{:?}",
                nodes_of(group)
            );
        }
        assert_eq!(groups[0].len(), 17, "16 nodes, one of them twice");
        let last = groups.last().unwrap();
        assert_eq!(last.len(), 1);
        assert_eq!(nodes_of(last).len(), 20);
    }

    /// A node of 1 GiB of memory, at an address where nothing answers (nothing here is sent).
    async fn one_node(manager: &Arc<Manager>) {
        crate::manager::join_test_node(manager, "w1", 1024 * MIB).await;
    }

    async fn waiting(manager: &Arc<Manager>, name: &str, memory: u64, job: &str) -> Task {
        let mut task = Task::new(name, "cube-sample:latest");
        task.spec.memory = memory;
        task.spec.job = job.to_string();
        manager.accept_task(task, None).await.unwrap()
    }

    fn pass(manager: &Manager) -> Vec<uuid::Uuid> {
        let mut writes = Writes::default();
        let placed = manager
            .placement_controller()
            .placement_pass(&mut writes)
            .unwrap();
        drop(writes);
        placed
    }

    fn task(manager: &Manager, id: uuid::Uuid) -> Task {
        lock(&manager.cluster.state).cache.get(&id).unwrap().clone()
    }

    #[tokio::test]
    async fn one_pass_places_what_fits_counting_each_placement_it_made() {
        let manager = manager();
        let mut ids = Vec::new();
        for n in 0..5 {
            ids.push(waiting(&manager, &format!("t{n}"), 300 * MIB, "").await.id);
        }
        one_node(&manager).await;
        let placed = pass(&manager);
        assert_eq!(
            placed,
            ids[..3],
            "three of 300 MiB fit in 1 GiB, oldest first"
        );
        for id in &ids[3..] {
            let left = task(&manager, *id);
            assert_eq!(left.status.state, State::Pending);
            let reason = left.status.pending_reason.unwrap_or_default();
            assert!(reason.contains("memory"), "{reason}");
        }
        assert!(
            pass(&manager).is_empty(),
            "a second pass finds no more room"
        );
    }

    #[tokio::test]
    async fn a_higher_priority_job_goes_before_an_older_bare_task() {
        let manager = manager();
        let bare = waiting(&manager, "bare", 700 * MIB, "").await.id;
        let record: JobRecord = serde_json::from_value(serde_json::json!({
            "Job": {"Name": "urgent", "Type": "service", "Priority": 90,
                    "Groups": [{"Name": "g", "Count": 1, "Task": {"Image": "cube-sample:latest"}}]},
            "Version": 1
        }))
        .unwrap();
        lock(&manager.cluster.state)
            .jobs
            .insert("urgent".to_string(), Arc::new(record));
        let urgent = waiting(&manager, "urgent.g[0]", 700 * MIB, "urgent")
            .await
            .id;
        one_node(&manager).await;
        assert_eq!(pass(&manager), vec![urgent]);
        assert_eq!(task(&manager, bare).status.state, State::Pending);
    }

    fn job_record(name: &str, job_type: &str) -> JobRecord {
        serde_json::from_value(serde_json::json!({
            "Job": {"Name": name, "Type": job_type,
                    "Groups": [{"Name": "g", "Count": 3, "Task": {"Image": "cube-sample:latest"}}]},
            "Version": 1
        }))
        .unwrap()
    }

    /// The service job `trio` and its three waiting copies of 400 MiB each.
    async fn trio(manager: &Arc<Manager>) -> Vec<uuid::Uuid> {
        lock(&manager.cluster.state)
            .jobs
            .insert("trio".to_string(), Arc::new(job_record("trio", "service")));
        let mut copies = Vec::new();
        for n in 0..3 {
            copies.push(
                waiting(manager, &format!("trio.g[{n}]"), 400 * MIB, "trio")
                    .await
                    .id,
            );
        }
        copies
    }

    #[tokio::test]
    async fn a_job_is_placed_whole_or_not_at_all() {
        let manager = manager();
        let copies = trio(&manager).await;
        one_node(&manager).await;
        assert!(
            pass(&manager).is_empty(),
            "two would fit, three do not: none is placed"
        );
        for id in &copies {
            let left = task(&manager, *id);
            assert_eq!(left.status.state, State::Pending);
            assert!(left.status.node_name.is_empty());
            let reason = left.status.pending_reason.unwrap_or_default();
            assert!(reason.contains("all 3 of its copies"), "{reason}");
        }
        // A bare task behind it that fits is not held up by it.
        let small = waiting(&manager, "small", 100 * MIB, "").await.id;
        assert_eq!(pass(&manager), vec![small]);
    }

    /// What a pass reads next: nothing marked, or these tasks.
    fn marked(manager: &Manager) -> Option<Vec<uuid::Uuid>> {
        let state = lock(&manager.cluster.state);
        (!state.placement_dirty.is_everything())
            .then(|| state.placement_dirty.keys().iter().copied().collect())
    }

    #[tokio::test]
    async fn a_pass_after_a_submission_reads_its_request_alone_and_decides_as_a_whole_pass_would() {
        let manager = manager();
        one_node(&manager).await;
        let big = waiting(&manager, "big", 700 * MIB, "").await.id;
        assert_eq!(pass(&manager), vec![big]);
        let wide = waiting(&manager, "wide", 500 * MIB, "").await.id;
        assert_eq!(
            marked(&manager),
            Some(vec![wide]),
            "a submission marks itself"
        );
        assert!(
            pass(&manager).is_empty(),
            "324 MiB are left: 500 do not fit"
        );
        assert_eq!(marked(&manager), Some(vec![]), "the pass took the marks");
        // Its reason, changed behind the pass's back, shows whether a pass reads it again.
        {
            let mut state = lock(&manager.cluster.state);
            let mut stale = state.cache.get(&wide).unwrap().clone();
            stale.status.pending_reason = Some("stale".to_string());
            state.cache.insert(stale);
        }
        let small = waiting(&manager, "small", 100 * MIB, "").await.id;
        assert_eq!(pass(&manager), vec![small]);
        assert_eq!(
            task(&manager, wide).status.pending_reason.as_deref(),
            Some("stale"),
            "the pass for the new task read nothing else"
        );
        // A pass over every waiting task places nothing more: the new task's pass decided
        // what a whole one would.
        lock(&manager.cluster.state)
            .placement_dirty
            .mark_everything();
        assert!(pass(&manager).is_empty());
        let reason = task(&manager, wide)
            .status
            .pending_reason
            .unwrap_or_default();
        assert!(
            reason.contains("memory"),
            "a whole pass reads it again: {reason}"
        );
        // Room that appears marks everything: a node that joins.
        crate::manager::join_test_node(&manager, "w2", 1024 * MIB).await;
        assert_eq!(marked(&manager), None);
        assert_eq!(pass(&manager), vec![wide]);
    }

    /// The room a task leaves is in the cache the moment its end is saved, before whoever
    /// saved it asks for a pass over every waiting request: a pass that starts in between,
    /// for a request that arrived just then, must still give the room to the request that
    /// waited longest (`cube-bench chaos` saw a later request let in first).
    #[tokio::test]
    async fn room_freed_goes_to_the_request_that_waited_even_to_a_pass_for_a_newer_one() {
        let manager = manager();
        one_node(&manager).await;
        let busy = waiting(&manager, "busy", 700 * MIB, "").await.id;
        assert_eq!(pass(&manager), vec![busy]);
        let first = waiting(&manager, "first", 600 * MIB, "").await.id;
        assert!(pass(&manager).is_empty(), "600 MiB do not fit beside 700");
        // The busy task ends, as a follower saves a worker's report; the follower's own
        // request for a whole pass has not come yet.
        {
            let mut state = lock(&manager.cluster.state);
            let mut ended = state.cache.get(&busy).unwrap().clone();
            ended.status.state = State::Completed;
            let mut writes = Writes::default();
            manager
                .cluster
                .save(&mut state, &mut writes, ended)
                .unwrap();
        }
        // Room for one of the two.
        let later = waiting(&manager, "later", 600 * MIB, "").await.id;
        assert_eq!(
            pass(&manager),
            vec![first],
            "the room went to {:?}",
            task(&manager, later).status.node_name
        );
        assert_eq!(task(&manager, later).status.state, State::Pending);
    }

    #[tokio::test]
    async fn a_job_waiting_whole_is_read_again_when_a_copy_of_it_is_stopped() {
        let manager = manager();
        let copies = trio(&manager).await;
        one_node(&manager).await;
        assert!(
            pass(&manager).is_empty(),
            "three of 400 MiB do not fit in 1 GiB"
        );
        // One copy is no longer wanted (a scale-down): the job's request is two copies now.
        {
            let mut state = lock(&manager.cluster.state);
            let mut unwanted = state.cache.get(&copies[2]).unwrap().clone();
            unwanted.spec.desired_state = State::Completed;
            state.cache.insert(unwanted);
        }
        crate::task_controller::TaskController::new(manager.cluster.clone())
            .reconcile(copies[2])
            .await
            .unwrap();
        assert_eq!(task(&manager, copies[2]).status.state, State::Completed);
        assert_eq!(
            marked(&manager),
            Some(vec![copies[2]]),
            "the stopped copy marks its job's request"
        );
        assert_eq!(pass(&manager), copies[..2]);
    }

    #[tokio::test]
    async fn an_owner_at_its_limit_waits_and_others_go() {
        let mut config = crate::manager::test_config();
        config.max_claimed_per_owner = Some(1);
        let manager = crate::manager::Manager::open(
            config,
            crate::cluster::ManagerStores::in_memory(),
            cube_scheduler::scheduler_by_name("roundrobin").unwrap(),
            tokio_util::sync::CancellationToken::new(),
        )
        .unwrap();
        let owned = |name: &str, owner: &str| {
            let mut task = Task::new(name, "cube-sample:latest");
            task.spec.memory = 100 * MIB;
            task.spec.owner = owner.to_string();
            task
        };
        let first = manager
            .accept_task(owned("a1", "alice"), None)
            .await
            .unwrap()
            .id;
        let second = manager
            .accept_task(owned("a2", "alice"), None)
            .await
            .unwrap()
            .id;
        let other = manager
            .accept_task(owned("b1", "bob"), None)
            .await
            .unwrap()
            .id;
        one_node(&manager).await;
        assert_eq!(pass(&manager), vec![first, other]);
        let held = task(&manager, second);
        assert_eq!(held.status.state, State::Pending);
        assert!(
            held.status
                .pending_reason
                .unwrap_or_default()
                .contains("owner alice already has 1 request in (--max-claimed-per-owner 1)")
        );
        assert!(pass(&manager).is_empty(), "still held on the next pass");
    }
}
