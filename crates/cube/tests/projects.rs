//! Projects as a user meets them, against real `cube manager` and `cube worker` processes and
//! the real Docker engine: two teams' tokens that see nothing of each other's tasks (404s,
//! empty lists, no events), the same task name running in both, a `*` token that sees both;
//! a quota that holds a request in the waiting list, saying so, until a task of the project is
//! stopped, and refuses one bigger than itself; its usage read again after a restart.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::{Client, ManagerProcess, unique_node, web_task};

async fn create_project(client: &Client, name: &str, quota: Value) {
    let answer = client
        .request_answer(
            "POST",
            "/projects",
            Some(&json!({"Name": name, "Quota": quota}).to_string()),
        )
        .await;
    assert_eq!(answer.status, 201, "project create {name}: {}", answer.body);
}

/// Submits `task` in `project` and returns its ID.
async fn submit_in(client: &Client, project: &str, task: &Value) -> String {
    let answer = client
        .request_answer(
            "POST",
            &format!("/tasks?project={project}"),
            Some(&task.to_string()),
        )
        .await;
    assert_eq!(answer.status, 201, "submit in {project}: {}", answer.body);
    answer.body["ID"].as_str().unwrap().to_string()
}

fn ids(list: &Value) -> Vec<String> {
    let mut ids: Vec<String> = list
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .map(|item| item["ID"].as_str().unwrap_or_default().to_string())
        .collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn a_teams_token_sees_nothing_of_another_teams_project() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start_with("epvm", "memory", dir.path(), 0, &["--acl"]);
    let management = support::bootstrap(&manager).await;
    let admin = Client::with_token(&manager.url, &management);
    let node = unique_node("proj");
    let _worker = support::join_with_node_token(&manager, &management, &node, "memory").await;
    create_project(&admin, "team-a", json!({})).await;
    create_project(&admin, "team-b", json!({})).await;
    let a_token = support::token_in(&manager, &management, "submit", &["team-a"]).await;
    let a = Client::with_token(&manager.url, &a_token);
    let b = Client::with_token(
        &manager.url,
        &support::token_in(&manager, &management, "submit", &["team-b"]).await,
    );
    let everyone = Client::with_token(
        &manager.url,
        &support::token_in(&manager, &management, "read", &["*"]).await,
    );

    // A's event stream, opened before anything runs: it must carry A's task and never B's.
    let a_events = http_events(&manager.url, &a_token, "team-a").await;

    // The same name in both projects: two tasks, each running.
    let in_a = submit_in(&a, "team-a", &web_task("web")).await;
    let in_b = submit_in(&b, "team-b", &web_task("web")).await;
    a.await_state(&in_a, "Running").await;
    b.await_state(&in_b, "Running").await;

    // A cannot see, stop, follow the logs of or exec into B's task: as if it did not exist.
    let missing = a.get(&format!("/tasks/{}", uuid_like())).await;
    assert_eq!(missing.status, 404);
    let hidden = a.get(&format!("/tasks/{in_b}")).await;
    assert_eq!(
        hidden.body["Message"]
            .as_str()
            .unwrap()
            .replace(&in_b, "ID"),
        missing.body["Message"]
            .as_str()
            .unwrap()
            .replace(&uuid_like(), "ID"),
        "the words of a task that is not there"
    );
    for (method, path, body) in [
        ("DELETE", format!("/tasks/{in_b}"), None),
        ("GET", format!("/tasks/{in_b}/logs?follow=true"), None),
        (
            "POST",
            format!("/tasks/{in_b}/exec"),
            Some(r#"{"Cmd": ["true"]}"#),
        ),
        ("GET", format!("/tasks/{in_b}/placement"), None),
        ("POST", format!("/tasks/{in_b}/restart"), None),
        ("GET", format!("/queue/task/{in_b}"), None),
    ] {
        let answer = a.request_answer(method, &path, body).await;
        assert_eq!(answer.status, 404, "{method} {path}: {}", answer.body);
        assert!(
            !answer.body.to_string().contains("team-b"),
            "{method} {path} names B's project: {}",
            answer.body
        );
    }
    // Lists leave B's task out; B's project itself is not there for A.
    assert_eq!(
        ids(&a.get("/tasks?project=team-a").await.body),
        [in_a.as_str()]
    );
    assert_eq!(ids(&a.get("/tasks?project=*").await.body), [in_a.as_str()]);
    assert_eq!(
        a.get("/tasks").await.body,
        json!([]),
        "default holds nothing"
    );
    assert_eq!(a.get("/tasks?project=team-b").await.status, 404);
    let projects: Vec<String> = a
        .get("/projects")
        .await
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|project| project["Name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(projects, ["team-a"]);
    assert_eq!(a.get("/projects/team-b").await.status, 404);
    // Its metrics carry A's project, not B's: not even the name.
    let metrics = support::http()
        .get(format!("{}/metrics", manager.url))
        .bearer_auth(&a_token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains(r#"project="team-a""#), "{metrics}");
    assert!(!metrics.contains("team-b"), "{metrics}");
    // Submitting into B's project is refused the same way.
    let into_b = a
        .request_answer(
            "POST",
            "/tasks?project=team-b",
            Some(&web_task("x").to_string()),
        )
        .await;
    assert_eq!(into_b.status, 404, "{}", into_b.body);

    // B's task still runs: A's stop reached nothing.
    assert_eq!(
        b.get(&format!("/tasks/{in_b}")).await.body["State"],
        "Running"
    );

    // A `*` token sees both, each with its project.
    let both = everyone.get("/tasks?project=*").await.body;
    let mut seen: Vec<(String, String)> = both
        .as_array()
        .unwrap()
        .iter()
        .map(|task| {
            (
                task["Project"].as_str().unwrap_or("default").to_string(),
                task["Name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("team-a".to_string(), "web".to_string()),
            ("team-b".to_string(), "web".to_string())
        ]
    );
    assert_eq!(everyone.get(&format!("/tasks/{in_b}")).await.status, 200);

    // A stops its own task; its events reached A's stream, and none of B's did.
    assert_eq!(a.delete(&format!("/tasks/{in_a}")).await.status, 204);
    a.await_state(&in_a, "Completed").await;
    let keys = a_events.await_key_then_close(&in_a, "Completed").await;
    assert!(keys.iter().any(|key| key == &in_a), "{keys:?}");
    assert!(
        !keys.iter().any(|key| key.contains(&in_b)),
        "B's task reached A's event stream: {keys:?}"
    );
}

/// A stand-in ID of a task that does not exist.
fn uuid_like() -> String {
    "0b4c5f1e-51d5-4c36-a4a5-5c8b3b7a9d10".to_string()
}

/// `GET /events?project=P` with a token, read in the background.
struct EventLog {
    keys: tokio::sync::watch::Receiver<Vec<(String, String)>>,
    task: tokio::task::JoinHandle<()>,
}

async fn http_events(base: &str, token: &str, project: &str) -> EventLog {
    let mut response = support::http()
        .get(format!("{base}/events?project={project}"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let (send, keys) = tokio::sync::watch::channel(Vec::new());
    let task = tokio::spawn(async move {
        let mut buffer = Vec::new();
        while let Ok(Some(chunk)) = response.chunk().await {
            buffer.extend_from_slice(&chunk);
            while let Some(end) = buffer.iter().position(|byte| *byte == b'\n') {
                let line: Vec<u8> = buffer.drain(..=end).collect();
                if let Ok(event) = serde_json::from_slice::<Value>(&line) {
                    let key = event["Key"].as_str().unwrap_or_default().to_string();
                    let kind = event["Type"].as_str().unwrap_or_default().to_string();
                    send.send_modify(|keys| keys.push((key, kind)));
                }
            }
        }
    });
    EventLog { keys, task }
}

impl EventLog {
    /// Waits for an event of `key` of type `kind`; returns every key seen.
    async fn await_key_then_close(mut self, key: &str, kind: &str) -> Vec<String> {
        let seen = tokio::time::timeout(
            support::STATE_BOUND,
            self.keys
                .wait_for(|keys| keys.iter().any(|(k, t)| k == key && t == kind)),
        )
        .await
        .is_ok_and(|found| found.is_ok());
        let keys: Vec<String> = self.keys.borrow().iter().map(|(k, _)| k.clone()).collect();
        assert!(seen, "no {kind} event of {key}: {keys:?}");
        self.task.abort();
        keys
    }
}

#[tokio::test]
async fn a_quota_holds_a_request_until_the_projects_usage_falls_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let port = support::free_port();
    let manager = ManagerProcess::start("epvm", "persistent", dir.path(), port);
    let node = unique_node("quota");
    let _worker = manager.join_worker(&node, &["--cpus", "4"]);
    manager.await_ready_nodes(1).await;
    let client = manager.client();
    create_project(&client, "small", json!({"Cpus": 1})).await;
    let one_cpu = |name: &str| {
        let mut task = web_task(name);
        task["Cpu"] = json!(1);
        task
    };

    let first = submit_in(&client, "small", &one_cpu("first")).await;
    client.await_state(&first, "Running").await;
    let mut quota_events = support::EventReader::open(&manager, "?topic=Quota&project=small").await;
    // The node has room for three more; the project's quota has none.
    let second = submit_in(&client, "small", &one_cpu("second")).await;
    let waiting = client
        .await_task(&second, "a quota reason", |task| {
            task["PendingReason"]
                .as_str()
                .is_some_and(|reason| reason.contains("quota of small: cpu 1/1"))
        })
        .await;
    assert_eq!(waiting["State"], "Pending", "{waiting}");
    let entry = client
        .await_answer(
            &format!("/queue/task/{second}"),
            "the waiting list's reason",
            support::Poll::every(Duration::from_millis(20), support::STATE_BOUND),
            |answer| {
                answer.body["WaitingFor"]
                    .as_str()
                    .is_some_and(|why| why.contains("quota of small"))
            },
        )
        .await;
    assert_eq!(entry.body["State"], "waiting", "{}", entry.body);
    let event = quota_events.next_event().await;
    assert_eq!(event["Type"], "QuotaWaiting", "{event}");
    assert_eq!(event["Key"], format!("task/{second}"), "{event}");
    assert_eq!(event["Project"], "small", "{event}");

    // Bigger than the quota itself: refused at once, naming the limit.
    let mut two = web_task("two");
    two["Cpu"] = json!(2);
    let refused = client
        .request_answer("POST", "/tasks?project=small", Some(&two.to_string()))
        .await;
    assert_eq!(refused.status, 422, "{}", refused.body);
    let why = refused.body["Message"].as_str().unwrap();
    assert!(
        why.contains("quota of project small") && why.contains("cpu"),
        "{why}"
    );

    // The usage is what the placed task declares, and the metrics say so.
    let status = client.get("/projects/small").await;
    assert_eq!(status.body["Usage"]["Cpus"], 1.0, "{}", status.body);
    assert_eq!(status.body["Usage"]["Tasks"], 1, "{}", status.body);
    let metrics = support::http()
        .get(format!("{}/metrics", manager.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(r#"cube_project_usage{project="small",resource="cpu"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"cube_project_quota{project="small",resource="cpu"} 1"#),
        "{metrics}"
    );

    // The manager started again reads the usage from the tasks: the second still waits.
    manager.terminate(Duration::from_secs(10));
    let manager = ManagerProcess::start("epvm", "persistent", dir.path(), port);
    let client = manager.client();
    manager.await_ready_nodes(1).await;
    let status = client.get("/projects/small").await;
    assert_eq!(status.body["Usage"]["Cpus"], 1.0, "{}", status.body);
    let still = client.get(&format!("/tasks/{second}")).await.body;
    assert_eq!(still["State"], "Pending", "{still}");

    // What `cube project status` shows of it.
    let (ok, stdout, stderr) =
        support::cube_cli(&manager.address(), &["project", "status", "small"]);
    assert!(ok, "{stderr}");
    let cpu = stdout
        .lines()
        .find(|line| line.starts_with("cpu"))
        .unwrap_or_default();
    assert_eq!(
        cpu.split_whitespace().collect::<Vec<_>>(),
        ["cpu", "1", "1"],
        "{stdout}"
    );
    assert!(stdout.contains("2 not ended, 1 waiting"), "{stdout}");
    // A manager alone holds every shard, and says so.
    assert!(
        stdout.contains(&format!(", held by {}", manager.address())),
        "{stdout}"
    );

    // A task of another project named without `--project`: the error says where it is.
    let address = manager.address();
    let short = &first[..8];
    let (ok, _, stderr) = support::cube_cli(&address, &["status", short]);
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "in project default; task first ({short}) is in project small: give --project small"
        )),
        "{stderr}"
    );
    let (ok, stdout, stderr) =
        support::cube_cli(&address, &["status", short, "--project", "small"]);
    assert!(ok && stdout.contains("first"), "{stderr}");
    let (ok, _, stderr) = support::cube_cli(&address, &["stop", "no-such-task"]);
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains(
            "in project default; list the tasks with: cube status, or every project's with: \
             cube status --project '*'"
        ),
        "{stderr}"
    );

    // The first stopped: the second is let in, and the stream says it stopped waiting.
    let mut quota_events = support::EventReader::open(&manager, "?topic=Quota&project=small").await;
    assert_eq!(client.delete(&format!("/tasks/{first}")).await.status, 204);
    client.await_state(&second, "Running").await;
    let event = quota_events.next_event().await;
    assert_eq!(event["Type"], "QuotaAdmitted", "{event}");
    assert_eq!(event["Key"], format!("task/{second}"), "{event}");
    let status = client.get("/projects/small").await;
    assert_eq!(status.body["Usage"]["Cpus"], 1.0, "{}", status.body);
}

fn web_job(count: u32) -> Value {
    json!({"Name": "web", "Groups": [{"Name": "api", "Count": count, "Task": web_task("")}]})
}

/// How many of the job's copies run, in `project`.
async fn running_copies(client: &Client, project: &str) -> usize {
    let job = client.get(&format!("/jobs/web?project={project}")).await;
    assert_eq!(job.status, 200, "{}", job.body);
    support::live_tasks(&job.body)
        .iter()
        .filter(|task| task["State"] == "Running")
        .count()
}

async fn await_running_copies(client: &Client, project: &str, count: usize) {
    let poll = support::Poll::every(Duration::from_millis(100), support::STATE_BOUND);
    client
        .await_answer(
            &format!("/jobs/web?project={project}"),
            &format!("{count} copies of web running in {project}"),
            poll,
            |answer| {
                support::live_tasks(&answer.body)
                    .iter()
                    .filter(|task| task["State"] == "Running")
                    .count()
                    == count
            },
        )
        .await;
}

#[tokio::test]
async fn the_same_job_name_in_two_projects_is_two_jobs() {
    let cluster = support::OneNodeCluster::start("jobs-proj").await;
    let client = cluster.manager.client();
    create_project(&client, "team-a", json!({})).await;
    create_project(&client, "team-b", json!({})).await;
    for (project, count) in [("team-a", 2), ("team-b", 1)] {
        let answer = client
            .request_answer(
                "POST",
                &format!("/jobs?project={project}"),
                Some(&web_job(count).to_string()),
            )
            .await;
        assert_eq!(answer.status, 201, "{project}: {}", answer.body);
        assert_eq!(answer.body["Job"]["Project"], project, "{}", answer.body);
    }
    await_running_copies(&client, "team-a", 2).await;
    await_running_copies(&client, "team-b", 1).await;
    assert_eq!(client.get("/jobs/web").await.status, 404, "none in default");
    let listed = client.get("/jobs?project=*").await.body;
    let mut projects: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|view| view["Job"]["Project"].as_str().unwrap_or("default"))
        .collect();
    projects.sort();
    assert_eq!(projects, ["team-a", "team-b"]);

    // Scaling one leaves the other as it was.
    let scaled = client
        .request_answer(
            "POST",
            "/jobs/web/scale?project=team-b",
            Some(r#"{"Group": "api", "Count": 3}"#),
        )
        .await;
    assert_eq!(scaled.status, 200, "{}", scaled.body);
    await_running_copies(&client, "team-b", 3).await;
    assert_eq!(running_copies(&client, "team-a").await, 2);

    // Stopping one stops its copies only.
    let stopped = client
        .request_answer("DELETE", "/jobs/web?project=team-a", None)
        .await;
    assert_eq!(stopped.status, 200, "{}", stopped.body);
    await_running_copies(&client, "team-a", 0).await;
    assert_eq!(running_copies(&client, "team-b").await, 3);
    let b = client.get("/jobs/web?project=team-b").await.body;
    assert_eq!(b["Stopped"], false, "{b}");
}
