//! Mutual TLS as a user meets it, against real `cube manager --acl --tls` and `cube worker
//! --join` processes on loopback and the real Docker engine: a worker that joins by a token
//! carrying the CA's fingerprint runs a task over mTLS and takes commands only over the
//! manager's certificate; the manager takes a node's reports only over that node's
//! certificate; a token with another CA's fingerprint is refused at join; certificates are
//! renewed in place; the CLI reaches the manager over HTTPS with the fingerprint.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cube_api::tls::{Authority, CertSlot, MANAGER_NAME, PeerRole, PinnedCaVerifier};
use serde_json::{Value, json};
use support::{Client, ManagerProcess, WorkerProcess, cube_cli_env, unique_node, web_task};

/// A manager with `--acl --tls` (memory store) and more flags.
fn tls_manager(extra: &[&str]) -> (ManagerProcess, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["--acl", "--tls"];
    args.extend_from_slice(extra);
    let manager = ManagerProcess::start_with("epvm", "memory", dir.path(), 0, &args);
    assert!(manager.url.starts_with("https://"), "{}", manager.url);
    (manager, dir)
}

/// The cluster CA the manager made in its data directory (its key too: the tests sign
/// certificates with it to play a node).
fn authority(manager: &ManagerProcess) -> Authority {
    Authority::load_or_create(&manager.data_dir).unwrap()
}

/// An HTTPS client for `base` that trusts the CA of `fingerprint` (the server's certificate
/// must have `expect`'s role), presents `identity` if given and sends `token`.
fn tls_client(
    base: &str,
    fingerprint: &str,
    expect: PeerRole,
    identity: Option<Arc<CertSlot>>,
    token: Option<&str>,
) -> Client {
    let verifier = PinnedCaVerifier::new(fingerprint, Some(expect)).unwrap();
    let config = cube_api::tls::client_config(verifier, identity).unwrap();
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(token) = token {
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
    }
    Client {
        base: base.to_string(),
        http: support::http_builder()
            .tls_backend_preconfigured((*config).clone())
            .tls_info(true)
            .default_headers(headers)
            .build()
            .unwrap(),
    }
}

/// A certificate of `role`/`name` signed by `authority`, in a slot a client can present.
fn identity(authority: &Authority, role: PeerRole, name: &str) -> Arc<CertSlot> {
    let issued = authority
        .issue(role, name, &[], Duration::from_secs(3600))
        .unwrap();
    CertSlot::new(issued.certified_key().unwrap())
}

/// A cluster: the manager, its CA's fingerprint and its management token.
struct TlsCluster {
    manager: ManagerProcess,
    _dir: tempfile::TempDir,
    fingerprint: String,
    management: String,
}

impl TlsCluster {
    async fn start(extra: &[&str]) -> TlsCluster {
        let (manager, dir) = tls_manager(extra);
        let fingerprint = authority(&manager).fingerprint();
        let open = tls_client(&manager.url, &fingerprint, PeerRole::Manager, None, None);
        let answer = open
            .request_answer("POST", "/acl/bootstrap", Some("{}"))
            .await;
        assert_eq!(answer.status, 201, "bootstrap: {}", answer.body);
        let management = answer.body["Secret"].as_str().unwrap().to_string();
        TlsCluster {
            manager,
            _dir: dir,
            fingerprint,
            management,
        }
    }

    /// A client of the manager with the management token.
    fn client(&self) -> Client {
        tls_client(
            &self.manager.url,
            &self.fingerprint,
            PeerRole::Manager,
            None,
            Some(&self.management),
        )
    }

    /// A node token's text, as `cube token create --role node` prints it.
    async fn node_token(&self, name: &str) -> String {
        let answer = self
            .client()
            .request_answer(
                "POST",
                "/acl/tokens",
                Some(&json!({"Role": "node", "Name": name}).to_string()),
            )
            .await;
        assert_eq!(answer.status, 201, "token create: {}", answer.body);
        answer.body["Secret"].as_str().unwrap().to_string()
    }

    /// A worker that joined with a node token.
    async fn join(&self, name: &str) -> WorkerProcess {
        support::ensure_sample_image();
        let token = self.node_token(&format!("{name}-join")).await;
        let address = self.manager.address();
        let address = address.trim_start_matches("https://");
        WorkerProcess::start_with(
            name,
            "memory",
            &self.manager.data_dir.join(name),
            &[
                "--join",
                address,
                "--token",
                &token,
                "--heartbeat-interval",
                "300ms",
            ],
        )
    }

    /// Waits until node `name` is `Ready`.
    async fn await_ready(&self, name: &str) -> Value {
        let client = self.client();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let answer = client.get(&format!("/nodes/{name}")).await;
            if answer.status == 200 && answer.body["Status"] == "Ready" {
                return answer.body;
            }
            assert!(
                Instant::now() < deadline,
                "node {name} not Ready: {} {}; manager: {}",
                answer.status,
                answer.body,
                self.manager.stderr()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The serial number of the certificate `base` serves.
async fn served_serial(client: &Client) -> String {
    let response = client
        .http
        .get(format!("{}/health", client.base))
        .send()
        .await
        .unwrap();
    let info = response
        .extensions()
        .get::<reqwest::tls::TlsInfo>()
        .expect("TLS info");
    let der = info.peer_certificate().expect("a peer certificate");
    cube_api::tls::serial_and_validity(der).unwrap().0
}

#[tokio::test]
async fn tls_needs_acl_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().to_str().unwrap();
    let (status, _, stderr) =
        support::cube_command(&["manager", "--tls", "-p", "0", "--data-dir", dir]);
    assert!(!status.success());
    assert!(stderr.contains("--acl"), "{stderr}");
}

#[tokio::test]
async fn a_worker_joined_with_tls_runs_a_task_and_takes_commands_only_over_the_managers_certificate()
 {
    let cluster = TlsCluster::start(&[]).await;
    let name = unique_node("tls");
    let worker = cluster.join(&name).await;
    assert!(worker.url.starts_with("https://"), "{}", worker.url);
    let node = cluster.await_ready(&name).await;
    assert!(
        node["Address"].as_str().unwrap().starts_with("https://"),
        "{node}"
    );

    // A task runs: the manager dispatches it over mTLS and the worker reports it.
    let manager = cluster.client();
    let id = manager.submit(&web_task("tls-web")).await;
    let task = manager.await_state(&id, "Running").await;
    assert_eq!(task["NodeName"], name.as_str());

    // No client certificate: the handshake is refused.
    let body = web_task("intruder").to_string();
    let anonymous = tls_client(
        &worker.url,
        &cluster.fingerprint,
        PeerRole::Node,
        None,
        None,
    );
    let refused = anonymous
        .http
        .post(format!("{}/tasks", worker.url))
        .body(body.clone())
        .send()
        .await;
    assert!(
        refused.is_err(),
        "a client without a certificate was served"
    );

    // A certificate of another CA, even a manager's: refused too.
    let other = Authority::generate().unwrap();
    let stranger = tls_client(
        &worker.url,
        &cluster.fingerprint,
        PeerRole::Node,
        Some(identity(&other, PeerRole::Manager, MANAGER_NAME)),
        None,
    );
    let refused = stranger
        .http
        .post(format!("{}/tasks", worker.url))
        .body(body.clone())
        .send()
        .await;
    assert!(
        refused.is_err(),
        "a certificate of another CA was taken: {:?}",
        refused.map(|r| r.status())
    );

    // A node's certificate of the cluster's own CA: the handshake passes, the command does not.
    let ca = authority(&cluster.manager);
    let neighbour = tls_client(
        &worker.url,
        &cluster.fingerprint,
        PeerRole::Node,
        Some(identity(&ca, PeerRole::Node, "neighbour")),
        None,
    );
    let answer = neighbour
        .request_answer("POST", "/tasks", Some(&body))
        .await;
    assert_eq!(answer.status, 403, "{}", answer.body);
    assert!(
        answer.message().contains("manager's certificate"),
        "{}",
        answer.message()
    );
    drop(worker);
}

#[tokio::test]
async fn the_manager_takes_a_report_for_a_node_only_over_that_nodes_certificate() {
    let cluster = TlsCluster::start(&[]).await;
    let ca = authority(&cluster.manager);
    let token = cluster.node_token("a-join").await;
    let report = "{}";
    // Node b's certificate, node a's token: refused, naming both.
    let as_b = tls_client(
        &cluster.manager.url,
        &cluster.fingerprint,
        PeerRole::Manager,
        Some(identity(&ca, PeerRole::Node, "b")),
        Some(&token),
    );
    let answer = as_b.request_answer("PUT", "/nodes/a", Some(report)).await;
    assert_eq!(answer.status, 403, "{}", answer.body);
    let message = answer.message();
    assert!(
        message.contains("\"a\"") && message.contains("\"b\""),
        "{message}"
    );
    // No certificate at all: refused as well.
    let bare = tls_client(
        &cluster.manager.url,
        &cluster.fingerprint,
        PeerRole::Manager,
        None,
        Some(&token),
    );
    let answer = bare.request_answer("PUT", "/nodes/a", Some(report)).await;
    assert_eq!(answer.status, 403, "{}", answer.body);
    assert!(
        answer.message().contains("presented none"),
        "{}",
        answer.message()
    );
    // Node a's own certificate gets past the check (to the report's own validation).
    let as_a = tls_client(
        &cluster.manager.url,
        &cluster.fingerprint,
        PeerRole::Manager,
        Some(identity(&ca, PeerRole::Node, "a")),
        Some(&token),
    );
    let answer = as_a.request_answer("PUT", "/nodes/a", Some(report)).await;
    assert_ne!(answer.status, 403, "{}", answer.body);
}

#[tokio::test]
async fn a_join_token_with_another_cas_fingerprint_is_refused_with_a_clear_error() {
    let cluster = TlsCluster::start(&[]).await;
    let token = cluster.node_token("w-join").await;
    let other = Authority::generate().unwrap().fingerprint();
    let (base, _) = token.rsplit_once('.').unwrap();
    let wrong = format!("{base}.{other}");
    let address = cluster.manager.address();
    let address = address.trim_start_matches("https://");
    let dir = tempfile::tempdir().unwrap();
    let (status, _, stderr) = support::cube_command(&[
        "worker",
        "-n",
        "w-wrong-ca",
        "-p",
        "0",
        "-d",
        "memory",
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--join",
        address,
        "--token",
        &wrong,
    ]);
    assert!(!status.success());
    assert!(
        stderr.contains("not from the CA with fingerprint") && stderr.contains(&other),
        "{stderr}"
    );
}

#[tokio::test]
async fn certificates_are_renewed_before_expiry_with_no_interruption() {
    let cluster = TlsCluster::start(&["--cert-ttl", "6s"]).await;
    let name = unique_node("tls-renew");
    let worker = cluster.join(&name).await;
    cluster.await_ready(&name).await;
    let manager = cluster.client();
    let id = manager.submit(&web_task("tls-renew-web")).await;
    manager.await_state(&id, "Running").await;

    let ca = authority(&cluster.manager);
    let worker_client = tls_client(
        &worker.url,
        &cluster.fingerprint,
        PeerRole::Node,
        Some(identity(&ca, PeerRole::Manager, MANAGER_NAME)),
        None,
    );
    let manager_serial = served_serial(&manager).await;
    let worker_serial = served_serial(&worker_client).await;
    // Past a whole certificate's life: each was renewed at least once.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let fresh_manager = cluster.client();
    assert_ne!(served_serial(&fresh_manager).await, manager_serial);
    let fresh_worker = tls_client(
        &worker.url,
        &cluster.fingerprint,
        PeerRole::Node,
        Some(identity(&ca, PeerRole::Manager, MANAGER_NAME)),
        None,
    );
    assert_ne!(served_serial(&fresh_worker).await, worker_serial);
    // The task runs on, the node beats on.
    let task = fresh_manager.get(&format!("/tasks/{id}")).await;
    assert_eq!(task.body["State"], "Running", "{}", task.body);
    let node = cluster.await_ready(&name).await;
    let last: chrono::DateTime<chrono::Utc> =
        node["LastHeartbeat"].as_str().unwrap().parse().unwrap();
    assert!(
        chrono::Utc::now() - last < chrono::Duration::seconds(2),
        "last heartbeat {last}"
    );
    assert!(
        worker.stderr().contains("certificate was renewed"),
        "{}",
        worker.stderr()
    );
}

#[tokio::test]
async fn the_cli_reaches_a_tls_manager_with_the_ca_fingerprint_and_says_what_is_missing_without() {
    let cluster = TlsCluster::start(&[]).await;
    let url = cluster.manager.url.clone();
    let token = cluster.management.clone();
    let env = [("CUBE_TOKEN", token.as_str())];
    let (ok, stdout, stderr) = cube_cli_env(
        &env,
        &["node", "-m", &url, "--ca-fingerprint", &cluster.fingerprint],
    );
    assert!(ok, "{stdout}{stderr}");
    let with_env = [
        ("CUBE_TOKEN", token.as_str()),
        ("CUBE_CA_FINGERPRINT", cluster.fingerprint.as_str()),
    ];
    let (ok, stdout, stderr) = cube_cli_env(&with_env, &["status", "-m", &url]);
    assert!(ok, "{stdout}{stderr}");

    // Without the fingerprint: an error that says to give it.
    let (ok, _, stderr) = cube_cli_env(&env, &["node", "-m", &url]);
    assert!(!ok);
    assert!(stderr.contains("fingerprint"), "{stderr}");
    // Over plain HTTP: a hint that the manager speaks HTTPS.
    let plain = url.replacen("https://", "http://", 1);
    let (ok, _, stderr) = cube_cli_env(&env, &["node", "-m", &plain]);
    assert!(!ok);
    assert!(stderr.contains("HTTPS"), "{stderr}");
    // With another CA's fingerprint: refused, naming it.
    let other = Authority::generate().unwrap().fingerprint();
    let (ok, _, stderr) = cube_cli_env(&env, &["node", "-m", &url, "--ca-fingerprint", &other]);
    assert!(!ok);
    assert!(stderr.contains(&other), "{stderr}");

    // The config file keeps the fingerprint.
    let config_dir = tempfile::tempdir().unwrap();
    let config = config_dir.path().join("config.yaml");
    let config = config.to_str().unwrap();
    let (ok, _, stderr) = cube_cli_env(
        &[("CUBE_CONFIG", config)],
        &[
            "config",
            "set-cluster",
            "secure",
            "--manager",
            &url,
            "--token",
            &token,
            "--ca-fingerprint",
            &cluster.fingerprint,
        ],
    );
    assert!(ok, "{stderr}");
    let (ok, stdout, stderr) = cube_cli_env(&[("CUBE_CONFIG", config)], &["node"]);
    assert!(ok, "{stdout}{stderr}");
}
