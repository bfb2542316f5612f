//! Round-robin: the book's first scheduler. It walks the nodes in name order and gives each
//! task to the first node that can take it after the node it chose last, wrapping around.

use crate::filter::FilterChain;
use crate::view::{NodeView, TaskRequest};
use crate::{Decision, Rejection, Scheduler, debug_assert_sorted_by_name, lowest_score};

/// Rotates over the nodes in name order, skipping those that cannot take the task.
pub struct RoundRobin {
    filters: FilterChain,
    /// The node chosen last; the next placement starts with the first name after it. A name,
    /// not an index, so that a node joining or leaving does not shift the rotation.
    last_chosen: Option<String>,
}

impl RoundRobin {
    pub fn new() -> RoundRobin {
        RoundRobin {
            filters: FilterChain::standard(),
            last_chosen: None,
        }
    }

    /// The index where the rotation resumes: the first node whose name sorts after the one
    /// chosen last, or the first node when there is none after it (or no choice yet). A binary
    /// search, so `nodes` must be sorted by name.
    fn rotation_start(&self, nodes: &[NodeView]) -> usize {
        let Some(last) = &self.last_chosen else {
            return 0;
        };
        let after_last = nodes.partition_point(|node| node.name.as_str() <= last.as_str());
        if after_last == nodes.len() {
            0
        } else {
            after_last
        }
    }

    fn remember(&mut self, name: &str) {
        // Reuses the string's buffer: one placement, no allocation for the state.
        let last = self.last_chosen.get_or_insert_with(String::new);
        last.clear();
        last.push_str(name);
    }
}

impl Default for RoundRobin {
    fn default() -> RoundRobin {
        RoundRobin::new()
    }
}

impl Scheduler for RoundRobin {
    fn name(&self) -> &'static str {
        "roundrobin"
    }

    fn select_candidate_nodes(
        &self,
        task: &TaskRequest,
        nodes: &[NodeView],
    ) -> (Vec<usize>, Vec<Rejection>) {
        self.filters.select(task, nodes)
    }

    /// How far each candidate lies along the rotation from where it resumes: 0 for the node
    /// right after the last choice, `nodes.len() - 1` for the last choice itself.
    fn score(
        &self,
        _task: &TaskRequest,
        nodes: &[NodeView],
        candidates: &[usize],
    ) -> Vec<(usize, f64)> {
        let start = self.rotation_start(nodes);
        let count = nodes.len();
        candidates
            .iter()
            .map(|&index| (index, ((index + count - start) % count) as f64))
            .collect()
    }

    fn pick(
        &mut self,
        _task: &TaskRequest,
        nodes: &[NodeView],
        scores: &[(usize, f64)],
    ) -> Option<usize> {
        let chosen = lowest_score(nodes, scores)?;
        self.remember(&nodes[chosen].name);
        Some(chosen)
    }

    /// The phases in one walk: from where the rotation resumes, the first node the filters
    /// admit. Usually that is the first node tried, so a placement costs a binary search and a
    /// few filter checks, not a pass over every node. Reasons are built only when none fits.
    fn place(&mut self, task: &TaskRequest, nodes: &[NodeView]) -> Decision {
        debug_assert_sorted_by_name(nodes);
        let start = self.rotation_start(nodes);
        let rotation = (start..nodes.len()).chain(0..start);
        for index in rotation {
            let node = &nodes[index];
            if self.filters.admits(task, node) {
                self.remember(&node.name);
                return Decision::Placed {
                    index,
                    name: node.name.clone(),
                };
            }
        }
        Decision::NoFit {
            reasons: self.filters.rejections(task, nodes),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use cube_types::Resources;

    use super::*;
    use crate::place_in_phases;

    fn nodes(names: &[&str]) -> Vec<NodeView> {
        names
            .iter()
            .map(|name| NodeView {
                name: name.to_string(),
                ready: true,
                ineligible: false,
                capacity: Resources {
                    cpu: 4.0,
                    memory: 4 << 30,
                    disk: 4 << 30,
                },
                allocated: Resources::default(),
                task_count: 0,
                host_ports_taken: BTreeSet::new(),
                labels: Default::default(),
                host_policy: None,
            })
            .collect()
    }

    fn placed_name(decision: Decision) -> String {
        match decision {
            Decision::Placed { name, .. } => name,
            Decision::NoFit { reasons } => panic!("not placed: {reasons:?}"),
        }
    }

    #[test]
    fn six_tasks_on_three_equal_nodes_go_two_to_each_in_name_order() {
        let cluster = nodes(&["w1", "w2", "w3"]);
        let mut scheduler = RoundRobin::new();
        let chosen: Vec<String> = (0..6)
            .map(|_| placed_name(scheduler.place(&TaskRequest::default(), &cluster)))
            .collect();
        assert_eq!(chosen, ["w1", "w2", "w3", "w1", "w2", "w3"]);
    }

    #[test]
    fn a_node_that_cannot_take_the_task_is_skipped() {
        let mut cluster = nodes(&["w1", "w2", "w3"]);
        cluster[1].ready = false;
        let mut scheduler = RoundRobin::new();
        let chosen: Vec<String> = (0..4)
            .map(|_| placed_name(scheduler.place(&TaskRequest::default(), &cluster)))
            .collect();
        assert_eq!(chosen, ["w1", "w3", "w1", "w3"]);
    }

    #[test]
    fn the_rotation_wraps_around_and_survives_the_last_node_leaving() {
        let cluster = nodes(&["w1", "w2", "w3"]);
        let mut scheduler = RoundRobin::new();
        scheduler.remember("w3");
        assert_eq!(
            placed_name(scheduler.place(&TaskRequest::default(), &cluster)),
            "w1"
        );
        // w2 was chosen last and has since left: the rotation resumes with the name after it.
        scheduler.remember("w2");
        let without_w2 = nodes(&["w1", "w3"]);
        assert_eq!(
            placed_name(scheduler.place(&TaskRequest::default(), &without_w2)),
            "w3"
        );
    }

    #[test]
    fn the_only_node_with_room_is_chosen_again() {
        let mut cluster = nodes(&["w1", "w2"]);
        cluster[1].allocated.cpu = 4.0;
        let one_core = TaskRequest {
            cpu: 1.0,
            ..TaskRequest::default()
        };
        let mut scheduler = RoundRobin::new();
        assert_eq!(placed_name(scheduler.place(&one_core, &cluster)), "w1");
        assert_eq!(placed_name(scheduler.place(&one_core, &cluster)), "w1");
    }

    #[test]
    fn no_fit_gives_every_node_its_reason() {
        let mut cluster = nodes(&["w1", "w2"]);
        cluster[0].ready = false;
        cluster[1]
            .host_ports_taken
            .insert(cube_types::HostPort::tcp(7777));
        let web = TaskRequest {
            host_ports: BTreeSet::from([cube_types::HostPort::tcp(7777)]),
            ..TaskRequest::default()
        };
        let decision = RoundRobin::new().place(&web, &cluster);
        assert_eq!(
            decision.to_string(),
            "w1: node is not Ready; w2: port 7777 taken"
        );
    }

    #[test]
    fn the_single_walk_decides_what_the_three_phases_decide() {
        let mut cluster = nodes(&["a", "b", "c", "d"]);
        cluster[2].ready = false;
        let mut walking = RoundRobin::new();
        let mut phased = RoundRobin::new();
        for _ in 0..9 {
            let task = TaskRequest::default();
            assert_eq!(
                walking.place(&task, &cluster),
                place_in_phases(&mut phased, &task, &cluster)
            );
        }
    }
}
