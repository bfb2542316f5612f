//! `cube events`: the manager's events as they happen (`GET /events`), one readable line
//! each, or the manager's JSON lines as they are (`-o json`).
//!
//! The stream is followed across its ends: a stream the manager dropped (this reader fell
//! behind) or closed (it stopped), or one that broke, is opened again with `?index=` the last
//! event shown, so nothing is shown twice and nothing is missed that the manager still keeps;
//! when it no longer keeps them (410, or a manager started again), the command says so and goes
//! on from the oldest it has. Each of these is said on stderr; stdout holds only events.

use std::time::Duration;

use anyhow::{anyhow, bail};
use chrono::{DateTime, SecondsFormat, Utc};
use clap::Args;
use cube_api::{ClientError, LineStream};
use serde_json::Value;

use super::{ManagerClient, ManagerFlags, OutputFormat};

/// The topics the manager publishes.
const TOPICS: [&str; 5] = ["Task", "Job", "Node", "Deployment", "Queue"];

/// The manager writes a heartbeat after 15 s of silence: nothing at all for this long means
/// the connection is dead, whatever TCP says.
const SILENCE_BOUND: Duration = Duration::from_secs(45);

/// How long the command keeps trying to reach a manager that went away while it followed
/// it (a restart), before it gives up.
const RECONNECT_FOR: Duration = Duration::from_secs(30);

/// Follow the cluster's events as they happen: tasks submitted, placed, running, failed;
/// nodes joining, going down, coming back; jobs registered, scaled, stopped.
///
/// Each event is one line: its time (UTC), topic, type, key (a task's short ID, a node's or a
/// job's name) and a summary. -o json prints the manager's JSON lines as they come (`Index`,
/// `Time`, `Topic`, `Type`, `Key`, `Job`, `Object`), for jq.
///
/// Without --index only new events are shown; with --index N, first every event after N the
/// manager still keeps (it keeps the last 10,000), then new ones. When the stream ends (this
/// command fell too far behind, the manager restarted, the connection broke) it is opened
/// again from the last event shown, and stderr says so. Ctrl-C ends it.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube events                              # every event from now on\n  \
    cube events --topic Task --topic Node    # only tasks' and nodes' events\n  \
    cube events --job web                    # job web's events and its copies'\n  \
    cube events --index 1000000000042        # the kept events after that index, then new ones\n  \
    cube events -o json | jq -c 'select(.Type == \"Failed\") | .Object.Error'")]
pub struct EventsArgs {
    /// Only events of this topic: Task, Job, Node, Deployment or Queue (the waiting list's
    /// entries) (repeatable).
    #[arg(long = "topic", value_name = "TOPIC", value_parser = parse_topic)]
    topics: Vec<String>,
    /// Only the events of this job: the job's own and those of its copies.
    #[arg(long, value_name = "NAME")]
    job: Option<String>,
    /// Start after this event index (an event's Index, or a list's X-Cube-Index header;
    /// with --project '*' on managers acting for their own shards, an event's Cursor).
    #[arg(long, value_name = "N", value_parser = parse_index)]
    index: Option<String>,
    #[command(flatten)]
    flags: ManagerFlags,
}

/// An event index (a whole number), or a gathered cursor of every project (`g` and
/// base64url), as the manager gave it.
fn parse_index(text: &str) -> Result<String, String> {
    let number = !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit());
    let cursor = text.len() > 1
        && text.starts_with('g')
        && text[1..]
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_');
    if number || cursor {
        Ok(text.to_string())
    } else {
        Err(format!(
            "{text:?} is not an event index (a whole number, an event's Index) nor a cursor of \
             every project (an event's Cursor, starting with g)"
        ))
    }
}

/// A topic's name as the manager spells it, in any case (`task` is `Task`).
fn parse_topic(text: &str) -> Result<String, String> {
    TOPICS
        .iter()
        .find(|topic| topic.eq_ignore_ascii_case(text))
        .map(|topic| topic.to_string())
        .ok_or_else(|| format!("{text:?} is not a topic; one of {}", TOPICS.join(", ")))
}

pub async fn events(args: EventsArgs) -> anyhow::Result<()> {
    let manager = ManagerClient::connect(&args.flags)?;
    tokio::select! {
        result = follow(&manager, &args) => result,
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}

/// How one stream ended.
enum StreamEnd {
    /// The manager said where to resume (`Dropped`, `Closed`).
    Resume(String),
    /// It ended or broke without saying: resume after the last event shown.
    Broken,
}

/// Opens the stream, prints what comes, and opens it again after each end, until the manager
/// cannot be reached for [`RECONNECT_FOR`].
async fn follow(manager: &ManagerClient, args: &EventsArgs) -> anyhow::Result<()> {
    let json = args.flags.output == OutputFormat::Json;
    // The index of the last event shown (or where to start): a resume asks for what follows.
    let mut position = args.index.clone();
    // Once a stream was open, a manager that cannot be reached is waited for a while.
    let mut followed = false;
    let mut unreachable_since: Option<tokio::time::Instant> = None;
    loop {
        let (mut lines, start) = match manager
            .get_lines(&events_path(args, position.as_deref()), None)
            .await
        {
            Ok(opened) => opened,
            Err(ClientError::Gone { oldest_index, .. }) if position.is_some() => {
                eprintln!(
                    "cube events: the manager no longer keeps the events after index {} (it \
                     restarted, or they are older than the last 10,000); some were missed. \
                     Going on from index {oldest_index}",
                    position.unwrap_or_default()
                );
                position = Some(oldest_index.to_string());
                continue;
            }
            // A cursor of every project that one of the managers no longer answers for (it
            // restarted, or another joined): followed again from now.
            Err(ClientError::Status {
                status, message, ..
            }) if status == reqwest::StatusCode::GONE && position.is_some() => {
                eprintln!("cube events: {message}. Some were missed; going on from now");
                position = None;
                continue;
            }
            Err(err @ ClientError::Unreachable { .. }) if followed => {
                let since = *unreachable_since.get_or_insert_with(tokio::time::Instant::now);
                if since.elapsed() > RECONNECT_FOR {
                    return Err(manager.explain(err));
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(err) => return Err(manager.explain(err)),
        };
        if unreachable_since.take().is_some() || followed {
            eprintln!(
                "cube events: following again from index {}",
                position.clone().or(start.clone()).unwrap_or_default()
            );
        }
        followed = true;
        // Without --index, the stream starts at the manager's index now: a resume from there
        // misses nothing that came after the command started.
        position = position.or(start);
        match print_stream(&mut lines, json, &mut position).await? {
            StreamEnd::Resume(index) => position = Some(index),
            StreamEnd::Broken => {}
        }
    }
}

/// `/events?topic=..&job=..&index=..`.
fn events_path(args: &EventsArgs, position: Option<&str>) -> String {
    let mut query: Vec<String> = args
        .topics
        .iter()
        .map(|topic| format!("topic={topic}"))
        .collect();
    if let Some(job) = &args.job {
        query.push(format!("job={}", encode(job)));
    }
    if let Some(index) = position {
        query.push(format!("index={index}"));
    }
    if query.is_empty() {
        "/events".to_string()
    } else {
        format!("/events?{}", query.join("&"))
    }
}

/// A query value with everything but letters, digits and `-_.~` percent-encoded.
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (byte as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// Prints a stream's events until it ends; `position` follows the last one printed.
async fn print_stream(
    lines: &mut LineStream,
    json: bool,
    position: &mut Option<String>,
) -> anyhow::Result<StreamEnd> {
    loop {
        let line = match tokio::time::timeout(SILENCE_BOUND, lines.next_line()).await {
            Err(_) => {
                eprintln!(
                    "cube events: nothing from the manager for {}s, not even a heartbeat; \
                     reconnecting",
                    SILENCE_BOUND.as_secs()
                );
                return Ok(StreamEnd::Broken);
            }
            Ok(Err(err)) => {
                eprintln!(
                    "cube events: the stream broke ({}); reconnecting",
                    err.cause()
                );
                return Ok(StreamEnd::Broken);
            }
            Ok(Ok(None)) => {
                eprintln!("cube events: the manager ended the stream; reconnecting");
                return Ok(StreamEnd::Broken);
            }
            // A heartbeat.
            Ok(Ok(Some(line))) if line.trim().is_empty() => continue,
            Ok(Ok(Some(line))) => line,
        };
        let event: Value = serde_json::from_str(&line)
            .map_err(|err| anyhow!("the manager sent a line that is not JSON ({err}): {line}"))?;
        // Where a resume starts after this event: its Cursor in a stream of every project on
        // managers acting for their own shards, else its Index.
        let index = match event["Cursor"].as_str() {
            Some(cursor) => Some(cursor.to_string()),
            None => event["Index"].as_u64().map(|index| index.to_string()),
        };
        if event["Topic"] == "Stream" {
            let Some(index) = index else {
                bail!("the manager ended the stream without saying where to resume: {line}");
            };
            match event["Type"].as_str() {
                Some("Dropped") => eprintln!(
                    "cube events: this command fell behind and the manager dropped its \
                     stream; reconnecting from index {index}"
                ),
                Some("Closed") => eprintln!(
                    "cube events: the manager is stopping; reconnecting from index {index}"
                ),
                _ => eprintln!(
                    "cube events: {}; reconnecting from index {index}",
                    event["Message"].as_str().unwrap_or("the stream ended")
                ),
            }
            return Ok(StreamEnd::Resume(index));
        }
        if json {
            println!("{line}");
        } else {
            println!("{}", event_line(&event));
        }
        if index.is_some() {
            *position = index;
        }
    }
}

/// One event as a line: time, topic, type, key, summary.
fn event_line(event: &Value) -> String {
    let text = |field: &str| event[field].as_str().unwrap_or_default();
    let time = DateTime::parse_from_rfc3339(text("Time"))
        .map(|time| {
            time.with_timezone(&Utc)
                .to_rfc3339_opts(SecondsFormat::Millis, true)
        })
        .unwrap_or_else(|_| text("Time").to_string());
    let topic = text("Topic");
    let key = if topic == "Task" {
        text("Key").chars().take(8).collect()
    } else {
        text("Key").to_string()
    };
    let mut summary = summary(topic, &event["Object"]);
    // Another project's than `default` (a stream of `--project '*'`): said at the end.
    if let Some(project) = event["Project"]
        .as_str()
        .filter(|project| *project != cube_types::project::DEFAULT_PROJECT)
    {
        summary = format!("{summary}  project={project}");
    }
    format!(
        "{time}  {topic:<10} {kind:<16} {key:<12} {summary}",
        kind = text("Type")
    )
    .trim_end()
    .to_string()
}

/// A few words on the event's object: a task's name, state, node and error; a node's status;
/// a job's version.
fn summary(topic: &str, object: &Value) -> String {
    let text = |field: &str| object[field].as_str().unwrap_or_default().to_string();
    match topic {
        "Task" => {
            let mut words = format!("{} {}", text("Name"), text("State"));
            if !text("NodeName").is_empty() {
                words.push_str(&format!(" on {}", text("NodeName")));
            }
            let why = match object["State"].as_str() {
                Some("Pending") => text("PendingReason"),
                Some("Failed" | "Lost") => text("Error"),
                Some("Completed") => object["ExitCode"]
                    .as_i64()
                    .map(|code| format!("exit code {code}"))
                    .unwrap_or_default(),
                _ => String::new(),
            };
            if !why.is_empty() {
                words.push_str(&format!(": {why}"));
            }
            if object["DesiredState"] == "Completed" && object["State"] != "Completed" {
                words.push_str(" (stop requested)");
            }
            words
        }
        "Node" => {
            let mut words = text("Status");
            if !text("StatusReason").is_empty() {
                words.push_str(&format!(": {}", text("StatusReason")));
            }
            words
        }
        "Job" => {
            let mut words = match object["Version"].as_u64() {
                Some(version) => format!("version {version}"),
                None => String::new(),
            };
            if object["Stopped"] == true {
                words.push_str(", stopped");
            }
            words
        }
        // A waiting-list entry: its state, kind and owner.
        "Queue" => [
            text("State"),
            text("Kind").to_lowercase(),
            match text("Owner").as_str() {
                "" => String::new(),
                owner => format!("of {owner}"),
            },
        ]
        .into_iter()
        .filter(|word| !word.is_empty())
        .collect::<Vec<_>>()
        .join(" "),
        _ => text("Status"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_index_is_a_whole_number_or_a_gathered_cursor_and_nothing_else() {
        assert_eq!(parse_index("1000000000042").as_deref(), Ok("1000000000042"));
        assert_eq!(parse_index("geyIxMjci").as_deref(), Ok("geyIxMjci"));
        for bad in ["", "g", "-1", "12a", "gab/cd", "abc"] {
            let refused = parse_index(bad).unwrap_err();
            assert!(refused.contains("not an event index"), "{bad}: {refused}");
        }
    }

    #[test]
    fn a_tasks_event_is_one_line_with_its_short_id_name_state_and_node() {
        let event = json!({
            "Index": 1000000000007u64, "Time": "2026-11-23T10:00:00.123456Z", "Topic": "Task",
            "Type": "Running", "Key": "3f2a9c1e-0000-4000-8000-000000000000",
            "Object": {"Name": "web", "State": "Running", "NodeName": "w1",
                       "DesiredState": "Running"}
        });
        assert_eq!(
            event_line(&event),
            "2026-11-23T10:00:00.123Z  Task       Running          3f2a9c1e     web Running on w1"
        );
        let failed = json!({"Topic": "Task", "Type": "Failed", "Key": "x", "Time": "t",
            "Object": {"Name": "web", "State": "Failed", "Error": "exit code 1"}});
        assert!(event_line(&failed).ends_with("web Failed: exit code 1"));
    }

    #[test]
    fn nodes_and_jobs_say_their_status_and_version() {
        let node = json!({"Topic": "Node", "Type": "NodeDown", "Key": "w1", "Time": "t",
            "Object": {"Status": "Down"}});
        assert!(
            event_line(&node).ends_with("w1           Down"),
            "{}",
            event_line(&node)
        );
        let job = json!({"Topic": "Job", "Type": "JobStopped", "Key": "web", "Time": "t",
            "Object": {"Version": 2, "Stopped": true}});
        assert!(event_line(&job).ends_with("version 2, stopped"));
    }

    #[test]
    fn the_path_carries_the_topics_the_job_and_the_index() {
        let args = EventsArgs {
            topics: vec!["Task".into(), "Node".into()],
            job: Some("web site".into()),
            index: None,
            flags: ManagerFlags {
                target: super::super::ClusterFlags {
                    manager: None,
                    cluster: None,
                    token: None,
                    ca_fingerprint: None,
                    project: None,
                },
                output: OutputFormat::Table,
            },
        };
        assert_eq!(
            events_path(&args, Some("5")),
            "/events?topic=Task&topic=Node&job=web%20site&index=5"
        );
        assert_eq!(parse_topic("task").unwrap(), "Task");
        assert_eq!(parse_topic("queue").unwrap(), "Queue");
        assert!(parse_topic("tasks").unwrap_err().contains("Deployment"));
    }
}
