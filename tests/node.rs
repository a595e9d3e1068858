//! End-to-end: one real `hawser start` process, driven through the CLI, the client
//! library and the HTTP port.

mod common;

use common::{http_get, stderr, stdout, Node, Raw};
use hawser_client::{Client, RowOp};
use hawser_core::Value;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn sql_cli_runs_statements_reports_errors_and_data_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = Node::start("ds1", &dir.path().join("ds1"));

    // The Sybase forms from the RTL reference run as written.
    let out = node.cli(&[
        "sql",
        "-e",
        "create table t (k int primary key, c int)",
        "-e",
        "insert t values (1, 10); insert into t values (2, 20), (3, 30)",
        "-e",
        "update t set c = c + 1 where k = 1; delete t where k = 3",
        "-e",
        "select k, c from t order by k",
    ]);
    assert!(
        out.status.success(),
        "stdout:\n{}\nstderr:\n{}",
        stdout(&out),
        stderr(&out)
    );
    let text = stdout(&out);
    assert!(text.contains("11") && text.contains("20"), "{text}");
    assert!(text.contains("(2 rows)"), "{text}");

    // JSON output: one object per statement per line.
    let out = node.cli(&[
        "sql",
        "--format",
        "json",
        "-e",
        "select k, c from t where k = 2",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let line = stdout(&out);
    let v: serde_json::Value = serde_json::from_str(line.trim()).expect("one JSON object");
    assert_eq!(v["rows"], serde_json::json!([[2, 20]]));
    assert_eq!(v["columns"][0]["name"], "k");

    // A BEGIN in one -e and a COMMIT in another share one session.
    let out = node.cli(&[
        "sql",
        "-e",
        "begin",
        "-e",
        "insert into t values (4, 40)",
        "-e",
        "commit",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));

    // Errors: exit status 1, error[SQLSTATE] on stderr, nothing changed.
    let out = node.cli(&["sql", "-e", "insert into t values (1, 99)"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("error[23505]"), "{}", stderr(&out));
    let out = node.cli(&["sql", "-e", "select * from nosuch"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("error[42P01]"), "{}", stderr(&out));
    let out = node.cli(&["sql", "-e", "selec 1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("error[42601]"), "{}", stderr(&out));

    // Clean shutdown on SIGTERM, then everything is still there after a restart.
    let status = node.terminate().expect("node exits on SIGTERM");
    assert!(
        status.success(),
        "exit status {status:?}; log:\n{}",
        node.log()
    );
    let node = Node::start("ds1", &dir.path().join("ds1"));
    let out = node.cli(&[
        "sql",
        "--format",
        "json",
        "-e",
        "select k, c from t order by k",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(v["rows"], serde_json::json!([[1, 11], [2, 20], [4, 40]]));
}

#[test]
fn client_library_typed_rows_status_and_http_endpoints() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start("ds2", &dir.path().join("ds2"));
    runtime().block_on(async {
        let mut c = Client::connect(&node.grpc).await.unwrap();
        let out = c
            .execute("create table kv (k bigint primary key, v varchar(20) not null)")
            .await
            .unwrap();
        assert!(out.error.is_none(), "{out:?}");
        for k in 0..10i64 {
            c.write(vec![RowOp::Upsert {
                table: "kv".into(),
                row: vec![Value::Int(k), Value::Text(format!("v{k}"))],
            }])
            .await
            .unwrap();
        }
        // Upsert replaces; delete removes.
        c.write(vec![
            RowOp::Upsert {
                table: "kv".into(),
                row: vec![Value::Int(3), Value::Text("three".into())],
            },
            RowOp::Delete {
                table: "kv".into(),
                key: vec![Value::Int(9)],
            },
        ])
        .await
        .unwrap();
        assert_eq!(
            c.get("kv", &[Value::Int(3)]).await.unwrap(),
            Some(vec![Value::Int(3), Value::Text("three".into())])
        );
        assert_eq!(c.get("kv", &[Value::Int(9)]).await.unwrap(), None);
        let (rows, more) = c
            .scan("kv", &[Value::Int(2)], &[Value::Int(6)], 3)
            .await
            .unwrap();
        assert_eq!(
            rows.iter().map(|r| r[0].clone()).collect::<Vec<_>>(),
            vec![Value::Int(2), Value::Int(3), Value::Int(4)]
        );
        assert!(more);

        // Bad input is refused with the SQLSTATE, and changes nothing.
        let err = c
            .write(vec![
                RowOp::Insert {
                    table: "kv".into(),
                    row: vec![Value::Int(100), Value::Text("ok".into())],
                },
                RowOp::Insert {
                    table: "kv".into(),
                    row: vec![Value::Int(101), Value::Null],
                },
            ])
            .await
            .unwrap_err();
        let hawser_client::ClientError::Status(status) = &err else {
            panic!("{err}")
        };
        assert_eq!(hawser_client::sqlstate(status), Some("23502"), "{err}");
        assert_eq!(c.get("kv", &[Value::Int(100)]).await.unwrap(), None);
        let err = c.get("nosuch", &[Value::Int(1)]).await.unwrap_err();
        assert!(err.to_string().contains("42P01"), "{err}");

        // A write stream: many transactions over one stream; a failed write is answered
        // with its error (and changes nothing) and the stream goes on.
        let mut w = c.writer().await.unwrap();
        for k in 20..30i64 {
            let out = w
                .write(vec![RowOp::Upsert {
                    table: "kv".into(),
                    row: vec![Value::Int(k), Value::Text(format!("s{k}"))],
                }])
                .await
                .unwrap();
            assert!(out.durable && out.lsn > 0, "{out:?}");
        }
        let err = w
            .write(vec![RowOp::Insert {
                table: "kv".into(),
                row: vec![Value::Int(20), Value::Text("again".into())],
            }])
            .await
            .unwrap_err();
        let hawser_client::ClientError::Status(status) = &err else {
            panic!("{err}")
        };
        assert_eq!(hawser_client::sqlstate(status), Some("23505"), "{err}");
        let err = w
            .write(vec![RowOp::Upsert {
                table: "nosuch".into(),
                row: vec![Value::Int(1)],
            }])
            .await
            .unwrap_err();
        assert!(err.to_string().contains("42P01"), "{err}");
        let last = w
            .write(vec![RowOp::Delete {
                table: "kv".into(),
                key: vec![Value::Int(29)],
            }])
            .await
            .unwrap();
        assert!(last.durable, "{last:?}");
        assert_eq!(
            c.get("kv", &[Value::Int(20)]).await.unwrap(),
            Some(vec![Value::Int(20), Value::Text("s20".into())])
        );
        assert_eq!(c.get("kv", &[Value::Int(29)]).await.unwrap(), None);
        assert_eq!(
            c.get("kv", &[Value::Int(28)]).await.unwrap().unwrap()[1],
            Value::Text("s28".into())
        );
        drop(w);

        let s = c.status().await.unwrap();
        assert_eq!(s.name, "ds2");
        assert_eq!(s.node_id, node.node_id);
        assert!(s.commits >= 23, "{s:?}");
        assert!(s.tables.iter().any(|t| t.name == "kv"));
    });

    let out = node.cli(&["status", "--format", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(v["name"], "ds2");
    assert_eq!(v["node_id"], node.node_id);

    assert_eq!(http_get(&node.http, "/healthz").0, 200);
    assert_eq!(http_get(&node.http, "/readyz").0, 200);
    let (code, metrics) = http_get(&node.http, "/metrics");
    assert_eq!(code, 200);
    assert!(metrics.contains("hawser_store_commits_total"), "{metrics}");
    // The process's own, as Prometheus clients name them.
    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_threads",
        "process_open_fds",
    ] {
        assert!(
            metrics.lines().any(|l| l.starts_with(name)),
            "no {name}: {metrics}"
        );
    }
    // Latencies are histograms with fixed buckets (they add up across nodes), not
    // summaries: the commits above are counted in the +Inf bucket, and a millisecond
    // bucket is there too.
    let inf = metrics
        .lines()
        .find(|l| l.starts_with("hawser_store_commit_seconds_bucket{le=\"+Inf\"}"))
        .unwrap_or_else(|| panic!("no +Inf bucket of the commit time: {metrics}"));
    let counted: u64 = inf.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(counted > 0, "{inf}");
    assert!(
        metrics.contains("hawser_store_commit_seconds_bucket{le=\"0.001\"}"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("hawser_store_commit_seconds{quantile="),
        "{metrics}"
    );
    // Where the flushes' time went: the log's syncs and the moves into sled, counted
    // with the commits; the checkpoint's flush of sled within its second.
    let count = |metrics: &str, name: &str| -> u64 {
        let line = format!("{name}_count ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&line))
            .map_or(0, |v| v.trim().parse().unwrap())
    };
    for name in ["hawser_store_log_sync_seconds", "hawser_store_move_seconds"] {
        assert!(count(&metrics, name) > 0, "no {name}: {metrics}");
    }
    common::wait_for(
        "a checkpoint counted",
        std::time::Duration::from_secs(10),
        || {
            let (_, metrics) = http_get(&node.http, "/metrics");
            (count(&metrics, "hawser_store_checkpoint_seconds") > 0).then_some(())
        },
    );
    let (code, body) = http_get(&node.http, "/status");
    assert_eq!(code, 200);
    assert!(body.contains("\"name\":\"ds2\""), "{body}");
}

#[test]
fn a_bad_configuration_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(common::hawser_bin())
        .args(["start", "--name", "9lives", "--data"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("identifier"), "{}", stderr(&out));

    // A data directory belongs to the store that created it.
    let mut node = Node::start("first", &dir.path().join("d"));
    node.terminate();
    let out = std::process::Command::new(common::hawser_bin())
        .args([
            "start",
            "--insecure",
            "--name",
            "second",
            "--listen",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
            "--data",
        ])
        .arg(dir.path().join("d"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("belongs to store"),
        "{}",
        stderr(&out)
    );
}

/// A script file larger than a request may carry (a dump to load) runs whole: the CLI
/// sends it in pieces of whole statements on one session, and an error names its
/// statement and line in the file.
#[test]
fn a_sql_file_larger_than_a_request_runs_whole_and_errors_name_their_place() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start_with(
        "ds1",
        &dir.path().join("ds1"),
        &["--max-message-bytes", "2097152"],
    );
    let pad = "x".repeat(2000);
    let mut file = String::from("create table t (k int primary key, v varchar(4000));\n");
    // About 6 MB, three times the node's limit. Statement 3002 (line 3002) repeats key 1.
    for k in 1..=3000 {
        file.push_str(&format!("insert into t values ({k}, '{pad}');\n"));
    }
    file.push_str("insert into t values (1, 'again');\nselect 1;\n");
    assert!(file.len() > 2 * 2097152);
    let path = dir.path().join("load.sql");
    std::fs::write(&path, &file).unwrap();
    let out = node.cli(&["sql", "-f", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("error[23505]") && err.contains("statement 3002, line 3002"),
        "{err}"
    );
    let out = node.cli(&["sql", "--format", "json", "-e", "select count(*) from t"]);
    assert!(stdout(&out).contains("[[3000]]"), "{}", stdout(&out));
}

#[test]
fn an_oversized_request_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start_with(
        "big",
        &dir.path().join("big"),
        &["--max-message-bytes", "65536"],
    );
    runtime().block_on(async {
        let mut c = Client::connect(&node.grpc).await.unwrap();
        let out = c
            .execute("create table t (k int primary key, v varchar(4000))")
            .await
            .unwrap();
        assert!(out.error.is_none(), "{out:?}");
        // About 200 KB of SQL: over the node's 64 KiB limit.
        let values: Vec<String> = (0..100)
            .map(|k| format!("({k}, '{}')", "x".repeat(2000)))
            .collect();
        let sql = format!("insert into t values {}", values.join(", "));
        let err = c.execute(&sql).await.unwrap_err();
        let hawser_client::ClientError::Status(status) = &err else {
            panic!("{err}")
        };
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
        assert_eq!(hawser_client::sqlstate(status), Some("54000"), "{status:?}");
        let out = c.execute("select count(*) from t").await.unwrap();
        assert_eq!(out.results[0].rows[0][0], Value::Int(0));
    });
    // Through the CLI's session, a statement too long for one request (it cannot be
    // cut) ends the session with the reason.
    let values: Vec<String> = (0..100)
        .map(|k| format!("({k}, '{}')", "x".repeat(2000)))
        .collect();
    let path = dir.path().join("one.sql");
    std::fs::write(&path, format!("insert into t values {}", values.join(", "))).unwrap();
    let out = node.cli(&["sql", "-f", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("message length too large"), "{err}");
}

/// A SELECT whose rows would not fit in one reply fails with 54000, naming the limit,
/// instead of breaking the reply; what ran before it in the script stands.
#[test]
fn a_result_too_large_for_one_reply_is_refused_naming_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start_with(
        "wide",
        &dir.path().join("wide"),
        &["--max-message-bytes", "65536"],
    );
    runtime().block_on(async {
        let mut c = Client::connect(&node.grpc).await.unwrap();
        let out = c
            .execute("create table t (k int primary key, v varchar(4000))")
            .await
            .unwrap();
        assert!(out.error.is_none(), "{out:?}");
        // 40 rows of 2,000 characters, in scripts that each fit a request.
        for part in 0..4 {
            let script: Vec<String> = (0..10)
                .map(|i| {
                    format!(
                        "insert into t values ({}, '{}')",
                        part * 10 + i,
                        "x".repeat(2000)
                    )
                })
                .collect();
            let out = c.execute(&script.join(";")).await.unwrap();
            assert!(out.error.is_none(), "{out:?}");
        }
        let out = c
            .execute(
                "insert into t values (100, 'y'); select * from t; insert into t values (101, 'z')",
            )
            .await
            .unwrap();
        let e = out.error.expect("refused");
        assert_eq!((e.code.as_str(), e.statement), ("54000", 2), "{e:?}");
        assert!(e.message.contains("--max-message-bytes"), "{e:?}");
        assert_eq!(out.results.len(), 1, "the insert before it ran");
        let out = c.execute("select count(*) from t").await.unwrap();
        assert_eq!(out.results[0].rows[0][0], Value::Int(41));
    });
    let out = node.cli(&["sql", "-e", "select * from t"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("error[54000]"), "{}", stderr(&out));
}

/// Sessions past --max-sessions are refused with 53300 naming the limit; one-shot
/// scripts still run, and a session that ends makes room.
#[test]
fn sessions_past_the_limit_are_refused_until_one_ends() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start_with("few", &dir.path().join("few"), &["--max-sessions", "2"]);
    runtime().block_on(async {
        let mut c = Client::connect(&node.grpc).await.unwrap();
        let mut a = c.session().await.unwrap();
        let mut b = c.session().await.unwrap();
        for s in [&mut a, &mut b] {
            assert!(s.execute("select 1").await.unwrap().error.is_none());
        }
        let err = match c.session().await {
            Err(e) => e,
            Ok(_) => panic!("a third session was opened"),
        };
        let hawser_client::ClientError::Status(status) = &err else {
            panic!("{err}")
        };
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
        assert_eq!(hawser_client::sqlstate(status), Some("53300"), "{status:?}");
        assert!(status.message().contains("--max-sessions"), "{status:?}");
        assert!(c.execute("select 1").await.unwrap().error.is_none());
        drop(a);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut c2 = c.clone();
        loop {
            match c2.session().await {
                Ok(mut s) => {
                    assert!(s.execute("select 1").await.unwrap().error.is_none());
                    break;
                }
                Err(e) if std::time::Instant::now() < deadline => {
                    assert!(e.to_string().contains("too many sessions"), "{e}");
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                Err(e) => panic!("no room after a session ended: {e}"),
            }
        }
        drop(b);
    });
}

/// Client calls past --max-requests are refused at once with 53300 naming the limit
/// (one call holds the only permit while it waits for a row lock); Admin calls have
/// their own bound and still answer.
#[test]
fn calls_past_the_limit_are_refused_at_once_while_admin_calls_still_answer() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start_with("busy", &dir.path().join("busy"), &["--max-requests", "1"]);
    runtime().block_on(async {
        let mut c = Client::connect(&node.grpc).await.unwrap();
        let out = c
            .execute("create table t (k int primary key, v int); insert into t values (1, 0)")
            .await
            .unwrap();
        assert!(out.error.is_none(), "{out:?}");
        // A session (not counted once open) holds the row's lock.
        let mut holder = c.session().await.unwrap();
        let out = holder
            .execute("begin; update t set v = 1 where k = 1")
            .await
            .unwrap();
        assert!(out.error.is_none(), "{out:?}");
        // This call waits for the lock, holding the node's one permit.
        let wait_for_lock = |mut waiter: Client| {
            tokio::spawn(async move { waiter.execute("update t set v = 2 where k = 1").await })
        };
        let mut waiting = wait_for_lock(c.clone());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let status = loop {
            if waiting.is_finished() {
                // It came in while a probe below held the permit and was refused
                // itself (or, on a very slow machine, its lock wait timed out): again.
                let done = waiting.await.unwrap();
                assert!(
                    !done.as_ref().is_ok_and(|out| out.error.is_none()),
                    "the update ran while the row was locked: {done:?}"
                );
                waiting = wait_for_lock(c.clone());
            }
            match c.execute("select 1").await {
                Err(hawser_client::ClientError::Status(s)) => break s,
                Err(e) => panic!("{e}"),
                // The waiting call is not in yet.
                Ok(_) if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await
                }
                Ok(_) => panic!("no call was refused while one waited for a lock"),
            }
        };
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
        assert_eq!(
            hawser_client::sqlstate(&status),
            Some("53300"),
            "{status:?}"
        );
        assert!(status.message().contains("--max-requests"), "{status:?}");
        assert!(c.status().await.is_ok(), "Admin has a bound of its own");
        // The lock freed, the waiting call ends and makes room.
        let out = holder.execute("commit").await.unwrap();
        assert!(out.error.is_none(), "{out:?}");
        let out = waiting.await.unwrap().unwrap();
        assert!(out.error.is_none(), "{out:?}");
        let out = c.execute("select v from t").await.unwrap();
        assert_eq!(out.results[0].rows[0][0], Value::Int(2));
    });
}

/// A statement past --statement-timeout fails with 57014 naming the timeout, and
/// commits nothing.
#[test]
fn a_statement_past_the_statement_timeout_fails_with_57014() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start_with(
        "hasty",
        &dir.path().join("hasty"),
        &["--statement-timeout", "1ns"],
    );
    runtime().block_on(async {
        let mut c = Client::connect(&node.grpc).await.unwrap();
        let out = c
            .execute("create table t (k int primary key); insert into t values (1)")
            .await
            .unwrap();
        let e = out.error.expect("timed out");
        assert_eq!((e.code.as_str(), e.statement), ("57014", 2), "{e:?}");
        assert!(e.message.contains("statement timeout"), "{e:?}");
        let out = c.execute("select count(*) from t").await.unwrap();
        assert_eq!(out.error.map(|e| e.code), Some("57014".to_string()));
    });
    // A session's statements too.
    let out = node.cli(&["sql", "-e", "select 1"]);
    assert!(stderr(&out).contains("error[57014]"), "{}", stderr(&out));
}

/// Bytes that are no request, or a request whose text is not UTF-8, are the caller's
/// mistake: INVALID_ARGUMENT with a SQLSTATE, and the node goes on. An Admin error its
/// handler gave no SQLSTATE gets its code's.
#[test]
fn undecodable_requests_are_invalid_arguments_and_every_error_has_a_sqlstate() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start("raw", &dir.path().join("raw"));
    runtime().block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", node.grpc))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let call = |bytes: Vec<u8>| {
            let mut grpc = tonic::client::Grpc::new(channel.clone());
            async move {
                grpc.ready().await.unwrap();
                let path = tonic::codegen::http::uri::PathAndQuery::from_static(
                    "/hawser.v1.Client/Execute",
                );
                grpc.unary(tonic::Request::new(bytes), path, Raw).await
            }
        };
        // ExecuteRequest.sql (field 1, a string) holding 0xFF 0xFE; then a field header
        // whose length runs past the end.
        for bytes in [vec![0x0A, 0x02, 0xFF, 0xFE], vec![0x0A, 0x7F, b'x']] {
            let status = call(bytes.clone()).await.unwrap_err();
            assert_eq!(
                status.code(),
                tonic::Code::InvalidArgument,
                "{bytes:?}: {status:?}"
            );
            assert_eq!(
                hawser_client::sqlstate(&status),
                Some("08P01"),
                "{status:?}"
            );
        }
        // A well-formed request still works on the same connection.
        let ok = call(vec![
            0x0A, 0x08, b's', b'e', b'l', b'e', b'c', b't', b' ', b'1',
        ])
        .await
        .unwrap();
        assert!(!ok.into_inner().is_empty());
        // Admin: pausing failover on a node in no cluster, refused by its handler.
        let mut c = Client::connect(&node.grpc).await.unwrap();
        let err = c.set_failover(true, "").await.unwrap_err();
        let hawser_client::ClientError::Status(status) = &err else {
            panic!("{err}")
        };
        assert!(hawser_client::sqlstate(status).is_some(), "{status:?}");
    });
}

/// The scheduling policy of each thread of process `pid` (field 41 of
/// `/proc/PID/task/TID/stat`: 0 SCHED_OTHER, 5 SCHED_IDLE), by thread name.
fn thread_policies(pid: u32) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let Ok(stat) = std::fs::read_to_string(task.unwrap().path().join("stat")) else {
            continue; // the thread ended between the listing and the read
        };
        let (head, rest) = stat.rsplit_once(") ").unwrap();
        let name = head.split_once(" (").unwrap().1.to_string();
        // `rest` starts at field 3 (the state).
        let policy = rest.split(' ').nth(41 - 3).unwrap().parse().unwrap();
        out.push((name, policy));
    }
    out
}

/// `--cpu-class idle` puts every thread of the node in SCHED_IDLE — the runtime's,
/// the store's and those started later for work — and the node works as before; a node
/// started without it stays in the normal class.
#[test]
fn a_node_in_the_idle_cpu_class_runs_all_its_threads_there() {
    const SCHED_IDLE: u32 = 5;
    let dir = tempfile::tempdir().unwrap();
    let idle = Node::start_with("idle", &dir.path().join("idle"), &["--cpu-class", "idle"]);
    let out = idle.cli(&[
        "sql",
        "-e",
        "create table t (k int primary key, c int)",
        "-e",
        "insert into t values (1, 10), (2, 20)",
        "-e",
        "select count(*) from t",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(idle.status()["cpu_class"], "idle");
    let threads = thread_policies(idle.pid());
    assert!(threads.len() > 2, "{threads:?}");
    assert!(
        threads.iter().all(|(_, p)| *p == SCHED_IDLE),
        "threads outside SCHED_IDLE: {threads:?}"
    );

    let normal = Node::start("normal", &dir.path().join("normal"));
    assert_eq!(normal.status()["cpu_class"], "normal");
    let threads = thread_policies(normal.pid());
    assert!(threads.iter().all(|(_, p)| *p == 0), "{threads:?}");

    let out = std::process::Command::new(common::hawser_bin())
        .args(["start", "--cpu-class", "realtime"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("normal or idle"), "{}", stderr(&out));
}

/// The `THP_enabled` line of `/proc/PID/status`: 0 once the process opted out of
/// transparent huge pages (`PR_SET_THP_DISABLE`), 1 while the machine's setting applies.
fn thp_enabled(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .expect("the kernel reports THP_enabled in /proc/PID/status (Linux 5.0 and later)");
    line.trim().parse().unwrap()
}

/// A node opts out of transparent huge pages unless told `--transparent-huge-pages
/// system`, and works either way; a setting hawser does not have is refused by name.
#[test]
fn a_node_opts_out_of_transparent_huge_pages_unless_told_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let off = Node::start("off", &dir.path().join("off"));
    let out = off.cli(&[
        "sql",
        "-e",
        "create table t (k int primary key, c int)",
        "-e",
        "insert into t values (1, 10), (2, 20)",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(thp_enabled(off.pid()), 0, "the default opts out");

    let system = Node::start_with(
        "system",
        &dir.path().join("system"),
        &["--transparent-huge-pages", "system"],
    );
    let out = system.cli(&["sql", "-e", "create table t (k int primary key)"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // A kernel built without transparent huge pages reports 0 for every process.
    let kernel_has_thp = std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists();
    assert_eq!(
        thp_enabled(system.pid()),
        u32::from(kernel_has_thp),
        "system leaves the machine's setting"
    );

    let out = std::process::Command::new(common::hawser_bin())
        .args(["start", "--transparent-huge-pages", "always"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("off or system"), "{}", stderr(&out));
}

/// A client command whose reader stops early (`hawser sql ... | head`) ends on SIGPIPE
/// as other Unix tools do, quietly: not with "error: Broken pipe" (`sql`) or a panic and
/// a backtrace (`status`, which prints with `println!`).
#[test]
fn a_client_command_piped_into_a_reader_that_stops_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    const SIGPIPE: i32 = 13;
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start("ds1", &dir.path().join("ds1"));
    // More output than a pipe holds (64 KiB), so the command must write after the
    // reader has gone, whenever it goes.
    let values: Vec<String> = (0..3000)
        .map(|k| format!("({k}, '{}')", "x".repeat(40)))
        .collect();
    let inserts: Vec<String> = values
        .chunks(500)
        .map(|c| format!("insert into t values {}", c.join(", ")))
        .collect();
    let mut args = vec![
        "sql",
        "-e",
        "create table t (k int primary key, v varchar(60))",
    ];
    for insert in &inserts {
        args.extend(["-e", insert.as_str()]);
    }
    let out = node.cli(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut child = std::process::Command::new(common::hawser_bin())
        .args(["sql", "-e", "select k, v from t"])
        .env("HAWSER_HOST", &node.grpc)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        out.status.signal(),
        Some(SIGPIPE),
        "{:?}: {err}",
        out.status
    );
    // `status` prints with println!, which panics on a closed stdout: the same end.
    let mut child = std::process::Command::new(common::hawser_bin())
        .args(["status"])
        .env("HAWSER_HOST", &node.grpc)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        out.status.signal(),
        Some(SIGPIPE),
        "{:?}: {err}",
        out.status
    );
}

/// A client command whose node dies under it reports that, with an exit code: writes to
/// a socket whose peer has gone raise SIGPIPE (`writev` has no MSG_NOSIGNAL), which must
/// not end the command without a word, as it ended a drill whose master it crashed.
#[test]
fn a_client_command_whose_node_dies_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = Node::start("ds1", &dir.path().join("ds1"));
    let bench = std::process::Command::new(common::hawser_bin())
        .args(["bench", "--duration", "20s", "--clients", "16"])
        .env("HAWSER_HOST", &node.grpc)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Under load: commits counted on the node.
    let grpc = node.grpc.clone();
    common::poll_until(std::time::Duration::from_secs(30), || {
        let c =
            runtime().block_on(async { Client::connect(&grpc).await.ok()?.status().await.ok() })?;
        (c.commits > 100).then_some(())
    })
    .expect("the bench commits");
    node.kill9();
    let out = bench.wait_with_output().unwrap();
    let err = stderr(&out);
    assert!(
        out.status.code().is_some(),
        "ended by a signal: {:?}: {err}",
        out.status
    );
    assert!(!out.status.success() && err.contains("error"), "{err}");
}

/// Whether process `pid` is still running (a zombie waiting for its new parent to
/// reap it has exited).
fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

#[test]
fn a_node_started_with_exit_with_parent_stops_when_its_parent_is_killed() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let out_file = dir.path().join("node.out");
    // A parent shell that starts the node in the background, says its pid and waits.
    let mut parent = Command::new("sh")
        .arg("-c")
        .arg(
            "\"$0\" start --insecure --name ds1 --listen 127.0.0.1:0 --http 127.0.0.1:0 --data \"$1\" \
             --exit-with-parent >\"$2\" 2>\"$2.log\" & echo $!; wait",
        )
        .arg(common::hawser_bin())
        .arg(dir.path().join("ds1"))
        .arg(&out_file)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(parent.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pid: u32 = line.trim().parse().expect("the node's pid");
    // Kill the node on the way out whatever happens.
    struct Reap(u32);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = Command::new("kill")
                .args(["-9", &self.0.to_string()])
                .status();
        }
    }
    let _reap = Reap(pid);
    common::wait_for("the node is ready", Duration::from_secs(60), || {
        std::fs::read_to_string(&out_file)
            .ok()
            .filter(|s| s.starts_with("ready "))
    });
    assert!(running(pid));

    parent.kill().unwrap();
    parent.wait().unwrap();
    common::wait_for("the orphaned node to stop", Duration::from_secs(20), || {
        (!running(pid)).then_some(())
    });
    let log = std::fs::read_to_string(dir.path().join("node.out.log")).unwrap_or_default();
    assert!(log.contains("the parent process is gone"), "{log}");
}

#[test]
fn bench_rate_holds_the_clients_to_a_schedule_and_reports_how_late_they_sent() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start("ds1", &dir.path().join("ds1"));
    let bench = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            "--clients",
            "2",
            "--duration",
            "1s",
            "--warmup",
            "0s",
            "--keys",
            "100",
            "--format",
            "json",
        ];
        args.extend_from_slice(extra);
        let out = node.cli(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        let report: serde_json::Value =
            serde_json::from_str(stdout(&out).trim()).expect("one JSON object");
        report
    };

    // 100 commits a second scheduled over one second: a Poisson count with mean 100, far
    // below what the node commits unthrottled (thousands a second with two clients).
    let report = bench(&["--rate", "100"]);
    assert_eq!(report["rate"], 100.0, "{report}");
    let commits = report["commits"].as_u64().unwrap();
    assert!(commits > 0, "{report}");
    assert!(
        commits <= 200,
        "{commits} commits in one second at 100 a second: the schedule did not hold them"
    );
    let lag = &report["schedule_lag_us"];
    assert!(lag["mean"].as_f64().is_some_and(|m| m >= 0.0), "{report}");
    assert!(lag["max"].as_u64().is_some(), "{report}");
    assert!(
        report["latency_us"]["p50"].as_u64().unwrap() > 0,
        "{report}"
    );

    // Without --rate: no schedule, nothing reported of one.
    let report = bench(&[]);
    assert!(report["rate"].is_null(), "{report}");
    assert!(report["schedule_lag_us"].is_null(), "{report}");

    // --log: one line per measured commit, as pgbench --log, in the order sent.
    let log = dir.path().join("commits.csv");
    let report = bench(&["--rate", "100", "--log", log.to_str().unwrap()]);
    let text = std::fs::read_to_string(&log).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("client,sent_unix_us,latency_us,lag_us,outcome")
    );
    let rows: Vec<Vec<u64>> = lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            assert_eq!(f.len(), 5, "{l}");
            assert_eq!(f[4], "none", "no return service: {l}");
            f[..4].iter().map(|v| v.parse().unwrap()).collect()
        })
        .collect();
    assert_eq!(
        rows.len() as u64,
        report["commits"].as_u64().unwrap(),
        "{report}"
    );
    assert_eq!(
        report["log"]["lines"].as_u64(),
        Some(rows.len() as u64),
        "{report}"
    );
    assert!(rows.iter().all(|r| r[0] < 2), "two clients: 0 and 1");
    assert!(
        rows.windows(2).all(|w| w[0][1] <= w[1][1]),
        "in the order sent"
    );
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    assert!(
        rows.iter()
            .all(|r| r[1] <= now_us && r[1] + 60_000_000 > now_us),
        "sent within the last minute on the wall clock"
    );
    // The report's histogram keeps three significant digits.
    let max = rows.iter().map(|r| r[2]).max().unwrap();
    let reported = report["latency_us"]["max"].as_u64().unwrap();
    assert!(
        max.abs_diff(reported) <= reported / 500,
        "log max {max}: {report}"
    );
    // A latency counts from the scheduled time, so it is never below the send lag.
    assert!(rows.iter().all(|r| r[2] >= r[3]), "latency below its lag");

    // A log file that cannot be created stops the run before any load.
    let out = node.cli(&[
        "bench",
        "--log",
        "/nonexistent-dir/x.csv",
        "--duration",
        "1s",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("cannot create the --log file /nonexistent-dir/x.csv"),
        "{}",
        stderr(&out)
    );

    // A rate that is not one is refused before anything runs.
    for bad in ["0", "-5", "fast"] {
        let rate = format!("--rate={bad}");
        let out = node.cli(&["bench", &rate, "--duration", "1s"]);
        assert!(!out.status.success(), "--rate {bad} was taken");
        assert!(stderr(&out).contains("--rate"), "{}", stderr(&out));
    }
}

/// Every metric the alerting rules in `deploy/prometheus` name is one a node exports
/// (a name written in the code), so a renamed metric cannot leave an alert that never
/// fires.
#[test]
fn the_alerting_rules_name_only_metrics_the_nodes_export() {
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    /// Every `hawser_…` name in `text`, without a histogram's series suffix.
    fn metric_names(text: &str) -> BTreeSet<String> {
        words(text, "hawser_", |c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'
        })
        .map(|name| {
            ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name)
                .to_string()
        })
        .collect()
    }
    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let rules = std::fs::read_to_string(root.join("deploy/prometheus/hawser-alerts.yaml")).unwrap();
    let named = metric_names(&rules);
    assert!(named.len() >= 10, "{named:?}");
    // One expression per rule (a YAML parser takes a second `expr:` silently).
    let count = |what: &str| {
        rules
            .lines()
            .filter(|l| l.trim_start().starts_with(what))
            .count()
    };
    assert_eq!(
        count("- alert:"),
        count("expr:"),
        "a rule without its own expr"
    );
    let mut files = Vec::new();
    rust_files(&root.join("crates"), &mut files);
    let mut exported = BTreeSet::new();
    for file in files {
        let code = std::fs::read_to_string(&file).unwrap();
        // Names as the code registers them: string literals.
        for name in metric_names(&code) {
            if code.contains(&format!("\"{name}\"")) {
                exported.insert(name);
            }
        }
    }
    let unknown: Vec<&String> = named.difference(&exported).collect();
    assert!(
        unknown.is_empty(),
        "the alerting rules name metrics no node exports: {unknown:?}"
    );
}

/// Every `HAWSER_…` environment variable the container image and the Kubernetes
/// manifest set is one `hawser start` reads (its --help lists each flag's variable), so
/// a renamed flag cannot leave a deployment silently running on a default.
#[test]
fn the_deployment_files_set_only_variables_hawser_start_reads() {
    let help = std::process::Command::new(common::hawser_bin())
        .args(["start", "--help"])
        .output()
        .unwrap();
    assert!(help.status.success());
    let help = stdout(&help);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut checked = 0;
    for file in ["deploy/Dockerfile", "deploy/k8s/hawser.yaml"] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        for var in words(&text, "HAWSER_", |c| c.is_ascii_uppercase() || c == '_') {
            assert!(
                help.contains(&format!("[env: {var}=")),
                "{file} sets {var}, which `hawser start` does not read"
            );
            checked += 1;
        }
    }
    assert!(checked >= 6, "found {checked} variables");
}

/// The words of `text` that start with `prefix` and go on while `part` holds.
fn words<'a>(
    text: &'a str,
    prefix: &'a str,
    part: fn(char) -> bool,
) -> impl Iterator<Item = &'a str> + 'a {
    text.match_indices(prefix).map(move |(at, _)| {
        let tail = &text[at..];
        let end = tail.find(|c: char| !part(c)).unwrap_or(tail.len());
        &tail[..end]
    })
}
