//! A node: a worker as the manager knows it, and what a worker says about itself.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::stats::Stats;

/// An amount of each resource the scheduler counts: CPU in cores, memory and disk in bytes.
/// Sizes also read as strings with units (`"2GiB"`).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    #[serde(rename = "Cpu", default)]
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
}
