//! `cube worker`: runs tasks as Docker containers on this machine.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use cube_runtime::DockerRuntime;
use cube_store::{MemoryStore, PersistentDb, PersistentStore, Store};
use cube_types::Task;
use cube_types::duration::parse_duration;
use cube_worker::{StatsCollector, Worker, WorkerConfig};
use tokio::net::TcpListener;

/// Where a worker keeps its tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DbType {
    /// In memory: forgotten when the worker stops; a worker started again removes the
    /// containers it no longer knows.
    Memory,
    /// In a redb file under --data-dir: survives a crash.
    Persistent,
}

/// Run a worker: the agent that runs tasks as Docker containers on this machine.
///
/// The worker serves its API (POST/GET /tasks, GET/DELETE /tasks/{id}, GET /stats) on
/// HOST:PORT. Containers keep running when the worker stops; a worker started again with the
/// persistent store re-adopts them. SIGINT or SIGTERM stop it cleanly.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  cube worker -n w1 -p 5556 -d persistent --data-dir /var/lib/cube\n  \
    curl -s -X POST localhost:5556/tasks -d '{\"Name\": \"web\", \"Image\": \"cube-sample:latest\"}'\n  \
    curl -s localhost:5556/tasks"
)]
pub struct WorkerArgs {
    /// Address to listen on.
    #[arg(short = 'H', long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 picks a free one; the address is printed).
    #[arg(short, long, default_value_t = 5556)]
    port: u16,
    /// The node's name, in container labels and task records [default: the host name].
    #[arg(short, long)]
    name: Option<String>,
    /// Task store.
    #[arg(short, long, value_enum, default_value_t = DbType::Persistent)]
    dbtype: DbType,
    /// Directory for the store file; its filesystem is the one /stats reports on.
    #[arg(long, default_value = "cube-data", env = "CUBE_DATA_DIR")]
    data_dir: PathBuf,
    /// How long a stopped container may take to exit before it is killed (e.g. 10s, 500ms).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    stop_timeout: Duration,
    /// How many tasks may be started or stopped at the same time.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    parallelism: u16,
}

pub async fn run(args: WorkerArgs) -> anyhow::Result<()> {
    // 1. Check the configuration.
    let name = match args.name {
        Some(name) if name.trim().is_empty() => anyhow::bail!("--name must not be empty"),
        Some(name) => name,
        None => host_name()?,
    };
    let shutdown = crate::shutdown::on_signal().context("installing signal handlers")?;

    // 2. Build: data directory, store, Docker, listener.
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating the data directory {}", args.data_dir.display()))?;
    let (tasks, store_description): (Arc<dyn Store<Task>>, String) = match args.dbtype {
        DbType::Memory => (Arc::new(MemoryStore::new()), "memory".to_string()),
        DbType::Persistent => {
            let path = args.data_dir.join(format!("worker-{name}.redb"));
            let db = PersistentDb::open(&path)?;
            (
                Arc::new(PersistentStore::new(db, "tasks")?),
                format!("persistent, {}", path.display()),
            )
        }
    };
    let runtime = DockerRuntime::connect().await?;
    let listener = TcpListener::bind((args.host.as_str(), args.port))
        .await
        .with_context(|| format!("listening on {}:{}", args.host, args.port))?;
    let address = listener
        .local_addr()
        .context("reading the listening address")?;
    let config = WorkerConfig {
        name: name.clone(),
        stop_timeout: args.stop_timeout,
        max_concurrent_operations: usize::from(args.parallelism),
    };
    let (worker, commands) =
        Worker::new(config, tasks, runtime, StatsCollector::new(&args.data_dir));

    // 3. Run until a signal.
    println!(
        "{}",
        cube_worker::listening_line(&name, address, &store_description)
    );
    cube_worker::run(worker, commands, listener, shutdown)
        .await
        .context("serving the worker API")?;
    tracing::info!("worker stopped");
    Ok(())
}

fn host_name() -> anyhow::Result<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .context("reading the host name (pass --name to choose one)")?;
    let name = name.trim();
    anyhow::ensure!(!name.is_empty(), "the host name is empty; pass --name");
    Ok(name.to_string())
}
