//! A store in a redb file: one ACID, fsynced commit per write.

use std::marker::PhantomData;
use std::path::Path;
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{Store, StoreError};

/// Each store's index, under the store's table name.
const META: TableDefinition<&str, u64> = TableDefinition::new("cube_meta");

/// One open redb file, shared by the stores that keep their tables in it. redb allows one
/// process to open a file at a time, which also keeps two workers off the same data.
#[derive(Clone)]
pub struct PersistentDb {
    db: Arc<Database>,
}

impl PersistentDb {
    /// Opens the file, creating it (not its directory) when missing.
    pub fn open(path: &Path) -> Result<PersistentDb, StoreError> {
        let db = Database::create(path).map_err(|err| StoreError::Open {
            path: path.display().to_string(),
            reason: match err {
                redb::DatabaseError::DatabaseAlreadyOpen => {
                    "it is in use by another process (is another Cube process using the same data directory?)"
                        .to_string()
                }
                other => other.to_string(),
            },
        })?;
        Ok(PersistentDb { db: Arc::new(db) })
    }
}

/// Values of type `V` in one table of a [`PersistentDb`], stored as JSON.
pub struct PersistentStore<V> {
    db: Arc<Database>,
    table: String,
    _values: PhantomData<fn() -> V>,
}

impl<V> PersistentStore<V> {
    /// A store over the table `table`, created now so that reads of an empty store succeed.
    pub fn new(db: PersistentDb, table: &str) -> Result<PersistentStore<V>, StoreError> {
        let store = PersistentStore {
            db: db.db,
            table: table.to_string(),
            _values: PhantomData,
        };
        let txn = store.db.begin_write().map_err(redb::Error::from)?;
        txn.open_table(store.definition())
            .map_err(redb::Error::from)?;
        txn.open_table(META).map_err(redb::Error::from)?;
        txn.commit().map_err(redb::Error::from)?;
        Ok(store)
    }

    fn definition(&self) -> TableDefinition<'_, &'static str, &'static [u8]> {
        TableDefinition::new(&self.table)
    }

    /// Runs `change` on the table in one write transaction that also bumps the index, and
    /// commits durably. `change` says whether it changed anything.
    fn write(
        &self,
        change: impl FnOnce(&mut redb::Table<&'static str, &'static [u8]>) -> Result<bool, redb::Error>,
    ) -> Result<(bool, u64), StoreError> {
        let txn = self.db.begin_write().map_err(redb::Error::from)?;
        let (changed, index) = {
            let mut table = txn
                .open_table(self.definition())
                .map_err(redb::Error::from)?;
            let changed = change(&mut table)?;
            let mut meta = txn.open_table(META).map_err(redb::Error::from)?;
            let mut index = meta
                .get(self.table.as_str())
                .map_err(redb::Error::from)?
                .map(|v| v.value())
                .unwrap_or(0);
            if changed {
                index += 1;
                meta.insert(self.table.as_str(), index)
                    .map_err(redb::Error::from)?;
            }
            (changed, index)
        };
        txn.commit().map_err(redb::Error::from)?;
        Ok((changed, index))
    }
}

impl<V: Serialize + DeserializeOwned + Send> Store<V> for PersistentStore<V> {
    fn put(&self, key: &str, value: &V) -> Result<u64, StoreError> {
        let bytes = serde_json::to_vec(value).map_err(|source| StoreError::Encode {
            key: key.to_string(),
            source,
        })?;
        let (_, index) = self.write(|table| {
            table
                .insert(key, bytes.as_slice())
                .map_err(redb::Error::from)?;
            Ok(true)
        })?;
        Ok(index)
    }

    fn get(&self, key: &str) -> Result<Option<V>, StoreError> {
        let txn = self.db.begin_read().map_err(redb::Error::from)?;
        let table = txn
            .open_table(self.definition())
            .map_err(redb::Error::from)?;
        match table.get(key).map_err(redb::Error::from)? {
            Some(bytes) => serde_json::from_slice(bytes.value())
                .map(Some)
                .map_err(|source| StoreError::Decode {
                    key: key.to_string(),
                    source,
                }),
            None => Ok(None),
        }
    }

    fn list(&self) -> Result<Vec<V>, StoreError> {
        let txn = self.db.begin_read().map_err(redb::Error::from)?;
        let table = txn
            .open_table(self.definition())
            .map_err(redb::Error::from)?;
        let mut values = Vec::new();
        for entry in table.iter().map_err(redb::Error::from)? {
            let (key, bytes) = entry.map_err(redb::Error::from)?;
            let value =
                serde_json::from_slice(bytes.value()).map_err(|source| StoreError::Decode {
                    key: key.value().to_string(),
                    source,
                })?;
            values.push(value);
        }
        Ok(values)
    }

    fn count(&self) -> Result<u64, StoreError> {
        let txn = self.db.begin_read().map_err(redb::Error::from)?;
        let table = txn
            .open_table(self.definition())
            .map_err(redb::Error::from)?;
        Ok(table.len().map_err(redb::Error::from)?)
    }

    fn delete(&self, key: &str) -> Result<bool, StoreError> {
        let (removed, _) =
            self.write(|table| Ok(table.remove(key).map_err(redb::Error::from)?.is_some()))?;
        Ok(removed)
    }

    fn index(&self) -> Result<u64, StoreError> {
        let txn = self.db.begin_read().map_err(redb::Error::from)?;
        let meta = txn.open_table(META).map_err(redb::Error::from)?;
        Ok(meta
            .get(self.table.as_str())
            .map_err(redb::Error::from)?
            .map(|v| v.value())
            .unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_was_put_is_there_after_the_file_is_opened_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cube.redb");
        {
            let store = PersistentStore::<String>::new(PersistentDb::open(&path).unwrap(), "tasks")
                .unwrap();
            store.put("t1", &"running".to_string()).unwrap();
        }
        let store =
            PersistentStore::<String>::new(PersistentDb::open(&path).unwrap(), "tasks").unwrap();
        assert_eq!(store.get("t1").unwrap().as_deref(), Some("running"));
        assert_eq!(store.index().unwrap(), 1);
    }

    #[test]
    fn a_file_open_elsewhere_is_refused_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cube.redb");
        let _first = PersistentDb::open(&path).unwrap();
        let err = PersistentDb::open(&path).err().unwrap().to_string();
        assert!(err.contains("in use by another process"), "{err}");
    }

    #[test]
    fn stores_in_one_file_keep_their_own_values_and_index() {
        let dir = tempfile::tempdir().unwrap();
        let db = PersistentDb::open(&dir.path().join("cube.redb")).unwrap();
        let tasks = PersistentStore::<u32>::new(db.clone(), "tasks").unwrap();
        let events = PersistentStore::<u32>::new(db, "events").unwrap();
        tasks.put("a", &1).unwrap();
        tasks.put("b", &2).unwrap();
        events.put("a", &9).unwrap();
        assert_eq!((tasks.index().unwrap(), events.index().unwrap()), (2, 1));
        assert_eq!(events.list().unwrap(), vec![9]);
    }
}
