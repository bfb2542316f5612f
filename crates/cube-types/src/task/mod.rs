//! A task: one container's worth of work, as the user asked for it and as Cube saw it run.
//!
//! This file is the model and what a reader of a task needs: [`Task`], its [`TaskSpec`] and
//! [`TaskStatus`], a task's life ([`Task::end`], [`Task::restart`], its history and health),
//! its ports, and the defaults. Apart from it: the JSON shape of a task (`wire`), the validation
//! of a submitted one (`validate`), and the image-reference grammar (`crate::image_ref`, which
//! pods use too). Their public items are re-exported here, so `cube_types::task::X` names them
//! as before.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::NodeName;
use crate::pod::{ContainerStatus, Pod};
use crate::state::State;

mod validate;
mod wire;

pub use crate::image_ref::{MAX_IMAGE_NAME_CHARS, check_image_reference};
pub use validate::{MAX_NAME_CHARS, MAX_OWNER_LEN, MIN_MEMORY_BYTES, owner_findings};
pub use wire::{WithoutHistory, split_command};

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
    from = "wire::TaskWire",
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
///
/// A spec is its copy's own fields (`index`, `desired_state`) and a [`SpecBody`] the copies
/// of one job version share behind an `Arc`: a job of 10,000 copies holds its image, command,
/// environment, constraints and names once, not 10,000 times. The body's fields read as the
/// spec's own (`task.spec.image`, through `Deref`); writing one (`DerefMut`) gives this spec a
/// body of its own first (`Arc::make_mut`), so a change to one copy never shows in another.
/// Shared or not, a spec reads, compares and is written on the wire the same.
#[derive(Debug, Clone)]
pub struct TaskSpec {
    body: Arc<SpecBody>,
    /// Which copy of its job's group the task is (`None` for a bare task).
    pub index: Option<u32>,
    /// What the user asked for: `Running` to run it, `Completed` to stop it.
    pub desired_state: State,
}

impl TaskSpec {
    /// A spec of `body`, copy `index`, asked to be in `desired_state`.
    pub fn new(body: SpecBody, index: Option<u32>, desired_state: State) -> TaskSpec {
        TaskSpec {
            body: Arc::new(body),
            index,
            desired_state,
        }
    }

    /// Whether both specs hold one body (not merely equal ones).
    pub fn shares_body_with(&self, other: &TaskSpec) -> bool {
        Arc::ptr_eq(&self.body, &other.body)
    }

    /// Takes `other`'s body when it is equal to this one's, so that both share it; answers
    /// whether they share one now. What either spec reads does not change.
    pub fn share_body_of(&mut self, other: &TaskSpec) -> bool {
        if self.shares_body_with(other) {
            return true;
        }
        if *self.body == *other.body {
            self.body = other.body.clone();
            return true;
        }
        false
    }
}

impl std::ops::Deref for TaskSpec {
    type Target = SpecBody;

    fn deref(&self) -> &SpecBody {
        &self.body
    }
}

impl std::ops::DerefMut for TaskSpec {
    fn deref_mut(&mut self) -> &mut SpecBody {
        Arc::make_mut(&mut self.body)
    }
}

impl PartialEq for TaskSpec {
    fn eq(&self, other: &TaskSpec) -> bool {
        self.index == other.index
            && self.desired_state == other.desired_state
            && (self.shares_body_with(other) || *self.body == *other.body)
    }
}

/// The part of a [`TaskSpec`] that copies of one job version have in common (every field but
/// `index` and `desired_state`).
#[derive(Debug, Clone, PartialEq)]
pub struct SpecBody {
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
    /// The job that owns the task (empty for a bare task) and its group.
    pub job: String,
    pub group: String,
    /// Who asked for the task (a bare task; a job's copies belong to the job's owner): the
    /// waiting list's `Owner`, `anonymous` when unset.
    pub owner: String,
    /// The project the task belongs to ([`crate::project::DEFAULT_PROJECT`] unless named; a
    /// job's copies are in the job's).
    pub project: String,
    /// 0 (least) to 100 (most) in the waiting list; a bare task's own (a job's copies go by
    /// the job's). Unset: the default, 50.
    pub priority: Option<u8>,
    /// How long a bare task may wait in the queue before it gives up (`expired`).
    pub queue_timeout: Option<Duration>,
    /// Several containers as one task, from a compose file; then `Image`, `Cmd`, `Env` and
    /// the health-check fields are empty, and `Cpu`, `Memory` and the ports are the pod's sums.
    pub pod: Option<Box<Pod>>,
    /// The project's secrets the task uses, by name (their values never are in the task).
    pub secrets: Vec<crate::secret::SecretUse>,
    /// Named volumes (kept when the task ends) and bind mounts, `NAME:/path[:ro]`.
    pub volumes: Vec<crate::secret::VolumeMount>,
    /// Where `cube router` reaches the task's copies (see [`crate::route`]); unset: the
    /// default route, when the task exposes a TCP port.
    pub route: Option<crate::route::RouteSpec>,
}

/// What Cube observed and decided: the state, the node, the run number and its backoff, the
/// history, what the manager says of what comes next, and what a worker observed of the
/// current run ([`RunStatus`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskStatus {
    /// What Cube last saw (the observed state).
    pub state: State,
    /// The worker the task is placed on.
    pub node_name: NodeName,
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
            spec: TaskSpec::new(
                SpecBody {
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
                    owner: String::new(),
                    project: crate::project::DEFAULT_PROJECT.to_string(),
                    priority: None,
                    queue_timeout: None,
                    pod: None,
                    secrets: Vec::new(),
                    volumes: Vec::new(),
                    route: None,
                },
                None,
                State::Running,
            ),
            status: TaskStatus {
                state: State::Pending,
                node_name: NodeName::default(),
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
        status.node_name = NodeName::default();
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
    fn spec_comparison(&self, other: &Task) -> [(&'static str, bool); 30] {
        // No `..`: a new spec field does not compile until it is compared here.
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
        } = &*self.spec;
        let index = &self.spec.index;
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
            ("Project", *project == theirs.project),
            ("Priority", *priority == theirs.priority),
            ("QueueTimeout", *queue_timeout == theirs.queue_timeout),
            ("Pod", *pod == theirs.pod),
            ("Secrets", *secrets == theirs.secrets),
            ("Volumes", *volumes == theirs.volumes),
            ("Route", *route == theirs.route),
        ]
    }

    /// The project's secrets the task reads: its `Secrets`, or a pod's services' `secrets:`,
    /// each once.
    pub fn secret_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = match &self.spec.pod {
            Some(pod) => pod.spec.secret_names().into_iter().collect(),
            None => self.spec.secrets.iter().map(|s| s.name.as_str()).collect(),
        };
        names.sort_unstable();
        names.dedup();
        names
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
        // Written only when it changes: a write gives the spec a body of its own, and the
        // copies of a job share theirs.
        let normal = self.spec.normalized();
        if normal != *self.spec {
            *self.spec = normal;
        }
    }
}

impl SpecBody {
    /// This body with its ports in their canonical form (every bound port also exposed) and,
    /// for a pod, the pod's sums, ports and restart policy.
    fn normalized(&self) -> SpecBody {
        let mut body = self.clone();
        body.exposed_ports = std::mem::take(&mut body.exposed_ports)
            .into_iter()
            .map(|port| canonical_port(&port).unwrap_or(port))
            .collect();
        body.port_bindings = std::mem::take(&mut body.port_bindings)
            .into_iter()
            .map(|(port, host)| {
                (
                    canonical_port(&port).unwrap_or(port),
                    host.trim().to_string(),
                )
            })
            .collect();
        let bound: Vec<String> = body.port_bindings.keys().cloned().collect();
        body.exposed_ports.extend(bound);
        if let Some(pod) = &body.pod {
            // What the scheduler and the node's loads read of a pod: its sums and its ports.
            let port_bindings = pod.port_bindings();
            body.exposed_ports = port_bindings.keys().cloned().collect();
            body.port_bindings = port_bindings;
            if pod.cpus() > 0.0 {
                body.cpu = pod.cpus();
            }
            if pod.memory_bytes() > 0 {
                body.memory = pod.memory_bytes();
            }
            if let Some(restart) = pod.spec.restart
                && body.restart_policy == RestartPolicy::No
            {
                body.restart_policy = restart;
            }
        }
        body
    }
}

/// The owner a request has when it names none.
pub const ANONYMOUS: &str = "anonymous";

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

#[cfg(test)]
mod spec_sharing_tests {
    use super::*;

    fn copy() -> Task {
        let mut task = Task::new("web.api[0]", "cube-sample:latest");
        task.spec.job = "web".into();
        task.spec.env = vec!["A=b".into()];
        task.spec.index = Some(0);
        task
    }

    #[test]
    fn a_clone_shares_the_body_until_one_of_them_writes_to_it() {
        let first = copy();
        let mut second = first.clone();
        assert!(second.spec.shares_body_with(&first.spec));
        // A copy's own fields do not touch the body.
        second.spec.index = Some(1);
        second.spec.desired_state = State::Completed;
        assert!(second.spec.shares_body_with(&first.spec));
        second.spec.env.push("C=d".into());
        assert!(!second.spec.shares_body_with(&first.spec));
        assert_eq!(first.spec.env, ["A=b"], "the other copy is untouched");
        assert_eq!(second.spec.env, ["A=b", "C=d"]);
    }

    #[test]
    fn equal_bodies_can_be_shared_and_different_ones_cannot() {
        let first = copy();
        let mut equal: Task =
            serde_json::from_value(serde_json::to_value(&first).unwrap()).unwrap();
        assert!(!equal.spec.shares_body_with(&first.spec));
        assert_eq!(equal, first);
        assert!(equal.spec.share_body_of(&first.spec));
        assert!(equal.spec.shares_body_with(&first.spec));
        assert_eq!(equal, first);

        let mut other = copy();
        other.spec.image = "cube-sample:v2".into();
        assert!(!other.spec.share_body_of(&first.spec));
        assert_eq!(other.spec.image, "cube-sample:v2");
        let mut stopped = first.clone();
        stopped.spec.desired_state = State::Completed;
        assert_ne!(stopped, first, "a copy's own fields count in equality");
    }

    #[test]
    fn a_shared_spec_is_written_on_the_wire_like_one_of_its_own() {
        let first = copy();
        let mut second = first.clone();
        second.spec.index = Some(1);
        let mut alone = copy();
        alone.id = second.id;
        alone.spec.index = Some(1);
        assert!(!alone.spec.shares_body_with(&first.spec));
        assert_eq!(
            serde_json::to_string(&second).unwrap(),
            serde_json::to_string(&alone).unwrap()
        );
    }

    #[test]
    fn normalizing_a_normalized_copy_keeps_its_body_shared() {
        let mut first = copy();
        first.spec.port_bindings.insert("8080".into(), " ".into());
        first.normalize();
        let mut second = first.clone();
        second.normalize();
        assert!(second.spec.shares_body_with(&first.spec));
        assert_eq!(
            second
                .spec
                .port_bindings
                .get("8080/tcp")
                .map(String::as_str),
            Some("")
        );
    }
}
