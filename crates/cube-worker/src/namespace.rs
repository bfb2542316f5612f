//! Probes that run inside a container's own network namespace.
//!
//! Docker's userland proxy accepts a connection on a published host port whether or not
//! anything listens in the container, so a probe of the host port learns nothing. A probe here
//! runs on a thread that enters the container's network namespace (`setns` on
//! `/proc/<pid>/ns/net`, which needs root, as a worker has to talk to Docker) and connects to
//! `127.0.0.1:<container port>` there: the container's own loopback, where only what listens
//! in the container answers. No traffic goes to Docker's bridge addresses.
//!
//! A thread that entered a namespace stays in it, and so does every socket it creates, so such
//! a thread is never handed back to a pool (tokio's blocking pool included): each probe has a
//! fresh thread that ends with it. Probes of one task never overlap (the health schedule sees
//! to that) and every socket operation has a deadline, so there are at most as many probe
//! threads as health-checked tasks, each living at most about its task's timeout.
//! It must not be used for anything but a probe: this module holds the only `setns`.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};

/// What a probe asks of the container's port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ProbeKind {
    /// A connection is healthy.
    Tcp,
    /// `GET path` answered with a 2xx status is healthy.
    Http { path: String },
}

/// The most read of an HTTP answer while looking for its status line: a server that sends
/// more without a line break is not answering HTTP.
const MAX_STATUS_LINE_BYTES: usize = 1024;

/// Probes `port` on the loopback of the container whose first process is `pid`, within
/// `timeout`. `Ok` when healthy, else what went wrong, in words.
pub(crate) async fn probe(
    pid: u32,
    port: u16,
    kind: ProbeKind,
    timeout: Duration,
) -> Result<(), String> {
    let (answer, answered) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(format!("cube-probe-{pid}"))
        .spawn(move || {
            let deadline = Instant::now() + timeout;
            let outcome = probe_blocking(pid, port, &kind, timeout, deadline);
            // Nobody waits any more when the worker shut down meanwhile: nothing to tell.
            let _ = answer.send(outcome);
        })
        .map_err(|err| format!("cannot start a probe thread: {err}"))?;
    answered
        .await
        .unwrap_or_else(|_| Err("the probe thread ended without an answer".to_string()))
}

/// The probe itself, on a thread of its own that ends after it (see the module's docs).
fn probe_blocking(
    pid: u32,
    port: u16,
    kind: &ProbeKind,
    timeout: Duration,
    deadline: Instant,
) -> Result<(), String> {
    if let ProbeKind::Http { path } = kind
        && path.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "HealthCheck {path:?} cannot be sent: a path has no spaces or control characters"
        ));
    }
    enter_network_namespace(pid)?;
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let late = || format!("port {port}: no answer within {timeout:?}");
    let mut stream = TcpStream::connect_timeout(&address, remaining(deadline).ok_or_else(late)?)
        .map_err(|err| match err.kind() {
            ErrorKind::TimedOut | ErrorKind::WouldBlock => late(),
            _ => format!("TCP connect to port {port} in the container: {err}"),
        })?;
    match kind {
        ProbeKind::Tcp => Ok(()),
        ProbeKind::Http { path } => {
            let status =
                http_status(&mut stream, port, path, deadline).map_err(|err| match err.kind() {
                    ErrorKind::TimedOut | ErrorKind::WouldBlock => {
                        format!("GET {path}: no answer within {timeout:?}")
                    }
                    _ => format!("GET {path}: {err}"),
                })?;
            if (200..300).contains(&status) {
                Ok(())
            } else {
                Err(format!("GET {path} answered {status}"))
            }
        }
    }
}

/// Moves the calling thread into the network namespace of process `pid`.
fn enter_network_namespace(pid: u32) -> Result<(), String> {
    let path = format!("/proc/{pid}/ns/net");
    let namespace = std::fs::File::open(&path).map_err(|err| {
        format!("cannot open the container's network namespace {path}: {err} (has it exited?)")
    })?;
    move_into_link_name_space(namespace.as_fd(), Some(LinkNameSpaceType::Network)).map_err(|err| {
        format!(
            "cannot enter the container's network namespace {path}: {err} \
                 (health checks need the worker to run as root)"
        )
    })
}

/// The time left until `deadline`, `None` when it has passed (a zero timeout is refused by
/// the socket calls, so it never reaches them).
fn remaining(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|left| !left.is_zero())
}

/// Sends `GET path` as HTTP/1.0 (the server closes the connection after its answer) and
/// reads the status code of the answer, all before `deadline`.
fn http_status(
    stream: &mut TcpStream,
    port: u16,
    path: &str,
    deadline: Instant,
) -> std::io::Result<u16> {
    let timed_out = || std::io::Error::from(ErrorKind::TimedOut);
    stream.set_write_timeout(Some(remaining(deadline).ok_or_else(timed_out)?))?;
    let request = format!(
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: cube-health-check\r\n\r\n"
    );
    stream.write_all(request.as_bytes())?;
    let mut answer = Vec::with_capacity(128);
    let mut chunk = [0u8; 256];
    loop {
        if let Some(status) = status_code(&answer)? {
            return Ok(status);
        }
        stream.set_read_timeout(Some(remaining(deadline).ok_or_else(timed_out)?))?;
        let read = stream.read(&mut chunk)?;
        if read == 0 {
            return match status_code_at_end(&answer) {
                Some(status) => Ok(status),
                None => Err(std::io::Error::new(
                    ErrorKind::UnexpectedEof,
                    "the connection closed before an HTTP status line",
                )),
            };
        }
        answer.extend_from_slice(&chunk[..read]);
    }
}

/// The status code once the answer holds its first line; `None` while it is incomplete.
fn status_code(answer: &[u8]) -> std::io::Result<Option<u16>> {
    let Some(end) = answer.windows(2).position(|pair| pair == b"\r\n") else {
        if answer.len() > MAX_STATUS_LINE_BYTES {
            return Err(not_http(answer));
        }
        return Ok(None);
    };
    parse_status_line(&answer[..end])
        .map(Some)
        .ok_or_else(|| not_http(answer))
}

/// A server that closed right after a status line ended by a bare `\n` or nothing.
fn status_code_at_end(answer: &[u8]) -> Option<u16> {
    let line = answer.split(|byte| *byte == b'\n').next()?;
    parse_status_line(line)
}

/// `HTTP/1.x NNN reason` → NNN.
fn parse_status_line(line: &[u8]) -> Option<u16> {
    let line = std::str::from_utf8(line).ok()?.trim_end();
    let mut words = line.split(' ');
    let version = words.next()?;
    let status = words.next()?;
    if !version.starts_with("HTTP/") || status.len() != 3 {
        return None;
    }
    status.parse().ok().filter(|code| (100..600).contains(code))
}

fn not_http(answer: &[u8]) -> std::io::Error {
    let shown = String::from_utf8_lossy(&answer[..answer.len().min(64)]).into_owned();
    std::io::Error::new(
        ErrorKind::InvalidData,
        format!("the answer is not HTTP: {shown:?}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_comes_from_the_first_line_once_it_is_complete() {
        assert_eq!(
            status_code(b"HTTP/1.0 200 OK\r\nContent-").unwrap(),
            Some(200)
        );
        assert_eq!(
            status_code(b"HTTP/1.1 404 Not Found\r\n").unwrap(),
            Some(404)
        );
        assert_eq!(status_code(b"HTTP/1.0 20").unwrap(), None);
        assert!(status_code(b"SSH-2.0-OpenSSH\r\n").is_err());
        assert!(status_code(&[b'x'; MAX_STATUS_LINE_BYTES + 1]).is_err());
        assert_eq!(status_code_at_end(b"HTTP/1.0 503 Busy\n"), Some(503));
        assert_eq!(status_code_at_end(b"HTTP/1.0 503"), Some(503));
        assert_eq!(status_code_at_end(b""), None);
    }

    #[test]
    fn a_path_that_would_break_the_request_line_is_refused_before_any_connection() {
        let kind = ProbeKind::Http {
            path: "/health HTTP/1.0\r\nX: y".to_string(),
        };
        let now = Instant::now();
        let err = probe_blocking(u32::MAX, 1, &kind, Duration::from_secs(1), now).unwrap_err();
        assert!(err.contains("cannot be sent"), "{err}");
    }

    #[test]
    fn a_process_that_does_not_exist_is_named_in_the_error() {
        let now = Instant::now();
        let err =
            probe_blocking(u32::MAX, 1, &ProbeKind::Tcp, Duration::from_secs(1), now).unwrap_err();
        assert!(err.contains(&format!("/proc/{}/ns/net", u32::MAX)), "{err}");
    }
}
