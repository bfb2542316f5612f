//! Helpers that read like the scenarios: start a real `cube worker` process, talk to it over
//! HTTP, wait for a task to reach a state, and ask Docker what really runs.
#![allow(dead_code)] // Each test binary uses a different part of the helpers.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub const SAMPLE_IMAGE: &str = "cube-sample:latest";

/// How long a task may take to reach a state in these tests. Docker starts a container in
/// ~220 ms on the test machine; the bound leaves room for a loaded CI machine.
pub const STATE_BOUND: Duration = Duration::from_secs(20);

fn cube_binary() -> &'static str {
    env!("CARGO_BIN_EXE_cube")
}

/// Builds the sample image once per test binary (a no-op when it exists).
pub fn ensure_sample_image() {
    static BUILT: Once = Once::new();
    BUILT.call_once(|| {
        let present = Command::new("docker")
            .args(["image", "inspect", SAMPLE_IMAGE])
            .output();
        if present.is_ok_and(|output| output.status.success()) {
            return;
        }
        let output = Command::new(cube_binary())
            .arg("sample-image")
            .output()
            .expect("run cube sample-image");
        assert!(
            output.status.success(),
            "cube sample-image failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    });
}

/// A unique node name, so that tests running side by side never touch each other's containers.
pub fn unique_node(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

/// A `cube worker` process on an ephemeral loopback port.
pub struct WorkerProcess {
    pub name: String,
    /// The temporary data directory a [`WorkerProcess::fresh`] worker owns; removed with it.
    _own_dir: Option<tempfile::TempDir>,
    pub data_dir: PathBuf,
    pub url: String,
    child: Child,
    stderr_path: PathBuf,
    /// Removes the node's containers when the test ends (also when it fails).
    cleanup_containers: bool,
}

impl WorkerProcess {
    /// Starts a worker named `name` with the given store under `data_dir`.
    pub fn start(name: &str, dbtype: &str, data_dir: &Path) -> WorkerProcess {
        WorkerProcess::start_with(name, dbtype, data_dir, &[])
    }

    /// Starts a worker with more flags (`--manager`, `--memory`, ...).
    pub fn start_with(name: &str, dbtype: &str, data_dir: &Path, extra: &[&str]) -> WorkerProcess {
        WorkerProcess::start_on(name, dbtype, data_dir, 0, extra)
    }

    /// [`WorkerProcess::start_with`] on a given port (0: an ephemeral one), for a worker that
    /// comes back at the address it had.
    pub fn start_on(
        name: &str,
        dbtype: &str,
        data_dir: &Path,
        port: u16,
        extra: &[&str],
    ) -> WorkerProcess {
        let port = port.to_string();
        let mut args = vec![
            "worker",
            "-H",
            "127.0.0.1",
            "-p",
            &port,
            "-n",
            name,
            "-d",
            dbtype,
            "--stop-timeout",
            "2s",
        ];
        args.extend_from_slice(extra);
        let (child, url, stderr_path) = spawn_cube(&args, data_dir, name);
        WorkerProcess {
            name: name.to_string(),
            data_dir: data_dir.to_path_buf(),
            url,
            _own_dir: None,
            child,
            stderr_path,
            cleanup_containers: true,
        }
    }

    /// A worker with a unique name (starting with `prefix`), the memory store and a temporary
    /// data directory of its own, with the sample image built.
    pub fn fresh(prefix: &str) -> WorkerProcess {
        ensure_sample_image();
        let dir = tempfile::tempdir().unwrap();
        let mut worker = WorkerProcess::start(&unique_node(prefix), "memory", dir.path());
        worker._own_dir = Some(dir);
        worker
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, as when the process crashes; its containers stay.
    pub fn kill_9(mut self) {
        self.cleanup_containers = false;
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Sends SIGTERM and waits up to `bound` for the process to exit; returns its exit status.
    pub fn terminate(mut self, bound: Duration) -> std::process::ExitStatus {
        self.cleanup_containers = false;
        signal_and_wait(&mut self.child, "-TERM", bound)
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    pub fn client(&self) -> Client {
        Client {
            base: self.url.clone(),
            http: http(),
        }
    }

    /// Sends a signal (`-STOP` freezes the process as a network partition would look from
    /// the manager; `-CONT` lets it go on).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal}");
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if self.cleanup_containers {
            remove_node_containers(&self.name);
        }
    }
}

/// Starts `cube ARGS --data-dir DIR`, logging to `DIR/LOG_NAME.stderr`, and reads the
/// `http://` address from the first line it prints.
fn spawn_cube(args: &[&str], data_dir: &Path, log_name: &str) -> (Child, String, PathBuf) {
    // A process started again on the same directory adds to its log.
    let (mut child, line, stderr_path) = spawn_cube_for_a_line(args, data_dir, log_name, true);
    let Some(url) = cube_api::address_in_listening_line(&line) else {
        let _ = child.kill();
        panic!(
            "cube {args:?} did not print its address; stdout: {line:?}; stderr: {}",
            std::fs::read_to_string(&stderr_path).unwrap_or_default()
        );
    };
    (child, url.to_string(), stderr_path)
}

/// Signals a child process and waits up to `bound` for it to exit.
fn signal_and_wait(child: &mut Child, signal: &str, bound: Duration) -> std::process::ExitStatus {
    let status = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + bound;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "process did not exit within {bound:?} of {signal}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `cube manager` process on a loopback port.
pub struct ManagerProcess {
    pub url: String,
    pub port: u16,
    pub data_dir: PathBuf,
    child: Child,
    stderr_path: PathBuf,
    /// `cube dev`'s node: its containers are removed with the process, as a
    /// [`WorkerProcess`]'s are (a test left its task running after it).
    dev_node: Option<String>,
}

impl ManagerProcess {
    /// Starts a manager with `scheduler` and `dbtype` under `data_dir` on `port` (0 picks
    /// one; give the same port to a restarted manager so that its workers find it again).
    pub fn start(scheduler: &str, dbtype: &str, data_dir: &Path, port: u16) -> ManagerProcess {
        ManagerProcess::start_with(scheduler, dbtype, data_dir, port, &[])
    }

    /// Starts a manager with more flags (`-w`, `--heartbeat-grace`, ...).
    pub fn start_with(
        scheduler: &str,
        dbtype: &str,
        data_dir: &Path,
        port: u16,
        extra: &[&str],
    ) -> ManagerProcess {
        let port_text = port.to_string();
        let mut args = vec![
            "manager",
            "-H",
            "127.0.0.1",
            "-p",
            &port_text,
            "-s",
            scheduler,
            "-d",
            dbtype,
        ];
        args.extend_from_slice(extra);
        let (child, url, stderr_path) = spawn_cube(&args, data_dir, "manager");
        let port = url.rsplit(':').next().unwrap().parse().unwrap();
        ManagerProcess {
            url,
            port,
            data_dir: data_dir.to_path_buf(),
            child,
            stderr_path,
            dev_node: None,
        }
    }

    /// Starts `cube dev` (a manager and a worker named `worker` in one process, persistent
    /// store under `data_dir`) on free ports; the manager's address is the one printed first.
    pub fn start_dev(worker: &str, data_dir: &Path) -> ManagerProcess {
        ManagerProcess::start_dev_with(worker, data_dir, &[])
    }

    /// [`ManagerProcess::start_dev`] with more flags (`--acl`).
    pub fn start_dev_with(worker: &str, data_dir: &Path, extra: &[&str]) -> ManagerProcess {
        ensure_sample_image();
        let mut args = vec!["dev", "-p", "0", "--worker-port", "0", "-n", worker];
        args.extend_from_slice(extra);
        let (child, url, stderr_path) = spawn_cube(&args, data_dir, "dev");
        let port = url.rsplit(':').next().unwrap().parse().unwrap();
        ManagerProcess {
            url,
            port,
            data_dir: data_dir.to_path_buf(),
            child,
            stderr_path,
            dev_node: Some(worker.to_string()),
        }
    }

    /// `HOST:PORT`, for `--manager` and `CUBE_MANAGER`.
    pub fn address(&self) -> String {
        self.url.trim_start_matches("http://").to_string()
    }

    pub fn client(&self) -> Client {
        Client {
            base: self.url.clone(),
            http: http(),
        }
    }

    /// SIGKILL, as when the process crashes.
    pub fn kill_9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    pub fn terminate(mut self, bound: Duration) -> std::process::ExitStatus {
        signal_and_wait(&mut self.child, "-TERM", bound)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal (`-STOP` pauses the process as a long GC or a partition would;
    /// `-CONT` lets it go on).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal}");
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Starts a worker named `name` (memory store, its own directory under the manager's)
    /// that registers with this manager; `extra` adds flags such as `--memory 1GiB`.
    pub fn join_worker(&self, name: &str, extra: &[&str]) -> WorkerProcess {
        self.join_worker_with(name, "memory", extra)
    }

    /// [`ManagerProcess::join_worker`] with the given store; started again with the same
    /// name and the persistent store, a worker finds its tasks again.
    pub fn join_worker_with(&self, name: &str, dbtype: &str, extra: &[&str]) -> WorkerProcess {
        ensure_sample_image();
        let manager = self.address();
        let mut args = vec![
            "--manager",
            manager.as_str(),
            "--heartbeat-interval",
            "300ms",
        ];
        args.extend_from_slice(extra);
        WorkerProcess::start_with(name, dbtype, &self.data_dir.join(name), &args)
    }

    /// Waits until the manager lists `count` nodes, all `Ready`.
    pub async fn await_ready_nodes(&self, count: usize) -> Value {
        self.await_nodes(&format!("{count} nodes Ready"), |nodes| {
            nodes
                .as_array()
                .map(|nodes| nodes.iter().filter(|n| n["Status"] == "Ready").count())
                == Some(count)
        })
        .await
    }

    /// Polls `GET /nodes` every 20 ms until `done` holds; fails after `STATE_BOUND`.
    pub async fn await_nodes(&self, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let client = self.client();
        let deadline = Instant::now() + STATE_BOUND;
        loop {
            let nodes = client.get("/nodes").await.body;
            if done(&nodes) {
                return nodes;
            }
            assert!(
                Instant::now() < deadline,
                "not {what} within {STATE_BOUND:?}: {nodes}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for ManagerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(node) = &self.dev_node {
            remove_node_containers(node);
        }
    }
}

/// A loopback port free now (bound and released), for a process that must keep its port
/// across a restart.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs the `cube` command line with `args` against the manager at `manager`; returns the
/// exit status's success, stdout and stderr.
pub fn cube_cli(manager: &str, args: &[&str]) -> (bool, String, String) {
    let output = Command::new(cube_binary())
        .args(args)
        .env("CUBE_MANAGER", manager)
        .output()
        .expect("run cube");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

/// Removes every container labelled for `node`.
pub fn remove_node_containers(node: &str) {
    for id in containers_with_label(&format!("cube.node={node}")) {
        let _ = Command::new("docker").args(["rm", "-f", &id]).output();
    }
}

/// IDs of all containers (running or not) carrying `label` (`key=value`).
pub fn containers_with_label(label: &str) -> Vec<String> {
    docker_ps(label, true)
}

/// IDs of the running containers carrying `label` (`key=value`).
pub fn running_containers_with_label(label: &str) -> Vec<String> {
    docker_ps(label, false)
}

fn docker_ps(label: &str, all: bool) -> Vec<String> {
    let mut args = vec!["ps", "-q", "--no-trunc"];
    if all {
        args.push("-a");
    }
    let filter = format!("label={label}");
    args.extend(["--filter", &filter]);
    let output = Command::new("docker")
        .args(&args)
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Whether Docker says the container runs.
pub fn container_running(id: &str) -> bool {
    let output = Command::new("docker")
        .args(["inspect", "-f", "{{.State.Running}}", id])
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout).trim() == "true"
}

/// `GET http://127.0.0.1:{port}{path}` from inside the container (`docker exec`, busybox
/// `wget`): the real server's status, with nothing between. The host's way to a container
/// (Docker's proxy, the bridge) broke on this machine once an engine was killed with its
/// shims: the containers' processes outlived them with their addresses, which the next engine
/// gave again, and the host reached those orphans (seen 2026-11-27; `scripts/chaos.sh` now
/// kills them). A test that checks what the server answers asks from inside. Retried while the
/// server does not listen yet; returns the status.
pub async fn get_in_container(container: &str, port: u16, path: &str) -> u16 {
    let url = format!("http://127.0.0.1:{port}{path}");
    let deadline = Instant::now() + STATE_BOUND;
    loop {
        let output = Command::new("docker")
            .args([
                "exec",
                container,
                "wget",
                "-S",
                "-q",
                "-O",
                "/dev/null",
                &url,
            ])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&output.stderr).to_string();
        let status = said
            .lines()
            .rev()
            .filter_map(|line| line.trim().strip_prefix("HTTP/1."))
            .filter_map(|rest| rest.split_whitespace().nth(1))
            .find_map(|code| code.parse::<u16>().ok());
        if let Some(status) = status {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "{url} in {container} did not answer within {STATE_BOUND:?}: {said}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An HTTP client for one worker.
pub struct Client {
    pub base: String,
    pub http: reqwest::Client,
}

/// A status code and a JSON body (`Value::Null` when there is none).
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

impl Answer {
    pub fn message(&self) -> String {
        self.body["Message"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

impl Client {
    /// A client for `base` that sends `token` as `Authorization: Bearer` on every request.
    pub fn with_token(base: &str, token: &str) -> Client {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            reqwest::header::HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        );
        Client {
            base: base.to_string(),
            http: http_builder().default_headers(headers).build().unwrap(),
        }
    }

    /// `method path` with `body` (JSON text), answered once its status and headers came (the
    /// body of a stream is not waited for).
    pub async fn request(&self, method: &str, path: &str, body: Option<&str>) -> u16 {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.to_string());
        }
        request.send().await.unwrap().status().as_u16()
    }

    /// [`Client::request`], with the JSON body of the answer (for answers that end).
    pub async fn request_answer(&self, method: &str, path: &str, body: Option<&str>) -> Answer {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.to_string());
        }
        answer(request.send().await.unwrap()).await
    }

    pub async fn post_raw(&self, path: &str, body: impl Into<reqwest::Body>) -> Answer {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .body(body)
            .send()
            .await
            .unwrap();
        answer(response).await
    }

    pub async fn post(&self, body: &Value) -> Answer {
        self.post_raw("/tasks", body.to_string()).await
    }

    pub async fn get(&self, path: &str) -> Answer {
        self.send(reqwest::Method::GET, path).await
    }

    pub async fn delete(&self, path: &str) -> Answer {
        self.send(reqwest::Method::DELETE, path).await
    }

    async fn send(&self, method: reqwest::Method, path: &str) -> Answer {
        let url = format!("{}{path}", self.base);
        answer(self.http.request(method, url).send().await.unwrap()).await
    }

    /// Submits a task and returns its ID, asserting the 201.
    pub async fn submit(&self, body: &Value) -> String {
        let answer = self.post(body).await;
        assert_eq!(answer.status, 201, "submit: {}", answer.body);
        answer.body["ID"].as_str().unwrap().to_string()
    }

    /// Submits a task and waits until it runs; returns its ID and the running task.
    pub async fn run(&self, body: &Value) -> (String, Value) {
        let id = self.submit(body).await;
        let running = self.await_state(&id, "Running").await;
        (id, running)
    }

    /// Polls the task every 20 ms until its `State` is `state`; fails after `STATE_BOUND`,
    /// or at once when it reaches another terminal state.
    pub async fn await_state(&self, id: &str, state: &str) -> Value {
        self.await_task(id, &format!("State {state}"), |task| {
            let now = task["State"].as_str().unwrap_or_default();
            assert!(
                !(matches!(now, "Completed" | "Failed") && now != state),
                "task {id} ended {now} while waiting for {state}: {task}"
            );
            now == state
        })
        .await
    }

    /// Polls the task every 20 ms until `done` holds for it; fails after `STATE_BOUND`.
    pub async fn await_task(&self, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let path = format!("/tasks/{id}");
        let poll = Poll::every(Duration::from_millis(20), STATE_BOUND);
        self.await_answer(&path, &format!("task {id}: no {what}"), poll, |answer| {
            done(&answer.body)
        })
        .await
        .body
    }

    /// Polls `GET path` until `done` holds for the answer; fails after `poll.bound`, saying
    /// `what` was not seen, with the answer last seen.
    pub async fn await_answer(
        &self,
        path: &str,
        what: &str,
        poll: Poll,
        done: impl Fn(&Answer) -> bool,
    ) -> Answer {
        match self.poll_answer(path, poll, done).await {
            Ok(answer) => answer,
            Err(answer) => panic!(
                "{what} within {:?}: {} {}",
                poll.bound, answer.status, answer.body
            ),
        }
    }

    /// Polls `GET path` until `done` holds for the answer; after `poll.bound`, the answer
    /// last seen as the error, for a caller that says more than [`Client::await_answer`].
    pub async fn poll_answer(
        &self,
        path: &str,
        poll: Poll,
        done: impl Fn(&Answer) -> bool,
    ) -> Result<Answer, Answer> {
        let deadline = Instant::now() + poll.bound;
        loop {
            let answer = self.get(path).await;
            if done(&answer) {
                return Ok(answer);
            }
            if Instant::now() >= deadline {
                return Err(answer);
            }
            tokio::time::sleep(poll.every).await;
        }
    }
}

/// How often [`Client::await_answer`] asks, and for how long.
#[derive(Debug, Clone, Copy)]
pub struct Poll {
    pub every: Duration,
    pub bound: Duration,
}

impl Poll {
    pub fn every(every: Duration, bound: Duration) -> Poll {
        Poll { every, bound }
    }
}

impl Client {
    /// Polls `GET /jobs/{name}` every 100 ms until `done` holds; fails after 60 s with the
    /// job as last seen.
    pub async fn await_job(&self, name: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let path = format!("/jobs/{name}");
        let poll = Poll::every(Duration::from_millis(100), Duration::from_secs(60));
        self.await_answer(&path, &format!("job {name}: not {what}"), poll, |answer| {
            done(&answer.body)
        })
        .await
        .body
    }
}

impl Client {
    /// Polls `GET /queue/{kind}/{id}` every 20 ms until the request has its entry (the queue
    /// controller writes it after the submission is answered); fails after `STATE_BOUND`.
    pub async fn await_queue_entry(&self, kind: &str, id: &str) -> Value {
        let path = format!("/queue/{kind}/{id}");
        let what = format!("{kind} {id}: no entry in the waiting list");
        let poll = Poll::every(Duration::from_millis(20), STATE_BOUND);
        self.await_answer(&path, &what, poll, |answer| answer.status == 200)
            .await
            .body
    }
}

/// A job's copies that are meant to run and have not ended, from `GET /jobs/{name}`.
pub fn live_tasks(job: &Value) -> Vec<Value> {
    job["Tasks"]
        .as_array()
        .map(|tasks| {
            tasks
                .iter()
                .filter(|task| {
                    task["DesiredState"] == "Running"
                        && task["State"] != "Failed"
                        && task["State"] != "Completed"
                })
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

async fn answer(response: reqwest::Response) -> Answer {
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text)
            .unwrap_or_else(|_| panic!("status {status}: body is not JSON: {text:?}"))
    };
    Answer { status, body }
}

/// A task running the sample image's httpd with its port published on an ephemeral host port.
pub fn web_task(name: &str) -> Value {
    json!({"Name": name, "Image": SAMPLE_IMAGE, "ExposedPorts": {"7777/tcp": {}}, "PortBindings": {"7777/tcp": ""}})
}

/// A task whose container runs `script` in the sample image's shell.
pub fn shell_task(name: &str, script: &str) -> Value {
    json!({"Name": name, "Image": SAMPLE_IMAGE, "Cmd": ["sh", "-c", script]})
}

/// The first host port Docker bound for `port` in a task's `HostPorts`.
pub fn host_port(task: &Value, port: &str) -> u16 {
    task["HostPorts"][port][0]["HostPort"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// Runs the `cube` command line with `args` and only the environment `env` adds to this
/// process's, without `CUBE_MANAGER` or `CUBE_CONFIG` unless `env` sets them: for the tests of
/// which manager a command reaches. Returns the exit status's success, stdout and stderr.
pub fn cube_cli_env(env: &[(&str, &str)], args: &[&str]) -> (bool, String, String) {
    let mut command = Command::new(cube_binary());
    command
        .args(args)
        .env_remove("CUBE_MANAGER")
        .env_remove("CUBE_CONFIG");
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command.output().expect("run cube");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

/// How a `cube` process that was expected to refuse to start ended.
#[derive(Debug)]
pub struct Refusal {
    pub status: std::process::ExitStatus,
    pub stderr: String,
}

impl ManagerProcess {
    /// Starts a persistent-store manager on port 0 under `data_dir`, or, when it does not
    /// start, waits (up to [`STATE_BOUND`]) for it to exit and says how it ended.
    pub fn try_start(data_dir: &Path) -> Result<ManagerProcess, Refusal> {
        ManagerProcess::try_start_with(
            &["manager", "-H", "127.0.0.1", "-p", "0", "-d", "persistent"],
            data_dir,
        )
    }

    /// `cube ARGS --data-dir DIR` (a manager on port 0), or, when it does not start, how it
    /// ended (waited for up to [`STATE_BOUND`]).
    pub fn try_start_with(args: &[&str], data_dir: &Path) -> Result<ManagerProcess, Refusal> {
        let (mut child, line, stderr_path) =
            spawn_cube_for_a_line(args, data_dir, "manager", false);
        match cube_api::address_in_listening_line(&line) {
            Some(url) => Ok(ManagerProcess {
                url: url.to_string(),
                port: url.rsplit(':').next().unwrap().parse().unwrap(),
                data_dir: data_dir.to_path_buf(),
                child,
                stderr_path,
                dev_node: None,
            }),
            None => Err(wait_for_refusal(&mut child, &stderr_path)),
        }
    }
}

/// Starts `cube ARGS --data-dir DIR` and returns the first line it prints (empty when it
/// printed none before closing its output); its stderr goes to `DIR/LOG_NAME.stderr`, added to
/// what is there (`append`) or written anew.
fn spawn_cube_for_a_line(
    args: &[&str],
    data_dir: &Path,
    log_name: &str,
    append: bool,
) -> (Child, String, PathBuf) {
    let stderr_path = data_dir.join(format!("{log_name}.stderr"));
    std::fs::create_dir_all(data_dir).unwrap();
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(&stderr_path)
        .unwrap();
    let mut child = Command::new(cube_binary())
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("spawn cube");
    let mut line = String::new();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    stdout.read_line(&mut line).unwrap();
    // Keep reading what else it prints, so that it never writes to a closed pipe.
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    (child, line, stderr_path)
}

/// Waits up to [`STATE_BOUND`] for a process that printed no address to exit; a process that
/// neither listens nor exits is a test failure.
fn wait_for_refusal(child: &mut Child, stderr_path: &Path) -> Refusal {
    let deadline = Instant::now() + STATE_BOUND;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Refusal {
                status,
                stderr: std::fs::read_to_string(stderr_path).unwrap_or_default(),
            };
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("cube neither listened nor exited within {STATE_BOUND:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `cube ARGS` to its end; returns its exit status and stderr, with stdout.
pub fn cube_command(args: &[&str]) -> (std::process::ExitStatus, String, String) {
    let output = Command::new(cube_binary())
        .args(args)
        .output()
        .expect("run cube");
    (
        output.status,
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

/// A manager (memory store) and one worker that joined it, `Ready`: the cluster most command
/// line tests need.
pub struct OneNodeCluster {
    pub manager: ManagerProcess,
    pub worker: WorkerProcess,
    _dir: tempfile::TempDir,
}

impl OneNodeCluster {
    /// Starts it, with a unique node name starting with `prefix`.
    pub async fn start(prefix: &str) -> OneNodeCluster {
        let dir = tempfile::tempdir().unwrap();
        let manager = ManagerProcess::start("epvm", "memory", dir.path(), 0);
        let worker = manager.join_worker(&unique_node(prefix), &[]);
        manager.await_ready_nodes(1).await;
        OneNodeCluster {
            manager,
            worker,
            _dir: dir,
        }
    }
}

/// `GET http://127.0.0.1:{port}{path}` on a task's published port, once its server answers: a
/// container is `Running` as soon as Docker started it, a moment before the server in it
/// listens, so a refused or reset connection is tried again (every 20 ms, up to
/// [`STATE_BOUND`]). Returns the answer's status.
pub async fn get_published(port: u16, path: &str) -> u16 {
    let url = format!("http://127.0.0.1:{port}{path}");
    let deadline = Instant::now() + STATE_BOUND;
    loop {
        match http().get(&url).send().await {
            Ok(answer) => return answer.status().as_u16(),
            Err(err) => assert!(
                Instant::now() < deadline,
                "{url} did not answer within {STATE_BOUND:?}: {err}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A `GET /events` answer, read one line (or one server-sent event) at a time.
pub struct EventReader {
    response: reqwest::Response,
    buffer: Vec<u8>,
}

impl EventReader {
    pub async fn open(manager: &ManagerProcess, query: &str) -> EventReader {
        let response = http()
            .get(format!("{}/events{query}", manager.url))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "GET /events{query}");
        assert_eq!(
            response.headers()["content-type"],
            "application/x-ndjson",
            "events are lines of JSON unless asked otherwise"
        );
        EventReader {
            response,
            buffer: Vec::new(),
        }
    }

    /// The next block ending with `separator` (a line, or an SSE event), waiting at most
    /// [`STATE_BOUND`].
    pub async fn next_block(&mut self, separator: &[u8]) -> String {
        let deadline = Instant::now() + STATE_BOUND;
        loop {
            if let Some(end) = self
                .buffer
                .windows(separator.len())
                .position(|window| window == separator)
            {
                let block: Vec<u8> = self.buffer.drain(..end + separator.len()).collect();
                return String::from_utf8(block[..end].to_vec()).unwrap();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let chunk = tokio::time::timeout(left, self.response.chunk())
                .await
                .unwrap_or_else(|_| panic!("nothing more within {STATE_BOUND:?}"))
                .unwrap()
                .expect("the stream ended");
            self.buffer.extend_from_slice(&chunk);
        }
    }

    /// The next event (heartbeats skipped).
    pub async fn next_event(&mut self) -> Value {
        loop {
            let line = self.next_block(b"\n").await;
            if !line.trim().is_empty() {
                return serde_json::from_str(&line).unwrap();
            }
        }
    }

    /// The task's events, in order, until (and with) the one of type `last`.
    pub async fn task_events_until(&mut self, id: &str, last: &str) -> Vec<Value> {
        let mut seen = Vec::new();
        loop {
            let event = self.next_event().await;
            if event["Key"] != id {
                continue;
            }
            let done = event["Type"] == last;
            seen.push(event);
            if done {
                return seen;
            }
        }
    }
}

/// A `reqwest` client builder, once Cube's TLS crypto is installed (reqwest is built without
/// a crypto provider of its own: `cube_api::tls`).
pub fn http_builder() -> reqwest::ClientBuilder {
    let _ = cube_api::tls::provider();
    reqwest::Client::builder()
}

/// The event index a manager answers with in `X-Cube-Index`.
pub fn index_of(response: &reqwest::Response) -> u64 {
    response
        .headers()
        .get("X-Cube-Index")
        .expect("an X-Cube-Index header")
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// The event index `manager` answers `GET /tasks{query}` with (`X-Cube-Index`), asserting
/// the 200.
pub async fn tasks_index(manager: &ManagerProcess, query: &str) -> u64 {
    let response = http()
        .get(format!("{}/tasks{query}", manager.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    index_of(&response)
}

/// A plain `reqwest` client: [`http_builder`] with its defaults.
pub fn http() -> reqwest::Client {
    http_builder().build().unwrap()
}

/// `POST /acl/bootstrap` on a manager started with `--acl`: the management token's text.
pub async fn bootstrap(manager: &ManagerProcess) -> String {
    let answer = manager
        .client()
        .request_answer("POST", "/acl/bootstrap", Some("{}"))
        .await;
    assert_eq!(answer.status, 201, "bootstrap: {}", answer.body);
    answer.body["Secret"].as_str().unwrap().to_string()
}

/// A new token of `role` holding in `projects`, made with the management token: its text.
pub async fn token_in(
    manager: &ManagerProcess,
    management: &str,
    role: &str,
    projects: &[&str],
) -> String {
    let answer = Client::with_token(&manager.url, management)
        .request_answer(
            "POST",
            "/acl/tokens",
            Some(&json!({"Role": role, "Projects": projects}).to_string()),
        )
        .await;
    assert_eq!(answer.status, 201, "token create: {}", answer.body);
    answer.body["Secret"].as_str().unwrap().to_string()
}

/// A worker named `name` on `dbtype` (its directory under the manager's) that joins `manager`
/// with a node token made with the management token, beating every 300 ms.
pub async fn join_with_node_token(
    manager: &ManagerProcess,
    management: &str,
    name: &str,
    dbtype: &str,
) -> WorkerProcess {
    let join = token_in(manager, management, "node", &[]).await;
    ensure_sample_image();
    WorkerProcess::start_with(
        name,
        dbtype,
        &manager.data_dir.join(name),
        &[
            "--join",
            &manager.address(),
            "--token",
            &join,
            "--heartbeat-interval",
            "300ms",
        ],
    )
}

/// A `cube router` process following `manager`, listening on free loopback ports; its
/// stderr goes to `DIR/router.stderr`.
pub struct RouterProcess {
    /// `http://127.0.0.1:PORT`: where requests go.
    pub url: String,
    /// `http://127.0.0.1:PORT`: `/metrics`, `/health`, `/routes`.
    pub admin: String,
    child: Child,
    stderr_path: PathBuf,
}

impl RouterProcess {
    /// Starts `cube router -m MANAGER --listen 127.0.0.1:0 --admin 127.0.0.1:0 EXTRA` (the
    /// `--listen` of `extra` when it has one).
    pub fn start(manager: &str, dir: &Path, extra: &[&str]) -> RouterProcess {
        let listen = if extra.contains(&"--listen") {
            &[][..]
        } else {
            &["--listen", "127.0.0.1:0"][..]
        };
        std::fs::create_dir_all(dir).unwrap();
        let stderr_path = dir.join("router.stderr");
        let stderr = std::fs::File::create(&stderr_path).unwrap();
        let mut child = Command::new(cube_binary())
            .args(["router", "-m", manager, "--admin", "127.0.0.1:0"])
            .args(listen)
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn cube router");
        let mut line = String::new();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        stdout.read_line(&mut line).unwrap();
        std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
        let urls: Vec<String> = line
            .split_whitespace()
            .filter_map(|word| word.trim_end_matches([')', ',']).strip_prefix("http://"))
            .map(|address| format!("http://{address}"))
            .collect();
        assert!(
            !urls.is_empty(),
            "cube router printed {line:?}; stderr: {}",
            std::fs::read_to_string(&stderr_path).unwrap_or_default()
        );
        RouterProcess {
            url: urls[0].clone(),
            // None with --haproxy-config: HAProxy serves.
            admin: urls.get(1).cloned().unwrap_or_default(),
            child,
            stderr_path,
        }
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    pub fn terminate(mut self, bound: Duration) -> std::process::ExitStatus {
        signal_and_wait(&mut self.child, "-TERM", bound)
    }
}

impl Drop for RouterProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
