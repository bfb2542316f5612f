//! Secrets, named volumes and private registries as a user meets them, against real `cube
//! manager` and `cube worker` processes, the real Docker engine and a real registry: a
//! secret read from inside its task and found nowhere else (the store file, the logs, the
//! API's answers, the events, `docker inspect`); what other projects' and read tokens can do
//! with it; a job's copy that finds its volume again on its node; a volume in use that is not
//! removed; an image pulled from a password-protected registry after `cube registry login`
//! and refused before.

mod support;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use support::{Client, ManagerProcess, unique_node};

/// Runs `cube` with `env` added and `stdin` written to it: success, stdout, stderr.
fn cube_with_input(env: &[(&str, &str)], args: &[&str], stdin: &str) -> (bool, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cube"));
    command
        .args(args)
        .env_remove("CUBE_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("run cube");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

/// Every file under `dir` that holds `needle`, read as bytes.
fn files_holding(dir: &Path, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_holding(&path, needle));
        } else if let Ok(bytes) = std::fs::read(&path)
            && bytes
                .windows(needle.len())
                .any(|window| window == needle.as_bytes())
        {
            found.push(path.display().to_string());
        }
    }
    found
}

/// Everything `GET /events` streams from now on, gathered as text until read.
struct EventText {
    text: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    task: tokio::task::JoinHandle<()>,
}

impl EventText {
    async fn open(base: &str, token: &str) -> EventText {
        let mut response = support::http()
            .get(format!("{base}/events?project=*"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let text = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let gathered = text.clone();
        let task = tokio::spawn(async move {
            while let Ok(Some(chunk)) = response.chunk().await {
                gathered.lock().unwrap().extend_from_slice(&chunk);
            }
        });
        EventText { text, task }
    }

    fn read(self) -> String {
        self.task.abort();
        String::from_utf8_lossy(&self.text.lock().unwrap()).to_string()
    }
}

fn docker(args: &[&str]) -> (bool, String) {
    let output = Command::new("docker").args(args).output().expect("docker");
    (
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

#[tokio::test]
async fn a_secret_reaches_its_task_at_run_secrets_and_nowhere_else() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start_with("epvm", "persistent", dir.path(), 0, &["--acl"]);
    let management = support::bootstrap(&manager).await;
    let admin = Client::with_token(&manager.url, &management);
    for project in ["team-a", "team-b"] {
        let answer = admin
            .request_answer(
                "POST",
                "/projects",
                Some(&json!({"Name": project}).to_string()),
            )
            .await;
        assert_eq!(answer.status, 201, "{}", answer.body);
    }
    let node = unique_node("secret");
    let worker = support::join_with_node_token(&manager, &management, &node, "persistent").await;
    let a_token = support::token_in(&manager, &management, "submit", &["team-a"]).await;
    let b_token = support::token_in(&manager, &management, "submit", &["team-b"]).await;
    let read_token = support::token_in(&manager, &management, "read", &["*"]).await;
    let a = Client::with_token(&manager.url, &a_token);
    let b = Client::with_token(&manager.url, &b_token);
    let reader = Client::with_token(&manager.url, &read_token);
    let address = manager.address();
    let a_env = [
        ("CUBE_MANAGER", address.as_str()),
        ("CUBE_TOKEN", a_token.as_str()),
        ("CUBE_PROJECT", "team-a"),
    ];

    // Made from standard input, never from an argument.
    let value = format!("pw-{}", uuid_text());
    let (ok, out, err) = cube_with_input(&a_env, &["secret", "create", "db-password"], &value);
    assert!(ok, "secret create: {out}{err}");
    assert!(out.contains("version 1"), "{out}");
    let (ok, out, err) = cube_with_input(&a_env, &["secret", "create", "empty"], "");
    assert!(
        !ok && err.contains("empty"),
        "an empty value is refused: {out}{err}"
    );

    // Every event from here on, to look for the value in.
    let events = EventText::open(&manager.url, &management).await;
    // A task of team-a reads it at /run/secrets/db-password.
    let task = json!({"Name": "db", "Image": support::SAMPLE_IMAGE,
        "Cmd": ["sh", "-c", "sleep 3600"], "Secrets": ["db-password"]});
    let answer = a
        .request_answer("POST", "/tasks?project=team-a", Some(&task.to_string()))
        .await;
    assert_eq!(answer.status, 201, "{}", answer.body);
    let id = answer.body["ID"].as_str().unwrap().to_string();
    let running = a.await_state(&id, "Running").await;
    let (ok, out, err) = support::cube_cli_env(
        &a_env,
        &["exec", &id, "--", "cat", "/run/secrets/db-password"],
    );
    assert!(ok, "cube exec: {out}{err}");
    assert_eq!(out, value, "the task reads the secret's value");
    let (ok, out, _) = support::cube_cli_env(
        &a_env,
        &[
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "echo x > /run/secrets/db-password",
        ],
    );
    assert!(!ok || out.is_empty(), "the secret is read-only");

    // A task naming a secret its project does not have is refused, naming it.
    let missing = json!({"Name": "x", "Image": support::SAMPLE_IMAGE, "Secrets": ["nope"]});
    let answer = a
        .request_answer("POST", "/tasks?project=team-a", Some(&missing.to_string()))
        .await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert!(
        answer.message().contains("\"nope\""),
        "{}",
        answer.message()
    );

    // Another project cannot list it, use it, or be given it.
    let listed = b.get("/secrets?project=team-a").await;
    assert_eq!(listed.status, 404, "{}", listed.body);
    let listed = b.get("/secrets?project=team-b").await;
    assert_eq!(listed.body, json!([]), "team-b has no secrets");
    let used = b
        .request_answer("POST", "/tasks?project=team-b", Some(&task.to_string()))
        .await;
    assert_eq!(
        used.status, 400,
        "team-b's task cannot use team-a's secret: {}",
        used.body
    );
    let fetched = b.get(&format!("/nodes/{node}/secrets?task={id}")).await;
    assert_eq!(
        fetched.status, 403,
        "only the node is given values: {}",
        fetched.body
    );
    let fetched = admin.get(&format!("/nodes/{node}/secrets?task={id}")).await;
    assert_eq!(fetched.status, 403, "not even management: {}", fetched.body);
    // A read token sees names and versions, never a value.
    let listed = reader.get("/secrets?project=*").await;
    assert_eq!(listed.status, 200);
    assert_eq!(listed.body[0]["Name"], "db-password");
    assert_eq!(listed.body[0]["Version"], 1);
    assert!(listed.body[0].get("Value").is_none() && listed.body[0].get("Sealed").is_none());
    let created = reader
        .request_answer(
            "POST",
            "/secrets?project=team-a",
            Some(&json!({"Name": "x", "Value": "eA=="}).to_string()),
        )
        .await;
    assert_eq!(created.status, 403, "{}", created.body);
    // In use: not removed.
    let (ok, _, err) = support::cube_cli_env(&a_env, &["secret", "rm", "db-password"]);
    assert!(!ok && err.contains("in use"), "{err}");

    // Nowhere else: the API's answers, the events, docker inspect, the store files, the logs.
    let tasks = a.get("/tasks?project=team-a").await;
    assert!(!tasks.body.to_string().contains(&value));
    assert!(
        running.to_string().contains("db-password"),
        "names only: {running}"
    );
    let events = events.read();
    assert!(events.contains(&id), "the events were read: {events}");
    assert!(!events.contains(&value), "no value in the events");
    let container = running["ContainerID"].as_str().unwrap();
    let (ok, inspect) = docker(&["inspect", container]);
    assert!(ok, "{inspect}");
    assert!(!inspect.contains(&value), "no value in docker inspect");
    let inspected: Value = serde_json::from_str(&inspect).unwrap();
    let binds = inspected[0]["HostConfig"]["Binds"].to_string();
    assert!(
        binds.contains("/dev/shm/cube-secrets/") && binds.contains(":/run/secrets/db-password:ro"),
        "bound from tmpfs, read-only: {binds}"
    );
    let host_side = binds
        .split('"')
        .find(|bind| bind.contains("/dev/shm/cube-secrets/"))
        .and_then(|bind| bind.split(':').next())
        .unwrap()
        .to_string();
    assert!(
        !Path::new(&host_side).exists(),
        "no path to the value is left on the host: {host_side}"
    );
    let found = files_holding(dir.path(), &value);
    assert!(found.is_empty(), "the value is in {found:?}");
    assert!(!manager.stderr().contains(&value) && !worker.stderr().contains(&value));

    // A new version; the running task keeps the value it started with.
    let second = format!("pw2-{}", uuid_text());
    let (ok, out, err) = cube_with_input(&a_env, &["secret", "create", "db-password"], &second);
    assert!(ok && out.contains("version 2"), "{out}{err}");
    let (_, out, _) = support::cube_cli_env(
        &a_env,
        &["exec", &id, "--", "cat", "/run/secrets/db-password"],
    );
    assert_eq!(out, value);
    let (ok, out, _) = support::cube_cli_env(&a_env, &["secret", "list"]);
    assert!(
        ok && out.contains("db-password") && !out.contains(&second),
        "{out}"
    );
    assert!(files_holding(dir.path(), &second).is_empty());

    // Stopped: the secret can go.
    assert_eq!(
        a.delete(&format!("/tasks/{id}?project=team-a"))
            .await
            .status,
        204
    );
    a.await_task(&id, "ended", |task| task["State"] == "Completed")
        .await;
    let (ok, out, err) = support::cube_cli_env(&a_env, &["secret", "rm", "db-password"]);
    assert!(ok, "{out}{err}");
    assert_eq!(a.get("/secrets?project=team-a").await.body, json!([]));
}

fn uuid_text() -> String {
    let mut bytes = [0u8; 12];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut file| std::io::Read::read_exact(&mut file, &mut bytes))
        .unwrap();
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[tokio::test]
async fn a_job_copy_finds_its_volume_again_and_a_volume_in_use_is_not_removed() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("epvm", "memory", dir.path(), 0);
    let first = unique_node("vol-a");
    let second = unique_node("vol-b");
    let _a = manager.join_worker(&first, &[]);
    let _b = manager.join_worker(&second, &[]);
    manager.await_ready_nodes(2).await;
    let client = manager.client();
    let job_name = format!("db{}", &uuid_text()[..6]);
    let job = json!({"Name": job_name, "Type": "service", "Groups": [{"Name": "db", "Count": 1,
        "Task": {"Image": support::SAMPLE_IMAGE, "Volumes": ["data:/var/lib/db"],
                 "Cmd": ["sh", "-c", "echo run >> /var/lib/db/runs; sleep 3600"]}}]});
    let volume = format!("data.{job_name}.db.0");
    let address = manager.address();
    let env = [("CUBE_MANAGER", address.as_str())];

    let mut placed_on = String::new();
    for run in 1..=2 {
        let answer = client
            .request_answer("POST", "/jobs", Some(&job.to_string()))
            .await;
        assert!(
            answer.status == 201 || answer.status == 200,
            "{}",
            answer.body
        );
        let copy = client
            .await_job(&job_name, "its copy running", |job| {
                support::live_tasks(job)
                    .iter()
                    .any(|task| task["State"] == "Running")
            })
            .await;
        let task = support::live_tasks(&copy)
            .into_iter()
            .find(|task| task["State"] == "Running")
            .unwrap();
        let id = task["ID"].as_str().unwrap().to_string();
        let node = task["NodeName"].as_str().unwrap().to_string();
        if run == 1 {
            placed_on = node;
            // In use: not removed.
            let (ok, _, err) = support::cube_cli_env(&env, &["volume", "rm", &volume]);
            assert!(!ok && err.contains("in use"), "{err}");
        } else {
            assert_eq!(
                node, placed_on,
                "the copy is back on the node holding its volume"
            );
            let history = client.get(&format!("/tasks/{id}")).await.body["History"].to_string();
            assert!(
                history.contains(&format!("which holds its volume {volume}")),
                "its history says why: {history}"
            );
        }
        let (ok, out, err) =
            support::cube_cli_env(&env, &["exec", &id, "--", "cat", "/var/lib/db/runs"]);
        assert!(ok, "{err}");
        assert_eq!(
            out.lines().count(),
            run,
            "what every run wrote is there: {out:?}"
        );
        let (ok, out, _) = support::cube_cli_env(&env, &["volume", "ls"]);
        assert!(
            ok && out.contains(&volume) && out.contains(&placed_on),
            "{out}"
        );
        assert_eq!(
            client.delete(&format!("/jobs/{job_name}")).await.status,
            200
        );
        client
            .await_task(&id, "stopped", |task| task["State"] == "Completed")
            .await;
    }
    // Stopped: removed, from the engine too.
    let (ok, out, err) = support::cube_cli_env(&env, &["volume", "rm", &volume]);
    assert!(ok, "{out}{err}");
    let (_, listed) = docker(&["volume", "ls", "-q"]);
    assert!(!listed.contains(&volume), "{listed}");
}

#[tokio::test]
async fn an_image_from_a_private_registry_is_pulled_after_login_and_refused_before() {
    support::ensure_sample_image();
    let registry = cube_test_support::Registry::start();
    let repo = format!("cube-private-{}", &uuid_text()[..8]);
    let image = registry.push(support::SAMPLE_IMAGE, &repo);
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("epvm", "memory", dir.path(), 0);
    let _worker = manager.join_worker(&unique_node("reg"), &[]);
    manager.await_ready_nodes(1).await;
    let client = manager.client();
    let address = manager.address();
    let env = [("CUBE_MANAGER", address.as_str())];
    let task = json!({"Name": "private", "Image": image, "Cmd": ["sh", "-c", "sleep 3600"]});

    // Before a login: the pull is refused, and the task says why.
    let id = client.submit(&task).await;
    let failed = client.await_state(&id, "Failed").await;
    let error = failed["Error"].as_str().unwrap_or_default().to_string();
    assert!(error.starts_with("unauthorized"), "{error}");

    // A wrong password is refused at login.
    let (ok, out, err) = cube_with_input(
        &env,
        &[
            "registry",
            "login",
            registry.address(),
            "--username",
            registry.username(),
            "--password-stdin",
        ],
        "wrong",
    );
    assert!(!ok && err.contains("unauthorized"), "{out}{err}");
    let (ok, out, err) = cube_with_input(
        &env,
        &[
            "registry",
            "login",
            registry.address(),
            "--username",
            registry.username(),
            "--password-stdin",
        ],
        &format!("{}\n", registry.password()),
    );
    assert!(ok && out.contains("checked"), "{out}{err}");
    let (_, listed, _) = support::cube_cli_env(&env, &["secret", "list"]);
    assert!(
        listed.contains(&format!("registry:{}", registry.address())),
        "{listed}"
    );
    assert!(!listed.contains(registry.password()));

    // After it: pulled and running.
    let id = client.submit(&task).await;
    client.await_state(&id, "Running").await;
    // An image the registry does not have: `not found`.
    let missing =
        json!({"Name": "missing", "Image": format!("{}/no-such-image:1", registry.address())});
    let id = client.submit(&missing).await;
    let failed = client.await_state(&id, "Failed").await;
    let error = failed["Error"].as_str().unwrap_or_default().to_string();
    assert!(error.starts_with("not found"), "{error}");
    assert!(files_holding(dir.path(), registry.password()).is_empty());
    let _ = docker(&["rmi", "-f", &image]);
}

/// The README's "Secrets, volumes and private registries" session, as written, against `cube
/// dev`: the web service and its database (`examples/shop.json`).
#[tokio::test]
async fn the_readme_shop_runs_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start_dev(&unique_node("shop"), dir.path());
    let address = manager.address();
    let env = [("CUBE_MANAGER", address.as_str())];
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/shop.json");
    let run = |args: &[&str]| {
        let (ok, out, err) = support::cube_cli_env(&env, args);
        assert!(ok, "cube {args:?}: {out}{err}");
        out
    };
    let (ok, out, err) = cube_with_input(
        &env,
        &["secret", "create", "db-password"],
        "correct-horse-battery",
    );
    assert!(ok, "{out}{err}");
    run(&["job", "run", example]);
    assert_eq!(
        run(&[
            "exec",
            "shop.db[0]",
            "--",
            "cat",
            "/run/secrets/db-password"
        ]),
        "correct-horse-battery"
    );
    assert_eq!(
        run(&["exec", "shop.db[0]", "--", "cat", "/var/lib/db/starts"]),
        "start\n"
    );
    let web = run(&["exec", "shop.web[1]", "--", "env"]);
    assert!(web.contains("DB_PASSWORD=correct-horse-battery"), "{web}");
    let volumes = run(&["volume", "ls"]);
    assert!(volumes.contains("data.shop.db.0"), "{volumes}");
    run(&["job", "stop", "shop", "--wait"]);
    run(&["job", "run", example]);
    assert_eq!(
        run(&["exec", "shop.db[0]", "--", "cat", "/var/lib/db/starts"]),
        "start\nstart\n"
    );
    let listed = run(&["secret", "list"]);
    assert!(
        listed.contains("db-password") && !listed.contains("correct-horse"),
        "{listed}"
    );

    // A compose file's services name the secrets they read, as compose does.
    let compose = dir.path().join("app.yml");
    std::fs::write(
        &compose,
        format!(
            "services:\n  app:\n    image: {image}\n    command: [\"sleep\", \"3600\"]\n    \
             secrets: [db-password]\n  side:\n    image: {image}\n    command: [\"sleep\", \
             \"3600\"]\n    secrets:\n      - source: db-password\n        target: pw\n\
             secrets:\n  db-password:\n    external: true\n",
            image = support::SAMPLE_IMAGE
        ),
    )
    .unwrap();
    let id = run(&["run", "-f", &compose.display().to_string()])
        .trim()
        .to_string();
    manager.client().await_state(&id, "Running").await;
    assert_eq!(
        run(&["exec", &id, "--", "cat", "/run/secrets/db-password"]),
        "correct-horse-battery"
    );
    assert_eq!(
        run(&["exec", "-c", "side", &id, "--", "cat", "/run/secrets/pw"]),
        "correct-horse-battery"
    );
    let from_file =
        "services:\n  app:\n    image: x\n    secrets: [s]\nsecrets:\n  s:\n    file: ./s.txt\n";
    std::fs::write(&compose, from_file).unwrap();
    let (ok, _, err) = support::cube_cli_env(&env, &["run", "-f", &compose.display().to_string()]);
    assert!(!ok && err.contains("cube secret create s"), "{err}");
    run(&["stop", &id]);
    run(&["job", "stop", "shop", "--wait"]);
    run(&["volume", "rm", "data.shop.db.0"]);
    run(&["secret", "rm", "db-password"]);
    assert!(!run(&["volume", "ls"]).contains("data.shop.db.0"));
}
