//! The client side: one small wrapper over `reqwest` for every Cube API.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use cube_types::ErrorBody;
pub use reqwest::Response;
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::server::{
    HEARTBEAT_INTERVAL_HEADER, INDEX_HEADER, NODE_HEADER, OLDEST_INDEX_HEADER, SINCE_HEADER,
    WORKER_TOKEN_HEADER,
};

/// Why a request to a Cube API did not give the answer asked for.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No whole answer came: `kind` says how far the request got, which tells a caller whether
    /// the server may have acted on it.
    #[error("cannot reach {url}: {reason}")]
    Unreachable {
        url: String,
        reason: String,
        kind: Unreached,
    },
    /// The server answered with an error status; `message` is its JSON error's message.
    #[error("{url} answered {status}: {message}")]
    Status {
        url: String,
        status: StatusCode,
        message: String,
    },
    /// The server no longer keeps what came after the index asked for (410): `oldest_index`
    /// is the oldest it can answer from.
    #[error("{url} answered 410 Gone: {message}")]
    Gone {
        url: String,
        message: String,
        oldest_index: u64,
    },
    #[error("unexpected answer from {url}: {reason}")]
    Decode { url: String, reason: String },
    #[error("invalid address {0:?}: expected HOST:PORT or http://HOST:PORT")]
    Address(String),
    #[error(
        "{0} is HTTPS: give the cluster CA's SHA-256 fingerprint (--ca-fingerprint, \
         CUBE_CA_FINGERPRINT, or `cube config set-cluster NAME --manager {0} --ca-fingerprint \
         FP`) to verify the manager"
    )]
    HttpsWithoutCa(String),
}

/// How far a request that got no whole answer went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unreached {
    /// No connection was made (refused, no route, the TLS handshake failed): the server saw
    /// nothing of the request, which may be sent anywhere again.
    Connect,
    /// No answer within the timeout (the duration): the server may still be acting on it.
    TimedOut(Duration),
    /// The connection broke after the request was sent, or while the answer came: the server
    /// may or may not have acted on it.
    Broken,
}

impl Unreached {
    /// How far a request that failed with `err` went; `timeout` is the one it was sent with.
    fn of(err: &reqwest::Error, timeout: Duration) -> Unreached {
        // A connect timeout is both: the server saw nothing.
        if err.is_connect() {
            Unreached::Connect
        } else if err.is_timeout() {
            Unreached::TimedOut(timeout)
        } else {
            Unreached::Broken
        }
    }
}

/// The last cause of an error chain written as `outer: inner: innermost`.
pub fn innermost_cause(reason: &str) -> &str {
    reason
        .rsplit(": ")
        .find(|part| !part.trim().is_empty())
        .unwrap_or(reason)
        .trim()
}

impl ClientError {
    /// What happened, in a few words: for a server that cannot be reached, the innermost cause
    /// of reqwest's chain ("Connection refused (os error 111)"), whose outer layers repeat the
    /// URL; otherwise the whole error.
    pub fn cause(&self) -> String {
        match self {
            ClientError::Unreachable { reason, .. } => innermost_cause(reason).to_string(),
            other => other.to_string(),
        }
    }

    /// The HTTP status of an error answer, if the server gave one.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            ClientError::Status { status, .. } => Some(*status),
            ClientError::Gone { .. } => Some(StatusCode::GONE),
            _ => None,
        }
    }
}

/// The `reqwest` clients of this process, one per runtime, connect timeout and TLS settings
/// (the settings held weakly: a client goes when its settings are replaced, a certificate
/// renewed), the most recently built last.
static HTTP_CLIENTS: Mutex<Vec<SharedHttp>> = Mutex::new(Vec::new());

/// At most this many clients are kept: a process that starts runtime after runtime (a test
/// binary) lets the oldest go.
const MAX_SHARED_CLIENTS: usize = 32;

struct SharedHttp {
    /// A connection lives on the runtime that made it: a client serves one runtime.
    runtime: Option<tokio::runtime::Id>,
    connect_timeout: Duration,
    /// At most this many idle connections kept to one server (`None`: as many as were
    /// used at once).
    idle_per_server: Option<usize>,
    tls: Option<Weak<rustls::ClientConfig>>,
    http: reqwest::Client,
}

impl SharedHttp {
    fn serves(
        &self,
        runtime: Option<tokio::runtime::Id>,
        connect_timeout: Duration,
        idle_per_server: Option<usize>,
        tls: Option<&Arc<rustls::ClientConfig>>,
    ) -> bool {
        self.runtime == runtime
            && self.connect_timeout == connect_timeout
            && self.idle_per_server == idle_per_server
            && match (&self.tls, tls) {
                (None, None) => true,
                (Some(held), Some(tls)) => {
                    held.upgrade().is_some_and(|held| Arc::ptr_eq(&held, tls))
                }
                _ => false,
            }
    }
}

/// The process's `reqwest` client for these settings, built the first time they are asked for.
/// Every [`ApiClient`] with the same settings shares it, with its connection pool: a manager
/// talks to thousands of workers, and a client of its own per worker cost each one ~100 KB
/// (the system's root certificates, a pool, a dispatch channel), 1 GB at 10,000 workers.
fn shared_http(
    connect_timeout: Duration,
    idle_per_server: Option<usize>,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<reqwest::Client, reqwest::Error> {
    let runtime = tokio::runtime::Handle::try_current()
        .ok()
        .map(|runtime| runtime.id());
    let mut clients = HTTP_CLIENTS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(shared) = clients
        .iter()
        .find(|shared| shared.serves(runtime, connect_timeout, idle_per_server, tls))
    {
        return Ok(shared.http.clone());
    }
    let mut builder = reqwest::Client::builder().connect_timeout(connect_timeout);
    builder = match idle_per_server {
        Some(idle) => builder
            .pool_max_idle_per_host(idle)
            .pool_idle_timeout(IDLE_TO_ONE_OF_MANY_FOR),
        None => builder.pool_idle_timeout(IDLE_CONNECTION_FOR),
    };
    if let Some(tls) = tls {
        builder = builder.tls_backend_preconfigured((**tls).clone());
    }
    let http = builder.build()?;
    // Settings replaced since (a renewed certificate's) are let go of.
    clients.retain(|shared| {
        shared
            .tls
            .as_ref()
            .is_none_or(|held| held.strong_count() > 0)
    });
    if clients.len() >= MAX_SHARED_CLIENTS {
        clients.remove(0);
    }
    clients.push(SharedHttp {
        runtime,
        connect_timeout,
        idle_per_server,
        tls: tls.map(Arc::downgrade),
        http: http.clone(),
    });
    Ok(http)
}

/// How long a client keeps an idle connection to a Cube server: less than the server's
/// header timeout (30 s by default), after which the server closes it, so that a request is
/// never sent on a connection being closed.
pub const IDLE_CONNECTION_FOR: Duration = Duration::from_secs(20);

/// How long a client of one of many servers over HTTPS ([`ApiClient::of_one_of_many`]: a manager's
/// clients of its workers) keeps its idle connection: long enough for a burst of sends to one
/// worker to share it, short enough that a manager sending tasks all over a large cluster
/// does not keep a connection to every worker it sent one to in the last 20 s.
pub const IDLE_TO_ONE_OF_MANY_FOR: Duration = Duration::from_secs(2);

/// A client for one Cube server (a manager or a worker). Every request has a timeout.
#[derive(Debug, Clone)]
pub struct ApiClient {
    http: reqwest::Client,
    base: String,
    timeout: Duration,
    /// Sent as `Authorization: Bearer …` on every request when set: an ACL token to a
    /// manager, the worker-command token to a worker.
    bearer: Option<String>,
    /// Added as `?project=NAME` to every request when set: the project a command works in
    /// (`cube --project`, `CUBE_PROJECT`).
    project: Option<String>,
    /// Sent as `X-Cube-Node` on every request when set: the node a manager's client of a
    /// worker means to reach, which another node refuses.
    node: Option<String>,
    /// The TLS settings, for a [`crate::long_poll::LongPoll`]'s own connection.
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

impl ApiClient {
    /// A client for `address` (`HOST:PORT` or `http://HOST:PORT`) whose requests give up
    /// after `timeout` unless a request sets its own.
    pub fn new(address: &str, timeout: Duration) -> Result<ApiClient, ClientError> {
        ApiClient::with_tls(address, timeout, None)
    }

    /// A client for `address` over HTTPS with the TLS settings `tls` (`https://HOST:PORT`,
    /// or `HOST:PORT` and `http://HOST:PORT` taken as HTTPS), or as [`ApiClient::new`] when
    /// `tls` is `None`.
    pub fn with_tls(
        address: &str,
        timeout: Duration,
        tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    ) -> Result<ApiClient, ClientError> {
        ApiClient::pooled(address, timeout, tls, None)
    }

    /// [`ApiClient::with_tls`] for one of many servers each spoken to by a few callers (a
    /// manager's clients of its workers). An idle connection kept costs ~25–35 KB (hyper's
    /// dispatch channel, the connection's task and buffers: heaptrack, BENCHMARKS.md), and a
    /// manager placing tasks all over 2,000 workers kept one to each: 60 MB. So over plain
    /// HTTP none is kept (each send opens its own, a TCP handshake); over HTTPS, where a
    /// handshake costs both ends their CPU, one is kept to each worker for
    /// [`IDLE_TO_ONE_OF_MANY_FOR`]. The follower's blocking queries have a connection of their
    /// own, which holds much less ([`ApiClient::long_poll`]). Not for a process whose many
    /// callers share one server (a simulated worker process's 500 workers and their
    /// manager): each request beyond the first at once would open a connection of its own.
    pub fn of_one_of_many(
        address: &str,
        timeout: Duration,
        tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    ) -> Result<ApiClient, ClientError> {
        let kept = usize::from(tls.is_some());
        ApiClient::pooled(address, timeout, tls, Some(kept))
    }

    fn pooled(
        address: &str,
        timeout: Duration,
        tls: Option<std::sync::Arc<rustls::ClientConfig>>,
        idle_per_server: Option<usize>,
    ) -> Result<ApiClient, ClientError> {
        // Installs the crypto reqwest's own TLS settings need too.
        let _ = crate::tls::provider();
        let base = normalize_address(address, tls.is_some())?;
        let http = shared_http(
            timeout.min(Duration::from_secs(5)),
            idle_per_server,
            tls.as_ref(),
        )
        .map_err(|err| ClientError::Unreachable {
            url: base.clone(),
            reason: err.to_string(),
            kind: Unreached::Connect,
        })?;
        Ok(ApiClient {
            http,
            base,
            timeout,
            bearer: None,
            project: None,
            node: None,
            tls,
        })
    }

    /// The same client, sending `token` as `Authorization: Bearer` on every request (none when
    /// `None`).
    pub fn with_token(mut self, token: Option<&str>) -> ApiClient {
        self.bearer = token.map(str::to_string);
        self
    }

    /// Every request of this client says it is meant for node `node` ([`NODE_HEADER`]): a
    /// worker that is another node refuses it.
    pub fn with_node(mut self, node: Option<&str>) -> ApiClient {
        self.node = node.map(str::to_string);
        self
    }

    /// Every request of this client in `project` (`?project=NAME`, `*` for every project).
    pub fn with_project(mut self, project: Option<&str>) -> ApiClient {
        self.project = project.map(str::to_string);
        self
    }

    /// The URL of `path`, with `?project=` when the client has a project and the path names
    /// none.
    pub(crate) fn url(&self, path: &str) -> String {
        match &self.project {
            Some(project) if !path.contains("project=") => {
                let separator = if path.contains('?') { '&' } else { '?' };
                format!("{}{path}{separator}project={project}", self.base)
            }
            _ => format!("{}{path}", self.base),
        }
    }

    /// A request to `url`, with the token and the node meant when there are.
    fn request(&self, method: Method, url: &str) -> reqwest::RequestBuilder {
        let mut request = self.http.request(method, url);
        if let Some(token) = &self.bearer {
            request = request.bearer_auth(token);
        }
        if let Some(node) = &self.node {
            request = request.header(NODE_HEADER, node);
        }
        request
    }

    /// `http://HOST:PORT`, without a trailing slash.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// How long a request waits for its answer, unless it sets its own.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The token sent as `Authorization: Bearer`, if any.
    pub(crate) fn bearer(&self) -> Option<&str> {
        self.bearer.as_deref()
    }

    /// The node every request says it is meant for, if any.
    pub(crate) fn node(&self) -> Option<&str> {
        self.node.as_deref()
    }

    /// The TLS settings, if the server is spoken to over HTTPS.
    pub(crate) fn tls(&self) -> Option<&std::sync::Arc<rustls::ClientConfig>> {
        self.tls.as_ref()
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        Ok(self
            .send::<(), T>(Method::GET, path, None, None)
            .await?
            .body)
    }

    /// A blocking query: `GET path?index=N&wait=…`; answers with the body and the index the
    /// server reported in [`INDEX_HEADER`]. The request's timeout is `wait` plus a margin.
    pub async fn get_blocking<T: DeserializeOwned>(
        &self,
        path: &str,
        index: u64,
        wait: Duration,
    ) -> Result<(T, Option<u64>), ClientError> {
        let separator = if path.contains('?') { '&' } else { '?' };
        let path = format!("{path}{separator}index={index}&wait={}ms", wait.as_millis());
        let answer = self
            .send::<(), T>(Method::GET, &path, None, Some(wait + self.timeout))
            .await?;
        Ok((answer.body, answer.index))
    }

    /// A blocking query for changes: `GET path?index=N&wait=…&changes=true`. The answer holds
    /// what changed after N ([`Changes::complete`] false) or, when the server cannot tell
    /// (N is 0, or from before it started), everything (`complete` true).
    pub async fn get_changes<T: DeserializeOwned>(
        &self,
        path: &str,
        index: u64,
        wait: Duration,
    ) -> Result<Changes<T>, ClientError> {
        let path = changes_path(path, index, wait);
        let answer = self
            .send::<(), T>(Method::GET, &path, None, Some(wait + self.timeout))
            .await?;
        Ok(Changes {
            body: answer.body,
            index: answer.index,
            complete: answer.since.is_none(),
        })
    }

    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<(StatusCode, T), ClientError> {
        let answer = self.send(Method::POST, path, Some(body), None).await?;
        Ok((answer.status, answer.body))
    }

    pub async fn put<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        Ok(self.send(Method::PUT, path, Some(body), None).await?.body)
    }

    /// A heartbeat's `PUT`: the answer, and the interval the server asks the next
    /// heartbeats to keep at least ([`HEARTBEAT_INTERVAL_HEADER`]), if it says one.
    pub async fn put_heartbeat<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<(T, Option<Duration>, Option<String>), ClientError> {
        let answer = self.send(Method::PUT, path, Some(body), None).await?;
        Ok((
            answer.body,
            answer.heartbeat_ms.map(Duration::from_millis),
            answer.worker_token,
        ))
    }

    /// A `DELETE`; any 2xx answer is success.
    pub async fn delete(&self, path: &str) -> Result<(), ClientError> {
        self.send::<(), serde::de::IgnoredAny>(Method::DELETE, path, None, None)
            .await
            .map(|_| ())
    }

    async fn send<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        timeout: Option<Duration>,
    ) -> Result<Answer<T>, ClientError> {
        let url = self.url(path);
        let timeout = timeout.unwrap_or(self.timeout);
        let mut request = self.request(method, &url).timeout(timeout);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request
            .send()
            .await
            .map_err(|err| ClientError::Unreachable {
                url: url.clone(),
                reason: with_https_hint(&url, error_chain(&err)),
                kind: Unreached::of(&err, timeout),
            })?;
        let status = response.status();
        let number = |header: &str| {
            response
                .headers()
                .get(header)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.parse::<u64>().ok())
        };
        let (index, since) = (number(INDEX_HEADER), number(SINCE_HEADER));
        let heartbeat_ms = number(HEARTBEAT_INTERVAL_HEADER);
        let worker_token = response
            .headers()
            .get(WORKER_TOKEN_HEADER)
            .and_then(|value| value.to_str().ok())
            .map(str::to_string);
        if !status.is_success() {
            return Err(error_answer(url, response).await);
        }
        let bytes = response
            .bytes()
            .await
            .map_err(|err| ClientError::Unreachable {
                url: url.clone(),
                reason: error_chain(&err),
                kind: match Unreached::of(&err, timeout) {
                    // The request was sent: the server has it.
                    Unreached::Connect => Unreached::Broken,
                    other => other,
                },
            })?;
        // A 204 has no body; `IgnoredAny` and `()` read `null` happily.
        let bytes: &[u8] = if bytes.is_empty() { b"null" } else { &bytes };
        let body = serde_json::from_slice(bytes).map_err(|err| ClientError::Decode {
            url: url.clone(),
            reason: err.to_string(),
        })?;
        Ok(Answer {
            status,
            body,
            index,
            since,
            heartbeat_ms,
            worker_token,
        })
    }
}

impl ApiClient {
    /// A `GET` whose answer is read line by line as it comes (`GET /events` on a manager),
    /// with the index the server reported in [`INDEX_HEADER`] as it came (a number, or for
    /// every project on managers acting for their own shards a gathered cursor). `accept`
    /// is the `Accept` header, if one is wanted. The request has no overall timeout (the answer may last
    /// for hours): the caller bounds the wait for each line; a manager writes one at least
    /// every 15 s.
    pub async fn get_lines(
        &self,
        path: &str,
        accept: Option<&str>,
    ) -> Result<(LineStream, Option<String>), ClientError> {
        let url = self.url(path);
        let mut request = self.request(Method::GET, &url);
        if let Some(accept) = accept {
            request = request.header(reqwest::header::ACCEPT, accept);
        }
        let response = request
            .send()
            .await
            .map_err(|err| ClientError::Unreachable {
                url: url.clone(),
                reason: error_chain(&err),
                kind: Unreached::of(&err, self.timeout),
            })?;
        if !response.status().is_success() {
            return Err(error_answer(url, response).await);
        }
        let index = response
            .headers()
            .get(INDEX_HEADER)
            .and_then(|value| value.to_str().ok())
            .map(str::to_string);
        Ok((
            LineStream {
                response,
                url,
                buffer: Vec::new(),
                start: 0,
            },
            index,
        ))
    }
}

impl ApiClient {
    /// A request whose answer is streamed (`GET /tasks/{id}/logs`, `POST /tasks/{id}/exec`):
    /// the response once its status is a success, to be read as it comes. Only connecting
    /// and the status line are bounded by the client's timeout; the body may last as long as
    /// the server writes it.
    pub async fn open_stream<B: Serialize>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<reqwest::Response, ClientError> {
        let url = self.url(path);
        let mut request = self.request(method, &url);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = tokio::time::timeout(self.timeout, request.send())
            .await
            .map_err(|_| ClientError::Unreachable {
                url: url.clone(),
                reason: format!("no answer within {:?}", self.timeout),
                kind: Unreached::TimedOut(self.timeout),
            })?
            .map_err(|err| ClientError::Unreachable {
                url: url.clone(),
                reason: error_chain(&err),
                kind: Unreached::of(&err, self.timeout),
            })?;
        if !response.status().is_success() {
            return Err(error_answer(url, response).await);
        }
        Ok(response)
    }
}

impl ApiClient {
    /// A request to switch the connection to `protocol` (`Upgrade`): the `101` answer, whose
    /// [`Response::upgrade`] is the connection, or the server's error.
    pub async fn open_upgrade(
        &self,
        path: &str,
        protocol: &str,
    ) -> Result<reqwest::Response, ClientError> {
        let url = self.url(path);
        let request = self
            .request(Method::GET, &url)
            .header(reqwest::header::CONNECTION, "Upgrade")
            .header(reqwest::header::UPGRADE, protocol);
        let response = tokio::time::timeout(self.timeout, request.send())
            .await
            .map_err(|_| ClientError::Unreachable {
                url: url.clone(),
                reason: format!("no answer within {:?}", self.timeout),
                kind: Unreached::TimedOut(self.timeout),
            })?
            .map_err(|err| ClientError::Unreachable {
                url: url.clone(),
                reason: error_chain(&err),
                kind: Unreached::of(&err, self.timeout),
            })?;
        if response.status() != StatusCode::SWITCHING_PROTOCOLS {
            if response.status().is_success() {
                return Err(ClientError::Decode {
                    url,
                    reason: format!(
                        "answered {} instead of switching protocols",
                        response.status()
                    ),
                });
            }
            return Err(error_answer(url, response).await);
        }
        Ok(response)
    }
}

/// The longest line a [`LineStream`] holds: an event is a few KiB; anything far longer is
/// not a Cube server's answer.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// An answer read one line at a time ([`ApiClient::get_lines`]).
#[derive(Debug)]
pub struct LineStream {
    response: reqwest::Response,
    url: String,
    /// What was read and not yet handed out, from `start` on.
    buffer: Vec<u8>,
    start: usize,
}

impl LineStream {
    /// An answer of [`ApiClient::open_stream`], read one line at a time.
    pub fn of(response: reqwest::Response) -> LineStream {
        let url = response.url().to_string();
        LineStream {
            response,
            url,
            buffer: Vec::new(),
            start: 0,
        }
    }
    /// The next line, without its newline (an empty line is a heartbeat), or `None` once the
    /// server ended the answer.
    pub async fn next_line(&mut self) -> Result<Option<String>, ClientError> {
        loop {
            if let Some(end) = self.buffer[self.start..].iter().position(|b| *b == b'\n') {
                let line = &self.buffer[self.start..self.start + end];
                let line = String::from_utf8_lossy(line).into_owned();
                self.start += end + 1;
                return Ok(Some(line));
            }
            // What was handed out is let go before more is read.
            self.buffer.drain(..self.start);
            self.start = 0;
            if self.buffer.len() > MAX_LINE_BYTES {
                return Err(ClientError::Decode {
                    url: self.url.clone(),
                    reason: format!("a line longer than {MAX_LINE_BYTES} bytes"),
                });
            }
            match self.response.chunk().await {
                Ok(Some(chunk)) => self.buffer.extend_from_slice(&chunk),
                Ok(None) if self.buffer.is_empty() => return Ok(None),
                // A last line without its newline.
                Ok(None) => {
                    let line = String::from_utf8_lossy(&self.buffer).into_owned();
                    self.buffer.clear();
                    return Ok(Some(line));
                }
                Err(err) => {
                    return Err(ClientError::Unreachable {
                        url: self.url.clone(),
                        reason: error_chain(&err),
                        kind: Unreached::Broken,
                    });
                }
            }
        }
    }
}

/// An error answer as a [`ClientError`]: its JSON error's message, and for a 410 the oldest
/// index the server can answer from ([`OLDEST_INDEX_HEADER`]).
async fn error_answer(url: String, response: reqwest::Response) -> ClientError {
    let status = response.status();
    let oldest_index = response
        .headers()
        .get(OLDEST_INDEX_HEADER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    let bytes = match response.bytes().await {
        Ok(bytes) => bytes,
        Err(err) => {
            return ClientError::Unreachable {
                url,
                reason: error_chain(&err),
                kind: Unreached::Broken,
            };
        }
    };
    error_of(url, status, oldest_index, &bytes)
}

/// The error a server's answer of `status` with `body` means: its JSON error's message (or
/// the body's text), as 410 Gone with the oldest index it can answer from, or any other.
pub(crate) fn error_of(
    url: String,
    status: StatusCode,
    oldest_index: Option<u64>,
    body: &[u8],
) -> ClientError {
    let message = serde_json::from_slice::<ErrorBody>(body)
        .map(|body| body.message)
        .unwrap_or_else(|_| String::from_utf8_lossy(body).trim().to_string());
    match oldest_index {
        Some(oldest_index) if status == StatusCode::GONE => ClientError::Gone {
            url,
            message,
            oldest_index,
        },
        _ => ClientError::Status {
            url,
            status,
            message,
        },
    }
}

/// `path` as a blocking query for what changed after `index`, waiting up to `wait`.
pub(crate) fn changes_path(path: &str, index: u64, wait: Duration) -> String {
    let separator = if path.contains('?') { '&' } else { '?' };
    format!(
        "{path}{separator}index={index}&wait={}ms&changes=true",
        wait.as_millis()
    )
}

/// What a server answered, with the indexes of a blocking query.
struct Answer<T> {
    status: StatusCode,
    body: T,
    index: Option<u64>,
    since: Option<u64>,
    /// [`HEARTBEAT_INTERVAL_HEADER`], in milliseconds.
    heartbeat_ms: Option<u64>,
    /// [`WORKER_TOKEN_HEADER`]: on the answer to a node's heartbeat, with ACL on.
    worker_token: Option<String>,
}

/// The answer to [`ApiClient::get_changes`].
#[derive(Debug)]
pub struct Changes<T> {
    pub body: T,
    /// The index to ask with next time, if the server reported one.
    pub index: Option<u64>,
    /// Whether `body` holds everything, not only what changed.
    pub complete: bool,
}

/// `HOST:PORT`, `http://HOST:PORT` or `https://HOST:PORT` as `http://HOST:PORT`, or with
/// `tls` as `https://HOST:PORT`. An `https://` address without TLS settings is refused: Cube
/// verifies a server only against its cluster's CA, whose fingerprint must be given.
fn normalize_address(address: &str, tls: bool) -> Result<String, ClientError> {
    let trimmed = address.trim().trim_end_matches('/');
    if trimmed.starts_with("https://") && !tls {
        return Err(ClientError::HttpsWithoutCa(trimmed.to_string()));
    }
    let rest = trimmed.strip_prefix("https://").unwrap_or(trimmed);
    let rest = rest.strip_prefix("http://").unwrap_or(rest);
    let valid = match rest.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0),
        None => false,
    };
    if !valid || rest.contains('/') {
        return Err(ClientError::Address(address.to_string()));
    }
    let scheme = if tls { "https" } else { "http" };
    Ok(format!("{scheme}://{rest}"))
}

/// `reason`, with a hint when a plain-HTTP request got a TLS server's answer.
fn with_https_hint(url: &str, reason: String) -> String {
    if url.starts_with("http://") && reason.contains("invalid HTTP version") {
        format!(
            "{reason}: the server speaks HTTPS (a manager started with --tls); use \
             https://HOST:PORT with the cluster CA's fingerprint (--ca-fingerprint)"
        )
    } else {
        reason
    }
}

/// An error and its causes, one after the other, `outer: inner: innermost` ("connection
/// refused" is in a source).
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many shared clients the current runtime has.
    fn shared_clients_here() -> usize {
        let runtime = tokio::runtime::Handle::current().id();
        HTTP_CLIENTS
            .lock()
            .unwrap()
            .iter()
            .filter(|shared| shared.runtime == Some(runtime))
            .count()
    }

    fn some_tls() -> Arc<rustls::ClientConfig> {
        Arc::new(
            rustls::ClientConfig::builder_with_provider(crate::tls::provider())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
        )
    }

    #[tokio::test]
    async fn clients_of_many_servers_share_one_http_client_per_settings() {
        let clients: Vec<ApiClient> = (0..500)
            .map(|n| {
                ApiClient::new(
                    &format!("127.0.0.{}:{}", n % 200 + 1, 7000 + n),
                    Duration::from_secs(5),
                )
                .unwrap()
            })
            .collect();
        assert_eq!(clients.len(), 500);
        assert_eq!(
            shared_clients_here(),
            1,
            "500 plain clients, one reqwest client"
        );
        // Another connect timeout, or TLS settings, are other clients; the same settings
        // again are not.
        let _short = ApiClient::new("127.0.0.1:7000", Duration::from_secs(1)).unwrap();
        let tls = some_tls();
        let _secure =
            ApiClient::with_tls("127.0.0.1:7000", Duration::from_secs(5), Some(tls.clone()))
                .unwrap();
        let _again =
            ApiClient::with_tls("127.0.0.2:7000", Duration::from_secs(5), Some(tls.clone()))
                .unwrap();
        assert_eq!(shared_clients_here(), 3);
        // Renewed settings: the next client built lets the ones of the replaced settings go.
        drop((_secure, _again, tls));
        let _renewed =
            ApiClient::with_tls("127.0.0.1:7000", Duration::from_secs(5), Some(some_tls()))
                .unwrap();
        assert_eq!(
            shared_clients_here(),
            3,
            "the replaced settings' client went"
        );
    }

    #[tokio::test]
    async fn a_client_of_one_of_many_servers_over_http_keeps_no_idle_connection_to_it() {
        use std::sync::atomic::Ordering;
        for (of_many, kept) in [(true, 0), (false, 2)] {
            let (address, open) =
                cube_test_support::counting_server(Duration::from_millis(200)).await;
            let client = if of_many {
                ApiClient::of_one_of_many(&address, Duration::from_secs(5), None).unwrap()
            } else {
                ApiClient::new(&address, Duration::from_secs(5)).unwrap()
            };
            // Two requests at once: two connections.
            let (first, second) = tokio::join!(
                client.get::<serde_json::Value>("/a"),
                client.get::<serde_json::Value>("/b")
            );
            first.unwrap();
            second.unwrap();
            // Both answered: both closed, or both kept.
            assert_eq!(
                cube_test_support::open_settles_at(&open, kept).await,
                kept,
                "of_one_of_many: {of_many}"
            );
            // The next request opens its own (and closes it), or takes a kept one.
            client.get::<serde_json::Value>("/c").await.unwrap();
            assert_eq!(
                cube_test_support::open_settles_at(&open, kept).await,
                kept,
                "of_one_of_many: {of_many}"
            );
            assert_eq!(
                open.load(Ordering::SeqCst),
                kept,
                "of_one_of_many: {of_many}"
            );
        }
    }

    #[test]
    fn addresses_are_read_with_or_without_scheme() {
        assert_eq!(
            normalize_address("127.0.0.1:5555", false).unwrap(),
            "http://127.0.0.1:5555"
        );
        assert_eq!(
            normalize_address("http://localhost:5555/", false).unwrap(),
            "http://localhost:5555"
        );
        for bad in [
            "localhost",
            "https://x:1",
            ":5555",
            "host:0",
            "host:port",
            "h:1/x",
        ] {
            assert!(normalize_address(bad, false).is_err(), "{bad} accepted");
        }
    }
}
