//! The worker's HTTP API. The only place where a [`WorkerError`] becomes an HTTP status.
//!
//! `GET /tasks`, `POST /tasks` (a `TaskEvent` or a bare `Task`; 201 for a new task, 200 when
//! it was already there), `GET /tasks/{id}`, `DELETE /tasks/{id}` (204), `GET /stats`.
//! Every error is `{"HTTPStatusCode": N, "Message": "..."}`.

use std::sync::Arc;

use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use bytes::Bytes;
use chrono::Utc;
use cube_runtime::Runtime;
use cube_types::{ErrorBody, Submission, Task};
use uuid::Uuid;

use crate::worker::{Submitted, Worker, WorkerError};

/// The largest request body accepted. A task is a few hundred bytes; 1 MiB leaves room for
/// long environments without letting a client make the worker buffer anything large.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// An error answer: a status and a message naming what was wrong.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status;
        let body = ErrorBody {
            http_status_code: status.as_u16(),
            message: self.message,
        };
        let mut response = (status, Json(body)).into_response();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of the body is never read, so the connection cannot carry another
            // request: say so, or a client that reuses it fails on its next request.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

impl From<WorkerError> for ApiError {
    fn from(err: WorkerError) -> ApiError {
        let status = match &err {
            WorkerError::NotFound(_) => StatusCode::NOT_FOUND,
            WorkerError::Conflict { .. } => StatusCode::CONFLICT,
            WorkerError::BadRequest(_) => StatusCode::BAD_REQUEST,
            WorkerError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            WorkerError::Store(_) | WorkerError::Stats(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, err.to_string())
    }
}

impl From<BytesRejection> for ApiError {
    fn from(rejection: BytesRejection) -> ApiError {
        let status = rejection.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                status,
                format!("request body is larger than the limit of {MAX_BODY_BYTES} bytes"),
            )
        } else {
            ApiError::new(
                status,
                format!("cannot read the request body: {}", rejection.body_text()),
            )
        }
    }
}

/// The worker's routes, with JSON answers for unknown paths and methods too.
pub fn router<R: Runtime>(worker: Arc<Worker<R>>) -> Router {
    Router::new()
        .route("/tasks", get(list_tasks::<R>).post(submit_task::<R>))
        .route("/tasks/{id}", get(get_task::<R>).delete(stop_task::<R>))
        .route("/stats", get(stats::<R>))
        .fallback(|| async {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "no such route; see GET /tasks, POST /tasks, GET|DELETE /tasks/{id}, GET /stats",
            )
        })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed on this route",
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(worker)
}

async fn list_tasks<R: Runtime>(
    State(worker): State<Arc<Worker<R>>>,
) -> Result<Json<Vec<Task>>, ApiError> {
    Ok(Json(worker.list_tasks()?))
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
    Path(id): Path<String>,
) -> Result<Json<Task>, ApiError> {
    Ok(Json(worker.task(parse_task_id(&id)?)?))
}

async fn stop_task<R: Runtime>(
    State(worker): State<Arc<Worker<R>>>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    worker.request_stop(parse_task_id(&id)?).await?;
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

fn parse_task_id(text: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(text).map_err(|err| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("malformed task ID {text:?}: {err}; expected a UUID such as bb1d59ef-9fc1-4e4b-a44d-db571eeed203"),
        )
    })
}
