//! `cube worker`: runs tasks as Docker containers on this machine.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use cube_api::ApiClient;
use cube_runtime::DockerRuntime;
use cube_types::duration::parse_duration;
use cube_types::node::parse_label;
use cube_types::size::parse_size;
use cube_types::{Labels, Resources, Task};
use cube_worker::config::ConfigFile;
use cube_worker::{Heartbeat, StatsCollector, Worker, WorkerConfig};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::stores::{OpenedStores, StoreArgs, StoreOwner};

/// Run a worker: the agent that runs tasks as Docker containers on this machine.
///
/// The worker serves its API (POST/GET /tasks, GET/DELETE /tasks/{id}, GET /stats, GET /node)
/// on HOST:PORT. With --manager it registers with that manager and sends it a heartbeat with
/// its stats every --heartbeat-interval; without, a manager can list it with -w. It offers
/// the whole machine to tasks unless --cpus, --memory or --disk say less; --label KEY=VALUE
/// (repeatable) labels the node for task constraints (`label.zone = eu`). Containers keep
/// running when the worker stops; a worker started again with the persistent store re-adopts
/// them. SIGINT or SIGTERM stop it cleanly.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube worker -n w1 -p 5556 --manager 127.0.0.1:5555\n  \
    cube worker -n small -p 5557 --manager 127.0.0.1:5555 --cpus 1 --memory 512MiB\n  \
    cube worker -n eu1 -p 5558 --manager 127.0.0.1:5555 --label zone=eu --label disk=ssd\n  \
    cube worker -n w1 -p 5556 -d memory       # then: cube manager -w 127.0.0.1:5556\n  \
    cube worker -n w1 --manager 127.0.0.1:5555 --config /etc/cube/worker.yaml")]
pub struct WorkerArgs {
    /// Address to listen on.
    #[arg(short = 'H', long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 picks a free one; the address is printed).
    #[arg(short, long, default_value_t = 5556)]
    port: u16,
    /// The node's name, in container labels and task records [default: the host name].
    #[arg(short, long)]
    name: Option<String>,
    #[command(flatten)]
    store: StoreArgs,
    /// The manager to register with and send heartbeats to (HOST:PORT); several managers
    /// sharing one etcd cluster as a comma-separated list: a beat goes to the next when one
    /// cannot be reached.
    #[arg(short, long, value_delimiter = ',', value_name = "HOST:PORT,...")]
    manager: Vec<String>,
    /// Join a manager started with --acl (HOST:PORT, or several as --manager takes them):
    /// as --manager, with the join token --token. The worker then takes requests from that
    /// manager only.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "HOST:PORT,...",
        conflicts_with = "manager",
        requires = "token"
    )]
    join: Vec<String>,
    /// The node (join) token made by `cube token create --role node`: sent with every
    /// registration and heartbeat. With it, the worker's API answers only requests that carry
    /// the worker-command token the manager gives in its answer (GET /health aside).
    #[arg(
        long,
        env = "CUBE_JOIN_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    token: Option<String>,
    /// The address the manager should use to reach this worker (HOST:PORT) [default: the
    /// listening address; required when listening on 0.0.0.0 with --manager].
    #[arg(long)]
    advertise: Option<String>,
    /// How often to send a heartbeat to the manager (e.g. 2s, 500ms).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    heartbeat_interval: Duration,
    /// CPU cores offered to tasks [default: every core of the machine].
    #[arg(long, value_parser = parse_cores)]
    cpus: Option<f64>,
    /// Memory offered to tasks, in bytes or with a unit (512MiB, 2GiB) [default: all of it].
    #[arg(long, value_parser = parse_size)]
    memory: Option<u64>,
    /// Disk offered to tasks, in bytes or with a unit [default: the space free on the data
    /// directory's filesystem when the worker starts].
    #[arg(long, value_parser = parse_size)]
    disk: Option<u64>,
    /// How long a stopped container may take to exit before it is killed (e.g. 10s, 500ms)
    /// [default: the config file's stop.timeout, else 10s].
    #[arg(long, value_parser = parse_duration)]
    stop_timeout: Option<Duration>,
    /// The worker's configuration file (YAML): how pods are launched, watched and killed, and
    /// the plugin chain (`plugins: {order: [general, node-env]}`). See the README.
    #[arg(long, value_name = "FILE")]
    config: Option<std::path::PathBuf>,
    /// How many tasks may be started or stopped at the same time.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    parallelism: u16,
    #[command(flatten)]
    labels: LabelArgs,
    #[command(flatten)]
    limits: crate::limits::LimitArgs,
    /// With a manager started with --tls: this node's own certificate (PEM, then the
    /// intermediates, if any) instead of one the manager signs at join. Signed by --tls-ca,
    /// for serverAuth and clientAuth, its subject OU=cube-node and CN=the node's name (the
    /// name by default); read again whenever the file changes.
    #[arg(long, value_name = "FILE", requires_all = ["tls_key", "tls_ca", "token"])]
    tls_cert: Option<std::path::PathBuf>,
    /// The private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// The cluster CA's certificate (PEM): the manager's certificate must be signed by it.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_ca: Option<std::path::PathBuf>,
}

/// `--label KEY=VALUE`, shared by `cube worker` and `cube dev`.
#[derive(Debug, Clone, Default, Args)]
pub struct LabelArgs {
    /// A label for this node, KEY=VALUE (repeatable): what task constraints such as
    /// `label.zone = eu` are asked about. Keys and values: letters, digits, '.', '_', '-', '/',
    /// at most 63 characters each; at most 64 labels.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    labels: Vec<(String, String)>,
}

impl LabelArgs {
    /// The labels as a map; a key given twice is refused rather than silently overwritten.
    fn into_labels(self) -> anyhow::Result<Labels> {
        let mut labels = Labels::new();
        for (key, value) in self.labels {
            if let Some(earlier) = labels.insert(key.clone(), value) {
                anyhow::bail!("--label {key}: given twice (first {key}={earlier})");
            }
        }
        anyhow::ensure!(
            labels.len() <= cube_types::node::MAX_LABELS,
            "--label: {} labels; at most {}",
            labels.len(),
            cube_types::node::MAX_LABELS
        );
        Ok(labels)
    }
}

impl WorkerArgs {
    /// The settings `cube dev` uses for its worker.
    pub fn for_dev(
        name: String,
        port: u16,
        manager: String,
        token: Option<String>,
        store: StoreArgs,
        labels: LabelArgs,
        limits: crate::limits::LimitArgs,
    ) -> WorkerArgs {
        WorkerArgs {
            host: "127.0.0.1".to_string(),
            port,
            name: Some(name),
            store,
            manager: vec![manager],
            join: Vec::new(),
            token,
            advertise: None,
            heartbeat_interval: Duration::from_secs(2),
            cpus: None,
            memory: None,
            disk: None,
            stop_timeout: None,
            config: None,
            parallelism: 8,
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
            labels,
            limits,
        }
    }
}

fn parse_cores(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(cores) if cores.is_finite() && cores > 0.0 => Ok(cores),
        _ => Err(format!(
            "{text:?} is not a number of cores > 0 (e.g. 2, 0.5)"
        )),
    }
}

/// A worker built and bound, ready to run.
pub struct PreparedWorker {
    worker: Arc<Worker<DockerRuntime>>,
    listener: TcpListener,
    heartbeat: Option<Heartbeat>,
    /// What the API holds its clients to.
    limits: cube_api::ServeLimits,
    /// Watched while serving: a store that fails stops the worker with an error.
    stores: OpenedStores,
    /// What `cube worker` prints once it listens.
    pub listening_line: String,
    /// Joined with TLS: the node's certificate and the settings that use it.
    tls: Option<Arc<cube_worker::tls::WorkerTls>>,
}

/// Checks the configuration, opens the store, connects to Docker and binds the listener.
pub async fn prepare(args: WorkerArgs) -> anyhow::Result<PreparedWorker> {
    // 1. Check the configuration.
    let brought = match (&args.tls_cert, &args.tls_key, &args.tls_ca) {
        (Some(cert), Some(key), Some(ca)) => {
            let ca = cube_api::tls::Authority::from_files(ca, None).context("--tls-ca")?;
            let files = cube_api::tls::CertFiles::new(
                cert.clone(),
                key.clone(),
                ca.ca_der(),
                cube_api::tls::PeerRole::Node,
                args.name.as_deref(),
            );
            let (_, identity) = files.load()?;
            Some((ca, files, identity.name))
        }
        _ => None,
    };
    let name = match args.name {
        Some(name) if name.trim().is_empty() => anyhow::bail!("--name must not be empty"),
        Some(name) => name,
        None => match &brought {
            Some((_, _, name)) => name.clone(),
            None => host_name()?,
        },
    };
    let labels = args.labels.into_labels()?;
    let limits = args.limits.limits()?;
    let file = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--config {}: cannot read it", path.display()))?;
            ConfigFile::parse(&text)
                .map_err(|why| anyhow::anyhow!("--config {}: {why}", path.display()))?
        }
        None => ConfigFile::default(),
    };
    let pods = file.settings().map_err(|why| match &args.config {
        Some(path) => anyhow::anyhow!("--config {}: {why}", path.display()),
        None => anyhow::anyhow!("{why}"),
    })?;
    let stop_timeout = args
        .stop_timeout
        .or(file.stop.timeout)
        .unwrap_or(Duration::from_secs(10));
    let (addresses, flag) = if args.join.is_empty() {
        (&args.manager, "--manager")
    } else {
        (&args.join, "--join")
    };
    if let Some(token) = &args.token {
        anyhow::ensure!(
            cube_types::token::split_token(token).is_some(),
            "--token: not a Cube token (cube.<ID>.<SECRET>, as `cube token create --role node` \
             prints it)"
        );
        anyhow::ensure!(
            !addresses.is_empty(),
            "--token: give the manager to join with --join HOST:PORT"
        );
    }
    let addresses: Vec<String> = addresses
        .iter()
        .map(|address| address.trim().to_string())
        .filter(|address| !address.is_empty())
        .collect();
    // A join token of a manager with --tls ends with its CA's fingerprint: join with TLS.
    let ca_fingerprint = args
        .token
        .as_deref()
        .and_then(cube_types::token::token_ca_fingerprint)
        .map(str::to_string);
    if let (Some((ca, _, _)), Some(in_token)) = (&brought, &ca_fingerprint) {
        let in_token = cube_api::tls::normalize_fingerprint(in_token).unwrap_or_default();
        anyhow::ensure!(
            in_token == ca.fingerprint(),
            "--tls-ca has fingerprint {}, but the join token names the CA {in_token}: they are \
             not the same cluster's",
            ca.fingerprint()
        );
    }
    if ca_fingerprint.is_none() && brought.is_none() {
        for address in &addresses {
            ApiClient::new(address, Duration::from_secs(5)).context(flag)?;
        }
    }

    // 2. Build: store, Docker, listener, and with TLS the node's certificate.
    let stores = args.store.open(StoreOwner::Worker(name.clone()))?;
    let tasks = stores.unwatched_table::<Task>("tasks")?;
    let runtime = DockerRuntime::connect().await?;
    let (listener, address) = crate::listen(&args.host, args.port, args.token.is_some()).await?;
    let mut advertised =
        advertised_address(args.advertise.as_deref(), address, !addresses.is_empty())?;
    let tls = match (&brought, &ca_fingerprint, &args.token) {
        (Some((ca, files, _)), _, _) => {
            let tls = cube_worker::tls::WorkerTls::from_files(files.clone(), ca.ca_der(), &name)
                .context("--tls-cert")?;
            advertised = advertised.replacen("http://", "https://", 1);
            Some(std::sync::Arc::new(tls))
        }
        (None, Some(fingerprint), Some(token)) => {
            let advertised_host = advertised
                .trim_start_matches("http://")
                .rsplit_once(':')
                .map_or(String::new(), |(host, _)| host.to_string());
            let mut hosts = vec![
                advertised_host,
                address.ip().to_string(),
                "127.0.0.1".to_string(),
                "localhost".to_string(),
            ];
            hosts.retain(|host| {
                host.parse::<std::net::IpAddr>()
                    .map_or(true, |ip| !ip.is_unspecified())
            });
            let kept = cube_worker::tls::KeptCertificate::in_dir(args.store.data_dir(), &name);
            let joined = cube_worker::tls::WorkerTls::join(
                &addresses,
                token,
                fingerprint,
                &name,
                hosts,
                kept,
            )
            .await
            .context("--join with a TLS join token")?;
            advertised = advertised.replacen("http://", "https://", 1);
            Some(std::sync::Arc::new(joined))
        }
        _ => None,
    };
    let managers = addresses
        .iter()
        .map(|address| {
            ApiClient::with_tls(
                address,
                Duration::from_secs(5),
                tls.as_ref().map(|tls| tls.client.clone()),
            )
            .map(|client| client.with_token(args.token.as_deref()))
        })
        .collect::<Result<Vec<_>, _>>()
        .context(flag)?;
    let gate = match (&args.token, &tls) {
        (None, _) => None,
        (Some(_), None) => Some(cube_worker::gate::CommandGate::new()),
        (Some(_), Some(_)) => Some(cube_worker::gate::CommandGate::with_manager_certificate()),
    };
    let stats = StatsCollector::new(args.store.data_dir());
    let machine = stats
        .machine_capacity()
        .context("reading the machine's size")?;
    let capacity = Resources {
        cpu: args.cpus.unwrap_or(machine.cpu),
        memory: args.memory.unwrap_or(machine.memory),
        disk: args.disk.unwrap_or(machine.disk),
    };
    let config = WorkerConfig {
        name: name.clone(),
        address: advertised,
        capacity,
        stop_timeout,
        max_concurrent_operations: usize::from(args.parallelism),
        labels,
        pods,
    };
    let worker = Worker::new(config, tasks, runtime, stats);
    let mut listening_line = cube_worker::listening_line(&name, address, &stores.description);
    if tls.is_some() {
        listening_line = listening_line.replacen("http://", "https://", 1);
    }
    Ok(PreparedWorker {
        worker,
        listener,
        limits,
        heartbeat: (!managers.is_empty()).then(|| Heartbeat {
            managers,
            interval: args.heartbeat_interval,
            gate,
        }),
        listening_line,
        tls,
        stores,
    })
}

impl PreparedWorker {
    /// Runs until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let serving = async {
            cube_worker::run(
                self.worker,
                self.listener,
                self.heartbeat,
                self.limits,
                self.tls,
                shutdown.clone(),
            )
            .await
            .context("serving the worker API")
        };
        self.stores.unless_failed(serving, &shutdown).await
    }
}

pub async fn run(args: WorkerArgs) -> anyhow::Result<()> {
    let shutdown = crate::shutdown::on_signal().context("installing signal handlers")?;
    let worker = prepare(args).await?;
    println!("{}", worker.listening_line);
    worker.run(shutdown).await?;
    tracing::info!("worker stopped");
    Ok(())
}

/// The address a manager reaches this worker at.
fn advertised_address(
    advertise: Option<&str>,
    listening: SocketAddr,
    has_manager: bool,
) -> anyhow::Result<String> {
    if let Some(advertise) = advertise {
        let client = ApiClient::new(advertise, Duration::from_secs(1)).context("--advertise")?;
        return Ok(client.base().to_string());
    }
    if listening.ip().is_unspecified() && has_manager {
        anyhow::bail!(
            "listening on {listening} with --manager: pass --advertise HOST:PORT, the address \
             the manager should use to reach this worker"
        );
    }
    Ok(format!("http://{listening}"))
}

fn host_name() -> anyhow::Result<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .context("reading the host name (pass --name to choose one)")?;
    let name = name.trim();
    anyhow::ensure!(!name.is_empty(), "the host name is empty; pass --name");
    Ok(name.to_string())
}
