//! A pod: several containers that live together as one task, read from a compose file.
//!
//! On the wire a pod is the compose file's text, the contents of the `env_file`s it names and
//! the values of the variables it uses (`{"Compose": "...", "EnvFiles": {"app.env":
//! "KEY=value\n"}, "Variables": {"TAG": "1.2"}}`), so that a task carries all it needs to any
//! worker, and every reader of it (CLI, manager, worker) reads the same pod. [`Pod::parse`] reads it into a [`PodSpec`]: the services in the
//! order they start, each one's image, command, environment, ports, mounts, health check and
//! limits. The parser accepts the common subset of the compose format and refuses anything
//! else with the key and its line named: a key Cube would silently ignore is a pod that does
//! not run as its author meant.
//!
//! Supported: `version` (read and ignored), `services` with `image`, `command`, `entrypoint`,
//! `environment`, `env_file`, `ports`, `expose`, `volumes` (named volumes and absolute bind
//! mounts), `depends_on` (a list, or a map with `condition: service_started|service_healthy|
//! service_completed_successfully`), `healthcheck` (`test`, `interval`, `timeout`, `retries`,
//! `start_period`, `disable`), `labels`, `restart`, `user`, `working_dir`, `extra_hosts`,
//! `network_mode` (`host`, `none`; `bridge` is the default) and `deploy.resources.limits`
//! (`cpus`, `memory`); and the top-level `volumes`. `networks` is refused: a pod's services
//! share one network.
//!
//! Values are interpolated as compose does ([`interpolate`]): `$VAR`, `${VAR}`,
//! `${VAR:-default}`, `${VAR-default}`, `${VAR:?message}`, `${VAR:+other}`, and `$$` for a `$`.
//! The variables are the pod's `Variables`, which `cube run -f` fills from its environment and
//! the `.env` file beside the compose file; an unset one reads as empty, as in compose.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};

use crate::task::{Health, RestartPolicy, canonical_port};

/// The name of a pod's infra container in its `Containers` (no service may take it).
pub const INFRA: &str = "infra";

/// One container of a pod as a worker saw it: what `cube status` lists.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerStatus {
    /// The service's name, or [`INFRA`].
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "ContainerID", default)]
    pub container_id: String,
    /// The engine's word: `created`, `running`, `exited`, or `missing`.
    #[serde(rename = "Status", default)]
    pub status: String,
    #[serde(rename = "ExitCode", default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    /// What its compose health check says; unset without one.
    #[serde(rename = "Health", default, skip_serializing_if = "Option::is_none")]
    pub health: Option<Health>,
    /// Why it ended badly.
    #[serde(rename = "Error", default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The longest compose file Cube takes (it travels inside the task).
pub const MAX_COMPOSE_BYTES: usize = 256 * 1024;

/// The most services a pod may have.
pub const MAX_SERVICES: usize = 32;

/// A pod as submitted: the compose text and the env files it names, and what they say.
#[derive(Debug, Clone, PartialEq)]
pub struct Pod {
    /// The compose file as written.
    pub compose: String,
    /// The contents of every `env_file` the compose file names, by the name it uses.
    pub env_files: BTreeMap<String, String>,
    /// The values of the variables the compose file's values use (`${TAG}`), as the
    /// submitter's environment and `.env` file gave them.
    pub variables: BTreeMap<String, String>,
    /// What the compose file says, parsed.
    pub spec: PodSpec,
}

/// What a compose file asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct PodSpec {
    /// In the order they start: a service after every service it depends on, otherwise in
    /// the order of their names.
    pub services: Vec<Service>,
    /// How the pod's containers are networked.
    pub network: PodNetwork,
    /// The named volumes the file declares (top-level `volumes`).
    pub volumes: BTreeSet<String>,
    /// The services' `restart`, which must agree: a pod restarts as a whole.
    pub restart: Option<RestartPolicy>,
}

impl PodSpec {
    /// The project's secrets any of the pod's services reads, each once.
    pub fn secret_names(&self) -> BTreeSet<&str> {
        self.services
            .iter()
            .flat_map(|service| service.secrets.iter())
            .map(|secret| secret.source.as_str())
            .collect()
    }
}

/// How a pod's containers reach each other and the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodNetwork {
    /// One network namespace, held by an infra container: the containers reach each other on
    /// `localhost`, and ports are published on the infra container.
    Shared,
    /// `network_mode: host`: every container in the host's namespace; no infra container.
    Host,
    /// `network_mode: none`: no network; no infra container.
    None,
}

/// One service of a compose file: one container of the pod.
#[derive(Debug, Clone, PartialEq)]
pub struct Service {
    pub name: String,
    pub image: String,
    /// Replaces the image's command when set.
    pub command: Option<Vec<String>>,
    /// Replaces the image's entrypoint when set.
    pub entrypoint: Option<Vec<String>>,
    /// `KEY=value`, the env files' first, then `environment` (which wins).
    pub env: Vec<String>,
    /// Published ports.
    pub ports: Vec<ServicePort>,
    /// Ports declared but not published (`expose`): `"80/tcp"`.
    pub expose: Vec<String>,
    pub mounts: Vec<Mount>,
    /// The services that must be started (or healthy, or completed with exit code 0) before this one.
    pub depends_on: Vec<Dependency>,
    pub healthcheck: Option<Healthcheck>,
    pub labels: BTreeMap<String, String>,
    /// Cores; 0 is no limit.
    pub cpus: f64,
    /// Bytes; 0 is no limit.
    pub memory_bytes: u64,
    /// The user (and group) the container's process runs as: `name`, `uid`, `uid:gid`.
    pub user: Option<String>,
    /// The directory the container's process starts in (absolute).
    pub working_dir: Option<String>,
    /// More `/etc/hosts` entries, `HOST:IP`.
    pub extra_hosts: Vec<String>,
    /// The project's secrets the service reads (compose `secrets:`), each at
    /// `/run/secrets/TARGET`.
    pub secrets: Vec<ServiceSecret>,
}

/// A secret a service reads: the project's secret `source`, mounted at `/run/secrets/TARGET`
/// (`target` is `source` unless the file says otherwise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSecret {
    pub source: String,
    pub target: String,
}

/// A container port and the host port it is published on (`""`: the engine chooses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    /// `"80/tcp"`.
    pub container: String,
    pub host: String,
}

/// A volume or a directory of the host mounted into a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub kind: MountKind,
    /// The volume's name in the compose file, or the host path.
    pub source: String,
    pub target: String,
    pub read_only: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountKind {
    /// A named volume, declared in the top-level `volumes`.
    Volume,
    /// A host path (absolute).
    Bind,
}

/// A service another one waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dependency {
    pub service: String,
    pub condition: Condition,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// Started (the default).
    Started,
    /// Its health check passed.
    Healthy,
    /// It ran to its end with exit code 0 (a one-off step, such as a migration).
    CompletedSuccessfully,
}

/// A compose health check, carried out by the engine inside the container.
#[derive(Debug, Clone, PartialEq)]
pub struct Healthcheck {
    /// `["CMD", ...]` or `["CMD-SHELL", "..."]`.
    pub test: Vec<String>,
    pub interval: Option<Duration>,
    pub timeout: Option<Duration>,
    pub retries: Option<u32>,
    pub start_period: Option<Duration>,
}

/// Why a compose file was refused: one finding per problem, each naming the key and its line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComposeError {
    pub findings: Vec<String>,
}

impl fmt::Display for ComposeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.findings.join("; "))
    }
}

impl std::error::Error for ComposeError {}

impl Pod {
    /// Reads a compose file (and the env files it names) into a pod, with no variables set,
    /// or says every problem with its key and line.
    pub fn parse(compose: &str, env_files: &BTreeMap<String, String>) -> Result<Pod, ComposeError> {
        Pod::parse_with(compose, env_files, &BTreeMap::new())
    }

    /// Reads a compose file (and the env files it names) into a pod, its values interpolated
    /// from `variables`, or says every problem with its key and line.
    pub fn parse_with(
        compose: &str,
        env_files: &BTreeMap<String, String>,
        variables: &BTreeMap<String, String>,
    ) -> Result<Pod, ComposeError> {
        let refuse = |finding: String| ComposeError {
            findings: vec![finding],
        };
        if compose.len() > MAX_COMPOSE_BYTES {
            return Err(refuse(format!(
                "the compose file is {} bytes; at most {MAX_COMPOSE_BYTES}",
                compose.len()
            )));
        }
        let file: ComposeFile = serde_norway::from_str(compose)
            .map_err(|err| refuse(format!("compose file: {}", describe_yaml_error(&err))))?;
        let spec = Interpreter {
            text: compose,
            env_files,
            variables,
            findings: Vec::new(),
            secrets: BTreeSet::new(),
        }
        .spec(file)?;
        Ok(Pod {
            compose: compose.to_string(),
            env_files: env_files.clone(),
            variables: variables.clone(),
            spec,
        })
    }

    /// The sum of the services' CPU limits, in cores.
    pub fn cpus(&self) -> f64 {
        self.spec.services.iter().map(|service| service.cpus).sum()
    }

    /// The sum of the services' memory limits, in bytes.
    pub fn memory_bytes(&self) -> u64 {
        self.spec
            .services
            .iter()
            .map(|service| service.memory_bytes)
            .fold(0, u64::saturating_add)
    }

    /// Every published port: container port → host port, as a task's `PortBindings` says it.
    pub fn port_bindings(&self) -> BTreeMap<String, String> {
        self.spec
            .services
            .iter()
            .flat_map(|service| service.ports.iter())
            .map(|port| (port.container.clone(), port.host.clone()))
            .collect()
    }

    /// Whether any service has a health check.
    pub fn has_health_check(&self) -> bool {
        self.spec
            .services
            .iter()
            .any(|service| service.healthcheck.is_some())
    }

    pub fn service_names(&self) -> Vec<&str> {
        self.spec
            .services
            .iter()
            .map(|service| service.name.as_str())
            .collect()
    }
}

/// The reader's words for a YAML error, said as the findings are: the key's path, then its
/// place in the compose file (`services.a.build (line 4, column 5): unknown field ...`).
fn describe_yaml_error(err: &serde_norway::Error) -> String {
    let text = err.to_string();
    // serde_norway writes "path: message at line L column C"; the place goes after the path.
    let message = match text.rsplit_once(" at line ") {
        Some((message, place))
            if place
                .split_once(" column ")
                .is_some_and(|(l, c)| l.parse::<u64>().is_ok() && c.parse::<u64>().is_ok()) =>
        {
            message
        }
        _ => text.as_str(),
    };
    let (path, message) = match message.split_once(": ") {
        Some((path, rest)) if !path.is_empty() && !path.contains(' ') => {
            (Some(path.to_string()), rest)
        }
        _ => (None, message),
    };
    let unknown = message
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split_once('`'))
        .map(|(field, _)| field);
    let path = match (path, unknown) {
        (Some(path), Some(field)) => Some(format!("{path}.{field}")),
        (None, Some(field)) => Some(field.to_string()),
        (path, None) => path,
    };
    let hint = if unknown.is_some() {
        " (Cube supports a subset of compose; see `cube run --help`)"
    } else {
        ""
    };
    let place = err
        .location()
        .map(|at| format!("line {}, column {}", at.line(), at.column()));
    match (path, place) {
        (Some(path), Some(place)) => format!("{path} ({place}): {message}{hint}"),
        (Some(path), None) => format!("{path}: {message}{hint}"),
        (None, Some(place)) => format!("{place}: {message}{hint}"),
        (None, None) => format!("{message}{hint}"),
    }
}

// ----- the file as written -----

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ComposeFile {
    #[serde(default)]
    #[allow(dead_code)] // Read so that it is allowed; compose itself ignores it now.
    version: Option<serde_norway::Value>,
    services: BTreeMap<String, ComposeService>,
    #[serde(default)]
    volumes: BTreeMap<String, Option<ComposeVolume>>,
    /// The project's secrets the services may read: each `external: true` (made with `cube
    /// secret create`).
    #[serde(default)]
    secrets: BTreeMap<String, Option<ComposeSecret>>,
    /// Read only to be refused with why: a pod's services share one network.
    networks: Option<serde_norway::Value>,
}

/// A top-level secret: Cube's secrets are made with `cube secret create`, so only
/// `external: true` is taken; `file:` and `environment:` are refused with why.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ComposeSecret {
    external: Option<bool>,
    file: Option<serde_norway::Value>,
    environment: Option<serde_norway::Value>,
}

/// A service's `secrets:` entry: the secret's name, or `{source, target}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ComposeServiceSecret {
    Short(String),
    Long(ComposeServiceSecretLong),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ComposeServiceSecretLong {
    source: String,
    target: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ComposeVolume {}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ComposeService {
    image: Option<String>,
    command: Option<StringOrList>,
    entrypoint: Option<StringOrList>,
    environment: Option<ListOrMap>,
    env_file: Option<StringOrList>,
    #[serde(default)]
    ports: Vec<ComposePort>,
    #[serde(default)]
    expose: Vec<Scalar>,
    #[serde(default)]
    volumes: Vec<ComposeMount>,
    #[serde(default)]
    secrets: Vec<ComposeServiceSecret>,
    depends_on: Option<ComposeDependsOn>,
    healthcheck: Option<ComposeHealthcheck>,
    labels: Option<ListOrMap>,
    restart: Option<String>,
    network_mode: Option<String>,
    deploy: Option<ComposeDeploy>,
    user: Option<Scalar>,
    working_dir: Option<String>,
    extra_hosts: Option<ListOrMap>,
    /// Read only to be refused with why: a pod's services share one network.
    networks: Option<serde_norway::Value>,
    /// Read only to be refused by name (`HOST_TAKEOVER_KEYS`): each would hand the task its
    /// host, and no worker setting allows it.
    privileged: Option<serde_norway::Value>,
    cap_add: Option<serde_norway::Value>,
    pid: Option<serde_norway::Value>,
    ipc: Option<serde_norway::Value>,
    devices: Option<serde_norway::Value>,
    security_opt: Option<serde_norway::Value>,
    userns_mode: Option<serde_norway::Value>,
}

/// Why `networks` (a service's or the file's) is refused.
const NETWORKS_REFUSED: &str = "refused: a pod's services share one network (they reach each \
     other on localhost and by their service names, and its ports are published on it); \
     remove networks";

/// The compose keys that would let a task take over its host: refused whatever their value
/// (even `privileged: false`, so that nobody believes a value is honoured), each with why.
const HOST_TAKEOVER_KEYS: [(&str, &str); 7] = [
    (
        "privileged",
        "a privileged container has every capability and every device of its host",
    ),
    (
        "cap_add",
        "an added capability reaches past the container (CAP_SYS_ADMIN, CAP_NET_ADMIN, ...)",
    ),
    (
        "pid",
        "the host's PID namespace shows and signals every process of the host",
    ),
    (
        "ipc",
        "the host's IPC namespace shares the host's memory segments",
    ),
    (
        "devices",
        "a device of the host gives raw access to its hardware",
    ),
    (
        "security_opt",
        "Cube sets the security options itself (no-new-privileges on every container)",
    ),
    (
        "userns_mode",
        "the host's user namespace undoes the container's user mapping",
    ),
];

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum StringOrList {
    String(String),
    List(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ListOrMap {
    List(Vec<String>),
    Map(BTreeMap<String, Option<Scalar>>),
}

/// A YAML scalar written as text: `8080`, `true` and `"x"` all read as what they say.
#[derive(Debug)]
struct Scalar(String);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Scalar, D::Error> {
        struct ScalarVisitor;
        impl de::Visitor<'_> for ScalarVisitor {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, a number or a boolean")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
        }
        deserializer.deserialize_any(ScalarVisitor)
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ComposePort {
    Short(Scalar),
    Long(ComposePortLong),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ComposePortLong {
    target: u16,
    published: Option<Scalar>,
    protocol: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ComposeMount {
    Short(String),
    Long(ComposeMountLong),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ComposeMountLong {
    #[serde(rename = "type")]
    kind: String,
    source: String,
    target: String,
    #[serde(default)]
    read_only: bool,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ComposeDependsOn {
    List(Vec<String>),
    Map(BTreeMap<String, ComposeCondition>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ComposeCondition {
    condition: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ComposeHealthcheck {
    test: Option<StringOrList>,
    interval: Option<String>,
    timeout: Option<String>,
    retries: Option<u32>,
    start_period: Option<String>,
    #[serde(default)]
    disable: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ComposeDeploy {
    resources: Option<ComposeResources>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ComposeResources {
    limits: Option<ComposeLimits>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ComposeLimits {
    cpus: Option<Scalar>,
    memory: Option<Scalar>,
}

// ----- from the file to the spec -----

/// Turns the file as written into a [`PodSpec`], collecting every finding with its line.
struct Interpreter<'a> {
    text: &'a str,
    env_files: &'a BTreeMap<String, String>,
    variables: &'a BTreeMap<String, String>,
    findings: Vec<String>,
    /// The secrets the file declares (top-level `secrets`), once read.
    secrets: BTreeSet<String>,
}

impl Interpreter<'_> {
    fn spec(mut self, file: ComposeFile) -> Result<PodSpec, ComposeError> {
        if file.services.is_empty() {
            self.finding(
                &["services"],
                "a pod needs at least one service".to_string(),
            );
        }
        if file.services.len() > MAX_SERVICES {
            self.finding(
                &["services"],
                format!(
                    "{} services; a pod has at most {MAX_SERVICES}",
                    file.services.len()
                ),
            );
        }
        if file.networks.is_some() {
            self.finding(&["networks"], NETWORKS_REFUSED.to_string());
        }
        let volumes: BTreeSet<String> = file.volumes.keys().cloned().collect();
        for name in &volumes {
            if !is_docker_name(name) {
                self.finding(
                    &["volumes", name],
                    format!("{name:?} is not a volume name: letters, digits, '_', '.', '-'"),
                );
            }
        }
        for (name, declared) in &file.secrets {
            let path = ["secrets", name.as_str()];
            if let Some(problem) = crate::secret::name_problem("secret", name) {
                self.finding(&path, problem);
            }
            match declared {
                Some(ComposeSecret {
                    file: Some(_), ..
                })
                | Some(ComposeSecret {
                    environment: Some(_),
                    ..
                }) => self.finding(
                    &path,
                    format!(
                        "Cube takes a secret's value from `cube secret create {name}` (kept \
                         encrypted by the manager), never from a file or a variable beside the \
                         compose file: create it, then declare it `external: true`"
                    ),
                ),
                Some(ComposeSecret {
                    external: Some(false),
                    ..
                }) => self.finding(
                    &path,
                    format!("external: false; create it with `cube secret create {name}` and declare it external: true"),
                ),
                _ => {}
            }
        }
        let secrets: BTreeSet<String> = file.secrets.keys().cloned().collect();
        self.secrets = secrets;
        let names: BTreeSet<String> = file.services.keys().cloned().collect();
        let mut network_modes = BTreeSet::new();
        let mut restarts = BTreeMap::new();
        let mut services = Vec::new();
        for (name, written) in file.services {
            if !is_docker_name(&name) {
                self.finding(
                    &["services", &name],
                    format!("{name:?} is not a service name: letters, digits, '_', '.', '-'"),
                );
            } else if name == INFRA {
                self.finding(
                    &["services", &name],
                    format!("{INFRA:?} is the name of the pod's infra container; choose another"),
                );
            }
            network_modes.insert(written.network_mode.clone().unwrap_or_default());
            if let Some(restart) = &written.restart {
                match parse_restart(restart) {
                    Ok(policy) => {
                        restarts.insert(name.clone(), policy);
                    }
                    Err(why) => self.finding(&["services", &name, "restart"], why),
                }
            }
            let service = self.service(&name, written, &names, &volumes);
            services.push(service);
        }
        let network = self.network(&network_modes);
        let restart = self.restart(&restarts);
        let services = self.start_order(services);
        if self.findings.is_empty() {
            Ok(PodSpec {
                services,
                network,
                volumes,
                restart,
            })
        } else {
            Err(ComposeError {
                findings: self.findings,
            })
        }
    }

    /// A value as written, its variables replaced ([`interpolate`]); a malformed reference is
    /// a finding, and the value is kept as written.
    fn value(&mut self, path: &[&str], text: String) -> String {
        match interpolate(&text, self.variables) {
            Ok(value) => value,
            Err(why) => {
                self.finding(path, why);
                text
            }
        }
    }

    /// A finding about the value at `path`, with the line of its key.
    fn finding(&mut self, path: &[&str], message: String) {
        let key = path.join(".");
        match line_of(self.text, path) {
            Some(line) => self
                .findings
                .push(format!("{key} (line {line}): {message}")),
            None => self.findings.push(format!("{key}: {message}")),
        }
    }

    fn service(
        &mut self,
        name: &str,
        written: ComposeService,
        names: &BTreeSet<String>,
        volumes: &BTreeSet<String>,
    ) -> Service {
        let image = written
            .image
            .map(|image| self.value(&["services", name, "image"], image));
        let image = match image {
            Some(image) if !image.trim().is_empty() => {
                if let Err(why) = crate::image_ref::check_image_reference(&image) {
                    self.finding(
                        &["services", name, "image"],
                        format!("{image:?} is not a valid image reference: {why}"),
                    );
                }
                image
            }
            _ => {
                self.finding(
                    &["services", name],
                    "image: missing; every service names its image (Cube does not `build`)"
                        .to_string(),
                );
                String::new()
            }
        };
        let command = written
            .command
            .map(|command| self.words(&["services", name, "command"], command));
        let entrypoint = written
            .entrypoint
            .map(|entrypoint| self.words(&["services", name, "entrypoint"], entrypoint));
        let env = self.environment(name, written.env_file, written.environment);
        let ports = written
            .ports
            .into_iter()
            .filter_map(|port| self.port(name, port))
            .collect();
        let expose = written
            .expose
            .into_iter()
            .filter_map(|Scalar(port)| {
                let path = ["services", name, "expose"];
                let port = self.value(&path, port);
                match canonical_port(&port) {
                    Ok(port) => Some(port),
                    Err(why) => {
                        self.finding(&path, why);
                        None
                    }
                }
            })
            .collect();
        let user = written.user.map(|Scalar(user)| {
            let path = ["services", name, "user"];
            let user = self.value(&path, user);
            if user.trim().is_empty() || user.chars().any(char::is_whitespace) {
                self.finding(
                    &path,
                    format!("{user:?} is not a user: write a name or UID, and :GROUP or :GID"),
                );
            }
            user
        });
        let working_dir = written.working_dir.map(|dir| {
            let path = ["services", name, "working_dir"];
            let dir = self.value(&path, dir);
            if !dir.starts_with('/') {
                self.finding(
                    &path,
                    format!("{dir:?} is not an absolute path in the container"),
                );
            }
            dir
        });
        let extra_hosts = match written.extra_hosts {
            Some(hosts) => self.extra_hosts(name, hosts),
            None => Vec::new(),
        };
        if written.networks.is_some() {
            self.finding(
                &["services", name, "networks"],
                NETWORKS_REFUSED.to_string(),
            );
        }
        let mounts = written
            .volumes
            .into_iter()
            .filter_map(|mount| self.mount(name, mount, volumes))
            .collect();
        let secrets = self.service_secrets(name, written.secrets);
        let depends_on = self.depends_on(name, written.depends_on, names);
        let healthcheck = written
            .healthcheck
            .and_then(|check| self.healthcheck(name, check));
        let labels = match written.labels {
            Some(labels) => self.pairs(&["services", name, "labels"], labels),
            None => BTreeMap::new(),
        };
        if let Some(mode) = &written.network_mode
            && !matches!(mode.as_str(), "host" | "none" | "bridge")
        {
            self.finding(
                &["services", name, "network_mode"],
                format!("{mode:?} is not supported: use host, none or bridge (the default)"),
            );
        }
        let asked = [
            written.privileged.is_some(),
            written.cap_add.is_some(),
            written.pid.is_some(),
            written.ipc.is_some(),
            written.devices.is_some(),
            written.security_opt.is_some(),
            written.userns_mode.is_some(),
        ];
        for ((key, why), asked) in HOST_TAKEOVER_KEYS.iter().zip(asked) {
            if asked {
                self.finding(
                    &["services", name, key],
                    format!(
                        "refused: a task cannot take over its host ({why}); Cube runs no \
                         container with {key}, and no setting allows it"
                    ),
                );
            }
        }
        let (cpus, memory_bytes) = self.limits(name, written.deploy);
        Service {
            name: name.to_string(),
            image,
            command,
            entrypoint,
            env,
            ports,
            expose,
            mounts,
            depends_on,
            healthcheck,
            labels,
            cpus,
            memory_bytes,
            user,
            working_dir,
            extra_hosts,
            secrets,
        }
    }

    /// A service's `secrets:`, each declared at the top of the file, each target a file name.
    fn service_secrets(
        &mut self,
        name: &str,
        written: Vec<ComposeServiceSecret>,
    ) -> Vec<ServiceSecret> {
        let path = ["services", name, "secrets"];
        let mut secrets: Vec<ServiceSecret> = Vec::new();
        for entry in written {
            let (source, target) = match entry {
                ComposeServiceSecret::Short(source) => (source.clone(), source),
                ComposeServiceSecret::Long(long) => {
                    let target = long.target.unwrap_or_else(|| long.source.clone());
                    (long.source, target)
                }
            };
            if !self.secrets.contains(&source) {
                self.finding(
                    &path,
                    format!(
                        "{source:?} is not declared in the file's top-level secrets (add \
                         `secrets: {{{source}: {{external: true}}}}`)"
                    ),
                );
            }
            if let Some(problem) = crate::secret::name_problem("target", &target) {
                self.finding(
                    &path,
                    format!("{problem}: a secret is a file in /run/secrets"),
                );
            }
            if secrets.iter().any(|secret| secret.target == target) {
                self.finding(&path, format!("/run/secrets/{target} is given twice"));
            }
            secrets.push(ServiceSecret { source, target });
        }
        secrets
    }

    /// `extra_hosts` as `HOST:IP` entries, from a list of them or a map of host to address;
    /// each address must be an IP address (Docker writes it into `/etc/hosts` as it is).
    fn extra_hosts(&mut self, name: &str, written: ListOrMap) -> Vec<String> {
        let path = ["services", name, "extra_hosts"];
        let pairs: Vec<(String, String)> = match written {
            ListOrMap::List(entries) => entries
                .into_iter()
                .filter_map(|entry| {
                    let entry = self.value(&path, entry);
                    // `HOST:IP` or compose's newer `HOST=IP`; an IPv6 address has colons of
                    // its own, so the host is what comes before the first separator.
                    match entry.split_once(['=', ':']) {
                        Some((host, ip)) => Some((host.trim().to_string(), ip.trim().to_string())),
                        None => {
                            self.finding(&path, format!("{entry:?} is not HOST:IP"));
                            None
                        }
                    }
                })
                .collect(),
            ListOrMap::Map(entries) => entries
                .into_iter()
                .filter_map(|(host, ip)| match ip {
                    Some(Scalar(ip)) => Some((host, self.value(&path, ip))),
                    None => {
                        self.finding(&path, format!("{host} has no address"));
                        None
                    }
                })
                .collect(),
        };
        let mut hosts = Vec::with_capacity(pairs.len());
        for (host, ip) in pairs {
            let ip = ip
                .strip_prefix('[')
                .and_then(|ip| ip.strip_suffix(']'))
                .unwrap_or(&ip)
                .to_string();
            if host.is_empty()
                || !host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
            {
                self.finding(&path, format!("{host:?} is not a host name"));
            } else if ip.parse::<std::net::IpAddr>().is_err() {
                self.finding(&path, format!("{ip:?} (for {host}) is not an IP address"));
            } else {
                hosts.push(format!("{host}:{ip}"));
            }
        }
        hosts
    }

    fn words(&mut self, path: &[&str], written: StringOrList) -> Vec<String> {
        match written {
            StringOrList::List(words) => words
                .into_iter()
                .map(|word| self.value(path, word))
                .collect(),
            StringOrList::String(text) => match split_words(&self.value(path, text)) {
                Ok(words) => words,
                Err(why) => {
                    self.finding(path, why);
                    Vec::new()
                }
            },
        }
    }

    fn environment(
        &mut self,
        name: &str,
        env_file: Option<StringOrList>,
        environment: Option<ListOrMap>,
    ) -> Vec<String> {
        let mut values = BTreeMap::new();
        let files = match env_file {
            None => Vec::new(),
            Some(StringOrList::String(file)) => vec![file],
            Some(StringOrList::List(files)) => files,
        };
        for file in files {
            let Some(contents) = self.env_files.get(&file) else {
                self.finding(
                    &["services", name, "env_file"],
                    format!("{file:?} was not sent with the compose file"),
                );
                continue;
            };
            for (number, line) in contents.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                match line.split_once('=') {
                    Some((key, value)) if !key.trim().is_empty() => {
                        values.insert(key.trim().to_string(), value.to_string());
                    }
                    _ => self.finding(
                        &["services", name, "env_file"],
                        format!("{file}, line {}: {line:?} is not KEY=value", number + 1),
                    ),
                }
            }
        }
        if let Some(environment) = environment {
            values.extend(self.pairs(&["services", name, "environment"], environment));
        }
        values
            .into_iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect()
    }

    /// `KEY=value` entries or a map, as a map; a key with no value is refused (compose would
    /// take it from the shell that runs it, and a pod has none).
    fn pairs(&mut self, path: &[&str], written: ListOrMap) -> BTreeMap<String, String> {
        let mut pairs = BTreeMap::new();
        match written {
            ListOrMap::List(entries) => {
                for entry in entries {
                    let entry = self.value(path, entry);
                    match entry.split_once('=') {
                        Some((key, value)) if !key.is_empty() => {
                            pairs.insert(key.to_string(), value.to_string());
                        }
                        _ => self.finding(
                            path,
                            format!("{entry:?} is not KEY=value (a pod has no shell to take a value from)"),
                        ),
                    }
                }
            }
            ListOrMap::Map(entries) => {
                for (key, value) in entries {
                    match value {
                        Some(Scalar(value)) => {
                            let value = self.value(path, value);
                            pairs.insert(key, value);
                        }
                        None => self.finding(
                            path,
                            format!("{key} has no value (a pod has no shell to take one from)"),
                        ),
                    }
                }
            }
        }
        pairs
    }

    fn port(&mut self, name: &str, written: ComposePort) -> Option<ServicePort> {
        let path = ["services", name, "ports"];
        let (container, host) = match written {
            ComposePort::Long(long) => {
                let protocol = long.protocol.unwrap_or_else(|| "tcp".to_string());
                let published = long
                    .published
                    .map(|Scalar(host)| self.value(&path, host))
                    .unwrap_or_default();
                (format!("{}/{protocol}", long.target), published)
            }
            ComposePort::Short(Scalar(text)) => {
                let text = self.value(&path, text);
                let (ports, protocol) = match text.split_once('/') {
                    Some((ports, protocol)) => (ports, protocol),
                    None => (text.as_str(), "tcp"),
                };
                let parts: Vec<&str> = ports.split(':').collect();
                match parts.as_slice() {
                    [container] => (format!("{container}/{protocol}"), String::new()),
                    [host, container] => (format!("{container}/{protocol}"), host.to_string()),
                    _ => {
                        self.finding(
                            &path,
                            format!(
                                "{text:?}: write HOST:CONTAINER or CONTAINER (an address to \
                                 bind to, or a range, is not supported)"
                            ),
                        );
                        return None;
                    }
                }
            }
        };
        let container = match canonical_port(&container) {
            Ok(container) => container,
            Err(why) => {
                self.finding(&path, why);
                return None;
            }
        };
        if !host.is_empty() && !matches!(host.parse::<u16>(), Ok(1..)) {
            self.finding(
                &path,
                format!("host port {host:?} for {container} is not a port number 1-65535"),
            );
            return None;
        }
        Some(ServicePort { container, host })
    }

    fn mount(
        &mut self,
        name: &str,
        written: ComposeMount,
        volumes: &BTreeSet<String>,
    ) -> Option<Mount> {
        let path = ["services", name, "volumes"];
        let (kind, source, target, read_only) = match written {
            ComposeMount::Long(long) => {
                let kind = match long.kind.as_str() {
                    "volume" => MountKind::Volume,
                    "bind" => MountKind::Bind,
                    other => {
                        self.finding(
                            &path,
                            format!("type {other:?} is not supported: use volume or bind"),
                        );
                        return None;
                    }
                };
                let source = self.value(&path, long.source);
                let target = self.value(&path, long.target);
                (kind, source, target, long.read_only)
            }
            ComposeMount::Short(text) => {
                let text = self.value(&path, text);
                let parts: Vec<&str> = text.split(':').collect();
                let (source, target, mode) = match parts.as_slice() {
                    [source, target] => (*source, *target, ""),
                    [source, target, mode] => (*source, *target, *mode),
                    _ => {
                        self.finding(
                            &path,
                            format!(
                                "{text:?}: write SOURCE:TARGET[:ro] (an anonymous volume is not \
                                 supported: name it in the top-level volumes)"
                            ),
                        );
                        return None;
                    }
                };
                let read_only = match mode {
                    "" | "rw" => false,
                    "ro" => true,
                    other => {
                        self.finding(
                            &path,
                            format!("{text:?}: mode {other:?} is not supported: use ro or rw"),
                        );
                        return None;
                    }
                };
                let kind = if source.starts_with(['/', '.', '~']) {
                    MountKind::Bind
                } else {
                    MountKind::Volume
                };
                (kind, source.to_string(), target.to_string(), read_only)
            }
        };
        if !target.starts_with('/') {
            self.finding(
                &path,
                format!("the target {target:?} is not an absolute path in the container"),
            );
            return None;
        }
        match kind {
            MountKind::Bind if !source.starts_with('/') => {
                self.finding(
                    &path,
                    format!(
                        "the bind mount's host path {source:?} is not absolute: the pod runs on \
                         a worker, not next to the compose file"
                    ),
                );
                None
            }
            MountKind::Volume if !volumes.contains(&source) => {
                self.finding(
                    &path,
                    format!("the volume {source:?} is not declared in the top-level volumes"),
                );
                None
            }
            _ => Some(Mount {
                kind,
                source,
                target,
                read_only,
            }),
        }
    }

    fn depends_on(
        &mut self,
        name: &str,
        written: Option<ComposeDependsOn>,
        names: &BTreeSet<String>,
    ) -> Vec<Dependency> {
        let path = ["services", name, "depends_on"];
        let written: Vec<(String, Option<String>)> = match written {
            None => Vec::new(),
            Some(ComposeDependsOn::List(services)) => services
                .into_iter()
                .map(|service| (service, None))
                .collect(),
            Some(ComposeDependsOn::Map(services)) => services
                .into_iter()
                .map(|(service, condition)| (service, condition.condition))
                .collect(),
        };
        let mut dependencies = Vec::new();
        for (service, condition) in written {
            if !names.contains(&service) {
                self.finding(&path, format!("no service named {service:?}"));
                continue;
            }
            if service == name {
                self.finding(&path, "a service cannot depend on itself".to_string());
                continue;
            }
            let condition = match condition.as_deref() {
                None | Some("service_started") => Condition::Started,
                Some("service_healthy") => Condition::Healthy,
                Some("service_completed_successfully") => Condition::CompletedSuccessfully,
                Some(other) => {
                    self.finding(
                        &path,
                        format!(
                            "condition {other:?} is not supported: use service_started, \
                             service_healthy or service_completed_successfully"
                        ),
                    );
                    continue;
                }
            };
            dependencies.push(Dependency { service, condition });
        }
        dependencies
    }

    fn healthcheck(&mut self, name: &str, written: ComposeHealthcheck) -> Option<Healthcheck> {
        if written.disable {
            return None;
        }
        let path = ["services", name, "healthcheck"];
        let test = match written.test {
            None => {
                self.finding(&path, "test: missing (the command that checks)".to_string());
                return None;
            }
            Some(StringOrList::String(command)) => {
                vec!["CMD-SHELL".to_string(), self.value(&path, command)]
            }
            Some(StringOrList::List(words)) => {
                let words: Vec<String> = words
                    .into_iter()
                    .map(|word| self.value(&path, word))
                    .collect();
                match words.first().map(String::as_str) {
                    Some("CMD" | "CMD-SHELL") if words.len() > 1 => {}
                    Some("NONE") => return None,
                    _ => {
                        self.finding(
                            &path,
                            "test: a list starts with \"CMD\" or \"CMD-SHELL\" and has a command"
                                .to_string(),
                        );
                        return None;
                    }
                }
                words
            }
        };
        let mut duration = |key: &str, text: Option<String>| {
            let text = text?;
            let text = match interpolate(&text, self.variables) {
                Ok(text) => text,
                Err(why) => {
                    self.finding(&[path[0], path[1], path[2], key], why);
                    return None;
                }
            };
            match compose_duration(&text) {
                Ok(duration) => Some(duration),
                Err(why) => {
                    let mut at = path.to_vec();
                    at.push(key);
                    self.finding(&at, why);
                    None
                }
            }
        };
        let interval = duration("interval", written.interval);
        let timeout = duration("timeout", written.timeout);
        let start_period = duration("start_period", written.start_period);
        Some(Healthcheck {
            test,
            interval,
            timeout,
            retries: written.retries,
            start_period,
        })
    }

    fn limits(&mut self, name: &str, deploy: Option<ComposeDeploy>) -> (f64, u64) {
        let Some(limits) = deploy.and_then(|d| d.resources).and_then(|r| r.limits) else {
            return (0.0, 0);
        };
        let path = ["services", name, "deploy"];
        let cpus = match limits.cpus {
            None => 0.0,
            Some(Scalar(text)) => match crate::cpu::parse_cpu(&self.value(&path, text)) {
                Ok(cpus) => cpus,
                Err(why) => {
                    self.finding(&path, format!("resources.limits.cpus: {why}"));
                    0.0
                }
            },
        };
        let memory = match limits.memory {
            None => 0,
            Some(Scalar(text)) => match parse_compose_memory(&self.value(&path, text)) {
                Ok(memory) => memory,
                Err(why) => {
                    self.finding(&path, format!("resources.limits.memory: {why}"));
                    0
                }
            },
        };
        (cpus, memory)
    }

    fn network(&mut self, modes: &BTreeSet<String>) -> PodNetwork {
        let modes: Vec<&str> = modes
            .iter()
            .map(|mode| if mode == "bridge" { "" } else { mode.as_str() })
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        match modes.as_slice() {
            ["host"] => PodNetwork::Host,
            ["none"] => PodNetwork::None,
            [_, _, ..] => {
                self.finding(
                    &["services"],
                    "network_mode: every service of a pod shares one network; give them all \
                     the same network_mode"
                        .to_string(),
                );
                PodNetwork::Shared
            }
            _ => PodNetwork::Shared,
        }
    }

    fn restart(&mut self, restarts: &BTreeMap<String, RestartPolicy>) -> Option<RestartPolicy> {
        let distinct: BTreeSet<String> = restarts.values().map(|r| format!("{r:?}")).collect();
        if distinct.len() > 1 {
            self.finding(
                &["services"],
                "restart: the services say different things; a pod restarts as a whole, so \
                 give them all the same restart (or set it on one)"
                    .to_string(),
            );
        }
        restarts.values().next().copied()
    }

    /// Every service after those it depends on; among those free to start, by name. A cycle
    /// is a finding.
    fn start_order(&mut self, services: Vec<Service>) -> Vec<Service> {
        let mut remaining = services;
        let mut ordered: Vec<Service> = Vec::with_capacity(remaining.len());
        while !remaining.is_empty() {
            let started: BTreeSet<&str> = ordered.iter().map(|s| s.name.as_str()).collect();
            let ready = remaining.iter().position(|service| {
                service
                    .depends_on
                    .iter()
                    .all(|dependency| started.contains(dependency.service.as_str()))
            });
            match ready {
                Some(index) => ordered.push(remaining.remove(index)),
                None => {
                    let names: Vec<&str> = remaining.iter().map(|s| s.name.as_str()).collect();
                    self.finding(
                        &["services"],
                        format!("depends_on: a cycle among {}", names.join(", ")),
                    );
                    ordered.append(&mut remaining);
                }
            }
        }
        ordered
    }
}

fn parse_restart(text: &str) -> Result<RestartPolicy, String> {
    match text {
        "no" => Ok(RestartPolicy::No),
        "always" => Ok(RestartPolicy::Always),
        "on-failure" => Ok(RestartPolicy::OnFailure),
        "unless-stopped" => Ok(RestartPolicy::UnlessStopped),
        other => Err(format!(
            "{other:?} is not supported: use no, always, on-failure or unless-stopped"
        )),
    }
}

/// Letters, digits, `_`, `.` and `-`, starting with a letter or digit: what Docker takes in
/// a container's or a volume's name.
fn is_docker_name(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        && name.len() <= 63
}

/// A compose memory size, in Docker's units: `b`, `k`, `m`, `g`, `t`, any case, with or
/// without a trailing `b` (`64M`, `64mb`, `1GiB`), always powers of 1024.
fn parse_compose_memory(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let digits = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(digits);
    let unit = unit.trim().to_ascii_lowercase();
    let letter = unit
        .strip_suffix("ib")
        .or_else(|| unit.strip_suffix('b').filter(|rest| !rest.is_empty()))
        .unwrap_or(&unit);
    match letter {
        "" | "b" | "k" | "m" | "g" | "t" => {
            let docker = if letter == "b" { "" } else { letter };
            crate::size::parse_size(&format!("{number}{docker}"))
        }
        _ => Err(format!(
            "{text:?} has an unknown unit: use b, k, m, g or t (powers of 1024)"
        )),
    }
}

/// A compose duration: one or more number-unit pairs (`"1m30s"`, `"500ms"`, `"10s"`).
pub fn compose_duration(text: &str) -> Result<Duration, String> {
    let mut total = Duration::ZERO;
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err("an empty duration".to_string());
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let after = &rest[digits..];
        let unit = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let piece = &rest[..digits + unit];
        total += crate::duration::parse_duration(piece)
            .map_err(|why| format!("{text:?} is not a duration: {why}"))?;
        rest = &rest[digits + unit..];
    }
    Ok(total)
}

/// Splits a command as a shell would split its words: spaces separate, quotes group, a
/// backslash escapes the next character (outside single quotes).
pub fn split_words(text: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' | '\n' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => word.push(c),
                        None => return Err(format!("{text:?}: a ' is not closed")),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c) => word.push(c),
                            None => return Err(format!("{text:?}: ends in a backslash")),
                        },
                        Some(c) => word.push(c),
                        None => return Err(format!("{text:?}: a \" is not closed")),
                    }
                }
            }
            '\\' => {
                in_word = true;
                match chars.next() {
                    Some(c) => word.push(c),
                    None => return Err(format!("{text:?}: ends in a backslash")),
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

/// The line (1-based) of the key at `path` in a YAML block document, found by indentation:
/// each key of the path is looked for deeper than the one before it.
fn line_of(text: &str, path: &[&str]) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let mut start = 0;
    let mut parent_indent: Option<usize> = None;
    let mut found = None;
    for key in path {
        let spellings = [key.to_string(), format!("\"{key}\""), format!("'{key}'")];
        let mut hit = None;
        for (number, line) in lines.iter().enumerate().skip(start) {
            let content = line.trim_start();
            if content.is_empty() || content.starts_with('#') {
                continue;
            }
            let indent = line.len() - content.len();
            if parent_indent.is_some_and(|parent| indent <= parent) {
                break;
            }
            let is_key = spellings.iter().any(|spelling| {
                content
                    .strip_prefix(spelling.as_str())
                    .is_some_and(|rest| rest.trim_start().starts_with(':'))
            });
            if is_key {
                hit = Some((number, indent));
                break;
            }
        }
        let (number, indent) = hit?;
        found = Some(number + 1);
        start = number + 1;
        parent_indent = Some(indent);
    }
    found
}

// ----- interpolation -----

/// A piece of a value as written: text as it is, or a variable to replace.
#[derive(Debug, PartialEq)]
enum Piece<'a> {
    Text(&'a str),
    /// `$NAME`, `${NAME}`, or `${NAME<op><argument>}` with op one of `:-`, `-`, `:?`, `?`,
    /// `:+`, `+`.
    Variable {
        name: &'a str,
        op: Option<(&'a str, &'a str)>,
    },
    /// A `$` that starts nothing compose reads: why.
    Invalid(String),
}

fn is_variable_name(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The length of the variable name at the start of `text` (letters, digits, `_`).
fn name_length(text: &str) -> usize {
    text.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(text.len())
}

/// A value cut into text and variables, as compose reads it: `$$` is a `$`.
fn pieces(text: &str) -> Vec<Piece<'_>> {
    let mut pieces = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        if at > 0 {
            pieces.push(Piece::Text(&rest[..at]));
        }
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            pieces.push(Piece::Text("$"));
            rest = tail;
        } else if let Some(inside) = after.strip_prefix('{') {
            let Some(end) = inside.find('}') else {
                pieces.push(Piece::Invalid(
                    "a ${ is not closed with }; write $$ for a $".to_string(),
                ));
                return pieces;
            };
            let body = &inside[..end];
            let length = name_length(body);
            let (name, modifier) = body.split_at(length);
            let op = ([":-", ":?", ":+", "-", "?", "+"])
                .iter()
                .find_map(|op| modifier.strip_prefix(op).map(|argument| (*op, argument)));
            if !is_variable_name(name) || (op.is_none() && !modifier.is_empty()) {
                pieces.push(Piece::Invalid(format!(
                    "${{{body}}} is not a variable: write ${{NAME}}, ${{NAME:-default}}, \
                     ${{NAME:?message}}, or $$ for a $"
                )));
            } else {
                pieces.push(Piece::Variable { name, op });
            }
            rest = &inside[end + 1..];
        } else {
            let length = name_length(after);
            let name = &after[..length];
            if is_variable_name(name) {
                pieces.push(Piece::Variable { name, op: None });
            } else {
                pieces.push(Piece::Invalid(
                    "a $ that starts no variable: write $$ for a $ (as in compose)".to_string(),
                ));
            }
            rest = &after[length..];
        }
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest));
    }
    pieces
}

/// A compose value with its variables replaced from `variables`, as compose does: `$NAME`
/// and `${NAME}` (an unset variable is empty), `${NAME:-default}` (the default when unset or
/// empty), `${NAME-default}` (when unset), `${NAME:?message}` and `${NAME?message}` (an error
/// when unset or empty, or unset), `${NAME:+other}` and `${NAME+other}` (`other` when set and
/// not empty, or set), and `$$` for a `$`. Anything else after a `$` is an error.
pub fn interpolate(text: &str, variables: &BTreeMap<String, String>) -> Result<String, String> {
    if !text.contains('$') {
        return Ok(text.to_string());
    }
    let mut value = String::with_capacity(text.len());
    for piece in pieces(text) {
        match piece {
            Piece::Text(text) => value.push_str(text),
            Piece::Invalid(why) => return Err(format!("{text:?}: {why}")),
            Piece::Variable { name, op } => {
                let set = variables.get(name);
                let non_empty = set.filter(|value| !value.is_empty());
                let required = |message: &str| {
                    if message.is_empty() {
                        format!("{text:?}: the variable {name} is not set")
                    } else {
                        format!("{text:?}: the variable {name} is not set: {message}")
                    }
                };
                match op {
                    None => value.push_str(set.map(String::as_str).unwrap_or_default()),
                    Some((":-", default)) => {
                        value.push_str(non_empty.map(String::as_str).unwrap_or(default))
                    }
                    Some(("-", default)) => {
                        value.push_str(set.map(String::as_str).unwrap_or(default))
                    }
                    Some((":?", message)) => match non_empty {
                        Some(set) => value.push_str(set),
                        None => return Err(required(message)),
                    },
                    Some(("?", message)) => match set {
                        Some(set) => value.push_str(set),
                        None => return Err(required(message)),
                    },
                    Some((":+", other)) if non_empty.is_some() => value.push_str(other),
                    Some(("+", other)) if set.is_some() => value.push_str(other),
                    Some(_) => {}
                }
            }
        }
    }
    Ok(value)
}

/// Every variable a compose file's text names (a name in a comment included: the text is
/// not read as YAML here), for the submitter to look up.
pub fn variables_used(text: &str) -> BTreeSet<String> {
    pieces(text)
        .into_iter()
        .filter_map(|piece| match piece {
            Piece::Variable { name, .. } => Some(name.to_string()),
            _ => None,
        })
        .collect()
}

/// The variables a compose file's text uses with nothing to fall back on (`$NAME`, `${NAME}`)
/// that `variables` does not set: what compose warns of ("defaulting to a blank string").
pub fn unset_variables(text: &str, variables: &BTreeMap<String, String>) -> BTreeSet<String> {
    pieces(text)
        .into_iter()
        .filter_map(|piece| match piece {
            Piece::Variable { name, op: None } if !variables.contains_key(name) => {
                Some(name.to_string())
            }
            _ => None,
        })
        .collect()
}

// ----- the wire form -----

/// `{"Compose": "...", "EnvFiles": {...}}`.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PodWire {
    #[serde(rename = "Compose")]
    compose: String,
    #[serde(
        rename = "EnvFiles",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    env_files: BTreeMap<String, String>,
    #[serde(
        rename = "Variables",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    variables: BTreeMap<String, String>,
}

impl Serialize for Pod {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        PodWire {
            compose: self.compose.clone(),
            env_files: self.env_files.clone(),
            variables: self.variables.clone(),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Pod {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Pod, D::Error> {
        let wire = PodWire::deserialize(deserializer)?;
        Pod::parse_with(&wire.compose, &wire.env_files, &wire.variables).map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = "\
services:
  a:
    image: cube-sample:latest
    ports:
      - \"7777\"
    healthcheck:
      test: [\"CMD\", \"wget\", \"-q\", \"-O\", \"/dev/null\", \"http://localhost:7777/health\"]
      interval: 1s
  b:
    image: cube-sample:latest
    command: sh -c 'wget -O - http://localhost:7777/'
    depends_on:
      a:
        condition: service_healthy
    deploy:
      resources:
        limits:
          cpus: \"0.5\"
          memory: 64M
";

    fn parse(text: &str) -> Result<Pod, ComposeError> {
        Pod::parse(text, &BTreeMap::new())
    }

    #[test]
    fn a_two_service_file_reads_in_start_order_with_its_limits() {
        let pod = parse(TWO).unwrap();
        assert_eq!(pod.service_names(), ["a", "b"]);
        let b = &pod.spec.services[1];
        assert_eq!(
            b.command.as_deref(),
            Some(
                &[
                    "sh".to_string(),
                    "-c".into(),
                    "wget -O - http://localhost:7777/".into()
                ][..]
            )
        );
        assert_eq!(b.depends_on[0].condition, Condition::Healthy);
        assert_eq!(pod.memory_bytes(), 64 * 1024 * 1024);
        assert!((pod.cpus() - 0.5).abs() < 1e-9);
        assert_eq!(
            pod.port_bindings(),
            BTreeMap::from([("7777/tcp".to_string(), String::new())])
        );
        assert_eq!(pod.spec.network, PodNetwork::Shared);
        assert!(pod.has_health_check());
    }

    #[test]
    fn an_unsupported_key_is_refused_with_its_name_and_line() {
        let text = "services:\n  a:\n    image: x\n    build: .\n";
        let err = parse(text).unwrap_err().to_string();
        assert!(err.contains("build"), "{err}");
        assert!(err.contains("line 4"), "{err}");
        let top = "services:\n  a:\n    image: x\nnetworks:\n  front: {}\n";
        let err = parse(top).unwrap_err().to_string();
        assert!(err.contains("networks") && err.contains("line 4"), "{err}");
    }

    #[test]
    fn keys_that_would_take_over_the_host_are_refused_by_name_whatever_their_value() {
        for (key, value) in [
            ("privileged", "true"),
            ("privileged", "false"),
            ("cap_add", "[SYS_ADMIN]"),
            ("pid", "host"),
            ("ipc", "host"),
            ("devices", "[\"/dev/sda:/dev/sda\"]"),
            ("security_opt", "[\"seccomp=unconfined\"]"),
            ("userns_mode", "host"),
        ] {
            let text = format!("services:\n  a:\n    image: x\n    {key}: {value}\n");
            let err = parse(&text).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!(
                    "services.a.{key} (line 4): refused: a task cannot take over its host"
                )),
                "{err}"
            );
            assert!(err.contains("no setting allows it"), "{err}");
        }
    }

    #[test]
    fn findings_after_reading_name_their_key_and_line() {
        let text = "services:\n  a:\n    image: x\n    volumes:\n      - data:/data\n";
        let err = parse(text).unwrap_err().to_string();
        assert_eq!(
            err,
            "services.a.volumes (line 4): the volume \"data\" is not declared in the top-level volumes"
        );
        let text = "services:\n  a:\n    image: x\n    volumes:\n      - ./d:/data\n";
        let err = parse(text).unwrap_err().to_string();
        assert!(err.contains("not absolute"), "{err}");
    }

    #[test]
    fn depends_on_orders_the_start_and_a_cycle_is_refused() {
        let text = "services:\n  z:\n    image: x\n  a:\n    image: x\n    depends_on: [z]\n";
        assert_eq!(parse(text).unwrap().service_names(), ["z", "a"]);
        let cycle = "services:\n  a:\n    image: x\n    depends_on: [b]\n  b:\n    image: x\n    depends_on: [a]\n";
        assert!(parse(cycle).unwrap_err().to_string().contains("cycle"));
    }

    #[test]
    fn env_files_come_with_the_file_and_environment_wins() {
        let text = "services:\n  a:\n    image: x\n    env_file: app.env\n    environment:\n      B: two\n";
        let files = BTreeMap::from([("app.env".to_string(), "# c\nA=1\nB=2\n".to_string())]);
        let pod = Pod::parse(text, &files).unwrap();
        assert_eq!(pod.spec.services[0].env, ["A=1", "B=two"]);
        assert!(parse(text).unwrap_err().to_string().contains("not sent"));
    }

    #[test]
    fn host_and_none_networks_must_be_the_pods_whole() {
        let text = "services:\n  a:\n    image: x\n    network_mode: host\n";
        assert_eq!(parse(text).unwrap().spec.network, PodNetwork::Host);
        let mixed = "services:\n  a:\n    image: x\n    network_mode: host\n  b:\n    image: x\n";
        assert!(
            parse(mixed)
                .unwrap_err()
                .to_string()
                .contains("network_mode")
        );
    }

    #[test]
    fn compose_durations_and_words() {
        assert_eq!(compose_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(
            compose_duration("500ms").unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(
            split_words(r#"sh -c "echo 'a b'" x\ y"#).unwrap(),
            ["sh", "-c", "echo 'a b'", "x y"]
        );
    }

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect()
    }

    #[test]
    fn values_are_interpolated_as_compose_does_and_a_double_dollar_is_a_dollar() {
        let set = vars(&[("TAG", "1.2"), ("EMPTY", "")]);
        let cases = [
            ("img:${TAG}", "img:1.2"),
            ("img:$TAG-x", "img:1.2-x"),
            ("${MISSING}", ""),
            ("${MISSING:-dflt}", "dflt"),
            ("${EMPTY:-dflt}", "dflt"),
            ("${EMPTY-dflt}", ""),
            ("${MISSING-dflt}", "dflt"),
            ("${TAG:+on}", "on"),
            ("${EMPTY:+on}", ""),
            ("${EMPTY+on}", "on"),
            ("echo $$HOME $${X}", "echo $HOME ${X}"),
            ("no dollar", "no dollar"),
        ];
        for (written, meant) in cases {
            assert_eq!(interpolate(written, &set).unwrap(), meant, "{written}");
        }
        for (written, why) in [
            (
                "${MISSING:?give it}",
                "the variable MISSING is not set: give it",
            ),
            ("${EMPTY:?}", "the variable EMPTY is not set"),
            ("cost $5", "write $$ for a $"),
            ("${TAG", "is not closed"),
            ("${1X}", "is not a variable"),
            ("${TAG/x}", "is not a variable"),
        ] {
            let err = interpolate(written, &set).unwrap_err();
            assert!(err.contains(why), "{written}: {err}");
        }
        let text = "# $COMMENTED\nimage: ${A}:${B:-x}$$C $D\n";
        assert_eq!(
            variables_used(text).into_iter().collect::<Vec<_>>(),
            ["A", "B", "COMMENTED", "D"]
        );
        assert_eq!(
            unset_variables(text, &vars(&[("A", "a")]))
                .into_iter()
                .collect::<Vec<_>>(),
            ["COMMENTED", "D"],
            "B has a default"
        );
    }

    #[test]
    fn a_pods_values_are_interpolated_from_its_variables_before_they_are_read() {
        let text = "services:\n  a:\n    image: \"cube-sample:${TAG:-latest}\"\n    command: sh -c 'echo $$HOME ${GREETING}'\n    environment:\n      PORT: \"${PORT}\"\n    ports: [\"${PORT}:7777\"]\n";
        let pod = Pod::parse_with(
            text,
            &BTreeMap::new(),
            &vars(&[("GREETING", "hi"), ("PORT", "8080")]),
        )
        .unwrap();
        let a = &pod.spec.services[0];
        assert_eq!(a.image, "cube-sample:latest");
        assert_eq!(
            a.command.as_deref().unwrap(),
            ["sh", "-c", "echo $HOME hi"],
            "$$ reaches the container as $"
        );
        assert_eq!(a.env, ["PORT=8080"]);
        assert_eq!(a.ports[0].host, "8080");
        // The variables travel with the pod, and read back the same.
        let json = serde_json::to_value(&pod).unwrap();
        assert_eq!(json["Variables"]["PORT"], "8080");
        let back: Pod = serde_json::from_value(json).unwrap();
        assert_eq!(back, pod);
        let bad = "services:\n  a:\n    image: x\n    command: echo $1\n";
        assert_eq!(
            parse(bad).unwrap_err().to_string(),
            "services.a.command (line 4): \"echo $1\": a $ that starts no variable: write $$ \
             for a $ (as in compose)"
        );
    }

    #[test]
    fn user_working_dir_expose_and_extra_hosts_are_read_and_checked() {
        let text = "services:\n  a:\n    image: x\n    user: 1000\n    working_dir: /srv\n    expose: [\"9000\", 53/udp]\n    extra_hosts:\n      - \"db:10.0.0.5\"\n      - \"v6:::1\"\n  b:\n    image: x\n    user: \"app:app\"\n    extra_hosts: {cache: 10.0.0.6}\n";
        let pod = parse(text).unwrap();
        let a = &pod.spec.services[0];
        assert_eq!(a.user.as_deref(), Some("1000"));
        assert_eq!(a.working_dir.as_deref(), Some("/srv"));
        assert_eq!(a.expose, ["9000/tcp", "53/udp"]);
        assert_eq!(a.extra_hosts, ["db:10.0.0.5", "v6:::1"]);
        let b = &pod.spec.services[1];
        assert_eq!(b.user.as_deref(), Some("app:app"));
        assert_eq!(b.extra_hosts, ["cache:10.0.0.6"]);
        for (key, value, line, why) in [
            ("working_dir", "srv", 4, "not an absolute path"),
            ("expose", "[\"http\"]", 4, "\"http\""),
            (
                "extra_hosts",
                "[\"db:not-an-ip\"]",
                4,
                "is not an IP address",
            ),
            ("extra_hosts", "[\"db\"]", 4, "is not HOST:IP"),
            ("user", "\"a b\"", 4, "is not a user"),
        ] {
            let text = format!("services:\n  a:\n    image: x\n    {key}: {value}\n");
            let err = parse(&text).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("services.a.{key} (line {line}): ")) && err.contains(why),
                "{key}: {err}"
            );
        }
    }

    #[test]
    fn depends_on_a_service_completed_successfully_is_read() {
        let text = "services:\n  web:\n    image: x\n    depends_on:\n      migrate:\n        condition: service_completed_successfully\n  migrate:\n    image: x\n";
        let pod = parse(text).unwrap();
        assert_eq!(pod.service_names(), ["migrate", "web"]);
        assert_eq!(
            pod.spec.services[1].depends_on[0].condition,
            Condition::CompletedSuccessfully
        );
        let other = text.replace("service_completed_successfully", "service_done");
        let err = parse(&other).unwrap_err().to_string();
        assert!(
            err.starts_with("services.web.depends_on (line 4): condition \"service_done\"")
                && err.contains("service_completed_successfully"),
            "{err}"
        );
    }

    #[test]
    fn networks_are_refused_saying_that_a_pod_shares_one_network() {
        let service = "services:\n  a:\n    image: x\n    networks: [front]\n";
        let err = parse(service).unwrap_err().to_string();
        assert!(
            err.starts_with(
                "services.a.networks (line 4): refused: a pod's services share one network"
            ),
            "{err}"
        );
        let top = "services:\n  a:\n    image: x\nnetworks:\n  front: {}\n";
        let err = parse(top).unwrap_err().to_string();
        assert!(err.starts_with("networks (line 4): refused"), "{err}");
    }

    #[test]
    fn reading_errors_name_the_key_then_its_line_and_column_and_nothing_after() {
        let text = "services:\n  a:\n    image: x\n    build: .\n";
        let err = parse(text).unwrap_err().to_string();
        assert!(
            err.starts_with(
                "compose file: services.a.build (line 4, column 5): unknown field `build`"
            ),
            "{err}"
        );
        assert!(err.ends_with("see `cube run --help`)"), "{err}");
        let typed = "services:\n  a:\n    image: x\n    healthcheck:\n      retries: many\n";
        let err = parse(typed).unwrap_err().to_string();
        assert!(
            err.starts_with(
                "compose file: services.a.healthcheck.retries (line 5, column 16): invalid type"
            ),
            "{err}"
        );
        let syntax = "services:\n  a:\n    image: [x\n";
        let err = parse(syntax).unwrap_err().to_string();
        assert!(err.contains("(line ") || err.contains("line "), "{err}");
        assert!(!err.contains(" at line "), "the place is said once: {err}");
    }

    #[test]
    fn a_pod_reads_back_from_its_wire_form() {
        let pod = parse(TWO).unwrap();
        let json = serde_json::to_string(&pod).unwrap();
        let back: Pod = serde_json::from_str(&json).unwrap();
        assert_eq!(back, pod);
    }
}
