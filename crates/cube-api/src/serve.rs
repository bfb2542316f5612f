//! Serving a router: Cube's own accept loop on hyper's HTTP/1 server, with the limits that
//! keep a slow, broken or hostile client from holding a server's connections.
//!
//! - **Headers** must arrive whole within [`ServeLimits::header_timeout`] (hyper's
//!   `header_read_timeout`, which also bounds how long an idle kept-alive connection waits
//!   for its next request): a client that sends one byte a second is cut off.
//! - **A request body** must arrive whole within [`ServeLimits::body_timeout`] of its
//!   request's headers, or the answer is a `408` JSON error that closes the connection. The
//!   body is read whole (at most [`MAX_BODY_BYTES`], else `413`) before the router sees the
//!   request: a route that answers without reading it (a 404, a 405) would otherwise close a
//!   connection the client is still writing to, and the client would lose the answer to a
//!   reset. Only what the client sends is timed: a long answer (`GET /events`, followed
//!   logs, an upgraded `exec` connection) runs as long as it needs.
//! - **Connections per client address** are at most
//!   [`ServeLimits::max_connections_per_client`]: one more is closed as it is accepted,
//!   while other clients are still served.
//!
//! Shutdown is the same as `axum::serve`'s graceful one: once `shutdown` is cancelled no
//! connection is accepted, every open one finishes the request it serves and closes, and
//! [`serve`] returns when the last one has. Callers bound that wait with their own grace.
//!
//! This module knows connections and bytes, never what a client may do: authentication is a
//! layer of the routers. Over TLS ([`serve_tls`]) it tells them one fact, the identity of a
//! client certificate the CA signed ([`crate::tls::PeerIdentity`], a request extension).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use crate::server::{ApiError, MAX_BODY_BYTES};

/// The limits a server holds its clients to. `cube manager`, `cube worker` and `cube dev`
/// take them as flags (`--header-timeout`, `--body-timeout`,
/// `--max-connections-per-client`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// How long a client may take to send a request's headers (and how long a kept-alive
    /// connection may stay idle between requests).
    pub header_timeout: Duration,
    /// How long a client may take to send a request's body, from the end of its headers.
    pub body_timeout: Duration,
    /// How many connections one client address may hold open at once.
    pub max_connections_per_client: usize,
}

impl Default for ServeLimits {
    fn default() -> ServeLimits {
        ServeLimits {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            max_connections_per_client: DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
        }
    }
}

/// hyper's own default: long enough for any real client on any network.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// A body is at most 1 MiB ([`crate::MAX_BODY_BYTES`]): a minute is 17 KiB/s.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// Far more than a CLI, a worker (heartbeats) or a manager (a blocking query per worker)
/// ever opens; a load generator on one machine may need the flag.
pub const DEFAULT_MAX_CONNECTIONS_PER_CLIENT: usize = 128;

/// Serves `router` on `listener` under `limits` until `shutdown` is cancelled and the last
/// open connection has closed.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ServeLimits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_tls(listener, router, limits, None, shutdown).await
}

/// [`serve`], over TLS when `tls` is given: each accepted connection's handshake runs in its
/// own task, within [`ServeLimits::header_timeout`], and every request of a connection whose
/// client presented a certificate carries its [`crate::tls::PeerIdentity`] as an extension.
pub async fn serve_tls(
    listener: TcpListener,
    router: Router,
    limits: ServeLimits,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let counts = ConnectionCounts::default();
    let connections = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                if is_per_connection_error(&err) {
                    continue;
                }
                // Out of file descriptors and the like: what is open must close first. Wait
                // a little (or for the stop) rather than spin on the same error.
                tracing::error!(error = %err, "cannot accept a connection");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(100)) => continue,
                    () = shutdown.cancelled() => break,
                }
            }
        };
        let Some(slot) = counts.take(peer.ip(), limits.max_connections_per_client) else {
            tracing::debug!(client = %peer, limit = limits.max_connections_per_client,
                "connection refused: the client holds the most connections allowed");
            drop(stream);
            continue;
        };
        let connection = Connection {
            router: router.clone(),
            http: http.clone(),
            body_timeout: limits.body_timeout,
            shutdown: shutdown.clone(),
            _slot: slot,
        };
        match &acceptor {
            None => {
                // Answers are small and often streamed line by line: send each at once.
                let _ = stream.set_nodelay(true);
                connections.spawn(connection.serve(stream, None));
            }
            Some(acceptor) => {
                connections.spawn(handshake_then_serve(
                    acceptor.clone(),
                    stream,
                    limits.header_timeout,
                    connection,
                ));
            }
        }
    }
    drop(listener);
    connections.close();
    connections.wait().await;
    Ok(())
}

/// Errors `accept` gives for one connection that went wrong, after which accepting goes on.
fn is_per_connection_error(err: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        err.kind(),
        ErrorKind::ConnectionRefused | ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset
    )
}

/// What serving one connection needs.
struct Connection {
    router: Router,
    http: hyper::server::conn::http1::Builder,
    body_timeout: Duration,
    shutdown: CancellationToken,
    /// Counted as the client's until the connection ends.
    _slot: ConnectionSlot,
}

/// The TLS handshake, bounded like a request's headers (a client that never finishes it
/// holds its slot no longer), then the connection.
async fn handshake_then_serve(
    acceptor: tokio_rustls::TlsAcceptor,
    stream: TcpStream,
    timeout: Duration,
    connection: Connection,
) {
    let _ = stream.set_nodelay(true);
    let peer = stream.peer_addr().ok();
    let accepted = tokio::select! {
        accepted = tokio::time::timeout(timeout, acceptor.accept(stream)) => accepted,
        () = connection.shutdown.cancelled() => return,
    };
    let stream = match accepted {
        Ok(Ok(stream)) => stream,
        Ok(Err(err)) => {
            tracing::debug!(client = ?peer, error = %err, "TLS handshake refused");
            return;
        }
        Err(_) => {
            tracing::debug!(client = ?peer, "TLS handshake not finished in time");
            return;
        }
    };
    let identity = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|certs| certs.first())
        .and_then(|leaf| crate::tls::identity_of(leaf));
    connection.serve(stream, identity).await;
}

impl Connection {
    async fn serve<S>(self, stream: S, identity: Option<crate::tls::PeerIdentity>)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let Connection {
            router,
            http,
            body_timeout,
            shutdown,
            _slot,
        } = self;
        let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
            if let Some(identity) = &identity {
                request.extensions_mut().insert(identity.clone());
            }
            answer(router.clone(), request, body_timeout)
        });
        let connection = http
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        tokio::pin!(connection);
        let result = tokio::select! {
            result = connection.as_mut() => result,
            () = shutdown.cancelled() => {
                // Finish the request under way, then close.
                connection.as_mut().graceful_shutdown();
                connection.await
            }
        };
        if let Err(err) = result {
            tracing::debug!(error = %err, "connection ended with an error");
        }
    }
}

/// Hands one request to the router once its body is read whole, under the deadline.
async fn answer(
    router: Router,
    request: Request<Incoming>,
    body_timeout: Duration,
) -> Result<Response, Infallible> {
    let (parts, body) = request.into_parts();
    let read =
        tokio::time::timeout(body_timeout, Limited::new(body, MAX_BODY_BYTES).collect()).await;
    let body = match read {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(err)) if err.is::<LengthLimitError>() => {
            return Ok(refusal(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body is larger than the limit of {MAX_BODY_BYTES} bytes"),
            ));
        }
        Ok(Err(err)) => {
            return Ok(refusal(
                StatusCode::BAD_REQUEST,
                format!("cannot read the request body: {err}"),
            ));
        }
        Err(_) => {
            return Ok(refusal(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within the limit of {}",
                    cube_types::duration::format_duration(body_timeout)
                ),
            ));
        }
    };
    router
        .oneshot(Request::from_parts(parts, Body::from(body)))
        .await
}

/// An answer given before the router: the rest of the body, if any, is never read, so the
/// connection cannot carry another request.
fn refusal(status: StatusCode, message: String) -> Response {
    let mut response = ApiError::new(status, message).into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Open connections per client address. A `std` mutex: held for one map operation, never
/// across an await.
#[derive(Clone, Default)]
struct ConnectionCounts(Arc<Mutex<HashMap<IpAddr, usize>>>);

impl ConnectionCounts {
    /// A slot for one more connection from `client`, or `None` when it holds `limit`.
    fn take(&self, client: IpAddr, limit: usize) -> Option<ConnectionSlot> {
        let mut counts = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let count = counts.entry(client).or_insert(0);
        if *count >= limit {
            return None;
        }
        *count += 1;
        Some(ConnectionSlot {
            counts: self.clone(),
            client,
        })
    }
}

/// One open connection, counted until it is dropped; an address with none left is forgotten.
struct ConnectionSlot {
    counts: ConnectionCounts,
    client: IpAddr,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut counts = self
            .counts
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(count) = counts.get_mut(&self.client) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_gets_at_most_its_limit_of_slots_and_a_closed_one_frees_its_slot() {
        let counts = ConnectionCounts::default();
        let client: IpAddr = "10.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        let first = counts.take(client, 2).unwrap();
        let _second = counts.take(client, 2).unwrap();
        assert!(counts.take(client, 2).is_none());
        assert!(counts.take(other, 2).is_some(), "other clients are served");
        drop(first);
        assert!(counts.take(client, 2).is_some());
    }

    #[test]
    fn an_address_with_no_connection_left_is_forgotten() {
        let counts = ConnectionCounts::default();
        let client: IpAddr = "10.0.0.1".parse().unwrap();
        drop(counts.take(client, 1));
        assert!(counts.0.lock().unwrap().is_empty());
    }
}
