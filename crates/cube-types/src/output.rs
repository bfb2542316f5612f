//! A line of a task's output as `GET /tasks/{id}/logs` and `POST /tasks/{id}/exec` stream
//! it: one JSON object per line (`application/x-ndjson`), so that stdout and stderr stay
//! apart and the stream can say how it ended.

use serde::{Deserialize, Serialize};

/// One line of a stream of output. `Stream` is `stdout` or `stderr` for what the container
/// (or the command) wrote, with `Text` as written (its newline included); `end` for the last
/// line of a followed log, which says how the task ended (`State`, `ExitCode`, `Text`);
/// `exit` for the last line of a command, with its `ExitCode`; `error` when the stream broke
/// (`Text` says why).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputLine {
    #[serde(rename = "Stream")]
    pub stream: String,
    #[serde(rename = "Text", default, skip_serializing_if = "String::is_empty")]
    pub text: String,
    #[serde(rename = "State", default, skip_serializing_if = "Option::is_none")]
    pub state: Option<crate::State>,
    #[serde(rename = "ExitCode", default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
}

impl OutputLine {
    pub fn text(stream: &str, text: impl Into<String>) -> OutputLine {
        OutputLine {
            stream: stream.to_string(),
            text: text.into(),
            state: None,
            exit_code: None,
        }
    }

    /// The line as written on the wire: JSON and a newline.
    pub fn to_line(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).unwrap_or_else(|err| {
            format!("{{\"Stream\":\"error\",\"Text\":\"cannot write a line: {err}\"}}").into_bytes()
        });
        line.push(b'\n');
        line
    }

    /// The last line of a followed log: how the task's run ended.
    pub fn end_of(task: &crate::Task) -> OutputLine {
        let state = task.status.state;
        let mut text = format!("task {} ({}) ", task.name, task.short_id());
        if state.is_terminal() {
            text.push_str(&format!("ended {state}"));
            if let Some(code) = task.status.run.exit_code {
                text.push_str(&format!(", exit code {code}"));
            }
            if let Some(error) = &task.status.run.error {
                text.push_str(&format!(": {error}"));
            }
        } else {
            text.push_str(&format!(
                "stopped writing output; it is still {state} (its container was replaced or \
                 restarted)"
            ));
        }
        OutputLine {
            stream: "end".to_string(),
            text,
            state: Some(state),
            exit_code: task.status.run.exit_code,
        }
    }
}
