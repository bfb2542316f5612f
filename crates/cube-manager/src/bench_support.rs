//! The controller alone, for `cargo bench -p cube-manager --bench controller`: a manager on
//! memory stores with nodes entered directly (nothing follows them, nothing is sent to
//! them), a job submitted, and the job controller and the placement pass run by hand, so
//! that what is timed is the controllers' own work: deciding, placing, and writing.
//! Not part of Cube's interface.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use cube_api::ApiClient;
use cube_types::job::Job;
use cube_types::{NodeReport, Resources, State};
use tokio_util::sync::CancellationToken;

use crate::manager::{Manager, ManagerConfig, ManagerError};

use crate::cluster::{ManagerStores, Writes, lock};
use crate::nodes::NodeSource;

/// What one convergence measured.
#[derive(Debug, Clone)]
pub struct Convergence {
    /// From the job submitted to every copy stored `Scheduled` on a node.
    pub from_nothing: Duration,
    /// Copies placed.
    pub placed: usize,
    /// Store writes the convergence made (task and job records).
    pub writes: u64,
}

/// A manager on memory stores with `nodes` ready nodes of 8 cores and 32 GiB each.
pub fn manager_with_nodes(nodes: usize) -> Result<Arc<Manager>, ManagerError> {
    let config = ManagerConfig {
        shards: cube_types::shard::ShardScope::all(cube_types::shard::DEFAULT_RING),
        heartbeat_grace: Duration::from_secs(3600),
        poll_interval: Duration::from_secs(3600),
        resync_interval: Duration::from_secs(3600),
        static_workers: Vec::new(),
        request_timeout: Duration::from_secs(1),
        max_concurrent_reconciles: 64,
        gc_after: Duration::from_secs(3600),
        max_claimed_per_owner: None,
        acl: None,
        audit: None,
        tls: None,
        secrets: Arc::new(crate::secrets::Secrets::in_memory()),
        claims: None,
    };
    let stores = ManagerStores::in_memory();
    let scheduler = cube_scheduler::scheduler_by_name("epvm")
        .ok_or_else(|| ManagerError::BadRequest("no scheduler epvm".to_string()))?;
    let manager = Manager::open(config, stores, scheduler, CancellationToken::new())?;
    let client = ApiClient::new("127.0.0.1:9", Duration::from_secs(1))
        .map_err(|err| ManagerError::BadRequest(err.to_string()))?;
    {
        let mut state = lock(&manager.cluster.state);
        for n in 0..nodes {
            let report = NodeReport {
                name: format!("w{n:04}"),
                address: "127.0.0.1:9".to_string(),
                capacity: Resources {
                    cpu: 8.0,
                    memory: 32 << 30,
                    disk: 0,
                },
                stats: None,
                labels: Default::default(),
                version: None,
                host_policy: None,
                volumes: Vec::new(),
            };
            state.nodes.report(
                report,
                NodeSource::Registered,
                || client.clone(),
                Instant::now(),
                manager.cluster.heartbeat_grace(),
            );
        }
    }
    Ok(manager)
}

/// Submits `job` and runs its controller and one placement pass, as the runners would.
pub async fn converge(manager: &Manager, job: Job) -> Result<Convergence, ManagerError> {
    let name = job.key();
    let before = manager.store_revision()?;
    let started = Instant::now();
    manager.submit_job(job).await?;
    let placed = look_again(manager, &name).await?;
    Ok(Convergence {
        from_nothing: started.elapsed(),
        placed,
        writes: manager.store_revision()? - before,
    })
}

/// One more look at a job and one more placement pass: what every event of the job and
/// every resync costs. Returns the copies it placed.
pub async fn look_again(manager: &Manager, name: &str) -> Result<usize, ManagerError> {
    crate::job_controller::JobController::new(manager.cluster.clone(), manager.job_records.clone())
        .converge(name)
        .await?;
    let mut writes = Writes::default();
    let placed = manager.placement_controller().placement_pass(&mut writes);
    manager.cluster.settle(writes).await?;
    Ok(placed?.len())
}

/// How many of the job's copies are `Scheduled`.
pub fn scheduled(manager: &Manager, name: &str) -> usize {
    lock(&manager.cluster.state)
        .cache
        .of_job(name)
        .iter()
        .filter(|task| task.status.state == State::Scheduled)
        .count()
}

/// Fills every node: one task as large as a node (8 cores, 32 GiB), placed. Returns how many
/// were placed.
pub async fn fill_every_node(manager: &Arc<Manager>, nodes: usize) -> Result<usize, ManagerError> {
    let fillers: Vec<cube_types::Task> = (0..nodes)
        .map(|n| {
            let mut task = cube_types::Task::new(format!("filler{n}"), "cube-sample:latest");
            task.spec.cpu = 8.0;
            task.spec.memory = 32 << 30;
            task
        })
        .collect();
    manager.cluster.accept_tasks(fillers, None).await?;
    let mut writes = Writes::default();
    let placed = manager.placement_controller().placement_pass(&mut writes);
    manager.cluster.settle(writes).await?;
    Ok(placed?.len())
}

/// Submits `count` bare tasks that wait (the nodes are full), of `shapes` different sizes,
/// and numbers them in the waiting list.
pub async fn submit_waiting(
    manager: &Arc<Manager>,
    count: usize,
    shapes: usize,
) -> Result<(), ManagerError> {
    let waiting: Vec<cube_types::Task> = (0..count)
        .map(|n| {
            let mut task = cube_types::Task::new(format!("waiting{n}"), "cube-sample:latest");
            task.spec.memory = (1 << 30) + (n % shapes.max(1)) as u64 * (16 << 20);
            task.spec.cpu = 0.5;
            task
        })
        .collect();
    accept_and_number(manager, waiting).await
}

/// Accepts `tasks` (in chunks of 1,000, as many submissions would) and numbers them in the
/// waiting list (one look of the queue controller).
async fn accept_and_number(
    manager: &Arc<Manager>,
    tasks: Vec<cube_types::Task>,
) -> Result<(), ManagerError> {
    for chunk in tasks.chunks(1_000) {
        manager.cluster.accept_tasks(chunk.to_vec(), None).await?;
    }
    manager
        .queue_controller()
        .look()
        .await
        .map_err(ManagerError::BadRequest)?;
    Ok(())
}

/// `projects` projects (`p000`, `p001`, ...), each with a quota of one core and one task of
/// one core placed (its whole quota used), and `waiting` bare tasks of one core each, spread
/// over the projects in turn, all held by their project's quota while the nodes have room;
/// numbered in the waiting list.
pub async fn quota_bound(
    manager: &Arc<Manager>,
    projects: usize,
    waiting: usize,
) -> Result<(), ManagerError> {
    let task = |name: String, project: usize| {
        let mut task = cube_types::Task::new(name, "cube-sample:latest");
        task.spec.cpu = 1.0;
        task.spec.memory = 64 << 20;
        task.spec.project = format!("p{project:03}");
        task
    };
    for project in 0..projects {
        manager
            .create_project(cube_types::project::ProjectRequest {
                name: format!("p{project:03}"),
                quota: cube_types::project::Quota {
                    cpus: Some(1.0),
                    ..Default::default()
                },
            })
            .await?;
    }
    let holders: Vec<cube_types::Task> = (0..projects)
        .map(|project| task(format!("holder{project}"), project))
        .collect();
    manager.cluster.accept_tasks(holders, None).await?;
    admission_pass(manager).await?;
    let held: Vec<cube_types::Task> = (0..waiting)
        .map(|n| task(format!("held{n}"), n % projects.max(1)))
        .collect();
    accept_and_number(manager, held).await
}

/// Marks every waiting request for the next placement pass, as a change that may have made
/// room does (a node joined, a quota was raised): the pass then reads them all.
pub fn mark_all_waiting(manager: &Manager) {
    lock(&manager.cluster.state)
        .placement_dirty
        .mark_everything();
}

/// One admission pass (the placement pass) and its writes; the tasks it let in.
pub async fn admission_pass(manager: &Manager) -> Result<usize, ManagerError> {
    let mut writes = Writes::default();
    let placed = manager.placement_controller().placement_pass(&mut writes);
    manager.cluster.settle(writes).await?;
    Ok(placed?.len())
}

/// What `GET /queue` answers, as JSON bytes: the list in order with positions and reasons.
pub fn queue_listing(manager: &Manager) -> Result<Vec<u8>, ManagerError> {
    serde_json::to_vec(&manager.queue()).map_err(|err| ManagerError::BadRequest(err.to_string()))
}

/// Stops one task (frees its node), as `DELETE /tasks/{id}` does, and marks it ended there as
/// its worker would report; returns its node's name.
pub async fn free_one(manager: &Manager, name: &str) -> Result<Option<String>, ManagerError> {
    let Some(task) = lock(&manager.cluster.state)
        .cache
        .tasks()
        .find(|task| task.name == name)
        .cloned()
    else {
        return Ok(None);
    };
    manager.request_stop(task.id).await?;
    let mut ended = lock(&manager.cluster.state)
        .cache
        .get(&task.id)
        .cloned()
        .ok_or(ManagerError::NotFound(task.id))?;
    let node = ended.status.node_name.clone();
    ended
        .end(State::Completed, None, Utc::now())
        .map_err(|transition| ManagerError::Conflict(transition.to_string()))?;
    let mut writes = Writes::default();
    {
        let mut state = lock(&manager.cluster.state);
        manager.cluster.save(&mut state, &mut writes, ended)?;
    }
    manager.cluster.settle(writes).await?;
    // As a worker's report of an ended task does (`followers.rs`): room may have appeared, so
    // the next pass reads every waiting task, not only those submitted since.
    manager.cluster.push_waiting();
    Ok(Some(node.to_string()))
}

/// One look of the queue controller (what every change of a task, job or node asks for).
pub async fn look_at_queue(manager: &Manager) -> Result<(), ManagerError> {
    manager
        .queue_controller()
        .look()
        .await
        .map(|_| ())
        .map_err(ManagerError::BadRequest)
}
