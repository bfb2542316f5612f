//! Cube's container runtime: what a worker asks of the machine's container engine.
//!
//! [`Runtime`] is the seam (create, start, stop with a timeout, remove, inspect, list the
//! containers Cube manages, stream their exits, read their output, run a command in one, say
//! the engine's version); [`DockerRuntime`] implements it on the Docker engine through
//! bollard. [`sample_image`] builds Cube's local test and demo image, because
//! no registry can be assumed reachable.
//!
//! This crate knows nothing of stores, HTTP or scheduling. It never sets Docker's own restart
//! policy: restarting is the manager's job (one owner of failure handling).

#[cfg(any(test, feature = "contract"))]
pub mod contract;
mod docker;
pub mod sample_image;
mod spec;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;

use chrono::{DateTime, Utc};
use cube_types::{Health, HostBinding};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use tokio::io::AsyncWrite;
use uuid::Uuid;

pub use docker::DockerRuntime;
pub use spec::{ContainerSpec, container_name};

/// Label holding the ID of the task a container runs.
pub const LABEL_TASK_ID: &str = "cube.task-id";
/// Label holding the name of the worker (node) that created the container.
pub const LABEL_NODE: &str = "cube.node";
/// Label holding the task's name, for people reading `docker ps`.
pub const LABEL_TASK_NAME: &str = "cube.task-name";
/// Label holding, on each container of a pod, its service's name (`infra` for the infra
/// container).
pub const LABEL_POD_CONTAINER: &str = "cube.pod-container";
/// Label holding the run (the task's `RestartCount`) a container belongs to.
pub const LABEL_RUN: &str = "cube.run";

/// A named volume as the engine lists it: its name and labels.
pub type VolumeListed = (String, std::collections::HashMap<String, String>);

/// What the engine says about one container.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContainerInfo {
    pub id: String,
    /// Its name, without the engine's leading `/`.
    pub name: String,
    /// From the `cube.pod-container` label: which of a pod's containers it is.
    pub pod_container: Option<String>,
    /// From the `cube.task-id` label; `None` when the label is missing or not a UUID.
    pub task_id: Option<Uuid>,
    /// From the `cube.node` label: the worker that created it.
    pub node: Option<String>,
    pub running: bool,
    /// The host PID of the container's first process while it runs; `None` otherwise. Its
    /// `/proc/<pid>/ns/net` is the container's network namespace, where health checks probe.
    pub pid: Option<u32>,
    /// Set once the container has exited.
    pub exit_code: Option<i64>,
    pub oom_killed: bool,
    /// The engine's own error for the container (e.g. a failed start), empty when none.
    pub error: String,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Published ports, in the book's shape.
    pub host_ports: BTreeMap<String, Vec<HostBinding>>,
    /// What the engine's health check says, for a container that has one.
    pub health: Option<Health>,
}

/// Something that happened to a container Cube manages.
#[derive(Debug, Clone, PartialEq)]
pub enum RuntimeEvent {
    /// Its process ended (exited, was killed, or was stopped).
    Died {
        container_id: String,
        task_id: Option<Uuid>,
    },
    /// It was removed.
    Destroyed {
        container_id: String,
        task_id: Option<Uuid>,
    },
    /// Its health check's verdict changed (healthy or unhealthy).
    HealthChanged {
        container_id: String,
        task_id: Option<Uuid>,
    },
}

impl RuntimeEvent {
    /// The task the container is labelled with.
    pub fn task_id(&self) -> Option<Uuid> {
        match self {
            RuntimeEvent::Died { task_id, .. }
            | RuntimeEvent::Destroyed { task_id, .. }
            | RuntimeEvent::HealthChanged { task_id, .. } => *task_id,
        }
    }

    pub fn container_id(&self) -> &str {
        match self {
            RuntimeEvent::Died { container_id, .. }
            | RuntimeEvent::Destroyed { container_id, .. }
            | RuntimeEvent::HealthChanged { container_id, .. } => container_id,
        }
    }
}

/// Which of a container's output streams a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputStream {
    Stdout,
    Stderr,
}

impl OutputStream {
    pub fn name(self) -> &'static str {
        match self {
            OutputStream::Stdout => "stdout",
            OutputStream::Stderr => "stderr",
        }
    }
}

/// A piece of a container's (or an exec's) output, as the engine hands it out: for logs
/// without a terminal, one line with its newline; with a terminal, whatever was written.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputChunk {
    pub stream: OutputStream,
    pub data: Bytes,
}

/// Which of a container's output to read ([`Runtime::logs`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogOptions {
    /// Go on with new output as it is written, until the container stops.
    pub follow: bool,
    /// Only the last N lines of what was written so far.
    pub tail: Option<u64>,
    /// Only what was written from this Unix time (seconds) on.
    pub since_unix_secs: Option<i64>,
    pub stdout: bool,
    pub stderr: bool,
}

/// A command started in a container ([`Runtime::exec`]): its output as it comes, its input
/// (closed when not asked for), and the engine's ID of the exec, for its exit code.
pub struct ExecSession {
    pub exec_id: String,
    pub output: BoxStream<'static, Result<OutputChunk, RuntimeError>>,
    pub input: Pin<Box<dyn AsyncWrite + Send>>,
}

/// What the engine says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineVersion {
    /// The engine's version (`20.10.24+dfsg1`).
    pub version: String,
    /// The API version agreed with it.
    pub api_version: String,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum RuntimeError {
    #[error("cannot reach the Docker engine: {0} (is dockerd running? try `docker info`)")]
    Unavailable(String),
    #[error("cannot get image {image:?}: {message}")]
    Image { image: String, message: String },
    #[error("no container {0}")]
    NotFound(String),
    /// A container with this name exists already.
    #[error("a container named {0} exists already")]
    Conflict(String),
    /// The container exists but does not run (a command cannot start in it).
    #[error("the container is not running: {0}")]
    NotRunning(String),
    #[error("docker {action} failed: {message}")]
    Engine {
        action: &'static str,
        message: String,
    },
    #[error("{0}")]
    SampleImage(String),
    /// The runtime cannot do this at all (a simulated runtime reads no logs).
    #[error("this container runtime cannot {0}")]
    Unsupported(&'static str),
}

/// A container engine as a worker uses it. Every method is idempotent where the engine allows:
/// stopping a stopped container and removing a removed one succeed.
pub trait Runtime: Send + Sync + 'static {
    /// Makes `image` present locally, pulling it when missing; a pull that fails or takes too
    /// long is an [`RuntimeError::Image`] with the engine's words.
    fn ensure_image(&self, image: &str) -> impl Future<Output = Result<(), RuntimeError>> + Send;
    /// Creates (does not start) a container; returns its ID. A missing image is an
    /// [`RuntimeError::Image`], so that a caller can [`Runtime::ensure_image`] and try again
    /// (as `docker run` does) instead of asking for the image before every create.
    fn create(
        &self,
        spec: &ContainerSpec,
    ) -> impl Future<Output = Result<String, RuntimeError>> + Send;
    fn start(&self, container_id: &str) -> impl Future<Output = Result<(), RuntimeError>> + Send;
    /// Asks the container to stop, killing it after `timeout`.
    fn stop(
        &self,
        container_id: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send;
    /// Removes the container (killing it if it still runs).
    fn remove(&self, container_id: &str) -> impl Future<Output = Result<(), RuntimeError>> + Send;
    /// `None` when no such container exists.
    fn inspect(
        &self,
        container_id: &str,
    ) -> impl Future<Output = Result<Option<ContainerInfo>, RuntimeError>> + Send;
    /// Every container, running or not, labelled as created by the worker `node`, as the
    /// engine's list says it in one call: `id`, `name`, the labels' `task_id`, `node` and
    /// `pod_container`, and `running`; nothing that needs an inspect (no exit code, times,
    /// ports, PID or health).
    fn list_managed(
        &self,
        node: &str,
    ) -> impl Future<Output = Result<Vec<ContainerInfo>, RuntimeError>> + Send;
    /// Deaths and removals of `node`'s containers from `since_unix_secs` on (earlier ones are
    /// replayed), then as they happen. The stream ends when the engine's connection does; the
    /// caller reconnects and resynchronises.
    fn events_since(
        &self,
        node: &str,
        since_unix_secs: i64,
    ) -> BoxStream<'static, Result<RuntimeEvent, RuntimeError>>;
    /// The container's output (stopped containers' too, until they are removed), as the
    /// engine kept it; with `follow`, then what it writes until it stops. A runtime that
    /// keeps no output says [`RuntimeError::Unsupported`].
    fn logs(
        &self,
        _container_id: &str,
        _options: &LogOptions,
    ) -> BoxStream<'static, Result<OutputChunk, RuntimeError>> {
        futures_util::stream::once(async { Err(RuntimeError::Unsupported("read logs")) }).boxed()
    }
    /// Starts `cmd` in a running container, with a terminal when `tty`, its input attached
    /// when `stdin`.
    fn exec(
        &self,
        _container_id: &str,
        _cmd: &[String],
        _tty: bool,
        _stdin: bool,
    ) -> impl Future<Output = Result<ExecSession, RuntimeError>> + Send {
        async { Err(RuntimeError::Unsupported("run a command in a container")) }
    }
    /// The exit code of a command [`Runtime::exec`] started, once it ended (`None` before).
    fn exec_exit_code(
        &self,
        _exec_id: &str,
    ) -> impl Future<Output = Result<Option<i64>, RuntimeError>> + Send {
        async { Err(RuntimeError::Unsupported("run a command in a container")) }
    }
    /// Sets the size of an exec's terminal.
    fn resize_exec(
        &self,
        _exec_id: &str,
        _width: u16,
        _height: u16,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send {
        async { Ok(()) }
    }
    /// [`Runtime::ensure_image`] with a registry's login (`cube registry login`); without one,
    /// the same.
    fn ensure_image_with(
        &self,
        image: &str,
        auth: Option<&cube_types::secret::RegistryAuth>,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send {
        let _ = auth;
        self.ensure_image(image)
    }
    /// Makes the named volume `name` exist, with `labels` when it is made now.
    fn ensure_volume(
        &self,
        _name: &str,
        _labels: &std::collections::HashMap<String, String>,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send {
        async { Err(RuntimeError::Unsupported("make a volume")) }
    }
    /// The named volumes labelled as made by the worker `node`: each one's name and labels.
    fn list_volumes(
        &self,
        _node: &str,
    ) -> impl Future<Output = Result<Vec<VolumeListed>, RuntimeError>> + Send {
        async { Ok(Vec::new()) }
    }
    /// Removes a named volume (a pod's, when the worker is told to remove volumes on kill).
    /// Removing one that is gone succeeds.
    fn remove_volume(&self, _name: &str) -> impl Future<Output = Result<(), RuntimeError>> + Send {
        async { Err(RuntimeError::Unsupported("remove a volume")) }
    }
    /// Removes an image no container uses (when the worker is told to remove images on
    /// kill). One still in use, or gone, is left as it is.
    fn remove_image(&self, _image: &str) -> impl Future<Output = Result<(), RuntimeError>> + Send {
        async { Err(RuntimeError::Unsupported("remove an image")) }
    }
    /// The engine's version.
    fn engine_version(&self) -> impl Future<Output = Result<EngineVersion, RuntimeError>> + Send {
        async { Err(RuntimeError::Unsupported("say its version")) }
    }
}
