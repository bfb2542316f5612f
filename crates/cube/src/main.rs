//! `cube`: one binary for Cube's manager, its workers and its command line.
//!
//! This crate only wires things together: it parses flags, builds the parts from the library
//! crates, and turns SIGINT/SIGTERM into a shutdown. No logic of its own lives here.

mod cli;
mod dev;
mod manager;
mod sample_image;
mod shutdown;
mod store_cmd;
mod stores;
mod worker;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Cube: a small container orchestrator.
///
/// A manager accepts tasks and places them on workers; a worker runs them as Docker
/// containers. `cube dev` starts both in one process, the easiest way to begin.
#[derive(Debug, Parser)]
#[command(
    name = "cube",
    version,
    propagate_version = true,
    after_help = "Examples:\n  \
    cube dev                               # a manager and a worker in one process\n  \
    cube run -f examples/sample-task.json  # run a task\n  \
    cube status                            # list tasks, like docker ps\n  \
    cube node                              # list workers and what they hold\n  \
    cube stop 3f2a                         # stop a task by a unique ID prefix\n\n\
    Each command has its own --help."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Dev(dev::DevArgs),
    Manager(manager::ManagerArgs),
    Worker(worker::WorkerArgs),
    Run(cli::RunArgs),
    Stop(cli::StopArgs),
    Status(cli::StatusArgs),
    Node(cli::NodeArgs),
    SampleImage(sample_image::SampleImageArgs),
    Store(store_cmd::StoreCommandArgs),
}

/// Binds the API's listener; port 0 picks a free port, and the address says which.
async fn listen(
    host: &str,
    port: u16,
) -> anyhow::Result<(tokio::net::TcpListener, std::net::SocketAddr)> {
    use anyhow::Context;
    let listener = tokio::net::TcpListener::bind((host, port))
        .await
        .with_context(|| format!("listening on {host}:{port}"))?;
    let address = listener
        .local_addr()
        .context("reading the listening address")?;
    Ok((listener, address))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("cube: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Dev(args) => dev::run(args).await,
            Command::Manager(args) => manager::run(args).await,
            Command::Worker(args) => worker::run(args).await,
            Command::Run(args) => cli::run_task(args).await,
            Command::Stop(args) => cli::stop(args).await,
            Command::Status(args) => cli::status(args).await,
            Command::Node(args) => cli::node(args).await,
            Command::SampleImage(args) => sample_image::run(args).await,
            Command::Store(args) => store_cmd::run(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("cube: {err:#}");
            ExitCode::FAILURE
        }
    }
}
