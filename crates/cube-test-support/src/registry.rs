//! A real private Docker registry for a test: Debian's `docker-registry` on a free loopback
//! port, with htpasswd (bcrypt) basic auth and its storage in a temporary directory, killed
//! and removed when the test drops it.
//!
//! The Docker engine treats every registry on 127.0.0.0/8 as insecure, so it talks plain HTTP
//! to it and no certificate is needed.
//!
//! What the engine (Debian's docker.io 20.10, API 1.41) answers when a pull from such a
//! registry fails, which the product maps to a task's error:
//!
//! - no credentials at all (`docker pull` without `docker login`, or the API without
//!   `X-Registry-Auth`), HTTP 500:
//!   `Head "http://127.0.0.1:PORT/v2/REPO/manifests/latest": no basic auth credentials`
//! - a wrong password in `X-Registry-Auth`, HTTP 500: `unauthorized: authentication required`
//!   (`docker login` with a wrong password already fails, with `Error response from daemon:
//!   login attempt to http://127.0.0.1:PORT/v2/ failed with status: 401 Unauthorized`)
//! - a repository (or tag) the registry does not have, with good credentials, HTTP 404:
//!   `manifest for 127.0.0.1:PORT/REPO:latest not found: manifest unknown: manifest unknown`
//!
//! The CLI prints these after `Error response from daemon: `.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;

/// How long the registry may take to answer on its port.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// How often readiness is checked while waiting.
const READY_POLL: Duration = Duration::from_millis(50);

/// How many of the registry's last log lines a failure's message shows.
const KEPT_LINES: usize = 40;

/// The user every test registry knows.
const USERNAME: &str = "cube";

/// A Docker registry (Debian's docker-registry) on a free 127.0.0.1 port with htpasswd
/// (bcrypt) basic auth, in a temp dir; killed and cleaned on drop.
pub struct Registry {
    /// `127.0.0.1:PORT`.
    address: String,
    username: String,
    /// Random, per registry.
    password: String,
    child: Child,
    /// The configuration, the htpasswd file, the storage, the log and the docker CLI's
    /// configuration while pushing all live in here; removed on drop.
    dir: tempfile::TempDir,
}

/// `name` as found on the `PATH` (or at `/usr/bin`), or a panic saying how to install
/// `package`.
fn binary(name: &str, package: &str) -> PathBuf {
    let mut dirs = vec![PathBuf::from("/usr/bin")];
    if let Some(paths) = std::env::var_os("PATH") {
        dirs.splice(0..0, std::env::split_paths(&paths));
    }
    for dir in dirs {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "this test needs a private Docker registry, and no `{name}` was found (not on PATH, \
         not in /usr/bin): install Debian's {package} (`apt-get install -y {package}`; run \
         scripts/setup.sh, which does it)"
    );
}

/// 16 random bytes from the kernel, as hex.
fn random_hex() -> String {
    let mut bytes = [0u8; 16];
    File::open("/dev/urandom")
        .and_then(|mut urandom| urandom.read_exact(&mut bytes))
        .expect("reading /dev/urandom");
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The last [`KEPT_LINES`] lines of the log at `path`.
fn log_tail(path: &Path) -> String {
    match std::fs::read_to_string(path) {
        Ok(log) => {
            let lines: Vec<&str> = log.lines().collect();
            lines[lines.len().saturating_sub(KEPT_LINES)..].join("\n")
        }
        Err(err) => format!("(cannot read {}: {err})", path.display()),
    }
}

/// `GET path` on `address` over plain HTTP/1.0, with basic auth when `credentials` are
/// given: the status code and the body.
fn http_get(
    address: &str,
    path: &str,
    credentials: Option<(&str, &str)>,
) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(address)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut request = format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n");
    if let Some((username, password)) = credentials {
        let token =
            base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"));
        request.push_str(&format!("Authorization: Basic {token}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes())?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("not an HTTP response: {response:?}"),
            )
        })?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// Runs `docker ARGS` (with `stdin` written to its standard input when given) and returns
/// what it did; panics when it cannot be run at all.
fn docker(args: &[&str], config: Option<&Path>, stdin: Option<&str>) -> Output {
    let mut command = Command::new("docker");
    command
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(config) = config {
        command.env("DOCKER_CONFIG", config);
    }
    let mut child = command.spawn().expect("running the docker CLI");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .expect("docker's stdin")
            .write_all(input.as_bytes())
            .expect("writing to docker's stdin");
    }
    child
        .wait_with_output()
        .expect("waiting for the docker CLI")
}

/// The same, panicking with its output when it fails.
fn docker_ok(args: &[&str], config: Option<&Path>, stdin: Option<&str>) -> Output {
    let output = docker(args, config, stdin);
    assert!(
        output.status.success(),
        "`docker {}` failed ({}): {}{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Polls `GET /v2/` on `address` until it answers 401 (the registry serves, and asks for
/// credentials), for at most [`READY_TIMEOUT`].
fn wait_ready(child: &mut Child, address: &str, log_path: &Path) -> Result<(), String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "docker-registry on {address} exited ({status}); the last lines of its log {}:\n{}",
                log_path.display(),
                log_tail(log_path)
            ));
        }
        let last = match http_get(address, "/v2/", None) {
            Ok((401, _)) => return Ok(()),
            Ok((status, body)) => format!("HTTP {status}: {body}"),
            Err(err) => err.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(format!(
                "docker-registry on {address} did not answer GET /v2/ with 401 within \
                 {READY_TIMEOUT:?} (last: {last}); the last lines of its log {}:\n{}",
                log_path.display(),
                log_tail(log_path)
            ));
        }
        std::thread::sleep(READY_POLL);
    }
}

impl Registry {
    /// Starts a registry and waits until it answers `GET /v2/` with 401. Panics, with the
    /// registry's last log lines, when it cannot; and, saying to run `scripts/setup.sh`, when
    /// `docker-registry` or `htpasswd` is missing.
    pub fn start() -> Registry {
        let registry = binary("docker-registry", "docker-registry");
        let htpasswd = binary("htpasswd", "apache2-utils");
        // A port found free may be taken by someone else before the registry binds it: try
        // again.
        let mut last_failure = String::new();
        for _attempt in 0..3 {
            match Registry::try_start(&registry, &htpasswd) {
                Ok(started) => return started,
                Err(failure) => last_failure = failure,
            }
        }
        panic!("the Docker registry did not start: {last_failure}");
    }

    fn try_start(registry: &Path, htpasswd: &Path) -> Result<Registry, String> {
        let dir = tempfile::Builder::new()
            .prefix("cube-registry-")
            .tempdir()
            .map_err(|err| format!("a temporary directory: {err}"))?;
        let username = USERNAME.to_string();
        let password = random_hex();

        // The registry reads only bcrypt entries (-B).
        let entry = Command::new(htpasswd)
            .args(["-Bbn", &username, &password])
            .stdin(Stdio::null())
            .output()
            .map_err(|err| format!("cannot run {}: {err}", htpasswd.display()))?;
        if !entry.status.success() {
            return Err(format!(
                "htpasswd failed ({}): {}",
                entry.status,
                String::from_utf8_lossy(&entry.stderr)
            ));
        }
        let htpasswd_file = dir.path().join("htpasswd");
        std::fs::write(&htpasswd_file, &entry.stdout)
            .map_err(|err| format!("writing {}: {err}", htpasswd_file.display()))?;

        let port = {
            let listener = TcpListener::bind("127.0.0.1:0").expect("binding a loopback port");
            listener.local_addr().expect("a bound address").port()
        };
        let address = format!("127.0.0.1:{port}");
        let storage = dir.path().join("storage");
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\n\
                 log:\n  level: info\n\
                 storage:\n  filesystem:\n    rootdirectory: {storage}\n\
                 http:\n  addr: {address}\n  secret: {secret}\n\
                 auth:\n  htpasswd:\n    realm: cube-test-registry\n    path: {htpasswd}\n",
                storage = storage.display(),
                secret = random_hex(),
                htpasswd = htpasswd_file.display(),
            ),
        )
        .map_err(|err| format!("writing {}: {err}", config.display()))?;

        let log_path = dir.path().join("registry.log");
        let log = File::create(&log_path)
            .map_err(|err| format!("creating {}: {err}", log_path.display()))?;
        let log_err = log
            .try_clone()
            .map_err(|err| format!("{}: {err}", log_path.display()))?;
        let mut child = Command::new(registry)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(|err| format!("cannot run {}: {err}", registry.display()))?;
        if let Err(failure) = wait_ready(&mut child, &address, &log_path) {
            let _ = child.kill();
            let _ = child.wait();
            // Keeps the log for whoever reads the failure.
            let _ = dir.keep();
            return Err(failure);
        }
        Ok(Registry {
            address,
            username,
            password,
            child,
            dir,
        })
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Where the registry listens: `127.0.0.1:PORT`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The user the registry knows.
    pub fn username(&self) -> &str {
        &self.username
    }

    /// The user's password: random, per registry.
    pub fn password(&self) -> &str {
        &self.password
    }

    /// The docker CLI's configuration directory (`DOCKER_CONFIG`) for this registry's
    /// logins, so that `docker login` touches neither `~/.docker/config.json` nor another
    /// registry's logins when tests run in parallel.
    fn docker_config(&self) -> PathBuf {
        self.dir.path().join("docker-config")
    }

    /// Runs `docker ARGS` logged in to this registry (in this registry's own CLI
    /// configuration), then logs out again.
    fn docker_logged_in(&self, args: &[&str]) -> Output {
        let config = self.docker_config();
        docker_ok(
            &[
                "login",
                "--username",
                &self.username,
                "--password-stdin",
                &self.address,
            ],
            Some(&config),
            Some(&self.password),
        );
        let output = docker(args, Some(&config), None);
        docker_ok(&["logout", &self.address], Some(&config), None);
        output
    }

    /// Tags the local image `local` as ADDRESS/REPO:latest, logs the docker CLI in
    /// (password on stdin), pushes, logs out again, and removes the pushed tag locally so
    /// that a later pull must go to the registry. Returns "ADDRESS/REPO:latest".
    ///
    /// The login is kept in a CLI configuration of this registry's own (`DOCKER_CONFIG` in
    /// its temporary directory): `~/.docker/config.json` is never written.
    pub fn push(&self, local: &str, repo: &str) -> String {
        let reference = format!("{}/{repo}:latest", self.address);
        docker_ok(&["tag", local, &reference], None, None);
        let pushed = self.docker_logged_in(&["push", &reference]);
        // Untags only: `local` keeps the image.
        let untagged = docker(&["image", "rm", &reference], None, None);
        assert!(
            pushed.status.success(),
            "`docker push {reference}` failed ({}): {}{}; the last lines of the registry's \
             log:\n{}",
            pushed.status,
            String::from_utf8_lossy(&pushed.stdout),
            String::from_utf8_lossy(&pushed.stderr),
            log_tail(&self.dir.path().join("registry.log"))
        );
        assert!(
            untagged.status.success(),
            "`docker image rm {reference}` failed ({}): {}",
            untagged.status,
            String::from_utf8_lossy(&untagged.stderr)
        );
        reference
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-file image made locally (`docker import`), without any registry.
    fn local_image(name: &str) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let rootfs = dir.path().join("rootfs");
        std::fs::create_dir(&rootfs).expect("creating the image's root");
        std::fs::write(rootfs.join("hello.txt"), "hello from a private registry\n")
            .expect("writing the image's file");
        let tar = dir.path().join("image.tar");
        let status = Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .status()
            .expect("running tar");
        assert!(status.success(), "tar failed: {status}");
        docker_ok(&["import", &tar.display().to_string(), name], None, None);
    }

    fn stderr(output: &Output) -> String {
        String::from_utf8_lossy(&output.stderr).into_owned()
    }

    #[test]
    fn a_registry_takes_a_pushed_image_and_refuses_it_without_credentials() {
        let local = format!("cube-registry-test-{}:latest", std::process::id());
        local_image(&local);
        let registry = Registry::start();
        let other = Registry::start();
        assert_ne!(registry.address(), other.address());
        assert_ne!(registry.password(), other.password());

        let reference = registry.push(&local, "cube-private");
        assert_eq!(
            reference,
            format!("{}/cube-private:latest", registry.address())
        );
        // The pushed tag is gone locally: a pull must go to the registry.
        let inspect = docker(&["image", "inspect", &reference], None, None);
        assert!(!inspect.status.success(), "{reference} is still local");

        let (status, _) =
            http_get(registry.address(), "/v2/_catalog", None).expect("GET /v2/_catalog");
        assert_eq!(status, 401, "the catalog without credentials");
        let (status, body) = http_get(
            registry.address(),
            "/v2/_catalog",
            Some((registry.username(), registry.password())),
        )
        .expect("GET /v2/_catalog with credentials");
        assert_eq!(status, 200, "the catalog with credentials: {body}");
        let catalog: serde_json::Value = serde_json::from_str(&body).expect("a JSON catalog");
        assert_eq!(catalog["repositories"], serde_json::json!(["cube-private"]));
        // The other registry has nothing of it.
        let (status, body) = http_get(
            other.address(),
            "/v2/_catalog",
            Some((other.username(), other.password())),
        )
        .expect("GET /v2/_catalog on the other registry");
        assert_eq!(status, 200, "{body}");
        let catalog: serde_json::Value = serde_json::from_str(&body).expect("a JSON catalog");
        assert_eq!(catalog["repositories"], serde_json::json!([]));
        // Its password is not this registry's.
        let (status, _) = http_get(
            registry.address(),
            "/v2/_catalog",
            Some((other.username(), other.password())),
        )
        .expect("GET /v2/_catalog with the other registry's password");
        assert_eq!(status, 401);

        // Without login the engine refuses: `Error response from daemon: Head
        // "http://127.0.0.1:PORT/v2/cube-private/manifests/latest": no basic auth credentials`.
        let pulled = docker(&["pull", &reference], None, None);
        assert!(!pulled.status.success(), "pulled {reference} without login");
        assert!(
            stderr(&pulled).contains("no basic auth credentials")
                || stderr(&pulled).contains("unauthorized"),
            "{}",
            stderr(&pulled)
        );

        // Logged in, the image comes; a repository the registry lacks is not found:
        // `Error response from daemon: manifest for 127.0.0.1:PORT/missing:latest not found:
        // manifest unknown: manifest unknown`.
        let pulled = registry.docker_logged_in(&["pull", &reference]);
        assert!(pulled.status.success(), "{}", stderr(&pulled));
        let missing = format!("{}/missing:latest", registry.address());
        let pulled = registry.docker_logged_in(&["pull", &missing]);
        assert!(!pulled.status.success(), "pulled {missing}");
        assert!(
            stderr(&pulled).contains("not found") && stderr(&pulled).contains("manifest unknown"),
            "{}",
            stderr(&pulled)
        );
        // The login is gone again.
        let config = std::fs::read_to_string(registry.docker_config().join("config.json"))
            .expect("the registry's CLI configuration");
        assert!(!config.contains(registry.address()), "{config}");

        let _ = docker(&["image", "rm", &reference, &local], None, None);
        let dir = registry.dir.path().to_path_buf();
        drop(registry);
        assert!(!dir.exists(), "{} is left behind", dir.display());
    }
}
