//! `cube-bench shards`: issue 32's benchmark of controllers sharded by project: the
//! baseline (the leader acts for every shard), and with `--shard-controllers` every manager
//! acting for its own shards.
//!
//! For each manager count M (1, 2 and 3 by default), a fresh 3-member etcd cluster on
//! loopback ports and M fresh `cube manager -d etcd` processes on it; the ring settled (every
//! shard held, each virtual node holding its range), `--projects` projects made
//! (`POST /projects`), `--nodes` simulated workers (`sim-workers`, the real worker code on the
//! in-memory runtime, [`WORKERS_PER_PROCESS`] to a child process) beating to the managers,
//! each process starting its list at another manager. Then `--tasks` small tasks, spread
//! evenly over the projects (`POST /tasks?project=p-N`), are submitted round-robin over the
//! M managers by [`SUBMITTERS`] clients at once; from the first submission until the
//! leader's `GET /metrics` counts every task `Running` (asked every [`POLL_EVERY`]) is the
//! figure. Then each manager's RSS (`VmRSS`, and `VmHWM` as its peak), which one leads
//! (`GET /leader`), the shards each holds (`GET /shards`) and how many of the tasks are in
//! projects of those shards: what a manager would hold once the controllers run per shard.
//!
//! Without `--shard-controllers` several managers on etcd give availability, not capacity: a
//! follower hands every request to the leader, which alone holds every task and runs every
//! controller (`crates/cube/src/leading.rs`); placement runs on the leader alone, so there
//! are no conflicts to count, and the table says so rather than give a number. With it, each
//! manager holds and places its own shards' tasks (`crates/cube/src/acting.rs`): the counts
//! are every manager's summed, and each manager's `/metrics` gives the placements that lost
//! the race for a node's claims (each planned again at once: a conflict is a re-plan) and
//! the time of the claims' commits (the conflict check), per placement. Then, with
//! `--failover` and two managers or more, one that does not lead is killed with -9, and the time from the kill
//! until a task submitted to a project of its shards is placed by the new owner is the
//! failover figure; every task must still be held once and `Running`.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cube_test_support::EtcdCluster;
use cube_types::shard::{ShardsView, shard_of};
use tokio::task::JoinSet;

use crate::Summary;
use crate::load::{self, ManagerProcess, SimWorkers};

/// How many submissions are in flight at once, over all managers: as many as the etcd
/// benchmark's clients, so that the managers' group commits fill.
pub(crate) const SUBMITTERS: usize = 64;

/// How often the leader's task counts are read while the tasks go in and start.
const POLL_EVERY: Duration = Duration::from_millis(500);

/// How often a progress line goes to stderr.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// The run gives up when neither the acknowledged submissions nor the `Running` tasks have
/// moved for this long.
const STALL_BOUND: Duration = Duration::from_secs(120);

/// How long the managers may take to elect a leader and settle the ring.
const SETTLE_BOUND: Duration = Duration::from_secs(60);

/// How many simulated workers one `sim-workers` process runs (2,000 nodes: 4 processes).
const WORKERS_PER_PROCESS: usize = 500;

/// How many times one submission is sent (to the next manager each time) before the run
/// fails: a follower answers 503 while no manager leads.
const SUBMIT_ATTEMPTS: usize = 5;

/// The managers' lease, as shipped.
pub(crate) const LEADER_TTL: &str = "5s";

/// How long after every task ran each manager's memory is read again, nothing asked of it
/// meanwhile: whether the first reading caught a passing peak of the burst.
const SETTLE_FOR: Duration = Duration::from_secs(15);

/// What a cell says where placement would conflict or re-plan: one process places.
const NO_CONFLICTS: &str = "— (placement on the leader alone)";

/// How long the failover may take before the run fails.
const FAILOVER_BOUND: Duration = Duration::from_secs(120);

/// The target: each of 3 managers holds at most this fraction of one alone's RSS.
const TARGET_FRACTION: f64 = 0.40;

pub(crate) struct Options {
    pub tasks: usize,
    pub projects: usize,
    pub nodes: usize,
    pub managers: Vec<usize>,
    pub runs: usize,
    /// `cube manager --shard-controllers`: every manager acts for its own shards.
    pub shard_controllers: bool,
    /// With `shard_controllers` and 2 managers or more: time the failover of one killed.
    pub failover: bool,
    /// The shard ring's size (`--shards`).
    pub ring: u32,
}

/// One manager of a run, as measured once every task ran.
struct ManagerFigures {
    leads: bool,
    /// After the nodes registered and the projects were made, before the first task.
    idle_rss_mb: f64,
    rss_mb: f64,
    peak_mb: f64,
    /// The part of `rss_mb` that is the process's own (`RssAnon`): not the binary's code
    /// pages, which every `cube` process on the machine shares.
    anon_mb: f64,
    /// `rss_mb` and `anon_mb` again `SETTLE_FOR` later, nothing asked of the managers
    /// meanwhile: what a manager holds once the burst of work is over.
    settled_rss_mb: f64,
    settled_anon_mb: f64,
    shards_held: usize,
    /// Tasks whose project is in a shard this manager holds.
    tasks_in_its_shards: usize,
    /// From its `/metrics` (`--shard-controllers`): its placements, the passes planned again
    /// after losing a node's claims, and its claims' commits (how many, seconds in all).
    placements: f64,
    conflicts: f64,
    claims_writes: f64,
    claims_write_seconds: f64,
}

/// One run with M managers.
struct RunFigures {
    /// In the order the managers were started.
    managers: Vec<ManagerFigures>,
    submitted_in: Duration,
    running_in: Duration,
    /// Submissions sent again to another manager after a failure.
    retried: usize,
    /// The leader at the end is not the one that led before the tasks went in.
    leader_changed: bool,
    /// `--shard-controllers` with 2 managers or more: from the kill -9 of one that does
    /// not lead until its shard's new owner placed a new task.
    failover: Option<Duration>,
}

impl RunFigures {
    /// Every manager's figure summed.
    fn sum(&self, figure: impl Fn(&ManagerFigures) -> f64) -> f64 {
        self.managers.iter().map(figure).sum()
    }

    fn leader(&self) -> Option<&ManagerFigures> {
        self.managers.iter().find(|manager| manager.leads)
    }

    fn largest_settled_mb(&self) -> (f64, f64) {
        let largest = |figure: fn(&ManagerFigures) -> f64| {
            self.managers.iter().map(figure).fold(0.0, f64::max)
        };
        (
            largest(|manager| manager.settled_rss_mb),
            largest(|manager| manager.settled_anon_mb),
        )
    }

    fn largest_rss_mb(&self) -> f64 {
        self.managers
            .iter()
            .map(|manager| manager.rss_mb)
            .fold(0.0, f64::max)
    }

    fn largest_anon_mb(&self) -> f64 {
        self.managers
            .iter()
            .map(|manager| manager.anon_mb)
            .fold(0.0, f64::max)
    }

    /// The RSS of the managers that do not lead, largest first.
    fn others_rss_mb(&self) -> Vec<f64> {
        let mut others: Vec<f64> = self
            .managers
            .iter()
            .filter(|manager| !manager.leads)
            .map(|manager| manager.rss_mb)
            .collect();
        others.sort_by(|a, b| b.total_cmp(a));
        others
    }
}

pub(crate) async fn shards(options: &Options, cube: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(
        options.tasks > 0 && options.projects > 0 && options.nodes > 0 && options.runs > 0,
        "--tasks, --projects, --nodes and --runs must be at least 1"
    );
    anyhow::ensure!(
        !options.managers.is_empty() && options.managers.iter().all(|&count| count > 0),
        "--managers lists manager counts of at least 1"
    );
    let processes = options.nodes.div_ceil(WORKERS_PER_PROCESS);
    println!(
        "shards{}: {} tasks in {} projects on {} simulated workers ({processes} sim-workers \
         processes), \
         through {:?} managers on a 3-member loopback etcd (fresh cluster and managers each \
         run, --leader-ttl {LEADER_TTL}, --heartbeat-grace 120s, a ring of {} shards), \
         {SUBMITTERS} clients \
         submitting round-robin over the managers; {} run(s) each; load average {}",
        if options.shard_controllers {
            " --shard-controllers"
        } else {
            ""
        },
        options.tasks,
        options.projects,
        options.nodes,
        options.managers,
        options.ring,
        options.runs,
        crate::load_average()
    );
    anyhow::ensure!(
        (1..=cube_types::shard::MAX_RING).contains(&options.ring),
        "--ring is a number of shards from 1 to {}",
        cube_types::shard::MAX_RING
    );
    let mut results: Vec<(usize, Vec<RunFigures>)> = Vec::new();
    for &count in &options.managers {
        let mut runs = Vec::new();
        for run in 1..=options.runs {
            let figures = run_once(options, count, cube).await?;
            eprintln!(
                "{count} managers, run {run}/{}: submitted in {:.1} s, all Running in {:.1} s; \
                 RSS {}{}{}",
                options.runs,
                figures.submitted_in.as_secs_f64(),
                figures.running_in.as_secs_f64(),
                figures
                    .managers
                    .iter()
                    .map(|manager| format!(
                        "{:.0} MB{}",
                        manager.rss_mb,
                        if manager.leads { " (leader)" } else { "" }
                    ))
                    .collect::<Vec<_>>()
                    .join(", "),
                if figures.leader_changed {
                    "; the leader changed during the run"
                } else {
                    ""
                },
                figures
                    .failover
                    .map(|took| format!("; a shard's failover took {:.2} s", took.as_secs_f64()))
                    .unwrap_or_default()
            );
            runs.push(figures);
        }
        results.push((count, runs));
    }
    print_tables(options, &results);
    Ok(())
}

fn print_tables(options: &Options, results: &[(usize, Vec<RunFigures>)]) {
    // The baseline of the fraction: one manager alone, the median of its runs.
    let alone = results
        .iter()
        .find(|(count, _)| *count == 1)
        .map(|(_, runs)| {
            (
                median(runs.iter().map(RunFigures::largest_rss_mb)),
                median(runs.iter().map(RunFigures::largest_anon_mb)),
                median(runs.iter().map(|run| run.largest_settled_mb().0)),
                median(runs.iter().map(|run| run.largest_settled_mb().1)),
            )
        });
    println!();
    println!(
        "| managers | submissions/s | first submission → all Running, s | min | max | leader RSS MB \
         (peak) | other managers' RSS MB | largest RSS / one manager alone (the same of RssAnon) | \
         each of 3 ≤ 40 % of one alone (issue 32) | the same fraction 15 s later (of RssAnon) | placement conflicts/s, re-plans/s | conflict \
         check per placement, ms (per commit) | kill -9 → new owner placing, s |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---|---:|---|---:|---|---|---|");
    for (count, runs) in results {
        let rate = median(
            runs.iter()
                .map(|run| options.tasks as f64 / run.submitted_in.as_secs_f64()),
        );
        let mut running: Vec<f64> = runs
            .iter()
            .map(|run| run.running_in.as_secs_f64())
            .collect();
        let running = Summary::of(&mut running);
        let leader_rss = median(runs.iter().filter_map(|run| run.leader().map(|m| m.rss_mb)));
        let leader_peak = median(
            runs.iter()
                .filter_map(|run| run.leader().map(|m| m.peak_mb)),
        );
        // The others' RSS rank by rank (largest first), each the median over the runs.
        let others: Vec<String> = (0..count.saturating_sub(1))
            .map(|rank| {
                median(
                    runs.iter()
                        .filter_map(|run| run.others_rss_mb().get(rank).copied()),
                )
            })
            .map(|mb| format!("{mb:.0}"))
            .collect();
        let largest = median(runs.iter().map(RunFigures::largest_rss_mb));
        let largest_anon = median(runs.iter().map(RunFigures::largest_anon_mb));
        let largest_settled = median(runs.iter().map(|run| run.largest_settled_mb().0));
        let largest_settled_anon = median(runs.iter().map(|run| run.largest_settled_mb().1));
        let settled_fraction = match alone {
            Some((_, _, alone, alone_anon)) if alone > 0.0 && alone_anon > 0.0 => format!(
                "{:.2} ({:.2})",
                largest_settled / alone,
                largest_settled_anon / alone_anon
            ),
            _ => "—".to_string(),
        };
        let (fraction, met) = match alone {
            Some((alone, alone_anon, _, _)) if alone > 0.0 && alone_anon > 0.0 => {
                let fraction = largest / alone;
                let anon_fraction = largest_anon / alone_anon;
                let met = match count {
                    3 if fraction <= TARGET_FRACTION => "yes",
                    3 => "**no**",
                    _ => "—",
                };
                (format!("{fraction:.2} ({anon_fraction:.2})"), met)
            }
            _ => ("— (no 1-manager run)".to_string(), "—"),
        };
        let (conflicts, check, failover) = if options.shard_controllers {
            let per_second =
                median(runs.iter().map(|run| {
                    run.sum(|manager| manager.conflicts) / run.running_in.as_secs_f64()
                }));
            let per_placement = median(runs.iter().map(|run| {
                1000.0 * run.sum(|manager| manager.claims_write_seconds)
                    / run.sum(|manager| manager.placements).max(1.0)
            }));
            let per_commit = median(runs.iter().map(|run| {
                1000.0 * run.sum(|manager| manager.claims_write_seconds)
                    / run.sum(|manager| manager.claims_writes).max(1.0)
            }));
            let failover: Vec<f64> = runs
                .iter()
                .filter_map(|run| run.failover.map(|took| took.as_secs_f64()))
                .collect();
            (
                format!("{per_second:.2}, {per_second:.2}"),
                format!("{per_placement:.3} ({per_commit:.1})"),
                if failover.is_empty() {
                    "—".to_string()
                } else {
                    format!("{:.2}", median(failover.into_iter()))
                },
            )
        } else {
            (NO_CONFLICTS.to_string(), "—".to_string(), "—".to_string())
        };
        println!(
            "| {count} | {rate:.0} | {:.1} | {:.1} | {:.1} | {leader_rss:.0} ({leader_peak:.0}) | {} \
             | {fraction} | {met} | {settled_fraction} | {conflicts} | {check} | {failover} |",
            running.median,
            running.min,
            running.max,
            if others.is_empty() {
                "—".to_string()
            } else {
                others.join(", ")
            }
        );
    }
    println!();
    println!(
        "| managers | run | manager | role | RSS before the tasks MB | RSS all Running MB | of it \
         RssAnon MB | RSS 15 s later MB (RssAnon) | peak MB | ring shards held | tasks in its shards' projects | retried \
         submissions | leader changed |"
    );
    println!("|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for (count, runs) in results {
        for (run, figures) in runs.iter().enumerate() {
            for (index, manager) in figures.managers.iter().enumerate() {
                println!(
                    "| {count} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} ({:.0}) | {:.0} | {} | {} | {} | {} |",
                    run + 1,
                    index + 1,
                    if manager.leads { "leader" } else { "follower" },
                    manager.idle_rss_mb,
                    manager.rss_mb,
                    manager.anon_mb,
                    manager.settled_rss_mb,
                    manager.settled_anon_mb,
                    manager.peak_mb,
                    manager.shards_held,
                    manager.tasks_in_its_shards,
                    figures.retried,
                    if figures.leader_changed { "yes" } else { "no" }
                );
            }
        }
    }
}

/// The median of some figures (0 when there are none).
fn median(figures: impl Iterator<Item = f64>) -> f64 {
    let mut figures: Vec<f64> = figures.collect();
    if figures.is_empty() {
        return 0.0;
    }
    Summary::of(&mut figures).median
}

/// One run with `count` managers, everything started fresh and stopped at the end.
async fn run_once(options: &Options, count: usize, cube: &Path) -> anyhow::Result<RunFigures> {
    // Killed (every member) when dropped at the end of the run.
    let cluster = EtcdCluster::start(3);
    let endpoints = cluster.endpoints_flag();
    let prefix = format!("/bench-shards-{}", uuid::Uuid::new_v4().simple());
    // A simulated worker's heartbeat may be late on a busy machine: a node marked down
    // would have its tasks placed again, which is not what is measured.
    let mut flags = crate::etcd::etcd_manager_flags(&endpoints, &prefix, LEADER_TTL);
    flags.extend(["--heartbeat-grace".to_string(), "120s".to_string()]);
    flags.extend(["--shards".to_string(), options.ring.to_string()]);
    if options.shard_controllers {
        flags.push("--shard-controllers".to_string());
    }
    let Started {
        _dirs,
        mut managers,
        bases,
        http,
        leader,
    } = start_settled(cube, count, &flags, options.projects).await?;
    let sims = spawn_sim_workers(&bases, options.nodes, None).await?;
    load::await_ready_nodes(&http, &bases[leader], options.nodes).await?;
    let nodes = load::nodes(&http, &bases[leader]).await?;
    let room = room_for_small_tasks(&nodes)?;
    anyhow::ensure!(
        room >= options.tasks,
        "{} nodes hold only {room} of the {} small tasks",
        nodes.len(),
        options.tasks
    );
    let idle_rss_mb: Vec<f64> = managers
        .iter()
        .map(|manager| load::memory_mb(manager.pid).map(|(rss, _)| rss))
        .collect::<anyhow::Result<_>>()?;

    let started = Instant::now();
    let acknowledged = Arc::new(AtomicUsize::new(0));
    let retried = Arc::new(AtomicUsize::new(0));
    let mut submitters = spawn_submitters(
        &http,
        &bases,
        (options.tasks, options.projects),
        &acknowledged,
        &retried,
    );

    let mut submitted_in = None;
    let mut poll = tokio::time::interval(POLL_EVERY);
    let mut last_progress = Instant::now();
    let (mut best_running, mut best_acknowledged, mut moved) = (0, 0, Instant::now());
    let running_in = loop {
        tokio::select! {
            joined = submitters.join_next(), if !submitters.is_empty() => {
                if let Some(joined) = joined {
                    joined.context("a submitting client panicked")??;
                }
                if submitters.is_empty() {
                    submitted_in = Some(started.elapsed());
                }
                continue;
            }
            _ = poll.tick() => {}
        }
        let counts = held_counts(&http, &bases, leader, options.shard_controllers).await?;
        let now_acknowledged = acknowledged.load(Ordering::Relaxed);
        if counts.running >= options.tasks && submitted_in.is_some() {
            break started.elapsed();
        }
        if counts.running > best_running || now_acknowledged > best_acknowledged {
            best_running = best_running.max(counts.running);
            best_acknowledged = best_acknowledged.max(now_acknowledged);
            moved = Instant::now();
        } else if moved.elapsed() > STALL_BOUND {
            bail!(
                "stalled: {now_acknowledged} of {} submissions acknowledged, {} tasks Running, \
                 nothing moved for {STALL_BOUND:?}",
                options.tasks,
                counts.running
            );
        }
        if last_progress.elapsed() >= PROGRESS_EVERY {
            last_progress = Instant::now();
            eprintln!(
                "  {count} managers, {:.0} s: {now_acknowledged} submissions acknowledged, {} \
                 tasks held, {} Running",
                started.elapsed().as_secs_f64(),
                counts.held,
                counts.running
            );
        }
    };
    // Read first, before anything else asks the managers for work.
    let memory: Vec<(f64, f64)> = managers
        .iter()
        .map(|manager| load::memory_mb(manager.pid))
        .collect::<anyhow::Result<_>>()?;
    let anon_mb: Vec<f64> = managers
        .iter()
        .map(|manager| anon_memory_mb(manager.pid))
        .collect::<anyhow::Result<_>>()?;
    // Read again once the burst is over, before anything asks the managers for more.
    tokio::time::sleep(SETTLE_FOR).await;
    let settled: Vec<(f64, f64)> = managers
        .iter()
        .map(|manager| {
            Ok((
                load::memory_mb(manager.pid)?.0,
                anon_memory_mb(manager.pid)?,
            ))
        })
        .collect::<anyhow::Result<_>>()?;
    let roles = roles(&http, &bases).await?;
    let ring: ShardsView = crate::get_json(&http, &format!("{}/shards", bases[leader])).await?;
    let counts = held_counts(&http, &bases, leader, options.shard_controllers).await?;
    anyhow::ensure!(
        counts.held == options.tasks && counts.running == options.tasks,
        "tasks lost or duplicated: the managers hold {} tasks, {} Running, of {}",
        counts.held,
        counts.running,
        options.tasks
    );
    let mut claimed = Vec::new();
    for base in &bases {
        claimed.push(claim_figures(&http, base).await?);
    }
    let failover = if options.shard_controllers && options.failover && count >= 2 {
        let victim = (0..count)
            .find(|index| !roles[*index].0)
            .context("no manager that does not lead")?;
        let held: HashSet<u32> = ring
            .managers
            .iter()
            .filter(|shards| shards.manager == roles[victim].1)
            .flat_map(|shards| shards.shards.iter().copied())
            .collect();
        // A project of its shards: one of the run's, or one made now.
        let project = match (0..options.projects)
            .map(project_name)
            .find(|name| held.contains(&shard_of(name, ring.ring)))
        {
            Some(project) => project,
            None => {
                let name = (0..)
                    .map(|n| format!("failover-{n}"))
                    .find(|name| held.contains(&shard_of(name, ring.ring)))
                    .context("the manager to kill holds no shard")?;
                let answer = http
                    .post(format!("{}/projects", bases[victim]))
                    .json(&serde_json::json!({"Name": name}))
                    .send()
                    .await?;
                anyhow::ensure!(
                    answer.status().as_u16() == 201,
                    "POST /projects of {name} answered {}",
                    answer.status()
                );
                name
            }
        };
        let killed = managers.remove(victim);
        let survivors: Vec<String> = bases
            .iter()
            .enumerate()
            .filter(|(index, _)| *index != victim)
            .map(|(_, base)| base.clone())
            .collect();
        killed.kill().await?;
        let took = failover(&http, &survivors, &project).await?;
        // Every task still held once, and running: the new owners may still be loading
        // the shards they took.
        let settled = Instant::now();
        loop {
            let counts = held_counts(&http, &survivors, 0, true).await;
            if let Ok(counts) = &counts
                && counts.held == options.tasks + 1
                && counts.running == options.tasks + 1
            {
                break;
            }
            if settled.elapsed() > FAILOVER_BOUND {
                bail!(
                    "after the failover the managers hold {counts:?}, not {} tasks all Running",
                    options.tasks + 1
                );
            }
            tokio::time::sleep(POLL_EVERY).await;
        }
        Some(took)
    } else {
        None
    };
    for sim in sims {
        sim.stop().await?;
    }
    for manager in managers {
        manager.kill().await?;
    }
    drop(cluster);

    let figures = roles
        .iter()
        .zip(&memory)
        .zip(&idle_rss_mb)
        .zip(&anon_mb)
        .zip(&claimed)
        .zip(&settled)
        .map(
            |(
                (((((leads, me), (rss_mb, peak_mb)), idle_rss_mb), anon_mb), claimed),
                (settled_rss_mb, settled_anon_mb),
            )| {
                let held: HashSet<u32> = ring
                    .managers
                    .iter()
                    .filter(|shards| shards.manager == *me)
                    .flat_map(|shards| shards.shards.iter().copied())
                    .collect();
                ManagerFigures {
                    leads: *leads,
                    idle_rss_mb: *idle_rss_mb,
                    rss_mb: *rss_mb,
                    peak_mb: *peak_mb,
                    anon_mb: *anon_mb,
                    settled_rss_mb: *settled_rss_mb,
                    settled_anon_mb: *settled_anon_mb,
                    shards_held: held.len(),
                    tasks_in_its_shards: tasks_in_shards(options, ring.ring, &held),
                    placements: claimed.placements,
                    conflicts: claimed.conflicts,
                    claims_writes: claimed.claims_writes,
                    claims_write_seconds: claimed.claims_write_seconds,
                }
            },
        )
        .collect();
    Ok(RunFigures {
        managers: figures,
        submitted_in: submitted_in.unwrap_or_default(),
        running_in,
        retried: retried.load(Ordering::Relaxed),
        leader_changed: !roles.get(leader).is_some_and(|(leads, _)| *leads),
        failover,
    })
}

/// The tasks held and `Running`: the leader's alone, or with `--shard-controllers` every
/// manager's summed (each holds its own shards').
/// [`SUBMITTERS`] clients submitting tasks `0..tasks` in `projects` projects ([`submit`])
/// through the managers at `bases`, counting each acknowledged, and each sent again in
/// `retried`; each client ends once every task is taken.
pub(crate) fn spawn_submitters(
    http: &reqwest::Client,
    bases: &[String],
    (tasks, projects): (usize, usize),
    acknowledged: &Arc<AtomicUsize>,
    retried: &Arc<AtomicUsize>,
) -> JoinSet<anyhow::Result<()>> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut submitters = JoinSet::new();
    for _ in 0..SUBMITTERS {
        let (http, bases, next, acknowledged, retried) = (
            http.clone(),
            bases.to_vec(),
            next.clone(),
            acknowledged.clone(),
            retried.clone(),
        );
        submitters.spawn(async move {
            loop {
                let number = next.fetch_add(1, Ordering::Relaxed);
                if number >= tasks {
                    return anyhow::Ok(());
                }
                let again = submit(&http, &bases, number, projects).await?;
                acknowledged.fetch_add(1, Ordering::Relaxed);
                retried.fetch_add(again, Ordering::Relaxed);
            }
        });
    }
    submitters
}

/// The managers of a run, started, the ring settled and the projects made.
pub(crate) struct Started {
    /// Their data directories, removed when dropped.
    pub(crate) _dirs: Vec<tempfile::TempDir>,
    pub(crate) managers: Vec<ManagerProcess>,
    pub(crate) bases: Vec<String>,
    pub(crate) http: reqwest::Client,
    /// Which of them leads.
    pub(crate) leader: usize,
}

/// [`start_managers`], then the leader awaited, the ring of `count` settled and `projects`
/// projects made ([`create_projects`]).
pub(crate) async fn start_settled(
    cube: &Path,
    count: usize,
    flags: &[String],
    projects: usize,
) -> anyhow::Result<Started> {
    let (dirs, managers) = start_managers(cube, count, flags).await?;
    let bases: Vec<String> = managers
        .iter()
        .map(|manager| manager.base.clone())
        .collect();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()?;
    let leader = crate::etcd::await_leader(&http, &bases, None).await?;
    await_ring(&http, &bases[leader], count).await?;
    create_projects(&http, &bases, projects).await?;
    Ok(Started {
        _dirs: dirs,
        managers,
        bases,
        http,
        leader,
    })
}

/// `count` fresh `cube manager` processes with `flags`, each with a data directory of its own
/// (its log), removed when the directories are dropped; with `CUBE_BENCH_KEEP_LOGS` set, kept
/// (whether the run passes or fails) and named.
pub(crate) async fn start_managers(
    cube: &Path,
    count: usize,
    flags: &[String],
) -> anyhow::Result<(Vec<tempfile::TempDir>, Vec<ManagerProcess>)> {
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut dirs: Vec<tempfile::TempDir> = (0..count)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    if std::env::var_os("CUBE_BENCH_KEEP_LOGS").is_some() {
        for dir in &mut dirs {
            dir.disable_cleanup(true);
            eprintln!("a manager's directory, kept: {}", dir.path().display());
        }
    }
    let mut managers = Vec::new();
    for dir in &dirs {
        managers.push(ManagerProcess::start_with(cube, dir.path(), 0, &flags).await?);
    }
    Ok((dirs, managers))
}

/// Makes the projects `p-0` … through the managers in turn.
pub(crate) async fn create_projects(
    http: &reqwest::Client,
    bases: &[String],
    projects: usize,
) -> anyhow::Result<()> {
    for project in 0..projects {
        let base = &bases[project % bases.len()];
        let name = project_name(project);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let answer = http
                .post(format!("{base}/projects"))
                .json(&serde_json::json!({"Name": name}))
                .send()
                .await
                .with_context(|| format!("POST /projects of {name}"))?;
            let status = answer.status();
            if status.as_u16() == 201 {
                break;
            }
            // A manager still opening the state of the shards it took answers 503.
            if status.as_u16() != 503 || attempt >= SUBMIT_ATTEMPTS {
                bail!(
                    "POST /projects of {name} to {base} answered {status}: {}",
                    answer.text().await.unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// `nodes` simulated workers ([`WORKERS_PER_PROCESS`] to a process) beating to the managers
/// at `bases`, each offering `memory` when given; waits until they listen.
pub(crate) async fn spawn_sim_workers(
    bases: &[String],
    nodes: usize,
    memory: Option<&str>,
) -> anyhow::Result<Vec<SimWorkers>> {
    let processes = nodes.div_ceil(WORKERS_PER_PROCESS);
    let mut sims = Vec::new();
    for process in 0..processes {
        // Each process starts its list at another manager, so that the heartbeats reach
        // every manager (a worker stays with the one that answered last).
        let list: Vec<&str> = (0..bases.len())
            .map(|offset| bases[(process + offset) % bases.len()].as_str())
            .collect();
        sims.push(
            SimWorkers::spawn_sized(
                &list.join(","),
                share(nodes, processes, process),
                &format!("shard{process}"),
                "2s",
                memory,
            )
            .await?,
        );
    }
    Ok(sims)
}

async fn held_counts(
    http: &reqwest::Client,
    bases: &[String],
    leader: usize,
    sharded: bool,
) -> anyhow::Result<TaskCounts> {
    if !sharded {
        return task_counts(http, &bases[leader]).await;
    }
    let mut sum = TaskCounts::default();
    for base in bases {
        let counts = task_counts(http, base).await?;
        sum.held += counts.held;
        sum.running += counts.running;
    }
    Ok(sum)
}

/// What one manager's `/metrics` says of its placements and claims.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct ClaimFigures {
    pub(crate) placements: f64,
    pub(crate) conflicts: f64,
    pub(crate) claims_writes: f64,
    pub(crate) claims_write_seconds: f64,
}

pub(crate) async fn claim_figures(
    http: &reqwest::Client,
    base: &str,
) -> anyhow::Result<ClaimFigures> {
    Ok(parse_claim_figures(&metrics_text(http, base).await?))
}

fn parse_claim_figures(text: &str) -> ClaimFigures {
    let value = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|value| value.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    ClaimFigures {
        placements: value("cube_placements_total"),
        conflicts: value("cube_placement_conflicts_total"),
        claims_writes: value("cube_claims_write_duration_seconds_count"),
        claims_write_seconds: value("cube_claims_write_duration_seconds_sum"),
    }
}

/// From now (a manager just killed), how long until a task submitted to `project` through
/// the `survivors` is placed: submitted again and again (a 421 or 503 while the shard moves)
/// until one is acknowledged, then its state read until it is no longer `Pending`.
async fn failover(
    http: &reqwest::Client,
    survivors: &[String],
    project: &str,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut task = load::small_task("after-the-kill");
    let id = uuid::Uuid::new_v4().to_string();
    task["ID"] = serde_json::Value::String(id.clone());
    let mut attempt = 0;
    loop {
        let base = &survivors[attempt % survivors.len()];
        attempt += 1;
        if let Ok(answer) = http
            .post(format!("{base}/tasks?project={project}"))
            .json(&task)
            .send()
            .await
            && matches!(answer.status().as_u16(), 200 | 201)
        {
            break;
        }
        if started.elapsed() > FAILOVER_BOUND {
            bail!("no manager took a task of {project} within {FAILOVER_BOUND:?} of the kill");
        }
        // A pause between attempts while the shard moves.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    loop {
        let base = &survivors[attempt % survivors.len()];
        attempt += 1;
        if let Ok(task) =
            crate::get_json::<serde_json::Value>(http, &format!("{base}/tasks/{id}")).await
            && task["State"] != "Pending"
            && task["State"].is_string()
        {
            return Ok(started.elapsed());
        }
        if started.elapsed() > FAILOVER_BOUND {
            bail!("the task of {project} was not placed within {FAILOVER_BOUND:?} of the kill");
        }
        // The task's state has no blocking read across managers: polled.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) fn project_name(project: usize) -> String {
    format!("p-{project}")
}

/// Of `total` things split over `parts`, how many part `index` gets (the first ones one
/// more when it does not divide).
fn share(total: usize, parts: usize, index: usize) -> usize {
    total / parts + usize::from(index < total % parts)
}

/// How many of the tasks are in projects whose shard is in `held` (task N is in project
/// N modulo the projects).
fn tasks_in_shards(options: &Options, ring: u32, held: &HashSet<u32>) -> usize {
    (0..options.projects)
        .filter(|&project| held.contains(&shard_of(&project_name(project), ring)))
        .map(|project| share(options.tasks, options.projects, project))
        .sum()
}

/// How many of [`load::small_task`] the nodes can hold together, by what it declares.
pub(crate) fn room_for_small_tasks(nodes: &[cube_types::Node]) -> anyhow::Result<usize> {
    let task = load::small_task("sizing");
    let memory = match task["Memory"].as_str() {
        Some(text) => cube_types::size::parse_size(text).map_err(anyhow::Error::msg)?,
        None => 0,
    };
    let cpu = match task["Cpu"].as_str() {
        Some(text) => cube_types::cpu::parse_cpu(text).map_err(anyhow::Error::msg)?,
        None => 0.0,
    };
    Ok(nodes
        .iter()
        .map(|node| {
            let by_memory = node.capacity.memory.checked_div(memory).unwrap_or(u64::MAX);
            let by_cpu = if cpu > 0.0 {
                (node.capacity.cpu / cpu).floor() as u64
            } else {
                u64::MAX
            };
            usize::try_from(by_memory.min(by_cpu)).unwrap_or(usize::MAX)
        })
        .fold(0usize, usize::saturating_add))
}

/// Submits task `number` (in project `number` modulo `projects`) to manager `number` modulo
/// the managers, and after a failure to the next, with the same ID so that none is made
/// twice; how many times it was sent again.
pub(crate) async fn submit(
    http: &reqwest::Client,
    bases: &[String],
    number: usize,
    projects: usize,
) -> anyhow::Result<usize> {
    let project = project_name(number % projects);
    let mut task = load::small_task(&format!("t-{number}"));
    task["ID"] = serde_json::Value::String(uuid::Uuid::new_v4().to_string());
    let mut failure = String::new();
    for attempt in 0..SUBMIT_ATTEMPTS {
        let base = &bases[(number + attempt) % bases.len()];
        match http
            .post(format!("{base}/tasks?project={project}"))
            .json(&task)
            .send()
            .await
        {
            Ok(answer) if matches!(answer.status().as_u16(), 200 | 201) => return Ok(attempt),
            // A refusal of the task itself is not a moment without a leader: no retry.
            Ok(answer) if answer.status().is_client_error() => {
                let status = answer.status();
                bail!(
                    "POST /tasks?project={project} of task {number} answered {status}: {}",
                    answer.text().await.unwrap_or_default()
                );
            }
            Ok(answer) => {
                failure = format!(
                    "{base} answered {}: {}",
                    answer.status(),
                    answer.text().await.unwrap_or_default()
                )
            }
            Err(err) => failure = format!("{base}: {err}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("task {number} not acknowledged after {SUBMIT_ATTEMPTS} attempts; the last: {failure}")
}

/// A process's own resident memory (`RssAnon` in /proc), in MB (10^6 bytes).
fn anon_memory_mb(pid: u32) -> anyhow::Result<f64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    parse_kib_field(&status, "RssAnon:")
        .map(|kib| kib * 1024.0 / 1e6)
        .with_context(|| format!("no readable RssAnon in {path}"))
}

/// A `NAME:   1234 kB` line of /proc/PID/status, in KiB.
fn parse_kib_field(status: &str, name: &str) -> Option<f64> {
    let line = status.lines().find(|line| line.starts_with(name))?;
    line.trim_start_matches(name)
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// The tasks a manager holds, and of them the `Running` ones.
#[derive(Debug, Default, PartialEq, Eq)]
struct TaskCounts {
    held: usize,
    running: usize,
}

/// The leader's task gauges (`GET /metrics`: counted from its records at each scrape).
async fn task_counts(http: &reqwest::Client, base: &str) -> anyhow::Result<TaskCounts> {
    Ok(parse_task_counts(&metrics_text(http, base).await?))
}

/// A manager's `GET /metrics`.
pub(crate) async fn metrics_text(http: &reqwest::Client, base: &str) -> anyhow::Result<String> {
    Ok(http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .with_context(|| format!("GET {base}/metrics"))?
        .error_for_status()?
        .text()
        .await?)
}

/// `cube_tasks{state="…"}` of a Prometheus text exposition, summed, and the `Running` one.
fn parse_task_counts(text: &str) -> TaskCounts {
    let mut counts = TaskCounts::default();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("cube_tasks{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let value = value as usize;
        counts.held += value;
        if labels.contains("\"Running\"") {
            counts.running += value;
        }
    }
    counts
}

/// Each manager's `GET /leader`, answered by itself: whether it leads, and its address as
/// the ring names it.
async fn roles(http: &reqwest::Client, bases: &[String]) -> anyhow::Result<Vec<(bool, String)>> {
    let mut roles = Vec::new();
    for base in bases {
        let answer: serde_json::Value = crate::get_json(http, &format!("{base}/leader")).await?;
        let me = answer["Self"]
            .as_str()
            .with_context(|| format!("{base}/leader names no Self: {answer}"))?;
        roles.push((answer["IsLeader"] == true, me.to_string()));
    }
    Ok(roles)
}

/// Waits until the ring has `count` managers, every shard held and every virtual node
/// holding its whole range.
pub(crate) async fn await_ring(
    http: &reqwest::Client,
    base: &str,
    count: usize,
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        if let Ok(view) = crate::get_json::<ShardsView>(http, &format!("{base}/shards")).await
            && view.managers.len() == count
            && crate::etcd::ring_settled(&view)
        {
            return Ok(());
        }
        if started.elapsed() > SETTLE_BOUND {
            bail!("the ring of {count} managers did not settle within {SETTLE_BOUND:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_task_counts_are_the_task_gauges_summed_and_the_running_one() {
        let text = "# HELP cube_tasks Tasks by state\n\
                    # TYPE cube_tasks gauge\n\
                    cube_tasks{state=\"Pending\"} 5\n\
                    cube_tasks{state=\"Running\"} 90\n\
                    cube_tasks{state=\"Scheduled\"} 5\n\
                    cube_tasks_other 7\n\
                    cube_node_tasks{node=\"Running\"} 3\n";
        assert_eq!(
            parse_task_counts(text),
            TaskCounts {
                held: 100,
                running: 90
            }
        );
    }

    #[test]
    fn a_status_field_is_read_in_kib() {
        let status = "VmRSS:\t   52000 kB\nRssAnon:\t   30000 kB\nRssFile:\t   22000 kB\n";
        assert_eq!(parse_kib_field(status, "RssAnon:"), Some(30000.0));
        assert_eq!(parse_kib_field(status, "RssShmem:"), None);
    }

    #[test]
    fn a_split_gives_the_first_parts_one_more() {
        let parts: Vec<usize> = (0..3).map(|index| share(10, 3, index)).collect();
        assert_eq!(parts, [4, 3, 3]);
        assert_eq!(
            (0..4).map(|index| share(2000, 4, index)).sum::<usize>(),
            2000
        );
    }

    #[test]
    fn the_claim_figures_are_read_from_a_managers_metrics() {
        let text = "cube_placements_total 120\n\
                    cube_placement_conflicts_total 3\n\
                    cube_claims_write_duration_seconds_sum 0.5\n\
                    cube_claims_write_duration_seconds_count 10\n\
                    cube_claims_write_duration_seconds_bucket{le=\"0.001\"} 2\n";
        assert_eq!(
            parse_claim_figures(text),
            ClaimFigures {
                placements: 120.0,
                conflicts: 3.0,
                claims_writes: 10.0,
                claims_write_seconds: 0.5,
            }
        );
        assert_eq!(parse_claim_figures(""), ClaimFigures::default());
    }

    #[test]
    fn every_task_is_in_the_shards_of_the_whole_ring_and_none_in_none() {
        let options = Options {
            tasks: 1001,
            projects: 7,
            nodes: 1,
            managers: vec![1],
            runs: 1,
            shard_controllers: false,
            failover: false,
            ring: 16,
        };
        let all: HashSet<u32> = (0..16).collect();
        assert_eq!(tasks_in_shards(&options, 16, &all), 1001);
        assert_eq!(tasks_in_shards(&options, 16, &HashSet::new()), 0);
        let halves: (HashSet<u32>, HashSet<u32>) = (0..16).partition(|shard| shard % 2 == 0);
        assert_eq!(
            tasks_in_shards(&options, 16, &halves.0) + tasks_in_shards(&options, 16, &halves.1),
            1001
        );
    }
}
