//! `cube exec TASK -- CMD ARGS...`: a command run in a task's container, through its worker;
//! its output printed as it comes, and its exit code the command's own.

use std::io::Write;

use anyhow::anyhow;
use clap::Args;
use cube_api::{LineStream, Method};

use super::logs::{Ended, print_output};
use super::resolve::find_task;
use super::{ClusterFlags, ManagerClient};

/// Run a command in a running task's container, like docker exec.
///
/// The command's stdout goes to stdout and its stderr to stderr, as they come; `cube exec`
/// exits with the command's exit code. TASK is a full ID, a unique ID prefix or a name, as
/// for `cube logs`. Without -i the command gets no input.
///
/// -i passes this terminal's input to the command, -t gives it a terminal (its stdout and
/// stderr are then one stream), as `docker exec -it` does: `cube exec -it web -- sh` is a
/// shell in the container, over one upgraded HTTP connection through the manager. With -t
/// and a terminal here, this terminal is raw while the command runs, and its size follows
/// this one's.
///
/// A pod's command runs in its first service's container, or in the one named with
/// --container (-c), as for `cube logs`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube exec web -- ls -l /www\n  \
    cube exec web.api[2] -- sh -c 'wget -qO- 127.0.0.1:7777/health'\n  \
    cube exec 3f2a -- cat /etc/hostname\n  \
    cube exec -it web -- sh                  # a shell in the container\n  \
    echo ls | cube exec -i web -- sh\n  \
    cube exec -c db shop -- ps               # in the pod `shop`'s service db")]
pub struct ExecArgs {
    /// The task: a full ID, a unique ID prefix, or a name.
    #[arg(value_name = "TASK")]
    task: String,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
    /// Pass this terminal's input to the command.
    #[arg(short, long)]
    interactive: bool,
    /// Give the command a terminal.
    #[arg(short, long)]
    tty: bool,
    /// Which of a pod's containers: a service's name in its compose file (default: the
    /// first service).
    #[arg(short, long, value_name = "NAME")]
    container: Option<String>,
    #[command(flatten)]
    target: ClusterFlags,
}

/// Runs the command; returns its exit code for `cube` to exit with.
pub async fn exec(args: ExecArgs) -> anyhow::Result<i32> {
    let manager = ManagerClient::connect_to(&args.target)?;
    let task = find_task(&manager, &args.task).await?;
    if args.interactive || args.tty {
        return super::attach::attach(
            &manager,
            task.id,
            &args.command,
            args.container.as_deref(),
            args.tty,
        )
        .await;
    }
    let mut body = serde_json::json!({"Cmd": args.command});
    if let Some(container) = &args.container {
        body["Container"] = serde_json::json!(container);
    }
    let response = manager
        .open_stream(
            Method::POST,
            &format!("/tasks/{}/exec", task.id),
            Some(&body),
        )
        .await
        .map_err(|err| manager.explain(err))?;
    let ended = print_output(LineStream::of(response)).await?;
    std::io::stdout().flush()?;
    match ended {
        Ended::Exit(Some(code)) => Ok(i32::try_from(code).unwrap_or(1)),
        Ended::Exit(None) => Err(anyhow!("the command ended, but its exit code is unknown")),
        Ended::Error(message) => Err(anyhow!("{message}")),
        Ended::Done | Ended::Task(_) => Err(anyhow!(
            "the command's output ended without its exit code (the worker stopped?)"
        )),
    }
}
