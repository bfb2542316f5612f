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
            async move {
                let started = Instant::now();
                let placed = manager.place_waiting().await;
                manager.metrics.reconciled("placement", started);
                placed
            }
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
    pub(crate) fn placement_pass(&self, writes: &mut Writes) -> Result<Vec<Uuid>, ManagerError> {
        let mut state = lock(&self.state);
        let mut waiting: Vec<_> = state
            .cache
            .waiting()
            .filter_map(|id| state.cache.get(&id))
            .filter(|task| {
                task.status.state == State::Pending && task.spec.desired_state == State::Running
            })
            .map(|task| {
                let priority = state
                    .jobs
                    .get(&task.spec.job)
                    .map_or(DEFAULT_PRIORITY, |record| record.job.priority);
                (Reverse(priority), task.status.created_time, task.id)
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
                .position(|view| view.name == task.status.node_name)
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
                    task.status.node_name = name;
                    task.status.pending_reason = None;
                    updates.push(task);
                    placed.push(id);
                    self.metrics.placements.inc();
                }
                Decision::NoFit { reasons } => {
                    self.metrics.placement_failed(&reasons);
                    let reason = summarize_rejections(&request, &views, &reasons);
                    if task.status.pending_reason.as_deref() != Some(reason.as_str()) {
                        tracing::info!(task = %id, name = %task.name, %reason, "task waits for room");
                        task.status.pending_reason = Some(reason);
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
                    ineligible: !entry.eligible,
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
            state: task.status.state,
            node_name: task.status.node_name.clone(),
            summary: if rejections.len() == views.len() {
                Some(summarize_rejections(&request, &views, &rejections))
            } else {
                None
            },
            nodes,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use cube_types::job::JobRecord;
    use cube_types::{State, Task};

    use crate::manager::{Manager, Writes, lock};

    const MIB: u64 = 1 << 20;

    fn manager() -> Arc<Manager> {
        crate::manager::manager_for_tests()
    }

    /// A node of 1 GiB of memory, at an address where nothing answers (nothing here is sent).
    async fn one_node(manager: &Arc<Manager>) {
        crate::manager::join_test_node(manager, "w1", 1024 * MIB).await;
    }

    async fn waiting(manager: &Arc<Manager>, name: &str, memory: u64, job: &str) -> Task {
        let mut task = Task::new(name, "cube-sample:latest");
        task.spec.memory = memory;
        task.spec.job = job.to_string();
        manager.accept_task(task, None).await.unwrap()
    }

    fn pass(manager: &Manager) -> Vec<uuid::Uuid> {
        let mut writes = Writes::default();
        let placed = manager.placement_pass(&mut writes).unwrap();
        drop(writes);
        placed
    }

    fn task(manager: &Manager, id: uuid::Uuid) -> Task {
        lock(&manager.state).cache.get(&id).unwrap().clone()
    }

    #[tokio::test]
    async fn one_pass_places_what_fits_counting_each_placement_it_made() {
        let manager = manager();
        let mut ids = Vec::new();
        for n in 0..5 {
            ids.push(waiting(&manager, &format!("t{n}"), 300 * MIB, "").await.id);
        }
        one_node(&manager).await;
        let placed = pass(&manager);
        assert_eq!(
            placed,
            ids[..3],
            "three of 300 MiB fit in 1 GiB, oldest first"
        );
        for id in &ids[3..] {
            let left = task(&manager, *id);
            assert_eq!(left.status.state, State::Pending);
            let reason = left.status.pending_reason.unwrap_or_default();
            assert!(reason.contains("memory"), "{reason}");
        }
        assert!(
            pass(&manager).is_empty(),
            "a second pass finds no more room"
        );
    }

    #[tokio::test]
    async fn a_higher_priority_job_goes_before_an_older_bare_task() {
        let manager = manager();
        let bare = waiting(&manager, "bare", 700 * MIB, "").await.id;
        let record: JobRecord = serde_json::from_value(serde_json::json!({
            "Job": {"Name": "urgent", "Type": "service", "Priority": 90,
                    "Groups": [{"Name": "g", "Count": 1, "Task": {"Image": "cube-sample:latest"}}]},
            "Version": 1
        }))
        .unwrap();
        lock(&manager.state)
            .jobs
            .insert("urgent".to_string(), Arc::new(record));
        let urgent = waiting(&manager, "urgent.g[0]", 700 * MIB, "urgent")
            .await
            .id;
        one_node(&manager).await;
        assert_eq!(pass(&manager), vec![urgent]);
        assert_eq!(task(&manager, bare).status.state, State::Pending);
    }
}
