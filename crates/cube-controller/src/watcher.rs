//! The watcher: keeps an [`ObservedStore`] equal to a collection elsewhere (kube-runtime's
//! `watcher`, the field report's watchers with their Sync and LostSync).
//!
//! A [`Source`] can list its collection at a revision and give the changes after a revision
//! (a blocking query: it waits for some, or ends with none after its own timeout). A
//! [`Watcher`] lists, marks the store in sync, then follows the changes. When the source says
//! the revision is too old (the watcher fell behind) or fails, the store loses sync and the
//! watcher lists again: at once when it fell behind, after a backoff when the source failed;
//! the listing reaches the store as the diff it makes ([`ObservedStore::replace_all`]).

use std::future::Future;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::runner::{ExponentialBackoff, Key};
use crate::store::{Change, ObservedStore};

/// A whole collection at one revision.
#[derive(Debug)]
pub struct Listing<K, V> {
    pub items: Vec<(K, Arc<V>)>,
    pub revision: u64,
}

/// The changes after a revision, and the revision they bring the collection to.
#[derive(Debug)]
pub struct Batch<K, V> {
    pub changes: Vec<Change<K, V>>,
    pub revision: u64,
}

/// Why a source could not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    #[error("changes after revision {0} are no longer known: list again")]
    Expired(u64),
    #[error("source unavailable: {0}")]
    Unavailable(String),
}

/// Where a collection comes from (a store's change index, a worker's change log).
pub trait Source: Send + Sync + 'static {
    type Key: Key;
    type Value: PartialEq + Send + Sync + 'static;
    fn list(
        &self,
    ) -> impl Future<Output = Result<Listing<Self::Key, Self::Value>, SourceError>> + Send;
    /// The changes after `revision`; waits while there are none (it may end with an empty
    /// batch after its own timeout).
    fn changes(
        &self,
        revision: u64,
    ) -> impl Future<Output = Result<Batch<Self::Key, Self::Value>, SourceError>> + Send;
}

/// Where a watcher is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WatchState {
    /// Listing; `failures` in a row so far decide the wait before it.
    Listing { failures: u32 },
    /// Following the changes after `revision`.
    Following { revision: u64 },
}

/// Drives an [`ObservedStore`] from a [`Source`].
pub struct Watcher<S: Source> {
    source: S,
    store: ObservedStore<S::Key, S::Value>,
    backoff: ExponentialBackoff,
}

impl<S: Source> Watcher<S> {
    pub fn new(source: S, store: ObservedStore<S::Key, S::Value>) -> Self {
        Watcher {
            source,
            store,
            backoff: ExponentialBackoff::default(),
        }
    }

    /// With another backoff between failed listings.
    pub fn with_backoff(mut self, backoff: ExponentialBackoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Lists and follows until `shutdown`. The store keeps what it holds, out of sync after a
    /// failure, in sync otherwise.
    pub async fn run(&self, shutdown: CancellationToken) {
        let mut state = WatchState::Listing { failures: 0 };
        loop {
            state = tokio::select! {
                () = shutdown.cancelled() => return,
                next = self.step(state) => next,
            };
        }
    }

    /// One listing, or one batch of changes.
    async fn step(&self, state: WatchState) -> WatchState {
        match state {
            WatchState::Listing { failures } => {
                if failures > 0 {
                    tokio::time::sleep(self.backoff.delay(failures)).await;
                }
                match self.source.list().await {
                    Ok(listing) => {
                        let changed = self.store.replace_all(listing.items).len();
                        self.store.set_synced(true);
                        tracing::debug!(revision = listing.revision, changed, "listed");
                        WatchState::Following {
                            revision: listing.revision,
                        }
                    }
                    Err(error) => {
                        let failures = failures.saturating_add(1);
                        tracing::warn!(%error, failures, "listing failed");
                        WatchState::Listing { failures }
                    }
                }
            }
            WatchState::Following { revision } => match self.source.changes(revision).await {
                Ok(batch) => {
                    self.store.apply_all(batch.changes);
                    WatchState::Following {
                        revision: batch.revision,
                    }
                }
                Err(error) => {
                    self.store.set_synced(false);
                    tracing::warn!(%error, revision, "lost sync; listing again");
                    let failures = match error {
                        SourceError::Expired(_) => 0,
                        SourceError::Unavailable(_) => 1,
                    };
                    WatchState::Listing { failures }
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::time::Duration;
    use tokio::sync::watch;

    /// An in-memory collection with a change log that can forget and fail.
    #[derive(Default)]
    struct Fake {
        items: BTreeMap<&'static str, u32>,
        log: Vec<(u64, Change<&'static str, u32>)>,
        revision: u64,
        forgotten_through: u64,
        failing_lists: u32,
        failing_watch: bool,
    }

    #[derive(Default)]
    struct FakeSource {
        fake: Mutex<Fake>,
        /// Bumped on every edit, so a waiting `changes` looks again.
        edits: watch::Sender<u64>,
    }

    impl FakeSource {
        fn edit(&self, edit: impl FnOnce(&mut Fake)) {
            edit(&mut self.fake.lock().unwrap());
            self.edits.send_modify(|n| *n += 1);
        }

        fn put(&self, key: &'static str, value: u32) {
            self.edit(|fake| {
                fake.revision += 1;
                fake.items.insert(key, value);
                fake.log.push((fake.revision, Change::put(key, value)));
            });
        }
    }

    impl Source for Arc<FakeSource> {
        type Key = &'static str;
        type Value = u32;
        async fn list(&self) -> Result<Listing<&'static str, u32>, SourceError> {
            let mut fake = self.fake.lock().unwrap();
            if fake.failing_lists > 0 {
                fake.failing_lists -= 1;
                return Err(SourceError::Unavailable("down".into()));
            }
            let items = fake.items.iter().map(|(k, v)| (*k, Arc::new(*v))).collect();
            Ok(Listing {
                items,
                revision: fake.revision,
            })
        }
        async fn changes(&self, revision: u64) -> Result<Batch<&'static str, u32>, SourceError> {
            let mut edits = self.edits.subscribe();
            loop {
                {
                    let fake = self.fake.lock().unwrap();
                    if fake.failing_watch {
                        return Err(SourceError::Unavailable("watch broke".into()));
                    }
                    if revision < fake.forgotten_through {
                        return Err(SourceError::Expired(revision));
                    }
                    let changes: Vec<_> = fake
                        .log
                        .iter()
                        .filter(|(at, _)| *at > revision)
                        .map(|(_, change)| change.clone())
                        .collect();
                    if !changes.is_empty() {
                        return Ok(Batch {
                            changes,
                            revision: fake.revision,
                        });
                    }
                }
                edits.changed().await.unwrap();
            }
        }
    }

    fn start(source: &Arc<FakeSource>) -> (ObservedStore<&'static str, u32>, CancellationToken) {
        let store = ObservedStore::default();
        let shutdown = CancellationToken::new();
        let watcher = Watcher::new(source.clone(), store.clone());
        let stop = shutdown.clone();
        tokio::spawn(async move { watcher.run(stop).await });
        (store, shutdown)
    }

    fn contents(store: &ObservedStore<&'static str, u32>) -> Vec<(&'static str, u32)> {
        store
            .snapshot()
            .items
            .iter()
            .map(|(k, v)| (*k, **v))
            .collect()
    }

    async fn wait(millis: u64) {
        tokio::time::sleep(Duration::from_millis(millis)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_watcher_lists_marks_the_store_in_sync_then_follows_changes() {
        let source = Arc::new(FakeSource::default());
        source.put("a", 1);
        let (store, shutdown) = start(&source);
        store.wait_synced().await;
        assert_eq!(contents(&store), [("a", 1)]);
        source.put("b", 2);
        source.put("a", 3);
        wait(10).await;
        assert_eq!(contents(&store), [("a", 3), ("b", 2)]);
        shutdown.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_watcher_that_falls_behind_loses_sync_and_lists_again() {
        let source = Arc::new(FakeSource::default());
        source.put("a", 1);
        source.put("b", 1);
        let (store, shutdown) = start(&source);
        store.wait_synced().await;
        let mut synced = store.synced();
        synced.borrow_and_update();
        // The source forgets its log (the watcher is behind) and cannot list for a while.
        source.edit(|fake| {
            fake.items.remove("b");
            fake.items.insert("c", 1);
            fake.revision += 5;
            fake.forgotten_through = fake.revision;
            fake.failing_lists = 1;
        });
        wait(10).await;
        assert!(!store.is_synced(), "lost sync while it cannot list");
        wait(300).await;
        assert!(store.is_synced());
        assert_eq!(
            contents(&store),
            [("a", 1), ("c", 1)],
            "the listing's diff applied"
        );
        source.put("d", 1);
        wait(10).await;
        assert_eq!(store.len(), 3, "following again");
        shutdown.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_source_is_listed_again_with_backoff() {
        let source = Arc::new(FakeSource::default());
        source.edit(|fake| fake.failing_lists = 2);
        source.put("a", 1);
        let start_at = tokio::time::Instant::now();
        let (store, shutdown) = start(&source);
        store.wait_synced().await;
        // Failed at 0 and 250 ms, listed at 750 ms.
        assert_eq!(start_at.elapsed(), Duration::from_millis(750));
        source.edit(|fake| fake.failing_watch = true);
        wait(10).await;
        assert!(!store.is_synced());
        source.edit(|fake| fake.failing_watch = false);
        wait(300).await;
        assert!(store.is_synced());
        shutdown.cancel();
    }
}
