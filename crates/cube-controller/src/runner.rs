//! The runner: a keyed delay queue and the loop that reconciles its keys (kube-runtime's
//! scheduler and `controller/runner.rs`, in small).
//!
//! - **One pending entry per key.** [`Runner::push`] and [`Runner::push_after`] keep the
//!   earlier of the old and the new deadline: a later `push_after` does not postpone a key, an
//!   immediate `push` overrides a delay. One timer sleeps until the earliest deadline; no task
//!   is spawned per delay.
//! - **Never two reconciles of one key at once.** A key pushed while its reconcile runs is held
//!   back and queued when that reconcile ends (it may have read old state).
//! - **Bounded concurrency**: at most [`RunnerConfig::max_concurrent`] reconciles run.
//! - **One error policy** ([`ErrorPolicy`], by default [`ExponentialBackoff`]) decides when a
//!   failed key is tried again, from the failures in a row of that key; a success resets them.
//! - **A reconcile that panics** is caught: the key is released and handled by the policy.
//! - **No reconcile before its stores are in sync**: the [`ReadyGate`] holds new reconciles
//!   back while any of its signals is false.
//! - **Shutdown** ([`CancellationToken`]) stops starting reconciles and waits for the running
//!   ones (every one is in a [`JoinSet`]), aborting them after [`RunnerConfig::shutdown_grace`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::select_all;
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What a key must be to be queued: ordered (the queue is a B-tree, and the order makes
/// ties and tests deterministic), cheap enough to clone, and printable in logs.
pub trait Key: Ord + Clone + fmt::Debug + Send + Sync + 'static {}
impl<T: Ord + Clone + fmt::Debug + Send + Sync + 'static> Key for T {}

/// What a reconcile asks for when it succeeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing more to do until the key is pushed again.
    Done,
    /// Look again after this long (a timeout to watch, a state to poll).
    RequeueAfter(Duration),
}

/// Why a reconcile did not succeed.
#[derive(Debug)]
pub enum Failure<E> {
    /// The reconcile returned an error.
    Error(E),
    /// The reconcile panicked; the message, when the panic carried one.
    Panic(String),
}

impl<E: fmt::Display> fmt::Display for Failure<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Error(error) => write!(f, "{error}"),
            Failure::Panic(message) => write!(f, "reconcile panicked: {message}"),
        }
    }
}

/// Decides what happens to a key whose reconcile failed.
pub trait ErrorPolicy<K, E>: Send + 'static {
    /// `attempts` counts the failures in a row of `key`, this one included (1 the first
    /// time). [`Action::Done`] gives the key up until it is pushed again.
    fn on_failure(&self, key: &K, failure: &Failure<E>, attempts: u32) -> Action;
}

/// Retries after `first`, doubling each failure in a row up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExponentialBackoff {
    pub first: Duration,
    pub max: Duration,
}

impl Default for ExponentialBackoff {
    /// 250 ms, 500 ms, 1 s, … up to 10 s.
    fn default() -> Self {
        ExponentialBackoff {
            first: Duration::from_millis(250),
            max: Duration::from_secs(10),
        }
    }
}

impl ExponentialBackoff {
    /// The wait after `attempts` failures in a row (1 for the first).
    pub fn delay(&self, attempts: u32) -> Duration {
        let doublings = attempts.saturating_sub(1).min(31);
        self.first.saturating_mul(1 << doublings).min(self.max)
    }
}

impl<K, E> ErrorPolicy<K, E> for ExponentialBackoff {
    fn on_failure(&self, _key: &K, _failure: &Failure<E>, attempts: u32) -> Action {
        Action::RequeueAfter(self.delay(attempts))
    }
}

/// The bounds of a runner.
#[derive(Debug, Clone, Copy)]
pub struct RunnerConfig {
    /// Reconciles running at once, at most (at least 1).
    pub max_concurrent: usize,
    /// How long shutdown waits for running reconciles before it aborts them.
    pub shutdown_grace: Duration,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig {
            max_concurrent: 8,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// In-sync signals a runner waits for: it starts reconciles only while all are true. A
/// signal whose sender is gone keeps its last value.
#[derive(Debug, Clone, Default)]
pub struct ReadyGate {
    signals: Vec<Signal>,
}

#[derive(Debug, Clone)]
struct Signal {
    receiver: watch::Receiver<bool>,
    /// The sender is gone: the value will not change, so it is no longer watched.
    closed: bool,
}

impl ReadyGate {
    /// A gate that is always open.
    pub fn open() -> Self {
        ReadyGate::default()
    }

    /// A gate open while every one of `signals` is true.
    pub fn new(signals: impl IntoIterator<Item = watch::Receiver<bool>>) -> Self {
        let signals = signals
            .into_iter()
            .map(|receiver| Signal {
                receiver,
                closed: false,
            })
            .collect();
        ReadyGate { signals }
    }

    /// Whether every signal is true now.
    pub fn is_ready(&mut self) -> bool {
        self.signals
            .iter_mut()
            .all(|signal| *signal.receiver.borrow_and_update())
    }

    /// Waits until some signal changes (forever if none can).
    pub async fn changed(&mut self) {
        let watched: Vec<_> = self
            .signals
            .iter_mut()
            .enumerate()
            .filter(|(_, signal)| !signal.closed)
            .map(|(at, signal)| Box::pin(async move { (at, signal.receiver.changed().await) }))
            .collect();
        if watched.is_empty() {
            return std::future::pending().await;
        }
        let (at, result) = select_all(watched).await.0;
        if result.is_err() {
            self.signals[at].closed = true;
        }
    }

    /// Waits until every signal is true.
    pub async fn wait(&mut self) {
        while !self.is_ready() {
            self.changed().await;
        }
    }
}

/// A keyed work queue with delays, and the loop that reconciles its keys ([`Runner::run`]).
/// Clones share the queue: hand them to whatever pushes keys.
pub struct Runner<K> {
    shared: Arc<Shared<K>>,
}

impl<K> Clone for Runner<K> {
    fn clone(&self) -> Self {
        Runner {
            shared: self.shared.clone(),
        }
    }
}

struct Shared<K> {
    config: RunnerConfig,
    /// A `std` mutex: every operation is a few map operations and never awaits.
    queue: Mutex<Queue<K>>,
    /// Wakes the loop when a key is pushed. `notify_one` keeps a permit when the loop is not
    /// waiting, so a push between its look at the queue and its wait is not lost.
    wake: Notify,
}

/// The queue's state. Every key is in at most one of `pending`, `running`; a running key may
/// also be in `deferred`.
struct Queue<K> {
    /// Pending keys by deadline; the sequence number breaks ties in push order.
    by_deadline: BTreeMap<(Instant, u64), K>,
    /// Each pending key's place in `by_deadline`: one pending entry per key.
    pending: BTreeMap<K, (Instant, u64)>,
    /// Keys whose reconcile runs now.
    running: BTreeSet<K>,
    /// Keys pushed while they ran, with the earliest deadline asked for: queued when the
    /// reconcile ends.
    deferred: BTreeMap<K, Instant>,
    /// Failures in a row, per key; removed on success, when the policy gives up, or on
    /// [`Runner::forget`], so it shrinks as keys heal or go.
    failures: BTreeMap<K, u32>,
    next_sequence: u64,
}

impl<K: Key> Queue<K> {
    fn new() -> Self {
        Queue {
            by_deadline: BTreeMap::new(),
            pending: BTreeMap::new(),
            running: BTreeSet::new(),
            deferred: BTreeMap::new(),
            failures: BTreeMap::new(),
            next_sequence: 0,
        }
    }

    /// Queues `key` for `deadline`, or keeps its earlier one. True when the queue changed.
    fn schedule(&mut self, key: K, deadline: Instant) -> bool {
        if self.running.contains(&key) {
            let held = self.deferred.entry(key).or_insert(deadline);
            *held = (*held).min(deadline);
            return false;
        }
        if let Some(&(at, sequence)) = self.pending.get(&key) {
            if at <= deadline {
                return false;
            }
            self.by_deadline.remove(&(at, sequence));
        }
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        self.by_deadline.insert((deadline, sequence), key.clone());
        self.pending.insert(key, (deadline, sequence));
        true
    }

    /// The first key due at `now`, marked running; or when the next one is due.
    fn pop_due(&mut self, now: Instant) -> Result<K, Option<Instant>> {
        let Some(entry) = self.by_deadline.first_entry() else {
            return Err(None);
        };
        if entry.key().0 > now {
            return Err(Some(entry.key().0));
        }
        let key = entry.remove();
        self.pending.remove(&key);
        self.running.insert(key.clone());
        Ok(key)
    }

    /// Ends the run of `key`; queues it for the earlier of `retry_at` and any push meanwhile.
    fn release(&mut self, key: K, retry_at: Option<Instant>) {
        self.running.remove(&key);
        let deadline = match (self.deferred.remove(&key), retry_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(deadline) = deadline {
            self.schedule(key, deadline);
        }
    }

    fn forget(&mut self, key: &K) {
        if let Some(place) = self.pending.remove(key) {
            self.by_deadline.remove(&place);
        }
        self.deferred.remove(key);
        self.failures.remove(key);
    }
}

impl<K: Key> Default for Runner<K> {
    fn default() -> Self {
        Runner::new(RunnerConfig::default())
    }
}

impl<K: Key> Runner<K> {
    pub fn new(config: RunnerConfig) -> Self {
        Runner {
            shared: Arc::new(Shared {
                config,
                queue: Mutex::new(Queue::new()),
                wake: Notify::new(),
            }),
        }
    }

    fn queue(&self) -> MutexGuard<'_, Queue<K>> {
        // Every operation leaves the maps consistent before anything in it could panic.
        self.shared
            .queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Asks for `key` to be reconciled now.
    pub fn push(&self, key: K) {
        self.schedule(key, Instant::now());
    }

    /// Asks for `key` to be reconciled after `delay`, unless it is already due earlier.
    pub fn push_after(&self, key: K, delay: Duration) {
        self.schedule(key, Instant::now() + delay);
    }

    fn schedule(&self, key: K, deadline: Instant) {
        if self.queue().schedule(key, deadline) {
            self.shared.wake.notify_one();
        }
    }

    /// Drops `key`'s pending entry, any push held back while it runs, and its failure count.
    /// A reconcile of it that runs now is not stopped.
    pub fn forget(&self, key: &K) {
        self.queue().forget(key);
    }

    /// Drops every pending key for which `keep` is false (see [`Runner::forget`]).
    pub fn retain(&self, mut keep: impl FnMut(&K) -> bool) {
        let mut queue = self.queue();
        let dropped: Vec<K> = queue
            .pending
            .keys()
            .chain(queue.deferred.keys())
            .filter(|key| !keep(key))
            .cloned()
            .collect();
        for key in &dropped {
            queue.forget(key);
        }
    }

    /// The deadline of `key`'s pending entry, if it has one.
    pub fn deadline(&self, key: &K) -> Option<Instant> {
        self.queue().pending.get(key).map(|&(at, _)| at)
    }

    /// Keys waiting for their deadline or for a free slot.
    pub fn pending_len(&self) -> usize {
        self.queue().pending.len()
    }

    /// Whether a reconcile of `key` runs now.
    pub fn is_running(&self, key: &K) -> bool {
        self.queue().running.contains(key)
    }

    /// Failures in a row of `key` so far.
    pub fn failures(&self, key: &K) -> u32 {
        self.queue().failures.get(key).copied().unwrap_or(0)
    }

    /// Reconciles due keys until `shutdown`, then waits for the running reconciles.
    pub async fn run<F, Fut, E, P>(
        &self,
        reconcile: F,
        policy: P,
        mut ready: ReadyGate,
        shutdown: CancellationToken,
    ) where
        F: Fn(K) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
        P: ErrorPolicy<K, E>,
    {
        let reconcile = Arc::new(reconcile);
        let limit = self.shared.config.max_concurrent.max(1);
        let mut running: JoinSet<(K, Result<Action, Failure<E>>)> = JoinSet::new();
        loop {
            let is_ready = ready.is_ready();
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                Some(joined) = running.join_next(), if !running.is_empty() => match joined {
                    Ok((key, outcome)) => self.finished(key, outcome, &policy),
                    // Tasks are aborted only after this loop; a panic is caught inside.
                    Err(error) => tracing::error!(%error, "reconcile task lost"),
                },
                () = ready.changed() => {}
                key = self.next_due(), if is_ready && running.len() < limit => {
                    if !ready.is_ready() {
                        // The gate closed while the key was being taken: put it back.
                        self.queue().release(key, Some(Instant::now()));
                        continue;
                    }
                    let reconcile = reconcile.clone();
                    running.spawn(async move {
                        let run = AssertUnwindSafe(async { reconcile(key.clone()).await });
                        let outcome = match run.catch_unwind().await {
                            Ok(Ok(action)) => Ok(action),
                            Ok(Err(error)) => Err(Failure::Error(error)),
                            Err(panic) => Err(Failure::Panic(panic_message(panic.as_ref()))),
                        };
                        (key, outcome)
                    });
                }
            }
        }
        let grace = self.shared.config.shutdown_grace;
        let drained = tokio::time::timeout(grace, async {
            while running.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                left = running.len(),
                ?grace,
                "reconciles aborted at shutdown"
            );
            running.shutdown().await;
        }
    }

    /// Waits for the first due key and marks it running. Cancel-safe: nothing awaits
    /// between taking the key and returning it.
    async fn next_due(&self) -> K {
        loop {
            let next = self.queue().pop_due(Instant::now());
            match next {
                Ok(key) => return key,
                Err(Some(at)) => {
                    tokio::select! {
                        () = self.shared.wake.notified() => {}
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
                Err(None) => self.shared.wake.notified().await,
            }
        }
    }

    /// Applies the outcome of one reconcile: the error policy, the failure count, the requeue.
    fn finished<E: fmt::Display, P: ErrorPolicy<K, E>>(
        &self,
        key: K,
        outcome: Result<Action, Failure<E>>,
        policy: &P,
    ) {
        let now = Instant::now();
        let mut queue = self.queue();
        let action = match outcome {
            Ok(action) => {
                queue.failures.remove(&key);
                action
            }
            Err(failure) => {
                let attempts = queue.failures.entry(key.clone()).or_insert(0);
                *attempts = attempts.saturating_add(1);
                let attempts = *attempts;
                let action = policy.on_failure(&key, &failure, attempts);
                match &failure {
                    Failure::Panic(_) => {
                        tracing::warn!(?key, %failure, attempts, ?action, "reconcile panicked")
                    }
                    Failure::Error(_) => {
                        tracing::debug!(?key, %failure, attempts, ?action, "reconcile failed")
                    }
                }
                if action == Action::Done {
                    queue.failures.remove(&key);
                }
                action
            }
        };
        let retry_at = match action {
            Action::Done => None,
            Action::RequeueAfter(delay) => Some(now + delay),
        };
        queue.release(key, retry_at);
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(message) = payload.downcast_ref::<&str>() {
        (*message).to_owned()
    } else if let Some(message) = payload.downcast_ref::<String>() {
        message.clone()
    } else {
        "(no message)".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    type Calls = Arc<Mutex<Vec<(&'static str, Duration)>>>;

    /// Records every call as (key, time since `start`).
    fn record(calls: &Calls, key: &'static str, start: Instant) {
        calls.lock().unwrap().push((key, start.elapsed()));
    }

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    #[test]
    fn backoff_doubles_from_250ms_up_to_10s() {
        let backoff = ExponentialBackoff::default();
        let delays: Vec<u64> = (1..=8)
            .map(|n| backoff.delay(n).as_millis() as u64)
            .collect();
        assert_eq!(delays, [250, 500, 1000, 2000, 4000, 8000, 10000, 10000]);
        assert_eq!(backoff.delay(u32::MAX), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_has_one_pending_entry_and_keeps_the_earlier_deadline() {
        let runner: Runner<&str> = Runner::default();
        let now = Instant::now();
        runner.push_after("a", ms(500));
        runner.push_after("a", ms(900));
        assert_eq!(runner.pending_len(), 1);
        assert_eq!(
            runner.deadline(&"a"),
            Some(now + ms(500)),
            "a later push_after waits"
        );
        runner.push_after("a", ms(100));
        assert_eq!(
            runner.deadline(&"a"),
            Some(now + ms(100)),
            "an earlier one wins"
        );
        runner.push("a");
        assert_eq!(
            runner.deadline(&"a"),
            Some(now),
            "an immediate push overrides a delay"
        );
        runner.forget(&"a");
        assert_eq!(runner.pending_len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_keys_run_at_their_deadline_in_order() {
        let runner: Runner<&'static str> = Runner::default();
        let calls = Calls::default();
        let start = Instant::now();
        runner.push_after("late", ms(300));
        runner.push_after("early", ms(100));
        let shutdown = CancellationToken::new();
        let (seen, stop) = (calls.clone(), shutdown.clone());
        let handle = tokio::spawn({
            let runner = runner.clone();
            async move {
                let reconcile = move |key| {
                    record(&seen, key, start);
                    async { Ok::<_, String>(Action::Done) }
                };
                runner
                    .run(
                        reconcile,
                        ExponentialBackoff::default(),
                        ReadyGate::open(),
                        stop,
                    )
                    .await
            }
        });
        tokio::time::sleep(ms(1000)).await;
        shutdown.cancel();
        handle.await.unwrap();
        assert_eq!(
            *calls.lock().unwrap(),
            [("early", ms(100)), ("late", ms(300))]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn concurrency_is_bounded_and_a_key_never_runs_twice_at_once() {
        let config = RunnerConfig {
            max_concurrent: 2,
            ..RunnerConfig::default()
        };
        let runner: Runner<u32> = Runner::new(config);
        let (now_running, most, runs) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        let active: Arc<Mutex<BTreeSet<u32>>> = Arc::default();
        let shutdown = CancellationToken::new();
        let reconcile = {
            let (now_running, most, runs, active) = (
                now_running.clone(),
                most.clone(),
                runs.clone(),
                active.clone(),
            );
            move |key: u32| {
                let (now_running, most, runs, active) = (
                    now_running.clone(),
                    most.clone(),
                    runs.clone(),
                    active.clone(),
                );
                async move {
                    assert!(
                        active.lock().unwrap().insert(key),
                        "{key} ran twice at once"
                    );
                    let running = now_running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(running, Ordering::SeqCst);
                    tokio::time::sleep(ms(100)).await;
                    now_running.fetch_sub(1, Ordering::SeqCst);
                    active.lock().unwrap().remove(&key);
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, String>(Action::Done)
                }
            }
        };
        for key in 0..5 {
            runner.push(key);
        }
        let handle = tokio::spawn({
            let (runner, stop) = (runner.clone(), shutdown.clone());
            async move {
                runner
                    .run(
                        reconcile,
                        ExponentialBackoff::default(),
                        ReadyGate::open(),
                        stop,
                    )
                    .await
            }
        });
        tokio::time::sleep(ms(50)).await;
        assert!(runner.is_running(&0));
        runner.push(0); // while 0 runs: held back, run again after
        runner.push(0);
        assert_eq!(runner.deadline(&0), None, "not pending while it runs");
        tokio::time::sleep(ms(1000)).await;
        shutdown.cancel();
        handle.await.unwrap();
        assert_eq!(most.load(Ordering::SeqCst), 2);
        assert_eq!(runs.load(Ordering::SeqCst), 6, "five keys, and 0 once more");
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_per_key_and_a_success_resets_them() {
        let runner: Runner<&'static str> = Runner::default();
        let calls = Calls::default();
        let start = Instant::now();
        let shutdown = CancellationToken::new();
        let reconcile = {
            let calls = calls.clone();
            move |key| {
                record(&calls, key, start);
                let attempt = calls.lock().unwrap().len();
                async move {
                    match attempt {
                        1..=3 => Err(format!("attempt {attempt} failed")),
                        4 => Ok(Action::RequeueAfter(ms(5000))),
                        _ => Err("fails again".to_owned()),
                    }
                }
            }
        };
        runner.push("a");
        let handle = tokio::spawn({
            let (runner, stop) = (runner.clone(), shutdown.clone());
            async move {
                runner
                    .run(
                        reconcile,
                        ExponentialBackoff::default(),
                        ReadyGate::open(),
                        stop,
                    )
                    .await
            }
        });
        tokio::time::sleep(ms(7100)).await;
        assert_eq!(runner.failures(&"a"), 2);
        shutdown.cancel();
        handle.await.unwrap();
        let times: Vec<Duration> = calls.lock().unwrap().iter().map(|c| c.1).collect();
        // 250, 500, 1000 ms of backoff, then 5 s asked for, then 250 ms again (reset).
        assert_eq!(
            times,
            [ms(0), ms(250), ms(750), ms(1750), ms(6750), ms(7000)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconcile_that_panics_releases_its_key_and_is_retried() {
        let runner: Runner<&'static str> = Runner::default();
        let calls = Calls::default();
        let start = Instant::now();
        let shutdown = CancellationToken::new();
        let reconcile = {
            let calls = calls.clone();
            move |key| {
                record(&calls, key, start);
                let first = calls.lock().unwrap().len() == 1;
                async move {
                    if first {
                        panic!("boom");
                    }
                    Ok::<_, String>(Action::Done)
                }
            }
        };
        runner.push("a");
        let handle = tokio::spawn({
            let (runner, stop) = (runner.clone(), shutdown.clone());
            async move {
                runner
                    .run(
                        reconcile,
                        ExponentialBackoff::default(),
                        ReadyGate::open(),
                        stop,
                    )
                    .await
            }
        });
        tokio::time::sleep(ms(1000)).await;
        assert!(!runner.is_running(&"a"));
        shutdown.cancel();
        handle.await.unwrap();
        assert_eq!(*calls.lock().unwrap(), [("a", ms(0)), ("a", ms(250))]);
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_runs_before_the_gate_opens_and_nothing_new_while_it_is_closed() {
        let runner: Runner<&'static str> = Runner::default();
        let calls = Calls::default();
        let start = Instant::now();
        let (in_sync, in_sync_receiver) = watch::channel(false);
        let shutdown = CancellationToken::new();
        let reconcile = {
            let calls = calls.clone();
            move |key| {
                record(&calls, key, start);
                async { Ok::<_, String>(Action::Done) }
            }
        };
        runner.push("a");
        let handle = tokio::spawn({
            let (runner, stop) = (runner.clone(), shutdown.clone());
            let gate = ReadyGate::new([in_sync_receiver]);
            async move {
                runner
                    .run(reconcile, ExponentialBackoff::default(), gate, stop)
                    .await
            }
        });
        tokio::time::sleep(ms(500)).await;
        assert!(calls.lock().unwrap().is_empty());
        in_sync.send_replace(true);
        tokio::time::sleep(ms(100)).await;
        in_sync.send_replace(false);
        runner.push("b");
        tokio::time::sleep(ms(500)).await;
        in_sync.send_replace(true);
        tokio::time::sleep(ms(100)).await;
        shutdown.cancel();
        handle.await.unwrap();
        assert_eq!(*calls.lock().unwrap(), [("a", ms(500)), ("b", ms(1100))]);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_waits_for_running_reconciles() {
        let runner: Runner<&'static str> = Runner::default();
        let finished = Arc::new(AtomicUsize::new(0));
        let shutdown = CancellationToken::new();
        let reconcile = {
            let finished = finished.clone();
            move |_key| {
                let finished = finished.clone();
                async move {
                    tokio::time::sleep(ms(2000)).await;
                    finished.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, String>(Action::Done)
                }
            }
        };
        runner.push("a");
        let handle = tokio::spawn({
            let (runner, stop) = (runner.clone(), shutdown.clone());
            async move {
                runner
                    .run(
                        reconcile,
                        ExponentialBackoff::default(),
                        ReadyGate::open(),
                        stop,
                    )
                    .await
            }
        });
        tokio::time::sleep(ms(100)).await;
        shutdown.cancel();
        handle.await.unwrap();
        assert_eq!(finished.load(Ordering::SeqCst), 1);
    }

    /// Gives a key up after two failures in a row.
    struct TwoStrikes;
    impl<K, E> ErrorPolicy<K, E> for TwoStrikes {
        fn on_failure(&self, _key: &K, _failure: &Failure<E>, attempts: u32) -> Action {
            if attempts >= 2 {
                Action::Done
            } else {
                Action::RequeueAfter(ms(100))
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_error_policy_decides_retries_and_may_give_a_key_up() {
        let runner: Runner<&'static str> = Runner::default();
        let calls = Calls::default();
        let start = Instant::now();
        let shutdown = CancellationToken::new();
        let reconcile = {
            let calls = calls.clone();
            move |key| {
                record(&calls, key, start);
                async { Err::<Action, _>("always fails") }
            }
        };
        runner.push("a");
        let handle = tokio::spawn({
            let (runner, stop) = (runner.clone(), shutdown.clone());
            async move {
                runner
                    .run(reconcile, TwoStrikes, ReadyGate::open(), stop)
                    .await
            }
        });
        tokio::time::sleep(ms(1000)).await;
        assert_eq!(runner.pending_len(), 0);
        assert_eq!(runner.failures(&"a"), 0, "a key given up keeps no count");
        shutdown.cancel();
        handle.await.unwrap();
        assert_eq!(*calls.lock().unwrap(), [("a", ms(0)), ("a", ms(100))]);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_aborts_reconciles_that_outlast_the_grace() {
        let config = RunnerConfig {
            shutdown_grace: ms(500),
            ..RunnerConfig::default()
        };
        let runner: Runner<&'static str> = Runner::new(config);
        let shutdown = CancellationToken::new();
        let reconcile = |_key| async {
            std::future::pending::<()>().await;
            Ok::<_, String>(Action::Done)
        };
        runner.push("a");
        let handle = tokio::spawn({
            let (runner, stop) = (runner.clone(), shutdown.clone());
            async move {
                runner
                    .run(
                        reconcile,
                        ExponentialBackoff::default(),
                        ReadyGate::open(),
                        stop,
                    )
                    .await
            }
        });
        tokio::time::sleep(ms(100)).await;
        let cancelled_at = Instant::now();
        shutdown.cancel();
        handle.await.unwrap();
        assert_eq!(cancelled_at.elapsed(), ms(500));
    }
}
