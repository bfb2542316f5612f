//! Tokens and roles as a user meets them, against real `cube manager --acl` and `cube worker
//! --join` processes and the real Docker engine: every route of the manager's table refused
//! without a token (401) and with a weaker role (403) and taken with the right one; a revoked
//! or expired token refused at once; a node token that reports as its own node only, and a
//! second node refused its name; a joined worker that takes commands from its manager only;
//! the audit log; the command line's `--token`, `CUBE_TOKEN` and config file.

mod support;

use std::time::{Duration, Instant};

use cube_manager::acl::{Need, ROUTES};
use cube_types::token::Role;
use serde_json::{Value, json};
use support::{
    Client, ManagerProcess, WorkerProcess, containers_with_label, cube_cli_env,
    running_containers_with_label, unique_node, web_task,
};

/// A manager with `--acl` (memory store unless `dbtype` says) and its management token.
fn acl_manager(dbtype: &str) -> (ManagerProcess, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start_with("epvm", dbtype, dir.path(), 0, &["--acl"]);
    (manager, dir)
}

/// A new token of `role` named `name`, made with the management token.
async fn token(manager: &ManagerProcess, management: &str, role: &str, name: &str) -> Value {
    let answer = Client::with_token(&manager.url, management)
        .request_answer(
            "POST",
            "/acl/tokens",
            Some(&json!({"Role": role, "Name": name}).to_string()),
        )
        .await;
    assert_eq!(answer.status, 201, "token create: {}", answer.body);
    answer.body
}

fn secret(token: &Value) -> String {
    token["Secret"].as_str().unwrap().to_string()
}

/// A route pattern with its parameters filled in.
fn concrete(route: &str) -> String {
    route
        .replace("/tasks/{id}", "/tasks/0b4c5f1e-51d5-4c36-a4a5-5c8b3b7a9d10")
        .replace("/acl/tokens/{id}", "/acl/tokens/00000000000000aa")
        .replace("{name}", "no-such-node")
        .replace("{kind}", "task")
        .replace("{id}", "0b4c5f1e-51d5-4c36-a4a5-5c8b3b7a9d10")
        .replace("{asset}", "app.js")
}

const ROLES: [Role; 5] = [
    Role::Read,
    Role::Submit,
    Role::Operator,
    Role::Management,
    Role::Node,
];

#[tokio::test]
async fn every_route_but_health_needs_a_token_and_a_role_that_allows_it() {
    let (manager, _dir) = acl_manager("memory");
    let management = support::bootstrap(&manager).await;
    let mut clients = Vec::new();
    for role in ROLES {
        let made = token(&manager, &management, role.as_str(), &format!("t-{role}")).await;
        clients.push((role, Client::with_token(&manager.url, &secret(&made))));
    }
    let anonymous = manager.client();
    let mut checked = 0;
    for (method, route, need) in ROUTES {
        let path = concrete(route);
        let body = matches!(*method, "POST" | "PUT").then_some("{}");
        if route.starts_with("/ui") {
            // The web UI's page, script and style: open, and not JSON.
            assert_eq!(*need, Need::Open, "{method} {route}");
            let status = anonymous.request(method, &path, body).await;
            assert_eq!(status, 200, "{method} {route} without a token");
            continue;
        }
        let without = anonymous.request_answer(method, &path, body).await;
        match need {
            // `GET /tls/ca` is open, and 404 on a manager without --tls (`tls.rs` tests it).
            Need::Open if *route == "/tls/ca" => {
                assert_eq!(without.status, 404, "{method} {route} without a token");
                continue;
            }
            Need::Open => {
                assert_eq!(without.status, 200, "{method} {route} without a token");
                continue;
            }
            Need::Bootstrap => {
                assert_eq!(without.status, 409, "{method} {route} once bootstrapped");
                continue;
            }
            Need::Role(needed) => {
                assert_eq!(
                    without.status, 401,
                    "{method} {route} without a token: {}",
                    without.body
                );
                assert!(
                    without.message().contains(needed.as_str()),
                    "{method} {route}: the 401 names the role needed: {}",
                    without.body
                );
                for (role, client) in &clients {
                    let status = client.request(method, &path, body).await;
                    if role.allows(*needed) {
                        assert!(
                            status != 401 && status != 403,
                            "{method} {route} with a {role} token answered {status}"
                        );
                    } else {
                        assert_eq!(status, 403, "{method} {route} with a {role} token");
                    }
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 30, "only {checked} routes checked");
    // A token that is not one, and a made-up one of the right shape: 401.
    for text in [
        "nonsense",
        "cube.0123456789abcdef.0000000000000000000000000000000000000000000000000000000000000000",
    ] {
        let status = Client::with_token(&manager.url, text)
            .request("GET", "/tasks", None)
            .await;
        assert_eq!(status, 401, "token {text:?}");
    }
}

#[tokio::test]
async fn a_revoked_or_expired_token_is_refused_at_once() {
    let (manager, _dir) = acl_manager("persistent");
    let management = support::bootstrap(&manager).await;
    let admin = Client::with_token(&manager.url, &management);
    let made = token(&manager, &management, "submit", "short-lived").await;
    let user = Client::with_token(&manager.url, &secret(&made));
    assert_eq!(user.request("GET", "/tasks", None).await, 200);
    let id = made["Token"]["ID"].as_str().unwrap();
    assert_eq!(
        admin
            .request("DELETE", &format!("/acl/tokens/{id}"), None)
            .await,
        204
    );
    // The very next request.
    let refused = user.request_answer("GET", "/tasks", None).await;
    assert_eq!(refused.status, 401, "{}", refused.body);
    assert!(refused.message().contains("revoked"), "{}", refused.body);

    // A token made with --ttl 5s by the command line works, then is refused once expired. The
    // TTL leaves the first request, made at once, room on a loaded machine; the wait for the
    // refusal is bounded generously.
    let (ok, out, err) = cube_cli_env(
        &[
            ("CUBE_MANAGER", &manager.address()),
            ("CUBE_TOKEN", &management),
        ],
        &[
            "token", "create", "--role", "read", "--ttl", "5s", "--name", "brief",
        ],
    );
    assert!(ok, "cube token create: {err}");
    let brief = Client::with_token(&manager.url, out.trim());
    assert_eq!(brief.request("GET", "/nodes", None).await, 200);
    let deadline = Instant::now() + support::STATE_BOUND;
    loop {
        let answer = brief.request_answer("GET", "/nodes", None).await;
        if answer.status == 401 {
            assert!(answer.message().contains("expired"), "{}", answer.body);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the 5s token still works after {:?}",
            support::STATE_BOUND
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The token survives the manager's restart; a revoked one stays revoked.
    let port = manager.port;
    let data_dir = manager.data_dir.clone();
    manager.terminate(Duration::from_secs(10));
    let again = ManagerProcess::start_with("epvm", "persistent", &data_dir, port, &["--acl"]);
    // New clients: the old ones' pooled connections went with the old process.
    let admin = Client::with_token(&again.url, &management);
    let user = Client::with_token(&again.url, &secret(&made));
    assert_eq!(admin.request("GET", "/tasks", None).await, 200);
    assert_eq!(user.request("GET", "/tasks", None).await, 401);
}

/// A worker that joins `manager` as `name` with `token`.
fn join(manager: &ManagerProcess, name: &str, token: &str) -> WorkerProcess {
    support::ensure_sample_image();
    let address = manager.address();
    WorkerProcess::start_with(
        name,
        "memory",
        &manager.data_dir.join(name),
        &[
            "--join",
            &address,
            "--token",
            token,
            "--heartbeat-interval",
            "300ms",
        ],
    )
}

async fn await_ready(admin: &Client, name: &str) {
    let deadline = Instant::now() + support::STATE_BOUND;
    loop {
        let node = admin.get(&format!("/nodes/{name}")).await;
        if node.status == 200 && node.body["Status"] == "Ready" {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {name} not Ready: {}",
            node.body
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_joined_node_runs_tasks_and_its_token_does_nothing_else() {
    let (manager, _dir) = acl_manager("memory");
    let management = support::bootstrap(&manager).await;
    let admin = Client::with_token(&manager.url, &management);
    let name = unique_node("acl-join");
    let join_token = secret(&token(&manager, &management, "node", "join-a").await);
    let worker = join(&manager, &name, &join_token);
    await_ready(&admin, &name).await;

    // The manager reaches the worker with its worker-command token: a task runs there.
    let (id, running) = admin.run(&web_task("acl-web")).await;
    assert_eq!(running["NodeName"], name.as_str());

    // The node token reports as its node, and nothing else.
    let node = Client::with_token(&manager.url, &join_token);
    let other = node
        .request_answer("PUT", "/nodes/someone-else", Some("{}"))
        .await;
    assert_eq!(other.status, 403, "{}", other.body);
    assert!(other.message().contains(&name), "{}", other.body);
    let submitted = node.post(&web_task("from-a-node")).await;
    assert_eq!(submitted.status, 403, "{}", submitted.body);
    assert_eq!(node.request("GET", "/tasks", None).await, 403);
    assert_eq!(
        node.request("DELETE", &format!("/tasks/{id}"), None).await,
        403
    );

    // A second node with another join token cannot take the name.
    let second = secret(&token(&manager, &management, "node", "join-b").await);
    let taken = Client::with_token(&manager.url, &second)
        .request_answer("PUT", &format!("/nodes/{name}"), Some("{}"))
        .await;
    assert_eq!(taken.status, 409, "{}", taken.body);
    assert!(taken.message().contains("taken"), "{}", taken.body);

    // The worker takes commands from its manager only.
    let direct = worker.client();
    assert_eq!(direct.get("/health").await.status, 200);
    let refused = direct.post(&web_task("behind-the-back")).await;
    assert_eq!(refused.status, 401, "{}", refused.body);
    assert_eq!(direct.get("/tasks").await.status, 401);
    for text in [management.as_str(), join_token.as_str()] {
        let with_token = Client::with_token(&worker.url, text);
        assert_eq!(
            with_token.post(&web_task("with-a-user-token")).await.status,
            401
        );
    }
    assert_eq!(admin.delete(&format!("/tasks/{id}")).await.status, 204);
    admin.await_state(&id, "Completed").await;
}

/// What a holder of node `name`'s join token learns: the worker-command token in the answer
/// to a heartbeat sent with it (a report as the worker at `address` sends it).
async fn worker_command_token(
    manager: &ManagerProcess,
    join_token: &str,
    name: &str,
    address: &str,
) -> String {
    let report = json!({
        "Name": name,
        "Address": address,
        "Capacity": {"Cpu": 1, "Memory": "1GiB", "Disk": "1GiB"},
    });
    let answer = Client::with_token(&manager.url, join_token)
        .http
        .put(format!("{}/nodes/{name}", manager.url))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(report.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200, "a heartbeat as {name}");
    answer
        .headers()
        .get("X-Cube-Worker-Token")
        .expect("the answer to a node's heartbeat carries its worker-command token")
        .to_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn a_nodes_command_token_is_refused_by_other_workers_and_a_task_sent_behind_the_managers_back_is_stopped()
 {
    let (manager, _dir) = acl_manager("memory");
    let management = support::bootstrap(&manager).await;
    let admin = Client::with_token(&manager.url, &management);
    let (a, b) = (unique_node("acl-a"), unique_node("acl-b"));
    let join_a = secret(&token(&manager, &management, "node", "join-a").await);
    let join_b = secret(&token(&manager, &management, "node", "join-b").await);
    let worker_a = join(&manager, &a, &join_a);
    let worker_b = join(&manager, &b, &join_b);
    await_ready(&admin, &a).await;
    await_ready(&admin, &b).await;

    // What node a's join token gets from the manager commands worker a, and only worker a.
    let a_token = worker_command_token(&manager, &join_a, &a, &worker_a.url).await;
    let b_token = worker_command_token(&manager, &join_b, &b, &worker_b.url).await;
    assert_ne!(
        a_token, b_token,
        "each node has a worker-command token of its own"
    );
    let as_a_on_a = Client::with_token(&worker_a.url, &a_token);
    let as_a_on_b = Client::with_token(&worker_b.url, &a_token);
    assert_eq!(as_a_on_a.get("/tasks").await.status, 200);
    let refused = as_a_on_b.post(&web_task("from-node-a")).await;
    assert_eq!(refused.status, 401, "{}", refused.body);
    assert!(
        refused.message().contains("manager"),
        "the refusal says why: {}",
        refused.body
    );
    assert_eq!(as_a_on_b.get("/tasks").await.status, 401);
    assert!(
        running_containers_with_label(&format!("cube.node={b}")).is_empty(),
        "nothing started on worker b"
    );

    // A task sent straight to worker a with its own token, behind the manager's back: the
    // manager sees a run it never placed, stops it and has it removed.
    let sent = as_a_on_a.post(&web_task("behind-the-back")).await;
    assert_eq!(sent.status, 201, "{}", sent.body);
    let id = sent.body["ID"].as_str().unwrap().to_string();
    let deadline = Instant::now() + support::STATE_BOUND;
    loop {
        let on_worker = as_a_on_a.get(&format!("/tasks/{id}")).await;
        let running = running_containers_with_label(&format!("cube.task-id={id}"));
        if on_worker.status == 404 && running.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the task sent behind the manager's back is still on worker a ({} {}), containers \
             running: {running:?}",
            on_worker.status,
            on_worker.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        containers_with_label(&format!("cube.task-id={id}")).is_empty(),
        "its container is removed"
    );
    assert_eq!(admin.get(&format!("/tasks/{id}")).await.status, 404);
    assert!(
        manager.stderr().contains("did not place"),
        "the manager says what it stopped"
    );
}

#[tokio::test]
async fn a_malformed_report_binds_no_node_name_to_a_fresh_node_token() {
    let (manager, _dir) = acl_manager("memory");
    let management = support::bootstrap(&manager).await;
    let admin = Client::with_token(&manager.url, &management);
    let first = secret(&token(&manager, &management, "node", "fresh-a").await);
    let second = secret(&token(&manager, &management, "node", "fresh-b").await);
    let name = unique_node("claim");
    let capacity = json!({"Cpu": 1, "Memory": "1GiB", "Disk": "1GiB"});
    let as_first = Client::with_token(&manager.url, &first);
    for bad in [
        json!({}),
        json!({"Name": name, "Address": "", "Capacity": capacity}),
        json!({"Name": name, "Address": "http://127.0.0.1:1", "Capacity": {"Cpu": 0}}),
        json!({"Name": "someone-else", "Address": "http://127.0.0.1:1", "Capacity": capacity}),
    ] {
        let answer = as_first
            .request_answer("PUT", &format!("/nodes/{name}"), Some(&bad.to_string()))
            .await;
        assert_eq!(answer.status, 400, "{bad}: {}", answer.body);
    }
    let tokens = admin.get("/acl/tokens").await.body;
    let fresh = tokens
        .as_array()
        .unwrap()
        .iter()
        .find(|token| token["Name"] == "fresh-a")
        .unwrap();
    assert!(fresh.get("Node").is_none(), "no name bound: {fresh}");

    // The name is still free: another token takes it with a valid report, and the first
    // token may still join under a name of its own.
    let valid = |node: &str| {
        json!({"Name": node, "Address": "http://127.0.0.1:1", "Capacity": capacity}).to_string()
    };
    let taken = Client::with_token(&manager.url, &second)
        .request_answer("PUT", &format!("/nodes/{name}"), Some(&valid(&name)))
        .await;
    assert_eq!(taken.status, 200, "{}", taken.body);
    let other = unique_node("claim-other");
    let joined = as_first
        .request_answer("PUT", &format!("/nodes/{other}"), Some(&valid(&other)))
        .await;
    assert_eq!(joined.status, 200, "{}", joined.body);
    // And a claimed name stays its token's: the first token is refused it, as before.
    let refused = as_first
        .request_answer("PUT", &format!("/nodes/{name}"), Some(&valid(&name)))
        .await;
    assert_eq!(refused.status, 403, "{}", refused.body);
}

#[tokio::test]
async fn the_waiting_list_names_the_submitting_tokens_name_as_owner() {
    let (manager, _dir) = acl_manager("memory");
    let management = support::bootstrap(&manager).await;
    let admin = Client::with_token(&manager.url, &management);
    let name = unique_node("acl-owner");
    let join_token = secret(&token(&manager, &management, "node", "join-owner").await);
    let _worker = join(&manager, &name, &join_token);
    await_ready(&admin, &name).await;
    let ci = Client::with_token(
        &manager.url,
        &secret(&token(&manager, &management, "submit", "ci").await),
    );
    let night = Client::with_token(
        &manager.url,
        &secret(&token(&manager, &management, "submit", "night build").await),
    );
    let operator = Client::with_token(
        &manager.url,
        &secret(&token(&manager, &management, "operator", "ops").await),
    );

    // A task and a job without Owner: the token's name (made fit for Owner).
    let id = ci.submit(&web_task("owned-task")).await;
    // The queue controller writes the entry after the submission is answered.
    let entry = ci.await_queue_entry("task", &id).await;
    assert_eq!(entry["Owner"], "ci", "{entry}");
    let job = json!({"Name": "owned-job", "Type": "batch",
                     "Groups": [{"Name": "g", "Count": 1,
                                 "Task": {"Image": support::SAMPLE_IMAGE, "Cmd": ["true"]}}]});
    let submitted = night.post_raw("/jobs", job.to_string()).await;
    assert_eq!(submitted.status, 201, "{}", submitted.body);
    let entry = night.await_queue_entry("job", "owned-job").await;
    assert_eq!(entry["Owner"], "night-build", "{entry}");
    // The same job again from the same token changes nothing (the owner is not a change).
    let again = night.post_raw("/jobs/plan", job.to_string()).await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert!(
        !again.body.to_string().contains("Owner"),
        "the plan shows no change of owner: {}",
        again.body
    );

    // A submit token cannot pass as another owner; an operator may submit on one's behalf.
    let mut as_bob = web_task("as-bob");
    as_bob["Owner"] = json!("bob");
    let refused = ci.post(&as_bob).await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert!(refused.message().contains("Owner"), "{}", refused.body);
    let id = operator.submit(&as_bob).await;
    let entry = operator.await_queue_entry("task", &id).await;
    assert_eq!(entry["Owner"], "bob", "{entry}");
}

#[tokio::test]
async fn the_audit_log_records_a_mutating_request_with_its_tokens_name() {
    let (manager, dir) = acl_manager("persistent");
    let management = support::bootstrap(&manager).await;
    let reader = secret(&token(&manager, &management, "read", "audited-reader").await);
    let status = Client::with_token(&manager.url, &reader)
        .request("DELETE", "/jobs/some-job", None)
        .await;
    assert_eq!(status, 403);
    let text = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert!(
        lines.iter().any(|line| line["Token"] == "audited-reader"
            && line["Method"] == "DELETE"
            && line["Route"] == "/jobs/{name}"
            && line["Path"] == "/jobs/some-job"
            && line["Status"] == 403),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|line| line["Token"] == "bootstrap" && line["Route"] == "/acl/tokens"),
        "{text}"
    );
    // Reads are not audited.
    assert!(lines.iter().all(|line| line["Method"] != "GET"), "{text}");
    assert!(
        manager.stderr().contains("cube::audit"),
        "the audit event is in the manager's log too"
    );
}

#[tokio::test]
async fn the_command_line_sends_its_token_from_the_flag_the_variable_or_the_config() {
    let (manager, dir) = acl_manager("memory");
    let management = support::bootstrap(&manager).await;
    let address = manager.address();
    let config = dir.path().join("config.yaml");
    let config = config.to_str().unwrap();
    let (ok, _, err) = cube_cli_env(&[("CUBE_MANAGER", &address)], &["status"]);
    assert!(!ok);
    assert!(err.contains("401") && err.contains("token"), "{err}");
    let (ok, out, err) = cube_cli_env(
        &[("CUBE_MANAGER", &address)],
        &["token", "create", "--role", "read", "--token", &management],
    );
    assert!(ok, "{err}");
    let read = out.trim().to_string();
    let (ok, _, err) = cube_cli_env(
        &[("CUBE_MANAGER", &address), ("CUBE_TOKEN", &read)],
        &["status"],
    );
    assert!(ok, "{err}");
    let (ok, _, err) = cube_cli_env(
        &[("CUBE_MANAGER", &address), ("CUBE_TOKEN", &read)],
        &["token", "list"],
    );
    assert!(
        !ok && err.contains("403") && err.contains("management"),
        "{err}"
    );
    let (ok, _, err) = cube_cli_env(
        &[("CUBE_CONFIG", config)],
        &[
            "config",
            "set-cluster",
            "secure",
            "--manager",
            &address,
            "--token",
            &management,
        ],
    );
    assert!(ok, "{err}");
    let (ok, out, err) = cube_cli_env(&[("CUBE_CONFIG", config)], &["token", "list"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("bootstrap") && out.contains("management"),
        "{out}"
    );
    let (ok, _, err) = cube_cli_env(&[("CUBE_CONFIG", config)], &["acl", "bootstrap"]);
    assert!(!ok && err.contains("already bootstrapped"), "{err}");
}

#[tokio::test]
async fn cube_dev_with_acl_joins_its_own_worker_and_asks_for_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let name = unique_node("acl-dev");
    let dev = ManagerProcess::start_dev_with(&name, dir.path(), &["--acl"]);
    assert_eq!(dev.client().get("/tasks").await.status, 401);
    let management = support::bootstrap(&dev).await;
    let admin = Client::with_token(&dev.url, &management);
    await_ready(&admin, &name).await;
    let (id, _) = admin.run(&web_task("acl-dev-web")).await;
    assert_eq!(admin.delete(&format!("/tasks/{id}")).await.status, 204);
    admin.await_state(&id, "Completed").await;
}

#[tokio::test]
async fn on_etcd_a_token_made_on_one_manager_works_on_the_other_and_a_revoke_holds_on_both() {
    let cluster = cube_test_support::EtcdCluster::start(1);
    let endpoints = cluster.endpoints_flag();
    let prefix = format!("/cube-acl-{}", uuid::Uuid::new_v4().simple());
    let flags = [
        "--etcd-endpoints",
        endpoints.as_str(),
        "--etcd-prefix",
        prefix.as_str(),
        "--acl",
    ];
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = ManagerProcess::start_with("epvm", "etcd", dir_a.path(), 0, &flags);
    let b = ManagerProcess::start_with("epvm", "etcd", dir_b.path(), 0, &flags);
    // Until one of them leads, a request is answered 503.
    let deadline = Instant::now() + support::STATE_BOUND;
    let management = loop {
        let answer = a
            .client()
            .request_answer("POST", "/acl/bootstrap", Some("{}"))
            .await;
        if answer.status == 201 {
            break answer.body["Secret"].as_str().unwrap().to_string();
        }
        assert_eq!(answer.status, 503, "bootstrap: {}", answer.body);
        assert!(Instant::now() < deadline, "no manager leads");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let made = token(&a, &management, "read", "on-etcd").await;
    let on_b = Client::with_token(&b.url, &secret(&made));
    assert_eq!(on_b.request("GET", "/nodes", None).await, 200);
    assert_eq!(b.client().request("GET", "/nodes", None).await, 401);
    // The front of each manager (`GET /leader`, `GET /shards`) needs a token too.
    for manager in [&a, &b] {
        let with_token = Client::with_token(&manager.url, &secret(&made));
        for path in ["/leader", "/shards"] {
            assert_eq!(manager.client().request("GET", path, None).await, 401);
            assert_eq!(with_token.request("GET", path, None).await, 200);
        }
    }
    let id = made["Token"]["ID"].as_str().unwrap();
    let revoked = Client::with_token(&b.url, &management)
        .request("DELETE", &format!("/acl/tokens/{id}"), None)
        .await;
    assert_eq!(revoked, 204);
    let on_a = Client::with_token(&a.url, &secret(&made));
    assert_eq!(on_a.request("GET", "/nodes", None).await, 401);
    assert_eq!(on_b.request("GET", "/nodes", None).await, 401);
}

#[tokio::test]
async fn without_acl_the_audit_log_names_the_caller_anonymous_and_skips_heartbeats() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("epvm", "persistent", dir.path(), 0);
    let name = unique_node("audit-open");
    let _worker = manager.join_worker(&name, &[]);
    manager.await_ready_nodes(1).await;
    let answer = manager.client().post_raw("/tasks", "{not json").await;
    assert_eq!(answer.status, 400);
    // A few heartbeats come and go (every 300 ms).
    tokio::time::sleep(Duration::from_millis(700)).await;
    let text = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert!(
        lines.iter().any(|line| line["Token"] == "anonymous"
            && line["Method"] == "POST"
            && line["Route"] == "/tasks"
            && line["Status"] == 400),
        "{text}"
    );
    assert!(
        lines.iter().all(|line| line["Route"] != "/nodes/{name}"),
        "heartbeats taken are not audited: {text}"
    );
}

#[tokio::test]
async fn a_bad_token_request_is_refused_naming_the_field() {
    let (manager, _dir) = acl_manager("memory");
    let management = support::bootstrap(&manager).await;
    let admin = Client::with_token(&manager.url, &management);
    for (body, field) in [
        (json!({"Role": "admin"}), "Role"),
        (json!({"Role": "read", "TTL": "9000h"}), "TTL"),
        (json!({"Role": "read", "TTL": "soon"}), "TTL"),
        (json!({"Role": "read", "TTL": "0"}), "TTL"),
        (json!({"Role": "read", "Name": ""}), "Name"),
        (json!({"Role": "read", "Color": "red"}), "Color"),
    ] {
        let answer = admin
            .request_answer("POST", "/acl/tokens", Some(&body.to_string()))
            .await;
        assert_eq!(answer.status, 400, "{body}: {}", answer.body);
        assert!(answer.message().contains(field), "{body}: {}", answer.body);
    }
    let unknown = admin
        .request_answer("DELETE", "/acl/tokens/0123456789abcdef", None)
        .await;
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    let (ok, _, err) = cube_cli_env(
        &[
            ("CUBE_MANAGER", &manager.address()),
            ("CUBE_TOKEN", &management),
        ],
        &["token", "create", "--role", "boss"],
    );
    assert!(!ok && err.contains("unknown role"), "{err}");
}

#[tokio::test]
async fn an_open_event_stream_ends_when_its_token_is_revoked() {
    let (manager, _dir) = acl_manager("persistent");
    let management = support::bootstrap(&manager).await;
    let made = token(&manager, &management, "read", "watcher").await;
    let watcher = Client::with_token(&manager.url, &secret(&made));
    let mut stream = watcher
        .http
        .get(format!("{}/events", manager.url))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let id = made["Token"]["ID"].as_str().unwrap();
    let revoked = Client::with_token(&manager.url, &management)
        .request("DELETE", &format!("/acl/tokens/{id}"), None)
        .await;
    assert_eq!(revoked, 204);
    // The stream ends (well before its 15 s heartbeat would show it alive).
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(Some(_)) = stream.chunk().await {}
    })
    .await;
    assert!(
        ended.is_ok(),
        "the event stream outlived its token's revoke"
    );
}
