//! The health loop: each running, health-checked task probed when due (`health.rs` keeps
//! the schedule), and a pod container's first checks run by `docker exec` (`first_check.rs`).
//! A probe only observes: its outcome is handed to the reconcile with the task's ID, and the
//! reconcile counts it ([`count_probes`]) and, after enough failures in a row, stops the
//! container and fails the task, so that a probe's verdict and an exit Docker reports are
//! never recorded at once.
//!
//! The probes stay a loop of their own rather than delays on the reconcile's runner: a probe
//! waits on the network for up to its timeout, and on the runner it would hold its task's key
//! (an exit would wait for it) and one of the `max_concurrent_operations` slots that starts
//! and stops need.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cube_runtime::Runtime;
use cube_types::{Health, State, Task};
use futures_util::StreamExt;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::Worker;
use crate::first_check::{self, FirstCheck};
use crate::health;

/// What one probe of a run found.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ProbeOutcome {
    /// The container probed: an outcome about another run (the task ran anew meanwhile) is
    /// not counted.
    pub container_id: String,
    pub result: Result<(), String>,
}

/// The probes' outcomes not yet counted, by task. An entry lives from a probe to the
/// reconcile that follows it.
#[derive(Debug, Default)]
pub(crate) struct ProbeOutcomes {
    /// A `std` mutex: map access only, never held across an await.
    waiting: Mutex<HashMap<Uuid, Vec<ProbeOutcome>>>,
}

impl ProbeOutcomes {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Vec<ProbeOutcome>>> {
        self.waiting
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn add(&self, id: Uuid, outcome: ProbeOutcome) {
        self.lock().entry(id).or_default().push(outcome);
    }

    /// The task's outcomes, oldest first, forgotten here.
    pub(crate) fn take(&self, id: Uuid) -> Vec<ProbeOutcome> {
        self.lock().remove(&id).unwrap_or_default()
    }
}

/// Counts probe outcomes into the task's run, oldest first: a pass makes it healthy, a
/// failure counts towards `HealthCheckRetries`, and the one that reaches them makes it
/// unhealthy and gives the reason the task fails with (outcomes after it are not counted).
/// Outcomes of a run that ended or was replaced count for nothing. True in the first place
/// when the task changed.
pub(crate) fn count_probes(task: &mut Task, outcomes: Vec<ProbeOutcome>) -> (bool, Option<String>) {
    let before = task.status.run.clone();
    for ProbeOutcome {
        container_id,
        result,
    } in outcomes
    {
        if task.status.state != State::Running || task.status.run.container_id != container_id {
            continue; // the run that was probed has ended meanwhile
        }
        let reason = match result {
            Ok(()) => {
                if task.status.run.health_failures != 0 {
                    task.status.run.error = None;
                }
                task.status.run.health = Some(Health::Healthy);
                task.status.run.health_failures = 0;
                continue;
            }
            Err(reason) => reason,
        };
        task.status.run.health_failures += 1;
        let retries = task.health_retries();
        if task.status.run.health_failures < retries {
            task.status.run.error = Some(format!(
                "health check failed ({} of {retries}): {reason}",
                task.status.run.health_failures
            ));
            continue;
        }
        task.status.run.health = Some(Health::Unhealthy);
        let reason = format!(
            "unhealthy: {} health checks failed in a row; the last: {reason}",
            task.status.run.health_failures
        );
        return (task.status.run != before, Some(reason));
    }
    (task.status.run != before, None)
}

impl<R: Runtime> Worker<R> {
    /// Probes the health-checked running tasks when due, until `shutdown`.
    pub async fn run_health_checks(self: Arc<Self>, shutdown: CancellationToken) {
        let mut probes = JoinSet::new();
        loop {
            let next = self.health.next_due();
            let wake = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = self.health.added() => {}
                _ = self.first_checks.added() => {
                    for check in self.first_checks.take() {
                        let worker = self.clone();
                        probes.spawn(async move { worker.first_check(check).await });
                    }
                }
                Some(_) = probes.join_next(), if !probes.is_empty() => {}
                _ = wake => {
                    for id in self.health.take_due(tokio::time::Instant::now()) {
                        let worker = self.clone();
                        probes.spawn(async move { worker.probe_once(id).await });
                    }
                }
            }
        }
        probes.abort_all();
    }

    /// Runs a pod container's first health checks until one passes or Docker's own first
    /// check is due (see `first_check.rs`); a pass has the pod monitor look again.
    async fn first_check(&self, check: FirstCheck) {
        let mut pause = first_check::FIRST_RETRY;
        loop {
            if tokio::time::Instant::now() >= check.until {
                return;
            }
            match self.runtime.inspect(&check.container_id).await {
                Ok(Some(info)) if info.running && info.health == Some(Health::Starting) => {}
                // Ended, gone, or Docker has a verdict of its own.
                _ => return,
            }
            if self.check_passes(&check).await {
                tracing::debug!(task = %check.task_id, container = %check.container_id, "first health check passed");
                self.first_checks.pass(&check.container_id);
                self.runner.push(check.task_id);
                return;
            }
            let left = check
                .until
                .saturating_duration_since(tokio::time::Instant::now());
            tokio::select! {
                _ = self.closing.cancelled() => return,
                _ = tokio::time::sleep(pause.min(left)) => {}
            }
            pause = (pause * 2).min(first_check::MAX_RETRY);
        }
    }

    /// Whether one run of the check's command exits with 0 within its timeout.
    async fn check_passes(&self, check: &FirstCheck) -> bool {
        let run = async {
            let session = self
                .runtime
                .exec(&check.container_id, &check.command, false, false)
                .await
                .ok()?;
            session.output.for_each(|_| async {}).await;
            self.exec_exit_code(&session.exec_id).await
        };
        let bound = check.timeout.min(
            check
                .until
                .saturating_duration_since(tokio::time::Instant::now()),
        );
        matches!(tokio::time::timeout(bound, run).await, Ok(Some(0)))
    }

    async fn probe_once(&self, id: Uuid) {
        let task = match self.tasks.get(&id.to_string()) {
            Ok(Some(task)) => task,
            Ok(None) => return,
            Err(err) => {
                tracing::warn!(task = %id, error = %err, "cannot read a task to probe it");
                self.health
                    .reschedule(id, tokio::time::Instant::now() + health::RETRY_AFTER_ERROR);
                return;
            }
        };
        // The container's process, whose network namespace the probe enters; asked now, as
        // the process of a container that was restarted outside Cube is another.
        let pid = match self.runtime.inspect(&task.status.run.container_id).await {
            Ok(info) => info.and_then(|info| info.pid),
            Err(err) => {
                tracing::warn!(task = %id, error = %err, "cannot inspect a container to probe it");
                self.health
                    .reschedule(id, tokio::time::Instant::now() + health::RETRY_AFTER_ERROR);
                return;
            }
        };
        let result = health::probe(&task, pid).await;
        self.metrics.probe(result.is_ok());
        self.health
            .reschedule(id, tokio::time::Instant::now() + task.health_interval());
        // Recorded by the reconcile, the one writer of what a run shows, in probe order.
        self.probe_outcomes.add(
            id,
            ProbeOutcome {
                container_id: task.status.run.container_id.clone(),
                result,
            },
        );
        self.runner.push(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_are_counted_in_order_and_the_one_reaching_the_retries_makes_the_task_unhealthy() {
        let mut task = Task::new("web", "img");
        task.status.state = State::Running;
        task.status.run.container_id = "c1".to_string();
        let failed = |container: &str| ProbeOutcome {
            container_id: container.to_string(),
            result: Err("connection refused".to_string()),
        };
        let passed = ProbeOutcome {
            container_id: "c1".to_string(),
            result: Ok(()),
        };
        let retries = task.health_retries();
        assert!(
            retries >= 2,
            "the test needs two failures below the retries"
        );

        let (changed, unhealthy) = count_probes(&mut task, vec![failed("c1")]);
        assert!(changed && unhealthy.is_none());
        assert_eq!(task.status.run.health_failures, 1);
        assert!(
            task.status
                .run
                .error
                .as_deref()
                .unwrap()
                .starts_with("health check failed (1 of")
        );

        let (changed, unhealthy) =
            count_probes(&mut task, vec![failed("an earlier run's"), passed]);
        assert!(changed && unhealthy.is_none());
        assert_eq!(task.status.run.health, Some(cube_types::Health::Healthy));
        assert_eq!(task.status.run.health_failures, 0);
        assert_eq!(task.status.run.error, None);

        let (changed, _) = count_probes(
            &mut task,
            vec![ProbeOutcome {
                container_id: "c1".to_string(),
                result: Ok(()),
            }],
        );
        assert!(!changed, "healthy again changes nothing");

        let outcomes = (0..retries + 1).map(|_| failed("c1")).collect();
        let (_, unhealthy) = count_probes(&mut task, outcomes);
        let reason = unhealthy.expect("unhealthy");
        assert!(
            reason.starts_with(&format!(
                "unhealthy: {retries} health checks failed in a row"
            )),
            "{reason}"
        );
        assert_eq!(task.status.run.health, Some(cube_types::Health::Unhealthy));
        assert_eq!(task.status.run.health_failures, retries);
    }
}
