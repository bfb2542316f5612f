//! `cube logs TASK`: a task's output, from its container on its worker, through the manager;
//! `-f` follows it until the task ends, and says how it ended.

use std::io::Write;
use std::time::Duration;

use anyhow::anyhow;
use clap::Args;
use cube_api::{LineStream, Method};
use cube_types::output::OutputLine;
use cube_types::{State, Task};

use super::resolve::find_task;
use super::{ClusterFlags, ManagerClient};

/// Show a task's output (stdout and stderr), like docker logs.
///
/// TASK is a full ID, a unique ID prefix or a task's name (`web`, `web.api[2]` for a job's
/// copy); a name two tasks share means the one that runs (a task that ended and its re-run
/// share a name). The output is the container's, kept on the worker: an ended task's logs
/// stay readable until the task is removed (`--gc-after` on the manager, `cube rm`, `cube
/// prune`). A restart's new run starts with an empty log. The container's stdout goes to
/// stdout, its stderr to stderr.
///
/// -f follows new output until the task's run ends, then says how it ended (state, exit code,
/// reason) on stderr. A task that has not started yet (Pending, Scheduled) is waited for
/// first, as stderr says. A stream that breaks (the worker stopped) says so and exits non-zero.
/// A pod's output is one container's: name it with --container (a service of its compose
/// file); a pod of one service needs none.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube logs web                 # everything web wrote so far\n  \
    cube logs -f web              # ... and what it writes, until it ends\n  \
    cube logs --tail 20 3f2a      # the last 20 lines, by ID prefix\n  \
    cube logs --since 10m web.api[2]\n  \
    cube logs --no-stderr web 2>/dev/null | grep GET\n  \
    cube logs --container b shop   # one container of the pod `shop`")]
pub struct LogsArgs {
    /// The task: a full ID, a unique ID prefix, or a name.
    #[arg(value_name = "TASK")]
    task: String,
    /// Follow the output until the task's run ends.
    #[arg(short, long)]
    follow: bool,
    /// Only the last N lines of what was written so far.
    #[arg(long, value_name = "N")]
    tail: Option<u64>,
    /// Only what was written since: a duration (10m, 1h) or an RFC 3339 time.
    #[arg(long, value_name = "WHEN")]
    since: Option<String>,
    /// Leave out what the container wrote to stderr.
    #[arg(long)]
    no_stderr: bool,
    /// Which of a pod's containers: a service's name in its compose file.
    #[arg(short, long, value_name = "NAME")]
    container: Option<String>,
    #[command(flatten)]
    target: ClusterFlags,
}

pub async fn logs(args: LogsArgs) -> anyhow::Result<()> {
    let manager = ManagerClient::connect_to(&args.target)?;
    let task = find_task(&manager, &args.task).await?;
    if args.follow && not_started(&task) {
        eprintln!(
            "cube: task {} ({}) is {}: waiting for it to start",
            task.name,
            task.short_id(),
            task.status.state
        );
        await_start(&manager, task.id).await?;
    }
    let mut query = Vec::new();
    if args.follow {
        query.push("follow=true".to_string());
    }
    if let Some(tail) = args.tail {
        query.push(format!("tail={tail}"));
    }
    if let Some(since) = &args.since {
        query.push(format!("since={}", encode_query_value(since)));
    }
    if args.no_stderr {
        query.push("stderr=false".to_string());
    }
    if let Some(container) = &args.container {
        query.push(format!("container={}", encode_query_value(container)));
    }
    let mut path = format!("/tasks/{}/logs", task.id);
    if !query.is_empty() {
        path = format!("{path}?{}", query.join("&"));
    }
    let response = manager
        .open_stream::<()>(Method::GET, &path, None)
        .await
        .map_err(|err| manager.explain(err))?;
    let outcome = print_output(LineStream::of(response)).await?;
    match outcome {
        Ended::Error(message) => Err(anyhow!("{message}")),
        _ => Ok(()),
    }
}

/// Whether the task has no container yet, and may get one: it waits for a node, or its
/// worker has not started it.
fn not_started(task: &Task) -> bool {
    matches!(task.status.state, State::Pending | State::Scheduled)
}

/// How long one blocking query for the task's start waits before it is asked again.
const START_QUERY_WAIT: Duration = Duration::from_secs(30);

/// Returns once the task has started (or ended without starting), learnt from blocking
/// queries: `cube logs -f` on a task that waits follows it once it runs, as `docker logs -f`
/// does a container that was created and not started. Ctrl-C ends the wait.
async fn await_start(manager: &ManagerClient, id: uuid::Uuid) -> anyhow::Result<()> {
    let path = format!("/tasks/{id}");
    let mut index = 0;
    loop {
        let (task, next): (Task, Option<u64>) = manager
            .get_blocking(&path, index, START_QUERY_WAIT)
            .await
            .map_err(|err| manager.explain(err))?;
        if !not_started(&task) {
            return Ok(());
        }
        match next {
            Some(next) => index = next,
            // A manager without blocking queries answers at once: do not ask it in a tight
            // loop.
            None => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// How a stream of output lines ended.
#[derive(Debug, PartialEq)]
pub enum Ended {
    /// The answer ended (a log read to its end).
    Done,
    /// A followed task ended: how, in words.
    Task(String),
    /// A command ended with this exit code (`None`: it could not be read).
    Exit(Option<i64>),
    /// The stream broke, or the server said something went wrong.
    Error(String),
}

/// Prints a stream of output lines as they come: stdout's to stdout, stderr's to stderr, a
/// task's end on stderr; returns how it ended.
pub async fn print_output(mut lines: LineStream) -> anyhow::Result<Ended> {
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    loop {
        let line = match lines.next_line().await {
            Ok(Some(line)) => line,
            Ok(None) => return Ok(Ended::Done),
            Err(err) => return Ok(Ended::Error(format!("the stream broke: {}", err))),
        };
        if line.trim().is_empty() {
            continue;
        }
        let output: OutputLine = serde_json::from_str(&line)
            .map_err(|err| anyhow!("cannot read a line of output ({err}): {line}"))?;
        match output.stream.as_str() {
            "stdout" => {
                let mut out = stdout.lock();
                out.write_all(output.text.as_bytes())?;
                out.flush()?;
            }
            "stderr" => {
                let mut err = stderr.lock();
                err.write_all(output.text.as_bytes())?;
                err.flush()?;
            }
            "end" => {
                eprintln!("cube: {}", output.text);
                return Ok(Ended::Task(output.text));
            }
            "exit" => {
                if !output.text.is_empty() {
                    eprintln!("cube: {}", output.text);
                }
                return Ok(Ended::Exit(output.exit_code));
            }
            _ => return Ok(Ended::Error(output.text)),
        }
    }
}

/// A query value with the characters a URL query cannot hold as they are percent-encoded.
fn encode_query_value(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~:".contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_with_a_plus_survives_the_query() {
        assert_eq!(
            encode_query_value("2026-11-24T10:00:00+01:00"),
            "2026-11-24T10:00:00%2B01:00"
        );
        assert_eq!(encode_query_value("10m"), "10m");
    }
}
