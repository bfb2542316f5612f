//! How many placements a second a scheduler makes over a large cluster, one core, no IO.
//!
//! `cargo run --release -p cube-scheduler --example placement_rate -- [epvm|roundrobin]
//! [NODES] [PLACEMENTS] [uniform|mixed]`
//!
//! `uniform`: nodes of one size (32 cores, 64 GiB) and identical tasks (0.25 CPU, 256 MiB).
//! `mixed`: four node sizes interleaved in name order and tasks of varying size, so that
//! few nodes look alike. Each placement is applied to the snapshot before the next, as the
//! manager would.

use std::collections::BTreeSet;
use std::time::Instant;

use cube_scheduler::{Decision, NodeView, TaskRequest, scheduler_by_name};
use cube_types::Resources;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let scheduler_name = args.first().map_or("epvm", String::as_str);
    let node_count: usize = args.get(1).and_then(|n| n.parse().ok()).unwrap_or(10_000);
    let placements: usize = args.get(2).and_then(|n| n.parse().ok()).unwrap_or(100_000);
    let mixed = args.get(3).is_some_and(|shape| shape == "mixed");
    let Some(mut scheduler) = scheduler_by_name(scheduler_name) else {
        eprintln!("unknown scheduler {scheduler_name:?}: use epvm or roundrobin");
        std::process::exit(2);
    };

    let mut nodes: Vec<NodeView> = (0..node_count)
        .map(|index| {
            let memory = if mixed {
                16 * GIB * (1 + (index as u64 * 7919) % 4)
            } else {
                64 * GIB
            };
            NodeView {
                name: format!("w{index:06}"),
                ready: true,
                capacity: Resources {
                    cpu: 32.0,
                    memory,
                    disk: 1 << 40,
                },
                allocated: Resources::default(),
                task_count: 0,
                host_ports_taken: BTreeSet::new(),
            }
        })
        .collect();

    let started = Instant::now();
    let mut placed = 0;
    for round in 0..placements {
        let task = if mixed {
            TaskRequest {
                cpu: 0.05 * (1 + round % 5) as f64,
                memory: 64 * MIB * (1 + (round as u64 * 31) % 8),
                disk: GIB,
                host_ports: BTreeSet::new(),
            }
        } else {
            TaskRequest {
                cpu: 0.25,
                memory: 256 * MIB,
                disk: GIB,
                host_ports: BTreeSet::new(),
            }
        };
        if let Decision::Placed { index, .. } = scheduler.place(&task, &nodes) {
            nodes[index].add_task(&task);
            placed += 1;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{scheduler_name}: {placed} of {placements} placed over {node_count} {} nodes in \
         {seconds:.2} s: {:.0} placements/s",
        if mixed { "mixed" } else { "uniform" },
        placements as f64 / seconds
    );
}
