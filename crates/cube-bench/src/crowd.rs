//! `cube-bench crowd`: issue 32's contention check at a scale the integration test does not
//! reach. Several managers acting for their own shards (`--shard-controllers`) fill the same
//! small nodes at once, more tasks than the nodes hold: no node may ever be given more than
//! its room, and every task must end placed or waiting with its reason.
//!
//! Each run: a fresh 3-member etcd cluster on loopback, `--managers` fresh `cube manager -d
//! etcd --shard-controllers` on it (the ring settled), `--projects` projects, `--nodes`
//! simulated workers (the real worker code on the in-memory runtime) each offering room for
//! `--slots` tasks of 16 MiB, and `--tasks` such tasks submitted at once, round-robin over
//! the managers and the projects. Every [`POLL_EVERY`] (longer for many tasks:
//! [`poll_every`]), every task of every project is read
//! (`GET /tasks?project=*`, gathered from all managers): the run fails the moment any node
//! holds more than `--slots` tasks `Scheduled` or `Running` in the records. It ends when as
//! many tasks as the nodes hold run and the rest wait, each with a reason naming memory; a
//! simulated worker refuses a task it has no room for (the real worker's check, counting
//! every task it holds), which would leave that task `Scheduled` and the run stalled, so a
//! run that ends also had no node over-booked from the workers' own view.
//!
//! With more than 16 nodes a manager's placement pass commits its nodes' claims in several
//! transactions, and a transaction lost to another manager sends a later one on any of the
//! same nodes back to be planned again (`placement.rs`, `lost_nodes`): the conflicts column
//! shows those races happened.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cube_test_support::EtcdCluster;

use crate::load;
use crate::shards::{self, SUBMITTERS};

/// How often every task is read while the tasks go in and are placed, for each 1,000 tasks
/// (at least once a [`POLL_EVERY`], at most once a second): reading them all costs the
/// managers what it costs.
const POLL_EVERY: Duration = Duration::from_millis(100);

/// How often a run of `tasks` reads every task.
fn poll_every(tasks: usize) -> Duration {
    let thousands = u32::try_from(tasks.div_ceil(1000)).unwrap_or(u32::MAX);
    (POLL_EVERY * thousands.max(1)).min(Duration::from_secs(1))
}

/// The run gives up when neither the acknowledged submissions nor the tasks' states have
/// moved for this long.
const STALL_BOUND: Duration = Duration::from_secs(60);

/// What one task asks for (`load::small_task`): a node of `--slots` holds that many.
const TASK_MIB: usize = 16;

pub(crate) struct Options {
    pub(crate) managers: usize,
    pub(crate) nodes: usize,
    pub(crate) slots: usize,
    pub(crate) tasks: usize,
    pub(crate) projects: usize,
    pub(crate) runs: usize,
    pub(crate) ring: u32,
    /// Every task submitted (and waiting) before the workers start.
    pub(crate) nodes_last: bool,
}

/// One run's figures.
struct Run {
    decided_in: Duration,
    placed: usize,
    waiting: usize,
    most_on_a_node: usize,
    placements: f64,
    conflicts: f64,
    commits: f64,
}

pub(crate) async fn crowd(options: &Options, cube: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(
        options.managers > 0
            && options.nodes > 0
            && options.slots > 0
            && options.tasks > 0
            && options.projects > 0
            && options.runs > 0,
        "--managers, --nodes, --slots, --tasks, --projects and --runs must be at least 1"
    );
    let room = options.nodes.saturating_mul(options.slots);
    println!(
        "crowd: {} managers with --shard-controllers on a 3-member loopback etcd (a ring of {}, \
         --leader-ttl {}), {} simulated workers of {} MiB ({} tasks of {TASK_MIB} MiB each, \
         {room} in all), {} tasks in {} projects submitted at once by {SUBMITTERS} clients; \
         every task read every {:?}",
        options.managers,
        options.ring,
        shards::LEADER_TTL,
        options.nodes,
        options.slots * TASK_MIB,
        options.slots,
        options.tasks,
        options.projects,
        poll_every(options.tasks),
    );
    println!();
    println!(
        "| run | decided in, s | placed | waiting (memory) | most on one node (room {}) | \
         placements | conflicts (re-plans) | claims commits |",
        options.slots
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for number in 1..=options.runs {
        let run = run_once(options, cube)
            .await
            .with_context(|| format!("run {number}"))?;
        println!(
            "| {number} | {:.1} | {} | {} | {} | {:.0} | {:.0} | {:.0} |",
            run.decided_in.as_secs_f64(),
            run.placed,
            run.waiting,
            run.most_on_a_node,
            run.placements,
            run.conflicts,
            run.commits,
        );
    }
    Ok(())
}

async fn run_once(options: &Options, cube: &Path) -> anyhow::Result<Run> {
    // Killed (every member) when dropped at the end of the run.
    let cluster = EtcdCluster::start(3);
    let endpoints = cluster.endpoints_flag();
    let prefix = format!("/bench-crowd-{}", uuid::Uuid::new_v4().simple());
    let mut flags = crate::etcd::etcd_manager_flags(&endpoints, &prefix, shards::LEADER_TTL);
    // A simulated worker's heartbeat may be late on a busy machine: a node marked down would
    // have its tasks placed again, which is not what is checked.
    flags.extend(["--heartbeat-grace".to_string(), "120s".to_string()]);
    flags.extend(["--shards".to_string(), options.ring.to_string()]);
    flags.push("--shard-controllers".to_string());
    let shards::Started {
        _dirs,
        managers,
        bases,
        http,
        leader,
    } = shards::start_settled(cube, options.managers, &flags, options.projects).await?;
    let memory = format!("{}MiB", options.slots * TASK_MIB);
    let placed_at_last = options.tasks.min(options.nodes * options.slots);

    let started = Instant::now();
    let acknowledged = Arc::new(AtomicUsize::new(0));
    let mut submitters = shards::spawn_submitters(
        &http,
        &bases,
        (options.tasks, options.projects),
        &acknowledged,
        &Arc::new(AtomicUsize::new(0)),
    );
    if options.nodes_last {
        // Every request waits for a node; the workers come up together, and each manager's
        // pass places many requests on many nodes at once: several claims commits a pass.
        while let Some(joined) = submitters.join_next().await {
            joined.context("a submitting client panicked")??;
        }
    }
    let sims = shards::spawn_sim_workers(&bases, options.nodes, Some(&memory)).await?;

    let mut poll = tokio::time::interval(poll_every(options.tasks));
    // A read of many tasks may take longer than the interval: the next waits a whole one.
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut most_on_a_node = 0;
    let mut last_seen = (0, Tally::default());
    let mut moved = Instant::now();
    let (decided_in, tasks) = loop {
        poll.tick().await;
        // The clients done since the last look (a slow read of many tasks must not hold
        // them up: each look takes every one done).
        while let Some(joined) = submitters.try_join_next() {
            joined.context("a submitting client panicked")??;
        }
        let tasks: Vec<serde_json::Value> =
            crate::get_json(&http, &format!("{}/tasks?project=*", bases[leader])).await?;
        let tally = tally(&tasks);
        most_on_a_node = most_on_a_node.max(tally.most_on_a_node);
        if tally.most_on_a_node > options.slots {
            bail!(
                "over-booked: {} holds {} tasks of {TASK_MIB} MiB in {memory}: {}",
                tally.fullest,
                tally.most_on_a_node,
                on_node(&tasks, &tally.fullest)
            );
        }
        if submitters.is_empty()
            && tasks.len() == options.tasks
            && tally.running == placed_at_last
            && tally.pending == options.tasks - placed_at_last
        {
            break (started.elapsed(), tasks);
        }
        let now = (acknowledged.load(Ordering::Relaxed), tally);
        if now != last_seen {
            last_seen = now;
            moved = Instant::now();
        } else if moved.elapsed() > STALL_BOUND {
            bail!(
                "nothing moved for {STALL_BOUND:?}: {} of {} acknowledged, {} tasks held, {} \
                 Running and {} Scheduled (of {placed_at_last} to place), {} Pending",
                last_seen.0,
                options.tasks,
                tasks.len(),
                last_seen.1.running,
                last_seen.1.scheduled,
                last_seen.1.pending
            );
        }
    };
    // The nodes are as sized: the room counted above is theirs.
    for node in load::nodes(&http, &bases[leader]).await? {
        let holds = shards::room_for_small_tasks(std::slice::from_ref(&node))?;
        anyhow::ensure!(
            holds == options.slots,
            "{} holds {holds} tasks of {TASK_MIB} MiB, not --slots {}",
            node.name,
            options.slots
        );
    }
    for task in &tasks {
        if task["State"] == "Pending" {
            let reason = task["PendingReason"].as_str().unwrap_or("");
            anyhow::ensure!(
                reason.contains("memory"),
                "task {} waits without naming memory: {reason:?}",
                task["ID"]
            );
        }
    }
    let mut figures = shards::ClaimFigures::default();
    for base in &bases {
        let claimed = shards::claim_figures(&http, base).await?;
        figures.placements += claimed.placements;
        figures.conflicts += claimed.conflicts;
        figures.claims_writes += claimed.claims_writes;
    }
    for sim in sims {
        sim.stop().await?;
    }
    for manager in managers {
        manager.kill().await?;
    }
    drop(cluster);
    Ok(Run {
        decided_in,
        placed: placed_at_last,
        waiting: options.tasks - placed_at_last,
        most_on_a_node,
        placements: figures.placements,
        conflicts: figures.conflicts,
        commits: figures.claims_writes,
    })
}

/// The tasks' states, and the node holding the most placed tasks (`Scheduled` or
/// `Running`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Tally {
    pending: usize,
    scheduled: usize,
    running: usize,
    most_on_a_node: usize,
    fullest: String,
}

fn tally(tasks: &[serde_json::Value]) -> Tally {
    let mut tally = Tally::default();
    let mut on: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for task in tasks {
        match task["State"].as_str() {
            Some("Pending") => tally.pending += 1,
            Some("Scheduled") => tally.scheduled += 1,
            Some("Running") => tally.running += 1,
            _ => continue,
        }
        if let Some(node) = task["NodeName"].as_str().filter(|node| !node.is_empty())
            && task["State"] != "Pending"
        {
            *on.entry(node).or_default() += 1;
        }
    }
    if let Some((node, count)) = on.into_iter().max_by_key(|(node, count)| (*count, *node)) {
        tally.most_on_a_node = count;
        tally.fullest = node.to_string();
    }
    tally
}

/// The tasks placed on `node`, for a failure's message.
fn on_node(tasks: &[serde_json::Value], node: &str) -> String {
    tasks
        .iter()
        .filter(|task| task["NodeName"] == node)
        .map(|task| format!("{} ({}, {})", task["Name"], task["Project"], task["State"]))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_tasks_are_read_less_often() {
        assert_eq!(poll_every(300), Duration::from_millis(100));
        assert_eq!(poll_every(5000), Duration::from_millis(500));
        assert_eq!(poll_every(200_000), Duration::from_secs(1));
    }

    #[test]
    fn the_tally_counts_placed_tasks_by_node_and_names_the_fullest() {
        let tasks = vec![
            serde_json::json!({"State": "Running", "NodeName": "a"}),
            serde_json::json!({"State": "Scheduled", "NodeName": "a"}),
            serde_json::json!({"State": "Running", "NodeName": "b"}),
            serde_json::json!({"State": "Pending", "NodeName": ""}),
            // An ended task holds no room.
            serde_json::json!({"State": "Failed", "NodeName": "b"}),
        ];
        let tally = tally(&tasks);
        assert_eq!(
            tally,
            Tally {
                pending: 1,
                scheduled: 1,
                running: 2,
                most_on_a_node: 2,
                fullest: "a".to_string(),
            }
        );
    }
}
