//! The runner over steps: one code path that launches, watches and kills a task's containers,
//! whether the task is one container or a pod.
//!
//! A launch is: the plan ([`LaunchPlan::for_task`]), the plugins' `pre_launch` in order, then
//! the containers in start order (the infra container first), stage by stage: wait for what
//! a stage's containers depend on, then create each (a missing image pulled, with retries; an
//! existing one adopted, by its name and labels) and start it, the stage's containers
//! together; then the plugins' `post_launch`, and the record. A step that fails
//! removes what this run started and fails the task with the step's words; the whole launch
//! is bounded by the configured launch timeout. A kill is the plugins' `pre_kill`, the
//! containers stopped in reverse start order (the infra container last), removed when so
//! configured, then `post_kill`.
//!
//! The pod monitor is [`assess`]: a pure verdict on a pod from what the engine says of each
//! container, asked on every Docker event about one of them and at the monitor's interval.

use chrono::{DateTime, Utc};
use cube_runtime::{ContainerInfo, Runtime, RuntimeError, RuntimeEvent};
use cube_types::duration::format_duration;
use cube_types::pod::{Condition, ContainerStatus, INFRA};
use cube_types::{Health, State, Task};
use futures_util::StreamExt;

use super::decide::PodContainers;
use super::{Worker, WorkerError};
use crate::first_check::FirstCheck;
use crate::plugin::{LaunchPlan, PlannedContainer};

/// Why a launch failed, in the words the task's `Error` shows.
struct LaunchFailure(String);

/// How long an engine call of a launch may go unanswered before the log says so (and again
/// each time as long again): a start that Docker takes a minute over is otherwise
/// indistinguishable, from outside, from one the worker never made.
const ENGINE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// Awaits `call`, an engine call (`what`: create, start, inspect) of task `task`'s launch,
/// logging a warning each [`ENGINE_PATIENCE`] it has not answered, and how long it took
/// when it answers late. The call is never cut short here: the launch timeout bounds it.
async fn told_if_slow<T>(
    task: uuid::Uuid,
    what: &str,
    call: impl std::future::Future<Output = T>,
) -> T {
    let started = tokio::time::Instant::now();
    let mut call = std::pin::pin!(call);
    let mut ticks = tokio::time::interval_at(started + ENGINE_PATIENCE, ENGINE_PATIENCE);
    loop {
        tokio::select! {
            answer = &mut call => {
                let took = started.elapsed();
                if took >= ENGINE_PATIENCE {
                    tracing::info!(%task, call = what, took = %format_duration(took), "the engine answered late");
                }
                return answer;
            }
            _ = ticks.tick() => {
                tracing::warn!(%task, call = what, waited = %format_duration(started.elapsed()), "the engine has not answered yet");
            }
        }
    }
}

/// What the pod monitor concludes from its containers.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Verdict {
    /// Every container runs (or a service finished its work with exit code 0); the pod's
    /// health: unset when no container has a health check, else healthy once all are.
    Running { health: Option<Health> },
    /// Every service finished with exit code 0.
    Completed,
    /// One container ended badly, went unhealthy or vanished: the pod comes down.
    Failed {
        reason: String,
        exit_code: Option<i64>,
        finished_at: Option<DateTime<Utc>>,
    },
}

/// The pod monitor's verdict on a pod whose containers are `containers` (their names, whether
/// each is the infra container, and what the engine says of each: `None` when it is gone),
/// with each one's status for `cube status`.
pub(crate) fn assess(
    containers: &[(String, bool, Option<ContainerInfo>)],
) -> (Verdict, Vec<ContainerStatus>) {
    let statuses = containers
        .iter()
        .map(|(name, _, info)| container_status(name, info.as_ref()))
        .collect();
    let mut failure = None;
    let mut services_running = 0;
    let mut health_known = false;
    let mut all_healthy = true;
    for (name, infra, info) in containers {
        let Some(info) = info else {
            failure.get_or_insert(Verdict::Failed {
                reason: format!("container {name} disappeared (removed outside Cube)"),
                exit_code: None,
                finished_at: None,
            });
            continue;
        };
        let ended_badly = !info.running && (info.exit_code != Some(0) || info.oom_killed);
        if *infra && !info.running {
            failure.get_or_insert(Verdict::Failed {
                reason: format!(
                    "the infra container, which holds the pod's network, ended: {}",
                    describe_end(info)
                ),
                exit_code: info.exit_code,
                finished_at: info.finished_at,
            });
        } else if ended_badly && info.exit_code.is_some() {
            failure.get_or_insert(Verdict::Failed {
                reason: format!("container {name}: {}", describe_end(info)),
                exit_code: info.exit_code,
                finished_at: info.finished_at,
            });
        } else if info.health == Some(Health::Unhealthy) && info.running {
            failure.get_or_insert(Verdict::Failed {
                reason: format!("container {name}: unhealthy (its health check failed)"),
                exit_code: None,
                finished_at: None,
            });
        }
        if *infra {
            continue;
        }
        if info.running {
            services_running += 1;
            if let Some(health) = info.health {
                health_known = true;
                all_healthy &= health == Health::Healthy;
            }
        }
    }
    if let Some(failure) = failure {
        return (failure, statuses);
    }
    if services_running == 0 {
        return (Verdict::Completed, statuses);
    }
    let health = health_known.then_some(if all_healthy {
        Health::Healthy
    } else {
        Health::Starting
    });
    (Verdict::Running { health }, statuses)
}

/// Whether a pull failed for good: the registry refused the login or has no such image
/// (another try would be refused the same).
fn pull_refused(err: &RuntimeError) -> bool {
    let text = err.to_string();
    text.contains("no basic auth credentials")
        || text.contains("unauthorized")
        || text.contains("manifest unknown")
        || text.contains(" not found")
}

/// A failed pull's error in words that say why first: `unauthorized`, `not found` or
/// `time-out`, then the engine's own.
fn explain_pull(image: &str, with_login: bool, engine: &str) -> String {
    let registry = cube_types::secret::registry_of_image(image).unwrap_or("Docker Hub");
    if engine.contains("no basic auth credentials")
        || engine.contains("unauthorized")
        || engine.contains("authentication required")
    {
        let hint = if with_login {
            format!(
                "the registry refused the project's login for {registry} (cube registry login {registry} again)"
            )
        } else {
            format!(
                "the registry wants a login and the task's project has none for {registry} (cube registry login {registry})"
            )
        };
        format!("unauthorized: {hint}: {engine}")
    } else if engine.contains("manifest unknown") || engine.contains(" not found") {
        format!("not found: {registry} has no image {image}: {engine}")
    } else if engine.contains("did not finish within") {
        format!("time-out: {engine}")
    } else {
        engine.to_string()
    }
}

/// Whether an event a launch waits on is about its container (then it looks again), or why
/// the wait fails (the engine's events broke or ended).
fn about(
    event: Option<Result<RuntimeEvent, RuntimeError>>,
    container_id: &str,
    service: &str,
) -> Result<bool, LaunchFailure> {
    match event {
        Some(Ok(event)) => Ok(event.container_id() == container_id),
        Some(Err(err)) => Err(LaunchFailure(format!(
            "lost the engine's events while waiting for {service}: {err}"
        ))),
        None => Err(LaunchFailure(format!(
            "the engine's events ended while waiting for {service}"
        ))),
    }
}

/// What a launch waiting on a container (until it `what`: is healthy, completed) reads of it
/// at each look: the container, or why the launch fails.
fn awaited(
    inspected: Result<Option<ContainerInfo>, RuntimeError>,
    service: &str,
    what: &str,
) -> Result<ContainerInfo, LaunchFailure> {
    match inspected {
        Ok(Some(info)) => Ok(info),
        Ok(None) => Err(LaunchFailure(format!(
            "container {service} disappeared before it {what}"
        ))),
        Err(err) => Err(LaunchFailure(format!(
            "cannot inspect container {service}: {err}"
        ))),
    }
}

fn describe_end(info: &ContainerInfo) -> String {
    match info.exit_code {
        _ if info.oom_killed => "killed for using more than its memory limit".to_string(),
        Some(137) => "killed (exit code 137, SIGKILL)".to_string(),
        Some(code) => format!("exited with code {code}"),
        None => "not running".to_string(),
    }
}

fn container_status(name: &str, info: Option<&ContainerInfo>) -> ContainerStatus {
    let Some(info) = info else {
        return ContainerStatus {
            name: name.to_string(),
            container_id: String::new(),
            status: "missing".to_string(),
            exit_code: None,
            health: None,
            error: None,
        };
    };
    let status = if info.running {
        "running"
    } else if info.exit_code.is_some() {
        "exited"
    } else {
        "created"
    };
    ContainerStatus {
        name: name.to_string(),
        container_id: info.id.clone(),
        status: status.to_string(),
        exit_code: info.exit_code,
        health: info.health,
        error: (!info.error.is_empty()).then(|| info.error.clone()),
    }
}

impl<R: Runtime> Worker<R> {
    /// Makes a `Scheduled` task's containers run: plan, plugins, then each container created
    /// (or adopted, after a crash mid-start) and started in order.
    pub(super) async fn start(&self, task: Task) -> Result<(), WorkerError> {
        if task.status.state != State::Scheduled || task.spec.desired_state != State::Running {
            return Ok(());
        }
        let settings = &self.config.pods;
        // Accepted under an earlier configuration, perhaps: checked again before it runs.
        if let Err(why) = settings.host_access.check(&task) {
            return self.fail(task, why);
        }
        let run_secrets = if super::secrets::needs_manager(&task) {
            match self.run_secrets(&task).await {
                Ok(run) => run,
                Err(why) => return self.fail(task, why),
            }
        } else {
            cube_types::secret::RunSecrets::default()
        };
        let mut plan = LaunchPlan::for_task(&task, &self.config.name, &self.config.labels);
        plan.registry_auth = run_secrets.registry.clone();
        if let Err(err) = settings.plugins.pre_launch(&mut plan) {
            return self.fail(task, err.to_string());
        }
        if let Err(why) = self.prepare_volumes(&task, &mut plan).await {
            return self.fail(task, why);
        }
        let secret_files = match self.place_secrets(&task, &run_secrets, &mut plan) {
            Ok(files) => files,
            Err(why) => return self.fail(task, why),
        };
        drop(run_secrets);
        let launched = tokio::time::timeout(settings.launch_timeout, self.launch(&plan))
            .await
            .unwrap_or_else(|_| {
                Err(LaunchFailure(format!(
                    "not running within the launch timeout of {}",
                    format_duration(settings.launch_timeout)
                )))
            });
        // Started (its mounts hold the files) or failed: no path to a value stays on the host.
        drop(secret_files);
        let infos = match launched {
            Ok(infos) => infos,
            Err(LaunchFailure(reason)) => {
                // A run that could not start leaves nothing behind but the task's failure.
                self.remove_run(&plan).await;
                return self.fail(task, reason);
            }
        };
        if let Err(err) = settings.plugins.post_launch(&plan, &task) {
            self.remove_run(&plan).await;
            return self.fail(task, err.to_string());
        }
        let restarted = task.status.restart_count > 0;
        let task = self.record_launch(task, &plan, infos).await?;
        // Once the new run is recorded (and reported), what is left of the last one on this
        // node goes.
        if restarted && let Err(err) = self.tidy(&task).await {
            tracing::warn!(task = %task.id, error = %err, "cannot remove an earlier run's container");
        }
        Ok(())
    }

    /// Creates and starts the plan's containers in order, stage by stage (see [`stages`]): the
    /// containers of one stage are created and started together, and the next stage's are
    /// created while this one's start (a create needs only the infra container to exist, not
    /// to run), so that a start is all that is left of them when their turn comes; what the
    /// engine says of each once all were started, in the plan's order.
    async fn launch(&self, plan: &LaunchPlan) -> Result<Vec<ContainerInfo>, LaunchFailure> {
        let stages = stages(&plan.containers);
        let mut ids: Vec<(String, String)> = Vec::new();
        let mut created_ahead = None;
        for (index, stage) in stages.iter().enumerate() {
            for container in stage {
                for dependency in &container.depends_on {
                    let Some((_, id)) = ids.iter().find(|(name, _)| *name == dependency.service)
                    else {
                        continue;
                    };
                    match dependency.condition {
                        // Started already: it came in an earlier stage.
                        Condition::Started => {}
                        Condition::Healthy => self.await_healthy(id, &dependency.service).await?,
                        Condition::CompletedSuccessfully => {
                            self.await_completed(id, &dependency.service).await?
                        }
                    }
                }
            }
            let made = match created_ahead.take() {
                Some(made) => made,
                None => self.create_stage(plan, stage).await?,
            };
            match stages.get(index + 1) {
                Some(next) => {
                    let (started, ahead) = tokio::join!(
                        self.start_stage(plan, stage, &made),
                        self.create_stage(plan, next)
                    );
                    started?;
                    created_ahead = Some(ahead?);
                }
                None => self.start_stage(plan, stage, &made).await?,
            }
            if plan.pod {
                let started = tokio::time::Instant::now();
                for (container, (id, _)) in stage.iter().zip(&made) {
                    if let Some(check) = container
                        .spec
                        .healthcheck
                        .as_ref()
                        .and_then(|check| FirstCheck::of(plan.task_id, id, check, started))
                    {
                        self.first_checks.queue(check);
                    }
                }
            }
            ids.extend(
                stage
                    .iter()
                    .zip(made)
                    .map(|(container, (id, _))| (container.name.clone(), id)),
            );
        }
        let inspected = futures_util::future::join_all(
            ids.iter()
                .map(|(_, id)| told_if_slow(plan.task_id, "inspect", self.inspect_counted(id))),
        )
        .await;
        let mut infos = Vec::with_capacity(ids.len());
        for ((name, _), inspected) in ids.iter().zip(inspected) {
            match inspected {
                Ok(Some(info)) => infos.push(info),
                Ok(None) => {
                    return Err(LaunchFailure(format!(
                        "{}the container disappeared as it started",
                        if plan.pod {
                            format!("container {name}: ")
                        } else {
                            String::new()
                        }
                    )));
                }
                Err(err) => {
                    return Err(LaunchFailure(format!(
                        "cannot inspect the started container: {err}"
                    )));
                }
            }
        }
        Ok(infos)
    }

    /// Creates (or adopts) a stage's containers together: each one's ID and whether it already
    /// ran.
    async fn create_stage(
        &self,
        plan: &LaunchPlan,
        stage: &[&PlannedContainer],
    ) -> Result<Vec<(String, bool)>, LaunchFailure> {
        let created = futures_util::future::join_all(stage.iter().map(|container| async {
            self.create_or_adopt(plan.task_id, container, plan.registry_auth.as_ref())
                .await
                .map_err(|why| LaunchFailure(format!("{}{why}", step_prefix(plan, container))))
        }))
        .await;
        created.into_iter().collect()
    }

    /// Starts a stage's created containers together (those found running already are left).
    async fn start_stage(
        &self,
        plan: &LaunchPlan,
        stage: &[&PlannedContainer],
        made: &[(String, bool)],
    ) -> Result<(), LaunchFailure> {
        let started = futures_util::future::join_all(stage.iter().zip(made).map(
            |(container, (id, started))| async move {
                if *started {
                    return Ok(());
                }
                told_if_slow(plan.task_id, "start", self.runtime.start(id))
                    .await
                    .map_err(|err| {
                        LaunchFailure(format!(
                            "{}cannot start the container: {err}",
                            step_prefix(plan, container)
                        ))
                    })
            },
        ))
        .await;
        started.into_iter().collect()
    }

    /// The container's ID, and whether it already ran: created now (a missing image pulled
    /// first, as `docker run` does: learnt from create's answer), or found by its name and
    /// labels when a crash came after it was created.
    async fn create_or_adopt(
        &self,
        task: uuid::Uuid,
        container: &PlannedContainer,
        auth: Option<&cube_types::secret::RegistryAuth>,
    ) -> Result<(String, bool), String> {
        let spec = &container.spec;
        // A pull has its own time-out and progress; the create itself should be quick.
        let created = match told_if_slow(task, "create", self.runtime.create(spec)).await {
            Err(RuntimeError::Image { .. }) => {
                self.pull(&spec.image, auth).await?;
                self.runtime.create(spec).await
            }
            other => other,
        };
        match created {
            Ok(id) => Ok((id, false)),
            Err(RuntimeError::Conflict(_)) => {
                let found = self
                    .runtime
                    .inspect(&spec.name)
                    .await
                    .map_err(|err| format!("cannot inspect the container: {err}"))?
                    .filter(|info| self.made_for(info, container));
                match found {
                    Some(info) => {
                        let started = info.running || info.exit_code.is_some();
                        Ok((info.id, started))
                    }
                    None => self
                        .runtime
                        .create(spec)
                        .await
                        .map(|id| (id, false))
                        .map_err(|err| format!("cannot create the container: {err}")),
                }
            }
            Err(err @ RuntimeError::Image { .. }) => Err(err.to_string()),
            Err(err) => Err(format!("cannot create the container: {err}")),
        }
    }

    /// Whether a container found by name was made for this node, task and run.
    fn made_for(&self, info: &ContainerInfo, container: &PlannedContainer) -> bool {
        let label = |key: &str| container.spec.labels.get(key).map(String::as_str);
        info.node.as_deref() == Some(self.config.name.as_str())
            && info.task_id.map(|id| id.to_string()).as_deref()
                == label(cube_runtime::LABEL_TASK_ID)
    }

    /// Makes `image` present: the engine's pull, tried again `pull_retries` times, each after
    /// a backoff that doubles.
    async fn pull(
        &self,
        image: &str,
        auth: Option<&cube_types::secret::RegistryAuth>,
    ) -> Result<(), String> {
        let settings = &self.config.pods;
        let mut backoff = settings.pull_backoff;
        let mut attempt = 0;
        loop {
            match self.runtime.ensure_image_with(image, auth).await {
                Ok(()) => return Ok(()),
                Err(err) if attempt >= settings.pull_retries || pull_refused(&err) => {
                    let err = explain_pull(image, auth.is_some(), &err.to_string());
                    return Err(if attempt == 0 {
                        err
                    } else {
                        format!("{err} (after {} attempts)", attempt + 1)
                    });
                }
                Err(err) => {
                    tracing::warn!(image, attempt, error = %err, "pull failed; trying again");
                    attempt += 1;
                    tokio::select! {
                        _ = self.closing.cancelled() => return Err("the worker is stopping".to_string()),
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = backoff.saturating_mul(2);
                }
            }
        }
    }

    /// Waits until the engine's health check says the container is healthy: on its events
    /// (subscribed to before each look, so a verdict between the look and the wait is seen).
    async fn await_healthy(&self, container_id: &str, service: &str) -> Result<(), LaunchFailure> {
        let since = Utc::now().timestamp() - 1;
        let mut events = self.runtime.events_since(&self.config.name, since);
        loop {
            // Cube's own first checks may pass before Docker's first: a pass wakes this too.
            let passed = self.first_checks.next_pass();
            tokio::pin!(passed);
            passed.as_mut().enable();
            let info = awaited(
                self.inspect_counted(container_id).await,
                service,
                "was healthy",
            )?;
            if !info.running {
                return Err(LaunchFailure(format!(
                    "container {service} ended before it was healthy: {}",
                    describe_end(&info)
                )));
            }
            match info.health {
                Some(Health::Healthy) => return Ok(()),
                Some(Health::Unhealthy) => {
                    return Err(LaunchFailure(format!(
                        "container {service} is unhealthy; what depends on it was not started"
                    )));
                }
                None => {
                    return Err(LaunchFailure(format!(
                        "container {service} has no health check to wait for"
                    )));
                }
                Some(Health::Starting) => {}
            }
            loop {
                let event = tokio::select! {
                    _ = self.closing.cancelled() => {
                        return Err(LaunchFailure("the worker is stopping".to_string()));
                    }
                    _ = &mut passed => break,
                    event = events.next() => event,
                };
                if about(event, container_id, service)? {
                    break;
                }
            }
        }
    }

    /// Waits until the container has run to its end with exit code 0 (`depends_on: condition:
    /// service_completed_successfully`): on the engine's events, subscribed to before each
    /// look. Any other end fails the launch, naming the container and how it ended.
    async fn await_completed(
        &self,
        container_id: &str,
        service: &str,
    ) -> Result<(), LaunchFailure> {
        let since = Utc::now().timestamp() - 1;
        let mut events = self.runtime.events_since(&self.config.name, since);
        loop {
            let info = awaited(
                self.runtime.inspect(container_id).await,
                service,
                "completed",
            )?;
            if !info.running {
                return match info.exit_code {
                    Some(0) if !info.oom_killed => Ok(()),
                    _ => Err(LaunchFailure(format!(
                        "container {service} {}; what depends on it completing successfully \
                         was not started",
                        describe_end(&info)
                    ))),
                };
            }
            loop {
                let event = tokio::select! {
                    _ = self.closing.cancelled() => {
                        return Err(LaunchFailure("the worker is stopping".to_string()));
                    }
                    event = events.next() => event,
                };
                if about(event, container_id, service)? {
                    break;
                }
            }
        }
    }

    /// What the engine says of a container, with Cube's first health checks counted (a pass
    /// reads as healthy while Docker still says `starting`; see `first_check.rs`): how the
    /// launch, the pod monitor and a wait on `depends_on` read a container.
    async fn inspect_counted(&self, id: &str) -> Result<Option<ContainerInfo>, RuntimeError> {
        let mut info = self.runtime.inspect(id).await?;
        if let Some(info) = &mut info {
            self.first_checks.apply(info);
        }
        Ok(info)
    }

    /// Removes every container of the plan's run (those this launch created or adopted).
    async fn remove_run(&self, plan: &LaunchPlan) {
        for container in plan.containers.iter().rev() {
            if let Err(err) = self.runtime.remove(&container.spec.name).await {
                tracing::warn!(task = %plan.task_id, container = %container.spec.name, error = %err, "cannot remove a container of a failed launch");
            }
        }
    }

    /// Records a launch: a single container as it is observed, a pod by its monitor's verdict.
    async fn record_launch(
        &self,
        mut task: Task,
        plan: &LaunchPlan,
        infos: Vec<ContainerInfo>,
    ) -> Result<Task, WorkerError> {
        if !plan.pod {
            let Some(info) = infos.into_iter().next() else {
                self.fail(task.clone(), "the launch created no container".to_string())?;
                return Ok(task);
            };
            self.observe(task.clone(), info)?;
            return Ok(self.task(task.id).unwrap_or(task));
        }
        let containers: Vec<(String, bool, Option<ContainerInfo>)> = plan
            .containers
            .iter()
            .zip(infos)
            .map(|(planned, info)| (planned.name.clone(), planned.infra, Some(info)))
            .collect();
        // The task's own container is the one that holds the pod's network (its ports).
        let main = &containers[0].2;
        task.status.run.container_id = main.as_ref().map(|i| i.id.clone()).unwrap_or_default();
        task.status.run.start_time = main.as_ref().and_then(|info| info.started_at);
        self.record_pod(task.clone(), &containers).await?;
        Ok(self.task(task.id).unwrap_or(task))
    }

    /// The pod monitor's look at a pod: each container its record names, inspected (with
    /// Cube's first health checks counted).
    pub(super) async fn pod_containers(&self, task: &Task) -> Result<PodContainers, RuntimeError> {
        let mut containers = Vec::with_capacity(task.status.run.containers.len());
        for status in &task.status.run.containers {
            let info = if status.container_id.is_empty() {
                None
            } else {
                self.inspect_counted(&status.container_id).await?
            };
            containers.push((status.name.clone(), status.name == INFRA, info));
        }
        Ok(containers)
    }

    /// Records the monitor's verdict: a running pod's containers and health, or, for a pod
    /// that ended, the rest of it brought down and the task `Completed` or `Failed` with
    /// which container and why.
    pub(super) async fn record_pod(
        &self,
        mut task: Task,
        containers: &[(String, bool, Option<ContainerInfo>)],
    ) -> Result<(), WorkerError> {
        let (verdict, statuses) = assess(containers);
        let before = task.clone();
        match verdict {
            Verdict::Running { health } => {
                if task.move_to(State::Running).is_err() {
                    return Ok(());
                }
                let main = containers.first().and_then(|(_, _, info)| info.as_ref());
                task.status.run.host_ports =
                    main.map(|info| info.host_ports.clone()).unwrap_or_default();
                task.status.run.containers = statuses;
                task.status.run.health = health;
                if task != before {
                    self.save(&task)?;
                    if before.status.state != State::Running {
                        tracing::info!(task = %task.id, name = %task.name, "pod running");
                    }
                }
                Ok(())
            }
            Verdict::Completed | Verdict::Failed { .. } => {
                let (next, reason, exit_code, finished_at) = match verdict {
                    Verdict::Failed {
                        reason,
                        exit_code,
                        finished_at,
                    } => (State::Failed, Some(reason), exit_code, finished_at),
                    _ => (State::Completed, None, Some(0), None),
                };
                if task.move_to(next).is_err() {
                    return Ok(());
                }
                tracing::warn!(task = %task.id, name = %task.name, reason = reason.as_deref().unwrap_or("every service finished"), "bringing the pod down");
                let ids: Vec<String> = statuses
                    .iter()
                    .map(|status| status.container_id.clone())
                    .filter(|id| !id.is_empty())
                    .collect();
                self.bring_down(&before, &ids).await;
                self.post_kill(&before);
                task.status.run.containers = self.statuses_after_stop(statuses).await;
                task.status.run.error = reason;
                task.status.run.exit_code = exit_code;
                task.status.run.finish_time = finished_at.or_else(|| Some(Utc::now()));
                task.status.run.host_ports.clear();
                if task.status.run.health.is_some() {
                    task.status.run.health = containers
                        .iter()
                        .any(|(_, _, info)| {
                            info.as_ref()
                                .is_some_and(|info| info.health == Some(Health::Unhealthy))
                        })
                        .then_some(Health::Unhealthy)
                        .or(task.status.run.health);
                }
                self.save(&task)?;
                Ok(())
            }
        }
    }

    /// The kill hooks around stopping `ids` in reverse start order (the infra container,
    /// first in the list, last).
    async fn bring_down(&self, task: &Task, ids: &[String]) {
        let plugins = &self.config.pods.plugins;
        if let Err(err) = plugins.pre_kill(task) {
            tracing::warn!(task = %task.id, error = %err, "a plugin failed before a kill; stopping anyway");
        }
        for id in ids.iter().rev() {
            if let Err(err) = self.runtime.stop(id, self.config.stop_timeout).await {
                tracing::warn!(task = %task.id, container = %id, error = %err, "cannot stop a container");
            }
        }
        self.first_checks.forget(ids);
    }

    fn post_kill(&self, task: &Task) {
        if let Err(err) = self.config.pods.plugins.post_kill(task) {
            tracing::warn!(task = %task.id, error = %err, "a plugin failed after a kill");
        }
    }

    /// Each container's status once the pod was stopped.
    async fn statuses_after_stop(&self, statuses: Vec<ContainerStatus>) -> Vec<ContainerStatus> {
        let mut after = Vec::with_capacity(statuses.len());
        for status in statuses {
            let info = if status.container_id.is_empty() {
                None
            } else {
                self.runtime
                    .inspect(&status.container_id)
                    .await
                    .ok()
                    .flatten()
            };
            after.push(match info {
                Some(info) => container_status(&status.name, Some(&info)),
                None => status,
            });
        }
        after
    }

    /// Stops a task's run (every container of a pod, the infra container last) and keeps it,
    /// unless the configuration says to remove containers (and a pod's volumes, and images)
    /// on a kill. A task that had not ended is `Completed`. A task that already ended (its
    /// pod brought down by the monitor) only has its containers made sure of: no hooks, no
    /// removal — a stop during a teardown is a no-op.
    pub(super) async fn stop(&self, mut task: Task) -> Result<(), WorkerError> {
        let ids: Vec<String> = if task.spec.pod.is_some() {
            let mut ids: Vec<String> = task
                .status
                .run
                .containers
                .iter()
                .map(|status| status.container_id.clone())
                .filter(|id| !id.is_empty())
                .collect();
            // A start cut short (the worker killed while it created the pod) leaves running
            // containers its record does not name: found by their labels, stopped first.
            match self.runtime.list_managed(&self.config.name).await {
                Ok(listed) => {
                    for info in listed
                        .into_iter()
                        .filter(|info| info.task_id == Some(task.id) && info.running)
                    {
                        if !ids.contains(&info.id) {
                            ids.push(info.id);
                        }
                    }
                }
                Err(err) => {
                    return self.record_error(
                        task,
                        format!("cannot list the pod's containers to stop them: {err}"),
                    );
                }
            }
            ids
        } else {
            match self.find_container(&task).await {
                Ok(info) => info.map(|info| info.id).into_iter().collect(),
                Err(err) => {
                    return self.record_error(
                        task,
                        format!("cannot inspect the container to stop it: {err}"),
                    );
                }
            }
        };
        if task.status.state.is_terminal() {
            for id in ids.iter().rev() {
                if let Err(err) = self.runtime.stop(id, self.config.stop_timeout).await {
                    return self.record_error(task, format!("cannot stop the container: {err}"));
                }
            }
            // An ended run binds no port.
            if !ids.is_empty() && !task.status.run.host_ports.is_empty() {
                task.status.run.host_ports.clear();
                self.save(&task)?;
            }
            return Ok(());
        }
        let plugins = &self.config.pods.plugins;
        if let Err(err) = plugins.pre_kill(&task) {
            tracing::warn!(task = %task.id, error = %err, "a plugin failed before a kill; stopping anyway");
        }
        for id in ids.iter().rev() {
            if let Err(err) = self.runtime.stop(id, self.config.stop_timeout).await {
                return self.record_error(task, format!("cannot stop the container: {err}"));
            }
        }
        self.first_checks.forget(&ids);
        if let Some(main) = ids.first()
            && let Ok(Some(info)) = self.runtime.inspect(main).await
            && task.spec.pod.is_none()
        {
            task.status.run.exit_code = info.exit_code;
            task.status.run.finish_time = info.finished_at;
        }
        if task.spec.pod.is_some() {
            let statuses = std::mem::take(&mut task.status.run.containers);
            task.status.run.containers = self.statuses_after_stop(statuses).await;
        }
        if self.config.pods.remove_containers_on_kill {
            self.remove_on_kill(&task).await;
        }
        self.post_kill(&task);
        task.status.state = super::checked_transition(&task, State::Completed)?;
        task.status.run.host_ports.clear();
        task.status.run.finish_time.get_or_insert_with(Utc::now);
        task.status.run.error = None;
        self.save(&task)?;
        tracing::info!(task = %task.id, name = %task.name, "task stopped");
        Ok(())
    }

    /// What a kill removes when configured: every container of the task on this node, the
    /// pod's named volumes, and the images no other container uses.
    async fn remove_on_kill(&self, task: &Task) {
        let containers = match self.runtime.list_managed(&self.config.name).await {
            Ok(containers) => containers,
            Err(err) => {
                tracing::warn!(task = %task.id, error = %err, "cannot list containers to remove them");
                return;
            }
        };
        for container in containers.iter().filter(|c| c.task_id == Some(task.id)) {
            if let Err(err) = self.runtime.remove(&container.id).await {
                tracing::warn!(task = %task.id, container = %container.id, error = %err, "cannot remove a container");
            }
        }
        let settings = &self.config.pods;
        if settings.remove_volumes_on_kill {
            for volume in pod_volumes(task) {
                if let Err(err) = self.runtime.remove_volume(&volume).await {
                    tracing::warn!(task = %task.id, volume, error = %err, "cannot remove a volume");
                }
            }
        }
        if settings.remove_images_on_kill {
            for image in task_images(task) {
                if let Err(err) = self.runtime.remove_image(&image).await {
                    tracing::warn!(task = %task.id, image, error = %err, "cannot remove an image");
                }
            }
        }
    }

    /// The IDs of the containers of the task's current run.
    pub(super) fn current_containers(task: &Task) -> Vec<String> {
        let mut ids: Vec<String> = task
            .status
            .run
            .containers
            .iter()
            .map(|status| status.container_id.clone())
            .collect();
        ids.push(task.status.run.container_id.clone());
        ids.retain(|id| !id.is_empty());
        ids
    }

    /// The container a pod's `cube logs --container NAME` (or `exec`) means: the service
    /// named, or the only service; a single container's own.
    pub(super) fn container_for(task: &Task, name: Option<&str>) -> Result<String, WorkerError> {
        if task.spec.pod.is_none() {
            return match name {
                None => Ok(task.status.run.container_id.clone()),
                Some(name) if name == task.name => Ok(task.status.run.container_id.clone()),
                Some(name) => Err(WorkerError::BadRequest(format!(
                    "container: task {} is not a pod; it has no container {name:?}",
                    task.name
                ))),
            };
        }
        let services: Vec<&ContainerStatus> = task
            .status
            .run
            .containers
            .iter()
            .filter(|status| status.name != INFRA)
            .collect();
        let names = || {
            services
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let chosen = match name {
            Some(name) => task
                .status
                .run
                .containers
                .iter()
                .find(|status| status.name == name)
                .ok_or_else(|| {
                    WorkerError::BadRequest(format!(
                        "container: pod {} has no container {name:?}; its containers are {}",
                        task.name,
                        names()
                    ))
                })?,
            None if services.len() == 1 => services[0],
            None => {
                return Err(WorkerError::BadRequest(format!(
                    "container: {} is a pod of several containers; name one ({})",
                    task.name,
                    names()
                )));
            }
        };
        Ok(chosen.container_id.clone())
    }
}

/// The engine's names of a pod's named volumes (as the general plugin names them).
fn pod_volumes(task: &Task) -> Vec<String> {
    let Some(pod) = &task.spec.pod else {
        return Vec::new();
    };
    pod.spec
        .volumes
        .iter()
        .map(|volume| format!("cube-{}-{volume}", task.id.simple()))
        .collect()
}

/// The images a task's containers run.
fn task_images(task: &Task) -> Vec<String> {
    match &task.spec.pod {
        Some(pod) => pod
            .spec
            .services
            .iter()
            .map(|service| service.image.clone())
            .collect(),
        None => vec![task.spec.image.clone()],
    }
}

/// How a launch step's failure names its container: a pod's by its service, a single
/// container not at all (the task is the container).
fn step_prefix(plan: &LaunchPlan, container: &PlannedContainer) -> String {
    if plan.pod {
        format!("container {}: ", container.name)
    } else {
        String::new()
    }
}

/// The plan's containers in the stages a launch goes through: the plan's order cut wherever a
/// container must wait for one before it. The infra container is a stage of its own (the
/// others join its network namespace, which exists once it runs); after it, a container opens a
/// new stage when it depends on one in the current stage, so that services that do not wait on
/// each other are created and started together, and the plan's order is kept otherwise.
fn stages(containers: &[PlannedContainer]) -> Vec<Vec<&PlannedContainer>> {
    let mut stages: Vec<Vec<&PlannedContainer>> = Vec::new();
    for container in containers {
        let joins_current = stages.last().is_some_and(|stage| {
            !container.infra
                && !stage.iter().any(|earlier| earlier.infra)
                && !container.depends_on.iter().any(|dependency| {
                    stage
                        .iter()
                        .any(|earlier| earlier.name == dependency.service)
                })
        });
        match stages.last_mut() {
            Some(stage) if joins_current => stage.push(container),
            _ => stages.push(vec![container]),
        }
    }
    stages
}

/// An event the pod monitor looks at.
pub(crate) fn wakes_the_monitor(event: &RuntimeEvent) -> bool {
    matches!(
        event,
        RuntimeEvent::Died { .. }
            | RuntimeEvent::Destroyed { .. }
            | RuntimeEvent::HealthChanged { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(running: bool, exit_code: Option<i64>, health: Option<Health>) -> ContainerInfo {
        ContainerInfo {
            id: "c".into(),
            name: "n".into(),
            running,
            exit_code,
            health,
            ..ContainerInfo::default()
        }
    }

    fn pod(
        infra: ContainerInfo,
        a: Option<ContainerInfo>,
        b: Option<ContainerInfo>,
    ) -> Vec<(String, bool, Option<ContainerInfo>)> {
        vec![
            (INFRA.into(), true, Some(infra)),
            ("a".into(), false, a),
            ("b".into(), false, b),
        ]
    }

    fn planned(name: &str, infra: bool, depends_on: &[(&str, Condition)]) -> PlannedContainer {
        PlannedContainer {
            name: name.into(),
            infra,
            spec: cube_runtime::ContainerSpec {
                name: name.into(),
                image: "i".into(),
                ..Default::default()
            },
            depends_on: depends_on
                .iter()
                .map(|(service, condition)| cube_types::pod::Dependency {
                    service: service.to_string(),
                    condition: *condition,
                })
                .collect(),
        }
    }

    fn names(stages: Vec<Vec<&PlannedContainer>>) -> Vec<Vec<&str>> {
        stages
            .into_iter()
            .map(|stage| stage.into_iter().map(|c| c.name.as_str()).collect())
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn an_engine_call_answering_late_is_waited_for_not_cut_short() {
        let started = tokio::time::Instant::now();
        let answer = told_if_slow(uuid::Uuid::nil(), "start", async {
            tokio::time::sleep(ENGINE_PATIENCE * 3 + std::time::Duration::from_secs(1)).await;
            "started"
        })
        .await;
        assert_eq!(answer, "started");
        assert!(started.elapsed() > ENGINE_PATIENCE * 3);
    }

    #[test]
    fn services_that_wait_on_nothing_start_together_after_the_infra_container_and_the_order_holds()
    {
        let independent = [
            planned(INFRA, true, &[]),
            planned("server", false, &[]),
            planned("client", false, &[]),
        ];
        assert_eq!(
            names(stages(&independent)),
            vec![vec![INFRA], vec!["server", "client"]]
        );
        let ordered = [
            planned(INFRA, true, &[]),
            planned("db", false, &[]),
            planned("cache", false, &[]),
            planned("app", false, &[("db", Condition::Healthy)]),
            planned("proxy", false, &[("app", Condition::Started)]),
            planned("logs", false, &[("db", Condition::Started)]),
            planned("seed", false, &[("db", Condition::Healthy)]),
            planned("web", false, &[("seed", Condition::CompletedSuccessfully)]),
        ];
        assert_eq!(
            names(stages(&ordered)),
            vec![
                vec![INFRA],
                vec!["db", "cache"],
                vec!["app"],
                vec!["proxy", "logs", "seed"],
                vec!["web"],
            ],
            "a container waits for its dependencies' stage; one whose dependency is earlier \
             joins the current stage"
        );
        let single = [planned("web", false, &[])];
        assert_eq!(names(stages(&single)), vec![vec!["web"]]);
    }

    #[test]
    fn a_pod_runs_while_its_services_run_and_is_healthy_once_all_checks_pass() {
        let running = pod(
            info(true, None, None),
            Some(info(true, None, Some(Health::Healthy))),
            Some(info(true, None, Some(Health::Starting))),
        );
        assert_eq!(
            assess(&running).0,
            Verdict::Running {
                health: Some(Health::Starting)
            }
        );
        let healthy = pod(
            info(true, None, None),
            Some(info(true, None, Some(Health::Healthy))),
            Some(info(false, Some(0), None)),
        );
        assert_eq!(
            assess(&healthy).0,
            Verdict::Running {
                health: Some(Health::Healthy)
            },
            "a service that finished its work with 0 does not bring the pod down"
        );
    }

    #[test]
    fn one_container_killed_or_unhealthy_or_gone_fails_the_pod_naming_it() {
        let killed = pod(
            info(true, None, None),
            Some(info(false, Some(137), None)),
            Some(info(true, None, None)),
        );
        match assess(&killed).0 {
            Verdict::Failed { reason, .. } => {
                assert_eq!(reason, "container a: killed (exit code 137, SIGKILL)")
            }
            other => panic!("{other:?}"),
        }
        let unhealthy = pod(
            info(true, None, None),
            Some(info(true, None, None)),
            Some(info(true, None, Some(Health::Unhealthy))),
        );
        assert!(
            matches!(assess(&unhealthy).0, Verdict::Failed { reason, .. } if reason.contains("container b: unhealthy"))
        );
        let gone = pod(info(true, None, None), None, Some(info(true, None, None)));
        assert!(
            matches!(assess(&gone).0, Verdict::Failed { reason, .. } if reason.contains("a disappeared"))
        );
        let infra = pod(
            info(false, Some(137), None),
            Some(info(true, None, None)),
            Some(info(true, None, None)),
        );
        assert!(
            matches!(assess(&infra).0, Verdict::Failed { reason, .. } if reason.contains("infra"))
        );
    }

    #[test]
    fn a_pod_whose_services_all_finished_with_zero_is_completed() {
        let done = pod(
            info(true, None, None),
            Some(info(false, Some(0), None)),
            Some(info(false, Some(0), None)),
        );
        assert_eq!(assess(&done).0, Verdict::Completed);
    }
}
