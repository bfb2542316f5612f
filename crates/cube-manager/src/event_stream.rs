//! `GET /events`: the manager's events (`events.rs`) as a long-lived response, one event per
//! line of JSON (`application/x-ndjson`), or as server-sent events (`event: Task`, `id: N`,
//! `data: {...}`) when the request accepts `text/event-stream`.
//!
//! `?topic=Task&topic=Job` (repeatable, or comma-separated; none: every topic), `?job=NAME`
//! (the job's own events and those of its objects), `?index=N` (every kept event after N
//! first, then the new ones; without it, only new ones; a browser's `EventSource` says N in
//! `Last-Event-ID` when it reconnects, which counts when there is no `?index=`). An index older than the events kept
//! answers 410 with the oldest index to ask from (in the message and in
//! [`OLDEST_INDEX_HEADER`]); one ahead of the newest, 400.
//!
//! The stream writes an empty line (ndjson) or a comment (SSE) after [`HEARTBEAT`] of
//! silence, so that proxies keep the connection. It ends with a last `Stream` notice: `Dropped`
//! when the subscriber fell behind (the manager never waits for it), `Closed` when the manager
//! stops (so a stream never holds up the graceful shutdown); each says where to resume.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use cube_api::{ApiError, INDEX_HEADER, OLDEST_INDEX_HEADER};
use tokio_util::sync::CancellationToken;

use crate::events::{
    Event, EventFilter, Received, StreamNotice, SubscribeError, Subscription, Topic,
};
use crate::manager::Manager;

/// After this long without an event, the stream writes a heartbeat.
pub const HEARTBEAT: Duration = Duration::from_secs(15);

/// Events ready at once are written together, up to this many bytes: a burst (a job's new
/// copies) costs a subscriber a few writes, not one per event.
const CHUNK_BYTES: usize = 64 * 1024;

/// How the events are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// One JSON object per line (`application/x-ndjson`).
    Lines,
    /// Server-sent events (`text/event-stream`).
    ServerSent,
}

impl Framing {
    /// Server-sent events when the request's `Accept` names `text/event-stream`; lines
    /// otherwise.
    pub(crate) fn from_request(headers: &HeaderMap) -> Framing {
        let accepts_sse = headers
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .any(|value| value.contains("text/event-stream"));
        if accepts_sse {
            Framing::ServerSent
        } else {
            Framing::Lines
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            Framing::Lines => "application/x-ndjson",
            Framing::ServerSent => "text/event-stream",
        }
    }

    fn heartbeat(self) -> &'static [u8] {
        match self {
            Framing::Lines => b"\n",
            Framing::ServerSent => b": heartbeat\n\n",
        }
    }

    fn write_event(self, event: &Event, out: &mut Vec<u8>) {
        match self {
            Framing::Lines => {
                out.extend_from_slice(event.json());
                out.push(b'\n');
            }
            Framing::ServerSent => {
                out.extend_from_slice(b"event: ");
                out.extend_from_slice(event.topic.name().as_bytes());
                out.extend_from_slice(b"\nid: ");
                out.extend_from_slice(event.index.to_string().as_bytes());
                out.extend_from_slice(b"\ndata: ");
                out.extend_from_slice(event.json());
                out.extend_from_slice(b"\n\n");
            }
        }
    }

    fn write_notice(self, notice: &StreamNotice, out: &mut Vec<u8>) {
        // A notice holds strings and numbers only: it always serialises.
        let json = serde_json::to_vec(notice).unwrap_or_default();
        match self {
            Framing::Lines => {
                out.extend_from_slice(&json);
                out.push(b'\n');
            }
            Framing::ServerSent => {
                out.extend_from_slice(b"event: Stream\ndata: ");
                out.extend_from_slice(&json);
                out.extend_from_slice(b"\n\n");
            }
        }
    }
}

/// What `GET /events` asked for.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct EventsQuery {
    pub(crate) filter: EventFilter,
    pub(crate) index: Option<u64>,
}

impl EventsQuery {
    /// Reads the query's pairs: `topic` (repeatable, or comma-separated), `job`, `index`.
    /// Anything else, or a topic Cube does not have, is a 400 that names it.
    pub(crate) fn parse(pairs: &[(String, String)]) -> Result<EventsQuery, ApiError> {
        let mut query = EventsQuery::default();
        for (key, value) in pairs {
            match key.as_str() {
                "topic" => {
                    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                        let topic = Topic::parse(name).ok_or_else(|| {
                            ApiError::bad_request(format!(
                                "topic: {name:?} is not a topic; the topics are Task, Job, \
                                 Node and Deployment"
                            ))
                        })?;
                        if !query.filter.topics.contains(&topic) {
                            query.filter.topics.push(topic);
                        }
                    }
                }
                "job" if query.filter.job.is_some() => {
                    return Err(ApiError::bad_request("job: given twice; ask for one job"));
                }
                "job" => query.filter.job = Some(value.clone()),
                "index" if query.index.is_some() => {
                    return Err(ApiError::bad_request("index: given twice"));
                }
                "index" => {
                    query.index = Some(value.parse().map_err(|_| {
                        ApiError::bad_request(format!(
                            "index: {value:?} is not an event index (a whole number, as in \
                             an event's Index or the X-Cube-Index header)"
                        ))
                    })?);
                }
                other => {
                    return Err(ApiError::bad_request(format!(
                        "unknown query parameter {other:?}; GET /events takes topic, job and \
                         index"
                    )));
                }
            }
        }
        Ok(query)
    }

    /// Takes the index from `Last-Event-ID` (what an `EventSource` sends when it reconnects:
    /// the `id:` of the last event it got) when the query gave none.
    pub(crate) fn or_last_event_id(mut self, headers: &HeaderMap) -> Result<EventsQuery, ApiError> {
        if self.index.is_some() {
            return Ok(self);
        }
        if let Some(value) = headers.get("Last-Event-ID") {
            let text = value.to_str().unwrap_or_default();
            self.index = Some(text.trim().parse().map_err(|_| {
                ApiError::bad_request(format!("Last-Event-ID: {text:?} is not an event index"))
            })?);
        }
        Ok(self)
    }
}

/// The answer to `GET /events`: the stream, or why it cannot start where it was asked to.
pub(crate) fn events_response(
    manager: &Arc<Manager>,
    query: EventsQuery,
    scope: crate::projects::Scope,
    framing: Framing,
) -> Response {
    let subscription = match manager.events().subscribe(query.index) {
        Ok(subscription) => subscription,
        Err(err) => return refusal(err),
    };
    let start = subscription.position();
    let streamer = Streamer {
        subscription,
        filter: query.filter,
        scope,
        framing,
        shutdown: manager.shutdown.clone(),
        heartbeat: HEARTBEAT,
        ended: false,
    };
    let chunks = futures_util::stream::unfold(streamer, |mut streamer| async move {
        let chunk = streamer.next_chunk().await?;
        Some((Ok::<Bytes, Infallible>(chunk), streamer))
    });
    (
        [
            (header::CONTENT_TYPE, framing.content_type().to_string()),
            (header::CACHE_CONTROL, "no-cache".to_string()),
        ],
        [(INDEX_HEADER, start.to_string())],
        Body::from_stream(chunks),
    )
        .into_response()
}

/// 410 with the oldest index to ask from (in the message and in [`OLDEST_INDEX_HEADER`]), or
/// 400 for an index ahead of the newest.
fn refusal(err: SubscribeError) -> Response {
    match err {
        SubscribeError::Expired { oldest, .. } => {
            let mut response = ApiError::new(StatusCode::GONE, err.to_string()).into_response();
            if let Ok(value) = HeaderValue::from_str(&oldest.to_string()) {
                response.headers_mut().insert(OLDEST_INDEX_HEADER, value);
            }
            response
        }
        SubscribeError::Ahead { .. } => ApiError::bad_request(format!(
            "{err}; pass an index the manager gave (an event's Index, or X-Cube-Index)"
        ))
        .into_response(),
    }
}

/// One subscriber's stream: its subscription, what it wants, how to write it.
struct Streamer {
    subscription: Subscription,
    filter: EventFilter,
    /// The projects whose events the token may see, and asked for; a node's event (which
    /// belongs to none) goes to every subscriber.
    scope: crate::projects::Scope,
    framing: Framing,
    shutdown: CancellationToken,
    heartbeat: Duration,
    /// Set once the last notice is written (or the broker is gone): the stream ends.
    ended: bool,
}

impl Streamer {
    /// The next bytes to send: the events admitted that are ready (at least one), a
    /// heartbeat after a silence, or the last notice; `None` once the stream has ended.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        if self.ended {
            return None;
        }
        let quiet_until = tokio::time::Instant::now() + self.heartbeat;
        loop {
            let received = tokio::select! {
                biased;
                () = self.shutdown.cancelled() => {
                    self.ended = true;
                    let mut out = Vec::new();
                    let notice = StreamNotice::closed(self.subscription.position());
                    self.framing.write_notice(&notice, &mut out);
                    return Some(Bytes::from(out));
                }
                received = self.subscription.next() => received,
                () = tokio::time::sleep_until(quiet_until) => {
                    return Some(Bytes::from_static(self.framing.heartbeat()));
                }
            };
            let mut out = Vec::new();
            self.write(received, &mut out);
            while !self.ended && out.len() < CHUNK_BYTES {
                match self.subscription.try_next() {
                    Some(received) => self.write(received, &mut out),
                    None => break,
                }
            }
            if !out.is_empty() {
                return Some(Bytes::from(out));
            }
            if self.ended {
                return None;
            }
        }
    }

    /// Writes what the subscription gave: an event the filter admits, or the `Dropped`
    /// notice of a subscriber that fell behind (its stream ends).
    fn write(&mut self, received: Received, out: &mut Vec<u8>) {
        match received {
            Received::Event(event) => {
                if self.filter.admits(&event) && self.scope.lists_event(&event) {
                    self.framing.write_event(&event, out);
                }
            }
            Received::Lagged { position } => {
                tracing::info!(
                    position,
                    "an events subscriber fell behind; its stream is dropped"
                );
                self.framing
                    .write_notice(&StreamNotice::dropped(position), out);
                self.ended = true;
            }
            Received::Closed => self.ended = true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::EventBroker;

    fn pairs(query: &[(&str, &str)]) -> Vec<(String, String)> {
        query
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect()
    }

    #[test]
    fn the_query_takes_topics_a_job_and_an_index() {
        let query = EventsQuery::parse(&pairs(&[
            ("topic", "Task"),
            ("topic", "job,node"),
            ("job", "web"),
            ("index", "42"),
        ]))
        .unwrap();
        assert_eq!(
            query.filter.topics,
            vec![Topic::Task, Topic::Job, Topic::Node]
        );
        assert_eq!(query.filter.job.as_deref(), Some("web"));
        assert_eq!(query.index, Some(42));
    }

    #[test]
    fn an_unknown_topic_or_parameter_is_named_in_a_400() {
        let err = EventsQuery::parse(&pairs(&[("topic", "Tasks")])).unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        assert!(err.message.contains("\"Tasks\""), "{}", err.message);
        let err = EventsQuery::parse(&pairs(&[("since", "3")])).unwrap_err();
        assert!(err.message.contains("\"since\""), "{}", err.message);
        let err = EventsQuery::parse(&pairs(&[("index", "x")])).unwrap_err();
        assert!(err.message.starts_with("index:"), "{}", err.message);
    }

    #[test]
    fn an_event_sources_last_event_id_resumes_when_no_index_is_given() {
        let mut headers = HeaderMap::new();
        headers.insert("Last-Event-ID", HeaderValue::from_static("7"));
        let query = EventsQuery::default().or_last_event_id(&headers).unwrap();
        assert_eq!(query.index, Some(7));
        let given = EventsQuery {
            index: Some(3),
            ..EventsQuery::default()
        };
        assert_eq!(given.or_last_event_id(&headers).unwrap().index, Some(3));
        headers.insert("Last-Event-ID", HeaderValue::from_static("x"));
        assert!(EventsQuery::default().or_last_event_id(&headers).is_err());
    }

    #[test]
    fn the_accept_header_chooses_server_sent_events() {
        let mut headers = HeaderMap::new();
        assert_eq!(Framing::from_request(&headers), Framing::Lines);
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
        assert_eq!(Framing::from_request(&headers), Framing::ServerSent);
    }

    fn streamer(broker: &EventBroker, framing: Framing, shutdown: CancellationToken) -> Streamer {
        Streamer {
            subscription: broker.subscribe(None).unwrap(),
            filter: EventFilter::default(),
            scope: crate::projects::Scope::everything(),
            framing,
            shutdown,
            heartbeat: HEARTBEAT,
            ended: false,
        }
    }

    fn node_event(broker: &EventBroker, name: &str) {
        broker.publish(
            Topic::Node,
            "NodeReady".into(),
            name.to_string(),
            crate::events::Belongs::default(),
            crate::events::Payload::Value(serde_json::json!({"Name": name})),
            false,
        );
    }

    #[tokio::test]
    async fn server_sent_events_carry_the_topic_and_the_index() {
        let broker = EventBroker::new(0, 10, 10);
        let mut streamer = streamer(&broker, Framing::ServerSent, CancellationToken::new());
        node_event(&broker, "w1");
        let chunk = streamer.next_chunk().await.unwrap();
        let text = std::str::from_utf8(&chunk).unwrap();
        assert!(text.starts_with("event: Node\nid: 1\ndata: {"), "{text}");
        assert!(text.ends_with("}\n\n"), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_stream_sends_a_heartbeat() {
        let broker = EventBroker::new(0, 10, 10);
        let mut lines = streamer(&broker, Framing::Lines, CancellationToken::new());
        assert_eq!(lines.next_chunk().await.unwrap(), Bytes::from_static(b"\n"));
        let mut sse = streamer(&broker, Framing::ServerSent, CancellationToken::new());
        let beat = sse.next_chunk().await.unwrap();
        assert!(beat.starts_with(b":") && beat.ends_with(b"\n\n"));
    }

    #[tokio::test]
    async fn events_ready_together_are_sent_together_and_shutdown_ends_the_stream() {
        let broker = EventBroker::new(0, 10, 10);
        let shutdown = CancellationToken::new();
        let mut streamer = streamer(&broker, Framing::Lines, shutdown.clone());
        node_event(&broker, "w1");
        node_event(&broker, "w2");
        let chunk = streamer.next_chunk().await.unwrap();
        assert_eq!(chunk.split(|byte| *byte == b'\n').count(), 3, "two lines");
        shutdown.cancel();
        let last: serde_json::Value =
            serde_json::from_slice(&streamer.next_chunk().await.unwrap()).unwrap();
        assert_eq!(
            (last["Topic"].as_str(), last["Type"].as_str()),
            (Some("Stream"), Some("Closed"))
        );
        assert_eq!(last["Index"], 2);
        assert!(streamer.next_chunk().await.is_none());
    }

    #[tokio::test]
    async fn a_subscriber_that_fell_behind_gets_dropped_with_where_to_resume() {
        let broker = EventBroker::new(0, 100, 2);
        let mut streamer = streamer(&broker, Framing::Lines, CancellationToken::new());
        for n in 0..10 {
            node_event(&broker, &format!("w{n}"));
        }
        let chunk = streamer.next_chunk().await.unwrap();
        let last: serde_json::Value =
            serde_json::from_slice(chunk.strip_suffix(b"\n").unwrap()).unwrap();
        assert_eq!(last["Type"], "Dropped");
        assert_eq!(last["Index"], 0);
        assert!(streamer.next_chunk().await.is_none(), "and the stream ends");
    }
}
