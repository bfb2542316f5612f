//! `cube-bench recovery`: a task's container is killed (`docker kill`); how long until the
//! task runs again — Cube (restart policy `always`, `RestartDelay` 0s) next to Docker Swarm
//! (a one-replica service with `--restart-delay 0s`), alternating run by run in one session.
//!
//! A third side is the floor of any orchestrator on Docker that restarts by starting a
//! container made ahead of time: raw Docker, a running container killed, then, the moment
//! Docker's `die` event for it arrives, the start of one created (untimed) before the kill. Cube makes the next run's container after the kill; the
//! gap between the floor and create + start says what making it ahead could win.
//!
//! Every side is timed from the moment the kill was sent (through the Docker API, not the
//! CLI, so that neither pays the CLI's start-up) until a new container of the task runs, to
//! the same event on both sides: Docker's `start` event for a new container of the task
//! (Cube: the worker's `cube.node` label; Swarm: the service's label) read from the engine's
//! event stream, one stream per side opened before the first kill. Nothing polls the engine
//! while it restarts the task, so the measurement loads neither side. Cube's manager reading
//! the task `Running` with the new container (polled every 2 ms once the `start` event came,
//! so again nothing polls during the restart) is reported beside it: what a client of Cube's
//! API sees.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bollard::Docker;
use bollard::query_parameters::EventsOptionsBuilder;
use bollard::query_parameters::KillContainerOptions;
use cube_runtime::sample_image::SAMPLE_IMAGE;
use cube_runtime::{ContainerSpec, DockerRuntime, Runtime, RuntimeEvent};
use cube_types::Task;
use futures_util::StreamExt;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::swarm::Swarm;
use crate::{BenchCluster, RAW_NODE, RUN_BOUND, Summary, Through};

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
    let mut cube_starts = Starts::open(&docker, &cluster.container_label()).await?;
    let mut cube_container = cube_running_container(&cluster, &id, None).await?;

    let swarm = Swarm::start(
        SERVICE,
        1,
        &["--restart-condition", "any", "--restart-delay", "0s"],
    )?;
    let mut swarm_starts =
        Starts::open(&docker, &format!("com.docker.swarm.service.name={SERVICE}")).await?;
    let mut swarm_container = swarm_running_container(&docker, &swarm, None).await?;

    let runtime = DockerRuntime::connect().await?;
    let mut raw = PreCreated::start(&runtime).await?;

    println!(
        "recovery: docker kill → running again, {sets} sets of {runs} kills each side, image \
         {SAMPLE_IMAGE}; Cube = restart policy always, RestartDelay 0s (manager + worker), \
         Swarm = one replica, --restart-delay 0s; floor = raw Docker, kill then start of a \
         container created ahead. Cube and Swarm: the kill sent → Docker's `start` event of a \
         new container, read from the engine's event stream; load average {}",
        crate::load_average()
    );
    println!();
    println!(
        "| set | Cube median ms | Cube max ms | Swarm median ms | Swarm max ms | floor median ms \
         | ratio of medians | floor / Swarm | Cube: the manager reads Running, median ms |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let (mut cube_medians, mut swarm_medians, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let (mut floor_medians, mut floor_ratios) = (Vec::new(), Vec::new());
    let mut manager_medians = Vec::new();
    let (mut cube_known, mut swarm_known) = (
        HashSet::from([cube_container.clone()]),
        HashSet::from([swarm_container.clone()]),
    );
    for set in 0..sets {
        let mut manager_ms = Vec::with_capacity(runs);
        let mut cube_ms = Vec::with_capacity(runs);
        let mut swarm_ms = Vec::with_capacity(runs);
        let mut floor_ms = Vec::with_capacity(runs);
        for run in 0..runs {
            // Each side goes first in turn.
            let order = [run % 3, (run + 1) % 3, (run + 2) % 3];
            for side in order {
                if side == 2 {
                    floor_ms.push(raw.restart(&runtime, &docker).await?);
                } else if side == 0 {
                    cube_starts.clear()?;
                    let killed = kill(&docker, &cube_container).await?;
                    let (started, new) = cube_starts.new_one(&cube_known).await?;
                    cube_ms.push(started.duration_since(killed).as_secs_f64() * 1000.0);
                    // Untimed by Docker's clock: the manager's view of the same restart.
                    let read = cube_running_container(&cluster, &id, Some(&cube_container)).await?;
                    manager_ms.push(killed.elapsed().as_secs_f64() * 1000.0);
                    anyhow::ensure!(
                        read == new,
                        "the manager reads container {read} running; Docker started {new}"
                    );
                    cube_known.insert(new.clone());
                    cube_container = new;
                } else {
                    swarm_starts.clear()?;
                    let killed = kill(&docker, &swarm_container).await?;
                    let (started, new) = swarm_starts.new_one(&swarm_known).await?;
                    swarm_ms.push(started.duration_since(killed).as_secs_f64() * 1000.0);
                    swarm_known.insert(new.clone());
                    swarm_container = new;
                }
            }
        }
        let (cube_set, swarm_set) = (Summary::of(&mut cube_ms), Summary::of(&mut swarm_ms));
        let floor_set = Summary::of(&mut floor_ms);
        let manager_set = Summary::of(&mut manager_ms);
        let ratio = cube_set.median / swarm_set.median;
        let floor_ratio = floor_set.median / swarm_set.median;
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {ratio:.2} | {floor_ratio:.2} | {:.1} |",
            set + 1,
            cube_set.median,
            cube_set.max,
            swarm_set.median,
            swarm_set.max,
            floor_set.median,
            manager_set.median
        );
        manager_medians.push(manager_set.median);
        cube_medians.push(cube_set.median);
        swarm_medians.push(swarm_set.median);
        ratios.push(ratio);
        floor_medians.push(floor_set.median);
        floor_ratios.push(floor_ratio);
    }
    drop(swarm);
    raw.remove(&runtime).await;
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
    // The worker stops the container and keeps it for its logs: once it is stopped, it is
    // removed here, so that the benchmark leaves no container behind.
    let label = cluster.container_label();
    crate::containers::await_none_running(&docker, &label).await?;
    crate::containers::remove_stopped(&docker, &label).await?;

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
        "| floor (raw, created ahead) median ms | {} |",
        Summary::of(&mut floor_medians).spread(1)
    );
    println!(
        "| Cube: the manager reads Running, median ms | {} |",
        Summary::of(&mut manager_medians).spread(1)
    );
    println!(
        "| ratio of medians, Cube / Swarm | {} |",
        Summary::of(&mut ratios).spread(2)
    );
    println!(
        "| ratio of medians, floor / Swarm | {} |",
        Summary::of(&mut floor_ratios).spread(2)
    );
    Ok(())
}

/// Docker's `start` events of the containers that carry one label, read from the engine's
/// event stream as they come (a task forwards each with the moment it was read).
struct Starts {
    events: mpsc::UnboundedReceiver<anyhow::Result<(Instant, String)>>,
    /// The reader; aborted when dropped.
    _reader: JoinSet<()>,
}

impl Starts {
    /// Subscribes to the `start` events of containers labelled `label` (`KEY=VALUE`). The
    /// stream replays from the current second, so that no start is missed while the
    /// subscription is made; what it replays is of containers already known.
    async fn open(docker: &Docker, label: &str) -> anyhow::Result<Starts> {
        let filters = HashMap::from([
            ("type", vec!["container"]),
            ("event", vec!["start"]),
            ("label", vec![label]),
        ]);
        let since = chrono::Utc::now().timestamp().to_string();
        let options = EventsOptionsBuilder::new()
            .since(&since)
            .filters(&filters)
            .build();
        let mut stream = docker.events(Some(options));
        let (sender, events) = mpsc::unbounded_channel();
        let mut reader = JoinSet::new();
        reader.spawn(async move {
            while let Some(message) = stream.next().await {
                let read_at = Instant::now();
                let forwarded = match message {
                    Ok(message) => match message.actor.and_then(|actor| actor.id) {
                        Some(id) => sender.send(Ok((read_at, id))),
                        None => continue,
                    },
                    Err(err) => sender.send(Err(anyhow::anyhow!("Docker's events: {err}"))),
                };
                if forwarded.is_err() {
                    return; // nobody listens any more
                }
            }
            let _ = sender.send(Err(anyhow::anyhow!("Docker's event stream ended")));
        });
        Ok(Starts {
            events,
            _reader: reader,
        })
    }

    /// Throws away what has been read so far.
    fn clear(&mut self) -> anyhow::Result<()> {
        while let Ok(seen) = self.events.try_recv() {
            seen?;
        }
        Ok(())
    }

    /// Waits for the start of a container not in `known`: when it was read, and its ID.
    async fn new_one(&mut self, known: &HashSet<String>) -> anyhow::Result<(Instant, String)> {
        let deadline = tokio::time::Instant::now() + RUN_BOUND;
        loop {
            let (read_at, id) = tokio::time::timeout_at(deadline, self.events.recv())
                .await
                .map_err(|_| anyhow::anyhow!("no new container started within {RUN_BOUND:?}"))?
                .context("the event stream's reader stopped")??;
            if !known.contains(&id) {
                return Ok((read_at, id));
            }
        }
    }
}

/// Raw Docker with the next container made ahead: one runs, the next is created and waits.
struct PreCreated {
    running: String,
    next: String,
    made: usize,
}

impl PreCreated {
    /// A container like the task's (same image, docker-init, no published port), for the
    /// raw node's label.
    async fn create(runtime: &DockerRuntime, made: usize) -> anyhow::Result<String> {
        let mut task = Task::new(format!("recovery-raw-{made}"), SAMPLE_IMAGE);
        task.normalize();
        Ok(runtime
            .create(&ContainerSpec::for_task(&task, RAW_NODE))
            .await?)
    }

    async fn start(runtime: &DockerRuntime) -> anyhow::Result<PreCreated> {
        let running = PreCreated::create(runtime, 0).await?;
        runtime.start(&running).await?;
        let next = PreCreated::create(runtime, 1).await?;
        Ok(PreCreated {
            running,
            next,
            made: 2,
        })
    }

    /// Kills the running container and starts the one made ahead as soon as Docker's `die`
    /// event for it arrives (what an orchestrator watching the engine's events can react to:
    /// Docker sends it some 50 ms before its kill call returns); the time from the kill until
    /// the start returned, in ms. Then (untimed) the killed one is removed and the next one
    /// made.
    async fn restart(&mut self, runtime: &DockerRuntime, docker: &Docker) -> anyhow::Result<f64> {
        let mut events = runtime.events_since(RAW_NODE, chrono::Utc::now().timestamp() - 1);
        let running = self.running.clone();
        let died_then_started = async {
            loop {
                match events.next().await {
                    Some(Ok(RuntimeEvent::Died { container_id, .. }))
                        if container_id == running =>
                    {
                        break;
                    }
                    Some(Ok(_)) => continue,
                    Some(Err(err)) => bail!("Docker's events failed: {err}"),
                    None => bail!("Docker's events ended before the kill was seen"),
                }
            }
            runtime.start(&self.next).await?;
            Ok::<_, anyhow::Error>(Instant::now())
        };
        let (killed, started) = tokio::join!(kill(docker, &self.running), died_then_started);
        let elapsed = started?.duration_since(killed?).as_secs_f64() * 1000.0;
        runtime.remove(&self.running).await?;
        self.running = std::mem::take(&mut self.next);
        self.next = PreCreated::create(runtime, self.made).await?;
        self.made += 1;
        Ok(elapsed)
    }

    async fn remove(self, runtime: &DockerRuntime) {
        for id in [self.running, self.next] {
            if let Err(err) = runtime.remove(&id).await {
                eprintln!("cannot remove raw container {id}: {err}");
            }
        }
    }
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

/// Waits until the Swarm service has a running container other than `old` (before the first
/// kill, untimed).
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
