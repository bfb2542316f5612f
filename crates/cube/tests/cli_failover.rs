//! The command line when a manager goes away or has no answer: real `cube manager`
//! processes, on a real etcd cluster (`cube-test-support`) where several share the work.
//! A command tries the next manager of its `-m` list, or the same one again while a leader
//! is elected, and says what happened when nothing answers: a manager that does not run, one
//! that took too long (its work may go on), one that answered 503 with its reason.

mod support;

use std::time::{Duration, Instant};

use cube_test_support::EtcdCluster;
use support::*;

/// Managers sharing one etcd cluster and one prefix, with `--leader-ttl ttl`, each with a
/// folder of its own under `dir`.
fn managers_on_etcd(
    cluster: &EtcdCluster,
    dir: &std::path::Path,
    count: usize,
    ttl: &str,
) -> Vec<ManagerProcess> {
    let endpoints = cluster.endpoints_flag();
    let prefix = format!("/cube-test-{}", uuid::Uuid::new_v4().simple());
    (0..count)
        .map(|n| {
            let dir = dir.join(format!("manager{n}"));
            std::fs::create_dir_all(&dir).unwrap();
            ManagerProcess::start_with(
                "epvm",
                "etcd",
                &dir,
                0,
                &[
                    "--etcd-endpoints",
                    &endpoints,
                    "--etcd-prefix",
                    &prefix,
                    "--leader-ttl",
                    ttl,
                ],
            )
        })
        .collect()
}

/// The index of the manager every one of `managers` names as the leader, once it serves.
async fn await_leader(managers: &[ManagerProcess]) -> usize {
    let deadline = Instant::now() + STATE_BOUND;
    loop {
        for (index, manager) in managers.iter().enumerate() {
            let answer = manager.client().get("/leader").await;
            if answer.body["IsLeader"] == true {
                return index;
            }
        }
        assert!(Instant::now() < deadline, "no manager leads");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_command_during_a_leader_kill_moves_past_the_dead_manager_and_waits_out_the_503s() {
    let cluster = EtcdCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let mut managers = managers_on_etcd(&cluster, dir.path(), 2, "5s");
    let leader = await_leader(&managers).await;
    let follower_address = managers[1 - leader].address();
    let dead_address = managers[leader].address();
    let answer = managers[1 - leader]
        .client()
        .post(&web_task("before-the-kill"))
        .await;
    assert_eq!(answer.status, 201, "{}", answer.body);

    managers.remove(leader).kill_9();
    // Until the dead leader's lease runs out, the one left answers 503: no manager leads.
    let answer = managers[0].client().get("/tasks").await;
    assert_eq!(answer.status, 503, "{}", answer.body);

    // The dead manager first: its refused connection moves the command on to the next,
    // whose 503s it asks again until the new leader answers.
    let list = format!("{dead_address},{follower_address}");
    let (ok, stdout, stderr) = cube_cli_env(&[("CUBE_MANAGER", &list)], &["status"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("before-the-kill"), "{stdout}");
}

#[tokio::test]
async fn a_cluster_without_a_leader_is_reported_with_the_managers_own_words_and_what_was_tried() {
    let cluster = EtcdCluster::start(1);
    // A lease longer than the command tries: no new leader comes in time.
    let dir = tempfile::tempdir().unwrap();
    let mut managers = managers_on_etcd(&cluster, dir.path(), 2, "120s");
    let leader = await_leader(&managers).await;
    managers.remove(leader).kill_9();
    let address = managers[0].address();
    let (ok, _, stderr) = cube_cli(&address, &["status"]);
    assert!(!ok);
    assert!(!stderr.contains("is it running"), "{stderr}");
    assert!(stderr.contains("unavailable (503)"), "{stderr}");
    // The manager's own reason: the leader it knows does not answer, or none leads.
    assert!(
        stderr.contains("a new leader is elected within --leader-ttl"),
        "{stderr}"
    );
    assert!(
        stderr.contains("times in ") && stderr.contains(&address),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_manager_that_does_not_answer_in_time_is_said_to_have_timed_out_not_to_be_down() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("epvm", "memory", dir.path(), 0);
    // Paused, its port still takes connections (the kernel's backlog) and nothing answers.
    manager.signal("-STOP");
    let (ok, _, stderr) = cube_cli(&manager.address(), &["prune"]);
    manager.signal("-CONT");
    assert!(!ok);
    assert!(!stderr.contains("is it running"), "{stderr}");
    assert!(stderr.contains("gave no answer within 10 s"), "{stderr}");
    assert!(stderr.contains("may still be under way"), "{stderr}");
}

#[tokio::test]
async fn a_dead_manager_first_in_the_list_is_passed_over_for_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("epvm", "memory", dir.path(), 0);
    let list = format!("127.0.0.1:{},{}", free_port(), manager.address());
    let (ok, stdout, stderr) = cube_cli_env(
        &[("CUBE_MANAGER", &list)],
        &["run", "--name", "listed", SAMPLE_IMAGE],
    );
    assert!(ok, "{stderr}");
    let id = stdout.trim().to_string();
    let (ok, stdout, stderr) = cube_cli_env(&[("CUBE_MANAGER", &list)], &["status", &id]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("listed"), "{stdout}");
    // No manager at all: said at once, as before, with every address tried.
    let none = format!("127.0.0.1:{},127.0.0.1:{}", free_port(), free_port());
    let (ok, _, stderr) = cube_cli_env(&[("CUBE_MANAGER", &none)], &["status"]);
    assert!(!ok);
    assert!(stderr.contains("is it running"), "{stderr}");
}
