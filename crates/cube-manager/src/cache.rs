//! The manager's in-memory copy of every task, and what the tasks hold on each node.
//!
//! The store is the truth; this cache mirrors it so that reads, placements and observations
//! never decode the store. Every write is queued to the store and applied here under one
//! lock (see `Cluster::save`), and nothing is acknowledged or acted on before the write is
//! durable; a write that fails puts the store's version back here.
//!
//! Each task is held once, behind an `Arc`, in one map by ID; the rest of the cache is
//! indexes over the same `Arc`s. (A second map of every task, an `ObservedStore` kept only
//! for its in-sync flag, went in issue 30: the cache is whole before the manager that reads
//! it exists, and what follows task changes follows the event broker.)

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use cube_types::project::Usage;
use cube_types::{HostPort, NodeName, Resources, State, Task};
use uuid::Uuid;

use crate::paging::{PagePosition, PageStart};

/// How many copies of its job a task's spec is compared with, for one to share (a job in a
/// rolling update holds copies of two versions, with other bodies).
const SHARE_TRIES: usize = 4;

/// What the tasks placed on one node hold there.
#[derive(Debug, Clone, Default)]
pub struct NodeLoad {
    /// The sum of the declared `Cpu`, `Memory` and `Disk` of the tasks holding resources.
    pub allocated: Resources,
    /// The tasks holding resources here.
    pub tasks: BTreeSet<Uuid>,
    /// Fixed host ports bound by those tasks, with how many tasks ask for each (a port asked
    /// twice is a conflict the scheduler prevents, but the count keeps removal exact).
    pub host_ports: BTreeMap<HostPort, u32>,
}

/// Every task by ID, the load per node, and the tasks waiting for a placement.
///
/// Tasks are kept behind `Arc`s: a reader takes a [`TaskCache::page`] under the manager's
/// lock for the price of a reference count each, and serialises it after letting go. (The
/// maps' slots also stay small: a `Task` is about 500 bytes, and a map keeps up to a third of
/// its slots empty.)
#[derive(Debug, Default)]
pub struct TaskCache {
    /// Every task by ID, the one copy the indexes below point into.
    tasks: HashMap<Uuid, Arc<Task>>,
    loads: HashMap<NodeName, NodeLoad>,
    /// What each project's placed tasks declare together (a task counts while it holds
    /// resources on a node, as in `loads`): the usage its quota bounds, kept from the tasks
    /// as they are observed, never from the requests.
    usage: HashMap<String, Usage>,
    /// Every node name a task has held, once: each task placed on a node holds this one
    /// (a task read from the store or a worker's report comes with a copy of its own).
    node_names: HashSet<NodeName>,
    /// Tasks that are `Pending` and asked to run: the ones a new node or freed capacity may
    /// let the scheduler place.
    waiting: BTreeSet<Uuid>,
    /// The tasks each job owns (its `Job` field), for the job controller.
    by_job: HashMap<String, BTreeSet<Uuid>>,
    /// Every task in the order lists show them, oldest first: a page of `GET /tasks` is a
    /// range of it, not a sort of every task.
    order: BTreeSet<(Option<DateTime<Utc>>, Uuid)>,
}

/// A task holds its declared resources on its node from placement until it ends; a `Lost`
/// task still holds them, because nobody knows whether it still runs.
pub fn holds_resources(task: &Task) -> bool {
    !task.status.node_name.is_empty()
        && matches!(
            task.status.state,
            State::Scheduled | State::Running | State::Lost
        )
}

impl TaskCache {
    /// What `project`'s placed tasks declare together.
    pub fn usage_of(&self, project: &str) -> Usage {
        self.usage.get(project).copied().unwrap_or_default()
    }

    /// Every project's usage, of those that have a task placed.
    pub fn usages(&self) -> &HashMap<String, Usage> {
        &self.usage
    }

    pub fn get(&self, id: &Uuid) -> Option<&Task> {
        self.tasks.get(id).map(|task| &**task)
    }

    /// A task, shared: cheap to take under the lock and read after it.
    pub fn shared(&self, id: &Uuid) -> Option<Arc<Task>> {
        self.tasks.get(id).cloned()
    }

    pub fn tasks(&self) -> impl Iterator<Item = &Task> {
        self.tasks.values().map(|task| &**task)
    }

    pub fn load(&self, node: &str) -> Option<&NodeLoad> {
        self.loads.get(node)
    }

    /// Pending tasks asked to run, in ID order.
    pub fn waiting(&self) -> impl Iterator<Item = Uuid> + '_ {
        self.waiting.iter().copied()
    }

    /// Inserts or replaces a task, moving its resources between nodes as its placement or
    /// state changed. Returns the task it replaced. A task equal to the one held changes
    /// nothing: the one held stays (and no index is touched).
    pub fn insert(&mut self, mut task: Task) -> Option<Arc<Task>> {
        // A task is changed as a clone (whose history has room for its entries only) plus
        // one entry, so its history grows by doubling: a Running task's two entries would sit
        // in room for four, 128 bytes of every cached task. A cached version is never pushed
        // to again (the next change is another clone), so it keeps room for what it holds.
        task.status.history.shrink_to_fit();
        if let Some(held) = self.tasks.get(&task.id)
            && **held == task
        {
            return Some(held.clone());
        }
        self.share_spec(&mut task);
        self.share_node_name(&mut task);
        let task = Arc::new(task);
        let previous = self.tasks.remove(&task.id);
        if let Some(old) = &previous {
            self.release(old);
            self.unown(old);
            self.order.remove(&(old.status.created_time, old.id));
        }
        self.order.insert((task.status.created_time, task.id));
        self.hold(&task);
        if !task.spec.job.is_empty() {
            self.by_job
                .entry(task.spec.job.clone())
                .or_default()
                .insert(task.id);
        }
        if task.status.state == State::Pending && task.spec.desired_state == State::Running {
            self.waiting.insert(task.id);
        } else {
            self.waiting.remove(&task.id);
        }
        self.tasks.insert(task.id, task);
        previous
    }

    /// Gives the task the node name every task on its node holds.
    fn share_node_name(&mut self, task: &mut Task) {
        let name = &mut task.status.node_name;
        if name.is_empty() {
            return;
        }
        match self.node_names.get(name.as_str()) {
            Some(shared) => *name = shared.clone(),
            None => {
                self.node_names.insert(name.clone());
            }
        }
    }

    /// Gives a job's copy the spec body another copy of its job already holds, when they are
    /// equal: a copy read from the store, or made in another look of the job controller, has
    /// a body of its own, and 10,000 copies would hold 10,000 equal ones. Tries the task held
    /// under this ID, then a few copies of the job (the newest version's copies are usually
    /// among them); costs a pointer comparison when the body is shared already.
    fn share_spec(&self, task: &mut Task) {
        if let Some(held) = self.tasks.get(&task.id)
            && task.spec.share_body_of(&held.spec)
        {
            return;
        }
        let Some(siblings) = self.by_job.get(&task.spec.job) else {
            return;
        };
        for id in siblings.iter().take(SHARE_TRIES) {
            if let Some(sibling) = self.tasks.get(id)
                && task.spec.share_body_of(&sibling.spec)
            {
                return;
            }
        }
    }

    /// Forgets a task (one whose write never became durable); returns it.
    pub fn remove(&mut self, id: &Uuid) -> Option<Arc<Task>> {
        let task = self.tasks.remove(id)?;
        self.release(&task);
        self.unown(&task);
        self.order.remove(&(task.status.created_time, task.id));
        self.waiting.remove(id);
        Some(task)
    }

    /// Up to `limit` tasks that `keep` admits, oldest first, from `start` on (from the first
    /// without one), and the position of the next one `keep` admits, if any. `None` when
    /// `start` names a task not held here (an older Cube's token). Costs the tasks looked at,
    /// not every task.
    pub fn page(
        &self,
        start: Option<PageStart>,
        limit: usize,
        keep: impl Fn(&Task) -> bool,
    ) -> Option<(Vec<Arc<Task>>, Option<PagePosition>)> {
        let from = match start {
            Some(PageStart::At(position)) => (position.created, position.id),
            Some(PageStart::Task(id)) => {
                let task = self.tasks.get(&id)?;
                (task.status.created_time, id)
            }
            None => match self.order.first() {
                Some(first) => *first,
                None => return Some((Vec::new(), None)),
            },
        };
        let mut page = Vec::new();
        for (_, id) in self.order.range(from..) {
            let Some(task) = self.tasks.get(id) else {
                continue;
            };
            if !keep(task) {
                continue;
            }
            if page.len() == limit {
                return Some((page, Some(PagePosition::of(task))));
            }
            page.push(task.clone());
        }
        Some((page, None))
    }

    /// How many tasks a job owns.
    pub fn job_len(&self, job: &str) -> usize {
        self.by_job.get(job).map_or(0, BTreeSet::len)
    }

    /// The tasks a job owns, shared.
    pub fn of_job(&self, job: &str) -> Vec<Arc<Task>> {
        self.by_job
            .get(job)
            .into_iter()
            .flatten()
            .filter_map(|id| self.tasks.get(id).cloned())
            .collect()
    }

    fn unown(&mut self, task: &Task) {
        if task.spec.job.is_empty() {
            return;
        }
        if let Some(owned) = self.by_job.get_mut(&task.spec.job) {
            owned.remove(&task.id);
            if owned.is_empty() {
                self.by_job.remove(&task.spec.job);
            }
        }
    }

    fn hold(&mut self, task: &Task) {
        if !holds_resources(task) {
            return;
        }
        let declared = Usage::of_task(task.spec.cpu, task.spec.memory, task.spec.disk);
        match self.usage.get_mut(task.spec.project.as_str()) {
            Some(usage) => usage.add(&declared),
            None => {
                self.usage.insert(task.spec.project.clone(), declared);
            }
        }
        let load = self.loads.entry(task.status.node_name.clone()).or_default();
        load.allocated.cpu += task.spec.cpu;
        load.allocated.memory += task.spec.memory;
        load.allocated.disk += task.spec.disk;
        load.tasks.insert(task.id);
        for port in task.fixed_host_ports() {
            *load.host_ports.entry(port).or_default() += 1;
        }
    }

    fn release(&mut self, task: &Task) {
        if !holds_resources(task) {
            return;
        }
        if let Some(usage) = self.usage.get_mut(task.spec.project.as_str()) {
            usage.remove(&Usage::of_task(
                task.spec.cpu,
                task.spec.memory,
                task.spec.disk,
            ));
            if usage.is_empty() {
                self.usage.remove(task.spec.project.as_str());
            }
        }
        let Some(load) = self.loads.get_mut(task.status.node_name.as_str()) else {
            return;
        };
        // Floating-point sums drift; a node with no tasks left holds exactly nothing.
        load.allocated.cpu = (load.allocated.cpu - task.spec.cpu).max(0.0);
        load.allocated.memory = load.allocated.memory.saturating_sub(task.spec.memory);
        load.allocated.disk = load.allocated.disk.saturating_sub(task.spec.disk);
        load.tasks.remove(&task.id);
        if load.tasks.is_empty() {
            load.allocated = Resources::default();
        }
        for port in task.fixed_host_ports() {
            if let Some(count) = load.host_ports.get_mut(&port) {
                *count -= 1;
                if *count == 0 {
                    load.host_ports.remove(&port);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placed(node: &str, state: State, memory: u64, port: Option<&str>) -> Task {
        let mut task = Task::new("t", "img");
        task.status.node_name = node.into();
        task.status.state = state;
        task.spec.memory = memory;
        task.spec.cpu = 0.5;
        if let Some(port) = port {
            task.spec.port_bindings.insert("80/tcp".into(), port.into());
        }
        task
    }

    #[test]
    fn resources_follow_a_task_from_placement_to_its_end() {
        let mut cache = TaskCache::default();
        let mut task = placed("w1", State::Scheduled, 100, Some("8080"));
        cache.insert(task.clone());
        let load = cache.load("w1").unwrap();
        assert_eq!(load.allocated.memory, 100);
        assert_eq!(load.tasks.len(), 1);
        assert!(load.host_ports.contains_key(&HostPort::tcp(8080)));

        task.status.state = State::Running;
        cache.insert(task.clone());
        assert_eq!(
            cache.load("w1").unwrap().allocated.memory,
            100,
            "counted once"
        );

        task.status.state = State::Failed;
        cache.insert(task);
        let load = cache.load("w1").unwrap();
        assert_eq!(load.allocated, Resources::default());
        assert!(load.tasks.is_empty() && load.host_ports.is_empty());
    }

    #[test]
    fn the_tasks_of_one_node_hold_one_copy_of_its_name() {
        let mut cache = TaskCache::default();
        // Each read anew (from the store, from a worker): a name of its own.
        let (first, second) = (
            placed("w1", State::Running, 1, None),
            placed("w1", State::Completed, 1, None),
        );
        assert!(!first.status.node_name.shares(&second.status.node_name));
        cache.insert(first.clone());
        cache.insert(second.clone());
        let name = |id| cache.get(id).unwrap().status.node_name.clone();
        assert!(name(&first.id).shares(&name(&second.id)));
        assert_eq!(name(&second.id), "w1");
    }

    #[test]
    fn an_equal_put_keeps_the_task_held_and_a_change_replaces_it() {
        let mut cache = TaskCache::default();
        let mut task = placed("w1", State::Scheduled, 100, None);
        assert!(cache.insert(task.clone()).is_none());

        let held = cache.shared(&task.id).unwrap();
        let replaced = cache.insert(task.clone()).unwrap();
        assert!(Arc::ptr_eq(&held, &replaced));
        assert!(
            Arc::ptr_eq(&held, &cache.shared(&task.id).unwrap()),
            "an equal task keeps the one held"
        );

        task.status.state = State::Running;
        let before = cache.insert(task.clone()).unwrap();
        assert_eq!(before.status.state, State::Scheduled);
        assert_eq!(cache.get(&task.id), Some(&task));
        assert_eq!(cache.load("w1").unwrap().allocated.memory, 100);

        cache.remove(&task.id);
        assert!(cache.get(&task.id).is_none());
        assert!(cache.load("w1").unwrap().tasks.is_empty());
    }

    #[test]
    fn copies_of_a_job_read_one_by_one_share_one_spec_in_the_cache() {
        let mut cache = TaskCache::default();
        let mut template = Task::new("", "cube-sample:latest");
        template.spec.job = "web".into();
        template.spec.cmd = vec!["httpd".into(), "-f".into()];
        // Each copy decoded on its own, as the store hands them at start: equal bodies, not one.
        let copies: Vec<Task> = (0..3)
            .map(|index| {
                let mut copy = template.clone();
                copy.id = Uuid::new_v4();
                copy.spec.index = Some(index);
                serde_json::from_value(serde_json::to_value(&copy).unwrap()).unwrap()
            })
            .collect();
        assert!(!copies[1].spec.shares_body_with(&copies[0].spec));
        for copy in &copies {
            cache.insert(copy.clone());
        }
        let held: Vec<Arc<Task>> = copies
            .iter()
            .map(|c| cache.shared(&c.id).unwrap())
            .collect();
        assert!(held[1].spec.shares_body_with(&held[0].spec));
        assert!(held[2].spec.shares_body_with(&held[0].spec));
        for (copy, held) in copies.iter().zip(&held) {
            assert_eq!(**held, *copy, "a shared spec reads the same");
        }

        // A copy of a new version keeps its own body; a bare task never shares.
        let mut newer = copies[0].clone();
        newer.spec.image = "cube-sample:v2".into();
        cache.insert(newer.clone());
        assert_eq!(cache.get(&newer.id).unwrap().spec.image, "cube-sample:v2");
        assert_eq!(
            cache.get(&copies[1].id).unwrap().spec.image,
            "cube-sample:latest"
        );
        let bare = Task::new("bare", "cube-sample:latest");
        cache.insert(bare.clone());
        assert!(
            !cache
                .get(&bare.id)
                .unwrap()
                .spec
                .shares_body_with(&held[0].spec)
        );
    }

    #[test]
    fn pending_tasks_wait_until_placed_or_stopped() {
        let mut cache = TaskCache::default();
        let mut task = Task::new("t", "img");
        cache.insert(task.clone());
        assert_eq!(cache.waiting().collect::<Vec<_>>(), vec![task.id]);
        task.spec.desired_state = State::Completed;
        cache.insert(task);
        assert_eq!(cache.waiting().count(), 0);
    }

    #[test]
    fn a_cached_task_keeps_no_spare_room_in_its_history() {
        let mut cache = TaskCache::default();
        let mut task = placed("w1", State::Scheduled, 100, None);
        task.record(Utc::now(), "Placed", "on w1");
        let mut next = task.clone();
        next.status.state = State::Running;
        next.record(Utc::now(), "Running", "on w1");
        assert!(
            next.status.history.capacity() > next.status.history.len(),
            "a push doubles"
        );
        cache.insert(next);
        let held = cache.get(&task.id).unwrap();
        assert_eq!(held.status.history.len(), 2);
        assert_eq!(held.status.history.capacity(), 2);
    }
}
