//! Security as a user (or an attacker) meets it: a task cannot take over its host (a bind
//! mount of `/` that no worker's policy allows waits with the setting named, a pod goes to the
//! worker whose policy allows its bind mount, a privileged service refused at submission, a
//! bind mount under an allowed path run, every container with `no-new-privileges`), and a server cannot be held by a hostile client (slow
//! headers and slow bodies cut off within their limits while long answers go on, connections
//! beyond the per-client bound closed while other clients are served). Real `cube`
//! processes, the real Docker engine, raw TCP for the clients.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn docker_inspect(id: &str, format: &str) -> String {
    let output = Command::new("docker")
        .args(["inspect", "--format", format, id])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "docker inspect {id}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// `cube run -f FILE`: whether it succeeded, its output and its errors.
fn run_file(manager: &ManagerProcess, file: &Path) -> (bool, String, String) {
    cube_cli(
        &manager.address(),
        &["run", "-f", &file.display().to_string()],
    )
}

/// Waits until the task waits with a reason, and returns the reason.
async fn waiting_because(client: &Client, id: &str) -> String {
    let task = client
        .await_task(id, "a PendingReason", |task| {
            task["PendingReason"].as_str().is_some()
        })
        .await;
    assert_eq!(task["State"], "Pending", "{task}");
    task["PendingReason"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn a_bind_mount_of_the_root_no_worker_allows_waits_naming_the_setting() {
    let cluster = OneNodeCluster::start("secroot").await;
    let client = cluster.manager.client();
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "root.yml",
        "services:\n  a:\n    image: cube-sample:latest\n    volumes:\n      - /:/host\n",
    );
    // The worker reports its policy with its node: the manager does not send it a task it
    // would refuse, and the task waits (a worker that allows it may join), saying why.
    let (ok, stdout, stderr) = run_file(&cluster.manager, &file);
    assert!(ok, "{stderr}");
    let id = stdout.trim();
    let reason = waiting_because(&client, id).await;
    assert!(
        reason.contains(
            "host policy: services.a: bind mount of / is not under the node's \
             allowed_host_paths (none)"
        ),
        "{reason}"
    );
    let (ok, status, stderr) = cube_cli(&cluster.manager.address(), &["status", id]);
    assert!(ok, "{stderr}");
    assert!(
        status.contains("Pending") && status.contains("allowed_host_paths"),
        "{status}"
    );
    assert!(
        containers_with_label(&format!("cube.task-id={id}")).is_empty(),
        "a refused task creates no container"
    );

    // The Docker socket and the host's network, likewise.
    let socket = write(
        dir.path(),
        "socket.yml",
        "services:\n  a:\n    image: cube-sample:latest\n    volumes:\n      - //var/run/./docker.sock:/s\n",
    );
    let (ok, stdout, stderr) = run_file(&cluster.manager, &socket);
    assert!(ok, "{stderr}");
    let reason = waiting_because(&client, stdout.trim()).await;
    assert!(
        reason.contains("bind mount of /var/run/docker.sock"),
        "{reason}"
    );
    let host = write(
        dir.path(),
        "host.yml",
        "services:\n  a:\n    image: cube-sample:latest\n    network_mode: host\n",
    );
    let (ok, stdout, stderr) = run_file(&cluster.manager, &host);
    assert!(ok, "{stderr}");
    let reason = waiting_because(&client, stdout.trim()).await;
    assert!(reason.contains("allow_host_network"), "{reason}");
}

#[tokio::test]
async fn a_bind_mount_pod_goes_to_the_worker_whose_policy_allows_it() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    let manager = ManagerProcess::start("epvm", "memory", dir.path(), 0);
    let config = write(
        dir.path(),
        "worker.yaml",
        &format!("allowed_host_paths: [{}]\n", shared.display()),
    );
    let allowing = manager.join_worker(
        &unique_node("policy-allows"),
        &["--config", &config.display().to_string()],
    );
    let _strict = manager.join_worker(&unique_node("policy-strict"), &[]);
    manager.await_ready_nodes(2).await;
    let nodes = manager.client().get("/nodes").await.body;
    let reported = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|node| node["Name"] == allowing.name.as_str())
        .map(|node| node["HostPolicy"]["AllowedHostPaths"].clone());
    assert_eq!(
        reported,
        Some(json!([shared.display().to_string()])),
        "{nodes}"
    );
    let client = manager.client();
    let compose = format!(
        "services:\n  a:\n    image: cube-sample:latest\n    command: [\"sh\", \"-c\", \"sleep 3600\"]\n    volumes:\n      - {}:/data\n",
        shared.display()
    );
    let file = write(dir.path(), "bind.yml", &compose);
    // Each goes to the one worker that takes it, never to the other to be refused there.
    for _ in 0..3 {
        let (ok, stdout, stderr) = run_file(&manager, &file);
        assert!(ok, "{stderr}");
        let running = client.await_state(stdout.trim(), "Running").await;
        assert_eq!(running["NodeName"], allowing.name.as_str(), "{running}");
    }
    // A path neither allows: it waits, each node's policy named.
    let elsewhere = write(
        dir.path(),
        "elsewhere.yml",
        "services:\n  a:\n    image: cube-sample:latest\n    volumes:\n      - /etc:/host-etc\n",
    );
    let (ok, stdout, stderr) = run_file(&manager, &elsewhere);
    assert!(ok, "{stderr}");
    let reason = waiting_because(&client, stdout.trim()).await;
    assert!(
        reason.contains(&format!(
            "{}: host policy: services.a: bind mount of /etc is not under the node's \
             allowed_host_paths ({})",
            allowing.name,
            shared.display()
        )),
        "{reason}"
    );
}

#[tokio::test]
async fn a_privileged_service_is_refused_at_submission_naming_the_key() {
    let cluster = OneNodeCluster::start("secpriv").await;
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "priv.yml",
        "services:\n  a:\n    image: cube-sample:latest\n    privileged: true\n    cap_add: [SYS_ADMIN]\n",
    );
    let (ok, _, stderr) = run_file(&cluster.manager, &file);
    assert!(!ok);
    assert!(
        stderr
            .contains("services.a.privileged (line 4): refused: a task cannot take over its host")
            && stderr.contains("services.a.cap_add (line 5)"),
        "{stderr}"
    );
    // Straight to the API: the same refusal, as a 400.
    let answer = cluster
        .manager
        .client()
        .post(&json!({"Name": "p", "Pod": {"Compose": "services:\n  a:\n    image: x\n    pid: host\n"}}))
        .await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert!(
        answer.message().contains("services.a.pid"),
        "{}",
        answer.body
    );
}

#[tokio::test]
async fn a_bind_mount_under_an_allowed_path_runs_and_every_container_has_no_new_privileges() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::write(shared.join("hello"), "hello from the host\n").unwrap();
    let manager = ManagerProcess::start("epvm", "memory", dir.path(), 0);
    let config = write(
        dir.path(),
        "worker.yaml",
        &format!("allowed_host_paths: [{}]\n", dir.path().display()),
    );
    let worker = manager.join_worker(
        &unique_node("secallow"),
        &["--config", &config.display().to_string()],
    );
    manager.await_ready_nodes(1).await;
    let client = manager.client();
    let compose = format!(
        "services:\n  a:\n    image: cube-sample:latest\n    command: [\"sh\", \"-c\", \"cat /data/hello && sleep 3600\"]\n    volumes:\n      - {}/../shared:/data:ro\n",
        shared.display()
    );
    let file = write(dir.path(), "allowed.yml", &compose);
    let (ok, stdout, stderr) = run_file(&manager, &file);
    assert!(ok, "{stderr}");
    let id = stdout.trim().to_string();
    let task = client
        .await_task(&id, "every container running", |task| {
            task["State"] == "Running"
                && task["Containers"].as_array().is_some_and(|list| {
                    list.len() == 2 && list.iter().all(|c| c["Status"] == "running")
                })
        })
        .await;
    // A single container too.
    let (single, _) = client.run(&web_task("secallow-single")).await;
    let single = client.get(&format!("/tasks/{single}")).await.body;
    let mut ids: Vec<String> = task["Containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["ContainerID"].as_str().unwrap().to_string())
        .collect();
    ids.push(single["ContainerID"].as_str().unwrap().to_string());
    for container in &ids {
        let options = docker_inspect(container, "{{json .HostConfig.SecurityOpt}}");
        assert!(
            options.contains("no-new-privileges"),
            "container {container}: SecurityOpt {options}"
        );
    }
    // The service read the file through its mount.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (ok, logs, _) = cube_cli(&manager.address(), &["logs", "--container", "a", &id]);
        if ok && logs.contains("hello from the host") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no output from the mount: {logs}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(worker);
}

// ----- hostile clients -----

/// Limits short enough to watch: the defaults are 30 s and 60 s, both longer than
/// `STATE_BOUND`, so a cut-off within that bound is the flags' doing. How close to its limit a
/// cut-off comes is not asserted: the machine runs other tests at the same time.
const LIMIT_FLAGS: [&str; 4] = ["--header-timeout", "1s", "--body-timeout", "1s"];

/// Writes `bytes` one at a time, a second apart, until the server closes the connection or
/// answers; returns what it answered and when, from the first byte.
async fn trickle(address: &str, head: &[u8], bytes: &[u8]) -> (Vec<u8>, Duration) {
    let mut stream = TcpStream::connect(address).await.unwrap();
    let started = Instant::now();
    stream.write_all(head).await.unwrap();
    let mut answer = Vec::new();
    for byte in bytes {
        // A failed write means the server closed: read what it said.
        if stream.write_all(&[*byte]).await.is_err() {
            break;
        }
        let mut buffer = [0u8; 4096];
        match tokio::time::timeout(Duration::from_secs(1), stream.read(&mut buffer)).await {
            Err(_) => continue,
            Ok(Ok(0)) | Ok(Err(_)) => return (answer, started.elapsed()),
            Ok(Ok(read)) => answer.extend_from_slice(&buffer[..read]),
        }
        if answer.ends_with(b"}") {
            break;
        }
    }
    (answer, started.elapsed())
}

fn address_of(url: &str) -> String {
    url.trim_start_matches("http://").to_string()
}

#[tokio::test]
async fn slow_headers_and_slow_bodies_are_cut_off_by_their_limits_on_manager_and_worker() {
    ensure_sample_image();
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start_with("epvm", "memory", dir.path(), 0, &LIMIT_FLAGS);
    let worker = WorkerProcess::start_with(
        &unique_node("secslow"),
        "memory",
        &dir.path().join("worker"),
        &LIMIT_FLAGS,
    );
    let body = br#"{"Name": "slow", "Image": "cube-sample:latest"}"#;
    for url in [&manager.url, &worker.url] {
        let address = address_of(url);
        // Headers one byte a second (a minute's worth): the connection is closed, nothing
        // answered.
        let (answer, took) = trickle(
            &address,
            b"",
            b"GET /health HTTP/1.1\r\nHost: cube\r\nX-Slow: aaaaaaaaaaaaaaaaaaaa\r\n\r\n",
        )
        .await;
        assert!(
            answer.is_empty(),
            "{url}: {}",
            String::from_utf8_lossy(&answer)
        );
        assert!(took < STATE_BOUND, "{url}: slow headers held for {took:?}");
        // Headers at once, the body one byte a second (47 s' worth): 408, as JSON, naming the
        // limit, and the connection ends.
        let head = format!(
            "POST /tasks HTTP/1.1\r\nHost: cube\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let (answer, took) = trickle(&address, head.as_bytes(), body).await;
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 408"), "{url}: {text}");
        assert!(text.contains("connection: close"), "{url}: {text}");
        let json = &text[text.find('{').unwrap_or(0)..];
        let error: Value = serde_json::from_str(json).unwrap_or_else(|_| panic!("{text}"));
        assert_eq!(error["HTTPStatusCode"], 408, "{text}");
        assert!(error["Message"].as_str().unwrap().contains("1s"), "{text}");
        assert!(took < STATE_BOUND, "{url}: slow body held for {took:?}");
        // Answers may be long: a blocking query waits past both limits and still answers.
        let index = support::http()
            .get(format!("{url}/tasks"))
            .send()
            .await
            .unwrap()
            .headers()
            .get("X-Cube-Index")
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        let started = Instant::now();
        let answer = support::http()
            .get(format!("{url}/tasks?index={index}&wait=3s"))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200, "{url}");
        assert!(started.elapsed() >= Duration::from_millis(2500), "{url}");
        // And the server is well.
        assert_eq!(
            support::http()
                .get(format!("{url}/health"))
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
    }
}

/// Whether a connection is served: a request on it is answered 200.
async fn served(stream: &mut TcpStream) -> bool {
    if stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: cube\r\n\r\n")
        .await
        .is_err()
    {
        return false;
    }
    let mut buffer = [0u8; 64];
    match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buffer)).await {
        Ok(Ok(read)) => buffer[..read].starts_with(b"HTTP/1.1 200"),
        _ => false,
    }
}

async fn connect_from(source: &str, address: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    socket.connect(address.parse().unwrap()).await.unwrap()
}

#[tokio::test]
async fn connections_beyond_the_per_client_limit_are_closed_while_others_are_served() {
    ensure_sample_image();
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--max-connections-per-client", "4"];
    let manager = ManagerProcess::start_with("epvm", "memory", dir.path(), 0, &flags);
    let worker = WorkerProcess::start_with(
        &unique_node("secconn"),
        "memory",
        &dir.path().join("worker"),
        &flags,
    );
    for url in [&manager.url, &worker.url] {
        let address = address_of(url);
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(connect_from("127.0.0.1", &address).await);
        }
        for stream in &mut held {
            assert!(served(stream).await, "{url}: one of the first four");
        }
        let mut fifth = connect_from("127.0.0.1", &address).await;
        assert!(
            !served(&mut fifth).await,
            "{url}: a fifth connection was served"
        );
        // Another client address is served meanwhile.
        let mut other = connect_from("127.0.0.2", &address).await;
        assert!(
            served(&mut other).await,
            "{url}: another client was refused"
        );
        // One closed, one more is let in.
        drop(held.pop());
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let mut again = connect_from("127.0.0.1", &address).await;
            if served(&mut again).await {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{url}: the freed slot was never given back"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
