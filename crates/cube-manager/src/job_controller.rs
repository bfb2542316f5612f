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
use cube_types::job::{Job, JobRecord, JobType};
use cube_types::{Receiver, Task};
use serde::{Deserialize, Serialize};

use cube_controller::runner::{Action, ExponentialBackoff, ReadyGate};
use cube_controller::watcher::Watcher;

use crate::events::{Topic, job_event_kind, job_object};
use crate::jobs::{GroupSummary, JobPlan, NodeFacts, plan, status_word, summarize};
use crate::manager::{Manager, ManagerError, Writes, lock};
use crate::store_source::TableSource;

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
}

/// What `POST /jobs/plan` answers: the version the job would get, whether its spec changed,
/// and the plan.
#[derive(Debug, Clone, Serialize)]
pub struct PlanView {
    #[serde(rename = "Version")]
    pub version: u64,
    #[serde(rename = "Changed")]
    pub changed: bool,
    /// `Create`, `Stop` and `Keep`, as the controller would carry them out.
    #[serde(flatten)]
    pub plan: JobPlan,
}

/// What the job transformer reads for one job: the record, every node's facts, the tasks
/// the job owns.
struct JobInputs {
    record: Arc<JobRecord>,
    nodes: Vec<NodeFacts>,
    tasks: Vec<Arc<Task>>,
}

/// How a job submission went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobSubmitted {
    Created,
    Changed,
    Unchanged,
}

impl Manager {
    /// Asks the job controller to look at a job again.
    pub(crate) fn mark_job_dirty(&self, name: &str) {
        self.jobs_runner.push(name.to_string());
    }

    /// Marks every system job (a node joined, left, came back or changed its labels).
    pub(crate) fn mark_system_jobs_dirty(&self) {
        let jobs = self.jobs_observed.snapshot().items;
        for record in jobs.values() {
            if record.job.job_type == JobType::System && !record.stopped {
                self.mark_job_dirty(&record.job.name);
            }
        }
    }

    /// Marks every job (at start and at each resync).
    pub(crate) fn mark_all_jobs_dirty(&self) {
        for name in self.jobs_observed.snapshot().items.keys() {
            self.mark_job_dirty(name);
        }
    }

    /// Follows the jobs table through the store's watch (a listing, then every change) into
    /// [`Manager::jobs_observed`], and pushes the name of every job that changed to the job
    /// controller. When the watch is lost the watcher lists again and every job is looked at.
    pub(crate) async fn run_jobs_watcher(self: Arc<Self>) {
        let watcher = Watcher::new(
            TableSource::new(self.stores.jobs.clone()),
            self.jobs_observed.clone(),
        );
        let following = async {
            let mut since = self.jobs_observed.index();
            loop {
                match self.jobs_observed.wait_changes_since(since).await {
                    Ok(deltas) => {
                        for delta in deltas {
                            since = delta.index;
                            self.mark_job_dirty(&delta.key);
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
                manager
                    .converge_job(&name)
                    .await
                    .map(|()| Action::Done)
                    .map_err(|err| {
                        tracing::warn!(job = %name, error = %err, "a job did not converge; trying again");
                        err.to_string()
                    })
            }
        };
        self.jobs_runner
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
        let tasks = lock(&self.state).cache.of_job(name);
        Some(JobInputs {
            record,
            nodes,
            tasks,
        })
    }

    pub(crate) async fn converge_job(&self, name: &str) -> Result<(), ManagerError> {
        let Some(JobInputs {
            record,
            nodes,
            tasks,
        }) = self.job_inputs(name)
        else {
            return Ok(());
        };
        let owned: Vec<&Task> = tasks.iter().map(|task| &**task).collect();
        let planned = plan(&record, &nodes, &owned);
        if planned.is_empty() {
            return Ok(());
        }
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
            let mut state = lock(&self.state);
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
                self.save(&mut state, &mut writes, task.clone())?;
                accepted.push(task);
                Ok(())
            })
        };
        // What was queued is waited for even when a later task was refused.
        self.settle(writes).await?;
        stored?;
        self.push_waiting();
        Ok(accepted)
    }

    // ----- the API's side -----

    /// `POST /jobs`: a new job, a changed one (its version goes up; a stopped job submitted
    /// again runs again), or the same one again (nothing happens).
    pub async fn submit_job(&self, job: Job) -> Result<(JobSubmitted, JobView), ManagerError> {
        let findings = job.validate();
        if !findings.is_empty() {
            return Err(ManagerError::BadRequest(findings.join("; ")));
        }
        let name = job.name.clone();
        let known = lock(&self.state).jobs.get(&name).cloned();
        let (outcome, record) = next_record(known.as_deref(), job);
        if outcome != JobSubmitted::Unchanged {
            self.store_job(record).await?;
        }
        Ok((outcome, self.job(&name)?))
    }

    /// Stores a job record durably, then keeps it for the API's reads. The job controller
    /// hears of it from the store's watch (`run_jobs_watcher`), like of any other write.
    async fn store_job(&self, record: JobRecord) -> Result<(), ManagerError> {
        let name = record.job.name.clone();
        // Queued and published under the state lock, as a task's write is: the event comes
        // before anything the job controller does once the write is committed.
        let commit = {
            let state = lock(&self.state);
            let commit = self.stores.jobs.put_queued(&name, &record)?;
            let kind = job_event_kind(state.jobs.get(&name).map(|known| &**known), &record);
            self.publish(Topic::Job, kind, &name, Some(&name), job_object(&record));
            commit
        };
        commit.durable().await?;
        lock(&self.state).jobs.insert(name, Arc::new(record));
        Ok(())
    }

    /// `DELETE /jobs/{name}`: every copy is stopped; the job stays, `Stopped`.
    pub async fn stop_job(&self, name: &str) -> Result<JobView, ManagerError> {
        let known = self.known_job(name)?;
        if !known.stopped {
            let mut record = (*known).clone();
            record.stopped = true;
            self.store_job(record).await?;
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
        let known = self.known_job(name)?;
        let mut record = (*known).clone();
        if record.job.job_type == JobType::System {
            return Err(ManagerError::BadRequest(format!(
                "job {name} is a system job: it runs one copy on every matching node and has no \
                 count to scale"
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
            self.store_job(record).await?;
        }
        self.job(name)
    }

    /// `POST /jobs/plan`: what submitting `job` would do now, computed by the same transformer
    /// the controller runs. Nothing changes.
    pub fn plan_job(&self, job: Job) -> Result<PlanView, ManagerError> {
        let findings = job.validate();
        if !findings.is_empty() {
            return Err(ManagerError::BadRequest(findings.join("; ")));
        }
        // The job as the API last stored it (what a submission now would be compared with).
        let known = lock(&self.state).jobs.get(&job.name).cloned();
        let nodes = self.node_facts();
        let tasks = lock(&self.state).cache.of_job(&job.name);
        let (outcome, record) = next_record(known.as_deref(), job);
        let changed = outcome != JobSubmitted::Unchanged;
        let owned: Vec<&Task> = tasks.iter().map(|task| &**task).collect();
        Ok(PlanView {
            version: record.version,
            changed,
            plan: plan(&record, &nodes, &owned),
        })
    }

    fn node_facts(&self) -> Vec<NodeFacts> {
        let state = lock(&self.state);
        let now = Instant::now();
        state
            .nodes
            .entries()
            .map(|entry| NodeFacts {
                name: entry.name.clone(),
                ready: entry.is_ready(now, self.config.heartbeat_grace),
                labels: entry.labels.clone(),
            })
            .collect()
    }

    fn known_job(&self, name: &str) -> Result<Arc<JobRecord>, ManagerError> {
        lock(&self.state)
            .jobs
            .get(name)
            .cloned()
            .ok_or_else(|| ManagerError::JobNotFound(name.to_string()))
    }

    /// One job with its tasks (oldest first).
    pub fn job(&self, name: &str) -> Result<JobView, ManagerError> {
        let (record, tasks) = {
            let state = lock(&self.state);
            let record = state
                .jobs
                .get(name)
                .cloned()
                .ok_or_else(|| ManagerError::JobNotFound(name.to_string()))?;
            (record, state.cache.of_job(name))
        };
        let mut view = view_of(&record, &tasks);
        let mut listed: Vec<Task> = tasks.iter().map(|task| (**task).clone()).collect();
        listed.sort_by_key(|task| (task.status.created_time, task.id));
        for task in &mut listed {
            task.status.history.clear();
        }
        view.tasks = Some(listed);
        Ok(view)
    }

    /// Every job, by name, without its tasks.
    pub fn jobs(&self) -> Vec<JobView> {
        let records: Vec<(Arc<JobRecord>, Vec<Arc<Task>>)> = {
            let state = lock(&self.state);
            state
                .jobs
                .values()
                .map(|record| (record.clone(), state.cache.of_job(&record.job.name)))
                .collect()
        };
        records
            .iter()
            .map(|(record, tasks)| view_of(record, tasks))
            .collect()
    }
}

/// What submitting `job` makes of the stored record `known`: a new job is version 1; the same
/// spec again (on a job that was not stopped) is unchanged; anything else is the next version,
/// running again. `POST /jobs` stores it; `POST /jobs/plan` only plans with it.
fn next_record(known: Option<&JobRecord>, job: Job) -> (JobSubmitted, JobRecord) {
    let (outcome, version) = match known {
        None => (JobSubmitted::Created, 1),
        Some(known) if known.job == job && !known.stopped => {
            return (JobSubmitted::Unchanged, known.clone());
        }
        Some(known) => (JobSubmitted::Changed, known.version + 1),
    };
    let record = JobRecord {
        job,
        version,
        submit_time: Some(Utc::now()),
        stopped: false,
    };
    (outcome, record)
}

fn view_of(record: &JobRecord, tasks: &[Arc<Task>]) -> JobView {
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
    }
}
