//! The node registry: every worker the manager knows, how to reach it, and when it last
//! said something.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use cube_api::ApiClient;
use cube_types::node::Drain;
use cube_types::version::VersionInfo;
use cube_types::{HostPolicy, Labels, Node, NodeReport, NodeStatus, Resources, Stats};

use crate::cache::TaskCache;

/// How the node joined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeSource {
    /// It registered itself (`cube worker --manager`) and sends heartbeats.
    Registered,
    /// It is on the manager's `-w` list; the manager asks it for its report.
    Static,
}

impl NodeSource {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeSource::Registered => "registered",
            NodeSource::Static => "static",
        }
    }

    pub fn parse(text: &str) -> NodeSource {
        if text == "static" {
            NodeSource::Static
        } else {
            NodeSource::Registered
        }
    }
}

/// One known node.
#[derive(Debug, Clone)]
pub struct NodeEntry {
    pub name: String,
    pub address: String,
    pub capacity: Resources,
    /// The labels the node last reported, shared with every scheduler snapshot
    /// ([`cube_scheduler::NodeView::labels`]) so that building one copies no map.
    pub labels: Arc<Labels>,
    /// What the worker lets a task reach of its host, as it last reported it (`None`: it did
    /// not say, and placement leaves the check to the worker). Shared with every scheduler
    /// snapshot, as the labels are.
    pub host_policy: Option<Arc<HostPolicy>>,
    /// The named volumes the node last reported (kept in memory only: a node reports them
    /// at every beat).
    pub volumes: Arc<Vec<cube_types::secret::VolumeInfo>>,
    pub source: NodeSource,
    pub stats: Option<Stats>,
    pub last_heartbeat: Option<DateTime<Utc>>,
    /// When the node last reported, on the monotonic clock; `None` until it does (a node
    /// loaded from the store after a restart is `Down` until it reports).
    pub last_seen: Option<Instant>,
    /// A client for the node's API, kept so that its connections are reused.
    pub client: ApiClient,
    /// Whether the manager has declared the node `Down` (and its tasks `Lost`) since it last
    /// reported, so that it does so once per silence.
    pub marked_down: bool,
    /// Why the manager cannot reach the node's API, while it cannot (set and cleared by the
    /// node's follower). A node that reports but cannot be reached takes no work.
    pub unreachable: Option<String>,
    /// Whether new tasks may be placed here (the operator's word, stored with the node).
    pub eligible: bool,
    /// The drain under way, stored with the node (its counts are filled in by `view`).
    pub drain: Option<Drain>,
    /// The worker's build and engine, as it last reported them.
    pub version: Option<VersionInfo>,
    /// What the manager found wrong with that version, if anything.
    pub version_warning: Option<String>,
    /// When the node's follower last had an answer from it (`cube_follower_lag_seconds`).
    pub followed_at: Option<Instant>,
    /// Whether the registry holds a change of the node that the store refused: the next
    /// report writes the node whether or not it changes anything.
    pub unwritten: bool,
}

/// What changed when a report came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReportEffect {
    /// Name, address, capacity, labels or source changed: store the node again.
    pub changed: bool,
    /// The address changed (or the node is new): (re)start following it.
    pub moved: bool,
    /// The node can take work it could not before (new, back from `Down`, at a new address,
    /// which makes an unreachable node `Ready` again, bigger, or with other labels, which may
    /// meet a waiting task's constraints).
    pub more_room: bool,
}

/// Every known node by name (name order is what the scheduler needs).
#[derive(Debug, Default)]
pub struct NodeRegistry {
    nodes: BTreeMap<String, NodeEntry>,
    /// When this process first checked liveness: the start of the grace period of nodes
    /// loaded from the store.
    started: Option<Instant>,
}

impl NodeRegistry {
    pub fn get(&self, name: &str) -> Option<&NodeEntry> {
        self.nodes.get(name)
    }

    /// Takes a removed volume off `node`'s last report, so that a list does not show it until
    /// the next beat.
    pub fn forget_volume(&mut self, node: &str, docker_name: &str) {
        if let Some(entry) = self.nodes.get_mut(node) {
            let mut volumes = (*entry.volumes).clone();
            volumes.retain(|volume| volume.docker_name != docker_name);
            entry.volumes = Arc::new(volumes);
        }
    }

    /// How many nodes are known (whatever their status).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn entries(&self) -> impl Iterator<Item = &NodeEntry> {
        self.nodes.values()
    }

    /// Adds a node known from the store; it is `Down` until it reports.
    pub fn load(&mut self, node: &Node, client: ApiClient) {
        self.nodes.insert(
            node.name.clone(),
            NodeEntry {
                name: node.name.clone(),
                address: node.address.clone(),
                capacity: node.capacity,
                labels: Arc::new(node.labels.clone()),
                host_policy: node.host_policy.clone().map(Arc::new),
                volumes: Arc::new(node.volumes.clone()),
                source: NodeSource::parse(&node.source),
                stats: None,
                last_heartbeat: node.last_heartbeat,
                last_seen: None,
                client,
                // A node loaded from the store has not reported to this process yet; its
                // tasks are not lost before the grace period has passed since the start.
                marked_down: false,
                unreachable: None,
                eligible: node.eligible,
                drain: node.drain.clone(),
                version: node.version.clone(),
                version_warning: node.version_warning.clone(),
                followed_at: None,
                unwritten: false,
            },
        );
    }

    /// Forgets a node; returns it.
    pub fn remove(&mut self, name: &str) -> Option<NodeEntry> {
        self.nodes.remove(name)
    }

    pub fn get_mut(&mut self, name: &str) -> Option<&mut NodeEntry> {
        self.nodes.get_mut(name)
    }

    /// Records a report (a heartbeat, or a static node's answer). `client` is built by the
    /// caller for the report's address and used when the address is new.
    pub fn report(
        &mut self,
        report: NodeReport,
        source: NodeSource,
        client: impl FnOnce() -> ApiClient,
        now: Instant,
        grace: Duration,
    ) -> ReportEffect {
        let wall = Utc::now();
        match self.nodes.get_mut(&report.name) {
            Some(entry) => {
                // Back from silence, not back from unreachable: the follower says that.
                let was_ready = entry.is_fresh(now, grace);
                let moved = entry.address != report.address;
                let bigger = report.capacity.cpu > entry.capacity.cpu
                    || report.capacity.memory > entry.capacity.memory
                    || report.capacity.disk > entry.capacity.disk;
                let relabelled = *entry.labels != report.labels;
                // Another host policy may let in a pod that waits for one.
                let repolicied = entry.host_policy.as_deref() != report.host_policy.as_ref();
                let version_warning = cube_types::version::worker_mismatch(
                    cube_types::version::VERSION,
                    report.version.as_ref(),
                );
                let changed = moved
                    || relabelled
                    || repolicied
                    || entry.capacity != report.capacity
                    || entry.source != source
                    || entry.version != report.version;
                entry.version = report.version;
                entry.version_warning = version_warning;
                if moved {
                    entry.address = report.address;
                    entry.client = client();
                    // A new address is tried afresh by the node's new follower.
                    entry.unreachable = None;
                }
                entry.capacity = report.capacity;
                if relabelled {
                    entry.labels = Arc::new(report.labels);
                }
                if repolicied {
                    entry.host_policy = report.host_policy.map(Arc::new);
                }
                entry.source = source;
                if *entry.volumes != report.volumes {
                    entry.volumes = Arc::new(report.volumes);
                }
                entry.stats = report.stats;
                entry.last_heartbeat = Some(wall);
                entry.last_seen = Some(now);
                entry.marked_down = false;
                ReportEffect {
                    changed,
                    moved,
                    // A moved node is a worker started again: if it was unreachable, it is
                    // `Ready` again from this report on, with room for what waited for it
                    // (found by `cube-bench chaos`: a newer request took that room first).
                    more_room: !was_ready || moved || bigger || relabelled || repolicied,
                }
            }
            None => {
                let version_warning = cube_types::version::worker_mismatch(
                    cube_types::version::VERSION,
                    report.version.as_ref(),
                );
                let entry = NodeEntry {
                    name: report.name.clone(),
                    address: report.address,
                    capacity: report.capacity,
                    labels: Arc::new(report.labels),
                    host_policy: report.host_policy.map(Arc::new),
                    volumes: Arc::new(report.volumes),
                    source,
                    stats: report.stats,
                    last_heartbeat: Some(wall),
                    last_seen: Some(now),
                    client: client(),
                    marked_down: false,
                    unreachable: None,
                    eligible: true,
                    drain: None,
                    version: report.version,
                    version_warning,
                    followed_at: None,
                    unwritten: false,
                };
                self.nodes.insert(report.name, entry);
                ReportEffect {
                    changed: true,
                    moved: true,
                    more_room: true,
                }
            }
        }
    }
}

impl NodeRegistry {
    /// Records whether the manager can reach the node's API (`None`: it can); returns whether
    /// that changed.
    pub fn set_unreachable(&mut self, name: &str, why: Option<String>) -> bool {
        match self.nodes.get_mut(name) {
            Some(entry) if entry.unreachable.is_some() != why.is_some() => {
                entry.unreachable = why;
                true
            }
            Some(entry) => {
                entry.unreachable = why;
                false
            }
            None => false,
        }
    }

    /// Marks every node silent for longer than `grace` as `Down`, once per silence; returns
    /// the names of those newly down. A node never heard from by this process counts from
    /// `started`, the first call.
    pub fn mark_down(&mut self, now: Instant, grace: Duration) -> Vec<String> {
        let started = *self.started.get_or_insert(now);
        let mut newly_down = Vec::new();
        for entry in self.nodes.values_mut() {
            let seen = entry.last_seen.unwrap_or(started);
            if !entry.marked_down && now.saturating_duration_since(seen) > grace {
                entry.marked_down = true;
                newly_down.push(entry.name.clone());
            }
        }
        newly_down
    }
}

impl NodeEntry {
    /// Whether the node takes work: it reported within the grace period and the manager can
    /// reach it.
    pub fn is_ready(&self, now: Instant, grace: Duration) -> bool {
        self.status(now, grace) == NodeStatus::Ready
    }

    /// Whether the node reported within the grace period.
    pub fn is_fresh(&self, now: Instant, grace: Duration) -> bool {
        self.last_seen
            .is_some_and(|seen| now.saturating_duration_since(seen) <= grace)
    }

    pub fn status(&self, now: Instant, grace: Duration) -> NodeStatus {
        match (self.is_fresh(now, grace), &self.unreachable) {
            (false, _) => NodeStatus::Down,
            (true, Some(_)) => NodeStatus::Unreachable,
            (true, None) => NodeStatus::Ready,
        }
    }

    /// The node as the API shows it, with what the cache says is placed there.
    pub fn view(&self, cache: &TaskCache, now: Instant, grace: Duration, jobs: JobTypes) -> Node {
        let load = cache.load(&self.name);
        Node {
            name: self.name.clone(),
            address: self.address.clone(),
            status: self.status(now, grace),
            status_reason: self
                .unreachable
                .as_ref()
                .map(|why| format!("cannot reach {}: {why}", self.address)),
            capacity: self.capacity,
            allocated: load.map(|load| load.allocated).unwrap_or_default(),
            task_count: load.map(|load| load.tasks.len()).unwrap_or(0),
            stats: self.stats.clone(),
            last_heartbeat: self.last_heartbeat,
            source: self.source.as_str().to_string(),
            labels: (*self.labels).clone(),
            eligible: self.eligible,
            drain: self.drain.clone().map(|mut drain| {
                let (remaining, staying) = drain_counts(cache, &self.name, jobs);
                drain.remaining = remaining;
                drain.staying = staying;
                drain
            }),
            version: self.version.clone(),
            version_warning: self.version_warning.clone(),
            host_policy: self.host_policy.as_deref().cloned(),
            volumes: (*self.volumes).clone(),
        }
    }
}

/// The job types by job name, for counting what a drain moves.
pub type JobTypes<'a> = &'a dyn Fn(&str) -> Option<cube_types::JobType>;

/// What a drain of `node` still has to move (copies of service and batch jobs there, asked
/// to run or on their way out) and what stays (bare tasks and system jobs' copies).
pub fn drain_counts(cache: &TaskCache, node: &str, jobs: JobTypes) -> (usize, usize) {
    let Some(load) = cache.load(node) else {
        return (0, 0);
    };
    let (mut remaining, mut staying) = (0, 0);
    for id in &load.tasks {
        let Some(task) = cache.get(id) else { continue };
        let moves = !task.spec.job.is_empty()
            && jobs(&task.spec.job).is_some_and(|kind| kind != cube_types::JobType::System);
        if moves {
            remaining += 1;
        } else {
            staying += 1;
        }
    }
    (remaining, staying)
}

/// The event of a node that moved to `status`.
pub(crate) fn node_status_event(status: NodeStatus) -> &'static str {
    match status {
        NodeStatus::Ready => "NodeReady",
        NodeStatus::Down => "NodeDown",
        NodeStatus::Unreachable => "NodeUnreachable",
    }
}

/// A report of node `name` at `address` with `cpu` cores and `memory` bytes, nothing else
/// set, for the unit tests.
#[cfg(test)]
pub(crate) fn test_report(name: &str, address: &str, cpu: f64, memory: u64) -> NodeReport {
    NodeReport {
        name: name.to_string(),
        address: address.to_string(),
        capacity: cube_types::Resources {
            cpu,
            memory,
            disk: 0,
        },
        stats: None,
        labels: Default::default(),
        version: None,
        host_policy: None,
        volumes: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(labels: &[(&str, &str)]) -> NodeReport {
        NodeReport {
            name: "w1".into(),
            address: "http://127.0.0.1:1".into(),
            capacity: Resources {
                cpu: 1.0,
                memory: 1 << 30,
                disk: 0,
            },
            stats: None,
            labels: labels
                .iter()
                .map(|(key, value)| (key.to_string(), value.to_string()))
                .collect(),
            version: None,
            host_policy: None,
            volumes: Vec::new(),
        }
    }

    fn client() -> ApiClient {
        ApiClient::new("127.0.0.1:1", Duration::from_secs(1)).unwrap()
    }

    #[test]
    fn a_label_change_is_stored_and_counts_as_more_room() {
        let mut registry = NodeRegistry::default();
        let grace = Duration::from_secs(10);
        let now = Instant::now();
        let joined = registry.report(
            report(&[("zone", "us")]),
            NodeSource::Registered,
            client,
            now,
            grace,
        );
        assert!(joined.changed && joined.more_room);
        let same = registry.report(
            report(&[("zone", "us")]),
            NodeSource::Registered,
            client,
            now,
            grace,
        );
        assert_eq!(same, ReportEffect::default());
        let relabelled = registry.report(
            report(&[("zone", "eu")]),
            NodeSource::Registered,
            client,
            now,
            grace,
        );
        assert!(relabelled.changed && relabelled.more_room && !relabelled.moved);
        let entry = registry.get("w1").unwrap();
        assert_eq!(entry.labels.get("zone").map(String::as_str), Some("eu"));
        let cache = TaskCache::default();
        assert_eq!(
            entry.view(&cache, now, grace, &|_| None).labels,
            *entry.labels
        );
    }

    /// Found by the 30-minute chaos run on etcd: a worker killed and started again within the
    /// heartbeat grace reports from a new port; the manager had found it unreachable, and
    /// this report makes it `Ready` again. That is room appearing: every waiting request must
    /// be looked at in order, or a newer one's pass takes it.
    #[test]
    fn an_unreachable_node_back_at_a_new_address_counts_as_more_room() {
        let mut registry = NodeRegistry::default();
        let grace = Duration::from_secs(10);
        let now = Instant::now();
        registry.report(report(&[]), NodeSource::Registered, client, now, grace);
        assert!(registry.set_unreachable("w1", Some("connection refused".into())));
        let mut restarted = report(&[]);
        restarted.address = "http://127.0.0.1:2".into();
        let back = registry.report(restarted, NodeSource::Registered, client, now, grace);
        assert!(back.moved && back.more_room, "{back:?}");
        assert!(registry.get("w1").unwrap().unreachable.is_none());
    }
}
