//! `cube-bench rolling`: a service of 10 health-checked copies updated from one command to
//! another, 2 copies at a time — Cube's deployment next to `docker service update` — the
//! peers taking turns going first within each run of one session. Swarm is measured three
//! times per run: `stop-first` (its default order) with its default `--update-monitor` (5 s)
//! and with the smallest it keeps, and `start-first` with the smallest.
//!
//! - Cube: a service job whose group has `Update: {"MaxParallel": 2, "MinHealthyTime": "0s"}`
//!   and whose copies are probed on `/health` every [`HEALTH_INTERVAL`] (from inside the
//!   container, on its exposed port: no host port is published). Version 1 runs [`V1`]; once
//!   its deployment is `successful` (untimed), the same job is submitted with [`V2`], and the
//!   time runs from that `POST /jobs` until `GET /jobs/{name}` (polled every 10 ms) shows the
//!   version-2 deployment `successful`. Then (untimed) the manager must list `--copies`
//!   running copies with V2's command and no other live copy, and Docker as many running
//!   containers of the worker, every one with V2's command.
//! - Swarm: a service of as many replicas of the same image and V1, with a Docker health check
//!   of the same interval (busybox `wget` of `/health` inside the container),
//!   `--update-parallelism 2`, `--update-delay 0s`, and the `--update-order` and
//!   `--update-monitor` measured; once every replica is healthy (untimed), `docker service
//!   update --detach --args V2` and the time runs until Swarm reports the update `completed`
//!   (the service's `UpdateStatus.State`, read through the API) and Docker lists `--copies`
//!   running containers of the service, every one with V2's command (polled every 10 ms).
//!
//! Swarm's `--update-monitor` is its counterpart of `MinHealthyTime`: how long it keeps
//! watching the new tasks for failures before the update counts as done. Swarm takes `0s` as
//! "not set" and keeps its 5 s default (seen in `docker service inspect` on Docker 20.10), so
//! the smallest it keeps is [`SWARM_MIN_MONITOR`]; that variant is the fair peer of Cube's
//! `MinHealthyTime: 0s`. Cube stops an old copy and starts its replacement at the same time
//! (they share no port); Swarm's `stop-first` starts the new task once the old one has
//! exited, `start-first` stops the old one once the new one runs: Cube's way lies between
//! the two, so both are measured. The CLI's own start-up (tens of ms) is inside Swarm's times,
//! as in `scale`. Between sides every container is removed and waited for. Whatever happens,
//! the job is stopped, the service removed, the swarm left as it was found, and any container
//! of the benchmark's worker still there at the end is force-removed.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bollard::Docker;
use bollard::models::ServiceUpdateStatusStateEnum;
use cube_runtime::DockerRuntime;
use cube_runtime::sample_image::{SAMPLE_IMAGE, SAMPLE_PORT};
use serde_json::{Value, json};

use crate::containers::{self, Listed};
use crate::service_job::{GROUP, ServiceJob};
use crate::swarm::Swarm;
use crate::{BenchCluster, Summary, Through, load_average};

const SERVICE: &str = "cube-bench-rolling";

/// How long converging version 1, or one update, may take before the run is abandoned.
const PHASE_BOUND: Duration = Duration::from_secs(180);

/// How long the copies may take to show version 2 everywhere once the deployment says it is
/// done (checked, not timed).
const CHECK_BOUND: Duration = Duration::from_secs(10);

/// How often both sides probe each copy's health; in Cube's syntax and Docker's alike.
const HEALTH_INTERVAL: &str = "250ms";

/// Copies replaced at a time: Cube's `MaxParallel`, Swarm's `--update-parallelism`.
const MAX_PARALLEL: usize = 2;

/// Version 1: the sample image's web server.
const V1: [&str; 6] = ["httpd", "-f", "-p", "7777", "-h", "/www"];

/// Version 2: the same server, started by another command (it writes a file first).
const V2: [&str; 3] = [
    "sh",
    "-c",
    "echo two > /www/v && exec httpd -f -p 7777 -h /www",
];

/// What tells a version-2 container apart in Docker's list: only V2's command holds it.
const V2_MARKER: &str = "echo two";

/// Swarm's health check: the same `/health`, fetched inside the container by busybox.
const SWARM_HEALTH_CMD: &str = "wget -q -O- http://127.0.0.1:7777/health";

/// Swarm's default `--update-monitor`.
const SWARM_DEFAULT_MONITOR: &str = "5s";

/// The smallest `--update-monitor` Swarm keeps: `0s` is read as unset, i.e. 5 s.
const SWARM_MIN_MONITOR: &str = "1ns";

/// The peers measured in each run, in the order they are printed.
const SIDES: [Side; 4] = [
    Side::Cube,
    Side::Swarm(SwarmUpdate {
        order: "stop-first",
        monitor: SWARM_DEFAULT_MONITOR,
    }),
    Side::Swarm(SwarmUpdate {
        order: "stop-first",
        monitor: SWARM_MIN_MONITOR,
    }),
    Side::Swarm(SwarmUpdate {
        order: "start-first",
        monitor: SWARM_MIN_MONITOR,
    }),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Cube,
    Swarm(SwarmUpdate),
}

/// How Swarm updates: its `--update-order` and `--update-monitor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SwarmUpdate {
    order: &'static str,
    monitor: &'static str,
}

impl std::fmt::Display for SwarmUpdate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}, monitor {}", self.order, self.monitor)
    }
}

pub(crate) async fn rolling(runs: usize, copies: usize, cube: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(runs > 0, "--runs must be at least 1");
    anyhow::ensure!(
        copies >= MAX_PARALLEL,
        "--copies must be at least {MAX_PARALLEL}, the copies replaced at a time"
    );
    let docker = crate::containers::connect().await?;
    let runtime = DockerRuntime::connect().await?;
    runtime.ensure_sample_image(SAMPLE_IMAGE).await?;
    let load_before = load_average();
    let cluster = BenchCluster::start(cube, Through::Manager).await?;
    let swarm = Swarm::join()?.with_service(SERVICE);

    let outcome = measure(&docker, &cluster, &swarm, runs, copies).await;
    // Removes the service, and leaves the swarm when this benchmark initialised it.
    drop(swarm);
    cluster.stop_and_sweep(&docker).await;
    let times = outcome?;
    print_tables(&times, runs, copies, &load_before, &load_average());
    Ok(())
}

/// Every run, each peer going first in turn; the times of each run in the order of [`SIDES`].
async fn measure(
    docker: &Docker,
    cluster: &BenchCluster,
    swarm: &Swarm,
    runs: usize,
    copies: usize,
) -> anyhow::Result<Vec<[f64; SIDES.len()]>> {
    let mut times = Vec::with_capacity(runs);
    for run in 0..runs {
        let mut run_ms = [0.0; SIDES.len()];
        for index in (0..SIDES.len()).map(|offset| (run + offset) % SIDES.len()) {
            run_ms[index] = match SIDES[index] {
                Side::Cube => cube_rolling(docker, cluster, run, copies).await?,
                Side::Swarm(update) => swarm_rolling(docker, swarm, copies, update).await?,
            };
        }
        let sides: Vec<String> = SIDES
            .iter()
            .zip(run_ms)
            .map(|(side, ms)| match side {
                Side::Cube => format!("Cube {ms:.0} ms"),
                Side::Swarm(update) => format!("Swarm ({update}) {ms:.0} ms"),
            })
            .collect();
        eprintln!(
            "run {}: {}; load average {}",
            run + 1,
            sides.join(", "),
            load_average()
        );
        times.push(run_ms);
    }
    Ok(times)
}

/// The job at version 1 (untimed), then the update to version 2, timed; the job is stopped
/// and its containers waited for whether or not the update succeeded. The time in ms.
async fn cube_rolling(
    docker: &Docker,
    cluster: &BenchCluster,
    run: usize,
    copies: usize,
) -> anyhow::Result<f64> {
    let name = format!("rolling-{run}");
    let job = ServiceJob::submit_spec(cluster, &name, &job_spec(&name, copies, &V1)).await?;
    let update = cube_update(docker, cluster, &job, &name, copies).await;
    let stopped = job.stop().await;
    let gone = containers::await_none_running(docker, &cluster.container_label()).await;
    let took = update?;
    stopped?;
    gone?;
    Ok(took.as_secs_f64() * 1000.0)
}

async fn cube_update(
    docker: &Docker,
    cluster: &BenchCluster,
    job: &ServiceJob<'_>,
    name: &str,
    copies: usize,
) -> anyhow::Result<Duration> {
    await_deployment(job, 1, Instant::now())
        .await
        .context("version 1")?;

    let started = Instant::now();
    let answer = job.resubmit(&job_spec(name, copies, &V2)).await?;
    let version = answer["Version"]
        .as_u64()
        .with_context(|| format!("no Version in the answer to POST /jobs: {answer}"))?;
    anyhow::ensure!(
        answer["Outcome"] == "changed",
        "the new command was not a new version: {answer}"
    );
    let took = await_deployment(job, version, started).await?;

    check_cube_copies(docker, cluster, job, copies).await?;
    Ok(took)
}

/// The job document: one group of `copies` copies running `cmd`, health checked, replaced
/// [`MAX_PARALLEL`] at a time, each counting as soon as it is healthy.
fn job_spec(name: &str, copies: usize, cmd: &[&str]) -> Value {
    json!({"Name": name, "Type": "service",
           "Groups": [{"Name": GROUP, "Count": copies,
                       "Update": {"MaxParallel": MAX_PARALLEL, "MinHealthyTime": "0s"},
                       "Task": {"Image": SAMPLE_IMAGE, "Cmd": cmd,
                                // Exposed, not published: Cube probes the container's own
                                // port from inside its network namespace, as Swarm's check
                                // runs inside the container, so neither side pays for a
                                // host port (docker-proxy, iptables) on each start.
                                "ExposedPorts": {format!("{SAMPLE_PORT}/tcp"): {}},
                                "HealthCheck": "/health",
                                "HealthCheckInterval": HEALTH_INTERVAL}}]})
}

/// How the deployment of one version stands, from the job's view.
#[derive(Debug, PartialEq, Eq)]
enum Rollout {
    /// Not created yet, or still replacing copies.
    Going,
    /// `successful`.
    Done,
    /// Over without succeeding, or waiting for what will not come: why.
    Stuck(String),
}

/// The `Deployment` of a `GET /jobs/{name}` answer, as far as the benchmark reads it.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DeploymentView {
    version: u64,
    state: String,
    #[serde(default)]
    reason: String,
}

/// Where the deployment of `version` stands in the job view `view`.
fn rollout(view: &Value, version: u64) -> anyhow::Result<Rollout> {
    let Some(deployment) = view.get("Deployment").filter(|value| !value.is_null()) else {
        return Ok(Rollout::Going);
    };
    let deployment: DeploymentView = serde_json::from_value(deployment.clone())
        .with_context(|| format!("reading the job's Deployment: {deployment}"))?;
    // The previous version's deployment stays in the view until the new one is recorded.
    if deployment.version < version {
        return Ok(Rollout::Going);
    }
    if deployment.version > version {
        return Ok(Rollout::Stuck(format!(
            "version {} is rolling out instead",
            deployment.version
        )));
    }
    Ok(match deployment.state.as_str() {
        "successful" => Rollout::Done,
        "running" => Rollout::Going,
        // The job has no canaries: nothing would promote it.
        other => Rollout::Stuck(format!("{other}: {}", deployment.reason)),
    })
}

/// Polls `GET /jobs/{name}` every 10 ms until the deployment of `version` is successful; the
/// time since `started`. Fails when it ends otherwise, or after [`PHASE_BOUND`].
async fn await_deployment(
    job: &ServiceJob<'_>,
    version: u64,
    started: Instant,
) -> anyhow::Result<Duration> {
    loop {
        let view = job.view().await?;
        match rollout(&view, version)? {
            Rollout::Done => return Ok(started.elapsed()),
            Rollout::Stuck(why) => bail!("the deployment of version {version}: {why}"),
            Rollout::Going => {}
        }
        if started.elapsed() > PHASE_BOUND {
            bail!(
                "the deployment of version {version} is not successful after {PHASE_BOUND:?}: {}",
                view["Deployment"]
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Checks (untimed) that the successful deployment left `copies` copies running V2 and no
/// other: in the manager's view and in Docker's list of the worker's running containers.
async fn check_cube_copies(
    docker: &Docker,
    cluster: &BenchCluster,
    job: &ServiceJob<'_>,
    copies: usize,
) -> anyhow::Result<()> {
    let label = cluster.container_label();
    let started = Instant::now();
    let mut looks = 0;
    loop {
        looks += 1;
        let view = job.view().await?;
        let (on_v2, live) = manager_copies(&view);
        let commands = containers::commands_with_label(docker, &label, Listed::Running).await?;
        let in_docker = v2_commands(&commands);
        if on_v2 == copies && live == copies && in_docker == copies && commands.len() == copies {
            if looks > 1 {
                eprintln!(
                    "Cube: {copies} copies on version 2 everywhere {:.0} ms after the \
                     deployment said successful",
                    started.elapsed().as_secs_f64() * 1000.0
                );
            }
            return Ok(());
        }
        if started.elapsed() > CHECK_BOUND {
            bail!(
                "after a successful deployment: the manager has {on_v2} copies running version 2 \
                 of {live} live, Docker runs {} containers of the worker, {in_docker} with \
                 version 2's command (after {CHECK_BOUND:?}; {copies} wanted)",
                commands.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// In a job view: the copies running V2's command, and the live copies (meant to run and not
/// ended), whatever their command.
fn manager_copies(view: &Value) -> (usize, usize) {
    let live: Vec<&Value> = view["Tasks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|task| {
            task["DesiredState"] == "Running"
                && task["State"] != "Failed"
                && task["State"] != "Completed"
        })
        .collect();
    let on_v2 = live
        .iter()
        .filter(|task| task["State"] == "Running" && task["Cmd"] == json!(V2))
        .count();
    (on_v2, live.len())
}

/// How many of Docker's container commands are V2's.
fn v2_commands(commands: &[String]) -> usize {
    commands
        .iter()
        .filter(|command| command.contains(V2_MARKER))
        .count()
}

/// The service at V1, healthy (untimed), then updated to V2 as `update` says, timed; the
/// service is removed and its containers waited for whether or not the update succeeded.
/// The time in ms.
async fn swarm_rolling(
    docker: &Docker,
    swarm: &Swarm,
    copies: usize,
    update: SwarmUpdate,
) -> anyhow::Result<f64> {
    let update = swarm_update(docker, swarm, copies, update).await;
    swarm.remove_service();
    let gone = swarm.await_gone(docker).await;
    let took = update?;
    gone?;
    Ok(took.as_secs_f64() * 1000.0)
}

async fn swarm_update(
    docker: &Docker,
    swarm: &Swarm,
    copies: usize,
    update: SwarmUpdate,
) -> anyhow::Result<Duration> {
    let update_flags = swarm_update_flags(update);
    let mut create_flags: Vec<&str> = update_flags.iter().map(String::as_str).collect();
    create_flags.extend([
        "--health-cmd",
        SWARM_HEALTH_CMD,
        "--health-interval",
        HEALTH_INTERVAL,
    ]);
    swarm.create_with_args(copies, &create_flags, &V1)?;
    swarm
        .await_healthy(docker, copies, Instant::now(), PHASE_BOUND)
        .await
        .context("the first replicas")?;

    // The update settings again, as Cube's job carries its Update block in both versions.
    let args = shell_words(&V2);
    let mut flags: Vec<&str> = update_flags.iter().map(String::as_str).collect();
    flags.extend(["--args", &args]);
    let started = Instant::now();
    swarm.update(&flags)?;
    loop {
        let state = swarm.update_state(docker).await?;
        let commands = swarm.running_commands(docker).await?;
        let on_v2 = v2_commands(&commands);
        match state {
            Some(ServiceUpdateStatusStateEnum::COMPLETED)
                if on_v2 == copies && commands.len() == copies =>
            {
                return Ok(started.elapsed());
            }
            Some(
                stuck @ (ServiceUpdateStatusStateEnum::PAUSED
                | ServiceUpdateStatusStateEnum::ROLLBACK_STARTED
                | ServiceUpdateStatusStateEnum::ROLLBACK_PAUSED
                | ServiceUpdateStatusStateEnum::ROLLBACK_COMPLETED),
            ) => bail!("Swarm's update is {stuck} ({on_v2} replicas on version 2)"),
            _ => {}
        }
        if started.elapsed() > PHASE_BOUND {
            bail!(
                "Swarm's update is {} after {PHASE_BOUND:?}: {} running, {on_v2} on version 2",
                state.map(|state| state.to_string()).unwrap_or_default(),
                commands.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Swarm's update settings matching Cube's `Update` block, in `update`'s order and with its
/// monitor.
fn swarm_update_flags(update: SwarmUpdate) -> Vec<String> {
    [
        "--update-parallelism",
        &MAX_PARALLEL.to_string(),
        "--update-delay",
        "0s",
        "--update-order",
        update.order,
        "--update-monitor",
        update.monitor,
    ]
    .map(str::to_string)
    .to_vec()
}

/// `words` as one shell-quoted string, as the Docker CLI's `--args` reads it: a word with
/// anything but plain characters goes in single quotes (a quote in it as `'\''`).
fn shell_words(words: &[&str]) -> String {
    words
        .iter()
        .map(|word| {
            let plain = !word.is_empty()
                && word
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c));
            if plain {
                word.to_string()
            } else {
                format!("'{}'", word.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn print_tables(
    times: &[[f64; SIDES.len()]],
    runs: usize,
    copies: usize,
    before: &str,
    after: &str,
) {
    println!(
        "rolling: a service of {copies} copies of {SAMPLE_IMAGE} updated from `{}` to `{}`, \
         {MAX_PARALLEL} at a time, health checked on /health every {HEALTH_INTERVAL}; {runs} \
         runs; load average {before} before, {after} after",
        V1.join(" "),
        shell_words(&V2)
    );
    println!();
    println!("| path | median | min | max |");
    println!("|---|---:|---:|---:|");
    for (index, side) in SIDES.iter().enumerate() {
        let path = match side {
            Side::Cube => format!(
                "Cube: POST /jobs (v2; MaxParallel {MAX_PARALLEL}, MinHealthyTime 0s) → \
                 deployment successful"
            ),
            Side::Swarm(update) => format!(
                "Docker Swarm: service update --args (v2; --update-order {}, --update-monitor \
                 {}{}) → completed, {copies} running v2",
                update.order,
                update.monitor,
                match update.monitor {
                    SWARM_DEFAULT_MONITOR => ", its default",
                    SWARM_MIN_MONITOR => ", the smallest it keeps",
                    _ => "",
                }
            ),
        };
        let mut ms: Vec<f64> = times.iter().map(|run| run[index]).collect();
        println!("| {path}, ms | {} |", Summary::of(&mut ms).spread(0));
    }
    for (index, side) in SIDES.iter().enumerate() {
        let Side::Swarm(update) = side else { continue };
        let mut ratios: Vec<f64> = times.iter().map(|run| run[0] / run[index]).collect();
        println!(
            "| ratio run by run, Cube / Swarm ({update}) | {} |",
            Summary::of(&mut ratios).ratios()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deployment_of_a_version_is_done_only_when_that_version_is_successful() {
        let view = |deployment: Value| json!({"Version": 2, "Deployment": deployment});
        let deployment = |version: u64, state: &str| {
            json!({"Version": version, "State": state, "Reason": "why",
                   "Groups": {"api": {"Desired": 10, "Placed": 4, "Healthy": 2,
                                      "Unhealthy": 0, "Old": 6}}})
        };
        assert_eq!(rollout(&json!({"Version": 2}), 2).unwrap(), Rollout::Going);
        assert_eq!(
            rollout(&view(deployment(1, "successful")), 2).unwrap(),
            Rollout::Going,
            "version 1's deployment is still the one shown"
        );
        assert_eq!(
            rollout(&view(deployment(2, "running")), 2).unwrap(),
            Rollout::Going
        );
        assert_eq!(
            rollout(&view(deployment(2, "successful")), 2).unwrap(),
            Rollout::Done
        );
        assert_eq!(
            rollout(&view(deployment(2, "failed")), 2).unwrap(),
            Rollout::Stuck("failed: why".to_string())
        );
        assert!(matches!(
            rollout(&view(deployment(3, "running")), 2).unwrap(),
            Rollout::Stuck(_)
        ));
        assert!(rollout(&view(json!({"State": "running"})), 2).is_err());
    }

    #[test]
    fn cube_comes_first_and_every_swarm_variant_replaces_as_many_at_a_time() {
        // The ratios divide the first side's time by each other's.
        assert_eq!(SIDES[0], Side::Cube);
        for side in &SIDES[1..] {
            let Side::Swarm(update) = side else {
                panic!("{side:?} is not Swarm")
            };
            let flags = swarm_update_flags(*update);
            for pair in [
                ["--update-parallelism", "2"],
                ["--update-delay", "0s"],
                ["--update-order", update.order],
                ["--update-monitor", update.monitor],
            ] {
                assert!(
                    flags.windows(2).any(|flag| flag == pair),
                    "{pair:?} in {flags:?}"
                );
            }
        }
    }

    #[test]
    fn swarm_gets_the_same_command_as_cube_quoted_for_its_args_flag() {
        assert_eq!(
            shell_words(&V2),
            "sh -c 'echo two > /www/v && exec httpd -f -p 7777 -h /www'"
        );
        assert_eq!(shell_words(&V1), V1.join(" "));
        assert_eq!(shell_words(&["echo", "it's", ""]), r"echo 'it'\''s' ''");
        assert!(shell_words(&V2).contains(V2_MARKER) && !V1.join(" ").contains(V2_MARKER));
    }

    #[test]
    fn the_manager_s_copies_on_version_2_are_the_running_ones_with_its_command() {
        let view = json!({"Tasks": [
            {"DesiredState": "Running", "State": "Running", "Cmd": V2},
            {"DesiredState": "Running", "State": "Starting", "Cmd": V2},
            {"DesiredState": "Running", "State": "Running", "Cmd": V1},
            {"DesiredState": "Completed", "State": "Running", "Cmd": V1},
            {"DesiredState": "Running", "State": "Completed", "Cmd": V1},
        ]});
        assert_eq!(manager_copies(&view), (1, 3));
    }
}
