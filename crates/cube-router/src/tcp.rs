//! Plain TCP forwarding: each connection accepted on a port of the router goes, bytes both
//! ways, to a copy of one route (a database, a queue: whatever does not speak HTTP).
//!
//! The route is looked up by name at each connection, so that a new table takes effect
//! for the next connection; a copy counts the connection outstanding while it lasts, so
//! that the copy with the fewest open connections gets the next. What goes through is not
//! read.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::ErrorKind;
use crate::proxy::{CONNECT_TIMEOUT, Router, SHUTDOWN_GRACE};

/// Forwards each connection accepted on `listener` to a copy of the route named `route`
/// (looked up in the table at each connection with `RouteTable::by_name`), bytes both ways.
/// A copy that does not accept the connection (refused, or not within
/// [`CONNECT_TIMEOUT`]) is left for another copy, once; with no route or no copy, the
/// connection is closed at once and counted as an error. Until `shutdown`; then open
/// connections have [`SHUTDOWN_GRACE`] to end before they are closed.
pub async fn serve_tcp(
    router: Arc<Router>,
    listener: TcpListener,
    route: String,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let route: Arc<str> = route.into();
    // Every connection's task, so that shutdown can wait for them.
    let connections = TaskTracker::new();
    loop {
        let Some((client, peer)) = crate::proxy::accept(&listener, &shutdown, "tcp").await else {
            break;
        };
        let router = Arc::clone(&router);
        let route = Arc::clone(&route);
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            tokio::select! {
                () = forward(&router, &route, client, peer) => {}
                () = async {
                    shutdown.cancelled().await;
                    tokio::time::sleep(SHUTDOWN_GRACE).await;
                } => {
                    tracing::debug!(%route, %peer, "TCP connection closed at the end of the shutdown grace");
                }
            }
        });
    }
    drop(listener);
    connections.close();
    connections.wait().await;
    Ok(())
}

/// One connection from `peer`, to its end.
async fn forward(router: &Router, name: &str, mut client: TcpStream, peer: SocketAddr) {
    if let Err(error) = client.set_nodelay(true) {
        tracing::debug!(route = %name, %peer, %error, "setting TCP_NODELAY failed");
    }
    // The guard is dropped at once: it must not be held across an await.
    let route = router.table().load().by_name(name).cloned();
    let Some(route) = route else {
        router.metrics().route(name).error(ErrorKind::NoRoute);
        tracing::debug!(route = %name, %peer, "no route of that name: connection closed");
        return;
    };
    let metrics = router.metrics().route(&route.name);
    metrics.tcp_connection();
    let Some(first) = route.pick(None) else {
        metrics.error(ErrorKind::NoCopy);
        tracing::debug!(route = %route.name, %peer, "no copy running and healthy: connection closed");
        return;
    };
    let (copy, mut upstream) = match connect(&first.address).await {
        Ok(upstream) => (first, upstream),
        Err(first_error) => {
            metrics.error(ErrorKind::Retried);
            let Some(second) = route.pick(Some(first.target())) else {
                metrics.error(ErrorKind::Upstream);
                return;
            };
            drop(first);
            match connect(&second.address).await {
                Ok(upstream) => (second, upstream),
                Err(second_error) => {
                    metrics.error(ErrorKind::Upstream);
                    tracing::debug!(
                        route = %route.name,
                        %peer,
                        copy = %second.address,
                        error = %second_error,
                        %first_error,
                        "no copy took the connection: closed"
                    );
                    return;
                }
            }
        }
    };
    match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
        Ok((sent, received)) => {
            tracing::trace!(route = %route.name, %peer, copy = %copy.address, sent, received, "TCP connection ended");
        }
        Err(error) => {
            tracing::debug!(route = %route.name, %peer, copy = %copy.address, %error, "TCP connection ended with an error");
        }
    }
}

/// A connection to the copy at `address`, within [`CONNECT_TIMEOUT`].
async fn connect(address: &str) -> std::io::Result<TcpStream> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address))
        .await
        .map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "{address} did not accept a connection within {} s",
                    CONNECT_TIMEOUT.as_secs()
                ),
            )
        })??;
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(copy = %address, %error, "setting TCP_NODELAY failed");
    }
    Ok(stream)
}
