//! Projects: each team's tasks, jobs, waiting requests and tokens apart, and the quota that
//! bounds what a project's placed tasks may declare together.
//!
//! Every task and job belongs to one project, [`DEFAULT_PROJECT`] when none is named; a
//! record written before projects existed reads as `default`, and one in `default` is written
//! without `Project`, as before (an older worker refuses fields it does not know).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::size::format_size;

/// The project of whatever names none; it always exists and cannot be removed.
pub const DEFAULT_PROJECT: &str = "default";

/// What `?project=*` and a token's `Projects: ["*"]` mean: every project.
pub const ALL_PROJECTS: &str = "*";

/// The longest project name.
pub const MAX_PROJECT_NAME_LEN: usize = 63;

/// Whether a project field is the default one, written as nothing.
pub fn is_default(project: &String) -> bool {
    project.is_empty() || project == DEFAULT_PROJECT
}

/// A record's project field as a name: empty (written before projects, or left out) is
/// `default`.
pub fn name_or_default(project: &str) -> &str {
    if project.is_empty() {
        DEFAULT_PROJECT
    } else {
        project
    }
}

/// A project name as read: empty (a record from before projects) is `default`.
pub fn normalized(project: String) -> String {
    if project.is_empty() {
        DEFAULT_PROJECT.to_string()
    } else {
        project
    }
}

/// Why `name` cannot name a project: lower-case letters, digits and '-', starting with a
/// letter, at most [`MAX_PROJECT_NAME_LEN`] characters (a name that fits in a DNS label, as
/// Kubernetes' namespaces).
pub fn check_project_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a project name is empty".to_string());
    }
    if name.len() > MAX_PROJECT_NAME_LEN {
        return Err(format!(
            "project name {name:?} has {} characters; at most {MAX_PROJECT_NAME_LEN}",
            name.len()
        ));
    }
    let starts_with_letter = name.starts_with(|c: char| c.is_ascii_lowercase());
    let ends_well = !name.ends_with('-');
    let chars_ok = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !(starts_with_letter && ends_well && chars_ok) {
        return Err(format!(
            "project name {name:?} must be lower-case letters, digits and '-', starting with a \
             letter and not ending with '-'"
        ));
    }
    Ok(())
}

/// The most a project's placed tasks may declare together; an unset limit is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quota {
    /// Cores.
    #[serde(
        rename = "Cpus",
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "optional_cpu"
    )]
    pub cpus: Option<f64>,
    /// Bytes of memory.
    #[serde(
        rename = "Memory",
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "optional_size"
    )]
    pub memory: Option<u64>,
    /// Bytes of disk.
    #[serde(
        rename = "Disk",
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "optional_size"
    )]
    pub disk: Option<u64>,
    /// Placed tasks.
    #[serde(rename = "Tasks", default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<u64>,
}

fn optional_cpu<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    crate::cpu::deserialize_cpu(d).map(Some)
}

fn optional_size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    crate::size::deserialize_size(d).map(Some)
}

/// What tasks declare, summed: a project's usage, or what a request adds to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    #[serde(rename = "Cpus")]
    pub cpus: f64,
    #[serde(rename = "Memory")]
    pub memory: u64,
    #[serde(rename = "Disk")]
    pub disk: u64,
    #[serde(rename = "Tasks")]
    pub tasks: u64,
}

impl Usage {
    /// One task declaring these.
    pub fn of_task(cpus: f64, memory: u64, disk: u64) -> Usage {
        Usage {
            cpus,
            memory,
            disk,
            tasks: 1,
        }
    }

    pub fn add(&mut self, other: &Usage) {
        self.cpus += other.cpus;
        self.memory = self.memory.saturating_add(other.memory);
        self.disk = self.disk.saturating_add(other.disk);
        self.tasks = self.tasks.saturating_add(other.tasks);
    }

    pub fn remove(&mut self, other: &Usage) {
        // Sums of floats drift: a project with nothing placed uses no CPU.
        self.cpus = (self.cpus - other.cpus).max(0.0);
        self.memory = self.memory.saturating_sub(other.memory);
        self.disk = self.disk.saturating_sub(other.disk);
        self.tasks = self.tasks.saturating_sub(other.tasks);
        if self.tasks == 0 {
            self.cpus = 0.0;
        }
    }

    pub fn is_empty(&self) -> bool {
        self.tasks == 0
    }
}

/// A tolerance for sums of CPU fractions (0.1 + 0.2 is not 0.3).
const CPU_EPSILON: f64 = 1e-9;

impl Quota {
    pub fn is_unlimited(&self) -> bool {
        self.cpus.is_none() && self.memory.is_none() && self.disk.is_none() && self.tasks.is_none()
    }

    /// The first limit `used` plus `adding` would pass, as the waiting list says it:
    /// `cpu 1/1`, `memory 15.5/16 GiB`, `tasks 200/200` (what is used now, then the limit).
    pub fn exceeded(&self, used: &Usage, adding: &Usage) -> Option<String> {
        if let Some(limit) = self.cpus
            && adding.cpus > 0.0
            && used.cpus + adding.cpus > limit + CPU_EPSILON
        {
            return Some(format!("cpu {}/{}", cores(used.cpus), cores(limit)));
        }
        if let Some(limit) = self.memory
            && adding.memory > 0
            && used.memory.saturating_add(adding.memory) > limit
        {
            return Some(format!("memory {}", used_of(used.memory, limit)));
        }
        if let Some(limit) = self.disk
            && adding.disk > 0
            && used.disk.saturating_add(adding.disk) > limit
        {
            return Some(format!("disk {}", used_of(used.disk, limit)));
        }
        if let Some(limit) = self.tasks
            && adding.tasks > 0
            && used.tasks.saturating_add(adding.tasks) > limit
        {
            return Some(format!("tasks {}/{limit}", used.tasks));
        }
        None
    }

    /// Why a request declaring `request` could never be admitted, however little the project
    /// used: the limit it is over on its own, `cpu: the request asks 2, the quota is 1`.
    pub fn never_fits(&self, request: &Usage) -> Option<String> {
        if let Some(limit) = self.cpus
            && request.cpus > limit + CPU_EPSILON
        {
            return Some(format!(
                "cpu: the request asks {} cores, the quota is {}",
                cores(request.cpus),
                cores(limit)
            ));
        }
        if let Some(limit) = self.memory
            && request.memory > limit
        {
            return Some(format!(
                "memory: the request asks {}, the quota is {}",
                format_size(request.memory),
                format_size(limit)
            ));
        }
        if let Some(limit) = self.disk
            && request.disk > limit
        {
            return Some(format!(
                "disk: the request asks {}, the quota is {}",
                format_size(request.disk),
                format_size(limit)
            ));
        }
        if let Some(limit) = self.tasks
            && request.tasks > limit
        {
            return Some(format!(
                "tasks: the request asks {} tasks, the quota is {limit}",
                request.tasks
            ));
        }
        None
    }

    /// Each limit set, as `cube project status` shows it: `("cpu", used, limit)`.
    pub fn rows(&self, used: &Usage) -> Vec<(&'static str, String, String)> {
        let mut rows = Vec::new();
        let limit_or = |limit: Option<String>| limit.unwrap_or_else(|| "-".to_string());
        rows.push(("cpu", cores(used.cpus), limit_or(self.cpus.map(cores))));
        rows.push((
            "memory",
            format_size(used.memory),
            limit_or(self.memory.map(format_size)),
        ));
        rows.push((
            "disk",
            format_size(used.disk),
            limit_or(self.disk.map(format_size)),
        ));
        rows.push((
            "tasks",
            used.tasks.to_string(),
            limit_or(self.tasks.map(|tasks| tasks.to_string())),
        ));
        rows
    }
}

/// Cores as people read them: `1`, `0.5`, `2.25`.
fn cores(value: f64) -> String {
    let rounded = (value * 1000.0).round() / 1000.0;
    format!("{rounded}")
}

/// `15.5/16 GiB`: what is used and the limit, in the limit's unit.
fn used_of(used: u64, limit: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    let mut scale = 1u64;
    while unit < UNITS.len() - 1 && limit / scale >= 1024 {
        scale *= 1024;
        unit += 1;
    }
    let show = |bytes: u64| {
        let value = bytes as f64 / scale as f64;
        let rounded = (value * 10.0).round() / 10.0;
        format!("{rounded}")
    };
    format!("{}/{} {}", show(used), show(limit), UNITS[unit])
}

/// A project as stored: its name, its quota, when it was made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProjectRecord {
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Quota", default)]
    pub quota: Quota,
    #[serde(rename = "CreateTime", default, with = "crate::time::optional")]
    pub create_time: Option<DateTime<Utc>>,
}

/// `POST /projects`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectRequest {
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Quota", default)]
    pub quota: Quota,
}

/// `GET /projects` and `GET /projects/{name}`: a project, what its placed tasks use, and how
/// many of its tasks, jobs and waiting requests there are.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProjectView {
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Quota")]
    pub quota: Quota,
    #[serde(rename = "Usage")]
    pub usage: Usage,
    /// Tasks that have not ended.
    #[serde(rename = "Tasks")]
    pub tasks: u64,
    /// Jobs not stopped.
    #[serde(rename = "Jobs")]
    pub jobs: u64,
    /// Requests waiting (for a node or the quota).
    #[serde(rename = "Waiting")]
    pub waiting: u64,
    #[serde(rename = "CreateTime", default, with = "crate::time::optional")]
    pub create_time: Option<DateTime<Utc>>,
    /// The shard its records are in: a hash of its name modulo the ring
    /// (`crate::shard::shard_of`).
    #[serde(rename = "Shard", default)]
    pub shard: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_labels() {
        assert!(check_project_name("team-a").is_ok());
        assert!(check_project_name("a1").is_ok());
        for bad in [
            "",
            "Team",
            "1team",
            "team-",
            "team_a",
            "team/a",
            "*",
            &"a".repeat(64),
        ] {
            assert!(check_project_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_quota_says_the_first_limit_passed_with_its_use() {
        let quota = Quota {
            cpus: Some(1.0),
            memory: Some(16 << 30),
            ..Quota::default()
        };
        let used = Usage {
            cpus: 1.0,
            memory: 15 * (1 << 30) + (1 << 29),
            disk: 0,
            tasks: 1,
        };
        assert_eq!(
            quota.exceeded(&used, &Usage::of_task(1.0, 0, 0)),
            Some("cpu 1/1".to_string())
        );
        assert_eq!(
            quota.exceeded(&used, &Usage::of_task(0.0, 1 << 30, 0)),
            Some("memory 15.5/16 GiB".to_string())
        );
        assert_eq!(
            quota.exceeded(&used, &Usage::of_task(0.0, 1 << 29, 0)),
            None
        );
        // What the request does not ask for is not checked: a project over its CPU quota
        // (lowered below use) still takes a task that declares no CPU.
        assert_eq!(quota.exceeded(&used, &Usage::of_task(0.0, 0, 5)), None);
    }

    #[test]
    fn three_tenths_fit_in_three_tenths() {
        let quota = Quota {
            cpus: Some(0.3),
            ..Quota::default()
        };
        let mut used = Usage::of_task(0.1, 0, 0);
        used.add(&Usage::of_task(0.1, 0, 0));
        assert_eq!(quota.exceeded(&used, &Usage::of_task(0.1, 0, 0)), None);
    }

    #[test]
    fn a_request_larger_than_the_quota_never_fits() {
        let quota = Quota {
            cpus: Some(1.0),
            tasks: Some(3),
            ..Quota::default()
        };
        assert_eq!(
            quota.never_fits(&Usage::of_task(2.0, 0, 0)).as_deref(),
            Some("cpu: the request asks 2 cores, the quota is 1")
        );
        let four = Usage {
            tasks: 4,
            ..Usage::default()
        };
        assert!(quota.never_fits(&four).unwrap().starts_with("tasks"));
        assert_eq!(quota.never_fits(&Usage::of_task(1.0, 0, 0)), None);
    }

    #[test]
    fn a_quota_reads_units() {
        let quota: Quota =
            serde_json::from_str(r#"{"Cpus": "500m", "Memory": "16Gi", "Tasks": 200}"#).unwrap();
        assert_eq!(quota.cpus, Some(0.5));
        assert_eq!(quota.memory, Some(16 << 30));
        assert_eq!(quota.tasks, Some(200));
        assert!(serde_json::from_str::<Quota>(r#"{"Gpus": 1}"#).is_err());
    }

    #[test]
    fn usage_falls_back_to_nothing() {
        let mut used = Usage::default();
        let task = Usage::of_task(0.1, 10, 0);
        used.add(&task);
        used.add(&task);
        used.remove(&task);
        used.remove(&task);
        assert_eq!(used, Usage::default());
    }
}
