//! The waiting list alone, in process, no Docker and no worker: 1,000 nodes, each filled by
//! one task as large as the node, and 10,000 bare tasks waiting behind them (20 sizes). Timed:
//! one admission pass (the placement pass, which lets requests in whole and in order) when
//! nothing fits (a whole pass: every waiting request marked, as after a change that may have
//! made room), one when one node was freed (the head of the queue is let in), and what
//! `GET /queue` serialises (the list in order, with positions and why each waits), and one
//! look of the queue controller with nothing changed, whose store writes must be 0. Then
//! projects: 100 projects, each with a quota of one core already used, and 10,000 requests
//! waiting for their project's quota on nodes with room: one admission pass when every
//! request is held by its quota, and one after a project's task stopped (its first request
//! let in).
//!
//! ```text
//! cargo bench -p cube-manager --bench queue
//! ```

use std::time::Instant;

use cube_manager::bench_support::{
    admission_pass, fill_every_node, free_one, look_at_queue, manager_with_nodes, mark_all_waiting,
    queue_listing, quota_bound, submit_waiting,
};

const NODES: usize = 1_000;
const WAITING: usize = 10_000;
const SHAPES: usize = 20;
const RUNS: usize = 5;
const PROJECTS: usize = 100;

/// `--quick` (as CI's `scripts/bench-smoke.sh` runs it):
/// small sizes and one run, so that the assertions run in seconds in a debug build. The
/// figures it prints then mean nothing.
fn quick() -> bool {
    std::env::args().any(|arg| arg == "--quick")
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (nodes, waiting, shapes, runs) = match quick() {
        true => (20, 100, 4, 1),
        false => (NODES, WAITING, SHAPES, RUNS),
    };
    let manager = manager_with_nodes(nodes)?;
    let filled = runtime.block_on(fill_every_node(&manager, nodes))?;
    assert_eq!(filled, nodes, "every node filled");
    runtime.block_on(submit_waiting(&manager, waiting, shapes))?;
    let queue = manager.queue();
    assert_eq!(queue.len(), waiting + nodes, "every request in the list");

    let mut nothing_fits = Vec::new();
    for _ in 0..runs {
        // A whole pass, as after a change that may have made room: every request read.
        mark_all_waiting(&manager);
        let started = Instant::now();
        let placed = runtime.block_on(admission_pass(&manager))?;
        nothing_fits.push(started.elapsed().as_secs_f64() * 1e3);
        assert_eq!(placed, 0, "nothing fits");
    }
    let revision = manager.store_revision()?;
    let mut looks = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        runtime.block_on(look_at_queue(&manager))?;
        looks.push(started.elapsed().as_secs_f64() * 1e3);
    }
    runtime.block_on(admission_pass(&manager))?;
    let writes = manager.store_revision()? - revision;

    let mut listing = Vec::new();
    let mut bytes = 0;
    for _ in 0..runs {
        let started = Instant::now();
        let body = queue_listing(&manager)?;
        listing.push(started.elapsed().as_secs_f64() * 1e3);
        bytes = body.len();
    }

    let mut head_in = Vec::new();
    for run in 0..runs {
        runtime.block_on(free_one(&manager, &format!("filler{run}")))?;
        let started = Instant::now();
        let placed = runtime.block_on(admission_pass(&manager))?;
        head_in.push(started.elapsed().as_secs_f64() * 1e3);
        assert!(placed >= 1, "the freed node takes the head of the queue");
    }

    println!(
        "{nodes} nodes (each full), {waiting} bare tasks waiting in {shapes} sizes; median of \
         {runs} (memory store)"
    );
    println!("| pass | median ms |");
    println!("|---|---:|");
    println!(
        "| one admission pass, nothing fits | {:.1} |",
        median(nothing_fits)
    );
    println!(
        "| one admission pass after a node was freed (the head let in) | {:.1} |",
        median(head_in)
    );
    println!(
        "| `GET /queue`'s answer built and serialised ({:.1} MB) | {:.1} |",
        bytes as f64 / 1e6,
        median(listing)
    );
    println!(
        "| one look of the queue controller, nothing changed | {:.1} |",
        median(looks)
    );
    println!("| store writes of those looks and a pass with nothing changed | {writes} |");

    // Projects: every waiting request held by its project's quota, the nodes with room.
    let projects = if quick() { 4 } else { PROJECTS };
    let manager = manager_with_nodes(nodes)?;
    runtime.block_on(quota_bound(&manager, projects, waiting))?;
    let mut held = Vec::new();
    for _ in 0..runs {
        mark_all_waiting(&manager);
        let started = Instant::now();
        let placed = runtime.block_on(admission_pass(&manager))?;
        held.push(started.elapsed().as_secs_f64() * 1e3);
        assert_eq!(placed, 0, "every request is over its project's quota");
    }
    let mut quota_freed = Vec::new();
    for run in 0..runs.min(projects) {
        runtime.block_on(free_one(&manager, &format!("holder{run}")))?;
        let started = Instant::now();
        let placed = runtime.block_on(admission_pass(&manager))?;
        quota_freed.push(started.elapsed().as_secs_f64() * 1e3);
        assert_eq!(
            placed, 1,
            "the project's first waiting request let in, no other"
        );
    }
    println!();
    println!(
        "{nodes} nodes with room, {projects} projects each with a quota of 1 core used, \
         {waiting} bare tasks of 1 core waiting for their project's quota; median of {runs}"
    );
    println!("| pass | median ms |");
    println!("|---|---:|");
    println!(
        "| one admission pass, every request held by its quota | {:.1} |",
        median(held)
    );
    println!(
        "| one admission pass after a project's task stopped (its first request let in) | {:.1} |",
        median(quota_freed)
    );
    Ok(())
}
