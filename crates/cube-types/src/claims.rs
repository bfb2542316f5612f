//! What is placed on a node, as every manager that places sees it: the **claims** kept
//! beside the tables on etcd (`alloc/NODE`), one record per node, changed in the same
//! transaction as the task records placed on or taken off the node.
//!
//! Several managers place at once when each owns a range of the shard ring (issue 32's
//! placement without double-booking). Each holds only its own projects' tasks, so none can
//! sum a node's load from tasks; it reads the node's claims instead, and commits a placement
//! only if the claims of every node it chose are still those it read (Omega's shared
//! state: an etcd transaction comparing their `mod_revision`). A placement that lost the
//! race reads the fresher claims and is planned again at once.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::task::{HostPort, PortProtocol};

/// The table-like prefix of the claims on etcd: `alloc/NODE`.
pub const CLAIMS_PREFIX: &str = "alloc/";

/// The key of a node's claims, relative to the store's prefix.
pub fn claims_key(node: &str) -> String {
    format!("{CLAIMS_PREFIX}{node}")
}

/// One node's claims: the sum of what the tasks placed on it asked for.
///
/// CPU is counted in thousandths of a core, so that adding and taking off the same requests
/// in any order comes back to exactly zero (a sum of `f64` would drift).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeClaims {
    #[serde(rename = "CpuMillis", default)]
    pub cpu_millis: u64,
    #[serde(rename = "Memory", default)]
    pub memory: u64,
    #[serde(rename = "Disk", default)]
    pub disk: u64,
    #[serde(rename = "Tasks", default)]
    pub tasks: u64,
    /// The host ports taken, as people write them (`7777`, `53/udp`).
    #[serde(rename = "Ports", default, skip_serializing_if = "BTreeSet::is_empty")]
    pub ports: BTreeSet<String>,
}

/// What one task asks of its node, in the claims' units.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Claim {
    /// Cores; a negative or not-a-number request claims none.
    pub cpu: f64,
    pub memory: u64,
    pub disk: u64,
    pub ports: BTreeSet<HostPort>,
}

/// Cores in thousandths, rounded to the nearest: the unit the claims count in.
pub fn cpu_millis(cores: f64) -> u64 {
    if cores.is_finite() && cores > 0.0 {
        (cores * 1000.0).round() as u64
    } else {
        0
    }
}

impl NodeClaims {
    /// Counts `claim` as placed on the node.
    pub fn add(&mut self, claim: &Claim) {
        self.cpu_millis = self.cpu_millis.saturating_add(cpu_millis(claim.cpu));
        self.memory = self.memory.saturating_add(claim.memory);
        self.disk = self.disk.saturating_add(claim.disk);
        self.tasks = self.tasks.saturating_add(1);
        self.ports
            .extend(claim.ports.iter().map(|port| port.to_string()));
    }

    /// Takes `claim` off the node: what [`NodeClaims::add`] added, never below zero.
    pub fn remove(&mut self, claim: &Claim) {
        self.cpu_millis = self.cpu_millis.saturating_sub(cpu_millis(claim.cpu));
        self.memory = self.memory.saturating_sub(claim.memory);
        self.disk = self.disk.saturating_sub(claim.disk);
        self.tasks = self.tasks.saturating_sub(1);
        for port in &claim.ports {
            self.ports.remove(&port.to_string());
        }
    }

    /// The CPU claimed, in cores.
    pub fn cpu(&self) -> f64 {
        self.cpu_millis as f64 / 1000.0
    }

    /// Adds what these claims hold to a node's `allocated` resources and its `task_count`:
    /// the node as the other shards' placements hold it too.
    pub fn add_to(&self, allocated: &mut crate::node::Resources, task_count: &mut usize) {
        allocated.cpu += self.cpu();
        allocated.memory = allocated.memory.saturating_add(self.memory);
        allocated.disk = allocated.disk.saturating_add(self.disk);
        *task_count = task_count.saturating_add(usize::try_from(self.tasks).unwrap_or(usize::MAX));
    }

    /// The host ports taken; a port this release cannot read is left out (it was written
    /// by [`NodeClaims::add`], so there is none).
    pub fn host_ports(&self) -> BTreeSet<HostPort> {
        self.ports
            .iter()
            .filter_map(|port| port.parse::<HostPort>().ok())
            .collect()
    }

    /// Nothing claimed.
    pub fn is_empty(&self) -> bool {
        *self == NodeClaims::default()
    }
}

/// A host port as [`HostPort`]'s `Display` writes it: `7777`, `53/udp`, `9/sctp`
/// (`7777/tcp` too).
impl FromStr for HostPort {
    type Err = String;

    fn from_str(text: &str) -> Result<HostPort, String> {
        let (number, protocol) = match text.split_once('/') {
            None => (text, PortProtocol::Tcp),
            Some((number, "tcp")) => (number, PortProtocol::Tcp),
            Some((number, "udp")) => (number, PortProtocol::Udp),
            Some((number, "sctp")) => (number, PortProtocol::Sctp),
            Some((_, other)) => return Err(format!("unknown protocol {other:?} in {text:?}")),
        };
        let port = number
            .parse::<u16>()
            .map_err(|_| format!("{text:?} is not a port number"))?;
        Ok(HostPort { port, protocol })
    }
}

impl fmt::Display for NodeClaims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} tasks, {:.3} cores, {} B memory, {} B disk",
            self.tasks,
            self.cpu(),
            self.memory,
            self.disk
        )?;
        if !self.ports.is_empty() {
            let ports: Vec<&str> = self.ports.iter().map(String::as_str).collect();
            write!(f, ", ports {}", ports.join(" "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(cpu: f64, memory: u64, ports: &[HostPort]) -> Claim {
        Claim {
            cpu,
            memory,
            disk: 0,
            ports: ports.iter().copied().collect(),
        }
    }

    #[test]
    fn adding_and_removing_the_same_claims_in_any_order_comes_back_to_nothing() {
        let claims = [
            claim(0.1, 1, &[]),
            claim(0.2, 2, &[HostPort::tcp(80)]),
            claim(0.3, 3, &[]),
            claim(1.0 / 3.0, 4, &[]),
        ];
        let mut node = NodeClaims::default();
        for one in &claims {
            node.add(one);
        }
        assert_eq!(node.cpu_millis, 100 + 200 + 300 + 333);
        assert_eq!(node.tasks, 4);
        assert_eq!(node.host_ports(), [HostPort::tcp(80)].into_iter().collect());
        for one in claims.iter().rev() {
            node.remove(one);
        }
        assert!(node.is_empty(), "{node:?}");
        node.remove(&claims[0]);
        assert!(node.is_empty(), "never below zero: {node:?}");
    }

    #[test]
    fn host_ports_read_back_as_written() {
        for port in [
            HostPort::tcp(7777),
            HostPort {
                port: 53,
                protocol: PortProtocol::Udp,
            },
            HostPort {
                port: 9,
                protocol: PortProtocol::Sctp,
            },
        ] {
            assert_eq!(port.to_string().parse::<HostPort>(), Ok(port));
        }
        assert_eq!("80/tcp".parse::<HostPort>(), Ok(HostPort::tcp(80)));
        assert!("80/icmp".parse::<HostPort>().is_err());
        assert!("http".parse::<HostPort>().is_err());
    }

    #[test]
    fn claims_are_stored_with_the_wire_names() {
        let mut node = NodeClaims::default();
        node.add(&claim(0.5, 64, &[HostPort::tcp(7777)]));
        let json = serde_json::to_string(&node).unwrap();
        assert_eq!(
            json,
            r#"{"CpuMillis":500,"Memory":64,"Disk":0,"Tasks":1,"Ports":["7777"]}"#
        );
        assert_eq!(serde_json::from_str::<NodeClaims>(&json).unwrap(), node);
    }
}
