//! A job: what the user wants to keep running, in groups of copies of one task template —
//! `service` (keep `Count` copies running), `batch` (run `Count` copies to completion) or
//! `system` (one copy on every `Ready` node that matches the constraints).
//!
//! This file holds the job as submitted (the spec) and its validation; the tasks a job owns
//! are computed from it by the manager's job controller. A constraint is a predicate over a
//! node's name and labels ([`Constraint::admits`]), asked by the scheduler's feasibility chain.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::task::Task;

/// The most groups one job may have, and the most copies of one group: a job is one request,
/// and 10,000 copies is already a large cluster's worth.
pub const MAX_GROUPS: usize = 100;
pub const MAX_COUNT: u32 = 10_000;
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

impl Job {
    /// Everything wrong with the job as submitted, each finding naming its field
    /// (`Groups[0].Count: ...`); the group's task template is validated as a task is.
    pub fn validate(&self) -> Vec<String> {
        let mut findings = name_findings("Name", &self.name);
        if self.priority > 100 {
            findings.push(format!("Priority: {} is out of range 0-100", self.priority));
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
            if !group.task.id.is_nil() {
                findings.push(format!(
                    "{path}.Task.ID: a job's tasks get their IDs from the job; leave ID out"
                ));
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
}

/// The name of a job's task: `web.api[2]`, as Nomad names allocations.
pub fn task_name(job: &str, group: &str, index: u32) -> String {
    format!("{job}.{group}[{index}]")
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
