//! `cube router --haproxy-config`: the configuration rendered for Cube's routes passes the
//! real HAProxy's check, and a real HAProxy (Debian's, installed by scripts/setup.sh) that
//! `keep_in_step` writes for and reloads follows the routes: its backends follow a scale from
//! 3 to 5 to 1 copies within 1 s of the change, an unknown host gets a 404 in JSON, a route
//! without copies a 503 in JSON, and a TCP port reaches its route's copy.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cube_router::RouteTable;
use cube_router::haproxy::{self, HaproxyOptions};
use cube_test_support::{Haproxy, haproxy_binary};
use cube_types::route::{Backend, RouteView};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const DOMAIN: &str = "example.test";
/// The route scaled in these tests, reached at `web.shop.example.test`.
const ROUTE: &str = "web.shop";
const HOST: &str = "web.shop.example.test";
/// Its backend's name: `route_` and its host.
const BACKEND: &str = "route_web.shop.example.test";

/// How long HAProxy may take to follow here, where tests share the machine: the issue's
/// target (1 s) is measured by `cube-bench router` (see BENCHMARKS.md); this test checks that
/// it follows, and prints how long it took.
const FOLLOW_WITHIN: Duration = Duration::from_secs(5);
/// How often HAProxy is asked again while it has not followed yet: it tells no one when a
/// reload is done, so the test looks.
const POLL_EVERY: Duration = Duration::from_millis(20);

#[test]
fn rendered_configurations_pass_haproxys_check() {
    let dir = tempfile::tempdir().unwrap();
    let options = options(&dir, free_port(), None);
    let copies = |count: u128| -> Vec<(String, u128)> {
        (1..=count)
            .map(|id| (format!("10.0.0.{id}:3276{id}"), id))
            .collect()
    };
    let cases: Vec<(&str, Vec<RouteView>, HaproxyOptions)> = vec![
        ("an empty table", Vec::new(), options.clone()),
        (
            "one route with 3 copies",
            vec![view(ROUTE, "", &copies(3))],
            options.clone(),
        ),
        (
            "a route with no copy",
            vec![view("empty.shop", "", &[])],
            options.clone(),
        ),
        (
            "a TCP route, a TCP port without a route and one taken twice",
            vec![view("db.shop", "", &copies(2))],
            HaproxyOptions {
                tcp: vec![
                    (free_port(), "db.shop".to_string()),
                    (free_port(), "missing".to_string()),
                    (7000, "db.shop".to_string()),
                    (7000, "other".to_string()),
                ],
                ..options.clone()
            },
        ),
        (
            "odd names, a copy on a host name that does not resolve, a bad address and a bad host",
            vec![
                view("it's \"odd\"", "odd_host.example.test", &[]),
                view(
                    "named",
                    "",
                    &[
                        ("node-1.invalid:8080".to_string(), 1),
                        ("[::1]:8080".to_string(), 2),
                        ("10.0.0.1:80 check".to_string(), 3),
                    ],
                ),
                view("spaced", "a host.example.test", &copies(1)),
            ],
            HaproxyOptions {
                stats_socket: Some(dir.path().join("it's a socket")),
                ..options.clone()
            },
        ),
    ];
    for (case, views, options) in cases {
        let table = RouteTable::build(&views, DOMAIN, None);
        let rendered = haproxy::configuration(&table, &options);
        let file = dir.path().join("check.cfg");
        std::fs::write(&file, &rendered.text).unwrap();
        let output = Command::new(haproxy_binary())
            .args(["-c", "-f"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{case}: haproxy -c rejects the configuration:\n{}\n{}",
            String::from_utf8_lossy(&output.stderr),
            rendered.text
        );
        // Warnings point at a setting HAProxy ignores or doubts: none is expected, but for
        // the copy on a name that does not resolve, which starts in maintenance.
        let stderr = String::from_utf8_lossy(&output.stderr);
        let warnings: Vec<&str> = stderr
            .lines()
            .filter(|line| line.contains("WARNING") && !line.contains("could not resolve"))
            .collect();
        assert!(
            warnings.is_empty(),
            "{case}: {warnings:#?}\n{}",
            rendered.text
        );
        println!(
            "{case}: passes haproxy -c; left out: {:?}",
            rendered.left_out
        );
    }

    // What HAProxy cannot hold safely is left out, and said so.
    let table = RouteTable::build(
        &[
            view("spaced", "a host.example.test", &copies(1)),
            view(ROUTE, "", &[("10.0.0.1:80 check".to_string(), 1)]),
        ],
        DOMAIN,
        None,
    );
    let rendered = haproxy::configuration(&table, &options);
    assert_eq!(rendered.left_out.len(), 2, "{:?}", rendered.left_out);
    assert!(!rendered.text.contains("a host") && !rendered.text.contains("check"));
}

#[test]
fn the_same_routes_give_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let options = options(&dir, 8080, None);
    let forwards = [
        ("10.0.0.2:1".to_string(), 2),
        ("10.0.0.1:1".to_string(), 1),
        ("10.0.0.3:1".to_string(), 3),
    ];
    let mut backwards = forwards.clone();
    backwards.reverse();
    let first = RouteTable::build(
        &[view(ROUTE, "", &forwards), view("api", "", &[])],
        DOMAIN,
        None,
    );
    let second = RouteTable::build(
        &[view("api", "", &[]), view(ROUTE, "", &backwards)],
        DOMAIN,
        None,
    );
    let text = haproxy::render(&first, &options);
    assert_eq!(text, haproxy::render(&second, &options));
    // Servers by address, routes by host.
    let c0 = text.find("server c0 10.0.0.1:1").unwrap();
    assert!(c0 < text.find("server c2 10.0.0.3:1").unwrap(), "{text}");
    assert!(text.find("backend route_api").unwrap() < text.find(BACKEND).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_follow_a_scale_from_3_to_5_to_1_copies() {
    let dir = tempfile::tempdir().unwrap();
    let copies = start_copies(5).await;
    let port = free_port();
    // HAProxy starts on the configuration of no route, as `keep_in_step` writes it: the
    // first table it gets is the same, so it leaves the file alone and reloads nothing.
    let empty = Arc::new(RouteTable::build(&[], DOMAIN, None));
    let initial = options(&dir, port, None);
    std::fs::write(&initial.config, haproxy::render(&empty, &initial)).unwrap();
    let haproxy = Haproxy::start(&initial.config, initial.stats_socket.as_deref().unwrap());
    // Reloads asked of the master on its CLI: a `kill -USR2` that comes while the master is
    // still starting from the last reload ends it (seen on a loaded machine).
    let options = HaproxyOptions {
        master_socket: Some(haproxy.master_socket()),
        ..initial.clone()
    };
    let (tables, receiver) = watch::channel(Arc::clone(&empty));
    let shutdown = CancellationToken::new();
    let keeper = tokio::spawn(haproxy::keep_in_step(
        receiver,
        options.clone(),
        shutdown.clone(),
    ));

    let mut previous = empty;
    for count in [3, 5, 1] {
        let serving = &copies[..count];
        let table = Arc::new(RouteTable::build(
            &[view(
                ROUTE,
                "",
                &serving
                    .iter()
                    .map(|copy| (copy.address.to_string(), copy.id))
                    .collect::<Vec<_>>(),
            )],
            DOMAIN,
            Some(&previous),
        ));
        let expected_addresses: BTreeSet<String> = serving
            .iter()
            .map(|copy| copy.address.to_string())
            .collect();
        let expected_names: BTreeSet<String> =
            serving.iter().map(|copy| copy.name.clone()).collect();

        let pushed = Instant::now();
        tables.send(Arc::clone(&table)).unwrap();
        let in_stats = wait_for(
            &haproxy,
            pushed,
            "its servers to be the copies",
            async || haproxy.servers(BACKEND).as_ref() == Ok(&expected_addresses),
        )
        .await;
        let in_answers = wait_for(
            &haproxy,
            pushed,
            "exactly the copies to answer",
            async || answering(port, HOST, 20).await.as_ref() == Ok(&expected_names),
        )
        .await;
        println!(
            "{count} copies: HAProxy's servers are the copies after {} ms, exactly they answer after {} ms",
            in_stats.as_millis(),
            in_answers.as_millis()
        );
        assert!(
            in_answers <= FOLLOW_WITHIN,
            "HAProxy followed the scale to {count} copies only after {} ms; log:\n{}",
            in_answers.as_millis(),
            haproxy.log()
        );
        previous = table;
    }

    shutdown.cancel();
    keeper.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_hosts_and_routes_without_copies_answer_in_json_and_tcp_ports_forward() {
    let dir = tempfile::tempdir().unwrap();
    let copies = start_copies(1).await;
    let port = free_port();
    let tcp_port = free_port();
    let table = RouteTable::build(
        &[
            view(ROUTE, "", &[(copies[0].address.to_string(), copies[0].id)]),
            view("empty.shop", "", &[]),
            // A copy no one listens for: HAProxy's own 503, in JSON too.
            view(
                "down.shop",
                "",
                &[(format!("127.0.0.1:{}", free_port()), 9)],
            ),
        ],
        DOMAIN,
        None,
    );
    let options = HaproxyOptions {
        tcp: vec![(tcp_port, ROUTE.to_string())],
        ..options(&dir, port, None)
    };
    std::fs::write(&options.config, haproxy::render(&table, &options)).unwrap();
    let haproxy = Haproxy::start(&options.config, options.stats_socket.as_deref().unwrap());

    let (status, body) = get(port, "nobody.Example.test:8080").await.unwrap();
    assert_eq!(status, 404, "{body}");
    let error: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["HTTPStatusCode"], 404);
    assert!(
        error["Message"]
            .as_str()
            .unwrap()
            .contains("nobody.Example.test"),
        "{body}"
    );
    // A host a client mangles stays valid JSON.
    let (status, body) = get(port, r#"odd"\host"#).await.unwrap();
    assert_eq!(status, 404, "{body}");
    let error: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        error["Message"].as_str().unwrap().contains(r#"odd"\host"#),
        "{body}"
    );

    let (status, body) = get(port, "empty.shop.example.test").await.unwrap();
    assert_eq!(status, 503, "{body}");
    let error: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["HTTPStatusCode"], 503);
    assert!(
        error["Message"].as_str().unwrap().contains("empty.shop"),
        "{body}"
    );

    let (status, body) = get(port, "down.shop.example.test").await.unwrap();
    assert_eq!(status, 503, "{body}");
    let error: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["HTTPStatusCode"], 503, "{body}");

    // Any case, with a port or a final dot, as the router's own table finds hosts.
    for host in [HOST, "WEB.Shop.example.test:80", "web.shop.example.test."] {
        let (status, body) = get(port, host).await.unwrap();
        assert_eq!(
            (status, body.as_str()),
            (200, copies[0].name.as_str()),
            "{host}"
        );
    }
    let (status, body) = get(tcp_port, "anything").await.unwrap();
    assert_eq!((status, body.as_str()), (200, copies[0].name.as_str()));
    drop(haproxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_is_written_only_on_change_and_a_failed_reload_is_tried_again() {
    let dir = tempfile::tempdir().unwrap();
    let reloads = dir.path().join("reloads");
    let allowed = dir.path().join("allowed");
    // Fails (with a message on stderr) until `allowed` exists, then counts itself.
    let command = format!(
        "test -e '{allowed}' || {{ echo 'HAProxy is not there' >&2; exit 3; }}; echo reload >> '{reloads}'",
        allowed = allowed.display(),
        reloads = reloads.display()
    );
    let options = options(&dir, 8080, Some(command));
    let table = |count: u128| {
        Arc::new(RouteTable::build(
            &[view(
                ROUTE,
                "",
                &(1..=count)
                    .map(|id| (format!("10.0.0.{id}:80"), id))
                    .collect::<Vec<_>>(),
            )],
            DOMAIN,
            None,
        ))
    };
    let (tables, receiver) = watch::channel(table(1));
    let shutdown = CancellationToken::new();
    let keeper = tokio::spawn(haproxy::keep_in_step(
        receiver,
        options.clone(),
        shutdown.clone(),
    ));
    let count_reloads = || {
        std::fs::read_to_string(&reloads)
            .map(|text| text.lines().count())
            .unwrap_or(0)
    };

    // Written at once; the reload fails, so nothing is counted.
    wait_until("the first configuration is written", || {
        std::fs::read_to_string(&options.config).is_ok_and(|text| text.contains("10.0.0.1:80"))
    })
    .await;
    assert_eq!(count_reloads(), 0);

    // The next change is written and the reload owed is run again, now with success.
    std::fs::write(&allowed, "").unwrap();
    tables.send(table(2)).unwrap();
    // Tried again at the change (or, on a slow machine, by the retry's timer just before):
    // once or twice, with the second copy written.
    wait_until("the reload is tried again", || {
        count_reloads() >= 1
            && std::fs::read_to_string(&options.config)
                .is_ok_and(|text| text.contains("10.0.0.2:80"))
    })
    .await;
    // Settled: whatever the keeper owed it has done.
    let mut settled = count_reloads();
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = count_reloads();
        if now == settled {
            break;
        }
        settled = now;
    }

    // The same routes in a new table: nothing to write, nothing to reload.
    tables.send(table(2)).unwrap();
    tables.send(table(3)).unwrap();
    wait_until("the third copy is written and reloaded", || {
        count_reloads() == settled + 1
    })
    .await;
    tables.send(table(3)).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        count_reloads(),
        settled + 1,
        "the same routes reloaded HAProxy again"
    );
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .filter(|name| name.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    shutdown.cancel();
    keeper.await.unwrap();
}

// Helpers.

fn view(name: &str, host: &str, backends: &[(String, u128)]) -> RouteView {
    RouteView {
        name: name.into(),
        host: host.into(),
        project: "default".into(),
        job: "shop".into(),
        group: "web".into(),
        port: "7777/tcp".into(),
        backends: backends
            .iter()
            .map(|(address, id)| Backend {
                address: address.clone(),
                id: Uuid::from_u128(*id),
                name: format!("copy-{id}"),
                node: "w1".into(),
            })
            .collect(),
    }
}

fn options(dir: &tempfile::TempDir, port: u16, reload: Option<String>) -> HaproxyOptions {
    HaproxyOptions {
        listen: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        config: dir.path().join("haproxy.cfg"),
        reload,
        tcp: Vec::new(),
        stats_socket: Some(dir.path().join("admin.sock")),
        master_socket: None,
    }
}

/// A port free on loopback now, for HAProxy to bind (it takes no port 0 to report back).
fn free_port() -> u16 {
    std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `done` every [`POLL_EVERY`] for at most 10 s.
async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "waited 10 s for {what}"
        );
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// One copy of a route: an HTTP server on loopback answering every request with its name.
struct CopyServer {
    address: SocketAddr,
    id: u128,
    name: String,
}

async fn start_copies(count: u128) -> Vec<CopyServer> {
    let mut copies = Vec::new();
    for id in 1..=count {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let name = format!("copy-{id}");
        copies.push(CopyServer {
            address: listener.local_addr().unwrap(),
            id,
            name: name.clone(),
        });
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(answer_with(stream, name.clone()));
            }
        });
    }
    copies
}

async fn answer_with(mut stream: TcpStream, name: String) {
    let mut head = Vec::new();
    let mut buffer = [0; 1024];
    while !head.windows(4).any(|window| window == b"\r\n\r\n") && head.len() < 16 * 1024 {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => head.extend_from_slice(&buffer[..read]),
        }
    }
    let response = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{name}",
        name.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// `GET /` on `port` with `host` as its `Host`, on a connection of its own: the status and
/// the body.
async fn get(port: u16, host: &str) -> Result<(u16, String), String> {
    let exchange = async {
        let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))
            .await
            .map_err(|error| format!("connect: {error}"))?;
        let request = format!("GET / HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n");
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|error| format!("send: {error}"))?;
        let mut response = Vec::new();
        stream
            .read_to_end(&mut response)
            .await
            .map_err(|error| format!("read: {error}"))?;
        let response = String::from_utf8_lossy(&response).into_owned();
        let (head, body) = response
            .split_once("\r\n\r\n")
            .ok_or_else(|| format!("no complete answer: {response:?}"))?;
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|status| status.parse().ok())
            .ok_or_else(|| format!("no status: {head:?}"))?;
        Ok((status, body.to_string()))
    };
    tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .map_err(|_| "no answer within 2 s".to_string())?
}

/// The names of the copies that answer `requests` requests for `host` in a row, each on a
/// new connection (so that none stays with a worker HAProxy is retiring).
async fn answering(port: u16, host: &str, requests: usize) -> Result<BTreeSet<String>, String> {
    let mut names = BTreeSet::new();
    for _ in 0..requests {
        match get(port, host).await? {
            (200, name) => names.insert(name),
            (status, body) => return Err(format!("{status}: {body}")),
        };
    }
    Ok(names)
}

/// Polls `done` every [`POLL_EVERY`] until it holds and returns how long after `since`
/// it did; fails after 10 s with HAProxy's log.
async fn wait_for(
    haproxy: &Haproxy,
    since: Instant,
    what: &str,
    mut done: impl AsyncFnMut() -> bool,
) -> Duration {
    while !done().await {
        assert!(
            since.elapsed() < Duration::from_secs(10),
            "waited 10 s for {what}; log:\n{}",
            haproxy.log()
        );
        tokio::time::sleep(POLL_EVERY).await;
    }
    since.elapsed()
}
