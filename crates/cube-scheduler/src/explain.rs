//! Why a task fits nowhere, in words that stay short however large the cluster: a few nodes
//! are named one by one; more are counted by reason ("599 nodes: 598 short of memory (most
//! free 1.5 GiB), 1 with port 7777 taken"), and a request bigger than every node says so
//! first. The per-node list stays available ([`crate::describe_rejections`]) for whoever
//! asks for it.

use std::collections::{BTreeMap, BTreeSet};

use cube_types::size::format_size;
use cube_types::{Constraint, Operator};

use crate::Rejection;
use crate::filter::{
    ConstraintFilter, CpuFilter, DiskFilter, EligibleFilter, Filter, HostPortFilter, MemoryFilter,
    ReadyFilter,
};
use crate::view::{NodeView, TaskRequest};

/// Up to this many refused nodes are named one by one; more are counted.
pub const NAMED_NODES_MAX: usize = 3;

/// The reason a task waits, from the nodes it was refused by. `nodes` is the snapshot the
/// rejections were made on (every node, refused or not).
pub fn summarize_rejections(
    task: &TaskRequest,
    nodes: &[NodeView],
    rejections: &[Rejection],
) -> String {
    if nodes.is_empty() {
        return "no nodes have joined the cluster".to_string();
    }
    let body = if rejections.len() <= NAMED_NODES_MAX {
        crate::describe_rejections(rejections)
    } else {
        counted(task, nodes, rejections)
    };
    match too_big_for_every_node(task, nodes) {
        Some(why) => format!("{why}; {body}"),
        None => body,
    }
}

/// "no node could hold it today: needs 16.0 TiB memory, the largest node has 8.0 GiB" when
/// the request is bigger than every node's whole capacity (not only what is free now). A
/// bigger node may join later, so this is a reason to wait, not to refuse.
pub fn too_big_for_every_node(task: &TaskRequest, nodes: &[NodeView]) -> Option<String> {
    if nodes.is_empty() {
        return None;
    }
    let largest_cpu = nodes.iter().map(|n| n.capacity.cpu).fold(0.0, f64::max);
    let largest_memory = nodes.iter().map(|n| n.capacity.memory).max().unwrap_or(0);
    let largest_disk = nodes.iter().map(|n| n.capacity.disk).max().unwrap_or(0);
    let mut needs = Vec::new();
    if task.cpu_cores() > largest_cpu + crate::filter::CPU_TOLERANCE_CORES {
        needs.push(format!(
            "needs {} CPU, the largest node has {largest_cpu}",
            task.cpu_cores()
        ));
    }
    if task.memory > largest_memory {
        needs.push(format!(
            "needs {} memory, the largest node has {}",
            format_size(task.memory),
            format_size(largest_memory)
        ));
    }
    if task.disk > largest_disk {
        needs.push(format!(
            "needs {} disk, the largest node has {}",
            format_size(task.disk),
            format_size(largest_disk)
        ));
    }
    if needs.is_empty() {
        None
    } else {
        Some(format!("no node could hold it today: {}", needs.join(", ")))
    }
}

/// `node` as it would be empty, ready and in service.
fn emptied(node: &NodeView) -> NodeView {
    NodeView {
        ready: true,
        ineligible: false,
        allocated: cube_types::Resources::default(),
        task_count: 0,
        host_ports_taken: BTreeSet::new(),
        ..node.clone()
    }
}

/// Whether `node`, empty, ready and in service, could hold the task: a submission that fits
/// one such node is told nothing, and is found at the first one, without a look at the rest.
pub fn fits_empty(task: &TaskRequest, node: &NodeView) -> bool {
    crate::FilterChain::standard().admits(task, &emptied(node))
}

/// Why no node known today could hold the task even empty, ready and in service, or `None`
/// when one could (or when no node has joined: nothing can be said). What a submission is
/// answered with as a warning: the request is accepted and waits, since nodes join later
/// (a bigger one, one with the right labels, one back from maintenance).
///
/// In the words a user needs: `no node could hold it today: needs 16.0 GiB memory, the
/// largest node has 8.0 GiB`; `no node matches label.zone = eu (0 of 3)`; otherwise every
/// node's own reason (`no node could hold it today, even empty: ...`).
pub fn fits_no_node_today(task: &TaskRequest, nodes: &[NodeView]) -> Option<String> {
    if nodes.is_empty() || nodes.iter().any(|node| fits_empty(task, node)) {
        return None;
    }
    let empty: Vec<NodeView> = nodes.iter().map(emptied).collect();
    let chain = crate::FilterChain::standard();
    let rejections = chain.rejections(task, &empty);
    if let Some(why) = too_big_for_every_node(task, &empty) {
        return Some(why);
    }
    let total = empty.len();
    if let Some(constraint) = task.constraints.iter().find(|constraint| {
        !empty
            .iter()
            .any(|node| constraint.admits(&node.name, &node.labels))
    }) {
        return Some(format!(
            "no node matches {} (0 of {total})",
            describe(constraint)
        ));
    }
    Some(format!(
        "no node could hold it today, even empty: {}",
        summarize_rejections(task, &empty, &rejections)
    ))
}

/// What kept one node out, for counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    NotReady,
    Ineligible,
    /// The first unmet constraint is the task's constraint number `.0`.
    Constraint(usize),
    Cpu,
    Memory,
    Disk,
    Ports,
    /// A filter this module does not know (a later constraint): its own words are kept.
    Other,
}

fn counted(task: &TaskRequest, nodes: &[NodeView], rejections: &[Rejection]) -> String {
    let by_name: BTreeMap<&str, &NodeView> = nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let mut counts: BTreeMap<Kind, usize> = BTreeMap::new();
    let mut most_free_cpu = 0.0f64;
    let (mut most_free_memory, mut most_free_disk) = (0u64, 0u64);
    let mut ports_taken: BTreeSet<cube_types::HostPort> = BTreeSet::new();
    let mut others: BTreeMap<&str, usize> = BTreeMap::new();
    for rejection in rejections {
        let Some(node) = by_name.get(rejection.node.as_str()) else {
            continue;
        };
        let kind = if !ReadyFilter.admits(task, node) {
            Kind::NotReady
        } else if !EligibleFilter.admits(task, node) {
            Kind::Ineligible
        } else if let Some((index, _)) = ConstraintFilter::first_unmet(task, node) {
            Kind::Constraint(index)
        } else if !CpuFilter.admits(task, node) {
            most_free_cpu = most_free_cpu.max(node.capacity.cpu - node.allocated.cpu);
            Kind::Cpu
        } else if !MemoryFilter.admits(task, node) {
            most_free_memory =
                most_free_memory.max(node.capacity.memory.saturating_sub(node.allocated.memory));
            Kind::Memory
        } else if !DiskFilter.admits(task, node) {
            most_free_disk =
                most_free_disk.max(node.capacity.disk.saturating_sub(node.allocated.disk));
            Kind::Disk
        } else if !HostPortFilter.admits(task, node) {
            ports_taken.extend(task.host_ports.intersection(&node.host_ports_taken));
            Kind::Ports
        } else {
            *others.entry(rejection.reason.as_str()).or_default() += 1;
            Kind::Other
        };
        *counts.entry(kind).or_default() += 1;
    }
    let mut parts: Vec<String> = Vec::new();
    for (kind, count) in &counts {
        let part = match kind {
            Kind::NotReady => format!("{count} not Ready"),
            Kind::Ineligible => format!("{count} ineligible"),
            Kind::Constraint(index) => {
                format!(
                    "{count} not matching {}",
                    describe(&task.constraints[*index])
                )
            }
            Kind::Cpu => format!(
                "{count} short of CPU (most free {:.1})",
                most_free_cpu.max(0.0)
            ),
            Kind::Memory => format!(
                "{count} short of memory (most free {})",
                format_size(most_free_memory)
            ),
            Kind::Disk => format!(
                "{count} short of disk (most free {})",
                format_size(most_free_disk)
            ),
            Kind::Ports => {
                let ports: Vec<String> = ports_taken.iter().map(ToString::to_string).collect();
                let word = if ports.len() == 1 { "port" } else { "ports" };
                format!("{count} with {word} {} taken", ports.join(", "))
            }
            Kind::Other => continue,
        };
        parts.push(part);
    }
    parts.extend(
        others
            .iter()
            .map(|(reason, count)| format!("{count}: {reason}")),
    );
    let total = nodes.len();
    let word = if total == 1 { "node" } else { "nodes" };
    format!("{total} {word}: {}", parts.join(", "))
}

/// A constraint as the user wrote it: `label.zone = eu`, `label.disk exists`.
fn describe(constraint: &Constraint) -> String {
    match constraint.operator {
        Operator::Exists => format!("{} exists", constraint.attribute),
        operator => format!(
            "{} {} {}",
            constraint.attribute,
            operator.symbol(),
            constraint.value
        ),
    }
}

#[cfg(test)]
mod tests {
    use cube_types::Resources;

    use super::*;
    use crate::FilterChain;

    const GIB: u64 = 1 << 30;

    fn node(name: &str, memory_gib: u64, used_gib: u64) -> NodeView {
        NodeView {
            name: name.into(),
            ready: true,
            ineligible: false,
            capacity: Resources {
                cpu: 4.0,
                memory: memory_gib * GIB,
                disk: 100 * GIB,
            },
            allocated: Resources {
                cpu: 0.0,
                memory: used_gib * GIB,
                disk: 0,
            },
            ..NodeView::default()
        }
    }

    fn explain(task: &TaskRequest, nodes: &[NodeView]) -> String {
        let rejections = FilterChain::standard().rejections(task, nodes);
        summarize_rejections(task, nodes, &rejections)
    }

    #[test]
    fn a_large_cluster_is_counted_by_reason_not_listed_node_by_node() {
        let mut nodes: Vec<NodeView> = (0..598)
            .map(|n| node(&format!("w{n:03}"), 4, if n == 7 { 2 } else { 3 }))
            .collect();
        let mut busy = node("w598", 8, 0);
        busy.host_ports_taken
            .insert(cube_types::HostPort::tcp(7777));
        nodes.push(busy);
        let task = TaskRequest {
            memory: 3 * GIB,
            host_ports: [cube_types::HostPort::tcp(7777)].into(),
            ..TaskRequest::default()
        };
        let reason = explain(&task, &nodes);
        assert_eq!(
            reason,
            "599 nodes: 598 short of memory (most free 2.0 GiB), 1 with port 7777 taken"
        );
        assert!(reason.len() < 120, "{reason}");
    }

    #[test]
    fn a_few_nodes_are_named_one_by_one() {
        let nodes = [node("w1", 4, 3), node("w2", 4, 0)];
        let task = TaskRequest {
            memory: 2 * GIB,
            ..TaskRequest::default()
        };
        let mut nodes = nodes.to_vec();
        nodes[1].ready = false;
        assert_eq!(
            explain(&task, &nodes),
            "w1: needs 2.0 GiB memory, 1.0 GiB free; w2: node is not Ready"
        );
    }

    #[test]
    fn a_request_bigger_than_every_node_says_so_first() {
        let nodes = [node("w1", 4, 0), node("w2", 8, 0)];
        let task = TaskRequest {
            memory: 16 * 1024 * GIB,
            ..TaskRequest::default()
        };
        let reason = explain(&task, &nodes);
        assert!(
            reason.starts_with(
                "no node could hold it today: needs 16.0 TiB memory, the largest node has 8.0 GiB; "
            ),
            "{reason}"
        );
    }

    #[test]
    fn nodes_refused_by_a_constraint_are_counted_under_it() {
        let mut nodes: Vec<NodeView> = (0..5).map(|n| node(&format!("w{n}"), 4, 0)).collect();
        for (index, node) in nodes.iter_mut().enumerate() {
            let zone = if index < 3 { "us" } else { "eu" };
            node.labels = std::sync::Arc::new([("zone".to_string(), zone.to_string())].into());
        }
        nodes[4].allocated.memory = 4 * GIB;
        let task = TaskRequest {
            memory: GIB,
            constraints: vec![
                Constraint {
                    attribute: "label.zone".into(),
                    operator: Operator::Equal,
                    value: "eu".into(),
                },
                Constraint {
                    attribute: "node.name".into(),
                    operator: Operator::NotEqual,
                    value: "w3".into(),
                },
            ],
            ..TaskRequest::default()
        };
        assert_eq!(
            explain(&task, &nodes),
            "5 nodes: 3 not matching label.zone = eu, 1 not matching node.name != w3, \
             1 short of memory (most free 0 B)"
        );
        let exists = Constraint {
            attribute: "label.gpu".into(),
            operator: Operator::Exists,
            value: String::new(),
        };
        assert_eq!(describe(&exists), "label.gpu exists");
    }

    #[test]
    fn a_few_nodes_refused_by_a_constraint_name_it() {
        let mut nodes = vec![node("w1", 4, 0), node("w2", 4, 0)];
        nodes[1].labels = std::sync::Arc::new([("zone".to_string(), "us".to_string())].into());
        let task = TaskRequest {
            constraints: vec![Constraint {
                attribute: "label.zone".into(),
                operator: Operator::Equal,
                value: "ap".into(),
            }],
            ..TaskRequest::default()
        };
        assert_eq!(
            explain(&task, &nodes),
            r#"w1: label.zone is not set, wants "ap"; w2: label.zone is "us", wants "ap""#
        );
    }

    #[test]
    fn a_request_no_node_could_hold_even_empty_says_why_in_a_users_words() {
        let mut nodes = vec![node("w1", 4, 4), node("w2", 8, 8), node("w3", 8, 0)];
        nodes[0].ready = false;
        nodes[1].ineligible = true;
        for node in &mut nodes {
            node.labels = std::sync::Arc::new([("zone".to_string(), "eu".to_string())].into());
        }
        // Full, down or out of service today, but each could hold it: nothing to warn of.
        let fits = TaskRequest {
            memory: 8 * GIB,
            host_ports: [cube_types::HostPort::tcp(7777)].into(),
            ..TaskRequest::default()
        };
        nodes[2]
            .host_ports_taken
            .insert(cube_types::HostPort::tcp(7777));
        nodes[2].allocated.memory = 8 * GIB;
        assert_eq!(fits_no_node_today(&fits, &nodes), None);
        let big = TaskRequest {
            memory: 16 * GIB,
            ..TaskRequest::default()
        };
        assert_eq!(
            fits_no_node_today(&big, &nodes).as_deref(),
            Some(
                "no node could hold it today: needs 16.0 GiB memory, the largest node has 8.0 GiB"
            )
        );
        let elsewhere = TaskRequest {
            constraints: vec![Constraint {
                attribute: "label.zone".into(),
                operator: Operator::Equal,
                value: "eu-wset".into(),
            }],
            ..TaskRequest::default()
        };
        assert_eq!(
            fits_no_node_today(&elsewhere, &nodes).as_deref(),
            Some("no node matches label.zone = eu-wset (0 of 3)")
        );
        assert_eq!(
            fits_no_node_today(&big, &[]),
            None,
            "no node has joined yet"
        );
    }

    #[test]
    fn an_empty_cluster_says_no_node_has_joined() {
        assert_eq!(
            explain(&TaskRequest::default(), &[]),
            "no nodes have joined the cluster"
        );
    }
}
