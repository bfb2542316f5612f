//! The worker's HTTP API. The only place where a [`WorkerError`] becomes an HTTP status.
//!
//! `GET /tasks` (also as a blocking query, `?index=N&wait=30s`, which is how a manager learns
//! of state changes as they happen; with `&changes=true` it answers only the tasks that
//! changed after N, and says so in [`SINCE_HEADER`]), `POST /tasks` (a `TaskEvent` or a bare `Task`; 201 for a
//! new task, 200 when it was already there), `GET /tasks/{id}`, `DELETE /tasks/{id}` (204),
//! `GET /stats`, `GET /node` (name, address, capacity and stats), `GET /health` (200
//! `{"Status": "ok"}`, or 503 with the cause once the task store has failed; every write
//! answers 503 then too). Every error is `{"HTTPStatusCode": N, "Message": "..."}`.

use std::sync::Arc;

use std::time::Duration;

use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use bytes::Bytes;
use chrono::Utc;
use cube_api::{
    ApiError, INDEX_HEADER, JsonPath, SINCE_HEADER, parse_task_id, with_json_fallbacks,
};
use cube_runtime::Runtime;
use cube_store::StoreError;
use cube_types::duration::parse_duration;
use cube_types::{NodeReport, Submission, Task};
use serde::Deserialize;

use crate::worker::{Submitted, TaskChanges, Worker, WorkerError};

/// The one place a [`WorkerError`] becomes an HTTP status.
impl From<WorkerError> for ApiError {
    fn from(err: WorkerError) -> ApiError {
        let status = match &err {
            WorkerError::NotFound(_) => StatusCode::NOT_FOUND,
            WorkerError::Conflict { .. } => StatusCode::CONFLICT,
            WorkerError::BadRequest(_) => StatusCode::BAD_REQUEST,
            WorkerError::ShuttingDown | WorkerError::Runtime(_) => StatusCode::SERVICE_UNAVAILABLE,
            // A failed store takes no more writes until the worker is started again (and it
            // stops itself): the service is unavailable.
            WorkerError::Store(StoreError::Failed { .. }) => StatusCode::SERVICE_UNAVAILABLE,
            WorkerError::Store(_) | WorkerError::Stats(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, err.to_string())
    }
}

/// The worker's routes, with JSON answers for unknown paths and methods too.
pub fn router<R: Runtime>(worker: Arc<Worker<R>>) -> Router {
    let routes = Router::new()
        .route("/tasks", get(list_tasks::<R>).post(submit_task::<R>))
        .route("/tasks/{id}", get(get_task::<R>).delete(stop_task::<R>))
        .route("/stats", get(stats::<R>))
        .route("/node", get(node::<R>))
        .route("/health", get(health::<R>))
        .with_state(worker);
    with_json_fallbacks(
        routes,
        "GET|POST /tasks, GET|DELETE /tasks/{id}, GET /stats, GET /node, GET /health",
    )
}

/// 200 `{"Status": "ok"}` while the worker can keep what it is told; 503 with the cause once
/// its store has failed.
async fn health<R: Runtime>(
    State(worker): State<Arc<Worker<R>>>,
) -> Result<Json<serde_json::Value>, ApiError> {
    worker.store_health()?;
    Ok(Json(serde_json::json!({"Status": "ok"})))
}

/// `?index=N&wait=30s` makes `GET /tasks` a blocking query: it answers once a task changed
/// after index N, or when `wait` (at most [`MAX_WAIT`]) is over. `&changes=true` asks for the
/// tasks that changed after N only.
#[derive(Debug, Deserialize)]
struct ListQuery {
    index: Option<u64>,
    wait: Option<String>,
    changes: Option<bool>,
}

/// The longest a blocking query waits; a manager asks again at once.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// Every task, with the store's index in [`INDEX_HEADER`].
async fn list_tasks<R: Runtime>(
    State(worker): State<Arc<Worker<R>>>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query?;
    if let Some(index) = query.index {
        let wait = match query.wait.as_deref() {
            Some(text) => {
                parse_duration(text).map_err(|why| ApiError::bad_request(format!("wait: {why}")))?
            }
            None => Duration::from_secs(30),
        };
        worker.wait_for_change(index, wait.min(MAX_WAIT)).await;
        if query.changes == Some(true) {
            return Ok(match worker.tasks_changed_since(index)? {
                (TaskChanges::Since { since, tasks }, index) => (
                    [
                        (INDEX_HEADER, index.to_string()),
                        (SINCE_HEADER, since.to_string()),
                    ],
                    Json(tasks),
                )
                    .into_response(),
                (TaskChanges::All(tasks), index) => {
                    ([(INDEX_HEADER, index.to_string())], Json(tasks)).into_response()
                }
            });
        }
    }
    // The index is read before the list, so a change between the two is seen again by the
    // next blocking query rather than missed.
    let index = worker.change_index();
    let tasks = worker.list_tasks()?;
    Ok(([(INDEX_HEADER, index.to_string())], Json(tasks)).into_response())
}

async fn submit_task<R: Runtime>(
    State(worker): State<Arc<Worker<R>>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Task>), ApiError> {
    let body = body?;
    let submission = Submission::parse(&body, Utc::now())
        .map_err(|err| ApiError::new(StatusCode::BAD_REQUEST, err.to_string()))?;
    match worker.submit(submission.event).await? {
        Submitted::Created(task) => Ok((StatusCode::CREATED, Json(task))),
        Submitted::Existing(task) => Ok((StatusCode::OK, Json(task))),
    }
}

async fn get_task<R: Runtime>(
    State(worker): State<Arc<Worker<R>>>,
    JsonPath(id): JsonPath<String>,
) -> Result<Json<Task>, ApiError> {
    Ok(Json(worker.task(parse_task_id(&id)?)?))
}

/// `DELETE /tasks/{id}?run=N` stops the task only if its current run is run N (its
/// `RestartCount`); without `run`, whatever run it is.
#[derive(Debug, Deserialize)]
struct StopQuery {
    run: Option<u32>,
}

async fn stop_task<R: Runtime>(
    State(worker): State<Arc<Worker<R>>>,
    JsonPath(id): JsonPath<String>,
    query: Result<Query<StopQuery>, QueryRejection>,
) -> Result<StatusCode, ApiError> {
    let Query(query) = query?;
    worker
        .request_stop_of_run(parse_task_id(&id)?, query.run)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn stats<R: Runtime>(
    State(worker): State<Arc<Worker<R>>>,
) -> Result<Json<cube_types::Stats>, ApiError> {
    let task_count = worker.running_task_count()?;
    Ok(Json(
        worker
            .stats()
            .collect(task_count)
            .map_err(WorkerError::from)?,
    ))
}

/// What this worker says about itself: name, address, capacity and stats, as in a heartbeat.
async fn node<R: Runtime>(
    State(worker): State<Arc<Worker<R>>>,
) -> Result<Json<NodeReport>, ApiError> {
    Ok(Json(worker.node_report()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_store_answers_503_with_the_file_and_the_cause() {
        let err = ApiError::from(WorkerError::Store(StoreError::Failed {
            path: "/data/worker-w1.redb".to_string(),
            cause: "a commit failed: I/O error".to_string(),
        }));
        assert_eq!(err.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            err.message.contains("/data/worker-w1.redb"),
            "{}",
            err.message
        );
        assert!(err.message.contains("I/O error"), "{}", err.message);
    }
}
