//! Node labels and task constraints as a user meets them: real `cube worker` processes started
//! with `--label`, a real `cube manager` that places constrained tasks on them, and the real
//! Docker engine running what was placed.

mod support;

use serde_json::{Value, json};
use support::*;

/// A manager (memory store) and two workers that registered with it: one labelled
/// `zone=eu`, the other `zone=us` and `disk=ssd`.
struct ZonedCluster {
    manager: ManagerProcess,
    eu: WorkerProcess,
    us: WorkerProcess,
    _dir: tempfile::TempDir,
}

impl ZonedCluster {
    async fn start(prefix: &str) -> ZonedCluster {
        let dir = tempfile::tempdir().unwrap();
        let manager = ManagerProcess::start("epvm", "memory", dir.path(), 0);
        let eu = manager.join_worker(
            &unique_node(&format!("{prefix}-eu")),
            &["--label", "zone=eu"],
        );
        let us = manager.join_worker(
            &unique_node(&format!("{prefix}-us")),
            &["--label", "zone=us", "--label", "disk=ssd"],
        );
        manager.await_ready_nodes(2).await;
        ZonedCluster {
            manager,
            eu,
            us,
            _dir: dir,
        }
    }
}

/// A sleeping task with one constraint.
fn constrained(name: &str, attribute: &str, operator: &str, value: &str) -> Value {
    let mut task = shell_task(name, "sleep 600");
    task["Constraints"] = json!([{"Attribute": attribute, "Operator": operator, "Value": value}]);
    task
}

#[tokio::test]
async fn the_manager_lists_each_nodes_labels() {
    let cluster = ZonedCluster::start("list").await;
    let nodes = cluster.manager.client().get("/nodes").await.body;
    let labels_of = |name: &str| {
        nodes
            .as_array()
            .unwrap()
            .iter()
            .find(|node| node["Name"] == name)
            .map(|node| node["Labels"].clone())
            .unwrap_or_else(|| panic!("{name} not in {nodes}"))
    };
    assert_eq!(labels_of(&cluster.eu.name), json!({"zone": "eu"}));
    assert_eq!(
        labels_of(&cluster.us.name),
        json!({"disk": "ssd", "zone": "us"})
    );

    let (ok, stdout, stderr) = cube_cli(&cluster.manager.address(), &["node", "-o", "wide"]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("LABELS") && stdout.contains("disk=ssd,zone=us"),
        "{stdout}"
    );
    let (ok, stdout, stderr) = cube_cli(&cluster.manager.address(), &["node", &cluster.eu.name]);
    assert!(ok, "{stderr}");
    assert!(
        stdout
            .lines()
            .any(|line| line.starts_with("Labels:") && line.ends_with("zone=eu")),
        "{stdout}"
    );
}

#[tokio::test]
async fn a_zone_constraint_places_every_task_on_the_matching_worker() {
    let cluster = ZonedCluster::start("zone").await;
    let client = cluster.manager.client();
    let mut ids = Vec::new();
    for n in 0..3 {
        let task = constrained(&format!("in-us-{n}"), "label.zone", "=", "us");
        ids.push(client.submit(&task).await);
    }
    for id in &ids {
        let running = client.await_state(id, "Running").await;
        assert_eq!(running["NodeName"], cluster.us.name.as_str(), "{running}");
        assert_eq!(running["Constraints"][0]["Attribute"], "label.zone");
    }
    let containers = running_containers_with_label(&format!("cube.node={}", cluster.us.name));
    assert_eq!(containers.len(), 3, "Docker on {}", cluster.us.name);
    assert!(running_containers_with_label(&format!("cube.node={}", cluster.eu.name)).is_empty());
}

#[tokio::test]
async fn a_constraint_no_node_meets_is_accepted_with_a_warning_and_runs_once_a_matching_worker_joins()
 {
    let cluster = ZonedCluster::start("nowhere").await;
    let client = cluster.manager.client();
    let accepted = client
        .post(&constrained("in-ap", "label.zone", "=", "ap"))
        .await;
    assert_eq!(accepted.status, 201, "{}", accepted.body);
    assert_eq!(
        accepted.body["Warnings"],
        json!(["no node matches label.zone = ap (0 of 2)"]),
        "{}",
        accepted.body
    );
    let id = accepted.body["ID"].as_str().unwrap().to_string();
    let waiting = client
        .await_task(&id, "waiting with each node's reason", |task| {
            task["PendingReason"].as_str().is_some()
        })
        .await;
    let reason = waiting["PendingReason"].as_str().unwrap();
    for expected in [
        format!(r#"{}: label.zone is "eu", wants "ap""#, cluster.eu.name),
        format!(r#"{}: label.zone is "us", wants "ap""#, cluster.us.name),
    ] {
        assert!(reason.contains(&expected), "{expected:?} not in {reason:?}");
    }
    // A node in that zone joins: the task goes there.
    let ap = cluster
        .manager
        .join_worker(&unique_node("nowhere-ap"), &["--label", "zone=ap"]);
    let running = client.await_state(&id, "Running").await;
    assert_eq!(running["NodeName"], ap.name.as_str(), "{running}");
}

#[tokio::test]
async fn a_node_name_constraint_pins_tasks_to_one_worker() {
    let cluster = ZonedCluster::start("pin").await;
    let client = cluster.manager.client();
    for n in 0..2 {
        let task = constrained(&format!("pinned-{n}"), "node.name", "=", &cluster.eu.name);
        let (_, running) = client.run(&task).await;
        assert_eq!(running["NodeName"], cluster.eu.name.as_str(), "{running}");
    }
    let ssd = constrained("on-ssd", "label.disk", "exists", "");
    let (_, running) = client.run(&ssd).await;
    assert_eq!(running["NodeName"], cluster.us.name.as_str(), "{running}");
}

#[tokio::test]
async fn a_static_workers_own_report_carries_its_labels() {
    let dir = tempfile::tempdir().unwrap();
    let name = unique_node("static-labels");
    let worker = WorkerProcess::start_with(
        &name,
        "memory",
        dir.path(),
        &["--label", "zone=eu", "--label", "rack=r1"],
    );
    let report = worker.client().get("/node").await;
    assert_eq!(report.status, 200, "{}", report.body);
    assert_eq!(report.body["Labels"], json!({"rack": "r1", "zone": "eu"}));
}

#[test]
fn a_bad_label_stops_cube_worker_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();
    let worker = |labels: &[&str]| {
        let mut args = vec!["worker", "-p", "0", "-d", "memory", "--data-dir", data_dir];
        for label in labels {
            args.extend(["--label", label]);
        }
        cube_command(&args)
    };
    for (labels, expected) in [
        (&["zone"][..], r#""zone" is not KEY=VALUE (e.g. zone=eu)"#),
        (&["zone=eu west"][..], r#"the value "eu west" contains ' '"#),
        (&["=eu"][..], "a label needs a key"),
        (
            &["zone=eu", "zone=us"][..],
            "--label zone: given twice (first zone=eu)",
        ),
    ] {
        let (status, _, stderr) = worker(labels);
        assert!(!status.success(), "{labels:?} was accepted");
        assert!(
            stderr.contains(expected),
            "{labels:?}: {expected:?} not in {stderr}"
        );
    }
}
