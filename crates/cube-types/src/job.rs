//! A job: what the user wants to keep running, in groups of copies of one task template —
//! `service` (keep `Count` copies running), `batch` (run `Count` copies to completion) or
//! `system` (one copy on every `Ready` node that matches the constraints).
//!
//! This file holds the job as submitted (the spec) and its validation; the tasks a job owns
//! are computed from it by the manager's job controller. A constraint is a predicate over a
//! node's name and labels ([`Constraint::admits`]), asked by the scheduler's feasibility chain.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::task::Task;

/// The most groups one job may have, and the most copies of one group: a job is one request,
/// and 10,000 copies is already a large cluster's worth.
pub const MAX_GROUPS: usize = 100;
pub const MAX_COUNT: u32 = 10_000;
/// The most one job may expand to: every copy's spec, as JSON, together. A request is at most
/// 1 MiB, but a job multiplies its group's spec by `Count`: 10,000 copies of a 200 KB command
/// once made a 1 MiB request cost gigabytes of memory and store. 64 MiB holds 10,000 copies
/// of a 6 KB spec, far above what real copies need.
pub const MAX_EXPANDED_BYTES: u64 = 64 * 1024 * 1024;
/// Names of jobs and groups: at most this long, and made of `[A-Za-z0-9_-]` (they are part
/// of task names, `<job>.<group>[<index>]`, and of URLs).
pub const MAX_NAME_LEN: usize = 63;

/// A job as submitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Type", default)]
    pub job_type: JobType,
    /// 0 (least) to 100 (most); 50 when unset. Higher goes first in the placement pass.
    #[serde(rename = "Priority", default = "default_priority")]
    pub priority: u8,
    /// Constraints every group of the job has.
    #[serde(rename = "Constraints", default, skip_serializing_if = "Vec::is_empty")]
    pub constraints: Vec<Constraint>,
    #[serde(rename = "Groups")]
    pub groups: Vec<Group>,
    /// Who asked for the job: the waiting list's `Owner` (`anonymous` when unset).
    #[serde(rename = "Owner", default, skip_serializing_if = "String::is_empty")]
    pub owner: String,
    /// The project the job and its copies belong to (`default` when unset, and then not
    /// written).
    #[serde(
        rename = "Project",
        default,
        skip_serializing_if = "crate::project::is_default"
    )]
    pub project: String,
    /// How long the job may wait in the queue, none of its copies placed, before it gives
    /// up (`expired`, and the job is stopped).
    #[serde(
        rename = "QueueTimeout",
        default,
        with = "crate::duration::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub queue_timeout: Option<Duration>,
}

/// A job's priority when unset, and a bare task's when waiting for a node.
pub const DEFAULT_PRIORITY: u8 = 50;

fn default_priority() -> u8 {
    DEFAULT_PRIORITY
}

/// How a job's copies are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum JobType {
    /// `Count` copies running at all times; an ended copy is replaced by its restart policy,
    /// and a copy that gave up is replaced by a new one.
    #[default]
    #[serde(rename = "service")]
    Service,
    /// `Count` copies run to completion; a failed copy is retried by its restart policy.
    #[serde(rename = "batch")]
    Batch,
    /// One copy on every `Ready` node that matches the constraints.
    #[serde(rename = "system")]
    System,
}

impl JobType {
    pub fn name(self) -> &'static str {
        match self {
            JobType::Service => "service",
            JobType::Batch => "batch",
            JobType::System => "system",
        }
    }
}

/// One group of identical copies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Group {
    #[serde(rename = "Name")]
    pub name: String,
    /// How many copies (`service` and `batch`); not for `system`, which has one per node.
    #[serde(rename = "Count", default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    /// Constraints of this group, on top of the job's.
    #[serde(rename = "Constraints", default, skip_serializing_if = "Vec::is_empty")]
    pub constraints: Vec<Constraint>,
    /// Everything a task has; its `ID` and `Name` are the job controller's to set.
    #[serde(rename = "Task")]
    pub task: Task,
    /// How the group's copies are replaced when its template changes (`service` jobs only);
    /// unset, the defaults of [`Update`].
    #[serde(rename = "Update", default, skip_serializing_if = "Option::is_none")]
    pub update: Option<Update>,
}

/// A group's rolling-update settings, as submitted: every field may be left out, and then
/// has the default named on it (see [`crate::deployment::UpdateSettings`], the settings in
/// force).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Update {
    /// How many copies are replaced at a time [default: 1]: never fewer than
    /// `Count - MaxParallel` healthy copies while a deployment runs.
    #[serde(
        rename = "MaxParallel",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub max_parallel: Option<u32>,
    /// How long a new copy must stay healthy to count [default: 5s].
    #[serde(
        rename = "MinHealthyTime",
        default,
        with = "crate::duration::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub min_healthy_time: Option<Duration>,
    /// How long a new copy may take to become healthy before it fails the deployment
    /// [default: 1m].
    #[serde(
        rename = "HealthyDeadline",
        default,
        with = "crate::duration::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub healthy_deadline: Option<Duration>,
    /// How long a deployment may go without one more healthy copy before it fails
    /// [default: 5m].
    #[serde(
        rename = "ProgressDeadline",
        default,
        with = "crate::duration::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub progress_deadline: Option<Duration>,
    /// Whether a failed deployment puts the job back on its last stable version
    /// [default: false].
    #[serde(
        rename = "AutoRevert",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub auto_revert: Option<bool>,
    /// With N > 0, N new copies start beside the old ones and the deployment waits for
    /// `cube job promote` before replacing the rest [default: 0].
    #[serde(rename = "Canary", default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<u32>,
}

/// The longest a deployment's deadlines may be: a week. Longer is a slip of the unit.
pub const MAX_UPDATE_DEADLINE: Duration = Duration::from_secs(7 * 24 * 60 * 60);

impl Update {
    /// What is wrong with the block, each finding naming its field under `path`.
    fn findings(&self, path: &str, count: Option<u32>) -> Vec<String> {
        let settings = crate::deployment::UpdateSettings::of(Some(self));
        let mut findings = Vec::new();
        if self.max_parallel == Some(0) {
            findings.push(format!(
                "{path}.MaxParallel: 0 would replace nothing; at least 1"
            ));
        }
        if let Some(max) = self.max_parallel
            && max > MAX_COUNT
        {
            findings.push(format!(
                "{path}.MaxParallel: {max} is more than {MAX_COUNT}"
            ));
        }
        if let Some(canary) = self.canary
            && canary > MAX_COUNT
        {
            findings.push(format!("{path}.Canary: {canary} is more than {MAX_COUNT}"));
        }
        if let (Some(canary), Some(count)) = (self.canary, count)
            && canary > count
            && canary > 0
        {
            findings.push(format!(
                "{path}.Canary: {canary} canaries for a group of {count}; at most Count"
            ));
        }
        for (field, value) in [
            ("MinHealthyTime", settings.min_healthy_time),
            ("HealthyDeadline", settings.healthy_deadline),
            ("ProgressDeadline", settings.progress_deadline),
        ] {
            if value > MAX_UPDATE_DEADLINE {
                findings.push(format!(
                    "{path}.{field}: {} is more than a week (168h)",
                    crate::duration::format_duration(value)
                ));
            }
        }
        if settings.healthy_deadline.is_zero() {
            findings.push(format!(
                "{path}.HealthyDeadline: 0 leaves a new copy no time to become healthy"
            ));
        } else if settings.healthy_deadline <= settings.min_healthy_time {
            findings.push(format!(
                "{path}.HealthyDeadline: {} must be longer than MinHealthyTime ({}): a copy \
                 could never count in time",
                crate::duration::format_duration(settings.healthy_deadline),
                crate::duration::format_duration(settings.min_healthy_time)
            ));
        }
        if settings.progress_deadline < settings.healthy_deadline {
            findings.push(format!(
                "{path}.ProgressDeadline: {} is shorter than HealthyDeadline ({})",
                crate::duration::format_duration(settings.progress_deadline),
                crate::duration::format_duration(settings.healthy_deadline)
            ));
        }
        findings
    }
}

/// A predicate over a node: `{"Attribute": "label.zone", "Operator": "=", "Value": "eu"}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Constraint {
    /// `node.name`, or `label.KEY` for the node's label `KEY`.
    #[serde(rename = "Attribute")]
    pub attribute: String,
    #[serde(rename = "Operator", default)]
    pub operator: Operator,
    /// The value to compare with; for `in` and `not-in` a comma-separated list; unused by
    /// `exists`.
    #[serde(rename = "Value", default, skip_serializing_if = "String::is_empty")]
    pub value: String,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
pub enum Operator {
    #[default]
    #[serde(rename = "=", alias = "==")]
    Equal,
    #[serde(rename = "!=")]
    NotEqual,
    #[serde(rename = "in")]
    In,
    #[serde(rename = "not-in")]
    NotIn,
    #[serde(rename = "exists")]
    Exists,
}

impl Operator {
    pub fn symbol(self) -> &'static str {
        match self {
            Operator::Equal => "=",
            Operator::NotEqual => "!=",
            Operator::In => "in",
            Operator::NotIn => "not-in",
            Operator::Exists => "exists",
        }
    }
}

impl Constraint {
    /// The node's value of the attribute: its name, or one of its labels (`None`: no such
    /// label).
    fn value_on<'a>(
        &self,
        node_name: &'a str,
        labels: &'a BTreeMap<String, String>,
    ) -> Option<&'a str> {
        if self.attribute == "node.name" {
            return Some(node_name);
        }
        self.attribute
            .strip_prefix("label.")
            .and_then(|key| labels.get(key))
            .map(String::as_str)
    }

    fn values(&self) -> impl Iterator<Item = &str> {
        self.value
            .split(',')
            .map(str::trim)
            .filter(|v| !v.is_empty())
    }

    /// Whether a node with this name and these labels satisfies the constraint.
    pub fn admits(&self, node_name: &str, labels: &BTreeMap<String, String>) -> bool {
        let found = self.value_on(node_name, labels);
        match self.operator {
            Operator::Exists => found.is_some(),
            Operator::Equal => found == Some(self.value.as_str()),
            Operator::NotEqual => found != Some(self.value.as_str()),
            Operator::In => found.is_some_and(|found| self.values().any(|v| v == found)),
            Operator::NotIn => !found.is_some_and(|found| self.values().any(|v| v == found)),
        }
    }

    /// Why a node does not satisfy it: `label.zone is "us", wants "eu"`.
    pub fn reason(&self, node_name: &str, labels: &BTreeMap<String, String>) -> String {
        let found = match self.value_on(node_name, labels) {
            Some(value) => format!("is {value:?}"),
            None => "is not set".to_string(),
        };
        let wants = match self.operator {
            Operator::Exists => "wants it set".to_string(),
            Operator::Equal => format!("wants {:?}", self.value),
            Operator::NotEqual => format!("wants anything but {:?}", self.value),
            Operator::In => format!("wants one of {}", self.value),
            Operator::NotIn => format!("wants none of {}", self.value),
        };
        format!("{} {found}, {wants}", self.attribute)
    }

    /// What is wrong with the constraint, naming `path` (`Constraints[0]`).
    pub fn findings(&self, path: &str) -> Vec<String> {
        let mut findings = Vec::new();
        let attribute = self.attribute.trim();
        let label_ok = attribute
            .strip_prefix("label.")
            .is_some_and(|key| !key.is_empty() && key.chars().all(label_char));
        if attribute != "node.name" && !label_ok {
            findings.push(format!(
                "{path}.Attribute: {:?} is not node.name or label.KEY (KEY of letters, digits, \
                 '.', '_', '-' and '/')",
                self.attribute
            ));
        }
        match self.operator {
            Operator::Exists => {}
            Operator::In | Operator::NotIn if self.values().next().is_none() => {
                findings.push(format!(
                    "{path}.Value: {} needs a comma-separated list of values",
                    self.operator.symbol()
                ))
            }
            _ => {}
        }
        if self.value.chars().any(char::is_control) {
            findings.push(format!("{path}.Value: contains a control character"));
        }
        findings
    }
}

/// The characters of a label's key and value.
pub fn label_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/')
}

fn name_findings(path: &str, name: &str) -> Vec<String> {
    if name.is_empty() {
        return vec![format!(
            "{path}: missing; a name of letters, digits, '_' and '-'"
        )];
    }
    let mut findings = Vec::new();
    if name.chars().count() > MAX_NAME_LEN {
        findings.push(format!(
            "{path}: {} characters; at most {MAX_NAME_LEN}",
            name.chars().count()
        ));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
    {
        findings.push(format!(
            "{path}: {name:?} may hold only letters, digits, '_' and '-'"
        ));
    }
    findings
}

/// The key a job is known by in the manager (its records, its copies' `Job`, its waiting-list
/// entry, its events): its name in `default`, `PROJECT/NAME` in any other project, so that
/// names are unique within a project and a job of `default` is keyed as before projects.
/// A job's name holds no `/`, so the two never meet.
pub fn job_key(project: &str, name: &str) -> String {
    if project.is_empty() || project == crate::project::DEFAULT_PROJECT {
        name.to_string()
    } else {
        format!("{project}/{name}")
    }
}

/// The project of the job keyed `key` ([`job_key`]'s inverse): what comes before the `/`,
/// `default` when there is none.
pub fn project_of_key(key: &str) -> &str {
    match key.split_once('/') {
        Some((project, _)) => project,
        None => crate::project::DEFAULT_PROJECT,
    }
}

impl Job {
    /// The key the manager knows the job by ([`job_key`]).
    pub fn key(&self) -> String {
        job_key(self.project(), &self.name)
    }

    /// The job's project: `default` when the job names none.
    pub fn project(&self) -> &str {
        crate::project::name_or_default(&self.project)
    }

    /// What the job expands to: the sum over its groups of `Count` copies of the group's
    /// task spec, each as the JSON it is stored as, and a finding naming the largest group when
    /// the sum is over [`MAX_EXPANDED_BYTES`]. A system job has no count (one copy per node)
    /// and counts as one copy per group here.
    pub fn expansion_finding(&self) -> Option<String> {
        let groups: Vec<(usize, u64, u64)> = self
            .groups
            .iter()
            .enumerate()
            .map(|(n, group)| {
                let spec = serde_json::to_vec(&group.task).map_or(0, |json| json.len() as u64);
                (n, u64::from(group.count.unwrap_or(1)), spec)
            })
            .collect();
        let total: u64 = groups.iter().map(|(_, count, spec)| count * spec).sum();
        if total <= MAX_EXPANDED_BYTES {
            return None;
        }
        let (n, count, spec) = groups
            .iter()
            .max_by_key(|(_, count, spec)| count * spec)
            .copied()
            .unwrap_or_default();
        let size = crate::size::format_size;
        Some(format!(
            "Groups[{n}]: {count} copies of a {} task spec expand to {} ({} for the whole job), \
             more than the {} one job may expand to; lower Count, or make the task smaller \
             (a long Cmd or Env)",
            size(spec),
            size(count * spec),
            size(total),
            size(MAX_EXPANDED_BYTES),
        ))
    }

    /// Everything wrong with the job as submitted, each finding naming its field
    /// (`Groups[0].Count: ...`); the group's task template is validated as a task is.
    pub fn validate(&self) -> Vec<String> {
        let mut findings = name_findings("Name", &self.name);
        if self.priority > 100 {
            findings.push(format!("Priority: {} is out of range 0-100", self.priority));
        }
        findings.extend(crate::task::owner_findings("Owner", &self.owner));
        if !self.project.is_empty()
            && let Err(why) = crate::project::check_project_name(&self.project)
        {
            findings.push(format!("Project: {why}"));
        }
        if let Some(timeout) = self.queue_timeout {
            if timeout.is_zero() {
                findings.push("QueueTimeout: must be longer than 0".to_string());
            } else if timeout > crate::duration::MAX_TASK_DURATION {
                findings.push(format!(
                    "QueueTimeout: {} is more than the limit of {}",
                    crate::duration::format_duration(timeout),
                    crate::duration::MAX_TASK_DURATION_TEXT
                ));
            }
        }
        for (n, constraint) in self.constraints.iter().enumerate() {
            findings.extend(constraint.findings(&format!("Constraints[{n}]")));
        }
        if self.groups.is_empty() {
            findings.push("Groups: a job needs at least one group".to_string());
        }
        if self.groups.len() > MAX_GROUPS {
            findings.push(format!(
                "Groups: {} groups; at most {MAX_GROUPS}",
                self.groups.len()
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (n, group) in self.groups.iter().enumerate() {
            let path = format!("Groups[{n}]");
            findings.extend(name_findings(&format!("{path}.Name"), &group.name));
            if !seen.insert(group.name.as_str()) {
                findings.push(format!(
                    "{path}.Name: {:?} is used by an earlier group",
                    group.name
                ));
            }
            match (self.job_type, group.count) {
                (JobType::System, Some(_)) => findings.push(format!(
                    "{path}.Count: a system job runs one copy on every matching node; leave Count out"
                )),
                (JobType::Service | JobType::Batch, None) => findings.push(format!(
                    "{path}.Count: missing; how many copies (0 to {MAX_COUNT})"
                )),
                (_, Some(count)) if count > MAX_COUNT => findings.push(format!(
                    "{path}.Count: {count} is more than {MAX_COUNT}"
                )),
                _ => {}
            }
            for (c, constraint) in group.constraints.iter().enumerate() {
                findings.extend(constraint.findings(&format!("{path}.Constraints[{c}]")));
            }
            if let Some(update) = &group.update {
                if self.job_type == JobType::Service {
                    findings.extend(update.findings(&format!("{path}.Update"), group.count));
                } else {
                    findings.push(format!(
                        "{path}.Update: rolling updates are for service jobs; a {} job's \
                         copies are replaced at once",
                        self.job_type.name()
                    ));
                }
            }
            if !group.task.id.is_nil() {
                findings.push(format!(
                    "{path}.Task.ID: a job's tasks get their IDs from the job; leave ID out"
                ));
            }
            if group.task.spec.project != crate::project::DEFAULT_PROJECT {
                findings.push(format!(
                    "{path}.Task.Project: a job's copies are in the job's project; set \
                     Project on the job"
                ));
            }
            for (field, set) in [
                ("Owner", !group.task.spec.owner.is_empty()),
                ("Priority", group.task.spec.priority.is_some()),
                ("QueueTimeout", group.task.spec.queue_timeout.is_some()),
            ] {
                if set {
                    findings.push(format!(
                        "{path}.Task.{field}: a job's copies wait in the queue as one request; \
                         set {field} on the job"
                    ));
                }
            }
            findings.extend(
                group
                    .task
                    .validate()
                    .into_iter()
                    .map(|finding| format!("{path}.Task.{finding}")),
            );
        }
        findings
    }

    /// The constraints of one group: the job's, then the group's own.
    pub fn constraints_of<'a>(&'a self, group: &'a Group) -> impl Iterator<Item = &'a Constraint> {
        self.constraints.iter().chain(group.constraints.iter())
    }
}

/// A job as the manager keeps it: the spec, its version (one more for every change of the
/// spec; a scale is not one), when it was last submitted, and whether it was stopped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobRecord {
    #[serde(rename = "Job")]
    pub job: Job,
    #[serde(rename = "Version")]
    pub version: u64,
    #[serde(rename = "SubmitTime", with = "crate::time::optional", default)]
    pub submit_time: Option<chrono::DateTime<chrono::Utc>>,
    /// `DELETE /jobs/{name}` was asked: every task of the job is stopped, none is created.
    #[serde(rename = "Stopped", default)]
    pub stopped: bool,
    /// `cube job promote` was asked for this version: its deployment's canaries are good,
    /// and the rest of the copies may be replaced. A new version starts unpromoted.
    #[serde(rename = "Promoted", default, skip_serializing_if = "is_false")]
    pub promoted: bool,
    /// The version whose spec this one restores (`cube job revert`, or a deployment that
    /// failed with `AutoRevert`): it is deployed without canaries.
    #[serde(rename = "RevertOf", default, skip_serializing_if = "Option::is_none")]
    pub revert_of: Option<u64>,
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// The most versions kept of one job (the newest; the newest stable one is kept too, so that
/// a failed deployment always has a version to go back to).
pub const VERSIONS_KEPT: usize = 20;

/// One version of a job, as `GET /jobs/{name}/versions` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobVersion {
    #[serde(rename = "Version")]
    pub version: u64,
    #[serde(rename = "SubmitTime", with = "crate::time::optional", default)]
    pub submit_time: Option<chrono::DateTime<chrono::Utc>>,
    /// A deployment of this version succeeded: a failed deployment may go back to it.
    #[serde(rename = "Stable", default)]
    pub stable: bool,
    /// What changed from the version before it, one line per field ([`Job::diff`]).
    #[serde(rename = "Diff", default)]
    pub diff: Vec<String>,
    #[serde(rename = "RevertOf", default, skip_serializing_if = "Option::is_none")]
    pub revert_of: Option<u64>,
    /// The job as this version had it.
    #[serde(rename = "Job")]
    pub job: Job,
}

/// Every kept version of one job, oldest first: what the manager stores under the job's name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobHistory {
    #[serde(rename = "Versions")]
    pub versions: Vec<JobVersion>,
}

impl JobHistory {
    pub fn get(&self, version: u64) -> Option<&JobVersion> {
        self.versions.iter().find(|kept| kept.version == version)
    }

    /// The newest stable version before `version`, if one is kept.
    pub fn last_stable_before(&self, version: u64) -> Option<&JobVersion> {
        self.versions
            .iter()
            .rev()
            .find(|kept| kept.stable && kept.version < version)
    }

    /// Adds `added` (replacing a kept entry of the same number or above: a version written
    /// before a crash whose job record never was), then forgets the oldest beyond
    /// [`VERSIONS_KEPT`], except the newest stable one.
    pub fn push(&mut self, added: JobVersion) {
        self.versions.retain(|kept| kept.version < added.version);
        self.versions.push(added);
        while self.versions.len() > VERSIONS_KEPT {
            let newest_stable = self
                .versions
                .iter()
                .rev()
                .find(|kept| kept.stable)
                .map(|kept| kept.version);
            let Some(oldest) = self
                .versions
                .iter()
                .position(|kept| Some(kept.version) != newest_stable)
            else {
                break;
            };
            self.versions.remove(oldest);
        }
    }

    /// Marks a version stable; false when it is not kept or was already.
    pub fn mark_stable(&mut self, version: u64) -> bool {
        match self
            .versions
            .iter_mut()
            .find(|kept| kept.version == version)
        {
            Some(kept) if !kept.stable => {
                kept.stable = true;
                true
            }
            _ => false,
        }
    }
}

/// The most lines [`Job::diff`] gives; more are counted in a last line.
pub const DIFF_LINES: usize = 12;
/// The longest a value is shown in a diff line.
const DIFF_VALUE_CHARS: usize = 60;

impl Job {
    /// What changed from `self` to `newer`, one line per changed field, as
    /// `Groups[api].Task.Image: "a" -> "b"`, `+ Groups[db]`, `- Groups[old]` (groups named,
    /// not numbered), at most [`DIFF_LINES`] lines.
    pub fn diff(&self, newer: &Job) -> Vec<String> {
        let mut before = BTreeMap::new();
        let mut after = BTreeMap::new();
        flatten("", &job_value(self), &mut before);
        flatten("", &job_value(newer), &mut after);
        let mut lines = Vec::new();
        let names = |job: &Job| -> std::collections::BTreeSet<String> {
            job.groups.iter().map(|group| group.name.clone()).collect()
        };
        let (old_groups, new_groups) = (names(self), names(newer));
        // A group that came or went is one line, not one per field.
        let whole: Vec<String> = old_groups
            .symmetric_difference(&new_groups)
            .map(|name| format!("Groups[{name}]"))
            .collect();
        for name in new_groups.difference(&old_groups) {
            lines.push(format!("+ Groups[{name}]"));
        }
        for name in old_groups.difference(&new_groups) {
            lines.push(format!("- Groups[{name}]"));
        }
        let mut keys: Vec<&String> = before.keys().chain(after.keys()).collect();
        keys.sort();
        keys.dedup();
        keys.retain(|key| {
            !whole.iter().any(|group| {
                key.strip_prefix(group.as_str())
                    .is_some_and(|rest| rest.starts_with('.'))
            })
        });
        for key in keys {
            match (before.get(key), after.get(key)) {
                (Some(old), Some(new)) if old != new => {
                    lines.push(format!("{key}: {} -> {}", shown(old), shown(new)))
                }
                (Some(_), None) => lines.push(format!("- {key}")),
                (None, Some(new)) => lines.push(format!("+ {key}: {}", shown(new))),
                _ => {}
            }
        }
        if lines.len() > DIFF_LINES {
            let more = lines.len() - (DIFF_LINES - 1);
            lines.truncate(DIFF_LINES - 1);
            lines.push(format!("... and {more} more"));
        }
        lines
    }
}

/// A job as JSON with its groups keyed by name (`Groups[api]`), so that a diff follows a
/// group, not its position.
fn job_value(job: &Job) -> serde_json::Value {
    let mut value = serde_json::to_value(job).unwrap_or(serde_json::Value::Null);
    if let Some(object) = value.as_object_mut() {
        let groups: serde_json::Map<String, serde_json::Value> = job
            .groups
            .iter()
            .map(|group| {
                let mut value = serde_json::to_value(group).unwrap_or(serde_json::Value::Null);
                if let Some(group) = value.as_object_mut() {
                    group.remove("Name");
                }
                (group.name.clone(), value)
            })
            .collect();
        object.insert("Groups".to_string(), serde_json::Value::Object(groups));
    }
    value
}

/// The leaves of a JSON value by path: objects by key (`Task.Image`; the groups as
/// `Groups[api]`), arrays and empty objects as whole values.
fn flatten(path: &str, value: &serde_json::Value, out: &mut BTreeMap<String, serde_json::Value>) {
    match value {
        serde_json::Value::Object(object) if !object.is_empty() => {
            for (key, child) in object {
                let child_path = if path == "Groups" {
                    format!("Groups[{key}]")
                } else if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                flatten(&child_path, child, out);
            }
        }
        serde_json::Value::Null => {}
        _ => {
            out.insert(path.to_string(), value.clone());
        }
    }
}

fn shown(value: &serde_json::Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= DIFF_VALUE_CHARS {
        return text;
    }
    let cut: String = text.chars().take(DIFF_VALUE_CHARS - 3).collect();
    format!("{cut}...")
}

/// The name of a job's task: `web.api[2]`, as Nomad names allocations.
pub fn task_name(job: &str, group: &str, index: u32) -> String {
    format!("{job}.{group}[{index}]")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_group(count: Option<u32>, command_bytes: usize, job_type: JobType) -> Job {
        let mut task = Task::new("", "cube-sample:latest");
        task.spec.cmd = vec!["x".repeat(command_bytes)];
        Job {
            name: "p".into(),
            job_type,
            priority: DEFAULT_PRIORITY,
            constraints: Vec::new(),
            owner: String::new(),
            project: String::new(),
            queue_timeout: None,
            groups: vec![Group {
                name: "g".into(),
                count,
                constraints: Vec::new(),
                task,
                update: None,
            }],
        }
    }

    #[test]
    fn a_job_may_expand_to_64_mib_of_copies_and_no_more() {
        // 10,000 copies of a small task, and one copy of a 200 KB one: well within.
        assert_eq!(
            one_group(Some(10_000), 10, JobType::Service).expansion_finding(),
            None
        );
        assert_eq!(
            one_group(Some(1), 200_000, JobType::Batch).expansion_finding(),
            None
        );
        // 10,000 copies of a 200 KB command: 1.9 GiB, named by its group.
        let finding = one_group(Some(10_000), 200_000, JobType::Service)
            .expansion_finding()
            .expect("refused");
        assert!(
            finding.starts_with("Groups[0]: 10000 copies of a 195.") && finding.contains("1.9 GiB"),
            "{finding}"
        );
        // Around the line: 340 copies of a 200 KB task (and its JSON) are over 64 MiB, 330 under.
        assert!(
            one_group(Some(340), 200_000, JobType::Service)
                .expansion_finding()
                .is_some()
        );
        assert!(
            one_group(Some(330), 200_000, JobType::Service)
                .expansion_finding()
                .is_none()
        );
        // A system job counts one copy per group.
        assert_eq!(
            one_group(None, 200_000, JobType::System).expansion_finding(),
            None
        );
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn constraint(attribute: &str, operator: Operator, value: &str) -> Constraint {
        Constraint {
            attribute: attribute.into(),
            operator,
            value: value.into(),
        }
    }

    #[test]
    fn the_issues_example_job_reads_and_is_valid() {
        let job: Job = serde_json::from_str(
            r#"{"Name": "web", "Type": "service",
               "Constraints": [{"Attribute": "label.zone", "Operator": "=", "Value": "eu"}],
               "Groups": [{"Name": "api", "Count": 3,
                           "Task": {"Image": "cube-sample:latest", "Memory": "64MiB",
                                    "ExposedPorts": {"7777/tcp": {}}, "PortBindings": {"7777/tcp": ""},
                                    "HealthCheck": "/health", "RestartPolicy": "on-failure"}}]}"#,
        )
        .unwrap();
        assert_eq!(job.validate(), Vec::<String>::new());
        assert_eq!(job.priority, 50);
        assert_eq!(job.groups[0].count, Some(3));
        assert_eq!(task_name(&job.name, &job.groups[0].name, 2), "web.api[2]");
    }

    #[test]
    fn validation_names_each_field_at_fault() {
        let job: Job = serde_json::from_str(
            r#"{"Name": "web app", "Type": "system", "Priority": 200,
               "Constraints": [{"Attribute": "zone", "Value": "eu"}],
               "Groups": [{"Name": "api", "Count": 3, "Task": {"Image": ""}},
                          {"Name": "api", "Task": {"Image": "x", "Cpu": -1}}]}"#,
        )
        .unwrap();
        let findings = job.validate().join("\n");
        for expected in [
            "Name: \"web app\" may hold only",
            "Priority: 200 is out of range",
            "Constraints[0].Attribute:",
            "Groups[0].Count: a system job",
            "Groups[0].Task.Image:",
            "Groups[1].Name: \"api\" is used by an earlier group",
            "Groups[1].Task.Cpu:",
        ] {
            assert!(
                findings.contains(expected),
                "{expected} not in:\n{findings}"
            );
        }
        let service: Job = serde_json::from_str(
            r#"{"Name": "w", "Groups": [{"Name": "g", "Task": {"Image": "x"}}]}"#,
        )
        .unwrap();
        assert!(
            service
                .validate()
                .join("\n")
                .contains("Groups[0].Count: missing")
        );
        let bad_type =
            serde_json::from_str::<Job>(r#"{"Name": "w", "Type": "sometimes", "Groups": []}"#)
                .unwrap_err();
        assert!(bad_type.to_string().contains("sometimes"), "{bad_type}");
    }

    #[test]
    fn constraints_admit_and_explain() {
        let eu = labels(&[("zone", "eu"), ("disk", "ssd")]);
        let us = labels(&[("zone", "us")]);
        let zone = constraint("label.zone", Operator::Equal, "eu");
        assert!(zone.admits("w1", &eu));
        assert!(!zone.admits("w2", &us));
        assert_eq!(zone.reason("w2", &us), "label.zone is \"us\", wants \"eu\"");
        assert!(constraint("label.disk", Operator::Exists, "").admits("w1", &eu));
        assert!(!constraint("label.disk", Operator::Exists, "").admits("w2", &us));
        assert!(constraint("label.zone", Operator::In, "eu, ap").admits("w1", &eu));
        assert!(constraint("label.zone", Operator::NotIn, "eu,ap").admits("w2", &us));
        assert!(constraint("label.gpu", Operator::NotIn, "a100").admits("w2", &us));
        assert!(constraint("label.zone", Operator::NotEqual, "eu").admits("w2", &us));
        assert!(constraint("node.name", Operator::Equal, "w1").admits("w1", &us));
        assert_eq!(
            constraint("label.gpu", Operator::Equal, "a100").reason("w2", &us),
            "label.gpu is not set, wants \"a100\""
        );
    }

    fn service_with(update: &str) -> Job {
        serde_json::from_str(&format!(
            r#"{{"Name": "web", "Groups": [{{"Name": "api", "Count": 2,
                 "Task": {{"Image": "cube-sample:latest"}}, "Update": {update}}}]}}"#
        ))
        .unwrap()
    }

    #[test]
    fn an_update_block_is_checked_field_by_field() {
        assert_eq!(
            service_with(r#"{"MaxParallel": 2, "MinHealthyTime": "0s"}"#).validate(),
            Vec::<String>::new()
        );
        for (update, expected) in [
            (r#"{"MaxParallel": 0}"#, "Groups[0].Update.MaxParallel: 0"),
            (
                r#"{"Canary": 3}"#,
                "Groups[0].Update.Canary: 3 canaries for a group of 2",
            ),
            (
                r#"{"MinHealthyTime": "2m"}"#,
                "Groups[0].Update.HealthyDeadline: 60s must be longer than MinHealthyTime",
            ),
            (
                r#"{"ProgressDeadline": "10s"}"#,
                "Groups[0].Update.ProgressDeadline: 10s is shorter than HealthyDeadline",
            ),
            (r#"{"HealthyDeadline": "500h"}"#, "is more than a week"),
        ] {
            let findings = service_with(update).validate().join("\n");
            assert!(findings.contains(expected), "{update}: {findings}");
        }
        let unknown = serde_json::from_str::<Job>(
            r#"{"Name": "w", "Groups": [{"Name": "g", "Count": 1, "Task": {"Image": "x"},
                 "Update": {"MaxParalel": 2}}]}"#,
        )
        .unwrap_err();
        assert!(unknown.to_string().contains("MaxParalel"), "{unknown}");
        let mut batch = service_with(r#"{"MaxParallel": 2}"#);
        batch.job_type = JobType::Batch;
        assert!(
            batch
                .validate()
                .join("\n")
                .contains("Groups[0].Update: rolling updates are for service jobs")
        );
    }

    #[test]
    fn a_diff_names_each_changed_field_and_groups_by_name() {
        let old = service_with("{}");
        let mut new = old.clone();
        new.groups[0].task.spec.cmd = vec!["sh".into(), "-c".into(), "exit 1".into()];
        new.groups[0].task.spec.image = "cube-sample:v2".into();
        let mut db = new.groups[0].clone();
        db.name = "db".into();
        new.groups.push(db);
        let diff = old.diff(&new);
        assert_eq!(
            diff,
            [
                "+ Groups[db]",
                r#"Groups[api].Task.Cmd: [] -> ["sh","-c","exit 1"]"#,
                r#"Groups[api].Task.Image: "cube-sample:latest" -> "cube-sample:v2""#,
            ]
        );
        assert!(old.diff(&old).is_empty());
    }

    #[test]
    fn a_history_keeps_the_newest_versions_and_the_newest_stable_one() {
        let job = service_with("{}");
        let version = |n: u64| JobVersion {
            version: n,
            submit_time: None,
            stable: false,
            diff: Vec::new(),
            revert_of: None,
            job: job.clone(),
        };
        let mut history = JobHistory::default();
        history.push(version(1));
        assert!(history.mark_stable(1));
        assert!(!history.mark_stable(1), "already stable");
        for n in 2..=30 {
            history.push(version(n));
        }
        assert_eq!(history.versions.len(), VERSIONS_KEPT);
        assert_eq!(history.versions[0].version, 1, "the only stable one stays");
        assert_eq!(history.versions.last().map(|v| v.version), Some(30));
        assert_eq!(history.last_stable_before(30).map(|v| v.version), Some(1));
        // A version written again (after a crash before its record) replaces what is above.
        history.push(version(29));
        assert_eq!(history.versions.last().map(|v| v.version), Some(29));
        assert!(history.get(30).is_none());
    }
}
