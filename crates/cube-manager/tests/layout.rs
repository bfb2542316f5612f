//! Tasks and waiting-list entries an older Cube kept under plain keys in etcd, moved under
//! their shards (`layout.rs`) by several managers starting at once: real etcd.

use std::collections::BTreeSet;

use cube_manager::layout::{KeyLayout, move_to_shards};
use cube_store::{EtcdConfig, EtcdDb, EtcdStore, Store};
use cube_test_support::EtcdCluster;
use cube_types::queue::{QueueEntry, QueueState, RequestKind};
use cube_types::task::Task;

fn entry(task: &Task, number: u64) -> QueueEntry {
    QueueEntry {
        id: task.id.to_string(),
        kind: RequestKind::Task,
        queue: number,
        priority: 50,
        owner: "tester".to_string(),
        project: task.spec.project.clone(),
        state: QueueState::Claimed,
        since: None,
        version: None,
        request: serde_json::Value::Null,
        reason: String::new(),
        services: Vec::new(),
    }
}

/// Every key of `store`, in order.
fn keys<V: serde::Serialize + serde::de::DeserializeOwned + Send + 'static>(
    store: &EtcdStore<V>,
) -> Vec<String> {
    store
        .list_with_revision()
        .unwrap()
        .entries
        .into_iter()
        .map(|(key, _, _)| key)
        .collect()
}

#[test]
fn three_managers_moving_the_same_plain_records_at_once_leave_each_under_its_shard_once() {
    let cluster = EtcdCluster::start(1);
    let prefix = format!("/layout-{}", uuid::Uuid::new_v4().simple());
    let db = || EtcdDb::connect(EtcdConfig::new(cluster.endpoints(), &prefix)).unwrap();
    let (tasks, queue) = (
        EtcdStore::<Task>::new(db(), "tasks").unwrap(),
        EtcdStore::<QueueEntry>::new(db(), "queue").unwrap(),
    );
    // 300 tasks in 7 projects (and `default`), each with its entry, under plain keys as an
    // older Cube wrote them.
    let mut written = Vec::new();
    for n in 0..300u64 {
        let mut task = Task::new(format!("old-{n}"), "cube-sample:latest");
        if n % 8 != 0 {
            task.spec.project = format!("team-{}", n % 8);
        }
        tasks.put(&task.id.to_string(), &task).unwrap();
        queue
            .put(&format!("task/{}", task.id), &entry(&task, n))
            .unwrap();
        written.push(task);
    }
    let layout = KeyLayout::Sharded { ring: 16 };
    let moved: Vec<_> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..3)
            .map(|_| {
                scope.spawn(|| {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    let (db, tasks, queue) = (
                        db(),
                        EtcdStore::<Task>::new(db(), "tasks").unwrap(),
                        EtcdStore::<QueueEntry>::new(db(), "queue").unwrap(),
                    );
                    runtime
                        .block_on(move_to_shards(&db, &tasks, &queue, layout))
                        .unwrap()
                })
            })
            .collect();
        runs.into_iter().map(|run| run.join().unwrap()).collect()
    });
    // Each run saw every record under its plain key (they read at about the same time) or
    // fewer (another had moved some); none failed.
    assert!(
        moved
            .iter()
            .all(|moved| moved.tasks <= 300 && moved.queue <= 300)
    );

    let want_tasks: BTreeSet<String> = written.iter().map(|task| layout.task_of(task)).collect();
    let want_queue: BTreeSet<String> = written
        .iter()
        .map(|task| layout.queue(&task.spec.project, &format!("task/{}", task.id)))
        .collect();
    let now_tasks = keys(&tasks);
    let now_queue = keys(&queue);
    assert_eq!(now_tasks.len(), 300, "each task once");
    assert_eq!(now_queue.len(), 300, "each entry once");
    assert_eq!(now_tasks.into_iter().collect::<BTreeSet<_>>(), want_tasks);
    assert_eq!(now_queue.into_iter().collect::<BTreeSet<_>>(), want_queue);
    // Each under its project's shard, read back whole by the shard's prefix.
    let shard = cube_types::shard::shard_of("team-3", 16);
    let mut under = Vec::new();
    tasks
        .scan_prefix(&format!("{shard:04}/"), &mut |task: Task| under.push(task))
        .unwrap();
    assert!(under.iter().any(|task| task.spec.project == "team-3"));
    assert!(under.iter().all(|task| cube_types::shard::shard_of(
        cube_types::project::name_or_default(&task.spec.project),
        16
    ) == shard));

    // A record written under its shard key since is not replaced by a late move of its old
    // copy: the old copy only goes.
    let mut newer = written[5].clone();
    newer.name = "renamed-after-the-move".to_string();
    tasks.put(&layout.task_of(&newer), &newer).unwrap();
    tasks.put(&newer.id.to_string(), &written[5]).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let again = runtime
        .block_on(move_to_shards(&db(), &tasks, &queue, layout))
        .unwrap();
    assert_eq!(again.tasks, 1);
    assert_eq!(again.queue, 0);
    assert_eq!(keys(&tasks).len(), 300);
    assert_eq!(
        tasks.get(&layout.task_of(&newer)).unwrap().unwrap().name,
        "renamed-after-the-move"
    );
}
