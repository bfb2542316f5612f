//! `cube-bench` as a user runs it: the binary itself, its errors and its exit codes. Being an
//! integration test, it also makes the test build produce `target/debug/cube-bench`, which
//! scripts/bench-smoke.sh and scripts/chaos.sh then run without a second build.

use std::path::Path;
use std::process::{Command, Output};

fn cube_bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cube-bench"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .output()
        .expect("cube-bench runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn write_history(dir: &Path, capacity_cpu_used: f64) -> String {
    let history = serde_json::json!({
        "seed": 7,
        "ops": [],
        "settled": {
            "tasks": [],
            "jobs": [],
            "containers": [],
            "container_nodes": [],
            "capacity": [{
                "node": "worker-1",
                "at_us": 1000,
                "cpu_used": capacity_cpu_used,
                "cpu_total": 1.0,
                "memory_used": 0,
                "memory_total": 1_000_000_000u64
            }]
        }
    });
    let path = dir.join(format!("history-{capacity_cpu_used}.json"));
    std::fs::write(&path, history.to_string()).expect("history written");
    path.display().to_string()
}

#[test]
fn help_names_every_benchmark_and_the_chaos_run() {
    let out = cube_bench(&["--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    for command in [
        "start-latency",
        "burst",
        "scale",
        "rolling",
        "queue",
        "pod",
        "recovery",
        "footprint",
        "store",
        "etcd",
        "chaos",
        "chaos-check",
        "sim-workers",
    ] {
        assert!(
            help.contains(&format!("\n  {command} ")),
            "`cube-bench --help` does not list {command}:\n{help}"
        );
    }
}

#[test]
fn chaos_check_passes_a_clean_history_and_fails_one_with_an_overcommitted_node() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let clean = cube_bench(&["chaos-check", &write_history(dir.path(), 0.5)]);
    assert!(clean.status.success(), "{}", text(&clean.stderr));
    assert!(text(&clean.stdout).contains("every invariant held"));

    let over = cube_bench(&["chaos-check", &write_history(dir.path(), 1.5)]);
    assert_eq!(over.status.code(), Some(1), "{}", text(&over.stdout));
    let stdout = text(&over.stdout);
    assert!(
        stdout.contains("VIOLATION") && stdout.contains("worker-1"),
        "the violation names the node: {stdout}"
    );
    assert!(
        text(&over.stderr).contains("seed 7"),
        "{}",
        text(&over.stderr)
    );
}

#[test]
fn bad_input_is_named_with_a_non_zero_exit_and_no_backtrace() {
    let missing = cube_bench(&["chaos-check", "/nonexistent/history.json"]);
    assert_eq!(missing.status.code(), Some(1));
    let stderr = text(&missing.stderr);
    assert!(
        stderr.contains("cannot read the history /nonexistent/history.json"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");

    let dir = tempfile::tempdir().expect("a temporary directory");
    let garbage = dir.path().join("garbage.json");
    std::fs::write(&garbage, "{").expect("written");
    let out = cube_bench(&["chaos-check", &garbage.display().to_string()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("is not a chaos history"),
        "{}",
        text(&out.stderr)
    );

    let duration = cube_bench(&["chaos", "--duration", "xyz"]);
    assert_eq!(duration.status.code(), Some(2));
    assert!(
        text(&duration.stderr).contains("\"xyz\" is not a duration"),
        "{}",
        text(&duration.stderr)
    );
}
