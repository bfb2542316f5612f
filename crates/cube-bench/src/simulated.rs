//! `cube-bench sim-workers`: many real workers in one process, on a container runtime that
//! lives in memory, so that a manager can be measured holding many running tasks without
//! Docker running as many containers.
//!
//! Each worker is the real [`cube_worker::Worker`] (memory store) served by
//! [`cube_worker::run`] on its own `127.0.0.1:0` listener, and registers with the manager
//! through [`cube_worker::Heartbeat`] exactly as `cube worker --manager` does. Only the
//! container runtime is simulated: [`SimulatedRuntime`] keeps containers in a map; a started
//! one runs until it is stopped, and it never exits on its own. The benchmarks start this as a
//! child process of their own, so that the manager's memory is the manager's alone.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use chrono::Utc;
use cube_api::ApiClient;
use cube_runtime::{
    ContainerInfo, ContainerSpec, LABEL_NODE, LABEL_TASK_ID, Runtime, RuntimeError, RuntimeEvent,
};
use cube_store::MemoryStore;
use cube_types::Resources;
use cube_worker::{Heartbeat, StatsCollector, Worker, WorkerConfig};
use futures_util::stream::BoxStream;
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// What each simulated worker offers: enough for 100,000 small tasks spread over a few
/// workers (16 MiB each: 65,536 per TiB).
const SIM_CAPACITY: Resources = Resources {
    cpu: 64.0,
    memory: 1 << 40,
    disk: 10 << 40,
};

/// The line `sim-workers` prints on stdout once every worker listens.
pub(crate) const READY_LINE: &str = "cube-bench sim-workers: listening";

/// A container runtime in memory: what a worker asks of Docker, answered from a map.
#[derive(Default)]
pub(crate) struct SimulatedRuntime {
    /// Containers by ID, and their IDs by name (a second create under a name is a conflict,
    /// as in Docker). A `std` mutex: every operation is a map access, never held across an
    /// await.
    containers: Mutex<Containers>,
}

#[derive(Default)]
struct Containers {
    by_id: HashMap<String, ContainerInfo>,
    id_by_name: HashMap<String, String>,
}

impl SimulatedRuntime {
    fn containers(&self) -> std::sync::MutexGuard<'_, Containers> {
        self.containers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Containers {
    /// The container by ID or by name, as Docker looks it up.
    fn find(&mut self, id_or_name: &str) -> Option<&mut ContainerInfo> {
        let id = match self.id_by_name.get(id_or_name) {
            Some(id) => id.clone(),
            None => id_or_name.to_string(),
        };
        self.by_id.get_mut(&id)
    }
}

impl Runtime for SimulatedRuntime {
    async fn ensure_image(&self, _image: &str) -> Result<(), RuntimeError> {
        Ok(())
    }

    async fn create(&self, spec: &ContainerSpec) -> Result<String, RuntimeError> {
        let mut containers = self.containers();
        if containers.id_by_name.contains_key(&spec.name) {
            return Err(RuntimeError::Conflict(spec.name.clone()));
        }
        let id = uuid::Uuid::new_v4().simple().to_string();
        let info = ContainerInfo {
            id: id.clone(),
            name: spec.name.clone(),
            pod_container: None,
            health: None,
            task_id: spec
                .labels
                .get(LABEL_TASK_ID)
                .and_then(|id| id.parse().ok()),
            node: spec.labels.get(LABEL_NODE).cloned(),
            running: false,
            pid: None,
            exit_code: None,
            oom_killed: false,
            error: String::new(),
            started_at: None,
            finished_at: None,
            host_ports: Default::default(),
        };
        containers.id_by_name.insert(spec.name.clone(), id.clone());
        containers.by_id.insert(id.clone(), info);
        Ok(id)
    }

    async fn start(&self, container_id: &str) -> Result<(), RuntimeError> {
        let mut containers = self.containers();
        let info = containers
            .find(container_id)
            .ok_or_else(|| RuntimeError::NotFound(container_id.to_string()))?;
        if !info.running {
            info.running = true;
            info.exit_code = None;
            info.started_at = Some(Utc::now());
            info.finished_at = None;
        }
        Ok(())
    }

    async fn stop(&self, container_id: &str, _timeout: Duration) -> Result<(), RuntimeError> {
        let mut containers = self.containers();
        let info = containers
            .find(container_id)
            .ok_or_else(|| RuntimeError::NotFound(container_id.to_string()))?;
        if info.running {
            info.running = false;
            info.exit_code = Some(0);
            info.finished_at = Some(Utc::now());
        }
        Ok(())
    }

    async fn remove(&self, container_id: &str) -> Result<(), RuntimeError> {
        let mut containers = self.containers();
        let Some(id) = containers.find(container_id).map(|info| info.id.clone()) else {
            return Ok(()); // removing a removed container succeeds
        };
        containers.by_id.remove(&id);
        containers.id_by_name.retain(|_, named| *named != id);
        Ok(())
    }

    async fn inspect(&self, container_id: &str) -> Result<Option<ContainerInfo>, RuntimeError> {
        Ok(self
            .containers()
            .find(container_id)
            .map(|info| info.clone()))
    }

    async fn list_managed(&self, node: &str) -> Result<Vec<ContainerInfo>, RuntimeError> {
        Ok(self
            .containers()
            .by_id
            .values()
            .filter(|info| info.node.as_deref() == Some(node))
            .cloned()
            .collect())
    }

    /// Simulated containers never die on their own, so there is never an event: the stream
    /// stays pending (without polling anything) until the worker drops it.
    fn events_since(
        &self,
        _node: &str,
        _since_unix_secs: i64,
    ) -> BoxStream<'static, Result<RuntimeEvent, RuntimeError>> {
        Box::pin(futures_util::stream::pending())
    }
}

/// Runs `count` simulated workers registered with `manager` until SIGINT or SIGTERM.
pub(crate) async fn sim_workers(
    manager: &str,
    count: usize,
    name_prefix: &str,
    heartbeat_interval: Duration,
) -> anyhow::Result<()> {
    anyhow::ensure!(count > 0, "--count must be at least 1");
    let shutdown = CancellationToken::new();
    let mut interrupt = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let mut terminate = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
            shutdown.cancel();
        });
    }
    // The worker's stats read the disk of a data directory; no store file is kept there.
    let data_dir = tempfile::tempdir().context("creating a scratch directory")?;
    let mut workers = JoinSet::new();
    for number in 0..count {
        let name = format!("{name_prefix}-{number}");
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding a simulated worker's listener")?;
        let address = listener.local_addr()?;
        let config = WorkerConfig {
            name: name.clone(),
            address: format!("http://{address}"),
            capacity: SIM_CAPACITY,
            stop_timeout: Duration::from_secs(10),
            max_concurrent_operations: 8,
            labels: Default::default(),
            pods: Default::default(),
        };
        let (worker, commands) = Worker::new(
            config,
            std::sync::Arc::new(MemoryStore::new()),
            SimulatedRuntime::default(),
            StatsCollector::new(data_dir.path()),
        );
        let heartbeat = Heartbeat {
            // Several managers sharing etcd: a comma-separated list, as `cube worker` takes.
            managers: manager
                .split(',')
                .map(|address| ApiClient::new(address.trim(), Duration::from_secs(5)))
                .collect::<Result<Vec<_>, _>>()
                .context("--manager")?,
            interval: heartbeat_interval,
            gate: None,
        };
        let shutdown = shutdown.clone();
        workers.spawn(async move {
            let served = cube_worker::run(
                worker,
                commands,
                listener,
                Some(heartbeat),
                cube_api::ServeLimits::default(),
                None,
                shutdown,
            )
            .await;
            (name, served)
        });
    }
    println!("{READY_LINE}: {count} workers registering with {manager}");
    while let Some(ended) = workers.join_next().await {
        match ended {
            Ok((_, Ok(()))) => {}
            Ok((name, Err(err))) => eprintln!("simulated worker {name} stopped: {err}"),
            Err(err) => eprintln!("a simulated worker panicked: {err}"),
        }
        // One worker ending (an accept error) ends them all: the figures would be off.
        shutdown.cancel();
    }
    Ok(())
}
