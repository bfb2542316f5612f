//! `cube router`: follows the manager's routes and sends each request to a healthy copy of
//! its route, or keeps a real HAProxy's backends equal to them (`--haproxy-config`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use arc_swap::ArcSwap;
use clap::Args;
use cube_api::client::ClientError;
use cube_router::RouteTable;
use cube_types::route::RouteView;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{ClusterFlags, ManagerClient};

/// How long one blocking query of the routes waits for a change before it is asked again.
const ROUTES_WAIT: Duration = Duration::from_secs(60);
/// After a failed read of the routes, the pause before the next; it doubles up to the most.
const FIRST_PAUSE: Duration = Duration::from_millis(200);
const MOST_PAUSE: Duration = Duration::from_secs(5);

/// Route users to their services: each request, by its host name, goes to a running and
/// healthy copy of the job group or task whose route has that host.
///
/// A route's host is `<group>.<job>.<domain>` (`.<project>` before the domain outside the
/// default project), a bare task's `<task>.<domain>`, or the host its task declares
/// (`"Route": {"Host": "api.example.test"}`). The router follows the manager's
/// `GET /routes` with blocking queries: a copy that turns healthy gets requests as soon as the
/// manager sees it, one that fails its health check or is being stopped gets none. It keeps
/// routing with the routes it last read while no manager answers.
///
/// HTTP/1.1 and HTTP/2 (cleartext) by `Host`; plain TCP by port (`--tcp`). A request goes to
/// the copy with the fewest requests outstanding; an idempotent request without a body whose
/// copy refused or dropped the connection before answering is sent once more, to another
/// copy. An unknown host is answered 404, a route without a healthy copy 503, both with a JSON
/// body naming what is missing. With --acl on the manager, give it a token of the `router`
/// role (`cube token create --role router --name NAME`): it reads the routes and nothing
/// else.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube router --listen 0.0.0.0:80 --domain example.test\n  \
    curl --resolve web.shop.example.test:80:127.0.0.1 http://web.shop.example.test/\n  \
    cube router --listen 127.0.0.1:8080 --tcp 5432=db.shop --token \"$ROUTER_TOKEN\"\n  \
    cube router --listen 0.0.0.0:80 --haproxy-config /etc/haproxy/haproxy.cfg \\\n    \
    --haproxy-master-socket /run/haproxy-master.sock")]
pub struct RouterArgs {
    #[command(flatten)]
    target: ClusterFlags,
    /// Where requests arrive (HTTP/1.1 and HTTP/2 cleartext). With --haproxy-config, where
    /// HAProxy listens instead.
    #[arg(long, default_value = "0.0.0.0:80", value_name = "HOST:PORT")]
    listen: SocketAddr,
    /// The domain default routes are named under: `<group>.<job>.<DOMAIN>`.
    #[arg(long, default_value = "localhost", value_name = "DOMAIN")]
    domain: String,
    /// A plain TCP port forwarded to a route's copies: `PORT=ROUTE`, the route by its name
    /// (`db.shop`) or host. Repeat for several.
    #[arg(long = "tcp", value_name = "PORT=ROUTE")]
    tcp: Vec<String>,
    /// Where the router answers `GET /metrics` (requests, errors and latency per route),
    /// `GET /health` and `GET /routes` (the routes as it holds them).
    #[arg(long, default_value = "127.0.0.1:9180", value_name = "HOST:PORT")]
    admin: SocketAddr,
    /// Do not proxy: write HAProxy's configuration to FILE from the routes (a frontend on
    /// --listen choosing a backend by host, one backend per route) on every change.
    #[arg(long, value_name = "FILE")]
    haproxy_config: Option<PathBuf>,
    /// The command that makes HAProxy read its configuration again, run by `sh -c` after
    /// every change (`systemctl reload haproxy`). Prefer --haproxy-master-socket with a
    /// HAProxy in master-worker mode: a `kill -USR2` that comes while the master is still
    /// starting from the last reload ends it.
    #[arg(long, value_name = "COMMAND", requires = "haproxy_config")]
    haproxy_reload: Option<String>,
    /// HAProxy's master CLI socket (`haproxy -W -S PATH`): each reload is asked of the
    /// master there, which answers only when it is ready for one.
    #[arg(
        long,
        value_name = "PATH",
        requires = "haproxy_config",
        conflicts_with = "haproxy_reload"
    )]
    haproxy_master_socket: Option<PathBuf>,
    /// A runtime API socket to put in HAProxy's configuration (`stats socket`), for `show
    /// servers state`.
    #[arg(long, value_name = "PATH", requires = "haproxy_config")]
    haproxy_stats_socket: Option<PathBuf>,
}

/// `--tcp PORT=ROUTE`, read.
fn tcp_routes(given: &[String]) -> anyhow::Result<Vec<(u16, String)>> {
    given
        .iter()
        .map(|entry| {
            let (port, route) = entry
                .split_once('=')
                .ok_or_else(|| anyhow!("--tcp {entry:?}: give PORT=ROUTE, e.g. 5432=db.shop"))?;
            let port: u16 = port
                .trim()
                .parse()
                .ok()
                .filter(|port| *port > 0)
                .ok_or_else(|| anyhow!("--tcp {entry:?}: {port:?} is not a port (1-65535)"))?;
            let route = route.trim();
            if route.is_empty() {
                bail!("--tcp {entry:?}: name the route after '=', e.g. 5432=db.shop");
            }
            Ok((port, route.to_string()))
        })
        .collect()
}

pub async fn router(args: RouterArgs) -> anyhow::Result<()> {
    let tcp = tcp_routes(&args.tcp)?;
    let domain = args.domain.trim().trim_matches('.').to_ascii_lowercase();
    if !domain.is_empty() {
        cube_types::route::check_host(&domain).map_err(|why| anyhow!("--domain: {why}"))?;
    }
    // The routes of every project the token reaches.
    let mut target = args.target.clone();
    target.project = Some(cube_types::project::ALL_PROJECTS.to_string());
    let manager = ManagerClient::connect_to(&target)?;
    let shutdown = crate::shutdown::on_signal().context("listening for SIGINT and SIGTERM")?;

    let (tables, table_rx) = watch::channel(Arc::new(RouteTable::default()));
    let follow = tokio::spawn(follow_routes(
        manager,
        domain.clone(),
        tables,
        shutdown.clone(),
    ));

    if let Some(config) = args.haproxy_config {
        let options = cube_router::haproxy::HaproxyOptions {
            listen: args.listen,
            config,
            reload: args.haproxy_reload,
            tcp,
            stats_socket: args.haproxy_stats_socket,
            master_socket: args.haproxy_master_socket,
        };
        println!(
            "cube router keeping HAProxy's configuration {} in step with the routes, for \
             HAProxy listening on http://{}",
            options.config.display(),
            options.listen
        );
        cube_router::haproxy::keep_in_step(table_rx, options, shutdown.clone()).await;
        let _ = follow.await;
        return Ok(());
    }

    let current = Arc::new(ArcSwap::from(table_rx.borrow().clone()));
    let router = cube_router::proxy::Router::new(current.clone());
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("--listen {}: cannot listen", args.listen))?;
    let admin = tokio::net::TcpListener::bind(args.admin)
        .await
        .with_context(|| format!("--admin {}: cannot listen", args.admin))?;
    let mut servers = tokio::task::JoinSet::new();
    for (port, route) in tcp {
        let address = SocketAddr::new(args.listen.ip(), port);
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .with_context(|| format!("--tcp {port}={route}: cannot listen on {address}"))?;
        tracing::info!(%address, %route, "forwarding TCP");
        servers.spawn(cube_router::tcp::serve_tcp(
            router.clone(),
            listener,
            route,
            shutdown.clone(),
        ));
    }
    // One line on stdout, as `cube manager` prints, for whoever started it on port 0.
    println!(
        "cube router listening on http://{} (admin http://{}), routes under {}",
        listener.local_addr().unwrap_or(args.listen),
        admin.local_addr().unwrap_or(args.admin),
        if domain.is_empty() {
            "no domain"
        } else {
            &domain
        },
    );
    servers.spawn(router.clone().serve_admin(admin, shutdown.clone()));
    servers.spawn(router.clone().serve_http(listener, shutdown.clone()));
    // Each new table is the one every request from then on reads.
    let mut table_rx = table_rx;
    let swapping = shutdown.clone();
    servers.spawn(async move {
        loop {
            tokio::select! {
                _ = swapping.cancelled() => return Ok(()),
                changed = table_rx.changed() => {
                    if changed.is_err() {
                        return Ok(());
                    }
                    current.store(table_rx.borrow_and_update().clone());
                }
            }
        }
    });
    let mut failure = None;
    while let Some(ended) = servers.join_next().await {
        match ended {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                failure.get_or_insert_with(|| anyhow!("the router stopped serving: {err}"));
                shutdown.cancel();
            }
            Err(err) => {
                failure.get_or_insert_with(|| anyhow!("a router loop ended: {err}"));
                shutdown.cancel();
            }
        }
    }
    let _ = follow.await;
    match failure {
        Some(err) => Err(err),
        None => Ok(()),
    }
}

/// Reads the routes with blocking queries and sends each new table on `tables`, until
/// `shutdown`. While the manager cannot be read, the last table stays (the copies keep
/// running without a manager), and reads are tried again after a pause that doubles.
async fn follow_routes(
    manager: ManagerClient,
    domain: String,
    tables: watch::Sender<Arc<RouteTable>>,
    shutdown: CancellationToken,
) {
    let mut index = 0u64;
    let mut pause = FIRST_PAUSE;
    let mut last: Option<Vec<RouteView>> = None;
    loop {
        let read = tokio::select! {
            _ = shutdown.cancelled() => return,
            read = manager.get_blocking::<Vec<RouteView>>("/routes", index, ROUTES_WAIT) => read,
        };
        match read {
            Ok((routes, answered)) => {
                pause = FIRST_PAUSE;
                // An index lower than the one asked with is another manager's (a failover)
                // or a restart's: taken as it is, the next query answers at once.
                index = answered.unwrap_or(0);
                if last.as_ref() == Some(&routes) {
                    continue;
                }
                let previous = tables.borrow().clone();
                let table = RouteTable::build(&routes, &domain, Some(&previous));
                for conflict in &table.conflicts {
                    tracing::warn!("{conflict}; requests for it go to the earlier route");
                }
                tracing::info!(
                    routes = table.len(),
                    copies = table
                        .routes()
                        .map(|route| route.targets.len())
                        .sum::<usize>(),
                    "routes changed"
                );
                tables.send_replace(Arc::new(table));
                last = Some(routes);
            }
            Err(err) => {
                let refused = matches!(
                    err,
                    ClientError::Status { status, .. }
                        if status == reqwest::StatusCode::FORBIDDEN
                            || status == reqwest::StatusCode::UNAUTHORIZED
                );
                tracing::warn!(
                    error = %manager.explain(err),
                    "cannot read the routes; routing on with the last ones read"
                );
                if refused {
                    tracing::warn!(
                        "the manager refused the token: give the router one of the `router` \
                         role (cube token create --role router --name NAME) with --token"
                    );
                }
                index = 0;
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(MOST_PAUSE);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_routes_are_port_equals_route() {
        assert_eq!(
            tcp_routes(&["5432=db.shop".to_string()]).unwrap(),
            vec![(5432, "db.shop".to_string())]
        );
        for bad in ["5432", "x=db", "0=db", "70000=db", "5432="] {
            let err = tcp_routes(&[bad.to_string()]).unwrap_err().to_string();
            assert!(err.contains("--tcp"), "{bad}: {err}");
        }
    }
}
