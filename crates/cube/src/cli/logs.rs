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
/// A pod's output is its containers' lines as they come, each after its service's name and
/// a `|` (as docker-compose logs shows them); --container NAME shows one container's alone,
/// as written.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube logs web                 # everything web wrote so far\n  \
    cube logs -f web              # ... and what it writes, until it ends\n  \
    cube logs --tail 20 3f2a      # the last 20 lines, by ID prefix\n  \
    cube logs --since 10m web.api[2]\n  \
    cube logs --no-stderr web 2>/dev/null | grep GET\n  \
    cube logs shop                 # every container of the pod `shop`, prefixed\n  \
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
    if args.container.is_none()
        && let Some(pod) = &task.spec.pod
        && pod.spec.services.len() > 1
    {
        let services: Vec<String> = pod
            .service_names()
            .into_iter()
            .map(str::to_string)
            .collect();
        let mut streams = Vec::with_capacity(services.len());
        for service in &services {
            let mut query = query.clone();
            query.push(format!("container={}", encode_query_value(service)));
            let path = format!("/tasks/{}/logs?{}", task.id, query.join("&"));
            let response = manager
                .open_stream::<()>(Method::GET, &path, None)
                .await
                .map_err(|err| manager.explain(err))?;
            streams.push((service.clone(), LineStream::of(response)));
        }
        return match print_prefixed(streams).await? {
            Ended::Error(message) => Err(anyhow!("{message}")),
            _ => Ok(()),
        };
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

/// Prints several containers' streams of output lines as they come, each line after its
/// container's name padded to the longest and ` | `, as docker-compose logs does: stdout's to
/// stdout, stderr's to stderr. Once every stream ended, says how the task ended (a followed
/// log): the end that names a finished run if one does, else each different one once.
pub async fn print_prefixed(streams: Vec<(String, LineStream)>) -> anyhow::Result<Ended> {
    let width = streams
        .iter()
        .map(|(name, _)| name.chars().count())
        .max()
        .unwrap_or(0);
    // One reader per stream, each sending its lines as they come; the channel closes once
    // every reader has ended.
    let (sender, mut lines) = tokio::sync::mpsc::channel(64);
    for (name, mut stream) in streams {
        let sender = sender.clone();
        tokio::spawn(async move {
            loop {
                let line = stream.next_line().await;
                let last = !matches!(line, Ok(Some(_)));
                if sender.send((name.clone(), line)).await.is_err() || last {
                    return;
                }
            }
        });
    }
    drop(sender);
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let mut ends: Vec<(Option<cube_types::State>, String)> = Vec::new();
    let mut broken = None;
    while let Some((name, line)) = lines.recv().await {
        let line = match line {
            Ok(Some(line)) => line,
            Ok(None) => continue,
            Err(err) => {
                broken.get_or_insert(format!("{name}: the stream broke: {err}"));
                continue;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        let output: OutputLine = serde_json::from_str(&line)
            .map_err(|err| anyhow!("cannot read a line of output ({err}): {line}"))?;
        let prefix = format!("{name:<width$} | ");
        match output.stream.as_str() {
            "stdout" | "stderr" => {
                let mut text = String::with_capacity(output.text.len() + prefix.len());
                for piece in output.text.split_inclusive('\n') {
                    text.push_str(&prefix);
                    text.push_str(piece);
                }
                if output.stream == "stdout" {
                    let mut out = stdout.lock();
                    out.write_all(text.as_bytes())?;
                    out.flush()?;
                } else {
                    let mut err = stderr.lock();
                    err.write_all(text.as_bytes())?;
                    err.flush()?;
                }
            }
            "end" => ends.push((output.state, output.text)),
            _ => {
                broken.get_or_insert(format!("{name}: {}", output.text));
            }
        }
    }
    if let Some(message) = broken {
        return Ok(Ended::Error(message));
    }
    let finished: Vec<&String> = ends
        .iter()
        .filter(|(state, _)| state.is_some_and(|state| state.is_terminal()))
        .map(|(_, text)| text)
        .collect();
    let mut said: Vec<&String> = if finished.is_empty() {
        ends.iter().map(|(_, text)| text).collect()
    } else {
        finished
    };
    said.sort();
    said.dedup();
    for text in &said {
        eprintln!("cube: {text}");
    }
    Ok(match said.last() {
        Some(text) => Ended::Task(text.to_string()),
        None => Ended::Done,
    })
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
