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
        TlsCluster::bootstrapped(manager, dir, fingerprint).await
    }

    /// The cluster of a running manager whose CA has `fingerprint`: ACL bootstrapped over TLS.
    async fn bootstrapped(
        manager: ManagerProcess,
        dir: tempfile::TempDir,
        fingerprint: String,
    ) -> TlsCluster {
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
        self.join_keeping_token(name).await.0
    }

    /// A worker that joined with a node token, and the token.
    async fn join_keeping_token(&self, name: &str) -> (WorkerProcess, String) {
        support::ensure_sample_image();
        let token = self.node_token(&format!("{name}-join")).await;
        let address = self.manager.address();
        let address = address.trim_start_matches("https://");
        let worker = WorkerProcess::start_with(
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
        );
        (worker, token)
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
async fn a_nodes_certificate_and_command_token_command_no_worker_not_even_its_own() {
    let cluster = TlsCluster::start(&[]).await;
    let (a, b) = (unique_node("tls-a"), unique_node("tls-b"));
    let (worker_a, join_a) = cluster.join_keeping_token(&a).await;
    let worker_b = cluster.join(&b).await;
    cluster.await_ready(&a).await;
    cluster.await_ready(&b).await;

    // All that node a holds: its certificate (the CA signs the same as it did at join) and
    // the worker-command token the manager answers its heartbeats with.
    let ca = authority(&cluster.manager);
    let a_certificate = identity(&ca, PeerRole::Node, &a);
    let report = json!({
        "Name": a,
        "Address": worker_a.url,
        "Capacity": {"Cpu": 1, "Memory": "1GiB", "Disk": "1GiB"},
    });
    let heartbeat = tls_client(
        &cluster.manager.url,
        &cluster.fingerprint,
        PeerRole::Manager,
        Some(a_certificate.clone()),
        Some(&join_a),
    )
    .http
    .put(format!("{}/nodes/{a}", cluster.manager.url))
    .header(reqwest::header::CONTENT_TYPE, "application/json")
    .body(report.to_string())
    .send()
    .await
    .unwrap();
    assert_eq!(heartbeat.status(), 200, "a heartbeat as {a}");
    let a_token = heartbeat
        .headers()
        .get("X-Cube-Worker-Token")
        .expect("the worker-command token")
        .to_str()
        .unwrap()
        .to_string();

    // With both, worker b refuses a command (the certificate is a node's, not the manager's),
    // and so does worker a: commands come only over the manager's certificate.
    let body = web_task("from-node-a").to_string();
    for worker in [&worker_b, &worker_a] {
        let as_a = tls_client(
            &worker.url,
            &cluster.fingerprint,
            PeerRole::Node,
            Some(a_certificate.clone()),
            Some(&a_token),
        );
        let answer = as_a.request_answer("POST", "/tasks", Some(&body)).await;
        assert_eq!(answer.status, 403, "{}: {}", worker.url, answer.body);
        assert!(
            answer.message().contains("manager's certificate"),
            "{}",
            answer.message()
        );
        assert_eq!(as_a.request("GET", "/tasks", None).await, 403);
    }
    for node in [&a, &b] {
        assert!(
            support::running_containers_with_label(&format!("cube.node={node}")).is_empty(),
            "nothing started on {node}"
        );
    }
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
async fn a_restarted_worker_serves_with_its_kept_certificate_and_does_not_join_again() {
    use std::os::unix::fs::PermissionsExt;
    let cluster = TlsCluster::start(&[]).await;
    let name = unique_node("tls-kept");
    let (worker, token) = cluster.join_keeping_token(&name).await;
    cluster.await_ready(&name).await;
    let ca = authority(&cluster.manager);
    let as_manager = |url: &str| {
        tls_client(
            url,
            &cluster.fingerprint,
            PeerRole::Node,
            Some(identity(&ca, PeerRole::Manager, MANAGER_NAME)),
            None,
        )
    };
    let serial = served_serial(&as_manager(&worker.url)).await;
    let issued = |manager: &ManagerProcess| {
        manager
            .stderr()
            .matches("certificate issued to a node")
            .count()
    };
    assert_eq!(issued(&cluster.manager), 1);

    // The certificate, its key and the CA are in the worker's data directory, the key
    // readable by its owner only.
    let tls_dir = worker.data_dir.join("tls");
    let key = tls_dir.join(format!("node-{name}-key.pem"));
    let mode = std::fs::metadata(&key)
        .unwrap_or_else(|err| panic!("{}: {err}", key.display()))
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{}", key.display());
    for file in [format!("node-{name}.pem"), format!("node-{name}-ca.pem")] {
        let mode = std::fs::metadata(tls_dir.join(&file))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{file} is for its owner only");
    }

    // Restarted, the worker serves with the same certificate and asks for none.
    let data_dir = worker.data_dir.clone();
    worker.terminate(Duration::from_secs(10));
    let address = cluster.manager.address();
    let again = WorkerProcess::start_with(
        &name,
        "memory",
        &data_dir,
        &[
            "--join",
            address.trim_start_matches("https://"),
            "--token",
            &token,
            "--heartbeat-interval",
            "300ms",
        ],
    );
    assert!(
        again.stderr().contains("kept from the last start"),
        "{}",
        again.stderr()
    );
    assert_eq!(served_serial(&as_manager(&again.url)).await, serial);
    let node = cluster.client().get(&format!("/nodes/{name}")).await;
    assert_eq!(node.status, 200, "{}", node.body);
    // The manager follows it at its new address and runs a task there.
    let manager = cluster.client();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let node = manager.get(&format!("/nodes/{name}")).await.body;
        if node["Address"] == again.url.as_str() && node["Status"] == "Ready" {
            break;
        }
        assert!(Instant::now() < deadline, "not followed again: {node}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let id = manager.submit(&web_task("tls-kept-web")).await;
    let task = manager.await_state(&id, "Running").await;
    assert_eq!(task["NodeName"], name.as_str());
    assert_eq!(
        issued(&cluster.manager),
        1,
        "no second certificate was asked for"
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

/// Runs openssl in `dir` as a user would to make their own certificates; panics with its
/// output when it fails.
fn openssl(dir: &std::path::Path, args: &[&str]) {
    let output = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl (scripts/setup.sh installs it)");
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The fingerprint of the CA certificate in the PEM file at `path`.
fn fingerprint_of(path: &std::path::Path) -> String {
    let pem = std::fs::read_to_string(path).unwrap();
    let ca = cube_api::tls::certificates_from_pem(&pem, "ca").unwrap();
    cube_api::tls::fingerprint(&ca[0])
}

/// A CA of the user's own in `dir` (`ca.pem`, `ca-key.pem`), made with openssl.
fn user_ca(dir: &std::path::Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "ca-key.pem",
            "-out",
            "ca.pem",
            "-days",
            "3650",
            "-subj",
            "/O=Example/CN=Example cluster CA",
        ],
    );
}

/// A key (`{file}-key.pem`) and a certificate (`{file}.pem`) of subject `subject`, signed by
/// the CA in `dir` for 127.0.0.1 and localhost, for server and client authentication: the
/// README's commands.
fn user_certificate(dir: &std::path::Path, file: &str, subject: &str) {
    std::fs::write(
        dir.join(format!("{file}.ext")),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .unwrap();
    let key = format!("{file}-key.pem");
    let csr = format!("{file}.csr");
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            subject,
        ],
    );
    user_certificate_renewed(dir, file);
}

/// A new certificate for the key already in `dir` (`{file}-key.pem`, its request
/// `{file}.csr`), put in place in one step, as a certificate renewed by the user's tooling
/// would be.
fn user_certificate_renewed(dir: &std::path::Path, file: &str) {
    let csr = format!("{file}.csr");
    let next = format!("{file}.pem.next");
    let ext = format!("{file}.ext");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca-key.pem",
            "-days",
            "30",
            "-out",
            &next,
            "-extfile",
            &ext,
        ],
    );
    std::fs::rename(dir.join(&next), dir.join(format!("{file}.pem"))).unwrap();
}

#[tokio::test]
async fn certificates_brought_by_the_user_run_a_task_and_are_taken_again_when_replaced() {
    support::ensure_sample_image();
    let certs = tempfile::tempdir().unwrap();
    let certs_dir = certs.path();
    let node = unique_node("byo");
    user_ca(certs_dir);
    user_certificate(
        certs_dir,
        "manager",
        "/O=Example/OU=cube-manager/CN=cube-manager",
    );
    user_certificate(
        certs_dir,
        "node",
        &format!("/O=Example/OU=cube-node/CN={node}"),
    );
    let path = |file: &str| certs_dir.join(file).to_str().unwrap().to_string();

    // The manager with the user's CA (without its key) and its own certificate.
    let (manager, data_dir) = tls_manager(&[
        "--tls-ca",
        &path("ca.pem"),
        "--tls-cert",
        &path("manager.pem"),
        "--tls-key",
        &path("manager-key.pem"),
    ]);
    let fingerprint = fingerprint_of(&certs_dir.join("ca.pem"));
    let cluster = TlsCluster::bootstrapped(manager, data_dir, fingerprint.clone()).await;
    let first_serial = served_serial(&cluster.client()).await;

    // Without the CA's key the manager signs nothing: a node asking for a certificate is told
    // to bring its own.
    let token = cluster.node_token(&format!("{node}-join")).await;
    assert!(
        token.ends_with(&fingerprint),
        "the node token names the user's CA: {token}"
    );
    let joiner = tls_client(
        &cluster.manager.url,
        &fingerprint,
        PeerRole::Manager,
        None,
        Some(&token),
    );
    let (_, csr) = cube_api::tls::node_request(&node, &["127.0.0.1".to_string()]).unwrap();
    let answer = joiner
        .request_answer(
            "POST",
            &format!("/nodes/{node}/certificate"),
            Some(&json!({ "CSR": csr }).to_string()),
        )
        .await;
    assert_eq!(answer.status, 409, "{}", answer.body);
    assert!(
        answer.message().contains("--tls-cert"),
        "{}",
        answer.message()
    );

    // The worker with its own certificate: it serves HTTPS, the manager dispatches to it.
    let address = cluster.manager.address();
    let worker = WorkerProcess::start_with(
        &node,
        "memory",
        &cluster.manager.data_dir.join(&node),
        &[
            "--manager",
            address.trim_start_matches("https://"),
            "--token",
            &token,
            "--tls-cert",
            &path("node.pem"),
            "--tls-key",
            &path("node-key.pem"),
            "--tls-ca",
            &path("ca.pem"),
            "--heartbeat-interval",
            "300ms",
        ],
    );
    assert!(worker.url.starts_with("https://"), "{}", worker.url);
    cluster.await_ready(&node).await;
    let client = cluster.client();
    let id = client.submit(&web_task("byo-web")).await;
    let task = client.await_state(&id, "Running").await;
    assert_eq!(task["NodeName"], node.as_str());

    // The user renews the manager's certificate on disk: the manager serves the new one
    // without a restart, and the cluster goes on over it.
    user_certificate_renewed(certs_dir, "manager");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let serial = served_serial(&cluster.client()).await;
        if serial != first_serial {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the manager still serves the old certificate; {}",
            cluster.manager.stderr()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let second = client.submit(&web_task("byo-web-2")).await;
    client.await_state(&second, "Running").await;
    cluster.await_ready(&node).await;
    drop(worker);
}

#[tokio::test]
async fn a_brought_certificate_that_is_not_what_cube_needs_is_refused_at_start_saying_why() {
    let certs = tempfile::tempdir().unwrap();
    let certs_dir = certs.path();
    user_ca(certs_dir);
    // A manager certificate without Cube's role in its subject.
    user_certificate(certs_dir, "plain", "/O=Example/CN=manager.example");
    user_certificate(certs_dir, "node", "/O=Example/OU=cube-node/CN=w1");
    user_certificate(
        certs_dir,
        "manager",
        "/O=Example/OU=cube-manager/CN=cube-manager",
    );
    let path = |file: &str| certs_dir.join(file).to_str().unwrap().to_string();
    let data = tempfile::tempdir().unwrap();
    let data = data.path().to_str().unwrap();
    let manager = |extra: &[&str]| {
        let mut args = vec![
            "manager",
            "--acl",
            "--tls",
            "-p",
            "0",
            "-d",
            "memory",
            "--data-dir",
            data,
        ];
        args.extend_from_slice(extra);
        support::cube_command(&args)
    };

    // Each brought pair refused at start, saying why: no Cube OU; a node's certificate is not
    // a manager's; a certificate and a key that do not go together.
    for (cert, key, why) in [
        ("plain.pem", "plain-key.pem", "OU=cube-manager"),
        ("node.pem", "node-key.pem", "cube-manager"),
        ("manager.pem", "node-key.pem", "--tls-key"),
    ] {
        let (status, _, stderr) = manager(&[
            "--tls-ca",
            &path("ca.pem"),
            "--tls-cert",
            &path(cert),
            "--tls-key",
            &path(key),
        ]);
        assert!(!status.success(), "{cert} with {key}");
        assert!(stderr.contains(why), "{cert} with {key}: {stderr}");
    }

    // A CA without its key and no certificate: the manager could make none.
    let (status, _, stderr) = manager(&["--tls-ca", &path("ca.pem")]);
    assert!(!status.success());
    assert!(stderr.contains("--tls-ca-key"), "{stderr}");

    // A worker whose certificate is another node's.
    let token = format!("cube.{}.{}", "a".repeat(16), "b".repeat(64));
    let (status, _, stderr) = support::cube_command(&[
        "worker",
        "-p",
        "0",
        "-d",
        "memory",
        "--data-dir",
        data,
        "--name",
        "w2",
        "--manager",
        "127.0.0.1:9",
        "--token",
        &token,
        "--tls-cert",
        &path("node.pem"),
        "--tls-key",
        &path("node-key.pem"),
        "--tls-ca",
        &path("ca.pem"),
    ]);
    assert!(!status.success());
    assert!(
        stderr.contains("\"w1\"") && stderr.contains("--name"),
        "{stderr}"
    );
}

#[tokio::test]
async fn with_the_users_ca_and_its_key_nodes_join_by_token_and_get_certificates_of_that_ca() {
    let certs = tempfile::tempdir().unwrap();
    user_ca(certs.path());
    let path = |file: &str| certs.path().join(file).to_str().unwrap().to_string();
    let (manager, data_dir) = tls_manager(&[
        "--tls-ca",
        &path("ca.pem"),
        "--tls-ca-key",
        &path("ca-key.pem"),
    ]);
    // No CA of its own was made in the data directory.
    assert!(!manager.data_dir.join(cube_api::tls::CA_FILE).exists());
    let fingerprint = fingerprint_of(&certs.path().join("ca.pem"));
    let cluster = TlsCluster::bootstrapped(manager, data_dir, fingerprint).await;
    let name = unique_node("userca");
    let worker = cluster.join(&name).await;
    cluster.await_ready(&name).await;
    let client = cluster.client();
    let id = client.submit(&web_task("userca-web")).await;
    let task = client.await_state(&id, "Running").await;
    assert_eq!(task["NodeName"], name.as_str());
    drop(worker);
}
