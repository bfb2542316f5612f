//! Several managers on one etcd cluster: every one serves the API, one leads.
//!
//! Each manager campaigns for the leader key (`cube_store`'s election: a lease of
//! `--leader-ttl`). The one that wins loads the state from etcd, fences its store's writes
//! on the key it created, and runs the controllers and the followers of the workers; its API
//! is the manager's own router. The others answer `GET /leader` themselves and hand every
//! other request to the leader (its address is the leader key's value) and its answer back,
//! streams included: so a worker, a CLI or a script may talk to any manager.
//!
//! With `--tls`, every manager serves HTTPS with its own certificate from the one cluster CA,
//! and a follower hands a request on over HTTPS, presenting its manager certificate. The
//! leader's check that a node reports only over its own certificate then applies to the
//! certificate the follower saw: the follower names it in [`FORWARDED_PEER`], and the leader
//! takes that name only from a connection that presented a manager's certificate
//! ([`peer_of`]); from anyone else the header is dropped.
//!
//! A leader steps down when its lease is lost (it could not renew it for a TTL, or etcd
//! says it expired) or when one of its writes was refused by the fence (another leads): its
//! loops stop, its API goes back to forwarding, and it campaigns again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use cube_api::server::ApiError;
use cube_api::tls::{PeerIdentity, PeerRole};
use cube_manager::Manager;
use cube_store::EtcdDb;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// Set on a request one manager hands to another: a manager that does not lead either
/// answers 503 rather than handing it on again.
pub(crate) const FORWARDED: HeaderName = HeaderName::from_static("x-cube-forwarded-by");

/// Set by a follower on a request it hands on: the client certificate its own client
/// presented (`node:NAME` or `manager:NAME`); absent when it presented none. Believed only
/// from a connection with a manager's certificate.
const FORWARDED_PEER: HeaderName = HeaderName::from_static("x-cube-forwarded-peer");

/// Set on a 503 by a manager that did nothing with the request (it holds no shard, or is
/// opening the state of those it took): the manager that handed it on may send it again.
pub(crate) const NOT_SERVED: HeaderName = HeaderName::from_static("x-cube-not-served");

/// The largest request body handed on (the API's own limit is 1 MiB).
const FORWARD_BODY_LIMIT: usize = 2 * 1024 * 1024;

/// The API in front of a manager that may or may not lead.
pub struct Front {
    /// This manager's address as the others reach it (the leader key's value).
    pub me: String,
    /// The router of this manager's own `Manager` while it has one: the leader's, or with
    /// `--shard-controllers` the one acting for the shards it holds. A `std` lock held to
    /// clone the router or swap it.
    own: RwLock<Option<Router>>,
    /// Told whenever `own` is set: a request that finds none may wait a moment for it.
    pub(crate) own_set: tokio::sync::Notify,
    /// Whether this manager leads.
    leading: AtomicBool,
    pub(crate) db: EtcdDb,
    /// For handing requests on ([`peer_client`]).
    pub(crate) http: reqwest::Client,
    /// With --acl: `GET /leader` needs a `read` token like any other read (the rest is
    /// checked by the leader's own router).
    acl: Option<Arc<cube_manager::acl::Acl>>,
    /// With --tls: requests are handed on over HTTPS (`https://` and the client settings of
    /// `ManagerTls::peers`); `false` speaks plain HTTP.
    tls: bool,
    /// The shard ring's size (`ring.rs`).
    pub(crate) ring: u32,
    /// With `--shard-controllers`: the tasks table, where the front reads the project of a
    /// task a request names by its ID (`acting.rs`). `None`: the leader acts for every shard
    /// and a follower hands it every request.
    pub(crate) sharded: Option<cube_manager::ManagerStores>,
    /// With `--shard-controllers`: who holds each shard, as last read (`acting::owners`).
    pub(crate) owners: std::sync::Mutex<Option<(std::time::Instant, Arc<crate::ring::Owners>)>>,
    /// With `--shard-controllers`: the shards this manager's `Manager` is taking in place
    /// (`acting::take_in_place`), whose requests wait for their records to be read in.
    pub(crate) taking: tokio::sync::watch::Sender<Vec<u32>>,
    /// With `--shard-controllers`: the shards whose records this manager's `Manager` has
    /// read in (set as it opens and at each shard a take adds): a part of a read of every
    /// project waits for every shard the ring says this manager holds (`acting::here_whole`).
    pub(crate) serving: tokio::sync::watch::Sender<Vec<u32>>,
    /// Of the shards `taking`, those a request waits for: read in first.
    pub(crate) wanted: std::sync::Mutex<std::collections::BTreeSet<u32>>,
    /// With `--shard-controllers`: the project of each task lately named by its ID
    /// (`acting::project_of_task`), so that requests naming a task again are routed without
    /// reading etcd.
    pub(crate) task_projects: std::sync::Mutex<crate::acting::TaskProjects>,
    /// Permits to tell another manager a cluster-wide write (`acting::to_every`): at most
    /// [`IDLE_PER_MANAGER`] at once, so that the connections they take are the ones kept.
    pub(crate) telling: tokio::sync::Semaphore,
}

/// At most this many idle connections a front keeps to each other manager. Without a bound
/// it kept as many as were ever used at once: 2,000 workers registering through three
/// managers left 300–500 idle connections from each manager to each other one (told every
/// node's report at once), ~40 MB a manager on both ends (BENCHMARKS.md, "Controllers
/// sharded by project: connections between managers"). A burst beyond it opens
/// connections of its own, closed once answered.
pub(crate) const IDLE_PER_MANAGER: usize = 16;

/// The client a front hands requests on with: no overall timeout (blocking queries and
/// event streams last), but a connection must open within a second; at most
/// [`IDLE_PER_MANAGER`] idle connections kept to each manager.
fn peer_client(tls: Option<&cube_manager::tls::ManagerTls>) -> reqwest::Result<reqwest::Client> {
    // Installs the crypto reqwest needs to build a client, plain or TLS.
    let _ = cube_api::tls::provider();
    let mut http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(1))
        .pool_idle_timeout(cube_api::client::IDLE_CONNECTION_FOR)
        .pool_max_idle_per_host(IDLE_PER_MANAGER);
    if let Some(tls) = tls {
        http = http.tls_backend_preconfigured((*tls.peers).clone());
    }
    http.build()
}

impl Front {
    pub fn new(
        me: String,
        db: EtcdDb,
        acl: Option<Arc<cube_manager::acl::Acl>>,
        tls: Option<Arc<cube_manager::tls::ManagerTls>>,
        ring: u32,
        sharded: Option<cube_manager::ManagerStores>,
    ) -> anyhow::Result<Arc<Front>> {
        let http = peer_client(tls.as_deref())?;
        Ok(Arc::new(Front {
            me,
            own: RwLock::new(None),
            own_set: tokio::sync::Notify::new(),
            taking: tokio::sync::watch::Sender::new(Vec::new()),
            serving: tokio::sync::watch::Sender::new(Vec::new()),
            wanted: std::sync::Mutex::new(std::collections::BTreeSet::new()),
            leading: AtomicBool::new(false),
            db,
            http,
            acl,
            tls: tls.is_some(),
            ring,
            sharded,
            owners: std::sync::Mutex::new(None),
            task_projects: std::sync::Mutex::new(crate::acting::TaskProjects::default()),
            telling: tokio::sync::Semaphore::new(IDLE_PER_MANAGER),
        }))
    }

    /// This manager's own router, while it has a `Manager`.
    pub(crate) fn own_router(&self) -> Option<Router> {
        self.own.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Serves with `router` from now on (`None`: hands requests on).
    pub(crate) fn set_own(&self, router: Option<Router>) {
        *self.own.write().unwrap_or_else(|p| p.into_inner()) = router;
        self.own_set.notify_waiters();
    }

    pub(crate) fn is_leading(&self) -> bool {
        self.leading.load(Ordering::Acquire)
    }

    fn set_leading(&self, leading: bool) {
        self.leading.store(leading, Ordering::Release);
    }
}

/// `GET /leader` and `GET /shards`, and everything else to the leader.
pub fn router(front: Arc<Front>) -> Router {
    Router::new()
        .route("/leader", get(leader))
        .route("/shards", get(shards))
        .fallback(forward)
        .with_state(front)
}

pub(crate) fn unavailable(message: String) -> Response {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message).into_response()
}

/// Answered by every manager itself, with a `read` token when ACL is on: the refusal, if
/// the request is refused.
fn refused_read(front: &Front, headers: &axum::http::HeaderMap, route: &str) -> Option<Response> {
    let acl = front.acl.as_ref()?;
    acl.check(headers, cube_types::token::Role::Read, route)
        .err()
        .map(|(_, error)| error.into_response())
}

/// `{"Leader": "HOST:PORT" or null, "Self": "HOST:PORT", "IsLeader": bool}`.
async fn leader(State(front): State<Arc<Front>>, headers: axum::http::HeaderMap) -> Response {
    if let Some(refused) = refused_read(&front, &headers, "GET /leader") {
        return refused;
    }
    let leading = front.is_leading();
    let leader = if leading {
        Some(front.me.clone())
    } else {
        match front.db.leader().await {
            Ok(leader) => leader,
            Err(err) => return unavailable(format!("cannot read the leader from etcd: {err}")),
        }
    };
    axum::Json(serde_json::json!({
        "Leader": leader,
        "Self": front.me,
        "IsLeader": leading,
    }))
    .into_response()
}

/// The shard ring as etcd holds it now: every manager's virtual nodes, their ranges and
/// the shards they hold (`cube_types::shard::ShardsView`).
async fn shards(State(front): State<Arc<Front>>, headers: axum::http::HeaderMap) -> Response {
    if let Some(refused) = refused_read(&front, &headers, "GET /shards") {
        return refused;
    }
    match crate::ring::view(&front.db, front.ring).await {
        Ok(view) => axum::Json(view).into_response(),
        Err(err) => unavailable(format!("cannot read the shard ring from etcd: {err}")),
    }
}

/// The client certificate a request is to be judged by: over a connection with a manager's
/// certificate that hands a request on ([`FORWARDED`]), the one the handing manager names in
/// [`FORWARDED_PEER`] (none if it names none); else the connection's own. The header is
/// removed either way, so that no one else can name a certificate.
pub(crate) fn peer_of(request: &mut Request) -> Option<PeerIdentity> {
    let named = request.headers_mut().remove(&FORWARDED_PEER);
    let own = request.extensions().get::<PeerIdentity>().cloned();
    let from_a_manager = own
        .as_ref()
        .is_some_and(|peer| peer.role == PeerRole::Manager);
    if !(from_a_manager && request.headers().contains_key(&FORWARDED)) {
        return own;
    }
    let (role, name) = named.as_ref()?.to_str().ok()?.split_once(':')?;
    let role = match role {
        "node" => PeerRole::Node,
        "manager" => PeerRole::Manager,
        _ => return None,
    };
    Some(PeerIdentity {
        role,
        name: name.to_string(),
    })
}

async fn forward(State(front): State<Arc<Front>>, mut request: Request) -> Response {
    let peer = peer_of(&mut request);
    match &peer {
        Some(peer) => {
            request.extensions_mut().insert(peer.clone());
        }
        None => {
            request.extensions_mut().remove::<PeerIdentity>();
        }
    }
    if front.sharded.is_some() {
        return crate::acting::route(&front, peer, request).await;
    }
    if let Some(router) = front.own_router() {
        return serve_here(router, request).await;
    }
    if request.headers().contains_key(&FORWARDED) {
        return unavailable(format!(
            "{} handed this request on, but {} does not lead either: the leadership is \
             changing; try again",
            request.headers()[&FORWARDED]
                .to_str()
                .unwrap_or("another manager"),
            front.me
        ));
    }
    let leader = match front.db.leader().await {
        Ok(Some(leader)) if leader != front.me => leader,
        Ok(Some(_)) => {
            return unavailable(format!(
                "{} was just elected leader and is loading the state from etcd: try again",
                front.me
            ));
        }
        Ok(None) => {
            return unavailable(format!(
                "no manager leads at the moment (a new leader is elected within --leader-ttl); \
                 {} does not: try again",
                front.me
            ));
        }
        Err(err) => return unavailable(format!("cannot read the leader from etcd: {err}")),
    };
    hand_on(&front, &leader, peer.as_ref(), request).await
}

/// Answers `request` with this manager's own router.
pub(crate) async fn serve_here(router: Router, request: Request) -> Response {
    match router.oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

/// A request's body read whole, to be handed on (or to several managers).
pub(crate) async fn whole_body(body: Body) -> Result<axum::body::Bytes, Response> {
    axum::body::to_bytes(body, FORWARD_BODY_LIMIT)
        .await
        .map_err(|err| {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request body could not be read whole: {err}"),
            )
            .into_response()
        })
}

/// Sends `request` to the leader and streams its answer back.
async fn hand_on(
    front: &Front,
    leader: &str,
    peer: Option<&PeerIdentity>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let body = match whole_body(body).await {
        Ok(body) => body,
        Err(refused) => return refused,
    };
    match send(front, leader, peer, &parts, body).await {
        Ok(answer) => streamed(answer),
        Err(err) => unavailable(format!(
            "the leader {leader} does not answer ({}); a new leader is elected within \
             --leader-ttl: try again",
            err.message
        )),
    }
}

/// Why a request handed on got no answer.
pub(crate) struct NotAnswered {
    pub(crate) message: String,
    /// It never reached the other manager (no connection): nothing was done with it.
    pub(crate) not_sent: bool,
}

/// Sends a request (its head and whole body) to the manager at `to`, marked as handed on
/// by this one, with the certificate its client presented named; the error says why no
/// answer came.
pub(crate) async fn send(
    front: &Front,
    to: &str,
    peer: Option<&PeerIdentity>,
    parts: &axum::http::request::Parts,
    body: axum::body::Bytes,
) -> Result<reqwest::Response, NotAnswered> {
    let path = parts.uri.path_and_query().map_or("/", |path| path.as_str());
    let mut headers = parts.headers.clone();
    for hop in ["host", "connection", "content-length", "transfer-encoding"] {
        headers.remove(hop);
    }
    if let Some(peer) = peer {
        let role = match peer.role {
            PeerRole::Node => "node",
            PeerRole::Manager => "manager",
        };
        // A name a header cannot carry is not passed on: the leader then judges the request
        // as if no certificate was presented, and refuses what needs one.
        if let Ok(value) = axum::http::HeaderValue::from_str(&format!("{role}:{}", peer.name)) {
            headers.insert(&FORWARDED_PEER, value);
        }
    }
    let scheme = if front.tls { "https" } else { "http" };
    front
        .http
        .request(parts.method.clone(), format!("{scheme}://{to}{path}"))
        .headers(headers)
        .header(&FORWARDED, front.me.as_str())
        .body(body)
        .send()
        .await
        .map_err(|err| NotAnswered {
            message: cube_api::innermost_cause(&cube_api::error_chain(&err)).to_string(),
            not_sent: err.is_connect(),
        })
}

/// Another manager's answer, streamed back as it comes.
pub(crate) fn streamed(answer: reqwest::Response) -> Response {
    let mut response = Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        if !matches!(
            name.as_str(),
            "connection" | "transfer-encoding" | "content-length"
        ) {
            response = response.header(name, value);
        }
    }
    response
        .body(Body::from_stream(answer.bytes_stream()))
        .unwrap_or_else(|err| unavailable(format!("the other manager's answer: {err}")))
}

/// Builds a `Manager` for the shards of `scope` (loading their records from etcd): the
/// leader's for every shard, or with `--shard-controllers` one for the shards held.
pub type Build = Arc<
    dyn Fn(
            cube_types::shard::ShardScope,
            Option<cube_manager::shard_claims::ClaimsSettings>,
            CancellationToken,
        ) -> anyhow::Result<Arc<Manager>>
        + Send
        + Sync,
>;

/// Opens a `Manager` with `build` for `scope` off the runtime's threads; the error says why
/// it could not.
pub(crate) async fn open_manager(
    build: &Build,
    scope: cube_types::shard::ShardScope,
    claims: Option<cube_manager::shard_claims::ClaimsSettings>,
    term: &CancellationToken,
) -> anyhow::Result<Arc<Manager>> {
    let (build, term) = (build.clone(), term.clone());
    tokio::task::spawn_blocking(move || build(scope, claims, term))
        .await
        .map_err(|err| anyhow::anyhow!("loading the state ended abnormally: {err}"))?
}

/// Campaigns, leads, steps down and campaigns again, until `shutdown`. With `build`, the
/// leader runs a `Manager` for every shard, its writes fenced on the leader key; without
/// (`--shard-controllers`, where each manager acts for its own shards) leading only makes
/// this manager the one that answers what is the whole cluster's.
pub async fn campaign_and_lead(
    front: Arc<Front>,
    db: EtcdDb,
    build: Option<Build>,
    ttl: Duration,
    shutdown: CancellationToken,
) {
    let mut pause = Duration::from_millis(100);
    while !shutdown.is_cancelled() {
        let leadership = match db.campaign(&front.me, ttl, &shutdown).await {
            Ok(Some(leadership)) => leadership,
            Ok(None) => return,
            Err(err) => {
                tracing::warn!(error = %err, "cannot campaign for the leadership; trying again");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    // A retry's backoff: etcd did not answer.
                    _ = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(ttl);
                continue;
            }
        };
        pause = Duration::from_millis(100);
        let Some(build) = &build else {
            front.set_leading(true);
            tracing::info!(address = %front.me, "leading: the cluster's nodes, tokens and projects are answered here");
            tokio::select! {
                () = leadership.lost() => {}
                () = shutdown.cancelled() => {}
            }
            front.set_leading(false);
            if shutdown.is_cancelled() {
                leadership.resign().await;
                return;
            }
            tracing::warn!("stepped down: its lease was lost; campaigning again");
            continue;
        };
        // Every write from here on is conditioned on the key this campaign created.
        let refused = db.set_fence(Some(leadership.fence().clone()));
        let term = shutdown.child_token();
        let manager = match open_manager(
            build,
            cube_types::shard::ShardScope::all(front.ring),
            None,
            &term,
        )
        .await
        {
            Ok(manager) => manager,
            Err(err) => {
                tracing::error!(error = %format!("{err:#}"), "won the leadership but cannot load the state; giving it up");
                leadership.resign().await;
                continue;
            }
        };
        front.set_own(Some(cube_manager::api::router(manager.clone())));
        front.set_leading(true);
        tracing::info!(address = %front.me, "leading: the controllers run here");
        let loops = tokio::spawn(cube_manager::run_loops(manager, term.clone()));
        let why = tokio::select! {
            () = leadership.lost() => "its lease was lost",
            () = refused.cancelled() => "a write was refused: another manager leads",
            () = shutdown.cancelled() => "the manager is stopping",
        };
        front.set_leading(false);
        front.set_own(None);
        if !shutdown.is_cancelled() {
            tracing::warn!(
                reason = why,
                "stepped down: requests go to the leader again"
            );
        }
        term.cancel();
        if let Err(err) = loops.await {
            tracing::error!(error = %err, "the manager's loops ended abnormally");
        }
        if shutdown.is_cancelled() {
            // A clean stop hands the leadership over at once rather than after the TTL.
            leadership.resign().await;
            return;
        }
        drop(leadership);
        tracing::info!("campaigning again");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_front_keeps_a_few_idle_connections_to_another_manager_after_a_burst() {
        // Forty requests at once to one manager (a burst of nodes' reports told to it): forty
        // connections while they are out, then only `IDLE_PER_MANAGER` kept.
        let (address, open) = cube_test_support::counting_server(Duration::from_millis(300)).await;
        let http = peer_client(None).unwrap();
        let burst = (0..40).map(|n| http.get(format!("http://{address}/nodes/w{n}")).send());
        for answer in futures_util::future::join_all(burst).await {
            assert!(answer.unwrap().status().is_success());
        }
        assert_eq!(
            cube_test_support::open_settles_at(&open, IDLE_PER_MANAGER).await,
            IDLE_PER_MANAGER,
            "the connections beyond the bound closed once answered"
        );
        // Those kept serve what comes next.
        let again = (0..IDLE_PER_MANAGER).map(|_| http.get(format!("http://{address}/")).send());
        futures_util::future::join_all(again).await;
        assert_eq!(
            open.load(std::sync::atomic::Ordering::SeqCst),
            IDLE_PER_MANAGER
        );
    }

    /// A request over a connection that presented `own`, with `headers`.
    fn request(own: Option<PeerIdentity>, headers: &[(&HeaderName, &str)]) -> Request {
        let mut request = Request::builder().uri("/nodes/b");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let mut request = request.body(Body::empty()).unwrap();
        if let Some(own) = own {
            request.extensions_mut().insert(own);
        }
        request
    }

    fn node(name: &str) -> PeerIdentity {
        PeerIdentity {
            role: PeerRole::Node,
            name: name.to_string(),
        }
    }

    fn manager() -> PeerIdentity {
        PeerIdentity {
            role: PeerRole::Manager,
            name: "cube-manager".to_string(),
        }
    }

    #[test]
    fn a_manager_handing_a_request_on_names_the_certificate_it_saw() {
        let mut handed = request(
            Some(manager()),
            &[(&FORWARDED, "127.0.0.1:1"), (&FORWARDED_PEER, "node:b")],
        );
        assert_eq!(peer_of(&mut handed), Some(node("b")));
        assert!(!handed.headers().contains_key(&FORWARDED_PEER));
        // Its client presented none: the request is judged as presenting none, not as the
        // manager's.
        let mut without = request(Some(manager()), &[(&FORWARDED, "127.0.0.1:1")]);
        assert_eq!(peer_of(&mut without), None);
    }

    #[test]
    fn no_one_but_a_manager_handing_a_request_on_can_name_a_certificate() {
        let forged = [(&FORWARDED, "127.0.0.1:1"), (&FORWARDED_PEER, "node:b")];
        // A node's certificate stays its own, whatever it claims.
        let mut from_a_node = request(Some(node("a")), &forged);
        assert_eq!(peer_of(&mut from_a_node), Some(node("a")));
        assert!(!from_a_node.headers().contains_key(&FORWARDED_PEER));
        // No certificate stays none.
        let mut from_no_one = request(None, &forged);
        assert_eq!(peer_of(&mut from_no_one), None);
        // A manager that does not say it hands the request on is itself.
        let mut direct = request(Some(manager()), &[(&FORWARDED_PEER, "node:b")]);
        assert_eq!(peer_of(&mut direct), Some(manager()));
        // A name of no known role is none.
        let mut odd = request(
            Some(manager()),
            &[(&FORWARDED, "127.0.0.1:1"), (&FORWARDED_PEER, "root:b")],
        );
        assert_eq!(peer_of(&mut odd), None);
    }
}
