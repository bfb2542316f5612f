//! Cube's scheduler: given a snapshot of the nodes and the resources one task asks for, it
//! decides which node the task goes to, or says for every node why it cannot go there.
//!
//! It decides; it does not act. It does no IO and reads no clock: it never touches the store,
//! never calls a worker and never sleeps. The only randomness is a seeded generator
//! ([`rng::SplitMix64`]) kept in the scheduler's state, so the same snapshot and the same
//! scheduler state always give the same decision. The manager builds the snapshot
//! ([`NodeView`]s, sorted by name), asks for a [`Decision`] and carries it out.
//!
//! A placement has the book's three phases ([`Scheduler`]): feasibility, a chain of small
//! filters ([`filter`]); scoring, where lower is better; and the pick. Three schedulers exist:
//! [`RoundRobin`], [`Epvm`] (the paper's marginal-cost rule over every node) and
//! [`EpvmSampled`] (the same rule over a bounded pseudo-random sample of the feasible nodes,
//! for large clusters). `cargo bench -p cube-scheduler --bench throughput` measures their
//! placements per second and the balance they leave.

use std::fmt;

pub mod epvm;
pub mod epvm_sampled;
pub mod explain;
pub mod filter;
pub mod rng;
pub mod round_robin;
pub mod view;

pub use epvm::Epvm;
pub use epvm_sampled::EpvmSampled;
pub use explain::{fits_no_node_today, summarize_rejections};
pub use filter::{Filter, FilterChain};
pub use round_robin::RoundRobin;
pub use view::{NodeView, TaskRequest};

/// Why one node cannot take a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub node: String,
    /// A short phrase: "needs 2.0 GiB memory, 1.1 GiB free", "port 7777 taken".
    pub reason: String,
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.node, self.reason)
    }
}

/// What the scheduler decided for one task. No node fitting is an outcome, not an error: the
/// task waits with the reasons.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Place the task on `nodes[index]`, the node called `name`.
    Placed { index: usize, name: String },
    /// No node can take the task; one reason per node (empty when there are no nodes).
    NoFit { reasons: Vec<Rejection> },
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decision::Placed { name, .. } => write!(f, "placed on {name}"),
            Decision::NoFit { reasons } => f.write_str(&describe_rejections(reasons)),
        }
    }
}

/// The reasons no node fits, one phrase per node:
/// `"w1: needs 2.0 GiB memory, 1.1 GiB free; w2: port 7777 taken; w3: node is not Ready"`.
pub fn describe_rejections(reasons: &[Rejection]) -> String {
    if reasons.is_empty() {
        return "no nodes have joined the cluster".to_string();
    }
    reasons
        .iter()
        .map(Rejection::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// A placement policy, in the book's three phases. Every method takes the same `nodes` slice,
/// which the manager must pass **sorted by name, each name once**: round-robin rotates in
/// that order and ties go to the node that sorts first. Debug builds assert it.
pub trait Scheduler: Send {
    /// The name the manager's `--scheduler` flag uses: `"roundrobin"`, `"epvm"` or
    /// `"epvm-sampled"`.
    fn name(&self) -> &'static str;

    /// Feasibility: the indices (into `nodes`) of the nodes that can take the task, and a
    /// reason for each node that cannot. A sampling scheduler ([`EpvmSampled`]) may stop
    /// looking once it has enough candidates, and then gives only the nodes it looked at; but
    /// it never gives a node that cannot take the task, and when it gives none, every node
    /// has its reason.
    fn select_candidate_nodes(
        &self,
        task: &TaskRequest,
        nodes: &[NodeView],
    ) -> (Vec<usize>, Vec<Rejection>);

    /// A score for each candidate index; lower is better.
    fn score(
        &self,
        task: &TaskRequest,
        nodes: &[NodeView],
        candidates: &[usize],
    ) -> Vec<(usize, f64)>;

    /// The chosen index among the scored ones, if any; the scheduler records its choice.
    fn pick(
        &mut self,
        task: &TaskRequest,
        nodes: &[NodeView],
        scores: &[(usize, f64)],
    ) -> Option<usize>;

    /// Decides where the task goes. `nodes` must be sorted by name (see [`Scheduler`]).
    ///
    /// By default the three phases run in order. A scheduler may do the same work in one pass
    /// over the nodes, as long as it decides exactly what the phases would, and leaves the
    /// same state behind.
    fn place(&mut self, task: &TaskRequest, nodes: &[NodeView]) -> Decision {
        place_in_phases(self, task, nodes)
    }
}

/// The names [`scheduler_by_name`] knows.
pub const SCHEDULER_NAMES: [&str; 3] = ["roundrobin", "epvm", "epvm-sampled"];

/// The scheduler called `name` (one of [`SCHEDULER_NAMES`]), fresh. `"epvm-sampled"` is seeded
/// with [`epvm_sampled::DEFAULT_SEED`] and scores [`epvm_sampled::default_sample_size`] nodes.
pub fn scheduler_by_name(name: &str) -> Option<Box<dyn Scheduler>> {
    match name {
        "epvm" => Some(Box::new(Epvm::new())),
        "epvm-sampled" => Some(Box::new(EpvmSampled::new())),
        "roundrobin" => Some(Box::new(RoundRobin::new())),
        _ => None,
    }
}

/// Feasibility, scoring and the pick, one after the other: what [`Scheduler::place`] does by
/// default, and what a scheduler's faster single pass must agree with (the property test
/// checks it).
pub fn place_in_phases<S: Scheduler + ?Sized>(
    scheduler: &mut S,
    task: &TaskRequest,
    nodes: &[NodeView],
) -> Decision {
    debug_assert_sorted_by_name(nodes);
    let (candidates, reasons) = scheduler.select_candidate_nodes(task, nodes);
    let scores = scheduler.score(task, nodes, &candidates);
    match scheduler.pick(task, nodes, &scores) {
        Some(index) => Decision::Placed {
            index,
            name: nodes[index].name.clone(),
        },
        None => Decision::NoFit { reasons },
    }
}

/// The scored index with the lowest score; on a tie, the node whose name sorts first.
pub(crate) fn lowest_score(nodes: &[NodeView], scores: &[(usize, f64)]) -> Option<usize> {
    scores
        .iter()
        .min_by(|(left, left_score), (right, right_score)| {
            left_score
                .total_cmp(right_score)
                .then_with(|| nodes[*left].name.cmp(&nodes[*right].name))
        })
        .map(|&(index, _)| index)
}

/// The one check of the order every scheduler relies on. Costs a pass over the nodes, so
/// release builds trust the manager.
pub(crate) fn debug_assert_sorted_by_name(nodes: &[NodeView]) {
    debug_assert!(
        nodes.windows(2).all(|pair| pair[0].name < pair[1].name),
        "the scheduler needs nodes sorted by name, each name once"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejection(node: &str, reason: &str) -> Rejection {
        Rejection {
            node: node.into(),
            reason: reason.into(),
        }
    }

    #[test]
    fn rejections_read_as_one_phrase_per_node() {
        let reasons = [
            rejection("w1", "needs 2.0 GiB memory, 1.1 GiB free"),
            rejection("w2", "port 7777 taken"),
            rejection("w3", "node is not Ready"),
        ];
        assert_eq!(
            describe_rejections(&reasons),
            "w1: needs 2.0 GiB memory, 1.1 GiB free; w2: port 7777 taken; w3: node is not Ready"
        );
        assert_eq!(
            Decision::NoFit {
                reasons: reasons.to_vec()
            }
            .to_string(),
            describe_rejections(&reasons)
        );
    }

    #[test]
    fn no_reasons_means_no_nodes_have_joined() {
        assert_eq!(describe_rejections(&[]), "no nodes have joined the cluster");
    }

    #[test]
    fn schedulers_are_found_by_their_flag_names() {
        for name in SCHEDULER_NAMES {
            let scheduler = scheduler_by_name(name);
            assert_eq!(scheduler.map(|s| s.name()), Some(name));
        }
        assert!(scheduler_by_name("random").is_none());
    }

    #[test]
    fn every_scheduler_places_nothing_on_an_empty_cluster() {
        for name in SCHEDULER_NAMES {
            let mut scheduler = scheduler_by_name(name).expect("a known scheduler");
            let decision = scheduler.place(&TaskRequest::default(), &[]);
            assert_eq!(decision, Decision::NoFit { reasons: vec![] }, "{name}");
            assert_eq!(decision.to_string(), "no nodes have joined the cluster");
        }
    }

    #[test]
    fn equal_scores_go_to_the_name_that_sorts_first() {
        let nodes: Vec<NodeView> = ["a", "b", "c"]
            .into_iter()
            .map(|name| NodeView {
                name: name.into(),
                ..NodeView::default()
            })
            .collect();
        assert_eq!(
            lowest_score(&nodes, &[(2, 1.0), (1, 1.0), (0, 3.0)]),
            Some(1)
        );
        assert_eq!(lowest_score(&nodes, &[]), None);
    }
}
