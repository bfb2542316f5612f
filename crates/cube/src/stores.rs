//! Where `cube manager`, `cube worker` and `cube dev` keep their state: the `--dbtype` and
//! `--data-dir` flags they share, the stores opened from them, and the names of the store
//! files (`cube store` finds them the same way).
//!
//! A store file that is damaged is refused at start with what to do; a store that fails while
//! the process runs stops the process with an error ([`OpenedStores::unless_failed`]).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, ValueEnum};
use cube_store::{
    EtcdConfig, EtcdDb, EtcdStore, MemoryStore, PersistentDb, PersistentStore, Store, StoreError,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

/// Whose store a file is; the file's name follows from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreOwner {
    Manager,
    /// A worker, by its node name.
    Worker(String),
}

impl StoreOwner {
    /// The store file's name in the data directory.
    pub fn file_name(&self) -> String {
        match self {
            StoreOwner::Manager => "manager.redb".to_string(),
            StoreOwner::Worker(name) => format!("worker-{name}.redb"),
        }
    }

    /// What to give `cube store` (after `--data-dir DIR`) to name this store.
    pub fn flags(&self) -> String {
        match self {
            StoreOwner::Manager => String::new(),
            StoreOwner::Worker(name) => format!(" --role worker --name {name}"),
        }
    }

    /// "manager" or "worker", for messages.
    pub fn role(&self) -> &'static str {
        match self {
            StoreOwner::Manager => "manager",
            StoreOwner::Worker(_) => "worker",
        }
    }
}

/// Where a process keeps its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DbType {
    /// In memory: forgotten when the process stops.
    Memory,
    /// In a redb file under --data-dir: every acknowledged change survives a crash.
    Persistent,
    /// In an etcd cluster (--etcd-endpoints), shared by several managers: every
    /// acknowledged change is committed by a majority of the cluster. Managers only.
    Etcd,
}

/// The flags that say where state lives.
#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    /// Store: memory (forgotten on exit), persistent (a redb file under --data-dir) or etcd
    /// (an etcd cluster shared by several managers; managers only).
    #[arg(short, long, visible_alias = "store", value_enum, default_value_t = DbType::Persistent)]
    pub dbtype: DbType,
    /// The etcd cluster's members, HOST:PORT, comma-separated (with --store etcd): a member
    /// that is down is skipped.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "HOST:PORT,...",
        env = "CUBE_ETCD_ENDPOINTS",
        required_if_eq("dbtype", "etcd")
    )]
    pub etcd_endpoints: Vec<String>,
    /// The prefix every key of this Cube cluster lives under in etcd (with --store etcd).
    #[arg(long, default_value = "/cube", env = "CUBE_ETCD_PREFIX")]
    pub etcd_prefix: String,
    /// Directory for the store files; a worker's /stats reports on its filesystem.
    #[arg(long, default_value = "cube-data", env = "CUBE_DATA_DIR")]
    pub data_dir: PathBuf,
}

/// One store file (or memory), opened for the tables a process needs.
pub struct OpenedStores {
    db: Option<PersistentDb>,
    /// The etcd cluster, with --store etcd.
    etcd: Option<EtcdDb>,
    /// For the listening line: `memory`, or `persistent, PATH`.
    pub description: String,
    /// Whose store it is, for the messages that say what to do.
    owner: StoreOwner,
    data_dir: PathBuf,
}

impl StoreArgs {
    /// Creates the data directory and opens `owner`'s store file in it (or nothing, in
    /// memory). A file that exists but is not a sound store is refused, with what to do.
    pub fn open(&self, owner: StoreOwner) -> anyhow::Result<OpenedStores> {
        if self.dbtype != DbType::Etcd {
            std::fs::create_dir_all(&self.data_dir).with_context(|| {
                format!("creating the data directory {}", self.data_dir.display())
            })?;
        }
        Ok(match self.dbtype {
            DbType::Etcd => {
                if owner != StoreOwner::Manager {
                    anyhow::bail!(
                        "--store etcd is for managers: a {role} keeps its own store (-d persistent or memory)",
                        role = owner.role()
                    );
                }
                let etcd = self.connect_etcd()?;
                OpenedStores {
                    db: None,
                    description: etcd.describe(),
                    etcd: Some(etcd),
                    owner,
                    data_dir: self.data_dir.clone(),
                }
            }
            DbType::Memory => OpenedStores {
                db: None,
                etcd: None,
                description: "memory".to_string(),
                owner,
                data_dir: self.data_dir.clone(),
            },
            DbType::Persistent => {
                let path = self.data_dir.join(owner.file_name());
                let db = match PersistentDb::open(&path) {
                    Ok(db) => db,
                    Err(err @ StoreError::Damaged { .. }) => anyhow::bail!(
                        "{err}. The {role} does not start on it: restore a backup with `cube \
                         store restore BACKUP --data-dir {dir}{flags}`, or move the file away \
                         to start with an empty store",
                        role = owner.role(),
                        dir = self.data_dir.display(),
                        flags = owner.flags(),
                    ),
                    Err(err) => return Err(err.into()),
                };
                OpenedStores {
                    db: Some(db),
                    etcd: None,
                    description: format!("persistent, {}", path.display()),
                    owner,
                    data_dir: self.data_dir.clone(),
                }
            }
        })
    }

    /// Connects to the etcd cluster the flags name; an error when no member answers.
    pub fn connect_etcd(&self) -> anyhow::Result<EtcdDb> {
        let endpoints: Vec<String> = self
            .etcd_endpoints
            .iter()
            .map(|endpoint| endpoint.trim().to_string())
            .filter(|endpoint| !endpoint.is_empty())
            .collect();
        anyhow::ensure!(
            !endpoints.is_empty(),
            "--store etcd needs --etcd-endpoints HOST:PORT,... (or CUBE_ETCD_ENDPOINTS)"
        );
        EtcdDb::connect(EtcdConfig::new(endpoints, &self.etcd_prefix))
            .context("connecting to etcd (--etcd-endpoints)")
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }
}

impl OpenedStores {
    /// Runs `serving` to its end, unless the store fails first (a commit panicked, or the disk
    /// failed under it): then every loop is asked to stop, `serving` is let finish, and the
    /// failure is the error, so the process exits non-zero instead of living on without a
    /// store.
    pub async fn unless_failed(
        &self,
        serving: impl Future<Output = anyhow::Result<()>>,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<()> {
        let Some(db) = &self.db else {
            return serving.await;
        };
        tokio::pin!(serving);
        tokio::select! {
            result = &mut serving => result,
            cause = db.failed() => {
                tracing::error!(store = %db.path().display(), %cause, "the store failed; stopping");
                shutdown.cancel();
                if let Err(err) = serving.await {
                    tracing::warn!(error = %err, "while stopping");
                }
                anyhow::bail!(
                    "the store file {path} failed and takes no more writes ({cause}); the \
                     {role} stopped. Start it again once the disk is sound (the file is checked \
                     at start), or restore a backup with `cube store restore BACKUP --data-dir \
                     {dir}{flags}`",
                    path = db.path().display(),
                    role = self.owner.role(),
                    dir = self.data_dir.display(),
                    flags = self.owner.flags(),
                )
            }
        }
    }

    /// The etcd cluster, with --store etcd.
    pub fn etcd(&self) -> Option<&EtcdDb> {
        self.etcd.as_ref()
    }

    /// Removes a table an older Cube wrote and nothing reads any more; says so in the log.
    pub fn drop_unused_table(&self, name: &str) -> anyhow::Result<()> {
        if let Some(db) = &self.db
            && db.drop_table(name)?
        {
            tracing::info!(table = name, "removed a table nothing reads any more");
        }
        Ok(())
    }

    /// The store for one table of values.
    pub fn table<V>(&self, name: &str) -> anyhow::Result<Arc<dyn Store<V>>>
    where
        V: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
    {
        Ok(match (&self.db, &self.etcd) {
            (Some(db), _) => Arc::new(PersistentStore::new(db.clone(), name)?),
            (None, Some(etcd)) => Arc::new(EtcdStore::new(etcd.clone(), name)?),
            (None, None) => Arc::new(MemoryStore::new()),
        })
    }

    /// The store for one table nothing watches from the past: it keeps no history of changes
    /// in memory. A worker's own tasks, and every manager table but the ACL tokens (a stream
    /// opened with a token watches it, to end when it is revoked): the manager holds its
    /// records in memory, written through, and what API clients watch is its event broker.
    pub fn unwatched_table<V>(&self, name: &str) -> anyhow::Result<Arc<dyn Store<V>>>
    where
        V: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
    {
        Ok(match (&self.db, &self.etcd) {
            (Some(db), _) => Arc::new(PersistentStore::unwatched(db.clone(), name)?),
            (None, Some(etcd)) => Arc::new(EtcdStore::unwatched(etcd.clone(), name)?),
            (None, None) => Arc::new(MemoryStore::without_history()),
        })
    }
}
