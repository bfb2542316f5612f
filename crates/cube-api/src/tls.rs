//! Mutual TLS between a manager, its workers and the CLI (`cube manager --tls`).
//!
//! - **The cluster CA** ([`Authority`]) is made by the manager with `rcgen` on its first
//!   start (or loaded from its data directory, or brought by the user). Its SHA-256
//!   fingerprint travels in node join tokens, so that a joining worker can tell the real
//!   manager on first contact without any file copied by hand (Docker Swarm's design).
//! - **Who a certificate is** ([`PeerIdentity`]): its subject's common name is the node's name
//!   (or `cube-manager`), and its organizational unit says the role: [`MANAGER_UNIT`] or
//!   [`NODE_UNIT`]. The manager writes the subject of every certificate it signs itself,
//!   whatever a request asks, so a node can never hold a manager's certificate.
//! - **Verifying a server** ([`PinnedCaVerifier`]): a server sends its CA after its own
//!   certificate; the client takes the CA whose SHA-256 is the one it was told, checks the chain
//!   and the host name against it, then the role it expects. Nothing else is trusted: no
//!   system roots.
//! - **Renewal without restart** ([`CertSlot`]): a server and a client read their certificate
//!   from a slot at each handshake, and a renewal swaps the slot's content.
//!
//! This module knows certificates and keys, never tokens nor what a route may do.

use std::sync::{Arc, Once};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use sha2::{Digest, Sha256};

/// The organizational unit of a manager's certificate.
pub const MANAGER_UNIT: &str = "cube-manager";
/// The organizational unit of a node's certificate.
pub const NODE_UNIT: &str = "cube-node";
/// The common name of a manager's certificate.
pub const MANAGER_NAME: &str = "cube-manager";
/// How long a certificate lasts unless `--cert-ttl` says otherwise: 30 days.
pub const DEFAULT_CERT_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long the CA lasts: ten years.
const CA_TTL: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// A certificate starts being valid a little before it is made, for clocks a little apart
/// (a tenth of its life at most).
const CLOCK_SKEW: Duration = Duration::from_secs(60);

/// What went wrong with a certificate or a key.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot make a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{what}: {reason}")]
    Invalid { what: String, reason: String },
    #[error("{path}: {source}")]
    File {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS setup: {0}")]
    Rustls(#[from] rustls::Error),
}

fn invalid(what: impl Into<String>, reason: impl ToString) -> TlsError {
    TlsError::Invalid {
        what: what.into(),
        reason: reason.to_string(),
    }
}

/// The crypto Cube uses: `ring`'s. Installed as the process's default once, so that a
/// `reqwest` client built without Cube's own TLS settings finds one too.
pub fn provider() -> Arc<CryptoProvider> {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // Another part of the process may have installed one first: that one stays.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The SHA-256 of a certificate (DER), in lowercase hex: what a join token and
/// `--ca-fingerprint` carry.
pub fn fingerprint(der: &[u8]) -> String {
    Sha256::digest(der)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Whether `text` is a SHA-256 fingerprint as Cube writes it (64 hex digits; `:` between
/// bytes and upper case are accepted, as `openssl x509 -fingerprint` writes it).
pub fn normalize_fingerprint(text: &str) -> Option<String> {
    let hex: String = text
        .trim()
        .chars()
        .filter(|c| *c != ':')
        .collect::<String>()
        .to_ascii_lowercase();
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(hex)
}

/// What a certificate's holder is, as Cube's CA wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerRole {
    Manager,
    Node,
}

/// Who presented a certificate: the role and the name written in its subject. The accept
/// loop inserts it in every request of a connection whose client presented a certificate
/// that the CA signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerIdentity {
    pub role: PeerRole,
    pub name: String,
}

impl std::fmt::Display for PeerIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.role {
            PeerRole::Manager => write!(f, "the manager's certificate ({})", self.name),
            PeerRole::Node => write!(f, "the certificate of node {:?}", self.name),
        }
    }
}

/// The identity in a certificate (DER), when it is one of Cube's.
pub fn identity_of(der: &[u8]) -> Option<PeerIdentity> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    let unit = subject
        .iter_organizational_unit()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    let role = match unit.as_str() {
        MANAGER_UNIT => PeerRole::Manager,
        NODE_UNIT => PeerRole::Node,
        _ => return None,
    };
    Some(PeerIdentity { role, name })
}

/// The serial number (hex) and the validity of a certificate (DER).
pub fn serial_and_validity(der: &[u8]) -> Option<(String, SystemTime, SystemTime)> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let validity = cert.validity();
    let at = |time: &x509_parser::time::ASN1Time| {
        let seconds = u64::try_from(time.timestamp()).ok()?;
        Some(SystemTime::UNIX_EPOCH + Duration::from_secs(seconds))
    };
    Some((
        cert.raw_serial_as_string(),
        at(&validity.not_before)?,
        at(&validity.not_after)?,
    ))
}

/// The host names and IP addresses a certificate (DER) is valid for (its subject alternative
/// names), IP addresses written as `std::net::IpAddr` writes them.
pub fn subject_hosts(der: &[u8]) -> Option<Vec<String>> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let Some(names) = cert.subject_alternative_name().ok()? else {
        return Some(Vec::new());
    };
    Some(
        names
            .value
            .general_names
            .iter()
            .filter_map(|name| match name {
                GeneralName::DNSName(host) => Some((*host).to_string()),
                GeneralName::IPAddress(bytes) => match bytes.len() {
                    4 => <[u8; 4]>::try_from(*bytes)
                        .ok()
                        .map(|ip| std::net::IpAddr::from(ip).to_string()),
                    16 => <[u8; 16]>::try_from(*bytes)
                        .ok()
                        .map(|ip| std::net::IpAddr::from(ip).to_string()),
                    _ => None,
                },
                _ => None,
            })
            .collect(),
    )
}

/// Every certificate of a PEM text, in order.
pub fn certificates_from_pem(
    pem: &str,
    what: &str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    use rustls::pki_types::pem::PemObject;
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| invalid(what, format!("not PEM certificates: {err}")))?;
    if certs.is_empty() {
        return Err(invalid(what, "holds no PEM certificate"));
    }
    Ok(certs)
}

fn private_key_from_pem(pem: &str, what: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    use rustls::pki_types::pem::PemObject;
    PrivateKeyDer::from_pem_slice(pem.as_bytes())
        .map_err(|err| invalid(what, format!("not a PEM private key: {err}")))
}

fn random_serial() -> Result<SerialNumber, TlsError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|err| invalid("a serial number", err))?;
    // Positive, and never with a leading zero byte.
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    Ok(SerialNumber::from_slice(&bytes))
}

fn subject(role: PeerRole, name: &str) -> DistinguishedName {
    let mut subject = DistinguishedName::new();
    subject.push(DnType::CommonName, name);
    subject.push(
        DnType::OrganizationalUnitName,
        match role {
            PeerRole::Manager => MANAGER_UNIT,
            PeerRole::Node => NODE_UNIT,
        },
    );
    subject.push(DnType::OrganizationName, "Cube");
    subject
}

/// The parameters of a leaf certificate for `role`/`name`, valid for `hosts`, for `ttl`.
fn leaf_params(
    role: PeerRole,
    name: &str,
    hosts: &[String],
    ttl: Duration,
) -> Result<CertificateParams, TlsError> {
    let mut params = CertificateParams::default();
    params.subject_alt_names = sans(hosts)?;
    params.distinguished_name = subject(role, name);
    params.serial_number = Some(random_serial()?);
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let now = time::OffsetDateTime::now_utc();
    // A short-lived certificate is back-dated less, so that most of its life is ahead.
    params.not_before = now - CLOCK_SKEW.min(ttl / 10);
    params.not_after = now + ttl;
    Ok(params)
}

/// Host names and addresses as subject alternative names; duplicates dropped.
fn sans(hosts: &[String]) -> Result<Vec<SanType>, TlsError> {
    let mut out = Vec::new();
    for host in hosts {
        let host = host.trim().trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            continue;
        }
        let san = match host.parse::<std::net::IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(
                host.to_string()
                    .try_into()
                    .map_err(|err| invalid(format!("host name {host:?}"), err))?,
            ),
        };
        if !out.contains(&san) {
            out.push(san);
        }
    }
    Ok(out)
}

/// A certificate and its key, in PEM.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate, then the CA's: what a server sends.
    pub chain_pem: String,
    pub key_pem: String,
}

impl Issued {
    /// As rustls holds it.
    pub fn certified_key(&self) -> Result<CertifiedKey, TlsError> {
        let chain = certificates_from_pem(&self.chain_pem, "certificate")?;
        let key = private_key_from_pem(&self.key_pem, "private key")?;
        Ok(CertifiedKey::from_der(chain, key, &provider())?)
    }
}

/// The cluster's CA: signs the manager's certificate and every node's.
pub struct Authority {
    ca_der: CertificateDer<'static>,
    ca_pem: String,
    /// `None` for a CA brought without its key (`--tls-ca` with `--tls-cert`): it verifies
    /// but cannot sign, so nodes cannot join by token.
    issuer: Option<Issuer<'static, KeyPair>>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority")
            .field("fingerprint", &self.fingerprint())
            .finish_non_exhaustive()
    }
}

/// Files in the manager's data directory.
pub const CA_FILE: &str = "tls/ca.pem";
pub const CA_KEY_FILE: &str = "tls/ca-key.pem";

impl Authority {
    /// A new CA.
    pub fn generate() -> Result<Authority, TlsError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, "Cube cluster CA");
        name.push(DnType::OrganizationName, "Cube");
        params.distinguished_name = name;
        params.serial_number = Some(random_serial()?);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - CLOCK_SKEW;
        params.not_after = now + CA_TTL;
        let cert = params.self_signed(&key)?;
        let ca_pem = cert.pem();
        Authority::from_pem(&ca_pem, Some(&key.serialize_pem()))
    }

    /// A CA from its certificate and, to sign, its key (PEM).
    pub fn from_pem(ca_pem: &str, key_pem: Option<&str>) -> Result<Authority, TlsError> {
        let ca_der = certificates_from_pem(ca_pem, "the CA certificate")?
            .into_iter()
            .next()
            .ok_or_else(|| invalid("the CA certificate", "is empty"))?;
        let issuer = match key_pem {
            None => None,
            Some(key_pem) => {
                let key = KeyPair::from_pem(key_pem).map_err(|err| invalid("the CA key", err))?;
                Some(
                    Issuer::from_ca_cert_der(&ca_der, key)
                        .map_err(|err| invalid("the CA certificate", err))?,
                )
            }
        };
        Ok(Authority {
            ca_pem: ca_pem.to_string(),
            ca_der,
            issuer,
        })
    }

    /// A CA brought by the user: its certificate (`--tls-ca`) and, to sign node
    /// certificates, its key (`--tls-ca-key`).
    pub fn from_files(
        cert: &std::path::Path,
        key: Option<&std::path::Path>,
    ) -> Result<Authority, TlsError> {
        let read = |path: &std::path::Path| {
            std::fs::read_to_string(path).map_err(|source| TlsError::File {
                path: path.display().to_string(),
                source,
            })
        };
        let key_pem = key.map(read).transpose()?;
        Authority::from_pem(&read(cert)?, key_pem.as_deref())
    }

    /// The CA in `dir` (`tls/ca.pem`, `tls/ca-key.pem`), made and written there (the key
    /// readable by its owner only) when there is none yet.
    pub fn load_or_create(dir: &std::path::Path) -> Result<Authority, TlsError> {
        let cert_path = dir.join(CA_FILE);
        let key_path = dir.join(CA_KEY_FILE);
        let read = |path: &std::path::Path| {
            std::fs::read_to_string(path).map_err(|source| TlsError::File {
                path: path.display().to_string(),
                source,
            })
        };
        if cert_path.exists() {
            return Authority::from_pem(&read(&cert_path)?, Some(&read(&key_path)?));
        }
        let authority = Authority::generate()?;
        let key_pem = authority
            .issuer
            .as_ref()
            .map(|issuer| issuer.key().serialize_pem())
            .unwrap_or_default();
        write_private(&key_path, &key_pem)?;
        write_private(&cert_path, &authority.ca_pem)?;
        Ok(authority)
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    pub fn ca_der(&self) -> &CertificateDer<'static> {
        &self.ca_der
    }

    pub fn fingerprint(&self) -> String {
        fingerprint(&self.ca_der)
    }

    /// The CA's private key (PEM), when it is known: for the managers on etcd, which keep it
    /// there encrypted so that every one of them signs with the one CA.
    pub fn key_pem(&self) -> Option<String> {
        self.issuer
            .as_ref()
            .map(|issuer| issuer.key().serialize_pem())
    }

    /// Whether this CA can sign (its key is known).
    pub fn can_sign(&self) -> bool {
        self.issuer.is_some()
    }

    fn issuer(&self) -> Result<&Issuer<'static, KeyPair>, TlsError> {
        self.issuer.as_ref().ok_or_else(|| {
            invalid(
                "the CA",
                "its key was not given (--tls-ca-key), so it cannot sign certificates",
            )
        })
    }

    /// A new key and certificate for `role`/`name`, valid for `hosts`, for `ttl`.
    pub fn issue(
        &self,
        role: PeerRole,
        name: &str,
        hosts: &[String],
        ttl: Duration,
    ) -> Result<Issued, TlsError> {
        let key = KeyPair::generate()?;
        let cert = leaf_params(role, name, hosts, ttl)?.signed_by(&key, self.issuer()?)?;
        Ok(Issued {
            chain_pem: format!("{}{}", cert.pem(), self.ca_pem),
            key_pem: key.serialize_pem(),
        })
    }

    /// A node certificate for `name` from a signing request (PEM): the request gives the key
    /// and the host names; the subject is written here, whatever the request asked. The
    /// answer is the certificate followed by the CA's.
    pub fn sign_node_request(
        &self,
        name: &str,
        request_pem: &str,
        ttl: Duration,
    ) -> Result<String, TlsError> {
        let request = CertificateSigningRequestParams::from_pem(request_pem)
            .map_err(|err| invalid("CSR", format!("not a valid signing request: {err}")))?;
        let hosts: Vec<String> = request
            .params
            .subject_alt_names
            .iter()
            .filter_map(|san| match san {
                SanType::DnsName(name) => Some(name.as_str().to_string()),
                SanType::IpAddress(ip) => Some(ip.to_string()),
                _ => None,
            })
            .collect();
        let params = leaf_params(PeerRole::Node, name, &hosts, ttl)?;
        let cert = params.signed_by(&request.public_key, self.issuer()?)?;
        Ok(format!("{}{}", cert.pem(), self.ca_pem))
    }
}

/// Writes `text` to `path` (its folder made), readable and writable by its owner only.
pub fn write_private(path: &std::path::Path, text: &str) -> Result<(), TlsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let file_error = |source| TlsError::File {
        path: path.display().to_string(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(file_error)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(file_error)?;
    file.write_all(text.as_bytes()).map_err(file_error)?;
    file.sync_all().map_err(file_error)
}

/// A key and a signing request for a node's certificate, valid for `hosts`.
pub fn node_request(name: &str, hosts: &[String]) -> Result<(KeyPair, String), TlsError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.subject_alt_names = sans(hosts)?;
    params.distinguished_name = subject(PeerRole::Node, name);
    let request = params.serialize_request(&key)?;
    Ok((key, request.pem()?))
}

/// How often brought certificate files are looked at for a change (their modification
/// times): a certificate replaced on disk is in use within this long.
pub const FILE_CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// A certificate and its key brought by the user (`--tls-cert`, `--tls-key`), checked
/// against the cluster CA (`--tls-ca`) and read again whenever the files change, so that a
/// certificate renewed by the user's own tooling is taken without a restart.
///
/// What Cube asks of such a certificate, as of the ones it makes itself: signed by the CA;
/// usable for both server and client authentication (each side of a manager↔worker
/// connection is both); its subject's organizational unit says the role (`OU=cube-manager`
/// or `OU=cube-node`) and, for a node, its common name is the node's name.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    ca: CertificateDer<'static>,
    role: PeerRole,
    /// A node's certificate: the name it must carry (`None`: whichever it carries).
    name: Option<String>,
}

impl CertFiles {
    pub fn new(
        cert: std::path::PathBuf,
        key: std::path::PathBuf,
        ca: &CertificateDer<'static>,
        role: PeerRole,
        name: Option<&str>,
    ) -> CertFiles {
        CertFiles {
            cert,
            key,
            ca: ca.clone(),
            role,
            name: name.map(str::to_string),
        }
    }

    fn read(path: &std::path::Path) -> Result<String, TlsError> {
        std::fs::read_to_string(path).map_err(|source| TlsError::File {
            path: path.display().to_string(),
            source,
        })
    }

    /// Reads and checks the files: the certificate (its chain ending with the CA, which is
    /// added when the file lacks it) with its key, and who it says it is.
    pub fn load(&self) -> Result<(CertifiedKey, PeerIdentity), TlsError> {
        let what = format!("--tls-cert {}", self.cert.display());
        let mut chain = certificates_from_pem(&Self::read(&self.cert)?, &what)?;
        let key = private_key_from_pem(
            &Self::read(&self.key)?,
            &format!("--tls-key {}", self.key.display()),
        )?;
        let leaf = chain[0].clone();
        let identity = check_brought(&leaf, &chain[1..], &self.ca, self.role)
            .map_err(|reason| invalid(&what, reason))?;
        if let Some(name) = &self.name
            && identity.name != *name
        {
            return Err(invalid(
                &what,
                format!(
                    "it is for node {:?} (its CN), not {name:?}: give --name {:?}, or a \
                     certificate whose CN is {name:?}",
                    identity.name, identity.name
                ),
            ));
        }
        let ca_fingerprint = fingerprint(&self.ca);
        if !chain.iter().any(|cert| fingerprint(cert) == ca_fingerprint) {
            chain.push(self.ca.clone());
        }
        let certified = CertifiedKey::from_der(chain, key, &provider()).map_err(|err| {
            invalid(
                &what,
                format!("does not go with --tls-key {}: {err}", self.key.display()),
            )
        })?;
        Ok((certified, identity))
    }

    /// When the files were last changed.
    fn stamp(&self) -> Option<(SystemTime, SystemTime)> {
        let modified = |path: &std::path::Path| std::fs::metadata(path).ok()?.modified().ok();
        Some((modified(&self.cert)?, modified(&self.key)?))
    }

    /// Puts the files' certificate in `slot` whenever they change, until `shutdown`. A
    /// changed certificate that does not pass [`CertFiles::load`]'s checks is logged and the
    /// one in use stays (a certificate and its key are rarely written at the same instant:
    /// the next look takes the pair once both are there).
    pub async fn watch(self, slot: Arc<CertSlot>, shutdown: tokio_util::sync::CancellationToken) {
        let mut seen = self.stamp();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(FILE_CHECK_INTERVAL) => {}
            }
            let now = self.stamp();
            if now == seen {
                continue;
            }
            match self.load() {
                Ok((key, identity)) => {
                    slot.replace(key);
                    seen = now;
                    tracing::info!(certificate = %self.cert.display(), %identity, "the certificate changed on disk: in use from the next connection");
                }
                Err(err) => {
                    tracing::warn!(error = %err, "the certificate files changed but cannot be used; the one in use stays");
                }
            }
        }
    }
}

/// Checks a brought certificate (DER) against the CA: signed by it (through `intermediates`
/// when there are any), valid now, for both server and client authentication, with a Cube
/// identity of `role`. The reason when it is not.
fn check_brought(
    leaf: &CertificateDer<'static>,
    intermediates: &[CertificateDer<'static>],
    ca: &CertificateDer<'static>,
    role: PeerRole,
) -> Result<PeerIdentity, String> {
    let unit = match role {
        PeerRole::Manager => MANAGER_UNIT,
        PeerRole::Node => NODE_UNIT,
    };
    let identity = identity_of(leaf).ok_or_else(|| {
        format!(
            "its subject has no Cube identity: Cube reads the role from the organizational unit \
             and the name from the common name (e.g. -subj \"/O=Cube/OU={unit}/CN=NAME\")"
        )
    })?;
    if identity.role != role {
        return Err(format!(
            "it is {identity}, where {unit} (OU={unit}) was expected"
        ));
    }
    let (_, cert) =
        x509_parser::parse_x509_certificate(leaf).map_err(|err| format!("unreadable: {err}"))?;
    let usages = cert
        .extended_key_usage()
        .ok()
        .flatten()
        .map(|usage| (usage.value.server_auth, usage.value.client_auth));
    if let Some((server, client)) = usages
        && !(server && client)
    {
        return Err(
            "its extended key usage must allow both serverAuth and clientAuth (each side of a \
             manager-worker connection is both)"
                .to_string(),
        );
    }
    let ca_fingerprint = fingerprint(ca);
    let intermediates: Vec<CertificateDer<'static>> = intermediates
        .iter()
        .filter(|cert| fingerprint(cert) != ca_fingerprint)
        .cloned()
        .collect();
    let mut roots = RootCertStore::empty();
    roots
        .add(ca.clone())
        .map_err(|err| format!("the CA cannot be used: {err}"))?;
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|err| format!("the CA cannot be used: {err}"))?;
    verifier
        .verify_client_cert(leaf, &intermediates, UnixTime::now())
        .map_err(|err| format!("not accepted with the CA of --tls-ca: {err}"))?;
    Ok(identity)
}

/// The certificate a server or a client presents, which a renewal replaces while connections
/// go on: each handshake reads the slot.
#[derive(Debug)]
pub struct CertSlot {
    current: ArcSwap<CertifiedKey>,
}

impl CertSlot {
    pub fn new(key: CertifiedKey) -> Arc<CertSlot> {
        Arc::new(CertSlot {
            current: ArcSwap::from_pointee(key),
        })
    }

    /// Puts `key` in place of the current one: the next handshakes present it.
    pub fn replace(&self, key: CertifiedKey) {
        self.current.store(Arc::new(key));
    }

    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.load_full()
    }

    /// The leaf certificate in the slot now (DER).
    pub fn leaf_der(&self) -> Option<CertificateDer<'static>> {
        self.current.load().cert.first().cloned()
    }

    /// When the certificate in the slot should be renewed: once two thirds of its life have
    /// passed.
    pub fn renew_at(&self) -> Option<SystemTime> {
        let leaf = self.leaf_der()?;
        let (_, not_before, not_after) = serial_and_validity(&leaf)?;
        let life = not_after.duration_since(not_before).ok()?;
        Some(not_before + life * 2 / 3)
    }

    /// How long to wait before renewing: until [`CertSlot::renew_at`], and a second at least,
    /// so that a certificate already due is not renewed in a tight loop.
    pub fn renewal_wait(&self) -> Duration {
        self.renew_at()
            .and_then(|at| at.duration_since(SystemTime::now()).ok())
            .unwrap_or_default()
            .max(Duration::from_secs(1))
    }

    /// Waits until the certificate in the slot is due for renewal: true then, false when
    /// `shutdown` came first.
    pub async fn renewal_due(&self, shutdown: &tokio_util::sync::CancellationToken) -> bool {
        tokio::select! {
            () = shutdown.cancelled() => false,
            () = tokio::time::sleep(self.renewal_wait()) => true,
        }
    }
}

impl rustls::server::ResolvesServerCert for CertSlot {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

impl rustls::client::ResolvesClientCert for CertSlot {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// How a server treats client certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCerts {
    /// Verified against the CA when presented; a client without one goes on (a manager:
    /// users' CLI has only a token).
    Optional,
    /// A client without a certificate the CA signed is refused in the handshake (a worker).
    Required,
}

/// A server's TLS settings: its certificate from `slot`, client certificates checked against
/// `ca`.
pub fn server_config(
    slot: Arc<CertSlot>,
    ca: &CertificateDer<'static>,
    clients: ClientCerts,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = provider();
    let mut roots = RootCertStore::empty();
    roots.add(ca.clone())?;
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
    let builder = match clients {
        ClientCerts::Optional => builder.allow_unauthenticated(),
        ClientCerts::Required => builder,
    };
    let verifier = builder
        .build()
        .map_err(|err| invalid("client certificate verifier", err))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(slot);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A client's TLS settings: servers verified by `verifier`, presenting the certificate in
/// `identity` when there is one.
pub fn client_config(
    verifier: PinnedCaVerifier,
    identity: Option<Arc<CertSlot>>,
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier));
    let mut config = match identity {
        Some(slot) => builder.with_client_cert_resolver(slot),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Verifies a server against the one CA whose SHA-256 is `fingerprint`, which the server
/// sends after its own certificate, and checks the role of its certificate.
#[derive(Debug, Clone)]
pub struct PinnedCaVerifier {
    fingerprint: String,
    expect: Option<PeerRole>,
    provider: Arc<CryptoProvider>,
}

impl PinnedCaVerifier {
    /// `expect`: the role the server's certificate must have (a manager's, for workers and
    /// the CLI; a node's, for the manager calling a worker).
    pub fn new(fingerprint: &str, expect: Option<PeerRole>) -> Result<PinnedCaVerifier, TlsError> {
        let fingerprint = normalize_fingerprint(fingerprint).ok_or_else(|| {
            invalid(
                format!("CA fingerprint {fingerprint:?}"),
                "expected 64 hex digits (a SHA-256)",
            )
        })?;
        Ok(PinnedCaVerifier {
            fingerprint,
            expect,
            provider: provider(),
        })
    }
}

impl ServerCertVerifier for PinnedCaVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(ca) = intermediates
            .iter()
            .find(|cert| fingerprint(cert) == self.fingerprint)
        else {
            return Err(rustls::Error::General(format!(
                "the server's certificate is not from the CA with fingerprint {} (the CA \
                 fingerprint given is not this cluster's, or this is not a Cube manager)",
                self.fingerprint
            )));
        };
        let mut roots = RootCertStore::empty();
        roots.add(ca.clone().into_owned())?;
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            self.provider.clone(),
        )
        .build()
        .map_err(|err| rustls::Error::General(err.to_string()))?;
        verifier.verify_server_cert(end_entity, &[], server_name, ocsp_response, now)?;
        if let Some(expected) = self.expect {
            match identity_of(end_entity) {
                Some(identity) if identity.role == expected => {}
                other => {
                    return Err(rustls::Error::General(format!(
                        "the server's certificate is not a Cube {} certificate (it is {})",
                        match expected {
                            PeerRole::Manager => "manager",
                            PeerRole::Node => "node",
                        },
                        other.map_or_else(|| "no Cube identity".to_string(), |i| i.to_string())
                    )));
                }
            }
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// `POST /nodes/{name}/certificate`'s body.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertificateRequest {
    /// A PEM certificate signing request (its key and host names are used; its subject is
    /// not).
    #[serde(rename = "CSR")]
    pub csr: String,
}

/// `POST /nodes/{name}/certificate`'s answer.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CertificateIssued {
    /// The node's certificate, then the CA's (PEM).
    #[serde(rename = "Certificate")]
    pub certificate: String,
    /// The CA's certificate (PEM).
    #[serde(rename = "CA")]
    pub ca: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_node_certificate_names_its_node_whatever_the_request_asked() {
        let authority = Authority::generate().unwrap();
        let (_, request) = node_request(MANAGER_NAME, &["127.0.0.1".to_string()]).unwrap();
        let chain = authority
            .sign_node_request("w1", &request, Duration::from_secs(60))
            .unwrap();
        let certs = certificates_from_pem(&chain, "chain").unwrap();
        assert_eq!(certs.len(), 2, "the certificate, then the CA");
        assert_eq!(
            identity_of(&certs[0]),
            Some(PeerIdentity {
                role: PeerRole::Node,
                name: "w1".to_string()
            })
        );
        assert_eq!(fingerprint(&certs[1]), authority.fingerprint());
    }

    #[test]
    fn a_certificates_hosts_are_read_back_as_they_were_asked() {
        let authority = Authority::generate().unwrap();
        let hosts = ["127.0.0.1", "::1", "node.example"].map(str::to_string);
        let (_, request) = node_request("w1", &hosts).unwrap();
        let chain = authority
            .sign_node_request("w1", &request, Duration::from_secs(60))
            .unwrap();
        let certs = certificates_from_pem(&chain, "chain").unwrap();
        let mut read = subject_hosts(&certs[0]).unwrap();
        read.sort();
        let mut expected = hosts.to_vec();
        expected.sort();
        assert_eq!(read, expected);
        assert_eq!(
            subject_hosts(&certs[1]),
            Some(Vec::new()),
            "the CA has none"
        );
    }

    #[test]
    fn renewal_is_due_after_two_thirds_of_a_certificates_life() {
        let authority = Authority::generate().unwrap();
        let issued = authority
            .issue(
                PeerRole::Manager,
                MANAGER_NAME,
                &[],
                Duration::from_secs(3000),
            )
            .unwrap();
        let slot = CertSlot::new(issued.certified_key().unwrap());
        let (_, not_before, _) = serial_and_validity(&slot.leaf_der().unwrap()).unwrap();
        let renew_at = slot.renew_at().unwrap();
        let after = renew_at.duration_since(not_before).unwrap().as_secs();
        // 2/3 of (3000 s + the 60 s allowed for clock skew).
        assert_eq!(after, 2040);
    }

    #[test]
    fn fingerprints_are_read_with_or_without_colons() {
        let hex = "AB".repeat(32);
        let colons = vec!["ab"; 32].join(":");
        assert_eq!(normalize_fingerprint(&hex), Some("ab".repeat(32)));
        assert_eq!(normalize_fingerprint(&colons), Some("ab".repeat(32)));
        assert_eq!(normalize_fingerprint("abc"), None);
    }
}
