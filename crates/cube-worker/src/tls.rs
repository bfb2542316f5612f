//! The worker's side of mutual TLS: joining a manager started with `--tls` by its join token
//! (`cube.<ID>.<SECRET>.<CA SHA-256>`), and renewing the node's certificate in place.
//!
//! **Joining.** The worker knows the CA only by the fingerprint in its token. It makes a key
//! and a signing request for its node name and asks `POST /nodes/{name}/certificate` with the
//! token, over HTTPS verified by [`cube_api::tls::PinnedCaVerifier`]: the manager's chain must
//! hold the CA of that fingerprint and its certificate must be a manager's, or the worker
//! refuses to join. The answer is the node's certificate and the CA.
//!
//! **Serving.** The worker's API then takes only clients whose certificate the CA signed
//! (the handshake refuses the others), and task commands only over the manager's certificate
//! (`gate.rs`), on top of the worker-command token.
//!
//! **Bringing certificates.** With `--tls-cert`, `--tls-key` and `--tls-ca` the worker does
//! not ask for a certificate: it serves and presents the one given (checked against the CA at
//! start, read again whenever the files change) and verifies the manager against that CA.
//!
//! **Renewal.** Once two thirds of the certificate's life have passed, the worker asks again,
//! presenting its current certificate, and puts the new one in its [`CertSlot`]: the server
//! and the heartbeat client read it at their next handshake. Nothing restarts.
//!
//! **Kept across restarts.** A certificate the manager signed is written to the data
//! directory ([`KeptCertificate`]: `tls/node-<name>.pem`, `tls/node-<name>-key.pem` and
//! `tls/node-<name>-ca.pem`, each readable and writable by its owner only) when it is received
//! and at each renewal. A restarted worker serves with it and does not join again, as long as
//! it is of the CA its join token names, for its name, valid for the hosts it serves now and
//! not expired; otherwise it joins again (saying why).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cube_api::tls::{
    CertFiles, CertSlot, CertificateIssued, CertificateRequest, ClientCerts, PeerRole,
    PinnedCaVerifier, TlsError,
};
use cube_api::{ApiClient, ClientError};
use rustls::pki_types::CertificateDer;
use tokio_util::sync::CancellationToken;

/// What went wrong joining with TLS.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("cannot get a certificate from {manager}: {cause}")]
    Refused { manager: String, cause: String },
    #[error(
        "the manager's CA has fingerprint {got}, not {expected} as the join token says: refusing \
         to join"
    )]
    WrongCa { expected: String, got: String },
    #[error("no manager given")]
    NoManager,
}

/// A worker's TLS state once joined.
pub struct WorkerTls {
    /// The node's certificate, served and presented to the manager.
    pub slot: Arc<CertSlot>,
    /// The worker API's settings: the node's certificate, clients' certificates required and
    /// checked against the CA.
    pub server: Arc<rustls::ServerConfig>,
    /// The settings of calls to the manager: its certificate checked against the CA, the
    /// node's presented.
    pub client: Arc<rustls::ClientConfig>,
    name: String,
    hosts: Vec<String>,
    /// The node's certificate as brought by the user (`--tls-cert`, `--tls-key`): read again
    /// when the files change rather than renewed by the manager.
    files: Option<CertFiles>,
    /// Where a certificate the manager signed is kept for the next start.
    kept: Option<KeptCertificate>,
}

/// Where a joined worker keeps the certificate the manager signed for it, in its data
/// directory: the chain (the certificate, then the CA), its key and the CA, each `0600`. The
/// files are named after the node, since workers of several names may share a directory.
#[derive(Debug, Clone)]
pub struct KeptCertificate {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
}

impl KeptCertificate {
    pub fn in_dir(data_dir: &Path, name: &str) -> KeptCertificate {
        // A name that is not a plain file name is written with `_` for what is not; the
        // certificate read back must still be for `name` (its CN), so two names that meet
        // here cannot take each other's.
        let stem: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let dir = data_dir.join("tls");
        KeptCertificate {
            cert: dir.join(format!("node-{stem}.pem")),
            key: dir.join(format!("node-{stem}-key.pem")),
            ca: dir.join(format!("node-{stem}-ca.pem")),
        }
    }

    /// The key's file.
    pub fn key_path(&self) -> &Path {
        &self.key
    }

    /// Writes a certificate the manager signed (key first: a certificate without its key is
    /// never read as valid).
    fn save(&self, issued: &cube_api::tls::Issued, ca_pem: &str) -> Result<(), TlsError> {
        cube_api::tls::write_private(&self.key, &issued.key_pem)?;
        cube_api::tls::write_private(&self.ca, ca_pem)?;
        cube_api::tls::write_private(&self.cert, &issued.chain_pem)
    }

    /// The kept certificate, when there is one that this worker may serve with: of the CA
    /// of `fingerprint`, for node `name`, valid for every one of `hosts` and not expired. Why
    /// not otherwise (`Ok(None)`: nothing kept).
    fn load(
        &self,
        fingerprint: &str,
        name: &str,
        hosts: &[String],
    ) -> Result<Option<(rustls::sign::CertifiedKey, CertificateDer<'static>)>, String> {
        if !self.cert.exists() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&self.ca)
            .map_err(|err| format!("cannot read {}: {err}", self.ca.display()))?;
        let ca = cube_api::tls::certificates_from_pem(&text, "the kept CA")
            .map_err(|err| err.to_string())?
            .into_iter()
            .next()
            .ok_or_else(|| format!("{} holds no certificate", self.ca.display()))?;
        let expected = cube_api::tls::normalize_fingerprint(fingerprint).unwrap_or_default();
        if cube_api::tls::fingerprint(&ca) != expected {
            return Err(format!(
                "it is of the CA {}, and the join token names {expected}",
                cube_api::tls::fingerprint(&ca)
            ));
        }
        let files = CertFiles::new(
            self.cert.clone(),
            self.key.clone(),
            &ca,
            PeerRole::Node,
            Some(name),
        );
        let (certified, _) = files.load().map_err(|err| err.to_string())?;
        let leaf = certified
            .cert
            .first()
            .ok_or_else(|| "it holds no certificate".to_string())?;
        let (_, _, not_after) = cube_api::tls::serial_and_validity(leaf)
            .ok_or_else(|| "its validity cannot be read".to_string())?;
        if not_after <= SystemTime::now() {
            return Err("it has expired".to_string());
        }
        let covered = cube_api::tls::subject_hosts(leaf).unwrap_or_default();
        let same =
            |a: &str, b: &str| match (a.parse::<std::net::IpAddr>(), b.parse::<std::net::IpAddr>())
            {
                (Ok(a), Ok(b)) => a == b,
                _ => a.eq_ignore_ascii_case(b),
            };
        if let Some(missing) = hosts
            .iter()
            .find(|host| !covered.iter().any(|known| same(known, host)))
        {
            return Err(format!(
                "it is not valid for {missing} (it is for {})",
                covered.join(", ")
            ));
        }
        Ok(Some((certified, ca)))
    }
}

impl std::fmt::Debug for WorkerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerTls")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Asks `manager` for a certificate for node `name`, valid for `hosts`: the answer, the
/// certificate with its new key in PEM (to keep), and ready to use.
async fn request_certificate(
    manager: &ApiClient,
    name: &str,
    hosts: &[String],
) -> Result<
    (
        CertificateIssued,
        cube_api::tls::Issued,
        rustls::sign::CertifiedKey,
    ),
    JoinError,
> {
    let (key, csr) = cube_api::tls::node_request(name, hosts)?;
    let (_, issued): (_, CertificateIssued) = manager
        .post(
            &format!("/nodes/{name}/certificate"),
            &CertificateRequest { csr },
        )
        .await
        .map_err(|err: ClientError| JoinError::Refused {
            manager: manager.base().to_string(),
            cause: err.to_string(),
        })?;
    let pems = cube_api::tls::Issued {
        chain_pem: issued.certificate.clone(),
        key_pem: key.serialize_pem(),
    };
    let certified = pems.certified_key()?;
    Ok((issued, pems, certified))
}

impl WorkerTls {
    /// Serving and calling with a certificate the manager signed (received now or kept from
    /// the last start), renewed in place and kept in `kept` at each renewal.
    fn joined(
        certified: rustls::sign::CertifiedKey,
        ca: &CertificateDer<'static>,
        verifier: PinnedCaVerifier,
        name: &str,
        hosts: Vec<String>,
        kept: KeptCertificate,
    ) -> Result<WorkerTls, JoinError> {
        let slot = CertSlot::new(certified);
        let server = cube_api::tls::server_config(slot.clone(), ca, ClientCerts::Required)?;
        let client = cube_api::tls::client_config(verifier, Some(slot.clone()))?;
        Ok(WorkerTls {
            slot,
            server,
            client,
            name: name.to_string(),
            hosts,
            files: None,
            kept: Some(kept),
        })
    }

    /// Joins: serves with the certificate kept in `kept` when there is a fitting one (see
    /// [`KeptCertificate::load`]); else gets node `name`'s certificate (valid for `hosts`)
    /// from the first of `managers` that gives one, checking the CA against `fingerprint`,
    /// and keeps it there.
    pub async fn join(
        managers: &[String],
        token: &str,
        fingerprint: &str,
        name: &str,
        hosts: Vec<String>,
        kept: KeptCertificate,
    ) -> Result<WorkerTls, JoinError> {
        let verifier = PinnedCaVerifier::new(fingerprint, Some(PeerRole::Manager))?;
        match kept.load(fingerprint, name, &hosts) {
            Ok(Some((certified, ca))) => {
                tracing::info!(certificate = %kept.cert.display(), node = %name, "serving with the certificate kept from the last start; not joining again");
                return WorkerTls::joined(certified, &ca, verifier, name, hosts, kept);
            }
            Ok(None) => {}
            Err(why) => {
                tracing::warn!(certificate = %kept.cert.display(), "not using the kept certificate: {why}; joining again");
            }
        }
        let first_contact = cube_api::tls::client_config(verifier.clone(), None)?;
        let mut last = JoinError::NoManager;
        for address in managers {
            let manager = ApiClient::with_tls(
                address,
                Duration::from_secs(10),
                Some(first_contact.clone()),
            )
            .map_err(|err| JoinError::Refused {
                manager: address.clone(),
                cause: err.to_string(),
            })?
            .with_token(Some(token));
            let (issued, pems, certified) = match request_certificate(&manager, name, &hosts).await
            {
                Ok(answer) => answer,
                Err(err) => {
                    last = err;
                    continue;
                }
            };
            let ca = cube_api::tls::certificates_from_pem(&issued.ca, "the manager's CA")?
                .into_iter()
                .next()
                .ok_or_else(|| JoinError::Refused {
                    manager: manager.base().to_string(),
                    cause: "its answer holds no CA certificate".to_string(),
                })?;
            let got = cube_api::tls::fingerprint(&ca);
            let expected = cube_api::tls::normalize_fingerprint(fingerprint).unwrap_or_default();
            if got != expected {
                return Err(JoinError::WrongCa { expected, got });
            }
            tracing::info!(manager = %manager.base(), node = %name, "joined with TLS: certificate received");
            // Kept for the next start; one that cannot be written is said and not fatal (the
            // next start joins again).
            if let Err(err) = kept.save(&pems, &issued.ca) {
                tracing::warn!(error = %err, "cannot keep the node's certificate in the data directory; the next start joins again");
            }
            return WorkerTls::joined(certified, &ca, verifier, name, hosts, kept);
        }
        Err(last)
    }

    /// TLS with a certificate the user brought (`--tls-cert`, `--tls-key`, `--tls-ca`)
    /// instead of one the manager signs: `files` is checked against `ca` for node `name`.
    pub fn from_files(
        files: CertFiles,
        ca: &CertificateDer<'static>,
        name: &str,
    ) -> Result<WorkerTls, TlsError> {
        let (key, _) = files.load()?;
        let slot = CertSlot::new(key);
        let verifier =
            PinnedCaVerifier::new(&cube_api::tls::fingerprint(ca), Some(PeerRole::Manager))?;
        let server = cube_api::tls::server_config(slot.clone(), ca, ClientCerts::Required)?;
        let client = cube_api::tls::client_config(verifier, Some(slot.clone()))?;
        Ok(WorkerTls {
            slot,
            server,
            client,
            name: name.to_string(),
            hosts: Vec::new(),
            files: Some(files),
            kept: None,
        })
    }

    /// Renews the node's certificate whenever two thirds of its life have passed, asking the
    /// first of `managers` (clients built with [`WorkerTls::client`]) that answers, until
    /// `shutdown`. A failed renewal is tried again after a tenth of what is left of the
    /// certificate's life (at least a second).
    pub async fn run_renewal(
        self: Arc<WorkerTls>,
        managers: Vec<ApiClient>,
        shutdown: CancellationToken,
    ) {
        if let Some(files) = &self.files {
            return files.clone().watch(self.slot.clone(), shutdown).await;
        }
        while self.slot.renewal_due(&shutdown).await {
            let mut renewed = false;
            for manager in &managers {
                match request_certificate(manager, &self.name, &self.hosts).await {
                    Ok((issued, pems, certified)) => {
                        self.slot.replace(certified);
                        tracing::info!(manager = %manager.base(), "the node's certificate was renewed");
                        if let Some(kept) = &self.kept
                            && let Err(err) = kept.save(&pems, &issued.ca)
                        {
                            tracing::warn!(error = %err, "cannot keep the renewed certificate in the data directory");
                        }
                        renewed = true;
                        break;
                    }
                    Err(err) => {
                        tracing::warn!(manager = %manager.base(), error = %err, "cannot renew the node's certificate");
                    }
                }
            }
            if !renewed {
                let left = self
                    .slot
                    .leaf_der()
                    .and_then(|leaf| cube_api::tls::serial_and_validity(&leaf))
                    .and_then(|(_, _, not_after)| not_after.duration_since(SystemTime::now()).ok())
                    .unwrap_or_default();
                let pause = (left / 10).max(Duration::from_secs(1));
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
}
