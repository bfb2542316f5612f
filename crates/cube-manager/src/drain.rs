//! Nodes in and out of service: eligibility (`POST /nodes/{name}/eligibility`), drains
//! (`POST /nodes/{name}/drain`) and forgetting a node that is gone (`DELETE /nodes/{name}`).
//!
//! A node that is not eligible gets no new task: the scheduler's `EligibleFilter` refuses it,
//! and system jobs make no copy there. A drain makes the node ineligible and lets the job
//! controller move its service and batch job copies: a copy on a draining node does not count
//! for its group (`jobs::plan_counted`), so a new copy is made elsewhere, and the old one is
//! stopped once the new one is healthy (or at the drain's deadline). Bare tasks and system
//! jobs' copies stay. Nothing here starts or stops a task itself: there is one way of moving
//! copies, the job controller's. The drain is done when no job copy is left on the node
//! (`Liveness::finish_drains`, `liveness.rs`); the node stays ineligible until the
//! operator enables it.
//!
//! Eligibility and drains are stored with the node, so a restarted manager keeps them.

use std::time::{Duration, Instant};

use chrono::Utc;
use cube_types::node::Drain;
use cube_types::{Node, NodeStatus, State};

use crate::manager::{Manager, ManagerError};

use crate::cluster::{NodeChange, lock};

impl Manager {
    /// `POST /nodes/{name}/eligibility`: whether new tasks may go to the node. Enabling a
    /// node also ends its drain, if one is under way.
    pub async fn set_eligibility(&self, name: &str, eligible: bool) -> Result<Node, ManagerError> {
        let changed = self
            .cluster
            .update_node(name, |entry| {
                let changed = entry.eligible != eligible || (eligible && entry.drain.is_some());
                entry.eligible = eligible;
                if eligible {
                    entry.drain = None;
                }
                changed.then_some(if eligible {
                    "NodeEligible"
                } else {
                    "NodeIneligible"
                })
            })
            .await?;
        if changed {
            // What the change wakes: `Cluster::wake_for_node`.
            tracing::info!(node = name, eligible, "node eligibility changed");
        }
        self.node(name)
    }

    /// `POST /nodes/{name}/drain`: the node takes no new task, and its service and batch job
    /// copies move elsewhere (a new copy healthy first, then the old one stopped), or are
    /// stopped at `deadline` from now. Asking again for a node that drains changes its
    /// deadline.
    pub async fn drain_node(
        &self,
        name: &str,
        deadline: Option<Duration>,
    ) -> Result<Node, ManagerError> {
        let now = Utc::now();
        let deadline = match deadline {
            Some(after) => Some(
                now + chrono::Duration::from_std(after).map_err(|_| {
                    ManagerError::BadRequest(format!("Deadline: {after:?} is too long"))
                })?,
            ),
            None => None,
        };
        self.cluster
            .update_node(name, |entry| {
                let start_time = entry
                    .drain
                    .as_ref()
                    .and_then(|drain| drain.start_time)
                    .unwrap_or(now);
                entry.eligible = false;
                entry.drain = Some(Drain {
                    start_time: Some(start_time),
                    deadline,
                    remaining: 0,
                    staying: 0,
                });
                Some("NodeDrain")
            })
            .await?;
        tracing::info!(node = name, ?deadline, "draining a node");
        self.node(name)
    }

    /// `DELETE /nodes/{name}`: forgets a node that is `Down`. Refused while it is not, and
    /// while tasks are placed there that are not lost (`Scheduled` or `Running`): those would
    /// be left without a node that could stop them. Its `Lost` tasks fail ("node removed"),
    /// so that their restart policy can place them elsewhere and nothing is held for a node
    /// that is gone.
    pub async fn remove_node(&self, name: &str) -> Result<(), ManagerError> {
        let mut writes = crate::cluster::Writes::default();
        let (failed, wake) = {
            let mut state = lock(&self.cluster.state);
            let entry = state
                .nodes
                .get(name)
                .ok_or_else(|| ManagerError::NodeNotFound(name.to_string()))?;
            let status = entry.status(Instant::now(), self.cluster.heartbeat_grace());
            if status != NodeStatus::Down {
                return Err(ManagerError::Conflict(format!(
                    "node {name} is {status}: only a Down node is removed (stop its worker \
                     first; to move its tasks away, cube node drain {name})"
                )));
            }
            let placed: Vec<uuid::Uuid> = state
                .cache
                .load(name)
                .map(|load| load.tasks.iter().copied().collect())
                .unwrap_or_default();
            let holding: Vec<String> = placed
                .iter()
                .filter_map(|id| state.cache.get(id))
                .filter(|task| matches!(task.status.state, State::Scheduled | State::Running))
                .map(|task| format!("{} ({})", task.name, task.status.state))
                .collect();
            if !holding.is_empty() {
                return Err(ManagerError::Conflict(format!(
                    "node {name} still holds {} task{} that may run there: {}; stop them (or \
                     wait until they are Lost) before removing the node",
                    holding.len(),
                    if holding.len() == 1 { "" } else { "s" },
                    holding.join(", ")
                )));
            }
            let mut failed = Vec::new();
            for id in placed {
                let Some(task) = state.cache.get(&id) else {
                    continue;
                };
                let mut task = task.clone();
                let reason = format!("node {name} was removed");
                if task.end(State::Failed, Some(reason), Utc::now()).is_err() {
                    continue;
                }
                self.cluster.save(&mut state, &mut writes, task)?;
                failed.push(id);
            }
            state.nodes.remove(name);
            let wake = self
                .cluster
                .node_changed(&mut state, name, NodeChange::Removed);
            self.cluster.publish(
                crate::events::Topic::Node,
                "NodeRemoved",
                name,
                None,
                None,
                serde_json::json!({"Name": name}),
            );
            (failed, wake)
        };
        self.cluster.settle(writes).await?;
        self.followers.stop_following(name);
        let nodes = self.cluster.stores.nodes.clone();
        let key = name.to_string();
        tokio::task::spawn_blocking(move || nodes.delete(&key))
            .await
            .map_err(|err| ManagerError::Unavailable(format!("the removal stopped: {err}")))??;
        tracing::info!(node = name, "node removed");
        for id in failed {
            self.cluster.wakes.tasks.push(id);
        }
        self.cluster.wake_for_node(wake);
        Ok(())
    }
}
