//! What the `cube` command line prints, and which manager it reaches: every output format of
//! `cube status` and `cube node`, the flags before or after the command, ended tasks left out
//! unless asked for, and named clusters in a config file. Against a real manager and a real
//! worker, started as the user starts them.

mod support;

use serde_json::Value;
use support::*;

type Cluster = OneNodeCluster;

impl OneNodeCluster {
    /// `cube ARGS` against this cluster's manager; fails the test when the command fails.
    fn cli(&self, args: &[&str]) -> String {
        let (ok, stdout, stderr) = cube_cli(&self.manager.address(), args);
        assert!(ok, "cube {args:?} failed: {stderr}");
        stdout
    }
}

fn lines(text: &str) -> Vec<&str> {
    text.lines().collect()
}

fn yaml(text: &str) -> Value {
    serde_norway::from_str(text).unwrap_or_else(|err| panic!("not YAML ({err}):\n{text}"))
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|err| panic!("not JSON ({err}):\n{text}"))
}

#[tokio::test]
async fn every_output_format_of_cube_status_prints_the_tasks_it_says() {
    let cluster = Cluster::start("out").await;
    let (id, _) = cluster.manager.client().run(&web_task("formats-web")).await;

    let listed = json(&cluster.cli(&["status", "-o", "json"]));
    assert_eq!(listed[0]["ID"], id.as_str(), "{listed}");
    assert_eq!(listed[0]["State"], "Running");
    let listed = yaml(&cluster.cli(&["status", "-o", "yaml"]));
    assert_eq!(listed[0]["ID"], id.as_str(), "{listed}");
    assert_eq!(listed[0]["Name"], "formats-web");
    assert_eq!(
        listed[0]["HostPorts"]["7777/tcp"][0]["HostIp"], "0.0.0.0",
        "YAML holds the same objects as JSON: {listed}"
    );
    assert_eq!(
        lines(&cluster.cli(&["status", "-o", "name"])),
        vec!["formats-web"]
    );
    assert_eq!(lines(&cluster.cli(&["status", "-q"])), vec![id.as_str()]);

    let wide = cluster.cli(&["status", "-o", "wide"]);
    let header = wide.lines().next().unwrap_or_default();
    for column in [
        "ID", "STATE", "CPU", "MEMORY", "RESTARTS", "HEALTH", "PORTS",
    ] {
        assert!(header.contains(column), "{column} missing from {header:?}");
    }
    let table = cluster.cli(&["status"]);
    assert!(!table.contains("RESTARTS"), "{table}");

    // One task in each format, found by its name.
    let one = yaml(&cluster.cli(&["status", "formats-web", "-o", "yaml"]));
    assert_eq!(one["ID"], id.as_str());
    let one = json(&cluster.cli(&["status", "formats-web", "-o", "json"]));
    assert_eq!(one["ID"], id.as_str());
    assert_eq!(cluster.cli(&["status", "formats-web", "-q"]).trim(), id);
    let details = cluster.cli(&["status", "formats-web"]);
    for field in ["State:     Running", "Cpu:", "Memory:", "Container: "] {
        assert!(details.contains(field), "{field} missing from:\n{details}");
    }
    assert!(
        !details.contains("Desired:"),
        "a task that runs as asked has no Desired line:\n{details}"
    );
}

#[tokio::test]
async fn every_output_format_of_cube_node_prints_the_nodes_it_says() {
    let cluster = Cluster::start("outn").await;
    let name = cluster.worker.name.as_str();

    let listed = json(&cluster.cli(&["node", "-o", "json"]));
    assert_eq!(listed[0]["Name"], name, "{listed}");
    let listed = yaml(&cluster.cli(&["node", "-o", "yaml"]));
    assert_eq!(listed[0]["Name"], name, "{listed}");
    assert_eq!(listed[0]["Status"], "Ready");
    assert_eq!(lines(&cluster.cli(&["node", "-o", "name"])), vec![name]);
    assert_eq!(lines(&cluster.cli(&["node", "-q"])), vec![name]);
    let wide = cluster.cli(&["node", "-o", "wide"]);
    let header = wide.lines().next().unwrap_or_default();
    for column in ["NAME", "STATUS", "TASKS", "ADDRESS", "SOURCE", "HEARTBEAT"] {
        assert!(header.contains(column), "{column} missing from {header:?}");
    }
    assert!(wide.contains(&cluster.worker.url), "{wide}");
    let one = yaml(&cluster.cli(&["node", name, "-o", "yaml"]));
    assert_eq!(one["Name"], name);
}

#[tokio::test]
async fn the_output_flag_works_before_or_after_the_command() {
    let cluster = Cluster::start("outb").await;
    let name = cluster.worker.name.as_str();
    for args in [
        ["-o", "name", "node"],
        ["node", "-o", "name"],
        ["--output=name", "node", ""],
    ] {
        let args: Vec<&str> = args.into_iter().filter(|arg| !arg.is_empty()).collect();
        assert_eq!(lines(&cluster.cli(&args)), vec![name], "cube {args:?}");
    }
    let before = json(&cluster.cli(&["-o", "json", "status"]));
    let after = json(&cluster.cli(&["status", "-o", "json"]));
    assert_eq!(before, after);
    // The manager's address goes before the command too.
    let (ok, stdout, stderr) = cube_cli_env(
        &[],
        &["-m", &cluster.manager.address(), "-o", "name", "node"],
    );
    assert!(ok, "{stderr}");
    assert_eq!(lines(&stdout), vec![name]);
}

#[tokio::test]
async fn cube_status_hides_an_ended_task_unless_all_is_asked_for() {
    let cluster = Cluster::start("ended").await;
    let client = cluster.manager.client();
    let done = client.submit(&shell_task("ended-done", "exit 0")).await;
    client.await_state(&done, "Completed").await;
    let (running, _) = client.run(&shell_task("ended-runs", "sleep 600")).await;

    let table = cluster.cli(&["status"]);
    assert!(table.contains("ended-runs"), "{table}");
    assert!(!table.contains("ended-done"), "{table}");
    assert_eq!(
        table.lines().last(),
        Some("1 ended task not shown; cube status --all"),
        "{table}"
    );
    assert_eq!(
        lines(&cluster.cli(&["status", "-q"])),
        vec![running.as_str()]
    );
    let listed = json(&cluster.cli(&["status", "-o", "json"]));
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");

    let all = cluster.cli(&["status", "--all"]);
    let row = all
        .lines()
        .find(|line| line.contains("ended-done"))
        .unwrap_or_else(|| panic!("no row for the ended task in:\n{all}"));
    assert!(row.contains("Completed"), "{row}");
    assert!(!all.contains("not shown"), "{all}");
    assert_eq!(cluster.cli(&["status", "-a", "-q"]).lines().count(), 2);

    // Asked for by name, an ended task is found, without the desired state it no longer has.
    let details = cluster.cli(&["status", "ended-done"]);
    assert!(details.contains("State:     Completed"), "{details}");
    assert!(details.contains("ExitCode:  0"), "{details}");
    assert!(!details.contains("Desired:"), "{details}");
}

#[tokio::test]
async fn named_clusters_in_the_config_file_pick_the_manager() {
    // Two managers, no workers: a task submitted to one waits there, and the other has none.
    let dir = tempfile::tempdir().unwrap();
    let first = ManagerProcess::start("epvm", "memory", &dir.path().join("first"), 0);
    let second = ManagerProcess::start("epvm", "memory", &dir.path().join("second"), 0);
    let waiting = first
        .client()
        .submit(&shell_task("on-first", "sleep 600"))
        .await;
    let config = dir.path().join("config/cube.yaml");
    let config_env = [("CUBE_CONFIG", config.to_str().unwrap())];
    let cube = |args: &[&str]| {
        let (ok, stdout, stderr) = cube_cli_env(&config_env, args);
        assert!(ok, "cube {args:?} failed: {stderr}");
        stdout
    };

    cube(&[
        "config",
        "set-cluster",
        "first",
        "--manager",
        &first.address(),
    ]);
    cube(&["config", "set-cluster", "second", "-m", &second.address()]);
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(
        text.contains("current: first"),
        "the first cluster is current:\n{text}"
    );
    assert_eq!(lines(&cube(&["status", "-q"])), vec![waiting.as_str()]);

    cube(&["config", "use", "second"]);
    assert_eq!(cube(&["status", "-q"]), "", "the current cluster is second");
    assert_eq!(
        lines(&cube(&["--cluster", "first", "status", "-q"])),
        vec![waiting.as_str()]
    );
    assert_eq!(
        lines(&cube(&["status", "-q", "--cluster", "first"])),
        vec![waiting.as_str()]
    );
    let list = cube(&["config", "list"]);
    let marked: Vec<&str> = list.lines().filter(|line| line.starts_with('*')).collect();
    assert_eq!(marked.len(), 1, "{list}");
    assert!(marked[0].contains("second") && marked[0].contains(&second.address()));
    let view = cube(&["config", "view"]);
    assert_eq!(yaml(&view)["current"], "second", "{view}");

    // -m and CUBE_MANAGER come before --cluster.
    let (ok, stdout, stderr) = cube_cli_env(
        &[config_env[0], ("CUBE_MANAGER", &second.address())],
        &["--cluster", "first", "status", "-q"],
    );
    assert!(ok, "{stderr}");
    assert_eq!(stdout, "");
    assert!(stderr.contains("--cluster first ignored"), "{stderr}");
    assert_eq!(
        lines(&cube(&["-m", &first.address(), "status", "-q"])),
        vec![waiting.as_str()]
    );
}

#[tokio::test]
async fn a_broken_config_file_or_an_unknown_cluster_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    let path = config.to_str().unwrap();
    std::fs::write(
        &config,
        "current: prod\nclusters:\n  prod: {manager: 127.0.0.1:1}\n  dev: {managr: x}\n",
    )
    .unwrap();
    let (ok, _, stderr) = cube_cli_env(&[("CUBE_CONFIG", path)], &["status"]);
    assert!(!ok, "a broken config file fails the command");
    assert!(
        stderr.contains(path) && stderr.contains("line 4") && stderr.contains("managr"),
        "the error names the file, the line and the field: {stderr}"
    );
    // An explicit address does not need the file.
    let (_, _, stderr) = cube_cli_env(
        &[("CUBE_CONFIG", path), ("CUBE_MANAGER", "127.0.0.1:1")],
        &["status"],
    );
    assert!(stderr.contains("cannot reach the manager"), "{stderr}");

    std::fs::write(&config, "clusters:\n  prod: {manager: 127.0.0.1:1}\n").unwrap();
    let (ok, _, stderr) = cube_cli_env(&[("CUBE_CONFIG", path)], &["--cluster", "qa", "node"]);
    assert!(!ok);
    assert!(
        stderr.contains(path) && stderr.contains("\"qa\"") && stderr.contains("(prod)"),
        "{stderr}"
    );
    let (ok, _, stderr) = cube_cli_env(&[("CUBE_CONFIG", path)], &["config", "use", "qa"]);
    assert!(!ok);
    assert!(stderr.contains("no cluster named \"qa\""), "{stderr}");
    let (ok, _, stderr) = cube_cli_env(
        &[("CUBE_CONFIG", path)],
        &["config", "set-cluster", "qa", "--manager", ":5555"],
    );
    assert!(!ok, "an address without a host is refused");
    assert!(stderr.contains(":5555"), "{stderr}");
}

#[tokio::test]
async fn the_token_flag_works_before_the_command_as_the_other_manager_flags_do() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("epvm", "memory", dir.path(), 0);
    let (status, _, stderr) =
        cube_command(&["--token", "cube.unused", "-m", &manager.address(), "status"]);
    assert!(status.success(), "{stderr}");
}

#[tokio::test]
async fn cube_version_prints_yaml_as_the_listings_do() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("epvm", "memory", dir.path(), 0);
    let (ok, stdout, stderr) = cube_cli(&manager.address(), &["version", "-o", "yaml"]);
    assert!(ok, "{stderr}");
    let versions = yaml(&stdout);
    assert!(versions["Client"]["Version"].is_string(), "{stdout}");
    assert!(versions["Manager"]["Version"].is_string(), "{stdout}");
    assert_eq!(versions["Nodes"], Value::Array(Vec::new()), "{stdout}");
}

#[tokio::test]
async fn cube_events_follows_the_queue_topic_the_api_publishes() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("epvm", "memory", dir.path(), 0);
    // With no worker, the task waits in the queue: its entry's events are published, and
    // --index 0 shows the ones kept from before the command started.
    manager.client().submit(&web_task("queued")).await;
    let mut events = std::process::Command::new(env!("CARGO_BIN_EXE_cube"))
        .args([
            "events",
            "--topic",
            "queue",
            "--index",
            "0",
            "-m",
            &manager.address(),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = events.stdout.take().unwrap();
    let first = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stdout).lines().next()
    });
    let line = tokio::time::timeout(STATE_BOUND, first).await;
    events.kill().unwrap();
    let output = events.wait_with_output().unwrap();
    let line = line
        .expect("a Queue event within the bound")
        .unwrap()
        .unwrap_or_else(|| panic!("{}", String::from_utf8_lossy(&output.stderr)))
        .unwrap();
    assert!(line.contains(" Queue "), "{line}");
    assert!(line.contains("task"), "{line}");
}

#[test]
fn a_gc_after_beyond_a_day_is_refused_as_the_help_says() {
    // A manager that took the flag would start and serve: it is started on the memory store,
    // in a folder of the test's own, and killed (failing the test) if it has not refused
    // within the bound.
    let dir = tempfile::tempdir().unwrap();
    let mut manager = std::process::Command::new(env!("CARGO_BIN_EXE_cube"))
        .args(["manager", "-H", "127.0.0.1", "-p", "0", "-d", "memory"])
        .args(["--gc-after", "48h"])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + STATE_BOUND;
    let status = loop {
        if let Some(status) = manager.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            manager.kill().unwrap();
            panic!("cube manager --gc-after 48h started instead of refusing the flag");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut manager.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success());
    assert!(
        stderr.contains("--gc-after") && stderr.contains("longer than the limit of 24h"),
        "{stderr}"
    );
    let (_, help, _) = cube_command(&["manager", "--help"]);
    assert!(help.contains("At most 24h"), "{help}");
}

#[test]
fn cube_stop_help_says_the_container_is_kept() {
    let (status, help, _) = cube_command(&["stop", "--help"]);
    assert!(status.success());
    assert!(!help.contains("container gone"), "{help}");
    assert!(help.contains("container is kept"), "{help}");
}

#[test]
fn cube_restart_help_says_a_task_that_has_not_ended_is_refused_unlike_docker_restart() {
    let (status, help, _) = cube_command(&["restart", "--help"]);
    assert!(status.success());
    assert!(help.contains("docker restart"), "{help}");
    assert!(help.contains("refused"), "{help}");
    assert!(help.contains("cube stop --wait"), "{help}");
}
