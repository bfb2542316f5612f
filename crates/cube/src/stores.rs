//! Where `cube manager`, `cube worker` and `cube dev` keep their state: the `--dbtype` and
//! `--data-dir` flags they share, and the stores opened from them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, ValueEnum};
use cube_store::{MemoryStore, PersistentDb, PersistentStore, Store};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Where a process keeps its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DbType {
    /// In memory: forgotten when the process stops.
    Memory,
    /// In a redb file under --data-dir: every acknowledged change survives a crash.
    Persistent,
}

/// The flags that say where state lives.
#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    /// Store: memory (forgotten on exit) or persistent (a redb file under --data-dir).
    #[arg(short, long, value_enum, default_value_t = DbType::Persistent)]
    pub dbtype: DbType,
    /// Directory for the store files; a worker's /stats reports on its filesystem.
    #[arg(long, default_value = "cube-data", env = "CUBE_DATA_DIR")]
    pub data_dir: PathBuf,
}

/// One store file (or memory), opened for the tables a process needs.
pub struct OpenedStores {
    db: Option<PersistentDb>,
    /// For the listening line: `memory`, or `persistent, PATH`.
    pub description: String,
}

impl StoreArgs {
    /// Creates the data directory and opens `FILE_STEM.redb` in it (or nothing, in memory).
    pub fn open(&self, file_stem: &str) -> anyhow::Result<OpenedStores> {
        std::fs::create_dir_all(&self.data_dir)
            .with_context(|| format!("creating the data directory {}", self.data_dir.display()))?;
        Ok(match self.dbtype {
            DbType::Memory => OpenedStores {
                db: None,
                description: "memory".to_string(),
            },
            DbType::Persistent => {
                let path = self.data_dir.join(format!("{file_stem}.redb"));
                OpenedStores {
                    db: Some(PersistentDb::open(&path)?),
                    description: format!("persistent, {}", path.display()),
                }
            }
        })
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }
}

impl OpenedStores {
    /// The store for one table of values.
    pub fn table<V>(&self, name: &str) -> anyhow::Result<Arc<dyn Store<V>>>
    where
        V: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
    {
        Ok(match &self.db {
            None => Arc::new(MemoryStore::new()),
            Some(db) => Arc::new(PersistentStore::new(db.clone(), name)?),
        })
    }
}
