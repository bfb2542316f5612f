//! The worker's one decision: what to do with a task, from its record (its state and the
//! state it is wanted in) and what the engine says of its containers. Pure: no store, no
//! engine, no clock; the reconcile (`reconcile.rs`) reads both sides, asks [`decide`] and
//! carries the answer out.

use cube_runtime::ContainerInfo;
use cube_types::{State, Task};

/// A pod's containers as the reconcile read them: each service's name, whether it is the
/// infra container, and what the engine says of it (`None`: gone).
pub(crate) type PodContainers = Vec<(String, bool, Option<ContainerInfo>)>;

/// What the engine says of a task's containers.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Seen {
    /// Not asked: the task's record decides alone ([`looks_at_containers`] is false).
    NotAsked,
    /// The engine did not answer; the next event or resync asks again.
    Unanswered,
    /// A single container's task: its container, when one is this task's on this node.
    Container(Option<ContainerInfo>),
    /// A pod's containers, as its record names them.
    Pod(PodContainers),
}

/// What the reconcile knows of a task beyond its record.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Observed {
    pub containers: Seen,
    /// The health checks of the running container failed enough times in a row: why, in
    /// the words the task's `Error` shows.
    pub unhealthy: Option<String>,
}

/// What to do with a task.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    /// Launch the run: create (or adopt) and start its containers, then record it.
    Start,
    /// Stop the run and record it `Completed`; of a run that already ended, make sure its
    /// containers are stopped.
    Stop,
    /// Record a single container as the engine shows it: running, or ended with its exit.
    Record(ContainerInfo),
    /// Record a pod by the monitor's verdict (`launch::assess`): running, or brought down.
    RecordPod(PodContainers),
    /// The run is over for a reason the engine cannot show: the task fails with it.
    Fail(String),
    /// Stop the unhealthy container; the task fails with the reason.
    FailUnhealthy(String),
    /// The record and the engine agree.
    Nothing,
}

/// Whether a stop is wanted and not done: the task is asked to be `Completed` and has not
/// ended.
fn stop_wanted(task: &Task) -> bool {
    task.spec.desired_state == State::Completed && !task.status.state.is_terminal()
}

/// Whether [`decide`] needs to know what the engine says of the task's containers: of a run
/// that runs (or whose node was lost) to record what became of it, of one that ended to see
/// that nothing of it still runs. A task to start or to stop needs nothing read first.
pub(crate) fn looks_at_containers(task: &Task) -> bool {
    let state = task.status.state;
    !stop_wanted(task) && (matches!(state, State::Running | State::Lost) || state.is_terminal())
}

/// Whether the periodic resync hands the task to the reconcile: one to start, to stop, or
/// whose run is to be compared with its containers. An ended task is left alone (its
/// containers that still run are stopped by the resync itself, from the engine's list).
pub(crate) fn due_at_resync(task: &Task) -> bool {
    stop_wanted(task)
        || matches!(
            task.status.state,
            State::Scheduled | State::Running | State::Lost
        )
}

/// What to do with `task`, given what the engine says of it.
pub(crate) fn decide(task: &Task, observed: Observed) -> Action {
    let state = task.status.state;
    // What the user asked for first: a stop wanted wins over whatever the run shows. A stop
    // asked of an earlier run does not apply to a new one: the desired state is the new
    // run's (`Running`), so nothing stops it.
    if stop_wanted(task) {
        return Action::Stop;
    }
    if state == State::Running
        && let Some(reason) = observed.unhealthy
    {
        return Action::FailUnhealthy(reason);
    }
    match state {
        State::Scheduled if task.spec.desired_state == State::Running => Action::Start,
        State::Running | State::Lost => match observed.containers {
            Seen::Container(Some(info)) => Action::Record(info),
            Seen::Container(None) => Action::Fail(format!(
                "container {} disappeared (removed outside Cube, or while the worker was down)",
                task.status.run.container_id
            )),
            Seen::Pod(containers) if containers.is_empty() => {
                Action::Fail("the pod's containers are not known on this node".to_string())
            }
            Seen::Pod(containers) => Action::RecordPod(containers),
            Seen::NotAsked | Seen::Unanswered => Action::Nothing,
        },
        // A task that has ended runs nothing: a container of it that runs (a start the worker
        // asked for just before it was killed goes on in the engine) is stopped.
        state if state.is_terminal() => {
            let runs = match &observed.containers {
                Seen::Container(info) => info.as_ref().is_some_and(|info| info.running),
                Seen::Pod(containers) => containers
                    .iter()
                    .any(|(_, _, info)| info.as_ref().is_some_and(|info| info.running)),
                Seen::NotAsked | Seen::Unanswered => false,
            };
            if runs { Action::Stop } else { Action::Nothing }
        }
        _ => Action::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(state: State, desired: State) -> Task {
        let mut task = Task::new("t", "img");
        task.spec.desired_state = desired;
        task.status.state = state;
        task.status.run.container_id = "c1".to_string();
        task
    }

    fn container(running: bool, exit_code: Option<i64>) -> ContainerInfo {
        ContainerInfo {
            id: "c1".to_string(),
            running,
            exit_code,
            ..ContainerInfo::default()
        }
    }

    fn seen(containers: Seen) -> Observed {
        Observed {
            containers,
            unhealthy: None,
        }
    }

    fn unhealthy(containers: Seen) -> Observed {
        Observed {
            containers,
            unhealthy: Some("unhealthy: 3 health checks failed in a row".to_string()),
        }
    }

    #[test]
    fn a_scheduled_task_wanted_running_starts() {
        let scheduled = task(State::Scheduled, State::Running);
        assert!(!looks_at_containers(&scheduled));
        assert!(due_at_resync(&scheduled));
        assert_eq!(decide(&scheduled, seen(Seen::NotAsked)), Action::Start);
    }

    #[test]
    fn a_task_wanted_completed_that_has_not_ended_stops_whatever_its_container_shows() {
        for state in [
            State::Pending,
            State::Scheduled,
            State::Running,
            State::Lost,
        ] {
            let stopping = task(state, State::Completed);
            assert!(!looks_at_containers(&stopping), "{state}");
            assert!(due_at_resync(&stopping), "{state}");
            for containers in [
                Seen::NotAsked,
                Seen::Container(Some(container(true, None))),
                Seen::Container(None),
            ] {
                assert_eq!(decide(&stopping, seen(containers)), Action::Stop, "{state}");
            }
            assert_eq!(
                decide(&stopping, unhealthy(Seen::NotAsked)),
                Action::Stop,
                "a stop asked for wins over a failed health check"
            );
        }
    }

    #[test]
    fn a_stop_asked_of_an_earlier_run_does_not_stop_the_new_run() {
        // The task was asked to stop, then sent anew: its new run wants Running again.
        let mut new_run = task(State::Scheduled, State::Running);
        new_run.status.restart_count = 1;
        assert_eq!(decide(&new_run, seen(Seen::NotAsked)), Action::Start);
        let running = task(State::Running, State::Running);
        assert_eq!(
            decide(&running, seen(Seen::Container(Some(container(true, None))))),
            Action::Record(container(true, None)),
            "recorded as it runs, not stopped"
        );
    }

    #[test]
    fn a_running_or_lost_task_records_what_its_container_shows() {
        for state in [State::Running, State::Lost] {
            let task = task(state, State::Running);
            assert!(looks_at_containers(&task));
            assert!(due_at_resync(&task));
            for info in [
                container(true, None),
                container(false, Some(0)),
                container(false, Some(137)),
            ] {
                assert_eq!(
                    decide(&task, seen(Seen::Container(Some(info.clone())))),
                    Action::Record(info),
                    "{state}"
                );
            }
        }
    }

    #[test]
    fn a_running_task_whose_container_is_gone_fails_naming_it() {
        let running = task(State::Running, State::Running);
        let Action::Fail(reason) = decide(&running, seen(Seen::Container(None))) else {
            panic!("expected a failure");
        };
        assert!(reason.contains("container c1 disappeared"), "{reason}");
    }

    #[test]
    fn an_unanswered_engine_changes_nothing() {
        let running = task(State::Running, State::Running);
        assert_eq!(decide(&running, seen(Seen::Unanswered)), Action::Nothing);
        assert_eq!(decide(&running, seen(Seen::NotAsked)), Action::Nothing);
    }

    #[test]
    fn a_running_pod_is_recorded_by_its_containers_and_one_with_none_known_fails() {
        let pod = task(State::Running, State::Running);
        let containers = vec![("web".to_string(), false, Some(container(true, None)))];
        assert_eq!(
            decide(&pod, seen(Seen::Pod(containers.clone()))),
            Action::RecordPod(containers)
        );
        assert_eq!(
            decide(&pod, seen(Seen::Pod(Vec::new()))),
            Action::Fail("the pod's containers are not known on this node".to_string())
        );
    }

    #[test]
    fn failed_health_checks_fail_a_running_task_only() {
        let running = task(State::Running, State::Running);
        assert!(matches!(
            decide(&running, unhealthy(Seen::Container(Some(container(true, None))))),
            Action::FailUnhealthy(reason) if reason.starts_with("unhealthy")
        ));
        let ended = task(State::Failed, State::Running);
        assert_eq!(
            decide(
                &ended,
                unhealthy(Seen::Container(Some(container(false, Some(1)))))
            ),
            Action::Nothing,
            "the probed run ended meanwhile"
        );
    }

    #[test]
    fn an_ended_task_is_left_alone_unless_a_container_of_it_still_runs() {
        for (state, desired) in [
            (State::Completed, State::Completed),
            (State::Completed, State::Running),
            (State::Failed, State::Running),
            (State::Failed, State::Completed),
        ] {
            let ended = task(state, desired);
            assert!(looks_at_containers(&ended));
            assert!(!due_at_resync(&ended), "{state}");
            assert_eq!(
                decide(
                    &ended,
                    seen(Seen::Container(Some(container(false, Some(0)))))
                ),
                Action::Nothing
            );
            assert_eq!(decide(&ended, seen(Seen::Container(None))), Action::Nothing);
            assert_eq!(
                decide(&ended, seen(Seen::Container(Some(container(true, None))))),
                Action::Stop,
                "{state}: an ended task runs nothing"
            );
            let pod = vec![
                ("infra".to_string(), true, Some(container(false, Some(0)))),
                ("web".to_string(), false, Some(container(true, None))),
            ];
            assert_eq!(decide(&ended, seen(Seen::Pod(pod))), Action::Stop);
        }
    }

    #[test]
    fn a_pending_task_wanted_running_waits() {
        let pending = task(State::Pending, State::Running);
        assert!(!looks_at_containers(&pending));
        assert!(!due_at_resync(&pending));
        assert_eq!(decide(&pending, seen(Seen::NotAsked)), Action::Nothing);
    }
}
