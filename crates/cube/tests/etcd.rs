//! Managers on etcd, as a user meets them: real `cube manager` and `cube worker` processes,
//! a real etcd cluster on loopback ports (`cube-test-support`), the real Docker engine.

mod support;

use cube_test_support::EtcdCluster;
use support::*;

fn etcd_manager(cluster: &EtcdCluster, dir: &std::path::Path, extra: &[&str]) -> ManagerProcess {
    let endpoints = cluster.endpoints_flag();
    let prefix = format!("/cube-test-{}", uuid::Uuid::new_v4().simple());
    let mut flags = vec!["--etcd-endpoints", &endpoints, "--etcd-prefix", &prefix];
    flags.extend_from_slice(extra);
    ManagerProcess::start_with("epvm", "etcd", dir, 0, &flags)
}

#[tokio::test]
async fn a_manager_on_a_three_member_etcd_runs_tasks_and_a_restarted_one_finds_them() {
    let cluster = EtcdCluster::start(3);
    let dir = tempfile::tempdir().unwrap();
    let endpoints = cluster.endpoints_flag();
    let prefix = format!("/cube-test-{}", uuid::Uuid::new_v4().simple());
    let flags = ["--etcd-endpoints", &endpoints, "--etcd-prefix", &prefix];
    let manager = ManagerProcess::start_with("epvm", "etcd", dir.path(), 0, &flags);
    let port = manager.port;
    let worker = manager.join_worker(&unique_node("etcd"), &[]);
    manager.await_ready_nodes(1).await;
    let (id, running) = manager.client().run(&web_task("on-etcd")).await;
    let container = running["ContainerID"].as_str().unwrap().to_string();

    manager.kill_9();
    let manager = ManagerProcess::start_with("epvm", "etcd", dir.path(), port, &flags);
    let task = manager.client().await_state(&id, "Running").await;
    assert_eq!(task["ContainerID"], container.as_str(), "nothing restarted");
    assert_eq!(task["RestartCount"], 0);
    drop(worker);
}

#[tokio::test]
async fn a_killed_etcd_member_changes_nothing_a_user_sees() {
    let mut cluster = EtcdCluster::start(3);
    let dir = tempfile::tempdir().unwrap();
    let manager = etcd_manager(&cluster, dir.path(), &[]);
    let _worker = manager.join_worker(&unique_node("member"), &[]);
    manager.await_ready_nodes(1).await;
    let client = manager.client();
    let (first, _) = client.run(&web_task("before-kill")).await;
    cluster.kill(0);
    let (second, _) = client.run(&web_task("after-kill")).await;
    let listed = client.get("/tasks").await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    for id in [&first, &second] {
        assert_eq!(
            client.get(&format!("/tasks/{id}")).await.body["State"],
            "Running"
        );
    }
}

#[test]
fn a_manager_on_an_etcd_nobody_answers_at_says_so_and_exits() {
    let dir = tempfile::tempdir().unwrap();
    let (status, _, stderr) = cube_command(&[
        "manager",
        "-p",
        "0",
        "--store",
        "etcd",
        "--etcd-endpoints",
        "127.0.0.1:1",
        "--data-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert!(!status.success());
    assert!(stderr.contains("127.0.0.1:1"), "{stderr}");
    assert!(stderr.contains("etcd"), "{stderr}");
}
