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
    /// or a bare `Task`. The task is normalized ([`Task::normalize`]) and validated; the
    /// event's and the task's IDs are generated when missing, and its time set when missing.
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
        let findings = event.task.validate();
        if !findings.is_empty() {
            return Err(SubmissionError::Invalid(findings));
        }
        event.task.normalize();
        if event.id.is_nil() {
            event.id = Uuid::new_v4();
        }
        event.timestamp.get_or_insert(now);
        Ok(Submission { event })
    }
}

/// Decodes with the path of the field at fault in the message (`Task.ID: …`).
fn decode<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, SubmissionError> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        if path == "." || path.is_empty() {
            SubmissionError::Field(inner.to_string())
        } else {
            SubmissionError::Field(format!("{path}: {inner}"))
        }
    })
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
        assert_eq!(event.task.state, State::Scheduled);
        assert_eq!(
            event.task.id.to_string(),
            "bb1d59ef-9fc1-4e4b-a44d-db571eeed203"
        );
        assert_eq!(
            event.task.port_bindings.get("7777/tcp").map(String::as_str),
            Some("7777")
        );
        assert_eq!(event.task.health_check, "/health");
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
}
