//! `cube-bench c1m`: a million tasks on one manager, end to end through the API (issue 30).
//!
//! One `cube manager` on its redb file and `--workers` simulated workers (the real worker code
//! on the in-memory runtime, `cube-bench sim-workers`, spread over `--processes` child
//! processes so that one process's scheduler does not bound them). The tasks go in as the
//! issue asks: `(tasks - bare) / job-size` service jobs of `--job-size` copies (`POST /jobs`),
//! and `--bare` bare tasks (`POST /tasks`, `LOAD_CONCURRENCY` at a time), all at once. Every
//! 5 s a row: tasks placed and running (the manager's `cube_tasks` gauges), placements per
//! second over the last 5 s (`cube_placements_total`), the manager's RSS, the simulated
//! workers' (their processes summed) and the manager's store file's size. Then the totals:
//! the time from the first submission until every task is `Running`, the manager's and the
//! simulated workers' RSS then; the manager killed and started again on the same file: the
//! time until it serves a read and its RSS; and the count check (every task once, each
//! `Running` on a node, the nodes' task counts adding up). `--quick` is the quick
//! figure: 100,000 tasks on 500 workers.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cube_runtime::sample_image::SAMPLE_IMAGE;
use serde_json::json;
use tokio::task::JoinSet;

use crate::load::{self, DbType, ManagerProcess, SimWorkers};

pub(crate) struct Options {
    pub tasks: usize,
    pub job_size: usize,
    pub bare: usize,
    pub workers: usize,
    pub processes: usize,
    /// How often each simulated worker sends its heartbeat.
    pub heartbeat: String,
    /// The manager's `--max-concurrent-reconciles`.
    pub reconciles: u32,
}

impl Options {
    /// The quick figure: 100,000 tasks (nine jobs of 10,000 and 10,000 bare) on 500
    /// simulated workers.
    pub(crate) fn quick() -> Options {
        Options {
            tasks: 100_000,
            job_size: 10_000,
            bare: 10_000,
            workers: 500,
            processes: 2,
            heartbeat: "5s".to_owned(),
            reconciles: 64,
        }
    }

    fn jobs(&self) -> usize {
        self.tasks.saturating_sub(self.bare) / self.job_size.max(1)
    }

    /// What is really submitted: whole jobs, then the bare tasks.
    fn total(&self) -> usize {
        self.jobs() * self.job_size + self.bare
    }
}

/// How often a row is printed.
const EVERY: Duration = Duration::from_secs(5);
/// The run gives up when nothing has moved for this long.
const STALL_BOUND: Duration = Duration::from_secs(120);

/// What one look at the manager's `/metrics` says.
#[derive(Debug, Default, Clone, Copy)]
struct Look {
    total: u64,
    running: u64,
    pending: u64,
    placements: u64,
}

async fn look(http: &reqwest::Client, base: &str) -> anyhow::Result<Look> {
    let text = http
        .get(format!("{base}/metrics"))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    Ok(parse_look(&text))
}

/// The task gauges and the placement counter of a Prometheus text exposition.
fn parse_look(text: &str) -> Look {
    let mut look = Look::default();
    for line in text.lines().filter(|line| !line.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let value = value as u64;
        if let Some(labels) = name.strip_prefix("cube_tasks{") {
            look.total += value;
            if labels.contains("\"Running\"") {
                look.running += value;
            } else if labels.contains("\"Pending\"") {
                look.pending += value;
            }
        } else if name == "cube_placements_total" {
            look.placements = value;
        }
    }
    look
}

/// The simulated workers' processes' RSS and peak RSS, summed.
fn sims_mb(sims: &[SimWorkers]) -> anyhow::Result<(f64, f64)> {
    sims.iter().try_fold((0.0, 0.0), |(rss, peak), sim| {
        let (one, one_peak) = load::memory_mb(sim.pid)?;
        Ok((rss + one, peak + one_peak))
    })
}

fn file_mb(path: &Path) -> f64 {
    std::fs::metadata(path).map_or(0.0, |meta| meta.len() as f64 / 1e6)
}

/// The manager on its redb file in `data_dir`, started or started again. The simulated
/// workers' heartbeats may be late on a busy machine: a node marked down would have its tasks
/// placed again, which is not what is measured.
async fn start_manager(
    cube: &Path,
    data_dir: &Path,
    reconciles: u32,
) -> anyhow::Result<ManagerProcess> {
    ManagerProcess::start_with(
        cube,
        data_dir,
        0,
        &[
            "-d",
            DbType::Persistent.as_arg(),
            "--heartbeat-grace",
            "120s",
            "--max-concurrent-reconciles",
            &reconciles.to_string(),
        ],
    )
    .await
}

pub(crate) async fn c1m(options: Options, cube: &Path) -> anyhow::Result<()> {
    let total = options.total();
    anyhow::ensure!(
        total > 0,
        "nothing to submit: --tasks must be more than --bare"
    );
    let processes = options.processes.clamp(1, options.workers.max(1));
    println!(
        "c1m: {total} tasks ({} jobs of {} and {} bare) on {} simulated workers in {processes} \
         processes (heartbeat every {}), one manager on redb",
        options.jobs(),
        options.job_size,
        options.bare,
        options.workers,
        options.heartbeat
    );
    let data_dir = tempfile::Builder::new().prefix("cube-c1m-").tempdir()?;
    let store_file = data_dir.path().join("manager.redb");
    let manager = start_manager(cube, data_dir.path(), options.reconciles).await?;
    let base = manager.base.clone();
    let address = base.trim_start_matches("http://").to_owned();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()?;

    let began = Instant::now();
    let mut sims = Vec::new();
    for process in 0..processes {
        let count =
            options.workers / processes + usize::from(process < options.workers % processes);
        sims.push(
            SimWorkers::spawn(
                &address,
                count,
                &format!("c1m{process}"),
                &options.heartbeat,
            )
            .await?,
        );
    }
    load::await_ready_nodes(&http, &base, options.workers).await?;
    println!(
        "{} workers ready in {:.1} s; the manager at {:.0} MB",
        options.workers,
        began.elapsed().as_secs_f64(),
        load::memory_mb(manager.pid)?.0
    );

    let started = Instant::now();
    let mut submitting = JoinSet::new();
    for job in 0..options.jobs() {
        let (http, base, size) = (http.clone(), base.clone(), options.job_size);
        submitting.spawn(async move {
            let body = json!({"Name": format!("c1m-{job}"), "Type": "service",
                              "Groups": [{"Name": "g", "Count": size,
                                          "Task": {"Image": SAMPLE_IMAGE, "Memory": "8MiB"}}]});
            let answer = http.post(format!("{base}/jobs")).json(&body).send().await?;
            anyhow::ensure!(
                answer.status().is_success(),
                "POST /jobs of c1m-{job} answered {}: {}",
                answer.status(),
                answer.text().await.unwrap_or_default()
            );
            Ok(())
        });
    }
    {
        let (http, base, bare) = (http.clone(), base.clone(), options.bare);
        submitting.spawn(async move { load::load_tasks(&http, &base, "c1m-bare", 0, bare).await });
    }

    println!();
    println!(
        "| s | submitted | placed | running | placements/s | manager RSS MB | simulated workers RSS MB | store file MB |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut last = Look::default();
    let mut moved = Instant::now();
    let mut submitted_in = None;
    let mut tick = tokio::time::interval(EVERY);
    tick.tick().await;
    let running_in = loop {
        tokio::select! {
            joined = submitting.join_next(), if !submitting.is_empty() => {
                if let Some(joined) = joined {
                    joined.context("a submitter")??;
                }
                if submitting.is_empty() {
                    submitted_in = Some(started.elapsed());
                }
                continue;
            }
            _ = tick.tick() => {}
        }
        let now = look(&http, &base).await?;
        println!(
            "| {:.0} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} |",
            started.elapsed().as_secs_f64(),
            now.total,
            now.total.saturating_sub(now.pending),
            now.running,
            now.placements.saturating_sub(last.placements) as f64 / EVERY.as_secs_f64(),
            load::memory_mb(manager.pid)?.0,
            sims_mb(&sims)?.0,
            file_mb(&store_file)
        );
        if now.running >= total as u64 && submitted_in.is_some() {
            break started.elapsed();
        }
        if now.running != last.running || now.total != last.total {
            moved = Instant::now();
        } else if moved.elapsed() > STALL_BOUND {
            bail!(
                "stalled: {} of {total} tasks running, nothing moved for {STALL_BOUND:?}",
                now.running
            );
        }
        last = now;
    };
    let (rss_mb, peak_mb) = load::memory_mb(manager.pid)?;
    let (sims_rss_mb, sims_peak_mb) = sims_mb(&sims)?;
    let end = look(&http, &base).await?;
    let nodes = load::nodes(&http, &base).await?;
    let on_nodes: usize = nodes.iter().map(|node| node.task_count).sum();
    let store_mb = file_mb(&store_file);
    manager.kill().await?;

    let restarted = Instant::now();
    let again = start_manager(cube, data_dir.path(), options.reconciles).await?;
    let listening_in = restarted.elapsed();
    let first_read: serde_json::Value =
        crate::get_json(&http, &format!("{}/tasks?limit=1", again.base)).await?;
    let read_in = restarted.elapsed();
    anyhow::ensure!(
        first_read.as_array().is_some_and(|tasks| !tasks.is_empty()),
        "the restarted manager lists no task"
    );
    let after = look(&http, &again.base).await?;
    let (restarted_rss_mb, _) = load::memory_mb(again.pid)?;
    again.kill().await?;
    for sim in sims {
        sim.stop().await?;
    }

    println!();
    println!("| measure | value | target (issue 30) |");
    println!("|---|---|---|");
    println!(
        "| tasks submitted (POST /jobs and POST /tasks answered) | {:.1} s | |",
        submitted_in.unwrap_or_default().as_secs_f64()
    );
    let target = if total >= 1_000_000 {
        "≤ 120 s"
    } else {
        "≤ 15 s at 100,000"
    };
    println!(
        "| first submission → all {total} Running | {:.1} s ({:.0} tasks/s) | {target} |",
        running_in.as_secs_f64(),
        total as f64 / running_in.as_secs_f64()
    );
    let rss_target = if total >= 1_000_000 {
        "≤ 1,000 MB"
    } else {
        "≤ 100 MB at 100,000"
    };
    println!("| manager RSS, all Running (peak) | {rss_mb:.0} MB ({peak_mb:.0}) | {rss_target} |");
    let sims_target = if total >= 1_000_000 {
        ""
    } else {
        "≤ 200 MB at 100,000"
    };
    println!(
        "| simulated workers' RSS, all Running (peak), {processes} processes summed | \
         {sims_rss_mb:.0} MB ({sims_peak_mb:.0}) | {sims_target} |"
    );
    println!("| store file | {store_mb:.0} MB | |");
    println!(
        "| manager restarted: listening, first GET /tasks answered | {:.1} s, {:.1} s | reads within 10 s |",
        listening_in.as_secs_f64(),
        read_in.as_secs_f64()
    );
    println!("| manager RSS after the restart | {restarted_rss_mb:.0} MB | {rss_target} |");
    let counts_hold = end.total == total as u64
        && end.running == total as u64
        && on_nodes == total
        && after.total == total as u64;
    println!(
        "| tasks held / Running / on the nodes / after the restart | {} / {} / {on_nodes} / {} | \
         {total} each: {} |",
        end.total,
        end.running,
        after.total,
        if counts_hold { "yes" } else { "NO" }
    );
    anyhow::ensure!(
        counts_hold,
        "tasks lost or duplicated: {} held, {} running, {on_nodes} on the nodes, {} after a \
         restart, of {total}",
        end.total,
        end.running,
        after.total
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tasks_are_whole_jobs_then_the_bare_ones() {
        let million = Options {
            tasks: 1_000_000,
            job_size: 10_000,
            bare: 10_000,
            workers: 10_000,
            processes: 4,
            heartbeat: "10s".to_owned(),
            reconciles: 64,
        };
        assert_eq!((million.jobs(), million.total()), (99, 1_000_000));
        let quick = Options::quick();
        assert_eq!((quick.jobs(), quick.total()), (9, 100_000));
        let uneven = Options {
            tasks: 25_500,
            ..Options::quick()
        };
        assert_eq!((uneven.jobs(), uneven.total()), (1, 20_000));
    }

    #[test]
    fn a_look_reads_the_task_gauges_and_the_placements() {
        let text = "# HELP cube_tasks Tasks by state\n\
                    cube_tasks{state=\"Pending\"} 5\n\
                    cube_tasks{state=\"Running\"} 90\n\
                    cube_tasks{state=\"Completed\"} 5\n\
                    cube_placements_total 95\n\
                    cube_tasks_other 7\n";
        let look = parse_look(text);
        assert_eq!(
            (look.total, look.running, look.pending, look.placements),
            (100, 90, 5, 95)
        );
    }
}
