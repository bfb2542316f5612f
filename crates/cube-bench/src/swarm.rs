//! Docker Swarm as the peer the benchmarks measure against: a service of the sample image in
//! a single-node swarm that is initialised for the benchmark when there is none. Both are
//! removed again when the [`Swarm`] is dropped.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bollard::Docker;
use bollard::models::ServiceUpdateStatusStateEnum;
use cube_runtime::sample_image::SAMPLE_IMAGE;

use crate::containers::{self, Listed};

/// A Swarm service of the sample image; the service (and the swarm, when this benchmark
/// initialised it) is removed when dropped.
pub(crate) struct Swarm {
    service: String,
    initialised_here: bool,
}

impl Swarm {
    /// Joins or initialises the swarm, then creates `service` with `replicas` replicas and
    /// `extra` flags, detached: the call returns once Swarm has accepted the service.
    pub(crate) fn start(service: &str, replicas: usize, extra: &[&str]) -> anyhow::Result<Swarm> {
        let swarm = Swarm::join()?.with_service(service);
        swarm.create(replicas, extra)?;
        Ok(swarm)
    }

    /// The swarm alone, with no service yet (see [`Swarm::create`]).
    pub(crate) fn join() -> anyhow::Result<Swarm> {
        let state = docker_cli(&["info", "--format", "{{.Swarm.LocalNodeState}}"])?;
        let initialised_here = state.trim() != "active";
        if initialised_here {
            docker_cli(&["swarm", "init", "--advertise-addr", "127.0.0.1"])
                .context("docker swarm init")?;
        }
        Ok(Swarm {
            service: String::new(),
            initialised_here,
        })
    }

    /// Names the service this swarm creates and removes.
    pub(crate) fn with_service(mut self, service: &str) -> Swarm {
        self.service = service.to_string();
        self
    }

    /// Creates the service (removing one of the same name first), detached.
    pub(crate) fn create(&self, replicas: usize, extra: &[&str]) -> anyhow::Result<()> {
        self.create_with_args(replicas, extra, &[])
    }

    /// As [`Swarm::create`], with `args` in place of the image's command (the service's
    /// `Args`; empty: the image's own).
    pub(crate) fn create_with_args(
        &self,
        replicas: usize,
        extra: &[&str],
        args: &[&str],
    ) -> anyhow::Result<()> {
        self.remove_service();
        let replicas = replicas.to_string();
        let mut command = vec![
            "service",
            "create",
            "--name",
            &self.service,
            "--replicas",
            &replicas,
            "--init",
            "--no-resolve-image",
            "--detach",
        ];
        command.extend_from_slice(extra);
        command.push(SAMPLE_IMAGE);
        command.extend_from_slice(args);
        docker_cli(&command).context("docker service create")?;
        Ok(())
    }

    /// `docker service update --detach FLAGS NAME`: the call returns once Swarm has recorded
    /// the new spec; the rollout goes on in the background.
    pub(crate) fn update(&self, flags: &[&str]) -> anyhow::Result<()> {
        let mut command = vec!["service", "update", "--detach"];
        command.extend_from_slice(flags);
        command.push(&self.service);
        docker_cli(&command).context("docker service update")?;
        Ok(())
    }

    /// The state of the service's last update (`UpdateStatus.State` of `docker service
    /// inspect`), read through the API rather than the CLI so that it can be polled every
    /// few ms; `None` while the service has never been updated.
    pub(crate) async fn update_state(
        &self,
        docker: &Docker,
    ) -> anyhow::Result<Option<ServiceUpdateStatusStateEnum>> {
        let service = docker
            .inspect_service(&self.service, None)
            .await
            .with_context(|| format!("inspecting service {}", self.service))?;
        Ok(service.update_status.and_then(|status| status.state))
    }

    /// Removes the service; its containers go away in the background.
    pub(crate) fn remove_service(&self) {
        let _ = docker_cli(&["service", "rm", &self.service]);
    }

    /// Sets the service's replicas (`docker service scale --detach NAME=N`): the call returns
    /// once Swarm has recorded the new count.
    pub(crate) fn scale(&self, replicas: usize) -> anyhow::Result<()> {
        let target = format!("{}={replicas}", self.service);
        docker_cli(&["service", "scale", "--detach", &target]).context("docker service scale")?;
        Ok(())
    }

    /// The IDs of the service's running containers.
    pub(crate) async fn running(&self, docker: &Docker) -> anyhow::Result<Vec<String>> {
        containers::with_label(docker, &self.label(), Listed::Running).await
    }

    /// The commands of the service's running containers, as Docker lists them.
    pub(crate) async fn running_commands(&self, docker: &Docker) -> anyhow::Result<Vec<String>> {
        containers::commands_with_label(docker, &self.label(), Listed::Running).await
    }

    /// Polls Docker every 10 ms until at least `replicas` containers of the service run; the
    /// time since `started`. Fails after `bound`.
    pub(crate) async fn await_running(
        &self,
        docker: &Docker,
        replicas: usize,
        started: Instant,
        bound: Duration,
    ) -> anyhow::Result<Duration> {
        loop {
            let running = self.running(docker).await?.len();
            if running >= replicas {
                return Ok(started.elapsed());
            }
            if started.elapsed() > bound {
                bail!("Swarm runs {running} of {replicas} replicas after {bound:?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Polls Docker every 10 ms until at least `replicas` containers of the service run and
    /// their health check passed; the time since `started`. Fails after `bound`.
    pub(crate) async fn await_healthy(
        &self,
        docker: &Docker,
        replicas: usize,
        started: Instant,
        bound: Duration,
    ) -> anyhow::Result<Duration> {
        loop {
            let healthy = containers::with_label(docker, &self.label(), Listed::Healthy)
                .await?
                .len();
            if healthy >= replicas {
                return Ok(started.elapsed());
            }
            if started.elapsed() > bound {
                bail!("Swarm has {healthy} of {replicas} replicas healthy after {bound:?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until the service has no container left, running or not (at most 60 s).
    pub(crate) async fn await_gone(&self, docker: &Docker) -> anyhow::Result<()> {
        containers::await_none_running(docker, &self.label()).await
    }

    /// The label Swarm puts on the service's containers.
    fn label(&self) -> String {
        format!("com.docker.swarm.service.name={}", self.service)
    }
}

impl Drop for Swarm {
    fn drop(&mut self) {
        if !self.service.is_empty() {
            self.remove_service();
        }
        if self.initialised_here {
            let _ = docker_cli(&["swarm", "leave", "--force"]);
        }
    }
}

/// Runs the Docker CLI; its stdout, or its stderr as the error.
pub(crate) fn docker_cli(args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new("docker")
        .args(args)
        .output()
        .context("running the docker CLI")?;
    if !output.status.success() {
        bail!(
            "docker {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).to_string())
}
