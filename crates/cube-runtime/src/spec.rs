//! What to create: a container specification derived from a task.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use cube_types::Task;
use cube_types::pod::Healthcheck;

use crate::{LABEL_NODE, LABEL_TASK_ID, LABEL_TASK_NAME};

/// Everything the engine needs to create a task's container.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContainerSpec {
    pub name: String,
    pub image: String,
    pub cmd: Vec<String>,
    pub env: Vec<String>,
    /// 0 means no limit.
    pub cpu_cores: f64,
    /// 0 means no limit.
    pub memory_bytes: u64,
    pub exposed_ports: BTreeSet<String>,
    /// Container port → host port ("" lets the engine choose).
    pub port_bindings: BTreeMap<String, String>,
    pub labels: HashMap<String, String>,
    /// Replaces the image's entrypoint when set.
    pub entrypoint: Option<Vec<String>>,
    /// Docker's network mode: `container:<id>` to join a pod's infra container, `host`,
    /// `none`; unset for the default bridge.
    pub network_mode: Option<String>,
    /// `SOURCE:TARGET[:ro]`: named volumes and host paths.
    pub binds: Vec<String>,
    /// A health check the engine runs in the container.
    pub healthcheck: Option<Healthcheck>,
    /// The user the process runs as (`name`, `uid`, `uid:gid`); unset: the image's.
    pub user: Option<String>,
    /// The directory the process starts in; unset: the image's.
    pub working_dir: Option<String>,
    /// More `/etc/hosts` entries, `HOST:IP` (Docker refuses them on a container that joins
    /// another's network: a pod's go on its infra container, whose hosts file they share).
    pub extra_hosts: Vec<String>,
}

impl ContainerSpec {
    /// The container for `task` on the worker `node`, labelled so that a restarted worker can
    /// find it again.
    pub fn for_task(task: &Task, node: &str) -> ContainerSpec {
        let labels = HashMap::from([
            (LABEL_TASK_ID.to_string(), task.id.to_string()),
            (LABEL_NODE.to_string(), node.to_string()),
            (LABEL_TASK_NAME.to_string(), task.name.clone()),
        ]);
        ContainerSpec {
            name: container_name(task, node),
            image: task.spec.image.clone(),
            cmd: task.spec.cmd.clone(),
            env: task.spec.env.clone(),
            cpu_cores: task.spec.cpu,
            memory_bytes: task.spec.memory,
            exposed_ports: task.spec.exposed_ports.clone(),
            port_bindings: task.spec.port_bindings.clone(),
            labels,
            entrypoint: None,
            network_mode: None,
            binds: Vec::new(),
            healthcheck: None,
            user: None,
            working_dir: None,
            extra_hosts: Vec::new(),
        }
    }
}

/// `cube-<node>-<name>-<id>` for a task's first run, `...-r<N>` for its N-th restart, with
/// the characters Docker refuses in names replaced by `-`. The ID is the task's whole ID (32
/// hex digits): two tasks of the same name whose IDs share their first digits must never
/// meet on one name, or the second would be handed the first's container. The node is in the name
/// because several workers may share one Docker engine (a test machine, `cube dev` with extra
/// workers): each must create its own container for a task, never find another worker's. The
/// run is in the name so that a restart's container can be created while the last run's is
/// still being removed: the removal is off the path of the restart.
pub fn container_name(task: &Task, node: &str) -> String {
    let mut name = format!(
        "cube-{}-{}-{}",
        docker_safe(node),
        docker_safe(&task.name),
        task.id.simple()
    );
    if task.status.restart_count > 0 {
        name.push_str(&format!("-r{}", task.status.restart_count));
    }
    name
}

pub(crate) fn docker_safe(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_names_are_docker_safe_and_unique_per_task() {
        let task = Task::new("my web/app 1", "busybox");
        let name = container_name(&task, "w 1");
        assert_eq!(name, format!("cube-w-1-my-web-app-1-{}", task.id.simple()));
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        );
    }

    #[test]
    fn two_tasks_whose_ids_share_a_prefix_never_share_a_container_name() {
        let mut first = Task::new("web", "busybox");
        first.id = uuid::Uuid::parse_str("fb4ec51b-0000-4000-8000-00000000000a").unwrap();
        let mut second = first.clone();
        second.id = uuid::Uuid::parse_str("fb4ec51b-0000-4000-8000-00000000000b").unwrap();
        assert_ne!(container_name(&first, "w1"), container_name(&second, "w1"));
    }

    #[test]
    fn each_restart_gets_a_container_name_of_its_own() {
        let mut task = Task::new("web", "busybox");
        let first = container_name(&task, "w1");
        task.status.restart_count = 2;
        assert_eq!(container_name(&task, "w1"), format!("{first}-r2"));
    }

    #[test]
    fn the_spec_carries_the_labels_a_restarted_worker_looks_for() {
        let task = Task::new("web", "busybox");
        let spec = ContainerSpec::for_task(&task, "w1");
        assert_eq!(spec.labels.get(LABEL_TASK_ID), Some(&task.id.to_string()));
        assert_eq!(spec.labels.get(LABEL_NODE).map(String::as_str), Some("w1"));
    }
}
