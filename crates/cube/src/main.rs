//! `cube`: one binary for Cube's manager, its workers and its command line.
//!
//! This crate only wires things together: it parses flags, builds the parts from the library
//! crates, and turns SIGINT/SIGTERM into a shutdown. No logic of its own lives here.

mod acting;
mod cli;
mod dev;
mod gather;
mod leading;
mod limits;
mod manager;
mod ring;
mod sample_image;
mod shutdown;
mod store_cmd;
mod store_move;
mod stores;
mod worker;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

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
    cube run -p 7777 cube-sample:latest    # run an image, like docker run -d\n  \
    cube run -f examples/sample-task.yaml  # run a task file (JSON or YAML)\n  \
    cube status                            # list tasks, like docker ps\n  \
    cube node                              # list workers and what they hold\n  \
    cube queue                             # the waiting list: who waits, who runs where\n  \
    cube events                            # follow every change as it happens\n  \
    cube stop 3f2a                         # stop a task by a unique ID prefix\n  \
    cube logs -f web                       # a task's output, followed\n  \
    cube exec web -- ls /www               # a command in a task's container\n  \
    cube node drain w1                     # move a node's job copies away\n  \
    cube prune                             # remove the tasks that ended\n  \
    cube job run examples/job-web.yaml     # run a job: 3 copies kept running\n  \
    source <(cube completion bash)         # complete commands and flags in bash\n\n\
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
    Restart(cli::RestartArgs),
    Logs(cli::LogsArgs),
    Exec(cli::ExecArgs),
    Rm(cli::RmArgs),
    Prune(cli::PruneArgs),
    Version(cli::VersionArgs),
    Job(cli::JobArgs),
    Status(cli::StatusArgs),
    Events(cli::EventsArgs),
    Node(cli::NodeArgs),
    Queue(cli::QueueArgs),
    Service(cli::ServiceArgs),
    Completion(cli::CompletionArgs),
    Config(cli::ConfigArgs),
    Acl(cli::AclArgs),
    Token(cli::TokenArgs),
    Project(cli::ProjectArgs),
    Secret(cli::SecretArgs),
    Registry(cli::RegistryArgs),
    Volume(cli::VolumeArgs),
    Router(cli::RouterArgs),
    SampleImage(sample_image::SampleImageArgs),
    Store(store_cmd::StoreCommandArgs),
}

/// Binds the API's listener; port 0 picks a free port, and the address says which.
async fn listen(
    host: &str,
    port: u16,
    authenticated: bool,
) -> anyhow::Result<(tokio::net::TcpListener, std::net::SocketAddr)> {
    use anyhow::Context;
    let listener = tokio::net::TcpListener::bind((host, port))
        .await
        .with_context(|| format!("listening on {host}:{port}"))?;
    let address = listener
        .local_addr()
        .context("reading the listening address")?;
    if address.ip().is_unspecified() && !authenticated {
        // Without --acl (a manager) or --join/--token (a worker), whoever reaches the port
        // can run containers on this machine. Said once, at start, where the operator looks.
        tracing::warn!(
            %address,
            "listening on every interface without authentication: anyone who can reach this \
             port can drive the cluster (run and stop containers); start the manager with \
             --acl and join workers with --join HOST:PORT --token TOKEN (see the README's \
             \"Running Cube securely\"), or bind to 127.0.0.1 (-H)"
        );
    }
    Ok((listener, address))
}

/// The command line, with a usage line that does not depend on what was typed. After a
/// mistake clap prints a usage built from the flags the user gave, so `cube stop -m X ID
/// --bad` showed `Usage: cube stop --manager <HOST:PORT> <ID>`, as if `--manager` were
/// required. Each command's usage is fixed here to the plain one (`[OPTIONS]`), unless the
/// command wrote its own.
fn command_line() -> clap::Command {
    let mut command = Cli::command();
    command.build();
    let names: Vec<String> = command
        .get_subcommands()
        .filter(|sub| sub.get_overridden_usage().is_none())
        .map(|sub| sub.get_name().to_string())
        .collect();
    for name in names {
        command = command.mut_subcommand(&name, |mut sub| {
            let usage = sub.render_usage().to_string();
            let usage = usage.trim().trim_start_matches("Usage:").trim().to_string();
            sub.override_usage(usage)
        });
    }
    command
}

/// A closed stdout (`cube status | head -1`) is a normal end for a command's output, as it is
/// for `docker ps`: the command exits 0, quietly.
///
/// Rust ignores SIGPIPE, so a write to a closed pipe fails with `BrokenPipe` and `println!`
/// panics on it. Restoring SIGPIPE's default would end the process on the write instead, but
/// also on a write to a socket the manager closed (hyper's vectored writes do not ask the
/// kernel to spare the process), which would turn a refused request into a silent death. So
/// the failure is caught where it surfaces: the panic of a print to stdout or stderr here,
/// and a `BrokenPipe` error returned by a command in [`main`].
fn end_quietly_on_closed_output() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        // std's words for a failed print: "failed printing to stdout: Broken pipe (os error
        // 32)". Nothing is left to tell a reader who has gone.
        if message.starts_with("failed printing to std") && message.contains("Broken pipe") {
            std::process::exit(0);
        }
        default_hook(info);
    }));
}

/// Whether the error is a write to a closed pipe, somewhere in its chain.
fn is_closed_output(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn main() -> ExitCode {
    end_quietly_on_closed_output();
    // Every HTTP client of the process, plain or TLS, uses this crypto (reqwest has none of
    // its own here).
    let _ = cube_api::tls::provider();
    let arguments = cli::manager_flags_after_command(&Cli::command(), std::env::args_os());
    let cli = Cli::from_arg_matches(&command_line().get_matches_from(arguments))
        .unwrap_or_else(|err| err.format(&mut Cli::command()).exit());
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
            Command::Restart(args) => cli::restart(args).await,
            Command::Logs(args) => cli::logs(args).await,
            Command::Exec(args) => match cli::exec(args).await {
                Ok(0) => Ok(()),
                // The command's own exit code; its output was flushed by `cli::exec`.
                Ok(code) => std::process::exit(code),
                Err(err) => Err(err),
            },
            Command::Rm(args) => cli::rm(args).await,
            Command::Prune(args) => cli::prune(args).await,
            Command::Version(args) => cli::version(args).await,
            Command::Job(args) => cli::job(args).await,
            Command::Status(args) => cli::status(args).await,
            Command::Events(args) => cli::events(args).await,
            Command::Node(args) => cli::node(args).await,
            Command::Queue(args) => cli::queue(args).await,
            Command::Service(args) => cli::service(args).await,
            Command::Completion(args) => cli::completion(args, command_line()),
            Command::Config(args) => cli::config(args).await,
            Command::Acl(args) => cli::acl(args).await,
            Command::Token(args) => cli::token(args).await,
            Command::Project(args) => cli::project(args).await,
            Command::Secret(args) => cli::secret(args).await,
            Command::Registry(args) => cli::registry(args).await,
            Command::Volume(args) => cli::volume(args).await,
            Command::Router(args) => cli::router(args).await,
            Command::SampleImage(args) => sample_image::run(args).await,
            Command::Store(args) => store_cmd::run(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if is_closed_output(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("cube: {err:#}");
            ExitCode::FAILURE
        }
    }
}
