//! `cube status [ID]`: the tasks as the manager sees them, like `docker ps`, or one task in
//! detail.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use chrono::{DateTime, Utc};
use clap::Args;
use cube_types::size::format_size;
use cube_types::{Health, HostBinding, RestartPolicy, State, Task};

use super::output::{
    format_cores, key_values, print_json, print_lines, print_yaml, table, time_ago, time_until,
    time_with_age,
};
use super::resolve::{find_task, is_ended};
use super::watch::{check_format, watch};
use super::{ListFlags, ListFormat, ManagerClient};

/// Show tasks: the tasks that run or will run as a table (newest first), or one task in
/// detail.
///
/// The table has a line per task: ID (short), NAME, CREATED, STATE, NODE, IMAGE and PORTS
/// (host address -> container port); -o wide adds CPU, MEMORY, RESTARTS and HEALTH. Under it,
/// each task that waits says why (no node fits; its node cannot be reached), each failed task
/// says what went wrong, and a task waiting out its restart backoff says when it restarts.
///
/// Ended tasks (Completed, Failed or Lost, with no restart to come) are left out, as
/// `docker ps` leaves out stopped containers; --all shows them. `cube status ID` finds ended
/// tasks too.
///
/// With ID (a full ID, a unique ID prefix, or a unique exact name, as for `cube stop`) it
/// shows that task's fields one per line. -o json and -o yaml print the manager's objects: an
/// array of tasks, or the one task; -o name the names, -q the IDs.
///
/// --watch draws the table (or the one task) again each time a task changes, until Ctrl-C:
/// the manager answers a blocking query the moment something changed, so nothing is asked
/// on a timer.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube status                     # the tasks that run or will, like docker ps\n  \
    cube status --all               # ... and the ended ones\n  \
    cube status -o wide             # with CPU, MEMORY, RESTARTS, HEALTH\n  \
    cube status 3f2a                # one task in detail, by ID prefix\n  \
    cube status test-chapter-9.1    # ... or by its name\n  \
    cube status --watch             # drawn again as tasks change, until Ctrl-C\n  \
    cube status web --watch         # one task, drawn again as it changes\n  \
    cube status -q | xargs -n1 cube stop\n  \
    cube status -o json | jq '.[] | select(.State == \"Running\") | .ID'")]
pub struct StatusArgs {
    /// Show only this task, in detail: a full ID, a unique ID prefix, or a unique exact name.
    #[arg(value_name = "ID")]
    task: Option<String>,
    /// Show ended tasks too (Completed, Failed or Lost, with no restart to come).
    #[arg(short, long)]
    all: bool,
    /// Draw the view again each time a task changes, until Ctrl-C (-o table or wide).
    #[arg(short, long)]
    watch: bool,
    #[command(flatten)]
    flags: ListFlags,
}

pub async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let manager = ManagerClient::connect_to(&args.flags.target)?;
    let now = Utc::now();
    let format = args.flags.format();
    if args.watch {
        return watch_tasks(&manager, &args).await;
    }
    if let Some(query) = &args.task {
        let task = find_task(&manager, query).await?;
        return match format {
            ListFormat::Table | ListFormat::Wide => {
                print_lines(&task_details(&task, now));
                Ok(())
            }
            ListFormat::Json => print_json(&task),
            ListFormat::Yaml => print_yaml(&task),
            ListFormat::Name => {
                println!("{}", task.name);
                Ok(())
            }
            ListFormat::Ids => {
                println!("{}", task.id);
                Ok(())
            }
        };
    }
    let tasks: Vec<Task> = manager.get("/tasks").await?;
    let (tasks, hidden) = listed(tasks, args.all);
    manager.print_project_line(format);
    match format {
        ListFormat::Table | ListFormat::Wide => {
            let mut lines = task_table(&tasks, now, format == ListFormat::Wide);
            if let Some(footer) = hidden_footer(hidden, &args.flags.target.hint()) {
                lines.extend([String::new(), footer]);
            }
            print_lines(&lines);
        }
        ListFormat::Json => print_json(&tasks)?,
        ListFormat::Yaml => print_yaml(&tasks)?,
        ListFormat::Name => print_lines(&tasks.iter().map(|t| t.name.clone()).collect::<Vec<_>>()),
        ListFormat::Ids => print_lines(&tasks.iter().map(|t| t.id.to_string()).collect::<Vec<_>>()),
    }
    Ok(())
}

/// `cube status --watch [ID]`: the table (or one task) drawn again as tasks change.
async fn watch_tasks(manager: &ManagerClient, args: &StatusArgs) -> anyhow::Result<()> {
    let wide = check_format(args.flags.format())?;
    if let Some(query) = &args.task {
        let id = find_task(manager, query).await?.id;
        let path = format!("/tasks/{id}");
        let title = format!("cube status {} --watch", &id.to_string()[..8]);
        // The blocking query wakes on any task's change; its answer is kept small.
        return watch(manager, "/tasks?limit=1&summary=true", &title, |_| {
            let path = &path;
            async move {
                let task: Task = manager.get(path).await?;
                Ok(task_details(&task, Utc::now()))
            }
        })
        .await;
    }
    let hint = args.flags.target.hint();
    let all = args.all;
    watch(
        manager,
        "/tasks?summary=true",
        "cube status --watch",
        |answer| {
            let hint = &hint;
            async move {
                let tasks: Vec<Task> = serde_json::from_value(answer)
                    .map_err(|err| anyhow::anyhow!("cannot read the manager's tasks: {err}"))?;
                let (tasks, hidden) = listed(tasks, all);
                let mut lines = task_table(&tasks, Utc::now(), wide);
                if let Some(footer) = hidden_footer(hidden, hint) {
                    lines.extend([String::new(), footer]);
                }
                Ok(lines)
            }
        },
    )
    .await
}

/// The tasks to list, newest first (as `docker ps`; tasks without a creation time last, the
/// manager's order breaking ties), without the ended ones unless `all`; and how many were
/// left out.
fn listed(mut tasks: Vec<Task>, all: bool) -> (Vec<Task>, usize) {
    tasks.sort_by_key(|task| Reverse(task.status.created_time));
    if all {
        return (tasks, 0);
    }
    let before = tasks.len();
    tasks.retain(|task| !is_ended(task));
    let hidden = before - tasks.len();
    (tasks, hidden)
}

/// `3 ended tasks not shown; cube status --all`, when some were left out.
fn hidden_footer(hidden: usize, manager_hint: &str) -> Option<String> {
    let tasks = match hidden {
        0 => return None,
        1 => "1 ended task".to_string(),
        n => format!("{n} ended tasks"),
    };
    Some(format!(
        "{tasks} not shown; cube status --all{manager_hint}"
    ))
}

/// The task table, in the order given, then a note for each task that waits, failed or
/// restarts, so that "why is my task not running?" is answered on the same screen. `wide`
/// adds CPU, MEMORY, RESTARTS and HEALTH.
///
/// Tasks of more than one project (`cube --project '*' status`) get a PROJECT column.
fn task_table(tasks: &[Task], now: DateTime<Utc>, wide: bool) -> Vec<String> {
    let projects = tasks
        .iter()
        .map(|task| task.spec.project.as_str())
        .collect::<std::collections::BTreeSet<_>>();
    let with_project = projects.len() > 1;
    let mut header = vec!["ID", "NAME", "CREATED", "STATE", "NODE", "IMAGE"];
    if with_project {
        header.insert(1, "PROJECT");
    }
    if wide {
        header.extend(["CPU", "MEMORY", "RESTARTS", "HEALTH"]);
    }
    header.push("PORTS");
    let mut rows = vec![header.into_iter().map(String::from).collect::<Vec<_>>()];
    rows.extend(tasks.iter().map(|task| {
        let mut row = vec![
            task.short_id(),
            task.name.clone(),
            time_ago(task.status.created_time, now),
            state_cell(task),
            or_dash(&task.status.node_name),
            image_cell(task),
        ];
        if with_project {
            row.insert(1, task.spec.project.clone());
        }
        if wide {
            row.extend([
                limit_or_dash(task.spec.cpu > 0.0, || format_cores(task.spec.cpu)),
                limit_or_dash(task.spec.memory > 0, || format_size(task.spec.memory)),
                restarts(task),
                or_dash(health_name(task)),
            ]);
        }
        row.push(bound_ports(task));
        row
    }));
    let mut lines = table(&rows);
    let notes: Vec<String> = tasks
        .iter()
        .filter_map(|task| task_note(task, now))
        .collect();
    if !notes.is_empty() {
        lines.push(String::new());
        lines.extend(notes);
    }
    lines
}

/// The state's name, or `Restarting` while the task waits out its restart backoff: between
/// two runs a task must not look like one that failed for good.
fn state_cell(task: &Task) -> String {
    if task.status.next_restart.is_some() {
        "Restarting".to_string()
    } else {
        task.status.state.name().to_string()
    }
}

/// One note per task that needs one:
/// - `3f2a9c1e  waiting: w1: needs 2.0 GiB memory, 1.1 GiB free` (no node fits);
/// - `3f2a9c1e  waiting: cannot reach w1 (next attempt in 3s)` (its node cannot be reached);
/// - `3f2a9c1e  restarting in 6s (attempt 3 of 5); failed: exit code 1` (restart backoff);
/// - `3f2a9c1e  failed: exit code 1` (failed, or lost, with an error).
fn task_note(task: &Task, now: DateTime<Utc>) -> Option<String> {
    let text = if let Some(restart) = restart_phrase(task, now) {
        match last_error(task) {
            Some(error) => format!("{}; {error}", lowercase_first(&restart)),
            None => lowercase_first(&restart),
        }
    } else if let Some(waiting) = waiting_phrase(task, now) {
        format!("waiting: {waiting}")
    } else if task.status.state == State::Pending {
        format!("waiting: {}", task.status.pending_reason.as_deref()?.trim())
    } else {
        last_error(task)?
    };
    Some(format!("{}  {text}", task.short_id()))
}

/// `failed: exit code 1` for a failed or lost task with an error.
fn last_error(task: &Task) -> Option<String> {
    match task.status.state {
        State::Failed | State::Lost => Some(format!(
            "{}: {}",
            task.status.state.name().to_ascii_lowercase(),
            task.status.run.error.as_deref()?.trim()
        )),
        _ => None,
    }
}

/// `Restarting in 6s (attempt 3 of 5)` while the task waits out its restart backoff: the
/// coming run is restart number `RestartCount + 1`, of `MaxRestarts` when there is a limit.
fn restart_phrase(task: &Task, now: DateTime<Utc>) -> Option<String> {
    let at = task.status.next_restart?;
    let attempt = task.status.restart_count.saturating_add(1);
    let limit = task
        .spec
        .max_restarts
        .map(|max| format!(" of {max}"))
        .unwrap_or_default();
    Some(format!(
        "Restarting {} (attempt {attempt}{limit})",
        time_until(at, now)
    ))
}

/// `cannot reach w1 (next attempt in 3s)` while the manager cannot hand the task to its node
/// (or stop it there) and keeps trying.
fn waiting_phrase(task: &Task, now: DateTime<Utc>) -> Option<String> {
    let error = task.status.dispatch_error.as_deref()?.trim();
    Some(match task.status.next_attempt {
        Some(at) => format!("{error} (next attempt {})", time_until(at, now)),
        None => error.to_string(),
    })
}

fn lowercase_first(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// One task's fields, one per line.
fn task_details(task: &Task, now: DateTime<Utc>) -> Vec<String> {
    let state = match restart_phrase(task, now) {
        Some(restart) => format!("{}; {restart}", task.status.state.name()),
        None => task.status.state.name().to_string(),
    };
    let mut pairs = vec![
        ("ID", task.id.to_string()),
        ("Name", task.name.clone()),
        ("State", state),
    ];
    if let Some(desired) = desired(task) {
        pairs.push(("Desired", desired));
    }
    let waiting: Vec<String> = task
        .status
        .pending_reason
        .iter()
        .map(|reason| reason.trim().to_string())
        .chain(waiting_phrase(task, now))
        .collect();
    pairs.extend([
        ("Node", task.status.node_name.to_string()),
        ("Image", image_cell(task)),
        ("Cmd", command_line(&task.spec.cmd)),
        ("Env", task.spec.env.join("\n")),
        (
            "Cpu",
            limit_or_none(task.spec.cpu > 0.0, || {
                format!("{} cores", format_cores(task.spec.cpu))
            }),
        ),
        (
            "Memory",
            limit_or_none(task.spec.memory > 0, || format_size(task.spec.memory)),
        ),
        (
            "Disk",
            if task.spec.disk > 0 {
                format_size(task.spec.disk)
            } else {
                String::new()
            },
        ),
        ("Container", short_container(&task.status.run.container_id)),
        ("Created", time_with_age(task.status.created_time, now)),
        ("Started", time_with_age(task.status.run.start_time, now)),
        ("Finished", time_with_age(task.status.run.finish_time, now)),
        ("Restarts", restarts(task)),
        (
            "Policy",
            restart_policy_name(task.spec.restart_policy).to_string(),
        ),
        ("Health", health(task)),
        ("Ports", detail_ports(task)),
        (
            "ExitCode",
            task.status
                .run
                .exit_code
                .map(|code| code.to_string())
                .unwrap_or_default(),
        ),
        ("Error", task.status.run.error.clone().unwrap_or_default()),
        ("Waiting", waiting.join("\n")),
    ]);
    key_values(&pairs)
        .into_iter()
        .chain(pod_containers(task))
        .chain(history(task, now))
        .collect()
}

/// A pod's image column: `pod: a, b` (its services); a task's image otherwise.
fn image_cell(task: &Task) -> String {
    match &task.spec.pod {
        Some(pod) => format!("pod: {}", pod.service_names().join(", ")),
        None => task.spec.image.clone(),
    }
}

/// A pod's containers, one line each: name, state, exit code, health, container ID.
fn pod_containers(task: &Task) -> Vec<String> {
    let Some(pod) = &task.spec.pod else {
        return Vec::new();
    };
    let mut rows = vec![
        ["CONTAINER", "IMAGE", "STATUS", "EXIT", "HEALTH", "ID"]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>(),
    ];
    let image_of = |name: &str| {
        pod.spec
            .services
            .iter()
            .find(|service| service.name == name)
            .map(|service| service.image.clone())
            .unwrap_or_else(|| cube_runtime::sample_image::PAUSE_IMAGE.to_string())
    };
    if task.status.run.containers.is_empty() {
        for service in &pod.spec.services {
            rows.push(vec![
                service.name.clone(),
                service.image.clone(),
                "-".to_string(),
                "-".to_string(),
                "-".to_string(),
                "-".to_string(),
            ]);
        }
    }
    for container in &task.status.run.containers {
        rows.push(vec![
            container.name.clone(),
            image_of(&container.name),
            container.status.clone(),
            container
                .exit_code
                .map(|code| code.to_string())
                .unwrap_or_else(|| "-".to_string()),
            match container.health {
                Some(Health::Healthy) => "Healthy",
                Some(Health::Starting) => "Starting",
                Some(Health::Unhealthy) => "Unhealthy",
                None => "-",
            }
            .to_string(),
            or_dash(&short_container(&container.container_id)),
        ]);
    }
    let mut lines = vec![String::new()];
    lines.extend(table(&rows));
    lines
}

/// The desired state when it says something the state does not: `Completed` while a task is
/// being stopped, `Running` while a failed task waits to restart. Not for a task that runs as
/// asked, nor for one that ended (what it was asked no longer matters).
fn desired(task: &Task) -> Option<String> {
    if is_ended(task) {
        return None;
    }
    let as_asked = task.spec.desired_state == State::Running
        && matches!(
            task.status.state,
            State::Pending | State::Scheduled | State::Running
        );
    (!as_asked).then(|| task.spec.desired_state.name().to_string())
}

/// The command as a shell would take it: words with spaces or quotes are quoted.
fn command_line(cmd: &[String]) -> String {
    cmd.iter()
        .map(|word| {
            let plain = !word.is_empty()
                && word
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c));
            if plain {
                word.clone()
            } else {
                format!("'{}'", word.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The first 12 characters of a container ID, as `docker ps` shows it.
fn short_container(id: &str) -> String {
    id.chars().take(12).collect()
}

/// A limit's value, or `-` in a table when the task has none.
fn limit_or_dash(set: bool, value: impl FnOnce() -> String) -> String {
    if set { value() } else { "-".to_string() }
}

/// A limit's value, or `no limit` in a details block.
fn limit_or_none(set: bool, value: impl FnOnce() -> String) -> String {
    if set { value() } else { "no limit".to_string() }
}

/// `2` or `2 of 5` when the task has a restart limit.
fn restarts(task: &Task) -> String {
    match task.spec.max_restarts {
        Some(max) => format!("{} of {max}", task.status.restart_count),
        None => task.status.restart_count.to_string(),
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

/// `Healthy`, `Starting` or `Unhealthy`, or empty for a task without a health check.
fn health_name(task: &Task) -> &'static str {
    match task.status.run.health {
        None => "",
        Some(Health::Starting) => "Starting",
        Some(Health::Healthy) => "Healthy",
        Some(Health::Unhealthy) => "Unhealthy",
    }
}

/// `Healthy`, `Starting (2 failed probes)`, or empty for a task without a health check.
fn health(task: &Task) -> String {
    let name = health_name(task);
    if name.is_empty() {
        return String::new();
    }
    match task.status.run.health_failures {
        0 => name.to_string(),
        1 => format!("{name} (1 failed probe)"),
        n => format!("{name} ({n} failed probes)"),
    }
}

/// The task's history, oldest first, under a `History:` line.
fn history(task: &Task, now: DateTime<Utc>) -> Vec<String> {
    if task.status.history.is_empty() {
        return Vec::new();
    }
    let mut lines = vec!["History:".to_string()];
    let rows: Vec<Vec<String>> = task
        .status
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

/// What Docker bound for the task's run; nothing once the run is over (or between two runs),
/// since its ports are then free for others.
fn bound_ports(task: &Task) -> String {
    if run_is_over(task) {
        String::new()
    } else {
        format_ports(&task.status.run.host_ports)
    }
}

/// Whether the task's last run ended: its host ports, if a report still carries them, are
/// stale.
fn run_is_over(task: &Task) -> bool {
    matches!(
        task.status.state,
        State::Completed | State::Failed | State::Lost
    )
}

/// The bound ports once Docker bound them; before that (or after the run), the ports the task
/// asks for.
fn detail_ports(task: &Task) -> String {
    let bound = bound_ports(task);
    if !bound.is_empty() || task.spec.port_bindings.is_empty() {
        return bound;
    }
    let requested: Vec<String> = sorted_ports(task.spec.port_bindings.iter())
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
        task.status.state = state;
        task.status.created_time = Some(now() - chrono::Duration::seconds(age_seconds));
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
        running.status.node_name = "w1".into();
        running.status.run.host_ports =
            BTreeMap::from([("7777/tcp".to_string(), vec![binding("0.0.0.0", "49155")])]);
        let mut waiting = task(
            "3f2a9c1e-0000-4000-8000-000000000001",
            "big",
            State::Pending,
            5,
        );
        waiting.status.pending_reason = Some("w1: needs 2.0 GiB memory, 1.1 GiB free".to_string());
        let mut failed = task(
            "c0ffee00-0000-4000-8000-000000000004",
            "crash",
            State::Failed,
            7_200,
        );
        failed.status.node_name = "w1".into();
        failed.status.run.error = Some("exited with code 1".to_string());

        let (tasks, hidden) = listed(vec![failed, running, waiting], true);
        assert_eq!(hidden, 0);
        let lines = task_table(&tasks, now(), false);
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
            task_table(&[], now(), false),
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
        waiting.spec.port_bindings = BTreeMap::from([
            ("7777/tcp".to_string(), "7777".to_string()),
            ("8080/tcp".to_string(), String::new()),
        ]);
        waiting.status.pending_reason = Some("no nodes have joined the cluster".to_string());
        let lines = task_details(&waiting, now());
        assert_eq!(
            lines,
            vec![
                "ID:        3f2a9c1e-0000-4000-8000-000000000001",
                "Name:      big",
                "State:     Pending",
                "Node:      -",
                "Image:     cube-sample:latest",
                "Cmd:       -",
                "Env:       -",
                "Cpu:       no limit",
                "Memory:    no limit",
                "Disk:      -",
                "Container: -",
                "Created:   2024-05-01T11:59:55Z (5 seconds ago)",
                "Started:   -",
                "Finished:  -",
                "Restarts:  0",
                "Policy:    no",
                "Health:    -",
                "Ports:     7777->7777/tcp, any->8080/tcp (requested)",
                "ExitCode:  -",
                "Error:     -",
                "Waiting:   no nodes have joined the cluster",
            ]
        );
    }

    /// A task that failed and waits out its restart backoff: its third restart of at most five
    /// is due in 5.2 s.
    fn restarting() -> Task {
        let mut task = task(
            "c0ffee00-0000-4000-8000-000000000004",
            "crash",
            State::Failed,
            60,
        );
        task.status.node_name = "w1".into();
        task.status.run.error = Some("exited with code 1".to_string());
        task.status.restart_count = 2;
        task.spec.max_restarts = Some(5);
        task.spec.restart_policy = RestartPolicy::OnFailure;
        task.status.next_restart = Some(now() + chrono::Duration::milliseconds(5_200));
        task
    }

    #[test]
    fn a_task_waiting_to_restart_says_when_and_which_attempt() {
        let task = restarting();
        assert_eq!(
            restart_phrase(&task, now()).as_deref(),
            Some("Restarting in 6s (attempt 3 of 5)")
        );
        let lines = task_table(std::slice::from_ref(&task), now(), false);
        assert_eq!(
            lines,
            vec![
                "ID         NAME    CREATED        STATE        NODE   IMAGE                PORTS",
                "c0ffee00   crash   1 minute ago   Restarting   w1     cube-sample:latest",
                "",
                "c0ffee00  restarting in 6s (attempt 3 of 5); failed: exited with code 1",
            ]
        );
        let details = task_details(&task, now());
        assert!(
            details.contains(&"State:     Failed; Restarting in 6s (attempt 3 of 5)".to_string()),
            "{details:#?}"
        );
        assert!(
            details.contains(&"Desired:   Running".to_string()),
            "{details:#?}"
        );

        let mut unlimited = restarting();
        unlimited.spec.max_restarts = None;
        assert_eq!(
            restart_phrase(&unlimited, now()).as_deref(),
            Some("Restarting in 6s (attempt 3)")
        );
    }

    #[test]
    fn a_task_whose_node_cannot_be_reached_says_why_and_when_it_tries_again() {
        let mut task = task(
            "3f2a9c1e-0000-4000-8000-000000000001",
            "web",
            State::Scheduled,
            10,
        );
        task.status.node_name = "w1".into();
        task.status.dispatch_error =
            Some("cannot reach w1 at http://10.0.0.9:5556: connection refused".to_string());
        task.status.next_attempt = Some(now() + chrono::Duration::seconds(3));
        let lines = task_table(std::slice::from_ref(&task), now(), false);
        assert_eq!(
            lines.last().map(String::as_str),
            Some(
                "3f2a9c1e  waiting: cannot reach w1 at http://10.0.0.9:5556: connection refused \
                 (next attempt in 3s)"
            )
        );
        let details = task_details(&task, now());
        assert!(
            details.contains(
                &"Waiting:   cannot reach w1 at http://10.0.0.9:5556: connection refused (next \
                  attempt in 3s)"
                    .to_string()
            ),
            "{details:#?}"
        );
    }

    #[test]
    fn ended_tasks_are_left_out_and_counted_unless_all_are_asked_for() {
        let running = task(
            "bb1d59ef-9fc1-4e4b-a44d-db571eeed203",
            "web",
            State::Running,
            10,
        );
        let completed = task(
            "d00d0000-0000-4000-8000-000000000005",
            "done",
            State::Completed,
            20,
        );
        let failed = task(
            "e0000000-0000-4000-8000-000000000006",
            "broke",
            State::Failed,
            30,
        );
        let lost = task(
            "f0000000-0000-4000-8000-000000000007",
            "gone",
            State::Lost,
            40,
        );
        let all = vec![lost, failed, restarting(), completed, running];

        let (shown, hidden) = listed(all.clone(), false);
        let names: Vec<&str> = shown.iter().map(|task| task.name.as_str()).collect();
        assert_eq!(
            names,
            vec!["web", "crash"],
            "a task waiting to restart stays"
        );
        assert_eq!(hidden, 3);
        assert_eq!(
            hidden_footer(hidden, "").as_deref(),
            Some("3 ended tasks not shown; cube status --all")
        );
        assert_eq!(
            hidden_footer(1, " -m 10.0.0.1:5555").as_deref(),
            Some("1 ended task not shown; cube status --all -m 10.0.0.1:5555")
        );
        assert_eq!(hidden_footer(0, ""), None);

        let (shown, hidden) = listed(all, true);
        assert_eq!(shown.len(), 5);
        assert_eq!(hidden, 0);
    }

    #[test]
    fn the_wide_table_adds_cpu_memory_restarts_and_health() {
        let mut web = task(
            "bb1d59ef-9fc1-4e4b-a44d-db571eeed203",
            "web",
            State::Running,
            180,
        );
        web.status.node_name = "w1".into();
        web.spec.cpu = 0.5;
        web.spec.memory = 256 * 1024 * 1024;
        web.status.restart_count = 1;
        web.spec.max_restarts = Some(3);
        web.status.run.health = Some(Health::Healthy);
        web.status.run.host_ports =
            BTreeMap::from([("7777/tcp".to_string(), vec![binding("0.0.0.0", "49155")])]);
        let plain = task(
            "3f2a9c1e-0000-4000-8000-000000000001",
            "plain",
            State::Running,
            200,
        );
        assert_eq!(
            task_table(&[web, plain], now(), true),
            vec![
                "ID         NAME    CREATED         STATE     NODE   IMAGE                CPU   MEMORY      RESTARTS   HEALTH    PORTS",
                "bb1d59ef   web     3 minutes ago   Running   w1     cube-sample:latest   0.5   256.0 MiB   1 of 3     Healthy   0.0.0.0:49155->7777/tcp",
                "3f2a9c1e   plain   3 minutes ago   Running   -      cube-sample:latest   -     -           0          -",
            ]
        );
    }

    #[test]
    fn an_ended_task_shows_no_ports_and_no_desired_state() {
        let mut failed = task(
            "c0ffee00-0000-4000-8000-000000000004",
            "crash",
            State::Failed,
            60,
        );
        failed.status.run.host_ports =
            BTreeMap::from([("7777/tcp".to_string(), vec![binding("0.0.0.0", "49155")])]);
        assert_eq!(bound_ports(&failed), "");
        let details = task_details(&failed, now());
        assert!(
            !details.iter().any(|line| line.starts_with("Desired:")),
            "{details:#?}"
        );
        assert!(
            details.contains(&"Ports:     -".to_string()),
            "{details:#?}"
        );

        let mut stopping = task(
            "bb1d59ef-9fc1-4e4b-a44d-db571eeed203",
            "web",
            State::Running,
            60,
        );
        stopping.spec.desired_state = State::Completed;
        assert_eq!(desired(&stopping).as_deref(), Some("Completed"));
        stopping.spec.desired_state = State::Running;
        assert_eq!(desired(&stopping), None, "a task that runs as asked");
    }

    #[test]
    fn details_show_the_command_environment_limits_and_container() {
        let mut web = task(
            "bb1d59ef-9fc1-4e4b-a44d-db571eeed203",
            "web",
            State::Running,
            60,
        );
        web.spec.cmd = vec!["sh".into(), "-c".into(), "echo 'hi' && sleep 600".into()];
        web.spec.env = vec!["A=1".into(), "B=two words".into()];
        web.spec.cpu = 1.5;
        web.spec.memory = 512 * 1024 * 1024;
        web.spec.disk = 1024 * 1024 * 1024;
        web.status.run.container_id = "4f9d1c2b3a4e5f60718293a4b5c6d7e8f9".to_string();
        let details = task_details(&web, now());
        for expected in [
            r#"Cmd:       sh -c 'echo '\''hi'\'' && sleep 600'"#,
            "Env:       A=1",
            "           B=two words",
            "Cpu:       1.5 cores",
            "Memory:    512.0 MiB",
            "Disk:      1.0 GiB",
            "Container: 4f9d1c2b3a4e",
        ] {
            assert!(
                details.iter().any(|line| line == expected),
                "{expected:?} not in {details:#?}"
            );
        }
    }
}
