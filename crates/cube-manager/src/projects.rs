//! Projects: which records a request may see ([`Scope`], the [`scoped`] layer on every
//! route), and the projects themselves, with their quotas (`GET|POST /projects`,
//! `GET|DELETE /projects/{name}`, `PUT /projects/{name}/quota`).
//!
//! A request names its project with `?project=NAME` (`*` for every project its token
//! reaches); without it, `default`. A token reaches the projects it lists (`acl.rs`,
//! `TokenRecord::reaches`); what it does not reach answers as if it did not exist: a read by
//! ID is a 404 with the words of a record that is not there, a list leaves it out, an event
//! of it is not sent. IDs stay global: a read by ID needs no `?project=`, but one that names
//! another project than the record's is a 404 too. Nodes, tokens and the cluster's own
//! routes are cluster-wide.
//!
//! A project's usage is what its placed tasks declare, kept by the task cache as tasks are
//! observed (`TaskCache::usage_of`), so it is recomputed from the tasks at every start and
//! on a new leader; its quota is applied by the placement pass (`placement.rs`), which holds
//! a request that would take the project over it, saying so in its `PendingReason`.

use std::sync::Arc;

use axum::Json;
use axum::extract::{MatchedPath, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use chrono::Utc;
use cube_api::{ApiError, JsonPath};
use cube_types::State as TaskState;
use cube_types::project::{
    ALL_PROJECTS, DEFAULT_PROJECT, ProjectRecord, ProjectRequest, ProjectView, Quota, Usage,
    check_project_name,
};
use cube_types::token::Role;
use uuid::Uuid;

use crate::cluster::lock;
use crate::manager::{Manager, ManagerError};

/// The query parameter that names a request's project.
pub const PROJECT_PARAM: &str = "project";

/// What one request may see: the project it asked for (or all) and the projects its token
/// reaches. Put in every request by [`scoped`]; read by the handlers that list, stream or
/// create records.
#[derive(Debug, Clone)]
pub struct Scope {
    /// `None`: every project the token reaches (`?project=*`).
    asked: Option<String>,
    /// Whether `?project=` was given (a read by ID checks it only then).
    named: bool,
    /// `None`: every project (no ACL, or a `management` token).
    reach: Option<(Role, Vec<String>)>,
}

impl Scope {
    /// Every project, as `?project=*` without ACL sees them: for tests.
    pub fn everything() -> Scope {
        Scope {
            asked: None,
            named: true,
            reach: None,
        }
    }

    /// Whether the token may see and act on `project`'s records.
    pub fn reaches(&self, project: &str) -> bool {
        match &self.reach {
            None => true,
            Some((role, projects)) => cube_types::token::reaches(*role, projects, project),
        }
    }

    /// Whether a list or a stream shows `project`'s records: the project asked for (or all),
    /// and one the token reaches.
    pub fn lists(&self, project: &str) -> bool {
        self.asked.as_deref().is_none_or(|asked| asked == project) && self.reaches(project)
    }

    /// Whether an event is one a list or a stream of this scope shows: one of a project it
    /// lists, or of what is cluster-wide (a node: no project). A blocking query of a list
    /// wakes only for those, not for another project's change.
    pub fn lists_event(&self, event: &crate::events::Event) -> bool {
        event
            .project
            .as_deref()
            .is_none_or(|project| self.lists(project))
    }

    /// Whether a record of `project` read by its ID is shown: one the token reaches, and
    /// the project named, when one was.
    fn shows(&self, project: &str) -> bool {
        self.reaches(project)
            && (!self.named || self.asked.as_deref().is_none_or(|asked| asked == project))
    }

    /// The project a new record goes in: the one asked for; `?project=*` names none.
    pub fn target(&self) -> Result<&str, ApiError> {
        self.asked.as_deref().ok_or_else(|| {
            ApiError::bad_request(format!(
                "?project={ALL_PROJECTS} names no project to create in; name one \
                 (?project=NAME, cube --project NAME)"
            ))
        })
    }

    /// The key of job `name` in the project asked for (`cube_types::job::job_key`); a job is
    /// named within one project, so `?project=*` names none.
    pub fn job_key(&self, name: &str) -> Result<String, ApiError> {
        match &self.asked {
            Some(project) => Ok(cube_types::job::job_key(project, name)),
            None => Err(ApiError::bad_request(format!(
                "?project={ALL_PROJECTS} names no project; a job is named within one \
                 (?project=NAME, cube --project NAME)"
            ))),
        }
    }

    /// The project a submitted record goes in: the one its body names, which must agree with
    /// `?project=` when both are given, or the one asked for (a body that names `default`
    /// names nothing: a task read without `Project` reads as `default`). 404 for a project
    /// the token does not reach.
    pub fn settle(&self, named_in_body: &mut String) -> Result<(), ApiError> {
        self.settle_named(named_in_body)?;
        if !self.reaches(named_in_body) {
            return Err(no_project(named_in_body));
        }
        Ok(())
    }

    fn settle_named(&self, named_in_body: &mut String) -> Result<(), ApiError> {
        let body = (!cube_types::project::is_default(named_in_body)).then(|| named_in_body.clone());
        match (body, self.named.then_some(self.asked.as_deref()).flatten()) {
            (Some(body), Some(asked)) if body != asked => Err(ApiError::bad_request(format!(
                "Project: the body says {body:?}, ?project= says {asked:?}; give one, or the same"
            ))),
            (Some(_), _) => Ok(()),
            (None, _) => {
                *named_in_body = self.target()?.to_string();
                Ok(())
            }
        }
    }
}

/// The error of a project that does not exist, or that the token does not reach.
fn no_project(name: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no project named {name:?} (cube project list; cube project create {name})"),
    )
}

/// The layer on every route: reads `?project=` (and takes it out of the query, so that each
/// route's own query parameters stay checked as before), puts the request's [`Scope`] in it,
/// and answers 404 for a record read by ID that the scope does not show, with the words of
/// a record that is not there.
pub async fn scoped(
    State(manager): State<Arc<Manager>>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let asked = match take_project_param(request.uri()) {
        Ok((asked, uri)) => {
            if let Some(uri) = uri {
                *request.uri_mut() = uri;
            }
            asked
        }
        Err(error) => return error.into_response(),
    };
    let (asked, named) = match asked {
        Asked::Absent => (Some(DEFAULT_PROJECT.to_string()), false),
        Asked::All => (None, true),
        Asked::One(name) => (Some(name), true),
    };
    let reach = request
        .extensions()
        .get::<crate::acl::Submitter>()
        .filter(|submitter| submitter.role != Role::Management)
        .map(|submitter| (submitter.role, submitter.projects.clone()));
    let scope = Scope {
        asked,
        named,
        reach,
    };
    if let Some(project) = scope.asked.as_deref().filter(|_| scope.named)
        && (!scope.reaches(project) || !manager.project_exists(project))
    {
        return no_project(project).into_response();
    }
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_string())
        .unwrap_or_default();
    if let Some(hidden) = hidden_record(&manager, &scope, &route, request.uri().path()) {
        return hidden.into_response();
    }
    request.extensions_mut().insert(scope);
    next.run(request).await
}

/// What `?project=` said.
enum Asked {
    Absent,
    /// `*`.
    All,
    One(String),
}

/// `?project=` of `uri`, and the URI without it when it was there.
fn take_project_param(uri: &Uri) -> Result<(Asked, Option<Uri>), ApiError> {
    let Some(query) = uri.query() else {
        return Ok((Asked::Absent, None));
    };
    let mut asked = Asked::Absent;
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key != PROJECT_PARAM {
            rest.push(pair);
            continue;
        }
        if !matches!(asked, Asked::Absent) {
            return Err(ApiError::bad_request(
                "project: given twice; name one project, or * for every one",
            ));
        }
        let value = value.replace("%2A", "*").replace("%2a", "*");
        asked = if value == ALL_PROJECTS {
            Asked::All
        } else {
            check_project_name(&value)
                .map_err(|why| ApiError::bad_request(format!("project: {why}")))?;
            Asked::One(value)
        };
    }
    if matches!(asked, Asked::Absent) {
        return Ok((asked, None));
    }
    let path = uri.path();
    let rebuilt = if rest.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{}", rest.join("&"))
    };
    let uri = rebuilt
        .parse::<Uri>()
        .map_err(|err| ApiError::bad_request(format!("the query: {err}")))?;
    Ok((asked, Some(uri)))
}

/// The answer for a route that reads one record by ID or name (a task, a job, a waiting
/// request) when the scope does not show it: the 404 of a record that is not there.
fn hidden_record(manager: &Manager, scope: &Scope, route: &str, path: &str) -> Option<ApiError> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let hidden = |project: Option<String>| project.is_some_and(|project| !scope.shows(&project));
    if route.starts_with("/tasks/{id}") {
        let id = segments.get(1).and_then(|id| Uuid::parse_str(id).ok())?;
        return hidden(manager.project_of_task(&id)).then(|| ManagerError::NotFound(id).into());
    }
    if route.starts_with("/jobs/{name}") {
        // A job is looked up under its project's key, so another project's job of the same
        // name is not found; what is left is a project the token does not reach.
        let name = segments.get(1)?.to_string();
        let project = scope.asked.as_deref()?;
        return (!scope.reaches(project)).then(|| ManagerError::JobNotFound(name).into());
    }
    if route == "/queue/{kind}/{id}" {
        let id = segments.get(2)?.to_string();
        let project = match *segments.get(1)? {
            "task" => Uuid::parse_str(&id)
                .ok()
                .and_then(|id| manager.project_of_task(&id)),
            "job" => scope
                .job_key(&id)
                .ok()
                .and_then(|key| manager.project_of_job(&key)),
            _ => None,
        };
        return hidden(project).then(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no entry in the waiting list for {} {id}", segments[1]),
            )
        });
    }
    if route.starts_with("/projects/{name}") {
        let name = segments.get(1)?;
        return (!scope.reaches(name)).then(|| no_project(name));
    }
    None
}

impl Manager {
    /// [`Manager::prune`] of what the projects `scope` lists hold (`POST /tasks/prune`).
    pub async fn prune_in(
        &self,
        older_than: std::time::Duration,
        scope: &Scope,
    ) -> crate::gc::Pruned {
        self.garbage_collector()
            .prune_in(older_than, &|project| scope.lists(project))
            .await
    }

    /// Whether `name` is a project: `default`, or one made.
    pub fn project_exists(&self, name: &str) -> bool {
        name == DEFAULT_PROJECT || lock(&self.cluster.state).projects.contains_key(name)
    }

    /// The project of task `id`, if the manager has it.
    pub fn project_of_task(&self, id: &Uuid) -> Option<String> {
        lock(&self.cluster.state)
            .cache
            .get(id)
            .map(|task| task.spec.project.clone())
    }

    /// The project of job `name`, if the manager has it.
    pub fn project_of_job(&self, name: &str) -> Option<String> {
        lock(&self.cluster.state)
            .jobs
            .get(name)
            .map(|record| record.job.project().to_string())
    }

    /// Refuses a request for a project whose shard this manager does not hold: its records
    /// would be written where their owner does not look.
    pub(crate) fn check_owner(&self, project: &str) -> Result<(), ManagerError> {
        let scope = &lock(&self.cluster.state).scope;
        if scope.holds_project(project) {
            return Ok(());
        }
        Err(ManagerError::NotOwner {
            project: project.to_string(),
            shard: scope.shard_of(project),
        })
    }

    /// Refuses a request for `project` that does not exist, or that could never be let in
    /// under its quota however little the project used (422 naming the limit); a request
    /// that fits the quota but not what is left of it is accepted and waits.
    pub(crate) fn check_quota(&self, project: &str, request: &Usage) -> Result<(), ManagerError> {
        self.check_owner(project)?;
        let state = lock(&self.cluster.state);
        let record = state.projects.get(project);
        if record.is_none() && project != DEFAULT_PROJECT {
            return Err(ManagerError::ProjectNotFound(project.to_string()));
        }
        if let Some(why) = record.and_then(|record| record.quota.never_fits(request)) {
            return Err(ManagerError::OverQuota(format!(
                "the request could never fit the quota of project {project}: {why} (cube \
                 project set-quota {project} to raise it)"
            )));
        }
        Ok(())
    }

    /// Every project the scope reaches, with its usage and counts.
    pub fn projects(&self, scope: &Scope) -> Vec<ProjectView> {
        let state = lock(&self.cluster.state);
        let mut names: Vec<String> = state.projects.keys().cloned().collect();
        if !names.iter().any(|name| name == DEFAULT_PROJECT) {
            names.insert(0, DEFAULT_PROJECT.to_string());
        }
        names.sort();
        names
            .into_iter()
            .filter(|name| scope.reaches(name))
            .map(|name| view_of(&state, &name, self.config.shards.ring()))
            .collect()
    }

    /// One project, with its usage and counts.
    pub fn project(&self, name: &str) -> Result<ProjectView, ManagerError> {
        let state = lock(&self.cluster.state);
        if name != DEFAULT_PROJECT && !state.projects.contains_key(name) {
            return Err(ManagerError::ProjectNotFound(name.to_string()));
        }
        Ok(view_of(&state, name, self.config.shards.ring()))
    }

    /// `POST /projects`: a new project (409 if it exists).
    pub async fn create_project(
        &self,
        request: ProjectRequest,
    ) -> Result<ProjectView, ManagerError> {
        check_project_name(&request.name).map_err(ManagerError::BadRequest)?;
        check_quota_values(&request.quota)?;
        if self.project_exists(&request.name) {
            return Err(ManagerError::Conflict(format!(
                "project {} exists (cube project status {})",
                request.name, request.name
            )));
        }
        let record = ProjectRecord {
            name: request.name.clone(),
            quota: request.quota,
            create_time: Some(Utc::now()),
        };
        self.store_project(record).await?;
        self.project(&request.name)
    }

    /// `PUT /projects/{name}/quota`: the project's quota, replaced whole (`{}`: no limit).
    /// Lowering it below what is used stops nothing; it holds new requests. Every waiting
    /// request is looked at again: a raise may let some in.
    pub async fn set_quota(&self, name: &str, quota: Quota) -> Result<ProjectView, ManagerError> {
        check_quota_values(&quota)?;
        let known = {
            let state = lock(&self.cluster.state);
            if name != DEFAULT_PROJECT && !state.projects.contains_key(name) {
                return Err(ManagerError::ProjectNotFound(name.to_string()));
            }
            state.projects.get(name).cloned()
        };
        let record = ProjectRecord {
            name: name.to_string(),
            quota,
            create_time: known
                .and_then(|known| known.create_time)
                .or(Some(Utc::now())),
        };
        self.store_project(record).await?;
        self.cluster.push_waiting();
        self.project(name)
    }

    /// `DELETE /projects/{name}`: refused while anything in it has not ended (a task, a job
    /// not stopped, a waiting request), and for `default`.
    pub async fn remove_project(&self, name: &str) -> Result<(), ManagerError> {
        if name == DEFAULT_PROJECT {
            return Err(ManagerError::Conflict(
                "project default always exists; it cannot be removed".to_string(),
            ));
        }
        {
            let state = lock(&self.cluster.state);
            if !state.projects.contains_key(name) {
                return Err(ManagerError::ProjectNotFound(name.to_string()));
            }
            let view = view_of(&state, name, self.config.shards.ring());
            if view.tasks > 0 || view.jobs > 0 {
                return Err(ManagerError::Conflict(format!(
                    "project {name} still has {} task{} not ended and {} job{} not stopped; \
                     stop them first (cube --project {name} status)",
                    view.tasks,
                    if view.tasks == 1 { "" } else { "s" },
                    view.jobs,
                    if view.jobs == 1 { "" } else { "s" },
                )));
            }
        }
        self.cluster.stores.projects.delete(name)?;
        lock(&self.cluster.state).projects.remove(name);
        self.cluster.publish(
            crate::events::Topic::Project,
            "ProjectRemoved",
            name,
            None,
            Some(name),
            serde_json::json!({"Name": name}),
        );
        Ok(())
    }

    async fn store_project(&self, record: ProjectRecord) -> Result<(), ManagerError> {
        let commit = self
            .cluster
            .stores
            .projects
            .put_queued(&record.name, &record)?;
        commit.durable().await?;
        let mut state = lock(&self.cluster.state);
        let kind = if state.projects.contains_key(&record.name) {
            "ProjectUpdated"
        } else {
            "ProjectCreated"
        };
        self.cluster.publish(
            crate::events::Topic::Project,
            kind,
            &record.name,
            None,
            Some(&record.name),
            serde_json::to_value(&record).unwrap_or_default(),
        );
        state.projects.insert(record.name.clone(), Arc::new(record));
        Ok(())
    }
}

/// A quota's values as a person can mean them: no negative or endless CPU.
fn check_quota_values(quota: &Quota) -> Result<(), ManagerError> {
    if let Some(cpus) = quota.cpus
        && !(cpus.is_finite() && (0.0..=cube_types::node::MAX_CPU_CORES * 1e6).contains(&cpus))
    {
        return Err(ManagerError::BadRequest(format!(
            "Quota.Cpus: {cpus} is not a number of cores >= 0"
        )));
    }
    Ok(())
}

/// A project as `GET /projects` shows it; its counts read every task (a status, not a hot
/// path).
fn view_of(state: &crate::cluster::Shared, name: &str, ring: u32) -> ProjectView {
    let record = state.projects.get(name);
    // One pass over the tasks: those not ended, and of those the ones waiting for room.
    let (mut tasks, mut waiting) = (0u64, 0u64);
    for task in state.cache.tasks() {
        if task.spec.project != name || task.status.state.is_terminal() {
            continue;
        }
        tasks += 1;
        if task.status.state == TaskState::Pending && task.spec.desired_state == TaskState::Running
        {
            waiting += 1;
        }
    }
    let jobs = state
        .jobs
        .values()
        .filter(|record| record.job.project() == name && !record.stopped)
        .count() as u64;
    ProjectView {
        name: name.to_string(),
        quota: record.map(|record| record.quota).unwrap_or_default(),
        usage: state.cache.usage_of(name),
        tasks,
        jobs,
        waiting,
        create_time: record.and_then(|record| record.create_time),
        shard: cube_types::shard::shard_of(name, ring),
    }
}

/// `GET /projects`.
pub async fn list_projects(
    State(manager): State<Arc<Manager>>,
    scope: axum::Extension<Scope>,
) -> Json<Vec<ProjectView>> {
    Json(manager.projects(&scope))
}

/// `POST /projects` with `{"Name": "team-a", "Quota": {...}}`.
pub async fn create_project(
    State(manager): State<Arc<Manager>>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<(StatusCode, Json<ProjectView>), ApiError> {
    let request: ProjectRequest =
        cube_types::event::decode(&body?).map_err(|err| ApiError::bad_request(err.to_string()))?;
    Ok((
        StatusCode::CREATED,
        Json(manager.create_project(request).await?),
    ))
}

/// `GET /projects/{name}`.
pub async fn get_project(
    State(manager): State<Arc<Manager>>,
    JsonPath(name): JsonPath<String>,
) -> Result<Json<ProjectView>, ApiError> {
    Ok(Json(manager.project(&name)?))
}

/// `PUT /projects/{name}/quota` with `{"Cpus": 8, "Memory": "16Gi", "Disk": "100Gi",
/// "Tasks": 200}` (any subset; what is left out has no limit).
pub async fn set_quota(
    State(manager): State<Arc<Manager>>,
    JsonPath(name): JsonPath<String>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<ProjectView>, ApiError> {
    let quota: Quota = cube_types::event::decode(&body?)
        .map_err(|err| ApiError::bad_request(format!("the quota: {err}")))?;
    Ok(Json(manager.set_quota(&name, quota).await?))
}

/// `DELETE /projects/{name}`.
pub async fn remove_project(
    State(manager): State<Arc<Manager>>,
    JsonPath(name): JsonPath<String>,
) -> Result<StatusCode, ApiError> {
    manager.remove_project(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}
