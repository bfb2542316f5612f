//! The copy `cube-bench router` routes to: a small HTTP/1.1 server with keep-alive, built by
//! the benchmark with `rustc` alone (std only) as a statically linked binary and imported as
//! a `FROM scratch`-like image, so that the proxies, not the copy, are what is measured
//! (busybox `httpd`, the sample image's server, closes every connection and forks for each).
//! `GET /who` answers the container's host name; every other path answers `ok`.
//! Usage: `copy PORT`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

fn main() {
    let port = std::env::args().nth(1).unwrap_or_else(|| "7777".to_string());
    let who = std::fs::read_to_string("/etc/hostname")
        .unwrap_or_else(|_| "unknown".to_string())
        .trim()
        .to_string();
    let listener = match TcpListener::bind(format!("0.0.0.0:{port}")) {
        Ok(listener) => listener,
        Err(err) => {
            eprintln!("copy: cannot listen on {port}: {err}");
            std::process::exit(1);
        }
    };
    for stream in listener.incoming().flatten() {
        let who = who.clone();
        std::thread::spawn(move || serve(stream, &who));
    }
}

fn serve(mut stream: TcpStream, who: &str) {
    let _ = stream.set_nodelay(true);
    let mut buffer: Vec<u8> = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        // A request's head, then as many body bytes as its Content-Length says.
        let head_end = loop {
            if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or(0);
        while buffer.len() < head_end + length {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        let close = head.contains("\r\nconnection: close");
        let body = if head.starts_with("get /who ") { who } else { "ok" };
        let answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n{}\r\n{body}\n",
            body.len() + 1,
            if close { "Connection: close\r\n" } else { "" }
        );
        if stream.write_all(answer.as_bytes()).is_err() || close {
            return;
        }
        buffer.drain(..head_end + length);
    }
}
