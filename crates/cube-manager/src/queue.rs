//! The waiting list's transformer: from the requests (bare tasks and jobs), their tasks, the
//! nodes' addresses, the entries as stored and the time, the waiting list as it should be.
//! Pure: no IO, no locks; the queue controller (`queue_controller.rs`) syncs what it returns
//! into the `queue` table, writing only the entries that really changed.
//!
//! An entry's state follows from its request: `waiting` while none of it was ever placed,
//! `pending-N` once it was let in (N copies not yet running and healthy), `claimed` when every
//! copy runs and passes its health checks, `expired` when it waited longer than its
//! `QueueTimeout` (the controller then stops the request; the entry stays, so that its owner
//! sees why). A request that is no longer asked for (stopped, or a bare task that ended)
//! leaves the list. Queue numbers are given once, in the order requests arrived, and kept.
//! Nothing here depends on how much room is free this instant (why a request waits is read
//! from its tasks when the list is shown), so the list changes only when a request does.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use cube_controller::marks::Marks;
use cube_types::job::{DEFAULT_PRIORITY, JobRecord, JobType};
use cube_types::queue::{Endpoint, QueueEntry, QueueState, RequestKind};
use cube_types::task::ANONYMOUS;
use cube_types::{State, Task};

use crate::jobs::{is_live, status_word, summarize};

/// What a request is, as submitted.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    Task(&'a Task),
    Job(&'a JobRecord),
}

/// One request and the tasks it has now.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub source: Source<'a>,
    /// A bare task: itself; a job: every task it owns.
    pub tasks: Vec<&'a Task>,
}

impl Request<'_> {
    fn kind(&self) -> RequestKind {
        match self.source {
            Source::Task(_) => RequestKind::Task,
            Source::Job(_) => RequestKind::Job,
        }
    }

    fn id(&self) -> String {
        match self.source {
            Source::Task(task) => task.id.to_string(),
            Source::Job(record) => record.job.key(),
        }
    }

    fn key(&self) -> String {
        self.kind().key(&self.id())
    }

    /// The project the request is in.
    pub fn project(&self) -> &str {
        match self.source {
            Source::Task(task) => &task.spec.project,
            Source::Job(record) => record.job.project(),
        }
    }

    /// When it was submitted: the order new entries are numbered in.
    fn submitted(&self) -> Option<DateTime<Utc>> {
        match self.source {
            Source::Task(task) => task.status.created_time,
            Source::Job(record) => record.submit_time,
        }
    }
}

/// Everything the transformer reads.
#[derive(Debug)]
pub struct QueueLook<'a> {
    pub requests: Vec<Request<'a>>,
    /// The entries as stored, by key.
    pub entries: &'a BTreeMap<String, Arc<QueueEntry>>,
    /// The highest queue number given so far.
    pub last_number: u64,
    pub now: DateTime<Utc>,
}

/// A request that waited past its `QueueTimeout`: the controller stops it.
#[derive(Debug, Clone, PartialEq)]
pub struct Expiry {
    pub kind: RequestKind,
    pub id: String,
    pub reason: String,
}

/// What the transformer decided.
#[derive(Debug, Default)]
pub struct QueuePlan {
    /// The waiting list as it should be, by key. An entry that did not change is the stored
    /// one itself (the same `Arc`), so that a look with nothing changed copies nothing.
    pub entries: BTreeMap<String, Arc<QueueEntry>>,
    /// Requests to stop because they expired.
    pub expire: Vec<Expiry>,
    /// The highest queue number given, new ones included.
    pub last_number: u64,
    /// When a `QueueTimeout` next runs out.
    pub look_again_at: Option<DateTime<Utc>>,
}

/// Whether a task was ever placed: it has a node, has been restarted, or left `Pending`.
fn was_placed(task: &Task) -> bool {
    !task.status.node_name.is_empty()
        || task.status.restart_count > 0
        || task.status.state != State::Pending
}

/// The request's settings that the waiting list shows: priority, owner, timeout, the job's
/// version, whether it is still asked for, and how many copies it wants.
struct Settings {
    priority: u8,
    owner: String,
    timeout: Option<std::time::Duration>,
    version: Option<u64>,
    live: bool,
    wanted: usize,
}

fn settings(request: &Request) -> Settings {
    let owner = |owner: &str| {
        if owner.is_empty() {
            ANONYMOUS.to_string()
        } else {
            owner.to_string()
        }
    };
    match request.source {
        Source::Task(task) => Settings {
            priority: task.spec.priority.unwrap_or(DEFAULT_PRIORITY),
            owner: owner(&task.spec.owner),
            timeout: task.spec.queue_timeout,
            version: None,
            live: is_live(task),
            wanted: 1,
        },
        Source::Job(record) => Settings {
            priority: record.job.priority,
            owner: owner(&record.job.owner),
            timeout: record.job.queue_timeout,
            version: Some(record.version),
            live: !record.stopped && !batch_finished(record, &request.tasks),
            wanted: record
                .job
                .groups
                .iter()
                .map(|group| group.count.unwrap_or(0) as usize)
                .sum(),
        },
    }
}

/// Whether a batch job is done with: none of its copies is still meant to run, and the job
/// reads `complete` (every copy finished its work) or `failed` (a copy gave up, and is not
/// created again). Its request is then no longer asked for and leaves the list, as a bare
/// task that ended does: it holds no room, and a finished job left `claimed` or `pending-N`
/// would count in the queue's depth for ever.
fn batch_finished(record: &JobRecord, tasks: &[&Task]) -> bool {
    if record.job.job_type != JobType::Batch || tasks.iter().any(|task| is_live(task)) {
        return false;
    }
    let summary = summarize(record, tasks);
    matches!(status_word(record, tasks, &summary), "complete" | "failed")
}

/// What was submitted, for the entry's `Request`: the task without what Cube observed of
/// it, or the job.
pub(crate) fn request_value(source: Source) -> serde_json::Value {
    let mut value = match source {
        Source::Task(task) => {
            let mut asked = task.clone();
            asked.clear_status(cube_types::Receiver::Manager);
            let mut value = serde_json::to_value(&asked).unwrap_or_default();
            // What Cube observes is not part of the request.
            if let Some(object) = value.as_object_mut() {
                for observed in [
                    "State",
                    "ContainerID",
                    "HostPorts",
                    "StartTime",
                    "FinishTime",
                    "ExitCode",
                    "Error",
                    "RestartCount",
                    "NodeName",
                    "DesiredState",
                ] {
                    object.remove(observed);
                }
            }
            value
        }
        Source::Job(record) => serde_json::to_value(&record.job).unwrap_or_default(),
    };
    drop_empty(&mut value);
    value
}

/// Removes what says nothing (`null`, `""`, `[]`) from an object, at every depth: a waiting
/// list of thousands of requests is read often, and most of a task's fields are left at
/// their defaults. (`{}` stays: in `ExposedPorts` it is a port.)
fn drop_empty(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Object(object) => {
            for child in object.values_mut() {
                drop_empty(child);
            }
            object.retain(|_, child| match child {
                Value::Null => false,
                Value::String(text) => !text.is_empty(),
                Value::Array(items) => !items.is_empty(),
                _ => true,
            });
        }
        Value::Array(items) => items.iter_mut().for_each(drop_empty),
        _ => {}
    }
}

/// Where each running, healthy copy of the request can be reached, by name.
pub fn endpoints(tasks: &[&Task], hosts: &BTreeMap<String, String>) -> Vec<Endpoint> {
    let mut endpoints: Vec<Endpoint> = tasks
        .iter()
        .filter(|task| task.spec.desired_state == State::Running && task.is_healthy())
        .map(|task| {
            let address = hosts
                .get(task.status.node_name.as_str())
                .cloned()
                .unwrap_or_default();
            endpoint(task, address)
        })
        .collect();
    endpoints.sort_by(|a, b| (&a.name, a.id).cmp(&(&b.name, b.id)));
    endpoints
}

/// Where one copy can be reached: its node's `address` (host), and each published port on
/// it (a port bound on every interface is reached at the node's host).
pub fn endpoint(task: &Task, address: String) -> Endpoint {
    let ports = task
        .status
        .run
        .host_ports
        .iter()
        .filter_map(|(port, bindings)| {
            let binding = bindings.first()?;
            let host = match binding.host_ip.as_str() {
                "" | "0.0.0.0" | "::" => address.as_str(),
                ip => ip,
            };
            Some((port.clone(), format!("{host}:{}", binding.host_port)))
        })
        .collect();
    Endpoint {
        id: task.id,
        name: task.name.clone(),
        node: task.status.node_name.to_string(),
        address,
        ports,
    }
}

/// Why a request waits, from its first waiting task: its `PendingReason`.
pub fn waiting_reason(tasks: &[&Task]) -> Option<String> {
    tasks
        .iter()
        .filter(|task| task.status.state == State::Pending && is_live(task))
        .find_map(|task| task.status.pending_reason.clone())
}

/// The waiting list as it should be (see the module comment).
pub fn plan(look: &QueueLook) -> QueuePlan {
    let mut out = QueuePlan {
        last_number: look.last_number,
        ..QueuePlan::default()
    };
    let mut unnumbered: Vec<(Option<DateTime<Utc>>, String)> = Vec::new();
    for request in &look.requests {
        let key = request.key();
        let stored = look.entries.get(&key);
        if let Some(entry) = entry_of(request, stored, look, &mut out) {
            if entry.queue == 0 {
                unnumbered.push((request.submitted(), key.clone()));
            }
            out.entries.insert(key, entry);
        }
    }
    // New requests get the next numbers, in the order they arrived.
    unnumbered.sort();
    for (_, key) in unnumbered {
        if let Some(entry) = out.entries.get_mut(&key) {
            out.last_number += 1;
            Arc::make_mut(entry).queue = out.last_number;
        }
    }
    out
}

/// One request's entry (`queue` 0: a new one, to be numbered), or none when it is no longer
/// asked for. Adds an expiry and the next timeout to `out` as they come.
fn entry_of(
    request: &Request,
    stored: Option<&Arc<QueueEntry>>,
    look: &QueueLook,
    out: &mut QueuePlan,
) -> Option<Arc<QueueEntry>> {
    let settings = settings(request);
    let live_tasks: Vec<&Task> = request
        .tasks
        .iter()
        .copied()
        .filter(|task| is_live(task))
        .collect();
    let mut stored = stored;
    if let Some(entry) = stored
        && entry.state == QueueState::Expired
    {
        let submitted_again = settings.live && settings.version > entry.version;
        if !submitted_again {
            // Still asked for and never placed: the stop may not have happened yet.
            if settings.live && !live_tasks.iter().any(|task| was_placed(task)) {
                out.expire.push(Expiry {
                    kind: request.kind(),
                    id: request.id(),
                    reason: entry.reason.clone(),
                });
            }
            return Some(Arc::clone(entry));
        }
        stored = None; // a new request under the same name
    }
    if !settings.live {
        return None;
    }
    let admitted = stored.is_some_and(|entry| entry.state.is_admitted())
        || live_tasks.iter().any(|task| was_placed(task));
    let since = stored
        .and_then(|entry| entry.since)
        .or(request.submitted())
        .unwrap_or(look.now);
    let mut reason = String::new();
    let state = if !admitted {
        match settings.timeout {
            Some(timeout) if look.now >= since + timeout => {
                let why = waiting_reason(&request.tasks)
                    .map(|why| format!(": {why}"))
                    .unwrap_or_default();
                reason = format!(
                    "waited {} in the queue (QueueTimeout) without room{why}",
                    cube_types::duration::format_duration(timeout)
                );
                out.expire.push(Expiry {
                    kind: request.kind(),
                    id: request.id(),
                    reason: reason.clone(),
                });
                QueueState::Expired
            }
            Some(timeout) => {
                let at = since + timeout;
                out.look_again_at = Some(out.look_again_at.map_or(at, |known| known.min(at)));
                QueueState::Waiting
            }
            None => QueueState::Waiting,
        }
    } else {
        let batch =
            matches!(request.source, Source::Job(record) if record.job.job_type == JobType::Batch);
        let ready = request
            .tasks
            .iter()
            .filter(|task| task.spec.desired_state == State::Running)
            .filter(|task| task.is_healthy() || (batch && task.status.state == State::Completed))
            .count();
        match settings.wanted.saturating_sub(ready) {
            0 => QueueState::Claimed,
            left => QueueState::Pending(left as u32),
        }
    };
    // Nothing changed: the stored entry itself (a look with nothing changed copies nothing).
    if let Some(entry) = stored
        && entry.priority == settings.priority
        && entry.owner == settings.owner
        && entry.project() == request.project()
        && entry.state == state
        && entry.since == Some(since)
        && entry.version == settings.version
        && entry.reason == reason
        && entry.services.is_empty()
    // stored before addresses were read when shown
    {
        return Some(Arc::clone(entry));
    }
    // The request as submitted is kept only in an expired entry (see `QueueEntry::request`).
    let value = match stored {
        _ if state != QueueState::Expired => serde_json::Value::Null,
        Some(entry) if entry.version == settings.version && !entry.request.is_null() => {
            entry.request.clone()
        }
        _ => request_value(request.source),
    };
    Some(Arc::new(QueueEntry {
        id: request.id(),
        kind: request.kind(),
        queue: stored.map_or(0, |entry| entry.queue),
        priority: settings.priority,
        owner: settings.owner,
        project: request.project().to_string(),
        state,
        since: Some(since),
        version: settings.version,
        request: value,
        reason,
        // Where a claimed request's copies answer is read from its tasks when the entry is
        // shown ([`endpoints`]), never stored: an address in 100,000 entries would weigh as
        // much as the tasks, and a copy's health or port would rewrite its entry.
        services: Vec::new(),
    }))
}

/// The entries in the order of the queue (higher priority first, then the lower number),
/// each with its position among those that wait (1 = next; 0 for the others).
pub fn in_order(entries: &BTreeMap<String, Arc<QueueEntry>>) -> Vec<(Arc<QueueEntry>, usize)> {
    let mut ordered: Vec<Arc<QueueEntry>> = entries.values().cloned().collect();
    ordered.sort_by_key(|entry| entry.order());
    let mut position = 0;
    ordered
        .into_iter()
        .map(|entry| {
            let at = if entry.state == QueueState::Waiting {
                position += 1;
                position
            } else {
                0
            };
            (entry, at)
        })
        .collect()
}

/// The requests whose entry the queue controller must look at again, by key (`task/<id>`,
/// `job/<name>`): marked wherever a task or a job changes in the manager's state, taken by
/// the next look. Kept under the manager's lock, with the state it describes.
///
/// A waiting entry also changes with nothing marked, when its `QueueTimeout` runs out: the
/// earliest such time a look found is kept, and the look at or after it reads every waiting
/// request again. Between those, a waiting request is read only when it is marked.
#[derive(Debug)]
pub(crate) struct QueueDirty {
    marks: Marks<String>,
    /// When the first waiting request's `QueueTimeout` runs out, of those looked at.
    timeout_due: Option<DateTime<Utc>>,
}

impl QueueDirty {
    /// Every request to look at: a manager that starts.
    pub(crate) fn everything() -> QueueDirty {
        QueueDirty {
            marks: Marks::everything(),
            timeout_due: None,
        }
    }

    /// The key of the request a task belongs to: itself, or its job.
    pub(crate) fn key_of(task: &Task) -> String {
        if task.spec.job.is_empty() {
            RequestKind::Task.key(&task.id.to_string())
        } else {
            RequestKind::Job.key(&task.spec.job)
        }
    }

    /// The request of a task that changed (or was forgotten).
    pub(crate) fn mark_task(&mut self, task: &Task) {
        if !self.marks.is_everything() {
            self.marks.mark(QueueDirty::key_of(task));
        }
    }

    /// A request by its entry's key (`task/<id>`, `job/<name>`).
    pub(crate) fn mark_key(&mut self, key: &str) {
        if !self.marks.is_everything() {
            self.marks.mark(key.to_string());
        }
    }

    /// A job that changed (or was removed).
    pub(crate) fn mark_job(&mut self, name: &str) {
        if !self.marks.is_everything() {
            self.marks.mark(RequestKind::Job.key(name));
        }
    }

    /// What is marked, for the queue controller's tests.
    #[cfg(test)]
    pub(crate) fn marks(&self) -> &Marks<String> {
        &self.marks
    }

    pub(crate) fn mark_everything(&mut self) {
        self.marks.mark_everything();
    }

    /// What the next look reads: `None` for every request, else the keys marked; and
    /// whether it reads every waiting request too (a timeout is due at `now`).
    pub(crate) fn take(&mut self, now: DateTime<Utc>) -> (Option<BTreeSet<String>>, bool) {
        let due = self.timeout_due.is_some_and(|at| at <= now);
        (self.marks.take(), due)
    }

    /// Keeps when the next timeout runs out, from a look's plan: `all_waiting` when the look
    /// read every waiting request (then its plan knows every timeout), else the earlier of
    /// what was kept and what the look found. Returns it.
    pub(crate) fn keep_timeout(
        &mut self,
        found: Option<DateTime<Utc>>,
        all_waiting: bool,
    ) -> Option<DateTime<Utc>> {
        self.timeout_due = match (all_waiting, self.timeout_due, found) {
            (true, _, found) => found,
            (false, Some(kept), Some(found)) => Some(kept.min(found)),
            (false, kept, found) => kept.or(found),
        };
        self.timeout_due
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use cube_types::Health;

    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + seconds, 0).unwrap()
    }

    fn bare(name: &str, created: i64) -> Task {
        let mut task = Task::new(name, "cube-sample:latest");
        task.status.created_time = Some(at(created));
        task
    }

    fn running(mut task: Task, node: &str) -> Task {
        task.status.state = State::Running;
        task.status.node_name = node.into();
        task.status.run.health = None;
        task.status.run.host_ports.insert(
            "7777/tcp".to_string(),
            vec![cube_types::HostBinding {
                host_ip: "0.0.0.0".to_string(),
                host_port: "49153".to_string(),
            }],
        );
        task
    }

    fn look<'a>(
        requests: Vec<Request<'a>>,
        entries: &'a BTreeMap<String, Arc<QueueEntry>>,
        now: i64,
    ) -> QueueLook<'a> {
        QueueLook {
            requests,
            entries,
            last_number: 0,
            now: at(now),
        }
    }

    fn of(task: &Task) -> Request<'_> {
        Request {
            source: Source::Task(task),
            tasks: vec![task],
        }
    }

    fn stored(plan: &QueuePlan) -> BTreeMap<String, Arc<QueueEntry>> {
        plan.entries.clone()
    }

    #[test]
    fn new_requests_are_numbered_in_the_order_they_came_and_wait() {
        let (first, second) = (bare("a", 2), bare("b", 1));
        let none = BTreeMap::new();
        let plan = plan(&look(vec![of(&first), of(&second)], &none, 5));
        let a = &plan.entries[&RequestKind::Task.key(&first.id.to_string())];
        let b = &plan.entries[&RequestKind::Task.key(&second.id.to_string())];
        assert_eq!((b.queue, a.queue), (1, 2), "b came first");
        assert_eq!(a.state, QueueState::Waiting);
        assert_eq!(a.owner, "anonymous");
        assert_eq!(plan.last_number, 2);
    }

    #[test]
    fn a_request_looked_at_again_with_nothing_changed_is_the_same_entry() {
        let task = bare("a", 0);
        let none = BTreeMap::new();
        let first = plan(&look(vec![of(&task)], &none, 1));
        let kept = stored(&first);
        let mut again_look = look(vec![of(&task)], &kept, 30);
        again_look.last_number = first.last_number;
        let again = plan(&again_look);
        assert_eq!(again.entries, first.entries, "no change, nothing to write");
        assert_eq!(again.last_number, first.last_number);
    }

    #[test]
    fn a_placed_request_is_pending_until_healthy_then_claimed_with_its_addresses() {
        let hosts = BTreeMap::from([("w1".to_string(), "10.0.0.2".to_string())]);
        let none = BTreeMap::new();
        let mut task = running(bare("web", 0), "w1");
        task.spec.health_check = "/health".to_string();
        task.status.run.health = Some(Health::Starting);
        let pending = plan(&look(vec![of(&task)], &none, 1));
        let entry = pending.entries.values().next().unwrap();
        assert_eq!(entry.state, QueueState::Pending(1));
        assert!(entry.services.is_empty());
        task.status.run.health = Some(Health::Healthy);
        let claimed = plan(&look(vec![of(&task)], &none, 2));
        let entry = claimed.entries.values().next().unwrap();
        assert_eq!(entry.state, QueueState::Claimed);
        assert!(
            entry.services.is_empty(),
            "addresses are read when shown, not stored"
        );
        let shown = endpoints(&[&task], &hosts);
        assert_eq!(shown.len(), 1);
        assert_eq!(shown[0].ports["7777/tcp"], "10.0.0.2:49153");
    }

    #[test]
    fn a_request_that_waits_past_its_timeout_expires_and_is_stopped() {
        let mut task = bare("slow", 0);
        task.spec.queue_timeout = Some(Duration::from_secs(30));
        task.status.pending_reason = Some("needs 2.0 GiB memory".to_string());
        let none = BTreeMap::new();
        let waiting = plan(&look(vec![of(&task)], &none, 10));
        assert_eq!(waiting.look_again_at, Some(at(30)));
        assert!(waiting.expire.is_empty());
        let expired = plan(&look(vec![of(&task)], &none, 30));
        let entry = expired.entries.values().next().unwrap();
        assert_eq!(entry.state, QueueState::Expired);
        assert!(
            entry.reason.contains("needs 2.0 GiB memory"),
            "{}",
            entry.reason
        );
        assert_eq!(expired.expire.len(), 1);
        // Once stopped, the entry stays expired, and nothing more is stopped.
        task.spec.desired_state = State::Completed;
        let kept = stored(&expired);
        let after = plan(&look(vec![of(&task)], &kept, 40));
        assert_eq!(
            after.entries.values().next().unwrap().state,
            QueueState::Expired
        );
        assert!(after.expire.is_empty());
    }

    #[test]
    fn a_stopped_request_leaves_the_list() {
        let mut task = bare("gone", 0);
        let none = BTreeMap::new();
        task.spec.desired_state = State::Completed;
        assert!(plan(&look(vec![of(&task)], &none, 1)).entries.is_empty());
    }

    fn batch_job(count: u32) -> JobRecord {
        use cube_types::job::{Group, Job};
        JobRecord {
            job: Job {
                name: "crunch".into(),
                job_type: JobType::Batch,
                priority: 50,
                constraints: Vec::new(),
                owner: String::new(),
                project: String::new(),
                queue_timeout: None,
                groups: vec![Group {
                    name: "work".into(),
                    count: Some(count),
                    constraints: Vec::new(),
                    task: Task::new("", "cube-sample:latest"),
                    update: None,
                }],
            },
            version: 1,
            submit_time: Some(at(0)),
            stopped: false,
            promoted: false,
            revert_of: None,
        }
    }

    /// A copy of the batch job that ran on `w1` and ended in `state` for good.
    fn ended_copy(record: &JobRecord, index: u32, state: State) -> Task {
        let mut task = crate::jobs::copy_of(record, 0, index, None);
        task.status.created_time = Some(at(1));
        task.status.node_name = "w1".into();
        task.status.state = state;
        task
    }

    #[test]
    fn a_finished_batch_job_leaves_the_list_whether_it_completed_or_failed() {
        let job = batch_job(2);
        let both_running = [
            running(ended_copy(&job, 0, State::Running), "w1"),
            running(ended_copy(&job, 1, State::Running), "w1"),
        ];
        let none = BTreeMap::new();
        fn request<'a>(
            job: &'a JobRecord,
            tasks: &'a [Task],
            entries: &'a BTreeMap<String, Arc<QueueEntry>>,
        ) -> QueueLook<'a> {
            QueueLook {
                requests: vec![Request {
                    source: Source::Job(job),
                    tasks: tasks.iter().collect(),
                }],
                entries,
                last_number: 0,
                now: at(5),
            }
        }
        let while_running = plan(&request(&job, &both_running, &none));
        assert_eq!(
            while_running.entries.values().next().unwrap().state,
            QueueState::Claimed,
            "every copy runs"
        );
        let kept = stored(&while_running);
        for end in [State::Completed, State::Failed] {
            let ended = [ended_copy(&job, 0, end), ended_copy(&job, 1, end)];
            let after = plan(&request(&job, &ended, &kept));
            assert!(
                after.entries.is_empty(),
                "a batch job whose copies all {end} is still listed: {:?}",
                after.entries
            );
        }
        // One copy gave up while the other still runs: the job is listed until it ends.
        let half = [
            ended_copy(&job, 0, State::Failed),
            running(ended_copy(&job, 1, State::Running), "w1"),
        ];
        assert_eq!(plan(&request(&job, &half, &none)).entries.len(), 1);
    }

    #[test]
    fn positions_count_the_waiting_in_priority_then_number_order() {
        let entry = |id: &str, queue: u64, priority: u8, state: QueueState| QueueEntry {
            id: id.to_string(),
            kind: RequestKind::Task,
            queue,
            priority,
            owner: ANONYMOUS.to_string(),
            project: String::new(),
            state,
            since: None,
            version: None,
            request: serde_json::Value::Null,
            reason: String::new(),
            services: Vec::new(),
        };
        let entries: BTreeMap<String, Arc<QueueEntry>> = [
            entry("a", 1, 50, QueueState::Claimed),
            entry("b", 2, 50, QueueState::Waiting),
            entry("c", 3, 90, QueueState::Waiting),
            entry("d", 4, 50, QueueState::Waiting),
        ]
        .into_iter()
        .map(|entry| (entry.key(), Arc::new(entry)))
        .collect();
        let order: Vec<(String, usize)> = in_order(&entries)
            .into_iter()
            .map(|(entry, position)| (entry.id.clone(), position))
            .collect();
        assert_eq!(
            order,
            [
                ("c".to_string(), 1),
                ("a".to_string(), 0),
                ("b".to_string(), 2),
                ("d".to_string(), 3)
            ]
        );
    }
}
