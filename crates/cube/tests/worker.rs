//! The worker as a user meets it: a real `cube worker` process, the real Docker engine, the
//! real redb file, and HTTP on loopback.

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::*;

/// The book's chapter 9 TaskEvent with its image replaced by the local sample image and its
/// host port left to Docker (a fixed 7777 would collide with tests running side by side).
fn book_event(task_id: &str) -> serde_json::Value {
    json!({"ID": uuid::Uuid::new_v4().to_string(), "State": 2,
           "Task": {"State": 1, "ID": task_id, "Name": "test-chapter-9.1",
                    "Image": SAMPLE_IMAGE, "ExposedPorts": {"7777/tcp": {}},
                    "PortBindings": {"7777/tcp": ""}, "HealthCheck": "/health"}})
}

#[tokio::test]
async fn started_task_runs_and_its_host_port_answers() {
    let worker = WorkerProcess::fresh("start");
    let client = worker.client();
    let task_id = uuid::Uuid::new_v4().to_string();

    let submitted_at = Instant::now();
    let answer = client.post(&book_event(&task_id)).await;
    assert_eq!(answer.status, 201, "{}", answer.body);
    assert_eq!(answer.body["ID"], task_id.as_str());
    assert_eq!(answer.body["State"], "Scheduled");
    assert_eq!(answer.body["NodeName"], worker.name.as_str());

    let task = client.await_state(&task_id, "Running").await;
    println!("POST /tasks -> Running: {:?}", submitted_at.elapsed());
    let container = task["ContainerID"].as_str().unwrap();
    assert!(
        container_running(container),
        "Docker does not show {container} running"
    );
    assert!(task["StartTime"].is_string());

    let port = host_port(&task, "7777/tcp");
    assert_eq!(get_published(port, "/health").await, 200);
    // A missing file is a 404 (asked of the container itself: see `get_in_container`).
    assert_eq!(get_in_container(container, 7777, "/healthfail").await, 404);

    let listed = client.get("/tasks").await.body;
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["State"], "Running");
}

#[tokio::test]
async fn stopped_task_is_completed_and_its_container_is_stopped_and_kept_until_purged() {
    let worker = WorkerProcess::fresh("stop");
    let client = worker.client();
    let id = client.submit(&web_task("to-stop")).await;
    client.await_state(&id, "Running").await;

    let answer = client.delete(&format!("/tasks/{id}")).await;
    assert_eq!(answer.status, 204);
    let task = client.await_state(&id, "Completed").await;
    assert!(task["FinishTime"].is_string());
    assert_eq!(
        task["HostPorts"],
        json!({}),
        "a stopped container binds no ports"
    );
    let label = format!("cube.task-id={id}");
    assert!(
        running_containers_with_label(&label).is_empty(),
        "it runs no more"
    );
    assert_eq!(
        containers_with_label(&label).len(),
        1,
        "the stopped container is kept, with its logs"
    );
    let logs = client.get(&format!("/tasks/{id}/logs")).await;
    assert_eq!(logs.status, 200, "{}", logs.body);

    // Stopping again is harmless; running a completed task again is refused.
    assert_eq!(client.delete(&format!("/tasks/{id}")).await.status, 204);
    let again = client
        .post(&json!({"State": "Running", "Task": {"ID": id, "Image": SAMPLE_IMAGE}}))
        .await;
    assert_eq!(again.status, 409, "{}", again.body);
    assert!(
        again
            .message()
            .contains("cannot move from Completed to Running"),
        "{}",
        again.message()
    );
}

#[tokio::test]
async fn container_exit_codes_decide_completed_or_failed() {
    let worker = WorkerProcess::fresh("exit");
    let client = worker.client();
    let failing = client
        .submit(&shell_task("exits-3", "sleep 0.3; exit 3"))
        .await;
    let succeeding = client
        .submit(&shell_task("exits-0", "sleep 0.3; exit 0"))
        .await;

    let failed = client.await_state(&failing, "Failed").await;
    assert_eq!(failed["ExitCode"], 3);
    assert!(failed["FinishTime"].is_string());
    assert_eq!(failed["Error"], "exited with code 3");

    let completed = client.await_state(&succeeding, "Completed").await;
    assert_eq!(completed["ExitCode"], 0);
    assert!(completed["Error"].is_null());
}

#[tokio::test]
async fn a_container_killed_outside_cube_is_seen_as_a_failed_task() {
    // The worker learns of the exit from Docker's event stream; how soon is a measurement, not
    // asserted here (`await_state` waits up to `STATE_BOUND`).
    let worker = WorkerProcess::fresh("event");
    let client = worker.client();
    let (id, task) = client.run(&web_task("to-kill")).await;

    let killed = std::process::Command::new("docker")
        .args(["kill", task["ContainerID"].as_str().unwrap()])
        .output()
        .unwrap();
    assert!(killed.status.success());
    let failed = client.await_state(&id, "Failed").await;
    assert_eq!(failed["ExitCode"], 137);
}

#[tokio::test]
async fn an_image_that_cannot_be_had_fails_the_task_with_dockers_message() {
    let dir = tempfile::tempdir().unwrap();
    let worker = WorkerProcess::start(&unique_node("pull"), "memory", dir.path());
    let client = worker.client();
    // A registry on a closed loopback port: the pull fails at once, and no traffic leaves the machine.
    let id = client
        .submit(&json!({"Name": "nowhere", "Image": "127.0.0.1:9/cube/missing:1"}))
        .await;
    let task = client.await_state(&id, "Failed").await;
    let error = task["Error"].as_str().unwrap();
    assert!(
        error.starts_with("cannot get image \"127.0.0.1:9/cube/missing:1\""),
        "{error}"
    );
}

#[tokio::test]
async fn a_worker_killed_with_sigkill_comes_back_with_the_same_tasks_and_no_duplicates() {
    ensure_sample_image();
    let dir = tempfile::tempdir().unwrap();
    let name = unique_node("crash");
    let worker = WorkerProcess::start(&name, "persistent", dir.path());
    let client = worker.client();
    let kept = client.submit(&web_task("kept")).await;
    let vanished = client.submit(&web_task("vanished")).await;
    let kept_before = client.await_state(&kept, "Running").await;
    let vanished_before = client.await_state(&vanished, "Running").await;
    worker.kill_9();

    // While the worker is down, one container disappears.
    let vanished_container = vanished_before["ContainerID"].as_str().unwrap();
    let removed = std::process::Command::new("docker")
        .args(["rm", "-f", vanished_container])
        .output()
        .unwrap();
    assert!(removed.status.success());

    let worker = WorkerProcess::start(&name, "persistent", dir.path());
    let client = worker.client();
    let mut ids: Vec<String> = client
        .get("/tasks")
        .await
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["ID"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    let mut expected = vec![kept.clone(), vanished.clone()];
    expected.sort();
    assert_eq!(ids, expected, "the restarted worker lists the same tasks");

    let kept_after = client.await_state(&kept, "Running").await;
    assert_eq!(
        kept_after["ContainerID"], kept_before["ContainerID"],
        "the running container was re-adopted"
    );
    assert_eq!(
        containers_with_label(&format!("cube.task-id={kept}")).len(),
        1,
        "no second container"
    );

    let vanished_after = client.await_state(&vanished, "Failed").await;
    assert!(
        vanished_after["Error"]
            .as_str()
            .unwrap()
            .contains("disappeared"),
        "{}",
        vanished_after["Error"]
    );
    assert_eq!(
        client.get("/stats").await.body["TaskCount"],
        1,
        "the restarted worker counts the one task still running"
    );
}

#[tokio::test]
async fn a_repeated_submission_changes_nothing() {
    let worker = WorkerProcess::fresh("repeat");
    let client = worker.client();
    let id = uuid::Uuid::new_v4().to_string();
    let mut task = web_task("twice");
    task["ID"] = json!(id);
    assert_eq!(client.post(&task).await.status, 201);
    let again = client.post(&task).await;
    assert_eq!(again.status, 200, "{}", again.body);
    client.await_state(&id, "Running").await;
    assert_eq!(
        containers_with_label(&format!("cube.task-id={id}")).len(),
        1
    );
}

#[tokio::test]
async fn bad_input_is_answered_with_a_4xx_that_names_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let worker = WorkerProcess::start(&unique_node("bad"), "memory", dir.path());
    let client = worker.client();

    let cases: Vec<(&str, String, u16, &str)> = vec![
        (
            "malformed JSON",
            "{\"Image\": ".to_string(),
            400,
            "invalid JSON",
        ),
        ("not an object", "[1, 2]".to_string(), 400, "found an array"),
        (
            "unknown field",
            r#"{"State": 2, "Task": {"Image": "x", "Imagee": "y"}}"#.to_string(),
            400,
            "unknown field `Imagee`",
        ),
        (
            "missing image",
            r#"{"State": 2, "Task": {"Name": "x"}}"#.to_string(),
            400,
            "Image: missing image name",
        ),
        (
            "malformed task ID",
            r#"{"State": 2, "Task": {"ID": "abc", "Image": "x"}}"#.to_string(),
            400,
            "Task.ID",
        ),
        (
            "unknown state",
            r#"{"State": 9, "Task": {"Image": "x"}}"#.to_string(),
            400,
            "unknown state 9",
        ),
        (
            "bad port",
            r#"{"Image": "x", "ExposedPorts": {"http": {}}}"#.to_string(),
            400,
            "ExposedPorts",
        ),
        (
            "tiny memory",
            r#"{"Image": "x", "Memory": 1024}"#.to_string(),
            400,
            "Memory: 1024 bytes",
        ),
        (
            "state that cannot be asked for",
            r#"{"State": "Failed", "Task": {"Image": "x"}}"#.to_string(),
            400,
            "cannot be asked for",
        ),
        (
            "oversized body",
            format!(
                r#"{{"Image": "x", "Name": "{}"}}"#,
                "a".repeat(2 * 1024 * 1024)
            ),
            413,
            "larger than the limit",
        ),
    ];
    for (case, body, status, message) in cases {
        let answer = client.post_raw("/tasks", body).await;
        assert_eq!(answer.status, status, "{case}: {}", answer.body);
        assert_eq!(answer.body["HTTPStatusCode"], status, "{case}");
        assert!(
            answer.message().contains(message),
            "{case}: {:?} lacks {message:?}",
            answer.message()
        );
    }

    let unknown = uuid::Uuid::new_v4();
    let answer = client.delete(&format!("/tasks/{unknown}")).await;
    assert_eq!(answer.status, 404);
    assert!(answer.message().contains(&unknown.to_string()));
    assert_eq!(client.get(&format!("/tasks/{unknown}")).await.status, 404);

    let answer = client.delete("/tasks/not-a-uuid").await;
    assert_eq!(answer.status, 400);
    assert!(
        answer
            .message()
            .contains("malformed task ID \"not-a-uuid\""),
        "{}",
        answer.message()
    );

    let answer = client.get("/nothing-here").await;
    assert_eq!(
        (answer.status, answer.body["HTTPStatusCode"].as_u64()),
        (404, Some(404))
    );

    // Nothing bad was stored, and the worker still answers.
    assert_eq!(client.get("/tasks").await.body, json!([]));
}

#[tokio::test]
async fn stats_report_memory_disk_cpu_load_and_running_tasks() {
    let worker = WorkerProcess::fresh("stats");
    let client = worker.client();
    let id = client.submit(&web_task("counted")).await;
    client.await_state(&id, "Running").await;

    let stats = client.get("/stats").await.body;
    let number = |field: &str| {
        stats[field]
            .as_f64()
            .unwrap_or_else(|| panic!("{field} missing: {stats}"))
    };
    assert!(number("MemTotalKb") > 0.0 && number("MemAvailableKb") <= number("MemTotalKb"));
    assert_eq!(
        number("MemUsedKb"),
        number("MemTotalKb") - number("MemAvailableKb")
    );
    assert!((0.0..=100.0).contains(&number("MemUsedPercent")));
    assert!(number("DiskTotal") > 0.0 && number("DiskFree") <= number("DiskTotal"));
    assert!((0.0..=1.0).contains(&number("CpuUsage")));
    assert!(stats["LoadAvg"]["Last1Min"].as_f64().unwrap() >= 0.0);
    assert_eq!(stats["TaskCount"], 1);
}

#[tokio::test]
async fn sigterm_stops_the_worker_cleanly_and_leaves_containers_running() {
    ensure_sample_image();
    let dir = tempfile::tempdir().unwrap();
    let name = unique_node("term");
    let worker = WorkerProcess::start(&name, "persistent", dir.path());
    let client = worker.client();
    let (_, task) = client.run(&web_task("survivor")).await;

    let status = worker.terminate(Duration::from_secs(5));
    assert!(status.success(), "exit status {status:?}");
    assert!(container_running(task["ContainerID"].as_str().unwrap()));
    remove_node_containers(&name);
}

#[tokio::test]
async fn cpu_memory_env_and_command_reach_the_container() {
    let worker = WorkerProcess::fresh("limits");
    let client = worker.client();
    let mut task = shell_task("limited", r#"test "$GREETING" = hello && sleep 30"#);
    task["Cpu"] = json!(0.5);
    task["Memory"] = json!(64 * 1024 * 1024);
    task["Env"] = json!(["GREETING=hello"]);
    let (id, running) = client.run(&task).await;

    let output = std::process::Command::new("docker")
        .args([
            "inspect",
            "-f",
            "{{.HostConfig.NanoCpus}} {{.HostConfig.Memory}} [{{.HostConfig.RestartPolicy.Name}}]",
        ])
        .arg(running["ContainerID"].as_str().unwrap())
        .output()
        .unwrap();
    let limits = String::from_utf8_lossy(&output.stdout).trim().to_string();
    assert_eq!(
        limits, "500000000 67108864 []",
        "NanoCpus, Memory, and Docker's restart policy left unset"
    );

    // The script exits at once, non-zero, if the environment did not arrive; it must still run.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        client.get(&format!("/tasks/{id}")).await.body["State"],
        "Running"
    );
}

#[tokio::test]
async fn a_task_event_asking_for_completed_stops_the_task() {
    let worker = WorkerProcess::fresh("event-stop");
    let client = worker.client();
    let id = client.submit(&web_task("stopped-by-event")).await;
    client.await_state(&id, "Running").await;

    let stop =
        json!({"State": 3, "Task": {"ID": id, "Name": "stopped-by-event", "Image": SAMPLE_IMAGE}});
    let answer = client.post(&stop).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.body["DesiredState"], "Completed");
    client.await_state(&id, "Completed").await;
    assert!(running_containers_with_label(&format!("cube.task-id={id}")).is_empty());
    // Purged, the task and its container go.
    let answer = client.delete(&format!("/tasks/{id}?purge=true")).await;
    assert_eq!(answer.status, 204, "{}", answer.body);
    assert!(containers_with_label(&format!("cube.task-id={id}")).is_empty());
    assert_eq!(client.get(&format!("/tasks/{id}")).await.status, 404);
}

#[tokio::test]
async fn a_restarted_worker_removes_containers_no_task_owns() {
    ensure_sample_image();
    let dir = tempfile::tempdir().unwrap();
    let name = unique_node("orphan");
    let worker = WorkerProcess::start(&name, "memory", dir.path());
    let id = worker.client().submit(&web_task("forgotten")).await;
    worker.client().await_state(&id, "Running").await;
    worker.kill_9();
    assert_eq!(
        containers_with_label(&format!("cube.task-id={id}")).len(),
        1
    );

    // The memory store forgot the task: its container is an orphan, removed at start-up.
    let _worker = WorkerProcess::start(&name, "memory", dir.path());
    let deadline = Instant::now() + STATE_BOUND;
    while !containers_with_label(&format!("cube.task-id={id}")).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the orphaned container is still there after {STATE_BOUND:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How a manager follows a worker: `GET /tasks?index=N&changes=true` answers with the tasks
/// that changed after N (saying so in `X-Cube-Since`), and with every task for index 0 or an
/// index the worker never reached.
#[tokio::test]
async fn a_follower_is_sent_only_what_changed_since_its_index() {
    let worker = WorkerProcess::fresh("changes");
    let client = worker.client();
    let (kept, _) = client.run(&web_task("kept")).await;
    let (stopped, _) = client.run(&web_task("stopped")).await;
    let query = |index: u64| {
        let http = client.http.clone();
        let url = format!("{}/tasks?index={index}&wait=5s&changes=true", client.base);
        async move {
            let response = http.get(url).send().await.unwrap();
            assert_eq!(response.status(), 200);
            let header = |name: &str| {
                response
                    .headers()
                    .get(name)
                    .map(|value| value.to_str().unwrap().parse::<u64>().unwrap())
            };
            let (index, since) = (header("X-Cube-Index").unwrap(), header("X-Cube-Since"));
            let tasks: Vec<serde_json::Value> = response.json().await.unwrap();
            let ids: Vec<String> = tasks
                .iter()
                .map(|task| task["ID"].as_str().unwrap().to_string())
                .collect();
            (ids, index, since)
        }
    };

    let (all, index, since) = query(0).await;
    assert_eq!(since, None, "index 0 gets every task");
    assert_eq!(all.len(), 2);

    assert_eq!(
        client.delete(&format!("/tasks/{stopped}")).await.status,
        204
    );
    let (changed, next, since) = query(index).await;
    assert_eq!(since, Some(index));
    assert!(next > index);
    assert!(changed.contains(&stopped), "{changed:?}");
    assert!(
        !changed.contains(&kept),
        "an unchanged task is not sent: {changed:?}"
    );

    let (all, _, since) = query(next + 1000).await;
    assert_eq!(
        since, None,
        "an index the worker never reached gets every task"
    );
    assert_eq!(all.len(), 2);
}

/// Two task IDs that share their first 8 hex digits (what a short ID shows), fresh per test.
fn twin_ids() -> (String, String) {
    let prefix = &uuid::Uuid::new_v4().simple().to_string()[..8];
    (
        format!("{prefix}-0000-4000-8000-00000000000a"),
        format!("{prefix}-0000-4000-8000-00000000000b"),
    )
}

#[tokio::test]
async fn two_tasks_of_one_name_whose_ids_share_a_prefix_get_containers_of_their_own() {
    let worker = WorkerProcess::fresh("twins");
    let client = worker.client();
    let (first_id, second_id) = twin_ids();
    let task = |id: &str| json!({"ID": id, "Name": "web", "Image": SAMPLE_IMAGE, "Cmd": ["/bin/sleep", "3600"]});
    let (_, first) = client.run(&task(&first_id)).await;
    let (_, second) = client.run(&task(&second_id)).await;
    let first_container = first["ContainerID"].as_str().unwrap();
    let second_container = second["ContainerID"].as_str().unwrap();
    assert_ne!(
        first_container, second_container,
        "one container for two tasks"
    );
    assert!(container_running(first_container) && container_running(second_container));

    assert_eq!(
        client.delete(&format!("/tasks/{second_id}")).await.status,
        204
    );
    client.await_state(&second_id, "Completed").await;
    assert!(
        container_running(first_container),
        "stopping the second task stopped the first's container"
    );
    assert_eq!(
        client.get(&format!("/tasks/{first_id}")).await.body["State"],
        "Running"
    );
}

#[tokio::test]
async fn the_disk_a_worker_offers_is_what_is_free_on_its_filesystem_not_its_size() {
    let available = || {
        let dir = tempfile::tempdir().unwrap();
        let output = std::process::Command::new("df")
            .args(["-B1", "--output=avail,size"])
            .arg(dir.path())
            .output()
            .expect("df");
        let text = String::from_utf8_lossy(&output.stdout).to_string();
        let numbers: Vec<u64> = text
            .split_whitespace()
            .filter_map(|word| word.parse().ok())
            .collect();
        (numbers[0], numbers[1])
    };
    let (before, size) = available();
    let worker = WorkerProcess::fresh("disk");
    let node = worker.client().get("/node").await.body;
    let (after, _) = available();
    let offered = node["Capacity"]["Disk"].as_u64().unwrap();
    // Other programs write and delete meanwhile: some room around the two readings.
    let slack = 256 * 1024 * 1024;
    assert!(
        offered <= before.max(after) + slack && offered + slack >= before.min(after),
        "offered {offered} bytes; free {before} then {after}; filesystem {size}"
    );
}

/// A worker admits a run only when it fits beside every task it holds, whatever the manager
/// believed when it placed it (a node back from a pause still runs the copies replaced
/// elsewhere until they are stopped): the chaos run found a node given more than it offers.
#[tokio::test]
async fn a_run_that_does_not_fit_beside_what_the_worker_holds_is_refused_until_room_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let worker = WorkerProcess::start_with(
        &unique_node("room"),
        "persistent",
        dir.path(),
        &["--cpus", "0.5"],
    );
    let client = worker.client();
    let mut first = web_task("first");
    first["Cpu"] = json!(0.3);
    let first = client.submit(&first).await;
    client.await_state(&first, "Running").await;

    let mut second = web_task("second");
    second["Cpu"] = json!(0.3);
    let refused = client.post(&second).await;
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert!(
        refused.message().contains("no room") && refused.message().contains("needs 0.3 CPU"),
        "{}",
        refused.body
    );
    let listed = client.get("/tasks").await.body;
    assert_eq!(
        listed.as_array().unwrap().len(),
        1,
        "a refused run is not kept: {listed}"
    );

    assert_eq!(client.delete(&format!("/tasks/{first}")).await.status, 204);
    client.await_state(&first, "Completed").await;
    let admitted = client.post(&second).await;
    assert_eq!(admitted.status, 201, "{}", admitted.body);
}
