//! The `cube` command line as a new user meets it: `cube run IMAGE` with Docker's flags, task
//! files in JSON or YAML (or on stdin), `--wait`, `cube stop`, shell completion, and the
//! defects found by trying it: a closed stdout, an oversized file, a stop during a restart
//! backoff, the usage line after a typo. Real `cube` processes, the real Docker engine.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use support::*;

type Cluster = OneNodeCluster;

impl OneNodeCluster {
    /// Runs `cube ARGS` against this cluster's manager.
    fn cube(&self, args: &[&str]) -> (bool, String, String) {
        cube_cli(&self.manager.address(), args)
    }
}

/// Runs `cube ARGS` with `input` on its stdin; returns success, stdout and stderr.
fn cube_with_stdin(manager: &str, args: &[&str], input: &str) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cube"))
        .args(args)
        .env("CUBE_MANAGER", manager)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cube");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).unwrap();
    drop(stdin);
    let output = child.wait_with_output().unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

/// The task ID `cube run` printed on stdout.
fn printed_id(stdout: &str) -> String {
    let id = stdout.trim().to_string();
    assert!(
        uuid::Uuid::parse_str(&id).is_ok(),
        "not a task ID: {stdout:?}"
    );
    id
}

#[tokio::test]
async fn cube_run_image_publishes_a_docker_chosen_port_that_answers_health_checks() {
    let cluster = Cluster::start("run").await;
    let (ok, stdout, stderr) = cluster.cube(&[
        "run",
        "--name",
        "web",
        "-p",
        "7777",
        "--memory",
        "64Mi",
        "--cpus",
        "500m",
        "-e",
        "GREETING=hello",
        SAMPLE_IMAGE,
    ]);
    assert!(ok, "{stderr}");
    let id = printed_id(&stdout);
    assert!(stderr.contains("accepted"), "{stderr}");

    let client = cluster.manager.client();
    let running = client.await_state(&id, "Running").await;
    assert_eq!(running["Name"], "web");
    assert_eq!(running["Memory"], 64 * 1024 * 1024);
    assert_eq!(running["Cpu"], 0.5);
    assert_eq!(running["Env"], json!(["GREETING=hello"]));
    assert_eq!(running["PortBindings"], json!({"7777/tcp": ""}));
    let port = host_port(&running, "7777/tcp");
    assert_eq!(get_published(port, "/health").await, 200);
}

#[tokio::test]
async fn a_task_file_on_stdin_runs_and_a_yaml_file_runs_and_is_unchanged_when_sent_again() {
    let cluster = Cluster::start("in").await;
    let address = cluster.manager.address();
    let json_task = web_task("from-stdin").to_string();
    let (ok, stdout, stderr) = cube_with_stdin(&address, &["run", "-f", "-"], &json_task);
    assert!(ok, "{stderr}");
    let from_stdin = printed_id(&stdout);

    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("web.yaml");
    let id = uuid::Uuid::new_v4();
    std::fs::write(
        &yaml,
        format!(
            "# a web server\nID: {id}\nName: from-yaml\nImage: {SAMPLE_IMAGE}\nMemory: 64MiB\n\
             PortBindings:\n  7777/tcp: \"\"\nHealthCheck: /health\n"
        ),
    )
    .unwrap();
    let yaml = yaml.to_str().unwrap();
    let (ok, stdout, stderr) = cluster.cube(&["run", "-f", yaml]);
    assert!(ok, "{stderr}");
    assert_eq!(printed_id(&stdout), id.to_string());

    let client = cluster.manager.client();
    client.await_state(&from_stdin, "Running").await;
    let running = client.await_state(&id.to_string(), "Running").await;
    assert_eq!(running["Memory"], 64 * 1024 * 1024);

    let (ok, _, stderr) = cluster.cube(&["run", "-f", yaml]);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "task from-yaml ({}) already exists, unchanged",
            &id.to_string()[..8]
        )),
        "{stderr}"
    );
}

/// `Env` written as a map and `Cmd` as one string, as in a compose file: the container gets
/// the variables and the words docker-compose would give it, and the task reads back in lists.
#[tokio::test]
async fn a_yaml_task_with_an_env_map_and_a_command_string_runs_as_compose_would_run_it() {
    let cluster = Cluster::start("envmap").await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("hello.yaml");
    std::fs::write(
        &yaml,
        format!(
            "Name: compose-like\nImage: {SAMPLE_IMAGE}\nEnv:\n  GREETING: hello\n  COUNT: 3\n\
             Cmd: sh -c 'echo \"$GREETING x$COUNT\"; echo \"two  words\"'\n"
        ),
    )
    .unwrap();
    let (ok, stdout, stderr) = cluster.cube(&["run", "-f", yaml.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let id = printed_id(&stdout);
    let done = cluster.manager.client().await_state(&id, "Completed").await;
    assert_eq!(done["Env"], json!(["COUNT=3", "GREETING=hello"]));
    assert_eq!(
        done["Cmd"],
        json!([
            "sh",
            "-c",
            "echo \"$GREETING x$COUNT\"; echo \"two  words\""
        ])
    );
    let (ok, out, err) = cluster.cube(&["logs", &id]);
    assert!(ok, "{err}");
    assert_eq!(out, "hello x3\ntwo  words\n");
}

#[test]
fn a_yaml_mistake_is_reported_at_its_line_and_column_before_anything_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let unknown = dir.path().join("typo.yml");
    std::fs::write(&unknown, "Task:\n  Image: x\n  Memmory: 64MiB\nState: 2\n").unwrap();
    let (ok, _, stderr) = cube_cli("127.0.0.1:1", &["run", "-f", unknown.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        stderr.contains("typo.yml:3:3: Task.Memmory: unknown field `Memmory`"),
        "{stderr}"
    );
    assert!(!stderr.contains("cannot reach"), "{stderr}");

    let broken = dir.path().join("broken.yaml");
    std::fs::write(&broken, "Image: x\nCmd: [sh, -c\nName: y\n").unwrap();
    let (ok, _, stderr) = cube_cli("127.0.0.1:1", &["run", "-f", broken.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        stderr.contains("broken.yaml:") && stderr.contains("invalid YAML"),
        "{stderr}"
    );
    let place: Vec<&str> = stderr
        .split("broken.yaml:")
        .nth(1)
        .unwrap()
        .splitn(3, ':')
        .collect();
    assert!(
        place[0].parse::<u32>().is_ok() && place[1].parse::<u32>().is_ok(),
        "no line:column in {stderr}"
    );
}

#[tokio::test]
async fn run_wait_returns_once_the_task_runs_and_fails_with_the_error_of_a_failing_command() {
    let cluster = Cluster::start("wait").await;
    let (ok, stdout, stderr) = cluster.cube(&["run", "--wait", "-p", "7777", SAMPLE_IMAGE]);
    assert!(ok, "{stderr}");
    let id = printed_id(&stdout);
    // No look at the manager before this one: --wait itself must have seen it running.
    let task = cluster
        .manager
        .client()
        .get(&format!("/tasks/{id}"))
        .await
        .body;
    assert_eq!(task["State"], "Running", "{task}");
    assert!(stderr.contains("is Running"), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "a spinner was drawn on a stderr that is not a terminal: {stderr:?}"
    );

    let (ok, stdout, stderr) = cluster.cube(&[
        "run",
        "--wait",
        "--timeout",
        "30s",
        SAMPLE_IMAGE,
        "--",
        "/bin/sh",
        "-c",
        "exit 3",
    ]);
    assert!(!ok, "a failing task must fail the wait: {stdout} {stderr}");
    printed_id(&stdout);
    assert!(stderr.contains("failed (exit code 3)"), "{stderr}");
}

/// What `docker port` says the task's container publishes, one `7777/tcp -> IP:PORT` a line.
fn docker_port(task: &Value) -> Vec<String> {
    let id = task["ContainerID"].as_str().expect("a container ID");
    let output = Command::new("docker")
        .args(["port", id])
        .output()
        .expect("run docker port");
    assert!(output.status.success(), "docker port {id}: {output:?}");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// `-p IP:HOST:CONTAINER` and a task file's `"IP:PORT"` publish on that address of the node
/// only, as Docker's `HostIp`; `--wait` says what Docker bound; the port still counts as
/// taken on the node for a task that wants it on every address.
#[tokio::test]
async fn a_port_published_on_loopback_is_bound_there_only_and_wait_says_what_docker_bound() {
    let cluster = Cluster::start("loop").await;
    let port = free_port();
    let binding = format!("127.0.0.1:{port}:7777");
    let (ok, stdout, stderr) = cluster.cube(&[
        "run",
        "--wait",
        "--name",
        "lo",
        "-p",
        &binding,
        SAMPLE_IMAGE,
    ]);
    assert!(ok, "{stderr}");
    let id = printed_id(&stdout);
    let client = cluster.manager.client();
    let running = client.await_state(&id, "Running").await;
    assert_eq!(
        running["PortBindings"],
        json!({"7777/tcp": format!("127.0.0.1:{port}")})
    );
    assert_eq!(
        docker_port(&running),
        [format!("7777/tcp -> 127.0.0.1:{port}")]
    );
    assert_eq!(get_published(port, "/health").await, 200);
    assert!(
        stderr.contains(&format!(
            "lo: 127.0.0.1:{port}->7777/tcp (Docker bound 127.0.0.1:{port}: that address only)"
        )),
        "{stderr}"
    );

    // The same port on every address waits: a port is claimed on the whole node.
    let clash = client
        .submit(&json!({"Name": "clash", "Image": SAMPLE_IMAGE,
                        "PortBindings": {"7777/tcp": port.to_string()}}))
        .await;
    client
        .await_task(&clash, "waiting for the port", |task| {
            task["PendingReason"]
                .as_str()
                .is_some_and(|reason| reason.contains(&format!("port {port} taken")))
        })
        .await;

    // A task file may ask for a loopback port Docker chooses.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lo.json");
    std::fs::write(
        &file,
        json!({"Name": "lo-any", "Image": SAMPLE_IMAGE,
               "PortBindings": {"7777/tcp": "127.0.0.1:"}})
        .to_string(),
    )
    .unwrap();
    let (ok, stdout, stderr) = cluster.cube(&["run", "-f", file.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let running = client.await_state(&printed_id(&stdout), "Running").await;
    let bound = docker_port(&running);
    assert!(
        bound.len() == 1 && bound[0].starts_with("7777/tcp -> 127.0.0.1:"),
        "{bound:?}"
    );

    // A port on every address: --wait says so rather than show the node's loopback alone.
    let (ok, _, stderr) =
        cluster.cube(&["run", "--wait", "--name", "all", "-p", "7777", SAMPLE_IMAGE]);
    assert!(ok, "{stderr}");
    let line = stderr
        .lines()
        .find(|line| line.starts_with("all: "))
        .unwrap_or_else(|| panic!("no address line: {stderr}"));
    assert!(
        line.contains("(Docker bound 0.0.0.0:")
            && line.ends_with(&format!("every address of node {})", cluster.worker.name)),
        "{line}"
    );
}

#[tokio::test]
async fn run_wait_gives_up_after_its_timeout_with_the_reason_the_task_waits() {
    let cluster = Cluster::start("late").await;
    // A fixed host port that one task holds: a second task asking for it waits.
    let port = free_port().to_string();
    let binding = format!("{port}:7777");
    let (ok, _, stderr) = cluster.cube(&["run", "--wait", "-p", &binding, SAMPLE_IMAGE]);
    assert!(ok, "{stderr}");
    let (ok, _, stderr) = cluster.cube(&[
        "run",
        "--wait",
        "--timeout",
        "1s",
        "-p",
        &binding,
        SAMPLE_IMAGE,
    ]);
    assert!(!ok);
    assert!(
        stderr.contains("is not running after 1s: queued at position 1")
            && stderr.contains(&format!("port {port} taken")),
        "{stderr}"
    );
}

#[tokio::test]
async fn run_of_a_task_no_node_could_hold_today_is_accepted_and_warns_on_stderr() {
    let cluster = Cluster::start("huge").await;
    let (ok, stdout, stderr) = cluster.cube(&["run", "--memory", "100TiB", SAMPLE_IMAGE]);
    assert!(
        ok,
        "accepted: it waits for a node that can hold it: {stderr}"
    );
    assert!(
        stderr.contains("warning: task ")
            && stderr.contains("no node could hold it today: needs 100.0 TiB memory"),
        "{stderr}"
    );
    assert!(!stdout.contains("warning"), "{stdout}");
}

#[tokio::test]
async fn stop_wait_returns_once_the_task_ended_and_its_container_stopped() {
    let cluster = Cluster::start("stop").await;
    let (ok, stdout, stderr) = cluster.cube(&["run", "--wait", "--name", "to-stop", SAMPLE_IMAGE]);
    assert!(ok, "{stderr}");
    let id = printed_id(&stdout);

    let (ok, stdout, stderr) = cluster.cube(&["stop", "--wait", "to-stop"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("stopping to-stop"), "{stdout}");
    assert!(stdout.contains("Completed"), "{stdout}");
    let task = cluster
        .manager
        .client()
        .get(&format!("/tasks/{id}"))
        .await
        .body;
    assert_eq!(task["State"], "Completed", "{task}");
    assert!(
        running_containers_with_label(&format!("cube.task-id={id}")).is_empty(),
        "the container still runs after stop --wait"
    );
}

#[tokio::test]
async fn an_oversized_task_file_is_refused_with_its_size_and_the_limit_not_as_an_unreachable_manager()
 {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("epvm", "memory", dir.path(), 0);
    let big = dir.path().join("big.json");
    let padding = vec!["x".repeat(100); 12_000];
    let body = json!({"Image": SAMPLE_IMAGE, "Cmd": padding}).to_string();
    std::fs::write(&big, &body).unwrap();
    let (ok, _, stderr) = cube_cli(&manager.address(), &["run", "-f", big.to_str().unwrap()]);
    assert!(!ok);
    assert!(!stderr.contains("cannot reach"), "{stderr}");
    assert!(
        stderr.contains("big.json")
            && stderr.contains(&format!("{} bytes", body.len()))
            && stderr.contains("1048576 bytes"),
        "{stderr}"
    );
}

#[tokio::test]
async fn status_through_a_pipe_closed_after_one_line_ends_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("epvm", "memory", dir.path(), 0);
    let client = manager.client();
    // With no worker every task waits, Pending: thousands of rows without one container, more
    // than a pipe holds (64 KiB), so that `cube status` is still writing when the pipe closes.
    for n in 0..2000 {
        client
            .submit(&json!({"Name": format!("pipe-{n:04}-a-name-long-enough-to-fill-the-pipe"), "Image": SAMPLE_IMAGE}))
            .await;
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_cube"))
        .args(["status", "-m", &manager.address()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    {
        let mut reader = BufReader::new(child.stdout.take().unwrap());
        reader.read_line(&mut first).unwrap();
    }
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(first.contains("NAME"), "{first}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(status.code(), Some(0), "{status}: {stderr}");
}

#[test]
fn the_bash_completion_loads_and_zsh_and_fish_scripts_name_cube() {
    let bash = Command::new("bash")
        .args([
            "-c",
            &format!(
                "source <({} completion bash) && complete -p cube",
                env!("CARGO_BIN_EXE_cube")
            ),
        ])
        .output()
        .unwrap();
    assert!(
        bash.status.success(),
        "{}",
        String::from_utf8_lossy(&bash.stderr)
    );
    assert!(String::from_utf8_lossy(&bash.stdout).contains("cube"));
    for shell in ["zsh", "fish"] {
        let (ok, stdout, stderr) = cube_cli("127.0.0.1:1", &["completion", shell]);
        assert!(ok, "{stderr}");
        assert!(
            stdout.contains("cube") && stdout.contains("--manager"),
            "{shell}: {stdout}"
        );
    }
}

#[test]
fn the_usage_after_a_mistyped_flag_does_not_show_the_manager_flag_as_required() {
    let (ok, _, stderr) = cube_cli(
        "127.0.0.1:1",
        &["stop", "-m", "127.0.0.1:1", "some-task", "--bogus"],
    );
    assert!(!ok);
    assert!(
        stderr.contains("Usage: cube stop [OPTIONS] <ID>"),
        "{stderr}"
    );
    assert!(!stderr.contains("--manager <HOST:PORT> <ID>"), "{stderr}");
}

#[test]
fn a_manager_listening_on_every_interface_warns_that_anyone_can_drive_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_cube"))
        .args([
            "manager",
            "-H",
            "0.0.0.0",
            "-p",
            "0",
            "-d",
            "memory",
            "--data-dir",
        ])
        .arg(dir.path())
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("0.0.0.0"), "{line}");
    child.kill().unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("WARN") && stderr.contains("without authentication"),
        "{stderr}"
    );
}

#[tokio::test]
async fn stopping_a_task_that_waits_to_restart_cancels_the_restart_and_says_so() {
    let cluster = Cluster::start("flaky").await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("flaky.yaml");
    std::fs::write(
        &file,
        format!(
            "Name: flaky\nImage: {SAMPLE_IMAGE}\nCmd: [/bin/sh, -c, 'exit 3']\n\
             RestartPolicy: on-failure\nRestartDelay: 30s\n"
        ),
    )
    .unwrap();
    let (ok, stdout, stderr) = cluster.cube(&["run", "-f", file.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let id = stdout.lines().next().unwrap().trim().to_string();
    let client = cluster.manager.client();
    client
        .await_task(&id, "Failed, waiting to restart", |task| {
            task["State"] == "Failed" && task["NextRestart"].is_string()
        })
        .await;
    let (ok, stdout, stderr) = cluster.cube(&["stop", "flaky"]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains(&format!(
            "stopped flaky ({}): it was waiting to restart (restart cancelled)",
            &id[..8]
        )),
        "{stdout}"
    );
    assert!(!stdout.contains("already ended"), "{stdout}");
    let after = client.get(&format!("/tasks/{id}")).await.body;
    assert_eq!(after["DesiredState"], "Completed", "{after}");
    assert!(after["NextRestart"].is_null(), "{after}");
}

#[tokio::test]
async fn stopping_a_task_that_ended_for_good_says_so_and_succeeds() {
    let cluster = Cluster::start("ended").await;
    let (ok, stdout, stderr) = cluster.cube(&[
        "run",
        "--wait",
        "--name",
        "once",
        SAMPLE_IMAGE,
        "--",
        "/bin/sh",
        "-c",
        "exit 0",
    ]);
    assert!(ok, "{stderr}");
    let id = printed_id(&stdout);
    cluster.manager.client().await_state(&id, "Completed").await;
    let (ok, stdout, stderr) = cluster.cube(&["stop", "once"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("has already ended: Completed"), "{stdout}");
}

#[tokio::test]
async fn a_changed_file_sent_again_with_its_task_id_fails_with_the_differences() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("epvm", "memory", dir.path(), 0);
    let id = "0f5b3c2e-8d1a-4c6b-9e7f-1a2b3c4d5e6f";
    let file = dir.path().join("task.json");
    let write = |task: Value| std::fs::write(&file, task.to_string()).unwrap();
    write(json!({"ID": id, "Image": SAMPLE_IMAGE}));
    let run = || cube_cli(&manager.address(), &["run", "-f", file.to_str().unwrap()]);
    let (ok, _, stderr) = run();
    assert!(ok, "{stderr}");
    let (ok, stdout, stderr) = run();
    assert!(ok, "the same file again: {stderr}");
    assert!(
        format!("{stdout}{stderr}").contains("already exists, unchanged"),
        "{stdout}{stderr}"
    );
    write(json!({"ID": id, "Image": SAMPLE_IMAGE, "Memory": "64MiB"}));
    let (ok, stdout, stderr) = run();
    assert!(!ok, "{stdout}");
    assert!(stdout.is_empty(), "no task ID for a refused task: {stdout}");
    assert!(
        stderr.contains("differs from it in Memory") && stderr.contains("stop it"),
        "{stderr}"
    );
}

#[tokio::test]
async fn stop_and_rm_take_several_tasks_and_rm_force_stops_a_running_one_first() {
    let cluster = Cluster::start("several").await;
    let client = cluster.manager.client();
    let mut ids = Vec::new();
    for name in ["first", "second", "third"] {
        ids.push(client.run(&web_task(name)).await.0);
    }
    let (ok, stdout, stderr) = cluster.cube(&["stop", "--wait", "first", "second"]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("stopping first") && stdout.contains("stopping second"),
        "{stdout}"
    );
    for id in &ids[..2] {
        let task = client.get(&format!("/tasks/{id}")).await.body;
        assert_eq!(task["State"], "Completed", "{task}");
    }
    // One that cannot be found does not keep the others from being handled; the command fails
    // naming it.
    let (ok, _, stderr) = cluster.cube(&["rm", "first", "no-such-task", "second"]);
    assert!(!ok);
    assert!(
        stderr.contains("no-such-task") && stderr.contains("1 of 3 tasks not removed"),
        "{stderr}"
    );
    for id in &ids[..2] {
        assert_eq!(client.get(&format!("/tasks/{id}")).await.status, 404);
    }
    // A running task is refused by rm, and stopped then removed by rm -f.
    let (ok, _, stderr) = cluster.cube(&["rm", "third"]);
    assert!(!ok, "a running task was removed without -f");
    assert_eq!(
        client.get(&format!("/tasks/{}", ids[2])).await.status,
        200,
        "{stderr}"
    );
    let (ok, stdout, stderr) = cluster.cube(&["rm", "-f", "third"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("removed third"), "{stdout}");
    assert_eq!(client.get(&format!("/tasks/{}", ids[2])).await.status, 404);
    assert!(containers_with_label(&format!("cube.task-id={}", ids[2])).is_empty());
}
