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

/// Managers sharing one etcd cluster, all on one prefix, with a short leader TTL.
struct Managers {
    managers: Vec<Option<ManagerProcess>>,
    _dirs: Vec<tempfile::TempDir>,
}

const LEADER_TTL: std::time::Duration = std::time::Duration::from_secs(2);

impl Managers {
    fn start(cluster: &EtcdCluster, count: usize, extra: &[&str]) -> Managers {
        let endpoints = cluster.endpoints_flag();
        let prefix = format!("/cube-test-{}", uuid::Uuid::new_v4().simple());
        let mut managers = Vec::new();
        let mut dirs = Vec::new();
        for _ in 0..count {
            let dir = tempfile::tempdir().unwrap();
            let mut flags = vec![
                "--etcd-endpoints",
                &endpoints,
                "--etcd-prefix",
                &prefix,
                "--leader-ttl",
                "2s",
            ];
            flags.extend_from_slice(extra);
            managers.push(Some(ManagerProcess::start_with(
                "epvm",
                "etcd",
                dir.path(),
                0,
                &flags,
            )));
            dirs.push(dir);
        }
        Managers {
            managers,
            _dirs: dirs,
        }
    }

    fn get(&self, index: usize) -> &ManagerProcess {
        self.managers[index].as_ref().expect("a running manager")
    }

    /// Every running manager's address, comma-separated: `--manager` and `-m`.
    fn addresses(&self) -> String {
        self.managers
            .iter()
            .flatten()
            .map(ManagerProcess::address)
            .collect::<Vec<_>>()
            .join(",")
    }

    fn running(&self) -> Vec<usize> {
        (0..self.managers.len())
            .filter(|index| self.managers[*index].is_some())
            .collect()
    }

    /// Waits until every running manager names the same leader, one of them, other than
    /// `not`; its index.
    async fn await_leader(&self, not: Option<&str>) -> usize {
        let deadline = std::time::Instant::now() + STATE_BOUND;
        loop {
            let mut named = Vec::new();
            for index in self.running() {
                let answer = self.get(index).client().get("/leader").await;
                named.push(answer.body["Leader"].as_str().map(str::to_string));
            }
            if let Some(Some(leader)) = named.first()
                && named
                    .iter()
                    .all(|other| other.as_deref() == Some(leader.as_str()))
                && Some(leader.as_str()) != not
                && let Some(index) = self
                    .running()
                    .into_iter()
                    .find(|index| self.get(*index).address() == *leader)
            {
                return index;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no agreed leader: {named:?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    fn join_worker(&self, name: &str) -> WorkerProcess {
        ensure_sample_image();
        let managers = self.addresses();
        let dir = self._dirs[0].path().join(name);
        WorkerProcess::start_with(
            name,
            "memory",
            &dir,
            &["--manager", &managers, "--heartbeat-interval", "300ms"],
        )
    }
}

#[tokio::test]
async fn three_managers_on_three_etcd_members_one_leads_and_every_one_takes_submissions() {
    let cluster = EtcdCluster::start(3);
    let managers = Managers::start(&cluster, 3, &[]);
    let leader = managers.await_leader(None).await;
    let _workers: Vec<WorkerProcess> = (0..2)
        .map(|n| managers.join_worker(&unique_node(&format!("several{n}"))))
        .collect();
    managers.get(1).await_ready_nodes(2).await;
    let mut ids = Vec::new();
    for index in 0..3 {
        for n in 0..2 {
            let client = managers.get(index).client();
            ids.push(client.submit(&web_task(&format!("via-{index}-{n}"))).await);
        }
    }
    for (n, id) in ids.iter().enumerate() {
        // Read back through another manager than the one that took it.
        managers
            .get((n + 1) % 3)
            .client()
            .await_state(id, "Running")
            .await;
    }
    let answer = managers.get((leader + 1) % 3).client().get("/leader").await;
    assert_eq!(answer.body["IsLeader"], false);
    assert_eq!(
        answer.body["Leader"],
        managers.get(leader).address().as_str()
    );

    // The command line takes the list and shows who leads.
    let (ok, stdout, stderr) = cube_cli_env(&[("CUBE_MANAGER", &managers.addresses())], &["node"]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains(&format!("Leader: {}", managers.get(leader).address())),
        "{stdout}"
    );
}

#[tokio::test]
async fn a_worker_whose_manager_died_heartbeats_to_another_and_the_cli_tries_the_next() {
    let cluster = EtcdCluster::start(1);
    let mut managers = Managers::start(&cluster, 2, &["--heartbeat-grace", "2s"]);
    let leader = managers.await_leader(None).await;
    let follower = 1 - leader;
    // The worker's list starts with the follower: its beats go there first.
    let ordered = format!(
        "{},{}",
        managers.get(follower).address(),
        managers.get(leader).address()
    );
    ensure_sample_image();
    let name = unique_node("beats");
    let dir = tempfile::tempdir().unwrap();
    let worker = WorkerProcess::start_with(
        &name,
        "memory",
        dir.path(),
        &["--manager", &ordered, "--heartbeat-interval", "300ms"],
    );
    managers.get(leader).await_ready_nodes(1).await;
    managers.managers[follower].take().unwrap().kill_9();
    // Past the grace, the node is still Ready: its beats reach the leader directly.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    managers.get(leader).await_ready_nodes(1).await;
    assert!(
        worker.stderr().contains("registered with the manager"),
        "{}",
        worker.stderr()
    );
    let (ok, stdout, stderr) = cube_cli_env(&[("CUBE_MANAGER", &ordered)], &["node"]);
    assert!(ok, "the dead first manager is skipped: {stderr}");
    assert!(stdout.contains(&name), "{stdout}");
}

#[tokio::test]
async fn a_leader_paused_past_its_ttl_has_its_writes_refused_and_steps_down() {
    let cluster = EtcdCluster::start(3);
    let managers = Managers::start(&cluster, 2, &["--heartbeat-grace", "1s"]);
    let first = managers.await_leader(None).await;
    let worker = managers.join_worker(&unique_node("paused"));
    managers.get(first).await_ready_nodes(1).await;
    let (id, running) = managers
        .get(first)
        .client()
        .run(&web_task("survives"))
        .await;

    managers.get(first).signal("-STOP");
    let paused = managers.get(first).address();
    // The other takes over once the lease expires.
    let second = 1 - first;
    let deadline = std::time::Instant::now() + LEADER_TTL * 4;
    loop {
        let answer = managers.get(second).client().get("/leader").await;
        if answer.body["IsLeader"] == true {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{}", answer.body);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    managers.get(first).signal("-CONT");

    // The resumed one believed it led, with a node silent past the grace (it was paused):
    // it tried to write the node's task Lost, and the fence refused it.
    let deadline = std::time::Instant::now() + STATE_BOUND;
    loop {
        let answer = managers.get(first).client().get("/leader").await;
        if answer.body["IsLeader"] == false
            && answer.body["Leader"] == managers.get(second).address().as_str()
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{}", answer.body);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let log = managers.get(first).stderr();
    assert!(
        log.contains("a write was refused: this manager no longer holds the leadership key"),
        "{paused} attempted no write after it resumed: {log}"
    );
    assert!(log.contains("stepped down"), "{log}");
    // Nothing it tried reached the store: the task runs on, untouched.
    let task = managers
        .get(second)
        .client()
        .get(&format!("/tasks/{id}"))
        .await
        .body;
    assert_eq!(task["State"], "Running", "{task}");
    assert_eq!(task["ContainerID"], running["ContainerID"]);
    assert_eq!(task["RestartCount"], 0);
    drop(worker);
}
