//! The worker's HTTP API. The only place where a [`WorkerError`] becomes an HTTP status.
//!
//! `GET /tasks` (also as a blocking query, `?index=N&wait=30s`, which is how a manager learns
//! of state changes as they happen; with `&changes=true` it answers only the tasks that
//! changed after N, and says so in [`SINCE_HEADER`]), `POST /tasks` (a `TaskEvent` or a bare `Task`; 201 for a
//! new task, 200 when it was already there), `GET /tasks/{id}`, `DELETE /tasks/{id}` (204),
//! `GET /tasks/{id}/logs` (the container's output as lines of JSON, `?follow=true` until
//! it stops, then a last line saying how the task ended), `POST /tasks/{id}/exec` (a command
//! in the running container: its output, then its exit code), `DELETE /tasks/{id}?purge=true`
//! (an ended task forgotten, with its containers), `GET /version`, `GET /metrics`,
//! `GET /stats`, `GET /node` (name, address, capacity and stats), `GET /health` (200
//! `{"Status": "ok"}`, or 503 with the cause once the task store has failed; every write
//! answers 503 then too). Every error is `{"HTTPStatusCode": N, "Message": "..."}`.

use std::sync::Arc;

use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use chrono::Utc;
use cube_api::{
    ApiError, INDEX_HEADER, JsonPath, SINCE_HEADER, parse_task_id, with_json_fallbacks,
};
use cube_runtime::{LogOptions, OutputStream, Runtime};
use cube_store::StoreError;
use cube_types::duration::parse_duration;
use cube_types::output::OutputLine;
use cube_types::shard::ShardScope;
use cube_types::{NodeReport, Submission, Task};
use futures_util::StreamExt;
use serde::Deserialize;

use crate::worker::{Submitted, TaskChanges, Worker, WorkerError};

/// The one place a [`WorkerError`] becomes an HTTP status.
impl From<WorkerError> for ApiError {
    fn from(err: WorkerError) -> ApiError {
        let status = match &err {
            WorkerError::NotFound(_) => StatusCode::NOT_FOUND,
            WorkerError::Conflict { .. } | WorkerError::WrongState(_) => StatusCode::CONFLICT,
            WorkerError::BadRequest(_) => StatusCode::BAD_REQUEST,
            WorkerError::Refused(_) => StatusCode::FORBIDDEN,
            WorkerError::ShuttingDown | WorkerError::Runtime(_) | WorkerError::NoRoom(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
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
    router_with_gate(worker, None)
}

/// [`router`], behind `gate` when the worker joined its manager with a token: then only the
/// manager's worker-command token opens it (`gate.rs`), `GET /health` aside.
pub fn router_with_gate<R: Runtime>(
    worker: Arc<Worker<R>>,
    gate: Option<Arc<crate::gate::CommandGate>>,
) -> Router {
    let name: Arc<str> = Arc::from(worker.name());
    let mut routes = Router::new()
        .route("/tasks", get(list_tasks::<R>).post(submit_task::<R>))
        .route("/tasks/{id}", get(get_task::<R>).delete(stop_task::<R>))
        .route("/tasks/{id}/logs", get(task_logs::<R>))
        .route("/tasks/{id}/exec", post(exec::<R>))
        .route("/tasks/{id}/exec/attach", get(exec_attach::<R>))
        .route("/version", get(version::<R>))
        .route("/metrics", get(metrics::<R>))
        .route("/stats", get(stats::<R>))
        .route("/node", get(node::<R>))
        .route("/volumes", get(list_volumes::<R>))
        .route("/volumes/{name}", axum::routing::delete(remove_volume::<R>))
        .route("/health", get(health::<R>))
        .with_state(worker);
    if let Some(gate) = gate {
        routes = routes.route_layer(axum::middleware::from_fn_with_state(
            gate,
            crate::gate::guard,
        ));
    }
    // Added last, so checked first: a call meant for another node is told so, whatever
    // token it carries.
    routes = routes.route_layer(axum::middleware::from_fn_with_state(
        name,
        crate::gate::refuse_misdirected,
    ));
    with_json_fallbacks(
        routes,
        "GET|POST /tasks, GET|DELETE /tasks/{id}, GET /tasks/{id}/logs, POST /tasks/{id}/exec, \
         GET /tasks/{id}/exec/attach (Upgrade: cube-exec), \
         GET /version, GET /metrics, GET /stats, GET /node, GET /volumes, \
         DELETE /volumes/{name}, GET /health",
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
/// tasks that changed after N only. `&ring=R&shards=0-3,8` lists only the tasks of projects
/// in those shards of a ring of R (`cube_types::shard`): a manager acting for some shards
/// follows only theirs, rather than reading every manager's changes and dropping most.
#[derive(Debug, Deserialize)]
struct ListQuery {
    index: Option<u64>,
    wait: Option<String>,
    changes: Option<bool>,
    ring: Option<u32>,
    shards: Option<String>,
}

impl ListQuery {
    /// The shards asked for; `None` for every task.
    fn scope(&self) -> Result<Option<ShardScope>, ApiError> {
        match (self.ring, &self.shards) {
            (None, None) => Ok(None),
            (Some(ring), Some(shards)) => ShardScope::parse(ring, shards)
                .map(Some)
                .map_err(|why| ApiError::bad_request(format!("shards: {why}"))),
            _ => Err(ApiError::bad_request(
                "ring and shards go together: ?ring=16&shards=0-3,8",
            )),
        }
    }
}

/// The tasks of `scope`'s shards among `tasks` (all of them for no scope).
fn in_scope<T: std::borrow::Borrow<Task>>(tasks: Vec<T>, scope: Option<&ShardScope>) -> Vec<T> {
    match scope {
        None => tasks,
        Some(scope) => tasks
            .into_iter()
            .filter(|task| scope.holds_project(&task.borrow().spec.project))
            .collect(),
    }
}

/// The longest a blocking query waits; a manager asks again at once.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// Every task, with the store's index in [`INDEX_HEADER`].
async fn list_tasks<R: Runtime>(
    State(worker): State<Arc<Worker<R>>>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query?;
    let scope = query.scope()?;
    let scope = scope.as_ref();
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
                    Json(in_scope(tasks, scope)),
                )
                    .into_response(),
                (TaskChanges::All(tasks), index) => (
                    [(INDEX_HEADER, index.to_string())],
                    Json(in_scope(tasks, scope)),
                )
                    .into_response(),
            });
        }
    }
    // The index is read before the list, so a change between the two is seen again by the
    // next blocking query rather than missed.
    let index = worker.change_index();
    let tasks = in_scope(worker.list_tasks()?, scope);
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
/// `RestartCount`); without `run`, whatever run it is. `?purge=true` forgets a task that
/// ended, with its containers (409 for one that has not ended).
#[derive(Debug, Deserialize)]
struct StopQuery {
    run: Option<u32>,
    purge: Option<bool>,
}

async fn stop_task<R: Runtime>(
    State(worker): State<Arc<Worker<R>>>,
    JsonPath(id): JsonPath<String>,
    query: Result<Query<StopQuery>, QueryRejection>,
) -> Result<StatusCode, ApiError> {
    let Query(query) = query?;
    let id = parse_task_id(&id)?;
    if query.purge == Some(true) {
        worker.purge(id).await?;
    } else {
        worker.request_stop_of_run(id, query.run).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /tasks/{id}/logs?follow=true&tail=N&since=10m&stdout=true&stderr=true&container=NAME`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogsQuery {
    pub follow: Option<bool>,
    pub tail: Option<u64>,
    /// A duration before now (`10m`, `1h`), an RFC 3339 time, or Unix seconds.
    pub since: Option<String>,
    pub stdout: Option<bool>,
    pub stderr: Option<bool>,
    /// Which of a pod's containers (a service's name).
    pub container: Option<String>,
}

/// How long a followed log waits, once the container stopped, for the worker to record how
/// the task ended (its `die` event is handled within milliseconds).
const END_RECORD_BOUND: Duration = Duration::from_secs(5);

/// The newline-delimited JSON type of streamed output.
const NDJSON: &str = "application/x-ndjson";

/// `since` as Unix seconds: a duration before now, an RFC 3339 time, or Unix seconds.
pub fn since_unix_secs(text: &str) -> Result<i64, ApiError> {
    if let Ok(seconds) = text.parse::<i64>() {
        return Ok(seconds);
    }
    if let Ok(ago) = parse_duration(text) {
        let ago = chrono::Duration::from_std(ago).unwrap_or_default();
        return Ok((Utc::now() - ago).timestamp());
    }
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|time| time.timestamp())
        .map_err(|_| {
            ApiError::bad_request(format!(
                "since: {text:?} is neither a duration (10m, 1h), an RFC 3339 time nor Unix                  seconds"
            ))
        })
}

async fn task_logs<R: Runtime>(
    State(worker): State<Arc<Worker<R>>>,
    JsonPath(id): JsonPath<String>,
    query: Result<Query<LogsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query?;
    let id = parse_task_id(&id)?;
    let options = LogOptions {
        follow: query.follow == Some(true),
        tail: query.tail,
        since_unix_secs: query.since.as_deref().map(since_unix_secs).transpose()?,
        stdout: query.stdout != Some(false),
        stderr: query.stderr != Some(false),
    };
    let output = worker.logs(id, &options, query.container.as_deref())?;
    let closing = worker.closing().clone();
    let lines = output.map(|chunk| match chunk {
        Ok(chunk) => {
            let stream = match chunk.stream {
                OutputStream::Stdout => "stdout",
                OutputStream::Stderr => "stderr",
            };
            OutputLine::text(stream, String::from_utf8_lossy(&chunk.data)).to_line()
        }
        Err(err) => OutputLine::text("error", err.to_string()).to_line(),
    });
    let lines = lines.take_until(closing.cancelled_owned());
    let body = if options.follow {
        // Once the container stopped writing, a last line says how the task ended.
        let end = futures_util::stream::once(async move {
            match worker.await_end(id, END_RECORD_BOUND).await {
                Ok(task) => OutputLine::end_of(&task).to_line(),
                Err(err) => OutputLine::text("error", err.to_string()).to_line(),
            }
        });
        Body::from_stream(
            lines
                .chain(end)
                .map(|line| Ok::<_, std::convert::Infallible>(Bytes::from(line))),
        )
    } else {
        Body::from_stream(lines.map(|line| Ok::<_, std::convert::Infallible>(Bytes::from(line))))
    };
    Ok(([(axum::http::header::CONTENT_TYPE, NDJSON)], body).into_response())
}

/// The body of `POST /tasks/{id}/exec`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecRequest {
    #[serde(rename = "Cmd")]
    cmd: Vec<String>,
    /// Which of a pod's containers (a service's name); the first service's when unset.
    #[serde(rename = "Container", default)]
    container: Option<String>,
}

/// Runs a command in the task's container: its output as lines of JSON, then a last line
/// with its exit code (`{"Stream": "exit", "ExitCode": N}`).
async fn exec<R: Runtime>(
    State(worker): State<Arc<Worker<R>>>,
    JsonPath(id): JsonPath<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let request: ExecRequest =
        cube_types::event::decode(&body?).map_err(|err| ApiError::bad_request(err.to_string()))?;
    let id = parse_task_id(&id)?;
    let session = worker
        .exec(id, &request.cmd, request.container.as_deref(), false, false)
        .await?;
    let exec_id = session.exec_id.clone();
    // The command's input is not attached: dropping it leaves nothing open.
    drop(session.input);
    let closing = worker.closing().clone();
    let lines = session
        .output
        .map(|chunk| match chunk {
            Ok(chunk) => {
                OutputLine::text(chunk.stream.name(), String::from_utf8_lossy(&chunk.data))
                    .to_line()
            }
            Err(err) => OutputLine::text("error", err.to_string()).to_line(),
        })
        .take_until(closing.cancelled_owned());
    let exit = futures_util::stream::once(async move {
        let mut line = OutputLine::text("exit", "");
        line.exit_code = worker.exec_exit_code(&exec_id).await;
        if line.exit_code.is_none() {
            line.text = "the command's exit code could not be read".to_string();
        }
        line.to_line()
    });
    let body = Body::from_stream(
        lines
            .chain(exit)
            .map(|line| Ok::<_, std::convert::Infallible>(Bytes::from(line))),
    );
    Ok(([(axum::http::header::CONTENT_TYPE, NDJSON)], body).into_response())
}

/// `GET /tasks/{id}/exec/attach?cmd=["sh"]&tty=true` with `Upgrade: cube-exec`: an
/// interactive command (`cube exec -it`). The command is started before the answer, so that
/// a refusal is a JSON error; then `101 Switching Protocols`, and frames both ways
/// (`cube_api::attach`) until the command ends.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachQuery {
    /// The command and its arguments, as a JSON array.
    pub cmd: String,
    pub tty: Option<bool>,
    /// Which of a pod's containers (a service's name); the first service's when unset.
    pub container: Option<String>,
}

async fn exec_attach<R: Runtime>(
    State(worker): State<Arc<Worker<R>>>,
    JsonPath(id): JsonPath<String>,
    query: Result<Query<AttachQuery>, QueryRejection>,
    request: axum::extract::Request,
) -> Result<Response, ApiError> {
    let Query(query) = query?;
    let id = parse_task_id(&id)?;
    let cmd: Vec<String> = serde_json::from_str(&query.cmd)
        .map_err(|err| ApiError::bad_request(format!("cmd: not a JSON array of strings: {err}")))?;
    let upgrade = request
        .headers()
        .get(axum::http::header::UPGRADE)
        .and_then(|value| value.to_str().ok());
    if upgrade != Some(cube_api::attach::PROTOCOL) {
        return Err(ApiError::bad_request(format!(
            "an interactive command needs `Upgrade: {}` (cube exec -it)",
            cube_api::attach::PROTOCOL
        )));
    }
    let tty = query.tty == Some(true);
    let session = worker
        .exec(id, &cmd, query.container.as_deref(), tty, true)
        .await?;
    let on_upgrade = hyper::upgrade::on(request);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                crate::attach::serve(worker, session, tty, hyper_util::rt::TokioIo::new(upgraded))
                    .await
            }
            Err(err) => {
                tracing::warn!(error = %err, "an interactive command's connection was not upgraded")
            }
        }
    });
    Ok(Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(axum::http::header::CONNECTION, "Upgrade")
        .header(axum::http::header::UPGRADE, cube_api::attach::PROTOCOL)
        .body(Body::empty())
        .unwrap_or_default())
}

/// This worker's build and its engine's version.
async fn version<R: Runtime>(
    State(worker): State<Arc<Worker<R>>>,
) -> Json<cube_types::version::VersionInfo> {
    Json(worker.version().await)
}

/// The worker's metrics in the Prometheus text format.
async fn metrics<R: Runtime>(State(worker): State<Arc<Worker<R>>>) -> Result<Response, ApiError> {
    let metrics = worker.metrics();
    let (by_state, running, exited) = worker.task_counts();
    for (state, count) in by_state {
        metrics
            .tasks
            .get_or_create(&crate::metrics::StateLabel {
                state: state.name().to_string(),
            })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }
    for (state, count) in [("running", running), ("exited", exited)] {
        metrics
            .containers
            .get_or_create(&crate::metrics::StateLabel {
                state: state.to_string(),
            })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }
    if let Ok(stats) = worker.stats().collect(running) {
        metrics.host_cpu.set(stats.cpu_usage);
        metrics
            .host_memory_used
            .set(i64::try_from(stats.mem_used_kb.saturating_mul(1024)).unwrap_or(i64::MAX));
        metrics
            .host_memory_total
            .set(i64::try_from(stats.mem_total_kb.saturating_mul(1024)).unwrap_or(i64::MAX));
        metrics.host_load1.set(stats.load_avg.last_1_min);
        metrics
            .host_disk_free
            .set(i64::try_from(stats.disk_free).unwrap_or(i64::MAX));
    }
    let text = metrics.encode().map_err(|err| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot write the metrics: {err}"),
        )
    })?;
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            cube_api::metrics::CONTENT_TYPE,
        )],
        text,
    )
        .into_response())
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
/// `GET /volumes`: the named volumes Cube made on this node, with the tasks using them.
async fn list_volumes<R: Runtime>(
    State(worker): State<Arc<Worker<R>>>,
) -> Result<Json<Vec<cube_types::secret::VolumeInfo>>, ApiError> {
    Ok(Json(worker.volumes().await?))
}

/// `DELETE /volumes/{name}` (the engine's name): refused (409) while a task uses it.
async fn remove_volume<R: Runtime>(
    State(worker): State<Arc<Worker<R>>>,
    JsonPath(name): JsonPath<String>,
) -> Result<StatusCode, ApiError> {
    worker.remove_named_volume(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

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
