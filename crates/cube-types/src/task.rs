//! A task: one container's worth of work, as the user asked for it and as Cube saw it run.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::state::State;

/// Docker refuses a memory limit under 6 MiB; Cube says so before accepting the task.
pub const MIN_MEMORY_BYTES: u64 = 6 * 1024 * 1024;

/// A task. Field names on the wire are the book's (`PascalCase`); `NodeName`, `DesiredState`,
/// `ExitCode` and `Error` are Cube's. Units: `Cpu` in cores, `Memory` and `Disk` in bytes (also
/// read as strings with units, `"512MiB"`).
///
/// Collections and strings also accept `null` (what Go writes for an empty slice or map), so
/// that a task written by the book's Go code reads unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Task {
    /// Generated when the submission has none (or the nil UUID).
    #[serde(rename = "ID", default)]
    pub id: Uuid,
    /// The Docker container running the task, once one was created.
    #[serde(rename = "ContainerID", default, deserialize_with = "null_as_default")]
    pub container_id: String,
    #[serde(rename = "Name", default, deserialize_with = "null_as_default")]
    pub name: String,
    /// What Cube last saw (the observed state).
    #[serde(rename = "State", default = "pending")]
    pub state: State,
    #[serde(rename = "Image", default, deserialize_with = "null_as_default")]
    pub image: String,
    /// CPU cores the container may use (Docker's `NanoCpus` / 1e9); 0 means no limit.
    #[serde(rename = "Cpu", default, deserialize_with = "null_as_default")]
    pub cpu: f64,
    /// Memory limit in bytes; 0 means no limit.
    #[serde(
        rename = "Memory",
        default,
        deserialize_with = "crate::size::deserialize_size"
    )]
    pub memory: u64,
    /// Disk the task declares it needs, in bytes. Used for placement, not enforced by Docker.
    #[serde(
        rename = "Disk",
        default,
        deserialize_with = "crate::size::deserialize_size"
    )]
    pub disk: u64,
    /// `KEY=value` entries.
    #[serde(rename = "Env", default, deserialize_with = "null_as_default")]
    pub env: Vec<String>,
    /// Overrides the image's command when not empty.
    #[serde(rename = "Cmd", default, deserialize_with = "null_as_default")]
    pub cmd: Vec<String>,
    /// Container ports, `"7777/tcp"`, written as the book's set-as-object `{"7777/tcp": {}}`.
    #[serde(rename = "ExposedPorts", default, with = "port_set")]
    pub exposed_ports: BTreeSet<String>,
    /// Container port → host port; an empty host port lets Docker choose one.
    #[serde(rename = "PortBindings", default, deserialize_with = "null_as_default")]
    pub port_bindings: BTreeMap<String, String>,
    /// What Docker bound, in the book's shape: `{"7777/tcp": [{"HostIp": "0.0.0.0", "HostPort": "49155"}]}`.
    #[serde(rename = "HostPorts", default, deserialize_with = "null_as_default")]
    pub host_ports: BTreeMap<String, Vec<HostBinding>>,
    #[serde(
        rename = "RestartPolicy",
        default,
        deserialize_with = "null_as_default"
    )]
    pub restart_policy: RestartPolicy,
    /// When Cube accepted the task (Cube's field; `docker ps`'s CREATED).
    #[serde(
        rename = "CreatedTime",
        default,
        with = "crate::time::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub created_time: Option<DateTime<Utc>>,
    #[serde(rename = "StartTime", default, with = "crate::time::optional")]
    pub start_time: Option<DateTime<Utc>>,
    #[serde(rename = "FinishTime", default, with = "crate::time::optional")]
    pub finish_time: Option<DateTime<Utc>>,
    /// The book's health check: an HTTP path such as `/health`, probed on the task's first
    /// published host port on its node; 200 is healthy.
    #[serde(rename = "HealthCheck", default, deserialize_with = "null_as_default")]
    pub health_check: String,
    /// `http` (the default when `HealthCheck` is a path) or `tcp` (a connection is healthy).
    #[serde(
        rename = "HealthCheckType",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub health_check_type: Option<HealthCheckType>,
    /// How often to probe [default: 5s].
    #[serde(
        rename = "HealthCheckInterval",
        default,
        with = "crate::duration::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub health_check_interval: Option<Duration>,
    /// How long one probe may take [default: 2s].
    #[serde(
        rename = "HealthCheckTimeout",
        default,
        with = "crate::duration::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub health_check_timeout: Option<Duration>,
    /// Consecutive failed probes before the task counts as unhealthy [default: 3].
    #[serde(
        rename = "HealthCheckRetries",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub health_check_retries: Option<u32>,
    /// How many times the task may be restarted [default: no limit].
    #[serde(
        rename = "MaxRestarts",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub max_restarts: Option<u32>,
    /// The first wait before a restart; it doubles with each quick failure in a row, up to
    /// `RestartDelayMax` [default: 1s; `"0s"` restarts at once].
    #[serde(
        rename = "RestartDelay",
        default,
        with = "crate::duration::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub restart_delay: Option<Duration>,
    /// The longest wait before a restart [default: 1m].
    #[serde(
        rename = "RestartDelayMax",
        default,
        with = "crate::duration::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub restart_delay_max: Option<Duration>,
    #[serde(rename = "RestartCount", default, deserialize_with = "null_as_default")]
    pub restart_count: u32,
    /// Failures in a row, each after a short run; sets the backoff before the next restart.
    /// A run that stayed up for [`BACKOFF_RESET_AFTER`] (or `RestartDelayMax`, if longer)
    /// starts the count again.
    #[serde(rename = "FailureStreak", default, skip_serializing_if = "is_zero")]
    pub failure_streak: u32,
    /// What the health checks say; unset for a task without one, `Starting` until the first
    /// probe succeeds.
    #[serde(rename = "Health", default, skip_serializing_if = "Option::is_none")]
    pub health: Option<Health>,
    /// Failed probes in a row (reset by a successful one).
    #[serde(rename = "HealthFailures", default, skip_serializing_if = "is_zero")]
    pub health_failures: u32,
    /// The worker the task is placed on.
    #[serde(rename = "NodeName", default, deserialize_with = "null_as_default")]
    pub node_name: String,
    /// What the user asked for: `Running` to run it, `Completed` to stop it.
    #[serde(rename = "DesiredState", default = "running")]
    pub desired_state: State,
    /// The container's exit code, once it exited.
    #[serde(rename = "ExitCode", default)]
    pub exit_code: Option<i64>,
    /// The last failure, in words.
    #[serde(rename = "Error", default)]
    pub error: Option<String>,
    /// Why the manager has not placed the task yet, node by node (only while `Pending`).
    #[serde(
        rename = "PendingReason",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub pending_reason: Option<String>,
    /// What happened to the task, oldest first, the last [`HISTORY_LIMIT`] entries.
    #[serde(rename = "History", default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<HistoryEntry>,
    /// When the manager restarts the task, while it waits out its restart backoff (the run
    /// ended and the policy wants another). Unset otherwise.
    #[serde(
        rename = "NextRestart",
        default,
        with = "crate::time::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub next_restart: Option<DateTime<Utc>>,
    /// Why the manager could not hand the task to its node or stop it there (the last error,
    /// e.g. the node's address cannot be reached), while it keeps trying. Unset otherwise.
    #[serde(
        rename = "DispatchError",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub dispatch_error: Option<String>,
    /// When the manager tries again to reach the task's node, while `DispatchError` is set.
    #[serde(
        rename = "NextAttempt",
        default,
        with = "crate::time::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub next_attempt: Option<DateTime<Utc>>,
}

/// How many history entries a task keeps.
pub const HISTORY_LIMIT: usize = 30;

/// A run that stayed up this long resets the restart backoff (unless `RestartDelayMax` is
/// longer, then that).
pub const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(10);

/// Health-check defaults.
pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_secs(5);
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(2);
pub const DEFAULT_HEALTH_RETRIES: u32 = 3;
/// Restart defaults.
pub const DEFAULT_RESTART_DELAY: Duration = Duration::from_secs(1);
pub const DEFAULT_RESTART_DELAY_MAX: Duration = Duration::from_secs(60);

fn is_zero(value: &u32) -> bool {
    *value == 0
}

/// How a health check probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum HealthCheckType {
    /// `GET` the `HealthCheck` path; 200 is healthy.
    #[serde(rename = "http")]
    Http,
    /// Open a TCP connection to the port; connecting is healthy.
    #[serde(rename = "tcp")]
    Tcp,
}

/// What the health checks say of a running task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Health {
    /// Running, not yet probed successfully.
    Starting,
    Healthy,
    /// `HealthCheckRetries` probes failed in a row.
    Unhealthy,
}

/// One thing that happened to a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryEntry {
    #[serde(rename = "Time")]
    pub time: DateTime<Utc>,
    /// A state's name, or `Restart`, `Health`, `Placed`, `Lost`, ... The names Cube records
    /// are shared, not copied into every entry: a manager holds a history for each of its
    /// tasks, and 100,000 tasks would otherwise keep 300,000 copies of "Running".
    #[serde(rename = "Event", deserialize_with = "deserialize_event")]
    pub event: Cow<'static, str>,
    #[serde(rename = "Message", default)]
    pub message: String,
}

/// The events Cube records, shared by every entry that names one.
const KNOWN_EVENTS: [&str; 14] = [
    "Submitted",
    "Placed",
    "Pending",
    "Scheduled",
    "Running",
    "Completed",
    "Failed",
    "Lost",
    "Restart",
    "RestartLimit",
    "StopRequested",
    "Health",
    "Event",
    "Stopped",
];

/// An event's name: one of [`KNOWN_EVENTS`], shared, or the name read.
fn event_name(name: String) -> Cow<'static, str> {
    match KNOWN_EVENTS.iter().find(|known| **known == name) {
        Some(known) => Cow::Borrowed(known),
        None => Cow::Owned(name),
    }
}

fn deserialize_event<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Cow<'static, str>, D::Error> {
    String::deserialize(deserializer).map(event_name)
}

fn pending() -> State {
    State::Pending
}

fn running() -> State {
    State::Running
}

/// One host address a container port is published on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostBinding {
    #[serde(rename = "HostIp", default)]
    pub host_ip: String,
    #[serde(rename = "HostPort")]
    pub host_port: String,
}

/// Docker's restart vocabulary. Cube, not Docker, carries it out: Docker's own restart policy
/// is never set on a container. The empty string (the book's default) means `no`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum RestartPolicy {
    #[default]
    #[serde(rename = "no", alias = "")]
    No,
    #[serde(rename = "on-failure")]
    OnFailure,
    #[serde(rename = "always")]
    Always,
    #[serde(rename = "unless-stopped")]
    UnlessStopped,
}

impl Task {
    /// A task with the given image and every other field at its default.
    pub fn new(name: impl Into<String>, image: impl Into<String>) -> Task {
        Task {
            id: Uuid::new_v4(),
            container_id: String::new(),
            name: name.into(),
            state: State::Pending,
            image: image.into(),
            cpu: 0.0,
            memory: 0,
            disk: 0,
            env: Vec::new(),
            cmd: Vec::new(),
            exposed_ports: BTreeSet::new(),
            port_bindings: BTreeMap::new(),
            host_ports: BTreeMap::new(),
            restart_policy: RestartPolicy::No,
            created_time: None,
            start_time: None,
            finish_time: None,
            health_check: String::new(),
            health_check_type: None,
            health_check_interval: None,
            health_check_timeout: None,
            health_check_retries: None,
            max_restarts: None,
            restart_delay: None,
            restart_delay_max: None,
            restart_count: 0,
            failure_streak: 0,
            health: None,
            health_failures: 0,
            node_name: String::new(),
            desired_state: State::Running,
            exit_code: None,
            error: None,
            pending_reason: None,
            history: Vec::new(),
            next_restart: None,
            dispatch_error: None,
            next_attempt: None,
        }
    }

    /// Whether the task has a health check: a path, or the `tcp` type.
    pub fn has_health_check(&self) -> bool {
        !self.health_check.trim().is_empty() || self.health_check_type == Some(HealthCheckType::Tcp)
    }

    pub fn health_interval(&self) -> Duration {
        self.health_check_interval
            .unwrap_or(DEFAULT_HEALTH_INTERVAL)
    }

    pub fn health_timeout(&self) -> Duration {
        self.health_check_timeout.unwrap_or(DEFAULT_HEALTH_TIMEOUT)
    }

    pub fn health_retries(&self) -> u32 {
        self.health_check_retries
            .unwrap_or(DEFAULT_HEALTH_RETRIES)
            .max(1)
    }

    /// The wait before the next restart: `RestartDelay` doubled for each earlier quick failure
    /// in a row, at most `RestartDelayMax`.
    pub fn restart_backoff(&self) -> Duration {
        let first = self.restart_delay.unwrap_or(DEFAULT_RESTART_DELAY);
        let cap = self
            .restart_delay_max
            .unwrap_or(DEFAULT_RESTART_DELAY_MAX)
            .max(first);
        let doublings = self.failure_streak.saturating_sub(1).min(20);
        first.saturating_mul(1 << doublings).min(cap)
    }

    /// How long a run must stay up for the backoff to start over: [`BACKOFF_RESET_AFTER`],
    /// or `RestartDelayMax` if that is longer.
    pub fn backoff_reset_after(&self) -> Duration {
        BACKOFF_RESET_AFTER.max(self.restart_delay_max.unwrap_or(DEFAULT_RESTART_DELAY_MAX))
    }

    /// Adds an entry to the history, keeping the last [`HISTORY_LIMIT`].
    pub fn record(
        &mut self,
        time: DateTime<Utc>,
        event: impl Into<String>,
        message: impl Into<String>,
    ) {
        self.history.push(HistoryEntry {
            time,
            event: event_name(event.into()),
            message: message.into(),
        });
        if self.history.len() > HISTORY_LIMIT {
            let excess = self.history.len() - HISTORY_LIMIT;
            self.history.drain(..excess);
        }
    }

    /// Forgets what was observed of the task (container, ports, times, exit, errors): what a
    /// manager or a worker does with a submitted task, whose observed state is not the
    /// submitter's to say.
    pub fn clear_observed(&mut self) {
        self.container_id.clear();
        self.host_ports.clear();
        self.start_time = None;
        self.finish_time = None;
        self.exit_code = None;
        self.error = None;
        self.pending_reason = None;
        self.health = None;
        self.health_failures = 0;
        self.next_restart = None;
        self.dispatch_error = None;
        self.next_attempt = None;
    }

    /// The first eight characters of the ID, as `docker ps` shortens container IDs.
    pub fn short_id(&self) -> String {
        self.id.simple().to_string()[..8].to_string()
    }

    /// Fills what a submission may leave out and writes ports one way: a missing ID is
    /// generated, a missing name is derived from the ID, `"7777"` becomes `"7777/tcp"`, and
    /// every bound port is also exposed. Run [`Task::validate`] first: ports that do not
    /// parse are left as they are.
    pub fn normalize(&mut self) {
        if self.id.is_nil() {
            self.id = Uuid::new_v4();
        }
        if self.name.trim().is_empty() {
            self.name = format!("task-{}", self.short_id());
        }
        self.exposed_ports = std::mem::take(&mut self.exposed_ports)
            .into_iter()
            .map(|port| canonical_port(&port).unwrap_or(port))
            .collect();
        self.port_bindings = std::mem::take(&mut self.port_bindings)
            .into_iter()
            .map(|(port, host)| {
                (
                    canonical_port(&port).unwrap_or(port),
                    host.trim().to_string(),
                )
            })
            .collect();
        let bound: Vec<String> = self.port_bindings.keys().cloned().collect();
        self.exposed_ports.extend(bound);
    }

    /// Everything wrong with the task as submitted, each finding naming its field.
    pub fn validate(&self) -> Vec<String> {
        let mut findings = Vec::new();
        if self.image.trim().is_empty() {
            findings.push("Image: missing image name".to_string());
        } else if self.image.chars().any(char::is_whitespace) {
            findings.push(format!("Image: {:?} contains white space", self.image));
        }
        if !self.cpu.is_finite() || self.cpu < 0.0 {
            findings.push(format!("Cpu: {} is not a number of cores >= 0", self.cpu));
        }
        if self.memory != 0 && self.memory < MIN_MEMORY_BYTES {
            findings.push(format!(
                "Memory: {} bytes is below Docker's minimum of {MIN_MEMORY_BYTES} bytes (6 MiB); \
                 Memory is in bytes, or a string with a unit such as \"64MiB\"",
                self.memory
            ));
        }
        for port in &self.exposed_ports {
            if let Err(why) = canonical_port(port) {
                findings.push(format!("ExposedPorts: {why}"));
            }
        }
        for (port, host) in &self.port_bindings {
            if let Err(why) = canonical_port(port) {
                findings.push(format!("PortBindings: {why}"));
            }
            let host = host.trim();
            if !host.is_empty() && !matches!(host.parse::<u16>(), Ok(1..)) {
                findings.push(format!(
                    "PortBindings: host port {host:?} for {port} is not a port number 1-65535 \
                     (or \"\" to let Docker choose)"
                ));
            }
        }
        if self.has_health_check() {
            let path = self.health_check.trim();
            if self.health_check_type != Some(HealthCheckType::Tcp) && !path.starts_with('/') {
                findings.push(format!(
                    "HealthCheck: {path:?} is not an HTTP path such as \"/health\""
                ));
            }
            if self.exposed_ports.is_empty() && self.port_bindings.is_empty() {
                findings.push(
                    "HealthCheck: the task publishes no port to probe; add PortBindings \
                     (e.g. {\"7777/tcp\": \"\"})"
                        .to_string(),
                );
            }
            if self.health_check_interval.is_some_and(|d| d.is_zero()) {
                findings.push("HealthCheckInterval: must be longer than 0".to_string());
            }
            if self.health_check_timeout.is_some_and(|d| d.is_zero()) {
                findings.push("HealthCheckTimeout: must be longer than 0".to_string());
            }
        }
        for entry in &self.env {
            if entry.is_empty() || entry.starts_with('=') {
                findings.push(format!("Env: {entry:?} is not KEY=value"));
            }
        }
        findings
    }
}

/// `"7777"` or `"7777/tcp"` → `"7777/tcp"`; anything else is refused with the reason.
pub fn canonical_port(port: &str) -> Result<String, String> {
    let (number, protocol) = port.split_once('/').unwrap_or((port, "tcp"));
    let protocol = protocol.to_ascii_lowercase();
    if !matches!(protocol.as_str(), "tcp" | "udp" | "sctp") {
        return Err(format!(
            "{port:?} has protocol {protocol:?}; use tcp, udp or sctp"
        ));
    }
    match number.parse::<u16>() {
        Ok(number @ 1..) => Ok(format!("{number}/{protocol}")),
        _ => Err(format!(
            "{port:?} is not a port: expected a number 1-65535, e.g. \"7777/tcp\""
        )),
    }
}

/// Reads `null` as the type's default, as Go writes empty slices, maps and zero values.
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// A set of ports written as an object whose values are `{}` (Go's `map[Port]struct{}`);
/// a plain array of strings and `null` are read too.
mod port_set {
    use super::*;

    pub fn serialize<S: Serializer>(
        ports: &BTreeSet<String>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(ports.len()))?;
        for port in ports {
            map.serialize_entry(port, &serde_json::Map::new())?;
        }
        map.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<BTreeSet<String>, D::Error> {
        struct PortSetVisitor;

        impl<'de> Visitor<'de> for PortSetVisitor {
            type Value = BTreeSet<String>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#"a set of ports such as {"7777/tcp": {}}"#)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(BTreeSet::new())
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(BTreeSet::new())
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_any(self)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut ports = BTreeSet::new();
                while let Some((port, value)) = map.next_entry::<String, serde_json::Value>()? {
                    if !(value.is_null() || value.as_object().is_some_and(|o| o.is_empty())) {
                        return Err(de::Error::custom(format!(
                            "the value for port {port:?} must be {{}}, found {value}"
                        )));
                    }
                    ports.insert(port);
                }
                Ok(ports)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut ports = BTreeSet::new();
                while let Some(port) = seq.next_element::<String>()? {
                    ports.insert(port);
                }
                Ok(ports)
            }
        }
        deserializer.deserialize_option(PortSetVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_written_one_way_and_bound_ports_are_exposed() {
        let mut task = Task::new("web", "busybox");
        task.port_bindings.insert("8080".into(), " ".into());
        task.exposed_ports.insert("7777/TCP".into());
        assert!(task.validate().is_empty(), "{:?}", task.validate());
        task.normalize();
        assert_eq!(
            task.exposed_ports,
            BTreeSet::from(["7777/tcp".to_string(), "8080/tcp".to_string()])
        );
        assert_eq!(
            task.port_bindings.get("8080/tcp").map(String::as_str),
            Some("")
        );
    }

    #[test]
    fn a_task_without_id_or_name_gets_both() {
        let mut task: Task = serde_json::from_str(r#"{"Image": "busybox"}"#).unwrap();
        assert!(task.id.is_nil());
        task.normalize();
        assert!(!task.id.is_nil());
        assert_eq!(task.name, format!("task-{}", task.short_id()));
        assert_eq!(task.state, State::Pending);
        assert_eq!(task.desired_state, State::Running);
    }

    #[test]
    fn validation_names_each_bad_field() {
        let mut task = Task::new("bad", " ");
        task.cpu = -1.0;
        task.memory = 1000;
        task.exposed_ports.insert("http".into());
        task.port_bindings.insert("80/tcp".into(), "99999".into());
        task.env.push("=x".into());
        let findings = task.validate().join("\n");
        for field in [
            "Image: missing image name",
            "Cpu:",
            "Memory: 1000 bytes",
            "ExposedPorts: \"http\"",
            "99999",
            "Env:",
        ] {
            assert!(findings.contains(field), "{field} not in {findings}");
        }
    }

    #[test]
    fn go_nulls_and_empty_policy_read_as_defaults() {
        let json = r#"{"Image": "x", "Env": null, "Cmd": null, "ExposedPorts": null,
            "PortBindings": null, "HostPorts": null, "RestartPolicy": "", "ContainerID": "",
            "StartTime": "0001-01-01T00:00:00Z", "Memory": 0, "Cpu": 0.5}"#;
        let task: Task = serde_json::from_str(json).unwrap();
        assert!(task.env.is_empty() && task.cmd.is_empty() && task.exposed_ports.is_empty());
        assert_eq!(task.restart_policy, RestartPolicy::No);
        assert_eq!(task.start_time, None);
        assert_eq!(task.cpu, 0.5);
    }

    #[test]
    fn exposed_ports_round_trip_as_an_object_of_empty_objects() {
        let mut task = Task::new("web", "busybox");
        task.exposed_ports.insert("7777/tcp".into());
        let json = serde_json::to_value(&task).unwrap();
        assert_eq!(json["ExposedPorts"], serde_json::json!({"7777/tcp": {}}));
        let back: Task = serde_json::from_value(json).unwrap();
        assert_eq!(back, task);
    }

    #[test]
    fn the_books_health_check_alone_keeps_working_with_defaults() {
        let task: Task = serde_json::from_str(
            r#"{"Image": "x", "HealthCheck": "/health", "PortBindings": {"7777/tcp": ""}}"#,
        )
        .unwrap();
        assert!(task.validate().is_empty(), "{:?}", task.validate());
        assert!(task.has_health_check());
        assert_eq!(task.health_interval(), DEFAULT_HEALTH_INTERVAL);
        assert_eq!(task.health_retries(), DEFAULT_HEALTH_RETRIES);
    }

    #[test]
    fn health_and_restart_settings_read_as_durations() {
        let task: Task = serde_json::from_str(
            r#"{"Image": "x", "HealthCheckType": "tcp", "HealthCheckInterval": "500ms",
                "HealthCheckTimeout": "1s", "HealthCheckRetries": 2, "RestartPolicy": "on-failure",
                "MaxRestarts": 3, "RestartDelay": "0s", "RestartDelayMax": "30s",
                "PortBindings": {"80/tcp": ""}}"#,
        )
        .unwrap();
        assert!(task.validate().is_empty(), "{:?}", task.validate());
        assert_eq!(task.health_check_interval, Some(Duration::from_millis(500)));
        assert_eq!(task.restart_delay, Some(Duration::ZERO));
        let json = serde_json::to_value(&task).unwrap();
        assert_eq!(json["HealthCheckInterval"], "500ms");
        assert_eq!(json["RestartDelay"], "0s");
    }

    #[test]
    fn a_health_check_needs_a_path_and_a_port() {
        let mut task = Task::new("t", "img");
        task.health_check = "health".into();
        let findings = task.validate().join("\n");
        assert!(findings.contains("not an HTTP path"), "{findings}");
        assert!(findings.contains("publishes no port"), "{findings}");
    }

    #[test]
    fn the_backoff_doubles_per_quick_failure_up_to_its_cap() {
        let mut task = Task::new("t", "img");
        task.restart_delay = Some(Duration::from_millis(500));
        task.restart_delay_max = Some(Duration::from_secs(3));
        let waits: Vec<Duration> = (1..=5)
            .map(|streak| {
                task.failure_streak = streak;
                task.restart_backoff()
            })
            .collect();
        let ms = |n| Duration::from_millis(n);
        assert_eq!(waits, vec![ms(500), ms(1000), ms(2000), ms(3000), ms(3000)]);
        task.restart_delay = Some(Duration::ZERO);
        assert_eq!(task.restart_backoff(), Duration::ZERO);
    }

    #[test]
    fn the_history_keeps_the_latest_entries() {
        let mut task = Task::new("t", "img");
        for n in 0..HISTORY_LIMIT + 5 {
            task.record(Utc::now(), "Event", n.to_string());
        }
        assert_eq!(task.history.len(), HISTORY_LIMIT);
        assert_eq!(task.history[0].message, "5");
    }

    #[test]
    fn unknown_fields_are_refused_by_name() {
        let err = serde_json::from_str::<Task>(r#"{"Image": "x", "Memmory": 5}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `Memmory`"), "{err}");
    }
}

#[cfg(test)]
mod history_tests {
    use super::*;

    #[test]
    fn event_names_cube_records_are_shared_not_copied() {
        let entry: HistoryEntry = serde_json::from_str(
            r#"{"Time":"2026-11-20T10:00:00Z","Event":"Running","Message":"on w1"}"#,
        )
        .unwrap();
        assert!(matches!(entry.event, Cow::Borrowed("Running")));
        let other: HistoryEntry =
            serde_json::from_str(r#"{"Time":"2026-11-20T10:00:00Z","Event":"Custom"}"#).unwrap();
        assert_eq!(other.event, "Custom");
        let mut task = Task::new("t", "img");
        task.record(Utc::now(), "Placed", "on w1");
        assert!(matches!(task.history[0].event, Cow::Borrowed("Placed")));
    }
}
