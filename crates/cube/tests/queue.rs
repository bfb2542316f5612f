//! The waiting list as a user meets it: with room for four tasks on two workers, six
//! requests make four claimed and two waiting in order; freed room goes to the head; a job is
//! let in whole or not at all; priority goes first; a request no node can hold today is
//! accepted with a warning and waits; `QueueTimeout` expires a request, which fails;
//! `--max-claimed-per-owner` holds an owner's second request; a manager killed and restarted
//! keeps the list; a list with nothing changing writes nothing; a finished batch job leaves
//! the list; `cube run --wait` prints the addresses, which answer. Real `cube` processes and
//! the real Docker engine.

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::*;

/// A manager and two workers of 256 MiB each: room for four tasks of 128 MiB.
struct FourSlots {
    manager: ManagerProcess,
    workers: Vec<WorkerProcess>,
    _dir: Option<tempfile::TempDir>,
}

impl FourSlots {
    async fn start(prefix: &str, manager_flags: &[&str]) -> FourSlots {
        let dir = tempfile::tempdir().unwrap();
        let manager = ManagerProcess::start_with("epvm", "memory", dir.path(), 0, manager_flags);
        let cluster = FourSlots::join(manager, prefix).await;
        FourSlots {
            _dir: Some(dir),
            ..cluster
        }
    }

    async fn join(manager: ManagerProcess, prefix: &str) -> FourSlots {
        let workers = (0..2)
            .map(|n| {
                manager.join_worker(
                    &unique_node(&format!("{prefix}{n}")),
                    &["--memory", "256MiB"],
                )
            })
            .collect();
        manager.await_ready_nodes(2).await;
        FourSlots {
            manager,
            workers,
            _dir: None,
        }
    }

    /// Submits a task of 128 MiB serving the sample page on a port Docker picks.
    async fn request(&self, name: &str, extra: Value) -> String {
        let mut task = json!({"Name": name, "Image": SAMPLE_IMAGE, "Memory": "128MiB",
                              "ExposedPorts": {"7777/tcp": {}}, "PortBindings": {"7777/tcp": ""}});
        if let (Some(task), Some(extra)) = (task.as_object_mut(), extra.as_object()) {
            task.extend(extra.clone());
        }
        self.manager.client().submit(&task).await
    }

    async fn queue(&self) -> Vec<Value> {
        let answer = self.manager.client().get("/queue").await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        answer.body.as_array().cloned().unwrap_or_default()
    }

    /// Polls `GET /queue` every 50 ms until `done` holds; fails after 30 s.
    async fn await_queue(&self, what: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let queue = self.queue().await;
            if done(&queue) {
                return queue;
            }
            assert!(
                Instant::now() < deadline,
                "the queue is not {what} within 30 s: {}",
                serde_json::to_string_pretty(&queue).unwrap()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn entry<'a>(queue: &'a [Value], id: &str) -> &'a Value {
    queue
        .iter()
        .find(|entry| entry["ID"] == id)
        .unwrap_or_else(|| panic!("{id} not in the queue: {queue:?}"))
}

fn states(queue: &[Value], ids: &[String]) -> Vec<String> {
    ids.iter()
        .map(|id| {
            entry(queue, id)["State"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

#[tokio::test]
async fn six_requests_on_room_for_four_claim_four_and_queue_two_and_freed_room_goes_to_the_head() {
    let cluster = FourSlots::start("six", &[]).await;
    let mut ids = Vec::new();
    for n in 0..6 {
        ids.push(cluster.request(&format!("six{n}"), json!({})).await);
    }
    let queue = cluster
        .await_queue("four claimed, two waiting", |queue| {
            queue.len() == 6
                && queue.iter().filter(|e| e["State"] == "claimed").count() == 4
                && queue.iter().filter(|e| e["State"] == "waiting").count() == 2
        })
        .await;
    assert_eq!(
        states(&queue, &ids),
        [
            "claimed", "claimed", "claimed", "claimed", "waiting", "waiting"
        ]
    );
    assert_eq!(entry(&queue, &ids[4])["Position"], 1);
    assert_eq!(entry(&queue, &ids[5])["Position"], 2);
    assert!(
        entry(&queue, &ids[4])["WaitingFor"]
            .as_str()
            .is_some_and(|why| why.contains("memory")),
        "{queue:?}"
    );
    let numbers: Vec<u64> = ids
        .iter()
        .map(|id| entry(&queue, id)["Queue"].as_u64().unwrap())
        .collect();
    assert!(
        numbers.windows(2).all(|pair| pair[0] < pair[1]),
        "{numbers:?}"
    );
    // Claimed: each with the address it answers at.
    let claimed = entry(&queue, &ids[0]);
    let address = claimed["Services"][0]["Ports"]["7777/tcp"]
        .as_str()
        .unwrap();
    let port: u16 = address.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(get_published(port, "/health").await, 200);

    // One claimed request stops: the head of the queue is claimed, the other moves up. How
    // soon is `cube-bench queue`'s to measure; `await_queue` waits generously.
    assert_eq!(
        cluster
            .manager
            .client()
            .delete(&format!("/tasks/{}", ids[0]))
            .await
            .status,
        204
    );
    let queue = cluster
        .await_queue("the head claimed", |queue| {
            queue.iter().all(|e| e["ID"] != ids[0].as_str())
                && entry(queue, &ids[4])["State"] == "claimed"
        })
        .await;
    assert_eq!(entry(&queue, &ids[5])["Position"], 1);
    assert_eq!(entry(&queue, &ids[5])["State"], "waiting");
}

#[tokio::test]
async fn a_job_is_let_in_whole_or_not_at_all() {
    let cluster = FourSlots::start("whole", &[]).await;
    // One task on each worker: 128 MiB free on each, 256 MiB in all.
    let fillers = [
        cluster.request("filler0", json!({})).await,
        cluster.request("filler1", json!({})).await,
    ];
    cluster
        .await_queue("both fillers claimed", |queue| {
            queue.iter().filter(|e| e["State"] == "claimed").count() == 2
        })
        .await;
    let job = json!({"Name": "trio", "Type": "service",
        "Groups": [{"Name": "api", "Count": 3,
                    "Update": {"MinHealthyTime": "0s"},
                    "Task": {"Image": SAMPLE_IMAGE, "Memory": "128MiB",
                             "ExposedPorts": {"7777/tcp": {}}, "PortBindings": {"7777/tcp": ""}}}]});
    let client = cluster.manager.client();
    let created = client.post_raw("/jobs", job.to_string()).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let waiting = client
        .await_job("trio", "waiting whole, its 3 copies made", |job| {
            // The entry may say so a moment before the job controller has made the copies.
            job["Queue"]["State"] == "waiting"
                && job["Queue"]["WaitingFor"]
                    .as_str()
                    .is_some_and(|why| why.contains("all 3 of its copies"))
                && job["Summary"]["api"]["Pending"] == 3
        })
        .await;
    // Two copies would fit, and none was started.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let still = client.get("/jobs/trio").await.body;
    assert!(
        live_tasks(&still)
            .iter()
            .all(|task| task["State"] == "Pending"
                && task["NodeName"].as_str().unwrap_or_default().is_empty()),
        "no copy holds room while the job waits: {still}"
    );
    assert_eq!(waiting["Summary"]["api"]["Pending"], 3, "{waiting}");
    for worker in &cluster.workers {
        let label = format!("cube.node={}", worker.name);
        assert_eq!(
            running_containers_with_label(&label).len(),
            1,
            "only the filler runs"
        );
    }

    for filler in &fillers {
        client.delete(&format!("/tasks/{filler}")).await;
    }
    let claimed = client
        .await_job("trio", "claimed", |job| job["Queue"]["State"] == "claimed")
        .await;
    assert_eq!(
        live_tasks(&claimed)
            .iter()
            .filter(|task| task["State"] == "Running")
            .count(),
        3,
        "{claimed}"
    );
    assert_eq!(
        claimed["Queue"]["Services"].as_array().map(Vec::len),
        Some(3)
    );
}

#[tokio::test]
async fn a_higher_priority_request_submitted_later_goes_ahead() {
    let cluster = FourSlots::start("prio", &[]).await;
    let mut ids = Vec::new();
    for n in 0..4 {
        ids.push(cluster.request(&format!("prio{n}"), json!({})).await);
    }
    cluster
        .await_queue("four claimed", |queue| {
            queue.iter().filter(|e| e["State"] == "claimed").count() == 4
        })
        .await;
    let low = cluster.request("low", json!({})).await;
    let high = cluster.request("high", json!({"Priority": 90})).await;
    let queue = cluster
        .await_queue("both waiting", |queue| {
            queue.iter().filter(|e| e["State"] == "waiting").count() == 2
        })
        .await;
    assert_eq!(entry(&queue, &high)["Position"], 1, "{queue:?}");
    assert_eq!(entry(&queue, &low)["Position"], 2, "{queue:?}");
    cluster
        .manager
        .client()
        .delete(&format!("/tasks/{}", ids[0]))
        .await;
    let queue = cluster
        .await_queue("the high one claimed", |queue| {
            entry(queue, &high)["State"] == "claimed"
        })
        .await;
    assert_eq!(entry(&queue, &low)["State"], "waiting");
    assert_eq!(entry(&queue, &low)["Position"], 1);
}

#[tokio::test]
async fn a_request_larger_than_every_node_is_accepted_with_a_warning_and_waits_saying_why() {
    let cluster = FourSlots::start("large", &[]).await;
    let accepted = cluster
        .manager
        .client()
        .post(&json!({"Name": "huge", "Image": SAMPLE_IMAGE, "Memory": "1GiB"}))
        .await;
    assert_eq!(accepted.status, 201, "{}", accepted.body);
    let warnings = accepted.body["Warnings"].to_string();
    assert!(
        warnings.contains("no node could hold it today")
            && warnings.contains("needs 1.0 GiB memory"),
        "{}",
        accepted.body
    );
    let huge = accepted.body["ID"].as_str().unwrap().to_string();
    // A job that fits no node whole, though each copy fits one: 5 × 128 MiB > 512 MiB.
    let job = json!({"Name": "wide", "Type": "service",
        "Groups": [{"Name": "api", "Count": 5,
                    "Task": {"Image": SAMPLE_IMAGE, "Memory": "128MiB"}}]});
    let accepted = cluster
        .manager
        .client()
        .post_raw("/jobs", job.to_string())
        .await;
    assert_eq!(accepted.status, 201, "{}", accepted.body);
    assert!(
        accepted.body["Warnings"]
            .to_string()
            .contains("its 5 copies need 640.0 MiB memory in all"),
        "{}",
        accepted.body
    );
    // `cube job run` says so on stderr, and is accepted.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("wider.json");
    let wider = json!({"Name": "wider", "Type": "batch",
        "Groups": [{"Name": "work", "Count": 5,
                    "Task": {"Image": SAMPLE_IMAGE, "Memory": "128MiB"}}]});
    std::fs::write(&file, wider.to_string()).unwrap();
    let (ok, stdout, stderr) = cube_cli(
        &cluster.manager.address(),
        &["job", "run", "--detach", file.to_str().unwrap()],
    );
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("warning: job wider: no node could hold it today: its 5 copies need"),
        "{stderr}"
    );
    assert!(!stdout.contains("warning"), "{stdout}");
    // Each waits in the queue, saying why.
    let queue = cluster
        .await_queue("all three waiting with a reason", |queue| {
            queue.len() == 3
                && queue.iter().all(|entry| {
                    entry["State"] == "waiting"
                        && entry["WaitingFor"]
                            .as_str()
                            .is_some_and(|why| why.contains("memory"))
                })
        })
        .await;
    assert!(
        entry(&queue, &huge)["WaitingFor"]
            .as_str()
            .unwrap()
            .contains("no node could hold it today"),
        "{queue:?}"
    );
}

#[tokio::test]
async fn a_request_that_waits_past_its_queue_timeout_expires_and_is_stopped() {
    let cluster = FourSlots::start("expire", &[]).await;
    for n in 0..4 {
        cluster.request(&format!("full{n}"), json!({})).await;
    }
    cluster
        .await_queue("four claimed", |queue| {
            queue.iter().filter(|e| e["State"] == "claimed").count() == 4
        })
        .await;
    let (ok, stdout, stderr) = cube_cli(
        &cluster.manager.address(),
        &[
            "run",
            "--wait",
            "--memory",
            "128MiB",
            "--queue-timeout",
            "1s",
            "--name",
            "impatient",
            SAMPLE_IMAGE,
        ],
    );
    assert!(!ok, "{stdout}");
    assert!(
        stderr.contains("expired in the queue") && stderr.contains("QueueTimeout"),
        "{stderr}"
    );
    let id = stdout.lines().next().unwrap().trim().to_string();
    let queue = cluster.queue().await;
    let expired = entry(&queue, &id);
    assert_eq!(expired["State"], "expired", "{expired}");
    assert!(
        expired["Reason"].as_str().unwrap().contains("memory"),
        "{expired}"
    );
    let task = cluster
        .manager
        .client()
        .get(&format!("/tasks/{id}"))
        .await
        .body;
    assert_eq!(
        task["DesiredState"], "Completed",
        "the request was stopped: {task}"
    );
    // An expiry is a failure, with the reason as the task's error, not a success.
    let ended = cluster
        .manager
        .client()
        .await_task(&id, "ended", |task| {
            matches!(task["State"].as_str(), Some("Completed" | "Failed"))
        })
        .await;
    assert_eq!(ended["State"], "Failed", "{ended}");
    assert!(
        ended["Error"].as_str().is_some_and(
            |error| error.contains("expired in the queue") && error.contains("QueueTimeout")
        ),
        "{ended}"
    );
}

#[tokio::test]
async fn a_finished_batch_job_leaves_the_queue_whether_it_completed_or_failed() {
    let cluster = FourSlots::start("batch", &[]).await;
    let client = cluster.manager.client();
    for (name, script) in [("done", "exit 0"), ("broken", "exit 1")] {
        let job = json!({"Name": name, "Type": "batch",
            "Groups": [{"Name": "work", "Count": 2,
                        "Task": {"Image": SAMPLE_IMAGE, "Memory": "64MiB",
                                 "Cmd": ["sh", "-c", script]}}]});
        let created = client.post_raw("/jobs", job.to_string()).await;
        assert_eq!(created.status, 201, "{}", created.body);
    }
    client
        .await_job("done", "complete", |job| job["Status"] == "complete")
        .await;
    client
        .await_job("broken", "failed", |job| job["Status"] == "failed")
        .await;
    // Nothing of them waits or holds room any more: neither is listed.
    let queue = cluster.await_queue("empty", |queue| queue.is_empty()).await;
    assert!(queue.is_empty());
    let metrics = http()
        .get(format!("{}/metrics", cluster.manager.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for state in ["waiting", "pending", "claimed"] {
        let line = format!("cube_queue_depth{{state=\"{state}\"}} 0");
        assert!(
            metrics.lines().any(|shown| shown == line),
            "{line} not in the metrics"
        );
    }
}

#[tokio::test]
async fn an_owner_at_its_limit_waits_though_there_is_room() {
    let cluster = FourSlots::start("owner", &["--max-claimed-per-owner", "1"]).await;
    let first = cluster.request("alice-1", json!({"Owner": "alice"})).await;
    let second = cluster.request("alice-2", json!({"Owner": "alice"})).await;
    let other = cluster.request("bob-1", json!({"Owner": "bob"})).await;
    let queue = cluster
        .await_queue("alice's first and bob's claimed", |queue| {
            queue.len() == 3
                && entry(queue, &first)["State"] == "claimed"
                && entry(queue, &other)["State"] == "claimed"
        })
        .await;
    let held = entry(&queue, &second);
    assert_eq!(held["State"], "waiting", "{held}");
    assert_eq!(held["Owner"], "alice");
    assert!(
        held["WaitingFor"]
            .as_str()
            .is_some_and(|why| why.contains("--max-claimed-per-owner 1")),
        "{held}"
    );
    // Her first one done, her second is let in.
    cluster
        .manager
        .client()
        .delete(&format!("/tasks/{first}"))
        .await;
    cluster
        .await_queue("alice's second claimed", |queue| {
            entry(queue, &second)["State"] == "claimed"
        })
        .await;
}

#[tokio::test]
async fn a_manager_killed_and_restarted_keeps_the_queue_its_numbers_states_and_positions() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let start = || ManagerProcess::start_with("epvm", "persistent", dir.path(), port, &[]);
    let cluster = FourSlots::join(start(), "crashq").await;
    let mut ids = Vec::new();
    for n in 0..6 {
        ids.push(cluster.request(&format!("crashq{n}"), json!({})).await);
    }
    let before = cluster
        .await_queue("four claimed, two waiting", |queue| {
            queue.iter().filter(|e| e["State"] == "claimed").count() == 4
                && queue.iter().filter(|e| e["State"] == "waiting").count() == 2
        })
        .await;
    // One more, acknowledged just before the crash.
    let last = cluster.request("crashq6", json!({})).await;
    let FourSlots {
        manager, workers, ..
    } = cluster;
    manager.kill_9();

    let manager = start();
    manager.await_ready_nodes(2).await;
    let cluster = FourSlots {
        manager,
        workers,
        _dir: None,
    };
    let after = cluster
        .await_queue("seven entries again", |queue| {
            queue.len() == 7 && queue.iter().filter(|e| e["State"] == "claimed").count() == 4
        })
        .await;
    let summary = |queue: &[Value], id: &String| {
        let entry = entry(queue, id);
        (
            entry["Queue"].as_u64(),
            entry["State"].as_str().map(str::to_string),
            entry["Position"].as_u64(),
        )
    };
    for id in &ids {
        assert_eq!(summary(&before, id), summary(&after, id), "{id}");
    }
    let newest = entry(&after, &last);
    assert_eq!(newest["State"], "waiting", "{newest}");
    assert_eq!(newest["Position"], 3, "{newest}");
    assert!(newest["Queue"].as_u64() > entry(&after, &ids[5])["Queue"].as_u64());
}

#[tokio::test]
async fn a_waiting_list_with_nothing_changing_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start_with("epvm", "persistent", dir.path(), 0, &[]);
    let cluster = FourSlots::join(manager, "quietq").await;
    for n in 0..6 {
        cluster.request(&format!("quietq{n}"), json!({})).await;
    }
    cluster
        .await_queue("four claimed, two waiting", |queue| {
            queue.iter().filter(|e| e["State"] == "claimed").count() == 4
                && queue.iter().filter(|e| e["State"] == "waiting").count() == 2
        })
        .await;
    let client = cluster.manager.client();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let revision = |health: Value| health["Revision"].as_u64().expect("a revision");
    let before = revision(client.get("/health").await.body);
    // Heartbeats come every 300 ms; each may look again at the waiting requests.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = revision(client.get("/health").await.body);
    assert_eq!(
        before, after,
        "the waiting list was written with nothing changed"
    );
}

/// Whether an address line carries a URL scheme (addresses are `host:port`).
fn line_has_scheme(text: &str) -> bool {
    text.contains("http://")
}

#[tokio::test]
async fn run_wait_prints_where_the_task_answers_and_it_answers_there() {
    let cluster = FourSlots::start("addr", &[]).await;
    let (ok, stdout, stderr) = cube_cli(
        &cluster.manager.address(),
        &[
            "run",
            "--wait",
            "--name",
            "addressed",
            "-p",
            "7777",
            SAMPLE_IMAGE,
        ],
    );
    assert!(ok, "{stderr}");
    assert_eq!(
        stdout.lines().count(),
        1,
        "stdout holds the ID alone: {stdout}"
    );
    assert!(!line_has_scheme(&stderr), "{stderr}");
    let line = stderr
        .lines()
        .find(|line| line.starts_with("addressed: "))
        .unwrap_or_else(|| panic!("no address line: {stderr}"));
    // addressed: 127.0.0.1:49153->7777/tcp
    let address = line
        .trim_start_matches("addressed: ")
        .split("->")
        .next()
        .unwrap();
    let port: u16 = address.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(get_published(port, "/health").await, 200, "{line}");
    let (ok, stdout, _) = cube_cli(&cluster.manager.address(), &["queue"]);
    assert!(ok);
    assert!(
        stdout.lines().next().unwrap().starts_with("POS") && stdout.contains("claimed"),
        "{stdout}"
    );
    let (ok, stdout, _) = cube_cli(&cluster.manager.address(), &["service", "addressed"]);
    assert!(ok);
    assert!(stdout.contains(address), "{stdout}");
}
