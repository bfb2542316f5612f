//! `cube restart ID...`: asks the manager to run ended tasks again.

use clap::Args;
use cube_types::Task;

use super::resolve::{each_named, find_task};
use super::{ManagerClient, ManagerFlags, OutputFormat};

/// Run tasks that ended again: each starts a new run, in a new container.
///
/// A task that ended (Completed, Failed, stopped with `cube stop`) or whose node was lost goes
/// back to Pending and is placed again, with its RestartCount one higher; its new run is a new
/// container (named `...-r<N>`), so `cube logs` shows the new run's output; the last run's
/// container is removed once the new run runs. The restart is stored before the
/// command returns; the task is then placed and started in the background (see `cube status`).
///
/// Unlike `docker restart`, a task that has not ended (Pending, Scheduled, Running) is not
/// stopped for you: it is refused, so that a restart never ends work that runs. Stop it first
/// (`cube stop --wait ID`), then restart it. A job's copy is refused too: the job owns its
/// copies (stop the job and run it again). Each ID is a task's full ID, a unique ID prefix, or
/// its exact name, as for `cube stop`; given several tasks, each is restarted even when another
/// could not be, and the command fails if any could not.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube restart 3f2a                     # a unique ID prefix\n  \
    cube restart backup report            # several tasks, by name\n  \
    cube stop --wait web && cube restart web   # a running task: stop it first")]
pub struct RestartArgs {
    /// The tasks: each a full ID, a unique ID prefix, or a unique exact name.
    #[arg(value_name = "ID", required = true)]
    tasks: Vec<String>,
    #[command(flatten)]
    flags: ManagerFlags,
}

pub async fn restart(args: RestartArgs) -> anyhow::Result<()> {
    let manager = ManagerClient::connect(&args.flags)?;
    each_named(&args.tasks, args.flags.output, "restarted", |name| async {
        restart_one(&manager, name, &args).await.map(Some)
    })
    .await
}

/// Restarts one task and says so; answers with the task as the manager restarted it.
async fn restart_one(
    manager: &ManagerClient,
    name: &str,
    args: &RestartArgs,
) -> anyhow::Result<Task> {
    let found = find_task(manager, name).await?;
    let (_, task): (u16, Task) = manager
        .post(
            &format!("/tasks/{}/restart", found.id),
            &serde_json::json!({}),
        )
        .await?;
    if args.flags.output == OutputFormat::Table {
        println!(
            "restarting {} ({}): run {}",
            task.name,
            task.short_id(),
            task.status.restart_count
        );
    }
    Ok(task)
}
