//! The pieces together, through the public API only: a nodes store feeds a transformer (a
//! `system` job wants one task on every node labelled `system`), whose desired store and the
//! observed tasks store feed a syncer, whose executor stands in for the world.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cube_controller::store::{Change, ObservedStore};
use cube_controller::syncer::{Executor, SyncRules, Syncer, SyncerConfig};
use cube_controller::transformer::{MaskedInput, ReconciliationMask, Transformer, run_transformer};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, PartialEq)]
struct Node {
    labels: Vec<String>,
    cpu_percent: u32,
}

/// A desired task: which job × node pair owns it.
type Pair = (String, String);

#[derive(Debug, Clone, PartialEq)]
struct Task {
    job: String,
    node: String,
    /// Made by this controller (a user's own tasks are not).
    by_controller: bool,
}

struct SystemJob;

impl Transformer for SystemJob {
    type Inputs = BTreeMap<String, Arc<Node>>;
    type Key = Pair;
    type Desired = ();
    fn transform(&self, nodes: &Self::Inputs) -> BTreeMap<Pair, ()> {
        nodes
            .iter()
            .filter(|(_, node)| node.labels.iter().any(|label| label == "system"))
            .map(|(name, _)| (("system".to_owned(), name.clone()), ()))
            .collect()
    }
}

struct Rules;

impl SyncRules<Pair, (), u64, Task> for Rules {
    fn key_of(&self, _id: &u64, task: &Task) -> Pair {
        (task.job.clone(), task.node.clone())
    }
    fn owns(&self, task: &Task) -> bool {
        task.by_controller
    }
    fn same(&self, _wanted: &(), _task: &Task) -> bool {
        true
    }
}

/// Starts and stops tasks by writing the observed store, as a worker's report would.
#[derive(Clone)]
struct World {
    tasks: ObservedStore<u64, Task>,
    next_id: Arc<Mutex<u64>>,
}

impl Executor<Pair, (), u64, Task> for World {
    type Error = String;
    async fn create(&self, (job, node): Pair, _desired: Arc<()>) -> Result<(), String> {
        let id = {
            let mut next = self.next_id.lock().unwrap();
            *next += 1;
            *next
        };
        let task = Task {
            job,
            node,
            by_controller: true,
        };
        self.tasks.apply(Change::put(id, task));
        Ok(())
    }
    async fn update(&self, _: Pair, _: Arc<()>, _: u64, _: Arc<Task>) -> Result<(), String> {
        Ok(())
    }
    async fn delete(&self, id: u64, _task: Arc<Task>) -> Result<(), String> {
        self.tasks.apply(Change::Delete(id));
        Ok(())
    }
}

fn node(labels: &[&str], cpu_percent: u32) -> Node {
    Node {
        labels: labels.iter().map(|label| label.to_string()).collect(),
        cpu_percent,
    }
}

fn task(job: &str, node: &str, by_controller: bool) -> Task {
    Task {
        job: job.to_owned(),
        node: node.to_owned(),
        by_controller,
    }
}

/// The (job, node) of every task, sorted.
fn placed(tasks: &ObservedStore<u64, Task>) -> Vec<(String, String)> {
    let mut pairs: Vec<_> = tasks
        .snapshot()
        .items
        .values()
        .map(|task| (task.job.clone(), task.node.clone()))
        .collect();
    pairs.sort();
    pairs
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(job, node)| (job.to_string(), node.to_string()))
        .collect()
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(50)).await;
}

#[tokio::test(start_paused = true)]
async fn a_system_job_runs_one_task_per_labelled_node_and_its_tasks_go_with_their_node() {
    let nodes: ObservedStore<String, Node> = ObservedStore::default();
    let desired: ObservedStore<Pair, ()> = ObservedStore::default();
    let tasks: ObservedStore<u64, Task> = ObservedStore::default();
    let shutdown = CancellationToken::new();

    let input = MaskedInput {
        store: nodes.clone(),
        mask: ReconciliationMask::new(|node: &Node| node.labels.clone()),
    };
    let compute = {
        let nodes = nodes.clone();
        move || SystemJob.transform(&nodes.snapshot().items)
    };
    let transformer = tokio::spawn(run_transformer(
        vec![Box::new(input)],
        compute,
        desired.clone(),
        shutdown.clone(),
    ));
    let world = World {
        tasks: tasks.clone(),
        next_id: Arc::default(),
    };
    let syncer = Syncer::new(
        desired.clone(),
        tasks.clone(),
        Rules,
        world,
        SyncerConfig::default(),
    );
    let syncer = tokio::spawn({
        let stop = shutdown.clone();
        async move { syncer.run(stop).await }
    });

    // Already there: a user's own task, and a duplicate pair of the controller's.
    tasks.apply_all([
        Change::put(901, task("mine", "n1", false)),
        Change::put(902, task("system", "n1", true)),
        Change::put(903, task("system", "n1", true)),
    ]);
    nodes.apply_all([
        Change::put("n1".to_owned(), node(&["system"], 10)),
        Change::put("n2".to_owned(), node(&["system"], 10)),
        Change::put("n3".to_owned(), node(&[], 10)),
    ]);
    settle().await;
    assert_eq!(
        placed(&tasks).len(),
        3,
        "nothing happens before the stores are in sync"
    );

    tasks.set_synced(true);
    nodes.set_synced(true);
    settle().await;
    assert_eq!(
        placed(&tasks),
        pairs(&[("mine", "n1"), ("system", "n1"), ("system", "n2")]),
        "one task per labelled node: the duplicate stopped, the user's task left alone"
    );
    assert!(
        tasks.get(&902).is_some(),
        "the first of the duplicates is kept"
    );

    nodes.apply(Change::put("n2".to_owned(), node(&["system"], 99)));
    settle().await;
    assert_eq!(placed(&tasks).len(), 3, "a heartbeat changes nothing");

    nodes.apply(Change::Delete("n1".to_owned()));
    nodes.apply(Change::put("n3".to_owned(), node(&["system"], 10)));
    settle().await;
    assert_eq!(
        placed(&tasks),
        pairs(&[("mine", "n1"), ("system", "n2"), ("system", "n3")]),
        "the gone node's task went with it; the newly labelled node got one"
    );

    shutdown.cancel();
    transformer.await.unwrap();
    syncer.await.unwrap();
}
