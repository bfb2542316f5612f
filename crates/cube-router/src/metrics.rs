//! The router's metrics, in the Prometheus text format (`GET /metrics` on the admin
//! listener), through the `prometheus-client` crate: requests by route and status class,
//! errors by route and kind, how long each request took, TCP connections, and the copies
//! each route has.
//!
//! Counters and the histogram are updated where things happen, through a [`RouteMetrics`]
//! of handles per route so that a request neither allocates labels nor looks up a family;
//! the copies gauge is read from the route table when scraped. Nothing here decides
//! anything.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::table::RouteTable;

/// The route label of what belongs to no route: a request for an unknown host, or one
/// without a host at all.
pub const NO_ROUTE: &str = "";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    pub route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabels {
    pub route: String,
    /// The status class: `2xx`, `4xx`...
    pub code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub route: String,
    pub kind: &'static str,
}

/// What went wrong with a request or a connection, as the `kind` label says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// No route has the request's host (the route label is empty), or no route has the
    /// name a TCP listener forwards to.
    NoRoute,
    /// The route has no copy running and healthy.
    NoCopy,
    /// The copy failed to answer (a 502), or a TCP connection to it failed.
    Upstream,
    /// A copy failed before answering and the request went to another: not an error the
    /// client saw, but the sign of a copy gone without the table knowing yet.
    Retried,
    /// The request could not be routed as sent: no host (the route label is empty).
    BadRequest,
}

impl ErrorKind {
    /// Every kind, in declaration order: a kind's counter is `errors[kind as usize]`.
    const ALL: [ErrorKind; 5] = [
        ErrorKind::NoRoute,
        ErrorKind::NoCopy,
        ErrorKind::Upstream,
        ErrorKind::Retried,
        ErrorKind::BadRequest,
    ];

    pub fn label(self) -> &'static str {
        match self {
            ErrorKind::NoRoute => "no_route",
            ErrorKind::NoCopy => "no_copy",
            ErrorKind::Upstream => "upstream",
            ErrorKind::Retried => "retried",
            ErrorKind::BadRequest => "bad_request",
        }
    }
}

/// The status classes, indexed by the status's first digit less one.
const CODE_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// Requests take from a tenth of a millisecond (the router's own answers, a copy on the
/// same host) to seconds.
const DURATION_BUCKETS_SECONDS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS_SECONDS)
}

/// One route's series, held so that counting a request is a few atomic operations: each
/// handle shares its value with the series registered in the families.
#[derive(Debug)]
pub struct RouteMetrics {
    responses: [Counter; 5],
    errors: [Counter; 5],
    duration_seconds: Histogram,
    tcp_connections: Counter,
}

impl RouteMetrics {
    /// Counts an answer with `status`, which took `seconds` until its head was ready.
    pub fn response(&self, status: u16, seconds: f64) {
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        self.responses[class].inc();
        self.duration_seconds.observe(seconds);
    }

    pub fn error(&self, kind: ErrorKind) {
        // The kinds are declared in the order of `ErrorKind::ALL`, which built `errors`.
        self.errors[kind as usize].inc();
    }

    /// Counts a TCP connection accepted for the route.
    pub fn tcp_connection(&self) {
        self.tcp_connections.inc();
    }
}

/// Every metric of one router, registered once.
pub struct RouterMetrics {
    registry: Registry,
    requests: Family<CodeLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    durations: Family<RouteLabel, Histogram, fn() -> Histogram>,
    tcp_connections: Family<RouteLabel, Counter>,
    copies: Family<RouteLabel, Gauge>,
    /// The handles of each route seen, by name. A `std` lock: held for a map lookup, never
    /// across an await; read on every request, written the first time a route is seen and
    /// when a scrape drops the routes gone from the table.
    by_route: RwLock<HashMap<String, Arc<RouteMetrics>>>,
    /// Makes a scrape's update of the copies gauge and its encoding one step, so that two
    /// scrapes at once do not see each other's half-written gauge. A `std` lock: no await
    /// inside.
    scrape: Mutex<()>,
}

impl Default for RouterMetrics {
    fn default() -> RouterMetrics {
        let mut registry = Registry::default();
        let requests = Family::<CodeLabels, Counter>::default();
        registry.register(
            "cube_router_requests",
            "HTTP requests answered, by route and status class (route \"\": no route has the \
             host)",
            requests.clone(),
        );
        let errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "cube_router_errors",
            "Requests and connections that went wrong, by route and kind: no_route (no route \
             has the host or name), no_copy (the route has no copy running and healthy), \
             upstream (the copy failed to answer), retried (a copy failed before answering and \
             another was asked), bad_request (no host)",
            errors.clone(),
        );
        let durations = Family::<RouteLabel, Histogram, fn() -> Histogram>::new_with_constructor(
            duration_histogram,
        );
        registry.register(
            "cube_router_request_duration_seconds",
            "How long a request took until its answer's head was ready to send, by route",
            durations.clone(),
        );
        let tcp_connections = Family::<RouteLabel, Counter>::default();
        registry.register(
            "cube_router_tcp_connections",
            "TCP connections accepted for a route's forwarded port, by route",
            tcp_connections.clone(),
        );
        let copies = Family::<RouteLabel, Gauge>::default();
        registry.register(
            "cube_router_copies",
            "Copies of each route that take requests, as the router's table has them",
            copies.clone(),
        );
        RouterMetrics {
            registry,
            requests,
            errors,
            durations,
            tcp_connections,
            copies,
            by_route: RwLock::new(HashMap::new()),
            scrape: Mutex::new(()),
        }
    }
}

impl std::fmt::Debug for RouterMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouterMetrics").finish_non_exhaustive()
    }
}

impl RouterMetrics {
    /// The handles of the route named `route` ([`NO_ROUTE`] for what has none).
    pub fn route(&self, route: &str) -> Arc<RouteMetrics> {
        {
            let by_route = self
                .by_route
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if let Some(found) = by_route.get(route) {
                return Arc::clone(found);
            }
        }
        let mut by_route = self
            .by_route
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let handles = by_route
            .entry(route.to_string())
            .or_insert_with(|| Arc::new(self.handles_of(route)));
        Arc::clone(handles)
    }

    fn handles_of(&self, route: &str) -> RouteMetrics {
        let route = route.to_string();
        RouteMetrics {
            responses: CODE_CLASSES.map(|code| {
                self.requests.get_or_create_owned(&CodeLabels {
                    route: route.clone(),
                    code,
                })
            }),
            errors: ErrorKind::ALL.map(|kind| {
                self.errors.get_or_create_owned(&ErrorLabels {
                    route: route.clone(),
                    kind: kind.label(),
                })
            }),
            duration_seconds: self.durations.get_or_create_owned(&RouteLabel {
                route: route.clone(),
            }),
            tcp_connections: self
                .tcp_connections
                .get_or_create_owned(&RouteLabel { route }),
        }
    }

    /// Sets the copies gauge from `table` (a route gone from it loses its gauge, and its
    /// handles are forgotten; its counters stay, as Prometheus expects of counters), then
    /// encodes.
    pub fn encode_with(&self, table: &RouteTable) -> String {
        let _scrape = self
            .scrape
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        self.copies.clear();
        for route in table.routes() {
            let copies = i64::try_from(route.targets.len()).unwrap_or(i64::MAX);
            self.copies
                .get_or_create(&RouteLabel {
                    route: route.name.clone(),
                })
                .set(copies);
        }
        self.by_route
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .retain(|name, _| name == NO_ROUTE || table.by_name(name).is_some());
        self.encode_locked()
    }

    /// The registry in the classic Prometheus text format (`cube_api::metrics`), the copies
    /// gauge as last set by [`RouterMetrics::encode_with`].
    pub fn encode(&self) -> String {
        let _scrape = self
            .scrape
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        self.encode_locked()
    }

    fn encode_locked(&self) -> String {
        let mut text = String::new();
        if let Err(error) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            // Writing to a String does not fail; a label that cannot be encoded would, and
            // a scraper must still see that something is wrong rather than a partial page.
            tracing::warn!(%error, "encoding the router's metrics failed");
            return format!("# the router's metrics could not be encoded: {error}\n");
        }
        cube_api::metrics::classic_text(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_s_counts_land_in_its_series() {
        let metrics = RouterMetrics::default();
        let web = metrics.route("web.shop");
        web.response(200, 0.001);
        web.response(204, 0.002);
        web.response(503, 0.0);
        web.error(ErrorKind::Retried);
        metrics.route(NO_ROUTE).error(ErrorKind::NoRoute);
        let text = metrics.encode();
        for line in [
            "cube_router_requests_total{route=\"web.shop\",code=\"2xx\"} 2",
            "cube_router_requests_total{route=\"web.shop\",code=\"5xx\"} 1",
            "cube_router_errors_total{route=\"web.shop\",kind=\"retried\"} 1",
            "cube_router_errors_total{route=\"\",kind=\"no_route\"} 1",
            "cube_router_request_duration_seconds_count{route=\"web.shop\"} 3",
            "cube_router_request_duration_seconds_bucket{le=\"0.0001\",route=\"web.shop\"} 1",
            "# TYPE cube_router_requests_total counter",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
        assert!(Arc::ptr_eq(&web, &metrics.route("web.shop")));
    }

    #[test]
    fn a_status_outside_the_classes_is_counted_in_the_nearest() {
        let metrics = RouterMetrics::default();
        let route = metrics.route("r");
        route.response(0, 0.0);
        route.response(999, 0.0);
        let text = metrics.encode();
        assert!(text.contains("cube_router_requests_total{route=\"r\",code=\"1xx\"} 1"));
        assert!(text.contains("cube_router_requests_total{route=\"r\",code=\"5xx\"} 1"));
    }

    #[test]
    fn the_copies_gauge_follows_the_table_and_counters_outlive_their_route() {
        use cube_types::route::{Backend, RouteView};
        let view = |name: &str, copies: u128| RouteView {
            name: name.into(),
            host: String::new(),
            project: "default".into(),
            job: String::new(),
            group: String::new(),
            port: "80/tcp".into(),
            backends: (0..copies)
                .map(|id| Backend {
                    address: format!("10.0.0.{id}:80"),
                    id: uuid::Uuid::from_u128(id),
                    name: format!("copy-{id}"),
                    node: "w1".into(),
                })
                .collect(),
        };
        let metrics = RouterMetrics::default();
        metrics.route("old").response(200, 0.0);
        let both = RouteTable::build(&[view("old", 1), view("web", 2)], "example.test", None);
        let text = metrics.encode_with(&both);
        assert!(
            text.contains("cube_router_copies{route=\"web\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("cube_router_copies{route=\"old\"} 1"),
            "{text}"
        );

        let one = RouteTable::build(&[view("web", 3)], "example.test", Some(&both));
        let text = metrics.encode_with(&one);
        assert!(
            text.contains("cube_router_copies{route=\"web\"} 3"),
            "{text}"
        );
        assert!(
            !text.contains("cube_router_copies{route=\"old\"}"),
            "{text}"
        );
        assert!(
            text.contains("cube_router_requests_total{route=\"old\",code=\"2xx\"} 1"),
            "{text}"
        );
    }
}
