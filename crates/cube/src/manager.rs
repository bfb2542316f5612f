//! `cube manager`: the control plane.

use std::time::Duration;

use anyhow::Context;
use clap::Args;
use cube_manager::{Manager, ManagerConfig, ManagerStores};
use cube_types::duration::parse_duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::stores::{OpenedStores, StoreArgs, StoreOwner};

/// Run a manager: it accepts tasks (POST /tasks), places them on workers with the chosen
/// scheduler, sends them there and follows their state.
///
/// Workers join by registering themselves (`cube worker --manager HOST:PORT`) or from the
/// -w list. A task that fits on no worker waits, Pending, with the reasons, and is placed as
/// soon as room appears. With the persistent store, every task the API acknowledged survives
/// a crash, and a restarted manager picks up where it stopped. SIGINT or SIGTERM stop it.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube manager -p 5555 -s epvm                      # workers register themselves\n  \
    cube manager -s roundrobin -w 127.0.0.1:5556,127.0.0.1:5557\n  \
    cube manager -d memory                           # nothing kept on disk\n  \
    cube manager --gc-after 10m                      # ended tasks go after 10 minutes")]
pub struct ManagerArgs {
    /// Address to listen on.
    #[arg(short = 'H', long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 picks a free one; the address is printed).
    #[arg(short, long, default_value_t = 5555)]
    port: u16,
    /// Scheduler: epvm (E-PVM, least marginal cost over every node), epvm-sampled (E-PVM over
    /// a bounded random sample of the nodes that fit, for thousands of nodes) or roundrobin.
    #[arg(short, long, default_value = "epvm", value_parser = cube_scheduler::SCHEDULER_NAMES)]
    scheduler: String,
    #[command(flatten)]
    store: StoreArgs,
    /// Workers to reach without registration, HOST:PORT, comma-separated (the book's way).
    #[arg(short, long, value_delimiter = ',')]
    workers: Vec<String>,
    /// A worker silent for this long is Down: nothing new is placed on it.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    heartbeat_grace: Duration,
    /// How often the manager asks a -w worker for its stats.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    poll_interval: Duration,
    /// How long an ended task (Completed, Failed with no restart to come, or stopped) is kept,
    /// with its container and its logs, before it is removed; a stopped job without tasks
    /// goes too. `cube rm` and `cube prune` remove them at once. At most 24h.
    #[arg(long, default_value = "1h", value_parser = parse_gc_after)]
    gc_after: Duration,
    /// At most N requests of one owner let in at once (pending or claimed); the owner's next
    /// request waits in the queue, saying why. Unset: no limit.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_claimed_per_owner: Option<u32>,
    /// At most N tasks dispatched, stopped or restarted at once (each a call to a worker and
    /// a write to the store). More keeps more workers busy at once when thousands of tasks
    /// are placed together, at the cost of more open connections.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    max_concurrent_reconciles: u32,
    /// With --store etcd: how long a leader's lease lasts without renewal. A leader that
    /// dies is replaced within it; a paused one stops leading after it.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    leader_ttl: Duration,
    /// With --store etcd: the address the other managers reach this one at (default: the
    /// address it listens on).
    #[arg(long, value_name = "HOST:PORT")]
    advertise: Option<String>,
    /// With --store etcd: how many virtual nodes this manager runs on the shard ring (1 to
    /// 4). Each holds a point on the ring and the shards from it to the next point; a
    /// manager joining takes an even share of the ring, from as many other managers as it
    /// has virtual nodes (two take from two others; more spread a joiner over more of them).
    /// `GET /shards` and `cube node managers` show who holds what.
    #[arg(long, value_name = "N", default_value_t = cube_types::shard::DEFAULT_VIRTUAL_NODES,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(cube_types::shard::MAX_VIRTUAL_NODES)))]
    virtual_nodes: u32,
    /// With --store etcd: the shard ring's size, set by the cluster's first manager and
    /// stored (16 when left out; a later manager given another size refuses to start). A
    /// project's shard is a hash of its name modulo the ring.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(cube_types::shard::MAX_RING)))]
    shards: Option<u32>,
    /// With --store etcd: every manager runs the controllers for the shards it holds and
    /// keeps only their projects' tasks, jobs and waiting list in memory, instead of the
    /// leader acting for every shard. Each manager then hands a request to the manager that
    /// owns the project it names (`GET /shards` shows who), gathers a list of every project
    /// (`?project=*`) from all, and the leader answers what is the whole cluster's (tokens,
    /// projects, certificates). Every manager places on every node: each placement first
    /// claims its nodes' room in etcd, refused if another manager claimed there since (then
    /// planned again), so no node is given more than it holds. Give it to every manager of
    /// the cluster (one started with it beside managers running without it, or the other
    /// way round, refuses to start); its ring may have at most 127 shards. A blocking query
    /// of every project is refused (follow `GET /events?project=*`, which is gathered,
    /// instead).
    #[arg(long)]
    shard_controllers: bool,
    #[command(flatten)]
    limits: crate::limits::LimitArgs,
    /// Turn authentication on: every route but GET /health needs a token (`Authorization:
    /// Bearer`) of a role that allows it. Make the first one with `cube acl bootstrap`;
    /// workers join with `cube worker --join HOST:PORT --token NODE_TOKEN`.
    #[arg(long)]
    acl: bool,
    /// Mutual TLS (needs --acl): the manager makes a cluster CA on its first start (kept in
    /// --data-dir, under tls/; with --store etcd, in etcd, one for every manager: see
    /// --tls-ca-secret) and its own certificate, serves HTTPS, signs the certificates of
    /// nodes that join with a node token, and takes a node's reports only over that node's
    /// certificate. Node tokens then carry the CA's fingerprint.
    #[arg(long, requires = "acl")]
    tls: bool,
    /// With --tls and --store etcd: a file holding a secret of at least 32 characters (make
    /// one with `openssl rand -hex 32`), the same file on every manager. The first manager
    /// makes the cluster CA and keeps it in etcd, its key encrypted under this secret; every
    /// other one takes it from there and issues itself its own certificate, so workers and
    /// the CLI know every manager by the one CA fingerprint. Not needed with --tls-ca (give
    /// every manager the same one).
    #[arg(long, value_name = "FILE", requires = "tls")]
    tls_ca_secret: Option<std::path::PathBuf>,
    /// The key the projects' secrets are sealed with (`cube secret create`): a file of 64 hex
    /// digits (`openssl rand -hex 32 > FILE; chmod 600 FILE`). Needed with --store etcd (the
    /// same file on every manager; etcd then holds only sealed values). Without it a manager
    /// on its own store makes one at its first start, --data-dir/secrets.key (mode 0600),
    /// and a memory store keeps one for the life of the process.
    #[arg(long, value_name = "FILE")]
    secrets_key_file: Option<std::path::PathBuf>,
    /// How long the certificates the manager makes last (its own and the nodes'); each is
    /// renewed, without a restart, once two thirds of its life have passed.
    #[arg(long, default_value = "720h", value_parser = parse_duration, requires = "tls")]
    cert_ttl: Duration,
    #[command(flatten)]
    brought: BroughtTls,
}

/// Certificates brought by the user instead of the ones `--tls` makes (all PEM).
#[derive(Debug, Clone, Default, Args)]
pub struct BroughtTls {
    /// The cluster CA's certificate, instead of the one made in --data-dir: the manager and
    /// every node certificate must be signed by it.
    #[arg(long, value_name = "FILE", requires = "tls")]
    tls_ca: Option<std::path::PathBuf>,
    /// The CA's private key: with it the manager still signs the certificates of nodes that
    /// join by token (and its own, unless --tls-cert); without it, every node brings its own.
    #[arg(long, value_name = "FILE", requires = "tls_ca")]
    tls_ca_key: Option<std::path::PathBuf>,
    /// The manager's own certificate (then the intermediates, if any), signed by --tls-ca, for
    /// serverAuth and clientAuth, with OU=cube-manager in its subject; read again whenever the
    /// file changes (renewing it is then the user's: --cert-ttl is for the certificates the
    /// manager signs).
    #[arg(long, value_name = "FILE", requires_all = ["tls_ca", "tls_key"])]
    tls_cert: Option<std::path::PathBuf>,
    /// The private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
}

impl ManagerArgs {
    /// The settings `cube dev` uses for its manager.
    pub fn for_dev(
        host: String,
        port: u16,
        scheduler: String,
        store: StoreArgs,
        limits: crate::limits::LimitArgs,
        acl: bool,
        tls: bool,
    ) -> ManagerArgs {
        ManagerArgs {
            host,
            port,
            scheduler,
            store,
            workers: Vec::new(),
            heartbeat_grace: Duration::from_secs(10),
            poll_interval: Duration::from_secs(2),
            gc_after: Duration::from_secs(3600),
            max_claimed_per_owner: None,
            max_concurrent_reconciles: 64,
            leader_ttl: Duration::from_secs(5),
            advertise: None,
            virtual_nodes: cube_types::shard::DEFAULT_VIRTUAL_NODES,
            shards: None,
            shard_controllers: false,
            limits,
            acl: acl || tls,
            tls,
            tls_ca_secret: None,
            secrets_key_file: None,
            cert_ttl: cube_api::tls::DEFAULT_CERT_TTL,
            brought: BroughtTls::default(),
        }
    }
}

/// A manager built and bound, ready to run.
pub struct PreparedManager {
    mode: Mode,
    listener: TcpListener,
    /// What the API holds its clients to.
    limits: cube_api::ServeLimits,
    /// Watched while serving: a store that fails stops the manager with an error.
    stores: OpenedStores,
    pub listening_line: String,
    pub address: std::net::SocketAddr,
    /// With --acl: the tokens, for `cube dev` to give its own worker a join token.
    pub acl: Option<std::sync::Arc<cube_manager::acl::Acl>>,
    /// With --tls: the cluster CA's fingerprint, which `cube dev` adds to its worker's join
    /// token as the API does to every node token.
    pub ca_fingerprint: Option<String>,
}

/// One manager on its own store, or one of several on etcd.
enum Mode {
    Alone(std::sync::Arc<Manager>),
    /// The API in front, and what the manager needs to load its state once it leads.
    OnEtcd {
        front: std::sync::Arc<crate::leading::Front>,
        /// With --tls: what the API is served over HTTPS with, and the certificate it renews.
        tls: Option<std::sync::Arc<cube_manager::tls::ManagerTls>>,
        db: cube_store::EtcdDb,
        build: crate::leading::Build,
        /// `--shard-controllers`: each manager acts for the shards it holds.
        sharded: bool,
        leader_ttl: Duration,
        /// The shard ring's size and this manager's part in it.
        ring: u32,
        part: crate::ring::RingSettings,
        /// The lease of this manager's mode key (`ring::settle_mode`), given up on the way
        /// out.
        mode: cube_store::Lease,
    },
}

/// `--shard-controllers` fences a manager's writes on every shard key it holds, one
/// comparison each in every etcd transaction: a ring larger than a fence holds could never
/// be held whole by one manager.
fn ring_fits_shard_controllers(shard_controllers: bool, ring: u32) -> anyhow::Result<()> {
    anyhow::ensure!(
        !shard_controllers || ring as usize <= cube_store::Fence::MAX_KEYS,
        "--shard-controllers needs a ring of at most {} shards (a manager's writes are fenced \
         on every shard it holds, one etcd comparison each), not {ring}",
        cube_store::Fence::MAX_KEYS
    );
    Ok(())
}

/// The stores of the manager's tables.
/// `--gc-after`: a duration of at most a day, as its help says (ended tasks are kept in the
/// manager's memory and store until then).
fn parse_gc_after(text: &str) -> Result<Duration, String> {
    let duration = parse_duration(text)?;
    if duration > cube_types::duration::MAX_TASK_DURATION {
        return Err(format!(
            "{text:?} is longer than the limit of {}",
            cube_types::duration::MAX_TASK_DURATION_TEXT
        ));
    }
    Ok(duration)
}

/// The manager's tables. Nothing watches them from the past, so none keeps a history of its
/// changes in memory: the manager holds every record once, written through, and its event
/// broker is the change log API clients watch.
fn manager_stores(stores: &OpenedStores) -> anyhow::Result<ManagerStores> {
    Ok(ManagerStores {
        tasks: stores.unwatched_table("tasks")?,
        nodes: stores.unwatched_table("nodes")?,
        jobs: stores.unwatched_table("jobs")?,
        job_versions: stores.unwatched_table("job_versions")?,
        deployments: stores.unwatched_table("deployments")?,
        meta: stores.unwatched_table("meta")?,
        queue: stores.unwatched_table("queue")?,
        projects: stores.unwatched_table("projects")?,
        layout: cube_manager::layout::KeyLayout::Plain,
    })
}

/// The secrets' table and key (`--secrets-key-file`, or the data directory's).
fn open_secrets(
    args: &ManagerArgs,
    stores: &OpenedStores,
) -> anyhow::Result<cube_manager::secrets::Secrets> {
    use crate::stores::DbType;
    let key = match (&args.secrets_key_file, args.store.dbtype) {
        (Some(path), _) => Ok(cube_manager::secrets::key_from_file(path, false)
            .map_err(|why| anyhow::anyhow!("--secrets-key-file {why}"))?),
        (None, DbType::Persistent) => Ok(cube_manager::secrets::key_from_file(
            &args.store.data_dir().join(cube_manager::secrets::KEY_FILE),
            true,
        )
        .map_err(|why| anyhow::anyhow!("the secrets key: {why}"))?),
        (None, DbType::Memory) => return Ok(cube_manager::secrets::Secrets::in_memory()),
        (None, DbType::Etcd) => Err(
            "this manager keeps no secrets: managers on etcd seal them with one key, given to              each with --secrets-key-file FILE (make it once: `openssl rand -hex 32 > FILE`)"
                .to_string(),
        ),
    };
    Ok(cube_manager::secrets::Secrets::new(
        stores.unwatched_table("secrets")?,
        key,
    ))
}

pub async fn prepare(
    args: ManagerArgs,
    shutdown: CancellationToken,
) -> anyhow::Result<PreparedManager> {
    // 1. Check the configuration.
    let scheduler = cube_scheduler::scheduler_by_name(&args.scheduler)
        .with_context(|| format!("unknown scheduler {:?}", args.scheduler))?;
    for address in &args.workers {
        cube_api::ApiClient::new(address, Duration::from_secs(1)).context("--workers")?;
    }
    anyhow::ensure!(
        !args.heartbeat_grace.is_zero(),
        "--heartbeat-grace must be longer than 0"
    );
    let limits = args.limits.limits()?;

    // 2. Build: stores, manager, listener.
    let stores = args.store.open(StoreOwner::Manager)?;
    // Every submission's `TaskEvent` was once kept in an `events` table that nothing read
    // and nothing pruned; what it said is on the task (`CreatedTime`, `History`).
    stores.drop_unused_table("events")?;
    let mut manager_stores = manager_stores(&stores)?;
    let acl = if args.acl {
        let acl_stores = cube_manager::acl::AclStores {
            // A stream opened with a token watches it (it ends when the token is revoked).
            tokens: stores.table("acl_tokens")?,
            keys: stores.unwatched_table("acl_keys")?,
        };
        Some(std::sync::Arc::new(
            cube_manager::acl::Acl::open(acl_stores).context("opening the ACL")?,
        ))
    } else {
        None
    };
    // The audit file lives next to the store file; a manager on memory or etcd keeps no
    // file here and audits to its log only (target `cube::audit`).
    let audit = if args.store.dbtype == crate::stores::DbType::Persistent {
        let audit = cube_manager::acl::AuditLog::open(args.store.data_dir())
            .context("opening the audit log")?;
        Some(std::sync::Arc::new(audit))
    } else {
        None
    };
    let tls = if args.tls {
        anyhow::ensure!(
            args.workers.is_empty(),
            "--tls with -w/--workers: a static worker has no certificate; join workers with \
             `cube worker --join HOST:PORT --token TOKEN` instead"
        );
        anyhow::ensure!(
            args.cert_ttl >= Duration::from_secs(3),
            "--cert-ttl must be at least 3s"
        );
        let brought = &args.brought;
        let brought_ca = match &brought.tls_ca {
            Some(ca) => Some(
                cube_api::tls::Authority::from_files(ca, brought.tls_ca_key.as_deref())
                    .context("--tls-ca")?,
            ),
            None => None,
        };
        let authority = match (stores.etcd(), brought_ca) {
            // Several managers may share this etcd: they share one CA, kept there.
            (Some(_), brought_ca) => {
                let secret =
                    match &args.tls_ca_secret {
                        Some(path) => {
                            let text = std::fs::read_to_string(path).with_context(|| {
                                format!("--tls-ca-secret {}: cannot read it", path.display())
                            })?;
                            Some(cube_manager::tls::CaSecret::from_text(&text).with_context(|| {
                            format!(
                                "--tls-ca-secret {}: the secret is shorter than {} characters; \
                                 make one with `openssl rand -hex 32`",
                                path.display(),
                                cube_manager::tls::MIN_CA_SECRET_LEN
                            )
                        })?)
                        }
                        None => None,
                    };
                let keys = stores.table::<String>("acl_keys")?;
                cube_manager::tls::shared_authority(&*keys, brought_ca, secret.as_ref())
                    .context("--tls: the cluster CA shared on etcd")?
            }
            (None, Some(brought_ca)) => brought_ca,
            (None, None) => {
                anyhow::ensure!(
                    args.tls_ca_secret.is_none(),
                    "--tls-ca-secret is for managers sharing etcd (--store etcd); this manager \
                     keeps its CA in --data-dir"
                );
                cube_api::tls::Authority::load_or_create(args.store.data_dir())
                    .context("--tls: the cluster CA")?
            }
        };
        anyhow::ensure!(
            authority.can_sign() || brought.tls_cert.is_some(),
            "--tls-ca without --tls-ca-key: the manager cannot make its own certificate; give \
             it one with --tls-cert and --tls-key, or give the CA's key with --tls-ca-key"
        );
        let files = match (&brought.tls_cert, &brought.tls_key) {
            (Some(cert), Some(key)) => Some(cube_api::tls::CertFiles::new(
                cert.clone(),
                key.clone(),
                authority.ca_der(),
                cube_api::tls::PeerRole::Manager,
                None,
            )),
            _ => None,
        };
        let mut hosts = vec![
            args.host.clone(),
            "127.0.0.1".to_string(),
            "localhost".to_string(),
        ];
        if let Some(advertise) = &args.advertise {
            let host = advertise
                .rsplit_once(':')
                .map_or(advertise.as_str(), |(host, _)| host);
            hosts.push(host.to_string());
        }
        hosts.retain(|host| {
            host.parse::<std::net::IpAddr>()
                .map_or(true, |ip| !ip.is_unspecified())
        });
        let tls = cube_manager::tls::ManagerTls::new(authority, hosts, args.cert_ttl, files)
            .context("--tls: the manager's certificate")?;
        tracing::info!(ca_fingerprint = %tls.authority.fingerprint(), "TLS on: the cluster CA");
        Some(std::sync::Arc::new(tls))
    } else {
        None
    };
    // Checked before the ring's size is written, when this manager is the cluster's first.
    ring_fits_shard_controllers(args.shard_controllers, args.shards.unwrap_or(0))?;
    // The shard ring's size: the cluster's, on etcd; a manager alone holds a ring of 16.
    let ring = match stores.etcd() {
        Some(db) => crate::ring::ring_size(db, args.shards).await?,
        None if args.shard_controllers => anyhow::bail!(
            "--shard-controllers is for managers sharing etcd (--store etcd): a manager on its \
             own store acts for every shard already"
        ),
        None if args.shards.is_some() => anyhow::bail!(
            "--shards is for managers sharing etcd (--store etcd): a manager on its own store \
             holds every shard of a ring of {}",
            cube_types::shard::DEFAULT_RING
        ),
        None => cube_types::shard::DEFAULT_RING,
    };
    ring_fits_shard_controllers(args.shard_controllers, ring)?;
    if let Some(db) = stores.etcd() {
        // On etcd the tasks and the waiting list are kept under their project's shard.
        let moved = cube_manager::layout::settle(
            &mut manager_stores,
            db,
            cube_manager::layout::KeyLayout::Sharded { ring },
        )
        .await
        .context("moving the tasks and the waiting list under their shards")?;
        if moved != cube_manager::layout::Moved::default() {
            tracing::info!(
                tasks = moved.tasks,
                waiting = moved.queue,
                "moved the records an older Cube or an import kept under plain keys under their shards"
            );
        }
    }
    let secrets = std::sync::Arc::new(open_secrets(&args, &stores)?);
    let config = ManagerConfig {
        // Every shard: a manager alone, or the leader of managers on etcd; with
        // --shard-controllers each `Manager` is opened for the shards held (`acting.rs`).
        shards: cube_types::shard::ShardScope::all(ring),
        heartbeat_grace: args.heartbeat_grace,
        poll_interval: args.poll_interval,
        resync_interval: Duration::from_secs(30),
        static_workers: args.workers,
        request_timeout: Duration::from_secs(10),
        max_concurrent_reconciles: args.max_concurrent_reconciles as usize,
        gc_after: args.gc_after,
        max_claimed_per_owner: args.max_claimed_per_owner.map(|limit| limit as usize),
        acl: acl.clone(),
        audit,
        tls: tls.clone(),
        secrets,
        claims: None,
    };
    let (listener, address) = crate::listen(&args.host, args.port, args.acl).await?;
    let mut listening_line =
        cube_manager::listening_line(address, scheduler.name(), &stores.description);
    if let Some(tls) = &tls {
        listening_line = format!(
            "{} (CA fingerprint: {})",
            listening_line.replacen("http://", "https://", 1),
            tls.authority.fingerprint()
        );
    }
    let mode = match stores.etcd() {
        None => Mode::Alone(
            Manager::open(config, manager_stores, scheduler, shutdown)
                .context("loading the manager's state")?,
        ),
        Some(db) => {
            anyhow::ensure!(
                args.leader_ttl >= Duration::from_secs(1),
                "--leader-ttl must be at least 1s (etcd counts leases in seconds)"
            );
            let me = args.advertise.unwrap_or_else(|| address.to_string());
            let mode =
                crate::ring::settle_mode(db, &me, args.shard_controllers, args.leader_ttl).await?;
            let scheduler_name = args.scheduler.clone();
            let tasks = manager_stores.clone();
            let build: crate::leading::Build = std::sync::Arc::new(move |scope, claims, term| {
                let scheduler = cube_scheduler::scheduler_by_name(&scheduler_name)
                    .with_context(|| format!("unknown scheduler {scheduler_name:?}"))?;
                let config = ManagerConfig {
                    shards: scope,
                    claims,
                    ..config.clone()
                };
                Manager::open(config, manager_stores.clone(), scheduler, term)
                    .context("loading the manager's state from etcd")
            });
            Mode::OnEtcd {
                front: crate::leading::Front::new(
                    me.clone(),
                    db.clone(),
                    acl.clone(),
                    tls.clone(),
                    ring,
                    args.shard_controllers.then_some(tasks),
                )?,
                tls: tls.clone(),
                db: db.clone(),
                build,
                sharded: args.shard_controllers,
                leader_ttl: args.leader_ttl,
                ring,
                part: crate::ring::RingSettings {
                    manager: me,
                    virtual_nodes: args.virtual_nodes,
                    ttl: args.leader_ttl,
                },
                mode,
            }
        }
    };
    Ok(PreparedManager {
        mode,
        listener,
        limits,
        stores,
        listening_line,
        address,
        acl,
        ca_fingerprint: tls.as_ref().map(|tls| tls.authority.fingerprint()),
    })
}

impl PreparedManager {
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let serving = async {
            match self.mode {
                Mode::Alone(manager) => {
                    cube_manager::run(manager, self.listener, self.limits, shutdown.clone())
                        .await
                        .context("serving the manager API")
                }
                Mode::OnEtcd {
                    front,
                    tls,
                    db,
                    build,
                    sharded,
                    leader_ttl,
                    ring,
                    part,
                    mode,
                } => {
                    // Every manager serves HTTPS with its own certificate, leading or not.
                    let server_config = match &tls {
                        Some(tls) => {
                            tokio::spawn(tls.clone().run_renewal(shutdown.clone()));
                            Some(
                                tls.server_config()
                                    .context("--tls: the manager's server settings")?,
                            )
                        }
                        None => None,
                    };
                    // What this manager holds, with the fence of its shards: with
                    // --shard-controllers it acts for them; else the leader acts for every
                    // shard (ARCHITECTURE, "The shard ring").
                    let (held, held_now) =
                        tokio::sync::watch::channel(crate::ring::Held::default());
                    let holding = tokio::spawn(crate::ring::hold_shards(
                        db.clone(),
                        ring,
                        part,
                        held,
                        shutdown.clone(),
                    ));
                    let acting = sharded.then(|| {
                        tokio::spawn(crate::acting::act_for_held(
                            front.clone(),
                            db.clone(),
                            build.clone(),
                            held_now,
                            shutdown.clone(),
                        ))
                    });
                    let leading = tokio::spawn(crate::leading::campaign_and_lead(
                        front.clone(),
                        db,
                        (!sharded).then_some(build),
                        leader_ttl,
                        shutdown.clone(),
                    ));
                    let served = cube_api::serve_tls(
                        self.listener,
                        crate::leading::router(front),
                        self.limits,
                        server_config,
                        shutdown.clone(),
                    )
                    .await
                    .context("serving the manager API");
                    if let Err(err) = leading.await {
                        tracing::error!(error = %err, "the leadership loop ended abnormally");
                    }
                    if let Some(acting) = acting
                        && let Err(err) = acting.await
                    {
                        tracing::error!(error = %err, "the loop acting for the shards ended abnormally");
                    }
                    if let Err(err) = holding.await {
                        tracing::error!(error = %err, "the shard ring's loop ended abnormally");
                    }
                    mode.revoke().await;
                    served
                }
            }
        };
        self.stores.unless_failed(serving, &shutdown).await
    }
}

pub async fn run(args: ManagerArgs) -> anyhow::Result<()> {
    let shutdown = crate::shutdown::on_signal().context("installing signal handlers")?;
    let manager = prepare(args, shutdown.clone()).await?;
    println!("{}", manager.listening_line);
    manager.run(shutdown).await?;
    tracing::info!("manager stopped");
    Ok(())
}
