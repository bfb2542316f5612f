//! Health checks: each running task with a `HealthCheck` is probed on its published host port
//! on this machine, every `HealthCheckInterval`. `HealthCheckRetries` failures in a row make it
//! unhealthy: the worker stops its container and records the task `Failed` with the reason.
//! Whether it runs again is the manager's decision (its restart policy), not the worker's.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use cube_types::{HealthCheckType, Task};
use tokio::sync::Notify;
use tokio::time::Instant;
use uuid::Uuid;

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
        let wanted = task.state == cube_types::State::Running
            && task.has_health_check()
            && task.health != Some(cube_types::Health::Unhealthy);
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

/// What to probe for a task: the first published host port, on this machine.
pub(crate) fn probe_target(task: &Task) -> Option<u16> {
    task.host_ports
        .values()
        .flat_map(|bindings| bindings.iter())
        .find_map(|binding| binding.host_port.parse::<u16>().ok())
}

/// One probe: `Ok` when healthy, else what went wrong, in words.
pub(crate) async fn probe(http: &reqwest::Client, task: &Task) -> Result<(), String> {
    let Some(port) = probe_target(task) else {
        return Err("the task has no published host port to probe".to_string());
    };
    let timeout = task.health_timeout();
    match task.health_check_type.unwrap_or(HealthCheckType::Http) {
        HealthCheckType::Tcp => {
            match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(("127.0.0.1", port)))
                .await
            {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(err)) => Err(format!("TCP connect to port {port}: {err}")),
                Err(_) => Err(format!(
                    "TCP connect to port {port}: no answer within {timeout:?}"
                )),
            }
        }
        HealthCheckType::Http => {
            let path = task.health_check.trim();
            let url = format!("http://127.0.0.1:{port}{path}");
            match http.get(&url).timeout(timeout).send().await {
                Ok(answer) if answer.status().is_success() => Ok(()),
                Ok(answer) => Err(format!("GET {path} answered {}", answer.status().as_u16())),
                Err(err) if err.is_timeout() => {
                    Err(format!("GET {path}: no answer within {timeout:?}"))
                }
                Err(err) => Err(format!("GET {path}: {err}")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cube_types::{HostBinding, State};

    fn running_with_check() -> Task {
        let mut task = Task::new("t", "img");
        task.state = State::Running;
        task.health_check = "/health".into();
        task.health_check_interval = Some(Duration::from_secs(2));
        task.host_ports.insert(
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
        ended.state = State::Failed;
        schedule.track(&ended);
        assert_eq!(schedule.next_due(), None, "an ended task is not probed");
    }

    #[test]
    fn the_probe_goes_to_the_first_published_host_port() {
        assert_eq!(probe_target(&running_with_check()), Some(49153));
        assert_eq!(probe_target(&Task::new("t", "img")), None);
    }
}
