//! The server side of Cube's APIs: errors as JSON, one body limit, JSON for unknown routes.
//!
//! Every answer a Cube server writes with a status of 400 or more is the JSON error body
//! `{"HTTPStatusCode": N, "Message": "..."}`: handlers return [`ApiError`], extractors reject
//! with it ([`JsonPath`], and `From` for axum's body and query rejections), and
//! [`with_json_fallbacks`] adds a last layer that rewrites whatever error still comes out as
//! plain text (a rejection of an extractor used without a mapping) into the same shape.
//! What hyper refuses before a request reaches the router (a malformed request line, headers
//! too large) is not Cube's answer and stays hyper's.

use axum::Json;
use axum::Router;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use cube_types::ErrorBody;
use serde::de::DeserializeOwned;
use uuid::Uuid;

/// The largest request body accepted. A task is a few hundred bytes; 1 MiB leaves room for
/// long environments without letting a client make a server buffer anything large.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// The header carrying a store's index on `GET /tasks`, for blocking queries
/// (`?index=N&wait=30s` answers once something changed after N), after Consul's
/// `X-Consul-Index`.
pub const INDEX_HEADER: &str = "X-Cube-Index";

/// Set on a 410 answer to a request for the events after an index the server no longer keeps
/// (`GET /events?index=N` on a manager): the oldest index it can answer from.
pub const OLDEST_INDEX_HEADER: &str = "X-Cube-Oldest-Index";

/// Set on a blocking query's answer that holds only what changed after the index in it: the
/// tasks not in the answer did not change. Absent, the answer holds everything.
pub const SINCE_HEADER: &str = "X-Cube-Since";

/// Set on the manager's answer to a heartbeat (`PUT /nodes/{name}`): the shortest interval,
/// in milliseconds, at which the worker should send the next ones. The manager raises it with
/// the number of nodes so that heartbeats reach it at a bounded rate, whatever the cluster's
/// size (as Nomad scales its heartbeat TTL).
pub const HEARTBEAT_INTERVAL_HEADER: &str = "X-Cube-Heartbeat-Interval";

/// Set on the manager's answer to an authenticated heartbeat (`PUT /nodes/{name}` with a node
/// token) when the manager runs with `--acl`: the worker-command token, which the manager
/// sends as `Authorization: Bearer` on every call it makes to a worker, and the only one a
/// worker joined with a token accepts on its API.
pub const WORKER_TOKEN_HEADER: &str = "X-Cube-Worker-Token";

/// Sent by a manager on every call it makes to a worker: the name of the node it means to
/// reach. A worker that is another node refuses the call (421): the manager's address for
/// that node is out of date, and another worker answers there now (a port or an address given
/// again), whose tasks it must not judge, stop or add to.
pub const NODE_HEADER: &str = "X-Cube-Node";

/// An error answer: a status and a message naming what was wrong.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
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

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> ApiError {
        ApiError::new(rejection.status(), rejection.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> ApiError {
        let status = rejection.status();
        let message = match &rejection {
            PathRejection::FailedToDeserializePathParams(failed) => match failed.kind() {
                axum::extract::path::ErrorKind::InvalidUtf8InPathParam { key } => {
                    format!("malformed path: its {key} is not valid UTF-8 once percent-decoded")
                }
                _ => format!("malformed path: {}", failed.body_text()),
            },
            _ => rejection.body_text(),
        };
        ApiError::new(status, message)
    }
}

/// axum's [`Path`] with its rejections as JSON [`ApiError`]s: a path segment that is not
/// UTF-8 once percent-decoded (`/tasks/%C0%AF`) is a 400 in Cube's error shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonPath<T>(pub T);

impl<T, S> FromRequestParts<S> for JsonPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(value) = Path::<T>::from_request_parts(parts, state).await?;
        Ok(JsonPath(value))
    }
}

/// Adds what every Cube router has: JSON answers for unknown routes (naming the routes
/// there are, `routes`) and methods, the body limit, and the layer that makes every error
/// answer JSON.
pub fn with_json_fallbacks(router: Router, routes: &'static str) -> Router {
    router
        .fallback(move || async move {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no such route; the routes are {routes}"),
            )
        })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed on this route",
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::map_response(errors_as_json))
}

/// The most of a non-JSON error body kept as the message when it is rewritten as JSON.
const MAX_REWRITTEN_MESSAGE_BYTES: usize = 4096;

/// Rewrites an error answer that is not JSON (one of axum's plain-text rejections that no
/// handler mapped) into Cube's error shape, keeping its status, its text as the message and
/// its other headers. JSON answers and successes pass untouched, unread.
async fn errors_as_json(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/json"));
    if status.as_u16() < 400 || is_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    // Rejections' bodies are one line; anything longer is cut rather than buffered whole.
    let text = match axum::body::to_bytes(body, MAX_REWRITTEN_MESSAGE_BYTES).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_string(),
        Err(_) => String::new(),
    };
    let message = if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("request refused")
            .to_string()
    } else {
        text
    };
    let rewritten = ApiError::new(status, message).into_response();
    let (rewritten_parts, body) = rewritten.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.extend(rewritten_parts.headers);
    Response::from_parts(parts, body)
}

/// A task ID from a path, or a 400 that shows what an ID looks like.
pub fn parse_task_id(text: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(text).map_err(|err| {
        ApiError::bad_request(format!(
            "malformed task ID {text:?}: {err}; expected a UUID such as bb1d59ef-9fc1-4e4b-a44d-db571eeed203"
        ))
    })
}

/// The token of an `Authorization: Bearer <token>` header, if the request has one.
pub fn bearer_token(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim)
}

/// Whether two secrets are equal, compared in a time that does not depend on where they
/// differ (`subtle`), so that an attacker cannot learn a secret byte by byte from timings.
pub fn same_secret(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn rewritten(response: Response) -> (StatusCode, ErrorBody) {
        let answer = errors_as_json(response).await;
        let status = answer.status();
        let bytes = axum::body::to_bytes(answer.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn a_plain_text_error_that_no_handler_mapped_becomes_the_json_error() {
        let plain = (StatusCode::BAD_REQUEST, "Invalid URL: Invalid UTF-8 in id").into_response();
        let (status, body) = rewritten(plain).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(body.http_status_code, 400);
        assert_eq!(body.message, "Invalid URL: Invalid UTF-8 in id");

        let empty = StatusCode::UNSUPPORTED_MEDIA_TYPE.into_response();
        let (status, body) = rewritten(empty).await;
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert_eq!(body.message, "Unsupported Media Type");
    }

    #[tokio::test]
    async fn successes_and_json_errors_pass_untouched() {
        let ok = errors_as_json((StatusCode::OK, "plain success").into_response()).await;
        assert_eq!(
            ok.headers().get(header::CONTENT_TYPE).unwrap(),
            "text/plain; charset=utf-8"
        );
        let (status, body) = rewritten(ApiError::bad_request("named field").into_response()).await;
        assert_eq!(
            (status.as_u16(), body.message.as_str()),
            (400, "named field")
        );
    }
}
