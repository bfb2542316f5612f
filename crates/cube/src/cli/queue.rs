//! `cube queue` and `cube service`: the waiting list (`GET /queue`) and what runs and
//! answers (`GET /services`), as tables for people or as the API's JSON and YAML.
//!
//! The views here read the manager's answers leniently (fields this CLI does not know are
//! ignored), so that an older CLI still reads a newer manager. The formatting is pure, so that
//! tests read it without a manager.

use std::collections::BTreeMap;

use anyhow::anyhow;
use chrono::{DateTime, Utc};
use clap::Args;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::output::{print_json, print_lines, print_yaml, table, time_ago};
use super::{ListFlags, ListFormat, ManagerClient};

/// One entry of the waiting list, as `GET /queue` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueEntryView {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "Kind", default)]
    pub kind: String,
    #[serde(rename = "Queue", default)]
    pub queue: u64,
    /// 1 = next among those that wait; 0 once let in or expired.
    #[serde(rename = "Position", default)]
    pub position: usize,
    #[serde(rename = "Priority", default)]
    pub priority: u8,
    #[serde(rename = "Owner", default)]
    pub owner: String,
    /// The request's project; empty (not written) for `default`.
    #[serde(rename = "Project", default, skip_serializing_if = "String::is_empty")]
    pub project: String,
    /// `waiting`, `pending-N`, `claimed` or `expired`.
    #[serde(rename = "State", default)]
    pub state: String,
    #[serde(rename = "Since", default, with = "cube_types::time::optional")]
    pub since: Option<DateTime<Utc>>,
    #[serde(rename = "WaitingFor", default)]
    pub waiting_for: Option<String>,
    #[serde(rename = "Reason", default)]
    pub reason: String,
    #[serde(rename = "Services", default)]
    pub services: Vec<EndpointView>,
    /// What was submitted (the task or the job), for its name.
    #[serde(rename = "Request", default)]
    pub request: Value,
}

/// Where one running copy is reached.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointView {
    #[serde(rename = "ID", default)]
    pub id: Option<Uuid>,
    #[serde(rename = "Name", default)]
    pub name: String,
    #[serde(rename = "Node", default)]
    pub node: String,
    #[serde(rename = "Address", default)]
    pub address: String,
    /// Container port → `host:port`.
    #[serde(rename = "Ports", default)]
    pub ports: BTreeMap<String, String>,
}

/// One service, as `GET /services` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServiceView {
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Kind", default)]
    pub kind: String,
    #[serde(rename = "Endpoints", default)]
    pub endpoints: Vec<EndpointView>,
}

impl QueueEntryView {
    /// The waiting list's order: higher priority first, then the lower queue number.
    pub fn order(&self) -> (std::cmp::Reverse<u8>, u64) {
        cube_types::queue::order(self.priority, self.queue)
    }

    /// The request's name: the task's or the job's.
    pub fn name(&self) -> String {
        self.request["Name"]
            .as_str()
            .filter(|name| !name.is_empty())
            .unwrap_or(&self.id)
            .to_string()
    }
}

/// Show the waiting list: every request in the queue's order, with its state and position.
///
/// When the cluster is full, requests (a task, or a job with all its groups) wait here in
/// order: higher Priority first, then the lower queue number. STATE is `waiting` (none of it
/// placed yet), `pending-N` (placed, N copies not yet running and healthy), `claimed` (all of
/// it runs and is healthy) or `expired` (it waited past its QueueTimeout). POS is the place
/// among those that wait (1 = next). A waiting request says what it waits for; a claimed one
/// where it runs.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube queue\n  \
    cube queue -o json | jq '.[] | select(.State == \"waiting\") | .WaitingFor'")]
pub struct QueueArgs {
    #[command(flatten)]
    flags: ListFlags,
}

/// Show the services: where every claimed task and every job group that runs can be reached.
///
/// Each row is one running, healthy copy: its service (`job.group`, or a bare task's name),
/// its node, and each published container port with the address it answers at.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube service\n  \
    cube service web.api\n  \
    cube service -o json | jq '.[].Endpoints[].Ports'")]
pub struct ServiceArgs {
    /// Only this service (`job.group`, or a task's name).
    #[arg(value_name = "NAME")]
    name: Option<String>,
    #[command(flatten)]
    flags: ListFlags,
}

pub async fn queue(args: QueueArgs) -> anyhow::Result<()> {
    let manager = ManagerClient::connect_to(&args.flags.target)?;
    let raw: Value = manager.get("/queue").await?;
    let mut entries: Vec<QueueEntryView> = serde_json::from_value(raw.clone())
        .map_err(|err| anyhow!("cannot read the manager's waiting list: {err}"))?;
    // In the queue's order. A list of every project from managers acting for their shards
    // (`--shard-controllers`) is each manager's list, one after the other.
    entries.sort_by_key(QueueEntryView::order);
    manager.print_project_line(args.flags.format());
    match args.flags.format() {
        ListFormat::Table | ListFormat::Wide if entries.is_empty() => {
            println!("the waiting list is empty");
        }
        ListFormat::Table | ListFormat::Wide => print_lines(&queue_table(&entries, Utc::now())),
        ListFormat::Json => print_json(&raw)?,
        ListFormat::Yaml => print_yaml(&raw)?,
        ListFormat::Name => {
            print_lines(&entries.iter().map(QueueEntryView::name).collect::<Vec<_>>())
        }
        ListFormat::Ids => print_lines(&entries.iter().map(|e| e.id.clone()).collect::<Vec<_>>()),
    }
    Ok(())
}

pub async fn service(args: ServiceArgs) -> anyhow::Result<()> {
    let manager = ManagerClient::connect_to(&args.flags.target)?;
    let raw: Value = manager.get("/services").await?;
    let mut services: Vec<ServiceView> = serde_json::from_value(raw.clone())
        .map_err(|err| anyhow!("cannot read the manager's services: {err}"))?;
    let raw = match &args.name {
        Some(name) => {
            services.retain(|service| &service.name == name);
            if services.is_empty() {
                anyhow::bail!(
                    "no service named {name:?} runs (a job group is `job.group`); see them \
                     with: cube service{}",
                    args.flags.target.hint()
                );
            }
            serde_json::to_value(&services)?
        }
        None => raw,
    };
    manager.print_project_line(args.flags.format());
    match args.flags.format() {
        ListFormat::Table | ListFormat::Wide if services.is_empty() => {
            println!("no service runs");
        }
        ListFormat::Table | ListFormat::Wide => print_lines(&service_table(&services)),
        ListFormat::Json => print_json(&raw)?,
        ListFormat::Yaml => print_yaml(&raw)?,
        ListFormat::Name | ListFormat::Ids => print_lines(
            &services
                .iter()
                .map(|service| service.name.clone())
                .collect::<Vec<_>>(),
        ),
    }
    Ok(())
}

/// POS, QUEUE, KIND, NAME, OWNER, PRIORITY, STATE, SINCE, then what a waiting request waits
/// for, an expired one's reason, or a claimed one's addresses.
pub fn queue_table(entries: &[QueueEntryView], now: DateTime<Utc>) -> Vec<String> {
    let mut rows = vec![
        [
            "POS", "QUEUE", "KIND", "NAME", "OWNER", "PRIORITY", "STATE", "SINCE", "DETAIL",
        ]
        .map(String::from)
        .to_vec(),
    ];
    // Requests of several projects (`--project '*'`): a PROJECT column after NAME.
    let project =
        |entry: &QueueEntryView| cube_types::project::name_or_default(&entry.project).to_string();
    let with_project = entries
        .iter()
        .map(project)
        .collect::<std::collections::BTreeSet<_>>()
        .len()
        > 1;
    if with_project {
        rows[0].insert(4, "PROJECT".to_string());
    }
    for entry in entries {
        let detail = match entry.state.as_str() {
            "waiting" => entry.waiting_for.clone().unwrap_or_default(),
            "expired" => entry.reason.clone(),
            _ => addresses(&entry.services),
        };
        let mut row = vec![
            if entry.position == 0 {
                "-".to_string()
            } else {
                entry.position.to_string()
            },
            entry.queue.to_string(),
            entry.kind.clone(),
            entry.name(),
            entry.owner.clone(),
            entry.priority.to_string(),
            entry.state.clone(),
            time_ago(entry.since, now),
            detail,
        ];
        if with_project {
            row.insert(4, project(entry));
        }
        rows.push(row);
    }
    table(&rows)
}

/// SERVICE, TASK, NODE, PORTS: one row per copy.
pub fn service_table(services: &[ServiceView]) -> Vec<String> {
    let mut rows = vec![
        ["SERVICE", "TASK", "NODE", "ADDRESSES"]
            .map(String::from)
            .to_vec(),
    ];
    for service in services {
        for endpoint in &service.endpoints {
            rows.push(vec![
                service.name.clone(),
                endpoint.name.clone(),
                endpoint.node.clone(),
                endpoint_addresses(endpoint),
            ]);
        }
    }
    table(&rows)
}

/// `10.0.0.2:49153->7777/tcp, ...` for one copy; `-` when it publishes no port.
pub fn endpoint_addresses(endpoint: &EndpointView) -> String {
    if endpoint.ports.is_empty() {
        return "-".to_string();
    }
    endpoint
        .ports
        .iter()
        .map(|(port, address)| format!("{address}->{port}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every copy's addresses, for one line: `web: 10.0.0.2:49153->7777/tcp`.
pub fn addresses(endpoints: &[EndpointView]) -> String {
    endpoints
        .iter()
        .map(|endpoint| format!("{}: {}", endpoint.name, endpoint_addresses(endpoint)))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(position: usize, state: &str) -> QueueEntryView {
        serde_json::from_value(serde_json::json!({
            "ID": "3f2a9c1e-0000-0000-0000-000000000001", "Kind": "task", "Queue": 7,
            "Position": position, "Priority": 50, "Owner": "alice", "State": state,
            "WaitingFor": "1 node: short of memory",
            "Request": {"Name": "web"},
            "Services": [{"Name": "web", "Node": "w1", "Address": "10.0.0.2",
                          "Ports": {"7777/tcp": "10.0.0.2:49153"}}],
            "Later": "a field this CLI does not know"
        }))
        .unwrap()
    }

    /// A list of every project from managers acting for their shards is each one's list
    /// after the other's: shown in the queue's order, higher priority then lower number.
    #[test]
    fn a_list_joined_from_several_managers_is_shown_in_the_queues_order() {
        let numbered = |queue: u64, priority: u8| {
            let mut entry = entry(1, "waiting");
            entry.queue = queue;
            entry.priority = priority;
            entry
        };
        let mut joined = [
            numbered(4, 50),
            numbered(9, 50),
            numbered(2, 50),
            numbered(7, 90),
        ];
        joined.sort_by_key(QueueEntryView::order);
        let order: Vec<(u8, u64)> = joined
            .iter()
            .map(|entry| (entry.priority, entry.queue))
            .collect();
        assert_eq!(order, vec![(90, 7), (50, 2), (50, 4), (50, 9)]);
    }

    #[test]
    fn requests_of_several_projects_get_a_project_column() {
        let now = Utc::now();
        let one = entry(1, "waiting");
        let mut other = entry(2, "waiting");
        other.project = "team-a".to_string();
        let alone = queue_table(std::slice::from_ref(&one), now);
        assert!(!alone[0].contains("PROJECT"), "{alone:?}");
        let both = queue_table(&[one, other], now);
        assert!(both[0].contains("PROJECT"), "{both:?}");
        assert!(
            both[1].contains("default") && both[2].contains("team-a"),
            "{both:?}"
        );
    }

    #[test]
    fn the_queue_table_says_why_a_request_waits_and_where_a_claimed_one_runs() {
        let lines = queue_table(&[entry(0, "claimed"), entry(1, "waiting")], Utc::now());
        assert!(lines[0].starts_with("POS"), "{lines:?}");
        assert!(
            lines[1].contains("claimed") && lines[1].contains("web: 10.0.0.2:49153->7777/tcp"),
            "{lines:?}"
        );
        assert!(
            lines[2].starts_with("1 ") && lines[2].contains("1 node: short of memory"),
            "{lines:?}"
        );
    }

    #[test]
    fn a_service_row_lists_each_port_with_its_address() {
        let service = ServiceView {
            name: "web.api".into(),
            kind: "job".into(),
            endpoints: entry(0, "claimed").services,
        };
        let lines = service_table(&[service]);
        assert!(
            lines[1].contains("web.api") && lines[1].contains("10.0.0.2:49153->7777/tcp"),
            "{lines:?}"
        );
    }
}
