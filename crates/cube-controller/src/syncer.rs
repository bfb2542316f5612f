//! The syncer: compares a desired collection with an observed one and carries out the
//! difference (the field report's syncer, with its `CanProceedWithDeletion`).
//!
//! [`diff`] is the pure decision: which desired keys to create, which observed items to update
//! and which to delete. Observed items are keyed by their own identity (`I`) and answer to a
//! desired key (`K`) through [`SyncRules::key_of`]; only items the controller owns
//! ([`SyncRules::owns`]) are compared or deleted, so a syncer never deletes what another
//! controller, or a user, made. Two owned items answering to one desired key are a duplicate:
//! one is kept (one that already matches, if any) and the others are deleted.
//!
//! A [`Syncer`] keeps the plan (the diff grouped by desired key) and executes it through an
//! [`Executor`] on a [`Runner`] keyed by the desired key: per-key retries with the error policy,
//! never two actions on one key at once. It acts only while both stores are in sync; when both
//! are in sync again after either lost sync it plans from a fresh diff and drops every stale
//! action. A key whose action succeeded is left alone until its observed item changes (the
//! store may not have seen the result yet), so an unrelated change does not repeat a create.
//! Executors must be idempotent: a retry may repeat an action that succeeded before a later
//! one of the same key failed.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::runner::{Action, ExponentialBackoff, Key, ReadyGate, Runner, RunnerConfig};
use crate::store::{Delta, ObservedStore};

/// One thing to do to bring the observed collection to the desired one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncAction<K, I> {
    /// Make the desired item `K`; nothing owned answers to it.
    Create(K),
    /// Make observed item `I` like desired item `K`.
    Update(K, I),
    /// Remove observed item `I`, which answers to `K`: `K` is not desired, or `I` is a
    /// duplicate.
    Delete(K, I),
}

impl<K, I> SyncAction<K, I> {
    /// The desired key the action is about (the key it is queued and serialised under).
    pub fn key(&self) -> &K {
        match self {
            SyncAction::Create(key) | SyncAction::Update(key, _) | SyncAction::Delete(key, _) => {
                key
            }
        }
    }
}

/// The pure rules of a syncer: which desired key an observed item answers to, whether the
/// controller owns it, and whether it already is as desired.
pub trait SyncRules<K, D, I, O>: Send + Sync + 'static {
    fn key_of(&self, id: &I, observed: &O) -> K;
    /// Whether this controller may update or delete `observed` (`CanProceedWithDeletion`).
    fn owns(&self, observed: &O) -> bool;
    /// Whether `observed` already is as `desired` asks.
    fn same(&self, desired: &D, observed: &O) -> bool;
}

/// Compares `desired` with `observed`; actions sorted by desired key, then by observed id.
pub fn diff<K: Ord + Clone, D, I: Ord + Clone, O>(
    desired: &BTreeMap<K, D>,
    observed: &BTreeMap<I, O>,
    key_of: impl Fn(&I, &O) -> K,
    owns: impl Fn(&O) -> bool,
    same: impl Fn(&D, &O) -> bool,
) -> Vec<SyncAction<K, I>> {
    let mut answering: BTreeMap<K, Vec<(&I, &O)>> = BTreeMap::new();
    for (id, item) in observed.iter().filter(|(_, item)| owns(item)) {
        answering
            .entry(key_of(id, item))
            .or_default()
            .push((id, item));
    }
    let mut actions = Vec::new();
    for (key, wanted) in desired {
        let Some(items) = answering.remove(key) else {
            actions.push(SyncAction::Create(key.clone()));
            continue;
        };
        let keeper = items
            .iter()
            .position(|(_, item)| same(wanted, item))
            .unwrap_or(0);
        for (at, (id, item)) in items.iter().enumerate() {
            if at != keeper {
                actions.push(SyncAction::Delete(key.clone(), (*id).clone()));
            } else if !same(wanted, item) {
                actions.push(SyncAction::Update(key.clone(), (*id).clone()));
            }
        }
    }
    for (key, items) in answering {
        for (id, _) in items {
            actions.push(SyncAction::Delete(key.clone(), id.clone()));
        }
    }
    actions.sort_by(|a, b| a.key().cmp(b.key()));
    actions
}

/// [`diff`] when observed items are keyed like desired ones.
pub fn diff_by_key<K: Ord + Clone, D, O>(
    desired: &BTreeMap<K, D>,
    observed: &BTreeMap<K, O>,
    owns: impl Fn(&O) -> bool,
    same: impl Fn(&D, &O) -> bool,
) -> Vec<SyncAction<K, K>> {
    diff(desired, observed, |key, _| key.clone(), owns, same)
}

/// Carries out sync actions: the IO. Every method must be idempotent.
pub trait Executor<K, D, I, O>: Send + Sync + 'static {
    type Error: fmt::Display + Send + 'static;
    fn create(
        &self,
        key: K,
        desired: Arc<D>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
    fn update(
        &self,
        key: K,
        desired: Arc<D>,
        id: I,
        observed: Arc<O>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
    fn delete(
        &self,
        id: I,
        observed: Arc<O>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

/// The bounds of a syncer.
#[derive(Debug, Clone, Copy)]
pub struct SyncerConfig {
    pub runner: RunnerConfig,
    /// Retries of a failed key.
    pub backoff: ExponentialBackoff,
    /// How long a key whose action succeeded waits for its observed item to change before it
    /// is planned again at the next change.
    pub settle_timeout: Duration,
}

impl Default for SyncerConfig {
    fn default() -> Self {
        SyncerConfig {
            runner: RunnerConfig::default(),
            backoff: ExponentialBackoff::default(),
            settle_timeout: Duration::from_secs(30),
        }
    }
}

/// What the syncer means to do, per desired key: the one place its decisions are kept.
struct Plan<K, I> {
    actions: BTreeMap<K, Vec<SyncAction<K, I>>>,
    /// Keys whose last actions succeeded, and when: left out of the plan until their items
    /// change, the stores re-sync, or `settle_timeout` passes.
    settling: BTreeMap<K, Instant>,
}

impl<K: Ord + Clone, I: PartialEq> Plan<K, I> {
    /// Replaces the plan with a fresh diff. `touched` are the keys whose items changed since
    /// the last plan; `None` after a re-sync, when everything is fresh. Returns the keys whose
    /// actions are new or different: the ones to queue.
    fn replace(
        &mut self,
        fresh: Vec<SyncAction<K, I>>,
        touched: Option<&BTreeSet<K>>,
        now: Instant,
        settle_timeout: Duration,
    ) -> Vec<K> {
        match touched {
            None => self.settling.clear(),
            Some(touched) => self.settling.retain(|key, since| {
                !touched.contains(key) && now.duration_since(*since) < settle_timeout
            }),
        }
        let mut grouped: BTreeMap<K, Vec<SyncAction<K, I>>> = BTreeMap::new();
        for action in fresh {
            if !self.settling.contains_key(action.key()) {
                grouped
                    .entry(action.key().clone())
                    .or_default()
                    .push(action);
            }
        }
        // After a re-sync every planned key is queued: an action skipped while out of sync
        // may be planned again unchanged, and would otherwise wait for an unrelated change.
        let changed = grouped
            .iter()
            .filter(|(key, actions)| touched.is_none() || self.actions.get(*key) != Some(*actions))
            .map(|(key, _)| key.clone())
            .collect();
        self.actions = grouped;
        changed
    }

    /// When the first settling key stops waiting for its item.
    fn next_expiry(&self, settle_timeout: Duration) -> Option<Instant> {
        self.settling
            .values()
            .min()
            .map(|since| *since + settle_timeout)
    }

    /// `executed` succeeded: if it is still the plan for `key`, the key settles.
    fn completed(&mut self, key: &K, executed: &[SyncAction<K, I>], now: Instant) {
        if self.actions.get(key).map(Vec::as_slice) == Some(executed) {
            self.actions.remove(key);
            self.settling.insert(key.clone(), now);
        }
    }
}

/// Drives an observed store toward a desired one through an executor.
pub struct Syncer<K, D, I, O, R, X> {
    shared: Arc<Shared<K, D, I, O, R, X>>,
}

struct Shared<K, D, I, O, R, X> {
    desired: ObservedStore<K, D>,
    observed: ObservedStore<I, O>,
    rules: R,
    executor: X,
    config: SyncerConfig,
    /// A `std` mutex: planning and lookups never await.
    plan: Mutex<Plan<K, I>>,
    /// Wakes the plan loop when a key settles, so it can wake again when the key's wait ends.
    settled: Notify,
    runner: Runner<K>,
}

impl<K, D, I, O, R, X> Syncer<K, D, I, O, R, X>
where
    K: Key,
    I: Key,
    D: PartialEq + Send + Sync + 'static,
    O: PartialEq + Send + Sync + 'static,
    R: SyncRules<K, D, I, O>,
    X: Executor<K, D, I, O>,
{
    pub fn new(
        desired: ObservedStore<K, D>,
        observed: ObservedStore<I, O>,
        rules: R,
        executor: X,
        config: SyncerConfig,
    ) -> Self {
        Syncer {
            shared: Arc::new(Shared {
                desired,
                observed,
                rules,
                executor,
                config,
                plan: Mutex::new(Plan {
                    actions: BTreeMap::new(),
                    settling: BTreeMap::new(),
                }),
                settled: Notify::new(),
                runner: Runner::new(config.runner),
            }),
        }
    }

    /// The desired keys with actions planned.
    pub fn planned(&self) -> Vec<K> {
        self.shared.plan().actions.keys().cloned().collect()
    }

    /// Plans on every change of either store while both are in sync, and executes the plan,
    /// until `shutdown`; then waits for the actions under way.
    pub async fn run(&self, shutdown: CancellationToken) {
        let shared = self.shared.clone();
        let execute = move |key: K| {
            let shared = shared.clone();
            async move { shared.execute(key).await }
        };
        let gate = ReadyGate::new([self.shared.desired.synced(), self.shared.observed.synced()]);
        let runner =
            self.shared
                .runner
                .run(execute, self.shared.config.backoff, gate, shutdown.clone());
        tokio::join!(self.shared.plan_loop(shutdown), runner);
    }
}

impl<K, D, I, O, R, X> Shared<K, D, I, O, R, X>
where
    K: Key,
    I: Key,
    D: PartialEq + Send + Sync + 'static,
    O: PartialEq + Send + Sync + 'static,
    R: SyncRules<K, D, I, O>,
    X: Executor<K, D, I, O>,
{
    fn plan(&self) -> MutexGuard<'_, Plan<K, I>> {
        // The plan is replaced or edited whole before anything could panic.
        self.plan
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn in_sync(&self) -> bool {
        self.desired.is_synced() && self.observed.is_synced()
    }

    async fn plan_loop(&self, shutdown: CancellationToken) {
        let mut desired_index = self.desired.subscribe();
        let mut observed_index = self.observed.subscribe();
        let mut gate = ReadyGate::new([self.desired.synced(), self.observed.synced()]);
        // The store indexes the last plan was made at; `None`: no plan since sync was lost.
        let mut planned_at: Option<(u64, u64)> = None;
        loop {
            desired_index.mark_unchanged();
            observed_index.mark_unchanged();
            if gate.is_ready() {
                planned_at = Some(self.replan(planned_at));
            } else {
                planned_at = None;
            }
            let expiry = self.plan().next_expiry(self.config.settle_timeout);
            let settled = async {
                match expiry {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                // The stores' senders live as long as `self`: these cannot fail.
                _ = desired_index.changed() => {}
                _ = observed_index.changed() => {}
                () = gate.changed() => {}
                // A key waited long enough for its item: plan it again.
                () = settled => {}
                () = self.settled.notified() => {}
            }
        }
    }

    /// Plans from a fresh diff and queues the keys whose actions changed; drops queued keys
    /// that have nothing left to do. Returns the store indexes planned at.
    fn replan(&self, planned_at: Option<(u64, u64)>) -> (u64, u64) {
        let desired = self.desired.snapshot();
        let observed = self.observed.snapshot();
        let touched = planned_at.and_then(|(desired_at, observed_at)| {
            let desired_changes = self.desired.changes_since(desired_at).ok()?;
            let observed_changes = self.observed.changes_since(observed_at).ok()?;
            let mut keys: BTreeSet<K> = desired_changes.into_iter().map(|d| d.key).collect();
            keys.extend(observed_changes.iter().flat_map(|d| self.answers_to(d)));
            Some(keys)
        });
        let rules = &self.rules;
        let fresh = diff(
            &desired.items,
            &observed.items,
            |id, item| rules.key_of(id, item),
            |item| rules.owns(item),
            |wanted, item| rules.same(wanted, item),
        );
        let queue = {
            let mut plan = self.plan();
            let queue = plan.replace(
                fresh,
                touched.as_ref(),
                Instant::now(),
                self.config.settle_timeout,
            );
            self.runner.retain(|key| plan.actions.contains_key(key));
            queue
        };
        for key in queue {
            self.runner.push(key);
        }
        (desired.index, observed.index)
    }

    /// The desired keys an observed change is about: the item's before and after (an item
    /// may come to answer to another key).
    fn answers_to(&self, delta: &Delta<I, O>) -> impl Iterator<Item = K> {
        [&delta.before, &delta.after]
            .into_iter()
            .flatten()
            .map(|item| self.rules.key_of(&delta.key, item))
    }

    /// Executes the plan of `key` as it is now: nothing if it has none or a store is out of
    /// sync (the next sync plans again).
    async fn execute(&self, key: K) -> Result<Action, X::Error> {
        let Some(actions) = self.plan().actions.get(&key).cloned() else {
            return Ok(Action::Done);
        };
        for action in &actions {
            if !self.in_sync() {
                return Ok(Action::Done);
            }
            match action {
                SyncAction::Create(key) => {
                    if let Some(wanted) = self.desired.get(key) {
                        self.executor.create(key.clone(), wanted).await?;
                    }
                }
                SyncAction::Update(key, id) => {
                    if let (Some(wanted), Some(item)) =
                        (self.desired.get(key), self.observed.get(id))
                    {
                        self.executor
                            .update(key.clone(), wanted, id.clone(), item)
                            .await?;
                    }
                }
                SyncAction::Delete(_, id) => {
                    if let Some(item) = self.observed.get(id) {
                        self.executor.delete(id.clone(), item).await?;
                    }
                }
            }
        }
        self.plan().completed(&key, &actions, Instant::now());
        self.settled.notify_one();
        Ok(Action::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Change;

    use SyncAction::{Create, Delete, Update};

    /// An observed item: which desired key it answers to, its value, and who made it.
    #[derive(Debug, Clone, PartialEq)]
    struct Item {
        key: char,
        value: u32,
        ours: bool,
    }

    fn item(key: char, value: u32) -> Item {
        Item {
            key,
            value,
            ours: true,
        }
    }

    fn compare(
        desired: &BTreeMap<char, u32>,
        observed: &BTreeMap<u32, Item>,
    ) -> Vec<SyncAction<char, u32>> {
        diff(
            desired,
            observed,
            |_, item| item.key,
            |item| item.ours,
            |wanted, item| *wanted == item.value,
        )
    }

    #[test]
    fn diff_creates_updates_and_deletes() {
        let desired = BTreeMap::from([('a', 1), ('b', 2), ('c', 3)]);
        let observed = BTreeMap::from([(10, item('b', 2)), (11, item('c', 0)), (12, item('d', 4))]);
        assert_eq!(
            compare(&desired, &observed),
            [Create('a'), Update('c', 11), Delete('d', 12)]
        );
    }

    #[test]
    fn diff_never_touches_what_it_does_not_own() {
        let desired = BTreeMap::from([('a', 1)]);
        let foreign = Item {
            ours: false,
            ..item('a', 9)
        };
        let observed = BTreeMap::from([
            (10, foreign.clone()),
            (
                11,
                Item {
                    key: 'z',
                    ..foreign
                },
            ),
        ]);
        assert_eq!(compare(&desired, &observed), [Create('a')]);
    }

    #[test]
    fn duplicates_keep_the_one_that_matches_and_delete_the_others() {
        let desired = BTreeMap::from([('a', 1), ('b', 2)]);
        let observed = BTreeMap::from([
            (10, item('a', 0)),
            (11, item('a', 1)),
            (12, item('a', 1)),
            (20, item('b', 7)),
            (21, item('b', 8)),
        ]);
        assert_eq!(
            compare(&desired, &observed),
            [
                Delete('a', 10),
                Delete('a', 12),
                Update('b', 20),
                Delete('b', 21)
            ]
        );
    }

    proptest::proptest! {
        /// Carrying out a diff leaves exactly one owned item, as desired, per desired key, no
        /// owned item for any other key, every item not owned untouched, and nothing to do.
        #[test]
        fn carrying_out_a_diff_converges_and_spares_what_is_not_owned(
            desired in proptest::collection::btree_map(0u8..6, 0u32..3, 0..6),
            observed in proptest::collection::btree_map(
                0u32..40,
                (0u8..8, 0u32..3, proptest::bool::weighted(0.8)),
                0..12,
            ),
        ) {
            let keys = ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'];
            let desired: BTreeMap<char, u32> =
                desired.into_iter().map(|(k, v)| (keys[k as usize], v)).collect();
            let mut world: BTreeMap<u32, Item> = observed
                .into_iter()
                .map(|(id, (k, value, ours))| (id, Item { key: keys[k as usize], value, ours }))
                .collect();
            let before = world.clone();
            let mut next_id = 1000;
            for action in compare(&desired, &world) {
                match action {
                    Create(key) => {
                        next_id += 1;
                        world.insert(next_id, item(key, desired[&key]));
                    }
                    Update(key, id) => {
                        proptest::prop_assert!(world[&id].ours);
                        world.get_mut(&id).unwrap().value = desired[&key];
                    }
                    Delete(_, id) => {
                        proptest::prop_assert!(world[&id].ours);
                        world.remove(&id);
                    }
                }
            }
            for (key, value) in &desired {
                let answering: Vec<_> =
                    world.values().filter(|i| i.ours && i.key == *key).collect();
                proptest::prop_assert_eq!(answering.len(), 1);
                proptest::prop_assert_eq!(answering[0].value, *value);
            }
            for item in world.values().filter(|i| i.ours) {
                proptest::prop_assert!(desired.contains_key(&item.key));
            }
            let foreign = |w: &BTreeMap<u32, Item>| {
                w.iter().filter(|(_, i)| !i.ours).map(|(id, i)| (*id, i.clone())).collect::<Vec<_>>()
            };
            proptest::prop_assert_eq!(foreign(&before), foreign(&world));
            proptest::prop_assert!(compare(&desired, &world).is_empty());
        }
    }

    #[test]
    fn diff_by_key_is_diff_with_one_key() {
        let desired = BTreeMap::from([('a', 1), ('b', 2)]);
        let observed = BTreeMap::from([('b', 3), ('c', 3)]);
        assert_eq!(
            diff_by_key(&desired, &observed, |_| true, |d, o| d == o),
            [Create('a'), Update('b', 'b'), Delete('c', 'c')]
        );
    }

    #[test]
    fn a_settled_key_is_not_planned_again_until_its_item_changes() {
        let now = Instant::now();
        let timeout = Duration::from_secs(30);
        let mut plan: Plan<char, u32> = Plan {
            actions: BTreeMap::new(),
            settling: BTreeMap::new(),
        };
        let fresh = || vec![Create('a'), Create('b')];
        assert_eq!(plan.replace(fresh(), None, now, timeout), ['a', 'b']);
        assert_eq!(
            plan.replace(fresh(), Some(&BTreeSet::new()), now, timeout),
            [] as [char; 0]
        );
        plan.completed(&'a', &[Create('a')], now);
        assert_eq!(
            plan.replace(fresh(), Some(&BTreeSet::new()), now, timeout),
            [] as [char; 0]
        );
        assert!(!plan.actions.contains_key(&'a'), "created, not yet seen");
        assert_eq!(
            plan.replace(fresh(), Some(&BTreeSet::from(['a'])), now, timeout),
            ['a']
        );
        plan.completed(&'a', &[Create('a')], now);
        let later = now + timeout;
        assert_eq!(
            plan.replace(fresh(), Some(&BTreeSet::new()), later, timeout),
            ['a']
        );
    }

    /// Applies every action to the observed store, as a real system would report it; fails
    /// the first `failures` calls.
    struct World {
        observed: ObservedStore<u32, Item>,
        calls: Mutex<Vec<String>>,
        failures: Mutex<u32>,
        next_id: Mutex<u32>,
        /// Creates succeed but never reach the observed store (a lost report).
        creates_lost: std::sync::atomic::AtomicBool,
    }

    impl Executor<char, u32, u32, Item> for Arc<World> {
        type Error = String;
        async fn create(&self, key: char, desired: Arc<u32>) -> Result<(), String> {
            self.call(format!("create {key}"))?;
            let id = {
                let mut next = self.next_id.lock().unwrap();
                *next += 1;
                *next
            };
            if !self.creates_lost.load(std::sync::atomic::Ordering::SeqCst) {
                self.observed.apply(Change::put(id, item(key, *desired)));
            }
            Ok(())
        }
        async fn update(
            &self,
            key: char,
            desired: Arc<u32>,
            id: u32,
            _observed: Arc<Item>,
        ) -> Result<(), String> {
            self.call(format!("update {id}"))?;
            self.observed.apply(Change::put(id, item(key, *desired)));
            Ok(())
        }
        async fn delete(&self, id: u32, _observed: Arc<Item>) -> Result<(), String> {
            self.call(format!("delete {id}"))?;
            self.observed.apply(Change::Delete(id));
            Ok(())
        }
    }

    impl World {
        fn call(&self, call: String) -> Result<(), String> {
            self.calls.lock().unwrap().push(call.clone());
            let mut failures = self.failures.lock().unwrap();
            if *failures > 0 {
                *failures -= 1;
                return Err(format!("{call} failed"));
            }
            Ok(())
        }

        fn lose_creates(&self) {
            self.creates_lost
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }

        fn calls(&self) -> Vec<String> {
            std::mem::take(&mut *self.calls.lock().unwrap())
        }
    }

    struct Rules;
    impl SyncRules<char, u32, u32, Item> for Rules {
        fn key_of(&self, _id: &u32, item: &Item) -> char {
            item.key
        }
        fn owns(&self, item: &Item) -> bool {
            item.ours
        }
        fn same(&self, wanted: &u32, item: &Item) -> bool {
            *wanted == item.value
        }
    }

    struct Fixture {
        desired: ObservedStore<char, u32>,
        observed: ObservedStore<u32, Item>,
        world: Arc<World>,
        shutdown: CancellationToken,
        handle: tokio::task::JoinHandle<()>,
    }

    fn start(failures: u32) -> Fixture {
        let desired = ObservedStore::default();
        let observed = ObservedStore::default();
        let world = Arc::new(World {
            observed: observed.clone(),
            calls: Mutex::default(),
            failures: Mutex::new(failures),
            next_id: Mutex::new(100),
            creates_lost: Default::default(),
        });
        let syncer = Syncer::new(
            desired.clone(),
            observed.clone(),
            Rules,
            world.clone(),
            SyncerConfig::default(),
        );
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let handle = tokio::spawn(async move { syncer.run(stop).await });
        Fixture {
            desired,
            observed,
            world,
            shutdown,
            handle,
        }
    }

    async fn settle() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_executed_until_both_stores_are_in_sync() {
        let f = start(0);
        f.desired.apply(Change::put('a', 1));
        f.desired.set_synced(true);
        settle().await;
        assert!(f.world.calls().is_empty());
        f.observed.set_synced(true);
        settle().await;
        assert_eq!(f.world.calls(), ["create a"]);
        f.desired.apply(Change::put('b', 2));
        f.desired.apply(Change::put('a', 5));
        settle().await;
        assert_eq!(f.world.calls(), ["update 101", "create b"]);
        f.shutdown.cancel();
        f.handle.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_resync_acts_on_a_fresh_diff_and_drops_stale_actions() {
        let f = start(0);
        f.desired.apply(Change::put('a', 1));
        f.desired.set_synced(true);
        f.observed.set_synced(true);
        settle().await;
        assert_eq!(f.world.calls(), ["create a"]);
        // Sync lost: 'b' is wanted, then not; a duplicate of 'a' appears meanwhile.
        f.observed.set_synced(false);
        f.desired.apply(Change::put('b', 2));
        f.observed.apply(Change::put(7, item('a', 1)));
        settle().await;
        f.desired.apply(Change::Delete('b'));
        assert!(f.world.calls().is_empty(), "nothing while out of sync");
        f.observed.set_synced(true);
        settle().await;
        assert_eq!(
            f.world.calls(),
            ["delete 101"],
            "only the fresh diff: the duplicate"
        );
        f.shutdown.cancel();
        f.handle.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_create_the_store_never_sees_is_planned_again_after_the_settle_timeout() {
        let f = start(0);
        f.world.lose_creates();
        f.desired.apply(Change::put('a', 1));
        f.desired.set_synced(true);
        f.observed.set_synced(true);
        settle().await;
        assert_eq!(f.world.calls(), ["create a"]);
        tokio::time::sleep(Duration::from_secs(29)).await;
        assert!(
            f.world.calls().is_empty(),
            "waiting for the store to see it"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(f.world.calls(), ["create a"]);
        f.shutdown.cancel();
        f.handle.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_action_is_retried_with_backoff() {
        let f = start(2);
        f.desired.apply(Change::put('a', 1));
        f.desired.set_synced(true);
        f.observed.set_synced(true);
        settle().await;
        assert_eq!(f.world.calls(), ["create a"]);
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(f.world.calls(), ["create a"], "after 250 ms");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            f.world.calls(),
            ["create a"],
            "after 500 ms more, and it worked"
        );
        f.desired.apply(Change::put('z', 1)); // an unrelated change does not repeat 'a'
        settle().await;
        assert_eq!(f.world.calls(), ["create z"]);
        assert_eq!(f.observed.len(), 2);
        f.shutdown.cancel();
        f.handle.await.unwrap();
    }
}
