//! `cube-bench chaos`: a cluster of real processes — one `cube manager` on redb, or three on a
//! three-member etcd cluster (`--store etcd`), and real `cube worker`s on Docker — under a
//! mixed workload from a few clients, while faults are injected at random from a seed: a
//! process (manager, worker, etcd member) killed (`kill -9`) and started again, a worker
//! stopped (`SIGSTOP`) past the heartbeat grace then continued, a container killed behind
//! Cube's back, a worker's node drained then made eligible again, a worker's data dir (a
//! small tmpfs of its own, when the run may mount one) filled up then freed. A process that
//! ends on its own is started again, as a supervisor would, and recorded: only a worker whose
//! disk is full may end so. Every operation is recorded with its answer; the workers' own
//! views of what they hold are sampled. When the time is up the faults stop, every process
//! runs again, the cluster settles, and [`check`](super::check) reads the history. The seed is printed first:
//! the same seed makes the same workload and the same faults in the same order (the timing, and
//! so the interleaving, is the machine's).

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use bollard::Docker;
use bollard::query_parameters::{KillContainerOptions, ListContainersOptionsBuilder};
use chrono::{DateTime, Utc};
use cube_runtime::sample_image::SAMPLE_IMAGE;
use cube_types::{State, Task};
use serde_json::{Value, json};
use tokio::process::Child;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::check::{
    self, CapacitySample, Exit, History, Invariant, JobKind, Op, Outcome, Request, Settled,
    SettledContainer, SettledJob, SettledTask,
};
use crate::load::spawn_cube_logged_to;
use cube_test_support::EtcdCluster;

/// How long a worker may be silent before the manager marks it down: short, so that a pause
/// longer than it happens often in a short run.
const HEARTBEAT_GRACE: &str = "4s";
const HEARTBEAT_INTERVAL: &str = "1s";
/// How long a paused worker stays stopped: past the grace.
const PAUSE: Duration = Duration::from_secs(6);
/// What each worker offers: small, so that the waiting list fills.
const WORKER_CPUS: &str = "1";
const WORKER_MEMORY: &str = "1GiB";
/// How many clients send operations at once; each owns the jobs it touches, so that
/// operations on one job are sent one at a time.
const CLIENTS: usize = 4;
/// Job names per client.
const JOBS_PER_CLIENT: usize = 2;
/// A client's think time between two operations, in milliseconds: about ten operations a
/// second from the four clients. Faster churn of containers (thirty a second) deadlocked
/// Docker 20.10's network controller on this machine (`libnetwork-setkey` hooks waiting on
/// its store lock), which stopped the run rather than tested Cube.
const THINK_MIN_MS: u64 = 100;
const THINK_MAX_MS: u64 = 500;
/// How long the run waits for one answer of the Docker engine before it calls the engine
/// hung.
const DOCKER_BOUND: Duration = Duration::from_secs(60);
/// Bare tasks a client keeps at most (it stops one before it makes another): with the jobs'
/// copies, what the clients keep fits in the workers, so that every job can converge.
const TASKS_PER_CLIENT: usize = 6;
/// How often the workers' own views are sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(500);
/// An operation's own bound: past it, its outcome is unknown.
const OP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the cluster may take to settle after the faults stop.
const SETTLE_BOUND: Duration = Duration::from_secs(180);
/// The size of each worker's data dir when the run fills disks: room for its store, little
/// to fill.
const WORKER_DISK: &str = "64m";
/// How often the supervisor looks for a process that ended.
const SUPERVISE_EVERY: Duration = Duration::from_millis(500);
/// A pod: a server and a second service that needs it, restarted as one.
const POD_COMPOSE: &str = "services:\n  web:\n    image: cube-sample:latest\n  side:\n    \
                           image: cube-sample:latest\n    command: [\"sleep\", \"3600\"]\n    \
                           depends_on: [web]\n";

/// Where the managers keep their state in a chaos run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ChaosStore {
    /// One manager on its redb file.
    Redb,
    /// Three managers on a three-member etcd cluster; etcd members are killed too.
    Etcd,
}

pub(crate) struct Options {
    pub seed: Option<u64>,
    pub store: ChaosStore,
    /// The managers on etcd act for their own shards (`--shard-controllers`).
    pub shard_controllers: bool,
    /// The clients' requests spread over this many projects made at the start (`chaos-0`,
    /// …), each client in one; 0: every request in `default`.
    pub projects: usize,
    pub duration: Duration,
    pub workers: usize,
    /// The mean pause between two faults.
    pub fault_every: Duration,
    /// Where the history is written (JSON), for `chaos-check`.
    pub history: Option<PathBuf>,
    pub cube: PathBuf,
}

/// A small deterministic generator (SplitMix64): the run's choices come from the seed alone.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.below(high.saturating_sub(low) + 1))
    }

    /// An independent generator for one part of the run (a client, the faults).
    fn fork(&mut self) -> Rng {
        Rng(self.next())
    }
}

/// One `cube` process the run may kill and start again with the same arguments.
struct Process {
    name: String,
    args: Vec<String>,
    data_dir: PathBuf,
    /// Its log, beside the data dir (which may be filled).
    log: PathBuf,
    child: Option<Child>,
    base: String,
}

impl Process {
    fn new(name: String, args: Vec<String>, dir: PathBuf, data_dir: PathBuf) -> Process {
        Process {
            name,
            args,
            data_dir,
            log: dir.join("cube.log"),
            child: None,
            base: String::new(),
        }
    }

    /// Whether it ended because its disk was full: a worker whose store cannot write stops,
    /// by design, and says why as its last words.
    fn ended_for_a_full_disk(&self) -> bool {
        let Ok(log) = std::fs::read(&self.log) else {
            return false;
        };
        let tail = String::from_utf8_lossy(&log[log.len().saturating_sub(4096)..]).into_owned();
        tail.contains("takes no more writes") && tail.contains("No space left on device")
    }

    async fn start(&mut self, cube: &Path) -> anyhow::Result<()> {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let (child, base, _) = spawn_cube_logged_to(cube, &args, &self.data_dir, &self.log, "info")
            .await
            .with_context(|| format!("starting {}", self.name))?;
        self.child = Some(child);
        self.base = base;
        Ok(())
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    async fn kill(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            child
                .kill()
                .await
                .with_context(|| format!("killing {}", self.name))?;
        }
        Ok(())
    }

    fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let pid = self.pid().context("the process is not running")?;
        let status = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()?;
        anyhow::ensure!(status.success(), "kill {signal} {pid} failed");
        Ok(())
    }
}

/// What the run keeps while it goes: the operations, the samples, the faults.
#[derive(Default)]
struct Record {
    ops: Vec<Op>,
    capacity: Vec<CapacitySample>,
    faults: Vec<(u64, String)>,
    exits: Vec<Exit>,
}

struct Run {
    began: Instant,
    began_utc: DateTime<Utc>,
    http: reqwest::Client,
    /// Every manager's base URL; requests go to the one that answered last.
    managers: Vec<String>,
    last_answered: AtomicUsize,
    record: Mutex<Record>,
}

/// One attempt's result, before the operation's outcome is decided.
enum Attempt {
    Answered(Outcome),
    /// Never reached a manager (refused connection): surely not carried out.
    NotReached(String),
    /// A 5xx or a broken answer: maybe carried out.
    Maybe(String),
}

impl Run {
    fn now_us(&self) -> u64 {
        self.began.elapsed().as_micros() as u64
    }

    async fn attempt(
        &self,
        base: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Attempt {
        let mut builder = self
            .http
            .request(method, format!("{base}{path}"))
            .timeout(timeout);
        if let Some(body) = body {
            builder = builder.json(body);
        }
        match builder.send().await {
            Ok(answer) => {
                let status = answer.status();
                let text = answer.text().await.unwrap_or_default();
                if status.is_success() {
                    let id = serde_json::from_str::<Value>(&text)
                        .ok()
                        .and_then(|body| body["ID"].as_str().map(str::to_owned))
                        .and_then(|id| id.parse().ok());
                    Attempt::Answered(Outcome::Acked { id })
                } else if status.is_client_error() {
                    Attempt::Answered(Outcome::Refused {
                        status: status.as_u16(),
                        message: text,
                    })
                } else {
                    Attempt::Maybe(format!("{status}: {text}"))
                }
            }
            Err(err) if err.is_connect() => Attempt::NotReached(err.to_string()),
            Err(err) => Attempt::Maybe(err.to_string()),
        }
    }

    /// Sends one operation and records it with its outcome. Every operation of the workload
    /// may be sent again safely (a task carries its own ID, a job its whole spec, a scale its
    /// count), so an attempt without an answer is tried again on the next manager, as the CLI
    /// does, until `OP_TIMEOUT`. A 2xx is acknowledged; a 4xx is refused, unless an earlier
    /// attempt may have been carried out; no answer at all is refused when no attempt reached
    /// a manager, and unknown otherwise.
    async fn op(
        &self,
        request: Request,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Outcome {
        let start_us = self.now_us();
        let began = Instant::now();
        let mut at = self.last_answered.load(Ordering::Relaxed);
        let mut maybe: Option<String> = None;
        let mut not_reached = String::new();
        let outcome = loop {
            let left = OP_TIMEOUT.saturating_sub(began.elapsed());
            if left.is_zero() {
                break match maybe.take() {
                    Some(error) => Outcome::Unknown { error },
                    None => Outcome::Refused {
                        status: 0,
                        message: format!("no manager reached: {not_reached}"),
                    },
                };
            }
            let base = &self.managers[at % self.managers.len()];
            match self
                .attempt(base, method.clone(), path, body.as_ref(), left)
                .await
            {
                Attempt::Answered(outcome) => {
                    self.last_answered.store(at, Ordering::Relaxed);
                    break match (outcome, maybe.take()) {
                        (Outcome::Refused { status, message }, Some(earlier)) => Outcome::Unknown {
                            error: format!(
                                "refused ({status}: {message}) after an attempt that may \
                                     have been carried out ({earlier})"
                            ),
                        },
                        (outcome, _) => outcome,
                    };
                }
                Attempt::NotReached(error) => not_reached = error,
                Attempt::Maybe(error) => maybe = Some(error),
            }
            at += 1;
            // A pause between rounds of every manager: one may be starting or electing.
            if at.is_multiple_of(self.managers.len()) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        let end_us = self.now_us();
        let mut record = self.record.lock().await;
        let seq = record.ops.len() as u64;
        record.ops.push(Op {
            seq,
            start_us,
            end_us,
            request,
            outcome: outcome.clone(),
        });
        outcome
    }

    /// A read from whichever manager answers, tried for up to a minute.
    async fn read<T: serde::de::DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        let began = Instant::now();
        let mut at = self.last_answered.load(Ordering::Relaxed);
        loop {
            let base = &self.managers[at % self.managers.len()];
            match crate::get_json(&self.http, &format!("{base}{path}")).await {
                Ok(value) => return Ok(value),
                Err(err) if began.elapsed() > Duration::from_secs(60) => {
                    return Err(err.context(format!("reading {path} from every manager")));
                }
                Err(_) => {
                    at += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
}

/// Makes `project` (not part of the history), asking each manager in turn until one made
/// it or says it exists; bounded as a read is.
async fn make_project(run: &Run, project: &str) -> anyhow::Result<()> {
    let began = Instant::now();
    for attempt in 0.. {
        let base = &run.managers[attempt % run.managers.len()];
        let answer = run
            .http
            .post(format!("{base}/projects"))
            .json(&json!({"Name": project}))
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        if let Ok(answer) = answer
            && matches!(answer.status().as_u16(), 201 | 409)
        {
            return Ok(());
        }
        anyhow::ensure!(
            began.elapsed() < Duration::from_secs(60),
            "no manager made project {project} within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

impl Run {
    /// A POST that is not part of the history (the settling's promotions): sent to each
    /// manager in turn until one answers, whatever it answers.
    async fn nudge(&self, path: &str) {
        for base in &self.managers {
            let sent = self
                .http
                .post(format!("{base}{path}"))
                .timeout(Duration::from_secs(5))
                .send()
                .await;
            if sent.is_ok() {
                return;
            }
        }
    }
}

/// A pod of two services (`POD_COMPOSE`), restarted as a whole up to five times.
fn pod_task(name: &str) -> (Request, Value) {
    let body = json!({"ID": uuid::Uuid::new_v4(), "Name": name, "Cpu": 0.04, "Memory": "32MiB",
                      "RestartPolicy": "always", "MaxRestarts": 5, "RestartDelay": "1s",
                      "Pod": {"Compose": POD_COMPOSE}});
    let request = Request::Task {
        name: name.to_owned(),
        restart_policy: cube_types::task::RestartPolicy::Always,
        max_restarts: Some(5),
        priority: None,
        cpu: 0.04,
        memory: 32 << 20,
    };
    (request, body)
}

/// A bare task's shapes: a server that runs until stopped, a run that ends well, one that
/// fails; with each restart policy.
fn bare_task(rng: &mut Rng, name: &str) -> (Request, Value) {
    let (policy, max_restarts, policy_name) = match rng.below(3) {
        0 => (cube_types::task::RestartPolicy::No, None, "no"),
        1 => (
            cube_types::task::RestartPolicy::OnFailure,
            Some(3),
            "on-failure",
        ),
        _ => (cube_types::task::RestartPolicy::Always, Some(5), "always"),
    };
    let mut body = json!({"ID": uuid::Uuid::new_v4(), "Name": name, "Image": SAMPLE_IMAGE,
                          "Cpu": 0.02, "Memory": "16MiB",
                          "RestartPolicy": policy_name, "RestartDelay": "1s"});
    if let Some(max) = max_restarts {
        body["MaxRestarts"] = json!(max);
    }
    match rng.below(4) {
        0 => body["Cmd"] = json!(["true"]),
        1 => body["Cmd"] = json!(["false"]),
        _ => {}
    }
    let request = Request::Task {
        name: name.to_owned(),
        restart_policy: policy,
        max_restarts,
        priority: None,
        cpu: 0.02,
        memory: 16 << 20,
    };
    (request, body)
}

/// A waiting-list request: one shape per priority, big enough that the workers fill.
fn queued_task(rng: &mut Rng, name: &str) -> (Request, Value) {
    let priority: u8 = if rng.chance(50) { 10 } else { 60 };
    let cpu = 0.25;
    let memory: u64 = 64 << 20;
    let body = json!({"ID": uuid::Uuid::new_v4(), "Name": name, "Image": SAMPLE_IMAGE,
                      "Cpu": cpu, "Memory": "64MiB",
                      "Priority": priority, "QueueTimeout": "20s"});
    let request = Request::Task {
        name: name.to_owned(),
        restart_policy: cube_types::task::RestartPolicy::No,
        max_restarts: None,
        priority: Some(priority),
        cpu,
        memory,
    };
    (request, body)
}

/// A job of one group `g`. A service job whose name ends in `-0` deploys a change through a
/// canary, which waits for `promote`.
fn job_body(name: &str, kind: JobKind, mark: &str, count: u32) -> Value {
    let task = |extra: Value| {
        let mut task = json!({"Image": SAMPLE_IMAGE, "Cpu": 0.05, "Memory": "16MiB",
                              "Env": [format!("CHAOS_MARK={mark}")], "RestartDelay": "1s"});
        if let (Some(task), Value::Object(extra)) = (task.as_object_mut(), extra) {
            task.extend(extra);
        }
        task
    };
    match kind {
        JobKind::Batch => json!({"Name": name, "Type": "batch", "Groups": [{"Name": "g",
            "Count": count,
            "Task": task(json!({"Cmd": ["true"], "RestartPolicy": "on-failure"}))}]}),
        JobKind::System => json!({"Name": name, "Type": "system", "Groups": [{"Name": "g",
            "Task": task(json!({"RestartPolicy": "always"}))}]}),
        JobKind::Service => {
            let mut group = json!({"Name": "g", "Count": count,
                                   "Task": task(json!({"RestartPolicy": "always"}))});
            if is_canary_job(name) {
                group["Update"] = json!({"Canary": 1});
            }
            json!({"Name": name, "Type": "service", "Groups": [group]})
        }
    }
}

fn is_canary_job(name: &str) -> bool {
    name.starts_with("j-") && name.ends_with("-0")
}

/// What one client knows of what it made, to pick its next operation.
#[derive(Default)]
struct ClientState {
    tasks: Vec<(String, uuid::Uuid)>,
    /// Its service jobs: name → stopped.
    jobs: BTreeMap<String, bool>,
    /// Its system job, once submitted: stopped?
    system: Option<bool>,
    batches: usize,
    made: usize,
}

/// `path` in `project` (none: `default`, the path as it is).
fn in_project(path: &str, project: Option<&str>) -> String {
    match project {
        Some(project) => format!("{path}?project={project}"),
        None => path.to_owned(),
    }
}

/// The project client `index` works in, with `projects` of them (0: `default`).
fn client_project(index: usize, projects: usize) -> Option<String> {
    (projects > 0).then(|| format!("chaos-{}", index % projects))
}

async fn client(
    run: Arc<Run>,
    index: usize,
    project: Option<String>,
    mut rng: Rng,
    stop: CancellationToken,
) {
    let path_in = |path: &str| in_project(path, project.as_deref());
    let mut state = ClientState::default();
    while !stop.is_cancelled() {
        state.made += 1;
        let roll = rng.below(100);
        let unique = format!("c{index}-{}", state.made);
        match roll {
            0..=29 if state.tasks.len() < TASKS_PER_CLIENT => {
                let (name, (request, body)) = if rng.chance(25) {
                    let name = format!("p-{unique}");
                    (name.clone(), pod_task(&name))
                } else {
                    let name = format!("t-{unique}");
                    (name.clone(), bare_task(&mut rng, &name))
                };
                let outcome = run
                    .op(
                        request,
                        reqwest::Method::POST,
                        &path_in("/tasks"),
                        Some(body),
                    )
                    .await;
                if let Outcome::Acked { id: Some(id) } = outcome {
                    state.tasks.push((name, id));
                }
            }
            _ if roll < 40 && state.tasks.len() >= TASKS_PER_CLIENT
                || (30..40).contains(&roll) && !state.tasks.is_empty() =>
            {
                let at = rng.below(state.tasks.len() as u64) as usize;
                let (name, id) = state.tasks.swap_remove(at);
                run.op(
                    Request::StopTask { name },
                    reqwest::Method::DELETE,
                    &path_in(&format!("/tasks/{id}")),
                    None,
                )
                .await;
            }
            40..=59 => {
                let name = format!("j-c{index}-{}", rng.below(JOBS_PER_CLIENT as u64));
                let count = 1 + rng.below(3) as u32;
                let mark = format!("m{unique}");
                let body = job_body(&name, JobKind::Service, &mark, count);
                let request = Request::Job {
                    name: name.clone(),
                    kind: JobKind::Service,
                    mark,
                    counts: BTreeMap::from([("g".to_owned(), count)]),
                };
                if let Outcome::Acked { .. } = run
                    .op(
                        request,
                        reqwest::Method::POST,
                        &path_in("/jobs"),
                        Some(body),
                    )
                    .await
                {
                    state.jobs.insert(name, false);
                }
            }
            60..=69 => {
                let running: Vec<String> = state
                    .jobs
                    .iter()
                    .filter(|(_, stopped)| !**stopped)
                    .map(|(name, _)| name.clone())
                    .collect();
                if running.is_empty() {
                    continue;
                }
                let job = running[rng.below(running.len() as u64) as usize].clone();
                let count = rng.below(4) as u32;
                run.op(
                    Request::Scale {
                        job: job.clone(),
                        group: "g".to_owned(),
                        count,
                    },
                    reqwest::Method::POST,
                    &path_in(&format!("/jobs/{job}/scale")),
                    Some(json!({"Group": "g", "Count": count})),
                )
                .await;
            }
            70..=73 if !state.jobs.is_empty() || state.system.is_some() => {
                let system = format!("sys-c{index}");
                let mut names: Vec<String> = state.jobs.keys().cloned().collect();
                if state.system.is_some() {
                    names.push(system.clone());
                }
                let job = names[rng.below(names.len() as u64) as usize].clone();
                if let Outcome::Acked { .. } = run
                    .op(
                        Request::StopJob { name: job.clone() },
                        reqwest::Method::DELETE,
                        &path_in(&format!("/jobs/{job}")),
                        None,
                    )
                    .await
                {
                    if job == system {
                        state.system = Some(true);
                    } else {
                        state.jobs.insert(job, true);
                    }
                }
            }
            74..=79 if state.batches < 5 => {
                state.batches += 1;
                let name = format!("b-{unique}");
                let mark = format!("m{unique}");
                let body = job_body(&name, JobKind::Batch, &mark, 2);
                let request = Request::Job {
                    name,
                    kind: JobKind::Batch,
                    mark,
                    counts: BTreeMap::from([("g".to_owned(), 2)]),
                };
                run.op(
                    request,
                    reqwest::Method::POST,
                    &path_in("/jobs"),
                    Some(body),
                )
                .await;
            }
            // Two of the clients keep a system job each, changed now and then.
            85..=87 if index < 2 => {
                let name = format!("sys-c{index}");
                let mark = format!("m{unique}");
                let request = Request::Job {
                    name: name.clone(),
                    kind: JobKind::System,
                    mark: mark.clone(),
                    counts: BTreeMap::from([("g".to_owned(), 0)]),
                };
                let body = job_body(&name, JobKind::System, &mark, 0);
                if let Outcome::Acked { .. } = run
                    .op(
                        request,
                        reqwest::Method::POST,
                        &path_in("/jobs"),
                        Some(body),
                    )
                    .await
                {
                    state.system = Some(false);
                }
            }
            88..=90 => {
                let canaries: Vec<&String> = state
                    .jobs
                    .iter()
                    .filter(|(name, stopped)| !**stopped && is_canary_job(name))
                    .map(|(name, _)| name)
                    .collect();
                let Some(job) = canaries.first().map(|name| name.to_string()) else {
                    continue;
                };
                run.op(
                    Request::Promote { job: job.clone() },
                    reqwest::Method::POST,
                    &path_in(&format!("/jobs/{job}/promote")),
                    None,
                )
                .await;
            }
            80..=84 if !state.tasks.is_empty() => {
                let at = rng.below(state.tasks.len() as u64) as usize;
                let (name, id) = state.tasks[at].clone();
                run.op(
                    Request::RestartTask { name },
                    reqwest::Method::POST,
                    &path_in(&format!("/tasks/{id}/restart")),
                    None,
                )
                .await;
            }
            _ => {
                let name = format!("q-{unique}");
                let (request, body) = queued_task(&mut rng, &name);
                let outcome = run
                    .op(
                        request,
                        reqwest::Method::POST,
                        &path_in("/tasks"),
                        Some(body),
                    )
                    .await;
                if let Outcome::Acked { id: Some(id) } = outcome {
                    state.tasks.push((name, id));
                }
            }
        }
        // A client's think time between two operations.
        tokio::select! {
            () = stop.cancelled() => {}
            () = tokio::time::sleep(rng.millis(THINK_MIN_MS, THINK_MAX_MS)) => {}
        }
    }
}

/// Samples each worker's own view: what it holds (its tasks not ended) next to what it
/// offers.
async fn sampler(run: Arc<Run>, workers: Arc<Mutex<Vec<Process>>>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    while !stop.is_cancelled() {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let bases: Vec<(String, String)> = workers
            .lock()
            .await
            .iter()
            .filter(|worker| worker.child.is_some())
            .map(|worker| (worker.name.clone(), worker.base.clone()))
            .collect();
        for (name, base) in bases {
            let Ok(sample) = sample_worker(&run.http, &name, &base, run.now_us()).await else {
                continue; // Stopped or restarting: nothing to sample.
            };
            run.record.lock().await.capacity.push(sample);
        }
    }
}

async fn sample_worker(
    http: &reqwest::Client,
    name: &str,
    base: &str,
    at_us: u64,
) -> anyhow::Result<CapacitySample> {
    let timeout = Duration::from_secs(2);
    let node: Value = http
        .get(format!("{base}/node"))
        .timeout(timeout)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let tasks: Vec<Task> = http
        .get(format!("{base}/tasks"))
        .timeout(timeout)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let held = tasks
        .iter()
        .filter(|task| matches!(task.status.state, State::Scheduled | State::Running));
    let (cpu_used, memory_used) = held.fold((0.0, 0), |(cpu, memory), task| {
        (cpu + task.spec.cpu, memory + task.spec.memory)
    });
    Ok(CapacitySample {
        node: name.to_owned(),
        at_us,
        cpu_used,
        cpu_total: node["Capacity"]["Cpu"].as_f64().unwrap_or(0.0),
        memory_used,
        memory_total: node["Capacity"]["Memory"].as_u64().unwrap_or(0),
    })
}

/// What the faults are done to.
struct Targets {
    cube: PathBuf,
    managers: Arc<Mutex<Vec<Process>>>,
    workers: Arc<Mutex<Vec<Process>>>,
    /// The etcd cluster the managers share, with `--store etcd`.
    etcd: Option<Arc<std::sync::Mutex<EtcdCluster>>>,
    docker: Docker,
    /// Each worker's data dir is a small tmpfs of its own, which a fault may fill.
    disks: bool,
}

fn outcome_word(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Acked { .. } => "acknowledged",
        Outcome::Refused { .. } => "refused",
        Outcome::Unknown { .. } => "no answer",
    }
}

/// Kills etcd member `index` and starts it again after `down`, off the runtime's threads
/// (the test support's cluster is synchronous and panics when a member cannot start).
async fn bounce_etcd_member(
    etcd: Arc<std::sync::Mutex<EtcdCluster>>,
    index: usize,
    down: Duration,
) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || {
        let mut cluster = etcd.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        cluster.kill(index);
        std::thread::sleep(down);
        cluster.restart(index);
    })
    .await
    .map_err(|err| anyhow::anyhow!("etcd member {index} did not start again: {err}"))
}

/// Kills one of `processes` (chosen by `rng`) with -9 and starts it again after up to
/// `down_ms`; answers what was done. One that does not start again (a worker whose disk is
/// full) is left to the supervisor.
async fn bounce(
    processes: &Mutex<Vec<Process>>,
    rng: &mut Rng,
    down_ms: u64,
    cube: &Path,
) -> anyhow::Result<String> {
    let mut processes = processes.lock().await;
    let at = rng.below(processes.len() as u64) as usize;
    let process = &mut processes[at];
    process.kill().await?;
    tokio::time::sleep(rng.millis(0, down_ms)).await;
    Ok(match process.start(cube).await {
        Ok(()) => format!("{} killed (-9) and started again", process.name),
        Err(err) => format!(
            "{} killed (-9); it did not start again at once ({err:#})",
            process.name
        ),
    })
}

/// Starts again, as a supervisor would, each process that ended without being killed by the
/// run, and records the end: only a worker whose disk is full may end so.
async fn supervise(
    run: Arc<Run>,
    groups: [Arc<Mutex<Vec<Process>>>; 2],
    cube: PathBuf,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(SUPERVISE_EVERY);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        for group in &groups {
            let mut processes = group.lock().await;
            for process in processes.iter_mut() {
                let ended = match process.child.as_mut().map(Child::try_wait) {
                    Some(Ok(Some(status))) => Some(status.to_string()),
                    Some(Err(err)) => Some(format!("cannot be waited for: {err}")),
                    Some(Ok(None)) | None => None,
                };
                if let Some(status) = ended {
                    process.child = None;
                    run.record.lock().await.exits.push(Exit {
                        process: process.name.clone(),
                        at_us: run.now_us(),
                        status,
                        expected: process.ended_for_a_full_disk(),
                    });
                }
                if process.child.is_none() {
                    // While its disk is full a worker may not start: tried again next time.
                    let _ = process.start(&cube).await;
                }
            }
        }
    }
}

/// Mounts a tmpfs of `size` at `dir` (which must exist); unmounted when the guard goes.
struct Mounts(Vec<PathBuf>);

impl Mounts {
    fn mount(&mut self, dir: &Path, size: &str) -> anyhow::Result<()> {
        let output = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .context("running mount")?;
        anyhow::ensure!(
            output.status.success(),
            "mount -t tmpfs at {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
        self.0.push(dir.to_owned());
        Ok(())
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        for dir in &self.0 {
            // Lazy: a process still in it lets go when it ends.
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(dir)
                .status();
        }
    }
}

/// Writes zeros into `dir` until its file system is full; answers how many bytes.
fn fill_disk(dir: &Path) -> std::io::Result<u64> {
    use std::io::Write;
    let mut file = std::fs::File::create(dir.join("chaos-fill"))?;
    let chunk = vec![0u8; 1 << 20];
    let mut written = 0u64;
    loop {
        match file.write(&chunk) {
            Ok(0) => return Ok(written),
            Ok(n) => written += n as u64,
            Err(err) if err.raw_os_error() == Some(28) => return Ok(written), // ENOSPC
            Err(err) => return Err(err),
        }
    }
}

/// The fault loop: a fault at random moments until `stop`. A fault that lasts (a pause, a
/// drain, a full disk) ends on a timer of its own, so that the next one need not wait for it;
/// a target in such a fault is not chosen for another of its kind until it ends.
async fn faults(
    run: Arc<Run>,
    targets: Targets,
    mut rng: Rng,
    every: Duration,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let Targets {
        cube,
        managers,
        workers,
        etcd,
        docker,
        disks,
    } = targets;
    let every_ms = every.as_millis() as u64;
    let busy: Arc<std::sync::Mutex<HashSet<String>>> = Arc::default();
    let mut lasting: tokio::task::JoinSet<anyhow::Result<()>> = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(rng.millis(every_ms / 2, every_ms * 3 / 2)) => {}
        }
        // A lasting fault that failed ends the run now, not at its end.
        while let Some(ended) = lasting.try_join_next() {
            ended.context("a lasting fault")??;
        }
        let at = run.now_us();
        // Claims `key` for a lasting fault; false when one of its kind holds it.
        let claim = |key: String| {
            busy.lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .insert(key)
        };
        let what = match rng.below(100) {
            0..=9 if etcd.is_some() => {
                let Some(etcd) = &etcd else { continue };
                let index = rng.below(3) as usize;
                bounce_etcd_member(etcd.clone(), index, rng.millis(0, 3000)).await?;
                format!("etcd member {index} killed (-9) and started again")
            }
            0..=17 => bounce(&managers, &mut rng, 2000, &cube).await?,
            18..=39 => format!("worker {}", bounce(&workers, &mut rng, 3000, &cube).await?),
            40..=52 => {
                let name = {
                    let workers = workers.lock().await;
                    let at = rng.below(workers.len() as u64) as usize;
                    let name = workers[at].name.clone();
                    if !claim(format!("pause {name}")) {
                        continue;
                    }
                    if workers[at].signal("-STOP").is_err() {
                        // Not running (its disk is full): nothing to pause.
                        release(&busy, &format!("pause {name}"));
                        continue;
                    }
                    name
                };
                let (run, workers, busy) = (run.clone(), workers.clone(), busy.clone());
                lasting.spawn(async move {
                    tokio::time::sleep(PAUSE).await;
                    {
                        let workers = workers.lock().await;
                        if let Some(worker) = workers.iter().find(|w| w.name == name) {
                            let _ = worker.signal("-CONT");
                        }
                    }
                    release(&busy, &format!("pause {name}"));
                    let what =
                        format!("worker {name} stopped (SIGSTOP) for {PAUSE:?}, then continued");
                    run.record.lock().await.faults.push((at, what));
                    Ok(())
                });
                continue;
            }
            73..=84 => {
                let name = {
                    let workers = workers.lock().await;
                    workers[rng.below(workers.len() as u64) as usize]
                        .name
                        .clone()
                };
                if !claim(format!("drain {name}")) {
                    continue;
                }
                let drained_for = rng.millis(3000, 12000);
                let (run, busy) = (run.clone(), busy.clone());
                lasting.spawn(async move {
                    let drain = run
                        .op(
                            Request::Drain { node: name.clone() },
                            reqwest::Method::POST,
                            &format!("/nodes/{name}/drain"),
                            Some(json!({"Deadline": "10s"})),
                        )
                        .await;
                    tokio::time::sleep(drained_for).await;
                    let eligible = run
                        .op(
                            Request::Eligible { node: name.clone() },
                            reqwest::Method::POST,
                            &format!("/nodes/{name}/eligibility"),
                            Some(json!({"Eligible": true})),
                        )
                        .await;
                    release(&busy, &format!("drain {name}"));
                    let what = format!(
                        "worker {name} drained ({}) for {drained_for:?}, then eligible again ({})",
                        outcome_word(&drain),
                        outcome_word(&eligible)
                    );
                    run.record.lock().await.faults.push((at, what));
                    Ok(())
                });
                continue;
            }
            85..=99 if disks => {
                let (name, data_dir) = {
                    let workers = workers.lock().await;
                    let at = rng.below(workers.len() as u64) as usize;
                    (workers[at].name.clone(), workers[at].data_dir.clone())
                };
                if !claim(format!("disk {name}")) {
                    continue;
                }
                let full_for = rng.millis(2000, 8000);
                let (run, busy) = (run.clone(), busy.clone());
                lasting.spawn(async move {
                    let dir = data_dir.clone();
                    let written = tokio::task::spawn_blocking(move || fill_disk(&dir))
                        .await
                        .context("filling a disk")?
                        .with_context(|| format!("filling {}", data_dir.display()))?;
                    tokio::time::sleep(full_for).await;
                    std::fs::remove_file(data_dir.join("chaos-fill"))
                        .with_context(|| format!("freeing {}", data_dir.display()))?;
                    release(&busy, &format!("disk {name}"));
                    let what = format!(
                        "worker {name}'s disk full ({} MiB written) for {full_for:?}, then freed",
                        written >> 20
                    );
                    run.record.lock().await.faults.push((at, what));
                    Ok(())
                });
                continue;
            }
            _ => {
                let names: Vec<String> = workers
                    .lock()
                    .await
                    .iter()
                    .map(|w| w.name.clone())
                    .collect();
                let containers = cube_containers(&docker, &names).await?;
                let running: Vec<&(String, bollard::models::ContainerSummary)> = containers
                    .iter()
                    .filter(|(_, c)| c.state.as_ref().is_some_and(|s| s.to_string() == "running"))
                    .collect();
                if running.is_empty() {
                    continue;
                }
                let (node, container) = running[rng.below(running.len() as u64) as usize];
                let id = container.id.clone().unwrap_or_default();
                // It may be gone already: that is no failure of the run.
                let killed = docker.kill_container(&id, None::<KillContainerOptions>);
                tokio::time::timeout(DOCKER_BOUND, killed)
                    .await
                    .map_err(|_| docker_hung("killing a container"))?
                    .ok();
                format!(
                    "container {} on {node} killed behind Cube's back",
                    &id[..12.min(id.len())]
                )
            }
        };
        run.record.lock().await.faults.push((at, what));
    }
    // The lasting faults end on their timers (12 s at most) before the run settles.
    while let Some(ended) = lasting.join_next().await {
        ended.context("a lasting fault")??;
    }
    // Lasting faults were recorded as they ended: in the order they began.
    run.record.lock().await.faults.sort_by_key(|(at, _)| *at);
    Ok(())
}

/// Lets a target of a lasting fault be chosen again.
fn release(busy: &std::sync::Mutex<HashSet<String>>, key: &str) {
    busy.lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .remove(key);
}

/// A Docker engine that did not answer within `DOCKER_BOUND`: not Cube's violation, and the
/// run cannot go on. `cube-bench chaos` exits with [`DockerHung::EXIT_CODE`] for it, so that a
/// script can tell it from a violation.
#[derive(Debug, thiserror::Error)]
#[error(
    "the Docker engine did not answer in {bound:?} ({doing}): it is hung, and the run cannot go \
     on (`kill -USR1` of dockerd writes its goroutines to /var/run/docker/ to see where)"
)]
pub struct DockerHung {
    bound: Duration,
    doing: String,
}

impl DockerHung {
    /// The exit status of a run the Docker engine stopped (a violation is 1).
    pub const EXIT_CODE: i32 = 3;
}

fn docker_hung(doing: &str) -> anyhow::Error {
    DockerHung {
        bound: DOCKER_BOUND,
        doing: doing.to_string(),
    }
    .into()
}

/// Every container of the given workers, with the worker's name.
async fn cube_containers(
    docker: &Docker,
    nodes: &[String],
) -> anyhow::Result<Vec<(String, bollard::models::ContainerSummary)>> {
    let filters = std::collections::HashMap::from([(
        "label".to_owned(),
        vec![cube_runtime::LABEL_TASK_ID.to_owned()],
    )]);
    let options = ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    let containers = tokio::time::timeout(DOCKER_BOUND, docker.list_containers(Some(options)))
        .await
        .map_err(|_| docker_hung("listing containers"))??;
    Ok(containers
        .into_iter()
        .filter_map(|container| {
            let node = container
                .labels
                .as_ref()?
                .get(cube_runtime::LABEL_NODE)?
                .clone();
            nodes.contains(&node).then_some((node, container))
        })
        .collect())
}

/// The cluster as it is now, in the checker's terms.
async fn observe(
    run: &Run,
    docker: &Docker,
    workers: &[String],
    capacity: Vec<CapacitySample>,
) -> anyhow::Result<Settled> {
    let tasks: Vec<Task> = run.read("/tasks?project=*").await?;
    let jobs: Vec<Value> = run.read("/jobs?project=*").await?;
    let since_start = |at: DateTime<Utc>| {
        (at - run.began_utc)
            .num_microseconds()
            .map(|us| us.max(0) as u64)
    };
    let tasks = tasks
        .into_iter()
        .map(|task| SettledTask {
            id: task.id,
            mark: task
                .spec
                .env
                .iter()
                .find_map(|var| var.strip_prefix("CHAOS_MARK=").map(str::to_owned)),
            pending_reason: task.status.pending_reason.clone(),
            project: task.spec.project.clone(),
            first_placed_us: task
                .status
                .history
                .iter()
                .find(|entry| entry.event == "Placed")
                .and_then(|entry| since_start(entry.time)),
            name: task.name,
            // A copy names its job by its key, `PROJECT/NAME` outside `default`: the name is
            // what the history knows the job by.
            job: task
                .spec
                .job
                .rsplit_once('/')
                .map_or(task.spec.job.as_str(), |(_, name)| name)
                .to_owned(),
            group: task.spec.group.clone(),
            index: task.spec.index,
            state: task.status.state,
            desired_state: task.spec.desired_state,
            node: task.status.node_name.into(),
            restart_count: task.status.restart_count,
            restart_policy: task.spec.restart_policy,
            max_restarts: task.spec.max_restarts,
        })
        .collect();
    let jobs = jobs
        .iter()
        .map(|job| SettledJob {
            name: job["Job"]["Name"].as_str().unwrap_or_default().to_owned(),
            project: job["Job"]["Project"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            stopped: job["Stopped"].as_bool().unwrap_or(false),
        })
        .collect();
    let containers = cube_containers(docker, workers)
        .await?
        .into_iter()
        .map(|(node, container)| {
            let labels = container.labels.unwrap_or_default();
            SettledContainer {
                node,
                name: container
                    .names
                    .and_then(|names| names.into_iter().next())
                    .unwrap_or_default()
                    .trim_start_matches('/')
                    .to_owned(),
                running: container
                    .state
                    .is_some_and(|state| state.to_string() == "running"),
                task: labels
                    .get(cube_runtime::LABEL_TASK_ID)
                    .and_then(|id| id.parse().ok()),
                role: labels
                    .get(cube_runtime::LABEL_POD_CONTAINER)
                    .cloned()
                    .unwrap_or_default(),
            }
        })
        .collect();
    Ok(Settled {
        tasks,
        jobs,
        containers,
        container_nodes: workers.iter().cloned().collect(),
        capacity,
    })
}

/// Whether an invariant can still come true as the cluster settles (the others are facts of
/// the past: a sample over capacity, an order of admission, a restart count).
fn settles(invariant: Invariant) -> bool {
    matches!(
        invariant,
        Invariant::OneContainerPerRun | Invariant::NoOrphanContainer | Invariant::JobConverged
    )
}

pub(crate) async fn chaos(options: Options) -> anyhow::Result<()> {
    let seed = options
        .seed
        .unwrap_or_else(|| uuid::Uuid::new_v4().as_u64_pair().0);
    let on_etcd = options.store == ChaosStore::Etcd;
    println!(
        "chaos: seed {seed}, {:?}, {}, {} workers on Docker{}; replay with --seed {seed}{}{}",
        options.duration,
        if on_etcd && options.shard_controllers {
            "3 managers acting for their own shards on a 3-member etcd"
        } else if on_etcd {
            "3 managers on a 3-member etcd"
        } else {
            "one manager (redb)"
        },
        options.workers,
        if options.projects > 0 {
            format!(", the clients in {} projects", options.projects)
        } else {
            String::new()
        },
        match (on_etcd, options.shard_controllers) {
            (true, true) => " --store etcd --shard-controllers",
            (true, false) => " --store etcd",
            _ => "",
        },
        if options.projects > 0 {
            format!(" --projects {}", options.projects)
        } else {
            String::new()
        }
    );
    let mut rng = Rng(seed);
    let cube = options.cube.clone();
    cube_runtime::DockerRuntime::connect()
        .await?
        .ensure_sample_image(SAMPLE_IMAGE)
        .await?;
    let docker = crate::containers::connect().await?;
    let dir = tempfile::Builder::new().prefix("cube-chaos-").tempdir()?;

    let etcd = match on_etcd {
        true => Some(Arc::new(std::sync::Mutex::new(
            tokio::task::spawn_blocking(|| EtcdCluster::start(3))
                .await
                .map_err(|err| anyhow::anyhow!("the etcd cluster did not start: {err}"))?,
        ))),
        false => None,
    };
    let mut base_args: Vec<String> = [
        "manager",
        "-H",
        "127.0.0.1",
        "-p",
        "0",
        "--heartbeat-grace",
        HEARTBEAT_GRACE,
        "--gc-after",
        "24h",
    ]
    .map(str::to_owned)
    .to_vec();
    match &etcd {
        Some(etcd) => {
            let endpoints = etcd
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .endpoints_flag();
            base_args.extend(
                [
                    "-d",
                    "etcd",
                    "--etcd-endpoints",
                    &endpoints,
                    "--etcd-prefix",
                    &format!("/chaos-{seed}"),
                    "--leader-ttl",
                    "2s",
                ]
                .map(str::to_owned),
            );
            if options.shard_controllers {
                base_args.push("--shard-controllers".to_string());
            }
        }
        None => base_args.extend(["-d", "persistent"].map(str::to_owned)),
    }
    let mut managers = Vec::new();
    for index in 0..if on_etcd { 3 } else { 1 } {
        let data_dir = dir.path().join(format!("manager{index}"));
        std::fs::create_dir_all(&data_dir)?;
        let mut manager = Process::new(
            format!("manager {index}"),
            base_args.clone(),
            data_dir.clone(),
            data_dir,
        );
        manager.start(&cube).await?;
        // Started again on the same port, so that clients and workers find it where it was.
        let port = manager
            .base
            .rsplit_once(':')
            .map(|(_, port)| port.to_owned())
            .context("the manager's port")?;
        manager.args[4] = port;
        managers.push(manager);
    }
    let address = managers
        .iter()
        .map(|manager| manager.base.trim_start_matches("http://"))
        .collect::<Vec<_>>()
        .join(",");
    let run_id = &uuid::Uuid::new_v4().simple().to_string()[..6];
    let mut workers = Vec::new();
    // Declared after `dir`, so unmounted before it is removed.
    let mut mounts = Mounts(Vec::new());
    let mut disks = true;
    for index in 0..options.workers {
        let name = format!("chaos-{run_id}-w{index}");
        let worker_dir = dir.path().join(&name);
        let data_dir = worker_dir.join("data");
        std::fs::create_dir_all(&data_dir)?;
        if disks && let Err(err) = mounts.mount(&data_dir, WORKER_DISK) {
            println!("chaos: no full-disk faults in this run: {err:#}");
            disks = false;
        }
        let mut worker = Process::new(
            name.clone(),
            [
                "worker",
                "-H",
                "127.0.0.1",
                "-p",
                "0",
                "-n",
                &name,
                "-d",
                "persistent",
                "--manager",
                &address,
                "--heartbeat-interval",
                HEARTBEAT_INTERVAL,
                "--cpus",
                WORKER_CPUS,
                "--memory",
                WORKER_MEMORY,
                "--stop-timeout",
                "1s",
            ]
            .map(str::to_owned)
            .to_vec(),
            worker_dir,
            data_dir,
        );
        worker.start(&cube).await?;
        workers.push(worker);
    }
    let worker_names: Vec<String> = workers.iter().map(|w| w.name.clone()).collect();
    let run = Arc::new(Run {
        began: Instant::now(),
        began_utc: Utc::now(),
        http: reqwest::Client::builder().build()?,
        managers: managers
            .iter()
            .map(|manager| manager.base.clone())
            .collect(),
        last_answered: AtomicUsize::new(0),
        record: Mutex::new(Record::default()),
    });
    let managers = Arc::new(Mutex::new(managers));
    let workers = Arc::new(Mutex::new(workers));

    let stop_clients = CancellationToken::new();
    let stop_faults = CancellationToken::new();
    let mut clients = tokio::task::JoinSet::new();
    for project in (0..options.projects.min(CLIENTS))
        .filter_map(|index| client_project(index, options.projects))
    {
        make_project(&run, &project).await?;
    }
    for index in 0..CLIENTS {
        clients.spawn(client(
            run.clone(),
            index,
            client_project(index, options.projects),
            rng.fork(),
            stop_clients.clone(),
        ));
    }
    let sampling = tokio::spawn(sampler(run.clone(), workers.clone(), stop_clients.clone()));
    let stop_supervisor = CancellationToken::new();
    let supervisor = tokio::spawn(supervise(
        run.clone(),
        [managers.clone(), workers.clone()],
        cube.clone(),
        stop_supervisor.clone(),
    ));
    let targets = Targets {
        cube: cube.clone(),
        managers: managers.clone(),
        workers: workers.clone(),
        etcd: etcd.clone(),
        docker: docker.clone(),
        disks,
    };
    let fault_loop = tokio::spawn(faults(
        run.clone(),
        targets,
        rng.fork(),
        options.fault_every,
        stop_faults.clone(),
    ));
    tokio::time::sleep(options.duration).await;
    stop_faults.cancel();
    fault_loop.await.context("the fault loop")??;
    stop_clients.cancel();
    while let Some(joined) = clients.join_next().await {
        joined.context("a client")?;
    }

    // Settle: every process runs; every node is eligible; the waiting list's requests are
    // stopped (waiting or let in, so that the jobs have room); then the cluster is read until
    // the invariants that settle hold (waiting canaries promoted), or the bound passes.
    {
        for manager in managers.lock().await.iter_mut() {
            if manager.child.is_none() {
                manager.start(&cube).await?;
            }
        }
        for worker in workers.lock().await.iter_mut() {
            if worker.child.is_none() {
                worker.start(&cube).await?;
            }
            let _ = worker.signal("-CONT");
        }
    }
    for name in &worker_names {
        run.op(
            Request::Eligible { node: name.clone() },
            reqwest::Method::POST,
            &format!("/nodes/{name}/eligibility"),
            Some(json!({"Eligible": true})),
        )
        .await;
    }
    let pending: Vec<Task> = run.read("/tasks?project=*").await?;
    for task in pending.iter().filter(|task| {
        task.name.starts_with("q-")
            && !task.status.state.is_terminal()
            && task.spec.desired_state == State::Running
    }) {
        run.op(
            Request::StopTask {
                name: task.name.clone(),
            },
            reqwest::Method::DELETE,
            &in_project(
                &format!("/tasks/{}", task.id),
                (!task.spec.project.is_empty()).then_some(task.spec.project.as_str()),
            ),
            None,
        )
        .await;
    }
    sampling.abort();
    let settle_began = Instant::now();
    let history = loop {
        let record = run.record.lock().await;
        let capacity = record.capacity.clone();
        let ops = record.ops.clone();
        let exits = record.exits.clone();
        drop(record);
        let settled = observe(&run, &docker, &worker_names, capacity).await?;
        let history = History {
            seed,
            ops,
            settled,
            exits,
        };
        let open: Vec<check::Violation> = check::check(&history)
            .into_iter()
            .filter(|violation| settles(violation.invariant))
            .collect();
        if open.is_empty() || settle_began.elapsed() > SETTLE_BOUND {
            break history;
        }
        // A canary deployment waits for a promotion, which the clients may not have sent.
        for job in history
            .settled
            .jobs
            .iter()
            .filter(|job| !job.stopped && is_canary_job(&job.name))
        {
            run.nudge(&in_project(
                &format!("/jobs/{}/promote", job.name),
                (!job.project.is_empty()).then_some(job.project.as_str()),
            ))
            .await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let settled_in = settle_began.elapsed();
    stop_supervisor.cancel();
    supervisor.await.context("the supervisor")?;
    let found = check::check(&history);
    let record = run.record.lock().await;
    report(
        &history,
        &record.faults,
        options.duration,
        settled_in,
        &found,
    );
    if let Some(path) = &options.history {
        std::fs::write(path, serde_json::to_vec_pretty(&history)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("history written to {}", path.display());
    }
    // Cube's containers of this run go with it, once its workers have stopped (a worker
    // still running would start a removed container of a task again).
    for process in workers.lock().await.iter_mut() {
        process.kill().await?;
    }
    for process in managers.lock().await.iter_mut() {
        process.kill().await?;
    }
    for (_, container) in cube_containers(&docker, &worker_names).await? {
        if let Some(id) = container.id {
            let options = bollard::query_parameters::RemoveContainerOptionsBuilder::default()
                .force(true)
                .build();
            tokio::time::timeout(DOCKER_BOUND, docker.remove_container(&id, Some(options)))
                .await
                .map_err(|_| docker_hung("removing the run's containers"))?
                .ok();
        }
    }
    if !found.is_empty() {
        let kept = dir.keep();
        print_log_lines(&kept, &found);
        anyhow::bail!(
            "{} invariant violations in the run of seed {seed}; the processes' logs are kept in {}",
            found.len(),
            kept.display()
        );
    }
    Ok(())
}

fn report(
    history: &History,
    faults: &[(u64, String)],
    duration: Duration,
    settled_in: Duration,
    found: &[check::Violation],
) {
    let count =
        |f: &dyn Fn(&Outcome) -> bool| history.ops.iter().filter(|op| f(&op.outcome)).count();
    let acked = count(&|o| matches!(o, Outcome::Acked { .. }));
    let refused = count(&|o| matches!(o, Outcome::Refused { .. }));
    let unknown = count(&|o| matches!(o, Outcome::Unknown { .. }));
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, what) in faults {
        let kind = if what.starts_with("manager") {
            "manager killed"
        } else if what.starts_with("etcd") {
            "etcd member killed"
        } else if what.contains("killed (-9)") {
            "worker killed"
        } else if what.contains("SIGSTOP") {
            "worker paused"
        } else if what.contains("drained") {
            "node drained"
        } else if what.contains("disk full") {
            "disk full"
        } else {
            "container killed"
        };
        *kinds.entry(kind).or_default() += 1;
    }
    println!();
    println!(
        "| seed | duration | operations (acked / refused / unknown) | faults | settled in | violations |"
    );
    println!("|---|---|---|---|---|---|");
    let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
    println!(
        "| {} | {:?} | {} ({acked} / {refused} / {unknown}) | {} ({}) | {:.1} s | {} |",
        history.seed,
        duration,
        history.ops.len(),
        faults.len(),
        kinds.join(", "),
        settled_in.as_secs_f64(),
        found.len()
    );
    println!(
        "\nchecked: {} tasks, {} jobs, {} containers, {} capacity samples; {} processes ended \
         on their own ({} of them with a full disk) and were started again",
        history.settled.tasks.len(),
        history.settled.jobs.len(),
        history.settled.containers.len(),
        history.settled.capacity.len(),
        history.exits.len(),
        history.exits.iter().filter(|exit| exit.expected).count()
    );
    for violation in found {
        println!("VIOLATION (seed {}) {violation}", history.seed);
        for seq in &violation.ops {
            if let Some(op) = history.ops.get(*seq as usize) {
                println!(
                    "    #{seq} at {:.3} s .. {:.3} s: {:?} → {:?}",
                    op.start_us as f64 / 1e6,
                    op.end_us as f64 / 1e6,
                    op.request,
                    op.outcome
                );
            }
        }
    }
    for (at, what) in faults {
        println!("fault at {:.3} s: {what}", *at as f64 / 1e6);
    }
}

/// For each violation, the processes' log lines that name what it names (a task's name or
/// ID, a job's name), at most a few per violation.
fn print_log_lines(dir: &Path, found: &[check::Violation]) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let logs: Vec<(String, String)> = entries
        .flatten()
        .filter_map(|entry| {
            let text = std::fs::read_to_string(entry.path().join("cube.log")).ok()?;
            Some((entry.file_name().to_string_lossy().into_owned(), text))
        })
        .collect();
    for violation in found {
        let words: Vec<&str> = violation
            .message
            .split(|c: char| c.is_whitespace() || "(),:".contains(c))
            .filter(|word| {
                word.starts_with("t-")
                    || word.starts_with("p-")
                    || word.starts_with("sys-")
                    || word.starts_with("q-")
                    || word.starts_with("j-")
                    || word.starts_with("b-")
                    || uuid::Uuid::parse_str(word).is_ok()
            })
            .collect();
        if words.is_empty() {
            continue;
        }
        println!("log lines for: {violation}");
        let mut shown = 0;
        for (process, text) in &logs {
            for line in text
                .lines()
                .filter(|line| words.iter().any(|w| line.contains(w)))
            {
                if shown == 12 {
                    break;
                }
                println!("    [{process}] {line}");
                shown += 1;
            }
        }
    }
}
