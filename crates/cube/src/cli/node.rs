//! `cube node [NAME]`: the workers as the manager sees them, and what they hold; `cube node
//! drain|eligibility|rm NAME`: nodes in and out of service.

use std::time::Duration;

use anyhow::anyhow;
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use cube_types::duration::parse_duration;
use cube_types::shard::{ShardsView, format_shards};
use cube_types::size::format_size;
use cube_types::{Node, Stats};

use super::output::{
    format_cores, key_values, print_json, print_lines, print_yaml, table, time_ago, time_with_age,
};
use super::{ClusterFlags, ListFlags, ListFormat, ManagerClient};

/// Show nodes: every worker as a table, or one in detail.
///
/// The table has a line per node: NAME, STATUS (Ready; Unreachable when it reports but the
/// manager cannot reach its API; Down after missed heartbeats), CPU,
/// MEMORY and DISK as allocated/capacity (what placed tasks declared, against what the worker
/// offers) and TASKS (tasks holding resources there); -o wide adds ADDRESS, SOURCE
/// (registered, or static from the manager's -w), HEARTBEAT (when it last reported) and
/// LABELS (the worker's --label flags, key=value, comma-separated).
///
/// With NAME it shows that node's fields one per line, its labels among them (StatusReason
/// says why the manager cannot reach it, while it cannot), with its last heartbeat and the
/// machine's stats as the worker last reported them (memory and disk used, CPU usage, load).
/// -o json and -o yaml print the manager's objects: an array of nodes, or the one node; -o
/// name and -q the names.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube node                 # every node\n  \
    cube node -o wide         # with ADDRESS, SOURCE, HEARTBEAT, LABELS\n  \
    cube node local           # one node in detail, with its stats\n  \
    cube node drain w1 --deadline 5m   # move its job copies away, then keep it out\n  \
    cube node eligibility w1 --enable  # let it take new tasks again\n  \
    cube node rm w1           # forget a node that is Down\n  \
    cube node -o json | jq '.[] | select(.Status == \"Ready\") | .Name'")]
#[command(args_conflicts_with_subcommands = true)]
pub struct NodeArgs {
    #[command(subcommand)]
    action: Option<NodeAction>,
    /// Show only this node, in detail: its exact name.
    #[arg(value_name = "NAME")]
    name: Option<String>,
    #[command(flatten)]
    flags: ListFlags,
}

#[derive(Debug, Subcommand)]
enum NodeAction {
    /// Take a node out of service: no new task goes there, and its service and batch job
    /// copies move elsewhere, each new copy healthy before the old one stops (never fewer
    /// running). Bare tasks and system jobs' copies stay. Progress is shown until the drain
    /// is done (--detach returns at once); the node then stays ineligible until
    /// `cube node eligibility NAME --enable`.
    #[command(after_help = "Examples:\n  \
        cube node drain w1\n  \
        cube node drain w1 --deadline 1m   # stop what is left after a minute\n  \
        cube node drain w1 --detach")]
    Drain {
        /// The node's name.
        name: String,
        /// After this long, the copies still on the node are stopped without waiting for
        /// their replacement (e.g. 1m); without it, a drain waits as long as it takes.
        #[arg(long, value_parser = parse_duration)]
        deadline: Option<Duration>,
        /// Return once the drain started, without following it.
        #[arg(long)]
        detach: bool,
        #[command(flatten)]
        target: ClusterFlags,
    },
    /// Let a node take new tasks (--enable; also ends a drain) or not (--disable: what runs
    /// there stays).
    #[command(after_help = "Examples:\n  \
        cube node eligibility w1 --disable\n  \
        cube node eligibility w1 --enable")]
    Eligibility {
        /// The node's name.
        name: String,
        #[arg(long, conflicts_with = "disable", required_unless_present = "disable")]
        enable: bool,
        #[arg(long)]
        disable: bool,
        #[command(flatten)]
        target: ClusterFlags,
    },
    /// Forget a node that is Down (its worker stopped for good). Refused, with the reason,
    /// while the node is not Down or holds tasks that may run there; its Lost tasks fail
    /// (and are restarted elsewhere by their policy).
    #[command(after_help = "Examples:\n  \
        cube node rm w1")]
    Rm {
        /// The node's name.
        name: String,
        #[command(flatten)]
        target: ClusterFlags,
    },
    /// Show the managers and the shards of the ring each holds (`GET /shards`): MANAGER (its
    /// address), LEADER (the one that runs the cluster-wide work: nodes, tokens, projects),
    /// SHARDS (those its virtual nodes hold now) and VIRTUAL NODES (each one's point on the
    /// ring). A project's records are in shard hash(name) mod the ring's size. A manager on
    /// its own store holds every shard.
    #[command(after_help = "Examples:\n  \
        cube node managers\n  \
        cube node managers -o json | jq '.Managers[] | {Manager, Shards}'")]
    Managers {
        #[command(flatten)]
        flags: ListFlags,
    },
}

pub async fn node(args: NodeArgs) -> anyhow::Result<()> {
    if let Some(action) = args.action {
        return node_action(action).await;
    }
    let manager = ManagerClient::connect_to(&args.flags.target)?;
    let now = Utc::now();
    let format = args.flags.format();
    match &args.name {
        Some(name) => {
            let path = format!("/nodes/{}", encode_path_segment(name));
            let node: Node = match manager.try_get(&path).await {
                Ok(node) => node,
                Err(err) if err.status().is_some_and(|status| status.as_u16() == 404) => {
                    return Err(anyhow!(
                        "no node named {name:?}; list the nodes with: cube node{}",
                        args.flags.target.hint()
                    ));
                }
                Err(err) => return Err(manager.explain(err)),
            };
            match format {
                ListFormat::Table | ListFormat::Wide => print_lines(&node_details(&node, now)),
                ListFormat::Json => print_json(&node)?,
                ListFormat::Yaml => print_yaml(&node)?,
                ListFormat::Name | ListFormat::Ids => println!("{}", node.name),
            }
        }
        None => {
            let mut nodes: Vec<Node> = manager.get("/nodes").await?;
            nodes.sort_by(|a, b| a.name.cmp(&b.name));
            match format {
                ListFormat::Table | ListFormat::Wide => {
                    // Managers sharing etcd say who leads; a manager alone has no /leader.
                    if let Ok(leader) = manager.try_get::<serde_json::Value>("/leader").await {
                        println!("{}", leader_line(&leader));
                    }
                    print_lines(&node_table(&nodes, now, format == ListFormat::Wide));
                }
                ListFormat::Json => print_json(&nodes)?,
                ListFormat::Yaml => print_yaml(&nodes)?,
                // A node's name is its ID.
                ListFormat::Name | ListFormat::Ids => {
                    print_lines(&nodes.iter().map(|n| n.name.clone()).collect::<Vec<_>>())
                }
            }
        }
    }
    Ok(())
}

async fn node_action(action: NodeAction) -> anyhow::Result<()> {
    match action {
        NodeAction::Drain {
            name,
            deadline,
            detach,
            target,
        } => {
            let manager = ManagerClient::connect_to(&target)?;
            let mut body = serde_json::json!({});
            if let Some(deadline) = deadline {
                body["Deadline"] =
                    serde_json::json!(cube_types::duration::format_duration(deadline));
            }
            let path = format!("/nodes/{}/drain", encode_path_segment(&name));
            let (_, node): (u16, Node) = manager.post(&path, &body).await?;
            println!(
                "draining {name}: it takes no new task{}",
                match deadline {
                    Some(deadline) => format!(
                        "; copies still there after {} are stopped",
                        cube_types::duration::format_duration(deadline)
                    ),
                    None => String::new(),
                }
            );
            if detach {
                return Ok(());
            }
            follow_drain(&manager, &name, node).await
        }
        NodeAction::Eligibility {
            name,
            enable,
            disable: _,
            target,
        } => {
            let manager = ManagerClient::connect_to(&target)?;
            let path = format!("/nodes/{}/eligibility", encode_path_segment(&name));
            let (_, _node): (u16, Node) = manager
                .post(&path, &serde_json::json!({"Eligible": enable}))
                .await?;
            if enable {
                println!("{name} is eligible: new tasks may go there");
            } else {
                println!("{name} is ineligible: no new task goes there; what runs there stays");
            }
            Ok(())
        }
        NodeAction::Managers { flags } => managers(&flags).await,
        NodeAction::Rm { name, target } => {
            let manager = ManagerClient::connect_to(&target)?;
            manager
                .delete(&format!("/nodes/{}", encode_path_segment(&name)))
                .await?;
            println!("removed node {name}");
            Ok(())
        }
    }
}

/// `cube node managers`.
async fn managers(flags: &ListFlags) -> anyhow::Result<()> {
    let manager = ManagerClient::connect_to(&flags.target)?;
    let view: ShardsView = manager.get("/shards").await?;
    // Managers sharing etcd say who leads; a manager alone has no /leader.
    let leader = manager
        .try_get::<serde_json::Value>("/leader")
        .await
        .ok()
        .and_then(|leader| leader["Leader"].as_str().map(str::to_string));
    match flags.format() {
        ListFormat::Table | ListFormat::Wide => {
            print_lines(&managers_table(&view, leader.as_deref()))
        }
        ListFormat::Json => print_json(&view)?,
        ListFormat::Yaml => print_yaml(&view)?,
        ListFormat::Name | ListFormat::Ids => print_lines(
            &view
                .managers
                .iter()
                .map(|m| m.manager.clone())
                .collect::<Vec<_>>(),
        ),
    }
    Ok(())
}

/// The ring's size, a line per manager, and the shards no one holds at this instant.
fn managers_table(view: &ShardsView, leader: Option<&str>) -> Vec<String> {
    let mut lines = vec![format!("Ring: {} shards", view.ring)];
    let mut rows = vec![
        ["MANAGER", "LEADER", "SHARDS", "VIRTUAL NODES"]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>(),
    ];
    for manager in &view.managers {
        let points: Vec<String> = manager
            .virtual_nodes
            .iter()
            .map(|node| {
                let number = node.id.rsplit('/').next().unwrap_or(&node.id);
                format!(
                    "{number}: at {}, holds {}",
                    node.position,
                    format_shards(&node.shards)
                )
            })
            .collect();
        rows.push(vec![
            manager.manager.clone(),
            if leader == Some(manager.manager.as_str()) {
                "yes".to_string()
            } else {
                "-".to_string()
            },
            format_shards(&manager.shards),
            points.join("; "),
        ]);
    }
    lines.extend(table(&rows));
    if !view.unowned.is_empty() {
        lines.push(format!(
            "Held by no manager at this instant (moving to a new owner): {}",
            format_shards(&view.unowned)
        ));
    }
    lines
}

/// Follows a drain with blocking queries on `GET /nodes` until it is done, a line each time
/// what is left to move changes.
async fn follow_drain(manager: &ManagerClient, name: &str, node: Node) -> anyhow::Result<()> {
    let mut index = 0;
    let mut last: Option<(usize, usize)> = None;
    let mut node = node;
    loop {
        let Some(drain) = &node.drain else {
            println!(
                "{name} is drained: its job copies run elsewhere; it stays ineligible until \
                 cube node eligibility {name} --enable"
            );
            return Ok(());
        };
        let now = (drain.remaining, drain.staying);
        if last != Some(now) {
            let stays = match drain.staying {
                0 => String::new(),
                1 => "; 1 task stays (a bare task or a system job's)".to_string(),
                n => format!("; {n} tasks stay (bare tasks or system jobs')"),
            };
            println!(
                "{name}: {} job cop{} to move{stays}",
                drain.remaining,
                if drain.remaining == 1 { "y" } else { "ies" }
            );
            last = Some(now);
        }
        let (nodes, next): (Vec<Node>, Option<u64>) = manager
            .get_blocking("/nodes", index, Duration::from_secs(30))
            .await
            .map_err(|err| manager.explain(err))?;
        index = next.unwrap_or(index);
        node = nodes
            .into_iter()
            .find(|node| node.name == name)
            .ok_or_else(|| anyhow!("node {name} was removed while it drained"))?;
    }
}

/// `Leader: HOST:PORT` (from `GET /leader`), or that none leads now.
fn leader_line(leader: &serde_json::Value) -> String {
    match leader["Leader"].as_str() {
        Some(address) => format!("Leader: {address}"),
        None => "Leader: none at the moment (one is elected within --leader-ttl)".to_string(),
    }
}

/// The node table, in the order given; `wide` adds ADDRESS, SOURCE, HEARTBEAT and LABELS.
fn node_table(nodes: &[Node], now: DateTime<Utc>, wide: bool) -> Vec<String> {
    let mut header = vec!["NAME", "STATUS", "CPU", "MEMORY", "DISK", "TASKS"];
    if wide {
        header.extend(["ADDRESS", "SOURCE", "HEARTBEAT", "LABELS"]);
    }
    let mut rows = vec![header.into_iter().map(String::from).collect::<Vec<_>>()];
    rows.extend(nodes.iter().map(|node| {
        let mut row = vec![
            node.name.clone(),
            status_cell(node),
            cpu_cell(node),
            sizes(node.allocated.memory, node.capacity.memory),
            sizes(node.allocated.disk, node.capacity.disk),
            node.task_count.to_string(),
        ];
        if wide {
            row.extend([
                node.address.clone(),
                node.source.clone(),
                time_ago(node.last_heartbeat, now),
                labels_cell(node),
            ]);
        }
        row
    }));
    table(&rows)
}

/// One node's fields, one per line, then its latest stats.
fn node_details(node: &Node, now: DateTime<Utc>) -> Vec<String> {
    let mut pairs = vec![
        ("Name", node.name.clone()),
        ("Address", node.address.clone()),
        ("Status", status_cell(node)),
        ("Source", node.source.clone()),
        ("Labels", labels_cell(node)),
        ("Tasks", node.task_count.to_string()),
        ("CPU", format!("{} cores allocated", cpu_cell(node))),
        (
            "Memory",
            format!(
                "{} allocated",
                sizes(node.allocated.memory, node.capacity.memory)
            ),
        ),
        (
            "Disk",
            format!(
                "{} allocated",
                sizes(node.allocated.disk, node.capacity.disk)
            ),
        ),
        ("LastHeartbeat", time_with_age(node.last_heartbeat, now)),
    ];
    if let Some(reason) = &node.status_reason {
        // Why a node that reports is not `Ready` (the manager cannot reach its API), right
        // below its status.
        pairs.insert(3, ("StatusReason", reason.clone()));
    }
    if let Some(drain) = &node.drain {
        pairs.push((
            "Drain",
            format!(
                "{} job copies to move, {} staying; since {}{}",
                drain.remaining,
                drain.staying,
                time_with_age(drain.start_time, now),
                drain
                    .deadline
                    .map(|deadline| format!(", deadline {}", deadline.to_rfc3339()))
                    .unwrap_or_default()
            ),
        ));
    }
    if let Some(version) = &node.version {
        pairs.push((
            "Version",
            format!(
                "cube {} ({}), docker {}",
                version.version,
                version.commit,
                version.docker.as_deref().unwrap_or("unknown")
            ),
        ));
    }
    if let Some(warning) = &node.version_warning {
        pairs.push(("VersionWarning", warning.clone()));
    }
    match &node.stats {
        Some(stats) => pairs.extend(stats_pairs(stats)),
        None => pairs.push(("Stats", "none reported yet".to_string())),
    }
    key_values(&pairs)
}

/// The machine as the worker last measured it.
fn stats_pairs(stats: &Stats) -> Vec<(&'static str, String)> {
    vec![
        (
            "MemoryUsed",
            format!(
                "{:.1}% ({} of {}, {} available)",
                stats.mem_used_percent,
                format_size(stats.mem_used_kb.saturating_mul(1024)),
                format_size(stats.mem_total_kb.saturating_mul(1024)),
                format_size(stats.mem_available_kb.saturating_mul(1024)),
            ),
        ),
        (
            "CpuUsage",
            format!(
                "{:.1}% of {} cores",
                stats.cpu_usage * 100.0,
                stats.cpu_count
            ),
        ),
        (
            "Load",
            format!(
                "{:.2} {:.2} {:.2} (1, 5, 15 min)",
                stats.load_avg.last_1_min, stats.load_avg.last_5_min, stats.load_avg.last_15_min
            ),
        ),
        (
            "DiskUsed",
            format!(
                "{} of {} ({} free)",
                format_size(stats.disk_used),
                format_size(stats.disk_total),
                format_size(stats.disk_free)
            ),
        ),
        ("Containers", stats.task_count.to_string()),
    ]
}

/// `Ready`, with `,ineligible` or `,draining` when the node takes no new task.
fn status_cell(node: &Node) -> String {
    match (&node.drain, node.eligible) {
        (Some(_), _) => format!("{},draining", node.status),
        (None, false) => format!("{},ineligible", node.status),
        (None, true) => node.status.to_string(),
    }
}

/// `disk=ssd,zone=eu`, or `-` for a node without labels.
fn labels_cell(node: &Node) -> String {
    if node.labels.is_empty() {
        return "-".to_string();
    }
    node.labels
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// `0.5/2`: cores allocated to tasks, of the cores offered.
fn cpu_cell(node: &Node) -> String {
    format!(
        "{}/{}",
        format_cores(node.allocated.cpu),
        format_cores(node.capacity.cpu)
    )
}

/// `512.0 MiB/1.0 GiB`: bytes allocated to tasks, of the bytes offered.
fn sizes(allocated: u64, capacity: u64) -> String {
    format!("{}/{}", format_size(allocated), format_size(capacity))
}

/// A node name as one URL path segment: letters, digits and `-._~` as they are, every other
/// byte percent-encoded, so that any name reaches `GET /nodes/{name}` intact.
fn encode_path_segment(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use cube_types::{LoadAvg, NodeStatus, Resources};

    use super::*;

    const GIB: u64 = 1024 * 1024 * 1024;

    fn node(name: &str, status: NodeStatus) -> Node {
        Node {
            name: name.to_string(),
            address: "http://127.0.0.1:5556".to_string(),
            status,
            status_reason: None,
            capacity: Resources {
                cpu: 2.0,
                memory: GIB,
                disk: 10 * GIB,
            },
            allocated: Resources {
                cpu: 0.5,
                memory: GIB / 2,
                disk: 0,
            },
            task_count: 1,
            stats: None,
            last_heartbeat: None,
            source: "registered".to_string(),
            labels: Default::default(),
            eligible: true,
            drain: None,
            version: None,
            version_warning: None,
            host_policy: None,
            volumes: Vec::new(),
        }
    }

    #[test]
    fn the_node_table_shows_allocated_of_capacity() {
        let now = Utc.with_ymd_and_hms(2024, 5, 1, 12, 0, 0).unwrap();
        let nodes = [node("w1", NodeStatus::Ready), node("w2", NodeStatus::Down)];
        assert_eq!(
            node_table(&nodes, now, false),
            vec![
                "NAME   STATUS   CPU     MEMORY              DISK           TASKS",
                "w1     Ready    0.5/2   512.0 MiB/1.0 GiB   0 B/10.0 GiB   1",
                "w2     Down     0.5/2   512.0 MiB/1.0 GiB   0 B/10.0 GiB   1",
            ]
        );
    }

    #[test]
    fn the_wide_node_table_adds_address_source_and_heartbeat() {
        let now = Utc.with_ymd_and_hms(2024, 5, 1, 12, 0, 0).unwrap();
        let mut w1 = node("w1", NodeStatus::Ready);
        w1.last_heartbeat = Some(now - chrono::Duration::seconds(2));
        w1.labels.insert("zone".into(), "eu".into());
        w1.labels.insert("disk".into(), "ssd".into());
        let w2 = node("w2", NodeStatus::Ready);
        assert_eq!(
            node_table(&[w1, w2], now, true),
            vec![
                "NAME   STATUS   CPU     MEMORY              DISK           TASKS   ADDRESS                 SOURCE       HEARTBEAT       LABELS",
                "w1     Ready    0.5/2   512.0 MiB/1.0 GiB   0 B/10.0 GiB   1       http://127.0.0.1:5556   registered   2 seconds ago   disk=ssd,zone=eu",
                "w2     Ready    0.5/2   512.0 MiB/1.0 GiB   0 B/10.0 GiB   1       http://127.0.0.1:5556   registered   -               -",
            ]
        );
    }

    #[test]
    fn details_show_the_heartbeat_and_the_latest_stats() {
        let now = Utc.with_ymd_and_hms(2024, 5, 1, 12, 0, 0).unwrap();
        let mut node = node("w1", NodeStatus::Ready);
        node.last_heartbeat = Some(now - chrono::Duration::seconds(2));
        node.labels.insert("zone".into(), "eu".into());
        node.stats = Some(Stats {
            mem_total_kb: 4 * 1024 * 1024,
            mem_available_kb: 3 * 1024 * 1024,
            mem_used_kb: 1024 * 1024,
            mem_used_percent: 25.0,
            disk_total: 100 * GIB,
            disk_free: 60 * GIB,
            disk_used: 40 * GIB,
            cpu_usage: 0.125,
            cpu_count: 4,
            load_avg: LoadAvg {
                last_1_min: 0.52,
                last_5_min: 0.4,
                last_15_min: 0.31,
            },
            task_count: 1,
        });
        let lines = node_details(&node, now);
        for expected in [
            "Status:        Ready",
            "Labels:        zone=eu",
            "CPU:           0.5/2 cores allocated",
            "LastHeartbeat: 2024-05-01T11:59:58Z (2 seconds ago)",
            "MemoryUsed:    25.0% (1.0 GiB of 4.0 GiB, 3.0 GiB available)",
            "CpuUsage:      12.5% of 4 cores",
            "Load:          0.52 0.40 0.31 (1, 5, 15 min)",
            "DiskUsed:      40.0 GiB of 100.0 GiB (60.0 GiB free)",
        ] {
            assert!(
                lines.iter().any(|line| line == expected),
                "{expected:?} not in {lines:#?}"
            );
        }
    }

    #[test]
    fn a_node_without_stats_says_so() {
        let now = Utc.with_ymd_and_hms(2024, 5, 1, 12, 0, 0).unwrap();
        let lines = node_details(&node("w1", NodeStatus::Down), now);
        assert!(lines.contains(&"Stats:         none reported yet".to_string()));
        assert!(lines.contains(&"LastHeartbeat: -".to_string()));
        assert!(lines.contains(&"Labels:        -".to_string()));
    }

    #[test]
    fn details_say_why_a_node_is_not_ready() {
        let now = Utc.with_ymd_and_hms(2024, 5, 1, 12, 0, 0).unwrap();
        let mut unreachable = node("w1", NodeStatus::Unreachable);
        unreachable.status_reason =
            Some("cannot reach http://127.0.0.1:5556: Connection refused".to_string());
        let lines = node_details(&unreachable, now);
        let status = lines.iter().position(|line| line.starts_with("Status:"));
        assert_eq!(
            lines.get(status.unwrap() + 1).map(String::as_str),
            Some("StatusReason:  cannot reach http://127.0.0.1:5556: Connection refused"),
            "{lines:#?}"
        );
        let ready = node_details(&node("w2", NodeStatus::Ready), now);
        assert!(!ready.iter().any(|line| line.starts_with("StatusReason")));
    }

    #[test]
    fn node_names_are_encoded_as_one_path_segment() {
        assert_eq!(encode_path_segment("w1.local"), "w1.local");
        assert_eq!(encode_path_segment("a b/c"), "a%20b%2Fc");
    }
}
