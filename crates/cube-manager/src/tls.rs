//! The manager's side of mutual TLS (`cube manager --tls`): the cluster CA, the manager's own
//! certificate (renewed in place), the routes that hand certificates to nodes, and the check
//! that a node reports only over its own certificate.
//!
//! - `GET /tls/ca` (open): the CA certificate, PEM. Anyone may read it; a client checks its
//!   SHA-256 against the fingerprint it was told (join token, `--ca-fingerprint`).
//! - `POST /nodes/{name}/certificate` (a node token, which claims `{name}` as a heartbeat
//!   does, once the signing request proved valid): signs the node's certificate signing request (`{"CSR": "<PEM>"}`) for `{name}`
//!   and answers `{"Certificate": "<PEM chain>", "CA": "<PEM>"}`. A worker asks on joining
//!   and again to renew; when the connection presents a certificate, it must be `{name}`'s.
//! - `PUT /nodes/{name}` with TLS on is taken only over `{name}`'s certificate (`guard`).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use cube_api::ApiError;
use cube_api::tls::{
    Authority, CertFiles, CertSlot, CertificateIssued, CertificateRequest, ClientCerts,
    MANAGER_NAME, PeerIdentity, PeerRole, PinnedCaVerifier,
};
use tokio_util::sync::CancellationToken;

use crate::manager::Manager;

/// The manager's TLS state.
pub struct ManagerTls {
    pub authority: Authority,
    /// The manager's certificate, served to clients and presented to workers.
    pub slot: Arc<CertSlot>,
    /// How long a certificate the manager signs lasts (`--cert-ttl`).
    pub cert_ttl: Duration,
    /// The host names and addresses the manager's certificate is valid for.
    pub hosts: Vec<String>,
    /// The settings of calls to workers: their certificates checked against the CA and for a
    /// node's role, the manager's certificate presented.
    pub client: Arc<rustls::ClientConfig>,
    /// The manager's own certificate as brought by the user (`--tls-cert`, `--tls-key`):
    /// read again when the files change rather than renewed by the manager.
    pub files: Option<CertFiles>,
}

impl std::fmt::Debug for ManagerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagerTls")
            .field("authority", &self.authority)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

impl ManagerTls {
    /// TLS with `authority`: the manager's certificate from `files` when the user brought
    /// one, else a new one for `hosts` lasting `cert_ttl`.
    pub fn new(
        authority: Authority,
        hosts: Vec<String>,
        cert_ttl: Duration,
        files: Option<CertFiles>,
    ) -> Result<ManagerTls, cube_api::tls::TlsError> {
        let key = match &files {
            Some(files) => files.load()?.0,
            None => authority
                .issue(PeerRole::Manager, MANAGER_NAME, &hosts, cert_ttl)?
                .certified_key()?,
        };
        let slot = CertSlot::new(key);
        let verifier = PinnedCaVerifier::new(&authority.fingerprint(), Some(PeerRole::Node))?;
        let client = cube_api::tls::client_config(verifier, Some(slot.clone()))?;
        Ok(ManagerTls {
            authority,
            slot,
            cert_ttl,
            hosts,
            client,
            files,
        })
    }

    /// The server settings: the manager's certificate from its slot, client certificates
    /// verified when presented (users' CLI has only a token).
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, cube_api::tls::TlsError> {
        cube_api::tls::server_config(
            self.slot.clone(),
            self.authority.ca_der(),
            ClientCerts::Optional,
        )
    }

    /// Renews the manager's certificate whenever two thirds of its life have passed (a
    /// brought one: whenever its files change), until `shutdown`. Connections already open
    /// keep the certificate they started with.
    pub async fn run_renewal(self: Arc<ManagerTls>, shutdown: CancellationToken) {
        if let Some(files) = &self.files {
            return files.clone().watch(self.slot.clone(), shutdown).await;
        }
        while self.slot.renewal_due(&shutdown).await {
            let renewed = self
                .authority
                .issue(PeerRole::Manager, MANAGER_NAME, &self.hosts, self.cert_ttl)
                .and_then(|issued| issued.certified_key());
            match renewed {
                Ok(key) => {
                    self.slot.replace(key);
                    tracing::info!("the manager's certificate was renewed");
                }
                Err(err) => {
                    tracing::error!(error = %err, "cannot renew the manager's certificate; trying again in a minute");
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(Duration::from_secs(60)) => {}
                    }
                }
            }
        }
    }
}

fn enabled(manager: &Manager) -> Result<&ManagerTls, ApiError> {
    manager.config.tls.as_deref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "TLS is off on this manager: start it with --tls (and --acl)",
        )
    })
}

/// `GET /tls/ca`: the cluster CA's certificate, PEM.
pub async fn ca(State(manager): State<Arc<Manager>>) -> Result<Response, ApiError> {
    let tls = enabled(&manager)?;
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/x-pem-file")],
        tls.authority.ca_pem().to_string(),
    )
        .into_response())
}

/// `POST /nodes/{name}/certificate`: a certificate for node `{name}`.
pub async fn issue_node_certificate(
    State(manager): State<Arc<Manager>>,
    cube_api::JsonPath(name): cube_api::JsonPath<String>,
    peer: Option<axum::Extension<PeerIdentity>>,
    claim: Option<axum::Extension<crate::acl::NodeClaim>>,
    body: Result<bytes::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    let tls = enabled(&manager)?;
    if !tls.authority.can_sign() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "this manager's CA was brought without its key (--tls-ca without --tls-ca-key), so \
             it signs no certificate: start the worker with its own --tls-cert, --tls-key and \
             --tls-ca",
        ));
    }
    if let Some(axum::Extension(peer)) = &peer {
        check_node_peer(Some(peer), &name, "POST /nodes/{name}/certificate")?;
    }
    let body = body?;
    let mut deserializer = serde_json::Deserializer::from_slice(&body);
    let request: CertificateRequest = serde_path_to_error::deserialize(&mut deserializer)
        .map_err(|err| ApiError::bad_request(format!("invalid certificate request: {err}")))?;
    let certificate = tls
        .authority
        .sign_node_request(&name, &request.csr, tls.cert_ttl)
        .map_err(|err| ApiError::bad_request(err.to_string()))?;
    // A join token's first request: the name is its own only now that the signing request
    // proved valid, and before the certificate leaves.
    crate::acl::make_claim(claim.as_ref()).await?;
    tracing::info!(node = %name, "certificate issued to a node");
    Ok((
        StatusCode::CREATED,
        axum::Json(CertificateIssued {
            certificate,
            ca: tls.authority.ca_pem().to_string(),
        }),
    )
        .into_response())
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
