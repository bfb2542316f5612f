//! What a worker's report of a task means to the manager, as pure functions of the task the
//! manager holds and the one the worker observed: whether the run is a stray to stop there
//! (`followers.rs`), and the task with the observation merged in (the followers, and the task
//! controller with a worker's answer to a dispatch).

use chrono::{DateTime, Utc};
use cube_types::{Health, State, Task};

/// Whether a run a worker reports is one the manager does not want there: it still runs,
/// but the manager never placed it (it has no such task: someone sent it to the worker
/// behind the manager's back, or it was removed here while the node was away), or the task
/// was placed elsewhere, restarted since (a higher count), or ended.
pub(crate) fn is_stray(known: Option<&Task>, observed: &Task, node: &str) -> bool {
    matches!(observed.status.state, State::Scheduled | State::Running)
        && known.is_none_or(|known| {
            known.status.node_name != node
                || observed.status.restart_count < known.status.restart_count
                || known.status.state.is_terminal()
                || known.status.state == State::Pending
        })
}

/// The manager's task with what a worker observed, or `None` when nothing changed, the
/// report is of an earlier run (a lower restart count), or the change is not allowed by the
/// transition table (an old report arriving late). What changed goes into the history.
pub(crate) fn merge_observation(known: &Task, observed: &Task, now: DateTime<Utc>) -> Option<Task> {
    if observed.status.restart_count < known.status.restart_count {
        return None;
    }
    if known.status.state == observed.status.state && known.status.run == observed.status.run {
        return None;
    }
    let mut merged = known.clone();
    if let Err(transition) = merged.move_to(observed.status.state) {
        tracing::debug!(task = %known.id, %transition, "observation ignored");
        return None;
    }
    merged.status.run = observed.status.run.clone();
    if known.status.state != observed.status.state {
        let message = match (observed.status.state, &observed.status.run.error) {
            (State::Failed, Some(error)) => error.clone(),
            (State::Running, _) => format!("on {}", observed.status.node_name),
            (_, _) => observed
                .status
                .run
                .exit_code
                .map(|code| format!("exit code {code}"))
                .unwrap_or_default(),
        };
        merged.record(now, observed.status.state.to_string(), message);
    } else if observed.status.run.health_failures > known.status.run.health_failures {
        let message = observed.status.run.error.clone().unwrap_or_default();
        merged.record(now, "Health", message);
    }
    if known.status.run.health != observed.status.run.health
        && observed.status.run.health == Some(Health::Healthy)
    {
        merged.record(now, "Health", "healthy");
    }
    // Since when the run is healthy, as this manager saw it: a deployment's MinHealthyTime
    // is measured on the manager's clock.
    merged.note_health(now);
    Some(merged)
}
