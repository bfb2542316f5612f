//! A real HAProxy (Debian's, installed by `scripts/setup.sh`) for the tests and the benchmark
//! of `cube router --haproxy-config`: started in master-worker mode in the foreground, asked
//! through its runtime API, stopped when dropped (a failed assertion too).

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How often HAProxy's runtime API is asked again while it does not answer yet.
const POLL_EVERY: Duration = Duration::from_millis(20);

/// `haproxy`, failing with what to do when it is not installed.
pub fn haproxy_binary() -> &'static str {
    match Command::new("haproxy").arg("-v").output() {
        Ok(output) if output.status.success() => "haproxy",
        Ok(output) => panic!(
            "haproxy -v failed ({}): install haproxy (scripts/setup.sh)",
            output.status
        ),
        Err(error) => panic!("cannot run haproxy ({error}): install haproxy (scripts/setup.sh)"),
    }
}

/// A running HAProxy.
pub struct Haproxy {
    child: Child,
    log: PathBuf,
    stats_socket: PathBuf,
    master_socket: PathBuf,
}

impl Haproxy {
    /// Starts HAProxy on `config`, whose `stats socket` is `stats_socket`, logging to
    /// `DIR/haproxy.log` (`DIR` the config's directory), and waits until its runtime API
    /// answers and its master's CLI (`-S DIR/master.sock`) does: the master installs its
    /// SIGUSR2 handler only in its loop, and a reload signalled before would end it.
    pub fn start(config: &Path, stats_socket: &Path) -> Haproxy {
        let dir = config.parent().unwrap_or(Path::new("."));
        let log = dir.join("haproxy.log");
        let log_file = std::fs::File::create(&log).unwrap();
        let master_socket = dir.join("master.sock");
        let child = Command::new(haproxy_binary())
            .args(["-W", "-db", "-S"])
            .arg(&master_socket)
            .arg("-f")
            .arg(config)
            .arg("-p")
            .arg(dir.join("haproxy.pid"))
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .unwrap();
        let haproxy = Haproxy {
            child,
            log,
            stats_socket: stats_socket.to_path_buf(),
            master_socket: master_socket.clone(),
        };
        let started = Instant::now();
        while haproxy.ask("show info").is_err() || !master_answers(&master_socket) {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "HAProxy's runtime API did not answer within 10 s; log:\n{}",
                haproxy.log()
            );
            std::thread::sleep(POLL_EVERY);
        }
        haproxy
    }

    /// With `-W -db`, the process started is the master, which reloads on SIGUSR2: the
    /// reload command is `kill -USR2 PID`.
    pub fn master_pid(&self) -> u32 {
        self.child.id()
    }

    /// The master's CLI socket (`-S`): `cube router --haproxy-master-socket` reloads through
    /// it.
    pub fn master_socket(&self) -> PathBuf {
        self.master_socket.clone()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `command`'s answer on the runtime API (at most 2 s).
    pub fn ask(&self, command: &str) -> std::io::Result<String> {
        ask_socket(&self.stats_socket, command)
    }

    /// The `ADDRESS:PORT` of each server of `backend`, from `show servers state`.
    pub fn servers(&self, backend: &str) -> Result<BTreeSet<String>, String> {
        let answer = self
            .ask(&format!("show servers state {backend}"))
            .map_err(|error| error.to_string())?;
        let mut lines = answer.lines().skip_while(|line| !line.starts_with("# "));
        let columns: Vec<&str> = lines
            .next()
            .ok_or_else(|| format!("no header: {answer:?}"))?
            .trim_start_matches("# ")
            .split(' ')
            .collect();
        let column = |name: &str| {
            columns
                .iter()
                .position(|column| *column == name)
                .ok_or_else(|| format!("no column {name}: {answer:?}"))
        };
        let (address, port) = (column("srv_addr")?, column("srv_port")?);
        Ok(lines
            .filter(|line| !line.trim().is_empty())
            .map(|line| {
                let fields: Vec<&str> = line.split(' ').collect();
                format!("{}:{}", fields[address], fields[port])
            })
            .collect())
    }
}

/// `command`'s answer on a HAProxy CLI socket (at most 2 s).
fn ask_socket(socket: &Path, command: &str) -> std::io::Result<String> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(format!("{command}\n").as_bytes())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// Whether the master's CLI answers `show proc` with its own line (it keeps the connection
/// open after an answer, so the answer is read until it holds the master's row).
fn master_answers(socket: &Path) -> bool {
    let asked = (|| {
        let mut stream = UnixStream::connect(socket)?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream.write_all(b"show proc\n")?;
        let mut answer = Vec::new();
        let mut chunk = [0u8; 1024];
        while !String::from_utf8_lossy(&answer).contains("master") {
            let read = stream.read(&mut chunk)?;
            if read == 0 {
                break;
            }
            answer.extend_from_slice(&chunk[..read]);
        }
        Ok::<bool, std::io::Error>(String::from_utf8_lossy(&answer).contains("master"))
    })();
    asked.unwrap_or(false)
}

impl Drop for Haproxy {
    /// SIGTERM first, so that the master stops its workers (old ones from reloads too), then
    /// SIGKILL if it has not exited within 2 s.
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(2) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(POLL_EVERY);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
