//! The placement pass: every task that waits for a node, in one pass over one snapshot of
//! the nodes, on the controller framework's runner with one key (so that the pushes of many
//! freed slots or new tasks come down to one pass, never to reconciles racing for the lock).
//!
//! The waiting tasks go in order: higher job priority first (a bare task counts as the
//! default priority), then the older first. Each placement is added to the snapshot at once
//! (`NodeView::add_task`), so the next task sees the room that is left. A task that fits
//! nowhere keeps the reasons in its `PendingReason`, written only when they change. What was
//! placed goes to the task controller's runner to be sent to its node.

use std::cmp::Reverse;
use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use cube_controller::runner::{Action, ExponentialBackoff, ReadyGate};
use cube_scheduler::{Decision, FilterChain, NodeView, TaskRequest, summarize_rejections};
use cube_types::State;
use cube_types::job::DEFAULT_PRIORITY;
use uuid::Uuid;

use crate::manager::{Manager, ManagerError, NodePlacement, Placement, Shared, Writes, lock};

impl Manager {
    /// Runs placement passes until shutdown, whenever one is asked for
    /// ([`Manager::push_waiting`]).
    pub(crate) async fn run_placement(self: Arc<Self>) {
        let manager = self.clone();
        let pass = move |()| {
            let manager = manager.clone();
            async move { manager.place_waiting().await }
        };
        self.placement_runner
            .run(
                pass,
                ExponentialBackoff::default(),
                ReadyGate::open(),
                self.shutdown.clone(),
            )
            .await;
    }

    /// One placement pass: places what it can, waits for those writes, and hands the placed
    /// tasks to the task controller for dispatch.
    async fn place_waiting(&self) -> Result<Action, String> {
        let mut writes = Writes::default();
        let placed = self.placement_pass(&mut writes);
        self.settle(writes).await.map_err(|err| err.to_string())?;
        let placed = placed.map_err(|err| err.to_string())?;
        for id in placed {
            self.tasks_runner.push(id);
        }
        Ok(Action::Done)
    }

    /// Decides every waiting task's placement under one hold of the lock and queues the
    /// writes; returns the tasks placed.
    fn placement_pass(&self, writes: &mut Writes) -> Result<Vec<Uuid>, ManagerError> {
        let mut state = lock(&self.state);
        let mut waiting: Vec<_> = state
            .cache
            .waiting()
            .filter_map(|id| state.cache.get(&id))
            .filter(|task| task.state == State::Pending && task.desired_state == State::Running)
            .map(|task| {
                let priority = state
                    .jobs
                    .get(&task.job)
                    .map_or(DEFAULT_PRIORITY, |record| record.job.priority);
                (Reverse(priority), task.created_time, task.id)
            })
            .collect();
        if waiting.is_empty() {
            return Ok(Vec::new());
        }
        waiting.sort_unstable();
        let mut views = self.node_views(&state);
        let mut updates = Vec::new();
        let mut placed = Vec::new();
        for (_, _, id) in waiting {
            let Some(task) = state.cache.get(&id) else {
                continue;
            };
            let mut task = task.clone();
            let request = TaskRequest::for_task(&task);
            // A restarted task goes back to the node it ran on when that node is ready and
            // has room (its image is there, its data may be); otherwise the scheduler chooses.
            let previous = views
                .iter()
                .position(|view| view.name == task.node_name)
                .filter(|index| {
                    let one = std::slice::from_ref(&views[*index]);
                    !state
                        .scheduler
                        .select_candidate_nodes(&request, one)
                        .0
                        .is_empty()
                });
            let decision = match previous {
                Some(index) => Decision::Placed {
                    index,
                    name: views[index].name.clone(),
                },
                None => state.scheduler.place(&request, &views),
            };
            match decision {
                Decision::Placed { index, name } => {
                    if task.move_to(State::Scheduled).is_err() {
                        continue;
                    }
                    tracing::info!(task = %id, name = %task.name, node = %name, "task placed");
                    views[index].add_task(&request);
                    task.record(Utc::now(), "Placed", format!("on {name}"));
                    task.node_name = name;
                    task.pending_reason = None;
                    updates.push(task);
                    placed.push(id);
                }
                Decision::NoFit { reasons } => {
                    let reason = summarize_rejections(&request, &views, &reasons);
                    if task.pending_reason.as_deref() != Some(reason.as_str()) {
                        tracing::info!(task = %id, name = %task.name, %reason, "task waits for room");
                        task.pending_reason = Some(reason);
                        updates.push(task);
                    }
                }
            }
        }
        for task in updates {
            self.save(&mut state, writes, task)?;
        }
        Ok(placed)
    }

    /// The scheduler's snapshot of every node: what it offers, what is placed there.
    pub(crate) fn node_views(&self, state: &Shared) -> Vec<NodeView> {
        let now = Instant::now();
        state
            .nodes
            .entries()
            .map(|entry| {
                let load = state.cache.load(&entry.name);
                NodeView {
                    name: entry.name.clone(),
                    ready: entry.is_ready(now, self.config.heartbeat_grace),
                    capacity: entry.capacity,
                    allocated: load.map(|load| load.allocated).unwrap_or_default(),
                    task_count: load.map(|load| load.tasks.len()).unwrap_or(0),
                    host_ports_taken: load
                        .map(|load| load.host_ports.keys().copied().collect())
                        .unwrap_or_default(),
                    labels: entry.labels.clone(),
                }
            })
            .collect()
    }

    /// Where the task could go now, node by node: `GET /tasks/{id}/placement`, the long form
    /// of a waiting task's `PendingReason`.
    pub fn placement(&self, id: Uuid) -> Result<Placement, ManagerError> {
        let state = lock(&self.state);
        let task = state.cache.get(&id).ok_or(ManagerError::NotFound(id))?;
        let views = self.node_views(&state);
        let request = TaskRequest::for_task(task);
        let chain = FilterChain::standard();
        let nodes = views
            .iter()
            .map(|view| {
                let reason = chain.check(&request, view).err();
                NodePlacement {
                    name: view.name.clone(),
                    fits: reason.is_none(),
                    reason,
                }
            })
            .collect();
        let rejections = chain.rejections(&request, &views);
        Ok(Placement {
            id,
            state: task.state,
            node_name: task.node_name.clone(),
            summary: if rejections.len() == views.len() {
                Some(summarize_rejections(&request, &views, &rejections))
            } else {
                None
            },
            nodes,
        })
    }
}
