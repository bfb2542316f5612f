//! `cube-bench soak`: reads and writes mixed on one manager for minutes, as a busy cluster's
//! API sees them. A `cube manager` on the persistent store with 10 simulated workers is
//! loaded with `--tasks` tasks (Running); then `--clients` clients for `--seconds` seconds,
//! half of them `GET /tasks?limit=100` (one page, the way a dashboard or `cube status` on a
//! large cluster reads), half `POST /tasks` of a new small task, each client at `--rate`
//! requests per second (0: as fast as it can, which measures saturation, not latency). Every
//! request is timed; the manager's RSS is sampled every 10 s. Every write adds a task (nothing
//! is collected yet), so the RSS grows with the tasks during the mixed phase; a read-only
//! phase of a quarter of `--seconds` follows, where nothing is added and the RSS must stay
//! flat. Before the soak, one client times `GET /tasks` of every task in full, in the summary
//! form (no history), and one page of 100.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
    rate: f64,
    cube: &Path,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        clients >= 2,
        "--clients must be at least 2 (readers and writers)"
    );
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

    // Tasks the manager holds: those loaded, and every write acknowledged since (counted
    // here rather than asked of the manager, whose full list would itself move its RSS).
    let held = Arc::new(AtomicUsize::new(tasks));
    let stopped = Arc::new(AtomicBool::new(false));
    // Writers stop at the end of the mixed phase; readers go on through the read-only one.
    let writers_stopped = Arc::new(AtomicBool::new(false));
    let pace = (rate > 0.0).then(|| Duration::from_secs_f64(1.0 / rate));
    let mut running = JoinSet::new();
    for client in 0..clients {
        let reader = client % 2 == 0;
        let (http, base, held) = (http.clone(), base.clone(), held.clone());
        let stopped = if reader {
            stopped.clone()
        } else {
            writers_stopped.clone()
        };
        running.spawn(async move {
            let mut seen = Seen::default();
            let mut number = 0u64;
            // Clients start spread over one period, not all at once.
            let mut ticks = pace.map(|pace| {
                let offset = pace.mul_f64(client as f64 / clients as f64);
                let mut ticks =
                    tokio::time::interval_at(tokio::time::Instant::now() + offset, pace);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                ticks
            });
            while !stopped.load(Ordering::Relaxed) {
                if let Some(ticks) = ticks.as_mut() {
                    ticks.tick().await;
                }
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
                        Ok(answer) if answer.status().as_u16() == 201 => {
                            held.fetch_add(1, Ordering::Relaxed);
                            true
                        }
                        Ok(_) | Err(_) => false,
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
    let read_only = seconds / 4;
    let mut rss = Vec::new();
    let mut writing = true;
    while started.elapsed() < Duration::from_secs(seconds + read_only) {
        tokio::time::sleep(RSS_EVERY).await;
        if writing && started.elapsed() >= Duration::from_secs(seconds) {
            writers_stopped.store(true, Ordering::Relaxed);
            writing = false;
        }
        let (mb, _) = load::memory_mb(manager.pid).context("the manager's RSS")?;
        let held = held.load(Ordering::Relaxed);
        eprintln!(
            "{:>4.0} s: manager RSS {mb:.1} MB, {held} tasks{}",
            started.elapsed().as_secs_f64(),
            if writing { "" } else { " (reads only)" }
        );
        rss.push((started.elapsed().as_secs_f64(), mb, held, writing));
    }
    writers_stopped.store(true, Ordering::Relaxed);
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

    let pace_text = if rate > 0.0 {
        format!("each at {rate} requests/s")
    } else {
        "each as fast as it can".to_string()
    };
    println!(
        "soak: {clients} clients ({pace_text}) for {seconds} s, half reading and half writing, \
         then the readers alone for {read_only} s, on a manager (persistent store, \
         {SIM_WORKERS} sim-workers) that held {tasks} tasks at the start"
    );
    println!();
    println!("| requests | count | per s | p50 ms | p99 ms | max ms | errors |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (what, seen, span) in [
        ("GET /tasks?limit=100", &mut reads, seconds + read_only),
        ("POST /tasks", &mut writes, seconds),
    ] {
        let count = seen.times_ms.len();
        anyhow::ensure!(count > 0, "no {what} finished");
        seen.times_ms.sort_by(f64::total_cmp);
        let at = |fraction: f64| seen.times_ms[((count - 1) as f64 * fraction).round() as usize];
        println!(
            "| {what} | {count} | {:.0} | {:.1} | {:.1} | {:.1} | {} |",
            count as f64 / span as f64,
            at(0.5),
            at(0.99),
            at(1.0),
            seen.errors
        );
    }
    println!();
    // While tasks are added the RSS grows with them; the figure for a leak is the RSS over
    // the read-only phase, and over the second half of the mixed phase per task held.
    let mixed: Vec<&(f64, f64, usize, bool)> = rss
        .iter()
        .filter(|(at, _, _, writing)| *writing && *at >= seconds as f64 / 2.0)
        .collect();
    if let (Some(first), Some(last)) = (mixed.first(), mixed.last()) {
        let per_task_kb = (last.1 - first.1) * 1024.0 / (last.2 as f64 - first.2 as f64).max(1.0);
        println!(
            "manager RSS, second half of the mixed phase: {:.1} MB ({} tasks) to {:.1} MB ({} \
             tasks): {per_task_kb:.2} KB per task added",
            first.1, first.2, last.1, last.2
        );
    }
    let reads: Vec<f64> = rss
        .iter()
        .filter(|sample| !sample.3)
        .map(|sample| sample.1)
        .collect();
    if let (Some(first), Some(last)) = (reads.first(), reads.last()) {
        let low = reads.iter().copied().fold(f64::MAX, f64::min);
        let high = reads.iter().copied().fold(0.0, f64::max);
        println!(
            "manager RSS, read-only phase ({} samples): {first:.1} MB to {last:.1} MB; min \
             {low:.1}, max {high:.1}: spread {:.1} %",
            reads.len(),
            (high - low) / low * 100.0
        );
    }
    Ok(())
}
