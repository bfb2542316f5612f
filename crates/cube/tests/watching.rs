//! Watching a cluster: the manager's blocking queries, its event stream (`GET /events`) and
//! `cube events`, against the real `cube` binary, real workers and the real Docker engine.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{
    EventReader, ManagerProcess, OneNodeCluster, STATE_BOUND, cube_cli, index_of, unique_node,
    web_task,
};

async fn current_index(manager: &ManagerProcess) -> u64 {
    support::tasks_index(manager, "").await
}

/// A manager alone (memory store): enough for what needs no container to run.
fn lone_manager() -> (ManagerProcess, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("epvm", "memory", dir.path(), 0);
    (manager, dir)
}

fn types(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|event| event["Type"].as_str().unwrap())
        .collect()
}

fn indexes(events: &[Value]) -> Vec<u64> {
    events
        .iter()
        .map(|event| event["Index"].as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn a_blocking_query_on_tasks_waits_out_its_wait_when_nothing_changes() {
    let (manager, _dir) = lone_manager();
    let index = current_index(&manager).await;
    let started = Instant::now();
    let response = support::http()
        .get(format!("{}/tasks?index={index}&wait=1s", manager.url))
        .send()
        .await
        .unwrap();
    let waited = started.elapsed();
    assert_eq!(response.status(), 200);
    // It waited its second out (less a little for clocks), and then answered rather than
    // hanging on.
    assert!(
        waited >= Duration::from_millis(900) && waited < STATE_BOUND,
        "answered after {waited:?}"
    );
    assert_eq!(index_of(&response), index, "nothing changed");
    assert_eq!(response.json::<Value>().await.unwrap(), json!([]));
}

#[tokio::test]
async fn a_blocking_query_on_tasks_answers_at_a_change_before_its_wait_is_out() {
    let (manager, _dir) = lone_manager();
    let client = manager.client();
    let index = current_index(&manager).await;
    // A wait far longer than the bound below: an answer within the bound came from the
    // change, not from the wait running out. How soon is a measurement, not asserted here.
    let url = format!("{}/tasks?index={index}&wait=60s&summary=true", manager.url);
    let query = tokio::spawn(async move {
        let response = support::http().get(url).send().await.unwrap();
        let answered = Instant::now();
        let index = index_of(&response);
        (answered, index, response.json::<Value>().await.unwrap())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!query.is_finished(), "answered before anything changed");
    let id = client.submit(&web_task("watched")).await;
    let submitted = Instant::now();
    let (answered, new_index, tasks) = query.await.unwrap();
    assert!(
        answered.saturating_duration_since(submitted) < STATE_BOUND,
        "answered {:?} after the change",
        answered.saturating_duration_since(submitted)
    );
    assert!(
        new_index > index,
        "X-Cube-Index moved: {index} -> {new_index}"
    );
    assert_eq!(tasks[0]["ID"], id);
    assert!(tasks[0].get("History").is_none(), "filters still apply");
    // Paging still works, with the index on every page.
    let response = support::http()
        .get(format!("{}/tasks?limit=1", manager.url))
        .send()
        .await
        .unwrap();
    assert!(index_of(&response) >= new_index);
}

/// A blocking query of one project's tasks waits through another project's change and
/// answers at its own project's.
#[tokio::test]
async fn a_blocking_query_of_one_project_waits_through_another_projects_change() {
    let (manager, _dir) = lone_manager();
    let client = manager.client();
    for name in ["team-a", "team-b"] {
        let answer = client
            .request_answer(
                "POST",
                "/projects",
                Some(&json!({"Name": name}).to_string()),
            )
            .await;
        assert_eq!(answer.status, 201, "{}", answer.body);
    }
    let submit_in = |project: &'static str| {
        let client = &client;
        async move {
            let answer = client
                .request_answer(
                    "POST",
                    &format!("/tasks?project={project}"),
                    Some(&web_task("watched").to_string()),
                )
                .await;
            assert_eq!(answer.status, 201, "{}", answer.body);
            answer.body["ID"].as_str().unwrap().to_string()
        }
    };
    let index = current_index(&manager).await;
    let url = format!(
        "{}/tasks?project=team-a&index={index}&wait=60s&summary=true",
        manager.url
    );
    let query = tokio::spawn(async move {
        let response = support::http().get(url).send().await.unwrap();
        response.json::<Value>().await.unwrap()
    });
    let other = submit_in("team-b").await;
    let listed = client.get("/tasks?project=team-b").await;
    assert_eq!(listed.body[0]["ID"], other.as_str(), "{}", listed.body);
    // Time for a wrong wake to answer; the query must still wait.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !query.is_finished(),
        "answered at another project's change: {:?}",
        query.await
    );
    let own = submit_in("team-a").await;
    let tasks = tokio::time::timeout(STATE_BOUND, query)
        .await
        .expect("answered at its own project's change")
        .unwrap();
    assert_eq!(tasks.as_array().map(Vec::len), Some(1), "{tasks}");
    assert_eq!(tasks[0]["ID"], own.as_str());
}

#[tokio::test]
async fn a_blocking_query_on_nodes_answers_when_a_node_joins() {
    let (manager, _dir) = lone_manager();
    let response = support::http()
        .get(format!("{}/nodes", manager.url))
        .send()
        .await
        .unwrap();
    let index = index_of(&response);
    let url = format!("{}/nodes?index={index}&wait=30s", manager.url);
    let query = tokio::spawn(async move {
        let response = support::http().get(url).send().await.unwrap();
        (index_of(&response), response.json::<Value>().await.unwrap())
    });
    let name = unique_node("watch-node");
    let _worker = manager.join_worker(&name, &[]);
    let (new_index, nodes) = tokio::time::timeout(STATE_BOUND, query)
        .await
        .expect("the blocking query answered")
        .unwrap();
    assert!(new_index > index);
    assert_eq!(nodes[0]["Name"], name.as_str());
    let bad = support::http()
        .get(format!("{}/nodes?index={index}&wait=soon", manager.url))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400, "a wait that is not a duration");
}

#[tokio::test]
async fn a_subscriber_sees_a_task_from_submitted_to_running_in_order_and_can_resume() {
    let cluster = OneNodeCluster::start("watch-events").await;
    let client = cluster.manager.client();
    let mut reader = EventReader::open(&cluster.manager, "?topic=Task").await;
    let id = client.submit(&web_task("events-web")).await;
    let seen = reader.task_events_until(&id, "Running").await;
    assert_eq!(types(&seen), ["Submitted", "Placed", "Running"]);
    let seen_indexes = indexes(&seen);
    assert!(
        seen_indexes.windows(2).all(|pair| pair[0] < pair[1]),
        "{seen_indexes:?}"
    );
    assert_eq!(seen[0]["Topic"], "Task");
    assert_eq!(seen[0]["Object"]["State"], "Pending");
    assert_eq!(seen[2]["Object"]["State"], "Running");
    assert_eq!(seen[2]["Object"]["NodeName"], cluster.worker.name.as_str());
    assert!(seen[2]["Object"].get("History").is_none());
    assert!(
        seen[0].get("Job").is_none(),
        "a bare task belongs to no job"
    );

    // Stopping it makes more events; a subscriber resuming after the first gets exactly
    // the ones after it, then the new ones, each once.
    client.delete(&format!("/tasks/{id}")).await;
    let mut after_running = reader.task_events_until(&id, "Completed").await;
    let mut everything = seen.clone();
    everything.append(&mut after_running);
    let mut resumed = EventReader::open(
        &cluster.manager,
        &format!("?topic=Task&index={}", seen_indexes[0]),
    )
    .await;
    let again = resumed.task_events_until(&id, "Completed").await;
    assert_eq!(indexes(&again), indexes(&everything[1..]));
    assert_eq!(types(&again)[..2], ["Placed", "Running"]);
}

#[tokio::test]
async fn an_index_older_than_the_events_kept_is_gone_with_the_oldest_index() {
    let (manager, _dir) = lone_manager();
    let response = support::http()
        .get(format!("{}/events?index=1", manager.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 410);
    let oldest: u64 = response.headers()["X-Cube-Oldest-Index"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["HTTPStatusCode"], 410);
    let message = body["Message"].as_str().unwrap();
    assert!(message.contains(&oldest.to_string()), "{message}");
    // From the oldest index, the stream starts.
    let response = support::http()
        .get(format!("{}/events?index={oldest}", manager.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    // An index ahead of the newest event is a mistake.
    let ahead = current_index(&manager).await + 10;
    let response = support::http()
        .get(format!("{}/events?index={ahead}", manager.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
}

#[tokio::test]
async fn an_index_from_before_a_restart_never_names_another_event() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("epvm", "persistent", dir.path(), 0);
    manager
        .client()
        .submit(&json!({"Name": "before-restart", "Image": "cube-sample:latest"}))
        .await;
    let before = current_index(&manager).await;
    assert!(manager.terminate(STATE_BOUND).success());
    let manager = ManagerProcess::start("epvm", "persistent", dir.path(), 0);
    let after = current_index(&manager).await;
    assert!(after > before, "{before} then {after}");
    let response = support::http()
        .get(format!("{}/events?index={before}", manager.url))
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        410,
        "what came after {before} is not kept"
    );
}

#[tokio::test]
async fn a_request_that_accepts_server_sent_events_gets_them() {
    let (manager, _dir) = lone_manager();
    let mut response = support::http()
        .get(format!("{}/events?topic=task", manager.url))
        .header("Accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let id = manager
        .client()
        .submit(&json!({"Name": "sse", "Image": "cube-sample:latest"}))
        .await;
    let mut text = String::new();
    while !text.contains("\n\n") {
        let chunk = tokio::time::timeout(STATE_BOUND, response.chunk())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    let event = text.split("\n\n").next().unwrap();
    let lines: Vec<&str> = event.lines().collect();
    assert_eq!(lines[0], "event: Task", "{event}");
    let index = lines[1].strip_prefix("id: ").expect("an id line");
    let data: Value = serde_json::from_str(lines[2].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(data["Index"].to_string(), index);
    assert_eq!(
        (data["Type"].as_str(), data["Key"].as_str()),
        (Some("Submitted"), Some(id.as_str()))
    );
}

#[tokio::test]
async fn an_unknown_topic_is_refused_with_its_name() {
    let (manager, _dir) = lone_manager();
    let answer = manager.client().get("/events?topic=Task&topic=Pods").await;
    assert_eq!(answer.status, 400);
    assert!(
        answer.message().contains("\"Pods\""),
        "{}",
        answer.message()
    );
    let answer = manager.client().get("/events?since=3").await;
    assert_eq!(answer.status, 400);
}

#[tokio::test]
async fn an_open_event_stream_ends_with_a_closed_notice_and_holds_up_no_shutdown() {
    let (manager, _dir) = lone_manager();
    let mut reader = EventReader::open(&manager, "").await;
    // The manager has no grace period that would end a held shutdown: a stream that held
    // it would keep the process up past `terminate`'s bound, which then fails the test.
    let stopping = tokio::task::spawn_blocking(move || manager.terminate(STATE_BOUND));
    let last = reader.next_event().await;
    assert_eq!(
        (last["Topic"].as_str(), last["Type"].as_str()),
        (Some("Stream"), Some("Closed"))
    );
    assert!(stopping.await.unwrap().success());
}

#[tokio::test]
async fn cube_events_prints_a_line_for_a_submitted_task() {
    let (manager, _dir) = lone_manager();
    let index = current_index(&manager).await.to_string();
    let mut events = Command::new(env!("CARGO_BIN_EXE_cube"))
        .args(["events", "--index", &index, "--topic", "Task"])
        .env("CUBE_MANAGER", manager.address())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (success, stdout, stderr) = cube_cli(
        &manager.address(),
        &["run", "--name", "printed-task", "cube-sample:latest"],
    );
    assert!(success, "{stderr}");
    let id = stdout.trim().to_string();
    let stdout = events.stdout.take().unwrap();
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if lines.send(line.unwrap_or_default()).is_err() {
                return;
            }
        }
    });
    let line = received.recv_timeout(STATE_BOUND).expect("a line");
    let _ = events.kill();
    let _ = events.wait();
    assert!(
        line.contains("Submitted") && line.contains(&id[..8]) && line.contains("printed-task"),
        "{line}"
    );
}

/// A service job of `count` copies of the sample image.
fn job(name: &str, count: u32) -> Value {
    json!({"Name": name, "Type": "service",
           "Groups": [{"Name": "api", "Count": count, "Task": {"Image": "cube-sample:latest"}}]})
}

#[tokio::test]
async fn blocking_queries_on_jobs_answer_when_the_job_changes() {
    // No node: the copies wait, Pending, and nothing runs.
    let (manager, _dir) = lone_manager();
    let client = manager.client();
    let mut web_events = EventReader::open(&manager, "?job=web").await;
    assert_eq!(
        client
            .post_raw("/jobs", job("web", 1).to_string())
            .await
            .status,
        201
    );
    // The job controller creates the copy after the answer, and the placement pass says why
    // it waits: the job is settled once a short blocking query finds nothing new.
    let mut index = 0;
    loop {
        let url = format!("{}/jobs/web?index={index}&wait=500ms", manager.url);
        let answered = index_of(&support::http().get(url).send().await.unwrap());
        if answered == index {
            break;
        }
        index = answered;
    }
    let one = tokio::spawn(
        support::http()
            .get(format!("{}/jobs/web?index={index}&wait=30s", manager.url))
            .send(),
    );
    let all = tokio::spawn(
        support::http()
            .get(format!("{}/jobs?index={index}&wait=30s", manager.url))
            .send(),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !one.is_finished() && !all.is_finished(),
        "nothing changed yet"
    );
    let scaled = client
        .post_raw(
            "/jobs/web/scale",
            json!({"Group": "api", "Count": 2}).to_string(),
        )
        .await;
    assert_eq!(scaled.status, 200, "{}", scaled.body);
    for query in [one, all] {
        // Generous, yet short of the queries' 30 s wait.
        let response = tokio::time::timeout(STATE_BOUND, query)
            .await
            .expect("answered once the job changed")
            .unwrap()
            .unwrap();
        assert_eq!(response.status(), 200);
        assert!(index_of(&response) > index);
    }
    let unknown = client
        .get(&format!("/jobs/nope?index={index}&wait=30s"))
        .await;
    assert_eq!(unknown.status, 404, "at once, not after the wait");

    // The job's stream holds the job's own events and its copies', in order (leaving out
    // the copies' `Updated`, the placement pass writing why they wait, and the steps of the
    // job's deployment, whose timing is the deployment's: `deployments.rs` follows those).
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let event = web_events.next_event().await;
        assert_eq!(event["Job"], "web", "{event}");
        if event["Type"] == "Updated"
            || matches!(event["Topic"].as_str(), Some("Deployment" | "Queue"))
        {
            continue;
        }
        seen.push(format!(
            "{}:{}",
            event["Topic"].as_str().unwrap(),
            event["Type"].as_str().unwrap()
        ));
    }
    assert_eq!(
        seen,
        [
            "Job:JobRegistered",
            "Task:Submitted",
            "Job:JobScaled",
            "Task:Submitted"
        ]
    );
}

#[tokio::test]
async fn cube_status_watch_draws_again_when_a_task_is_submitted() {
    let (manager, _dir) = lone_manager();
    let mut watching = Command::new(env!("CARGO_BIN_EXE_cube"))
        .args(["status", "--watch"])
        .env("CUBE_MANAGER", manager.address())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = watching.stdout.take().unwrap();
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if lines.send(line.unwrap_or_default()).is_err() {
                return;
            }
        }
    });
    // The first drawing comes at once: an empty table.
    let first = received.recv_timeout(STATE_BOUND).expect("a first drawing");
    assert!(first.starts_with("--- cube status --watch"), "{first}");
    manager
        .client()
        .submit(&json!({"Name": "drawn-again", "Image": "cube-sample:latest"}))
        .await;
    loop {
        let line = received
            .recv_timeout(STATE_BOUND)
            .expect("a drawing with the task");
        if line.contains("drawn-again") {
            break;
        }
    }
    let _ = watching.kill();
    let _ = watching.wait();
    let (success, _, stderr) = cube_cli(&manager.address(), &["status", "--watch", "-o", "json"]);
    assert!(
        !success && stderr.contains("cube events -o json"),
        "{stderr}"
    );
}
