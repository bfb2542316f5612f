//! Secrets, named volumes and registry logins: what a task asks for by name and gets on its
//! node when it runs, never in its own record.
//!
//! - A **secret** belongs to a project (`cube secret create NAME`): its value is kept
//!   encrypted by the manager, given only to the worker that starts a run of a task naming it
//!   ([`RunSecrets`]), and mounted read-only at `/run/secrets/NAME` (or put in an environment
//!   variable when the task asks, [`SecretUse::env`]). A task names it as `"db-password"` or
//!   `{"Name": "db-password", "Env": "DB_PASSWORD"}` ([`SecretUse`]); its record carries names
//!   only.
//! - A **named volume** (`"data:/var/lib/db"`, [`VolumeMount`]) is created on the node by the
//!   engine and kept when the task ends; a job's copy has one of its own
//!   ([`volume_of_copy`]), so a copy that comes back on the node finds what it wrote.
//! - A **registry login** (`cube registry login HOST`) is kept as a secret of the project named
//!   [`registry_secret_name`] (a name no user secret can have), and the worker pulls a task's
//!   image from that host with it.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::de::{self, Deserializer};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

/// The longest name of a secret or a volume.
pub const MAX_SECRET_NAME_CHARS: usize = 64;
/// The largest value a secret may hold (what Swarm and Kubernetes allow, 500 KiB and 1 MiB).
pub const MAX_SECRET_BYTES: usize = 512 * 1024;
/// Where a secret is mounted in the container: `/run/secrets/NAME`.
pub const SECRETS_DIR_IN_CONTAINER: &str = "/run/secrets";

/// What is wrong with `name` as a secret's or a volume's name (`what` says which), if
/// anything: 1 to 64 letters, digits, `.`, `_` and `-`, starting with a letter or a digit (it
/// becomes a file name in the container and part of a Docker volume's name).
pub fn name_problem(what: &str, name: &str) -> Option<String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if name.is_empty() {
        return Some(format!("{what} name is empty"));
    }
    if name.chars().count() > MAX_SECRET_NAME_CHARS {
        return Some(format!(
            "{what} name {name:?} is longer than {MAX_SECRET_NAME_CHARS} characters"
        ));
    }
    if !name.chars().all(allowed) || !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Some(format!(
            "{what} name {name:?} may hold only letters, digits, '.', '_' and '-', and starts \
             with a letter or a digit"
        ));
    }
    None
}

/// The name under which a project keeps its login to the registry `host` (`registry:HOST`):
/// the `:` keeps it apart from every name a user may give a secret.
pub fn registry_secret_name(host: &str) -> String {
    format!("registry:{host}")
}

/// What is wrong with `host` as a registry's address (`registry.example.com`,
/// `127.0.0.1:5000`), if anything.
pub fn registry_host_problem(host: &str) -> Option<String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']');
    if host.is_empty() || host.len() > 253 || !host.chars().all(allowed) {
        return Some(format!(
            "registry host {host:?} is not a host name or address with an optional port \
             (registry.example.com, 127.0.0.1:5000)"
        ));
    }
    None
}

/// The registry host an image reference is pulled from, when it names one: the first part of
/// `127.0.0.1:5000/app:1` or `registry.example.com/team/app` (a first part with a `.` or a
/// `:`, or `localhost`); `None` for Docker Hub's images (`busybox`, `library/busybox`).
pub fn registry_of_image(image: &str) -> Option<&str> {
    let (first, _) = image.split_once('/')?;
    (first.contains('.') || first.contains(':') || first == "localhost").then_some(first)
}

/// A secret a task uses: its name and, when asked, the environment variable that holds its
/// value instead of the file `/run/secrets/NAME`. Written as the name alone when it is a file.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SecretUse {
    pub name: String,
    /// Put the value in this environment variable (it then shows in `docker inspect` on the
    /// node, as any variable does); unset: the file `/run/secrets/NAME`, on tmpfs.
    pub env: Option<String>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct SecretUseObject {
    #[serde(rename = "Name")]
    name: String,
    #[serde(rename = "Env", default, skip_serializing_if = "Option::is_none")]
    env: Option<String>,
}

impl Serialize for SecretUse {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match &self.env {
            None => serializer.serialize_str(&self.name),
            Some(env) => SecretUseObject {
                name: self.name.clone(),
                env: Some(env.clone()),
            }
            .serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for SecretUse {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<SecretUse, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            Name(String),
            Object(SecretUseObject),
        }
        match Form::deserialize(deserializer).map_err(|_| {
            de::Error::custom(
                "a secret is its name (\"db-password\") or {\"Name\": \"db-password\", \"Env\": \
                 \"DB_PASSWORD\"}",
            )
        })? {
            Form::Name(name) => Ok(SecretUse { name, env: None }),
            Form::Object(SecretUseObject { name, env }) => Ok(SecretUse { name, env }),
        }
    }
}

impl SecretUse {
    /// What is wrong with this use, under `path` (`Secrets[0]`).
    pub fn findings(&self, path: &str) -> Vec<String> {
        let mut findings = Vec::new();
        if self.name.starts_with("registry:") {
            findings.push(format!(
                "{path}: {:?} is a registry login, used for pulls only, not by name",
                self.name
            ));
        } else if let Some(problem) = name_problem("secret", &self.name) {
            findings.push(format!("{path}: {problem}"));
        }
        if let Some(env) = &self.env {
            let valid = !env.is_empty()
                && env.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !env.starts_with(|c: char| c.is_ascii_digit());
            if !valid {
                findings.push(format!(
                    "{path}.Env: {env:?} is not a variable name (letters, digits and '_', not \
                     starting with a digit)"
                ));
            }
        }
        findings
    }
}

/// A named volume or a bind mount a task asks for: `NAME:/path`, `/host/path:/path`, each
/// with an optional `:ro`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VolumeMount {
    /// A volume's name, or a host path (starting with `/`: a bind mount, under the worker's
    /// `allowed_host_paths`).
    pub source: String,
    /// Where it appears in the container (an absolute path).
    pub target: String,
    pub read_only: bool,
}

impl VolumeMount {
    /// Whether the source is a path of the node (a bind mount), not a named volume.
    pub fn is_bind(&self) -> bool {
        self.source.starts_with('/')
    }

    /// What is wrong with the mount, under `path` (`Volumes[0]`).
    pub fn findings(&self, path: &str) -> Vec<String> {
        let mut findings = Vec::new();
        if !self.is_bind()
            && let Some(problem) = name_problem("volume", &self.source)
        {
            findings.push(format!("{path}: {problem}"));
        }
        if !self.target.starts_with('/') || self.target.contains(':') {
            findings.push(format!(
                "{path}: the path in the container {:?} is not absolute",
                self.target
            ));
        } else if self.target == "/" {
            findings.push(format!("{path}: a volume cannot replace the container's /"));
        }
        if self.target.starts_with(SECRETS_DIR_IN_CONTAINER) {
            findings.push(format!(
                "{path}: {} is where the task's secrets are mounted",
                self.target
            ));
        }
        if self
            .source
            .chars()
            .chain(self.target.chars())
            .any(char::is_control)
        {
            findings.push(format!("{path}: contains a control character"));
        }
        findings
    }
}

impl std::str::FromStr for VolumeMount {
    type Err = String;

    fn from_str(text: &str) -> Result<VolumeMount, String> {
        let (rest, read_only) = match text.strip_suffix(":ro") {
            Some(rest) => (rest, true),
            None => (text.strip_suffix(":rw").unwrap_or(text), false),
        };
        let Some((source, target)) = rest.split_once(':') else {
            return Err(format!(
                "{text:?} is not NAME:/path (a named volume) or /host/path:/path, with an \
                 optional :ro"
            ));
        };
        Ok(VolumeMount {
            source: source.to_string(),
            target: target.to_string(),
            read_only,
        })
    }
}

impl fmt::Display for VolumeMount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.source, self.target)?;
        if self.read_only {
            f.write_str(":ro")?;
        }
        Ok(())
    }
}

impl Serialize for VolumeMount {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for VolumeMount {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<VolumeMount, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(de::Error::custom)
    }
}

/// The volume a task's mount of `name` uses: `name` itself for a bare task; for copy `index`
/// of a job's group, a volume of that copy's own, `NAME.JOB.GROUP.INDEX` (a job's and a
/// group's names hold no `.`), so that copies never share one and a copy started again finds
/// its own.
pub fn volume_of_copy(name: &str, job: &str, group: &str, index: Option<u32>) -> String {
    match index {
        Some(index) if !job.is_empty() => {
            let job = job.rsplit('/').next().unwrap_or(job);
            format!("{name}.{job}.{group}.{index}")
        }
        _ => name.to_string(),
    }
}

/// The named volumes of `task` (Cube's names, its copy's own for a job's copy).
pub fn volumes_of(task: &crate::Task) -> impl Iterator<Item = String> + '_ {
    task.spec
        .volumes
        .iter()
        .filter(|mount| !mount.is_bind())
        .map(|mount| {
            volume_of_copy(
                &mount.source,
                &task.spec.job,
                &task.spec.group,
                task.spec.index,
            )
        })
}

/// Whether `volumes` (a node's report) holds every named volume `task` mounts (and it mounts
/// one).
pub fn holds_volumes_of(volumes: &[VolumeInfo], task: &crate::Task) -> bool {
    let mut wanted = volumes_of(task).peekable();
    wanted.peek().is_some()
        && wanted.all(|name| {
            volumes
                .iter()
                .any(|volume| volume.name == name && volume.project == task.spec.project)
        })
}

/// The Docker volume holding the volume `volume` of `project` for the worker `node`: the node
/// is in it because several workers may share one engine (a test machine, `cube dev`).
pub fn docker_volume_name(node: &str, project: &str, volume: &str) -> String {
    let safe = |text: &str| -> String {
        text.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                    c
                } else {
                    '-'
                }
            })
            .collect()
    };
    format!("cube-{}-{}-{}", safe(node), safe(project), safe(volume))
}

/// Docker labels a worker puts on the volumes it creates, and reads back.
pub const LABEL_VOLUME: &str = "cube.volume";
pub const LABEL_VOLUME_PROJECT: &str = "cube.project";
pub const LABEL_VOLUME_NODE: &str = "cube.node";

/// A named volume on a node, as the worker reports it and `GET /volumes` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeInfo {
    /// Cube's name (`data`, or `data.db.db.0` for a job's copy).
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Project")]
    pub project: String,
    #[serde(rename = "Node", default)]
    pub node: String,
    /// The engine's name of it (`cube-NODE-PROJECT-NAME`).
    #[serde(rename = "DockerName")]
    pub docker_name: String,
    /// The tasks on the node that use it and have not ended.
    #[serde(rename = "UsedBy", default, skip_serializing_if = "Vec::is_empty")]
    pub used_by: Vec<String>,
}

/// A secret as it is listed: never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretInfo {
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Project")]
    pub project: String,
    /// 1 for the first value, one more for each `create` of the same name.
    #[serde(rename = "Version")]
    pub version: u64,
    #[serde(rename = "CreatedTime", with = "crate::time::optional", default)]
    pub created_time: Option<DateTime<Utc>>,
    #[serde(rename = "UpdatedTime", with = "crate::time::optional", default)]
    pub updated_time: Option<DateTime<Utc>>,
}

/// A secret as the manager stores it: what is listed, and the value sealed with the cluster's
/// secrets key (the nonce, then the ciphertext and its tag, in base64). The value never is in
/// the store in clear.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretRecord {
    #[serde(flatten)]
    pub info: SecretInfo,
    #[serde(rename = "Sealed")]
    pub sealed: String,
}

/// `POST /secrets`: a secret's value (base64, so that any bytes may be kept), in a project.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NewSecret {
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Project", default)]
    pub project: String,
    /// The value in base64.
    #[serde(rename = "Value")]
    pub value: String,
}

/// `POST /registries`: a login to a registry, kept as a secret of the project.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryLogin {
    #[serde(rename = "Host")]
    pub host: String,
    #[serde(rename = "Project", default)]
    pub project: String,
    #[serde(rename = "Username")]
    pub username: String,
    #[serde(rename = "Password")]
    pub password: String,
}

/// A registry's credentials as a worker pulls with them.
#[derive(Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct RegistryAuth {
    #[serde(rename = "Host")]
    pub host: String,
    #[serde(rename = "Username")]
    pub username: String,
    #[serde(rename = "Password")]
    pub password: String,
}

impl fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RegistryAuth({} as {})", self.host, self.username)
    }
}

/// One secret's value for a run.
#[derive(Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct SecretValue {
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Version")]
    pub version: u64,
    /// The value in base64.
    #[serde(rename = "Value")]
    pub value: String,
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretValue({} v{})", self.name, self.version)
    }
}

/// `GET /nodes/{name}/secrets?task=ID`: what the worker the task is placed on needs to start
/// its run — the values of the secrets it names, and the login to its image's registry when
/// its project has one. Answered to that node only.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct RunSecrets {
    #[serde(rename = "Secrets", default)]
    pub secrets: Vec<SecretValue>,
    #[serde(rename = "Registry", default, skip_serializing_if = "Option::is_none")]
    pub registry: Option<RegistryAuth>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_use_reads_as_a_name_or_an_object_and_writes_back_the_same() {
        let uses: Vec<SecretUse> =
            serde_json::from_str(r#"["db-password", {"Name": "key", "Env": "API_KEY"}]"#).unwrap();
        assert_eq!(uses[0].name, "db-password");
        assert_eq!(uses[0].env, None);
        assert_eq!(uses[1].env.as_deref(), Some("API_KEY"));
        assert_eq!(
            serde_json::to_string(&uses).unwrap(),
            r#"["db-password",{"Name":"key","Env":"API_KEY"}]"#
        );
        assert!(serde_json::from_str::<SecretUse>("3").is_err());
    }

    #[test]
    fn names_that_would_leave_the_secrets_directory_are_refused() {
        for bad in ["", "../x", "a/b", ".hidden", "x y", "registry:h"] {
            let use_ = SecretUse {
                name: bad.to_string(),
                env: None,
            };
            assert!(!use_.findings("Secrets[0]").is_empty(), "{bad:?}");
        }
        let bad_env = SecretUse {
            name: "ok".into(),
            env: Some("1X".into()),
        };
        assert_eq!(bad_env.findings("S").len(), 1);
    }

    #[test]
    fn volumes_read_as_docker_writes_them() {
        let mount: VolumeMount = "data:/var/lib/db:ro".parse().unwrap();
        assert_eq!(mount.source, "data");
        assert_eq!(mount.target, "/var/lib/db");
        assert!(mount.read_only && !mount.is_bind());
        assert_eq!(mount.to_string(), "data:/var/lib/db:ro");
        assert!(mount.findings("V").is_empty());
        let bind: VolumeMount = "/srv/x:/x".parse().unwrap();
        assert!(bind.is_bind() && !bind.read_only);
        assert!("data".parse::<VolumeMount>().is_err());
        let relative: VolumeMount = "data:var".parse().unwrap();
        assert_eq!(relative.findings("V").len(), 1);
        let secrets: VolumeMount = "data:/run/secrets".parse().unwrap();
        assert_eq!(secrets.findings("V").len(), 1);
    }

    #[test]
    fn each_copy_of_a_job_has_a_volume_of_its_own() {
        assert_eq!(volume_of_copy("data", "", "", None), "data");
        assert_eq!(volume_of_copy("data", "db", "db", Some(0)), "data.db.db.0");
        assert_eq!(
            volume_of_copy("data", "team-a/db", "main", Some(2)),
            "data.db.main.2"
        );
        assert_eq!(
            docker_volume_name("w 1", "team-a", "data.db.db.0"),
            "cube-w-1-team-a-data.db.db.0"
        );
    }

    #[test]
    fn an_image_names_its_registry_only_with_a_host_part() {
        assert_eq!(
            registry_of_image("127.0.0.1:5000/app:1"),
            Some("127.0.0.1:5000")
        );
        assert_eq!(
            registry_of_image("registry.example.com/team/app"),
            Some("registry.example.com")
        );
        assert_eq!(registry_of_image("localhost/app"), Some("localhost"));
        assert_eq!(registry_of_image("library/busybox"), None);
        assert_eq!(registry_of_image("busybox"), None);
    }
}
