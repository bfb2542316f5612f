//! `cube-bench start-latency`: one task at a time from submission to `Running`, next to its
//! floor, raw Docker, in the same run.
//!
//! A real `cube manager` and a real `cube worker` registered with it (or, with `--through
//! worker`, the worker alone), both on the persistent store so that each acknowledged
//! submission is a durable commit. Alternating run by run:
//! - Cube: `POST /tasks` until `GET /tasks/{id}` says `Running` (polled every 2 ms);
//! - raw Docker: bollard create + start of the same container until start returns, which is
//!   when Docker reports it running.
//!
//! Each set of `--runs` tasks gives a p50, a p95 and the ratio of the p50s; the summary gives
//! the median, min and max of those over `--sets` sets.
//!
//! With `--in-project`, the other side is Cube as well, each task submitted in a project with
//! a quota (`bench`, every task counted against it): the cost of projects on the same path,
//! taking turns with tasks in `default`.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;
use cube_runtime::sample_image::SAMPLE_IMAGE;
use cube_runtime::{ContainerSpec, DockerRuntime, Runtime};
use cube_types::Task;
use serde_json::json;

use crate::{BenchCluster, RAW_NODE, RUN_BOUND, Summary, Through, submit};

pub(crate) async fn start_latency(
    runs: usize,
    sets: usize,
    cube: &Path,
    through: Through,
    in_project: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        !(in_project && through == Through::Worker),
        "--in-project needs --through manager: a worker has no projects"
    );
    anyhow::ensure!(runs > 0, "--runs must be at least 1");
    anyhow::ensure!(sets > 0, "--sets must be at least 1");
    let docker = DockerRuntime::connect().await?;
    docker.ensure_sample_image(SAMPLE_IMAGE).await?;
    let cluster = BenchCluster::start(cube, through).await?;
    let (http, base) = (&cluster.http, &cluster.base);
    if in_project {
        let made = http
            .post(format!("{base}/projects"))
            .json(&json!({"Name": BENCH_PROJECT, "Quota": {"Cpus": 1000, "Memory": "1Ti", "Tasks": 100000}}))
            .send()
            .await?;
        anyhow::ensure!(
            made.status().is_success(),
            "POST /projects answered {}",
            made.status()
        );
    }
    let other = if in_project {
        format!("Cube in project {BENCH_PROJECT} (a quota)")
    } else {
        "raw Docker".to_string()
    };

    let path = match through {
        Through::Manager => "manager + worker",
        Through::Worker => "worker alone",
    };
    println!(
        "start latency: {sets} sets of {runs} tasks each side, one at a time, image {SAMPLE_IMAGE}; \
         Cube = POST /tasks → Running ({path}, persistent stores), {}",
        if in_project {
            "the other side the same in a project with a quota"
        } else {
            "raw Docker = bollard create + start"
        }
    );
    println!();
    println!(
        "| set | Cube p50 ms | Cube p95 ms | {other} p50 ms | {other} p95 ms | ratio of p50s |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let (mut cube_p50, mut cube_p95, mut raw_p50, mut raw_p95, mut ratios) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for set in 0..sets {
        let mut cube_ms = Vec::with_capacity(runs);
        let mut raw_ms = Vec::with_capacity(runs);
        for run in 0..runs {
            let name = set * runs + run;
            // Alternate which side goes first, so neither always meets a Docker still busy
            // cleaning up after the other.
            let other_once = async || match in_project {
                true => cube_once_in(http, base, &docker, name, Some(BENCH_PROJECT)).await,
                false => raw_once(&docker, RAW_NODE, name).await,
            };
            if run % 2 == 0 {
                cube_ms.push(cube_once(http, base, &docker, name).await?);
                raw_ms.push(other_once().await?);
            } else {
                raw_ms.push(other_once().await?);
                cube_ms.push(cube_once(http, base, &docker, name).await?);
            }
        }
        let (cube_set, raw_set) = (Summary::of(&mut cube_ms), Summary::of(&mut raw_ms));
        let ratio = cube_set.median / raw_set.median;
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {ratio:.2} |",
            set + 1,
            cube_set.median,
            cube_set.p95,
            raw_set.median,
            raw_set.p95
        );
        cube_p50.push(cube_set.median);
        cube_p95.push(cube_set.p95);
        raw_p50.push(raw_set.median);
        raw_p95.push(raw_set.p95);
        ratios.push(ratio);
    }
    let node = cluster.node.clone();
    drop(cluster);
    for container in docker.list_managed(&node).await? {
        docker.remove(&container.id).await.ok();
    }

    println!();
    println!("| over {sets} sets | median | min | max |");
    println!("|---|---:|---:|---:|");
    println!("| Cube p50 ms | {} |", Summary::of(&mut cube_p50).spread(1));
    println!("| Cube p95 ms | {} |", Summary::of(&mut cube_p95).spread(1));
    println!(
        "| {other} p50 ms | {} |",
        Summary::of(&mut raw_p50).spread(1)
    );
    println!(
        "| {other} p95 ms | {} |",
        Summary::of(&mut raw_p95).spread(1)
    );
    println!(
        "| ratio of p50s, Cube / {other} | {} |",
        Summary::of(&mut ratios).spread(3)
    );
    Ok(())
}

/// One task through Cube's API (manager or worker); the time until it reads back as `Running`, in ms.
///
/// The task is stopped afterwards, then removed (`DELETE /tasks/{id}?purge=true`, `cube rm`:
/// a stopped task's container is kept for its logs until then), and its container waited for
/// until it is gone (untimed), as raw Docker's is removed before its run ends: neither side's
/// next start meets Docker still busy with the other's removal.
pub(crate) async fn cube_once(
    http: &reqwest::Client,
    base: &str,
    docker: &DockerRuntime,
    run: usize,
) -> anyhow::Result<f64> {
    cube_once_in(http, base, docker, run, None).await
}

/// The project `--in-project` submits in.
const BENCH_PROJECT: &str = "bench";

/// [`cube_once`], the task in `project` when one is named.
async fn cube_once_in(
    http: &reqwest::Client,
    base: &str,
    docker: &DockerRuntime,
    run: usize,
    project: Option<&str>,
) -> anyhow::Result<f64> {
    let mut task = json!({"Name": format!("bench-{run}"), "Image": SAMPLE_IMAGE, "PortBindings": {"7777/tcp": ""}});
    if let Some(project) = project {
        task["Project"] = json!(project);
    }
    let started = Instant::now();
    let id = submit(http, base, &task).await?;
    let running = loop {
        let task: serde_json::Value = crate::get_json(http, &format!("{base}/tasks/{id}")).await?;
        match task["State"].as_str() {
            Some("Running") => break task,
            Some("Failed") => bail!("task {id} failed: {}", task["Error"]),
            _ if started.elapsed() > RUN_BOUND => {
                bail!("task {id} not Running within {RUN_BOUND:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(2)).await,
        }
    };
    let elapsed = started.elapsed();
    let Some(container) = running["ContainerID"].as_str().filter(|c| !c.is_empty()) else {
        bail!("task {id} is Running without a ContainerID: {running}");
    };
    let stopped = http.delete(format!("{base}/tasks/{id}")).send().await?;
    anyhow::ensure!(
        stopped.status().is_success(),
        "DELETE /tasks/{id} answered {}",
        stopped.status()
    );
    let stopping = Instant::now();
    loop {
        // 409 until the stop has ended the task.
        let removed = http
            .delete(format!("{base}/tasks/{id}?purge=true"))
            .send()
            .await?;
        match removed.status().as_u16() {
            status if (200..300).contains(&status) => break,
            409 if stopping.elapsed() < RUN_BOUND => {
                tokio::time::sleep(Duration::from_millis(5)).await
            }
            _ => bail!(
                "DELETE /tasks/{id}?purge=true answered {}: {}",
                removed.status(),
                removed.text().await.unwrap_or_default()
            ),
        }
    }
    while docker.inspect(container).await?.is_some() {
        if stopping.elapsed() > RUN_BOUND {
            bail!("the container of task {id} is still there {RUN_BOUND:?} after its stop");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(elapsed.as_secs_f64() * 1000.0)
}

/// The same container started straight through bollard; the time until start returns, in ms.
async fn raw_once(docker: &DockerRuntime, node: &str, run: usize) -> anyhow::Result<f64> {
    let mut task = Task::new(format!("raw-{run}"), SAMPLE_IMAGE);
    task.spec
        .port_bindings
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
