//! `cube store export` and `cube store import`: a manager's whole state as a file of JSON
//! lines, out of one store and into another — how a manager on a redb file moves to etcd
//! (several managers) and back.
//!
//! Each line is one record: `{"Table": "tasks", "Key": "…", "Value": {…}}`, the value as the
//! store holds it, so nothing is interpreted on the way and a record of any version of Cube
//! moves as it is. An import goes only into a store that holds nothing yet: it never mixes
//! two clusters' states. The managers on the source and the target must be stopped (a redb
//! file is locked by its manager anyway); an export from etcd reads each table at one
//! revision.

use std::io::{BufRead, BufWriter, Write};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Args;
use cube_store::Store;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::stores::{OpenedStores, StoreArgs, StoreOwner};

/// Every table a manager keeps, in the order they are written. (`secrets` moves sealed: the
/// manager on the target needs the same key, `--secrets-key-file` of the source's
/// `secrets.key`.)
pub const MANAGER_TABLES: [&str; 11] = [
    "meta",
    "projects",
    "secrets",
    "acl_tokens",
    "acl_keys",
    "nodes",
    "jobs",
    "job_versions",
    "deployments",
    "queue",
    "tasks",
];

/// The key `record` is imported under: a task or a waiting-list entry exported from etcd,
/// where it is under its shard, goes under its plain key (the first manager on etcd moves
/// it under its shard of the target's ring; a redb file keeps it so). The layout's mark in
/// `meta` is left out for that reason.
fn import_key(record: &Record) -> &str {
    match record.table.as_str() {
        "tasks" | "queue" => cube_manager::layout::plain_key(&record.key),
        _ => &record.key,
    }
}

/// One record of an export file.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    #[serde(rename = "Table")]
    table: String,
    #[serde(rename = "Key")]
    key: String,
    #[serde(rename = "Value")]
    value: Value,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The file to write (replaced if it exists; `-` for standard output).
    file: PathBuf,
    /// The manager's store to read: -d persistent --data-dir DIR (the default), or
    /// -d etcd --etcd-endpoints A,B,C [--etcd-prefix /cube].
    #[command(flatten)]
    store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The file `cube store export` wrote.
    file: PathBuf,
    /// The manager's store to fill (it must hold nothing yet): -d etcd --etcd-endpoints A,B,C
    /// [--etcd-prefix /cube], or -d persistent --data-dir DIR.
    #[command(flatten)]
    store: StoreArgs,
}

fn open(store: &StoreArgs) -> anyhow::Result<OpenedStores> {
    if store.dbtype == crate::stores::DbType::Memory {
        bail!("-d memory keeps nothing to move: name a store file (--data-dir) or etcd");
    }
    store.open(StoreOwner::Manager)
}

/// A table's name and its store, values read as plain JSON.
type Table = (&'static str, Arc<dyn Store<Value>>);

fn tables(opened: &OpenedStores) -> anyhow::Result<Vec<Table>> {
    MANAGER_TABLES
        .iter()
        .map(|name| Ok((*name, opened.table::<Value>(name)?)))
        .collect()
}

pub fn export(args: ExportArgs) -> anyhow::Result<()> {
    let opened = open(&args.store)?;
    let to_stdout = args.file.as_os_str() == "-";
    let temporary = args.file.with_extension("export-partial");
    let sink: Box<dyn Write> = if to_stdout {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(
            std::fs::File::create(&temporary)
                .with_context(|| format!("creating {}", temporary.display()))?,
        )
    };
    let mut out = BufWriter::new(sink);
    let mut count = 0;
    for (name, table) in tables(&opened)? {
        let listing = table
            .list_with_revision()
            .with_context(|| format!("reading the table {name} from {}", opened.description))?;
        for (key, value, _) in listing.entries {
            let record = Record {
                table: name.to_string(),
                key,
                value,
            };
            serde_json::to_writer(&mut out, &record)?;
            out.write_all(b"\n")?;
            count += 1;
        }
    }
    out.flush()?;
    drop(out);
    if !to_stdout {
        std::fs::rename(&temporary, &args.file)
            .with_context(|| format!("writing {}", args.file.display()))?;
        eprintln!(
            "exported {count} records from {} to {}",
            opened.description,
            args.file.display()
        );
    }
    Ok(())
}

pub fn import(args: ImportArgs) -> anyhow::Result<()> {
    let opened = open(&args.store)?;
    let tables = tables(&opened)?;
    for (name, table) in &tables {
        let held = table.count()?;
        if held > 0 {
            bail!(
                "{} already holds {held} records in {name}: import only into an empty store \
                 (for etcd, another --etcd-prefix; for a file, another --data-dir)",
                opened.description
            );
        }
    }
    let file = std::fs::File::open(&args.file)
        .with_context(|| format!("opening {}", args.file.display()))?;
    // Records are read and checked whole before anything is written: a damaged file
    // imports nothing.
    let mut records = Vec::new();
    for (number, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", args.file.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let record: Record = serde_json::from_str(&line).with_context(|| {
            format!(
                "{} line {}: not a record of cube store export",
                args.file.display(),
                number + 1
            )
        })?;
        if !MANAGER_TABLES.contains(&record.table.as_str()) {
            bail!(
                "{} line {}: unknown table {:?} (a manager has {})",
                args.file.display(),
                number + 1,
                record.table,
                MANAGER_TABLES.join(", ")
            );
        }
        if record.table == "meta" && record.key == cube_manager::layout::LAYOUT_KEY {
            continue;
        }
        records.push(record);
    }
    // Queued in order and waited for together: concurrent writes share commits (redb) or
    // transactions (etcd).
    let mut commits = Vec::with_capacity(records.len());
    for record in &records {
        let Some((_, table)) = tables.iter().find(|(name, _)| *name == record.table) else {
            continue;
        };
        commits.push(table.put_queued(import_key(record), &record.value)?);
    }
    for commit in commits {
        commit.wait().context("writing a record")?;
    }
    eprintln!(
        "imported {} records from {} into {}",
        records.len(),
        args.file.display(),
        opened.description
    );
    Ok(())
}
