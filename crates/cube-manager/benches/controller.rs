//! The controllers alone, in process, no Docker and no worker: a service job of 10,000
//! copies on 1,000 nodes converged from nothing (the job controller creates every copy, one
//! placement pass places them all, every write made), then one more look with nothing changed
//! (the job controller and a placement pass, as at each event of the job and each resync),
//! which must write nothing. Time, heap allocations and store writes of each. Then the same
//! convergence with the job in a project with a quota (every copy counted against it), next
//! to the job in `default`, in the same run: what projects cost on the way from a submission
//! to every copy placed.
//!
//! ```text
//! cargo bench -p cube-manager --bench controller
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use cube_manager::bench_support::{converge, look_again, manager_with_nodes, scheduled};
use cube_types::Task;
use cube_types::job::{Group, Job, JobType};
use cube_types::project::{ProjectRequest, Quota};

/// Counts heap allocations, to report them per pass.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above with the same layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const NODES: usize = 1_000;
const COPIES: u32 = 10_000;
const RUNS: usize = 3;
/// Looks with nothing changed, per run.
const LOOKS: usize = 5;

/// `--quick` (as CI's `scripts/bench-smoke.sh` runs it):
/// small sizes and one run, so that the assertions run in seconds in a debug build. The
/// figures it prints then mean nothing.
fn quick() -> bool {
    std::env::args().any(|arg| arg == "--quick")
}

fn job(copies: u32) -> Job {
    let mut template = Task::new("", "cube-sample:latest");
    template.spec.memory = 64 << 20;
    template.spec.cpu = 0.1;
    template.id = uuid::Uuid::nil();
    Job {
        name: "web".into(),
        job_type: JobType::Service,
        priority: 50,
        constraints: Vec::new(),
        owner: String::new(),
        project: String::new(),
        queue_timeout: None,
        groups: vec![Group {
            name: "api".into(),
            count: Some(copies),
            constraints: Vec::new(),
            task: template,
            update: None,
        }],
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (nodes, copies, runs, looks) = match quick() {
        true => (20, 100, 1, 2),
        false => (NODES, COPIES, RUNS, LOOKS),
    };
    let (mut first, mut first_allocs, mut first_writes) = (Vec::new(), Vec::new(), Vec::new());
    let (mut again, mut again_allocs, mut again_writes) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let manager = manager_with_nodes(nodes)?;
        let allocations = ALLOCATIONS.load(Ordering::Relaxed);
        let converged = runtime.block_on(converge(&manager, job(copies)))?;
        first_allocs.push((ALLOCATIONS.load(Ordering::Relaxed) - allocations) as f64);
        assert_eq!(converged.placed, copies as usize, "every copy placed");
        assert_eq!(scheduled(&manager, "web"), copies as usize);
        first.push(converged.from_nothing.as_secs_f64() * 1e3);
        first_writes.push(converged.writes as f64);

        for _ in 0..looks {
            let revision = manager.store_revision()?;
            let allocations = ALLOCATIONS.load(Ordering::Relaxed);
            let started = Instant::now();
            let placed = runtime.block_on(look_again(&manager, "web"))?;
            again.push(started.elapsed().as_secs_f64() * 1e3);
            again_allocs.push((ALLOCATIONS.load(Ordering::Relaxed) - allocations) as f64);
            again_writes.push((manager.store_revision()? - revision) as f64);
            assert_eq!(placed, 0, "nothing left to place");
        }
    }
    println!(
        "{nodes} nodes, a service job of {copies} copies; median of {runs} runs, {looks} looks \
         each with nothing changed (memory store)"
    );
    println!("| pass | median ms | allocations | store writes |");
    println!("|---|---:|---:|---:|");
    println!(
        "| from nothing to all placed | {:.1} | {:.0} | {:.0} |",
        median(first),
        median(first_allocs),
        median(first_writes)
    );
    println!(
        "| again, nothing changed | {:.2} | {:.0} | {:.0} |",
        median(again),
        median(again_allocs),
        median(again_writes)
    );

    // The same convergence, in `default` and in a project whose quota every copy counts
    // against, turn by turn.
    let (mut in_default, mut in_project) = (Vec::new(), Vec::new());
    for run in 0..runs.max(3) * 2 {
        // Turn by turn, each on a manager of its own that is dropped before the next.
        let scoped = run % 2 == 1;
        let manager = manager_with_nodes(nodes)?;
        let mut submitted = job(copies);
        if scoped {
            runtime.block_on(manager.create_project(ProjectRequest {
                name: "team-a".to_string(),
                quota: Quota {
                    cpus: Some(copies as f64),
                    memory: Some(u64::from(copies) << 30),
                    disk: None,
                    tasks: Some(u64::from(copies)),
                },
            }))?;
            submitted.project = "team-a".to_string();
        }
        let converged = runtime.block_on(converge(&manager, submitted))?;
        assert_eq!(converged.placed, copies as usize, "every copy placed");
        let took = converged.from_nothing.as_secs_f64() * 1e3;
        if scoped {
            in_project.push(took);
        } else {
            in_default.push(took);
        }
        drop(manager);
    }
    let (in_default, in_project) = (median(in_default), median(in_project));
    println!();
    println!("| the same job converged | median ms |");
    println!("|---|---:|");
    println!("| in `default` (no quota) | {in_default:.1} |");
    println!("| in a project with a quota | {in_project:.1} |");
    println!(
        "| ratio, project / default | {:.3} |",
        in_project / in_default
    );
    Ok(())
}
