//! Properties of every placement, over random clusters and random streams of tasks: no node
//! is ever given more than it has, work goes only to ready nodes, "nothing fits" is said only
//! when nothing does, and each scheduler's one-pass placement decides what its three phases
//! decide. Sampled E-PVM is checked with the default sample and with tiny ones (so that most of
//! its walks stop early), and, given a sample as large as the cluster, against exhaustive E-PVM.

use std::collections::BTreeSet;

use cube_scheduler::filter::CPU_TOLERANCE_CORES;
use cube_scheduler::{
    Decision, Epvm, EpvmSampled, NodeView, SCHEDULER_NAMES, Scheduler, TaskRequest,
    place_in_phases, scheduler_by_name,
};
use cube_types::{HostPort, Resources};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;
/// Few ports, so that tasks collide on them often.
const PORTS: [u16; 4] = [80, 443, 7777, 8080];

fn ports() -> impl Strategy<Value = BTreeSet<HostPort>> {
    proptest::sample::subsequence(PORTS.to_vec(), 0..=2)
        .prop_map(|ports| ports.into_iter().map(HostPort::tcp).collect())
}

/// A node with capacities in tenths of a core and in MiB (0 included, memory often 4 or 8 GiB), something already
/// allocated (never more than the capacity), and sometimes not ready.
fn node() -> impl Strategy<Value = NodeView> {
    (
        prop::bool::weighted(0.8),
        0u32..=80,
        // Often one of two common sizes, so that nodes alike in size meet in one cluster.
        prop_oneof![Just(4 * 1024), Just(8 * 1024), 0u64..=16 * 1024],
        0u64..=16 * 1024,
        0u32..=100,
        0usize..=12,
        ports(),
    )
        .prop_map(
            |(ready, cpu_tenths, memory_mib, disk_mib, percent_used, task_count, ports)| {
                let capacity = Resources {
                    cpu: f64::from(cpu_tenths) / 10.0,
                    memory: memory_mib * MIB,
                    disk: disk_mib * MIB,
                };
                let used = |amount: u64| amount / 100 * u64::from(percent_used);
                NodeView {
                    name: String::new(),
                    ready,
                    ineligible: false,
                    capacity,
                    allocated: Resources {
                        cpu: capacity.cpu * f64::from(percent_used) / 100.0,
                        memory: used(capacity.memory),
                        disk: used(capacity.disk),
                    },
                    task_count,
                    host_ports_taken: ports,
                    labels: Default::default(),
                    host_policy: None,
                }
            },
        )
}

fn cluster() -> impl Strategy<Value = Vec<NodeView>> {
    prop::collection::vec(node(), 1..20).prop_map(|mut nodes| {
        for (index, node) in nodes.iter_mut().enumerate() {
            node.name = format!("w{index:02}");
        }
        nodes
    })
}

fn task() -> impl Strategy<Value = TaskRequest> {
    (0u32..=40, 0u64..=4 * 1024, 0u64..=4 * 1024, ports()).prop_map(
        |(cpu_tenths, memory_mib, disk_mib, host_ports)| TaskRequest {
            cpu: f64::from(cpu_tenths) / 10.0,
            memory: memory_mib * MIB,
            disk: disk_mib * MIB,
            host_ports,
            constraints: Vec::new(),
            host_needs: None,
        },
    )
}

/// Whether the node has room for the task, worked out without the scheduler's filters.
fn has_room(node: &NodeView, task: &TaskRequest) -> bool {
    let bytes_fit = |request: u64, allocated: u64, capacity: u64| {
        request == 0 || u128::from(allocated) + u128::from(request) <= u128::from(capacity)
    };
    node.ready
        && (task.cpu == 0.0
            || node.allocated.cpu + task.cpu <= node.capacity.cpu + CPU_TOLERANCE_CORES)
        && bytes_fit(task.memory, node.allocated.memory, node.capacity.memory)
        && bytes_fit(task.disk, node.allocated.disk, node.capacity.disk)
        && task.host_ports.is_disjoint(&node.host_ports_taken)
}

/// Places `tasks` one after the other with a scheduler made by `make`, applying each placement,
/// and checks every decision; a second scheduler from `make` runs the three phases alongside.
fn check_stream(
    make: impl Fn() -> Box<dyn Scheduler>,
    mut nodes: Vec<NodeView>,
    tasks: &[TaskRequest],
) -> Result<(), TestCaseError> {
    let mut scheduler = make();
    let mut phased = make();
    let scheduler_name = scheduler.name();
    for task in tasks {
        let decision = scheduler.place(task, &nodes);
        prop_assert_eq!(
            &decision,
            &place_in_phases(phased.as_mut(), task, &nodes),
            "{}: the one-pass placement and the three phases disagree",
            scheduler_name
        );
        match decision {
            Decision::Placed { index, name } => {
                let node = &mut nodes[index];
                prop_assert_eq!(&node.name, &name);
                prop_assert!(
                    node.ready,
                    "{} placed on {}, which is down",
                    scheduler_name,
                    name
                );
                prop_assert!(
                    has_room(node, task),
                    "{} placed on {}, which has no room",
                    scheduler_name,
                    name
                );
                node.add_task(task);
                prop_assert!(node.allocated.cpu <= node.capacity.cpu + CPU_TOLERANCE_CORES);
                prop_assert!(node.allocated.memory <= node.capacity.memory);
                prop_assert!(node.allocated.disk <= node.capacity.disk);
            }
            Decision::NoFit { reasons } => {
                prop_assert!(
                    !nodes.iter().any(|node| has_room(node, task)),
                    "{} found no fit, but a node has room",
                    scheduler_name
                );
                let rejected: Vec<&str> = reasons.iter().map(|r| r.node.as_str()).collect();
                let all: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
                prop_assert_eq!(rejected, all, "every node gets a reason");
                prop_assert!(reasons.iter().all(|r| !r.reason.is_empty()));
            }
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn no_node_is_ever_given_more_than_it_has(
        nodes in cluster(),
        tasks in prop::collection::vec(task(), 1..60),
    ) {
        // Capacities the generator gave as already over-committed would make the property
        // vacuous; it never does, and this says so.
        for node in &nodes {
            prop_assert!(node.allocated.cpu <= node.capacity.cpu + CPU_TOLERANCE_CORES);
            prop_assert!(node.allocated.memory <= node.capacity.memory);
        }
        for name in SCHEDULER_NAMES {
            check_stream(|| scheduler_by_name(name).expect("a known scheduler"), nodes.clone(), &tasks)?;
        }
        for sample_size in [1, 2, 3] {
            check_stream(
                || Box::new(EpvmSampled::with_seed(sample_size as u64).with_sample_size(sample_size)),
                nodes.clone(),
                &tasks,
            )?;
        }
    }

    #[test]
    fn a_sample_as_large_as_the_cluster_decides_what_exhaustive_epvm_decides(
        mut nodes in cluster(),
        tasks in prop::collection::vec(task(), 1..60),
        seed in any::<u64>(),
    ) {
        let mut sampled = EpvmSampled::with_seed(seed).with_sample_size(nodes.len());
        let mut exhaustive = Epvm::new();
        for task in &tasks {
            let decision = sampled.place(task, &nodes);
            prop_assert_eq!(&decision, &exhaustive.place(task, &nodes));
            prop_assert_eq!(sampled.max_jobs(), exhaustive.max_jobs());
            if let Decision::Placed { index, .. } = decision {
                nodes[index].add_task(task);
            }
        }
    }
}
