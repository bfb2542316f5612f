//! `--wait`: following a task until it runs (has stayed up for [`STAYS_UP`] and, when it is
//! in the waiting list, is claimed: running and healthy) or has stopped, with a spinner on a
//! terminal.
//!
//! Each look is a blocking query on the task (`GET /tasks/{id}?index=N&wait=…`), which the
//! manager answers the moment the task or its entry in the waiting list changes; nothing is
//! asked in between, but for the one look that makes sure a run stays up. While the task
//! waits for room, its place in the queue is shown (`GET /queue/task/{id}`); a task that
//! expired in the queue fails the wait with the reason.

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::anyhow;
use cube_api::ClientError;
use cube_types::{State, Task};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use uuid::Uuid;

use super::ManagerClient;
use super::queue::QueueEntryView;

/// The longest one blocking query waits (the manager's cap is 60 s); the wait asks again at
/// once.
const QUERY_WAIT: Duration = Duration::from_secs(30);

/// How long a task must be seen running, the same run all along, before a wait for it to run
/// is over. A container whose command fails at once is `Running` for a moment before it is
/// `Failed`: a wait that ended at the first sight of `Running` would pass it or fail it by the
/// luck of the poll's timing.
const STAYS_UP: Duration = Duration::from_secs(1);

/// What a wait is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Goal {
    /// The task's container runs.
    Running,
    /// The task has ended and will not be restarted.
    Stopped,
}

/// What one look at the task says about the goal.
#[derive(Debug, PartialEq)]
enum Progress {
    /// Reached; the message (if any) says something worth knowing on the way.
    Reached(Option<String>),
    /// Not yet; the words describe where the task is now.
    Waiting(String),
    /// Can no longer be reached: the task failed.
    Failed(String),
}

/// The task as the manager has it, once it (or its entry in the waiting list) changed after
/// event index `*index`, or after `wait`. `*index` moves to the answer's.
async fn next_look(
    manager: &ManagerClient,
    path: &str,
    index: &mut u64,
    wait: Duration,
) -> anyhow::Result<Task> {
    let (task, next): (Task, Option<u64>) = manager
        .get_blocking(path, *index, wait.max(Duration::from_millis(1)))
        .await
        .map_err(|err| manager.explain(err))?;
    match next {
        Some(next) => *index = next,
        // A manager without blocking queries answers at once: do not ask it in a tight loop.
        None => tokio::time::sleep(Duration::from_millis(150).min(wait)).await,
    }
    Ok(task)
}

/// The task's entry in the waiting list, if it has one (an older manager has none).
pub async fn queue_entry(manager: &ManagerClient, id: Uuid) -> Option<QueueEntryView> {
    match manager.try_get(&format!("/queue/task/{id}")).await {
        Ok(entry) => Some(entry),
        Err(ClientError::Status { .. }) => None,
        Err(_) => None,
    }
}

/// Waits until the task reaches `goal`, at most `timeout`; answers with the task as last seen
/// and, for a running task in the waiting list, its entry (claimed, with its addresses). The
/// error for a task that failed, expired in the queue or did not get there in time carries
/// why.
pub async fn wait_for(
    manager: &ManagerClient,
    id: Uuid,
    goal: Goal,
    timeout: Duration,
) -> anyhow::Result<(Task, Option<QueueEntryView>)> {
    let spinner = Spinner::start();
    let path = format!("/tasks/{id}");
    let deadline = tokio::time::Instant::now() + timeout;
    let mut index = 0;
    // When the run now seen running was first seen so, and which run it is.
    let mut up_since: Option<(tokio::time::Instant, u32, String)> = None;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let wait = match &up_since {
            // Look again once the run has been up long enough, even if nothing changes.
            Some((since, _, _)) => {
                (*since + STAYS_UP).saturating_duration_since(tokio::time::Instant::now())
            }
            None => QUERY_WAIT,
        }
        .min(left);
        let task = next_look(manager, &path, &mut index, wait).await?;
        let label = format!("{} ({})", task.name, task.short_id());
        match progress(&task, goal) {
            Progress::Reached(None)
                if goal == Goal::Running && task.status.state == State::Running =>
            {
                let now = tokio::time::Instant::now();
                let run = (task.status.restart_count, &task.status.run.container_id);
                let since = match &up_since {
                    Some((since, count, container)) if (*count, container) == run => *since,
                    _ => {
                        up_since = Some((now, run.0, run.1.clone()));
                        now
                    }
                };
                let entry = queue_entry(manager, id).await;
                let claimed = entry.as_ref().is_none_or(|entry| entry.state == "claimed");
                if (now.duration_since(since) >= STAYS_UP && claimed) || now >= deadline {
                    spinner.finish();
                    return Ok((task, entry));
                }
                let now = if claimed {
                    "running; making sure it stays up".to_string()
                } else {
                    "running; waiting for its health check to pass".to_string()
                };
                spinner.show(&format!("{label}: {now}"));
            }
            Progress::Reached(note) => {
                spinner.finish();
                if let Some(note) = note {
                    eprintln!("{label}: {note}");
                }
                return Ok((task, None));
            }
            Progress::Failed(why) => {
                spinner.finish();
                if let Some(entry) = queue_entry(manager, id).await
                    && entry.state == "expired"
                {
                    return Err(anyhow!("{label} expired in the queue: {}", entry.reason));
                }
                return Err(anyhow!("{label} {why}"));
            }
            Progress::Waiting(mut now) => {
                up_since = None;
                if task.status.state == State::Pending
                    && let Some(entry) = queue_entry(manager, id).await
                    && entry.state == "waiting"
                {
                    now = format!(
                        "queued at position {}: {}",
                        entry.position,
                        entry.waiting_for.as_deref().unwrap_or("waiting for room")
                    );
                }
                if tokio::time::Instant::now() >= deadline {
                    spinner.finish();
                    let goal = match goal {
                        Goal::Running => "running",
                        Goal::Stopped => "stopped",
                    };
                    return Err(anyhow!(
                        "{label} is not {goal} after {}: {now}",
                        cube_types::duration::format_duration(timeout)
                    ));
                }
                spinner.show(&format!("{label}: {now}"));
            }
        }
    }
}

/// Where the task stands against the goal. Pure, so that each case has a test.
fn progress(task: &Task, goal: Goal) -> Progress {
    let ended = task.status.state.is_terminal();
    let why = task
        .status
        .run
        .error
        .as_deref()
        .map(|error| format!(": {error}"))
        .unwrap_or_default();
    let exit = task
        .status
        .run
        .exit_code
        .map(|code| format!(" (exit code {code})"))
        .unwrap_or_default();
    match goal {
        Goal::Running => match task.status.state {
            State::Running => Progress::Reached(None),
            // Ran to its end before a look caught it running: what was asked happened.
            State::Completed if task.spec.desired_state == State::Running => {
                Progress::Reached(Some(format!("ran and completed{exit}")))
            }
            _ if ended && task.status.next_restart.is_some() => Progress::Waiting(format!(
                "{}{exit}{why}; restarting at {}",
                task.status.state,
                task.status
                    .next_restart
                    .map(|at| at.format("%H:%M:%S").to_string())
                    .unwrap_or_default()
            )),
            State::Failed => Progress::Failed(format!("failed{exit}{why}")),
            State::Completed => Progress::Failed("was stopped before it ran".to_string()),
            _ => Progress::Waiting(describe(task)),
        },
        Goal::Stopped => {
            if ended && task.status.next_restart.is_none() {
                Progress::Reached(None)
            } else {
                Progress::Waiting(describe(task))
            }
        }
    }
}

/// The task's state in a few words, with the reason it waits when there is one.
fn describe(task: &Task) -> String {
    match (&task.status.pending_reason, &task.status.dispatch_error) {
        (Some(reason), _) => format!("{}: {reason}", task.status.state),
        (None, Some(error)) => format!("{}: {error}", task.status.state),
        (None, None) => task.status.state.to_string(),
    }
}

/// A spinner on stderr while a person watches; nothing at all when stderr is not a terminal
/// (a script's log should hold the answer, not a hundred redraws).
pub(super) struct Spinner {
    bar: Option<ProgressBar>,
}

impl Spinner {
    pub(super) fn start() -> Spinner {
        if !std::io::stderr().is_terminal() {
            return Spinner { bar: None };
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
            bar.set_style(style);
        }
        bar.enable_steady_tick(Duration::from_millis(100));
        Spinner { bar: Some(bar) }
    }

    pub(super) fn show(&self, message: &str) {
        if let Some(bar) = &self.bar {
            bar.set_message(message.to_string());
        }
    }

    pub(super) fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(state: State) -> Task {
        let mut task = Task::new("web", "cube-sample:latest");
        task.status.state = state;
        task
    }

    #[test]
    fn a_running_task_has_reached_running() {
        assert_eq!(
            progress(&task(State::Running), Goal::Running),
            Progress::Reached(None)
        );
    }

    #[test]
    fn a_failed_task_fails_the_wait_with_its_exit_code_and_error() {
        let mut failed = task(State::Failed);
        failed.status.run.exit_code = Some(3);
        failed.status.run.error = Some("container exited with code 3".to_string());
        assert_eq!(
            progress(&failed, Goal::Running),
            Progress::Failed("failed (exit code 3): container exited with code 3".to_string())
        );
    }

    #[test]
    fn a_failed_task_waiting_to_restart_is_still_waited_for() {
        let mut failed = task(State::Failed);
        failed.status.next_restart = Some(chrono::Utc::now());
        assert!(matches!(
            progress(&failed, Goal::Running),
            Progress::Waiting(_)
        ));
        assert!(matches!(
            progress(&failed, Goal::Stopped),
            Progress::Waiting(_)
        ));
    }

    #[test]
    fn a_pending_task_is_described_with_the_reason_it_waits() {
        let mut pending = task(State::Pending);
        pending.status.pending_reason = Some("1 node: short of memory".to_string());
        assert_eq!(
            progress(&pending, Goal::Running),
            Progress::Waiting("Pending: 1 node: short of memory".to_string())
        );
    }

    #[test]
    fn an_ended_task_has_stopped_and_a_running_one_not() {
        assert_eq!(
            progress(&task(State::Completed), Goal::Stopped),
            Progress::Reached(None)
        );
        assert!(matches!(
            progress(&task(State::Running), Goal::Stopped),
            Progress::Waiting(_)
        ));
    }
}
