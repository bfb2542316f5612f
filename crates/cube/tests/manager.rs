//! A cluster as a user meets it: a real `cube manager` and real `cube worker` processes on
//! loopback ports, the real Docker engine and the real redb file, driven over HTTP and with
//! the `cube` command line.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};
use support::*;

/// A manager (memory store) and three workers that registered with it.
struct Cluster {
    manager: ManagerProcess,
    workers: Vec<WorkerProcess>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    async fn start(scheduler: &str, prefix: &str, worker_flags: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let manager = ManagerProcess::start(scheduler, "memory", dir.path(), 0);
        let workers: Vec<WorkerProcess> = (1..=3)
            .map(|n| manager.join_worker(&unique_node(&format!("{prefix}{n}")), worker_flags))
            .collect();
        manager.await_ready_nodes(3).await;
        Cluster {
            manager,
            workers,
            _dir: dir,
        }
    }
}

/// A task whose container only sleeps: cheap to run many of.
fn sleeper(name: &str) -> Value {
    shell_task(name, "sleep 600")
}

fn with_memory(mut task: Value, memory: &str) -> Value {
    task["Memory"] = json!(memory);
    task
}

/// Submits a task and waits until it runs; returns its node. (Waiting for `Running`, not just
/// the placement, also means no container is still being created when the test ends.)
async fn place(client: &Client, task: &Value) -> String {
    let (_, placed) = client.run(task).await;
    placed["NodeName"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn round_robin_spreads_six_tasks_two_per_worker() {
    let cluster = Cluster::start("roundrobin", "rr", &[]).await;
    let client = cluster.manager.client();
    let mut ids = Vec::new();
    for n in 0..6 {
        ids.push(client.submit(&sleeper(&format!("rr-{n}"))).await);
    }
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for id in &ids {
        let task = client.await_state(id, "Running").await;
        *per_node
            .entry(task["NodeName"].as_str().unwrap().to_string())
            .or_default() += 1;
        assert!(container_running(task["ContainerID"].as_str().unwrap()));
    }
    let expected: BTreeMap<String, usize> = cluster
        .workers
        .iter()
        .map(|worker| (worker.name.clone(), 2))
        .collect();
    assert_eq!(per_node, expected);
    for worker in &cluster.workers {
        let containers = containers_with_label(&format!("cube.node={}", worker.name));
        assert_eq!(containers.len(), 2, "Docker on {}", worker.name);
    }
}

#[tokio::test]
async fn epvm_avoids_the_worker_that_holds_most_of_the_allocated_memory() {
    let cluster = Cluster::start("epvm", "ep", &["--memory", "1GiB"]).await;
    let client = cluster.manager.client();
    // A big task first, then one task without memory on each other worker, so that every
    // worker runs one task and only memory tells them apart.
    let big = place(&client, &with_memory(sleeper("big"), "600MiB")).await;
    let second = place(&client, &sleeper("small-1")).await;
    let third = place(&client, &sleeper("small-2")).await;
    let mut nodes = vec![big.clone(), second, third];
    nodes.sort();
    nodes.dedup();
    assert_eq!(nodes.len(), 3, "the job-count term spreads the first three");

    // Worked out by hand (n = 3 live nodes, every node has k = 1 job, max_jobs = 2): on the
    // big node 3^(800/1024) - 3^(600/1024) = 0.457; elsewhere 3^(200/1024) - 1 = 0.239.
    let next = place(&client, &with_memory(sleeper("next"), "200MiB")).await;
    assert_ne!(
        next, big,
        "E-PVM put a 200 MiB task next to the 600 MiB one"
    );

    let node = client.get(&format!("/nodes/{big}")).await.body;
    assert_eq!(node["Allocated"]["Memory"], 600 * 1024 * 1024);
    assert_eq!(node["TaskCount"], 1);
}

#[tokio::test]
async fn a_task_too_big_for_every_worker_is_accepted_with_a_warning_waits_and_runs_once_a_bigger_worker_joined()
 {
    let cluster = Cluster::start("epvm", "tb", &["--memory", "256MiB"]).await;
    let client = cluster.manager.client();
    // No worker could hold it today, even empty: accepted all the same, with a warning,
    // since a bigger node may join.
    let accepted = client.post(&with_memory(sleeper("too-big"), "1GiB")).await;
    assert_eq!(accepted.status, 201, "{}", accepted.body);
    assert_eq!(
        accepted.body["Warnings"],
        serde_json::json!([
            "no node could hold it today: needs 1.0 GiB memory, the largest node has 256.0 MiB"
        ]),
        "{}",
        accepted.body
    );
    let id = accepted.body["ID"].as_str().unwrap().to_string();
    let waiting = client
        .await_task(&id, "waiting with the reason", |task| {
            task["PendingReason"]
                .as_str()
                .is_some_and(|why| why.contains("no node could hold it today"))
        })
        .await;
    assert_eq!(waiting["State"], "Pending", "{waiting}");
    // The command line says so on stderr, and succeeds: the task was accepted.
    let (ok, stdout, stderr) = cube_cli(
        &cluster.manager.address(),
        &[
            "run",
            "--memory",
            "1GiB",
            "--name",
            "too-big-cli",
            SAMPLE_IMAGE,
        ],
    );
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains(
            "warning: task too-big-cli: no node could hold it today: needs 1.0 GiB memory"
        ),
        "{stderr}"
    );
    assert!(
        !stdout.contains("warning"),
        "stdout holds the ID alone: {stdout}"
    );

    let big = cluster
        .manager
        .join_worker(&unique_node("tb-big"), &["--memory", "2GiB"]);
    let running = client.await_state(&id, "Running").await;
    assert_eq!(running["NodeName"], big.name.as_str());
    assert!(running["PendingReason"].is_null(), "{running}");
}

#[tokio::test]
async fn a_task_stopped_through_the_manager_ends_and_its_container_stops_and_goes_with_cube_rm() {
    let cluster = Cluster::start("epvm", "st", &[]).await;
    let client = cluster.manager.client();
    let (id, running) = client.run(&web_task("to-stop")).await;
    let container = running["ContainerID"].as_str().unwrap().to_string();

    let answer = client.delete(&format!("/tasks/{id}")).await;
    assert_eq!(answer.status, 204, "{}", answer.body);
    client.await_state(&id, "Completed").await;
    let label = format!("cube.task-id={id}");
    assert!(
        running_containers_with_label(&label).is_empty(),
        "container {container} still runs"
    );
    let answer = client.delete(&format!("/tasks/{id}?purge=true")).await;
    assert_eq!(answer.status, 204, "{}", answer.body);
    assert!(
        containers_with_label(&label).is_empty(),
        "container {container} still exists"
    );
    assert_eq!(client.get(&format!("/tasks/{id}")).await.status, 404);

    let unknown = client
        .delete("/tasks/00000000-0000-4000-8000-000000000000")
        .await;
    assert_eq!(unknown.status, 404);
    assert!(unknown.message().contains("no task"), "{}", unknown.body);
}

#[tokio::test]
async fn a_manager_killed_and_restarted_on_its_store_still_knows_and_stops_every_task() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let manager = ManagerProcess::start("roundrobin", "persistent", dir.path(), port);
    let workers: Vec<WorkerProcess> = (1..=2)
        .map(|n| manager.join_worker(&unique_node(&format!("mk{n}")), &[]))
        .collect();
    manager.await_ready_nodes(2).await;
    let client = manager.client();
    let mut before = Vec::new();
    for n in 0..3 {
        let id = client.submit(&sleeper(&format!("survivor-{n}"))).await;
        before.push(client.await_state(&id, "Running").await);
    }
    // Acknowledged but maybe not yet placed when the manager dies: it must survive too.
    let late = client.submit(&sleeper("late")).await;
    manager.kill_9();

    let manager = ManagerProcess::start("roundrobin", "persistent", dir.path(), port);
    let client = manager.client();
    for task in &before {
        let id = task["ID"].as_str().unwrap();
        let now = client.get(&format!("/tasks/{id}")).await;
        assert_eq!(now.status, 200, "task {id} forgotten: {}", now.body);
        assert_eq!(now.body["State"], "Running");
        assert_eq!(now.body["NodeName"], task["NodeName"]);
        assert_eq!(
            now.body["ContainerID"], task["ContainerID"],
            "the task was not restarted"
        );
    }
    client.await_state(&late, "Running").await;
    assert_eq!(client.get("/tasks").await.body.as_array().unwrap().len(), 4);

    manager.await_ready_nodes(2).await;
    for task in &before {
        let id = task["ID"].as_str().unwrap();
        assert_eq!(client.delete(&format!("/tasks/{id}")).await.status, 204);
        client.await_state(id, "Completed").await;
        assert!(!container_running(task["ContainerID"].as_str().unwrap()));
    }
    drop(workers);
}

#[tokio::test]
async fn the_books_task_file_runs_with_cube_run_and_shows_in_cube_status() {
    let cluster = Cluster::start("epvm", "cli", &[]).await;
    let manager = cluster.manager.address();
    // The book's file binds host port 7777, which the demo cluster (or anything else on the
    // machine) may hold: the test runs the file as written but for that one binding, left to
    // Docker, so that it never depends on a fixed host port being free.
    let book = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/sample-task.json"
    );
    let mut document: Value = serde_json::from_str(&std::fs::read_to_string(book).unwrap())
        .expect("the book's task file is JSON");
    assert_eq!(document["Task"]["PortBindings"]["7777/tcp"], "7777");
    document["Task"]["PortBindings"]["7777/tcp"] = json!("");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sample-task.json");
    std::fs::write(&file, document.to_string()).unwrap();
    let file = file.to_str().unwrap();

    let (ok, stdout, stderr) = cube_cli(&manager, &["run", "-f", file]);
    assert!(ok, "cube run failed: {stderr}");
    assert!(
        stdout.contains("bb1d59ef-9fc1-4e4b-a44d-db571eeed203"),
        "cube run prints the task's ID: {stdout}"
    );
    let client = cluster.manager.client();
    let running = client
        .await_state("bb1d59ef-9fc1-4e4b-a44d-db571eeed203", "Running")
        .await;
    let port = host_port(&running, "7777/tcp");
    let (ok, stdout, stderr) = cube_cli(&manager, &["status"]);
    assert!(ok, "{stderr}");
    let row = stdout
        .lines()
        .find(|line| line.starts_with("bb1d59ef"))
        .unwrap_or_else(|| panic!("no row for the task in:\n{stdout}"));
    for cell in [
        "test-chapter-9.1",
        "Running",
        "cube-sample:latest",
        &format!(":{port}->7777/tcp"),
    ] {
        assert!(row.contains(cell), "{cell} missing from {row:?}");
    }
    assert_eq!(get_published(port, "/health").await, 200);

    let (ok, stdout, stderr) = cube_cli(&manager, &["stop", "bb1d"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("test-chapter-9.1"), "{stdout}");
    client
        .await_state("bb1d59ef-9fc1-4e4b-a44d-db571eeed203", "Completed")
        .await;
}

#[tokio::test]
async fn cube_run_names_a_missing_or_invalid_file_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.json");
    let (ok, _, stderr) = cube_cli("127.0.0.1:1", &["run", "-f", missing.to_str().unwrap()]);
    assert!(!ok);
    assert!(stderr.contains("nope.json"), "{stderr}");

    let invalid = dir.path().join("bad.json");
    std::fs::write(&invalid, r#"{"Image": "x", "Memmory": 5}"#).unwrap();
    let (ok, _, stderr) = cube_cli("127.0.0.1:1", &["run", "-f", invalid.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        stderr.contains("bad.json") && stderr.contains("Memmory"),
        "{stderr}"
    );

    let (ok, _, stderr) = cube_cli("127.0.0.1:1", &["status"]);
    assert!(!ok);
    assert!(stderr.contains("cannot reach the manager"), "{stderr}");
}

#[tokio::test]
async fn the_manager_answers_bad_input_with_json_errors() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("epvm", "memory", dir.path(), 0);
    let client = manager.client();
    let bad = client.post(&json!({"Image": "x", "Memory": "lots"})).await;
    assert_eq!(bad.status, 400);
    assert!(bad.message().contains("Memory"), "{}", bad.body);
    let missing = client.get("/tasks/not-a-uuid").await;
    assert_eq!(missing.status, 400);
    let node = client.get("/nodes/nobody").await;
    assert_eq!(node.status, 404);
    assert!(node.message().contains("nobody"));
    let route = client.get("/nope").await;
    assert_eq!(route.status, 404);
    assert!(route.message().contains("/nodes"));
    let wrong = client
        .http
        .put(format!("{}/nodes/a", client.base))
        .body(r#"{"Name": "b", "Address": "127.0.0.1:1", "Capacity": {}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 400);
    let stopped = manager.terminate(Duration::from_secs(10));
    assert!(stopped.success(), "SIGTERM should stop the manager cleanly");
}

#[tokio::test]
async fn cube_dev_is_a_cluster_in_one_process_that_runs_a_task_and_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let node = unique_node("dev");
    let dev = ManagerProcess::start_dev(&node, dir.path());
    let nodes = dev.await_ready_nodes(1).await;
    assert_eq!(nodes[0]["Name"], node.as_str());
    assert!(
        dir.path().join("manager.redb").exists(),
        "cube dev keeps its state on disk by default"
    );

    let client = dev.client();
    let (_, running) = client.run(&web_task("dev-web")).await;
    let port = host_port(&running, "7777/tcp");
    assert_eq!(get_published(port, "/health").await, 200);

    let (ok, stdout, stderr) = cube_cli(&dev.address(), &["node"]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains(&node) && stdout.contains("Ready"),
        "{stdout}"
    );

    let stopped = dev.terminate(Duration::from_secs(15));
    assert!(stopped.success(), "SIGTERM stops cube dev cleanly");
    remove_node_containers(&node);
}

#[tokio::test]
async fn workers_on_the_managers_list_join_without_registering() {
    ensure_sample_image();
    let dir = tempfile::tempdir().unwrap();
    let workers: Vec<WorkerProcess> = (1..=2)
        .map(|n| {
            let name = unique_node(&format!("static{n}"));
            WorkerProcess::start(&name, "memory", &dir.path().join(&name))
        })
        .collect();
    let list = workers
        .iter()
        .map(|worker| worker.url.trim_start_matches("http://").to_string())
        .collect::<Vec<_>>()
        .join(",");
    let manager = ManagerProcess::start_with(
        "roundrobin",
        "memory",
        dir.path(),
        0,
        &["-w", &list, "--poll-interval", "200ms"],
    );
    let nodes = manager.await_ready_nodes(2).await;
    for node in nodes.as_array().unwrap() {
        assert_eq!(node["Source"], "static");
        assert!(node["Capacity"]["Memory"].as_u64().unwrap() > 0, "{node}");
        assert!(node["Stats"]["MemTotalKb"].as_u64().unwrap() > 0, "{node}");
    }
    let client = manager.client();
    let mut placed = Vec::new();
    for n in 0..2 {
        let id = client.submit(&sleeper(&format!("static-{n}"))).await;
        placed.push(client.await_state(&id, "Running").await["NodeName"].clone());
    }
    placed.sort_by_key(|node| node.to_string());
    let mut names: Vec<Value> = workers.iter().map(|w| json!(w.name)).collect();
    names.sort_by_key(|node| node.to_string());
    assert_eq!(placed, names, "one task on each listed worker");
}

#[tokio::test]
async fn two_tasks_of_one_name_whose_ids_share_a_prefix_run_in_two_containers_through_a_manager() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("roundrobin", "memory", dir.path(), 0);
    let _worker = manager.join_worker(&unique_node("twins"), &[]);
    manager.await_ready_nodes(1).await;
    let client = manager.client();
    let prefix = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let ids = [
        format!("{prefix}-0000-4000-8000-00000000000a"),
        format!("{prefix}-0000-4000-8000-00000000000b"),
    ];
    let mut containers = Vec::new();
    for id in &ids {
        let task = json!({"ID": id, "Name": "web", "Image": SAMPLE_IMAGE,
                          "Cmd": ["/bin/sleep", "3600"]});
        let (_, running) = client.run(&task).await;
        containers.push(running["ContainerID"].as_str().unwrap().to_string());
    }
    assert_ne!(containers[0], containers[1], "one container for two tasks");

    assert_eq!(
        client.delete(&format!("/tasks/{}", ids[1])).await.status,
        204
    );
    client.await_state(&ids[1], "Completed").await;
    assert!(
        container_running(&containers[0]),
        "stopping the second task stopped the first's container"
    );
    assert_eq!(
        client.get(&format!("/tasks/{}", ids[0])).await.body["State"],
        "Running"
    );
}
