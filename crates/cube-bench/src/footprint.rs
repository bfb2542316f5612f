//! `cube-bench footprint`: resident memory of Cube's processes, and the size of the binary.
//!
//! Each run starts, on a fresh data directory and the persistent store (or, `--dbtype memory`,
//! the memory store, which tells the store's share apart):
//! - an idle `cube worker` (no manager), left to settle for 2 s, then its `VmRSS` is read;
//! - an idle `cube manager`, the same way;
//! - a `cube manager` with `sim-workers` attached (10 real workers on an in-memory container
//!   runtime, in a separate process: see [`crate::simulated`]), loaded with `--tasks` tasks
//!   through `POST /tasks` (32 in flight). Its `VmRSS` is read twice: once every task is
//!   placed (seen through `GET /nodes` only, so no task list was ever built), and once
//!   `GET /tasks` shows every task `Running` (polled every 2 s, so this figure includes what
//!   those large answers left behind); `VmHWM` is its peak over the whole load. Then it is
//!   killed and started again on the same data, and its `VmRSS` read 2 s later: the tasks
//!   read back from the store, without the load's churn.
//!
//! Memory is in MB of 10^6 bytes, from /proc/PID/status. The binary is the `cube` next to
//! this one (build with `cargo build --release`).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::Summary;
use crate::load::{self, DbType, ManagerProcess, SIM_WORKERS, SimWorkers};

/// How long a process is left alone before its memory is read.
const SETTLE: Duration = Duration::from_secs(2);

/// What one run of the loaded manager gives.
struct Loaded {
    submit_s: f64,
    placed_s: f64,
    running_s: f64,
    placed_rss_mb: f64,
    running_rss_mb: f64,
    peak_mb: f64,
    sim_workers_rss_mb: f64,
    /// The persistent store only: the store file's size, and the manager's memory once
    /// started again on it (every task read back from the store, none submitted).
    store_file_mb: Option<f64>,
    restarted_rss_mb: Option<f64>,
}

pub(crate) async fn footprint(
    runs: usize,
    tasks: usize,
    dbtype: DbType,
    cube: &Path,
) -> anyhow::Result<()> {
    anyhow::ensure!(runs > 0, "--runs must be at least 1");
    anyhow::ensure!(tasks > 0, "--tasks must be at least 1");
    let binary_bytes = std::fs::metadata(cube)
        .with_context(|| {
            format!(
                "reading the size of {} (build it with cargo build --release)",
                cube.display()
            )
        })?
        .len();

    let mut worker_mb = Vec::with_capacity(runs);
    let mut manager_mb = Vec::with_capacity(runs);
    let mut loaded = Vec::with_capacity(runs);
    for run in 1..=runs {
        worker_mb.push(idle(cube, "worker", dbtype).await?);
        manager_mb.push(idle(cube, "manager", dbtype).await?);
        let one = loaded_manager(cube, tasks, dbtype).await?;
        eprintln!(
            "run {run}/{runs}: worker {:.1} MB, manager {:.1} MB, loaded {:.1} MB (peak {:.1}), \
             {tasks} tasks submitted in {:.1} s, Running after {:.1} s",
            worker_mb[run - 1],
            manager_mb[run - 1],
            one.running_rss_mb,
            one.peak_mb,
            one.submit_s,
            one.running_s
        );
        loaded.push(one);
    }

    let column = |pick: fn(&Loaded) -> f64| -> Vec<f64> { loaded.iter().map(pick).collect() };
    println!(
        "footprint, {runs} runs, {} stores; the loaded manager has {SIM_WORKERS} simulated \
         workers (real worker code, in-memory container runtime, in a separate process)",
        dbtype.as_arg()
    );
    println!();
    println!("| measure | median | min | max | target |");
    println!("|---|---:|---:|---:|---:|");
    row("idle `cube worker`, RSS MB", &mut worker_mb, "≤ 15");
    row("idle `cube manager`, RSS MB", &mut manager_mb, "≤ 30");
    row(
        &format!("manager, {tasks} tasks placed, before any GET /tasks, RSS MB"),
        &mut column(|one| one.placed_rss_mb),
        "≤ 150",
    );
    row(
        &format!("manager, {tasks} tasks Running, after GET /tasks every 2 s, RSS MB"),
        &mut column(|one| one.running_rss_mb),
        "≤ 150",
    );
    row(
        "manager, peak RSS over the load (VmHWM), MB",
        &mut column(|one| one.peak_mb),
        "",
    );
    if dbtype == DbType::Persistent {
        row(
            &format!("manager started again on that data ({tasks} tasks read back), RSS MB"),
            &mut loaded
                .iter()
                .filter_map(|one| one.restarted_rss_mb)
                .collect::<Vec<_>>(),
            "",
        );
        row(
            "the manager's store file, MB",
            &mut loaded
                .iter()
                .filter_map(|one| one.store_file_mb)
                .collect::<Vec<_>>(),
            "",
        );
    }
    row(
        &format!("sim-workers process ({SIM_WORKERS} workers, {tasks} tasks), RSS MB"),
        &mut column(|one| one.sim_workers_rss_mb),
        "",
    );
    row(
        &format!("time to submit {tasks} tasks (32 in flight), s"),
        &mut column(|one| one.submit_s),
        "",
    );
    row(
        "… until all are placed (GET /nodes), s",
        &mut column(|one| one.placed_s),
        "",
    );
    row(
        "… until GET /tasks shows all Running, s",
        &mut column(|one| one.running_s),
        "",
    );
    println!();
    println!(
        "release binary {}: {:.1} MB ({binary_bytes} bytes), target ≤ 25 MB",
        cube.display(),
        binary_bytes as f64 / 1e6
    );
    Ok(())
}

fn row(measure: &str, values: &mut [f64], target: &str) {
    let summary = Summary::of(values);
    println!(
        "| {measure} | {:.1} | {:.1} | {:.1} | {target} |",
        summary.median, summary.min, summary.max
    );
}

/// Starts `cube ROLE` (no manager for a worker, no worker for a manager) and reads its
/// resident memory once it has settled.
async fn idle(cube: &Path, role: &str, dbtype: DbType) -> anyhow::Result<f64> {
    let data_dir = tempfile::tempdir()?;
    let mut args = vec![role, "-H", "127.0.0.1", "-p", "0", "-d", dbtype.as_arg()];
    if role == "worker" {
        args.extend(["-n", "footprint"]);
    }
    let (mut child, _base) = load::spawn_cube_logged(cube, &args, data_dir.path()).await?;
    let pid = child.id().context("cube exited as it started")?;
    tokio::time::sleep(SETTLE).await;
    let (rss_mb, _) = load::memory_mb(pid)?;
    child.kill().await.context("stopping cube")?;
    Ok(rss_mb)
}

/// A manager with simulated workers, loaded with `tasks` tasks.
async fn loaded_manager(cube: &Path, tasks: usize, dbtype: DbType) -> anyhow::Result<Loaded> {
    let data_dir = tempfile::tempdir()?;
    let manager = ManagerProcess::start(cube, data_dir.path(), dbtype).await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()?;
    let base = manager.base.clone();
    let sim = SimWorkers::start(&http, &base, SIM_WORKERS).await?;

    let started = Instant::now();
    load::load_tasks(&http, &base, "t", 0, tasks).await?;
    let submit_s = started.elapsed().as_secs_f64();
    load::await_placed(&http, &base, tasks).await?;
    let placed_s = started.elapsed().as_secs_f64();
    tokio::time::sleep(SETTLE).await;
    let (placed_rss_mb, _) = load::memory_mb(manager.pid)?;
    load::await_running(&http, &base, tasks).await?;
    let running_s = started.elapsed().as_secs_f64();
    tokio::time::sleep(SETTLE).await;
    let (running_rss_mb, peak_mb) = load::memory_mb(manager.pid)?;
    let (sim_workers_rss_mb, _) = load::memory_mb(sim.pid)?;
    manager.kill().await?;

    let (store_file_mb, restarted_rss_mb) = match dbtype {
        DbType::Memory => (None, None),
        DbType::Persistent => {
            let file = data_dir.path().join("manager.redb");
            let bytes = std::fs::metadata(&file)
                .with_context(|| format!("reading the size of {}", file.display()))?
                .len();
            let again = ManagerProcess::start(cube, data_dir.path(), dbtype).await?;
            tokio::time::sleep(SETTLE).await;
            let (rss_mb, _) = load::memory_mb(again.pid)?;
            again.kill().await?;
            (Some(bytes as f64 / 1e6), Some(rss_mb))
        }
    };
    sim.stop().await?;
    Ok(Loaded {
        submit_s,
        placed_s,
        running_s,
        placed_rss_mb,
        running_rss_mb,
        peak_mb,
        sim_workers_rss_mb,
        store_file_mb,
        restarted_rss_mb,
    })
}
