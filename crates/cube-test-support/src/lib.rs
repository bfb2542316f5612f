//! What Cube's tests share, and nothing else uses: a real etcd cluster ([`EtcdCluster`]),
//! one member or several, on free loopback ports and in a temporary directory, stopped
//! when the test drops it.
//!
//! A test that needs etcd fails, saying how to install it, when no `etcd` binary is found:
//! it is never skipped silently.

mod etcd;

pub use etcd::{EtcdCluster, etcd_binary};
