//! `cube-bench logs-latency` and `cube-bench metrics-scrape`: day-two operations measured.
//!
//! - **logs-latency**: a task prints 1,000 lines, each carrying the container's clock
//!   (`$EPOCHREALTIME`, the same host clock, in microseconds), while `cube logs -f` and
//!   `docker logs -f` follow the same container side by side; each line's latency is the
//!   reader's clock when the line reached its stdout, less the time in it. p50 and p99 of
//!   each. A real manager and a real worker on the Docker engine.
//! - **metrics-scrape**: a manager holding `--tasks` tasks on simulated workers (as
//!   `footprint` loads it), scraped `--scrapes` times one after another: each `GET /metrics`
//!   timed whole (answer read to its end), and the manager's RSS before and after.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cube_runtime::sample_image::SAMPLE_IMAGE;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::load::{self, DbType, SIM_WORKERS, SimCluster};

/// p50 and p99 of latencies in milliseconds.
fn percentiles(mut values: Vec<f64>) -> (f64, f64) {
    values.sort_by(f64::total_cmp);
    let at = |fraction: f64| values[((values.len() - 1) as f64 * fraction).round() as usize];
    (at(0.5), at(0.99))
}

fn now_micros() -> f64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    since.as_secs_f64() * 1e6
}

/// Reads a follower's stdout until `lines` lines of `N TIME` came, each's latency in ms.
async fn latencies(
    mut child: tokio::process::Child,
    lines: usize,
    bound: Duration,
) -> anyhow::Result<Vec<f64>> {
    let stdout = child.stdout.take().context("the follower's stdout")?;
    let mut reader = BufReader::new(stdout).lines();
    let mut measured = Vec::with_capacity(lines);
    let deadline = tokio::time::Instant::now() + bound;
    while measured.len() < lines {
        let line = tokio::time::timeout_at(deadline, reader.next_line())
            .await
            .context("the follower stopped printing")??
            .context("the follower's output ended early")?;
        let arrived = now_micros();
        let Some(stamp) = line.split_whitespace().nth(1) else {
            continue;
        };
        let Ok(stamp) = stamp.parse::<f64>() else {
            continue;
        };
        measured.push((arrived - stamp * 1e6) / 1e3);
    }
    let _ = child.kill().await;
    Ok(measured)
}

pub(crate) async fn logs_latency(
    lines: usize,
    interval_ms: u64,
    cube: &Path,
) -> anyhow::Result<()> {
    let data_dir = tempfile::tempdir()?;
    let (_manager, base) = load::spawn_cube_logged(
        cube,
        &["manager", "-H", "127.0.0.1", "-p", "0", "-d", "memory"],
        data_dir.path(),
    )
    .await?;
    let address = base.trim_start_matches("http://").to_string();
    let node = format!("bench-logs-{}", std::process::id());
    let worker_dir = data_dir.path().join("worker");
    std::fs::create_dir_all(&worker_dir)?;
    let (_worker, _) = load::spawn_cube_logged(
        cube,
        &[
            "worker",
            "-H",
            "127.0.0.1",
            "-p",
            "0",
            "-n",
            &node,
            "-d",
            "memory",
            "--manager",
            &address,
        ],
        &worker_dir,
    )
    .await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    // Nothing is printed for 3 s, while both followers attach.
    let script = format!(
        "sleep 3; i=0; while [ $i -lt {lines} ]; do echo \"$i $EPOCHREALTIME\"; i=$((i+1)); \
         sleep {}; done; sleep 1",
        interval_ms as f64 / 1000.0
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let task = loop {
        let answer = http
            .post(format!("{base}/tasks"))
            .json(&json!({"Name": "talker", "Image": SAMPLE_IMAGE, "Cmd": ["sh", "-c", script]}))
            .send()
            .await?;
        if answer.status().is_success() {
            break answer.json::<serde_json::Value>().await?;
        }
        if Instant::now() > deadline {
            bail!("the manager refused the task: {}", answer.text().await?);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let id = task["ID"].as_str().context("the task's ID")?.to_string();
    let container = loop {
        let task: serde_json::Value = http
            .get(format!("{base}/tasks/{id}"))
            .send()
            .await?
            .json()
            .await?;
        if task["State"] == "Running" {
            break task["ContainerID"].as_str().unwrap_or_default().to_string();
        }
        if Instant::now() > deadline {
            bail!("the task did not run: {task}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let spawn = |program: &Path, args: Vec<String>| {
        tokio::process::Command::new(program)
            .args(args)
            .env("CUBE_MANAGER", &address)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
    };
    let cube_follower = spawn(cube, vec!["logs".into(), "-f".into(), id.clone()])?;
    let docker_follower = spawn(
        Path::new("docker"),
        vec!["logs".into(), "-f".into(), container],
    )?;
    let bound = Duration::from_millis(5_000 + lines as u64 * (interval_ms + 20));
    let (cube_ms, docker_ms) = tokio::try_join!(
        latencies(cube_follower, lines, bound),
        latencies(docker_follower, lines, bound)
    )?;
    let (cube_p50, cube_p99) = percentiles(cube_ms);
    let (docker_p50, docker_p99) = percentiles(docker_ms);
    println!(
        "a line printed in a container → on the follower's stdout, {lines} lines {interval_ms} ms \
         apart, both followers on the same container at once"
    );
    println!();
    println!("| follower | p50 ms | p99 ms |");
    println!("|---|---:|---:|");
    println!("| `cube logs -f` (manager → worker → Docker) | {cube_p50:.2} | {cube_p99:.2} |");
    println!("| `docker logs -f` | {docker_p50:.2} | {docker_p99:.2} |");
    let docker = crate::containers::connect().await?;
    crate::containers::remove_all(&docker, &format!("cube.node={node}")).await?;
    Ok(())
}

pub(crate) async fn metrics_scrape(
    tasks: usize,
    scrapes: usize,
    dbtype: DbType,
    cube: &Path,
) -> anyhow::Result<()> {
    anyhow::ensure!(scrapes > 0, "--scrapes must be at least 1");
    let SimCluster {
        _data_dir,
        manager,
        http,
        sim,
    } = SimCluster::start(cube, dbtype, SIM_WORKERS).await?;
    let base = manager.base.clone();
    load::load_tasks(&http, &base, "t", 0, tasks).await?;
    load::await_placed(&http, &base, tasks).await?;
    load::await_running(&http, &base, tasks).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (before_mb, _) = load::memory_mb(manager.pid)?;
    let mut times = Vec::with_capacity(scrapes);
    let mut bytes = 0;
    for _ in 0..scrapes {
        let started = Instant::now();
        let text = http
            .get(format!("{base}/metrics"))
            .send()
            .await?
            .text()
            .await?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
        bytes = text.len();
    }
    let (after_mb, peak_mb) = load::memory_mb(manager.pid)?;
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let (p50, p99) = percentiles(times);
    println!(
        "GET /metrics on a manager holding {tasks} Running tasks on {SIM_WORKERS} simulated \
         workers ({} store), {scrapes} scrapes one after another; {bytes} bytes each",
        dbtype.as_arg()
    );
    println!();
    println!("| measure | value | target |");
    println!("|---|---:|---:|");
    println!("| scrape p50, ms | {p50:.1} | ≤ 50 |");
    println!("| scrape p99, ms | {p99:.1} | |");
    println!("| scrape max, ms | {:.1} | |", sorted[sorted.len() - 1]);
    println!("| manager RSS before the scrapes, MB | {before_mb:.1} | |");
    println!("| manager RSS after {scrapes} scrapes, MB | {after_mb:.1} | |");
    println!("| manager peak RSS (VmHWM), MB | {peak_mb:.1} | |");
    manager.kill().await?;
    sim.stop().await?;
    Ok(())
}
