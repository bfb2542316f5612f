//! The routes of the projects' secrets and registry logins (`secrets.rs` keeps them):
//! `GET|POST /secrets`, `DELETE /secrets/{name}`, `GET /nodes/{name}/secrets?task=ID` (the
//! values, to the node the task runs on only) and `POST /registries`.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use base64::Engine;
use bytes::Bytes;
use cube_api::server::{ApiError, JsonPath};
use cube_types::secret::{
    MAX_SECRET_BYTES, NewSecret, RegistryAuth, RegistryLogin, RunSecrets, SecretInfo, name_problem,
    registry_host_problem, registry_secret_name,
};
use serde::Deserialize;
use uuid::Uuid;

use crate::Manager;
use crate::projects::Scope;
use crate::secrets::SecretError;

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
        .map_err(ApiError::bad_request)?;
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
                    && task.secret_names().contains(&name)
            })
            .map(|task| task.id)
    }
}
