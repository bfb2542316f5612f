//! `cube-bench scale`: a service of 50 copies scaled to 100 and back to 50 — Cube's service job
//! next to `docker service scale` — the two taking turns going first within each run of one
//! session. Each side first gets its 50 running (untimed), then two phases are timed:
//!
//! - up, 50 → 100: Cube from `POST /jobs/{name}/scale` until the manager's summary of the
//!   group (`GET /jobs/{name}`, polled every 10 ms) counts 100 running; Swarm from `docker
//!   service scale --detach NAME=100` until Docker lists 100 running containers of the service
//!   (polled every 10 ms).
//! - down, 100 → 50: Cube until the summary counts exactly 50 running and none waiting, and
//!   Docker lists exactly 50 running containers with the worker's label; Swarm until Docker
//!   lists exactly 50 running containers of the service. Both sides are done when the extra
//!   containers have stopped: Cube's worker keeps a stopped copy's container for its logs
//!   (until the task is removed), so "gone from Docker" is no event of Cube's any more, and
//!   both sides stop at the same one.
//!
//! The CLI's own start-up (tens of ms) is inside Swarm's times, as in `burst`. Between sides
//! every container is removed and waited for (Cube's stopped ones through Docker, once none
//! runs). Whatever happens, the job is stopped, the
//! service removed, the swarm left as it was found, and any container of the benchmark's
//! worker that is still there at the end is force-removed.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bollard::Docker;
use cube_runtime::DockerRuntime;
use cube_runtime::sample_image::SAMPLE_IMAGE;

use crate::containers::{self, Listed};
use crate::service_job::ServiceJob;
use crate::swarm::Swarm;
use crate::{BenchCluster, PARALLELISM, Summary, Through};

const SERVICE: &str = "cube-bench-scale";

/// How long one phase (or the first `from` copies) may take before the run is abandoned.
const PHASE_BOUND: Duration = Duration::from_secs(180);

/// The two peers, in the order they are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Cube,
    Swarm,
}

/// One side's two timed phases in one run, in ms.
#[derive(Debug, Clone, Copy)]
struct PhaseTimes {
    up_ms: f64,
    down_ms: f64,
}

pub(crate) async fn scale(runs: usize, from: usize, to: usize, cube: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(runs > 0, "--runs must be at least 1");
    anyhow::ensure!(
        from > 0 && to > from,
        "--from must be at least 1 and --to more than --from"
    );
    let docker = crate::containers::connect().await?;
    let runtime = DockerRuntime::connect().await?;
    runtime.ensure_sample_image(SAMPLE_IMAGE).await?;
    let cluster = BenchCluster::start(cube, Through::Manager).await?;
    let swarm = Swarm::join()?.with_service(SERVICE);

    let outcome = measure(&docker, &cluster, &swarm, runs, from, to).await;
    // Removes the service, and leaves the swarm when this benchmark initialised it.
    drop(swarm);
    cluster.stop_and_sweep(&docker).await;
    let times = outcome?;
    print_tables(&times, runs, from, to);
    Ok(())
}

/// Every run, each side in turn; the times of each run as (Cube, Swarm).
async fn measure(
    docker: &Docker,
    cluster: &BenchCluster,
    swarm: &Swarm,
    runs: usize,
    from: usize,
    to: usize,
) -> anyhow::Result<Vec<(PhaseTimes, PhaseTimes)>> {
    let mut times = Vec::with_capacity(runs);
    for run in 0..runs {
        let order = if run % 2 == 0 {
            [Side::Cube, Side::Swarm]
        } else {
            [Side::Swarm, Side::Cube]
        };
        let (mut cube_times, mut swarm_times) = (None, None);
        for side in order {
            match side {
                Side::Cube => cube_times = Some(cube_scale(docker, cluster, run, from, to).await?),
                Side::Swarm => swarm_times = Some(swarm_scale(docker, swarm, from, to).await?),
            }
        }
        let (Some(cube_times), Some(swarm_times)) = (cube_times, swarm_times) else {
            bail!("run {}: a side was not measured", run + 1);
        };
        eprintln!(
            "run {}: {from} → {to}: Cube {:.0} ms, Swarm {:.0} ms; {to} → {from}: Cube {:.0} ms, \
             Swarm {:.0} ms",
            run + 1,
            cube_times.up_ms,
            swarm_times.up_ms,
            cube_times.down_ms,
            swarm_times.down_ms
        );
        times.push((cube_times, swarm_times));
    }
    Ok(times)
}

/// A service job of `from` copies, scaled to `to` and back; the job is stopped and its
/// containers waited for whether or not the phases succeeded.
async fn cube_scale(
    docker: &Docker,
    cluster: &BenchCluster,
    run: usize,
    from: usize,
    to: usize,
) -> anyhow::Result<PhaseTimes> {
    let job = ServiceJob::submit(cluster, &format!("scale-{run}"), from).await?;
    let phases = cube_phases(docker, cluster, &job, from, to).await;
    let stopped = job.stop().await;
    let label = cluster.container_label();
    let gone = match containers::await_none_running(docker, &label).await {
        Ok(()) => containers::remove_stopped(docker, &label).await,
        Err(err) => Err(err),
    };
    let times = phases?;
    stopped?;
    gone?;
    Ok(times)
}

async fn cube_phases(
    docker: &Docker,
    cluster: &BenchCluster,
    job: &ServiceJob<'_>,
    from: usize,
    to: usize,
) -> anyhow::Result<PhaseTimes> {
    job.await_running(from, Instant::now(), PHASE_BOUND)
        .await
        .context("the first copies")?;

    let started = Instant::now();
    job.scale(to).await?;
    let up = job.await_running(to, started, PHASE_BOUND).await?;

    let label = cluster.container_label();
    let started = Instant::now();
    job.scale(from).await?;
    let down = job
        .await_counts(started, PHASE_BOUND, async |counts| {
            Ok(counts.running == from
                && counts.waiting() == 0
                && containers::with_label(docker, &label, Listed::Running)
                    .await?
                    .len()
                    == from)
        })
        .await?;
    Ok(PhaseTimes {
        up_ms: up.as_secs_f64() * 1000.0,
        down_ms: down.as_secs_f64() * 1000.0,
    })
}

/// A Swarm service of `from` replicas, scaled to `to` and back; the service is removed and its
/// containers waited for whether or not the phases succeeded.
async fn swarm_scale(
    docker: &Docker,
    swarm: &Swarm,
    from: usize,
    to: usize,
) -> anyhow::Result<PhaseTimes> {
    let phases = swarm_phases(docker, swarm, from, to).await;
    swarm.remove_service();
    let gone = swarm.await_gone(docker).await;
    let times = phases?;
    gone?;
    Ok(times)
}

async fn swarm_phases(
    docker: &Docker,
    swarm: &Swarm,
    from: usize,
    to: usize,
) -> anyhow::Result<PhaseTimes> {
    swarm.create(from, &[])?;
    swarm
        .await_running(docker, from, Instant::now(), PHASE_BOUND)
        .await
        .context("the first replicas")?;

    let started = Instant::now();
    swarm.scale(to)?;
    let up = swarm
        .await_running(docker, to, started, PHASE_BOUND)
        .await?;

    let started = Instant::now();
    swarm.scale(from)?;
    loop {
        let running = swarm.running(docker).await?.len();
        if running == from {
            break;
        }
        if started.elapsed() > PHASE_BOUND {
            bail!("Swarm has {running} running containers after {PHASE_BOUND:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let down = started.elapsed();
    Ok(PhaseTimes {
        up_ms: up.as_secs_f64() * 1000.0,
        down_ms: down.as_secs_f64() * 1000.0,
    })
}

fn print_tables(times: &[(PhaseTimes, PhaseTimes)], runs: usize, from: usize, to: usize) {
    println!(
        "scale: a service of {from} scaled to {to} and back, {runs} runs, image {SAMPLE_IMAGE}, \
         {PARALLELISM} starts at a time for Cube's worker"
    );
    let up: Vec<(f64, f64)> = times
        .iter()
        .map(|(cube, swarm)| (cube.up_ms, swarm.up_ms))
        .collect();
    print_phase(
        &format!("{from} → {to}"),
        &format!("POST /jobs/{{name}}/scale to {to} → {to} running"),
        &format!("service scale NAME={to} → {to} running"),
        &up,
    );
    let down: Vec<(f64, f64)> = times
        .iter()
        .map(|(cube, swarm)| (cube.down_ms, swarm.down_ms))
        .collect();
    print_phase(
        &format!("{to} → {from}"),
        &format!("POST /jobs/{{name}}/scale to {from} → {from} running, the rest stopped"),
        &format!("service scale NAME={from} → {from} running, the rest stopped"),
        &down,
    );
}

/// One phase's table: each side's median, min and max, and the ratio taken run by run.
fn print_phase(title: &str, cube_path: &str, swarm_path: &str, times_ms: &[(f64, f64)]) {
    let mut cube_ms: Vec<f64> = times_ms.iter().map(|(cube, _)| *cube).collect();
    let mut swarm_ms: Vec<f64> = times_ms.iter().map(|(_, swarm)| *swarm).collect();
    let mut ratios: Vec<f64> = times_ms.iter().map(|(cube, swarm)| cube / swarm).collect();
    println!();
    println!("{title}:");
    println!();
    println!("| path | median | min | max |");
    println!("|---|---:|---:|---:|");
    println!(
        "| Cube: {cube_path}, ms | {} |",
        Summary::of(&mut cube_ms).spread(0)
    );
    println!(
        "| Docker Swarm: {swarm_path}, ms | {} |",
        Summary::of(&mut swarm_ms).spread(0)
    );
    println!(
        "| ratio run by run, Cube / Swarm | {} |",
        Summary::of(&mut ratios).ratios()
    );
}
