//! A manager's store table as a source for the controller framework's watchers: a listing at
//! a revision (`Store::list_with_revision`), then the changes after it (`Store::watch`). A
//! watch the store can no longer serve (it started before the changes the store keeps, or
//! fell too far behind) is a lost sync: the watcher lists again. This is the seam where a
//! store shared by several managers (etcd) feeds the same controllers.

use std::sync::{Arc, Mutex};

use cube_controller::store::Change;
use cube_controller::watcher::{Batch, Listing, Source, SourceError};
use cube_store::{Store, Watch};

use crate::cluster::lock;

/// One table of the store, every key in it, as a source.
pub struct TableSource<V> {
    store: Arc<dyn Store<V>>,
    /// The watch in use and the revision it has delivered up to, kept between calls so that
    /// following a table is one watch, not one per batch.
    watch: Mutex<Option<(u64, Watch<V>)>>,
}

impl<V> TableSource<V> {
    pub fn new(store: Arc<dyn Store<V>>) -> Self {
        TableSource {
            store,
            watch: Mutex::new(None),
        }
    }
}

fn unavailable(err: impl std::fmt::Display) -> SourceError {
    SourceError::Unavailable(err.to_string())
}

impl<V> Source for TableSource<V>
where
    V: PartialEq + Send + Sync + 'static,
{
    type Key = String;
    type Value = V;

    async fn list(&self) -> Result<Listing<String, V>, SourceError> {
        let listing = self.store.list_with_revision().map_err(unavailable)?;
        *lock(&self.watch) = None;
        Ok(Listing {
            items: listing
                .entries
                .into_iter()
                .map(|(key, value, _)| (key, Arc::new(value)))
                .collect(),
            revision: listing.revision,
        })
    }

    async fn changes(&self, revision: u64) -> Result<Batch<String, V>, SourceError> {
        // The watch is taken out while it is waited on (a `std` mutex is not held across an
        // await) and put back with the revision it reached.
        let kept = lock(&self.watch).take();
        let mut watch = match kept {
            Some((at, watch)) if at == revision => watch,
            _ => self.store.watch("", revision).map_err(unavailable)?,
        };
        let first = watch.next().await;
        let mut changes = Vec::new();
        let mut reached = revision;
        let mut next = Some(first);
        while let Some(change) = next {
            match change {
                Ok(change) => {
                    reached = change.revision();
                    changes.push(match change {
                        cube_store::Change::Put { key, value, .. } => Change::put(key, value),
                        cube_store::Change::Delete { key, .. } => Change::Delete(key),
                    });
                }
                Err(err) if err.needs_relist() => return Err(SourceError::Expired(revision)),
                Err(err) => return Err(unavailable(err)),
            }
            next = watch.try_next();
        }
        *lock(&self.watch) = Some((reached, watch));
        Ok(Batch {
            changes,
            revision: reached,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cube_controller::store::ObservedStore;
    use cube_controller::watcher::Watcher;
    use cube_store::PersistentDb;
    use tokio_util::sync::CancellationToken;

    #[tokio::test]
    async fn a_watcher_on_a_store_file_table_lists_then_follows_its_writes() {
        let dir = tempfile::tempdir().unwrap();
        let db = PersistentDb::open(&dir.path().join("manager.redb")).unwrap();
        let table: Arc<dyn Store<u32>> =
            Arc::new(cube_store::PersistentStore::new(db, "jobs").unwrap());
        table.put("a", &1).unwrap();
        let observed: ObservedStore<String, u32> = ObservedStore::default();
        let watcher = Watcher::new(TableSource::new(table.clone()), observed.clone());
        let shutdown = CancellationToken::new();
        let running = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { watcher.run(shutdown).await }
        });
        observed.wait_synced().await;
        assert_eq!(observed.get(&"a".to_string()).as_deref(), Some(&1));
        let index = observed.index();
        table.put("b", &2).unwrap();
        table.put("a", &3).unwrap();
        table.delete("b").unwrap();
        let mut seen = Vec::new();
        let mut since = index;
        while seen.len() < 3 {
            for delta in observed.wait_changes_since(since).await.unwrap() {
                since = delta.index;
                seen.push((delta.key.clone(), delta.after.as_deref().copied()));
            }
        }
        assert_eq!(
            seen,
            vec![
                ("b".to_string(), Some(2)),
                ("a".to_string(), Some(3)),
                ("b".to_string(), None),
            ]
        );
        shutdown.cancel();
        running.await.unwrap();
    }
}
