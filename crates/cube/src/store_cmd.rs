//! `cube store backup` and `cube store restore`: a consistent copy of a store file, and putting
//! one back in place of a damaged store.
//!
//! Every file this writes is written under a temporary name next to its destination, checked
//! (redb's integrity check and every record read, as a starting process checks its store),
//! flushed to disk and then renamed into place, so that a reader of the destination finds the
//! old file or the whole new one, never half of one.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use clap::{Args, Subcommand, ValueEnum};
use cube_store::{PersistentDb, StoreError};

use crate::stores::StoreOwner;

/// Back up or restore a store file (a manager's or a worker's); export a manager's state and
/// import it into another store (a redb file into etcd, or back).
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube store backup cube-backup.redb                       # from the running manager at CUBE_MANAGER\n  \
    cube store backup cube-backup.redb --data-dir cube-data  # nothing running: from the file\n  \
    cube store restore cube-backup.redb --data-dir cube-data # with the manager stopped\n  \
    cube store export state.jsonl --data-dir cube-data       # a manager's state, to move it\n  \
    cube store import state.jsonl --store etcd --etcd-endpoints 127.0.0.1:2379")]
pub struct StoreCommandArgs {
    #[command(subcommand)]
    action: StoreAction,
}

#[derive(Debug, Subcommand)]
enum StoreAction {
    /// Write a consistent copy of a store to FILE: from a running manager (its
    /// GET /store/backup), or from --data-dir when nothing runs on it.
    Backup(BackupArgs),
    /// Put the backup FILE in place of the store in --data-dir, once it passes the integrity
    /// check. The process that uses the store must be stopped; the file it replaces is kept
    /// next to it as `NAME.before-restore-TIME`.
    Restore(RestoreArgs),
    /// Write a manager's whole state (every table, from a store file or from etcd) to FILE,
    /// one JSON record a line. Stop the managers first.
    Export(crate::store_move::ExportArgs),
    /// Fill an empty manager store (etcd, or a store file) from a FILE `cube store export`
    /// wrote: how a manager on a redb file moves to etcd, and back.
    Import(crate::store_move::ImportArgs),
}

/// Whose store: a manager's (`manager.redb`) or a worker's (`worker-NAME.redb`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Role {
    Manager,
    Worker,
}

#[derive(Debug, Args)]
struct WhichStore {
    /// Whose store file.
    #[arg(long, value_enum, default_value_t = Role::Manager)]
    role: Role,
    /// The worker's node name (with --role worker).
    #[arg(short, long, required_if_eq("role", "worker"))]
    name: Option<String>,
}

impl WhichStore {
    fn owner(&self) -> anyhow::Result<StoreOwner> {
        Ok(match (self.role, &self.name) {
            (Role::Manager, _) => StoreOwner::Manager,
            (Role::Worker, Some(name)) if !name.trim().is_empty() => {
                StoreOwner::Worker(name.clone())
            }
            (Role::Worker, _) => bail!("--role worker needs --name NAME, the worker's node name"),
        })
    }
}

#[derive(Debug, Args)]
struct BackupArgs {
    /// Where to write the copy (replaced if it exists).
    file: PathBuf,
    /// Copy the store file in this data directory (nothing may be running on it).
    #[arg(long, conflicts_with = "from_manager")]
    data_dir: Option<PathBuf>,
    /// Ask this running manager for a copy [default: CUBE_MANAGER, else 127.0.0.1:5555].
    #[arg(long, value_name = "HOST:PORT")]
    from_manager: Option<String>,
    /// A management token, for a manager started with --acl.
    #[arg(long, env = "CUBE_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    token: Option<String>,
    #[command(flatten)]
    which: WhichStore,
}

#[derive(Debug, Args)]
struct RestoreArgs {
    /// The backup to restore (a store file written by `cube store backup`).
    file: PathBuf,
    /// The data directory whose store file the backup replaces.
    #[arg(long)]
    data_dir: PathBuf,
    #[command(flatten)]
    which: WhichStore,
}

/// How long a copy from a running manager may take: it is the whole store file.
const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(600);

pub async fn run(args: StoreCommandArgs) -> anyhow::Result<()> {
    match args.action {
        StoreAction::Backup(args) => backup(args).await,
        StoreAction::Restore(args) => tokio::task::spawn_blocking(move || restore(args))
            .await
            .context("the restore stopped")?,
        StoreAction::Export(args) => {
            tokio::task::spawn_blocking(move || crate::store_move::export(args))
                .await
                .context("the export stopped")?
        }
        StoreAction::Import(args) => {
            tokio::task::spawn_blocking(move || crate::store_move::import(args))
                .await
                .context("the import stopped")?
        }
    }
}

async fn backup(args: BackupArgs) -> anyhow::Result<()> {
    let owner = args.which.owner()?;
    let temporary = temporary_next_to(&args.file, "backup")?;
    let copied = match &args.data_dir {
        Some(data_dir) => {
            let source = data_dir.join(owner.file_name());
            let temporary = temporary.clone();
            tokio::task::spawn_blocking(move || copy_offline(&source, &temporary))
                .await
                .context("the backup stopped")?
        }
        None => {
            if owner != StoreOwner::Manager {
                bail!("a worker's store is backed up from its --data-dir while it is stopped");
            }
            let address = args
                .from_manager
                .or_else(|| std::env::var("CUBE_MANAGER").ok())
                .unwrap_or_else(|| "127.0.0.1:5555".to_string());
            download(&address, args.token.as_deref(), &temporary).await
        }
    };
    let written = copied.and_then(|()| {
        PersistentDb::check(&temporary).context("the copy does not pass the integrity check")?;
        replace_with(&temporary, &args.file)
    });
    if written.is_err() {
        // Nothing half-written is left behind (there may be nothing to remove).
        let _ = std::fs::remove_file(&temporary);
    }
    written?;
    println!("backed up to {}", args.file.display());
    Ok(())
}

/// Copies the store file `source` (checked as at start, and locked while it is read) to a new
/// store file at `destination`.
fn copy_offline(source: &Path, destination: &Path) -> anyhow::Result<()> {
    if !source.exists() {
        bail!("there is no store file {}", source.display());
    }
    let db = match PersistentDb::open(source) {
        Ok(db) => db,
        Err(err @ StoreError::InUse { .. }) => bail!(
            "{err}: while it runs, back it up with --from-manager HOST:PORT, or stop it first"
        ),
        Err(err) => return Err(err.into()),
    };
    db.backup_to(destination)?;
    Ok(())
}

/// Fetches `GET /store/backup` from the manager at `address` into `destination`.
async fn download(address: &str, token: Option<&str>, destination: &Path) -> anyhow::Result<()> {
    let base = cube_api::ApiClient::new(address, Duration::from_secs(5))?
        .base()
        .to_string();
    let url = format!("{base}/store/backup");
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .timeout(DOWNLOAD_TIMEOUT)
        .build()
        .context("building the HTTP client")?;
    let mut request = http.get(&url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let mut response = request
        .send()
        .await
        .with_context(|| format!("asking {url} (is the manager running? -d persistent?)"))?;
    if !response.status().is_success() {
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        let message = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|body| body["Message"].as_str().map(str::to_string))
            .unwrap_or(body);
        bail!("{url} answered {status}: {message}");
    }
    let expected = response.content_length();
    let mut file = File::create_new(destination)
        .with_context(|| format!("creating {}", destination.display()))?;
    let mut written: u64 = 0;
    while let Some(chunk) = response
        .chunk()
        .await
        .with_context(|| format!("reading the copy from {url}"))?
    {
        file.write_all(&chunk)
            .with_context(|| format!("writing {}", destination.display()))?;
        written += chunk.len() as u64;
    }
    if let Some(expected) = expected
        && expected != written
    {
        bail!("{url} sent {written} of {expected} bytes");
    }
    file.sync_all()
        .with_context(|| format!("flushing {}", destination.display()))?;
    Ok(())
}

fn restore(args: RestoreArgs) -> anyhow::Result<()> {
    let owner = args.which.owner()?;
    PersistentDb::check(&args.file).with_context(|| {
        format!(
            "the backup {} is not a sound store; nothing was changed",
            args.file.display()
        )
    })?;
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating {}", args.data_dir.display()))?;
    let target = args.data_dir.join(owner.file_name());
    // Held (and so locked) until the new file is in place, when the old one is a sound store:
    // no process can open it meanwhile.
    let _old = match PersistentDb::open_existing(&target) {
        Ok(old) => old,
        Err(err @ StoreError::InUse { .. }) => bail!(
            "{err}: stop the {role} first; nothing was changed",
            role = owner.role()
        ),
        // A damaged store is what a restore is for.
        Err(StoreError::Damaged { .. }) => None,
        Err(err) => return Err(err.into()),
    };
    let temporary = temporary_next_to(&target, "restore")?;
    let restored = std::fs::copy(&args.file, &temporary)
        .with_context(|| {
            format!(
                "copying {} into {}",
                args.file.display(),
                temporary.display()
            )
        })
        .and_then(|_| flush(&temporary))
        .and_then(|()| keep_previous(&target))
        .and_then(|kept| replace_with(&temporary, &target).map(|()| kept));
    if restored.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    match restored? {
        Some(kept) => println!(
            "restored {} to {} (the file it replaced is kept as {})",
            args.file.display(),
            target.display(),
            kept.display()
        ),
        None => println!("restored {} to {}", args.file.display(), target.display()),
    }
    Ok(())
}

/// Keeps the store file about to be replaced under a second name (a hard link: the store
/// file's own name never goes missing). Returns that name, or `None` with no file there.
fn keep_previous(target: &Path) -> anyhow::Result<Option<PathBuf>> {
    if !target.exists() {
        return Ok(None);
    }
    let mut name = target.as_os_str().to_owned();
    name.push(format!(
        ".before-restore-{}",
        chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ")
    ));
    let kept = PathBuf::from(name);
    std::fs::hard_link(target, &kept)
        .with_context(|| format!("keeping {} as {}", target.display(), kept.display()))?;
    Ok(Some(kept))
}

/// A name next to `destination` for a file about to replace it (same directory, so the rename
/// is atomic); the file must not exist yet.
fn temporary_next_to(destination: &Path, purpose: &str) -> anyhow::Result<PathBuf> {
    let file_name = destination
        .file_name()
        .ok_or_else(|| anyhow!("{} names no file", destination.display()))?;
    let mut name = std::ffi::OsString::from(".");
    name.push(file_name);
    name.push(format!(".{purpose}-{}", std::process::id()));
    Ok(destination.with_file_name(name))
}

fn flush(path: &Path) -> anyhow::Result<()> {
    File::open(path)
        .and_then(|file| file.sync_all())
        .with_context(|| format!("flushing {}", path.display()))
}

/// Renames `temporary` over `destination` and makes the rename durable.
fn replace_with(temporary: &Path, destination: &Path) -> anyhow::Result<()> {
    std::fs::rename(temporary, destination).with_context(|| {
        format!(
            "moving {} to {}",
            temporary.display(),
            destination.display()
        )
    })?;
    let directory = match destination.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    File::open(directory)
        .and_then(|directory| directory.sync_all())
        .with_context(|| format!("flushing the directory {}", directory.display()))
}
