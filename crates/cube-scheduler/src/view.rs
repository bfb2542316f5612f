//! What the scheduler reads: a snapshot of each node and the resources one task asks for.
//! Both are plain data built by the manager; the scheduler never changes them.

use std::collections::BTreeSet;
use std::sync::Arc;

use cube_types::{
    Constraint, HostNeeds, HostPolicy, HostPort, Labels, Node, NodeStatus, Resources, Task,
};

/// An immutable snapshot of one node, built by the manager from its cached node state.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeView {
    pub name: String,
    /// The node is `NodeStatus::Ready`; a node that is not takes no work.
    pub ready: bool,
    /// The operator took the node out of service (`cube node eligibility --disable`, or a
    /// drain): it takes no new work, whatever its room.
    pub ineligible: bool,
    /// What the node offers to tasks: CPU in cores, memory and disk in bytes.
    pub capacity: Resources,
    /// The sum of the declared `Cpu`, `Memory` and `Disk` of the tasks placed on the node.
    pub allocated: Resources,
    /// How many tasks are placed on the node (E-PVM's `k_m`).
    pub task_count: usize,
    /// Host ports that tasks placed on the node have bound.
    pub host_ports_taken: BTreeSet<HostPort>,
    /// The node's labels, shared with the manager's registry: a snapshot is built for every
    /// placement, and copying a pointer costs less than copying the map.
    pub labels: Arc<Labels>,
    /// What the node's worker lets a task reach of its host; `None` when it did not say (the
    /// worker's own check then decides). Shared with the manager's registry.
    pub host_policy: Option<Arc<HostPolicy>>,
}

impl NodeView {
    /// The snapshot of a node as the manager knows it. The host ports are the manager's to
    /// collect, from the port bindings of the tasks placed on the node.
    pub fn from_node(node: &Node, host_ports_taken: BTreeSet<HostPort>) -> NodeView {
        NodeView {
            name: node.name.clone(),
            ready: node.status == NodeStatus::Ready,
            ineligible: !node.eligible,
            capacity: node.capacity,
            allocated: node.allocated,
            task_count: node.task_count,
            host_ports_taken,
            labels: Arc::new(node.labels.clone()),
            host_policy: node.host_policy.clone().map(Arc::new),
        }
    }

    /// Counts a task as placed on this node: its resources allocated, its host ports taken.
    /// The manager can use it to keep one snapshot up to date across a batch of placements.
    pub fn add_task(&mut self, task: &TaskRequest) {
        self.allocated.cpu += task.cpu_cores();
        self.allocated.memory = self.allocated.memory.saturating_add(task.memory);
        self.allocated.disk = self.allocated.disk.saturating_add(task.disk);
        self.task_count += 1;
        self.host_ports_taken
            .extend(task.host_ports.iter().copied());
    }
}

/// What one task asks of a node. A request of 0 for a resource asks for none of it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TaskRequest {
    /// CPU in cores.
    pub cpu: f64,
    /// Memory in bytes.
    pub memory: u64,
    /// Disk in bytes.
    pub disk: u64,
    /// Host ports the task binds explicitly; they must be free on the node.
    pub host_ports: BTreeSet<HostPort>,
    /// What the node's name and labels must satisfy, every one of them.
    pub constraints: Vec<Constraint>,
    /// What the task asks of its node's host (a pod's bind mounts, the host's network);
    /// `None` for a task that asks nothing, as every single container.
    pub host_needs: Option<Arc<HostNeeds>>,
}

impl TaskRequest {
    /// The request of a task: its declared `Cpu`, `Memory` and `Disk`, the host ports of its
    /// `PortBindings` and its `Constraints`. A binding with an empty host port (Docker chooses one), a host port
    /// of 0 (the same thing) or one that is not a port number claims no port.
    pub fn for_task(task: &Task) -> TaskRequest {
        let host_ports = task.fixed_host_ports().collect();
        TaskRequest {
            cpu: task.spec.cpu,
            memory: task.spec.memory,
            disk: task.spec.disk,
            host_ports,
            constraints: task.spec.constraints.clone(),
            host_needs: HostNeeds::of(task).map(Arc::new),
        }
    }

    /// The CPU asked for, in cores, with a negative or not-a-number request read as none.
    /// Validation refuses such requests before they get here; this keeps the sums sane if one
    /// slips through.
    pub fn cpu_cores(&self) -> f64 {
        if self.cpu > 0.0 { self.cpu } else { 0.0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_claims_only_fixed_host_ports() {
        let mut task = Task::new("web", "busybox");
        task.spec.cpu = 0.5;
        task.spec.memory = 64 << 20;
        task.spec.disk = 1 << 30;
        task.spec
            .port_bindings
            .insert("7777/tcp".into(), "7777".into());
        task.spec.port_bindings.insert("8080/tcp".into(), "".into());
        task.spec
            .port_bindings
            .insert("9090/tcp".into(), "0".into());
        task.spec
            .port_bindings
            .insert("53/udp".into(), "not-a-port".into());
        task.spec
            .port_bindings
            .insert("7777/udp".into(), "7777".into());
        task.spec.constraints = vec![Constraint {
            attribute: "label.zone".into(),
            operator: cube_types::Operator::Equal,
            value: "eu".into(),
        }];
        let request = TaskRequest::for_task(&task);
        assert_eq!(request.cpu, 0.5);
        assert_eq!(request.memory, 64 << 20);
        assert_eq!(request.disk, 1 << 30);
        assert_eq!(
            request.host_ports,
            BTreeSet::from([
                HostPort::tcp(7777),
                HostPort {
                    port: 7777,
                    protocol: cube_types::PortProtocol::Udp
                }
            ]),
            "the same number over two protocols is two ports"
        );
        assert_eq!(request.constraints, task.spec.constraints);
    }

    #[test]
    fn adding_a_task_allocates_its_resources_and_ports() {
        let mut node = NodeView {
            name: "w1".into(),
            ready: true,
            ineligible: false,
            ..NodeView::default()
        };
        let request = TaskRequest {
            cpu: 1.5,
            memory: 100,
            disk: 200,
            host_ports: BTreeSet::from([HostPort::tcp(80)]),
            ..TaskRequest::default()
        };
        node.add_task(&request);
        node.add_task(&TaskRequest {
            cpu: -1.0,
            ..TaskRequest::default()
        });
        assert_eq!(node.allocated.cpu, 1.5);
        assert_eq!(node.allocated.memory, 100);
        assert_eq!(node.allocated.disk, 200);
        assert_eq!(node.task_count, 2);
        assert_eq!(node.host_ports_taken, BTreeSet::from([HostPort::tcp(80)]));
    }

    #[test]
    fn a_node_view_is_ready_only_when_the_node_is() {
        let mut node = Node {
            name: "w1".into(),
            address: "http://w1:5556".into(),
            status: NodeStatus::Down,
            status_reason: None,
            capacity: Resources {
                cpu: 4.0,
                memory: 8 << 30,
                disk: 100 << 30,
            },
            allocated: Resources::default(),
            task_count: 3,
            stats: None,
            last_heartbeat: None,
            source: "registered".into(),
            labels: Labels::from([("zone".to_string(), "eu".to_string())]),
            eligible: true,
            drain: None,
            version: None,
            version_warning: None,
            volumes: Vec::new(),
            host_policy: None,
        };
        assert!(!NodeView::from_node(&node, BTreeSet::new()).ready);
        node.status = NodeStatus::Ready;
        let view = NodeView::from_node(&node, BTreeSet::from([HostPort::tcp(7777)]));
        assert!(view.ready);
        assert_eq!(view.task_count, 3);
        assert_eq!(view.capacity, node.capacity);
        assert_eq!(view.host_ports_taken, BTreeSet::from([HostPort::tcp(7777)]));
        assert_eq!(*view.labels, node.labels);
    }
}
