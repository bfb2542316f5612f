//! `?project=*` on managers acting for their own shards (`--shard-controllers`): a read of
//! every project is asked of every manager holding shards, and their answers joined.
//!
//! Each manager numbers its own events, so what stands for "where this read was" is one
//! token per manager: a [`Gathered`] token (`g` and the base64url of a JSON object, manager
//! → its own token), opaque to the client, given back as it came.
//!
//! - A list (`GET /tasks`, `/jobs`, `/queue`, ...): every manager's JSON list, joined. Its
//!   `X-Cube-Index` is the gathered index of the managers' own. A page of tasks
//!   (`?limit=N`) is one page in the lists' one order, at most N tasks, and its
//!   `X-Cube-Next-Token` a position in that order, which every manager answers alike
//!   (`cube_manager::paging`): the next page is asked of the managers holding shards then,
//!   so a shard that moves while a client pages is neither read twice nor missed.
//! - `GET /events`: every manager's stream, merged as the lines come. Each event keeps its
//!   manager's `Index` and gains a `Cursor`, the gathered index after it, to resume from
//!   (`?index=CURSOR`, or an `EventSource`'s `Last-Event-ID`, as the `id:` of a server-sent
//!   event is the cursor). What every manager publishes alike (nodes, projects) comes from one
//!   manager's stream only. When one manager's stream ends, the merged stream ends with a
//!   `Stream` notice carrying the cursor.
//! - A blocking query (`?index=` on a list) is not gathered (an answer would have to wait for
//!   every manager's change or wait): it is refused, naming what to do instead.
//!
//! A manager holding shards that cannot be reached (killed, its shards not yet taken by the
//! others) makes the read ask around again once the ring moved (`acting::route`, through
//! [`crate::acting::NotReached`]).

use std::collections::BTreeMap;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use cube_api::server::ApiError;
use cube_api::tls::PeerIdentity;
use cube_api::{INDEX_HEADER, OLDEST_INDEX_HEADER};
use cube_manager::api::NEXT_TOKEN_HEADER;
use cube_manager::paging::PagePosition;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use tokio::sync::mpsc;

use crate::leading::Front;

/// One token per manager, as one opaque token: a gathered index or a gathered next page.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Gathered(BTreeMap<String, String>);

impl Gathered {
    pub(crate) fn encode(&self) -> String {
        // A map of strings always serialises.
        let json = serde_json::to_vec(&self.0).unwrap_or_default();
        format!("g{}", URL_SAFE_NO_PAD.encode(json))
    }

    /// The token `text`, or why it is not one.
    pub(crate) fn decode(text: &str) -> Result<Gathered, String> {
        let Some(encoded) = text.strip_prefix('g') else {
            return Err("it is one manager's, not gathered from every manager".to_string());
        };
        let json = URL_SAFE_NO_PAD
            .decode(encoded)
            .map_err(|err| format!("it is not base64url ({err})"))?;
        serde_json::from_slice(&json)
            .map(Gathered)
            .map_err(|err| format!("it does not hold a token per manager ({err})"))
    }

    fn get(&self, manager: &str) -> Option<&str> {
        self.0.get(manager).map(String::as_str)
    }

    fn set(&mut self, manager: &str, token: String) {
        self.0.insert(manager.to_string(), token);
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A read of every project: events merged, a list joined; anything else refused.
pub(crate) async fn every_project(
    front: &Front,
    managers: &[String],
    peer: Option<&PeerIdentity>,
    parts: axum::http::request::Parts,
    body: Bytes,
) -> Response {
    if parts.method == Method::GET && parts.uri.path() == "/events" {
        return events(front, managers, peer, parts).await;
    }
    list(front, managers, peer, parts, body).await
}

/// A refusal naming `what` is wrong with a gathered token, and where a good one comes from.
fn bad_token(name: &str, token: &str, why: &str) -> Response {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        format!(
            "{name}: {token:?} cannot be read: {why}. Managers that act for their own shards \
             (--shard-controllers) number their changes each: for every project, pass the \
             X-Cube-Index or X-Cube-Next-Token of a read of ?project=* (or an event's Cursor) \
             as it came"
        ),
    )
    .into_response()
}

/// `parts` with its query's `drop` parameters replaced by `add`.
fn with_query(
    parts: &axum::http::request::Parts,
    drop: &[&str],
    add: &[(&str, &str)],
) -> axum::http::request::Parts {
    let mut pairs: Vec<String> = parts
        .uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty())
        .filter(|pair| {
            let name = pair.split_once('=').map_or(*pair, |(name, _)| name);
            !drop.contains(&name)
        })
        .map(str::to_string)
        .collect();
    pairs.extend(add.iter().map(|(name, value)| format!("{name}={value}")));
    let path_and_query = if pairs.is_empty() {
        parts.uri.path().to_string()
    } else {
        format!("{}?{}", parts.uri.path(), pairs.join("&"))
    };
    let mut asked = parts.clone();
    // Built from a URI's own path and its parameters (the added ones are tokens a manager
    // gave: digits, hex and dashes): it parses; if not, the request goes as it came.
    if let Ok(uri) = path_and_query.parse::<Uri>() {
        asked.uri = uri;
    }
    asked
}

fn header_text(response: &Response, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .and_then(|value| value.to_str().ok())
        .map(str::to_string)
}

/// A list of every project: each manager asked at once, their JSON lists joined. A page of
/// tasks (`?limit=`) is **one** page in the lists' one order (oldest first, then by ID): the
/// first `limit` of every manager's first `limit`, its `X-Cube-Next-Token` the position of
/// the first task after them, which the next page asks of every manager holding shards
/// then, whoever holds which shard by that time, so a shard that moved between two pages is
/// neither read twice nor missed (`cube_manager::paging`). A gathered `next` (one token per
/// manager, as Cube gave before) still asks each manager for its own next page.
async fn list(
    front: &Front,
    managers: &[String],
    peer: Option<&PeerIdentity>,
    parts: axum::http::request::Parts,
    body: Bytes,
) -> Response {
    let query = parts.uri.query();
    if parts.method != Method::GET || crate::acting::query_param(query, "index").is_some() {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            "managers that act for their own shards (--shard-controllers) gather plain lists \
             and event streams of every project, not blocking queries: follow GET \
             /events?project=* from the list's X-Cube-Index, or name one project with \
             ?project=NAME",
        )
        .into_response();
    }
    let asked: Vec<(String, Option<String>)> = match crate::acting::query_param(query, "next") {
        Some(token) if token.starts_with('g') => match Gathered::decode(token) {
            Ok(next) => next
                .0
                .into_iter()
                .map(|(manager, token)| (manager, Some(token)))
                .collect(),
            Err(why) => return bad_token("next", token, &why),
        },
        // No token, or a position: the same request of every manager.
        _ => managers
            .iter()
            .map(|manager| (manager.clone(), None))
            .collect(),
    };
    let gathered_next = asked.iter().any(|(_, next)| next.is_some());
    let answers = futures_util::future::join_all(asked.iter().map(|(manager, next)| {
        let parts = match next {
            Some(next) => with_query(&parts, &["next"], &[("next", next)]),
            None => parts.clone(),
        };
        let body = body.clone();
        async move { crate::acting::ask(front, manager, peer, &parts, body).await }
    }))
    .await;
    let mut pages = Vec::with_capacity(asked.len());
    let mut index = Gathered::default();
    for ((manager, _), answer) in asked.iter().zip(answers) {
        if !answer.status().is_success() {
            return answer;
        }
        if let Some(own) = header_text(&answer, INDEX_HEADER) {
            index.set(manager, own);
        }
        let next = header_text(&answer, NEXT_TOKEN_HEADER);
        let bytes = match axum::body::to_bytes(answer.into_body(), usize::MAX).await {
            Ok(bytes) => bytes,
            Err(err) => return crate::leading::unavailable(format!("{manager}: {err}")),
        };
        match serde_json::from_slice::<serde_json::Value>(&bytes) {
            Ok(serde_json::Value::Array(list)) => pages.push((manager.as_str(), list, next)),
            _ => {
                return ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "{} answers more than a list, which managers acting for their own \
                         shards do not gather: name one project with ?project=NAME",
                        parts.uri.path()
                    ),
                )
                .into_response();
            }
        }
    }
    let limit = crate::acting::query_param(query, "limit").and_then(|limit| limit.parse().ok());
    let (items, next) = match limit.filter(|_| !gathered_next) {
        Some(limit) => match one_page(&mut pages, limit) {
            Some((items, next)) => (items, next.map(|next| next.token())),
            // A manager of an older Cube, whose tokens are its own: as before.
            None => joined(pages),
        },
        None => joined(pages),
    };
    tracing::debug!(
        managers = asked.len(),
        items = items.len(),
        "gathered a list of every project"
    );
    let mut response = axum::Json(serde_json::Value::Array(items)).into_response();
    let index = (!index.is_empty()).then(|| index.encode());
    for (name, token) in [(INDEX_HEADER, index), (NEXT_TOKEN_HEADER, next)] {
        if let Some(token) = token
            && let Ok(value) = HeaderValue::from_str(&token)
        {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

/// Every manager's list joined, and the gathered token of every manager's next page.
fn joined(
    pages: Vec<(&str, Vec<serde_json::Value>, Option<String>)>,
) -> (Vec<serde_json::Value>, Option<String>) {
    let mut items = Vec::new();
    let mut next = Gathered::default();
    for (manager, list, own) in pages {
        items.extend(list);
        if let Some(own) = own {
            next.set(manager, own);
        }
    }
    (items, (!next.is_empty()).then(|| next.encode()))
}

/// One page of at most `limit` tasks from every manager's page of `limit` from the same
/// position, in the lists' order, and where the page after it starts: the first task left
/// out, or the first of a manager's next page, whichever comes first. The tasks of the
/// page are moved out of `pages`, not copied. `None`, `pages` untouched, when a task or a
/// manager's token has no position (a manager of an older Cube).
fn one_page(
    pages: &mut [(&str, Vec<serde_json::Value>, Option<String>)],
    limit: usize,
) -> Option<(Vec<serde_json::Value>, Option<PagePosition>)> {
    // Each task's position, with where it is in `pages`.
    let mut placed = Vec::new();
    let mut next: Option<PagePosition> = None;
    for (at, (_, list, own)) in pages.iter().enumerate() {
        for (index, item) in list.iter().enumerate() {
            placed.push((PagePosition::of_json(item)?, at, index));
        }
        if let Some(own) = own {
            let own = PagePosition::parse(own)?;
            next = Some(next.map_or(own, |next| next.min(own)));
        }
    }
    placed.sort_by_key(|(position, _, _)| *position);
    // A task two managers both listed (its shard moving as they answered) is shown once.
    placed.dedup_by_key(|(position, _, _)| *position);
    if let Some((first_left_out, _, _)) = placed.get(limit) {
        next = Some(next.map_or(*first_left_out, |next| next.min(*first_left_out)));
    }
    let items = placed
        .into_iter()
        .take(limit)
        .map(|(_, at, index)| std::mem::take(&mut pages[at].1[index]))
        .collect();
    Some((items, next))
}

/// Topics every manager publishes alike (each keeps its own registry of the nodes and its
/// own copy of the projects): taken from one manager's stream only.
const CLUSTER_WIDE: [&str; 2] = ["Node", "Project"];

/// What the merged stream hears from one manager's.
enum Heard {
    Line(usize, Bytes),
    /// The stream ended, with why if it broke.
    End(usize, Option<String>),
}

/// `GET /events?project=*`: every manager's stream merged (module comment).
async fn events(
    front: &Front,
    managers: &[String],
    peer: Option<&PeerIdentity>,
    parts: axum::http::request::Parts,
) -> Response {
    let server_sent = parts
        .headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .any(|value| value.contains("text/event-stream"));
    let query_index = crate::acting::query_param(parts.uri.query(), "index").map(str::to_string);
    let start = query_index.or_else(|| {
        parts
            .headers
            .get("Last-Event-ID")
            .and_then(|value| value.to_str().ok())
            .map(|text| text.trim().to_string())
    });
    let start = match start {
        None => None,
        Some(token) => match Gathered::decode(&token) {
            Ok(start) => Some(start),
            Err(why) => return bad_token("index", &token, &why),
        },
    };
    if let Some(start) = &start
        && let Some(missing) = managers.iter().find(|manager| start.get(manager).is_none())
    {
        return ApiError::new(
            StatusCode::GONE,
            format!(
                "the managers acting for shards changed since this cursor was given ({missing} \
                 was not among them): read the lists of every project again and follow the \
                 events from their X-Cube-Index"
            ),
        )
        .into_response();
    }
    // One manager's nodes and projects: this one's when it holds shards.
    let cluster_wide = managers
        .iter()
        .position(|manager| *manager == front.me)
        .unwrap_or(0);
    let mut upstream = parts.clone();
    upstream.headers.remove("last-event-id");
    upstream.headers.insert(
        header::ACCEPT,
        HeaderValue::from_static("application/x-ndjson"),
    );
    let opened = futures_util::future::join_all(managers.iter().map(|manager| {
        let asked = match start.as_ref().and_then(|start| start.get(manager)) {
            Some(own) => with_query(&upstream, &["index"], &[("index", own)]),
            None => with_query(&upstream, &["index"], &[]),
        };
        async move { crate::acting::ask(front, manager, peer, &asked, Bytes::new()).await }
    }))
    .await;
    let mut cursor = start.unwrap_or_default();
    let mut streams: Vec<BoxStream<'static, Result<Bytes, String>>> = Vec::new();
    for (manager, answer) in managers.iter().zip(opened) {
        if answer
            .extensions()
            .get::<crate::acting::NotReached>()
            .is_some()
        {
            // Asked around again by the front once the ring moved.
            return answer;
        }
        if !answer.status().is_success() {
            return refused_by(manager, answer).await;
        }
        if let Some(own) = header_text(&answer, INDEX_HEADER) {
            cursor.set(manager, own);
        }
        streams.push(
            answer
                .into_body()
                .into_data_stream()
                .map(|chunk| chunk.map_err(|err| err.to_string()))
                .boxed(),
        );
    }
    let (heard, hearing) = mpsc::channel(256);
    for (at, stream) in streams.into_iter().enumerate() {
        tokio::spawn(read_lines(at, stream, heard.clone()));
    }
    drop(heard);
    let merge = Merge {
        managers: managers.to_vec(),
        cluster_wide,
        cursor: cursor.clone(),
        hearing,
        server_sent,
        ended: false,
    };
    let chunks = futures_util::stream::unfold(merge, |mut merge| async move {
        let chunk = merge.next_chunk().await?;
        Some((Ok::<Bytes, std::convert::Infallible>(chunk), merge))
    });
    let content_type = if server_sent {
        "text/event-stream"
    } else {
        "application/x-ndjson"
    };
    let mut response = (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(chunks),
    )
        .into_response();
    if let Ok(value) = HeaderValue::from_str(&cursor.encode()) {
        response.headers_mut().insert(INDEX_HEADER, value);
    }
    response
}

/// One manager's refusal of its stream (410: its events after the cursor are no longer
/// kept; 400), said as the whole stream's, naming the manager.
async fn refused_by(manager: &str, answer: Response) -> Response {
    let status = answer.status();
    let bytes = axum::body::to_bytes(answer.into_body(), 64 * 1024)
        .await
        .unwrap_or_default();
    let why = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|value| value.get("Message")?.as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
    let mut response = ApiError::new(
        status,
        format!(
            "the events of every project cannot start at this cursor: the manager {manager} \
             answers: {why}; read the lists of every project again and follow the events from \
             their X-Cube-Index"
        ),
    )
    .into_response();
    // The oldest index is that manager's, which no gathered cursor stands for alone.
    response.headers_mut().remove(OLDEST_INDEX_HEADER);
    response
}

/// Hands each line of one manager's stream on, then its end.
async fn read_lines(
    at: usize,
    mut stream: BoxStream<'static, Result<Bytes, String>>,
    heard: mpsc::Sender<Heard>,
) {
    let mut pending: Vec<u8> = Vec::new();
    loop {
        match stream.next().await {
            Some(Ok(chunk)) => {
                pending.extend_from_slice(&chunk);
                while let Some(end) = pending.iter().position(|byte| *byte == b'\n') {
                    let mut line: Vec<u8> = pending.drain(..=end).collect();
                    line.pop();
                    let line = Bytes::from(line);
                    if heard.send(Heard::Line(at, line)).await.is_err() {
                        return;
                    }
                }
            }
            Some(Err(err)) => {
                let _ = heard.send(Heard::End(at, Some(err))).await;
                return;
            }
            None => {
                let _ = heard.send(Heard::End(at, None)).await;
                return;
            }
        }
    }
}

/// The merged stream's state.
struct Merge {
    managers: Vec<String>,
    /// Which manager's nodes and projects are passed on.
    cluster_wide: usize,
    cursor: Gathered,
    hearing: mpsc::Receiver<Heard>,
    server_sent: bool,
    ended: bool,
}

impl Merge {
    /// The next bytes to write, `None` once the stream has ended.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        if self.ended {
            return None;
        }
        loop {
            let Some(heard) = self.hearing.recv().await else {
                self.ended = true;
                return Some(self.notice("Closed", "every manager's stream ended".to_string()));
            };
            match heard {
                Heard::Line(at, line) => {
                    if line.iter().all(u8::is_ascii_whitespace) {
                        return Some(self.heartbeat());
                    }
                    let Ok(serde_json::Value::Object(mut event)) =
                        serde_json::from_slice::<serde_json::Value>(&line)
                    else {
                        continue;
                    };
                    let topic = event
                        .get("Topic")
                        .and_then(|topic| topic.as_str())
                        .unwrap_or("")
                        .to_string();
                    if topic == "Stream" {
                        // `Dropped` or `Closed`: that manager's stream ends; so does this.
                        let kind = event
                            .get("Type")
                            .and_then(|kind| kind.as_str())
                            .unwrap_or("Closed")
                            .to_string();
                        let message = event
                            .get("Message")
                            .and_then(|message| message.as_str())
                            .unwrap_or("")
                            .to_string();
                        self.ended = true;
                        return Some(self.notice(
                            &kind,
                            format!("the manager {}: {message}", self.managers[at]),
                        ));
                    }
                    if let Some(index) = event.get("Index").and_then(|index| index.as_u64()) {
                        self.cursor.set(&self.managers[at], index.to_string());
                    }
                    if at != self.cluster_wide && CLUSTER_WIDE.contains(&topic.as_str()) {
                        continue;
                    }
                    let cursor = self.cursor.encode();
                    event.insert(
                        "Cursor".to_string(),
                        serde_json::Value::String(cursor.clone()),
                    );
                    return Some(self.write(&topic, &cursor, &serde_json::Value::Object(event)));
                }
                Heard::End(at, broke) => {
                    let manager = &self.managers[at];
                    let why = match broke {
                        Some(err) => format!("the stream of the manager {manager} broke ({err})"),
                        None => format!("the stream of the manager {manager} ended"),
                    };
                    self.ended = true;
                    return Some(self.notice("Closed", why));
                }
            }
        }
    }

    fn heartbeat(&self) -> Bytes {
        if self.server_sent {
            Bytes::from_static(b": heartbeat\n\n")
        } else {
            Bytes::from_static(b"\n")
        }
    }

    /// The last `Stream` notice: why the stream ends, and the cursor to resume from.
    fn notice(&self, kind: &str, why: String) -> Bytes {
        let cursor = self.cursor.encode();
        let notice = serde_json::json!({
            "Time": chrono::Utc::now(),
            "Topic": "Stream",
            "Type": kind,
            "Cursor": cursor,
            "Message": format!(
                "{why}; reconnect with ?index={cursor} to get every event of every project \
                 after the last one sent"
            ),
        });
        self.write("Stream", &cursor, &notice)
    }

    fn write(&self, topic: &str, cursor: &str, event: &serde_json::Value) -> Bytes {
        let json = event.to_string();
        if self.server_sent {
            Bytes::from(format!("event: {topic}\nid: {cursor}\ndata: {json}\n\n"))
        } else {
            Bytes::from(format!("{json}\n"))
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::extract::Request;

    use super::*;

    #[test]
    fn a_gathered_token_reads_back_as_it_was_and_others_are_refused_with_why() {
        let mut token = Gathered::default();
        token.set("127.0.0.1:5555", "6000000000092".to_string());
        token.set("[::1]:5556", "9000000000006".to_string());
        let text = token.encode();
        assert!(text.starts_with('g'));
        assert!(
            text.bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_'),
            "a gathered token needs no escaping in a query: {text}"
        );
        assert_eq!(Gathered::decode(&text), Ok(token));
        let number = Gathered::decode("6000000000092").unwrap_err();
        assert!(number.contains("one manager's"), "{number}");
        assert!(Gathered::decode("g!!").unwrap_err().contains("base64url"));
        let not_a_map = format!("g{}", URL_SAFE_NO_PAD.encode(b"[1,2]"));
        assert!(
            Gathered::decode(&not_a_map)
                .unwrap_err()
                .contains("token per manager")
        );
    }

    #[test]
    fn a_query_keeps_its_other_parameters_when_one_is_replaced() {
        let (parts, ()) = Request::builder()
            .uri("/tasks?project=%2A&limit=5&next=gABC&summary=true")
            .body(())
            .unwrap()
            .into_parts();
        let asked = with_query(&parts, &["next"], &[("next", "8f0e-11")]);
        assert_eq!(
            asked.uri.to_string(),
            "/tasks?project=%2A&limit=5&summary=true&next=8f0e-11"
        );
        let (parts, ()) = Request::builder()
            .uri("/events?index=gXYZ")
            .body(())
            .unwrap()
            .into_parts();
        assert_eq!(
            with_query(&parts, &["index"], &[]).uri.to_string(),
            "/events"
        );
    }

    fn task(id: u128, seconds: i64) -> serde_json::Value {
        serde_json::json!({
            "ID": uuid::Uuid::from_u128(id).to_string(),
            "CreatedTime": chrono::DateTime::from_timestamp(seconds, 0).unwrap().to_rfc3339(),
        })
    }

    fn ids(items: &[serde_json::Value]) -> Vec<u128> {
        items
            .iter()
            .map(|item| {
                uuid::Uuid::parse_str(item["ID"].as_str().unwrap())
                    .unwrap()
                    .as_u128()
            })
            .collect()
    }

    fn position(id: u128, seconds: i64) -> PagePosition {
        PagePosition {
            created: chrono::DateTime::from_timestamp(seconds, 0),
            id: uuid::Uuid::from_u128(id),
        }
    }

    #[test]
    fn a_page_of_every_project_is_the_first_of_every_managers_in_one_order() {
        // Two managers' pages of 3 from the same place; the first has more after its page.
        let pages = vec![
            (
                "a",
                vec![task(1, 10), task(3, 30), task(5, 50)],
                Some(position(7, 70).token()),
            ),
            ("b", vec![task(2, 20), task(4, 40), task(6, 60)], None),
        ];
        let (items, next) = one_page(&mut pages.clone(), 3).unwrap();
        assert_eq!(ids(&items), vec![1, 2, 3]);
        assert_eq!(next, Some(position(4, 40)), "the first task left out");

        // All of them fit: the next page starts where a manager's own next one would.
        let (items, next) = one_page(&mut pages.clone(), 10).unwrap();
        assert_eq!(ids(&items), vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(next, Some(position(7, 70)));

        // The same task from two managers (its shard moved as they answered): once. Equal
        // times are ordered by ID, as each manager orders them.
        let pages = vec![
            ("a", vec![task(9, 10), task(8, 10)], None),
            ("b", vec![task(8, 10)], None),
        ];
        let (items, next) = one_page(&mut pages.clone(), 5).unwrap();
        assert_eq!(ids(&items), vec![8, 9]);
        assert_eq!(next, None);
    }

    #[test]
    fn an_older_managers_page_is_joined_as_before() {
        let older = vec![
            (
                "a",
                vec![task(1, 10)],
                Some(uuid::Uuid::from_u128(2).to_string()),
            ),
            ("b", vec![task(3, 30)], None),
        ];
        assert!(
            one_page(&mut older.clone(), 5).is_none(),
            "a task ID is no position"
        );
        let no_id = vec![("a", vec![serde_json::json!({"Name": "x"})], None)];
        assert!(one_page(&mut no_id.clone(), 5).is_none());
        let (items, next) = joined(older);
        assert_eq!(ids(&items), vec![1, 3]);
        assert!(next.unwrap().starts_with('g'), "one token per manager");
    }
}
