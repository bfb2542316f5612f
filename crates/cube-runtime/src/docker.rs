//! [`Runtime`] on the Docker engine, through bollard.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::errors::Error as BollardError;
use bollard::exec::{CreateExecOptions, ResizeExecOptions, StartExecOptions, StartExecResults};
use bollard::models::{
    ContainerCreateBody, ContainerInspectResponse, ContainerSummary, ContainerSummaryStateEnum,
    HealthConfig, HealthStatusEnum, HostConfig, PortBinding,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, EventsOptionsBuilder,
    ListContainersOptionsBuilder, LogsOptionsBuilder, RemoveContainerOptionsBuilder,
    RemoveImageOptionsBuilder, RemoveVolumeOptionsBuilder, StopContainerOptionsBuilder,
};
use chrono::{DateTime, Datelike, Utc};
use cube_types::{Health, HostBinding};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use uuid::Uuid;

use crate::{
    ContainerInfo, ContainerSpec, EngineVersion, ExecSession, LABEL_NODE, LABEL_POD_CONTAINER,
    LABEL_TASK_ID, LogOptions, OutputChunk, OutputStream, Runtime, RuntimeError, RuntimeEvent,
};

/// How long a pull may take before the task is failed with a time-out.
const DEFAULT_PULL_TIMEOUT: Duration = Duration::from_secs(300);

/// The Docker engine on this machine (`DOCKER_HOST` or the local socket).
#[derive(Clone)]
pub struct DockerRuntime {
    docker: Docker,
    pull_timeout: Duration,
}

impl DockerRuntime {
    /// Connects and agrees on an API version with the engine (Debian's Docker speaks 1.41,
    /// older than bollard's default, so without this every call fails).
    pub async fn connect() -> Result<DockerRuntime, RuntimeError> {
        let docker = Docker::connect_with_local_defaults()
            .map_err(|err| RuntimeError::Unavailable(err.to_string()))?
            .negotiate_version()
            .await
            .map_err(|err| RuntimeError::Unavailable(err.to_string()))?;
        Ok(DockerRuntime {
            docker,
            pull_timeout: DEFAULT_PULL_TIMEOUT,
        })
    }

    pub fn with_pull_timeout(mut self, timeout: Duration) -> DockerRuntime {
        self.pull_timeout = timeout;
        self
    }

    pub(crate) fn client(&self) -> &Docker {
        &self.docker
    }

    async fn image_present(&self, image: &str) -> Result<bool, RuntimeError> {
        match self.docker.inspect_image(image).await {
            Ok(_) => Ok(true),
            Err(err) if status_of(&err) == Some(404) => Ok(false),
            Err(err) => Err(engine_error("image inspect", err)),
        }
    }

    async fn pull(
        &self,
        image: &str,
        auth: Option<&cube_types::secret::RegistryAuth>,
    ) -> Result<(), RuntimeError> {
        let options = CreateImageOptionsBuilder::new()
            .from_image(&with_default_tag(image))
            .build();
        let credentials = auth.map(|auth| bollard::auth::DockerCredentials {
            username: Some(auth.username.clone()),
            password: Some(auth.password.clone()),
            serveraddress: Some(auth.host.clone()),
            ..Default::default()
        });
        let mut progress = self.docker.create_image(Some(options), None, credentials);
        while let Some(step) = progress.next().await {
            step.map_err(|err| RuntimeError::Image {
                image: image.to_string(),
                message: message_of(&err),
            })?;
        }
        Ok(())
    }
}

impl Runtime for DockerRuntime {
    async fn ensure_image(&self, image: &str) -> Result<(), RuntimeError> {
        self.ensure_image_with(image, None).await
    }

    async fn ensure_image_with(
        &self,
        image: &str,
        auth: Option<&cube_types::secret::RegistryAuth>,
    ) -> Result<(), RuntimeError> {
        if self.image_present(image).await? {
            return Ok(());
        }
        if image == crate::sample_image::PAUSE_IMAGE {
            // A pod's infra image is never pulled: it is built here, from busybox-static.
            tracing::info!(image, "building the pods' infra image");
            return self.ensure_pause_image().await;
        }
        tracing::info!(image, "image not present locally, pulling it");
        match tokio::time::timeout(self.pull_timeout, self.pull(image, auth)).await {
            Ok(result) => result,
            Err(_) => Err(RuntimeError::Image {
                image: image.to_string(),
                message: format!(
                    "pull did not finish within {} s",
                    self.pull_timeout.as_secs()
                ),
            }),
        }
    }

    async fn create(&self, spec: &ContainerSpec) -> Result<String, RuntimeError> {
        let port_bindings: HashMap<String, Option<Vec<PortBinding>>> = spec
            .port_bindings
            .iter()
            .map(|(port, host)| (port.clone(), Some(vec![port_binding(host)])))
            .collect();
        let host_config = HostConfig {
            // docker-init as PID 1 forwards SIGTERM, so a stop takes ~100 ms instead of the
            // whole timeout for images whose process ignores SIGTERM (httpd, sleep).
            init: Some(true),
            nano_cpus: (spec.cpu_cores > 0.0).then(|| (spec.cpu_cores * 1e9).round() as i64),
            memory: (spec.memory_bytes > 0)
                .then(|| i64::try_from(spec.memory_bytes).unwrap_or(i64::MAX)),
            port_bindings: (!port_bindings.is_empty()).then_some(port_bindings),
            network_mode: spec.network_mode.clone(),
            binds: (!spec.binds.is_empty()).then(|| spec.binds.clone()),
            extra_hosts: (!spec.extra_hosts.is_empty()).then(|| spec.extra_hosts.clone()),
            // No process in any container Cube creates (the infra container's included) may
            // gain privileges it did not start with (setuid binaries, file capabilities).
            security_opt: Some(vec!["no-new-privileges".to_string()]),
            // Docker's restart policy stays unset: Cube restarts tasks itself.
            ..Default::default()
        };
        let nanos = |duration: Option<Duration>| {
            duration.map(|duration| i64::try_from(duration.as_nanos()).unwrap_or(i64::MAX))
        };
        let healthcheck = spec.healthcheck.as_ref().map(|check| HealthConfig {
            test: Some(check.test.clone()),
            interval: nanos(check.interval),
            timeout: nanos(check.timeout),
            retries: check.retries.map(i64::from),
            start_period: nanos(check.start_period),
            start_interval: None,
        });
        let body = ContainerCreateBody {
            image: Some(spec.image.clone()),
            cmd: (!spec.cmd.is_empty()).then(|| spec.cmd.clone()),
            entrypoint: spec.entrypoint.clone(),
            healthcheck,
            env: (!spec.env.is_empty()).then(|| spec.env.clone()),
            exposed_ports: (!spec.exposed_ports.is_empty())
                .then(|| spec.exposed_ports.iter().cloned().collect()),
            labels: Some(spec.labels.clone()),
            user: spec.user.clone(),
            working_dir: spec.working_dir.clone(),
            host_config: Some(host_config),
            ..Default::default()
        };
        let options = CreateContainerOptionsBuilder::new()
            .name(&spec.name)
            .build();
        let created = self
            .docker
            .create_container(Some(options), body)
            .await
            .map_err(|err| match status_of(&err) {
                // On create, 404 means the image is missing (the container does not exist yet).
                Some(404) => RuntimeError::Image {
                    image: spec.image.clone(),
                    message: "no such image locally".to_string(),
                },
                Some(409) => RuntimeError::Conflict(spec.name.clone()),
                _ => engine_error("create", err),
            })?;
        Ok(created.id)
    }

    async fn start(&self, container_id: &str) -> Result<(), RuntimeError> {
        self.docker
            .start_container(container_id, None)
            .await
            .map_err(|err| engine_error("start", err))
    }

    async fn stop(&self, container_id: &str, timeout: Duration) -> Result<(), RuntimeError> {
        let seconds = i32::try_from(timeout.as_secs()).unwrap_or(i32::MAX);
        let options = StopContainerOptionsBuilder::new().t(seconds).build();
        match self
            .docker
            .stop_container(container_id, Some(options))
            .await
        {
            // 304: already stopped; 404: already gone. Both are what was asked for.
            Ok(()) => Ok(()),
            Err(err) if matches!(status_of(&err), Some(304 | 404)) => Ok(()),
            Err(err) => Err(engine_error("stop", err)),
        }
    }

    async fn remove(&self, container_id: &str) -> Result<(), RuntimeError> {
        let options = RemoveContainerOptionsBuilder::new()
            .force(true)
            .v(true)
            .build();
        match self
            .docker
            .remove_container(container_id, Some(options))
            .await
        {
            Ok(()) => Ok(()),
            Err(err) if status_of(&err) == Some(404) => Ok(()),
            // 409: removal already in progress; it will be gone shortly, as asked.
            Err(err)
                if status_of(&err) == Some(409)
                    && message_of(&err).contains("already in progress") =>
            {
                Ok(())
            }
            Err(err) => Err(engine_error("remove", err)),
        }
    }

    async fn inspect(&self, container_id: &str) -> Result<Option<ContainerInfo>, RuntimeError> {
        match self.docker.inspect_container(container_id, None).await {
            Ok(response) => Ok(Some(info_from(response))),
            Err(err) if status_of(&err) == Some(404) => Ok(None),
            Err(err) => Err(engine_error("inspect", err)),
        }
    }

    async fn list_managed(&self, node: &str) -> Result<Vec<ContainerInfo>, RuntimeError> {
        let filters = HashMap::from([("label", vec![format!("{LABEL_NODE}={node}")])]);
        let options = ListContainersOptionsBuilder::new()
            .all(true)
            .filters(&filters)
            .build();
        let summaries = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(|err| engine_error("list", err))?;
        // One call for the whole node: what the list says is enough to tell containers
        // apart by task, run and pod; whoever needs more inspects the few it cares about.
        Ok(summaries
            .into_iter()
            .filter_map(info_from_summary)
            .collect())
    }

    fn events_since(
        &self,
        node: &str,
        since_unix_secs: i64,
    ) -> BoxStream<'static, Result<RuntimeEvent, RuntimeError>> {
        let filters = HashMap::from([
            ("type", vec!["container".to_string()]),
            ("label", vec![format!("{LABEL_NODE}={node}")]),
            (
                "event",
                vec![
                    "die".to_string(),
                    "destroy".to_string(),
                    "health_status".to_string(),
                ],
            ),
        ]);
        let options = EventsOptionsBuilder::new()
            .since(&since_unix_secs.to_string())
            .filters(&filters)
            .build();
        self.docker
            .events(Some(options))
            .filter_map(|message| async move {
                let message = match message {
                    Ok(message) => message,
                    Err(err) => return Some(Err(RuntimeError::Unavailable(message_of(&err)))),
                };
                let actor = message.actor?;
                let container_id = actor.id?;
                let task_id = actor
                    .attributes
                    .as_ref()
                    .and_then(|attributes| attributes.get(LABEL_TASK_ID))
                    .and_then(|id| Uuid::parse_str(id).ok());
                match message.action.as_deref() {
                    Some("die") => Some(Ok(RuntimeEvent::Died {
                        container_id,
                        task_id,
                    })),
                    Some("destroy") => Some(Ok(RuntimeEvent::Destroyed {
                        container_id,
                        task_id,
                    })),
                    Some(action) if action.starts_with("health_status") => {
                        Some(Ok(RuntimeEvent::HealthChanged {
                            container_id,
                            task_id,
                        }))
                    }
                    _ => None,
                }
            })
            .boxed()
    }

    fn logs(
        &self,
        container_id: &str,
        options: &LogOptions,
    ) -> BoxStream<'static, Result<OutputChunk, RuntimeError>> {
        self.read_logs(container_id, options)
    }

    async fn exec(
        &self,
        container_id: &str,
        cmd: &[String],
        tty: bool,
        stdin: bool,
    ) -> Result<ExecSession, RuntimeError> {
        let created = self
            .docker
            .create_exec(
                container_id,
                CreateExecOptions {
                    attach_stdin: Some(stdin),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    tty: Some(tty),
                    cmd: Some(cmd.to_vec()),
                    ..Default::default()
                },
            )
            .await
            .map_err(exec_error)?;
        let started = self
            .docker
            .start_exec(
                &created.id,
                Some(StartExecOptions {
                    detach: false,
                    tty,
                    output_capacity: None,
                }),
            )
            .await
            .map_err(exec_error)?;
        match started {
            StartExecResults::Attached { output, input } => Ok(ExecSession {
                exec_id: created.id,
                output: output
                    .filter_map(|output| async move { DockerRuntime::chunk(output) })
                    .boxed(),
                input,
            }),
            StartExecResults::Detached => Err(RuntimeError::Engine {
                action: "exec",
                message: "the engine started the command detached".to_string(),
            }),
        }
    }

    async fn exec_exit_code(&self, exec_id: &str) -> Result<Option<i64>, RuntimeError> {
        let inspected = self
            .docker
            .inspect_exec(exec_id)
            .await
            .map_err(|err| engine_error("exec inspect", err))?;
        if inspected.running == Some(true) {
            return Ok(None);
        }
        Ok(inspected.exit_code)
    }

    async fn resize_exec(
        &self,
        exec_id: &str,
        width: u16,
        height: u16,
    ) -> Result<(), RuntimeError> {
        self.docker
            .resize_exec(exec_id, ResizeExecOptions { height, width })
            .await
            .map_err(|err| engine_error("exec resize", err))
    }

    async fn ensure_volume(
        &self,
        name: &str,
        labels: &HashMap<String, String>,
    ) -> Result<(), RuntimeError> {
        let request = bollard::models::VolumeCreateRequest {
            name: Some(name.to_string()),
            labels: Some(labels.clone()),
            ..Default::default()
        };
        // Making one that exists answers it as it is.
        self.docker
            .create_volume(request)
            .await
            .map(|_| ())
            .map_err(|err| engine_error("volume create", err))
    }

    async fn list_volumes(
        &self,
        node: &str,
    ) -> Result<Vec<(String, HashMap<String, String>)>, RuntimeError> {
        let filters = HashMap::from([(
            "label".to_string(),
            vec![format!("{}={node}", cube_types::secret::LABEL_VOLUME_NODE)],
        )]);
        let options = bollard::query_parameters::ListVolumesOptionsBuilder::new()
            .filters(&filters)
            .build();
        let listed = self
            .docker
            .list_volumes(Some(options))
            .await
            .map_err(|err| engine_error("volume list", err))?;
        Ok(listed
            .volumes
            .unwrap_or_default()
            .into_iter()
            .map(|volume| (volume.name, volume.labels))
            .collect())
    }

    async fn remove_volume(&self, name: &str) -> Result<(), RuntimeError> {
        let options = RemoveVolumeOptionsBuilder::new().force(true).build();
        match self.docker.remove_volume(name, Some(options)).await {
            Ok(()) => Ok(()),
            Err(err) if status_of(&err) == Some(404) => Ok(()),
            Err(err) => Err(engine_error("volume remove", err)),
        }
    }

    async fn remove_image(&self, image: &str) -> Result<(), RuntimeError> {
        let options = RemoveImageOptionsBuilder::new().build();
        match self.docker.remove_image(image, Some(options), None).await {
            Ok(_) => Ok(()),
            // 404: gone; 409: another container still uses it, and keeps it.
            Err(err) if matches!(status_of(&err), Some(404 | 409)) => Ok(()),
            Err(err) => Err(engine_error("image remove", err)),
        }
    }

    async fn engine_version(&self) -> Result<EngineVersion, RuntimeError> {
        let version = self
            .docker
            .version()
            .await
            .map_err(|err| engine_error("version", err))?;
        Ok(EngineVersion {
            version: version.version.unwrap_or_default(),
            api_version: version.api_version.unwrap_or_default(),
        })
    }
}

impl DockerRuntime {
    /// What [`Runtime::logs`] and [`Runtime::exec`] hand out of the engine's output stream.
    fn chunk(output: Result<LogOutput, BollardError>) -> Option<Result<OutputChunk, RuntimeError>> {
        match output {
            Ok(LogOutput::StdOut { message } | LogOutput::Console { message }) => {
                Some(Ok(OutputChunk {
                    stream: OutputStream::Stdout,
                    data: message,
                }))
            }
            Ok(LogOutput::StdErr { message }) => Some(Ok(OutputChunk {
                stream: OutputStream::Stderr,
                data: message,
            })),
            Ok(LogOutput::StdIn { .. }) => None,
            Err(err) => Some(Err(engine_error("logs", err))),
        }
    }

    pub(crate) fn read_logs(
        &self,
        container_id: &str,
        options: &LogOptions,
    ) -> BoxStream<'static, Result<OutputChunk, RuntimeError>> {
        let tail = options
            .tail
            .map_or_else(|| "all".to_string(), |tail| tail.to_string());
        let mut builder = LogsOptionsBuilder::new()
            .follow(options.follow)
            .stdout(options.stdout)
            .stderr(options.stderr)
            .tail(&tail);
        if let Some(since) = options.since_unix_secs {
            builder = builder.since(i32::try_from(since).unwrap_or(i32::MAX));
        }
        self.docker
            .logs(container_id, Some(builder.build()))
            .filter_map(|output| async move { DockerRuntime::chunk(output) })
            .boxed()
    }
}

/// Docker's binding for the host side of a `PortBindings` entry: `"127.0.0.1:8080"` binds
/// port 8080 on that address only (`HostIp`), `"8080"` on every address, an empty port lets
/// Docker choose one. The task was validated before it got here; text that does not read
/// is handed to Docker as the port, as it was written, for Docker to refuse in its words.
fn port_binding(host: &str) -> PortBinding {
    match cube_types::task::parse_host_side(host) {
        Ok(side) => PortBinding {
            host_ip: side.ip.map(|ip| ip.to_string()),
            host_port: Some(side.port.map(|port| port.to_string()).unwrap_or_default()),
        },
        Err(_) => PortBinding {
            host_ip: None,
            host_port: Some(host.to_string()),
        },
    }
}

fn info_from(response: ContainerInspectResponse) -> ContainerInfo {
    let state = response.state.unwrap_or_default();
    let running = state.running.unwrap_or(false);
    let finished_at = state.finished_at.as_deref().and_then(engine_time);
    let labels = response
        .config
        .and_then(|config| config.labels)
        .unwrap_or_default();
    let host_ports = response
        .network_settings
        .and_then(|settings| settings.ports)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(port, bindings)| {
            let bindings: Vec<HostBinding> = bindings?
                .into_iter()
                .filter_map(|binding| {
                    Some(HostBinding {
                        host_ip: binding.host_ip.unwrap_or_default(),
                        host_port: binding.host_port?,
                    })
                })
                .collect();
            (!bindings.is_empty()).then_some((port, bindings))
        })
        .collect::<BTreeMap<_, _>>();
    let health = state
        .health
        .and_then(|health| health.status)
        .and_then(|status| match status {
            HealthStatusEnum::STARTING => Some(Health::Starting),
            HealthStatusEnum::HEALTHY => Some(Health::Healthy),
            HealthStatusEnum::UNHEALTHY => Some(Health::Unhealthy),
            HealthStatusEnum::EMPTY | HealthStatusEnum::NONE => None,
        });
    ContainerInfo {
        id: response.id.unwrap_or_default(),
        name: response
            .name
            .unwrap_or_default()
            .trim_start_matches('/')
            .to_string(),
        pod_container: labels.get(LABEL_POD_CONTAINER).cloned(),
        task_id: labels
            .get(LABEL_TASK_ID)
            .and_then(|id| Uuid::parse_str(id).ok()),
        node: labels.get(LABEL_NODE).cloned(),
        running,
        // The engine says 0 for a container that does not run.
        pid: state
            .pid
            .and_then(|pid| u32::try_from(pid).ok())
            .filter(|pid| *pid > 0),
        // A container that never ran has exit code 0 and no finish time: no exit yet.
        exit_code: if running || finished_at.is_none() {
            None
        } else {
            state.exit_code
        },
        oom_killed: state.oom_killed.unwrap_or(false),
        error: state.error.unwrap_or_default(),
        started_at: state.started_at.as_deref().and_then(engine_time),
        finished_at,
        host_ports,
        health,
    }
}

/// What the engine's list says of a container (see [`Runtime::list_managed`]).
fn info_from_summary(summary: ContainerSummary) -> Option<ContainerInfo> {
    let labels = summary.labels.unwrap_or_default();
    Some(ContainerInfo {
        id: summary.id?,
        name: summary
            .names
            .and_then(|names| names.into_iter().next())
            .unwrap_or_default()
            .trim_start_matches('/')
            .to_string(),
        pod_container: labels.get(LABEL_POD_CONTAINER).cloned(),
        task_id: labels
            .get(LABEL_TASK_ID)
            .and_then(|id| Uuid::parse_str(id).ok()),
        node: labels.get(LABEL_NODE).cloned(),
        running: summary.state == Some(ContainerSummaryStateEnum::RUNNING),
        pid: None,
        exit_code: None,
        oom_killed: false,
        error: String::new(),
        started_at: None,
        finished_at: None,
        host_ports: BTreeMap::new(),
        health: None,
    })
}

/// The engine writes Go's zero time for "never"; that reads as `None`.
fn engine_time(text: &str) -> Option<DateTime<Utc>> {
    let time = DateTime::parse_from_rfc3339(text).ok()?.with_timezone(&Utc);
    (time.year() > 1).then_some(time)
}

/// Docker pulls every tag of a repository named without one; Cube means `:latest`, as
/// `docker run` does.
fn with_default_tag(image: &str) -> String {
    let last_segment = image.rsplit('/').next().unwrap_or(image);
    if image.contains('@') || last_segment.contains(':') {
        image.to_string()
    } else {
        format!("{image}:latest")
    }
}

fn status_of(err: &BollardError) -> Option<u16> {
    match err {
        BollardError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// A command refused because its container is stopped or stopping is
/// [`RuntimeError::NotRunning`], however the engine's answer reached us (a 409 when the command
/// is created; its start, an upgraded connection, may say it otherwise).
fn exec_error(err: BollardError) -> RuntimeError {
    let message = message_of(&err);
    if status_of(&err) == Some(409) || message.contains("is not running") {
        return RuntimeError::NotRunning(message);
    }
    engine_error("exec", err)
}

/// The engine's own message, without bollard's wrapping.
fn message_of(err: &BollardError) -> String {
    match err {
        BollardError::DockerResponseServerError { message, .. } => message.clone(),
        BollardError::DockerStreamError { error } => error.clone(),
        other => other.to_string(),
    }
}

fn engine_error(action: &'static str, err: BollardError) -> RuntimeError {
    match err {
        BollardError::DockerResponseServerError {
            status_code: 404,
            message,
        } if action != "create" => RuntimeError::NotFound(message),
        BollardError::DockerResponseServerError { message, .. } => {
            RuntimeError::Engine { action, message }
        }
        other => RuntimeError::Unavailable(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untagged_images_mean_latest() {
        assert_eq!(with_default_tag("busybox"), "busybox:latest");
        assert_eq!(
            with_default_tag("127.0.0.1:5000/app"),
            "127.0.0.1:5000/app:latest"
        );
        assert_eq!(with_default_tag("app:1.2"), "app:1.2");
        assert_eq!(with_default_tag("app@sha256:abc"), "app@sha256:abc");
    }

    #[test]
    fn a_host_address_becomes_the_bindings_host_ip() {
        let binding = |ip: Option<&str>, port: &str| PortBinding {
            host_ip: ip.map(str::to_string),
            host_port: Some(port.to_string()),
        };
        assert_eq!(port_binding("8080"), binding(None, "8080"));
        assert_eq!(port_binding(""), binding(None, ""));
        assert_eq!(
            port_binding("127.0.0.1:8080"),
            binding(Some("127.0.0.1"), "8080")
        );
        assert_eq!(port_binding("127.0.0.1:"), binding(Some("127.0.0.1"), ""));
        assert_eq!(port_binding("[::1]:9000"), binding(Some("::1"), "9000"));
    }

    /// The contract every runtime keeps, against the real engine (the simulated runtime the
    /// benchmarks use is held to the same check).
    #[tokio::test]
    async fn the_docker_runtime_keeps_the_runtime_contract() {
        let runtime = DockerRuntime::connect().await.expect("Docker answers");
        runtime
            .ensure_sample_image(crate::sample_image::SAMPLE_IMAGE)
            .await
            .expect("the sample image");
        let node = format!("contract-{}", &Uuid::new_v4().simple().to_string()[..8]);
        // Whatever the check leaves behind when it fails is removed.
        struct Cleanup(String);
        impl Drop for Cleanup {
            fn drop(&mut self) {
                let listed = std::process::Command::new("docker")
                    .args([
                        "ps",
                        "-aq",
                        "--filter",
                        &format!("label={LABEL_NODE}={}", self.0),
                    ])
                    .output();
                if let Ok(listed) = listed {
                    for id in String::from_utf8_lossy(&listed.stdout).split_whitespace() {
                        let _ = std::process::Command::new("docker")
                            .args(["rm", "-f", id])
                            .output();
                    }
                }
            }
        }
        let _cleanup = Cleanup(node.clone());
        crate::contract::check(
            &runtime,
            crate::sample_image::SAMPLE_IMAGE,
            &["sleep", "3600"],
            &node,
        )
        .await;
    }

    #[test]
    fn the_go_zero_time_from_the_engine_is_none() {
        assert_eq!(engine_time("0001-01-01T00:00:00Z"), None);
        assert!(engine_time("2026-11-20T10:00:00.123456789Z").is_some());
    }
}
