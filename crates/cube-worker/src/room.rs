//! What the worker holds of what it offers, and the admission of a new run against it.
//!
//! The manager places a task only where its own view of the node leaves room, but that view
//! can be behind the worker's: a worker that was paused past the heartbeat grace and comes
//! back still runs the copies the manager has since replaced elsewhere (strays, stopped once
//! the manager follows the node again), and a stop takes up to the stop timeout. A run sent in
//! that window would put more on the node than it offers. So the worker admits a new run only
//! when it fits beside every task it holds (`Scheduled` or `Running`), with the scheduler's own
//! filters, and otherwise answers 503: the manager's dispatch is tried again after its backoff,
//! by which time the strays are gone. Found by the chaos run (`cube-bench chaos`).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use cube_scheduler::filter::{CpuFilter, DiskFilter, MemoryFilter};
use cube_scheduler::{Filter, NodeView, TaskRequest};
use cube_types::{Resources, State, Task};
use uuid::Uuid;

/// CPU is summed in billionths of a core, so that adding and taking away the same task leaves
/// the sum exactly as it was (a sum of `f64` would drift).
const NANOS_PER_CORE: f64 = 1e9;

/// The resources of every task the worker holds, and their sum, kept as tasks are saved: a
/// submission reads the sum, and a heartbeat the count of running tasks, without walking every
/// task.
#[derive(Debug, Default)]
pub(crate) struct Held {
    /// The tasks that are `Running`.
    running: HashSet<Uuid>,
    by_task: HashMap<Uuid, (u64, u64, u64)>,
    cpu_nanos: u64,
    memory: u64,
    disk: u64,
}

impl Held {
    /// Every task a worker's store holds.
    pub(crate) fn of<'a>(tasks: impl IntoIterator<Item = &'a Task>) -> Held {
        let mut held = Held::default();
        for task in tasks {
            held.record(task);
        }
        held
    }

    /// A task as saved: held while `Scheduled` or `Running`, let go otherwise.
    pub(crate) fn record(&mut self, task: &Task) {
        if task.status.state == State::Running {
            self.running.insert(task.id);
        } else {
            self.running.remove(&task.id);
        }
        if matches!(task.status.state, State::Scheduled | State::Running) {
            self.hold(task);
        } else {
            self.release(task.id);
        }
    }

    /// How many tasks are `Running`.
    pub(crate) fn running(&self) -> usize {
        self.running.len()
    }

    fn hold(&mut self, task: &Task) {
        self.release(task.id);
        let cpu = (task.spec.cpu.max(0.0) * NANOS_PER_CORE).round() as u64;
        let entry = (cpu, task.spec.memory, task.spec.disk);
        self.cpu_nanos = self.cpu_nanos.saturating_add(entry.0);
        self.memory = self.memory.saturating_add(entry.1);
        self.disk = self.disk.saturating_add(entry.2);
        self.by_task.insert(task.id, entry);
    }

    /// A task gone from the worker, or ended.
    pub(crate) fn forget(&mut self, id: Uuid) {
        self.running.remove(&id);
        self.release(id);
    }

    /// Lets go of a task's resources (it keeps its place among the running ones).
    fn release(&mut self, id: Uuid) {
        if let Some((cpu, memory, disk)) = self.by_task.remove(&id) {
            self.cpu_nanos -= cpu;
            self.memory -= memory;
            self.disk -= disk;
        }
    }

    pub(crate) fn allocated(&self) -> Resources {
        Resources {
            cpu: self.cpu_nanos as f64 / NANOS_PER_CORE,
            memory: self.memory,
            disk: self.disk,
        }
    }

    /// Holds `task` when it fits beside what is held in `capacity`; otherwise says what it
    /// lacks, with the scheduler's words ("needs 0.25 CPU, 0.1 free").
    pub(crate) fn admit(&mut self, task: &Task, capacity: Resources) -> Result<(), String> {
        let request = TaskRequest::for_task(task);
        let node = NodeView {
            name: String::new(),
            ready: true,
            ineligible: false,
            capacity,
            allocated: self.allocated(),
            task_count: self.by_task.len(),
            host_ports_taken: BTreeSet::new(),
            labels: Arc::default(),
            host_policy: None,
        };
        let filters: [&dyn Filter; 3] = [&CpuFilter, &MemoryFilter, &DiskFilter];
        for filter in filters {
            filter.check(&request, &node)?;
        }
        self.hold(task);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(cpu: f64, memory: u64, state: State) -> Task {
        let mut task = Task::new("t", "cube-sample:latest");
        task.spec.cpu = cpu;
        task.spec.memory = memory;
        task.status.state = state;
        task
    }

    const MIB: u64 = 1 << 20;

    fn capacity() -> Resources {
        Resources {
            cpu: 1.0,
            memory: 1024 * MIB,
            disk: 0,
        }
    }

    #[test]
    fn a_run_that_does_not_fit_beside_what_is_held_is_refused_with_the_reason() {
        let strays: Vec<Task> = (0..4)
            .map(|_| task(0.25, 64 * MIB, State::Running))
            .collect();
        let mut held = Held::of(&strays);
        let refused = held.admit(&task(0.1, 16 * MIB, State::Scheduled), capacity());
        assert_eq!(refused, Err("needs 0.1 CPU, 0.0 free".to_string()));
        // A stray stopped makes room.
        let mut stopped = strays[0].clone();
        stopped.status.state = State::Completed;
        held.record(&stopped);
        assert_eq!(
            held.admit(&task(0.1, 16 * MIB, State::Scheduled), capacity()),
            Ok(())
        );
        let big = task(0.1, 1000 * MIB, State::Scheduled);
        assert!(
            held.admit(&big, capacity())
                .is_err_and(|why| why.contains("memory")),
            "memory is held to the capacity too"
        );
    }

    #[test]
    fn the_sum_comes_back_exactly_when_tasks_come_and_go() {
        let mut held = Held::default();
        let tasks: Vec<Task> = (0..1000)
            .map(|i| task(0.1 + f64::from(i) * 1e-4, MIB, State::Running))
            .collect();
        for task in &tasks {
            held.record(task);
        }
        for task in &tasks {
            held.forget(task.id);
        }
        assert_eq!(held.allocated(), Resources::default());
        // Saving the same task twice holds it once.
        held.record(&tasks[0]);
        held.record(&tasks[0]);
        assert_eq!(held.allocated().memory, MIB);
    }

    #[test]
    fn a_task_that_asks_nothing_always_fits() {
        let mut held = Held::of(&[task(1.0, 1024 * MIB, State::Running)]);
        assert_eq!(
            held.admit(&task(0.0, 0, State::Scheduled), capacity()),
            Ok(())
        );
    }
}
