//! What the footprint and store benchmarks share: a real `cube manager` as a child process on
//! a data directory of its own, simulated workers (`cube-bench sim-workers`, another child
//! process) registered with it, loading many tasks through `POST /tasks`, waiting until the
//! manager shows them placed or running, and reading a process's memory from /proc.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cube_runtime::sample_image::SAMPLE_IMAGE;
use cube_types::{Node, State, Task};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;
use tokio::task::JoinSet;

use crate::simulated::READY_LINE;

/// How many simulated workers share the tasks (each takes 65,536 tasks of 16 MiB).
pub(crate) const SIM_WORKERS: usize = 10;

/// How many submissions are in flight at once while tasks are loaded.
pub(crate) const LOAD_CONCURRENCY: usize = 32;

/// A wait for the manager gives up when its count has not moved for this long.
const NO_PROGRESS_BOUND: Duration = Duration::from_secs(60);

/// A small task for a simulated worker: 16 MiB declared, never checked on a machine.
pub(crate) fn small_task(name: &str) -> serde_json::Value {
    json!({"Name": name, "Image": SAMPLE_IMAGE, "Memory": "16MiB"})
}

/// Starts `cube ARGS --data-dir DIR`, its log (stderr, warnings and worse) appended to
/// `DIR/cube.log` rather than mixed into the benchmark's tables, and reads the `http://`
/// address it prints. The child is killed (SIGKILL) when dropped.
pub(crate) async fn spawn_cube_logged(
    cube: &Path,
    args: &[&str],
    data_dir: &Path,
) -> anyhow::Result<(Child, String)> {
    spawn_cube_logged_at(cube, args, data_dir, "warn").await
}

/// [`spawn_cube_logged`] with the process's `RUST_LOG` (`debug` to trace a benchmark: every
/// line of the log carries its time).
pub(crate) async fn spawn_cube_logged_at(
    cube: &Path,
    args: &[&str],
    data_dir: &Path,
    rust_log: &str,
) -> anyhow::Result<(Child, String)> {
    let (child, base, _line) = spawn_cube_logged_line(cube, args, data_dir, rust_log).await?;
    Ok((child, base))
}

/// [`spawn_cube_logged_at`], with the whole line the process printed (a `cube manager --tls`
/// ends it with its CA's fingerprint: [`ca_fingerprint_in_line`]).
pub(crate) async fn spawn_cube_logged_line(
    cube: &Path,
    args: &[&str],
    data_dir: &Path,
    rust_log: &str,
) -> anyhow::Result<(Child, String, String)> {
    spawn_cube_logged_to(cube, args, data_dir, &data_dir.join("cube.log"), rust_log).await
}

/// [`spawn_cube_logged_line`], with the log at `log_path` rather than in the data dir (the
/// chaos run fills a worker's data dir and keeps its log readable).
pub(crate) async fn spawn_cube_logged_to(
    cube: &Path,
    args: &[&str],
    data_dir: &Path,
    log_path: &Path,
    rust_log: &str,
) -> anyhow::Result<(Child, String, String)> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let mut command = tokio::process::Command::new(cube);
    command.args(args);
    // A benchmark drives a server from this one machine with as many clients (simulated
    // workers among them) as it measures: the per-client connection bound would cut them.
    if matches!(args.first(), Some(&"manager" | &"worker" | &"dev")) {
        command.args(["--max-connections-per-client", "1000000"]);
    }
    let mut child = command
        .arg("--data-dir")
        .arg(data_dir)
        .env("RUST_LOG", rust_log)
        .stdout(std::process::Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| {
            format!(
                "starting {} (build it with cargo build --release)",
                cube.display()
            )
        })?;
    let stdout = child.stdout.take().context("cube's stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).await?;
    match cube_api::address_in_listening_line(&line) {
        Some(base) => {
            let base = base.to_string();
            Ok((child, base, line))
        }
        None => {
            let log = std::fs::read_to_string(log_path).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            bail!(
                "cube {args:?} did not print its address: {line:?}; its log ends: {:?}",
                tail.into_iter().rev().collect::<Vec<_>>()
            )
        }
    }
}

/// The CA fingerprint `cube manager --tls` prints at the end of its listening line
/// (`… listening on https://… (CA fingerprint: 3f9a…)`), as `--ca-fingerprint` takes it; `None`
/// for a manager without TLS.
pub(crate) fn ca_fingerprint_in_line(line: &str) -> Option<String> {
    let (_, rest) = line.split_once("(CA fingerprint: ")?;
    let (fingerprint, _) = rest.split_once(')')?;
    cube_api::tls::normalize_fingerprint(fingerprint)
}

/// Where a `cube` process keeps its state (its `--dbtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum DbType {
    /// A redb file, a committed transaction per acknowledged write.
    Persistent,
    /// Memory only.
    Memory,
}

impl DbType {
    pub(crate) fn as_arg(self) -> &'static str {
        match self {
            DbType::Persistent => "persistent",
            DbType::Memory => "memory",
        }
    }
}

/// A `cube manager` on a store in `data_dir`, as a child process killed with SIGKILL when
/// dropped.
pub(crate) struct ManagerProcess {
    child: Child,
    pub(crate) base: String,
    pub(crate) pid: u32,
    /// The cluster CA's fingerprint, printed by a manager started with `--tls`.
    pub(crate) ca_fingerprint: Option<String>,
}

impl ManagerProcess {
    /// A manager on `port` (0: any) with the flags given.
    pub(crate) async fn start_with(
        cube: &Path,
        data_dir: &Path,
        port: u16,
        flags: &[&str],
    ) -> anyhow::Result<ManagerProcess> {
        let port = port.to_string();
        let mut args = vec!["manager", "-H", "127.0.0.1", "-p", &port];
        args.extend_from_slice(flags);
        ManagerProcess::spawn(cube, &args, data_dir).await
    }

    async fn spawn(cube: &Path, args: &[&str], data_dir: &Path) -> anyhow::Result<ManagerProcess> {
        // `CUBE_BENCH_MANAGER_LOG` (a `RUST_LOG`, say `info`) to read more of what a
        // manager does than its warnings.
        let level = std::env::var("CUBE_BENCH_MANAGER_LOG").unwrap_or_else(|_| "warn".into());
        let (child, base, line) = spawn_cube_logged_line(cube, args, data_dir, &level).await?;
        let pid = child.id().context("the manager exited as it started")?;
        Ok(ManagerProcess {
            child,
            base,
            pid,
            ca_fingerprint: ca_fingerprint_in_line(&line),
        })
    }

    pub(crate) async fn start(
        cube: &Path,
        data_dir: &Path,
        dbtype: DbType,
    ) -> anyhow::Result<ManagerProcess> {
        ManagerProcess::spawn(
            cube,
            &[
                "manager",
                "-H",
                "127.0.0.1",
                "-p",
                "0",
                "-d",
                dbtype.as_arg(),
            ],
            data_dir,
        )
        .await
    }

    /// `kill -9`, and waits until the process is gone (its store file is closed).
    pub(crate) async fn kill(mut self) -> anyhow::Result<()> {
        self.child.kill().await.context("killing the manager")
    }
}

/// What several benchmarks start with: one `cube manager` on a store of its own in a
/// temporary directory, an HTTP client with a long timeout (loads of thousands of tasks) and
/// `workers` simulated workers joined to it.
pub(crate) struct SimCluster {
    /// Removed when the cluster is dropped: keep it as long as the manager runs.
    pub(crate) _data_dir: tempfile::TempDir,
    pub(crate) manager: ManagerProcess,
    pub(crate) http: reqwest::Client,
    pub(crate) sim: SimWorkers,
}

impl SimCluster {
    pub(crate) async fn start(
        cube: &Path,
        dbtype: DbType,
        workers: usize,
    ) -> anyhow::Result<SimCluster> {
        let data_dir = tempfile::tempdir()?;
        let manager = ManagerProcess::start(cube, data_dir.path(), dbtype).await?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(300))
            .build()?;
        let sim = SimWorkers::start(&http, &manager.base, workers).await?;
        Ok(SimCluster {
            _data_dir: data_dir,
            manager,
            http,
            sim,
        })
    }
}

/// `cube-bench sim-workers` as a child process, registered with a manager; killed when dropped.
pub(crate) struct SimWorkers {
    child: Child,
    pub(crate) pid: u32,
}

impl SimWorkers {
    /// Starts `count` simulated workers and waits until the manager lists them all `Ready`.
    pub(crate) async fn start(
        http: &reqwest::Client,
        manager: &str,
        count: usize,
    ) -> anyhow::Result<SimWorkers> {
        SimWorkers::start_on(http, manager, manager, count).await
    }

    /// [`SimWorkers::start`] with `managers` (comma-separated, several managers sharing
    /// etcd) for their heartbeats, and `manager` to ask for the nodes.
    pub(crate) async fn start_on(
        http: &reqwest::Client,
        managers: &str,
        manager: &str,
        count: usize,
    ) -> anyhow::Result<SimWorkers> {
        // Heartbeats as often as `cube worker`'s default.
        let sim = SimWorkers::spawn(managers, count, "sim", "2s").await?;
        await_ready_nodes(http, manager, count).await?;
        Ok(sim)
    }

    /// Starts `count` simulated workers named `PREFIX-N` with the heartbeat interval given,
    /// and waits until they listen (not until the manager lists them).
    pub(crate) async fn spawn(
        managers: &str,
        count: usize,
        prefix: &str,
        heartbeat_interval: &str,
    ) -> anyhow::Result<SimWorkers> {
        SimWorkers::spawn_sized(managers, count, prefix, heartbeat_interval, None).await
    }

    /// [`SimWorkers::spawn`], each worker offering `memory` (`sim-workers --memory`, e.g.
    /// `64MiB`) when given.
    pub(crate) async fn spawn_sized(
        managers: &str,
        count: usize,
        prefix: &str,
        heartbeat_interval: &str,
        memory: Option<&str>,
    ) -> anyhow::Result<SimWorkers> {
        let this = std::env::current_exe().context("finding cube-bench's own binary")?;
        let mut command = tokio::process::Command::new(&this);
        command
            .args(["sim-workers", "--manager", managers, "--count"])
            .arg(count.to_string())
            .args(["--name-prefix", prefix])
            .args(["--heartbeat-interval", heartbeat_interval]);
        if let Some(memory) = memory {
            command.args(["--memory", memory]);
        }
        let mut child = command
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {} sim-workers", this.display()))?;
        let stdout = child.stdout.take().context("sim-workers' stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).await?;
        if !line.starts_with(READY_LINE) {
            bail!("sim-workers did not start: {line:?}");
        }
        let pid = child.id().context("sim-workers exited as it started")?;
        Ok(SimWorkers { child, pid })
    }

    pub(crate) async fn stop(mut self) -> anyhow::Result<()> {
        self.child.kill().await.context("stopping sim-workers")
    }
}

/// Waits until the manager lists at least `count` nodes, all `Ready`.
pub(crate) async fn await_ready_nodes(
    http: &reqwest::Client,
    manager: &str,
    count: usize,
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let nodes = nodes(http, manager).await?;
        let ready = nodes
            .iter()
            .filter(|node| node.status == cube_types::NodeStatus::Ready)
            .count();
        if ready >= count {
            return Ok(());
        }
        if started.elapsed() > crate::RUN_BOUND {
            bail!(
                "only {ready} of {count} simulated workers registered within {:?}",
                crate::RUN_BOUND
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) async fn nodes(http: &reqwest::Client, manager: &str) -> anyhow::Result<Vec<Node>> {
    crate::get_json(http, &format!("{manager}/nodes")).await
}

/// Every task the manager holds (`GET /tasks`, the whole body read and parsed).
pub(crate) async fn tasks(http: &reqwest::Client, manager: &str) -> anyhow::Result<Vec<Task>> {
    crate::get_json(http, &format!("{manager}/tasks")).await
}

/// Submits the tasks `{prefix}-{first}` .. `{prefix}-{end - 1}`, `LOAD_CONCURRENCY` at a
/// time; fails at the first submission not acknowledged with 201.
pub(crate) async fn load_tasks(
    http: &reqwest::Client,
    manager: &str,
    prefix: &str,
    first: usize,
    end: usize,
) -> anyhow::Result<()> {
    let next = Arc::new(AtomicUsize::new(first));
    let mut clients = JoinSet::new();
    for _ in 0..LOAD_CONCURRENCY {
        let (http, manager, prefix, next) = (
            http.clone(),
            manager.to_string(),
            prefix.to_string(),
            next.clone(),
        );
        clients.spawn(async move {
            loop {
                let number = next.fetch_add(1, Ordering::Relaxed);
                if number >= end {
                    return anyhow::Ok(());
                }
                let task = small_task(&format!("{prefix}-{number}"));
                crate::submit(&http, &manager, &task)
                    .await
                    .with_context(|| format!("submitting task {number}"))?;
            }
        });
    }
    while let Some(client) = clients.join_next().await {
        client.context("a loading client panicked")??;
    }
    Ok(())
}

/// Waits until the nodes' `TaskCount`s (tasks `Scheduled` or `Running` there) add up to
/// `total`. Reads `GET /nodes` only, so the manager never builds the task list meanwhile.
pub(crate) async fn await_placed(
    http: &reqwest::Client,
    manager: &str,
    total: usize,
) -> anyhow::Result<()> {
    await_count(total, "placed", Duration::from_millis(500), || async {
        Ok(nodes(http, manager)
            .await?
            .iter()
            .map(|node| node.task_count)
            .sum())
    })
    .await
}

/// Waits until `GET /tasks` shows at least `total` tasks `Running`; each look is a full
/// `GET /tasks`, so it is asked every 2 s only.
pub(crate) async fn await_running(
    http: &reqwest::Client,
    manager: &str,
    total: usize,
) -> anyhow::Result<()> {
    await_count(total, "Running", Duration::from_secs(2), || async {
        let tasks = tasks(http, manager).await?;
        if let Some(failed) = tasks.iter().find(|task| task.status.state == State::Failed) {
            bail!("task {} failed: {:?}", failed.name, failed.status.run.error);
        }
        Ok(tasks
            .iter()
            .filter(|task| task.status.state == State::Running)
            .count())
    })
    .await
}

/// Polls `count` every `interval` until it reaches `total`; fails when it stops moving for
/// [`NO_PROGRESS_BOUND`].
async fn await_count<F, Fut>(
    total: usize,
    what: &str,
    interval: Duration,
    mut count: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<usize>>,
{
    let mut best = 0;
    let mut moved = Instant::now();
    loop {
        let now = count().await?;
        if now >= total {
            return Ok(());
        }
        if now > best {
            best = now;
            moved = Instant::now();
        } else if moved.elapsed() > NO_PROGRESS_BOUND {
            bail!("stuck at {now} of {total} tasks {what} for {NO_PROGRESS_BOUND:?}");
        }
        tokio::time::sleep(interval).await;
    }
}

/// A process's resident memory now and at its peak (`VmRSS`, `VmHWM` in /proc), in MB
/// (10^6 bytes).
pub(crate) fn memory_mb(pid: u32) -> anyhow::Result<(f64, f64)> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let field = |name: &str| -> anyhow::Result<f64> {
        let line = status
            .lines()
            .find(|line| line.starts_with(name))
            .with_context(|| format!("no {name} in {path}"))?;
        let kib: f64 = line
            .trim_start_matches(name)
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .with_context(|| format!("{path}: {line:?}"))?;
        Ok(kib * 1024.0 / 1e6)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_fingerprint_is_read_from_a_tls_managers_line_only() {
        let fingerprint = "3f".repeat(32);
        let line = format!(
            "cube manager listening on https://127.0.0.1:5555 (scheduler: epvm, store: redb) (CA \
             fingerprint: {fingerprint})\n"
        );
        assert_eq!(ca_fingerprint_in_line(&line), Some(fingerprint.clone()));
        let upper = line.replace(&fingerprint, &fingerprint.to_uppercase());
        assert_eq!(ca_fingerprint_in_line(&upper), Some(fingerprint));
        assert_eq!(
            ca_fingerprint_in_line("cube manager listening on http://127.0.0.1:5555\n"),
            None
        );
        assert_eq!(
            ca_fingerprint_in_line("listening on https://127.0.0.1:1 (CA fingerprint: 3f9a)"),
            None
        );
    }
}
