//! The manager's HTTP API. The only place where a [`ManagerError`] becomes an HTTP status.
//!
//! Tasks: `POST /tasks` (a `TaskEvent` as in the book, or a bare `Task`; 201 with the task, 200
//! when a task with that ID exists), `GET /tasks`, `GET /tasks/{id}`, `DELETE /tasks/{id}`
//! (204; 404 when unknown). Nodes: `GET /nodes`, `GET /nodes/{name}`, and `PUT /nodes/{name}`,
//! a worker's registration and heartbeat (a `NodeReport`). `GET /health` (200
//! `{"Status": "ok"}`, or 503 with the cause once the store has failed: a failed store takes
//! no writes, and every write answers 503 too). `GET /store/backup`: a consistent copy of the
//! store file, streamed (409 with the memory store). Every error is
//! `{"HTTPStatusCode": N, "Message": "..."}`.

use std::io::Read;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use bytes::Bytes;
use chrono::Utc;
use cube_api::{ApiError, parse_task_id, with_json_fallbacks};
use cube_store::StoreError;
use cube_types::{Node, NodeReport, Submission, Task};

use crate::manager::{Manager, ManagerError, Submitted};
use crate::nodes::NodeSource;

/// The one place a [`ManagerError`] becomes an HTTP status.
impl From<ManagerError> for ApiError {
    fn from(err: ManagerError) -> ApiError {
        let status = match &err {
            ManagerError::NotFound(_) | ManagerError::NodeNotFound(_) => StatusCode::NOT_FOUND,
            ManagerError::BadRequest(_) => StatusCode::BAD_REQUEST,
            // A failed store takes no more writes until the manager is started again (and
            // it stops itself): the service is unavailable, not confused by one request.
            ManagerError::Store(StoreError::Failed { .. }) => StatusCode::SERVICE_UNAVAILABLE,
            ManagerError::Store(StoreError::InMemory) => StatusCode::CONFLICT,
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
        .route("/health", get(health))
        .route("/store/backup", get(backup_store))
        .with_state(manager);
    with_json_fallbacks(
        routes,
        "GET|POST /tasks, GET|DELETE /tasks/{id}, GET /nodes, GET|PUT /nodes/{name}, \
         GET /health, GET /store/backup",
    )
}

/// 200 `{"Status": "ok"}` while the manager can keep what it is told; 503 with the cause
/// once its store has failed.
async fn health(State(manager): State<Arc<Manager>>) -> Result<Json<serde_json::Value>, ApiError> {
    manager.store_health()?;
    Ok(Json(serde_json::json!({"Status": "ok"})))
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
    Path(id): Path<String>,
) -> Result<Json<Arc<Task>>, ApiError> {
    Ok(Json(manager.task(parse_task_id(&id)?)?))
}

async fn stop_task(
    State(manager): State<Arc<Manager>>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    manager.request_stop(parse_task_id(&id)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list_nodes(State(manager): State<Arc<Manager>>) -> Json<Vec<Node>> {
    Json(manager.nodes())
}

async fn get_node(
    State(manager): State<Arc<Manager>>,
    Path(name): Path<String>,
) -> Result<Json<Node>, ApiError> {
    Ok(Json(manager.node(&name)?))
}

async fn report_node(
    State(manager): State<Arc<Manager>>,
    Path(name): Path<String>,
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

#[cfg(test)]
mod tests {
    use super::*;

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
