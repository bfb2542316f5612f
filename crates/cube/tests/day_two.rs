//! Day-two operations as an operator meets them, against real processes and the real Docker
//! engine: a task's logs (followed to its end, and read after it failed), a command in its
//! container, draining a node without ever running fewer copies, forgetting a node that is
//! gone, removing what ended (now and after `--gc-after`), names after a re-run, running an
//! ended task again (`cube restart`), versions, and `/metrics` read by a Prometheus
//! text-format parser.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{
    ManagerProcess, OneNodeCluster, SAMPLE_IMAGE, STATE_BOUND, containers_with_label, cube_cli,
    free_port, running_containers_with_label, shell_task, unique_node, web_task,
};

fn cube() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cube"))
}

#[tokio::test]
async fn cube_logs_follows_a_task_until_it_exits_and_its_logs_stay_readable_after_it_failed() {
    let cluster = OneNodeCluster::start("logs").await;
    let client = cluster.manager.client();
    let address = cluster.manager.address();
    let id = client
        .submit(&shell_task(
            "talker",
            "echo first; for i in 1 2 3 4 5; do sleep 0.3; echo line $i; done; echo oops >&2; exit 3",
        ))
        .await;
    client.await_state(&id, "Running").await;

    let mut follower = cube()
        .args(["logs", "-f", "talker"])
        .env("CUBE_MANAGER", &address)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = follower.stdout.take().unwrap();
    let lines = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    let lines = tokio::time::timeout(STATE_BOUND, lines)
        .await
        .expect("cube logs -f ends when the task ends")
        .unwrap();
    let ended = follower.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&ended.stderr);
    assert!(ended.status.success(), "{stderr}");
    assert_eq!(
        lines,
        ["first", "line 1", "line 2", "line 3", "line 4", "line 5"],
        "every line, in order, on stdout"
    );
    assert!(stderr.contains("oops"), "the container's stderr: {stderr}");
    assert!(
        stderr.contains("ended Failed, exit code 3"),
        "the last line says how the task ended: {stderr}"
    );

    // Failed, and still readable.
    client.await_state(&id, "Failed").await;
    let (ok, out, err) = cube_cli(&address, &["logs", "talker"]);
    assert!(ok, "{err}");
    assert_eq!(out.lines().next(), Some("first"));
    assert!(
        out.contains("line 5") && err.contains("oops"),
        "{out} / {err}"
    );
    // As with docker logs, --tail counts the lines of both streams.
    let (ok, out, err) = cube_cli(&address, &["logs", "--tail", "2", "talker"]);
    assert!(ok);
    assert_eq!((out.as_str(), err.as_str()), ("line 5\n", "oops\n"));
    let (ok, out, err) = cube_cli(&address, &["logs", "--tail", "2", "--no-stderr", "talker"]);
    assert!(ok);
    assert_eq!((out.as_str(), err.as_str()), ("line 5\n", ""));
    // Its run removed on the node behind the manager's back: the manager says the node no
    // longer has it (a conflict with what it knows, not a node that cannot be reached).
    let purged = cluster
        .worker
        .client()
        .delete(&format!("/tasks/{id}?purge=true"))
        .await;
    assert!(purged.status < 300, "{}", purged.body);
    let gone = client.get(&format!("/tasks/{id}/logs")).await;
    assert_eq!(gone.status, 409, "{}", gone.body);
    assert!(
        gone.message().contains("no longer has the task"),
        "{}",
        gone.body
    );

    // The API's own words for a task that has no container.
    let port = support::free_port().to_string();
    let holder = json!({"Name": "holder", "Image": SAMPLE_IMAGE,
        "ExposedPorts": {"7777/tcp": {}}, "PortBindings": {"7777/tcp": port}});
    client.run(&holder).await;
    let mut second = holder.clone();
    second["Name"] = json!("second");
    let waiting = client.submit(&second).await;
    client
        .await_task(&waiting, "a reason to wait", |task| {
            task["PendingReason"]
                .as_str()
                .is_some_and(|why| why.contains("port"))
        })
        .await;
    let answer = client.get(&format!("/tasks/{waiting}/logs")).await;
    assert_eq!(answer.status, 409, "{}", answer.body);
    assert!(answer.message().contains("never placed"), "{}", answer.body);
}

#[tokio::test]
async fn cube_exec_prints_the_commands_output_and_exits_with_its_code() {
    let cluster = OneNodeCluster::start("exec").await;
    let client = cluster.manager.client();
    let address = cluster.manager.address();
    client.run(&web_task("shell")).await;
    let output = cube()
        .args([
            "exec",
            "shell",
            "--",
            "sh",
            "-c",
            "ls /www; echo to-stderr >&2; exit 7",
        ])
        .env("CUBE_MANAGER", &address)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert_eq!(output.status.code(), Some(7), "{stdout} / {stderr}");
    assert!(stdout.contains("health"), "the command's stdout: {stdout}");
    assert!(stderr.contains("to-stderr"), "its stderr: {stderr}");
    let (ok, out, err) = cube_cli(&address, &["exec", "shell", "--", "echo", "hello"]);
    assert!(ok, "{err}");
    assert_eq!(out, "hello\n");
    // -i: this input to the command; -it: a terminal too (here stdin is a pipe, so this
    // terminal is left as it is).
    for flags in [&["-i"][..], &["-i", "-t"][..]] {
        let mut args = vec!["exec"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["shell", "--", "sh"]);
        let mut child = cube()
            .args(&args)
            .env("CUBE_MANAGER", &address)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(b"echo typed-$((6*7))\nexit 5\n").unwrap();
        }
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(
            output.status.code(),
            Some(5),
            "{flags:?}: {stdout} / {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains("typed-42"), "{flags:?}: {stdout}");
    }
    let stopped = client.submit(&shell_task("brief", "exit 0")).await;
    client.await_state(&stopped, "Completed").await;
    let (ok, _, err) = cube_cli(&address, &["exec", "brief", "--", "true"]);
    assert!(!ok && err.contains("Running"), "{err}");
}

/// Copies of job `web` that run and are meant to.
async fn running_copies(client: &support::Client) -> Vec<Value> {
    let tasks = client.get("/tasks?job=web&summary=true").await.body;
    tasks
        .as_array()
        .unwrap()
        .iter()
        .filter(|task| task["State"] == "Running" && task["DesiredState"] == "Running")
        .cloned()
        .collect()
}

#[tokio::test]
async fn draining_a_node_moves_its_copies_without_ever_running_fewer_and_it_takes_nothing_until_enabled()
 {
    support::ensure_sample_image();
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("epvm", "memory", dir.path(), 0);
    let client = manager.client();
    let address = manager.address();
    let w1 = manager.join_worker(&unique_node("drain1"), &[]);
    manager.await_ready_nodes(1).await;
    let job = json!({"Name": "web", "Type": "service", "Groups": [{"Name": "api", "Count": 2,
        "Task": {"Image": SAMPLE_IMAGE, "ExposedPorts": {"7777/tcp": {}},
                 "PortBindings": {"7777/tcp": ""}, "HealthCheck": "/health",
                 "HealthCheckInterval": "300ms"}}]});
    let answer = client.post_raw("/jobs", job.to_string()).await;
    assert_eq!(answer.status, 201, "{}", answer.body);
    let deadline = Instant::now() + STATE_BOUND;
    while running_copies(&client).await.len() < 2 {
        assert!(Instant::now() < deadline, "the job's 2 copies never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let w2 = manager.join_worker(&unique_node("drain2"), &[]);
    manager.await_ready_nodes(2).await;

    let drain = {
        let address = address.clone();
        let name = w1.name.clone();
        tokio::task::spawn_blocking(move || cube_cli(&address, &["node", "drain", &name]))
    };
    // Never fewer than 2 copies running, until the drain is done.
    let mut fewest = usize::MAX;
    while !drain.is_finished() {
        fewest = fewest.min(running_copies(&client).await.len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (ok, out, err) = drain.await.unwrap();
    assert!(ok, "{out} / {err}");
    assert!(out.contains("is drained"), "{out}");
    assert_eq!(
        fewest, 2,
        "a copy stopped before its replacement was healthy"
    );
    let copies = running_copies(&client).await;
    assert_eq!(copies.len(), 2);
    assert!(
        copies
            .iter()
            .all(|task| task["NodeName"] == w2.name.as_str())
    );
    assert!(running_containers_with_label(&format!("cube.node={}", w1.name)).is_empty());
    let node = client.get(&format!("/nodes/{}", w1.name)).await.body;
    assert_eq!(node["Eligible"], false, "{node}");
    assert!(node.get("Drain").is_none(), "the drain is over: {node}");

    // Nothing new goes there until it is enabled.
    let pinned = client
        .submit(
            &json!({"Name": "pinned", "Image": SAMPLE_IMAGE, "Constraints": [
            {"Attribute": "node.name", "Operator": "=", "Value": w1.name}]}),
        )
        .await;
    let waiting = client
        .await_task(&pinned, "a reason", |task| {
            task["PendingReason"]
                .as_str()
                .is_some_and(|why| why.contains("ineligible"))
        })
        .await;
    assert_eq!(waiting["State"], "Pending");
    let (ok, _, err) = cube_cli(&address, &["node", "eligibility", &w1.name, "--enable"]);
    assert!(ok, "{err}");
    let placed = client.await_state(&pinned, "Running").await;
    assert_eq!(placed["NodeName"], w1.name.as_str());
}

#[tokio::test]
async fn cube_node_rm_forgets_a_down_node_and_refuses_one_that_is_up() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start_with(
        "epvm",
        "memory",
        dir.path(),
        0,
        &["--heartbeat-grace", "1s"],
    );
    let address = manager.address();
    let worker = manager.join_worker(&unique_node("gone"), &[]);
    manager.await_ready_nodes(1).await;
    let name = worker.name.clone();
    let (ok, _, err) = cube_cli(&address, &["node", "rm", &name]);
    assert!(!ok && err.contains("only a Down node"), "{err}");
    worker.terminate(STATE_BOUND);
    manager
        .await_nodes("the node Down", |nodes| nodes[0]["Status"] == "Down")
        .await;
    let (ok, out, err) = cube_cli(&address, &["node", "rm", &name]);
    assert!(ok, "{err}");
    assert!(out.contains("removed node"), "{out}");
    let nodes = manager.client().get("/nodes").await.body;
    assert_eq!(nodes, json!([]));
    let answer = manager.client().get(&format!("/nodes/{name}")).await;
    assert_eq!(answer.status, 404);
}

#[tokio::test]
async fn cube_prune_removes_ended_tasks_with_their_containers_and_leaves_running_ones() {
    let cluster = OneNodeCluster::start("prune").await;
    let client = cluster.manager.client();
    let address = cluster.manager.address();
    let done = client.submit(&shell_task("done", "echo bye")).await;
    client.await_state(&done, "Completed").await;
    let (running, _) = client.run(&web_task("stays")).await;
    let label = format!("cube.task-id={done}");
    assert_eq!(
        containers_with_label(&label).len(),
        1,
        "an ended task's container is kept, for its logs"
    );
    let (ok, out, err) = cube_cli(&address, &["rm", "stays"]);
    assert!(!ok && err.contains("stop it first"), "{out} / {err}");
    let (ok, out, err) = cube_cli(&address, &["prune"]);
    assert!(ok, "{err}");
    assert!(out.contains("removed task done"), "{out}");
    assert_eq!(client.get(&format!("/tasks/{done}")).await.status, 404);
    assert!(
        containers_with_label(&label).is_empty(),
        "its container is gone"
    );
    assert_eq!(client.get(&format!("/tasks/{running}")).await.status, 200);
}

#[tokio::test]
async fn the_garbage_collector_removes_what_ended_after_gc_after() {
    support::ensure_sample_image();
    let dir = tempfile::tempdir().unwrap();
    let manager =
        ManagerProcess::start_with("epvm", "memory", dir.path(), 0, &["--gc-after", "1s"]);
    let _worker = manager.join_worker(&unique_node("gc"), &[]);
    manager.await_ready_nodes(1).await;
    let client = manager.client();
    let id = client.submit(&shell_task("short", "exit 0")).await;
    client.await_state(&id, "Completed").await;
    let deadline = Instant::now() + STATE_BOUND;
    while client.get(&format!("/tasks/{id}")).await.status != 404 {
        assert!(
            Instant::now() < deadline,
            "the ended task was never removed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(containers_with_label(&format!("cube.task-id={id}")).is_empty());
}

#[tokio::test]
async fn a_name_resolves_to_the_live_task_after_a_rerun() {
    let cluster = OneNodeCluster::start("rerun").await;
    let client = cluster.manager.client();
    let address = cluster.manager.address();
    let first = client.submit(&shell_task("again", "echo one")).await;
    client.await_state(&first, "Completed").await;
    let (second, _) = client.run(&web_task("again")).await;
    let (ok, out, err) = cube_cli(&address, &["status", "again", "-o", "json"]);
    assert!(ok, "{err}");
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["ID"], second.as_str());
    let (ok, out, _) = cube_cli(&address, &["logs", "again"]);
    assert!(ok && !out.contains("one"), "the live run's logs: {out}");
}

/// The name Docker has for a container (without the leading `/`).
fn container_name(id: &str) -> String {
    let output = Command::new("docker")
        .args(["inspect", "--format", "{{.Name}}", id])
        .output()
        .expect("run docker inspect");
    assert!(output.status.success(), "docker inspect {id}");
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .trim_start_matches('/')
        .to_string()
}

#[tokio::test]
async fn cube_restart_runs_an_ended_task_again_as_a_new_run_in_a_new_container() {
    let cluster = OneNodeCluster::start("restart").await;
    let client = cluster.manager.client();
    let address = cluster.manager.address();
    let id = client.submit(&shell_task("again", "echo ran")).await;
    let first = client.await_state(&id, "Completed").await;

    let (ok, out, err) = cube_cli(&address, &["restart", "again"]);
    assert!(ok, "{out} / {err}");
    assert!(
        out.contains("restarting again") && out.contains("run 1"),
        "{out}"
    );
    let second = client
        .await_task(&id, "run 1 completed", |task| {
            task["RestartCount"] == 1 && task["State"] == "Completed"
        })
        .await;
    assert_eq!(second["DesiredState"], "Running", "{second}");
    let (old, new) = (
        first["ContainerID"].as_str().unwrap(),
        second["ContainerID"].as_str().unwrap(),
    );
    assert_ne!(old, new, "a new run is a new container");
    assert!(
        container_name(new).ends_with("-r1"),
        "{}",
        container_name(new)
    );
    // The last run's container goes once the new run runs; the new one stays.
    let deadline = Instant::now() + STATE_BOUND;
    loop {
        let left = containers_with_label(&format!("cube.task-id={id}"));
        if left
            .iter()
            .all(|container| !old.starts_with(container.as_str()))
        {
            assert!(
                left.iter()
                    .any(|container| new.starts_with(container.as_str())),
                "{left:?}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the last run's container stays: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let history = second["History"].as_array().unwrap();
    assert!(
        history.iter().any(|entry| entry["Event"] == "Restart"
            && entry["Message"]
                .as_str()
                .is_some_and(|message| message.contains("asked by the user"))),
        "{second}"
    );
    // The logs are the new run's: one line, not the two runs' together.
    let (ok, out, err) = cube_cli(&address, &["logs", "again"]);
    assert!(ok, "{err}");
    assert_eq!(out.lines().collect::<Vec<_>>(), ["ran"], "{out}");

    // A task stopped by the user runs again, wanted running again.
    let (running, _) = client.run(&web_task("served")).await;
    let (ok, out, err) = cube_cli(&address, &["stop", "--wait", "served"]);
    assert!(ok, "{out} / {err}");
    let (ok, out, err) = cube_cli(&address, &["restart", &running[..8]]);
    assert!(ok, "{out} / {err}");
    let back = client
        .await_task(&running, "run 1 running", |task| {
            task["RestartCount"] == 1 && task["State"] == "Running"
        })
        .await;
    assert_eq!(back["DesiredState"], "Running", "{back}");
}

#[tokio::test]
async fn cube_restart_refuses_a_task_that_has_not_ended_a_jobs_copy_and_an_unknown_task() {
    let cluster = OneNodeCluster::start("norestart").await;
    let client = cluster.manager.client();
    let address = cluster.manager.address();

    let (running, _) = client.run(&web_task("busy")).await;
    let (ok, out, err) = cube_cli(&address, &["restart", "busy"]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("has not ended") && err.contains("cube stop"),
        "{err}"
    );
    let answer = client
        .post_raw(&format!("/tasks/{running}/restart"), "")
        .await;
    assert_eq!(answer.status, 409, "{}", answer.body);
    assert_eq!(answer.body["HTTPStatusCode"], 409, "{}", answer.body);
    assert!(answer.message().contains("Running"), "{}", answer.body);
    let still = client.get(&format!("/tasks/{running}")).await.body;
    assert_eq!(
        still["State"], "Running",
        "a refused restart changes nothing"
    );
    assert_eq!(still["RestartCount"], 0, "{still}");

    // A job's copy belongs to the job.
    let job = json!({"Name": "owned", "Type": "batch",
                     "Groups": [{"Name": "g", "Count": 1,
                                 "Task": {"Image": SAMPLE_IMAGE, "Cmd": ["true"]}}]});
    let created = client.post_raw("/jobs", job.to_string()).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let job = client
        .await_job("owned", "its copy", |job| {
            job["Tasks"]
                .as_array()
                .is_some_and(|tasks| !tasks.is_empty())
        })
        .await;
    let copy = job["Tasks"][0]["ID"].as_str().unwrap();
    let answer = client.post_raw(&format!("/tasks/{copy}/restart"), "").await;
    assert_eq!(answer.status, 409, "{}", answer.body);
    assert!(
        answer.message().contains("job \"owned\""),
        "{}",
        answer.body
    );

    // A task removed, and one never known: 404.
    let done = client.submit(&shell_task("gone", "true")).await;
    client.await_state(&done, "Completed").await;
    let (ok, _, err) = cube_cli(&address, &["rm", "gone"]);
    assert!(ok, "{err}");
    for id in [done.as_str(), "00000000-0000-4000-8000-000000000000"] {
        let answer = client.post_raw(&format!("/tasks/{id}/restart"), "").await;
        assert_eq!(answer.status, 404, "{}", answer.body);
        assert!(answer.message().contains("no task"), "{}", answer.body);
    }
    let (ok, _, err) = cube_cli(&address, &["restart", "gone"]);
    assert!(!ok && err.contains("no task matches"), "{err}");
}

#[tokio::test]
async fn a_restart_answered_survives_a_manager_killed_at_once() {
    support::ensure_sample_image();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let manager = ManagerProcess::start("epvm", "persistent", dir.path(), port);
    let _worker = manager.join_worker(&unique_node("rscrash"), &[]);
    manager.await_ready_nodes(1).await;
    let client = manager.client();
    let id = client.submit(&shell_task("once", "echo once")).await;
    client.await_state(&id, "Completed").await;

    let answer = client.post_raw(&format!("/tasks/{id}/restart"), "").await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.body["State"], "Pending", "{}", answer.body);
    assert_eq!(answer.body["RestartCount"], 1, "{}", answer.body);
    manager.kill_9();

    let manager = ManagerProcess::start("epvm", "persistent", dir.path(), port);
    let client = manager.client();
    let after = client.get(&format!("/tasks/{id}")).await;
    assert_eq!(after.status, 200, "{}", after.body);
    assert_eq!(
        after.body["RestartCount"], 1,
        "the restart was stored: {}",
        after.body
    );
    client
        .await_task(&id, "run 1 completed", |task| {
            task["RestartCount"] == 1 && task["State"] == "Completed"
        })
        .await;
}

/// The samples of `family` in a scrape, by the value of `label`.
fn by_label(scrape: &prometheus_parse::Scrape, family: &str, label: &str) -> Vec<(String, f64)> {
    scrape
        .samples
        .iter()
        .filter(|sample| sample.metric == family || sample.metric == format!("{family}_total"))
        .filter_map(|sample| {
            let value = match sample.value {
                prometheus_parse::Value::Gauge(value)
                | prometheus_parse::Value::Counter(value)
                | prometheus_parse::Value::Untyped(value) => value,
                _ => return None,
            };
            Some((sample.labels.get(label)?.to_string(), value))
        })
        .collect()
}

async fn scrape(url: &str) -> prometheus_parse::Scrape {
    let text = support::http()
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    prometheus_parse::Scrape::parse(text.lines().map(|line| Ok(line.to_string())))
        .unwrap_or_else(|err| panic!("not the Prometheus text format ({err}): {text}"))
}

#[tokio::test]
async fn metrics_parse_as_prometheus_text_and_the_task_gauges_match_get_tasks() {
    let cluster = OneNodeCluster::start("metrics").await;
    let client = cluster.manager.client();
    client.run(&web_task("m1")).await;
    let done = client.submit(&shell_task("m2", "exit 0")).await;
    client.await_state(&done, "Completed").await;

    let scraped = scrape(&cluster.manager.url).await;
    let tasks = client.get("/tasks").await.body;
    for (state, value) in by_label(&scraped, "cube_tasks", "state") {
        let listed = tasks
            .as_array()
            .unwrap()
            .iter()
            .filter(|task| task["State"] == state.as_str())
            .count();
        assert_eq!(value as usize, listed, "cube_tasks{{state={state:?}}}");
    }
    assert_eq!(
        by_label(&scraped, "cube_nodes", "state")
            .into_iter()
            .find(|(state, _)| state == "Ready")
            .map(|(_, value)| value),
        Some(1.0)
    );
    let node = &cluster.worker.name;
    assert!(
        by_label(&scraped, "cube_node_capacity_memory_bytes", "node")
            .iter()
            .any(|(name, value)| name == node && *value > 0.0)
    );
    assert!(
        by_label(&scraped, "cube_http_requests", "route")
            .iter()
            .any(|(route, _)| route == "/tasks/:id"),
        "requests are counted by route pattern"
    );
    assert!(scraped.docs.contains_key("cube_reconcile_duration_seconds"));

    let worker = scrape(&cluster.worker.url).await;
    let running = by_label(&worker, "cube_worker_tasks", "state");
    assert!(
        running.contains(&("Running".to_string(), 1.0)),
        "{running:?}"
    );
    assert!(
        worker
            .docs
            .contains_key("cube_worker_docker_call_duration_seconds")
    );
}

/// `promtool check metrics` (Prometheus's own linter) on a `/metrics` answer: its findings
/// when it has any.
fn promtool_findings(url: &str, text: &str) -> Option<String> {
    use std::io::Write;
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|err| {
            panic!("cannot run promtool ({err}): install it with scripts/setup.sh")
        });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    (!output.status.success()).then(|| {
        format!(
            "{url}/metrics: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

#[tokio::test]
async fn promtool_finds_nothing_to_lint_in_the_metrics_of_the_manager_and_the_worker() {
    let cluster = OneNodeCluster::start("promtool").await;
    let client = cluster.manager.client();
    // Every kind of family with samples: counters (placements, requests, health probes),
    // gauges, histograms.
    let mut task = web_task("linted");
    task["HealthCheck"] = json!("/health");
    task["HealthCheckInterval"] = json!("200ms");
    let id = client.submit(&task).await;
    client
        .await_task(&id, "Healthy", |task| task["Health"] == "Healthy")
        .await;
    let mut findings = Vec::new();
    let manager_counters: &[&str] = &["cube_placements_total", "cube_http_requests_total"];
    let worker_counters: &[&str] = &["cube_worker_health_probes_total"];
    for (url, counters) in [
        (&cluster.manager.url, manager_counters),
        (&cluster.worker.url, worker_counters),
    ] {
        let answer = support::http()
            .get(format!("{url}/metrics"))
            .send()
            .await
            .unwrap();
        assert_eq!(
            answer.headers()["content-type"],
            "text/plain; version=0.0.4; charset=utf-8"
        );
        let text = answer.text().await.unwrap();
        for counter in counters {
            assert!(
                text.lines().any(|line| line.starts_with(counter)),
                "{counter} has samples to lint: {text}"
            );
        }
        findings.extend(promtool_findings(url, &text));
    }
    assert!(findings.is_empty(), "{findings:#?}");
}

#[tokio::test]
async fn cube_version_names_the_client_the_manager_and_each_nodes_docker() {
    let cluster = OneNodeCluster::start("version").await;
    let (ok, out, err) = cube_cli(&cluster.manager.address(), &["version"]);
    assert!(ok, "{err}");
    assert!(out.contains("Client:  cube "), "{out}");
    assert!(out.contains("Manager: cube "), "{out}");
    let docker = Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output()
        .unwrap();
    let docker = String::from_utf8_lossy(&docker.stdout).trim().to_string();
    assert!(
        out.lines()
            .any(|line| line.contains(&cluster.worker.name) && line.contains(&docker)),
        "the node's Docker version {docker}: {out}"
    );
    let worker = cluster.worker.client().get("/version").await.body;
    assert_eq!(worker["Docker"], docker.as_str());
}

/// `cube exec -it TASK -- cat` in a real terminal (`script` gives it a pty): Ctrl-D ends `cat`,
/// and with it the command, at once; nothing waits for another key.
#[tokio::test]
async fn cube_exec_it_ends_when_ctrl_d_ends_the_command_in_a_terminal() {
    use std::io::{Read, Write};
    let cluster = OneNodeCluster::start("exec-tty").await;
    let client = cluster.manager.client();
    client.run(&web_task("typist")).await;
    let command = format!("{} exec -it typist -- cat", env!("CARGO_BIN_EXE_cube"));
    let mut child = Command::new("script")
        .args(["-q", "-e", "-f", "-c", &command, "/dev/null"])
        .env("CUBE_MANAGER", cluster.manager.address())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script (util-linux) runs the command in a pty");
    let mut keyboard = child.stdin.take().unwrap();
    let mut screen = child.stdout.take().unwrap();
    // What the terminal shows, read as it comes.
    let (shown, mut showing) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    std::thread::spawn(move || {
        let mut buffer = [0u8; 4096];
        while let Ok(read) = screen.read(&mut buffer) {
            if read == 0 || shown.send(buffer[..read].to_vec()).is_err() {
                return;
            }
        }
    });
    keyboard.write_all(b"typed-by-hand\r").unwrap();
    keyboard.flush().unwrap();
    // `cat` answers with the line (after the terminal's echo of it): the session runs, and
    // this terminal is raw.
    let mut screen_text = String::new();
    let deadline = Instant::now() + STATE_BOUND;
    while screen_text.matches("typed-by-hand").count() < 2 {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, showing.recv()).await {
            Ok(Some(bytes)) => screen_text.push_str(&String::from_utf8_lossy(&bytes)),
            _ => panic!("cat never answered: {screen_text:?}"),
        }
    }
    // Ctrl-D.
    keyboard.write_all(&[4]).unwrap();
    keyboard.flush().unwrap();
    let deadline = Instant::now() + STATE_BOUND;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            let output = child.wait_with_output().unwrap();
            panic!(
                "cube exec -it still runs after Ctrl-D ended cat: {screen_text:?} / {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status:?}: {screen_text:?}");
    drop(keyboard);
}

/// `cube exec -c NAME`: a command in one of a pod's containers, as `cube logs -c` reads one;
/// without it, the first service's (`alpha`, first by name and in the file).
#[tokio::test]
async fn cube_exec_with_a_container_runs_in_that_service_of_a_pod() {
    let cluster = OneNodeCluster::start("exec-pod").await;
    let address = cluster.manager.address();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("duo.yml");
    std::fs::write(
        &file,
        format!(
            "services:\n  alpha:\n    image: {SAMPLE_IMAGE}\n    environment:\n      WHO: alpha\n  \
             beta:\n    image: {SAMPLE_IMAGE}\n    command: [\"sleep\", \"3600\"]\n    \
             environment:\n      WHO: beta\n"
        ),
    )
    .unwrap();
    let (ok, stdout, stderr) = cube_cli(&address, &["run", "-f", &file.display().to_string()]);
    assert!(ok, "{stderr}");
    let id = stdout.trim().to_string();
    cluster.manager.client().await_state(&id, "Running").await;
    let who = ["--", "sh", "-c", "echo I am $WHO"];
    let exec = |extra: &[&str]| {
        let mut args = vec!["exec"];
        args.extend_from_slice(extra);
        args.push("duo");
        args.extend_from_slice(&who);
        cube_cli(&address, &args)
    };
    let (ok, out, err) = exec(&[]);
    assert!(ok, "{err}");
    assert_eq!(out, "I am alpha\n");
    let (ok, out, err) = exec(&["-c", "beta"]);
    assert!(ok, "{err}");
    assert_eq!(out, "I am beta\n");
    let (ok, out, err) = exec(&["--container", "alpha"]);
    assert!(ok, "{err}");
    assert_eq!(out, "I am alpha\n");
    let (ok, _, err) = exec(&["-c", "nope"]);
    assert!(!ok);
    assert!(
        err.contains("no container \"nope\"") && err.contains("beta"),
        "{err}"
    );
    // -i: the same container choice over the interactive connection.
    let mut child = cube()
        .args(["exec", "-i", "-c", "beta", "duo", "--", "sh"])
        .env("CUBE_MANAGER", &address)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"echo typed in $WHO\nexit 0\n").unwrap();
    }
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout} / {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(stdout, "typed in beta\n");
}

#[tokio::test]
async fn cube_logs_follow_of_a_task_that_waits_for_a_node_follows_it_once_it_runs() {
    support::ensure_sample_image();
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("epvm", "memory", dir.path(), 0);
    let client = manager.client();
    // No node yet: the task waits, Pending.
    let id = client
        .submit(&shell_task(
            "late",
            "echo hello-from-late; sleep 1; echo bye",
        ))
        .await;
    client.await_state(&id, "Pending").await;
    let follower = cube()
        .args(["logs", "-f", "late"])
        .env("CUBE_MANAGER", manager.address())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The follower says it waits; only then does a node come.
    let mut follower = follower;
    let stderr = follower.stderr.take().unwrap();
    let mut stderr = BufReader::new(stderr);
    let mut said = String::new();
    stderr.read_line(&mut said).unwrap();
    assert!(said.contains("waiting for it to start"), "{said}");
    let _worker = manager.join_worker(&unique_node("late"), &[]);
    let output = tokio::task::spawn_blocking(move || follower.wait_with_output());
    let output = tokio::time::timeout(STATE_BOUND, output)
        .await
        .expect("cube logs -f ends when the task ends")
        .unwrap()
        .unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    assert!(output.status.success(), "{said}{rest}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "hello-from-late\nbye\n"
    );
    assert!(rest.contains("Completed"), "{rest}");
}
