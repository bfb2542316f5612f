//! The JSON shape of a task, on the API and in the store: one flat object of the book's
//! field names and Cube's (`TaskWire`, read; `TaskWireRef`, written from references), and
//! the readers of the shapes a submission may use (`Env` as a map, `Cmd` as a string, Go's
//! `null`s). Apart from the model so that the nesting of spec and status in memory and the
//! one flat object on the wire each read on their own; the wire format is defined here only.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{
    Health, HealthCheckType, HistoryEntry, HostBinding, RestartPolicy, RunStatus, SpecBody, Task,
    TaskSpec, TaskStatus,
};
use crate::NodeName;
use crate::pod::{ContainerStatus, Pod};
use crate::state::State;

/// The wire form of a task as it is read: one flat object, the book's field names and Cube's,
/// what may be left out and what `null` means. [`Task`] is read as this and written by
/// `TaskWireRef`, so the nesting of spec and status never reaches the wire.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TaskWire {
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
    /// A run that stayed up for [`BACKOFF_RESET_AFTER`](super::BACKOFF_RESET_AFTER) (or
    /// `RestartDelayMax`, if longer) starts the count again.
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
    pub node_name: NodeName,
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
    /// What happened to the task, oldest first, the last
    /// [`HISTORY_LIMIT`](super::HISTORY_LIMIT) entries.
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
    /// The project the task belongs to (`default` when unset).
    #[serde(rename = "Project", default, deserialize_with = "null_as_default")]
    pub project: String,
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
    /// The project's secrets the task uses: `"NAME"` (mounted at `/run/secrets/NAME`) or
    /// `{"Name": "NAME", "Env": "VAR"}`.
    #[serde(rename = "Secrets", default, deserialize_with = "null_as_default")]
    pub secrets: Vec<crate::secret::SecretUse>,
    /// `NAME:/path[:ro]` (a named volume, kept when the task ends) or `/host/path:/path[:ro]`.
    #[serde(rename = "Volumes", default, deserialize_with = "null_as_default")]
    pub volumes: Vec<crate::secret::VolumeMount>,
    /// Where `cube router` reaches the task: `{"Host": "api.example.test", "Port": 7777}`.
    #[serde(rename = "Route", default)]
    pub route: Option<crate::route::RouteSpec>,
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
    node_name: &'a NodeName,
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
    #[serde(rename = "Project", skip_serializing_if = "crate::project::is_default")]
    project: &'a String,
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
    #[serde(rename = "Secrets", skip_serializing_if = "none_listed")]
    secrets: &'a Vec<crate::secret::SecretUse>,
    #[serde(rename = "Volumes", skip_serializing_if = "none_listed")]
    volumes: &'a Vec<crate::secret::VolumeMount>,
    #[serde(rename = "Route", skip_serializing_if = "unset")]
    route: &'a Option<crate::route::RouteSpec>,
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
            spec,
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
        let SpecBody {
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
            owner,
            project,
            priority,
            queue_timeout,
            pod,
            secrets,
            volumes,
            route,
        } = &**spec;
        let (index, desired_state) = (&spec.index, &spec.desired_state);
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
            project,
            priority,
            queue_timeout,
            next_restart,
            dispatch_error,
            next_attempt,
            healthy_since,
            pod,
            containers,
            secrets,
            volumes,
            route,
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
            project,
            priority,
            queue_timeout,
            next_restart,
            dispatch_error,
            next_attempt,
            healthy_since,
            pod,
            containers,
            secrets,
            volumes,
            route,
        } = wire;
        Task {
            id,
            name,
            spec: TaskSpec::new(
                SpecBody {
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
                    owner,
                    project: crate::project::normalized(project),
                    priority,
                    queue_timeout,
                    pod,
                    secrets,
                    volumes,
                    route,
                },
                index,
                desired_state,
            ),
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

fn pending() -> State {
    State::Pending
}

fn running() -> State {
    State::Running
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
    fn unknown_fields_are_refused_by_name() {
        let err = serde_json::from_str::<Task>(r#"{"Image": "x", "Memmory": 5}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `Memmory`"), "{err}");
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
        let empty_name: Task = serde_json::from_str(r#"{"Image": "x", "Env": {"": "v"}}"#).unwrap();
        let empty_name = empty_name.validate().join("\n");
        assert!(
            empty_name.contains("Env[0]: \"=v\" has no name"),
            "{empty_name}"
        );
    }

    #[test]
    fn cmd_may_be_a_string_split_as_docker_compose_splits_it() {
        let cmd = |json: &str| -> Vec<String> {
            let task: Task = serde_json::from_str(json).unwrap();
            task.spec.cmd.clone()
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
    fn cpu_reads_as_millicores_and_writes_as_a_number() {
        let task: Task = serde_json::from_str(r#"{"Image": "x", "Cpu": "250m"}"#).unwrap();
        assert_eq!(task.spec.cpu, 0.25);
        assert_eq!(serde_json::to_value(&task).unwrap()["Cpu"], 0.25);
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
