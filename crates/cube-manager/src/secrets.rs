//! The projects' secrets and registry logins (`cube secret`, `cube registry login`): kept
//! sealed with the cluster's secrets key (`sealing.rs`, AES-256-GCM, each value bound to its
//! project, name and version), listed by name and version only, and opened for one reader
//! alone: the worker a task naming them is placed on, when it starts the task's run
//! (`GET /nodes/{name}/secrets?task=ID`; the routes are `secret_api.rs`). No answer, event, log line or error of the manager
//! holds a value.
//!
//! **The key.** A manager on its own store keeps it in its data directory (`secrets.key`, 32
//! random bytes in hex, mode 0600, made at its first start); managers sharing etcd are each
//! given the same file (`--secrets-key-file`), so etcd holds only sealed values. A manager on
//! etcd given none refuses to keep or open secrets, saying so.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use axum::http::StatusCode;
use base64::Engine;
use cube_api::server::ApiError;
use cube_store::{Store, StoreError};
use cube_types::secret::{
    RegistryAuth, RunSecrets, SecretInfo, SecretRecord, SecretValue, registry_of_image,
    registry_secret_name,
};

use crate::sealing::SealingKey;

/// The file a manager on its own store keeps its secrets key in, in its data directory.
pub const KEY_FILE: &str = "secrets.key";

/// A fixed label keeps the secrets' key apart from any other use of the same bytes.
const KEY_LABEL: &str = "cube secrets key, v1\0";

/// The secrets of every project, sealed.
pub struct Secrets {
    table: Arc<dyn Store<SecretRecord>>,
    /// `Err`: why this manager has no key (it then keeps and opens no secret).
    key: Result<SealingKey, String>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secrets { .. }")
    }
}

/// The key of `text` (64 hex digits, white space around them aside).
pub fn key_from_text(text: &str) -> Result<SealingKey, String> {
    let bytes = crate::acl::unhex(text.trim())
        .filter(|bytes| bytes.len() == 32)
        .ok_or_else(|| {
            "a secrets key is 64 hex digits (32 random bytes: `openssl rand -hex 32`)".to_string()
        })?;
    Ok(SealingKey::derive(KEY_LABEL, &bytes))
}

/// The key in `path`; with `create`, a new one written there first when there is none (mode
/// 0600, created only if absent, so two starts never write two keys).
pub fn key_from_file(path: &Path, create: bool) -> Result<SealingKey, String> {
    if create && !path.exists() {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|err| format!("random bytes: {err}"))?;
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        match options.open(path) {
            Ok(mut file) => {
                file.write_all(format!("{}\n", crate::acl::hex(&bytes)).as_bytes())
                    .and_then(|()| file.sync_all())
                    .map_err(|err| format!("{}: cannot write it: {err}", path.display()))?;
            }
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(err) => return Err(format!("{}: cannot create it: {err}", path.display())),
        }
    }
    let text = std::fs::read_to_string(path)
        .map_err(|err| format!("{}: cannot read it: {err}", path.display()))?;
    key_from_text(&text).map_err(|why| format!("{}: {why}", path.display()))
}

/// Why a secret could not be kept, found or opened.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("{0}")]
    NoKey(String),
    #[error(
        "no secret {name:?} in project {project:?} (cube secret list; cube secret create {name})"
    )]
    NotFound { project: String, name: String },
    #[error(
        "secret {name:?} of project {project:?} cannot be opened with this manager's secrets \
         key (was it made with another --secrets-key-file?)"
    )]
    WrongKey { project: String, name: String },
    #[error("the secrets' store: {0}")]
    Store(#[from] StoreError),
    #[error("sealing the secret: {0}")]
    Seal(#[from] crate::sealing::SealError),
}

impl From<SecretError> for ApiError {
    fn from(err: SecretError) -> ApiError {
        let status = match &err {
            SecretError::NotFound { .. } => StatusCode::NOT_FOUND,
            SecretError::NoKey(_) => StatusCode::CONFLICT,
            SecretError::Store(
                StoreError::Failed { .. }
                | StoreError::Unavailable { .. }
                | StoreError::Fenced { .. },
            ) => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, err.to_string())
    }
}

fn record_key(project: &str, name: &str) -> String {
    format!("{project}/{name}")
}

/// What a sealed value is bound to: its project, name and version.
fn binding(project: &str, name: &str, version: u64) -> Vec<u8> {
    format!("{project}\0{name}\0{version}").into_bytes()
}

impl Secrets {
    /// The secrets in `table`, sealed with `key` (`Err`: why there is none).
    pub fn new(table: Arc<dyn Store<SecretRecord>>, key: Result<SealingKey, String>) -> Secrets {
        Secrets { table, key }
    }

    /// In memory, with a key of this process: for tests and benchmarks.
    pub fn in_memory() -> Secrets {
        let mut bytes = [0u8; 32];
        let key = getrandom::fill(&mut bytes)
            .map(|()| SealingKey::derive(KEY_LABEL, &bytes))
            .map_err(|err| format!("random bytes: {err}"));
        Secrets::new(Arc::new(cube_store::MemoryStore::new()), key)
    }

    fn key(&self) -> Result<&SealingKey, SecretError> {
        self.key
            .as_ref()
            .map_err(|why| SecretError::NoKey(why.clone()))
    }

    /// Keeps `value` as secret `name` of `project`: its first version, or one more.
    pub async fn put(
        &self,
        project: &str,
        name: &str,
        value: &[u8],
    ) -> Result<SecretInfo, SecretError> {
        let key = self.key()?;
        let stored_key = record_key(project, name);
        // Two creates of one name at once: each version is given once (the write is
        // conditioned on the record read; the loser reads again).
        loop {
            let now = chrono::Utc::now();
            let previous = self.table.get_with_revision(&stored_key)?;
            let info = SecretInfo {
                name: name.to_string(),
                project: project.to_string(),
                version: previous
                    .as_ref()
                    .map_or(1, |(record, _)| record.info.version + 1),
                created_time: previous
                    .as_ref()
                    .and_then(|(record, _)| record.info.created_time)
                    .or(Some(now)),
                updated_time: Some(now),
            };
            let sealed = key.seal(value, &binding(project, name, info.version))?;
            let record = SecretRecord {
                info: info.clone(),
                sealed: crate::acl::hex(&sealed),
            };
            let expected = match &previous {
                Some((_, revision)) => cube_store::Expected::Revision(*revision),
                None => cube_store::Expected::Absent,
            };
            if self
                .table
                .put_if_queued(&stored_key, &record, expected)?
                .durable()
                .await?
                .is_ok()
            {
                return Ok(info);
            }
        }
    }

    /// Every secret `keep` lets through (by project), by project and name.
    pub fn list(&self, keep: impl Fn(&str) -> bool) -> Result<Vec<SecretInfo>, SecretError> {
        let mut listed: Vec<SecretInfo> = self
            .table
            .list()?
            .into_iter()
            .map(|record| record.info)
            .filter(|info| keep(&info.project))
            .collect();
        listed.sort_by(|a, b| (&a.project, &a.name).cmp(&(&b.project, &b.name)));
        Ok(listed)
    }

    /// Whether `project` has a secret `name`.
    pub fn exists(&self, project: &str, name: &str) -> Result<bool, SecretError> {
        Ok(self.table.get(&record_key(project, name))?.is_some())
    }

    /// Removes secret `name` of `project`; whether there was one.
    pub async fn remove(&self, project: &str, name: &str) -> Result<bool, SecretError> {
        let key = record_key(project, name);
        if self.table.get(&key)?.is_none() {
            return Ok(false);
        }
        self.table.delete(&key)?;
        Ok(true)
    }

    /// The value of secret `name` of `project`, and its version.
    pub fn open(&self, project: &str, name: &str) -> Result<(u64, Vec<u8>), SecretError> {
        let key = self.key()?;
        let record =
            self.table
                .get(&record_key(project, name))?
                .ok_or_else(|| SecretError::NotFound {
                    project: project.to_string(),
                    name: name.to_string(),
                })?;
        let wrong_key = || SecretError::WrongKey {
            project: project.to_string(),
            name: name.to_string(),
        };
        let sealed = crate::acl::unhex(&record.sealed).ok_or_else(wrong_key)?;
        let value = key
            .open(&sealed, &binding(project, name, record.info.version))
            .ok_or_else(wrong_key)?;
        Ok((record.info.version, value))
    }

    /// The first secret of `names` that `project` does not have, as the error a submission
    /// naming it gets.
    pub fn check_uses<'a>(
        &self,
        project: &str,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), ApiError> {
        for name in names {
            if !self.exists(project, name)? {
                return Err(ApiError::bad_request(format!(
                    "Secrets: no secret {name:?} in project {project:?} (cube secret create \
                     {name} --project {project}; a task uses only its own project's secrets)"
                )));
            }
        }
        Ok(())
    }

    /// What the run of `task` needs: its secrets' values, and the login to its image's
    /// registry when its project has one.
    pub fn for_run(&self, task: &cube_types::Task) -> Result<RunSecrets, SecretError> {
        let project = &task.spec.project;
        let mut run = RunSecrets::default();
        for name in task.secret_names() {
            let (version, value) = self.open(project, name)?;
            run.secrets.push(SecretValue {
                name: name.to_string(),
                version,
                value: base64::engine::general_purpose::STANDARD.encode(value),
            });
        }
        if let Some(host) = registry_of_image(&task.spec.image) {
            match self.open(project, &registry_secret_name(host)) {
                Ok((_, value)) => {
                    let login: RegistryAuth =
                        serde_json::from_slice(&value).map_err(|_| SecretError::WrongKey {
                            project: project.clone(),
                            name: registry_secret_name(host),
                        })?;
                    run.registry = Some(login);
                }
                Err(SecretError::NotFound { .. }) => {}
                Err(err) => return Err(err),
            }
        }
        Ok(run)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_create_is_the_next_version_and_opens_as_written() {
        let secrets = Arc::new(Secrets::in_memory());
        let first = secrets.put("team-a", "pw", b"one").await.unwrap();
        assert_eq!(first.version, 1);
        let racing: Vec<_> = (0..8)
            .map(|n| {
                let secrets = secrets.clone();
                tokio::spawn(async move {
                    secrets
                        .put("team-a", "pw", format!("v{n}").as_bytes())
                        .await
                        .unwrap()
                        .version
                })
            })
            .collect();
        let mut versions = Vec::new();
        for task in racing {
            versions.push(task.await.unwrap());
        }
        versions.sort_unstable();
        assert_eq!(
            versions,
            (2..=9).collect::<Vec<u64>>(),
            "each version given once"
        );
        let (version, value) = secrets.open("team-a", "pw").unwrap();
        assert_eq!(version, 9);
        assert!(value.starts_with(b"v"));
        assert!(matches!(
            secrets.open("team-b", "pw"),
            Err(SecretError::NotFound { .. })
        ));
        let listed = secrets.list(|project| project == "team-a").unwrap();
        assert_eq!(listed.len(), 1);
        let keyless = Secrets::new(
            Arc::new(cube_store::MemoryStore::new()),
            Err("no key here".to_string()),
        );
        assert!(matches!(
            keyless.put("team-a", "pw", b"x").await,
            Err(SecretError::NoKey(_))
        ));
    }

    #[test]
    fn a_key_file_is_made_once_with_mode_0600_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEY_FILE);
        let made = key_from_file(&path, true).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let again = key_from_file(&path, true).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            text,
            "not made twice"
        );
        let sealed = made.seal(b"x", b"b").unwrap();
        assert_eq!(again.open(&sealed, b"b").as_deref(), Some(&b"x"[..]));
        std::fs::write(&path, "short").unwrap();
        assert!(
            key_from_file(&path, false)
                .unwrap_err()
                .contains("64 hex digits")
        );
    }
}
