//! Which manager answers a request once managers sharing etcd each act for their own shards
//! (issue 32, step 2; ARCHITECTURE, "The shard ring"): one line per route in [`ADDRESSED`],
//! held equal to the routes of `acl::ROUTES` by a test, and [`target`], the manager a
//! request goes to. Today the leader acts for every shard and a follower hands every request
//! to it; this table is what a manager's front will read instead.
//!
//! - What every manager knows alike, or says of itself, is answered **here**.
//! - What is the whole cluster's — nodes (the workers report to the leader, which alone
//!   writes their records and marks them `Down`; every owner follows the nodes table),
//!   tokens, projects and quotas, the CA, the store's backup — is the **leader**'s.
//! - A project's records are its shard's **owner**'s: the project `?project=` names, else
//!   the one a submission's body names, else `default` (as `projects::scoped` reads them);
//!   a list or stream asked with `?project=*` is gathered from **every** owner.
//! - A task named by its ID is its project's owner's, found from the task's record.

use cube_types::project::DEFAULT_PROJECT;
use cube_types::shard::shard_of;

/// Who answers a route (see the module comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addressed {
    /// The manager asked.
    Here,
    /// The leader.
    Leader,
    /// The owner of the project the request names; every owner, for a list or a stream
    /// of `?project=*`.
    Project,
    /// The owner of the task the path (or, for a run's secrets, `?task=`) names.
    Task,
}

/// Every route and who answers it.
pub const ADDRESSED: &[(&str, &str, Addressed)] = &[
    ("GET", "/health", Addressed::Here),
    ("GET", "/ui", Addressed::Here),
    ("GET", "/ui/{asset}", Addressed::Here),
    ("GET", "/acl/self", Addressed::Here),
    ("POST", "/acl/bootstrap", Addressed::Leader),
    ("GET", "/acl/tokens", Addressed::Leader),
    ("POST", "/acl/tokens", Addressed::Leader),
    ("DELETE", "/acl/tokens/{id}", Addressed::Leader),
    ("GET", "/tasks", Addressed::Project),
    ("POST", "/tasks", Addressed::Project),
    ("POST", "/tasks/prune", Addressed::Project),
    ("GET", "/tasks/{id}", Addressed::Task),
    ("DELETE", "/tasks/{id}", Addressed::Task),
    ("POST", "/tasks/{id}/restart", Addressed::Task),
    ("GET", "/tasks/{id}/placement", Addressed::Task),
    ("GET", "/tasks/{id}/logs", Addressed::Task),
    ("POST", "/tasks/{id}/exec", Addressed::Task),
    ("GET", "/tasks/{id}/exec/attach", Addressed::Task),
    // Every owner follows the nodes table: a read of the nodes is answered anywhere.
    ("GET", "/nodes", Addressed::Here),
    ("GET", "/nodes/{name}", Addressed::Here),
    ("PUT", "/nodes/{name}", Addressed::Leader),
    ("DELETE", "/nodes/{name}", Addressed::Leader),
    ("POST", "/nodes/{name}/certificate", Addressed::Leader),
    ("GET", "/tls/ca", Addressed::Here),
    ("POST", "/nodes/{name}/drain", Addressed::Leader),
    ("POST", "/nodes/{name}/eligibility", Addressed::Leader),
    ("GET", "/version", Addressed::Here),
    ("GET", "/shards", Addressed::Here),
    // Each manager's own numbers: a scrape asks every manager.
    ("GET", "/metrics", Addressed::Here),
    ("GET", "/jobs", Addressed::Project),
    ("POST", "/jobs", Addressed::Project),
    ("POST", "/jobs/plan", Addressed::Project),
    ("GET", "/jobs/{name}", Addressed::Project),
    ("DELETE", "/jobs/{name}", Addressed::Project),
    ("POST", "/jobs/{name}/scale", Addressed::Project),
    ("GET", "/jobs/{name}/versions", Addressed::Project),
    ("POST", "/jobs/{name}/revert", Addressed::Project),
    ("POST", "/jobs/{name}/promote", Addressed::Project),
    ("GET", "/jobs/{name}/deployment", Addressed::Project),
    ("GET", "/events", Addressed::Project),
    ("GET", "/queue", Addressed::Project),
    // `/queue/job/NAME` names its project with `?project=`; `/queue/task/ID` is the task's,
    // which the front reads from the path as for `/tasks/{id}` (see `target`).
    ("GET", "/queue/{kind}/{id}", Addressed::Project),
    ("GET", "/services", Addressed::Project),
    ("GET", "/routes", Addressed::Project),
    ("GET", "/store/backup", Addressed::Leader),
    ("GET", "/projects", Addressed::Leader),
    ("POST", "/projects", Addressed::Leader),
    ("GET", "/projects/{name}", Addressed::Leader),
    ("DELETE", "/projects/{name}", Addressed::Leader),
    ("PUT", "/projects/{name}/quota", Addressed::Leader),
    ("GET", "/secrets", Addressed::Project),
    ("POST", "/secrets", Addressed::Project),
    ("DELETE", "/secrets/{name}", Addressed::Project),
    ("GET", "/nodes/{name}/secrets", Addressed::Task),
    ("POST", "/registries", Addressed::Project),
    ("GET", "/volumes", Addressed::Project),
    ("DELETE", "/volumes/{name}", Addressed::Project),
];

/// Who answers `method` on `route` (a pattern as the router matches it); `None` for a route
/// the manager does not have. `HEAD` is answered as `GET`.
pub fn addressed(method: &str, route: &str) -> Option<Addressed> {
    let method = if method == "HEAD" { "GET" } else { method };
    ADDRESSED
        .iter()
        .find(|(m, r, _)| *m == method && *r == route)
        .map(|(_, _, addressed)| *addressed)
}

/// The route pattern `path` matches for `method`, and who answers it: the pattern with the
/// most literal segments wins (`POST /tasks/prune` before `POST /tasks/{id}/…`). `None` for
/// a path no route has.
pub fn route_of(method: &str, path: &str) -> Option<(&'static str, Addressed)> {
    let method = if method == "HEAD" { "GET" } else { method };
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    ADDRESSED
        .iter()
        .filter(|(m, route, _)| {
            *m == method && {
                let pattern: Vec<&str> = route.split('/').collect();
                pattern.len() == segments.len()
                    && pattern
                        .iter()
                        .zip(&segments)
                        .all(|(p, s)| p.starts_with('{') || p == s)
            }
        })
        .max_by_key(|(_, route, _)| route.split('/').filter(|p| !p.starts_with('{')).count())
        .map(|(_, route, addressed)| (*route, *addressed))
}

/// The task ID a request on `route` names: the path's `{id}` under `/tasks/`, a waiting
/// task's `/queue/task/{id}`, or a run's secrets' `?task=` (`task_query`).
pub fn task_named<'a>(route: &str, path: &'a str, task_query: Option<&'a str>) -> Option<&'a str> {
    let segments: Vec<&str> = path.split('/').collect();
    if route.starts_with("/tasks/{id}") {
        return segments.get(2).copied();
    }
    if route == "/queue/{kind}/{id}" && segments.get(2) == Some(&"task") {
        return segments.get(3).copied();
    }
    if route == "/nodes/{name}/secrets" {
        return task_query;
    }
    None
}

/// The manager a request goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Here,
    Leader,
    /// The owner of this shard.
    Shard(u32),
    /// Every owner, the answers gathered.
    Every,
    /// The owner of the task with this ID, once its record says its project.
    TaskOwner(String),
}

/// What a request names that decides where it goes.
#[derive(Debug, Default, Clone, Copy)]
pub struct Named<'a> {
    /// `?project=`: `Some("*")` for every project.
    pub project: Option<&'a str>,
    /// The `Project` a submission's body gives, if any (`default` names none).
    pub body_project: Option<&'a str>,
    /// The task ID the path (or `?task=`) names, if the route names one.
    pub task: Option<&'a str>,
}

/// Where a request of `addressed` naming `named` goes, in a ring of `ring` shards.
pub fn target(addressed: Addressed, named: Named<'_>, ring: u32) -> Target {
    match addressed {
        Addressed::Here => Target::Here,
        Addressed::Leader => Target::Leader,
        Addressed::Task => match named.task {
            Some(id) => Target::TaskOwner(id.to_string()),
            // Nothing to find the owner by: the manager asked answers what it can (a 400
            // or a 404 of its own).
            None => Target::Here,
        },
        Addressed::Project => {
            if let Some(id) = named.task {
                return Target::TaskOwner(id.to_string());
            }
            let body = named
                .body_project
                .filter(|project| *project != DEFAULT_PROJECT && !project.is_empty());
            let project = match named.project {
                // `?project=*` with a body naming one: the owner of the body's project
                // refuses it as the manager would (`?project=*` names no project to create
                // in).
                Some("*") => match body {
                    None => return Target::Every,
                    Some(project) => project,
                },
                Some(project) => project,
                None => body.unwrap_or(DEFAULT_PROJECT),
            };
            Target::Shard(shard_of(project, ring))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn every_route_is_addressed_once_and_nothing_else_is() {
        let routes: BTreeSet<(&str, &str)> = crate::acl::ROUTES
            .iter()
            .map(|(method, route, _)| (*method, *route))
            .collect();
        let listed: Vec<(&str, &str)> = ADDRESSED
            .iter()
            .map(|(method, route, _)| (*method, *route))
            .collect();
        let unique: BTreeSet<(&str, &str)> = listed.iter().copied().collect();
        assert_eq!(unique.len(), listed.len(), "a route addressed twice");
        assert_eq!(
            unique, routes,
            "ADDRESSED and acl::ROUTES name the same routes"
        );
        assert_eq!(addressed("HEAD", "/tasks"), Some(Addressed::Project));
        assert_eq!(addressed("PATCH", "/tasks"), None);
    }

    #[test]
    fn a_path_finds_its_route_and_the_task_it_names() {
        assert_eq!(
            route_of("GET", "/tasks"),
            Some(("/tasks", Addressed::Project))
        );
        assert_eq!(
            route_of("POST", "/tasks/prune"),
            Some(("/tasks/prune", Addressed::Project))
        );
        let (route, addressed) = route_of("POST", "/tasks/abc/restart").unwrap();
        assert_eq!((route, addressed), ("/tasks/{id}/restart", Addressed::Task));
        assert_eq!(task_named(route, "/tasks/abc/restart", None), Some("abc"));
        assert_eq!(
            route_of("PUT", "/nodes/n1"),
            Some(("/nodes/{name}", Addressed::Leader))
        );
        let (route, _) = route_of("GET", "/queue/task/t1").unwrap();
        assert_eq!(task_named(route, "/queue/task/t1", None), Some("t1"));
        assert_eq!(task_named(route, "/queue/job/web", None), None);
        let (route, _) = route_of("GET", "/nodes/n1/secrets").unwrap();
        assert_eq!(
            task_named(route, "/nodes/n1/secrets", Some("t2")),
            Some("t2")
        );
        assert_eq!(route_of("GET", "/nowhere/at/all"), None);
        assert_eq!(route_of("PATCH", "/tasks"), None);
    }

    #[test]
    fn a_request_goes_to_the_owner_of_the_project_it_names() {
        let ring = 16;
        let shard = |project: &str| Target::Shard(shard_of(project, ring));
        let project = |project| Named {
            project: Some(project),
            ..Named::default()
        };
        // A list: the project named, `default` when none is, every owner for `*`.
        assert_eq!(
            target(Addressed::Project, project("team-a"), ring),
            shard("team-a")
        );
        assert_eq!(
            target(Addressed::Project, Named::default(), ring),
            shard("default")
        );
        assert_eq!(
            target(Addressed::Project, project("*"), ring),
            Target::Every
        );
        // A submission: the body's project when the query names none.
        let body = Named {
            body_project: Some("team-b"),
            ..Named::default()
        };
        assert_eq!(target(Addressed::Project, body, ring), shard("team-b"));
        let body_default = Named {
            body_project: Some("default"),
            ..Named::default()
        };
        assert_eq!(
            target(Addressed::Project, body_default, ring),
            shard("default")
        );
        // A task by its ID: its owner, whatever the query says.
        let task = Named {
            project: Some("team-a"),
            task: Some("0b4c"),
            ..Named::default()
        };
        assert_eq!(
            target(Addressed::Task, task, ring),
            Target::TaskOwner("0b4c".into())
        );
        assert_eq!(
            target(Addressed::Project, task, ring),
            Target::TaskOwner("0b4c".into()),
            "/queue/task/ID"
        );
        assert_eq!(
            target(Addressed::Leader, project("team-a"), ring),
            Target::Leader
        );
        assert_eq!(target(Addressed::Here, project("*"), ring), Target::Here);
    }
}
