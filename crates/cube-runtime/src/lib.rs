//! Cube's container runtime: what a worker asks of the machine's container engine.
//!
//! [`Runtime`] is the seam (create, start, stop with a timeout, remove, inspect, list the
//! containers Cube manages, stream their exits); [`DockerRuntime`] implements it on the Docker
//! engine through bollard. [`sample_image`] builds Cube's local test and demo image, because
//! no registry can be assumed reachable.
//!
//! This crate knows nothing of stores, HTTP or scheduling. It never sets Docker's own restart
//! policy: restarting is the manager's job (one owner of failure handling).

mod docker;
pub mod sample_image;
mod spec;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use cube_types::HostBinding;
use futures_util::stream::BoxStream;
use uuid::Uuid;

pub use docker::DockerRuntime;
pub use spec::{ContainerSpec, container_name};

/// Label holding the ID of the task a container runs.
pub const LABEL_TASK_ID: &str = "cube.task-id";
/// Label holding the name of the worker (node) that created the container.
pub const LABEL_NODE: &str = "cube.node";
/// Label holding the task's name, for people reading `docker ps`.
pub const LABEL_TASK_NAME: &str = "cube.task-name";

/// What the engine says about one container.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerInfo {
    pub id: String,
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
    #[error("docker {action} failed: {message}")]
    Engine {
        action: &'static str,
        message: String,
    },
    #[error("{0}")]
    SampleImage(String),
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
    /// Every container, running or not, labelled as created by the worker `node`.
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
}
