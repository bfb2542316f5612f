//! `cube-bench contend`: several managers placing at once on one etcd cluster, without
//! double-booking a node (issue 32's placement: `cube_manager::shared_placement`).
//!
//! A real 3-member etcd on loopback, every member fsyncing its log. `--nodes` simulated
//! nodes (4 cores, 8 GiB each, known to every placer; no worker runs: what is measured is
//! the placement and its commit). For each count of placers in `--placers`, with each of
//! the two schedulers — E-PVM sampled, seeded per placer as each manager seeds its own, and
//! exhaustive E-PVM, where every placer makes the same choice on the same view (the worst
//! case for conflicts) — `--requests` requests of 0.25 cores and 256 MiB are divided among
//! the placers, each its own etcd client and `SharedPlacer`, started together; each places
//! its share one request after another, a request committed with its task record only if
//! its node's claims are unchanged since read. Timed from the start to the last commit;
//! then every node's claims are checked against the records (none over capacity, the claims
//! exactly the records). Each run uses a fresh prefix; which placer count goes first
//! alternates run by run.
//!
//! The conflict check's cost: one client, the same transaction (a node's claims and a task
//! record written) with and without the comparison of the claims' `mod_revision`, taking
//! turns, `--check-writes` of each.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use cube_manager::shared_placement::{Placement, PlacerCounts, SharedPlacer, claim_of};
use cube_scheduler::{Epvm, EpvmSampled, NodeView, Scheduler, TaskRequest};
use cube_store::{EtcdConfig, EtcdDb, Optimistic, Unchanged};
use cube_test_support::EtcdCluster;
use cube_types::Resources;
use cube_types::claims::{CLAIMS_PREFIX, NodeClaims, claims_key};
use serde::{Deserialize, Serialize};

use crate::Summary;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// What each simulated node offers.
const NODE_CPU: f64 = 4.0;
const NODE_MEMORY: u64 = 8 * GIB;

/// What each request asks.
const REQUEST_CPU: f64 = 0.25;
const REQUEST_MEMORY: u64 = 256 * MIB;

/// The record a placed request writes with its claims, about the size of a task's.
#[derive(Serialize, Deserialize)]
struct Record {
    node: String,
    cpu: f64,
    memory: u64,
    image: String,
    project: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Choice {
    /// E-PVM over a sample, each placer seeded with its own number.
    Sampled,
    /// E-PVM over every node: every placer picks what the others pick.
    Exhaustive,
}

impl Choice {
    fn label(self) -> &'static str {
        match self {
            Choice::Sampled => "epvm-sampled, seeded per placer",
            Choice::Exhaustive => "epvm (every placer the same choice)",
        }
    }

    fn scheduler(self, placer: usize) -> Box<dyn Scheduler> {
        match self {
            Choice::Sampled => Box::new(EpvmSampled::with_seed(0xC0BE + placer as u64)),
            Choice::Exhaustive => Box::new(Epvm::new()),
        }
    }
}

/// One trial's figures.
struct Trial {
    seconds: f64,
    requests: usize,
    conflicts: u64,
    waiting: u64,
}

pub async fn contend(
    runs: usize,
    nodes: usize,
    requests: usize,
    placers: Vec<usize>,
    check_writes: usize,
) -> anyhow::Result<()> {
    if placers.is_empty() || placers.contains(&0) {
        bail!("--placers needs one or more counts, each at least 1");
    }
    if nodes == 0 || requests == 0 {
        bail!("--nodes and --requests must be at least 1");
    }
    let cluster = EtcdCluster::start(3);
    let mut trials: BTreeMap<(usize, &'static str), Vec<Trial>> = BTreeMap::new();
    let mut trial_number = 0;
    for run in 0..runs {
        let mut order = placers.clone();
        if run % 2 == 1 {
            order.reverse();
        }
        for &count in &order {
            for choice in [Choice::Sampled, Choice::Exhaustive] {
                trial_number += 1;
                let prefix = format!("/contend-{trial_number}");
                let trial = place_at_once(&cluster, &prefix, choice, count, nodes, requests)
                    .await
                    .with_context(|| format!("{count} placers, {}", choice.label()))?;
                eprintln!(
                    "run {}: {count} placers, {}: {} requests in {:.2} s, {} conflicts",
                    run + 1,
                    choice.label(),
                    trial.requests,
                    trial.seconds,
                    trial.conflicts
                );
                trials
                    .entry((count, choice.label()))
                    .or_default()
                    .push(trial);
            }
        }
    }
    let check = check_cost(&cluster, check_writes).await?;
    print_tables(runs, nodes, requests, &placers, &trials, &check);
    Ok(())
}

fn simulated_nodes(count: usize) -> Vec<NodeView> {
    (0..count)
        .map(|n| NodeView {
            name: format!("sim-{n:05}"),
            ready: true,
            capacity: Resources {
                cpu: NODE_CPU,
                memory: NODE_MEMORY,
                disk: 100 * GIB,
            },
            ..NodeView::default()
        })
        .collect()
}

fn connect(cluster: &EtcdCluster, prefix: &str) -> anyhow::Result<EtcdDb> {
    EtcdDb::connect(EtcdConfig::new(cluster.endpoints(), prefix))
        .with_context(|| format!("connecting to etcd under {prefix}"))
}

/// `count` placers at once, `requests` divided among them; the claims checked after.
async fn place_at_once(
    cluster: &EtcdCluster,
    prefix: &str,
    choice: Choice,
    count: usize,
    nodes: usize,
    requests: usize,
) -> anyhow::Result<Trial> {
    let start = Arc::new(tokio::sync::Barrier::new(count + 1));
    let mut running = Vec::new();
    for placer in 0..count {
        let share = requests / count + usize::from(placer < requests % count);
        let mut shared = SharedPlacer::new(
            connect(cluster, prefix)?,
            choice.scheduler(placer),
            simulated_nodes(nodes),
            None,
        )
        .await?;
        let start = start.clone();
        running.push(tokio::spawn(async move {
            let request = TaskRequest {
                cpu: REQUEST_CPU,
                memory: REQUEST_MEMORY,
                ..TaskRequest::default()
            };
            start.wait().await;
            for n in 0..share {
                let placed = shared
                    .place(std::slice::from_ref(&request), |nodes| {
                        let record = Record {
                            node: nodes[0].clone(),
                            cpu: REQUEST_CPU,
                            memory: REQUEST_MEMORY,
                            image: "cube-sample:latest".to_string(),
                            project: format!("project-{placer}"),
                        };
                        let value = serde_json::to_vec(&record).unwrap_or_default();
                        vec![(format!("tasks/{placer}-{n}"), value)]
                    })
                    .await?;
                if let Placement::Waiting { reason } = placed {
                    // The nodes are sized so that none should.
                    eprintln!("a request waits: {reason}");
                }
            }
            anyhow::Ok(shared.counts())
        }));
    }
    start.wait().await;
    let began = Instant::now();
    let mut counts = PlacerCounts::default();
    for placer in running {
        let one = placer.await.context("a placer's task ended")??;
        counts.conflicts += one.conflicts;
        counts.waiting += one.waiting;
        counts.placed += one.placed;
    }
    let seconds = began.elapsed().as_secs_f64();
    check_claims(&connect(cluster, prefix)?, counts.placed).await?;
    Ok(Trial {
        seconds,
        requests,
        conflicts: counts.conflicts,
        waiting: counts.waiting,
    })
}

/// Every node's claims are exactly its records' requests, and within its capacity.
async fn check_claims(db: &EtcdDb, placed: u64) -> anyhow::Result<()> {
    let (records, _) = db.read_versioned("tasks/").await?;
    if records.len() as u64 != placed {
        bail!(
            "{} task records written for {placed} placements",
            records.len()
        );
    }
    let mut held: BTreeMap<String, NodeClaims> = BTreeMap::new();
    for record in records {
        let record: Record = serde_json::from_slice(&record.value)?;
        let request = TaskRequest {
            cpu: record.cpu,
            memory: record.memory,
            ..TaskRequest::default()
        };
        held.entry(record.node)
            .or_default()
            .add(&claim_of(&request));
    }
    let (claims, _) = db.read_versioned(CLAIMS_PREFIX).await?;
    for key in claims {
        let node = key.key.trim_start_matches(CLAIMS_PREFIX);
        let claims: NodeClaims = serde_json::from_slice(&key.value)?;
        let holds = held.remove(node).unwrap_or_default();
        if claims != holds {
            bail!("{node}'s claims say {claims}, its records hold {holds}");
        }
        if claims.cpu() > NODE_CPU + 1e-9 || claims.memory > NODE_MEMORY {
            bail!("{node} is given more than it holds: {claims}");
        }
    }
    if let Some((node, holds)) = held.into_iter().next() {
        bail!("{node} holds {holds} with no claims written");
    }
    Ok(())
}

/// Per-write latency, ms, with and without the claims' comparison, taking turns.
struct CheckCost {
    with_check: Vec<f64>,
    without: Vec<f64>,
}

async fn check_cost(cluster: &EtcdCluster, writes: usize) -> anyhow::Result<CheckCost> {
    let db = connect(cluster, "/contend-check")?;
    let mut claims = NodeClaims::default();
    let claim = claim_of(&TaskRequest {
        cpu: REQUEST_CPU,
        memory: REQUEST_MEMORY,
        ..TaskRequest::default()
    });
    let mut revision = 0;
    let mut cost = CheckCost {
        with_check: Vec::with_capacity(writes),
        without: Vec::with_capacity(writes),
    };
    for n in 0..writes * 2 {
        claims.add(&claim);
        let value = serde_json::to_vec(&claims)?;
        let record = serde_json::to_vec(&Record {
            node: "sim-00000".to_string(),
            cpu: REQUEST_CPU,
            memory: REQUEST_MEMORY,
            image: "cube-sample:latest".to_string(),
            project: "project-0".to_string(),
        })?;
        let puts = vec![
            (claims_key("sim-00000"), Some(value)),
            (format!("tasks/{n}"), Some(record)),
        ];
        let checked = n % 2 == 0;
        let unchanged = if checked {
            vec![Unchanged {
                key: claims_key("sim-00000"),
                mod_revision: revision,
            }]
        } else {
            Vec::new()
        };
        let began = Instant::now();
        let outcome = db.write_if_unchanged(&unchanged, puts, None).await?;
        let ms = began.elapsed().as_secs_f64() * 1000.0;
        match outcome {
            Optimistic::Committed { revision: now } => revision = now,
            Optimistic::Changed { .. } => bail!("a lone writer met a conflict"),
        }
        if checked {
            cost.with_check.push(ms);
        } else {
            cost.without.push(ms);
        }
    }
    Ok(cost)
}

fn print_tables(
    runs: usize,
    nodes: usize,
    requests: usize,
    placers: &[usize],
    trials: &BTreeMap<(usize, &'static str), Vec<Trial>>,
    check: &CheckCost,
) {
    println!(
        "contend: placers at once on a 3-member etcd (loopback, fsync), {nodes} simulated nodes \
         of {NODE_CPU} cores and {} GiB, {requests} requests of {REQUEST_CPU} cores and {} MiB \
         divided among them, {runs} runs; each placement one etcd transaction conditioned on \
         its node's claims",
        NODE_MEMORY / GIB,
        REQUEST_MEMORY / MIB
    );
    println!();
    println!(
        "| placers | scheduler | placements/s, median | min | max | × one placer | \
         conflicts/s | conflicts per placement | waiting |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for choice in [Choice::Sampled, Choice::Exhaustive] {
        let one_rate = trials
            .get(&(1, choice.label()))
            .map(|trials| median(trials.iter().map(|t| t.requests as f64 / t.seconds)));
        for &count in placers {
            let Some(list) = trials.get(&(count, choice.label())) else {
                continue;
            };
            let mut rates: Vec<f64> = list.iter().map(|t| t.requests as f64 / t.seconds).collect();
            let rate = Summary::of(&mut rates);
            let conflicts_per_second = median(list.iter().map(|t| t.conflicts as f64 / t.seconds));
            let per_placement = median(list.iter().map(|t| t.conflicts as f64 / t.requests as f64));
            let waiting: u64 = list.iter().map(|t| t.waiting).sum();
            let speedup =
                one_rate.map_or("—".to_string(), |one| format!("{:.2}", rate.median / one));
            println!(
                "| {count} | {} | {} | {speedup} | {conflicts_per_second:.0} | \
                 {per_placement:.3} | {waiting} |",
                choice.label(),
                rate.spread(0),
            );
        }
    }
    let mut with_check = check.with_check.clone();
    let mut without = check.without.clone();
    let with_check = Summary::of(&mut with_check);
    let without = Summary::of(&mut without);
    println!();
    println!(
        "The conflict check's cost: one client, {} transactions of each kind taking turns (a \
         node's claims and a task record written), ms:",
        check.with_check.len()
    );
    println!();
    println!("| transaction | median | p95 | min | max |");
    println!("|---|---:|---:|---:|---:|");
    println!("| conditioned on the claims' mod_revision | {with_check} |");
    println!("| unconditioned | {without} |");
    println!(
        "| difference of the medians, per placement | {:.3} | | | |",
        with_check.median - without.median
    );
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    if values.is_empty() {
        return 0.0;
    }
    Summary::of(&mut values).median
}
