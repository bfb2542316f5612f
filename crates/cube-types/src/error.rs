//! The error body every Cube API answers with.

use serde::{Deserialize, Serialize};

/// `{"HTTPStatusCode": 404, "Message": "no task with ID ..."}`: the book's error shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    #[serde(rename = "HTTPStatusCode")]
    pub http_status_code: u16,
    #[serde(rename = "Message")]
    pub message: String,
}
