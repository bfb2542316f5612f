//! The manager's HTTP API. The only place where a [`ManagerError`] becomes an HTTP status.
//!
//! Jobs: `POST /jobs`, `GET /jobs`, `GET|DELETE /jobs/{name}`, `POST /jobs/plan`, `POST
//! /jobs/{name}/scale`, `GET /jobs/{name}/versions`, `POST /jobs/{name}/revert`
//! (`{"Version": N}`), `POST /jobs/{name}/promote`, `GET /jobs/{name}/deployment`.
//!
//! Tasks: `POST /tasks` (a `TaskEvent` as in the book, or a bare `Task`; 201 with the task, 200
//! when a task with that ID exists), `GET /tasks`, `GET /tasks/{id}`, `DELETE /tasks/{id}`
//! (204; 404 when unknown), `GET /tasks/{id}/placement`. Nodes: `GET /nodes`,
//! `GET /nodes/{name}`, and `PUT /nodes/{name}`, a worker's registration and heartbeat (a
//! `NodeReport`). Jobs: `GET|POST /jobs`, `POST /jobs/plan`, `GET|DELETE /jobs/{name}`,
//! `POST /jobs/{name}/scale`. `GET /events`: every change as a stream of events
//! (`event_stream.rs`). `GET /health` (200 `{"Status": "ok"}`, or 503 with the cause once the
//! store has failed: a failed store takes no writes, and every write answers 503 too).
//! `GET /store/backup`: a consistent copy of the store file, streamed (409 with the memory
//! store). Every error is `{"HTTPStatusCode": N, "Message": "..."}`.
//!
//! Day-two operations: `GET /tasks/{id}/logs` and `POST /tasks/{id}/exec` (through the
//! task's worker, `relay.rs`), `DELETE /tasks/{id}?purge=true` and `POST /tasks/prune`
//! (`gc.rs`), `POST /nodes/{name}/drain`, `POST /nodes/{name}/eligibility` and `DELETE
//! /nodes/{name}` (`drain.rs`), `GET /version`, `GET /metrics` (`metrics.rs`; every request
//! is counted by route, method and status).
//!
//! ACL (`acl.rs`, with `--acl`): `POST /acl/bootstrap`, `GET|POST /acl/tokens`, `DELETE
//! /acl/tokens/{id}`; every route passes `acl::guard`, which checks its token against
//! `acl::ROUTES` and writes the audit log.
//!
//! TLS (`tls.rs`, with `--tls`): `GET /tls/ca` (open), `POST /nodes/{name}/certificate` (a
//! node token).
//!
//! `GET /tasks`, `GET /jobs`, `GET /jobs/{name}` and `GET /nodes` are also blocking queries,
//! as Consul's are: with `?index=N&wait=30s` they answer once something they list changed
//! after event index N (or when the wait, at most [`MAX_WAIT`], is over). Every answer of
//! theirs carries the current event index in `X-Cube-Index`, to ask with next.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{FromRef, MatchedPath, Query, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Extension, Json, Router};
use bytes::Bytes;
use chrono::Utc;
use cube_api::{ApiError, INDEX_HEADER, JsonPath, parse_task_id, with_json_fallbacks};
use cube_store::StoreError;
use cube_types::deployment::Deployment;
use cube_types::duration::parse_duration;
use cube_types::job::Job;
use cube_types::{Node, NodeReport, Submission, Task};

use crate::acl::AclState;
use crate::event_stream::{EventsQuery, Framing, events_response};
use crate::events::{Event, EventFilter, Topic};
use crate::job_api::{JobView, PlanView, VersionView};
use crate::job_records::JobSubmitted;
use crate::manager::{Manager, ManagerError, Submitted};
use crate::nodes::NodeSource;
use crate::paging::{PagePosition, PageStart};
use crate::placement::Placement;
use crate::projects::Scope;
use crate::queue_controller::QueueView;
use crate::tls::TlsState;

/// The one place a [`ManagerError`] becomes an HTTP status.
impl From<ManagerError> for ApiError {
    fn from(err: ManagerError) -> ApiError {
        let status = match &err {
            ManagerError::NotFound(_)
            | ManagerError::NodeNotFound(_)
            | ManagerError::JobNotFound(_)
            | ManagerError::ProjectNotFound(_)
            | ManagerError::NoDeployment(_) => StatusCode::NOT_FOUND,
            ManagerError::OverQuota(_) => StatusCode::UNPROCESSABLE_ENTITY,
            // HTTP's own word for a request sent to a server that cannot answer it.
            ManagerError::NotOwner { .. } => StatusCode::MISDIRECTED_REQUEST,
            ManagerError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ManagerError::Conflict(_) => StatusCode::CONFLICT,
            ManagerError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            // Well-formed, but more than one request may make.
            ManagerError::TooLarge(_) => StatusCode::UNPROCESSABLE_ENTITY,
            // A failed store takes no more writes until the manager is started again (and
            // it stops itself): the service is unavailable, not confused by one request.
            ManagerError::Store(StoreError::Failed { .. }) => StatusCode::SERVICE_UNAVAILABLE,
            ManagerError::Store(StoreError::InMemory | StoreError::NoFile(_)) => {
                StatusCode::CONFLICT
            }
            // etcd did not answer, or this manager no longer leads: another manager (or
            // this one, a moment later) takes the request.
            ManagerError::Store(StoreError::Unavailable { .. } | StoreError::Fenced { .. }) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ManagerError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, err.to_string())
    }
}

/// Every route, as the answer to an unknown one lists them; a unit test holds it equal to
/// the ACL's table (`acl::ROUTES`), so that a route cannot be added to one and not the other.
pub const ROUTE_LIST: &str = "GET|POST /tasks, POST /tasks/prune, GET|DELETE /tasks/{id}, \
         POST /tasks/{id}/restart, GET /tasks/{id}/placement, \
         GET /tasks/{id}/logs, POST /tasks/{id}/exec, GET /tasks/{id}/exec/attach, \
         GET|POST /jobs, \
         POST /jobs/plan, GET|DELETE /jobs/{name}, POST /jobs/{name}/scale, \
         GET /jobs/{name}/versions, POST /jobs/{name}/revert, POST /jobs/{name}/promote, \
         GET /jobs/{name}/deployment, GET /nodes, GET|PUT|DELETE /nodes/{name}, \
         POST /nodes/{name}/drain, POST /nodes/{name}/eligibility, \
         POST /nodes/{name}/certificate, GET /tls/ca, GET /events, GET /queue, \
         GET /queue/{kind}/{id}, GET /services, GET /routes, GET /health, GET /version, \
         GET /shards, \
         GET /metrics, GET /store/backup, POST /acl/bootstrap, GET|POST /acl/tokens, \
         DELETE /acl/tokens/{id}, GET /acl/self, GET /ui, GET /ui/{asset}, \
         GET|POST /projects, GET|DELETE /projects/{name}, PUT /projects/{name}/quota, \
         GET|POST /secrets, DELETE /secrets/{name}, GET /nodes/{name}/secrets, \
         POST /registries, GET /volumes, DELETE /volumes/{name}";

pub fn router(manager: Arc<Manager>) -> Router {
    let routes = Router::new()
        .route("/tasks", get(list_tasks).post(submit_task))
        .route("/tasks/prune", post(prune_tasks))
        .route("/tasks/{id}", get(get_task).delete(stop_task))
        .route("/tasks/{id}/restart", post(restart_task))
        .route("/tasks/{id}/placement", get(get_placement))
        .route("/tasks/{id}/logs", get(task_logs))
        .route("/tasks/{id}/exec", post(exec_in_task))
        .route("/tasks/{id}/exec/attach", get(exec_attach))
        .route("/nodes", get(list_nodes))
        .route(
            "/nodes/{name}",
            get(get_node).put(report_node).delete(remove_node),
        )
        .route(
            "/nodes/{name}/certificate",
            post(crate::tls::issue_node_certificate),
        )
        .route("/tls/ca", get(crate::tls::ca))
        .route("/nodes/{name}/drain", post(drain_node))
        .route("/nodes/{name}/eligibility", post(node_eligibility))
        .route("/version", get(version))
        .route("/shards", get(shards))
        .route("/metrics", get(metrics))
        .route("/jobs", get(list_jobs).post(submit_job))
        .route("/jobs/plan", post(plan_job))
        .route("/jobs/{name}", get(get_job).delete(stop_job))
        .route("/jobs/{name}/scale", post(scale_job))
        .route("/jobs/{name}/versions", get(job_versions))
        .route("/jobs/{name}/revert", post(revert_job))
        .route("/jobs/{name}/promote", post(promote_job))
        .route("/jobs/{name}/deployment", get(job_deployment))
        .route("/events", get(stream_events))
        .route("/queue", get(list_queue))
        .route("/queue/{kind}/{id}", get(get_queue_entry))
        .route("/services", get(list_services))
        .route("/routes", get(list_routes))
        .route("/health", get(health))
        .route("/store/backup", get(backup_store))
        .route("/acl/bootstrap", post(crate::acl::bootstrap))
        .route(
            "/acl/tokens",
            get(crate::acl::list_tokens).post(crate::acl::create_token),
        )
        .route("/acl/tokens/{id}", delete(crate::acl::revoke_token))
        .route("/acl/self", get(crate::acl::whoami))
        .route("/ui", get(crate::ui::index))
        .route("/ui/{asset}", get(crate::ui::asset))
        .route(
            "/projects",
            get(crate::projects::list_projects).post(crate::projects::create_project),
        )
        .route(
            "/projects/{name}",
            get(crate::projects::get_project).delete(crate::projects::remove_project),
        )
        .route(
            "/projects/{name}/quota",
            axum::routing::put(crate::projects::set_quota),
        )
        .route(
            "/secrets",
            get(crate::secret_api::list_secrets).post(crate::secret_api::create_secret),
        )
        .route("/secrets/{name}", delete(crate::secret_api::remove_secret))
        .route(
            "/nodes/{name}/secrets",
            get(crate::secret_api::secrets_for_run),
        )
        .route("/registries", post(crate::secret_api::registry_login))
        .route("/volumes", get(crate::volumes::list_volumes))
        .route("/volumes/{name}", delete(crate::volumes::remove_volume))
        // Inside the guard: the scope reads the token the guard found.
        .route_layer(axum::middleware::from_fn_with_state(
            manager.clone(),
            crate::projects::scoped,
        ))
        // Inside the count: a refused request is counted too.
        .route_layer(axum::middleware::from_fn_with_state(
            AclState::from_ref(&manager),
            crate::acl::guard,
        ))
        .route_layer(axum::middleware::from_fn_with_state(
            manager.clone(),
            count_request,
        ))
        .with_state(manager);
    with_json_fallbacks(routes, ROUTE_LIST)
}

/// The ACL's routes and guard read only their own part of the manager.
impl FromRef<Arc<Manager>> for AclState {
    fn from_ref(manager: &Arc<Manager>) -> AclState {
        AclState {
            acl: manager.config.acl.clone(),
            audit: manager.config.audit.clone(),
            ca: manager
                .config
                .tls
                .clone()
                .map(|tls| tls as Arc<dyn crate::acl::JoinCa>),
        }
    }
}

/// The TLS routes read only the manager's TLS.
impl FromRef<Arc<Manager>> for TlsState {
    fn from_ref(manager: &Arc<Manager>) -> TlsState {
        TlsState(manager.config.tls.clone())
    }
}

/// Counts every request a route answered, by the route's pattern (`/tasks/:id`, not each
/// ID), method and status.
async fn count_request(
    State(manager): State<Arc<Manager>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        // `/tasks/:id` rather than `/tasks/{id}`: braces are valid in a label value, but
        // simple parsers of the text format read them as the end of the labels.
        .map_or_else(
            || "unmatched".to_string(),
            |path| path.as_str().replace('{', ":").replace('}', ""),
        );
    let method = request.method().to_string();
    let response = next.run(request).await;
    manager
        .cluster
        .metrics
        .requests
        .get_or_create(&crate::metrics::RequestLabel {
            route,
            method,
            status: response.status().as_u16(),
        })
        .inc();
    response
}

/// `GET /version`: this manager's build.
async fn version() -> Json<cube_types::version::VersionInfo> {
    Json(cube_types::version::VersionInfo::this_build())
}

/// `GET /shards` of a manager on its own store: it holds every shard of the ring. It is
/// named by the address the client reached it at (it has no other: only managers sharing
/// etcd advertise one).
async fn shards(headers: axum::http::HeaderMap) -> Json<cube_types::shard::ShardsView> {
    let me = headers
        .get(axum::http::header::HOST)
        .and_then(|host| host.to_str().ok())
        .unwrap_or("this manager");
    Json(cube_types::shard::ShardsView::alone(
        me,
        cube_types::shard::DEFAULT_RING,
    ))
}

/// `GET /metrics`: every metric in the Prometheus text format.
/// A token sees the samples of the projects it reaches, and the cluster's.
async fn metrics(
    State(manager): State<Arc<Manager>>,
    Extension(scope): Extension<Scope>,
) -> Result<Response, ApiError> {
    let text = manager.metrics_text().map_err(|err| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot write the metrics: {err}"),
        )
    })?;
    let text = crate::metrics::only_reached(&text, |project| scope.reaches(project));
    Ok((
        [(header::CONTENT_TYPE, cube_api::metrics::CONTENT_TYPE)],
        text,
    )
        .into_response())
}

/// `GET /tasks/{id}/logs?follow=true&tail=N&since=10m&stderr=false`: the worker checks the
/// query; its answer is streamed back.
async fn task_logs(
    State(manager): State<Arc<Manager>>,
    JsonPath(id): JsonPath<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let body = manager
        .task_logs(parse_task_id(&id)?, query.as_deref().unwrap_or_default())
        .await?;
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response())
}

/// `POST /tasks/{id}/exec` with `{"Cmd": ["ls", "-l"]}`: the command's output, then its exit
/// code, as lines of JSON.
async fn exec_in_task(
    State(manager): State<Arc<Manager>>,
    JsonPath(id): JsonPath<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body: serde_json::Value = serde_json::from_slice(&body?)
        .map_err(|err| ApiError::bad_request(format!("the body is not JSON: {err}")))?;
    let body = manager.exec(parse_task_id(&id)?, &body).await?;
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response())
}

/// `GET /tasks/{id}/exec/attach?cmd=["sh"]&tty=true` with `Upgrade: cube-exec`: an
/// interactive command through the task's worker (`cube exec -it`).
async fn exec_attach(
    State(manager): State<Arc<Manager>>,
    JsonPath(id): JsonPath<String>,
    RawQuery(query): RawQuery,
    mut request: axum::extract::Request,
) -> Result<Response, ApiError> {
    let id = parse_task_id(&id)?;
    let upgrade = request
        .headers()
        .get(header::UPGRADE)
        .and_then(|value| value.to_str().ok());
    if upgrade != Some(cube_api::attach::PROTOCOL) {
        return Err(ApiError::bad_request(format!(
            "an interactive command needs `Upgrade: {}` (cube exec -it)",
            cube_api::attach::PROTOCOL
        )));
    }
    let user = hyper::upgrade::on(&mut request);
    manager
        .exec_attach(id, query.as_deref().unwrap_or_default(), user)
        .await?;
    Ok(Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, cube_api::attach::PROTOCOL)
        .body(Body::empty())
        .unwrap_or_default())
}

/// `POST /tasks/prune`: removes every ended task now (with its container) and the stopped
/// jobs left without tasks.
async fn prune_tasks(
    State(manager): State<Arc<Manager>>,
    Extension(scope): Extension<Scope>,
) -> Json<crate::gc::Pruned> {
    Json(manager.prune_in(Duration::ZERO, &scope).await)
}

/// The body of `POST /nodes/{name}/drain`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DrainRequest {
    /// After this long (`1m`), the copies still on the node are stopped without waiting.
    #[serde(rename = "Deadline", default)]
    deadline: Option<String>,
}

async fn drain_node(
    State(manager): State<Arc<Manager>>,
    JsonPath(name): JsonPath<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Node>, ApiError> {
    let body = body?;
    let request: DrainRequest = if body.iter().all(u8::is_ascii_whitespace) {
        DrainRequest::default()
    } else {
        cube_types::event::decode(&body).map_err(|err| ApiError::bad_request(err.to_string()))?
    };
    let deadline = request
        .deadline
        .as_deref()
        .map(parse_duration)
        .transpose()
        .map_err(|why| ApiError::bad_request(format!("Deadline: {why}")))?;
    Ok(Json(manager.drain_node(&name, deadline).await?))
}

/// The body of `POST /nodes/{name}/eligibility`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct EligibilityRequest {
    #[serde(rename = "Eligible")]
    eligible: bool,
}

async fn node_eligibility(
    State(manager): State<Arc<Manager>>,
    JsonPath(name): JsonPath<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Node>, ApiError> {
    let request: EligibilityRequest =
        cube_types::event::decode(&body?).map_err(|err| ApiError::bad_request(err.to_string()))?;
    Ok(Json(
        manager.set_eligibility(&name, request.eligible).await?,
    ))
}

async fn remove_node(
    State(manager): State<Arc<Manager>>,
    JsonPath(name): JsonPath<String>,
) -> Result<StatusCode, ApiError> {
    manager.remove_node(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// 200 `{"Status": "ok", "Revision": N}` while the manager can keep what it is told (N moves
/// with every write to its store); 503 with the cause once its store has failed.
async fn health(State(manager): State<Arc<Manager>>) -> Result<Json<serde_json::Value>, ApiError> {
    manager.store_health()?;
    let revision = manager.store_revision()?;
    Ok(Json(
        serde_json::json!({"Status": "ok", "Revision": revision}),
    ))
}

/// How much of the backup is read from disk at a time, and how many such chunks may wait for
/// a slow client.
const BACKUP_CHUNK_BYTES: usize = 64 * 1024;
const BACKUP_CHUNKS_BUFFERED: usize = 4;

/// A consistent copy of the store file (made inside one read transaction, while writes go on),
/// streamed with its length, so that a client can tell a copy cut short.
async fn backup_store(State(manager): State<Arc<Manager>>) -> Result<Response, ApiError> {
    let copied = tokio::task::spawn_blocking(move || manager.backup_store()).await;
    let mut file = copied.map_err(|err| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the backup stopped: {err}"),
        )
    })??;
    let length = file
        .metadata()
        .map(|metadata| metadata.len())
        .map_err(|err| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot read the backup's length: {err}"),
            )
        })?;
    // The copy is a file with no name left (see `Store::backup`); a blocking thread reads it
    // and ends when it is read or the client goes away (the channel closes).
    let (chunks, received) =
        tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(BACKUP_CHUNKS_BUFFERED);
    tokio::task::spawn_blocking(move || {
        loop {
            let mut chunk = vec![0; BACKUP_CHUNK_BYTES];
            let read = match file.read(&mut chunk) {
                Ok(0) => return,
                Ok(read) => read,
                Err(err) => {
                    let _ = chunks.blocking_send(Err(err));
                    return;
                }
            };
            chunk.truncate(read);
            if chunks.blocking_send(Ok(Bytes::from(chunk))).is_err() {
                return;
            }
        }
    });
    let stream = futures_util::stream::unfold(received, |mut received| async move {
        received.recv().await.map(|chunk| (chunk, received))
    });
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, length.to_string()),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

/// The response header that carries the token for the next page of a `GET /tasks?limit=N`.
pub const NEXT_TOKEN_HEADER: &str = "X-Cube-Next-Token";

/// The most tasks one page may hold.
pub const PAGE_LIMIT_MAX: usize = 10_000;

/// `GET /tasks` filters and paging. Every parameter is optional; without any, every task.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskQuery {
    /// At most this many tasks (1..=10,000); the header `X-Cube-Next-Token` then says where
    /// the next page starts, when there is one.
    limit: Option<usize>,
    /// The token a previous page gave: the ID of the first task of this page.
    next: Option<String>,
    /// Only tasks in this state (`Running`, `pending`, ...).
    state: Option<String>,
    /// Only tasks placed on this node.
    node: Option<String>,
    /// Only tasks with this exact name.
    name: Option<String>,
    /// Only the tasks of this job.
    job: Option<String>,
    /// `true`: each task without its `History`, the bulk of a task's JSON.
    summary: Option<bool>,
    /// A blocking query: answer once a task changed after this event index.
    index: Option<u64>,
    /// How long a blocking query waits at most (`30s` unless said; at most [`MAX_WAIT`]).
    wait: Option<String>,
}

/// `?index=N&wait=30s` on `GET /jobs`, `/jobs/{name}` and `/nodes`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BlockingQuery {
    index: Option<u64>,
    wait: Option<String>,
}

/// The longest a blocking query waits (as on the worker); a client asks again at once.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// How long a blocking query waits when it says no `wait`.
const DEFAULT_WAIT: Duration = Duration::from_secs(30);

/// A blocking query's index and wait, read before anything waits (a mistake is a 400 at once).
fn blocking(index: Option<u64>, wait: Option<&str>) -> Result<Option<(u64, Duration)>, ApiError> {
    let wait = match wait {
        Some(text) => {
            parse_duration(text).map_err(|why| ApiError::bad_request(format!("wait: {why}")))?
        }
        None => DEFAULT_WAIT,
    };
    Ok(index.map(|index| (index, wait.min(MAX_WAIT))))
}

/// Waits, for a blocking query, until an event after its index that `relevant` admits; then
/// (and without one at once) the current event index, read before the answer's data so that
/// a change between the two is seen again by the next query rather than missed.
async fn settle_query(
    manager: &Manager,
    blocking: Option<(u64, Duration)>,
    relevant: impl Fn(&Event) -> bool,
) -> u64 {
    if let Some((index, wait)) = blocking {
        manager.wait_for_event(index, wait, relevant).await;
    }
    manager.events().last_index()
}

/// An answer with the event index in [`INDEX_HEADER`].
fn with_index(mut response: Response, index: u64) -> Response {
    if let Ok(value) = HeaderValue::from_str(&index.to_string()) {
        response.headers_mut().insert(INDEX_HEADER, value);
    }
    response
}

async fn list_tasks(
    State(manager): State<Arc<Manager>>,
    Extension(scope): Extension<Scope>,
    query: Result<Query<TaskQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query?;
    let state = match &query.state {
        Some(text) => Some(
            cube_types::state::ALL_STATES
                .into_iter()
                .find(|state| state.name().eq_ignore_ascii_case(text))
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "state: {text:?} is not a task state; one of Pending, Scheduled, \
                         Running, Completed, Failed, Lost"
                    ))
                })?,
        ),
        None => None,
    };
    let blocking = blocking(query.index, query.wait.as_deref())?;
    let (limit, start) = page_of(query.limit, query.next.as_deref())?;
    let index = settle_query(&manager, blocking, |event| {
        event.topic == Topic::Task && scope.lists_event(event)
    })
    .await;
    let keep = |task: &Task| {
        scope.lists(&task.spec.project)
            && state.is_none_or(|state| task.status.state == state)
            && query
                .node
                .as_ref()
                .is_none_or(|node| &task.status.node_name == node)
            && query.name.as_ref().is_none_or(|name| &task.name == name)
            && query.job.as_ref().is_none_or(|job| {
                task.spec.job == cube_types::job::job_key(&task.spec.project, job)
            })
    };
    // Without a limit, every task that matches (in one page).
    let (tasks, next) = manager.tasks_page(start, limit, keep).ok_or_else(|| {
        ApiError::bad_request(format!(
            "next: no task {} to start the page from (it was removed since)",
            query.next.as_deref().unwrap_or_default()
        ))
    })?;
    let response = if query.summary == Some(true) {
        let summaries: Vec<Task> = tasks
            .iter()
            .map(|task| {
                let mut summary = (**task).clone();
                summary.status.history = Vec::new();
                summary
            })
            .collect();
        Json(summaries).into_response()
    } else {
        Json(tasks).into_response()
    };
    Ok(with_index(with_next_token(response, next), index))
}

/// The answer to `POST /tasks`: the task, and what the user should know about it now
/// (`Warnings`: why no node could hold it today; it waits all the same).
#[derive(Debug, serde::Serialize)]
struct AcceptedTask {
    #[serde(flatten)]
    task: Task,
    #[serde(rename = "Warnings", skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
}

async fn submit_task(
    State(manager): State<Arc<Manager>>,
    Extension(scope): Extension<Scope>,
    submitter: Option<axum::Extension<crate::acl::Submitter>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<AcceptedTask>), ApiError> {
    let body = body?;
    let mut submission = Submission::parse(&body, Utc::now())
        .map_err(|err| ApiError::bad_request(err.to_string()))?;
    scope.settle(&mut submission.event.task.spec.project)?;
    // With ACL on, what a token submits is its name's (the waiting list's `Owner`).
    crate::acl::settle_owner(submitter.as_ref(), &mut submission.event.task.spec.owner)?;
    let task = &submission.event.task;
    manager
        .config
        .secrets
        .check_uses(&task.spec.project, task.secret_names())?;
    let (status, task, warnings) = match manager.submit(submission.event).await? {
        Submitted::Created(task, warnings) => (StatusCode::CREATED, task, warnings),
        Submitted::Existing(task) => (StatusCode::OK, task, Vec::new()),
    };
    Ok((status, Json(AcceptedTask { task, warnings })))
}

/// Reads a job from a request body: its fields named at fault, validated by the manager.
fn job_from(body: &[u8]) -> Result<Job, ApiError> {
    cube_types::event::decode::<Job>(body).map_err(|err| ApiError::bad_request(err.to_string()))
}

async fn submit_job(
    State(manager): State<Arc<Manager>>,
    Extension(scope): Extension<Scope>,
    submitter: Option<axum::Extension<crate::acl::Submitter>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<JobView>), ApiError> {
    let mut job = job_from(&body?)?;
    scope.settle(&mut job.project)?;
    crate::acl::settle_owner(submitter.as_ref(), &mut job.owner)?;
    manager.config.secrets.check_uses(
        &job.project,
        job.groups
            .iter()
            .flat_map(|group| group.task.secret_names()),
    )?;
    let (outcome, mut view) = manager.submit_job(job).await?;
    view.outcome = Some(outcome.word().to_string());
    let status = match outcome {
        JobSubmitted::Created => StatusCode::CREATED,
        JobSubmitted::Changed | JobSubmitted::Scaled | JobSubmitted::Unchanged => StatusCode::OK,
    };
    Ok((status, Json(view)))
}

async fn plan_job(
    State(manager): State<Arc<Manager>>,
    Extension(scope): Extension<Scope>,
    submitter: Option<axum::Extension<crate::acl::Submitter>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<PlanView>, ApiError> {
    let mut job = job_from(&body?)?;
    scope.settle(&mut job.project)?;
    // As `POST /jobs` would store it, so that the plan shows no change of owner.
    crate::acl::settle_owner(submitter.as_ref(), &mut job.owner)?;
    Ok(Json(manager.plan_job(job)?))
}

/// Every job; a blocking query wakes on a job's, a deployment's or a job's task's event.
async fn list_jobs(
    State(manager): State<Arc<Manager>>,
    Extension(scope): Extension<Scope>,
    query: Result<Query<BlockingQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query?;
    let blocking = blocking(query.index, query.wait.as_deref())?;
    let index = settle_query(&manager, blocking, |event| {
        scope.lists_event(event)
            && match event.topic {
                Topic::Job | Topic::Deployment => true,
                Topic::Task | Topic::Queue => event.job.is_some(),
                Topic::Node | Topic::Project | Topic::Quota | Topic::Route => false,
            }
    })
    .await;
    let jobs: Vec<JobView> = manager
        .jobs()
        .into_iter()
        .filter(|view| scope.lists(view.job.project()))
        .collect();
    Ok(with_index(Json(jobs).into_response(), index))
}

/// One job; a blocking query wakes on the job's events and its objects' (404 at once for a
/// job the manager does not have).
/// `GET /jobs/{name}`: a blocking query, and a page of the job's tasks.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct JobQuery {
    index: Option<u64>,
    wait: Option<String>,
    /// At most this many of the job's tasks (1..=10,000); `X-Cube-Next-Token` then says where
    /// the next page starts. Without it, every task of the job.
    limit: Option<usize>,
    /// The token a previous page gave.
    next: Option<String>,
}

/// A page's `limit` and `next`, read as `GET /tasks` reads them.
fn page_of(
    limit: Option<usize>,
    next: Option<&str>,
) -> Result<(usize, Option<PageStart>), ApiError> {
    if let Some(limit) = limit
        && !(1..=PAGE_LIMIT_MAX).contains(&limit)
    {
        return Err(ApiError::bad_request(format!(
            "limit: {limit} is out of range; a page holds 1 to {PAGE_LIMIT_MAX} tasks"
        )));
    }
    let start = match next {
        Some(token) => Some(PageStart::parse(token).ok_or_else(|| {
            ApiError::bad_request(format!(
                "next: {token:?} is not a page token; pass the {NEXT_TOKEN_HEADER} header of \
                 the previous page"
            ))
        })?),
        None => None,
    };
    Ok((limit.unwrap_or(usize::MAX), start))
}

/// Says where the next page starts, when there is one.
fn with_next_token(mut response: Response, next: Option<PagePosition>) -> Response {
    if let Some(next) = next
        && let Ok(value) = HeaderValue::from_str(&next.token())
    {
        response.headers_mut().insert(NEXT_TOKEN_HEADER, value);
    }
    response
}

async fn get_job(
    State(manager): State<Arc<Manager>>,
    Extension(scope): Extension<Scope>,
    JsonPath(name): JsonPath<String>,
    query: Result<Query<JobQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let name = scope.job_key(&name)?;
    let Query(query) = query?;
    let blocking = blocking(query.index, query.wait.as_deref())?;
    let (limit, start) = page_of(query.limit, query.next.as_deref())?;
    if blocking.is_some() {
        manager.job(&name)?;
    }
    let filter = EventFilter {
        topics: Vec::new(),
        job: Some(name.clone()),
    };
    let index = settle_query(&manager, blocking, |event| filter.admits(event)).await;
    let (view, next) = manager.job_page(&name, start, limit)?;
    Ok(with_index(
        with_next_token(Json(view).into_response(), next),
        index,
    ))
}

async fn stop_job(
    State(manager): State<Arc<Manager>>,
    Extension(scope): Extension<Scope>,
    JsonPath(name): JsonPath<String>,
) -> Result<Json<JobView>, ApiError> {
    let name = scope.job_key(&name)?;
    Ok(Json(manager.stop_job(&name).await?))
}

/// The body of `POST /jobs/{name}/scale`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Scale {
    #[serde(rename = "Group")]
    group: String,
    #[serde(rename = "Count")]
    count: u32,
}

async fn scale_job(
    State(manager): State<Arc<Manager>>,
    Extension(scope): Extension<Scope>,
    JsonPath(name): JsonPath<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<JobView>, ApiError> {
    let name = scope.job_key(&name)?;
    let scale: Scale =
        cube_types::event::decode(&body?).map_err(|err| ApiError::bad_request(err.to_string()))?;
    Ok(Json(
        manager.scale_job(&name, &scale.group, scale.count).await?,
    ))
}

async fn job_versions(
    State(manager): State<Arc<Manager>>,
    Extension(scope): Extension<Scope>,
    JsonPath(name): JsonPath<String>,
) -> Result<Json<Vec<VersionView>>, ApiError> {
    let name = scope.job_key(&name)?;
    Ok(Json(manager.job_versions(&name)?))
}

async fn job_deployment(
    State(manager): State<Arc<Manager>>,
    Extension(scope): Extension<Scope>,
    JsonPath(name): JsonPath<String>,
) -> Result<Json<Arc<Deployment>>, ApiError> {
    let name = scope.job_key(&name)?;
    Ok(Json(manager.job_deployment(&name)?))
}

async fn promote_job(
    State(manager): State<Arc<Manager>>,
    Extension(scope): Extension<Scope>,
    JsonPath(name): JsonPath<String>,
) -> Result<Json<JobView>, ApiError> {
    let name = scope.job_key(&name)?;
    Ok(Json(manager.promote_job(&name).await?))
}

/// The body of `POST /jobs/{name}/revert`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Revert {
    #[serde(rename = "Version")]
    version: u64,
}

async fn revert_job(
    State(manager): State<Arc<Manager>>,
    Extension(scope): Extension<Scope>,
    JsonPath(name): JsonPath<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<JobView>, ApiError> {
    let name = scope.job_key(&name)?;
    let revert: Revert =
        cube_types::event::decode(&body?).map_err(|err| ApiError::bad_request(err.to_string()))?;
    let (outcome, mut view) = manager.revert_job(&name, revert.version).await?;
    view.outcome = Some(outcome.word().to_string());
    Ok(Json(view))
}

/// One task; a blocking query (`?index=N&wait=30s`) wakes on the task's own events and its
/// entry's in the waiting list.
async fn get_task(
    State(manager): State<Arc<Manager>>,
    JsonPath(id): JsonPath<String>,
    query: Result<Query<BlockingQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query?;
    let id = parse_task_id(&id)?;
    let blocking = blocking(query.index, query.wait.as_deref())?;
    // Unknown now: a 404 at once, not after the wait.
    manager.task(id)?;
    let key = id.to_string();
    let entry = cube_types::queue::RequestKind::Task.key(&key);
    let index = settle_query(&manager, blocking, |event| match event.topic {
        Topic::Task => event.key == key,
        Topic::Queue => event.key == entry,
        _ => false,
    })
    .await;
    Ok(with_index(Json(manager.task(id)?).into_response(), index))
}

async fn get_placement(
    State(manager): State<Arc<Manager>>,
    JsonPath(id): JsonPath<String>,
) -> Result<Json<Placement>, ApiError> {
    Ok(Json(manager.placement(parse_task_id(&id)?)?))
}

/// `DELETE /tasks/{id}?purge=true` removes an ended task (and its container) instead of
/// stopping it.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct StopQuery {
    purge: Option<bool>,
}

async fn stop_task(
    State(manager): State<Arc<Manager>>,
    JsonPath(id): JsonPath<String>,
    query: Result<Query<StopQuery>, QueryRejection>,
) -> Result<StatusCode, ApiError> {
    let Query(query) = query?;
    let id = parse_task_id(&id)?;
    if query.purge == Some(true) {
        manager.remove_task(id).await?;
    } else {
        manager.request_stop(id).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /tasks/{id}/restart`: an ended task runs again as a new run; 200 with the task,
/// `Pending` again.
async fn restart_task(
    State(manager): State<Arc<Manager>>,
    JsonPath(id): JsonPath<String>,
) -> Result<Json<Task>, ApiError> {
    let id = parse_task_id(&id)?;
    Ok(Json(manager.restart_task(id).await?))
}

/// Every node; a blocking query wakes on a node's event, and on a task placed or ended
/// (what a node holds changed).
async fn list_nodes(
    State(manager): State<Arc<Manager>>,
    query: Result<Query<BlockingQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query?;
    let blocking = blocking(query.index, query.wait.as_deref())?;
    let index = settle_query(&manager, blocking, |event| {
        event.topic == Topic::Node || (event.topic == Topic::Task && event.allocation)
    })
    .await;
    Ok(with_index(Json(manager.nodes()).into_response(), index))
}

/// The waiting list, in order; a blocking query wakes on a change of an entry.
async fn list_queue(
    State(manager): State<Arc<Manager>>,
    Extension(scope): Extension<Scope>,
    query: Result<Query<BlockingQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query?;
    let blocking = blocking(query.index, query.wait.as_deref())?;
    let index = settle_query(&manager, blocking, |event| {
        event.topic == Topic::Queue && scope.lists_event(event)
    })
    .await;
    let queue: Vec<_> = manager
        .queue()
        .into_iter()
        .filter(|listed| scope.lists(listed.entry.project()))
        .collect();
    Ok(with_index(Json(queue).into_response(), index))
}

/// One entry of the waiting list: `GET /queue/task/{id}` or `GET /queue/job/{name}`.
async fn get_queue_entry(
    State(manager): State<Arc<Manager>>,
    Extension(scope): Extension<Scope>,
    JsonPath((kind, id)): JsonPath<(String, String)>,
) -> Result<Json<QueueView>, ApiError> {
    let entry = match kind.as_str() {
        "task" => manager.queue_entry_of_task(parse_task_id(&id)?),
        "job" => manager.queue_entry_of_job(&scope.job_key(&id)?),
        other => {
            return Err(ApiError::bad_request(format!(
                "{other:?} is not a kind of request: /queue/task/ID or /queue/job/NAME"
            )));
        }
    };
    entry.map(Json).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no {kind} {id:?} in the waiting list"),
        )
    })
}

/// What runs and answers: claimed bare tasks and job groups with their healthy copies'
/// addresses; a blocking query wakes on a task's or an entry's change.
async fn list_services(
    State(manager): State<Arc<Manager>>,
    Extension(scope): Extension<Scope>,
    query: Result<Query<BlockingQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query?;
    let blocking = blocking(query.index, query.wait.as_deref())?;
    let index = settle_query(&manager, blocking, |event| {
        matches!(event.topic, Topic::Task | Topic::Queue) && scope.lists_event(event)
    })
    .await;
    let services: Vec<_> = manager
        .services()
        .into_iter()
        .filter(|service| scope.lists(&service.project))
        .collect();
    Ok(with_index(Json(services).into_response(), index))
}

/// `GET /routes`: every route with the copies that take its requests (`routes.rs`); a
/// blocking query wakes on a `Route` event, that is when a route changed.
async fn list_routes(
    State(manager): State<Arc<Manager>>,
    Extension(scope): Extension<Scope>,
    query: Result<Query<BlockingQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query?;
    let blocking = blocking(query.index, query.wait.as_deref())?;
    let index = settle_query(&manager, blocking, |event| {
        event.topic == Topic::Route && scope.lists_event(event)
    })
    .await;
    let routes: Vec<_> = manager
        .routes()
        .into_iter()
        .filter(|route| scope.lists(&route.project))
        .collect();
    Ok(with_index(Json(routes).into_response(), index))
}

/// `GET /events`: see `event_stream.rs`.
async fn stream_events(
    State(manager): State<Arc<Manager>>,
    Extension(scope): Extension<Scope>,
    headers: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(pairs) = query?;
    let mut query = EventsQuery::parse(&pairs)?.or_last_event_id(&headers)?;
    // `?job=NAME` is a job of the project asked for: its events carry the job's key.
    if let Some(job) = query.filter.job.take() {
        query.filter.job = Some(scope.job_key(&job).unwrap_or(job));
    }
    Ok(events_response(
        &manager,
        query,
        scope,
        Framing::from_request(&headers),
    ))
}

async fn get_node(
    State(manager): State<Arc<Manager>>,
    JsonPath(name): JsonPath<String>,
) -> Result<Json<Node>, ApiError> {
    Ok(Json(manager.node(&name)?))
}

async fn report_node(
    State(manager): State<Arc<Manager>>,
    JsonPath(name): JsonPath<String>,
    claim: Option<axum::Extension<crate::acl::NodeClaim>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let body = body?;
    let mut deserializer = serde_json::Deserializer::from_slice(&body);
    let report: NodeReport = serde_path_to_error::deserialize(&mut deserializer)
        .map_err(|err| ApiError::bad_request(format!("invalid node report: {err}")))?;
    if report.name != name {
        return Err(ApiError::bad_request(format!(
            "Name: the report is for {:?} but was sent to /nodes/{name}",
            report.name
        )));
    }
    if claim.is_some() {
        // A node token's first report: its name is claimed only once the report is valid.
        manager.check_report(&report)?;
        crate::acl::make_claim(claim.as_ref()).await?;
    }
    let node = manager.report_node(report, NodeSource::Registered).await?;
    let floor_ms = manager.heartbeat_floor().as_millis().to_string();
    Ok((
        [(cube_api::server::HEARTBEAT_INTERVAL_HEADER, floor_ms)],
        Json(node),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_route_list_and_the_acl_table_name_the_same_routes() {
        let mut listed: Vec<(String, String)> = ROUTE_LIST
            .split(", ")
            .flat_map(|entry| {
                let (methods, path) = entry.trim().split_once(' ').unwrap();
                methods
                    .split('|')
                    .map(|method| (method.to_string(), path.to_string()))
                    .collect::<Vec<_>>()
            })
            .collect();
        let mut table: Vec<(String, String)> = crate::acl::ROUTES
            .iter()
            .map(|(method, path, _)| (method.to_string(), path.to_string()))
            .collect();
        listed.sort();
        table.sort();
        assert_eq!(listed, table);
    }

    #[test]
    fn a_failed_store_answers_503_with_the_file_and_the_cause() {
        let err = ApiError::from(ManagerError::Store(StoreError::Failed {
            path: "/data/manager.redb".to_string(),
            cause: "a commit panicked: boom".to_string(),
        }));
        assert_eq!(err.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            err.message.contains("/data/manager.redb"),
            "{}",
            err.message
        );
        assert!(err.message.contains("boom"), "{}", err.message);
    }

    #[test]
    fn a_backup_of_a_manager_in_memory_is_a_conflict() {
        let err = ApiError::from(ManagerError::Store(StoreError::InMemory));
        assert_eq!(err.status, StatusCode::CONFLICT);
    }
}
