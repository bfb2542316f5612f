//! `cube stop ID`: asks the manager to stop a task.

use clap::Args;
use cube_types::Task;

use super::output::print_json;
use super::resolve::find_task;
use super::{ManagerClient, ManagerFlags, OutputFormat};

/// Stop a task: the manager stops its container and marks it Completed.
///
/// ID is the task's full ID, a prefix of it that no other task shares (like Docker's), or the
/// task's exact name when no other task has that name. When it could mean several tasks,
/// nothing is stopped and the candidates are listed. Stopping returns at once; the worker
/// stops the container in the background (see `cube status`).
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube stop 3f2a                                   # a unique ID prefix\n  \
    cube stop bb1d59ef-9fc1-4e4b-a44d-db571eeed203   # a full ID\n  \
    cube stop test-chapter-9.1                       # a unique task name")]
pub struct StopArgs {
    /// The task: a full ID, a unique ID prefix, or a unique exact name.
    #[arg(value_name = "ID")]
    task: String,
    #[command(flatten)]
    flags: ManagerFlags,
}

pub async fn stop(args: StopArgs) -> anyhow::Result<()> {
    let manager = ManagerClient::connect(&args.flags)?;
    let task = find_task(&manager, &args.task).await?;
    let path = format!("/tasks/{}", task.id);
    manager.delete(&path).await?;
    match args.flags.output {
        OutputFormat::Json => {
            // The task after the request, so that a script sees its new desired state.
            let stopped: Task = manager.get(&path).await?;
            print_json(&stopped)?;
        }
        OutputFormat::Table => {
            if task.state.is_terminal() {
                println!(
                    "{} ({}) has already ended: {}",
                    task.name,
                    task.short_id(),
                    task.state
                );
            } else {
                println!("stopping {} ({})", task.name, task.short_id());
            }
        }
    }
    Ok(())
}
