//! Several managers on etcd with `--acl --tls`, as a user meets them: real `cube manager`
//! processes sharing a real etcd cluster (`cube-test-support`), a real `cube worker` joined by
//! token, the real Docker engine. The managers share one cluster CA, so the worker and the CLI
//! know every one of them by the one fingerprint, through a leader kill too.

mod support;

use std::time::{Duration, Instant};

use cube_api::tls::{PeerRole, PinnedCaVerifier};
use cube_test_support::EtcdCluster;
use serde_json::{Value, json};
use support::{Client, ManagerProcess, WorkerProcess, cube_cli_env, unique_node, web_task};

/// A secret for `--tls-ca-secret`, written in `dir`.
fn secret_file(dir: &std::path::Path, text: &str) -> String {
    let path = dir.join("ca-secret");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

const SECRET: &str = "6f1d3c0b9a8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a392817060504";

/// The flags of a manager on `cluster` under `prefix`, with `--acl`, `--tls` when `tls`,
/// and more.
fn flags<'a>(endpoints: &'a str, prefix: &'a str, secret: &'a str, tls: bool) -> Vec<&'a str> {
    let mut flags = vec![
        "--etcd-endpoints",
        endpoints,
        "--etcd-prefix",
        prefix,
        "--leader-ttl",
        "2s",
        "--heartbeat-grace",
        "3s",
        "--acl",
    ];
    if tls {
        flags.extend(["--tls", "--tls-ca-secret", secret]);
    }
    flags
}

/// The CA fingerprint a manager said it uses (its log's `ca_fingerprint=`).
fn fingerprint_of(manager: &ManagerProcess) -> String {
    let log = manager.stderr();
    let at = log
        .find("ca_fingerprint=")
        .unwrap_or_else(|| panic!("no CA fingerprint in the manager's log: {log}"));
    log[at + "ca_fingerprint=".len()..]
        .chars()
        .take(64)
        .collect()
}

/// `HOST:PORT` of a manager.
fn address(manager: &ManagerProcess) -> String {
    manager
        .url
        .trim_start_matches("https://")
        .trim_start_matches("http://")
        .to_string()
}

/// An HTTPS client of `manager` that knows the cluster by `fingerprint` alone and sends
/// `token`, as the CLI does; a plain HTTP client (`fingerprint` unused) of a manager without
/// `--tls`.
fn client(manager: &ManagerProcess, fingerprint: &str, token: Option<&str>) -> Client {
    if manager.url.starts_with("http://") {
        return match token {
            Some(token) => Client::with_token(&manager.url, token),
            None => manager.client(),
        };
    }
    client_as(manager, fingerprint, None, token)
}

/// [`client`], presenting the certificate in `identity` if given.
fn client_as(
    manager: &ManagerProcess,
    fingerprint: &str,
    identity: Option<std::sync::Arc<cube_api::tls::CertSlot>>,
    token: Option<&str>,
) -> Client {
    let verifier = PinnedCaVerifier::new(fingerprint, Some(PeerRole::Manager)).unwrap();
    let config = cube_api::tls::client_config(verifier, identity).unwrap();
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(token) = token {
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
    }
    Client {
        base: manager.url.clone(),
        http: support::http_builder()
            .tls_backend_preconfigured((*config).clone())
            .default_headers(headers)
            .build()
            .unwrap(),
    }
}

/// Waits until every manager of `managers` (by index, those still running) names the same
/// leader, other than `not`, and that one serves; its index.
async fn await_leader(
    managers: &[Option<ManagerProcess>],
    fingerprint: &str,
    token: &str,
    not: Option<usize>,
) -> usize {
    let deadline = Instant::now() + support::STATE_BOUND;
    loop {
        let mut named = Vec::new();
        let mut leading = None;
        for (index, manager) in managers.iter().enumerate() {
            let Some(manager) = manager else { continue };
            let answer = client(manager, fingerprint, Some(token))
                .get("/leader")
                .await;
            named.push(answer.body["Leader"].as_str().map(str::to_string));
            if answer.body["IsLeader"] == true {
                leading = Some(index);
            }
        }
        if let Some(index) = leading
            && Some(index) != not
            && named.iter().all(|other| {
                other.as_deref() == Some(address(managers[index].as_ref().unwrap()).as_str())
            })
        {
            return index;
        }
        assert!(Instant::now() < deadline, "no agreed leader: {named:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until node `name`, as `client` reads it, is `Ready` with a heartbeat taken after
/// `after`.
async fn await_beating(client: &Client, name: &str, after: chrono::DateTime<chrono::Utc>) -> Value {
    let path = format!("/nodes/{name}");
    let what = format!("node {name} not beating since {after}");
    let poll = support::Poll::every(Duration::from_millis(50), support::STATE_BOUND);
    let beating = |answer: &support::Answer| {
        let beat = answer.body["LastHeartbeat"]
            .as_str()
            .and_then(|text| chrono::DateTime::parse_from_rfc3339(text).ok());
        answer.status == 200
            && answer.body["Status"] == "Ready"
            && beat.is_some_and(|beat| beat > after)
    };
    client.await_answer(&path, &what, poll, beating).await.body
}

/// Three managers with `--acl --tls` (`flags`) and `extra` on a fresh one-member etcd, each
/// in its own folder of a new temporary folder; each serves HTTPS. The etcd cluster and the
/// folder live as long as the values returned.
fn start_managers(extra: &[&str]) -> (EtcdCluster, tempfile::TempDir, Vec<Option<ManagerProcess>>) {
    start_managers_with(true, extra)
}

/// [`start_managers`], with `--tls` only when `tls` (plain HTTP otherwise).
fn start_managers_with(
    tls: bool,
    extra: &[&str],
) -> (EtcdCluster, tempfile::TempDir, Vec<Option<ManagerProcess>>) {
    support::ensure_sample_image();
    let cluster = EtcdCluster::start(1);
    let endpoints = cluster.endpoints_flag();
    let prefix = format!("/cube-test-{}", uuid::Uuid::new_v4().simple());
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(dir.path(), SECRET);
    let managers = (0..3)
        .map(|n| {
            let mut flags = flags(&endpoints, &prefix, &secret, tls);
            flags.extend_from_slice(extra);
            let manager = ManagerProcess::start_with(
                "epvm",
                "etcd",
                &dir.path().join(format!("manager{n}")),
                0,
                &flags,
            );
            assert_eq!(manager.url.starts_with("https://"), tls, "{}", manager.url);
            Some(manager)
        })
        .collect();
    (cluster, dir, managers)
}

/// Bootstraps the ACL through `open` (any manager: a follower hands it to the leader, 503
/// while none leads yet): the management token.
async fn bootstrap(open: &Client) -> String {
    let deadline = Instant::now() + support::STATE_BOUND;
    loop {
        let answer = open
            .request_answer("POST", "/acl/bootstrap", Some("{}"))
            .await;
        if answer.status == 201 {
            return answer.body["Secret"].as_str().unwrap().to_string();
        }
        assert_eq!(answer.status, 503, "bootstrap: {}", answer.body);
        assert!(Instant::now() < deadline, "bootstrap: {}", answer.body);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A node token named `token_name`, made through `client` (a management token's), and a
/// worker `node` joined with it to the managers of `list` (comma-separated), beating every
/// 300 ms: the token and the worker.
async fn join_worker(
    client: &Client,
    dir: &std::path::Path,
    token_name: &str,
    node: &str,
    list: &str,
) -> (String, WorkerProcess) {
    let token = client
        .request_answer(
            "POST",
            "/acl/tokens",
            Some(&json!({"Role": "node", "Name": token_name}).to_string()),
        )
        .await;
    assert_eq!(token.status, 201, "{}", token.body);
    let token = token.body["Secret"].as_str().unwrap().to_string();
    let worker = WorkerProcess::start_with(
        node,
        "memory",
        &dir.join("worker"),
        &[
            "--join",
            list,
            "--token",
            &token,
            "--heartbeat-interval",
            "300ms",
        ],
    );
    (token, worker)
}

#[tokio::test]
async fn three_managers_with_acl_and_tls_share_one_ca_and_a_worker_and_the_cli_outlive_a_leader_kill()
 {
    let (_cluster, dir, mut managers) = start_managers(&[]);
    // One CA for all three: one fingerprint.
    let fingerprint = fingerprint_of(managers[0].as_ref().unwrap());
    for manager in managers.iter().flatten() {
        assert_eq!(fingerprint_of(manager), fingerprint, "{}", manager.stderr());
    }

    // Bootstrapped through any manager (a follower hands it to the leader).
    let management = bootstrap(&client(managers[2].as_ref().unwrap(), &fingerprint, None)).await;
    let leader = await_leader(&managers, &fingerprint, &management, None).await;
    let followers: Vec<usize> = (0..3).filter(|index| *index != leader).collect();

    // A worker joined by a node token; its list starts with a follower, so its registration,
    // certificate and beats are handed on to the leader with the node's certificate named.
    let leader_client = client(
        managers[leader].as_ref().unwrap(),
        &fingerprint,
        Some(&management),
    );
    let list = [followers[0], leader, followers[1]]
        .iter()
        .map(|index| address(managers[*index].as_ref().unwrap()))
        .collect::<Vec<_>>()
        .join(",");
    let name = unique_node("ha-tls");
    let (token, worker) = join_worker(&leader_client, dir.path(), "ha-join", &name, &list).await;
    assert!(token.ends_with(&fingerprint), "{token}");
    await_beating(&leader_client, &name, chrono::Utc::now()).await;
    let (first, _) = leader_client.run(&web_task("before-the-kill")).await;

    // The leader dies; another is elected; the worker beats on over TLS.
    managers[leader].take().unwrap().kill_9();
    let killed_at = chrono::Utc::now();
    let new_leader = await_leader(&managers, &fingerprint, &management, Some(leader)).await;
    let new_client = client(
        managers[new_leader].as_ref().unwrap(),
        &fingerprint,
        Some(&management),
    );
    await_beating(&new_client, &name, killed_at).await;
    new_client.await_state(&first, "Running").await;

    // The CLI, with the one fingerprint and every manager's address (the dead one first),
    // reaches the new leader and runs a new task there.
    let dead = list.split(',').nth(1).unwrap().to_string();
    let mut everyone = vec![dead.clone()];
    everyone.extend(list.split(',').filter(|a| *a != dead).map(str::to_string));
    let env = [
        ("CUBE_MANAGER", everyone.join(",")),
        ("CUBE_TOKEN", management.clone()),
        ("CUBE_CA_FINGERPRINT", fingerprint.clone()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (ok, stdout, stderr) = cube_cli_env(
        &env,
        &[
            "run",
            "--name",
            "after-the-kill",
            "--wait",
            support::SAMPLE_IMAGE,
        ],
    );
    assert!(ok, "{stdout}{stderr}");
    let (ok, stdout, stderr) = cube_cli_env(&env, &["status"]);
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains("after-the-kill"), "{stdout}");
    let (ok, stdout, stderr) = cube_cli_env(&env, &["node"]);
    assert!(ok, "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!(
            "Leader: {}",
            address(managers[new_leader].as_ref().unwrap())
        )),
        "{stdout}"
    );
    drop(worker);
}

#[tokio::test]
async fn two_managers_starting_at_once_on_an_empty_etcd_make_one_ca_and_another_secret_is_refused()
{
    let cluster = EtcdCluster::start(1);
    let endpoints = cluster.endpoints_flag();
    let prefix = format!("/cube-test-{}", uuid::Uuid::new_v4().simple());
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(dir.path(), SECRET);
    let flags = flags(&endpoints, &prefix, &secret, true);
    let managers: Vec<ManagerProcess> = std::thread::scope(|scope| {
        let started: Vec<_> = (0..2)
            .map(|n| {
                let data = dir.path().join(format!("manager{n}"));
                let flags = &flags;
                scope.spawn(move || ManagerProcess::start_with("epvm", "etcd", &data, 0, flags))
            })
            .collect();
        started.into_iter().map(|m| m.join().unwrap()).collect()
    });
    let fingerprints: Vec<String> = managers.iter().map(fingerprint_of).collect();
    assert_eq!(fingerprints[0], fingerprints[1]);
    // Each serves its own certificate of that CA: a client with the one fingerprint reaches
    // both (the TLS handshake would fail the request otherwise), once one of them leads.
    for manager in &managers {
        let deadline = Instant::now() + support::STATE_BOUND;
        loop {
            let answer = client(manager, &fingerprints[0], None).get("/health").await;
            if answer.status == 200 {
                break;
            }
            assert_eq!(answer.status, 503, "{}", answer.body);
            assert!(Instant::now() < deadline, "{}", answer.body);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // A third manager given another secret cannot open the CA's key: refused, saying why.
    let other = dir.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    let other_secret = secret_file(&other, "another secret of more than thirty-two characters");
    let (status, _, stderr) = support::cube_command(&[
        "manager",
        "-p",
        "0",
        "--store",
        "etcd",
        "--etcd-endpoints",
        &endpoints,
        "--etcd-prefix",
        &prefix,
        "--acl",
        "--tls",
        "--tls-ca-secret",
        &other_secret,
        "--data-dir",
        other.to_str().unwrap(),
    ]);
    assert!(!status.success());
    assert!(stderr.contains("--tls-ca-secret"), "{stderr}");
    assert!(stderr.contains(&fingerprints[0]), "{stderr}");
    // And one given no secret is told to give one.
    let (status, _, stderr) = support::cube_command(&[
        "manager",
        "-p",
        "0",
        "--store",
        "etcd",
        "--etcd-endpoints",
        &endpoints,
        "--etcd-prefix",
        &prefix,
        "--acl",
        "--tls",
        "--data-dir",
        other.to_str().unwrap(),
    ]);
    assert!(!status.success());
    assert!(stderr.contains("--tls-ca-secret"), "{stderr}");
}

#[tokio::test]
async fn cube_dev_with_tls_joins_its_worker_over_tls_and_runs_a_task() {
    let dir = tempfile::tempdir().unwrap();
    let name = unique_node("dev-tls");
    let dev = ManagerProcess::start_dev_with(&name, dir.path(), &["--tls"]);
    assert!(dev.url.starts_with("https://"), "{}", dev.url);
    let fingerprint = fingerprint_of(&dev);
    let open = client(&dev, &fingerprint, None);
    let answer = open
        .request_answer("POST", "/acl/bootstrap", Some("{}"))
        .await;
    assert_eq!(answer.status, 201, "{}", answer.body);
    let management = answer.body["Secret"].as_str().unwrap().to_string();
    let client = client(&dev, &fingerprint, Some(&management));
    let node = await_beating(&client, &name, chrono::Utc::now()).await;
    assert!(
        node["Address"]
            .as_str()
            .unwrap_or_default()
            .starts_with("https://"),
        "{node}"
    );
    client.run(&web_task("dev-over-tls")).await;
}

/// A node certificate for `name` from `ca`, in a slot a client can present.
fn node_certificate(
    ca: &cube_api::tls::Authority,
    name: &str,
) -> std::sync::Arc<cube_api::tls::CertSlot> {
    let issued = ca
        .issue(PeerRole::Node, name, &[], Duration::from_secs(3600))
        .unwrap();
    cube_api::tls::CertSlot::new(issued.certified_key().unwrap())
}

/// `PUT /nodes/{node}` with an empty report and `headers`, through `client`.
async fn report(client: &Client, node: &str, headers: &[(&str, &str)]) -> support::Answer {
    let mut request = client
        .http
        .put(format!("{}/nodes/{node}", client.base))
        .header("Content-Type", "application/json")
        .body("{}");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let body = response.json().await.unwrap_or(Value::Null);
    support::Answer { status, body }
}

#[tokio::test]
async fn on_etcd_a_node_reports_only_over_its_own_certificate_through_any_manager_and_no_header_says_otherwise()
 {
    // The user's own CA, given to both managers with its key: the test signs with it too.
    let ca = cube_api::tls::Authority::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    let key_file = dir.path().join("ca-key.pem");
    std::fs::write(&ca_file, ca.ca_pem()).unwrap();
    std::fs::write(&key_file, ca.key_pem().unwrap()).unwrap();
    let fingerprint = ca.fingerprint();
    let cluster = EtcdCluster::start(1);
    let endpoints = cluster.endpoints_flag();
    let prefix = format!("/cube-test-{}", uuid::Uuid::new_v4().simple());
    let managers: Vec<Option<ManagerProcess>> = (0..2)
        .map(|n| {
            Some(ManagerProcess::start_with(
                "epvm",
                "etcd",
                &dir.path().join(format!("manager{n}")),
                0,
                &[
                    "--etcd-endpoints",
                    &endpoints,
                    "--etcd-prefix",
                    &prefix,
                    "--leader-ttl",
                    "2s",
                    "--acl",
                    "--tls",
                    "--tls-ca",
                    ca_file.to_str().unwrap(),
                    "--tls-ca-key",
                    key_file.to_str().unwrap(),
                ],
            ))
        })
        .collect();
    for manager in managers.iter().flatten() {
        assert_eq!(fingerprint_of(manager), fingerprint);
    }
    let open = client(managers[0].as_ref().unwrap(), &fingerprint, None);
    let deadline = Instant::now() + support::STATE_BOUND;
    let management = loop {
        let answer = open
            .request_answer("POST", "/acl/bootstrap", Some("{}"))
            .await;
        if answer.status == 201 {
            break answer.body["Secret"].as_str().unwrap().to_string();
        }
        assert_eq!(answer.status, 503, "bootstrap: {}", answer.body);
        assert!(Instant::now() < deadline, "bootstrap: {}", answer.body);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let leader = await_leader(&managers, &fingerprint, &management, None).await;
    let leader = managers[leader].as_ref().unwrap();
    let follower = managers
        .iter()
        .flatten()
        .find(|manager| manager.url != leader.url)
        .unwrap();
    let token = client(leader, &fingerprint, Some(&management))
        .request_answer(
            "POST",
            "/acl/tokens",
            Some(&json!({"Role": "node", "Name": "b-join"}).to_string()),
        )
        .await;
    assert_eq!(token.status, 201, "{}", token.body);
    let token = token.body["Secret"].as_str().unwrap().to_string();

    // Node b's token over node a's certificate, through the follower: refused by the leader,
    // which judges the certificate the follower saw, naming it.
    let as_a = client_as(
        follower,
        &fingerprint,
        Some(node_certificate(&ca, "a")),
        Some(&token),
    );
    let answer = report(&as_a, "b", &[]).await;
    assert_eq!(answer.status, 403, "{}", answer.body);
    assert!(answer.message().contains("\"a\""), "{}", answer.message());
    // Claiming, straight to the leader, to be a manager handing on node b's certificate:
    // the claim is not a manager's certificate, so it changes nothing.
    let forged = [
        (
            "X-Cube-Forwarded-By",
            follower.url.trim_start_matches("https://"),
        ),
        ("X-Cube-Forwarded-Peer", "node:b"),
    ];
    let as_a_to_leader = client_as(
        leader,
        &fingerprint,
        Some(node_certificate(&ca, "a")),
        Some(&token),
    );
    let answer = report(&as_a_to_leader, "b", &forged).await;
    assert_eq!(answer.status, 403, "{}", answer.body);
    assert!(answer.message().contains("\"a\""), "{}", answer.message());
    let bare = client(leader, &fingerprint, Some(&token));
    let answer = report(&bare, "b", &forged).await;
    assert_eq!(answer.status, 403, "{}", answer.body);
    assert!(
        answer.message().contains("presented none"),
        "{}",
        answer.message()
    );
    // Through the follower with no certificate, the header is not believed either.
    let bare = client(follower, &fingerprint, Some(&token));
    let answer = report(&bare, "b", &forged[1..]).await;
    assert_eq!(answer.status, 403, "{}", answer.body);

    // Node b's own certificate gets past the check through the follower (to the report's
    // own validation).
    let as_b = client_as(
        follower,
        &fingerprint,
        Some(node_certificate(&ca, "b")),
        Some(&token),
    );
    let answer = report(&as_b, "b", &[]).await;
    assert_ne!(answer.status, 403, "{}", answer.body);
    assert_ne!(answer.status, 503, "{}", answer.body);
}

/// Managers that act for their own shards (`--shard-controllers`) with `--acl --tls`: a
/// request reaches its project's owner through any manager with the caller's token, a killed
/// owner's project moves to another that runs it on, and a read of every project gathers from
/// every manager over TLS.
#[tokio::test]
async fn with_shard_controllers_acl_and_tls_a_killed_owners_project_moves_and_every_project_is_read_through_any()
 {
    a_killed_owners_project_moves_and_every_project_is_read_through_any(true).await;
}

/// The same with `--acl` alone: requests and nodes' reports handed on between managers in
/// plain HTTP carry the caller's token, and the worker joins by token without TLS.
#[tokio::test]
async fn with_shard_controllers_and_acl_without_tls_a_killed_owners_project_moves_and_every_project_is_read_through_any()
 {
    a_killed_owners_project_moves_and_every_project_is_read_through_any(false).await;
}

async fn a_killed_owners_project_moves_and_every_project_is_read_through_any(tls: bool) {
    let (_cluster, dir, mut managers) = start_managers_with(tls, &["--shard-controllers"]);
    let fingerprint = if tls {
        fingerprint_of(managers[0].as_ref().unwrap())
    } else {
        String::new()
    };
    let management = bootstrap(&client(managers[2].as_ref().unwrap(), &fingerprint, None)).await;
    let leader = await_leader(&managers, &fingerprint, &management, None).await;
    let as_management = |managers: &[Option<ManagerProcess>], index: usize| {
        client(
            managers[index].as_ref().unwrap(),
            &fingerprint,
            Some(&management),
        )
    };
    // Every manager on the ring, each holding shards.
    let deadline = Instant::now() + support::STATE_BOUND;
    let ring = loop {
        let answer = as_management(&managers, leader).get("/shards").await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        let view: cube_types::shard::ShardsView = serde_json::from_value(answer.body).unwrap();
        if view.managers.len() == 3 && view.unowned.is_empty() {
            break view;
        }
        assert!(Instant::now() < deadline, "the ring: {view:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let list = (0..3)
        .map(|index| address(managers[index].as_ref().unwrap()))
        .collect::<Vec<_>>()
        .join(",");
    let name = unique_node("sharded-tls");
    let (_, worker) = join_worker(
        &as_management(&managers, leader),
        dir.path(),
        "sharded-join",
        &name,
        &list,
    )
    .await;
    for index in 0..3 {
        await_beating(&as_management(&managers, index), &name, chrono::Utc::now()).await;
    }

    // A project whose shard a manager other than the leader holds, created and given a task
    // through the third one.
    let owner = (0..3).find(|index| *index != leader).unwrap();
    let third = (0..3)
        .find(|index| *index != leader && *index != owner)
        .unwrap();
    let project = (0..)
        .map(|n| format!("tls-team-{n}"))
        .find(|project| {
            ring.holder(cube_types::shard::shard_of(project, 16))
                == Some(&address(managers[owner].as_ref().unwrap()))
        })
        .unwrap();
    let created = as_management(&managers, third)
        .post_raw("/projects", format!(r#"{{"Name": "{project}"}}"#))
        .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let submitted = as_management(&managers, third)
        .post_raw(
            &format!("/tasks?project={project}"),
            web_task("owned-elsewhere").to_string(),
        )
        .await;
    assert!(submitted.status < 300, "{}", submitted.body);
    let first = submitted.body["ID"].as_str().unwrap().to_string();
    as_management(&managers, leader)
        .await_state(&first, "Running")
        .await;

    // Its owner killed: the project moves; its task runs on, and a new one is placed by the
    // new owner, asked through the third manager.
    managers[owner].take().unwrap().kill_9();
    let deadline = Instant::now() + support::STATE_BOUND;
    let submitted = loop {
        let answer = as_management(&managers, third)
            .post_raw(
                &format!("/tasks?project={project}"),
                web_task("after-the-owner").to_string(),
            )
            .await;
        if answer.status < 300 {
            break answer;
        }
        // 503 while the shard is held by no one (within --leader-ttl).
        assert_eq!(answer.status, 503, "{}", answer.body);
        assert!(Instant::now() < deadline, "{}", answer.body);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let second = submitted.body["ID"].as_str().unwrap().to_string();
    as_management(&managers, third)
        .await_state(&second, "Running")
        .await;
    as_management(&managers, leader)
        .await_state(&first, "Running")
        .await;

    // Every project, read through either survivor over TLS: both tasks, once each.
    for index in [leader, third] {
        let every = as_management(&managers, index)
            .get("/tasks?project=*")
            .await;
        assert_eq!(every.status, 200, "{}", every.body);
        let mut ids: Vec<&str> = every
            .body
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|task| task["ID"].as_str())
            .collect();
        ids.sort();
        let mut expected = vec![first.as_str(), second.as_str()];
        expected.sort();
        assert_eq!(ids, expected, "{}", every.body);
    }
    // A read token of another project sees none of them.
    let reader = as_management(&managers, leader)
        .request_answer(
            "POST",
            "/acl/tokens",
            Some(
                &json!({"Role": "read", "Name": "elsewhere", "Projects": ["default"]}).to_string(),
            ),
        )
        .await;
    assert_eq!(reader.status, 201, "{}", reader.body);
    let reader = reader.body["Secret"].as_str().unwrap().to_string();
    let every = client(
        managers[third].as_ref().unwrap(),
        &fingerprint,
        Some(&reader),
    )
    .get("/tasks?project=*")
    .await;
    assert_eq!(every.status, 200, "{}", every.body);
    assert_eq!(
        every.body,
        json!([]),
        "a token of `default` reads no other project's tasks"
    );
    drop(worker);
}
