//! Cube's manager: the control plane. It accepts tasks, places them on workers with the
//! scheduler, sends them there, follows their state as the workers see it, and stops them
//! where they run.
//!
//! [`Manager`] holds the state (tasks, nodes and jobs in [`cube_store`] stores, mirrored in
//! memory) and runs its control loops on the controller framework ([`cube_controller`]): the
//! task controller (a pure [`reconcile`] decision per task, and the calls to workers that
//! carry it out), the placement pass, the job controller, node liveness and the followers of
//! the workers. [`api`] serves it over HTTP.
//!
//! The manager never talks to Docker and never decides placement itself: it asks
//! [`cube_scheduler`], which does no IO.

pub mod acl;
pub mod addressing;
pub mod api;
#[doc(hidden)]
pub mod bench_support;
mod cache;
mod cluster;
mod copies;
mod drain;
mod event_stream;
pub mod events;
mod followers;
pub mod gc;
mod job_api;
mod job_controller;
mod job_records;
pub mod jobs;
pub mod layout;
mod liveness;
mod log_limit;
mod manager;
mod metrics;
mod nodes;
mod observation;
pub mod paging;
mod placement;
pub mod projects;
mod queue;
mod queue_api;
pub mod queue_controller;
pub mod reconcile;
mod registry_check;
mod relay;
mod rollout;
mod routes;
mod sealing;
mod secret_api;
pub mod secrets;
pub mod shard_claims;
pub mod shared_placement;
mod task_controller;
pub mod tls;
mod ui;
pub mod volumes;

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use cluster::{EPOCH_KEY, ManagerStores};
pub use job_api::{JobView, PlanView};
pub use job_records::JobSubmitted;
pub use manager::{Manager, ManagerConfig, ManagerError, Submitted};
pub use nodes::NodeSource;

/// The line `cube manager` prints on stdout once it listens; tools that start a manager on
/// port 0 read the address back from it (see `cube_api::address_in_listening_line`).
pub fn listening_line(address: std::net::SocketAddr, scheduler: &str, store: &str) -> String {
    format!("cube manager listening on http://{address} (scheduler: {scheduler}, store: {store})")
}

/// How long the loops get to stop once shutdown is asked for.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Runs `manager`'s loops (controllers, liveness, the followers of the workers) until
/// `shutdown` is cancelled, then waits for them (at most [`SHUTDOWN_GRACE`]). For a manager
/// whose API is served by someone else: the leader of several managers on etcd.
pub async fn run_loops(manager: Arc<Manager>, shutdown: CancellationToken) {
    let mut loops = manager.start();
    shutdown.cancelled().await;
    join_loops(&mut loops).await;
}

async fn join_loops(loops: &mut tokio::task::JoinSet<()>) {
    if tokio::time::timeout(SHUTDOWN_GRACE, async {
        while let Some(result) = loops.join_next().await {
            if let Err(err) = result {
                tracing::error!(error = %err, "manager loop ended abnormally");
            }
        }
    })
    .await
    .is_err()
    {
        tracing::warn!("manager loops still running after the grace period; abandoning them");
    }
}

/// Serves `manager` on `listener` under `limits` and runs its loops until `shutdown` is
/// cancelled.
pub async fn run(
    manager: Arc<Manager>,
    listener: TcpListener,
    limits: cube_api::ServeLimits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let mut loops = manager.start();
    let tls = match &manager.config.tls {
        None => None,
        Some(tls) => {
            let config = tls.server_config().map_err(std::io::Error::other)?;
            loops.spawn(tls.clone().run_renewal(shutdown.clone()));
            Some(config)
        }
    };
    let serving = cube_api::serve_tls(
        listener,
        api::router(manager),
        limits,
        tls,
        shutdown.clone(),
    );
    // Long-lived answers (`GET /events`, blocking queries) end themselves at shutdown; one
    // whose client stopped reading cannot even be told, so the connections get the grace
    // period and no more.
    let grace_over = async {
        shutdown.cancelled().await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    let served = tokio::select! {
        served = serving => served,
        () = grace_over => {
            tracing::warn!("connections still open after the grace period; closing them");
            Ok(())
        }
    };
    shutdown.cancel();
    join_loops(&mut loops).await;
    served
}
