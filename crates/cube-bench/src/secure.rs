//! `cube-bench secure`: what `cube manager --acl --tls` costs, next to a manager without them,
//! in the same run.
//!
//! Two clusters on loopback, each a real `cube manager` on the persistent store and a real
//! `cube worker` on the Docker engine:
//! - **plain**: no flags; HTTP, no tokens;
//! - **secured**: `cube manager --acl --tls`; the ACL bootstrapped (`POST /acl/bootstrap`), a
//!   node token made (`POST /acl/tokens`, role `node`: it ends with the CA's fingerprint) and
//!   the worker started with `--join HOST:PORT --token TOKEN`, so that it gets its certificate
//!   from the manager and every call between them is mutual TLS with the worker-command
//!   token; the benchmark's client speaks HTTPS, trusts only the CA whose fingerprint the
//!   manager printed, and sends a `submit` token on every request.
//!
//! Measured, taking turns between the two:
//! - **submit → Running**: `POST /tasks` until `GET /tasks/{id}` reads `Running` (polled every
//!   2 ms), then the task stopped and its container waited for until gone (untimed), as
//!   `start-latency` does; each set gives p50/p95 per side and the ratio of the p50s;
//! - **one request's round trip** on the same clusters: `GET /health` (open: no token read)
//!   and `GET /nodes/{name}` (a token read and checked on the secured side) on the client's
//!   kept-alive connection, and `GET /health` on a new connection (a TCP connect, and on the
//!   secured side a full TLS handshake): which of handshakes and per-request work costs what;
//! - **durable submissions**, as `store`'s setup without workers: each run a fresh manager of
//!   each kind on a fresh data directory, and one with `--acl` alone (tokens over plain HTTP,
//!   to tell the tokens' share from TLS's), N clients (then one) posting distinct tasks for
//!   `--seconds`, then `kill -9`; acknowledged answers per second, the manager's CPU (in
//!   cores) and the clients' CPU per submission. Each side's clients share one HTTP client
//!   whose pool keeps connections alive, so a connection (and its handshake, on the secured
//!   side) serves request after request.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use cube_api::tls::{PeerRole, PinnedCaVerifier};
use cube_runtime::DockerRuntime;
use cube_runtime::sample_image::SAMPLE_IMAGE;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use serde_json::json;

use crate::events::{TICKS_PER_SECOND, cpu_ticks};
use crate::load::{DbType, ManagerProcess};
use crate::start_latency::cube_once;
use crate::store::{Submissions, submit_for};
use crate::{BenchCluster, ClusterOptions, Summary, Through, containers, load_average};

/// How the two sides are named in the tables.
const PLAIN: &str = "plain";
const SECURED: &str = "--acl --tls";

/// What `cube-bench secure` runs.
pub(crate) struct Options {
    /// Tasks each side starts in one set of submit → Running.
    pub(crate) runs: usize,
    /// Sets of submit → Running.
    pub(crate) sets: usize,
    /// Round trips of each kind each side makes.
    pub(crate) requests: usize,
    /// Runs of durable submissions of each side, for each client count.
    pub(crate) submit_runs: usize,
    /// How long one run of durable submissions lasts.
    pub(crate) seconds: u64,
    /// How many clients submit at once (a run with one client follows).
    pub(crate) concurrency: usize,
}

pub(crate) async fn secure(options: &Options, cube: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(options.runs > 0, "--runs must be at least 1");
    anyhow::ensure!(options.sets > 0, "--sets must be at least 1");
    anyhow::ensure!(options.requests > 0, "--requests must be at least 1");
    anyhow::ensure!(options.seconds > 0, "--seconds must be at least 1");
    anyhow::ensure!(options.concurrency > 0, "--concurrency must be at least 1");
    let runtime = DockerRuntime::connect().await?;
    runtime.ensure_sample_image(SAMPLE_IMAGE).await?;
    let docker = containers::connect().await?;
    let load_before = load_average();

    let plain = BenchCluster::start(cube, Through::Manager).await?;
    let secured_options = ClusterOptions {
        secure: true,
        ..ClusterOptions::default()
    };
    // A failure here drops `plain`: its processes are killed and its directory removed.
    let secured = BenchCluster::start_with(cube, Through::Manager, &secured_options).await?;
    let labels = [plain.container_label(), secured.container_label()];
    let outcome = on_clusters(&runtime, &plain, &secured, options).await;
    // Stops both managers and workers; whatever container they still had is swept below.
    drop(plain);
    drop(secured);
    for label in &labels {
        containers::sweep(&docker, label).await;
    }
    let (latency, round_trips) = outcome?;
    let durable = durable_submissions(cube, options).await?;

    print_latency(&latency, options);
    print_round_trips(&round_trips, options.requests);
    print_durable(&durable, options);
    println!();
    println!(
        "load average before: {load_before}; after: {}",
        load_average()
    );
    Ok(())
}

/// One set of submit → Running: each side's times, in ms.
struct LatencySet {
    plain: Vec<f64>,
    secured: Vec<f64>,
}

/// Round trips of one kind, each side's times in ms.
struct RoundTrips {
    what: &'static str,
    plain: Vec<f64>,
    secured: Vec<f64>,
}

/// What is measured on the two clusters while they run.
async fn on_clusters(
    runtime: &DockerRuntime,
    plain: &BenchCluster,
    secured: &BenchCluster,
    options: &Options,
) -> anyhow::Result<(Vec<LatencySet>, Vec<RoundTrips>)> {
    let mut sets = Vec::with_capacity(options.sets);
    for set in 0..options.sets {
        let mut times = LatencySet {
            plain: Vec::with_capacity(options.runs),
            secured: Vec::with_capacity(options.runs),
        };
        for run in 0..options.runs {
            let name = set * options.runs + run;
            // Each side goes first in turn, so neither always meets a Docker still busy
            // with the other's last container.
            if run % 2 == 0 {
                times
                    .plain
                    .push(cube_once(&plain.http, &plain.base, runtime, name).await?);
                times
                    .secured
                    .push(cube_once(&secured.http, &secured.base, runtime, name).await?);
            } else {
                times
                    .secured
                    .push(cube_once(&secured.http, &secured.base, runtime, name).await?);
                times
                    .plain
                    .push(cube_once(&plain.http, &plain.base, runtime, name).await?);
            }
        }
        let (plain_p50, secured_p50) = (
            Summary::of(&mut times.plain.clone()).median,
            Summary::of(&mut times.secured.clone()).median,
        );
        eprintln!(
            "set {}: {PLAIN} p50 {plain_p50:.1} ms, {SECURED} p50 {secured_p50:.1} ms",
            set + 1
        );
        sets.push(times);
    }
    let round_trips = round_trips(plain, secured, options.requests).await?;
    Ok((sets, round_trips))
}

/// `requests` round trips of each kind on each side, taking turns.
async fn round_trips(
    plain: &BenchCluster,
    secured: &BenchCluster,
    requests: usize,
) -> anyhow::Result<Vec<RoundTrips>> {
    let fingerprint = secured
        .ca_fingerprint
        .as_deref()
        .context("the secured cluster has no CA fingerprint")?;
    let mut kept_health = RoundTrips {
        what: "`GET /health` (open), kept-alive connection",
        plain: Vec::new(),
        secured: Vec::new(),
    };
    let mut kept_node = RoundTrips {
        what: "`GET /nodes/{name}` (token checked when secured), kept-alive connection",
        plain: Vec::new(),
        secured: Vec::new(),
    };
    let mut fresh = RoundTrips {
        what: "`GET /health` on a new connection (TCP connect; TLS handshake when secured)",
        plain: Vec::new(),
        secured: Vec::new(),
    };
    // On the connection each cluster's client keeps.
    for request in 0..requests {
        for secure in [request % 2 == 1, request % 2 == 0] {
            let cluster = if secure { secured } else { plain };
            let health = round_trip(&cluster.http, &format!("{}/health", cluster.base)).await?;
            let node = format!("{}/nodes/{}", cluster.base, cluster.node);
            let node = round_trip(&cluster.http, &node).await?;
            for (kind, ms) in [(&mut kept_health, health), (&mut kept_node, node)] {
                match secure {
                    true => kind.secured.push(ms),
                    false => kind.plain.push(ms),
                }
            }
        }
    }
    // Each on a new connection. The clients are made before the clock starts (only the
    // connection and the request are timed), and kept until the end, so that no connection
    // is being closed while another is timed.
    let mut clients = Vec::with_capacity(2 * requests);
    for request in 0..requests {
        for secure in [request % 2 == 1, request % 2 == 0] {
            let cluster = if secure { secured } else { plain };
            let client =
                manager_client(secure.then_some(fingerprint), None, Duration::from_secs(10))?;
            let ms = round_trip(&client, &format!("{}/health", cluster.base)).await?;
            match secure {
                true => fresh.secured.push(ms),
                false => fresh.plain.push(ms),
            }
            clients.push(client);
        }
    }
    drop(clients);
    Ok(vec![kept_health, kept_node, fresh])
}

/// `GET url`, refused unless 2xx; the time until the whole body is read, in ms.
async fn round_trip(http: &reqwest::Client, url: &str) -> anyhow::Result<f64> {
    let started = Instant::now();
    let answer = http
        .get(url)
        .send()
        .await
        .with_context(|| format!("GET {url}"))?;
    let status = answer.status();
    answer
        .bytes()
        .await
        .with_context(|| format!("reading GET {url}"))?;
    let elapsed = started.elapsed();
    anyhow::ensure!(status.is_success(), "GET {url} answered {status}");
    Ok(elapsed.as_secs_f64() * 1000.0)
}

/// The managers durable submissions are measured on: the two of the clusters, and `--acl`
/// alone, which tells the tokens' share from TLS's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Plain,
    Acl,
    AclTls,
}

impl Side {
    const ALL: [Side; 3] = [Side::Plain, Side::Acl, Side::AclTls];

    fn name(self) -> &'static str {
        match self {
            Side::Plain => PLAIN,
            Side::Acl => "--acl",
            Side::AclTls => SECURED,
        }
    }

    fn flags(self) -> &'static [&'static str] {
        match self {
            Side::Plain => &[],
            Side::Acl => &["--acl"],
            Side::AclTls => &["--acl", "--tls"],
        }
    }
}

/// One run of durable submissions.
struct Durable {
    /// Acknowledged answers per second.
    per_second: f64,
    /// Answers that were not 201.
    refused: usize,
    /// The manager's CPU time (user and system) over the run, in cores (CPU seconds per second).
    manager_cores: f64,
    /// This process's (the clients') CPU time over the run, per acknowledged submission, µs.
    clients_cpu_us: f64,
}

/// Durable submissions with one client count: each side's runs, in the order of
/// [`Side::ALL`].
struct DurableRuns {
    clients: usize,
    runs: [Vec<Durable>; Side::ALL.len()],
}

/// Runs of durable submissions with `--concurrency` clients, then with one; the sides take
/// turns going first.
async fn durable_submissions(cube: &Path, options: &Options) -> anyhow::Result<Vec<DurableRuns>> {
    let duration = Duration::from_secs(options.seconds);
    let mut results = Vec::new();
    for clients in [options.concurrency, 1] {
        let mut runs = DurableRuns {
            clients,
            runs: Default::default(),
        };
        for run in 0..options.submit_runs {
            for offset in 0..Side::ALL.len() {
                let index = (run + offset) % Side::ALL.len();
                let side = Side::ALL[index];
                let result = durable_once(cube, side, clients, duration).await?;
                eprintln!(
                    "{clients} clients, run {}/{}, {}: {:.0}/s, refused {}, manager CPU {:.2} \
                     cores, clients' CPU {:.0} µs per submission",
                    run + 1,
                    options.submit_runs,
                    side.name(),
                    result.per_second,
                    result.refused,
                    result.manager_cores,
                    result.clients_cpu_us
                );
                runs.runs[index].push(result);
            }
        }
        results.push(runs);
    }
    Ok(results)
}

/// One run: a fresh manager on the persistent store with `side`'s flags, no worker, `clients`
/// clients submitting for `duration`, then `kill -9`.
async fn durable_once(
    cube: &Path,
    side: Side,
    clients: usize,
    duration: Duration,
) -> anyhow::Result<Durable> {
    let data_dir = tempfile::tempdir()?;
    let mut flags = vec!["-d", DbType::Persistent.as_arg()];
    flags.extend(side.flags());
    let manager = ManagerProcess::start_with(cube, data_dir.path(), 0, &flags).await?;
    let fingerprint = manager.ca_fingerprint.clone();
    anyhow::ensure!(
        fingerprint.is_some() == (side == Side::AclTls),
        "cube manager {:?} printed a CA fingerprint: {fingerprint:?}",
        side.flags()
    );
    // As `store` builds its client (a 30 s timeout, reqwest's pool), with the manager's TLS
    // settings and a submit token where it needs them.
    let timeout = Duration::from_secs(30);
    let token = match side {
        Side::Plain => None,
        Side::Acl | Side::AclTls => {
            let access = AclAccess::bootstrap(&manager.base, fingerprint.as_deref()).await?;
            Some(access.token(&manager.base, "submit", "cube-bench").await?)
        }
    };
    let http = manager_client(fingerprint.as_deref(), token.as_deref(), timeout)?;
    let base = manager.base.clone();
    let (manager_pid, own_pid) = (manager.pid, std::process::id());
    let (manager_before, own_before) = (cpu_ticks(manager_pid)?, cpu_ticks(own_pid)?);
    // The manager's CPU time is read just before it is killed.
    let kill = async move {
        let ticks = cpu_ticks(manager_pid)?;
        manager.kill().await?;
        Ok(ticks)
    };
    let (
        Submissions {
            acknowledged,
            refused,
        },
        manager_after,
    ) = submit_for(&http, &base, clients, duration, kill).await?;
    let own_after = cpu_ticks(own_pid)?;
    let seconds = |ticks: u64| ticks as f64 / TICKS_PER_SECOND;
    let clients_cpu = seconds(own_after.saturating_sub(own_before));
    Ok(Durable {
        per_second: acknowledged.len() as f64 / duration.as_secs_f64(),
        refused,
        manager_cores: seconds(manager_after.saturating_sub(manager_before))
            / duration.as_secs_f64(),
        clients_cpu_us: clients_cpu * 1e6 / acknowledged.len().max(1) as f64,
    })
}

/// A `cube manager --acl` (with or without `--tls`) as its first user meets it: the CA it
/// pins with `--tls`, and the management token the bootstrap gave.
pub(crate) struct AclAccess {
    pub(crate) fingerprint: Option<String>,
    management: reqwest::Client,
}

impl AclAccess {
    /// `POST /acl/bootstrap` (no token) to the manager at `base`, over HTTPS verified against
    /// the CA of `fingerprint` when there is one, as `cube acl bootstrap [--ca-fingerprint]`
    /// does.
    pub(crate) async fn bootstrap(
        base: &str,
        fingerprint: Option<&str>,
    ) -> anyhow::Result<AclAccess> {
        let timeout = Duration::from_secs(10);
        let open = manager_client(fingerprint, None, timeout)?;
        let management = created_secret(&open, &format!("{base}/acl/bootstrap"), &json!({}))
            .await
            .context("bootstrapping the ACL")?;
        Ok(AclAccess {
            fingerprint: fingerprint.map(str::to_string),
            management: manager_client(fingerprint, Some(&management), timeout)?,
        })
    }

    /// A new token of `role` named `name` (`POST /acl/tokens`, as `cube token create`); its
    /// text. A `node` token of a TLS manager ends with the CA's fingerprint.
    pub(crate) async fn token(&self, base: &str, role: &str, name: &str) -> anyhow::Result<String> {
        created_secret(
            &self.management,
            &format!("{base}/acl/tokens"),
            &json!({"Role": role, "Name": name}),
        )
        .await
        .with_context(|| format!("making a {role} token"))
    }
}

/// `POST url` with `body`, refused unless 201; the `Secret` of the token it made.
async fn created_secret(
    http: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
) -> anyhow::Result<String> {
    let answer = http
        .post(url)
        .json(body)
        .send()
        .await
        .with_context(|| format!("POST {url}"))?;
    let status = answer.status();
    let text = answer
        .text()
        .await
        .with_context(|| format!("reading POST {url}"))?;
    anyhow::ensure!(
        status.as_u16() == 201,
        "POST {url} answered {status}: {text}"
    );
    let created: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("POST {url}: {text}"))?;
    Ok(created["Secret"]
        .as_str()
        .with_context(|| format!("POST {url} gave no Secret"))?
        .to_string())
}

/// A client of a manager: over HTTPS trusting only a manager certificate of the CA of
/// `fingerprint` when there is one (as the CLI with `--ca-fingerprint`), plain HTTP
/// otherwise; sending `token` as `Authorization: Bearer` on every request when there is one.
/// It keeps its connections alive as any `reqwest` client. Each call makes new TLS settings,
/// so a new client's first connection is a full handshake.
pub(crate) fn manager_client(
    fingerprint: Option<&str>,
    token: Option<&str>,
    timeout: Duration,
) -> anyhow::Result<reqwest::Client> {
    let mut headers = HeaderMap::new();
    if let Some(token) = token {
        let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
            .context("a token that is not a header value")?;
        value.set_sensitive(true);
        headers.insert(AUTHORIZATION, value);
    }
    let mut builder = reqwest::Client::builder()
        .default_headers(headers)
        .timeout(timeout);
    if let Some(fingerprint) = fingerprint {
        let verifier = PinnedCaVerifier::new(fingerprint, Some(PeerRole::Manager))?;
        let config = cube_api::tls::client_config(verifier, None)?;
        builder = builder.tls_backend_preconfigured((*config).clone());
    }
    Ok(builder.build()?)
}

fn print_latency(sets: &[LatencySet], options: &Options) {
    println!(
        "submit → Running: {} sets of {} tasks each side, one at a time, taking turns, image \
         {SAMPLE_IMAGE}; a real manager and worker on the persistent store each, {PLAIN} (HTTP, \
         no tokens) and {SECURED} (HTTPS to the manager with a submit token, mutual TLS \
         manager ↔ worker)",
        options.sets, options.runs
    );
    println!();
    println!(
        "| set | {PLAIN} p50 ms | {PLAIN} p95 ms | {SECURED} p50 ms | {SECURED} p95 ms | ratio of \
         p50s, {SECURED} / {PLAIN} |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let (mut plain_p50, mut plain_p95, mut secured_p50, mut secured_p95, mut ratios) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (number, set) in sets.iter().enumerate() {
        let plain = Summary::of(&mut set.plain.clone());
        let secured = Summary::of(&mut set.secured.clone());
        let ratio = secured.median / plain.median;
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {ratio:.3} |",
            number + 1,
            plain.median,
            plain.p95,
            secured.median,
            secured.p95
        );
        plain_p50.push(plain.median);
        plain_p95.push(plain.p95);
        secured_p50.push(secured.median);
        secured_p95.push(secured.p95);
        ratios.push(ratio);
    }
    println!();
    println!("| over {} sets | median | min | max |", sets.len());
    println!("|---|---:|---:|---:|");
    println!(
        "| {PLAIN} p50 ms | {} |",
        Summary::of(&mut plain_p50).spread(1)
    );
    println!(
        "| {PLAIN} p95 ms | {} |",
        Summary::of(&mut plain_p95).spread(1)
    );
    println!(
        "| {SECURED} p50 ms | {} |",
        Summary::of(&mut secured_p50).spread(1)
    );
    println!(
        "| {SECURED} p95 ms | {} |",
        Summary::of(&mut secured_p95).spread(1)
    );
    println!(
        "| ratio of p50s, {SECURED} / {PLAIN} | {} |",
        Summary::of(&mut ratios).spread(3)
    );
}

fn print_round_trips(kinds: &[RoundTrips], requests: usize) {
    println!();
    println!(
        "one request's round trip on the same two managers, {requests} of each kind each side, \
         taking turns, until the whole body is read"
    );
    println!();
    println!(
        "| request | {PLAIN} p50 ms | {PLAIN} p95 ms | {SECURED} p50 ms | {SECURED} p95 ms | \
         {SECURED} − {PLAIN}, p50 ms |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for kind in kinds {
        let plain = Summary::of(&mut kind.plain.clone());
        let secured = Summary::of(&mut kind.secured.clone());
        println!(
            "| {} | {:.3} | {:.3} | {:.3} | {:.3} | {:+.3} |",
            kind.what,
            plain.median,
            plain.p95,
            secured.median,
            secured.p95,
            secured.median - plain.median
        );
    }
}

fn print_durable(results: &[DurableRuns], options: &Options) {
    if options.submit_runs == 0 {
        return;
    }
    println!();
    println!(
        "durable submissions: a fresh cube manager per run on the persistent store, no worker \
         (tasks stay Pending), {} runs of {} s each side, taking turns; each side's clients \
         share one HTTP client (connections kept alive; a submit token with --acl, HTTPS with \
         --tls)",
        options.submit_runs, options.seconds
    );
    println!();
    println!(
        "| clients | manager | median acked/s | min | max | ratio to {PLAIN}, same run (median) \
         | min | max | manager CPU, cores (median) | clients' CPU per submission, µs (median) \
         | refused |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for result in results {
        let plain: Vec<f64> = result.runs[0].iter().map(|run| run.per_second).collect();
        for (side, runs) in Side::ALL.iter().zip(&result.runs) {
            let mut rates: Vec<f64> = runs.iter().map(|run| run.per_second).collect();
            // Each run's sides ran one after another: their ratio, run by run.
            let mut ratios: Vec<f64> = rates
                .iter()
                .zip(&plain)
                .map(|(rate, plain)| rate / plain)
                .collect();
            let mut manager_cpu: Vec<f64> = runs.iter().map(|run| run.manager_cores).collect();
            let mut clients_cpu: Vec<f64> = runs.iter().map(|run| run.clients_cpu_us).collect();
            let refused: usize = runs.iter().map(|run| run.refused).sum();
            let rate = Summary::of(&mut rates);
            let ratios = match side {
                Side::Plain => "— | — | —".to_string(),
                _ => Summary::of(&mut ratios).spread(3),
            };
            println!(
                "| {} | {} | {:.0} | {:.0} | {:.0} | {ratios} | {:.2} | {:.0} | {refused} |",
                result.clients,
                side.name(),
                rate.median,
                rate.min,
                rate.max,
                Summary::of(&mut manager_cpu).median,
                Summary::of(&mut clients_cpu).median
            );
        }
    }
}
