//! `cube job` as a user meets it: the example job file runs three real containers, a plan
//! says what a change would do and does nothing, a scale up and down, the status with its
//! group summary, a stop that leaves no container, and a mistake in a YAML job file named at
//! its line. Real `cube manager` and `cube worker` processes, the real Docker engine.

mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::*;

const EXAMPLE_YAML: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/job-web.yaml");
const EXAMPLE_JSON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/job-web.json");

impl OneNodeCluster {
    /// Runs `cube ARGS` against this cluster's manager.
    fn cube(&self, args: &[&str]) -> (bool, String, String) {
        cube_cli(&self.manager.address(), args)
    }

    /// The containers that run on this cluster's node: only the job's, in these tests.
    fn running_containers(&self) -> usize {
        running_containers_with_label(&format!("cube.node={}", self.worker.name)).len()
    }

    /// Waits (up to [`STATE_BOUND`]) until `count` containers run on the node.
    async fn await_running_containers(&self, count: usize) {
        let deadline = Instant::now() + STATE_BOUND;
        while self.running_containers() != count {
            assert!(
                Instant::now() < deadline,
                "{} containers run, not {count}, after {STATE_BOUND:?}",
                self.running_containers()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn job(&self, name: &str) -> Value {
        let answer = self.manager.client().get(&format!("/jobs/{name}")).await;
        assert_eq!(answer.status, 200, "GET /jobs/{name}: {}", answer.body);
        answer.body
    }
}

#[tokio::test]
async fn job_run_converges_to_three_running_copies_and_status_shows_the_group_summary() {
    let cluster = OneNodeCluster::start("job-run").await;
    let (ok, stdout, stderr) = cluster.cube(&["job", "run", "--timeout", "60s", EXAMPLE_YAML]);
    assert!(ok, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("job web: version ") && stdout.contains("(new)"),
        "{stdout}"
    );
    assert!(stdout.contains("api: 3/3 running"), "{stdout}");
    assert_eq!(cluster.running_containers(), 3);

    // The same job as JSON: the same spec, so nothing changes.
    let version = cluster.job("web").await["Version"].clone();
    let (ok, stdout, stderr) = cluster.cube(&["job", "run", "--timeout", "60s", EXAMPLE_JSON]);
    assert!(ok, "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("job web: version {version} (unchanged)")),
        "{stdout}"
    );

    let (ok, stdout, stderr) = cluster.cube(&["job", "status", "web"]);
    assert!(ok, "{stderr}");
    for expected in [
        "Name:",
        "GROUP   WANTED   PENDING   STARTING   RUNNING   FAILED   COMPLETE   LOST",
        "api     3        0         0          3         0        0          0",
        "ID         NAME         STATE     NODE",
        "web.api[0]",
        "web.api[2]",
    ] {
        assert!(stdout.contains(expected), "{expected:?} not in:\n{stdout}");
    }
    assert_eq!(stdout.matches("Running").count(), 3, "{stdout}");

    let (ok, stdout, stderr) = cluster.cube(&["job", "status"]);
    assert!(ok, "{stderr}");
    assert!(stdout.starts_with("NAME"), "{stdout}");
    assert!(
        stdout.lines().any(|line| line.starts_with("web ")
            && line.contains("service")
            && line.contains("running")
            && line.contains("api 3/3")),
        "{stdout}"
    );
    let (ok, stdout, _) = cluster.cube(&["job", "status", "-o", "json", "web"]);
    assert!(ok);
    let view: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(view["Summary"]["api"]["Running"], 3, "{view}");
}

#[tokio::test]
async fn job_plan_on_a_changed_count_says_what_would_change_and_changes_nothing() {
    let cluster = OneNodeCluster::start("job-plan").await;
    let (ok, stdout, stderr) = cluster.cube(&["job", "run", "--timeout", "60s", EXAMPLE_YAML]);
    assert!(ok, "{stdout}\n{stderr}");
    let before = cluster.job("web").await;

    let dir = tempfile::tempdir().unwrap();
    let smaller = dir.path().join("web.yaml");
    let text = std::fs::read_to_string(EXAMPLE_YAML).unwrap();
    std::fs::write(&smaller, text.replace("Count: 3", "Count: 2")).unwrap();
    let (ok, stdout, stderr) = cluster.cube(&["job", "plan", smaller.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("only counts changed; it stays version 1"),
        "{stdout}"
    );
    assert_eq!(
        stdout
            .lines()
            .filter(|line| line.starts_with("- web.api["))
            .count(),
        1,
        "{stdout}"
    );
    assert!(stdout.contains("= 2 unchanged"), "{stdout}");
    assert!(!stdout.contains("+ "), "{stdout}");

    let (ok, stdout, _) = cluster.cube(&["job", "plan", "-o", "json", smaller.to_str().unwrap()]);
    assert!(ok);
    let plan: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(plan["Changed"], true, "{plan}");
    assert_eq!(plan["Stop"].as_array().map(Vec::len), Some(1), "{plan}");

    // Nothing changed: the same version, the same three copies.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = cluster.job("web").await;
    assert_eq!(after["Version"], before["Version"]);
    assert_eq!(after["Job"], before["Job"]);
    assert_eq!(cluster.running_containers(), 3);
}

#[tokio::test]
async fn job_scale_up_and_down_then_stop_leaves_no_container_of_the_job_running() {
    let cluster = OneNodeCluster::start("job-scale").await;
    let (ok, stdout, stderr) = cluster.cube(&["job", "run", "--timeout", "60s", EXAMPLE_YAML]);
    assert!(ok, "{stdout}\n{stderr}");
    let version = cluster.job("web").await["Version"].clone();

    let (ok, stdout, stderr) = cluster.cube(&["job", "scale", "--wait", "web", "api", "5"]);
    assert!(ok, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("group api scaled to 5 (api: 5/5 running)"),
        "{stdout}"
    );
    assert_eq!(cluster.running_containers(), 5);

    // Without a flag, scale waits as job run does.
    let (ok, stdout, stderr) = cluster.cube(&["job", "scale", "web", "api", "1"]);
    assert!(ok, "{stdout}\n{stderr}");
    assert!(stdout.contains("api: 1/1 running"), "{stdout}");
    cluster.await_running_containers(1).await;
    // A scale is not a new version of the job.
    assert_eq!(cluster.job("web").await["Version"], version);

    let (ok, _, stderr) = cluster.cube(&["job", "scale", "web", "nosuchgroup", "2"]);
    assert!(!ok);
    assert!(stderr.contains("nosuchgroup"), "{stderr}");
    // --detach returns once the manager has the count.
    let (ok, stdout, stderr) = cluster.cube(&["job", "scale", "--detach", "web", "api", "2"]);
    assert!(ok, "{stdout}\n{stderr}");
    assert!(stdout.contains("group api scaled to 2"), "{stdout}");
    cluster.await_running_containers(2).await;

    let (ok, stdout, stderr) = cluster.cube(&["job", "stop", "--wait", "web"]);
    assert!(ok, "{stdout}\n{stderr}");
    assert!(stdout.contains("job web: stopped"), "{stdout}");
    let deadline = Instant::now() + STATE_BOUND;
    loop {
        let left = running_containers_with_label(&format!("cube.node={}", cluster.worker.name));
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "containers of the stopped job are left: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (ok, stdout, stderr) = cluster.cube(&["job", "status", "web"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("Status:      stopped"), "{stdout}");
}

#[test]
fn a_mistake_in_a_yaml_job_file_is_reported_at_its_line_before_anything_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.yaml");
    let text = std::fs::read_to_string(EXAMPLE_YAML).unwrap();
    std::fs::write(
        &file,
        text.replace("      Memory: 64MiB", "      Memmory: 64MiB"),
    )
    .unwrap();
    let line = text
        .lines()
        .position(|line| line.trim_start().starts_with("Memory:"))
        .unwrap()
        + 1;
    // No manager listens on port 1: the file is refused before any is asked.
    let (ok, _, stderr) = cube_cli("127.0.0.1:1", &["job", "run", file.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        stderr.contains(&format!(
            "web.yaml:{line}:7: Groups[0].Task.Memmory: unknown field `Memmory`; did you mean \
             `Memory`?"
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("cannot reach"), "{stderr}");

    std::fs::write(&file, text.replace("    Count: 3\n", "")).unwrap();
    let (ok, _, stderr) = cube_cli("127.0.0.1:1", &["job", "plan", file.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        stderr.contains("web.yaml:7:3: Groups[0].Count: missing"),
        "{stderr}"
    );
}

/// A batch job of `count` copies of the sample image's shell running `script`.
fn batch_job(dir: &std::path::Path, name: &str, count: u32, script: &str) -> String {
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &file,
        format!(
            "Name: {name}\nType: batch\nGroups:\n  - Name: work\n    Count: {count}\n    Task:\n      \
             Image: {SAMPLE_IMAGE}\n      Cmd: [sh, -c, \"{script}\"]\n"
        ),
    )
    .unwrap();
    file.to_str().unwrap().to_string()
}

#[tokio::test]
async fn a_batch_job_run_returns_once_every_copy_completed_and_fails_with_a_failed_copys_error() {
    let cluster = OneNodeCluster::start("job-batch").await;
    let dir = tempfile::tempdir().unwrap();
    let done = batch_job(dir.path(), "report", 2, "exit 0");
    let (ok, stdout, stderr) = cluster.cube(&["job", "run", "--timeout", "60s", &done]);
    assert!(ok, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("job report: complete (work: 2/2 complete)"),
        "{stdout}"
    );

    let failing = batch_job(dir.path(), "broken", 1, "exit 3");
    let (ok, stdout, stderr) = cluster.cube(&["job", "run", "--timeout", "60s", &failing]);
    assert!(
        !ok,
        "a failed copy must fail the command: {stdout}\n{stderr}"
    );
    assert!(
        stderr.contains("job broken failed: broken.work[0]")
            && stderr.contains("failed (exit code 3)"),
        "{stderr}"
    );
}
