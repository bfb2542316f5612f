//! Placement by several managers at once, without double-booking a node (issue 32, part
//! 3): Omega's shared state on etcd.
//!
//! Each placer sees every node (its capacity, readiness, labels) but only its own shards'
//! tasks, so a node's load comes from the node's **claims** (`cube_types::claims`,
//! `alloc/NODE` on etcd): the sum of what every task placed on the node asked for, whoever
//! placed it. A request — one task, or a job's copies, placed whole or not at all — is
//! planned on the placer's view of the claims; the plan commits in one etcd transaction that
//! writes the chosen nodes' new claims and the request's records, **only if each chosen
//! node's claims are still at the revision the plan read** (`EtcdDb::write_if_unchanged`).
//! Another placer that took room on one of those nodes in between makes the transaction
//! fail; it answers with the nodes' claims as they are now, the view is updated and the
//! request is planned again at once. Taking a task off a node (it ended, it moved) goes the
//! same way, so the claims and the task records change together or not at all, and no
//! crash between the two can leave a node's claims wrong.
//!
//! Chosen over a plan applier on the leader (Nomad's): etcd already orders and fences every
//! write, and a leader checking every plan would put the cluster's whole placement rate
//! back on one process. The cost is a transaction per request instead of group commits, and
//! re-plans under contention; both are measured (`cube-bench contend`, BENCHMARKS.md).

use std::collections::HashMap;

use cube_scheduler::{Decision, NodeView, Scheduler, TaskRequest, summarize_rejections};
use cube_store::{
    EtcdDb, EtcdStore, Fence, Optimistic, Store, StoreError, Unchanged, Versioned, Watch,
};
use cube_types::claims::{CLAIMS_PREFIX, Claim, NodeClaims, claims_key};

/// What a placer counted since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlacerCounts {
    /// Requests committed.
    pub placed: u64,
    /// Requests that fit on no node (on the fresh claims).
    pub waiting: u64,
    /// Transactions that lost the race to another placer.
    pub conflicts: u64,
    /// Claims the placer could not read (written by a newer release, or damaged): their
    /// node is counted as full until they are written again.
    pub unreadable: u64,
}

/// Where a request went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Committed: each copy's node, in the copies' order.
    Placed { nodes: Vec<String> },
    /// No node has room for the whole request on the claims as they are now: nothing was
    /// written, and this is why (the words of `cube why`).
    Waiting { reason: String },
}

/// One placer: a manager's placement on the shared claims, which it follows live (a watch
/// of `alloc/`), so that it plans on what the others placed up to a moment ago and loses a
/// race only to a placement made in the same moment.
pub struct SharedPlacer {
    db: EtcdDb,
    /// The claims as a table of the store, for its watch.
    table: EtcdStore<NodeClaims>,
    /// The changes of the claims since they were last read; `None` after a watch ended
    /// (they are read again before the next plan).
    watch: Option<Watch<NodeClaims>>,
    scheduler: Box<dyn Scheduler>,
    /// Every node with its capacity, readiness, eligibility and labels, sorted by name; what
    /// is allocated on it comes from `claims`.
    nodes: Vec<NodeView>,
    /// Each node's claims and their `mod_revision` as last read (0: none written yet).
    claims: HashMap<String, (NodeClaims, i64)>,
    /// Every write is conditioned on it too: the key of the shard the requests belong to.
    fence: Option<Fence>,
    counts: PlacerCounts,
}

/// A request planned on one view: each copy's node index and the touched nodes' new claims.
struct Plan {
    chosen: Vec<usize>,
    touched: Vec<(usize, NodeClaims)>,
}

impl SharedPlacer {
    /// A placer over `nodes` (any order; the allocation they carry is ignored), with the
    /// claims read now.
    pub async fn new(
        db: EtcdDb,
        scheduler: Box<dyn Scheduler>,
        nodes: Vec<NodeView>,
        fence: Option<Fence>,
    ) -> Result<SharedPlacer, StoreError> {
        let table = EtcdStore::new(db.clone(), CLAIMS_PREFIX.trim_end_matches('/'))?;
        let mut placer = SharedPlacer {
            db,
            table,
            watch: None,
            scheduler,
            nodes: Vec::new(),
            claims: HashMap::new(),
            fence,
            counts: PlacerCounts::default(),
        };
        placer.set_nodes(nodes);
        placer.refresh().await?;
        Ok(placer)
    }

    /// The nodes changed (one joined, left, went down, was drained): the new list.
    pub fn set_nodes(&mut self, mut nodes: Vec<NodeView>) {
        nodes.sort_by(|left, right| left.name.cmp(&right.name));
        nodes.dedup_by(|right, left| left.name == right.name);
        self.nodes = nodes;
    }

    /// Reads every node's claims again, and follows their changes from there.
    pub async fn refresh(&mut self) -> Result<(), StoreError> {
        let (keys, revision) = self.db.read_versioned(CLAIMS_PREFIX).await?;
        self.claims.clear();
        for key in keys {
            self.remember(key);
        }
        self.watch = Some(self.table.watch("", u64::try_from(revision).unwrap_or(0))?);
        Ok(())
    }

    /// Takes in the claims' changes that arrived since the last look; reads them all again
    /// when the watch ended (it fell behind, or a value could not be read).
    async fn catch_up(&mut self) -> Result<(), StoreError> {
        let Some(changes) = crate::shard_claims::drain_claims(&mut self.watch) else {
            return self.refresh().await;
        };
        for (key, value, revision) in changes {
            if revision >= self.revision_of(&key) {
                match value {
                    Some(value) => {
                        self.claims.insert(key, (value, revision));
                    }
                    None => {
                        self.claims.remove(&key);
                    }
                }
            }
        }
        Ok(())
    }

    pub fn counts(&self) -> PlacerCounts {
        self.counts
    }

    /// The claims of `node` as this placer last read them.
    pub fn claims_of(&self, node: &str) -> NodeClaims {
        self.claims
            .get(node)
            .map(|(claims, _)| claims.clone())
            .unwrap_or_default()
    }

    /// Places `copies` whole on the nodes, each copy's record written with the claims:
    /// `records` is given each copy's node and returns the keys and values to write
    /// (relative to the store's prefix: `tasks/ID`). Planned again, at once, as long as
    /// another placer wins the race for a chosen node.
    pub async fn place(
        &mut self,
        copies: &[TaskRequest],
        records: impl Fn(&[String]) -> Vec<(String, Vec<u8>)>,
    ) -> Result<Placement, StoreError> {
        loop {
            self.catch_up().await?;
            let plan = match self.plan(copies) {
                Ok(plan) => plan,
                Err(reason) => {
                    self.counts.waiting += 1;
                    return Ok(Placement::Waiting { reason });
                }
            };
            let names: Vec<String> = plan
                .chosen
                .iter()
                .map(|&index| self.nodes[index].name.clone())
                .collect();
            let mut puts = Vec::with_capacity(plan.touched.len() + copies.len());
            let mut unchanged = Vec::with_capacity(plan.touched.len());
            for (index, claims) in &plan.touched {
                let name = &self.nodes[*index].name;
                unchanged.push(Unchanged {
                    key: claims_key(name),
                    mod_revision: self.revision_of(name),
                });
                puts.push((claims_key(name), Some(encode(claims)?)));
            }
            puts.extend(
                records(&names)
                    .into_iter()
                    .map(|(key, value)| (key, Some(value))),
            );
            match self
                .db
                .write_if_unchanged(&unchanged, puts, self.fence.as_ref())
                .await?
            {
                Optimistic::Committed { revision } => {
                    for (index, claims) in plan.touched {
                        let name = self.nodes[index].name.clone();
                        self.claims.insert(name, (claims, revision));
                    }
                    self.counts.placed += 1;
                    return Ok(Placement::Placed { nodes: names });
                }
                Optimistic::Changed { now } => {
                    self.counts.conflicts += 1;
                    self.take_fresher(&unchanged, now);
                }
            }
        }
    }

    /// Takes `copy` off `node`'s claims, with `records` written (or deleted, `None`) in the
    /// same transaction: a task that ended, or was moved. Done again on fresher claims as
    /// long as another placer changed the node's in between.
    pub async fn release(
        &mut self,
        node: &str,
        copy: &TaskRequest,
        records: Vec<(String, Option<Vec<u8>>)>,
    ) -> Result<(), StoreError> {
        loop {
            self.catch_up().await?;
            let mut claims = self.claims_of(node);
            claims.remove(&claim_of(copy));
            let unchanged = [Unchanged {
                key: claims_key(node),
                mod_revision: self.revision_of(node),
            }];
            let mut puts = vec![(claims_key(node), Some(encode(&claims)?))];
            puts.extend(records.iter().cloned());
            match self
                .db
                .write_if_unchanged(&unchanged, puts, self.fence.as_ref())
                .await?
            {
                Optimistic::Committed { revision } => {
                    self.claims.insert(node.to_string(), (claims, revision));
                    return Ok(());
                }
                Optimistic::Changed { now } => {
                    self.counts.conflicts += 1;
                    self.take_fresher(&unchanged, now);
                }
            }
        }
    }

    fn revision_of(&self, node: &str) -> i64 {
        self.claims.get(node).map_or(0, |(_, revision)| *revision)
    }

    /// After a lost race: the compared nodes' claims as etcd answered them; a node whose
    /// claims are gone is back to none.
    fn take_fresher(&mut self, compared: &[Unchanged], now: Vec<Versioned>) {
        for key in compared {
            if let Some(node) = key.key.strip_prefix(CLAIMS_PREFIX) {
                self.claims.remove(node);
            }
        }
        for key in now {
            self.remember(key);
        }
    }

    fn remember(&mut self, key: Versioned) {
        let Some(node) = key.key.strip_prefix(CLAIMS_PREFIX) else {
            return;
        };
        let claims = match serde_json::from_slice::<NodeClaims>(&key.value) {
            Ok(claims) => claims,
            Err(err) => {
                tracing::warn!(
                    node,
                    "the node's claims cannot be read, so it is taken as full: {err}"
                );
                self.counts.unreadable += 1;
                NodeClaims {
                    cpu_millis: u64::MAX,
                    memory: u64::MAX,
                    disk: u64::MAX,
                    ..NodeClaims::default()
                }
            }
        };
        self.claims
            .insert(node.to_string(), (claims, key.mod_revision));
    }

    /// Plans `copies` on the claims as last read: the copies one after another, each on the
    /// view the ones before it left.
    fn plan(&mut self, copies: &[TaskRequest]) -> Result<Plan, String> {
        let mut views: Vec<NodeView> = self
            .nodes
            .iter()
            .map(|node| view_with(node, &self.claims_of(&node.name)))
            .collect();
        let mut touched: HashMap<usize, NodeClaims> = HashMap::new();
        let mut chosen = Vec::with_capacity(copies.len());
        for copy in copies {
            match self.scheduler.place(copy, &views) {
                Decision::Placed { index, .. } => {
                    views[index].add_task(copy);
                    touched
                        .entry(index)
                        .or_insert_with(|| self.claims_of(&views[index].name))
                        .add(&claim_of(copy));
                    chosen.push(index);
                }
                Decision::NoFit { reasons } => {
                    return Err(summarize_rejections(copy, &views, &reasons));
                }
            }
        }
        let mut touched: Vec<(usize, NodeClaims)> = touched.into_iter().collect();
        touched.sort_by_key(|(index, _)| *index);
        Ok(Plan { chosen, touched })
    }
}

/// `node` with what `claims` say is placed on it.
fn view_with(node: &NodeView, claims: &NodeClaims) -> NodeView {
    let mut view = node.clone();
    view.allocated.cpu = claims.cpu();
    view.allocated.memory = claims.memory;
    view.allocated.disk = claims.disk;
    view.task_count = usize::try_from(claims.tasks).unwrap_or(usize::MAX);
    view.host_ports_taken = claims.host_ports();
    view
}

/// What a request claims of its node.
pub fn claim_of(copy: &TaskRequest) -> Claim {
    Claim {
        cpu: copy.cpu_cores(),
        memory: copy.memory,
        disk: copy.disk,
        ports: copy.host_ports.clone(),
    }
}

fn encode(claims: &NodeClaims) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(claims)
        .map_err(|err| StoreError::Etcd(format!("cannot encode claims: {err}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cube_types::Resources;
    use cube_types::task::HostPort;

    fn node(name: &str, cpu: f64) -> NodeView {
        NodeView {
            name: name.into(),
            ready: true,
            capacity: Resources {
                cpu,
                memory: 1 << 30,
                disk: 1 << 30,
            },
            ..NodeView::default()
        }
    }

    #[test]
    fn a_view_counts_what_the_claims_say_whatever_the_node_carried() {
        let mut carried = node("w1", 4.0);
        carried.allocated.cpu = 3.0;
        carried.task_count = 9;
        let mut claims = NodeClaims::default();
        claims.add(&claim_of(&TaskRequest {
            cpu: 0.25,
            memory: 10,
            host_ports: [HostPort::tcp(80)].into_iter().collect(),
            ..TaskRequest::default()
        }));
        let view = view_with(&carried, &claims);
        assert_eq!(view.allocated.cpu, 0.25);
        assert_eq!(view.allocated.memory, 10);
        assert_eq!(view.task_count, 1);
        assert!(view.host_ports_taken.contains(&HostPort::tcp(80)));
        assert_eq!(view.capacity.cpu, 4.0);
    }
}
