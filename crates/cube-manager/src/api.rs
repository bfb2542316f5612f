//! The manager's HTTP API. The only place where a [`ManagerError`] becomes an HTTP status.
//!
//! Tasks: `POST /tasks` (a `TaskEvent` as in the book, or a bare `Task`; 201 with the task, 200
//! when a task with that ID exists), `GET /tasks`, `GET /tasks/{id}`, `DELETE /tasks/{id}`
//! (204; 404 when unknown). Nodes: `GET /nodes`, `GET /nodes/{name}`, and `PUT /nodes/{name}`,
//! a worker's registration and heartbeat (a `NodeReport`). Every error is
//! `{"HTTPStatusCode": N, "Message": "..."}`.

use std::sync::Arc;

use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use bytes::Bytes;
use chrono::Utc;
use cube_api::{ApiError, JsonPath, parse_task_id, with_json_fallbacks};
use cube_types::{Node, NodeReport, Submission, Task};

use crate::manager::{Manager, ManagerError, Submitted};
use crate::nodes::NodeSource;

/// The one place a [`ManagerError`] becomes an HTTP status.
impl From<ManagerError> for ApiError {
    fn from(err: ManagerError) -> ApiError {
        let status = match &err {
            ManagerError::NotFound(_) | ManagerError::NodeNotFound(_) => StatusCode::NOT_FOUND,
            ManagerError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ManagerError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, err.to_string())
    }
}

pub fn router(manager: Arc<Manager>) -> Router {
    let routes = Router::new()
        .route("/tasks", get(list_tasks).post(submit_task))
        .route("/tasks/{id}", get(get_task).delete(stop_task))
        .route("/nodes", get(list_nodes))
        .route("/nodes/{name}", get(get_node).put(report_node))
        .with_state(manager);
    with_json_fallbacks(
        routes,
        "GET|POST /tasks, GET|DELETE /tasks/{id}, GET /nodes, GET|PUT /nodes/{name}",
    )
}

async fn list_tasks(State(manager): State<Arc<Manager>>) -> Json<Vec<Arc<Task>>> {
    Json(manager.tasks())
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
