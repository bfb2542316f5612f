//! `cube status [ID]`: the tasks as the manager sees them, like `docker ps`, or one task in
//! detail.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use chrono::{DateTime, Utc};
use clap::Args;
use cube_types::{Health, HostBinding, RestartPolicy, State, Task};

use super::output::{key_values, print_json, print_lines, table, time_ago, time_with_age};
use super::resolve::find_task;
use super::{ManagerClient, ManagerFlags, OutputFormat};

/// Show tasks: every task as a table (newest first), or one task in detail.
///
/// The table has a line per task: ID (short), NAME, CREATED, STATE, NODE, IMAGE and PORTS
/// (host address -> container port). Under it, each task that waits for a node says why,
/// and each failed task says what went wrong.
///
/// With ID (a full ID, a unique ID prefix, or a unique exact name, as for `cube stop`) it
/// shows that task's fields one per line. With -o json it prints the manager's JSON: an
/// array of tasks, or the one task.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube status                     # every task, like docker ps\n  \
    cube status 3f2a                # one task in detail, by ID prefix\n  \
    cube status test-chapter-9.1    # ... or by its name\n  \
    cube status -o json | jq '.[] | select(.State == \"Running\") | .ID'")]
pub struct StatusArgs {
    /// Show only this task, in detail: a full ID, a unique ID prefix, or a unique exact name.
    #[arg(value_name = "ID")]
    task: Option<String>,
    #[command(flatten)]
    flags: ManagerFlags,
}

pub async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let manager = ManagerClient::connect(&args.flags)?;
    let now = Utc::now();
    match &args.task {
        Some(query) => {
            let task = find_task(&manager, query).await?;
            match args.flags.output {
                OutputFormat::Json => print_json(&task)?,
                OutputFormat::Table => print_lines(&task_details(&task, now)),
            }
        }
        None => {
            let tasks: Vec<Task> = manager.get("/tasks").await?;
            match args.flags.output {
                OutputFormat::Json => print_json(&tasks)?,
                OutputFormat::Table => print_lines(&task_table(tasks, now)),
            }
        }
    }
    Ok(())
}

/// The task table, newest first, then a note for each task that waits or failed, so that
/// "why is my task not placed?" and "why did it fail?" are answered on the same screen.
fn task_table(mut tasks: Vec<Task>, now: DateTime<Utc>) -> Vec<String> {
    // Newest first, as `docker ps`; tasks without a creation time last. The sort is stable,
    // so the manager's order breaks ties.
    tasks.sort_by_key(|task| Reverse(task.created_time));
    let header = ["ID", "NAME", "CREATED", "STATE", "NODE", "IMAGE", "PORTS"];
    let mut rows = vec![header.map(String::from).to_vec()];
    rows.extend(tasks.iter().map(|task| {
        vec![
            task.short_id(),
            task.name.clone(),
            time_ago(task.created_time, now),
            task.state.name().to_string(),
            or_dash(&task.node_name),
            task.image.clone(),
            format_ports(&task.host_ports),
        ]
    }));
    let mut lines = table(&rows);
    let notes: Vec<String> = tasks.iter().filter_map(task_note).collect();
    if !notes.is_empty() {
        lines.push(String::new());
        lines.extend(notes);
    }
    lines
}

/// `3f2a9c1e  waiting: w1: needs 2.0 GiB memory, 1.1 GiB free` for a task that waits for a
/// node, `3f2a9c1e  failed: exit code 1` for one that failed (or was lost) with an error.
fn task_note(task: &Task) -> Option<String> {
    let (label, text) = match task.state {
        State::Pending => ("waiting", task.pending_reason.as_deref()?),
        State::Failed | State::Lost => (task.state.name(), task.error.as_deref()?),
        _ => return None,
    };
    Some(format!(
        "{}  {}: {}",
        task.short_id(),
        label.to_ascii_lowercase(),
        text.trim()
    ))
}

/// One task's fields, one per line.
fn task_details(task: &Task, now: DateTime<Utc>) -> Vec<String> {
    key_values(&[
        ("ID", task.id.to_string()),
        ("Name", task.name.clone()),
        ("State", task.state.name().to_string()),
        ("Desired", task.desired_state.name().to_string()),
        ("Node", task.node_name.clone()),
        ("Image", task.image.clone()),
        ("Created", time_with_age(task.created_time, now)),
        ("Started", time_with_age(task.start_time, now)),
        ("Finished", time_with_age(task.finish_time, now)),
        ("Restarts", restarts(task)),
        (
            "Policy",
            restart_policy_name(task.restart_policy).to_string(),
        ),
        ("Health", health(task)),
        ("Ports", detail_ports(task)),
        (
            "ExitCode",
            task.exit_code
                .map(|code| code.to_string())
                .unwrap_or_default(),
        ),
        ("Error", task.error.clone().unwrap_or_default()),
        ("Waiting", task.pending_reason.clone().unwrap_or_default()),
    ])
    .into_iter()
    .chain(history(task, now))
    .collect()
}

/// `2` or `2 of 5` when the task has a restart limit.
fn restarts(task: &Task) -> String {
    match task.max_restarts {
        Some(max) => format!("{} of {max}", task.restart_count),
        None => task.restart_count.to_string(),
    }
}

fn restart_policy_name(policy: RestartPolicy) -> &'static str {
    match policy {
        RestartPolicy::No => "no",
        RestartPolicy::OnFailure => "on-failure",
        RestartPolicy::Always => "always",
        RestartPolicy::UnlessStopped => "unless-stopped",
    }
}

/// `Healthy`, `Starting (2 failed probes)`, or empty for a task without a health check.
fn health(task: &Task) -> String {
    let Some(health) = task.health else {
        return String::new();
    };
    let name = match health {
        Health::Starting => "Starting",
        Health::Healthy => "Healthy",
        Health::Unhealthy => "Unhealthy",
    };
    match task.health_failures {
        0 => name.to_string(),
        1 => format!("{name} (1 failed probe)"),
        n => format!("{name} ({n} failed probes)"),
    }
}

/// The task's history, oldest first, under a `History:` line.
fn history(task: &Task, now: DateTime<Utc>) -> Vec<String> {
    if task.history.is_empty() {
        return Vec::new();
    }
    let mut lines = vec!["History:".to_string()];
    let rows: Vec<Vec<String>> = task
        .history
        .iter()
        .map(|entry| {
            vec![
                format!("  {}", time_ago(Some(entry.time), now)),
                entry.event.to_string(),
                entry.message.clone(),
            ]
        })
        .collect();
    lines.extend(table(&rows));
    lines
}

/// The bound ports once Docker bound them; before that, the ports the task asked for.
fn detail_ports(task: &Task) -> String {
    if !task.host_ports.is_empty() || task.port_bindings.is_empty() {
        return format_ports(&task.host_ports);
    }
    let requested: Vec<String> = sorted_ports(task.port_bindings.iter())
        .into_iter()
        .map(|(port, host_port)| {
            let host_port = if host_port.trim().is_empty() {
                "any"
            } else {
                host_port.as_str()
            };
            format!("{host_port}->{port}")
        })
        .collect();
    format!("{} (requested)", requested.join(", "))
}

/// What Docker bound, as `docker ps` shows it: `0.0.0.0:49155->7777/tcp`, one entry per
/// container port in port order. Of a port's bindings the first IPv4 one is shown (Docker
/// binds IPv4 and IPv6 alike); a port bound only on IPv6 shows its first binding.
fn format_ports(host_ports: &BTreeMap<String, Vec<HostBinding>>) -> String {
    sorted_ports(host_ports.iter())
        .into_iter()
        .filter_map(|(port, bindings)| {
            let binding = bindings
                .iter()
                .find(|binding| is_ipv4(&binding.host_ip))
                .or_else(|| bindings.first())?;
            Some(format!("{}->{port}", host_address(binding)))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// An empty host IP means every interface, which Docker writes `0.0.0.0`.
fn is_ipv4(host_ip: &str) -> bool {
    host_ip.is_empty() || host_ip.parse::<Ipv4Addr>().is_ok()
}

fn host_address(binding: &HostBinding) -> String {
    match binding.host_ip.as_str() {
        "" => format!("0.0.0.0:{}", binding.host_port),
        ip if ip.contains(':') => format!("[{ip}]:{}", binding.host_port),
        ip => format!("{ip}:{}", binding.host_port),
    }
}

/// Ports in numeric order (`80/tcp` before `7777/tcp`), not in the map's text order.
fn sorted_ports<'a, V>(ports: impl Iterator<Item = (&'a String, V)>) -> Vec<(&'a String, V)> {
    let mut ports: Vec<(&String, V)> = ports.collect();
    ports.sort_by_key(|(port, _)| {
        let (number, protocol) = port.split_once('/').unwrap_or((port.as_str(), ""));
        (
            number.parse::<u32>().unwrap_or(u32::MAX),
            protocol.to_string(),
        )
    });
    ports
}

fn or_dash(text: &str) -> String {
    if text.trim().is_empty() {
        "-".to_string()
    } else {
        text.to_string()
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use uuid::Uuid;

    use super::*;

    fn binding(ip: &str, port: &str) -> HostBinding {
        HostBinding {
            host_ip: ip.to_string(),
            host_port: port.to_string(),
        }
    }

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2024, 5, 1, 12, 0, 0).unwrap()
    }

    fn task(id: &str, name: &str, state: State, age_seconds: i64) -> Task {
        let mut task = Task::new(name, "cube-sample:latest");
        task.id = Uuid::parse_str(id).unwrap();
        task.state = state;
        task.created_time = Some(now() - chrono::Duration::seconds(age_seconds));
        task
    }

    #[test]
    fn ports_show_the_first_ipv4_binding_of_each_container_port() {
        let host_ports = BTreeMap::from([
            (
                "7777/tcp".to_string(),
                vec![binding("::", "49155"), binding("0.0.0.0", "49155")],
            ),
            ("80/tcp".to_string(), vec![binding("127.0.0.1", "8080")]),
        ]);
        assert_eq!(
            format_ports(&host_ports),
            "127.0.0.1:8080->80/tcp, 0.0.0.0:49155->7777/tcp"
        );
    }

    #[test]
    fn a_port_bound_only_on_ipv6_or_on_every_interface_is_still_shown() {
        let host_ports = BTreeMap::from([
            ("53/udp".to_string(), vec![binding("::", "5353")]),
            ("7777/tcp".to_string(), vec![binding("", "7777")]),
            ("9000/tcp".to_string(), vec![]),
        ]);
        assert_eq!(
            format_ports(&host_ports),
            "[::]:5353->53/udp, 0.0.0.0:7777->7777/tcp"
        );
        assert_eq!(format_ports(&BTreeMap::new()), "");
    }

    #[test]
    fn the_table_lists_newest_first_and_says_why_tasks_wait_or_failed() {
        let mut running = task(
            "bb1d59ef-9fc1-4e4b-a44d-db571eeed203",
            "web",
            State::Running,
            180,
        );
        running.node_name = "w1".to_string();
        running.host_ports =
            BTreeMap::from([("7777/tcp".to_string(), vec![binding("0.0.0.0", "49155")])]);
        let mut waiting = task(
            "3f2a9c1e-0000-4000-8000-000000000001",
            "big",
            State::Pending,
            5,
        );
        waiting.pending_reason = Some("w1: needs 2.0 GiB memory, 1.1 GiB free".to_string());
        let mut failed = task(
            "c0ffee00-0000-4000-8000-000000000004",
            "crash",
            State::Failed,
            7_200,
        );
        failed.node_name = "w1".to_string();
        failed.error = Some("exited with code 1".to_string());

        let lines = task_table(vec![failed, running, waiting], now());
        assert_eq!(
            lines,
            vec![
                "ID         NAME    CREATED         STATE     NODE   IMAGE                PORTS",
                "3f2a9c1e   big     5 seconds ago   Pending   -      cube-sample:latest",
                "bb1d59ef   web     3 minutes ago   Running   w1     cube-sample:latest   0.0.0.0:49155->7777/tcp",
                "c0ffee00   crash   2 hours ago     Failed    w1     cube-sample:latest",
                "",
                "3f2a9c1e  waiting: w1: needs 2.0 GiB memory, 1.1 GiB free",
                "c0ffee00  failed: exited with code 1",
            ]
        );
    }

    #[test]
    fn an_empty_cluster_shows_the_header_only() {
        assert_eq!(
            task_table(Vec::new(), now()),
            vec!["ID   NAME   CREATED   STATE   NODE   IMAGE   PORTS"]
        );
    }

    #[test]
    fn details_show_every_field_and_the_ports_asked_for_before_binding() {
        let mut waiting = task(
            "3f2a9c1e-0000-4000-8000-000000000001",
            "big",
            State::Pending,
            5,
        );
        waiting.port_bindings = BTreeMap::from([
            ("7777/tcp".to_string(), "7777".to_string()),
            ("8080/tcp".to_string(), String::new()),
        ]);
        waiting.pending_reason = Some("no nodes have joined the cluster".to_string());
        let lines = task_details(&waiting, now());
        assert_eq!(
            lines,
            vec![
                "ID:       3f2a9c1e-0000-4000-8000-000000000001",
                "Name:     big",
                "State:    Pending",
                "Desired:  Running",
                "Node:     -",
                "Image:    cube-sample:latest",
                "Created:  2024-05-01T11:59:55Z (5 seconds ago)",
                "Started:  -",
                "Finished: -",
                "Restarts: 0",
                "Policy:   no",
                "Health:   -",
                "Ports:    7777->7777/tcp, any->8080/tcp (requested)",
                "ExitCode: -",
                "Error:    -",
                "Waiting:  no nodes have joined the cluster",
            ]
        );
    }
}
