//! The server side of Cube's APIs: errors as JSON, one body limit, JSON for unknown routes.

use axum::Json;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use cube_types::ErrorBody;
use uuid::Uuid;

/// The largest request body accepted. A task is a few hundred bytes; 1 MiB leaves room for
/// long environments without letting a client make a server buffer anything large.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// The header carrying a store's index on `GET /tasks`, for blocking queries
/// (`?index=N&wait=30s` answers once something changed after N), after Consul's
/// `X-Consul-Index`.
pub const INDEX_HEADER: &str = "X-Cube-Index";

/// Set on a blocking query's answer that holds only what changed after the index in it: the
/// tasks not in the answer did not change. Absent, the answer holds everything.
pub const SINCE_HEADER: &str = "X-Cube-Since";

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

/// Adds what every Cube router has: JSON answers for unknown routes (naming the routes
/// there are, `routes`) and methods, and the body limit.
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
}

/// A task ID from a path, or a 400 that shows what an ID looks like.
pub fn parse_task_id(text: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(text).map_err(|err| {
        ApiError::bad_request(format!(
            "malformed task ID {text:?}: {err}; expected a UUID such as bb1d59ef-9fc1-4e4b-a44d-db571eeed203"
        ))
    })
}
