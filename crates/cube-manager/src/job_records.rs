//! A job's records and how they are written: the record (`jobs`), its kept versions
//! (`job_versions`) and its last deployment (`deployments`). Shared by the API (submit, scale,
//! stop, promote, revert) and the job controller (a deployment's progress, a version marked
//! stable, an automatic revert). Every write is durable before it is applied in memory and
//! wakes what it concerns.

use std::sync::Arc;

use chrono::Utc;
use cube_store::StoreError;
use cube_types::deployment::{Deployment, DeploymentState};
use cube_types::job::{Job, JobHistory, JobRecord, JobVersion};

use crate::cluster::{Cluster, lock};
use crate::events::{Topic, job_event_kind, job_object};

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

/// The write side of the jobs (see the module comment).
pub(crate) struct JobRecords {
    cluster: Arc<Cluster>,
    /// Held by every read-modify-write of a job record and its versions (submit, scale,
    /// stop, promote, revert, a version marked stable, an automatic revert), so that two of
    /// them never both start from the same record. A `tokio` mutex: held across the durable
    /// write.
    writes: tokio::sync::Mutex<()>,
}

impl JobRecords {
    pub(crate) fn new(cluster: Arc<Cluster>) -> JobRecords {
        JobRecords {
            cluster,
            writes: tokio::sync::Mutex::new(()),
        }
    }

    /// Holds the jobs' writes for one read-modify-write.
    pub(crate) async fn hold(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.writes.lock().await
    }

    /// Stores a job's deployment durably, then keeps it for the next look and the API.
    pub(crate) async fn store_deployment(
        &self,
        deployment: &Deployment,
        before: Option<&Deployment>,
    ) -> Result<(), StoreError> {
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
        let project = state
            .jobs
            .get(&deployment.job)
            .map(|record| record.job.project().to_string());
        self.cluster.publish(
            Topic::Deployment,
            kind,
            &deployment.job,
            Some(&deployment.job),
            project.as_deref(),
            serde_json::to_value(deployment).unwrap_or_default(),
        );
        state
            .deployments
            .insert(deployment.job.clone(), Arc::new(deployment.clone()));
        Ok(())
    }

    /// Marks a job's version stable: a deployment of it succeeded.
    pub(crate) async fn mark_stable(&self, name: &str, version: u64) -> Result<(), StoreError> {
        let _writing = self.writes.lock().await;
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
    pub(crate) async fn revert_after_failure(
        &self,
        name: &str,
        failed: u64,
        stable: u64,
    ) -> Result<(), StoreError> {
        let _writing = self.writes.lock().await;
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

    /// Stores a new version of a job: its entry in the job's history (with what changed),
    /// then the record. Called with [`JobRecords::hold`] held.
    pub(crate) async fn store_new_version(
        &self,
        known: Option<&JobRecord>,
        record: JobRecord,
    ) -> Result<(), StoreError> {
        let name = record.job.key();
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

    pub(crate) async fn store_history(
        &self,
        name: &str,
        history: JobHistory,
    ) -> Result<(), StoreError> {
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

    /// Stops job `name` (every copy is stopped by the job controller; the job stays,
    /// `Stopped`). Returns whether there is such a job.
    pub(crate) async fn stop(&self, name: &str) -> Result<bool, StoreError> {
        let _writing = self.hold().await;
        let Some(known) = lock(&self.cluster.state).jobs.get(name).cloned() else {
            return Ok(false);
        };
        if !known.stopped {
            let mut record = (*known).clone();
            record.stopped = true;
            self.store_job(record).await?;
        }
        Ok(true)
    }

    /// Stores a job record durably, then keeps it for the API's reads and the job controller,
    /// and wakes the job controller and the queue controller for it (a job record's write
    /// wakes both, declared here once).
    pub(crate) async fn store_job(&self, record: JobRecord) -> Result<(), StoreError> {
        let name = record.job.key();
        // Queued and published under the state lock, as a task's write is: the event comes
        // before anything the job controller does once the write is committed.
        let commit = {
            let state = lock(&self.cluster.state);
            let commit = self.cluster.stores.jobs.put_queued(&name, &record)?;
            let kind = job_event_kind(state.jobs.get(&name).map(|known| &**known), &record);
            self.cluster.publish(
                Topic::Job,
                kind,
                &name,
                Some(&name),
                Some(record.job.project()),
                job_object(&record),
            );
            commit
        };
        commit.durable().await?;
        {
            let mut state = lock(&self.cluster.state);
            state.queue_dirty.mark_job(&name);
            state.jobs.insert(name.clone(), Arc::new(record));
        }
        self.cluster.mark_job_dirty(&name);
        self.cluster.push_queue();
        Ok(())
    }
}

/// What submitting `job` makes of the stored record `known`: a new job is version 1; the same
/// spec again (on a job that was not stopped) is unchanged; the same spec with other counts
/// is scaled (the same version); anything else is the next version, running again and not
/// promoted. `revert_of` says the spec is that of an earlier version. `POST /jobs` stores
/// it; `POST /jobs/plan` only plans with it.
pub(crate) fn next_record(
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
pub(crate) fn with_counts_of(mut job: Job, now: &Job) -> Job {
    for group in &mut job.groups {
        if let Some(current) = now.groups.iter().find(|g| g.name == group.name) {
            group.count = current.count;
        }
    }
    job
}
