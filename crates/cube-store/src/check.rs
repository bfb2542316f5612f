//! Opening a store file only when it is sound, and copying one.
//!
//! A store file that exists is opened only if it is a redb store that passes redb's integrity
//! check and whose every record reads back as JSON; anything else is refused with the file
//! named. Only a missing file is created: an empty file (truncated, or never written) is not an
//! empty store, because starting on it would serve nothing as if nothing had ever been
//! acknowledged. redb may panic on a damaged page instead of returning an error, so every
//! read of an unchecked file runs under [`std::panic::catch_unwind`], and the panic becomes
//! an error that names the file.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::Once;

use redb::{
    Database, DatabaseError, ReadableDatabase, ReadableTable, TableDefinition, TableHandle,
};
use serde::de::IgnoredAny;

use crate::StoreError;
use crate::commit::{META, REVISIONS};

/// Every table a Cube store file holds, except [`META`] and [`REVISIONS`]: string keys,
/// JSON values.
fn values_table(name: &str) -> TableDefinition<'_, &'static str, &'static [u8]> {
    TableDefinition::new(name)
}

/// Opens the store file at `path` (creating it only when it does not exist) and checks it:
/// refused when empty, not a redb store, failing redb's integrity check, or holding a record
/// that does not read back.
pub(crate) fn open_checked(path: &Path, cache_bytes: usize) -> Result<Database, StoreError> {
    let shown = path.display().to_string();
    match std::fs::metadata(path) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Database::builder()
                .set_cache_size(cache_bytes)
                .create(path)
                .map_err(|err| open_error(&shown, err));
        }
        Err(err) => {
            return Err(StoreError::Open {
                path: shown,
                reason: err.to_string(),
            });
        }
        Ok(metadata) if !metadata.is_file() => {
            return Err(damaged(&shown, "it is not a regular file"));
        }
        // redb would make a new store in an empty file; here that file once was a store.
        Ok(metadata) if metadata.len() == 0 => {
            return Err(damaged(&shown, "it is empty (0 bytes), not a store"));
        }
        Ok(_) => {}
    }
    without_panics(&shown, || {
        let mut db = Database::builder()
            .set_cache_size(cache_bytes)
            .open(path)
            .map_err(|err| open_error(&shown, err))?;
        match db.check_integrity() {
            Ok(true) => {}
            // redb repaired it, which may mean going back to an older commit: what was
            // acknowledged since would be silently lost.
            Ok(false) => {
                return Err(damaged(
                    &shown,
                    "it failed redb's integrity check (redb repaired what it could, which may have dropped acknowledged writes)",
                ));
            }
            Err(err) => return Err(open_error(&shown, err)),
        }
        read_every_record(&db).map_err(|reason| damaged(&shown, &reason))?;
        Ok(db)
    })
}

/// Checks the store file at `path` as [`open_checked`] does, without creating it.
pub(crate) fn check_file(path: &Path) -> Result<(), StoreError> {
    if !path.exists() {
        return Err(StoreError::Open {
            path: path.display().to_string(),
            reason: "there is no such file".to_string(),
        });
    }
    // A check reads every page once: a small cache is enough.
    open_checked(path, 1024 * 1024).map(drop)
}

/// Reads every record of every table once: a page of any of them that redb's check let
/// through, or a value that is not JSON, is damage too.
fn read_every_record(db: &Database) -> Result<(), String> {
    let txn = db.begin_read().map_err(|err| err.to_string())?;
    let names: Vec<String> = txn
        .list_tables()
        .map_err(|err| err.to_string())?
        .map(|handle| handle.name().to_string())
        .collect();
    for name in names {
        if name == META.name() {
            let meta = txn.open_table(META).map_err(|err| err.to_string())?;
            for entry in meta.iter().map_err(|err| err.to_string())? {
                entry.map_err(|err| format!("table {name}: {err}"))?;
            }
            continue;
        }
        if name == REVISIONS.name() {
            let revisions = txn.open_table(REVISIONS).map_err(|err| err.to_string())?;
            for entry in revisions.iter().map_err(|err| err.to_string())? {
                entry.map_err(|err| format!("table {name}: {err}"))?;
            }
            continue;
        }
        let table = txn
            .open_table(values_table(&name))
            .map_err(|err| err.to_string())?;
        for entry in table.iter().map_err(|err| err.to_string())? {
            let (key, value) = entry.map_err(|err| format!("table {name}: {err}"))?;
            serde_json::from_slice::<IgnoredAny>(value.value()).map_err(|err| {
                format!(
                    "the value under key {:?} in table {name} is not readable: {err}",
                    key.value()
                )
            })?;
        }
    }
    Ok(())
}

/// Copies every table of `source`, as one read transaction sees it, into a new store file at
/// `destination` (which must not exist), committed durably. A read transaction sees one
/// commit, so the copy is consistent while writes go on.
pub(crate) fn copy_database(source: &Database, destination: &Path) -> Result<(), StoreError> {
    let shown = destination.display().to_string();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(destination)
        .map_err(|err| StoreError::Open {
            path: shown.clone(),
            reason: err.to_string(),
        })?;
    let copy = Database::builder()
        .create_file(file)
        .map_err(|err| open_error(&shown, err))?;
    let read = source.begin_read().map_err(redb::Error::from)?;
    let write = copy.begin_write().map_err(redb::Error::from)?;
    let names: Vec<String> = read
        .list_tables()
        .map_err(redb::Error::from)?
        .map(|handle| handle.name().to_string())
        .collect();
    for name in names {
        if name == META.name() {
            let from = read.open_table(META).map_err(redb::Error::from)?;
            let mut to = write.open_table(META).map_err(redb::Error::from)?;
            for entry in from.iter().map_err(redb::Error::from)? {
                let (key, value) = entry.map_err(redb::Error::from)?;
                to.insert(key.value(), value.value())
                    .map_err(redb::Error::from)?;
            }
            continue;
        }
        if name == REVISIONS.name() {
            let from = read.open_table(REVISIONS).map_err(redb::Error::from)?;
            let mut to = write.open_table(REVISIONS).map_err(redb::Error::from)?;
            for entry in from.iter().map_err(redb::Error::from)? {
                let (key, value) = entry.map_err(redb::Error::from)?;
                to.insert(key.value(), value.value())
                    .map_err(redb::Error::from)?;
            }
            continue;
        }
        let from = read
            .open_table(values_table(&name))
            .map_err(redb::Error::from)?;
        let mut to = write
            .open_table(values_table(&name))
            .map_err(redb::Error::from)?;
        for entry in from.iter().map_err(redb::Error::from)? {
            let (key, value) = entry.map_err(redb::Error::from)?;
            to.insert(key.value(), value.value())
                .map_err(redb::Error::from)?;
        }
    }
    write.commit().map_err(redb::Error::from)?;
    Ok(())
}

fn damaged(path: &str, reason: &str) -> StoreError {
    StoreError::Damaged {
        path: path.to_string(),
        reason: reason.to_string(),
    }
}

/// What a failure to open says: in use, damaged, or the system's own error.
fn open_error(path: &str, err: DatabaseError) -> StoreError {
    let reason = match err {
        DatabaseError::DatabaseAlreadyOpen => {
            return StoreError::InUse {
                path: path.to_string(),
            };
        }
        // redb says "not a redb database" as an I/O error of kind `InvalidData`.
        DatabaseError::Storage(redb::StorageError::Io(err))
            if err.kind() != std::io::ErrorKind::InvalidData =>
        {
            err.to_string()
        }
        other => return damaged(path, &other.to_string()),
    };
    StoreError::Open {
        path: path.to_string(),
        reason,
    }
}

thread_local! {
    /// Set while this thread reads a file that may be damaged: a panic there is expected,
    /// turned into an error, and not printed as a crash.
    static EXPECTING_PANICS: Cell<bool> = const { Cell::new(false) };
}

/// Runs `read` on a file that may be damaged; a panic inside redb becomes
/// [`StoreError::Damaged`] naming `path`.
fn without_panics<T>(
    path: &str,
    read: impl FnOnce() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    // The process's panic hook is wrapped once, so that a panic this module catches is not
    // also printed as if the process had crashed; every other panic is printed as before.
    static QUIET_HOOK: Once = Once::new();
    QUIET_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !EXPECTING_PANICS.with(Cell::get) {
                previous(info);
            }
        }));
    });
    EXPECTING_PANICS.with(|expecting| expecting.set(true));
    let outcome = catch_unwind(AssertUnwindSafe(read));
    EXPECTING_PANICS.with(|expecting| expecting.set(false));
    outcome.unwrap_or_else(|panic| {
        Err(damaged(
            path,
            &format!(
                "redb stopped on an internal error while reading it ({})",
                panic_message(&*panic)
            ),
        ))
    })
}

/// The message a panic carried, when it carried one.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "no message".to_string()
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Seek, SeekFrom, Write};

    use super::*;
    use crate::{PersistentDb, PersistentStore, Store};

    const PAGE: u64 = 4096;

    /// A store file with `count` records in table `tasks`, closed.
    fn store_with_records(path: &Path, count: u32) {
        let store =
            PersistentStore::<String>::new(PersistentDb::open(path).unwrap(), "tasks").unwrap();
        for n in 0..count {
            store
                .put(
                    &format!("task-{n:04}"),
                    &format!("record number {n} {}", "x".repeat(200)),
                )
                .unwrap();
        }
    }

    fn reason(err: StoreError) -> String {
        err.to_string()
    }

    #[test]
    fn a_missing_file_becomes_a_new_empty_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.redb");
        let store =
            PersistentStore::<String>::new(PersistentDb::open(&path).unwrap(), "tasks").unwrap();
        assert_eq!(store.count().unwrap(), 0);
        assert!(path.exists());
    }

    #[test]
    fn an_empty_store_file_is_refused_with_its_name_not_opened_as_a_new_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("manager.redb");
        store_with_records(&path, 5);
        std::fs::File::create(&path).unwrap(); // truncated to 0 bytes
        let err = reason(PersistentDb::open(&path).err().unwrap());
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains("empty (0 bytes)"), "{err}");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0, "left as it was");
    }

    #[test]
    fn a_file_that_is_not_a_store_is_refused_with_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("manager.redb");
        std::fs::write(&path, "this is a text file, not a redb store\n".repeat(300)).unwrap();
        let err = PersistentDb::open(&path).err().unwrap();
        assert!(matches!(err, StoreError::Damaged { .. }), "{err}");
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn a_store_truncated_to_half_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("manager.redb");
        store_with_records(&path, 200);
        let length = std::fs::metadata(&path).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(length / 2)
            .unwrap();
        let err = PersistentDb::open(&path).err().unwrap();
        assert!(matches!(err, StoreError::Damaged { .. }), "{err}");
    }

    #[test]
    fn a_record_that_is_not_json_is_refused_as_damage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("manager.redb");
        store_with_records(&path, 3);
        {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(values_table("tasks"))
                .unwrap()
                .insert("task-0001", b"{\"half a record".as_slice())
                .unwrap();
            txn.commit().unwrap();
        }
        let err = reason(PersistentDb::open(&path).err().unwrap());
        assert!(err.contains("task-0001") && err.contains("tasks"), "{err}");
    }

    /// Overwrites one page at a time with seeded garbage: each start is refused with the file
    /// named or, when the page held nothing in use, opens with every record; never a panic.
    #[test]
    fn a_store_with_a_page_overwritten_is_refused_or_whole_never_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let pristine = dir.path().join("pristine.redb");
        store_with_records(&pristine, 300);
        let pages = std::fs::metadata(&pristine).unwrap().len() / PAGE;
        let mut seed = 0x5eed_u64;
        let (mut refused, mut whole) = (0, 0);
        for page in 0..pages {
            let path = dir.path().join(format!("page-{page}.redb"));
            std::fs::copy(&pristine, &path).unwrap();
            let garbage: Vec<u8> = (0..PAGE)
                .map(|_| {
                    // SplitMix64: the same garbage every run.
                    seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
                    let mut z = seed;
                    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                    (z ^ (z >> 31)) as u8
                })
                .collect();
            let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            file.seek(SeekFrom::Start(page * PAGE)).unwrap();
            file.write_all(&garbage).unwrap();
            drop(file);
            match PersistentDb::open(&path) {
                Err(err) => {
                    let err = err.to_string();
                    assert!(err.contains(&path.display().to_string()), "{err}");
                    refused += 1;
                }
                Ok(db) => {
                    let store = PersistentStore::<String>::new(db, "tasks").unwrap();
                    assert_eq!(store.count().unwrap(), 300, "page {page}");
                    assert_eq!(store.list().unwrap().len(), 300, "page {page}");
                    whole += 1;
                }
            }
        }
        eprintln!("{pages} pages: {refused} refused, {whole} whole");
        assert!(refused > 0, "overwriting the pages in use must be noticed");
    }
}
