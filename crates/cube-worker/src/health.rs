//! Health checks: each running task with a `HealthCheck` is probed on its container port,
//! from inside the container's network namespace (`namespace.rs`), every
//! `HealthCheckInterval`. `HealthCheckRetries` failures in a row make it
//! unhealthy: the worker stops its container and records the task `Failed` with the reason.
//! Whether it runs again is the manager's decision (its restart policy), not the worker's.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use cube_types::{HealthCheckType, Task};
use tokio::sync::Notify;
use tokio::time::Instant;
use uuid::Uuid;

use crate::namespace::{self, ProbeKind};

/// The first probe of a task comes this soon after it starts (or its interval, if shorter):
/// soon enough to report healthy quickly, late enough for a server to be listening.
const FIRST_PROBE_AFTER: Duration = Duration::from_millis(500);

/// When a task could not even be read for its probe, try again this much later.
pub(crate) const RETRY_AFTER_ERROR: Duration = Duration::from_secs(1);

/// Where a task's slot is parked while its probe runs (the probe's own timeout ends it
/// much sooner and reschedules it).
const IN_FLIGHT: Duration = Duration::from_secs(3600);

/// When each health-checked task is probed next.
#[derive(Debug, Default)]
pub(crate) struct HealthSchedule {
    /// A `std` mutex: map access only, never held across an await.
    due: Mutex<HashMap<Uuid, Instant>>,
    /// Wakes the health loop when a task is added, so that it recomputes its next wake-up.
    added: Notify,
}

impl HealthSchedule {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Instant>> {
        self.due
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Follows a task's record: a running task with a health check is probed, any other not.
    pub(crate) fn track(&self, task: &Task) {
        // A pod's health checks are the engine's (its compose file's), not probes.
        let wanted = task.status.state == cube_types::State::Running
            && task.spec.pod.is_none()
            && task.has_health_check()
            && task.status.run.health != Some(cube_types::Health::Unhealthy);
        let mut due = self.lock();
        if !wanted {
            due.remove(&task.id);
            return;
        }
        if let std::collections::hash_map::Entry::Vacant(slot) = due.entry(task.id) {
            slot.insert(Instant::now() + FIRST_PROBE_AFTER.min(task.health_interval()));
            drop(due);
            self.added.notify_one();
        }
    }

    /// The tasks whose probe is due at `now`. Each is set aside until its probe ends and
    /// [`HealthSchedule::reschedule`] gives it its next slot, so probes of one task never
    /// overlap.
    pub(crate) fn take_due(&self, now: Instant) -> Vec<Uuid> {
        let mut due = self.lock();
        let ready: Vec<Uuid> = due
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in &ready {
            due.insert(*id, now + IN_FLIGHT);
        }
        ready
    }

    /// Sets a task's next probe, unless it stopped being tracked meanwhile.
    pub(crate) fn reschedule(&self, id: Uuid, at: Instant) {
        if let Some(slot) = self.lock().get_mut(&id) {
            *slot = at;
        }
    }

    /// When the next probe is due, if any.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.lock().values().min().copied()
    }

    pub(crate) async fn added(&self) {
        self.added.notified().await
    }
}

/// The container port a task's health is probed on: its first TCP port, published or only
/// exposed (in the order of their names, published ones first). The probe goes to this port
/// inside the container, not to the host port Docker publishes it on (see `namespace.rs`).
pub(crate) fn probe_port(task: &Task) -> Option<u16> {
    task.spec
        .port_bindings
        .keys()
        .chain(task.spec.exposed_ports.iter())
        .find_map(|port| tcp_port_number(port))
}

/// `"7777/tcp"` or `"7777"` → 7777; a UDP or SCTP port, or no number, → `None`.
fn tcp_port_number(port: &str) -> Option<u16> {
    let (number, protocol) = port.split_once('/').unwrap_or((port, "tcp"));
    if !protocol.trim().eq_ignore_ascii_case("tcp") {
        return None;
    }
    number.trim().parse().ok().filter(|number| *number > 0)
}

/// One probe of the task whose container's first process is `pid` (`None`: the container
/// does not run): `Ok` when healthy, else what went wrong, in words.
pub(crate) async fn probe(task: &Task, pid: Option<u32>) -> Result<(), String> {
    let Some(port) = probe_port(task) else {
        return Err("the task exposes no TCP port to probe".to_string());
    };
    let Some(pid) = pid else {
        return Err("the container is not running".to_string());
    };
    let kind = match task.spec.health_check_type.unwrap_or(HealthCheckType::Http) {
        HealthCheckType::Tcp => ProbeKind::Tcp,
        HealthCheckType::Http => ProbeKind::Http {
            path: task.spec.health_check.trim().to_string(),
        },
    };
    namespace::probe(pid, port, kind, task.health_timeout()).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use cube_types::{HostBinding, State};

    fn running_with_check() -> Task {
        let mut task = Task::new("t", "img");
        task.status.state = State::Running;
        task.spec.health_check = "/health".into();
        task.spec.health_check_interval = Some(Duration::from_secs(2));
        task.status.run.host_ports.insert(
            "7777/tcp".into(),
            vec![HostBinding {
                host_ip: "0.0.0.0".into(),
                host_port: "49153".into(),
            }],
        );
        task
    }

    #[test]
    fn a_running_task_with_a_check_is_probed_soon_then_every_interval() {
        let schedule = HealthSchedule::default();
        let task = running_with_check();
        let before = Instant::now();
        schedule.track(&task);
        let first = schedule.next_due().unwrap();
        assert!(first >= before + FIRST_PROBE_AFTER && first <= Instant::now() + FIRST_PROBE_AFTER);
        assert!(schedule.take_due(before).is_empty());
        assert_eq!(schedule.take_due(first), vec![task.id]);
        assert!(
            schedule.take_due(first).is_empty(),
            "no second probe while one runs"
        );
        schedule.reschedule(task.id, first + Duration::from_secs(2));
        assert_eq!(schedule.next_due(), Some(first + Duration::from_secs(2)));

        let mut ended = task.clone();
        ended.status.state = State::Failed;
        schedule.track(&ended);
        assert_eq!(schedule.next_due(), None, "an ended task is not probed");
    }

    #[test]
    fn the_probe_goes_to_the_container_port_not_the_host_port() {
        let mut task = running_with_check();
        task.spec
            .port_bindings
            .insert("7777/tcp".into(), String::new());
        assert_eq!(probe_port(&task), Some(7777));
        assert_eq!(probe_port(&Task::new("t", "img")), None);
    }

    #[test]
    fn an_exposed_port_is_enough_to_probe_and_udp_ports_are_skipped() {
        let mut task = Task::new("t", "img");
        task.spec.exposed_ports.insert("53/udp".into());
        assert_eq!(probe_port(&task), None);
        task.spec.exposed_ports.insert("8080/tcp".into());
        assert_eq!(probe_port(&task), Some(8080));
        task.spec.port_bindings.insert("9090".into(), "0".into());
        assert_eq!(
            probe_port(&task),
            Some(9090),
            "a published port comes first"
        );
    }
}
