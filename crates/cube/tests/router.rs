//! `cube router` as a user meets it: a job's copies reached by the job's host name through
//! the router, in turn; a rolling update under a client's loop of requests that sees no
//! error; a copy whose health check fails leaving its route; an unknown host answered 404
//! and a route without a healthy copy 503. Real `cube` processes, the real Docker engine,
//! requests sent as `curl --resolve` sends them (the route's host resolved to the router).

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::*;

const DOMAIN: &str = "example.test";
const HOST: &str = "web.shop.example.test";

/// The sample server, writing its container's host name to `/www/who` (each copy answers
/// with its own) and `version` to `/www/version` first.
fn copy_cmd(version: &str) -> Value {
    json!([
        "sh",
        "-c",
        format!(
            "hostname > /www/who && echo {version} > /www/version && exec httpd -f -p 7777 -h /www"
        )
    ])
}

/// The job `shop`: group `web` of `count` copies, probed on `/health` every `interval`.
fn shop(count: u32, version: &str, interval: &str) -> Value {
    json!({"Name": "shop", "Type": "service",
           "Groups": [{"Name": "web", "Count": count,
                       "Update": {"MaxParallel": 1, "MinHealthyTime": "300ms"},
                       "Task": {"Image": SAMPLE_IMAGE, "Memory": "16MiB",
                                "Cmd": copy_cmd(version),
                                "ExposedPorts": {"7777/tcp": {}},
                                "PortBindings": {"7777/tcp": ""},
                                "HealthCheck": "/health", "HealthCheckInterval": interval,
                                "HealthCheckRetries": 3, "RestartPolicy": "on-failure",
                                "RestartDelay": "1s"}}]})
}

/// An HTTP client that reaches every host of the test domain at the router, as
/// `curl --resolve HOST:PORT:127.0.0.1` does.
struct Through {
    http: reqwest::Client,
    port: u16,
}

impl Through {
    fn new(router: &RouterProcess, hosts: &[&str]) -> Through {
        let address: SocketAddr = router.url.trim_start_matches("http://").parse().unwrap();
        let mut builder = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .no_proxy();
        for host in hosts {
            builder = builder.resolve(host, address);
        }
        Through {
            http: builder.build().unwrap(),
            port: address.port(),
        }
    }

    /// `GET http://HOST:PORT/path` through the router: the status and the body, or why no
    /// answer came.
    async fn get(&self, host: &str, path: &str) -> Result<(u16, String), String> {
        let answer = self
            .http
            .get(format!("http://{host}:{}{path}", self.port))
            .send()
            .await
            .map_err(|err| format!("{err:?}"))?;
        let status = answer.status().as_u16();
        let body = answer.text().await.map_err(|err| format!("{err:?}"))?;
        Ok((status, body.trim().to_string()))
    }

    /// Asks until `count` different copies answered `/who` (each at most 200 tries): the
    /// route has them all.
    async fn await_copies(&self, host: &str, count: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut seen = std::collections::BTreeSet::new();
            for _ in 0..(count * 4) {
                if let Ok((200, who)) = self.get(host, "/who").await {
                    seen.insert(who);
                }
            }
            if seen.len() == count {
                return seen.into_iter().collect();
            }
            assert!(
                Instant::now() < deadline,
                "{host}: {} copies answered through the router, not {count}",
                seen.len()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The manager's routes, by name.
async fn routes(client: &Client) -> BTreeMap<String, Value> {
    let answer = client.get("/routes?project=*").await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|route| (route["Name"].as_str().unwrap().to_string(), route.clone()))
        .collect()
}

async fn submit(client: &Client, job: &Value) {
    let answer = client.post_raw("/jobs", job.to_string()).await;
    assert!(
        answer.status == 200 || answer.status == 201,
        "{}",
        answer.body
    );
}

#[tokio::test]
async fn three_copies_answer_in_turn_by_the_jobs_host_name_and_unknown_or_empty_routes_say_so() {
    let cluster = OneNodeCluster::start("route").await;
    let client = cluster.manager.client();
    let dir = tempfile::tempdir().unwrap();
    let router = RouterProcess::start(
        &cluster.manager.address(),
        dir.path(),
        &["--domain", DOMAIN],
    );
    let mut route_events = EventReader::open(&cluster.manager, "?topic=Route").await;
    submit(&client, &shop(3, "one", "250ms")).await;

    let through = Through::new(&router, &[HOST, "nothing.example.test"]);
    let copies = through.await_copies(HOST, 3).await;

    // The manager's view: one route, its three copies, at the node's published ports.
    let listed = routes(&client).await;
    let route = &listed["web.shop"];
    assert_eq!(
        route["Host"], "",
        "a default route: named under the router's domain"
    );
    assert_eq!(route["Port"], "7777/tcp");
    assert_eq!(route["Backends"].as_array().unwrap().len(), 3, "{route}");
    // Each change of it was an event.
    let event = route_events.next_event().await;
    assert_eq!(event["Topic"], "Route");
    assert_eq!(event["Key"], "web.shop");

    // One request after the other: each copy answers in turn, twice in six.
    let mut answered: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..6 {
        let (status, who) = through.get(HOST, "/who").await.unwrap();
        assert_eq!(status, 200);
        *answered.entry(who).or_default() += 1;
    }
    assert_eq!(
        answered.keys().cloned().collect::<Vec<_>>(),
        copies,
        "every copy answered"
    );
    assert!(answered.values().all(|n| *n == 2), "in turn: {answered:?}");

    // A host no route has: 404, saying so in JSON.
    let (status, body) = through.get("nothing.example.test", "/").await.unwrap();
    assert_eq!(status, 404, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert!(
        body["Message"]
            .as_str()
            .unwrap()
            .contains("nothing.example.test"),
        "{body}"
    );

    // The router counts per route.
    let metrics = reqwest::get(format!("{}/metrics", router.admin))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|line| line.starts_with("cube_router_requests_total")
                && line.contains("web.shop")),
        "{metrics}"
    );

    // No copy left: the route stays, without a copy, and answers 503 naming it.
    let scaled = client
        .post_raw(
            "/jobs/shop/scale",
            json!({"Group": "web", "Count": 0}).to_string(),
        )
        .await;
    assert_eq!(scaled.status, 200, "{}", scaled.body);
    let deadline = Instant::now() + STATE_BOUND;
    let body = loop {
        let (status, body) = through.get(HOST, "/who").await.unwrap();
        if status == 503 {
            break body;
        }
        assert!(Instant::now() < deadline, "still {status} {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let body: Value = serde_json::from_str(&body).unwrap();
    assert!(
        body["Message"].as_str().unwrap().contains("web.shop"),
        "{body}"
    );
    assert!(!router.stderr().contains("panicked"), "{}", router.stderr());
}

#[tokio::test]
async fn a_rolling_update_under_a_loop_of_requests_sees_no_error() {
    let cluster = OneNodeCluster::start("roll-route").await;
    let client = cluster.manager.client();
    let dir = tempfile::tempdir().unwrap();
    let router = RouterProcess::start(
        &cluster.manager.address(),
        dir.path(),
        &["--domain", DOMAIN],
    );
    submit(&client, &shop(3, "one", "250ms")).await;
    let through = Arc::new(Through::new(&router, &[HOST]));
    let old = through.await_copies(HOST, 3).await;

    // A client asks in a loop through the whole update.
    let done = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let loop_client = {
        let (through, done, sent) = (through.clone(), done.clone(), sent.clone());
        tokio::spawn(async move {
            let mut errors = Vec::new();
            let mut versions = std::collections::BTreeSet::new();
            while !done.load(Ordering::Relaxed) {
                match through.get(HOST, "/version").await {
                    Ok((200, version)) => {
                        versions.insert(version);
                    }
                    other => errors.push(format!("{other:?}")),
                }
                sent.fetch_add(1, Ordering::Relaxed);
            }
            (errors, versions)
        })
    };
    submit(&client, &shop(3, "two", "250ms")).await;
    client
        .await_job("shop", "version 2 deployed", |job| {
            job["Deployment"]["Version"] == 2 && job["Deployment"]["State"] == "successful"
        })
        .await;
    // Every old copy is gone from the route, and the new ones answer.
    let new = through.await_copies(HOST, 3).await;
    assert!(new.iter().all(|who| !old.contains(who)), "{old:?} {new:?}");
    done.store(true, Ordering::Relaxed);
    let (errors, versions) = loop_client.await.unwrap();
    let sent = sent.load(Ordering::Relaxed);
    eprintln!(
        "{sent} requests through the update, {} errors",
        errors.len()
    );
    assert!(sent > 50, "the loop sent only {sent} requests");
    assert!(errors.is_empty(), "{} errors: {errors:?}", errors.len());
    assert!(
        versions.contains("one") && versions.contains("two"),
        "{versions:?}"
    );
}

#[tokio::test]
async fn a_copy_whose_health_check_fails_leaves_the_route_within_one_check_interval() {
    let cluster = OneNodeCluster::start("sick-route").await;
    let client = cluster.manager.client();
    let dir = tempfile::tempdir().unwrap();
    let router = RouterProcess::start(
        &cluster.manager.address(),
        dir.path(),
        &["--domain", DOMAIN],
    );
    let interval = Duration::from_secs(1);
    submit(&client, &shop(2, "one", "1s")).await;
    let through = Through::new(&router, &[HOST]);
    through.await_copies(HOST, 2).await;

    // One copy's health check starts failing: its `/health` is gone.
    let job = client.get("/jobs/shop").await.body;
    let sick = live_tasks(&job)
        .into_iter()
        .find(|task| task["State"] == "Running")
        .unwrap();
    let container = sick["ContainerID"].as_str().unwrap().to_string();
    let sick_id = sick["ID"].as_str().unwrap().to_string();
    let removed = std::process::Command::new("docker")
        .args(["exec", &container, "rm", "/www/health"])
        .status()
        .unwrap();
    assert!(removed.success());
    let broken_at = Instant::now();

    // Gone from the manager's route, and so from the router's, within one interval (the
    // next probe fails) and what it takes to say so.
    let deadline = broken_at + interval * 3;
    loop {
        let listed = routes(&client).await;
        let backends = listed["web.shop"]["Backends"].as_array().unwrap().clone();
        if !backends.iter().any(|backend| backend["ID"] == sick_id) {
            break;
        }
        assert!(Instant::now() < deadline, "still routed: {backends:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let left_after = broken_at.elapsed();
    eprintln!("the failing copy left its route {left_after:?} after its /health was removed");
    // One interval until the probe that fails, and what it takes to say so; on a machine the
    // tests share, a second interval's slack (the copy is failed after 3 probes, 3 s).
    assert!(
        left_after <= interval * 2,
        "left after {left_after:?}, more than two check intervals ({interval:?} each)"
    );
    // Every request now goes to the healthy copy.
    let sick_host = String::from_utf8(
        std::process::Command::new("docker")
            .args(["exec", &container, "cat", "/www/who"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    for _ in 0..10 {
        let (status, who) = through.get(HOST, "/who").await.unwrap();
        assert_eq!(status, 200);
        assert_ne!(who, sick_host.trim(), "a request reached the failing copy");
    }
}

#[tokio::test]
async fn haproxy_fed_by_the_router_follows_a_scale_from_3_to_5_to_1_copies() {
    let cluster = OneNodeCluster::start("haproxy-route").await;
    let client = cluster.manager.client();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("haproxy.cfg");
    let socket = dir.path().join("admin.sock");
    let master = dir.path().join("master.sock");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut route_events = EventReader::open(&cluster.manager, "?topic=Route").await;
    let _router = {
        let mut args = vec!["--domain", DOMAIN, "--haproxy-config"];
        let (config, socket) = (config.to_str().unwrap(), socket.to_str().unwrap());
        // Reloads asked of HAProxy's master on its CLI socket (`haproxy -W -S`), which
        // `cube_test_support::Haproxy` starts it with.
        let master = master.to_str().unwrap();
        args.extend([config, "--haproxy-stats-socket", socket]);
        args.extend(["--haproxy-master-socket", master]);
        // Where HAProxy listens.
        args.extend(["--listen", &listen]);
        RouterProcess::start(&cluster.manager.address(), dir.path(), &args)
    };
    // The router writes the configuration of the routes it read; HAProxy starts on it.
    let deadline = Instant::now() + STATE_BOUND;
    while !config.exists() {
        assert!(Instant::now() < deadline, "no configuration written");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let haproxy = cube_test_support::Haproxy::start(&config, &socket);
    let backend = format!("route_{HOST}");

    submit(&client, &shop(3, "one", "250ms")).await;
    for count in [3usize, 5, 1] {
        if count != 3 {
            let scaled = client
                .post_raw(
                    "/jobs/shop/scale",
                    json!({"Group": "web", "Count": count}).to_string(),
                )
                .await;
            assert_eq!(scaled.status, 200, "{}", scaled.body);
        }
        // The manager's route reaches `count` copies: an event says so.
        let (changed_at, addresses) = loop {
            let event = route_events.next_event().await;
            let backends: std::collections::BTreeSet<String> = event["Object"]["Backends"]
                .as_array()
                .unwrap()
                .iter()
                .map(|backend| backend["Address"].as_str().unwrap().to_string())
                .collect();
            if event["Key"] == "web.shop" && backends.len() == count {
                break (Instant::now(), backends);
            }
        };
        // HAProxy's servers of the route are those copies soon after the change (the
        // issue's 1 s is measured by `cube-bench router`, on a machine the tests do not share).
        loop {
            if haproxy.servers(&backend).as_ref() == Ok(&addresses) {
                break;
            }
            assert!(
                changed_at.elapsed() < Duration::from_secs(5),
                "{count} copies: HAProxy's servers {:?}, not {addresses:?}, 5 s after the \
                 route changed; HAProxy's log:\n{}",
                haproxy.servers(&backend),
                haproxy.log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let followed = changed_at.elapsed();
        eprintln!("{count} copies: HAProxy followed the route {followed:?} after its event");
        // And requests through HAProxy reach exactly those copies.
        let http = reqwest::Client::builder()
            .resolve(HOST, format!("127.0.0.1:{port}").parse().unwrap())
            .build()
            .unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..(count * 4) {
            let answer = http
                .get(format!("http://{HOST}:{port}/who"))
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status(), 200);
            seen.insert(answer.text().await.unwrap());
        }
        assert_eq!(seen.len(), count, "{seen:?}");
    }
    // An unknown host: 404 from HAProxy, in JSON.
    let answer = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/"))
        .header("Host", "nothing.example.test")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 404);
    let body: Value = answer.json().await.unwrap();
    assert!(
        body["Message"]
            .as_str()
            .unwrap()
            .contains("nothing.example.test"),
        "{body}"
    );
}

/// The README's "Routing users to their services" session, command by command (the router
/// on free ports rather than 8080 and 9180, which the machine may use).
#[tokio::test]
async fn the_readme_router_session_works_as_written() {
    let cluster = OneNodeCluster::start("readme-route").await;
    let manager = cluster.manager.address();
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples");
    let (ok, out, err) = cube_cli(
        &manager,
        &["job", "run", &format!("{examples}/web-routed.yaml")],
    );
    assert!(ok, "{out}{err}");
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let router = RouterProcess::start(
        &manager,
        dir.path(),
        &["--listen", &listen, "--domain", "example.test"],
    );
    let curl = |host: &str, path: &str| {
        let output = std::process::Command::new("curl")
            .args([
                "-s",
                "-o",
                "/dev/stdout",
                "-w",
                "\n%{http_code}",
                "--resolve",
                &format!("{host}:{port}:127.0.0.1"),
                &format!("http://{host}:{port}{path}"),
            ])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&output.stdout).to_string();
        let (body, code) = text.rsplit_once('\n').unwrap_or_default();
        (code.to_string(), body.to_string())
    };
    // A healthy copy answers at the declared host, once the copies are up.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (code, body) = curl("web.example.test", "/");
        if code == "200" {
            assert!(body.contains("<"), "the sample server's page: {body}");
            break;
        }
        assert!(Instant::now() < deadline, "web.example.test: {code} {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (ok, out, err) = cube_cli(
        &manager,
        &["job", "run", &format!("{examples}/job-web.yaml")],
    );
    assert!(ok, "{out}{err}");
    loop {
        let (code, body) = curl("api.web.example.test", "/health");
        if code == "200" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "api.web.example.test: {code} {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (code, body) = curl("x.example.test", "/");
    assert_eq!(code, "404", "{body}");
    let metrics = reqwest::get(format!("{}/metrics", router.admin))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for route in ["web.site", "api.web"] {
        assert!(
            metrics
                .lines()
                .any(|line| line.starts_with("cube_router_requests_total") && line.contains(route)),
            "no requests counted for {route}: {metrics}"
        );
    }
}

/// With `--acl`: a `router` token reads the routes of every project and nothing else, and
/// `cube router --token` routes with it; every role of the chain may read the routes too.
#[tokio::test]
async fn a_router_token_reads_the_routes_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start_with("epvm", "memory", dir.path(), 0, &["--acl"]);
    let management = bootstrap(&manager).await;
    let router_token = token_in(&manager, &management, "router", &[]).await;
    let as_router = Client::with_token(&manager.url, &router_token);
    assert_eq!(as_router.get("/routes?project=*").await.status, 200);
    for (method, path) in [("GET", "/tasks"), ("GET", "/nodes"), ("GET", "/services")] {
        let answer = as_router.request_answer(method, path, None).await;
        assert_eq!(answer.status, 403, "{method} {path}: {}", answer.body);
    }
    let read = token_in(&manager, &management, "read", &["default"]).await;
    assert_eq!(
        Client::with_token(&manager.url, &read)
            .get("/routes")
            .await
            .status,
        200
    );
    // A router token is for every project: naming some is refused, saying why.
    let refused = Client::with_token(&manager.url, &management)
        .request_answer(
            "POST",
            "/acl/tokens",
            Some(&json!({"Role": "router", "Projects": ["team-a"]}).to_string()),
        )
        .await;
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert!(refused.message().contains("router"), "{}", refused.body);

    // The router with its token reaches a task's copy by the task's name.
    let _worker =
        join_with_node_token(&manager, &management, &unique_node("acl-route"), "memory").await;
    let admin = Client::with_token(&manager.url, &management);
    let answer = admin
        .request_answer("POST", "/tasks", Some(&web_task("shopfront").to_string()))
        .await;
    assert_eq!(answer.status, 201, "{}", answer.body);
    let router = RouterProcess::start(
        &manager.address(),
        dir.path(),
        &["--domain", DOMAIN, "--token", &router_token],
    );
    let through = Through::new(&router, &["shopfront.example.test"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok((200, _)) = through.get("shopfront.example.test", "/health").await {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no answer through the router; its log:\n{}",
            router.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A route that cannot be is refused at submission, naming the field.
#[tokio::test]
async fn a_route_that_cannot_be_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("epvm", "memory", dir.path(), 0);
    let client = manager.client();
    let mut task = web_task("shopfront");
    task["Route"] = json!({"Host": "Shop_Front.example.test"});
    let answer = client.post(&task).await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert!(answer.message().contains("Route.Host"), "{}", answer.body);
    task["Route"] = json!({"Port": 8080});
    let answer = client.post(&task).await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert!(
        answer.message().contains("Route.Port") && answer.message().contains("7777/tcp"),
        "{}",
        answer.body
    );
    task["Route"] = json!({"Hots": "shop.example.test"});
    let answer = client.post(&task).await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    let mut job = shop(1, "one", "1s");
    job["Groups"][0]["Task"]["Route"] = json!({"Host": "-shop.example.test"});
    let answer = client.post_raw("/jobs", job.to_string()).await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert!(answer.message().contains("Route.Host"), "{}", answer.body);
    // Nothing was accepted.
    assert_eq!(client.get("/routes").await.body, json!([]));
}

/// A host routes to one service: a second job or task declaring a host another routes
/// already is refused, naming who has it; the same job submitted again keeps its host, and
/// once the first is stopped the host is free.
#[tokio::test]
async fn a_host_another_job_routes_already_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let manager = ManagerProcess::start("epvm", "memory", dir.path(), 0);
    let client = manager.client();
    let with_host = |mut job: Value, name: &str| {
        job["Name"] = json!(name);
        job["Groups"][0]["Task"]["Route"] = json!({"Host": "shop.example.test"});
        job
    };
    // Submits job `name` at `version`, declaring the host.
    let submit_named = |name: &'static str, version: &'static str| {
        let (client, with_host) = (&client, &with_host);
        async move {
            client
                .post_raw("/jobs", with_host(shop(1, version, "1s"), name).to_string())
                .await
        }
    };
    let first = submit_named("shop", "one").await;
    assert_eq!(first.status, 201, "{}", first.body);

    let second = submit_named("outlet", "one").await;
    assert_eq!(second.status, 409, "{}", second.body);
    let message = second.message();
    assert!(
        message.contains("shop.example.test") && message.contains("job shop"),
        "{message}"
    );
    let mut task = web_task("kiosk");
    task["Route"] = json!({"Host": "shop.example.test"});
    let answer = client.post(&task).await;
    assert_eq!(answer.status, 409, "{}", answer.body);
    assert!(answer.message().contains("job shop"), "{}", answer.body);

    // Two groups of one job with one host.
    let mut twice = with_host(shop(1, "one", "1s"), "twice");
    let mut other = twice["Groups"][0].clone();
    other["Name"] = json!("admin");
    twice["Groups"].as_array_mut().unwrap().push(other);
    let answer = client.post_raw("/jobs", twice.to_string()).await;
    assert_eq!(answer.status, 409, "{}", answer.body);
    assert!(answer.message().contains("both declare"), "{}", answer.body);

    // The same job's new version keeps its host.
    let again = submit_named("shop", "two").await;
    assert!(again.status == 200 || again.status == 201, "{}", again.body);
    // Stopped, it routes nothing: the host is free for another.
    let stopped = client.delete("/jobs/shop").await;
    assert!(stopped.status < 300, "{}", stopped.body);
    let second = submit_named("outlet", "one").await;
    assert_eq!(second.status, 201, "{}", second.body);
}
