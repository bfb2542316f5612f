//! Cube's domain types and their JSON wire format.
//!
//! One file per noun: [`task`] (a task and its ports), [`state`] (task states and the one
//! transition table), [`event`] (a `TaskEvent`, the unit of desired state sent to a worker), [`job`] (a job:
//! groups of copies of a task template, the constraints on their nodes, its versions),
//! [`deployment`] (the rollout of a version of a service job), [`queue`] (the waiting list's
//! entries),
//! [`stats`] (a worker's machine metrics), [`node`] (a worker as the manager knows it),
//! [`size`] (byte sizes with units), [`cpu`] (cores, also as millicores), [`duration`]
//! (durations with units), [`error`] (the error body every API returns),
//! [`time`] (RFC 3339 times where the Go zero time means "unset"), [`pod`] (a task of several
//! containers, read from a compose file).
//!
//! This crate does no IO. It knows the JSON field names (`PascalCase`, after the book and
//! Nomad's API) so that every API crate agrees on them; the validation of submitted tasks lives
//! here too, so that a manager and a worker reject the same input with the same words.

pub mod claims;
pub mod cpu;
pub mod deployment;
pub mod duration;
pub mod error;
pub mod event;
mod image_ref;
pub mod job;
pub mod node;
mod node_name;
pub mod output;
pub mod pod;
pub mod project;
pub mod queue;
pub mod route;
pub mod secret;
pub mod shard;
pub mod size;
pub mod state;
pub mod stats;
pub mod task;
pub mod time;
pub mod token;
pub mod version;

pub use error::ErrorBody;
pub use event::{Submission, SubmissionError, TaskEvent};
pub use job::{Constraint, Group, Job, JobType, Operator};
pub use node::{HostNeeds, HostPolicy, Labels, Node, NodeReport, NodeStatus, Resources};
pub use node_name::NodeName;
pub use pod::{ComposeError, ContainerStatus, Pod, PodNetwork, PodSpec};
pub use state::{State, Transition};
pub use stats::{LoadAvg, Stats};
pub use task::{
    Health, HealthCheckType, HistoryEntry, HostBinding, HostPort, PortProtocol, Receiver,
    RestartBy, RestartPolicy, RunStatus, SpecBody, Task, TaskSpec,
};
