//! Task and job files as people write them: JSON or YAML, from a file or from stdin, read into
//! the one JSON document the manager takes, with errors that point at the line and column of
//! the file as written.
//!
//! YAML is only another spelling of the same document: it mirrors the JSON field names
//! (`Image:`, `PortBindings:`, `Groups:`), is turned into a JSON value, and then goes through
//! the very check the manager runs ([`Submission::parse`] for a task; the `Job` decoding and
//! [`Job::validate`] for a job), so a file means the same in both forms.

use std::io::Read;
use std::path::Path;

use anyhow::{Context, anyhow, bail};
use chrono::Utc;
use cube_types::event::decode;
use cube_types::{Job, Submission, SubmissionError};
use serde_json::Value;

/// The largest task or job file the CLI sends: the manager's request body limit. The manager
/// closes the connection on a larger body without reading it, so the client would only see a
/// broken connection; refusing here names the file and its size instead.
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

/// A job file read and checked ([`Job::validate`] found nothing): what to send, and the job.
#[derive(Debug)]
pub struct JobDocument {
    /// The file's path as given, or `stdin`.
    pub origin: String,
    /// The document to send, as written, so that the manager sees what the user wrote.
    pub document: Value,
    /// The job the document spells.
    pub job: Job,
}

/// How a task or job file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Json,
    Yaml,
}

/// What a file holds, for the words of a message ("the task is larger than ...").
#[derive(Debug, Clone, Copy)]
enum Kind {
    Task,
    Job,
}

impl Kind {
    fn noun(self) -> &'static str {
        match self {
            Kind::Task => "task",
            Kind::Job => "job",
        }
    }
}

/// Reads a task file, or stdin for `-`; refuses one larger than the manager takes.
pub fn read_task_file(path: &Path) -> anyhow::Result<TaskDocument> {
    let (origin, bytes) = read_source(path, Kind::Task)?;
    let format = format_of(path, &bytes);
    parse_task(&origin, format, &bytes)
}

/// Reads a job file, or stdin for `-`, and checks it as the manager will: every mistake is
/// named with its field and, where it can be found, its line and column.
pub fn read_job_file(path: &Path) -> anyhow::Result<JobDocument> {
    let (origin, bytes) = read_source(path, Kind::Job)?;
    let format = format_of(path, &bytes);
    // A group's pod may name its compose file: read it (relative to the job file) and send
    // its text, so that the job carries everything its workers need.
    if let Ok(mut document) = parse_any(format, &bytes)
        && resolve_compose_files(&mut document, path.parent().filter(|_| origin != "stdin"))?
    {
        let bytes = serde_json::to_vec(&document)
            .with_context(|| format!("{origin}: cannot encode the job as JSON"))?;
        return parse_job(&origin, Format::Json, &bytes);
    }
    parse_job(&origin, format, &bytes)
}

/// The document, whatever its spelling, when it reads at all (the errors come later, with
/// their places, from the parse that follows).
fn parse_any(format: Format, bytes: &[u8]) -> anyhow::Result<Value> {
    match format {
        Format::Json => Ok(serde_json::from_slice(bytes)?),
        Format::Yaml => yaml_to_json("", std::str::from_utf8(bytes)?),
    }
}

/// The bytes of a file, or of stdin for `-`, and the name to use for it in messages; a file
/// larger than the manager takes is refused before it is read.
fn read_source(path: &Path, kind: Kind) -> anyhow::Result<(String, Vec<u8>)> {
    let noun = kind.noun();
    if path.as_os_str() == "-" {
        let mut bytes = Vec::new();
        // One byte more than the limit tells "too large" apart from "exactly the limit"
        // without reading an endless stream to its end.
        std::io::stdin()
            .lock()
            .take(MAX_TASK_FILE_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .with_context(|| format!("cannot read the {noun} from stdin"))?;
        if bytes.len() > MAX_TASK_FILE_BYTES {
            bail!(
                "stdin: the {noun} is larger than the manager's limit of {} \
                 ({MAX_TASK_FILE_BYTES} bytes)",
                cube_types::size::format_size(MAX_TASK_FILE_BYTES as u64)
            );
        }
        return Ok(("stdin".to_string(), bytes));
    }
    let origin = path.display().to_string();
    // Asked before reading, so that a huge file is refused without loading it.
    let size = std::fs::metadata(path)
        .with_context(|| format!("cannot read {origin}"))?
        .len();
    refuse_oversized(&origin, size, kind)?;
    // A blocking read is fine here: the command does nothing else while it waits.
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {origin}"))?;
    refuse_oversized(&origin, bytes.len() as u64, kind)?;
    Ok((origin, bytes))
}

/// An error naming the file, its size and the limit when the file is over the limit.
fn refuse_oversized(origin: &str, size: u64, kind: Kind) -> anyhow::Result<()> {
    if size > MAX_TASK_FILE_BYTES as u64 {
        bail!(
            "{origin} is {size} bytes ({}), larger than the manager's limit of {} \
             ({MAX_TASK_FILE_BYTES} bytes) for a {}",
            cube_types::size::format_size(size),
            cube_types::size::format_size(MAX_TASK_FILE_BYTES as u64),
            kind.noun()
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
            if document.get("services").is_some() {
                return compose_task(origin, text, &document);
            }
            let encoded = serde_json::to_vec(&document)
                .with_context(|| format!("{origin}: cannot encode the task as JSON"))?;
            refuse_oversized(origin, encoded.len() as u64, Kind::Task)?;
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

/// A compose file (a YAML document with `services`) as a pod: a task named after the file
/// (or, for `docker-compose.yml` and `compose.yaml`, its directory, as compose names its
/// project), carrying the file's text, the env files it names, read from next to it, and the
/// values of the variables it uses, from the environment and the `.env` file next to it.
fn compose_task(origin: &str, text: &str, document: &Value) -> anyhow::Result<TaskDocument> {
    let path = Path::new(origin);
    let directory = path.parent().filter(|_| origin != "stdin");
    let env_files =
        compose_env_files(document, directory).map_err(|why| anyhow!("{origin}: {why}"))?;
    let variables = compose_variables(text, directory, |name| std::env::var(name).ok())
        .map_err(|why| anyhow!("{origin}: {why}"))?;
    let stem = path
        .file_stem()
        .and_then(|stem| stem.to_str())
        .unwrap_or("pod");
    let name = if matches!(stem, "docker-compose" | "compose" | "stdin") {
        directory
            .and_then(|dir| std::fs::canonicalize(dir).ok())
            .and_then(|dir| dir.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "pod".to_string())
    } else {
        stem.to_string()
    };
    let task = serde_json::json!({
        "Name": name,
        "Pod": {"Compose": text, "EnvFiles": env_files, "Variables": variables},
    });
    let encoded = serde_json::to_vec(&task)
        .with_context(|| format!("{origin}: cannot encode the pod as JSON"))?;
    refuse_oversized(origin, encoded.len() as u64, Kind::Task)?;
    let submission = Submission::parse(&encoded, Utc::now()).map_err(|err| {
        // The compose parser names the key and its line in the compose file itself; a place
        // in the JSON Cube made of it would mean nothing to the user.
        let message = err.to_string();
        let message = message
            .strip_prefix("invalid task: ")
            .unwrap_or(&message)
            .trim_start_matches("Pod: ");
        anyhow!("{origin}: {}", strip_location(message))
    })?;
    warn_of_unset_variables(origin, text, &variables);
    Ok(TaskDocument {
        origin: origin.to_string(),
        document: task,
        submission,
    })
}

/// The values of the variables a compose file's text uses, as compose finds them: the
/// environment (`lookup`) first, then the `.env` file in the compose file's directory (the
/// working directory for stdin), when there is one. Only the variables the file names are sent.
fn compose_variables(
    text: &str,
    directory: Option<&Path>,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<serde_json::Map<String, Value>, String> {
    let used = cube_types::pod::variables_used(text);
    let mut variables = serde_json::Map::new();
    if used.is_empty() {
        return Ok(variables);
    }
    let path = match directory {
        Some(directory) => directory.join(".env"),
        None => Path::new(".env").to_path_buf(),
    };
    let dotenv = match std::fs::read_to_string(&path) {
        Ok(contents) => {
            read_dotenv(&contents).map_err(|why| format!("{}: {why}", path.display()))?
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Default::default(),
        Err(err) => return Err(format!("cannot read {}: {err}", path.display())),
    };
    for name in used {
        if let Some(value) = lookup(&name).or_else(|| dotenv.get(&name).cloned()) {
            variables.insert(name, Value::String(value));
        }
    }
    Ok(variables)
}

/// A `.env` file: `KEY=value` lines (an `export ` before the key allowed), blank lines and
/// `#` comments skipped, a value in matching quotes taken without them, and an unquoted
/// value's ` # comment` left out, as compose reads it.
fn read_dotenv(contents: &str) -> Result<std::collections::BTreeMap<String, String>, String> {
    let mut values = std::collections::BTreeMap::new();
    for (number, line) in contents.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((key, value)) = line.split_once('=') else {
            return Err(format!("line {}: {line:?} is not KEY=value", number + 1));
        };
        let key = key.trim();
        if key.is_empty() || key.contains(char::is_whitespace) {
            return Err(format!(
                "line {}: {key:?} is not a variable's name",
                number + 1
            ));
        }
        let value = value.trim();
        let quoted = ['"', '\''].iter().find_map(|quote| {
            value
                .strip_prefix(*quote)
                .and_then(|rest| rest.strip_suffix(*quote))
        });
        let value = match quoted {
            Some(inner) => inner,
            None => value
                .split_once(" #")
                .map_or(value, |(value, _)| value)
                .trim_end(),
        };
        values.insert(key.to_string(), value.to_string());
    }
    Ok(values)
}

/// Says on stderr which variables the compose file uses that nothing set, as compose warns:
/// they read as empty.
fn warn_of_unset_variables(origin: &str, text: &str, variables: &serde_json::Map<String, Value>) {
    let set: std::collections::BTreeMap<String, String> = variables
        .iter()
        .map(|(name, value)| (name.clone(), value.as_str().unwrap_or_default().to_string()))
        .collect();
    for name in cube_types::pod::unset_variables(text, &set) {
        eprintln!(
            "cube: warning: {origin}: the variable {name} is not set (in the environment or \
             .env); it reads as an empty string"
        );
    }
}

/// The contents of every `env_file` a compose document names, by the name it uses, read
/// relative to the compose file's directory.
fn compose_env_files(
    document: &Value,
    directory: Option<&Path>,
) -> Result<serde_json::Map<String, Value>, String> {
    let mut files = serde_json::Map::new();
    let Some(services) = document.get("services").and_then(Value::as_object) else {
        return Ok(files);
    };
    for service in services.values() {
        let names: Vec<&str> = match service.get("env_file") {
            Some(Value::String(name)) => vec![name.as_str()],
            Some(Value::Array(names)) => names.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        for name in names {
            if files.contains_key(name) {
                continue;
            }
            let path = match directory {
                Some(directory) => directory.join(name),
                None => Path::new(name).to_path_buf(),
            };
            let contents = std::fs::read_to_string(&path)
                .map_err(|err| format!("env_file {name}: cannot read {}: {err}", path.display()))?;
            files.insert(name.to_string(), Value::String(contents));
        }
    }
    Ok(files)
}

/// A job's `"Pod": {"ComposeFile": "path"}` (relative to the job file) replaced by the file's
/// text and its env files, as `{"Compose": ..., "EnvFiles": ...}`. True when one was.
fn resolve_compose_files(document: &mut Value, directory: Option<&Path>) -> anyhow::Result<bool> {
    let mut changed = false;
    let Some(groups) = document.get_mut("Groups").and_then(Value::as_array_mut) else {
        return Ok(false);
    };
    for (index, group) in groups.iter_mut().enumerate() {
        let Some(pod) = group
            .get_mut("Task")
            .and_then(|task| task.get_mut("Pod"))
            .and_then(Value::as_object_mut)
        else {
            continue;
        };
        let Some(Value::String(file)) = pod.remove("ComposeFile") else {
            continue;
        };
        let path = match directory {
            Some(directory) => directory.join(&file),
            None => Path::new(&file).to_path_buf(),
        };
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "Groups[{index}].Task.Pod.ComposeFile: cannot read {}",
                path.display()
            )
        })?;
        let compose = yaml_to_json(&path.display().to_string(), &text)?;
        let env_files = compose_env_files(&compose, path.parent())
            .map_err(|why| anyhow!("Groups[{index}].Task.Pod.ComposeFile: {why}"))?;
        let variables = compose_variables(&text, path.parent(), |name| std::env::var(name).ok())
            .map_err(|why| anyhow!("Groups[{index}].Task.Pod.ComposeFile: {why}"))?;
        warn_of_unset_variables(&path.display().to_string(), &text, &variables);
        pod.insert("Compose".to_string(), Value::String(text));
        pod.insert("EnvFiles".to_string(), Value::Object(env_files));
        pod.insert("Variables".to_string(), Value::Object(variables));
        changed = true;
    }
    Ok(changed)
}

/// A job file into the job it spells, decoded as the manager decodes `POST /jobs` ([`decode`]:
/// the field's path, and the field most likely meant for an unknown one). JSON is decoded from
/// the bytes as written, so that an error keeps serde's line and column; YAML from the JSON it
/// spells, and an error's field path is looked up in the YAML text. Then [`Job::validate`], each finding
/// with its place when the file shows it.
fn parse_job(origin: &str, format: Format, bytes: &[u8]) -> anyhow::Result<JobDocument> {
    let (document, job, yaml) = match format {
        Format::Json => {
            let document: Value = serde_json::from_slice(bytes).map_err(|err| {
                anyhow!(located(
                    origin,
                    &SubmissionError::Syntax(err.to_string()),
                    None
                ))
            })?;
            let job: Job = decode(bytes).map_err(|err| anyhow!(located(origin, &err, None)))?;
            (document, job, None)
        }
        Format::Yaml => {
            let text = std::str::from_utf8(bytes)
                .map_err(|err| anyhow!("{origin}: the YAML is not UTF-8 text: {err}"))?;
            let document = yaml_to_json(origin, text)?;
            let encoded = serde_json::to_vec(&document)
                .with_context(|| format!("{origin}: cannot encode the job as JSON"))?;
            refuse_oversized(origin, encoded.len() as u64, Kind::Job)?;
            let job: Job =
                decode(&encoded).map_err(|err| anyhow!(located(origin, &err, Some(text))))?;
            (document, job, Some(text))
        }
    };
    let findings = job.validate();
    if !findings.is_empty() {
        let lines: Vec<String> = findings
            .iter()
            .map(|finding| {
                let place = finding.split_once(": ").and_then(|(path, _)| match yaml {
                    Some(text) => yaml_line_of(text, path),
                    None => json_line_of(bytes, path),
                });
                match place {
                    Some((line, column)) => format!("{origin}:{line}:{column}: {finding}"),
                    None => format!("{origin}: {finding}"),
                }
            })
            .collect();
        bail!("{}", lines.join("\n"));
    }
    Ok(JobDocument {
        origin: origin.to_string(),
        document,
        job,
    })
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

/// Where a field path (`Task.PortBindings.7777/tcp`, `Groups[1].Task.Memmory`) is in
/// block-style YAML: each key is searched for on a later line inside its parent's block, and
/// `[N]` picks the parent's N-th list item (`- Name: api`). Best effort: when a key is not
/// there (a missing field, flow style such as `{Image: x}`) the place of the last part found
/// is given; when not even the first is found, nothing.
fn yaml_line_of(text: &str, path: &str) -> Option<(usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found: Option<(usize, usize)> = None;
    let mut scope = YamlScope {
        start: 0,
        limit: None,
        starts_on_item: false,
    };
    for segment in path.split('.').filter(|segment| !segment.is_empty()) {
        let (key, index) = match segment.split_once('[') {
            Some((key, rest)) => (key, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (segment, None),
        };
        if !key.is_empty() {
            let Some((line, indent)) = scope.find_key(&lines, key) else {
                return found;
            };
            found = Some((line + 1, indent + 1));
            scope = YamlScope {
                start: line + 1,
                limit: Some(indent),
                starts_on_item: false,
            };
        }
        if let Some(index) = index {
            let Some((line, dash)) = scope.find_item(&lines, index) else {
                return found;
            };
            found = Some((line + 1, dash + 1));
            scope = YamlScope {
                start: line,
                limit: Some(dash),
                starts_on_item: true,
            };
        }
    }
    found
}

/// A block of YAML lines to search in: from `start` until a line indented no deeper than
/// `limit` (spaces before anything else), except the first line when it is the list item
/// (`- Name: api`) the block belongs to.
struct YamlScope {
    start: usize,
    limit: Option<usize>,
    starts_on_item: bool,
}

impl YamlScope {
    /// The lines of the block that hold something, with their number and their indentation.
    fn lines<'a>(&self, lines: &'a [&'a str]) -> impl Iterator<Item = (usize, &'a str, usize)> {
        let limit = self.limit;
        let first = self.start;
        let starts_on_item = self.starts_on_item;
        lines
            .iter()
            .enumerate()
            .skip(self.start)
            .filter(|(_, line)| {
                let content = line.trim_start();
                !content.is_empty() && !content.starts_with('#')
            })
            .map(|(number, line)| {
                (
                    number,
                    *line,
                    line.len() - line.trim_start_matches(' ').len(),
                )
            })
            .take_while(move |(number, _, spaces)| {
                (starts_on_item && *number == first) || limit.is_none_or(|limit| *spaces > limit)
            })
    }

    /// The line of `key:` in the block, and the column of the key (0-based).
    fn find_key(&self, lines: &[&str], key: &str) -> Option<(usize, usize)> {
        let spellings = [key.to_string(), format!("\"{key}\""), format!("'{key}'")];
        self.lines(lines).find_map(|(number, line, _)| {
            let content = line.trim_start_matches([' ', '-']);
            let written_as_key = spellings.iter().any(|spelling| {
                content
                    .strip_prefix(spelling.as_str())
                    .is_some_and(|rest| rest.trim_start().starts_with(':'))
            });
            written_as_key.then(|| (number, line.len() - content.len()))
        })
    }

    /// The line of the `index`-th item (`- ...`) of the list that the block opens with, and
    /// the column of its dash. A list may be indented as deep as its key (`Groups:` then
    /// `- Name: api` under it), so the search starts one column shallower.
    fn find_item(&self, lines: &[&str], index: usize) -> Option<(usize, usize)> {
        let widened = YamlScope {
            start: self.start,
            limit: self.limit.and_then(|limit| limit.checked_sub(1)),
            starts_on_item: self.starts_on_item,
        };
        let is_item = |line: &str| line.trim_start().starts_with('-');
        let mut items = widened.lines(lines).peekable();
        let (_, first, dash) = *items.peek()?;
        if !is_item(first) {
            return None;
        }
        // The list ends at the first line as shallow as its dashes that is not an item.
        items
            .take_while(|(_, line, spaces)| *spaces > dash || (*spaces == dash && is_item(line)))
            .filter(|(_, line, spaces)| *spaces == dash && is_item(line))
            .nth(index)
            .map(|(number, _, _)| (number, dash))
    }
}

/// Where a field path (`Groups[1].Count`) is in a JSON document: the line and column of the
/// key (or of the list element, for `[N]`); when the path goes on past what the document holds
/// (a missing field), the place of the last part found. The document is known to be valid
/// JSON (it was decoded), so the walk only needs to skip what is off the path.
fn json_line_of(bytes: &[u8], path: &str) -> Option<(usize, usize)> {
    let mut steps = Vec::new();
    for segment in path.split('.').filter(|segment| !segment.is_empty()) {
        let mut parts = segment.split('[');
        let key = parts.next().unwrap_or_default();
        if !key.is_empty() {
            steps.push(JsonStep::Key(key));
        }
        for index in parts {
            steps.push(JsonStep::Index(index.trim_end_matches(']').parse().ok()?));
        }
    }
    let mut walk = JsonWalk {
        bytes,
        at: 0,
        found: None,
    };
    walk.value(Some(&steps));
    let offset = walk.found?;
    let before = &bytes[..offset];
    let line = before.iter().filter(|byte| **byte == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|byte| *byte == b'\n')
        .map_or(0, |newline| newline + 1);
    let column = String::from_utf8_lossy(&before[line_start..])
        .chars()
        .count()
        + 1;
    Some((line, column))
}

#[derive(Debug, PartialEq)]
enum JsonStep<'a> {
    Key(&'a str),
    Index(usize),
}

/// A walk through a JSON text along a path, remembering where the deepest part found starts.
struct JsonWalk<'a> {
    bytes: &'a [u8],
    at: usize,
    found: Option<usize>,
}

impl JsonWalk<'_> {
    fn skip_space(&mut self) {
        while self.bytes.get(self.at).is_some_and(u8::is_ascii_whitespace) {
            self.at += 1;
        }
    }

    /// A value; `path` is what is left of the path when the value is on it.
    fn value(&mut self, path: Option<&[JsonStep]>) {
        self.skip_space();
        match self.bytes.get(self.at) {
            Some(b'{') => self.object(path),
            Some(b'[') => self.array(path),
            Some(b'"') => {
                self.string();
            }
            Some(_) => {
                while self.bytes.get(self.at).is_some_and(|byte| {
                    !matches!(byte, b',' | b'}' | b']') && !byte.is_ascii_whitespace()
                }) {
                    self.at += 1;
                }
            }
            None => {}
        }
    }

    /// A string's raw content (escapes left as written), the cursor after its closing quote.
    fn string(&mut self) -> &[u8] {
        self.at += 1;
        let start = self.at;
        while let Some(byte) = self.bytes.get(self.at) {
            match byte {
                b'\\' => self.at += 2,
                b'"' => break,
                _ => self.at += 1,
            }
        }
        let end = self.at.min(self.bytes.len());
        self.at += 1;
        &self.bytes[start..end]
    }

    fn object(&mut self, path: Option<&[JsonStep]>) {
        self.at += 1;
        loop {
            self.skip_space();
            match self.bytes.get(self.at) {
                Some(b'"') => {}
                Some(b',') => {
                    self.at += 1;
                    continue;
                }
                _ => {
                    self.at += 1;
                    return;
                }
            }
            let key_start = self.at;
            let key = self.string().to_vec();
            let rest = match path {
                Some([JsonStep::Key(wanted), rest @ ..]) if wanted.as_bytes() == key => {
                    self.found = Some(key_start);
                    Some(rest)
                }
                _ => None,
            };
            self.skip_space();
            self.at += 1; // the colon
            self.value(rest);
        }
    }

    fn array(&mut self, path: Option<&[JsonStep]>) {
        self.at += 1;
        let mut index = 0;
        loop {
            self.skip_space();
            match self.bytes.get(self.at) {
                Some(b']') | None => {
                    self.at += 1;
                    return;
                }
                Some(b',') => {
                    self.at += 1;
                    index += 1;
                    continue;
                }
                _ => {}
            }
            let rest = match path {
                Some([JsonStep::Index(wanted), rest @ ..]) if *wanted == index => {
                    self.found = Some(self.at);
                    Some(rest)
                }
                _ => None,
            };
            self.value(rest);
        }
    }
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
    fn a_compose_error_ends_with_its_place_in_the_compose_file_not_in_cubes_json() {
        let err = parse("bad.yml", "services:\n  a:\n    image: x\n    build: .\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("bad.yml: compose file: services.a.build (line 4, column 5): "),
            "{err}"
        );
        assert!(!err.contains(" at line "), "{err}");
        let err = parse(
            "bad.yml",
            "services:\n  a:\n    image: x\n    ports: [\"a:b:c:d\"]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("bad.yml: services.a.ports (line 4): ")
                && err.ends_with("is not supported)"),
            "{err}"
        );
    }

    #[test]
    fn compose_variables_come_from_the_environment_then_the_env_file_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(".env"),
            "# settings\nTAG=1.2\nexport GREETING=\"hello there\"\nPORT=8080 # the web port\nUNUSED=x\n",
        )
        .unwrap();
        let text =
            "services:\n  a:\n    image: app:${TAG}\n    command: echo $GREETING $PORT $$HOME\n";
        let variables = compose_variables(text, Some(dir.path()), |name| {
            (name == "TAG").then(|| "from-shell".to_string())
        })
        .unwrap();
        assert_eq!(
            Value::Object(variables),
            serde_json::json!({"TAG": "from-shell", "GREETING": "hello there", "PORT": "8080"}),
            "the environment wins; only the variables the file uses are sent"
        );
        std::fs::write(dir.path().join(".env"), "no equals sign\n").unwrap();
        let err = compose_variables(text, Some(dir.path()), |_| None).unwrap_err();
        assert!(err.contains(".env: line 1"), "{err}");
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
        assert_eq!(yaml.submission.event.task.spec.memory, 64 * 1024 * 1024);
    }

    #[test]
    fn yaml_number_keys_become_strings() {
        let document = parse("t.yaml", "Image: x\nPortBindings:\n  7777: \"8080\"\n").unwrap();
        assert_eq!(
            document.submission.event.task.spec.port_bindings["7777/tcp"],
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
        assert_eq!(yaml_line_of(text, "Task.Memmory"), Some((1, 1)));
        assert_eq!(yaml_line_of(text, "Missing.Memmory"), None);
        assert_eq!(yaml_line_of(text, "Other.Memmory"), Some((4, 3)));
    }

    fn parse_job_text(name: &str, text: &str) -> anyhow::Result<JobDocument> {
        parse_job(
            name,
            format_of(Path::new(name), text.as_bytes()),
            text.as_bytes(),
        )
    }

    #[test]
    fn the_example_job_reads_the_same_as_json_and_as_yaml() {
        let yaml = parse_job_text(
            "job-web.yaml",
            include_str!("../../../../examples/job-web.yaml"),
        )
        .unwrap();
        let json = parse_job_text(
            "job-web.json",
            include_str!("../../../../examples/job-web.json"),
        )
        .unwrap();
        assert_eq!(yaml.job, json.job);
        assert_eq!(yaml.document, json.document);
        assert_eq!(yaml.job.name, "web");
        assert_eq!(yaml.job.groups[0].count, Some(3));
        assert_eq!(yaml.job.groups[0].task.spec.port_bindings["7777/tcp"], "");
    }

    const TWO_GROUPS: &str = "Name: web\nGroups:\n- Name: api\n  Count: 2\n  Task:\n    Image: x\n\
                              - Name: db\n  Count: 1\n  Task:\n    Image: y\n";

    #[test]
    fn an_unknown_field_in_a_jobs_second_group_is_found_on_its_line_with_a_suggestion() {
        let text = TWO_GROUPS.replace("    Image: y\n", "    Image: y\n    Memmory: 64MiB\n");
        let err = parse_job_text("web.yaml", &text).unwrap_err().to_string();
        assert!(
            err.starts_with(
                "web.yaml:11:5: Groups[1].Task.Memmory: unknown field `Memmory`; did you mean \
                 `Memory`?"
            ),
            "{err}"
        );
        let err = parse_job_text("web.yaml", &TWO_GROUPS.replace("  Count: 1", "  Cuont: 1"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "web.yaml:8:3: Groups[1].Cuont: unknown field `Cuont`; did you mean `Count`?"
            ),
            "{err}"
        );
    }

    #[test]
    fn validation_findings_are_named_and_placed_at_the_group_they_concern() {
        let text = TWO_GROUPS.replace("  Count: 1\n", "");
        let err = parse_job_text("web.yaml", &text).unwrap_err().to_string();
        // Count is missing: the place is the group's item.
        assert!(
            err.starts_with("web.yaml:7:1: Groups[1].Count: missing"),
            "{err}"
        );
        let text = TWO_GROUPS
            .replace("Name: web", "Name: web app")
            .replace("Image: x", "Image: \"\"");
        let err = parse_job_text("web.yaml", &text).unwrap_err().to_string();
        let lines: Vec<&str> = err.lines().collect();
        assert!(
            lines[0].starts_with("web.yaml:1:1: Name: \"web app\""),
            "{err}"
        );
        assert!(
            lines[1].starts_with("web.yaml:6:5: Groups[0].Task.Image:"),
            "{err}"
        );
    }

    #[test]
    fn a_json_job_error_is_reported_at_its_line_and_column() {
        let err = parse_job_text(
            "web.json",
            "{\"Name\": \"web\",\n \"Groups\": [{\"Name\": \"api\", \"Count\": 1,\n  \"Task\": {\"image\": \"x\"}}]}",
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("web.json:3:"), "{err}");
        assert!(
            err.contains("Groups[0].Task.image: unknown field `image`; did you mean `Image`?"),
            "{err}"
        );
        let err = parse_job_text(
            "web.json",
            r#"{"Name": "web", "Type": "system", "Groups": [{"Name": "api", "Count": 2, "Task": {"Image": "x"}}]}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("web.json:1:62: Groups[0].Count: a system job"),
            "{err}"
        );
    }

    #[test]
    fn list_items_are_counted_at_their_own_depth() {
        let text = "Groups:\n  - Name: a\n    Task:\n      Image: x\n  - Name: b\nOther:\n- c\n";
        assert_eq!(yaml_line_of(text, "Groups[1].Name"), Some((5, 5)));
        assert_eq!(yaml_line_of(text, "Groups[0].Task.Image"), Some((4, 7)));
        assert_eq!(yaml_line_of(text, "Groups[2].Name"), Some((1, 1)));
    }

    #[test]
    fn a_json_path_is_found_at_its_key_or_its_list_element() {
        let text = br#"{"Name": "web",
  "Groups": [
    {"Name": "api", "Count": 2, "Task": {"Image": "x, ]}"}},
    {"Name": "db",
     "Task": {"Image": "y"}}
  ]}"#;
        assert_eq!(json_line_of(text, "Groups[1].Task.Image"), Some((5, 15)));
        assert_eq!(json_line_of(text, "Groups[0].Count"), Some((3, 21)));
        // Missing: the place of the group.
        assert_eq!(json_line_of(text, "Groups[1].Count"), Some((4, 5)));
        assert_eq!(json_line_of(text, "Name"), Some((1, 2)));
        assert_eq!(json_line_of(text, "Other"), None);
    }
}
