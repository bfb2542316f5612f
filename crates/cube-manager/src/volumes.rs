//! Named volumes (`cube volume ls|rm`): made on a node by its worker when a task mounts one,
//! kept when the task ends, reported with every beat (`Node.Volumes`), listed here from those
//! reports with the tasks of the manager that use them, and removed through their node's
//! worker — refused while a task that has not ended uses the volume. A job's copy has a
//! volume of its own (`cube_types::secret::volume_of_copy`) and is placed back on the node
//! that holds it (`placement.rs`).

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use cube_api::server::{ApiError, JsonPath};
use cube_types::secret::{VolumeInfo, volumes_of};
use serde::Deserialize;

use crate::Manager;
use crate::cluster::lock;
use crate::projects::Scope;

impl Manager {
    /// Every named volume the nodes reported that `keep` lets through (by project), with the
    /// tasks on its node that use it and have not ended.
    pub fn volumes(&self, keep: impl Fn(&str) -> bool) -> Vec<VolumeInfo> {
        let state = lock(&self.cluster.state);
        let mut listed: Vec<VolumeInfo> = state
            .nodes
            .entries()
            .flat_map(|entry| {
                entry
                    .volumes
                    .iter()
                    .filter(|v| keep(&v.project))
                    .map(|volume| {
                        let mut volume = volume.clone();
                        volume.node = entry.name.clone();
                        volume
                    })
            })
            .collect();
        if listed.is_empty() {
            return listed;
        }
        // One pass over the tasks: who uses which volume on which node.
        let mut users: HashMap<(&str, &str, String), Vec<String>> = HashMap::new();
        for task in state.cache.tasks() {
            if task.status.state.is_terminal() || !keep(&task.spec.project) {
                continue;
            }
            for name in volumes_of(task) {
                users
                    .entry((
                        task.status.node_name.as_str(),
                        task.spec.project.as_str(),
                        name,
                    ))
                    .or_default()
                    .push(task.id.to_string());
            }
        }
        for volume in &mut listed {
            let key = (
                volume.node.as_str(),
                volume.project.as_str(),
                volume.name.clone(),
            );
            volume.used_by = users.remove(&key).unwrap_or_default();
        }
        listed.sort_by(|a, b| (&a.project, &a.name, &a.node).cmp(&(&b.project, &b.name, &b.node)));
        listed
    }
}

impl Manager {
    /// The tasks of `project` that have not ended and mount volume `name` (on `node`, when
    /// one is named; a task not placed yet counts wherever), as `ID on node N`.
    fn volume_users(&self, project: &str, name: &str, node: Option<&str>) -> Vec<String> {
        let state = lock(&self.cluster.state);
        state
            .cache
            .tasks()
            .filter(|task| !task.status.state.is_terminal() && task.spec.project == project)
            .filter(|task| {
                let placed = task.status.node_name.as_str();
                node.is_none_or(|node| placed.is_empty() || placed == node)
            })
            .filter(|task| volumes_of(task).any(|used| used == name))
            .map(|task| match task.status.node_name.as_str() {
                "" => format!("{} (not placed yet)", task.id),
                placed => format!("{} on node {placed}", task.id),
            })
            .collect()
    }
}

/// `GET /volumes`.
pub async fn list_volumes(
    State(manager): State<Arc<Manager>>,
    scope: axum::Extension<Scope>,
) -> Json<Vec<VolumeInfo>> {
    Json(manager.volumes(|project| scope.lists(project)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveQuery {
    #[serde(default)]
    node: Option<String>,
}

/// `DELETE /volumes/{name}?node=N` (in `?project=`): removes the volume from its node (`node`
/// may be left out when one node holds it); 409 while a task uses it.
pub async fn remove_volume(
    State(manager): State<Arc<Manager>>,
    scope: axum::Extension<Scope>,
    JsonPath(name): JsonPath<String>,
    query: Result<axum::extract::Query<RemoveQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<StatusCode, ApiError> {
    let axum::extract::Query(query) =
        query.map_err(|err| ApiError::bad_request(format!("?node=NAME: {}", err.body_text())))?;
    let project = scope.target()?.to_string();
    // In use is read from the tasks themselves, not only from what the nodes reported: a
    // copy that has just started uses its volume before its node's next beat lists it.
    let users = manager.volume_users(&project, &name, query.node.as_deref());
    if !users.is_empty() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "volume {name:?} is in use by task {} (stop it first)",
                users.join(", ")
            ),
        ));
    }
    let found: Vec<VolumeInfo> = manager
        .volumes(|p| p == project && scope.reaches(p))
        .into_iter()
        .filter(|volume| volume.name == name)
        .filter(|volume| query.node.as_ref().is_none_or(|node| *node == volume.node))
        .collect();
    let volume = match found.as_slice() {
        [] => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "no volume {name:?} in project {project:?}{} (cube volume ls)",
                    query
                        .node
                        .as_ref()
                        .map(|node| format!(" on node {node:?}"))
                        .unwrap_or_default()
                ),
            ));
        }
        [one] => one.clone(),
        several => {
            let nodes: Vec<&str> = several.iter().map(|v| v.node.as_str()).collect();
            return Err(ApiError::bad_request(format!(
                "volume {name:?} is on nodes {}: name one (--node NAME)",
                nodes.join(", ")
            )));
        }
    };
    let client = {
        let state = lock(&manager.cluster.state);
        state
            .nodes
            .get(&volume.node)
            .map(|entry| entry.client.clone())
    };
    let Some(client) = client else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("node {:?} is no longer known", volume.node),
        ));
    };
    client
        .delete(&format!("/volumes/{}", volume.docker_name))
        .await
        .map_err(|err| {
            let status = err
                .status()
                .and_then(|status| StatusCode::from_u16(status.as_u16()).ok())
                .filter(|status| status.is_client_error())
                .unwrap_or(StatusCode::BAD_GATEWAY);
            ApiError::new(
                status,
                format!(
                    "node {} could not remove volume {name:?}: {}",
                    volume.node,
                    err.cause()
                ),
            )
        })?;
    lock(&manager.cluster.state)
        .nodes
        .forget_volume(&volume.node, &volume.docker_name);
    tracing::info!(volume = %name, node = %volume.node, project = %project, "volume removed");
    Ok(StatusCode::NO_CONTENT)
}
