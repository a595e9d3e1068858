//! hawser's certificates, and the TLS settings a node and a client build from them.
//!
//! One CA per cluster signs two kinds of certificate, told apart by the subject's
//! organizational unit, which only the holder of the CA's key can write:
//!
//! ```text
//!  ca.crt, ca.key             CN=hawser CA             signs the others; keep ca.key off
//!                                                      the nodes (`hawser cert --ca-key`)
//!  node.crt, node.key         OU=node,   CN=<store>    both ends of every peer call;
//!                                                      its SANs are the node's hosts
//!  client.<user>.crt, .key    OU=<role>, CN=<user>     a client: admin, writer or reader
//! ```
//!
//! A certificates directory (`--certs-dir`) holds `ca.crt` and the node's or the
//! client's own pair, as cockroach's `cert` commands lay it out. Every load checks what
//! rustls would only find at a handshake, with an error naming the file: missing,
//! expired or not yet valid, of the wrong kind, or not issued by this `ca.crt`.

use std::fmt;
use std::path::{Path, PathBuf};

/// The rustls the HTTP port's settings are made of ([`http_server_config`]).
pub use rustls;
use std::str::FromStr;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use thiserror::Error;
use time::OffsetDateTime;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};
use x509_parser::prelude::{FromDer, X509Certificate};

mod token;
pub use token::{Claims, Tokens, REVOKED_TOKENS};

/// The CA's certificate, in every certificates directory.
pub const CA_CERT: &str = "ca.crt";
/// The CA's key, by default beside `ca.crt` where `hawser cert create-ca` runs.
pub const CA_KEY: &str = "ca.key";
/// A node's certificate.
pub const NODE_CERT: &str = "node.crt";
/// A node's key.
pub const NODE_KEY: &str = "node.key";
/// The user the CLI connects as when none is named.
pub const DEFAULT_USER: &str = "root";

/// The organizational unit of node certificates.
const NODE_OU: &str = "node";
const ORGANIZATION: &str = "hawser";

/// The file names of `user`'s client certificate and key.
pub fn client_files(user: &str) -> (String, String) {
    (format!("client.{user}.crt"), format!("client.{user}.key"))
}

/// What a client may do (docs/security.md, "Roles").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Reads only.
    Reader,
    /// SQL and typed reads and writes.
    Writer,
    /// Everything, Admin included.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Writer => "writer",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = TlsError;
    fn from_str(s: &str) -> Result<Self, TlsError> {
        match s {
            "reader" => Ok(Role::Reader),
            "writer" => Ok(Role::Writer),
            "admin" => Ok(Role::Admin),
            other => Err(TlsError::Invalid(format!(
                "unknown role {other:?}: admin, writer or reader"
            ))),
        }
    }
}

/// Whom a certificate of the cluster's CA names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// A node, by its store name.
    Node { name: String },
    /// A client user with a role.
    Client { user: String, role: Role },
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subject::Node { name } => write!(f, "node {name}"),
            Subject::Client { user, role } => write!(f, "client {user} ({role})"),
        }
    }
}

/// Why certificates could not be made or used.
#[derive(Debug, Error)]
pub enum TlsError {
    /// A file, named, and what is wrong with it.
    #[error("{}: {reason}", path.display())]
    File { path: PathBuf, reason: String },
    /// A request that cannot be met (an unknown role, a name that is no name).
    #[error("{0}")]
    Invalid(String),
}

fn file_error(path: &Path, reason: impl fmt::Display) -> TlsError {
    TlsError::File {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

fn read(path: &Path, what: &str) -> Result<String, TlsError> {
    std::fs::read_to_string(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => file_error(
            path,
            format!("no {what} here (make one with `hawser cert`, or start with --insecure)"),
        ),
        _ => file_error(path, format!("cannot read the {what}: {e}")),
    })
}

/// Writes `contents` to `path`, readable by its owner only when `secret`; refuses to
/// replace a file unless `overwrite`.
fn write(path: &Path, contents: &str, secret: bool, overwrite: bool) -> Result<(), TlsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).mode(if secret { 0o600 } else { 0o644 });
    if overwrite {
        options.create(true).truncate(true);
    } else {
        options.create_new(true);
    }
    let mut f = options.open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => {
            file_error(path, "already exists (--overwrite replaces it)")
        }
        _ => file_error(path, format!("cannot write: {e}")),
    })?;
    f.write_all(contents.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| file_error(path, format!("cannot write: {e}")))
}

/// The certificates `hawser cert` writes into a certificates directory.
#[derive(Debug, Clone)]
pub struct Issue {
    /// The certificates directory.
    pub certs_dir: PathBuf,
    /// The CA's key (by default `ca.key` in the certificates directory).
    pub ca_key: PathBuf,
    /// How long what is made stays valid.
    pub days: u32,
    /// Replace files that exist.
    pub overwrite: bool,
}

impl Issue {
    fn validity(&self, params: &mut CertificateParams) -> Result<(), TlsError> {
        if self.days == 0 {
            return Err(TlsError::Invalid("a lifetime of 0 days".into()));
        }
        let now = OffsetDateTime::now_utc();
        // An hour back: a peer whose clock is a little behind accepts it at once.
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(i64::from(self.days));
        Ok(())
    }

    fn make_dir(&self) -> Result<(), TlsError> {
        std::fs::create_dir_all(&self.certs_dir)
            .map_err(|e| file_error(&self.certs_dir, format!("cannot create: {e}")))
    }

    /// Makes the cluster's CA: `ca.crt` in the certificates directory, its key at
    /// `ca_key`. Returns the files written.
    pub fn create_ca(&self) -> Result<Vec<PathBuf>, TlsError> {
        self.make_dir()?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::OrganizationName, ORGANIZATION);
        params
            .distinguished_name
            .push(DnType::CommonName, "hawser CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        self.validity(&mut params)?;
        let key = KeyPair::generate().map_err(|e| TlsError::Invalid(e.to_string()))?;
        let cert = params
            .self_signed(&key)
            .map_err(|e| TlsError::Invalid(format!("cannot sign the CA: {e}")))?;
        let cert_path = self.certs_dir.join(CA_CERT);
        // The key first: a CA certificate without its key could sign nothing.
        write(&self.ca_key, &key.serialize_pem(), true, self.overwrite)?;
        write(&cert_path, &cert.pem(), false, self.overwrite)?;
        Ok(vec![cert_path, self.ca_key.clone()])
    }

    /// Makes `node.crt` and `node.key` for the node whose store is `name`, valid for
    /// `hosts` (names and addresses its peers and clients reach it by).
    pub fn create_node(&self, name: &str, hosts: &[String]) -> Result<Vec<PathBuf>, TlsError> {
        check_name(name, "node name")?;
        if hosts.is_empty() {
            return Err(TlsError::Invalid(
                "a node certificate needs at least one host: the names and addresses peers \
                 and clients reach the node by (localhost 127.0.0.1 for one machine)"
                    .into(),
            ));
        }
        let mut params = CertificateParams::new(hosts.to_vec())
            .map_err(|e| TlsError::Invalid(format!("hosts {hosts:?}: {e}")))?;
        params
            .distinguished_name
            .push(DnType::OrganizationName, ORGANIZATION);
        params
            .distinguished_name
            .push(DnType::OrganizationalUnitName, NODE_OU);
        params.distinguished_name.push(DnType::CommonName, name);
        // Both ends of a peer call: a node serves, and calls its peers.
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        self.sign(params, NODE_CERT, NODE_KEY)
    }

    /// Makes `client.<user>.crt` and `client.<user>.key`, for `user` with `role`.
    pub fn create_client(&self, user: &str, role: Role) -> Result<Vec<PathBuf>, TlsError> {
        check_name(user, "user name")?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::OrganizationName, ORGANIZATION);
        params
            .distinguished_name
            .push(DnType::OrganizationalUnitName, role.as_str());
        params.distinguished_name.push(DnType::CommonName, user);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let (cert, key) = client_files(user);
        self.sign(params, &cert, &key)
    }

    fn sign(
        &self,
        mut params: CertificateParams,
        cert_name: &str,
        key_name: &str,
    ) -> Result<Vec<PathBuf>, TlsError> {
        self.make_dir()?;
        self.validity(&mut params)?;
        let ca_path = self.certs_dir.join(CA_CERT);
        let ca_pem = read(&ca_path, "CA certificate")?;
        let ca_key = KeyPair::from_pem(&read(&self.ca_key, "CA key")?)
            .map_err(|e| file_error(&self.ca_key, format!("not a private key: {e}")))?;
        let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key)
            .map_err(|e| file_error(&ca_path, format!("not a CA certificate: {e}")))?;
        let key = KeyPair::generate().map_err(|e| TlsError::Invalid(e.to_string()))?;
        let cert = params
            .signed_by(&key, &issuer)
            .map_err(|e| TlsError::Invalid(format!("cannot sign: {e}")))?;
        let cert_path = self.certs_dir.join(cert_name);
        let key_path = self.certs_dir.join(key_name);
        write(&key_path, &key.serialize_pem(), true, self.overwrite)?;
        write(&cert_path, &cert.pem(), false, self.overwrite)?;
        Ok(vec![cert_path, key_path])
    }
}

impl Issue {
    /// Makes a token for `user` with `role`, valid for `days` (docs/security.md,
    /// "Tokens"): signed with the CA key, written nowhere. Returns it and its claims.
    pub fn create_token(&self, user: &str, role: Role) -> Result<(String, Claims), TlsError> {
        if self.days == 0 {
            return Err(TlsError::Invalid("a lifetime of 0 days".into()));
        }
        let key = read(&self.ca_key, "CA key")?;
        token::sign(
            &key,
            &self.ca_key,
            user,
            role,
            std::time::Duration::from_secs(u64::from(self.days) * 86_400),
        )
    }
}

fn check_name(name: &str, what: &str) -> Result<(), TlsError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(TlsError::Invalid(format!(
            "{what} {name:?}: 1 to 64 letters, digits, '_', '-' or '.'"
        )))
    }
}

/// Whom the DER certificate `der` names (the first of a peer's chain). A certificate
/// this CA did not issue never gets here: the handshake refused it.
pub fn subject(der: &[u8]) -> Result<Subject, TlsError> {
    let (_, cert) = X509Certificate::from_der(der)
        .map_err(|e| TlsError::Invalid(format!("not an X.509 certificate: {e}")))?;
    subject_of(&cert)
}

fn subject_of(cert: &X509Certificate<'_>) -> Result<Subject, TlsError> {
    let name = cert.subject();
    let first = |it: &mut dyn Iterator<Item = &x509_parser::x509::AttributeTypeAndValue<'_>>| {
        it.next().and_then(|a| a.as_str().ok()).map(str::to_string)
    };
    let cn = first(&mut name.iter_common_name());
    let ou = first(&mut name.iter_organizational_unit());
    match (ou.as_deref(), cn) {
        (Some(NODE_OU), Some(name)) => Ok(Subject::Node { name }),
        (Some(role), Some(user)) => Ok(Subject::Client {
            user,
            role: role.parse()?,
        }),
        _ => Err(TlsError::Invalid(format!(
            "certificate subject {name} is not one `hawser cert` makes (OU=node or a role, and CN)"
        ))),
    }
}

/// A PEM certificate file, checked: parsed, valid now, issued by `ca` (by name).
fn check_cert(path: &Path, pem: &str, ca: Option<&str>) -> Result<Subject, TlsError> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes())
        .map_err(|e| file_error(path, format!("not a PEM certificate: {e}")))?;
    let cert = block
        .parse_x509()
        .map_err(|e| file_error(path, format!("not an X.509 certificate: {e}")))?;
    let validity = cert.validity();
    let now = x509_parser::time::ASN1Time::now();
    if now < validity.not_before {
        return Err(file_error(
            path,
            format!(
                "not valid before {} (is this machine's clock right?)",
                validity.not_before
            ),
        ));
    }
    if now > validity.not_after {
        return Err(file_error(
            path,
            format!(
                "expired on {}; make a new one with `hawser cert` (--overwrite)",
                validity.not_after
            ),
        ));
    }
    if let Some(ca_pem) = ca {
        let (_, ca_block) = x509_parser::pem::parse_x509_pem(ca_pem.as_bytes())
            .map_err(|e| TlsError::Invalid(format!("{CA_CERT}: not a PEM certificate: {e}")))?;
        let ca_cert = ca_block
            .parse_x509()
            .map_err(|e| TlsError::Invalid(format!("{CA_CERT}: not X.509: {e}")))?;
        if cert.issuer() != ca_cert.subject()
            || cert.verify_signature(Some(ca_cert.public_key())).is_err()
        {
            return Err(file_error(
                path,
                format!(
                    "not issued by this directory's {CA_CERT} ({}): it comes from another CA",
                    ca_cert.subject()
                ),
            ));
        }
    }
    subject_of(&cert).map_err(|e| file_error(path, e))
}

/// The certificates of PEM file `path` (a `what`), for rustls.
fn pem_certs(
    path: &Path,
    what: &str,
) -> Result<Vec<rustls_pki_types::CertificateDer<'static>>, TlsError> {
    use rustls_pki_types::pem::PemObject;
    let pem = read(path, what)?;
    rustls_pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, format!("not a PEM certificate: {e}")))
}

/// The private key of PEM file `path` (a `what`), for rustls.
fn pem_key(path: &Path, what: &str) -> Result<rustls_pki_types::PrivateKeyDer<'static>, TlsError> {
    use rustls_pki_types::pem::PemObject;
    rustls_pki_types::PrivateKeyDer::from_pem_slice(read(path, what)?.as_bytes())
        .map_err(|e| file_error(path, format!("not a private key: {e}")))
}

/// The cluster's CA in `certs_dir`, as rustls's trust roots.
fn ca_roots(certs_dir: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let ca_path = certs_dir.join(CA_CERT);
    let mut roots = rustls::RootCertStore::empty();
    for ca in pem_certs(&ca_path, "CA certificate")? {
        roots
            .add(ca)
            .map_err(|e| file_error(&ca_path, format!("not a CA certificate: {e}")))?;
    }
    Ok(roots)
}

/// The crypto of the HTTP port's TLS, both ends: ring, as tonic's `tls-ring` uses for
/// the gRPC port. rustls now prefers aws-lc-rs for its post-quantum key exchange, which
/// both ports would move to together.
fn provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    #[allow(deprecated)]
    std::sync::Arc::new(rustls::crypto::ring::default_provider())
}

/// What a node serves and calls its peers with.
#[derive(Debug, Clone)]
pub struct NodeTls {
    /// The gRPC server's: its certificate, and every caller must show one of the CA's.
    pub server: ServerTlsConfig,
    /// Its calls to peers: the CA to check them by, its certificate to show.
    pub peer: ClientTlsConfig,
    /// The store name its certificate names.
    pub name: String,
}

/// Loads a node's certificates from `certs_dir`: `ca.crt`, `node.crt`, `node.key`.
pub fn load_node(certs_dir: &Path) -> Result<NodeTls, TlsError> {
    let ca = read(&certs_dir.join(CA_CERT), "CA certificate")?;
    let cert_path = certs_dir.join(NODE_CERT);
    let cert = read(&cert_path, "node certificate")?;
    let key = read(&certs_dir.join(NODE_KEY), "node key")?;
    let name = match check_cert(&cert_path, &cert, Some(&ca))? {
        Subject::Node { name } => name,
        other => {
            return Err(file_error(
                &cert_path,
                format!("names {other}, not a node (make one with `hawser cert create-node`)"),
            ))
        }
    };
    let identity = Identity::from_pem(&cert, &key);
    Ok(NodeTls {
        // A certificate shown is checked against the CA at the handshake; none is
        // allowed there because a token caller has none. Each service then demands
        // what it needs: peer services a node's certificate, client services a
        // certificate or a token (`crates/node/src/roles.rs`).
        server: ServerTlsConfig::new()
            .identity(identity.clone())
            .client_ca_root(Certificate::from_pem(&ca))
            .client_auth_optional(true),
        peer: ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&ca))
            .identity(identity),
        name,
    })
}

/// Loads what a client connects with from `certs_dir`: `ca.crt` and `user`'s pair.
pub fn load_client(certs_dir: &Path, user: &str) -> Result<ClientTlsConfig, TlsError> {
    let ca = read(&certs_dir.join(CA_CERT), "CA certificate")?;
    let (cert_name, key_name) = client_files(user);
    let cert_path = certs_dir.join(&cert_name);
    let cert = read(&cert_path, &format!("client certificate of {user}"))?;
    let key = read(&certs_dir.join(key_name), &format!("client key of {user}"))?;
    check_cert(&cert_path, &cert, Some(&ca))?;
    Ok(ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&ca))
        .identity(Identity::from_pem(&cert, &key)))
}

/// What a client holding a token connects with: `certs_dir`'s `ca.crt` to check the
/// node by, and no certificate of its own.
pub fn load_token_client(certs_dir: &Path) -> Result<ClientTlsConfig, TlsError> {
    let ca = read(&certs_dir.join(CA_CERT), "CA certificate")?;
    Ok(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&ca)))
}

/// The HTTP port's TLS settings for a node (`crates/node/src/http.rs`): its certificate,
/// and callers' certificates of the cluster's CA checked where given but not required,
/// so that probes reach `/healthz` and `/readyz` without one.
pub fn http_server_config(
    certs_dir: &Path,
) -> Result<std::sync::Arc<rustls::ServerConfig>, TlsError> {
    let cert_path = certs_dir.join(NODE_CERT);
    let chain = pem_certs(&cert_path, "node certificate")?;
    let key = pem_key(&certs_dir.join(NODE_KEY), "node key")?;
    let provider = provider();
    let roots = ca_roots(certs_dir)?;
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        std::sync::Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| TlsError::Invalid(format!("client certificate checks: {e}")))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Invalid(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| file_error(&cert_path, format!("does not go with {NODE_KEY}: {e}")))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(std::sync::Arc::new(config))
}

/// A rustls client configuration for HTTPS to a secure node's HTTP port: the cluster's
/// CA, and `user`'s client certificate (none: only the probes answer).
pub fn http_client_config(
    certs_dir: &Path,
    user: Option<&str>,
) -> Result<std::sync::Arc<rustls::ClientConfig>, TlsError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Invalid(e.to_string()))?
        .with_root_certificates(ca_roots(certs_dir)?);
    let Some(user) = user else {
        return Ok(std::sync::Arc::new(builder.with_no_client_auth()));
    };
    let (cert_name, key_name) = client_files(user);
    let cert_path = certs_dir.join(cert_name);
    let chain = pem_certs(&cert_path, &format!("client certificate of {user}"))?;
    let key = pem_key(&certs_dir.join(key_name), &format!("client key of {user}"))?;
    let config = builder
        .with_client_auth_cert(chain, key)
        .map_err(|e| file_error(&cert_path, format!("does not go with its key: {e}")))?;
    Ok(std::sync::Arc::new(config))
}

/// An endpoint for `addr` (`host:port`, or a URI): `https` with `tls` where given (the
/// peer's certificate must name the host), `http` otherwise.
pub fn endpoint(
    addr: &str,
    tls: Option<&ClientTlsConfig>,
) -> Result<tonic::transport::Endpoint, tonic::transport::Error> {
    let host_port = addr
        .strip_prefix("http://")
        .or_else(|| addr.strip_prefix("https://"))
        .unwrap_or(addr);
    match tls {
        Some(tls) => tonic::transport::Endpoint::from_shared(format!("https://{host_port}"))?
            .tls_config(tls.clone()),
        None => tonic::transport::Endpoint::from_shared(format!("http://{host_port}")),
    }
}

/// The subject of the certificate a caller showed (the first of its chain), `None`
/// when it showed none (a server without TLS).
pub fn caller<T>(request: &tonic::Request<T>) -> Option<Result<Subject, TlsError>> {
    let certs = request.peer_certs()?;
    Some(match certs.first() {
        Some(der) => subject(der),
        None => Err(TlsError::Invalid("the caller showed no certificate".into())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issue(dir: &Path) -> Issue {
        Issue {
            certs_dir: dir.to_path_buf(),
            ca_key: dir.join(CA_KEY),
            days: 10,
            overwrite: false,
        }
    }

    #[test]
    fn made_certificates_load_and_name_their_subjects() {
        let dir = tempfile::tempdir().unwrap();
        let i = issue(dir.path());
        i.create_ca().unwrap();
        i.create_node("ds1", &["localhost".into(), "127.0.0.1".into()])
            .unwrap();
        i.create_client("ann", Role::Writer).unwrap();
        assert_eq!(load_node(dir.path()).unwrap().name, "ds1");
        load_client(dir.path(), "ann").unwrap();
        let pem = std::fs::read_to_string(dir.path().join("client.ann.crt")).unwrap();
        let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        assert_eq!(
            subject(&block.contents).unwrap(),
            Subject::Client {
                user: "ann".into(),
                role: Role::Writer
            }
        );
        // Keys are the owner's only.
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(NODE_KEY))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn missing_foreign_and_misplaced_certificates_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let e = load_node(dir.path()).unwrap_err().to_string();
        assert!(e.contains("ca.crt") && e.contains("--insecure"), "{e}");
        let i = issue(dir.path());
        i.create_ca().unwrap();
        let e = i.create_ca().unwrap_err().to_string();
        assert!(e.contains("already exists"), "{e}");
        let e = load_node(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("node.crt") && e.contains("no node certificate"),
            "{e}"
        );
        // A client's pair where a node's belongs.
        i.create_client("root", Role::Admin).unwrap();
        std::fs::copy(
            dir.path().join("client.root.crt"),
            dir.path().join(NODE_CERT),
        )
        .unwrap();
        std::fs::copy(
            dir.path().join("client.root.key"),
            dir.path().join(NODE_KEY),
        )
        .unwrap();
        let e = load_node(dir.path()).unwrap_err().to_string();
        assert!(e.contains("client root (admin), not a node"), "{e}");
        // A node certificate of another cluster's CA.
        let other = tempfile::tempdir().unwrap();
        let o = issue(other.path());
        o.create_ca().unwrap();
        o.create_node("ds1", &["localhost".into()]).unwrap();
        for f in [NODE_CERT, NODE_KEY] {
            std::fs::copy(other.path().join(f), dir.path().join(f)).unwrap();
        }
        let e = load_node(dir.path()).unwrap_err().to_string();
        assert!(e.contains("comes from another CA"), "{e}");
        assert!(i.create_node("ds 1", &["h".into()]).is_err());
        assert!(i.create_node("ds1", &[]).is_err());
        assert!("owner".parse::<Role>().is_err());
    }
}
