//! `cube exec -i`/`-t`: an interactive command over an upgraded HTTP connection to the
//! manager (`Upgrade: cube-exec`, frames of `cube_api::attach`), this terminal raw while it
//! runs (with -t), its size passed on as it changes.

use std::io::{Read, Write};
use std::os::fd::AsFd;

use anyhow::{Context, anyhow};
use cube_api::attach::{Frame, PROTOCOL, read_frame, write_frame};
use uuid::Uuid;

use super::ManagerClient;

/// Puts a terminal in raw mode, and back as it was when dropped (also on an error).
struct RawTerminal {
    saved: rustix::termios::Termios,
}

impl RawTerminal {
    fn enter() -> Option<RawTerminal> {
        let stdin = std::io::stdin();
        if !rustix::termios::isatty(stdin.as_fd()) {
            return None;
        }
        let saved = rustix::termios::tcgetattr(stdin.as_fd()).ok()?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(stdin.as_fd(), rustix::termios::OptionalActions::Now, &raw)
            .ok()?;
        Some(RawTerminal { saved })
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        let stdin = std::io::stdin();
        let _ = rustix::termios::tcsetattr(
            stdin.as_fd(),
            rustix::termios::OptionalActions::Now,
            &self.saved,
        );
    }
}

/// This terminal's size, columns then rows, if stdout is one.
fn terminal_size() -> Option<(u16, u16)> {
    let size = rustix::termios::tcgetwinsize(std::io::stdout().as_fd()).ok()?;
    Some((size.ws_col, size.ws_row))
}

/// A query value percent-encoded.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|byte| {
            if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
                char::from(byte).to_string()
            } else {
                format!("%{byte:02X}")
            }
        })
        .collect()
}

/// This process's input as it comes, in chunks; an empty chunk is its end.
///
/// Read on a thread of its own, not tokio's `stdin`: that one reads on the runtime's blocking
/// pool, which the runtime waits for when it shuts down, so a read still waiting for a key
/// kept `cube exec -it T -- cat` alive after Ctrl-D ended `cat`, until the next Enter, which
/// it swallowed. A plain thread ends with the process, whatever it waits for.
fn read_input() -> tokio::sync::mpsc::Receiver<std::io::Result<Vec<u8>>> {
    // A few chunks in flight: the reader waits for the connection, not the other way round.
    let (chunks, receiver) = tokio::sync::mpsc::channel(4);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buffer = vec![0u8; 8192];
        loop {
            let chunk = match stdin.read(&mut buffer) {
                Ok(read) => Ok(buffer[..read].to_vec()),
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(err) => Err(err),
            };
            let last = !matches!(&chunk, Ok(bytes) if !bytes.is_empty());
            if chunks.blocking_send(chunk).is_err() || last {
                return;
            }
        }
    });
    receiver
}

/// Runs `command` in the task interactively; returns its exit code.
pub async fn attach(
    manager: &ManagerClient,
    task: Uuid,
    command: &[String],
    container: Option<&str>,
    tty: bool,
) -> anyhow::Result<i32> {
    let cmd = serde_json::to_string(command)?;
    let mut path = format!("/tasks/{task}/exec/attach?cmd={}&tty={tty}", encode(&cmd));
    if let Some(container) = container {
        path.push_str(&format!("&container={}", encode(container)));
    }
    let response = manager
        .open_upgrade(&path, PROTOCOL)
        .await
        .map_err(|err| manager.explain(err))?;
    let connection = response
        .upgrade()
        .await
        .context("the manager did not switch to an interactive command")?;
    let (mut from_server, mut to_server) = tokio::io::split(connection);
    let raw = if tty { RawTerminal::enter() } else { None };
    // Input, and the terminal's size, to the command.
    let sending = async move {
        if tty && let Some((width, height)) = terminal_size() {
            write_frame(&mut to_server, &Frame::Resize { width, height }).await?;
        }
        let mut resized =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())?;
        let mut stdin = read_input();
        loop {
            tokio::select! {
                read = stdin.recv() => {
                    let read = read.unwrap_or_else(|| Ok(Vec::new()))?;
                    if read.is_empty() {
                        write_frame(&mut to_server, &Frame::InputClosed).await?;
                        // Nothing more to send; the command's end ends the session.
                        std::future::pending::<()>().await;
                    }
                    write_frame(&mut to_server, &Frame::Input(read)).await?;
                }
                _ = resized.recv() => {
                    if let Some((width, height)) = terminal_size() {
                        write_frame(&mut to_server, &Frame::Resize { width, height }).await?;
                    }
                }
            }
        }
        #[allow(unreachable_code)]
        Ok::<(), std::io::Error>(())
    };
    // Output, then the exit code, from the command.
    let receiving = async move {
        let stdout = std::io::stdout();
        loop {
            match read_frame(&mut from_server).await? {
                Some(Frame::Output(bytes)) => {
                    let mut out = stdout.lock();
                    out.write_all(&bytes)?;
                    out.flush()?;
                }
                Some(Frame::Exit(code)) => return Ok::<_, anyhow::Error>(code),
                Some(Frame::Error(message)) => return Err(anyhow!("{message}")),
                Some(_) => {}
                None => {
                    return Err(anyhow!(
                        "the connection ended before the command did (the worker stopped?)"
                    ));
                }
            }
        }
    };
    let ended = tokio::select! {
        code = receiving => code,
        sent = sending => match sent {
            Ok(()) => Err(anyhow!("the input ended the session")),
            Err(err) => Err(anyhow!("cannot send to the command: {err}")),
        },
    };
    drop(raw);
    match ended? {
        Some(code) => Ok(i32::try_from(code).unwrap_or(1)),
        None => Err(anyhow!("the command ended, but its exit code is unknown")),
    }
}
