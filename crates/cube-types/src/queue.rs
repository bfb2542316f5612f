//! The waiting list: every request (a bare task, or a job with all its groups) with its place
//! in the queue, its state, and once it is served the addresses of what runs for it.
//!
//! The requests users submitted are the desired state; an entry of the waiting list is the
//! current state of one of them: `waiting` (none of it placed yet: it waits for room, in
//! order), `pending-N` (placed and started, N copies not yet running and healthy), `claimed`
//! (every copy runs and passes its health checks), or `expired` (it waited longer than its
//! `QueueTimeout` and gave up). The manager's queue controller keeps the entries; this file
//! holds their shape.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use uuid::Uuid;

/// What kind of request an entry is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum RequestKind {
    /// A bare task (`POST /tasks`, `cube run`); the entry's `ID` is the task's.
    #[serde(rename = "task")]
    Task,
    /// A job (`POST /jobs`, `cube job run`); the entry's `ID` is the job's name.
    #[serde(rename = "job")]
    Job,
}

impl RequestKind {
    pub fn name(self) -> &'static str {
        match self {
            RequestKind::Task => "task",
            RequestKind::Job => "job",
        }
    }

    /// The key of a request's entry in the manager's `queue` table: `task/<id>`, `job/<name>`.
    pub fn key(self, id: &str) -> String {
        format!("{}/{id}", self.name())
    }
}

/// Where a request stands; written `waiting`, `pending-2`, `claimed`, `expired`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueueState {
    /// None of it is placed: it waits for room, in order.
    Waiting,
    /// Placed and started; this many copies are not yet running and healthy.
    Pending(u32),
    /// Every copy runs and passes its health checks.
    Claimed,
    /// It waited longer than its `QueueTimeout` and gave up.
    Expired,
}

impl QueueState {
    /// Whether the request was let in (placed): `pending-N` or `claimed`.
    pub fn is_admitted(self) -> bool {
        matches!(self, QueueState::Pending(_) | QueueState::Claimed)
    }
}

impl std::fmt::Display for QueueState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueueState::Waiting => f.write_str("waiting"),
            QueueState::Pending(left) => write!(f, "pending-{left}"),
            QueueState::Claimed => f.write_str("claimed"),
            QueueState::Expired => f.write_str("expired"),
        }
    }
}

impl std::str::FromStr for QueueState {
    type Err = String;

    fn from_str(text: &str) -> Result<QueueState, String> {
        match text {
            "waiting" => Ok(QueueState::Waiting),
            "claimed" => Ok(QueueState::Claimed),
            "expired" => Ok(QueueState::Expired),
            _ => text
                .strip_prefix("pending-")
                .and_then(|left| left.parse().ok())
                .map(QueueState::Pending)
                .ok_or_else(|| {
                    format!("{text:?} is not a queue state: waiting, pending-N, claimed or expired")
                }),
        }
    }
}

impl Serialize for QueueState {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for QueueState {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<QueueState, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Where one running copy can be reached: the seed's services object, one per task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    /// The task's ID and name.
    #[serde(rename = "ID")]
    pub id: Uuid,
    #[serde(rename = "Name")]
    pub name: String,
    /// The node it runs on, and that node's address (the host workers reach it at).
    #[serde(rename = "Node")]
    pub node: String,
    #[serde(rename = "Address")]
    pub address: String,
    /// Each published container port and where it is reached: `{"7777/tcp":
    /// "10.0.0.2:49153"}`.
    #[serde(rename = "Ports", default)]
    pub ports: BTreeMap<String, String>,
}

/// One request in the waiting list, as the manager stores it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueEntry {
    /// The task's ID, or the job's name.
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "Kind")]
    pub kind: RequestKind,
    /// Its number in the queue: unique, growing with every request (not contiguous); lower
    /// goes first among requests of the same priority.
    #[serde(rename = "Queue")]
    pub queue: u64,
    /// 0 to 100; higher goes first.
    #[serde(rename = "Priority")]
    pub priority: u8,
    #[serde(rename = "Owner")]
    pub owner: String,
    /// The request's project (`default` when unset, and then not written).
    #[serde(
        rename = "Project",
        default,
        skip_serializing_if = "crate::project::is_default"
    )]
    pub project: String,
    #[serde(rename = "State")]
    pub state: QueueState,
    /// When the request joined the queue.
    #[serde(rename = "Since", with = "crate::time::optional", default)]
    pub since: Option<DateTime<Utc>>,
    /// The job's version the entry is for (a job submitted again after it expired is a new
    /// request).
    #[serde(rename = "Version", default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    /// What was submitted: the task, or the job. Kept in an entry only once it expired (the
    /// request may be submitted again as another version); otherwise `null` here, and
    /// `GET /queue` shows it from the task or job itself, which the manager holds anyway: a
    /// copy in each of 100,000 claimed entries would weigh more than the tasks.
    #[serde(
        rename = "Request",
        default,
        skip_serializing_if = "serde_json::Value::is_null"
    )]
    pub request: serde_json::Value,
    /// Why it expired.
    #[serde(rename = "Reason", default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Once claimed: each running copy's addresses.
    #[serde(rename = "Services", default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<Endpoint>,
}

impl QueueEntry {
    /// The request's project.
    pub fn project(&self) -> &str {
        crate::project::name_or_default(&self.project)
    }

    /// The key of the entry in the manager's `queue` table.
    pub fn key(&self) -> String {
        self.kind.key(&self.id)
    }

    /// The order of the queue: higher priority first, then the lower number.
    pub fn order(&self) -> (std::cmp::Reverse<u8>, u64) {
        order(self.priority, self.queue)
    }
}

/// The waiting list's order of a request of `priority` numbered `queue`: higher priority
/// first, then the lower number.
pub fn order(priority: u8, queue: u64) -> (std::cmp::Reverse<u8>, u64) {
    (std::cmp::Reverse(priority), queue)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_states_are_written_as_words() {
        for (state, text) in [
            (QueueState::Waiting, "\"waiting\""),
            (QueueState::Pending(2), "\"pending-2\""),
            (QueueState::Claimed, "\"claimed\""),
            (QueueState::Expired, "\"expired\""),
        ] {
            assert_eq!(serde_json::to_string(&state).unwrap(), text);
            assert_eq!(serde_json::from_str::<QueueState>(text).unwrap(), state);
        }
        let wrong = serde_json::from_str::<QueueState>("\"pending-x\"").unwrap_err();
        assert!(wrong.to_string().contains("not a queue state"), "{wrong}");
        assert!(QueueState::Pending(1).is_admitted());
        assert!(!QueueState::Waiting.is_admitted());
    }
}
