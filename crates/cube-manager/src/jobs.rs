//! The job transformer: from a job, the nodes and the tasks the job owns, what to create and
//! what to stop so that the job's copies are what it asks for. Pure: no IO, no clock, no
//! locks; the job controller carries the plan out, and `POST /jobs/plan` shows it unexecuted.
//!
//! Ownership: a task belongs to a job when its `Job` field names it; a copy is identified by
//! its group and index (`service`, `batch`) or its group and node (`system`, pinned to its
//! node by a `node.name` constraint). A plan never touches a task another job or no job owns.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use cube_types::deployment::Deployment;
use cube_types::job::{JobRecord, JobType, Operator};
use cube_types::{State, Task};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::copies::{copy_from, has_current_spec, template_of};
pub use crate::copies::{copy_of, is_live};
use crate::rollout::{self, Mode};

/// What the transformer reads of a node (its reconciliation mask): the name, whether it takes
/// work, its labels, whether the operator lets it take new work and whether it drains. A
/// heartbeat that moves only the node's figures changes none of this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    pub name: String,
    pub ready: bool,
    /// Shared with the node registry: a look copies a pointer, not the map.
    pub labels: std::sync::Arc<BTreeMap<String, String>>,
    /// New copies may go there (`cube node eligibility`); a drain makes it `false`.
    pub eligible: bool,
    /// `Some` while the node drains: its deadline, if it has one.
    pub drain: Option<Option<DateTime<Utc>>>,
}

impl NodeFacts {
    /// A ready, eligible node that does not drain.
    pub fn ready(name: &str, labels: std::sync::Arc<BTreeMap<String, String>>) -> NodeFacts {
        NodeFacts {
            name: name.to_string(),
            ready: true,
            labels,
            eligible: true,
            drain: None,
        }
    }
}

/// The draining nodes by name, with their deadline if they have one.
type Draining<'a> = BTreeMap<&'a str, Option<DateTime<Utc>>>;

/// Everything the job transformer reads for one look at one job.
#[derive(Debug, Clone, Copy)]
pub struct JobLook<'a> {
    pub record: &'a JobRecord,
    /// The job's last stored deployment (service jobs).
    pub deployment: Option<&'a Deployment>,
    /// The newest stable version before the record's: where `AutoRevert` goes back to.
    pub last_stable: Option<u64>,
    pub nodes: &'a [NodeFacts],
    /// Every task the job owns.
    pub owned: &'a [&'a Task],
    /// Deadlines and `MinHealthyTime` are measured against it.
    pub now: DateTime<Utc>,
}

impl<'a> JobLook<'a> {
    /// A look with no deployment stored yet and no stable version.
    pub fn new(
        record: &'a JobRecord,
        nodes: &'a [NodeFacts],
        owned: &'a [&'a Task],
        now: DateTime<Utc>,
    ) -> JobLook<'a> {
        JobLook {
            record,
            deployment: None,
            last_stable: None,
            nodes,
            owned,
            now,
        }
    }
}

/// What a job's copies need: what the controller carries out (`POST /jobs/plan` shows it
/// as a `PlanView`, the new copies named rather than written out).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobPlan {
    /// New copies, as the tasks to submit.
    pub create: Vec<Task>,
    /// Copies to stop, with why.
    pub stop: Vec<PlannedStop>,
    /// Copies that stay as they are.
    pub keep: Vec<Uuid>,
    /// The job's deployment as it is to be stored, when this look started, moved or ended
    /// it (nothing when it is as it was).
    pub deployment: Option<Deployment>,
    /// The version to go back to: the deployment failed with `AutoRevert`.
    pub revert_to: Option<u64>,
    /// When to look again even if nothing else happens (a deadline, `MinHealthyTime`).
    pub look_again_at: Option<DateTime<Utc>>,
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
    /// Whether the plan creates and stops nothing (it may still move the deployment).
    pub fn is_empty(&self) -> bool {
        self.create.is_empty() && self.stop.is_empty()
    }
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

/// Whether replacing `task` with `wanted` would change anything it runs. A replacement by an
/// identical copy is never carried out: were [`has_current_spec`] ever to disagree with
/// [`copy_of`] again, the job would otherwise stop and create copies in a loop.
fn replacement_changes(task: &Task, wanted: &Task) -> bool {
    let changes = !task.same_spec_except(wanted, &["Name", "Index"]);
    if !changes {
        tracing::error!(
            task = %task.id,
            name = %task.name,
            "a copy read as changed has the job's spec; kept (a defect in the spec comparison)"
        );
    }
    changes
}

/// The plan for one look at one job: what to create and stop, and (service jobs) how its
/// deployment stands.
pub fn plan(look: &JobLook) -> JobPlan {
    let mut plan = JobPlan::default();
    let record = look.record;
    let job = &record.job;
    let owned = look.owned;
    let mut stop = |task: &Task, reason: String| {
        plan_stop(&mut plan.stop, task, reason);
    };
    if record.stopped {
        for task in owned.iter().filter(|task| is_live(task)) {
            stop(task, format!("job {} was stopped", job.name));
        }
        plan.deployment = rollout::cancelled(
            look.deployment,
            format!("job {} was stopped", job.name),
            look.now,
        );
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
    // Every version of a service job is rolled out by its deployment.
    let rollout = (job.job_type == JobType::Service)
        .then(|| rollout::assess(record, look.deployment, look.last_stable, owned, look.now));
    let draining: Draining = look
        .nodes
        .iter()
        .filter_map(|node| node.drain.map(|deadline| (node.name.as_str(), deadline)))
        .collect();
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
                look.nodes,
                &mine,
                &mut keep,
                &mut create,
                &mut stops,
            ),
            JobType::Service | JobType::Batch => {
                let mode = rollout
                    .as_ref()
                    .map_or(Mode::AtOnce, |rollout| rollout.mode_of(&group.name));
                plan_counted(
                    record,
                    group_index,
                    &mine,
                    mode,
                    Moving {
                        draining: &draining,
                        now: look.now,
                    },
                    &mut keep,
                    &mut create,
                    &mut stops,
                )
            }
        }
    }
    for (task, reason) in stops {
        stop(task, reason);
    }
    plan.keep = keep;
    plan.create = create;
    if let Some(rollout) = rollout {
        plan.revert_to = rollout.revert_to;
        plan.look_again_at = rollout.look_again_at;
        if rollout.changed {
            plan.deployment = Some(rollout.deployment);
        }
    }
    // A drain's deadline stops the copies still on its node: look again then.
    let deadlines = owned
        .iter()
        .filter(|task| is_moving(task, &draining))
        .filter_map(|task| {
            draining
                .get(task.status.node_name.as_str())
                .copied()
                .flatten()
        })
        .filter(|deadline| *deadline > look.now);
    for deadline in deadlines {
        plan.look_again_at = Some(plan.look_again_at.map_or(deadline, |at| at.min(deadline)));
    }
    plan
}

/// How a look treats the copies on draining nodes ([`plan_counted`]).
#[derive(Clone, Copy)]
struct Moving<'a, 'b> {
    draining: &'a Draining<'b>,
    now: DateTime<Utc>,
}

/// A copy a drain moves: it runs (or is on its way) on a draining node, and is meant to.
fn is_moving(task: &Task, draining: &Draining) -> bool {
    matches!(task.status.state, State::Scheduled | State::Running)
        && task.spec.desired_state == State::Running
        && draining.contains_key(task.status.node_name.as_str())
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
/// highest indexes first, and copies not yet running before running ones. `mode` says how
/// copies whose spec changed are replaced: at once, not at all, beside canaries, or a few
/// at a time ([`Mode`]).
///
/// A copy on a draining node does not count: the group makes a new copy elsewhere as if it
/// were missing, and the old copy is stopped only once enough new ones are healthy that
/// fewer than `Count` never run (or once the drain's deadline passed).
#[allow(clippy::too_many_arguments)]
fn plan_counted<'a>(
    record: &JobRecord,
    group_index: usize,
    mine: &[&'a Task],
    mode: Mode,
    moving: Moving,
    keep: &mut Vec<Uuid>,
    create: &mut Vec<Task>,
    stops: &mut Vec<(&'a Task, String)>,
) {
    let group = &record.job.groups[group_index];
    let count = group.count.unwrap_or(0) as usize;
    let batch = record.job.job_type == JobType::Batch;
    // Copies that count: the live ones, and for a batch job those that completed; copies a
    // drain moves apart.
    let (mut on_draining, counted): (Vec<&Task>, Vec<&Task>) = mine
        .iter()
        .copied()
        .filter(|task| is_live(task) || (batch && is_complete(task)))
        .partition(|task| is_moving(task, moving.draining));
    let template = template_of(record, group_index, mine);
    // One copy per index: an extra one for an index is a duplicate, and goes. In the canary
    // phase the rule is per version: a canary takes the index of the old copy it will
    // replace (`canary_indexes`), so an old copy and its canary share an index and both
    // stay. Outside it, the copy of the job's version stays (a promoted canary: the old copy
    // of its index goes; after a revert, the canary goes), then the earlier one; when the
    // deployment failed (frozen), the earlier one, so that the old copies run on. Keys read
    // once each (`sort_by_cached_key`): the tasks lie apart in memory, and a sort that read
    // them at every comparison spent most of a no-change look on cache misses.
    let canary_phase = matches!(mode, Mode::Canary { .. });
    let current_first = !matches!(mode, Mode::Frozen);
    let mut counted: Vec<(&Task, bool)> = counted
        .into_iter()
        .map(|task| (task, has_current_spec(task, &template)))
        .collect();
    counted.sort_by_cached_key(|(task, current)| {
        (
            task.spec.index,
            current_first && !current,
            task.status.created_time,
            task.id,
        )
    });
    let mut seen: BTreeMap<(Option<u32>, bool), bool> = BTreeMap::new();
    let mut unique = Vec::new();
    for (task, current) in counted {
        let key = (task.spec.index, canary_phase && current);
        match seen.get(&key) {
            None => {
                seen.insert(key, current);
                unique.push(task);
            }
            Some(_) if !is_live(task) => {}
            Some(&holder_current) if holder_current && !current => stops.push((
                task,
                format!(
                    "job {} version {} runs in its place (a promoted canary took its index)",
                    record.job.name, record.version
                ),
            )),
            Some(_) => stops.push((task, format!("a second copy of {}", task.name))),
        }
    }
    let (kept, extra, wanted) = choose_kept(unique, &template, count, mode);
    for task in extra {
        if !is_live(task) {
            continue;
        }
        let reason = if has_current_spec(task, &template) || matches!(mode, Mode::AtOnce) {
            format!("the group is scaled to {count}")
        } else {
            format!(
                "the group keeps {count} copies, those of job {} version {} first",
                record.job.name, record.version
            )
        };
        stops.push((task, reason));
    }
    let used: BTreeSet<u32> = kept.iter().filter_map(|task| task.spec.index).collect();
    // Old copies to replace now: those not running first (they serve nobody), then by index.
    let budget = match mode {
        Mode::AtOnce => usize::MAX,
        Mode::Frozen | Mode::Canary { .. } => 0,
        Mode::Rolling { slots } => slots,
    };
    let mut old: Vec<&Task> = kept
        .iter()
        .copied()
        .filter(|task| !is_complete(task) && !has_current_spec(task, &template))
        .collect();
    old.sort_by_cached_key(|task| (task.status.state == State::Running, task.spec.index));
    let replaced: BTreeSet<Uuid> = old.iter().take(budget).map(|task| task.id).collect();
    for task in &kept {
        if is_complete(task) {
            continue;
        }
        if !replaced.contains(&task.id) {
            keep.push(task.id);
            continue;
        }
        let wanted = copy_from(
            &template,
            &record.job,
            group_index,
            task.spec.index.unwrap_or(0),
        );
        if !replacement_changes(task, &wanted) {
            keep.push(task.id);
            continue;
        }
        stops.push((
            task,
            format!(
                "job {} version {} changed its spec",
                record.job.name, record.version
            ),
        ));
        create.push(copy_with_name(wanted, task));
    }
    // Copies on draining nodes: each stops once another copy runs healthy in its stead, so
    // that the healthy copies elsewhere and the ones left here are never fewer than `Count`.
    let healthy_elsewhere = kept
        .iter()
        .filter(|task| !replaced.contains(&task.id) && task.is_healthy())
        .count();
    let mut may_stop = (healthy_elsewhere + on_draining.len()).saturating_sub(count);
    on_draining.sort_by_key(|task| std::cmp::Reverse(task.spec.index));
    for task in on_draining {
        let node = task.status.node_name.as_str();
        let deadline = moving.draining.get(node).copied().flatten();
        if deadline.is_some_and(|deadline| deadline <= moving.now) {
            stops.push((task, format!("node {node} drains and its deadline passed")));
        } else if may_stop > 0 {
            may_stop -= 1;
            stops.push((
                task,
                format!("node {node} drains: a copy runs healthy elsewhere"),
            ));
        } else {
            keep.push(task.id);
        }
    }
    // A batch copy that gave up fails the job: it is not created again.
    if batch && mine.iter().any(|task| gave_up(task)) {
        return;
    }
    let missing = wanted.saturating_sub(kept.len());
    let indexes: Vec<u32> = if canary_phase {
        canary_indexes(&kept, &template, count, missing)
    } else {
        (0u32..)
            .filter(|index| !used.contains(index))
            .take(missing)
            .collect()
    };
    for index in indexes {
        create.push(copy_from(&template, &record.job, group_index, index));
    }
}

/// The indexes `missing` new canaries take: first an index below `count` that no copy holds,
/// then the index of an old copy that no canary shares yet, the highest first (the old copy
/// the canary will replace), then any free index. So once the canaries are promoted and the
/// old copies of their indexes go, a group of `Count` N holds exactly the indexes 0..N-1; a
/// canary at the next free index left a gap (0, 1, 3). Of the ways to close it, this one
/// keeps every copy's index fixed for its life (a task's spec, its name included, never
/// changes; re-indexing a promoted canary would mean replacing it) and needs no rule beyond
/// "one copy per index, per version while the canaries wait" in `plan_counted`.
fn canary_indexes(kept: &[&Task], template: &Task, count: usize, missing: usize) -> Vec<u32> {
    let held: BTreeSet<u32> = kept.iter().filter_map(|task| task.spec.index).collect();
    let with_canary: BTreeSet<u32> = kept
        .iter()
        .filter(|task| has_current_spec(task, template))
        .filter_map(|task| task.spec.index)
        .collect();
    let holes = (0u32..).take(count).filter(|index| !held.contains(index));
    let shared = held
        .iter()
        .rev()
        .copied()
        .filter(|index| !with_canary.contains(index));
    let above = (0u32..).filter(|index| !held.contains(index) && *index as usize >= count);
    holes.chain(shared).chain(above).take(missing).collect()
}

/// Which copies of a group stay (for now), which go as extras, and how many copies the
/// group wants live in all. Outside the canary phase: `count` copies, completed first, then
/// running ones (new before old while a deployment runs, so that a promoted canary stays
/// and an old copy goes), then by index. In the canary phase: up to `count` old copies and
/// `canaries` new ones beside them.
fn choose_kept<'a>(
    unique: Vec<&'a Task>,
    template: &Task,
    count: usize,
    mode: Mode,
) -> (Vec<&'a Task>, Vec<&'a Task>, usize) {
    if let Mode::Canary { canaries } = mode {
        let (mut new, mut old): (Vec<&Task>, Vec<&Task>) = unique
            .into_iter()
            .partition(|task| has_current_spec(task, template));
        let by_running = |task: &&Task| (task.status.state != State::Running, task.spec.index);
        new.sort_by_cached_key(by_running);
        old.sort_by_cached_key(by_running);
        let old_extra = old.split_off(count.min(old.len()));
        let new_extra = new.split_off(canaries.min(new.len()));
        let wanted = old.len() + canaries;
        let mut kept = old;
        kept.extend(new);
        let mut extra = old_extra;
        extra.extend(new_extra);
        return (kept, extra, wanted);
    }
    let rolling = matches!(mode, Mode::Rolling { .. });
    let mut unique = unique;
    unique.sort_by_cached_key(|task| {
        let rank = if is_complete(task) {
            0
        } else if task.status.state == State::Running {
            1
        } else {
            2
        };
        let old = rolling && !has_current_spec(task, template);
        (rank, old, task.spec.index)
    });
    let extra = unique.split_off(count.min(unique.len()));
    // The highest indexes go first.
    let mut extra = extra;
    extra.sort_by_key(|task| std::cmp::Reverse(task.spec.index));
    (unique, extra, count)
}

/// How many live copies of `record`'s counted groups have a spec other than their group's
/// template now: what a new version replaces (a service job's deployment, a few at a
/// time).
pub fn changed_copies(record: &JobRecord, owned: &[&Task]) -> usize {
    record
        .job
        .groups
        .iter()
        .enumerate()
        .map(|(group_index, group)| {
            let template = template_of(record, group_index, owned);
            owned
                .iter()
                .filter(|task| task.spec.group == group.name && is_live(task))
                .filter(|task| !has_current_spec(task, &template))
                .count()
        })
        .sum()
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
    let template = template_of(record, group_index, mine);
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
                let wanted = (!has_current_spec(task, &template)).then(|| {
                    copy_of(
                        record,
                        group_index,
                        task.spec.index.unwrap_or(0),
                        Some(node),
                    )
                });
                match wanted {
                    Some(wanted) if replacement_changes(task, &wanted) => {
                        stops.push((
                            task,
                            format!(
                                "job {} version {} changed its spec",
                                job.name, record.version
                            ),
                        ));
                        create.push(copy_with_name(wanted, task));
                    }
                    _ => keep.push(task.id),
                }
            }
        }
    }
    let mut free = (0u32..).filter(|index| !used.contains(index));
    for node in nodes
        .iter()
        .filter(|node| node.ready && node.eligible && matches(node))
    {
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
    // Every copy meant to run that has not ended counts (in a canary phase an old copy and
    // its canary share an index, and both run); an index none of those holds is spoken for
    // by its newest copy (a completed or failed copy not replaced since).
    let on = |task: &&&Task| {
        task.spec.desired_state == State::Running && !task.status.state.is_terminal()
    };
    let held: BTreeSet<_> = owned
        .iter()
        .filter(on)
        .map(|task| summary_key(task))
        .collect();
    let mut newest: BTreeMap<(&str, Option<u32>, Option<&str>), &Task> = BTreeMap::new();
    for task in owned.iter().filter(|task| !on(task)) {
        let key = summary_key(task);
        if held.contains(&key) {
            continue;
        }
        let replace = newest.get(&key).is_none_or(|known| {
            (known.status.created_time, known.id) < (task.status.created_time, task.id)
        });
        if replace {
            newest.insert(key, task);
        }
    }
    let counted = owned.iter().filter(on).copied().chain(newest.into_values());
    for task in counted {
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

/// The copies of one group's index (or one system copy's node) in [`summarize`].
fn summary_key(task: &Task) -> (&str, Option<u32>, Option<&str>) {
    (task.spec.group.as_str(), task.spec.index, pinned_node(task))
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
    use cube_types::job::{Constraint, Group, Job};

    use super::*;

    fn record(job_type: JobType, count: Option<u32>) -> JobRecord {
        JobRecord {
            job: Job {
                name: "web".into(),
                job_type,
                priority: 50,
                constraints: Vec::new(),
                owner: String::new(),
                project: String::new(),
                queue_timeout: None,
                groups: vec![Group {
                    name: "api".into(),
                    count,
                    constraints: Vec::new(),
                    task: Task::new("", "cube-sample:latest"),
                    update: None,
                }],
            },
            version: 1,
            submit_time: None,
            stopped: false,
            promoted: false,
            revert_of: None,
        }
    }

    /// The plan with no deployment stored yet, now.
    fn plan(record: &JobRecord, nodes: &[NodeFacts], owned: &[&Task]) -> JobPlan {
        super::plan(&JobLook::new(record, nodes, owned, Utc::now()))
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
    fn the_copies_of_one_version_share_one_spec_and_are_each_what_copy_of_makes() {
        let job = record(JobType::Service, Some(3));
        let plan = plan(&job, &[], &[]);
        let [first, rest @ ..] = plan.create.as_slice() else {
            panic!("no copies planned");
        };
        assert!(
            rest.iter()
                .all(|copy| copy.spec.shares_body_with(&first.spec))
        );
        for copy in &plan.create {
            let index = copy.spec.index.unwrap();
            let made = copy_of(&job, 0, index, None);
            assert_eq!(copy.name, made.name);
            assert!(copy.same_spec_except(&made, &[]), "copy {index}");
        }
        // A change to one copy is its own.
        let mut changed = first.clone();
        changed.spec.image = "cube-sample:v2".into();
        assert!(!changed.spec.shares_body_with(&first.spec));
        assert_eq!(first.spec.image, "cube-sample:latest");
    }

    #[test]
    fn the_template_shares_the_body_of_a_current_copy_and_still_tells_an_old_one() {
        let v1 = versioned(3, 1, Default::default());
        let v2 = versioned(3, 2, Default::default());
        // Copies of v1 made in another look (each its own body), the first one old.
        let copies = [
            healthy_copy(&v1, 0),
            healthy_copy(&v2, 1),
            healthy_copy(&v2, 2),
        ];
        let owned: Vec<&Task> = copies.iter().collect();
        let template = template_of(&v2, 0, &owned);
        assert!(template.spec.shares_body_with(&copies[1].spec));
        assert!(!template.spec.shares_body_with(&copies[0].spec));
        assert!(!has_current_spec(&copies[0], &template));
        assert!(has_current_spec(&copies[1], &template));
        // The third copy's body is equal but its own: compared field by field, still current.
        assert!(!template.spec.shares_body_with(&copies[2].spec));
        assert!(has_current_spec(&copies[2], &template));
        // A system copy's pin is in its body: never shared with the template, still current.
        let system = record(JobType::System, None);
        let pinned = copy_of(&system, 0, 0, Some("node-1"));
        let template = template_of(&system, 0, &[&pinned]);
        assert!(!template.spec.shares_body_with(&pinned.spec));
        assert!(has_current_spec(&pinned, &template));
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
            eligible: true,
            drain: None,
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

    /// A service job of `count` at `version` (its template runs `v<version>`), with `update`.
    fn versioned(count: u32, version: u64, update: cube_types::job::Update) -> JobRecord {
        let mut job = record(JobType::Service, Some(count));
        job.version = version;
        job.job.groups[0].task.spec.cmd = vec![format!("v{version}")];
        job.job.groups[0].update = Some(update);
        job
    }

    fn healthy_copy(record: &JobRecord, index: u32) -> Task {
        let mut task = copy(record, index, State::Running);
        let long_ago = Utc::now() - chrono::Duration::hours(1);
        task.status.created_time = Some(long_ago);
        task.status.healthy_since = Some(long_ago);
        task
    }

    #[test]
    fn a_rolling_update_replaces_max_parallel_copies_under_their_names_and_keeps_the_rest() {
        let update = cube_types::job::Update {
            max_parallel: Some(2),
            ..Default::default()
        };
        let v1 = versioned(4, 1, update.clone());
        let old: Vec<Task> = (0..4).map(|i| healthy_copy(&v1, i)).collect();
        let owned: Vec<&Task> = old.iter().collect();
        let v2 = versioned(4, 2, update);
        let planned = plan(&v2, &[], &owned);
        assert_eq!(names(&planned.create), ["web.api[0]", "web.api[1]"]);
        assert_eq!(planned.stop.len(), 2);
        assert_eq!(planned.keep.len(), 2, "two old copies run on");
        let deployment = planned.deployment.expect("a deployment starts");
        assert_eq!(deployment.version, 2);
        assert!(planned.look_again_at.is_some());
    }

    #[test]
    fn a_scale_with_the_same_template_replaces_nothing_and_only_adds_copies() {
        let v1 = versioned(2, 1, Default::default());
        let old: Vec<Task> = (0..2).map(|i| healthy_copy(&v1, i)).collect();
        let owned: Vec<&Task> = old.iter().collect();
        let mut scaled = v1.clone();
        scaled.job.groups[0].count = Some(3);
        let planned = plan(&scaled, &[], &owned);
        assert_eq!(names(&planned.create), ["web.api[2]"]);
        assert!(planned.stop.is_empty());
    }

    #[test]
    fn canaries_start_beside_the_old_copies_and_after_promotion_old_copies_make_room() {
        let update = cube_types::job::Update {
            canary: Some(1),
            ..Default::default()
        };
        let v1 = versioned(3, 1, update.clone());
        let old: Vec<Task> = (0..3).map(|i| healthy_copy(&v1, i)).collect();
        let owned: Vec<&Task> = old.iter().collect();
        let mut v2 = versioned(3, 2, update);
        let first = plan(&v2, &[], &owned);
        assert_eq!(
            names(&first.create),
            ["web.api[2]"],
            "a canary beside the three, at the index of the old copy it will replace"
        );
        assert!(first.stop.is_empty());
        let deployment = first.deployment.expect("a deployment");
        let mut canary = first.create[0].clone();
        canary.status.state = State::Running;
        canary.status.created_time = Some(Utc::now());
        canary.status.healthy_since = Some(Utc::now() - chrono::Duration::seconds(30));
        let owned: Vec<&Task> = old.iter().chain([&canary]).collect();
        let mut look = JobLook::new(&v2, &[], &owned, Utc::now());
        look.deployment = Some(&deployment);
        let paused = super::plan(&look);
        assert!(
            paused.is_empty(),
            "nothing replaced before promotion: {paused:?}"
        );
        let paused = paused.deployment.expect("the deployment pauses");
        assert_eq!(
            paused.state,
            cube_types::deployment::DeploymentState::Paused
        );
        v2.promoted = true;
        let mut look = JobLook::new(&v2, &[], &owned, Utc::now());
        look.deployment = Some(&paused);
        let promoted = super::plan(&look);
        // The canary stays; one old copy goes to make room, one more is replaced.
        let stopped: Vec<&str> = promoted
            .stop
            .iter()
            .map(|stop| stop.name.as_str())
            .collect();
        assert_eq!(stopped.len(), 2, "{promoted:?}");
        assert!(stopped.contains(&"web.api[2]"), "{stopped:?}");
        assert!(
            promoted.stop.iter().any(|stop| stop.id == old[2].id),
            "the old copy of the canary's index goes: {promoted:?}"
        );
        assert_eq!(promoted.create.len(), 1);
        assert!(promoted.keep.contains(&canary.id));
    }

    /// Carries plans out until one changes nothing: a stopped copy is gone, a new one runs
    /// and has been healthy long enough, and the deployment a plan stores is the next
    /// look's. Returns the copies left and the last deployment.
    fn carry_out(
        record: &JobRecord,
        mut tasks: Vec<Task>,
        mut deployment: Option<Deployment>,
    ) -> (Vec<Task>, Option<Deployment>) {
        for _ in 0..100 {
            let owned: Vec<&Task> = tasks.iter().collect();
            let mut look = JobLook::new(record, &[], &owned, Utc::now());
            look.deployment = deployment.as_ref();
            let planned = super::plan(&look);
            if planned.deployment.is_some() {
                deployment = planned.deployment.clone();
            }
            if planned.create.is_empty() && planned.stop.is_empty() {
                return (tasks, deployment);
            }
            let stopped: BTreeSet<Uuid> = planned.stop.iter().map(|stop| stop.id).collect();
            tasks.retain(|task| !stopped.contains(&task.id));
            for mut made in planned.create {
                made.status.state = State::Running;
                made.status.created_time = Some(Utc::now() - chrono::Duration::seconds(60));
                made.status.healthy_since = made.status.created_time;
                tasks.push(made);
            }
        }
        panic!("the plans never settled: {tasks:?}");
    }

    fn indexes(tasks: &[Task]) -> Vec<u32> {
        let mut indexes: Vec<u32> = tasks.iter().filter_map(|task| task.spec.index).collect();
        indexes.sort_unstable();
        indexes
    }

    /// A group of `count` at version 1, updated to version 2 with `canaries` canaries,
    /// promoted and carried out to the end: the copies left, and those of the canary phase.
    fn canary_cycle(count: u32, canaries: u32, max_parallel: u32) -> (Vec<Task>, Vec<Task>) {
        let update = cube_types::job::Update {
            canary: Some(canaries),
            max_parallel: Some(max_parallel),
            min_healthy_time: Some(std::time::Duration::ZERO),
            ..Default::default()
        };
        let v1 = versioned(count, 1, update.clone());
        let old: Vec<Task> = (0..count).map(|i| healthy_copy(&v1, i)).collect();
        let mut v2 = versioned(count, 2, update);
        let (waiting, paused) = carry_out(&v2, old, None);
        assert_eq!(
            paused.as_ref().map(|d| d.state),
            Some(cube_types::deployment::DeploymentState::Paused),
            "{paused:?}"
        );
        v2.promoted = true;
        let (done, finished) = carry_out(&v2, waiting.clone(), paused);
        assert_eq!(
            finished.map(|d| d.state),
            Some(cube_types::deployment::DeploymentState::Successful)
        );
        let template = copy_of(&v2, 0, 0, None);
        assert!(done.iter().all(|task| has_current_spec(task, &template)));
        (done, waiting)
    }

    #[test]
    fn after_a_canary_rollout_a_group_of_count_n_holds_the_indexes_0_to_n_minus_1() {
        let (done, waiting) = canary_cycle(3, 1, 1);
        // The canary shares the index of the old copy it will replace, the highest.
        assert_eq!(indexes(&waiting), [0, 1, 2, 2], "{waiting:?}");
        assert_eq!(
            indexes(&done),
            [0, 1, 2],
            "no gap (it was 0, 1, 3): {done:?}"
        );
        let (done, waiting) = canary_cycle(4, 2, 2);
        assert_eq!(indexes(&waiting), [0, 1, 2, 2, 3, 3], "{waiting:?}");
        assert_eq!(indexes(&done), [0, 1, 2, 3], "{done:?}");
    }

    #[test]
    fn in_the_canary_phase_a_missing_copy_takes_its_index_and_the_canary_shares_one() {
        let update = cube_types::job::Update {
            canary: Some(1),
            ..Default::default()
        };
        let v1 = versioned(3, 1, update.clone());
        // Index 1 is missing (its copy gave up and is being replaced, say).
        let old: Vec<Task> = [0, 2].into_iter().map(|i| healthy_copy(&v1, i)).collect();
        let owned: Vec<&Task> = old.iter().collect();
        let v2 = versioned(3, 2, update);
        let first = plan(&v2, &[], &owned);
        // The missing copy is made new (at its index), and the canary shares index 2.
        assert_eq!(names(&first.create), ["web.api[1]", "web.api[2]"]);
        assert!(first.stop.is_empty(), "{first:?}");
    }

    #[test]
    fn a_failed_canary_goes_and_the_old_copy_of_its_index_stays() {
        let update = cube_types::job::Update {
            canary: Some(1),
            auto_revert: Some(true),
            ..Default::default()
        };
        let v1 = versioned(3, 1, update.clone());
        let old: Vec<Task> = (0..3).map(|i| healthy_copy(&v1, i)).collect();
        let v2 = versioned(3, 2, update);
        let owned: Vec<&Task> = old.iter().collect();
        let first = plan(&v2, &[], &owned);
        let mut canary = first.create[0].clone();
        canary.status.state = State::Running;
        canary.status.created_time = Some(Utc::now());
        let owned: Vec<&Task> = old.iter().chain([&canary]).collect();
        // The deployment failed: frozen, the canary goes, the old copy of index 2 stays.
        let mut failed = first.deployment.expect("a deployment");
        failed.state = cube_types::deployment::DeploymentState::Failed;
        let mut look = JobLook::new(&v2, &[], &owned, Utc::now());
        look.deployment = Some(&failed);
        let frozen = super::plan(&look);
        assert_eq!(frozen.stop.len(), 1, "{frozen:?}");
        assert_eq!(frozen.stop[0].id, canary.id, "{frozen:?}");
        assert!(frozen.create.is_empty(), "{frozen:?}");
        // Reverted (version 3 is version 1's spec): the same.
        let mut v3 = versioned(3, 3, Default::default());
        v3.job.groups[0].task.spec.cmd = vec!["v1".to_string()];
        v3.revert_of = Some(1);
        let reverted = plan(&v3, &[], &owned);
        assert_eq!(reverted.stop.len(), 1, "{reverted:?}");
        assert_eq!(reverted.stop[0].id, canary.id, "{reverted:?}");
        assert!(reverted.create.is_empty(), "{reverted:?}");
        assert_eq!(reverted.keep.len(), 3);
    }

    #[test]
    fn a_failed_deployment_replaces_nothing_more() {
        let update = cube_types::job::Update {
            min_healthy_time: Some(std::time::Duration::ZERO),
            ..Default::default()
        };
        let v1 = versioned(3, 1, update.clone());
        let old: Vec<Task> = (1..3).map(|i| healthy_copy(&v1, i)).collect();
        let v2 = versioned(3, 2, update);
        let started = plan(&v2, &[], &[]).deployment.expect("a deployment");
        let mut bad = copy(&v2, 0, State::Failed);
        bad.status.created_time = Some(Utc::now());
        let owned: Vec<&Task> = old.iter().chain([&bad]).collect();
        let mut look = JobLook::new(&v2, &[], &owned, Utc::now());
        look.deployment = Some(&started);
        let planned = super::plan(&look);
        assert!(planned.stop.is_empty(), "{planned:?}");
        assert_eq!(planned.keep.len(), 2, "the old copies run on");
        // The copy that gave up is replaced, as any service copy that ends for good is:
        // a failed deployment stops replacing old copies, not keeping the count.
        assert_eq!(names(&planned.create), ["web.api[0]"]);
        assert_eq!(
            planned.deployment.map(|d| d.state),
            Some(cube_types::deployment::DeploymentState::Failed)
        );
    }

    #[test]
    fn stopping_a_job_cancels_its_running_deployment() {
        let v1 = versioned(1, 1, Default::default());
        let started = plan(&v1, &[], &[]).deployment.expect("a deployment");
        let mut stopped = v1.clone();
        stopped.stopped = true;
        let mut look = JobLook::new(&stopped, &[], &[], Utc::now());
        look.deployment = Some(&started);
        let planned = super::plan(&look);
        assert_eq!(
            planned.deployment.map(|d| d.state),
            Some(cube_types::deployment::DeploymentState::Cancelled)
        );
    }

    /// Two healthy copies on w1, which drains; `replacements` new copies elsewhere, healthy
    /// or not.
    fn drained(healthy_replacements: usize, starting: usize) -> (JobRecord, Vec<Task>) {
        let job = record(JobType::Service, Some(2));
        let mut tasks = Vec::new();
        for index in 0..2 {
            let mut old = healthy_copy(&job, index);
            old.status.node_name = "w1".into();
            tasks.push(old);
        }
        for index in 0..(healthy_replacements + starting) as u32 {
            let mut new = copy(&job, index, State::Running);
            new.status.node_name = "w2".into();
            if index as usize >= healthy_replacements {
                new.status.state = State::Scheduled;
            }
            tasks.push(new);
        }
        (job, tasks)
    }

    fn draining_w1() -> Vec<NodeFacts> {
        let mut w1 = node("w1", true, "eu");
        w1.eligible = false;
        w1.drain = Some(None);
        vec![w1, node("w2", true, "eu")]
    }

    #[test]
    fn a_drain_makes_new_copies_first_and_stops_no_old_one_before_they_are_healthy() {
        let (job, tasks) = drained(0, 0);
        let owned: Vec<&Task> = tasks.iter().collect();
        let planned = plan(&job, &draining_w1(), &owned);
        assert_eq!(names(&planned.create), ["web.api[0]", "web.api[1]"]);
        assert!(planned.stop.is_empty(), "{planned:?}");
        let (job, tasks) = drained(0, 2);
        let owned: Vec<&Task> = tasks.iter().collect();
        let planned = plan(&job, &draining_w1(), &owned);
        assert!(
            planned.is_empty(),
            "new copies not healthy yet: {planned:?}"
        );
    }

    #[test]
    fn a_drain_stops_an_old_copy_for_each_new_one_that_is_healthy() {
        let (job, tasks) = drained(1, 1);
        let owned: Vec<&Task> = tasks.iter().collect();
        let planned = plan(&job, &draining_w1(), &owned);
        assert!(planned.create.is_empty());
        assert_eq!(planned.stop.len(), 1, "{planned:?}");
        assert!(planned.stop[0].reason.contains("drains"), "{planned:?}");
        let (job, tasks) = drained(2, 0);
        let owned: Vec<&Task> = tasks.iter().collect();
        assert_eq!(plan(&job, &draining_w1(), &owned).stop.len(), 2);
    }

    #[test]
    fn a_drains_deadline_stops_what_is_left_and_is_looked_at_again() {
        let (job, tasks) = drained(0, 2);
        let owned: Vec<&Task> = tasks.iter().collect();
        let mut nodes = draining_w1();
        nodes[0].drain = Some(Some(Utc::now() + chrono::Duration::minutes(1)));
        let planned = plan(&job, &nodes, &owned);
        assert!(planned.stop.is_empty());
        assert!(planned.look_again_at.is_some(), "at the deadline");
        nodes[0].drain = Some(Some(Utc::now() - chrono::Duration::seconds(1)));
        let planned = plan(&job, &nodes, &owned);
        assert_eq!(planned.stop.len(), 2, "{planned:?}");
    }

    #[test]
    fn a_system_job_makes_no_copy_on_an_ineligible_node_and_keeps_the_one_there() {
        let job = record(JobType::System, None);
        let mut nodes = vec![node("w1", true, "eu")];
        let first = plan(&job, &nodes, &[]);
        assert_eq!(first.create.len(), 1);
        let mut on_w1 = first.create[0].clone();
        on_w1.status.state = State::Running;
        on_w1.status.node_name = "w1".into();
        nodes[0].eligible = false;
        nodes[0].drain = Some(None);
        assert!(plan(&job, &nodes, &[]).create.is_empty());
        let kept = plan(&job, &nodes, &[&on_w1]);
        assert!(kept.is_empty() && kept.keep == [on_w1.id], "{kept:?}");
    }

    mod generated {
        //! A property over generated jobs: the copies a job's plan makes are, once running,
        //! what the next plan expects — a converged job plans nothing, whatever its spec
        //! says (issue 27: a `node.name` constraint at the job's level made every copy read
        //! as changed, and the job replaced it in a loop).
        use proptest::prelude::*;
        use serde_json::{Value, json};

        use super::*;

        fn constraint() -> impl Strategy<Value = Value> {
            prop_oneof![
                prop::sample::select(vec!["n1", "n2"]).prop_map(
                    |node| json!({"Attribute": "node.name", "Operator": "=", "Value": node})
                ),
                Just(json!({"Attribute": "node.name", "Operator": "!=", "Value": "n3"})),
                Just(json!({"Attribute": "label.zone", "Operator": "=", "Value": "eu"})),
                Just(json!({"Attribute": "label.zone", "Operator": "in", "Value": "eu,us"})),
                Just(json!({"Attribute": "label.disk", "Operator": "exists"})),
            ]
        }

        /// A group's task: every kind of spec field a user may write, each present or not.
        fn task() -> impl Strategy<Value = Value> {
            (
                prop::sample::select(vec!["cube-sample:latest", "registry.test:5000/a/b:v1"]),
                prop::option::of(prop::sample::select(vec!["16MiB", "64Mi", "1GiB"])),
                prop::option::of(prop::sample::select(vec![0.25, 1.0])),
                prop::collection::vec("[A-Z]{1,3}=[a-z0-9]{0,4}", 0..3),
                prop::collection::vec("[a-z/]{1,6}", 0..3),
                prop::option::of(prop::sample::select(vec!["7777", "8080/tcp", "53/udp"])),
                prop::option::of(prop::sample::select(vec!["no", "always", "on-failure"])),
                prop::option::of(prop::sample::select(vec!["/health", "/"])),
                prop::option::of(0u32..4),
            )
                .prop_map(
                    |(image, memory, cpu, env, cmd, port, restart, health, max_restarts)| {
                        let mut task = json!({"Image": image, "Env": env, "Cmd": cmd});
                        if let Some(memory) = memory {
                            task["Memory"] = json!(memory);
                        }
                        if let Some(cpu) = cpu {
                            task["Cpu"] = json!(cpu);
                        }
                        if let Some(port) = port {
                            let key = if port.contains('/') {
                                port.to_string()
                            } else {
                                format!("{port}/tcp")
                            };
                            task["ExposedPorts"] = json!({ key.clone(): {} });
                            task["PortBindings"] = json!({ key: "" });
                        }
                        if let Some(restart) = restart {
                            task["RestartPolicy"] = json!(restart);
                        }
                        if let Some(health) = health {
                            task["HealthCheck"] = json!(health);
                        }
                        if let Some(max) = max_restarts {
                            task["MaxRestarts"] = json!(max);
                        }
                        task
                    },
                )
        }

        fn job() -> impl Strategy<Value = Value> {
            (
                prop::sample::select(vec!["service", "batch", "system"]),
                prop::collection::vec(constraint(), 0..3),
                prop::collection::vec(constraint(), 0..3),
                1u32..4,
                task(),
            )
                .prop_map(|(kind, at_job, at_group, count, task)| {
                    let mut group = json!({"Name": "api", "Constraints": at_group, "Task": task});
                    if kind != "system" {
                        group["Count"] = json!(count);
                    }
                    json!({"Name": "gen", "Type": kind, "Constraints": at_job,
                           "Groups": [group]})
                })
        }

        fn nodes() -> Vec<NodeFacts> {
            let labels = |pairs: &[(&str, &str)]| {
                std::sync::Arc::new(
                    pairs
                        .iter()
                        .map(|(key, value)| (key.to_string(), value.to_string()))
                        .collect::<BTreeMap<_, _>>(),
                )
            };
            vec![
                NodeFacts::ready("n1", labels(&[("zone", "eu"), ("disk", "ssd")])),
                NodeFacts::ready("n2", labels(&[("zone", "us")])),
            ]
        }

        proptest! {
            /// Whatever the group's size, canaries and pace, a canary rollout carried out to
            /// the end leaves the indexes 0..Count, every copy new (issue 27: 0, 1, 3).
            #[test]
            fn a_canary_rollout_ends_with_the_indexes_0_to_count(
                count in 1u32..6,
                canaries in 1u32..4,
                max_parallel in 1u32..4,
            ) {
                let (done, _) = canary_cycle(count, canaries, max_parallel);
                prop_assert_eq!(indexes(&done), (0..count).collect::<Vec<_>>());
            }

            #[test]
            fn the_copies_a_plan_makes_are_what_the_next_plan_expects(body in job()) {
                let parsed: Job = serde_json::from_value(body.clone())
                    .map_err(|err| TestCaseError::fail(format!("{body}: {err}")))?;
                prop_assume!(parsed.validate().is_empty());
                let record = JobRecord {
                    job: parsed,
                    version: 1,
                    submit_time: None,
                    stopped: false,
                    promoted: false,
                    revert_of: None,
                };
                let nodes = nodes();
                let first = plan(&record, &nodes, &[]);
                // Every copy made is current against its group's template.
                let template = copy_of(&record, 0, 0, None);
                for copy in &first.create {
                    prop_assert!(has_current_spec(copy, &template), "{copy:?}");
                }
                // Once they run (each where its pin or any node puts it), nothing changes.
                let running: Vec<Task> = first
                    .create
                    .iter()
                    .cloned()
                    .map(|mut copy| {
                        copy.status.state = State::Running;
                        copy.status.node_name =
                            pinned_node(&copy).unwrap_or("n1").into();
                        copy
                    })
                    .collect();
                let owned: Vec<&Task> = running.iter().collect();
                let next = plan(&record, &nodes, &owned);
                prop_assert!(next.create.is_empty(), "{body}: creates {:?}", names(&next.create));
                prop_assert!(next.stop.is_empty(), "{body}: stops {:?}", next.stop);
            }
        }
    }
}
