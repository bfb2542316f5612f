//! What the manager's jobs API answers, as the `cube job` commands read it, and how they print
//! it: the job table, one job in detail (a group summary as `nomad job status` gives it, and
//! the copies), a plan, and where a job stands against "converged". Pure functions that return
//! lines or values, so that tests read them without a manager or a terminal.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use cube_types::deployment::{Deployment, DeploymentState};
use cube_types::{Job, JobType, State, Task};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::output::{key_values, table, time_ago, time_with_age};
use super::queue::QueueEntryView;

/// A job as `POST /jobs`, `GET /jobs[/{name}]`, `DELETE /jobs/{name}` and the scale answer
/// show it. Fields the CLI does not know are ignored, so that an older CLI still reads a newer
/// manager.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobView {
    #[serde(rename = "Job")]
    pub job: Job,
    /// One more for every change of the spec; a scale is not one.
    #[serde(rename = "Version")]
    pub version: u64,
    #[serde(rename = "SubmitTime", default, with = "cube_types::time::optional")]
    pub submit_time: Option<DateTime<Utc>>,
    #[serde(rename = "Stopped", default)]
    pub stopped: bool,
    /// `pending`, `running`, `complete`, `failed` or `stopped`: the manager's word.
    #[serde(rename = "Status", default)]
    pub status: String,
    /// Per group, how its current copies are doing.
    #[serde(rename = "Summary", default)]
    pub summary: BTreeMap<String, GroupCounts>,
    /// The job's tasks; only in the answer about one job.
    #[serde(rename = "Tasks", default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<Task>,
    /// The job's last deployment (service jobs).
    #[serde(
        rename = "Deployment",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub deployment: Option<Deployment>,
    /// In the answer to a submission or a revert: `new`, `changed`, `scaled`, `unchanged`.
    #[serde(rename = "Outcome", default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// The job's entry in the waiting list (one job's answer only).
    #[serde(rename = "Queue", default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueEntryView>,
    /// In the answer to a submission: why no node could hold the job today (it waits).
    #[serde(rename = "Warnings", default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// One kept version, as `GET /jobs/{name}/versions` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VersionView {
    #[serde(rename = "Version")]
    pub version: u64,
    #[serde(rename = "SubmitTime", default, with = "cube_types::time::optional")]
    pub submit_time: Option<DateTime<Utc>>,
    #[serde(rename = "Stable", default)]
    pub stable: bool,
    #[serde(rename = "Diff", default)]
    pub diff: Vec<String>,
    #[serde(rename = "RevertOf", default)]
    pub revert_of: Option<u64>,
    #[serde(rename = "Current", default)]
    pub current: bool,
}

/// A group's copies by state, as `nomad job status` counts allocations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupCounts {
    #[serde(rename = "Pending", default)]
    pub pending: u64,
    /// Placed and sent to their node, not yet running.
    #[serde(rename = "Starting", default)]
    pub starting: u64,
    #[serde(rename = "Running", default)]
    pub running: u64,
    #[serde(rename = "Failed", default)]
    pub failed: u64,
    #[serde(rename = "Complete", default)]
    pub complete: u64,
    #[serde(rename = "Lost", default)]
    pub lost: u64,
}

/// `POST /jobs/plan`: what submitting the job would do, nothing done.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanView {
    /// The version the job would have.
    #[serde(rename = "Version", default)]
    pub version: u64,
    /// Whether the job differs from the one the manager holds (spec or counts).
    #[serde(rename = "Changed", default)]
    pub changed: bool,
    /// `new`, `changed` (a new version), `scaled` (counts only) or `unchanged`.
    #[serde(rename = "Outcome", default)]
    pub outcome: String,
    /// What the version would change, one line per field.
    #[serde(rename = "Diff", default)]
    pub diff: Vec<String>,
    /// Live copies whose spec would change (a service's deployment replaces them a few at
    /// a time: `Create` and `Stop` are its first step).
    #[serde(rename = "Replace", default)]
    pub replace: usize,
    /// The copies it would create, by name (the API does not write out their specs).
    #[serde(rename = "Create", default)]
    pub create: Vec<PlannedCreate>,
    #[serde(rename = "Stop", default)]
    pub stop: Vec<PlannedStop>,
    #[serde(rename = "Keep", default)]
    pub keep: Vec<Uuid>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedCreate {
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Group", default)]
    pub group: String,
    #[serde(rename = "Index", default)]
    pub index: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedStop {
    #[serde(rename = "ID")]
    pub id: Uuid,
    #[serde(rename = "Name", default)]
    pub name: String,
    #[serde(rename = "Reason", default)]
    pub reason: String,
}

/// Where a job stands against what a `--wait` waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Convergence {
    /// Every group is as the job asks: a service's copies run, a batch job's completed, a
    /// system job has no copy waiting.
    Converged,
    /// Not yet; the words say where each group is.
    Waiting(String),
    /// It will not get there: a batch copy gave up, the job was stopped, or its deployment
    /// failed.
    Failed(String),
    /// Its deployment's canaries are healthy and it waits for `cube job promote`.
    AwaitsPromotion(String),
}

/// How many copies a group wants: its `Count`, or none for a system job's (one per node).
fn wanted(view: &JobView, group: &str) -> Option<u64> {
    view.job
        .groups
        .iter()
        .find(|candidate| candidate.name == group)
        .and_then(|group| group.count)
        .map(u64::from)
}

/// The groups in the job's order, with their counts (zero when the summary has none yet).
fn groups(view: &JobView) -> impl Iterator<Item = (&str, GroupCounts)> {
    view.job.groups.iter().map(|group| {
        let counts = view.summary.get(&group.name).copied().unwrap_or_default();
        (group.name.as_str(), counts)
    })
}

/// Each group in a few words, for a progress line: `api: 2/3 running` (service), `api: 1/3
/// complete, 2 running` (batch), `api: 2 running, 1 pending` (system).
pub fn progress_line(view: &JobView) -> String {
    groups(view)
        .map(|(name, counts)| {
            let waiting = counts.pending + counts.starting;
            let mut words = match (view.job.job_type, wanted(view, name)) {
                (JobType::Batch, Some(count)) => {
                    let mut words = format!("{name}: {}/{count} complete", counts.complete);
                    if counts.running > 0 {
                        words.push_str(&format!(", {} running", counts.running));
                    }
                    words
                }
                (_, Some(count)) => format!("{name}: {}/{count} running", counts.running),
                (_, None) => format!("{name}: {} running", counts.running),
            };
            if waiting > 0 && view.job.job_type == JobType::System {
                words.push_str(&format!(", {waiting} pending"));
            }
            if counts.failed > 0 {
                words.push_str(&format!(", {} failed", counts.failed));
            }
            words
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether the job has converged: the manager's status word, and each group's counts against
/// what it wants (a service scaled down is converged once the extra copies no longer run);
/// with `deployment`, also the deployment of the job's version: successful (or failed, or
/// waiting for a promotion).
pub fn convergence(view: &JobView, deployment: bool) -> Convergence {
    let name = &view.job.name;
    match view.queue.as_ref().map(|entry| entry.state.as_str()) {
        Some("expired") => {
            let reason = view
                .queue
                .as_ref()
                .map_or("", |entry| entry.reason.as_str());
            return Convergence::Failed(format!("job {name} expired in the queue: {reason}"));
        }
        Some("waiting") => {
            let (position, why) = view.queue.as_ref().map_or((0, None), |entry| {
                (entry.position, entry.waiting_for.clone())
            });
            return Convergence::Waiting(format!(
                "queued at position {position}: {}",
                why.unwrap_or_else(|| "waiting for room".to_string())
            ));
        }
        _ => {}
    }
    if view.stopped || view.status == "stopped" {
        return Convergence::Failed(format!("job {name} was stopped"));
    }
    if deployment && view.job.job_type == JobType::Service {
        match view
            .deployment
            .as_ref()
            .filter(|deployment| deployment.version == view.version)
        {
            None => {
                return Convergence::Waiting(format!(
                    "version {} waits for its deployment to start",
                    view.version
                ));
            }
            Some(deployment) => match deployment.state {
                DeploymentState::Successful => {}
                DeploymentState::Paused => {
                    return Convergence::AwaitsPromotion(deployment.reason.clone());
                }
                DeploymentState::Running => {
                    return Convergence::Waiting(deployment_progress(deployment));
                }
                DeploymentState::Failed
                | DeploymentState::Reverted
                | DeploymentState::Cancelled => {
                    return Convergence::Failed(format!(
                        "the deployment of job {name} version {} {}: {}",
                        deployment.version,
                        match deployment.state {
                            DeploymentState::Reverted => "failed and was reverted",
                            DeploymentState::Cancelled => "was cancelled",
                            _ => "failed",
                        },
                        deployment.reason
                    ));
                }
            },
        }
    }
    if view.status == "failed" {
        let why = failed_copies(view)
            .first()
            .cloned()
            .unwrap_or_else(|| "a copy failed".to_string());
        return Convergence::Failed(format!("job {name} failed: {why}"));
    }
    let every_group = |done: &dyn Fn(GroupCounts, Option<u64>) -> bool| {
        groups(view).all(|(group, counts)| done(counts, wanted(view, group)))
    };
    let converged = match view.job.job_type {
        JobType::Service => {
            view.status == "running" && every_group(&|counts, count| Some(counts.running) == count)
        }
        JobType::Batch => {
            view.status == "complete"
                && every_group(&|counts, count| count.is_some_and(|n| counts.complete >= n))
        }
        JobType::System => {
            view.status == "running"
                && every_group(&|counts, _| counts.pending + counts.starting == 0)
        }
    };
    if converged {
        Convergence::Converged
    } else {
        Convergence::Waiting(progress_line(view))
    }
}

/// `web.api[1] (3f2a9c1e) failed (exit code 3): container exited with code 3`, for each copy
/// that failed while meant to run.
pub fn failed_copies(view: &JobView) -> Vec<String> {
    view.tasks
        .iter()
        .filter(|task| {
            task.status.state == State::Failed && task.spec.desired_state == State::Running
        })
        .map(|task| {
            let exit = task
                .status
                .run
                .exit_code
                .map(|code| format!(" (exit code {code})"))
                .unwrap_or_default();
            let error = task
                .status
                .run
                .error
                .as_deref()
                .map(|error| format!(": {}", error.trim()))
                .unwrap_or_default();
            format!("{} ({}) failed{exit}{error}", task.name, task.short_id())
        })
        .collect()
}

/// Why copies wait, one phrase each: `web.api[2]: 1 node: short of memory`.
pub fn waiting_copies(view: &JobView) -> Vec<String> {
    view.tasks
        .iter()
        .filter(|task| {
            task.spec.desired_state == State::Running && !task.status.state.is_terminal()
        })
        .filter_map(|task| {
            let why = task
                .status
                .pending_reason
                .as_deref()
                .or(task.status.dispatch_error.as_deref())?;
            Some(format!(
                "{}: {} ({})",
                task.name,
                task.status.state,
                why.trim()
            ))
        })
        .collect()
}

/// The line after a submission: `job web: version 2 (changed)`; `(new)` for a job the manager
/// did not have, `(scaled)` when only counts changed, `(unchanged)` when the spec was the
/// same. The manager's `Outcome` says which; an older manager's answer is judged by version.
pub fn submitted_line(view: &JobView, version_before: Option<u64>) -> String {
    let what = match (view.outcome.as_deref(), version_before) {
        (Some(outcome), _) => outcome,
        (None, None) => "new",
        (None, Some(before)) if before == view.version => "unchanged",
        (None, Some(_)) => "changed",
    };
    format!("job {}: version {} ({what})", view.job.name, view.version)
}

/// A bar of `width` cells, `done` of `total` filled: `[#####.....]`.
pub fn progress_bar(done: u32, total: u32, width: usize) -> String {
    let filled = if total == 0 {
        width
    } else {
        (done.min(total) as usize * width) / total as usize
    };
    format!("[{}{}]", "#".repeat(filled), ".".repeat(width - filled))
}

/// A deployment in a few words, for a progress line: `deployment of version 3 running: api
/// 2/4 healthy`.
pub fn deployment_progress(deployment: &Deployment) -> String {
    let groups: Vec<String> = deployment
        .groups
        .iter()
        .map(|(name, group)| format!("{name} {}/{} healthy", group.healthy, group.desired))
        .collect();
    format!(
        "deployment of version {} {}: {}",
        deployment.version,
        deployment.state,
        groups.join(", ")
    )
}

/// A deployment in detail: its state and reason, then per group a progress bar of healthy
/// new copies, with placed, unhealthy and old ones counted.
pub fn deployment_lines(deployment: &Deployment, now: DateTime<Utc>) -> Vec<String> {
    let mut lines = key_values(&[
        ("ID", deployment.id.to_string()[..8].to_string()),
        ("Version", deployment.version.to_string()),
        ("State", deployment.state.to_string()),
        ("Reason", deployment.reason.clone()),
        ("Started", time_with_age(deployment.create_time, now)),
    ]);
    let mut rows = vec![
        [
            "GROUP",
            "PROGRESS",
            "DESIRED",
            "PLACED",
            "HEALTHY",
            "UNHEALTHY",
            "OLD",
            "CANARIES",
        ]
        .map(String::from)
        .to_vec(),
    ];
    rows.extend(deployment.groups.iter().map(|(name, group)| {
        let canaries = match (group.desired_canaries, group.promoted) {
            (0, _) => "-".to_string(),
            (n, true) => format!("{n} (promoted)"),
            (n, false) => n.to_string(),
        };
        vec![
            name.clone(),
            progress_bar(group.healthy, group.desired, 20),
            group.desired.to_string(),
            group.placed.to_string(),
            group.healthy.to_string(),
            group.unhealthy.to_string(),
            group.old.to_string(),
            canaries,
        ]
    }));
    lines.extend(table(&rows));
    lines
}

/// `cube job history`: VERSION, STABLE, SUBMITTED, CHANGES (the first change, and how many
/// more), the current version marked `*`; with `full`, every change on its own line.
pub fn history_lines(versions: &[VersionView], now: DateTime<Utc>, full: bool) -> Vec<String> {
    let mut rows = vec![
        ["VERSION", "STABLE", "SUBMITTED", "CHANGES"]
            .map(String::from)
            .to_vec(),
    ];
    let mut details = Vec::new();
    for version in versions {
        let mut changes = match version.revert_of {
            Some(to) => format!("revert to version {to}"),
            None => version.diff.first().cloned().unwrap_or_default(),
        };
        let more = version
            .diff
            .len()
            .saturating_sub(usize::from(version.revert_of.is_none()));
        if more > 0 && !full {
            changes.push_str(&format!(" (+{more} more)"));
        }
        rows.push(vec![
            format!(
                "{}{}",
                version.version,
                if version.current { " *" } else { "" }
            ),
            if version.stable { "yes" } else { "no" }.to_string(),
            time_ago(version.submit_time, now),
            changes,
        ]);
        if full {
            details.push(String::new());
            details.push(format!("version {}:", version.version));
            details.extend(version.diff.iter().map(|line| format!("  {line}")));
        }
    }
    let mut lines = table(&rows);
    lines.extend(details);
    lines
}

/// The job table: NAME, TYPE, VERSION, STATUS, GROUPS (each group's `running/wanted`),
/// DEPLOYMENT (the last one's version and state) and SUBMITTED.
pub fn job_table(views: &[JobView], now: DateTime<Utc>) -> Vec<String> {
    let mut rows = vec![
        [
            "NAME",
            "TYPE",
            "VERSION",
            "STATUS",
            "GROUPS",
            "DEPLOYMENT",
            "SUBMITTED",
        ]
        .map(String::from)
        .to_vec(),
    ];
    // Jobs of several projects (`--project '*'`): a PROJECT column after NAME.
    let with_project = views
        .iter()
        .map(|view| view.job.project())
        .collect::<std::collections::BTreeSet<_>>()
        .len()
        > 1;
    if with_project {
        rows[0].insert(1, "PROJECT".to_string());
    }
    rows.extend(views.iter().map(|view| {
        let deployment = view
            .deployment
            .as_ref()
            .map_or("-".to_string(), |d| format!("v{} {}", d.version, d.state));
        let mut row = vec![
            view.job.name.clone(),
            view.job.job_type.name().to_string(),
            view.version.to_string(),
            view.status.clone(),
            group_cells(view),
            deployment,
            time_ago(view.submit_time, now),
        ];
        if with_project {
            row.insert(1, view.job.project().to_string());
        }
        row
    }));
    table(&rows)
}

/// `api 3/3, db 1/1`: each group's running copies of those it wants; a batch group counts its
/// completed copies too (`batch 1/3 (2 complete)`), a system group only what runs.
fn group_cells(view: &JobView) -> String {
    groups(view)
        .map(
            |(name, counts)| match (view.job.job_type, wanted(view, name)) {
                (JobType::Batch, Some(count)) if counts.complete > 0 => format!(
                    "{name} {}/{count} ({} complete)",
                    counts.running, counts.complete
                ),
                (_, Some(count)) => format!("{name} {}/{count}", counts.running),
                (_, None) => format!("{name} {}", counts.running),
            },
        )
        .collect::<Vec<_>>()
        .join(", ")
}

/// One job in detail: its fields, the summary of each group, and its copies (those stopped
/// on purpose are counted, not listed), with why a copy waits or failed.
pub fn job_details(view: &JobView, now: DateTime<Utc>) -> Vec<String> {
    let job = &view.job;
    let constraints = job
        .constraints
        .iter()
        .map(|c| format!("{} {} {}", c.attribute, c.operator.symbol(), c.value))
        .collect::<Vec<_>>()
        .join(", ");
    let mut lines = key_values(&[
        ("Name", job.name.clone()),
        ("Type", job.job_type.name().to_string()),
        ("Priority", job.priority.to_string()),
        ("Version", view.version.to_string()),
        ("Status", view.status.clone()),
        ("Submitted", time_with_age(view.submit_time, now)),
        ("Constraints", constraints),
        ("Queue", queue_words(view.queue.as_ref())),
    ]);
    lines.extend([String::new(), "Groups".to_string()]);
    lines.extend(summary_table(view));
    if let Some(deployment) = &view.deployment {
        lines.extend([String::new(), "Deployment".to_string()]);
        lines.extend(deployment_lines(deployment, now));
    }

    let (mut shown, stopped): (Vec<&Task>, Vec<&Task>) = view.tasks.iter().partition(|task| {
        !(task.spec.desired_state != State::Running && task.status.state.is_terminal())
    });
    shown.sort_by(|a, b| {
        (&a.spec.group, a.spec.index, a.status.created_time).cmp(&(
            &b.spec.group,
            b.spec.index,
            b.status.created_time,
        ))
    });
    lines.extend([String::new(), "Tasks".to_string()]);
    if shown.is_empty() {
        lines.push("none".to_string());
    } else {
        let mut rows = vec![["ID", "NAME", "STATE", "NODE"].map(String::from).to_vec()];
        rows.extend(shown.iter().map(|task| {
            vec![
                task.short_id(),
                task.name.clone(),
                task.status.state.name().to_string(),
                if task.status.node_name.is_empty() {
                    "-".to_string()
                } else {
                    task.status.node_name.to_string()
                },
            ]
        }));
        lines.extend(table(&rows));
    }
    let notes: Vec<String> = failed_copies(view)
        .into_iter()
        .chain(
            waiting_copies(view)
                .into_iter()
                .map(|w| format!("waiting: {w}")),
        )
        .collect();
    if !notes.is_empty() {
        lines.push(String::new());
        lines.extend(notes);
    }
    match stopped.len() {
        0 => {}
        1 => lines.extend([String::new(), "1 stopped copy not shown".to_string()]),
        n => lines.extend([String::new(), format!("{n} stopped copies not shown")]),
    }
    lines
}

/// A job's place in the waiting list in a few words: `waiting at position 2: <why>`,
/// `claimed`, `pending-1`, `expired: <why>`; empty when it has no entry (a system job).
fn queue_words(entry: Option<&QueueEntryView>) -> String {
    match entry {
        None => String::new(),
        Some(entry) if entry.state == "waiting" => format!(
            "waiting at position {}: {}",
            entry.position,
            entry.waiting_for.as_deref().unwrap_or("waiting for room")
        ),
        Some(entry) if entry.state == "expired" => format!("expired: {}", entry.reason),
        Some(entry) => format!("{} (number {})", entry.state, entry.queue),
    }
}

/// GROUP, WANTED, PENDING, STARTING, RUNNING, FAILED, COMPLETE, LOST: one row per group.
fn summary_table(view: &JobView) -> Vec<String> {
    let mut rows = vec![
        [
            "GROUP", "WANTED", "PENDING", "STARTING", "RUNNING", "FAILED", "COMPLETE", "LOST",
        ]
        .map(String::from)
        .to_vec(),
    ];
    rows.extend(groups(view).map(|(name, counts)| {
        vec![
            name.to_string(),
            wanted(view, name).map_or_else(|| "-".to_string(), |count| count.to_string()),
            counts.pending.to_string(),
            counts.starting.to_string(),
            counts.running.to_string(),
            counts.failed.to_string(),
            counts.complete.to_string(),
            counts.lost.to_string(),
        ]
    }));
    table(&rows)
}

/// What a plan would do: `+ web.api[3]` for each copy to create, `- web.api[1] (the group
/// is scaled to 2)` for each to stop, `= 2 unchanged` for those kept, after a line that says
/// whether the spec changed.
pub fn plan_lines(job: &str, plan: &PlanView) -> Vec<String> {
    let mut lines = vec![if plan.outcome == "scaled" {
        format!(
            "job {job}: only counts changed; it stays version {} (no deployment)",
            plan.version
        )
    } else if plan.changed {
        format!(
            "job {job}: the spec changed; it would be version {}",
            plan.version
        )
    } else {
        format!(
            "job {job}: the spec is unchanged (version {})",
            plan.version
        )
    }];
    lines.extend(plan.diff.iter().map(|change| format!("  {change}")));
    if plan.replace > 0 {
        lines.push(format!(
            "~ {} cop{} to replace; a service job's deployment replaces them MaxParallel at a \
             time (first step below)",
            plan.replace,
            if plan.replace == 1 { "y" } else { "ies" }
        ));
    }
    lines.extend(plan.create.iter().map(|task| format!("+ {}", task.name)));
    lines.extend(plan.stop.iter().map(|stop| {
        if stop.reason.is_empty() {
            format!("- {}", stop.name)
        } else {
            format!("- {} ({})", stop.name, stop.reason)
        }
    }));
    if !plan.keep.is_empty() {
        lines.push(format!("= {} unchanged", plan.keep.len()));
    }
    if plan.create.is_empty() && plan.stop.is_empty() {
        lines.push("nothing to create or stop".to_string());
    }
    lines
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use cube_types::Group;

    use super::*;

    fn view(job_type: JobType, count: Option<u32>, status: &str, counts: GroupCounts) -> JobView {
        JobView {
            job: Job {
                name: "web".to_string(),
                job_type,
                priority: 50,
                constraints: Vec::new(),
                owner: String::new(),
                project: String::new(),
                queue_timeout: None,
                groups: vec![Group {
                    name: "api".to_string(),
                    count,
                    constraints: Vec::new(),
                    task: Task::new("", "cube-sample:latest"),
                    update: None,
                }],
            },
            version: 2,
            submit_time: None,
            stopped: false,
            status: status.to_string(),
            summary: BTreeMap::from([("api".to_string(), counts)]),
            tasks: Vec::new(),
            deployment: None,
            outcome: None,
            queue: None,
            warnings: Vec::new(),
        }
    }

    fn running(n: u64) -> GroupCounts {
        GroupCounts {
            running: n,
            ..GroupCounts::default()
        }
    }

    fn copy(index: u32, state: State, node: &str) -> Task {
        let mut task = Task::new(format!("web.api[{index}]"), "cube-sample:latest");
        task.id = Uuid::from_u128(0x3f2a9c1e_0000_0000_0000_000000000000 + u128::from(index));
        task.spec.group = "api".to_string();
        task.spec.index = Some(index);
        task.status.state = state;
        task.status.node_name = node.into();
        task
    }

    #[test]
    fn the_api_answer_reads_into_a_view() {
        let view: JobView = serde_json::from_str(
            r#"{"Job": {"Name": "web", "Type": "service", "Priority": 50,
                        "Groups": [{"Name": "api", "Count": 3, "Task": {"Image": "x"}}]},
                "Version": 3, "SubmitTime": "2026-01-01T00:00:00Z", "Stopped": false,
                "Status": "running",
                "Summary": {"api": {"Pending": 0, "Starting": 0, "Running": 3, "Failed": 0,
                                    "Complete": 0, "Lost": 0}},
                "Tasks": [{"ID": "3f2a9c1e-0000-0000-0000-000000000001", "Name": "web.api[0]",
                           "State": "Running", "NodeName": "w1", "Group": "api", "Index": 0,
                           "Image": "x"}],
                "Later": "a field this CLI does not know"}"#,
        )
        .unwrap();
        assert_eq!(view.version, 3);
        assert_eq!(view.summary["api"].running, 3);
        assert_eq!(view.tasks[0].status.node_name, "w1");
        assert_eq!(convergence(&view, false), Convergence::Converged);
    }

    #[test]
    fn a_service_converges_when_each_group_runs_what_it_wants() {
        let waiting = view(JobType::Service, Some(3), "pending", running(2));
        assert_eq!(
            convergence(&waiting, false),
            Convergence::Waiting("api: 2/3 running".to_string())
        );
        // Scaled down: the extra copies still run until they are stopped.
        let shrinking = view(JobType::Service, Some(1), "running", running(3));
        assert!(matches!(
            convergence(&shrinking, false),
            Convergence::Waiting(_)
        ));
        let done = view(JobType::Service, Some(3), "running", running(3));
        assert_eq!(convergence(&done, false), Convergence::Converged);
    }

    #[test]
    fn a_batch_job_converges_when_complete_and_fails_with_the_copys_error() {
        let counts = GroupCounts {
            complete: 1,
            running: 2,
            ..GroupCounts::default()
        };
        assert_eq!(
            convergence(&view(JobType::Batch, Some(3), "pending", counts), false),
            Convergence::Waiting("api: 1/3 complete, 2 running".to_string())
        );
        let complete = GroupCounts {
            complete: 3,
            ..GroupCounts::default()
        };
        assert_eq!(
            convergence(&view(JobType::Batch, Some(3), "complete", complete), false),
            Convergence::Converged
        );
        let mut failed = view(JobType::Batch, Some(3), "failed", counts);
        let mut copy = copy(1, State::Failed, "w1");
        copy.status.run.exit_code = Some(3);
        copy.status.run.error = Some("container exited with code 3".to_string());
        failed.tasks.push(copy);
        assert_eq!(
            convergence(&failed, false),
            Convergence::Failed(
                "job web failed: web.api[1] (3f2a9c1e) failed (exit code 3): container exited \
                 with code 3"
                    .to_string()
            )
        );
    }

    #[test]
    fn a_system_job_converges_when_no_copy_waits() {
        let waiting = GroupCounts {
            running: 2,
            pending: 1,
            ..GroupCounts::default()
        };
        assert_eq!(
            convergence(&view(JobType::System, None, "pending", waiting), false),
            Convergence::Waiting("api: 2 running, 1 pending".to_string())
        );
        assert_eq!(
            convergence(&view(JobType::System, None, "running", running(2)), false),
            Convergence::Converged
        );
    }

    #[test]
    fn a_stopped_job_will_not_converge() {
        let mut stopped = view(JobType::Service, Some(3), "stopped", running(0));
        stopped.stopped = true;
        assert_eq!(
            convergence(&stopped, false),
            Convergence::Failed("job web was stopped".to_string())
        );
    }

    #[test]
    fn the_submission_says_whether_the_spec_changed() {
        let view = view(JobType::Service, Some(3), "pending", running(0));
        assert_eq!(submitted_line(&view, None), "job web: version 2 (new)");
        assert_eq!(
            submitted_line(&view, Some(1)),
            "job web: version 2 (changed)"
        );
        assert_eq!(
            submitted_line(&view, Some(2)),
            "job web: version 2 (unchanged)"
        );
    }

    #[test]
    fn the_job_table_shows_each_groups_running_and_wanted_copies() {
        let now = Utc.with_ymd_and_hms(2026, 1, 1, 12, 0, 0).unwrap();
        let mut web = view(JobType::Service, Some(3), "running", running(3));
        web.submit_time = Some(now - chrono::Duration::minutes(5));
        let mut batch = view(
            JobType::Batch,
            Some(3),
            "pending",
            GroupCounts {
                running: 1,
                complete: 2,
                ..GroupCounts::default()
            },
        );
        batch.job.name = "report".to_string();
        web.deployment = Some(deployment(DeploymentState::Successful, 3));
        assert_eq!(
            job_table(&[web, batch], now),
            vec![
                "NAME     TYPE      VERSION   STATUS    GROUPS                 DEPLOYMENT      SUBMITTED",
                "web      service   2         running   api 3/3                v2 successful   5 minutes ago",
                "report   batch     2         pending   api 1/3 (2 complete)   -               -",
            ]
        );
    }

    #[test]
    fn one_job_shows_its_group_summary_and_its_copies() {
        let now = Utc.with_ymd_and_hms(2026, 1, 1, 12, 0, 0).unwrap();
        let mut web = view(
            JobType::Service,
            Some(3),
            "pending",
            GroupCounts {
                running: 2,
                pending: 1,
                ..GroupCounts::default()
            },
        );
        web.tasks = vec![copy(1, State::Running, "w1"), copy(0, State::Running, "w1")];
        let mut waiting = copy(2, State::Pending, "");
        waiting.status.pending_reason = Some("w1: needs 64.0 MiB memory".to_string());
        web.tasks.push(waiting);
        let mut stopped = copy(3, State::Completed, "w1");
        stopped.spec.desired_state = State::Completed;
        web.tasks.push(stopped);
        let lines = job_details(&web, now);
        let text = lines.join("\n");
        assert!(
            text.starts_with("Name:        web\nType:        service\n"),
            "{text}"
        );
        for expected in [
            "GROUP   WANTED   PENDING   STARTING   RUNNING   FAILED   COMPLETE   LOST",
            "api     3        1         0          2         0        0          0",
            "ID         NAME         STATE     NODE",
            "3f2a9c1e   web.api[0]   Running   w1",
            "3f2a9c1e   web.api[1]   Running   w1",
            "3f2a9c1e   web.api[2]   Pending   -",
            "waiting: web.api[2]: Pending (w1: needs 64.0 MiB memory)",
            "1 stopped copy not shown",
        ] {
            assert!(
                lines.iter().any(|line| line == expected),
                "{expected:?} not in:\n{text}"
            );
        }
        let order: Vec<usize> = ["web.api[0]", "web.api[1]", "web.api[2]"]
            .iter()
            .map(|name| text.find(&format!("   {name}   ")).unwrap())
            .collect();
        assert!(order.windows(2).all(|pair| pair[0] < pair[1]), "{text}");
        assert!(!text.contains("web.api[3]"), "{text}");
    }

    #[test]
    fn a_plan_says_what_it_would_create_stop_and_keep() {
        let plan = PlanView {
            version: 3,
            changed: true,
            outcome: "changed".to_string(),
            diff: vec!["Groups[api].Count: 3 -> 2".to_string()],
            replace: 0,
            create: vec![PlannedCreate {
                name: "web.api[3]".to_string(),
                group: "api".to_string(),
                index: Some(3),
            }],
            stop: vec![PlannedStop {
                id: Uuid::nil(),
                name: "web.api[1]".to_string(),
                reason: "the group is scaled to 2".to_string(),
            }],
            keep: vec![Uuid::nil(), Uuid::nil()],
        };
        assert_eq!(
            plan_lines("web", &plan),
            vec![
                "job web: the spec changed; it would be version 3",
                "  Groups[api].Count: 3 -> 2",
                "+ web.api[3]",
                "- web.api[1] (the group is scaled to 2)",
                "= 2 unchanged",
            ]
        );
        let unchanged = PlanView {
            version: 2,
            changed: false,
            outcome: "unchanged".to_string(),
            diff: Vec::new(),
            replace: 0,
            create: Vec::new(),
            stop: Vec::new(),
            keep: vec![Uuid::nil()],
        };
        assert_eq!(
            plan_lines("web", &unchanged),
            vec![
                "job web: the spec is unchanged (version 2)",
                "= 1 unchanged",
                "nothing to create or stop",
            ]
        );
    }

    fn deployment(state: DeploymentState, healthy: u32) -> Deployment {
        serde_json::from_value(serde_json::json!({
            "ID": "3f2a9c1e-0000-0000-0000-000000000001", "Job": "web", "Version": 2,
            "State": state, "Reason": "because",
            "Groups": {"api": {"Update": {"MaxParallel": 1, "MinHealthyTime": "5s",
                                          "HealthyDeadline": "1m", "ProgressDeadline": "5m",
                                          "AutoRevert": false, "Canary": 0},
                               "Desired": 4, "DesiredCanaries": 0, "Placed": 2,
                               "Healthy": healthy, "Unhealthy": 0, "Old": 2}}
        }))
        .unwrap()
    }

    #[test]
    fn a_service_waits_for_its_deployment_and_fails_with_it() {
        let mut job = view(JobType::Service, Some(4), "running", running(4));
        assert!(matches!(convergence(&job, true), Convergence::Waiting(_)));
        job.deployment = Some(deployment(DeploymentState::Running, 2));
        assert_eq!(
            convergence(&job, true),
            Convergence::Waiting("deployment of version 2 running: api 2/4 healthy".to_string())
        );
        job.deployment = Some(deployment(DeploymentState::Successful, 4));
        assert_eq!(convergence(&job, true), Convergence::Converged);
        job.deployment = Some(deployment(DeploymentState::Failed, 1));
        assert!(
            matches!(convergence(&job, true), Convergence::Failed(why) if why.contains("failed: because"))
        );
        job.deployment = Some(deployment(DeploymentState::Paused, 1));
        assert_eq!(
            convergence(&job, true),
            Convergence::AwaitsPromotion("because".to_string())
        );
        // A scale does not wait for the deployment.
        job.deployment = Some(deployment(DeploymentState::Failed, 1));
        assert_eq!(convergence(&job, false), Convergence::Converged);
    }

    #[test]
    fn a_deployment_shows_a_progress_bar_per_group() {
        assert_eq!(progress_bar(2, 4, 8), "[####....]");
        assert_eq!(progress_bar(0, 0, 4), "[####]");
        assert_eq!(progress_bar(9, 4, 4), "[####]");
        let now = Utc::now();
        let lines = deployment_lines(&deployment(DeploymentState::Running, 2), now).join("\n");
        assert!(lines.contains("State:   running"), "{lines}");
        assert!(lines.contains("[##########..........]"), "{lines}");
    }

    #[test]
    fn history_marks_the_current_version_and_counts_more_changes() {
        let versions = vec![
            VersionView {
                version: 2,
                submit_time: None,
                stable: false,
                diff: vec!["a".into(), "b".into()],
                revert_of: None,
                current: true,
            },
            VersionView {
                version: 1,
                submit_time: None,
                stable: true,
                diff: vec!["a new job".into()],
                revert_of: None,
                current: false,
            },
        ];
        let lines = history_lines(&versions, Utc::now(), false).join("\n");
        assert!(lines.contains("2 *"), "{lines}");
        assert!(lines.contains("a (+1 more)"), "{lines}");
        assert!(lines.contains("yes"), "{lines}");
    }
}
