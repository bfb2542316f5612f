//! The containers Docker lists by label, as `docker ps --filter label=…` does (the query Cube's
//! integration tests check containers with): one list call, no inspect per container, so a
//! benchmark can poll it every few milliseconds. Both peers are looked at this way — Cube's
//! worker by its `cube.node` label, a Swarm service by `com.docker.swarm.service.name`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bollard::Docker;
use bollard::models::ContainerSummary;
use bollard::query_parameters::{ListContainersOptionsBuilder, RemoveContainerOptionsBuilder};

/// The local Docker engine, at the API version both ends speak.
pub(crate) async fn connect() -> anyhow::Result<Docker> {
    Docker::connect_with_local_defaults()?
        .negotiate_version()
        .await
        .context("connecting to Docker")
}

/// Which containers a list holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Listed {
    /// Those Docker reports running.
    Running,
    /// Every one, running or not (`docker ps -a`).
    All,
    /// Those running whose Docker health check passed (`--filter health=healthy`).
    Healthy,
}

/// The IDs of the containers that carry `label` (`KEY=VALUE`).
pub(crate) async fn with_label(
    docker: &Docker,
    label: &str,
    listed: Listed,
) -> anyhow::Result<Vec<String>> {
    Ok(list(docker, label, listed)
        .await?
        .into_iter()
        .filter_map(|container| container.id)
        .collect())
}

/// The commands of the containers that carry `label`, as Docker lists them (`docker ps
/// --no-trunc`'s COMMAND: the program and its arguments, joined by spaces).
pub(crate) async fn commands_with_label(
    docker: &Docker,
    label: &str,
    listed: Listed,
) -> anyhow::Result<Vec<String>> {
    Ok(list(docker, label, listed)
        .await?
        .into_iter()
        .map(|container| container.command.unwrap_or_default())
        .collect())
}

async fn list(
    docker: &Docker,
    label: &str,
    listed: Listed,
) -> anyhow::Result<Vec<ContainerSummary>> {
    let mut filters = HashMap::from([("label".to_string(), vec![label.to_string()])]);
    if matches!(listed, Listed::Running | Listed::Healthy) {
        filters.insert("status".to_string(), vec!["running".to_string()]);
    }
    if listed == Listed::Healthy {
        filters.insert("health".to_string(), vec!["healthy".to_string()]);
    }
    let options = ListContainersOptionsBuilder::new()
        .all(true)
        .filters(&filters)
        .build();
    docker
        .list_containers(Some(options))
        .await
        .with_context(|| format!("listing the containers labelled {label}"))
}

/// Waits until no container that carries `label` runs (at most 60 s). A stopped task's
/// container is kept, stopped, for its logs until the task is removed (`cube rm`, `cube
/// prune`, the manager's `--gc-after`), so "none running" is when a run's work is over; the
/// last sweep ([`remove_all`]) removes what is left.
pub(crate) async fn await_none_running(docker: &Docker, label: &str) -> anyhow::Result<()> {
    let started = Instant::now();
    while !with_label(docker, label, Listed::Running).await?.is_empty() {
        if started.elapsed() > Duration::from_secs(60) {
            bail!("the containers labelled {label} still run after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Removes the stopped containers that carry `label` — those of tasks that have ended, which
/// the worker keeps for their logs — and waits until Docker lists none (at most 60 s), so that
/// the next side of a benchmark does not meet Docker removing them.
pub(crate) async fn remove_stopped(docker: &Docker, label: &str) -> anyhow::Result<()> {
    let options = RemoveContainerOptionsBuilder::new().build();
    let mut removals = tokio::task::JoinSet::new();
    for id in with_label(docker, label, Listed::All).await? {
        let (docker, options) = (docker.clone(), options.clone());
        removals.spawn(async move {
            docker
                .remove_container(&id, Some(options))
                .await
                .with_context(|| format!("removing container {id}"))
        });
    }
    while let Some(removed) = removals.join_next().await {
        removed??;
    }
    let started = Instant::now();
    while !with_label(docker, label, Listed::All).await?.is_empty() {
        if started.elapsed() > Duration::from_secs(60) {
            bail!("the containers labelled {label} are still there 60 s after their removal");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// [`remove_all`], said on standard error: how many were left, or why they could not be
/// removed (a benchmark's figures are printed either way).
pub(crate) async fn sweep(docker: &Docker, label: &str) {
    match remove_all(docker, label).await {
        Ok(0) => {}
        Ok(removed) => eprintln!("removed {removed} containers left labelled {label}"),
        Err(err) => eprintln!("sweeping the containers labelled {label}: {err:#}"),
    }
}

/// Force-removes every container that carries `label`: the last sweep after a run that
/// failed half-way, once the processes that owned them are gone. Returns how many it removed.
pub(crate) async fn remove_all(docker: &Docker, label: &str) -> anyhow::Result<usize> {
    let ids = with_label(docker, label, Listed::All).await?;
    let options = RemoveContainerOptionsBuilder::new().force(true).build();
    let mut removed = 0;
    for id in &ids {
        match docker.remove_container(id, Some(options.clone())).await {
            Ok(()) => removed += 1,
            // Gone already, or going: either way it is not this sweep's to report.
            Err(err) => eprintln!("removing container {id}: {err}"),
        }
    }
    Ok(removed)
}
