//! The pod plugin chain: what rewrites a task's containers before they are created, and
//! hears of each launch and kill.
//!
//! Every task's launch goes through the chain, a single container as much as a pod: the
//! worker turns the task into a [`LaunchPlan`] (the containers as the user described them),
//! each plugin's [`PodPlugin::pre_launch`] rewrites it in the order the worker's configuration
//! names (`plugins: {order: [general, node-env]}`), and the runner creates what the plan says.
//! After the containers run, `post_launch` is called in the same order; around a kill,
//! `pre_kill` and `post_kill`; when the worker stops, `shutdown`.
//!
//! Built in: [`GeneralPlugin`] (`general`, always first in the default order) names the
//! containers so that pods of one compose file coexist on a host, labels every container with
//! its task, node, pod container and run, adds the infra container that holds a pod's network
//! namespace and points the others at it, publishes the ports on it, and gives it a hosts
//! entry per service (the service's name is the pod's loopback, as a compose network's DNS
//! would answer it). [`NodeEnvPlugin`]
//! (`node-env`) hands the containers the node's name and zone, as environment and labels, and
//! the labels and environment the operator configured. [`JournalPlugin`] (`journal`) appends
//! a line per call to a file: an audit trail of what was launched and killed on this node.
//!
//! A plugin is synchronous and quick: it rewrites a plan or records a fact. An error from one
//! fails the launch cleanly: what was started is removed, and the task is `Failed` with the
//! plugin's name and message.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cube_runtime::sample_image::PAUSE_IMAGE;
use cube_runtime::{
    ContainerSpec, LABEL_NODE, LABEL_POD_CONTAINER, LABEL_RUN, LABEL_TASK_ID, LABEL_TASK_NAME,
    container_name,
};
use cube_types::pod::{Dependency, INFRA, MountKind, PodNetwork};
use cube_types::{Labels, Task};
use uuid::Uuid;

/// The address a pod's service names resolve to inside the pod: the loopback its services
/// share.
pub const POD_LOOPBACK: &str = "127.0.0.1";

/// The containers a task's run is made of, as the chain rewrites them.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchPlan {
    pub task_id: Uuid,
    pub task_name: String,
    /// The task's `RestartCount`: which run this is.
    pub run: u32,
    /// The worker's name.
    pub node: String,
    /// The worker's labels (`--label`).
    pub node_labels: Labels,
    /// Whether the task is a pod (its containers are then named after their services).
    pub pod: bool,
    pub network: PodNetwork,
    /// In the order they start (the infra container first, once the general plugin added it).
    pub containers: Vec<PlannedContainer>,
    /// The engine's names of the pod's named volumes (removed on kill when configured).
    pub volumes: Vec<String>,
    /// The login to the registry of the task's image, from its project (never stored).
    pub registry_auth: Option<cube_types::secret::RegistryAuth>,
}

/// One container of a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedContainer {
    /// The service's name, [`INFRA`], or the task's name for a single container.
    pub name: String,
    pub infra: bool,
    pub spec: ContainerSpec,
    /// The services (by name) that must have started, be healthy, or have completed successfully before this one.
    pub depends_on: Vec<Dependency>,
}

impl LaunchPlan {
    /// The containers of `task` as its spec describes them, before any plugin ran.
    pub fn for_task(task: &Task, node: &str, node_labels: &Labels) -> LaunchPlan {
        let mut plan = LaunchPlan {
            task_id: task.id,
            task_name: task.name.clone(),
            run: task.status.restart_count,
            node: node.to_string(),
            node_labels: node_labels.clone(),
            pod: task.spec.pod.is_some(),
            network: PodNetwork::Shared,
            containers: Vec::new(),
            volumes: Vec::new(),
            registry_auth: None,
        };
        let Some(pod) = &task.spec.pod else {
            plan.network = PodNetwork::Host; // a single container keeps its own network
            plan.containers.push(PlannedContainer {
                name: task.name.clone(),
                infra: false,
                spec: ContainerSpec::for_task(task, node),
                depends_on: Vec::new(),
            });
            return plan;
        };
        plan.network = pod.spec.network;
        for service in &pod.spec.services {
            let port_bindings: BTreeMap<String, String> = service
                .ports
                .iter()
                .map(|port| (port.container.clone(), port.host.clone()))
                .collect();
            let binds = service
                .mounts
                .iter()
                .map(|mount| {
                    let mode = if mount.read_only { ":ro" } else { "" };
                    format!("{}:{}{mode}", mount.source, mount.target)
                })
                .collect();
            plan.containers.push(PlannedContainer {
                name: service.name.clone(),
                infra: false,
                spec: ContainerSpec {
                    name: service.name.clone(),
                    image: service.image.clone(),
                    cmd: service.command.clone().unwrap_or_default(),
                    env: service.env.clone(),
                    cpu_cores: service.cpus,
                    memory_bytes: service.memory_bytes,
                    exposed_ports: port_bindings
                        .keys()
                        .chain(&service.expose)
                        .cloned()
                        .collect(),
                    port_bindings,
                    labels: service
                        .labels
                        .iter()
                        .map(|(key, value)| (key.clone(), value.clone()))
                        .collect(),
                    entrypoint: service.entrypoint.clone(),
                    network_mode: None,
                    binds,
                    healthcheck: service.healthcheck.clone(),
                    user: service.user.clone(),
                    working_dir: service.working_dir.clone(),
                    extra_hosts: service.extra_hosts.clone(),
                },
                depends_on: service.depends_on.clone(),
            });
        }
        // Named volumes keep their compose names until the general plugin names them.
        plan.volumes = pod
            .spec
            .services
            .iter()
            .flat_map(|service| service.mounts.iter())
            .filter(|mount| mount.kind == MountKind::Volume)
            .map(|mount| mount.source.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        plan
    }

    /// The container named `name` (a service, or [`INFRA`]).
    pub fn container(&self, name: &str) -> Option<&PlannedContainer> {
        self.containers.iter().find(|c| c.name == name)
    }
}

/// A plugin's failure, in its own words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginError {
    pub plugin: String,
    pub hook: &'static str,
    pub message: String,
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "plugin {} failed in {}: {}",
            self.plugin, self.hook, self.message
        )
    }
}

/// One plugin. Every hook has a default that does nothing, so a plugin writes only the ones
/// it needs. Errors are plain words; the chain adds the plugin's name and the hook.
pub trait PodPlugin: Send + Sync {
    /// The name the configuration's `plugins.order` uses.
    fn name(&self) -> &str;
    /// Before anything is created: may rewrite the plan.
    fn pre_launch(&self, _plan: &mut LaunchPlan) -> Result<(), String> {
        Ok(())
    }
    /// Once every container runs.
    fn post_launch(&self, _plan: &LaunchPlan, _task: &Task) -> Result<(), String> {
        Ok(())
    }
    /// Before a run's containers are stopped (a stop, or the pod monitor bringing it down).
    fn pre_kill(&self, _task: &Task) -> Result<(), String> {
        Ok(())
    }
    /// Once they are stopped (and removed, when configured).
    fn post_kill(&self, _task: &Task) -> Result<(), String> {
        Ok(())
    }
    /// When the worker stops.
    fn shutdown(&self) -> Result<(), String> {
        Ok(())
    }
}

/// The plugins in their configured order.
#[derive(Clone)]
pub struct PluginChain {
    plugins: Arc<Vec<Box<dyn PodPlugin>>>,
}

impl fmt::Debug for PluginChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

impl Default for PluginChain {
    /// `general` alone.
    fn default() -> PluginChain {
        PluginChain::new(vec![Box::new(GeneralPlugin)])
    }
}

/// The names of the built-in plugins, for messages.
pub const BUILT_IN: [&str; 3] = ["general", "node-env", "journal"];

/// What the configuration file says of the plugins (`plugins:`).
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginSettings {
    /// The plugins, in the order they are called [default: general].
    #[serde(default)]
    pub order: Vec<String>,
    #[serde(rename = "node-env", default)]
    pub node_env: Option<NodeEnvSettings>,
    #[serde(default)]
    pub journal: Option<JournalSettings>,
}

/// `plugins.node-env`.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeEnvSettings {
    /// The node's zone [default: its `zone` label, if any].
    #[serde(default)]
    pub zone: Option<String>,
    /// More environment for every container (not the infra container).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// More labels for every container.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// `plugins.journal`.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JournalSettings {
    /// The file each call is appended to, one JSON object a line.
    pub path: PathBuf,
}

impl PluginChain {
    pub fn new(plugins: Vec<Box<dyn PodPlugin>>) -> PluginChain {
        PluginChain {
            plugins: Arc::new(plugins),
        }
    }

    /// The chain the settings name, in their order; an unknown name, a name given twice,
    /// an order without `general` or a plugin's missing settings are refused with the key.
    pub fn from_settings(settings: &PluginSettings) -> Result<PluginChain, String> {
        let order: Vec<String> = if settings.order.is_empty() {
            vec!["general".to_string()]
        } else {
            settings.order.clone()
        };
        let mut plugins: Vec<Box<dyn PodPlugin>> = Vec::new();
        for (index, name) in order.iter().enumerate() {
            if order[..index].contains(name) {
                return Err(format!("plugins.order[{index}]: {name:?} is named twice"));
            }
            let plugin: Box<dyn PodPlugin> = match name.as_str() {
                "general" => Box::new(GeneralPlugin),
                "node-env" => Box::new(NodeEnvPlugin {
                    settings: settings.node_env.clone().unwrap_or_default(),
                }),
                "journal" => {
                    let Some(journal) = &settings.journal else {
                        return Err(
                            "plugins.journal: the journal plugin needs `path`, the file it \
                             writes to"
                                .to_string(),
                        );
                    };
                    Box::new(JournalPlugin::open(journal.path.clone())?)
                }
                other => {
                    return Err(format!(
                        "plugins.order[{index}]: no plugin named {other:?}; the plugins are {}",
                        BUILT_IN.join(", ")
                    ));
                }
            };
            plugins.push(plugin);
        }
        if !order.iter().any(|name| name == "general") {
            return Err(
                "plugins.order: `general` must be in the order: it names the containers and \
                 labels them for re-adoption and clean-up"
                    .to_string(),
            );
        }
        Ok(PluginChain::new(plugins))
    }

    pub fn names(&self) -> Vec<&str> {
        self.plugins.iter().map(|plugin| plugin.name()).collect()
    }

    /// Which plugin errs, and how.
    fn each(
        &self,
        hook: &'static str,
        mut call: impl FnMut(&dyn PodPlugin) -> Result<(), String>,
    ) -> Result<(), PluginError> {
        for plugin in self.plugins.iter() {
            tracing::debug!(plugin = plugin.name(), hook, "pod plugin");
            call(plugin.as_ref()).map_err(|message| PluginError {
                plugin: plugin.name().to_string(),
                hook,
                message,
            })?;
        }
        Ok(())
    }

    pub fn pre_launch(&self, plan: &mut LaunchPlan) -> Result<(), PluginError> {
        self.each("pre_launch", |plugin| plugin.pre_launch(plan))
    }

    pub fn post_launch(&self, plan: &LaunchPlan, task: &Task) -> Result<(), PluginError> {
        self.each("post_launch", |plugin| plugin.post_launch(plan, task))
    }

    pub fn pre_kill(&self, task: &Task) -> Result<(), PluginError> {
        self.each("pre_kill", |plugin| plugin.pre_kill(task))
    }

    pub fn post_kill(&self, task: &Task) -> Result<(), PluginError> {
        self.each("post_kill", |plugin| plugin.post_kill(task))
    }

    /// Every plugin's `shutdown`, each whatever the others said.
    pub fn shutdown(&self) {
        for plugin in self.plugins.iter() {
            if let Err(message) = plugin.shutdown() {
                tracing::warn!(plugin = plugin.name(), %message, "pod plugin failed in shutdown");
            }
        }
    }
}

/// `general`: names, labels, the infra container, ports.
pub struct GeneralPlugin;

impl PodPlugin for GeneralPlugin {
    fn name(&self) -> &str {
        "general"
    }

    fn pre_launch(&self, plan: &mut LaunchPlan) -> Result<(), String> {
        // The run's own prefix: node, task name, whole task ID and run, so that two pods of
        // one compose file, and two runs of one pod, never share a name.
        let mut naming = Task::new(plan.task_name.clone(), "");
        naming.id = plan.task_id;
        naming.status.restart_count = plan.run;
        let prefix = container_name(&naming, &plan.node);
        let labels = |name: &str| {
            let mut labels = HashMap::from([
                (LABEL_TASK_ID.to_string(), plan.task_id.to_string()),
                (LABEL_NODE.to_string(), plan.node.clone()),
                (LABEL_TASK_NAME.to_string(), plan.task_name.clone()),
                (LABEL_RUN.to_string(), plan.run.to_string()),
            ]);
            if plan.pod {
                labels.insert(LABEL_POD_CONTAINER.to_string(), name.to_string());
            }
            labels
        };
        if !plan.pod {
            for container in &mut plan.containers {
                container.spec.name = prefix.clone();
                container.spec.labels.extend(labels(&container.name));
            }
            return Ok(());
        }
        let volume_prefix = format!("cube-{}", plan.task_id.simple());
        let volumes: Vec<String> = plan.volumes.clone();
        plan.volumes = volumes
            .iter()
            .map(|volume| format!("{volume_prefix}-{volume}"))
            .collect();
        let mut published: BTreeMap<String, String> = BTreeMap::new();
        let mut exposed: BTreeSet<String> = BTreeSet::new();
        // Every service's name answers on the pod's loopback, where the services listen: in a
        // shared namespace (the infra container's) or the host's. Docker refuses hosts entries
        // on a container that joins another's network, and such a container shares the other's
        // `/etc/hosts`: in a shared pod they all go on the infra container, with the services'
        // own `extra_hosts`. Without a network each container's loopback is its own: no entries.
        let service_hosts: Vec<String> = match plan.network {
            PodNetwork::Shared | PodNetwork::Host => plan
                .containers
                .iter()
                .map(|container| format!("{}:{POD_LOOPBACK}", container.name))
                .collect(),
            PodNetwork::None => Vec::new(),
        };
        let mut pod_hosts = service_hosts.clone();
        let infra_name = prefix.clone();
        for container in &mut plan.containers {
            container.spec.name = format!("{prefix}-{}", container.name);
            container.spec.labels.extend(labels(&container.name));
            container.spec.binds = container
                .spec
                .binds
                .iter()
                .map(|bind| match bind.split_once(':') {
                    Some((source, rest)) if volumes.iter().any(|v| v == source) => {
                        format!("{volume_prefix}-{source}:{rest}")
                    }
                    _ => bind.clone(),
                })
                .collect();
            match plan.network {
                PodNetwork::Shared => {
                    // The pod's ports are the infra container's: its namespace is theirs.
                    published.append(&mut container.spec.port_bindings);
                    exposed.append(&mut container.spec.exposed_ports);
                    container.spec.network_mode = Some(format!("container:{infra_name}"));
                    pod_hosts.append(&mut container.spec.extra_hosts);
                }
                PodNetwork::Host | PodNetwork::None => {
                    let own = std::mem::take(&mut container.spec.extra_hosts);
                    container.spec.extra_hosts = service_hosts.iter().cloned().chain(own).collect();
                    container.spec.port_bindings.clear();
                    container.spec.exposed_ports.clear();
                    container.spec.network_mode = Some(match plan.network {
                        PodNetwork::Host => "host".to_string(),
                        _ => "none".to_string(),
                    });
                }
            }
        }
        if plan.network == PodNetwork::Shared {
            let infra = PlannedContainer {
                name: INFRA.to_string(),
                infra: true,
                spec: ContainerSpec {
                    name: infra_name,
                    image: PAUSE_IMAGE.to_string(),
                    exposed_ports: published.keys().cloned().chain(exposed).collect(),
                    port_bindings: published,
                    labels: labels(INFRA),
                    extra_hosts: pod_hosts,
                    ..ContainerSpec::default()
                },
                depends_on: Vec::new(),
            };
            plan.containers.insert(0, infra);
        }
        Ok(())
    }
}

/// `node-env`: the node's name and zone, and the operator's labels and environment, in every
/// container.
pub struct NodeEnvPlugin {
    pub settings: NodeEnvSettings,
}

/// The environment variable holding the node's name.
pub const ENV_NODE: &str = "CUBE_NODE";
/// The environment variable holding the node's zone.
pub const ENV_ZONE: &str = "CUBE_ZONE";

impl PodPlugin for NodeEnvPlugin {
    fn name(&self) -> &str {
        "node-env"
    }

    fn pre_launch(&self, plan: &mut LaunchPlan) -> Result<(), String> {
        let zone = self
            .settings
            .zone
            .clone()
            .or_else(|| plan.node_labels.get("zone").cloned());
        let mut env = vec![(ENV_NODE.to_string(), plan.node.clone())];
        if let Some(zone) = &zone {
            env.push((ENV_ZONE.to_string(), zone.clone()));
        }
        env.extend(self.settings.env.clone());
        for container in plan.containers.iter_mut().filter(|c| !c.infra) {
            for (key, value) in &env {
                // The container's own setting wins over the node's.
                let prefix = format!("{key}=");
                if !container.spec.env.iter().any(|e| e.starts_with(&prefix)) {
                    container.spec.env.push(format!("{key}={value}"));
                }
            }
        }
        for container in &mut plan.containers {
            container
                .spec
                .labels
                .insert("cube.node-name".to_string(), plan.node.clone());
            if let Some(zone) = &zone {
                container
                    .spec
                    .labels
                    .insert("cube.zone".to_string(), zone.clone());
            }
            for (key, value) in &self.settings.labels {
                container
                    .spec
                    .labels
                    .entry(key.clone())
                    .or_insert(value.clone());
            }
        }
        Ok(())
    }
}

/// `journal`: a JSON line per call, appended to a file.
pub struct JournalPlugin {
    path: PathBuf,
    /// The open file; a `std` mutex, held for one small write.
    file: Mutex<std::fs::File>,
}

impl JournalPlugin {
    pub fn open(path: PathBuf) -> Result<JournalPlugin, String> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|err| {
                format!(
                    "plugins.journal.path: cannot open {}: {err}",
                    path.display()
                )
            })?;
        Ok(JournalPlugin {
            path,
            file: Mutex::new(file),
        })
    }

    fn write(&self, hook: &str, task: Option<Uuid>, containers: Vec<String>) -> Result<(), String> {
        let mut line = serde_json::json!({
            "Time": chrono::Utc::now().to_rfc3339(),
            "Hook": hook,
        });
        if let Some(task) = task {
            line["Task"] = serde_json::Value::String(task.to_string());
        }
        if !containers.is_empty() {
            line["Containers"] = serde_json::json!(containers);
        }
        let mut file = self
            .file
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        writeln!(file, "{line}")
            .map_err(|err| format!("cannot write to {}: {err}", self.path.display()))
    }
}

impl PodPlugin for JournalPlugin {
    fn name(&self) -> &str {
        "journal"
    }

    /// Records the containers as the plugins before it left them: what the order did.
    fn pre_launch(&self, plan: &mut LaunchPlan) -> Result<(), String> {
        let names = plan
            .containers
            .iter()
            .map(|c| c.spec.name.clone())
            .collect();
        self.write("pre_launch", Some(plan.task_id), names)
    }

    fn post_launch(&self, plan: &LaunchPlan, _task: &Task) -> Result<(), String> {
        let names = plan
            .containers
            .iter()
            .map(|c| c.spec.name.clone())
            .collect();
        self.write("post_launch", Some(plan.task_id), names)
    }

    fn pre_kill(&self, task: &Task) -> Result<(), String> {
        self.write("pre_kill", Some(task.id), Vec::new())
    }

    fn post_kill(&self, task: &Task) -> Result<(), String> {
        self.write("post_kill", Some(task.id), Vec::new())
    }

    fn shutdown(&self) -> Result<(), String> {
        self.write("shutdown", None, Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cube_types::Pod;

    fn pod_task() -> Task {
        let compose = "services:\n  a:\n    image: cube-sample:latest\n    ports: [\"8080:7777\"]\n    volumes: [\"data:/data\"]\n  b:\n    image: cube-sample:latest\n    depends_on: [a]\n    expose: [9000]\n    extra_hosts: [\"db.example:10.0.0.5\"]\n    user: \"1000:1000\"\n    working_dir: /srv\nvolumes:\n  data:\n";
        let mut task = Task::new("web", "");
        task.spec.pod = Some(Box::new(Pod::parse(compose, &BTreeMap::new()).unwrap()));
        task
    }

    #[test]
    fn the_general_plugin_adds_the_infra_container_and_moves_the_ports_onto_it() {
        let task = pod_task();
        let mut plan = LaunchPlan::for_task(&task, "w1", &Labels::new());
        PluginChain::default().pre_launch(&mut plan).unwrap();
        let names: Vec<&str> = plan.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, [INFRA, "a", "b"]);
        let infra = &plan.containers[0];
        assert_eq!(infra.spec.image, PAUSE_IMAGE);
        assert_eq!(
            infra.spec.port_bindings.get("7777/tcp").map(String::as_str),
            Some("8080")
        );
        let a = &plan.containers[1];
        assert!(a.spec.port_bindings.is_empty());
        assert_eq!(
            a.spec.network_mode.as_deref(),
            Some(format!("container:{}", infra.spec.name).as_str())
        );
        assert!(a.spec.name.starts_with(&infra.spec.name) && a.spec.name.ends_with("-a"));
        assert_eq!(a.spec.labels.get(LABEL_TASK_ID), Some(&task.id.to_string()));
        assert_eq!(
            a.spec.labels.get(LABEL_POD_CONTAINER).map(String::as_str),
            Some("a")
        );
        let volume = format!("cube-{}-data", task.id.simple());
        assert_eq!(plan.volumes, std::slice::from_ref(&volume));
        assert_eq!(a.spec.binds, [format!("{volume}:/data")]);
    }

    #[test]
    fn service_names_and_extra_hosts_go_on_the_infra_container_whose_hosts_file_the_pod_shares() {
        let task = pod_task();
        let mut plan = LaunchPlan::for_task(&task, "w1", &Labels::new());
        PluginChain::default().pre_launch(&mut plan).unwrap();
        let infra = &plan.containers[0];
        assert_eq!(
            infra.spec.extra_hosts,
            ["a:127.0.0.1", "b:127.0.0.1", "db.example:10.0.0.5"]
        );
        assert!(
            infra.spec.exposed_ports.contains("9000/tcp")
                && infra.spec.exposed_ports.contains("7777/tcp"),
            "{:?}",
            infra.spec.exposed_ports
        );
        let b = &plan.containers[2];
        assert!(
            b.spec.extra_hosts.is_empty(),
            "Docker refuses hosts entries on a container that joins another's network"
        );
        assert!(b.spec.exposed_ports.is_empty());
        assert_eq!(b.spec.user.as_deref(), Some("1000:1000"));
        assert_eq!(b.spec.working_dir.as_deref(), Some("/srv"));
    }

    #[test]
    fn in_the_hosts_network_each_container_has_the_service_names_and_without_one_none() {
        let compose = "services:\n  a:\n    image: x\n    network_mode: host\n    extra_hosts: [\"db:10.0.0.5\"]\n  b:\n    image: x\n    network_mode: host\n";
        let mut task = Task::new("h", "");
        task.spec.pod = Some(Box::new(Pod::parse(compose, &BTreeMap::new()).unwrap()));
        let mut plan = LaunchPlan::for_task(&task, "w1", &Labels::new());
        PluginChain::default().pre_launch(&mut plan).unwrap();
        assert_eq!(plan.containers.len(), 2, "no infra container");
        assert_eq!(
            plan.containers[0].spec.extra_hosts,
            ["a:127.0.0.1", "b:127.0.0.1", "db:10.0.0.5"]
        );
        assert_eq!(
            plan.containers[1].spec.extra_hosts,
            ["a:127.0.0.1", "b:127.0.0.1"]
        );
        let none = compose.replace("network_mode: host", "network_mode: none");
        task.spec.pod = Some(Box::new(Pod::parse(&none, &BTreeMap::new()).unwrap()));
        let mut plan = LaunchPlan::for_task(&task, "w1", &Labels::new());
        PluginChain::default().pre_launch(&mut plan).unwrap();
        assert_eq!(plan.containers[0].spec.extra_hosts, ["db:10.0.0.5"]);
        assert!(plan.containers[1].spec.extra_hosts.is_empty());
    }

    #[test]
    fn node_env_gives_every_container_but_the_infra_the_node_and_its_zone() {
        let task = pod_task();
        let labels = Labels::from([("zone".to_string(), "eu-1".to_string())]);
        let mut plan = LaunchPlan::for_task(&task, "w1", &labels);
        let chain = PluginChain::from_settings(&PluginSettings {
            order: vec!["general".into(), "node-env".into()],
            ..Default::default()
        })
        .unwrap();
        chain.pre_launch(&mut plan).unwrap();
        assert!(plan.containers[0].spec.env.is_empty());
        assert!(
            plan.containers[1]
                .spec
                .env
                .contains(&"CUBE_ZONE=eu-1".to_string())
        );
        assert!(
            plan.containers[2]
                .spec
                .env
                .contains(&"CUBE_NODE=w1".to_string())
        );
    }

    #[test]
    fn an_unknown_plugin_or_an_order_without_general_is_refused() {
        let unknown = PluginChain::from_settings(&PluginSettings {
            order: vec!["general".into(), "nope".into()],
            ..Default::default()
        })
        .unwrap_err();
        assert!(unknown.contains("plugins.order[1]") && unknown.contains("nope"));
        let without = PluginChain::from_settings(&PluginSettings {
            order: vec!["node-env".into()],
            ..Default::default()
        })
        .unwrap_err();
        assert!(without.contains("general"));
    }

    struct Failing;
    impl PodPlugin for Failing {
        fn name(&self) -> &str {
            "failing"
        }
        fn pre_launch(&self, _plan: &mut LaunchPlan) -> Result<(), String> {
            Err("no room for this pod".into())
        }
    }

    #[test]
    fn a_plugin_error_names_the_plugin_and_the_hook() {
        let chain = PluginChain::new(vec![Box::new(GeneralPlugin), Box::new(Failing)]);
        let mut plan = LaunchPlan::for_task(&pod_task(), "w1", &Labels::new());
        let err = chain.pre_launch(&mut plan).unwrap_err().to_string();
        assert_eq!(
            err,
            "plugin failing failed in pre_launch: no room for this pod"
        );
    }
}
