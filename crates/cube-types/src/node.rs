//! A node: a worker as the manager knows it, and what a worker says about itself.

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::job::label_char;
use crate::stats::Stats;

/// A node's labels, `{"zone": "eu", "disk": "ssd"}`: what constraints (`label.zone = eu`)
/// are asked about. Set by the worker's operator (`cube worker --label zone=eu`).
pub type Labels = BTreeMap<String, String>;

/// The most labels one node may carry.
pub const MAX_LABELS: usize = 64;
/// The longest label key, and the longest label value, in characters.
pub const MAX_LABEL_CHARS: usize = 63;

/// The most CPU a task may ask for or a node offer: 1,024 cores, more than any one machine
/// has. The limit is there to refuse a slip (`1e300`), not to size machines.
pub const MAX_CPU_CORES: f64 = 1024.0;
/// The most memory a task may ask for or a node offer: 1 PiB (2^50 bytes), far above any one
/// machine, and far below where sums of many tasks' memory could overflow a `u64`.
pub const MAX_MEMORY_BYTES: u64 = 1 << 50;
/// The most disk a task may ask for or a node offer: 1 PiB (2^50 bytes), for the same reasons.
pub const MAX_DISK_BYTES: u64 = 1 << 50;

/// An amount of each resource the scheduler counts: CPU in cores, memory and disk in bytes.
/// Sizes also read as strings with units (`"2GiB"`, see [`crate::size`]), CPU as `"500m"`
/// (see [`crate::cpu`]).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    #[serde(
        rename = "Cpu",
        default,
        deserialize_with = "crate::cpu::deserialize_cpu"
    )]
    pub cpu: f64,
    #[serde(
        rename = "Memory",
        default,
        deserialize_with = "crate::size::deserialize_size"
    )]
    pub memory: u64,
    #[serde(
        rename = "Disk",
        default,
        deserialize_with = "crate::size::deserialize_size"
    )]
    pub disk: u64,
}

impl Resources {
    /// What is out of range, each finding naming its field after `prefix` (`"Capacity."` for a
    /// node, `""` for a task): CPU finite and 0 to [`MAX_CPU_CORES`], memory and disk at most
    /// [`MAX_MEMORY_BYTES`] and [`MAX_DISK_BYTES`].
    pub fn findings(&self, prefix: &str) -> Vec<String> {
        let mut findings = Vec::new();
        if !self.cpu.is_finite() || self.cpu < 0.0 {
            findings.push(format!(
                "{prefix}Cpu: {} is not a number of cores >= 0",
                show_number(self.cpu)
            ));
        } else if self.cpu > MAX_CPU_CORES {
            findings.push(format!(
                "{prefix}Cpu: {} cores is more than the limit of {MAX_CPU_CORES} cores",
                show_number(self.cpu)
            ));
        }
        for (field, bytes, limit) in [
            ("Memory", self.memory, MAX_MEMORY_BYTES),
            ("Disk", self.disk, MAX_DISK_BYTES),
        ] {
            if bytes > limit {
                findings.push(format!(
                    "{prefix}{field}: {bytes} bytes is more than the limit of {limit} bytes (1 PiB)"
                ));
            }
        }
        findings
    }
}

/// A number as a message shows it: `1e300` rather than its 301 digits.
pub(crate) fn show_number(value: f64) -> String {
    if value.abs() >= 1e9 {
        format!("{value:e}")
    } else {
        value.to_string()
    }
}

/// Whether the scheduler may place work on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeStatus {
    /// Reported within the heartbeat grace period.
    Ready,
    /// Silent for longer than the grace period, or never reached.
    Down,
    /// It reports, but the manager cannot reach its API at the address it advertised (a
    /// wrong `--advertise`, a firewall): nothing can be sent to it, so it takes no work.
    /// `StatusReason` says what the manager saw.
    Unreachable,
}

impl fmt::Display for NodeStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NodeStatus::Ready => "Ready",
            NodeStatus::Down => "Down",
            NodeStatus::Unreachable => "Unreachable",
        })
    }
}

/// What a worker says about itself: the body of its registration and of every heartbeat
/// (`PUT /nodes/{name}` on the manager), and what `GET /node` on the worker answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeReport {
    #[serde(rename = "Name")]
    pub name: String,
    /// Where the manager reaches the worker's API: `http://HOST:PORT`.
    #[serde(rename = "Address")]
    pub address: String,
    /// What the worker offers to tasks: the machine's size unless the operator set less.
    #[serde(rename = "Capacity")]
    pub capacity: Resources,
    #[serde(rename = "Stats", default)]
    pub stats: Option<Stats>,
    /// The operator's labels for the node (`cube worker --label zone=eu`).
    #[serde(rename = "Labels", default, skip_serializing_if = "Labels::is_empty")]
    pub labels: Labels,
    /// The worker's build and its container engine's version.
    #[serde(rename = "Version", default, skip_serializing_if = "Option::is_none")]
    pub version: Option<crate::version::VersionInfo>,
    /// What the worker lets a task reach of its host; `None` from a worker that does not say
    /// (placement then leaves the check to the worker).
    #[serde(
        rename = "HostPolicy",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub host_policy: Option<HostPolicy>,
    /// The named volumes Cube made on the node and the engine still holds.
    #[serde(rename = "Volumes", default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<crate::secret::VolumeInfo>,
}

/// A drain under way: the node's service and batch job copies move elsewhere (each new copy
/// healthy before the old one stops).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Drain {
    #[serde(rename = "StartTime", with = "crate::time::optional", default)]
    pub start_time: Option<DateTime<Utc>>,
    /// After this, the copies still on the node are stopped without waiting for their
    /// replacement; `None`: no deadline.
    #[serde(rename = "Deadline", with = "crate::time::optional", default)]
    pub deadline: Option<DateTime<Utc>>,
    /// Job copies still on the node that the drain moves (filled in by the manager when it
    /// shows the node).
    #[serde(rename = "Remaining", default)]
    pub remaining: usize,
    /// Tasks that stay: bare tasks (no job makes a copy of them first) and system jobs'.
    #[serde(rename = "Staying", default)]
    pub staying: usize,
}

/// What is wrong with one label, without naming it: a key of 1 to [`MAX_LABEL_CHARS`]
/// characters and a value of at most as many, both of letters, digits, `.`, `_`, `-` and `/`
/// (the value may be empty).
pub fn label_problem(key: &str, value: &str) -> Option<String> {
    if key.is_empty() {
        return Some("a label needs a key".to_string());
    }
    for (what, text) in [("key", key), ("value", value)] {
        let chars = text.chars().count();
        if chars > MAX_LABEL_CHARS {
            return Some(format!(
                "the {what} has {chars} characters; at most {MAX_LABEL_CHARS}"
            ));
        }
        if let Some(bad) = text.chars().find(|&c| !label_char(c)) {
            return Some(format!(
                "the {what} {text:?} contains {bad:?}; use letters, digits, '.', '_', '-' and '/'"
            ));
        }
    }
    None
}

/// A label as the command line gives it, `KEY=VALUE`, checked as a report's labels are.
pub fn parse_label(text: &str) -> Result<(String, String), String> {
    let Some((key, value)) = text.split_once('=') else {
        return Err(format!("{text:?} is not KEY=VALUE (e.g. zone=eu)"));
    };
    match label_problem(key, value) {
        Some(problem) => Err(format!("{text:?}: {problem}")),
        None => Ok((key.to_string(), value.to_string())),
    }
}

/// Where the container engine listens, in the two usual spellings (`/var/run` is a link to
/// `/run`): a bind mount of either (or of a directory holding it) hands a task the host.
pub const DOCKER_SOCKETS: [&str; 2] = ["/var/run/docker.sock", "/run/docker.sock"];

/// What a worker lets a task reach of its host (`allowed_host_paths`, `allow_host_network`,
/// `allow_docker_socket` in `cube worker --config`), reported with the node so that placement
/// leaves out a node that would refuse a task rather than send it there to fail.
///
/// The worker's own check (`cube-worker/src/host_access.rs`) stays the authority: it also
/// resolves symbolic links on its host. What is reported here is never stricter than it:
/// `AllowedHostPaths` holds each allowed directory both as written and as the worker's host
/// resolves it, and [`HostPolicy::refusal`] refuses only what the worker would refuse too.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostPolicy {
    /// Directories a bind mount may be under (itself or below): absolute and normalised.
    #[serde(rename = "AllowedHostPaths", default)]
    pub allowed_host_paths: Vec<String>,
    #[serde(rename = "AllowHostNetwork", default)]
    pub allow_host_network: bool,
    #[serde(rename = "AllowDockerSocket", default)]
    pub allow_docker_socket: bool,
}

/// What a task asks of its node's host: the host paths its pod bind-mounts and whether it
/// takes the host's network. Empty for a single container, which can ask for neither.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostNeeds {
    /// Each bind mount's host path, normalised, with the service that asks for it.
    pub bind_mounts: Vec<(String, String)>,
    pub host_network: bool,
}

impl HostNeeds {
    /// What `task` asks of its host; `None` when it asks for nothing.
    pub fn of(task: &crate::Task) -> Option<HostNeeds> {
        let pod = task.spec.pod.as_ref()?;
        let bind_mounts: Vec<(String, String)> = pod
            .spec
            .services
            .iter()
            .flat_map(|service| {
                service
                    .mounts
                    .iter()
                    .filter(|mount| mount.kind == crate::pod::MountKind::Bind)
                    .map(|mount| {
                        let path = normalise_host_path(&mount.source);
                        (service.name.clone(), path)
                    })
            })
            .collect();
        let host_network = pod.spec.network == crate::pod::PodNetwork::Host;
        (host_network || !bind_mounts.is_empty()).then_some(HostNeeds {
            bind_mounts,
            host_network,
        })
    }
}

impl HostPolicy {
    /// Whether a node with this policy takes a task asking `needs`: what
    /// [`HostPolicy::refusal`] says, without building its words (placement asks it of every
    /// node).
    pub fn allows(&self, needs: &HostNeeds) -> bool {
        (!needs.host_network || self.allow_host_network)
            && needs
                .bind_mounts
                .iter()
                .all(|(_, path)| self.allows_path(path) && !self.gives_socket(path))
    }

    /// Whether `path` is at or under one of the allowed directories.
    fn allows_path(&self, path: &str) -> bool {
        self.allowed_host_paths
            .iter()
            .any(|allowed| path_is_under(path, allowed))
    }

    /// Whether a bind mount of `path` would hand over the Docker socket this policy refuses.
    fn gives_socket(&self, path: &str) -> bool {
        !self.allow_docker_socket
            && DOCKER_SOCKETS
                .iter()
                .any(|socket| path_is_under(socket, path))
    }

    /// Why a node with this policy would refuse a task asking `needs`, naming the setting
    /// that would allow it, or `None` when it would not. Paths are compared as written
    /// (normalised); the worker also compares them resolved, which can only refuse more.
    pub fn refusal(&self, needs: &HostNeeds) -> Option<String> {
        let mut refusals = Vec::new();
        if needs.host_network && !self.allow_host_network {
            refusals.push("network_mode: host (the node has allow_host_network off)".to_string());
        }
        for (service, path) in &needs.bind_mounts {
            if !self.allows_path(path) {
                let allowed = if self.allowed_host_paths.is_empty() {
                    "none".to_string()
                } else {
                    self.allowed_host_paths.join(", ")
                };
                refusals.push(format!(
                    "services.{service}: bind mount of {path} is not under the node's \
                     allowed_host_paths ({allowed})"
                ));
            } else if self.gives_socket(path) {
                refusals.push(format!(
                    "services.{service}: bind mount of {path} gives the Docker socket (the node \
                     has allow_docker_socket off)"
                ));
            }
        }
        (!refusals.is_empty()).then(|| refusals.join("; "))
    }
}

/// Whether `path` is `dir` or below it, both absolute and normalised, component by
/// component (`/data2` is not under `/data`).
fn path_is_under(path: &str, dir: &str) -> bool {
    std::path::Path::new(path).starts_with(dir)
}

/// `path` made absolute and without `.`, `..` or repeated separators, without asking the
/// file system: `..` at the root stays at the root, as the kernel has it.
pub fn normalise_host_path(path: &str) -> String {
    normalised(std::path::Path::new(path)).display().to_string()
}

/// [`normalise_host_path`] on a path.
pub fn normalised(path: &std::path::Path) -> std::path::PathBuf {
    use std::path::Component;
    let mut normal = std::path::PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::Normal(part) => normal.push(part),
            Component::ParentDir => {
                normal.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    normal
}

/// The longest node name the manager takes.
pub const MAX_NODE_NAME_CHARS: usize = 255;

impl NodeReport {
    /// Everything wrong with the report, each finding naming its field: a name (at most
    /// [`MAX_NODE_NAME_CHARS`], no control characters), an address, and a capacity in range
    /// that offers something (a node with no CPU, memory or disk at all can run nothing, and
    /// is more likely a worker that could not read its machine than one meant to be empty).
    pub fn validate(&self) -> Vec<String> {
        let mut findings = Vec::new();
        if self.name.trim().is_empty() {
            findings.push("Name: a node needs a name".to_string());
        } else if self.name.chars().count() > MAX_NODE_NAME_CHARS {
            findings.push(format!(
                "Name: {} characters is more than the limit of {MAX_NODE_NAME_CHARS}",
                self.name.chars().count()
            ));
        } else if let Some(control) = self.name.chars().find(|c| c.is_control()) {
            findings.push(format!(
                "Name: contains a control character (U+{:04X})",
                u32::from(control)
            ));
        }
        if self.address.trim().is_empty() {
            findings.push("Address: a node needs the address of its API".to_string());
        }
        findings.extend(self.capacity.findings("Capacity."));
        if self.labels.len() > MAX_LABELS {
            findings.push(format!(
                "Labels: {} labels; at most {MAX_LABELS}",
                self.labels.len()
            ));
        }
        for (key, value) in &self.labels {
            if let Some(problem) = label_problem(key, value) {
                findings.push(format!("Labels.{key}: {problem}"));
            }
        }
        let capacity = self.capacity;
        if capacity.cpu == 0.0 && capacity.memory == 0 && capacity.disk == 0 {
            findings.push(
                "Capacity: a node must offer some Cpu, Memory or Disk; all three are 0".to_string(),
            );
        }
        findings
    }
}

/// The manager's view of a node, as `GET /nodes` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Address")]
    pub address: String,
    #[serde(rename = "Status")]
    pub status: NodeStatus,
    /// Why the node is not `Ready`, when the manager knows more than the status says (the
    /// error met when reaching its address).
    #[serde(
        rename = "StatusReason",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub status_reason: Option<String>,
    #[serde(rename = "Capacity")]
    pub capacity: Resources,
    /// The sum of what the tasks placed here declared (`Cpu`, `Memory`, `Disk`).
    #[serde(rename = "Allocated", default)]
    pub allocated: Resources,
    /// Tasks placed here that hold resources (`Scheduled` or `Running`).
    #[serde(rename = "TaskCount", default)]
    pub task_count: usize,
    /// The latest stats the worker reported.
    #[serde(rename = "Stats", default)]
    pub stats: Option<Stats>,
    #[serde(rename = "LastHeartbeat", default, with = "crate::time::optional")]
    pub last_heartbeat: Option<DateTime<Utc>>,
    /// How the node joined: `registered` (it called in) or `static` (the manager's `-w`).
    #[serde(rename = "Source", default)]
    pub source: String,
    /// The labels the worker last reported.
    #[serde(rename = "Labels", default, skip_serializing_if = "Labels::is_empty")]
    pub labels: Labels,
    /// Whether new tasks may be placed here: `false` once the operator took the node out of
    /// service (`cube node eligibility --disable`, or a drain).
    #[serde(rename = "Eligible", default = "eligible_by_default")]
    pub eligible: bool,
    /// The drain under way, if any.
    #[serde(rename = "Drain", default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<Drain>,
    /// The worker's build and its engine's version, as it last reported them.
    #[serde(rename = "Version", default, skip_serializing_if = "Option::is_none")]
    pub version: Option<crate::version::VersionInfo>,
    /// What the manager found wrong with the worker's version, if anything.
    #[serde(
        rename = "VersionWarning",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub version_warning: Option<String>,
    /// What the worker lets a task reach of its host, as it last reported it.
    #[serde(
        rename = "HostPolicy",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub host_policy: Option<HostPolicy>,
    /// The named volumes Cube made on the node, as it last reported them.
    #[serde(rename = "Volumes", default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<crate::secret::VolumeInfo>,
}

fn eligible_by_default() -> bool {
    true
}

#[cfg(test)]
mod tests {
    fn pod(compose: &str) -> crate::Task {
        let mut task = crate::Task::new("p", "x");
        task.spec.pod = Some(Box::new(
            crate::pod::Pod::parse(compose, &BTreeMap::new()).unwrap(),
        ));
        task
    }

    fn binding(source: &str) -> HostNeeds {
        HostNeeds::of(&pod(&format!(
            "services:\n  a:\n    image: x\n    volumes:\n      - {source}:/mnt\n"
        )))
        .expect("a bind mount is a need")
    }

    #[test]
    fn a_host_policy_refuses_what_the_worker_would_naming_the_setting() {
        let none = HostPolicy::default();
        assert_eq!(
            none.refusal(&binding("/srv/data")).as_deref(),
            Some(
                "services.a: bind mount of /srv/data is not under the node's \
                 allowed_host_paths (none)"
            )
        );
        let srv = HostPolicy {
            allowed_host_paths: vec!["/srv".to_string()],
            ..HostPolicy::default()
        };
        assert_eq!(srv.refusal(&binding("/srv/data/../data/x")), None);
        assert!(
            srv.refusal(&binding("/srv2")).is_some(),
            "a sibling is not under it"
        );
        assert!(srv.refusal(&binding("/srv/../etc")).is_some());
        let root = HostPolicy {
            allowed_host_paths: vec!["/".to_string()],
            ..HostPolicy::default()
        };
        let socket = root.refusal(&binding("/var/run")).unwrap();
        assert!(socket.contains("allow_docker_socket"), "{socket}");
        let network = HostNeeds::of(&pod(
            "services:\n  a:\n    image: x\n    network_mode: host\n",
        ))
        .unwrap();
        assert!(
            root.refusal(&network)
                .unwrap()
                .contains("allow_host_network")
        );
        let open = HostPolicy {
            allow_host_network: true,
            allow_docker_socket: true,
            ..root.clone()
        };
        assert_eq!(open.refusal(&network), None);
        assert_eq!(open.refusal(&binding("/var/run/docker.sock")), None);
        assert_eq!(
            HostNeeds::of(&crate::Task::new("single", "x")),
            None,
            "a single container asks nothing of its host"
        );
        // Placement asks `allows`, and says `refusal`: they must agree.
        for policy in [&none, &srv, &root, &open] {
            for needs in [
                binding("/srv/data"),
                binding("/srv2"),
                binding("/var/run"),
                binding("/"),
                network.clone(),
            ] {
                assert_eq!(
                    policy.allows(&needs),
                    policy.refusal(&needs).is_none(),
                    "{policy:?} {needs:?}"
                );
            }
        }
    }

    use super::*;

    fn report(capacity: &str) -> NodeReport {
        serde_json::from_str(&format!(
            r#"{{"Name": "w1", "Address": "http://127.0.0.1:1", "Capacity": {capacity}}}"#
        ))
        .unwrap()
    }

    #[test]
    fn a_reasonable_report_has_no_findings() {
        let findings = report(r#"{"Cpu": "500m", "Memory": "2Gi", "Disk": "100G"}"#).validate();
        assert!(findings.is_empty(), "{findings:?}");
    }

    #[test]
    fn a_negative_or_absurd_capacity_is_named_with_its_limit() {
        let findings = report(r#"{"Cpu": -1, "Memory": "2Gi"}"#)
            .validate()
            .join("\n");
        assert!(findings.contains("Capacity.Cpu: -1 is not"), "{findings}");
        let findings = report(r#"{"Cpu": 1e308, "Memory": "2Pi", "Disk": "5Pi"}"#)
            .validate()
            .join("\n");
        assert!(findings.contains("Capacity.Cpu: "), "{findings}");
        assert!(
            findings.contains("1e308 cores is more than the limit of 1024 cores"),
            "{findings}"
        );
        assert!(findings.contains("Capacity.Memory: "), "{findings}");
        assert!(findings.contains("Capacity.Disk: "), "{findings}");
    }

    #[test]
    fn an_all_zero_capacity_is_refused() {
        let findings = report("{}").validate().join("\n");
        assert!(
            findings.contains("Capacity: a node must offer"),
            "{findings}"
        );
    }

    #[test]
    fn a_node_name_with_a_control_character_or_too_long_is_refused() {
        let mut bad = report(r#"{"Cpu": 1}"#);
        bad.name = "w\u{7}1".into();
        assert!(bad.validate()[0].contains("U+0007"), "{:?}", bad.validate());
        bad.name = "w".repeat(300);
        assert!(
            bad.validate()[0].contains("limit of 255"),
            "{:?}",
            bad.validate()
        );
    }

    #[test]
    fn labels_read_as_an_object_and_are_left_out_when_empty() {
        let mut with_labels = report(r#"{"Cpu": 1}"#);
        assert!(with_labels.labels.is_empty());
        assert!(
            !serde_json::to_string(&with_labels)
                .unwrap()
                .contains("Labels")
        );
        with_labels.labels.insert("zone".into(), "eu".into());
        let json = serde_json::to_value(&with_labels).unwrap();
        assert_eq!(json["Labels"], serde_json::json!({"zone": "eu"}));
        let back: NodeReport = serde_json::from_value(json).unwrap();
        assert_eq!(back, with_labels);
        assert!(
            with_labels.validate().is_empty(),
            "{:?}",
            with_labels.validate()
        );
    }

    #[test]
    fn bad_labels_are_named_by_their_key() {
        let mut bad = report(r#"{"Cpu": 1}"#);
        bad.labels.insert("zone".into(), "eu west".into());
        bad.labels.insert("".into(), "x".into());
        bad.labels.insert("k".repeat(64), "x".into());
        bad.labels.insert("disk".into(), "ssd".into());
        bad.labels.insert("empty".into(), String::new());
        let findings = bad.validate().join("\n");
        assert!(
            findings.contains("Labels.zone: the value \"eu west\" contains ' '"),
            "{findings}"
        );
        assert!(
            findings.contains("Labels.: a label needs a key"),
            "{findings}"
        );
        assert!(
            findings.contains("the key has 64 characters; at most 63"),
            "{findings}"
        );
        assert!(
            !findings.contains("Labels.disk") && !findings.contains("Labels.empty"),
            "{findings}"
        );
        bad.labels = (0..65)
            .map(|n| (format!("k{n}"), "v".to_string()))
            .collect();
        assert_eq!(
            bad.validate(),
            vec!["Labels: 65 labels; at most 64".to_string()]
        );
    }

    #[test]
    fn a_command_line_label_is_key_equals_value() {
        assert_eq!(parse_label("zone=eu"), Ok(("zone".into(), "eu".into())));
        assert_eq!(
            parse_label("team=a=b").unwrap_err(),
            "\"team=a=b\": the value \"a=b\" contains '='; use letters, digits, '.', '_', '-' and '/'"
        );
        assert_eq!(
            parse_label("disk=").unwrap(),
            ("disk".into(), String::new())
        );
        assert!(
            parse_label("zone")
                .unwrap_err()
                .contains("is not KEY=VALUE")
        );
        assert!(
            parse_label("=eu")
                .unwrap_err()
                .contains("a label needs a key")
        );
    }
}
