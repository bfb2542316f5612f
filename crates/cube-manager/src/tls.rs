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
//!   Through a follower (several managers on etcd), the certificate is the one the follower
//!   saw, which it names in `X-Cube-Forwarded-Peer`; only a connection that presented a
//!   manager's certificate may name one (`crates/cube/src/leading.rs`).
//!
//! **Several managers on etcd share one CA** ([`shared_authority`]): the first to start makes
//! it and writes it to the `acl_keys` table under `tls-ca`, only if absent (so two starting
//! together make one), its key sealed (AES-256-GCM) under a key derived from the secret every
//! manager is given (`--tls-ca-secret`); the others read it and open the key with the same
//! secret. A CA the user brings (`--tls-ca`) is recorded there without its key, so that a
//! manager given another one is refused rather than split the cluster in two.

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

use crate::acl::{JoinCa, NodeClaim, check_node_peer, hex, make_claim, unhex};

/// What the TLS routes read: the manager's TLS, `None` with `--tls` off. The manager hands it
/// in (the API's router makes it from the manager's configuration), so that this module needs
/// nothing else of the manager.
#[derive(Debug, Clone, Default)]
pub struct TlsState(pub Option<Arc<ManagerTls>>);

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
    /// The settings of a follower handing a request on to the leader (several managers on
    /// etcd): the leader's certificate checked for a manager's role, this manager's presented
    /// (only a manager may name the node certificate it saw).
    pub peers: Arc<rustls::ClientConfig>,
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
        let verifier = PinnedCaVerifier::new(&authority.fingerprint(), Some(PeerRole::Manager))?;
        let peers = cube_api::tls::client_config(verifier, Some(slot.clone()))?;
        Ok(ManagerTls {
            authority,
            slot,
            cert_ttl,
            hosts,
            client,
            peers,
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

impl JoinCa for ManagerTls {
    fn fingerprint(&self) -> String {
        self.authority.fingerprint()
    }
}

fn enabled(state: &TlsState) -> Result<&ManagerTls, ApiError> {
    state.0.as_deref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "TLS is off on this manager: start it with --tls (and --acl)",
        )
    })
}

/// `GET /tls/ca`: the cluster CA's certificate, PEM.
pub async fn ca(State(state): State<TlsState>) -> Result<Response, ApiError> {
    let tls = enabled(&state)?;
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/x-pem-file")],
        tls.authority.ca_pem().to_string(),
    )
        .into_response())
}

/// `POST /nodes/{name}/certificate`: a certificate for node `{name}`.
pub async fn issue_node_certificate(
    State(state): State<TlsState>,
    cube_api::JsonPath(name): cube_api::JsonPath<String>,
    peer: Option<axum::Extension<PeerIdentity>>,
    claim: Option<axum::Extension<NodeClaim>>,
    body: Result<bytes::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    let tls = enabled(&state)?;
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
    make_claim(claim.as_ref()).await?;
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

/// The key in the `acl_keys` table of the CA that managers sharing etcd share.
pub const SHARED_CA_KEY: &str = "tls-ca";

/// The least length of `--tls-ca-secret`, in bytes: 32 random bytes in hex are 64.
pub const MIN_CA_SECRET_LEN: usize = 32;

/// The cluster CA as kept under [`SHARED_CA_KEY`] (JSON).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct SharedCa {
    /// The CA's certificate, PEM.
    #[serde(rename = "Certificate")]
    certificate: String,
    /// The CA's key (PEM), sealed under the key of `--tls-ca-secret`: the nonce, then the
    /// ciphertext and its tag, in hex. `None` for a CA the user brought (`--tls-ca`), whose
    /// key, if any, each manager is given.
    #[serde(rename = "SealedKey")]
    sealed_key: Option<String>,
}

/// Why the CA shared on etcd could not be made, read or used.
#[derive(Debug, thiserror::Error)]
pub enum SharedCaError {
    #[error("the cluster CA in the store: {0}")]
    Store(#[from] cube_store::StoreError),
    #[error("the cluster CA in the store is malformed: {0}")]
    Malformed(String),
    #[error(
        "--tls with --store etcd needs --tls-ca-secret FILE (the same file on every manager: \
         the first manager keeps the cluster CA in etcd, its key encrypted under it), or the \
         cluster's own CA given to every manager with --tls-ca"
    )]
    NoSecret,
    #[error(
        "the cluster CA in etcd (fingerprint {stored}) was brought by the user (--tls-ca): give \
         this manager the same --tls-ca (and --tls-ca-key)"
    )]
    BroughtElsewhere { stored: String },
    #[error(
        "--tls-ca has fingerprint {given}, but the managers on this etcd use the cluster CA \
         {stored}: give every manager the same CA"
    )]
    Mismatch { stored: String, given: String },
    #[error(
        "cannot open the key of the cluster CA in etcd (fingerprint {stored}) with \
         --tls-ca-secret: it is not the secret the CA was made with; give every manager the \
         same secret file"
    )]
    WrongSecret { stored: String },
    #[error("the cluster CA: {0}")]
    Tls(#[from] cube_api::tls::TlsError),
    #[error("cannot read random bytes from the operating system: {0}")]
    Random(String),
}

/// The key that seals the shared CA's key: derived from `--tls-ca-secret`, which every
/// manager of the cluster is given and which etcd never holds.
pub struct CaSecret {
    key: crate::sealing::SealingKey,
}

impl std::fmt::Debug for CaSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CaSecret { .. }")
    }
}

impl CaSecret {
    /// The secret of a file's text (surrounding white space aside), which must be at least
    /// [`MIN_CA_SECRET_LEN`] bytes; `None` when it is shorter.
    pub fn from_text(text: &str) -> Option<CaSecret> {
        let text = text.trim();
        if text.len() < MIN_CA_SECRET_LEN {
            return None;
        }
        // A fixed label keeps this key apart from any other use of the same secret.
        Some(CaSecret {
            key: crate::sealing::SealingKey::derive("cube cluster CA key, v1\0", text.as_bytes()),
        })
    }

    /// `plain` sealed, bound to `bound_to` (the CA's fingerprint: a sealed key moved under
    /// another certificate does not open), in hex.
    fn seal(&self, plain: &[u8], bound_to: &str) -> Result<String, SharedCaError> {
        let sealed = self
            .key
            .seal(plain, bound_to.as_bytes())
            .map_err(|err| match err {
                crate::sealing::SealError::Random(why) => SharedCaError::Random(why),
                crate::sealing::SealError::Seal => {
                    SharedCaError::Malformed("the CA's key could not be sealed".into())
                }
            })?;
        Ok(hex(&sealed))
    }

    /// What [`CaSecret::seal`] sealed, or `None` when this is not the key it was sealed with
    /// (or it was altered).
    fn open(&self, sealed: &str, bound_to: &str) -> Option<Vec<u8>> {
        self.key.open(&unhex(sealed)?, bound_to.as_bytes())
    }
}

/// The one CA of the managers sharing `keys` (their etcd `acl_keys` table): the one kept
/// there, made and kept by this manager when there is none yet (written only if absent, so
/// that of two managers starting together one makes it and both use it). `brought` is the
/// user's `--tls-ca`: it must be the one kept, and is kept without its key. Else the kept
/// CA's key is opened with `secret`.
pub fn shared_authority(
    keys: &dyn cube_store::Store<String>,
    brought: Option<Authority>,
    secret: Option<&CaSecret>,
) -> Result<Authority, SharedCaError> {
    let read = |text: &str| -> Result<SharedCa, SharedCaError> {
        serde_json::from_str(text).map_err(|err| SharedCaError::Malformed(err.to_string()))
    };
    let kept = match keys.get(SHARED_CA_KEY)? {
        Some(text) => read(&text)?,
        None => {
            let made = match &brought {
                Some(authority) => SharedCa {
                    certificate: authority.ca_pem().to_string(),
                    sealed_key: None,
                },
                None => {
                    let secret = secret.ok_or(SharedCaError::NoSecret)?;
                    let authority = Authority::generate()?;
                    let key_pem = authority.key_pem().ok_or_else(|| {
                        SharedCaError::Malformed("a new CA without its key".into())
                    })?;
                    SharedCa {
                        certificate: authority.ca_pem().to_string(),
                        sealed_key: Some(
                            secret.seal(key_pem.as_bytes(), &authority.fingerprint())?,
                        ),
                    }
                }
            };
            let text = serde_json::to_string(&made)
                .map_err(|err| SharedCaError::Malformed(err.to_string()))?;
            match keys.put_if(SHARED_CA_KEY, &text, cube_store::Expected::Absent)? {
                Ok(_) => {
                    tracing::info!("made the cluster CA and kept it in the store");
                    made
                }
                // Another manager made it first: take theirs.
                Err(_) => read(&keys.get(SHARED_CA_KEY)?.ok_or_else(|| {
                    SharedCaError::Malformed("it vanished while it was being made".into())
                })?)?,
            }
        }
    };
    let certificate = Authority::from_pem(&kept.certificate, None)?;
    let stored = certificate.fingerprint();
    if let Some(authority) = brought {
        if authority.fingerprint() != stored {
            return Err(SharedCaError::Mismatch {
                stored,
                given: authority.fingerprint(),
            });
        }
        return Ok(authority);
    }
    let Some(sealed) = &kept.sealed_key else {
        return Err(SharedCaError::BroughtElsewhere { stored });
    };
    let secret = secret.ok_or(SharedCaError::NoSecret)?;
    let key_pem = secret
        .open(sealed, &stored)
        .and_then(|key| String::from_utf8(key).ok())
        .ok_or(SharedCaError::WrongSecret {
            stored: stored.clone(),
        })?;
    Ok(Authority::from_pem(&kept.certificate, Some(&key_pem))?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cube_store::{MemoryStore, Store};

    fn secret(text: &str) -> CaSecret {
        CaSecret::from_text(text).expect("a long enough secret")
    }

    const SECRET: &str = "0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn managers_on_one_store_share_the_ca_made_first_and_can_sign_with_it() {
        let keys = MemoryStore::<String>::new();
        let first = shared_authority(&keys, None, Some(&secret(SECRET))).unwrap();
        let second = shared_authority(&keys, None, Some(&secret(SECRET))).unwrap();
        assert_eq!(first.fingerprint(), second.fingerprint());
        assert!(second.can_sign());
        // The key is not in the store in the clear.
        let kept = keys.get(SHARED_CA_KEY).unwrap().unwrap();
        assert!(!kept.contains("PRIVATE KEY"), "{kept}");
    }

    #[test]
    fn managers_racing_on_an_empty_store_end_with_one_ca() {
        let keys = std::sync::Arc::new(MemoryStore::<String>::new());
        let fingerprints: Vec<String> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    let keys = keys.clone();
                    scope.spawn(move || {
                        shared_authority(&*keys, None, Some(&secret(SECRET)))
                            .unwrap()
                            .fingerprint()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(
            fingerprints.iter().all(|f| *f == fingerprints[0]),
            "{fingerprints:?}"
        );
    }

    #[test]
    fn another_secret_a_missing_one_or_a_short_one_is_refused_saying_so() {
        let keys = MemoryStore::<String>::new();
        shared_authority(&keys, None, Some(&secret(SECRET))).unwrap();
        let other = secret("another secret, long enough to be one...");
        let err = shared_authority(&keys, None, Some(&other)).unwrap_err();
        assert!(matches!(err, SharedCaError::WrongSecret { .. }), "{err}");
        assert!(err.to_string().contains("--tls-ca-secret"), "{err}");
        let err = shared_authority(&keys, None, None).unwrap_err();
        assert!(matches!(err, SharedCaError::NoSecret), "{err}");
        assert!(CaSecret::from_text("  short  ").is_none());
    }

    #[test]
    fn a_brought_ca_is_kept_without_its_key_and_another_one_is_refused() {
        let keys = MemoryStore::<String>::new();
        let brought = Authority::generate().unwrap();
        let fingerprint = brought.fingerprint();
        let pem = (brought.ca_pem().to_string(), brought.key_pem().unwrap());
        let used = shared_authority(&keys, Some(brought), None).unwrap();
        assert_eq!(used.fingerprint(), fingerprint);
        let again = Authority::from_pem(&pem.0, Some(&pem.1)).unwrap();
        assert!(shared_authority(&keys, Some(again), None).is_ok());
        let err = shared_authority(&keys, Some(Authority::generate().unwrap()), None).unwrap_err();
        assert!(matches!(err, SharedCaError::Mismatch { .. }), "{err}");
        let err = shared_authority(&keys, None, Some(&secret(SECRET))).unwrap_err();
        assert!(
            matches!(err, SharedCaError::BroughtElsewhere { .. }),
            "{err}"
        );
    }
}
