//! Cube's HTTP edge, shared by every API: the manager's, the workers', and the `cube` CLI
//! that talks to them.
//!
//! [`server`] holds what every router needs (the JSON error answer, the body limit, JSON
//! answers for unknown routes, task-ID parsing); [`client`] is the one HTTP client that turns
//! Cube's JSON error bodies back into errors naming what went wrong.
//!
//! This crate knows HTTP and JSON but no component's logic: it never decides anything about
//! tasks or nodes.

pub mod attach;
pub mod client;
pub mod long_poll;
pub mod metrics;
pub mod serve;
pub mod server;
pub mod tls;

pub use client::{
    ApiClient, Changes, ClientError, LineStream, Unreached, error_chain, innermost_cause,
};
pub use long_poll::LongPoll;
pub use reqwest::Method;
pub use serve::{ServeLimits, serve, serve_tls};
pub use server::{
    ApiError, INDEX_HEADER, JsonPath, MAX_BODY_BYTES, NODE_HEADER, OLDEST_INDEX_HEADER,
    SINCE_HEADER, parse_task_id, with_json_fallbacks,
};

/// The `http://HOST:PORT` in the line `cube worker`, `cube manager` and `cube dev` print once
/// they listen; tools that start them on port 0 (the tests, `cube-bench`) read it back.
pub fn address_in_listening_line(line: &str) -> Option<&str> {
    line.split_whitespace()
        .find(|word| word.starts_with("http://") || word.starts_with("https://"))
}
