//! `cube-bench store`: how fast the manager acknowledges durable submissions, whether every
//! acknowledged one survives `kill -9`, and how long `GET /tasks` takes with many tasks.
//!
//! Submissions: each run starts a real `cube manager` on the persistent store (durability as
//! shipped: each acknowledged write is a committed, fsynced redb transaction) on a fresh data
//! directory, in two setups: with no worker (every task stays `Pending`, waiting for a node,
//! so the store sees the submissions and the scheduler's "no node" reasons), and with 10
//! simulated workers attached (`sim-workers`: real worker code, in-memory containers, another
//! process), so that placements, dispatches and state reports write to the store at the same
//! time. N clients `POST /tasks` distinct tasks for D seconds; the 201 answers per second
//! are the figure. At D seconds the manager gets SIGKILL while submissions are still in
//! flight, is started again on the same data directory, and every acknowledged task ID is
//! looked for in its `GET /tasks`.
//!
//! Latency: one manager with 10 simulated workers is loaded to each size (tasks Running);
//! then 20 `GET /tasks`, one after another, each timed until the whole body is read.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::task::JoinSet;

use crate::Summary;
use crate::load::{self, DbType, ManagerProcess, SIM_WORKERS, SimCluster, SimWorkers};

/// How many `GET /tasks` are timed at each size.
const LIST_SAMPLES: usize = 20;

/// One run of durable submissions.
struct Durable {
    per_second: f64,
    acknowledged: usize,
    found: usize,
    /// Answers other than 201 before the kill.
    refused: usize,
    /// From starting the manager again to its answer listing the tasks, in ms.
    restart_ms: f64,
}

pub(crate) async fn store(
    runs: usize,
    seconds: u64,
    concurrency: usize,
    list_sizes: &[usize],
    cube: &Path,
) -> anyhow::Result<()> {
    anyhow::ensure!(runs > 0, "--runs must be at least 1");
    anyhow::ensure!(seconds > 0, "--seconds must be at least 1");
    anyhow::ensure!(concurrency > 0, "--concurrency must be at least 1");
    let duration = Duration::from_secs(seconds);

    let setups = [
        (false, "no workers (tasks stay Pending)"),
        (true, "10 sim-workers (tasks placed, dispatched, Running)"),
    ];
    let mut results = Vec::new();
    for (with_workers, setup) in setups {
        for clients in [concurrency, 1] {
            let mut one = Vec::with_capacity(runs);
            for run in 1..=runs {
                let result = durable_run(cube, duration, clients, with_workers).await?;
                eprintln!(
                    "{setup}, {clients} clients, run {run}/{runs}: {:.0}/s; acknowledged {}, \
                     found after kill -9: {}, lost: {}",
                    result.per_second,
                    result.acknowledged,
                    result.found,
                    result.acknowledged - result.found
                );
                one.push(result);
            }
            results.push((setup, clients, one));
        }
    }

    println!(
        "durable submissions: cube manager, persistent store (a committed redb transaction per \
         write), {runs} runs of {seconds} s each, then kill -9 and a restart on the same data"
    );
    println!();
    println!(
        "| setup | clients | median acked/s | min | max | acknowledged | found after kill -9 | \
         lost | refused | restart ms (median) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (setup, clients, one) in &results {
        let mut rates: Vec<f64> = one.iter().map(|run| run.per_second).collect();
        let mut restarts: Vec<f64> = one.iter().map(|run| run.restart_ms).collect();
        let rate = Summary::of(&mut rates);
        let acknowledged: usize = one.iter().map(|run| run.acknowledged).sum();
        let found: usize = one.iter().map(|run| run.found).sum();
        let refused: usize = one.iter().map(|run| run.refused).sum();
        println!(
            "| {setup} | {clients} | {:.0} | {:.0} | {:.0} | {acknowledged} | {found} | {} | \
             {refused} | {:.0} |",
            rate.median,
            rate.min,
            rate.max,
            acknowledged - found,
            Summary::of(&mut restarts).median
        );
    }
    println!();
    for (setup, clients, one) in &results {
        let acknowledged: usize = one.iter().map(|run| run.acknowledged).sum();
        let found: usize = one.iter().map(|run| run.found).sum();
        println!(
            "{setup}, {clients} clients: acknowledged {acknowledged}, found after kill -9: \
             {found}, lost: {}",
            acknowledged - found
        );
    }

    if list_sizes.is_empty() {
        return Ok(());
    }
    let latencies = list_latency(cube, list_sizes).await?;
    println!();
    println!(
        "GET /tasks latency: one manager (persistent store) with {SIM_WORKERS} sim-workers, \
         every task Running; {LIST_SAMPLES} requests one after another, whole body read"
    );
    println!();
    println!("| tasks | median ms | p95 ms | min ms | max ms | body MB |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for (size, summary, body_mb) in latencies {
        println!("| {size} | {summary} | {body_mb:.1} |");
    }
    Ok(())
}

/// One manager, `clients` clients submitting for `duration`, then `kill -9` and the check.
async fn durable_run(
    cube: &Path,
    duration: Duration,
    clients: usize,
    with_workers: bool,
) -> anyhow::Result<Durable> {
    let data_dir = tempfile::tempdir()?;
    let manager = ManagerProcess::start(cube, data_dir.path(), DbType::Persistent).await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let sim = match with_workers {
        true => Some(SimWorkers::start(&http, &manager.base, SIM_WORKERS).await?),
        false => None,
    };

    let base = manager.base.clone();
    let (
        Submissions {
            acknowledged,
            refused,
        },
        (),
    ) = submit_for(&http, &base, clients, duration, manager.kill()).await?;
    if let Some(sim) = sim {
        sim.stop().await?;
    }

    let restarted = Instant::now();
    let again = ManagerProcess::start(cube, data_dir.path(), DbType::Persistent).await?;
    let kept: HashSet<String> = load::tasks(&http, &again.base)
        .await?
        .into_iter()
        .map(|task| task.id.to_string())
        .collect();
    let restart_ms = restarted.elapsed().as_secs_f64() * 1000.0;
    again.kill().await?;
    let found = acknowledged.iter().filter(|id| kept.contains(*id)).count();
    Ok(Durable {
        per_second: acknowledged.len() as f64 / duration.as_secs_f64(),
        acknowledged: acknowledged.len(),
        found,
        refused,
        restart_ms,
    })
}

/// What the clients of one run of durable submissions got.
pub(crate) struct Submissions {
    /// The IDs of the tasks acknowledged (201).
    pub(crate) acknowledged: Vec<String>,
    /// Answers other than 201 before the stop.
    pub(crate) refused: usize,
}

/// `clients` clients post distinct tasks to the manager at `base` through `http`, each one
/// after another as fast as it is answered, for `duration`; then `kill` runs (the manager's
/// `kill -9`) while submissions are still in flight, and what each client was answered is
/// gathered, with what `kill` gave: an answer already sent counts as acknowledged.
///
/// The clients share `http`, whose pool keeps connections alive between requests: about as
/// many are opened as there are clients (over HTTPS, one handshake each), and each is used
/// again for request after request. `http` carries whatever else the manager needs (TLS
/// settings, a token as a default header).
pub(crate) async fn submit_for<T>(
    http: &reqwest::Client,
    base: &str,
    clients: usize,
    duration: Duration,
    kill: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<(Submissions, T)> {
    let stopped = Arc::new(AtomicBool::new(false));
    let mut submitters = JoinSet::new();
    for client in 0..clients {
        let (http, base, stopped) = (http.clone(), base.to_string(), stopped.clone());
        submitters.spawn(async move { submit_until_stopped(&http, &base, client, &stopped).await });
    }
    tokio::time::sleep(duration).await;
    stopped.store(true, Ordering::SeqCst);
    let killed = kill.await?;
    let mut acknowledged = Vec::new();
    let mut refused = 0;
    while let Some(submitter) = submitters.join_next().await {
        let (ids, refusals) = submitter.context("a submitting client panicked")?;
        acknowledged.extend(ids);
        refused += refusals;
    }
    Ok((
        Submissions {
            acknowledged,
            refused,
        },
        killed,
    ))
}

/// Submits distinct tasks one after another until `stopped`; returns the IDs acknowledged
/// (201) and how many answers before the stop were something else. Errors after the stop are
/// the kill, not a refusal.
async fn submit_until_stopped(
    http: &reqwest::Client,
    base: &str,
    client: usize,
    stopped: &AtomicBool,
) -> (Vec<String>, usize) {
    let mut acknowledged = Vec::new();
    let mut refused = 0;
    for number in 0.. {
        if stopped.load(Ordering::SeqCst) {
            break;
        }
        let task = load::small_task(&format!("s-{client}-{number}"));
        let answer = http.post(format!("{base}/tasks")).json(&task).send().await;
        let id = match answer {
            Ok(answer) if answer.status().as_u16() == 201 => {
                match answer.json::<serde_json::Value>().await {
                    Ok(body) => body["ID"].as_str().map(str::to_string),
                    Err(_) => None,
                }
            }
            _ => None,
        };
        match id {
            Some(id) => acknowledged.push(id),
            None if !stopped.load(Ordering::SeqCst) => refused += 1,
            None => break,
        }
    }
    (acknowledged, refused)
}

/// Loads one manager to each size in turn and times `GET /tasks` there: (size, times in ms,
/// body size in MB).
async fn list_latency(cube: &Path, sizes: &[usize]) -> anyhow::Result<Vec<(usize, Summary, f64)>> {
    let mut sizes = sizes.to_vec();
    sizes.sort_unstable();
    let SimCluster {
        _data_dir,
        manager,
        http,
        sim,
    } = SimCluster::start(cube, DbType::Persistent, SIM_WORKERS).await?;
    let base = manager.base.clone();
    let mut loaded = 0;
    let mut results = Vec::new();
    for size in sizes {
        let started = Instant::now();
        load::load_tasks(&http, &base, "t", loaded, size).await?;
        loaded = loaded.max(size);
        load::await_placed(&http, &base, size).await?;
        load::await_running(&http, &base, size).await?;
        eprintln!(
            "{size} tasks loaded and Running after {:.1} s",
            started.elapsed().as_secs_f64()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut times_ms = Vec::with_capacity(LIST_SAMPLES);
        let mut body_bytes = 0;
        for _ in 0..LIST_SAMPLES {
            let started = Instant::now();
            let answer = http
                .get(format!("{base}/tasks"))
                .send()
                .await
                .context("GET /tasks")?;
            anyhow::ensure!(
                answer.status().is_success(),
                "GET /tasks answered {}",
                answer.status()
            );
            body_bytes = answer.bytes().await.context("reading GET /tasks")?.len();
            times_ms.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        results.push((size, Summary::of(&mut times_ms), body_bytes as f64 / 1e6));
    }
    sim.stop().await?;
    manager.kill().await?;
    Ok(results)
}
