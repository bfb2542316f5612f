//! Sampled E-PVM: the paper's marginal cost (see [`crate::epvm`]), scored on a bounded sample
//! of the feasible nodes instead of all of them, as Nomad's scheduler does.
//!
//! Nomad shuffles the nodes, walks them through its feasibility checks and lets a limit
//! iterator stop the walk after `max(2, ⌈log2 n⌉)` feasible nodes, of which the best-ranked
//! wins. Here one placement walks the nodes in a pseudo-random cyclic order (a random start
//! and a random stride coprime with the node count, so every node is met at most once), skips
//! the nodes the filters refuse, stops after `K` feasible ones, and picks the cheapest of those.
//! A placement then costs about `K` cost evaluations plus the refused nodes it stepped over,
//! whatever the size of the cluster.
//!
//! The walk is drawn from a seeded [`SplitMix64`] held in the scheduler, advanced once per
//! placement, so the same snapshot and the same scheduler state still give the same decision.
//!
//! What the sample changes, besides which nodes are scored:
//! - The paper's `n` is the number of live nodes, which only a pass over every node can count.
//!   When the walk met every node (fewer than `K` fit) it is exactly that; otherwise it is
//!   every node in the snapshot, ready or not. The two differ only by the nodes that are down.
//! - `max_jobs` is raised to cover the busiest node the walk met, not the busiest node of all.
//!
//! So when the walk meets every node, the decision is exactly exhaustive E-PVM's.

use crate::epvm::{CostModel, JobCostTable, SizeClasses, marginal_costs, max_jobs_after};
use crate::filter::FilterChain;
use crate::rng::SplitMix64;
use crate::view::{NodeView, TaskRequest};
use crate::{Decision, Rejection, Scheduler, debug_assert_sorted_by_name, lowest_score};

/// The seed of a scheduler made with [`EpvmSampled::new`]. Any fixed value would do; a manager
/// that wants a different sequence passes its own to [`EpvmSampled::with_seed`].
pub const DEFAULT_SEED: u64 = 0x0C0B_E5EE_D5A3_91ED;

/// The number of feasible nodes a placement scores when none was set: `4 · ⌈log2 n⌉`, at
/// least 8; 40 of 1,000 nodes, 56 of 10,000.
///
/// Nomad scores `max(2, ⌈log2 n⌉)`. Measured with the `throughput` bench (1,000,000 mixed
/// placements, three seeds at 1,000 nodes, one at 10,000), the standard deviation of memory
/// utilisation it leaves is above exhaustive E-PVM's by 23–30 % at 1,000 nodes and 5 % at
/// 10,000 with `⌈log2 n⌉` nodes, by 2–5 % with twice that, and by under 1.5 % with four
/// times that, which still costs only microseconds a placement.
pub fn default_sample_size(node_count: usize) -> usize {
    let log2_ceiling = node_count
        .checked_next_power_of_two()
        .map_or(usize::BITS, usize::trailing_zeros) as usize;
    (4 * log2_ceiling).max(8)
}

/// Places each task on the cheapest of a bounded, pseudo-random sample of the feasible nodes.
pub struct EpvmSampled {
    filters: FilterChain,
    /// The paper's `max_jobs`, kept as [`crate::Epvm`] keeps it, except that it is raised to
    /// cover only the nodes a placement's walk met.
    max_jobs: usize,
    /// Job-term costs for the current base and `max_jobs`, as in [`crate::Epvm`].
    job_costs: JobCostTable,
    /// Where each placement's walk starts and how it steps; advanced once per placement, by
    /// [`Scheduler::place`] or by [`Scheduler::pick`].
    rng: SplitMix64,
    /// How many feasible nodes a placement scores at most; `None` for
    /// [`default_sample_size`] of the snapshot's node count.
    sample_size: Option<usize>,
    /// The sampled indices and their costs, kept between placements only so that a placement
    /// does not allocate; their contents never outlive one placement.
    sample: Vec<usize>,
    scores: Vec<(usize, f64)>,
}

impl EpvmSampled {
    /// A sampled E-PVM scheduler seeded with [`DEFAULT_SEED`], scoring
    /// [`default_sample_size`] nodes.
    pub fn new() -> EpvmSampled {
        EpvmSampled::with_seed(DEFAULT_SEED)
    }

    /// The same, seeded with `seed`.
    pub fn with_seed(seed: u64) -> EpvmSampled {
        EpvmSampled {
            filters: FilterChain::standard(),
            max_jobs: 1,
            job_costs: JobCostTable::default(),
            rng: SplitMix64::new(seed),
            sample_size: None,
            sample: Vec::new(),
            scores: Vec::new(),
        }
    }

    /// The same scheduler, scoring at most `sample_size` feasible nodes (at least 1) whatever
    /// the size of the cluster.
    pub fn with_sample_size(mut self, sample_size: usize) -> EpvmSampled {
        self.sample_size = Some(sample_size.max(1));
        self
    }

    /// The current `max_jobs`.
    pub fn max_jobs(&self) -> usize {
        self.max_jobs
    }

    /// How many feasible nodes a placement over `node_count` nodes scores at most.
    pub fn sample_size(&self, node_count: usize) -> usize {
        self.sample_size
            .unwrap_or_else(|| default_sample_size(node_count))
            .max(1)
    }

    /// Walks the nodes from `start`, pushing the index of each feasible node onto `sample`
    /// until it holds [`EpvmSampled::sample_size`] of them or every node has been met, and
    /// handing the index of each refused node to `refused`.
    fn walk(
        &self,
        start: WalkStart,
        task: &TaskRequest,
        nodes: &[NodeView],
        sample: &mut Vec<usize>,
        mut refused: impl FnMut(usize),
    ) -> Walked {
        let limit = self.sample_size(nodes.len());
        let mut walked = Walked::default();
        let mut index = start.offset;
        for met in 1..=nodes.len() {
            let node = &nodes[index];
            walked.live += usize::from(node.ready);
            walked.most_tasks = walked.most_tasks.max(node.task_count);
            if self.filters.admits(task, node) {
                sample.push(index);
                if sample.len() == limit {
                    walked.met_every_node = met == nodes.len();
                    return walked;
                }
            } else {
                refused(index);
            }
            index = start.step(index, nodes.len());
        }
        walked.met_every_node = true;
        walked
    }

    /// The walk [`Scheduler::place`] would take now, without advancing the generator: what
    /// the phases before the pick work from.
    fn peek_walk(
        &self,
        task: &TaskRequest,
        nodes: &[NodeView],
        sample: &mut Vec<usize>,
        refused: impl FnMut(usize),
    ) -> Walked {
        let start = WalkStart::draw(&mut self.rng.clone(), nodes.len());
        self.walk(start, task, nodes, sample, refused)
    }
}

impl Default for EpvmSampled {
    fn default() -> EpvmSampled {
        EpvmSampled::new()
    }
}

impl Scheduler for EpvmSampled {
    fn name(&self) -> &'static str {
        "epvm-sampled"
    }

    /// The sample: the feasible nodes the walk met, in the order it met them, and a reason for
    /// each node it met and refused, in name order. When nothing fits, the walk has met every
    /// node, so every node has its reason.
    fn select_candidate_nodes(
        &self,
        task: &TaskRequest,
        nodes: &[NodeView],
    ) -> (Vec<usize>, Vec<Rejection>) {
        let mut sample = Vec::new();
        let mut refused = Vec::new();
        self.peek_walk(task, nodes, &mut sample, |index| refused.push(index));
        refused.sort_unstable();
        let reasons = refused
            .into_iter()
            .map(|index| self.filters.rejection(task, &nodes[index]))
            .collect();
        (sample, reasons)
    }

    /// The marginal cost of the task on each candidate, with the cost model of the walk
    /// [`Scheduler::place`] would take (the walk is repeated: it is short, and the same draw
    /// gives the same walk).
    fn score(
        &self,
        task: &TaskRequest,
        nodes: &[NodeView],
        candidates: &[usize],
    ) -> Vec<(usize, f64)> {
        let walked = self.peek_walk(task, nodes, &mut Vec::new(), |_| {});
        let model = walked.cost_model(nodes.len(), self.max_jobs);
        marginal_costs(&model, task, nodes, candidates)
    }

    /// The least marginal cost, ties to the name that sorts first; then the generator moves
    /// on to the next placement's walk.
    fn pick(
        &mut self,
        task: &TaskRequest,
        nodes: &[NodeView],
        scores: &[(usize, f64)],
    ) -> Option<usize> {
        let walked = self.peek_walk(task, nodes, &mut Vec::new(), |_| {});
        let model = walked.cost_model(nodes.len(), self.max_jobs);
        WalkStart::draw(&mut self.rng, nodes.len());
        let chosen = lowest_score(nodes, scores);
        self.max_jobs = max_jobs_after(model.max_jobs, chosen.map(|index| &nodes[index]));
        chosen
    }

    /// The phases in one walk and no allocation once the buffers have grown: walk, cost the
    /// sample with the cached growth and job terms, pick. Reasons are built only when nothing
    /// fits, which means the walk met (and refused) every node.
    fn place(&mut self, task: &TaskRequest, nodes: &[NodeView]) -> Decision {
        debug_assert_sorted_by_name(nodes);
        let start = WalkStart::draw(&mut self.rng, nodes.len());
        let mut sample = std::mem::take(&mut self.sample);
        let mut scores = std::mem::take(&mut self.scores);
        sample.clear();
        scores.clear();
        let walked = self.walk(start, task, nodes, &mut sample, |_| {});
        let model = walked.cost_model(nodes.len(), self.max_jobs);
        self.job_costs.prepare(&model);
        let mut sizes = SizeClasses::default();
        scores.extend(sample.iter().map(|&index| {
            let node = &nodes[index];
            let growth = sizes
                .class(&model, node.capacity.memory, task.memory)
                .growth;
            let cost = model.memory_cost(node, task, growth)
                + self.job_costs.cost(&model, node.task_count);
            (index, cost)
        }));
        let chosen = lowest_score(nodes, &scores);
        self.max_jobs = max_jobs_after(model.max_jobs, chosen.map(|index| &nodes[index]));
        self.sample = sample;
        self.scores = scores;
        match chosen {
            Some(index) => Decision::Placed {
                index,
                name: nodes[index].name.clone(),
            },
            None => Decision::NoFit {
                reasons: self.filters.rejections(task, nodes),
            },
        }
    }
}

/// Where one placement's walk starts and how far it steps. With the stride coprime with the
/// node count, `node_count` steps meet every node exactly once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WalkStart {
    offset: usize,
    stride: usize,
}

impl WalkStart {
    /// Two draws: a start among the nodes and a stride in `1..node_count` coprime with it
    /// (1 for fewer than three nodes).
    fn draw(rng: &mut SplitMix64, node_count: usize) -> WalkStart {
        let offset = rng.below(node_count);
        let stride = 1 + rng.below(node_count.saturating_sub(1));
        WalkStart {
            offset,
            stride: coprime_stride(stride, node_count),
        }
    }

    /// The index after `index` on a walk over `node_count` nodes.
    fn step(&self, index: usize, node_count: usize) -> usize {
        // `index + stride` could overflow only for slices longer than memory holds; the
        // remainder keeps it in range.
        (index + self.stride) % node_count
    }
}

/// `stride` if it is coprime with `node_count`, otherwise the next one up that is, wrapping
/// from `node_count - 1` to 1 (which always is). For `node_count` below 2, 1.
fn coprime_stride(mut stride: usize, node_count: usize) -> usize {
    if node_count < 2 {
        return 1;
    }
    while greatest_common_divisor(stride, node_count) != 1 {
        stride = stride % (node_count - 1) + 1;
    }
    stride
}

fn greatest_common_divisor(mut left: usize, mut right: usize) -> usize {
    while right != 0 {
        (left, right) = (right, left % right);
    }
    left
}

/// What a walk saw of the nodes it met, for the cost model.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Walked {
    /// The walk met every node: it found fewer feasible ones than it may score.
    met_every_node: bool,
    /// Ready nodes among those it met.
    live: usize,
    /// The most tasks on a node it met.
    most_tasks: usize,
}

impl Walked {
    /// The paper's model with `n` the live nodes when the walk met them all, and otherwise
    /// all `node_count` nodes (see the module's doc).
    fn cost_model(&self, node_count: usize, max_jobs_so_far: usize) -> CostModel {
        let live = if self.met_every_node {
            self.live
        } else {
            node_count
        };
        CostModel::new(live, self.most_tasks, max_jobs_so_far)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use cube_types::Resources;

    use super::*;
    use crate::{Epvm, place_in_phases};

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    /// Nodes of 4 GiB named `w000`…, with `memory_allocated[i]` allocated on the i-th.
    fn cluster(memory_allocated: &[u64]) -> Vec<NodeView> {
        memory_allocated
            .iter()
            .enumerate()
            .map(|(index, &allocated)| NodeView {
                name: format!("w{index:03}"),
                ready: true,
                ineligible: false,
                capacity: Resources {
                    cpu: 8.0,
                    memory: 4 * GIB,
                    disk: 0,
                },
                allocated: Resources {
                    cpu: 0.0,
                    memory: allocated,
                    disk: 0,
                },
                task_count: 0,
                host_ports_taken: BTreeSet::new(),
                labels: Default::default(),
                host_policy: None,
            })
            .collect()
    }

    fn memory_request(memory: u64) -> TaskRequest {
        TaskRequest {
            memory,
            ..TaskRequest::default()
        }
    }

    fn placements(
        scheduler: &mut dyn Scheduler,
        mut nodes: Vec<NodeView>,
        rounds: u64,
    ) -> Vec<Decision> {
        (0..rounds)
            .map(|round| {
                let task = memory_request((1 + round % 4) * 128 * MIB);
                let decision = scheduler.place(&task, &nodes);
                if let Decision::Placed { index, .. } = decision {
                    nodes[index].add_task(&task);
                }
                decision
            })
            .collect()
    }

    #[test]
    fn the_same_seed_makes_the_same_decisions() {
        let nodes = cluster(&[0; 50]);
        let first = placements(&mut EpvmSampled::with_seed(9), nodes.clone(), 100);
        let again = placements(&mut EpvmSampled::with_seed(9), nodes.clone(), 100);
        assert_eq!(first, again);
        let other_seed = placements(&mut EpvmSampled::with_seed(10), nodes, 100);
        assert_ne!(first, other_seed, "another seed samples other nodes");
    }

    #[test]
    fn the_cheapest_node_of_the_sample_is_picked() {
        // 64 nodes with distinct allocations, so every cost differs. Whatever the sample, the
        // chosen node must be the cheapest of the sample the phases show.
        let allocations: Vec<u64> = (0..64).map(|index| (index * 37 % 64) * 32 * MIB).collect();
        let nodes = cluster(&allocations);
        let task = memory_request(256 * MIB);
        let mut scheduler = EpvmSampled::with_seed(3).with_sample_size(5);
        for _ in 0..20 {
            let (sample, _) = scheduler.select_candidate_nodes(&task, &nodes);
            assert_eq!(sample.len(), 5);
            let scores = scheduler.score(&task, &nodes, &sample);
            let cheapest = scores
                .iter()
                .min_by(|left, right| left.1.total_cmp(&right.1))
                .map(|&(index, _)| index);
            match scheduler.place(&task, &nodes) {
                Decision::Placed { index, .. } => assert_eq!(Some(index), cheapest),
                Decision::NoFit { reasons } => panic!("not placed: {reasons:?}"),
            }
        }
    }

    #[test]
    fn a_sample_as_large_as_the_cluster_decides_what_exhaustive_epvm_decides() {
        let allocations: Vec<u64> = (0..30).map(|index| (index * 7 % 30) * 64 * MIB).collect();
        let mut nodes = cluster(&allocations);
        nodes[4].ready = false;
        nodes[11].capacity.memory = 2 * GIB;
        nodes[17].task_count = 3;
        let mut sampled = EpvmSampled::with_seed(5).with_sample_size(nodes.len());
        let decisions = placements(&mut sampled, nodes.clone(), 400);
        assert_eq!(decisions, placements(&mut Epvm::new(), nodes, 400));
        assert!(
            decisions
                .iter()
                .any(|d| matches!(d, Decision::NoFit { .. })),
            "the stream fills the cluster, so the end is compared too"
        );
    }

    #[test]
    fn nothing_fits_gives_no_fit_with_every_reason_in_name_order() {
        let mut nodes = cluster(&[3 * GIB, 4 * GIB, 0]);
        nodes[2].ready = false;
        let task = memory_request(2 * GIB);
        let mut scheduler = EpvmSampled::new().with_sample_size(1);
        let expected = "w000: needs 2.0 GiB memory, 1.0 GiB free; \
                        w001: needs 2.0 GiB memory, 0 B free; w002: node is not Ready";
        let (candidates, reasons) = scheduler.select_candidate_nodes(&task, &nodes);
        assert!(candidates.is_empty());
        assert_eq!(crate::describe_rejections(&reasons), expected);
        assert_eq!(scheduler.place(&task, &nodes).to_string(), expected);
    }

    #[test]
    fn the_phases_decide_what_the_single_walk_decides() {
        let allocations: Vec<u64> = (0..40).map(|index| (index * 11 % 40) * 96 * MIB).collect();
        let mut walking_nodes = cluster(&allocations);
        let mut phased_nodes = walking_nodes.clone();
        let mut walking = EpvmSampled::with_seed(1).with_sample_size(4);
        let mut phased = EpvmSampled::with_seed(1).with_sample_size(4);
        for round in 0..300 {
            let task = memory_request((round % 5) * 128 * MIB);
            let decision = walking.place(&task, &walking_nodes);
            assert_eq!(decision, place_in_phases(&mut phased, &task, &phased_nodes));
            assert_eq!(walking.max_jobs(), phased.max_jobs());
            if let Decision::Placed { index, .. } = decision {
                walking_nodes[index].add_task(&task);
                phased_nodes[index].add_task(&task);
            }
        }
    }

    #[test]
    fn n_is_every_node_after_a_short_walk_and_the_live_ones_after_a_full_one() {
        // Three empty 4 GiB nodes, one down; a 512 MiB task; max_jobs = 1.
        // A walk stopped after one feasible node has not counted the live ones: n = 3,
        //   3^(0.5/4) − 1 + 3^1 − 3^0 = 0.1472 + 2 = 2.1472.
        // A walk that met every node knows 2 are live: n = 2,
        //   2^(0.5/4) − 1 + 2^1 − 2^0 = 0.0905 + 1 = 1.0905.
        let mut nodes = cluster(&[0, 0, 0]);
        nodes[0].ready = false;
        let task = memory_request(512 * MIB);
        for (sample_size, expected) in [(1, 2.1472), (3, 1.0905)] {
            let scheduler = EpvmSampled::new().with_sample_size(sample_size);
            let (sample, _) = scheduler.select_candidate_nodes(&task, &nodes);
            for (_, cost) in scheduler.score(&task, &nodes, &sample) {
                assert!((cost - expected).abs() < 1e-3, "K = {sample_size}: {cost}");
            }
        }
    }

    #[test]
    fn a_walk_meets_every_node_once() {
        for node_count in [0, 1, 2, 3, 10, 12, 97, 100] {
            let mut rng = SplitMix64::new(node_count as u64);
            for _ in 0..20 {
                let start = WalkStart::draw(&mut rng, node_count);
                let mut met = vec![false; node_count];
                let mut index = start.offset;
                for _ in 0..node_count {
                    assert!(
                        !met[index],
                        "{node_count} nodes, {start:?}: met {index} twice"
                    );
                    met[index] = true;
                    index = start.step(index, node_count);
                }
                assert!(met.iter().all(|&m| m));
            }
        }
    }

    #[test]
    fn the_default_sample_grows_with_the_log_of_the_cluster() {
        assert_eq!(default_sample_size(0), 8);
        assert_eq!(default_sample_size(3), 8);
        assert_eq!(default_sample_size(1_000), 40);
        assert_eq!(default_sample_size(10_000), 56);
        assert_eq!(default_sample_size(usize::MAX), 4 * usize::BITS as usize);
        assert_eq!(EpvmSampled::new().with_sample_size(0).sample_size(10), 1);
    }
}
