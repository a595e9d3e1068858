//! A cluster with certificates: rows replicate over mutual TLS, and whoever lacks a
//! certificate of the cluster's CA — or holds a client's where a node's is needed — is
//! turned away.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use hawser_tls::{Issue, Role};

const WAIT: Duration = Duration::from_secs(20);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn issue(dir: &Path) -> Issue {
    Issue {
        certs_dir: dir.to_path_buf(),
        ca_key: dir.join(hawser_tls::CA_KEY),
        days: 1,
        overwrite: false,
    }
}

/// A CA, a node certificate for loopback and client root's, in `dir`.
fn make_certs(dir: &Path) {
    let i = issue(dir);
    i.create_ca().unwrap();
    i.create_node("nodes", &["localhost".into(), "127.0.0.1".into()])
        .unwrap();
    i.create_client("root", Role::Admin).unwrap();
    i.create_client("ann", Role::Writer).unwrap();
    i.create_client("rex", Role::Reader).unwrap();
}

/// The HTTP status of `GET path` on `addr` over TLS with `config`.
async fn https_status(
    addr: &str,
    path: &str,
    config: std::sync::Arc<hawser_tls::rustls::ClientConfig>,
) -> String {
    https_status_with(addr, path, config, "").await
}

/// [`https_status`] with extra header lines (each ending in CRLF).
async fn https_status_with(
    addr: &str,
    path: &str,
    config: std::sync::Arc<hawser_tls::rustls::ClientConfig>,
    headers: &str,
) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = hawser_tls::rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .unwrap();
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n{headers}\r\n");
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    let _ = tls.read_to_end(&mut response).await;
    let response = String::from_utf8_lossy(&response);
    response.split_whitespace().nth(1).unwrap_or("").to_string()
}

/// A call of `path` with no request body worth decoding, over `channel`.
async fn raw_call(
    channel: tonic::transport::Channel,
    path: &'static str,
) -> Result<tonic::Response<Vec<u8>>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    grpc.unary(
        tonic::Request::new(Vec::new()),
        tonic::codegen::http::uri::PathAndQuery::from_static(path),
        common::Raw,
    )
    .await
}

#[test]
fn a_secure_cluster_replicates_and_refuses_callers_without_the_right_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    make_certs(&certs);
    let certs_arg = certs.to_str().unwrap();
    let n1 = Node::start_with("n1", &dir.path().join("n1"), &["--certs-dir", certs_arg]);
    let out = n1.cli(&["init"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let n2 = Node::start_with(
        "n2",
        &dir.path().join("n2"),
        &["--certs-dir", certs_arg, "--join", &n1.grpc],
    );
    // Joined through TLS, Raft and reports through TLS.
    wait_for("n2 to be a member that reports", WAIT, || {
        let s = n1.try_status()?;
        let nodes = s["cluster"]["nodes"].as_array()?.clone();
        (nodes.len() == 2 && nodes.iter().all(|n| n["health"] == "ok")).then_some(())
    });
    for n in [&n1, &n2] {
        let out = n.cli(&[
            "sql",
            "-e",
            "create table t (k int primary key, v varchar(10))",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let out = n1.cli(&[
        "sql",
        "-e",
        "create replication r element e table t master n1 subscriber n2",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = n1.cli(&["sql", "-e", "insert into t values (1, 'sealed')"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // The stream runs over TLS too.
    wait_for("the row on n2", WAIT, || {
        let out = n2.cli(&["sql", "-e", "select v from t where k = 1"]);
        stdout(&out).contains("sealed").then_some(())
    });

    // Each role does what it may and no more.
    let as_user = |user: &str, args: &[&str]| {
        let mut all = vec!["--user", user];
        all.extend_from_slice(args);
        n1.cli(&all)
    };
    let denied = |out: &std::process::Output, code: &str| {
        assert!(!out.status.success(), "{}", stdout(out));
        assert!(stderr(out).contains(code), "{}", stderr(out));
    };
    for user in ["root", "ann", "rex"] {
        let out = as_user(user, &["sql", "-e", "select count(*) from t"]);
        assert!(out.status.success(), "{user}: {}", stderr(&out));
        let out = as_user(user, &["status"]);
        assert!(out.status.success(), "{user}: {}", stderr(&out));
    }
    let out = as_user("ann", &["sql", "-e", "insert into t values (2, 'ann')"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = as_user("rex", &["sql", "-e", "insert into t values (3, 'rex')"]);
    denied(&out, "error[25006]");
    assert!(
        stderr(&out).contains("client rex has role reader"),
        "{}",
        stderr(&out)
    );
    for user in ["ann", "rex"] {
        let out = as_user(user, &["failover", "pause", "--reason", "not mine"]);
        denied(&out, "error[42501]");
        assert!(stderr(&out).contains("needs admin"), "{}", stderr(&out));
    }
    let out = as_user("root", &["failover", "pause", "--reason", "drill"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = as_user("root", &["failover", "resume"]);
    assert!(out.status.success(), "{}", stderr(&out));

    // A client without certificates: the node drops the plain connection.
    let out = std::process::Command::new(hawser_bin())
        .args(["status", "--host", &n1.grpc])
        .env_remove("HAWSER_CERTS_DIR")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--certs-dir"), "{}", stderr(&out));

    // A client certificate of another CA: refused at the handshake.
    let other = dir.path().join("other");
    make_certs(&other);
    let out = std::process::Command::new(hawser_bin())
        .args(["status", "--host", &n1.grpc, "--certs-dir"])
        .arg(&other)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", stdout(&out));

    runtime().block_on(async {
        let connect = |tls: tonic::transport::ClientTlsConfig| {
            let addr = n1.grpc.clone();
            async move {
                hawser_tls::endpoint(&addr, Some(&tls))
                    .unwrap()
                    .connect_timeout(Duration::from_secs(5))
                    .connect()
                    .await
            }
        };
        // A client of this CA may call the client services, not the peer ones: a
        // client's certificate is no node's.
        let client = hawser_tls::load_client(&certs, "root").unwrap();
        let channel = connect(client).await.unwrap();
        for path in [
            "/hawser.raft.v1.RaftPeer/Vote",
            "/hawser.raft.v1.RaftPeer/RemoveNode",
            "/hawser.replication.v1.Replication/Replicate",
        ] {
            let status = raw_call(channel.clone(), path).await.unwrap_err();
            assert_eq!(
                status.code(),
                tonic::Code::PermissionDenied,
                "{path}: {status:?}"
            );
            assert!(
                status.message().contains("client root (admin)"),
                "{status:?}"
            );
        }
        // A node's certificate passes the gate (the empty request then fails to mean
        // anything, which is another matter).
        let node = hawser_tls::load_node(&certs).unwrap();
        let channel = connect(node.peer).await.unwrap();
        let status = raw_call(channel, "/hawser.raft.v1.RaftPeer/Vote")
            .await
            .unwrap_err();
        assert_ne!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
        assert_ne!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
        // The HTTP port is TLS too: the probes answer anyone, the rest a certificate.
        let anonymous = hawser_tls::http_client_config(&certs, None).unwrap();
        let reader = hawser_tls::http_client_config(&certs, Some("rex")).unwrap();
        assert_eq!(
            https_status(&n1.http, "/healthz", anonymous.clone()).await,
            "200"
        );
        assert_eq!(
            https_status(&n1.http, "/readyz", anonymous.clone()).await,
            "200"
        );
        assert_eq!(https_status(&n1.http, "/status", anonymous).await, "401");
        assert_eq!(
            https_status(&n1.http, "/status", reader.clone()).await,
            "200"
        );
        assert_eq!(https_status(&n1.http, "/metrics", reader).await, "200");
        // Another CA's client: no connection at all.
        let foreign = hawser_tls::load_client(&other, "root").unwrap();
        let refused = match connect(foreign).await {
            Err(_) => true,
            Ok(ch) => raw_call(ch, "/hawser.v1.Admin/Status").await.is_err(),
        };
        assert!(refused, "a certificate of another CA was let in");
    });
}

#[test]
fn a_node_without_certificates_refuses_to_start_unless_told_insecure() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(hawser_bin())
        .args(["start", "--name", "bare", "--data"])
        .arg(dir.path().join("bare"))
        .env_remove("HAWSER_INSECURE")
        .env_remove("HAWSER_CERTS_DIR")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("--certs-dir") && err.contains("--insecure"),
        "{err}"
    );
    // Certificates that are not there are named.
    let out = std::process::Command::new(hawser_bin())
        .args(["start", "--name", "bare", "--data"])
        .arg(dir.path().join("bare"))
        .arg("--certs-dir")
        .arg(dir.path().join("nothing"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("ca.crt") && err.contains("hawser cert"),
        "{err}"
    );
}

/// `hawser` as a program holding only `ca.crt` and `token`.
fn with_token(node: &Node, ca_only: &Path, token: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(hawser_bin())
        .args(args)
        .env("HAWSER_HOST", &node.grpc)
        .env("HAWSER_CERTS_DIR", ca_only)
        .env("HAWSER_TOKEN", token)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn tokens_let_a_program_without_a_certificate_in_with_its_role_until_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    make_certs(&certs);
    let token = |user: &str, role: &str| {
        let out = std::process::Command::new(hawser_bin())
            .args([
                "cert",
                "create-token",
                user,
                "--role",
                role,
                "--json",
                "--certs-dir",
            ])
            .arg(&certs)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["user"], user);
        assert_eq!(v["role"], role);
        (
            v["token"].as_str().unwrap().to_string(),
            v["id"].as_str().unwrap().to_string(),
        )
    };
    let (writer, writer_id) = token("etl", "writer");
    let (reader, _) = token("dash", "reader");
    // The program's directory: the CA's certificate, nothing else.
    let ca_only = dir.path().join("ca-only");
    std::fs::create_dir(&ca_only).unwrap();
    std::fs::copy(certs.join("ca.crt"), ca_only.join("ca.crt")).unwrap();

    let n1 = Node::start_with(
        "n1",
        &dir.path().join("n1"),
        &["--certs-dir", certs.to_str().unwrap()],
    );
    let out = n1.cli(&["init"]);
    assert!(out.status.success(), "{}", stderr(&out));

    let out = with_token(
        &n1,
        &ca_only,
        &writer,
        &["sql", "-e", "create table t (k int primary key)"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = with_token(
        &n1,
        &ca_only,
        &writer,
        &["sql", "-e", "insert into t values (1)"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = with_token(
        &n1,
        &ca_only,
        &reader,
        &["sql", "-e", "select count(*) from t"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains('1'), "{}", stdout(&out));
    let out = with_token(
        &n1,
        &ca_only,
        &reader,
        &["sql", "-e", "insert into t values (2)"],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("error[25006]"), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("client dash (token"),
        "{}",
        stderr(&out)
    );
    let out = with_token(
        &n1,
        &ca_only,
        &writer,
        &["failover", "pause", "--reason", "no"],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("error[42501]"), "{}", stderr(&out));

    // Another CA's token: not this cluster's.
    let other = dir.path().join("other");
    issue(&other).create_ca().unwrap();
    let (foreign, _) = issue(&other).create_token("etl", Role::Admin).unwrap();
    let out = with_token(&n1, &ca_only, &foreign, &["status"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("not of this cluster's CA"),
        "{}",
        stderr(&out)
    );

    runtime().block_on(async {
        // No certificate and no token: refused by every service, and a token is no
        // node certificate for the peer services.
        let tls = hawser_tls::load_token_client(&ca_only).unwrap();
        let channel = hawser_tls::endpoint(&n1.grpc, Some(&tls))
            .unwrap()
            .connect()
            .await
            .unwrap();
        for path in ["/hawser.v1.Admin/Status", "/hawser.raft.v1.RaftPeer/Vote"] {
            let status = raw_call(channel.clone(), path).await.unwrap_err();
            assert_eq!(
                status.code(),
                tonic::Code::Unauthenticated,
                "{path}: {status:?}"
            );
        }
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.unwrap();
        let mut request = tonic::Request::new(Vec::new());
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {writer}").parse().unwrap());
        let status = grpc
            .unary(
                request,
                tonic::codegen::http::uri::PathAndQuery::from_static(
                    "/hawser.replication.v1.Replication/Replicate",
                ),
                common::Raw,
            )
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");

        // The HTTP port takes the token as Prometheus sends it.
        let anonymous = hawser_tls::http_client_config(&ca_only, None).unwrap();
        let bearer = format!("Authorization: Bearer {reader}\r\n");
        assert_eq!(
            https_status_with(&n1.http, "/metrics", anonymous.clone(), &bearer).await,
            "200"
        );
        let bad = "Authorization: Bearer hawser1.x.y\r\n";
        assert_eq!(
            https_status_with(&n1.http, "/metrics", anonymous, bad).await,
            "401"
        );
    });

    // Revoked in the node's directory: refused within its re-read, without a restart.
    let out = std::process::Command::new(hawser_bin())
        .args(["cert", "revoke-token", &writer_id, "--certs-dir"])
        .arg(&certs)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    wait_for("the revoked token to be refused", WAIT, || {
        let out = with_token(&n1, &ca_only, &writer, &["sql", "-e", "select 1"]);
        (!out.status.success() && stderr(&out).contains("revoked")).then_some(())
    });
}
