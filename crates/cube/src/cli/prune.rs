//! `cube rm TASK...` and `cube prune`: ended tasks removed now, with their containers (and so
//! their logs), instead of after the manager's `--gc-after`.

use std::time::Duration;

use clap::Args;
use cube_types::duration::parse_duration;
use cube_types::{State, Task};
use serde::Deserialize;

use super::output::print_json;
use super::resolve::{each_named, find_task};
use super::wait::{Goal, wait_for};
use super::{ManagerClient, ManagerFlags, OutputFormat};

/// Remove ended tasks now, with their containers and their logs.
///
/// Only a task that ended for good is removed (Completed, or Failed with no restart to come);
/// one that runs is refused, unless -f, which stops it first and waits until it stopped. The
/// manager removes ended tasks by itself `--gc-after` (1h) after they ended. The ended copies
/// of a batch job that was not stopped stay: they are its record of the work done. Given
/// several tasks, each is removed even when another could not be, and the command fails if
/// any could not.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube rm 3f2a                  # by ID prefix\n  \
    cube rm web db                # several tasks\n  \
    cube rm -f web                # stop it first if it runs")]
pub struct RmArgs {
    /// The tasks: each a full ID, a unique ID prefix, or a name.
    #[arg(value_name = "TASK", required = true)]
    tasks: Vec<String>,
    /// Stop a task that has not ended first (and wait until it stopped, at most --timeout).
    #[arg(short, long)]
    force: bool,
    /// How long -f waits for each task to stop (e.g. 30s, 2m).
    #[arg(long, default_value = "2m", value_parser = parse_duration, requires = "force")]
    timeout: Duration,
    #[command(flatten)]
    flags: ManagerFlags,
}

pub async fn rm(args: RmArgs) -> anyhow::Result<()> {
    let manager = ManagerClient::connect(&args.flags)?;
    each_named(&args.tasks, args.flags.output, "removed", |name| async {
        let task = rm_one(&manager, name, &args).await?;
        Ok(Some(serde_json::json!({"ID": task.id, "Name": task.name})))
    })
    .await
}

/// Removes one task (stopping it first with -f) and says so.
async fn rm_one(manager: &ManagerClient, name: &str, args: &RmArgs) -> anyhow::Result<Task> {
    let task = find_task(manager, name).await?;
    // A task that ended and waits to restart is not ended for good either.
    let live = !task.status.state.is_terminal()
        || (task.status.next_restart.is_some() && task.spec.desired_state == State::Running);
    if args.force && live {
        manager.delete(&format!("/tasks/{}", task.id)).await?;
        if args.flags.output == OutputFormat::Table {
            println!("stopping {} ({})", task.name, task.short_id());
        }
        wait_for(manager, task.id, Goal::Stopped, args.timeout).await?;
    }
    manager
        .delete(&format!("/tasks/{}?purge=true", task.id))
        .await?;
    if args.flags.output == OutputFormat::Table {
        println!("removed {} ({})", task.name, task.short_id());
    }
    Ok(task)
}

/// Remove every ended task now, with its container and logs, and the stopped jobs left
/// without tasks.
///
/// What is removed is what the manager's garbage collector would remove `--gc-after` after
/// it ended: tasks that ended for good (not one that waits to restart, not a Lost one, not
/// the ended copies of a batch job still running), then stopped jobs with no task left.
///
/// A pod's named volumes (`cube-<task ID>-<name>` on its worker) are kept: they hold data.
/// Remove them with `docker volume rm` on the worker, or have the worker remove them when a
/// pod stops (`stop: {remove_containers: true, remove_volumes: true}` in `cube worker
/// --config`).
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube prune\n  \
    cube prune -o json | jq '.Tasks | length'")]
pub struct PruneArgs {
    #[command(flatten)]
    flags: ManagerFlags,
}

#[derive(Debug, Deserialize, serde::Serialize)]
struct Pruned {
    #[serde(rename = "Tasks")]
    tasks: Vec<PrunedTask>,
    #[serde(rename = "Jobs")]
    jobs: Vec<String>,
    #[serde(rename = "Errors")]
    errors: Vec<String>,
}

#[derive(Debug, Deserialize, serde::Serialize)]
struct PrunedTask {
    #[serde(rename = "ID")]
    id: uuid::Uuid,
    #[serde(rename = "Name")]
    name: String,
    #[serde(rename = "NodeName")]
    node_name: String,
}

pub async fn prune(args: PruneArgs) -> anyhow::Result<()> {
    let manager = ManagerClient::connect(&args.flags)?;
    let (_, pruned): (u16, Pruned) = manager.post("/tasks/prune", &serde_json::json!({})).await?;
    match args.flags.output {
        OutputFormat::Json => print_json(&pruned)?,
        OutputFormat::Table => {
            for task in &pruned.tasks {
                println!("removed task {} ({})", task.name, &task.id.to_string()[..8]);
            }
            for job in &pruned.jobs {
                println!("removed job {job}");
            }
            for error in &pruned.errors {
                eprintln!("not removed: {error}");
            }
            println!(
                "{} task{} and {} job{} removed",
                pruned.tasks.len(),
                if pruned.tasks.len() == 1 { "" } else { "s" },
                pruned.jobs.len(),
                if pruned.jobs.len() == 1 { "" } else { "s" }
            );
        }
    }
    anyhow::ensure!(
        pruned.errors.is_empty(),
        "{} task(s) could not be removed now; run cube prune again",
        pruned.errors.len()
    );
    Ok(())
}
