//! The task reconciler: what to do about one task, given what is wanted and what was seen.
//!
//! A pure function of the task (desired and observed state, restart policy and counters, in
//! one record) and the time; the manager's controller carries the action out and may call it
//! again at any time: every action is idempotent, so a repeated or interrupted reconcile
//! converges.

use std::time::Duration;

use chrono::{DateTime, Utc};
use cube_types::{RestartPolicy, State, Task};

/// What the controller should do next for a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing: observed state matches what is wanted, or only the worker can move it now.
    Nothing,
    /// Ask the scheduler for a node (the task is `Pending` and should run).
    Place,
    /// Send the task to its node (`Scheduled`: the worker may not have it yet; sending it
    /// again is harmless, the worker answers 200 for a task it has).
    Dispatch,
    /// Ask the task's node to stop it.
    Stop,
    /// Stopped before it was placed: nothing runs anywhere, mark it `Completed`.
    CompleteUnplaced,
    /// The run ended (or its node was lost) and the restart policy wants another: go back to
    /// `Pending` once `wait` is over (at `at`), with `streak` as the new failure streak.
    Restart {
        wait: Duration,
        streak: u32,
        at: DateTime<Utc>,
    },
    /// The policy would restart, but `MaxRestarts` is reached: the task stays as it is.
    GiveUp,
}

pub fn reconcile(task: &Task, now: DateTime<Utc>) -> Action {
    match (task.spec.desired_state, task.status.state) {
        (State::Completed, State::Pending) => Action::CompleteUnplaced,
        (State::Completed, State::Scheduled | State::Running | State::Lost) => Action::Stop,
        (State::Running, State::Pending) => Action::Place,
        (State::Running, State::Scheduled) => Action::Dispatch,
        (State::Running, State::Completed | State::Failed | State::Lost) => restart(task, now),
        _ => Action::Nothing,
    }
}

/// Whether the restart policy restarts a run that ended in `state`.
pub fn policy_restarts(policy: RestartPolicy, state: State) -> bool {
    match policy {
        RestartPolicy::No => false,
        // A lost node counts as a failure: nobody can say the task finished.
        RestartPolicy::OnFailure => matches!(state, State::Failed | State::Lost),
        RestartPolicy::Always | RestartPolicy::UnlessStopped => {
            matches!(state, State::Completed | State::Failed | State::Lost)
        }
    }
}

fn restart(task: &Task, now: DateTime<Utc>) -> Action {
    if !policy_restarts(task.spec.restart_policy, task.status.state) {
        return Action::Nothing;
    }
    if task
        .spec
        .max_restarts
        .is_some_and(|max| task.status.restart_count >= max)
    {
        return Action::GiveUp;
    }
    if task.status.state == State::Lost {
        // Its node is gone: replace it at once, elsewhere.
        return Action::Restart {
            wait: Duration::ZERO,
            streak: task.status.failure_streak,
            at: now,
        };
    }
    // A run that stayed up long enough starts the backoff again.
    let ran = match (task.status.run.start_time, task.status.run.finish_time) {
        (Some(start), Some(finish)) => (finish - start).to_std().unwrap_or_default(),
        _ => Duration::ZERO,
    };
    let streak = if ran >= task.backoff_reset_after() {
        1
    } else {
        task.status.failure_streak + 1
    };
    let mut next = task.clone();
    next.status.failure_streak = streak;
    let backoff = next.restart_backoff();
    let ended = task.status.run.finish_time.unwrap_or(now);
    let waited = (now - ended).to_std().unwrap_or_default();
    let wait = backoff.saturating_sub(waited);
    // The moment is derived from the end of the run, not from `now`, so that every
    // reconcile during one backoff names the same moment.
    let at = if wait.is_zero() {
        now
    } else {
        chrono::Duration::from_std(backoff)
            .ok()
            .and_then(|backoff| ended.checked_add_signed(backoff))
            .unwrap_or(DateTime::<Utc>::MAX_UTC)
    };
    Action::Restart { wait, streak, at }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cube_types::state::ALL_STATES;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-01-01T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    fn ended(state: State, policy: RestartPolicy, ran_secs: i64, ago_ms: i64) -> Task {
        let mut task = Task::new("t", "img");
        task.status.state = state;
        task.spec.restart_policy = policy;
        task.status.run.finish_time = Some(now() - chrono::Duration::milliseconds(ago_ms));
        task.status.run.start_time = task
            .status
            .run
            .finish_time
            .map(|end| end - chrono::Duration::seconds(ran_secs));
        task
    }

    #[test]
    fn every_pair_of_desired_and_observed_state_has_one_action_without_restarts() {
        for observed in ALL_STATES {
            let mut task = Task::new("t", "img");
            task.status.state = observed;
            task.spec.desired_state = State::Running;
            let run = reconcile(&task, now());
            task.spec.desired_state = State::Completed;
            let stop = reconcile(&task, now());
            let expected = match observed {
                State::Pending => (Action::Place, Action::CompleteUnplaced),
                State::Scheduled => (Action::Dispatch, Action::Stop),
                State::Running => (Action::Nothing, Action::Stop),
                State::Lost => (Action::Nothing, Action::Stop),
                State::Completed | State::Failed => (Action::Nothing, Action::Nothing),
            };
            assert_eq!((run, stop), expected, "observed {observed}");
        }
    }

    #[test]
    fn on_failure_restarts_a_failure_and_leaves_a_clean_exit_completed() {
        let failed = ended(State::Failed, RestartPolicy::OnFailure, 1, 0);
        assert!(matches!(reconcile(&failed, now()), Action::Restart { .. }));
        let done = ended(State::Completed, RestartPolicy::OnFailure, 1, 0);
        assert_eq!(reconcile(&done, now()), Action::Nothing);
        let always = ended(State::Completed, RestartPolicy::Always, 1, 0);
        assert!(matches!(reconcile(&always, now()), Action::Restart { .. }));
        let no = ended(State::Failed, RestartPolicy::No, 1, 0);
        assert_eq!(reconcile(&no, now()), Action::Nothing);
    }

    #[test]
    fn a_users_stop_is_final_under_every_policy() {
        for policy in [
            RestartPolicy::Always,
            RestartPolicy::UnlessStopped,
            RestartPolicy::OnFailure,
        ] {
            let mut task = ended(State::Completed, policy, 1, 0);
            task.spec.desired_state = State::Completed;
            assert_eq!(reconcile(&task, now()), Action::Nothing, "{policy:?}");
        }
    }

    #[test]
    fn the_wait_is_the_backoff_less_the_time_since_the_end() {
        let mut task = ended(State::Failed, RestartPolicy::OnFailure, 1, 300);
        task.spec.restart_delay = Some(Duration::from_secs(1));
        task.status.failure_streak = 1; // one quick failure before this one: this is the 2nd in a row
        assert_eq!(
            reconcile(&task, now()),
            Action::Restart {
                wait: Duration::from_millis(1700),
                streak: 2,
                at: now() + chrono::Duration::milliseconds(1700),
            }
        );
    }

    #[test]
    fn a_long_run_starts_the_backoff_over() {
        let mut task = ended(State::Failed, RestartPolicy::Always, 120, 0);
        task.spec.restart_delay = Some(Duration::from_millis(100));
        task.status.failure_streak = 7;
        assert_eq!(
            reconcile(&task, now()),
            Action::Restart {
                wait: Duration::from_millis(100),
                streak: 1,
                at: now() + chrono::Duration::milliseconds(100),
            }
        );
    }

    #[test]
    fn the_restart_limit_gives_up() {
        let mut task = ended(State::Failed, RestartPolicy::OnFailure, 1, 0);
        task.spec.max_restarts = Some(2);
        task.status.restart_count = 2;
        assert_eq!(reconcile(&task, now()), Action::GiveUp);
    }

    #[test]
    fn a_lost_task_is_replaced_at_once_unless_its_policy_is_no() {
        let mut task = ended(State::Lost, RestartPolicy::OnFailure, 1, 0);
        task.spec.restart_delay = Some(Duration::from_secs(30));
        assert!(matches!(
            reconcile(&task, now()),
            Action::Restart { wait, .. } if wait.is_zero()
        ));
        task.spec.restart_policy = RestartPolicy::No;
        assert_eq!(reconcile(&task, now()), Action::Nothing);
    }
}
