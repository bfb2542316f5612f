//! The worker's door, when it joined its manager with a token (`cube worker --join HOST:PORT
//! --token TOKEN`): only the manager may use the worker's API.
//!
//! The manager answers every heartbeat of a node token with that node's worker-command
//! token (`X-Cube-Worker-Token`, one per node: another node's is refused here); the worker
//! keeps the last one it was given (in memory: a
//! restarted worker learns it again from its first heartbeat) and refuses any request but
//! `GET /health` that does not carry it as `Authorization: Bearer`, compared in constant
//! time. Until its first heartbeat was answered it refuses everything but `GET /health`.
//! A worker started without a token has no gate: its API is open, as before. A worker joined
//! with TLS (`tls.rs`) also takes requests only over the manager's certificate: its TLS
//! handshake already refused clients without a certificate of the cluster's CA, and a node's
//! certificate is refused here (403).
//!
//! Every worker, joined with a token or not, refuses a call meant for another node
//! (`refuse_misdirected`): whatever a manager still believes of an address it knew.

use std::sync::{Arc, RwLock};

use axum::extract::{MatchedPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use cube_api::ApiError;
use cube_api::server::{bearer_token, same_secret};

/// The worker-command token this worker accepts, once the manager gave it.
#[derive(Debug, Default)]
pub struct CommandGate {
    /// A `std` lock: held to read or replace a string, never across an await.
    token: RwLock<Option<String>>,
    /// Joined with TLS: a request is taken only over the manager's certificate too.
    manager_certificate: bool,
}

impl CommandGate {
    pub fn new() -> Arc<CommandGate> {
        Arc::new(CommandGate::default())
    }

    /// A gate that also asks for the manager's certificate (a worker joined with TLS).
    pub fn with_manager_certificate() -> Arc<CommandGate> {
        Arc::new(CommandGate {
            token: RwLock::default(),
            manager_certificate: true,
        })
    }

    /// Keeps `token`, told by the manager in a heartbeat's answer.
    pub fn learn(&self, token: &str) {
        let mut kept = self
            .token
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if kept.as_deref() != Some(token) {
            if kept.is_none() {
                tracing::info!("the manager gave this worker its command token");
            } else {
                tracing::info!("the manager gave this worker a new command token");
            }
            *kept = Some(token.to_string());
        }
    }

    /// Whether `presented` is the token the manager gave, or why not.
    ///
    /// A token presented before the manager answered this worker's first heartbeat cannot be
    /// told right or wrong yet: that is 503, for a while, not a refusal. The manager places
    /// work on a node as soon as it registered, and its request can arrive before the
    /// registration's answer does; it retries a 5xx, where a 4xx would fail the task.
    fn check(&self, presented: Option<&str>) -> Result<(), ApiError> {
        let kept = self
            .token
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match (presented, kept.as_deref()) {
            (Some(token), Some(expected)) if same_secret(token, expected) => Ok(()),
            (Some(_), None) => Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "this worker joined with a token and takes requests from its manager only; \
                 it has not yet been answered by its manager: try again shortly",
            )),
            (Some(_), Some(_)) => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "this worker takes requests from its manager only: the token given is not \
                 the manager's worker-command token",
            )),
            (None, _) => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "this worker takes requests from its manager only (Authorization: Bearer \
                 <the manager's worker-command token>); none was given",
            )),
        }
    }
}

/// The layer on every route of every worker's API: a call that names another node
/// (`X-Cube-Node`, which a manager sends with each) is refused, 421. It was meant for a node
/// that answered at this address before: a manager that still follows it there must not take
/// this worker's tasks for that node's (and stop them as strays), nor send it that node's.
/// A call naming no node (the CLI, a probe, an older manager) is let through.
pub async fn refuse_misdirected(
    State(name): State<Arc<str>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    // Compared as bytes: a call to the right node (every call) copies nothing.
    if let Some(meant) = request.headers().get(cube_api::NODE_HEADER)
        && meant.as_bytes() != name.as_bytes()
    {
        let meant = String::from_utf8_lossy(meant.as_bytes());
        return ApiError::new(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "this worker is node {name:?}, not {meant:?}: the address the manager has for \
                 {meant:?} is out of date (another worker listens there now)"
            ),
        )
        .into_response();
    }
    next.run(request).await
}

/// The layer on every route of a joined worker's API: `GET /health` is open, the rest needs
/// the manager's worker-command token.
pub async fn guard(
    State(gate): State<Arc<CommandGate>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let open = request.method() == axum::http::Method::GET
        && request
            .extensions()
            .get::<MatchedPath>()
            .is_some_and(|path| path.as_str() == "/health");
    if !open && gate.manager_certificate {
        let peer = request.extensions().get::<cube_api::tls::PeerIdentity>();
        if peer.is_none_or(|peer| peer.role != cube_api::tls::PeerRole::Manager) {
            let presented = peer.map_or_else(|| "none".to_string(), |peer| peer.to_string());
            return ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "this worker takes requests only over its manager's certificate; this \
                     connection presented {presented}"
                ),
            )
            .into_response();
        }
    }
    if !open && let Err(error) = gate.check(bearer_token(request.headers())) {
        let mut response = error.into_response();
        response.headers_mut().insert(
            axum::http::header::WWW_AUTHENTICATE,
            axum::http::HeaderValue::from_static("Bearer"),
        );
        return response;
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_before_the_managers_first_answer_is_asked_again_later_not_refused() {
        let gate = CommandGate::new();
        let early = gate.check(Some("cube-command-token")).unwrap_err();
        assert_eq!(early.status, StatusCode::SERVICE_UNAVAILABLE, "{early:?}");
        let none = gate.check(None).unwrap_err();
        assert_eq!(
            none.status,
            StatusCode::UNAUTHORIZED,
            "no token: refused at once"
        );
        gate.learn("cube-command-token");
        assert!(gate.check(Some("cube-command-token")).is_ok());
        let wrong = gate.check(Some("another")).unwrap_err();
        assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    }
}
