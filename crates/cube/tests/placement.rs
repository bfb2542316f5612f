//! Why a task waits, as a user of a large cluster reads it: a counted summary on the task,
//! the node-by-node list on request, and a request bigger than every node named at once.
//! A real manager; the nodes are registrations sent over its API (no worker answers at
//! their addresses, as with workers that advertise a wrong address).

mod support;

use serde_json::json;
use support::*;

const GIB: u64 = 1 << 30;

async fn register(manager: &ManagerProcess, count: usize, memory: u64) {
    let http = reqwest::Client::new();
    for n in 0..count {
        let name = format!("big-{n:03}");
        let report = json!({"Name": name, "Address": "http://127.0.0.1:1",
                            "Capacity": {"Cpu": 2.0, "Memory": memory, "Disk": 10 * GIB}});
        let answer = http
            .put(format!("{}/nodes/{name}", manager.url))
            .json(&report)
            .send()
            .await
            .unwrap();
        assert!(answer.status().is_success(), "{}", answer.status());
    }
}

#[tokio::test]
async fn a_waiting_task_in_a_large_cluster_says_why_in_one_counted_line() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("epvm", "memory", dir.path(), 0);
    register(&manager, 40, 512 << 20).await;
    let client = manager.client();
    let id = client
        .submit(&json!({"Name": "wide", "Image": SAMPLE_IMAGE, "Memory": "1GiB"}))
        .await;
    let task = client
        .await_task(&id, "a reason naming 40 nodes", |task| {
            task["PendingReason"]
                .as_str()
                .is_some_and(|reason| reason.contains("40 nodes:"))
        })
        .await;
    let reason = task["PendingReason"].as_str().unwrap();
    assert!(reason.len() < 200, "one short line: {reason}");
    assert!(
        reason.contains("no node could ever hold it: needs 1.0 GiB memory, the largest node has 512.0 MiB"),
        "{reason}"
    );

    // The long form, node by node, on request.
    let placement = client.get(&format!("/tasks/{id}/placement")).await;
    assert_eq!(placement.status, 200, "{}", placement.body);
    let nodes = placement.body["Nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 40);
    assert!(
        nodes
            .iter()
            .all(|node| node["Fits"] == false && node["Reason"].is_string()),
        "{}",
        placement.body
    );
    // Counted the same way (the nodes' states may have moved on since the task's reason).
    let summary = placement.body["Summary"].as_str().unwrap_or_default();
    assert!(summary.contains("40 nodes:"), "{summary}");
    let unknown = client
        .get("/tasks/00000000-0000-4000-8000-000000000001/placement")
        .await;
    assert_eq!(unknown.status, 404);
}
