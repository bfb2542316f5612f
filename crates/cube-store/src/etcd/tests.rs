//! The etcd store against real etcd processes (`cube-test-support` starts them): the
//! contract every store keeps, on one member and on three, then what only a distributed
//! store meets — a member killed, changes compacted away, writes fenced.

use std::sync::Arc;
use std::time::Duration;

use cube_test_support::EtcdCluster;
use etcd_client::{Client, CompactionOptions, GetOptions};

use super::*;
use crate::contract;

/// How long a test waits for a state it expects (a new leader) before failing: generous, as
/// it checks that the state comes, not how soon.
const STATE_BOUND: Duration = Duration::from_secs(20);
/// A lease that outlasts every wait in these tests, so that an end of leadership seen while
/// it is held cannot be its expiry.
const LONG_TTL: Duration = Duration::from_secs(60);

fn connect(cluster: &EtcdCluster, prefix: &str) -> EtcdDb {
    EtcdDb::connect(EtcdConfig::new(cluster.endpoints(), prefix)).unwrap()
}

fn store(cluster: &EtcdCluster, prefix: &str, table: &str) -> EtcdStore<String> {
    EtcdStore::new(connect(cluster, prefix), table).unwrap()
}

/// A plain etcd client, apart from the store, to look at what etcd holds.
fn outside_client(cluster: &EtcdCluster) -> (tokio::runtime::Runtime, Client) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let endpoints: Vec<String> = cluster
        .endpoints()
        .iter()
        .map(|endpoint| format!("http://{endpoint}"))
        .collect();
    let client = runtime.block_on(Client::connect(endpoints, None)).unwrap();
    (runtime, client)
}

fn text(value: &str) -> String {
    value.to_string()
}

/// Each contract check on its own prefix, one after another: etcd's revision is the
/// cluster's, so the checks count from where the last left it.
fn keeps_the_contract(cluster: &EtcdCluster) {
    contract::behaves_like_a_store(&store(cluster, "/contract/book", "things"));
    contract::keeps_revisions_and_can_be_watched(&store(cluster, "/contract/revisions", "things"));
    contract::racing_put_ifs_win_once_per_revision(&store(cluster, "/contract/race", "things"));
    contract::a_slow_watcher_is_dropped_not_waited_for(&store(cluster, "/contract/slow", "things"));
    let unwatched =
        EtcdStore::unwatched(connect(cluster, "/contract/unwatched"), "things").unwrap();
    contract::behaves_like_a_store(&unwatched);
    contract::keeps_no_change_for_a_watch_from_the_past(&unwatched);
}

#[test]
fn an_etcd_store_on_one_member_keeps_the_store_contract() {
    keeps_the_contract(&EtcdCluster::start(1));
}

#[test]
fn an_etcd_store_on_three_members_keeps_the_store_contract() {
    keeps_the_contract(&EtcdCluster::start(3));
}

#[test]
fn an_acknowledged_write_is_in_etcd_under_the_prefix_one_key_per_value() {
    let cluster = EtcdCluster::start(1);
    let tasks = store(&cluster, "/cube", "tasks");
    tasks.put("t1", &text("running")).unwrap();
    tasks.put("t2", &text("pending")).unwrap();
    let (runtime, mut client) = outside_client(&cluster);
    let response = runtime
        .block_on(client.get("/cube/", Some(GetOptions::new().with_prefix())))
        .unwrap();
    let held: Vec<(String, String)> = response
        .kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap().to_string(),
                kv.value_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        held,
        vec![
            (text("/cube/tasks/t1"), text("\"running\"")),
            (text("/cube/tasks/t2"), text("\"pending\"")),
        ]
    );
}

/// A table of more keys than one page is listed whole, in key order, with each value and
/// its revision, as of one revision, and nothing of a table whose name begins the same.
#[test]
fn a_table_of_several_pages_is_listed_whole_at_one_revision() {
    let cluster = EtcdCluster::start(1);
    let things = store(&cluster, "/pages", "things");
    let neighbours = store(&cluster, "/pages", "things2");
    let count = 2 * super::PAGE as usize + 17;
    let commits: Vec<_> = (0..count)
        .map(|n| {
            things
                .put_queued(&format!("{n:05}"), &format!("value {n}"))
                .unwrap()
        })
        .collect();
    for commit in commits {
        commit.wait().unwrap();
    }
    neighbours.put("00001", &text("not a thing")).unwrap();
    let listing = things.list_with_revision().unwrap();
    assert_eq!(listing.entries.len(), count);
    for (n, (key, value, changed_at)) in listing.entries.iter().enumerate() {
        assert_eq!(key, &format!("{n:05}"));
        assert_eq!(value, &format!("value {n}"));
        assert!(*changed_at > 0 && *changed_at <= listing.revision);
    }
    // The listing's revision is the last write to it: a write after is not in it.
    things.put("zzzzz", &text("later")).unwrap();
    assert!(things.revision().unwrap() > listing.revision);
    assert_eq!(things.list().unwrap().len(), count + 1);
}

#[test]
fn two_stores_on_one_prefix_see_each_others_writes_through_their_watches() {
    let cluster = EtcdCluster::start(1);
    let first = store(&cluster, "/shared", "tasks");
    let second = store(&cluster, "/shared", "tasks");
    let listing = second.list_with_revision().unwrap();
    let mut watch = second.watch("", listing.revision).unwrap();
    let revision = first.put("t1", &text("from the first")).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let change = runtime
        .block_on(async { tokio::time::timeout(Duration::from_secs(10), watch.next()).await })
        .expect("the other store's write arrives")
        .unwrap();
    assert_eq!(
        change,
        crate::Change::Put {
            key: text("t1"),
            value: text("from the first"),
            revision
        }
    );
    assert_eq!(second.get("t1").unwrap(), Some(text("from the first")));
}

#[test]
fn a_killed_member_is_skipped_and_the_watch_goes_on_from_another() {
    let mut cluster = EtcdCluster::start(3);
    let tasks = Arc::new(store(&cluster, "/failover", "tasks"));
    tasks.put("before", &text("one")).unwrap();
    let mut watch = tasks.watch("", tasks.revision().unwrap()).unwrap();
    // The store asks member 0 first, and its feed watches there: kill it.
    cluster.kill(0);
    for n in 0..20 {
        tasks.put(&format!("after-{n}"), &n.to_string()).unwrap();
    }
    assert_eq!(tasks.get("after-19").unwrap(), Some(text("19")));
    assert_eq!(tasks.count().unwrap(), 21);
    let keys: Vec<String> = (0..20)
        .map(|_| {
            watch
                .try_next()
                .expect("delivered before the writer heard")
                .unwrap()
        })
        .map(|change| change.key().to_string())
        .collect();
    assert_eq!(keys.first().map(String::as_str), Some("after-0"));
    assert_eq!(keys.last().map(String::as_str), Some("after-19"));
}

#[test]
fn changes_compacted_before_the_store_saw_them_end_every_watch_with_a_lost_sync() {
    let cluster = EtcdCluster::start(1);
    let writer = store(&cluster, "/compacted", "tasks");
    let start = writer.revision().unwrap();
    for n in 0..5 {
        writer.put("k", &n.to_string()).unwrap();
    }
    let (runtime, mut client) = outside_client(&cluster);
    let now = writer.revision().unwrap();
    runtime
        .block_on(client.compact(
            i64::try_from(now).unwrap(),
            Some(CompactionOptions::new().with_physical()),
        ))
        .unwrap();
    // A store whose feed starts before the compaction: it cannot follow, and says so.
    let late = EtcdStore::<String>::new(
        EtcdDb::connect_from(
            EtcdConfig::new(cluster.endpoints(), "/compacted"),
            Some(start),
        )
        .unwrap(),
        "tasks",
    )
    .unwrap();
    let mut watch = late.watch("", start).unwrap();
    let ended = runtime
        .block_on(async { tokio::time::timeout(Duration::from_secs(10), watch.next()).await })
        .expect("the watch ends")
        .unwrap_err();
    assert!(ended.needs_relist(), "{ended}");
    // The lost sync is followed by a fresh list, and a watch from it goes on.
    let listing = late.list_with_revision().unwrap();
    assert_eq!(listing.entries, vec![(text("k"), text("4"), now)]);
    let mut relisted = late.watch("", listing.revision).unwrap();
    writer.put("k", &text("5")).unwrap();
    let change = runtime
        .block_on(async { tokio::time::timeout(Duration::from_secs(10), relisted.next()).await })
        .expect("the next change arrives")
        .unwrap();
    assert_eq!(change.key(), "k");
}

#[test]
fn a_fenced_store_writes_only_while_its_key_is_the_one_it_holds() {
    let cluster = EtcdCluster::start(1);
    let db = connect(&cluster, "/fenced");
    let tasks = EtcdStore::<String>::new(db.clone(), "tasks").unwrap();
    let leader = EtcdStore::<String>::new(db.clone(), "leader").unwrap();
    let held_at = leader.put("key", &text("me")).unwrap();
    let refused_token = db.set_fence(Some(Fence::one(
        "/fenced/leader/key",
        i64::try_from(held_at).unwrap(),
    )));
    tasks.put("t1", &text("written while leading")).unwrap();
    assert!(
        tasks
            .put_if("t2", &text("also"), Expected::Absent)
            .unwrap()
            .is_ok()
    );
    assert_eq!(
        tasks
            .put_if("t2", &text("again"), Expected::Absent)
            .unwrap(),
        Err(crate::Conflict {
            current: Some(held_at + 2)
        }),
        "a conflict is still a conflict under a fence"
    );

    // Another takes the key (deleted, created again): every write is refused.
    let another = store(&cluster, "/fenced", "leader");
    assert!(another.delete("key").unwrap());
    another.put("key", &text("someone else")).unwrap();
    let refused = tasks.put("t3", &text("from a deposed leader")).unwrap_err();
    assert!(matches!(refused, StoreError::Fenced { .. }), "{refused}");
    let refused = tasks
        .put_if("t4", &text("from a deposed leader"), Expected::Absent)
        .unwrap_err();
    assert!(matches!(refused, StoreError::Fenced { .. }), "{refused}");
    assert_eq!(tasks.get("t3").unwrap(), None);
    assert!(refused_token.is_cancelled(), "the refusal is told");

    let _ = db.set_fence(None);
    tasks.put("t3", &text("unfenced")).unwrap();
}

#[test]
fn an_unreachable_cluster_is_an_error_that_names_it() {
    let config = EtcdConfig {
        attempt_timeout: Duration::from_millis(200),
        request_timeout: Duration::from_millis(600),
        ..EtcdConfig::new(vec!["127.0.0.1:1".to_string()], "/cube")
    };
    let err = EtcdDb::connect(config).err().unwrap().to_string();
    assert!(err.contains("127.0.0.1:1"), "{err}");
    assert!(err.contains("did not answer"), "{err}");
}

#[test]
fn one_campaign_leads_another_takes_over_when_the_lease_ends_and_the_first_is_fenced() {
    let cluster = EtcdCluster::start(3);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let first = connect(&cluster, "/elect");
    let second = connect(&cluster, "/elect");
    let tasks = EtcdStore::<String>::new(first.clone(), "tasks").unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let ttl = Duration::from_secs(2);
    runtime.block_on(async {
        let leading = first
            .campaign("first:5555", ttl, &shutdown)
            .await
            .unwrap()
            .unwrap();
        let refused = first.set_fence(Some(leading.fence().clone()));
        assert_eq!(
            second.leader().await.unwrap().as_deref(),
            Some("first:5555")
        );
        tasks.put("t1", &text("while leading")).unwrap();

        // The second waits while the first renews its lease. It campaigns with a lease far
        // longer than any wait below, so that its resigning, at the end, is seen to hand over
        // without the lease running out.
        let waiting = tokio::spawn({
            let (second, shutdown) = (second.clone(), shutdown.clone());
            async move { second.campaign("second:5555", LONG_TTL, &shutdown).await }
        });
        tokio::time::sleep(ttl * 2).await;
        assert!(!waiting.is_finished(), "the first still leads");

        // The first stops renewing (as a process that died): once its lease ends the second
        // leads, and the first's writes are refused. How soon after the TTL is a measurement
        // (`cube-bench etcd`), not asserted here, where the machine runs other tests too.
        drop(leading);
        let taken = tokio::time::timeout(STATE_BOUND, waiting)
            .await
            .expect("the second leads once the first's lease ends")
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(
            first.leader().await.unwrap().as_deref(),
            Some("second:5555")
        );
        let err = tasks.put("t2", &text("from the deposed")).unwrap_err();
        assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
        assert!(refused.is_cancelled());

        let third = connect(&cluster, "/elect");
        let waiting = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { third.campaign("third:5555", ttl, &shutdown).await }
        });
        // Resigning hands over at once: the bound is generous, yet far short of the second's
        // lease, which a resignation that did nothing would leave the third waiting out.
        taken.resign().await;
        tokio::time::timeout(STATE_BOUND, waiting)
            .await
            .expect("the third leads before the second's lease would have ended")
            .unwrap()
            .unwrap()
            .unwrap();
    });
}

#[tokio::test]
async fn leased_keys_are_created_once_deleted_only_by_their_holder_and_go_with_the_lease() {
    let cluster = EtcdCluster::start(1);
    let db = connect(&cluster, "/leased");
    let mine = db.grant_lease(LONG_TTL, "a test lease").await.unwrap();
    let theirs = db
        .grant_lease(Duration::from_secs(1), "a test lease")
        .await
        .unwrap();
    let created = db
        .create_if_absent("ring/shards/00001", b"mine".to_vec(), mine.id())
        .await
        .unwrap();
    assert!(created.is_some());
    assert_eq!(
        db.create_if_absent("ring/shards/00001", b"theirs".to_vec(), theirs.id())
            .await
            .unwrap(),
        None,
        "a key is created once"
    );
    db.create_if_absent("ring/shards/00002", b"theirs".to_vec(), theirs.id())
        .await
        .unwrap()
        .unwrap();
    // Only its holder deletes a key.
    assert!(
        !db.delete_if_held("ring/shards/00002", mine.id())
            .await
            .unwrap()
    );
    let (keys, revision) = db.read_prefix("ring/").await.unwrap();
    assert_eq!(
        keys.iter()
            .map(|key| (key.key.as_str(), key.lease))
            .collect::<Vec<_>>(),
        vec![
            ("ring/shards/00001", mine.id()),
            ("ring/shards/00002", theirs.id())
        ]
    );
    assert_eq!(keys[0].create_revision, created.unwrap());
    // A lease revoked takes its keys, and a waiter on the prefix wakes.
    let waiting = {
        let db = db.clone();
        tokio::spawn(async move {
            db.wait_for_change("ring/", revision, LONG_TTL, &CancellationToken::new())
                .await
        })
    };
    theirs.revoke().await;
    tokio::time::timeout(STATE_BOUND, waiting)
        .await
        .unwrap()
        .unwrap();
    let (keys, _) = db.read_prefix("ring/").await.unwrap();
    assert_eq!(keys.len(), 1);
    assert!(
        db.delete_if_held("ring/shards/00001", mine.id())
            .await
            .unwrap()
    );
    // The first to ask sets a value; later ones read it.
    assert_eq!(
        db.get_or_create("ring/size", b"16".to_vec()).await.unwrap(),
        b"16"
    );
    assert_eq!(
        db.get_or_create("ring/size", b"32".to_vec()).await.unwrap(),
        b"16"
    );
}
