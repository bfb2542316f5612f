//! Why a task waits, as a user of a large cluster reads it: a counted summary on the task,
//! the node-by-node list on request, and a request bigger than every node named at once.
//! A real manager; the nodes are registrations sent over its API (no worker answers at
//! their addresses, as with workers that advertise a wrong address).

mod support;

use serde_json::json;
use support::*;

const GIB: u64 = 1 << 30;

async fn register(manager: &ManagerProcess, count: usize, memory: u64) {
    let http = support::http();
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
    // Bigger than every node: accepted with a warning in one short line, and it waits
    // saying why in one counted line.
    let accepted = client
        .post(&json!({"Name": "huge", "Image": SAMPLE_IMAGE, "Memory": "1GiB"}))
        .await;
    assert_eq!(accepted.status, 201, "{}", accepted.body);
    assert_eq!(
        accepted.body["Warnings"],
        json!([
            "no node could hold it today: needs 1.0 GiB memory, the largest node has 512.0 MiB"
        ]),
        "{}",
        accepted.body
    );
    let huge = accepted.body["ID"].as_str().unwrap().to_string();
    let task = client
        .await_task(&huge, "a reason naming 40 nodes", |task| {
            task["PendingReason"]
                .as_str()
                .is_some_and(|reason| reason.contains("40 nodes:"))
        })
        .await;
    let reason = task["PendingReason"].as_str().unwrap();
    assert!(reason.len() < 300, "one short line: {reason}");
    assert!(
        reason.starts_with(
            "no node could hold it today: needs 1.0 GiB memory, the largest node has 512.0 MiB"
        ),
        "{reason}"
    );
    client.delete(&format!("/tasks/{huge}")).await;
    // Forty that take every node's room (the nodes are not real: they end up Unreachable),
    // then one that waits, saying why in one counted line.
    for n in 0..40 {
        client
            .submit(&json!({"Name": format!("fill{n}"), "Image": SAMPLE_IMAGE, "Memory": "300MiB"}))
            .await;
    }
    let id = client
        .submit(&json!({"Name": "wide", "Image": SAMPLE_IMAGE, "Memory": "300MiB"}))
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

#[tokio::test]
async fn tasks_are_listed_in_pages_with_filters_and_a_summary_form() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("epvm", "memory", dir.path(), 0);
    let client = manager.client();
    let mut submitted = Vec::new();
    for n in 0..25 {
        let name = if n % 5 == 0 {
            "five".to_string()
        } else {
            format!("t{n}")
        };
        submitted.push(
            client
                .submit(&json!({"Name": name, "Image": SAMPLE_IMAGE}))
                .await,
        );
    }
    let http = support::http();
    let mut listed = Vec::new();
    let mut next: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut url = format!("{}/tasks?limit=10&summary=true", manager.url);
        if let Some(token) = &next {
            url.push_str(&format!("&next={token}"));
        }
        let answer = http.get(&url).send().await.unwrap();
        assert_eq!(answer.status(), 200);
        next = answer
            .headers()
            .get("X-Cube-Next-Token")
            .map(|value| value.to_str().unwrap().to_string());
        let page: serde_json::Value = answer.json().await.unwrap();
        let page = page.as_array().unwrap();
        assert!(page.len() <= 10);
        assert!(
            page.iter().all(|task| task.get("History").is_none()),
            "the summary form leaves the history out"
        );
        listed.extend(
            page.iter()
                .map(|task| task["ID"].as_str().unwrap().to_string()),
        );
        pages += 1;
        if next.is_none() {
            break;
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(listed, submitted, "every task once, oldest first");

    // A page token is a place in the list, not its task: the task the next page would start
    // with removed meanwhile, the next page starts with the one after it (tried as a new user
    // would, paging while tasks were pruned: the page's task was gone, and so was the page).
    let first = http
        .get(format!("{}/tasks?limit=11", manager.url))
        .send()
        .await
        .unwrap();
    let token = first.headers()["X-Cube-Next-Token"]
        .to_str()
        .unwrap()
        .to_string();
    let gone = &submitted[11];
    let stopped = client.delete(&format!("/tasks/{gone}")).await;
    assert!(stopped.status < 300, "{}", stopped.body);
    client.await_state(gone, "Completed").await;
    let purged = client.delete(&format!("/tasks/{gone}?purge=true")).await;
    assert_eq!(purged.status, 204, "{}", purged.body);
    let after = client.get(&format!("/tasks?limit=10&next={token}")).await;
    assert_eq!(after.status, 200, "{}", after.body);
    let ids: Vec<&str> = after
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|task| task["ID"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        submitted[12..22]
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
    );

    let named = client.get("/tasks?name=five&state=pending").await.body;
    assert_eq!(named.as_array().unwrap().len(), 5);
    let running = client.get("/tasks?state=Running").await.body;
    assert_eq!(running.as_array().unwrap().len(), 0);
    assert!(client.get("/tasks").await.body[0]["History"].is_array());

    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=abc", "limit"),
        ("state=Sleeping", "state"),
        ("next=nonsense", "next"),
        ("colour=red", "colour"),
    ] {
        let answer = client.get(&format!("/tasks?{query}")).await;
        assert_eq!(answer.status, 400, "{query}: {}", answer.body);
        assert!(
            answer.message().contains(field),
            "{query}: {}",
            answer.message()
        );
    }
}

#[tokio::test]
async fn a_task_id_sent_again_with_another_spec_is_a_conflict_naming_the_fields() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("epvm", "memory", dir.path(), 0);
    let client = manager.client();
    let task = json!({"ID": "5eb1a7e0-0000-4000-8000-000000000001", "Name": "same",
                      "Image": SAMPLE_IMAGE, "Memory": "64MiB"});
    assert_eq!(client.post(&task).await.status, 201);
    // Identical: a no-op, whatever the port or size spelling.
    let again = client.post(&task).await;
    assert_eq!(again.status, 200, "{}", again.body);
    let mut changed = task.clone();
    changed["Memory"] = json!("128MiB");
    changed["Image"] = json!("cube-sample:other");
    let refused = client.post(&changed).await;
    assert_eq!(refused.status, 409, "{}", refused.body);
    let message = refused.message();
    assert!(message.contains("Image, Memory"), "{message}");
    let stored = client
        .get("/tasks/5eb1a7e0-0000-4000-8000-000000000001")
        .await
        .body;
    assert_eq!(stored["Memory"], 64 << 20, "the stored spec is unchanged");
}

#[tokio::test]
async fn the_same_host_port_over_tcp_and_udp_is_two_ports_not_a_conflict() {
    let cluster = OneNodeCluster::start("proto").await;
    let client = cluster.manager.client();
    let port = free_port().to_string();
    let task = |name: &str, protocol: &str| {
        json!({"Name": name, "Image": SAMPLE_IMAGE, "Cmd": ["sleep", "600"],
               "PortBindings": {format!("{port}/{protocol}"): port.clone()}})
    };
    let (_, tcp) = client.run(&task("dns-tcp", "tcp")).await;
    let (_, udp) = client.run(&task("dns-udp", "udp")).await;
    assert_eq!(tcp["NodeName"], udp["NodeName"]);
    // A second claim of the same port and protocol waits, naming the port.
    let third = client.submit(&task("dns-tcp-2", "tcp")).await;
    let waiting = client
        .await_task(&third, "a reason", |task| task["PendingReason"].is_string())
        .await;
    let reason = waiting["PendingReason"].as_str().unwrap();
    assert!(reason.contains(&format!("port {port} taken")), "{reason}");
}
