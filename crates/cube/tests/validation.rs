//! What a user may submit, as the real `cube manager` and `cube worker` processes answer it:
//! every refusal is a 400 whose JSON message names the field at fault (and its limit), and
//! what a submitter says of a task's status is ignored, not believed.

mod support;

use serde_json::{Value, json};
use support::*;

/// A manager with the memory store and no worker: a task it accepts stays `Pending`.
struct LoneManager {
    manager: ManagerProcess,
    _dir: tempfile::TempDir,
}

impl LoneManager {
    fn start() -> LoneManager {
        let dir = tempfile::tempdir().unwrap();
        let manager = ManagerProcess::start("epvm", "memory", dir.path(), 0);
        LoneManager { manager, _dir: dir }
    }

    fn client(&self) -> Client {
        self.manager.client()
    }
}

/// Posts each `(body, words)` and asserts a 400 whose message contains every one of `words`.
async fn assert_refused(client: &Client, cases: &[(Value, &[&str])]) {
    for (body, words) in cases {
        let answer = client.post(body).await;
        assert_eq!(
            answer.status, 400,
            "{body} was not refused: {}",
            answer.body
        );
        assert_eq!(answer.body["HTTPStatusCode"], 400, "{}", answer.body);
        let message = answer.message();
        for word in *words {
            assert!(
                message.contains(word),
                "{body}: {word:?} not in the message {message:?}"
            );
        }
    }
}

fn task_with(field: &str, value: Value) -> Value {
    let mut task = json!({"Name": "v", "Image": SAMPLE_IMAGE});
    task[field] = value;
    task
}

#[tokio::test]
async fn bad_durations_are_refused_naming_the_field_and_the_accepted_forms() {
    let manager = LoneManager::start();
    let client = manager.client();
    let interval = "HealthCheckInterval";
    assert_refused(
        &client,
        &[
            (
                task_with(interval, json!(5)),
                &["HealthCheckInterval: 5 is a bare number", "\"5s\""],
            ),
            (
                task_with(interval, json!(1.5)),
                &["HealthCheckInterval: 1.5 is a bare number"],
            ),
            (
                task_with(interval, json!("3000000000000000h")),
                &["HealthCheckInterval", "24h"],
            ),
            (
                task_with("RestartDelayMax", json!("48h")),
                &["RestartDelayMax: 172800s is more than the limit of 24h"],
            ),
            (
                task_with(interval, json!("0s")),
                &["HealthCheckInterval: must be longer than 0"],
            ),
            (
                task_with("HealthCheckRetries", json!(0)),
                &["HealthCheckRetries: must be at least 1"],
            ),
        ],
    )
    .await;
    let untagged = client.post(&task_with(interval, json!(1.5))).await;
    assert!(
        !untagged.message().contains("untagged"),
        "{}",
        untagged.body
    );
}

#[tokio::test]
async fn out_of_range_resources_are_refused_with_the_limit_and_units_are_read() {
    let manager = LoneManager::start();
    let client = manager.client();
    assert_refused(
        &client,
        &[
            (
                task_with("Memory", json!("2Pi")),
                &[
                    "Memory: 2251799813685248 bytes is more than the limit",
                    "1 PiB",
                ],
            ),
            (
                task_with("Disk", json!("2PiB")),
                &["Disk: ", "more than the limit"],
            ),
            (
                json!({"Image": SAMPLE_IMAGE, "Cpu": 1e300}),
                &["Cpu: 1e300 cores is more than the limit of 1024 cores"],
            ),
            (task_with("Cpu", json!(-1)), &["Cpu: -1 is not"]),
            (task_with("Cpu", json!("lots")), &["Cpu: ", "500m"]),
        ],
    )
    .await;
    // A JSON number beyond a u64, written as is (serde_json's `Value` cannot hold it).
    let huge = client
        .post_raw(
            "/tasks",
            format!(r#"{{"Image": "{SAMPLE_IMAGE}", "Memory": 99999999999999999999999}}"#),
        )
        .await;
    assert_eq!(huge.status, 400, "{}", huge.body);
    assert!(
        huge.message().starts_with("Memory: ") && huge.message().contains("too large"),
        "{}",
        huge.body
    );
    let accepted = client
        .post(&json!({"Image": SAMPLE_IMAGE, "Cpu": "500m", "Memory": "512m", "Disk": "1G"}))
        .await;
    assert_eq!(accepted.status, 201, "{}", accepted.body);
    assert_eq!(accepted.body["Cpu"], 0.5);
    assert_eq!(accepted.body["Memory"], 512 * 1024 * 1024);
    assert_eq!(accepted.body["Disk"], 1_000_000_000);
    let kubernetes = client
        .post(&json!({"Image": SAMPLE_IMAGE, "Memory": "512Mi", "Disk": "512M"}))
        .await;
    assert_eq!(kubernetes.status, 201, "{}", kubernetes.body);
    assert_eq!(kubernetes.body["Memory"], 512 * 1024 * 1024);
    assert_eq!(kubernetes.body["Disk"], 512_000_000);
}

#[tokio::test]
async fn control_characters_long_names_and_bad_image_references_are_refused() {
    let manager = LoneManager::start();
    let client = manager.client();
    assert_refused(
        &client,
        &[
            (
                task_with("Name", json!("a\u{0}b")),
                &["Name: contains a control character (U+0000)"],
            ),
            (
                task_with("Name", json!("n".repeat(5000))),
                &["Name: 5000 characters is more than the limit of 255"],
            ),
            (
                task_with("Cmd", json!(["sh", "a\u{0}b"])),
                &["Cmd[1]: contains a control character (U+0000)"],
            ),
            (
                task_with("Env", json!(["A=1", "JUSTKEY"])),
                &["Env[1]: \"JUSTKEY\" is not KEY=value"],
            ),
            (
                task_with("Image", json!("Running")),
                &[
                    "Image: \"Running\" is not a valid image reference",
                    "lowercase",
                ],
            ),
            (
                task_with("Image", json!("x".repeat(300))),
                &["Image: ", "the limit is 255"],
            ),
            // Docker 20.10's daemon reads a capitalised first component as a repository,
            // not a registry host, and refuses it only when the worker creates the container.
            (
                task_with("Image", json!("UPPER/case:tag")),
                &[
                    "Image: \"UPPER/case:tag\" is not a valid image reference",
                    "repository names must be lowercase (\"UPPER\")",
                ],
            ),
        ],
    )
    .await;
    let hex_name = client.post(&task_with("Image", json!("0x10"))).await;
    assert_eq!(hex_name.status, 201, "{}", hex_name.body);
    // A tag may hold capitals; only the repository path may not.
    let capital_tag = client
        .post(&task_with("Image", json!("cube-sample:V1")))
        .await;
    assert_eq!(capital_tag.status, 201, "{}", capital_tag.body);
}

#[tokio::test]
async fn a_field_in_the_wrong_case_is_refused_with_the_field_meant() {
    let manager = LoneManager::start();
    let client = manager.client();
    assert_refused(
        &client,
        &[
            (
                json!({"image": SAMPLE_IMAGE}),
                &["unknown field `image`; did you mean `Image`?"],
            ),
            (
                json!({"Image": SAMPLE_IMAGE, "Memmory": "1Gi"}),
                &["did you mean `Memory`?"],
            ),
        ],
    )
    .await;
}

#[tokio::test]
async fn a_stop_without_a_task_id_is_a_bad_request_not_an_unknown_task() {
    let manager = LoneManager::start();
    let client = manager.client();
    let answer = client
        .post(&json!({"State": 3, "Task": {"Image": SAMPLE_IMAGE}}))
        .await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert!(
        answer.message().contains("Task.ID") && answer.message().contains("needs the task's ID"),
        "{}",
        answer.body
    );
}

#[tokio::test]
async fn status_fields_in_a_submission_are_ignored_by_the_manager() {
    let manager = LoneManager::start();
    let client = manager.client();
    let submitted = json!({
        "Name": "claims", "Image": SAMPLE_IMAGE, "State": "Failed", "RestartCount": 7,
        "FailureStreak": 3, "NodeName": "elsewhere", "ContainerID": "abc", "ExitCode": 3,
        "Error": "made up", "Health": "Unhealthy", "HealthFailures": 2, "PendingReason": "made up",
        "StartTime": "2026-01-01T00:00:00Z",
        "History": [{"Time": "2026-01-01T00:00:00Z", "Event": "Running", "Message": "made up"}]
    });
    let answer = client.post(&submitted).await;
    assert_eq!(answer.status, 201, "{}", answer.body);
    let id = answer.body["ID"].as_str().unwrap().to_string();
    for task in [answer.body, client.get(&format!("/tasks/{id}")).await.body] {
        assert_eq!(task["RestartCount"], 0, "{task}");
        assert_eq!(task["FailureStreak"], Value::Null, "{task}");
        assert_eq!(task["State"], "Pending", "{task}");
        assert_eq!(task["NodeName"], "", "{task}");
        assert_eq!(task["ContainerID"], "", "{task}");
        assert_eq!(task["ExitCode"], Value::Null, "{task}");
        assert_eq!(task["Health"], Value::Null, "{task}");
        assert_eq!(task["StartTime"], Value::Null, "{task}");
        let history = task["History"].as_array().unwrap();
        assert_eq!(history.len(), 1, "{task}");
        assert_eq!(history[0]["Event"], "Submitted", "{task}");
    }
}

#[tokio::test]
async fn node_reports_with_an_absurd_or_empty_capacity_are_refused() {
    let manager = LoneManager::start();
    let client = manager.client();
    let cases = [
        (
            r#"{"Cpu": -1, "Memory": "1Gi"}"#.to_string(),
            "Capacity.Cpu: -1 is not",
        ),
        (
            r#"{"Cpu": 1e308, "Memory": "1Gi"}"#.to_string(),
            "Capacity.Cpu: 1e308 cores is more than the limit of 1024 cores",
        ),
        (
            r#"{"Cpu": 2, "Memory": 99999999999999999999999}"#.to_string(),
            "Capacity.Memory: ",
        ),
        (
            "{}".to_string(),
            "Capacity: a node must offer some Cpu, Memory or Disk",
        ),
    ];
    for (capacity, words) in cases {
        let body =
            format!(r#"{{"Name": "w1", "Address": "http://127.0.0.1:1", "Capacity": {capacity}}}"#);
        let response = client
            .http
            .put(format!("{}/nodes/w1", client.base))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{capacity}");
        let answer: Value = response.json().await.unwrap();
        let message = answer["Message"].as_str().unwrap_or_default();
        assert!(message.contains(words), "{capacity}: {message}");
    }
    let node = client.get("/nodes/w1").await;
    assert_eq!(
        node.status, 404,
        "a refused report registers no node: {}",
        node.body
    );
}

#[tokio::test]
async fn the_worker_refuses_what_the_manager_refuses_and_ignores_status_it_does_not_own() {
    let worker = WorkerProcess::fresh("valid");
    let client = worker.client();
    assert_refused(
        &client,
        &[
            (
                task_with("HealthCheckInterval", json!(5)),
                &["HealthCheckInterval: 5 is a bare number"],
            ),
            (
                task_with("Cmd", json!(["sh", "a\u{0}b"])),
                &["Cmd[1]: contains a control character (U+0000)"],
            ),
            (
                task_with("Image", json!("Running")),
                &["Image: ", "lowercase"],
            ),
            (
                task_with("Image", json!("UPPER/case:tag")),
                &["Image: ", "lowercase"],
            ),
            (
                task_with("Cpu", json!(1e300)),
                &["Cpu: 1e300 cores is more than the limit"],
            ),
            (
                json!({"State": 3, "Task": {"Image": SAMPLE_IMAGE}}),
                &["needs the task's ID"],
            ),
        ],
    )
    .await;
    // A task the manager sends carries its run number and the manager's records; the worker
    // keeps the run number and drops what it does not own, whatever state the task claims.
    let mut task = shell_task("claims", "sleep 600");
    task["State"] = json!("Completed");
    task["RestartCount"] = json!(2);
    task["FailureStreak"] = json!(3);
    task["ContainerID"] = json!("abc");
    task["History"] = json!([{"Time": "2026-01-01T00:00:00Z", "Event": "Running"}]);
    let answer = client.post(&task).await;
    assert_eq!(answer.status, 201, "{}", answer.body);
    let id = answer.body["ID"].as_str().unwrap().to_string();
    let running = client.await_state(&id, "Running").await;
    assert_eq!(running["RestartCount"], 2, "{running}");
    assert_eq!(running["FailureStreak"], Value::Null, "{running}");
    assert_eq!(running["History"], Value::Null, "{running}");
    assert_ne!(running["ContainerID"], "abc", "{running}");
    assert_eq!(running["NodeName"], worker.name.as_str(), "{running}");
}
