//! `cube-bench`: Cube measured next to its peers, raw Docker and Docker Swarm, in the same run:
//! start latency, bursts, scaling, rolling updates, recovery, the waiting list's hand-over,
//! footprint, the store, the event stream, and what `--acl --tls` costs next to a plain cluster. Each subcommand (one module each) prints markdown tables for BENCHMARKS.md;
//! none fails on a time: the figures are whatever they are.

mod burst;
mod c1m;
mod chaos;
mod containers;
mod contend;
mod crowd;
mod day_two;
mod etcd;
mod events;
mod footprint;
mod load;
mod pod;
mod queue;
mod recovery;
mod rolling;
mod router;
mod scale;
mod secure;
mod service_job;
mod shards;
mod simulated;
mod soak;
mod start_latency;
mod store;
mod swarm;
mod ui;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};

/// Cube's benchmarks. Each prints a table; none fails on a time.
#[derive(Debug, Parser)]
#[command(name = "cube-bench", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Time from POST /tasks to Running on a worker, next to bollard create+start.
    StartLatency {
        /// How many tasks each side starts in one set, one after another.
        #[arg(long, default_value_t = 20)]
        runs: usize,
        /// How many sets: each gives a p50, a p95 and a ratio; the summary gives their
        /// median, min and max.
        #[arg(long, default_value_t = 5)]
        sets: usize,
        /// The `cube` binary to run the worker with [default: next to this binary].
        #[arg(long)]
        cube: Option<PathBuf>,
        /// Submit to the manager (placement, dispatch, state reports) or to the worker alone.
        #[arg(long, value_enum, default_value_t = Through::Manager)]
        through: Through,
        /// Instead of raw Docker, the other side is Cube too, with each task in a project
        /// that has a quota (`bench`, made at the start): what projects cost on the way from
        /// a submission to `Running`. Through the manager only.
        #[arg(long)]
        in_project: bool,
    },
    /// Many tasks asked for at once, until all run: Cube, raw Docker at the worker's
    /// parallelism, and Docker Swarm (`service create --replicas N`), taking turns.
    Burst {
        /// How many bursts each side gets.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// How many tasks one burst asks for.
        #[arg(long, default_value_t = 50)]
        tasks: usize,
        /// Ask Cube for them as one service job of that count, not as single tasks.
        #[arg(long)]
        as_job: bool,
        /// The `cube` binary [default: next to this binary].
        #[arg(long)]
        cube: Option<PathBuf>,
    },
    /// A service scaled from --from copies to --to and back, timed each way: Cube's service job
    /// (`POST /jobs/{name}/scale`) next to `docker service scale`, taking turns (a single-node
    /// swarm is initialised when there is none, and left afterwards).
    Scale {
        /// How many times each side scales up and down.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// How many copies the service starts with and comes back to.
        #[arg(long, default_value_t = 50)]
        from: usize,
        /// How many copies it is scaled up to.
        #[arg(long, default_value_t = 100)]
        to: usize,
        /// The `cube` binary [default: next to this binary].
        #[arg(long)]
        cube: Option<PathBuf>,
    },
    /// A health-checked service updated from one command to another, 2 copies at a time:
    /// Cube's deployment (`POST /jobs` of a changed job) next to `docker service update`
    /// (stop-first with Swarm's default `--update-monitor` and with its smallest, and
    /// start-first with its smallest), taking turns (a single-node swarm is initialised when
    /// there is none, and left afterwards).
    Rolling {
        /// How many updates each side gets.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// How many copies the service runs.
        #[arg(long, default_value_t = 10)]
        copies: usize,
        /// The `cube` binary [default: next to this binary].
        #[arg(long)]
        cube: Option<PathBuf>,
    },
    /// Time from freeing room (`DELETE /tasks/{id}` of the task that fills the worker) until
    /// the head of the waiting list is `claimed`, next to raw Docker given the same work: stop
    /// of the running container, then create + start of the next (create + start alone is
    /// reported too).
    Queue {
        /// How many hand-overs (each with one raw Docker stop + start next to it).
        #[arg(long, default_value_t = 20)]
        runs: usize,
        /// `RUST_LOG` of the manager and the worker (`debug` to see where the time goes; the
        /// logging then slows what is timed).
        #[arg(long, default_value = "warn")]
        log_level: String,
        /// Copy the manager's and worker's log (one file, both processes) here at the end.
        #[arg(long)]
        keep_log: Option<PathBuf>,
        /// The `cube` binary [default: next to this binary].
        #[arg(long)]
        cube: Option<PathBuf>,
    },
    /// A two-service pod from submit until its server answers on its published port and the
    /// service that depends on it runs, next to `docker-compose up -d` of the same file (both
    /// watched the same way; Docker's `healthy` and docker-compose's start-up reported
    /// beside it; the ratio run by run).
    Pod {
        /// Runs of each side.
        #[arg(long, default_value_t = 10)]
        runs: usize,
        /// The `cube` binary [default: next to this one].
        #[arg(long)]
        cube: Option<PathBuf>,
    },
    /// Time from `docker kill` of a task's container until Docker's `start` event of its new
    /// one, next to Docker Swarm timed the same way (a single-node swarm is initialised when
    /// there is none, and left afterwards).
    Recovery {
        /// How many kills each side gets.
        #[arg(long, default_value_t = 10)]
        runs: usize,
        /// How many sets: each gives a median and a ratio; the summary gives their median,
        /// min and max.
        #[arg(long, default_value_t = 5)]
        sets: usize,
        /// The `cube` binary [default: next to this binary].
        #[arg(long)]
        cube: Option<PathBuf>,
    },
    /// Resident memory of an idle worker, an idle manager and a manager holding --tasks
    /// tasks on simulated workers; the size of the release binary.
    Footprint {
        /// How many times each process is measured.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// How many tasks the loaded manager holds.
        #[arg(long, default_value_t = 100_000)]
        tasks: usize,
        /// The processes' store (memory tells the persistent store's share apart).
        #[arg(long, value_enum, default_value_t = load::DbType::Persistent)]
        dbtype: load::DbType,
        /// The `cube` binary [default: next to this binary].
        #[arg(long)]
        cube: Option<PathBuf>,
    },
    /// Durable submissions per second (and none lost to kill -9), and GET /tasks latency
    /// with many tasks.
    Store {
        /// How many runs of each submission setup.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// How long each run submits, in seconds.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        /// How many clients submit at once (a run with one client follows each).
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// The task counts GET /tasks is timed at, comma-separated (`--list-tasks` alone:
        /// none).
        #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "10000,100000")]
        list_tasks: Vec<usize>,
        /// The `cube` binary [default: next to this binary].
        #[arg(long)]
        cube: Option<PathBuf>,
    },
    /// Cube on etcd next to Cube on redb: durable submissions through one manager (a
    /// 3-member loopback etcd cluster, fresh each run, and a redb file, taking turns run by
    /// run), 1 and N clients; then the failover of three managers: kill -9 of the leader until
    /// another leads and places a task, with submissions in flight across each kill.
    Etcd {
        /// How many runs of each submission setup (0: the failover alone).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// How long each run submits, in seconds.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        /// How many clients submit at once (a run with one client comes first).
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// How many times the leader is killed (0: no failover runs).
        #[arg(long, default_value_t = 10)]
        kills: usize,
        /// The managers' --leader-ttl in the failover runs.
        #[arg(long, default_value = "5s", value_parser = cube_types::duration::parse_duration)]
        leader_ttl: Duration,
        /// The `cube` binary [default: next to this binary].
        #[arg(long)]
        cube: Option<PathBuf>,
    },
    /// Several placers at once on a 3-member etcd, as the managers of a sharded cluster
    /// place: placements per second by 1, 2 and 3 placers, conflicts and re-plans, the
    /// conflict check's cost per placement; the claims checked against the records after.
    Contend {
        /// How many runs of each placer count and scheduler.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// How many simulated nodes (4 cores, 8 GiB each).
        #[arg(long, default_value_t = 2000)]
        nodes: usize,
        /// How many requests (0.25 cores, 256 MiB each) one trial places, divided among
        /// its placers.
        #[arg(long, default_value_t = 3000)]
        requests: usize,
        /// The placer counts to try, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
        placers: Vec<usize>,
        /// How many transactions of each kind time the conflict check's cost.
        #[arg(long, default_value_t = 1000)]
        check_writes: usize,
    },
    /// Issue 32's benchmark of controllers sharded by project, on the code as it is: for 1, 2
    /// and 3 managers on a fresh 3-member loopback etcd, --tasks small tasks in --projects
    /// projects submitted round-robin over the managers and run on --nodes simulated workers;
    /// the time from the first submission to all Running, each manager's RSS (the leader
    /// marked), the largest as a fraction of one manager alone, the shards each holds.
    Shards {
        /// How many tasks, spread evenly over the projects.
        #[arg(long, default_value_t = 200_000)]
        tasks: usize,
        /// How many projects (`p-0`, `p-1`, ...).
        #[arg(long, default_value_t = 200)]
        projects: usize,
        /// How many simulated workers.
        #[arg(long, default_value_t = 2000)]
        nodes: usize,
        /// The manager counts to measure, comma-separated (one alone is the baseline).
        #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
        managers: Vec<usize>,
        /// Start the managers with --shard-controllers: each acts for its own shards.
        #[arg(long)]
        shard_controllers: bool,
        /// With --shard-controllers and two managers or more: once every task runs, kill one
        /// that does not lead with -9 and time until its shard's new owner places a task.
        #[arg(long, requires = "shard_controllers")]
        failover: bool,
        /// How many runs of each manager count.
        #[arg(long, default_value_t = 1)]
        runs: usize,
        /// The shard ring's size, given to the managers as --shards (a ring three divides,
        /// 48, gives three managers a third each; 16 gives 6, 5 and 5 shards).
        #[arg(long, default_value_t = cube_types::shard::DEFAULT_RING)]
        ring: u32,
        /// The `cube` binary [default: next to this binary].
        #[arg(long)]
        cube: Option<PathBuf>,
    },
    /// Issue 32's contention check at scale: --managers managers with --shard-controllers on
    /// a fresh 3-member loopback etcd fill --nodes small simulated workers (room for --slots
    /// tasks of 16 MiB each) with more --tasks than they hold, all submitted at once; fails
    /// the moment any node is given more than its room, and ends when the nodes are full and
    /// every other task waits naming memory. Prints the conflicts (re-plans) on the way.
    Crowd {
        /// How many managers.
        #[arg(long, default_value_t = 3)]
        managers: usize,
        /// How many simulated workers.
        #[arg(long, default_value_t = 60)]
        nodes: usize,
        /// How many tasks of 16 MiB each worker holds.
        #[arg(long, default_value_t = 4)]
        slots: usize,
        /// How many tasks (more than --nodes × --slots: some wait).
        #[arg(long, default_value_t = 300)]
        tasks: usize,
        /// How many projects (`p-0`, `p-1`, ...), spread over the managers' shards.
        #[arg(long, default_value_t = 12)]
        projects: usize,
        /// How many runs.
        #[arg(long, default_value_t = 1)]
        runs: usize,
        /// The shard ring's size, given to the managers as --shards.
        #[arg(long, default_value_t = cube_types::shard::DEFAULT_RING)]
        ring: u32,
        /// Submit every task before the workers start: then each manager places many
        /// requests on many nodes in one pass, in several claims commits (more than 16
        /// nodes), racing the others.
        #[arg(long)]
        nodes_last: bool,
        /// The `cube` binary [default: next to this binary].
        #[arg(long)]
        cube: Option<PathBuf>,
    },
    /// The web UI in headless Chromium: the cluster page's first render with many tasks,
    /// next to the page's requests alone, and the manager's RSS with many tabs open.
    Ui {
        /// How many first renders (each taking turns with its peer).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// How many Running tasks the manager holds (on 100 simulated workers).
        #[arg(long, default_value_t = 10_000)]
        tasks: usize,
        /// How many tabs are open for the RSS figure.
        #[arg(long, default_value_t = 20)]
        tabs: usize,
        /// The `cube` binary [default: next to this binary].
        #[arg(long)]
        cube: Option<PathBuf>,
    },
    /// Reads and writes mixed on one manager for minutes: half the clients GET /tasks?limit=100,
    /// half POST /tasks; p50/p99 of each, errors, and the manager's RSS over time.
    Soak {
        /// How long the mixed load runs, in seconds.
        #[arg(long, default_value_t = 600)]
        seconds: u64,
        /// How many clients (half read, half write).
        #[arg(long, default_value_t = 64)]
        clients: usize,
        /// How many tasks the manager holds before the soak.
        #[arg(long, default_value_t = 5000)]
        tasks: usize,
        /// Requests per second each client sends (0: as fast as it can).
        #[arg(long, default_value_t = 5.0)]
        rate: f64,
        /// The `cube` binary [default: next to this binary].
        #[arg(long)]
        cube: Option<PathBuf>,
    },
    /// Time from a task's change on the manager to a `GET /events` subscriber reading it
    /// (p50, p99) with 1 and with 100 subscribers, and the manager's CPU and memory with 100
    /// idle subscribers next to none (one simulated worker, no Docker).
    Events {
        /// How many tasks are submitted (one after another) for each subscriber count.
        #[arg(long, default_value_t = 200)]
        tasks: usize,
        /// The subscriber counts to time, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,100")]
        subscribers: Vec<usize>,
        /// How long the manager's CPU and memory are watched, idle, with and without
        /// subscribers, in seconds.
        #[arg(long, default_value_t = 20)]
        idle_seconds: u64,
        /// The `cube` binary [default: next to this binary].
        #[arg(long)]
        cube: Option<PathBuf>,
    },
    /// One copy of the sample server loaded by wrk directly, through `cube router` and
    /// through HAProxy fed by `cube router --haproxy-config`, taking turns: requests/s, p50
    /// and p99 each; then the time from a copy turning healthy to its first request through
    /// the router.
    Router {
        /// How many turns each way gets.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// How long one wrk run lasts, in seconds.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// wrk's open connections (`-c`), comma-separated: each count is measured every
        /// run; 1 gives the latency a proxy adds to one request at a time.
        #[arg(long, value_delimiter = ',', default_value = "1,16")]
        connections: Vec<usize>,
        /// wrk's threads (`-t`).
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// How many times a second copy is started and timed to its first request.
        #[arg(long, default_value_t = 10)]
        scale_runs: usize,
        /// The `cube` binary [default: next to this binary].
        #[arg(long)]
        cube: Option<PathBuf>,
    },
    /// `cube logs -f` next to `docker logs -f` on the same container: a line printed in the
    /// container until it is on the follower's stdout, p50 and p99.
    LogsLatency {
        /// How many lines the container prints.
        #[arg(long, default_value_t = 1000)]
        lines: usize,
        /// Milliseconds between two lines.
        #[arg(long, default_value_t = 5)]
        interval_ms: u64,
        /// The `cube` binary [default: next to this binary].
        #[arg(long)]
        cube: Option<PathBuf>,
    },
    /// GET /metrics timed on a manager holding --tasks tasks (simulated workers), and the
    /// manager's RSS before and after --scrapes scrapes.
    MetricsScrape {
        #[arg(long, default_value_t = 100_000)]
        tasks: usize,
        #[arg(long, default_value_t = 100)]
        scrapes: usize,
        #[arg(long, value_enum, default_value_t = load::DbType::Persistent)]
        dbtype: load::DbType,
        /// The `cube` binary [default: next to this binary].
        #[arg(long)]
        cube: Option<PathBuf>,
    },
    /// What `cube manager --acl --tls` costs, next to a manager without them in the same run:
    /// submit → Running through a real manager and worker of each kind (taking turns), one
    /// request's round trip (kept-alive connection, new connection), and durable submissions
    /// with N clients and with one.
    Secure {
        /// How many tasks each side starts in one set, one after another.
        #[arg(long, default_value_t = 20)]
        runs: usize,
        /// How many sets: each gives a p50, a p95 and a ratio; the summary gives their
        /// median, min and max.
        #[arg(long, default_value_t = 5)]
        sets: usize,
        /// How many round trips of each kind each side makes.
        #[arg(long, default_value_t = 500)]
        requests: usize,
        /// How many runs of durable submissions each side gets, for each client count (0:
        /// none).
        #[arg(long, default_value_t = 5)]
        submit_runs: usize,
        /// How long each run of durable submissions lasts, in seconds.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        /// How many clients submit at once (a run with one client follows).
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// The `cube` binary [default: next to this binary].
        #[arg(long)]
        cube: Option<PathBuf>,
    },
    /// A chaos run: one manager (redb) or three on etcd (--store etcd) and --workers real workers on Docker under a mixed
    /// workload (tasks with every restart policy, service jobs submitted, changed, scaled and
    /// stopped, batch jobs, waiting-list requests of two priorities) while faults are injected
    /// at random from a seed (a manager or worker killed with -9 and started again, a worker
    /// stopped past the heartbeat grace, a container killed behind Cube's back); then the
    /// cluster settles and the history is checked. Exits non-zero on a violation, keeping the
    /// processes' logs; exits 3 when the Docker engine stopped answering (not a violation).
    Chaos {
        /// The seed of the workload and the faults [default: a random one, printed].
        #[arg(long)]
        seed: Option<u64>,
        /// redb: one manager on its store file; etcd: three managers on a three-member etcd
        /// cluster, whose members are killed too.
        #[arg(long, value_enum, default_value_t = chaos::ChaosStore::Redb)]
        store: chaos::ChaosStore,
        /// With --store etcd: the managers act for their own shards (`cube manager
        /// --shard-controllers`), so that a killed manager's projects move to the others.
        #[arg(long)]
        shard_controllers: bool,
        /// Spread the clients' requests over this many projects, made at the start
        /// (`chaos-0`, …), each client in one (with --shard-controllers, on several owners).
        /// 0: every request in `default`.
        #[arg(long, default_value_t = 0)]
        projects: usize,
        /// How long the workload and the faults go on (e.g. 3m, 30m).
        #[arg(long, default_value = "3m", value_parser = cube_types::duration::parse_duration)]
        duration: Duration,
        /// How many real workers.
        #[arg(long, default_value_t = 3)]
        workers: usize,
        /// The mean time between two faults.
        #[arg(long, default_value = "5s", value_parser = cube_types::duration::parse_duration)]
        fault_every: Duration,
        /// Write the recorded history here (JSON), for `chaos-check`.
        #[arg(long)]
        history: Option<PathBuf>,
        /// The `cube` binary [default: next to this binary].
        #[arg(long)]
        cube: Option<PathBuf>,
    },
    /// Checks a chaos run's recorded history (JSON) against the run's invariants: every
    /// acknowledged write exists once, one container per running task, jobs converged, no
    /// node over capacity, the waiting list in order, restarts within policy. Exits non-zero
    /// when one is broken.
    ChaosCheck {
        /// The history file.
        file: PathBuf,
    },
    /// Runs --count real workers on an in-memory container runtime in this one process,
    /// registered with --manager, until SIGINT or SIGTERM (the footprint and store
    /// benchmarks start it themselves).
    /// A million tasks on one manager (issue 30): 100 service jobs of 10,000 copies and
    /// 10,000 bare tasks submitted at once through the API to a manager on redb, placed on
    /// 10,000 simulated workers (the real worker code on an in-memory runtime); every 5 s the
    /// tasks placed and running, placements/s, the manager's RSS and its store file's size;
    /// then the time until all run, the manager's RSS, a restart on the same file, and the
    /// count check (every task once, each running on a node). `--quick`: 100,000 tasks on 500
    /// workers. Needs memory: several GB at a million.
    C1m {
        /// How many tasks in all (jobs and bare).
        #[arg(long, default_value_t = 1_000_000)]
        tasks: usize,
        /// Copies per service job.
        #[arg(long, default_value_t = 10_000)]
        job_size: usize,
        /// Bare tasks (`POST /tasks`), of the total.
        #[arg(long, default_value_t = 10_000)]
        bare: usize,
        /// Simulated workers.
        #[arg(long, default_value_t = 10_000)]
        workers: usize,
        /// Processes the simulated workers are spread over.
        #[arg(long, default_value_t = 4)]
        processes: usize,
        /// Each simulated worker's heartbeat interval.
        #[arg(long, default_value = "10s")]
        heartbeat: String,
        /// The quick figure: 100,000 tasks (9 jobs of 10,000 and 10,000 bare) on 500 workers
        /// in 2 processes; overrides the sizes.
        #[arg(long)]
        quick: bool,
        /// The manager's `--max-concurrent-reconciles` (tasks dispatched at once).
        #[arg(long, default_value_t = 64)]
        reconciles: u32,
        /// The `cube` binary [default: next to this binary].
        #[arg(long)]
        cube: Option<PathBuf>,
    },
    SimWorkers {
        /// The manager to register with (HOST:PORT).
        #[arg(long)]
        manager: String,
        /// How many workers.
        #[arg(long, default_value_t = 10)]
        count: usize,
        /// Workers are named PREFIX-0, PREFIX-1, ...
        #[arg(long, default_value = "sim")]
        name_prefix: String,
        /// How often each worker sends its heartbeat (e.g. 2s, 500ms).
        #[arg(long, default_value = "2s", value_parser = cube_types::duration::parse_duration)]
        heartbeat_interval: Duration,
        /// The memory each worker offers (e.g. 64MiB) [default: 1 TiB, room for 65,536
        /// tasks of 16 MiB]: small workers fill up, as `cube-bench crowd` wants.
        #[arg(long, value_parser = cube_types::size::parse_size)]
        memory: Option<u64>,
    },
}

/// Which API the tasks are submitted to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Through {
    Manager,
    Worker,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Every HTTP client of the process uses Cube's TLS crypto (reqwest has none of its own).
    let _ = cube_api::tls::provider();
    match Cli::parse().command {
        Command::StartLatency {
            runs,
            sets,
            cube,
            through,
            in_project,
        } => {
            start_latency::start_latency(runs, sets, &cube_binary(cube)?, through, in_project).await
        }
        Command::Burst {
            runs,
            tasks,
            as_job,
            cube,
        } => burst::burst(runs, tasks, as_job, &cube_binary(cube)?).await,
        Command::Scale {
            runs,
            from,
            to,
            cube,
        } => scale::scale(runs, from, to, &cube_binary(cube)?).await,
        Command::Rolling { runs, copies, cube } => {
            rolling::rolling(runs, copies, &cube_binary(cube)?).await
        }
        Command::Queue {
            runs,
            log_level,
            keep_log,
            cube,
        } => queue::queue(runs, &cube_binary(cube)?, &log_level, keep_log.as_deref()).await,
        Command::Pod { runs, cube } => pod::pod(runs, &cube_binary(cube)?).await,
        Command::Recovery { runs, sets, cube } => {
            recovery::recovery(runs, sets, &cube_binary(cube)?).await
        }
        Command::Footprint {
            runs,
            tasks,
            dbtype,
            cube,
        } => footprint::footprint(runs, tasks, dbtype, &cube_binary(cube)?).await,
        Command::Store {
            runs,
            seconds,
            concurrency,
            list_tasks,
            cube,
        } => store::store(runs, seconds, concurrency, &list_tasks, &cube_binary(cube)?).await,
        Command::Etcd {
            runs,
            seconds,
            concurrency,
            kills,
            leader_ttl,
            cube,
        } => {
            etcd::etcd(
                runs,
                seconds,
                concurrency,
                kills,
                leader_ttl,
                &cube_binary(cube)?,
            )
            .await
        }
        Command::Contend {
            runs,
            nodes,
            requests,
            placers,
            check_writes,
        } => contend::contend(runs, nodes, requests, placers, check_writes).await,
        Command::Shards {
            tasks,
            projects,
            nodes,
            managers,
            runs,
            shard_controllers,
            failover,
            ring,
            cube,
        } => {
            let options = shards::Options {
                tasks,
                projects,
                nodes,
                managers,
                runs,
                shard_controllers,
                failover,
                ring,
            };
            shards::shards(&options, &cube_binary(cube)?).await
        }
        Command::Crowd {
            managers,
            nodes,
            slots,
            tasks,
            projects,
            runs,
            ring,
            nodes_last,
            cube,
        } => {
            let options = crowd::Options {
                managers,
                nodes,
                slots,
                tasks,
                projects,
                runs,
                ring,
                nodes_last,
            };
            crowd::crowd(&options, &cube_binary(cube)?).await
        }
        Command::Ui {
            runs,
            tasks,
            tabs,
            cube,
        } => ui::ui(runs, tasks, tabs, &cube_binary(cube)?).await,
        Command::Router {
            runs,
            seconds,
            connections,
            threads,
            scale_runs,
            cube,
        } => {
            let options = router::Options {
                runs,
                seconds,
                connections,
                threads,
                scale_runs,
            };
            router::router(options, &cube_binary(cube)?).await
        }
        Command::Soak {
            seconds,
            clients,
            tasks,
            rate,
            cube,
        } => soak::soak(seconds, clients, tasks, rate, &cube_binary(cube)?).await,
        Command::Events {
            tasks,
            subscribers,
            idle_seconds,
            cube,
        } => events::events(tasks, &subscribers, idle_seconds, &cube_binary(cube)?).await,
        Command::LogsLatency {
            lines,
            interval_ms,
            cube,
        } => day_two::logs_latency(lines, interval_ms, &cube_binary(cube)?).await,
        Command::MetricsScrape {
            tasks,
            scrapes,
            dbtype,
            cube,
        } => day_two::metrics_scrape(tasks, scrapes, dbtype, &cube_binary(cube)?).await,
        Command::Secure {
            runs,
            sets,
            requests,
            submit_runs,
            seconds,
            concurrency,
            cube,
        } => {
            let options = secure::Options {
                runs,
                sets,
                requests,
                submit_runs,
                seconds,
                concurrency,
            };
            secure::secure(&options, &cube_binary(cube)?).await
        }
        Command::Chaos {
            seed,
            store,
            shard_controllers,
            projects,
            duration,
            workers,
            fault_every,
            history,
            cube,
        } => {
            if shard_controllers && store != chaos::ChaosStore::Etcd {
                anyhow::bail!(
                    "--shard-controllers needs --store etcd: one manager on redb holds every shard"
                );
            }
            let ran = chaos::chaos(chaos::Options {
                seed,
                store,
                shard_controllers,
                projects,
                duration,
                workers,
                fault_every,
                history,
                cube: cube_binary(cube)?,
            })
            .await;
            // A hung engine is not a violation: its own exit status, for scripts.
            if let Err(err) = &ran
                && let Some(hung) = err.downcast_ref::<chaos::DockerHung>()
            {
                eprintln!("Error: {hung}");
                std::process::exit(chaos::DockerHung::EXIT_CODE);
            }
            ran
        }
        Command::ChaosCheck { file } => chaos::check_file(&file),
        Command::C1m {
            tasks,
            job_size,
            bare,
            workers,
            processes,
            heartbeat,
            quick,
            reconciles,
            cube,
        } => {
            let mut options = match quick {
                true => c1m::Options::quick(),
                false => c1m::Options {
                    tasks,
                    job_size,
                    bare,
                    workers,
                    processes,
                    heartbeat,
                    reconciles: 64,
                },
            };
            options.reconciles = reconciles;
            c1m::c1m(options, &cube_binary(cube)?).await
        }
        Command::SimWorkers {
            manager,
            count,
            name_prefix,
            heartbeat_interval,
            memory,
        } => {
            simulated::sim_workers(&manager, count, &name_prefix, heartbeat_interval, memory).await
        }
    }
}

/// How many containers the benchmark's worker starts at once (`cube worker --parallelism`),
/// and raw Docker's parallelism next to it.
pub(crate) const PARALLELISM: usize = 8;

/// The node label on raw Docker's containers: not the benchmark worker's, whose resync would
/// remove them as containers no task owns.
pub(crate) const RAW_NODE: &str = "cube-bench-raw";

/// How long one task may take to become `Running` before the run is abandoned.
pub(crate) const RUN_BOUND: Duration = Duration::from_secs(30);

/// A manager and a worker registered with it (or, `Through::Worker`, a worker alone), both on
/// the persistent store, as separate `cube` processes; killed when dropped.
pub(crate) struct BenchCluster {
    /// Where tasks are submitted: the manager's API, or the worker's.
    pub base: String,
    pub node: String,
    /// The client of `base`: plain HTTP, or for a secured cluster HTTPS pinned to its CA with
    /// a `submit` token on every request.
    pub http: reqwest::Client,
    /// The cluster CA's fingerprint, for a secured cluster.
    pub ca_fingerprint: Option<String>,
    _processes: Vec<tokio::process::Child>,
    data_dir: tempfile::TempDir,
}

/// What a benchmark changes in its cluster: more arguments for `cube worker`, the
/// processes' `RUST_LOG`, and whether the cluster runs secured.
pub(crate) struct ClusterOptions<'a> {
    pub worker_args: &'a [&'a str],
    pub rust_log: &'a str,
    /// `cube manager --acl --tls`, the worker joined with a node token (its certificate
    /// from the manager), and the cluster's client on HTTPS with a `submit` token
    /// (`secure.rs`). Through the manager only.
    pub secure: bool,
}

impl Default for ClusterOptions<'_> {
    fn default() -> Self {
        ClusterOptions {
            worker_args: &[],
            rust_log: "warn",
            secure: false,
        }
    }
}

impl BenchCluster {
    pub(crate) async fn start(cube: &Path, through: Through) -> anyhow::Result<BenchCluster> {
        BenchCluster::start_with(cube, through, &ClusterOptions::default()).await
    }

    pub(crate) async fn start_with(
        cube: &Path,
        through: Through,
        options: &ClusterOptions<'_>,
    ) -> anyhow::Result<BenchCluster> {
        let data_dir = tempfile::tempdir()?;
        let node = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let mut processes = Vec::new();
        let (manager, secured) = match through {
            Through::Manager => {
                let mut args = vec!["manager", "-H", "127.0.0.1", "-p", "0", "-d", "persistent"];
                if options.secure {
                    args.extend(["--acl", "--tls"]);
                }
                let (child, base, line) =
                    load::spawn_cube_logged_line(cube, &args, data_dir.path(), options.rust_log)
                        .await?;
                processes.push(child);
                let secured = match options.secure {
                    true => {
                        let fingerprint =
                            load::ca_fingerprint_in_line(&line).with_context(|| {
                                format!("cube manager --tls printed no CA fingerprint: {line:?}")
                            })?;
                        Some(secure::AclAccess::bootstrap(&base, Some(&fingerprint)).await?)
                    }
                    false => None,
                };
                (Some(base), secured)
            }
            Through::Worker => {
                anyhow::ensure!(
                    !options.secure,
                    "a secured cluster is reached through its manager"
                );
                (None, None)
            }
        };
        let parallelism = PARALLELISM.to_string();
        let mut worker_args = vec![
            "worker",
            "-H",
            "127.0.0.1",
            "-p",
            "0",
            "-n",
            &node,
            "-d",
            "persistent",
            "--parallelism",
            &parallelism,
        ];
        let manager_address = manager.as_deref().map(|base| {
            base.trim_start_matches("http://")
                .trim_start_matches("https://")
                .to_string()
        });
        let join_token = match (&manager, &secured) {
            (Some(base), Some(secured)) => {
                Some(secured.token(base, "node", &format!("{node}-join")).await?)
            }
            _ => None,
        };
        match (&manager_address, &join_token) {
            // A join token of a TLS manager carries its CA's fingerprint: the worker asks the
            // manager for its certificate with it, as a user's worker does.
            (Some(address), Some(token)) => worker_args.extend([
                "--join",
                address,
                "--token",
                token,
                "--heartbeat-interval",
                "500ms",
            ]),
            (Some(address), None) => {
                worker_args.extend(["--manager", address, "--heartbeat-interval", "500ms"])
            }
            (None, _) => {}
        }
        worker_args.extend(options.worker_args);
        let (worker, worker_base) =
            load::spawn_cube_logged_at(cube, &worker_args, data_dir.path(), options.rust_log)
                .await?;
        processes.push(worker);
        let http = match (&manager, &secured) {
            (Some(base), Some(secured)) => {
                let token = secured.token(base, "submit", "cube-bench").await?;
                secure::manager_client(
                    secured.fingerprint.as_deref(),
                    Some(&token),
                    Duration::from_secs(10),
                )?
            }
            _ => reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()?,
        };
        let base = match &manager {
            Some(manager) => {
                await_ready_node(&http, manager, &node).await?;
                manager.clone()
            }
            None => worker_base,
        };
        Ok(BenchCluster {
            base,
            node: node.clone(),
            http,
            ca_fingerprint: secured.and_then(|secured| secured.fingerprint),
            _processes: processes,
            data_dir,
        })
    }
}

impl BenchCluster {
    /// The label on the worker's containers (`cube.node=NAME`), for `docker ps --filter`.
    pub(crate) fn container_label(&self) -> String {
        format!("{}={}", cube_runtime::LABEL_NODE, self.node)
    }

    /// Stops the manager and the worker, then removes every container the worker still had
    /// (a stopped task's container is kept for its logs): a benchmark leaves no container.
    pub(crate) async fn stop_and_sweep(self, docker: &bollard::Docker) {
        let label = self.container_label();
        drop(self);
        crate::containers::sweep(docker, &label).await;
    }

    /// The log both processes append their stderr to (gone with the cluster: copy it first).
    pub(crate) fn log_path(&self) -> PathBuf {
        self.data_dir.path().join("cube.log")
    }
}

/// The 1, 5 and 15 minute load averages, as /proc/loadavg gives them (`?` when unreadable).
pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| "?".to_string())
}

/// The `cube` binary: the one given, or the one next to this binary.
fn cube_binary(cube: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    Ok(match cube {
        Some(path) => path,
        None => std::env::current_exe()?.with_file_name("cube"),
    })
}

/// Waits until the manager lists `node` as `Ready`.
async fn await_ready_node(http: &reqwest::Client, manager: &str, node: &str) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let answer = http.get(format!("{manager}/nodes/{node}")).send().await?;
        if answer.status().is_success() {
            let node: serde_json::Value = answer.json().await?;
            if node["Status"] == "Ready" {
                return Ok(());
            }
        }
        if started.elapsed() > RUN_BOUND {
            bail!("worker {node} did not register with the manager within {RUN_BOUND:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `GET url`, refused unless 2xx, and its JSON body.
pub(crate) async fn get_json<T: serde::de::DeserializeOwned>(
    http: &reqwest::Client,
    url: &str,
) -> anyhow::Result<T> {
    let answer = http
        .get(url)
        .send()
        .await
        .with_context(|| format!("GET {url}"))?;
    anyhow::ensure!(
        answer.status().is_success(),
        "GET {url} answered {}",
        answer.status()
    );
    answer
        .json()
        .await
        .with_context(|| format!("reading GET {url}"))
}

/// Submits a task to Cube's API at `base`; returns its ID.
pub(crate) async fn submit(
    http: &reqwest::Client,
    base: &str,
    task: &serde_json::Value,
) -> anyhow::Result<String> {
    let answer = http.post(format!("{base}/tasks")).json(task).send().await?;
    anyhow::ensure!(
        answer.status().as_u16() == 201,
        "POST /tasks answered {}",
        answer.status()
    );
    Ok(answer.json::<serde_json::Value>().await?["ID"]
        .as_str()
        .context("task ID")?
        .to_string())
}

/// Median, 95th percentile, min and max of a set of times in ms.
pub(crate) struct Summary {
    pub(crate) median: f64,
    pub(crate) p95: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
}

impl Summary {
    pub(crate) fn of(times: &mut [f64]) -> Summary {
        times.sort_by(f64::total_cmp);
        let at = |fraction: f64| times[((times.len() - 1) as f64 * fraction).round() as usize];
        Summary {
            median: at(0.5),
            p95: at(0.95),
            min: times[0],
            max: times[times.len() - 1],
        }
    }
}

impl Summary {
    /// Median, min and max of ratios, as table cells.
    pub(crate) fn ratios(&self) -> String {
        self.spread(2)
    }

    /// Median, min and max with `decimals` decimals, as table cells.
    pub(crate) fn spread(&self, decimals: usize) -> String {
        format!(
            "{:.decimals$} | {:.decimals$} | {:.decimals$}",
            self.median, self.min, self.max
        )
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.1} | {:.1} | {:.1} | {:.1}",
            self.median, self.p95, self.min, self.max
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rolling_takes_its_runs_and_copies_and_defaults_to_3_runs_of_10() {
        let parsed = |args: &[&str]| match Cli::try_parse_from(args).map(|cli| cli.command) {
            Ok(Command::Rolling { runs, copies, cube }) => Ok((runs, copies, cube)),
            Ok(other) => panic!("{other:?}"),
            Err(err) => Err(err.kind()),
        };
        assert_eq!(parsed(&["cube-bench", "rolling"]), Ok((3, 10, None)));
        assert_eq!(
            parsed(&["cube-bench", "rolling", "--runs", "5", "--copies", "4"]),
            Ok((5, 4, None))
        );
        assert_eq!(
            parsed(&["cube-bench", "rolling", "--copies", "ten"]),
            Err(clap::error::ErrorKind::ValueValidation)
        );
    }

    #[test]
    fn secure_takes_its_counts_and_defaults_to_5_sets_of_20_and_5_runs_of_64_clients() {
        let parsed = |args: &[&str]| match Cli::try_parse_from(args).map(|cli| cli.command) {
            Ok(Command::Secure {
                runs,
                sets,
                requests,
                submit_runs,
                seconds,
                concurrency,
                cube,
            }) => Ok((
                runs,
                sets,
                requests,
                submit_runs,
                seconds,
                concurrency,
                cube,
            )),
            Ok(other) => panic!("{other:?}"),
            Err(err) => Err(err.kind()),
        };
        assert_eq!(
            parsed(&["cube-bench", "secure"]),
            Ok((20, 5, 500, 5, 5, 64, None))
        );
        assert_eq!(
            parsed(&[
                "cube-bench",
                "secure",
                "--runs",
                "4",
                "--sets",
                "2",
                "--requests",
                "10",
                "--submit-runs",
                "0",
                "--seconds",
                "1",
                "--concurrency",
                "8"
            ]),
            Ok((4, 2, 10, 0, 1, 8, None))
        );
        assert_eq!(
            parsed(&["cube-bench", "secure", "--sets", "three"]),
            Err(clap::error::ErrorKind::ValueValidation)
        );
    }

    #[test]
    fn queue_takes_its_runs_and_log_and_defaults_to_20_runs_logging_warnings() {
        let parsed = |args: &[&str]| match Cli::try_parse_from(args).map(|cli| cli.command) {
            Ok(Command::Queue {
                runs,
                log_level,
                keep_log,
                cube,
            }) => Ok((runs, log_level, keep_log, cube)),
            Ok(other) => panic!("{other:?}"),
            Err(err) => Err(err.kind()),
        };
        assert_eq!(
            parsed(&["cube-bench", "queue"]),
            Ok((20, "warn".to_string(), None, None))
        );
        assert_eq!(
            parsed(&[
                "cube-bench",
                "queue",
                "--runs",
                "3",
                "--log-level",
                "debug",
                "--keep-log",
                "/tmp/q.log"
            ]),
            Ok((
                3,
                "debug".to_string(),
                Some(PathBuf::from("/tmp/q.log")),
                None
            ))
        );
        assert_eq!(
            parsed(&["cube-bench", "queue", "--runs", "twenty"]),
            Err(clap::error::ErrorKind::ValueValidation)
        );
    }
}
