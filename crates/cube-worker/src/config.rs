//! The worker's configuration file (`cube worker --config FILE`): how pods are launched,
//! watched and killed, and the plugin chain.
//!
//! ```yaml
//! pod_monitor:
//!   interval: 30s          # the safety net: every pod checked this often, events or not
//! launch:
//!   timeout: 2m            # a run not running by then is removed and Failed
//!   pull_retries: 2        # after the first attempt, with a backoff doubling from:
//!   pull_backoff: 1s
//! stop:
//!   timeout: 10s           # what --stop-timeout says
//!   remove_containers: false   # on a stop, remove the containers (else kept for `cube logs`)
//!   remove_volumes: false      # ... and a pod's named volumes
//!   remove_images: false       # ... and the images no other container uses
//! plugins:
//!   order: [general, node-env]
//!   node-env: {zone: eu-1, env: {REGION: eu}, labels: {team: web}}
//! allowed_host_paths: [/srv/cube]  # bind mounts only under these (none by default)
//! allow_host_network: false        # network_mode: host
//! allow_docker_socket: false       # a bind mount of the Docker socket or its directory
//! ```
//!
//! Every key is checked: an unknown one is refused with its name and line.

use std::time::Duration;

use serde::Deserialize;

use crate::host_access::HostAccess;
use crate::plugin::{PluginChain, PluginSettings};

/// What the file holds, every section optional.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    #[serde(default)]
    pub pod_monitor: MonitorSection,
    #[serde(default)]
    pub launch: LaunchSection,
    #[serde(default)]
    pub stop: StopSection,
    #[serde(default)]
    pub plugins: PluginSettings,
    /// The host directories a task's bind mounts may be under (`host_access.rs`).
    #[serde(default)]
    pub allowed_host_paths: Vec<String>,
    #[serde(default)]
    pub allow_host_network: bool,
    #[serde(default)]
    pub allow_docker_socket: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MonitorSection {
    #[serde(default, with = "cube_types::duration::optional")]
    pub interval: Option<Duration>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchSection {
    #[serde(default, with = "cube_types::duration::optional")]
    pub timeout: Option<Duration>,
    #[serde(default)]
    pub pull_retries: Option<u32>,
    #[serde(default, with = "cube_types::duration::optional")]
    pub pull_backoff: Option<Duration>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StopSection {
    #[serde(default, with = "cube_types::duration::optional")]
    pub timeout: Option<Duration>,
    #[serde(default)]
    pub remove_containers: bool,
    #[serde(default)]
    pub remove_volumes: bool,
    #[serde(default)]
    pub remove_images: bool,
}

/// The most retries of a pull the file may ask for.
const MAX_PULL_RETRIES: u32 = 10;

impl ConfigFile {
    /// Reads the file's text; the error names the key and its line.
    pub fn parse(text: &str) -> Result<ConfigFile, String> {
        if text.trim().is_empty() {
            return Ok(ConfigFile::default());
        }
        let file: ConfigFile = serde_norway::from_str(text).map_err(|err| err.to_string())?;
        let checks = [
            ("pod_monitor.interval", file.pod_monitor.interval),
            ("launch.timeout", file.launch.timeout),
            ("stop.timeout", file.stop.timeout),
        ];
        for (key, value) in checks {
            if value.is_some_and(|value| value.is_zero()) {
                return Err(format!("{key}: must be longer than 0"));
            }
        }
        if let Some(retries) = file.launch.pull_retries
            && retries > MAX_PULL_RETRIES
        {
            return Err(format!(
                "launch.pull_retries: {retries}; at most {MAX_PULL_RETRIES}"
            ));
        }
        HostAccess::new(
            &file.allowed_host_paths,
            file.allow_host_network,
            file.allow_docker_socket,
        )?;
        if file.stop.remove_volumes && !file.stop.remove_containers {
            return Err(
                "stop.remove_volumes: a volume is removed with its containers; set \
                 stop.remove_containers too"
                    .to_string(),
            );
        }
        Ok(file)
    }

    /// The settings the worker runs with, the plugin chain built (an unknown plugin refused).
    pub fn settings(&self) -> Result<PodSettings, String> {
        let defaults = PodSettings::default();
        Ok(PodSettings {
            monitor_interval: self
                .pod_monitor
                .interval
                .unwrap_or(defaults.monitor_interval),
            launch_timeout: self.launch.timeout.unwrap_or(defaults.launch_timeout),
            pull_retries: self.launch.pull_retries.unwrap_or(defaults.pull_retries),
            pull_backoff: self.launch.pull_backoff.unwrap_or(defaults.pull_backoff),
            remove_containers_on_kill: self.stop.remove_containers,
            remove_volumes_on_kill: self.stop.remove_volumes,
            remove_images_on_kill: self.stop.remove_images,
            plugins: PluginChain::from_settings(&self.plugins)?,
            host_access: HostAccess::new(
                &self.allowed_host_paths,
                self.allow_host_network,
                self.allow_docker_socket,
            )?,
        })
    }
}

/// How the worker launches, watches and kills its tasks' containers.
#[derive(Debug, Clone)]
pub struct PodSettings {
    /// How often every task is compared with its containers even when no event said
    /// anything (the pod monitor's safety net).
    pub monitor_interval: Duration,
    /// How long a run may take to have every container running (pulls and health waits
    /// included).
    pub launch_timeout: Duration,
    /// Pulls tried again after the first failure, each after `pull_backoff` doubled.
    pub pull_retries: u32,
    pub pull_backoff: Duration,
    /// On a stop: remove the run's containers instead of keeping them for `cube logs`.
    pub remove_containers_on_kill: bool,
    /// On a stop: remove a pod's named volumes (with its containers).
    pub remove_volumes_on_kill: bool,
    /// On a stop: remove the images no other container uses.
    pub remove_images_on_kill: bool,
    pub plugins: PluginChain,
    /// What a task may reach of the host: bind mounts, the host's network, the Docker socket.
    pub host_access: HostAccess,
}

impl Default for PodSettings {
    fn default() -> PodSettings {
        PodSettings {
            monitor_interval: Duration::from_secs(30),
            launch_timeout: Duration::from_secs(300),
            pull_retries: 2,
            pull_backoff: Duration::from_secs(1),
            remove_containers_on_kill: false,
            remove_volumes_on_kill: false,
            remove_images_on_kill: false,
            plugins: PluginChain::default(),
            host_access: HostAccess::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_file_reads_into_settings() {
        let text = "pod_monitor:\n  interval: 5s\nlaunch:\n  timeout: 1m\n  pull_retries: 3\nstop:\n  remove_containers: true\nplugins:\n  order: [general, node-env]\n  node-env:\n    zone: eu-1\n";
        let settings = ConfigFile::parse(text).unwrap().settings().unwrap();
        assert_eq!(settings.monitor_interval, Duration::from_secs(5));
        assert_eq!(settings.launch_timeout, Duration::from_secs(60));
        assert_eq!(settings.pull_retries, 3);
        assert!(settings.remove_containers_on_kill);
        assert_eq!(settings.plugins.names(), ["general", "node-env"]);
    }

    #[test]
    fn an_unknown_key_is_named_with_its_line() {
        let err = ConfigFile::parse("launch:\n  timeout: 1m\n  retries: 3\n").unwrap_err();
        assert!(err.contains("retries") && err.contains("line 3"), "{err}");
        let err = ConfigFile::parse("pod_monitor:\n  interval: 5\n").unwrap_err();
        assert!(err.contains("interval"), "{err}");
    }

    #[test]
    fn host_access_is_read_and_an_allowed_path_must_be_absolute() {
        let text = "allowed_host_paths: [/srv/cube/../data]\nallow_host_network: true\n";
        let settings = ConfigFile::parse(text).unwrap().settings().unwrap();
        assert_eq!(
            settings.host_access.allowed_host_paths,
            [std::path::PathBuf::from("/srv/data")]
        );
        assert!(settings.host_access.allow_host_network);
        assert!(!settings.host_access.allow_docker_socket);
        let err = ConfigFile::parse("allowed_host_paths: [data]\n").unwrap_err();
        assert!(
            err.contains("allowed_host_paths") && err.contains("absolute"),
            "{err}"
        );
        let defaults = ConfigFile::default().settings().unwrap().host_access;
        assert_eq!(defaults, HostAccess::default());
    }

    #[test]
    fn an_unknown_plugin_is_refused_at_start() {
        let file = ConfigFile::parse("plugins:\n  order: [general, zoner]\n").unwrap();
        let err = file.settings().unwrap_err();
        assert!(err.contains("zoner"), "{err}");
    }
}
