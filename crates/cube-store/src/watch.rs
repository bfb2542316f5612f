//! Watching a store: every committed change after a revision, in order, then live.
//!
//! Each store (a [`MemoryStore`](crate::MemoryStore), or one table of a
//! [`PersistentDb`](crate::PersistentDb)) has one [`ChangeHub`]: the last [`HISTORY`] changes
//! in memory, and the watchers. A change is published to the hub after it is committed and
//! before its writer is answered, by whoever holds the right to commit, so the hub sees
//! changes in revision order.
//!
//! A watch starts from the history (every change after its start revision, if the history
//! still reaches back that far) and goes on with live changes through a bounded channel of
//! its own. Publishing never waits: a watcher whose channel is full is dropped and told
//! [`WatchError::Lagged`], and a start revision older than the history is told
//! [`WatchError::Compacted`]. Both mean the same to the watcher: list the store again
//! ([`Store::list_with_revision`](crate::Store::list_with_revision)) and watch from the
//! revision the list gives, as an etcd client does after a compaction.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};

use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

/// How many recent changes a store keeps for watches that start in the past.
pub(crate) const HISTORY: usize = 10_000;

/// How many bytes of keys and values that history may hold, where the store can weigh its
/// values (a store file's JSON): 10,000 large tasks would otherwise sit in memory twice.
pub(crate) const HISTORY_BYTES: usize = 8 * 1024 * 1024;

/// How many changes may wait for one watcher before it is dropped as lagging.
pub(crate) const CHANNEL: usize = 1024;

/// One committed change of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change<V> {
    /// The key now holds `value`.
    Put {
        key: String,
        value: V,
        revision: u64,
    },
    /// The key was removed.
    Delete { key: String, revision: u64 },
}

impl<V> Change<V> {
    pub fn key(&self) -> &str {
        match self {
            Change::Put { key, .. } | Change::Delete { key, .. } => key,
        }
    }

    /// The store's revision this change made.
    pub fn revision(&self) -> u64 {
        match self {
            Change::Put { revision, .. } | Change::Delete { revision, .. } => *revision,
        }
    }

    /// The same change with its value turned into another type.
    pub(crate) fn try_map<U, E>(
        self,
        convert: impl FnOnce(&str, V) -> Result<U, E>,
    ) -> Result<Change<U>, E> {
        Ok(match self {
            Change::Put {
                key,
                value,
                revision,
            } => Change::Put {
                value: convert(&key, value)?,
                key,
                revision,
            },
            Change::Delete { key, revision } => Change::Delete { key, revision },
        })
    }
}

/// Why a watch delivers no more changes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WatchError {
    /// The changes after `requested` are no longer kept: re-list.
    #[error(
        "the changes after revision {requested} are no longer kept (a watch can start from revision {oldest} or later): list the store again and watch from its revision"
    )]
    Compacted { requested: u64, oldest: u64 },
    /// The watcher fell behind the commits by more than its channel holds and was dropped,
    /// so that commits never wait for it: re-list.
    #[error(
        "the watcher fell more than {capacity} changes behind and was dropped: list the store again and watch from its revision"
    )]
    Lagged { capacity: usize },
    /// The store's own feed of changes missed some (etcd compacted them while the store's
    /// watch of etcd was broken): re-list.
    #[error(
        "the store missed changes (they were compacted before its watch of etcd resumed): list the store again and watch from its revision"
    )]
    Missed,
    /// The store was closed or failed: nothing more will be committed.
    #[error("the store closed or failed: no more changes will come")]
    Closed,
    /// A changed value did not read back as the store's type.
    #[error("the changed value under key {key:?} is unreadable: {reason}")]
    Decode { key: String, reason: String },
}

impl WatchError {
    /// Whether the watcher should list the store again and start a new watch from the
    /// list's revision.
    pub fn needs_relist(&self) -> bool {
        matches!(
            self,
            WatchError::Compacted { .. } | WatchError::Lagged { .. } | WatchError::Missed
        )
    }
}

/// What a watcher's end flag says; set by the hub before it drops the watcher's sender.
const LIVE: u8 = 0;
const LAGGED: u8 = 1;
const CLOSED: u8 = 2;
const MISSED: u8 = 3;

/// The recent changes of one store and the watchers of it. Not locked itself: the store
/// keeps it under the lock that orders its commits' publication.
pub(crate) struct ChangeHub<T> {
    /// The last changes, oldest first, at most `history_capacity` and, past the newest,
    /// at most `max_history_bytes`.
    history: VecDeque<Change<T>>,
    history_capacity: usize,
    history_bytes: usize,
    max_history_bytes: usize,
    /// The bytes a value holds (0 where the store cannot tell).
    weigh: fn(&T) -> usize,
    /// Every change after this revision is in `history` (or still to come); a watch may
    /// start here or later.
    oldest: u64,
    watchers: Vec<Watcher<T>>,
    channel_capacity: usize,
}

/// One live watch, as the hub sees it.
struct Watcher<T> {
    prefix: String,
    /// Changes at or before this were delivered from the history, or are not wanted.
    from: u64,
    /// Bounded: a full channel drops the watcher rather than blocking a commit.
    sender: mpsc::Sender<Change<T>>,
    end: Arc<AtomicU8>,
}

impl<T> ChangeHub<T> {
    /// A hub of a store whose changes up to `revision` are not known to it.
    pub(crate) fn new(revision: u64) -> ChangeHub<T> {
        ChangeHub::with_limits(revision, HISTORY, CHANNEL)
    }

    pub(crate) fn with_limits(
        revision: u64,
        history_capacity: usize,
        channel_capacity: usize,
    ) -> ChangeHub<T> {
        ChangeHub {
            history: VecDeque::new(),
            history_capacity,
            history_bytes: 0,
            max_history_bytes: usize::MAX,
            weigh: |_| 0,
            oldest: revision,
            watchers: Vec::new(),
            channel_capacity: channel_capacity.max(1),
        }
    }
}

/// Whether a table keeps its recent changes for watches that start in the past.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum History {
    /// The last [`HISTORY`] changes (and [`HISTORY_BYTES`] where values are weighed).
    Kept,
    /// None: each change reaches the watches open at the time, and a watch starts at the
    /// current revision or is told it is too old. For a table nothing watches from the past.
    None,
}

impl<T: Clone> ChangeHub<T> {
    /// A hub of a table's changes from `revision` on, its values weighed as their bytes, with
    /// the history asked for.
    pub(crate) fn of_bytes(revision: u64, history: History) -> ChangeHub<T>
    where
        T: AsRef<[u8]>,
    {
        let mut hub =
            ChangeHub::new(revision).weighing(|value: &T| value.as_ref().len(), HISTORY_BYTES);
        if history == History::None {
            hub.history_capacity = 0;
        }
        hub
    }

    /// Keeps a history from now on, if the hub kept none: one store of a table that asks for
    /// it is enough (a table's stores share its hub).
    pub(crate) fn keep_history(&mut self, history: History) {
        if history == History::Kept {
            self.history_capacity = self.history_capacity.max(HISTORY);
        }
    }

    /// The same hub, its history also bounded by the bytes `weigh` counts in its values.
    pub(crate) fn weighing(self, weigh: fn(&T) -> usize, max_history_bytes: usize) -> Self {
        ChangeHub {
            weigh,
            max_history_bytes,
            ..self
        }
    }

    fn weight(&self, change: &Change<T>) -> usize {
        match change {
            Change::Put { key, value, .. } => key.len() + (self.weigh)(value),
            Change::Delete { key, .. } => key.len(),
        }
    }

    /// Hands a committed change to every watcher that wants it and keeps it in the history.
    /// Never waits: a watcher whose channel is full is dropped, told it lagged.
    pub(crate) fn publish(&mut self, change: Change<T>) {
        let (key, revision) = (change.key(), change.revision());
        self.watchers.retain(|watcher| {
            if revision <= watcher.from || !key.starts_with(&watcher.prefix) {
                // Kept unless its watch was dropped: a map that grows must shrink too.
                return !watcher.sender.is_closed();
            }
            match watcher.sender.try_send(change.clone()) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) => {
                    watcher.end.store(LAGGED, Ordering::Release);
                    false
                }
                Err(TrySendError::Closed(_)) => false,
            }
        });
        self.history_bytes += self.weight(&change);
        self.history.push_back(change);
        while self.history.len() > self.history_capacity
            || (self.history_bytes > self.max_history_bytes && self.history.len() > 1)
        {
            let Some(dropped) = self.history.pop_front() else {
                break;
            };
            self.history_bytes -= self.weight(&dropped);
            self.oldest = dropped.revision();
        }
    }

    /// A watch of the keys starting with `prefix`, from the first change after `from`.
    pub(crate) fn subscribe(&mut self, prefix: &str, from: u64) -> Subscription<T> {
        if from < self.oldest {
            return Subscription::ended(WatchError::Compacted {
                requested: from,
                oldest: self.oldest,
            });
        }
        let backlog = self
            .history
            .iter()
            .filter(|change| change.revision() > from && change.key().starts_with(prefix))
            .cloned()
            .collect();
        self.watchers.retain(|watcher| !watcher.sender.is_closed());
        let (sender, receiver) = mpsc::channel(self.channel_capacity);
        let end = Arc::new(AtomicU8::new(LIVE));
        let from = self
            .history
            .back()
            .map_or(from, |last| last.revision().max(from));
        self.watchers.push(Watcher {
            prefix: prefix.to_string(),
            from,
            sender,
            end: end.clone(),
        });
        Subscription {
            backlog,
            receiver: Some(receiver),
            end,
            ended: None,
            channel_capacity: self.channel_capacity,
        }
    }

    /// Ends every watch with [`WatchError::Closed`] once they have read what was sent: the
    /// store takes no more writes.
    pub(crate) fn close(&mut self) {
        for watcher in self.watchers.drain(..) {
            watcher.end.store(CLOSED, Ordering::Release);
        }
    }

    /// The changes after the last one published are lost to this hub (etcd compacted them):
    /// every watch ends with [`WatchError::Missed`], the history is forgotten, and new
    /// watches may start at `revision` or later.
    pub(crate) fn lose_sync(&mut self, revision: u64) {
        for watcher in self.watchers.drain(..) {
            watcher.end.store(MISSED, Ordering::Release);
        }
        self.history.clear();
        self.history_bytes = 0;
        self.oldest = self.oldest.max(revision);
    }

    #[cfg(test)]
    pub(crate) fn watcher_count(&self) -> usize {
        self.watchers.len()
    }
}

/// The receiving end of one watch, before values are decoded.
pub(crate) struct Subscription<T> {
    /// What the history held after the start revision when the watch began.
    backlog: VecDeque<Change<T>>,
    /// Live changes; `None` once the watch has ended.
    receiver: Option<mpsc::Receiver<Change<T>>>,
    end: Arc<AtomicU8>,
    /// Why the watch ended, said again on every later read.
    ended: Option<WatchError>,
    channel_capacity: usize,
}

impl<T> Subscription<T> {
    fn ended(reason: WatchError) -> Subscription<T> {
        Subscription {
            backlog: VecDeque::new(),
            receiver: None,
            end: Arc::new(AtomicU8::new(CLOSED)),
            ended: Some(reason),
            channel_capacity: 0,
        }
    }

    fn end_with(&mut self, reason: WatchError) -> Poll<Result<Change<T>, WatchError>> {
        self.receiver = None;
        self.backlog.clear();
        self.ended = Some(reason.clone());
        Poll::Ready(Err(reason))
    }

    fn poll_next(&mut self, context: &mut Context<'_>) -> Poll<Result<Change<T>, WatchError>> {
        if let Some(reason) = &self.ended {
            return Poll::Ready(Err(reason.clone()));
        }
        // A watcher that lagged is told at once: what it still holds is stale anyway.
        match self.end.load(Ordering::Acquire) {
            LAGGED => {
                let capacity = self.channel_capacity;
                return self.end_with(WatchError::Lagged { capacity });
            }
            MISSED => return self.end_with(WatchError::Missed),
            _ => {}
        }
        if let Some(change) = self.backlog.pop_front() {
            return Poll::Ready(Ok(change));
        }
        let Some(receiver) = self.receiver.as_mut() else {
            return self.end_with(WatchError::Closed);
        };
        match receiver.poll_recv(context) {
            Poll::Ready(Some(change)) => Poll::Ready(Ok(change)),
            Poll::Ready(None) => {
                let reason = match self.end.load(Ordering::Acquire) {
                    LAGGED => WatchError::Lagged {
                        capacity: self.channel_capacity,
                    },
                    MISSED => WatchError::Missed,
                    _ => WatchError::Closed,
                };
                self.end_with(reason)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// A source of decoded changes, whatever the store keeps them as.
trait Feed<V>: Send {
    fn poll_next(&mut self, context: &mut Context<'_>) -> Poll<Result<Change<V>, WatchError>>;
}

struct Decoding<T, F> {
    subscription: Subscription<T>,
    decode: F,
}

impl<T, V, F> Feed<V> for Decoding<T, F>
where
    T: Send,
    F: FnMut(&str, T) -> Result<V, String> + Send,
{
    fn poll_next(&mut self, context: &mut Context<'_>) -> Poll<Result<Change<V>, WatchError>> {
        self.subscription.poll_next(context).map(|next| {
            next.and_then(|change| {
                change.try_map(|key, value| {
                    (self.decode)(key, value).map_err(|reason| WatchError::Decode {
                        key: key.to_string(),
                        reason,
                    })
                })
            })
        })
    }
}

/// The changes of the keys under one prefix of a store, in revision order: first those
/// after the start revision that the store still keeps, then each one as it commits.
/// Dropping it ends the watch.
pub struct Watch<V> {
    feed: Box<dyn Feed<V>>,
}

impl<V: 'static> Watch<V> {
    pub(crate) fn new<T: Send + 'static>(
        subscription: Subscription<T>,
        decode: impl FnMut(&str, T) -> Result<V, String> + Send + 'static,
    ) -> Watch<V> {
        Watch {
            feed: Box::new(Decoding {
                subscription,
                decode,
            }),
        }
    }
}

impl<V> Watch<V> {
    /// The next change, waiting for it if there is none yet. Once it answers an error it
    /// answers the same error for ever; [`WatchError::needs_relist`] says whether to list
    /// the store again and watch anew.
    pub async fn next(&mut self) -> Result<Change<V>, WatchError> {
        std::future::poll_fn(|context| self.feed.poll_next(context)).await
    }

    /// The next change if one is there now; `None` when the watcher would have to wait.
    pub fn try_next(&mut self) -> Option<Result<Change<V>, WatchError>> {
        let mut context = Context::from_waker(std::task::Waker::noop());
        match self.feed.poll_next(&mut context) {
            Poll::Ready(next) => Some(next),
            Poll::Pending => None,
        }
    }
}

impl<V> std::fmt::Debug for Watch<V> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("Watch")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, revision: u64) -> Change<u32> {
        Change::Put {
            key: key.to_string(),
            value: revision as u32,
            revision,
        }
    }

    fn watch(hub: &mut ChangeHub<u32>, prefix: &str, from: u64) -> Watch<u32> {
        Watch::new(hub.subscribe(prefix, from), |_, value| Ok(value))
    }

    fn revisions(watch: &mut Watch<u32>) -> Vec<u64> {
        std::iter::from_fn(|| watch.try_next())
            .map(|next| next.unwrap().revision())
            .collect()
    }

    #[test]
    fn a_watch_gets_the_history_after_its_start_then_live_changes() {
        let mut hub = ChangeHub::new(0);
        (1..=5).for_each(|revision| hub.publish(put("k", revision)));
        let mut watch = watch(&mut hub, "", 3);
        hub.publish(put("k", 6));
        assert_eq!(revisions(&mut watch), vec![4, 5, 6]);
    }

    #[test]
    fn a_start_older_than_the_history_says_relist_with_the_oldest_start() {
        let mut hub = ChangeHub::with_limits(0, 3, 8);
        (1..=5).for_each(|revision| hub.publish(put("k", revision)));
        let err = watch(&mut hub, "", 1).try_next().unwrap().unwrap_err();
        assert_eq!(
            err,
            WatchError::Compacted {
                requested: 1,
                oldest: 2
            }
        );
        assert!(err.needs_relist());
        assert_eq!(revisions(&mut watch(&mut hub, "", 2)), vec![3, 4, 5]);
    }

    #[test]
    fn the_history_is_bounded_by_bytes_where_values_can_be_weighed() {
        let mut hub: ChangeHub<Vec<u8>> =
            ChangeHub::new(0).weighing(|value: &Vec<u8>| value.len(), 250);
        for revision in 1..=5 {
            hub.publish(Change::Put {
                key: "k".to_string(),
                value: vec![0; 99],
                revision,
            });
        }
        assert_eq!(hub.history.len(), 2, "two of 100 bytes fit in 250");
        assert_eq!(hub.history_bytes, 200);
        let compacted = Watch::new(hub.subscribe("", 2), |_, value| Ok(value)).try_next();
        assert_eq!(
            compacted.unwrap().unwrap_err(),
            WatchError::Compacted {
                requested: 2,
                oldest: 3
            }
        );
    }

    #[test]
    fn a_full_watcher_is_dropped_with_a_lag_and_the_others_go_on() {
        let mut hub = ChangeHub::with_limits(0, 100, 2);
        let mut slow = watch(&mut hub, "", 0);
        let mut fast = watch(&mut hub, "", 0);
        for revision in 1..=4 {
            hub.publish(put("k", revision));
            assert_eq!(fast.try_next().unwrap().unwrap().revision(), revision);
        }
        assert_eq!(
            slow.try_next().unwrap(),
            Err(WatchError::Lagged { capacity: 2 })
        );
        assert_eq!(hub.watcher_count(), 1);
    }

    #[test]
    fn dropped_watches_leave_the_hub() {
        let mut hub = ChangeHub::new(0);
        drop(watch(&mut hub, "a/", 0));
        hub.publish(put("b", 1));
        assert_eq!(hub.watcher_count(), 0);
    }

    #[test]
    fn a_closed_hub_ends_its_watches_after_what_they_were_sent() {
        let mut hub = ChangeHub::new(0);
        let mut watch = watch(&mut hub, "", 0);
        hub.publish(put("k", 1));
        hub.close();
        assert_eq!(watch.try_next().unwrap().unwrap().revision(), 1);
        assert_eq!(watch.try_next().unwrap(), Err(WatchError::Closed));
    }
}
