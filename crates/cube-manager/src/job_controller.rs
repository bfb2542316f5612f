//! The job controller: keeps each job's copies what the job asks for.
//!
//! A job is looked at again (pushed to the job controller's runner, keyed by job name) when
//! it is submitted, scaled or stopped, when one of its tasks is written (`Manager::save`),
//! when a node joins, leaves or changes (system jobs), and at every resync. The runner keeps
//! one pending entry per job, never converges one job twice at once, and retries a job that
//! did not converge with its backoff. A look reads the job, its tasks and the nodes under the manager's lock,
//! asks the pure transformer ([`crate::jobs::plan`]) what to create and stop, and carries that
//! out through the task operations every task goes through (`accept_task`, `request_stop`):
//! placement, dispatch, restarts and liveness stay the task controller's. A look that finds
//! nothing to do writes nothing, so a converged cluster is quiet.
//!
//! The API's side is here too: submitting, scaling, stopping and planning a job, and the
//! views of jobs the API answers with.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use cube_types::deployment::{Deployment, DeploymentState};
use cube_types::job::{Job, JobHistory, JobRecord, JobType, JobVersion};
use cube_types::{Receiver, Task};
use serde::{Deserialize, Serialize};

use cube_controller::runner::{Action, ExponentialBackoff, ReadyGate};
use cube_controller::watcher::Watcher;

use crate::cluster::{Writes, lock};
use crate::events::{Topic, job_event_kind, job_object};
use crate::jobs::{GroupSummary, JobLook, NodeFacts, PlannedStop, plan, status_word, summarize};
use crate::manager::{Manager, ManagerError};
use crate::queue_controller::QueueView;
use crate::store_source::TableSource;
use uuid::Uuid;

/// A job as the API shows it: the stored record, its status in a word, a summary per group,
/// and (for one job) its tasks.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobView {
    #[serde(rename = "Job")]
    pub job: Job,
    #[serde(rename = "Version")]
    pub version: u64,
    #[serde(rename = "SubmitTime", with = "cube_types::time::optional", default)]
    pub submit_time: Option<chrono::DateTime<Utc>>,
    #[serde(rename = "Stopped")]
    pub stopped: bool,
    #[serde(rename = "Status")]
    pub status: String,
    #[serde(rename = "Summary")]
    pub summary: BTreeMap<String, GroupSummary>,
    #[serde(rename = "Tasks", default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<Vec<Task>>,
    /// The job's last deployment (service jobs), in whatever state it is.
    #[serde(
        rename = "Deployment",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub deployment: Option<Deployment>,
    /// In the answer to a submission or a revert only: `new`, `changed` (a new version),
    /// `scaled` (only counts changed) or `unchanged`.
    #[serde(rename = "Outcome", default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// For one job: its entry in the waiting list (its state, its position while it waits
    /// and why, its addresses once claimed). System jobs are not queued.
    #[serde(rename = "Queue", default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueView>,
    /// In the answer to a submission or a scale only: why no node could hold the job today
    /// (it is accepted and waits all the same).
    #[serde(rename = "Warnings", default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// What `POST /jobs/plan` answers: the version the job would get, whether its spec changed,
/// and the plan.
#[derive(Debug, Clone, Serialize)]
pub struct PlanView {
    #[serde(rename = "Version")]
    pub version: u64,
    /// Whether submitting it would change the job at all (a new version, or counts).
    #[serde(rename = "Changed")]
    pub changed: bool,
    /// `new`, `changed` (a new version), `scaled` (only counts change, the same version)
    /// or `unchanged`.
    #[serde(rename = "Outcome")]
    pub outcome: &'static str,
    /// What the version changes, one line per field (a new job, or a changed one).
    #[serde(rename = "Diff", default, skip_serializing_if = "Vec::is_empty")]
    pub diff: Vec<String>,
    /// Copies whose spec would change: a service job's deployment replaces them
    /// `MaxParallel` at a time, so `Create` and `Stop` hold its first step only.
    #[serde(rename = "Replace")]
    pub replace: usize,
    /// The copies the controller would create now, named, not written out: each is its
    /// group's task (in the job) under its name. Listing 10,000 full specs made a dry run of
    /// one small request answer gigabytes.
    #[serde(rename = "Create")]
    pub create: Vec<PlannedCreate>,
    /// The copies it would stop, with why.
    #[serde(rename = "Stop")]
    pub stop: Vec<PlannedStop>,
    /// The copies that stay as they are.
    #[serde(rename = "Keep")]
    pub keep: Vec<Uuid>,
}

/// A copy a plan would create, as `POST /jobs/plan` names it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlannedCreate {
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Group")]
    pub group: String,
    #[serde(rename = "Index", skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
}

impl PlannedCreate {
    fn of(task: &Task) -> PlannedCreate {
        PlannedCreate {
            name: task.name.clone(),
            group: task.spec.group.clone(),
            index: task.spec.index,
        }
    }
}

/// What the job transformer reads for one job: the record, every node's facts, the tasks
/// the job owns, its last deployment and its newest stable version before the current one.
struct JobInputs {
    record: Arc<JobRecord>,
    nodes: Vec<NodeFacts>,
    tasks: Vec<Arc<Task>>,
    deployment: Option<Arc<Deployment>>,
    last_stable: Option<u64>,
}

/// How a job submission went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobSubmitted {
    Created,
    /// A new version.
    Changed,
    /// Only counts changed: the same version, no deployment.
    Scaled,
    Unchanged,
}

impl JobSubmitted {
    /// How `cube job run` says it: `new`, `changed`, `scaled`, `unchanged`.
    pub fn word(self) -> &'static str {
        match self {
            JobSubmitted::Created => "new",
            JobSubmitted::Changed => "changed",
            JobSubmitted::Scaled => "scaled",
            JobSubmitted::Unchanged => "unchanged",
        }
    }
}

/// One version as `GET /jobs/{name}/versions` lists it: the version, and whether it is the
/// one the job runs now.
#[derive(Debug, Clone, Serialize)]
pub struct VersionView {
    #[serde(flatten)]
    pub version: JobVersion,
    #[serde(rename = "Current")]
    pub current: bool,
}

impl Manager {
    /// Marks every system job (a node joined, left, came back or changed its labels).
    pub(crate) fn mark_system_jobs_dirty(&self) {
        let jobs = self.jobs_observed.snapshot().items;
        for record in jobs.values() {
            if record.job.job_type == JobType::System && !record.stopped {
                self.cluster.mark_job_dirty(&record.job.name);
            }
        }
    }

    /// Marks every job (at start and at each resync).
    pub(crate) fn mark_all_jobs_dirty(&self) {
        for name in self.jobs_observed.snapshot().items.keys() {
            self.cluster.mark_job_dirty(name);
        }
    }

    /// Follows the jobs table through the store's watch (a listing, then every change) into
    /// [`Manager::jobs_observed`], and pushes to the job controller every job once the first
    /// listing is in, then the name of every job that changed. When the watch is lost the watcher lists again and every job is looked at.
    pub(crate) async fn run_jobs_watcher(self: Arc<Self>) {
        let watcher = Watcher::new(
            TableSource::new(self.cluster.stores.jobs.clone()),
            self.jobs_observed.clone(),
        );
        let following = async {
            // Every job is looked at once the first listing is in: a manager that starts (a
            // new leader) converges each job at once, not at its next resync. The listing
            // does not wait on anything, so it may come before or after this future first
            // runs; its changes cannot be relied on to show up below, nor the look at start
            // (`run_job_controller`, the first resync), which may come before it.
            self.jobs_observed.wait_synced().await;
            let mut since = self.jobs_observed.index();
            self.mark_all_jobs_dirty();
            loop {
                match self.jobs_observed.wait_changes_since(since).await {
                    Ok(deltas) => {
                        for delta in deltas {
                            since = delta.index;
                            self.cluster.mark_job_dirty(&delta.key);
                        }
                    }
                    // Changes were missed: look at every job.
                    Err(_) => {
                        since = self.jobs_observed.index();
                        self.mark_all_jobs_dirty();
                    }
                }
            }
        };
        tokio::select! {
            () = watcher.run(self.shutdown.clone()) => {}
            () = following => {}
        }
    }

    /// Converges the jobs pushed to [`Manager::jobs_runner`] until shutdown, once the jobs
    /// watcher is in sync. One job's look is a few map reads and, when something is missing,
    /// a few task submissions.
    pub(crate) async fn run_job_controller(self: Arc<Self>) {
        self.mark_all_jobs_dirty();
        let manager = self.clone();
        let converge = move |name: String| {
            let manager = manager.clone();
            async move {
                let started = Instant::now();
                let converged = manager.converge_job(&name).await;
                manager.cluster.metrics.reconciled("job", started);
                converged
                    .map(|again| again.map_or(Action::Done, Action::RequeueAfter))
                    .map_err(|err| {
                        tracing::warn!(job = %name, error = %err, "a job did not converge; trying again");
                        err.to_string()
                    })
            }
        };
        self.cluster
            .wakes
            .jobs
            .run(
                converge,
                ExponentialBackoff::default(),
                ReadyGate::new([self.jobs_observed.synced()]),
                self.shutdown.clone(),
            )
            .await;
    }

    /// The transformer's inputs for one job: the record as the jobs watcher has it (the job
    /// controller reads its observed store, which the store's watch fills, not the API's copy,
    /// which is written only once the write is durable and so can lag the watch), the nodes
    /// and the job's tasks, each read in a short hold of a lock; a change between them makes
    /// the job dirty again, and the next look sees it.
    fn job_inputs(&self, name: &str) -> Option<JobInputs> {
        let record = self.jobs_observed.get(&name.to_string())?;
        let nodes = self.node_facts();
        let state = lock(&self.cluster.state);
        let tasks = state.cache.of_job(name);
        let deployment = state.deployments.get(name).cloned();
        let last_stable = state
            .histories
            .get(name)
            .and_then(|history| history.last_stable_before(record.version))
            .map(|stable| stable.version);
        Some(JobInputs {
            record,
            nodes,
            tasks,
            deployment,
            last_stable,
        })
    }

    /// One look at a job: plan, then carry the plan out — the deployment first (so that what
    /// is done is recorded before it is done), then the stops, the new copies, and a version
    /// marked stable or gone back to. Returns when to look again if nothing else happens.
    pub(crate) async fn converge_job(
        &self,
        name: &str,
    ) -> Result<Option<std::time::Duration>, ManagerError> {
        let Some(JobInputs {
            record,
            nodes,
            tasks,
            deployment,
            last_stable,
        }) = self.job_inputs(name)
        else {
            return Ok(None);
        };
        let owned: Vec<&Task> = tasks.iter().map(|task| &**task).collect();
        let now = Utc::now();
        let look = JobLook {
            record: &record,
            deployment: deployment.as_deref(),
            last_stable,
            nodes: &nodes,
            owned: &owned,
            now,
        };
        let planned = plan(&look);
        let again = planned
            .look_again_at
            .and_then(|at| (at - now).to_std().ok())
            // A deadline a few milliseconds off is looked at a little late, not early.
            .map(|wait| wait + std::time::Duration::from_millis(20));
        if let Some(changed) = &planned.deployment {
            self.store_deployment(changed, deployment.as_deref())
                .await?;
            if changed.state == DeploymentState::Successful {
                self.mark_stable(name, changed.version).await?;
            }
        }
        if !planned.is_empty() {
            tracing::info!(job = %name, create = planned.create.len(), stop = planned.stop.len(), "converging a job");
            // Each side is one commit, however many copies it holds.
            for stop in &planned.stop {
                tracing::info!(job = %name, task = %stop.id, name = %stop.name, reason = %stop.reason, "stopping a copy");
            }
            let stops: Vec<_> = planned.stop.iter().map(|stop| stop.id).collect();
            self.request_stops(&stops).await?;
            if !planned.create.is_empty() {
                self.accept_tasks(planned.create, None).await?;
            }
        }
        if let Some(stable) = planned.revert_to {
            self.revert_after_failure(name, record.version, stable)
                .await?;
        }
        Ok(again)
    }

    /// Stores a job's deployment durably, then keeps it for the next look and the API.
    async fn store_deployment(
        &self,
        deployment: &Deployment,
        before: Option<&Deployment>,
    ) -> Result<(), ManagerError> {
        let commit = self
            .cluster
            .stores
            .deployments
            .put_queued(&deployment.job, deployment)?;
        commit.durable().await?;
        let kind = deployment_event_kind(before, deployment);
        if kind != "DeploymentProgress" {
            tracing::info!(job = %deployment.job, version = deployment.version, state = %deployment.state, reason = %deployment.reason, "deployment");
        }
        // Published where the map is written, under the state lock: before the stops and
        // copies this look goes on to make.
        let mut state = lock(&self.cluster.state);
        self.cluster.publish(
            Topic::Deployment,
            kind,
            &deployment.job,
            Some(&deployment.job),
            serde_json::to_value(deployment).unwrap_or_default(),
        );
        state
            .deployments
            .insert(deployment.job.clone(), Arc::new(deployment.clone()));
        Ok(())
    }

    /// Marks a job's version stable: a deployment of it succeeded.
    async fn mark_stable(&self, name: &str, version: u64) -> Result<(), ManagerError> {
        let _writing = self.job_writes.lock().await;
        let Some(history) = lock(&self.cluster.state).histories.get(name).cloned() else {
            return Ok(());
        };
        let mut history = (*history).clone();
        if history.mark_stable(version) {
            self.store_history(name, history).await?;
        }
        Ok(())
    }

    /// A deployment of `failed` failed with `AutoRevert`: the job goes back to the spec of
    /// version `stable`, as a new version — unless the job moved on meanwhile.
    async fn revert_after_failure(
        &self,
        name: &str,
        failed: u64,
        stable: u64,
    ) -> Result<(), ManagerError> {
        let _writing = self.job_writes.lock().await;
        let (known, history) = {
            let state = lock(&self.cluster.state);
            (
                state.jobs.get(name).cloned(),
                state.histories.get(name).cloned(),
            )
        };
        let Some(known) = known.filter(|known| known.version == failed && !known.stopped) else {
            return Ok(());
        };
        let Some(target) = history.as_ref().and_then(|history| history.get(stable)) else {
            tracing::warn!(job = %name, version = stable, "the stable version to go back to is no longer kept");
            return Ok(());
        };
        let job = with_counts_of(target.job.clone(), &known.job);
        let (outcome, record) = next_record(Some(&known), job, Some(stable));
        if outcome == JobSubmitted::Changed {
            tracing::warn!(job = %name, from = failed, to = stable, version = record.version, "deployment failed: going back to the last stable version");
            self.store_new_version(Some(&known), record).await?;
        }
        Ok(())
    }

    /// Stores a new task `Pending` (durably) and asks for a placement pass: what a submission
    /// does. `event` is the `TaskEvent` a submission came in; its timestamp, if it has one,
    /// is the task's `CreatedTime`.
    pub(crate) async fn accept_task(
        &self,
        task: Task,
        event: Option<&cube_types::TaskEvent>,
    ) -> Result<Task, ManagerError> {
        let created = event.and_then(|event| event.timestamp);
        let mut accepted = self.accept_tasks(vec![task], created).await?;
        accepted
            .pop()
            .ok_or_else(|| ManagerError::BadRequest("no task to accept".to_string()))
    }

    /// [`Manager::accept_task`] for several tasks, in one hold of the lock and one wait for
    /// the store (one commit for them all): how a job's new copies are stored. `created` is
    /// the submission's own time, if it gave one.
    pub(crate) async fn accept_tasks(
        &self,
        tasks: Vec<Task>,
        created: Option<chrono::DateTime<Utc>>,
    ) -> Result<Vec<Task>, ManagerError> {
        let mut writes = Writes::default();
        let mut accepted = Vec::with_capacity(tasks.len());
        let stored = {
            let mut state = lock(&self.cluster.state);
            tasks.into_iter().try_for_each(|mut task| {
                let id = task.id;
                if state.cache.get(&id).is_some() {
                    // Two submissions of one new ID raced; the first one won.
                    return Err(ManagerError::Conflict(format!("task {id} exists already")));
                }
                task.clear_status(Receiver::Manager);
                task.status.created_time = Some(created.unwrap_or_else(Utc::now));
                let why = if task.spec.job.is_empty() {
                    String::new()
                } else {
                    format!("by job {}", task.spec.job)
                };
                task.record(Utc::now(), "Submitted", why);
                self.cluster.save(&mut state, &mut writes, task.clone())?;
                accepted.push(task);
                Ok(())
            })
        };
        // What was queued is waited for even when a later task was refused.
        self.cluster.settle(writes).await?;
        stored?;
        self.cluster
            .push_to_place(accepted.iter().map(|task| task.id));
        Ok(accepted)
    }

    // ----- the API's side -----

    /// `POST /jobs`: a new job, a changed one (its version goes up; a stopped job submitted
    /// again runs again), one whose counts alone changed (scaled: the same version), or the
    /// same one again (nothing happens).
    pub async fn submit_job(&self, job: Job) -> Result<(JobSubmitted, JobView), ManagerError> {
        let findings = job.validate();
        if !findings.is_empty() {
            return Err(ManagerError::BadRequest(findings.join("; ")));
        }
        refuse_if_too_large(&job)?;
        let name = job.name.clone();
        let mut warnings = Vec::new();
        let outcome = {
            let _writing = self.job_writes.lock().await;
            let known = lock(&self.cluster.state).jobs.get(&name).cloned();
            let (outcome, record) = next_record(known.as_deref(), job, None);
            if outcome != JobSubmitted::Unchanged {
                warnings = self.job_fits_nowhere_today(&record);
            }
            match outcome {
                JobSubmitted::Created | JobSubmitted::Changed => {
                    self.store_new_version(known.as_deref(), record).await?
                }
                JobSubmitted::Scaled => self.store_job(record).await?,
                JobSubmitted::Unchanged => {}
            }
            outcome
        };
        let mut view = self.job(&name)?;
        view.warnings = warnings;
        Ok((outcome, view))
    }

    /// Stores a new version of a job: its entry in the job's history (with what changed),
    /// then the record. Called with [`Manager::job_writes`] held.
    async fn store_new_version(
        &self,
        known: Option<&JobRecord>,
        record: JobRecord,
    ) -> Result<(), ManagerError> {
        let name = record.job.name.clone();
        let diff = match known {
            Some(known) => {
                let mut diff = known.job.diff(&record.job);
                if diff.is_empty() && known.stopped {
                    diff.push("submitted again after a stop".to_string());
                }
                diff
            }
            None => vec!["a new job".to_string()],
        };
        let mut history = lock(&self.cluster.state)
            .histories
            .get(&name)
            .map(|history| (**history).clone())
            .unwrap_or_default();
        history.push(JobVersion {
            version: record.version,
            submit_time: record.submit_time,
            stable: false,
            diff,
            revert_of: record.revert_of,
            job: record.job.clone(),
        });
        // The history first: a crash between the two leaves a version the record never
        // reached, which the next version replaces (`JobHistory::push`).
        self.store_history(&name, history).await?;
        self.store_job(record).await
    }

    async fn store_history(&self, name: &str, history: JobHistory) -> Result<(), ManagerError> {
        let commit = self
            .cluster
            .stores
            .job_versions
            .put_queued(name, &history)?;
        commit.durable().await?;
        lock(&self.cluster.state)
            .histories
            .insert(name.to_string(), Arc::new(history));
        Ok(())
    }

    /// Stores a job record durably, then keeps it for the API's reads. The job controller
    /// hears of it from the store's watch (`run_jobs_watcher`), like of any other write.
    async fn store_job(&self, record: JobRecord) -> Result<(), ManagerError> {
        let name = record.job.name.clone();
        // Queued and published under the state lock, as a task's write is: the event comes
        // before anything the job controller does once the write is committed.
        let commit = {
            let state = lock(&self.cluster.state);
            let commit = self.cluster.stores.jobs.put_queued(&name, &record)?;
            let kind = job_event_kind(state.jobs.get(&name).map(|known| &**known), &record);
            self.cluster
                .publish(Topic::Job, kind, &name, Some(&name), job_object(&record));
            commit
        };
        commit.durable().await?;
        {
            let mut state = lock(&self.cluster.state);
            state.queue_dirty.mark_job(&name);
            state.jobs.insert(name, Arc::new(record));
        }
        self.cluster.push_queue();
        Ok(())
    }

    /// `DELETE /jobs/{name}`: every copy is stopped; the job stays, `Stopped`.
    pub async fn stop_job(&self, name: &str) -> Result<JobView, ManagerError> {
        {
            let _writing = self.job_writes.lock().await;
            let known = self.known_job(name)?;
            if !known.stopped {
                let mut record = (*known).clone();
                record.stopped = true;
                self.store_job(record).await?;
            }
        }
        self.job(name)
    }

    /// `POST /jobs/{name}/scale`: a group's count (not a new version).
    pub async fn scale_job(
        &self,
        name: &str,
        group: &str,
        count: u32,
    ) -> Result<JobView, ManagerError> {
        let mut warnings = Vec::new();
        {
            let _writing = self.job_writes.lock().await;
            let known = self.known_job(name)?;
            let mut record = (*known).clone();
            if record.job.job_type == JobType::System {
                return Err(ManagerError::BadRequest(format!(
                    "job {name} is a system job: it runs one copy on every matching node and \
                     has no count to scale"
                )));
            }
            let Some(target) = record.job.groups.iter_mut().find(|g| g.name == group) else {
                let groups: Vec<&str> = known.job.groups.iter().map(|g| g.name.as_str()).collect();
                return Err(ManagerError::BadRequest(format!(
                    "Group: job {name} has no group {group:?}; its groups are {}",
                    groups.join(", ")
                )));
            };
            if count > cube_types::job::MAX_COUNT {
                return Err(ManagerError::BadRequest(format!(
                    "Count: {count} is more than {}",
                    cube_types::job::MAX_COUNT
                )));
            }
            if target.count != Some(count) {
                target.count = Some(count);
                refuse_if_too_large(&record.job)?;
                warnings = self.job_fits_nowhere_today(&record);
                self.store_job(record).await?;
            }
        }
        let mut view = self.job(name)?;
        view.warnings = warnings;
        Ok(view)
    }

    /// Why no node known today could hold a job (`service` or `batch`) whole: a group whose
    /// copy fits no node even empty, or copies that ask for more than every node has
    /// together. The job is accepted and waits all the same (nodes join later); these are the
    /// warnings its submission is answered with. A system job is placed node by node, and
    /// has none.
    fn job_fits_nowhere_today(&self, record: &JobRecord) -> Vec<String> {
        if record.job.job_type == JobType::System {
            return Vec::new();
        }
        let copies: Vec<(Task, usize)> = record
            .job
            .groups
            .iter()
            .enumerate()
            .map(|(index, group)| {
                (
                    crate::jobs::copy_of(record, index, 0, None),
                    group.count.unwrap_or(0) as usize,
                )
            })
            .collect();
        let asked: Vec<(&Task, usize)> =
            copies.iter().map(|(task, count)| (task, *count)).collect();
        self.fits_nowhere_today(&asked)
    }

    /// `POST /jobs/{name}/promote`: the canaries of the running deployment are good; the
    /// rest of the copies may be replaced.
    pub async fn promote_job(&self, name: &str) -> Result<JobView, ManagerError> {
        {
            let _writing = self.job_writes.lock().await;
            let known = self.known_job(name)?;
            let deployment = lock(&self.cluster.state).deployments.get(name).cloned();
            let waiting = deployment.as_ref().filter(|deployment| {
                deployment.version == known.version
                    && deployment.is_active()
                    && deployment
                        .groups
                        .values()
                        .any(|group| group.desired_canaries > 0 && !group.promoted)
            });
            if waiting.is_none() {
                let now = match &deployment {
                    Some(deployment) if deployment.version == known.version => format!(
                        "its deployment of version {} is {} and has no canaries waiting",
                        deployment.version, deployment.state
                    ),
                    _ => format!("version {} has no deployment yet", known.version),
                };
                return Err(ManagerError::BadRequest(format!(
                    "job {name} has nothing to promote: {now}"
                )));
            }
            if !known.promoted {
                let mut record = (*known).clone();
                record.promoted = true;
                self.store_job(record).await?;
            }
        }
        self.job(name)
    }

    /// `POST /jobs/{name}/revert`: the job goes back to the spec of a kept version (its
    /// counts stay as they are now), as a new version.
    pub async fn revert_job(
        &self,
        name: &str,
        version: u64,
    ) -> Result<(JobSubmitted, JobView), ManagerError> {
        let outcome = {
            let _writing = self.job_writes.lock().await;
            let known = self.known_job(name)?;
            let history = lock(&self.cluster.state).histories.get(name).cloned();
            let Some(target) = history
                .as_ref()
                .and_then(|history| history.get(version))
                .filter(|target| target.version <= known.version)
            else {
                let kept: Vec<String> = history
                    .iter()
                    .flat_map(|history| history.versions.iter())
                    .filter(|kept| kept.version <= known.version)
                    .map(|kept| kept.version.to_string())
                    .collect();
                return Err(ManagerError::BadRequest(format!(
                    "Version: job {name} has no version {version} kept; its versions are {}",
                    if kept.is_empty() {
                        "none".to_string()
                    } else {
                        kept.join(", ")
                    }
                )));
            };
            let job = with_counts_of(target.job.clone(), &known.job);
            refuse_if_too_large(&job)?;
            let (outcome, record) = next_record(Some(&known), job, Some(version));
            match outcome {
                JobSubmitted::Changed | JobSubmitted::Created => {
                    self.store_new_version(Some(&known), record).await?
                }
                JobSubmitted::Scaled => self.store_job(record).await?,
                JobSubmitted::Unchanged => {}
            }
            outcome
        };
        Ok((outcome, self.job(name)?))
    }

    /// `GET /jobs/{name}/versions`: the kept versions, newest first.
    pub fn job_versions(&self, name: &str) -> Result<Vec<VersionView>, ManagerError> {
        let state = lock(&self.cluster.state);
        let known = state
            .jobs
            .get(name)
            .ok_or_else(|| ManagerError::JobNotFound(name.to_string()))?;
        let Some(history) = state.histories.get(name) else {
            return Ok(Vec::new());
        };
        Ok(history
            .versions
            .iter()
            .rev()
            .filter(|kept| kept.version <= known.version)
            .map(|kept| VersionView {
                version: kept.clone(),
                current: kept.version == known.version,
            })
            .collect())
    }

    /// `GET /jobs/{name}/deployment`: the job's last deployment.
    pub fn job_deployment(&self, name: &str) -> Result<Arc<Deployment>, ManagerError> {
        let state = lock(&self.cluster.state);
        let known = state
            .jobs
            .get(name)
            .ok_or_else(|| ManagerError::JobNotFound(name.to_string()))?;
        state.deployments.get(name).cloned().ok_or_else(|| {
            ManagerError::NoDeployment(format!(
                "job {name} has no deployment{}",
                if known.job.job_type == JobType::Service {
                    " yet"
                } else {
                    ": only service jobs are rolled out by deployments"
                }
            ))
        })
    }

    /// `POST /jobs/plan`: what submitting `job` would do now, computed by the same transformer
    /// the controller runs. Nothing changes.
    pub fn plan_job(&self, job: Job) -> Result<PlanView, ManagerError> {
        let findings = job.validate();
        if !findings.is_empty() {
            return Err(ManagerError::BadRequest(findings.join("; ")));
        }
        refuse_if_too_large(&job)?;
        // The job as the API last stored it (what a submission now would be compared with).
        let known = lock(&self.cluster.state).jobs.get(&job.name).cloned();
        let nodes = self.node_facts();
        let (tasks, deployment, history) = {
            let state = lock(&self.cluster.state);
            (
                state.cache.of_job(&job.name),
                state.deployments.get(&job.name).cloned(),
                state.histories.get(&job.name).cloned(),
            )
        };
        let (outcome, record) = next_record(known.as_deref(), job, None);
        let diff = match (&known, outcome) {
            (None, _) => vec!["a new job".to_string()],
            (Some(known), JobSubmitted::Changed | JobSubmitted::Scaled) => {
                known.job.diff(&record.job)
            }
            (Some(_), _) => Vec::new(),
        };
        let owned: Vec<&Task> = tasks.iter().map(|task| &**task).collect();
        let last_stable = history
            .as_ref()
            .and_then(|history| history.last_stable_before(record.version))
            .map(|stable| stable.version);
        let look = JobLook {
            record: &record,
            deployment: deployment.as_deref(),
            last_stable,
            nodes: &nodes,
            owned: &owned,
            now: Utc::now(),
        };
        let planned = plan(&look);
        let replace = crate::jobs::changed_copies(&record, &owned);
        Ok(PlanView {
            version: record.version,
            changed: outcome != JobSubmitted::Unchanged,
            outcome: outcome.word(),
            diff,
            replace,
            create: planned.create.iter().map(PlannedCreate::of).collect(),
            stop: planned.stop,
            keep: planned.keep,
        })
    }

    fn node_facts(&self) -> Vec<NodeFacts> {
        let state = lock(&self.cluster.state);
        let now = Instant::now();
        state
            .nodes
            .entries()
            .map(|entry| NodeFacts {
                name: entry.name.clone(),
                ready: entry.is_ready(now, self.cluster.heartbeat_grace()),
                labels: entry.labels.clone(),
                eligible: entry.eligible,
                drain: entry.drain.as_ref().map(|drain| drain.deadline),
            })
            .collect()
    }

    fn known_job(&self, name: &str) -> Result<Arc<JobRecord>, ManagerError> {
        lock(&self.cluster.state)
            .jobs
            .get(name)
            .cloned()
            .ok_or_else(|| ManagerError::JobNotFound(name.to_string()))
    }

    /// One job with its tasks (oldest first).
    pub fn job(&self, name: &str) -> Result<JobView, ManagerError> {
        self.job_page(name, None, usize::MAX).map(|(view, _)| view)
    }

    /// One job with a page of its tasks (oldest first): at most `limit`, from the task
    /// `start` on (the first when `None`), and the ID the next page starts from, if any. A
    /// `start` that is not one of the job's tasks is a bad request (removed since, or made up).
    pub fn job_page(
        &self,
        name: &str,
        start: Option<Uuid>,
        limit: usize,
    ) -> Result<(JobView, Option<Uuid>), ManagerError> {
        let (record, tasks, deployment) = {
            let state = lock(&self.cluster.state);
            let record = state
                .jobs
                .get(name)
                .cloned()
                .ok_or_else(|| ManagerError::JobNotFound(name.to_string()))?;
            (
                record,
                state.cache.of_job(name),
                state.deployments.get(name).cloned(),
            )
        };
        let mut view = view_of(&record, &tasks, deployment.as_ref());
        let mut sorted: Vec<&Arc<Task>> = tasks.iter().collect();
        sorted.sort_by_key(|task| (task.status.created_time, task.id));
        let first = match start {
            None => 0,
            Some(id) => sorted
                .iter()
                .position(|task| task.id == id)
                .ok_or_else(|| {
                    ManagerError::BadRequest(format!(
                        "next: job {name} has no task {id} to start the page from (it was \
                         removed since)"
                    ))
                })?,
        };
        let end = first.saturating_add(limit).min(sorted.len());
        let listed: Vec<Task> = sorted[first..end]
            .iter()
            .map(|task| {
                let mut task = (***task).clone();
                task.status.history.clear();
                task
            })
            .collect();
        let next = sorted.get(end).map(|task| task.id);
        view.tasks = Some(listed);
        view.queue = self.queue_entry_of_job(name);
        Ok((view, next))
    }

    /// Every job, by name, without its tasks.
    pub fn jobs(&self) -> Vec<JobView> {
        type Listed = (Arc<JobRecord>, Vec<Arc<Task>>, Option<Arc<Deployment>>);
        let records: Vec<Listed> = {
            let state = lock(&self.cluster.state);
            state
                .jobs
                .values()
                .map(|record| {
                    let name = &record.job.name;
                    (
                        record.clone(),
                        state.cache.of_job(name),
                        state.deployments.get(name).cloned(),
                    )
                })
                .collect()
        };
        records
            .iter()
            .map(|(record, tasks, deployment)| view_of(record, tasks, deployment.as_ref()))
            .collect()
    }
}

/// Refuses a job whose copies together would be more than one request may make
/// ([`Job::expansion_finding`]): checked on every path that sets a spec or a count.
fn refuse_if_too_large(job: &Job) -> Result<(), ManagerError> {
    match job.expansion_finding() {
        Some(finding) => Err(ManagerError::TooLarge(format!(
            "job {}: {finding}",
            job.name
        ))),
        None => Ok(()),
    }
}

/// What submitting `job` makes of the stored record `known`: a new job is version 1; the same
/// spec again (on a job that was not stopped) is unchanged; the same spec with other counts
/// is scaled (the same version); anything else is the next version, running again and not
/// promoted. `revert_of` says the spec is that of an earlier version. `POST /jobs` stores
/// it; `POST /jobs/plan` only plans with it.
fn next_record(
    known: Option<&JobRecord>,
    job: Job,
    revert_of: Option<u64>,
) -> (JobSubmitted, JobRecord) {
    let (outcome, version) = match known {
        None => (JobSubmitted::Created, 1),
        Some(known) if known.job == job && !known.stopped => {
            return (JobSubmitted::Unchanged, known.clone());
        }
        Some(known) if !known.stopped && same_but_counts(&known.job, &job) => {
            let mut scaled = known.clone();
            scaled.job = job;
            return (JobSubmitted::Scaled, scaled);
        }
        Some(known) => (JobSubmitted::Changed, known.version + 1),
    };
    let record = JobRecord {
        job,
        version,
        submit_time: Some(Utc::now()),
        stopped: false,
        promoted: false,
        revert_of,
    };
    (outcome, record)
}

/// The `Type` of a deployment's event: `DeploymentStarted` for a new one, the state it moved
/// to (`DeploymentPaused`, `DeploymentSuccessful`, `DeploymentFailed`, `DeploymentReverted`,
/// `DeploymentCancelled`, `DeploymentRunning` after a pause: promoted), or
/// `DeploymentProgress` when only its counts moved.
fn deployment_event_kind(before: Option<&Deployment>, after: &Deployment) -> &'static str {
    match before {
        Some(before) if before.id == after.id && before.state == after.state => {
            "DeploymentProgress"
        }
        Some(before) if before.id == after.id => match after.state {
            DeploymentState::Running => "DeploymentRunning",
            DeploymentState::Paused => "DeploymentPaused",
            DeploymentState::Successful => "DeploymentSuccessful",
            DeploymentState::Failed => "DeploymentFailed",
            DeploymentState::Reverted => "DeploymentReverted",
            DeploymentState::Cancelled => "DeploymentCancelled",
        },
        _ => "DeploymentStarted",
    }
}

/// Whether two jobs differ at most in their groups' counts.
fn same_but_counts(a: &Job, b: &Job) -> bool {
    let mut b = b.clone();
    if a.groups.len() != b.groups.len() {
        return false;
    }
    for (mine, theirs) in a.groups.iter().zip(b.groups.iter_mut()) {
        theirs.count = mine.count;
    }
    *a == b
}

/// `job` with the counts the groups of `now` have (a group `now` lacks keeps its own): a
/// revert restores a spec, not a scale.
fn with_counts_of(mut job: Job, now: &Job) -> Job {
    for group in &mut job.groups {
        if let Some(current) = now.groups.iter().find(|g| g.name == group.name) {
            group.count = current.count;
        }
    }
    job
}

fn view_of(
    record: &JobRecord,
    tasks: &[Arc<Task>],
    deployment: Option<&Arc<Deployment>>,
) -> JobView {
    let owned: Vec<&Task> = tasks.iter().map(|task| &**task).collect();
    let summary = summarize(record, &owned);
    let status = status_word(record, &owned, &summary);
    JobView {
        job: record.job.clone(),
        version: record.version,
        submit_time: record.submit_time,
        stopped: record.stopped,
        status: status.to_string(),
        summary,
        tasks: None,
        deployment: deployment.map(|deployment| (**deployment).clone()),
        outcome: None,
        queue: None,
        warnings: Vec::new(),
    }
}
