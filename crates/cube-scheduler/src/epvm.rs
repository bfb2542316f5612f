//! E-PVM, as defined by Amir, Awerbuch, Barak, Borgstrom and Keren ("An Opportunity Cost
//! Approach for Job Assignment in a Scalable Computing Cluster", IEEE TPDS 2000).
//!
//! Each resource of a machine costs `n^utilisation`, where `n` is the number of live
//! machines: cheap while the machine is lightly used, steeply dearer as it fills. A job goes to
//! the machine where it adds the least cost. With `mem_m` the memory allocated on machine `m`,
//! `M_m` its memory, `k_m` its jobs and `mem_j` the job's memory, the marginal cost is
//!
//! ```text
//! n^((mem_m + mem_j) / M_m) − n^(mem_m / M_m)  +  n^((k_m + 1) / max_jobs) − n^(k_m / max_jobs)
//! ```
//!
//! The job count stands in for CPU load, as in the paper. `max_jobs` starts at 1 and doubles
//! whenever the chosen machine's count exceeds it.
//!
//! Both terms are computed in the factored form `n^a · (n^b − 1)`, with `n^x = e^(x ln n)` and
//! `n^b − 1` as `expm1`: the same numbers, one exponential fewer, and no cancellation when the
//! job is small next to the machine.

use crate::filter::FilterChain;
use crate::view::{NodeView, TaskRequest};
use crate::{Decision, Rejection, Scheduler, debug_assert_sorted_by_name, lowest_score};

/// Job-term costs are kept in a table while `max_jobs` is at most this; past it (a node with
/// tens of thousands of tasks) each is computed when needed, to the same value.
const JOB_COST_TABLE_LIMIT: usize = 1 << 16;

/// Places each task where it raises the cluster's cost the least.
pub struct Epvm {
    filters: FilterChain,
    /// The paper's `max_jobs`: the job count the job term measures utilisation against.
    /// Starts at 1, doubles when a placement takes a node past it. Before each placement it is
    /// raised to the smallest power of two at or above the largest `task_count` in the
    /// snapshot, so that a manager restarted against busy nodes does not start from 1 (every
    /// job term would then read as far past full until the doublings caught up).
    max_jobs: usize,
    /// The job term for each count `k`, for the base and `max_jobs` it was computed with. Both
    /// change rarely, so a placement usually looks each node's job cost up instead of taking an
    /// exponential.
    job_costs: JobCostTable,
    /// Each node's memory level as last computed, by position in the snapshot. Between two
    /// placements only the chosen node's allocation changes, so a placement usually looks
    /// every other node's level up instead of taking an exponential.
    memory_levels: MemoryLevelCache,
}

impl Epvm {
    pub fn new() -> Epvm {
        Epvm {
            filters: FilterChain::standard(),
            max_jobs: 1,
            job_costs: JobCostTable::default(),
            memory_levels: MemoryLevelCache::default(),
        }
    }

    /// The current `max_jobs`.
    pub fn max_jobs(&self) -> usize {
        self.max_jobs
    }

    fn record_placement(&mut self, max_jobs: usize, chosen: Option<&NodeView>) {
        self.max_jobs = max_jobs_after(max_jobs, chosen);
    }
}

/// `max_jobs` after a placement (or a failed one) that used `max_jobs`: the same, doubled when
/// the chosen node's count now exceeds it. Raising it to cover the snapshot already made it at
/// least the chosen node's old count, so one doubling is always enough.
pub(crate) fn max_jobs_after(max_jobs: usize, chosen: Option<&NodeView>) -> usize {
    match chosen {
        Some(node) if node.task_count + 1 > max_jobs => max_jobs.saturating_mul(2),
        _ => max_jobs,
    }
}

impl Default for Epvm {
    fn default() -> Epvm {
        Epvm::new()
    }
}

impl Scheduler for Epvm {
    fn name(&self) -> &'static str {
        "epvm"
    }

    fn select_candidate_nodes(
        &self,
        task: &TaskRequest,
        nodes: &[NodeView],
    ) -> (Vec<usize>, Vec<Rejection>) {
        self.filters.select(task, nodes)
    }

    /// The marginal cost of the task on each candidate.
    fn score(
        &self,
        task: &TaskRequest,
        nodes: &[NodeView],
        candidates: &[usize],
    ) -> Vec<(usize, f64)> {
        let model = CostModel::for_snapshot(nodes, self.max_jobs);
        marginal_costs(&model, task, nodes, candidates)
    }

    /// The least marginal cost; ties go to the node whose name sorts first.
    fn pick(
        &mut self,
        _task: &TaskRequest,
        nodes: &[NodeView],
        scores: &[(usize, f64)],
    ) -> Option<usize> {
        let chosen = lowest_score(nodes, scores);
        let max_jobs = CostModel::for_snapshot(nodes, self.max_jobs).max_jobs;
        self.record_placement(max_jobs, chosen.map(|index| &nodes[index]));
        chosen
    }

    /// The phases in two passes, allocating nothing once the level cache below has grown to
    /// the cluster: one pass to count live nodes and the busiest node's tasks, one to filter
    /// and cost each node while keeping the cheapest. Nodes come sorted by name, so keeping the
    /// first of equal costs gives ties to the name that sorts first. Reasons are built only
    /// when no node fits.
    ///
    /// A node that a cheaper node of its memory size dominates (see `SizeClass::dominates`)
    /// cannot be the cheapest, so it is skipped before the filters and the costs; in a cluster
    /// of a few node sizes that spares many nodes. The memory levels of the nodes that are
    /// costed come from a `MemoryLevelCache`, which takes an exponential only for the nodes
    /// whose allocation changed since the last placement.
    fn place(&mut self, task: &TaskRequest, nodes: &[NodeView]) -> Decision {
        debug_assert_sorted_by_name(nodes);
        let model = CostModel::for_snapshot(nodes, self.max_jobs);
        self.job_costs.prepare(&model);
        self.memory_levels.prepare(&model, nodes.len());
        let mut sizes = SizeClasses::default();
        let mut cheapest: Option<(usize, f64)> = None;
        for (index, node) in nodes.iter().enumerate() {
            let size = sizes.class(&model, node.capacity.memory, task.memory);
            if size.dominates(node) || !self.filters.admits(task, node) {
                continue;
            }
            let memory = if adds_memory_cost(node, task) {
                self.memory_levels.level(&model, index, node) * size.growth
            } else {
                0.0
            };
            let cost = memory + self.job_costs.cost(&model, node.task_count);
            size.offer(node, cost);
            if cheapest.is_none_or(|(_, best)| cost < best) {
                cheapest = Some((index, cost));
            }
        }
        let chosen = cheapest.map(|(index, _)| index);
        self.record_placement(model.max_jobs, chosen.map(|index| &nodes[index]));
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

/// The marginal cost of the task on each candidate, each computed from scratch: the reference
/// that the faster placements, with their caches, must agree with.
pub(crate) fn marginal_costs(
    model: &CostModel,
    task: &TaskRequest,
    nodes: &[NodeView],
    candidates: &[usize],
) -> Vec<(usize, f64)> {
    candidates
        .iter()
        .map(|&index| {
            let node = &nodes[index];
            let growth = model.memory_growth(node.capacity.memory, task.memory);
            (
                index,
                model.memory_cost(node, task, growth) + model.job_cost(node.task_count),
            )
        })
        .collect()
}

/// The constants of one placement's costs, read from the snapshot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CostModel {
    /// The paper's `n`, the live (ready) nodes, but at least 2: with one node `n^x` would be 1
    /// whatever `x`, every cost 0 and every node tied. That is still correct, since one live
    /// node is the only candidate, but a base of 2 keeps the costs meaningful.
    base: usize,
    /// `ln(base)`, so that `base^x` is `exp(x · ln_base)`.
    ln_base: f64,
    /// The `max_jobs` this placement uses: the scheduler's, raised to cover the snapshot.
    pub(crate) max_jobs: usize,
}

impl CostModel {
    fn for_snapshot(nodes: &[NodeView], max_jobs_so_far: usize) -> CostModel {
        let mut live = 0;
        let mut most_tasks = 0;
        for node in nodes {
            live += usize::from(node.ready);
            most_tasks = most_tasks.max(node.task_count);
        }
        CostModel::new(live, most_tasks, max_jobs_so_far)
    }

    /// The model for `live` ready nodes, the busiest of which has `most_tasks` tasks.
    pub(crate) fn new(live: usize, most_tasks: usize, max_jobs_so_far: usize) -> CostModel {
        let base = live.max(2);
        let covering = most_tasks.checked_next_power_of_two().unwrap_or(usize::MAX);
        CostModel {
            base,
            ln_base: (base as f64).ln(),
            max_jobs: max_jobs_so_far.max(covering).max(1),
        }
    }

    /// `n^(mem_j / M_m) − 1`: how much the task multiplies a node's memory cost by, less one.
    /// Depends on the node only through its memory size. A node with no memory counts as
    /// unused (utilisation 0), which keeps the cost a number.
    pub(crate) fn memory_growth(&self, capacity: u64, request: u64) -> f64 {
        if capacity == 0 {
            return 0.0;
        }
        (self.ln_base * request as f64 / capacity as f64).exp_m1()
    }

    /// The memory term, `n^(mem_m / M_m) · growth`, given the node's growth factor.
    pub(crate) fn memory_cost(&self, node: &NodeView, task: &TaskRequest, growth: f64) -> f64 {
        if !adds_memory_cost(node, task) {
            return 0.0;
        }
        self.memory_level(node.allocated.memory, node.capacity.memory) * growth
    }

    /// `n^(mem_m / M_m)`, the memory level of a node with `capacity` bytes (not 0) of which
    /// `allocated` are allocated.
    fn memory_level(&self, allocated: u64, capacity: u64) -> f64 {
        (self.ln_base * allocated as f64 / capacity as f64).exp()
    }

    /// The job term for a node with `task_count` jobs: `n^(k / max_jobs) · (n^(1 / max_jobs) − 1)`.
    pub(crate) fn job_cost(&self, task_count: usize) -> f64 {
        let max_jobs = self.max_jobs as f64;
        let level = (self.ln_base * task_count as f64 / max_jobs).exp();
        level * (self.ln_base / max_jobs).exp_m1()
    }
}

/// Whether the task has a memory term on the node at all. A task without memory, or a node
/// without any, adds 0 exactly, even on an over-committed node whose level would be infinite.
pub(crate) fn adds_memory_cost(node: &NodeView, task: &TaskRequest) -> bool {
    task.memory != 0 && node.capacity.memory != 0
}

/// [`CostModel::memory_level`] of each node, by its position in the snapshot, kept between
/// placements. An entry is used only when the node's allocation and capacity are the ones it
/// was computed from, so a stale or shifted entry costs a recomputation, never a wrong value:
/// the level is a function of those two numbers and the base alone.
#[derive(Debug, Default)]
struct MemoryLevelCache {
    /// The base the levels were computed with.
    computed_for: Option<usize>,
    entries: Vec<MemoryLevel>,
}

/// One node's memory level and what it was computed from. A capacity of 0 marks an empty
/// entry: such a node has no memory term, so its level is never asked for.
#[derive(Debug, Default, Clone, Copy)]
struct MemoryLevel {
    allocated: u64,
    capacity: u64,
    level: f64,
}

impl MemoryLevelCache {
    /// Forgets every level if the base changed, and makes room for `node_count` nodes.
    fn prepare(&mut self, model: &CostModel, node_count: usize) {
        if self.computed_for != Some(model.base) {
            self.computed_for = Some(model.base);
            self.entries.clear();
        }
        self.entries.resize(node_count, MemoryLevel::default());
    }

    /// The level of `node`, the `index`-th of the snapshot [`MemoryLevelCache::prepare`] was
    /// given the length of.
    fn level(&mut self, model: &CostModel, index: usize, node: &NodeView) -> f64 {
        let (allocated, capacity) = (node.allocated.memory, node.capacity.memory);
        let entry = &mut self.entries[index];
        if entry.capacity != capacity || entry.allocated != allocated {
            *entry = MemoryLevel {
                allocated,
                capacity,
                level: model.memory_level(allocated, capacity),
            };
        }
        entry.level
    }
}

/// What one placement has learnt about the last few memory sizes it met. The nodes of a
/// cluster mostly come in a few sizes, so most nodes find their size here; sizes are replaced
/// in turn when more than fit are met, which costs only a recomputation.
#[derive(Default)]
pub(crate) struct SizeClasses {
    /// The first `held` are in use.
    classes: [SizeClass; SIZE_CLASSES],
    held: usize,
    /// The slot the next size met goes to: the free ones first, then the oldest.
    next_replaced: usize,
}

/// How many memory sizes a [`SizeClasses`] holds.
const SIZE_CLASSES: usize = 4;

/// One memory size, in one placement.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SizeClass {
    capacity: u64,
    /// [`CostModel::memory_growth`] of the task on a node of this size.
    pub(crate) growth: f64,
    /// The cheapest node of this size costed so far: its allocated memory, task count and
    /// cost.
    cheapest: Option<(u64, usize, f64)>,
}

impl SizeClasses {
    /// The class of the nodes with `capacity` bytes of memory, met now if it is not held.
    pub(crate) fn class(
        &mut self,
        model: &CostModel,
        capacity: u64,
        request: u64,
    ) -> &mut SizeClass {
        let held = self.classes[..self.held]
            .iter()
            .position(|class| class.capacity == capacity);
        let slot = held.unwrap_or_else(|| {
            let slot = self.next_replaced;
            self.next_replaced = (slot + 1) % SIZE_CLASSES;
            self.held = (self.held + 1).min(SIZE_CLASSES);
            self.classes[slot] = SizeClass {
                capacity,
                growth: model.memory_growth(capacity, request),
                cheapest: None,
            };
            slot
        });
        &mut self.classes[slot]
    }
}

impl SizeClass {
    /// Whether `node`, of this size, costs at least as much as the cheapest node of this size
    /// costed so far, whatever the task: it has at least as much memory allocated and at least
    /// as many tasks. Both terms only grow with allocation and count (the floating-point steps
    /// are monotonic too), so such a node cannot be strictly cheaper than that one, which is
    /// no cheaper than the cheapest node so far, and a tie goes to the node found first.
    /// Whether the node passes the filters does not matter: either way it cannot be chosen.
    fn dominates(&self, node: &NodeView) -> bool {
        self.cheapest.is_some_and(|(allocated, task_count, _)| {
            node.allocated.memory >= allocated && node.task_count >= task_count
        })
    }

    /// Keeps `node` as the class's cheapest if it is.
    fn offer(&mut self, node: &NodeView, cost: f64) {
        if self.cheapest.is_none_or(|(_, _, cheapest)| cost < cheapest) {
            self.cheapest = Some((node.allocated.memory, node.task_count, cost));
        }
    }
}

/// [`CostModel::job_cost`] for every count up to `max_jobs`, kept between placements.
#[derive(Debug, Default)]
pub(crate) struct JobCostTable {
    /// The base and `max_jobs` the costs were computed for.
    computed_for: Option<(usize, usize)>,
    costs: Vec<f64>,
}

impl JobCostTable {
    /// Recomputes the table if the model's base or `max_jobs` changed since it was filled.
    pub(crate) fn prepare(&mut self, model: &CostModel) {
        let key = (model.base, model.max_jobs);
        if self.computed_for == Some(key) {
            return;
        }
        self.computed_for = Some(key);
        self.costs.clear();
        if model.max_jobs <= JOB_COST_TABLE_LIMIT {
            // Raising `max_jobs` to cover the snapshot means no node has more tasks than this.
            self.costs
                .extend((0..=model.max_jobs).map(|count| model.job_cost(count)));
        }
    }

    /// The job term for `task_count`, from the table when it holds it.
    pub(crate) fn cost(&self, model: &CostModel, task_count: usize) -> f64 {
        match self.costs.get(task_count) {
            Some(&cost) => cost,
            None => model.job_cost(task_count),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use cube_types::Resources;

    use super::*;
    use crate::place_in_phases;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    fn node(name: &str, memory_allocated: u64, task_count: usize) -> NodeView {
        NodeView {
            name: name.into(),
            ready: true,
            ineligible: false,
            capacity: Resources {
                cpu: 8.0,
                memory: 4 * GIB,
                disk: 0,
            },
            allocated: Resources {
                cpu: 0.0,
                memory: memory_allocated,
                disk: 0,
            },
            task_count,
            host_ports_taken: BTreeSet::new(),
            labels: Default::default(),
            host_policy: None,
        }
    }

    fn memory_request(memory: u64) -> TaskRequest {
        TaskRequest {
            memory,
            ..TaskRequest::default()
        }
    }

    fn placed_name(decision: Decision) -> String {
        match decision {
            Decision::Placed { name, .. } => name,
            Decision::NoFit { reasons } => panic!("not placed: {reasons:?}"),
        }
    }

    fn scores(scheduler: &Epvm, task: &TaskRequest, nodes: &[NodeView]) -> Vec<f64> {
        let (candidates, _) = scheduler.select_candidate_nodes(task, nodes);
        scheduler
            .score(task, nodes, &candidates)
            .into_iter()
            .map(|(_, score)| score)
            .collect()
    }

    fn assert_close(actual: f64, expected: f64) {
        assert!(
            (actual - expected).abs() < 1e-3,
            "{actual} is not {expected}"
        );
    }

    #[test]
    fn a_task_does_not_go_to_the_node_whose_memory_is_nearly_full() {
        // n = 3 live nodes of 4 GiB; the busiest has 1 task, so max_jobs = 1. A 512 MiB task
        // is 1/8 of a node.
        // w1 (3 GiB, 1 task): 3^(3.5/4) − 3^(3/4) = 2.6150 − 2.2795 = 0.3355
        //                     + 3^(2/1) − 3^(1/1) = 9 − 3 = 6          → 6.3355
        // w2, w3 (empty):     3^(0.5/4) − 3^0 = 1.1472 − 1 = 0.1472
        //                     + 3^(1/1) − 3^0 = 3 − 1 = 2               → 2.1472, a tie: w2
        let cluster = [node("w1", 3 * GIB, 1), node("w2", 0, 0), node("w3", 0, 0)];
        let task = memory_request(512 * MIB);
        let mut scheduler = Epvm::new();
        let costs = scores(&scheduler, &task, &cluster);
        assert_close(costs[0], 6.3355);
        assert_close(costs[1], 2.1472);
        assert_close(costs[2], 2.1472);
        assert_eq!(placed_name(scheduler.place(&task, &cluster)), "w2");
    }

    #[test]
    fn with_equal_job_counts_the_emptier_memory_wins() {
        // n = 3, every node has 2 tasks, so max_jobs = 2 and the job terms are equal.
        // memory terms for 512 MiB: w1 (3 GiB) 0.3355; w2 (1 GiB) 3^(1.5/4) − 3^(1/4) =
        // 1.5098 − 1.3161 = 0.1937; w3 (2 GiB) 3^(2.5/4) − 3^(2/4) = 1.9870 − 1.7321 = 0.2549.
        let cluster = [
            node("w1", 3 * GIB, 2),
            node("w2", GIB, 2),
            node("w3", 2 * GIB, 2),
        ];
        let task = memory_request(512 * MIB);
        let mut scheduler = Epvm::new();
        let costs = scores(&scheduler, &task, &cluster);
        let job_term = 3f64.powf(1.5) - 3.0;
        assert_close(costs[0], 0.3355 + job_term);
        assert_close(costs[1], 0.1937 + job_term);
        assert_close(costs[2], 0.2549 + job_term);
        assert_eq!(placed_name(scheduler.place(&task, &cluster)), "w2");
    }

    #[test]
    fn fewer_jobs_can_outweigh_fuller_memory() {
        // n = 3, the busiest nodes have 2 tasks, so max_jobs = 2.
        // w1 (3 GiB, 1 task):  0.3355 + 3^(2/2) − 3^(1/2) = 0.3355 + 1.2679 = 1.6034
        // w2, w3 (0, 2 tasks): 0.1472 + 3^(3/2) − 3^(2/2) = 0.1472 + 2.1962 = 2.3434
        let cluster = [node("w1", 3 * GIB, 1), node("w2", 0, 2), node("w3", 0, 2)];
        let task = memory_request(512 * MIB);
        let mut scheduler = Epvm::new();
        let costs = scores(&scheduler, &task, &cluster);
        assert_close(costs[0], 1.6034);
        assert_close(costs[1], 2.3434);
        assert_eq!(placed_name(scheduler.place(&task, &cluster)), "w1");
    }

    #[test]
    fn the_job_term_spreads_tasks_over_an_empty_cluster() {
        // n = 3, max_jobs = 1, 512 MiB tasks on 4 GiB nodes.
        // 1st: all tie at 0.1472 + (3 − 1) = 2.1472                         → w1
        // 2nd: w1 costs 3^(1/4) − 3^(1/8) + 3^2 − 3^1 = 0.1689 + 6 = 6.1689,
        //      w2 and w3 still 2.1472                                       → w2
        // 3rd: w3 alone at 2.1472                                           → w3
        let mut cluster = vec![node("w1", 0, 0), node("w2", 0, 0), node("w3", 0, 0)];
        let task = memory_request(512 * MIB);
        let mut scheduler = Epvm::new();
        let mut chosen = Vec::new();
        for _ in 0..3 {
            match scheduler.place(&task, &cluster) {
                Decision::Placed { index, name } => {
                    cluster[index].add_task(&task);
                    chosen.push(name);
                }
                Decision::NoFit { reasons } => panic!("not placed: {reasons:?}"),
            }
        }
        assert_eq!(chosen, ["w1", "w2", "w3"]);
        assert_eq!(scheduler.max_jobs(), 1, "no node went past one job");
    }

    #[test]
    fn max_jobs_doubles_when_the_chosen_node_goes_past_it() {
        // Three nodes with one 512 MiB task each, max_jobs = 1: all tie, w1 gets a second
        // task, 2 > 1, so max_jobs becomes 2. Then, with max_jobs = 2:
        // w1 (1 GiB, 2 tasks):     3^(3/8) − 3^(2/8) + 3^(3/2) − 3^(2/2) = 0.1937 + 2.1962 = 2.3899
        // w2 (512 MiB, 1 task):    3^(2/8) − 3^(1/8) + 3^(2/2) − 3^(1/2) = 0.1689 + 1.2679 = 1.4368
        let task = memory_request(512 * MIB);
        let mut cluster = vec![
            node("w1", 512 * MIB, 1),
            node("w2", 512 * MIB, 1),
            node("w3", 512 * MIB, 1),
        ];
        let mut scheduler = Epvm::new();
        assert_eq!(placed_name(scheduler.place(&task, &cluster)), "w1");
        assert_eq!(scheduler.max_jobs(), 2);
        cluster[0].add_task(&task);
        let costs = scores(&scheduler, &task, &cluster);
        assert_close(costs[0], 2.3899);
        assert_close(costs[1], 1.4368);
        assert_eq!(placed_name(scheduler.place(&task, &cluster)), "w2");
        assert_eq!(scheduler.max_jobs(), 2);
    }

    #[test]
    fn a_fresh_scheduler_takes_max_jobs_from_the_busiest_node() {
        // A manager restarted against nodes with 5 and 3 tasks starts at max_jobs = 8, not 1.
        let task = memory_request(512 * MIB);
        let cluster = [node("w1", 0, 5), node("w2", 0, 3)];
        let mut scheduler = Epvm::new();
        assert_eq!(placed_name(scheduler.place(&task, &cluster)), "w2");
        assert_eq!(scheduler.max_jobs(), 8);
        // A node with exactly 8 tasks is covered by 8; its ninth takes max_jobs to 16.
        let mut full = [node("w1", 0, 8)];
        assert_eq!(placed_name(scheduler.place(&task, &full)), "w1");
        assert_eq!(scheduler.max_jobs(), 16);
        full[0].task_count = 9;
        assert_eq!(placed_name(scheduler.place(&task, &full)), "w1");
        assert_eq!(scheduler.max_jobs(), 16);
    }

    #[test]
    fn a_single_live_node_is_still_chosen_and_costs_are_numbers() {
        let mut down = node("w1", 0, 0);
        down.ready = false;
        let cluster = [down, node("w2", 0, 0)];
        let task = memory_request(512 * MIB);
        let mut scheduler = Epvm::new();
        // One live node, so the base is 2: 2^(1/8) − 1 + 2^1 − 2^0 = 0.0905 + 1 = 1.0905.
        assert_close(scores(&scheduler, &task, &cluster)[0], 1.0905);
        assert_eq!(placed_name(scheduler.place(&task, &cluster)), "w2");
    }

    #[test]
    fn a_node_without_memory_gives_no_nan_for_a_task_without_memory() {
        let mut cpu_only = node("w1", 0, 0);
        cpu_only.capacity.memory = 0;
        let mut overcommitted = node("w2", 10 * GIB, 0);
        overcommitted.capacity.memory = 1;
        let cluster = [cpu_only, overcommitted];
        let no_memory = TaskRequest {
            cpu: 1.0,
            ..TaskRequest::default()
        };
        let scheduler = Epvm::new();
        for cost in scores(&scheduler, &no_memory, &cluster) {
            assert!(cost.is_finite(), "{cost}");
        }
        assert_eq!(placed_name(Epvm::new().place(&no_memory, &cluster)), "w1");
    }

    #[test]
    fn nothing_fits_gives_no_fit_with_every_reason() {
        let mut down = node("w1", 0, 0);
        down.ready = false;
        let cluster = [down, node("w2", 3 * GIB, 1)];
        let decision = Epvm::new().place(&memory_request(2 * GIB), &cluster);
        assert_eq!(
            decision.to_string(),
            "w1: node is not Ready; w2: needs 2.0 GiB memory, 1.0 GiB free"
        );
    }

    #[test]
    fn levels_remembered_from_another_snapshot_are_not_reused() {
        // Both schedulers place the same stream on one cluster, so their max_jobs agree and
        // the fast one has remembered a level for every node. Then a node leaves (every index
        // shifts) and allocations change: the fast one must decide what the phases decide.
        let cluster: Vec<NodeView> = (0..6)
            .map(|index| node(&format!("w{index}"), index * 256 * MIB, index as usize % 3))
            .collect();
        let task = memory_request(384 * MIB);
        let mut fast = Epvm::new();
        let mut phased = Epvm::new();
        for _ in 0..3 {
            assert_eq!(
                fast.place(&task, &cluster),
                place_in_phases(&mut phased, &task, &cluster)
            );
        }
        let mut changed = cluster[1..].to_vec();
        changed[0].allocated.memory = 3 * GIB;
        changed[3].allocated.memory = 0;
        for _ in 0..3 {
            let decision = fast.place(&task, &changed);
            assert_eq!(decision, place_in_phases(&mut phased, &task, &changed));
            if let Decision::Placed { index, .. } = decision {
                changed[index].add_task(&task);
            }
        }
    }

    #[test]
    fn the_two_pass_placement_decides_what_the_three_phases_decide() {
        let mut fast_cluster = vec![
            node("a", 3 * GIB, 1),
            node("b", 0, 0),
            node("c", GIB, 4),
            node("d", 0, 0),
        ];
        fast_cluster[3].capacity.memory = 2 * GIB;
        let mut phased_cluster = fast_cluster.clone();
        let mut fast = Epvm::new();
        let mut phased = Epvm::new();
        for round in 0..40 {
            let task = memory_request((round % 5) * 128 * MIB);
            let fast_decision = fast.place(&task, &fast_cluster);
            assert_eq!(
                fast_decision,
                place_in_phases(&mut phased, &task, &phased_cluster)
            );
            assert_eq!(fast.max_jobs(), phased.max_jobs());
            if let Decision::Placed { index, .. } = fast_decision {
                fast_cluster[index].add_task(&task);
                phased_cluster[index].add_task(&task);
            }
        }
    }
}
