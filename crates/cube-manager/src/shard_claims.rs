//! Claims per node and shard: how managers that each act for their own shards
//! (`--shard-controllers`) place on the same nodes without double-booking one (issue 32,
//! part 3: Omega's shared state on etcd).
//!
//! Each manager holds only its own shards' tasks, so none can sum a node's load from tasks.
//! Beside the tables, under `claims/NODE/SHARD` (the shard in five digits), etcd keeps what
//! the tasks of one shard placed on one node ask for (`cube_types::claims::NodeClaims`):
//! written only by that shard's owner, and always recomputable by it from its tasks. A
//! manager plans on its own tasks' load plus the other shards' claims, followed live by a
//! watch of `claims/`.
//!
//! The order keeps every node's claims at or above what runs there, whatever crashes:
//! - **a placement claims first**: the placed nodes' new claims commit in one transaction
//!   **only if no claim of those nodes changed since the placer last knew them** (one range
//!   comparison per node: every key under `claims/NODE/` has a `mod_revision` no later than
//!   the revision known), and the tasks are written after. A placer that lost the race
//!   learns the nodes' claims from the refusal and plans again at once. A crash between the
//!   two leaves a claim without its task: too much counted, never too little.
//! - **an end releases after**: once a task that held room has ended (its record written), a
//!   later pass sees the node's own claims above what its tasks hold and writes them down.
//! - **a new owner recounts**: a manager that takes a shard writes its claims from the
//!   shard's tasks at its first pass, the same values the last owner wrote for them.
//!
//! Every write is fenced on the shards held, so a manager that lost a shard cannot claim
//! for it. Deletions are not seen by the range comparison: a claim that goes away only
//! frees room, so a placer that missed it counted too much, never too little.

use std::collections::{BTreeMap, HashMap};

use cube_store::{Change, EtcdDb, EtcdStore, Fence, Optimistic, Quiet, Store, StoreError, Watch};
use cube_types::claims::{Claim, NodeClaims};
use cube_types::shard::ShardScope;
use cube_types::task::Task;

use crate::cluster::Shared;

/// The table-like prefix of the claims: `claims/NODE/SHARD`.
pub const SHARD_CLAIMS: &str = "claims";

/// A key written (`None`: deleted) and its value.
type Put = (String, Option<Vec<u8>>);

/// One node's claims by shard.
pub(crate) type ByShard = BTreeMap<u32, NodeClaims>;

/// The most keys of one etcd transaction (etcd's `--max-txn-ops` default), for the
/// comparisons and the fence's keys together, and for the writes.
const TXN_OPS: usize = 128;

/// What a manager acting for its shards needs to claim room on etcd: the database, and the
/// fence of the shards it holds.
#[derive(Clone)]
pub struct ClaimsSettings {
    pub db: EtcdDb,
    pub fence: Option<Fence>,
}

impl std::fmt::Debug for ClaimsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimsSettings")
            .field("db", &self.db.describe())
            .finish_non_exhaustive()
    }
}

/// The key of `shard`'s claims on `node`, relative to the store's prefix.
pub fn claims_key(node: &str, shard: u32) -> String {
    format!("{SHARD_CLAIMS}/{node}/{shard:05}")
}

fn node_prefix(node: &str) -> String {
    format!("{SHARD_CLAIMS}/{node}/")
}

/// `NODE/SHARD` (a key of the claims' table) as its node and shard.
fn parse_key(key: &str) -> Option<(&str, u32)> {
    let (node, shard) = key.rsplit_once('/')?;
    Some((node, shard.parse().ok()?))
}

/// What `task` claims of its node.
pub(crate) fn claim_of_task(task: &Task) -> Claim {
    Claim {
        cpu: task.spec.cpu,
        memory: task.spec.memory,
        disk: task.spec.disk,
        ports: task.fixed_host_ports().collect(),
    }
}

/// One manager's view of every node's claims, and its writes of its own.
pub(crate) struct ShardClaims {
    db: EtcdDb,
    fence: Option<Fence>,
    table: EtcdStore<NodeClaims>,
    /// The claims' changes since they were read; `None` once the watch ended (they are read
    /// again at the next look).
    watch: Option<Watch<NodeClaims>>,
    /// Each node's claims by shard, as last read or written, with their `mod_revision`.
    known: HashMap<String, BTreeMap<u32, (NodeClaims, i64)>>,
    /// The revision up to which `known` holds every change: the read's, then the one before
    /// the last the watch handed ([`complete_through`]).
    seen: i64,
    /// A later revision up to which one node's claims are known whole: a commit's, or a
    /// refusal's.
    node_seen: HashMap<String, i64>,
    /// The transactions that lost the race to another manager, since the start.
    pub(crate) conflicts: u64,
}

impl ShardClaims {
    /// The fence its writes carry.
    pub(crate) fn fence(&self) -> Option<&Fence> {
        self.fence.as_ref()
    }

    /// The fence of the shards held now, once they changed.
    pub(crate) fn set_fence(&mut self, fence: Option<Fence>) {
        self.fence = fence;
    }

    /// Reads every claim and follows their changes from there.
    pub(crate) async fn open(settings: ClaimsSettings) -> Result<ShardClaims, StoreError> {
        let table = EtcdStore::new(settings.db.clone(), SHARD_CLAIMS)?;
        let mut claims = ShardClaims {
            db: settings.db,
            fence: settings.fence,
            table,
            watch: None,
            known: HashMap::new(),
            seen: 0,
            node_seen: HashMap::new(),
            conflicts: 0,
        };
        claims.refresh().await?;
        Ok(claims)
    }

    async fn refresh(&mut self) -> Result<(), StoreError> {
        let (keys, revision) = self.db.read_versioned(&format!("{SHARD_CLAIMS}/")).await?;
        self.known.clear();
        self.node_seen.clear();
        for key in keys {
            let value = serde_json::from_slice::<NodeClaims>(&key.value).ok();
            let relative = key
                .key
                .strip_prefix(&format!("{SHARD_CLAIMS}/"))
                .unwrap_or("");
            self.take(relative, value, key.mod_revision);
        }
        self.seen = revision;
        self.watch = Some(self.table.watch("", u64::try_from(revision).unwrap_or(0))?);
        Ok(())
    }

    /// Takes in one claim as read (`None`: deleted, or unreadable, which is counted as
    /// nothing only when deleted: an unreadable claim keeps what was known).
    fn take(&mut self, key: &str, value: Option<NodeClaims>, revision: i64) {
        let Some((node, shard)) = parse_key(key) else {
            return;
        };
        let shards = self.known.entry(node.to_string()).or_default();
        if shards
            .get(&shard)
            .is_some_and(|(_, known)| *known > revision)
        {
            return;
        }
        match value {
            Some(value) => {
                shards.insert(shard, (value, revision));
            }
            None => {
                shards.remove(&shard);
            }
        }
    }

    /// Takes in the changes that arrived since the last look; reads every claim again when
    /// the watch ended.
    pub(crate) async fn catch_up(&mut self) -> Result<(), StoreError> {
        let Some(changes) = drain_claims(&mut self.watch) else {
            return self.refresh().await;
        };
        let mut last = 0;
        for (key, value, revision) in changes {
            self.take(&key, value, revision);
            last = last.max(revision);
        }
        self.seen = self.seen.max(complete_through(last));
        Ok(())
    }

    /// Each node's claims of the shards `scope` does not hold: what the other managers
    /// placed there.
    pub(crate) fn others(&self, scope: &ShardScope) -> HashMap<String, NodeClaims> {
        let mut others = HashMap::new();
        for (node, shards) in &self.known {
            let mut sum = NodeClaims::default();
            for (shard, (claims, _)) in shards {
                if !scope.holds(*shard) {
                    sum.cpu_millis = sum.cpu_millis.saturating_add(claims.cpu_millis);
                    sum.memory = sum.memory.saturating_add(claims.memory);
                    sum.disk = sum.disk.saturating_add(claims.disk);
                    sum.tasks = sum.tasks.saturating_add(claims.tasks);
                    sum.ports.extend(claims.ports.iter().cloned());
                }
            }
            if !sum.is_empty() {
                others.insert(node.clone(), sum);
            }
        }
        others
    }

    /// The nodes whose claims for `scope`'s shards differ from what its tasks hold there:
    /// every node with a task or a claim of its own at the first look (`all`), else those
    /// whose totals differ (a task ended, moved or stopped before its placement was
    /// written). With what each should claim.
    pub(crate) fn stale(
        &self,
        state: &Shared,
        scope: &ShardScope,
        all: bool,
    ) -> Vec<(String, ByShard)> {
        let mut stale = Vec::new();
        let mut look = |node: &str| {
            if !all && self.own_totals_match(state, node, scope) {
                return;
            }
            let own = own_on_node(state, node, scope);
            if own != self.own_written(node, scope) {
                stale.push((node.to_string(), own));
            }
        };
        for entry in state.nodes.entries() {
            look(&entry.name);
        }
        // A node gone from the records that still has claims of these shards.
        for (node, shards) in &self.known {
            if state.nodes.get(node).is_none() && shards.keys().any(|shard| scope.holds(*shard)) {
                look(node);
            }
        }
        stale.sort_by(|a, b| a.0.cmp(&b.0));
        stale
    }

    /// Whether the totals of `scope`'s claims on `node`, as known, are what its tasks here
    /// hold there (tasks, memory, disk, and CPU within a thousandth a task: sums of rounded
    /// CPU may differ by that much). Read without copying a claim: every node, every pass.
    fn own_totals_match(&self, state: &Shared, node: &str, scope: &ShardScope) -> bool {
        let held = state.cache.load(node);
        let tasks = held.map_or(0, |load| load.tasks.len() as u64);
        let memory = held.map_or(0, |load| load.allocated.memory);
        let disk = held.map_or(0, |load| load.allocated.disk);
        let cpu = cube_types::claims::cpu_millis(held.map_or(0.0, |load| load.allocated.cpu));
        let (mut claimed_tasks, mut claimed_memory, mut claimed_disk, mut claimed_cpu) =
            (0u64, 0u64, 0u64, 0u64);
        for (shard, (claims, _)) in self.known.get(node).into_iter().flatten() {
            if scope.holds(*shard) {
                claimed_tasks += claims.tasks;
                claimed_memory += claims.memory;
                claimed_disk += claims.disk;
                claimed_cpu += claims.cpu_millis;
            }
        }
        (tasks, memory, disk) == (claimed_tasks, claimed_memory, claimed_disk)
            && cpu.abs_diff(claimed_cpu) <= tasks
    }

    /// The claims of `scope`'s shards on `node`, as known.
    fn own_written(&self, node: &str, scope: &ShardScope) -> ByShard {
        self.known
            .get(node)
            .map(|shards| {
                shards
                    .iter()
                    .filter(|(shard, _)| scope.holds(**shard))
                    .map(|(shard, (claims, _))| (*shard, claims.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Writes `wanted` — each node's claims by shard, as they should be, for the shards of
    /// `scope` — each node's only if none of its claims changed since they were last known.
    /// `true` when every node's went through; `false` when another manager changed a node's
    /// claims first (what was known of those nodes is then what etcd said in refusing).
    /// Nodes whose claims are as wanted are not written.
    pub(crate) async fn write(
        &mut self,
        wanted: Vec<(String, ByShard)>,
        scope: &ShardScope,
    ) -> Result<bool, StoreError> {
        let fenced = self.fence.as_ref().map_or(0, |fence| fence.keys().len());
        let room = TXN_OPS.saturating_sub(fenced).max(1);
        let mut batch: Vec<(String, Vec<Put>)> = Vec::new();
        let mut puts_in_batch = 0;
        for (node, claims) in wanted {
            let written = self.own_written(&node, scope);
            let mut puts = Vec::new();
            for (shard, value) in &claims {
                if value.is_empty() {
                    continue;
                }
                if written.get(shard) != Some(value) {
                    let encoded = serde_json::to_vec(value)
                        .map_err(|err| StoreError::Etcd(format!("cannot encode claims: {err}")))?;
                    puts.push((claims_key(&node, *shard), Some(encoded)));
                }
            }
            for shard in written.keys() {
                if claims.get(shard).is_none_or(NodeClaims::is_empty) {
                    puts.push((claims_key(&node, *shard), None));
                }
            }
            if puts.is_empty() {
                continue;
            }
            if !batch.is_empty() && (batch.len() + 1 > room || puts_in_batch + puts.len() > TXN_OPS)
            {
                if !self.commit(std::mem::take(&mut batch)).await? {
                    return Ok(false);
                }
                puts_in_batch = 0;
            }
            puts_in_batch += puts.len();
            batch.push((node, puts));
        }
        if batch.is_empty() {
            return Ok(true);
        }
        self.commit(batch).await
    }

    /// One transaction of [`ShardClaims::write`].
    async fn commit(&mut self, batch: Vec<(String, Vec<Put>)>) -> Result<bool, StoreError> {
        let quiet: Vec<Quiet> = batch
            .iter()
            .map(|(node, _)| Quiet {
                prefix: node_prefix(node),
                revision: self
                    .node_seen
                    .get(node)
                    .copied()
                    .unwrap_or(0)
                    .max(self.seen),
            })
            .collect();
        let puts: Vec<Put> = batch
            .iter()
            .flat_map(|(_, puts)| puts.iter().cloned())
            .collect();
        match self
            .db
            .write_if_quiet(&quiet, puts, self.fence.as_ref())
            .await?
        {
            Optimistic::Committed { revision } => {
                for (node, puts) in batch {
                    for (key, value) in puts {
                        let relative = key
                            .strip_prefix(&format!("{SHARD_CLAIMS}/"))
                            .unwrap_or("")
                            .to_string();
                        let value = value.and_then(|bytes| serde_json::from_slice(&bytes).ok());
                        self.take(&relative, value, revision);
                    }
                    self.node_seen.insert(node, revision);
                }
                Ok(true)
            }
            Optimistic::Changed { now } => {
                self.conflicts += 1;
                // What etcd answered is every claim of those nodes as it is now.
                for (node, _) in &batch {
                    self.known.remove(node);
                }
                let mut newest: HashMap<String, i64> = HashMap::new();
                for key in now {
                    let relative = key
                        .key
                        .strip_prefix(&format!("{SHARD_CLAIMS}/"))
                        .unwrap_or("")
                        .to_string();
                    if let Some((node, _)) = parse_key(&relative) {
                        let at = newest.entry(node.to_string()).or_default();
                        *at = (*at).max(key.mod_revision);
                    }
                    let value = serde_json::from_slice::<NodeClaims>(&key.value).ok();
                    self.take(&relative, value, key.mod_revision);
                }
                for (node, _) in &batch {
                    let at = newest.get(node).copied().unwrap_or(0);
                    self.node_seen.insert(node.clone(), at);
                }
                Ok(false)
            }
        }
    }
}

/// The revision up to which the changes a look drained are known whole, the last of them
/// at `last` (0: none drained): the one before it. Another manager's claim on several
/// nodes is one etcd revision with a change per node, handed to the watch one change at a
/// time, so a look may drain some of that revision's changes and not yet the others. Were
/// the last revision counted as whole, a node whose change of it had not arrived would be
/// committed on as unchanged since that revision, though its claims were never counted
/// here: the node double-booked (seen as 22 tasks of 16 MiB placed on five nodes of 64 MiB
/// by three managers at once, under load).
fn complete_through(last: i64) -> i64 {
    last.saturating_sub(1).max(0)
}

/// One claim's change: its key in the claims' table, its value (`None`: deleted) and the
/// revision it was made at.
pub(crate) type ClaimChange = (String, Option<NodeClaims>, i64);

/// The changes a watch of claims holds now, without waiting; `None` once the watch ended
/// (it fell behind, or a value could not be read): the claims must be read again.
pub(crate) fn drain_claims(watch: &mut Option<Watch<NodeClaims>>) -> Option<Vec<ClaimChange>> {
    let mut changes = Vec::new();
    loop {
        match watch.as_mut()?.try_next() {
            None => return Some(changes),
            Some(Ok(Change::Put {
                key,
                value,
                revision,
            })) => changes.push((
                key,
                Some(value),
                i64::try_from(revision).unwrap_or(i64::MAX),
            )),
            Some(Ok(Change::Delete { key, revision })) => {
                changes.push((key, None, i64::try_from(revision).unwrap_or(i64::MAX)));
            }
            Some(Err(err)) => {
                tracing::debug!("the claims are read again: {err}");
                *watch = None;
                return None;
            }
        }
    }
}

/// What the tasks of `scope`'s shards holding room on `node` claim there, by shard.
pub(crate) fn own_on_node(state: &Shared, node: &str, scope: &ShardScope) -> ByShard {
    let mut claims = ByShard::new();
    if let Some(load) = state.cache.load(node) {
        for id in &load.tasks {
            if let Some(task) = state.cache.get(id) {
                claims
                    .entry(scope.shard_of(&task.spec.project))
                    .or_default()
                    .add(&claim_of_task(task));
            }
        }
    }
    claims
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_look_counts_the_last_revision_it_drained_as_not_yet_whole() {
        // Changes of revisions 7 and 9 drained: every change of 7 arrived (the watch hands
        // them in order), but 9 may have a change on another node still on its way.
        assert_eq!(complete_through(9), 8);
        assert_eq!(complete_through(0), 0);
    }

    #[test]
    fn a_key_names_its_node_and_shard() {
        assert_eq!(claims_key("w1", 3), "claims/w1/00003");
        assert_eq!(parse_key("w1/00003"), Some(("w1", 3)));
        assert_eq!(parse_key("w1"), None);
        assert_eq!(parse_key("w1/x"), None);
        // A node prefix ends in '/', so `w1` is not a prefix of `w10`'s claims.
        assert!(!claims_key("w10", 0).starts_with(&node_prefix("w1")));
    }
}
