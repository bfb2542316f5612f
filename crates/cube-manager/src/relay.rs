//! A task's output and commands, through its worker: `GET /tasks/{id}/logs` and `POST
//! /tasks/{id}/exec` on the manager are passed to the worker the task is placed on, and its
//! answer (lines of JSON, `cube_types::output::OutputLine`) is streamed back as it comes.
//!
//! Following survives nothing silently: a worker's stream that breaks (the worker stopped,
//! the connection dropped) ends with a last line `{"Stream": "error", "Text": ...}` that
//! says so, and a stream the manager cuts at its shutdown says that too. The manager reads
//! nothing of the lines but their bytes.

use std::convert::Infallible;

use axum::body::Body;
use bytes::Bytes;
use cube_api::{ApiClient, ClientError, Method};
use cube_types::output::OutputLine;
use futures_util::StreamExt;
use uuid::Uuid;

use crate::manager::{Manager, ManagerError};

use crate::cluster::lock;

impl Manager {
    /// The task's node's client and name, for a call about the task's container; a task
    /// never placed has none.
    fn task_node(&self, id: Uuid) -> Result<(ApiClient, String), ManagerError> {
        let state = lock(&self.cluster.state);
        let task = state.cache.get(&id).ok_or(ManagerError::NotFound(id))?;
        if task.status.node_name.is_empty() {
            return Err(ManagerError::Conflict(format!(
                "task {} ({id}) was never placed on a node{}: it has no container, and no output",
                task.name,
                task.status
                    .pending_reason
                    .as_deref()
                    .map(|why| format!(" ({why})"))
                    .unwrap_or_default()
            )));
        }
        let entry = state.nodes.get(&task.status.node_name).ok_or_else(|| {
            ManagerError::Unavailable(format!(
                "task {}'s node {} is not known any more (it was removed)",
                task.name, task.status.node_name
            ))
        })?;
        Ok((entry.client.clone(), entry.name.clone()))
    }

    /// `GET /tasks/{id}/logs?…`: the worker's answer, streamed; `query` is passed on as it
    /// came (the worker checks it).
    pub async fn task_logs(&self, id: Uuid, query: &str) -> Result<Body, ManagerError> {
        let (client, node) = self.task_node(id)?;
        let path = if query.is_empty() {
            format!("/tasks/{id}/logs")
        } else {
            format!("/tasks/{id}/logs?{query}")
        };
        let response = client
            .open_stream::<()>(Method::GET, &path, None)
            .await
            .map_err(|err| from_worker(&node, err))?;
        Ok(self.relay(response, node))
    }

    /// `POST /tasks/{id}/exec`: the command, run by the worker; its output and exit code
    /// streamed back.
    pub async fn exec(&self, id: Uuid, body: &serde_json::Value) -> Result<Body, ManagerError> {
        let (client, node) = self.task_node(id)?;
        let response = client
            .open_stream(Method::POST, &format!("/tasks/{id}/exec"), Some(body))
            .await
            .map_err(|err| from_worker(&node, err))?;
        Ok(self.relay(response, node))
    }

    /// `GET /tasks/{id}/exec/attach?…` with `Upgrade: cube-exec` (`cube exec -it`): the
    /// worker's connection is upgraded first (so that a refusal reaches the user as the
    /// worker's JSON error), then the user's; the manager copies the bytes both ways until
    /// either side closes or the manager stops.
    pub async fn exec_attach(
        &self,
        id: Uuid,
        query: &str,
        user: hyper::upgrade::OnUpgrade,
    ) -> Result<(), ManagerError> {
        let (client, node) = self.task_node(id)?;
        let response = client
            .open_upgrade(
                &format!("/tasks/{id}/exec/attach?{query}"),
                cube_api::attach::PROTOCOL,
            )
            .await
            .map_err(|err| from_worker(&node, err))?;
        let mut worker = response.upgrade().await.map_err(|err| {
            ManagerError::Unavailable(format!(
                "node {node} did not switch to an interactive command: {err}"
            ))
        })?;
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let mut user = match user.await {
                Ok(user) => hyper_util::rt::TokioIo::new(user),
                Err(err) => {
                    tracing::warn!(error = %err, "an interactive command's connection was not upgraded");
                    return;
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => {}
                copied = tokio::io::copy_bidirectional(&mut user, &mut worker) => {
                    if let Err(err) = copied {
                        tracing::debug!(error = %err, "an interactive command's connection ended");
                    }
                }
            }
        });
        Ok(())
    }

    /// The worker's answer as the body of the manager's, with a last line when it breaks or
    /// the manager stops.
    fn relay(&self, response: reqwest_response::Response, node: String) -> Body {
        let shutdown = self.shutdown.clone();
        let chunks = futures_util::stream::unfold(
            (Some(response), node, shutdown),
            |(response, node, shutdown)| async move {
                let mut response = response?;
                let next = tokio::select! {
                    _ = shutdown.cancelled() => {
                        let line = OutputLine::text(
                            "error",
                            "the manager is stopping: the stream ends here",
                        );
                        return Some((Bytes::from(line.to_line()), (None, node, shutdown)));
                    }
                    next = response.chunk() => next,
                };
                match next {
                    Ok(Some(chunk)) => Some((chunk, (Some(response), node, shutdown))),
                    Ok(None) => None,
                    Err(err) => {
                        let line = OutputLine::text(
                            "error",
                            format!("the stream from node {node} broke: {}", innermost(&err)),
                        );
                        Some((Bytes::from(line.to_line()), (None, node, shutdown)))
                    }
                }
            },
        );
        Body::from_stream(chunks.map(Ok::<_, Infallible>))
    }
}

/// The last cause of an error's chain ("connection reset by peer").
fn innermost(err: &dyn std::error::Error) -> String {
    let mut cause = err;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}

/// A worker's refusal as the manager's: its status and message (a task not running, no
/// container yet), or the node could not be reached.
fn from_worker(node: &str, err: ClientError) -> ManagerError {
    match err {
        ClientError::Status {
            status, message, ..
        } if status.as_u16() == 409 => ManagerError::Conflict(message),
        ClientError::Status {
            status, message, ..
        } if status.as_u16() == 400 => ManagerError::BadRequest(message),
        ClientError::Status {
            status, message, ..
        } if status.as_u16() == 404 => {
            // The node answers, and says the run is gone: asking again will not help.
            ManagerError::Conflict(format!("node {node} no longer has the task: {message}"))
        }
        other => ManagerError::Unavailable(format!("cannot reach node {node}: {}", other.cause())),
    }
}

/// `reqwest`'s response, named through `cube-api`'s re-export so that this crate does not
/// depend on `reqwest` itself.
mod reqwest_response {
    pub use cube_api::client::Response;
}
