//! Task files as people write them: JSON or YAML, from a file or from stdin, read into the
//! one JSON document the manager takes, with errors that point at the line and column of the
//! file as written.
//!
//! YAML is only another spelling of the same document: it mirrors the JSON field names
//! (`Image:`, `PortBindings:`), is turned into a JSON value, and then goes through the very
//! check the manager runs ([`Submission::parse`]), so a file means the same in both forms.

use std::io::Read;
use std::path::Path;

use anyhow::{Context, anyhow, bail};
use chrono::Utc;
use cube_types::{Submission, SubmissionError};
use serde_json::Value;

/// The largest task file the CLI sends: the manager's request body limit. The manager closes
/// the connection on a larger body without reading it, so the client would only see a broken
/// connection; refusing here names the file and its size instead.
pub const MAX_TASK_FILE_BYTES: usize = cube_api::MAX_BODY_BYTES;

/// A task file read and checked: what to send, and the name to use for it in messages.
#[derive(Debug)]
pub struct TaskDocument {
    /// The file's path as given, or `stdin`.
    pub origin: String,
    /// The document to send, as written (not Cube's re-encoding of the task), so that the
    /// manager sees what the user wrote.
    pub document: Value,
    /// What the manager will make of it (IDs generated for a file without them).
    pub submission: Submission,
}

/// How a task file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Json,
    Yaml,
}

/// Reads a task file, or stdin for `-`; refuses one larger than the manager takes.
pub fn read_task_file(path: &Path) -> anyhow::Result<TaskDocument> {
    let (origin, bytes) = if path.as_os_str() == "-" {
        let mut bytes = Vec::new();
        // One byte more than the limit tells "too large" apart from "exactly the limit"
        // without reading an endless stream to its end.
        std::io::stdin()
            .lock()
            .take(MAX_TASK_FILE_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .context("cannot read the task from stdin")?;
        if bytes.len() > MAX_TASK_FILE_BYTES {
            bail!(
                "stdin: the task is larger than the manager's limit of {} ({MAX_TASK_FILE_BYTES} \
                 bytes)",
                cube_types::size::format_size(MAX_TASK_FILE_BYTES as u64)
            );
        }
        ("stdin".to_string(), bytes)
    } else {
        let origin = path.display().to_string();
        // Asked before reading, so that a huge file is refused without loading it.
        let size = std::fs::metadata(path)
            .with_context(|| format!("cannot read {origin}"))?
            .len();
        refuse_oversized(&origin, size)?;
        // A blocking read is fine here: the command does nothing else while it waits.
        let bytes = std::fs::read(path).with_context(|| format!("cannot read {origin}"))?;
        refuse_oversized(&origin, bytes.len() as u64)?;
        (origin, bytes)
    };
    let format = format_of(path, &bytes);
    parse_task(&origin, format, &bytes)
}

/// An error naming the file, its size and the limit when the file is over the limit.
fn refuse_oversized(origin: &str, size: u64) -> anyhow::Result<()> {
    if size > MAX_TASK_FILE_BYTES as u64 {
        bail!(
            "{origin} is {size} bytes ({}), larger than the manager's limit of {} \
             ({MAX_TASK_FILE_BYTES} bytes) for a task",
            cube_types::size::format_size(size),
            cube_types::size::format_size(MAX_TASK_FILE_BYTES as u64)
        );
    }
    Ok(())
}

/// The format by extension (`.json`, `.yaml`, `.yml`), else by content: a document whose
/// first non-space character is `{` is JSON, anything else YAML.
fn format_of(path: &Path, bytes: &[u8]) -> Format {
    let extension = path
        .extension()
        .and_then(|extension| extension.to_str())
        .map(str::to_ascii_lowercase);
    match extension.as_deref() {
        Some("json") => Format::Json,
        Some("yaml" | "yml") => Format::Yaml,
        _ => match bytes.iter().find(|byte| !byte.is_ascii_whitespace()) {
            Some(b'{') => Format::Json,
            _ => Format::Yaml,
        },
    }
}

fn parse_task(origin: &str, format: Format, bytes: &[u8]) -> anyhow::Result<TaskDocument> {
    match format {
        Format::Json => {
            let submission = Submission::parse(bytes, Utc::now())
                .map_err(|err| anyhow!(located(origin, &err, None)))?;
            let document =
                serde_json::from_slice(bytes).with_context(|| format!("{origin}: invalid JSON"))?;
            Ok(TaskDocument {
                origin: origin.to_string(),
                document,
                submission,
            })
        }
        Format::Yaml => {
            let text = std::str::from_utf8(bytes)
                .map_err(|err| anyhow!("{origin}: the YAML is not UTF-8 text: {err}"))?;
            let document = yaml_to_json(origin, text)?;
            let encoded = serde_json::to_vec(&document)
                .with_context(|| format!("{origin}: cannot encode the task as JSON"))?;
            refuse_oversized(origin, encoded.len() as u64)?;
            let submission = Submission::parse(&encoded, Utc::now())
                .map_err(|err| anyhow!(located(origin, &err, Some(text))))?;
            Ok(TaskDocument {
                origin: origin.to_string(),
                document,
                submission,
            })
        }
    }
}

/// Reads YAML into the JSON value it spells. Keys that YAML reads as numbers or booleans
/// (`7777:`) become strings, as JSON keys always are.
fn yaml_to_json(origin: &str, text: &str) -> anyhow::Result<Value> {
    let yaml: serde_norway::Value = serde_norway::from_str(text).map_err(|err| {
        match err.location() {
            // The message ends with "at line L column C" already; say it the way compilers
            // do, first, so that an editor can jump to it.
            Some(at) => anyhow!(
                "{origin}:{}:{}: invalid YAML: {}",
                at.line(),
                at.column(),
                strip_location(&err.to_string())
            ),
            None => anyhow!("{origin}: invalid YAML: {err}"),
        }
    })?;
    json_value(&yaml).map_err(|why| anyhow!("{origin}: {why}"))
}

fn json_value(yaml: &serde_norway::Value) -> Result<Value, String> {
    use serde_norway::Value as Yaml;
    Ok(match yaml {
        Yaml::Null => Value::Null,
        Yaml::Bool(value) => Value::Bool(*value),
        Yaml::Number(number) => {
            if let Some(value) = number.as_u64() {
                Value::from(value)
            } else if let Some(value) = number.as_i64() {
                Value::from(value)
            } else {
                let value = number.as_f64().unwrap_or(f64::NAN);
                serde_json::Number::from_f64(value)
                    .map(Value::Number)
                    .ok_or_else(|| format!("{number} is not a number JSON can hold"))?
            }
        }
        Yaml::String(text) => Value::String(text.clone()),
        Yaml::Sequence(items) => {
            Value::Array(items.iter().map(json_value).collect::<Result<_, _>>()?)
        }
        Yaml::Mapping(mapping) => {
            let mut object = serde_json::Map::new();
            for (key, value) in mapping {
                let key = match key {
                    Yaml::String(text) => text.clone(),
                    Yaml::Number(number) => number.to_string(),
                    Yaml::Bool(value) => value.to_string(),
                    other => {
                        return Err(format!(
                            "a key must be a name, not {}",
                            serde_norway::to_string(other).unwrap_or_default().trim()
                        ));
                    }
                };
                object.insert(key, json_value(value)?);
            }
            Value::Object(object)
        }
        Yaml::Tagged(tagged) => {
            return Err(format!(
                "YAML tags such as {} are not part of a task file",
                tagged.tag
            ));
        }
    })
}

/// A submission error with its place in the file: `FILE:LINE:COLUMN: message` when known.
/// JSON errors carry their own line and column; for YAML (checked as re-encoded JSON, whose
/// lines mean nothing to the user) the field's path is looked up in the YAML text.
fn located(origin: &str, err: &SubmissionError, yaml: Option<&str>) -> String {
    let message = err.to_string();
    match yaml {
        None => match json_location(&message) {
            Some((line, column)) => {
                format!("{origin}:{line}:{column}: {}", strip_location(&message))
            }
            None => format!("{origin}: {message}"),
        },
        Some(text) => {
            let message = strip_location(&message);
            let place = match err {
                SubmissionError::Field(field) => field
                    .split_once(": ")
                    .and_then(|(path, _)| yaml_line_of(text, path)),
                _ => None,
            };
            match place {
                Some((line, column)) => format!("{origin}:{line}:{column}: {message}"),
                None => format!("{origin}: {message}"),
            }
        }
    }
}

/// serde_json ends a message with ` at line L column C`; the numbers, if there.
fn json_location(message: &str) -> Option<(usize, usize)> {
    let (_, place) = message.rsplit_once(" at line ")?;
    let (line, column) = place.split_once(" column ")?;
    Some((line.trim().parse().ok()?, column.trim().parse().ok()?))
}

/// The message without its trailing ` at line L column C`.
fn strip_location(message: &str) -> &str {
    match message.rsplit_once(" at line ") {
        Some((text, place)) if json_location_tail(place) => text,
        _ => message,
    }
}

fn json_location_tail(place: &str) -> bool {
    place.split_once(" column ").is_some_and(|(line, column)| {
        line.trim().parse::<usize>().is_ok() && column.trim().parse::<usize>().is_ok()
    })
}

/// Where a field path (`Task.PortBindings.7777/tcp`) is in block-style YAML: each key is
/// searched for on a later line, indented deeper than its parent. Best effort: a path through
/// a list, or flow style (`{Image: x}`), gives the last key found, or nothing.
fn yaml_line_of(text: &str, path: &str) -> Option<(usize, usize)> {
    let keys: Vec<&str> = path
        .split('.')
        .map(|key| key.split('[').next().unwrap_or(key))
        .filter(|key| !key.is_empty())
        .collect();
    let lines: Vec<&str> = text.lines().collect();
    let mut found: Option<(usize, usize)> = None;
    let mut next_line = 0;
    let mut parent_indent: Option<usize> = None;
    for key in keys {
        let mut hit = None;
        for (index, line) in lines.iter().enumerate().skip(next_line) {
            let content = line.trim_start_matches([' ', '-']);
            let indent = line.len() - content.len();
            if parent_indent.is_some_and(|parent| indent <= parent) && !content.is_empty() {
                // Left the parent's block without finding the key.
                if !content.starts_with('#') {
                    break;
                }
            }
            let written_as_key = [key.to_string(), format!("\"{key}\""), format!("'{key}'")]
                .iter()
                .any(|spelling| {
                    content
                        .strip_prefix(spelling.as_str())
                        .is_some_and(|rest| rest.trim_start().starts_with(':'))
                });
            if written_as_key {
                hit = Some((index, indent));
                break;
            }
        }
        let (index, indent) = hit?;
        found = Some((index + 1, indent + 1));
        next_line = index + 1;
        parent_indent = Some(indent);
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(name: &str, text: &str) -> anyhow::Result<TaskDocument> {
        parse_task(
            name,
            format_of(Path::new(name), text.as_bytes()),
            text.as_bytes(),
        )
    }

    #[test]
    fn the_format_follows_the_extension_and_else_the_first_character() {
        assert_eq!(format_of(Path::new("a.json"), b"Image: x"), Format::Json);
        assert_eq!(format_of(Path::new("a.YML"), b"{}"), Format::Yaml);
        assert_eq!(
            format_of(Path::new("-"), b"  \n {\"Image\": 1}"),
            Format::Json
        );
        assert_eq!(format_of(Path::new("task"), b"Image: x"), Format::Yaml);
    }

    #[test]
    fn a_yaml_task_means_what_the_same_json_task_means() {
        let yaml = parse(
            "web.yaml",
            "Name: web\nImage: cube-sample:latest\nMemory: 64MiB\nExposedPorts:\n  7777/tcp: {}\n\
             PortBindings:\n  7777/tcp: \"\"\nCmd: [httpd, -f]\n",
        )
        .unwrap();
        let json = parse(
            "web.json",
            r#"{"Name": "web", "Image": "cube-sample:latest", "Memory": "64MiB",
                "ExposedPorts": {"7777/tcp": {}}, "PortBindings": {"7777/tcp": ""},
                "Cmd": ["httpd", "-f"]}"#,
        )
        .unwrap();
        assert_eq!(yaml.document, json.document);
        assert_eq!(yaml.submission.event.task.memory, 64 * 1024 * 1024);
    }

    #[test]
    fn yaml_number_keys_become_strings() {
        let document = parse("t.yaml", "Image: x\nPortBindings:\n  7777: \"8080\"\n").unwrap();
        assert_eq!(
            document.submission.event.task.port_bindings["7777/tcp"],
            "8080"
        );
    }

    #[test]
    fn an_unknown_yaml_field_is_reported_at_its_line_and_column() {
        let err = parse(
            "t.yaml",
            "ID: a7aa1d44-08f6-443e-9378-f5884311019e\nState: 2\nTask:\n  Image: x\n  Memmory: 5\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("t.yaml:5:3: Task.Memmory: unknown field"),
            "{err}"
        );
        assert!(!err.contains("column"), "{err}");
    }

    #[test]
    fn a_yaml_syntax_error_is_reported_at_its_line_and_column() {
        let err = parse("t.yaml", "Image: x\nCmd: [a, b\nName: y\n")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("t.yaml:"), "{err}");
        assert!(err.contains("invalid YAML"), "{err}");
        let place: Vec<&str> = err.splitn(4, ':').collect();
        assert!(
            place[1].parse::<usize>().is_ok() && place[2].parse::<usize>().is_ok(),
            "{err}"
        );
    }

    #[test]
    fn a_json_error_is_reported_at_its_line_and_column_first() {
        let err = parse("t.json", "{\"Image\": \"x\",\n \"Memmory\": 5}")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("t.json:2:"), "{err}");
        assert!(err.contains("Memmory"), "{err}");
    }

    #[test]
    fn a_key_is_found_only_inside_its_parents_block() {
        let text = "Task:\n  Image: x\nOther:\n  Memmory: 1\n";
        assert_eq!(yaml_line_of(text, "Task.Memmory"), None);
        assert_eq!(yaml_line_of(text, "Other.Memmory"), Some((4, 3)));
    }
}
