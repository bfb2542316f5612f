//! The job transformer: from a job, the nodes and the tasks the job owns, what to create and
//! what to stop so that the job's copies are what it asks for. Pure: no IO, no clock, no
//! locks; the job controller carries the plan out, and `POST /jobs/plan` shows it unexecuted.
//!
//! Ownership: a task belongs to a job when its `Job` field names it; a copy is identified by
//! its group and index (`service`, `batch`) or its group and node (`system`, pinned to its
//! node by a `node.name` constraint). A plan never touches a task another job or no job owns.

use std::collections::{BTreeMap, BTreeSet};

use cube_types::job::{Constraint, JobRecord, JobType, Operator, task_name};
use cube_types::{State, Task};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::reconcile::policy_restarts;

/// What the transformer reads of a node (its reconciliation mask): the name, whether it takes
/// work, and its labels. A heartbeat that moves only the node's figures changes none of this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    pub name: String,
    pub ready: bool,
    /// Shared with the node registry: a look copies a pointer, not the map.
    pub labels: std::sync::Arc<BTreeMap<String, String>>,
}

/// What a job's copies need, as a dry run would say it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct JobPlan {
    /// New copies, as the tasks to submit.
    #[serde(rename = "Create")]
    pub create: Vec<Task>,
    /// Copies to stop, with why.
    #[serde(rename = "Stop")]
    pub stop: Vec<PlannedStop>,
    /// Copies that stay as they are.
    #[serde(rename = "Keep")]
    pub keep: Vec<Uuid>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlannedStop {
    #[serde(rename = "ID")]
    pub id: Uuid,
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Reason")]
    pub reason: String,
}

impl JobPlan {
    pub fn is_empty(&self) -> bool {
        self.create.is_empty() && self.stop.is_empty()
    }
}

/// Whether a copy is still meant to run: asked to run, and either not ended or ended with a
/// restart to come (its policy restarts that end and the limit is not reached).
pub fn is_live(task: &Task) -> bool {
    if task.spec.desired_state != State::Running {
        return false;
    }
    if !task.status.state.is_terminal() {
        return true;
    }
    policy_restarts(task.spec.restart_policy, task.status.state)
        && task
            .spec
            .max_restarts
            .is_none_or(|max| task.status.restart_count < max)
}

/// A batch copy that finished its work.
fn is_complete(task: &Task) -> bool {
    task.status.state == State::Completed && task.spec.desired_state == State::Running
}

/// A copy that ended for good without finishing: failed (or lost) with no restart to come,
/// and not stopped by anyone.
pub fn gave_up(task: &Task) -> bool {
    task.spec.desired_state == State::Running
        && matches!(task.status.state, State::Failed | State::Lost)
        && !is_live(task)
}

/// The node a system copy is pinned to (its `node.name =` constraint).
fn pinned_node(task: &Task) -> Option<&str> {
    task.spec
        .constraints
        .iter()
        .rev()
        .find(|c| c.attribute == "node.name" && c.operator == Operator::Equal)
        .map(|c| c.value.as_str())
}

/// The task a copy is made from: the group's template with the job's identity, its name and
/// every constraint on it; `pin` puts a system copy on its node.
pub fn copy_of(record: &JobRecord, group_index: usize, index: u32, pin: Option<&str>) -> Task {
    let job = &record.job;
    let group = &job.groups[group_index];
    let mut task = group.task.clone();
    task.id = Uuid::new_v4();
    task.name = task_name(&job.name, &group.name, index);
    task.spec.job = job.name.clone();
    task.spec.group = group.name.clone();
    task.spec.index = Some(index);
    task.spec.constraints = job.constraints_of(group).cloned().collect();
    if let Some(node) = pin {
        task.spec.constraints.push(Constraint {
            attribute: "node.name".to_string(),
            operator: Operator::Equal,
            value: node.to_string(),
        });
    }
    task.normalize();
    task
}

/// Whether a copy still has the spec the job asks for now (a changed template replaces it).
/// `template` is the group's copy as [`copy_of`] makes it without a pin, made once per group:
/// a copy differs from it only in its name, its index and (system) the pin to its node.
fn has_current_spec(task: &Task, template: &Task) -> bool {
    let constraints = match pinned_node(task) {
        Some(_) => &task.spec.constraints[..task.spec.constraints.len().saturating_sub(1)],
        None => &task.spec.constraints[..],
    };
    constraints == template.spec.constraints.as_slice()
        && task.same_spec_except(template, &["Name", "Index", "Constraints"])
}

/// The plan for one job, given every task it owns (`owned`: tasks whose `Job` is its name).
pub fn plan(record: &JobRecord, nodes: &[NodeFacts], owned: &[&Task]) -> JobPlan {
    let mut plan = JobPlan::default();
    let job = &record.job;
    let mut stop = |task: &Task, reason: String| {
        plan_stop(&mut plan.stop, task, reason);
    };
    if record.stopped {
        for task in owned.iter().filter(|task| is_live(task)) {
            stop(task, format!("job {} was stopped", job.name));
        }
        return plan;
    }
    let group_names: BTreeSet<&str> = job.groups.iter().map(|g| g.name.as_str()).collect();
    for task in owned.iter().filter(|task| is_live(task)) {
        if !group_names.contains(task.spec.group.as_str()) {
            stop(
                task,
                format!("group {:?} is no longer in the job", task.spec.group),
            );
        }
    }
    let mut keep = Vec::new();
    let mut create = Vec::new();
    let mut stops = Vec::new();
    for (group_index, group) in job.groups.iter().enumerate() {
        let mine: Vec<&Task> = owned
            .iter()
            .copied()
            .filter(|task| task.spec.group == group.name)
            .collect();
        match job.job_type {
            JobType::System => plan_system(
                record,
                group_index,
                nodes,
                &mine,
                &mut keep,
                &mut create,
                &mut stops,
            ),
            JobType::Service | JobType::Batch => plan_counted(
                record,
                group_index,
                &mine,
                &mut keep,
                &mut create,
                &mut stops,
            ),
        }
    }
    for (task, reason) in stops {
        stop(task, reason);
    }
    plan.keep = keep;
    plan.create = create;
    plan
}

fn plan_stop(stops: &mut Vec<PlannedStop>, task: &Task, reason: String) {
    if stops.iter().any(|planned| planned.id == task.id) {
        return;
    }
    stops.push(PlannedStop {
        id: task.id,
        name: task.name.clone(),
        reason,
    });
}

/// `service` and `batch`: `Count` copies, indexes kept stable. Scaling down stops the
/// highest indexes first, and copies not yet running before running ones.
fn plan_counted<'a>(
    record: &JobRecord,
    group_index: usize,
    mine: &[&'a Task],
    keep: &mut Vec<Uuid>,
    create: &mut Vec<Task>,
    stops: &mut Vec<(&'a Task, String)>,
) {
    let group = &record.job.groups[group_index];
    let count = group.count.unwrap_or(0) as usize;
    let batch = record.job.job_type == JobType::Batch;
    // Copies that count: the live ones, and for a batch job those that completed.
    let mut counted: Vec<&Task> = mine
        .iter()
        .copied()
        .filter(|task| is_live(task) || (batch && is_complete(task)))
        .collect();
    // One copy per index: an extra one for an index is a duplicate (the later one goes).
    // Keys read once each (`sort_by_cached_key`): the tasks lie apart in memory, and a sort
    // that read them at every comparison spent most of a no-change look on cache misses.
    counted.sort_by_cached_key(|task| (task.spec.index, task.status.created_time, task.id));
    let mut seen = BTreeSet::new();
    let mut unique = Vec::new();
    for task in counted {
        if seen.insert(task.spec.index) {
            unique.push(task);
        } else if is_live(task) {
            stops.push((task, format!("a second copy of {}", task.name)));
        }
    }
    // Keep `count`: completed first (their work is done), then running, then the rest, each
    // by lower index.
    unique.sort_by_cached_key(|task| {
        let rank = if is_complete(task) {
            0
        } else if task.status.state == State::Running {
            1
        } else {
            2
        };
        (rank, task.spec.index)
    });
    let (kept, extra) = unique.split_at(count.min(unique.len()));
    let mut extra: Vec<&Task> = extra.to_vec();
    extra.sort_by_key(|task| std::cmp::Reverse(task.spec.index));
    for task in extra {
        if is_live(task) {
            stops.push((task, format!("the group is scaled to {count}")));
        }
    }
    let used: BTreeSet<u32> = kept.iter().filter_map(|task| task.spec.index).collect();
    let template = copy_of(record, group_index, 0, None);
    for task in kept {
        if is_complete(task) {
            continue;
        }
        if has_current_spec(task, &template) {
            keep.push(task.id);
        } else {
            let wanted = copy_of(record, group_index, task.spec.index.unwrap_or(0), None);
            stops.push((
                task,
                format!(
                    "job {} version {} changed its spec",
                    record.job.name, record.version
                ),
            ));
            create.push(copy_with_name(wanted, task));
        }
    }
    // A batch copy that gave up fails the job: it is not created again.
    if batch && mine.iter().any(|task| gave_up(task)) {
        return;
    }
    let mut free = (0u32..).filter(|index| !used.contains(index));
    for _ in kept.len()..count {
        let Some(index) = free.next() else { break };
        create.push(copy_of(record, group_index, index, None));
    }
}

/// The replacement keeps the name of the copy it replaces (same index).
fn copy_with_name(mut wanted: Task, replaced: &Task) -> Task {
    wanted.name = replaced.name.clone();
    wanted
}

/// `system`: one copy on every Ready node that matches the constraints. A copy on a node
/// that is down stays (it comes back, or is lost and placed by its policy); a copy on a node
/// that left or no longer matches goes.
fn plan_system<'a>(
    record: &JobRecord,
    group_index: usize,
    nodes: &[NodeFacts],
    mine: &[&'a Task],
    keep: &mut Vec<Uuid>,
    create: &mut Vec<Task>,
    stops: &mut Vec<(&'a Task, String)>,
) {
    let job = &record.job;
    let group = &job.groups[group_index];
    let matches = |node: &NodeFacts| {
        job.constraints_of(group)
            .all(|constraint| constraint.admits(&node.name, &node.labels))
    };
    let by_name: BTreeMap<&str, &NodeFacts> = nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let template = copy_of(record, group_index, 0, None);
    let mut covered = BTreeSet::new();
    let mut live: Vec<&Task> = mine.iter().copied().filter(|task| is_live(task)).collect();
    live.sort_by_key(|task| (task.status.created_time, task.id));
    let used: BTreeSet<u32> = live.iter().filter_map(|task| task.spec.index).collect();
    for task in live {
        let node = pinned_node(task).unwrap_or_default();
        match by_name.get(node) {
            None => stops.push((task, format!("node {node:?} left the cluster"))),
            Some(facts) if !matches(facts) => stops.push((
                task,
                format!("node {node} no longer matches the job's constraints"),
            )),
            Some(_) if !covered.insert(node.to_string()) => {
                stops.push((task, format!("a second copy on node {node}")))
            }
            Some(_) => {
                if has_current_spec(task, &template) {
                    keep.push(task.id);
                } else {
                    let wanted = copy_of(
                        record,
                        group_index,
                        task.spec.index.unwrap_or(0),
                        Some(node),
                    );
                    stops.push((
                        task,
                        format!(
                            "job {} version {} changed its spec",
                            job.name, record.version
                        ),
                    ));
                    create.push(copy_with_name(wanted, task));
                }
            }
        }
    }
    let mut free = (0u32..).filter(|index| !used.contains(index));
    for node in nodes.iter().filter(|node| node.ready && matches(node)) {
        if covered.contains(&node.name) {
            continue;
        }
        let Some(index) = free.next() else { break };
        create.push(copy_of(record, group_index, index, Some(&node.name)));
    }
}

/// How a job's copies are doing, per group, as `nomad job status` counts them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSummary {
    #[serde(rename = "Pending")]
    pub pending: usize,
    /// Placed and sent to the node, not yet running.
    #[serde(rename = "Starting")]
    pub starting: usize,
    #[serde(rename = "Running")]
    pub running: usize,
    #[serde(rename = "Failed")]
    pub failed: usize,
    #[serde(rename = "Complete")]
    pub complete: usize,
    #[serde(rename = "Lost")]
    pub lost: usize,
}

/// The summary of each group, from the copies that are current (live, or the last word on
/// their index: a completed or failed copy not replaced since).
pub fn summarize(record: &JobRecord, owned: &[&Task]) -> BTreeMap<String, GroupSummary> {
    let mut summary: BTreeMap<String, GroupSummary> = record
        .job
        .groups
        .iter()
        .map(|group| (group.name.clone(), GroupSummary::default()))
        .collect();
    // The newest copy of each (group, index) speaks for it.
    let mut newest: BTreeMap<(&str, Option<u32>, Option<&str>), &Task> = BTreeMap::new();
    for task in owned {
        let key = (task.spec.group.as_str(), task.spec.index, pinned_node(task));
        let replace = newest.get(&key).is_none_or(|known| {
            (known.status.created_time, known.id) < (task.status.created_time, task.id)
        });
        if replace {
            newest.insert(key, task);
        }
    }
    for task in newest.values() {
        if task.spec.desired_state != State::Running && task.status.state.is_terminal() {
            continue; // stopped by the user or the controller: no longer counted
        }
        let Some(group) = summary.get_mut(&task.spec.group) else {
            continue;
        };
        match task.status.state {
            State::Pending => group.pending += 1,
            State::Scheduled => group.starting += 1,
            State::Running => group.running += 1,
            State::Completed => group.complete += 1,
            State::Failed => group.failed += 1,
            State::Lost => group.lost += 1,
        }
    }
    summary
}

/// A job's status in one word: `stopped`, `complete` (a batch job whose every copy
/// completed), `failed` (a batch job with a copy that gave up), `running` (every copy of a
/// service runs; for a system job, none of its copies waits), or `pending`. `summary` is
/// [`summarize`]'s for the same tasks.
pub fn status_word(
    record: &JobRecord,
    owned: &[&Task],
    summary: &BTreeMap<String, GroupSummary>,
) -> &'static str {
    if record.stopped {
        return "stopped";
    }
    let wanted: usize = record
        .job
        .groups
        .iter()
        .map(|group| group.count.unwrap_or(0) as usize)
        .sum();
    match record.job.job_type {
        JobType::Batch if owned.iter().any(|task| gave_up(task)) => "failed",
        JobType::Batch if summary.values().map(|g| g.complete).sum::<usize>() >= wanted => {
            "complete"
        }
        JobType::Service if summary.values().map(|g| g.running).sum::<usize>() >= wanted => {
            "running"
        }
        JobType::System if summary.values().all(|g| g.pending + g.starting == 0) => "running",
        _ => "pending",
    }
}

#[cfg(test)]
mod tests {
    use cube_types::job::{Group, Job};

    use super::*;

    fn record(job_type: JobType, count: Option<u32>) -> JobRecord {
        JobRecord {
            job: Job {
                name: "web".into(),
                job_type,
                priority: 50,
                constraints: Vec::new(),
                groups: vec![Group {
                    name: "api".into(),
                    count,
                    constraints: Vec::new(),
                    task: Task::new("", "cube-sample:latest"),
                }],
            },
            version: 1,
            submit_time: None,
            stopped: false,
        }
    }

    /// The copy the controller would have made, in the given state.
    fn copy(record: &JobRecord, index: u32, state: State) -> Task {
        let mut task = copy_of(record, 0, index, None);
        task.status.state = state;
        task
    }

    fn names(tasks: &[Task]) -> Vec<String> {
        tasks.iter().map(|task| task.name.clone()).collect()
    }

    #[test]
    fn a_new_service_job_creates_count_copies_named_by_index() {
        let job = record(JobType::Service, Some(3));
        let plan = plan(&job, &[], &[]);
        assert_eq!(
            names(&plan.create),
            ["web.api[0]", "web.api[1]", "web.api[2]"]
        );
        assert!(
            plan.create
                .iter()
                .all(|task| task.spec.job == "web" && task.spec.group == "api")
        );
        assert!(plan.stop.is_empty());
    }

    #[test]
    fn a_converged_job_plans_nothing() {
        let job = record(JobType::Service, Some(2));
        let tasks = [copy(&job, 0, State::Running), copy(&job, 1, State::Running)];
        let owned: Vec<&Task> = tasks.iter().collect();
        let plan = plan(&job, &[], &owned);
        assert!(plan.is_empty(), "{plan:?}");
        assert_eq!(plan.keep.len(), 2);
    }

    #[test]
    fn scaling_down_stops_copies_not_yet_running_then_the_highest_indexes() {
        let job = record(JobType::Service, Some(2));
        let tasks = [
            copy(&job, 0, State::Running),
            copy(&job, 1, State::Pending),
            copy(&job, 2, State::Running),
            copy(&job, 3, State::Running),
        ];
        let owned: Vec<&Task> = tasks.iter().collect();
        let plan = plan(&job, &[], &owned);
        let stopped: Vec<&str> = plan.stop.iter().map(|stop| stop.name.as_str()).collect();
        assert_eq!(stopped, ["web.api[3]", "web.api[1]"]);
        assert!(plan.create.is_empty());
    }

    #[test]
    fn a_service_copy_that_gave_up_is_replaced_under_its_index() {
        let job = record(JobType::Service, Some(1));
        let mut dead = copy(&job, 0, State::Failed);
        dead.spec.restart_policy = cube_types::RestartPolicy::No;
        let plan = plan(&job, &[], &[&dead]);
        assert_eq!(names(&plan.create), ["web.api[0]"]);
    }

    #[test]
    fn a_copy_waiting_to_restart_is_kept_not_replaced() {
        let mut job = record(JobType::Service, Some(1));
        job.job.groups[0].task.spec.restart_policy = cube_types::RestartPolicy::OnFailure;
        let failed = copy(&job, 0, State::Failed);
        let plan = plan(&job, &[], &[&failed]);
        assert!(plan.is_empty(), "{plan:?}");
    }

    #[test]
    fn a_batch_job_does_not_rerun_completed_copies_and_fails_when_one_gave_up() {
        let job = record(JobType::Batch, Some(2));
        let done = copy(&job, 0, State::Completed);
        let running = copy(&job, 1, State::Running);
        assert!(plan(&job, &[], &[&done, &running]).is_empty());
        let mut failed = copy(&job, 1, State::Failed);
        failed.spec.restart_policy = cube_types::RestartPolicy::No;
        let plan = plan(&job, &[], &[&done, &failed]);
        assert!(
            plan.is_empty(),
            "a failed batch copy is not created again: {plan:?}"
        );
        let status = |owned: &[&Task]| status_word(&job, owned, &summarize(&job, owned));
        assert_eq!(status(&[&done, &failed]), "failed");
        let finished = copy(&job, 1, State::Completed);
        assert_eq!(status(&[&done, &finished]), "complete");
    }

    #[test]
    fn a_stopped_job_stops_every_live_copy() {
        let mut job = record(JobType::Service, Some(2));
        let tasks = [copy(&job, 0, State::Running), copy(&job, 1, State::Pending)];
        job.stopped = true;
        let owned: Vec<&Task> = tasks.iter().collect();
        let plan = plan(&job, &[], &owned);
        assert_eq!(plan.stop.len(), 2);
        assert!(plan.create.is_empty());
    }

    #[test]
    fn a_changed_template_replaces_copies_under_the_same_name() {
        let job = record(JobType::Service, Some(1));
        let old = copy(&job, 0, State::Running);
        let mut changed = job.clone();
        changed.job.groups[0].task.spec.memory = 64 << 20;
        changed.version = 2;
        let plan = plan(&changed, &[], &[&old]);
        assert_eq!(plan.stop.len(), 1);
        assert_eq!(names(&plan.create), ["web.api[0]"]);
        assert_eq!(plan.create[0].spec.memory, 64 << 20);
    }

    fn node(name: &str, ready: bool, zone: &str) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            ready,
            labels: std::sync::Arc::new([("zone".to_string(), zone.to_string())].into()),
        }
    }

    #[test]
    fn a_system_job_runs_one_copy_on_every_matching_ready_node() {
        let mut job = record(JobType::System, None);
        job.job.constraints.push(Constraint {
            attribute: "label.zone".into(),
            operator: Operator::Equal,
            value: "eu".into(),
        });
        let nodes = [
            node("w1", true, "eu"),
            node("w2", true, "us"),
            node("w3", false, "eu"),
        ];
        let plan1 = plan(&job, &nodes, &[]);
        assert_eq!(plan1.create.len(), 1);
        assert_eq!(pinned_node(&plan1.create[0]), Some("w1"));
        // w3 becomes ready: it gets its copy; w1's stays.
        let mut on_w1 = plan1.create[0].clone();
        on_w1.status.state = State::Running;
        let nodes = [
            node("w1", true, "eu"),
            node("w2", true, "us"),
            node("w3", true, "eu"),
        ];
        let plan2 = plan(&job, &nodes, &[&on_w1]);
        assert_eq!(plan2.keep, [on_w1.id]);
        assert_eq!(plan2.create.len(), 1);
        assert_eq!(pinned_node(&plan2.create[0]), Some("w3"));
        assert_ne!(plan2.create[0].spec.index, on_w1.spec.index);
        // w1's labels change: its copy goes.
        let nodes = [node("w1", true, "us")];
        let plan3 = plan(&job, &nodes, &[&on_w1]);
        assert_eq!(plan3.stop.len(), 1);
        assert!(
            plan3.stop[0].reason.contains("no longer matches"),
            "{plan3:?}"
        );
    }
}
