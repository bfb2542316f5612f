//! Writes conditioned on quiet prefixes (`EtcdDb::write_if_quiet`) on a real etcd
//! (`cube-test-support` starts it): a writer that read every key under a prefix at some
//! revision writes only if no key under it changed since, one comparison however many keys
//! the prefix holds; refused, it is told every key under the prefix as it is now, and plans
//! again on that.

use std::time::Duration;

use cube_store::{EtcdConfig, EtcdDb, Fence, Optimistic, Quiet, StoreError, Versioned};
use cube_test_support::EtcdCluster;

/// A lease that outlasts every test here, so that no key goes for its expiry.
const LONG_TTL: Duration = Duration::from_secs(60);

/// etcd's default `--max-txn-ops`, which the test cluster keeps: the most comparisons (and
/// the most operations of either branch) one transaction takes.
const MAX_TXN_OPS: usize = 128;

const N1: &str = "claims/n1/";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn connect(cluster: &EtcdCluster) -> EtcdDb {
    EtcdDb::connect(EtcdConfig::new(cluster.endpoints(), "/cube")).unwrap()
}

fn quiet(prefix: &str, revision: i64) -> Quiet {
    Quiet {
        prefix: prefix.to_string(),
        revision,
    }
}

fn put(key: &str, value: &str) -> Vec<(String, Option<Vec<u8>>)> {
    vec![(key.to_string(), Some(value.as_bytes().to_vec()))]
}

/// Writes (or, with `None`, deletes) `key` unconditionally: another writer's change.
async fn change(db: &EtcdDb, key: &str, value: Option<&str>) -> i64 {
    let written = db
        .write_if_quiet(
            &[],
            vec![(
                key.to_string(),
                value.map(|value| value.as_bytes().to_vec()),
            )],
            None,
        )
        .await
        .unwrap();
    match written {
        Optimistic::Committed { revision } => revision,
        other => panic!("an unconditional write is not refused, got {other:?}"),
    }
}

/// Writes `key` = `value` if nothing under `prefix` was written after `revision`.
async fn write_quiet(
    db: &EtcdDb,
    prefix: &str,
    revision: i64,
    key: &str,
    value: &str,
) -> Optimistic {
    db.write_if_quiet(&[quiet(prefix, revision)], put(key, value), None)
        .await
        .unwrap()
}

fn committed(written: &Optimistic) -> i64 {
    match written {
        Optimistic::Committed { revision } => *revision,
        other => panic!("expected the write to commit, got {other:?}"),
    }
}

fn changed(written: Optimistic) -> Vec<Versioned> {
    match written {
        Optimistic::Changed { now } => now,
        other => panic!("expected the write to be refused as changed, got {other:?}"),
    }
}

fn keys(read: &[Versioned]) -> Vec<&str> {
    read.iter().map(|read| read.key.as_str()).collect()
}

#[test]
fn the_second_of_two_writers_quiet_on_the_same_read_is_refused_and_commits_on_what_it_is_told() {
    let cluster = EtcdCluster::start(1);
    let runtime = runtime();
    let db = connect(&cluster);
    let other = connect(&cluster);
    runtime.block_on(async {
        // A key elsewhere, so that the store's revision is not the prefix's first.
        change(&db, "tasks/t1", Some("a task")).await;
        let (first_read, first_at) = db.read_versioned(N1).await.unwrap();
        let (second_read, second_at) = other.read_versioned(N1).await.unwrap();
        assert!(first_read.is_empty() && second_read.is_empty());
        assert_eq!(first_at, second_at, "both read at the same revision");

        let first = write_quiet(&db, N1, first_at, "claims/n1/00001", "first").await;
        let first_revision = committed(&first);
        assert!(first_revision > first_at);

        let second = write_quiet(&other, N1, second_at, "claims/n1/00002", "second").await;
        let now = changed(second);
        assert_eq!(
            now,
            [Versioned {
                key: "claims/n1/00001".to_string(),
                value: b"first".to_vec(),
                mod_revision: first_revision,
            }],
            "the refusal tells the key the first wrote, as it is now"
        );
        let (read, _) = db.read_versioned(N1).await.unwrap();
        assert_eq!(keys(&read), ["claims/n1/00001"], "the second wrote nothing");

        // Retrying at the revision of what it was told (every key under the prefix, so the
        // newest of them is a revision up to which it knows the prefix) commits.
        let known = now.iter().map(|read| read.mod_revision).max().unwrap();
        let retried = write_quiet(&other, N1, known, "claims/n1/00002", "second").await;
        let second_revision = committed(&retried);

        // And the first, still at its own old read, is refused in turn; a fresh read's
        // revision lets it through.
        let stale = write_quiet(&db, N1, first_at, "claims/n1/00003", "third").await;
        let now = changed(stale);
        assert_eq!(keys(&now), ["claims/n1/00001", "claims/n1/00002"]);
        assert_eq!(now[1].mod_revision, second_revision);
        assert_eq!(now[1].value, b"second");
        let (_, fresh_at) = db.read_versioned(N1).await.unwrap();
        let third = write_quiet(&db, N1, fresh_at, "claims/n1/00003", "third").await;
        committed(&third);
        let (read, _) = db.read_versioned(N1).await.unwrap();
        assert_eq!(
            keys(&read),
            ["claims/n1/00001", "claims/n1/00002", "claims/n1/00003"]
        );
    });
}

#[test]
fn a_change_under_another_prefix_or_a_longer_node_name_does_not_refuse_the_write() {
    let cluster = EtcdCluster::start(1);
    let runtime = runtime();
    let db = connect(&cluster);
    runtime.block_on(async {
        change(&db, "claims/n1/00001", Some("held")).await;
        let (_, read_at) = db.read_versioned(N1).await.unwrap();

        // Another node's claims, and a node whose name starts with `n1`: neither is under
        // `claims/n1/`.
        change(&db, "claims/n2/00001", Some("another node")).await;
        change(&db, "claims/n10/00001", Some("a longer node name")).await;
        // And a key that sorts right after the prefix's range (`/` + 1 is `0`).
        change(&db, "claims/n10", Some("just past the prefix")).await;

        let written = write_quiet(&db, N1, read_at, "claims/n1/00002", "mine").await;
        committed(&written);

        // Quiet on two prefixes, one of them changed: refused, and told only what is under
        // the two prefixes (not `claims/n10/`, nor `claims/n2/` beyond its own key).
        let (_, both_at) = db.read_versioned("claims/").await.unwrap();
        let n2_revision = change(&db, "claims/n2/00002", Some("another again")).await;
        change(&db, "claims/n10/00002", Some("longer again")).await;
        let refused = db
            .write_if_quiet(
                &[quiet(N1, both_at), quiet("claims/n2/", both_at)],
                put("claims/n1/00003", "mine"),
                None,
            )
            .await
            .unwrap();
        let now = changed(refused);
        assert_eq!(
            keys(&now),
            [
                "claims/n1/00001",
                "claims/n1/00002",
                "claims/n2/00001",
                "claims/n2/00002"
            ],
            "the keys of each prefix, in the order of the prefixes"
        );
        assert_eq!(now[3].mod_revision, n2_revision);
        assert!(
            db.read_versioned("claims/n1/00003")
                .await
                .unwrap()
                .0
                .is_empty()
        );
    });
}

#[test]
fn an_empty_prefix_is_quiet() {
    let cluster = EtcdCluster::start(1);
    let runtime = runtime();
    let db = connect(&cluster);
    runtime.block_on(async {
        // Keys around the prefix, none under it.
        change(&db, "claims/n0/00001", Some("before")).await;
        change(&db, "claims/n2/00001", Some("after")).await;
        let (read, read_at) = db.read_versioned(N1).await.unwrap();
        assert!(read.is_empty());
        // etcd compares an empty range as one key at revision 0, which is older than any
        // revision given: the prefix is quiet, even at revision 0 (never read at all).
        for revision in [read_at, 0] {
            let written =
                write_quiet(&db, "claims/n9/", revision, "claims/n9/00001", "first").await;
            committed(&written);
            change(&db, "claims/n9/00001", None).await;
        }
    });
}

/// etcd compares `mod_revision` over the keys that exist: a key deleted after the revision
/// leaves nothing behind to compare, so the deletion alone does NOT refuse a quiet write
/// (though `Quiet`'s documentation says it should: "nor been created or deleted since").
/// Neither does a key created and deleted again since. A writer that must see deletions
/// has to compare something that remains (the keys it read, by `write_if_unchanged`, or a
/// counter key bumped with each deletion).
#[test]
fn a_deletion_under_the_prefix_does_not_refuse_the_write() {
    let cluster = EtcdCluster::start(1);
    let runtime = runtime();
    let db = connect(&cluster);
    runtime.block_on(async {
        change(&db, "claims/n1/00001", Some("one")).await;
        change(&db, "claims/n1/00002", Some("two")).await;
        let (read, read_at) = db.read_versioned(N1).await.unwrap();
        assert_eq!(keys(&read), ["claims/n1/00001", "claims/n1/00002"]);

        let deleted_at = change(&db, "claims/n1/00001", None).await;
        assert!(deleted_at > read_at);
        let written = write_quiet(&db, N1, read_at, "claims/n1/00003", "after a deletion").await;
        let written_at = committed(&written);

        // Created and deleted again after the read: not seen either.
        change(&db, "claims/n1/00004", Some("briefly")).await;
        change(&db, "claims/n1/00004", None).await;
        let written =
            write_quiet(&db, N1, written_at, "claims/n1/00005", "after a brief key").await;
        committed(&written);

        // A refusal (a key modified) tells the keys that remain, not the deleted ones.
        let (_, last_at) = db.read_versioned(N1).await.unwrap();
        change(&db, "claims/n1/00002", None).await;
        let modified_at = change(&db, "claims/n1/00003", Some("modified")).await;
        let refused = write_quiet(&db, N1, last_at, "claims/n1/00006", "refused").await;
        let now = changed(refused);
        assert_eq!(keys(&now), ["claims/n1/00003", "claims/n1/00005"]);
        assert_eq!(now[0].mod_revision, modified_at);
        assert_eq!(now[0].value, b"modified");
    });
}

#[test]
fn a_write_whose_fence_key_was_deleted_is_fenced_and_writes_nothing() {
    let cluster = EtcdCluster::start(1);
    let runtime = runtime();
    let db = connect(&cluster);
    let other = connect(&cluster);
    runtime.block_on(async {
        let lease = db.grant_lease(LONG_TTL, "the test's shard").await.unwrap();
        let created_at = db
            .create_if_absent("ring/shards/00001", b"mine".to_vec(), lease.id())
            .await
            .unwrap()
            .expect("the shard is free");
        let fence = Fence::one(
            db.fence_key("ring/shards/00001", created_at).key,
            created_at,
        );
        let (_, read_at) = db.read_versioned(N1).await.unwrap();
        let written = db
            .write_if_quiet(
                &[quiet(N1, read_at)],
                put("claims/n1/00001", "while held"),
                Some(&fence),
            )
            .await
            .unwrap();
        let held_at = committed(&written);

        // Another deletes the key (its lease ended, and the holder is someone else now).
        assert!(
            other
                .delete_if_held("ring/shards/00001", lease.id())
                .await
                .unwrap()
        );
        let err = db
            .write_if_quiet(
                &[quiet(N1, held_at)],
                put("claims/n1/00002", "after the shard went"),
                Some(&fence),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(&err, StoreError::Fenced { key } if key == "/cube/ring/shards/00001"),
            "{err:?}"
        );

        // The prefix changed too (and the key was created again by another): still fenced,
        // not a change to plan again on.
        let other_lease = other
            .grant_lease(LONG_TTL, "the other's shard")
            .await
            .unwrap();
        other
            .create_if_absent("ring/shards/00001", b"theirs".to_vec(), other_lease.id())
            .await
            .unwrap()
            .expect("the shard is free again");
        change(&other, "claims/n1/00001", Some("moved by the other")).await;
        let err = db
            .write_if_quiet(
                &[quiet(N1, held_at)],
                put("claims/n1/00003", "on a stale read"),
                Some(&fence),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(&err, StoreError::Fenced { key } if key == "/cube/ring/shards/00001"),
            "{err:?}"
        );

        let (read, _) = db.read_versioned(N1).await.unwrap();
        assert_eq!(keys(&read), ["claims/n1/00001"], "nothing was written");
        assert_eq!(read[0].value, b"moved by the other");
        let (shard, _) = db.read_versioned("ring/shards/").await.unwrap();
        assert_eq!(shard[0].value, b"theirs");
    });
}

#[test]
fn more_prefixes_than_one_transaction_takes_is_an_error_naming_it() {
    let cluster = EtcdCluster::start(1);
    let runtime = runtime();
    let db = connect(&cluster);
    let prefixes = |count: usize, revision: i64| -> Vec<Quiet> {
        (0..count)
            .map(|node| quiet(&format!("claims/n{node:03}/"), revision))
            .collect()
    };
    runtime.block_on(async {
        change(&db, "claims/n000/00001", Some("one")).await;
        let (_, read_at) = db.read_versioned("claims/").await.unwrap();

        // As many as etcd takes: one comparison each, and one read each when refused.
        let written = db
            .write_if_quiet(
                &prefixes(MAX_TXN_OPS, read_at),
                put("claims/n001/00001", "at the most"),
                None,
            )
            .await
            .unwrap();
        committed(&written);
        let refused = db
            .write_if_quiet(
                &prefixes(MAX_TXN_OPS, read_at),
                put("claims/n002/00001", "refused"),
                None,
            )
            .await
            .unwrap();
        assert_eq!(
            keys(&changed(refused)),
            ["claims/n000/00001", "claims/n001/00001"]
        );

        // One more prefix, or a fence key on top of the most: refused before etcd is asked.
        let err = db
            .write_if_quiet(
                &prefixes(MAX_TXN_OPS + 1, read_at),
                put("claims/n002/00001", "too many"),
                None,
            )
            .await
            .unwrap_err();
        let StoreError::Etcd(message) = &err else {
            panic!("expected an error of the request, got {err:?}");
        };
        assert!(message.contains("129 quiet prefixes"), "{message}");
        assert!(message.contains("128"), "{message}");

        let lease = db.grant_lease(LONG_TTL, "the test's shard").await.unwrap();
        let created_at = db
            .create_if_absent("ring/shards/00001", b"mine".to_vec(), lease.id())
            .await
            .unwrap()
            .unwrap();
        let fence = Fence::all([db.fence_key("ring/shards/00001", created_at)]).unwrap();
        let err = db
            .write_if_quiet(
                &prefixes(MAX_TXN_OPS, read_at),
                put("claims/n002/00001", "too many with the fence"),
                Some(&fence),
            )
            .await
            .unwrap_err();
        let StoreError::Etcd(message) = &err else {
            panic!("expected an error of the request, got {err:?}");
        };
        assert!(
            message.contains("128 quiet prefixes and 1 fenced keys"),
            "{message}"
        );

        // Too many keys written is refused the same way.
        let puts: Vec<(String, Option<Vec<u8>>)> = (0..=MAX_TXN_OPS)
            .map(|index| (format!("claims/n003/{index:05}"), Some(b"x".to_vec())))
            .collect();
        let err = db
            .write_if_quiet(&prefixes(1, read_at), puts, None)
            .await
            .unwrap_err();
        let StoreError::Etcd(message) = &err else {
            panic!("expected an error of the request, got {err:?}");
        };
        assert!(message.contains("of 129 keys"), "{message}");

        let (read, _) = db.read_versioned("claims/").await.unwrap();
        assert_eq!(
            keys(&read),
            ["claims/n000/00001", "claims/n001/00001"],
            "none of the refused writes was made"
        );
    });
}

/// What a prefix holds is read whole however much it is: more than gRPC's 4 MiB answer
/// (the claims of thousands of nodes by shard), at one revision, each key with its own
/// `mod_revision`.
#[test]
fn a_prefix_holding_more_than_one_answer_takes_is_read_whole() {
    let cluster = EtcdCluster::start(1);
    runtime().block_on(async {
        let db = connect(&cluster);
        // 5,000 keys of 1 KiB: some 5 MiB, over gRPC's 4 MiB.
        let value = vec![b'c'; 1024];
        let mut last = 0;
        for batch in 0..5_000 / 100 {
            let puts = (0..100)
                .map(|index| {
                    let node = batch * 100 + index;
                    (format!("claims/n{node:05}/00001"), Some(value.clone()))
                })
                .collect();
            last = committed(&db.write_if_quiet(&[], puts, None).await.unwrap());
        }
        let (read, revision) = db.read_versioned("claims/").await.unwrap();
        assert_eq!(read.len(), 5_000);
        assert_eq!(revision, last);
        assert_eq!(read[0].key, "claims/n00000/00001");
        assert_eq!(read[4_999].key, "claims/n04999/00001");
        assert!(read.iter().all(|key| key.value == value));
        // The first batch's keys were written first, the last's last.
        assert!(read[0].mod_revision < read[4_999].mod_revision);
        assert_eq!(read[4_999].mod_revision, last);
    });
}

/// A page of large values (records of 10 KiB, as a pod's task may be) passes 4 MiB on its
/// own: it is read all the same.
#[test]
fn a_page_of_large_values_is_read_whole() {
    let cluster = EtcdCluster::start(1);
    runtime().block_on(async {
        let db = connect(&cluster);
        let value = vec![b't'; 10 * 1024];
        for batch in 0..6 {
            let puts = (0..100)
                .map(|index| {
                    let task = batch * 100 + index;
                    (format!("tasks/{task:05}"), Some(value.clone()))
                })
                .collect();
            db.write_if_quiet(&[], puts, None).await.unwrap();
        }
        let (read, _) = db.read_versioned("tasks/").await.unwrap();
        assert_eq!(read.len(), 600);
        assert!(read.iter().all(|key| key.value == value));
    });
}
