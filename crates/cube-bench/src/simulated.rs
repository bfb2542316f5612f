//! `cube-bench sim-workers`: many real workers in one process, on a container runtime that
//! lives in memory, so that a manager can be measured holding many running tasks without
//! Docker running as many containers.
//!
//! Each worker is the real [`cube_worker::Worker`] (memory store) served by
//! [`cube_worker::run`] on its own `127.0.0.1:0` listener, and registers with the manager
//! through [`cube_worker::Heartbeat`] exactly as `cube worker --manager` does. Only the
//! container runtime is simulated: [`SimulatedRuntime`] keeps containers in a map; a started
//! one runs until it is stopped, and it never exits on its own. It keeps the same
//! [`Runtime`] contract as the Docker runtime (`cube_runtime::contract`, checked by both
//! runtimes' tests): a stop or a removal is told on the events stream, as Docker tells it,
//! and an image is had once [`Runtime::ensure_image`] asked for it. The benchmarks start
//! this as a child process of their own, so that the manager's memory is the manager's alone.

use std::collections::{HashMap, HashSet, VecDeque};
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
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::broadcast;
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

/// How many past events a simulated runtime keeps to replay to a stream that asks for them
/// (`events_since`), as Docker replays from a time. Bounded: a long benchmark stops and
/// removes containers without end, and a worker asks only for the last few seconds.
const EVENT_LOG: usize = 4096;
/// Events not yet read by a stream before it is ended (and its worker reconnects and
/// resynchronises, as after Docker's stream ends). The channel holds this many slots from the
/// start, in every simulated worker: at 1,024 they were a tenth of the simulated workers'
/// memory (100 KB each), which Docker, not a real worker, would hold.
const EVENT_BACKLOG: usize = 256;

/// A container runtime in memory: what a worker asks of Docker, answered from a map.
pub(crate) struct SimulatedRuntime {
    /// Containers, images and the recent events. A `std` mutex: every operation is a map
    /// access, never held across an await.
    containers: Mutex<Containers>,
    /// Each event as it happens, with the node of its container, to every open stream.
    /// Sent with `containers` locked, so that a stream's replay and what it is sent next
    /// neither miss nor repeat an event.
    events: broadcast::Sender<(String, RuntimeEvent)>,
}

impl Default for SimulatedRuntime {
    fn default() -> Self {
        SimulatedRuntime {
            containers: Mutex::default(),
            events: broadcast::channel(EVENT_BACKLOG).0,
        }
    }
}

#[derive(Default)]
struct Containers {
    /// Containers by ID, and their IDs by name (a second create under a name is a
    /// conflict, as in Docker).
    by_id: HashMap<String, ContainerInfo>,
    id_by_name: HashMap<String, String>,
    /// Images asked for with `ensure_image`: a create of any other is refused, as Docker
    /// refuses an image it does not have.
    images: HashSet<String>,
    /// The last [`EVENT_LOG`] events, with their time (Unix seconds) and node.
    log: VecDeque<(i64, String, RuntimeEvent)>,
}

impl SimulatedRuntime {
    fn containers(&self) -> std::sync::MutexGuard<'_, Containers> {
        self.containers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Tells `event` about `info`'s container: logged for replay and sent to open streams.
    fn tell(&self, containers: &mut Containers, info: &ContainerInfo, event: RuntimeEvent) {
        let node = info.node.clone().unwrap_or_default();
        if containers.log.len() == EVENT_LOG {
            containers.log.pop_front();
        }
        containers
            .log
            .push_back((Utc::now().timestamp(), node.clone(), event.clone()));
        // No open stream is no error: the event is in the log.
        let _ = self.events.send((node, event));
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
    async fn ensure_image(&self, image: &str) -> Result<(), RuntimeError> {
        self.containers().images.insert(image.to_string());
        Ok(())
    }

    async fn create(&self, spec: &ContainerSpec) -> Result<String, RuntimeError> {
        let mut containers = self.containers();
        if !containers.images.contains(&spec.image) {
            return Err(RuntimeError::Image {
                image: spec.image.clone(),
                message: "no such image locally".to_string(),
            });
        }
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
        // Stopping a removed container succeeds, as it does on Docker.
        let Some(info) = containers.find(container_id) else {
            return Ok(());
        };
        if !info.running {
            return Ok(());
        }
        info.running = false;
        info.exit_code = Some(0);
        info.finished_at = Some(Utc::now());
        let info = info.clone();
        let died = RuntimeEvent::Died {
            container_id: info.id.clone(),
            task_id: info.task_id,
        };
        self.tell(&mut containers, &info, died);
        Ok(())
    }

    async fn remove(&self, container_id: &str) -> Result<(), RuntimeError> {
        let mut containers = self.containers();
        let Some(id) = containers.find(container_id).map(|info| info.id.clone()) else {
            return Ok(()); // removing a removed container succeeds
        };
        let Some(info) = containers.by_id.remove(&id) else {
            return Ok(());
        };
        containers.id_by_name.retain(|_, named| *named != id);
        // A running container is killed first, and dies, as on Docker.
        if info.running {
            let died = RuntimeEvent::Died {
                container_id: id.clone(),
                task_id: info.task_id,
            };
            self.tell(&mut containers, &info, died);
        }
        let destroyed = RuntimeEvent::Destroyed {
            container_id: id,
            task_id: info.task_id,
        };
        self.tell(&mut containers, &info, destroyed);
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

    /// Simulated containers never die on their own: the events are the stops and removals
    /// the worker asked for, replayed from `since_unix_secs` (as far as the log goes back),
    /// then as they happen. A stream that falls [`EVENT_BACKLOG`] behind ends, as Docker's
    /// does when its connection ends, and the worker reconnects and resynchronises.
    fn events_since(
        &self,
        node: &str,
        since_unix_secs: i64,
    ) -> BoxStream<'static, Result<RuntimeEvent, RuntimeError>> {
        let containers = self.containers();
        let replay: Vec<Result<RuntimeEvent, RuntimeError>> = containers
            .log
            .iter()
            .filter(|(at, of, _)| *at >= since_unix_secs && of == node)
            .map(|(_, _, event)| Ok(event.clone()))
            .collect();
        let receiver = self.events.subscribe();
        drop(containers);
        let node = node.to_string();
        let live = futures_util::stream::unfold(receiver, move |mut receiver| {
            let node = node.clone();
            async move {
                loop {
                    match receiver.recv().await {
                        Ok((of, event)) if of == node => return Some((Ok(event), receiver)),
                        Ok(_) => {}
                        Err(_) => return None, // behind, or the runtime is gone
                    }
                }
            }
        });
        futures_util::stream::iter(replay).chain(live).boxed()
    }
}

/// Runs `count` simulated workers registered with `manager` until SIGINT or SIGTERM.
pub(crate) async fn sim_workers(
    manager: &str,
    count: usize,
    name_prefix: &str,
    heartbeat_interval: Duration,
    memory: Option<u64>,
) -> anyhow::Result<()> {
    anyhow::ensure!(count > 0, "--count must be at least 1");
    let capacity = Resources {
        memory: memory.unwrap_or(SIM_CAPACITY.memory),
        ..SIM_CAPACITY
    };
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
            capacity,
            stop_timeout: Duration::from_secs(10),
            max_concurrent_operations: 8,
            labels: Default::default(),
            pods: Default::default(),
        };
        let worker = Worker::new(
            config,
            std::sync::Arc::new(MemoryStore::without_history()),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The contract the Docker runtime is held to (`cube-runtime`'s tests run the same
    /// check against the real engine): the figures measured on simulated workers rest on
    /// the simulated runtime answering a worker as Docker does.
    #[tokio::test]
    async fn the_simulated_runtime_keeps_the_runtime_contract() {
        let runtime = SimulatedRuntime::default();
        cube_runtime::contract::check(&runtime, "cube-sample:latest", &["sleep", "3600"], "sim")
            .await;
    }

    #[tokio::test]
    async fn a_stream_opened_later_is_told_what_happened_since_its_time() {
        let runtime = SimulatedRuntime::default();
        let since = Utc::now().timestamp() - 1;
        cube_runtime::contract::check(&runtime, "cube-sample:latest", &["sleep", "3600"], "sim")
            .await;
        let replayed: Vec<_> = runtime.events_since("sim", since).take(4).collect().await;
        assert_eq!(
            replayed.len(),
            4,
            "two deaths and two removals: {replayed:?}"
        );
        let none: Vec<_> = runtime
            .events_since("sim", Utc::now().timestamp() + 60)
            .take_until(tokio::time::sleep(Duration::from_millis(100)))
            .collect()
            .await;
        assert!(none.is_empty(), "{none:?}");
    }
}
