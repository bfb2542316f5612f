//! `cube-bench router`: one copy of a small keep-alive HTTP server (`copy/copy.rs`, built here
//! with `rustc` as a statically linked binary and imported as an image: busybox `httpd`
//! closes every connection and would be what is measured) reached three ways by the same load
//! generator (Debian's `wrk`, same threads, connections and duration), taking turns in each
//! run: directly at its published port, through `cube router`, and through a real HAProxy
//! whose configuration a second `cube router --haproxy-config` keeps in step with the same
//! routes. Requests per second and p50/p99 latency each; the router's p50 overhead over the
//! direct path and its throughput next to HAProxy's.
//!
//!
//! Then the time from a copy becoming healthy to its first request through the router: the
//! job is scaled from 1 to 2 copies while a client asks the router in a loop; from the moment
//! the benchmark reads the manager's event saying the new copy is healthy to the first answer
//! written by that copy (each copy answers `/who` with its container's host name).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::{BenchCluster, Summary, Through};

const DOMAIN: &str = "bench.test";
/// The copy's image, built by [`build_copy_image`].
const COPY_IMAGE: &str = "cube-bench-copy:latest";
/// The copy's server, std only.
const COPY_SOURCE: &str = include_str!("../copy/copy.rs");
const JOB: &str = "route-bench";
const GROUP: &str = "api";
/// The route's host: `<group>.<job>.<domain>`.
const HOST: &str = "api.route-bench.bench.test";

pub(crate) struct Options {
    pub runs: usize,
    pub seconds: u64,
    /// wrk's connection counts, each measured in every run: 1 (one request at a time: the
    /// latency a proxy adds) and more (throughput, queueing included).
    pub connections: Vec<usize>,
    pub threads: usize,
    pub scale_runs: usize,
}

/// What one `wrk` run measured.
#[derive(Debug, Clone, Copy)]
struct Load {
    requests_per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
}

pub(crate) async fn router(options: Options, cube: &Path) -> anyhow::Result<()> {
    check_wrk().await?;
    cube_test_support::haproxy_binary();
    build_copy_image().await?;
    let cluster = BenchCluster::start(cube, Through::Manager).await?;
    submit(&cluster, 1).await?;
    let direct = await_copies(&cluster, 1).await?;
    let direct = direct
        .first()
        .cloned()
        .context("the copy's published address")?;

    let dir = tempfile::tempdir()?;
    let manager = cluster.base.trim_start_matches("http://").to_string();
    let (mut router, router_url) = spawn_router(cube, &manager, dir.path(), &[]).await?;

    // HAProxy, fed by a second router from the same routes.
    let haproxy_port = free_port()?;
    let config = dir.path().join("haproxy.cfg");
    let socket = dir.path().join("admin.sock");
    let master = dir.path().join("master.sock");
    let listen = format!("127.0.0.1:{haproxy_port}");
    let (mut feeder, _) = spawn_router(
        cube,
        &manager,
        dir.path(),
        &[
            "--listen",
            &listen,
            "--haproxy-config",
            path_str(&config)?,
            "--haproxy-stats-socket",
            path_str(&socket)?,
            "--haproxy-master-socket",
            path_str(&master)?,
        ],
    )
    .await?;
    await_file(&config).await?;
    let haproxy = cube_test_support::Haproxy::start(&config, &socket);
    let haproxy_url = format!("http://{listen}");
    await_answer(&router_url).await?;
    await_answer(&haproxy_url).await?;

    println!(
        "# cube-bench router: {} runs of {} s each way and connection count, wrk -t{} -c{:?} \
         --latency, GET /index.html with Host: {HOST}; load average {}",
        options.runs,
        options.seconds,
        options.threads,
        options.connections,
        crate::load_average()
    );
    let ways = [
        ("direct", format!("http://{direct}")),
        ("cube router", router_url.clone()),
        ("HAProxy", haproxy_url.clone()),
    ];
    let mut errors = 0;
    for &connections in &options.connections {
        println!();
        println!("| run | connections | way | requests/s | p50 ms | p99 ms | errors |");
        println!("|---|---|---|---|---|---|---|");
        let mut measured: Vec<Vec<Load>> = vec![Vec::new(); ways.len()];
        for run in 1..=options.runs {
            for (n, (way, url)) in ways.iter().enumerate() {
                let load = wrk(url, connections, &options).await?;
                println!(
                    "| {run} | {connections} | {way} | {:.0} | {:.3} | {:.3} | {} |",
                    load.requests_per_second, load.p50_ms, load.p99_ms, load.errors
                );
                measured[n].push(load);
            }
        }
        let per_run = |f: &dyn Fn(usize) -> f64| -> Summary {
            let mut values: Vec<f64> = (0..options.runs).map(f).collect();
            Summary::of(&mut values)
        };
        println!();
        println!("| {connections} connection(s), per run | median | min | max |");
        println!("|---|---|---|---|");
        println!(
            "| cube router p50 − direct p50 (ms) | {} |",
            per_run(&|run| measured[1][run].p50_ms - measured[0][run].p50_ms).spread(3)
        );
        println!(
            "| HAProxy p50 − direct p50 (ms) | {} |",
            per_run(&|run| measured[2][run].p50_ms - measured[0][run].p50_ms).spread(3)
        );
        println!(
            "| cube router p99 − direct p99 (ms) | {} |",
            per_run(&|run| measured[1][run].p99_ms - measured[0][run].p99_ms).spread(3)
        );
        println!(
            "| cube router requests/s ÷ HAProxy's | {} |",
            per_run(
                &|run| measured[1][run].requests_per_second / measured[2][run].requests_per_second
            )
            .ratios()
        );
        errors += measured
            .iter()
            .flatten()
            .map(|load| load.errors)
            .sum::<u64>();
    }
    if errors > 0 {
        bail!("{errors} requests failed (wrk's non-2xx or socket errors); see the table");
    }

    // HAProxy following the route: scaled 1 → 3 → 5 → 1.
    let backend = format!("route_{HOST}");
    println!();
    println!(
        "| HAProxy fed by cube router: from the manager's Route event with the new copies \
         (read by this process) to HAProxy's servers being them, ms | scaled to | ms |"
    );
    println!("|---|---|---|");
    for count in [3, 5, 1] {
        let followed = haproxy_follows(&cluster, &haproxy, &backend, count).await?;
        println!("| | {count} copies | {followed:.1} |");
    }

    // From healthy to traffic.
    let mut to_traffic = Vec::new();
    for _ in 0..options.scale_runs {
        to_traffic.push(healthy_to_traffic(&cluster, &router_url).await?);
        scale(&cluster, 1).await?;
        await_copies(&cluster, 1).await?;
    }
    if !to_traffic.is_empty() {
        println!();
        println!(
            "| from a copy healthy (the manager's event read) to its first answer through \
             cube router, ms | median | p95 | min | max |"
        );
        println!("|---|---|---|---|---|");
        println!(
            "| {} scale-ups from 1 to 2 copies | {} |",
            to_traffic.len(),
            Summary::of(&mut to_traffic)
        );
    }
    drop(haproxy);
    let _ = feeder.kill().await;
    let _ = router.kill().await;
    cluster
        .stop_and_sweep(&crate::containers::connect().await?)
        .await;
    Ok(())
}

/// Builds [`COPY_IMAGE`]: `copy.rs` compiled by `rustc` (there wherever Cube is built) into
/// a statically linked binary, alone in the image's root with an empty `/etc` (Docker mounts
/// the container's `hostname` there).
async fn build_copy_image() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let source = dir.path().join("copy.rs");
    std::fs::write(&source, COPY_SOURCE)?;
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("etc"))?;
    let built = tokio::process::Command::new("rustc")
        .args([
            "--edition",
            "2021",
            "-O",
            "-C",
            "target-feature=+crt-static",
            "-o",
        ])
        .arg(root.join("copy"))
        .arg(&source)
        .output()
        .await
        .context("running rustc to build the copy's server")?;
    if !built.status.success() {
        bail!(
            "rustc could not build the copy's server: {}",
            String::from_utf8_lossy(&built.stderr)
        );
    }
    let tarball = dir.path().join("copy.tar");
    let packed = tokio::process::Command::new("tar")
        .arg("-C")
        .arg(&root)
        .arg("-cf")
        .arg(&tarball)
        .arg(".")
        .status()
        .await?;
    if !packed.success() {
        bail!("tar of the copy's root failed: {packed}");
    }
    let imported = tokio::process::Command::new("docker")
        .args(["import", "--change", "CMD [\"/copy\", \"7777\"]"])
        .arg(&tarball)
        .arg(COPY_IMAGE)
        .output()
        .await
        .context("running docker import")?;
    if !imported.status.success() {
        bail!(
            "docker import of the copy's image failed: {}",
            String::from_utf8_lossy(&imported.stderr)
        );
    }
    Ok(())
}

/// `wrk` is there, or the way to get it.
async fn check_wrk() -> anyhow::Result<()> {
    let found = tokio::process::Command::new("wrk")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
    match found {
        // `wrk --version` prints its usage and exits 1: it ran.
        Ok(_) => Ok(()),
        Err(err) => bail!("cannot run wrk ({err}): install it (scripts/setup.sh)"),
    }
}

fn path_str(path: &Path) -> anyhow::Result<&str> {
    path.to_str()
        .with_context(|| format!("{} is not UTF-8", path.display()))
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The job: `count` copies of the copy server, each answering `/who` with its host name,
/// probed on `/health` every 250 ms.
fn job(count: usize) -> Value {
    json!({"Name": JOB, "Type": "service",
           "Groups": [{"Name": GROUP, "Count": count,
                       "Task": {"Image": COPY_IMAGE, "Cmd": ["/copy", "7777"],
                                "ExposedPorts": {"7777/tcp": {}},
                                "PortBindings": {"7777/tcp": "127.0.0.1:"},
                                "HealthCheck": "/health", "HealthCheckInterval": "250ms"}}]})
}

async fn submit(cluster: &BenchCluster, count: usize) -> anyhow::Result<()> {
    let answer = cluster
        .http
        .post(format!("{}/jobs", cluster.base))
        .json(&job(count))
        .send()
        .await?;
    if !answer.status().is_success() {
        bail!("POST /jobs: {} {}", answer.status(), answer.text().await?);
    }
    Ok(())
}

async fn scale(cluster: &BenchCluster, count: usize) -> anyhow::Result<()> {
    let answer = cluster
        .http
        .post(format!("{}/jobs/{JOB}/scale", cluster.base))
        .json(&json!({"Group": GROUP, "Count": count}))
        .send()
        .await?;
    if !answer.status().is_success() {
        bail!("scale: {} {}", answer.status(), answer.text().await?);
    }
    Ok(())
}

/// The manager's route of the job, once it has exactly `count` copies: their addresses.
async fn await_copies(cluster: &BenchCluster, count: usize) -> anyhow::Result<Vec<String>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let routes: Value = cluster
            .http
            .get(format!("{}/routes", cluster.base))
            .send()
            .await?
            .json()
            .await?;
        let addresses: Vec<String> = routes
            .as_array()
            .into_iter()
            .flatten()
            .filter(|route| route["Job"] == JOB)
            .flat_map(|route| route["Backends"].as_array().cloned().unwrap_or_default())
            .filter_map(|backend| backend["Address"].as_str().map(str::to_string))
            .collect();
        if addresses.len() == count {
            return Ok(addresses);
        }
        if Instant::now() > deadline {
            bail!("the route has {addresses:?}, not {count} copies, after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts `cube router -m MANAGER --domain bench.test` with `extra` (its own `--listen`
/// 127.0.0.1:0 unless `extra` has one); its first line says where it listens.
async fn spawn_router(
    cube: &Path,
    manager: &str,
    dir: &Path,
    extra: &[&str],
) -> anyhow::Result<(tokio::process::Child, String)> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("router.log"))?;
    let mut command = tokio::process::Command::new(cube);
    command.args([
        "router",
        "-m",
        manager,
        "--domain",
        DOMAIN,
        "--admin",
        "127.0.0.1:0",
    ]);
    if !extra.contains(&"--listen") {
        command.args(["--listen", "127.0.0.1:0"]);
    }
    let mut child = command
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .context("starting cube router")?;
    let stdout = child.stdout.take().context("the router's stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).await?;
    let url = cube_api::address_in_listening_line(&line)
        .with_context(|| format!("cube router printed {line:?}"))?
        .trim_end_matches([',', ')'])
        .to_string();
    Ok((child, url))
}

async fn await_file(path: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        if Instant::now() > deadline {
            bail!("{} was not written within 20 s", path.display());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

fn client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .no_proxy()
        .build()?)
}

/// Waits until `url` answers 200 for the route's host (the routes reached it).
async fn await_answer(url: &str) -> anyhow::Result<()> {
    let http = client()?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(answer) = http
            .get(format!("{url}/who"))
            .header("Host", HOST)
            .send()
            .await
            && answer.status() == 200
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{url} did not answer for {HOST} within 20 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wrk(url: &str, connections: usize, options: &Options) -> anyhow::Result<Load> {
    let output = tokio::process::Command::new("wrk")
        .args([
            &format!("-t{}", options.threads),
            &format!("-c{connections}"),
            &format!("-d{}s", options.seconds),
            "--latency",
            "-H",
            &format!("Host: {HOST}"),
            &format!("{url}/index.html"),
        ])
        .output()
        .await
        .context("running wrk")?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "wrk failed ({}): {text}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let load = parse_wrk(&text).with_context(|| format!("reading wrk's output: {text}"))?;
    if load.errors > 0 {
        eprintln!("wrk {url}, with errors:\n{text}");
    }
    Ok(load)
}

/// Requests/s, the 50th and 99th percentiles and the errors from `wrk --latency`'s output.
fn parse_wrk(text: &str) -> Option<Load> {
    let mut load = Load {
        requests_per_second: 0.0,
        p50_ms: f64::NAN,
        p99_ms: f64::NAN,
        errors: 0,
    };
    for line in text.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["Requests/sec:", value] => load.requests_per_second = value.parse().ok()?,
            ["50%", value] => load.p50_ms = wrk_ms(value)?,
            ["99%", value] => load.p99_ms = wrk_ms(value)?,
            ["Non-2xx", "or", "3xx", "responses:", value] => {
                load.errors += value.parse::<u64>().ok()?
            }
            ["Socket", "errors:", rest @ ..] => {
                // `Socket errors: connect 0, read 0, write 0, timeout 0`
                load.errors += rest
                    .iter()
                    .filter_map(|word| word.trim_end_matches(',').parse::<u64>().ok())
                    .sum::<u64>();
            }
            _ => {}
        }
    }
    (load.requests_per_second > 0.0 && load.p50_ms.is_finite() && load.p99_ms.is_finite())
        .then_some(load)
}

/// One of wrk's durations (`123.00us`, `1.20ms`, `2.00s`) in ms.
fn wrk_ms(text: &str) -> Option<f64> {
    let (number, factor) = if let Some(number) = text.strip_suffix("us") {
        (number, 0.001)
    } else if let Some(number) = text.strip_suffix("ms") {
        (number, 1.0)
    } else if let Some(number) = text.strip_suffix('s') {
        (number, 1000.0)
    } else {
        return None;
    };
    number.parse::<f64>().ok().map(|value| value * factor)
}

/// Scales the job to `count` copies; from the manager's `Route` event that lists them (as
/// this process reads it) to HAProxy's `show servers state` listing them, in ms.
async fn haproxy_follows(
    cluster: &BenchCluster,
    haproxy: &cube_test_support::Haproxy,
    backend: &str,
    count: usize,
) -> anyhow::Result<f64> {
    let mut events = Events::open(cluster, "topic=Route").await?;
    scale(cluster, count).await?;
    let (changed_at, addresses) = events
        .first(&format!("a route of {count} copies"), |event| {
            let addresses: BTreeSet<String> = event["Object"]["Backends"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|backend| backend["Address"].as_str().map(str::to_string))
                .collect();
            (event["Object"]["Job"] == JOB && addresses.len() == count).then_some(addresses)
        })
        .await?;
    loop {
        if haproxy.servers(backend).as_ref() == Ok(&addresses) {
            return Ok(changed_at.elapsed().as_secs_f64() * 1000.0);
        }
        if changed_at.elapsed() > Duration::from_secs(30) {
            bail!(
                "HAProxy's servers {:?} are not {addresses:?} 30 s after the route changed",
                haproxy.servers(backend)
            );
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Scales from 1 to 2 copies while a client asks the router in a loop; the time from the
/// manager's event saying the new copy is healthy (read by this process) to its first
/// answer through the router, in ms.
async fn healthy_to_traffic(cluster: &BenchCluster, router_url: &str) -> anyhow::Result<f64> {
    let before: BTreeSet<String> = answering_hosts(router_url, 8).await?;
    let mut events = Events::open(cluster, &format!("topic=Task&job={JOB}")).await?;
    // The client's loop, from now on, noting when each host name first answered.
    // Each host name the first time it answers, with when, sent as it happens.
    let (first_answers, mut answered) = tokio::sync::mpsc::unbounded_channel();
    let stop = Arc::new(AtomicBool::new(false));
    let asking = {
        let (stop, url) = (stop.clone(), router_url.to_string());
        let http = client()?;
        tokio::spawn(async move {
            let mut seen: BTreeSet<String> = BTreeSet::new();
            while !stop.load(Ordering::Relaxed) {
                if let Ok(answer) = http
                    .get(format!("{url}/who"))
                    .header("Host", HOST)
                    .send()
                    .await
                    && let Ok(who) = answer.text().await
                {
                    let who = who.trim().to_string();
                    if seen.insert(who.clone())
                        && first_answers.send((who, Instant::now())).is_err()
                    {
                        return;
                    }
                }
            }
        })
    };
    scale(cluster, 2).await?;
    let (healthy_at, container) = events
        .first("a new healthy copy", |event| {
            let task = &event["Object"];
            let container = task["ContainerID"].as_str()?;
            (task["Health"] == "Healthy"
                && task["State"] == "Running"
                && !before
                    .iter()
                    .any(|host| container.starts_with(host.as_str())))
            .then(|| container.to_string())
        })
        .await?;
    let deadline = tokio::time::Instant::from_std(healthy_at + Duration::from_secs(2));
    let answered_at = loop {
        match tokio::time::timeout_at(deadline, answered.recv()).await {
            Ok(Some((host, at))) if container.starts_with(host.as_str()) => break Some(at),
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break None,
        }
    };
    stop.store(true, Ordering::Relaxed);
    asking.await?;
    let Some(answered_at) = answered_at else {
        bail!("the new copy {container} answered no request through the router within 2 s");
    };
    Ok(answered_at
        .saturating_duration_since(healthy_at)
        .as_secs_f64()
        * 1000.0)
}

/// The manager's event stream (`GET /events?QUERY`), read line by line.
struct Events {
    response: reqwest::Response,
    buffer: Vec<u8>,
}

impl Events {
    async fn open(cluster: &BenchCluster, query: &str) -> anyhow::Result<Events> {
        let response = cluster
            .http
            .get(format!("{}/events?{query}", cluster.base))
            .timeout(Duration::from_secs(180))
            .send()
            .await?;
        Ok(Events {
            response,
            buffer: Vec::new(),
        })
    }

    /// The first event `wanted` takes (within 60 s), with the moment this process read it.
    async fn first<T>(
        &mut self,
        what: &str,
        mut wanted: impl FnMut(&Value) -> Option<T>,
    ) -> anyhow::Result<(Instant, T)> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            while let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                if let Ok(event) = serde_json::from_slice::<Value>(&line)
                    && let Some(found) = wanted(&event)
                {
                    return Ok((Instant::now(), found));
                }
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            let chunk = tokio::time::timeout(remaining, self.response.chunk())
                .await
                .with_context(|| format!("no event of {what} within 60 s"))??
                .context("the event stream ended")?;
            self.buffer.extend_from_slice(&chunk);
        }
    }
}

/// The host names that answer `/who` through the router in `requests` requests.
async fn answering_hosts(router_url: &str, requests: usize) -> anyhow::Result<BTreeSet<String>> {
    let http = client()?;
    let mut hosts = BTreeSet::new();
    for _ in 0..requests {
        let who = http
            .get(format!("{router_url}/who"))
            .header("Host", HOST)
            .send()
            .await?
            .text()
            .await?;
        hosts.insert(who.trim().to_string());
    }
    Ok(hosts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrk_output_is_read() {
        let text = "Running 5s test @ http://127.0.0.1:8080/index.html
  1 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   310.12us  100.00us   5.00ms   90.00%
  Latency Distribution
     50%  287.00us
     75%  320.00us
     90%  400.00us
     99%    1.20ms
  250000 requests in 5.00s, 50.00MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 4
Requests/sec:  50000.12
Transfer/sec:     10.00MB
";
        let load = parse_wrk(text).unwrap();
        assert_eq!(load.requests_per_second, 50000.12);
        assert!((load.p50_ms - 0.287).abs() < 1e-9);
        assert!((load.p99_ms - 1.2).abs() < 1e-9);
        assert_eq!(load.errors, 7);
        assert!(parse_wrk("nothing").is_none());
    }
}
