//! The validation of a submitted task: [`Task::validate`] and the limits and owner rules it
//! checks. The one validation the CLI, the manager and the worker all run (through
//! [`crate::Submission::parse`]); apart from the model so that what a task *is* reads without
//! every rule about what a submission may say.

use std::collections::{BTreeMap, BTreeSet};

use super::{HealthCheckType, RestartPolicy, Task, canonical_port, parse_host_side};
use crate::duration::{MAX_TASK_DURATION, MAX_TASK_DURATION_TEXT, format_duration};
use crate::image_ref::check_image_reference;
use crate::node::Resources;

/// Docker refuses a memory limit under 6 MiB; Cube says so before accepting the task.
pub const MIN_MEMORY_BYTES: u64 = 6 * 1024 * 1024;

/// The longest task name Cube takes (it becomes part of a container's name).
pub const MAX_NAME_CHARS: usize = 255;

impl Task {
    /// Everything wrong with the task as submitted, each finding naming its field (and the
    /// index in a list, `Cmd[1]`) and, for a number out of range, the limit. The one
    /// validation of a submission: the CLI, the manager and the worker all run it (through
    /// [`crate::Submission::parse`]), so all three refuse the same task with the same words.
    pub fn validate(&self) -> Vec<String> {
        let mut findings = Vec::new();
        self.validate_strings(&mut findings);
        findings.extend(
            Resources {
                cpu: self.spec.cpu,
                memory: self.spec.memory,
                disk: self.spec.disk,
            }
            .findings(""),
        );
        if self.spec.memory != 0 && self.spec.memory < MIN_MEMORY_BYTES {
            findings.push(format!(
                "Memory: {} bytes is below Docker's minimum of {MIN_MEMORY_BYTES} bytes (6 MiB); \
                 Memory is in bytes, or a string with a unit such as \"64MiB\"",
                self.spec.memory
            ));
        }
        self.validate_ports(&mut findings);
        self.validate_health_and_restarts(&mut findings);
        for (n, constraint) in self.spec.constraints.iter().enumerate() {
            findings.extend(constraint.findings(&format!("Constraints[{n}]")));
        }
        self.validate_secrets_and_volumes(&mut findings);
        findings
    }

    /// `Secrets` and `Volumes`: names that are files and Docker names, each target once.
    fn validate_secrets_and_volumes(&self, findings: &mut Vec<String>) {
        let mut names = BTreeSet::new();
        let mut vars = BTreeSet::new();
        for (n, secret) in self.spec.secrets.iter().enumerate() {
            findings.extend(secret.findings(&format!("Secrets[{n}]")));
            if !names.insert(secret.name.as_str()) {
                findings.push(format!("Secrets[{n}]: {:?} is named twice", secret.name));
            }
            if let Some(env) = &secret.env
                && !vars.insert(env.as_str())
            {
                findings.push(format!("Secrets[{n}].Env: {env:?} is given twice"));
            }
        }
        let mut targets = BTreeSet::new();
        for (n, volume) in self.spec.volumes.iter().enumerate() {
            findings.extend(volume.findings(&format!("Volumes[{n}]")));
            if !targets.insert(volume.target.as_str()) {
                findings.push(format!("Volumes[{n}]: {} is mounted twice", volume.target));
            }
        }
        if let Some(route) = &self.spec.route {
            findings.extend(route.findings("Route", &self.spec.exposed_ports));
        }
        if self.spec.pod.is_some()
            && !(self.spec.secrets.is_empty() && self.spec.volumes.is_empty())
        {
            findings.push(
                "Secrets, Volumes: a pod names its secrets and volumes in its compose file"
                    .to_string(),
            );
        }
    }

    /// `Name`, `Image`, `Env` and `Cmd`: what fuzzing found reaches Docker (or a terminal)
    /// unchecked otherwise.
    fn validate_strings(&self, findings: &mut Vec<String>) {
        let name_chars = self.name.chars().count();
        if name_chars > MAX_NAME_CHARS {
            findings.push(format!(
                "Name: {name_chars} characters is more than the limit of {MAX_NAME_CHARS}"
            ));
        } else if let Some(control) = self.name.chars().find(|c| c.is_control()) {
            findings.push(format!("Name: {}", control_character(control)));
        }
        if self.spec.pod.is_some() {
            self.validate_pod_fields(findings);
        } else if self.spec.image.trim().is_empty() {
            findings.push("Image: missing image name".to_string());
        } else if let Err(why) = check_image_reference(&self.spec.image) {
            findings.push(format!(
                "Image: {:?} is not a valid image reference: {why}",
                self.spec.image
            ));
        }
        for (index, entry) in self.spec.env.iter().enumerate() {
            match entry.split_once('=') {
                None => findings.push(format!("Env[{index}]: {entry:?} is not KEY=value")),
                Some(("", _)) => findings.push(format!(
                    "Env[{index}]: {entry:?} has no name before '='; write KEY=value"
                )),
                Some((key, value)) => {
                    if let Some(control) = key.chars().find(|c| c.is_control()) {
                        findings.push(format!("Env[{index}]: {}", control_character(control)));
                    } else if let Some(control) = value.chars().find(|c| forbidden_in_text(*c)) {
                        findings.push(format!("Env[{index}]: {}", control_character(control)));
                    }
                }
            }
        }
        for (index, argument) in self.spec.cmd.iter().enumerate() {
            if let Some(control) = argument.chars().find(|c| forbidden_in_text(*c)) {
                findings.push(format!("Cmd[{index}]: {}", control_character(control)));
            }
        }
    }

    /// A pod's images, commands, health checks, limits and ports are in its compose file: the
    /// task's own fields say nothing else (the ports and sums [`Task::normalize`] derives
    /// from the file are accepted, so that a stored pod reads back as valid).
    fn validate_pod_fields(&self, findings: &mut Vec<String>) {
        let Some(pod) = &self.spec.pod else { return };
        let spec = &self.spec;
        for (field, set) in [
            ("Image", !spec.image.trim().is_empty()),
            ("Cmd", !spec.cmd.is_empty()),
            ("Env", !spec.env.is_empty()),
            ("HealthCheck", !spec.health_check.trim().is_empty()),
            ("HealthCheckType", spec.health_check_type.is_some()),
        ] {
            if set {
                findings.push(format!(
                    "{field}: a pod's {field} is in its compose file; leave {field} out"
                ));
            }
        }
        let derived = pod.port_bindings();
        let bindings: BTreeMap<String, String> = spec
            .port_bindings
            .iter()
            .map(|(port, host)| {
                (
                    canonical_port(port).unwrap_or_else(|_| port.clone()),
                    host.trim().to_string(),
                )
            })
            .collect();
        let exposed: BTreeSet<String> = spec
            .exposed_ports
            .iter()
            .map(|port| canonical_port(port).unwrap_or_else(|_| port.clone()))
            .collect();
        let derived_exposed: BTreeSet<String> = derived.keys().cloned().collect();
        if !(bindings.is_empty() || bindings == derived)
            || !(exposed.is_empty() || exposed == derived_exposed)
        {
            findings.push(
                "PortBindings: a pod's ports are its services' `ports` in the compose file; \
                 leave ExposedPorts and PortBindings out"
                    .to_string(),
            );
        }
        if pod.cpus() > 0.0 && spec.cpu != 0.0 && (spec.cpu - pod.cpus()).abs() > 1e-9 {
            findings.push(format!(
                "Cpu: {} differs from the sum of the services' deploy.resources.limits.cpus ({})",
                spec.cpu,
                pod.cpus()
            ));
        }
        if pod.memory_bytes() > 0 && spec.memory != 0 && spec.memory != pod.memory_bytes() {
            findings.push(format!(
                "Memory: {} differs from the sum of the services' deploy.resources.limits.memory ({})",
                spec.memory,
                pod.memory_bytes()
            ));
        }
        if let Some(restart) = pod.spec.restart
            && spec.restart_policy != RestartPolicy::No
            && spec.restart_policy != restart
        {
            findings.push(format!(
                "RestartPolicy: {:?} differs from the compose file's restart ({restart:?})",
                spec.restart_policy
            ));
        }
    }

    fn validate_ports(&self, findings: &mut Vec<String>) {
        for port in &self.spec.exposed_ports {
            if let Err(why) = canonical_port(port) {
                findings.push(format!("ExposedPorts: {why}"));
            }
        }
        for (port, host) in &self.spec.port_bindings {
            if let Err(why) = canonical_port(port) {
                findings.push(format!("PortBindings: {why}"));
            }
            if let Err(why) = parse_host_side(host) {
                findings.push(format!("PortBindings: {port}: {why}"));
            }
        }
    }

    /// The health check and the restart settings. Durations are checked whether or not the
    /// task has a health check, so that the same value gets the same answer everywhere.
    fn validate_health_and_restarts(&self, findings: &mut Vec<String>) {
        if self.has_health_check() && self.spec.pod.is_none() {
            let path = self.spec.health_check.trim();
            if self.spec.health_check_type != Some(HealthCheckType::Tcp) && !path.starts_with('/') {
                findings.push(format!(
                    "HealthCheck: {path:?} is not an HTTP path such as \"/health\""
                ));
            } else if let Some(control) = path.chars().find(|c| c.is_control()) {
                findings.push(format!("HealthCheck: {}", control_character(control)));
            }
            if self.spec.exposed_ports.is_empty() && self.spec.port_bindings.is_empty() {
                findings.push(
                    "HealthCheck: the task publishes no port to probe; add PortBindings \
                     (e.g. {\"7777/tcp\": \"\"})"
                        .to_string(),
                );
            }
        }
        // Each duration that must be positive says why in its own words: a zero
        // `QueueTimeout` has nothing to do with health probes.
        const PROBE: &str = "a probe needs time to run and to wait between runs";
        let durations = [
            (
                "HealthCheckInterval",
                self.spec.health_check_interval,
                Some(PROBE),
            ),
            (
                "HealthCheckTimeout",
                self.spec.health_check_timeout,
                Some(PROBE),
            ),
            ("RestartDelay", self.spec.restart_delay, None),
            ("RestartDelayMax", self.spec.restart_delay_max, None),
            (
                "QueueTimeout",
                self.spec.queue_timeout,
                Some(
                    "how long the request may wait in the queue for room before it fails; \
                     leave it out to wait without limit",
                ),
            ),
        ];
        for (field, duration, why_positive) in durations {
            let Some(duration) = duration else { continue };
            if let Some(why) = why_positive
                && duration.is_zero()
            {
                findings.push(format!(
                    "{field}: must be longer than 0 ({why}); durations count whole \
                     milliseconds, e.g. \"500ms\""
                ));
            } else if duration > MAX_TASK_DURATION {
                findings.push(format!(
                    "{field}: {} is more than the limit of {MAX_TASK_DURATION_TEXT}",
                    format_duration(duration)
                ));
            }
        }
        findings.extend(owner_findings("Owner", &self.spec.owner));
        if let Err(why) = crate::project::check_project_name(&self.spec.project) {
            findings.push(format!("Project: {why}"));
        }
        if let Some(priority) = self.spec.priority
            && priority > 100
        {
            findings.push(format!("Priority: {priority} is out of range 0-100"));
        }
        if self.spec.health_check_retries == Some(0) {
            findings.push(
                "HealthCheckRetries: must be at least 1 (the failed probes in a row that make \
                 a task unhealthy)"
                    .to_string(),
            );
        }
    }
}

/// The most characters of an owner's name.
pub const MAX_OWNER_LEN: usize = 63;

/// What is wrong with an owner's name (empty is fine: `anonymous`): at most
/// [`MAX_OWNER_LEN`] letters, digits, `.`, `_`, `-` and `@`.
pub fn owner_findings(path: &str, owner: &str) -> Vec<String> {
    let mut findings = Vec::new();
    if owner.chars().count() > MAX_OWNER_LEN {
        findings.push(format!(
            "{path}: {} characters; at most {MAX_OWNER_LEN}",
            owner.chars().count()
        ));
    }
    if !owner
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'))
    {
        findings.push(format!(
            "{path}: {owner:?} may hold only letters, digits, '.', '_', '-' and '@'"
        ));
    }
    findings
}

/// Whether a character is refused in `Cmd` and in `Env` values: every control character but
/// tab, line feed and carriage return, which multi-line scripts (`sh -c`) and values such as
/// certificates carry. A NUL cannot reach a process at all: `execve` ends a string there.
fn forbidden_in_text(c: char) -> bool {
    c.is_control() && !matches!(c, '\t' | '\n' | '\r')
}

fn control_character(c: char) -> String {
    format!("contains a control character (U+{:04X})", u32::from(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_each_bad_field() {
        let mut task = Task::new("bad", " ");
        task.spec.cpu = -1.0;
        task.spec.memory = 1000;
        task.spec.exposed_ports.insert("http".into());
        task.spec
            .port_bindings
            .insert("80/tcp".into(), "99999".into());
        task.spec.env.push("=x".into());
        let findings = task.validate().join("\n");
        for field in [
            "Image: missing image name",
            "Cpu:",
            "Memory: 1000 bytes",
            "ExposedPorts: \"http\"",
            "99999",
            "Env[0]:",
        ] {
            assert!(findings.contains(field), "{field} not in {findings}");
        }
    }

    #[test]
    fn a_health_check_needs_a_path_and_a_port() {
        let mut task = Task::new("t", "img");
        task.spec.health_check = "health".into();
        let findings = task.validate().join("\n");
        assert!(findings.contains("not an HTTP path"), "{findings}");
        assert!(findings.contains("publishes no port"), "{findings}");
    }

    fn findings_for(json: &str) -> String {
        let task: Task = serde_json::from_str(json).unwrap();
        task.validate().join("\n")
    }

    #[test]
    fn control_characters_are_refused_naming_the_field_and_index() {
        let findings = findings_for(
            r#"{"Image": "x", "Name": "a\u0007b", "Cmd": ["sh", "a\u0000b"], "Env": ["A=1", "B=\u001b[31m"]}"#,
        );
        assert!(
            findings.contains("Name: contains a control character (U+0007)"),
            "{findings}"
        );
        assert!(
            findings.contains("Cmd[1]: contains a control character (U+0000)"),
            "{findings}"
        );
        assert!(
            findings.contains("Env[1]: contains a control character (U+001B)"),
            "{findings}"
        );
    }

    #[test]
    fn scripts_and_values_may_span_lines() {
        let findings = findings_for(
            r#"{"Image": "x", "Cmd": ["sh", "-c", "echo a\n\techo b\r\n"], "Env": ["PEM=a\nb"]}"#,
        );
        assert_eq!(findings, "");
    }

    #[test]
    fn env_entries_need_a_name_and_an_equals_sign() {
        let findings = findings_for(r#"{"Image": "x", "Env": ["A=1", "JUSTKEY", "=v", "EMPTY="]}"#);
        assert!(
            findings.contains("Env[1]: \"JUSTKEY\" is not KEY=value"),
            "{findings}"
        );
        assert!(
            findings.contains("Env[2]: \"=v\" has no name"),
            "{findings}"
        );
        assert!(
            !findings.contains("Env[0]") && !findings.contains("Env[3]"),
            "{findings}"
        );
    }

    #[test]
    fn a_name_longer_than_the_limit_is_refused_with_the_limit() {
        let mut task = Task::new("x".repeat(5000), "busybox");
        let findings = task.validate().join("\n");
        assert!(
            findings.contains("Name: 5000 characters is more than the limit of 255"),
            "{findings}"
        );
        task.name = "x".repeat(255);
        assert!(task.validate().is_empty());
    }

    #[test]
    fn an_invalid_image_is_refused_naming_image() {
        let findings = findings_for(r#"{"Image": "Running"}"#);
        assert_eq!(
            findings,
            "Image: \"Running\" is not a valid image reference: repository names must be lowercase (\"Running\")"
        );
    }

    #[test]
    fn zero_health_durations_are_refused_with_a_reason_with_or_without_a_check() {
        let findings = findings_for(
            r#"{"Image": "x", "HealthCheckInterval": "0s", "HealthCheckTimeout": "0.1ms"}"#,
        );
        assert!(
            findings.contains("HealthCheckInterval: must be longer than 0"),
            "{findings}"
        );
        assert!(
            findings.contains("HealthCheckTimeout: must be longer than 0"),
            "{findings}"
        );
        assert_eq!(findings_for(r#"{"Image": "x", "RestartDelay": "0s"}"#), "");
    }

    #[test]
    fn a_zero_queue_timeout_is_refused_for_what_a_queue_timeout_is() {
        let findings = findings_for(r#"{"Image": "x", "QueueTimeout": "0s"}"#);
        assert!(
            findings.contains("QueueTimeout: must be longer than 0"),
            "{findings}"
        );
        assert!(findings.contains("wait in the queue"), "{findings}");
        assert!(!findings.contains("probe"), "{findings}");
    }

    #[test]
    fn durations_beyond_a_day_are_refused_with_the_limit() {
        for field in [
            "HealthCheckInterval",
            "HealthCheckTimeout",
            "RestartDelay",
            "RestartDelayMax",
        ] {
            let findings = findings_for(&format!(r#"{{"Image": "x", "{field}": "3000000000h"}}"#));
            assert!(findings.starts_with(&format!("{field}: ")), "{findings}");
            assert!(
                findings.contains("more than the limit of 24h"),
                "{findings}"
            );
            assert_eq!(
                findings_for(&format!(r#"{{"Image": "x", "{field}": "24h"}}"#)),
                ""
            );
        }
    }

    #[test]
    fn zero_health_check_retries_are_refused() {
        let findings = findings_for(r#"{"Image": "x", "HealthCheckRetries": 0}"#);
        assert!(
            findings.starts_with("HealthCheckRetries: must be at least 1"),
            "{findings}"
        );
    }

    #[test]
    fn out_of_range_resources_are_refused_with_the_limit() {
        let findings =
            findings_for(r#"{"Image": "x", "Cpu": 1e300, "Memory": "2Pi", "Disk": "1.5Pi"}"#);
        assert!(
            findings.contains("Cpu: 1e300 cores is more than the limit of 1024 cores"),
            "{findings}"
        );
        assert!(
            findings.contains("Memory: 2251799813685248 bytes is more than the limit"),
            "{findings}"
        );
        assert!(findings.contains("Disk: "), "{findings}");
        assert!(findings.contains("(1 PiB)"), "{findings}");
        assert_eq!(
            findings_for(r#"{"Image": "x", "Cpu": "500m", "Memory": "1Pi", "Disk": "1Pi"}"#),
            ""
        );
        let err =
            serde_json::from_str::<Task>(r#"{"Image": "x", "Memory": 99999999999999999999999}"#)
                .unwrap_err();
        assert!(err.to_string().contains("too large"), "{err}");
    }
}
