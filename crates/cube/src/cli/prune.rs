//! `cube rm TASK` and `cube prune`: ended tasks removed now, with their containers (and so
//! their logs), instead of after the manager's `--gc-after`.

use clap::Args;
use serde::Deserialize;

use super::output::print_json;
use super::resolve::find_task;
use super::{ManagerClient, ManagerFlags, OutputFormat};

/// Remove an ended task now, with its container and its logs.
///
/// Only a task that ended for good is removed (Completed, or Failed with no restart to come;
/// `cube stop` first for one that runs). The manager removes ended tasks by itself
/// `--gc-after` (1h) after they ended. The ended copies of a batch job that was not stopped
/// stay: they are its record of the work done.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube rm 3f2a                  # by ID prefix\n  \
    cube stop --wait web && cube rm web")]
pub struct RmArgs {
    /// The task: a full ID, a unique ID prefix, or a name.
    #[arg(value_name = "TASK")]
    task: String,
    #[command(flatten)]
    flags: ManagerFlags,
}

pub async fn rm(args: RmArgs) -> anyhow::Result<()> {
    let manager = ManagerClient::connect(&args.flags)?;
    let task = find_task(&manager, &args.task).await?;
    manager
        .delete(&format!("/tasks/{}?purge=true", task.id))
        .await?;
    match args.flags.output {
        OutputFormat::Json => print_json(&serde_json::json!({"ID": task.id, "Name": task.name}))?,
        OutputFormat::Table => println!("removed {} ({})", task.name, task.short_id()),
    }
    Ok(())
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
