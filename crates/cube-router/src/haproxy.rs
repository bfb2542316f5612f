//! `cube router --haproxy-config FILE --haproxy-reload CMD`: keeps a real HAProxy's backends
//! equal to Cube's routes, for those who run HAProxy already.
//!
//! On every new [`RouteTable`] the configuration is rendered whole ([`render`]), written over
//! `FILE` (atomically, and only when its bytes change) and the reload command is run, which
//! tells HAProxy to read it again (`kill -USR2` to its master, `systemctl reload haproxy`).
//! Rendering is a pure function of the table and the options, so the same routes always give
//! the same bytes and an unchanged table costs HAProxy no reload.
//!
//! This module writes one file and runs one command: it never talks to HAProxy otherwise (its
//! runtime API, the `stats socket`, is the operator's) and never runs HAProxy itself. HAProxy
//! does no health checks of its own here: Cube's health checks decide which copies are in a
//! route, as they do for `cube router`'s own proxy.

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::table::{Route, RouteTable, Target};

/// How long the reload command may run before it is killed and counted failed: a reload that
/// hangs must not stop the routes that follow from reaching HAProxy.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a reload waits for HAProxy's master CLI to be there (a master starting again
/// from the last reload), asking every [`MASTER_POLL`].
const MASTER_WAIT: Duration = Duration::from_secs(5);
const MASTER_POLL: Duration = Duration::from_millis(5);
/// How long a `reload` may take to show in the master's count before it is sent again, and
/// the most one `show proc` may take.
const MASTER_ANSWER: Duration = Duration::from_secs(2);

/// The first wait before a failed write or reload is tried again when no new table comes
/// first (short: a reload that failed leaves HAProxy behind the routes); doubled after each
/// failure up to [`RETRY_MAX`], so that an HAProxy that is down for long is not asked often.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// The most of a failed reload command's stderr kept in its error, so that a chatty command
/// does not flood the log.
const STDERR_KEPT_BYTES: usize = 4096;

/// Where HAProxy listens, where its configuration goes and how it is told to read it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaproxyOptions {
    /// Where HAProxy listens for HTTP (the frontend's bind), e.g. 0.0.0.0:80.
    pub listen: SocketAddr,
    /// The configuration file written (atomically: a temporary file in the same directory,
    /// then rename; only when its contents change).
    pub config: PathBuf,
    /// A shell command run (`sh -c`) after each write, e.g. `kill -USR2 $(cat
    /// /run/haproxy.pid)` or `systemctl reload haproxy`; None: write only.
    pub reload: Option<String>,
    /// Plain TCP ports forwarded to a route: (port, route name).
    pub tcp: Vec<(u16, String)>,
    /// Optional: HAProxy's runtime API socket path to put in `global` (`stats socket PATH
    /// mode 600 level admin`), so that an operator (and the tests) can read `show servers
    /// state` / `show stat`.
    pub stats_socket: Option<PathBuf>,
    /// HAProxy's master CLI socket (`haproxy -W -S PATH`): when set, each reload is asked of
    /// the master there (`reload`) rather than by `reload`'s command. The master serves its
    /// CLI only from its loop, where it is ready for a reload; a signal (`kill -USR2`) that
    /// comes while the master is still starting from the last one ends it instead.
    pub master_socket: Option<PathBuf>,
}

/// A rendered configuration, with what it had to leave out and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Configuration {
    /// The file's text.
    pub text: String,
    /// Each route, copy or TCP port left out of `text`, with the reason: a value HAProxy's
    /// configuration cannot hold safely is left out rather than allowed to break the whole
    /// file (HAProxy refuses to load a file with one bad line).
    pub left_out: Vec<String>,
}

/// What failed while bringing HAProxy in step; each is tried again.
#[derive(Debug, thiserror::Error)]
pub enum HaproxyError {
    #[error("cannot write HAProxy's configuration {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot start the HAProxy reload command `{command}`: {source}")]
    ReloadStart {
        command: String,
        #[source]
        source: io::Error,
    },
    #[error("the HAProxy reload command `{command}` failed ({status}): {stderr}")]
    ReloadFailed {
        command: String,
        status: ExitStatus,
        /// What the command wrote on stderr, at most [`STDERR_KEPT_BYTES`] of it.
        stderr: String,
    },
    #[error(
        "the HAProxy reload command `{command}` did not finish within {timeout_s}s and was killed"
    )]
    ReloadTimeout { command: String, timeout_s: u64 },
    #[error("cannot ask HAProxy's master to reload through {socket}: {source}")]
    Master {
        socket: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The configuration for `table`: deterministic text (routes sorted by host, servers by
/// address), so that the same routes give the same bytes.
pub fn render(table: &RouteTable, options: &HaproxyOptions) -> String {
    configuration(table, options).text
}

/// The configuration for `table` and what it left out ([`Configuration::left_out`]).
///
/// Its parts, in order:
/// - `global`: no `daemon` (whoever runs HAProxy keeps it in the foreground: systemd,
///   `haproxy -W -db`) and no `maxconn`, which HAProxy then derives from its file descriptor
///   limit: the most that limit allows, where a fixed number could exceed it and stop HAProxy
///   from starting at all;
/// - `defaults`: HTTP, short connect timeout, one retry on another copy when a connection
///   fails, JSON bodies for HAProxy's own 502, 503 and 504;
/// - `frontend cube` on `listen`, choosing the route's backend by the request's host (any
///   case, without its port or a final dot, as [`RouteTable::by_host`] does), and
///   `backend no_route`, which answers 404 in JSON for any other host;
/// - a backend per route, its copies balanced by least connections; a route without copies
///   answers 503 in JSON naming it;
/// - a `listen tcp_PORT` per TCP port, on `listen`'s address.
pub fn configuration(table: &RouteTable, options: &HaproxyOptions) -> Configuration {
    let mut text = String::new();
    let mut left_out = Vec::new();

    line(
        &mut text,
        "# Written by `cube router --haproxy-config`: every change of Cube's routes rewrites it.",
    );
    line(&mut text, "");
    line(&mut text, "global");
    line(
        &mut text,
        "    # No daemon: the service manager (or `haproxy -W -db`) keeps HAProxy in the foreground.",
    );
    line(
        &mut text,
        "    # No maxconn: HAProxy derives the most its file descriptor limit allows.",
    );
    if let Some(socket) = &options.stats_socket {
        line(
            &mut text,
            format!(
                "    stats socket {} mode 600 level admin",
                quoted(&socket.to_string_lossy())
            ),
        );
    }
    line(&mut text, "");
    line(&mut text, "defaults");
    for setting in [
        "mode http",
        "timeout connect 2s",
        "timeout client 60s",
        "timeout server 60s",
        "option http-keep-alive",
        "retries 1",
        "option redispatch",
        "retry-on conn-failure empty-response response-timeout",
        // A copy whose node's name does not resolve starts in maintenance instead of stopping
        // HAProxy from loading the whole file.
        "default-server init-addr libc,none",
    ] {
        line(&mut text, format!("    {setting}"));
    }
    for (status, message) in [
        (502, "the copy of the route gave no valid answer"),
        (503, "no copy of the route could take the request"),
        (504, "the copy of the route did not answer in time"),
    ] {
        line(
            &mut text,
            format!(
                "    http-error status {status} content-type application/json string {}",
                json_body(status, message)
            ),
        );
    }

    // Routes by host, each with its backend's name: unique, and a valid HAProxy identifier.
    let mut routes: Vec<&Arc<Route>> = table.routes().collect();
    routes.sort_by(|a, b| a.host.cmp(&b.host));
    let mut names_taken = HashSet::new();
    let mut backends: Vec<(String, &Arc<Route>)> = Vec::new();
    for route in routes {
        if !is_plain_host(&route.host) {
            left_out.push(format!(
                "route {:?}: its host {:?} is not a host name HAProxy's configuration can match \
                 (lowercase letters, digits, '.', '-', '_')",
                route.name, route.host
            ));
            continue;
        }
        let name = unique_name(
            &mut names_taken,
            &format!("route_{}", identifier(&route.host)),
        );
        backends.push((name, route));
    }

    line(&mut text, "");
    line(&mut text, "frontend cube");
    line(&mut text, format!("    bind {}", options.listen));
    for (name, route) in &backends {
        line(
            &mut text,
            format!(
                "    use_backend {name} if {{ req.hdr(host),field(1,:),lower -m str {host} {host}. }}",
                host = route.host
            ),
        );
    }
    line(&mut text, "    default_backend no_route");
    line(&mut text, "");
    line(&mut text, "backend no_route");
    // `json(utf8s)` escapes the host as a JSON string's contents, whatever the client sent.
    line(
        &mut text,
        "    http-request return status 404 content-type application/json lf-string \
         '{\"HTTPStatusCode\":404,\"Message\":\"no route for host %[req.hdr(host),json(utf8s)]\"}'",
    );

    for (name, route) in &backends {
        line(&mut text, "");
        line(&mut text, format!("backend {name}"));
        line(
            &mut text,
            format!(
                "    # route {:?} of project {:?}, container port {:?}",
                route.name, route.project, route.port
            ),
        );
        line(&mut text, "    balance leastconn");
        let servers = servers(route, &mut left_out);
        if servers.is_empty() {
            line(
                &mut text,
                format!(
                    "    http-request return status 503 content-type application/json string {}",
                    json_body(
                        503,
                        &format!("route {} has no copy that takes requests now", route.name)
                    )
                ),
            );
        }
        for server in servers {
            line(&mut text, server);
        }
    }

    // TCP ports in order, each once, never the HTTP port.
    let mut ports: BTreeMap<u16, &str> = BTreeMap::new();
    for (port, route_name) in &options.tcp {
        if *port == 0 || *port == options.listen.port() {
            left_out.push(format!(
                "TCP port {port} for route {route_name:?}: {}",
                if *port == 0 {
                    "0 is not a port".to_string()
                } else {
                    format!("HTTP listens on {}", options.listen)
                }
            ));
            continue;
        }
        if let Some(first) = ports.get(port) {
            left_out.push(format!(
                "TCP port {port} for route {route_name:?}: the port is already route {first:?}'s"
            ));
            continue;
        }
        ports.insert(*port, route_name);
    }
    for (port, route_name) in ports {
        line(&mut text, "");
        line(&mut text, format!("listen tcp_{port}"));
        line(&mut text, "    mode tcp");
        line(
            &mut text,
            format!("    bind {}", SocketAddr::new(options.listen.ip(), port)),
        );
        line(&mut text, "    balance leastconn");
        match table.by_name(route_name) {
            Some(route) => {
                line(&mut text, format!("    # route {:?}", route.name));
                for server in servers(route, &mut left_out) {
                    line(&mut text, server);
                }
            }
            None => line(
                &mut text,
                format!("    # no route named {route_name:?}: connections are closed"),
            ),
        }
    }

    Configuration { text, left_out }
}

/// The `server` lines of `route`'s copies, by address (then task, for copies that share
/// one), numbered in that order: `c0`, `c1`, ... No `check`: Cube's health checks decide
/// who is in a route.
fn servers(route: &Route, left_out: &mut Vec<String>) -> Vec<String> {
    let mut targets: Vec<&Arc<Target>> = route.targets.iter().collect();
    targets.sort_by(|a, b| (&a.address, a.id).cmp(&(&b.address, b.id)));
    let mut servers = Vec::new();
    for target in targets {
        if !is_plain_address(&target.address) {
            left_out.push(format!(
                "copy {} ({:?}) of route {:?}: {:?} is not an address HAProxy can reach (HOST:PORT)",
                target.id, target.name, route.name, target.address
            ));
            continue;
        }
        servers.push(format!("    server c{} {}", servers.len(), target.address));
    }
    servers
}

/// Whether `host` may go in the configuration bare, as an ACL's pattern: what a route's
/// host is made of (`cube_types::route::check_host`), and `_`, which some names have.
fn is_plain_host(host: &str) -> bool {
    !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

/// Whether `address` may go in a `server` line bare: `HOST:PORT`, `[IPV6]:PORT`.
fn is_plain_address(address: &str) -> bool {
    address.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty()
            && port.parse::<u16>().is_ok_and(|port| port != 0)
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-:[]".contains(&b))
    })
}

/// `text` with every character an HAProxy identifier may not hold (anything but letters,
/// digits, `_`, `-`, `.`, `:`) made `_`.
fn identifier(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_-.:".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `wanted`, or `wanted_2`, `wanted_3`, ... when it is taken already.
fn unique_name(taken: &mut HashSet<String>, wanted: &str) -> String {
    let mut name = wanted.to_string();
    let mut suffix = 2;
    while taken.contains(&name) {
        name = format!("{wanted}_{suffix}");
        suffix += 1;
    }
    taken.insert(name.clone());
    name
}

/// Cube's error body (`cube_types::error::ErrorBody`'s shape) as one single-quoted HAProxy
/// word. Inside single quotes HAProxy takes every character as it is, so the only one to
/// avoid is `'` itself, written `\u0027` (the same character to a JSON reader).
fn json_body(status: u16, message: &str) -> String {
    let body = serde_json::json!({ "HTTPStatusCode": status, "Message": message }).to_string();
    format!("'{}'", body.replace('\'', "\\u0027"))
}

/// `word` as one HAProxy configuration word: bare when plain, else single-quoted (where
/// nothing is special), each `'` in it closing the quotes, escaped, and reopening them.
fn quoted(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-:@".contains(&b));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

fn line(text: &mut String, line: impl AsRef<str>) {
    text.push_str(line.as_ref());
    text.push('\n');
}

/// Writes the configuration for every new table received on `tables` (the current value
/// first) and runs the reload command when the file changed, until `shutdown`.
///
/// A failed write or reload is logged (`tracing::warn`, a reload with the command's stderr)
/// and tried again at the next change, or after a wait (1 s, doubling up to a minute) when
/// no change comes first: the routes are level-triggered, so what HAProxy is owed is always
/// the latest table, never a queue of them. A file that already holds the current
/// configuration when this starts is left alone and HAProxy is not reloaded: it read those
/// bytes when it started or last reloaded.
pub async fn keep_in_step(
    mut tables: watch::Receiver<Arc<RouteTable>>,
    options: HaproxyOptions,
    shutdown: CancellationToken,
) {
    let mut keeper = Keeper {
        options,
        reload_owed: false,
        left_out_logged: Vec::new(),
    };
    let mut table = Arc::clone(&tables.borrow_and_update());
    // False once the table's sender is gone: no change comes any more, but a failed step is
    // still tried again until shutdown.
    let mut tables_open = true;
    let mut retry_delay = RETRY_FIRST;
    loop {
        let outcome = tokio::select! {
            outcome = keeper.step(&table) => outcome,
            () = shutdown.cancelled() => return,
        };
        let retry_in = match outcome {
            Ok(()) => {
                retry_delay = RETRY_FIRST;
                None
            }
            Err(error) => {
                tracing::warn!(
                    %error,
                    retry_in_ms = retry_delay.as_millis() as u64,
                    "HAProxy is not in step with the routes; trying again at the next change or after the wait"
                );
                let wait = retry_delay;
                retry_delay = (retry_delay * 2).min(RETRY_MAX);
                Some(wait)
            }
        };
        let retry = async {
            match retry_in {
                Some(wait) => tokio::time::sleep(wait).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(retry);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = &mut retry => break,
                changed = tables.changed(), if tables_open => match changed {
                    Ok(()) => {
                        table = Arc::clone(&tables.borrow_and_update());
                        break;
                    }
                    Err(_) => {
                        tracing::debug!("the routes are no longer followed; HAProxy keeps the last ones");
                        tables_open = false;
                    }
                },
            }
        }
    }
}

/// What [`keep_in_step`] remembers between tables.
struct Keeper {
    options: HaproxyOptions,
    /// The file changed and HAProxy has not yet reloaded it successfully.
    reload_owed: bool,
    /// What the last configuration left out, logged once rather than at every change.
    left_out_logged: Vec<String>,
}

impl Keeper {
    /// Brings the file and HAProxy in step with `table`.
    async fn step(&mut self, table: &RouteTable) -> Result<(), HaproxyError> {
        let Configuration { text, left_out } = configuration(table, &self.options);
        if left_out != self.left_out_logged {
            for what in &left_out {
                tracing::warn!("left out of HAProxy's configuration: {what}");
            }
            self.left_out_logged = left_out;
        }
        let path = self.options.config.clone();
        let written = tokio::task::spawn_blocking(move || write_if_changed(&path, &text))
            .await
            .unwrap_or_else(|joined| Err(io::Error::other(joined)))
            .map_err(|source| HaproxyError::Write {
                path: self.options.config.clone(),
                source,
            })?;
        if written {
            tracing::info!(
                path = %self.options.config.display(),
                routes = table.len(),
                "wrote HAProxy's configuration"
            );
            self.reload_owed =
                self.options.reload.is_some() || self.options.master_socket.is_some();
        }
        if self.reload_owed {
            if let Some(socket) = &self.options.master_socket {
                reload_through_master(socket).await?;
                tracing::info!(socket = %socket.display(), "HAProxy's master reloads");
            } else if let Some(command) = &self.options.reload {
                reload(command).await?;
                tracing::info!(command, "reloaded HAProxy");
            }
            self.reload_owed = false;
        }
        Ok(())
    }
}

/// Writes `text` to `path` unless it holds those bytes already: into a temporary file in the
/// same directory, flushed to disk, then renamed over `path`, so that HAProxy (reloading for
/// any reason) never reads half a file. The temporary file takes the permissions of the file
/// it replaces, which HAProxy's user may need to read it. Returns whether it wrote.
fn write_if_changed(path: &Path, text: &str) -> io::Result<bool> {
    let previous = match std::fs::read(path) {
        Ok(previous) if previous == text.as_bytes() => return Ok(false),
        Ok(_) => Some(std::fs::metadata(path)?.permissions()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => None,
        Err(error) => return Err(error),
    };
    let file_name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"))?;
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let mut temporary_name = std::ffi::OsString::from(".");
    temporary_name.push(file_name);
    temporary_name.push(format!(".cube-{}.tmp", std::process::id()));
    let temporary = directory.join(temporary_name);
    let written = (|| {
        let mut file = std::fs::File::create(&temporary)?;
        io::Write::write_all(&mut file, text.as_bytes())?;
        if let Some(permissions) = previous {
            file.set_permissions(permissions)?;
        }
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    if let Err(error) = written {
        // Best effort: the write failed already, and a leftover is overwritten next time.
        let _ = std::fs::remove_file(&temporary);
        return Err(error);
    }
    // The rename itself survives a crash once the directory is on disk too.
    std::fs::File::open(directory)?.sync_all()?;
    Ok(true)
}

/// Asks HAProxy's master to reload through its CLI socket, and waits until it has: its count
/// of reloads (`show proc`) grew. A master that is starting again from the last reload has no
/// CLI yet, or takes a `reload` and drops it as it starts again: the count is read before,
/// the command sent, the count read again every [`MASTER_POLL`], and the command sent anew
/// when the count has not grown after [`MASTER_ANSWER`]; at most [`MASTER_WAIT`] in all (the
/// master tells no one when it is back).
async fn reload_through_master(socket: &Path) -> Result<(), HaproxyError> {
    let failed = |source: io::Error| HaproxyError::Master {
        socket: socket.to_path_buf(),
        source,
    };
    let started = tokio::time::Instant::now();
    let mut last_error = None;
    while started.elapsed() < MASTER_WAIT {
        let before = match master_reloads(socket).await {
            Ok(count) => count,
            Err(err) if master_away(&err) => {
                last_error = Some(err);
                tokio::time::sleep(MASTER_POLL).await;
                continue;
            }
            Err(err) => return Err(failed(err)),
        };
        match send_reload(socket).await {
            Ok(()) => {}
            Err(err) if master_away(&err) => {
                last_error = Some(err);
                tokio::time::sleep(MASTER_POLL).await;
                continue;
            }
            Err(err) => return Err(failed(err)),
        }
        let asked = tokio::time::Instant::now();
        while asked.elapsed() < MASTER_ANSWER {
            tokio::time::sleep(MASTER_POLL).await;
            match master_reloads(socket).await {
                Ok(count) if count > before => return Ok(()),
                Ok(_) => {}
                Err(err) if master_away(&err) => last_error = Some(err),
                Err(err) => return Err(failed(err)),
            }
        }
    }
    Err(failed(last_error.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the master's count of reloads did not grow within {} s",
                MASTER_WAIT.as_secs()
            ),
        )
    })))
}

/// Whether `err` says the master is starting again (no CLI, or a connection dropped).
fn master_away(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::NotFound
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof
            | io::ErrorKind::TimedOut
    )
}

/// Sends `reload` on the master's CLI (the master closes the connection as it starts again;
/// that is not waited for).
async fn send_reload(socket: &Path) -> io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut stream = tokio::net::UnixStream::connect(socket).await?;
    stream.write_all(b"reload\n").await
}

/// The master's count of reloads, from its row of `show proc` (`PID master RELOADS [failed:
/// N] UPTIME VERSION`). The master keeps the connection open after its answer: read until the
/// row is whole.
async fn master_reloads(socket: &Path) -> io::Result<u64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::UnixStream::connect(socket).await?;
        stream.write_all(b"show proc\n").await?;
        let mut answer = Vec::new();
        let mut chunk = [0u8; 1024];
        loop {
            let text = String::from_utf8_lossy(&answer);
            if let Some(row) = text
                .lines()
                .find(|line| line.split_whitespace().nth(1) == Some("master"))
                && text.contains(&format!("{row}\n"))
            {
                return row
                    .split_whitespace()
                    .nth(2)
                    .and_then(|count| count.parse().ok())
                    .ok_or_else(|| {
                        io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("a master row without a count of reloads: {row:?}"),
                        )
                    });
            }
            let read = stream.read(&mut chunk).await?;
            if read == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the master closed the connection before its row",
                ));
            }
            answer.extend_from_slice(&chunk[..read]);
        }
    };
    tokio::time::timeout(MASTER_ANSWER, exchange)
        .await
        .unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no answer to show proc",
            ))
        })
}

/// Runs `command` with `sh -c`, at most [`RELOAD_TIMEOUT`]; fails with its stderr unless it
/// exits 0.
async fn reload(command: &str) -> Result<(), HaproxyError> {
    let child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        // Dropped on timeout or shutdown: the command is killed rather than left behind.
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| HaproxyError::ReloadStart {
            command: command.to_string(),
            source,
        })?;
    let output = tokio::time::timeout(RELOAD_TIMEOUT, child.wait_with_output())
        .await
        .map_err(|_| HaproxyError::ReloadTimeout {
            command: command.to_string(),
            timeout_s: RELOAD_TIMEOUT.as_secs(),
        })?
        .map_err(|source| HaproxyError::ReloadStart {
            command: command.to_string(),
            source,
        })?;
    if output.status.success() {
        return Ok(());
    }
    let mut stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
    if stderr.len() > STDERR_KEPT_BYTES {
        let mut end = STDERR_KEPT_BYTES;
        while !stderr.is_char_boundary(end) {
            end -= 1;
        }
        stderr.truncate(end);
        stderr.push_str("...");
    }
    if stderr.is_empty() {
        stderr = "nothing on stderr".to_string();
    }
    Err(HaproxyError::ReloadFailed {
        command: command.to_string(),
        status: output.status,
        stderr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_keep_what_haproxy_allows() {
        assert_eq!(
            identifier("web.shop.example-1.test"),
            "web.shop.example-1.test"
        );
        assert_eq!(identifier("a b/c'd"), "a_b_c_d");
        let mut taken = HashSet::new();
        assert_eq!(unique_name(&mut taken, "route_a"), "route_a");
        assert_eq!(unique_name(&mut taken, "route_a"), "route_a_2");
        assert_eq!(unique_name(&mut taken, "route_a"), "route_a_3");
    }

    #[test]
    fn only_plain_hosts_and_addresses_go_in_bare() {
        assert!(is_plain_host("web.shop.example.test"));
        for bad in ["", "a b", "a#b", "::1", "a'b", "a\nb"] {
            assert!(!is_plain_host(bad), "{bad:?}");
        }
        for good in ["10.0.0.1:32768", "node-1.local:80", "[::1]:8080"] {
            assert!(is_plain_address(good), "{good:?}");
        }
        for bad in ["10.0.0.1", ":80", "a:0", "a:99999", "a b:80", "a:80 check"] {
            assert!(!is_plain_address(bad), "{bad:?}");
        }
    }

    #[test]
    fn quoted_words_stay_one_word() {
        assert_eq!(quoted("/run/haproxy/admin.sock"), "/run/haproxy/admin.sock");
        assert_eq!(quoted("/tmp/a b"), "'/tmp/a b'");
        assert_eq!(quoted("/tmp/it's"), r"'/tmp/it'\''s'");
        let body = json_body(503, "route it's \"x\" has none");
        assert!(!body[1..body.len() - 1].contains('\''), "{body}");
        let value: serde_json::Value = serde_json::from_str(&body[1..body.len() - 1]).unwrap();
        assert_eq!(value["Message"], "route it's \"x\" has none");
    }
}
