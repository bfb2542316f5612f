//! `cube-bench recovery`: a task's container is killed (`docker kill`); how long until the
//! task runs again — Cube (restart policy `always`, `RestartDelay` 0s) next to Docker Swarm
//! (a one-replica service with `--restart-delay 0s`), alternating run by run in one session.
//!
//! Both sides are timed from the moment the kill was sent (through the Docker API, not the
//! CLI, so that neither pays the CLI's start-up) until a new container of the task runs:
//! Cube's manager reads `Running` with a new container ID (polled every 2 ms); for Swarm,
//! Docker lists a new running container of the service (polled every 2 ms).

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bollard::Docker;
use bollard::query_parameters::{KillContainerOptions, ListContainersOptionsBuilder};
use cube_runtime::sample_image::SAMPLE_IMAGE;
use serde_json::json;

use crate::{BenchCluster, RUN_BOUND, Summary, Through};

const SERVICE: &str = "cube-bench-recovery";

pub(crate) async fn recovery(runs: usize, cube: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(runs > 0, "--runs must be at least 1");
    let docker = Docker::connect_with_local_defaults()?
        .negotiate_version()
        .await
        .context("connecting to Docker")?;
    cube_runtime::DockerRuntime::connect()
        .await?
        .ensure_sample_image(SAMPLE_IMAGE)
        .await?;

    let cluster = BenchCluster::start(cube, Through::Manager).await?;
    let task = json!({"Name": "recovery", "Image": SAMPLE_IMAGE, "RestartPolicy": "always",
                      "RestartDelay": "0s"});
    let id = crate::submit(&cluster.http, &cluster.base, &task).await?;
    let mut cube_container = cube_running_container(&cluster, &id, None).await?;

    let swarm = Swarm::start()?;
    let mut swarm_container = swarm_running_container(&docker, None).await?;

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
                swarm_container = swarm_running_container(&docker, Some(&swarm_container)).await?;
                swarm_ms.push(killed.elapsed().as_secs_f64() * 1000.0);
            }
        }
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

    let cube_summary = Summary::of(&mut cube_ms);
    let swarm_summary = Summary::of(&mut swarm_ms);
    println!("recovery: docker kill -> running again, {runs} runs each, image {SAMPLE_IMAGE}");
    println!();
    println!("| path | median ms | p95 ms | min ms | max ms |");
    println!("|---|---:|---:|---:|---:|");
    println!(
        "| Cube: restart policy always, RestartDelay 0s (manager + worker) | {cube_summary} |"
    );
    println!("| Docker Swarm: one replica, --restart-delay 0s | {swarm_summary} |");
    println!();
    println!(
        "ratio of medians, Cube / Swarm: {:.2}",
        cube_summary.median / swarm_summary.median
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
        let task: serde_json::Value = cluster
            .http
            .get(format!("{}/tasks/{id}", cluster.base))
            .send()
            .await?
            .json()
            .await?;
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

/// Waits until Docker lists a running container of the Swarm service other than `old`.
async fn swarm_running_container(docker: &Docker, old: Option<&str>) -> anyhow::Result<String> {
    let filters = HashMap::from([
        (
            "label".to_string(),
            vec![format!("com.docker.swarm.service.name={SERVICE}")],
        ),
        ("status".to_string(), vec!["running".to_string()]),
    ]);
    let options = ListContainersOptionsBuilder::new()
        .filters(&filters)
        .build();
    let started = Instant::now();
    loop {
        let containers = docker.list_containers(Some(options.clone())).await?;
        if let Some(id) = containers
            .iter()
            .filter_map(|container| container.id.as_deref())
            .find(|id| Some(*id) != old)
        {
            return Ok(id.to_string());
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("the Swarm service {SERVICE} has no running container after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A one-replica Swarm service of the sample image, in a single-node swarm initialised for
/// the benchmark when there is none; both are removed when dropped.
struct Swarm {
    initialised_here: bool,
}

impl Swarm {
    fn start() -> anyhow::Result<Swarm> {
        let state = docker_cli(&["info", "--format", "{{.Swarm.LocalNodeState}}"])?;
        let initialised_here = state.trim() != "active";
        if initialised_here {
            docker_cli(&["swarm", "init", "--advertise-addr", "127.0.0.1"])
                .context("docker swarm init")?;
        }
        let swarm = Swarm { initialised_here };
        let _ = docker_cli(&["service", "rm", SERVICE]);
        docker_cli(&[
            "service",
            "create",
            "--name",
            SERVICE,
            "--replicas",
            "1",
            "--init",
            "--no-resolve-image",
            "--restart-condition",
            "any",
            "--restart-delay",
            "0s",
            "--detach",
            SAMPLE_IMAGE,
        ])
        .context("docker service create")?;
        Ok(swarm)
    }
}

impl Drop for Swarm {
    fn drop(&mut self) {
        let _ = docker_cli(&["service", "rm", SERVICE]);
        if self.initialised_here {
            let _ = docker_cli(&["swarm", "leave", "--force"]);
        }
    }
}

/// Runs the Docker CLI; its stdout, or its stderr as the error.
fn docker_cli(args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new("docker")
        .args(args)
        .output()
        .context("running the docker CLI")?;
    if !output.status.success() {
        bail!(
            "docker {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).to_string())
}
