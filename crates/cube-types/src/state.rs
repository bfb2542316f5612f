//! Task states and the one table of allowed transitions.
//!
//! Every change of a task's state anywhere in Cube is checked here, by [`State::transition`]:
//! there is no other place that decides whether a task may move from one state to another.

use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Where a task is in its life. On the wire it is written as its name and read as its name
/// (any case) or as the book's integer (`0` Pending … `4` Failed; `5` Lost is Cube's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum State {
    /// Accepted, not yet placed on a node.
    Pending,
    /// Placed on a node; its container is being created or started.
    Scheduled,
    /// Its container runs.
    Running,
    /// Ended as asked: the container exited 0, or the task was stopped.
    Completed,
    /// Ended badly: the container exited non-zero or was killed, or could not be started.
    Failed,
    /// Its node stopped answering; nobody knows whether it still runs.
    Lost,
}

/// Every state, in the book's numeric order.
pub const ALL_STATES: [State; 6] = [
    State::Pending,
    State::Scheduled,
    State::Running,
    State::Completed,
    State::Failed,
    State::Lost,
];

/// A refused change of state, with both ends named so the message can say what was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a task cannot move from {from} to {to}")]
pub struct Transition {
    pub from: State,
    pub to: State,
}

impl State {
    /// The states a task in `self` may move to. Moving to the same state is allowed where it
    /// is listed, so that a repeated report of the same state is harmless.
    ///
    /// - `Scheduled → Completed` and `Pending → Completed`: stopped before it ever ran.
    /// - `Pending → Failed`: it gave up before it ever ran, having waited in the queue past
    ///   its `QueueTimeout` (an expiry is a failure, with the reason as the task's error).
    /// - `Lost → Running | Completed | Failed`: its node came back and told what happened.
    pub fn successors(self) -> &'static [State] {
        use State::*;
        match self {
            Pending => &[Scheduled, Completed, Failed],
            Scheduled => &[Scheduled, Running, Completed, Failed, Lost],
            Running => &[Running, Completed, Failed, Lost],
            Completed => &[],
            Failed => &[],
            Lost => &[Lost, Running, Completed, Failed],
        }
    }

    /// Checks the move from `self` to `next` against the table.
    pub fn transition(self, next: State) -> Result<State, Transition> {
        if self.successors().contains(&next) {
            Ok(next)
        } else {
            Err(Transition {
                from: self,
                to: next,
            })
        }
    }

    /// A terminal state ends a run. Only [`State::restart`], an explicit restart by the
    /// manager under the task's restart policy, begins another run under the same ID.
    pub fn is_terminal(self) -> bool {
        self.successors().is_empty()
    }

    /// The one way back from an ended run: a task that ended (`Completed`, `Failed`) or whose
    /// node was lost goes back to `Pending`, to be placed again. Kept out of the table on
    /// purpose, so that no report of a state can ever restart a task by itself.
    pub fn restart(self) -> Result<State, Transition> {
        match self {
            State::Completed | State::Failed | State::Lost => Ok(State::Pending),
            from => Err(Transition {
                from,
                to: State::Pending,
            }),
        }
    }

    /// The book's integer for this state.
    pub fn code(self) -> u8 {
        match self {
            State::Pending => 0,
            State::Scheduled => 1,
            State::Running => 2,
            State::Completed => 3,
            State::Failed => 4,
            State::Lost => 5,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            State::Pending => "Pending",
            State::Scheduled => "Scheduled",
            State::Running => "Running",
            State::Completed => "Completed",
            State::Failed => "Failed",
            State::Lost => "Lost",
        }
    }

    pub fn from_code(code: u64) -> Option<State> {
        ALL_STATES
            .into_iter()
            .find(|state| u64::from(state.code()) == code)
    }

    pub fn from_name(name: &str) -> Option<State> {
        ALL_STATES
            .into_iter()
            .find(|state| state.name().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for State {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for State {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<State, D::Error> {
        struct StateVisitor;
        const EXPECTED: &str =
            "a state: 0-5 or one of Pending, Scheduled, Running, Completed, Failed, Lost";

        impl Visitor<'_> for StateVisitor {
            type Value = State;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(EXPECTED)
            }
            fn visit_u64<E: de::Error>(self, code: u64) -> Result<State, E> {
                State::from_code(code)
                    .ok_or_else(|| E::custom(format!("unknown state {code}, expected {EXPECTED}")))
            }
            fn visit_i64<E: de::Error>(self, code: i64) -> Result<State, E> {
                match u64::try_from(code) {
                    Ok(code) => self.visit_u64(code),
                    Err(_) => Err(E::custom(format!(
                        "unknown state {code}, expected {EXPECTED}"
                    ))),
                }
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<State, E> {
                State::from_name(name).ok_or_else(|| {
                    E::custom(format!("unknown state {name:?}, expected {EXPECTED}"))
                })
            }
        }
        deserializer.deserialize_any(StateVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::State::*;
    use super::*;

    /// The whole table written out as pairs, so that a change to `successors` must change
    /// this list too: every one of the 36 pairs is checked below.
    const ALLOWED: &[(State, State)] = &[
        (Pending, Scheduled),
        (Pending, Completed),
        (Pending, Failed),
        (Scheduled, Scheduled),
        (Scheduled, Running),
        (Scheduled, Completed),
        (Scheduled, Failed),
        (Scheduled, Lost),
        (Running, Running),
        (Running, Completed),
        (Running, Failed),
        (Running, Lost),
        (Lost, Lost),
        (Lost, Running),
        (Lost, Completed),
        (Lost, Failed),
    ];

    #[test]
    fn every_pair_of_states_follows_the_table() {
        for from in ALL_STATES {
            for to in ALL_STATES {
                let expected = ALLOWED.contains(&(from, to));
                assert_eq!(
                    from.transition(to).is_ok(),
                    expected,
                    "{from} -> {to} should be {}",
                    if expected { "allowed" } else { "refused" }
                );
            }
        }
    }

    #[test]
    fn the_book_path_is_allowed_end_to_end() {
        let end = Pending
            .transition(Scheduled)
            .and_then(|s| s.transition(Running))
            .and_then(|s| s.transition(Completed));
        assert_eq!(end, Ok(Completed));
    }

    #[test]
    fn a_refused_move_names_both_states() {
        let err = Completed.transition(Running).unwrap_err();
        assert_eq!(
            err.to_string(),
            "a task cannot move from Completed to Running"
        );
    }

    #[test]
    fn only_an_ended_or_lost_run_can_be_restarted_and_it_goes_back_to_pending() {
        for state in ALL_STATES {
            let allowed = matches!(state, Completed | Failed | Lost);
            assert_eq!(state.restart().is_ok(), allowed, "{state}");
        }
        assert_eq!(Failed.restart(), Ok(Pending));
    }

    #[test]
    fn terminal_states_are_completed_and_failed() {
        let terminal: Vec<State> = ALL_STATES.into_iter().filter(|s| s.is_terminal()).collect();
        assert_eq!(terminal, vec![Completed, Failed]);
    }

    #[test]
    fn state_reads_the_book_integer_and_names_and_writes_names() {
        let read: Vec<State> =
            serde_json::from_str(r#"[0, 1, 2, 3, 4, 5, "running", "Failed"]"#).unwrap();
        assert_eq!(
            read,
            vec![
                Pending, Scheduled, Running, Completed, Failed, Lost, Running, Failed
            ]
        );
        assert_eq!(serde_json::to_string(&Running).unwrap(), r#""Running""#);
    }

    #[test]
    fn unknown_states_are_refused_with_the_choices() {
        for bad in ["9", "-1", r#""Sleeping""#, "1.5"] {
            let err = serde_json::from_str::<State>(bad).unwrap_err().to_string();
            assert!(err.contains("Pending, Scheduled"), "{bad}: {err}");
        }
    }
}
