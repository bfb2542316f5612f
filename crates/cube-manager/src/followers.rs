//! The followers: how the manager sees what runs. Each node's task list is followed with
//! blocking queries (`GET /tasks?index=N` on the worker answers the moment a task changes),
//! and what a worker reports is merged into the manager's tasks along the state table. A run
//! a worker still has that the manager replaced or ended (the node was away) is a stray, and
//! is stopped there. Static (`-w`) workers are polled for their node report instead of
//! reporting themselves.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use cube_api::{ApiClient, Changes};
use cube_types::{NodeStatus, State, Task};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::cluster::{Cluster, NodeChange, Shared, Writes, lock};
use crate::nodes::node_status_event;
use crate::observation::{is_stray, merge_observation};

/// How long a blocking query to a worker waits before the worker answers anyway.
const FOLLOW_WAIT: Duration = Duration::from_secs(30);

/// How long to wait before following a worker again after its API could not be reached.
/// How many nodes' whole task lists are read at once (see `Followers::complete_lists`).
pub(crate) const COMPLETE_LISTS_AT_ONCE: usize = 2;

const FOLLOW_RETRY: Duration = Duration::from_secs(1);

/// What [`Followers::observe`] found in a worker's list.
pub(crate) struct Observed {
    /// Runs to stop on the node, with their run (`RestartCount`).
    pub(crate) strays: Vec<(Uuid, u32)>,
    /// Ended tasks to purge on the node.
    pub(crate) forgotten: Vec<Uuid>,
    /// Whether every change was written.
    pub(crate) written: bool,
}

/// The followers of the workers' task lists, one loop per node (see the module comment).
///
/// | reads | woken by | writes |
/// |---|---|---|
/// | each worker's `GET /tasks?index=N&changes=true`, the task cache | the worker's answer; a node that joins, moves or comes back (`follow`) | the tasks as observed, strays stopped on the node, the node `Unreachable` or reachable again; wakes the task controller for a node's tasks, a placement pass, the system jobs |
pub(crate) struct Followers {
    cluster: Arc<Cluster>,
    /// The loop following each node's tasks, by node name, to stop it when the node moves
    /// or is removed.
    registry: Mutex<HashMap<String, CancellationToken>>,
    /// Every follower's task: shutdown waits for them (`Manager::start`).
    pub(crate) background: TaskTracker,
    /// Permits to read a node's whole task list. A manager that starts, or that many nodes
    /// come back to, would otherwise hold every node's list in memory at once.
    complete_lists: tokio::sync::Semaphore,
    shutdown: CancellationToken,
}

impl Followers {
    pub(crate) fn new(cluster: Arc<Cluster>, shutdown: CancellationToken) -> Followers {
        Followers {
            cluster,
            registry: Mutex::new(HashMap::new()),
            background: TaskTracker::new(),
            complete_lists: tokio::sync::Semaphore::new(COMPLETE_LISTS_AT_ONCE),
            shutdown,
        }
    }

    /// Whether node `name` has a follower running.
    pub(crate) fn follows(&self, name: &str) -> bool {
        lock(&self.registry)
            .get(name)
            .is_some_and(|follower| !follower.is_cancelled())
    }

    /// Stops following node `name` (it was removed).
    pub(crate) fn stop_following(&self, name: &str) {
        if let Some(follower) = lock(&self.registry).remove(name) {
            follower.cancel();
        }
    }

    /// Publishes a node's event after the manager could or could no longer reach it: its
    /// status now (`NodeReady`, `NodeUnreachable`), or `NodeUpdated` when that did not move
    /// (a node `Down` either way, whose `StatusReason` changed).
    fn publish_node_status(&self, state: &Shared, name: &str) {
        let Some(entry) = state.nodes.get(name) else {
            return;
        };
        let kind = match entry.status(Instant::now(), self.cluster.heartbeat_grace()) {
            NodeStatus::Down => "NodeUpdated",
            status => node_status_event(status),
        };
        self.cluster.publish_node(state, name, kind);
    }

    /// Applies a worker's task list: each task placed on `node` takes the state the worker
    /// saw. When the list is `complete` (every task the worker has, not only those that
    /// changed), a task the manager placed there that the worker does not list is sent again
    /// when it was only `Scheduled`, and has failed when it was `Running` (the worker lost
    /// its store).
    ///
    /// Returns the strays, with their run (`RestartCount`): runs the worker still has going that the manager has replaced or
    /// ended (the node was lost and came back), for the caller to stop there; and the ended
    /// tasks the worker has that the manager no longer knows (removed while the node was
    /// away), for the caller to have purged there; and whether what changed was written (a
    /// write the store refused is put back from the store, and the list must be read again:
    /// the worker sends a change once).
    pub(crate) async fn observe(
        &self,
        node: &str,
        reported: Vec<Task>,
        complete: bool,
    ) -> Observed {
        let mut writes = Writes::default();
        let mut to_reconcile = Vec::new();
        let mut strays = Vec::new();
        let mut forgotten = Vec::new();
        {
            let mut state = lock(&self.cluster.state);
            let mut listed = HashSet::with_capacity(reported.len());
            for observed in reported {
                // A task of a shard another manager holds is that manager's to judge: never
                // a stray here, never purged from here (managers sharing etcd each follow
                // every worker; a manager alone holds every shard).
                if !state.scope.holds_project(&observed.spec.project) {
                    continue;
                }
                listed.insert(observed.id);
                let known = state.cache.get(&observed.id);
                if is_stray(known, &observed, node) {
                    strays.push((observed.id, observed.status.restart_count));
                    continue;
                }
                let Some(known) = known else {
                    if observed.status.state.is_terminal() {
                        forgotten.push(observed.id);
                    }
                    continue;
                };
                if known.status.node_name != node {
                    continue;
                }
                let Some(merged) = merge_observation(known, &observed, Utc::now()) else {
                    continue;
                };
                tracing::info!(task = %merged.id, name = %merged.name, node, state = %merged.status.state, "task state changed");
                if let Err(err) = self.cluster.save(&mut state, &mut writes, merged) {
                    tracing::error!(task = %observed.id, error = %err, "cannot store an observed state");
                }
                to_reconcile.push(observed.id);
            }
            let placed_here: Vec<Uuid> = if complete {
                state
                    .cache
                    .load(node)
                    .map(|load| load.tasks.iter().copied().collect())
                    .unwrap_or_default()
            } else {
                Vec::new()
            };
            for id in placed_here.into_iter().filter(|id| !listed.contains(id)) {
                let Some(known) = state.cache.get(&id) else {
                    continue;
                };
                match known.status.state {
                    State::Scheduled => {
                        lock(&self.cluster.dispatched).remove(&id);
                        to_reconcile.push(id);
                    }
                    State::Running => {
                        let mut failed = known.clone();
                        let reason =
                            format!("worker {node} no longer has this task (its store was lost?)");
                        if failed.end(State::Failed, Some(reason), Utc::now()).is_err() {
                            continue;
                        }
                        tracing::warn!(task = %id, node, "the worker no longer has a running task");
                        if let Err(err) = self.cluster.save(&mut state, &mut writes, failed) {
                            tracing::error!(task = %id, error = %err, "cannot store a failure");
                        }
                        to_reconcile.push(id);
                    }
                    _ => {}
                }
            }
        }
        // Errors are logged, and the cache put back, by `settle`; the follower then reads the
        // node's whole list again. Room that a task's end freed asks for a placement pass
        // there (`Writes`).
        let written = self.cluster.settle(writes).await.is_ok();
        for id in to_reconcile {
            self.cluster.wakes.tasks.push(id);
        }
        Observed {
            strays,
            forgotten,
            written,
        }
    }

    /// Follows a node's tasks with blocking queries, replacing any follower it had.
    pub(crate) fn follow(self: &Arc<Self>, name: String, client: ApiClient) {
        let stop = self.shutdown.child_token();
        if let Some(previous) = lock(&self.registry).insert(name.clone(), stop.clone()) {
            previous.cancel();
        }
        // In the tracker that shutdown waits for (`Manager::start`), not detached.
        self.background
            .spawn(self.clone().run_follower(name, client, stop));
    }

    /// Keeps a blocking `GET /tasks?index=N&changes=true` open on the worker: it answers the
    /// moment a task changes there, with the tasks that changed since the last answer, so the
    /// manager's view lags the container by one HTTP round trip and each change costs what
    /// changed, not the worker's whole list. The first answer (index 0), and any after the
    /// worker's store was replaced, hold every task.
    async fn run_follower(
        self: Arc<Self>,
        name: String,
        client: ApiClient,
        stop: CancellationToken,
    ) {
        let mut index = 0;
        // Whether the node's whole list was read, as of `index`. Not `index != 0`: a worker
        // that never had a task is at index 0 after its list is read, and a follower that
        // took that for "not read yet" asked again at once, without waiting, hundreds of
        // times a second for as long as the worker stayed empty.
        let mut listed = false;
        let mut reachable = true;
        // The blocking queries' own connection, which holds no buffer while it waits (a
        // pooled one held ~39 KB a worker); the rare deletes below go through the pool.
        let mut poll = client.long_poll();
        // A manager acting for some shards asks for their tasks only (a worker of an older
        // Cube lists every task, and `observe` leaves the others out as before). Read once:
        // the scope changes only as shards are taken in place, after which every node is
        // followed afresh (`Manager::take_shards`), or with a new `Manager`.
        let path = {
            let state = lock(&self.cluster.state);
            if state.scope.is_whole() {
                "/tasks".to_string()
            } else {
                format!(
                    "/tasks?ring={}&shards={}",
                    state.scope.ring(),
                    state.scope.to_param()
                )
            }
        };
        loop {
            // The first request asks for every task, at once (there is nothing to wait for):
            // wait for a permit first, and keep it until they are applied.
            let permit = if !listed {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    permit = self.complete_lists.acquire() => permit.ok(),
                }
            } else {
                None
            };
            let answer = tokio::select! {
                _ = stop.cancelled() => return,
                answer = poll.get_changes::<Vec<Task>>(
                    &path,
                    index,
                    if listed { FOLLOW_WAIT } else { Duration::ZERO },
                ) => answer,
            };
            let pause = match answer {
                Ok(Changes {
                    body: tasks,
                    index: reported_index,
                    complete,
                }) => {
                    // Any answer clears the node's `Unreachable`, whoever set it: a follower
                    // started afresh (the node came back after it was `Down`) inherits the
                    // mark its cancelled predecessor left, and must clear it too, or the
                    // node would stay `Unreachable` while it answers.
                    let back = {
                        let mut state = lock(&self.cluster.state);
                        // Checked under the lock: a replaced follower whose answer arrived
                        // as it was cancelled must not write over its successor's view.
                        if stop.is_cancelled() {
                            return;
                        }
                        let back = state.nodes.set_unreachable(&name, None);
                        if let Some(entry) = state.nodes.get_mut(&name) {
                            entry.followed_at = Some(Instant::now());
                        }
                        back.then(|| {
                            // It takes work again, and what waits to be sent there can go.
                            self.publish_node_status(&state, &name);
                            self.cluster
                                .node_changed(&mut state, &name, NodeChange::Room)
                        })
                    };
                    if !reachable || back.is_some() {
                        tracing::info!(node = %name, "following the node's tasks again");
                        reachable = true;
                    }
                    if let Some(wake) = back {
                        self.cluster.wake_for_node(wake);
                    }
                    let Observed {
                        strays,
                        forgotten,
                        written,
                    } = self.observe(&name, tasks, complete).await;
                    for id in forgotten {
                        // Removed here while the node could not be asked: its container and
                        // record go now.
                        if let Err(err) = client.delete(&format!("/tasks/{id}?purge=true")).await {
                            tracing::warn!(task = %id, node = %name, error = %err, "cannot remove a task the manager no longer has");
                        }
                    }
                    for (stray, run) in strays {
                        if self.stored_though_not_cached(stray).await {
                            continue;
                        }
                        // Another run replaced this one while the node was away, or the
                        // manager never placed it: stop it, so that the task does not run
                        // twice, nor at all unseen. Once it has ended, the worker's report
                        // of it is of an ended task the manager does not have: it is purged.
                        tracing::warn!(task = %stray, node = %name, "stopping a run the manager did not place there, or replaced");
                        // Only that run: the new run may be there by the time this arrives.
                        if let Err(err) = client.delete(&format!("/tasks/{stray}?run={run}")).await
                        {
                            tracing::warn!(task = %stray, node = %name, error = %err, "cannot stop a replaced run");
                        }
                    }
                    match reported_index {
                        // What changed was not all written (the store refused it, as while
                        // a shard moves): the worker would not send those changes again, so
                        // its whole list is read again, after a pause.
                        Some(_) if !written => {
                            index = 0;
                            listed = false;
                            Some(FOLLOW_RETRY)
                        }
                        Some(reported) => {
                            index = reported;
                            listed = true;
                            None
                        }
                        // A server that does not report an index cannot be followed by
                        // blocking queries; ask again after a pause instead of spinning.
                        None => Some(FOLLOW_RETRY),
                    }
                }
                Err(err) => {
                    if reachable {
                        tracing::warn!(node = %name, error = %err, "cannot follow the node's tasks; retrying");
                        reachable = false;
                    }
                    // Not `Ready` while it cannot be reached: nothing placed there could be
                    // sent, and `cube node` says why.
                    let mut state = lock(&self.cluster.state);
                    if stop.is_cancelled() {
                        return;
                    }
                    if state.nodes.set_unreachable(&name, Some(err.cause())) {
                        self.publish_node_status(&state, &name);
                    }
                    drop(state);
                    index = 0;
                    listed = false;
                    Some(FOLLOW_RETRY)
                }
            };
            // The permit is for reading one whole list: it is not kept across a failed request's
            // pause (two dead nodes would otherwise keep every live one waiting).
            drop(permit);
            if let Some(pause) = pause {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
}

impl Followers {
    /// Whether a stray that the cache does not know is in the store all the same, or the
    /// store cannot say: then it is not stopped. A manager that lost the lead without knowing
    /// it yet (it was frozen) has a cache behind the new leader's, and must not stop what the
    /// new leader placed; the store is read only for such tasks, which are rare.
    async fn stored_though_not_cached(&self, id: Uuid) -> bool {
        if lock(&self.cluster.state).cache.get(&id).is_some() {
            return false;
        }
        let stores = self.cluster.stores.clone();
        let stored = tokio::task::spawn_blocking(move || stores.stored_task(id, None)).await;
        match stored {
            Ok(Ok(None)) => false,
            Ok(Ok(Some(_))) => {
                tracing::debug!(task = %id, "a task the cache does not know is in the store: not stopped");
                true
            }
            Ok(Err(err)) => {
                tracing::warn!(task = %id, error = %err, "cannot read whether a task the manager did not place is stored; not stopping it now");
                true
            }
            Err(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodes::NodeSource;

    #[test]
    fn an_observation_moves_a_task_only_along_the_table() {
        let mut known = Task::new("t", "img");
        known.status.state = State::Running;
        known.status.node_name = "w1".into();
        let mut observed = known.clone();
        let now = Utc::now();
        assert_eq!(
            merge_observation(&known, &observed, now),
            None,
            "nothing new"
        );

        observed.status.state = State::Failed;
        observed.status.run.exit_code = Some(137);
        observed.status.run.error = Some("killed".into());
        let merged = merge_observation(&known, &observed, now).unwrap();
        assert_eq!(
            (merged.status.state, merged.status.run.exit_code),
            (State::Failed, Some(137))
        );
        let entry = merged.status.history.last().unwrap();
        assert_eq!(
            (&*entry.event, entry.message.as_str()),
            ("Failed", "killed")
        );

        let mut late = known.clone();
        late.status.state = State::Scheduled;
        assert_eq!(
            merge_observation(&merged, &late, now),
            None,
            "a late report cannot bring back an ended task"
        );
    }

    #[test]
    fn a_report_of_an_earlier_run_is_ignored() {
        let mut known = Task::new("t", "img");
        known.status.state = State::Scheduled;
        known.status.node_name = "w1".into();
        known.status.restart_count = 2;
        let mut old_run = known.clone();
        old_run.status.restart_count = 1;
        old_run.status.state = State::Failed;
        assert_eq!(merge_observation(&known, &old_run, Utc::now()), None);
    }

    #[tokio::test]
    async fn a_worker_that_never_had_a_task_is_followed_by_waiting_not_asked_again_and_again() {
        // A worker with no task ever is at change index 0. It answers its list at once, and a
        // blocking query only once something changes (never, here).
        let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = requests.clone();
        let worker = axum::Router::new().route(
            "/tasks",
            axum::routing::get(move |query: axum::extract::RawQuery| {
                let counted = counted.clone();
                async move {
                    counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let query = query.0.unwrap_or_default();
                    if !query.contains("wait=0ms") {
                        tokio::time::sleep(Duration::from_secs(60)).await;
                    }
                    ([(cube_api::INDEX_HEADER, "0")], "[]")
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, worker).await });
        let manager = crate::manager::manager_for_tests();
        let report = crate::nodes::test_report("empty", &format!("http://{address}"), 1.0, 1 << 30);
        manager
            .report_node(report, NodeSource::Registered)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let asked = requests.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(asked, 2, "the list, then one blocking query that waits");
        manager.shutdown.cancel();
        server.abort();
    }

    /// Waits (up to 10 s) for task `id` to be `Running` in `manager`'s view.
    async fn until_running(manager: &crate::manager::Manager, id: Uuid) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while manager.task(id).unwrap().status.state != State::Running {
            assert!(
                Instant::now() < deadline,
                "the task the worker runs is still {} here",
                manager.task(id).unwrap().status.state
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A client of a one-member etcd under `prefix`.
    fn etcd_db(etcd: &cube_test_support::EtcdCluster, prefix: &str) -> cube_store::EtcdDb {
        cube_store::EtcdDb::connect(cube_store::EtcdConfig::new(etcd.endpoints(), prefix)).unwrap()
    }

    /// `worker` served on a loopback port: its `http://` address, and the server to abort.
    async fn serve(worker: axum::Router) -> (String, tokio::task::JoinHandle<std::io::Result<()>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        (
            address,
            tokio::spawn(async move { axum::serve(listener, worker).await }),
        )
    }

    /// A node whose first report the registry took but whose write failed (etcd refused it:
    /// here the manager's fence is on a key etcd creates later) is followed once it beats
    /// again, and written then: a task placed there and running there is seen `Running`.
    /// Before, only a new, moved or grown node was followed, and written only when a report
    /// changed it, and its next beats were none of those.
    #[tokio::test]
    async fn a_node_whose_first_report_was_not_written_is_followed_when_it_beats_again() {
        let etcd = cube_test_support::EtcdCluster::start(1);
        let db = etcd_db(&etcd, "/followers-unwritten-report");
        let (_, revision) = db.read_versioned("held").await.unwrap();
        // Every write is refused until etcd creates the fence's key, two writes from now.
        db.set_fence(Some(cube_store::Fence::one(
            db.fence_key("held", 0).key,
            revision + 2,
        )));
        let mut stores = crate::cluster::ManagerStores::in_memory();
        stores.nodes = Arc::new(cube_store::EtcdStore::new(db.clone(), "nodes").unwrap());
        let manager = crate::manager::manager_on(crate::manager::test_config(), stores);
        // The worker: its whole list at once, a blocking query answered after a moment.
        let listed: Arc<Mutex<Vec<Task>>> = Arc::default();
        let lists = listed.clone();
        let worker = axum::Router::new().route(
            "/tasks",
            axum::routing::get(move |query: axum::extract::RawQuery| {
                let lists = lists.clone();
                async move {
                    if !query.0.unwrap_or_default().contains("wait=0ms") {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    let tasks = lock(&lists).clone();
                    let index = tasks.len().to_string();
                    ([(cube_api::INDEX_HEADER, index)], axum::Json(tasks))
                }
            }),
        );
        let (address, server) = serve(worker).await;
        let report = || crate::nodes::test_report("w1", &address, 2.0, 1 << 30);
        let refused = manager.report_node(report(), NodeSource::Registered).await;
        assert!(
            refused.is_err(),
            "the first report's write is refused: {refused:?}"
        );
        db.get_or_create("unrelated", b"1".to_vec()).await.unwrap();
        db.get_or_create("held", b"1".to_vec()).await.unwrap();
        manager
            .report_node(report(), NodeSource::Registered)
            .await
            .expect("the next beat is written");
        assert!(
            manager.cluster.stores.nodes.get("w1").unwrap().is_some(),
            "the node is in the store, though the next beat changed nothing"
        );
        let id = crate::manager::placed_test_task(&manager).await;
        let mut running = Task::clone(&manager.task(id).unwrap());
        assert_eq!(running.status.node_name, "w1");
        running.move_to(State::Running).unwrap();
        lock(&listed).push(running);
        until_running(&manager, id).await;
        manager.shutdown.cancel();
        server.abort();
    }

    /// A change a worker sent that the store refused to write (the manager's fence did not
    /// hold, as while a shard moves) is read again from the worker's whole list and written
    /// once the store takes it. The worker sends a change once: before, the follower went on
    /// from the worker's index and the task stayed `Scheduled` here while it ran there.
    #[tokio::test]
    async fn a_change_the_store_refused_is_read_again_from_the_whole_list() {
        let etcd = cube_test_support::EtcdCluster::start(1);
        let db = etcd_db(&etcd, "/followers-refused-change");
        let mut stores = crate::cluster::ManagerStores::in_memory();
        stores.tasks = Arc::new(cube_store::EtcdStore::new(db.clone(), "tasks").unwrap());
        let manager = crate::manager::manager_on(crate::manager::test_config(), stores);
        // The worker: its whole list at index 0; after that only what changed after the
        // index asked for (nothing, a moment later, when nothing did), as a real worker.
        let worker_state: Arc<Mutex<(u64, Vec<Task>)>> = Arc::default();
        let shared = worker_state.clone();
        let worker = axum::Router::new().route(
            "/tasks",
            axum::routing::get(
                move |axum::extract::Query(query): axum::extract::Query<
                    HashMap<String, String>,
                >| {
                    let shared = shared.clone();
                    async move {
                        let asked: u64 =
                            query.get("index").and_then(|i| i.parse().ok()).unwrap_or(0);
                        let (index, tasks) = lock(&shared).clone();
                        if asked == 0 {
                            let headers = [(cube_api::INDEX_HEADER, index.to_string())];
                            return axum::response::IntoResponse::into_response((
                                headers,
                                axum::Json(tasks),
                            ));
                        }
                        let changed = if asked < index {
                            tasks
                        } else {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            Vec::new()
                        };
                        let headers = [
                            (cube_api::INDEX_HEADER, index.max(asked).to_string()),
                            (cube_api::SINCE_HEADER, asked.to_string()),
                        ];
                        axum::response::IntoResponse::into_response((headers, axum::Json(changed)))
                    }
                },
            ),
        );
        let (address, server) = serve(worker).await;
        crate::manager::join_test_node_at(&manager, "w1", 1 << 30, &address).await;
        let id = crate::manager::placed_test_task(&manager).await;
        // The follower has read the (empty) list and waits on index 1.
        *lock(&worker_state) = (1, Vec::new());
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The store refuses every write from now on: fenced on a key that never existed.
        db.set_fence(Some(cube_store::Fence::one(
            db.fence_key("never-held", 0).key,
            1,
        )));
        let mut running = Task::clone(&manager.task(id).unwrap());
        running.move_to(State::Running).unwrap();
        *lock(&worker_state) = (2, vec![running]);
        // The change arrives and is refused: the task is as the store has it.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(manager.task(id).unwrap().status.state, State::Scheduled);
        db.set_fence(None);
        until_running(&manager, id).await;
        manager.shutdown.cancel();
        server.abort();
    }

    /// A manager acting for some shards asks a worker for their tasks only; one alone
    /// (every shard) asks for every task.
    #[tokio::test]
    async fn a_follower_asks_for_its_managers_shards_only() {
        for (scope, asked) in [
            (
                cube_types::shard::ShardScope::of(16, [0, 1, 2, 9]),
                Some("ring=16&shards=0-2,9"),
            ),
            (cube_types::shard::ShardScope::all(16), None),
        ] {
            let queries: Arc<Mutex<Vec<String>>> = Arc::default();
            let seen = queries.clone();
            let worker = axum::Router::new().route(
                "/tasks",
                axum::routing::get(move |query: axum::extract::RawQuery| {
                    let seen = seen.clone();
                    async move {
                        let query = query.0.unwrap_or_default();
                        lock(&seen).push(query.clone());
                        if !query.contains("wait=0ms") {
                            tokio::time::sleep(Duration::from_secs(60)).await;
                        }
                        ([(cube_api::INDEX_HEADER, "0")], "[]")
                    }
                }),
            );
            let (address, server) = serve(worker).await;
            let mut config = crate::manager::test_config();
            config.shards = scope;
            let manager =
                crate::manager::manager_on(config, crate::cluster::ManagerStores::in_memory());
            crate::manager::join_test_node_at(&manager, "w1", 1 << 30, &address).await;
            let deadline = Instant::now() + Duration::from_secs(10);
            while lock(&queries).len() < 2 {
                assert!(Instant::now() < deadline, "{:?}", lock(&queries));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            for query in lock(&queries).iter() {
                match asked {
                    Some(asked) => assert!(query.starts_with(asked), "{query}"),
                    None => assert!(!query.contains("shards"), "{query}"),
                }
            }
            manager.shutdown.cancel();
            server.abort();
        }
    }

    #[tokio::test]
    async fn a_running_task_its_worker_no_longer_lists_fails_with_its_end_recorded() {
        let manager = crate::manager::manager_for_tests();
        crate::manager::join_test_node(&manager, "w1", 1 << 30).await;
        let id = crate::manager::placed_test_task(&manager).await;
        manager
            .cluster
            .with_writes(|writes| {
                let mut state = lock(&manager.cluster.state);
                let mut task = state.cache.get(&id).unwrap().clone();
                task.move_to(State::Running).unwrap();
                manager.cluster.save(&mut state, writes, task)
            })
            .await
            .unwrap();
        // The worker's whole list, without the task: its store was lost.
        manager.followers.observe("w1", Vec::new(), true).await;
        let failed = manager.task(id).unwrap();
        assert_eq!(failed.status.state, State::Failed);
        assert!(failed.status.run.finish_time.is_some(), "{failed:?}");
        let reason = failed.status.run.error.clone().unwrap_or_default();
        assert!(reason.contains("no longer has this task"), "{reason}");
        let entry = failed.status.history.last().unwrap();
        assert_eq!(
            (entry.event.as_ref(), entry.message.as_str()),
            ("Failed", reason.as_str()),
            "the end is in the history: {:?}",
            failed.status.history
        );
        manager.shutdown.cancel();
    }

    #[tokio::test]
    async fn alone_on_a_memory_store_followers_store_what_a_worker_reports_and_fail_what_it_lost() {
        // No `Manager`: a cluster read from memory stores holding a task placed on node w1.
        let stores = crate::cluster::ManagerStores::in_memory();
        let mut placed = Task::new("web", "cube-sample:latest");
        placed.status.node_name = "w1".into();
        placed.move_to(State::Scheduled).unwrap();
        let id = placed.id;
        stores.tasks.put(&id.to_string(), &placed).unwrap();
        let cluster = crate::cluster::cluster_for_tests(stores, Duration::from_secs(60));
        crate::cluster::report_test_node(&cluster, "w1", std::time::Instant::now());
        let followers = Followers::new(cluster.clone(), CancellationToken::new());
        let stored = || {
            cluster
                .stores
                .tasks
                .get(&id.to_string())
                .unwrap()
                .expect("the task is stored")
        };
        // The worker lists it running: the manager stores that, durably.
        let mut running = placed.clone();
        running.move_to(State::Running).unwrap();
        running.status.run.container_id = "c0ffee".to_string();
        let super::Observed {
            strays, forgotten, ..
        } = followers.observe("w1", vec![running], true).await;
        assert!(strays.is_empty() && forgotten.is_empty());
        let seen = stored();
        assert_eq!(seen.status.state, State::Running);
        assert_eq!(seen.status.run.container_id, "c0ffee");
        // Its whole list without the task: the worker lost it, and it fails with its end
        // recorded.
        followers.observe("w1", Vec::new(), true).await;
        let failed = stored();
        assert_eq!(failed.status.state, State::Failed);
        assert!(failed.status.run.finish_time.is_some(), "{failed:?}");
        let reason = failed.status.run.error.clone().unwrap_or_default();
        assert!(reason.contains("no longer has this task"), "{reason}");
        assert_eq!(
            failed
                .status
                .history
                .last()
                .map(|entry| entry.event.as_ref()),
            Some("Failed")
        );
        // A report from another node of a task placed on w1 moves nothing.
        let mut elsewhere = failed.clone();
        elsewhere.status.node_name = "w2".into();
        elsewhere.status.state = State::Running;
        followers.observe("w2", vec![elsewhere], false).await;
        assert_eq!(stored().status.state, State::Failed);
    }

    /// Managers sharing etcd each follow every worker: a manager holding half of the ring
    /// leaves alone what a worker runs for a project of the other half (its owner placed it),
    /// and stops a run it does not know of a project of its own half.
    #[tokio::test]
    async fn a_task_of_a_shard_the_manager_does_not_hold_is_not_its_stray() {
        use cube_types::shard::{DEFAULT_RING, ShardScope, shard_of};
        let mut config = crate::manager::test_config();
        config.shards = ShardScope::of(DEFAULT_RING, 0..DEFAULT_RING / 2);
        let manager =
            crate::manager::manager_on(config, crate::cluster::ManagerStores::in_memory());
        crate::manager::join_test_node(&manager, "w1", 1 << 30).await;
        let project_in = |held: bool| {
            (0..)
                .map(|n| format!("team-{n}"))
                .find(|project| (shard_of(project, DEFAULT_RING) < DEFAULT_RING / 2) == held)
                .unwrap()
        };
        let running_of = |project: String, state: State| {
            let mut task = Task::new("web", "cube-sample:latest");
            task.spec.project = project;
            task.status.node_name = "w1".into();
            task.status.state = state;
            task
        };
        let others = running_of(project_in(false), State::Running);
        let ended_others = running_of(project_in(false), State::Completed);
        let unknown_own = running_of(project_in(true), State::Running);
        let super::Observed {
            strays, forgotten, ..
        } = manager
            .followers
            .observe(
                "w1",
                vec![others.clone(), ended_others, unknown_own.clone()],
                true,
            )
            .await;
        assert_eq!(
            strays,
            vec![(unknown_own.id, 0)],
            "only the unknown run of its own shard"
        );
        assert!(forgotten.is_empty(), "{forgotten:?}");
        assert!(manager.task(others.id).is_err(), "nor is it taken in");
        manager.shutdown.cancel();
    }

    #[tokio::test]
    async fn followers_of_dead_nodes_do_not_keep_the_complete_list_permits_while_they_wait() {
        // Two nodes whose address refuses every connection: each follower's request fails at
        // once and it waits a second before the next. A live node that joins meanwhile must
        // find the permits free, not held by the two that wait.
        let manager = crate::manager::manager_for_tests();
        for name in ["dead1", "dead2"] {
            crate::manager::join_test_node(&manager, name, 1 << 30).await;
        }
        let first_failures = tokio::time::Instant::now();
        for at in [300, 500, 700] {
            tokio::time::sleep_until(first_failures + Duration::from_millis(at)).await;
            assert_eq!(
                manager.followers.complete_lists.available_permits(),
                COMPLETE_LISTS_AT_ONCE,
                "{at} ms in, while both followers wait to try again"
            );
        }
        manager.shutdown.cancel();
    }

    #[test]
    fn a_running_task_the_manager_never_placed_is_a_stray_and_an_ended_one_is_not() {
        let mut observed = Task::new("behind-the-back", "img");
        observed.status.node_name = "w1".into();
        for state in [State::Scheduled, State::Running] {
            observed.status.state = state;
            assert!(is_stray(None, &observed, "w1"), "{state} and unknown");
        }
        for state in [State::Completed, State::Failed] {
            observed.status.state = state;
            assert!(
                !is_stray(None, &observed, "w1"),
                "{state}: ended, it is purged instead"
            );
        }
        // The manager's own task, placed there and running: not a stray.
        observed.status.state = State::Running;
        let known = observed.clone();
        assert!(!is_stray(Some(&known), &observed, "w1"));
        // The same task reported by another node: a stray there.
        assert!(is_stray(Some(&known), &observed, "w2"));
    }
}
