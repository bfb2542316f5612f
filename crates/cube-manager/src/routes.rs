//! Routes (`cube_types::route`): `GET /routes` and the `Route` events.
//!
//! A route is read from the tasks, never stored: a job group's is its template's (`Route`,
//! or the default when it exposes a TCP port), a bare task's its own. Its backends are the
//! copies that run, whose desired state is still to run, and whose health check passes with
//! no failure counted since (one failed probe takes a copy out at once, before
//! `HealthCheckRetries` fail it), at the address their node publishes the port on.
//!
//! A copy leaves its route the moment the manager decides to stop it (its desired state
//! changes, before its worker hears of it), so that a router following the routes has
//! stopped sending it requests by the time its container gets the signal: the rolling
//! update's drain.
//!
//! The [`RouteWatch`] follows the task and job events and publishes a `Route` event
//! (`Added`, `Updated`, `Removed`; the route as its object) whenever a route's backends,
//! host or port change: what a blocking `GET /routes` waits for, so that a router asks again
//! only when there is something new.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use cube_types::route::{Backend, RouteView, default_name, route_port};
use cube_types::{State, Task};
use tokio_util::sync::CancellationToken;

use crate::cluster::{Cluster, Shared, lock};
use crate::events::{Received, Topic};
use crate::queue_controller::host_of;

/// How many waiting events one look takes at most.
const BATCH: usize = 4096;

/// Each node's host, as its workers reach it: where a copy's published port answers.
trait NodeHosts {
    fn host(&self, node: &str) -> Option<Cow<'_, str>>;
}

/// The tests' hosts, a map of node to host.
#[cfg(test)]
impl NodeHosts for BTreeMap<String, String> {
    fn host(&self, node: &str) -> Option<Cow<'_, str>> {
        self.get(node).map(|host| Cow::Borrowed(host.as_str()))
    }
}

/// The hosts of the nodes' records, read one node at a time as a backend needs one: a look
/// at a few changed tasks, most of which have no route, does not build every node's host
/// under the state's lock (with 1,000 nodes that was a sixth of a busy manager's time).
struct LiveHosts<'a>(&'a Shared);

impl NodeHosts for LiveHosts<'_> {
    fn host(&self, node: &str) -> Option<Cow<'_, str>> {
        self.0
            .nodes
            .get(node)
            .map(|entry| Cow::Owned(host_of(&entry.address)))
    }
}

/// Whether `task` takes requests now (see the module comment).
pub(crate) fn takes_requests(task: &Task) -> bool {
    task.spec.desired_state == State::Running
        && task.is_healthy()
        && task.status.run.health_failures == 0
}

/// A copy as its route's backend, when it takes requests and its node publishes `port`.
fn backend_of(task: &Task, port: &str, hosts: &impl NodeHosts) -> Option<Backend> {
    if !takes_requests(task) {
        return None;
    }
    let binding = task.status.run.host_ports.get(port)?.first()?;
    let node_host = hosts.host(task.status.node_name.as_str())?;
    let host = match binding.host_ip.as_str() {
        "" | "0.0.0.0" | "::" => &*node_host,
        ip => ip,
    };
    let address = if host.contains(':') {
        format!("[{host}]:{}", binding.host_port)
    } else {
        format!("{host}:{}", binding.host_port)
    };
    Some(Backend {
        address,
        id: task.id,
        name: task.name.clone(),
        node: task.status.node_name.to_string(),
    })
}

/// The route of one job's group, from its template; `None` when it exposes no TCP port.
fn job_group_route(
    state: &Shared,
    job_key: &str,
    group: &str,
    hosts: &impl NodeHosts,
) -> Option<RouteView> {
    let record = state.jobs.get(job_key).filter(|record| !record.stopped)?;
    let template = record.job.groups.iter().find(|g| g.name == group)?;
    let spec = &template.task.spec;
    let port = route_port(spec.route.as_ref(), &spec.exposed_ports)?;
    let project = record.job.project().to_string();
    let mut backends: Vec<Backend> = state
        .cache
        .of_job(job_key)
        .iter()
        .filter(|task| task.spec.group == group)
        .filter_map(|task| {
            // A copy of an older version goes by its own port, as its container was made.
            let own = route_port(task.spec.route.as_ref(), &task.spec.exposed_ports)?;
            backend_of(task, &own, hosts)
        })
        .collect();
    backends.sort();
    Some(RouteView {
        name: default_name(&record.job.name, group, "", &project),
        host: spec
            .route
            .as_ref()
            .map(|route| route.host.clone())
            .unwrap_or_default(),
        project,
        job: record.job.name.clone(),
        group: group.to_string(),
        port,
        backends,
    })
}

/// A bare task's route; `None` when it exposes no TCP port or has ended for good.
fn task_route(task: &Task, hosts: &impl NodeHosts) -> Option<RouteView> {
    if !task.spec.job.is_empty() || task.spec.desired_state != State::Running {
        return None;
    }
    let port = route_port(task.spec.route.as_ref(), &task.spec.exposed_ports)?;
    let project = task.spec.project.clone();
    Some(RouteView {
        name: default_name("", "", &task.name, &project),
        host: task
            .spec
            .route
            .as_ref()
            .map(|route| route.host.clone())
            .unwrap_or_default(),
        project,
        job: String::new(),
        group: String::new(),
        backends: backend_of(task, &port, hosts).into_iter().collect(),
        port,
    })
}

/// The declared host of a route spec, when it declares one.
fn declared_host(route: Option<&cube_types::route::RouteSpec>) -> Option<&str> {
    route
        .map(|route| route.host.as_str())
        .filter(|host| !host.is_empty())
}

/// Who else routes `host` (a job's group that has not stopped, or a bare task still to run),
/// in words for the refusal; the job keyed `except` (being submitted again) does not count.
/// A host routes to one service: a router sends it to the first route by project and name
/// and leaves the other out, which a person would not guess, so a second is refused at
/// submission.
pub(crate) fn host_holder(state: &Shared, host: &str, except: Option<&str>) -> Option<String> {
    for (key, record) in &state.jobs {
        if record.stopped || Some(key.as_str()) == except {
            continue;
        }
        for group in &record.job.groups {
            if declared_host(group.task.spec.route.as_ref()) == Some(host) {
                return Some(format!(
                    "group {} of job {} (project {})",
                    group.name,
                    record.job.name,
                    record.job.project()
                ));
            }
        }
    }
    for entry in state.queue.values() {
        if entry.kind != cube_types::queue::RequestKind::Task {
            continue;
        }
        if let Some(task) = crate::queue_controller::task_of(state, entry)
            && task.spec.desired_state == State::Running
            && declared_host(task.spec.route.as_ref()) == Some(host)
        {
            return Some(format!(
                "task {} ({}, project {})",
                task.name, task.id, task.spec.project
            ));
        }
    }
    None
}

/// Refuses a submission whose routes declare a host another job or task routes already, or
/// two of its own groups the same host (409 naming who has it).
pub(crate) fn refuse_taken_hosts(
    state: &Shared,
    routes: &[(&str, Option<&cube_types::route::RouteSpec>)],
    except: Option<&str>,
) -> Result<(), crate::ManagerError> {
    let declared: Vec<(&str, &str)> = routes
        .iter()
        .filter_map(|(whose, route)| Some((*whose, declared_host(*route)?)))
        .collect();
    let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
    for (whose, host) in &declared {
        if let Some(first) = seen.insert(host, whose) {
            return Err(crate::ManagerError::Conflict(format!(
                "Route.Host: {first} and {whose} both declare host {host}; a host routes to \
                 one service"
            )));
        }
    }
    for (whose, host) in declared {
        if let Some(holder) = host_holder(state, host, except) {
            return Err(crate::ManagerError::Conflict(format!(
                "Route.Host: {whose} declares host {host}, which {holder} routes already; a \
                 host routes to one service: choose another, or stop that one first"
            )));
        }
    }
    Ok(())
}

/// Every route, sorted by project then name.
pub(crate) fn routes(state: &Shared) -> Vec<RouteView> {
    let mut routes: Vec<RouteView> = routes_by_owner(state, &LiveHosts(state))
        .into_iter()
        .map(|(_, route)| route)
        .collect();
    routes.sort_by(|a, b| (&a.project, &a.name).cmp(&(&b.project, &b.name)));
    routes
}

/// Every route with what it belongs to. Bare tasks are found through their waiting-list
/// entries (every bare task has one), not by reading every task.
fn routes_by_owner(state: &Shared, hosts: &impl NodeHosts) -> Vec<(Owner, RouteView)> {
    let mut routes = Vec::new();
    for (key, record) in &state.jobs {
        for group in &record.job.groups {
            if let Some(route) = job_group_route(state, key, &group.name, hosts) {
                let owner = Owner::Group {
                    job: key.clone(),
                    group: group.name.clone(),
                };
                routes.push((owner, route));
            }
        }
    }
    for entry in state.queue.values() {
        if entry.kind != cube_types::queue::RequestKind::Task {
            continue;
        }
        if let Some(task) = crate::queue_controller::task_of(state, entry)
            && let Some(route) = task_route(&task, hosts)
        {
            routes.push((Owner::Task(task.id), route));
        }
    }
    routes
}

/// Where a route is kept in [`RouteWatch`]'s map: what it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Owner {
    Group { job: String, group: String },
    Task(uuid::Uuid),
}

/// Publishes a `Route` event when a route changes (see the module comment). Runs on the
/// leader with the other controllers.
pub(crate) struct RouteWatch {
    cluster: Arc<Cluster>,
    /// Every route as last published.
    known: HashMap<Owner, RouteView>,
}

impl RouteWatch {
    pub(crate) fn new(cluster: Arc<Cluster>) -> RouteWatch {
        RouteWatch {
            cluster,
            known: HashMap::new(),
        }
    }

    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let Ok(mut events) = self.cluster.events.subscribe(None) else {
            return;
        };
        // What is there at the start is known without an event: a router reads it whole.
        self.look_all(false);
        loop {
            let received = tokio::select! {
                _ = shutdown.cancelled() => return,
                received = events.next() => received,
            };
            // What this event and those already waiting name, each looked at once: a burst
            // of a job's copies' changes is one look at the job.
            let mut jobs: BTreeSet<String> = BTreeSet::new();
            let mut tasks: BTreeSet<uuid::Uuid> = BTreeSet::new();
            let mut everything = false;
            let mut next = Some(received);
            let mut taken = 0;
            while let Some(received) = next.take() {
                match received {
                    Received::Closed => return,
                    // Fell behind: whatever changed meanwhile is found by looking at
                    // everything.
                    Received::Lagged { .. } => {
                        if let Ok(resumed) = self.cluster.events.subscribe(None) {
                            events = resumed;
                        }
                        everything = true;
                    }
                    Received::Event(event) => match (event.topic, &event.job) {
                        // A copy's change: its job's groups (a removed copy is no longer in
                        // the cache to say which group it was of).
                        (Topic::Task | Topic::Job, Some(job)) => {
                            jobs.insert(job.clone());
                        }
                        (Topic::Job, None) => {
                            jobs.insert(event.key.clone());
                        }
                        (Topic::Task, None) => {
                            if let Ok(id) = event.key.parse::<uuid::Uuid>() {
                                tasks.insert(id);
                            }
                        }
                        _ => {}
                    },
                }
                taken += 1;
                if taken < BATCH {
                    next = events.try_next();
                }
            }
            if everything {
                self.look_all(true);
                continue;
            }
            self.look_at(&jobs, &tasks);
        }
    }

    /// Every route against what was published.
    fn look_all(&mut self, publish: bool) {
        let now: HashMap<Owner, RouteView> = {
            let state = lock(&self.cluster.state);
            routes_by_owner(&state, &LiveHosts(&state))
                .into_iter()
                .collect()
        };
        let gone: Vec<Owner> = self
            .known
            .keys()
            .filter(|owner| !now.contains_key(owner))
            .cloned()
            .collect();
        for owner in gone {
            self.change(owner, None, publish);
        }
        for (owner, route) in now {
            self.change(owner, Some(route), publish);
        }
    }

    /// The routes of the jobs (every group) and bare tasks a batch of events named, read
    /// under one hold of the lock.
    fn look_at(&mut self, jobs: &BTreeSet<String>, tasks: &BTreeSet<uuid::Uuid>) {
        let mut now: HashMap<Owner, Option<RouteView>> = HashMap::new();
        {
            let state = lock(&self.cluster.state);
            let hosts = LiveHosts(&state);
            // A group no longer in its job (or a job gone) has no route: known ones first
            // as gone, then what each job has now.
            for owner in self.known.keys() {
                if let Owner::Group { job, .. } = owner
                    && jobs.contains(job)
                {
                    now.insert(owner.clone(), None);
                }
            }
            for key in jobs {
                let Some(record) = state.jobs.get(key) else {
                    continue;
                };
                for group in &record.job.groups {
                    let owner = Owner::Group {
                        job: key.clone(),
                        group: group.name.clone(),
                    };
                    now.insert(owner, job_group_route(&state, key, &group.name, &hosts));
                }
            }
            for id in tasks {
                let route = state
                    .cache
                    .shared(id)
                    .and_then(|task| task_route(&task, &hosts));
                now.insert(Owner::Task(*id), route);
            }
        }
        for (owner, route) in now {
            self.change(owner, route, true);
        }
    }

    /// Records `route` as `owner`'s, publishing the change when asked.
    fn change(&mut self, owner: Owner, route: Option<RouteView>, publish: bool) {
        let before = match &route {
            Some(route) => self.known.insert(owner, route.clone()),
            None => self.known.remove(&owner),
        };
        let kind = match (&before, &route) {
            (None, None) => return,
            (Some(before), Some(after)) if before == after => return,
            (None, Some(_)) => "Added",
            (Some(_), Some(_)) => "Updated",
            (Some(_), None) => "Removed",
        };
        if !publish {
            return;
        }
        let Some(shown) = route.as_ref().or(before.as_ref()) else {
            return;
        };
        let key = if shown.host.is_empty() {
            shown.name.clone()
        } else {
            shown.host.clone()
        };
        let job =
            (!shown.job.is_empty()).then(|| cube_types::job::job_key(&shown.project, &shown.job));
        let object = serde_json::to_value(route.as_ref().unwrap_or(shown)).unwrap_or_default();
        // Under the state lock, as every event: its index orders it with the changes that
        // made it.
        let _state = lock(&self.cluster.state);
        self.cluster.publish(
            Topic::Route,
            kind,
            &key,
            job.as_deref(),
            Some(&shown.project),
            object,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cube_types::route::RouteSpec;
    use cube_types::{Health, HostBinding};

    fn running_copy(port: &str, host_port: &str) -> Task {
        let mut task = Task::new("web-0", "cube-sample:latest");
        task.spec.exposed_ports.insert(port.to_string());
        task.status.state = State::Running;
        task.status.node_name = "w1".into();
        task.status.run.host_ports.insert(
            port.to_string(),
            vec![HostBinding {
                host_ip: "0.0.0.0".into(),
                host_port: host_port.into(),
            }],
        );
        task
    }

    fn hosts() -> BTreeMap<String, String> {
        BTreeMap::from([("w1".to_string(), "10.0.0.2".to_string())])
    }

    #[test]
    fn a_running_copy_is_a_backend_at_its_nodes_host() {
        let task = running_copy("7777/tcp", "49153");
        let backend = backend_of(&task, "7777/tcp", &hosts()).unwrap();
        assert_eq!(backend.address, "10.0.0.2:49153");
        assert_eq!(backend.node, "w1");
        // A port it does not publish, or a node not known: no backend.
        assert!(backend_of(&task, "8080/tcp", &hosts()).is_none());
        assert!(backend_of(&task, "7777/tcp", &BTreeMap::new()).is_none());
    }

    #[test]
    fn a_copy_leaves_when_told_to_stop_or_when_a_probe_fails() {
        let mut task = running_copy("7777/tcp", "49153");
        task.spec.health_check = "/health".into();
        task.status.run.health = Some(Health::Healthy);
        assert!(takes_requests(&task));
        task.status.run.health_failures = 1;
        assert!(!takes_requests(&task), "one failed probe takes it out");
        task.status.run.health_failures = 0;
        task.status.run.health = None;
        assert!(!takes_requests(&task), "not yet found healthy");
        task.status.run.health = Some(Health::Healthy);
        task.spec.desired_state = State::Completed;
        assert!(!takes_requests(&task), "on its way to be stopped");
    }

    #[test]
    fn a_bare_task_has_its_own_route_with_its_host() {
        let mut task = running_copy("7777/tcp", "49153");
        let route = task_route(&task, &hosts()).unwrap();
        assert_eq!(route.name, "web-0");
        assert_eq!(route.port, "7777/tcp");
        assert_eq!(route.backends.len(), 1);
        task.spec.route = Some(RouteSpec {
            host: "api.example.test".into(),
            port: None,
        });
        task.spec.project = "team-a".into();
        let route = task_route(&task, &hosts()).unwrap();
        assert_eq!(route.host, "api.example.test");
        assert_eq!(route.name, "web-0.team-a");
        task.spec.exposed_ports.clear();
        assert!(task_route(&task, &hosts()).is_none(), "no port, no route");
    }
}
