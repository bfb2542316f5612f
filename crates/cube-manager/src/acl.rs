//! Who may do what: tokens and roles (`cube manager --acl`), and the audit log.
//!
//! **The rule of every route is in one table, [`ROUTES`]**: its method, its pattern and what
//! it needs (nothing, a role, or the bootstrap's one open call). [`guard`], a layer on every
//! route of the manager's router, reads it; a route missing from the table needs
//! `management` (closed by default), and `crates/cube/tests/acl.rs` walks the table against a
//! real manager.
//!
//! **Tokens** (`cube_types::token`) are `cube.<ID>.<SECRET>`; the manager keeps, under the ID in
//! the `acl_tokens` table of its own store (so they survive a crash and are shared on etcd),
//! the SHA-256 of the secret, never the secret. A secret is 256 bits from the operating
//! system's generator, so a fast hash is enough (nothing to brute-force); the comparison is in
//! constant time (`subtle`). Every request reads the token's record from the store: there is
//! no cache, so a revoke or an expiry is refused from the next request on, on every manager
//! that reads the same store.
//!
//! **Nodes** join with a `node` token: its first registration (`PUT /nodes/{name}`) claims the
//! name for it (`acl_keys` `node/<name>` → the token's ID, written only if absent, so two
//! tokens racing for one name cannot both win), and from then on it may report as that node
//! only, and do nothing else. The answer to each of its heartbeats carries **that node's
//! worker-command token** (`X-Cube-Worker-Token`): the manager sends it on every call to that
//! worker, and a worker that joined with a token accepts no other. It is per node, so that a
//! node (or whoever holds its join token) can command no worker but its own: the token of node
//! N is `cubeworker.` and the HMAC-SHA256 of N's name under the cluster's *worker-command
//! key*, 256 random bits made once per cluster and kept in `acl_keys` (never sent anywhere).
//! Every manager sharing the store derives the same token for N, before and after a restart,
//! with nothing stored per node; a node learns only its own, and cannot derive another's.
//!
//! **Audit**: every request that is not a `GET` or `HEAD` (nor a heartbeat that was taken:
//! `PUT /nodes/{name}` answered 2xx, a node every 2 s) is recorded once answered, with the
//! token's name (`anonymous` with ACL off, `unauthenticated` when refused for want of one),
//! its role, the method, the route, the path and the status: as an event of the `tracing`
//! target `cube::audit` and, when the manager has a data directory, as a line of JSON
//! appended to `<data-dir>/audit.jsonl`.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{MatchedPath, Path, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use cube_api::ApiError;
use cube_api::server::{bearer_token, same_secret};
use cube_api::tls::{PeerIdentity, PeerRole};
use cube_store::{Expected, Store, StoreError};
use cube_types::token::{
    Role, TOKEN_PREFIX, TokenCreated, TokenRecord, TokenRequest, TokenView, split_token,
};
use sha2::{Digest, Sha256};

/// What the ACL's routes and its [`guard`] read: the ACL itself (`None` with `--acl` off), the
/// audit log, and the cluster CA when TLS is on. The manager hands it in (the API's router
/// makes it from the manager's configuration), so that this module needs nothing else of the
/// manager.
#[derive(Clone, Default)]
pub struct AclState {
    pub acl: Option<Arc<Acl>>,
    pub audit: Option<Arc<AuditLog>>,
    /// With TLS on: the CA whose fingerprint a join token carries.
    pub ca: Option<Arc<dyn JoinCa>>,
}

impl std::fmt::Debug for AclState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AclState")
            .field("acl", &self.acl.is_some())
            .field("audit", &self.audit.is_some())
            .field("ca", &self.ca.is_some())
            .finish()
    }
}

/// What a join token needs of the manager's TLS: the fingerprint of the cluster's CA, for the
/// worker to know its manager on first contact. `tls::ManagerTls` is the one kind; a trait
/// here keeps `tls.rs` importing this module and not the other way round.
pub trait JoinCa: Send + Sync {
    fn fingerprint(&self) -> String;
}

/// What a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Nothing: `GET /health`.
    Open,
    /// A token whose role allows this one.
    Role(Role),
    /// `POST /acl/bootstrap`: open until the first management token exists, refused after.
    Bootstrap,
}

/// Every route of the manager and what it needs, the one table [`guard`] reads. A read is
/// `read`, but logs and exec (what a task writes may hold secrets) are `submit`, and the
/// store's backup (every record, token hashes included) is `management`.
pub const ROUTES: &[(&str, &str, Need)] = &[
    ("GET", "/health", Need::Open),
    // The web UI's page, script and style: built into the binary, holding no data (every
    // answer the page then asks for is checked as any other request).
    ("GET", "/ui", Need::Open),
    ("GET", "/ui/{asset}", Need::Open),
    ("GET", "/acl/self", Need::Role(Role::Read)),
    ("POST", "/acl/bootstrap", Need::Bootstrap),
    ("GET", "/acl/tokens", Need::Role(Role::Management)),
    ("POST", "/acl/tokens", Need::Role(Role::Management)),
    ("DELETE", "/acl/tokens/{id}", Need::Role(Role::Management)),
    ("GET", "/tasks", Need::Role(Role::Read)),
    ("POST", "/tasks", Need::Role(Role::Submit)),
    ("POST", "/tasks/prune", Need::Role(Role::Submit)),
    ("GET", "/tasks/{id}", Need::Role(Role::Read)),
    ("DELETE", "/tasks/{id}", Need::Role(Role::Submit)),
    ("POST", "/tasks/{id}/restart", Need::Role(Role::Submit)),
    ("GET", "/tasks/{id}/placement", Need::Role(Role::Read)),
    ("GET", "/tasks/{id}/logs", Need::Role(Role::Submit)),
    ("POST", "/tasks/{id}/exec", Need::Role(Role::Submit)),
    ("GET", "/tasks/{id}/exec/attach", Need::Role(Role::Submit)),
    ("GET", "/nodes", Need::Role(Role::Read)),
    ("GET", "/nodes/{name}", Need::Role(Role::Read)),
    ("PUT", "/nodes/{name}", Need::Role(Role::Node)),
    ("DELETE", "/nodes/{name}", Need::Role(Role::Operator)),
    ("POST", "/nodes/{name}/certificate", Need::Role(Role::Node)),
    ("GET", "/tls/ca", Need::Open),
    ("POST", "/nodes/{name}/drain", Need::Role(Role::Operator)),
    (
        "POST",
        "/nodes/{name}/eligibility",
        Need::Role(Role::Operator),
    ),
    ("GET", "/version", Need::Role(Role::Read)),
    ("GET", "/shards", Need::Role(Role::Read)),
    ("GET", "/metrics", Need::Role(Role::Read)),
    ("GET", "/jobs", Need::Role(Role::Read)),
    ("POST", "/jobs", Need::Role(Role::Submit)),
    ("POST", "/jobs/plan", Need::Role(Role::Submit)),
    ("GET", "/jobs/{name}", Need::Role(Role::Read)),
    ("DELETE", "/jobs/{name}", Need::Role(Role::Submit)),
    ("POST", "/jobs/{name}/scale", Need::Role(Role::Submit)),
    ("GET", "/jobs/{name}/versions", Need::Role(Role::Read)),
    ("POST", "/jobs/{name}/revert", Need::Role(Role::Submit)),
    ("POST", "/jobs/{name}/promote", Need::Role(Role::Submit)),
    ("GET", "/jobs/{name}/deployment", Need::Role(Role::Read)),
    ("GET", "/events", Need::Role(Role::Read)),
    ("GET", "/queue", Need::Role(Role::Read)),
    ("GET", "/queue/{kind}/{id}", Need::Role(Role::Read)),
    ("GET", "/services", Need::Role(Role::Read)),
    // What `cube router` follows: a `router` token may read this and nothing else.
    ("GET", "/routes", Need::Role(Role::Router)),
    ("GET", "/store/backup", Need::Role(Role::Management)),
    ("GET", "/projects", Need::Role(Role::Read)),
    ("POST", "/projects", Need::Role(Role::Management)),
    ("GET", "/projects/{name}", Need::Role(Role::Read)),
    ("DELETE", "/projects/{name}", Need::Role(Role::Management)),
    (
        "PUT",
        "/projects/{name}/quota",
        Need::Role(Role::Management),
    ),
    // Names, versions and times; never a value.
    ("GET", "/secrets", Need::Role(Role::Read)),
    ("POST", "/secrets", Need::Role(Role::Submit)),
    ("DELETE", "/secrets/{name}", Need::Role(Role::Submit)),
    // The values of a run's secrets: to the node the task is placed on, and to nobody else.
    ("GET", "/nodes/{name}/secrets", Need::Role(Role::Node)),
    ("POST", "/registries", Need::Role(Role::Submit)),
    ("GET", "/volumes", Need::Role(Role::Read)),
    ("DELETE", "/volumes/{name}", Need::Role(Role::Submit)),
];

/// What `route` (a pattern as the router matched it) needs for `method`; a `HEAD` needs what
/// the `GET` needs. Anything not in [`ROUTES`] needs `management`.
pub fn need(method: &Method, route: &str) -> Need {
    let method = if method == Method::HEAD {
        "GET"
    } else {
        method.as_str()
    };
    ROUTES
        .iter()
        .find(|(m, r, _)| *m == method && *r == route)
        .map_or(Need::Role(Role::Management), |(_, _, need)| *need)
}

/// Keys of the `acl_keys` table. (`worker-command`, the one token every worker took before
/// it was made per node, is no longer read: every node was told it, so it must not be the
/// key the per-node tokens are derived from.)
const WORKER_COMMAND_KEY: &str = "worker-command-key";
const BOOTSTRAP_KEY: &str = "bootstrap";
fn node_claim_key(node: &str) -> String {
    format!("node/{node}")
}

/// The tables the ACL keeps in the manager's store.
#[derive(Clone)]
pub struct AclStores {
    /// Every token's record, under its ID.
    pub tokens: Arc<dyn Store<TokenRecord>>,
    /// `worker-command-key` → the key of the nodes' worker-command tokens (hex);
    /// `bootstrap` → the bootstrap token's ID;
    /// `node/<name>` → the ID of the node token that joined as `<name>`.
    pub keys: Arc<dyn Store<String>>,
}

/// Authentication on: the token tables and the key of the nodes' worker-command tokens.
pub struct Acl {
    stores: AclStores,
    worker_key: ring::hmac::Key,
}

impl std::fmt::Debug for Acl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Acl { .. }")
    }
}

/// Why the ACL could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum AclError {
    #[error("the ACL's store: {0}")]
    Store(#[from] StoreError),
    #[error("cannot read random bytes from the operating system: {0}")]
    Random(String),
    #[error("the worker-command key vanished from the store while it was being made")]
    WorkerTokenVanished,
    #[error("the worker-command key in the store is not 64 hex digits")]
    WorkerKeyMalformed,
}

/// `bytes` random bytes from the operating system's generator, in hex.
fn random_hex(bytes: usize) -> Result<String, AclError> {
    let mut buffer = vec![0u8; bytes];
    getrandom::fill(&mut buffer).map_err(|err| AclError::Random(err.to_string()))?;
    Ok(hex(&buffer))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The bytes of a text of hex digits, if it is one.
pub(crate) fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(text.get(at..at + 2)?, 16).ok())
        .collect()
}

fn hash_secret(secret: &str) -> String {
    hex(&Sha256::digest(secret.as_bytes()))
}

impl Acl {
    /// Opens the ACL on `stores`, making the cluster's worker-command key the first time
    /// (once, even with several managers starting together on etcd).
    pub fn open(stores: AclStores) -> Result<Acl, AclError> {
        let worker_key = match stores.keys.get(WORKER_COMMAND_KEY)? {
            Some(key) => key,
            None => {
                let made = random_hex(32)?;
                match stores
                    .keys
                    .put_if(WORKER_COMMAND_KEY, &made, Expected::Absent)?
                {
                    Ok(_) => made,
                    // Another manager made it first: take theirs.
                    Err(_) => stores
                        .keys
                        .get(WORKER_COMMAND_KEY)?
                        .ok_or(AclError::WorkerTokenVanished)?,
                }
            }
        };
        let worker_key = unhex(&worker_key)
            .filter(|bytes| bytes.len() == 32)
            .ok_or(AclError::WorkerKeyMalformed)?;
        Ok(Acl {
            stores,
            worker_key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &worker_key),
        })
    }

    /// The token the manager sends on its calls to the worker of node `node`, and tells that
    /// node only (in the answers to its heartbeats): the HMAC of the node's name under the
    /// cluster's worker-command key.
    pub fn worker_token(&self, node: &str) -> String {
        let tag = ring::hmac::sign(
            &self.worker_key,
            format!("worker-command/{node}").as_bytes(),
        );
        format!("cubeworker.{}", hex(tag.as_ref()))
    }

    /// The record of the token `text`, if it is a valid one now; or why not, in words.
    pub fn authenticate(&self, text: &str, now: DateTime<Utc>) -> Result<TokenRecord, String> {
        let Some((id, secret)) = split_token(text) else {
            return Err(format!(
                "the token is not a Cube token ({TOKEN_PREFIX}<ID>.<SECRET>)"
            ));
        };
        let record = match self.stores.tokens.get(id) {
            Ok(Some(record)) => record,
            Ok(None) => return Err(format!("token {id} is unknown or revoked")),
            Err(err) => return Err(format!("cannot read token {id}: {err}")),
        };
        if !same_secret(&hash_secret(secret), &record.secret_hash) {
            return Err(format!("token {id}: wrong secret"));
        }
        if let Some(expiry) = record.expire_time.filter(|_| record.expired(now)) {
            return Err(format!(
                "token {id} ({}) expired at {}",
                record.name,
                expiry.to_rfc3339()
            ));
        }
        Ok(record)
    }

    /// The record of the token in `headers` when its role allows `needed`; otherwise the
    /// answer to give (401 without a valid token, 403 with a weaker role, with its name and role),
    /// naming `what` ("GET /tasks") and the roles that would do.
    pub fn check(
        &self,
        headers: &axum::http::HeaderMap,
        needed: Role,
        what: &str,
    ) -> Result<TokenRecord, (Option<(String, Role)>, ApiError)> {
        let what = format!("{what} needs a token of role {}", needs_words(needed));
        let Some(token) = bearer_token(headers) else {
            return Err((
                None,
                ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    format!(
                        "{what}: none was given (Authorization: Bearer <token>; the CLI takes \
                         --token, CUBE_TOKEN or the config file)"
                    ),
                ),
            ));
        };
        let record = self.authenticate(token, Utc::now()).map_err(|why| {
            (
                None,
                ApiError::new(StatusCode::UNAUTHORIZED, format!("{what}: {why}")),
            )
        })?;
        if !record.role.allows(needed) {
            let message = format!("{what}; token {:?} has role {}", record.name, record.role);
            return Err((
                Some((record.name, record.role)),
                ApiError::new(StatusCode::FORBIDDEN, message),
            ));
        }
        Ok(record)
    }

    /// Makes a token and stores it; the answer holds its text, shown once.
    pub async fn create(
        &self,
        role: Role,
        name: Option<String>,
        ttl: Option<std::time::Duration>,
        projects: Vec<String>,
        now: DateTime<Utc>,
    ) -> Result<TokenCreated, AclError> {
        let id = random_hex(8)?;
        let secret = random_hex(32)?;
        let record = TokenRecord {
            name: name.unwrap_or_else(|| format!("{role}-{id}")),
            id: id.clone(),
            role,
            secret_hash: hash_secret(&secret),
            create_time: now,
            // A TTL past what chrono holds is capped at the longest allowed, never dropped
            // (which would make the token last for ever).
            expire_time: ttl.map(|ttl| {
                let ttl = ttl.min(cube_types::token::MAX_TOKEN_TTL);
                now + chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::days(365))
            }),
            node: None,
            projects,
        };
        self.stores
            .tokens
            .put_queued(&id, &record)?
            .durable()
            .await?;
        Ok(TokenCreated {
            token: record.view(),
            secret: format!("{TOKEN_PREFIX}{id}.{secret}"),
        })
    }

    /// The first management token, if there has been none; `None` once bootstrapped.
    pub async fn bootstrap(&self, now: DateTime<Utc>) -> Result<Option<TokenCreated>, AclError> {
        if self.stores.keys.get(BOOTSTRAP_KEY)?.is_some() {
            return Ok(None);
        }
        let created = self
            .create(
                Role::Management,
                Some("bootstrap".to_string()),
                None,
                Vec::new(),
                now,
            )
            .await?;
        let claimed = self
            .stores
            .keys
            .put_if_queued(BOOTSTRAP_KEY, &created.token.id, Expected::Absent)?
            .durable()
            .await?;
        if claimed.is_err() {
            // Two bootstraps at once: the other won, this token goes.
            self.stores.tokens.delete(&created.token.id)?;
            return Ok(None);
        }
        Ok(Some(created))
    }

    pub fn list(&self) -> Result<Vec<TokenView>, AclError> {
        Ok(self
            .stores
            .tokens
            .list()?
            .iter()
            .map(TokenRecord::view)
            .collect())
    }

    /// Revokes the token `id` (its node name is free again); whether there was one.
    pub fn revoke(&self, id: &str) -> Result<bool, AclError> {
        let Some(record) = self.stores.tokens.get(id)? else {
            return Ok(false);
        };
        self.stores.tokens.delete(id)?;
        if let Some(node) = &record.node {
            let key = node_claim_key(node);
            if self.stores.keys.get(&key)?.as_deref() == Some(id) {
                self.stores.keys.delete(&key)?;
            }
        }
        Ok(true)
    }

    /// Whether a node token may act as `node`, before its request is read: yes when it joined
    /// as `node`, or when it has not joined yet and no other token has that name (the claim is
    /// then made by [`NodeClaim::make`] once the request proved valid). An error answer
    /// otherwise. Nothing is written.
    fn may_act_as(&self, token: &TokenRecord, node: &str) -> Result<(), ApiError> {
        match &token.node {
            Some(joined) if joined == node => Ok(()),
            Some(joined) => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "token {:?} joined as node {joined:?}; it cannot report as {node:?}",
                    token.name
                ),
            )),
            None => match self
                .stores
                .keys
                .get(&node_claim_key(node))
                .map_err(store_error)?
            {
                Some(holder) if holder != token.id => Err(name_taken(node)),
                _ => Ok(()),
            },
        }
    }

    /// A node token that has not joined yet takes the name `node` (written only if absent, so
    /// that two tokens racing for one name cannot both win). An error answer when another
    /// token has it.
    async fn claim_node(&self, token: &TokenRecord, node: &str) -> Result<(), ApiError> {
        if token.node.is_some() {
            return self.may_act_as(token, node);
        }
        let key = node_claim_key(node);
        let claimed = self
            .stores
            .keys
            .put_if_queued(&key, &token.id, Expected::Absent)
            .map_err(store_error)?
            .durable()
            .await
            .map_err(store_error)?;
        if claimed.is_err()
            && self.stores.keys.get(&key).map_err(store_error)?.as_deref()
                != Some(token.id.as_str())
        {
            return Err(name_taken(node));
        }
        let mut joined = token.clone();
        joined.node = Some(node.to_string());
        self.stores
            .tokens
            .put_queued(&token.id, &joined)
            .map_err(store_error)?
            .durable()
            .await
            .map_err(store_error)?;
        Ok(())
    }
}

fn name_taken(node: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        format!(
            "node name {node:?} is taken: another node joined with it (a node name belongs to \
             the join token that registered it first; revoke that token to free it)"
        ),
    )
}

/// Who a request's token is, put in the request by [`guard`] (with ACL on) for the handlers
/// that record who asked (the waiting list's `Owner`).
#[derive(Debug, Clone)]
pub struct Submitter {
    pub name: String,
    pub role: Role,
    /// The projects its role holds in (`TokenRecord::projects`).
    pub projects: Vec<String>,
}

impl Submitter {
    /// `owner` as the request gave it, settled for this token: left empty, the token's name
    /// (`cube_types::token::owner_of_token`); another owner than that may be given only by an
    /// `operator` or `management` token (on someone's behalf), so that a `submit` token cannot
    /// pass as another owner (and around `--max-claimed-per-owner`).
    pub fn settle_owner(&self, owner: &mut String) -> Result<(), ApiError> {
        let own = cube_types::token::owner_of_token(&self.name);
        if owner.is_empty() {
            *owner = own;
        } else if *owner != own && !self.role.allows(Role::Operator) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "Owner: token {:?} (role {}) submits as owner {own:?} only, not {owner:?} \
                     (leave Owner out; an operator or management token may name another)",
                    self.name, self.role
                ),
            ));
        }
        Ok(())
    }
}

/// [`Submitter::settle_owner`] when ACL is on (the request has a [`Submitter`]).
pub fn settle_owner(
    submitter: Option<&axum::Extension<Submitter>>,
    owner: &mut String,
) -> Result<(), ApiError> {
    match submitter {
        Some(axum::Extension(submitter)) => submitter.settle_owner(owner),
        None => Ok(()),
    }
}

/// The claim of a node name by a node token that has not joined yet, put in the request by
/// [`guard`] for the route's handler to make once it has found the request valid (a report,
/// a signing request): a malformed request binds no name to the token.
#[derive(Clone)]
pub struct NodeClaim {
    acl: Arc<Acl>,
    token: TokenRecord,
    node: String,
    made: Arc<AtomicBool>,
}

impl std::fmt::Debug for NodeClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NodeClaim({:?} by token {})", self.node, self.token.id)
    }
}

impl NodeClaim {
    /// Binds the node name to the token; a 409 when another token took it meanwhile.
    pub async fn make(&self) -> Result<(), ApiError> {
        self.acl.claim_node(&self.token, &self.node).await?;
        self.made.store(true, Ordering::SeqCst);
        Ok(())
    }
}

/// Makes the claim a node route's request carries, if any (its token had not joined yet).
pub async fn make_claim(claim: Option<&axum::Extension<NodeClaim>>) -> Result<(), ApiError> {
    match claim {
        Some(axum::Extension(claim)) => claim.make().await,
        None => Ok(()),
    }
}

fn store_error(err: StoreError) -> ApiError {
    let status = match err {
        StoreError::Failed { .. } | StoreError::Unavailable { .. } | StoreError::Fenced { .. } => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    ApiError::new(status, format!("the ACL's store: {err}"))
}

impl From<AclError> for ApiError {
    fn from(err: AclError) -> ApiError {
        match err {
            AclError::Store(err) => store_error(err),
            AclError::Random(_) | AclError::WorkerTokenVanished | AclError::WorkerKeyMalformed => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, err.to_string())
            }
        }
    }
}

/// The append-only audit file, `<data-dir>/audit.jsonl`.
pub struct AuditLog {
    path: PathBuf,
    /// A `std` mutex: held for one `write` of one line, never across an await.
    file: Mutex<std::fs::File>,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AuditLog({})", self.path.display())
    }
}

/// The name of the audit file in the data directory.
pub const AUDIT_FILE: &str = "audit.jsonl";

impl AuditLog {
    pub fn open(data_dir: &std::path::Path) -> std::io::Result<AuditLog> {
        let path = data_dir.join(AUDIT_FILE);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?;
        Ok(AuditLog {
            path,
            file: Mutex::new(file),
        })
    }

    fn append(&self, line: &serde_json::Value) {
        let mut text = line.to_string();
        text.push('\n');
        let mut file = self
            .file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(err) = file.write_all(text.as_bytes()) {
            tracing::error!(path = %self.path.display(), error = %err, "cannot append to the audit log");
        }
    }
}

/// Who made a request, once the guard let it through.
#[derive(Debug, Clone)]
struct Caller {
    name: String,
    role: Option<Role>,
}

/// The layer on every route: checks the caller's token against the route's [`Need`] (with
/// ACL on), lets the request through or answers 401/403, and records the outcome of every
/// request that may change something in the audit log.
pub async fn guard(
    State(state): State<AclState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let method = request.method().clone();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |path| path.as_str().to_string());
    let path = request.uri().path().to_string();
    let (caller, response) = match &state.acl {
        None => (
            Caller {
                name: "anonymous".to_string(),
                role: None,
            },
            next.run(request).await,
        ),
        Some(acl) => {
            let tls = state.ca.is_some();
            checked(acl.clone(), tls, &method, &route, request, next).await
        }
    };
    // A heartbeat that was taken is no news (one a node every 2 s would drown the rest); a
    // refused one, and every other change, is recorded.
    let heartbeat =
        method == Method::PUT && route == "/nodes/{name}" && response.status().is_success();
    if method != Method::GET && method != Method::HEAD && !heartbeat {
        let status = response.status().as_u16();
        tracing::info!(target: "cube::audit", token = %caller.name, role = caller.role.map(Role::as_str), %method, %route, %path, status, "audit");
        if let Some(audit) = &state.audit {
            audit.append(&serde_json::json!({
                "Time": Utc::now().to_rfc3339(),
                "Token": caller.name,
                "Role": caller.role,
                "Method": method.as_str(),
                "Route": route,
                "Path": path,
                "Status": status,
            }));
        }
    }
    response
}

async fn checked(
    acl: Arc<Acl>,
    tls: bool,
    method: &Method,
    route: &str,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> (Caller, Response) {
    let refused = |name: &str, role: Option<Role>, error: ApiError| {
        let caller = Caller {
            name: name.to_string(),
            role,
        };
        let mut response = error.into_response();
        if response.status() == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        (caller, response)
    };
    let needed = match need(method, route) {
        Need::Open | Need::Bootstrap => {
            let caller = Caller {
                name: "unauthenticated".to_string(),
                role: None,
            };
            return (caller, next.run(request).await);
        }
        Need::Role(role) => role,
    };
    let record = match acl.check(request.headers(), needed, &format!("{method} {route}")) {
        Ok(record) => record,
        Err((caller, error)) => {
            let name = caller
                .as_ref()
                .map_or("unauthenticated", |(name, _)| name.as_str());
            return refused(name, caller.as_ref().map(|(_, role)| *role), error);
        }
    };
    let caller = Caller {
        name: record.name.clone(),
        role: Some(record.role),
    };
    let mut request = request;
    request.extensions_mut().insert(Submitter {
        name: record.name.clone(),
        role: record.role,
        projects: record.projects.clone(),
    });
    if record.role == Role::Node {
        // The routes a node token may use: `PUT /nodes/{name}` and `POST
        // /nodes/{name}/certificate`, as its own node.
        let (mut parts, body) = request.into_parts();
        let node = match <Path<String> as axum::extract::FromRequestParts<()>>::from_request_parts(
            &mut parts,
            &(),
        )
        .await
        {
            Ok(Path(node)) => node,
            Err(rejection) => {
                return refused(&record.name, Some(record.role), ApiError::from(rejection));
            }
        };
        if tls && (route == "/nodes/{name}" || route == "/nodes/{name}/secrets") {
            // With TLS, a report for node N is taken only over N's certificate.
            let peer = parts.extensions.get::<PeerIdentity>();
            if let Err(error) = check_node_peer(peer, &node, &format!("{method} {route}")) {
                return refused(&record.name, Some(record.role), error);
            }
        }
        if let Err(error) = acl.may_act_as(&record, &node) {
            return refused(&record.name, Some(record.role), error);
        }
        // A token that has not joined yet claims the name only once the handler found its
        // request valid (`NodeClaim::make`), so that a malformed one binds nothing.
        let made = Arc::new(AtomicBool::new(record.node.is_some()));
        if record.node.is_none() {
            parts.extensions.insert(NodeClaim {
                acl: acl.clone(),
                token: record.clone(),
                node: node.clone(),
                made: made.clone(),
            });
        }
        let mut response = next
            .run(axum::extract::Request::from_parts(parts, body))
            .await;
        if response.status().is_success() && !made.load(Ordering::SeqCst) {
            // A node route whose handler does not make the claim: refuse rather than let a
            // token act as a node it never claimed.
            tracing::error!(%route, node, "a node route answered without claiming the node's name");
            return refused(
                &record.name,
                Some(record.role),
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("{method} {route} did not claim node {node:?} for its token"),
                ),
            );
        }
        // The node's own worker-command token, and no other node's.
        if response.status().is_success()
            && let Ok(value) = HeaderValue::from_str(&acl.worker_token(&node))
        {
            response
                .headers_mut()
                .insert(cube_api::server::WORKER_TOKEN_HEADER, value);
        }
        return (caller, response);
    }
    let response = next.run(request).await;
    if STREAMED.contains(&route) && response.status().is_success() {
        return (caller, acl.until_token_gone(response, &record));
    }
    (caller, response)
}

/// The routes whose answers last (a stream of events, followed logs, a command's output):
/// checked when they open, and ended when their token is revoked or expires. (`cube exec -it`'s
/// upgraded connection is not a body, and lasts.)
const STREAMED: [&str; 3] = ["/events", "/tasks/{id}/logs", "/tasks/{id}/exec"];

impl Acl {
    /// `response`, whose body ends once `token` is revoked or expires.
    fn until_token_gone(&self, response: Response, token: &TokenRecord) -> Response {
        use futures_util::StreamExt;
        let gone = Box::pin(token_gone(
            self.stores.tokens.clone(),
            token.id.clone(),
            token.expire_time,
        ));
        let (parts, body) = response.into_parts();
        let body = axum::body::Body::from_stream(body.into_data_stream().take_until(gone));
        Response::from_parts(parts, body)
    }
}

/// Resolves once the token `id` is no longer in `tokens` (revoked), or at `expiry`.
async fn token_gone(
    tokens: Arc<dyn Store<TokenRecord>>,
    id: String,
    expiry: Option<DateTime<Utc>>,
) {
    let expired = async {
        match expiry {
            Some(expiry) => {
                let left = (expiry - Utc::now()).to_std().unwrap_or_default();
                tokio::time::sleep(left).await;
            }
            None => std::future::pending().await,
        }
    };
    let revoked = async {
        loop {
            // The revision first, then the record: a revoke after the read is in the watch.
            let Ok(revision) = tokens.revision() else {
                return;
            };
            match tokens.get(&id) {
                Ok(Some(_)) => {}
                // Gone, or the store cannot say: the stream ends.
                _ => return,
            }
            let Ok(mut watch) = tokens.watch(&id, revision) else {
                return;
            };
            loop {
                match watch.next().await {
                    Ok(cube_store::Change::Delete { key, .. }) if key == id => return,
                    Ok(_) => {}
                    // Fell behind, or the feed broke: read the record again, after a pause
                    // so that a store that keeps failing is not asked in a tight loop.
                    Err(_) => {
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        break;
                    }
                }
            }
        }
    };
    tokio::select! {
        () = expired => {}
        () = revoked => {}
    }
}

/// `submit (or operator, management)`: the roles that would do.
fn needs_words(needed: Role) -> String {
    let above: Vec<&str> = [Role::Read, Role::Submit, Role::Operator, Role::Management]
        .into_iter()
        .filter(|role| *role != needed && role.allows(needed))
        .map(Role::as_str)
        .collect();
    if above.is_empty() {
        needed.as_str().to_string()
    } else {
        format!("{needed} (or {})", above.join(", "))
    }
}

/// With TLS on, a node's report (or certificate renewal) is taken only over that node's
/// certificate: the 403 names the node and the certificate presented.
pub fn check_node_peer(
    peer: Option<&PeerIdentity>,
    node: &str,
    what: &str,
) -> Result<(), ApiError> {
    match peer {
        Some(peer) if peer.role == PeerRole::Node && peer.name == node => Ok(()),
        Some(peer) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "{what}: node {node:?} reports only over its own certificate; this connection \
                 presented {peer}"
            ),
        )),
        None => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "{what}: node {node:?} reports only over its own certificate (this manager \
                 runs with --tls); this connection presented none (join with the node token \
                 to get one)"
            ),
        )),
    }
}

/// `POST /acl/bootstrap`: the first management token, shown once; 409 once there is one.
pub async fn bootstrap(State(state): State<AclState>) -> Result<Response, ApiError> {
    let acl = enabled(&state)?;
    match acl.bootstrap(Utc::now()).await? {
        Some(created) => Ok((StatusCode::CREATED, axum::Json(created)).into_response()),
        None => Err(ApiError::new(
            StatusCode::CONFLICT,
            "the ACL is already bootstrapped: ask a management token's holder for a token \
             (cube token create)",
        )),
    }
}

/// `POST /acl/tokens`: a new token, shown once.
/// The projects a new token of `role` holds in, as asked: `read`, `submit` and `operator`
/// tokens name theirs (`*` for every one; none: `default`); a `management` token holds in
/// every project and a node token in none, so they name none.
fn token_projects(role: Role, asked: Vec<String>) -> Result<Vec<String>, ApiError> {
    if matches!(role, Role::Management | Role::Node | Role::Router) {
        if !asked.is_empty() {
            return Err(ApiError::bad_request(format!(
                "Projects: a {role} token is not scoped to projects ({}); leave Projects out",
                match role {
                    Role::Node => "it runs tasks of every project",
                    Role::Router => "it routes to every project's services",
                    _ => "it holds in every project",
                }
            )));
        }
        return Ok(Vec::new());
    }
    if asked.is_empty() {
        return Ok(vec![cube_types::project::DEFAULT_PROJECT.to_string()]);
    }
    let mut projects = Vec::new();
    for project in asked {
        if project != cube_types::project::ALL_PROJECTS {
            cube_types::project::check_project_name(&project)
                .map_err(|why| ApiError::bad_request(format!("Projects: {why}")))?;
        }
        if !projects.contains(&project) {
            projects.push(project);
        }
    }
    Ok(projects)
}

pub async fn create_token(
    State(state): State<AclState>,
    body: Result<bytes::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    let acl = enabled(&state)?;
    let body = body?;
    let mut deserializer = serde_json::Deserializer::from_slice(&body);
    let request: TokenRequest = serde_path_to_error::deserialize(&mut deserializer)
        .map_err(|err| ApiError::bad_request(format!("invalid token request: {err}")))?;
    if let Some(name) = &request.name {
        if name.trim().is_empty() || name.len() > cube_types::token::MAX_TOKEN_NAME {
            return Err(ApiError::bad_request(format!(
                "Name: must be 1 to {} characters",
                cube_types::token::MAX_TOKEN_NAME
            )));
        }
        if name.chars().any(char::is_control) {
            return Err(ApiError::bad_request(
                "Name: must hold no control characters",
            ));
        }
    }
    let ttl = match &request.ttl {
        None => None,
        Some(text) => Some(
            cube_types::duration::parse_duration(text)
                .map_err(|err| ApiError::bad_request(format!("TTL: {err}")))?,
        ),
    };
    if ttl.is_some_and(|ttl| ttl.is_zero()) {
        return Err(ApiError::bad_request("TTL: must be longer than 0"));
    }
    if ttl.is_some_and(|ttl| ttl > cube_types::token::MAX_TOKEN_TTL) {
        return Err(ApiError::bad_request(
            "TTL: at most 8760h (a year); leave it out for a token that lasts until revoked",
        ));
    }
    let projects = token_projects(request.role, request.projects)?;
    let mut created = acl
        .create(request.role, request.name, ttl, projects, Utc::now())
        .await?;
    if let (Role::Node, Some(ca)) = (created.token.role, &state.ca) {
        // A join token carries the CA's fingerprint, for the worker to know its manager on
        // first contact.
        created.secret = format!("{}.{}", created.secret, ca.fingerprint());
    }
    Ok((StatusCode::CREATED, axum::Json(created)).into_response())
}

/// `GET /acl/self`: the token the request came with — its name, role and projects — so that
/// a client (the web UI) can tell what it may do before it tries. Without --acl every
/// request may do everything: `{"Acl": false, "Role": "management"}`.
pub async fn whoami(
    submitter: Option<axum::Extension<Submitter>>,
) -> axum::Json<serde_json::Value> {
    axum::Json(match submitter {
        Some(axum::Extension(submitter)) => serde_json::json!({
            "Acl": true,
            "Name": submitter.name,
            "Role": submitter.role,
            "Projects": submitter.projects,
        }),
        None => serde_json::json!({ "Acl": false, "Role": Role::Management }),
    })
}

/// `GET /acl/tokens`: every token, without secrets.
pub async fn list_tokens(
    State(state): State<AclState>,
) -> Result<axum::Json<Vec<TokenView>>, ApiError> {
    Ok(axum::Json(enabled(&state)?.list()?))
}

/// `DELETE /acl/tokens/{id}`: 204, or 404 when there is no such token.
pub async fn revoke_token(
    State(state): State<AclState>,
    cube_api::JsonPath(id): cube_api::JsonPath<String>,
) -> Result<StatusCode, ApiError> {
    if enabled(&state)?.revoke(&id)? {
        tracing::info!(token = %id, "token revoked");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no token with ID {id:?}"),
        ))
    }
}

fn enabled(state: &AclState) -> Result<&Acl, ApiError> {
    state.acl.as_deref().ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            "the ACL is off on this manager: start it with --acl to use tokens",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_missing_from_the_table_needs_management() {
        assert_eq!(
            need(&Method::POST, "/something/new"),
            Need::Role(Role::Management)
        );
        assert_eq!(need(&Method::HEAD, "/tasks"), Need::Role(Role::Read));
        assert_eq!(need(&Method::GET, "/health"), Need::Open);
    }

    #[test]
    fn secrets_compare_equal_only_when_equal() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "abcd"));
    }

    #[test]
    fn each_node_has_its_own_worker_command_token_the_same_on_every_manager_of_the_store() {
        let stores = AclStores {
            tokens: Arc::new(cube_store::MemoryStore::new()),
            keys: Arc::new(cube_store::MemoryStore::new()),
        };
        let acl = Acl::open(stores.clone()).unwrap();
        let a = acl.worker_token("a");
        assert!(a.starts_with("cubeworker."), "{a}");
        assert_ne!(a, acl.worker_token("b"));
        assert_ne!(a, acl.worker_token("a "));
        // Another manager on the same store (or this one restarted) derives the same.
        let again = Acl::open(stores.clone()).unwrap();
        assert_eq!(again.worker_token("a"), a);
        // The key the tokens are derived from is never one of them.
        let key = stores.keys.get(WORKER_COMMAND_KEY).unwrap().unwrap();
        assert!(!a.contains(&key));
        // Another cluster (another key): other tokens.
        let other = Acl::open(AclStores {
            tokens: Arc::new(cube_store::MemoryStore::new()),
            keys: Arc::new(cube_store::MemoryStore::new()),
        })
        .unwrap();
        assert_ne!(other.worker_token("a"), a);
    }

    #[test]
    fn a_tokens_owner_is_its_name_and_only_an_operator_names_another() {
        let submit = Submitter {
            name: "night build".into(),
            role: Role::Submit,
            projects: Vec::new(),
        };
        let mut owner = String::new();
        submit.settle_owner(&mut owner).unwrap();
        assert_eq!(owner, "night-build");
        submit.settle_owner(&mut owner).unwrap();
        let mut other = "bob".to_string();
        let refused = submit.settle_owner(&mut other).unwrap_err();
        assert_eq!(refused.status, StatusCode::FORBIDDEN);
        let operator = Submitter {
            name: "ops".into(),
            role: Role::Operator,
            projects: Vec::new(),
        };
        operator.settle_owner(&mut other).unwrap();
        assert_eq!(other, "bob");
    }

    #[tokio::test]
    async fn a_token_is_refused_once_revoked_or_expired() {
        let acl = Acl::open(AclStores {
            tokens: Arc::new(cube_store::MemoryStore::new()),
            keys: Arc::new(cube_store::MemoryStore::new()),
        })
        .unwrap();
        let now = Utc::now();
        let token = acl
            .create(Role::Read, None, None, Vec::new(), now)
            .await
            .unwrap();
        assert!(acl.authenticate(&token.secret, now).is_ok());
        let wrong = format!("{}0", &token.secret[..token.secret.len() - 1]);
        let wrong = if wrong == token.secret {
            format!("{}1", &token.secret[..token.secret.len() - 1])
        } else {
            wrong
        };
        assert!(acl.authenticate(&wrong, now).is_err());
        assert!(acl.revoke(&token.token.id).unwrap());
        assert!(acl.authenticate(&token.secret, now).is_err());

        let short = acl
            .create(
                Role::Read,
                None,
                Some(std::time::Duration::from_secs(1)),
                Vec::new(),
                now,
            )
            .await
            .unwrap();
        assert!(acl.authenticate(&short.secret, now).is_ok());
        let later = now + chrono::Duration::seconds(2);
        assert!(acl.authenticate(&short.secret, later).is_err());
    }
}
