//! Who may call what on `hawser.v1.Client` and `hawser.v1.Admin` when the node runs
//! secure: the role in the caller's certificate (docs/security.md, "Roles").
//!
//! ```text
//!  call ─► Authorized: the certificate's (or token's) role ≥ what the method needs?
//!              │ no ─► PERMISSION_DENIED, 42501, naming the caller, its role and the need
//!              └ yes ─► the service, with the Caller in the request's extensions
//!                       (Execute / Session make a reader's session read-only)
//! ```
//!
//! A caller without a certificate may show a token instead (`hawser cert create-token`):
//! the same user and role, signed by the same CA.
//!
//! A node's certificate counts as admin: nodes call each other's Admin (a drill's
//! faults, a switchover asked of the leader). Insecure, every caller may do anything.

use std::sync::Arc;
use std::task::{Context, Poll};

use hawser_tls::{Role, Subject, Tokens};
use tonic::codegen::{http, BoxFuture, Service};
use tonic::server::NamedService;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use crate::codes::SQLSTATE_KEY;

/// Who made a call, as its certificate says; in the extensions of every request a secure
/// node's Client and Admin handlers get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Caller {
    /// "client ann", or "node ds1".
    pub(crate) name: String,
    pub(crate) role: Role,
}

impl Caller {
    /// Why a session of this caller may only read, if it may.
    pub(crate) fn read_only(&self) -> Option<String> {
        (self.role == Role::Reader).then(|| format!("{} has role reader (reads only)", self.name))
    }
}

/// The least role the method at `path` (`/package.Service/Method`) needs. What is not
/// listed needs admin: a new method is closed until someone opens it here.
pub(crate) fn needs(path: &str) -> Role {
    let (service, method) = path
        .trim_start_matches('/')
        .split_once('/')
        .unwrap_or(("", ""));
    match (service, method) {
        ("hawser.v1.Client", "Write" | "WriteStream") => Role::Writer,
        // SQL: a reader's session refuses every write itself (Session::set_read_only).
        ("hawser.v1.Client", "Execute" | "Session" | "Get" | "Scan" | "Describe") => Role::Reader,
        ("hawser.v1.Admin", "Status" | "ShowSchemes") => Role::Reader,
        _ => Role::Admin,
    }
}

/// The caller a certificate chain names (the first certificate; the handshake checked
/// it against the cluster's CA).
fn caller_of(
    certs: Option<&[tonic::transport::CertificateDer<'static>]>,
) -> Result<Caller, String> {
    let der = certs
        .and_then(|c| c.first())
        .ok_or("the caller showed no certificate")?;
    match hawser_tls::subject(der).map_err(|e| e.to_string())? {
        Subject::Node { name } => Ok(Caller {
            name: format!("node {name}"),
            role: Role::Admin,
        }),
        Subject::Client { user, role } => Ok(Caller {
            name: format!("client {user}"),
            role,
        }),
    }
}

/// The caller a bearer token names (`authorization: Bearer hawser1.…`), for a caller
/// that showed no certificate.
fn token_caller(
    authorization: Option<&http::HeaderValue>,
    tokens: &Tokens,
) -> Result<Caller, String> {
    let value = authorization
        .ok_or("the caller showed no certificate and no token (hawser --certs-dir, or --token)")?;
    let token = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or("the authorization header is not `Bearer <token>`")?;
    let claims = tokens.check(token.trim()).map_err(|e| e.to_string())?;
    Ok(Caller {
        name: format!("client {} (token {})", claims.user, claims.id),
        role: claims.role,
    })
}

/// A public service that checks each call's role against [`needs`].
#[derive(Clone)]
pub(crate) struct Authorized<S> {
    inner: S,
    /// `None`: the node runs insecure, and every caller may do anything. Otherwise
    /// what checks the tokens of callers without a certificate.
    secure: Option<Arc<Tokens>>,
}

impl<S> Authorized<S> {
    pub(crate) fn new(inner: S, secure: Option<Arc<Tokens>>) -> Self {
        Authorized { inner, secure }
    }
}

impl<S: NamedService> NamedService for Authorized<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, R> Service<http::Request<B>> for Authorized<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        if let Some(tokens) = &self.secure {
            let certs = request
                .extensions()
                .get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(|i| i.peer_certs())
                .filter(|c| !c.is_empty());
            let need = needs(request.uri().path());
            let caller = match certs {
                Some(certs) => caller_of(Some(certs.as_slice())),
                None => token_caller(request.headers().get(http::header::AUTHORIZATION), tokens),
            };
            let refusal = match caller {
                Ok(c) if c.role >= need => {
                    request.extensions_mut().insert(c);
                    None
                }
                Ok(c) => Some(denied(
                    tonic::Code::PermissionDenied,
                    "42501",
                    format!(
                        "{} has role {}; {} needs {need}",
                        c.name,
                        c.role,
                        request.uri().path()
                    ),
                )),
                Err(why) => Some(denied(tonic::Code::Unauthenticated, "28000", why)),
            };
            if let Some(r) = refusal {
                return Box::pin(async move { Ok(r) });
            }
        }
        let response = self.inner.call(request);
        Box::pin(response)
    }
}

fn denied<R: Default>(code: tonic::Code, sqlstate: &'static str, why: String) -> http::Response<R> {
    let mut status = tonic::Status::new(code, why);
    status.metadata_mut().insert(
        SQLSTATE_KEY,
        tonic::metadata::MetadataValue::from_static(sqlstate),
    );
    status.into_http()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_method_needs_the_least_role_that_may_call_it_and_new_ones_need_admin() {
        for (path, role) in [
            ("/hawser.v1.Client/Execute", Role::Reader),
            ("/hawser.v1.Client/Session", Role::Reader),
            ("/hawser.v1.Client/Get", Role::Reader),
            ("/hawser.v1.Client/Scan", Role::Reader),
            ("/hawser.v1.Client/Describe", Role::Reader),
            ("/hawser.v1.Client/Write", Role::Writer),
            ("/hawser.v1.Client/WriteStream", Role::Writer),
            ("/hawser.v1.Admin/Status", Role::Reader),
            ("/hawser.v1.Admin/ShowSchemes", Role::Reader),
            ("/hawser.v1.Admin/Switchover", Role::Admin),
            ("/hawser.v1.Admin/Fault", Role::Admin),
            ("/hawser.v1.Admin/RemoveNode", Role::Admin),
            ("/hawser.v1.Client/SomethingNew", Role::Admin),
            ("/nonsense", Role::Admin),
            ("", Role::Admin),
        ] {
            assert_eq!(needs(path), role, "{path}");
        }
        assert!(Role::Reader < Role::Writer && Role::Writer < Role::Admin);
    }

    #[test]
    fn a_call_without_a_certificate_names_no_caller() {
        assert!(caller_of(None).is_err());
        assert!(caller_of(Some(&[])).is_err());
    }

    #[test]
    fn a_bearer_token_names_its_caller_and_anything_else_is_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let issue = hawser_tls::Issue {
            certs_dir: dir.path().to_path_buf(),
            ca_key: dir.path().join(hawser_tls::CA_KEY),
            days: 1,
            overwrite: false,
        };
        issue.create_ca().unwrap();
        let (token, claims) = issue.create_token("ann", Role::Writer).unwrap();
        let tokens = Tokens::load(dir.path()).unwrap();
        let header = |v: &str| http::HeaderValue::from_str(v).unwrap();
        let caller = token_caller(Some(&header(&format!("Bearer {token}"))), &tokens).unwrap();
        assert_eq!(caller.role, Role::Writer);
        assert_eq!(caller.name, format!("client ann (token {})", claims.id));
        let why = token_caller(None, &tokens).unwrap_err();
        assert!(why.contains("no certificate and no token"), "{why}");
        let why = token_caller(Some(&header(&token)), &tokens).unwrap_err();
        assert!(why.contains("Bearer"), "{why}");
        let why = token_caller(Some(&header("Bearer hawser1.x.y")), &tokens).unwrap_err();
        assert!(why.contains("not a hawser token"), "{why}");
    }
}
