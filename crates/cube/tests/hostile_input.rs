//! Hostile input, fuzz-like but replayable: a fixed seed draws a bounded number of requests to
//! every route of a real `cube manager` and a real `cube worker` — random methods, paths with
//! random percent-escapes (invalid UTF-8 among them), random query strings, and bodies that
//! are truncated, mistyped, huge or full of control characters. Every answer must be Cube's
//! JSON error when it is an error (its `HTTPStatusCode` equal to the status), and none a 5xx.
//!
//! What the requests may reach is kept on loopback: the manager only ever hears of nodes at
//! `127.0.0.1:1`, and a task body never names an image other than the local sample image, so
//! nothing is pulled. The few valid submissions start real containers on the worker's node,
//! removed when the worker is dropped.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};
use support::*;

/// The seed: change it to explore, keep it fixed to replay.
const SEED: u64 = 0x00C0_FFEE_CAFE_F00D;
/// Requests in all, shared between the manager and the worker.
const REQUESTS: usize = 2_000;

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

/// Values that fit no field: wrong types, numbers too large for any integer, strings with
/// control characters, deep nesting. None of them looks like a host or an image name.
fn hostile_value(rng: &mut Rng) -> Value {
    let deep = (0..200).fold(json!(0), |inner, _| json!([inner]));
    let values = [
        json!(null),
        json!(true),
        json!(-1),
        json!(0),
        json!(1.5e300),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(""),
        json!("\u{0000}\u{0007}\u{001b}[2J\r\n"),
        json!("1e400"),
        json!("-5GiB"),
        json!("18446744073709551616"),
        json!("\u{202e}evil\u{fffd}"),
        json!("x".repeat(5_000)),
        json!([]),
        json!(["", "\u{0000}"]),
        json!({}),
        json!({"nested": {"deeper": [1, "two", null]}}),
        deep,
    ];
    rng.pick(&values).clone()
}

/// A body a client might send, right or (mostly) wrong.
fn body(rng: &mut Rng, templates: &[Value]) -> Vec<u8> {
    match rng.below(8) {
        0 => Vec::new(),
        1 => (0..rng.below(64))
            .map(|_| rng.next_u64() as u8)
            .collect(),
        2 => b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[".to_vec(),
        3 => hostile_value(rng).to_string().into_bytes(),
        _ => {
            let mut value = rng.pick(templates).clone();
            mutate(rng, &mut value);
            let mut text = value.to_string().into_bytes();
            if rng.one_in(3) {
                text.truncate(rng.below(text.len() + 1));
            }
            text
        }
    }
}

/// Replaces one field's value (never `Image` or `Address`, which must stay local) with a
/// hostile one, or leaves the value as it is (one time in six: some requests are valid).
fn mutate(rng: &mut Rng, value: &mut Value) {
    if rng.one_in(6) {
        return;
    }
    let target = match value.get_mut("Task") {
        Some(task) if rng.one_in(2) => task,
        _ => value,
    };
    let Some(object) = target.as_object_mut() else {
        return;
    };
    let keys: Vec<String> = object
        .keys()
        .filter(|key| !matches!(key.as_str(), "Image" | "Address"))
        .cloned()
        .collect();
    if keys.is_empty() {
        return;
    }
    let key = rng.pick(&keys).clone();
    object.insert(key, hostile_value(rng));
}

/// A path segment: a UUID, a name, or bytes percent-escaped (invalid UTF-8 among them).
fn segment(rng: &mut Rng, known: &[String]) -> String {
    match rng.below(6) {
        0 => uuid::Uuid::new_v4().to_string(),
        1 if !known.is_empty() => rng.pick(known).clone(),
        2 => rng
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
            ])
            .to_string(),
        3 => (0..1 + rng.below(12))
            .map(|_| format!("%{:02X}", rng.next_u64() as u8))
            .collect(),
        _ => {
            const PLAIN: &[u8] = b"abcXYZ019-._~";
            (0..1 + rng.below(20))
                .map(|_| *rng.pick(PLAIN) as char)
                .collect()
        }
    }
}

fn path(rng: &mut Rng, known: &[String]) -> String {
    let base = match rng.below(9) {
        0 => "/tasks".to_string(),
        1 | 2 => format!("/tasks/{}", segment(rng, known)),
        3 => "/nodes".to_string(),
        4 => format!("/nodes/{}", segment(rng, known)),
        5 => rng.pick(&["/stats", "/node", "/", ""]).to_string(),
        6 => format!("/tasks/{}/{}", segment(rng, known), segment(rng, known)),
        _ => format!("/{}", segment(rng, known)),
    };
    if !rng.one_in(3) {
        return base;
    }
    // `index` is never a small number: with `wait`, that would be a real blocking query.
    let pairs: Vec<String> = (0..1 + rng.below(4))
        .map(|_| {
            let key = *rng.pick(&["index", "wait", "changes", "x", "%FF", ""]);
            let value = *rng.pick(&[
                "abc",
                "-1",
                "99999999999999999999999",
                "18446744073709551615",
                "10ms",
                "1h",
                "forever",
                "true",
                "maybe",
                "%C0%AF",
                "",
            ]);
            format!("{key}={value}")
        })
        .collect();
    format!("{base}?{}", pairs.join("&"))
}

/// Sends one drawn request; returns its description, status and body.
async fn send(
    http: &reqwest::Client,
    base: &str,
    rng: &mut Rng,
    known: &[String],
    templates: &[Value],
) -> (String, reqwest::Method, u16, Option<String>, Vec<u8>) {
    let methods = [
        "GET", "GET", "POST", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "FROB",
    ];
    let mut method = reqwest::Method::from_bytes(rng.pick(&methods).as_bytes()).unwrap();
    let mut path = path(rng, known);
    // Half the submissions and reports go where bodies are read, so that bodies are tested.
    if method == reqwest::Method::POST && rng.one_in(2) {
        path = "/tasks".to_string();
    } else if method == reqwest::Method::PUT && rng.one_in(2) {
        path = format!("/nodes/{}", known[0]);
    }
    let oversized = rng.one_in(150);
    if oversized {
        // Over the 1 MiB limit, to a route that reads bodies: a route that answers without
        // reading the body closes the connection while the client is still sending it, and
        // the client sees its write fail rather than the answer.
        (method, path) = (reqwest::Method::POST, "/tasks".to_string());
    }
    let mut request = http.request(method.clone(), format!("{base}{path}"));
    if oversized {
        request = request.body(vec![b' '; 1024 * 1024 + 17]);
    } else if !matches!(method.as_str(), "GET" | "HEAD") || rng.one_in(8) {
        request = request.body(body(rng, templates));
    }
    let content_type = *rng.pick(&[
        "",
        "application/json",
        "text/plain",
        "\u{7f}",
        "multipart/form-data",
    ]);
    if !content_type.is_empty()
        && let Ok(value) = reqwest::header::HeaderValue::from_str(content_type)
    {
        request = request.header(reqwest::header::CONTENT_TYPE, value);
    }
    let described = format!("{method} {path}");
    let response = request
        .send()
        .await
        .unwrap_or_else(|err| panic!("{described}: no answer: {err}"));
    let status = response.status().as_u16();
    let kind = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(str::to_string);
    let bytes = response.bytes().await.unwrap_or_default().to_vec();
    (described, method, status, kind, bytes)
}

/// Draws `count` requests against the server at `base`, checking each answer.
/// `known` starts with the names worth meeting in paths (the node the templates report, first).
async fn fuzz(
    base: &str,
    rng: &mut Rng,
    count: usize,
    templates: &[Value],
    mut known: Vec<String>,
) -> BTreeMap<u16, usize> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut statuses = BTreeMap::new();
    for _ in 0..count {
        let (described, method, status, kind, bytes) =
            send(&http, base, rng, &known, templates).await;
        *statuses.entry(status).or_insert(0) += 1;
        let text = String::from_utf8_lossy(&bytes);
        assert!(status < 500, "{described} on {base}: {status} {text}");
        if status == 201
            && let Ok(task) = serde_json::from_slice::<Value>(&bytes)
            && let Some(id) = task["ID"].as_str()
        {
            known.push(id.to_string());
        }
        if status < 400 {
            continue;
        }
        assert!(
            kind.as_deref()
                .is_some_and(|kind| kind.starts_with("application/json")),
            "{described} on {base}: {status} answered {kind:?}: {text:?}"
        );
        if method == reqwest::Method::HEAD {
            continue; // An answer to HEAD has no body.
        }
        let error: Value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| panic!("{described} on {base}: {status} is not JSON: {text:?}"));
        assert_eq!(
            error["HTTPStatusCode"], status,
            "{described} on {base}: {text}"
        );
        assert!(
            error["Message"]
                .as_str()
                .is_some_and(|message| !message.is_empty()),
            "{described} on {base}: {text}"
        );
    }
    statuses
}

#[tokio::test]
async fn every_answer_to_hostile_requests_is_json_and_none_is_a_server_error() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("roundrobin", "memory", dir.path(), 0);
    let worker = WorkerProcess::fresh("hostile");
    let node_name = unique_node("hostile-reported");
    let task = json!({"Name": "hostile", "Image": SAMPLE_IMAGE, "Cmd": ["/bin/sleep", "30"],
                      "Memory": "64MiB", "Cpu": 0.1, "Env": ["A=1"],
                      "ExposedPorts": {"7777/tcp": {}}, "HealthCheckType": "tcp",
                      "HealthCheckInterval": "1s"});
    let templates = [
        task.clone(),
        json!({"ID": uuid::Uuid::new_v4().to_string(), "State": 2, "Timestamp": "2026-11-22T10:00:00Z",
               "Task": task}),
        json!({"ID": uuid::Uuid::new_v4().to_string(), "State": "Completed",
               "Task": {"ID": uuid::Uuid::new_v4().to_string(), "Name": "x", "Image": SAMPLE_IMAGE}}),
        json!({"Name": node_name, "Address": "http://127.0.0.1:1",
               "Capacity": {"Cpu": 1.0, "Memory": "1GiB", "Disk": "1GiB"}}),
    ];
    let mut rng = Rng(SEED);
    let known = vec![node_name.clone()];
    let on_manager = fuzz(
        &manager.url,
        &mut rng,
        REQUESTS / 2,
        &templates,
        known.clone(),
    )
    .await;
    let on_worker = fuzz(&worker.url, &mut rng, REQUESTS / 2, &templates, known).await;
    println!("statuses from the manager: {on_manager:?}; from the worker: {on_worker:?}");
    assert!(
        on_manager
            .keys()
            .chain(on_worker.keys())
            .any(|status| *status == 201),
        "some drawn requests should be valid submissions"
    );
}
