//! A task: one container's worth of work, as the user asked for it and as Cube saw it run.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::duration::{MAX_TASK_DURATION, MAX_TASK_DURATION_TEXT, format_duration};
use crate::node::Resources;
use crate::pod::{ContainerStatus, Pod};
use crate::state::State;

/// Docker refuses a memory limit under 6 MiB; Cube says so before accepting the task.
pub const MIN_MEMORY_BYTES: u64 = 6 * 1024 * 1024;

/// The longest task name Cube takes (it becomes part of a container's name).
pub const MAX_NAME_CHARS: usize = 255;

/// Docker's longest image name (the repository, without tag or digest).
pub const MAX_IMAGE_NAME_CHARS: usize = 255;

/// A task. Field names on the wire are the book's (`PascalCase`); `NodeName`, `DesiredState`,
/// `ExitCode` and `Error` are Cube's. Units: `Cpu` in cores (also `"500m"`), `Memory` and `Disk`
/// in bytes (also read as strings with units, `"512MiB"`, `"512Mi"`, `"512m"`: see
/// [`crate::size`]), durations as strings with a unit (`"5s"`: see [`crate::duration`]).
///
/// In memory a task is its identity (`ID`, `Name`), its **spec** ([`TaskSpec`]: what the user
/// asked for, compared by [`Task::spec_differences`]) and its **status** ([`TaskStatus`]: what
/// Cube observed or decided, with what a worker observes of the current run in one value,
/// [`RunStatus`]). On the wire it is one flat object, as in the book: `TaskWire` is the one
/// place the wire names are defined, and a task is read from and written as it. A submission
/// may carry status fields (the book's files carry `State` and zero values), and they are
/// read, then ignored: the receiver clears them ([`Task::clear_status`]).
///
/// Collections and strings also accept `null` (what Go writes for an empty slice or map), so
/// that a task written by the book's Go code reads unchanged.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(
    from = "TaskWire",
    expecting = "a task (a JSON object with the fields of a task)"
)]
pub struct Task {
    /// Generated when the submission has none (or the nil UUID).
    pub id: Uuid,
    pub name: String,
    /// What was asked for.
    pub spec: TaskSpec,
    /// What Cube observed and decided.
    pub status: TaskStatus,
}

/// What was asked for: the image and what it runs with, the resources it declares, where it
/// may run, its health check and restart policy, the job copy it is, and whether it should
/// run at all (`DesiredState`). A submission's spec is kept as it came (normalized); only a
/// job's new version or a stop changes it.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSpec {
    pub image: String,
    /// CPU cores the container may use (Docker's `NanoCpus` / 1e9); 0 means no limit.
    pub cpu: f64,
    /// Memory limit in bytes; 0 means no limit.
    pub memory: u64,
    /// Disk the task declares it needs, in bytes. Used for placement, not enforced by Docker.
    pub disk: u64,
    /// `KEY=value` entries.
    pub env: Vec<String>,
    /// Overrides the image's command when not empty.
    pub cmd: Vec<String>,
    /// Container ports, `"7777/tcp"`.
    pub exposed_ports: BTreeSet<String>,
    /// Container port → host port, `IP:PORT` to publish on one address of the node only
    /// (`"127.0.0.1:8080"`, `"[::1]:8080"`); an empty host port (`""`, `"127.0.0.1:"`) lets
    /// Docker choose one. Read with [`parse_host_side`].
    pub port_bindings: BTreeMap<String, String>,
    pub restart_policy: RestartPolicy,
    /// The book's health check: an HTTP path such as `/health`.
    pub health_check: String,
    pub health_check_type: Option<HealthCheckType>,
    pub health_check_interval: Option<Duration>,
    pub health_check_timeout: Option<Duration>,
    pub health_check_retries: Option<u32>,
    pub max_restarts: Option<u32>,
    pub restart_delay: Option<Duration>,
    pub restart_delay_max: Option<Duration>,
    /// Where the task may run.
    pub constraints: Vec<crate::job::Constraint>,
    /// The job that owns the task (empty for a bare task), its group, and which copy it is.
    pub job: String,
    pub group: String,
    pub index: Option<u32>,
    /// Who asked for the task (a bare task; a job's copies belong to the job's owner): the
    /// waiting list's `Owner`, `anonymous` when unset.
    pub owner: String,
    /// 0 (least) to 100 (most) in the waiting list; a bare task's own (a job's copies go by
    /// the job's). Unset: the default, 50.
    pub priority: Option<u8>,
    /// How long a bare task may wait in the queue before it gives up (`expired`).
    pub queue_timeout: Option<Duration>,
    /// Several containers as one task, from a compose file; then `Image`, `Cmd`, `Env` and
    /// the health-check fields are empty, and `Cpu`, `Memory` and the ports are the pod's sums.
    pub pod: Option<Box<Pod>>,
    /// What the user asked for: `Running` to run it, `Completed` to stop it.
    pub desired_state: State,
}

/// What Cube observed and decided: the state, the node, the run number and its backoff, the
/// history, what the manager says of what comes next, and what a worker observed of the
/// current run ([`RunStatus`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskStatus {
    /// What Cube last saw (the observed state).
    pub state: State,
    /// The worker the task is placed on.
    pub node_name: String,
    pub restart_count: u32,
    /// Failures in a row, each after a short run; sets the backoff before the next restart.
    pub failure_streak: u32,
    /// When Cube accepted the task.
    pub created_time: Option<DateTime<Utc>>,
    /// What happened to the task, oldest first, the last [`HISTORY_LIMIT`] entries.
    pub history: Vec<HistoryEntry>,
    /// Why the manager has not placed the task yet (only while `Pending`).
    pub pending_reason: Option<String>,
    /// When the manager restarts the task, while it waits out its restart backoff.
    pub next_restart: Option<DateTime<Utc>>,
    /// Why the manager could not reach the task's node, while it keeps trying.
    pub dispatch_error: Option<String>,
    /// When the manager tries again, while `dispatch_error` is set.
    pub next_attempt: Option<DateTime<Utc>>,
    /// Since when the manager has seen the current run healthy (its health check passed, or
    /// running when it has none): what a deployment's `MinHealthyTime` is measured from.
    pub healthy_since: Option<DateTime<Utc>>,
    /// What a worker observed of the current run.
    pub run: RunStatus,
}

/// The wire form of a task as it is read: one flat object, the book's field names and Cube's,
/// what may be left out and what `null` means. [`Task`] is read as this and written by
/// `TaskWireRef`, so the nesting of spec and status never reaches the wire.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskWire {
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
    #[serde(
        rename = "Cpu",
        default,
        deserialize_with = "crate::cpu::deserialize_cpu"
    )]
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
    /// `KEY=value` entries: a list (`["A=1"]`) or, as in a compose file, a map
    /// (`{"A": "1"}`, numbers and booleans read as text). Always written as a list.
    #[serde(rename = "Env", default, deserialize_with = "env_list::deserialize")]
    pub env: Vec<String>,
    /// Overrides the image's command when not empty: a list, or a string split into words
    /// as docker-compose splits a string `command:` (shell-like quoting, no shell). Always
    /// written as a list.
    #[serde(
        rename = "Cmd",
        default,
        deserialize_with = "command_words::deserialize"
    )]
    pub cmd: Vec<String>,
    /// Container ports, `"7777/tcp"`, written as the book's set-as-object `{"7777/tcp": {}}`.
    #[serde(rename = "ExposedPorts", default, with = "port_set")]
    pub exposed_ports: BTreeSet<String>,
    /// Container port → host port, or `IP:PORT` to publish on one address only; an empty
    /// host port lets Docker choose one.
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
    #[serde(rename = "CreatedTime", default, with = "crate::time::optional")]
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
    #[serde(rename = "HealthCheckType", default)]
    pub health_check_type: Option<HealthCheckType>,
    /// How often to probe [default: 5s].
    #[serde(
        rename = "HealthCheckInterval",
        default,
        with = "crate::duration::optional"
    )]
    pub health_check_interval: Option<Duration>,
    /// How long one probe may take [default: 2s].
    #[serde(
        rename = "HealthCheckTimeout",
        default,
        with = "crate::duration::optional"
    )]
    pub health_check_timeout: Option<Duration>,
    /// Consecutive failed probes before the task counts as unhealthy [default: 3].
    #[serde(rename = "HealthCheckRetries", default)]
    pub health_check_retries: Option<u32>,
    /// How many times the task may be restarted [default: no limit].
    #[serde(rename = "MaxRestarts", default)]
    pub max_restarts: Option<u32>,
    /// The first wait before a restart; it doubles with each quick failure in a row, up to
    /// `RestartDelayMax` [default: 1s; `"0s"` restarts at once].
    #[serde(rename = "RestartDelay", default, with = "crate::duration::optional")]
    pub restart_delay: Option<Duration>,
    /// The longest wait before a restart [default: 1m].
    #[serde(
        rename = "RestartDelayMax",
        default,
        with = "crate::duration::optional"
    )]
    pub restart_delay_max: Option<Duration>,
    #[serde(rename = "RestartCount", default, deserialize_with = "null_as_default")]
    pub restart_count: u32,
    /// Failures in a row, each after a short run; sets the backoff before the next restart.
    /// A run that stayed up for [`BACKOFF_RESET_AFTER`] (or `RestartDelayMax`, if longer)
    /// starts the count again.
    #[serde(rename = "FailureStreak", default)]
    pub failure_streak: u32,
    /// What the health checks say; unset for a task without one, `Starting` until the first
    /// probe succeeds.
    #[serde(rename = "Health", default)]
    pub health: Option<Health>,
    /// Failed probes in a row (reset by a successful one).
    #[serde(rename = "HealthFailures", default)]
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
    #[serde(rename = "PendingReason", default)]
    pub pending_reason: Option<String>,
    /// What happened to the task, oldest first, the last [`HISTORY_LIMIT`] entries.
    #[serde(rename = "History", default)]
    pub history: Vec<HistoryEntry>,
    /// Where the task may run: each constraint must hold on its node (`label.zone = eu`).
    /// A job's tasks carry the job's and the group's constraints.
    #[serde(rename = "Constraints", default, deserialize_with = "null_as_default")]
    pub constraints: Vec<crate::job::Constraint>,
    /// The job that owns the task (set by the job controller; empty for a bare task).
    #[serde(rename = "Job", default)]
    pub job: String,
    /// The job's group the task is a copy of.
    #[serde(rename = "Group", default)]
    pub group: String,
    /// Which copy of its group the task is (0-based); the task is named `job.group[index]`.
    #[serde(rename = "Index", default)]
    pub index: Option<u32>,
    /// Who asked for the task, for the waiting list (`anonymous` when unset).
    #[serde(rename = "Owner", default, deserialize_with = "null_as_default")]
    pub owner: String,
    /// The task's priority in the waiting list, 0 to 100 [default: 50].
    #[serde(rename = "Priority", default)]
    pub priority: Option<u8>,
    /// How long the task may wait in the queue before it gives up.
    #[serde(rename = "QueueTimeout", default, with = "crate::duration::optional")]
    pub queue_timeout: Option<Duration>,
    /// When the manager restarts the task, while it waits out its restart backoff (the run
    /// ended and the policy wants another). Unset otherwise.
    #[serde(rename = "NextRestart", default, with = "crate::time::optional")]
    pub next_restart: Option<DateTime<Utc>>,
    /// Why the manager could not hand the task to its node or stop it there (the last error,
    /// e.g. the node's address cannot be reached), while it keeps trying. Unset otherwise.
    #[serde(rename = "DispatchError", default)]
    pub dispatch_error: Option<String>,
    /// When the manager tries again to reach the task's node, while `DispatchError` is set.
    #[serde(rename = "NextAttempt", default, with = "crate::time::optional")]
    pub next_attempt: Option<DateTime<Utc>>,
    /// Since when the manager has seen the current run healthy. Unset otherwise.
    #[serde(rename = "HealthySince", default, with = "crate::time::optional")]
    pub healthy_since: Option<DateTime<Utc>>,
    /// A pod: `{"Compose": "<compose file>", "EnvFiles": {"name": "contents"}}`.
    #[serde(rename = "Pod", default)]
    pub pod: Option<Box<Pod>>,
    /// A pod's containers as the worker saw them.
    #[serde(rename = "Containers", default, deserialize_with = "null_as_default")]
    pub containers: Vec<ContainerStatus>,
}

/// A task as it is written, from references (listing 100,000 tasks must not copy each one
/// first): the names of [`TaskWire`], and what is left out when empty. A test writes a task
/// with every field set, and one with none, and reads them back as `TaskWire`.
#[derive(Serialize)]
struct TaskWireRef<'a> {
    #[serde(rename = "ID")]
    id: &'a Uuid,
    #[serde(rename = "ContainerID")]
    container_id: &'a String,
    #[serde(rename = "Name")]
    name: &'a String,
    #[serde(rename = "State")]
    state: &'a State,
    #[serde(rename = "Image")]
    image: &'a String,
    #[serde(rename = "Cpu")]
    cpu: &'a f64,
    #[serde(rename = "Memory")]
    memory: &'a u64,
    #[serde(rename = "Disk")]
    disk: &'a u64,
    #[serde(rename = "Env")]
    env: &'a Vec<String>,
    #[serde(rename = "Cmd")]
    cmd: &'a Vec<String>,
    #[serde(rename = "ExposedPorts", serialize_with = "port_set::serialize")]
    exposed_ports: &'a BTreeSet<String>,
    #[serde(rename = "PortBindings")]
    port_bindings: &'a BTreeMap<String, String>,
    #[serde(rename = "HostPorts")]
    host_ports: &'a BTreeMap<String, Vec<HostBinding>>,
    #[serde(rename = "RestartPolicy")]
    restart_policy: &'a RestartPolicy,
    #[serde(
        rename = "CreatedTime",
        serialize_with = "crate::time::optional::serialize",
        skip_serializing_if = "unset"
    )]
    created_time: &'a Option<DateTime<Utc>>,
    #[serde(
        rename = "StartTime",
        serialize_with = "crate::time::optional::serialize"
    )]
    start_time: &'a Option<DateTime<Utc>>,
    #[serde(
        rename = "FinishTime",
        serialize_with = "crate::time::optional::serialize"
    )]
    finish_time: &'a Option<DateTime<Utc>>,
    #[serde(rename = "HealthCheck")]
    health_check: &'a String,
    #[serde(rename = "HealthCheckType", skip_serializing_if = "unset")]
    health_check_type: &'a Option<HealthCheckType>,
    #[serde(
        rename = "HealthCheckInterval",
        serialize_with = "crate::duration::optional::serialize",
        skip_serializing_if = "unset"
    )]
    health_check_interval: &'a Option<Duration>,
    #[serde(
        rename = "HealthCheckTimeout",
        serialize_with = "crate::duration::optional::serialize",
        skip_serializing_if = "unset"
    )]
    health_check_timeout: &'a Option<Duration>,
    #[serde(rename = "HealthCheckRetries", skip_serializing_if = "unset")]
    health_check_retries: &'a Option<u32>,
    #[serde(rename = "MaxRestarts", skip_serializing_if = "unset")]
    max_restarts: &'a Option<u32>,
    #[serde(
        rename = "RestartDelay",
        serialize_with = "crate::duration::optional::serialize",
        skip_serializing_if = "unset"
    )]
    restart_delay: &'a Option<Duration>,
    #[serde(
        rename = "RestartDelayMax",
        serialize_with = "crate::duration::optional::serialize",
        skip_serializing_if = "unset"
    )]
    restart_delay_max: &'a Option<Duration>,
    #[serde(rename = "RestartCount")]
    restart_count: &'a u32,
    #[serde(rename = "FailureStreak", skip_serializing_if = "zero")]
    failure_streak: &'a u32,
    #[serde(rename = "Health", skip_serializing_if = "unset")]
    health: &'a Option<Health>,
    #[serde(rename = "HealthFailures", skip_serializing_if = "zero")]
    health_failures: &'a u32,
    #[serde(rename = "NodeName")]
    node_name: &'a String,
    #[serde(rename = "DesiredState")]
    desired_state: &'a State,
    #[serde(rename = "ExitCode")]
    exit_code: &'a Option<i64>,
    #[serde(rename = "Error")]
    error: &'a Option<String>,
    #[serde(rename = "PendingReason", skip_serializing_if = "unset")]
    pending_reason: &'a Option<String>,
    #[serde(rename = "History", skip_serializing_if = "none_listed")]
    history: &'a Vec<HistoryEntry>,
    #[serde(rename = "Constraints", skip_serializing_if = "none_listed")]
    constraints: &'a Vec<crate::job::Constraint>,
    #[serde(rename = "Job", skip_serializing_if = "blank")]
    job: &'a String,
    #[serde(rename = "Group", skip_serializing_if = "blank")]
    group: &'a String,
    #[serde(rename = "Index", skip_serializing_if = "unset")]
    index: &'a Option<u32>,
    #[serde(rename = "Owner", skip_serializing_if = "blank")]
    owner: &'a String,
    #[serde(rename = "Priority", skip_serializing_if = "unset")]
    priority: &'a Option<u8>,
    #[serde(
        rename = "QueueTimeout",
        serialize_with = "crate::duration::optional::serialize",
        skip_serializing_if = "unset"
    )]
    queue_timeout: &'a Option<Duration>,
    #[serde(
        rename = "NextRestart",
        serialize_with = "crate::time::optional::serialize",
        skip_serializing_if = "unset"
    )]
    next_restart: &'a Option<DateTime<Utc>>,
    #[serde(rename = "DispatchError", skip_serializing_if = "unset")]
    dispatch_error: &'a Option<String>,
    #[serde(
        rename = "NextAttempt",
        serialize_with = "crate::time::optional::serialize",
        skip_serializing_if = "unset"
    )]
    next_attempt: &'a Option<DateTime<Utc>>,
    #[serde(
        rename = "HealthySince",
        serialize_with = "crate::time::optional::serialize",
        skip_serializing_if = "unset"
    )]
    healthy_since: &'a Option<DateTime<Utc>>,
    #[serde(rename = "Pod", skip_serializing_if = "unset")]
    pod: &'a Option<Box<Pod>>,
    #[serde(rename = "Containers", skip_serializing_if = "none_listed")]
    containers: &'a Vec<ContainerStatus>,
}

fn unset<T>(value: &&Option<T>) -> bool {
    value.is_none()
}

fn zero(value: &&u32) -> bool {
    **value == 0
}

fn none_listed<T>(value: &&Vec<T>) -> bool {
    value.is_empty()
}

fn blank(value: &&String) -> bool {
    value.is_empty()
}

impl Serialize for Task {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.wire_ref(&self.status.history).serialize(serializer)
    }
}

/// No history: what [`Task::without_history`] writes in its place.
static NO_HISTORY: Vec<HistoryEntry> = Vec::new();

/// A task written without its `History` (see [`Task::without_history`]).
pub struct WithoutHistory<'a>(&'a Task);

impl Serialize for WithoutHistory<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.wire_ref(&NO_HISTORY).serialize(serializer)
    }
}

impl Task {
    /// The task as it is written, but without its `History` (the bulk of a task's JSON):
    /// what the manager's events carry, written from references, with no copy of the task.
    pub fn without_history(&self) -> WithoutHistory<'_> {
        WithoutHistory(self)
    }

    /// The task's wire form, from references, with `history` as its `History`.
    fn wire_ref<'a>(&'a self, history: &'a Vec<HistoryEntry>) -> TaskWireRef<'a> {
        let Task {
            id,
            name,
            spec:
                TaskSpec {
                    image,
                    cpu,
                    memory,
                    disk,
                    env,
                    cmd,
                    exposed_ports,
                    port_bindings,
                    restart_policy,
                    health_check,
                    health_check_type,
                    health_check_interval,
                    health_check_timeout,
                    health_check_retries,
                    max_restarts,
                    restart_delay,
                    restart_delay_max,
                    constraints,
                    job,
                    group,
                    index,
                    owner,
                    priority,
                    queue_timeout,
                    pod,
                    desired_state,
                },
            status:
                TaskStatus {
                    state,
                    node_name,
                    restart_count,
                    failure_streak,
                    created_time,
                    history: _,
                    pending_reason,
                    next_restart,
                    dispatch_error,
                    next_attempt,
                    healthy_since,
                    run:
                        RunStatus {
                            container_id,
                            host_ports,
                            start_time,
                            finish_time,
                            exit_code,
                            error,
                            health,
                            health_failures,
                            containers,
                        },
                },
        } = self;
        TaskWireRef {
            id,
            container_id,
            name,
            state,
            image,
            cpu,
            memory,
            disk,
            env,
            cmd,
            exposed_ports,
            port_bindings,
            host_ports,
            restart_policy,
            created_time,
            start_time,
            finish_time,
            health_check,
            health_check_type,
            health_check_interval,
            health_check_timeout,
            health_check_retries,
            max_restarts,
            restart_delay,
            restart_delay_max,
            restart_count,
            failure_streak,
            health,
            health_failures,
            node_name,
            desired_state,
            exit_code,
            error,
            pending_reason,
            history,
            constraints,
            job,
            group,
            index,
            owner,
            priority,
            queue_timeout,
            next_restart,
            dispatch_error,
            next_attempt,
            healthy_since,
            pod,
            containers,
        }
    }
}

impl From<TaskWire> for Task {
    fn from(wire: TaskWire) -> Task {
        let TaskWire {
            id,
            container_id,
            name,
            state,
            image,
            cpu,
            memory,
            disk,
            env,
            cmd,
            exposed_ports,
            port_bindings,
            host_ports,
            restart_policy,
            created_time,
            start_time,
            finish_time,
            health_check,
            health_check_type,
            health_check_interval,
            health_check_timeout,
            health_check_retries,
            max_restarts,
            restart_delay,
            restart_delay_max,
            restart_count,
            failure_streak,
            health,
            health_failures,
            node_name,
            desired_state,
            exit_code,
            error,
            pending_reason,
            history,
            constraints,
            job,
            group,
            index,
            owner,
            priority,
            queue_timeout,
            next_restart,
            dispatch_error,
            next_attempt,
            healthy_since,
            pod,
            containers,
        } = wire;
        Task {
            id,
            name,
            spec: TaskSpec {
                image,
                cpu,
                memory,
                disk,
                env,
                cmd,
                exposed_ports,
                port_bindings,
                restart_policy,
                health_check,
                health_check_type,
                health_check_interval,
                health_check_timeout,
                health_check_retries,
                max_restarts,
                restart_delay,
                restart_delay_max,
                constraints,
                job,
                group,
                index,
                owner,
                priority,
                queue_timeout,
                pod,
                desired_state,
            },
            status: TaskStatus {
                state,
                node_name,
                restart_count,
                failure_streak,
                created_time,
                history,
                pending_reason,
                next_restart,
                dispatch_error,
                next_attempt,
                healthy_since,
                run: RunStatus {
                    container_id,
                    host_ports,
                    start_time,
                    finish_time,
                    exit_code,
                    error,
                    health,
                    health_failures,
                    containers,
                },
            },
        }
    }
}

/// What a worker observes of one run of a task, apart from its `State`: the container, the
/// ports Docker bound, the times, how it ended, and its health. Defined once, here: the worker
/// writes it, the manager takes it from the worker's report as one value and clears it for a
/// new run.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunStatus {
    pub container_id: String,
    pub host_ports: BTreeMap<String, Vec<HostBinding>>,
    pub start_time: Option<DateTime<Utc>>,
    pub finish_time: Option<DateTime<Utc>>,
    pub exit_code: Option<i64>,
    pub error: Option<String>,
    pub health: Option<Health>,
    pub health_failures: u32,
    /// A pod's containers, the infra container first, then in the order they started.
    pub containers: Vec<ContainerStatus>,
}

/// Who begins a task's new run ([`Task::restart`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartBy {
    /// The restart policy, after the run's backoff: `failure_streak` is the failures in a row
    /// the next backoff is counted from.
    Policy { failure_streak: u32 },
    /// The user (`cube restart`): the failure streak starts over and the task is wanted
    /// running again.
    User,
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

/// Who takes a submitted task, for [`Task::clear_status`]: each believes a different part
/// of what it is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receiver {
    /// The manager, sent a task by a user: only the spec is the user's to say.
    Manager,
    /// A worker, sent a task by the manager: the run number is the manager's to say too.
    Worker,
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
            name: name.into(),
            spec: TaskSpec {
                image: image.into(),
                cpu: 0.0,
                memory: 0,
                disk: 0,
                env: Vec::new(),
                cmd: Vec::new(),
                exposed_ports: BTreeSet::new(),
                port_bindings: BTreeMap::new(),
                restart_policy: RestartPolicy::No,
                health_check: String::new(),
                health_check_type: None,
                health_check_interval: None,
                health_check_timeout: None,
                health_check_retries: None,
                max_restarts: None,
                restart_delay: None,
                restart_delay_max: None,
                constraints: Vec::new(),
                job: String::new(),
                group: String::new(),
                index: None,
                owner: String::new(),
                priority: None,
                queue_timeout: None,
                pod: None,
                desired_state: State::Running,
            },
            status: TaskStatus {
                state: State::Pending,
                node_name: String::new(),
                restart_count: 0,
                failure_streak: 0,
                created_time: None,
                history: Vec::new(),
                pending_reason: None,
                next_restart: None,
                dispatch_error: None,
                next_attempt: None,
                healthy_since: None,
                run: RunStatus::default(),
            },
        }
    }

    /// Whether the task has a health check: a path, or the `tcp` type.
    pub fn has_health_check(&self) -> bool {
        if let Some(pod) = &self.spec.pod {
            return pod.has_health_check();
        }
        !self.spec.health_check.trim().is_empty()
            || self.spec.health_check_type == Some(HealthCheckType::Tcp)
    }

    pub fn health_interval(&self) -> Duration {
        self.spec
            .health_check_interval
            .unwrap_or(DEFAULT_HEALTH_INTERVAL)
    }

    pub fn health_timeout(&self) -> Duration {
        self.spec
            .health_check_timeout
            .unwrap_or(DEFAULT_HEALTH_TIMEOUT)
    }

    pub fn health_retries(&self) -> u32 {
        self.spec
            .health_check_retries
            .unwrap_or(DEFAULT_HEALTH_RETRIES)
            .max(1)
    }

    /// The wait before the next restart: `RestartDelay` doubled for each earlier quick failure
    /// in a row, at most `RestartDelayMax`.
    pub fn restart_backoff(&self) -> Duration {
        let first = self.spec.restart_delay.unwrap_or(DEFAULT_RESTART_DELAY);
        let cap = self
            .spec
            .restart_delay_max
            .unwrap_or(DEFAULT_RESTART_DELAY_MAX)
            .max(first);
        let doublings = self.status.failure_streak.saturating_sub(1).min(20);
        first.saturating_mul(1 << doublings).min(cap)
    }

    /// How long a run must stay up for the backoff to start over: [`BACKOFF_RESET_AFTER`],
    /// or `RestartDelayMax` if that is longer.
    pub fn backoff_reset_after(&self) -> Duration {
        BACKOFF_RESET_AFTER.max(
            self.spec
                .restart_delay_max
                .unwrap_or(DEFAULT_RESTART_DELAY_MAX),
        )
    }

    /// Moves the task to `next` if the transition table allows it (`State::transition`), and
    /// leaves it as it is otherwise: the one way a manager or a worker changes a task's state
    /// along the table. (`State::restart` is the one way back from an ended run.)
    pub fn move_to(&mut self, next: State) -> Result<(), crate::state::Transition> {
        self.status.state = self.status.state.transition(next)?;
        if next != State::Running {
            self.status.healthy_since = None;
        }
        Ok(())
    }

    /// Ends the task's run as the manager records it, when the manager itself decides the
    /// end (the worker no longer has the task, refused it, or its node was removed, lost or
    /// never had it; a request that never got placed): the one place such an end is written,
    /// so that every one of them looks the same in the API, the history and the events.
    ///
    /// `state` is `Completed`, `Failed` or `Lost`, checked against the transition table; a
    /// task already in `state` (a second end of the same run) is refused too, and left as it
    /// was. On success the task is in `state`, with a history entry named after the state
    /// whose message is `reason` (empty without one), and no reason to wait for placement.
    /// `Completed` and `Failed` end the run: its finish time is set to `now` unless the run
    /// already has one (a time the worker observed is the better one). `Lost` does not: its
    /// node stopped answering and the run may still go on there (`Lost → Running`). The
    /// reason of a `Failed` or `Lost` task is its run's error too; a `Completed` task's error
    /// is left as it was (an end asked for is not an error).
    pub fn end(
        &mut self,
        state: State,
        reason: Option<String>,
        now: DateTime<Utc>,
    ) -> Result<(), crate::state::Transition> {
        let refused = crate::state::Transition {
            from: self.status.state,
            to: state,
        };
        if !matches!(state, State::Completed | State::Failed | State::Lost)
            || self.status.state == state
        {
            return Err(refused);
        }
        self.move_to(state)?;
        if state != State::Lost {
            self.status.run.finish_time.get_or_insert(now);
        }
        if state != State::Completed
            && let Some(reason) = &reason
        {
            self.status.run.error = Some(reason.clone());
        }
        self.status.pending_reason = None;
        self.record(now, state.name(), reason.unwrap_or_default());
        Ok(())
    }

    /// Begins a new run of a task that ended or was lost, under the same ID: back to
    /// `Pending` by the one explicit way back ([`State::restart`]), one more `RestartCount`
    /// (a worker makes the new run a new container), the last run's observations and the
    /// manager's account of what came next forgotten ([`Task::clear_observed`]), and a
    /// `Restart` history entry saying which restart this is and how the last run ended. A
    /// task that has not ended is refused and left as it was. Returns the entry's message.
    pub fn restart(
        &mut self,
        by: RestartBy,
        now: DateTime<Utc>,
    ) -> Result<String, crate::state::Transition> {
        let pending = self.status.state.restart()?;
        let last_run = match (self.status.state, &self.status.run.error) {
            (State::Lost, _) => format!("node {} was lost", self.status.node_name),
            (_, Some(error)) => error.clone(),
            (ended, None) => format!("it ended {ended}"),
        };
        self.status.state = pending;
        self.status.restart_count += 1;
        let count = self.status.restart_count;
        let message = match by {
            RestartBy::Policy { failure_streak } => {
                self.status.failure_streak = failure_streak;
                let limit = self
                    .spec
                    .max_restarts
                    .map(|max| format!(" of {max}"))
                    .unwrap_or_default();
                format!("restart {count}{limit}; the last run: {last_run}")
            }
            RestartBy::User => {
                // The user asked for a fresh start, not a policy's backoff, and for a run.
                self.status.failure_streak = 0;
                self.spec.desired_state = State::Running;
                format!("restart {count}, asked by the user; the last run: {last_run}")
            }
        };
        self.clear_observed();
        self.record(now, "Restart", message.clone());
        Ok(message)
    }

    /// Whether the current run counts as healthy: running, and its health check passed (or
    /// it has none).
    pub fn is_healthy(&self) -> bool {
        self.status.state == State::Running
            && match self.status.run.health {
                None => !self.has_health_check(),
                Some(health) => health == Health::Healthy,
            }
    }

    /// Keeps `HealthySince` in step with [`Task::is_healthy`]: set to `now` when the run
    /// turns healthy, unset when it is not. True when it changed.
    pub fn note_health(&mut self, now: DateTime<Utc>) -> bool {
        match (self.is_healthy(), self.status.healthy_since) {
            (true, None) => self.status.healthy_since = Some(now),
            (false, Some(_)) => self.status.healthy_since = None,
            _ => return false,
        }
        true
    }

    /// Adds an entry to the history, keeping the last [`HISTORY_LIMIT`].
    pub fn record(
        &mut self,
        time: DateTime<Utc>,
        event: impl Into<String>,
        message: impl Into<String>,
    ) {
        self.status.history.push(HistoryEntry {
            time,
            event: event_name(event.into()),
            message: message.into(),
        });
        if self.status.history.len() > HISTORY_LIMIT {
            let excess = self.status.history.len() - HISTORY_LIMIT;
            self.status.history.drain(..excess);
        }
    }

    /// Forgets what a worker observed of the task's last run ([`RunStatus`]) and the
    /// manager's account of what came next (its reason for not placing it, a restart to
    /// come, a failing attempt): what a restart starts from. Part of [`Task::clear_status`].
    pub fn clear_observed(&mut self) {
        let status = &mut self.status;
        status.run = RunStatus::default();
        status.pending_reason = None;
        status.next_restart = None;
        status.dispatch_error = None;
        status.next_attempt = None;
        status.healthy_since = None;
    }

    /// Keeps only what a submitter may say of a task: the spec. Whatever status the
    /// submission carried is ignored, not refused (the book's task files carry `State` and
    /// zero values), by resetting it here.
    ///
    /// The manager clears every status field. A worker is sent tasks by the manager, and
    /// keeps what the manager owns and the worker needs: `RestartCount`, the run number that
    /// tells a new run from the last, and `CreatedTime`. It drops the manager's `History`,
    /// `FailureStreak` and `PendingReason`: the manager keeps them and never reads a worker's
    /// copy back, so a copy there would only go stale. `NodeName` the worker writes itself.
    /// A submission's `DesiredState` is not believed either: submitting asks for a run.
    pub fn clear_status(&mut self, receiver: Receiver) {
        // Every status field, by whose it is. The pattern has no `..`: a new field does not
        // compile until it is placed here.
        let TaskStatus {
            // What a worker observes of one run, and the manager's account of what comes
            // next (a restart, another attempt): `clear_observed`.
            run: _,
            pending_reason: _,
            next_restart: _,
            dispatch_error: _,
            next_attempt: _,
            healthy_since: _,
            // What the manager decides and records.
            state: _,
            node_name: _,
            failure_streak: _,
            history: _,
            // The manager's, and kept by a worker.
            restart_count: _,
            created_time: _,
        } = &self.status;
        self.clear_observed();
        self.spec.desired_state = State::Running;
        let status = &mut self.status;
        status.state = State::Pending;
        status.node_name.clear();
        status.failure_streak = 0;
        status.history.clear();
        if receiver == Receiver::Manager {
            status.restart_count = 0;
            status.created_time = None;
        }
    }

    /// The wire names of the spec fields (and the name) in which `other` differs from `self`,
    /// in the order of the task's fields; empty when they ask for the same thing. Compare
    /// tasks as submissions are stored, both normalized ([`Task::normalize`]): `"7777"` and
    /// `"7777/tcp"` are the same port only once written one way. The ID and the desired state
    /// (which a stop changes) are not compared.
    pub fn spec_differences(&self, other: &Task) -> Vec<&'static str> {
        self.spec_comparison(other)
            .into_iter()
            .filter(|(_, same)| !same)
            .map(|(field, _)| field)
            .collect()
    }

    /// Whether `other` asks for the same thing as `self` except, perhaps, in the spec fields
    /// named in `ignored` (wire names): [`Task::spec_differences`] without building a list,
    /// for the job controller's look at every copy.
    pub fn same_spec_except(&self, other: &Task, ignored: &[&str]) -> bool {
        self.spec_comparison(other)
            .iter()
            .all(|(field, same)| *same || ignored.contains(field))
    }

    /// Each spec field's wire name, and whether `self` and `other` agree on it.
    fn spec_comparison(&self, other: &Task) -> [(&'static str, bool); 26] {
        // No `..`: a new spec field does not compile until it is compared here.
        let TaskSpec {
            image,
            cpu,
            memory,
            disk,
            env,
            cmd,
            exposed_ports,
            port_bindings,
            restart_policy,
            health_check,
            health_check_type,
            health_check_interval,
            health_check_timeout,
            health_check_retries,
            max_restarts,
            restart_delay,
            restart_delay_max,
            constraints,
            job,
            group,
            index,
            owner,
            priority,
            queue_timeout,
            pod,
            desired_state: _,
        } = &self.spec;
        let theirs = &other.spec;
        [
            ("Name", self.name == other.name),
            ("Image", *image == theirs.image),
            ("Cpu", *cpu == theirs.cpu),
            ("Memory", *memory == theirs.memory),
            ("Disk", *disk == theirs.disk),
            ("Env", *env == theirs.env),
            ("Cmd", *cmd == theirs.cmd),
            ("ExposedPorts", *exposed_ports == theirs.exposed_ports),
            ("PortBindings", *port_bindings == theirs.port_bindings),
            ("RestartPolicy", *restart_policy == theirs.restart_policy),
            ("HealthCheck", *health_check == theirs.health_check),
            (
                "HealthCheckType",
                *health_check_type == theirs.health_check_type,
            ),
            (
                "HealthCheckInterval",
                *health_check_interval == theirs.health_check_interval,
            ),
            (
                "HealthCheckTimeout",
                *health_check_timeout == theirs.health_check_timeout,
            ),
            (
                "HealthCheckRetries",
                *health_check_retries == theirs.health_check_retries,
            ),
            ("MaxRestarts", *max_restarts == theirs.max_restarts),
            ("RestartDelay", *restart_delay == theirs.restart_delay),
            (
                "RestartDelayMax",
                *restart_delay_max == theirs.restart_delay_max,
            ),
            ("Constraints", *constraints == theirs.constraints),
            ("Job", *job == theirs.job),
            ("Group", *group == theirs.group),
            ("Index", *index == theirs.index),
            ("Owner", *owner == theirs.owner),
            ("Priority", *priority == theirs.priority),
            ("QueueTimeout", *queue_timeout == theirs.queue_timeout),
            ("Pod", *pod == theirs.pod),
        ]
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
        self.spec.exposed_ports = std::mem::take(&mut self.spec.exposed_ports)
            .into_iter()
            .map(|port| canonical_port(&port).unwrap_or(port))
            .collect();
        self.spec.port_bindings = std::mem::take(&mut self.spec.port_bindings)
            .into_iter()
            .map(|(port, host)| {
                (
                    canonical_port(&port).unwrap_or(port),
                    host.trim().to_string(),
                )
            })
            .collect();
        let bound: Vec<String> = self.spec.port_bindings.keys().cloned().collect();
        self.spec.exposed_ports.extend(bound);
        if let Some(pod) = &self.spec.pod {
            // What the scheduler and the node's loads read of a pod: its sums and its ports.
            self.spec.port_bindings = pod.port_bindings();
            self.spec.exposed_ports = self.spec.port_bindings.keys().cloned().collect();
            if pod.cpus() > 0.0 {
                self.spec.cpu = pod.cpus();
            }
            if pod.memory_bytes() > 0 {
                self.spec.memory = pod.memory_bytes();
            }
            if let Some(restart) = pod.spec.restart
                && self.spec.restart_policy == RestartPolicy::No
            {
                self.spec.restart_policy = restart;
            }
        }
    }

    /// Everything wrong with the task as submitted, each finding naming its field (and the
    /// index in a list, `Cmd[1]`) and, for a number out of range, the limit. The one
    /// validation of a submission: the CLI, the manager and the worker all run it (through
    /// [`crate::Submission::parse`]), so all three refuse the same task with the same words.
    pub fn validate(&self) -> Vec<String> {
        let mut findings = Vec::new();
        self.validate_strings(&mut findings);
        findings.extend(
            Resources {
                cpu: self.spec.cpu,
                memory: self.spec.memory,
                disk: self.spec.disk,
            }
            .findings(""),
        );
        if self.spec.memory != 0 && self.spec.memory < MIN_MEMORY_BYTES {
            findings.push(format!(
                "Memory: {} bytes is below Docker's minimum of {MIN_MEMORY_BYTES} bytes (6 MiB); \
                 Memory is in bytes, or a string with a unit such as \"64MiB\"",
                self.spec.memory
            ));
        }
        self.validate_ports(&mut findings);
        self.validate_health_and_restarts(&mut findings);
        for (n, constraint) in self.spec.constraints.iter().enumerate() {
            findings.extend(constraint.findings(&format!("Constraints[{n}]")));
        }
        findings
    }

    /// `Name`, `Image`, `Env` and `Cmd`: what fuzzing found reaches Docker (or a terminal)
    /// unchecked otherwise.
    fn validate_strings(&self, findings: &mut Vec<String>) {
        let name_chars = self.name.chars().count();
        if name_chars > MAX_NAME_CHARS {
            findings.push(format!(
                "Name: {name_chars} characters is more than the limit of {MAX_NAME_CHARS}"
            ));
        } else if let Some(control) = self.name.chars().find(|c| c.is_control()) {
            findings.push(format!("Name: {}", control_character(control)));
        }
        if self.spec.pod.is_some() {
            self.validate_pod_fields(findings);
        } else if self.spec.image.trim().is_empty() {
            findings.push("Image: missing image name".to_string());
        } else if let Err(why) = check_image_reference(&self.spec.image) {
            findings.push(format!(
                "Image: {:?} is not a valid image reference: {why}",
                self.spec.image
            ));
        }
        for (index, entry) in self.spec.env.iter().enumerate() {
            match entry.split_once('=') {
                None => findings.push(format!("Env[{index}]: {entry:?} is not KEY=value")),
                Some(("", _)) => findings.push(format!(
                    "Env[{index}]: {entry:?} has no name before '='; write KEY=value"
                )),
                Some((key, value)) => {
                    if let Some(control) = key.chars().find(|c| c.is_control()) {
                        findings.push(format!("Env[{index}]: {}", control_character(control)));
                    } else if let Some(control) = value.chars().find(|c| forbidden_in_text(*c)) {
                        findings.push(format!("Env[{index}]: {}", control_character(control)));
                    }
                }
            }
        }
        for (index, argument) in self.spec.cmd.iter().enumerate() {
            if let Some(control) = argument.chars().find(|c| forbidden_in_text(*c)) {
                findings.push(format!("Cmd[{index}]: {}", control_character(control)));
            }
        }
    }

    /// A pod's images, commands, health checks, limits and ports are in its compose file: the
    /// task's own fields say nothing else (the ports and sums [`Task::normalize`] derives
    /// from the file are accepted, so that a stored pod reads back as valid).
    fn validate_pod_fields(&self, findings: &mut Vec<String>) {
        let Some(pod) = &self.spec.pod else { return };
        let spec = &self.spec;
        for (field, set) in [
            ("Image", !spec.image.trim().is_empty()),
            ("Cmd", !spec.cmd.is_empty()),
            ("Env", !spec.env.is_empty()),
            ("HealthCheck", !spec.health_check.trim().is_empty()),
            ("HealthCheckType", spec.health_check_type.is_some()),
        ] {
            if set {
                findings.push(format!(
                    "{field}: a pod's {field} is in its compose file; leave {field} out"
                ));
            }
        }
        let derived = pod.port_bindings();
        let bindings: BTreeMap<String, String> = spec
            .port_bindings
            .iter()
            .map(|(port, host)| {
                (
                    canonical_port(port).unwrap_or_else(|_| port.clone()),
                    host.trim().to_string(),
                )
            })
            .collect();
        let exposed: BTreeSet<String> = spec
            .exposed_ports
            .iter()
            .map(|port| canonical_port(port).unwrap_or_else(|_| port.clone()))
            .collect();
        let derived_exposed: BTreeSet<String> = derived.keys().cloned().collect();
        if !(bindings.is_empty() || bindings == derived)
            || !(exposed.is_empty() || exposed == derived_exposed)
        {
            findings.push(
                "PortBindings: a pod's ports are its services' `ports` in the compose file; \
                 leave ExposedPorts and PortBindings out"
                    .to_string(),
            );
        }
        if pod.cpus() > 0.0 && spec.cpu != 0.0 && (spec.cpu - pod.cpus()).abs() > 1e-9 {
            findings.push(format!(
                "Cpu: {} differs from the sum of the services' deploy.resources.limits.cpus ({})",
                spec.cpu,
                pod.cpus()
            ));
        }
        if pod.memory_bytes() > 0 && spec.memory != 0 && spec.memory != pod.memory_bytes() {
            findings.push(format!(
                "Memory: {} differs from the sum of the services' deploy.resources.limits.memory ({})",
                spec.memory,
                pod.memory_bytes()
            ));
        }
        if let Some(restart) = pod.spec.restart
            && spec.restart_policy != RestartPolicy::No
            && spec.restart_policy != restart
        {
            findings.push(format!(
                "RestartPolicy: {:?} differs from the compose file's restart ({restart:?})",
                spec.restart_policy
            ));
        }
    }

    fn validate_ports(&self, findings: &mut Vec<String>) {
        for port in &self.spec.exposed_ports {
            if let Err(why) = canonical_port(port) {
                findings.push(format!("ExposedPorts: {why}"));
            }
        }
        for (port, host) in &self.spec.port_bindings {
            if let Err(why) = canonical_port(port) {
                findings.push(format!("PortBindings: {why}"));
            }
            if let Err(why) = parse_host_side(host) {
                findings.push(format!("PortBindings: {port}: {why}"));
            }
        }
    }

    /// The health check and the restart settings. Durations are checked whether or not the
    /// task has a health check, so that the same value gets the same answer everywhere.
    fn validate_health_and_restarts(&self, findings: &mut Vec<String>) {
        if self.has_health_check() && self.spec.pod.is_none() {
            let path = self.spec.health_check.trim();
            if self.spec.health_check_type != Some(HealthCheckType::Tcp) && !path.starts_with('/') {
                findings.push(format!(
                    "HealthCheck: {path:?} is not an HTTP path such as \"/health\""
                ));
            } else if let Some(control) = path.chars().find(|c| c.is_control()) {
                findings.push(format!("HealthCheck: {}", control_character(control)));
            }
            if self.spec.exposed_ports.is_empty() && self.spec.port_bindings.is_empty() {
                findings.push(
                    "HealthCheck: the task publishes no port to probe; add PortBindings \
                     (e.g. {\"7777/tcp\": \"\"})"
                        .to_string(),
                );
            }
        }
        // Each duration that must be positive says why in its own words: a zero
        // `QueueTimeout` has nothing to do with health probes.
        const PROBE: &str = "a probe needs time to run and to wait between runs";
        let durations = [
            (
                "HealthCheckInterval",
                self.spec.health_check_interval,
                Some(PROBE),
            ),
            (
                "HealthCheckTimeout",
                self.spec.health_check_timeout,
                Some(PROBE),
            ),
            ("RestartDelay", self.spec.restart_delay, None),
            ("RestartDelayMax", self.spec.restart_delay_max, None),
            (
                "QueueTimeout",
                self.spec.queue_timeout,
                Some(
                    "how long the request may wait in the queue for room before it fails; \
                     leave it out to wait without limit",
                ),
            ),
        ];
        for (field, duration, why_positive) in durations {
            let Some(duration) = duration else { continue };
            if let Some(why) = why_positive
                && duration.is_zero()
            {
                findings.push(format!(
                    "{field}: must be longer than 0 ({why}); durations count whole \
                     milliseconds, e.g. \"500ms\""
                ));
            } else if duration > MAX_TASK_DURATION {
                findings.push(format!(
                    "{field}: {} is more than the limit of {MAX_TASK_DURATION_TEXT}",
                    format_duration(duration)
                ));
            }
        }
        findings.extend(owner_findings("Owner", &self.spec.owner));
        if let Some(priority) = self.spec.priority
            && priority > 100
        {
            findings.push(format!("Priority: {priority} is out of range 0-100"));
        }
        if self.spec.health_check_retries == Some(0) {
            findings.push(
                "HealthCheckRetries: must be at least 1 (the failed probes in a row that make \
                 a task unhealthy)"
                    .to_string(),
            );
        }
    }
}

/// The most characters of an owner's name.
pub const MAX_OWNER_LEN: usize = 63;

/// The owner a request has when it names none.
pub const ANONYMOUS: &str = "anonymous";

/// What is wrong with an owner's name (empty is fine: `anonymous`): at most
/// [`MAX_OWNER_LEN`] letters, digits, `.`, `_`, `-` and `@`.
pub fn owner_findings(path: &str, owner: &str) -> Vec<String> {
    let mut findings = Vec::new();
    if owner.chars().count() > MAX_OWNER_LEN {
        findings.push(format!(
            "{path}: {} characters; at most {MAX_OWNER_LEN}",
            owner.chars().count()
        ));
    }
    if !owner
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'))
    {
        findings.push(format!(
            "{path}: {owner:?} may hold only letters, digits, '.', '_', '-' and '@'"
        ));
    }
    findings
}

/// Whether a character is refused in `Cmd` and in `Env` values: every control character but
/// tab, line feed and carriage return, which multi-line scripts (`sh -c`) and values such as
/// certificates carry. A NUL cannot reach a process at all: `execve` ends a string there.
fn forbidden_in_text(c: char) -> bool {
    c.is_control() && !matches!(c, '\t' | '\n' | '\r')
}

fn control_character(c: char) -> String {
    format!("contains a control character (U+{:04X})", u32::from(c))
}

/// Checks an image reference roughly as Docker's grammar (`distribution/reference`) does:
/// `[host[:port]/]path[:tag][@sha256:digest]`, where each path component is lowercase letters
/// and digits separated by `.`, `_`, `__` or dashes, the name (host and path) is at most
/// [`MAX_IMAGE_NAME_CHARS`], and a tag is 1-128 of letters, digits, `_`, `.` and `-`, not
/// starting with `.` or `-`. The first component is a host when it has a `.` or `:` or is
/// `localhost`. Newer Docker clients also read a first component with a capital letter
/// (`UPPER/case`) as a host, but the daemon Cube runs on (20.10) reads it as a repository and
/// refuses it ("repository name must be lowercase"), so Cube refuses it at submission too. A
/// tag may hold capitals (`app:V1`); only the repository path may not.
pub fn check_image_reference(image: &str) -> Result<(), String> {
    let (rest, digest) = match image.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (image, None),
    };
    if let Some(digest) = digest {
        let valid = digest.strip_prefix("sha256:").is_some_and(|hex| {
            hex.len() == 64 && hex.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
        });
        if !valid {
            return Err(format!(
                "the digest {digest:?} is not \"sha256:\" and 64 lowercase hex digits"
            ));
        }
    }
    let after_last_slash = rest.rfind('/').map_or(0, |slash| slash + 1);
    let (name, tag) = match rest[after_last_slash..].rfind(':') {
        Some(colon) => {
            let colon = after_last_slash + colon;
            (&rest[..colon], Some(&rest[colon + 1..]))
        }
        None => (rest, None),
    };
    if let Some(tag) = tag {
        let mut chars = tag.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if !(first_ok && rest_ok && tag.len() <= 128) {
            return Err(format!(
                "the tag {tag:?} is not 1-128 letters, digits, '_', '.' or '-' \
                 (not starting with '.' or '-')"
            ));
        }
    }
    if name.is_empty() {
        return Err("there is no repository name".to_string());
    }
    let name_chars = name.chars().count();
    if name_chars > MAX_IMAGE_NAME_CHARS {
        return Err(format!(
            "the name is {name_chars} characters; the limit is {MAX_IMAGE_NAME_CHARS}"
        ));
    }
    let mut components: Vec<&str> = name.split('/').collect();
    if components.len() > 1 {
        let first = components[0];
        let is_host = first.contains(['.', ':']) || first == "localhost";
        if is_host {
            check_registry_host(first)?;
            components.remove(0);
        }
    }
    for component in components {
        if !is_path_component(component) {
            if is_path_component(&component.to_ascii_lowercase()) {
                return Err(format!(
                    "repository names must be lowercase ({component:?})"
                ));
            }
            return Err(format!(
                "{component:?} is not a name component: lowercase letters and digits, \
                 separated by '.', '_', '__' or '-'"
            ));
        }
    }
    Ok(())
}

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`.
fn is_path_component(component: &str) -> bool {
    let bytes = component.as_bytes();
    let alphanumeric = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if !(bytes.first().is_some_and(|b| alphanumeric(*b))
        && bytes.last().is_some_and(|b| alphanumeric(*b)))
    {
        return false;
    }
    let mut index = 0;
    while index < bytes.len() {
        if alphanumeric(bytes[index]) {
            index += 1;
            continue;
        }
        let start = index;
        while index < bytes.len() && !alphanumeric(bytes[index]) {
            index += 1;
        }
        let separator = &component[start..index];
        let valid = matches!(separator, "." | "_" | "__") || separator.bytes().all(|b| b == b'-');
        if !valid {
            return false;
        }
    }
    true
}

/// `host[:port]`: DNS labels of letters, digits and inner dashes separated by dots (or an
/// IPv6 address in brackets), and an optional port number.
fn check_registry_host(host: &str) -> Result<(), String> {
    let (name, port) = if let Some(end) = host.strip_prefix('[').and_then(|h| h.find(']')) {
        let address = &host[1..=end];
        let after = &host[end + 2..];
        let port = after.strip_prefix(':');
        if !address.chars().all(|c| c.is_ascii_hexdigit() || c == ':')
            || !(after.is_empty() || port.is_some())
        {
            return Err(format!("{host:?} is not a registry host[:port]"));
        }
        (None, port)
    } else {
        match host.split_once(':') {
            Some((name, port)) => (Some(name), Some(port)),
            None => (Some(host), None),
        }
    };
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    let name_ok = name.is_none_or(|name| name.split('.').all(label_ok));
    let port_ok =
        port.is_none_or(|port| !port.is_empty() && port.chars().all(|c| c.is_ascii_digit()));
    if name_ok && port_ok {
        Ok(())
    } else {
        Err(format!("{host:?} is not a registry host[:port]"))
    }
}

/// A host port a task claims on its node: a number and a protocol. The same number over two
/// protocols is two ports (`53/tcp` and `53/udp` do not collide).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostPort {
    pub port: u16,
    pub protocol: PortProtocol,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PortProtocol {
    Tcp,
    Udp,
    Sctp,
}

impl HostPort {
    pub fn tcp(port: u16) -> HostPort {
        HostPort {
            port,
            protocol: PortProtocol::Tcp,
        }
    }
}

/// `7777` for TCP, as people say it; `53/udp` otherwise.
impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.protocol {
            PortProtocol::Tcp => write!(f, "{}", self.port),
            PortProtocol::Udp => write!(f, "{}/udp", self.port),
            PortProtocol::Sctp => write!(f, "{}/sctp", self.port),
        }
    }
}

impl Task {
    /// The host ports the task claims: each `PortBindings` entry whose host port is a number
    /// (not `""` or `0`, which let Docker choose), with its container port's protocol. The one
    /// place a claim is read; the scheduler and the manager's node loads both use it. A port
    /// bound on one address (`127.0.0.1:8080`) claims the port on the whole node, as one bound
    /// on every address does: two tasks never share a host port, whatever their addresses,
    /// which is simple and never lets Docker refuse a placement the scheduler allowed.
    pub fn fixed_host_ports(&self) -> impl Iterator<Item = HostPort> + '_ {
        self.spec
            .port_bindings
            .iter()
            .filter_map(|(container, host)| {
                let port = parse_host_side(host).ok()?.port?;
                let protocol = match container
                    .split_once('/')
                    .map(|(_, p)| p.to_ascii_lowercase())
                {
                    Some(p) if p == "udp" => PortProtocol::Udp,
                    Some(p) if p == "sctp" => PortProtocol::Sctp,
                    _ => PortProtocol::Tcp,
                };
                Some(HostPort { port, protocol })
            })
    }
}

/// The host side of a `PortBindings` entry: the address to publish on (`None`: every
/// address of the node, as Docker does by default) and the host port (`None`: Docker chooses
/// one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostSide {
    pub ip: Option<IpAddr>,
    pub port: Option<u16>,
}

/// Reads the host side of a `PortBindings` entry, as `docker run -p` writes it before the
/// container port: `""` (Docker chooses the port), `"8080"`, `"127.0.0.1:8080"`,
/// `"127.0.0.1:"` (Docker chooses the port on that address) or `"[::1]:8080"` (an IPv6
/// address in brackets). Anything else, `"0"` included, is refused with the forms that work.
pub fn parse_host_side(host: &str) -> Result<HostSide, String> {
    let text = host.trim();
    let forms = "write a port number 1-65535, IP:PORT (e.g. \"127.0.0.1:8080\", \"[::1]:8080\"), \
                 IP: to let Docker choose the port on that address, or \"\" to let Docker choose";
    let port_of = |digits: &str| -> Result<Option<u16>, String> {
        if digits.is_empty() {
            return Ok(None);
        }
        match digits.parse::<u16>() {
            Ok(port @ 1..) => Ok(Some(port)),
            _ => Err(format!("host port {digits:?} is not a port number 1-65535")),
        }
    };
    if text.is_empty() {
        return Ok(HostSide {
            ip: None,
            port: None,
        });
    }
    if let Some(rest) = text.strip_prefix('[') {
        let Some((address, after)) = rest.split_once(']') else {
            return Err(format!(
                "{text:?}: the '[' of an IPv6 address is not closed; {forms}"
            ));
        };
        let ip = address
            .parse::<std::net::Ipv6Addr>()
            .map_err(|_| format!("{address:?} is not an IPv6 address; {forms}"))?;
        let Some(digits) = after.strip_prefix(':') else {
            return Err(format!("{text:?} has no ':' after the address; {forms}"));
        };
        return Ok(HostSide {
            ip: Some(IpAddr::V6(ip)),
            port: port_of(digits)?,
        });
    }
    match text.rsplit_once(':') {
        None => {
            if text.chars().all(|c| c.is_ascii_digit()) {
                return Ok(HostSide {
                    ip: None,
                    port: port_of(text)?,
                });
            }
            Err(format!("host {text:?} is not a port number; {forms}"))
        }
        Some((address, digits)) => {
            let ip = address.parse::<std::net::Ipv4Addr>().map_err(|_| {
                if address.contains(':') {
                    format!("{text:?}: write an IPv6 address in brackets, e.g. \"[::1]:8080\"")
                } else {
                    format!("{address:?} is not an IP address; {forms}")
                }
            })?;
            Ok(HostSide {
                ip: Some(IpAddr::V4(ip)),
                port: port_of(digits)?,
            })
        }
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

/// `Env` as a list of `KEY=value` entries, or as a map of names to values (as a compose
/// file's `environment:` is written), or `null`. A map's entries become `KEY=value` in the
/// order of their names (a map has no order of its own once the CLI has read it as JSON, so
/// the same file gives the same list however it is sent; a name given twice keeps its last
/// value); [`Task::validate`] then checks them as it checks a list's.
mod env_list {
    use super::*;

    /// One value of the map form: text, or a number or boolean read as the text it says.
    struct EnvValue(String);

    impl<'de> Deserialize<'de> for EnvValue {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<EnvValue, D::Error> {
            struct EnvValueVisitor;
            impl Visitor<'_> for EnvValueVisitor {
                type Value = EnvValue;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a string, a number or a boolean")
                }
                fn visit_str<E: de::Error>(self, v: &str) -> Result<EnvValue, E> {
                    Ok(EnvValue(v.to_string()))
                }
                fn visit_i64<E: de::Error>(self, v: i64) -> Result<EnvValue, E> {
                    Ok(EnvValue(v.to_string()))
                }
                fn visit_u64<E: de::Error>(self, v: u64) -> Result<EnvValue, E> {
                    Ok(EnvValue(v.to_string()))
                }
                fn visit_f64<E: de::Error>(self, v: f64) -> Result<EnvValue, E> {
                    Ok(EnvValue(v.to_string()))
                }
                fn visit_bool<E: de::Error>(self, v: bool) -> Result<EnvValue, E> {
                    Ok(EnvValue(v.to_string()))
                }
            }
            deserializer.deserialize_any(EnvValueVisitor)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<String>, D::Error> {
        struct EnvVisitor;

        impl<'de> Visitor<'de> for EnvVisitor {
            type Value = Vec<String>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#"a list of "KEY=value" strings or a map such as {"KEY": "value"}"#)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Vec::new())
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Vec::new())
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_any(self)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = seq.next_element::<String>()? {
                    entries.push(entry);
                }
                Ok(entries)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut entries = BTreeMap::new();
                while let Some(key) = map.next_key::<String>()? {
                    // Compose takes a value left out from the shell that runs it; a task
                    // has no such shell, so the value must be written (`""` for empty).
                    let Some(EnvValue(value)) = map.next_value::<Option<EnvValue>>()? else {
                        return Err(de::Error::custom(format!(
                            "{key:?} has no value; write one (\"\" for an empty value)"
                        )));
                    };
                    if key.contains('=') {
                        return Err(de::Error::custom(format!(
                            "the name {key:?} contains '='; a name is what comes before '='"
                        )));
                    }
                    entries.insert(key, value);
                }
                Ok(entries
                    .into_iter()
                    .map(|(key, value)| format!("{key}={value}"))
                    .collect())
            }
        }
        deserializer.deserialize_option(EnvVisitor)
    }
}

/// `Cmd` as a list of arguments, or as one string split into words as docker-compose 1.29
/// splits a string `command:` (Python's `shlex.split`: spaces separate, quotes group, a
/// backslash escapes), or `null`. No shell runs it: `"echo $HOME"` passes `$HOME` as it is;
/// write `sh -c '...'` for a shell, as with compose.
mod command_words {
    use super::*;

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<String>, D::Error> {
        struct CommandVisitor;

        impl<'de> Visitor<'de> for CommandVisitor {
            type Value = Vec<String>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    r#"a list of arguments such as ["echo", "hi"] or a string such as "echo hi""#,
                )
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Vec::new())
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Vec::new())
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_any(self)
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
                split_command(text).map_err(E::custom)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut arguments = Vec::new();
                while let Some(argument) = seq.next_element::<String>()? {
                    arguments.push(argument);
                }
                Ok(arguments)
            }
        }
        deserializer.deserialize_option(CommandVisitor)
    }
}

/// Splits a command string into arguments as Python's `shlex.split` does, which is what
/// docker-compose 1.29 (through docker-py) does with a string `command:`: spaces, tabs and
/// line ends separate; single quotes keep everything; double quotes keep everything but
/// `\"` and `\\`; outside quotes a backslash escapes the next character; `''` is an empty
/// argument; `#` is an ordinary character.
pub fn split_command(text: &str) -> Result<Vec<String>, String> {
    let mut arguments = Vec::new();
    let mut argument = String::new();
    let mut in_argument = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' | '\r' | '\n' => {
                if in_argument {
                    arguments.push(std::mem::take(&mut argument));
                    in_argument = false;
                }
            }
            '\'' => {
                in_argument = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => argument.push(c),
                        None => return Err(format!("{text:?}: a ' is not closed")),
                    }
                }
            }
            '"' => {
                in_argument = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.peek() {
                            Some(&escaped @ ('"' | '\\')) => {
                                argument.push(escaped);
                                chars.next();
                            }
                            _ => argument.push('\\'),
                        },
                        Some(c) => argument.push(c),
                        None => return Err(format!("{text:?}: a \" is not closed")),
                    }
                }
            }
            '\\' => {
                in_argument = true;
                match chars.next() {
                    Some(c) => argument.push(c),
                    None => {
                        return Err(format!(
                            "{text:?}: ends in a backslash that escapes nothing"
                        ));
                    }
                }
            }
            c => {
                in_argument = true;
                argument.push(c);
            }
        }
    }
    if in_argument {
        arguments.push(argument);
    }
    Ok(arguments)
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
        task.spec.port_bindings.insert("8080".into(), " ".into());
        task.spec.exposed_ports.insert("7777/TCP".into());
        assert!(task.validate().is_empty(), "{:?}", task.validate());
        task.normalize();
        assert_eq!(
            task.spec.exposed_ports,
            BTreeSet::from(["7777/tcp".to_string(), "8080/tcp".to_string()])
        );
        assert_eq!(
            task.spec.port_bindings.get("8080/tcp").map(String::as_str),
            Some("")
        );
    }

    #[test]
    fn a_host_side_may_name_the_address_to_publish_on() {
        let v4 = |ip: [u8; 4]| Some(IpAddr::from(ip));
        for (text, ip, port) in [
            ("", None, None),
            (" 8080 ", None, Some(8080)),
            ("127.0.0.1:8080", v4([127, 0, 0, 1]), Some(8080)),
            ("127.0.0.1:", v4([127, 0, 0, 1]), None),
            ("0.0.0.0:80", v4([0, 0, 0, 0]), Some(80)),
            (
                "[::1]:8080",
                Some(IpAddr::from(std::net::Ipv6Addr::LOCALHOST)),
                Some(8080),
            ),
            (
                "[::]:",
                Some(IpAddr::from(std::net::Ipv6Addr::UNSPECIFIED)),
                None,
            ),
        ] {
            assert_eq!(parse_host_side(text), Ok(HostSide { ip, port }), "{text:?}");
        }
        for (text, why) in [
            ("0", "\"0\" is not a port number 1-65535"),
            ("99999", "is not a port number 1-65535"),
            ("127.0.0.1:0", "is not a port number 1-65535"),
            (
                "web",
                "is not a port number; write a port number 1-65535, IP:PORT",
            ),
            ("localhost:8080", "\"localhost\" is not an IP address"),
            ("300.0.0.1:80", "is not an IP address"),
            ("::1:8080", "write an IPv6 address in brackets"),
            ("[::1]8080", "no ':' after the address"),
            ("[::1:8080", "is not closed"),
            ("[1.2.3.4]:80", "is not an IPv6 address"),
            ("127.0.0.1", "is not a port number"),
        ] {
            let err = parse_host_side(text).expect_err(text);
            assert!(err.contains(why), "{text:?}: {err}");
        }
    }

    #[test]
    fn a_binding_on_one_address_is_valid_and_claims_its_port_on_the_node() {
        let task: Task = serde_json::from_str(
            r#"{"Image": "x", "PortBindings": {"7777/tcp": "127.0.0.1:8080", "53/udp": "127.0.0.1:", "9000": "9000"}}"#,
        )
        .unwrap();
        assert_eq!(task.validate(), Vec::<String>::new());
        let claimed: Vec<HostPort> = task.fixed_host_ports().collect();
        assert_eq!(claimed, [HostPort::tcp(8080), HostPort::tcp(9000)]);
        let bad: Task = serde_json::from_str(
            r#"{"Image": "x", "PortBindings": {"7777/tcp": "localhost:8080"}}"#,
        )
        .unwrap();
        let findings = bad.validate().join("\n");
        assert!(
            findings.starts_with("PortBindings: 7777/tcp: \"localhost\" is not an IP address"),
            "{findings}"
        );
    }

    #[test]
    fn a_task_without_id_or_name_gets_both() {
        let mut task: Task = serde_json::from_str(r#"{"Image": "busybox"}"#).unwrap();
        assert!(task.id.is_nil());
        task.normalize();
        assert!(!task.id.is_nil());
        assert_eq!(task.name, format!("task-{}", task.short_id()));
        assert_eq!(task.status.state, State::Pending);
        assert_eq!(task.spec.desired_state, State::Running);
    }

    #[test]
    fn validation_names_each_bad_field() {
        let mut task = Task::new("bad", " ");
        task.spec.cpu = -1.0;
        task.spec.memory = 1000;
        task.spec.exposed_ports.insert("http".into());
        task.spec
            .port_bindings
            .insert("80/tcp".into(), "99999".into());
        task.spec.env.push("=x".into());
        let findings = task.validate().join("\n");
        for field in [
            "Image: missing image name",
            "Cpu:",
            "Memory: 1000 bytes",
            "ExposedPorts: \"http\"",
            "99999",
            "Env[0]:",
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
        assert!(
            task.spec.env.is_empty()
                && task.spec.cmd.is_empty()
                && task.spec.exposed_ports.is_empty()
        );
        assert_eq!(task.spec.restart_policy, RestartPolicy::No);
        assert_eq!(task.status.run.start_time, None);
        assert_eq!(task.spec.cpu, 0.5);
    }

    #[test]
    fn exposed_ports_round_trip_as_an_object_of_empty_objects() {
        let mut task = Task::new("web", "busybox");
        task.spec.exposed_ports.insert("7777/tcp".into());
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
        assert_eq!(
            task.spec.health_check_interval,
            Some(Duration::from_millis(500))
        );
        assert_eq!(task.spec.restart_delay, Some(Duration::ZERO));
        let json = serde_json::to_value(&task).unwrap();
        assert_eq!(json["HealthCheckInterval"], "500ms");
        assert_eq!(json["RestartDelay"], "0s");
    }

    #[test]
    fn a_health_check_needs_a_path_and_a_port() {
        let mut task = Task::new("t", "img");
        task.spec.health_check = "health".into();
        let findings = task.validate().join("\n");
        assert!(findings.contains("not an HTTP path"), "{findings}");
        assert!(findings.contains("publishes no port"), "{findings}");
    }

    #[test]
    fn the_backoff_doubles_per_quick_failure_up_to_its_cap() {
        let mut task = Task::new("t", "img");
        task.spec.restart_delay = Some(Duration::from_millis(500));
        task.spec.restart_delay_max = Some(Duration::from_secs(3));
        let waits: Vec<Duration> = (1..=5)
            .map(|streak| {
                task.status.failure_streak = streak;
                task.restart_backoff()
            })
            .collect();
        let ms = |n| Duration::from_millis(n);
        assert_eq!(waits, vec![ms(500), ms(1000), ms(2000), ms(3000), ms(3000)]);
        task.spec.restart_delay = Some(Duration::ZERO);
        assert_eq!(task.restart_backoff(), Duration::ZERO);
    }

    #[test]
    fn the_history_keeps_the_latest_entries() {
        let mut task = Task::new("t", "img");
        for n in 0..HISTORY_LIMIT + 5 {
            task.record(Utc::now(), "Event", n.to_string());
        }
        assert_eq!(task.status.history.len(), HISTORY_LIMIT);
        assert_eq!(task.status.history[0].message, "5");
    }

    #[test]
    fn a_task_is_written_under_the_names_it_is_read_by() {
        // Every field away from its default, then every field at it: what is written reads
        // back the same, and an empty task writes the book's fields only.
        let mut full = Task::new("full", "cube-sample:latest");
        full.spec.cpu = 0.5;
        full.spec.memory = 64 << 20;
        full.spec.disk = 1 << 30;
        full.spec.env = vec!["A=b".into()];
        full.spec.cmd = vec!["sleep".into(), "1".into()];
        full.spec.exposed_ports.insert("7777/tcp".into());
        full.spec
            .port_bindings
            .insert("7777/tcp".into(), "8080".into());
        full.spec.restart_policy = RestartPolicy::OnFailure;
        full.spec.health_check = "/health".into();
        full.spec.health_check_type = Some(HealthCheckType::Http);
        full.spec.health_check_interval = Some(Duration::from_secs(2));
        full.spec.health_check_timeout = Some(Duration::from_secs(1));
        full.spec.health_check_retries = Some(4);
        full.spec.max_restarts = Some(3);
        full.spec.restart_delay = Some(Duration::from_millis(500));
        full.spec.restart_delay_max = Some(Duration::from_secs(30));
        full.spec.constraints = vec![crate::job::Constraint {
            attribute: "label.zone".into(),
            operator: crate::job::Operator::Equal,
            value: "eu".into(),
        }];
        full.spec.job = "web".into();
        full.spec.group = "api".into();
        full.spec.index = Some(2);
        full.spec.owner = "alice".into();
        full.spec.priority = Some(70);
        full.spec.queue_timeout = Some(Duration::from_secs(30));
        full.spec.desired_state = State::Completed;
        let now = Utc::now();
        full.status.state = State::Failed;
        full.status.node_name = "w1".into();
        full.status.restart_count = 2;
        full.status.failure_streak = 1;
        full.status.created_time = Some(now);
        full.record(now, "Failed", "exit 1");
        full.status.pending_reason = Some("no room".into());
        full.status.next_restart = Some(now);
        full.status.dispatch_error = Some("refused".into());
        full.status.next_attempt = Some(now);
        full.status.healthy_since = Some(now);
        full.status.run = RunStatus {
            container_id: "c1".into(),
            host_ports: BTreeMap::from([(
                "7777/tcp".into(),
                vec![HostBinding {
                    host_ip: "0.0.0.0".into(),
                    host_port: "8080".into(),
                }],
            )]),
            start_time: Some(now),
            finish_time: Some(now),
            exit_code: Some(1),
            error: Some("exit 1".into()),
            health: Some(Health::Unhealthy),
            health_failures: 3,
            containers: vec![ContainerStatus {
                name: "infra".into(),
                container_id: "c0".into(),
                status: "running".into(),
                exit_code: None,
                health: None,
                error: None,
            }],
        };
        for task in [full, Task::new("bare", "cube-sample:latest")] {
            let written = serde_json::to_value(&task).unwrap();
            let read: Task = serde_json::from_value(written).unwrap();
            assert_eq!(
                read, task,
                "every field is written under a name it is read by"
            );
        }
        let bare = serde_json::to_value(Task::new("bare", "cube-sample:latest")).unwrap();
        let keys: Vec<&str> = bare
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        assert_eq!(
            keys,
            [
                "Cmd",
                "ContainerID",
                "Cpu",
                "DesiredState",
                "Disk",
                "Env",
                "Error",
                "ExitCode",
                "ExposedPorts",
                "FinishTime",
                "HealthCheck",
                "HostPorts",
                "ID",
                "Image",
                "Memory",
                "Name",
                "NodeName",
                "PortBindings",
                "RestartCount",
                "RestartPolicy",
                "StartTime",
                "State",
            ],
            "the book's fields are always written; Cube's own only when set"
        );
    }

    #[test]
    fn a_runs_status_moves_as_one_value_and_a_restart_clears_it() {
        let mut worker_side = Task::new("t", "img");
        worker_side.status.run.container_id = "c1".into();
        worker_side.status.run.start_time = Some(Utc::now());
        worker_side.status.run.exit_code = Some(3);
        worker_side.status.run.error = Some("exit 3".into());
        worker_side.status.run.health = Some(Health::Unhealthy);
        worker_side.status.run.health_failures = 2;
        let mut manager_side = Task::new("t", "img");
        manager_side.status.run = worker_side.status.run.clone();
        assert_eq!(manager_side.status.run, worker_side.status.run);
        assert_eq!(manager_side.status.run.container_id, "c1");
        manager_side.clear_observed();
        assert_eq!(manager_side.status.run, RunStatus::default());
    }

    #[test]
    fn unknown_fields_are_refused_by_name() {
        let err = serde_json::from_str::<Task>(r#"{"Image": "x", "Memmory": 5}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `Memmory`"), "{err}");
    }
}

#[cfg(test)]
mod validation_tests {
    use super::*;

    fn findings_for(json: &str) -> String {
        let task: Task = serde_json::from_str(json).unwrap();
        task.validate().join("\n")
    }

    #[test]
    fn control_characters_are_refused_naming_the_field_and_index() {
        let findings = findings_for(
            r#"{"Image": "x", "Name": "a\u0007b", "Cmd": ["sh", "a\u0000b"], "Env": ["A=1", "B=\u001b[31m"]}"#,
        );
        assert!(
            findings.contains("Name: contains a control character (U+0007)"),
            "{findings}"
        );
        assert!(
            findings.contains("Cmd[1]: contains a control character (U+0000)"),
            "{findings}"
        );
        assert!(
            findings.contains("Env[1]: contains a control character (U+001B)"),
            "{findings}"
        );
    }

    #[test]
    fn scripts_and_values_may_span_lines() {
        let findings = findings_for(
            r#"{"Image": "x", "Cmd": ["sh", "-c", "echo a\n\techo b\r\n"], "Env": ["PEM=a\nb"]}"#,
        );
        assert_eq!(findings, "");
    }

    #[test]
    fn env_entries_need_a_name_and_an_equals_sign() {
        let findings = findings_for(r#"{"Image": "x", "Env": ["A=1", "JUSTKEY", "=v", "EMPTY="]}"#);
        assert!(
            findings.contains("Env[1]: \"JUSTKEY\" is not KEY=value"),
            "{findings}"
        );
        assert!(
            findings.contains("Env[2]: \"=v\" has no name"),
            "{findings}"
        );
        assert!(
            !findings.contains("Env[0]") && !findings.contains("Env[3]"),
            "{findings}"
        );
    }

    #[test]
    fn env_may_be_a_map_as_in_compose_and_is_written_as_a_list() {
        let task: Task = serde_json::from_str(
            r#"{"Image": "x", "Env": {"B": "two words", "A": 1, "DEBUG": true, "EMPTY": ""}}"#,
        )
        .unwrap();
        assert_eq!(
            task.spec.env,
            ["A=1", "B=two words", "DEBUG=true", "EMPTY="]
        );
        assert_eq!(task.validate(), Vec::<String>::new());
        let written = serde_json::to_value(&task).unwrap();
        assert_eq!(
            written["Env"],
            serde_json::json!(["A=1", "B=two words", "DEBUG=true", "EMPTY="])
        );
        let yaml: Task =
            serde_norway::from_str("Image: x\nEnv:\n  PORT: 7777\n  A: \"1\"\n  A: \"2\"\n")
                .unwrap();
        assert_eq!(yaml.spec.env, ["A=2", "PORT=7777"]);
        let list: Task = serde_json::from_str(r#"{"Image": "x", "Env": ["A=1"]}"#).unwrap();
        assert_eq!(list.spec.env, ["A=1"]);
        let null: Task = serde_json::from_str(r#"{"Image": "x", "Env": null}"#).unwrap();
        assert!(null.spec.env.is_empty());
    }

    #[test]
    fn an_env_map_entry_without_a_value_or_with_an_equals_sign_is_refused() {
        let refusal = |json: &str| {
            crate::event::decode::<Task>(json.as_bytes())
                .unwrap_err()
                .to_string()
        };
        let missing = refusal(r#"{"Image": "x", "Env": {"HOME": null}}"#);
        assert!(
            missing.starts_with("Env: \"HOME\" has no value"),
            "{missing}"
        );
        let equals = refusal(r#"{"Image": "x", "Env": {"A=B": "1"}}"#);
        assert!(
            equals.starts_with("Env: the name \"A=B\" contains '='"),
            "{equals}"
        );
        let nested = refusal(r#"{"Image": "x", "Env": {"A": [1]}}"#);
        assert!(
            nested.starts_with("Env.A: invalid type: sequence, expected a string, a number"),
            "{nested}"
        );
        let empty_name = findings_for(r#"{"Image": "x", "Env": {"": "v"}}"#);
        assert!(
            empty_name.contains("Env[0]: \"=v\" has no name"),
            "{empty_name}"
        );
    }

    #[test]
    fn cmd_may_be_a_string_split_as_docker_compose_splits_it() {
        let cmd = |json: &str| -> Vec<String> {
            let task: Task = serde_json::from_str(json).unwrap();
            task.spec.cmd
        };
        assert_eq!(cmd(r#"{"Image": "x", "Cmd": "echo hi"}"#), ["echo", "hi"]);
        assert_eq!(
            cmd(r#"{"Image": "x", "Cmd": ["echo", "hi there"]}"#),
            ["echo", "hi there"]
        );
        assert!(cmd(r#"{"Image": "x", "Cmd": ""}"#).is_empty());
        assert!(cmd(r#"{"Image": "x", "Cmd": null}"#).is_empty());
        let task: Task =
            serde_json::from_str(r#"{"Image": "x", "Cmd": "sh -c 'echo a'"}"#).unwrap();
        assert_eq!(
            serde_json::to_value(&task).unwrap()["Cmd"],
            serde_json::json!(["sh", "-c", "echo a"])
        );
        let yaml: Task = serde_norway::from_str("Image: x\nCmd: sh -c \"echo $HOME\"\n").unwrap();
        assert_eq!(yaml.spec.cmd, ["sh", "-c", "echo $HOME"]);
    }

    /// Each expectation is what Python's `shlex.split` (docker-compose 1.29's splitter)
    /// answers for the same text.
    #[test]
    fn a_command_string_splits_as_pythons_shlex() {
        let cases: [(&str, &[&str]); 8] = [
            ("echo hi", &["echo", "hi"]),
            (
                r#"sh -c "echo \"a b\" \$HOME \n" x\ y"#,
                &["sh", "-c", r#"echo "a b" \$HOME \n"#, "x y"],
            ),
            (r#"echo 'it s' '' \"\""#, &["echo", "it s", "", "\"\""]),
            ("a\tb\r\nc", &["a", "b", "c"]),
            ("echo #no", &["echo", "#no"]),
            (r#"a\\b \"q\""#, &["a\\b", "\"q\""]),
            (r#"x "a\\b" "#, &["x", "a\\b"]),
            ("  ", &[]),
        ];
        for (text, expected) in cases {
            assert_eq!(split_command(text).unwrap(), expected, "{text}");
        }
        for (text, why) in [
            ("echo \"x", "a \" is not closed"),
            ("echo 'x", "a ' is not closed"),
            ("echo x\\", "ends in a backslash"),
        ] {
            let err = split_command(text).unwrap_err();
            assert!(err.contains(why), "{text}: {err}");
        }
        let refusal = crate::event::decode::<Task>(br#"{"Image": "x", "Cmd": "echo 'x"}"#)
            .unwrap_err()
            .to_string();
        assert!(refusal.starts_with("Cmd: "), "{refusal}");
    }

    #[test]
    fn a_name_longer_than_the_limit_is_refused_with_the_limit() {
        let mut task = Task::new("x".repeat(5000), "busybox");
        let findings = task.validate().join("\n");
        assert!(
            findings.contains("Name: 5000 characters is more than the limit of 255"),
            "{findings}"
        );
        task.name = "x".repeat(255);
        assert!(task.validate().is_empty());
    }

    #[test]
    fn image_references_follow_dockers_grammar() {
        for valid in [
            "busybox",
            "x",
            "0x10",
            "cube-sample:latest",
            "timboring/echo-server:latest",
            "library/busybox:1.36.1-musl",
            "127.0.0.1:9/cube/missing:1",
            "localhost/app",
            "registry.example.com:5000/team/app_v2__x:v1",
            "Registry.Example.com/app",
            "UPPER:5000/app",
            "app:V1",
            "team/app:Release-2",
            "[::1]:5000/app",
            "my--image",
            "busybox@sha256:3fbc632167424a6d997e74f52b878d7cc478225cffac6bc977eedfe51c7f4e79",
            "busybox:1@sha256:3fbc632167424a6d997e74f52b878d7cc478225cffac6bc977eedfe51c7f4e79",
        ] {
            assert_eq!(check_image_reference(valid), Ok(()), "{valid}");
        }
        for (invalid, why) in [
            ("Running", "must be lowercase"),
            ("team/App", "must be lowercase"),
            ("UPPER/case:tag", "must be lowercase (\"UPPER\")"),
            ("Team/app", "must be lowercase"),
            ("LOCALHOST/app", "must be lowercase"),
            (&"x".repeat(300), "the limit is 255"),
            ("busy box", "not a name component"),
            ("a..b", "not a name component"),
            ("-a", "not a name component"),
            ("a/", "not a name component"),
            ("busybox:", "the tag"),
            ("busybox:.x", "the tag"),
            (&format!("busybox:{}", "t".repeat(129)), "the tag"),
            ("busybox@sha256:abc", "the digest"),
            (":latest", "no repository name"),
            ("a\u{0}b", "not a name component"),
            ("bad_host:port/x", "not a registry host"),
        ] {
            let err = check_image_reference(invalid).expect_err(invalid);
            assert!(err.contains(why), "{invalid}: {err}");
        }
    }

    #[test]
    fn an_invalid_image_is_refused_naming_image() {
        let findings = findings_for(r#"{"Image": "Running"}"#);
        assert_eq!(
            findings,
            "Image: \"Running\" is not a valid image reference: repository names must be lowercase (\"Running\")"
        );
    }

    #[test]
    fn zero_health_durations_are_refused_with_a_reason_with_or_without_a_check() {
        let findings = findings_for(
            r#"{"Image": "x", "HealthCheckInterval": "0s", "HealthCheckTimeout": "0.1ms"}"#,
        );
        assert!(
            findings.contains("HealthCheckInterval: must be longer than 0"),
            "{findings}"
        );
        assert!(
            findings.contains("HealthCheckTimeout: must be longer than 0"),
            "{findings}"
        );
        assert_eq!(findings_for(r#"{"Image": "x", "RestartDelay": "0s"}"#), "");
    }

    #[test]
    fn a_zero_queue_timeout_is_refused_for_what_a_queue_timeout_is() {
        let findings = findings_for(r#"{"Image": "x", "QueueTimeout": "0s"}"#);
        assert!(
            findings.contains("QueueTimeout: must be longer than 0"),
            "{findings}"
        );
        assert!(findings.contains("wait in the queue"), "{findings}");
        assert!(!findings.contains("probe"), "{findings}");
    }

    #[test]
    fn durations_beyond_a_day_are_refused_with_the_limit() {
        for field in [
            "HealthCheckInterval",
            "HealthCheckTimeout",
            "RestartDelay",
            "RestartDelayMax",
        ] {
            let findings = findings_for(&format!(r#"{{"Image": "x", "{field}": "3000000000h"}}"#));
            assert!(findings.starts_with(&format!("{field}: ")), "{findings}");
            assert!(
                findings.contains("more than the limit of 24h"),
                "{findings}"
            );
            assert_eq!(
                findings_for(&format!(r#"{{"Image": "x", "{field}": "24h"}}"#)),
                ""
            );
        }
    }

    #[test]
    fn zero_health_check_retries_are_refused() {
        let findings = findings_for(r#"{"Image": "x", "HealthCheckRetries": 0}"#);
        assert!(
            findings.starts_with("HealthCheckRetries: must be at least 1"),
            "{findings}"
        );
    }

    #[test]
    fn out_of_range_resources_are_refused_with_the_limit() {
        let findings =
            findings_for(r#"{"Image": "x", "Cpu": 1e300, "Memory": "2Pi", "Disk": "1.5Pi"}"#);
        assert!(
            findings.contains("Cpu: 1e300 cores is more than the limit of 1024 cores"),
            "{findings}"
        );
        assert!(
            findings.contains("Memory: 2251799813685248 bytes is more than the limit"),
            "{findings}"
        );
        assert!(findings.contains("Disk: "), "{findings}");
        assert!(findings.contains("(1 PiB)"), "{findings}");
        assert_eq!(
            findings_for(r#"{"Image": "x", "Cpu": "500m", "Memory": "1Pi", "Disk": "1Pi"}"#),
            ""
        );
        let err =
            serde_json::from_str::<Task>(r#"{"Image": "x", "Memory": 99999999999999999999999}"#)
                .unwrap_err();
        assert!(err.to_string().contains("too large"), "{err}");
    }

    #[test]
    fn cpu_reads_as_millicores_and_writes_as_a_number() {
        let task: Task = serde_json::from_str(r#"{"Image": "x", "Cpu": "250m"}"#).unwrap();
        assert_eq!(task.spec.cpu, 0.25);
        assert_eq!(serde_json::to_value(&task).unwrap()["Cpu"], 0.25);
    }
}

#[cfg(test)]
mod status_tests {
    use super::*;

    /// A task whose every status field is set, as a careless or hostile submission would be.
    fn with_status() -> Task {
        let mut task = Task::new("t", "img");
        task.status.state = State::Running;
        task.spec.desired_state = State::Completed;
        task.status.run.container_id = "abc".into();
        task.status.run.host_ports.insert(
            "80/tcp".into(),
            vec![HostBinding {
                host_ip: String::new(),
                host_port: "1".into(),
            }],
        );
        task.status.run.start_time = Some(Utc::now());
        task.status.run.finish_time = Some(Utc::now());
        task.status.run.exit_code = Some(3);
        task.status.run.error = Some("boom".into());
        task.status.run.health = Some(Health::Unhealthy);
        task.status.run.health_failures = 4;
        task.status.pending_reason = Some("full".into());
        task.status.node_name = "w9".into();
        task.status.restart_count = 7;
        task.status.failure_streak = 3;
        task.status.created_time = Some(Utc::now());
        task.record(Utc::now(), "Running", "made up");
        task
    }

    #[test]
    fn the_manager_clears_every_status_field_and_keeps_the_spec() {
        let submitted = with_status();
        let mut task = submitted.clone();
        task.clear_status(Receiver::Manager);
        let mut expected = Task::new("t", "img");
        expected.id = submitted.id;
        assert_eq!(task, expected);
        assert!(task.spec_differences(&submitted).is_empty());
    }

    #[test]
    fn a_worker_keeps_the_managers_run_number_and_creation_time() {
        let submitted = with_status();
        let mut task = submitted.clone();
        task.clear_status(Receiver::Worker);
        assert_eq!(task.status.restart_count, 7);
        assert_eq!(task.status.created_time, submitted.status.created_time);
        assert_eq!(task.status.state, State::Pending);
        assert!(
            task.status.history.is_empty()
                && task.status.failure_streak == 0
                && task.status.node_name.is_empty()
        );
        assert!(
            task.status.run.container_id.is_empty()
                && task.status.run.exit_code.is_none()
                && task.status.run.health.is_none()
        );
    }

    #[test]
    fn spec_differences_names_each_changed_spec_field() {
        let task = Task::new("t", "img");
        let mut other = task.clone();
        assert!(task.spec_differences(&other).is_empty());
        other.spec.image = "img:2".into();
        other.spec.memory = 64 << 20;
        other.spec.cmd = vec!["sleep".into()];
        other
            .spec
            .port_bindings
            .insert("80/tcp".into(), String::new());
        other.spec.health_check_interval = Some(Duration::from_secs(1));
        other.spec.restart_delay_max = Some(Duration::from_secs(9));
        assert_eq!(
            task.spec_differences(&other),
            vec![
                "Image",
                "Memory",
                "Cmd",
                "PortBindings",
                "HealthCheckInterval",
                "RestartDelayMax"
            ]
        );
    }

    #[test]
    fn spec_differences_ignore_the_status() {
        let task = Task::new("t", "img");
        let mut other = with_status();
        other.id = task.id;
        other.name = task.name.clone();
        assert!(task.spec_differences(&other).is_empty());
        other.name = "renamed".into();
        other.spec.cpu = 0.5;
        assert_eq!(task.spec_differences(&other), vec!["Name", "Cpu"]);
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
        assert!(matches!(
            task.status.history[0].event,
            Cow::Borrowed("Placed")
        ));
    }

    #[test]
    fn a_task_without_its_history_is_the_same_task_with_no_history_field() {
        let mut task = Task::new("t", "img");
        task.status.node_name = "w1".into();
        task.record(Utc::now(), "Placed", "on w1");
        let whole = serde_json::to_value(&task).unwrap();
        let without = serde_json::to_value(task.without_history()).unwrap();
        assert!(whole.get("History").is_some());
        let mut expected = whole.clone();
        expected.as_object_mut().unwrap().remove("History");
        assert_eq!(without, expected);
    }
}

#[cfg(test)]
mod life_tests {
    use super::*;
    use crate::state::Transition;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + seconds, 0).unwrap()
    }

    fn running_on(node: &str) -> Task {
        let mut task = Task::new("t", "img");
        task.status.state = State::Running;
        task.status.node_name = node.into();
        task.status.run.start_time = Some(at(0));
        task.status.healthy_since = Some(at(1));
        task
    }

    #[test]
    fn a_failure_sets_the_state_finish_time_error_and_one_history_entry() {
        let mut task = running_on("w1");
        task.end(State::Failed, Some("node w1 was removed".into()), at(5))
            .unwrap();
        assert_eq!(task.status.state, State::Failed);
        assert_eq!(task.status.run.finish_time, Some(at(5)));
        assert_eq!(
            task.status.run.error.as_deref(),
            Some("node w1 was removed")
        );
        assert_eq!(task.status.healthy_since, None);
        assert_eq!(task.status.history.len(), 1);
        let entry = &task.status.history[0];
        assert_eq!(
            (entry.time, entry.event.as_ref(), entry.message.as_str()),
            (at(5), "Failed", "node w1 was removed")
        );
    }

    #[test]
    fn a_completion_keeps_the_error_it_had_and_leaves_pending_reason_behind() {
        let mut task = Task::new("t", "img");
        task.status.pending_reason = Some("no node has room".into());
        task.end(
            State::Completed,
            Some("stopped before it was placed".into()),
            at(3),
        )
        .unwrap();
        assert_eq!(task.status.state, State::Completed);
        assert_eq!(task.status.run.finish_time, Some(at(3)));
        assert_eq!(task.status.run.error, None);
        assert_eq!(task.status.pending_reason, None);
        assert_eq!(task.status.history[0].event, "Completed");
        assert_eq!(
            task.status.history[0].message,
            "stopped before it was placed"
        );

        let mut unhealthy = running_on("w1");
        unhealthy.status.run.error = Some("probe failed".into());
        unhealthy.end(State::Completed, None, at(4)).unwrap();
        assert_eq!(unhealthy.status.run.error.as_deref(), Some("probe failed"));
        assert_eq!(unhealthy.status.history[0].message, "");
    }

    #[test]
    fn a_finish_time_the_run_already_has_is_kept() {
        let mut task = running_on("w1");
        task.status.run.finish_time = Some(at(2));
        task.end(State::Failed, Some("gone".into()), at(9)).unwrap();
        assert_eq!(task.status.run.finish_time, Some(at(2)));
    }

    #[test]
    fn a_lost_task_has_no_finish_time_and_its_later_end_sets_one() {
        let mut task = running_on("w1");
        task.end(State::Lost, Some("node w1 sent nothing".into()), at(5))
            .unwrap();
        assert_eq!(task.status.state, State::Lost);
        assert_eq!(task.status.run.finish_time, None);
        assert_eq!(
            task.status.run.error.as_deref(),
            Some("node w1 sent nothing")
        );
        assert_eq!(task.status.history[0].event, "Lost");
        // Removed while lost: now the run is over.
        task.end(State::Failed, Some("node w1 was removed".into()), at(8))
            .unwrap();
        assert_eq!(task.status.run.finish_time, Some(at(8)));
        assert_eq!(task.status.history.len(), 2);
    }

    #[test]
    fn a_second_end_is_refused_and_changes_nothing() {
        let mut task = running_on("w1");
        task.end(State::Failed, Some("first".into()), at(5))
            .unwrap();
        let ended = task.clone();
        assert_eq!(
            task.end(State::Failed, Some("second".into()), at(9)),
            Err(Transition {
                from: State::Failed,
                to: State::Failed
            })
        );
        assert!(task.end(State::Completed, None, at(9)).is_err());
        assert_eq!(task, ended);

        let mut lost = running_on("w1");
        lost.end(State::Lost, Some("silent".into()), at(5)).unwrap();
        let once = lost.clone();
        assert!(
            lost.end(State::Lost, Some("silent again".into()), at(9))
                .is_err()
        );
        assert_eq!(lost, once);
    }

    #[test]
    fn an_end_outside_the_table_or_to_a_live_state_is_refused() {
        let mut pending = Task::new("t", "img");
        assert!(pending.end(State::Lost, None, at(1)).is_err());
        for live in [State::Pending, State::Scheduled, State::Running] {
            let mut task = running_on("w1");
            let before = task.clone();
            assert!(task.end(live, None, at(1)).is_err(), "{live}");
            assert_eq!(task, before);
        }
        assert_eq!(pending.status.history.len(), 0);
    }

    #[test]
    fn a_restart_by_the_policy_counts_the_run_and_forgets_the_last_one() {
        let mut task = running_on("w1");
        task.spec.max_restarts = Some(5);
        task.status.run.exit_code = Some(1);
        task.end(State::Failed, Some("exit code 1".into()), at(5))
            .unwrap();
        let message = task
            .restart(RestartBy::Policy { failure_streak: 3 }, at(7))
            .unwrap();
        assert_eq!(message, "restart 1 of 5; the last run: exit code 1");
        assert_eq!(task.status.state, State::Pending);
        assert_eq!(task.status.restart_count, 1);
        assert_eq!(task.status.failure_streak, 3);
        assert_eq!(task.status.run, RunStatus::default());
        // The node is kept: the placement that follows tries it first.
        assert_eq!(task.status.node_name, "w1");
        let entry = task.status.history.last().unwrap();
        assert_eq!(
            (entry.time, entry.event.as_ref(), entry.message.as_str()),
            (at(7), "Restart", message.as_str())
        );
    }

    #[test]
    fn a_restart_by_the_user_wants_a_fresh_run() {
        let mut task = running_on("w1");
        task.spec.desired_state = State::Completed;
        task.status.failure_streak = 4;
        task.end(State::Completed, None, at(5)).unwrap();
        let message = task.restart(RestartBy::User, at(6)).unwrap();
        assert_eq!(
            message,
            "restart 1, asked by the user; the last run: it ended Completed"
        );
        assert_eq!(task.status.failure_streak, 0);
        assert_eq!(task.spec.desired_state, State::Running);

        let mut lost = running_on("w2");
        lost.end(State::Lost, Some("silent".into()), at(5)).unwrap();
        let message = lost.restart(RestartBy::User, at(6)).unwrap();
        assert_eq!(
            message,
            "restart 1, asked by the user; the last run: node w2 was lost"
        );
    }

    #[test]
    fn a_task_that_has_not_ended_is_not_restarted() {
        let mut task = running_on("w1");
        let before = task.clone();
        assert_eq!(
            task.restart(RestartBy::User, at(1)),
            Err(Transition {
                from: State::Running,
                to: State::Pending
            })
        );
        assert_eq!(task, before);
    }
}
