//! The members of an etcd cluster as one service: a request goes to the member that
//! answered last, and moves on to the next when that one cannot answer (it died, it is
//! stopped, it has no raft leader), until one does or the request's time is up.
//!
//! etcd's own client keeps sending to a dead member, so Cube holds one client per member and
//! chooses itself. Retrying is safe for what Cube sends: a read changes nothing, a put of
//! the same value twice leaves the same value, and a conditional write that did land the
//! first time is refused by its own condition the second time.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use tokio::time::Instant;

use crate::StoreError;

/// One client per member, and which one to ask first.
pub(crate) struct Members {
    endpoints: Vec<String>,
    clients: Vec<Client>,
    /// The member that answered last: asked first next time.
    current: AtomicUsize,
    /// How long one member is given to answer one request before the next is asked.
    attempt_timeout: Duration,
    /// How long a request may take in all, over every member and round.
    request_timeout: Duration,
}

/// Whether an error says the member could not serve the request (ask another), rather
/// than that the request itself was refused.
fn member_failed(err: &etcd_client::Error) -> bool {
    use etcd_client::Error;
    use tonic::Code;
    match err {
        Error::IoError(_) | Error::TransportError(_) | Error::WatchError(_) => true,
        Error::GRpcStatus(status) => matches!(
            status.code(),
            Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Cancelled
                | Code::Unknown
                | Code::Aborted
                | Code::Internal
        ),
        _ => false,
    }
}

/// An endpoint as the client wants it: `host:port` gets `http://`.
pub(crate) fn endpoint_url(endpoint: &str) -> String {
    if endpoint.starts_with("http://") || endpoint.starts_with("https://") {
        endpoint.to_string()
    } else {
        format!("http://{endpoint}")
    }
}

impl Members {
    /// Clients for every endpoint. Nothing is sent yet: a member that is down now is simply
    /// skipped when asked.
    pub(crate) async fn connect(
        endpoints: &[String],
        attempt_timeout: Duration,
        request_timeout: Duration,
    ) -> Result<Members, StoreError> {
        if endpoints.is_empty() {
            return Err(StoreError::Etcd("no etcd endpoint was given".to_string()));
        }
        let mut clients = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let options = ConnectOptions::new()
                .with_connect_timeout(attempt_timeout)
                .with_timeout(attempt_timeout)
                // A member that stops answering (paused, cut off) is noticed on an idle
                // connection too, so a watch on it breaks instead of waiting for ever.
                .with_keep_alive(Duration::from_secs(1), attempt_timeout)
                .with_keep_alive_while_idle(true)
                // A member cut off from the others refuses rather than serving old data.
                .with_require_leader(true);
            let client = Client::connect([endpoint_url(endpoint)], Some(options))
                .await
                .map_err(|err| StoreError::Etcd(format!("etcd endpoint {endpoint:?}: {err}")))?;
            clients.push(client);
        }
        Ok(Members {
            endpoints: endpoints.to_vec(),
            clients,
            current: AtomicUsize::new(0),
            attempt_timeout,
            request_timeout,
        })
    }

    /// The endpoints, for messages.
    pub(crate) fn describe(&self) -> String {
        self.endpoints.join(",")
    }

    pub(crate) fn unavailable(&self, reason: impl Into<String>) -> StoreError {
        StoreError::Unavailable {
            endpoints: self.describe(),
            reason: reason.into(),
        }
    }

    /// The member after `index` is asked first from now on (the one at `index` failed
    /// outside [`Members::call`], e.g. a watch stream broke).
    pub(crate) fn skip(&self, index: usize) {
        let next = (index + 1) % self.clients.len();
        let _ = self
            .current
            .compare_exchange(index, next, Ordering::AcqRel, Ordering::Acquire);
    }

    /// [`Members::call_at`], without saying which member answered.
    pub(crate) async fn call<T, F, Fut>(&self, call: F) -> Result<T, StoreError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call_at(call).await.map(|(value, _)| value)
    }

    /// Runs `call` on the member that answered last, then on each other in turn while
    /// members fail, with a growing pause after each round in which none answered (a
    /// cluster electing a raft leader answers again within a second or two), until the
    /// request timeout. The answer and the index of the member that gave it.
    pub(crate) async fn call_at<T, F, Fut>(&self, mut call: F) -> Result<(T, usize), StoreError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + self.request_timeout;
        let count = self.clients.len();
        let mut pause = Duration::from_millis(50);
        let mut last_failure = String::new();
        loop {
            let start = self.current.load(Ordering::Acquire);
            for offset in 0..count {
                let index = (start + offset) % count;
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(self.unavailable(last_failure));
                }
                let attempt = call(self.clients[index].clone());
                match tokio::time::timeout(self.attempt_timeout.min(left), attempt).await {
                    Ok(Ok(answer)) => {
                        self.current.store(index, Ordering::Release);
                        return Ok((answer, index));
                    }
                    Ok(Err(err)) if member_failed(&err) => {
                        last_failure = format!("{}: {err}", self.endpoints[index]);
                    }
                    Ok(Err(err)) => {
                        return Err(StoreError::Etcd(format!(
                            "{} refused the request: {err}",
                            self.endpoints[index]
                        )));
                    }
                    Err(_) => {
                        last_failure = format!(
                            "{}: no answer within {:?}",
                            self.endpoints[index],
                            self.attempt_timeout.min(left)
                        );
                    }
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.unavailable(last_failure));
            }
            // A retry's backoff: no member answered this round.
            tokio::time::sleep(pause.min(left)).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }
}
