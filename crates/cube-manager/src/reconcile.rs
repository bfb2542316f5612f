//! The task reconciler: what to do about one task, given what is wanted and what was seen.
//!
//! A pure function of the task (desired and observed state in one record); the manager's
//! controller carries the action out and may call it again at any time: every action is
//! idempotent, so a repeated or interrupted reconcile converges.

use cube_types::{State, Task};

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
}

pub fn reconcile(task: &Task) -> Action {
    match (task.desired_state, task.state) {
        (State::Completed, State::Pending) => Action::CompleteUnplaced,
        (State::Completed, State::Scheduled | State::Running | State::Lost) => Action::Stop,
        (State::Running, State::Pending) => Action::Place,
        (State::Running, State::Scheduled) => Action::Dispatch,
        _ => Action::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cube_types::state::ALL_STATES;

    #[test]
    fn every_pair_of_desired_and_observed_state_has_one_action() {
        for observed in ALL_STATES {
            let mut task = Task::new("t", "img");
            task.state = observed;
            task.desired_state = State::Running;
            let run = reconcile(&task);
            task.desired_state = State::Completed;
            let stop = reconcile(&task);
            let expected = match observed {
                State::Pending => (Action::Place, Action::CompleteUnplaced),
                State::Scheduled => (Action::Dispatch, Action::Stop),
                State::Running | State::Lost => (Action::Nothing, Action::Stop),
                State::Completed | State::Failed => (Action::Nothing, Action::Nothing),
            };
            assert_eq!((run, stop), expected, "observed {observed}");
        }
    }
}
