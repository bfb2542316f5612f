//! Transformers: pure functions from observed collections to a desired collection (the field
//! report's transformers), the reconciliation mask that says which changes they read, and the
//! loop that reruns them into a desired store.
//!
//! A [`Transformer`] gets its inputs as plain values (snapshots the caller assembled) and
//! returns the desired collection; it does no IO and reads no clock. Ownership is expressed in
//! what it returns: an ownee is desired only while its owner is observed, so when an owner
//! goes, its ownees leave the desired collection and the syncer deletes them.
//!
//! A [`ReconciliationMask`] extracts the fields a transformer reads from an input item; a
//! change that leaves them equal (a node's heartbeat with a new CPU figure, for a transformer
//! that reads labels) does not rerun the transformer. [`run_transformer`] watches its inputs
//! ([`MaskedInput`]s), reruns the computation after a change that passes a mask, writes the
//! result into the desired store, and keeps that store in sync exactly while every input is.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures_util::future::select_all;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::runner::{Key, ReadyGate};
use crate::store::{Delta, ObservedStore};

/// A pure transformer: observed inputs to a desired collection.
pub trait Transformer {
    /// The observed collections it reads (snapshots, by value or reference).
    type Inputs;
    type Key: Ord;
    type Desired;
    fn transform(&self, inputs: &Self::Inputs) -> BTreeMap<Self::Key, Self::Desired>;
}

/// The fields of an input item a transformer reads.
pub struct ReconciliationMask<V, M> {
    extract: fn(&V) -> M,
}

impl<V, M: PartialEq> ReconciliationMask<V, M> {
    pub fn new(extract: fn(&V) -> M) -> Self {
        ReconciliationMask { extract }
    }

    /// Whether the change from `before` to `after` (`None`: absent) touches a field the
    /// transformer reads. A create or a delete always does.
    pub fn matters(&self, before: Option<&V>, after: Option<&V>) -> bool {
        before.map(self.extract) != after.map(self.extract)
    }

    /// Whether a recorded change touches a field the transformer reads.
    pub fn matters_in<K>(&self, delta: &Delta<K, V>) -> bool {
        self.matters(delta.before.as_deref(), delta.after.as_deref())
    }
}

/// An input of [`run_transformer`]: a store and what the transformer reads from it.
pub trait TransformerInput: Send + Sync {
    fn synced(&self) -> watch::Receiver<bool>;
    fn subscribe(&self) -> watch::Receiver<u64>;
    fn index(&self) -> u64;
    /// Whether a change after `since` passes the mask; true when the store cannot say.
    fn read_change_since(&self, since: u64) -> bool;
}

/// A store read through a mask.
pub struct MaskedInput<K, V, M> {
    pub store: ObservedStore<K, V>,
    pub mask: ReconciliationMask<V, M>,
}

impl<K, V, M> TransformerInput for MaskedInput<K, V, M>
where
    K: Key,
    V: PartialEq + Send + Sync + 'static,
    M: PartialEq + 'static,
{
    fn synced(&self) -> watch::Receiver<bool> {
        self.store.synced()
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.store.subscribe()
    }

    fn index(&self) -> u64 {
        self.store.index()
    }

    fn read_change_since(&self, since: u64) -> bool {
        match self.store.changes_since(since) {
            Ok(changes) => changes.iter().any(|delta| self.mask.matters_in(delta)),
            Err(_) => true,
        }
    }
}

/// Reruns `compute` into `desired` until `shutdown`: when every input is in sync and a change
/// passed a mask since the last run (or sync was just gained), the desired store is replaced
/// with the result and marked in sync; while any input is out of sync, so is `desired`.
/// `compute` reads the input stores' snapshots and calls a pure [`Transformer`].
pub async fn run_transformer<K, D>(
    inputs: Vec<Box<dyn TransformerInput>>,
    compute: impl Fn() -> BTreeMap<K, D> + Send,
    desired: ObservedStore<K, D>,
    shutdown: CancellationToken,
) where
    K: Key,
    D: PartialEq + Send + Sync + 'static,
{
    let mut gate = ReadyGate::new(inputs.iter().map(|input| input.synced()));
    let mut indexes: Vec<_> = inputs.iter().map(|input| input.subscribe()).collect();
    // The input indexes the last run saw; `None` until sync is gained (again).
    let mut ran_at: Option<Vec<u64>> = None;
    loop {
        for index in &mut indexes {
            index.mark_unchanged();
        }
        if !gate.is_ready() {
            desired.set_synced(false);
            ran_at = None;
        } else {
            let now_at: Vec<u64> = inputs.iter().map(|input| input.index()).collect();
            let rerun = match &ran_at {
                None => true,
                Some(seen) => inputs
                    .iter()
                    .zip(seen)
                    .any(|(input, &since)| input.read_change_since(since)),
            };
            if rerun {
                let result = compute();
                desired.replace_all(result.into_iter().map(|(k, v)| (k, Arc::new(v))));
            }
            desired.set_synced(true);
            ran_at = Some(now_at);
        }
        let changed: Vec<_> = indexes
            .iter_mut()
            .map(|index| Box::pin(index.changed()))
            .collect();
        let any_changed = async {
            if changed.is_empty() {
                std::future::pending::<()>().await;
            }
            // The stores' senders outlive their handles in `inputs`: no error to see.
            let _ = select_all(changed).await;
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = gate.changed() => {}
            () = any_changed => {}
        }
    }
}

/// Owner/ownee in one line: the ownees whose owner is among `owners`. For a transformer that
/// derives ownees and must drop those whose owner went.
pub fn owned_by<K: Ord + Clone, O: Ord, D: Clone>(
    ownees: &BTreeMap<K, D>,
    owners: &BTreeSet<O>,
    owner_of: impl Fn(&D) -> O,
) -> BTreeMap<K, D> {
    ownees
        .iter()
        .filter(|(_, ownee)| owners.contains(&owner_of(ownee)))
        .map(|(key, ownee)| (key.clone(), ownee.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Change;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[derive(Debug, Clone, PartialEq)]
    struct Node {
        labels: Vec<&'static str>,
        cpu_percent: u32,
    }

    fn node(labels: &[&'static str], cpu_percent: u32) -> Node {
        Node {
            labels: labels.to_vec(),
            cpu_percent,
        }
    }

    fn labels_only() -> ReconciliationMask<Node, Vec<&'static str>> {
        ReconciliationMask::new(|node: &Node| node.labels.clone())
    }

    /// One task per node labelled "system" (a `system` job × node pair owns one task).
    struct SystemJob;
    impl Transformer for SystemJob {
        type Inputs = BTreeMap<&'static str, Arc<Node>>;
        type Key = (&'static str, &'static str);
        type Desired = ();
        fn transform(&self, nodes: &Self::Inputs) -> BTreeMap<Self::Key, ()> {
            nodes
                .iter()
                .filter(|(_, node)| node.labels.contains(&"system"))
                .map(|(name, _)| (("system-job", *name), ()))
                .collect()
        }
    }

    #[test]
    fn a_heartbeat_that_changes_only_cpu_passes_no_mask_but_a_label_change_does() {
        let mask = labels_only();
        let before = node(&["system"], 10);
        assert!(!mask.matters(Some(&before), Some(&node(&["system"], 90))));
        assert!(mask.matters(Some(&before), Some(&node(&["system", "gpu"], 10))));
        assert!(mask.matters(None, Some(&before)), "a new node");
        assert!(mask.matters(Some(&before), None), "a node gone");
    }

    #[test]
    fn ownees_go_with_their_owner() {
        let tasks = BTreeMap::from([(1, "job-a"), (2, "job-b"), (3, "job-a")]);
        let owners = BTreeSet::from(["job-a"]);
        let kept = owned_by(&tasks, &owners, |job| *job);
        assert_eq!(kept.keys().copied().collect::<Vec<_>>(), [1, 3]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_transformer_reruns_only_when_a_field_it_reads_changed() {
        let nodes: ObservedStore<&'static str, Node> = ObservedStore::default();
        let desired = ObservedStore::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let compute = {
            let (nodes, runs) = (nodes.clone(), runs.clone());
            move || {
                runs.fetch_add(1, Ordering::SeqCst);
                SystemJob.transform(&nodes.snapshot().items)
            }
        };
        let input = MaskedInput {
            store: nodes.clone(),
            mask: labels_only(),
        };
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn({
            let (desired, stop) = (desired.clone(), shutdown.clone());
            run_transformer(vec![Box::new(input)], compute, desired, stop)
        });
        let settle = || tokio::time::sleep(Duration::from_millis(10));
        nodes.apply(Change::put("n1", node(&["system"], 10)));
        settle().await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            0,
            "not before the input is in sync"
        );
        assert!(!desired.is_synced());
        nodes.set_synced(true);
        settle().await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert!(desired.is_synced());
        assert!(desired.get(&("system-job", "n1")).is_some());

        nodes.apply(Change::put("n1", node(&["system"], 95))); // heartbeat
        settle().await;
        assert_eq!(runs.load(Ordering::SeqCst), 1, "a CPU figure is not read");

        nodes.apply(Change::put("n1", node(&[], 95))); // label removed
        settle().await;
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        assert!(desired.is_empty(), "the pair's task is no longer desired");

        nodes.set_synced(false);
        settle().await;
        assert!(
            !desired.is_synced(),
            "lost sync travels to the desired side"
        );
        shutdown.cancel();
        handle.await.unwrap();
    }
}
