//! The shard ring of managers sharing one etcd cluster: each manager's virtual nodes hold
//! points on the ring and the shards of their ranges (`cube_types::shard` says how points
//! are chosen and what range each gives).
//!
//! In etcd, beside the tables, under the store's prefix:
//! - `ring/size`: the ring's size, written once by the cluster's first manager
//!   (`--shards`, 16 by default) and read by every later one;
//! - `ring/points/NNNNN`: a virtual node's point (`{"Position","Manager","VirtualNode"}`),
//!   under its manager's lease;
//! - `ring/shards/NNNNN`: who holds shard N (`{"Manager","VirtualNode"}`), under the
//!   holder's lease. Created only where absent and deleted only by its holder, so a shard is
//!   held by one live virtual node at most; its `create_revision` is the holder's fence;
//! - `manager-modes/LEASE`: how a live manager acts (`{"Manager","ShardControllers"}`), under
//!   a lease of its own, written as it starts ([`settle_mode`]): every manager of a cluster
//!   acts for its shards (`--shard-controllers`) or none does.
//!
//! Each manager runs one loop ([`hold_shards`]): read `ring/`, put a point for each of its
//! virtual nodes that has none, give back (delete) the shards it holds that the points now
//! give to another, take (create) the free ones they give to it, and wait on a watch of
//! `ring/` for the next change. A manager joining puts points at the ends of others'
//! ranges, so as to hold an even share of the ring (`pick_point`); those others see the
//! points, give the shards back, and the joining one takes them. A manager's points are
//! written only if no other point was since it read the ring, so managers joining at once
//! take turns. A manager that dies stops renewing its lease; within the TTL etcd deletes its
//! points and shards, and the virtual nodes before its points take its ranges. A manager
//! that stops revokes its lease: the others take its shards at once.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use cube_store::{EtcdDb, Lease, LeasedKey, StoreError};
use cube_types::shard::{DEFAULT_RING, MAX_RING, Point, ShardsView, format_shards, owner_of};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

const SIZE_KEY: &str = "ring/size";
const RING_PREFIX: &str = "ring/";
const POINTS: &str = "ring/points/";
const SHARDS: &str = "ring/shards/";
/// Outside `ring/`, whose every change wakes the ring's loop.
const MODES: &str = "manager-modes/";

/// The value of `manager-modes/LEASE`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ModeRecord {
    manager: String,
    shard_controllers: bool,
}

/// Says how this manager acts (`--shard-controllers` or not) under a lease of its own, for as
/// long as the returned lease lives, and refuses to start when a live manager of the same
/// cluster acts the other way: managers acting for their shards beside a leader acting for
/// every shard would both act for the same projects (each placing and stopping their tasks),
/// and a manager without the flag holding shards would leave its projects with no
/// controller. Of two started at once the one that wrote later gives way (etcd's revisions
/// order them), so one way always wins. A manager killed within the last `ttl` still counts
/// until its lease runs out; older Cubes write no such key and are not seen.
pub async fn settle_mode(
    db: &EtcdDb,
    manager: &str,
    shard_controllers: bool,
    ttl: Duration,
) -> anyhow::Result<Lease> {
    let lease = db
        .grant_lease(ttl, "the manager's mode key")
        .await
        .context("granting the lease of this manager's mode key in etcd")?;
    let record = ModeRecord {
        manager: manager.to_string(),
        shard_controllers,
    };
    let value = serde_json::to_vec(&record).context("writing this manager's mode")?;
    let key = format!("{MODES}{:016x}", lease.id());
    let mine = db
        .create_if_absent(&key, value, lease.id())
        .await
        .context("writing this manager's mode key in etcd")?
        .with_context(|| format!("etcd already holds {key}, under a lease just granted"))?;
    let (live, _) = db
        .read_prefix(MODES)
        .await
        .context("reading how the cluster's other managers act")?;
    let earlier_other_way = live
        .iter()
        .filter(|held| held.lease != lease.id() && held.create_revision < mine)
        .filter_map(|held| serde_json::from_slice::<ModeRecord>(&held.value).ok())
        .find(|other| other.shard_controllers != shard_controllers);
    if let Some(other) = earlier_other_way {
        lease.revoke().await;
        let (theirs, yours) = if other.shard_controllers {
            ("with", "without")
        } else {
            ("without", "with")
        };
        anyhow::bail!(
            "manager {} shares this etcd cluster and prefix and runs {theirs} \
             --shard-controllers, and this one was started {yours} it: every manager of a \
             cluster acts the same way (all for their shards, or the leader for every shard). \
             Start this one {theirs} --shard-controllers, or stop every manager and start \
             them all the new way (a manager stopped less than --leader-ttl ago counts until \
             then)",
            other.manager
        );
    }
    Ok(lease)
}

/// The value of `ring/shards/N`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Holder {
    manager: String,
    virtual_node: String,
}

/// The ring's size: the one stored, or `asked` (else 16) stored now by the cluster's first
/// manager. A size asked for that differs from the stored one is an error: the ring cannot
/// change under a cluster's records.
pub async fn ring_size(db: &EtcdDb, asked: Option<u32>) -> anyhow::Result<u32> {
    let wanted = asked.unwrap_or(DEFAULT_RING);
    let stored = db
        .get_or_create(SIZE_KEY, wanted.to_string().into_bytes())
        .await
        .context("reading the shard ring's size from etcd")?;
    let stored: u32 = String::from_utf8_lossy(&stored)
        .trim()
        .parse()
        .ok()
        .filter(|size| (1..=MAX_RING).contains(size))
        .with_context(|| {
            format!(
                "etcd's {SIZE_KEY} holds {:?}, not a ring size of 1 to {MAX_RING}",
                String::from_utf8_lossy(&stored)
            )
        })?;
    if let Some(asked) = asked {
        anyhow::ensure!(
            asked == stored,
            "this cluster's shard ring has {stored} shards, set when its first manager \
             started; --shards {asked} cannot change it (leave --shards out)"
        );
    }
    Ok(stored)
}

/// What etcd says of the ring now.
struct RingNow {
    /// Every point, with the lease it is held under.
    points: Vec<(Point, i64)>,
    /// Each shard's holder, with its lease and the revision its key was created at.
    holders: BTreeMap<u32, (Holder, i64, i64)>,
    revision: i64,
}

/// The shards this manager holds, each with the revision its `ring/shards/N` key was created
/// at: what its writes for those shards' records are fenced on ([`Held::fence`]) and what its
/// state is scoped to ([`Held::scope`]). Published by [`hold_shards`] after every look that
/// changed it; empty while the manager holds nothing (its lease lost, or every range taken).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    /// In shard order.
    pub shards: Vec<(u32, i64)>,
}

impl Held {
    /// The scope of a `Manager` acting for these shards.
    pub fn scope(&self, ring: u32) -> cube_types::shard::ShardScope {
        cube_types::shard::ShardScope::of(ring, self.shards.iter().map(|(shard, _)| *shard))
    }

    /// Whether `next` holds every shard held here under the same key, and more: the shards
    /// it adds can be taken without giving any up (`Manager::take_shards`).
    pub fn grows_into(&self, next: &Held) -> bool {
        next.shards.len() > self.shards.len()
            && self.shards.iter().all(|held| next.shards.contains(held))
    }

    /// The fence of writes made for these shards: refused once any of their keys is no
    /// longer the one this manager created. `None` when it holds nothing.
    pub fn fence(&self, db: &EtcdDb) -> Result<Option<cube_store::Fence>, cube_store::FenceError> {
        if self.shards.is_empty() {
            return Ok(None);
        }
        let keys = self
            .shards
            .iter()
            .map(|(shard, created)| db.fence_key(&shard_key(*shard), *created));
        cube_store::Fence::all(keys).map(Some)
    }
}

/// `ring/shards/NNNNN`.
fn shard_key(shard: u32) -> String {
    format!("{SHARDS}{shard:05}")
}

fn numbered(key: &str, prefix: &str) -> Option<u32> {
    key.strip_prefix(prefix)?.parse().ok()
}

fn read_ring(keys: Vec<LeasedKey>, revision: i64) -> RingNow {
    let mut points = Vec::new();
    let mut holders = BTreeMap::new();
    for key in keys {
        if numbered(&key.key, POINTS).is_some() {
            if let Ok(point) = serde_json::from_slice::<Point>(&key.value) {
                points.push((point, key.lease));
            }
        } else if let Some(shard) = numbered(&key.key, SHARDS)
            && let Ok(holder) = serde_json::from_slice::<Holder>(&key.value)
        {
            holders.insert(shard, (holder, key.lease, key.create_revision));
        }
    }
    RingNow {
        points,
        holders,
        revision,
    }
}

/// `GET /shards` of managers on etcd.
pub async fn view(db: &EtcdDb, ring: u32) -> Result<ShardsView, StoreError> {
    let (keys, revision) = db.read_prefix(RING_PREFIX).await?;
    let now = read_ring(keys, revision);
    let points: Vec<Point> = now.points.into_iter().map(|(point, _)| point).collect();
    let holders: Vec<Option<String>> = (0..ring)
        .map(|shard| {
            now.holders
                .get(&shard)
                .map(|(holder, _, _)| holder.virtual_node.clone())
        })
        .collect();
    Ok(ShardsView::from_ring(ring, &points, &holders))
}

/// Who holds each shard now, by the address of its manager, and every manager on the ring
/// (by their points): where a front hands a request for a shard, and whom it asks when it
/// gathers a list of every project.
#[derive(Debug, Clone, Default)]
pub struct Owners {
    /// Each held shard's manager.
    pub holders: BTreeMap<u32, String>,
    /// Every manager with a point on the ring, in address order.
    pub managers: Vec<String>,
    /// The revision the ring was read at.
    pub revision: i64,
}

/// [`Owners`] as etcd says now.
pub async fn owners(db: &EtcdDb) -> Result<Owners, StoreError> {
    let (keys, revision) = db.read_prefix(RING_PREFIX).await?;
    let now = read_ring(keys, revision);
    let mut managers: Vec<String> = now
        .points
        .iter()
        .map(|(point, _)| point.manager.clone())
        .chain(
            now.holders
                .values()
                .map(|(holder, _, _)| holder.manager.clone()),
        )
        .collect();
    managers.sort();
    managers.dedup();
    Ok(Owners {
        holders: now
            .holders
            .into_iter()
            .map(|(shard, (holder, _, _))| (shard, holder.manager))
            .collect(),
        managers,
        revision: now.revision,
    })
}

/// Waits until the ring changes after `revision` (at once if it has already), or `bound`.
pub async fn await_change(db: &EtcdDb, revision: i64, bound: Duration) {
    db.wait_for_change(RING_PREFIX, revision, bound, &CancellationToken::new())
        .await;
}

/// This manager's part in the ring.
pub struct RingSettings {
    /// Its address, as the others reach it.
    pub manager: String,
    /// 1 to 4.
    pub virtual_nodes: u32,
    /// The lease's TTL (`--leader-ttl`).
    pub ttl: Duration,
}

/// Holds this manager's part of the ring until `shutdown`, joining again with a new lease
/// whenever its lease is lost; at shutdown the lease is revoked, so the others take its
/// shards at once. What it holds is published on `held` as it changes.
pub async fn hold_shards(
    db: EtcdDb,
    ring: u32,
    settings: RingSettings,
    held: tokio::sync::watch::Sender<Held>,
    shutdown: CancellationToken,
) {
    let mut pause = Duration::from_millis(100);
    while !shutdown.is_cancelled() {
        let lease = match db.grant_lease(settings.ttl, "the shard ring's lease").await {
            Ok(lease) => lease,
            Err(err) => {
                tracing::warn!(error = %err, "cannot join the shard ring; trying again");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    // A retry's backoff: etcd did not answer.
                    _ = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(settings.ttl);
                continue;
            }
        };
        let mut member = Member {
            db: &db,
            ring,
            settings: &settings,
            lease: &lease,
            taken_from: Vec::new(),
            held: Vec::new(),
            published: &held,
        };
        while !shutdown.is_cancelled() && !lease.is_lost() {
            match member.look(&shutdown).await {
                Ok(()) => pause = Duration::from_millis(100),
                Err(err) => {
                    tracing::warn!(error = %err, "cannot read or change the shard ring; trying again");
                    tokio::select! {
                        _ = shutdown.cancelled() => {}
                        _ = lease.lost() => {}
                        // A retry's backoff: etcd did not answer.
                        _ = tokio::time::sleep(pause) => {}
                    }
                    pause = (pause * 2).min(settings.ttl);
                }
            }
        }
        // Whatever was held went with the lease (or goes with it now).
        held.send_if_modified(|now| {
            let had = !now.shards.is_empty();
            now.shards.clear();
            had
        });
        if shutdown.is_cancelled() {
            lease.revoke().await;
            tracing::info!("left the shard ring: the other managers take its shards");
            return;
        }
        tracing::warn!(
            shards = %format_shards(&member.held),
            "the shard ring's lease was lost, and with it every shard held: joining again"
        );
    }
}

/// One manager's virtual nodes on the ring, under one lease.
struct Member<'a> {
    db: &'a EtcdDb,
    ring: u32,
    settings: &'a RingSettings,
    lease: &'a Lease,
    /// The managers this one's points have taken ranges from, so that its next point
    /// takes from another.
    taken_from: Vec<String>,
    /// The shards held after the last look, for the log of what changed.
    held: Vec<u32>,
    /// Where what it holds is published.
    published: &'a tokio::sync::watch::Sender<Held>,
}

impl Member<'_> {
    fn virtual_node(&self, n: u32) -> String {
        format!("{}/{n}", self.settings.manager)
    }

    /// One look at the ring: a change made, or the wait for the next change done.
    async fn look(&mut self, shutdown: &CancellationToken) -> Result<(), StoreError> {
        let (keys, revision) = self.db.read_prefix(RING_PREFIX).await?;
        let now = read_ring(keys, revision);
        let lease = self.lease.id();
        if self.place_points(&now).await? {
            return Ok(());
        }
        let points: Vec<Point> = now.points.iter().map(|(point, _)| point.clone()).collect();
        let mut changed = false;
        let mut held = Vec::new();
        let mut fences = Vec::new();
        for shard in 0..self.ring {
            let wanted = owner_of(shard, &points)
                .filter(|point| now.points.iter().any(|(p, l)| p == *point && *l == lease));
            let key = shard_key(shard);
            match (now.holders.get(&shard), wanted) {
                // Held here by the virtual node the points give it to.
                (Some((holder, held_under, created)), Some(point))
                    if *held_under == lease && holder.virtual_node == point.virtual_node =>
                {
                    held.push(shard);
                    fences.push((shard, *created));
                }
                // Held here, but the points give it to another (or to another of this
                // manager's virtual nodes): give it back.
                (Some((_, held_under, _)), _) if *held_under == lease => {
                    changed |= self.db.delete_if_held(&key, lease).await?;
                }
                // Free, and the points give it here: take it.
                (None, Some(point)) => {
                    let holder = Holder {
                        manager: self.settings.manager.clone(),
                        virtual_node: point.virtual_node.clone(),
                    };
                    let value = serde_json::to_vec(&holder)
                        .map_err(|err| StoreError::Etcd(err.to_string()))?;
                    if let Some(created) = self.db.create_if_absent(&key, value, lease).await? {
                        held.push(shard);
                        fences.push((shard, created));
                    }
                    changed = true;
                }
                // Held by another (who gives it back once it sees the points), or not ours.
                _ => {}
            }
        }
        held.sort_unstable();
        if held != self.held {
            let taken: Vec<u32> = held
                .iter()
                .copied()
                .filter(|s| !self.held.contains(s))
                .collect();
            let given: Vec<u32> = self
                .held
                .iter()
                .copied()
                .filter(|s| !held.contains(s))
                .collect();
            tracing::info!(
                holding = %format_shards(&held),
                taken = %format_shards(&taken),
                given_back = %format_shards(&given),
                "shards held by this manager"
            );
            self.held = held;
        }
        // A shard given back and taken again has a new key: published even when the list of
        // shards reads the same.
        self.published.send_if_modified(|now| {
            let moved = now.shards != fences;
            if moved {
                now.shards = fences;
            }
            moved
        });
        if changed {
            return Ok(());
        }
        tokio::select! {
            _ = self.lease.lost() => {}
            _ = self.db.wait_for_change(RING_PREFIX, now.revision, self.settings.ttl, shutdown) => {}
        }
        Ok(())
    }

    /// Puts a point for each virtual node of this manager that has none on the ring;
    /// whether it wrote (then the ring is read again before anything else is decided).
    async fn place_points(&mut self, now: &RingNow) -> Result<bool, StoreError> {
        let lease = self.lease.id();
        let mut points: Vec<Point> = now.points.iter().map(|(point, _)| point.clone()).collect();
        // This manager's virtual nodes with no point under its lease: each aims at its part
        // of what the manager still lacks of an even share (`pick_point`).
        let missing: Vec<String> = (1..=self.settings.virtual_nodes)
            .map(|n| self.virtual_node(n))
            .filter(|id| {
                !now.points
                    .iter()
                    .any(|(point, held_under)| point.virtual_node == *id && *held_under == lease)
            })
            .collect();
        let count = missing.len() as u32;
        // Every missing point is chosen first, each on the ring with the ones chosen before
        // it, and all are written in one transaction, only if no other point was written
        // since the ring was read: managers joining at the same moment take turns, each
        // choosing on a ring that holds every point of those before it, as a manager joining
        // a settled ring does. Managers choosing from the same look, or a manager choosing its
        // second point on a ring that changed under its first, each took a share of a ring
        // that was not the one they joined, and their shares came out uneven (4, 9 and 3 of
        // 16).
        let mut taken_from = self.taken_from.clone();
        let mut chosen = Vec::new();
        for (placed, id) in (0..).zip(missing) {
            let Some((position, from)) = cube_types::shard::pick_point(
                self.ring,
                &points,
                &self.settings.manager,
                &taken_from,
                count - placed,
            ) else {
                // The ring is divided as far as it goes: this virtual node waits for a
                // manager to leave.
                continue;
            };
            let point = Point {
                position,
                manager: self.settings.manager.clone(),
                virtual_node: id,
            };
            if let Some(from) = &from {
                taken_from.push(from.clone());
            }
            points.push(point.clone());
            chosen.push((point, from));
        }
        if chosen.is_empty() {
            return Ok(false);
        }
        let entries = chosen
            .iter()
            .map(|(point, _)| {
                let value =
                    serde_json::to_vec(point).map_err(|err| StoreError::Etcd(err.to_string()))?;
                Ok((format!("{POINTS}{:05}", point.position), value))
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        if self
            .db
            .create_all_if_absent_since(entries, lease, POINTS, now.revision)
            .await?
            .is_none()
        {
            // Another manager put a point meanwhile: the ring is read again, and chosen on.
            return Ok(true);
        }
        for (point, from) in &chosen {
            tracing::info!(
                virtual_node = %point.virtual_node,
                position = point.position,
                from = from.as_deref().unwrap_or("nobody"),
                "a virtual node joined the shard ring"
            );
        }
        self.taken_from = taken_from;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use cube_store::{EtcdConfig, EtcdStore, Store, StoreError};
    use cube_test_support::EtcdCluster;
    use cube_types::shard::VirtualNodeShards;
    use tokio::sync::watch;

    use super::*;

    const RING: u32 = 16;

    fn settings(manager: &str) -> RingSettings {
        RingSettings {
            manager: manager.to_string(),
            virtual_nodes: 2,
            ttl: Duration::from_secs(5),
        }
    }

    async fn until(held: &mut watch::Receiver<Held>, what: impl Fn(&Held) -> bool) -> Held {
        tokio::time::timeout(Duration::from_secs(30), held.wait_for(|now| what(now)))
            .await
            .expect("the held shards settle")
            .expect("the ring's loop runs")
            .clone()
    }

    /// A write to a table through `db` under the fence of `held`, made off the runtime as a
    /// manager's are.
    async fn write_under(db: &EtcdDb, held: &Held, key: &str) -> Result<(), StoreError> {
        let fence = held.fence(db).expect("a fence of the held shards");
        db.set_fence(fence);
        let table = EtcdStore::<String>::new(db.clone(), "tasks")?;
        let key = key.to_string();
        tokio::task::spawn_blocking(move || table.put(&key, &"written".to_string()))
            .await
            .expect("the write's thread")
            .map(|_| ())
    }

    /// Managers joining at the same moment still each hold an even share: each point is
    /// chosen on a ring that holds the points written before it (three of two virtual nodes
    /// each on 16 shards: 5, 5 and 6). Five rounds, each a fresh ring under its own prefix.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn managers_joining_at_the_same_moment_hold_even_shares() {
        let cluster = EtcdCluster::start(1);
        for round in 0..5 {
            let prefix = format!("/cube-round-{round}");
            let db = EtcdDb::connect(EtcdConfig::new(cluster.endpoints(), &prefix)).unwrap();
            let shutdown = CancellationToken::new();
            for manager in ["a:1", "b:1", "c:1"] {
                let (held, _) = watch::channel(Held::default());
                let db = EtcdDb::connect(EtcdConfig::new(cluster.endpoints(), &prefix)).unwrap();
                tokio::spawn(hold_shards(
                    db,
                    RING,
                    settings(manager),
                    held,
                    shutdown.clone(),
                ));
            }
            // Settled: six points, every shard held by the virtual node whose range holds it.
            let shares = tokio::time::timeout(Duration::from_secs(30), async {
                loop {
                    let view = view(&db, RING).await.unwrap();
                    let nodes: Vec<&VirtualNodeShards> = view
                        .managers
                        .iter()
                        .flat_map(|m| m.virtual_nodes.iter())
                        .collect();
                    if nodes.len() == 6
                        && view.unowned.is_empty()
                        && nodes.iter().all(|node| node.range == node.shards)
                    {
                        return view
                            .managers
                            .iter()
                            .map(|m| m.shards.len())
                            .collect::<Vec<usize>>();
                    }
                    // Polled: a point is not published until a shard moves.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
            .await
            .expect("three managers divide the ring");
            for share in &shares {
                assert!(
                    (5..=6).contains(share),
                    "round {round}: shares {shares:?}, not 5 or 6 of 16 each"
                );
            }
            shutdown.cancel();
        }
    }

    /// Shards are taken in place only when every shard held stays held under the same key.
    #[test]
    fn a_held_set_grows_into_one_that_keeps_every_shard_under_its_key_and_adds_more() {
        let held = |shards: &[(u32, i64)]| Held {
            shards: shards.to_vec(),
        };
        let now = held(&[(0, 10), (1, 11)]);
        assert!(now.grows_into(&held(&[(0, 10), (1, 11), (2, 40)])));
        assert!(Held::default().grows_into(&now));
        // The same set, one given back, or one held again under a new key: opened again.
        assert!(!now.grows_into(&now.clone()));
        assert!(!now.grows_into(&held(&[(0, 10), (2, 40)])));
        assert!(!now.grows_into(&held(&[(0, 10), (1, 50), (2, 40)])));
    }

    /// What `hold_shards` publishes is what etcd says each manager holds, and its fence
    /// holds exactly as long as those shards stay: a manager that joins takes shards from
    /// the first, whose writes under its old fence are then refused, and go through under
    /// the fence of what it holds now.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_shards_a_manager_holds_are_published_with_their_fence() {
        let cluster = EtcdCluster::start(1);
        let connect = || EtcdDb::connect(EtcdConfig::new(cluster.endpoints(), "/cube")).unwrap();
        let (db_a, db_b) = (connect(), connect());
        let shutdown_a = CancellationToken::new();
        let shutdown_b = CancellationToken::new();
        let (held_a, mut seen_a) = watch::channel(Held::default());
        tokio::spawn(hold_shards(
            db_a.clone(),
            RING,
            settings("a:1"),
            held_a,
            shutdown_a.clone(),
        ));
        let alone = until(&mut seen_a, |held| held.shards.len() == RING as usize).await;
        assert!(alone.scope(RING).is_whole());
        write_under(&db_a, &alone, "t1").await.unwrap();

        let (held_b, mut seen_b) = watch::channel(Held::default());
        tokio::spawn(hold_shards(
            db_b.clone(),
            RING,
            settings("b:1"),
            held_b,
            shutdown_b.clone(),
        ));
        // Settled: each holds exactly the ranges its points give it, as etcd says (between
        // the two, every shard, none twice).
        let ranges_of = |view: &ShardsView, manager: &str| -> Vec<u32> {
            let mut shards: Vec<u32> = view
                .managers
                .iter()
                .filter(|m| m.manager == manager)
                .flat_map(|m| m.virtual_nodes.iter().flat_map(|v| v.range.clone()))
                .collect();
            shards.sort_unstable();
            shards
        };
        let shards_of = |held: &Held| -> Vec<u32> { held.shards.iter().map(|(s, _)| *s).collect() };
        let (a, b) = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let (a, b) = (seen_a.borrow().clone(), seen_b.borrow().clone());
                let view = view(&db_a, RING).await.unwrap();
                if !b.shards.is_empty()
                    && shards_of(&a) == ranges_of(&view, "a:1")
                    && shards_of(&b) == ranges_of(&view, "b:1")
                {
                    return (a, b);
                }
                // Polled: a change of points is not published until a shard moves.
                tokio::select! {
                    _ = seen_a.changed() => {}
                    _ = seen_b.changed() => {}
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
            }
        })
        .await
        .expect("the two managers divide the ring");
        let mut all = [shards_of(&a), shards_of(&b)].concat();
        all.sort_unstable();
        assert_eq!(all, (0..RING).collect::<Vec<u32>>(), "{a:?} {b:?}");

        // The first manager's fence of all sixteen no longer holds: its write is refused,
        // naming a shard the other took, and nothing is written.
        let err = write_under(&db_a, &alone, "t2").await.unwrap_err();
        let StoreError::Fenced { key } = &err else {
            panic!("expected a fenced write, got {err}");
        };
        let moved: u32 = key.rsplit('/').next().unwrap().parse().unwrap();
        assert!(b.scope(RING).holds(moved), "{key} is one of b's: {b:?}");
        // Under the fence of what each holds now, each writes.
        write_under(&db_a, &a, "t2").await.unwrap();
        write_under(&db_b, &b, "t3").await.unwrap();

        // The second leaves: the first holds the whole ring again, and its fence of half of
        // it holds (those keys never moved).
        shutdown_b.cancel();
        let whole = until(&mut seen_a, |held| held.shards.len() == RING as usize).await;
        assert!(a.shards.iter().all(|kept| whole.shards.contains(kept)));
        write_under(&db_a, &whole, "t4").await.unwrap();
        let table = EtcdStore::<String>::new(db_a.clone(), "tasks").unwrap();
        let written = tokio::task::spawn_blocking(move || table.count())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(written, 4, "t1 to t4, the refused write not among them");
        shutdown_a.cancel();
    }
}
