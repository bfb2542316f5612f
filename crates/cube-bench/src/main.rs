//! `cube-bench`: Cube's latency measured next to its floor, raw Docker, in the same run.
//!
//! `cube-bench start-latency` starts a real `cube manager` and a real `cube worker` registered
//! with it (or, with `--through worker`, the worker alone), both on the persistent store so
//! that each acknowledged submission is a durable commit, and, alternating run by run:
//! - Cube: `POST /tasks` until `GET /tasks/{id}` says `Running` (polled every 2 ms);
//! - raw Docker: bollard create + start of the same container until start returns, which is
//!   when Docker reports it running.
//!
//! It prints a table (median, p95, min, max) and the ratio of the medians. It never fails on a
//! time: the figures are whatever they are, for BENCHMARKS.md.

mod recovery;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use cube_runtime::sample_image::SAMPLE_IMAGE;
use cube_runtime::{ContainerSpec, DockerRuntime, Runtime};
use cube_types::Task;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

/// Cube's benchmarks. Each prints a table; none fails on a time.
#[derive(Debug, Parser)]
#[command(name = "cube-bench", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Time from POST /tasks to Running on a worker, next to bollard create+start.
    StartLatency {
        /// How many tasks each side starts, one after another.
        #[arg(long, default_value_t = 20)]
        runs: usize,
        /// The `cube` binary to run the worker with [default: next to this binary].
        #[arg(long)]
        cube: Option<PathBuf>,
        /// Submit to the manager (placement, dispatch, state reports) or to the worker alone.
        #[arg(long, value_enum, default_value_t = Through::Manager)]
        through: Through,
    },
    /// Time from `docker kill` of a task's container until it runs again, next to Docker
    /// Swarm (a single-node swarm is initialised when there is none, and left afterwards).
    Recovery {
        /// How many kills each side gets.
        #[arg(long, default_value_t = 10)]
        runs: usize,
        /// The `cube` binary [default: next to this binary].
        #[arg(long)]
        cube: Option<PathBuf>,
    },
}

/// Which API the tasks are submitted to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Through {
    Manager,
    Worker,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::StartLatency {
            runs,
            cube,
            through,
        } => start_latency(runs, cube, through).await,
        Command::Recovery { runs, cube } => recovery::recovery(runs, &cube_binary(cube)?).await,
    }
}

/// How long one task may take to become `Running` before the run is abandoned.
pub(crate) const RUN_BOUND: Duration = Duration::from_secs(30);

/// A manager and a worker registered with it (or, `Through::Worker`, a worker alone), both on
/// the persistent store, as separate `cube` processes; killed when dropped.
pub(crate) struct BenchCluster {
    /// Where tasks are submitted: the manager's API, or the worker's.
    pub base: String,
    pub node: String,
    pub http: reqwest::Client,
    _processes: Vec<tokio::process::Child>,
    _data_dir: tempfile::TempDir,
}

impl BenchCluster {
    pub(crate) async fn start(cube: &Path, through: Through) -> anyhow::Result<BenchCluster> {
        let data_dir = tempfile::tempdir()?;
        let node = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let mut processes = Vec::new();
        let manager = match through {
            Through::Manager => {
                let (child, base) = spawn_cube(
                    cube,
                    &["manager", "-H", "127.0.0.1", "-p", "0", "-d", "persistent"],
                    data_dir.path(),
                )
                .await?;
                processes.push(child);
                Some(base)
            }
            Through::Worker => None,
        };
        let mut worker_args = vec![
            "worker",
            "-H",
            "127.0.0.1",
            "-p",
            "0",
            "-n",
            &node,
            "-d",
            "persistent",
        ];
        let manager_address = manager
            .as_deref()
            .map(|base| base.trim_start_matches("http://").to_string());
        if let Some(address) = &manager_address {
            worker_args.extend(["--manager", address, "--heartbeat-interval", "500ms"]);
        }
        let (worker, worker_base) = spawn_cube(cube, &worker_args, data_dir.path()).await?;
        processes.push(worker);
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()?;
        let base = match &manager {
            Some(manager) => {
                await_ready_node(&http, manager, &node).await?;
                manager.clone()
            }
            None => worker_base,
        };
        Ok(BenchCluster {
            base,
            node: node.clone(),
            http,
            _processes: processes,
            _data_dir: data_dir,
        })
    }
}

/// The `cube` binary: the one given, or the one next to this binary.
fn cube_binary(cube: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    Ok(match cube {
        Some(path) => path,
        None => std::env::current_exe()?.with_file_name("cube"),
    })
}

async fn start_latency(runs: usize, cube: Option<PathBuf>, through: Through) -> anyhow::Result<()> {
    anyhow::ensure!(runs > 0, "--runs must be at least 1");
    let cube = cube_binary(cube)?;
    let docker = DockerRuntime::connect().await?;
    docker.ensure_sample_image(SAMPLE_IMAGE).await?;
    let cluster = BenchCluster::start(&cube, through).await?;
    let (http, base) = (&cluster.http, &cluster.base);
    let node = cluster.node.clone();
    let node = node.as_str();

    let mut cube_ms = Vec::with_capacity(runs);
    let mut raw_ms = Vec::with_capacity(runs);
    for run in 0..runs {
        // Alternate which side goes first, so neither always meets a Docker still busy
        // cleaning up after the other.
        if run % 2 == 0 {
            cube_ms.push(cube_once(http, base, run).await?);
            raw_ms.push(raw_once(&docker, node, run).await?);
        } else {
            raw_ms.push(raw_once(&docker, node, run).await?);
            cube_ms.push(cube_once(http, base, run).await?);
        }
    }
    drop(cluster);
    for container in docker.list_managed(node).await? {
        docker.remove(&container.id).await.ok();
    }

    let cube_summary = Summary::of(&mut cube_ms);
    let raw_summary = Summary::of(&mut raw_ms);
    println!("start latency, {runs} runs each, image {SAMPLE_IMAGE}, one task at a time");
    println!();
    println!("| path | median ms | p95 ms | min ms | max ms |");
    println!("|---|---:|---:|---:|---:|");
    let path = match through {
        Through::Manager => "manager + worker",
        Through::Worker => "worker alone",
    };
    println!("| Cube: POST /tasks → Running ({path}, persistent stores) | {cube_summary} |");
    println!("| raw Docker: bollard create + start | {raw_summary} |");
    println!();
    println!(
        "ratio of medians, Cube / raw Docker: {:.2}",
        cube_summary.median / raw_summary.median
    );
    Ok(())
}

/// Starts `cube ARGS --data-dir DIR` and reads the `http://` address it prints.
async fn spawn_cube(
    cube: &Path,
    args: &[&str],
    data_dir: &Path,
) -> anyhow::Result<(tokio::process::Child, String)> {
    let mut child = tokio::process::Command::new(cube)
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| {
            format!(
                "starting {} (build it with cargo build --release)",
                cube.display()
            )
        })?;
    let mut line = String::new();
    let stdout = child.stdout.take().context("cube's stdout")?;
    BufReader::new(stdout).read_line(&mut line).await?;
    let Some(base) = cube_api::address_in_listening_line(&line).map(str::to_string) else {
        bail!("cube {args:?} did not print its address: {line:?}");
    };
    Ok((child, base))
}

/// Waits until the manager lists `node` as `Ready`.
async fn await_ready_node(http: &reqwest::Client, manager: &str, node: &str) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let answer = http.get(format!("{manager}/nodes/{node}")).send().await?;
        if answer.status().is_success() {
            let node: serde_json::Value = answer.json().await?;
            if node["Status"] == "Ready" {
                return Ok(());
            }
        }
        if started.elapsed() > RUN_BOUND {
            bail!("worker {node} did not register with the manager within {RUN_BOUND:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Submits a task to Cube's API at `base`; returns its ID.
pub(crate) async fn submit(
    http: &reqwest::Client,
    base: &str,
    task: &serde_json::Value,
) -> anyhow::Result<String> {
    let answer = http.post(format!("{base}/tasks")).json(task).send().await?;
    anyhow::ensure!(
        answer.status().as_u16() == 201,
        "POST /tasks answered {}",
        answer.status()
    );
    Ok(answer.json::<serde_json::Value>().await?["ID"]
        .as_str()
        .context("task ID")?
        .to_string())
}

/// One task through Cube's API (manager or worker); the time until it reads back as `Running`, in ms.
async fn cube_once(http: &reqwest::Client, base: &str, run: usize) -> anyhow::Result<f64> {
    let task = json!({"Name": format!("bench-{run}"), "Image": SAMPLE_IMAGE, "PortBindings": {"7777/tcp": ""}});
    let started = Instant::now();
    let id = submit(http, base, &task).await?;
    loop {
        let task: serde_json::Value = http
            .get(format!("{base}/tasks/{id}"))
            .send()
            .await?
            .json()
            .await?;
        match task["State"].as_str() {
            Some("Running") => break,
            Some("Failed") => bail!("task {id} failed: {}", task["Error"]),
            _ if started.elapsed() > RUN_BOUND => {
                bail!("task {id} not Running within {RUN_BOUND:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(2)).await,
        }
    }
    let elapsed = started.elapsed();
    http.delete(format!("{base}/tasks/{id}")).send().await?;
    Ok(elapsed.as_secs_f64() * 1000.0)
}

/// The same container started straight through bollard; the time until start returns, in ms.
async fn raw_once(docker: &DockerRuntime, node: &str, run: usize) -> anyhow::Result<f64> {
    let mut task = Task::new(format!("raw-{run}"), SAMPLE_IMAGE);
    task.port_bindings
        .insert("7777/tcp".to_string(), String::new());
    task.normalize();
    let spec = ContainerSpec::for_task(&task, node);
    let started = Instant::now();
    let id = docker.create(&spec).await?;
    docker.start(&id).await?;
    let elapsed = started.elapsed();
    docker.remove(&id).await?;
    Ok(elapsed.as_secs_f64() * 1000.0)
}

/// Median, 95th percentile, min and max of a set of times in ms.
pub(crate) struct Summary {
    pub(crate) median: f64,
    p95: f64,
    min: f64,
    max: f64,
}

impl Summary {
    pub(crate) fn of(times: &mut [f64]) -> Summary {
        times.sort_by(f64::total_cmp);
        let at = |fraction: f64| times[((times.len() - 1) as f64 * fraction).round() as usize];
        Summary {
            median: at(0.5),
            p95: at(0.95),
            min: times[0],
            max: times[times.len() - 1],
        }
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.1} | {:.1} | {:.1} | {:.1}",
            self.median, self.p95, self.min, self.max
        )
    }
}
