//! The manager's HTTP API. The only place where a [`ManagerError`] becomes an HTTP status.
//!
//! Tasks: `POST /tasks` (a `TaskEvent` as in the book, or a bare `Task`; 201 with the task, 200
//! when a task with that ID exists), `GET /tasks`, `GET /tasks/{id}`, `DELETE /tasks/{id}`
//! (204; 404 when unknown). Nodes: `GET /nodes`, `GET /nodes/{name}`, and `PUT /nodes/{name}`,
//! a worker's registration and heartbeat (a `NodeReport`). Every error is
//! `{"HTTPStatusCode": N, "Message": "..."}`.

use std::sync::Arc;

use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use bytes::Bytes;
use chrono::Utc;
use cube_api::{ApiError, JsonPath, parse_task_id, with_json_fallbacks};
use cube_types::{Node, NodeReport, Submission, Task};

use crate::manager::{Manager, ManagerError, Placement, Submitted};
use crate::nodes::NodeSource;

/// The one place a [`ManagerError`] becomes an HTTP status.
impl From<ManagerError> for ApiError {
    fn from(err: ManagerError) -> ApiError {
        let status = match &err {
            ManagerError::NotFound(_) | ManagerError::NodeNotFound(_) => StatusCode::NOT_FOUND,
            ManagerError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ManagerError::Conflict(_) => StatusCode::CONFLICT,
            ManagerError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, err.to_string())
    }
}

pub fn router(manager: Arc<Manager>) -> Router {
    let routes = Router::new()
        .route("/tasks", get(list_tasks).post(submit_task))
        .route("/tasks/{id}", get(get_task).delete(stop_task))
        .route("/tasks/{id}/placement", get(get_placement))
        .route("/nodes", get(list_nodes))
        .route("/nodes/{name}", get(get_node).put(report_node))
        .with_state(manager);
    with_json_fallbacks(
        routes,
        "GET|POST /tasks, GET|DELETE /tasks/{id}, GET /tasks/{id}/placement, GET /nodes, \
         GET|PUT /nodes/{name}",
    )
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
    /// `true`: each task without its `History`, the bulk of a task's JSON.
    summary: Option<bool>,
}

async fn list_tasks(
    State(manager): State<Arc<Manager>>,
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
    if let Some(limit) = query.limit
        && !(1..=PAGE_LIMIT_MAX).contains(&limit)
    {
        return Err(ApiError::bad_request(format!(
            "limit: {limit} is out of range; a page holds 1 to {PAGE_LIMIT_MAX} tasks"
        )));
    }
    let start = match &query.next {
        Some(token) => Some(parse_task_id(token).map_err(|_| {
            ApiError::bad_request(format!(
                "next: {token:?} is not a page token; pass the {NEXT_TOKEN_HEADER} header of \
                 the previous page"
            ))
        })?),
        None => None,
    };
    let mut tasks = manager.tasks();
    tasks.retain(|task| {
        state.is_none_or(|state| task.state == state)
            && query.node.as_ref().is_none_or(|node| &task.node_name == node)
            && query.name.as_ref().is_none_or(|name| &task.name == name)
    });
    if let Some(start) = start {
        match tasks.iter().position(|task| task.id == start) {
            Some(index) => {
                tasks.drain(..index);
            }
            None => {
                return Err(ApiError::bad_request(format!(
                    "next: no task {start} to start the page from (it was removed, or the \
                     filters differ from the previous page's)"
                )));
            }
        }
    }
    let next = match query.limit {
        Some(limit) if tasks.len() > limit => {
            let next = tasks[limit].id;
            tasks.truncate(limit);
            Some(next)
        }
        _ => None,
    };
    let mut response = if query.summary == Some(true) {
        let summaries: Vec<Task> = tasks
            .iter()
            .map(|task| {
                let mut summary = (**task).clone();
                summary.history = Vec::new();
                summary
            })
            .collect();
        Json(summaries).into_response()
    } else {
        Json(tasks).into_response()
    };
    if let Some(next) = next
        && let Ok(value) = HeaderValue::from_str(&next.to_string())
    {
        response.headers_mut().insert(NEXT_TOKEN_HEADER, value);
    }
    Ok(response)
}

async fn submit_task(
    State(manager): State<Arc<Manager>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Task>), ApiError> {
    let body = body?;
    let submission = Submission::parse(&body, Utc::now())
        .map_err(|err| ApiError::bad_request(err.to_string()))?;
    match manager.submit(submission.event).await? {
        Submitted::Created(task) => Ok((StatusCode::CREATED, Json(task))),
        Submitted::Existing(task) => Ok((StatusCode::OK, Json(task))),
    }
}

async fn get_task(
    State(manager): State<Arc<Manager>>,
    JsonPath(id): JsonPath<String>,
) -> Result<Json<Arc<Task>>, ApiError> {
    Ok(Json(manager.task(parse_task_id(&id)?)?))
}

async fn get_placement(
    State(manager): State<Arc<Manager>>,
    JsonPath(id): JsonPath<String>,
) -> Result<Json<Placement>, ApiError> {
    Ok(Json(manager.placement(parse_task_id(&id)?)?))
}

async fn stop_task(
    State(manager): State<Arc<Manager>>,
    JsonPath(id): JsonPath<String>,
) -> Result<StatusCode, ApiError> {
    manager.request_stop(parse_task_id(&id)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list_nodes(State(manager): State<Arc<Manager>>) -> Json<Vec<Node>> {
    Json(manager.nodes())
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
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Node>, ApiError> {
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
    Ok(Json(
        manager.report_node(report, NodeSource::Registered).await?,
    ))
}
