//! The queue controller: keeps the waiting list (the `queue` table) what the pure transformer
//! ([`crate::queue::plan`]) says it should be, on the controller framework's runner with one
//! key (many changes while a look waits come down to one more look).
//!
//! A look reads the requests (live bare tasks, and tasks an entry names; every job but
//! system jobs), their tasks and the nodes' addresses under the manager's lock, asks the
//! transformer for the list, and syncs it: the framework's [`diff_by_key`] gives the entries
//! to create, update and delete, and only those are written, in one batch (a look that finds
//! nothing changed writes nothing: the field report's "infinite update" trap). Then the
//! requests that waited past their `QueueTimeout` are stopped. It looks again when a timeout
//! runs out, and whenever a task, a job or a node changes (`Cluster::push_queue`).
//!
//! The API's side is here too: `GET /queue` and `GET /services`, and the queue's words for a
//! job (`JobView::queue`).

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::Utc;
use cube_controller::runner::{Action, ExponentialBackoff, ReadyGate};
use cube_controller::syncer::{SyncAction, diff_by_key};
use cube_store::StoreError;
use cube_types::Task;
use cube_types::job::{JobRecord, JobType};
use cube_types::queue::{Endpoint, QueueEntry, QueueState, RequestKind};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::cluster::{Cluster, QUEUE_NUMBER_KEY, lock};
use crate::events::Topic;
use crate::job_records::JobRecords;
use crate::jobs::is_live;
use crate::queue::{
    Expiry, QueueDirty, QueueLook, QueuePlan, Request, Source, endpoint, endpoints, plan,
    request_value, waiting_reason,
};

/// An entry as `GET /queue` shows it: the stored entry, its position among those that wait
/// (1 = next, 0 once let in or expired) and, while it waits, why.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueView {
    #[serde(flatten)]
    pub entry: QueueEntry,
    #[serde(rename = "Position", default)]
    pub position: usize,
    #[serde(
        rename = "WaitingFor",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub waiting_for: Option<String>,
}

/// An entry as `GET /queue` lists it: [`QueueView`]'s fields, the entry shared with the
/// stored list rather than copied.
#[derive(Debug, Clone, Serialize)]
pub struct ListedEntry {
    #[serde(flatten)]
    pub entry: Arc<QueueEntry>,
    /// What was submitted, when the entry does not keep it: written from the task or job
    /// as the answer is, after the lock is let go.
    #[serde(rename = "Request", skip_serializing_if = "Option::is_none")]
    pub request: Option<Submitted>,
    /// Where a claimed request's copies answer, read from its tasks (an entry stores none).
    #[serde(rename = "Services", skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<Endpoint>,
    #[serde(rename = "Position")]
    pub position: usize,
    #[serde(rename = "WaitingFor", skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
}

/// The task or job a request is, shared with the manager's state: serialized as the entry's
/// `Request` ([`request_value`]).
#[derive(Debug, Clone)]
pub enum Submitted {
    Task(Arc<Task>),
    Job(Arc<JobRecord>),
}

impl Submitted {
    /// The request of an entry that does not keep it, from the manager's state.
    pub(crate) fn of(state: &crate::cluster::Shared, entry: &QueueEntry) -> Option<Submitted> {
        if !entry.request.is_null() {
            return None;
        }
        match entry.kind {
            RequestKind::Task => task_of(state, entry).map(Submitted::Task),
            RequestKind::Job => state.jobs.get(&entry.id).cloned().map(Submitted::Job),
        }
    }

    pub(crate) fn value(&self) -> serde_json::Value {
        match self {
            Submitted::Task(task) => request_value(Source::Task(task)),
            Submitted::Job(record) => request_value(Source::Job(record)),
        }
    }
}

impl Serialize for Submitted {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.value().serialize(serializer)
    }
}

/// One service as `GET /services` shows it: a claimed bare task, or a job's group, with its
/// copies that run and are healthy.
#[derive(Debug, Clone, Serialize)]
pub struct ServiceView {
    /// The task's name, or `job.group`.
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Kind")]
    pub kind: RequestKind,
    #[serde(rename = "Job", skip_serializing_if = "String::is_empty")]
    pub job: String,
    #[serde(
        rename = "Project",
        skip_serializing_if = "cube_types::project::is_default"
    )]
    pub project: String,
    #[serde(rename = "Endpoints")]
    pub endpoints: Vec<Endpoint>,
}

/// Why a look at the waiting list did not finish (the next one reads every request).
#[derive(Debug, thiserror::Error)]
enum LookError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the queue's deletes stopped: {0}")]
    Deletes(tokio::task::JoinError),
    #[error("the read of the waiting list's shared number stopped: {0}")]
    NumberRead(tokio::task::JoinError),
    #[error(
        "the waiting list's shared number changed under each of {NUMBER_TRIES} tries to \
         take numbers from it (other managers numbering at the same time); the next look \
         tries again"
    )]
    NumbersContended,
}

/// How many times one look tries to take numbers from the counter the managers share
/// (`reserve_numbers`) before it gives up to the next look.
const NUMBER_TRIES: usize = 20;

/// Takes `count` numbers from the counter every manager sharing the store reads and writes
/// (`meta`'s [`QUEUE_NUMBER_KEY`]): reads it, and writes it `count` higher on the condition
/// that no manager wrote it since, again from a new read when one did. The first number
/// taken; none at or below `known`, the highest this manager has given. Numbers taken by a
/// look whose entries are then not written are left unused: a gap, never a number given
/// twice.
async fn reserve_numbers(
    meta: &Arc<dyn cube_store::Store<u64>>,
    known: u64,
    count: u64,
) -> Result<u64, LookError> {
    for _ in 0..NUMBER_TRIES {
        let reader = meta.clone();
        let read = tokio::task::spawn_blocking(move || reader.get_with_revision(QUEUE_NUMBER_KEY))
            .await
            .map_err(LookError::NumberRead)??;
        let (last, expected) = match read {
            Some((last, revision)) => (last, cube_store::Expected::Revision(revision)),
            None => (0, cube_store::Expected::Absent),
        };
        let base = last.max(known);
        let written = meta
            .put_if_queued(QUEUE_NUMBER_KEY, &(base + count), expected)?
            .durable()
            .await?;
        if written.is_ok() {
            return Ok(base + 1);
        }
    }
    Err(LookError::NumbersContended)
}

/// How many numbers a look takes from the counter the managers share, at least. Each take
/// is a conditional write, which goes to etcd in a transaction of its own, between the
/// manager's other writes: with one per look 200,000 submissions through three managers
/// took 798 s, against 627–637 s before the counter (BENCHMARKS.md); one per block of this
/// many is rare.
const NUMBER_BLOCK: u64 = 128;

/// How long numbers taken from the shared counter are given out: older ones are let go (a
/// gap), so that across managers the numbers follow the order of arrival within about this
/// long, as at a rate of a few requests they would not for hours.
const NUMBER_POOL_FOR: std::time::Duration = std::time::Duration::from_secs(1);

/// Numbers taken from the shared counter and not given yet: `next` up to `end` (excluded),
/// taken at `taken_at`.
#[derive(Debug, Default)]
struct NumberPool {
    next: u64,
    end: u64,
    taken_at: Option<std::time::Instant>,
}

impl NumberPool {
    /// The first of `count` numbers from the pool, when it holds that many, all above
    /// `known` (the highest number this manager holds), taken less than [`NUMBER_POOL_FOR`]
    /// ago.
    fn take(&mut self, count: u64, known: u64, now: std::time::Instant) -> Option<u64> {
        let fresh = self
            .taken_at
            .is_some_and(|at| now.saturating_duration_since(at) < NUMBER_POOL_FOR);
        if !fresh || self.next <= known || self.end.saturating_sub(self.next) < count {
            return None;
        }
        let first = self.next;
        self.next += count;
        Some(first)
    }

    /// Keeps `next` up to `end` (excluded), taken at `now`, for the next looks.
    fn keep(&mut self, next: u64, end: u64, now: std::time::Instant) {
        *self = NumberPool {
            next,
            end,
            taken_at: Some(now),
        };
    }
}

/// Moves the numbers `plan` gave its new entries (those above `known`, from `known + 1` on)
/// to start at `first` instead, in the same order, and its last number with them.
fn renumber(plan: &mut QueuePlan, known: u64, first: u64) {
    for entry in plan.entries.values_mut() {
        let number = entry.queue;
        if number > known {
            Arc::make_mut(entry).queue = number - known - 1 + first;
        }
    }
    plan.last_number = plan.last_number - known - 1 + first;
}

/// The queue controller (see the module comment).
///
/// | reads | woken by | writes |
/// |---|---|---|
/// | the waiting list, the requests marked since its last look (their tasks, their job), the time | a task's write (`Cluster::wake_for_task`), a job record's write (`JobRecords::store_job`), a placement that let a request in; its own next `QueueTimeout` as a delay | the entries that changed (one batch: `diff_by_key`), the queue number; stops a request that expired (its task, or its job) |
pub(crate) struct QueueController {
    cluster: Arc<Cluster>,
    records: Arc<JobRecords>,
    /// No look before this: the rest after the last one ([`REST_PER_LOOK`]).
    rest_until: std::sync::Mutex<Option<std::time::Instant>>,
    /// With `--shard-controllers`: numbers taken from the shared counter, not given yet.
    numbers: std::sync::Mutex<NumberPool>,
}

/// After a look, the controller rests this many times as long as the look took before it
/// looks again: a look reads every copy of each job marked under the cluster's lock, and
/// while the copies of big jobs all change at once (a million starting), looks back to back
/// held the lock a third of the time and kept a core busy. What changed meanwhile is marked
/// and read by the next look; the controller holds the lock at most a tenth of the time.
const REST_PER_LOOK: u32 = 9;

impl QueueController {
    pub(crate) fn new(cluster: Arc<Cluster>, records: Arc<JobRecords>) -> QueueController {
        QueueController {
            cluster,
            records,
            rest_until: std::sync::Mutex::new(None),
            numbers: std::sync::Mutex::new(NumberPool::default()),
        }
    }

    fn number_pool(&self) -> std::sync::MutexGuard<'_, NumberPool> {
        self.numbers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn rest_until(&self) -> std::sync::MutexGuard<'_, Option<std::time::Instant>> {
        self.rest_until
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Keeps the waiting list until `shutdown`: every request is read at start.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let cluster = self.cluster.clone();
        cluster.push_queue();
        let controller = Arc::new(self);
        let look = move |()| {
            let controller = controller.clone();
            async move { controller.look().await }
        };
        cluster
            .wakes
            .queue
            .run(
                look,
                ExponentialBackoff::default(),
                ReadyGate::open(),
                shutdown,
            )
            .await;
    }

    /// One look: plan, sync the entries that changed, stop what expired.
    pub(crate) async fn look(&self) -> Result<Action, String> {
        let started = std::time::Instant::now();
        if let Some(until) = *self.rest_until()
            && until > started
        {
            return Ok(Action::RequeueAfter(until - started));
        }
        let (mut planned, actions) = self.plan_queue();
        *self.rest_until() = Some(std::time::Instant::now() + started.elapsed() * REST_PER_LOOK);
        let done = async {
            self.sync_queue(&mut planned, actions).await?;
            for expiry in &planned.expire {
                self.expire(expiry).await?;
            }
            Ok::<_, LookError>(())
        }
        .await;
        if let Err(err) = done {
            // What this look took in is not written: the next one reads every request.
            lock(&self.cluster.state).queue_dirty.mark_everything();
            return Err(err.to_string());
        }
        let now = Utc::now();
        Ok(
            match planned
                .look_again_at
                .and_then(|at| (at - now).to_std().ok())
            {
                Some(wait) => Action::RequeueAfter(wait + std::time::Duration::from_millis(20)),
                None => Action::Done,
            },
        )
    }

    /// The waiting list as it should be, and what must change for the stored list to be it
    /// (the framework's `diff_by_key`), under one hold of the lock.
    ///
    /// An entry depends on its own request alone (its tasks, its job and the time), so a
    /// look reads only the requests marked since the last one ([`QueueDirty`]), and every
    /// request that waits only once the first `QueueTimeout` it knows of runs out (an entry
    /// that changes with nothing marked): with 100,000 claimed or 10,000 waiting tasks, a
    /// task's change costs a look at one request, not at all of them. Every request is read
    /// at start and after a look that failed.
    fn plan_queue(&self) -> (QueuePlan, Vec<SyncAction<String, String>>) {
        let now = Utc::now();
        let mut guard = lock(&self.cluster.state);
        let (marked, timeout_due) = guard.queue_dirty.take(now);
        let all_waiting = marked.is_none() || timeout_due;
        let state = &*guard;
        let mut requests = Vec::new();
        let mut job_tasks: Vec<(&str, Vec<Arc<Task>>)> = Vec::new();
        let observed: Option<BTreeMap<String, Arc<QueueEntry>>> = match marked {
            None => {
                // Bare tasks still asked for, and those an entry still names (an expired one).
                for task in state.cache.tasks() {
                    if task.spec.job.is_empty() && is_live(task) {
                        requests.push(Request {
                            source: Source::Task(task),
                            tasks: vec![task],
                        });
                    }
                }
                for entry in state.queue.values() {
                    if entry.kind != RequestKind::Task {
                        continue;
                    }
                    let Some(task) = entry
                        .id
                        .parse::<Uuid>()
                        .ok()
                        .and_then(|id| state.cache.get(&id))
                    else {
                        continue;
                    };
                    if !is_live(task) {
                        requests.push(Request {
                            source: Source::Task(task),
                            tasks: vec![task],
                        });
                    }
                }
                job_tasks = state
                    .jobs
                    .iter()
                    .filter(|(_, record)| record.job.job_type != JobType::System)
                    .map(|(key, _)| (key.as_str(), state.cache.of_job(key)))
                    .collect();
                None
            }
            Some(mut keys) => {
                // The requests that wait, when a timeout may have run out with nothing
                // changed.
                if timeout_due {
                    for id in state.cache.waiting() {
                        if let Some(task) = state.cache.get(&id) {
                            keys.insert(QueueDirty::key_of(task));
                        }
                    }
                }
                for key in &keys {
                    let Some((kind, id)) = key.split_once('/') else {
                        continue;
                    };
                    if kind == RequestKind::Task.name() {
                        // Live or not: a request no longer asked for leaves the list.
                        if let Some(task) = id
                            .parse::<Uuid>()
                            .ok()
                            .and_then(|id| state.cache.get(&id))
                            .filter(|task| task.spec.job.is_empty())
                        {
                            requests.push(Request {
                                source: Source::Task(task),
                                tasks: vec![task],
                            });
                        }
                    } else if let Some((key, record)) = state.jobs.get_key_value(id)
                        && record.job.job_type != JobType::System
                    {
                        job_tasks.push((key.as_str(), state.cache.of_job(id)));
                    }
                }
                // The stored entries of those requests: what the plan is compared with.
                Some(
                    keys.iter()
                        .filter_map(|key| {
                            state
                                .queue
                                .get(key)
                                .map(|entry| (key.clone(), Arc::clone(entry)))
                        })
                        .collect(),
                )
            }
        };
        for (name, tasks) in &job_tasks {
            if let Some(record) = state.jobs.get(*name) {
                requests.push(Request {
                    source: Source::Job(record),
                    tasks: tasks.iter().map(|task| &**task).collect(),
                });
            }
        }
        let look = QueueLook {
            requests,
            entries: &state.queue,
            last_number: state.queue_number,
            now,
        };
        let mut planned = plan(&look);
        let same = |desired: &Arc<QueueEntry>, observed: &Arc<QueueEntry>| {
            Arc::ptr_eq(desired, observed) || desired == observed
        };
        let actions = match &observed {
            Some(observed) => diff_by_key(&planned.entries, observed, |_| true, same),
            None => diff_by_key(&planned.entries, &state.queue, |_| true, same),
        };
        planned.look_again_at = guard
            .queue_dirty
            .keep_timeout(planned.look_again_at, all_waiting);
        (planned, actions)
    }

    /// Writes the entries that changed (and the last queue number, when it moved) in one
    /// batch, then keeps them and publishes each change.
    ///
    /// With `--shard-controllers` every manager numbers its own shards' requests, and the
    /// numbers come from one counter they share: the new entries' numbers are taken from it
    /// first (`reserve_numbers`, a block at a time, given out for a second), so that two
    /// managers never give the same number and the numbers of every project follow the
    /// order of arrival within about a second.
    async fn sync_queue(
        &self,
        planned: &mut QueuePlan,
        actions: Vec<SyncAction<String, String>>,
    ) -> Result<(), LookError> {
        if actions.is_empty() {
            return Ok(());
        }
        let mut commits = Vec::new();
        let mut deletes = Vec::new();
        let (known, shared) = {
            let state = lock(&self.cluster.state);
            (state.queue_number, state.fence.is_some())
        };
        if planned.last_number > known {
            if shared {
                let count = planned.last_number - known;
                let now = std::time::Instant::now();
                let pooled = self.number_pool().take(count, known, now);
                let first = match pooled {
                    Some(first) => first,
                    None => {
                        let block = count.max(NUMBER_BLOCK);
                        let first =
                            reserve_numbers(&self.cluster.stores.meta, known, block).await?;
                        self.number_pool().keep(
                            first + count,
                            first + block,
                            std::time::Instant::now(),
                        );
                        first
                    }
                };
                renumber(planned, known, first);
            } else {
                commits.push(
                    self.cluster
                        .stores
                        .meta
                        .put_queued(QUEUE_NUMBER_KEY, &planned.last_number)?,
                );
            }
        }
        let layout = self.cluster.stores.layout;
        for action in &actions {
            match action {
                SyncAction::Create(key) | SyncAction::Update(key, _) => {
                    if let Some(entry) = planned.entries.get(key) {
                        commits.push(
                            self.cluster
                                .stores
                                .queue
                                .put_queued(&layout.queue(entry.project(), key), &**entry)?,
                        );
                    }
                }
                SyncAction::Delete(_, key) => deletes.push(key.clone()),
            }
        }
        // The store keys of the entries to delete: under their project's shard on etcd.
        let deletes: Vec<String> = {
            let state = lock(&self.cluster.state);
            deletes
                .iter()
                .filter_map(|key| {
                    let entry = state.queue.get(key)?;
                    Some(layout.queue(entry.project(), key))
                })
                .collect()
        };
        for commit in commits {
            commit.durable().await?;
        }
        if !deletes.is_empty() {
            let queue = self.cluster.stores.queue.clone();
            let keys = deletes;
            tokio::task::spawn_blocking(move || {
                keys.iter()
                    .try_for_each(|key| queue.delete(key).map(|_| ()))
            })
            .await
            .map_err(LookError::Deletes)??;
        }
        let mut state = lock(&self.cluster.state);
        state.queue_number = state.queue_number.max(planned.last_number);
        for action in actions {
            match action {
                SyncAction::Create(key) | SyncAction::Update(key, _) => {
                    let Some(entry) = planned.entries.get(&key) else {
                        continue;
                    };
                    let before = state.queue.get(&key).map(|entry| entry.state);
                    let kind = queue_event_kind(before, entry.state);
                    if entry.state.is_admitted() {
                        state.just_admitted.remove(&key);
                    }
                    self.cluster.publish(
                        Topic::Queue,
                        kind,
                        &key,
                        (entry.kind == RequestKind::Job).then_some(entry.id.as_str()),
                        Some(entry.project()),
                        serde_json::to_value(&**entry).unwrap_or_default(),
                    );
                    state.queue.insert(key, Arc::clone(entry));
                }
                SyncAction::Delete(_, key) => {
                    state.just_admitted.remove(&key);
                    if let Some(gone) = state.queue.remove(&key) {
                        self.cluster.publish(
                            Topic::Queue,
                            "Left",
                            &key,
                            (gone.kind == RequestKind::Job).then_some(gone.id.as_str()),
                            Some(gone.project()),
                            serde_json::to_value(&*gone).unwrap_or_default(),
                        );
                    }
                }
            }
        }
        Ok(())
    }

    /// Stops a request that waited past its `QueueTimeout`: a bare task with the reason in
    /// its history, a job as `cube job stop` does.
    async fn expire(&self, expiry: &Expiry) -> Result<(), StoreError> {
        tracing::warn!(request = %expiry.id, kind = expiry.kind.name(), reason = %expiry.reason, "a request expired in the queue");
        match expiry.kind {
            RequestKind::Task => {
                let Ok(id) = expiry.id.parse::<Uuid>() else {
                    return Ok(());
                };
                self.cluster
                    .stop_tasks(
                        &[id],
                        Some(&format!("expired in the queue: {}", expiry.reason)),
                    )
                    .await?;
            }
            // A job gone since is nothing to stop.
            RequestKind::Job => {
                self.records.stop(&expiry.id).await?;
            }
        }
        Ok(())
    }
}

/// The task a bare task's entry is for, while the manager holds it.
pub(crate) fn task_of(state: &crate::cluster::Shared, entry: &QueueEntry) -> Option<Arc<Task>> {
    let id = entry.id.parse::<Uuid>().ok()?;
    state.cache.shared(&id)
}

/// The tasks of an entry's request: the task itself, or the job's.
pub(crate) fn tasks_of(state: &crate::cluster::Shared, entry: &QueueEntry) -> Vec<Arc<Task>> {
    match entry.kind {
        RequestKind::Task => task_of(state, entry).into_iter().collect(),
        RequestKind::Job => state.cache.of_job(&entry.id),
    }
}

/// Each node's host, as its workers reach it (the host of its address).
pub(crate) fn hosts(state: &crate::cluster::Shared) -> BTreeMap<String, String> {
    state
        .nodes
        .entries()
        .map(|entry| (entry.name.clone(), host_of(&entry.address)))
        .collect()
}

/// Where a claimed entry's copies answer, read from its tasks now (an entry stores none).
pub(crate) fn services_of(
    state: &crate::cluster::Shared,
    entry: &QueueEntry,
    hosts: &BTreeMap<String, String>,
) -> Vec<Endpoint> {
    if entry.state != QueueState::Claimed {
        return Vec::new();
    }
    let tasks = tasks_of(state, entry);
    let tasks: Vec<&Task> = tasks.iter().map(|task| &**task).collect();
    endpoints(&tasks, hosts)
}

/// Why a waiting entry waits, in words: its tasks' `PendingReason`.
pub(crate) fn waiting_for(state: &crate::cluster::Shared, entry: &QueueEntry) -> Option<String> {
    let tasks = tasks_of(state, entry);
    let tasks: Vec<&Task> = tasks.iter().map(|task| &**task).collect();
    Some(
        waiting_reason(&tasks).unwrap_or_else(|| "its turn in the next placement pass".to_string()),
    )
}

/// The event a change of an entry makes: `Queued` (a new entry waiting), `Admitted` (let
/// in), `Claimed`, `Expired`, or `Updated` (another change: copies came up or went down,
/// new addresses).
fn queue_event_kind(before: Option<QueueState>, after: QueueState) -> &'static str {
    match (before, after) {
        (_, QueueState::Expired) if before != Some(QueueState::Expired) => "Expired",
        (_, QueueState::Claimed) if before != Some(QueueState::Claimed) => "Claimed",
        (None, QueueState::Waiting) => "Queued",
        (None | Some(QueueState::Waiting), QueueState::Pending(_)) => "Admitted",
        _ => "Updated",
    }
}

/// The host of a node's `HOST:PORT` address (what its tasks' published ports are reached
/// at).
pub(crate) fn host_of(address: &str) -> String {
    let address = address
        .strip_prefix("http://")
        .or_else(|| address.strip_prefix("https://"))
        .unwrap_or(address);
    let address = address.split('/').next().unwrap_or(address);
    match address.rsplit_once(':') {
        Some((host, _)) => host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        None => address.to_string(),
    }
}

pub(crate) fn endpoint_of(task: &Task, hosts: &BTreeMap<String, String>) -> Endpoint {
    let address = hosts
        .get(task.status.node_name.as_str())
        .cloned()
        .unwrap_or_default();
    endpoint(task, address)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::Manager;
    use cube_types::State;

    #[test]
    fn new_entries_are_moved_to_the_numbers_taken_in_their_order() {
        let entry = |queue: u64| {
            Arc::new(QueueEntry {
                id: Uuid::new_v4().to_string(),
                kind: RequestKind::Task,
                queue,
                priority: 50,
                owner: String::new(),
                project: String::new(),
                state: QueueState::Waiting,
                since: None,
                version: None,
                request: serde_json::Value::Null,
                reason: String::new(),
                services: Vec::new(),
            })
        };
        let mut plan = QueuePlan {
            entries: [("a", 3), ("b", 5), ("c", 6)]
                .into_iter()
                .map(|(key, queue)| (key.to_string(), entry(queue)))
                .collect(),
            last_number: 6,
            ..QueuePlan::default()
        };
        // This manager had given up to 4; the counter they share gave it 101 and 102.
        renumber(&mut plan, 4, 101);
        let numbers: Vec<u64> = plan.entries.values().map(|entry| entry.queue).collect();
        assert_eq!(numbers, vec![3, 101, 102], "an old entry keeps its number");
        assert_eq!(plan.last_number, 102);
    }

    #[test]
    fn a_pool_gives_numbers_taken_a_moment_ago_and_lets_older_ones_go() {
        let now = std::time::Instant::now();
        let mut pool = NumberPool::default();
        assert_eq!(pool.take(1, 0, now), None, "nothing taken yet");
        pool.keep(11, 138, now);
        assert_eq!(pool.take(3, 10, now), Some(11));
        assert_eq!(pool.take(3, 13, now), Some(14));
        assert_eq!(pool.take(200, 16, now), None, "not that many left");
        assert_eq!(
            pool.take(1, 500, now),
            None,
            "below what this manager holds"
        );
        let later = now + NUMBER_POOL_FOR;
        assert_eq!(pool.take(1, 16, later), None, "taken too long ago");
    }

    /// Managers numbering at once, each from what it last gave: every number is given once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn managers_taking_numbers_at_once_never_take_the_same_one() {
        let meta: Arc<dyn cube_store::Store<u64>> = Arc::new(cube_store::MemoryStore::new());
        let mut takers = tokio::task::JoinSet::new();
        for manager in 0..4u64 {
            let meta = meta.clone();
            takers.spawn(async move {
                let mut taken = Vec::new();
                let mut known = 0;
                for look in 0..25u64 {
                    let count = 1 + (manager + look) % 3;
                    // Contended too often, a look gives up to the next one: here, tried again.
                    let first = loop {
                        match reserve_numbers(&meta, known, count).await {
                            Ok(first) => break first,
                            Err(LookError::NumbersContended) => continue,
                            Err(err) => panic!("{err}"),
                        }
                    };
                    taken.extend(first..first + count);
                    known = first + count - 1;
                }
                taken
            });
        }
        let mut every = Vec::new();
        while let Some(taken) = takers.join_next().await {
            every.extend(taken.unwrap());
        }
        let given = every.len();
        every.sort_unstable();
        every.dedup();
        assert_eq!(every.len(), given, "a number given twice");
        assert_eq!(meta.get(QUEUE_NUMBER_KEY).unwrap(), every.last().copied());
    }

    #[test]
    fn a_node_address_gives_its_host() {
        assert_eq!(host_of("10.0.0.2:5556"), "10.0.0.2");
        assert_eq!(host_of("http://10.0.0.2:5556"), "10.0.0.2");
        assert_eq!(host_of("[::1]:5556"), "::1");
        assert_eq!(host_of("worker"), "worker");
    }

    #[test]
    fn entry_changes_are_named_for_what_happened() {
        assert_eq!(queue_event_kind(None, QueueState::Waiting), "Queued");
        assert_eq!(
            queue_event_kind(Some(QueueState::Waiting), QueueState::Pending(2)),
            "Admitted"
        );
        assert_eq!(
            queue_event_kind(Some(QueueState::Pending(1)), QueueState::Claimed),
            "Claimed"
        );
        assert_eq!(
            queue_event_kind(Some(QueueState::Pending(2)), QueueState::Pending(1)),
            "Updated"
        );
        assert_eq!(
            queue_event_kind(Some(QueueState::Waiting), QueueState::Expired),
            "Expired"
        );
    }

    /// A bare task that waits (nothing could hold 1 TiB), expiring after `timeout`.
    fn waiting_task(name: &str, timeout: Option<std::time::Duration>) -> Task {
        let mut task = Task::new(name, "cube-sample:latest");
        task.spec.memory = 1 << 40;
        task.spec.queue_timeout = timeout;
        task
    }

    #[tokio::test]
    async fn alone_on_a_memory_store_the_controller_numbers_what_waits_and_stops_what_expired() {
        // No `Manager`: a cluster read from memory stores that hold two waiting bare tasks.
        let stores = crate::cluster::ManagerStores::in_memory();
        let impatient = waiting_task("impatient", Some(std::time::Duration::from_millis(300)));
        let patient = waiting_task("patient", None);
        for task in [&impatient, &patient] {
            stores.tasks.put(&task.id.to_string(), task).unwrap();
        }
        let cluster = crate::cluster::cluster_for_tests(stores, std::time::Duration::from_secs(60));
        let records = Arc::new(JobRecords::new(cluster.clone()));
        let controller = QueueController::new(cluster.clone(), records);
        let first = controller.look().await.unwrap();
        assert!(
            matches!(first, Action::RequeueAfter(wait) if wait <= std::time::Duration::from_millis(320)),
            "the look comes back when the timeout runs out: {first:?}"
        );
        let entry = |task: &Task| {
            cluster
                .stores
                .queue
                .get(&RequestKind::Task.key(&task.id.to_string()))
                .unwrap()
                .expect("an entry is stored")
        };
        let (first_entry, second_entry) = (entry(&impatient), entry(&patient));
        assert_eq!(first_entry.state, QueueState::Waiting);
        assert_eq!(second_entry.state, QueueState::Waiting);
        assert_ne!(
            first_entry.queue, second_entry.queue,
            "each request has a number of its own"
        );
        assert!(
            first_entry.request.is_null(),
            "a waiting entry keeps no copy of its task"
        );
        tokio::time::sleep(std::time::Duration::from_millis(350)).await;
        controller.look().await.unwrap();
        let expired = entry(&impatient);
        assert_eq!(expired.state, QueueState::Expired);
        assert!(
            expired.reason.contains("QueueTimeout"),
            "{}",
            expired.reason
        );
        assert_eq!(expired.queue, first_entry.queue, "the number is kept");
        assert_eq!(entry(&patient).state, QueueState::Waiting);
        let stored = cluster
            .stores
            .tasks
            .get(&impatient.id.to_string())
            .unwrap()
            .expect("the task is stored");
        assert_eq!(
            stored.spec.desired_state,
            State::Completed,
            "the expired request is stopped, durably"
        );
        assert_eq!(
            cluster
                .stores
                .tasks
                .get(&patient.id.to_string())
                .unwrap()
                .expect("the task is stored")
                .spec
                .desired_state,
            State::Running
        );
    }

    #[tokio::test]
    async fn a_look_with_nothing_changed_writes_nothing() {
        let manager = crate::manager::manager_for_tests();
        crate::manager::join_test_node(&manager, "w1", 1 << 30).await;
        let mut ids = Vec::new();
        for n in 0..3 {
            let mut task = Task::new(format!("t{n}"), "cube-sample:latest");
            task.spec.memory = 400 << 20;
            ids.push(manager.accept_task(task, None).await.unwrap().id);
        }
        let mut writes = crate::cluster::Writes::default();
        let placed = manager
            .placement_controller()
            .placement_pass(&mut writes)
            .unwrap();
        manager.cluster.settle(writes).await.unwrap();
        assert_eq!(placed.len(), 2, "two of 400 MiB fit in 1 GiB");
        manager.queue_controller().look().await.unwrap();
        let queue = manager.queue();
        assert_eq!(queue.len(), 3);
        // The request is shown from the task itself, not copied into the stored entry.
        let shown = serde_json::to_value(&queue).unwrap();
        let mut names: Vec<&str> = shown
            .as_array()
            .unwrap()
            .iter()
            .map(|entry| entry["Request"]["Name"].as_str().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["t0", "t1", "t2"]);
        assert!(queue.iter().all(|view| view.entry.request.is_null()));
        let one = manager.queue_entry_of_task(ids[0]).unwrap();
        assert_eq!(one.entry.request["Name"], "t0");
        assert_eq!(
            queue
                .iter()
                .filter(|view| view.entry.state == QueueState::Waiting)
                .count(),
            1
        );
        let revision = manager.store_revision().unwrap();
        for _ in 0..3 {
            let mut writes = crate::cluster::Writes::default();
            assert!(
                manager
                    .placement_controller()
                    .placement_pass(&mut writes)
                    .unwrap()
                    .is_empty()
            );
            manager.cluster.settle(writes).await.unwrap();
            manager.queue_controller().look().await.unwrap();
        }
        assert_eq!(
            manager.store_revision().unwrap(),
            revision,
            "an admission pass and a look at the queue with nothing changed wrote"
        );
    }

    #[tokio::test]
    async fn a_waiting_request_expires_when_its_timeout_runs_out_with_nothing_marked() {
        let manager = crate::manager::manager_for_tests();
        crate::manager::join_test_node(&manager, "w1", 1 << 30).await;
        let waiting = |name: &str, timeout: Option<std::time::Duration>| {
            let mut task = Task::new(name, "cube-sample:latest");
            task.spec.memory = 2 << 30;
            task.spec.queue_timeout = timeout;
            task
        };
        let impatient = manager
            .accept_task(
                waiting("impatient", Some(std::time::Duration::from_millis(300))),
                None,
            )
            .await
            .unwrap()
            .id;
        manager.queue_controller().look().await.unwrap();
        // Another request after it: a look that reads it alone keeps the first's timeout.
        let patient = manager
            .accept_task(waiting("patient", None), None)
            .await
            .unwrap()
            .id;
        let again = manager.queue_controller().look().await.unwrap();
        assert!(
            matches!(again, Action::RequeueAfter(wait) if wait <= std::time::Duration::from_millis(320)),
            "the look comes back when the first timeout runs out: {again:?}"
        );
        let state_of = |id: Uuid| manager.queue_entry_of_task(id).map(|view| view.entry.state);
        assert_eq!(state_of(impatient), Some(QueueState::Waiting));
        tokio::time::sleep(std::time::Duration::from_millis(350)).await;
        assert!(
            lock(&manager.cluster.state)
                .queue_dirty
                .marks()
                .keys()
                .is_empty()
        );
        manager.queue_controller().look().await.unwrap();
        assert_eq!(state_of(impatient), Some(QueueState::Expired));
        assert_eq!(state_of(patient), Some(QueueState::Waiting));
        // The expired task ends as a failure, with the expiry as its error; a stop the user
        // asks for still ends a waiting task `Completed`.
        manager.request_stop(patient).await.unwrap();
        for id in [impatient, patient] {
            crate::task_controller::TaskController::new(manager.cluster.clone())
                .reconcile(id)
                .await
                .unwrap();
        }
        let expired = manager.task(impatient).unwrap();
        assert_eq!(expired.status.state, State::Failed);
        let error = expired.status.run.error.clone().unwrap_or_default();
        assert!(
            error.contains("expired in the queue") && error.contains("QueueTimeout"),
            "{error}"
        );
        assert_eq!(
            manager.task(patient).unwrap().status.state,
            State::Completed
        );
    }

    #[tokio::test]
    async fn a_look_reads_only_the_requests_that_changed_and_keeps_the_list_a_whole_look_would() {
        let manager = crate::manager::manager_for_tests();
        crate::manager::join_test_node(&manager, "w1", 1 << 30).await;
        let mut ids = Vec::new();
        for n in 0..4 {
            let mut task = Task::new(format!("t{n}"), "cube-sample:latest");
            task.spec.memory = 300 << 20;
            ids.push(manager.accept_task(task, None).await.unwrap().id);
        }
        let mut writes = crate::cluster::Writes::default();
        assert_eq!(
            manager
                .placement_controller()
                .placement_pass(&mut writes)
                .unwrap()
                .len(),
            3
        );
        manager.cluster.settle(writes).await.unwrap();
        manager.queue_controller().look().await.unwrap();
        let claimed_before = |manager: &Manager| {
            manager
                .queue()
                .iter()
                .filter(|view| view.entry.state == QueueState::Claimed)
                .count()
        };
        assert_eq!(claimed_before(&manager), 0);
        // One placed task runs: its request alone is marked.
        let running = ids[0];
        manager
            .cluster
            .with_writes(|writes| {
                let mut state = lock(&manager.cluster.state);
                let mut task = state.cache.get(&running).unwrap().clone();
                task.move_to(State::Running).unwrap();
                manager.cluster.save(&mut state, writes, task)
            })
            .await
            .unwrap();
        {
            let state = lock(&manager.cluster.state);
            assert!(!state.queue_dirty.marks().is_everything());
            assert_eq!(
                state.queue_dirty.marks().keys().iter().collect::<Vec<_>>(),
                vec![&RequestKind::Task.key(&running.to_string())]
            );
        }
        manager.queue_controller().look().await.unwrap();
        assert_eq!(
            claimed_before(&manager),
            1,
            "the running task's entry is claimed"
        );
        // A look at every request finds nothing more to change.
        lock(&manager.cluster.state).queue_dirty.mark_everything();
        let (_, actions) = manager.queue_controller().plan_queue();
        assert!(actions.is_empty(), "a whole look would change {actions:?}");
    }
}
