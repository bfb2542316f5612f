//! `cube-bench etcd`: Cube on etcd next to Cube on redb, in the same run.
//!
//! Submissions: one `cube manager` on a redb file, and one on a 3-member etcd cluster on
//! loopback ports (real `etcd` processes, every member fsyncing its log), taking turns; N
//! clients `POST /tasks` distinct tasks for D seconds (no worker: every task stays
//! `Pending`); a 201 is a durable acknowledgement (redb: a committed, fsynced transaction;
//! etcd: a raft commit on a majority). The 201s per second are the figure; then `kill -9`
//! and a restart of the manager on the same state, and every acknowledged ID looked for.
//!
//! Failover: three managers on one 3-member etcd cluster (`--leader-ttl` as given, 5 s by
//! default, as shipped), ten simulated workers beating to all three, and a client submitting
//! tasks it names itself (retried on the next manager after a failure, so none is made
//! twice) all along. K times: `kill -9` of the leader, then submissions to the others until
//! one is acknowledged and placed on a node; from the kill to the placement is the figure.
//! The killed manager is started again before the next kill. At the end every acknowledged
//! submission is looked for.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cube_test_support::EtcdCluster;
use tokio::task::JoinSet;

use crate::Summary;
use crate::load::{self, ManagerProcess, SimWorkers};

/// Where one run's manager keeps its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Redb,
    Etcd,
}

impl Backend {
    fn label(self) -> &'static str {
        match self {
            Backend::Redb => "redb file (fsync per commit)",
            Backend::Etcd => "etcd, 3 members on loopback",
        }
    }
}

struct Run {
    per_second: f64,
    acknowledged: usize,
    found: usize,
}

pub(crate) async fn etcd(
    runs: usize,
    seconds: u64,
    concurrency: usize,
    kills: usize,
    leader_ttl: Duration,
    cube: &Path,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        seconds > 0 && concurrency > 0,
        "seconds and concurrency must be at least 1"
    );
    let cluster = EtcdCluster::start(3);
    let duration = Duration::from_secs(seconds);
    let mut results = Vec::new();
    // --runs 0: the failover alone.
    let client_counts: &[usize] = if runs == 0 { &[] } else { &[1, concurrency] };
    for &clients in client_counts {
        for backend in [Backend::Redb, Backend::Etcd] {
            let mut one = Vec::new();
            for run in 1..=runs {
                let result = submissions(cube, &cluster, backend, clients, duration).await?;
                eprintln!(
                    "{}, {clients} clients, run {run}/{runs}: {:.0}/s; acknowledged {}, found after kill -9: {}",
                    backend.label(),
                    result.per_second,
                    result.acknowledged,
                    result.found
                );
                one.push(result);
            }
            results.push((backend, clients, one));
        }
    }
    println!(
        "durable acknowledged submissions through one manager, {runs} runs of {seconds} s each, \
         no workers; then kill -9 and a restart on the same state"
    );
    println!();
    println!(
        "| store | clients | median acked/s | min | max | acknowledged | found after kill -9 | lost |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (backend, clients, one) in &results {
        let mut rates: Vec<f64> = one.iter().map(|run| run.per_second).collect();
        let rate = Summary::of(&mut rates);
        let acknowledged: usize = one.iter().map(|run| run.acknowledged).sum();
        let found: usize = one.iter().map(|run| run.found).sum();
        println!(
            "| {} | {clients} | {:.0} | {:.0} | {:.0} | {acknowledged} | {found} | {} |",
            backend.label(),
            rate.median,
            rate.min,
            rate.max,
            acknowledged - found
        );
    }
    if kills == 0 {
        return Ok(());
    }
    println!();
    failover(cube, &cluster, kills, leader_ttl).await
}

/// One manager on `backend`, `clients` clients for `duration`, then kill -9 and the check.
async fn submissions(
    cube: &Path,
    cluster: &EtcdCluster,
    backend: Backend,
    clients: usize,
    duration: Duration,
) -> anyhow::Result<Run> {
    let data_dir = tempfile::tempdir()?;
    let endpoints = cluster.endpoints_flag();
    let prefix = format!("/bench-{}", uuid::Uuid::new_v4().simple());
    let flags: Vec<&str> = match backend {
        Backend::Redb => vec!["-d", "persistent"],
        Backend::Etcd => vec![
            "-d",
            "etcd",
            "--etcd-endpoints",
            &endpoints,
            "--etcd-prefix",
            &prefix,
            "--leader-ttl",
            "1s",
        ],
    };
    let manager = ManagerProcess::start_with(cube, data_dir.path(), 0, &flags).await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    await_serving(&http, &manager.base).await?;
    let stopped = Arc::new(AtomicBool::new(false));
    let mut submitters = JoinSet::new();
    for client in 0..clients {
        let (http, base, stopped) = (http.clone(), manager.base.clone(), stopped.clone());
        submitters.spawn(async move {
            let mut acknowledged = Vec::new();
            for number in 0.. {
                if stopped.load(Ordering::SeqCst) {
                    break;
                }
                let task = load::small_task(&format!("s-{client}-{number}"));
                let answer = http.post(format!("{base}/tasks")).json(&task).send().await;
                let Ok(answer) = answer else { break };
                if answer.status().as_u16() != 201 {
                    continue;
                }
                if let Ok(body) = answer.json::<serde_json::Value>().await
                    && let Some(id) = body["ID"].as_str()
                {
                    acknowledged.push(id.to_string());
                }
            }
            acknowledged
        });
    }
    tokio::time::sleep(duration).await;
    stopped.store(true, Ordering::SeqCst);
    manager.kill().await?;
    let mut acknowledged = Vec::new();
    while let Some(ids) = submitters.join_next().await {
        acknowledged.extend(ids.context("a submitting client panicked")?);
    }
    let again = ManagerProcess::start_with(cube, data_dir.path(), 0, &flags).await?;
    await_serving(&http, &again.base).await?;
    let kept: HashSet<String> = load::tasks(&http, &again.base)
        .await?
        .into_iter()
        .map(|task| task.id.to_string())
        .collect();
    again.kill().await?;
    let found = acknowledged.iter().filter(|id| kept.contains(*id)).count();
    Ok(Run {
        per_second: acknowledged.len() as f64 / duration.as_secs_f64(),
        acknowledged: acknowledged.len(),
        found,
    })
}

/// Waits until the manager answers `GET /tasks` (a manager on etcd first becomes leader).
async fn await_serving(http: &reqwest::Client, base: &str) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        if let Ok(answer) = http.get(format!("{base}/tasks?limit=1")).send().await
            && answer.status().is_success()
        {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("{base} did not serve within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Three managers on etcd, `kills` times kill -9 of the leader.
async fn failover(
    cube: &Path,
    cluster: &EtcdCluster,
    kills: usize,
    leader_ttl: Duration,
) -> anyhow::Result<()> {
    let endpoints = cluster.endpoints_flag();
    let prefix = format!("/bench-failover-{}", uuid::Uuid::new_v4().simple());
    let ttl = format!("{}s", leader_ttl.as_secs().max(1));
    let flags = [
        "-d",
        "etcd",
        "--etcd-endpoints",
        &endpoints,
        "--etcd-prefix",
        &prefix,
        "--leader-ttl",
        &ttl,
    ];
    let dirs: Vec<tempfile::TempDir> = (0..3)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    // Fixed ports: a killed manager comes back where the workers and clients look for it.
    let mut ports = Vec::new();
    for _ in 0..3 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        ports.push(listener.local_addr()?.port());
    }
    let mut managers = Vec::new();
    for (dir, port) in dirs.iter().zip(&ports) {
        managers.push(Some(
            ManagerProcess::start_with(cube, dir.path(), *port, &flags).await?,
        ));
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let bases: Vec<String> = managers.iter().flatten().map(|m| m.base.clone()).collect();
    let leader = await_leader(&http, &bases, None).await?;
    let sim = SimWorkers::start_on(&http, &bases.join(","), &bases[leader], 10).await?;

    // A client submitting all along, naming its tasks, retrying on the next manager.
    let stopped = Arc::new(AtomicBool::new(false));
    let background = tokio::spawn({
        let (http, bases, stopped) = (http.clone(), bases.clone(), stopped.clone());
        async move {
            let mut acknowledged = Vec::new();
            let mut attempt = 0;
            while !stopped.load(Ordering::SeqCst) {
                let id = uuid::Uuid::new_v4().to_string();
                let mut task = load::small_task(&format!("steady-{}", acknowledged.len()));
                task["ID"] = serde_json::Value::String(id.clone());
                loop {
                    let base = &bases[attempt % bases.len()];
                    attempt += 1;
                    let sent = http.post(format!("{base}/tasks")).json(&task).send().await;
                    if let Ok(answer) = sent
                        && matches!(answer.status().as_u16(), 200 | 201)
                    {
                        acknowledged.push(id);
                        break;
                    }
                    if stopped.load(Ordering::SeqCst) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            acknowledged
        }
    });

    let mut times_ms = Vec::new();
    // From the kill to a survivor saying it leads and serving.
    let mut leader_ms = Vec::new();
    for kill in 1..=kills {
        let leader = await_leader(&http, &bases, None).await?;
        let dead = bases[leader].clone();
        if let Some(manager) = managers[leader].take() {
            manager.kill().await?;
        }
        let killed = Instant::now();
        let survivors: Vec<String> = bases.iter().filter(|b| **b != dead).cloned().collect();
        await_leader(&http, &bases, Some(&dead)).await?;
        let led = killed.elapsed();
        let placed = await_placement(&http, &survivors, kill).await?;
        let took = killed.elapsed();
        times_ms.push(took.as_secs_f64() * 1000.0);
        leader_ms.push(led.as_secs_f64() * 1000.0);
        eprintln!(
            "kill {kill}/{kills}: a new leader after {:.0} ms; it placed {placed} after {:.0} ms",
            led.as_secs_f64() * 1000.0,
            took.as_secs_f64() * 1000.0
        );
        // The killed manager comes back, on its port, before the next kill.
        managers[leader] = Some(
            ManagerProcess::start_with(cube, dirs[leader].path(), ports[leader], &flags).await?,
        );
    }
    stopped.store(true, Ordering::SeqCst);
    let acknowledged = background.await.context("the background client")?;
    let leader_base = bases[await_leader(&http, &bases, None).await?].clone();
    let kept: Vec<String> = load::tasks(&http, &leader_base)
        .await?
        .into_iter()
        .map(|task| task.id.to_string())
        .collect();
    let kept_set: HashSet<&String> = kept.iter().collect();
    let lost = acknowledged
        .iter()
        .filter(|id| !kept_set.contains(id))
        .count();
    sim.stop().await?;
    let summary = Summary::of(&mut times_ms);
    let leading = Summary::of(&mut leader_ms);
    println!(
        "failover: 3 managers on a 3-member loopback etcd, --leader-ttl {ttl}, 10 sim-workers; \
         kill -9 of the leader until another leads and places a new task, {kills} kills"
    );
    println!();
    println!(
        "| kills | new leader: median ms | max ms | new task placed: median ms | min ms | max ms \
         | acknowledged meanwhile | lost |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {kills} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {lost} |",
        leading.median,
        leading.max,
        summary.median,
        summary.min,
        summary.max,
        acknowledged.len()
    );
    Ok(())
}

/// The index in `bases` of the manager that says it leads (and serves), other than `not`.
async fn await_leader(
    http: &reqwest::Client,
    bases: &[String],
    not: Option<&str>,
) -> anyhow::Result<usize> {
    let started = Instant::now();
    loop {
        for (index, base) in bases.iter().enumerate() {
            if Some(base.as_str()) == not {
                continue;
            }
            if let Ok(answer) = http.get(format!("{base}/leader")).send().await
                && let Ok(body) = answer.json::<serde_json::Value>().await
                && body["IsLeader"] == true
            {
                return Ok(index);
            }
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("no manager led within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Submits a task to the survivors (in turn, until one acknowledges it) and waits until it
/// is placed on a node; its name.
async fn await_placement(
    http: &reqwest::Client,
    survivors: &[String],
    kill: usize,
) -> anyhow::Result<String> {
    let name = format!("after-kill-{kill}");
    let id = uuid::Uuid::new_v4().to_string();
    let mut task = load::small_task(&name);
    task["ID"] = serde_json::Value::String(id.clone());
    let started = Instant::now();
    let mut attempt = 0;
    let base = loop {
        let base = &survivors[attempt % survivors.len()];
        attempt += 1;
        if let Ok(answer) = http.post(format!("{base}/tasks")).json(&task).send().await
            && matches!(answer.status().as_u16(), 200 | 201)
        {
            break base.clone();
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("no survivor took a task within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    loop {
        if let Ok(answer) = http.get(format!("{base}/tasks/{id}")).send().await
            && let Ok(body) = answer.json::<serde_json::Value>().await
            && body["NodeName"]
                .as_str()
                .is_some_and(|node| !node.is_empty())
        {
            return Ok(name);
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("{name} was not placed within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
