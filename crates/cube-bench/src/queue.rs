//! `cube-bench queue`: the waiting list's hand-over — from freeing room (stopping the request
//! that holds it) to the head of the queue `claimed` — next to raw Docker given the same work
//! (stop the old container, then create + start the new one), in the same run.
//!
//! A real `cube manager` and one real `cube worker` (persistent stores) whose `--memory 64MiB`
//! holds exactly one task of the sample image declaring `Memory: 64MiB`: one claimed task fills
//! it and one more waits at position 1. Every task and raw container is the same: image
//! `cube-sample:latest` with its own command (busybox httpd on 7777), memory limit 64 MiB, port
//! 7777/tcp published on a port Docker picks, docker-init as PID 1, **no health check** on
//! either side (so the entry is `claimed` once its task runs). Alternating which goes first:
//!
//! - Cube: the clock starts as `DELETE /tasks/{claimed}` is sent and stops when the benchmark
//!   has read the head's `Claimed` event from `GET /events?topic=Queue&topic=Task`, a stream
//!   opened before the first run: the soonest a client can learn it (`GET /queue/task/{id}`
//!   answers no blocking query; `GET /queue?index=` wakes on the same events, then serialises
//!   the whole list). Untimed afterwards: the newly claimed task is the next run's claimed one,
//!   and a new task is submitted and waited for until it is `waiting` at position 1.
//! - raw Docker: the same work as Cube's hand-over, through bollard: stop the container that
//!   runs (docker-init forwards SIGTERM), then create + start the next one until start
//!   returns, which is when Docker reports it running. The new container is the next run's old
//!   one, as the head is Cube's. Cube's room is free once the old task has ended, and the
//!   worker reports it ended once its container is stopped; the stopped container is kept (for
//!   its logs, until the task is removed), so raw Docker's removal of the old one is untimed.
//!   Create + start alone is reported beside it: Docker's floor for the start.
//!
//! The stream's Task events say where Cube's time went: each event's `Time` (the manager's
//! clock when it made the change) from the moment the `DELETE` was sent — the stop recorded,
//! the old task's end reported by the worker, the head placed, the head reported running, its
//! entry claimed.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bollard::Docker;
use chrono::{DateTime, Utc};
use cube_runtime::sample_image::SAMPLE_IMAGE;
use cube_runtime::{ContainerSpec, DockerRuntime, Runtime};
use cube_types::Task;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::containers::{self, Listed};
use crate::{
    BenchCluster, ClusterOptions, RAW_NODE, RUN_BOUND, Summary, Through, get_json, load_average,
    submit,
};

/// What the worker offers and each task declares: the worker holds exactly one task.
const MEMORY: &str = "64MiB";
const MEMORY_BYTES: u64 = 64 << 20;

/// The published port, as `start-latency` has it on both sides.
const PORT: &str = "7777/tcp";

/// How long the worker's stop waits before it kills (`cube worker --stop-timeout`'s default);
/// raw Docker's stop is given the same.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// One run: each side's time, and Cube's steps.
struct RunTimes {
    cube_first: bool,
    cube_ms: f64,
    /// Raw Docker's stop of the old container, then create + start of the new one.
    raw_ms: f64,
    /// The create + start alone, inside `raw_ms`.
    raw_start_ms: f64,
    steps: Steps,
}

/// The steps of Cube's hand-over, in order, as the stream's events show them.
const STEPS: [&str; 5] = [
    "the stop is recorded (old task `StopRequested`)",
    "the worker reports the old task ended (`Completed`: its container stopped)",
    "the head is placed (`Placed`)",
    "the worker reports the head running (`Running`: created, started, inspected)",
    "the head's entry is written `claimed` (`Claimed`)",
];

/// Where Cube's time went in one run: each of [`STEPS`]' event `Time` from the moment the
/// `DELETE` was sent, in ms (NaN for an event the stream did not show).
type Steps = [f64; STEPS.len()];

pub(crate) async fn queue(
    runs: usize,
    cube: &Path,
    log_level: &str,
    keep_log: Option<&Path>,
) -> anyhow::Result<()> {
    anyhow::ensure!(runs > 0, "--runs must be at least 1");
    let docker = containers::connect().await?;
    let runtime = DockerRuntime::connect().await?;
    runtime.ensure_sample_image(SAMPLE_IMAGE).await?;
    // Raw Docker's containers get a label of this run's own, so that the last sweep removes
    // only them, never those of another benchmark running beside this one.
    let raw_node = format!(
        "{RAW_NODE}-queue-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let raw_label = format!("{}={raw_node}", cube_runtime::LABEL_NODE);
    let load_before = load_average();
    let options = ClusterOptions {
        worker_args: &["--memory", MEMORY],
        rust_log: log_level,
        ..ClusterOptions::default()
    };
    let cluster = BenchCluster::start_with(cube, Through::Manager, &options).await?;
    let label = cluster.container_label();

    let outcome = measure(&runtime, &docker, &cluster, runs, &raw_node).await;
    if let Some(keep) = keep_log {
        match std::fs::copy(cluster.log_path(), keep) {
            Ok(_) => eprintln!("the manager's and worker's log: {}", keep.display()),
            Err(err) => eprintln!("copying the log to {}: {err}", keep.display()),
        }
    }
    // Stops the manager and the worker; whatever container they still had is swept below.
    drop(cluster);
    for label in [&label, &raw_label] {
        containers::sweep(&docker, label).await;
    }
    let times = outcome?;
    print_tables(&times, &load_before, &load_average());
    Ok(())
}

/// The claimed task and the head of the queue, then every run.
async fn measure(
    runtime: &DockerRuntime,
    docker: &Docker,
    cluster: &BenchCluster,
    runs: usize,
    raw_node: &str,
) -> anyhow::Result<Vec<RunTimes>> {
    let mut watch = QueueWatch::open(&cluster.base).await?;
    let mut claimed = submit(&cluster.http, &cluster.base, &task_json("queue-0")).await?;
    watch
        .until(RUN_BOUND, |event| {
            Ok(event.is_entry_of(&claimed) && event.state() == Some("claimed"))
        })
        .await
        .context("the first task, on an empty worker")?;
    let mut head = queue_one(cluster, &mut watch, 1).await?;
    // Raw Docker's side holds a running container too: each run stops it before it starts the
    // next, as Cube's hand-over does.
    let mut raw_running = raw_start(runtime, raw_node, 0).await?.0;

    let mut times = Vec::with_capacity(runs);
    for run in 0..runs {
        // Alternate which side goes first, so neither always meets a Docker still busy with
        // what the other left behind.
        let cube_first = run % 2 == 0;
        let (mut cube, mut raw) = (None, None);
        for cube_turn in [cube_first, !cube_first] {
            if cube_turn {
                cube = Some(cube_once(cluster, docker, &mut watch, &claimed, &head).await?);
            } else {
                let (times, started) = raw_once(runtime, raw_node, &raw_running, run + 1).await?;
                raw_running = started;
                raw = Some(times);
            }
        }
        let (Some((cube_ms, steps)), Some((raw_ms, raw_start_ms))) = (cube, raw) else {
            bail!("run {}: a side was not measured", run + 1);
        };
        eprintln!(
            "run {} ({} first): Cube {cube_ms:.1} ms, raw Docker stop + create + start \
             {raw_ms:.1} ms (create + start {raw_start_ms:.1}), Cube / raw {:.2}; load average {}",
            run + 1,
            if cube_first { "Cube" } else { "raw Docker" },
            cube_ms / raw_ms,
            load_average()
        );
        times.push(RunTimes {
            cube_first,
            cube_ms,
            raw_ms,
            raw_start_ms,
            steps,
        });
        // The head now holds the room: it is the next run's claimed task, and a new request
        // waits behind it (untimed).
        claimed = std::mem::take(&mut head);
        head = queue_one(cluster, &mut watch, run + 2).await?;
    }
    // The last two requests are stopped through the API, as a user would (untimed); after a
    // failure the sweep of the worker's containers does it instead.
    for id in [&head, &claimed] {
        delete_task(cluster, id).await?;
    }
    runtime.stop(&raw_running, STOP_TIMEOUT).await?;
    runtime.remove(&raw_running).await?;
    containers::await_none_running(docker, &cluster.container_label()).await?;
    Ok(times)
}

/// `DELETE /tasks/{id}`, refused unless 2xx.
async fn delete_task(cluster: &BenchCluster, id: &str) -> anyhow::Result<()> {
    let url = format!("{}/tasks/{id}", cluster.base);
    let answer = cluster
        .http
        .delete(&url)
        .send()
        .await
        .with_context(|| format!("DELETE {url}"))?;
    anyhow::ensure!(
        answer.status().is_success(),
        "DELETE {url} answered {}",
        answer.status()
    );
    Ok(())
}

/// A task of the sample image declaring the memory the worker has.
fn task_json(name: &str) -> serde_json::Value {
    json!({"Name": name, "Image": SAMPLE_IMAGE, "Memory": MEMORY, "PortBindings": {PORT: ""}})
}

/// Submits one more task to the full worker; returns its ID once its entry is `waiting` at
/// position 1.
async fn queue_one(
    cluster: &BenchCluster,
    watch: &mut QueueWatch,
    number: usize,
) -> anyhow::Result<String> {
    let id = submit(
        &cluster.http,
        &cluster.base,
        &task_json(&format!("queue-{number}")),
    )
    .await?;
    watch
        .until(RUN_BOUND, |event| Ok(event.is_entry_of(&id)))
        .await
        .with_context(|| format!("task {id}'s entry in the queue"))?;
    let entry: serde_json::Value =
        get_json(&cluster.http, &format!("{}/queue/task/{id}", cluster.base)).await?;
    if entry["State"] != "waiting" || entry["Position"] != 1 {
        bail!("task {id} should wait at position 1 on a full worker; its entry: {entry}");
    }
    Ok(id)
}

/// Frees the room (`DELETE` of the claimed task) and waits for the head's `Claimed` event: the
/// time in ms, and the steps. Afterwards (untimed) waits until Docker lists only the head's
/// container of the worker running, so that the raw side never meets the old one stopping.
async fn cube_once(
    cluster: &BenchCluster,
    docker: &Docker,
    watch: &mut QueueWatch,
    claimed: &str,
    head: &str,
) -> anyhow::Result<(f64, Steps)> {
    // Events from the set-up are behind us: what comes now is this run's.
    watch.clear()?;
    let sent_at = Utc::now();
    let started = Instant::now();
    delete_task(cluster, claimed).await?;
    let (seen, before) = watch
        .until(RUN_BOUND, |event| {
            if event.topic == "Task" && event.key == head && event.kind == "Failed" {
                bail!(
                    "the head of the queue, task {head}, failed: {}",
                    event.object
                );
            }
            Ok(event.is_entry_of(head) && event.state() == Some("claimed"))
        })
        .await
        .with_context(|| format!("task {head} claimed after task {claimed} was stopped"))?;
    let cube_ms = (seen.read_at - started).as_secs_f64() * 1000.0;

    let since_sent = |time: Option<DateTime<Utc>>| {
        time.map_or(f64::NAN, |time| {
            (time - sent_at).num_microseconds().unwrap_or(i64::MAX) as f64 / 1000.0
        })
    };
    let task_event = |key: &str, kind: &str| {
        since_sent(
            before
                .iter()
                .map(|seen| &seen.event)
                .find(|event| event.topic == "Task" && event.key == key && event.kind == kind)
                .and_then(|event| event.time),
        )
    };
    let steps: Steps = [
        task_event(claimed, "StopRequested"),
        task_event(claimed, "Completed"),
        task_event(head, "Placed"),
        task_event(head, "Running"),
        since_sent(seen.event.time),
    ];

    let label = cluster.container_label();
    let deadline = Instant::now() + RUN_BOUND;
    while containers::with_label(docker, &label, Listed::Running)
        .await?
        .len()
        > 1
    {
        if Instant::now() > deadline {
            bail!("task {claimed}'s container still runs {RUN_BOUND:?} after its stop");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok((cube_ms, steps))
}

/// Raw Docker given Cube's hand-over's work: stop the running container `old` (SIGTERM
/// through docker-init, as the worker ends a task), then create + start the same container
/// anew until start returns. Returns the time of the whole and of the create + start alone, in
/// ms, and the new container's ID. The old container is removed afterwards, untimed (the
/// worker keeps a stopped task's container for its logs).
async fn raw_once(
    runtime: &DockerRuntime,
    node: &str,
    old: &str,
    run: usize,
) -> anyhow::Result<((f64, f64), String)> {
    let started = Instant::now();
    runtime.stop(old, STOP_TIMEOUT).await?;
    let (id, start_ms) = raw_start(runtime, node, run).await?;
    let elapsed = started.elapsed().as_secs_f64() * 1000.0;
    runtime.remove(old).await?;
    Ok(((elapsed, start_ms), id))
}

/// Bollard create + start of the task's container: its ID and the time until start returned,
/// in ms.
async fn raw_start(
    runtime: &DockerRuntime,
    node: &str,
    run: usize,
) -> anyhow::Result<(String, f64)> {
    let mut task = Task::new(format!("raw-{run}"), SAMPLE_IMAGE);
    task.spec.memory = MEMORY_BYTES;
    task.spec
        .port_bindings
        .insert(PORT.to_string(), String::new());
    task.normalize();
    let spec = ContainerSpec::for_task(&task, node);
    let started = Instant::now();
    let id = runtime.create(&spec).await?;
    runtime.start(&id).await?;
    Ok((id, started.elapsed().as_secs_f64() * 1000.0))
}

/// One event of the stream, as far as this benchmark reads it.
#[derive(Debug, serde::Deserialize)]
struct Event {
    #[serde(rename = "Topic")]
    topic: String,
    #[serde(rename = "Type")]
    kind: String,
    /// A task's ID; `task/ID` for a bare task's queue entry.
    #[serde(rename = "Key", default)]
    key: String,
    /// When the manager made the change.
    #[serde(rename = "Time", default)]
    time: Option<DateTime<Utc>>,
    #[serde(rename = "Object", default)]
    object: serde_json::Value,
}

impl Event {
    /// Whether this is a change of the queue entry of bare task `id`.
    fn is_entry_of(&self, id: &str) -> bool {
        self.topic == "Queue" && self.key.strip_prefix("task/") == Some(id)
    }

    /// The entry's state, for a queue event.
    fn state(&self) -> Option<&str> {
        self.object["State"].as_str()
    }
}

/// One line of the stream: an event, or `None` for a heartbeat (an empty line).
fn parse_line(line: &[u8]) -> anyhow::Result<Option<Event>> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let event: Event = serde_json::from_slice(line)
        .with_context(|| format!("an event line: {}", String::from_utf8_lossy(line)))?;
    if event.topic == "Stream" {
        // `Dropped` (fell behind) or `Closed` (shutdown): the stream ends here.
        bail!("the manager ended the event stream: {}", event.kind);
    }
    Ok(Some(event))
}

/// An event and when this process read it.
struct Seen {
    read_at: Instant,
    event: Event,
}

/// `GET /events?topic=Queue&topic=Task`, read on a task of its own so that the moment an event
/// is read is the moment it arrives, not when the benchmark next looks.
struct QueueWatch {
    events: mpsc::UnboundedReceiver<anyhow::Result<Seen>>,
    /// The reader; aborted when dropped.
    _reader: JoinSet<()>,
}

impl QueueWatch {
    /// Opens the stream; returns once the manager has answered (it is subscribed).
    async fn open(manager: &str) -> anyhow::Result<QueueWatch> {
        // No overall timeout: the stream lasts as long as the benchmark.
        let url = format!("{manager}/events?topic=Queue&topic=Task");
        let response = reqwest::Client::new()
            .get(&url)
            .send()
            .await
            .with_context(|| format!("GET {url}"))?;
        anyhow::ensure!(
            response.status().is_success(),
            "GET {url} answered {}",
            response.status()
        );
        let (sender, events) = mpsc::unbounded_channel();
        let mut reader = JoinSet::new();
        reader.spawn(async move {
            if let Err(err) = read_stream(response, &sender).await {
                // The receiver may be gone already; then nobody waits for this.
                let _ = sender.send(Err(err));
            }
        });
        Ok(QueueWatch {
            events,
            _reader: reader,
        })
    }

    /// Throws away what has been read so far.
    fn clear(&mut self) -> anyhow::Result<()> {
        while let Ok(seen) = self.events.try_recv() {
            seen?;
        }
        Ok(())
    }

    /// Waits for the first event `wanted` accepts (an error from it ends the wait); returns it
    /// and every event read before it.
    async fn until(
        &mut self,
        bound: Duration,
        mut wanted: impl FnMut(&Event) -> anyhow::Result<bool>,
    ) -> anyhow::Result<(Seen, Vec<Seen>)> {
        let deadline = tokio::time::Instant::now() + bound;
        let mut before = Vec::new();
        loop {
            let seen = tokio::time::timeout_at(deadline, self.events.recv())
                .await
                .map_err(|_| anyhow::anyhow!("the event did not come within {bound:?}"))?
                .context("the event stream's reader stopped")??;
            if wanted(&seen.event)? {
                return Ok((seen, before));
            }
            before.push(seen);
        }
    }
}

async fn read_stream(
    mut response: reqwest::Response,
    sender: &mpsc::UnboundedSender<anyhow::Result<Seen>>,
) -> anyhow::Result<()> {
    let mut buffer = Vec::new();
    loop {
        let Some(chunk) = response.chunk().await? else {
            bail!("the manager ended the event stream");
        };
        buffer.extend_from_slice(&chunk);
        let mut start = 0;
        while let Some(end) = buffer[start..].iter().position(|byte| *byte == b'\n') {
            let line = &buffer[start..start + end];
            start += end + 1;
            if let Some(event) = parse_line(line)? {
                let seen = Seen {
                    read_at: Instant::now(),
                    event,
                };
                if sender.send(Ok(seen)).is_err() {
                    return Ok(()); // nobody listens any more
                }
            }
        }
        buffer.drain(..start);
    }
}

fn print_tables(times: &[RunTimes], load_before: &str, load_after: &str) {
    let runs = times.len();
    println!(
        "queue hand-over: {runs} runs, image {SAMPLE_IMAGE} (its own command), memory {MEMORY}, \
         {PORT} published, docker-init, no health check; a worker offering {MEMORY}, one task \
         claimed and one waiting at position 1. Cube = DELETE /tasks/{{claimed}} → the head's \
         `Claimed` event read from GET /events (manager + worker, persistent stores); raw \
         Docker = the same work through bollard: stop of the running container, then create + \
         start of the same container anew. Load average before: \
         {load_before}; after: {load_after}"
    );
    println!();
    println!(
        "| run | first | Cube: DELETE → head claimed, ms | raw Docker: stop + create + start, ms | Cube − raw, ms | Cube / raw | raw Docker: create + start alone, ms |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|");
    for (run, times) in times.iter().enumerate() {
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.2} | {:.1} |",
            run + 1,
            if times.cube_first { "Cube" } else { "raw" },
            times.cube_ms,
            times.raw_ms,
            times.cube_ms - times.raw_ms,
            times.cube_ms / times.raw_ms,
            times.raw_start_ms
        );
    }
    let of = |read: fn(&RunTimes) -> f64| {
        let mut values: Vec<f64> = times.iter().map(read).collect();
        Summary::of(&mut values)
    };
    let difference = of(|t| t.cube_ms - t.raw_ms);
    println!();
    println!("| over {runs} runs | median | p95 | min | max |");
    println!("|---|---:|---:|---:|---:|");
    println!(
        "| Cube: DELETE /tasks/{{claimed}} → head of the queue claimed, ms | {} |",
        of(|t| t.cube_ms)
    );
    println!(
        "| raw Docker: stop of the old container + create + start of the new, ms | {} |",
        of(|t| t.raw_ms)
    );
    println!("| Cube − raw Docker, run by run, ms | {difference} |");
    let ratio = of(|t| t.cube_ms / t.raw_ms);
    println!(
        "| Cube / raw Docker, run by run | {:.2} | {:.2} | {:.2} | {:.2} |",
        ratio.median, ratio.p95, ratio.min, ratio.max
    );
    println!(
        "| raw Docker: create + start alone (Docker's floor for the start), ms | {} |",
        of(|t| t.raw_start_ms)
    );
    println!(
        "| Cube − raw Docker's create + start alone, run by run, ms | {} |",
        of(|t| t.cube_ms - t.raw_start_ms)
    );
    println!();
    println!(
        "Target: Cube ≤ raw Docker (the same work) + 50 ms. Median difference {:.1} ms: {}.",
        difference.median,
        if difference.median <= 50.0 {
            "met"
        } else {
            "not met"
        }
    );
    println!();
    println!(
        "Cube's path, from the manager's events: each event's Time from the DELETE sent, and \
         the step alone (from the event before it; the first from the DELETE sent), run by run:"
    );
    println!();
    println!(
        "| step | from the DELETE: median ms | min | max | the step alone: median ms | min | max |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let mut rows: Vec<(&str, Vec<f64>, Vec<f64>)> = Vec::new();
    for (step, name) in STEPS.iter().enumerate() {
        let since_delete: Vec<f64> = times.iter().map(|t| t.steps[step]).collect();
        let alone = times
            .iter()
            .map(|t| t.steps[step] - step.checked_sub(1).map_or(0.0, |before| t.steps[before]))
            .collect();
        rows.push((name, since_delete, alone));
    }
    let last = STEPS.len() - 1;
    rows.push((
        "the benchmark reads the `Claimed` event (= Cube's time)",
        times.iter().map(|t| t.cube_ms).collect(),
        times.iter().map(|t| t.cube_ms - t.steps[last]).collect(),
    ));
    for (name, since_delete, alone) in rows {
        println!("| {name} | {} | {} |", spread(since_delete), spread(alone));
    }
}

/// Median, min and max as three cells, over the values that are known (an event the stream did
/// not show is NaN).
fn spread(values: Vec<f64>) -> String {
    let mut known: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
    if known.is_empty() {
        return "– | – | –".to_string();
    }
    Summary::of(&mut known).spread(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claimed_entrys_event_is_read_and_a_heartbeat_is_not_an_event() {
        let line =
            br#"{"Index": 1000000000007, "Time": "2026-11-24T10:43:26.386Z", "Topic": "Queue",
            "Type": "Claimed", "Key": "task/4b1c", "Object": {"ID": "4b1c", "State": "claimed"}}"#;
        let event = parse_line(line).unwrap().unwrap();
        assert!(event.is_entry_of("4b1c"));
        assert!(!event.is_entry_of("4b1"));
        assert_eq!(event.state(), Some("claimed"));
        assert!(event.time.is_some());

        let task = br#"{"Index": 8, "Time": "2026-11-24T10:43:26.380Z", "Topic": "Task",
            "Type": "Running", "Key": "4b1c", "Object": {"State": "Running"}}"#;
        assert!(!parse_line(task).unwrap().unwrap().is_entry_of("4b1c"));

        assert!(parse_line(b"").unwrap().is_none());
        assert!(parse_line(b"\r").unwrap().is_none());
    }

    #[test]
    fn the_end_of_the_stream_is_an_error_not_an_event() {
        let dropped = br#"{"Topic": "Stream", "Type": "Dropped", "Index": 42}"#;
        let err = parse_line(dropped).unwrap_err();
        assert!(err.to_string().contains("Dropped"), "{err}");
        assert!(parse_line(b"{not json").is_err());
    }
}
