//! Routes: the stable address of a job group or a bare task. A task whose template publishes
//! a port has a route; `cube router` sends a request for the route's host to one of its
//! healthy copies, and HAProxy fed by `cube router --haproxy-config` does the same.
//!
//! A route's host is the one its task declares (`"Route": {"Host": "api.example.test"}`), or
//! by default its name under the router's `--domain`: `<group>.<job>` for a job's copies,
//! `<task name>` for a bare task, followed by `.<project>` outside the default project.
//! Its port is the container port declared (`"Port": 7777`), or the lowest TCP port the task
//! exposes. `GET /routes` lists each route with its *backends*: the copies that run, whose
//! desired state is to run and whose health check passes (or that have none), at the address
//! their node publishes the route's port on.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::project::DEFAULT_PROJECT;

/// What a task (or a job group's template) declares of its route:
/// `{"Host": "api.example.test", "Port": 7777}`, either left out for the default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    /// The whole host name requests arrive for; empty: the default name under the router's
    /// domain.
    #[serde(rename = "Host", default, skip_serializing_if = "String::is_empty")]
    pub host: String,
    /// The container port requests go to; unset: the lowest TCP port the task exposes.
    #[serde(rename = "Port", default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

impl RouteSpec {
    /// What is wrong with it, each finding prefixed with `at` (`Route`), given the ports
    /// the task exposes (`"7777/tcp"`).
    pub fn findings<'a>(
        &self,
        at: &str,
        exposed: impl IntoIterator<Item = &'a String>,
    ) -> Vec<String> {
        let mut findings = Vec::new();
        if !self.host.is_empty()
            && let Err(why) = check_host(&self.host)
        {
            findings.push(format!("{at}.Host: {why}"));
        }
        let exposed: Vec<&String> = exposed.into_iter().collect();
        match self.port {
            Some(0) => findings.push(format!("{at}.Port: 0 is not a port")),
            Some(port) => {
                let wanted = format!("{port}/tcp");
                if !exposed.iter().any(|exposed| **exposed == wanted) {
                    findings.push(format!(
                        "{at}.Port: {port} is not among the task's exposed TCP ports ({}); \
                         expose it (ExposedPorts, cube run -p) to route to it",
                        if exposed.is_empty() {
                            "none".to_string()
                        } else {
                            exposed
                                .iter()
                                .map(|port| port.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        }
                    ));
                }
            }
            None if !exposed.iter().any(|port| port.ends_with("/tcp")) => findings.push(format!(
                "{at}: the task exposes no TCP port to route to; expose one (ExposedPorts, \
                 cube run -p)"
            )),
            None => {}
        }
        findings
    }
}

/// Whether `host` is a host name a route may have: dot-separated labels of lowercase
/// letters, digits and `-` (not first or last), each 1 to 63 characters, 253 in all.
pub fn check_host(host: &str) -> Result<(), String> {
    if host.len() > 253 {
        return Err(format!(
            "{} characters is more than a host name's 253",
            host.len()
        ));
    }
    for label in host.split('.') {
        let fine = !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !fine {
            return Err(format!(
                "{host:?} is not a host name: dot-separated labels of lowercase letters, digits \
                 and '-' (not first or last), 1 to 63 characters each"
            ));
        }
    }
    Ok(())
}

/// A name as a host name's label: lowercase, every other character than a letter, a digit
/// or `-` made `-`, at most 63 characters.
pub fn label_of(name: &str) -> String {
    let mut label: String = name
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    while label.ends_with('-') {
        label.pop();
    }
    while label.starts_with('-') {
        label.remove(0);
    }
    if label.is_empty() {
        label.push('x');
    }
    label
}

/// The default name of a route (its host under the router's domain, without the domain):
/// `<group>.<job>` or `<task>`, then `.<project>` outside the default project.
pub fn default_name(job: &str, group: &str, task_name: &str, project: &str) -> String {
    let mut name = if job.is_empty() {
        label_of(task_name)
    } else {
        format!("{}.{}", label_of(group), label_of(job))
    };
    if project != DEFAULT_PROJECT && !project.is_empty() {
        name.push('.');
        name.push_str(&label_of(project));
    }
    name
}

/// The container port a task's route goes to: the one declared, or the lowest TCP port the
/// task exposes; `None` when it exposes none (the task has no route).
pub fn route_port<'a>(
    spec: Option<&RouteSpec>,
    exposed: impl IntoIterator<Item = &'a String>,
) -> Option<String> {
    if let Some(port) = spec.and_then(|spec| spec.port) {
        return Some(format!("{port}/tcp"));
    }
    exposed
        .into_iter()
        .filter_map(|port| port.strip_suffix("/tcp")?.parse::<u16>().ok())
        .min()
        .map(|port| format!("{port}/tcp"))
}

/// One route as `GET /routes` gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteView {
    /// The route's name: its default host without the router's domain (`web.shop`), or its
    /// declared host.
    #[serde(rename = "Name")]
    pub name: String,
    /// The host declared (`Route.Host`), whole; empty for a default route, reached at
    /// `<Name>.<domain>`.
    #[serde(rename = "Host", default)]
    pub host: String,
    #[serde(rename = "Project")]
    pub project: String,
    /// The job and group whose copies serve it; empty for a bare task's route.
    #[serde(rename = "Job", default)]
    pub job: String,
    #[serde(rename = "Group", default)]
    pub group: String,
    /// The container port requests go to, `"7777/tcp"`.
    #[serde(rename = "Port")]
    pub port: String,
    /// The copies that take requests now, in a stable order.
    #[serde(rename = "Backends", default)]
    pub backends: Vec<Backend>,
}

impl RouteView {
    /// The host requests for this route arrive for, under `domain` when it has no host of
    /// its own.
    pub fn host_under(&self, domain: &str) -> String {
        if !self.host.is_empty() {
            return self.host.clone();
        }
        let domain = domain.trim_matches('.');
        if domain.is_empty() {
            self.name.clone()
        } else {
            format!("{}.{domain}", self.name)
        }
    }
}

/// One copy a route sends requests to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backend {
    /// Where its node publishes the route's port: `HOST:PORT`.
    #[serde(rename = "Address")]
    pub address: String,
    /// The task.
    #[serde(rename = "ID")]
    pub id: Uuid,
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Node")]
    pub node: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_names_are_host_labels_with_the_project_after() {
        assert_eq!(default_name("shop", "web", "", "default"), "web.shop");
        assert_eq!(default_name("shop", "web", "", "team-a"), "web.shop.team-a");
        assert_eq!(default_name("", "", "My_Task", "default"), "my-task");
        assert_eq!(label_of("--a__b--"), "a--b");
        assert_eq!(label_of("___"), "x");
    }

    #[test]
    fn a_host_must_be_a_host_name() {
        assert!(check_host("api.example.test").is_ok());
        assert!(check_host("a-1.b").is_ok());
        for bad in ["", "Api.example", "a..b", "-a.b", "a-.b", "a_b", "a b"] {
            assert!(check_host(bad).is_err(), "{bad:?}");
        }
        assert!(check_host(&"a".repeat(64)).is_err());
    }

    #[test]
    fn the_port_is_the_declared_one_or_the_lowest_tcp_port() {
        let exposed = [
            "8080/tcp".to_string(),
            "7777/tcp".to_string(),
            "53/udp".to_string(),
        ];
        assert_eq!(route_port(None, &exposed).as_deref(), Some("7777/tcp"));
        let spec = RouteSpec {
            host: String::new(),
            port: Some(8080),
        };
        assert_eq!(
            route_port(Some(&spec), &exposed).as_deref(),
            Some("8080/tcp")
        );
        assert_eq!(route_port(None, &["53/udp".to_string()]), None);
    }

    #[test]
    fn findings_name_the_field_and_what_is_exposed() {
        let exposed = ["7777/tcp".to_string()];
        let spec = RouteSpec {
            host: "Bad_Host".to_string(),
            port: Some(80),
        };
        let findings = spec.findings("Route", &exposed);
        assert_eq!(findings.len(), 2, "{findings:?}");
        assert!(
            findings[0].starts_with("Route.Host: \"Bad_Host\""),
            "{findings:?}"
        );
        assert!(findings[1].contains("80 is not among") && findings[1].contains("7777/tcp"));
        assert!(RouteSpec::default().findings("Route", &exposed).is_empty());
        assert!(
            RouteSpec::default().findings("Route", &[] as &[String])[0]
                .contains("exposes no TCP port")
        );
    }

    #[test]
    fn a_route_is_reached_under_the_domain_unless_it_has_its_host() {
        let mut route = RouteView {
            name: "web.shop".into(),
            host: String::new(),
            project: "default".into(),
            job: "shop".into(),
            group: "web".into(),
            port: "7777/tcp".into(),
            backends: Vec::new(),
        };
        assert_eq!(route.host_under("example.test"), "web.shop.example.test");
        assert_eq!(route.host_under(".example.test."), "web.shop.example.test");
        route.host = "api.example.test".into();
        assert_eq!(route.host_under("example.test"), "api.example.test");
    }
}
