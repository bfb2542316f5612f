//! A pod container's first health checks, run by Cube as soon as the container starts.
//!
//! Docker runs a container's health check for the first time one `interval` after the start
//! (the engine shipped here, 20.10, has no `start_interval`), so a service that answers at
//! once still reads `starting` for a whole interval: 30 s by default. Cube runs the same test
//! in the container itself right after the start, then again after 25 ms, 50 ms, ... (at most
//! 1 s apart) until one passes or Docker's own first check is due. A pass counts as healthy
//! while Docker still says `starting`; once Docker has a verdict of its own, Docker's wins
//! (three failures in a row still make the container unhealthy and bring the pod down).
//!
//! The checks run on the worker's health loop ([`crate::worker::Worker::run_health_checks`]);
//! a pass asks the pod monitor to look again, and wakes a launch waiting on the container
//! (`depends_on` with `condition: service_healthy`).

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use cube_runtime::ContainerInfo;
use cube_types::Health;
use cube_types::pod::Healthcheck;
use tokio::sync::Notify;
use tokio::time::Instant;
use uuid::Uuid;

/// The pause before the second check; each next one waits twice as long as the last.
pub(crate) const FIRST_RETRY: Duration = Duration::from_millis(25);
/// The longest pause between two first checks.
pub(crate) const MAX_RETRY: Duration = Duration::from_secs(1);
/// Docker's defaults for a health check that leaves them out.
const DOCKER_INTERVAL: Duration = Duration::from_secs(30);
const DOCKER_TIMEOUT: Duration = Duration::from_secs(30);

/// One container's first checks, queued when it started.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FirstCheck {
    pub task_id: Uuid,
    pub container_id: String,
    /// What runs in the container.
    pub command: Vec<String>,
    /// How long one run may take.
    pub timeout: Duration,
    /// When Docker's own first check is due: the first checks stop there.
    pub until: Instant,
}

impl FirstCheck {
    /// The first checks of a container with `check` that started at `started`; none when the
    /// check runs nothing (`NONE`, or no test).
    pub(crate) fn of(
        task_id: Uuid,
        container_id: &str,
        check: &Healthcheck,
        started: Instant,
    ) -> Option<FirstCheck> {
        Some(FirstCheck {
            task_id,
            container_id: container_id.to_string(),
            command: command_of(&check.test)?,
            timeout: check.timeout.unwrap_or(DOCKER_TIMEOUT),
            until: started + check.interval.unwrap_or(DOCKER_INTERVAL),
        })
    }
}

/// The command a health check's test runs, as Docker runs it: `CMD` with its arguments,
/// `CMD-SHELL` through `/bin/sh -c`; none for `NONE` or an empty test.
pub(crate) fn command_of(test: &[String]) -> Option<Vec<String>> {
    match test.split_first() {
        Some((kind, args)) if kind == "CMD" && !args.is_empty() => Some(args.to_vec()),
        Some((kind, args)) if kind == "CMD-SHELL" && !args.is_empty() => Some(vec![
            "/bin/sh".to_string(),
            "-c".to_string(),
            args.join(" "),
        ]),
        _ => None,
    }
}

/// The first checks waiting to run, and the containers whose first check passed.
#[derive(Debug, Default)]
pub(crate) struct FirstChecks {
    queued: Mutex<Vec<FirstCheck>>,
    added: Notify,
    /// Containers whose first check passed while Docker still said `starting`.
    passed: Mutex<HashSet<String>>,
    /// Wakes a launch waiting for a container's health when one passes.
    passed_one: Notify,
}

impl FirstChecks {
    /// Queues a container's first checks for the health loop.
    pub(crate) fn queue(&self, check: FirstCheck) {
        lock(&self.queued).push(check);
        self.added.notify_one();
    }

    /// Takes what was queued.
    pub(crate) fn take(&self) -> Vec<FirstCheck> {
        std::mem::take(&mut *lock(&self.queued))
    }

    /// Resolves once something was queued (a queue before the wait is not missed: the
    /// notification is kept until it is waited for).
    pub(crate) async fn added(&self) {
        self.added.notified().await
    }

    /// Records a pass and wakes whoever waits for one.
    pub(crate) fn pass(&self, container_id: &str) {
        lock(&self.passed).insert(container_id.to_string());
        self.passed_one.notify_waiters();
    }

    /// A future that resolves at the next pass: made (and enabled) before a look at a
    /// container, so that a pass between the look and the wait is seen.
    pub(crate) fn next_pass(&self) -> tokio::sync::futures::Notified<'_> {
        self.passed_one.notified()
    }

    /// The health to go by for what the engine says of a container: healthy while Docker
    /// still says `starting` and a first check passed. A container Docker has a verdict on
    /// is forgotten here.
    pub(crate) fn apply(&self, info: &mut ContainerInfo) {
        let mut passed = lock(&self.passed);
        if passed.is_empty() {
            return;
        }
        match info.health {
            Some(Health::Starting) if info.running && passed.contains(&info.id) => {
                info.health = Some(Health::Healthy);
            }
            Some(Health::Starting) if info.running => {}
            _ => {
                passed.remove(&info.id);
            }
        }
    }

    /// Forgets containers that were stopped or removed.
    pub(crate) fn forget<'a>(&self, container_ids: impl IntoIterator<Item = &'a String>) {
        let mut passed = lock(&self.passed);
        if passed.is_empty() {
            return;
        }
        for id in container_ids {
            passed.remove(id);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Each critical section is one collection operation: nothing half-done to trip on.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: &str, running: bool, health: Option<Health>) -> ContainerInfo {
        ContainerInfo {
            id: id.to_string(),
            running,
            health,
            ..ContainerInfo::default()
        }
    }

    #[test]
    fn a_test_runs_as_docker_runs_it() {
        let words = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            command_of(&words(&["CMD", "wget", "-q", "http://localhost/"])),
            Some(words(&["wget", "-q", "http://localhost/"]))
        );
        assert_eq!(
            command_of(&words(&["CMD-SHELL", "test -f /health"])),
            Some(words(&["/bin/sh", "-c", "test -f /health"]))
        );
        assert_eq!(command_of(&words(&["NONE"])), None);
        assert_eq!(command_of(&words(&["CMD"])), None);
        assert_eq!(command_of(&[]), None);
    }

    #[test]
    fn a_pass_counts_only_while_docker_says_starting() {
        let checks = FirstChecks::default();
        let mut before = info("a", true, Some(Health::Starting));
        checks.apply(&mut before);
        assert_eq!(before.health, Some(Health::Starting), "nothing passed yet");
        checks.pass("a");
        let mut starting = info("a", true, Some(Health::Starting));
        checks.apply(&mut starting);
        assert_eq!(starting.health, Some(Health::Healthy));
        let mut other = info("b", true, Some(Health::Starting));
        checks.apply(&mut other);
        assert_eq!(other.health, Some(Health::Starting), "another container");
        // Docker's own verdict wins, and the pass is forgotten.
        let mut unhealthy = info("a", true, Some(Health::Unhealthy));
        checks.apply(&mut unhealthy);
        assert_eq!(unhealthy.health, Some(Health::Unhealthy));
        let mut again = info("a", true, Some(Health::Starting));
        checks.apply(&mut again);
        assert_eq!(again.health, Some(Health::Starting));
        // A container that ended is not healthy whatever passed.
        checks.pass("c");
        let mut ended = info("c", false, Some(Health::Starting));
        checks.apply(&mut ended);
        assert_eq!(ended.health, Some(Health::Starting));
    }
}
