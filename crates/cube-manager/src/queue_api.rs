//! The waiting list as the API shows it: `GET /queue`, a request's entry, and `GET
//! /services`. The queue controller (`queue_controller.rs`) keeps the list.

use cube_types::State;
use cube_types::queue::{Endpoint, QueueState, RequestKind};
use uuid::Uuid;

use crate::cluster::lock;
use crate::manager::Manager;
use crate::queue::in_order;
use crate::queue_controller::{
    ListedEntry, QueueView, ServiceView, Submitted, endpoint_of, hosts, services_of, waiting_for,
};

impl Manager {
    /// `GET /queue`: every entry in the queue's order, with its position and why it waits.
    /// The entries are shared, not copied: the answer is written after the lock is let go.
    pub fn queue(&self) -> Vec<ListedEntry> {
        let state = lock(&self.cluster.state);
        let hosts = hosts(&state);
        in_order(&state.queue)
            .into_iter()
            .map(|(entry, position)| {
                let waiting_for = (entry.state == QueueState::Waiting)
                    .then(|| waiting_for(&state, &entry))
                    .flatten();
                ListedEntry {
                    request: Submitted::of(&state, &entry),
                    services: services_of(&state, &entry, &hosts),
                    entry,
                    position,
                    waiting_for,
                }
            })
            .collect()
    }

    /// A job's entry as `GET /queue` shows it, if it has one.
    pub(crate) fn queue_entry_of_job(&self, name: &str) -> Option<QueueView> {
        self.queue_view_of(&RequestKind::Job.key(name))
    }

    /// A task's entry as `GET /queue` shows it, if it has one.
    pub fn queue_entry_of_task(&self, id: Uuid) -> Option<QueueView> {
        self.queue_view_of(&RequestKind::Task.key(&id.to_string()))
    }

    fn queue_view_of(&self, key: &str) -> Option<QueueView> {
        let state = lock(&self.cluster.state);
        let entry = state.queue.get(key)?.clone();
        let position = if entry.state == QueueState::Waiting {
            in_order(&state.queue)
                .into_iter()
                .find(|(other, _)| other.key() == key)
                .map_or(0, |(_, position)| position)
        } else {
            0
        };
        let waiting_for = (entry.state == QueueState::Waiting)
            .then(|| waiting_for(&state, &entry))
            .flatten();
        let mut shown = (*entry).clone();
        if let Some(submitted) = Submitted::of(&state, &entry) {
            shown.request = submitted.value();
        }
        shown.services = services_of(&state, &entry, &hosts(&state));
        Some(QueueView {
            entry: shown,
            position,
            waiting_for,
        })
    }

    /// `GET /services`: every claimed bare task, and every job group with a copy that runs
    /// and is healthy, with those copies' addresses.
    pub fn services(&self) -> Vec<ServiceView> {
        let state = lock(&self.cluster.state);
        let hosts = hosts(&state);
        let mut services: Vec<ServiceView> = Vec::new();
        for entry in state.queue.values() {
            if entry.kind == RequestKind::Task && entry.state == QueueState::Claimed {
                let endpoints = services_of(&state, entry, &hosts);
                let name = endpoints
                    .first()
                    .map_or(entry.id.clone(), |endpoint| endpoint.name.clone());
                services.push(ServiceView {
                    name,
                    kind: RequestKind::Task,
                    job: String::new(),
                    project: entry.project().to_string(),
                    endpoints,
                });
            }
        }
        for record in state.jobs.values().filter(|record| !record.stopped) {
            let tasks = state.cache.of_job(&record.job.key());
            for group in &record.job.groups {
                let endpoints: Vec<Endpoint> = tasks
                    .iter()
                    .filter(|task| task.spec.group == group.name)
                    .filter(|task| task.spec.desired_state == State::Running && task.is_healthy())
                    .map(|task| endpoint_of(task, &hosts))
                    .collect();
                if endpoints.is_empty() {
                    continue;
                }
                let mut endpoints = endpoints;
                endpoints.sort_by(|a, b| (&a.name, a.id).cmp(&(&b.name, b.id)));
                services.push(ServiceView {
                    name: format!("{}.{}", record.job.name, group.name),
                    kind: RequestKind::Job,
                    job: record.job.name.clone(),
                    project: record.job.project().to_string(),
                    endpoints,
                });
            }
        }
        services.sort_by(|a, b| a.name.cmp(&b.name));
        services
    }
}
