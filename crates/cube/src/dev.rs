//! `cube dev`: a manager and a worker in one process, the embedded default to start with.

use std::io::Write;

use anyhow::Context;
use clap::Args;
use cube_runtime::DockerRuntime;
use cube_runtime::sample_image::SAMPLE_IMAGE;

use crate::manager::{self, ManagerArgs};
use crate::stores::StoreArgs;
use crate::worker::{self, LabelArgs, WorkerArgs};

/// Run a local cluster in one process: a manager and one worker, with the persistent store
/// under --data-dir, and the sample image built if it is missing.
///
/// The worker registers with the manager over loopback like any other worker, so everything
/// `cube run`, `cube status`, `cube stop` and `cube node` do works as on a real cluster.
/// --label KEY=VALUE labels the worker as `cube worker --label` does.
/// More workers can join with `cube worker --manager 127.0.0.1:5555`. SIGINT or SIGTERM stop
/// both; the containers keep running and are re-adopted on the next start.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube dev                                 # manager on :5555, worker on :5556\n  \
    cube run -f examples/sample-task.json    # in another terminal\n  \
    cube status")]
pub struct DevArgs {
    /// The address the manager listens on (the worker listens on loopback). Beyond loopback,
    /// authentication is on (--acl): make a token with `cube acl bootstrap`.
    #[arg(short = 'H', long, default_value = "127.0.0.1")]
    host: String,
    /// Turn authentication on (as `cube manager --acl`) even on loopback; the worker joins
    /// with a node token the manager makes for it.
    #[arg(long)]
    acl: bool,
    /// Mutual TLS (as `cube manager --acl --tls`; turns --acl on): the manager serves HTTPS
    /// with a cluster CA kept in --data-dir under tls/, and the worker joins with a node
    /// token that carries the CA's fingerprint, so it gets its certificate as any other.
    /// The CLI then needs --ca-fingerprint (printed at start).
    #[arg(long)]
    tls: bool,
    /// The manager's port (the worker's is --worker-port).
    #[arg(short, long, default_value_t = 5555)]
    port: u16,
    /// The worker's port.
    #[arg(long, default_value_t = 5556)]
    worker_port: u16,
    /// The worker's name.
    #[arg(short, long, default_value = "local")]
    name: String,
    /// Scheduler: epvm (E-PVM, least marginal cost over every node), epvm-sampled (E-PVM over
    /// a bounded random sample of the nodes that fit, for thousands of nodes) or roundrobin.
    #[arg(short, long, default_value = "epvm", value_parser = cube_scheduler::SCHEDULER_NAMES)]
    scheduler: String,
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    labels: LabelArgs,
    /// The same limits for the manager's API and the worker's.
    #[command(flatten)]
    limits: crate::limits::LimitArgs,
}

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    let shutdown = crate::shutdown::on_signal().context("installing signal handlers")?;
    let acl = args.acl || args.tls || !is_loopback(&args.host);
    let manager = manager::prepare(
        ManagerArgs::for_dev(
            args.host.clone(),
            args.port,
            args.scheduler,
            args.store.clone(),
            args.limits.clone(),
            acl,
            args.tls,
        ),
        shutdown.clone(),
    )
    .await?;
    // The worker reaches the manager over loopback whatever address the manager listens on.
    let manager_address = if manager.address.ip().is_unspecified() {
        format!("127.0.0.1:{}", manager.address.port())
    } else {
        manager.address.to_string()
    };
    // With ACL on, the worker joins as any other would: with a node token, made here.
    let join_token = match &manager.acl {
        Some(acl) => Some(
            acl.create(
                cube_types::token::Role::Node,
                Some(format!("dev-{}", args.name)),
                None,
                Vec::new(),
                chrono::Utc::now(),
            )
            .await
            .context("making the worker's join token")?
            .secret,
        ),
        None => None,
    };
    // With TLS, a join token carries the CA's fingerprint, as the API's node tokens do: the
    // worker then joins over HTTPS and gets its certificate.
    let join_token = match (join_token, &manager.ca_fingerprint) {
        (Some(token), Some(fingerprint)) => Some(format!("{token}.{fingerprint}")),
        (token, _) => token,
    };
    // The manager serves before the worker is prepared: a worker joining with TLS asks it for
    // its certificate while it prepares.
    let manager_line = manager.listening_line.clone();
    let ca_fingerprint = manager.ca_fingerprint.clone();
    let managed = tokio::spawn(manager.run(shutdown.clone()));
    let prepared = worker::prepare(WorkerArgs::for_dev(
        args.name,
        args.worker_port,
        manager_address.clone(),
        join_token,
        args.store,
        args.labels,
        args.limits,
    ))
    .await;
    let worker = match prepared {
        Ok(worker) => worker,
        Err(err) => {
            shutdown.cancel();
            if let Ok(Err(managed)) = managed.await {
                tracing::warn!(error = %format!("{managed:#}"), "the manager stopped with an error");
            }
            return Err(err);
        }
    };
    // A new user's first task uses the sample image; build it now rather than fail later.
    match DockerRuntime::connect().await {
        Ok(docker) => {
            if let Err(err) = docker.ensure_sample_image(SAMPLE_IMAGE).await {
                tracing::warn!(error = %err, "cannot build the sample image; `cube sample-image` says why");
            }
        }
        Err(err) => tracing::warn!(error = %err, "cannot reach Docker"),
    }
    // One write: a reader that keeps only the first line (the manager's address) may close
    // the pipe, and a later print to it would fail.
    let first_step = match (&ca_fingerprint, acl) {
        (Some(fingerprint), _) => format!(
            "ACL and TLS on: CUBE_CA_FINGERPRINT={fingerprint}, make the first token with `cube \
             acl bootstrap -m https://{manager_address}`, then CUBE_TOKEN=<it>. "
        ),
        (None, true) => {
            "ACL on: make the first token with `cube acl bootstrap`, then CUBE_TOKEN=<it>. "
                .to_string()
        }
        (None, false) => String::new(),
    };
    let scheme = if ca_fingerprint.is_some() {
        "https://"
    } else {
        ""
    };
    let page = if scheme.is_empty() { "http://" } else { scheme };
    let banner = format!(
        "{}\n{}\ncube dev: ready. {first_step}Try: cube run -f examples/sample-task.json && cube \
         status (CUBE_MANAGER={scheme}{manager_address})\ncube dev: the web UI is at \
         {page}{manager_address}/ui",
        manager_line, worker.listening_line
    );
    if let Err(err) = writeln!(std::io::stdout(), "{banner}") {
        tracing::debug!(error = %err, "cannot print the banner");
    }
    // Either half ending stops the other.
    let watched = shutdown.clone();
    let managed = async move {
        let result = managed.await;
        watched.cancel();
        result
    };
    let (managed, worked) = tokio::join!(managed, async {
        let result = worker.run(shutdown.clone()).await;
        shutdown.cancel();
        result
    });
    managed.context("the manager's task ended abnormally")??;
    worked?;
    tracing::info!("cube dev stopped");
    Ok(())
}

/// Whether `host` is a loopback address (or `localhost`): listening there, only this machine
/// reaches the API.
fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}
