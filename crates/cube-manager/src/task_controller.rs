//! The task controller: each task's desired state against its observed state, on the
//! controller framework's runner (one pending entry per task, never two reconciles of one
//! task at once, restart backoffs as the runner's delays, one error policy).
//!
//! A reconcile reads the task, asks the pure decision ([`crate::reconcile::reconcile`]) what
//! to do, and carries it out: restart a run that ended (back to `Pending`), give up at the
//! restart limit, send a `Scheduled` task to its node, stop it there. Placement is not
//! decided here: a `Pending` task is the placement pass's (`placement.rs`), which hands
//! what it placed back to this runner for dispatch.
//!
//! | reads | woken by | writes |
//! |---|---|---|
//! | the task cache, the node registry (a node's client) | a task's ID: placed (placement pass), lost (liveness), a report from its node (followers), a stop asked, the resync; its own restart backoffs and retries as delays | the task (restarted, given up, failed, completed unplaced, the worker's answer to a dispatch); calls to the task's worker: `POST /tasks`, `DELETE /tasks/{id}` |

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use cube_api::{ApiClient, ClientError};
use cube_controller::runner::{Action, ErrorPolicy, ExponentialBackoff, Failure, ReadyGate};
use cube_store::StoreError;
use cube_types::{RestartBy, State, Task, TaskEvent};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::cluster::{Cluster, Retrying, Writes, lock};
use crate::log_limit::LogLimit;
use crate::observation::merge_observation;
use crate::reconcile::{Action as Decision, reconcile};

/// The history event recorded when the restart limit stops further restarts.
pub const GAVE_UP: &str = "RestartLimit";

/// The task controller's error policy: the runner's exponential backoff (250 ms doubling up
/// to 10 s), with the last error and the next attempt kept for the API to show on the task
/// (`DispatchError`, `NextAttempt`) and a warning at most every 5 s.
struct ShowRetries {
    cluster: Arc<Cluster>,
    /// "reconcile did not converge", written at most once every 5 s.
    warnings: LogLimit,
    backoff: ExponentialBackoff,
}

impl ErrorPolicy<Uuid, String> for ShowRetries {
    fn on_failure(&self, id: &Uuid, failure: &Failure<String>, attempts: u32) -> Action {
        let delay = self.backoff.delay(attempts);
        let error = failure.to_string();
        let next_attempt =
            Utc::now() + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::zero());
        lock(&self.cluster.failures).insert(
            *id,
            Retrying {
                error: error.clone(),
                next_attempt,
            },
        );
        if let Some(left_out) = self.warnings.admit(Instant::now()) {
            tracing::warn!(task = %id, reason = %error, attempts, retry_in = ?delay, left_out, "reconcile did not converge (at most one such warning every 5 s; left_out counts the others)");
        } else {
            tracing::debug!(task = %id, reason = %error, attempts, retry_in = ?delay, "reconcile did not converge");
        }
        Action::RequeueAfter(delay)
    }
}

/// The task controller (see the module comment).
pub(crate) struct TaskController {
    cluster: Arc<Cluster>,
}

impl TaskController {
    pub(crate) fn new(cluster: Arc<Cluster>) -> TaskController {
        TaskController { cluster }
    }

    /// Runs the task controller until `shutdown`: every task pushed to the cluster's
    /// `wakes.tasks` is reconciled, up to `max_concurrent_reconciles` at once.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let cluster = self.cluster.clone();
        let policy = ShowRetries {
            cluster: cluster.clone(),
            warnings: LogLimit::new(Duration::from_secs(5)),
            backoff: ExponentialBackoff::default(),
        };
        let controller = Arc::new(self);
        let reconcile = move |id: Uuid| {
            let controller = controller.clone();
            async move {
                let started = Instant::now();
                let outcome = controller.reconcile(id).await;
                controller.cluster.metrics.reconciled("task", started);
                if outcome.is_ok() {
                    lock(&controller.cluster.failures).remove(&id);
                }
                outcome
            }
        };
        // The task cache holds every stored task before the manager exists: nothing to wait for.
        let ready = ReadyGate::open();
        cluster
            .wakes
            .tasks
            .run(reconcile, policy, ready, shutdown)
            .await;
    }

    /// One reconcile of one task: decide and act. An action that moves the task on to
    /// another controller (a restart to the placement pass) hands it over; one that waits
    /// (a restart's backoff) asks the runner for the delay.
    pub(crate) async fn reconcile(&self, id: Uuid) -> Result<Action, String> {
        let (task, client) = {
            let state = lock(&self.cluster.state);
            let Some(task) = state.cache.get(&id) else {
                return Ok(Action::Done);
            };
            let client = state
                .nodes
                .get(&task.status.node_name)
                .map(|node| node.client.clone());
            (task.clone(), client)
        };
        let failed = |err: StoreError| err.to_string();
        match reconcile(&task, Utc::now()) {
            Decision::Nothing => Ok(Action::Done),
            Decision::GiveUp => self
                .cluster
                .with_writes(|writes| self.give_up(id, writes))
                .await
                .map(|()| Action::Done)
                .map_err(failed),
            // The backoff is the runner's delay: one pending entry, no timer of its own.
            Decision::Restart { wait, at, .. } if !wait.is_zero() => self
                .cluster
                .with_writes(|writes| self.note_next_restart(id, at, writes))
                .await
                .map(|()| Action::RequeueAfter(wait))
                .map_err(failed),
            Decision::Restart { streak, .. } => {
                match self
                    .cluster
                    .with_writes(|writes| self.restart(id, streak, writes))
                    .await
                {
                    // Pending again: the placement pass takes it from here (the write asked
                    // for it, `Writes`; and for every waiting task if the run held room).
                    Ok(_) => Ok(Action::Done),
                    Err(err) => Err(failed(err)),
                }
            }
            // A job's request waits with one copy fewer, which may let it fit: its request
            // is read again.
            Decision::CompleteUnplaced => self
                .cluster
                .with_writes(|writes| self.complete_unplaced(id, writes))
                .await
                .map(|()| {
                    self.cluster.push_to_place([id]);
                    Action::Done
                })
                .map_err(failed),
            // Placement is one pass over every waiting task, not a decision per task.
            Decision::Place => {
                self.cluster.push_to_place([id]);
                Ok(Action::Done)
            }
            Decision::Dispatch => self.dispatch(task, client).await,
            Decision::Stop => self.stop_on_node(task, client).await,
        }
    }

    /// Begins a new run of a task that ended or was lost: back to `Pending` (the one explicit
    /// way back, `State::restart`), one more restart counted, the node it ran on kept as the
    /// first choice for the placement that follows at once.
    fn restart(&self, id: Uuid, streak: u32, writes: &mut Writes) -> Result<bool, StoreError> {
        let mut state = lock(&self.cluster.state);
        let Some(task) = state.cache.get(&id) else {
            return Ok(false);
        };
        // Decided again under the lock: the task may have changed since.
        if !matches!(reconcile(task, Utc::now()), Decision::Restart { wait, .. } if wait.is_zero())
        {
            return Ok(false);
        }
        let mut task = task.clone();
        let by = RestartBy::Policy {
            failure_streak: streak,
        };
        let Ok(message) = task.restart(by, Utc::now()) else {
            return Ok(false);
        };
        tracing::info!(task = %id, name = %task.name, %message, "restarting a task");
        self.cluster.save(&mut state, writes, task)?;
        Ok(true)
    }

    /// Records when a task that waits out its restart backoff will be restarted, so that the
    /// API shows a restart to come rather than a run that ended for good.
    fn note_next_restart(
        &self,
        id: Uuid,
        at: DateTime<Utc>,
        writes: &mut Writes,
    ) -> Result<(), StoreError> {
        let mut state = lock(&self.cluster.state);
        let Some(task) = state.cache.get(&id) else {
            return Ok(());
        };
        if task.status.next_restart == Some(at) || task.spec.desired_state != State::Running {
            return Ok(());
        }
        let mut task = task.clone();
        task.status.next_restart = Some(at);
        self.cluster.save(&mut state, writes, task)
    }

    /// The restart limit is reached: the task keeps its state and last error; the history
    /// says why nothing more happens (once).
    fn give_up(&self, id: Uuid, writes: &mut Writes) -> Result<(), StoreError> {
        let mut state = lock(&self.cluster.state);
        let Some(task) = state.cache.get(&id) else {
            return Ok(());
        };
        if task
            .status
            .history
            .last()
            .is_some_and(|entry| entry.event == GAVE_UP)
        {
            return Ok(());
        }
        let mut task = task.clone();
        task.status.next_restart = None;
        let message = format!(
            "restart limit reached ({} restarts); the task stays {}",
            task.status.restart_count, task.status.state
        );
        tracing::warn!(task = %id, name = %task.name, %message, "not restarting");
        task.record(Utc::now(), GAVE_UP, message);
        self.cluster.save(&mut state, writes, task)
    }

    fn complete_unplaced(&self, id: Uuid, writes: &mut Writes) -> Result<(), StoreError> {
        let mut state = lock(&self.cluster.state);
        let Some(task) = state.cache.get(&id) else {
            return Ok(());
        };
        if task.status.state != State::Pending || task.spec.desired_state != State::Completed {
            return Ok(());
        }
        let mut task = task.clone();
        // A request that waited past its `QueueTimeout` gave up: that is a failure, with the
        // expiry as its error, not a stop the user asked for.
        let ended = match state.expiry_of(&task) {
            Some(reason) => task.end(
                State::Failed,
                Some(format!("expired in the queue: {reason}")),
                Utc::now(),
            ),
            None => task.end(
                State::Completed,
                Some("stopped before it was placed".to_string()),
                Utc::now(),
            ),
        };
        if ended.is_err() {
            return Ok(());
        }
        self.cluster.save(&mut state, writes, task)
    }

    /// Sends a `Scheduled` task to its node, once per manager process unless the node is
    /// seen to have lost it.
    async fn dispatch(&self, task: Task, client: Option<ApiClient>) -> Result<Action, String> {
        if lock(&self.cluster.dispatched).contains(&task.id) {
            return Ok(Action::Done);
        }
        let Some(client) = client else {
            return Err(format!("node {:?} is not known", task.status.node_name));
        };
        let event = TaskEvent {
            id: Uuid::new_v4(),
            state: State::Running,
            timestamp: Some(Utc::now()),
            task: task.clone(),
        };
        match client.post::<_, Task>("/tasks", &event).await {
            // The worker answers with the run it has. One of an earlier run (its node was lost
            // and came back with that run still going) does not acknowledge this one: the
            // follower stops that stray, and the dispatch is tried again until the worker
            // takes the new run.
            Ok((_, observed)) if observed.status.restart_count < task.status.restart_count => {
                Err(format!(
                    "node {} still has run {} of this task, not run {}; waiting for it to end there",
                    task.status.node_name,
                    observed.status.restart_count + 1,
                    task.status.restart_count + 1
                ))
            }
            Ok((_, observed)) => {
                lock(&self.cluster.dispatched).insert(task.id);
                self.observe_one(&task.status.node_name, observed).await;
                Ok(Action::Done)
            }
            // The worker has the task and it already ended there: its report says how.
            Err(ClientError::Status { status, .. }) if status.as_u16() == 409 => Ok(Action::Done),
            // Another node answers at this node's address (421): nothing was sent to this
            // node, which may come back or be found `Down`; tried again, not failed.
            Err(err @ ClientError::Status { status, .. }) if status.as_u16() == 421 => {
                Err(err.to_string())
            }
            Err(ClientError::Status {
                status, message, ..
            }) if status.is_client_error() => {
                self.fail(
                    task.id,
                    format!(
                        "worker {} refused the task: {message}",
                        task.status.node_name
                    ),
                )
                .await;
                Ok(Action::Done)
            }
            Err(err) => Err(err.to_string()),
        }
    }

    /// Asks the task's node to stop it. The worker reports the end through the follower;
    /// a worker that never had the task means nothing runs: the task is `Completed` here.
    async fn stop_on_node(&self, task: Task, client: Option<ApiClient>) -> Result<Action, String> {
        let Some(client) = client else {
            return Err(format!("node {:?} is not known", task.status.node_name));
        };
        match client.delete(&format!("/tasks/{}", task.id)).await {
            Ok(()) => Ok(Action::Done),
            Err(ClientError::Status { status, .. }) if status.as_u16() == 404 => {
                let mut writes = Writes::default();
                let stopped = {
                    let mut state = lock(&self.cluster.state);
                    match state.cache.get(&task.id) {
                        Some(known) if !known.status.state.is_terminal() => {
                            let mut stopped = known.clone();
                            let reason = format!(
                                "stopped; node {} does not have it: nothing runs there",
                                task.status.node_name
                            );
                            match stopped.end(State::Completed, Some(reason), Utc::now()) {
                                Ok(()) => self
                                    .cluster
                                    .save(&mut state, &mut writes, stopped)
                                    .map(|()| true),
                                Err(_) => Ok(false),
                            }
                        }
                        _ => Ok(false),
                    }
                };
                match (stopped, self.cluster.settle(writes).await) {
                    (Err(err), _) | (_, Err(err)) => Err(err.to_string()),
                    // The room a stopped task held asked for a placement pass (`Writes`).
                    (Ok(_), Ok(())) => Ok(Action::Done),
                }
            }
            Err(err) => Err(err.to_string()),
        }
    }

    /// One task as a worker answered it (after a dispatch).
    async fn observe_one(&self, node: &str, observed: Task) {
        let mut writes = Writes::default();
        {
            let mut state = lock(&self.cluster.state);
            let Some(known) = state.cache.get(&observed.id) else {
                return;
            };
            if known.status.node_name != node {
                return;
            }
            if let Some(merged) = merge_observation(known, &observed, Utc::now())
                && let Err(err) = self.cluster.save(&mut state, &mut writes, merged)
            {
                tracing::error!(task = %observed.id, error = %err, "cannot store an observed state");
            }
        }
        let _ = self.cluster.settle(writes).await;
    }

    async fn fail(&self, id: Uuid, reason: String) {
        let mut writes = Writes::default();
        {
            let mut state = lock(&self.cluster.state);
            let Some(known) = state.cache.get(&id) else {
                return;
            };
            let mut failed = known.clone();
            if failed
                .end(State::Failed, Some(reason.clone()), Utc::now())
                .is_err()
            {
                return;
            }
            tracing::warn!(task = %id, %reason, "task failed");
            if let Err(err) = self.cluster.save(&mut state, &mut writes, failed) {
                tracing::error!(task = %id, error = %err, "cannot store a failure");
            }
        }
        // The room the task held asks for a placement pass (`Writes`).
        let _ = self.cluster.settle(writes).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::cluster::{ManagerStores, cluster_for_tests};
    use crate::manager::Manager;

    /// A manager with one node that answers every request with `status` (a worker that
    /// refuses, or that never had the task), and a task accepted there, placed on it.
    async fn placed_on_a_node_that_answers(
        status: u16,
    ) -> (Arc<Manager>, Uuid, tokio::task::JoinHandle<()>) {
        let status = axum::http::StatusCode::from_u16(status).unwrap();
        let worker = axum::Router::new().fallback(move || async move {
            (status, axum::Json(serde_json::json!({"Error": "not here"})))
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, worker).await;
        });
        let manager = crate::manager::manager_for_tests();
        crate::manager::join_test_node_at(&manager, "w1", 1 << 30, &format!("http://{address}"))
            .await;
        let id = crate::manager::placed_test_task(&manager).await;
        (manager, id, server)
    }

    fn client_of(manager: &Manager, node: &str) -> Option<ApiClient> {
        lock(&manager.cluster.state)
            .nodes
            .get(node)
            .map(|entry| entry.client.clone())
    }

    /// The task's last history entry: its event and message.
    fn last_entry(task: &Task) -> (String, String) {
        let entry = task.status.history.last().unwrap();
        (entry.event.to_string(), entry.message.clone())
    }

    #[tokio::test]
    async fn a_task_its_worker_refuses_fails_with_its_end_recorded() {
        let (manager, id, server) = placed_on_a_node_that_answers(403).await;
        let task = manager.task(id).unwrap().as_ref().clone();
        let action = TaskController::new(manager.cluster.clone())
            .dispatch(task, client_of(&manager, "w1"))
            .await
            .unwrap();
        assert!(matches!(action, Action::Done));
        let failed = manager.task(id).unwrap();
        assert_eq!(failed.status.state, State::Failed);
        assert!(failed.status.run.finish_time.is_some(), "{failed:?}");
        let error = failed.status.run.error.clone().unwrap_or_default();
        assert!(error.contains("worker w1 refused the task"), "{error}");
        assert_eq!(last_entry(&failed), ("Failed".to_string(), error));
        manager.shutdown.cancel();
        server.abort();
    }

    #[tokio::test]
    async fn a_stopped_task_its_worker_never_had_completes_with_its_end_recorded() {
        let (manager, id, server) = placed_on_a_node_that_answers(404).await;
        manager.stop_tasks(&[id], None).await.unwrap();
        let task = manager.task(id).unwrap().as_ref().clone();
        let action = TaskController::new(manager.cluster.clone())
            .stop_on_node(task, client_of(&manager, "w1"))
            .await
            .unwrap();
        assert!(matches!(action, Action::Done));
        let stopped = manager.task(id).unwrap();
        assert_eq!(stopped.status.state, State::Completed);
        assert!(stopped.status.run.finish_time.is_some(), "{stopped:?}");
        assert_eq!(stopped.status.run.error, None);
        let (event, message) = last_entry(&stopped);
        assert_eq!(event, "Completed");
        assert!(message.contains("node w1 does not have it"), "{message}");
        manager.shutdown.cancel();
        server.abort();
    }

    /// A cluster on memory stores with `task` stored in it, and its task controller: no
    /// `Manager` is built.
    async fn controller_with(task: Task) -> TaskController {
        let cluster = cluster_for_tests(ManagerStores::in_memory(), Duration::from_secs(60));
        cluster.store_for_tests(task).await;
        TaskController::new(cluster)
    }

    /// The task as the store has it.
    fn stored(controller: &TaskController, id: Uuid) -> Task {
        controller
            .cluster
            .stores
            .tasks
            .get(&id.to_string())
            .expect("a store that reads")
            .expect("the task is stored")
    }

    #[tokio::test]
    async fn a_task_stopped_before_it_was_placed_completes_with_its_end_recorded() {
        // No node: the task waits, and the user stops it.
        let mut task = Task::new("t", "cube-sample:latest");
        task.spec.desired_state = State::Completed;
        let id = task.id;
        let controller = controller_with(task).await;
        let action = controller.reconcile(id).await.expect("a reconcile");
        assert!(matches!(action, Action::Done));
        let stopped = stored(&controller, id);
        assert_eq!(stopped.status.state, State::Completed);
        assert!(stopped.status.run.finish_time.is_some(), "{stopped:?}");
        assert_eq!(stopped.status.pending_reason, None);
        assert_eq!(
            last_entry(&stopped),
            (
                "Completed".to_string(),
                "stopped before it was placed".to_string()
            )
        );
        assert!(
            controller.cluster.wakes.placement.deadline(&()).is_some(),
            "the placement pass reads the task's request again"
        );
    }

    #[tokio::test]
    async fn a_run_that_failed_under_an_always_policy_runs_again_as_a_new_run() {
        let mut task: Task = serde_json::from_value(serde_json::json!({
            "Name": "t", "Image": "cube-sample:latest", "RestartPolicy": "always"
        }))
        .expect("a task");
        task.status.node_name = "w1".into();
        task.status.state = State::Running;
        // It ended an hour ago: its backoff is over.
        let ended = Utc::now() - chrono::Duration::hours(1);
        task.end(State::Failed, Some("exit 1".to_string()), ended)
            .expect("a run that ends");
        let id = task.id;
        let controller = controller_with(task).await;
        controller.reconcile(id).await.expect("a reconcile");
        let restarted = stored(&controller, id);
        assert_eq!(restarted.status.state, State::Pending);
        assert_eq!(restarted.status.restart_count, 1);
        assert!(
            controller.cluster.wakes.placement.deadline(&()).is_some(),
            "the placement pass takes the new run"
        );
    }
}
