//! Scheduler throughput, in process, no IO, one thread: placements per second of each
//! scheduler over a simulated cluster, and the balance of memory it leaves behind.
//!
//! ```text
//! cargo bench -p cube-scheduler --bench throughput
//! cargo bench -p cube-scheduler --bench throughput -- --scheduler epvm --nodes 10000 --placements 1000000
//! cargo bench -p cube-scheduler --bench throughput -- --scheduler epvm-sampled --sample-size 14
//! ```
//!
//! Options: `--runs N` (default 5; without it a row also stops after `--row-budget-secs`,
//! default 60, so that the slow rows do not take the whole default run); `--scheduler`,
//! `--nodes`, `--placements` pick rows (each takes a comma-separated list); `--sample-size K`
//! fixes epvm-sampled's sample instead of its default; `--seed S` changes the cluster and the
//! task stream. `--quick`, as CI's `scripts/bench-smoke.sh` runs the in-process benches, is one
//! run of 100 nodes and 1,000 placements. Cargo's own `--bench` is ignored.
//!
//! The cluster: nodes of four shapes (32, 64, 96 and 128 GiB of memory, one core per GiB),
//! interleaved pseudo-randomly in name order, all ready. The tasks: 64 MiB to 1 GiB of memory
//! in steps of 64 MiB and 0.1 to 0.5 cores, drawn from the same seeded stream for every
//! scheduler and run. Node sizes scale with placements per node so that every row asks for
//! about two thirds of the cluster's memory: at 100 placements per node (10,000 nodes and
//! 1,000,000 placements) the shapes are as given; at 10 per node a tenth of that, at 1,000
//! per node ten times. Each
//! placement is applied to the snapshot (`NodeView::add_task`) before the next, as the
//! manager does.
//!
//! Rates are placements over wall time, median (min–max) over the row's runs. "Per
//! CPU-second" divides by the time the thread was actually on a CPU (Linux only), with that
//! time's share of the wall time: when other work shares the cores, the share drops below
//! 100 % and the wall-time rates read low. Runs under half a second are too short for it.
//!
//! Quality: each node's memory utilisation (allocated / capacity) at the end, as max − min and
//! population standard deviation, in percentage points. For epvm-sampled the last column
//! compares it with exhaustive epvm's on the same row (when that row ran too): its standard
//! deviation as a ratio of epvm's, and its max − min less epvm's.

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use cube_scheduler::rng::SplitMix64;
use cube_scheduler::{
    Decision, EpvmSampled, NodeView, SCHEDULER_NAMES, Scheduler, TaskRequest, scheduler_by_name,
};
use cube_types::Resources;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
/// Node memory sizes at 100 placements per node, in GiB; each node also has one core per GiB.
const NODE_MEMORY_GIB: [u64; 4] = [32, 64, 96, 128];
/// The placements per node at which nodes have the sizes above.
const PLACEMENTS_PER_NODE_AT_FULL_SIZE: f64 = 100.0;
const DEFAULT_NODES: [usize; 2] = [1_000, 10_000];
const DEFAULT_PLACEMENTS: [usize; 2] = [100_000, 1_000_000];
const DEFAULT_RUNS: usize = 5;
const DEFAULT_ROW_BUDGET: Duration = Duration::from_secs(60);
const DEFAULT_SEED: u64 = 2024;
/// The shortest run whose on-CPU time is reported: a tick's error is at most 1 % of it.
const SHORTEST_RUN_ON_CPU: Duration = Duration::from_millis(500);

fn main() -> ExitCode {
    // `cargo bench` adds `--bench`; it means nothing here.
    let args = std::env::args().skip(1).filter(|arg| arg != "--bench");
    let options = match Options::parse(args) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("throughput: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let rows = options.rows();
    if rows.is_empty() {
        eprintln!("throughput: no row matches the filters\n{USAGE}");
        return ExitCode::from(2);
    }
    eprintln!(
        "{} rows, one thread, up to {} runs each{}",
        rows.len(),
        options.runs,
        if options.runs_fixed {
            String::new()
        } else {
            format!(" (a row stops after {} s)", options.row_budget.as_secs())
        }
    );
    let results: Vec<RowResult> = rows.iter().map(|row| run_row(row, &options)).collect();
    print_table(&results, &options);
    ExitCode::SUCCESS
}

const USAGE: &str = "usage: throughput [--quick] [--runs N] [--row-budget-secs S] [--scheduler NAMES] \
                     [--nodes COUNTS] [--placements COUNTS] [--sample-size K] [--seed S]";

/// What to run, from the command line.
struct Options {
    runs: usize,
    /// `--runs` was given: run exactly that many, whatever the time.
    runs_fixed: bool,
    row_budget: Duration,
    schedulers: Vec<String>,
    nodes: Vec<usize>,
    placements: Vec<usize>,
    /// epvm-sampled's sample size; `None` for its default.
    sample_size: Option<usize>,
    seed: u64,
}

impl Options {
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
        let mut options = Options {
            runs: DEFAULT_RUNS,
            runs_fixed: false,
            row_budget: DEFAULT_ROW_BUDGET,
            schedulers: SCHEDULER_NAMES
                .iter()
                .map(|name| name.to_string())
                .collect(),
            nodes: DEFAULT_NODES.to_vec(),
            placements: DEFAULT_PLACEMENTS.to_vec(),
            sample_size: None,
            seed: DEFAULT_SEED,
        };
        while let Some(flag) = args.next() {
            if flag == "--quick" {
                options.runs = 1;
                options.runs_fixed = true;
                options.nodes = vec![100];
                options.placements = vec![1000];
                continue;
            }
            let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--runs" => {
                    options.runs = parse_count(&flag, &value)?.max(1);
                    options.runs_fixed = true;
                }
                "--row-budget-secs" => {
                    options.row_budget = Duration::from_secs(parse_count(&flag, &value)? as u64);
                }
                "--scheduler" => options.schedulers = parse_schedulers(&value)?,
                "--nodes" => options.nodes = parse_list(&flag, &value)?,
                "--placements" => options.placements = parse_list(&flag, &value)?,
                "--sample-size" => options.sample_size = Some(parse_count(&flag, &value)?),
                "--seed" => options.seed = parse_count(&flag, &value)? as u64,
                _ => return Err(format!("unknown option {flag:?}")),
            }
        }
        Ok(options)
    }

    /// Every scheduler × nodes × placements the filters allow, in that order (so exhaustive
    /// epvm runs before the sampled variant it is compared with).
    fn rows(&self) -> Vec<Row> {
        let mut rows = Vec::new();
        for scheduler in &self.schedulers {
            for &nodes in &self.nodes {
                for &placements in &self.placements {
                    rows.push(Row {
                        scheduler: scheduler.clone(),
                        nodes,
                        placements,
                    });
                }
            }
        }
        rows
    }

    fn scheduler(&self, name: &str) -> Option<Box<dyn Scheduler>> {
        match (name, self.sample_size) {
            ("epvm-sampled", Some(size)) => {
                Some(Box::new(EpvmSampled::new().with_sample_size(size)))
            }
            _ => scheduler_by_name(name),
        }
    }
}

fn parse_count(flag: &str, value: &str) -> Result<usize, String> {
    value
        .replace('_', "")
        .parse()
        .map_err(|_| format!("{flag} takes a whole number, not {value:?}"))
}

fn parse_list(flag: &str, value: &str) -> Result<Vec<usize>, String> {
    value
        .split(',')
        .map(|item| match parse_count(flag, item)? {
            0 => Err(format!("{flag} must be above 0")),
            count => Ok(count),
        })
        .collect()
}

fn parse_schedulers(value: &str) -> Result<Vec<String>, String> {
    value
        .split(',')
        .map(|name| match SCHEDULER_NAMES.contains(&name) {
            true => Ok(name.to_string()),
            false => Err(format!(
                "unknown scheduler {name:?}: use {}",
                SCHEDULER_NAMES.join(", ")
            )),
        })
        .collect()
}

/// One line of the table.
#[derive(Clone)]
struct Row {
    scheduler: String,
    nodes: usize,
    placements: usize,
}

/// What one run of a row measured.
struct RunResult {
    elapsed: Duration,
    /// The time the thread was on a CPU meanwhile, when the system says (Linux); less than
    /// `elapsed` when other work shared the cores.
    on_cpu: Option<Duration>,
    placed: usize,
    spread: Spread,
}

/// Every run of a row.
struct RowResult {
    row: Row,
    runs: Vec<RunResult>,
    /// The row's time, runs and set-up included.
    took: Duration,
}

/// Memory utilisation across nodes at the end of a run, in percentage points.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Spread {
    max_minus_min: f64,
    standard_deviation: f64,
    mean: f64,
}

fn run_row(row: &Row, options: &Options) -> RowResult {
    let started = Instant::now();
    let mut runs = Vec::new();
    while runs.len() < options.runs {
        let Some(scheduler) = options.scheduler(&row.scheduler) else {
            break;
        };
        runs.push(run_once(scheduler, row, options.seed));
        if !options.runs_fixed && started.elapsed() >= options.row_budget {
            break;
        }
    }
    let took = started.elapsed();
    if let Some(first) = runs.first()
        && runs
            .iter()
            .any(|run| run.placed != first.placed || run.spread != first.spread)
    {
        eprintln!("warning: {} runs disagree on their outcome", row.scheduler);
    }
    eprintln!(
        "{} × {} nodes × {} placements: {} runs in {:.1} s",
        row.scheduler,
        row.nodes,
        row.placements,
        runs.len(),
        took.as_secs_f64()
    );
    RowResult {
        row: row.clone(),
        runs,
        took,
    }
}

/// A fresh cluster, a fresh scheduler and the seeded task stream: the placements timed, the
/// spread measured at the end.
fn run_once(mut scheduler: Box<dyn Scheduler>, row: &Row, seed: u64) -> RunResult {
    let mut nodes = cluster(row.nodes, row.placements, seed);
    let mut tasks = TaskStream::new(seed);
    let mut placed = 0;
    let cpu_before = thread_cpu_time();
    let started = Instant::now();
    for _ in 0..row.placements {
        let task = tasks.next_task();
        if let Decision::Placed { index, .. } = scheduler.place(&task, &nodes) {
            nodes[index].add_task(&task);
            placed += 1;
        }
    }
    let elapsed = started.elapsed();
    let on_cpu = thread_cpu_time()
        .zip(cpu_before)
        .map(|(after, before)| after.saturating_sub(before));
    RunResult {
        elapsed,
        on_cpu,
        placed,
        spread: memory_spread(&nodes),
    }
}

/// The time this thread has spent on a CPU, from Linux's `/proc/thread-self/schedstat`
/// (its first field, in nanoseconds); `None` elsewhere.
fn thread_cpu_time() -> Option<Duration> {
    let schedstat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let nanoseconds = schedstat.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(nanoseconds))
}

/// `node_count` ready nodes of the four shapes, scaled to `placements`.
fn cluster(node_count: usize, placements: usize, seed: u64) -> Vec<NodeView> {
    let scale = placements as f64 / node_count as f64 / PLACEMENTS_PER_NODE_AT_FULL_SIZE;
    let mut shapes = SplitMix64::new(seed.wrapping_add(1));
    (0..node_count)
        .map(|index| {
            let memory_gib = NODE_MEMORY_GIB[shapes.below(NODE_MEMORY_GIB.len())];
            NodeView {
                name: format!("node-{index:06}"),
                ready: true,
                ineligible: false,
                capacity: Resources {
                    cpu: memory_gib as f64 * scale,
                    memory: (memory_gib as f64 * scale * GIB as f64) as u64,
                    disk: 1 << 40,
                },
                allocated: Resources::default(),
                task_count: 0,
                host_ports_taken: BTreeSet::new(),
                labels: Default::default(),
                host_policy: None,
            }
        })
        .collect()
}

/// Tasks of mixed sizes, the same sequence for the same seed.
struct TaskStream {
    rng: SplitMix64,
}

impl TaskStream {
    fn new(seed: u64) -> TaskStream {
        TaskStream {
            rng: SplitMix64::new(seed),
        }
    }

    /// 64 MiB to 1 GiB in steps of 64 MiB; 0.1 to 0.5 cores.
    fn next_task(&mut self) -> TaskRequest {
        let memory_steps = 1 + self.rng.below(16) as u64;
        let cpu_tenths = 1 + self.rng.below(5);
        TaskRequest {
            cpu: cpu_tenths as f64 / 10.0,
            memory: memory_steps * 64 * MIB,
            disk: 0,
            host_ports: BTreeSet::new(),
            constraints: Vec::new(),
            host_needs: None,
        }
    }
}

fn memory_spread(nodes: &[NodeView]) -> Spread {
    let utilisation: Vec<f64> = nodes
        .iter()
        .filter(|node| node.capacity.memory > 0)
        .map(|node| 100.0 * node.allocated.memory as f64 / node.capacity.memory as f64)
        .collect();
    let count = utilisation.len().max(1) as f64;
    let mean = utilisation.iter().sum::<f64>() / count;
    let variance = utilisation
        .iter()
        .map(|value| (value - mean).powi(2))
        .sum::<f64>()
        / count;
    let max = utilisation.iter().copied().fold(f64::MIN, f64::max);
    let min = utilisation.iter().copied().fold(f64::MAX, f64::min);
    Spread {
        max_minus_min: if utilisation.is_empty() {
            0.0
        } else {
            max - min
        },
        standard_deviation: variance.sqrt(),
        mean,
    }
}

/// The median, lowest and highest placements per second over a row's runs.
fn rates(result: &RowResult) -> (f64, f64, f64) {
    let mut rates: Vec<f64> = result
        .runs
        .iter()
        .map(|run| result.row.placements as f64 / run.elapsed.as_secs_f64())
        .collect();
    rates.sort_by(f64::total_cmp);
    let median = match rates.len() {
        0 => 0.0,
        count if count % 2 == 1 => rates[count / 2],
        count => (rates[count / 2 - 1] + rates[count / 2]) / 2.0,
    };
    let lowest = rates.first().copied().unwrap_or(0.0);
    let highest = rates.last().copied().unwrap_or(0.0);
    (median, lowest, highest)
}

fn median_elapsed(result: &RowResult) -> Duration {
    let mut elapsed: Vec<Duration> = result.runs.iter().map(|run| run.elapsed).collect();
    elapsed.sort();
    elapsed.get(elapsed.len() / 2).copied().unwrap_or_default()
}

/// The median placements per second of on-CPU time, and the median share of the wall time
/// the thread was on a CPU: a share well below 100 % means other work shared the cores and
/// the wall-time rates read low. Linux updates a running thread's count only every scheduler
/// tick (a few milliseconds), so runs shorter than [`SHORTEST_RUN_ON_CPU`] are left out.
fn on_cpu(result: &RowResult) -> String {
    let runs: Vec<(f64, f64)> = result
        .runs
        .iter()
        .filter(|run| run.elapsed >= SHORTEST_RUN_ON_CPU)
        .filter_map(|run| {
            let on_cpu = run.on_cpu?.as_secs_f64();
            let share = on_cpu / run.elapsed.as_secs_f64();
            Some((result.row.placements as f64 / on_cpu, share))
        })
        .collect();
    if runs.is_empty() {
        return "(too short)".to_string();
    }
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let rate = median(runs.iter().map(|&(rate, _)| rate).collect());
    let share = median(runs.iter().map(|&(_, share)| share).collect());
    format!("{} ({:.0} %)", thousands(rate), 100.0 * share)
}

fn print_table(results: &[RowResult], options: &Options) {
    let sample = match options.sample_size {
        Some(size) => format!("{size} nodes"),
        None => "the default".to_string(),
    };
    println!(
        "One thread, in process. epvm-sampled scores {sample}; seed {}.\n",
        options.seed
    );
    println!(
        "| scheduler | nodes | placements | runs | placements/s median (min–max) | per CPU-second \
         (on CPU) | placed | wall, median | mean mem. util. | util. max − min | util. std dev | \
         vs epvm: std ratio, max − min diff | row took |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|");
    for result in results {
        let Some(last) = result.runs.last() else {
            continue;
        };
        let (median, lowest, highest) = rates(result);
        let row = &result.row;
        println!(
            "| {} | {} | {} | {} | {} ({}–{}) | {} | {} | {:.2} s | {:.1} % | {:.2} pp | {:.2} pp | {} | {:.0} s |",
            row.scheduler,
            thousands(row.nodes as f64),
            thousands(row.placements as f64),
            result.runs.len(),
            thousands(median),
            thousands(lowest),
            thousands(highest),
            on_cpu(result),
            thousands(last.placed as f64),
            median_elapsed(result).as_secs_f64(),
            last.spread.mean,
            last.spread.max_minus_min,
            last.spread.standard_deviation,
            versus_exhaustive(result, results),
            result.took.as_secs_f64(),
        );
    }
}

/// For an epvm-sampled row: its std dev over epvm's, and its max − min less epvm's.
fn versus_exhaustive(result: &RowResult, results: &[RowResult]) -> String {
    if result.row.scheduler != "epvm-sampled" {
        return String::new();
    }
    let exhaustive = results.iter().find(|other| {
        other.row.scheduler == "epvm"
            && other.row.nodes == result.row.nodes
            && other.row.placements == result.row.placements
    });
    match (
        result.runs.last(),
        exhaustive.and_then(|other| other.runs.last()),
    ) {
        (Some(sampled), Some(exhaustive)) => format!(
            "×{:.2}, {:+.2} pp",
            sampled.spread.standard_deviation / exhaustive.spread.standard_deviation,
            sampled.spread.max_minus_min - exhaustive.spread.max_minus_min
        ),
        _ => "(epvm row not run)".to_string(),
    }
}

/// `1234567.8` as `1,234,568`.
fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut grouped = String::new();
    for (position, digit) in digits.chars().enumerate() {
        if position > 0 && (digits.len() - position) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    grouped
}
