//! The manager's metrics, in the Prometheus text format (`GET /metrics`), through the
//! `prometheus-client` crate (its OpenMetrics made classic by `cube_api::metrics`).
//!
//! Counters and histograms are updated where things happen: a placement or a failed one
//! (`placement.rs`), a reconcile (the task and job controllers), a wait for the store
//! (`Cluster::settle`), an HTTP request (the API's layer). Gauges (tasks by state, jobs,
//! nodes and every figure `cube node` shows, the queue, the followers' lag) are read from the
//! manager's state when scraped, under one short hold of its lock. Nothing here decides
//! anything.

use std::time::Instant;

use cube_types::job::JobRecord;
use cube_types::queue::{QueueEntry, QueueState};
use cube_types::{Node, NodeStatus, State};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::nodes::NodeEntry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: &'static str,
}

/// A project's resource: `cpu` (cores), `memory` and `disk` (bytes), `tasks`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProjectLabel {
    pub project: String,
    pub resource: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabel {
    pub r#type: &'static str,
    pub stopped: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabel {
    pub node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeStatusLabel {
    pub node: String,
    pub status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabel {
    pub controller: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabel {
    pub route: String,
    pub method: String,
    pub status: u16,
}

type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;
type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Reconciles and commits take from tens of microseconds to seconds: buckets from 50 µs
/// doubling to about 1.6 s.
fn short_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.00005, 2.0, 16))
}

/// A gauge family whose series are the nodes: rebuilt at each scrape, so that a node that
/// is gone leaves no series behind.
macro_rules! node_gauges {
    ($($field:ident: $kind:ty = $name:literal, $help:literal;)*) => {
        /// The per-node figures `cube node` shows, one family each.
        pub struct NodeGauges {
            $(pub $field: Family<NodeLabel, $kind>,)*
        }

        impl NodeGauges {
            fn register(registry: &mut Registry) -> NodeGauges {
                $(
                    let $field = Family::<NodeLabel, $kind>::default();
                    registry.register($name, $help, $field.clone());
                )*
                NodeGauges { $($field,)* }
            }

            fn clear(&self) {
                $(self.$field.clear();)*
            }
        }
    };
}

node_gauges! {
    capacity_cpu: FloatGauge = "cube_node_capacity_cpu_cores", "CPU the node offers to tasks (cube node CPU, after the slash)";
    capacity_memory: Gauge = "cube_node_capacity_memory_bytes", "Memory the node offers to tasks (cube node MEMORY, after the slash)";
    capacity_disk: Gauge = "cube_node_capacity_disk_bytes", "Disk the node offers to tasks (cube node DISK, after the slash)";
    allocated_cpu: FloatGauge = "cube_node_allocated_cpu_cores", "CPU the tasks placed on the node declared (cube node CPU, before the slash)";
    allocated_memory: Gauge = "cube_node_allocated_memory_bytes", "Memory the tasks placed on the node declared (cube node MEMORY, before the slash)";
    allocated_disk: Gauge = "cube_node_allocated_disk_bytes", "Disk the tasks placed on the node declared (cube node DISK, before the slash)";
    tasks: Gauge = "cube_node_tasks", "Tasks holding resources on the node (cube node TASKS)";
    eligible: Gauge = "cube_node_eligible", "1 when new tasks may be placed on the node, 0 when it is ineligible or drains";
    draining: Gauge = "cube_node_drain_remaining", "Job copies a drain of the node still has to move (0 when it does not drain)";
    heartbeat_age: FloatGauge = "cube_node_heartbeat_age_seconds", "Seconds since the node last reported (cube node -o wide HEARTBEAT)";
    memory_used: Gauge = "cube_node_memory_used_bytes", "The machine's memory in use, as the worker last reported (cube node NAME MemoryUsed)";
    memory_total: Gauge = "cube_node_memory_total_bytes", "The machine's memory, as the worker last reported";
    cpu_usage: FloatGauge = "cube_node_cpu_usage_ratio", "The machine's CPU usage, 0 to 1, as the worker last reported (cube node NAME CpuUsage)";
    load1: FloatGauge = "cube_node_load1", "The machine's load average over one minute (cube node NAME Load)";
    disk_used: Gauge = "cube_node_disk_used_bytes", "Disk used on the worker's data filesystem (cube node NAME DiskUsed)";
    disk_total: Gauge = "cube_node_disk_total_bytes", "Size of the worker's data filesystem";
    containers: Gauge = "cube_node_containers", "Running tasks the worker counts (cube node NAME Containers)";
    follower_lag: FloatGauge = "cube_follower_lag_seconds", "Seconds since the manager last heard from the node's task list (its follower's blocking query answers at least every 30 s)";
}

/// Every metric of the manager, registered once.
pub struct ManagerMetrics {
    registry: Registry,
    tasks: Family<StateLabel, Gauge>,
    jobs: Family<JobLabel, Gauge>,
    nodes: Family<StateLabel, Gauge>,
    node_status: Family<NodeStatusLabel, Gauge>,
    node_gauges: NodeGauges,
    queue_depth: Family<StateLabel, Gauge>,
    waiting_tasks: Gauge,
    project_usage: Family<ProjectLabel, FloatGauge>,
    project_quota: Family<ProjectLabel, FloatGauge>,
    pub placements: Counter,
    /// Placements whose nodes' claims another manager changed first (`--shard-controllers`).
    pub placement_conflicts: Counter,
    /// How long the claims of a pass's placed nodes took to commit, the conflict check
    /// (`--shard-controllers`).
    pub claims_writes: Histogram,
    pub placement_failures: Family<ReasonLabel, Counter>,
    pub reconciles: Histograms<ControllerLabel>,
    pub commits: Histogram,
    pub requests: Family<RequestLabel, Counter>,
}

impl Default for ManagerMetrics {
    fn default() -> ManagerMetrics {
        let mut registry = Registry::default();
        let tasks = Family::<StateLabel, Gauge>::default();
        registry.register("cube_tasks", "Tasks by state", tasks.clone());
        let jobs = Family::<JobLabel, Gauge>::default();
        registry.register("cube_jobs", "Jobs by type, stopped or not", jobs.clone());
        let nodes = Family::<StateLabel, Gauge>::default();
        registry.register(
            "cube_nodes",
            "Nodes by status (Ready, Down, Unreachable)",
            nodes.clone(),
        );
        let node_status = Family::<NodeStatusLabel, Gauge>::default();
        registry.register(
            "cube_node_status",
            "1 for each node's status (cube node STATUS)",
            node_status.clone(),
        );
        let node_gauges = NodeGauges::register(&mut registry);
        let queue_depth = Family::<StateLabel, Gauge>::default();
        registry.register(
            "cube_queue_depth",
            "Requests in the waiting list, by state (waiting, pending, claimed, expired)",
            queue_depth.clone(),
        );
        let waiting_tasks = Gauge::default();
        registry.register(
            "cube_waiting_tasks",
            "Tasks waiting for a node (Pending, asked to run)",
            waiting_tasks.clone(),
        );
        let project_usage = Family::<ProjectLabel, FloatGauge>::default();
        registry.register(
            "cube_project_usage",
            "What each project's placed tasks declare together, by resource (cpu in cores, \
             memory and disk in bytes, tasks)",
            project_usage.clone(),
        );
        let project_quota = Family::<ProjectLabel, FloatGauge>::default();
        registry.register(
            "cube_project_quota",
            "Each project's quota, by resource (only the limits set)",
            project_quota.clone(),
        );
        let placements = Counter::default();
        registry.register(
            "cube_placements",
            "Tasks placed on a node",
            placements.clone(),
        );
        let placement_conflicts = Counter::default();
        registry.register(
            "cube_placement_conflicts",
            "Placement passes planned again because another manager acting for its own shards \
             changed a chosen node's claims first (--shard-controllers)",
            placement_conflicts.clone(),
        );
        let claims_writes = short_buckets();
        registry.register(
            "cube_claims_write_duration_seconds",
            "How long the claims of the nodes a placement pass chose took to commit in etcd, \
             won or lost (--shard-controllers)",
            claims_writes.clone(),
        );
        let placement_failures = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "cube_placement_failures",
            "Placements that found no node, by the reasons nodes gave (one count per reason \
             present in an attempt)",
            placement_failures.clone(),
        );
        let reconciles =
            Histograms::<ControllerLabel>::new_with_constructor(short_buckets as fn() -> Histogram);
        registry.register(
            "cube_reconcile_duration_seconds",
            "How long one reconcile took, by controller (task, job, placement)",
            reconciles.clone(),
        );
        let commits = short_buckets();
        registry.register(
            "cube_store_commit_duration_seconds",
            "How long the manager waited for a write to be durable (its group commit)",
            commits.clone(),
        );
        let requests = Family::<RequestLabel, Counter>::default();
        registry.register(
            "cube_http_requests",
            "HTTP requests answered, by route, method and status",
            requests.clone(),
        );
        ManagerMetrics {
            registry,
            tasks,
            jobs,
            nodes,
            node_status,
            node_gauges,
            queue_depth,
            waiting_tasks,
            project_usage,
            project_quota,
            placements,
            placement_conflicts,
            claims_writes,
            placement_failures,
            reconciles,
            commits,
            requests,
        }
    }
}

/// The metrics text without the samples of projects the token does not reach: a sample
/// labelled `project="NAME"` is kept only when `reaches(NAME)`. Every other line (the
/// cluster's metrics, `# HELP` and `# TYPE`) stays, so that a token of one project learns
/// nothing of the others' names, usage or quotas from `GET /metrics`.
pub(crate) fn only_reached(text: &str, reaches: impl Fn(&str) -> bool) -> String {
    let mut kept = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let project = (!line.starts_with('#'))
            .then(|| line.split_once("project=\""))
            .flatten()
            .and_then(|(_, rest)| rest.split_once('"'))
            .map(|(project, _)| project);
        if project.is_none_or(&reaches) {
            kept.push_str(line);
        }
    }
    kept
}

impl ManagerMetrics {
    /// Each project's usage (every project made, and any with a task placed) and the limits
    /// of its quota.
    pub(crate) fn set_projects<'a>(
        &self,
        usage: impl Iterator<Item = (&'a str, cube_types::project::Usage)>,
        quotas: impl Iterator<Item = (&'a str, &'a cube_types::project::Quota)>,
    ) {
        self.project_usage.clear();
        self.project_quota.clear();
        let label = |project: &str, resource| ProjectLabel {
            project: project.to_string(),
            resource,
        };
        for (project, used) in usage {
            for (resource, value) in [
                ("cpu", used.cpus),
                ("memory", used.memory as f64),
                ("disk", used.disk as f64),
                ("tasks", used.tasks as f64),
            ] {
                self.project_usage
                    .get_or_create(&label(project, resource))
                    .set(value);
            }
        }
        for (project, quota) in quotas {
            for (resource, value) in [
                ("cpu", quota.cpus),
                ("memory", quota.memory.map(|bytes| bytes as f64)),
                ("disk", quota.disk.map(|bytes| bytes as f64)),
                ("tasks", quota.tasks.map(|tasks| tasks as f64)),
            ] {
                if let Some(value) = value {
                    self.project_quota
                        .get_or_create(&label(project, resource))
                        .set(value);
                }
            }
        }
    }

    /// Times one reconcile of `controller`.
    pub fn reconciled(&self, controller: &'static str, started: Instant) {
        self.reconciles
            .get_or_create(&ControllerLabel { controller })
            .observe(started.elapsed().as_secs_f64());
    }

    /// Counts a placement that found no node, once per kind of reason its nodes gave.
    pub fn placement_failed(&self, reasons: &[cube_scheduler::Rejection]) {
        let mut seen: Vec<&'static str> = Vec::new();
        for rejection in reasons {
            let reason = reason_kind(&rejection.reason);
            if !seen.contains(&reason) {
                seen.push(reason);
            }
        }
        if seen.is_empty() {
            seen.push("no_nodes");
        }
        for reason in seen {
            self.placement_failures
                .get_or_create(&ReasonLabel { reason })
                .inc();
        }
    }
}

/// A node's reason for refusing a task as a label value: the filter it came from, read from
/// the filter's own words (`cube-scheduler`'s `filter.rs`).
fn reason_kind(reason: &str) -> &'static str {
    if reason.contains("not Ready") {
        "not_ready"
    } else if reason.contains("ineligible") {
        "ineligible"
    } else if reason.contains("CPU") {
        "cpu"
    } else if reason.contains("memory") {
        "memory"
    } else if reason.contains("disk") {
        "disk"
    } else if reason.contains("port") {
        "port"
    } else {
        "constraint"
    }
}

fn count(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn bytes(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl ManagerMetrics {
    /// The tasks-by-state gauges, from every task's state.
    pub(crate) fn set_tasks(&self, states: impl Iterator<Item = State>) {
        let mut by_state = [0usize; 6];
        for state in states {
            by_state[state_slot(state)] += 1;
        }
        for state_name in cube_types::state::ALL_STATES {
            self.tasks
                .get_or_create(&StateLabel {
                    state: state_name.name(),
                })
                .set(count(by_state[state_slot(state_name)]));
        }
    }

    /// The jobs gauge, by type and whether stopped, from every job.
    pub(crate) fn set_jobs<'a>(&self, jobs: impl Iterator<Item = &'a JobRecord>) {
        self.jobs.clear();
        for record in jobs {
            let label = JobLabel {
                r#type: record.job.job_type.name(),
                stopped: if record.stopped { "true" } else { "false" },
            };
            self.jobs.get_or_create(&label).inc();
        }
    }

    /// The waiting-tasks gauge.
    pub(crate) fn set_waiting(&self, waiting: usize) {
        self.waiting_tasks.set(count(waiting));
    }

    /// The queue-depth gauges, by state, from every queue entry.
    pub(crate) fn set_queue<'a>(&self, entries: impl Iterator<Item = &'a QueueEntry>) {
        let mut queue = [0usize; 4];
        for entry in entries {
            queue[match entry.state {
                QueueState::Waiting => 0,
                QueueState::Pending(_) => 1,
                QueueState::Claimed => 2,
                QueueState::Expired => 3,
            }] += 1;
        }
        for (slot, name) in ["waiting", "pending", "claimed", "expired"]
            .into_iter()
            .enumerate()
        {
            self.queue_depth
                .get_or_create(&StateLabel { state: name })
                .set(count(queue[slot]));
        }
    }

    /// The node gauges, from every node's registry entry and its view as the API shows it.
    pub(crate) fn set_nodes<'a>(
        &self,
        nodes: impl Iterator<Item = (&'a NodeEntry, Node)>,
        now: Instant,
    ) {
        let metrics = self;
        let mut nodes_by_status = [0usize; 3];
        metrics.node_status.clear();
        metrics.node_gauges.clear();
        let gauges = &metrics.node_gauges;
        for (entry, view) in nodes {
            let slot = match view.status {
                NodeStatus::Ready => 0,
                NodeStatus::Down => 1,
                NodeStatus::Unreachable => 2,
            };
            nodes_by_status[slot] += 1;
            let node = NodeLabel {
                node: view.name.clone(),
            };
            metrics
                .node_status
                .get_or_create(&NodeStatusLabel {
                    node: view.name.clone(),
                    status: status_name(view.status),
                })
                .set(1);
            gauges
                .capacity_cpu
                .get_or_create(&node)
                .set(view.capacity.cpu);
            gauges
                .capacity_memory
                .get_or_create(&node)
                .set(bytes(view.capacity.memory));
            gauges
                .capacity_disk
                .get_or_create(&node)
                .set(bytes(view.capacity.disk));
            gauges
                .allocated_cpu
                .get_or_create(&node)
                .set(view.allocated.cpu);
            gauges
                .allocated_memory
                .get_or_create(&node)
                .set(bytes(view.allocated.memory));
            gauges
                .allocated_disk
                .get_or_create(&node)
                .set(bytes(view.allocated.disk));
            gauges
                .tasks
                .get_or_create(&node)
                .set(count(view.task_count));
            gauges
                .eligible
                .get_or_create(&node)
                .set(i64::from(view.eligible));
            gauges.draining.get_or_create(&node).set(count(
                view.drain.as_ref().map_or(0, |drain| drain.remaining),
            ));
            if let Some(seen) = entry.last_seen {
                gauges
                    .heartbeat_age
                    .get_or_create(&node)
                    .set(now.saturating_duration_since(seen).as_secs_f64());
            }
            if let Some(followed) = entry.followed_at {
                gauges
                    .follower_lag
                    .get_or_create(&node)
                    .set(now.saturating_duration_since(followed).as_secs_f64());
            }
            if let Some(stats) = &view.stats {
                gauges
                    .memory_used
                    .get_or_create(&node)
                    .set(bytes(stats.mem_used_kb.saturating_mul(1024)));
                gauges
                    .memory_total
                    .get_or_create(&node)
                    .set(bytes(stats.mem_total_kb.saturating_mul(1024)));
                gauges.cpu_usage.get_or_create(&node).set(stats.cpu_usage);
                gauges
                    .load1
                    .get_or_create(&node)
                    .set(stats.load_avg.last_1_min);
                gauges
                    .disk_used
                    .get_or_create(&node)
                    .set(bytes(stats.disk_used));
                gauges
                    .disk_total
                    .get_or_create(&node)
                    .set(bytes(stats.disk_total));
                gauges
                    .containers
                    .get_or_create(&node)
                    .set(count(stats.task_count));
            }
        }
        for (slot, status) in [NodeStatus::Ready, NodeStatus::Down, NodeStatus::Unreachable]
            .into_iter()
            .enumerate()
        {
            metrics
                .nodes
                .get_or_create(&StateLabel {
                    state: status_name(status),
                })
                .set(count(nodes_by_status[slot]));
        }
    }

    /// Every metric as text, in the Prometheus classic format.
    pub(crate) fn text(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(cube_api::metrics::classic_text(&text))
    }
}

fn state_slot(state: State) -> usize {
    match state {
        State::Pending => 0,
        State::Scheduled => 1,
        State::Running => 2,
        State::Completed => 3,
        State::Failed => 4,
        State::Lost => 5,
    }
}

fn status_name(status: NodeStatus) -> &'static str {
    match status {
        NodeStatus::Ready => "Ready",
        NodeStatus::Down => "Down",
        NodeStatus::Unreachable => "Unreachable",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_sees_only_the_samples_of_the_projects_it_reaches() {
        let text = "# HELP cube_project_usage What each project's placed tasks declare\n\
                    # TYPE cube_project_usage gauge\n\
                    cube_project_usage{project=\"team-a\",resource=\"cpu\"} 1\n\
                    cube_project_usage{project=\"team-b\",resource=\"cpu\"} 2\n\
                    cube_project_quota{resource=\"cpu\",project=\"team-b\"} 4\n\
                    cube_tasks{state=\"Running\"} 3\n";
        let kept = only_reached(text, |project| project == "team-a");
        assert_eq!(
            kept,
            "# HELP cube_project_usage What each project's placed tasks declare\n\
             # TYPE cube_project_usage gauge\n\
             cube_project_usage{project=\"team-a\",resource=\"cpu\"} 1\n\
             cube_tasks{state=\"Running\"} 3\n"
        );
        assert_eq!(only_reached(text, |_| true), text);
    }
}
