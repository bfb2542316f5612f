//! `cube-bench pod`: a two-service pod (an httpd with a health check, and a client that
//! fetches from it over `localhost` and stays up) from submit until both containers run and
//! the pod is healthy — Cube (`POST /tasks` with the compose file, through the manager) next
//! to `docker-compose up -d` of the same file (Debian's docker-compose 1.29), alternating run
//! by run in one session.
//!
//! Cube is timed from the `POST /tasks` until the manager reads the task `Running`, `Healthy`,
//! with both services running (polled every 5 ms). docker-compose is timed from the start of
//! `docker-compose up -d` until the engine says both of the project's containers run and the
//! server's health check passed (polled every 5 ms once the command returned). Each run is
//! torn down before the next (Cube: stopped and purged; compose: `down`), off the clock.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cube_runtime::sample_image::SAMPLE_IMAGE;
use serde_json::{Value, json};

use crate::{BenchCluster, RUN_BOUND, Summary, Through};

/// The file both sides run. `version` is for docker-compose 1.29 (a file without one is its
/// legacy format); Cube reads and ignores it.
const COMPOSE: &str = r#"version: "2.4"
services:
  server:
    image: cube-sample:latest
    healthcheck:
      test: ["CMD", "wget", "-q", "-O", "/dev/null", "http://localhost:7777/health"]
      interval: 250ms
      timeout: 2s
      retries: 3
  client:
    image: cube-sample:latest
    command: ["sh", "-c", "wget -q -O /dev/null http://localhost:7777/ ; exec sleep 3600"]
"#;

const POLL: Duration = Duration::from_millis(5);

pub(crate) async fn pod(runs: usize, cube: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(runs > 0, "--runs must be at least 1");
    which_compose()?;
    let docker = crate::containers::connect().await?;
    let runtime = cube_runtime::DockerRuntime::connect().await?;
    runtime.ensure_sample_image(SAMPLE_IMAGE).await?;
    runtime.ensure_pause_image().await?;
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("docker-compose.yml");
    std::fs::write(&file, COMPOSE)?;
    let cluster = BenchCluster::start(cube, Through::Manager).await?;

    println!(
        "pod: two services (httpd with a health check every 250ms, a client that fetches from \
         it over localhost) until both run and the server is healthy; {runs} runs each side, \
         alternating; load average {}",
        crate::load_average()
    );
    let (mut cube_ms, mut compose_ms) = (Vec::new(), Vec::new());
    for run in 0..runs {
        for side in if run % 2 == 0 { [0, 1] } else { [1, 0] } {
            if side == 0 {
                cube_ms.push(cube_run(&cluster, run).await?);
            } else {
                compose_ms.push(compose_run(&docker, &file, run).await?);
            }
        }
    }
    let (cube, compose) = (Summary::of(&mut cube_ms), Summary::of(&mut compose_ms));
    println!();
    println!("| side | median ms | p95 ms | min ms | max ms |");
    println!("|---|---:|---:|---:|---:|");
    for (name, summary) in [("Cube pod", &cube), ("docker-compose up -d", &compose)] {
        println!(
            "| {name} | {:.0} | {:.0} | {:.0} | {:.0} |",
            summary.median, summary.p95, summary.min, summary.max
        );
    }
    println!(
        "| ratio of medians, Cube / docker-compose | {:.2} | | | |",
        cube.median / compose.median
    );
    Ok(())
}

fn which_compose() -> anyhow::Result<()> {
    let found = std::process::Command::new("docker-compose")
        .arg("version")
        .output();
    match found {
        Ok(output) if output.status.success() => Ok(()),
        _ => bail!(
            "docker-compose is not installed: apt-get install -y docker-compose \
             (scripts/setup.sh does)"
        ),
    }
}

/// One pod through Cube: submit until healthy; then stopped and purged.
async fn cube_run(cluster: &BenchCluster, run: usize) -> anyhow::Result<f64> {
    let task = json!({"Name": format!("bench-pod-{run}"), "Pod": {"Compose": COMPOSE}});
    let started = Instant::now();
    let id = crate::submit(&cluster.http, &cluster.base, &task).await?;
    let url = format!("{}/tasks/{id}", cluster.base);
    loop {
        let task: Value = crate::get_json(&cluster.http, &url).await?;
        let containers = task["Containers"].as_array().cloned().unwrap_or_default();
        let services_running = containers
            .iter()
            .filter(|c| c["Name"] != "infra" && c["Status"] == "running")
            .count();
        if task["State"] == "Running" && task["Health"] == "Healthy" && services_running == 2 {
            break;
        }
        if task["State"] == "Failed" {
            bail!("the pod failed: {}", task["Error"]);
        }
        if started.elapsed() > RUN_BOUND {
            bail!("the pod was not healthy within {RUN_BOUND:?}: {task}");
        }
        tokio::time::sleep(POLL).await;
    }
    let elapsed = started.elapsed().as_secs_f64() * 1000.0;
    cluster.http.delete(&url).send().await?;
    loop {
        let task: Value = crate::get_json(&cluster.http, &url).await?;
        if task["State"] == "Completed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster
        .http
        .delete(format!("{url}?purge=true"))
        .send()
        .await?;
    Ok(elapsed)
}

/// One project through docker-compose: `up -d` until healthy; then `down`.
async fn compose_run(docker: &bollard::Docker, file: &Path, run: usize) -> anyhow::Result<f64> {
    let project = format!("cubebenchpod{run}");
    let compose = |args: &[&str]| {
        let mut command = tokio::process::Command::new("docker-compose");
        command
            .arg("-f")
            .arg(file)
            .args(["-p", &project])
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        command
    };
    let started = Instant::now();
    let output = compose(&["up", "-d"])
        .output()
        .await
        .context("docker-compose up")?;
    if !output.status.success() {
        bail!(
            "docker-compose up -d failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let names = [format!("{project}_server_1"), format!("{project}_client_1")];
    loop {
        let server = docker.inspect_container(&names[0], None).await?;
        let client = docker.inspect_container(&names[1], None).await?;
        let running = |c: &bollard::models::ContainerInspectResponse| {
            c.state.as_ref().and_then(|s| s.running) == Some(true)
        };
        let healthy = server
            .state
            .as_ref()
            .and_then(|s| s.health.as_ref())
            .and_then(|h| h.status)
            == Some(bollard::models::HealthStatusEnum::HEALTHY);
        if running(&server) && running(&client) && healthy {
            break;
        }
        if started.elapsed() > RUN_BOUND {
            bail!("docker-compose's project was not healthy within {RUN_BOUND:?}");
        }
        tokio::time::sleep(POLL).await;
    }
    let elapsed = started.elapsed().as_secs_f64() * 1000.0;
    let down = compose(&["down", "-t", "1"]).output().await?;
    if !down.status.success() {
        bail!(
            "docker-compose down failed: {}",
            String::from_utf8_lossy(&down.stderr)
        );
    }
    Ok(elapsed)
}
