//! A store in etcd, for several managers sharing one state.
//!
//! Every value is one key, `PREFIX/TABLE/KEY`, its value the same JSON a redb table holds.
//! The contract is the [`Store`] trait's, as the redb store keeps it:
//! - **durable before acknowledged**: a write is answered only once etcd committed it (a
//!   raft majority wrote it to their logs), and once the store's watchers have it;
//! - **revisions** are etcd's: one counter for the whole cluster, every key's `mod_revision`
//!   its own; [`Store::put_if`] is an etcd transaction comparing the key's `mod_revision`;
//! - **watches** are a snapshot at revision R ([`Store::list_with_revision`]: every key in
//!   one read, then the values in pages between known keys, all at R) then the changes
//!   after R, fed by one etcd watch of the
//!   prefix (`feed.rs`); a compaction the store could not follow ends every watch with a
//!   lost sync ([`WatchError::Missed`](crate::WatchError::Missed)), and the watcher lists
//!   again;
//! - **a dead member is skipped** (`members.rs`): each request goes to the member that
//!   answered last and moves on to the others while members fail.
//!
//! The etcd client is asynchronous and the [`Store`] trait's reads are not: the store runs
//! its own small runtime (two threads) for the client, the writer and the feed, and a read
//! waits for its answer on the calling thread, as a redb read waits for the disk.
//!
//! [`EtcdDb::set_fence`] conditions every write on the keys a manager holds (`writer.rs`):
//! the leadership key, or the shards of the ring it holds. A manager that lost its
//! leadership, or any one of those shards, has its writes refused ([`StoreError::Fenced`]).

mod feed;
mod leader;
mod leased;
mod members;
mod versioned;
mod writer;

use std::future::Future;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::GetOptions;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::commit::{Commit, Slot, TableHub};
use crate::revision::{ConditionalCommit, Expected, Listing};
use crate::watch::{History, Watch};
use crate::{Store, StoreError};

pub use leader::Leadership;
pub use leased::{Lease, LeasedKey};
pub use versioned::{Optimistic, Quiet, Unchanged, Versioned};
pub use writer::{Fence, FenceError, FenceKey};

use feed::Hubs;
use members::Members;
use writer::{Answer, FenceCell, QueuedWrite};

/// What a range read brings back: `(key within the table, value, mod_revision)` in key
/// order, and the revision it was read at.
type RawRange = (Vec<(String, Vec<u8>, u64)>, u64);

/// How many keys one range read brings back: a table of 10,000 tasks is read in pages that
/// stay well under gRPC's 4 MiB message limit.
const PAGE: i64 = 500;

/// Where the etcd cluster is and how long to wait for it.
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// `host:port` (or `http://host:port`) of each member.
    pub endpoints: Vec<String>,
    /// The prefix every key lives under, e.g. `/cube`.
    pub prefix: String,
    /// How long one member is given to answer one request before the next is asked.
    pub attempt_timeout: Duration,
    /// How long a request may take in all, over every member.
    pub request_timeout: Duration,
}

impl EtcdConfig {
    /// The defaults: 2 s per member and attempt, 10 s per request.
    pub fn new(endpoints: Vec<String>, prefix: &str) -> EtcdConfig {
        EtcdConfig {
            endpoints,
            prefix: prefix.to_string(),
            attempt_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// Checks and normalises a prefix: it starts with `/`, ends without one, and holds no
/// empty segment.
pub fn normalize_prefix(prefix: &str) -> Result<String, StoreError> {
    let trimmed = prefix.trim_end_matches('/');
    if !trimmed.starts_with('/') || trimmed.contains("//") {
        return Err(StoreError::Etcd(format!(
            "the etcd prefix {prefix:?} must start with '/' and have no empty segment, like /cube"
        )));
    }
    Ok(trimmed.to_string())
}

/// A connection to an etcd cluster under one prefix, shared by the stores of its tables.
#[derive(Clone)]
pub struct EtcdDb {
    inner: Arc<DbInner>,
}

struct DbInner {
    /// The runtime the client, the writer and the feed run on; shut down with the store.
    runtime: Option<tokio::runtime::Runtime>,
    members: Arc<Members>,
    /// `PREFIX/`.
    root: String,
    hubs: Arc<Hubs>,
    /// The writer's queue; unbounded because writes are queued under callers' locks and
    /// must not wait there (each caller waits for its own write, which bounds the queue).
    writes: mpsc::UnboundedSender<QueuedWrite>,
    fence: FenceCell,
    /// Ends the feed (the writer ends when its queue's senders are gone).
    shutdown: CancellationToken,
    config: EtcdConfig,
}

impl Drop for DbInner {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.hubs.close();
        if let Some(runtime) = self.runtime.take() {
            // Dropping a runtime inside another one panics; this stops its threads without
            // waiting (writes not yet answered are answered with an error by `Answer`).
            runtime.shutdown_background();
        }
    }
}

impl EtcdDb {
    /// Connects to the cluster and checks that a member answers (within the request
    /// timeout): a manager does not start on a cluster it cannot reach.
    pub fn connect(config: EtcdConfig) -> Result<EtcdDb, StoreError> {
        EtcdDb::connect_from(config, None)
    }

    /// [`EtcdDb::connect`], its feed starting after `start` instead of the revision now:
    /// for a test of a feed that finds its changes compacted.
    pub(crate) fn connect_from(
        config: EtcdConfig,
        start: Option<u64>,
    ) -> Result<EtcdDb, StoreError> {
        let prefix = normalize_prefix(&config.prefix)?;
        let root = format!("{prefix}/");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cube-etcd")
            .enable_all()
            .build()
            .map_err(|err| StoreError::Etcd(format!("cannot start the etcd client: {err}")))?;
        let checked = wait_on(&runtime, {
            let config = config.clone();
            let root = root.clone();
            async move {
                let members = Members::connect(
                    &config.endpoints,
                    config.attempt_timeout,
                    config.request_timeout,
                )
                .await?;
                let revision = feed::current_revision(&members, &root).await?;
                Ok((Arc::new(members), revision))
            }
        });
        let (members, revision) = match checked {
            Ok(checked) => checked,
            Err(err) => {
                // Dropping a runtime inside another one panics: stop it without waiting.
                runtime.shutdown_background();
                return Err(err);
            }
        };
        let hubs = Arc::new(Hubs::new(root.clone(), start.unwrap_or(revision)));
        let shutdown = CancellationToken::new();
        let fence: FenceCell = Arc::new(Mutex::new(None));
        let (writes, queue) = mpsc::unbounded_channel();
        runtime.spawn(feed::run(members.clone(), hubs.clone(), shutdown.clone()));
        runtime.spawn(writer::run(
            members.clone(),
            queue,
            fence.clone(),
            leader::leader_key(&root),
            hubs.seen(),
            config.request_timeout,
        ));
        Ok(EtcdDb {
            inner: Arc::new(DbInner {
                runtime: Some(runtime),
                members,
                root,
                hubs,
                writes,
                fence,
                shutdown,
                config,
            }),
        })
    }

    /// The endpoints, comma-separated, and the prefix: for the listening line.
    pub fn describe(&self) -> String {
        format!(
            "etcd {} under {}",
            self.inner.members.describe(),
            self.inner.root.trim_end_matches('/')
        )
    }

    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
    }

    /// The whole etcd key of `key` in `table`.
    fn key(&self, table: &str, key: &str) -> String {
        format!("{}{table}/{key}", self.inner.root)
    }

    /// From now on every write is conditioned on `fence`, every one of its keys (`None`: on
    /// nothing). The token is cancelled when a write conditioned on this fence is refused:
    /// the process no longer holds one of its keys (it no longer leads, or lost a shard),
    /// and should stop acting as if it did. A later `set_fence` replaces the fence (a
    /// manager that takes or gives back a shard sets the new set of keys) and hands out a
    /// new token; the old one is then never cancelled.
    pub fn set_fence(&self, fence: Option<Fence>) -> CancellationToken {
        let refused = CancellationToken::new();
        *self
            .inner
            .fence
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) =
            fence.map(|fence| (fence, refused.clone()));
        refused
    }

    /// The [`FenceKey`] of `key`, relative to the store's prefix as the keys of
    /// [`EtcdDb::read_prefix`] and [`EtcdDb::create_if_absent`] are (`ring/shards/00003`),
    /// created at `create_revision` (what `create_if_absent` answered).
    pub fn fence_key(&self, key: &str, create_revision: i64) -> FenceKey {
        FenceKey {
            key: self.whole(key),
            create_revision,
        }
    }

    /// Runs `future` on the store's runtime (where the etcd client lives) and awaits it
    /// from any runtime.
    async fn on_runtime<T: Send + 'static>(
        &self,
        future: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        let Some(runtime) = &self.inner.runtime else {
            return Err(StoreError::Etcd("the etcd store is closed".to_string()));
        };
        runtime
            .spawn(future)
            .await
            .map_err(|err| StoreError::Etcd(format!("the etcd client's task ended: {err}")))?
    }

    /// Runs `future` on the store's runtime and waits for it on this thread.
    fn wait<T: Send + 'static>(
        &self,
        future: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        match &self.inner.runtime {
            Some(runtime) => wait_on(runtime, future),
            None => Err(StoreError::Etcd("the etcd store is closed".to_string())),
        }
    }

    fn queue(
        &self,
        table: &str,
        key: &str,
        value: Option<Vec<u8>>,
        expected: Option<Expected>,
    ) -> Result<Commit, StoreError> {
        let slot = Arc::new(Slot::default());
        let write = QueuedWrite {
            key: self.key(table, key),
            value,
            expected,
            answer: Answer::new(slot.clone()),
        };
        self.inner
            .writes
            .send(write)
            .map_err(|_| StoreError::Etcd("the etcd store is closed".to_string()))?;
        Ok(Commit::remote(slot))
    }

    /// Every key under `PREFIX/TABLE/` with its value and `mod_revision`, in key order, and
    /// the revision they were read at: pages of [`PAGE`] keys, all read at the first page's
    /// revision.
    fn range(&self, table: &str) -> Result<RawRange, StoreError> {
        self.table_range(table, "")
    }

    /// [`range`](EtcdDb::range) of the keys of `table` that start with `prefix` (keys given
    /// relative to the table, as `range` gives them).
    fn table_range(&self, table: &str, prefix: &str) -> Result<RawRange, StoreError> {
        let members = self.inner.members.clone();
        let table_start = format!("{}{table}/", self.inner.root);
        let start = format!("{table_start}{prefix}");
        let (mut entries, revision) =
            self.wait(async move { read_table(&members, &start).await })?;
        if !prefix.is_empty() {
            for (key, _, _) in &mut entries {
                key.insert_str(0, prefix);
            }
        }
        Ok((entries, revision))
    }

    /// The revision of the cluster now.
    fn current_revision(&self) -> Result<u64, StoreError> {
        let members = self.inner.members.clone();
        let root = self.inner.root.clone();
        self.wait(async move { feed::current_revision(&members, &root).await })
    }
}

/// Reads every key that starts with `start` with its value, at one revision: first every
/// key alone, in one answer, then the values in pages of [`PAGE`] keys, each page's range
/// ending at the next page's first key. etcd 3.4 walks the whole of a range's index for
/// each read of it, however few keys the read asks for: pages over the open range
/// `[from, end)` cost the rest of the table each, which made reading 200,000 tasks take
/// 19 s (quadratic); a page whose range holds only its own keys costs those.
pub(super) async fn read_table(members: &Members, start: &str) -> Result<RawRange, StoreError> {
    use futures_util::StreamExt;
    let end = prefix_end(start);
    let mut keys = members
        .call(|client| {
            let (from, options) = (
                start.as_bytes().to_vec(),
                GetOptions::new().with_range(end.clone()).with_keys_only(),
            );
            get_large(client, from, options)
        })
        .await?;
    let revision = keys.header().map_or(0, |header| header.revision());
    let keys: Vec<Vec<u8>> = keys
        .take_kvs()
        .into_iter()
        .map(|kv| kv.into_key_value().0)
        .collect();
    // Each page's range: from its first key to the next page's first key (the last page's
    // to the table's end). A few pages are asked for at once, their answers kept in order.
    let ranges: Vec<(Vec<u8>, Vec<u8>)> = keys
        .chunks(PAGE as usize)
        .enumerate()
        .filter_map(|(index, page)| {
            let from = page.first()?.clone();
            let until = keys
                .get((index + 1) * PAGE as usize)
                .cloned()
                .unwrap_or_else(|| end.clone());
            Some((from, until))
        })
        .collect();
    let mut pages = futures_util::stream::iter(ranges)
        .map(|(from, until)| {
            let options = GetOptions::new().with_range(until).with_revision(revision);
            // A page of large records (tasks of pods) may pass gRPC's 4 MiB too.
            members.call(move |client| get_large(client, from.clone(), options.clone()))
        })
        .buffered(PAGES_AT_ONCE);
    let mut entries = Vec::with_capacity(keys.len());
    while let Some(page) = pages.next().await {
        for kv in page?.take_kvs() {
            let mod_revision = u64::try_from(kv.mod_revision()).unwrap_or(0);
            let (key, value) = kv.into_key_value();
            let key = String::from_utf8_lossy(&key[start.len()..]).into_owned();
            entries.push((key, value, mod_revision));
        }
    }
    Ok((entries, u64::try_from(revision).unwrap_or(0)))
}

/// A range read whose answer may pass gRPC's 4 MiB (every key of a table, a page of large
/// values), up to [`KEYS_ANSWER_LIMIT`].
async fn get_large(
    client: etcd_client::Client,
    from: Vec<u8>,
    options: GetOptions,
) -> Result<etcd_client::GetResponse, etcd_client::Error> {
    client
        .kv_client()
        .max_decoding_message_size(KEYS_ANSWER_LIMIT)
        .get(from, Some(options))
        .await
}

/// How many keys [`Store::get_first`] asks for at once.
const GETS_AT_ONCE: usize = 16;

/// How many pages of a table's values are asked for at once.
const PAGES_AT_ONCE: usize = 4;

/// The largest answer of every key of a table, without values (some 60 MB for a million
/// tasks' keys: gRPC's default, 4 MiB, holds some 70,000), and of one page of values.
const KEYS_ANSWER_LIMIT: usize = 256 * 1024 * 1024;

/// The first key after every key that starts with `prefix` (etcd's range end).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Runs `future` on `runtime` and blocks this thread for its answer. Works from inside
/// another runtime's thread too (a `std` channel, not `block_on`).
fn wait_on<T: Send + 'static>(
    runtime: &tokio::runtime::Runtime,
    future: impl Future<Output = Result<T, StoreError>> + Send + 'static,
) -> Result<T, StoreError> {
    let (sender, receiver) = std::sync::mpsc::sync_channel(1);
    runtime.spawn(async move {
        let _ = sender.send(future.await);
    });
    receiver
        .recv()
        .unwrap_or_else(|_| Err(StoreError::Etcd("the etcd store is closed".to_string())))
}

/// Values of type `V` under `PREFIX/TABLE/` in etcd, as JSON.
pub struct EtcdStore<V> {
    db: EtcdDb,
    table: String,
    hub: TableHub,
    _values: PhantomData<fn() -> V>,
}

impl<V> EtcdStore<V> {
    /// The store of `table` (no `/` in it). It keeps its recent changes (at most 8 MiB) for
    /// watches that start in the past.
    pub fn new(db: EtcdDb, table: &str) -> Result<EtcdStore<V>, StoreError> {
        EtcdStore::open(db, table, History::Kept)
    }

    /// The store of `table` that nothing watches from the past: each change reaches the
    /// watches open at the time, and none is kept in memory (unless another store of the
    /// table keeps them).
    pub fn unwatched(db: EtcdDb, table: &str) -> Result<EtcdStore<V>, StoreError> {
        EtcdStore::open(db, table, History::None)
    }

    fn open(db: EtcdDb, table: &str, history: History) -> Result<EtcdStore<V>, StoreError> {
        if table.is_empty() || table.contains('/') {
            return Err(StoreError::Etcd(format!(
                "a table name may not be empty or hold '/': {table:?}"
            )));
        }
        let hub = db.inner.hubs.hub(table, history);
        Ok(EtcdStore {
            db,
            table: table.to_string(),
            hub,
            _values: PhantomData,
        })
    }

    fn decode_error(&self, key: &str, source: serde_json::Error) -> StoreError {
        StoreError::Decode {
            path: format!("{} {}", self.db.describe(), self.table),
            key: key.to_string(),
            source,
        }
    }
}

impl<V: Serialize + DeserializeOwned + Send + 'static> Store<V> for EtcdStore<V> {
    fn put_queued(&self, key: &str, value: &V) -> Result<Commit, StoreError> {
        let bytes = crate::encode(key, value)?;
        self.db.queue(&self.table, key, Some(bytes), None)
    }

    fn put_if_queued(
        &self,
        key: &str,
        value: &V,
        expected: Expected,
    ) -> Result<ConditionalCommit, StoreError> {
        let bytes = crate::encode(key, value)?;
        let commit = self
            .db
            .queue(&self.table, key, Some(bytes), Some(expected))?;
        Ok(ConditionalCommit::queued(commit))
    }

    fn get(&self, key: &str) -> Result<Option<V>, StoreError> {
        Ok(self.get_with_revision(key)?.map(|(value, _)| value))
    }

    fn get_with_revision(&self, key: &str) -> Result<Option<(V, u64)>, StoreError> {
        let members = self.db.inner.members.clone();
        let full = self.db.key(&self.table, key);
        let found = self.db.wait(async move {
            let mut response = members
                .call(|mut client| {
                    let full = full.clone();
                    async move { client.get(full, None).await }
                })
                .await?;
            Ok(response.take_kvs().into_iter().next())
        })?;
        let Some(kv) = found else { return Ok(None) };
        let revision = u64::try_from(kv.mod_revision()).unwrap_or(0);
        let value =
            serde_json::from_slice(kv.value()).map_err(|source| self.decode_error(key, source))?;
        Ok(Some((value, revision)))
    }

    fn scan_prefix(&self, prefix: &str, visit: &mut dyn FnMut(V)) -> Result<(), StoreError> {
        let (raw, _) = self.db.table_range(&self.table, prefix)?;
        for (key, bytes, _) in raw {
            visit(
                serde_json::from_slice(&bytes).map_err(|source| self.decode_error(&key, source))?,
            );
        }
        Ok(())
    }

    fn get_first(&self, keys: &[String]) -> Result<Option<V>, StoreError> {
        use futures_util::StreamExt;
        let members = self.db.inner.members.clone();
        let wholes: Vec<String> = keys
            .iter()
            .map(|key| self.db.key(&self.table, key))
            .collect();
        let found = self.db.wait(async move {
            let mut gets = futures_util::stream::iter(wholes)
                .map(|whole| {
                    members.call(move |mut client| {
                        let whole = whole.clone();
                        async move { client.get(whole, None).await }
                    })
                })
                .buffered(GETS_AT_ONCE);
            while let Some(answer) = gets.next().await {
                if let Some(kv) = answer?.take_kvs().into_iter().next() {
                    return Ok(Some(kv));
                }
            }
            Ok(None)
        })?;
        let Some(kv) = found else { return Ok(None) };
        let key = String::from_utf8_lossy(kv.key()).into_owned();
        Ok(Some(
            serde_json::from_slice(kv.value()).map_err(|source| self.decode_error(&key, source))?,
        ))
    }

    fn list(&self) -> Result<Vec<V>, StoreError> {
        Ok(self
            .list_with_revision()?
            .entries
            .into_iter()
            .map(|(_, value, _)| value)
            .collect())
    }

    fn list_with_revision(&self) -> Result<Listing<V>, StoreError> {
        let (raw, revision) = self.db.range(&self.table)?;
        let mut entries = Vec::with_capacity(raw.len());
        for (key, bytes, changed_at) in raw {
            let value =
                serde_json::from_slice(&bytes).map_err(|source| self.decode_error(&key, source))?;
            entries.push((key, value, changed_at));
        }
        Ok(Listing { entries, revision })
    }

    fn count(&self) -> Result<u64, StoreError> {
        let members = self.db.inner.members.clone();
        let start = format!("{}{}/", self.db.inner.root, self.table);
        self.db.wait(async move {
            let end = prefix_end(&start);
            let response = members
                .call(|mut client| {
                    let (start, end) = (start.clone(), end.clone());
                    async move {
                        client
                            .get(
                                start,
                                Some(GetOptions::new().with_range(end).with_count_only()),
                            )
                            .await
                    }
                })
                .await?;
            Ok(u64::try_from(response.count()).unwrap_or(0))
        })
    }

    fn delete(&self, key: &str) -> Result<bool, StoreError> {
        Ok(self
            .db
            .queue(&self.table, key, None, None)?
            .wait_written()?
            .changed)
    }

    /// etcd's revision: it moves with every change under any prefix of the cluster.
    fn index(&self) -> Result<u64, StoreError> {
        self.db.current_revision()
    }

    fn revision(&self) -> Result<u64, StoreError> {
        self.db.current_revision()
    }

    fn watch(&self, prefix: &str, from_revision: u64) -> Result<Watch<V>, StoreError> {
        let subscription = self
            .hub
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .subscribe(prefix, from_revision);
        Ok(Watch::new(subscription, |_key, bytes: Arc<[u8]>| {
            serde_json::from_slice(&bytes).map_err(|err| err.to_string())
        }))
    }

    fn backup(&self) -> Result<std::fs::File, StoreError> {
        Err(StoreError::NoFile(format!(
            "the store is in {}: copy it with `cube store export`, or with etcd's own `etcdctl snapshot save`",
            self.db.describe()
        )))
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod unit_tests {
    use super::*;

    #[test]
    fn a_prefix_is_normalised_or_refused() {
        assert_eq!(normalize_prefix("/cube/").unwrap(), "/cube");
        assert_eq!(normalize_prefix("/a/b").unwrap(), "/a/b");
        assert!(normalize_prefix("cube").is_err());
        assert!(normalize_prefix("/a//b").is_err());
        assert!(normalize_prefix("/").is_err());
    }

    #[test]
    fn a_prefix_end_is_the_next_key_after_the_prefix() {
        assert_eq!(prefix_end("/cube/tasks/"), b"/cube/tasks0".to_vec());
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
    }
}
