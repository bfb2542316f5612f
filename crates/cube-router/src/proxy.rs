//! The HTTP side of the router: a listener that serves HTTP/1.1 and HTTP/2 (h2c, prior
//! knowledge) and sends each request, by its host, to the route's copy with the fewest
//! requests outstanding; and the admin listener (`/metrics`, `/health`, `/routes`).
//!
//! A request goes to its copy over HTTP/1.1 through one pooled client, so that the
//! connections to a copy are reused across requests and clients. Bodies are streamed both
//! ways; the copy's [`Pick`] rides with the answer's body, so a request counts as
//! outstanding until its answer has been sent whole. A request that can be sent again
//! without harm (idempotent, no body) and whose copy failed before answering — refused,
//! or closed as Docker's port proxy does when the container behind it is gone — goes once
//! to another copy.
//!
//! What the router answers itself (no host, unknown host, no copy, a copy that failed) is
//! a JSON [`ErrorBody`] that names what was wrong.
//!
//! This module does not change the table: it reads whatever [`RouteTable`] is in the
//! [`ArcSwap`] at each request.

use std::convert::Infallible;
use std::error::Error as StdError;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use bytes::Bytes;
use cube_types::ErrorBody;
use http_body_util::{Either, Empty};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::http::uri::{Authority, PathAndQuery, Scheme};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode, Uri, Version};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::metrics::{ErrorKind, NO_ROUTE, RouteMetrics, RouterMetrics};
use crate::table::{Pick, Route, RouteTable};

/// How long the router waits for a copy to accept a connection before it counts the copy
/// as failed (and, for a request that may be sent again, asks another).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long an idle connection to a copy is kept for the next request.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Idle connections kept per copy: enough for the bursts of a busy route, so that they do
/// not each open a new connection.
pub const POOL_MAX_IDLE_PER_HOST: usize = 256;

/// How long open connections may go on after shutdown before they are closed.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How long a client may take to send a request's head: bounds the connections a slow or
/// silent client holds open.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// After a failed accept (out of file descriptors, most often), how long the listener
/// waits before it accepts again, so that it does not spin while the condition lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// The next connection on `listener`, or `None` once `shutdown` is cancelled. A failed
/// accept is logged and tried again after [`ACCEPT_BACKOFF`].
pub(crate) async fn accept(
    listener: &TcpListener,
    shutdown: &CancellationToken,
    what: &str,
) -> Option<(tokio::net::TcpStream, SocketAddr)> {
    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return None,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => return Some(accepted),
                Err(error) => {
                    tracing::warn!(listener = what, %error, "accepting a connection failed");
                    tokio::select! {
                        () = shutdown.cancelled() => return None,
                        () = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                    }
                }
            },
        }
    }
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// The headers that belong to one connection, not to the request or answer, and so are
/// not passed on (RFC 9110 7.6.1), with the non-standard `Proxy-Connection` some clients
/// still send.
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// The body of a request as sent to a copy: the client's, streamed, or nothing for a
/// request that has none (and may then be sent a second time).
type UpstreamBody = Either<Incoming, Empty<Bytes>>;

/// The router: the table it reads, its metrics, and the client its requests go through.
pub struct Router {
    /// The routes, swapped whole by whoever follows the manager; read at each request.
    table: Arc<ArcSwap<RouteTable>>,
    metrics: Arc<RouterMetrics>,
    /// One client for every request, so that connections to a copy are pooled and kept
    /// alive across requests.
    client: Client<HttpConnector, UpstreamBody>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("routes", &self.table.load().len())
            .finish_non_exhaustive()
    }
}

impl Router {
    pub fn new(table: Arc<ArcSwap<RouteTable>>) -> Arc<Router> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
            .pool_timer(TokioTimer::new())
            .build(connector);
        Arc::new(Router {
            table,
            metrics: Arc::new(RouterMetrics::default()),
            client,
        })
    }

    pub fn metrics(&self) -> &Arc<RouterMetrics> {
        &self.metrics
    }

    /// The table the router reads: store a new one to change the routes.
    pub fn table(&self) -> &Arc<ArcSwap<RouteTable>> {
        &self.table
    }

    /// Serves HTTP/1.1 and HTTP/2 (h2c, prior knowledge) on `listener` until `shutdown` is
    /// cancelled, then lets open connections finish their requests, for at most
    /// [`SHUTDOWN_GRACE`].
    pub async fn serve_http(
        self: Arc<Self>,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> std::io::Result<()> {
        serve(listener, shutdown, "http", move |peer| {
            let router = Arc::clone(&self);
            service_fn(move |request| {
                let router = Arc::clone(&router);
                async move { Ok::<_, Infallible>(router.proxy(request, peer).await) }
            })
        })
        .await
    }

    /// The admin listener: `GET /metrics` (the router's metrics, Prometheus text),
    /// `GET /health` (`{"Status":"ok"}`), `GET /routes` (the table as the router holds
    /// it, a [`TableView`]). Until `shutdown`, like [`Router::serve_http`].
    pub async fn serve_admin(
        self: Arc<Self>,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> std::io::Result<()> {
        serve(listener, shutdown, "admin", move |_peer| {
            let router = Arc::clone(&self);
            service_fn(move |request| {
                let router = Arc::clone(&router);
                async move { Ok::<_, Infallible>(router.admin(&request)) }
            })
        })
        .await
    }

    /// One request from `peer`, answered by a copy of its route or by the router.
    async fn proxy(&self, request: Request<Incoming>, peer: SocketAddr) -> Response<ProxyBody> {
        let started = Instant::now();
        let host = match request_host(&request) {
            Ok(host) => host,
            Err(why) => {
                let metrics = self.metrics.route(NO_ROUTE);
                metrics.error(ErrorKind::BadRequest);
                return answered(&metrics, started, error(StatusCode::BAD_REQUEST, why));
            }
        };
        // The host is visible ASCII: `request_host` checked it.
        let host_name = host.to_str().unwrap_or_default();
        // The guard is dropped at once: it must not be held across an await.
        let route = self.table.load().by_host(host_name).cloned();
        let Some(route) = route else {
            let metrics = self.metrics.route(NO_ROUTE);
            metrics.error(ErrorKind::NoRoute);
            return answered(
                &metrics,
                started,
                error(
                    StatusCode::NOT_FOUND,
                    format!("no route for host {host_name:?}"),
                ),
            );
        };
        let metrics = self.metrics.route(&route.name);
        if request.method() == Method::CONNECT {
            return answered(
                &metrics,
                started,
                error(
                    StatusCode::METHOD_NOT_ALLOWED,
                    format!(
                        "route {} (host {}) is served over HTTP; the router does not tunnel \
                         CONNECT",
                        route.name, route.host
                    ),
                ),
            );
        }
        let Some(first) = route.pick(None) else {
            metrics.error(ErrorKind::NoCopy);
            return answered(
                &metrics,
                started,
                error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "no copy of route {} (host {}) is running and healthy",
                        route.name, route.host
                    ),
                ),
            );
        };
        let response = self
            .forward(request, &host, peer, &route, &metrics, first)
            .await;
        answered(&metrics, started, response)
    }

    /// Sends `request` to the copy `first`, and once more to another copy (the same one
    /// when it is the route's only copy) when it failed before answering and may be sent
    /// again.
    async fn forward(
        &self,
        request: Request<Incoming>,
        host: &HeaderValue,
        peer: SocketAddr,
        route: &Route,
        metrics: &RouteMetrics,
        first: Pick,
    ) -> Response<ProxyBody> {
        let replayable = is_replayable(&request);
        let (parts, body) = request.into_parts();
        let method = parts.method;
        let path = parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        let mut headers = parts.headers;
        prepare_request_headers(&mut headers, host, peer);
        let body = if replayable {
            // Nothing to send: the client's empty body is dropped so that the request can
            // be built again for a second copy.
            Either::Right(Empty::new())
        } else {
            Either::Left(body)
        };
        // Kept only when a second attempt may need them: most requests are replayable, but
        // a clone of a few headers is cheaper than a connection the client sees fail.
        let again = replayable.then(|| (method.clone(), path.clone(), headers.clone()));

        let failure = match self.send(&first, method, path, headers, body, route).await {
            Ok(response) => return forwarded(response, first),
            Err(failure) => failure,
        };
        let retry = match again {
            Some(again) if failure.before_answer => again,
            _ => {
                metrics.error(ErrorKind::Upstream);
                return failure.answer(route, None);
            }
        };
        metrics.error(ErrorKind::Retried);
        let Some(second) = route.pick(Some(first.target())) else {
            metrics.error(ErrorKind::Upstream);
            return failure.answer(route, None);
        };
        drop(first);
        let (method, path, headers) = retry;
        match self
            .send(
                &second,
                method,
                path,
                headers,
                Either::Right(Empty::new()),
                route,
            )
            .await
        {
            Ok(response) => forwarded(response, second),
            Err(second_failure) => {
                metrics.error(ErrorKind::Upstream);
                second_failure.answer(route, Some(&failure))
            }
        }
    }

    /// One attempt at a copy.
    async fn send(
        &self,
        copy: &Pick,
        method: Method,
        path: PathAndQuery,
        headers: HeaderMap,
        body: UpstreamBody,
        route: &Route,
    ) -> Result<Response<Incoming>, Failure> {
        let address = copy.address.clone();
        let authority = match Authority::try_from(copy.address.as_str()) {
            Ok(authority) => authority,
            Err(why) => {
                return Err(Failure {
                    address,
                    message: format!("{:?} is not a HOST:PORT address: {why}", copy.address),
                    before_answer: false,
                });
            }
        };
        let mut uri = hyper::http::uri::Parts::default();
        uri.scheme = Some(Scheme::HTTP);
        uri.authority = Some(authority);
        uri.path_and_query = Some(path);
        let uri = match Uri::from_parts(uri) {
            Ok(uri) => uri,
            Err(why) => {
                return Err(Failure {
                    address,
                    message: format!("no URI for the request: {why}"),
                    before_answer: false,
                });
            }
        };
        let mut request = Request::new(body);
        *request.method_mut() = method;
        *request.uri_mut() = uri;
        *request.version_mut() = Version::HTTP_11;
        *request.headers_mut() = headers;
        self.client.request(request).await.map_err(|error| {
            let failure = Failure {
                address,
                message: error_chain(&error),
                before_answer: failed_before_answering(&error),
            };
            tracing::debug!(
                route = %route.name,
                copy = %failure.address,
                error = %failure.message,
                "a copy failed"
            );
            failure
        })
    }

    /// The admin listener's answer to `request`.
    fn admin(&self, request: &Request<Incoming>) -> Response<ProxyBody> {
        if request.method() != Method::GET && request.method() != Method::HEAD {
            return error(
                StatusCode::METHOD_NOT_ALLOWED,
                format!(
                    "the router's admin listener answers GET only, not {}",
                    request.method()
                ),
            );
        }
        match request.uri().path() {
            "/metrics" => {
                let text = self.metrics.encode_with(&self.table.load());
                let mut response = Response::new(ProxyBody::whole(Bytes::from(text)));
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(cube_api::metrics::CONTENT_TYPE),
                );
                response
            }
            "/health" => json(
                StatusCode::OK,
                &Health {
                    status: "ok".into(),
                },
            ),
            "/routes" => json(StatusCode::OK, &TableView::of(&self.table.load())),
            path => error(
                StatusCode::NOT_FOUND,
                format!(
                    "the router's admin listener has no {path:?}: it answers GET /metrics, \
                     /health and /routes"
                ),
            ),
        }
    }
}

/// `GET /health` on the admin listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    #[serde(rename = "Status")]
    pub status: String,
}

/// `GET /routes` on the admin listener: the routes as the router holds them, by host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableView {
    #[serde(rename = "Routes")]
    pub routes: Vec<RouteStatus>,
    /// Routes left out because an earlier one has their host.
    #[serde(rename = "Conflicts")]
    pub conflicts: Vec<String>,
}

/// One route of [`TableView`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteStatus {
    #[serde(rename = "Host")]
    pub host: String,
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Project")]
    pub project: String,
    /// The container port, `"7777/tcp"`.
    #[serde(rename = "Port")]
    pub port: String,
    #[serde(rename = "Copies")]
    pub copies: Vec<CopyStatus>,
}

/// One copy of a [`RouteStatus`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyStatus {
    #[serde(rename = "Address")]
    pub address: String,
    #[serde(rename = "ID")]
    pub id: Uuid,
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Node")]
    pub node: String,
    /// Requests (or TCP connections) sent to it and not finished yet.
    #[serde(rename = "Outstanding")]
    pub outstanding: usize,
}

impl TableView {
    pub fn of(table: &RouteTable) -> TableView {
        let mut routes: Vec<RouteStatus> = table
            .routes()
            .map(|route| RouteStatus {
                host: route.host.clone(),
                name: route.name.clone(),
                project: route.project.clone(),
                port: route.port.clone(),
                copies: route
                    .targets
                    .iter()
                    .map(|target| CopyStatus {
                        address: target.address.clone(),
                        id: target.id,
                        name: target.name.clone(),
                        node: target.node.clone(),
                        outstanding: target.outstanding(),
                    })
                    .collect(),
            })
            .collect();
        routes.sort_by(|a, b| a.host.cmp(&b.host));
        TableView {
            routes,
            conflicts: table.conflicts.clone(),
        }
    }
}

/// A copy that did not answer.
#[derive(Debug)]
struct Failure {
    address: String,
    message: String,
    /// It failed before any of its answer came back, so the request had no effect or may
    /// be sent again if it is replayable.
    before_answer: bool,
}

impl Failure {
    /// The 502 the client gets, naming `earlier` too when this was the second attempt.
    fn answer(&self, route: &Route, earlier: Option<&Failure>) -> Response<ProxyBody> {
        let mut message = format!(
            "copy {} of route {} (host {}) failed: {}",
            self.address, route.name, route.host, self.message
        );
        if let Some(earlier) = earlier {
            message.push_str(&format!(
                " (asked after copy {} failed: {})",
                earlier.address, earlier.message
            ));
        }
        error(StatusCode::BAD_GATEWAY, message)
    }
}

/// The body of an answer: a copy's, streamed, holding the copy's [`Pick`] until it has
/// been sent whole; or one the router wrote.
#[derive(Debug)]
pub struct ProxyBody {
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    Upstream {
        body: Incoming,
        /// Released as soon as the body has ended (or failed), not only when hyper drops
        /// it, so that the copy's count is right by the time the client has read the end.
        pick: Option<Pick>,
    },
    Whole(Option<Bytes>),
}

impl ProxyBody {
    fn upstream(body: Incoming, pick: Pick) -> ProxyBody {
        let pick = (!body.is_end_stream()).then_some(pick);
        ProxyBody {
            inner: Inner::Upstream { body, pick },
        }
    }

    fn whole(bytes: Bytes) -> ProxyBody {
        ProxyBody {
            inner: Inner::Whole(Some(bytes)),
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match &mut self.get_mut().inner {
            Inner::Upstream { body, pick } => {
                let frame = Pin::new(&mut *body).poll_frame(cx);
                let ended = match &frame {
                    Poll::Ready(None | Some(Err(_))) => true,
                    Poll::Ready(Some(Ok(_))) => body.is_end_stream(),
                    Poll::Pending => false,
                };
                if ended {
                    pick.take();
                }
                frame
            }
            Inner::Whole(bytes) => Poll::Ready(bytes.take().map(|bytes| Ok(Frame::data(bytes)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Upstream { body, .. } => body.is_end_stream(),
            Inner::Whole(bytes) => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Upstream { body, .. } => body.size_hint(),
            Inner::Whole(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |bytes| bytes.len() as u64))
            }
        }
    }
}

/// Counts `response` for the route of `metrics`, started at `started`.
fn answered(
    metrics: &RouteMetrics,
    started: Instant,
    response: Response<ProxyBody>,
) -> Response<ProxyBody> {
    metrics.response(response.status().as_u16(), started.elapsed().as_secs_f64());
    response
}

/// A copy's answer as passed on to the client.
fn forwarded(response: Response<Incoming>, pick: Pick) -> Response<ProxyBody> {
    let (mut parts, body) = response.into_parts();
    remove_hop_by_hop(&mut parts.headers);
    // Whatever the copy spoke, the client's connection decides the version it is sent in.
    parts.version = Version::HTTP_11;
    Response::from_parts(parts, ProxyBody::upstream(body, pick))
}

/// A JSON [`ErrorBody`] with `status`.
fn error(status: StatusCode, message: String) -> Response<ProxyBody> {
    json(
        status,
        &ErrorBody {
            http_status_code: status.as_u16(),
            message,
        },
    )
}

fn json(status: StatusCode, value: &impl Serialize) -> Response<ProxyBody> {
    let body = match serde_json::to_vec(value) {
        Ok(body) => body,
        // Plain structs of strings and numbers always serialize; should one not, the
        // client still learns what went wrong.
        Err(why) => format!("{{\"Message\":{:?}}}", why.to_string()).into_bytes(),
    };
    let mut response = Response::new(ProxyBody::whole(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// The host a request is for: the URI's authority (HTTP/2's `:authority`, or an HTTP/1
/// request in absolute form), else its `Host` header; or why there is none.
fn request_host(request: &Request<Incoming>) -> Result<HeaderValue, String> {
    let host = match request.uri().authority() {
        Some(authority) => HeaderValue::from_str(authority.as_str())
            .map_err(|why| format!("the request's authority is not a host: {why}"))?,
        None => match request.headers().get(header::HOST) {
            Some(host) => host.clone(),
            None => {
                return Err("the request names no host: send a Host header (or, over \
                            HTTP/2, an :authority) with the route's host"
                    .to_string());
            }
        },
    };
    match host.to_str() {
        Ok("") => Err("the request's Host header is empty: send the route's host".to_string()),
        Ok(_) => Ok(host),
        Err(_) => Err(format!(
            "the request's Host header {host:?} is not a host name (it has characters other \
             than visible ASCII)"
        )),
    }
}

/// Whether a request may be sent to a second copy after the first failed before
/// answering: its method is idempotent and it has no body.
fn is_replayable(request: &Request<Incoming>) -> bool {
    let idempotent = matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    );
    if !idempotent {
        return false;
    }
    let headers = request.headers();
    if headers.contains_key(header::TRANSFER_ENCODING) {
        return false;
    }
    match headers.get(header::CONTENT_LENGTH) {
        Some(length) => length.as_bytes() == b"0",
        None => request.body().is_end_stream(),
    }
}

/// The client's headers as a copy gets them: without the hop-by-hop ones, with the host
/// the client asked for and where the request came from.
fn prepare_request_headers(headers: &mut HeaderMap, host: &HeaderValue, peer: SocketAddr) {
    if headers.contains_key(header::TRANSFER_ENCODING) {
        // The body's length is its chunks', whatever a Content-Length beside says: one
        // left in would let the copy read the body differently from the router.
        headers.remove(header::CONTENT_LENGTH);
    }
    remove_hop_by_hop(headers);
    headers.insert(header::HOST, host.clone());
    let peer_ip = peer.ip().to_canonical().to_string();
    let mut forwarded_for = String::new();
    for earlier in headers.get_all(&X_FORWARDED_FOR) {
        if let Ok(earlier) = earlier.to_str() {
            forwarded_for.push_str(earlier);
            forwarded_for.push_str(", ");
        }
    }
    forwarded_for.push_str(&peer_ip);
    match HeaderValue::try_from(forwarded_for) {
        Ok(value) => {
            headers.insert(X_FORWARDED_FOR, value);
        }
        Err(_) => {
            // Only visible ASCII went in; should it not be, the peer alone is still right.
            if let Ok(value) = HeaderValue::try_from(peer_ip) {
                headers.insert(X_FORWARDED_FOR, value);
            }
        }
    }
    headers.insert(X_FORWARDED_HOST, host.clone());
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
}

/// Removes the headers of one connection: the [`HOP_BY_HOP`] ones and those `Connection`
/// names.
fn remove_hop_by_hop(headers: &mut HeaderMap) {
    if headers.contains_key(header::CONNECTION) {
        let named: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Whether a copy failed before answering anything: it refused or did not accept the
/// connection in time, or closed or reset it before a response head came back (what
/// Docker's port proxy does when the container behind it is gone).
fn failed_before_answering(error: &hyper_util::client::legacy::Error) -> bool {
    if error.is_connect() {
        return true;
    }
    let mut source = error.source();
    while let Some(cause) = source {
        if let Some(hyper_error) = cause.downcast_ref::<hyper::Error>()
            && (hyper_error.is_incomplete_message()
                || hyper_error.is_closed()
                || hyper_error.is_canceled())
        {
            return true;
        }
        if let Some(io_error) = cause.downcast_ref::<std::io::Error>()
            && matches!(
                io_error.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
            )
        {
            return true;
        }
        source = cause.source();
    }
    false
}

/// `error` and its causes, `: `-separated.
fn error_chain(error: &dyn StdError) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // Some errors print their cause already.
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Accepts connections on `listener` and serves each with the service `service_for` makes
/// for its peer, HTTP/1.1 or HTTP/2, until `shutdown`; then stops accepting and gives open
/// connections [`SHUTDOWN_GRACE`] to finish.
async fn serve<F, S, B>(
    listener: TcpListener,
    shutdown: CancellationToken,
    what: &'static str,
    service_for: F,
) -> std::io::Result<()>
where
    F: Fn(SocketAddr) -> S,
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let builder = Arc::new(builder);
    // Every connection's task, so that shutdown can wait for them.
    let connections = TaskTracker::new();
    loop {
        let Some((stream, peer)) = accept(&listener, &shutdown, what).await else {
            break;
        };
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(listener = what, %peer, %error, "setting TCP_NODELAY failed");
        }
        let service = service_for(peer);
        let builder = Arc::clone(&builder);
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                () = shutdown.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    match tokio::time::timeout(SHUTDOWN_GRACE, connection.as_mut()).await {
                        Ok(result) => result,
                        Err(_) => {
                            tracing::debug!(listener = what, %peer, "closed at the end of the shutdown grace");
                            Ok(())
                        }
                    }
                }
            };
            if let Err(error) = result {
                tracing::debug!(listener = what, %peer, %error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    connections.close();
    connections.wait().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_removed() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, X-Secret"),
        );
        headers.insert("x-secret", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        headers.insert("x-kept", HeaderValue::from_static("yes"));
        remove_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 1, "{headers:?}");
        assert_eq!(headers["x-kept"], "yes");
    }

    #[test]
    fn forwarded_headers_append_the_peer_and_name_the_host() {
        let mut headers = HeaderMap::new();
        headers.append(X_FORWARDED_FOR, HeaderValue::from_static("10.0.0.1"));
        headers.append(X_FORWARDED_FOR, HeaderValue::from_static("10.0.0.2"));
        headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        let host = HeaderValue::from_static("web.shop.example.test");
        let peer: SocketAddr = "[::ffff:192.0.2.7]:5000".parse().unwrap();
        prepare_request_headers(&mut headers, &host, peer);
        assert_eq!(headers[&X_FORWARDED_FOR], "10.0.0.1, 10.0.0.2, 192.0.2.7");
        assert_eq!(headers[header::HOST], "web.shop.example.test");
        assert_eq!(headers[&X_FORWARDED_HOST], "web.shop.example.test");
        assert_eq!(headers[&X_FORWARDED_PROTO], "http");
        assert!(!headers.contains_key(header::TRANSFER_ENCODING));
        assert!(!headers.contains_key(header::CONTENT_LENGTH));
    }
}
