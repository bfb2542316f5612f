//! What Cube's tests share, and nothing else uses: a real etcd cluster ([`EtcdCluster`]),
//! one member or several, on free loopback ports and in a temporary directory, stopped
//! when the test drops it; and a real headless browser ([`Browser`]: Chromium through
//! `chromedriver`) for the web UI's tests.
//!
//! A test that needs etcd or Chromium fails, saying how to install it, when it is not
//! found: it is never skipped silently.

pub mod browser;
mod etcd;
mod haproxy;
mod http;
pub mod registry;

pub use browser::Browser;
pub use etcd::{EtcdCluster, etcd_binary};
pub use haproxy::{Haproxy, haproxy_binary};
pub use http::{counting_server, open_settles_at};
pub use registry::Registry;
