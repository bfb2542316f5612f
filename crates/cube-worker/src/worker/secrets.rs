//! What a run gets besides its spec: its project's secrets and registry login, fetched from
//! the manager for this run alone, and its named volumes.
//!
//! **Secrets never touch this node's disk.** The values come over the worker's authenticated
//! connection to its manager (`GET /nodes/{name}/secrets?task=ID`), are written to a
//! directory of this run on tmpfs (`/dev/shm/cube-secrets`, checked to be tmpfs), bound
//! read-only to `/run/secrets/NAME` in the container, and unlinked as soon as the container
//! started (the container's mount holds the file; no path to it is left on the host). The
//! worker's task store keeps the secrets' names only. A secret asked for as an environment
//! variable is in the container's configuration, as any variable (`docker inspect` shows it).
//!
//! **Named volumes** are made by the engine, labelled with their node, project and Cube name,
//! and kept when the task ends; each beat reports them (`Worker::volumes`), so the manager can
//! list them and place a job's copy back where its volume is.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine;
use cube_api::{ApiClient, ClientError};
use cube_runtime::Runtime;
use cube_types::Task;
use cube_types::secret::{
    LABEL_VOLUME, LABEL_VOLUME_NODE, LABEL_VOLUME_PROJECT, RunSecrets, SECRETS_DIR_IN_CONTAINER,
    VolumeInfo, docker_volume_name, registry_of_image, volume_of_copy, volumes_of,
};

use super::{Worker, WorkerError};
use crate::plugin::LaunchPlan;

/// Where a run's secret files are written: on tmpfs, never on disk.
const SECRETS_ROOT: &str = "/dev/shm/cube-secrets";

/// tmpfs's magic number in `statfs`.
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// The secret files of one run, removed from the host when dropped (once the container has
/// started, its mounts keep them).
pub(crate) struct SecretFiles {
    dir: PathBuf,
}

impl Drop for SecretFiles {
    fn drop(&mut self) {
        if let Err(err) = std::fs::remove_dir_all(&self.dir)
            && err.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %self.dir.display(), error = %err, "cannot remove a run's secret files");
        }
    }
}

/// How a container reads a secret.
enum Use {
    /// The file `/run/secrets/NAME`.
    File(String),
    /// The variable `NAME`.
    Var(String),
}

/// Whether `path` is on tmpfs.
fn on_tmpfs(path: &Path) -> bool {
    rustix::fs::statfs(path).is_ok_and(|stat| stat.f_type == TMPFS_MAGIC)
}

/// Whether the run of `task` needs anything from the manager: secrets, or perhaps a login to
/// the registry its image is on.
pub(crate) fn needs_manager(task: &Task) -> bool {
    !task.secret_names().is_empty()
        || (task.spec.pod.is_none() && registry_of_image(&task.spec.image).is_some())
}

impl<R: Runtime> Worker<R> {
    /// The managers to fetch a run's secrets from (the heartbeat's).
    pub fn set_managers(&self, managers: Vec<ApiClient>) {
        *self
            .managers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = managers;
    }

    /// What the manager gives this node for the run of `task`, asked of each manager in turn
    /// while one cannot be reached.
    pub(crate) async fn run_secrets(&self, task: &Task) -> Result<RunSecrets, String> {
        let managers = self
            .managers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        if managers.is_empty() {
            if task.secret_names().is_empty() {
                // An image on a registry, and no manager to ask for a login: pulled without.
                return Ok(RunSecrets::default());
            }
            return Err(
                "the task uses secrets, and this worker reports to no manager to fetch them \
                 from (start it with --manager or --join)"
                    .to_string(),
            );
        }
        let path = format!("/nodes/{}/secrets?task={}", self.config.name, task.id);
        let mut last = String::new();
        for manager in &managers {
            match manager.get::<RunSecrets>(&path).await {
                Ok(run) => return Ok(run),
                Err(err) => {
                    last = err.to_string();
                    let again = matches!(err, ClientError::Unreachable { .. })
                        || err.status().map(|status| status.as_u16()) == Some(503);
                    if !again {
                        break;
                    }
                }
            }
        }
        Err(format!(
            "cannot fetch the task's secrets from the manager: {last}"
        ))
    }

    /// Writes the run's secret files on tmpfs and binds them (or sets the variables asked
    /// for) in the containers that read them: a single container's `Secrets`, or each pod
    /// service's `secrets:`.
    pub(crate) fn place_secrets(
        &self,
        task: &Task,
        run: &RunSecrets,
        plan: &mut LaunchPlan,
    ) -> Result<Option<SecretFiles>, String> {
        // (container's name in the plan, secret, file name in /run/secrets or variable)
        let mut wanted: Vec<(String, String, Use)> = Vec::new();
        match &task.spec.pod {
            Some(pod) => {
                for service in &pod.spec.services {
                    for secret in &service.secrets {
                        wanted.push((
                            service.name.clone(),
                            secret.source.clone(),
                            Use::File(secret.target.clone()),
                        ));
                    }
                }
            }
            None => {
                for secret in &task.spec.secrets {
                    let how = match &secret.env {
                        Some(var) => Use::Var(var.clone()),
                        None => Use::File(secret.name.clone()),
                    };
                    wanted.push((task.name.clone(), secret.name.clone(), how));
                }
            }
        }
        if wanted.is_empty() {
            return Ok(None);
        }
        let value_of = |name: &str| -> Result<Vec<u8>, String> {
            let given = run
                .secrets
                .iter()
                .find(|secret| secret.name == name)
                .ok_or_else(|| format!("the manager gave no value for secret {name:?}"))?;
            base64::engine::general_purpose::STANDARD
                .decode(&given.value)
                .map_err(|_| format!("the manager's value of secret {name:?} is not base64"))
        };
        let root = Path::new(SECRETS_ROOT);
        let run_dir = root.join(format!("{}-r{}", task.id.simple(), plan.run));
        let mut files = None;
        for (container_name, source, how) in wanted {
            let Some(container) = plan
                .containers
                .iter_mut()
                .find(|c| !c.infra && c.name == container_name)
            else {
                continue;
            };
            let value = value_of(&source)?;
            let target = match how {
                Use::Var(var) => {
                    let text = String::from_utf8(value).map_err(|_| {
                        format!(
                            "secret {source:?} is not UTF-8 text, so it cannot be the variable \
                             {var}; use it as a file"
                        )
                    })?;
                    container.spec.env.push(format!("{var}={text}"));
                    continue;
                }
                Use::File(target) => target,
            };
            if files.is_none() {
                std::fs::create_dir_all(root)
                    .map_err(|err| format!("cannot make {SECRETS_ROOT}: {err}"))?;
                if !on_tmpfs(root) {
                    return Err(format!(
                        "{SECRETS_ROOT} is not on tmpfs: secrets are never written to this \
                         node's disk, so the task cannot start here"
                    ));
                }
                let _ = std::fs::remove_dir_all(&run_dir);
                std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
                    .create(&run_dir)
                    .map_err(|err| format!("cannot make {}: {err}", run_dir.display()))?;
                files = Some(SecretFiles {
                    dir: run_dir.clone(),
                });
            }
            let dir = run_dir.join(&container_name);
            std::fs::create_dir_all(&dir)
                .map_err(|err| format!("cannot make {}: {err}", dir.display()))?;
            let path = dir.join(&target);
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create_new(true);
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o444);
            options
                .open(&path)
                .and_then(|mut file| file.write_all(&value))
                .map_err(|err| format!("cannot write secret {source:?}: {err}"))?;
            container.spec.binds.push(format!(
                "{}:{SECRETS_DIR_IN_CONTAINER}/{target}:ro",
                path.display()
            ));
        }
        Ok(files)
    }

    /// Makes the task's named volumes and binds them (and its bind mounts) in its container.
    pub(crate) async fn prepare_volumes(
        &self,
        task: &Task,
        plan: &mut LaunchPlan,
    ) -> Result<(), String> {
        if task.spec.volumes.is_empty() {
            return Ok(());
        }
        let mut binds = Vec::new();
        for mount in &task.spec.volumes {
            let mode = if mount.read_only { ":ro" } else { "" };
            if mount.is_bind() {
                binds.push(format!("{}:{}{mode}", mount.source, mount.target));
                continue;
            }
            let name = volume_of_copy(
                &mount.source,
                &task.spec.job,
                &task.spec.group,
                task.spec.index,
            );
            let docker_name = docker_volume_name(&self.config.name, &task.spec.project, &name);
            let labels = HashMap::from([
                (LABEL_VOLUME.to_string(), name.clone()),
                (LABEL_VOLUME_PROJECT.to_string(), task.spec.project.clone()),
                (LABEL_VOLUME_NODE.to_string(), self.config.name.clone()),
            ]);
            self.runtime
                .ensure_volume(&docker_name, &labels)
                .await
                .map_err(|err| format!("cannot make volume {name:?}: {err}"))?;
            binds.push(format!("{docker_name}:{}{mode}", mount.target));
        }
        if let Some(container) = plan.containers.iter_mut().find(|c| !c.infra) {
            container.spec.binds.extend(binds);
        }
        Ok(())
    }

    /// The named volumes Cube made on this node, as the engine lists them (what a beat
    /// reports: no task is read).
    pub async fn engine_volumes(&self) -> Result<Vec<VolumeInfo>, WorkerError> {
        let listed = self
            .runtime
            .list_volumes(&self.config.name)
            .await
            .map_err(|err| WorkerError::Runtime(err.to_string()))?;
        let mut volumes: Vec<VolumeInfo> = listed
            .into_iter()
            .filter_map(|(docker_name, labels)| {
                Some(VolumeInfo {
                    name: labels.get(LABEL_VOLUME)?.clone(),
                    project: labels.get(LABEL_VOLUME_PROJECT)?.clone(),
                    node: self.config.name.clone(),
                    docker_name,
                    used_by: Vec::new(),
                })
            })
            .collect();
        volumes.sort_by(|a, b| (&a.project, &a.name).cmp(&(&b.project, &b.name)));
        Ok(volumes)
    }

    /// [`Worker::engine_volumes`], each with the tasks that use it and have not ended.
    pub async fn volumes(&self) -> Result<Vec<VolumeInfo>, WorkerError> {
        let mut volumes = self.engine_volumes().await?;
        let tasks = self.list_tasks()?;
        for volume in &mut volumes {
            volume.used_by = users(&tasks, &self.config.name, &volume.docker_name);
        }
        Ok(volumes)
    }

    /// Removes the named volume `docker_name` of this node: refused while a task that has not
    /// ended uses it.
    pub async fn remove_named_volume(&self, docker_name: &str) -> Result<(), WorkerError> {
        let volumes = self.engine_volumes().await?;
        let Some(volume) = volumes.iter().find(|v| v.docker_name == docker_name) else {
            return Err(WorkerError::BadRequest(format!(
                "no volume {docker_name:?} made by Cube on node {}",
                self.config.name
            )));
        };
        let tasks = self.list_tasks()?;
        let used_by = users(&tasks, &self.config.name, docker_name);
        if !used_by.is_empty() {
            return Err(WorkerError::WrongState(format!(
                "volume {:?} is in use by task {} (stop it first)",
                volume.name,
                used_by.join(", ")
            )));
        }
        // The containers of ended tasks that mounted it (kept for their logs) go with it: the
        // engine removes no volume a container still names.
        for task in tasks.iter().filter(|task| {
            task.status.state.is_terminal() && mounts(task, &self.config.name, docker_name)
        }) {
            for container in Self::current_containers(task) {
                self.runtime
                    .remove(&container)
                    .await
                    .map_err(|err| WorkerError::Runtime(err.to_string()))?;
            }
        }
        self.runtime
            .remove_volume(docker_name)
            .await
            .map_err(|err| WorkerError::Runtime(err.to_string()))
    }
}

/// The tasks (by ID) on `node` that mount `docker_name` and have not ended.
fn users(tasks: &[Task], node: &str, docker_name: &str) -> Vec<String> {
    tasks
        .iter()
        .filter(|task| !task.status.state.is_terminal() && mounts(task, node, docker_name))
        .map(|task| task.id.to_string())
        .collect()
}

/// Whether `task` on `node` mounts the named volume `docker_name`.
fn mounts(task: &Task, node: &str, docker_name: &str) -> bool {
    volumes_of(task).any(|name| docker_volume_name(node, &task.spec.project, &name) == docker_name)
}
