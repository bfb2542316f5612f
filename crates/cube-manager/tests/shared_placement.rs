//! Several placers at once on one etcd cluster, as the managers of a sharded cluster place
//! (`shared_placement.rs`): real etcd, three members; each placer its own client.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use cube_manager::shared_placement::{Placement, SharedPlacer, claim_of};
use cube_scheduler::{Epvm, NodeView, TaskRequest};
use cube_store::{EtcdConfig, EtcdDb};
use cube_test_support::EtcdCluster;
use cube_types::Resources;
use cube_types::claims::{CLAIMS_PREFIX, NodeClaims};
use cube_types::task::HostPort;
use serde::{Deserialize, Serialize};

/// The record each placed copy writes with its claims: where it went and what it asked.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    node: String,
    cpu: f64,
    memory: u64,
    port: Option<u16>,
}

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn small_nodes() -> Vec<NodeView> {
    (1..=5)
        .map(|n| NodeView {
            name: format!("small-{n}"),
            ready: true,
            capacity: Resources {
                cpu: 1.0,
                memory: GIB,
                disk: 10 * GIB,
            },
            ..NodeView::default()
        })
        .collect()
}

/// Placer `placer`'s requests: 30, of one or two copies, some binding host port 8080 or
/// 8081; together the three placers ask for about twice what the five nodes hold.
fn requests(placer: usize) -> Vec<Vec<TaskRequest>> {
    (0..30)
        .map(|n| {
            let seed = placer * 31 + n * 7;
            let copy = TaskRequest {
                cpu: [0.1, 0.2, 0.25][seed % 3],
                memory: [64 * MIB, 128 * MIB, 256 * MIB][seed % 4 % 3],
                host_ports: if seed.is_multiple_of(5) {
                    [HostPort::tcp(8080 + (seed % 2) as u16)]
                        .into_iter()
                        .collect()
                } else {
                    BTreeSet::new()
                },
                ..TaskRequest::default()
            };
            vec![copy; 1 + seed % 2]
        })
        .collect()
}

fn connect(cluster: &EtcdCluster) -> EtcdDb {
    EtcdDb::connect(EtcdConfig::new(cluster.endpoints(), "/contend")).unwrap()
}

fn record_key(placer: usize, request: usize, copy: usize) -> String {
    format!("tasks/{placer}-{request}-{copy}")
}

/// Every record written, by key.
async fn records(db: &EtcdDb) -> BTreeMap<String, Record> {
    let (keys, _) = db.read_versioned("tasks/").await.unwrap();
    keys.into_iter()
        .map(|key| (key.key, serde_json::from_slice(&key.value).unwrap()))
        .collect()
}

/// Every node's claims as stored.
async fn stored_claims(db: &EtcdDb) -> BTreeMap<String, NodeClaims> {
    let (keys, _) = db.read_versioned(CLAIMS_PREFIX).await.unwrap();
    keys.into_iter()
        .map(|key| {
            let node = key.key.trim_start_matches(CLAIMS_PREFIX).to_string();
            (node, serde_json::from_slice(&key.value).unwrap())
        })
        .collect()
}

/// What the records say each node holds, summed as the claims sum.
fn held(records: &BTreeMap<String, Record>) -> BTreeMap<String, NodeClaims> {
    let mut held: BTreeMap<String, NodeClaims> = BTreeMap::new();
    for record in records.values() {
        let copy = TaskRequest {
            cpu: record.cpu,
            memory: record.memory,
            host_ports: record.port.map(HostPort::tcp).into_iter().collect(),
            ..TaskRequest::default()
        };
        held.entry(record.node.clone())
            .or_default()
            .add(&claim_of(&copy));
    }
    held
}

/// No node holds more than its capacity, no host port is bound twice on one node, and the
/// stored claims are exactly what the records hold.
fn assert_no_node_overbooked(
    records: &BTreeMap<String, Record>,
    claims: &BTreeMap<String, NodeClaims>,
) {
    let mut ports: BTreeSet<(String, u16)> = BTreeSet::new();
    for record in records.values() {
        if let Some(port) = record.port {
            assert!(
                ports.insert((record.node.clone(), port)),
                "port {port} bound twice on {}",
                record.node
            );
        }
    }
    let held = held(records);
    for (node, holds) in &held {
        assert!(holds.cpu_millis <= 1000, "{node} holds {holds}");
        assert!(holds.memory <= GIB, "{node} holds {holds}");
    }
    let claimed: BTreeMap<&String, &NodeClaims> =
        claims.iter().filter(|(_, c)| !c.is_empty()).collect();
    let held: BTreeMap<&String, &NodeClaims> = held.iter().collect();
    assert_eq!(claimed, held, "the claims are not what the records hold");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_placers_at_once_never_put_more_on_a_node_than_it_holds() {
    let cluster = EtcdCluster::start(3);
    let start = Arc::new(tokio::sync::Barrier::new(3));
    let mut running = Vec::new();
    for placer in 0..3 {
        let db = connect(&cluster);
        let start = start.clone();
        running.push(tokio::spawn(async move {
            let mut shared = SharedPlacer::new(db, Box::new(Epvm::new()), small_nodes(), None)
                .await
                .unwrap();
            start.wait().await;
            let mut outcomes = Vec::new();
            for (n, copies) in requests(placer).into_iter().enumerate() {
                let outcome = shared
                    .place(&copies, |nodes| {
                        nodes
                            .iter()
                            .zip(&copies)
                            .enumerate()
                            .map(|(copy, (node, request))| {
                                let record = Record {
                                    node: node.clone(),
                                    cpu: request.cpu,
                                    memory: request.memory,
                                    port: request.host_ports.iter().next().map(|p| p.port),
                                };
                                (
                                    record_key(placer, n, copy),
                                    serde_json::to_vec(&record).unwrap(),
                                )
                            })
                            .collect()
                    })
                    .await
                    .unwrap();
                outcomes.push((n, copies, outcome));
            }
            (outcomes, shared.counts())
        }));
    }
    let mut outcomes = Vec::new();
    let mut conflicts = 0;
    for (placer, running) in running.into_iter().enumerate() {
        let (placed, counts) = running.await.unwrap();
        eprintln!("placer {placer}: {counts:?}");
        conflicts += counts.conflicts;
        assert_eq!(counts.placed + counts.waiting, 30);
        outcomes.extend(placed.into_iter().map(|(n, c, o)| (placer, n, c, o)));
    }
    eprintln!("conflicts, all placers: {conflicts}");

    let db = connect(&cluster);
    let written = records(&db).await;
    let claims = stored_claims(&db).await;
    assert_no_node_overbooked(&written, &claims);

    // Every request is either placed whole, its records where it said, or waiting with the
    // reason, and nothing of it written.
    let mut waiting = 0;
    for (placer, n, copies, outcome) in &outcomes {
        match outcome {
            Placement::Placed { nodes } => {
                assert_eq!(nodes.len(), copies.len());
                for (copy, node) in nodes.iter().enumerate() {
                    let record = &written[&record_key(*placer, *n, copy)];
                    assert_eq!(&record.node, node);
                }
            }
            Placement::Waiting { reason } => {
                waiting += 1;
                assert!(!reason.is_empty());
                assert!(
                    reason.contains("nodes") && reason.contains("short of"),
                    "the reason says what the nodes lack: {reason}"
                );
                assert!(!written.contains_key(&record_key(*placer, *n, 0)));
            }
        }
    }
    assert!(
        waiting > 0,
        "the requests ask for about twice what the nodes hold, so some must wait"
    );
    let copies_placed: usize = outcomes
        .iter()
        .map(|(_, _, _, outcome)| match outcome {
            Placement::Placed { nodes } => nodes.len(),
            Placement::Waiting { .. } => 0,
        })
        .sum();
    assert_eq!(written.len(), copies_placed);

    // Taking every copy off frees the nodes: the claims follow the records back to nothing,
    // and a request that waited fits now.
    let mut releaser = SharedPlacer::new(db.clone(), Box::new(Epvm::new()), small_nodes(), None)
        .await
        .unwrap();
    let mut freed = 0;
    for (key, record) in &written {
        let copy = TaskRequest {
            cpu: record.cpu,
            memory: record.memory,
            host_ports: record.port.map(HostPort::tcp).into_iter().collect(),
            ..TaskRequest::default()
        };
        releaser
            .release(&record.node, &copy, vec![(key.clone(), None)])
            .await
            .unwrap();
        freed += 1;
    }
    assert_eq!(freed, written.len());
    let left = records(&db).await;
    assert!(
        left.is_empty(),
        "{} records left of {}: {:?}",
        left.len(),
        written.len(),
        left.keys().take(3).collect::<Vec<_>>()
    );
    let claims = stored_claims(&db).await;
    assert!(
        claims.values().all(NodeClaims::is_empty),
        "claims left once every copy was taken off: {claims:?}"
    );
    let (placer, n, copies, _) = outcomes
        .iter()
        .find(|(_, _, _, outcome)| matches!(outcome, Placement::Waiting { .. }))
        .unwrap();
    let again = releaser
        .place(copies, |nodes| {
            nodes
                .iter()
                .enumerate()
                .map(|(copy, node)| {
                    let record = Record {
                        node: node.clone(),
                        cpu: copies[copy].cpu,
                        memory: copies[copy].memory,
                        port: copies[copy].host_ports.iter().next().map(|p| p.port),
                    };
                    (
                        record_key(*placer, *n, copy),
                        serde_json::to_vec(&record).unwrap(),
                    )
                })
                .collect()
        })
        .await
        .unwrap();
    assert!(
        matches!(again, Placement::Placed { .. }),
        "a request that waited fits once room was freed: {again:?}"
    );
    assert_no_node_overbooked(&records(&db).await, &stored_claims(&db).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placement_whose_node_changed_under_it_is_planned_again_on_the_fresher_claims() {
    let cluster = EtcdCluster::start(1);
    let one_node = || vec![small_nodes().remove(0)];
    let big = TaskRequest {
        cpu: 0.6,
        memory: 100 * MIB,
        ..TaskRequest::default()
    };
    let record = |node: &str| serde_json::to_vec(&serde_json::json!({ "node": node })).unwrap();
    // Both placers read the node empty; the first takes 0.6 cores.
    let mut first = SharedPlacer::new(connect(&cluster), Box::new(Epvm::new()), one_node(), None)
        .await
        .unwrap();
    let mut second = SharedPlacer::new(connect(&cluster), Box::new(Epvm::new()), one_node(), None)
        .await
        .unwrap();
    let placed = first
        .place(std::slice::from_ref(&big), |nodes| {
            vec![("tasks/a".to_string(), record(&nodes[0]))]
        })
        .await
        .unwrap();
    assert!(matches!(placed, Placement::Placed { .. }));
    // The second read the node empty. Whether the watch of the claims told it of the first
    // placement before it planned, or its transaction lost and answered the node's fresher
    // claims, the request fits nowhere now, with the reason, and nothing of it is written.
    let outcome = second
        .place(std::slice::from_ref(&big), |nodes| {
            vec![("tasks/b".to_string(), record(&nodes[0]))]
        })
        .await
        .unwrap();
    let Placement::Waiting { reason } = outcome else {
        panic!("placed on a node that has 0.4 cores left: {outcome:?}");
    };
    assert!(reason.contains("small-1"), "{reason}");
    assert!(reason.contains("CPU") || reason.contains("cpu"), "{reason}");
    assert!(second.counts().conflicts <= 1, "{:?}", second.counts());
    assert_eq!(second.claims_of("small-1").cpu_millis, 600);
    let db = connect(&cluster);
    assert!(db.read_versioned("tasks/b").await.unwrap().0.is_empty());
}
