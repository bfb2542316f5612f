//! `cube stop ID...`: asks the manager to stop tasks.

use std::time::Duration;

use clap::Args;
use cube_types::duration::parse_duration;
use cube_types::{State, Task};

use super::resolve::{each_named, find_task};
use super::wait::{Goal, wait_for};
use super::{ManagerClient, ManagerFlags, OutputFormat};

/// Stop tasks: the manager stops each one's container and marks it Completed.
///
/// Each ID is a task's full ID, a prefix of it that no other task shares (like Docker's), or
/// the task's exact name when no other task has that name. When one could mean several tasks,
/// it is not stopped and the candidates are listed. A task that ended and waits out its
/// restart backoff is stopped too: its restart is cancelled. Stopping returns at once; the
/// worker stops the container in the background (see `cube status`), unless --wait. The
/// stopped container is kept, with its output, until the task is removed (`cube rm`, `cube
/// prune`, or the manager's --gc-after). Given several tasks, each is stopped even when
/// another could not be, and the command fails if any could not.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube stop 3f2a                                   # a unique ID prefix\n  \
    cube stop bb1d59ef-9fc1-4e4b-a44d-db571eeed203   # a full ID\n  \
    cube stop web db cache                           # several tasks\n  \
    cube stop --wait test-chapter-9.1                # a unique task name; wait until it ended")]
pub struct StopArgs {
    /// The tasks: each a full ID, a unique ID prefix, or a unique exact name.
    #[arg(value_name = "ID", required = true)]
    tasks: Vec<String>,
    /// Wait until each task has stopped (Completed or Failed; its container is kept, stopped,
    /// with its output, until the task is removed).
    #[arg(long)]
    wait: bool,
    /// How long --wait waits for each task (e.g. 30s, 2m).
    #[arg(long, default_value = "2m", value_parser = parse_duration, requires = "wait")]
    timeout: Duration,
    #[command(flatten)]
    flags: ManagerFlags,
}

/// What a stop request means for the task as it was found.
#[derive(Debug, PartialEq, Eq)]
enum StopKind {
    /// It runs or is on its way to run: its container is stopped.
    Running,
    /// Its run ended and the manager waits to restart it: the restart is cancelled.
    RestartPending,
    /// It ended for good; nothing is left to stop.
    Ended,
}

fn stop_kind(task: &Task) -> StopKind {
    if !task.status.state.is_terminal() {
        StopKind::Running
    } else if task.status.next_restart.is_some() && task.spec.desired_state == State::Running {
        StopKind::RestartPending
    } else {
        StopKind::Ended
    }
}

pub async fn stop(args: StopArgs) -> anyhow::Result<()> {
    let manager = ManagerClient::connect(&args.flags)?;
    each_named(&args.tasks, args.flags.output, "stopped", |name| {
        stop_one(&manager, name, &args)
    })
    .await
}

/// Stops one task and says so; answers with the task after the request for -o json (after
/// it stopped with --wait).
async fn stop_one(
    manager: &ManagerClient,
    name: &str,
    args: &StopArgs,
) -> anyhow::Result<Option<Task>> {
    let task = find_task(manager, name).await?;
    let path = format!("/tasks/{}", task.id);
    let kind = stop_kind(&task);
    // Sent for an ended task too: the manager may have restarted it since it was read, and
    // a stop of a task that ended for good changes nothing.
    manager.delete(&path).await?;
    if args.flags.output == OutputFormat::Table {
        let label = format!("{} ({})", task.name, task.short_id());
        match kind {
            StopKind::Running => println!("stopping {label}"),
            StopKind::RestartPending => {
                println!("stopped {label}: it was waiting to restart (restart cancelled)")
            }
            StopKind::Ended => println!("{label} has already ended: {}", task.status.state),
        }
    }
    let after: Task = if args.wait {
        wait_for(manager, task.id, Goal::Stopped, args.timeout)
            .await?
            .0
    } else if args.flags.output == OutputFormat::Json {
        // The task after the request, so that a script sees its new desired state.
        manager.get(&path).await?
    } else {
        return Ok(None);
    };
    if args.flags.output == OutputFormat::Table {
        println!("stopped {}: {}", after.short_id(), after.status.state);
        return Ok(None);
    }
    Ok(Some(after))
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
    fn a_failed_task_waiting_to_restart_is_not_taken_for_ended() {
        let mut waiting = task(State::Failed);
        waiting.status.next_restart = Some(chrono::Utc::now());
        assert_eq!(stop_kind(&waiting), StopKind::RestartPending);
    }

    #[test]
    fn a_task_that_ended_for_good_is_ended_and_a_pending_one_runs() {
        assert_eq!(stop_kind(&task(State::Failed)), StopKind::Ended);
        assert_eq!(stop_kind(&task(State::Completed)), StopKind::Ended);
        assert_eq!(stop_kind(&task(State::Pending)), StopKind::Running);
    }
}
