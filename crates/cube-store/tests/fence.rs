//! A fence of several keys on a real etcd (`cube-test-support` starts it): a manager that
//! holds several shards of the ring fences its writes on every one, and once any one of them
//! is no longer the key it created, its writes are refused, naming that key, and nothing is
//! written.

use std::time::Duration;

use cube_store::{
    EtcdConfig, EtcdDb, EtcdStore, Fence, Lease, Optimistic, Store, StoreError, Unchanged,
};
use cube_test_support::EtcdCluster;

/// A lease that outlasts every test here, so that no key goes for its expiry.
const LONG_TTL: Duration = Duration::from_secs(60);

const SHARD_3: &str = "ring/shards/00003";
const SHARD_7: &str = "ring/shards/00007";

/// A runtime for the store's asynchronous calls; the synchronous writes of the tables are
/// made outside it, as a manager's are.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn connect(cluster: &EtcdCluster) -> EtcdDb {
    EtcdDb::connect(EtcdConfig::new(cluster.endpoints(), "/cube")).unwrap()
}

/// A manager's hold on two shards: its lease, and a fence on both keys it created under it.
struct TwoShards {
    _lease: Lease,
    fence: Fence,
}

fn take_two_shards(runtime: &tokio::runtime::Runtime, db: &EtcdDb) -> TwoShards {
    runtime.block_on(async {
        let lease = db.grant_lease(LONG_TTL, "the test's shards").await.unwrap();
        let mut held = Vec::new();
        for shard in [SHARD_3, SHARD_7] {
            let created_at = db
                .create_if_absent(shard, b"first".to_vec(), lease.id())
                .await
                .unwrap()
                .expect("the shard is free");
            held.push(db.fence_key(shard, created_at));
        }
        TwoShards {
            _lease: lease,
            fence: Fence::all(held).unwrap(),
        }
    })
}

/// Another manager takes `shard` over: the holder's key goes (as when its lease ends) and
/// the other creates it again, under a lease of its own.
fn another_takes(runtime: &tokio::runtime::Runtime, cluster: &EtcdCluster, shard: &str) -> Lease {
    let other = connect(cluster);
    runtime.block_on(async {
        let (keys, _) = other.read_prefix(shard).await.unwrap();
        let holder = keys.first().expect("the shard is held").lease;
        assert!(other.delete_if_held(shard, holder).await.unwrap());
        let lease = other
            .grant_lease(LONG_TTL, "the other's shards")
            .await
            .unwrap();
        other
            .create_if_absent(shard, b"second".to_vec(), lease.id())
            .await
            .unwrap()
            .expect("the shard is free again");
        lease
    })
}

fn fenced_key(err: &StoreError) -> &str {
    match err {
        StoreError::Fenced { key } => key,
        other => panic!("expected the write to be fenced, got: {other}"),
    }
}

#[test]
fn a_write_fenced_on_two_shards_is_refused_once_either_is_taken_over() {
    let cluster = EtcdCluster::start(1);
    let runtime = runtime();
    let db = connect(&cluster);
    let tasks = EtcdStore::<String>::new(db.clone(), "tasks").unwrap();
    let shards = take_two_shards(&runtime, &db);
    let refused = db.set_fence(Some(shards.fence.clone()));
    tasks.put("t1", &"while holding both".to_string()).unwrap();
    assert!(!refused.is_cancelled());

    // The second key of the fence moves: a refusal that looked at the first alone would let
    // this write through.
    let _other = another_takes(&runtime, &cluster, SHARD_7);
    let err = tasks
        .put("t2", &"after shard 7 was taken".to_string())
        .unwrap_err();
    assert_eq!(fenced_key(&err), "/cube/ring/shards/00007");
    assert!(
        err.to_string()
            .contains("no longer holds the fence key /cube/ring/shards/00007"),
        "{err}"
    );
    assert!(refused.is_cancelled(), "the refusal is told");
    let err = tasks
        .put_if(
            "t3",
            &"conditional".to_string(),
            cube_store::Expected::Absent,
        )
        .unwrap_err();
    assert_eq!(fenced_key(&err), "/cube/ring/shards/00007");
    assert_eq!(tasks.get("t2").unwrap(), None);
    assert_eq!(tasks.get("t3").unwrap(), None);
    assert_eq!(tasks.count().unwrap(), 1, "only the first write was made");
}

#[test]
fn an_optimistic_write_fenced_on_two_shards_is_refused_once_either_is_taken_over() {
    let cluster = EtcdCluster::start(1);
    let runtime = runtime();
    let db = connect(&cluster);
    let shards = take_two_shards(&runtime, &db);
    // Writes `written` if `compared` is still absent, under the fence of both shards.
    let claim = |compared: &'static str, written: &'static str| {
        let (db, fence) = (&db, &shards.fence);
        async move {
            let absent = Unchanged {
                key: compared.to_string(),
                mod_revision: 0,
            };
            db.write_if_unchanged(
                &[absent],
                vec![(written.to_string(), Some(b"claimed".to_vec()))],
                Some(fence),
            )
            .await
        }
    };
    runtime.block_on(async {
        let written = claim("claims/a", "claims/a").await.unwrap();
        assert!(
            matches!(written, Optimistic::Committed { .. }),
            "{written:?}"
        );

        // While both shards hold, a lost race is a change, and only the compared keys come
        // back (the fenced ones are read in the same round trip, and left out).
        let raced = claim("claims/a", "claims/a").await.unwrap();
        let Optimistic::Changed { now } = raced else {
            panic!("expected a lost race, got {raced:?}");
        };
        let keys: Vec<&str> = now.iter().map(|read| read.key.as_str()).collect();
        assert_eq!(keys, ["claims/a"]);
    });

    let _other = another_takes(&runtime, &cluster, SHARD_3);
    runtime.block_on(async {
        let err = claim("claims/b", "claims/b").await.unwrap_err();
        assert_eq!(fenced_key(&err), "/cube/ring/shards/00003");
        // A compared key that changed too does not hide the fence: planning again would not
        // help a writer that lost a shard.
        let err = claim("claims/a", "claims/c").await.unwrap_err();
        assert_eq!(fenced_key(&err), "/cube/ring/shards/00003");
        let (claims, _) = db.read_versioned("claims/").await.unwrap();
        let keys: Vec<&str> = claims.iter().map(|read| read.key.as_str()).collect();
        assert_eq!(
            keys,
            ["claims/a"],
            "nothing was written after the shard moved"
        );
    });
}
