//! The projects' secrets and registry logins (`cube secret`, `cube registry login`): kept
//! sealed with the cluster's secrets key (`sealing.rs`, AES-256-GCM, each value bound to its
//! project, name and version), listed by name and version only, and opened for one reader
//! alone: the worker a task naming them is placed on, when it starts the task's run
//! (`GET /nodes/{name}/secrets?task=ID`). No answer, event, log line or error of the manager
//! holds a value.
//!
//! **The key.** A manager on its own store keeps it in its data directory (`secrets.key`, 32
//! random bytes in hex, mode 0600, made at its first start); managers sharing etcd are each
//! given the same file (`--secrets-key-file`), so etcd holds only sealed values. A manager on
//! etcd given none refuses to keep or open secrets, saying so.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use base64::Engine;
use bytes::Bytes;
use cube_api::server::{ApiError, JsonPath};
use cube_store::{Store, StoreError};
use cube_types::secret::{
    MAX_SECRET_BYTES, NewSecret, RegistryAuth, RegistryLogin, RunSecrets, SecretInfo, SecretRecord,
    SecretValue, name_problem, registry_host_problem, registry_of_image, registry_secret_name,
};
use serde::Deserialize;
use uuid::Uuid;

use crate::Manager;
use crate::projects::Scope;
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
        let now = chrono::Utc::now();
        let stored_key = record_key(project, name);
        let previous = self.table.get(&stored_key)?;
        let info = SecretInfo {
            name: name.to_string(),
            project: project.to_string(),
            version: previous
                .as_ref()
                .map_or(1, |record| record.info.version + 1),
            created_time: previous
                .as_ref()
                .and_then(|record| record.info.created_time)
                .or(Some(now)),
            updated_time: Some(now),
        };
        let sealed = key.seal(value, &binding(project, name, info.version))?;
        let record = SecretRecord {
            info: info.clone(),
            sealed: crate::acl::hex(&sealed),
        };
        self.table
            .put_queued(&stored_key, &record)?
            .durable()
            .await?;
        Ok(info)
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
        for secret in &task.spec.secrets {
            let (version, value) = self.open(project, &secret.name)?;
            run.secrets.push(SecretValue {
                name: secret.name.clone(),
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

/// `GET /secrets`: the secrets of the projects the request lists (names, versions, times).
pub async fn list_secrets(
    State(manager): State<Arc<Manager>>,
    scope: axum::Extension<Scope>,
) -> Result<Json<Vec<SecretInfo>>, ApiError> {
    Ok(Json(
        manager
            .config
            .secrets
            .list(|project| scope.lists(project))?,
    ))
}

/// `POST /secrets` with `{"Name": "db-password", "Value": "<base64>"}` (and `Project`, or
/// `?project=`): a secret's first value, or its next version.
pub async fn create_secret(
    State(manager): State<Arc<Manager>>,
    scope: axum::Extension<Scope>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<(StatusCode, Json<SecretInfo>), ApiError> {
    let mut request: NewSecret = cube_types::event::decode(&body?)
        .map_err(|err| ApiError::bad_request(format!("the secret: {err}")))?;
    scope.settle(&mut request.project)?;
    if !manager.project_exists(&request.project) {
        return Err(crate::ManagerError::ProjectNotFound(request.project).into());
    }
    if let Some(problem) = name_problem("secret", &request.name) {
        return Err(ApiError::bad_request(format!("Name: {problem}")));
    }
    let value = base64::engine::general_purpose::STANDARD
        .decode(request.value.trim())
        .map_err(|_| ApiError::bad_request("Value: not base64 (the value is sent in base64)"))?;
    if value.len() > MAX_SECRET_BYTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "Value: {} bytes is more than a secret may hold ({MAX_SECRET_BYTES} bytes)",
                value.len()
            ),
        ));
    }
    let info = manager
        .config
        .secrets
        .put(&request.project, &request.name, &value)
        .await?;
    tracing::info!(
        project = %info.project,
        secret = %info.name,
        version = info.version,
        "secret kept"
    );
    Ok((StatusCode::CREATED, Json(info)))
}

/// `DELETE /secrets/{name}` (in `?project=`): refused while a task that has not ended uses
/// it.
pub async fn remove_secret(
    State(manager): State<Arc<Manager>>,
    scope: axum::Extension<Scope>,
    JsonPath(name): JsonPath<String>,
) -> Result<StatusCode, ApiError> {
    let project = scope.target()?.to_string();
    if !scope.reaches(&project) {
        return Err(SecretError::NotFound { project, name }.into());
    }
    if let Some(user) = manager.task_using_secret(&project, &name) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "secret {name:?} is in use by task {user} (stop it first; a job's copies: cube \
                 job stop)"
            ),
        ));
    }
    if !manager.config.secrets.remove(&project, &name).await? {
        return Err(SecretError::NotFound { project, name }.into());
    }
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunQuery {
    task: Uuid,
}

/// `GET /nodes/{name}/secrets?task=ID`: the values a run of the task needs, to the node it is
/// placed on only (a node token of that node with `--acl`; its certificate with `--tls`).
pub async fn secrets_for_run(
    State(manager): State<Arc<Manager>>,
    JsonPath(node): JsonPath<String>,
    query: Result<axum::extract::Query<RunQuery>, axum::extract::rejection::QueryRejection>,
    claim: Option<axum::Extension<crate::acl::NodeClaim>>,
) -> Result<Json<RunSecrets>, ApiError> {
    let axum::extract::Query(RunQuery { task: id }) =
        query.map_err(|err| ApiError::bad_request(format!("?task=ID: {}", err.body_text())))?;
    let task = manager.task(id)?;
    if task.status.node_name.as_str() != node || task.status.state.is_terminal() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("task {id} does not run on node {node:?}: its secrets are not given there"),
        ));
    }
    crate::acl::make_claim(claim.as_ref()).await?;
    let run = manager.config.secrets.for_run(&task)?;
    tracing::info!(
        task = %id,
        node,
        secrets = run.secrets.len(),
        registry_login = run.registry.is_some(),
        "secrets given for a run"
    );
    Ok(Json(run))
}

/// `POST /registries` with `{"Host": "registry.example.com", "Username": "u", "Password":
/// "p"}` (and `Project`): checks the login against the registry when it answers, then keeps
/// it as the project's secret `registry:HOST`.
pub async fn registry_login(
    State(manager): State<Arc<Manager>>,
    scope: axum::Extension<Scope>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    let mut login: RegistryLogin = cube_types::event::decode(&body?)
        .map_err(|err| ApiError::bad_request(format!("the login: {err}")))?;
    scope.settle(&mut login.project)?;
    if !manager.project_exists(&login.project) {
        return Err(crate::ManagerError::ProjectNotFound(login.project).into());
    }
    if let Some(problem) = registry_host_problem(&login.host) {
        return Err(ApiError::bad_request(format!("Host: {problem}")));
    }
    if login.username.is_empty() || login.password.is_empty() {
        return Err(ApiError::bad_request(
            "Username and Password: both are needed",
        ));
    }
    let verified = crate::registry_check::check(&login.host, &login.username, &login.password)
        .await
        .map_err(|refusal| ApiError::bad_request(refusal))?;
    let auth = RegistryAuth {
        host: login.host.clone(),
        username: login.username.clone(),
        password: login.password.clone(),
    };
    let value = serde_json::to_vec(&auth)
        .map_err(|err| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()))?;
    let info = manager
        .config
        .secrets
        .put(&login.project, &registry_secret_name(&login.host), &value)
        .await?;
    tracing::info!(project = %info.project, host = %login.host, verified = verified.is_none(), "registry login kept");
    Ok((
        StatusCode::CREATED,
        Json(serde_json::json!({
            "Host": login.host,
            "Project": info.project,
            "Username": login.username,
            "Secret": info.name,
            "Version": info.version,
            "Verified": verified.is_none(),
            "Note": verified,
        })),
    ))
}

impl Manager {
    /// A task that has not ended and uses secret `name` of `project`, if any.
    pub fn task_using_secret(&self, project: &str, name: &str) -> Option<Uuid> {
        let state = crate::cluster::lock(&self.cluster.state);
        state
            .cache
            .tasks()
            .find(|task| {
                task.spec.project == project
                    && !task.status.state.is_terminal()
                    && task.spec.secrets.iter().any(|secret| secret.name == name)
            })
            .map(|task| task.id)
    }
}
