//! The router with real servers on loopback: copies that answer their name, copies that are
//! gone (a closed port, a port that accepts and closes, one that resets), clients over
//! HTTP/1.1 and HTTP/2, the admin listener, and TCP forwarding.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use cube_router::proxy::TableView;
use cube_router::{RouteTable, Router, serve_tcp};
use cube_types::ErrorBody;
use cube_types::route::{Backend, RouteView};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{self, HeaderMap};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const DOMAIN: &str = "example.test";
const WEB: &str = "web.shop.example.test";

/// A bound on how long a step may take before the test fails, not a wait for anything.
const PATIENCE: Duration = Duration::from_secs(20);

type TestBody = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// A copy of a route: an HTTP/1.1 server that answers `GET /` with its name, `/headers`
/// with the request line and headers it got, `/echo` with the body it got, and `/slow`
/// with a first chunk, then the rest when its gate is opened.
struct Copy {
    name: &'static str,
    address: String,
    /// Requests it has answered.
    hits: Arc<AtomicUsize>,
    /// Opened (once per `/slow` request) by the test.
    gate: Arc<Notify>,
}

async fn start_copy(name: &'static str) -> Copy {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let hits = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Notify::new());
    let (served_hits, served_gate) = (Arc::clone(&hits), Arc::clone(&gate));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (hits, gate) = (Arc::clone(&served_hits), Arc::clone(&served_gate));
            tokio::spawn(async move {
                let service = service_fn(move |request| {
                    answer(name, Arc::clone(&hits), Arc::clone(&gate), request)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Copy {
        name,
        address,
        hits,
        gate,
    }
}

async fn answer(
    name: &'static str,
    hits: Arc<AtomicUsize>,
    gate: Arc<Notify>,
    request: Request<Incoming>,
) -> Result<Response<TestBody>, Infallible> {
    hits.fetch_add(1, Ordering::SeqCst);
    let body = match request.uri().path() {
        "/headers" => {
            let mut text = format!("{} {}\n", request.method(), request.uri());
            for (key, value) in request.headers() {
                text.push_str(&format!("{key}: {}\n", value.to_str().unwrap_or("?")));
            }
            full(text)
        }
        "/echo" => request.into_body().map_err(Into::into).boxed(),
        "/slow" => GatedBody {
            first: Some(Bytes::from_static(b"start;")),
            gate: Some(Box::pin(async move { gate.notified().await })),
        }
        .boxed(),
        _ => full(name.to_string()),
    };
    Ok(Response::new(body))
}

fn full(text: impl Into<Bytes>) -> TestBody {
    Full::new(text.into())
        .map_err(|never: Infallible| match never {})
        .boxed()
}

/// A body of one chunk now and one after its gate opens.
struct GatedBody {
    first: Option<Bytes>,
    gate: Option<Pin<Box<dyn Future<Output = ()> + Send + Sync>>>,
}

impl Body for GatedBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        let Some(gate) = self.gate.as_mut() else {
            return Poll::Ready(None);
        };
        match gate.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => {
                self.gate = None;
                Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"end")))))
            }
        }
    }
}

/// An address nothing listens on: a port bound, then closed.
async fn closed_port() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().to_string()
}

/// A port that accepts each connection and closes it at once, as Docker's port proxy does
/// when the container behind it is gone; with `reset`, it reads the request first and
/// resets the connection instead. Returns its address and the connections it accepted.
async fn start_closer(reset: bool) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            if reset {
                let mut buffer = [0u8; 1024];
                let _ = stream.read(&mut buffer).await;
                stream.set_zero_linger().unwrap();
            }
            drop(stream);
        }
    });
    (address, accepted)
}

/// A TCP server that sends back what it reads, until the client closes its side.
async fn start_echo() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut reader, mut writer) = stream.split();
                let _ = tokio::io::copy(&mut reader, &mut writer).await;
            });
        }
    });
    address
}

/// The route `name` (reached at `<name>.example.test`) with a copy at each address.
fn route(name: &str, addresses: &[&str]) -> RouteView {
    RouteView {
        name: name.into(),
        host: String::new(),
        project: "default".into(),
        job: "shop".into(),
        group: "web".into(),
        port: "7777/tcp".into(),
        backends: addresses
            .iter()
            .map(|address| Backend {
                address: address.to_string(),
                // The same copy in every table built by a test: one ID per address.
                id: Uuid::from_u128(address.bytes().fold(0, |id: u128, byte| {
                    id.wrapping_mul(257).wrapping_add(u128::from(byte))
                })),
                name: format!("copy-at-{address}"),
                node: "w1".into(),
            })
            .collect(),
    }
}

/// A router on loopback, its HTTP and admin listeners serving until the fixture is dropped.
struct RouterFixture {
    router: Arc<Router>,
    http: SocketAddr,
    admin: SocketAddr,
    shutdown: CancellationToken,
    served: Option<JoinHandle<std::io::Result<()>>>,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Drop for RouterFixture {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn start_router(routes: &[RouteView]) -> RouterFixture {
    let table = Arc::new(ArcSwap::from_pointee(RouteTable::build(
        routes, DOMAIN, None,
    )));
    let router = Router::new(table);
    let shutdown = CancellationToken::new();
    let http_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (http, admin) = (
        http_listener.local_addr().unwrap(),
        admin_listener.local_addr().unwrap(),
    );
    let served = tokio::spawn(Arc::clone(&router).serve_http(http_listener, shutdown.clone()));
    tokio::spawn(Arc::clone(&router).serve_admin(admin_listener, shutdown.clone()));
    RouterFixture {
        router,
        http,
        admin,
        shutdown,
        served: Some(served),
        client: Client::builder(TokioExecutor::new()).build_http(),
    }
}

/// An answer, read whole.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    /// The router's own error, checked to be JSON with the status it came with.
    fn error(&self) -> ErrorBody {
        assert_eq!(
            self.headers[header::CONTENT_TYPE],
            "application/json",
            "{self:?}"
        );
        let error: ErrorBody = serde_json::from_str(&self.body).unwrap();
        assert_eq!(error.http_status_code, self.status.as_u16());
        error
    }
}

impl RouterFixture {
    /// Swaps in the table of `routes`, keeping the counters of the copies that stay.
    fn set_routes(&self, routes: &[RouteView]) {
        let table = self.router.table();
        let next = RouteTable::build(routes, DOMAIN, Some(&table.load()));
        table.store(Arc::new(next));
    }

    async fn send(&self, method: Method, host: &str, path: &str, body: Bytes) -> Answer {
        send(&self.client, self.http, method, host, path, body).await
    }

    async fn get(&self, host: &str, path: &str) -> Answer {
        self.send(Method::GET, host, path, Bytes::new()).await
    }

    async fn admin(&self, path: &str) -> Answer {
        send(
            &self.client,
            self.admin,
            Method::GET,
            "localhost",
            path,
            Bytes::new(),
        )
        .await
    }

    async fn routes(&self) -> TableView {
        let answer = self.admin("/routes").await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        serde_json::from_str(&answer.body).unwrap()
    }

    async fn metrics(&self) -> String {
        let answer = self.admin("/metrics").await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        answer.body
    }
}

async fn send(
    client: &Client<HttpConnector, Full<Bytes>>,
    to: SocketAddr,
    method: Method,
    host: &str,
    path: &str,
    body: Bytes,
) -> Answer {
    let request = Request::builder()
        .method(method)
        .uri(format!("http://{to}{path}"))
        .header(header::HOST, host)
        .body(Full::new(body))
        .unwrap();
    let response = tokio::time::timeout(PATIENCE, client.request(request))
        .await
        .expect("the router answers")
        .unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

/// The value of the sample `series` (`name{labels}`) in a metrics page, 0 when absent.
fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |value| value.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn copies_answer_in_turn() {
    let copies = [
        start_copy("a").await,
        start_copy("b").await,
        start_copy("c").await,
    ];
    let addresses: Vec<&str> = copies.iter().map(|copy| copy.address.as_str()).collect();
    let fixture = start_router(&[route("web.shop", &addresses)]).await;
    let mut answers = Vec::new();
    for _ in 0..6 {
        let answer = fixture.get(WEB, "/").await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        answers.push(answer.body);
    }
    for copy in &copies {
        let answered = answers.iter().filter(|name| *name == copy.name).count();
        assert_eq!(answered, 2, "copy {} in {answers:?}", copy.name);
        assert_eq!(copy.hits.load(Ordering::SeqCst), 2);
    }
    // In turn: every three answers in a row are the three copies.
    for window in answers.chunks(3) {
        let mut window = window.to_vec();
        window.sort();
        assert_eq!(window, ["a", "b", "c"], "{answers:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_host_is_a_404_naming_it() {
    let copy = start_copy("a").await;
    let fixture = start_router(&[route("web.shop", &[&copy.address])]).await;
    let answer = fixture.get("nothing.example.test", "/").await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    let error = answer.error();
    assert_eq!(error.message, "no route for host \"nothing.example.test\"");
    assert_eq!(copy.hits.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_route_without_copies_is_a_503_naming_it() {
    let fixture = start_router(&[route("idle.shop", &[])]).await;
    let answer = fixture.get("idle.shop.example.test", "/").await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    let error = answer.error();
    assert!(
        error.message.contains("idle.shop")
            && error.message.contains("idle.shop.example.test")
            && error.message.contains("no copy")
            && error.message.contains("running and healthy"),
        "{error:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_without_a_host_is_a_400() {
    let fixture = start_router(&[]).await;
    let stream = TcpStream::connect(fixture.http).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    // hyper's connection-level client sends no Host of its own.
    let request = Request::get("/").body(Full::new(Bytes::new())).unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status();
    let content_type = response.headers()[header::CONTENT_TYPE].clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(content_type, "application/json");
    let error: ErrorBody = serde_json::from_slice(&body).unwrap();
    assert_eq!(error.http_status_code, 400);
    assert!(error.message.contains("Host"), "{error:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_copy_gets_the_request_as_sent_with_forwarding_headers() {
    let copy = start_copy("a").await;
    let fixture = start_router(&[route("web.shop", &[&copy.address])]).await;
    let request = Request::get(format!("http://{}/headers?x=1&y=two", fixture.http))
        .header(header::HOST, WEB)
        .header(header::CONNECTION, "x-secret")
        .header("x-secret", "hop")
        .header("x-forwarded-for", "10.0.0.1")
        .header("x-kept", "end to end")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = fixture.client.request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let seen = String::from_utf8(body.to_vec()).unwrap();
    let lines: Vec<&str> = seen.lines().collect();
    assert_eq!(lines[0], "GET /headers?x=1&y=two", "{seen}");
    for expected in [
        "host: web.shop.example.test",
        "x-forwarded-for: 10.0.0.1, 127.0.0.1",
        "x-forwarded-host: web.shop.example.test",
        "x-forwarded-proto: http",
        "x-kept: end to end",
    ] {
        assert!(lines.contains(&expected), "{expected} not in\n{seen}");
    }
    assert!(!seen.contains("x-secret"), "{seen}");
}

#[tokio::test(flavor = "multi_thread")]
async fn large_bodies_go_through_both_ways() {
    let copy = start_copy("a").await;
    let fixture = start_router(&[route("web.shop", &[&copy.address])]).await;
    let sent: Vec<u8> = (0..4 * 1024 * 1024).map(|i: u32| (i % 251) as u8).collect();
    let sent = Bytes::from(sent);
    let request = Request::post(format!("http://{}/echo", fixture.http))
        .header(header::HOST, WEB)
        .body(Full::new(sent.clone()))
        .unwrap();
    let response = fixture.client.request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let received = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(received.len(), sent.len());
    assert!(
        received == sent,
        "the echoed body differs from the one sent"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_copy_is_left_for_another_and_a_post_is_not_sent_twice() {
    let live = start_copy("live").await;
    let dead = closed_port().await;
    let fixture = start_router(&[
        route("flaky.shop", &[&dead, &live.address]),
        route("gone.shop", &[&dead]),
    ])
    .await;
    for _ in 0..20 {
        let answer = fixture.get("flaky.shop.example.test", "/").await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        assert_eq!(answer.body, "live");
    }
    assert_eq!(live.hits.load(Ordering::SeqCst), 20);
    let metrics = fixture.metrics().await;
    let retried = sample(
        &metrics,
        "cube_router_errors_total{route=\"flaky.shop\",kind=\"retried\"}",
    );
    assert!(
        (1.0..=20.0).contains(&retried),
        "the dead copy was tried first some of the time: {retried}\n{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            "cube_router_errors_total{route=\"flaky.shop\",kind=\"upstream\"}"
        ),
        0.0
    );

    // A POST with a body is never sent twice: the copy's failure is the client's answer.
    let answer = fixture
        .send(
            Method::POST,
            "gone.shop.example.test",
            "/",
            Bytes::from_static(b"order=1"),
        )
        .await;
    assert_eq!(answer.status, StatusCode::BAD_GATEWAY);
    let error = answer.error();
    assert!(
        error.message.contains(&dead)
            && error.message.contains("gone.shop")
            && error.message.contains("refused"),
        "{error:?}"
    );
    let metrics = fixture.metrics().await;
    assert_eq!(
        sample(
            &metrics,
            "cube_router_errors_total{route=\"gone.shop\",kind=\"retried\"}"
        ),
        0.0,
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            "cube_router_errors_total{route=\"gone.shop\",kind=\"upstream\"}"
        ),
        1.0
    );
    assert_eq!(
        sample(
            &metrics,
            "cube_router_requests_total{route=\"gone.shop\",code=\"5xx\"}"
        ),
        1.0
    );

    // A GET to the same lone dead copy is tried twice, then answered 502.
    let answer = fixture.get("gone.shop.example.test", "/").await;
    assert_eq!(answer.status, StatusCode::BAD_GATEWAY);
    assert!(answer.error().message.contains(&dead));
    let metrics = fixture.metrics().await;
    assert_eq!(
        sample(
            &metrics,
            "cube_router_errors_total{route=\"gone.shop\",kind=\"retried\"}"
        ),
        1.0,
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_copy_that_closes_the_connection_unanswered_is_left_for_another() {
    let live = start_copy("live").await;
    let (closer, accepted) = start_closer(false).await;
    let fixture = start_router(&[route("web.shop", &[&closer, &live.address])]).await;
    for _ in 0..6 {
        let answer = fixture.get(WEB, "/").await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        assert_eq!(answer.body, "live");
    }
    assert!(
        accepted.load(Ordering::SeqCst) >= 1,
        "the closing copy was never tried"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_copy_that_resets_the_connection_unanswered_is_left_for_another() {
    let live = start_copy("live").await;
    let (resetter, accepted) = start_closer(true).await;
    let fixture = start_router(&[route("web.shop", &[&resetter, &live.address])]).await;
    for _ in 0..6 {
        let answer = fixture.get(WEB, "/").await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        assert_eq!(answer.body, "live");
    }
    assert!(
        accepted.load(Ordering::SeqCst) >= 1,
        "the resetting copy was never tried"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_table_takes_effect_without_failing_a_request() {
    let copies = [
        start_copy("a").await,
        start_copy("b").await,
        start_copy("c").await,
    ];
    let before = route("web.shop", &[&copies[0].address, &copies[1].address]);
    let after = route(
        "web.shop",
        &[&copies[0].address, &copies[1].address, &copies[2].address],
    );
    let fixture = Arc::new(start_router(std::slice::from_ref(&before)).await);
    let stop = Arc::new(AtomicBool::new(false));
    let (answers, mut answered) = mpsc::channel::<Result<String, String>>(64);
    let clients: Vec<JoinHandle<()>> = (0..4)
        .map(|_| {
            let (fixture, stop, answers) =
                (Arc::clone(&fixture), Arc::clone(&stop), answers.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let answer = fixture.get(WEB, "/").await;
                    let outcome = if answer.status == StatusCode::OK {
                        Ok(answer.body)
                    } else {
                        Err(format!("{answer:?}"))
                    };
                    if answers.send(outcome).await.is_err() {
                        break;
                    }
                }
            })
        })
        .collect();
    drop(answers);

    let mut outcomes = Vec::new();
    while outcomes.len() < 20 {
        outcomes.push(answered.recv().await.unwrap());
    }
    fixture.set_routes(&[after]);
    let mut answered_by_c = 0;
    while answered_by_c < 5 {
        assert!(outcomes.len() < 5000, "copy c never answered");
        let outcome = answered.recv().await.unwrap();
        answered_by_c += usize::from(outcome.as_deref() == Ok("c"));
        outcomes.push(outcome);
    }
    stop.store(true, Ordering::SeqCst);
    while let Some(outcome) = answered.recv().await {
        outcomes.push(outcome);
    }
    for client in clients {
        client.await.unwrap();
    }
    let failed: Vec<&String> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    assert!(failed.is_empty(), "{failed:?}");
    assert!(
        outcomes[..20].iter().all(|o| o.as_deref() != Ok("c")),
        "c answered before it was in the table"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_http2_client_is_answered() {
    let copy = start_copy("a").await;
    let fixture = start_router(&[route("web.shop", &[&copy.address])]).await;
    let stream = TcpStream::connect(fixture.http).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    for path in ["/", "/headers"] {
        let request = Request::get(format!("http://{WEB}{path}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.version(), hyper::Version::HTTP_2);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let body = String::from_utf8(body.to_vec()).unwrap();
        if path == "/" {
            assert_eq!(body, "a");
        } else {
            // The copy speaks HTTP/1.1 and gets the :authority as its Host.
            assert!(
                body.lines()
                    .any(|line| line == "host: web.shop.example.test"),
                "{body}"
            );
        }
    }
    let answer = {
        let request = Request::get("http://nothing.example.test/")
            .body(Full::new(Bytes::new()))
            .unwrap();
        sender.send_request(request).await.unwrap()
    };
    assert_eq!(answer.status(), StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_is_outstanding_until_its_answer_is_sent_whole() {
    let copy = start_copy("a").await;
    let fixture = start_router(&[route("web.shop", &[&copy.address])]).await;
    let request = Request::get(format!("http://{}/slow", fixture.http))
        .header(header::HOST, WEB)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = fixture.client.request(request).await.unwrap();
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first, "start;");
    let outstanding = fixture.routes().await.routes[0].copies[0].outstanding;
    assert_eq!(outstanding, 1, "the answer's body is still being sent");

    copy.gate.notify_one();
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest, "end");
    let outstanding = fixture.routes().await.routes[0].copies[0].outstanding;
    assert_eq!(outstanding, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_admin_listener_counts_what_was_sent_and_lists_the_copies() {
    let copies = [
        start_copy("a").await,
        start_copy("b").await,
        start_copy("c").await,
    ];
    let addresses: Vec<&str> = copies.iter().map(|copy| copy.address.as_str()).collect();
    let fixture = start_router(&[route("web.shop", &addresses), route("idle.shop", &[])]).await;
    for _ in 0..6 {
        assert_eq!(fixture.get(WEB, "/").await.status, StatusCode::OK);
    }
    assert_eq!(
        fixture.get("nothing.example.test", "/").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        fixture.get("idle.shop.example.test", "/").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );

    let metrics = fixture.metrics().await;
    for (series, value) in [
        (
            "cube_router_requests_total{route=\"web.shop\",code=\"2xx\"}",
            6.0,
        ),
        (
            "cube_router_requests_total{route=\"web.shop\",code=\"5xx\"}",
            0.0,
        ),
        (
            "cube_router_request_duration_seconds_count{route=\"web.shop\"}",
            6.0,
        ),
        ("cube_router_copies{route=\"web.shop\"}", 3.0),
        ("cube_router_copies{route=\"idle.shop\"}", 0.0),
        ("cube_router_requests_total{route=\"\",code=\"4xx\"}", 1.0),
        (
            "cube_router_errors_total{route=\"\",kind=\"no_route\"}",
            1.0,
        ),
        (
            "cube_router_requests_total{route=\"idle.shop\",code=\"5xx\"}",
            1.0,
        ),
        (
            "cube_router_errors_total{route=\"idle.shop\",kind=\"no_copy\"}",
            1.0,
        ),
    ] {
        assert_eq!(sample(&metrics, series), value, "{series} in\n{metrics}");
    }
    assert!(metrics.contains("cube_router_copies{route=\"idle.shop\"} 0"));
    assert!(metrics.contains("# TYPE cube_router_requests_total counter"));
    assert!(metrics.contains("# TYPE cube_router_request_duration_seconds histogram"));

    let table = fixture.routes().await;
    let web = table
        .routes
        .iter()
        .find(|route| route.name == "web.shop")
        .unwrap();
    assert_eq!(web.host, WEB);
    assert_eq!(web.port, "7777/tcp");
    let mut listed: Vec<&str> = web
        .copies
        .iter()
        .map(|copy| copy.address.as_str())
        .collect();
    listed.sort();
    let mut expected = addresses.clone();
    expected.sort();
    assert_eq!(listed, expected);
    assert!(web.copies.iter().all(|copy| copy.outstanding == 0));
    assert!(
        table
            .routes
            .iter()
            .any(|route| route.name == "idle.shop" && route.copies.is_empty())
    );

    let health = fixture.admin("/health").await;
    assert_eq!(health.status, StatusCode::OK);
    assert_eq!(health.body, r#"{"Status":"ok"}"#);
    let unknown = fixture.admin("/nothing").await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert!(unknown.error().message.contains("/metrics"));
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_lets_an_open_request_finish_and_stops_accepting() {
    let copy = start_copy("a").await;
    let mut fixture = start_router(&[route("web.shop", &[&copy.address])]).await;
    let request = Request::get(format!("http://{}/slow", fixture.http))
        .header(header::HOST, WEB)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = fixture.client.request(request).await.unwrap();
    let mut body = response.into_body();
    assert_eq!(
        body.frame().await.unwrap().unwrap().into_data().unwrap(),
        "start;"
    );

    fixture.shutdown.cancel();
    copy.gate.notify_one();
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest, "end");
    let served = fixture.served.take().unwrap();
    tokio::time::timeout(PATIENCE, served)
        .await
        .expect("serve_http returns once its connections are done")
        .unwrap()
        .unwrap();
    assert!(
        TcpStream::connect(fixture.http).await.is_err(),
        "the listener is closed"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn tcp_connections_go_to_a_copy_both_ways() {
    let echo = start_echo().await;
    let dead = closed_port().await;
    let fixture = start_router(&[
        route("db.shop", &[&echo]),
        route("flaky-db.shop", &[&dead, &echo]),
    ])
    .await;
    let mut forwarded = Vec::new();
    for name in ["db.shop", "flaky-db.shop"] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(serve_tcp(
            Arc::clone(&fixture.router),
            listener,
            name.to_string(),
            fixture.shutdown.clone(),
        ));
        forwarded.push(address);
    }
    for (address, connections) in [(forwarded[0], 1), (forwarded[1], 4)] {
        for i in 0..connections {
            let mut stream = TcpStream::connect(address).await.unwrap();
            let message = format!("hello {i}");
            stream.write_all(message.as_bytes()).await.unwrap();
            let mut back = vec![0u8; message.len()];
            tokio::time::timeout(PATIENCE, stream.read_exact(&mut back))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(back, message.as_bytes());
            // The client closing its side closes the echo's, and so the connection.
            stream.shutdown().await.unwrap();
            let mut rest = Vec::new();
            tokio::time::timeout(PATIENCE, stream.read_to_end(&mut rest))
                .await
                .unwrap()
                .unwrap();
            assert!(rest.is_empty());
        }
    }
    let metrics = fixture.metrics().await;
    assert_eq!(
        sample(
            &metrics,
            "cube_router_tcp_connections_total{route=\"flaky-db.shop\"}"
        ),
        4.0,
        "{metrics}"
    );
    assert!(
        sample(
            &metrics,
            "cube_router_errors_total{route=\"flaky-db.shop\",kind=\"retried\"}"
        ) >= 1.0,
        "the dead copy was tried first some of the time\n{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tcp_connection_to_a_route_without_copies_is_closed() {
    let fixture = start_router(&[route("db.shop", &[])]).await;
    for name in ["db.shop", "no-such-route"] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(serve_tcp(
            Arc::clone(&fixture.router),
            listener,
            name.to_string(),
            fixture.shutdown.clone(),
        ));
        let mut stream = TcpStream::connect(address).await.unwrap();
        let mut buffer = [0u8; 16];
        let read = tokio::time::timeout(PATIENCE, stream.read(&mut buffer))
            .await
            .expect("the router closes the connection");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    }
    let metrics = fixture.metrics().await;
    assert_eq!(
        sample(
            &metrics,
            "cube_router_errors_total{route=\"db.shop\",kind=\"no_copy\"}"
        ),
        1.0,
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            "cube_router_errors_total{route=\"no-such-route\",kind=\"no_route\"}"
        ),
        1.0,
        "{metrics}"
    );
}
