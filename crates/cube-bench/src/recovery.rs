//! `cube-bench recovery`: a task's container is killed (`docker kill`); how long until the
//! task runs again — Cube (restart policy `always`, `RestartDelay` 0s) next to Docker Swarm
//! (a one-replica service with `--restart-delay 0s`), alternating run by run in one session.
//!
//! Both sides are timed from the moment the kill was sent (through the Docker API, not the
//! CLI, so that neither pays the CLI's start-up) until a new container of the task runs:
//! Cube's manager reads `Running` with a new container ID (polled every 2 ms); for Swarm,
//! Docker lists a new running container of the service (polled every 2 ms).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bollard::Docker;
use bollard::query_parameters::KillContainerOptions;
use cube_runtime::sample_image::SAMPLE_IMAGE;
use serde_json::json;

use crate::swarm::Swarm;
use crate::{BenchCluster, RUN_BOUND, Summary, Through};

const SERVICE: &str = "cube-bench-recovery";

pub(crate) async fn recovery(runs: usize, sets: usize, cube: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(runs > 0, "--runs must be at least 1");
    anyhow::ensure!(sets > 0, "--sets must be at least 1");
    let docker = crate::containers::connect().await?;
    cube_runtime::DockerRuntime::connect()
        .await?
        .ensure_sample_image(SAMPLE_IMAGE)
        .await?;

    let cluster = BenchCluster::start(cube, Through::Manager).await?;
    let task = json!({"Name": "recovery", "Image": SAMPLE_IMAGE, "RestartPolicy": "always",
                      "RestartDelay": "0s"});
    let id = crate::submit(&cluster.http, &cluster.base, &task).await?;
    let mut cube_container = cube_running_container(&cluster, &id, None).await?;

    let swarm = Swarm::start(
        SERVICE,
        1,
        &["--restart-condition", "any", "--restart-delay", "0s"],
    )?;
    let mut swarm_container = swarm_running_container(&docker, &swarm, None).await?;

    println!(
        "recovery: docker kill → running again, {sets} sets of {runs} kills each side, image \
         {SAMPLE_IMAGE}; Cube = restart policy always, RestartDelay 0s (manager + worker), \
         Swarm = one replica, --restart-delay 0s"
    );
    println!();
    println!(
        "| set | Cube median ms | Cube p95 ms | Swarm median ms | Swarm p95 ms | ratio of medians |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let (mut cube_medians, mut swarm_medians, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for set in 0..sets {
        let mut cube_ms = Vec::with_capacity(runs);
        let mut swarm_ms = Vec::with_capacity(runs);
        for run in 0..runs {
            for side in if run % 2 == 0 { [0, 1] } else { [1, 0] } {
                if side == 0 {
                    let killed = kill(&docker, &cube_container).await?;
                    cube_container =
                        cube_running_container(&cluster, &id, Some(&cube_container)).await?;
                    cube_ms.push(killed.elapsed().as_secs_f64() * 1000.0);
                } else {
                    let killed = kill(&docker, &swarm_container).await?;
                    swarm_container =
                        swarm_running_container(&docker, &swarm, Some(&swarm_container)).await?;
                    swarm_ms.push(killed.elapsed().as_secs_f64() * 1000.0);
                }
            }
        }
        let (cube_set, swarm_set) = (Summary::of(&mut cube_ms), Summary::of(&mut swarm_ms));
        let ratio = cube_set.median / swarm_set.median;
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {ratio:.2} |",
            set + 1,
            cube_set.median,
            cube_set.p95,
            swarm_set.median,
            swarm_set.p95
        );
        cube_medians.push(cube_set.median);
        swarm_medians.push(swarm_set.median);
        ratios.push(ratio);
    }
    drop(swarm);
    let answer = cluster
        .http
        .delete(format!("{}/tasks/{id}", cluster.base))
        .send()
        .await?;
    anyhow::ensure!(
        answer.status().is_success(),
        "cannot stop the task: {}",
        answer.status()
    );
    // Let the worker stop and remove the container before the cluster goes away.
    cube_running_gone(&docker, &cube_container).await;

    println!();
    println!("| over {sets} sets | median | min | max |");
    println!("|---|---:|---:|---:|");
    println!(
        "| Cube median ms | {} |",
        Summary::of(&mut cube_medians).spread(1)
    );
    println!(
        "| Swarm median ms | {} |",
        Summary::of(&mut swarm_medians).spread(1)
    );
    println!(
        "| ratio of medians, Cube / Swarm | {} |",
        Summary::of(&mut ratios).spread(2)
    );
    Ok(())
}

/// Sends SIGKILL through the Docker API; returns when it was sent.
async fn kill(docker: &Docker, container: &str) -> anyhow::Result<Instant> {
    let sent = Instant::now();
    docker
        .kill_container(container, None::<KillContainerOptions>)
        .await
        .with_context(|| format!("killing {container}"))?;
    Ok(sent)
}

/// Waits until the manager says the task runs in a container other than `old`.
async fn cube_running_container(
    cluster: &BenchCluster,
    id: &str,
    old: Option<&str>,
) -> anyhow::Result<String> {
    let started = Instant::now();
    loop {
        let task: serde_json::Value =
            crate::get_json(&cluster.http, &format!("{}/tasks/{id}", cluster.base)).await?;
        let container = task["ContainerID"].as_str().unwrap_or_default();
        if task["State"] == "Running" && !container.is_empty() && Some(container) != old {
            return Ok(container.to_string());
        }
        if started.elapsed() > RUN_BOUND {
            bail!("task {id} not running again within {RUN_BOUND:?}: {task}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn cube_running_gone(docker: &Docker, container: &str) {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        if docker.inspect_container(container, None).await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the Swarm service has a running container other than `old`.
async fn swarm_running_container(
    docker: &Docker,
    swarm: &Swarm,
    old: Option<&str>,
) -> anyhow::Result<String> {
    let started = Instant::now();
    loop {
        if let Some(id) = swarm
            .running(docker)
            .await?
            .into_iter()
            .find(|id| Some(id.as_str()) != old)
        {
            return Ok(id);
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("the Swarm service {SERVICE} has no running container after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
