//! The worker's metrics, in the Prometheus text format (`GET /metrics`), through the
//! `prometheus-client` crate: its tasks and containers by state, how long each call to the
//! container engine takes, health probes by result, and the host's CPU and memory.
//!
//! Counters and histograms are updated where things happen (a probe, an engine call through
//! [`Metered`]); gauges are read from the worker's state when scraped. Nothing here decides
//! anything.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cube_runtime::{
    ContainerInfo, ContainerSpec, EngineVersion, ExecSession, LogOptions, OutputChunk, Runtime,
    RuntimeError, RuntimeEvent,
};
use futures_util::stream::BoxStream;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabel {
    pub call: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

/// Engine calls take from under a millisecond (inspect) to seconds (a stop that waits):
/// buckets from 0.5 ms doubling to about 16 s.
fn call_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// One histogram of engine call durations per call.
pub type CallHistograms = Family<CallLabel, Histogram, fn() -> Histogram>;

/// Every metric of one worker, registered once.
pub struct WorkerMetrics {
    registry: Registry,
    pub tasks: Family<StateLabel, Gauge>,
    pub containers: Family<StateLabel, Gauge>,
    pub docker_calls: Arc<CallHistograms>,
    pub probes: Family<ResultLabel, Counter>,
    pub host_cpu: FloatGauge,
    pub host_memory_used: Gauge,
    pub host_memory_total: Gauge,
    pub host_load1: FloatGauge,
    pub host_disk_free: Gauge,
}

impl Default for WorkerMetrics {
    fn default() -> WorkerMetrics {
        let mut registry = Registry::default();
        let tasks = Family::<StateLabel, Gauge>::default();
        registry.register(
            "cube_worker_tasks",
            "Tasks this worker holds, by state",
            tasks.clone(),
        );
        let containers = Family::<StateLabel, Gauge>::default();
        registry.register(
            "cube_worker_containers",
            "Containers this worker keeps, by state: running, or exited (kept with their \
             output until the task is removed)",
            containers.clone(),
        );
        let docker_calls = Arc::new(
            Family::<CallLabel, Histogram, fn() -> Histogram>::new_with_constructor(call_buckets),
        );
        registry.register(
            "cube_worker_docker_call_duration_seconds",
            "How long each call to the container engine took, by call",
            (*docker_calls).clone(),
        );
        let probes = Family::<ResultLabel, Counter>::default();
        registry.register(
            "cube_worker_health_probes",
            "Health probes of running tasks, by result (healthy, unhealthy)",
            probes.clone(),
        );
        let host_cpu = FloatGauge::default();
        registry.register(
            "cube_worker_host_cpu_usage_ratio",
            "The host's CPU usage between the last two samples, 0 to 1",
            host_cpu.clone(),
        );
        let host_memory_used = Gauge::default();
        registry.register(
            "cube_worker_host_memory_used_bytes",
            "The host's memory in use",
            host_memory_used.clone(),
        );
        let host_memory_total = Gauge::default();
        registry.register(
            "cube_worker_host_memory_total_bytes",
            "The host's memory",
            host_memory_total.clone(),
        );
        let host_load1 = FloatGauge::default();
        registry.register(
            "cube_worker_host_load1",
            "The host's load average over one minute",
            host_load1.clone(),
        );
        let host_disk_free = Gauge::default();
        registry.register(
            "cube_worker_host_disk_free_bytes",
            "Free space on the filesystem of the worker's data directory",
            host_disk_free.clone(),
        );
        WorkerMetrics {
            registry,
            tasks,
            containers,
            docker_calls,
            probes,
            host_cpu,
            host_memory_used,
            host_memory_total,
            host_load1,
            host_disk_free,
        }
    }
}

impl WorkerMetrics {
    /// Counts one health probe.
    pub fn probe(&self, healthy: bool) {
        let result = if healthy { "healthy" } else { "unhealthy" };
        self.probes.get_or_create(&ResultLabel { result }).inc();
    }

    /// The registry in the classic Prometheus text format (`cube_api::metrics`).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(cube_api::metrics::classic_text(&text))
    }
}

/// A [`Runtime`] that times every call it passes on to the one it wraps.
pub struct Metered<R> {
    inner: R,
    calls: Arc<CallHistograms>,
}

impl<R> Metered<R> {
    pub fn new(inner: R, calls: Arc<CallHistograms>) -> Self {
        Metered { inner, calls }
    }

    fn observe(&self, call: &'static str, started: Instant) {
        self.calls
            .get_or_create(&CallLabel { call })
            .observe(started.elapsed().as_secs_f64());
    }

    async fn timed<T>(&self, call: &'static str, future: impl Future<Output = T>) -> T {
        let started = Instant::now();
        let result = future.await;
        self.observe(call, started);
        result
    }
}

impl<R: Runtime> Runtime for Metered<R> {
    async fn ensure_image(&self, image: &str) -> Result<(), RuntimeError> {
        self.timed("ensure_image", self.inner.ensure_image(image))
            .await
    }
    async fn create(&self, spec: &ContainerSpec) -> Result<String, RuntimeError> {
        self.timed("create", self.inner.create(spec)).await
    }
    async fn start(&self, container_id: &str) -> Result<(), RuntimeError> {
        self.timed("start", self.inner.start(container_id)).await
    }
    async fn stop(&self, container_id: &str, timeout: Duration) -> Result<(), RuntimeError> {
        self.timed("stop", self.inner.stop(container_id, timeout))
            .await
    }
    async fn remove(&self, container_id: &str) -> Result<(), RuntimeError> {
        self.timed("remove", self.inner.remove(container_id)).await
    }
    async fn inspect(&self, container_id: &str) -> Result<Option<ContainerInfo>, RuntimeError> {
        self.timed("inspect", self.inner.inspect(container_id))
            .await
    }
    async fn list_managed(&self, node: &str) -> Result<Vec<ContainerInfo>, RuntimeError> {
        self.timed("list", self.inner.list_managed(node)).await
    }
    fn events_since(
        &self,
        node: &str,
        since_unix_secs: i64,
    ) -> BoxStream<'static, Result<RuntimeEvent, RuntimeError>> {
        self.inner.events_since(node, since_unix_secs)
    }
    fn logs(
        &self,
        container_id: &str,
        options: &LogOptions,
    ) -> BoxStream<'static, Result<OutputChunk, RuntimeError>> {
        self.inner.logs(container_id, options)
    }
    async fn exec(
        &self,
        container_id: &str,
        cmd: &[String],
        tty: bool,
        stdin: bool,
    ) -> Result<ExecSession, RuntimeError> {
        self.timed("exec", self.inner.exec(container_id, cmd, tty, stdin))
            .await
    }
    async fn exec_exit_code(&self, exec_id: &str) -> Result<Option<i64>, RuntimeError> {
        self.timed("exec_inspect", self.inner.exec_exit_code(exec_id))
            .await
    }
    async fn resize_exec(
        &self,
        exec_id: &str,
        width: u16,
        height: u16,
    ) -> Result<(), RuntimeError> {
        self.inner.resize_exec(exec_id, width, height).await
    }
    async fn ensure_image_with(
        &self,
        image: &str,
        auth: Option<&cube_types::secret::RegistryAuth>,
    ) -> Result<(), RuntimeError> {
        self.timed("ensure_image", self.inner.ensure_image_with(image, auth))
            .await
    }
    async fn ensure_volume(
        &self,
        name: &str,
        labels: &std::collections::HashMap<String, String>,
    ) -> Result<(), RuntimeError> {
        self.timed("volume_create", self.inner.ensure_volume(name, labels))
            .await
    }
    async fn list_volumes(
        &self,
        node: &str,
    ) -> Result<Vec<(String, std::collections::HashMap<String, String>)>, RuntimeError> {
        self.timed("volume_list", self.inner.list_volumes(node))
            .await
    }
    async fn remove_volume(&self, name: &str) -> Result<(), RuntimeError> {
        self.timed("volume_remove", self.inner.remove_volume(name))
            .await
    }
    async fn remove_image(&self, image: &str) -> Result<(), RuntimeError> {
        self.timed("image_remove", self.inner.remove_image(image))
            .await
    }
    async fn engine_version(&self) -> Result<EngineVersion, RuntimeError> {
        self.timed("version", self.inner.engine_version()).await
    }
}
