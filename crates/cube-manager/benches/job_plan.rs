//! The job transformer alone, in process, no IO: a service job of 10,000 copies on 1,000
//! nodes planned from nothing, then the same job planned again with all 10,000 copies running
//! (nothing to do), and a system job over the 1,000 nodes, the same two ways. The no-change
//! pass is what a converged cluster pays at each resync and each event of the job; it must
//! find nothing to create or stop (so nothing is written).
//!
//! ```text
//! cargo bench -p cube-manager --bench job_plan
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use cube_manager::jobs::{JobLook, NodeFacts, plan};
use cube_types::deployment::DeploymentState;
use cube_types::job::{Group, Job, JobRecord, JobType};
use cube_types::{State, Task};

const NODES: usize = 1_000;
const COPIES: u32 = 10_000;
const RUNS: usize = 5;

/// `--quick` (as CI's `scripts/bench-smoke.sh` runs it):
/// small sizes and one run, so that the assertions run in seconds in a debug build. The
/// figures it prints then mean nothing.
fn quick() -> bool {
    std::env::args().any(|arg| arg == "--quick")
}

fn record(job_type: JobType, count: Option<u32>) -> JobRecord {
    JobRecord {
        job: Job {
            name: "web".into(),
            job_type,
            priority: 50,
            constraints: Vec::new(),
            owner: String::new(),
            project: String::new(),
            queue_timeout: None,
            groups: vec![Group {
                name: "api".into(),
                count,
                constraints: Vec::new(),
                task: Task::new("", "cube-sample:latest"),
                update: None,
            }],
        },
        version: 1,
        submit_time: None,
        stopped: false,
        promoted: false,
        revert_of: None,
    }
}

fn median(mut times: Vec<f64>) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() {
    let (node_count, copies, runs) = match quick() {
        true => (20, 100, 1),
        false => (NODES, COPIES, RUNS),
    };
    let labels = Arc::new(BTreeMap::from([("zone".to_string(), "eu".to_string())]));
    let nodes: Vec<NodeFacts> = (0..node_count)
        .map(|n| NodeFacts::ready(&format!("w{n:04}"), labels.clone()))
        .collect();
    println!("| job | pass | copies | median ms | creates | stops |");
    println!("|---|---|---:|---:|---:|---:|");
    for (what, job) in [
        (
            format!("service ×{copies}"),
            record(JobType::Service, Some(copies)),
        ),
        (
            format!("system ×{node_count} nodes"),
            record(JobType::System, None),
        ),
    ] {
        let mut first = Vec::new();
        let mut created = Vec::new();
        let mut deployment = None;
        for _ in 0..runs {
            let started = Instant::now();
            let planned = plan(&JobLook::new(&job, &nodes, &[], chrono::Utc::now()));
            first.push(started.elapsed().as_secs_f64() * 1000.0);
            created = planned.create;
            deployment = planned.deployment;
        }
        // A converged service job's deployment has succeeded: a look does not judge copies.
        if let Some(deployment) = &mut deployment {
            deployment.state = DeploymentState::Successful;
        }
        let copies = created.len();
        println!(
            "| {what} | from nothing | {copies} | {:.2} | {copies} | 0 |",
            median(first)
        );
        // The same job with every copy placed and running: nothing to do.
        let running: Vec<Task> = created
            .into_iter()
            .enumerate()
            .map(|(n, mut task)| {
                task.status.state = State::Running;
                task.status.node_name = nodes[n % node_count].name.as_str().into();
                task
            })
            .collect();
        let owned: Vec<&Task> = running.iter().collect();
        let mut again = Vec::new();
        let mut last = None;
        for _ in 0..runs {
            let started = Instant::now();
            let mut look = JobLook::new(&job, &nodes, &owned, chrono::Utc::now());
            look.deployment = deployment.as_ref();
            let planned = plan(&look);
            again.push(started.elapsed().as_secs_f64() * 1000.0);
            last = Some(planned);
        }
        let last = last.expect("at least one run");
        println!(
            "| {what} | nothing changed | {copies} | {:.2} | {} | {} |",
            median(again),
            last.create.len(),
            last.stop.len()
        );
        assert!(last.is_empty(), "a converged job planned work");
        assert!(
            last.deployment.is_none(),
            "a converged job moved its deployment"
        );
    }
}
