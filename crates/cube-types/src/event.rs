//! A `TaskEvent`: a request to move a task to a state, the unit of desired state.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::state::State;
use crate::task::Task;

/// `{ID, State, Timestamp, Task}`: `State` is the state asked for (`Running` to run the task,
/// `Completed` to stop it), `Task` the task itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskEvent {
    #[serde(rename = "ID", default)]
    pub id: Uuid,
    #[serde(rename = "State")]
    pub state: State,
    #[serde(rename = "Timestamp", default, with = "crate::time::optional")]
    pub timestamp: Option<DateTime<Utc>>,
    #[serde(rename = "Task")]
    pub task: Task,
}

/// Why a submitted body was refused; the message names the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmissionError {
    #[error("invalid JSON: {0}")]
    Syntax(String),
    #[error("{0}")]
    Field(String),
    #[error("invalid task: {}", .0.join("; "))]
    Invalid(Vec<String>),
}

/// What `POST /tasks` accepted: the event (a bare task is wrapped in one asking for `Running`),
/// normalized and validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Submission {
    pub event: TaskEvent,
}

impl Submission {
    /// Reads a `POST /tasks` body: a `TaskEvent` as in the book (`{"ID", "State", "Task"}`)
    /// or a bare `Task`. The task is validated ([`Task::validate`]) and normalized
    /// ([`Task::normalize`]); the event's and the task's IDs are generated when missing, and
    /// its time set when missing. A stop (`State` 3, `Completed`) needs the task's ID and
    /// nothing else. Status fields in the task (`State`, `RestartCount`, `History`, ...) are
    /// read and left for the receiver to clear ([`Task::clear_status`]).
    pub fn parse(body: &[u8], now: DateTime<Utc>) -> Result<Submission, SubmissionError> {
        let probe: serde_json::Value =
            serde_json::from_slice(body).map_err(|err| SubmissionError::Syntax(err.to_string()))?;
        let Some(object) = probe.as_object() else {
            return Err(SubmissionError::Field(format!(
                "expected a JSON object (a TaskEvent or a Task), found {}",
                json_kind(&probe)
            )));
        };
        let mut event = if object.contains_key("Task") {
            decode::<TaskEvent>(body)?
        } else {
            let task = decode::<Task>(body)?;
            TaskEvent {
                id: Uuid::nil(),
                state: State::Running,
                timestamp: None,
                task,
            }
        };
        if event.state == State::Completed {
            // A stop names a task that exists; nothing else of the `Task` is read, so it is
            // not validated, and an ID generated here would name no task at all.
            if event.task.id.is_nil() {
                return Err(SubmissionError::Field(
                    "Task.ID: a TaskEvent with State 3 (Completed) stops a task and needs the \
                     task's ID"
                        .to_string(),
                ));
            }
        } else {
            let findings = event.task.validate();
            if !findings.is_empty() {
                return Err(SubmissionError::Invalid(findings));
            }
        }
        event.task.normalize();
        if event.id.is_nil() {
            event.id = Uuid::new_v4();
        }
        event.timestamp.get_or_insert(now);
        Ok(Submission { event })
    }
}

/// Decodes a JSON body with the path of the field at fault in the message (`Task.ID: …`)
/// and, for an unknown field, the field most likely meant. Used for every JSON Cube reads
/// from users: tasks, and jobs.
pub fn decode<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, SubmissionError> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        let mut message = suggest_field(&inner.to_string());
        // A pod's compose file is refused with the place in the compose file; serde_json's
        // place after it (the end of the `Pod` value in the body) would read as the one meant.
        if (path == "Pod" || path.ends_with(".Pod"))
            && let Some((text, _)) = message.rsplit_once(" at line ")
        {
            message = text.to_string();
        }
        if path == "." || path.is_empty() {
            SubmissionError::Field(message)
        } else {
            SubmissionError::Field(format!("{path}: {message}"))
        }
    })
}

/// Serde's "unknown field `image`, expected one of `ID`, `Image`, ..." with the list replaced
/// by the field the writer most likely meant, when there is one: the same name in another
/// case, or one within two edits (`Memmory` → `Memory`). Any other message is returned as it
/// is.
fn suggest_field(message: &str) -> String {
    let Some(rest) = message.strip_prefix("unknown field `") else {
        return message.to_string();
    };
    let Some((unknown, rest)) = rest.split_once('`') else {
        return message.to_string();
    };
    let Some(expected_at) = rest.find("expected") else {
        return message.to_string();
    };
    let (expected, location) = match rest.rfind(" at line ") {
        Some(at) if at > expected_at => (&rest[expected_at..at], &rest[at..]),
        _ => (&rest[expected_at..], ""),
    };
    let known: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
    let lower = unknown.to_lowercase();
    let same_but_case = known.iter().find(|name| name.to_lowercase() == lower);
    let nearest = || {
        known
            .iter()
            .map(|name| (edit_distance(&name.to_lowercase(), &lower), name))
            .filter(|(distance, _)| *distance <= 2)
            .min_by_key(|(distance, _)| *distance)
            .map(|(_, name)| name)
    };
    match same_but_case.or_else(nearest) {
        Some(suggestion) => {
            format!("unknown field `{unknown}`; did you mean `{suggestion}`?{location}")
        }
        None => message.to_string(),
    }
}

/// Levenshtein distance: the fewest insertions, deletions and substitutions from `a` to `b`.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current.push(substitution.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The book's chapter 9 task event, unchanged.
    const BOOK_EVENT: &str = r#"{"ID": "a7aa1d44-08f6-443e-9378-f5884311019e", "State": 2,
        "Task": {"State": 1, "ID": "bb1d59ef-9fc1-4e4b-a44d-db571eeed203", "Name": "test-chapter-9.1",
                 "Image": "timboring/echo-server:latest", "ExposedPorts": {"7777/tcp": {}},
                 "PortBindings": {"7777/tcp": "7777"}, "HealthCheck": "/health"}}"#;

    fn parse(body: &str) -> Result<TaskEvent, SubmissionError> {
        Submission::parse(body.as_bytes(), Utc::now()).map(|s| s.event)
    }

    #[test]
    fn the_book_task_event_is_accepted_unchanged() {
        let event = parse(BOOK_EVENT).unwrap();
        assert_eq!(event.id.to_string(), "a7aa1d44-08f6-443e-9378-f5884311019e");
        assert_eq!(event.state, State::Running);
        assert_eq!(event.task.status.state, State::Scheduled);
        assert_eq!(
            event.task.id.to_string(),
            "bb1d59ef-9fc1-4e4b-a44d-db571eeed203"
        );
        assert_eq!(
            event
                .task
                .spec
                .port_bindings
                .get("7777/tcp")
                .map(String::as_str),
            Some("7777")
        );
        assert_eq!(event.task.spec.health_check, "/health");
        assert!(event.timestamp.is_some());
    }

    #[test]
    fn a_bare_task_is_wrapped_in_an_event_asking_for_running() {
        let event = parse(r#"{"Name": "web", "Image": "busybox"}"#).unwrap();
        assert_eq!(event.state, State::Running);
        assert!(!event.id.is_nil() && !event.task.id.is_nil());
    }

    #[test]
    fn an_unknown_field_is_named_with_its_path() {
        let err = parse(r#"{"State": 2, "Task": {"Image": "x", "Colour": "red"}}"#).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("Task") && text.contains("unknown field `Colour`"),
            "{text}"
        );
    }

    #[test]
    fn a_malformed_id_is_named_with_its_path() {
        let err = parse(r#"{"State": 2, "Task": {"ID": "not-a-uuid", "Image": "x"}}"#).unwrap_err();
        assert!(err.to_string().starts_with("Task.ID: "), "{err}");
    }

    #[test]
    fn a_missing_image_is_refused() {
        let err = parse(r#"{"State": 2, "Task": {"Name": "x"}}"#).unwrap_err();
        assert_eq!(err.to_string(), "invalid task: Image: missing image name");
    }

    #[test]
    fn malformed_json_and_non_objects_are_refused() {
        assert!(matches!(
            parse("{\"Image\": "),
            Err(SubmissionError::Syntax(_))
        ));
        let err = parse("[1, 2]").unwrap_err();
        assert!(err.to_string().contains("found an array"), "{err}");
    }

    #[test]
    fn a_field_in_the_wrong_case_suggests_the_right_one() {
        let err = parse(r#"{"State": 2, "Task": {"image": "x"}}"#).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("Task.image: unknown field `image`; did you mean `Image`?"),
            "{text}"
        );
        assert!(!text.contains("expected one of"), "{text}");
    }

    #[test]
    fn a_misspelt_field_suggests_the_nearest_one() {
        let err = parse(r#"{"Image": "x", "Memmory": "1Gi"}"#).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("Memmory: unknown field `Memmory`; did you mean `Memory`?"),
            "{err}"
        );
        let err = parse(r#"{"image": "x", "HealthCheckIntervall": "1s"}"#).unwrap_err();
        assert!(err.to_string().contains("did you mean `Image`?"), "{err}");
        let err = parse(r#"{"Image": "x", "Colour": "red"}"#).unwrap_err();
        assert!(err.to_string().contains("expected one of"), "{err}");
    }

    #[test]
    fn edit_distance_counts_single_edits() {
        assert_eq!(edit_distance("memory", "memmory"), 1);
        assert_eq!(edit_distance("cpu", "cpus"), 1);
        assert_eq!(edit_distance("env", "cmd"), 3);
        assert_eq!(edit_distance("", "ab"), 2);
    }

    #[test]
    fn a_stop_without_a_task_id_says_that_a_stop_needs_one() {
        let err = parse(r#"{"State": 3, "Task": {"Image": "x"}}"#).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("Task.ID: a TaskEvent with State 3 (Completed) stops a task"),
            "{err}"
        );
    }

    #[test]
    fn a_stop_with_an_id_needs_nothing_else() {
        let id = Uuid::new_v4();
        let event = parse(&format!(r#"{{"State": 3, "Task": {{"ID": "{id}"}}}}"#)).unwrap();
        assert_eq!(event.state, State::Completed);
        assert_eq!(event.task.id, id);
    }

    #[test]
    fn status_fields_in_a_submission_are_read_not_refused() {
        let event = parse(
            r#"{"Image": "x", "State": "Failed", "RestartCount": 7, "FailureStreak": 3,
                "History": [{"Time": "2026-01-01T00:00:00Z", "Event": "Running"}]}"#,
        )
        .unwrap();
        assert_eq!(event.task.status.restart_count, 7);
    }
}
