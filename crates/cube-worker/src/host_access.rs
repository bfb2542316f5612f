//! What a task may reach of its worker's host, as the worker's configuration allows it.
//!
//! By default a task reaches nothing of its host: a bind mount must be under one of
//! `allowed_host_paths` (none by default), the Docker socket is never mounted unless
//! `allow_docker_socket: true` (whoever holds it holds the host), and the host's network only
//! with `allow_host_network: true`. What no setting allows (privileged mode, added
//! capabilities, the host's PID or IPC namespace, devices) a task cannot even ask for: a single
//! container's spec has no such field, and the compose reader refuses those keys by name
//! (`cube_types::pod`). Every container Cube creates runs with `no-new-privileges`
//! (`cube_runtime::docker`).
//!
//! The worker reports this configuration with its node (`HostPolicy`, [`HostAccess::policy`]),
//! and the manager's placement leaves out a node that would refuse a task. The check here
//! still runs when a task is submitted to the worker (the manager then fails the task with the
//! refusal, which `cube status` shows) and again when it starts, for a task accepted under an
//! earlier configuration. Paths are compared once normalised (`/data/../etc` is
//! `/etc`, not under `/data`), and once more with symbolic links resolved where the path
//! exists on this host, as the engine would resolve them.

use std::path::{Path, PathBuf};

use cube_types::node::{DOCKER_SOCKETS, normalised as normalise};
use cube_types::pod::{MountKind, PodNetwork};
use cube_types::{HostPolicy, Task};

/// What the worker's configuration lets a task reach of the host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostAccess {
    /// Directories a bind mount may be under (itself or below), absolute and normalised.
    pub allowed_host_paths: Vec<PathBuf>,
    /// `network_mode: host` allowed.
    pub allow_host_network: bool,
    /// A bind mount of the Docker socket (or a directory holding it) allowed.
    pub allow_docker_socket: bool,
}

impl HostAccess {
    /// Reads the configuration's `allowed_host_paths`: each must be absolute.
    pub fn new(
        allowed_host_paths: &[String],
        allow_host_network: bool,
        allow_docker_socket: bool,
    ) -> Result<HostAccess, String> {
        let mut allowed = Vec::new();
        for written in allowed_host_paths {
            if !written.starts_with('/') {
                return Err(format!(
                    "allowed_host_paths: {written:?} is not an absolute path"
                ));
            }
            allowed.push(normalise(Path::new(written)));
        }
        Ok(HostAccess {
            allowed_host_paths: allowed,
            allow_host_network,
            allow_docker_socket,
        })
    }

    /// This configuration as the worker reports it with its node, for placement: each
    /// allowed directory as written and, where it differs, as this host resolves it (a bind
    /// mount may be written either way), so that the manager never refuses what this worker
    /// would take. The check here stays the authority.
    pub fn policy(&self) -> HostPolicy {
        let mut allowed_host_paths: Vec<String> = Vec::new();
        for allowed in &self.allowed_host_paths {
            let resolved = std::fs::canonicalize(allowed).ok();
            for path in std::iter::once(allowed).chain(resolved.as_ref()) {
                let shown = path.display().to_string();
                if !allowed_host_paths.contains(&shown) {
                    allowed_host_paths.push(shown);
                }
            }
        }
        HostPolicy {
            allowed_host_paths,
            allow_host_network: self.allow_host_network,
            allow_docker_socket: self.allow_docker_socket,
        }
    }

    /// Whether `task` stays within what this worker allows; else every refusal, each naming
    /// the field and the setting that would allow it.
    pub fn check(&self, task: &Task) -> Result<(), String> {
        let mut refusals = Vec::new();
        for (n, mount) in task.spec.volumes.iter().enumerate() {
            if mount.is_bind()
                && let Err(why) = self.check_bind(&mount.source)
            {
                refusals.push(format!("Volumes[{n}]: {why}"));
            }
        }
        let Some(pod) = &task.spec.pod else {
            return if refusals.is_empty() {
                Ok(())
            } else {
                Err(refusals.join("; "))
            };
        };
        if pod.spec.network == PodNetwork::Host && !self.allow_host_network {
            refusals.push(
                "network_mode: host refused: the host's network is not allowed on this worker \
                 (allow_host_network: true in the worker's configuration allows it)"
                    .to_string(),
            );
        }
        for service in &pod.spec.services {
            for mount in &service.mounts {
                if mount.kind != MountKind::Bind {
                    continue;
                }
                if let Err(why) = self.check_bind(&mount.source) {
                    refusals.push(format!("services.{}.volumes: {why}", service.name));
                }
            }
        }
        if refusals.is_empty() {
            Ok(())
        } else {
            Err(refusals.join("; "))
        }
    }

    /// One bind mount's host path, as written and as the host resolves it.
    fn check_bind(&self, source: &str) -> Result<(), String> {
        let written = normalise(Path::new(source));
        let resolved = std::fs::canonicalize(&written).ok();
        let forms: Vec<&Path> = std::iter::once(written.as_path())
            .chain(resolved.as_deref())
            .collect();
        let allowed_resolved: Vec<PathBuf> = self
            .allowed_host_paths
            .iter()
            .map(|allowed| std::fs::canonicalize(allowed).unwrap_or_else(|_| allowed.clone()))
            .collect();
        let under_allowed = |path: &Path| {
            self.allowed_host_paths
                .iter()
                .chain(&allowed_resolved)
                .any(|allowed| path.starts_with(allowed))
        };
        // The socket itself is named as such, whatever else refuses it.
        let socket = (!self.allow_docker_socket)
            .then(|| docker_socket_under(&forms))
            .flatten();
        let socket_refusal = |socket: &Path| {
            format!(
                "bind mount of {} refused: it gives the task the Docker socket ({}), and with \
                 it the host (allow_docker_socket: true in the worker's configuration allows it)",
                written.display(),
                socket.display()
            )
        };
        if let Some((socket, true)) = socket {
            return Err(socket_refusal(socket));
        }
        if !forms.iter().all(|path| under_allowed(path)) {
            let allowed = if self.allowed_host_paths.is_empty() {
                "empty".to_string()
            } else {
                self.allowed_host_paths
                    .iter()
                    .map(|path| path.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let shown = match &resolved {
                Some(resolved) if resolved != &written => {
                    format!("{} (resolved to {})", written.display(), resolved.display())
                }
                _ => written.display().to_string(),
            };
            return Err(format!(
                "bind mount of {shown} refused: not under any allowed_host_paths in the \
                 worker's configuration ({allowed})"
            ));
        }
        if let Some((socket, _)) = socket {
            return Err(socket_refusal(socket));
        }
        Ok(())
    }
}

/// The Docker socket a bind mount of any of `forms` would give, in either spelling and
/// resolved, and whether the mount is the socket itself (not a directory holding it).
fn docker_socket_under(forms: &[&Path]) -> Option<(&'static Path, bool)> {
    DOCKER_SOCKETS.iter().map(Path::new).find_map(|socket| {
        let spellings: Vec<PathBuf> = std::iter::once(socket.to_path_buf())
            .chain(std::fs::canonicalize(socket).ok())
            .collect();
        let given = forms
            .iter()
            .any(|path| spellings.iter().any(|spelling| spelling.starts_with(path)));
        let exact = forms
            .iter()
            .any(|path| spellings.iter().any(|spelling| spelling == path));
        given.then_some((socket, exact))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn pod_task(compose: &str) -> Task {
        let mut task = Task::new("p", "x");
        task.spec.pod = Some(Box::new(
            cube_types::pod::Pod::parse(compose, &BTreeMap::new()).unwrap(),
        ));
        task
    }

    fn bind(source: &str) -> Task {
        pod_task(&format!(
            "services:\n  a:\n    image: x\n    volumes:\n      - {source}:/mnt\n"
        ))
    }

    #[test]
    fn the_reported_policy_holds_each_allowed_path_as_written_and_resolved() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let access = HostAccess::new(&[link.display().to_string()], true, false).unwrap();
        let policy = access.policy();
        let resolved = std::fs::canonicalize(&real).unwrap();
        assert_eq!(
            policy.allowed_host_paths,
            vec![link.display().to_string(), resolved.display().to_string()]
        );
        assert!(policy.allow_host_network);
        assert!(!policy.allow_docker_socket);
        // What the worker takes, the policy never refuses: a mount written either way.
        for written in [&link, &resolved] {
            let task = bind(&format!("{}/data", written.display()));
            assert!(access.check(&task).is_ok());
            let needs = cube_types::HostNeeds::of(&task).unwrap();
            assert_eq!(policy.refusal(&needs), None, "{}", written.display());
        }
    }

    #[test]
    fn paths_are_normalised_without_the_file_system() {
        assert_eq!(normalise(Path::new("/data/../etc")), Path::new("/etc"));
        assert_eq!(normalise(Path::new("//var/./run/")), Path::new("/var/run"));
        assert_eq!(normalise(Path::new("/../..")), Path::new("/"));
    }

    #[test]
    fn by_default_a_bind_mount_of_the_root_is_refused_naming_the_setting() {
        let err = HostAccess::default().check(&bind("/")).unwrap_err();
        assert_eq!(
            err,
            "services.a.volumes: bind mount of / refused: not under any allowed_host_paths in \
             the worker's configuration (empty)"
        );
    }

    #[test]
    fn a_bind_mount_under_an_allowed_path_is_accepted_and_a_way_out_of_it_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().display().to_string();
        let access = HostAccess::new(std::slice::from_ref(&root), false, false).unwrap();
        access.check(&bind(&format!("{root}/sub"))).unwrap();
        access.check(&bind(&root)).unwrap();
        let err = access.check(&bind(&format!("{root}/../etc"))).unwrap_err();
        assert!(err.contains("not under any allowed_host_paths"), "{err}");
        assert!(err.contains(&root), "{err}");
        let sibling = format!("{root}x");
        assert!(
            access.check(&bind(&sibling)).is_err(),
            "a prefix is not a parent"
        );
    }

    #[test]
    fn a_link_out_of_an_allowed_path_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("out");
        std::os::unix::fs::symlink("/etc", &link).unwrap();
        let access = HostAccess::new(&[dir.path().display().to_string()], false, false).unwrap();
        let err = access
            .check(&bind(&link.display().to_string()))
            .unwrap_err();
        assert!(err.contains("resolved to /etc"), "{err}");
    }

    #[test]
    fn the_docker_socket_is_refused_in_any_spelling_even_under_an_allowed_path() {
        let access = HostAccess::new(&["/".to_string()], false, false).unwrap();
        for source in [
            "/var/run/docker.sock",
            "/run/docker.sock",
            "//var/run/../run/./docker.sock",
            "/var/run",
            "/run",
            "/",
        ] {
            let err = access.check(&bind(source)).unwrap_err();
            assert!(
                err.contains("Docker socket") && err.contains("allow_docker_socket: true"),
                "{source}: {err}"
            );
        }
        // The socket is named as such even where no path is allowed at all.
        for source in ["/run/docker.sock", "/var/run/docker.sock"] {
            let err = HostAccess::default().check(&bind(source)).unwrap_err();
            assert!(err.contains("Docker socket"), "{source}: {err}");
        }
        let allowed = HostAccess::new(&["/".to_string()], false, true).unwrap();
        allowed.check(&bind("/var/run/docker.sock")).unwrap();
    }

    #[test]
    fn the_host_network_needs_its_setting() {
        let task = pod_task("services:\n  a:\n    image: x\n    network_mode: host\n");
        let err = HostAccess::default().check(&task).unwrap_err();
        assert!(
            err.contains("network_mode: host") && err.contains("allow_host_network: true"),
            "{err}"
        );
        let allowed = HostAccess::new(&[], true, false).unwrap();
        allowed.check(&task).unwrap();
    }

    #[test]
    fn a_relative_allowed_path_is_refused() {
        let err = HostAccess::new(&["data".to_string()], false, false).unwrap_err();
        assert!(err.contains("allowed_host_paths"), "{err}");
    }

    #[test]
    fn single_containers_and_named_volumes_reach_nothing_of_the_host() {
        HostAccess::default().check(&Task::new("t", "x")).unwrap();
        let task = pod_task(
            "services:\n  a:\n    image: x\n    volumes:\n      - data:/d\nvolumes:\n  data: {}\n",
        );
        HostAccess::default().check(&task).unwrap();
    }
}
