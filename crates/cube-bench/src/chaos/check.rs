//! The chaos run's checker: what the clients asked and were answered (the history), what the
//! cluster shows once faults have stopped and it has settled, and the invariants that must
//! hold between the two. Pure: no processes, no clocks, no network; a recorded history can be
//! checked again (`cube-bench chaos-check FILE`), and a test can plant a violation in one.
//!
//! Times are microseconds since the run began, by the driver's clock; the cluster's own times
//! (when a task was first placed) are converted to the same scale by the driver, on the same
//! machine.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use cube_types::state::State;
use cube_types::task::RestartPolicy;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A whole run: its seed, every client operation in the order they began, and the settled
/// cluster.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct History {
    pub seed: u64,
    pub ops: Vec<Op>,
    pub settled: Settled,
    /// Every time a process ended that the run did not kill.
    #[serde(default)]
    pub exits: Vec<Exit>,
}

/// A process that ended on its own. `expected` when its disk was full: a worker that cannot
/// write its store stops, by design, and is started again as a supervisor would.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Exit {
    pub process: String,
    pub at_us: u64,
    pub status: String,
    pub expected: bool,
}

/// One client operation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Op {
    /// The operation's number in the run, for the report.
    pub seq: u64,
    pub start_us: u64,
    pub end_us: u64,
    pub request: Request,
    pub outcome: Outcome,
}

/// What a client asked. Names are the driver's and unique in a run, so that an operation and
/// what it made can be matched without the answer (which an unknown outcome lacks).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    /// A bare task; `priority` set makes it a waiting-list request of that priority.
    Task {
        name: String,
        restart_policy: RestartPolicy,
        max_restarts: Option<u32>,
        priority: Option<u8>,
        cpu: f64,
        memory: u64,
    },
    StopTask {
        name: String,
    },
    /// `cube restart`: an ended task run again, one restart more than its policy made.
    RestartTask {
        name: String,
    },
    /// A job submitted (created or changed). `mark` is a value the driver puts in every
    /// copy's environment (`CHAOS_MARK`), so that a copy shows which submission it is of.
    Job {
        name: String,
        kind: JobKind,
        mark: String,
        counts: BTreeMap<String, u32>,
    },
    Scale {
        job: String,
        group: String,
        count: u32,
    },
    StopJob {
        name: String,
    },
    /// `cube job promote`: a canary deployment let go on. Changes no goal: the run promotes
    /// every waiting deployment as it settles.
    Promote {
        job: String,
    },
    /// `cube node drain NODE` (with a deadline), and `cube node eligibility NODE --enable`
    /// after it; every node is eligible again as the run settles.
    Drain {
        node: String,
    },
    Eligible {
        node: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobKind {
    Service,
    Batch,
    System,
}

/// What came back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Outcome {
    /// A 2xx answer: the operation happened, and must not be lost.
    Acked { id: Option<Uuid> },
    /// A 4xx or 5xx answer: the operation did not happen.
    Refused { status: u16, message: String },
    /// No answer (the connection broke, the manager died, a timeout): it may or may not have
    /// happened, once.
    Unknown { error: String },
}

/// The cluster once it has settled.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Settled {
    pub tasks: Vec<SettledTask>,
    pub jobs: Vec<SettledJob>,
    /// The containers of the nodes named in `container_nodes` (real workers on Docker).
    pub containers: Vec<SettledContainer>,
    pub container_nodes: BTreeSet<String>,
    /// What each worker said it held, sampled through the run.
    pub capacity: Vec<CapacitySample>,
}

/// A task as the manager shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SettledTask {
    pub id: Uuid,
    pub name: String,
    /// The job and group of a job's copy; empty for a bare task.
    pub job: String,
    pub group: String,
    pub index: Option<u32>,
    pub state: State,
    pub desired_state: State,
    pub node: String,
    pub restart_count: u32,
    pub restart_policy: RestartPolicy,
    pub max_restarts: Option<u32>,
    /// The `CHAOS_MARK` in its environment, if any.
    pub mark: Option<String>,
    /// When it was first placed on a node (its admission), in the run's microseconds.
    pub first_placed_us: Option<u64>,
    /// Why it waits, when it waits.
    #[serde(default)]
    pub pending_reason: Option<String>,
    /// Its project (empty: `default`).
    #[serde(default)]
    pub project: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SettledJob {
    pub name: String,
    /// Its project (empty: `default`).
    #[serde(default)]
    pub project: String,
    pub stopped: bool,
}

/// A container on a node, as Docker shows it, with the task its labels name.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SettledContainer {
    pub node: String,
    pub name: String,
    pub running: bool,
    pub task: Option<Uuid>,
    /// Its part in the task: the service's name in a pod, empty for a single container.
    pub role: String,
}

/// A worker's own view, at one moment, of what it holds and what it has.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CapacitySample {
    pub node: String,
    pub at_us: u64,
    pub cpu_used: f64,
    pub cpu_total: f64,
    pub memory_used: u64,
    pub memory_total: u64,
}

/// One broken invariant: which, what was seen, and the operations behind it.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    pub invariant: Invariant,
    pub message: String,
    pub ops: Vec<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Invariant {
    /// Every acknowledged task and job exists exactly once.
    AckedExistsOnce,
    /// An operation with no answer made at most one; a refused one made none.
    UnackedAtMostOnce,
    /// Each running task has exactly one container (per part) cluster-wide.
    OneContainerPerRun,
    /// No container runs that no running task owns.
    NoOrphanContainer,
    /// Every job converged to its last accepted submission and counts.
    JobConverged,
    /// No node was given more than it has.
    WithinCapacity,
    /// The waiting list let requests in in order within each priority.
    QueueOrder,
    /// No task restarted more than its policy allows.
    RestartPolicyHeld,
    /// No process ended but by the run's own faults (a kill, a full disk).
    NoCrash,
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Invariant::AckedExistsOnce => "an acknowledged write exists exactly once",
            Invariant::UnackedAtMostOnce => "an unanswered write made at most one, a refused none",
            Invariant::OneContainerPerRun => "one container per running task",
            Invariant::NoOrphanContainer => "no container without a running task",
            Invariant::JobConverged => "every job converged to its last accepted version",
            Invariant::WithinCapacity => "no node over its capacity",
            Invariant::QueueOrder => "the waiting list in order within a priority",
            Invariant::RestartPolicyHeld => "no more restarts than the policy allows",
            Invariant::NoCrash => "no process ended but by a fault",
        })
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.invariant, self.message)?;
        if !self.ops.is_empty() {
            let ops: Vec<String> = self.ops.iter().map(|seq| format!("#{seq}")).collect();
            write!(f, " (operations {})", ops.join(", "))?;
        }
        Ok(())
    }
}

/// Every invariant over a history; empty when the run held.
pub fn check(history: &History) -> Vec<Violation> {
    let mut found = Vec::new();
    exists_once(history, &mut found);
    one_container_per_run(&history.settled, &mut found);
    job_converged(history, &mut found);
    within_capacity(&history.settled, &mut found);
    queue_order(history, &mut found);
    restarts_within_policy(history, &mut found);
    no_crash(history, &mut found);
    found.sort_by_key(|violation| violation.invariant);
    found
}

fn violation(invariant: Invariant, message: String, ops: Vec<u64>) -> Violation {
    Violation {
        invariant,
        message,
        ops,
    }
}

fn tasks_named(settled: &Settled) -> BTreeMap<&str, Vec<&SettledTask>> {
    let mut named: BTreeMap<&str, Vec<&SettledTask>> = BTreeMap::new();
    for task in settled.tasks.iter().filter(|task| task.job.is_empty()) {
        named.entry(task.name.as_str()).or_default().push(task);
    }
    named
}

fn exists_once(history: &History, found: &mut Vec<Violation>) {
    let named = tasks_named(&history.settled);
    let jobs: BTreeSet<&str> = history
        .settled
        .jobs
        .iter()
        .map(|job| job.name.as_str())
        .collect();
    // A job is acknowledged once any submission of it was; later refusals change nothing.
    let mut job_outcomes: BTreeMap<&str, (bool, Vec<u64>)> = BTreeMap::new();
    for op in &history.ops {
        match &op.request {
            Request::Task { name, .. } => {
                let made = named.get(name.as_str()).map_or(0, Vec::len);
                match &op.outcome {
                    Outcome::Acked { id } => {
                        let same_id = id.is_none_or(|id| {
                            named
                                .get(name.as_str())
                                .is_some_and(|tasks| tasks.iter().any(|task| task.id == id))
                        });
                        if made != 1 || !same_id {
                            found.push(violation(
                                Invariant::AckedExistsOnce,
                                format!(
                                    "task {name} was acknowledged{} and the cluster holds {made} of it{}",
                                    id.map(|id| format!(" as {id}")).unwrap_or_default(),
                                    if made == 1 && !same_id { ", under another ID" } else { "" }
                                ),
                                vec![op.seq],
                            ));
                        }
                    }
                    Outcome::Unknown { .. } if made > 1 => found.push(violation(
                        Invariant::UnackedAtMostOnce,
                        format!("task {name} had no answer and the cluster holds {made} of it"),
                        vec![op.seq],
                    )),
                    Outcome::Refused { status, .. } if made > 0 => found.push(violation(
                        Invariant::UnackedAtMostOnce,
                        format!(
                            "task {name} was refused ({status}) and the cluster holds {made} of it"
                        ),
                        vec![op.seq],
                    )),
                    _ => {}
                }
            }
            Request::Job { name, .. } => {
                let entry = job_outcomes.entry(name.as_str()).or_default();
                entry.0 |= matches!(op.outcome, Outcome::Acked { .. });
                entry.1.push(op.seq);
            }
            _ => {}
        }
    }
    for (name, (acked, ops)) in job_outcomes {
        if acked && !jobs.contains(name) {
            found.push(violation(
                Invariant::AckedExistsOnce,
                format!("job {name} was acknowledged and the cluster does not hold it"),
                ops,
            ));
        }
    }
    let mut job_counts: BTreeMap<&str, usize> = BTreeMap::new();
    for job in &history.settled.jobs {
        *job_counts.entry(job.name.as_str()).or_default() += 1;
    }
    for (name, count) in job_counts.into_iter().filter(|(_, count)| *count > 1) {
        found.push(violation(
            Invariant::AckedExistsOnce,
            format!("job {name} is held {count} times"),
            Vec::new(),
        ));
    }
}

fn one_container_per_run(settled: &Settled, found: &mut Vec<Violation>) {
    let tasks: BTreeMap<Uuid, &SettledTask> =
        settled.tasks.iter().map(|task| (task.id, task)).collect();
    let mut running: BTreeMap<(Uuid, &str), Vec<&SettledContainer>> = BTreeMap::new();
    for container in settled.containers.iter().filter(|c| c.running) {
        let owner = container.task.and_then(|id| tasks.get(&id));
        match owner {
            Some(task) if task.state == State::Running => {
                running
                    .entry((task.id, container.role.as_str()))
                    .or_default()
                    .push(container);
            }
            Some(task) => found.push(violation(
                Invariant::NoOrphanContainer,
                format!(
                    "container {} runs on {} for task {} ({}), which is {}",
                    container.name, container.node, task.name, task.id, task.state
                ),
                Vec::new(),
            )),
            None => found.push(violation(
                Invariant::NoOrphanContainer,
                format!(
                    "container {} runs on {} and no task owns it{}",
                    container.name,
                    container.node,
                    container
                        .task
                        .map(|id| format!(" (its labels name {id})"))
                        .unwrap_or_default()
                ),
                Vec::new(),
            )),
        }
    }
    for ((id, role), containers) in &running {
        if containers.len() > 1 {
            let names: Vec<String> = containers
                .iter()
                .map(|c| format!("{} on {}", c.name, c.node))
                .collect();
            let part = if role.is_empty() {
                String::new()
            } else {
                format!(" (part {role})")
            };
            found.push(violation(
                Invariant::OneContainerPerRun,
                format!(
                    "task {id}{part} runs in {} containers: {}",
                    containers.len(),
                    names.join(", ")
                ),
                Vec::new(),
            ));
        }
    }
    // A running task on a node whose containers were looked at has at least one.
    for task in settled
        .tasks
        .iter()
        .filter(|task| task.state == State::Running && settled.container_nodes.contains(&task.node))
    {
        if !running.keys().any(|(id, _)| *id == task.id) {
            found.push(violation(
                Invariant::OneContainerPerRun,
                format!(
                    "task {} ({}) is Running on {} and no container runs for it",
                    task.name, task.id, task.node
                ),
                Vec::new(),
            ));
        }
    }
}

/// What a job should be once every operation on it is done: its submission's mark, each
/// group's count, and whether it was stopped.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct JobGoal {
    mark: String,
    kind: JobKindOrd,
    counts: BTreeMap<String, u32>,
    stopped: bool,
}

/// `JobKind`, ordered so that goals can be kept in a set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum JobKindOrd {
    Service,
    Batch,
    System,
}

impl From<JobKind> for JobKindOrd {
    fn from(kind: JobKind) -> Self {
        match kind {
            JobKind::Service => JobKindOrd::Service,
            JobKind::Batch => JobKindOrd::Batch,
            JobKind::System => JobKindOrd::System,
        }
    }
}

/// The goals a job may have reached: operations on one job are sent one at a time, so an
/// acknowledged one applies to every goal still possible, a refused one to none, and one with
/// no answer to some and not to others.
fn job_goals(history: &History) -> BTreeMap<&str, (BTreeSet<JobGoal>, Vec<u64>)> {
    /// What one operation does to a goal the job may have reached before it.
    type Step<'a> = Box<dyn Fn(Option<&JobGoal>) -> Option<JobGoal> + 'a>;
    let mut goals: BTreeMap<&str, (BTreeSet<JobGoal>, Vec<u64>)> = BTreeMap::new();
    for op in &history.ops {
        let (name, apply): (&str, Step) = match &op.request {
            Request::Job {
                name,
                kind,
                mark,
                counts,
            } => (
                name,
                Box::new(|_: Option<&JobGoal>| {
                    Some(JobGoal {
                        mark: mark.clone(),
                        kind: (*kind).into(),
                        counts: counts.clone(),
                        stopped: false,
                    })
                }),
            ),
            Request::Scale { job, group, count } => (
                job,
                Box::new(|goal: Option<&JobGoal>| {
                    let mut goal = goal?.clone();
                    // A scale of a stopped job or of a group it lacks is refused.
                    if goal.stopped || !goal.counts.contains_key(group) {
                        return Some(goal);
                    }
                    goal.counts.insert(group.clone(), *count);
                    Some(goal)
                }),
            ),
            Request::StopJob { name } => (
                name,
                Box::new(|goal: Option<&JobGoal>| {
                    let mut goal = goal?.clone();
                    goal.stopped = true;
                    Some(goal)
                }),
            ),
            _ => continue,
        };
        if matches!(op.outcome, Outcome::Refused { .. }) {
            continue;
        }
        let entry = goals.entry(name).or_default();
        entry.1.push(op.seq);
        let before: Vec<Option<JobGoal>> = if entry.0.is_empty() {
            vec![None]
        } else {
            entry.0.iter().cloned().map(Some).collect()
        };
        let after: BTreeSet<JobGoal> = before
            .iter()
            .filter_map(|goal| apply(goal.as_ref()))
            .collect();
        match op.outcome {
            Outcome::Acked { .. } => entry.0 = after,
            _ => entry.0.extend(after),
        }
    }
    goals
}

fn job_converged(history: &History, found: &mut Vec<Violation>) {
    let settled = &history.settled;
    for (name, (goals, ops)) in job_goals(history) {
        let copies: Vec<&SettledTask> = settled
            .tasks
            .iter()
            .filter(|task| task.job == name)
            .collect();
        let mut reasons = Vec::new();
        let reached = goals.iter().any(|goal| {
            let outcome = goal_reached(goal, &copies, &settled.container_nodes);
            if let Err(reason) = &outcome {
                reasons.push(reason.clone());
            }
            outcome.is_ok()
        });
        // A job whose only submissions had no answer may not exist at all.
        let may_be_absent = !history.ops.iter().any(|op| {
            matches!(&op.request, Request::Job { name: job, .. } if job == name)
                && matches!(op.outcome, Outcome::Acked { .. })
        }) && copies.is_empty();
        if !reached && !goals.is_empty() && !may_be_absent {
            found.push(violation(
                Invariant::JobConverged,
                format!("job {name}: {}", reasons.join("; or ")),
                ops,
            ));
        }
    }
}

/// Whether a job's copies are what `goal` asks: a stopped job has none running; a service has
/// `count` running copies of the goal's mark per group, at distinct indexes; a batch job
/// `count` completed ones; a system job one on each of `nodes` (every node is eligible once
/// the run has settled) and at most one on any node, each of the goal's mark.
fn goal_reached(
    goal: &JobGoal,
    copies: &[&SettledTask],
    nodes: &BTreeSet<String>,
) -> Result<(), String> {
    let live = |task: &SettledTask| task.state == State::Running;
    if goal.stopped {
        let running = copies.iter().filter(|task| live(task)).count();
        return if running == 0 {
            Ok(())
        } else {
            Err(format!("stopped, yet {running} copies run"))
        };
    }
    for (group, count) in &goal.counts {
        let in_group: Vec<&SettledTask> = copies
            .iter()
            .copied()
            .filter(|t| &t.group == group)
            .collect();
        let stale = in_group
            .iter()
            .filter(|task| live(task) && task.mark.as_deref() != Some(goal.mark.as_str()))
            .count();
        if stale > 0 {
            return Err(format!(
                "group {group} has {stale} running copies not of submission {}",
                goal.mark
            ));
        }
        match goal.kind {
            JobKindOrd::Service => {
                let running: Vec<&&SettledTask> =
                    in_group.iter().filter(|task| live(task)).collect();
                let indexes: BTreeSet<Option<u32>> = running.iter().map(|t| t.index).collect();
                if running.len() != *count as usize || indexes.len() != running.len() {
                    return Err(format!(
                        "group {group} wants {count} copies and {} run at {} indexes{}",
                        running.len(),
                        indexes.len(),
                        waiting_because(&in_group)
                    ));
                }
            }
            // A batch copy may run twice when its node was lost while it ran (it is replaced,
            // and the lost run may still finish): each index completed once at least.
            JobKindOrd::Batch => {
                let done: BTreeSet<Option<u32>> = in_group
                    .iter()
                    .filter(|task| {
                        task.state == State::Completed
                            && task.mark.as_deref() == Some(goal.mark.as_str())
                    })
                    .map(|task| task.index)
                    .collect();
                if done.len() != *count as usize {
                    return Err(format!(
                        "group {group} wants {count} indexes completed and {} are{}",
                        done.len(),
                        waiting_because(&in_group)
                    ));
                }
            }
            JobKindOrd::System => {
                let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
                for task in in_group.iter().filter(|task| live(task)) {
                    *per_node.entry(task.node.as_str()).or_default() += 1;
                }
                if let Some((node, n)) = per_node.iter().find(|(_, n)| **n > 1) {
                    return Err(format!("group {group} runs {n} copies on node {node}"));
                }
                let missing: Vec<&str> = nodes
                    .iter()
                    .map(String::as_str)
                    .filter(|node| !per_node.contains_key(node))
                    .collect();
                if !missing.is_empty() {
                    return Err(format!(
                        "group {group} runs no copy on node {}{}",
                        missing.join(", "),
                        waiting_because(&in_group)
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The copies that wait, and why the first of them does, for a message.
fn waiting_because(copies: &[&SettledTask]) -> String {
    let waiting: Vec<&&SettledTask> = copies
        .iter()
        .filter(|task| task.state == State::Pending && task.desired_state == State::Running)
        .collect();
    match waiting.first() {
        None => String::new(),
        Some(first) => format!(
            " ({} waiting: {})",
            waiting.len(),
            first.pending_reason.as_deref().unwrap_or("no reason given")
        ),
    }
}

fn no_crash(history: &History, found: &mut Vec<Violation>) {
    for exit in history.exits.iter().filter(|exit| !exit.expected) {
        found.push(violation(
            Invariant::NoCrash,
            format!(
                "{} ended on its own ({}) at {} µs",
                exit.process, exit.status, exit.at_us
            ),
            Vec::new(),
        ));
    }
}

fn within_capacity(settled: &Settled, found: &mut Vec<Violation>) {
    // Floating sums of fractions of a core may differ from the total in the last bits.
    const CPU_SLACK: f64 = 1e-6;
    for sample in &settled.capacity {
        if sample.cpu_used > sample.cpu_total + CPU_SLACK
            || sample.memory_used > sample.memory_total
        {
            found.push(violation(
                Invariant::WithinCapacity,
                format!(
                    "node {} at {} µs held {} of {} cores and {} of {} bytes",
                    sample.node,
                    sample.at_us,
                    sample.cpu_used,
                    sample.cpu_total,
                    sample.memory_used,
                    sample.memory_total
                ),
                Vec::new(),
            ));
        }
    }
}

fn queue_order(history: &History, found: &mut Vec<Violation>) {
    let named = tasks_named(&history.settled);
    // Acknowledged waiting-list requests, by project, priority and shape: only requests of
    // one shape compete for the same room, so only they must be let in in order; and with
    // managers acting for their own shards, the order holds within a project (across the
    // projects of one owner too, but several owners place each their own).
    type Shape<'a> = (&'a str, u8, u64, u64);
    // `cube restart` puts a request that ended (one expired in the list) back at the end of
    // its line, under its old name and ID: it is ordered from then on, which the history's
    // first placement cannot tell, so a restarted request is left out.
    let restarted: BTreeSet<&str> = history
        .ops
        .iter()
        .filter_map(|op| match &op.request {
            Request::RestartTask { name } if !matches!(op.outcome, Outcome::Refused { .. }) => {
                Some(name.as_str())
            }
            _ => None,
        })
        .collect();
    let mut lines: BTreeMap<Shape, Vec<(&Op, &SettledTask)>> = BTreeMap::new();
    for op in &history.ops {
        let Request::Task {
            name,
            priority: Some(priority),
            cpu,
            memory,
            ..
        } = &op.request
        else {
            continue;
        };
        if !matches!(op.outcome, Outcome::Acked { .. }) || restarted.contains(name.as_str()) {
            continue;
        }
        let Some([task]) = named.get(name.as_str()).map(Vec::as_slice) else {
            continue; // exists_once reports it.
        };
        lines
            .entry((task.project.as_str(), *priority, cpu.to_bits(), *memory))
            .or_default()
            .push((op, task));
    }
    for line in lines.values() {
        for (first, first_task) in line {
            for (later, later_task) in line {
                // Only a request answered before the later one was sent is surely ahead.
                if first.end_us >= later.start_us {
                    continue;
                }
                let Some(later_in) = later_task.first_placed_us else {
                    continue;
                };
                let overtaken = match first_task.first_placed_us {
                    Some(first_in) => first_in > later_in,
                    // Never let in: overtaken unless it left the list (expired or stopped).
                    None => !first_task.state.is_terminal(),
                };
                if overtaken {
                    found.push(violation(
                        Invariant::QueueOrder,
                        format!(
                            "{} was let in at {later_in} µs before {}, asked earlier with the same priority and size ({})",
                            later_task.name,
                            first_task.name,
                            first_task
                                .first_placed_us
                                .map(|at| format!("let in at {at} µs"))
                                .unwrap_or_else(|| format!("still {}", first_task.state))
                        ),
                        vec![first.seq, later.seq],
                    ));
                }
            }
        }
    }
}

fn restarts_within_policy(history: &History, found: &mut Vec<Violation>) {
    let named = tasks_named(&history.settled);
    // Restarts a user asked for (acknowledged, or maybe carried out) come on top.
    let mut asked: BTreeMap<&str, u32> = BTreeMap::new();
    for op in &history.ops {
        if let Request::RestartTask { name } = &op.request
            && !matches!(op.outcome, Outcome::Refused { .. })
        {
            *asked.entry(name.as_str()).or_default() += 1;
        }
    }
    for op in &history.ops {
        let Request::Task {
            name,
            restart_policy,
            max_restarts,
            ..
        } = &op.request
        else {
            continue;
        };
        for task in named.get(name.as_str()).into_iter().flatten() {
            let allowed = match (restart_policy, max_restarts) {
                (RestartPolicy::No, _) => Some(0),
                (_, max) => *max,
            };
            let by_user = asked.get(name.as_str()).copied().unwrap_or(0);
            if let Some(allowed) = allowed
                && task.restart_count > allowed + by_user
            {
                found.push(violation(
                    Invariant::RestartPolicyHeld,
                    format!(
                        "task {name} restarted {} times; its policy allows {allowed}{}",
                        task.restart_count,
                        if by_user > 0 {
                            format!(" and {by_user} were asked for")
                        } else {
                            String::new()
                        }
                    ),
                    vec![op.seq],
                ));
            }
        }
    }
    // A job's copies carry the policy they were made with.
    for task in history.settled.tasks.iter().filter(|t| !t.job.is_empty()) {
        let allowed = match (task.restart_policy, task.max_restarts) {
            (RestartPolicy::No, _) => Some(0),
            (_, max) => max,
        };
        if let Some(allowed) = allowed
            && task.restart_count > allowed
        {
            found.push(violation(
                Invariant::RestartPolicyHeld,
                format!(
                    "copy {} of job {} restarted {} times; its policy allows {allowed}",
                    task.name, task.job, task.restart_count
                ),
                Vec::new(),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small run that held: two tasks, a service job scaled, a waiting line of three, a
    /// container per running task.
    fn clean() -> History {
        let mut ops = Vec::new();
        let mut tasks = Vec::new();
        let mut containers = Vec::new();
        let mut at = 0;
        let mut push = |request, outcome| {
            at += 10;
            ops.push(Op {
                seq: ops.len() as u64,
                start_us: at,
                end_us: at + 5,
                request,
                outcome,
            });
        };
        let task = |name: &str, state, node: &str, first_placed_us| SettledTask {
            id: Uuid::new_v4(),
            name: name.to_owned(),
            job: String::new(),
            group: String::new(),
            index: None,
            state,
            desired_state: State::Running,
            node: node.to_owned(),
            restart_count: 0,
            restart_policy: RestartPolicy::OnFailure,
            max_restarts: Some(3),
            mark: None,
            first_placed_us,
            pending_reason: None,
            project: String::new(),
        };
        for (name, placed) in [("a", 100), ("q1", 200), ("q2", 300), ("q3", 400)] {
            let settled = task(name, State::Running, "w1", Some(placed));
            push(
                Request::Task {
                    name: name.to_owned(),
                    restart_policy: RestartPolicy::OnFailure,
                    max_restarts: Some(3),
                    priority: name.starts_with('q').then_some(5),
                    cpu: 0.1,
                    memory: 1 << 20,
                },
                Outcome::Acked {
                    id: Some(settled.id),
                },
            );
            containers.push(SettledContainer {
                node: "w1".to_owned(),
                name: format!("cube-{name}"),
                running: true,
                task: Some(settled.id),
                role: String::new(),
            });
            tasks.push(settled);
        }
        // An unanswered submission that never happened.
        push(
            Request::Task {
                name: "lost-in-flight".to_owned(),
                restart_policy: RestartPolicy::No,
                max_restarts: None,
                priority: None,
                cpu: 0.1,
                memory: 1 << 20,
            },
            Outcome::Unknown {
                error: "connection reset".to_owned(),
            },
        );
        push(
            Request::Job {
                name: "web".to_owned(),
                kind: JobKind::Service,
                mark: "m1".to_owned(),
                counts: BTreeMap::from([("g".to_owned(), 3)]),
            },
            Outcome::Acked { id: None },
        );
        push(
            Request::Scale {
                job: "web".to_owned(),
                group: "g".to_owned(),
                count: 2,
            },
            Outcome::Acked { id: None },
        );
        for index in 0..2 {
            let mut copy = task(&format!("web-g-{index}"), State::Running, "w2", Some(500));
            copy.job = "web".to_owned();
            copy.group = "g".to_owned();
            copy.index = Some(index);
            copy.mark = Some("m1".to_owned());
            tasks.push(copy);
        }
        let mut stopped_copy = task("web-g-2", State::Completed, "w2", Some(500));
        stopped_copy.job = "web".to_owned();
        stopped_copy.group = "g".to_owned();
        stopped_copy.index = Some(2);
        stopped_copy.mark = Some("m1".to_owned());
        tasks.push(stopped_copy);
        History {
            seed: 7,
            ops,
            settled: Settled {
                tasks,
                jobs: vec![SettledJob {
                    name: "web".to_owned(),
                    project: String::new(),
                    stopped: false,
                }],
                containers,
                container_nodes: BTreeSet::from(["w1".to_owned()]),
                capacity: vec![CapacitySample {
                    node: "w1".to_owned(),
                    at_us: 50,
                    cpu_used: 0.4,
                    cpu_total: 2.0,
                    memory_used: 4 << 20,
                    memory_total: 1 << 30,
                }],
            },
            exits: Vec::new(),
        }
    }

    fn invariants(history: &History) -> Vec<Invariant> {
        check(history).iter().map(|v| v.invariant).collect()
    }

    #[test]
    fn a_run_that_held_has_no_violation() {
        assert_eq!(check(&clean()), Vec::new());
    }

    #[test]
    fn a_lost_acknowledged_task_is_caught() {
        let mut history = clean();
        history.settled.tasks.retain(|task| task.name != "a");
        history.settled.containers.retain(|c| c.name != "cube-a");
        assert_eq!(invariants(&history), vec![Invariant::AckedExistsOnce]);
        assert!(check(&history)[0].message.contains("task a"));
    }

    #[test]
    fn an_acknowledged_task_held_twice_is_caught() {
        let mut history = clean();
        let mut twin = history.settled.tasks[0].clone();
        twin.id = Uuid::new_v4();
        twin.state = State::Pending;
        history.settled.tasks.push(twin);
        assert!(invariants(&history).contains(&Invariant::AckedExistsOnce));
    }

    #[test]
    fn an_unanswered_submission_made_twice_is_caught_and_once_is_fine() {
        let mut history = clean();
        let mut once = history.settled.tasks[0].clone();
        once.id = Uuid::new_v4();
        once.name = "lost-in-flight".to_owned();
        once.state = State::Completed;
        history.settled.tasks.push(once.clone());
        assert_eq!(
            check(&history),
            Vec::new(),
            "one copy of an unanswered write"
        );
        once.id = Uuid::new_v4();
        history.settled.tasks.push(once);
        assert_eq!(invariants(&history), vec![Invariant::UnackedAtMostOnce]);
    }

    #[test]
    fn a_refused_submission_that_left_a_task_is_caught() {
        let mut history = clean();
        history.ops[4].outcome = Outcome::Refused {
            status: 503,
            message: "not the leader".to_owned(),
        };
        let mut made = history.settled.tasks[0].clone();
        made.id = Uuid::new_v4();
        made.name = "lost-in-flight".to_owned();
        made.state = State::Completed;
        history.settled.tasks.push(made);
        assert_eq!(invariants(&history), vec![Invariant::UnackedAtMostOnce]);
    }

    #[test]
    fn a_second_container_for_a_task_is_caught() {
        let mut history = clean();
        let mut second = history.settled.containers[0].clone();
        second.name = "cube-a-r1".to_owned();
        second.node = "w3".to_owned();
        history.settled.containers.push(second);
        let found = check(&history);
        assert_eq!(
            found.iter().map(|v| v.invariant).collect::<Vec<_>>(),
            vec![Invariant::OneContainerPerRun]
        );
        assert!(found[0].message.contains("2 containers"), "{}", found[0]);
    }

    #[test]
    fn a_pods_parts_are_one_container_each() {
        let mut history = clean();
        let pod = history.settled.containers[0].clone();
        for role in ["web", "db"] {
            let mut part = pod.clone();
            part.role = role.to_owned();
            part.name = format!("{}-{role}", pod.name);
            history.settled.containers.push(part);
        }
        history.settled.containers.remove(0);
        assert_eq!(check(&history), Vec::new());
    }

    #[test]
    fn a_container_no_running_task_owns_is_caught() {
        let mut history = clean();
        history.settled.containers.push(SettledContainer {
            node: "w1".to_owned(),
            name: "cube-stray".to_owned(),
            running: true,
            task: Some(Uuid::new_v4()),
            role: String::new(),
        });
        // A task that ended while its container still runs.
        history.settled.tasks[1].state = State::Failed;
        let found = invariants(&history);
        assert_eq!(
            found,
            vec![Invariant::NoOrphanContainer, Invariant::NoOrphanContainer]
        );
    }

    #[test]
    fn a_running_task_without_a_container_is_caught() {
        let mut history = clean();
        history.settled.containers[0].running = false;
        assert_eq!(invariants(&history), vec![Invariant::OneContainerPerRun]);
    }

    #[test]
    fn an_over_committed_node_is_caught() {
        let mut history = clean();
        history.settled.capacity.push(CapacitySample {
            node: "w1".to_owned(),
            at_us: 60,
            cpu_used: 2.5,
            cpu_total: 2.0,
            memory_used: 4 << 20,
            memory_total: 1 << 30,
        });
        history.settled.capacity.push(CapacitySample {
            node: "w2".to_owned(),
            at_us: 70,
            cpu_used: 0.5,
            cpu_total: 2.0,
            memory_used: 2 << 30,
            memory_total: 1 << 30,
        });
        assert_eq!(
            invariants(&history),
            vec![Invariant::WithinCapacity, Invariant::WithinCapacity]
        );
    }

    #[test]
    fn a_job_short_of_its_count_or_on_an_old_submission_is_caught() {
        let mut short = clean();
        short.settled.tasks.retain(|task| task.name != "web-g-1");
        assert_eq!(invariants(&short), vec![Invariant::JobConverged]);

        let mut stale = clean();
        for task in &mut stale.settled.tasks {
            if task.name == "web-g-0" {
                task.mark = Some("m0".to_owned());
            }
        }
        assert_eq!(invariants(&stale), vec![Invariant::JobConverged]);

        // The scale had no answer: either count is a state the job may be in.
        let mut unanswered = clean();
        unanswered.ops[6].outcome = Outcome::Unknown {
            error: "timeout".to_owned(),
        };
        assert_eq!(check(&unanswered), Vec::new());
        unanswered
            .settled
            .tasks
            .retain(|task| task.name != "web-g-1");
        assert_eq!(invariants(&unanswered), vec![Invariant::JobConverged]);
    }

    #[test]
    fn a_stopped_job_still_running_is_caught() {
        let mut history = clean();
        history.ops.push(Op {
            seq: 99,
            start_us: 1000,
            end_us: 1010,
            request: Request::StopJob {
                name: "web".to_owned(),
            },
            outcome: Outcome::Acked { id: None },
        });
        let found = check(&history);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].invariant, Invariant::JobConverged);
        assert!(found[0].ops.contains(&99));
    }

    #[test]
    fn requests_of_two_projects_are_ordered_each_in_its_own_line() {
        // q3, asked last, is let in before q1 and q2: in another project, it is not in
        // their line (managers acting for their shards each place their own projects).
        let mut history = clean();
        for task in &mut history.settled.tasks {
            if task.name == "q3" {
                task.first_placed_us = Some(150);
                task.project = "chaos-1".to_owned();
            }
        }
        assert_eq!(invariants(&history), Vec::<Invariant>::new());
        // In the same project as q1 it is overtaking.
        for task in &mut history.settled.tasks {
            if task.name == "q1" {
                task.project = "chaos-1".to_owned();
            }
        }
        assert_eq!(invariants(&history), vec![Invariant::QueueOrder]);
    }

    #[test]
    fn a_waiting_request_overtaken_in_its_priority_is_caught() {
        let mut history = clean();
        // q3, asked last, is let in before q1.
        for task in &mut history.settled.tasks {
            if task.name == "q3" {
                task.first_placed_us = Some(150);
            }
        }
        let found = check(&history);
        assert_eq!(
            found.iter().map(|v| v.invariant).collect::<Vec<_>>(),
            vec![Invariant::QueueOrder, Invariant::QueueOrder]
        );
        assert!(found[0].message.starts_with("q3"), "{}", found[0]);

        // One still waiting while a later one of its line was let in is overtaken too.
        let mut waiting = clean();
        for task in &mut waiting.settled.tasks {
            if task.name == "q1" {
                task.first_placed_us = None;
                task.state = State::Pending;
            }
        }
        waiting.settled.containers.retain(|c| c.name != "cube-q1");
        assert_eq!(
            invariants(&waiting),
            vec![Invariant::QueueOrder, Invariant::QueueOrder]
        );
        // ... unless it left the list (it expired: Failed, never placed).
        for task in &mut waiting.settled.tasks {
            if task.name == "q1" {
                task.state = State::Failed;
            }
        }
        assert_eq!(check(&waiting), Vec::new());
    }

    /// Found by the long runs: a request that expired, then was run again with `cube
    /// restart`, goes to the end of its line, and is let in after requests asked after its
    /// first submission.
    #[test]
    fn a_waiting_request_restarted_after_it_expired_is_not_held_to_its_first_place() {
        let mut history = clean();
        for task in &mut history.settled.tasks {
            if task.name == "q1" {
                task.first_placed_us = Some(1000);
                task.restart_count = 1;
            }
        }
        assert_eq!(
            invariants(&history),
            vec![Invariant::QueueOrder, Invariant::QueueOrder],
            "overtaken, as far as the history shows without the restart"
        );
        let seq = history.ops.len() as u64;
        history.ops.push(Op {
            seq,
            start_us: 900,
            end_us: 905,
            request: Request::RestartTask {
                name: "q1".to_owned(),
            },
            outcome: Outcome::Acked { id: None },
        });
        assert_eq!(check(&history), Vec::new());
    }

    #[test]
    fn too_many_restarts_are_caught_and_asked_ones_are_not() {
        let mut history = clean();
        history.settled.tasks[0].restart_count = 4;
        assert_eq!(invariants(&history), vec![Invariant::RestartPolicyHeld]);
        history.ops.push(Op {
            seq: 100,
            start_us: 2000,
            end_us: 2010,
            request: Request::RestartTask {
                name: "a".to_owned(),
            },
            outcome: Outcome::Acked { id: None },
        });
        assert_eq!(check(&history), Vec::new());

        let mut copy = clean();
        for task in &mut copy.settled.tasks {
            if task.job == "web" {
                task.restart_policy = RestartPolicy::No;
                task.restart_count = 1;
            }
        }
        assert_eq!(
            invariants(&copy),
            vec![Invariant::RestartPolicyHeld; 3],
            "each copy restarted against its policy"
        );
    }

    #[test]
    fn a_history_reads_back_from_its_json() {
        let history = clean();
        let text = serde_json::to_string(&history).unwrap();
        let back: History = serde_json::from_str(&text).unwrap();
        assert_eq!(check(&back), Vec::new());
        assert_eq!(back.ops.len(), history.ops.len());
    }

    #[test]
    fn a_process_that_ended_on_its_own_is_caught_and_one_whose_disk_was_full_is_not() {
        let mut history = clean();
        history.exits.push(Exit {
            process: "worker w1".to_owned(),
            at_us: 900,
            status: "exit status: 1".to_owned(),
            expected: true,
        });
        assert_eq!(check(&history), Vec::new(), "a full disk's exit");
        history.exits.push(Exit {
            process: "manager 0".to_owned(),
            at_us: 950,
            status: "signal: 6 (SIGABRT)".to_owned(),
            expected: false,
        });
        let found = check(&history);
        assert_eq!(
            found.iter().map(|v| v.invariant).collect::<Vec<_>>(),
            vec![Invariant::NoCrash]
        );
        assert!(found[0].message.contains("manager 0"), "{}", found[0]);
    }

    /// `clean()` with a system job `sys` of mark m1 and one running copy on each node.
    fn with_system_job(nodes: &[&str]) -> History {
        let mut history = clean();
        let seq = history.ops.len() as u64;
        history.ops.push(Op {
            seq,
            start_us: 1000,
            end_us: 1005,
            request: Request::Job {
                name: "sys".to_owned(),
                kind: JobKind::System,
                mark: "m1".to_owned(),
                counts: BTreeMap::from([("g".to_owned(), 0)]),
            },
            outcome: Outcome::Acked { id: None },
        });
        history.settled.jobs.push(SettledJob {
            name: "sys".to_owned(),
            project: String::new(),
            stopped: false,
        });
        history.settled.container_nodes = nodes.iter().map(|n| n.to_string()).collect();
        let template = history.settled.tasks[0].clone();
        for node in nodes {
            let mut copy = template.clone();
            copy.id = Uuid::new_v4();
            copy.name = format!("sys-g-{node}");
            copy.job = "sys".to_owned();
            copy.group = "g".to_owned();
            copy.node = node.to_string();
            copy.mark = Some("m1".to_owned());
            history.settled.containers.push(SettledContainer {
                node: node.to_string(),
                name: format!("cube-sys-{node}"),
                running: true,
                task: Some(copy.id),
                role: String::new(),
            });
            history.settled.tasks.push(copy);
        }
        // clean()'s service copies run on w2, now one of the nodes looked at: their
        // containers.
        let on_w2: Vec<Uuid> = history
            .settled
            .tasks
            .iter()
            .filter(|t| t.node == "w2" && t.job == "web" && t.state == State::Running)
            .map(|t| t.id)
            .collect();
        for id in on_w2 {
            history.settled.containers.push(SettledContainer {
                node: "w2".to_owned(),
                name: format!("cube-{id}"),
                running: true,
                task: Some(id),
                role: String::new(),
            });
        }
        history
    }

    #[test]
    fn a_system_job_missing_from_a_node_or_twice_on_one_is_caught() {
        let history = with_system_job(&["w1", "w2"]);
        assert_eq!(check(&history), Vec::new());

        let mut missing = history.clone();
        let gone = missing
            .settled
            .tasks
            .iter()
            .position(|t| t.name == "sys-g-w2")
            .expect("the copy on w2");
        let id = missing.settled.tasks.remove(gone).id;
        missing.settled.containers.retain(|c| c.task != Some(id));
        let found = check(&missing);
        assert_eq!(
            found.iter().map(|v| v.invariant).collect::<Vec<_>>(),
            vec![Invariant::JobConverged]
        );
        assert!(
            found[0].message.contains("no copy on node w2"),
            "{}",
            found[0]
        );

        let mut twice = history.clone();
        let mut second = twice
            .settled
            .tasks
            .iter()
            .find(|t| t.name == "sys-g-w1")
            .expect("the copy on w1")
            .clone();
        second.id = Uuid::new_v4();
        twice.settled.containers.push(SettledContainer {
            node: "w1".to_owned(),
            name: "cube-sys-w1-again".to_owned(),
            running: true,
            task: Some(second.id),
            role: String::new(),
        });
        twice.settled.tasks.push(second);
        let found = check(&twice);
        assert_eq!(
            found.iter().map(|v| v.invariant).collect::<Vec<_>>(),
            vec![Invariant::JobConverged]
        );
        assert!(
            found[0].message.contains("2 copies on node w1"),
            "{}",
            found[0]
        );
    }
}
