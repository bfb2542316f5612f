//! Cube's worker: the agent on each machine that runs tasks as containers.
//!
//! [`Worker`] keeps the tasks (in a [`cube_store::Store`]) and carries out their desired state
//! through a [`cube_runtime::Runtime`]; [`api`] serves it over HTTP; [`stats`] reads the
//! machine's metrics. [`run`] wires the loops together and stops them on a shutdown signal.
//!
//! The worker never decides where a task runs and never restarts a task on its own: it runs
//! what it is given and reports what it sees. Containers keep running when the worker stops;
//! a worker started again on the same store re-adopts them.

pub mod api;
mod attach;
pub mod config;
mod first_check;
pub mod gate;
mod health;
mod heartbeat;
pub mod host_access;
pub mod metrics;
mod namespace;
pub mod plugin;
mod room;
pub mod stats;
pub mod tls;
mod worker;

use std::sync::Arc;
use std::time::Duration;

use cube_runtime::Runtime;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use heartbeat::Heartbeat;
pub use stats::StatsCollector;
pub use worker::{RESYNC_INTERVAL, Submitted, TaskChanges, Worker, WorkerConfig, WorkerError};

/// The line `cube worker` prints on stdout once it listens. Tools that start a worker on port
/// 0 (the tests, `cube-bench`) read the address back with
/// [`cube_api::address_in_listening_line`].
pub fn listening_line(name: &str, address: std::net::SocketAddr, store: &str) -> String {
    format!("cube worker {name} listening on http://{address} (store: {store})")
}

/// How long operations under way may take to finish once shutdown is asked for.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Serves `worker` on `listener` and runs its loops until `shutdown` is cancelled, then stops
/// them: the API stops accepting, operations under way get [`SHUTDOWN_GRACE`] to finish.
/// With a `heartbeat`, the worker registers with a manager and reports to it. The API holds
/// its clients to `limits`.
pub async fn run<R: Runtime>(
    worker: Arc<Worker<R>>,
    listener: TcpListener,
    heartbeat: Option<Heartbeat>,
    limits: cube_api::ServeLimits,
    tls: Option<Arc<tls::WorkerTls>>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let reconciles = tokio::spawn(worker.clone().run_reconciles(shutdown.clone()));
    let watcher = tokio::spawn(worker.clone().run_event_watcher(shutdown.clone()));
    let sampler = {
        let worker = worker.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move { worker.stats().run_cpu_sampler(shutdown).await })
    };
    let health_checks = tokio::spawn(worker.clone().run_health_checks(shutdown.clone()));
    // The engine's version goes with the first report.
    if worker.engine_version().await.is_none() {
        tracing::warn!("cannot read the container engine's version; asked again on GET /version");
    }
    // Followed logs and commands end when the worker stops, so that they do not hold the
    // server's graceful shutdown open.
    let closing = {
        let worker = worker.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            shutdown.cancelled().await;
            worker.closing().cancel();
        })
    };
    let gate = heartbeat
        .as_ref()
        .and_then(|heartbeat| heartbeat.gate.clone());
    let renewal = match (&tls, &heartbeat) {
        (Some(tls), Some(heartbeat)) => Some(tokio::spawn(
            tls.clone()
                .run_renewal(heartbeat.managers.clone(), shutdown.clone()),
        )),
        _ => None,
    };
    let heartbeats =
        heartbeat.map(|heartbeat| tokio::spawn(heartbeat.run(worker.clone(), shutdown.clone())));
    let served = cube_api::serve_tls(
        listener,
        api::router_with_gate(worker, gate),
        limits,
        tls.map(|tls| tls.server.clone()),
        shutdown.clone(),
    )
    .await;
    // The server also ends on an accept error; the loops must stop then too.
    shutdown.cancel();
    for (name, handle) in [
        ("reconciles", reconciles),
        ("event watcher", watcher),
        ("cpu sampler", sampler),
        ("health checks", health_checks),
        ("closing", closing),
    ] {
        if let Err(err) = handle.await {
            tracing::error!(loop_name = name, error = %err, "worker loop ended abnormally");
        }
    }
    if let Some(handle) = heartbeats
        && let Err(err) = handle.await
    {
        tracing::error!(error = %err, "heartbeat loop ended abnormally");
    }
    if let Some(handle) = renewal
        && let Err(err) = handle.await
    {
        tracing::error!(error = %err, "certificate renewal loop ended abnormally");
    }
    served
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listening_line_gives_its_address_back() {
        let line = listening_line("w1", "127.0.0.1:43121".parse().unwrap(), "memory");
        assert_eq!(
            cube_api::address_in_listening_line(&line),
            Some("http://127.0.0.1:43121")
        );
        assert_eq!(
            cube_api::address_in_listening_line("cube: cannot listen"),
            None
        );
    }
}
