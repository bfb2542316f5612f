//! Hostile input, fuzzed but replayable: a fixed seed draws requests for every route of a real
//! `cube manager` and a real `cube worker` on loopback — the route's method or another, its
//! path with odd IDs and names (random percent-escapes, invalid UTF-8 among them), random
//! query strings, and bodies that are valid requests mutated at random depth (wrong types,
//! numbers too large for any integer, deep nesting, control characters, keys removed or
//! unknown ones added), truncated, or raw bytes that are not UTF-8, under wrong content
//! types. Every answer must be Cube's JSON error when it is an error (its `HTTPStatusCode`
//! equal to the status and a message), none may be a 5xx, and both processes must be alive and
//! answer `GET /health` afterwards.
//!
//! The test suite draws [`PER_ROUTE`] requests per route. `CUBE_FUZZ_PER_ROUTE=10000` draws
//! as many as that (the run BENCHMARKS.md records):
//!
//! ```sh
//! CUBE_FUZZ_PER_ROUTE=10000 cargo nextest run -p cube --test hostile_input --no-capture
//! ```
//!
//! What the requests may reach stays on this machine and bounded: the worker joined the
//! manager, a node report only ever names a node at `127.0.0.1:1` too small for any task, task
//! bodies only name the local sample image (nothing is pulled) and take their IDs from a small
//! pool, job bodies their names from another, so the valid submissions start a bounded number
//! of containers, removed when the worker is dropped.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};
use support::*;

/// The seed: change it to explore, keep it fixed to replay.
const SEED: u64 = 0x00C0_FFEE_CAFE_F00D;
/// Requests per route in the test suite (`CUBE_FUZZ_PER_ROUTE` says otherwise).
const PER_ROUTE: usize = 100;
/// Routes fuzzed at the same time.
const CONCURRENT_ROUTES: usize = 4;

/// SplitMix64, as `cube-scheduler/src/rng.rs` has it: tiny, seeded, and enough to draw cases.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut mixed = self.0;
        mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        mixed ^ (mixed >> 31)
    }

    fn below(&mut self, bound: usize) -> usize {
        ((u128::from(self.next_u64()) * bound as u128) >> 64) as usize
    }

    fn one_in(&mut self, odds: usize) -> bool {
        self.below(odds) == 0
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// What a route's body is made from.
#[derive(Debug, Clone, Copy, PartialEq)]
enum BodyKind {
    None,
    /// A task, a task event asking to run it, or one asking to stop another.
    Task,
    Node,
    Job,
    Scale,
    Drain,
    Eligibility,
    Exec,
    Revert,
}

/// One route: its method, its path (`{id}` a task, `{name}` a node or a job, `{kind}` a
/// request kind), what its body is, and the query keys it reads.
#[derive(Debug, Clone, Copy)]
struct Route {
    method: &'static str,
    path: &'static str,
    body: BodyKind,
    query: &'static [&'static str],
}

const fn route(
    method: &'static str,
    path: &'static str,
    body: BodyKind,
    query: &'static [&'static str],
) -> Route {
    Route {
        method,
        path,
        body,
        query,
    }
}

const TASK_QUERY: &[&str] = &[
    "limit", "next", "state", "node", "name", "job", "summary", "index", "wait",
];
const BLOCKING: &[&str] = &["index", "wait"];
const LOGS: &[&str] = &["follow", "tail", "since", "stdout", "stderr", "container"];

const MANAGER_ROUTES: &[Route] = &[
    route("GET", "/tasks", BodyKind::None, TASK_QUERY),
    route("POST", "/tasks", BodyKind::Task, &[]),
    route("POST", "/tasks/prune", BodyKind::None, &[]),
    route("GET", "/tasks/{id}", BodyKind::None, &[]),
    route("DELETE", "/tasks/{id}", BodyKind::None, &["purge"]),
    route("GET", "/tasks/{id}/placement", BodyKind::None, &[]),
    route("GET", "/tasks/{id}/logs", BodyKind::None, LOGS),
    route("POST", "/tasks/{id}/exec", BodyKind::Exec, &[]),
    route(
        "GET",
        "/tasks/{id}/exec/attach",
        BodyKind::None,
        &["cmd", "tty"],
    ),
    route("GET", "/nodes", BodyKind::None, BLOCKING),
    route("GET", "/nodes/{name}", BodyKind::None, &[]),
    route("PUT", "/nodes/{name}", BodyKind::Node, &[]),
    route("DELETE", "/nodes/{name}", BodyKind::None, &[]),
    route("POST", "/nodes/{name}/drain", BodyKind::Drain, &[]),
    route(
        "POST",
        "/nodes/{name}/eligibility",
        BodyKind::Eligibility,
        &[],
    ),
    route("GET", "/version", BodyKind::None, &[]),
    route("GET", "/metrics", BodyKind::None, &[]),
    route("GET", "/jobs", BodyKind::None, BLOCKING),
    route("POST", "/jobs", BodyKind::Job, &[]),
    route("POST", "/jobs/plan", BodyKind::Job, &[]),
    route("GET", "/jobs/{name}", BodyKind::None, BLOCKING),
    route("DELETE", "/jobs/{name}", BodyKind::None, &["purge"]),
    route("POST", "/jobs/{name}/scale", BodyKind::Scale, &[]),
    route("GET", "/jobs/{name}/versions", BodyKind::None, &[]),
    route("POST", "/jobs/{name}/revert", BodyKind::Revert, &[]),
    route("POST", "/jobs/{name}/promote", BodyKind::None, &[]),
    route("GET", "/jobs/{name}/deployment", BodyKind::None, &[]),
    route("GET", "/events", BodyKind::None, &["topic", "job", "index"]),
    route("GET", "/queue", BodyKind::None, &[]),
    route("GET", "/queue/{kind}/{id}", BodyKind::None, &[]),
    route("GET", "/services", BodyKind::None, &[]),
    route("GET", "/health", BodyKind::None, &[]),
    route("GET", "/store/backup", BodyKind::None, &[]),
    route("GET", "/{name}", BodyKind::None, &[]),
];

const WORKER_ROUTES: &[Route] = &[
    route(
        "GET",
        "/tasks",
        BodyKind::None,
        &["index", "wait", "changes"],
    ),
    route("POST", "/tasks", BodyKind::Task, &[]),
    route("GET", "/tasks/{id}", BodyKind::None, &[]),
    route("DELETE", "/tasks/{id}", BodyKind::None, &["purge", "run"]),
    route("GET", "/tasks/{id}/logs", BodyKind::None, LOGS),
    route("POST", "/tasks/{id}/exec", BodyKind::Exec, &[]),
    route(
        "GET",
        "/tasks/{id}/exec/attach",
        BodyKind::None,
        &["cmd", "tty"],
    ),
    route("GET", "/version", BodyKind::None, &[]),
    route("GET", "/metrics", BodyKind::None, &[]),
    route("GET", "/stats", BodyKind::None, &[]),
    route("GET", "/node", BodyKind::None, &[]),
    route("GET", "/health", BodyKind::None, &[]),
    route("GET", "/{name}", BodyKind::None, &[]),
];

/// Values that fit no field: wrong types, numbers too large for any integer, strings with
/// control characters, deep nesting. None of them looks like a host or an image name.
fn hostile_value(rng: &mut Rng) -> Value {
    match rng.below(24) {
        0 => json!(null),
        1 => json!(true),
        2 => json!(-1),
        3 => json!(0),
        4 => json!(1.5e300),
        5 => json!(u64::MAX),
        6 => json!(i64::MIN),
        7 => json!(""),
        8 => json!("\u{0000}\u{0007}\u{001b}[2J\r\n"),
        9 => json!("1e400"),
        10 => json!("-5GiB"),
        11 => json!("18446744073709551616"),
        12 => json!("\u{202e}evil\u{fffd}"),
        13 => json!("x".repeat(5_000)),
        14 => json!([]),
        15 => json!(["", "\u{0000}"]),
        16 => json!({}),
        17 => json!({"nested": {"deeper": [1, "two", null]}}),
        18 => (0..1 + rng.below(300)).fold(json!(0), |inner, _| json!([inner])),
        19 => (0..1 + rng.below(300)).fold(json!(0), |inner, _| json!({"a": inner})),
        20 => json!(rng.next_u64() as i64),
        21 => json!(1e-300),
        22 => json!("9".repeat(400)),
        _ => json!(format!("{}", rng.next_u64())),
    }
}

/// Keys whose value must stay as the template has it: what keeps the run on this machine
/// (`Image`, `Address`) and bounded (`ID`: a task's from the pool).
const KEPT: &[&str] = &["Image", "Address", "ID"];

/// Changes the value at a random depth: replaced by a hostile value, a key removed, an
/// unknown key added, or (one time in six) nothing, so that some requests are valid.
fn mutate(rng: &mut Rng, value: &mut Value) {
    if rng.one_in(6) {
        return;
    }
    let mut target = value;
    loop {
        let keys: Vec<String> = match target.as_object() {
            Some(object) => object
                .keys()
                .filter(|key| !KEPT.contains(&key.as_str()))
                .cloned()
                .collect(),
            None => Vec::new(),
        };
        let items = target.as_array().map_or(0, Vec::len);
        if keys.is_empty() && items == 0 {
            *target = hostile_value(rng);
            return;
        }
        if !rng.one_in(3) {
            // Descend into a child, which may be mutated in turn.
            target = if !keys.is_empty() {
                let key = rng.pick(&keys).clone();
                &mut target[key.as_str()]
            } else {
                let index = rng.below(items);
                &mut target[index]
            };
            continue;
        }
        let choice = rng.below(4);
        let replacement = hostile_value(rng);
        let key = (!keys.is_empty()).then(|| rng.pick(&keys).clone());
        match (target.as_object_mut(), choice, key) {
            (Some(object), 0, Some(key)) => {
                object.remove(&key);
            }
            (Some(object), 1, _) => {
                object.insert("Unknown\u{0000}Key".to_string(), replacement);
            }
            (Some(object), _, Some(key)) => {
                object.insert(key, replacement);
            }
            _ => *target = replacement,
        }
        return;
    }
}

/// The valid bodies each kind is mutated from.
struct Templates {
    tasks: Vec<Value>,
    node: Value,
    job: Value,
}

impl Templates {
    fn new(node_name: &str, task_ids: &[String], job_names: &[String], rng: &mut Rng) -> Templates {
        let task = |id: &str| {
            json!({"ID": id, "Name": "hostile", "Image": SAMPLE_IMAGE, "Cmd": ["/bin/sleep", "30"],
                   "Memory": "64MiB", "Cpu": 0.1, "Env": ["A=1"],
                   "ExposedPorts": {"7777/tcp": {}}, "HealthCheckType": "tcp",
                   "HealthCheckInterval": "1s"})
        };
        let id = rng.pick(task_ids).clone();
        let other = rng.pick(task_ids).clone();
        let tasks = vec![
            task(&id),
            json!({"ID": uuid::Uuid::new_v4().to_string(), "State": 2,
                   "Timestamp": "2026-11-22T10:00:00Z", "Task": task(&id)}),
            json!({"ID": uuid::Uuid::new_v4().to_string(), "State": "Completed",
                   "Task": {"ID": other, "Name": "x", "Image": SAMPLE_IMAGE}}),
        ];
        let job = json!({"Name": rng.pick(job_names), "Type": "service",
            "Groups": [{"Name": "g", "Count": 1,
                        "Task": {"Image": SAMPLE_IMAGE, "Cmd": ["/bin/sleep", "30"],
                                 "Memory": "16MiB", "Cpu": 0.05}}]});
        // Too small for any task: the manager never places one where it cannot reach.
        let node = json!({"Name": node_name, "Address": "http://127.0.0.1:1",
                          "Capacity": {"Cpu": 0.001, "Memory": "1MiB", "Disk": "1MiB"}});
        Templates { tasks, node, job }
    }

    fn valid(&self, rng: &mut Rng, kind: BodyKind) -> Value {
        match kind {
            BodyKind::None => json!({}),
            BodyKind::Task => rng.pick(&self.tasks).clone(),
            BodyKind::Node => self.node.clone(),
            BodyKind::Job => self.job.clone(),
            BodyKind::Scale => json!({"Group": "g", "Count": 1}),
            BodyKind::Drain => json!({"Deadline": "1m"}),
            BodyKind::Eligibility => json!({"Eligible": true}),
            BodyKind::Exec => json!({"Cmd": ["true"]}),
            BodyKind::Revert => json!({"Version": 1}),
        }
    }
}

/// A body a client might send to a route of `kind`, right or (mostly) wrong.
fn body(rng: &mut Rng, templates: &Templates, kind: BodyKind) -> Vec<u8> {
    match rng.below(10) {
        0 => Vec::new(),
        // Bytes, most of them not UTF-8.
        1 => (0..rng.below(64)).map(|_| rng.next_u64() as u8).collect(),
        2 => "[".repeat(1 + rng.below(100_000)).into_bytes(),
        3 => hostile_value(rng).to_string().into_bytes(),
        4 => {
            // Valid JSON around a string that is not UTF-8.
            let mut text = br#"{"Name": ""#.to_vec();
            text.extend([0xC0, 0xAF, 0xFF, 0xED, 0xA0, 0x80]);
            text.extend(br#"", "Image": "x"}"#);
            text
        }
        _ => {
            let mut value = templates.valid(rng, kind);
            mutate(rng, &mut value);
            let mut text = value.to_string().into_bytes();
            if rng.one_in(4) {
                text.truncate(rng.below(text.len() + 1));
            }
            text
        }
    }
}

/// A path segment: a known one, a UUID, or bytes percent-escaped (invalid UTF-8 among them).
fn segment(rng: &mut Rng, known: &[String]) -> String {
    match rng.below(7) {
        0 => uuid::Uuid::new_v4().to_string(),
        1 | 2 => rng.pick(known).clone(),
        3 => rng
            .pick(&[
                "%C0%AF",
                "%FF",
                "%00",
                "%E2%82",
                "%ED%A0%80",
                "%2F",
                "%25",
                "..",
                "%",
                "task",
                "job",
                "00000000-0000-0000-0000-000000000000",
                "3f2a",
            ])
            .to_string(),
        4 => (0..1 + rng.below(12))
            .map(|_| format!("%{:02X}", rng.next_u64() as u8))
            .collect(),
        5 => "a".repeat(1 + rng.below(3_000)),
        _ => {
            const PLAIN: &[u8] = b"abcXYZ019-._~";
            (0..1 + rng.below(20))
                .map(|_| *rng.pick(PLAIN) as char)
                .collect()
        }
    }
}

/// A query value for `key`: mostly wrong. `index` is never a small number and `wait` never
/// long, so that no drawn request is a real blocking query holding the run up.
fn query_value(rng: &mut Rng, key: &str) -> String {
    let common = [
        "abc",
        "-1",
        "99999999999999999999999",
        "18446744073709551615",
        "true",
        "maybe",
        "%C0%AF",
        "%FF%FE",
        "",
    ];
    let specific: &[&str] = match key {
        "wait" => &["10ms", "1ms", "1h", "forever", "0s"],
        "since" => &["10m", "2026-11-22T10:00:00Z", "1700000000", "-1h"],
        "topic" => &["Task", "Job,Node", "Nope", ","],
        "cmd" => &["[\"true\"]", "[]", "[1]", "not json", "[\"\"]"],
        "limit" => &["1", "0", "10001"],
        "state" => &["Running", "pending", "Nope"],
        "tail" => &["1", "0"],
        "follow" => &["false"],
        _ => &["1"],
    };
    if rng.one_in(2) {
        rng.pick(specific).to_string()
    } else {
        rng.pick(&common).to_string()
    }
}

/// The path of one request drawn for `route`.
fn path(rng: &mut Rng, route: &Route, known: &Known) -> String {
    let mut path = route.path.to_string();
    for (placeholder, pool) in [
        ("{id}", &known.ids),
        ("{name}", &known.names),
        ("{kind}", &known.kinds),
    ] {
        while path.contains(placeholder) {
            let value = segment(rng, pool);
            path = path.replacen(placeholder, &value, 1);
        }
    }
    if rng.one_in(12) {
        path.push('/');
        path.push_str(&segment(rng, &known.names));
    }
    if route.query.is_empty() && !rng.one_in(8) || rng.one_in(3) {
        return path;
    }
    let pairs: Vec<String> = (0..1 + rng.below(4))
        .map(|_| {
            let key = if rng.one_in(5) {
                rng.pick(&["x", "%FF", "", "index"]).to_string()
            } else if route.query.is_empty() {
                "x".to_string()
            } else {
                rng.pick(route.query).to_string()
            };
            let value = query_value(rng, &key);
            // `index` with no `wait` would wait 30 s: give it a short one.
            if key == "index" {
                format!("index={value}&wait=10ms")
            } else {
                format!("{key}={value}")
            }
        })
        .collect();
    format!("{path}?{}", pairs.join("&"))
}

/// The names worth meeting in paths.
struct Known {
    ids: Vec<String>,
    names: Vec<String>,
    kinds: Vec<String>,
}

/// What one request got.
struct Outcome {
    described: String,
    status: u16,
    /// For an error: its content type and body.
    error: Option<(Option<String>, Vec<u8>)>,
}

/// Sends one request drawn for `route`.
async fn send(
    http: &reqwest::Client,
    base: &str,
    rng: &mut Rng,
    route: &Route,
    known: &Known,
    templates: &Templates,
) -> Outcome {
    let methods = [
        "GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "FROB",
    ];
    let method = if rng.one_in(5) {
        *rng.pick(&methods)
    } else {
        route.method
    };
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let path = path(rng, route, known);
    let mut request = http.request(method.clone(), format!("{base}{path}"));
    // Over the 1 MiB limit, to a route that reads bodies.
    let oversized = route.body != BodyKind::None && rng.one_in(300);
    if !oversized && (route.body != BodyKind::None || rng.one_in(8)) {
        let kind = if route.body == BodyKind::None {
            BodyKind::Task
        } else {
            route.body
        };
        request = request.body(body(rng, templates, kind));
    }
    let content_type = *rng.pick(&[
        "application/json",
        "application/json",
        "",
        "text/plain",
        "\u{7f}",
        "multipart/form-data; boundary=x",
        "application/json; charset=latin1",
        "application/x-www-form-urlencoded",
    ]);
    let content_type = reqwest::header::HeaderValue::from_str(content_type)
        .ok()
        .filter(|_| !content_type.is_empty());
    let described = format!("{method} {path}");
    if oversized {
        let url = reqwest::Url::parse(&format!("{base}{path}")).unwrap();
        let (status, error) = send_oversized(&url, &method, content_type.as_ref()).await;
        // Every body is read (up to the limit) before any route sees the request.
        assert_eq!(status, 413, "{described} on {base} with an oversized body");
        return Outcome {
            described,
            status,
            error,
        };
    }
    if let Some(value) = content_type {
        request = request.header(reqwest::header::CONTENT_TYPE, value);
    }
    let response = match request.send().await {
        Ok(response) => response,
        Err(err) => panic!("{described} on {base}: no answer: {err:?}"),
    };
    let status = response.status().as_u16();
    if status < 400 {
        // Not read: some answers stream for as long as the client listens (events, logs).
        return Outcome {
            described,
            status,
            error: None,
        };
    }
    let kind = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(str::to_string);
    let bytes = if method == reqwest::Method::HEAD {
        Vec::new()
    } else {
        response.bytes().await.unwrap_or_default().to_vec()
    };
    Outcome {
        described,
        status,
        error: Some((kind, bytes)),
    }
}

/// Sends a body over the 1 MiB limit to `url` on a connection of its own, reading the answer
/// while the body is still being written, and returns the answer's status and (for an error)
/// its content type and body. The server reads the body up to the limit, answers `413` and
/// closes; the bytes it never read may make the close a reset, which a client that reads only
/// after writing (reqwest) would see as a failed write instead of the answer. Reading at the
/// same time gets the answer before the reset, so the status recorded is the one the server
/// gave; no answer at all fails the test.
async fn send_oversized(
    url: &reqwest::Url,
    method: &reqwest::Method,
    content_type: Option<&reqwest::header::HeaderValue>,
) -> (u16, Option<(Option<String>, Vec<u8>)>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const BODY_BYTES: usize = 1024 * 1024 + 17;
    let address = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap());
    let stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    let (mut reading, mut writing) = stream.into_split();
    let target = match url.query() {
        Some(query) => format!("{}?{query}", url.path()),
        None => url.path().to_string(),
    };
    let mut head = format!(
        "{method} {target} HTTP/1.1\r\nHost: {address}\r\nContent-Length: {BODY_BYTES}\r\n"
    )
    .into_bytes();
    if let Some(value) = content_type {
        head.extend_from_slice(b"Content-Type: ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    let writer = tokio::spawn(async move {
        // A failed write is the server closing after its answer: the reader has that.
        if writing.write_all(&head).await.is_ok() {
            let _ = writing.write_all(&vec![b' '; BODY_BYTES]).await;
        }
        writing
    });
    let mut answer = Vec::new();
    let mut buffer = [0u8; 8192];
    let ended = loop {
        match tokio::time::timeout(STATE_BOUND, reading.read(&mut buffer)).await {
            Ok(Ok(0)) => break "closed".to_string(),
            Ok(Ok(read)) => answer.extend_from_slice(&buffer[..read]),
            Ok(Err(err)) => break err.to_string(),
            Err(_) => break format!("nothing more within {STATE_BOUND:?}"),
        }
    };
    // Dropping the writing half closes the connection, should the server still wait.
    drop(writer.await.unwrap());
    let text = String::from_utf8_lossy(&answer);
    let Some(status) = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse::<u16>().ok())
    else {
        panic!("{method} {url} with a {BODY_BYTES}-byte body: no answer ({ended}): {text:?}");
    };
    let Some(split) = answer.windows(4).position(|window| window == b"\r\n\r\n") else {
        panic!("{method} {url} with a {BODY_BYTES}-byte body: a cut answer ({ended}): {text:?}");
    };
    let headers = String::from_utf8_lossy(&answer[..split]).to_ascii_lowercase();
    let kind = headers
        .lines()
        .find_map(|line| line.strip_prefix("content-type:"))
        .map(|value| value.trim().to_string());
    let body = answer[split + 4..].to_vec();
    (status, (status >= 400).then_some((kind, body)))
}

/// Checks one answer: no 5xx, and an error is Cube's JSON error naming something.
fn check(base: &str, outcome: &Outcome, head: bool) {
    let Outcome {
        described, status, ..
    } = outcome;
    let Some((kind, bytes)) = &outcome.error else {
        return;
    };
    let text = String::from_utf8_lossy(bytes);
    assert!(*status < 500, "{described} on {base}: {status} {text}");
    assert!(
        kind.as_deref()
            .is_some_and(|kind| kind.starts_with("application/json")),
        "{described} on {base}: {status} answered {kind:?}: {text:?}"
    );
    if head {
        return; // An answer to HEAD has no body.
    }
    let error: Value = serde_json::from_slice(bytes)
        .unwrap_or_else(|_| panic!("{described} on {base}: {status} is not JSON: {text:?}"));
    assert_eq!(
        error["HTTPStatusCode"], *status,
        "{described} on {base}: {text}"
    );
    assert!(
        error["Message"]
            .as_str()
            .is_some_and(|message| !message.trim().is_empty()),
        "{described} on {base}: {text}"
    );
}

/// Draws `per_route` requests for each of `routes` against the server at `base`, checking
/// each answer; the statuses per route. Each route has its own generator, seeded from the
/// seed and the route's place, so a run replays whatever order the routes interleave in.
async fn fuzz(
    base: &str,
    routes: &[Route],
    per_route: usize,
    known: &Known,
    templates: &Templates,
    seed: u64,
) -> BTreeMap<String, BTreeMap<u16, usize>> {
    let http = support::http_builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let results = futures_util::stream::iter(routes.iter().enumerate())
        .map(|(place, route)| {
            let http = http.clone();
            async move {
                let mut rng = Rng(seed ^ (place as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                let mut statuses = BTreeMap::new();
                for _ in 0..per_route {
                    let outcome = send(&http, base, &mut rng, route, known, templates).await;
                    check(base, &outcome, outcome.described.starts_with("HEAD"));
                    *statuses.entry(outcome.status).or_insert(0) += 1;
                }
                (format!("{} {}", route.method, route.path), statuses)
            }
        })
        .buffer_unordered(CONCURRENT_ROUTES)
        .collect::<Vec<_>>()
        .await;
    results.into_iter().collect()
}

/// Whether the process is still there and answers `GET /health`.
async fn alive_and_healthy(pid: u32, base: &str) {
    assert!(
        std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "{base}: the process {pid} is gone"
    );
    let health = support::http()
        .get(format!("{base}/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200, "{base}: /health");
}

fn per_route() -> usize {
    match std::env::var("CUBE_FUZZ_PER_ROUTE") {
        Ok(count) => count
            .parse()
            .unwrap_or_else(|_| panic!("CUBE_FUZZ_PER_ROUTE={count:?} is not a count")),
        Err(_) => PER_ROUTE,
    }
}

#[tokio::test]
async fn every_answer_to_hostile_requests_is_json_and_none_is_a_server_error() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("roundrobin", "memory", dir.path(), 0);
    let worker = manager.join_worker(&unique_node("hostile"), &[]);
    manager.await_ready_nodes(1).await;
    let fake_node = unique_node("hostile-reported");
    let per_route = per_route();
    let mut rng = Rng(SEED);
    let pool = |prefix: u8| -> Vec<String> {
        (0..4u8)
            .map(|n| format!("{prefix:02x}{n:06x}-f022-4000-8000-00000000c0be"))
            .collect()
    };
    let job_names: Vec<String> = vec!["fuzz-a".into(), "fuzz-b".into()];
    let manager_templates = Templates::new(&fake_node, &pool(0xaa), &job_names, &mut rng);
    let worker_templates = Templates::new(&fake_node, &pool(0xbb), &job_names, &mut rng);
    let kinds = vec!["task".to_string(), "job".to_string(), "nope".to_string()];
    let mut names = vec![fake_node.clone(), worker.name.clone()];
    names.extend(job_names.iter().cloned());
    let manager_known = Known {
        ids: pool(0xaa),
        names: names.clone(),
        kinds: kinds.clone(),
    };
    let worker_known = Known {
        ids: pool(0xbb),
        names,
        kinds,
    };
    let started = std::time::Instant::now();
    let on_manager = fuzz(
        &manager.url,
        MANAGER_ROUTES,
        per_route,
        &manager_known,
        &manager_templates,
        SEED,
    )
    .await;
    let on_worker = fuzz(
        &worker.url,
        WORKER_ROUTES,
        per_route,
        &worker_known,
        &worker_templates,
        SEED.rotate_left(17),
    )
    .await;
    let took = started.elapsed();
    alive_and_healthy(manager.pid(), &manager.url).await;
    alive_and_healthy(worker.pid(), &worker.url).await;
    let total = (MANAGER_ROUTES.len() + WORKER_ROUTES.len()) * per_route;
    println!(
        "{total} requests ({per_route} per route; {} manager routes, {} worker routes) in \
         {took:.1?}, none answered 5xx",
        MANAGER_ROUTES.len(),
        WORKER_ROUTES.len()
    );
    for (server, statuses) in [("manager", &on_manager), ("worker", &on_worker)] {
        for (route, counts) in statuses {
            println!("{server} {route}: {counts:?}");
        }
    }
    let successes = |statuses: &BTreeMap<String, BTreeMap<u16, usize>>| {
        statuses
            .values()
            .flat_map(|counts| counts.iter())
            .filter(|(status, _)| (200..300).contains(*status))
            .map(|(_, count)| count)
            .sum::<usize>()
    };
    assert!(
        successes(&on_manager) > 0 && successes(&on_worker) > 0,
        "some drawn requests should be valid"
    );
}

#[tokio::test]
async fn an_oversized_body_is_answered_413_on_every_route_that_reads_a_body() {
    // The fuzz above draws an oversized body now and then; this sends one to every route
    // that reads a body, on the manager and on a worker, so each is checked on every run.
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("roundrobin", "memory", dir.path(), 0);
    let worker = manager.join_worker(&unique_node("oversized"), &[]);
    let json = reqwest::header::HeaderValue::from_static("application/json");
    for (base, routes) in [(&manager.url, MANAGER_ROUTES), (&worker.url, WORKER_ROUTES)] {
        for route in routes.iter().filter(|route| route.body != BodyKind::None) {
            let path = route
                .path
                .replace("{id}", "00000000-0000-4000-8000-000000000000")
                .replace("{name}", "oversized")
                .replace("{kind}", "task");
            let url = reqwest::Url::parse(&format!("{base}{path}")).unwrap();
            let method = reqwest::Method::from_bytes(route.method.as_bytes()).unwrap();
            let (status, error) = send_oversized(&url, &method, Some(&json)).await;
            let described = format!("{} {path}", route.method);
            assert_eq!(status, 413, "{described} on {base}: {error:?}");
            let outcome = Outcome {
                described,
                status,
                error,
            };
            check(base, &outcome, false);
            let (_, bytes) = outcome.error.as_ref().unwrap();
            let message = serde_json::from_slice::<Value>(bytes).unwrap()["Message"].clone();
            assert!(
                message
                    .as_str()
                    .is_some_and(|text| text.contains("larger than the limit")),
                "{} on {base}: {message}",
                outcome.described
            );
        }
    }
    alive_and_healthy(manager.pid(), &manager.url).await;
    alive_and_healthy(worker.pid(), &worker.url).await;
}
