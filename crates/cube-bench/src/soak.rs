//! `cube-bench soak`: reads and writes mixed on one manager for minutes, as a busy cluster's
//! API sees them. A `cube manager` on the persistent store with 10 simulated workers is
//! loaded with `--tasks` tasks (Running); then `--clients` clients for `--seconds` seconds,
//! half of them `GET /tasks?limit=100` (one page, the way a dashboard or `cube status` on a
//! large cluster reads), half `POST /tasks` of a new small task. Every request is timed; the
//! manager's RSS is sampled every 10 s. Before the soak, one client times `GET /tasks` of
//! every task in full, in the summary form (no history), and one page of 100.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::task::JoinSet;

use crate::load::{self, DbType, ManagerProcess, SIM_WORKERS, SimWorkers};

/// How often the manager's RSS is sampled.
const RSS_EVERY: Duration = Duration::from_secs(10);

/// What one client saw: times in ms, and answers that were not a success.
#[derive(Default)]
struct Seen {
    times_ms: Vec<f64>,
    errors: usize,
}

pub(crate) async fn soak(
    seconds: u64,
    clients: usize,
    tasks: usize,
    cube: &Path,
) -> anyhow::Result<()> {
    anyhow::ensure!(clients >= 2, "--clients must be at least 2 (readers and writers)");
    anyhow::ensure!(seconds >= 20, "--seconds must be at least 20");
    let data_dir = tempfile::tempdir()?;
    let manager = ManagerProcess::start(cube, data_dir.path(), DbType::Persistent).await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(clients)
        .build()?;
    let base = manager.base.clone();
    let sim = SimWorkers::start(&http, &base, SIM_WORKERS).await?;
    load::load_tasks(&http, &base, "soak", 0, tasks).await?;
    load::await_placed(&http, &base, tasks).await?;
    load::await_running(&http, &base, tasks).await?;
    eprintln!("{tasks} tasks loaded and Running");

    println!("GET /tasks with {tasks} tasks, one client, 10 requests each (median ms, bytes):");
    println!();
    println!("| request | median ms | max ms | body bytes |");
    println!("|---|---:|---:|---:|");
    for query in ["", "?summary=true", "?limit=100"] {
        let mut times = Vec::new();
        let mut bytes = 0;
        for _ in 0..10 {
            let started = Instant::now();
            let body = http
                .get(format!("{base}/tasks{query}"))
                .send()
                .await?
                .bytes()
                .await?;
            times.push(started.elapsed().as_secs_f64() * 1000.0);
            bytes = body.len();
        }
        let summary = crate::Summary::of(&mut times);
        println!(
            "| GET /tasks{query} | {:.1} | {:.1} | {bytes} |",
            summary.median, summary.max
        );
    }
    println!();

    let stopped = Arc::new(AtomicBool::new(false));
    let mut running = JoinSet::new();
    for client in 0..clients {
        let (http, base, stopped) = (http.clone(), base.clone(), stopped.clone());
        let reader = client % 2 == 0;
        running.spawn(async move {
            let mut seen = Seen::default();
            let mut number = 0u64;
            while !stopped.load(Ordering::Relaxed) {
                let started = Instant::now();
                let ok = if reader {
                    match http.get(format!("{base}/tasks?limit=100")).send().await {
                        Ok(answer) => answer.status().is_success() && answer.bytes().await.is_ok(),
                        Err(_) => false,
                    }
                } else {
                    number += 1;
                    let task = load::small_task(&format!("w-{client}-{number}"));
                    match http.post(format!("{base}/tasks")).json(&task).send().await {
                        Ok(answer) => answer.status().as_u16() == 201,
                        Err(_) => false,
                    }
                };
                seen.times_ms.push(started.elapsed().as_secs_f64() * 1000.0);
                if !ok {
                    seen.errors += 1;
                }
            }
            (reader, seen)
        });
    }
    let started = Instant::now();
    let mut rss = Vec::new();
    while started.elapsed() < Duration::from_secs(seconds) {
        tokio::time::sleep(RSS_EVERY).await;
        let (mb, _) = load::memory_mb(manager.pid).context("the manager's RSS")?;
        let held = load::tasks(&http, &base).await.map(|t| t.len()).unwrap_or(0);
        eprintln!(
            "{:>4.0} s: manager RSS {mb:.1} MB, {held} tasks",
            started.elapsed().as_secs_f64()
        );
        rss.push((started.elapsed().as_secs_f64(), mb, held));
    }
    stopped.store(true, Ordering::Relaxed);
    let (mut reads, mut writes) = (Seen::default(), Seen::default());
    while let Some(done) = running.join_next().await {
        let (reader, seen) = done.context("a client panicked")?;
        let into = if reader { &mut reads } else { &mut writes };
        into.times_ms.extend(seen.times_ms);
        into.errors += seen.errors;
    }
    sim.stop().await?;
    manager.kill().await?;

    println!(
        "soak: {clients} clients for {seconds} s on a manager (persistent store, \
         {SIM_WORKERS} sim-workers) that held {tasks} tasks at the start"
    );
    println!();
    println!("| requests | count | per s | p50 ms | p99 ms | max ms | errors |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (what, seen) in [
        ("GET /tasks?limit=100", &mut reads),
        ("POST /tasks", &mut writes),
    ] {
        let count = seen.times_ms.len();
        anyhow::ensure!(count > 0, "no {what} finished");
        seen.times_ms.sort_by(f64::total_cmp);
        let at = |fraction: f64| seen.times_ms[((count - 1) as f64 * fraction).round() as usize];
        println!(
            "| {what} | {count} | {:.0} | {:.1} | {:.1} | {:.1} | {} |",
            count as f64 / seconds as f64,
            at(0.5),
            at(0.99),
            at(1.0),
            seen.errors
        );
    }
    println!();
    // RSS over the second half of the soak: flat means no leak beyond the tasks added.
    let half: Vec<&(f64, f64, usize)> = rss
        .iter()
        .filter(|(at, _, _)| *at >= seconds as f64 / 2.0)
        .collect();
    if let (Some(first), Some(last)) = (half.first(), half.last()) {
        let low = half.iter().map(|s| s.1).fold(f64::MAX, f64::min);
        let high = half.iter().map(|s| s.1).fold(0.0, f64::max);
        println!(
            "manager RSS over the second half: {:.1} MB at {:.0} s ({} tasks) to {:.1} MB at \
             {:.0} s ({} tasks); min {low:.1}, max {high:.1}: spread {:.1} %",
            first.1,
            first.0,
            first.2,
            last.1,
            last.0,
            last.2,
            (high - low) / low * 100.0
        );
    }
    Ok(())
}
