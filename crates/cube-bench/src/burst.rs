//! `cube-bench burst`: 50 tasks asked for at once, until all of them run — Cube (manager and
//! worker), raw Docker at the worker's parallelism, and Docker Swarm (`docker service create
//! --replicas 50`), the three taking turns within each run of one session.
//!
//! - Cube: 50 `POST /tasks` sent together; done when `GET /tasks` (polled every 10 ms) lists
//!   all 50 `Running`. The worker starts at most [`PARALLELISM`] containers at a time. With
//!   `--as-job`, one `POST /jobs` of a service job with `Count` 50 instead; done when
//!   `GET /jobs/{name}` counts 50 running.
//! - raw Docker: 50 bollard create + start, [`PARALLELISM`] at a time; done when the last
//!   start returns (Docker reports a container running when start returns).
//! - Swarm: from the `docker service create --detach` call until Docker lists 50 running
//!   containers of the service (polled every 10 ms). The CLI's own start-up (tens of ms) is
//!   inside Swarm's time.
//!
//! Between sides every container is removed and the next side waits until they are gone, so
//! no side meets a Docker still busy cleaning up after another: Cube's tasks are stopped
//! through the API and, once none runs, their stopped containers (which the worker keeps for
//! their logs) are removed through Docker; raw Docker's are removed; Swarm's service is
//! removed and waited for until Docker lists none of its containers.
//!
//! With fewer than 20 runs a 95th percentile is the largest time, so the table says max, not
//! p95.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use bollard::Docker;
use cube_runtime::sample_image::SAMPLE_IMAGE;
use cube_runtime::{ContainerSpec, DockerRuntime, Runtime};
use cube_types::Task;
use serde_json::json;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::containers;
use crate::service_job::ServiceJob;
use crate::swarm::Swarm;
use crate::{BenchCluster, PARALLELISM, RAW_NODE, Summary, Through};

const SERVICE: &str = "cube-bench-burst";

/// How long one burst may take before the run is abandoned.
const BURST_BOUND: Duration = Duration::from_secs(180);

pub(crate) async fn burst(
    runs: usize,
    tasks: usize,
    as_job: bool,
    cube: &Path,
) -> anyhow::Result<()> {
    anyhow::ensure!(runs > 0, "--runs must be at least 1");
    anyhow::ensure!(tasks > 0, "--tasks must be at least 1");
    let docker = crate::containers::connect().await?;
    let runtime = DockerRuntime::connect().await?;
    runtime.ensure_sample_image(SAMPLE_IMAGE).await?;
    let cluster = BenchCluster::start(cube, Through::Manager).await?;
    let swarm = Swarm::join()?.with_service(SERVICE);

    let (mut cube_ms, mut raw_ms, mut swarm_ms) = (Vec::new(), Vec::new(), Vec::new());
    let mut ratios = Vec::new();
    for run in 0..runs {
        // Each side goes first in turn.
        let mut times = [0.0; 3];
        for side in (0..3).map(|offset| (run + offset) % 3) {
            times[side] = match side {
                0 if as_job => cube_job_burst(&cluster, &docker, tasks, run).await?,
                0 => cube_burst(&cluster, &docker, tasks, run).await?,
                1 => raw_burst(&runtime, RAW_NODE, tasks, run).await?,
                _ => swarm_burst(&docker, &swarm, tasks).await?,
            };
        }
        eprintln!(
            "run {}: Cube {:.0} ms, raw Docker {:.0} ms, Swarm {:.0} ms",
            run + 1,
            times[0],
            times[1],
            times[2]
        );
        ratios.push((times[0] / times[1], times[0] / times[2]));
        cube_ms.push(times[0]);
        raw_ms.push(times[1]);
        swarm_ms.push(times[2]);
    }
    drop(swarm);
    cluster.stop_and_sweep(&docker).await;

    println!(
        "burst: {tasks} tasks at once until all run, {runs} runs, image {SAMPLE_IMAGE}, \
         {PARALLELISM} starts at a time for Cube's worker and raw Docker"
    );
    println!();
    // A 95th percentile of fewer than 20 runs is the largest of them: call it the max.
    let times_of = |times: &mut Vec<f64>| {
        let summary = Summary::of(times);
        match runs >= 20 {
            true => summary.to_string(),
            false => summary.spread(1),
        }
    };
    match runs >= 20 {
        true => {
            println!("| path | median ms | p95 ms | min ms | max ms |");
            println!("|---|---:|---:|---:|---:|");
        }
        false => {
            println!("| path | median ms | min ms | max ms |");
            println!("|---|---:|---:|---:|");
        }
    }
    let cube_path = if as_job {
        format!("Cube: POST /jobs (a service of {tasks}) → {tasks} running (manager + worker)")
    } else {
        format!("Cube: {tasks} × POST /tasks → all Running (manager + worker)")
    };
    println!("| {cube_path} | {} |", times_of(&mut cube_ms));
    println!(
        "| raw Docker: {tasks} × bollard create + start, {PARALLELISM} at a time | {} |",
        times_of(&mut raw_ms)
    );
    println!(
        "| Docker Swarm: service create --replicas {tasks} → {tasks} running | {} |",
        times_of(&mut swarm_ms)
    );
    println!();
    let mut to_raw: Vec<f64> = ratios.iter().map(|ratio| ratio.0).collect();
    let mut to_swarm: Vec<f64> = ratios.iter().map(|ratio| ratio.1).collect();
    println!("| ratio, run by run | median | min | max |");
    println!("|---|---:|---:|---:|");
    println!(
        "| Cube / raw Docker | {} |",
        Summary::of(&mut to_raw).ratios()
    );
    println!("| Cube / Swarm | {} |", Summary::of(&mut to_swarm).ratios());
    Ok(())
}

/// `tasks` submissions at once; the time until the manager lists them all `Running`, in ms.
async fn cube_burst(
    cluster: &BenchCluster,
    docker: &Docker,
    tasks: usize,
    run: usize,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let mut submissions = JoinSet::new();
    for index in 0..tasks {
        let (http, base) = (cluster.http.clone(), cluster.base.clone());
        let task = json!({"Name": format!("burst-{run}-{index}"), "Image": SAMPLE_IMAGE});
        submissions.spawn(async move { crate::submit(&http, &base, &task).await });
    }
    let mut ids = Vec::with_capacity(tasks);
    while let Some(id) = submissions.join_next().await {
        ids.push(id??);
    }
    loop {
        let listed: Vec<serde_json::Value> =
            crate::get_json(&cluster.http, &format!("{}/tasks", cluster.base)).await?;
        let running = listed
            .iter()
            .filter(|task| {
                task["State"] == "Running"
                    && task["ID"]
                        .as_str()
                        .is_some_and(|id| ids.iter().any(|ours| ours == id))
            })
            .count();
        if running == tasks {
            break;
        }
        if let Some(failed) = listed.iter().find(|task| task["State"] == "Failed") {
            bail!("a task failed: {}", failed["Error"]);
        }
        if started.elapsed() > BURST_BOUND {
            bail!("{running} of {tasks} tasks Running after {BURST_BOUND:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = started.elapsed();
    for id in &ids {
        cluster
            .http
            .delete(format!("{}/tasks/{id}", cluster.base))
            .send()
            .await?;
    }
    containers::await_none_running(docker, &cluster.container_label()).await?;
    containers::remove_stopped(docker, &cluster.container_label()).await?;
    Ok(elapsed.as_secs_f64() * 1000.0)
}

/// One service job of `tasks` copies; the time until the manager counts them all running,
/// in ms.
async fn cube_job_burst(
    cluster: &BenchCluster,
    docker: &Docker,
    tasks: usize,
    run: usize,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let job = ServiceJob::submit(cluster, &format!("burst-{run}"), tasks).await?;
    let elapsed = job.await_running(tasks, started, BURST_BOUND).await?;
    job.stop().await?;
    containers::await_none_running(docker, &cluster.container_label()).await?;
    containers::remove_stopped(docker, &cluster.container_label()).await?;
    Ok(elapsed.as_secs_f64() * 1000.0)
}

/// `tasks` containers created and started through bollard, [`PARALLELISM`] at a time; the
/// time until the last start returns, in ms.
async fn raw_burst(
    runtime: &DockerRuntime,
    node: &str,
    tasks: usize,
    run: usize,
) -> anyhow::Result<f64> {
    let permits = Arc::new(Semaphore::new(PARALLELISM));
    let started = Instant::now();
    let mut starts = JoinSet::new();
    for index in 0..tasks {
        let mut task = Task::new(format!("raw-burst-{run}-{index}"), SAMPLE_IMAGE);
        task.normalize();
        let spec = ContainerSpec::for_task(&task, node);
        let (runtime, permits) = (runtime.clone(), permits.clone());
        starts.spawn(async move {
            let _permit = permits.acquire_owned().await?;
            let id = runtime.create(&spec).await?;
            runtime.start(&id).await?;
            anyhow::Ok(id)
        });
    }
    let mut ids = Vec::with_capacity(tasks);
    while let Some(id) = starts.join_next().await {
        ids.push(id??);
    }
    let elapsed = started.elapsed();
    let mut removals = JoinSet::new();
    for id in ids {
        let runtime = runtime.clone();
        removals.spawn(async move { runtime.remove(&id).await });
    }
    while let Some(removed) = removals.join_next().await {
        removed??;
    }
    Ok(elapsed.as_secs_f64() * 1000.0)
}

/// A service of `tasks` replicas; the time until Docker lists them all running, in ms.
async fn swarm_burst(docker: &Docker, swarm: &Swarm, tasks: usize) -> anyhow::Result<f64> {
    let started = Instant::now();
    swarm.create(tasks, &[])?;
    let elapsed = swarm
        .await_running(docker, tasks, started, BURST_BOUND)
        .await?;
    swarm.remove_service();
    swarm.await_gone(docker).await?;
    Ok(elapsed.as_secs_f64() * 1000.0)
}
