//! The shard ring: how projects are divided among managers sharing one etcd cluster.
//!
//! A project's shard is a stable hash of its name modulo the ring's size (16 unless the
//! cluster was created with another, `cube manager --shards`), so every record of one project
//! is in one shard (the controller seed's `byProjectId`). Each manager runs one to four
//! *virtual nodes*; each virtual node holds a **point** on the ring, a shard number, and
//! owns the range from its point up to the next point (wrapping). A virtual node joining
//! splits the largest range of another manager, preferring a manager its own manager has not
//! yet taken from, so that a manager with two virtual nodes takes pressure off two others.
//! A manager that dies loses its points with its lease, and the ranges before them grow
//! over what it owned.
//!
//! Everything here is pure; the points and the shards' holders live in etcd
//! (`cube-store`'s `ring.rs`), and `GET /shards` shows them as a [`ShardsView`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The ring's size when the cluster's first manager is given none.
pub const DEFAULT_RING: u32 = 16;

/// The largest ring a cluster may be created with.
pub const MAX_RING: u32 = 4096;

/// A manager's virtual nodes when it is given no `--virtual-nodes`.
pub const DEFAULT_VIRTUAL_NODES: u32 = 2;

/// The most virtual nodes one manager may run.
pub const MAX_VIRTUAL_NODES: u32 = 4;

/// The shard of a project: FNV-1a (64 bits) of its name, modulo the ring. Stable across
/// releases and machines: the shard a project's records are in must never move by itself.
pub fn shard_of(project: &str, ring: u32) -> u32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in project.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // The remainder is below `ring`, a u32.
    (hash % u64::from(ring.max(1))) as u32
}

/// A virtual node's point on the ring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Point {
    /// The first shard of its range.
    pub position: u32,
    /// The manager that runs it (its address, as the others reach it).
    pub manager: String,
    /// `MANAGER/N`.
    pub virtual_node: String,
}

/// The shards the virtual node at `position` owns among `points`: from its position up to
/// the next point's, wrapping; empty when no point is at `position`.
pub fn range_at(ring: u32, points: &[Point], position: u32) -> Vec<u32> {
    let mut positions: Vec<u32> = points.iter().map(|point| point.position).collect();
    positions.sort_unstable();
    positions.dedup();
    let Some(index) = positions.iter().position(|p| *p == position) else {
        return Vec::new();
    };
    let next = positions[(index + 1) % positions.len()];
    let length = if next > position {
        next - position
    } else {
        ring - position + next
    };
    (0..length).map(|step| (position + step) % ring).collect()
}

/// The point whose range holds `shard`: the one at the greatest position at or below it, or
/// else the greatest of all (the range that wraps past the ring's end).
pub fn owner_of(shard: u32, points: &[Point]) -> Option<&Point> {
    points
        .iter()
        .filter(|point| point.position <= shard)
        .max_by_key(|point| point.position)
        .or_else(|| points.iter().max_by_key(|point| point.position))
}

/// Where a new virtual node of `manager` puts its point, and the manager the range it starts
/// is taken from. A manager aims at an even share of the ring, `ring / managers` shards (every
/// manager with a point, itself included), split among the virtual nodes it still has to
/// place (`to_place`, this one included): it takes the end of another manager's range, as
/// much as it still wants, leaving the range one shard at least and its holder no less than
/// that share where it can. Ranges of managers it has not yet taken from (`taken_from`) come
/// first, so that a joining manager takes pressure off more than one other, then those of the
/// manager holding the most, then the longest, then the lowest position. A manager that
/// already has its share splits its own longest range in the middle (taken from no one,
/// `None`). `None` when every range is a single shard (the ring is as divided as it can be).
/// The first point of an empty ring is 0.
///
/// Taking the middle of the longest range instead left three managers of two virtual nodes
/// each with 37.5, 37.5 and 25 % of any ring: the third took a quarter from each of the
/// others.
pub fn pick_point(
    ring: u32,
    points: &[Point],
    manager: &str,
    taken_from: &[String],
    to_place: u32,
) -> Option<(u32, Option<String>)> {
    if points.is_empty() {
        return Some((0, None));
    }
    let ranges: Vec<(&Point, u32)> = points
        .iter()
        .map(|point| (point, range_at(ring, points, point.position).len() as u32))
        .filter(|(_, length)| *length > 0)
        .collect();
    let mut totals: BTreeMap<&str, u32> = BTreeMap::new();
    for (point, length) in &ranges {
        *totals.entry(point.manager.as_str()).or_default() += length;
    }
    let managers = totals.len() as u32 + u32::from(!totals.contains_key(manager));
    let share = ring / managers.max(1);
    let mine = totals.get(manager).copied().unwrap_or(0);
    let wanted = share.saturating_sub(mine).div_ceil(to_place.max(1));
    let splittable = || ranges.iter().filter(|(_, length)| *length >= 2);
    // Another point of its own splits its longest range: once it has its share, or when no
    // other manager's range can be split.
    let split_own = || {
        splittable()
            .filter(|(point, _)| point.manager == manager)
            .min_by_key(|(point, length)| (std::cmp::Reverse(*length), point.position))
            .map(|(point, length)| ((point.position + length / 2) % ring, None))
    };
    if wanted == 0 && mine > 0 {
        return split_own();
    }
    splittable()
        .filter(|(point, _)| point.manager != manager)
        .min_by_key(|(point, length)| {
            (
                taken_from.contains(&point.manager),
                std::cmp::Reverse(totals[point.manager.as_str()]),
                std::cmp::Reverse(*length),
                point.position,
            )
        })
        .map(|(point, length)| {
            let spare = totals[point.manager.as_str()].saturating_sub(share);
            let take = wanted.min(spare).clamp(1, length - 1);
            (
                (point.position + length - take) % ring,
                Some(point.manager.clone()),
            )
        })
        .or_else(split_own)
}

/// Shard numbers as ranges, `0-3, 8, 10-15` (`-` for none).
pub fn format_shards(shards: &[u32]) -> String {
    let mut sorted = shards.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts: Vec<String> = Vec::new();
    let mut index = 0;
    while index < sorted.len() {
        let start = sorted[index];
        let mut end = start;
        while index + 1 < sorted.len() && sorted[index + 1] == end + 1 {
            index += 1;
            end = sorted[index];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        index += 1;
    }
    if parts.is_empty() {
        "-".to_string()
    } else {
        parts.join(", ")
    }
}

/// `GET /shards`: the ring, who holds each shard, and each manager's virtual nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ShardsView {
    /// The ring's size.
    pub ring: u32,
    /// Every manager with a virtual node on the ring, by address.
    pub managers: Vec<ManagerShards>,
    /// Shards no virtual node holds at this instant (moving between owners, or every
    /// manager gone).
    #[serde(default)]
    pub unowned: Vec<u32>,
}

/// One manager's part of the ring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ManagerShards {
    /// Its address, as the others reach it.
    pub manager: String,
    /// Every shard one of its virtual nodes holds.
    pub shards: Vec<u32>,
    pub virtual_nodes: Vec<VirtualNodeShards>,
}

/// One virtual node: its point, the range the points give it (in shard order, a range that
/// wraps past the ring's end included), and what it holds now (the same, once a change of
/// owners has settled).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct VirtualNodeShards {
    /// `MANAGER/N`.
    pub id: String,
    pub position: u32,
    pub range: Vec<u32>,
    pub shards: Vec<u32>,
}

impl ShardsView {
    /// One manager alone (a store of its own): it holds every shard.
    pub fn alone(manager: &str, ring: u32) -> ShardsView {
        let all: Vec<u32> = (0..ring).collect();
        ShardsView {
            ring,
            managers: vec![ManagerShards {
                manager: manager.to_string(),
                shards: all.clone(),
                virtual_nodes: vec![VirtualNodeShards {
                    id: format!("{manager}/1"),
                    position: 0,
                    range: all.clone(),
                    shards: all,
                }],
            }],
            unowned: Vec::new(),
        }
    }

    /// The view from the points on the ring and each shard's holder (`holders[shard]`, the
    /// holding virtual node's ID).
    pub fn from_ring(ring: u32, points: &[Point], holders: &[Option<String>]) -> ShardsView {
        let mut managers: Vec<ManagerShards> = Vec::new();
        let mut sorted = points.to_vec();
        sorted.sort_by(|a, b| (&a.manager, a.position).cmp(&(&b.manager, b.position)));
        for point in &sorted {
            let shards: Vec<u32> = (0..ring)
                .filter(|shard| {
                    holders.get(*shard as usize).and_then(Option::as_deref)
                        == Some(point.virtual_node.as_str())
                })
                .collect();
            let mut range = range_at(ring, points, point.position);
            range.sort_unstable();
            let node = VirtualNodeShards {
                id: point.virtual_node.clone(),
                position: point.position,
                range,
                shards,
            };
            match managers.last_mut() {
                Some(last) if last.manager == point.manager => last.virtual_nodes.push(node),
                _ => managers.push(ManagerShards {
                    manager: point.manager.clone(),
                    shards: Vec::new(),
                    virtual_nodes: vec![node],
                }),
            }
        }
        for manager in &mut managers {
            let mut shards: Vec<u32> = manager
                .virtual_nodes
                .iter()
                .flat_map(|node| node.shards.iter().copied())
                .collect();
            shards.sort_unstable();
            manager.shards = shards;
        }
        let unowned = (0..ring)
            .filter(|shard| {
                !managers
                    .iter()
                    .any(|manager| manager.shards.contains(shard))
            })
            .collect();
        ShardsView {
            ring,
            managers,
            unowned,
        }
    }

    /// The manager holding `shard`, if one does.
    pub fn holder(&self, shard: u32) -> Option<&str> {
        self.managers
            .iter()
            .find(|manager| manager.shards.contains(&shard))
            .map(|manager| manager.manager.as_str())
    }
}

/// The shards whose records one manager holds and acts on: every shard of the ring for a
/// manager on its own store (nothing changes), the shards its virtual nodes hold for a manager
/// sharing etcd with others. A record belongs to its project's shard, so a scope is asked
/// about projects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardScope {
    ring: u32,
    /// `held[shard]`: whether the scope holds it; one entry per shard of the ring.
    held: Vec<bool>,
}

impl ShardScope {
    /// Every shard of a ring of `ring`.
    pub fn all(ring: u32) -> ShardScope {
        let ring = ring.max(1);
        ShardScope {
            ring,
            held: vec![true; ring as usize],
        }
    }

    /// The shards `shards` of a ring of `ring`; a shard past the ring's end is not one of its
    /// and is left out.
    pub fn of(ring: u32, shards: impl IntoIterator<Item = u32>) -> ShardScope {
        let ring = ring.max(1);
        let mut held = vec![false; ring as usize];
        for shard in shards {
            if let Some(slot) = held.get_mut(shard as usize) {
                *slot = true;
            }
        }
        ShardScope { ring, held }
    }

    pub fn ring(&self) -> u32 {
        self.ring
    }

    /// Whether it holds every shard: a manager alone, for which the scope filters nothing.
    pub fn is_whole(&self) -> bool {
        self.held.iter().all(|held| *held)
    }

    pub fn holds(&self, shard: u32) -> bool {
        self.held.get(shard as usize).copied().unwrap_or(false)
    }

    /// Whether the records of `project` are this scope's (a record naming no project is
    /// `default`'s).
    pub fn holds_project(&self, project: &str) -> bool {
        self.is_whole() || self.holds(self.shard_of(project))
    }

    /// The shard of `project` in this scope's ring (no project: `default`).
    pub fn shard_of(&self, project: &str) -> u32 {
        shard_of(crate::project::name_or_default(project), self.ring)
    }

    /// The shards it holds, in order.
    pub fn shards(&self) -> Vec<u32> {
        (0..self.ring).filter(|shard| self.holds(*shard)).collect()
    }

    /// The shards it holds as a query parameter's value: ranges without spaces, `0-3,8`
    /// (empty for none). [`ShardScope::parse`] reads it back.
    pub fn to_param(&self) -> String {
        let shards = self.shards();
        if shards.is_empty() {
            return String::new();
        }
        format_shards(&shards).replace(' ', "")
    }

    /// The scope of a ring of `ring` that [`ShardScope::to_param`] wrote as `text`; what is
    /// wrong with it otherwise (a ring of 0 or above [`MAX_RING`], a shard past the ring's
    /// end, a range backwards, anything but numbers, `-` and `,`).
    pub fn parse(ring: u32, text: &str) -> Result<ShardScope, String> {
        if !(1..=MAX_RING).contains(&ring) {
            return Err(format!(
                "a ring of {ring} shards (a ring has 1 to {MAX_RING})"
            ));
        }
        let number = |part: &str| {
            part.parse::<u32>()
                .map_err(|_| format!("{part:?} is not a shard number"))
                .and_then(|shard| {
                    if shard < ring {
                        Ok(shard)
                    } else {
                        Err(format!("shard {shard} is past the end of a ring of {ring}"))
                    }
                })
        };
        let mut held = vec![false; ring as usize];
        for part in text.split(',').filter(|part| !part.is_empty()) {
            let (first, last) = match part.split_once('-') {
                Some((first, last)) => (number(first)?, number(last)?),
                None => (number(part)?, number(part)?),
            };
            if last < first {
                return Err(format!("the range {part:?} goes backwards"));
            }
            for slot in &mut held[first as usize..=last as usize] {
                *slot = true;
            }
        }
        Ok(ShardScope { ring, held })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_written_as_a_parameter_reads_back_and_bad_ones_are_named() {
        let scope = ShardScope::of(16, [0, 1, 2, 3, 8, 10, 11, 15]);
        assert_eq!(scope.to_param(), "0-3,8,10-11,15");
        assert_eq!(ShardScope::parse(16, &scope.to_param()), Ok(scope));
        let none = ShardScope::of(16, []);
        assert_eq!(none.to_param(), "");
        assert_eq!(ShardScope::parse(16, ""), Ok(none));
        for (ring, bad, named) in [
            (16, "16", "past the end"),
            (16, "3-1", "backwards"),
            (16, "a", "not a shard number"),
            (16, "1-", "not a shard number"),
            (0, "1", "ring of 0"),
            (u32::MAX, "1", "1 to 4096"),
        ] {
            let err = ShardScope::parse(ring, bad).unwrap_err();
            assert!(err.contains(named), "{bad}: {err}");
        }
    }

    fn point(position: u32, manager: &str, n: u32) -> Point {
        Point {
            position,
            manager: manager.to_string(),
            virtual_node: format!("{manager}/{n}"),
        }
    }

    /// Joins `count` virtual nodes of `manager` as the ring loop does: each picks a point
    /// on the ring as it stands after the last.
    fn join(ring: u32, points: &mut Vec<Point>, manager: &str, count: u32) -> Vec<String> {
        let mut taken_from = Vec::new();
        for n in 1..=count {
            let (position, from) =
                pick_point(ring, points, manager, &taken_from, count - n + 1).unwrap();
            if let Some(from) = from {
                taken_from.push(from);
            }
            points.push(point(position, manager, n));
        }
        taken_from
    }

    #[test]
    fn a_projects_shard_is_stable_and_within_the_ring() {
        // Fixed values: a change of hash would move every project's records to another shard.
        assert_eq!(shard_of("default", 16), shard_of("default", 16));
        assert_eq!(shard_of("", 16), (0xcbf2_9ce4_8422_2325u64 % 16) as u32);
        assert_eq!(shard_of("a", 16), (0xaf63_dc4c_8601_ec8cu64 % 16) as u32);
        for n in 0..200 {
            assert!(shard_of(&format!("team-{n}"), 16) < 16);
        }
        // 200 projects use every shard of 16.
        let used: std::collections::BTreeSet<u32> =
            (0..200).map(|n| shard_of(&format!("p{n}"), 16)).collect();
        assert_eq!(used.len(), 16);
    }

    #[test]
    fn a_range_runs_to_the_next_point_and_wraps() {
        let points = vec![point(2, "a", 1), point(10, "b", 1)];
        assert_eq!(range_at(16, &points, 2), (2..10).collect::<Vec<_>>());
        assert_eq!(
            range_at(16, &points, 10),
            vec![10, 11, 12, 13, 14, 15, 0, 1]
        );
        assert_eq!(range_at(16, &points, 3), Vec::<u32>::new());
        assert_eq!(owner_of(0, &points).unwrap().manager, "b");
        assert_eq!(owner_of(9, &points).unwrap().manager, "a");
        let alone = vec![point(0, "a", 1)];
        assert_eq!(range_at(16, &alone, 0), (0..16).collect::<Vec<_>>());
    }

    #[test]
    fn every_manager_joining_takes_from_more_than_one_other_and_every_shard_has_one_owner() {
        let ring = 16;
        let mut points = Vec::new();
        assert!(join(ring, &mut points, "m1", 2).is_empty());
        assert_eq!(
            join(ring, &mut points, "m2", 2),
            vec!["m1".to_string(), "m1".to_string()],
            "only m1 to take from"
        );
        for manager in ["m3", "m4"] {
            let taken_from = join(ring, &mut points, manager, 2);
            assert_eq!(taken_from.len(), 2);
            assert_ne!(taken_from[0], taken_from[1], "{manager}: {points:?}");
        }
        // Every shard is in exactly one range, and the four managers hold 3 to 5 each (two
        // virtual nodes cannot take from three others).
        let mut counted = vec![0; ring as usize];
        for point in &points {
            for shard in range_at(ring, &points, point.position) {
                counted[shard as usize] += 1;
            }
        }
        assert!(counted.iter().all(|count| *count == 1));
        let held = held_by_manager(ring, &points);
        assert!(held.values().all(|held| (3..=5).contains(held)), "{held:?}");
    }

    /// How many shards each manager's points give it.
    fn held_by_manager(ring: u32, points: &[Point]) -> BTreeMap<String, u32> {
        let mut held = BTreeMap::new();
        for point in points {
            *held.entry(point.manager.clone()).or_default() +=
                range_at(ring, points, point.position).len() as u32;
        }
        held
    }

    #[test]
    fn managers_joining_one_after_another_hold_even_shares() {
        for (ring, virtual_nodes) in [(16, 2), (48, 2), (96, 2), (48, 3), (48, 4), (96, 4)] {
            let mut points = Vec::new();
            for managers in 1..=6u32 {
                let manager = format!("m{managers}");
                let taken_from = join(ring, &mut points, &manager, virtual_nodes);
                let held = held_by_manager(ring, &points);
                let case = format!(
                    "ring {ring}, {virtual_nodes} virtual nodes, {managers} managers: {held:?}"
                );
                if managers > 2 {
                    assert_ne!(taken_from[0], taken_from[1], "{case}");
                }
                assert_eq!(held.values().sum::<u32>(), ring, "{case}");
                // At most half again an even share (a manager whose virtual nodes take from
                // two others cannot even out three), and a joiner at least half of one.
                let most = *held.values().max().unwrap();
                assert!(2 * most * managers <= 3 * ring + 2 * managers, "{case}");
                assert!(2 * held[&manager] * managers >= ring, "{case}");
            }
        }
        // Three managers on a ring that three divides hold a third each; on 16, 6 at most
        // (the middle of the longest range gave 6, 6 and 4 of 16, 18, 18 and 12 of 48).
        for (ring, even) in [(48, 16), (96, 32)] {
            let mut points = Vec::new();
            for manager in ["m1", "m2", "m3"] {
                join(ring, &mut points, manager, 2);
            }
            let held = held_by_manager(ring, &points);
            assert!(held.values().all(|held| *held == even), "{held:?}");
        }
        let mut points = Vec::new();
        for manager in ["m1", "m2", "m3"] {
            join(16, &mut points, manager, 2);
        }
        let held = held_by_manager(16, &points);
        assert!(held.values().all(|held| (5..=6).contains(held)), "{held:?}");
    }

    #[test]
    fn a_dead_managers_ranges_go_to_the_points_before_them() {
        let ring = 16;
        let mut points = Vec::new();
        for manager in ["m1", "m2", "m3"] {
            join(ring, &mut points, manager, 2);
        }
        points.retain(|point| point.manager != "m2");
        let owners: Vec<&str> = (0..ring)
            .map(|shard| owner_of(shard, &points).unwrap().manager.as_str())
            .collect();
        assert!(owners.iter().all(|owner| *owner != "m2"));
        assert!(owners.contains(&"m1") && owners.contains(&"m3"));
    }

    #[test]
    fn a_ring_divided_to_single_shards_takes_no_more_points() {
        let points: Vec<Point> = (0..4).map(|n| point(n, "a", n + 1)).collect();
        assert_eq!(pick_point(4, &points, "b", &[], 1), None);
    }

    #[test]
    fn shards_read_as_ranges() {
        assert_eq!(format_shards(&[0, 1, 2, 3, 8, 10, 11]), "0-3, 8, 10-11");
        assert_eq!(format_shards(&[]), "-");
    }

    #[test]
    fn the_view_groups_virtual_nodes_by_manager_and_names_unowned_shards() {
        let wrapping = vec![point(2, "a", 1), point(12, "b", 1)];
        let view = ShardsView::from_ring(16, &wrapping, &[]);
        assert_eq!(
            view.managers[1].virtual_nodes[0].range,
            vec![0, 1, 12, 13, 14, 15]
        );
        let points = vec![point(0, "a", 1), point(8, "b", 1)];
        let mut holders: Vec<Option<String>> = (0..16)
            .map(|shard| Some(if shard < 8 { "a/1" } else { "b/1" }.to_string()))
            .collect();
        holders[9] = None;
        let view = ShardsView::from_ring(16, &points, &holders);
        assert_eq!(view.managers.len(), 2);
        assert_eq!(view.managers[0].shards, (0..8).collect::<Vec<_>>());
        assert_eq!(view.managers[1].virtual_nodes[0].range.len(), 8);
        assert_eq!(view.unowned, vec![9]);
        assert_eq!(view.holder(3), Some("a"));
        assert_eq!(view.holder(9), None);
        let alone = ShardsView::alone("m", 16);
        assert_eq!(alone.managers[0].shards.len(), 16);
        assert!(alone.unowned.is_empty());
    }

    #[test]
    fn a_scope_holds_the_projects_of_its_shards_and_no_other() {
        let ring = 16;
        let whole = ShardScope::all(ring);
        assert!(whole.is_whole());
        let projects: Vec<String> = (0..200).map(|n| format!("team-{n}")).collect();
        assert!(projects.iter().all(|project| whole.holds_project(project)));

        let low = ShardScope::of(ring, 0..8);
        let high = ShardScope::of(ring, 8..16);
        assert!(!low.is_whole() && !high.is_whole());
        for project in &projects {
            // Every project is in exactly one of two scopes that divide the ring.
            assert_ne!(
                low.holds_project(project),
                high.holds_project(project),
                "{project}"
            );
            assert_eq!(
                low.holds_project(project),
                shard_of(project, ring) < 8,
                "{project}"
            );
        }
        assert_eq!(low.shards(), (0..8).collect::<Vec<u32>>());
        // A shard past the ring's end is none of its.
        assert_eq!(ShardScope::of(ring, [3, 99]).shards(), vec![3]);
        assert!(!ShardScope::of(ring, []).holds_project("default"));
        // A record naming no project is default's.
        let of_default = ShardScope::of(ring, [shard_of("default", ring)]);
        assert!(of_default.holds_project("") && of_default.holds_project("default"));
    }
}
