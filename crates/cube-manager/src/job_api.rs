//! The jobs as the API meets them: submitting, scaling, stopping, promoting, reverting and
//! planning a job (each a read-modify-write of its records under [`JobRecords::hold`]), and
//! the views of jobs the API answers with. The job controller (`job_controller.rs`) does the
//! rest.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::Utc;
use cube_types::Task;
use cube_types::deployment::Deployment;
use cube_types::job::{Job, JobRecord, JobType, JobVersion};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::cluster::lock;
use crate::job_records::{JobSubmitted, next_record, with_counts_of};
use crate::jobs::{GroupSummary, JobLook, PlannedStop, plan, status_word, summarize};
use crate::manager::{Manager, ManagerError};
use crate::paging::{PagePosition, PageStart};
use crate::queue_controller::QueueView;

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
    /// `POST /jobs`: a new job, a changed one (its version goes up; a stopped job submitted
    /// again runs again), one whose counts alone changed (scaled: the same version), or the
    /// same one again (nothing happens).
    pub async fn submit_job(&self, job: Job) -> Result<(JobSubmitted, JobView), ManagerError> {
        let findings = job.validate();
        if !findings.is_empty() {
            return Err(ManagerError::BadRequest(findings.join("; ")));
        }
        refuse_if_too_large(&job)?;
        self.check_quota(job.project(), &job_usage(&job))?;
        let name = job.key();
        {
            let whose: Vec<String> = job
                .groups
                .iter()
                .map(|group| format!("group {} of job {}", group.name, job.name))
                .collect();
            let routes: Vec<_> = job
                .groups
                .iter()
                .zip(&whose)
                .map(|(group, whose)| (whose.as_str(), group.task.spec.route.as_ref()))
                .collect();
            let state = lock(&self.cluster.state);
            crate::routes::refuse_taken_hosts(&state, &routes, Some(&name))?;
        }
        let mut warnings = Vec::new();
        let outcome = {
            let _writing = self.job_records.hold().await;
            let known = lock(&self.cluster.state).jobs.get(&name).cloned();
            let (outcome, record) = next_record(known.as_deref(), job, None);
            if outcome != JobSubmitted::Unchanged {
                warnings = self.job_fits_nowhere_today(&record);
            }
            match outcome {
                JobSubmitted::Created | JobSubmitted::Changed => {
                    self.job_records
                        .store_new_version(known.as_deref(), record)
                        .await?
                }
                JobSubmitted::Scaled => self.job_records.store_job(record).await?,
                JobSubmitted::Unchanged => {}
            }
            outcome
        };
        let mut view = self.job(&name)?;
        view.warnings = warnings;
        Ok((outcome, view))
    }

    /// `DELETE /jobs/{name}`: every copy is stopped; the job stays, `Stopped`.
    pub async fn stop_job(&self, name: &str) -> Result<JobView, ManagerError> {
        if !self.job_records.stop(name).await? {
            return Err(ManagerError::JobNotFound(name.to_string()));
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
            let _writing = self.job_records.hold().await;
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
                self.check_quota(record.job.project(), &job_usage(&record.job))?;
                warnings = self.job_fits_nowhere_today(&record);
                self.job_records.store_job(record).await?;
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
            let _writing = self.job_records.hold().await;
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
                self.job_records.store_job(record).await?;
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
            let _writing = self.job_records.hold().await;
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
                    self.job_records
                        .store_new_version(Some(&known), record)
                        .await?
                }
                JobSubmitted::Scaled => self.job_records.store_job(record).await?,
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
        let known = lock(&self.cluster.state).jobs.get(&job.key()).cloned();
        let (outcome, record) = next_record(known.as_deref(), job, None);
        let (nodes, (tasks, deployment, last_stable)) = {
            let state = lock(&self.cluster.state);
            (
                self.cluster.node_facts(&state, record.job.job_type),
                state.job_look_inputs(&record.job.key(), record.version),
            )
        };
        let diff = match (&known, outcome) {
            (None, _) => vec!["a new job".to_string()],
            (Some(known), JobSubmitted::Changed | JobSubmitted::Scaled) => {
                known.job.diff(&record.job)
            }
            (Some(_), _) => Vec::new(),
        };
        let owned: Vec<&Task> = tasks.iter().map(|task| &**task).collect();
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

    /// One job with a page of its tasks (oldest first): at most `limit`, from `start` on (the
    /// first when `None`), and the position the next page starts from, if any. A task ID
    /// (an older Cube's token) that is not one of the job's tasks is a bad request (removed
    /// since, or made up); a position is good whatever was removed since.
    pub fn job_page(
        &self,
        name: &str,
        start: Option<PageStart>,
        limit: usize,
    ) -> Result<(JobView, Option<PagePosition>), ManagerError> {
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
        let first =
            match start {
                None => 0,
                Some(PageStart::At(position)) => {
                    sorted.partition_point(|task| PagePosition::of(task) < position)
                }
                Some(PageStart::Task(id)) => sorted
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
        let next = sorted.get(end).map(|task| PagePosition::of(task));
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
                    let name = &record.job.key();
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

/// What a job's copies declare together, as its project's quota counts them (a system job:
/// one copy per group, the least it runs).
fn job_usage(job: &Job) -> cube_types::project::Usage {
    let mut usage = cube_types::project::Usage::default();
    for group in &job.groups {
        let copies = u64::from(group.count.unwrap_or(1));
        let task = &group.task.spec;
        usage.add(&cube_types::project::Usage {
            cpus: task.cpu * copies as f64,
            memory: task.memory.saturating_mul(copies),
            disk: task.disk.saturating_mul(copies),
            tasks: copies,
        });
    }
    usage
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
