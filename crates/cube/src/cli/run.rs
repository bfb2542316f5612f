//! `cube run -f FILE`: submits a task file to the manager.

use std::path::PathBuf;

use anyhow::{Context, anyhow};
use chrono::Utc;
use clap::Args;
use cube_types::{Submission, Task};

use super::output::print_json;
use super::{ManagerClient, ManagerFlags, OutputFormat};

/// Run a task: send a task file to the manager, which places it on a worker.
///
/// The file is JSON: a TaskEvent as in the book ({"ID", "State": 2, "Timestamp", "Task": {..}})
/// or a bare Task ({"Name", "Image", "Cpu", "Memory", "ExposedPorts", "PortBindings", ..}).
/// It is checked here first, so that a typo is named before anything is sent; then it is sent
/// as written. Cpu is in cores, Memory and Disk in bytes or with a unit ("512MiB").
///
/// Prints the task's full ID on stdout (with -o json: the task as the manager stored it), and
/// on stderr its state and how to follow it. Submitting a file again with the same task ID
/// does not start a second task.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube run -f examples/sample-task.json\n  \
    cube run -f web.json -m 10.0.0.5:5555\n  \
    ID=$(cube run -f web.json) && cube status \"$ID\"\n  \
    cube run -f web.json -o json | jq .State")]
pub struct RunArgs {
    /// The task file: a TaskEvent or a Task, as JSON.
    #[arg(short, long, value_name = "FILE")]
    file: PathBuf,
    #[command(flatten)]
    flags: ManagerFlags,
}

pub async fn run_task(args: RunArgs) -> anyhow::Result<()> {
    let path = args.file.display().to_string();
    // A blocking read is fine here: the command does nothing else while it waits.
    let body = std::fs::read(&args.file).with_context(|| format!("cannot read {path}"))?;
    // The manager checks the same way; checking first names the file and sends nothing bad.
    Submission::parse(&body, Utc::now()).map_err(|err| anyhow!("{path}: {err}"))?;
    // Sent as written: the file's own JSON value, not Cube's re-encoding of the task, so the
    // manager sees what the user wrote (IDs it generates for a file without one included).
    let document: serde_json::Value =
        serde_json::from_slice(&body).with_context(|| format!("{path}: invalid JSON"))?;

    let manager = ManagerClient::connect(&args.flags)?;
    let (status, task): (u16, Task) = manager.post("/tasks", &document).await?;

    match args.flags.output {
        OutputFormat::Json => print_json(&task)?,
        OutputFormat::Table => {
            println!("{}", task.id);
            let what = if status == 200 {
                "already exists"
            } else {
                "accepted"
            };
            let short = task.short_id();
            eprintln!(
                "task {} ({short}) {what}: {}; see it with: cube status {short}{}",
                task.name,
                task.state,
                args.flags.manager_hint()
            );
            if let Some(reason) = &task.pending_reason {
                eprintln!("waiting: {reason}");
            }
        }
    }
    Ok(())
}
