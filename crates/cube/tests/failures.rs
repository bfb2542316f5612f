//! Failures as a user meets them: killed containers, failing health checks, workers that die
//! or freeze, a manager that crashes. Real `cube` processes, the real Docker engine. Each wait
//! has its bound in the helper it uses (`STATE_BOUND`) or in the test.

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::*;

/// A manager (memory store, the given heartbeat grace) and `count` workers registered with it
/// (persistent store, heartbeats every 300 ms).
async fn cluster(
    prefix: &str,
    count: usize,
    grace: &str,
) -> (ManagerProcess, Vec<WorkerProcess>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start_with(
        "roundrobin",
        "memory",
        dir.path(),
        0,
        &["--heartbeat-grace", grace],
    );
    let workers = (1..=count)
        .map(|n| manager.join_worker_with(&unique_node(&format!("{prefix}{n}")), "persistent", &[]))
        .collect();
    manager.await_ready_nodes(count).await;
    (manager, workers, dir)
}

fn with(mut task: Value, fields: Value) -> Value {
    for (key, value) in fields.as_object().unwrap() {
        task[key] = value.clone();
    }
    task
}

fn sleeper(name: &str) -> Value {
    shell_task(name, "sleep 600")
}

fn history_events(task: &Value) -> Vec<String> {
    task["History"]
        .as_array()
        .map(|entries| {
            entries
                .iter()
                .map(|e| e["Event"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_killed_container_runs_again_after_the_backoff() {
    let (manager, _workers, _dir) = cluster("kill", 1, "10s").await;
    let client = manager.client();
    let task = with(
        sleeper("killed"),
        json!({"RestartPolicy": "on-failure", "RestartDelay": "500ms"}),
    );
    let (id, first) = client.run(&task).await;
    let first_container = first["ContainerID"].as_str().unwrap().to_string();

    let killed_at = Instant::now();
    let kill = std::process::Command::new("docker")
        .args(["kill", &first_container])
        .output()
        .unwrap();
    assert!(kill.status.success());
    let again = client
        .await_task(&id, "a second run", |task| {
            task["State"] == "Running" && task["RestartCount"] == 1
        })
        .await;
    let took = killed_at.elapsed();
    println!("docker kill -> Running again (500 ms backoff): {took:?}");
    assert!(
        took >= Duration::from_millis(500),
        "the backoff was not waited: {took:?}"
    );
    let container = again["ContainerID"].as_str().unwrap();
    assert_ne!(container, first_container);
    assert!(container_running(container));
    assert_eq!(
        again["NodeName"], first["NodeName"],
        "restarted where it ran"
    );
    let history = history_events(&again);
    assert!(
        history.ends_with(&[
            "Failed".into(),
            "Restart".into(),
            "Placed".into(),
            "Running".into()
        ]),
        "{history:?}"
    );
    let restart = &again["History"].as_array().unwrap()[history.len() - 3];
    assert!(
        restart["Message"].as_str().unwrap().contains("137"),
        "the restart says why: {restart}"
    );
}

#[tokio::test]
async fn a_failing_health_check_restarts_the_task_up_to_its_limit_then_it_stays_failed() {
    let (manager, _workers, _dir) = cluster("hc", 1, "10s").await;
    let client = manager.client();
    let task = with(
        web_task("healthfail"),
        json!({"HealthCheck": "/healthfail", "HealthCheckInterval": "200ms",
               "HealthCheckRetries": 2, "RestartPolicy": "on-failure", "MaxRestarts": 2,
               "RestartDelay": "0s"}),
    );
    let id = client.submit(&task).await;
    let done = client
        .await_task(&id, "the restart limit", |task| {
            history_events(task).last().map(String::as_str) == Some("RestartLimit")
        })
        .await;
    assert_eq!(done["State"], "Failed");
    assert_eq!(done["RestartCount"], 2);
    assert_eq!(done["Health"], "Unhealthy");
    let error = done["Error"].as_str().unwrap();
    assert!(error.contains("GET /healthfail answered 404"), "{error}");
    let history = history_events(&done);
    assert_eq!(
        history.iter().filter(|e| *e == "Restart").count(),
        2,
        "{history:?}"
    );
    assert!(history.iter().any(|e| e == "Health"), "{history:?}");
    assert!(
        running_containers_with_label(&format!("cube.task-id={id}")).is_empty(),
        "an unhealthy container is stopped"
    );

    let (ok, stdout, stderr) = cube_cli(&manager.address(), &["status", &id[..8]]);
    assert!(ok, "{stderr}");
    // Spaces collapsed: how wide the keys are aligned depends on which fields are shown.
    let collapsed: Vec<String> = stdout
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    let collapsed = collapsed.join("\n");
    for line in [
        "Restarts: 2 of 2",
        "Health: Unhealthy",
        "History:",
        "RestartLimit",
    ] {
        assert!(collapsed.contains(line), "{line} missing from:\n{stdout}");
    }
}

#[tokio::test]
async fn a_healthy_task_is_healthy_only_after_a_probe_succeeded() {
    let (manager, _workers, _dir) = cluster("ok", 1, "10s").await;
    let client = manager.client();
    let task = with(
        web_task("healthy"),
        json!({"HealthCheck": "/health", "HealthCheckInterval": "200ms"}),
    );
    let id = client.submit(&task).await;
    let healthy = client
        .await_task(&id, "Healthy", |task| task["Health"] == "Healthy")
        .await;
    assert_eq!(healthy["State"], "Running");
    let history = history_events(&healthy);
    let running = history.iter().position(|e| e == "Running").unwrap();
    let probe = history.iter().position(|e| e == "Health").unwrap();
    assert!(running < probe, "healthy comes after running: {history:?}");

    let tcp = with(
        web_task("tcp"),
        json!({"HealthCheckType": "tcp", "HealthCheckInterval": "200ms"}),
    );
    let tcp_id = client.submit(&tcp).await;
    client
        .await_task(&tcp_id, "Healthy over TCP", |task| {
            task["Health"] == "Healthy"
        })
        .await;
}

#[tokio::test]
async fn a_task_whose_policy_is_no_stays_failed_and_a_clean_exit_stays_completed() {
    let (manager, _workers, _dir) = cluster("no", 1, "10s").await;
    let client = manager.client();
    let failing = client
        .submit(&with(
            shell_task("fails", "exit 3"),
            json!({"RestartPolicy": "no", "RestartDelay": "0s"}),
        ))
        .await;
    let clean = client
        .submit(&with(
            shell_task("clean", "exit 0"),
            json!({"RestartPolicy": "on-failure", "RestartDelay": "0s"}),
        ))
        .await;
    let failed = client.await_state(&failing, "Failed").await;
    assert_eq!(failed["ExitCode"], 3);
    client.await_state(&clean, "Completed").await;
    // Nothing may happen next; a restart with no delay would have happened by now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for id in [&failing, &clean] {
        let task = client.get(&format!("/tasks/{id}")).await.body;
        assert_eq!(task["RestartCount"], 0, "{task}");
        assert!(
            !history_events(&task).contains(&"Restart".to_string()),
            "{task}"
        );
    }
    assert_eq!(
        client.get(&format!("/tasks/{failing}")).await.body["State"],
        "Failed"
    );
    assert_eq!(
        client.get(&format!("/tasks/{clean}")).await.body["State"],
        "Completed"
    );
}

/// The node a task runs on, and the worker process of that node.
fn worker_of<'a>(workers: &'a [WorkerProcess], task: &Value) -> &'a WorkerProcess {
    workers
        .iter()
        .find(|worker| task["NodeName"] == worker.name.as_str())
        .unwrap()
}

#[tokio::test]
async fn a_dead_worker_is_down_after_the_grace_its_tasks_move_and_nothing_runs_twice_when_it_returns()
 {
    let (manager, mut workers, _dir) = cluster("dead", 3, "2s").await;
    let client = manager.client();
    let mut ids = Vec::new();
    for n in 0..3 {
        let task = with(
            sleeper(&format!("mover-{n}")),
            json!({"RestartPolicy": "always", "RestartDelay": "0s"}),
        );
        ids.push(client.submit(&task).await);
    }
    let mut victim_task = Value::Null;
    for id in &ids {
        let task = client.await_state(id, "Running").await;
        if task["NodeName"] == workers[0].name.as_str() {
            victim_task = task;
        }
    }
    assert!(
        !victim_task.is_null(),
        "round-robin put a task on every worker"
    );
    let victim_id = victim_task["ID"].as_str().unwrap().to_string();

    // The machine dies: the worker and its containers.
    let victim = workers.remove(0);
    let (name, data_dir) = (victim.name.clone(), victim.data_dir.clone());
    victim.kill_9();
    remove_node_containers(&name);
    let died = Instant::now();

    manager
        .await_nodes("the dead node Down", |nodes| {
            nodes
                .as_array()
                .unwrap()
                .iter()
                .any(|n| n["Name"] == name.as_str() && n["Status"] == "Down")
        })
        .await;
    let moved = client
        .await_task(&victim_id, "a run elsewhere", |task| {
            task["State"] == "Running" && task["NodeName"] != name.as_str()
        })
        .await;
    println!(
        "worker killed -> its task Running elsewhere: {:?}",
        died.elapsed()
    );
    assert_eq!(moved["RestartCount"], 1);
    assert!(
        history_events(&moved).contains(&"Lost".to_string()),
        "{moved}"
    );
    assert!(container_running(moved["ContainerID"].as_str().unwrap()));
    assert!(workers.iter().any(|w| moved["NodeName"] == w.name.as_str()));

    // The machine comes back, same name, same store.
    let manager_address = manager.address();
    let back = WorkerProcess::start_with(
        &name,
        "persistent",
        &data_dir,
        &[
            "--manager",
            &manager_address,
            "--heartbeat-interval",
            "300ms",
        ],
    );
    manager.await_ready_nodes(3).await;
    for id in &ids {
        let task = client.await_state(id, "Running").await;
        let running = running_containers_with_label(&format!("cube.task-id={id}"));
        assert_eq!(
            running.len(),
            1,
            "task {id} runs {} times: {task}",
            running.len()
        );
    }
    drop(back);
}

#[tokio::test]
async fn a_worker_back_on_its_address_after_it_was_down_is_ready_and_takes_new_work() {
    // The worker restarts on the port it had, after the grace: the manager's follower found
    // its address refusing connections meanwhile. The node stayed `Unreachable` for good
    // before, as the follower started afresh on its return never cleared that.
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start_with(
        "roundrobin",
        "memory",
        dir.path(),
        0,
        &["--heartbeat-grace", "2s"],
    );
    ensure_sample_image();
    let name = unique_node("back");
    let data_dir = dir.path().join(&name);
    let port = free_port();
    let manager_address = manager.address();
    let flags = [
        "--manager",
        manager_address.as_str(),
        "--heartbeat-interval",
        "300ms",
    ];
    let worker = WorkerProcess::start_on(&name, "persistent", &data_dir, port, &flags);
    manager.await_ready_nodes(1).await;

    worker.kill_9();
    let down = manager
        .await_nodes("the killed node Down", |nodes| nodes[0]["Status"] == "Down")
        .await;
    let reason = down[0]["StatusReason"].as_str().unwrap_or_default();
    assert!(reason.contains("cannot reach"), "{down}");

    let _back = WorkerProcess::start_on(&name, "persistent", &data_dir, port, &flags);
    let ready = manager.await_ready_nodes(1).await;
    assert!(ready[0]["StatusReason"].is_null(), "{ready}");
    let (id, running) = manager.client().run(&sleeper("back-new")).await;
    assert_eq!(running["NodeName"], name.as_str(), "{running}");
    assert_eq!(
        running_containers_with_label(&format!("cube.task-id={id}")).len(),
        1
    );
}

#[tokio::test]
async fn another_clusters_worker_at_a_dead_nodes_address_is_told_apart_and_its_task_left_running() {
    // A node dies; another worker, of another cluster, is started on the port it had (a
    // port, or a machine's address, given again). The first manager goes on following the
    // dead node's address: it used to take the other worker's tasks for that node's and
    // stop them as strays it never placed (seen as a test's container stopped by a manager
    // left running by an earlier test, whose dead worker's port the test's worker had).
    let dir = tempfile::tempdir().unwrap();
    let first = ManagerProcess::start_with(
        "roundrobin",
        "memory",
        &dir.path().join("first"),
        0,
        &["--heartbeat-grace", "2s"],
    );
    let second = ManagerProcess::start("roundrobin", "memory", &dir.path().join("second"), 0);
    ensure_sample_image();
    let port = free_port();
    let flags = |manager: &ManagerProcess| {
        vec![
            "--manager".to_string(),
            manager.address(),
            "--heartbeat-interval".to_string(),
            "300ms".to_string(),
        ]
    };
    let dead_name = unique_node("gone");
    let first_flags = flags(&first);
    let first_flags: Vec<&str> = first_flags.iter().map(String::as_str).collect();
    let dead = WorkerProcess::start_on(
        &dead_name,
        "memory",
        &dir.path().join(&dead_name),
        port,
        &first_flags,
    );
    first.await_ready_nodes(1).await;
    dead.kill_9();

    let other_name = unique_node("other");
    let second_flags = flags(&second);
    let second_flags: Vec<&str> = second_flags.iter().map(String::as_str).collect();
    let other = WorkerProcess::start_on(
        &other_name,
        "memory",
        &dir.path().join(&other_name),
        port,
        &second_flags,
    );
    second.await_ready_nodes(1).await;
    let (id, running) = second.client().run(&sleeper("not-a-stray")).await;
    assert_eq!(running["NodeName"], other_name.as_str(), "{running}");

    // The first manager asked at the address again, and was told who answers there.
    let told = first
        .await_nodes(
            "the dead node's address answered by another node",
            |nodes| {
                nodes[0]["StatusReason"]
                    .as_str()
                    .is_some_and(|reason| reason.contains(&format!("is node {other_name:?}")))
            },
        )
        .await;
    assert_eq!(told[0]["Name"], dead_name.as_str(), "{told}");
    // And did nothing to that worker's task: a follower's pause between attempts later, still
    // running in its one container.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let task = second.client().get(&format!("/tasks/{id}")).await.body;
    assert_eq!(task["State"], "Running", "{task}");
    assert_eq!(task["DesiredState"], "Running", "{task}");
    assert_eq!(
        running_containers_with_label(&format!("cube.task-id={id}")).len(),
        1,
        "{}",
        other.stderr()
    );
    assert!(
        !other.stderr().contains("task stopped"),
        "{}",
        other.stderr()
    );
}

#[tokio::test]
async fn a_frozen_worker_comes_back_and_the_run_that_was_replaced_is_stopped_there() {
    let (manager, workers, _dir) = cluster("frozen", 2, "2s").await;
    let client = manager.client();
    let task = with(
        sleeper("frozen"),
        json!({"RestartPolicy": "always", "RestartDelay": "0s"}),
    );
    let (id, first) = client.run(&task).await;
    let frozen = worker_of(&workers, &first);

    // A partition, as the manager sees it: the worker stops answering, its container runs on.
    frozen.signal("-STOP");
    let moved = client
        .await_task(&id, "a run elsewhere", |task| {
            task["State"] == "Running" && task["NodeName"] != frozen.name.as_str()
        })
        .await;
    let label = format!("cube.task-id={id}");
    assert_eq!(
        running_containers_with_label(&label).len(),
        2,
        "both runs go on meanwhile"
    );

    frozen.signal("-CONT");
    let started = Instant::now();
    let bound = STATE_BOUND;
    while running_containers_with_label(&label).len() != 1 {
        assert!(
            started.elapsed() < bound,
            "the replaced run still runs after {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "worker back -> replaced run stopped: {:?}",
        started.elapsed()
    );
    let now = client.get(&format!("/tasks/{id}")).await.body;
    assert_eq!(now["State"], "Running");
    assert_eq!(now["NodeName"], moved["NodeName"]);
    assert_eq!(
        now["ContainerID"], moved["ContainerID"],
        "the new run is left alone"
    );
}

#[tokio::test]
async fn a_lone_worker_that_comes_back_runs_the_lost_task_anew_and_it_does_not_stay_scheduled() {
    // The only node freezes: its task is Lost and restarted, but can go nowhere else. When the
    // node answers again the new run is placed there, while the worker still has the old run
    // going. The worker's answer to the dispatch is that old run; it must not be taken for the
    // new one (the task stayed Scheduled for good before).
    let (manager, workers, _dir) = cluster("lone", 1, "2s").await;
    let client = manager.client();
    let task = with(
        sleeper("lone"),
        json!({"RestartPolicy": "always", "RestartDelay": "0s"}),
    );
    let (id, _) = client.run(&task).await;
    let worker = &workers[0];
    worker.signal("-STOP");
    client
        .await_task(&id, "Lost, then waiting for a node", |task| {
            task["RestartCount"] == 1 && task["State"] == "Pending"
        })
        .await;
    worker.signal("-CONT");
    let back = client
        .await_task(&id, "the new run Running", |task| {
            task["State"] == "Running" && task["RestartCount"] == 1
        })
        .await;
    assert_eq!(back["NodeName"], worker.name.as_str());
    let label = format!("cube.task-id={id}");
    let started = Instant::now();
    let bound = STATE_BOUND;
    while running_containers_with_label(&label).len() != 1 {
        assert!(
            started.elapsed() < bound,
            "two runs still go on after {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let now = client.get(&format!("/tasks/{id}")).await.body;
    assert_eq!(
        (now["State"].as_str(), now["ContainerID"].as_str()),
        (Some("Running"), back["ContainerID"].as_str()),
        "the new run stays"
    );
}

#[tokio::test]
async fn a_stop_asked_while_the_worker_was_unreachable_is_delivered_when_it_returns() {
    let (manager, workers, _dir) = cluster("late", 1, "30s").await;
    let client = manager.client();
    let (id, running) = client.run(&sleeper("late-stop")).await;
    workers[0].signal("-STOP");
    assert_eq!(client.delete(&format!("/tasks/{id}")).await.status, 204);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(container_running(running["ContainerID"].as_str().unwrap()));
    workers[0].signal("-CONT");
    client.await_state(&id, "Completed").await;
    assert!(running_containers_with_label(&format!("cube.task-id={id}")).is_empty());
}

#[tokio::test]
async fn a_manager_killed_and_restarted_restarts_no_healthy_task() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let manager = ManagerProcess::start_with(
        "epvm",
        "persistent",
        dir.path(),
        port,
        &["--heartbeat-grace", "2s"],
    );
    let _workers: Vec<WorkerProcess> = (1..=2)
        .map(|n| manager.join_worker(&unique_node(&format!("mgr{n}")), &[]))
        .collect();
    manager.await_ready_nodes(2).await;
    let client = manager.client();
    let mut before = Vec::new();
    for n in 0..3 {
        let task = with(
            web_task(&format!("steady-{n}")),
            json!({"HealthCheck": "/health", "HealthCheckInterval": "200ms", "RestartPolicy": "always"}),
        );
        let id = client.submit(&task).await;
        before.push(
            client
                .await_task(&id, "Healthy", |t| t["Health"] == "Healthy")
                .await,
        );
    }
    manager.kill_9();
    let manager = ManagerProcess::start_with(
        "epvm",
        "persistent",
        dir.path(),
        port,
        &["--heartbeat-grace", "2s"],
    );
    manager.await_ready_nodes(2).await;
    // Longer than the grace period: a manager that wrongly took its nodes for lost would have
    // restarted their tasks by now.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let client = manager.client();
    for task in &before {
        let id = task["ID"].as_str().unwrap();
        let now = client.get(&format!("/tasks/{id}")).await.body;
        assert_eq!(now["State"], "Running", "{now}");
        assert_eq!(now["RestartCount"], 0, "{now}");
        assert_eq!(now["ContainerID"], task["ContainerID"], "{now}");
        assert_eq!(now["Health"], "Healthy", "{now}");
    }
}

#[tokio::test]
async fn a_task_stopped_before_it_was_placed_ends_with_its_finish_time_history_and_event() {
    // No worker: the task waits, never placed.
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("roundrobin", "memory", dir.path(), 0);
    let client = manager.client();
    let mut events = EventReader::open(&manager, "?topic=Task").await;
    let id = client.submit(&sleeper("unplaced")).await;
    client
        .await_task(&id, "a reason to wait", |task| {
            task["PendingReason"].is_string()
        })
        .await;
    assert_eq!(client.delete(&format!("/tasks/{id}")).await.status, 204);
    let ended = client.await_state(&id, "Completed").await;
    assert!(ended["FinishTime"].is_string(), "{ended}");
    assert!(ended["PendingReason"].is_null(), "{ended}");
    let history = ended["History"].as_array().unwrap();
    let last = history.last().unwrap();
    assert_eq!(last["Event"], "Completed", "{ended}");
    assert_eq!(last["Message"], "stopped before it was placed", "{ended}");
    // The stream says how it ended, as it does for a task a worker stopped.
    let kinds: Vec<String> = events
        .task_events_until(&id, "Completed")
        .await
        .iter()
        .map(|event| event["Type"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("Completed"),
        "{kinds:?}"
    );
    assert!(kinds.contains(&"StopRequested".to_string()), "{kinds:?}");
}

#[tokio::test]
async fn a_stop_during_the_restart_backoff_ends_the_task_for_good() {
    let (manager, workers, _dir) = cluster("backoff", 1, "10s").await;
    let client = manager.client();
    let task = with(
        shell_task("backoff-stop", "exit 1"),
        json!({"RestartPolicy": "on-failure", "RestartDelay": "3s"}),
    );
    let id = client.submit(&task).await;
    let waiting = client
        .await_task(&id, "Failed, waiting to restart", |task| {
            task["State"] == "Failed" && task["NextRestart"].is_string()
        })
        .await;
    // The API says when the restart comes, so a task in its backoff does not look like one
    // that ended for good.
    let next: chrono::DateTime<chrono::Utc> =
        waiting["NextRestart"].as_str().unwrap().parse().unwrap();
    let finished: chrono::DateTime<chrono::Utc> =
        waiting["FinishTime"].as_str().unwrap().parse().unwrap();
    let backoff = (next - finished).num_milliseconds();
    assert!(
        (2900..=3100).contains(&backoff),
        "NextRestart is the end of the run plus the 3 s backoff: {backoff} ms"
    );
    assert_eq!(client.delete(&format!("/tasks/{id}")).await.status, 204);

    // The backoff ends 3 s after the failure; a restart would show within 2 s more.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = client.get(&format!("/tasks/{id}")).await.body;
    assert_eq!(after["RestartCount"], 0, "restarted after a stop: {after}");
    assert_eq!(after["State"], "Failed");
    assert_eq!(after["DesiredState"], "Completed");
    assert!(after["NextRestart"].is_null(), "{after}");
    assert!(
        history_events(&after).contains(&"StopRequested".to_string()),
        "{after}"
    );
    let node_label = format!("cube.node={}", workers[0].name);
    assert!(
        running_containers_with_label(&node_label).is_empty(),
        "nothing runs for the stopped task"
    );
}

#[tokio::test]
async fn a_node_the_manager_cannot_reach_is_not_ready_and_a_stop_that_keeps_failing_says_why() {
    let (manager, mut workers, _dir) = cluster("unreach", 1, "30s").await;
    let client = manager.client();
    let worker = workers.remove(0);
    let (id, _) = client.run(&sleeper("unreach")).await;
    // The worker dies, and something keeps reporting for it (as a worker whose advertised
    // address is wrong does): the node is fresh, but nothing can be sent to it.
    let report = worker.client().get("/node").await.body;
    let name = worker.name.clone();
    worker.kill_9();
    let heartbeats = {
        let http = support::http();
        let url = format!("{}/nodes/{name}", manager.url);
        let report = report.clone();
        tokio::spawn(async move {
            for _ in 0..300 {
                let _ = http.put(&url).json(&report).send().await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let nodes = manager
        .await_nodes("the node Unreachable", |nodes| {
            nodes[0]["Status"] == "Unreachable"
        })
        .await;
    let reason = nodes[0]["StatusReason"].as_str().unwrap_or_default();
    assert!(reason.contains("cannot reach"), "{reason}");

    // A stop it cannot deliver is shown with the error and the next attempt.
    assert_eq!(client.delete(&format!("/tasks/{id}")).await.status, 204);
    let stopping = client
        .await_task(&id, "the failing stop shown", |task| {
            task["DispatchError"].is_string() && task["NextAttempt"].is_string()
        })
        .await;
    assert_eq!(stopping["DesiredState"], "Completed");

    // Nothing new is placed on it.
    let waiting = client.submit(&sleeper("unreach-new")).await;
    let pending = client
        .await_task(&waiting, "a reason to wait", |task| {
            task["PendingReason"].is_string()
        })
        .await;
    assert_eq!(pending["State"], "Pending");
    assert!(
        pending["PendingReason"]
            .as_str()
            .unwrap()
            .contains("not Ready"),
        "{pending}"
    );
    heartbeats.abort();
    remove_node_containers(&name);
}
