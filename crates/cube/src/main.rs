//! `cube`: one binary for Cube's worker and (soon) its manager and command line.
//!
//! This crate only wires things together: it parses flags, builds the parts from the library
//! crates, and turns SIGINT/SIGTERM into a shutdown. No logic of its own lives here.

mod sample_image;
mod shutdown;
mod worker;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Cube: a small container orchestrator. `cube worker` runs tasks as Docker containers on
/// this machine.
#[derive(Debug, Parser)]
#[command(
    name = "cube",
    version,
    propagate_version = true,
    after_help = "Examples:\n  cube sample-image                 # build the local sample image\n  cube worker -n w1 -p 5556         # run a worker on this machine\n\nEach command has its own --help."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Worker(worker::WorkerArgs),
    SampleImage(sample_image::SampleImageArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
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
            Command::Worker(args) => worker::run(args).await,
            Command::SampleImage(args) => sample_image::run(args).await,
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
