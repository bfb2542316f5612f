//! Feasibility: can this node take this task at all? A chain of small filters, each asking
//! one question about one node. The first filter that says no gives the node's reason.
//!
//! Filters run for every node on every placement, so the question (`admits`) must not
//! allocate; the reason, a string, is built only for a node that was refused.

use cube_types::size::format_size;

use crate::Rejection;
use crate::view::{NodeView, TaskRequest};

/// Slack allowed when adding CPU requests, in cores. CPU is a float, so `0.1 + 0.2` on a node
/// of `0.3` cores comes to `0.30000000000000004`; the slack lets it fit. One nano-CPU is Docker's
/// own unit (`NanoCpus`), and summing even millions of requests stays well inside it.
pub const CPU_TOLERANCE_CORES: f64 = 1e-9;

/// One question about one node.
pub trait Filter: Send + Sync {
    /// Whether the node can take the task. Must not allocate.
    fn admits(&self, task: &TaskRequest, node: &NodeView) -> bool;

    /// Why the node cannot take the task, as a short phrase ("port 7777 taken"). Called only
    /// for a node that [`Filter::admits`] refused.
    fn reason(&self, task: &TaskRequest, node: &NodeView) -> String;

    /// The question and, when the answer is no, the reason.
    fn check(&self, task: &TaskRequest, node: &NodeView) -> Result<(), String> {
        if self.admits(task, node) {
            Ok(())
        } else {
            Err(self.reason(task, node))
        }
    }

    /// This filter, then `next` for the nodes this one admits.
    fn then<Next: Filter>(self, next: Next) -> Then<Self, Next>
    where
        Self: Sized,
    {
        Then { first: self, next }
    }
}

/// Two filters asked in order: a node must pass both, and the first to refuse gives the
/// reason. Chains are built from it at compile time, so asking a whole chain about a node is
/// one call with every question inlined, not one indirect call per filter.
pub struct Then<First, Next> {
    first: First,
    next: Next,
}

impl<First: Filter, Next: Filter> Filter for Then<First, Next> {
    fn admits(&self, task: &TaskRequest, node: &NodeView) -> bool {
        self.first.admits(task, node) && self.next.admits(task, node)
    }

    fn reason(&self, task: &TaskRequest, node: &NodeView) -> String {
        if self.first.admits(task, node) {
            self.next.reason(task, node)
        } else {
            self.first.reason(task, node)
        }
    }
}

/// The filters a scheduler asks, as one chain.
pub struct FilterChain {
    filters: Box<dyn Filter>,
}

impl FilterChain {
    /// The chain every scheduler uses, asked top to bottom. A new constraint is one filter
    /// and one line here.
    pub fn standard() -> FilterChain {
        FilterChain::new(
            ReadyFilter
                .then(EligibleFilter)
                .then(ConstraintFilter)
                .then(HostPolicyFilter)
                .then(CpuFilter)
                .then(MemoryFilter)
                .then(DiskFilter)
                .then(HostPortFilter),
        )
    }

    /// A chain of the given filters (usually several joined with [`Filter::then`]).
    pub fn new(filters: impl Filter + 'static) -> FilterChain {
        FilterChain {
            filters: Box::new(filters),
        }
    }

    /// Whether every filter admits the node. Does not allocate.
    pub fn admits(&self, task: &TaskRequest, node: &NodeView) -> bool {
        self.filters.admits(task, node)
    }

    /// The reason of the first filter that refuses the node.
    pub fn check(&self, task: &TaskRequest, node: &NodeView) -> Result<(), String> {
        self.filters.check(task, node)
    }

    /// The indices of the nodes that can take the task, and a reason for each that cannot.
    pub fn select(&self, task: &TaskRequest, nodes: &[NodeView]) -> (Vec<usize>, Vec<Rejection>) {
        let mut feasible = Vec::with_capacity(nodes.len());
        let mut rejections = Vec::new();
        for (index, node) in nodes.iter().enumerate() {
            if self.admits(task, node) {
                feasible.push(index);
            } else {
                rejections.push(self.rejection(task, node));
            }
        }
        (feasible, rejections)
    }

    /// A reason for each node that cannot take the task.
    pub fn rejections(&self, task: &TaskRequest, nodes: &[NodeView]) -> Vec<Rejection> {
        nodes
            .iter()
            .filter(|node| !self.admits(task, node))
            .map(|node| self.rejection(task, node))
            .collect()
    }

    /// The rejection of a node the chain refused.
    pub fn rejection(&self, task: &TaskRequest, node: &NodeView) -> Rejection {
        Rejection {
            node: node.name.clone(),
            reason: self.filters.reason(task, node),
        }
    }
}

/// Is the node `Ready`? A node that missed its heartbeats takes no work.
pub struct ReadyFilter;

impl Filter for ReadyFilter {
    fn admits(&self, _task: &TaskRequest, node: &NodeView) -> bool {
        node.ready
    }

    fn reason(&self, _task: &TaskRequest, _node: &NodeView) -> String {
        "node is not Ready".to_string()
    }
}

/// Does the node take new work? An operator takes a node out of service to drain it or to
/// work on it (`cube node eligibility NAME --disable`).
pub struct EligibleFilter;

impl Filter for EligibleFilter {
    fn admits(&self, _task: &TaskRequest, node: &NodeView) -> bool {
        !node.ineligible
    }

    fn reason(&self, _task: &TaskRequest, _node: &NodeView) -> String {
        "node is ineligible (drained or taken out of service)".to_string()
    }
}

/// Do the node's name and labels satisfy every constraint of the task (`label.zone = eu`)?
pub struct ConstraintFilter;

impl ConstraintFilter {
    /// The first of the task's constraints the node does not satisfy, with its index.
    pub fn first_unmet<'a>(
        task: &'a TaskRequest,
        node: &NodeView,
    ) -> Option<(usize, &'a cube_types::Constraint)> {
        task.constraints
            .iter()
            .enumerate()
            .find(|(_, constraint)| !constraint.admits(&node.name, &node.labels))
    }
}

impl Filter for ConstraintFilter {
    fn admits(&self, task: &TaskRequest, node: &NodeView) -> bool {
        task.constraints
            .iter()
            .all(|constraint| constraint.admits(&node.name, &node.labels))
    }

    /// The first unmet constraint's own words: `label.zone is "us", wants "eu"`.
    fn reason(&self, task: &TaskRequest, node: &NodeView) -> String {
        match ConstraintFilter::first_unmet(task, node) {
            Some((_, constraint)) => constraint.reason(&node.name, &node.labels),
            None => "constraints met".to_string(),
        }
    }
}

/// Does the node's worker let the task reach what it asks of the host (a pod's bind mounts,
/// the host's network)? A node whose worker did not report its policy is not refused here:
/// the worker's own check decides.
pub struct HostPolicyFilter;

impl Filter for HostPolicyFilter {
    fn admits(&self, task: &TaskRequest, node: &NodeView) -> bool {
        match (&task.host_needs, &node.host_policy) {
            (Some(needs), Some(policy)) => policy.allows(needs),
            _ => true,
        }
    }

    /// The policy's own words, naming the setting: `host policy: services.a: bind mount of
    /// /srv is not under the node's allowed_host_paths (none)`.
    fn reason(&self, task: &TaskRequest, node: &NodeView) -> String {
        let refusal = match (&task.host_needs, &node.host_policy) {
            (Some(needs), Some(policy)) => policy.refusal(needs),
            _ => None,
        };
        format!(
            "host policy: {}",
            refusal.unwrap_or_else(|| "allowed".to_string())
        )
    }
}

/// Do the CPU cores allocated on the node leave room for the task's?
pub struct CpuFilter;

impl Filter for CpuFilter {
    fn admits(&self, task: &TaskRequest, node: &NodeView) -> bool {
        let request = task.cpu_cores();
        request == 0.0 || node.allocated.cpu + request <= node.capacity.cpu + CPU_TOLERANCE_CORES
    }

    fn reason(&self, task: &TaskRequest, node: &NodeView) -> String {
        let free = (node.capacity.cpu - node.allocated.cpu).max(0.0);
        let (needed, available) = distinct_cores(task.cpu_cores(), free);
        format!("needs {needed} CPU, {available} free")
    }
}

/// Does the memory allocated on the node leave room for the task's?
pub struct MemoryFilter;

impl Filter for MemoryFilter {
    fn admits(&self, task: &TaskRequest, node: &NodeView) -> bool {
        bytes_fit(task.memory, node.allocated.memory, node.capacity.memory)
    }

    fn reason(&self, task: &TaskRequest, node: &NodeView) -> String {
        bytes_shortfall(
            "memory",
            task.memory,
            node.allocated.memory,
            node.capacity.memory,
        )
    }
}

/// Does the disk allocated on the node leave room for the task's?
pub struct DiskFilter;

impl Filter for DiskFilter {
    fn admits(&self, task: &TaskRequest, node: &NodeView) -> bool {
        bytes_fit(task.disk, node.allocated.disk, node.capacity.disk)
    }

    fn reason(&self, task: &TaskRequest, node: &NodeView) -> String {
        bytes_shortfall("disk", task.disk, node.allocated.disk, node.capacity.disk)
    }
}

/// Are the host ports the task binds still free on the node?
pub struct HostPortFilter;

impl Filter for HostPortFilter {
    fn admits(&self, task: &TaskRequest, node: &NodeView) -> bool {
        task.host_ports
            .iter()
            .all(|port| !node.host_ports_taken.contains(port))
    }

    fn reason(&self, task: &TaskRequest, node: &NodeView) -> String {
        let taken: Vec<String> = task
            .host_ports
            .intersection(&node.host_ports_taken)
            .map(ToString::to_string)
            .collect();
        match taken.as_slice() {
            [port] => format!("port {port} taken"),
            ports => format!("ports {} taken", ports.join(", ")),
        }
    }
}

/// A request of 0 always fits; otherwise allocated plus requested must stay within capacity.
fn bytes_fit(request: u64, allocated: u64, capacity: u64) -> bool {
    request == 0
        || allocated
            .checked_add(request)
            .is_some_and(|total| total <= capacity)
}

/// "needs 2.0 GiB memory, 1.1 GiB free". When rounding would make the two sizes read the
/// same, the exact bytes follow, so the reason never looks like it contradicts itself.
fn bytes_shortfall(resource: &str, request: u64, allocated: u64, capacity: u64) -> String {
    let free = capacity.saturating_sub(allocated);
    let (needed, available) = (format_size(request), format_size(free));
    if needed == available {
        format!("needs {needed} ({request} B) {resource}, {available} ({free} B) free")
    } else {
        format!("needs {needed} {resource}, {available} free")
    }
}

/// Two amounts of cores written with one decimal, or with as many as it takes to tell them
/// apart (0.25 needed, 0.2 free would otherwise both read "0.2").
fn distinct_cores(needed: f64, free: f64) -> (String, String) {
    for decimals in [1, 3] {
        let (needed_text, free_text) =
            (format!("{needed:.decimals$}"), format!("{free:.decimals$}"));
        if needed_text != free_text {
            return (needed_text, free_text);
        }
    }
    (needed.to_string(), free.to_string())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use cube_types::{Constraint, HostPort, Operator, Resources};

    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    fn node(capacity: Resources, allocated: Resources) -> NodeView {
        NodeView {
            name: "w1".into(),
            ready: true,
            ineligible: false,
            capacity,
            allocated,
            task_count: 0,
            host_ports_taken: BTreeSet::new(),
            labels: Default::default(),
            host_policy: None,
        }
    }

    fn resources(cpu: f64, memory: u64, disk: u64) -> Resources {
        Resources { cpu, memory, disk }
    }

    fn request(cpu: f64, memory: u64, disk: u64) -> TaskRequest {
        TaskRequest {
            cpu,
            memory,
            disk,
            host_ports: BTreeSet::new(),
            constraints: Vec::new(),
            host_needs: None,
        }
    }

    fn constrained(attribute: &str, operator: Operator, value: &str) -> TaskRequest {
        TaskRequest {
            constraints: vec![Constraint {
                attribute: attribute.into(),
                operator,
                value: value.into(),
            }],
            ..TaskRequest::default()
        }
    }

    fn labelled(name: &str, labels: &[(&str, &str)]) -> NodeView {
        NodeView {
            name: name.into(),
            ready: true,
            ineligible: false,
            labels: std::sync::Arc::new(
                labels
                    .iter()
                    .map(|(key, value)| (key.to_string(), value.to_string()))
                    .collect(),
            ),
            ..NodeView::default()
        }
    }

    #[test]
    fn a_node_whose_host_policy_refuses_a_pods_bind_mount_is_refused_naming_the_setting() {
        let needs = cube_types::HostNeeds {
            bind_mounts: vec![("db".to_string(), "/srv/data".to_string())],
            host_network: false,
        };
        let task = TaskRequest {
            host_needs: Some(std::sync::Arc::new(needs)),
            ..TaskRequest::default()
        };
        let policy = |paths: &[&str]| {
            Some(std::sync::Arc::new(cube_types::HostPolicy {
                allowed_host_paths: paths.iter().map(|path| path.to_string()).collect(),
                ..cube_types::HostPolicy::default()
            }))
        };
        let mut strict = labelled("w1", &[]);
        strict.host_policy = policy(&[]);
        let mut open = labelled("w2", &[]);
        open.host_policy = policy(&["/srv"]);
        let unknown = labelled("w3", &[]);
        assert_eq!(
            HostPolicyFilter.check(&task, &strict),
            Err(
                "host policy: services.db: bind mount of /srv/data is not under the node's \
                 allowed_host_paths (none)"
                    .to_string()
            )
        );
        assert_eq!(HostPolicyFilter.check(&task, &open), Ok(()));
        assert_eq!(
            HostPolicyFilter.check(&task, &unknown),
            Ok(()),
            "a worker that did not say decides itself"
        );
        assert!(
            HostPolicyFilter.admits(&TaskRequest::default(), &strict),
            "a task that asks nothing of the host"
        );
        let chain = FilterChain::standard();
        let mut nodes = [strict, open];
        for node in &mut nodes {
            node.capacity = Resources {
                cpu: 1.0,
                memory: 1 << 30,
                disk: 0,
            };
        }
        let rejections = chain.rejections(&task, &nodes);
        assert_eq!(rejections.len(), 1);
        assert_eq!(rejections[0].node, "w1");
    }

    #[test]
    fn equal_admits_only_the_node_with_that_label_value() {
        let task = constrained("label.zone", Operator::Equal, "eu");
        assert_eq!(
            ConstraintFilter.check(&task, &labelled("w1", &[("zone", "eu")])),
            Ok(())
        );
        assert_eq!(
            ConstraintFilter.check(&task, &labelled("w2", &[("zone", "us")])),
            Err(r#"label.zone is "us", wants "eu""#.to_string())
        );
        assert_eq!(
            ConstraintFilter.check(&task, &labelled("w3", &[])),
            Err(r#"label.zone is not set, wants "eu""#.to_string())
        );
    }

    #[test]
    fn not_equal_admits_every_other_value_and_a_missing_label() {
        let task = constrained("label.zone", Operator::NotEqual, "eu");
        assert!(ConstraintFilter.admits(&task, &labelled("w2", &[("zone", "us")])));
        assert!(ConstraintFilter.admits(&task, &labelled("w3", &[])));
        assert_eq!(
            ConstraintFilter.check(&task, &labelled("w1", &[("zone", "eu")])),
            Err(r#"label.zone is "eu", wants anything but "eu""#.to_string())
        );
    }

    #[test]
    fn in_admits_any_value_of_the_list() {
        let task = constrained("label.zone", Operator::In, "eu, ap");
        assert!(ConstraintFilter.admits(&task, &labelled("w1", &[("zone", "eu")])));
        assert!(ConstraintFilter.admits(&task, &labelled("w2", &[("zone", "ap")])));
        assert!(!ConstraintFilter.admits(&task, &labelled("w4", &[])));
        assert_eq!(
            ConstraintFilter.check(&task, &labelled("w3", &[("zone", "us")])),
            Err(r#"label.zone is "us", wants one of eu, ap"#.to_string())
        );
    }

    #[test]
    fn not_in_refuses_every_value_of_the_list() {
        let task = constrained("label.zone", Operator::NotIn, "eu,ap");
        assert!(ConstraintFilter.admits(&task, &labelled("w3", &[("zone", "us")])));
        assert!(ConstraintFilter.admits(&task, &labelled("w4", &[])));
        assert_eq!(
            ConstraintFilter.check(&task, &labelled("w2", &[("zone", "ap")])),
            Err(r#"label.zone is "ap", wants none of eu,ap"#.to_string())
        );
    }

    #[test]
    fn exists_asks_only_for_the_label() {
        let task = constrained("label.disk", Operator::Exists, "");
        assert!(ConstraintFilter.admits(&task, &labelled("w1", &[("disk", "")])));
        assert_eq!(
            ConstraintFilter.check(&task, &labelled("w2", &[("zone", "eu")])),
            Err("label.disk is not set, wants it set".to_string())
        );
    }

    #[test]
    fn node_name_pins_a_task_to_one_node() {
        let task = constrained("node.name", Operator::Equal, "w2");
        assert!(ConstraintFilter.admits(&task, &labelled("w2", &[])));
        assert_eq!(
            ConstraintFilter.check(&task, &labelled("w1", &[("zone", "eu")])),
            Err(r#"node.name is "w1", wants "w2""#.to_string())
        );
    }

    #[test]
    fn the_first_unmet_constraint_gives_the_reason_and_none_admits_all() {
        let mut task = constrained("label.zone", Operator::Equal, "eu");
        task.constraints.push(Constraint {
            attribute: "label.disk".into(),
            operator: Operator::Equal,
            value: "ssd".into(),
        });
        let node = labelled("w1", &[("zone", "eu"), ("disk", "hdd")]);
        assert_eq!(
            ConstraintFilter.check(&task, &node),
            Err(r#"label.disk is "hdd", wants "ssd""#.to_string())
        );
        assert_eq!(
            ConstraintFilter.check(&TaskRequest::default(), &node),
            Ok(())
        );
    }

    #[test]
    fn the_standard_chain_asks_constraints_after_readiness() {
        let chain = FilterChain::standard();
        let task = constrained("label.zone", Operator::Equal, "eu");
        let mut us = labelled("w2", &[("zone", "us")]);
        assert_eq!(
            chain.check(&task, &us),
            Err(r#"label.zone is "us", wants "eu""#.to_string())
        );
        us.ready = false;
        assert_eq!(
            chain.check(&task, &us),
            Err("node is not Ready".to_string())
        );
    }

    #[test]
    fn a_node_that_is_down_is_refused_with_its_status() {
        let mut down = node(resources(4.0, 8 * GIB, 8 * GIB), Resources::default());
        down.ready = false;
        assert_eq!(
            ReadyFilter.check(&request(0.0, 0, 0), &down),
            Err("node is not Ready".to_string())
        );
        down.ready = true;
        assert_eq!(ReadyFilter.check(&request(0.0, 0, 0), &down), Ok(()));
    }

    #[test]
    fn cpu_must_fit_in_what_is_left_and_says_how_much_is_free() {
        let busy = node(resources(4.0, 0, 0), resources(3.5, 0, 0));
        assert_eq!(
            CpuFilter.check(&request(2.0, 0, 0), &busy),
            Err("needs 2.0 CPU, 0.5 free".to_string())
        );
        assert_eq!(CpuFilter.check(&request(0.5, 0, 0), &busy), Ok(()));
        assert_eq!(
            CpuFilter.check(
                &request(0.25, 0, 0),
                &node(resources(4.0, 0, 0), resources(3.8, 0, 0))
            ),
            Err("needs 0.250 CPU, 0.200 free".to_string())
        );
    }

    #[test]
    fn cpu_sums_that_land_exactly_on_capacity_fit_despite_float_rounding() {
        let after_one_tenth = node(resources(0.3, 0, 0), resources(0.1, 0, 0));
        assert!(
            after_one_tenth.allocated.cpu + 0.2 > after_one_tenth.capacity.cpu,
            "the float sum this test is about"
        );
        assert_eq!(
            CpuFilter.check(&request(0.2, 0, 0), &after_one_tenth),
            Ok(())
        );
    }

    #[test]
    fn memory_must_fit_in_what_is_left_and_reads_in_binary_units() {
        let busy = node(
            resources(0.0, 4 * GIB, 0),
            resources(0.0, 4 * GIB - 1126 * MIB, 0),
        );
        assert_eq!(
            MemoryFilter.check(&request(0.0, 2 * GIB, 0), &busy),
            Err("needs 2.0 GiB memory, 1.1 GiB free".to_string())
        );
        assert_eq!(
            MemoryFilter.check(&request(0.0, 1126 * MIB, 0), &busy),
            Ok(())
        );
        assert!(
            MemoryFilter
                .check(&request(0.0, 1126 * MIB + 1, 0), &busy)
                .is_err()
        );
    }

    #[test]
    fn a_shortfall_that_rounds_to_the_same_size_shows_exact_bytes() {
        let busy = node(resources(0.0, GIB, 0), Resources::default());
        assert_eq!(
            MemoryFilter.check(&request(0.0, GIB + 1, 0), &busy),
            Err(format!(
                "needs 1.0 GiB ({} B) memory, 1.0 GiB ({GIB} B) free",
                GIB + 1
            ))
        );
    }

    #[test]
    fn disk_must_fit_in_what_is_left() {
        let busy = node(resources(0.0, 0, 10 * GIB), resources(0.0, 0, 9 * GIB));
        assert_eq!(
            DiskFilter.check(&request(0.0, 0, 2 * GIB), &busy),
            Err("needs 2.0 GiB disk, 1.0 GiB free".to_string())
        );
        assert_eq!(DiskFilter.check(&request(0.0, 0, GIB), &busy), Ok(()));
    }

    #[test]
    fn a_request_of_nothing_fits_even_a_full_or_empty_node() {
        let nothing = request(0.0, 0, 0);
        let full = node(resources(1.0, GIB, GIB), resources(2.0, 2 * GIB, 2 * GIB));
        let empty = node(Resources::default(), Resources::default());
        for chain_node in [&full, &empty] {
            assert_eq!(CpuFilter.check(&nothing, chain_node), Ok(()));
            assert_eq!(MemoryFilter.check(&nothing, chain_node), Ok(()));
            assert_eq!(DiskFilter.check(&nothing, chain_node), Ok(()));
        }
    }

    #[test]
    fn a_request_too_large_to_add_does_not_overflow() {
        let busy = node(resources(0.0, u64::MAX, 0), resources(0.0, 10, 0));
        assert!(
            MemoryFilter
                .check(&request(0.0, u64::MAX, 0), &busy)
                .is_err()
        );
    }

    #[test]
    fn host_ports_already_taken_are_listed() {
        let mut busy = node(Resources::default(), Resources::default());
        busy.host_ports_taken = [80, 7777, 8080].map(HostPort::tcp).into();
        let mut web = request(0.0, 0, 0);
        web.host_ports = [7777].map(HostPort::tcp).into();
        assert_eq!(
            HostPortFilter.check(&web, &busy),
            Err("port 7777 taken".to_string())
        );
        web.host_ports = [8080, 7777, 9000].map(HostPort::tcp).into();
        assert_eq!(
            HostPortFilter.check(&web, &busy),
            Err("ports 7777, 8080 taken".to_string())
        );
        web.host_ports = [9000].map(HostPort::tcp).into();
        assert_eq!(HostPortFilter.check(&web, &busy), Ok(()));
    }

    #[test]
    fn the_first_filter_that_refuses_gives_the_reason() {
        let mut tight = node(resources(1.0, GIB, GIB), resources(1.0, GIB, GIB));
        tight.ready = false;
        let chain = FilterChain::standard();
        let big = request(1.0, GIB, GIB);
        assert_eq!(
            chain.check(&big, &tight),
            Err("node is not Ready".to_string())
        );
        tight.ready = true;
        assert_eq!(
            chain.check(&big, &tight),
            Err("needs 1.0 CPU, 0.0 free".to_string())
        );
        assert!(!chain.admits(&big, &tight));
        assert!(FilterChain::new(ReadyFilter).admits(&big, &tight));
    }

    #[test]
    fn selecting_splits_nodes_into_feasible_indices_and_reasons() {
        let mut nodes = vec![
            node(resources(2.0, GIB, GIB), Resources::default()),
            node(resources(2.0, GIB, GIB), resources(2.0, 0, 0)),
            node(resources(2.0, GIB, GIB), Resources::default()),
        ];
        for (index, node) in nodes.iter_mut().enumerate() {
            node.name = format!("w{}", index + 1);
        }
        let (feasible, rejections) = FilterChain::standard().select(&request(1.0, 0, 0), &nodes);
        assert_eq!(feasible, vec![0, 2]);
        assert_eq!(
            rejections,
            vec![Rejection {
                node: "w2".into(),
                reason: "needs 1.0 CPU, 0.0 free".into()
            }]
        );
    }
}
