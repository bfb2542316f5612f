//! `cube-bench events`: how long a change takes to reach the manager's event subscribers, and
//! what subscribers cost the manager.
//!
//! A real `cube manager` (persistent store) with one simulated worker (`sim-workers`: the
//! real worker code on an in-memory container runtime, so a task is `Running` without Docker
//! and the figures are the manager's). Latency: `--subscribers` streams of
//! `GET /events?topic=Task` are opened, then `--tasks` tasks are submitted one after another
//! (a pause between them, so that what is timed is delivery, not a queue); each task makes
//! three events (`Submitted`, `Placed`, `Running`), and every subscriber times each event from
//! its `Time` (taken by the manager when it published the change, under its state lock) to
//! the moment it has read and parsed the line. Same machine, same clock. Cost: the manager's
//! CPU time (utime + stime from /proc, in ticks of 10 ms) and resident memory over
//! `--idle-seconds` with no subscriber, then with 100 subscribers attached and nothing
//! happening (each gets a heartbeat every 15 s).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use tokio::task::JoinSet;

use crate::load::{DbType, ManagerProcess, SimWorkers, memory_mb, small_task};

/// How many subscribers the cost is measured with.
const IDLE_SUBSCRIBERS: usize = 100;

/// The pause between two submissions: long enough that the last task's events are out
/// before the next one's begin, on this machine.
const SUBMIT_PAUSE: Duration = Duration::from_millis(20);

/// Events each task makes on topic Task: `Submitted`, `Placed`, `Running`.
const EVENTS_PER_TASK: usize = 3;

/// Clock ticks per second of /proc's CPU times (`getconf CLK_TCK`: 100 on Linux here).
pub(crate) const TICKS_PER_SECOND: f64 = 100.0;

pub(crate) async fn events(
    tasks: usize,
    subscriber_counts: &[usize],
    idle_seconds: u64,
    cube: &Path,
) -> anyhow::Result<()> {
    anyhow::ensure!(tasks > 0, "--tasks must be at least 1");
    let data_dir = tempfile::tempdir()?;
    let manager = ManagerProcess::start(cube, data_dir.path(), DbType::Persistent).await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let workers = SimWorkers::start(&http, &manager.base, 1).await?;

    // What idle subscribers cost, on a manager that has done nothing else yet.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = Duration::from_secs(idle_seconds);
    let alone = cost_over(manager.pid, idle).await?;
    let attached = open_subscribers(&manager.base, IDLE_SUBSCRIBERS, 0).await?;
    let with_subscribers = cost_over(manager.pid, idle).await?;
    drop(attached);

    println!("## Events from the manager's change to a subscriber\n");
    println!(
        "{tasks} tasks submitted one after another ({} ms apart), {EVENTS_PER_TASK} events \
         each, to a manager with one simulated worker; every subscriber follows \
         GET /events?topic=Task.\n",
        SUBMIT_PAUSE.as_millis()
    );
    println!(
        "| subscribers | events read | p50, ms | p99, ms | max, ms | manager CPU while it ran, % of a core |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    let mut batch = 0;
    for &count in subscriber_counts {
        batch += 1;
        let run = latency_run(&http, &manager, count, tasks, batch).await?;
        let mut latencies = run.latencies_ms;
        latencies.sort_by(f64::total_cmp);
        let at =
            |fraction: f64| latencies[((latencies.len() - 1) as f64 * fraction).round() as usize];
        println!(
            "| {count} | {} | {:.2} | {:.2} | {:.2} | {:.1} |",
            latencies.len(),
            at(0.5),
            at(0.99),
            at(1.0),
            run.cpu_percent
        );
    }
    println!("\n## What subscribers cost an idle manager\n");
    println!("| measure | no subscriber | {IDLE_SUBSCRIBERS} idle subscribers |\n|---|---:|---:|");
    println!(
        "| manager CPU over {idle_seconds} s, % of a core | {:.2} | {:.2} |",
        alone.cpu_percent, with_subscribers.cpu_percent
    );
    println!(
        "| manager RSS at the end, MB | {:.1} | {:.1} |",
        alone.rss_mb, with_subscribers.rss_mb
    );
    workers.stop().await?;
    manager.kill().await?;
    Ok(())
}

/// What the manager used over a while.
struct Cost {
    cpu_percent: f64,
    rss_mb: f64,
}

async fn cost_over(pid: u32, period: Duration) -> anyhow::Result<Cost> {
    let before = cpu_ticks(pid)?;
    let started = Instant::now();
    tokio::time::sleep(period).await;
    let used = (cpu_ticks(pid)? - before) as f64 / TICKS_PER_SECOND;
    Ok(Cost {
        cpu_percent: 100.0 * used / started.elapsed().as_secs_f64(),
        rss_mb: memory_mb(pid)?.0,
    })
}

/// A process's user and system CPU time so far, in clock ticks (/proc/PID/stat).
pub(crate) fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    // The command name, in parentheses, may hold spaces: the fields counted are after it.
    let after_name = stat
        .rsplit_once(") ")
        .map(|(_, rest)| rest)
        .with_context(|| format!("{path}: {stat:?}"))?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // utime and stime are the 14th and 15th fields; the 3rd is the first after the name.
    let field = |n: usize| -> anyhow::Result<u64> {
        fields
            .get(n - 3)
            .and_then(|text| text.parse().ok())
            .with_context(|| format!("{path}: no field {n}"))
    };
    Ok(field(14)? + field(15)?)
}

/// What one latency run measured.
struct LatencyRun {
    latencies_ms: Vec<f64>,
    cpu_percent: f64,
}

async fn latency_run(
    http: &reqwest::Client,
    manager: &ManagerProcess,
    subscribers: usize,
    tasks: usize,
    batch: usize,
) -> anyhow::Result<LatencyRun> {
    let expected = tasks * EVENTS_PER_TASK;
    let readers = open_subscribers(&manager.base, subscribers, expected).await?;
    let before = cpu_ticks(manager.pid)?;
    let started = Instant::now();
    for number in 0..tasks {
        crate::submit(
            http,
            &manager.base,
            &small_task(&format!("events-{batch}-{number}")),
        )
        .await?;
        tokio::time::sleep(SUBMIT_PAUSE).await;
    }
    let latencies = readers.finish(crate::RUN_BOUND).await?;
    let used = (cpu_ticks(manager.pid)? - before) as f64 / TICKS_PER_SECOND;
    Ok(LatencyRun {
        latencies_ms: latencies,
        cpu_percent: 100.0 * used / started.elapsed().as_secs_f64(),
    })
}

/// Subscribers reading `GET /events?topic=Task`, each until it has read `expected` events
/// (0: until dropped), timing each.
struct Subscribers {
    readers: JoinSet<anyhow::Result<()>>,
    latencies_ms: Arc<Mutex<Vec<f64>>>,
}

/// Opens `count` streams; each has subscribed once its answer's headers came.
async fn open_subscribers(
    manager: &str,
    count: usize,
    expected: usize,
) -> anyhow::Result<Subscribers> {
    // No overall timeout: a stream lasts as long as the run.
    let http = reqwest::Client::new();
    let latencies_ms = Arc::new(Mutex::new(Vec::new()));
    let mut readers = JoinSet::new();
    for _ in 0..count {
        let response = http
            .get(format!("{manager}/events?topic=Task"))
            .send()
            .await
            .context("GET /events")?;
        anyhow::ensure!(
            response.status().is_success(),
            "GET /events answered {}",
            response.status()
        );
        readers.spawn(read_events(response, expected, latencies_ms.clone()));
    }
    Ok(Subscribers {
        readers,
        latencies_ms,
    })
}

impl Subscribers {
    /// Waits until every reader has read what it expected; the latencies, in ms.
    async fn finish(mut self, bound: Duration) -> anyhow::Result<Vec<f64>> {
        let deadline = tokio::time::Instant::now() + bound;
        while let Some(reader) = tokio::time::timeout_at(deadline, self.readers.join_next())
            .await
            .context("subscribers did not get every event in time")?
        {
            reader.context("a subscriber panicked")??;
        }
        let latencies = std::mem::take(&mut *lock(&self.latencies_ms));
        Ok(latencies)
    }
}

/// The `Time` of an event line; the rest is not read.
#[derive(serde::Deserialize)]
struct Timed {
    #[serde(rename = "Time")]
    time: DateTime<Utc>,
}

async fn read_events(
    mut response: reqwest::Response,
    expected: usize,
    latencies_ms: Arc<Mutex<Vec<f64>>>,
) -> anyhow::Result<()> {
    let mut buffer = Vec::new();
    let mut mine = Vec::with_capacity(expected);
    while expected == 0 || mine.len() < expected {
        let Some(chunk) = response.chunk().await? else {
            bail!("the manager ended a stream");
        };
        buffer.extend_from_slice(&chunk);
        let mut start = 0;
        while let Some(end) = buffer[start..].iter().position(|byte| *byte == b'\n') {
            let line = &buffer[start..start + end];
            start += end + 1;
            if line.is_empty() {
                continue; // a heartbeat
            }
            let event: Timed = serde_json::from_slice(line).context("an event line")?;
            let read = Utc::now();
            let latency = (read - event.time).num_microseconds().unwrap_or(i64::MAX);
            mine.push(latency as f64 / 1000.0);
        }
        buffer.drain(..start);
    }
    lock(&latencies_ms).extend(mine);
    Ok(())
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
