//! `cube-bench etcd`: Cube on etcd next to Cube on redb, in the same run.
//!
//! Submissions: one `cube manager` on a redb file, and one on a 3-member etcd cluster on
//! loopback ports (real `etcd` processes, every member fsyncing its log), taking turns run by
//! run (which goes first alternates); every etcd run gets a fresh cluster, so that no run
//! meets a log the runs before it grew. N clients `POST /tasks` distinct tasks for D seconds
//! (no worker: every task stays `Pending`); a 201 is a durable acknowledgement (redb: a
//! committed, fsynced transaction; etcd: a raft commit on a majority). The 201s per second
//! are the figure; then `kill -9` and a restart of the manager on the same state, and every
//! acknowledged ID looked for.
//!
//! Failover: three managers on a 3-member etcd cluster of its own (`--leader-ttl` as given,
//! 5 s by default, as shipped), ten simulated workers beating to all three, and
//! [`FAILOVER_CLIENTS`] clients submitting tasks they name themselves all along, so that many
//! submissions are in flight at each kill (each is retried on the next manager after a
//! failure, with the same ID, so none is made twice). K times: [`BEFORE_KILL`] of submissions
//! to the leader, then `kill -9` of it (the clock starts before the kill is sent), then submissions to the others until one is
//! acknowledged and placed on a node; from the kill to the placement is the figure. The
//! killed manager is started again before the next kill. At the end every acknowledged
//! submission is looked for; the table says how many were acknowledged, how many of them
//! needed another attempt (their first failed: they were in flight at a kill, or sent while
//! no manager led), and how many of the acknowledged are missing. Timed from the same kill:
//! until a survivor's `GET /shards` shows the killed manager's shards held by the others.

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

/// How many clients submit all along the failover runs, each waiting [`FAILOVER_PAUSE`]
/// between two submissions.
const FAILOVER_CLIENTS: usize = 16;
const FAILOVER_PAUSE: Duration = Duration::from_millis(50);

/// How long the clients submit to a leader before it is killed, so that each kill meets them
/// busy on it rather than still looking for it after the last kill.
const BEFORE_KILL: Duration = Duration::from_secs(1);

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
    let duration = Duration::from_secs(seconds);
    let mut results = Vec::new();
    // --runs 0: the failover alone.
    let client_counts: &[usize] = if runs == 0 { &[] } else { &[1, concurrency] };
    for &clients in client_counts {
        let (mut redb, mut etcd) = (Vec::new(), Vec::new());
        let mut ratios = Vec::new();
        for run in 1..=runs {
            // redb and etcd take turns, and which goes first alternates run by run.
            let order = match run % 2 {
                1 => [Backend::Redb, Backend::Etcd],
                _ => [Backend::Etcd, Backend::Redb],
            };
            let mut rates = [0.0; 2];
            for backend in order {
                // A fresh etcd cluster for each etcd run (dropped, its members killed, after).
                let cluster = (backend == Backend::Etcd).then(|| EtcdCluster::start(3));
                let result =
                    submissions(cube, cluster.as_ref(), backend, clients, duration).await?;
                eprintln!(
                    "{}, {clients} clients, run {run}/{runs}: {:.0}/s; acknowledged {}, found after kill -9: {}",
                    backend.label(),
                    result.per_second,
                    result.acknowledged,
                    result.found
                );
                rates[usize::from(backend == Backend::Etcd)] = result.per_second;
                match backend {
                    Backend::Redb => redb.push(result),
                    Backend::Etcd => etcd.push(result),
                }
            }
            ratios.push(rates[1] / rates[0]);
        }
        results.push((clients, redb, etcd, ratios));
    }
    println!(
        "durable acknowledged submissions through one manager, {runs} runs of {seconds} s each \
         side, redb and etcd taking turns (a fresh etcd cluster each run), no workers; then \
         kill -9 and a restart on the same state"
    );
    println!();
    println!(
        "| store | clients | median acked/s | min | max | acknowledged | found after kill -9 | lost |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (clients, redb, etcd, _) in &results {
        for (backend, one) in [(Backend::Redb, redb), (Backend::Etcd, etcd)] {
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
    }
    println!();
    println!("| clients | etcd / redb, run by run: median | min | max |");
    println!("|---:|---:|---:|---:|");
    for (clients, _, _, ratios) in &mut results {
        println!("| {clients} | {} |", Summary::of(ratios).ratios());
    }
    if kills == 0 {
        return Ok(());
    }
    println!();
    let cluster = EtcdCluster::start(3);
    failover(cube, &cluster, kills, leader_ttl).await
}

/// One manager on `backend`, `clients` clients for `duration`, then kill -9 and the check.
async fn submissions(
    cube: &Path,
    cluster: Option<&EtcdCluster>,
    backend: Backend,
    clients: usize,
    duration: Duration,
) -> anyhow::Result<Run> {
    let data_dir = tempfile::tempdir()?;
    let endpoints = cluster.map(EtcdCluster::endpoints_flag).unwrap_or_default();
    anyhow::ensure!(
        cluster.is_some() == (backend == Backend::Etcd),
        "an etcd run needs its cluster, a redb run none"
    );
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
    let flags = etcd_manager_flags(&endpoints, &prefix, &ttl);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
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

    // Clients submitting all along, naming their tasks, each retrying a failed submission on
    // the next manager with the same ID: many submissions are in flight at each kill.
    let stopped = Arc::new(AtomicBool::new(false));
    let mut background = JoinSet::new();
    for client in 0..FAILOVER_CLIENTS {
        let (http, bases, stopped) = (http.clone(), bases.clone(), stopped.clone());
        background.spawn(async move {
            let mut submitted = Submitted::default();
            let mut attempt = client;
            while !stopped.load(Ordering::SeqCst) {
                let id = uuid::Uuid::new_v4().to_string();
                let name = format!("steady-{client}-{}", submitted.acknowledged.len());
                let mut task = load::small_task(&name);
                task["ID"] = serde_json::Value::String(id.clone());
                let mut first = true;
                loop {
                    // A client stays with the manager that last took its submission, and moves
                    // to the next one after a failure.
                    let base = &bases[attempt % bases.len()];
                    let sent = http.post(format!("{base}/tasks")).json(&task).send().await;
                    if let Ok(answer) = sent
                        && matches!(answer.status().as_u16(), 200 | 201)
                    {
                        if !first {
                            submitted.retried += 1;
                        }
                        submitted.acknowledged.push(id);
                        break;
                    }
                    attempt += 1;
                    first = false;
                    if stopped.load(Ordering::SeqCst) {
                        submitted.unacknowledged += 1;
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                tokio::time::sleep(FAILOVER_PAUSE).await;
            }
            submitted
        });
    }

    let mut times_ms = Vec::new();
    // From the kill to a survivor saying it leads and serving.
    let mut leader_ms = Vec::new();
    // From the kill to every shard of the killed manager held by a survivor.
    let mut shards_ms = Vec::new();
    for kill in 1..=kills {
        let leader = await_leader(&http, &bases, None).await?;
        tokio::time::sleep(BEFORE_KILL).await;
        let dead = bases[leader].clone();
        // The clock starts before the kill is sent: the kill's own time is the failover's.
        let killed = Instant::now();
        if let Some(manager) = managers[leader].take() {
            manager.kill().await?;
        }
        let survivors: Vec<String> = bases.iter().filter(|b| **b != dead).cloned().collect();
        let (led, moved) = tokio::join!(
            async {
                await_leader(&http, &bases, Some(&dead)).await?;
                anyhow::Ok(killed.elapsed())
            },
            async {
                await_shards_moved(&http, &survivors, &dead).await?;
                anyhow::Ok(killed.elapsed())
            }
        );
        let (led, moved) = (led?, moved?);
        shards_ms.push(moved.as_secs_f64() * 1000.0);
        let placed = await_placement(&http, &survivors, kill).await?;
        let took = killed.elapsed();
        times_ms.push(took.as_secs_f64() * 1000.0);
        leader_ms.push(led.as_secs_f64() * 1000.0);
        eprintln!(
            "kill {kill}/{kills}: a new leader after {:.0} ms, the dead one's shards held by \
             the others after {:.0} ms; it placed {placed} after {:.0} ms",
            led.as_secs_f64() * 1000.0,
            moved.as_secs_f64() * 1000.0,
            took.as_secs_f64() * 1000.0
        );
        // The killed manager comes back, on its port, before the next kill.
        managers[leader] = Some(
            ManagerProcess::start_with(cube, dirs[leader].path(), ports[leader], &flags).await?,
        );
    }
    stopped.store(true, Ordering::SeqCst);
    let mut submitted = Submitted::default();
    while let Some(one) = background.join_next().await {
        let one = one.context("a background client")?;
        submitted.acknowledged.extend(one.acknowledged);
        submitted.retried += one.retried;
        submitted.unacknowledged += one.unacknowledged;
    }
    let acknowledged = &submitted.acknowledged;
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
    let moving = Summary::of(&mut shards_ms);
    println!(
        "failover: 3 managers on a 3-member loopback etcd, --leader-ttl {ttl}, 10 sim-workers, \
         {FAILOVER_CLIENTS} clients submitting all along ({FAILOVER_PAUSE:?} between two \
         submissions of one client) for {BEFORE_KILL:?} before each kill -9 of the leader (clock \
         started before the kill) until \
         another leads and places a new task, {kills} kills"
    );
    println!();
    println!(
        "| kills | new leader: median ms | max ms | its shards held by the others: median ms \
         | max ms | shards / leader (medians) | new task placed: median ms | min ms | max ms \
         | acknowledged meanwhile | of them retried on another manager | unacknowledged at the end | lost |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {kills} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.0} | {:.0} | {:.0} | {} | {} | {} | {lost} |",
        leading.median,
        leading.max,
        moving.median,
        moving.max,
        moving.median / leading.median.max(1.0),
        summary.median,
        summary.min,
        summary.max,
        acknowledged.len(),
        submitted.retried,
        submitted.unacknowledged
    );
    Ok(())
}

/// What the failover's background clients sent: the IDs acknowledged, how many of those
/// were acknowledged only on another attempt, and how many were given up at the end.
#[derive(Default)]
struct Submitted {
    acknowledged: Vec<String>,
    retried: usize,
    unacknowledged: usize,
}

/// The index in `bases` of the manager that says it leads (and serves), other than `not`.
/// `cube manager`'s flags for a store on the etcd cluster at `endpoints` (its `--etcd-endpoints`
/// value), under `prefix`, with a leader lease of `ttl`.
pub(crate) fn etcd_manager_flags(endpoints: &str, prefix: &str, ttl: &str) -> Vec<String> {
    [
        "-d",
        "etcd",
        "--etcd-endpoints",
        endpoints,
        "--etcd-prefix",
        prefix,
        "--leader-ttl",
        ttl,
    ]
    .map(String::from)
    .to_vec()
}

/// Whether the ring has settled: every shard held, every virtual node holding its whole range.
pub(crate) fn ring_settled(view: &cube_types::shard::ShardsView) -> bool {
    view.unowned.is_empty()
        && view.managers.iter().all(|manager| {
            manager
                .virtual_nodes
                .iter()
                .all(|node| node.shards == node.range)
        })
}

/// The index in `bases` of the manager that says it leads (`not` left out).
pub(crate) async fn await_leader(
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

/// Waits until a survivor's `GET /shards` shows no virtual node of `dead` and every shard
/// held, each virtual node holding its whole range (the ring settled without it).
async fn await_shards_moved(
    http: &reqwest::Client,
    survivors: &[String],
    dead: &str,
) -> anyhow::Result<()> {
    let dead = dead.trim_start_matches("http://");
    let started = Instant::now();
    loop {
        for base in survivors {
            if let Ok(answer) = http.get(format!("{base}/shards")).send().await
                && let Ok(view) = answer.json::<cube_types::shard::ShardsView>().await
                && ring_settled(&view)
                && view.managers.iter().all(|manager| manager.manager != dead)
            {
                return Ok(());
            }
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("the shards of {dead} were not held by the others within 60 s");
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
