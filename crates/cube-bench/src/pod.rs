//! `cube-bench pod`: a two-service pod (an httpd with a health check whose port is published,
//! and a client that depends on the server's health, fetches from it and stays up) — Cube
//! (`POST /tasks` with the compose file, through the manager) next to `docker-compose up -d`
//! of the same file (Debian's docker-compose 1.29), alternating run by run in one session.
//!
//! Both sides are timed from the submission (the `POST /tasks`; the start of
//! `docker-compose up -d`) to the same event, watched the same way on both sides: **the
//! server answers on its published port from outside** (`GET /health` through the host port
//! Docker published, answered 200) **and the dependent service, the client, runs** (Docker
//! lists its container running). One watcher lists the project's containers (one `docker ps`
//! call by label) and tries the port every 5 ms, from the submission on, on both sides. The
//! ratio is taken run by run.
//!
//! Reported beside it, from the same watcher: when Docker itself first calls the server
//! `healthy` (Docker 20.10 runs a container's first check one `interval` after its start;
//! Cube runs its own first checks as the container starts, `first_check.rs`, so the client
//! may start before Docker's verdict), when the manager reads the pod `Running` and `Healthy`
//! (Cube), and when `docker-compose up -d` returned. docker-compose is a Python program whose
//! start-up is inside its side's time: `docker-compose version` is timed once per run
//! (untimed for the comparison) to say what that start-up costs. Each run is torn down before
//! the next (Cube: stopped and purged; compose: `down`), off the clock.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bollard::Docker;
use bollard::models::{ContainerSummary, ContainerSummaryStateEnum};
use bollard::query_parameters::ListContainersOptionsBuilder;
use cube_runtime::sample_image::SAMPLE_IMAGE;
use serde_json::{Value, json};

use crate::{BenchCluster, RUN_BOUND, Summary, Through};

/// The file both sides run. `version` is for docker-compose 1.29 (a file without one is its
/// legacy format); Cube reads and ignores it. The server's port 7777 is published on a host
/// port Docker picks.
const COMPOSE: &str = r#"version: "2.4"
services:
  server:
    image: cube-sample:latest
    ports:
      - "7777"
    healthcheck:
      test: ["CMD", "wget", "-q", "-O", "/dev/null", "http://localhost:7777/health"]
      interval: 250ms
      timeout: 2s
      retries: 3
  client:
    image: cube-sample:latest
    command: ["sh", "-c", "wget -q -O /dev/null http://server:7777/ ; exec sleep 3600"]
    depends_on:
      server:
        condition: service_healthy
"#;

const POLL: Duration = Duration::from_millis(5);

/// The container port the server listens on, published on both sides.
const SERVER_PORT: u16 = 7777;

/// One run of one side, in ms from the submission.
#[derive(Debug, Clone, Copy)]
struct Times {
    /// The server answered from outside and the client runs: the compared event.
    ready: f64,
    /// Docker first listed the server `healthy`.
    docker_healthy: f64,
    /// Cube: the manager read the pod `Running`, `Healthy`; compose: `up -d` returned.
    side_done: f64,
}

pub(crate) async fn pod(runs: usize, cube: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(runs > 0, "--runs must be at least 1");
    compose_version().await?;
    let docker = crate::containers::connect().await?;
    let runtime = cube_runtime::DockerRuntime::connect().await?;
    runtime.ensure_sample_image(SAMPLE_IMAGE).await?;
    runtime.ensure_pause_image().await?;
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("docker-compose.yml");
    std::fs::write(&file, COMPOSE)?;
    let cluster = BenchCluster::start(cube, Through::Manager).await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()?;

    println!(
        "pod: two services (httpd with a health check every 250ms and its port published, a \
         client that depends on its health), from the submission until the server answers \
         GET /health on its published port and the client runs; {runs} runs each side, \
         alternating; load average {}",
        crate::load_average()
    );
    println!();
    println!(
        "| run | first | Cube ms | docker-compose ms | Cube / docker-compose | Cube: Docker says healthy, ms | docker-compose: Docker says healthy, ms | Cube: the manager reads Running, Healthy, ms | docker-compose: up -d returned, ms | docker-compose version, ms |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let (mut cube_runs, mut compose_runs) = (Vec::new(), Vec::new());
    let (mut ratios, mut versions) = (Vec::new(), Vec::new());
    for run in 0..runs {
        let cube_first = run % 2 == 0;
        let (mut cube, mut compose) = (None, None);
        for cube_turn in [cube_first, !cube_first] {
            if cube_turn {
                cube = Some(cube_run(&cluster, &docker, &http, run).await?);
            } else {
                compose = Some(compose_run(&docker, &http, &file, run).await?);
            }
        }
        let (Some(cube), Some(compose)) = (cube, compose) else {
            bail!("run {}: a side was not measured", run + 1);
        };
        let version = compose_version().await?;
        let ratio = cube.ready / compose.ready;
        println!(
            "| {} | {} | {:.0} | {:.0} | {ratio:.2} | {:.0} | {:.0} | {:.0} | {:.0} | {version:.0} |",
            run + 1,
            if cube_first { "Cube" } else { "compose" },
            cube.ready,
            compose.ready,
            cube.docker_healthy,
            compose.docker_healthy,
            cube.side_done,
            compose.side_done
        );
        cube_runs.push(cube);
        compose_runs.push(compose);
        ratios.push(ratio);
        versions.push(version);
    }
    let of = |runs: &[Times], read: fn(&Times) -> f64| {
        let mut values: Vec<f64> = runs.iter().map(read).collect();
        Summary::of(&mut values).spread(0)
    };
    println!();
    println!("| over {runs} runs | median | min | max |");
    println!("|---|---:|---:|---:|");
    println!(
        "| Cube: POST /tasks → the server answers from outside and the client runs, ms | {} |",
        of(&cube_runs, |t| t.ready)
    );
    println!(
        "| docker-compose up -d → the same, ms | {} |",
        of(&compose_runs, |t| t.ready)
    );
    println!(
        "| **Cube / docker-compose, run by run** | {} |",
        Summary::of(&mut ratios).ratios()
    );
    println!(
        "| Cube: Docker says the server healthy, ms | {} |",
        of(&cube_runs, |t| t.docker_healthy)
    );
    println!(
        "| docker-compose: Docker says the server healthy, ms | {} |",
        of(&compose_runs, |t| t.docker_healthy)
    );
    println!(
        "| Cube: the manager reads the pod Running and Healthy, ms | {} |",
        of(&cube_runs, |t| t.side_done)
    );
    println!(
        "| docker-compose: up -d returned, ms | {} |",
        of(&compose_runs, |t| t.side_done)
    );
    println!(
        "| `docker-compose version` (its start-up, inside its side's time), ms | {} |",
        Summary::of(&mut versions).spread(0)
    );
    cluster
        .stop_and_sweep(&crate::containers::connect().await?)
        .await;
    Ok(())
}

/// Runs `docker-compose version`: the time it takes in ms (docker-compose's own start-up), or
/// an error saying how to install it.
async fn compose_version() -> anyhow::Result<f64> {
    let started = Instant::now();
    let found = tokio::process::Command::new("docker-compose")
        .arg("version")
        .output()
        .await;
    match found {
        Ok(output) if output.status.success() => Ok(started.elapsed().as_secs_f64() * 1000.0),
        _ => bail!(
            "docker-compose is not installed: apt-get install -y docker-compose \
             (scripts/setup.sh does)"
        ),
    }
}

/// One pod through Cube: submit until the server answers and the client runs, then until the
/// manager reads it healthy; then stopped and purged.
async fn cube_run(
    cluster: &BenchCluster,
    docker: &Docker,
    http: &reqwest::Client,
    run: usize,
) -> anyhow::Result<Times> {
    let name = format!("bench-pod-{run}");
    let task = json!({"Name": name, "Pod": {"Compose": COMPOSE}});
    let started = Instant::now();
    let id = crate::submit(&cluster.http, &cluster.base, &task).await?;
    let label = format!("{}={name}", cube_runtime::LABEL_TASK_NAME);
    let watched = watch(
        docker,
        http,
        &label,
        cube_runtime::LABEL_POD_CONTAINER,
        started,
    )
    .await?;
    let url = format!("{}/tasks/{id}", cluster.base);
    loop {
        let task: Value = crate::get_json(&cluster.http, &url).await?;
        if task["State"] == "Running" && task["Health"] == "Healthy" {
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
    let side_done = started.elapsed().as_secs_f64() * 1000.0;
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
    Ok(Times {
        ready: watched.ready,
        docker_healthy: watched.docker_healthy,
        side_done,
    })
}

/// One project through docker-compose: `up -d` until the server answers and the client runs
/// (watched while the command runs), then until the command returned; then `down`.
async fn compose_run(
    docker: &Docker,
    http: &reqwest::Client,
    file: &Path,
    run: usize,
) -> anyhow::Result<Times> {
    let project = format!("cubebenchpod{run}");
    let compose = |args: &[&str]| {
        let mut command = tokio::process::Command::new("docker-compose");
        command
            .arg("-f")
            .arg(file)
            .args(["-p", &project])
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        command
    };
    let started = Instant::now();
    let up = compose(&["up", "-d"]).output();
    let label = format!("com.docker.compose.project={project}");
    let watching = watch(docker, http, &label, "com.docker.compose.service", started);
    let (output, watched) = tokio::join!(
        async {
            let output = up.await;
            (output, started.elapsed().as_secs_f64() * 1000.0)
        },
        watching
    );
    let (output, returned) = output;
    let output = output.context("docker-compose up")?;
    if !output.status.success() {
        bail!(
            "docker-compose up -d failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let watched = watched?;
    let down = compose(&["down", "-t", "1"]).output().await?;
    if !down.status.success() {
        bail!(
            "docker-compose down failed: {}",
            String::from_utf8_lossy(&down.stderr)
        );
    }
    Ok(Times {
        ready: watched.ready,
        docker_healthy: watched.docker_healthy,
        side_done: returned,
    })
}

/// What the watcher saw, in ms from the submission.
struct Watched {
    ready: f64,
    docker_healthy: f64,
}

/// Watches the containers labelled `label` (one list call every [`POLL`]) from `started`
/// until the server answers `GET /health` on the host port published for its port 7777, the
/// client runs, and Docker says the server is healthy. `service_label` names the label that
/// holds each container's service.
async fn watch(
    docker: &Docker,
    http: &reqwest::Client,
    label: &str,
    service_label: &str,
    started: Instant,
) -> anyhow::Result<Watched> {
    let filters = HashMap::from([("label".to_string(), vec![label.to_string()])]);
    let options = ListContainersOptionsBuilder::new()
        .all(true)
        .filters(&filters)
        .build();
    let since = |_| started.elapsed().as_secs_f64() * 1000.0;
    let (mut answered, mut client_running, mut healthy) = (None, None, None);
    loop {
        let listed = docker
            .list_containers(Some(options.clone()))
            .await
            .with_context(|| format!("listing the containers labelled {label}"))?;
        let service = |name: &str| {
            listed.iter().find(|container| {
                container
                    .labels
                    .as_ref()
                    .and_then(|labels| labels.get(service_label))
                    .is_some_and(|service| service == name)
            })
        };
        if client_running.is_none()
            && service("client").and_then(|c| c.state) == Some(ContainerSummaryStateEnum::RUNNING)
        {
            client_running = Some(since(()));
        }
        if healthy.is_none()
            && service("server")
                .and_then(|c| c.status.as_deref())
                .is_some_and(|status| status.contains("(healthy)"))
        {
            healthy = Some(since(()));
        }
        // Cube publishes a pod's ports on its infra container, docker-compose on the
        // service's own: any container of the project that publishes the server's port.
        if answered.is_none()
            && let Some(port) = listed.iter().find_map(published_port)
        {
            let answer = http
                .get(format!("http://127.0.0.1:{port}/health"))
                .send()
                .await;
            if answer.is_ok_and(|answer| answer.status().is_success()) {
                answered = Some(since(()));
            }
        }
        if let (Some(answered), Some(client_running), Some(healthy)) =
            (answered, client_running, healthy)
        {
            return Ok(Watched {
                ready: answered.max(client_running),
                docker_healthy: healthy,
            });
        }
        if started.elapsed() > RUN_BOUND {
            bail!(
                "the pod labelled {label} was not ready within {RUN_BOUND:?}: the server \
                 answered: {answered:?}, the client ran: {client_running:?}, Docker said \
                 healthy: {healthy:?} (ms)"
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The host port a container publishes the server's port on.
fn published_port(container: &ContainerSummary) -> Option<u16> {
    container
        .ports
        .as_ref()?
        .iter()
        .find(|port| port.private_port == SERVER_PORT && port.public_port.is_some())
        .and_then(|port| port.public_port)
}
