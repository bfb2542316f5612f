//! `cube router`: the stable address of Cube's services.
//!
//! The router follows the manager's `GET /routes` (blocking queries: it asks again as soon
//! as an answer comes, and the manager answers when a route changes) into a [`RouteTable`],
//! swapped whole on each change. From it:
//! - [`proxy`] serves HTTP/1.1 and HTTP/2 and sends each request, by its `Host`, to the
//!   route's copy with the fewest requests outstanding; [`tcp`] forwards plain TCP ports to
//!   a route's copies;
//! - [`haproxy`] writes a real HAProxy's configuration from the same table and reloads it,
//!   for those who run HAProxy already;
//! - [`metrics`] counts requests, errors and latency per route for `/metrics`.

pub mod haproxy;
pub mod metrics;
pub mod proxy;
pub mod table;
pub mod tcp;

pub use metrics::RouterMetrics;
pub use proxy::Router;
pub use table::{Pick, RouteTable, Target};
pub use tcp::serve_tcp;
