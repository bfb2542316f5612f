//! A real etcd cluster for a test: `etcd` processes on loopback ports, data in a temporary
//! directory, killed when the cluster is dropped.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a member may take to join its cluster and serve clients.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How many of a member's last log lines are kept for a failure's message.
const KEPT_LINES: usize = 40;

/// The `etcd` binary the tests run: `$CUBE_ETCD`, else `/usr/bin/etcd`, else `etcd` on the
/// `PATH`. Panics, saying how to install it, when there is none.
pub fn etcd_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("CUBE_ETCD") {
        return PathBuf::from(path);
    }
    let debian = Path::new("/usr/bin/etcd");
    if debian.exists() {
        return debian.to_path_buf();
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let candidate = dir.join("etcd");
            if candidate.exists() {
                return candidate;
            }
        }
    }
    panic!(
        "this test needs a real etcd, and no `etcd` binary was found (not at /usr/bin/etcd, not \
         on PATH, CUBE_ETCD unset): install Debian's etcd-server (`apt-get install -y \
         etcd-server`; scripts/setup.sh does it)"
    );
}

/// One member: its ports, its process while it runs, its last log lines.
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
    log: Arc<Mutex<Vec<String>>>,
}

/// A running etcd cluster of one or more members on loopback.
pub struct EtcdCluster {
    members: Vec<Member>,
    /// Every member's data directory lives in here; removed on drop.
    dir: tempfile::TempDir,
    token: String,
}

/// A port nobody listens on now, kept by its listener until the member starts.
fn free_port() -> (u16, TcpListener) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a loopback port");
    let port = listener.local_addr().expect("a bound address").port();
    (port, listener)
}

impl EtcdCluster {
    /// Starts a cluster of `size` members and waits until every one serves clients. Panics
    /// with the members' last log lines when it cannot.
    pub fn start(size: usize) -> EtcdCluster {
        assert!(size >= 1, "a cluster has at least one member");
        let binary = etcd_binary();
        // A port found free may be taken by someone else before etcd binds it: try again.
        let mut last_failure = String::new();
        for _attempt in 0..3 {
            match EtcdCluster::try_start(&binary, size) {
                Ok(cluster) => return cluster,
                Err(failure) => last_failure = failure,
            }
        }
        panic!("etcd did not start: {last_failure}");
    }

    fn try_start(binary: &Path, size: usize) -> Result<EtcdCluster, String> {
        let dir = tempfile::Builder::new()
            .prefix("cube-etcd-")
            .tempdir()
            .map_err(|err| format!("a temporary directory: {err}"))?;
        let mut listeners = Vec::new();
        let mut members = Vec::new();
        for index in 0..size {
            let (client_port, client) = free_port();
            let (peer_port, peer) = free_port();
            listeners.push(client);
            listeners.push(peer);
            members.push(Member {
                name: format!("m{index}"),
                client_port,
                peer_port,
                child: None,
                log: Arc::new(Mutex::new(Vec::new())),
            });
        }
        let token = format!(
            "cube-test-{}-{}",
            std::process::id(),
            members[0].client_port
        );
        let mut cluster = EtcdCluster {
            members,
            dir,
            token,
        };
        drop(listeners);
        let mut readiness = Vec::new();
        for index in 0..size {
            readiness.push(cluster.spawn(binary, index)?);
        }
        for (index, ready) in readiness.into_iter().enumerate() {
            cluster.wait_ready(index, ready)?;
        }
        Ok(cluster)
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|member| format!("{}=http://127.0.0.1:{}", member.name, member.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts member `index`'s process; the receiver hears once it serves clients.
    fn spawn(&mut self, binary: &Path, index: usize) -> Result<mpsc::Receiver<()>, String> {
        let initial_cluster = self.initial_cluster();
        let data_dir = self.dir.path().join(&self.members[index].name);
        let member = &mut self.members[index];
        let client_url = format!("http://127.0.0.1:{}", member.client_port);
        let peer_url = format!("http://127.0.0.1:{}", member.peer_port);
        let mut child = Command::new(binary)
            .arg("--name")
            .arg(&member.name)
            .arg("--data-dir")
            .arg(&data_dir)
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &initial_cluster])
            .args(["--initial-cluster-token", &self.token])
            .args(["--initial-cluster-state", "new"])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|err| format!("cannot run {}: {err}", binary.display()))?;
        let stderr = child.stderr.take().ok_or("etcd's stderr")?;
        member.child = Some(child);
        let (ready, readiness) = mpsc::channel();
        let log = member.log.clone();
        // Reads the member's log to its end (a full pipe would stop etcd), says when it
        // serves clients, and keeps the last lines for a failure's message.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if line.contains("serving client traffic")
                    || line.contains("ready to serve client requests")
                {
                    let _ = ready.send(());
                }
                let mut kept = log.lock().unwrap_or_else(|p| p.into_inner());
                kept.push(line);
                if kept.len() > KEPT_LINES {
                    kept.remove(0);
                }
            }
        });
        Ok(readiness)
    }

    fn wait_ready(&mut self, index: usize, ready: mpsc::Receiver<()>) -> Result<(), String> {
        match ready.recv_timeout(READY_TIMEOUT) {
            Ok(()) => Ok(()),
            Err(_) => {
                let member = &mut self.members[index];
                let exited = member
                    .child
                    .as_mut()
                    .and_then(|child| child.try_wait().ok().flatten());
                let log = member
                    .log
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .join("\n");
                Err(format!(
                    "member {} (client port {}) did not serve clients within {READY_TIMEOUT:?} \
                     (exited: {exited:?}); its last log lines:\n{log}",
                    member.name, member.client_port
                ))
            }
        }
    }

    /// Every member's client address, `127.0.0.1:PORT`, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|member| format!("127.0.0.1:{}", member.client_port))
            .collect()
    }

    /// The same, comma-separated, as `--etcd-endpoints` takes them.
    pub fn endpoints_flag(&self) -> String {
        self.endpoints().join(",")
    }

    /// How many members the cluster has (running or not).
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// Kills member `index` with SIGKILL (`kill -9`) and waits for it to be gone.
    pub fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.members[index].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `index` again on its data directory, after [`EtcdCluster::kill`], and
    /// waits until it serves clients.
    pub fn restart(&mut self, index: usize) {
        assert!(
            self.members[index].child.is_none(),
            "member {index} still runs"
        );
        let binary = etcd_binary();
        let ready = self
            .spawn(&binary, index)
            .unwrap_or_else(|err| panic!("{err}"));
        self.wait_ready(index, ready)
            .unwrap_or_else(|err| panic!("{err}"));
    }

    /// The process ID of member `index`, while it runs.
    pub fn pid(&self, index: usize) -> Option<u32> {
        self.members[index].child.as_ref().map(Child::id)
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for index in 0..self.members.len() {
            self.kill(index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_three_member_cluster_starts_and_a_member_can_be_killed_and_restarted() {
        let mut cluster = EtcdCluster::start(3);
        assert_eq!(cluster.endpoints().len(), 3);
        let pid = cluster.pid(1).unwrap();
        cluster.kill(1);
        assert!(cluster.pid(1).is_none());
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
        cluster.restart(1);
        assert!(cluster.pid(1).is_some());
    }
}
