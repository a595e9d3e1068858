//! End-to-end: `hawser demo --exit-after`, the README's first command, on real
//! processes. It starts three nodes, forms the Raft cluster, creates the replication
//! scheme, writes, and prints one JSON summary; the test checks that summary against
//! what the demo promises — three nodes with a leader, the scheme's streams, every
//! table's copies equal to the master's, the workload's commits, a compressed stream
//! that saves bytes — and that nothing it started is still listening afterwards.

mod common;

use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use common::{hawser_bin, poll_until};
use serde_json::{json, Value};

/// The whole demo: three node starts, Raft, the scheme, the workload, catch-up, stop.
const DEMO_TIMEOUT: Duration = Duration::from_secs(180);

/// Runs `hawser demo ARGS` with a deadline; returns its exit status, stdout and stderr.
/// At the deadline the demo gets SIGTERM (so it stops its nodes), then SIGKILL.
fn demo(args: &[&str], out_dir: &Path) -> (ExitStatus, String, String) {
    let (out, err) = (out_dir.join("stdout"), out_dir.join("stderr"));
    let mut child = Command::new(hawser_bin())
        .arg("demo")
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("spawn hawser demo");
    let status = poll_until(DEMO_TIMEOUT, || child.try_wait().ok().flatten());
    let status = status.unwrap_or_else(|| {
        let _ = Command::new("kill").arg(child.id().to_string()).status();
        let stopped = poll_until(Duration::from_secs(30), || child.try_wait().ok().flatten());
        if stopped.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!(
            "hawser demo did not finish within {DEMO_TIMEOUT:?}; stderr:\n{}",
            std::fs::read_to_string(&err).unwrap_or_default()
        )
    });
    (
        status,
        std::fs::read_to_string(&out).unwrap(),
        std::fs::read_to_string(&err).unwrap(),
    )
}

fn names(list: &Value, key: &str) -> Vec<String> {
    list.as_array()
        .expect("a list")
        .iter()
        .map(|v| v[key].as_str().expect("a name").to_string())
        .collect()
}

#[test]
fn demo_exit_after_forms_three_nodes_replicates_with_matching_checksums_and_stops_them() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (status, stdout, stderr) = demo(
        &[
            "--exit-after",
            "--writes",
            "300",
            "--data",
            data.to_str().unwrap(),
        ],
        dir.path(),
    );
    assert!(status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let summary: Value = serde_json::from_str(stdout.trim()).expect("one JSON object on stdout");

    // Three nodes, one Raft leader among them, each with its addresses.
    let nodes = &summary["nodes"];
    assert_eq!(names(nodes, "name"), ["ds1", "ds2", "ds3"], "{summary}");
    let leaders: Vec<&Value> = nodes
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["raft_role"] == "leader")
        .collect();
    assert_eq!(leaders.len(), 1, "one leader: {nodes}");
    assert_eq!(summary["leader"], leaders[0]["name"], "{summary}");

    // The scheme: a master, a TWOSAFE subscriber, a propagator, a compressing store.
    let elements = &summary["scheme"]["elements"];
    assert_eq!(
        names(elements, "element"),
        ["accounts", "events", "events_relay"]
    );
    assert_eq!(elements[0]["owner_role"], "MASTER");
    assert_eq!(
        elements[0]["subscribers"][0]["return_service"],
        "RETURN TWOSAFE"
    );
    assert_eq!(elements[2]["owner_role"], "PROPAGATOR");

    // Every stream the scheme asks for exists and streams.
    let streams = summary["streams"].as_array().expect("streams");
    let links: Vec<(&str, &str)> = streams
        .iter()
        .map(|s| {
            (
                s["sender"].as_str().unwrap(),
                s["receiver"].as_str().unwrap(),
            )
        })
        .collect();
    for want in [("ds1", "ds2"), ("ds1", "ds3"), ("ds2", "ds3")] {
        assert!(links.contains(&want), "no stream {want:?} in {links:?}");
    }
    for s in streams {
        assert_eq!(s["state"], "streaming", "{s}");
    }
    // The compressed stream sends fewer bytes than it encodes; the others do not compress.
    let compressed: Vec<&Value> = streams.iter().filter(|s| s["compressed"] == true).collect();
    assert_eq!(compressed.len(), 1, "{streams:?}");
    let (raw, wire) = (
        compressed[0]["raw_bytes"].as_u64().unwrap(),
        compressed[0]["wire_bytes"].as_u64().unwrap(),
    );
    assert!(raw > 0 && wire < raw, "raw {raw}, wire {wire}");
    for s in streams.iter().filter(|s| s["compressed"] == false) {
        assert_eq!(s["raw_bytes"], s["wire_bytes"], "{s}");
    }

    // Every table's copies equal the master's: check the numbers, not only the verdict.
    assert_eq!(summary["caught_up"], true, "{summary}");
    let checksums = summary["checksums"].as_array().expect("checksums");
    assert_eq!(
        names(&summary["checksums"], "table"),
        ["accounts", "events"]
    );
    // ds3 keeps accounts as a change history, not a copy: no checksum there.
    let holders = [vec!["ds1", "ds2"], vec!["ds1", "ds2", "ds3"]];
    for (t, holders) in checksums.iter().zip(holders) {
        assert_eq!(names(&t["nodes"], "node"), holders, "{t}");
        let copies = t["nodes"].as_array().unwrap();
        for c in copies {
            assert_eq!(
                (&c["rows"], &c["crc32"]),
                (&copies[0]["rows"], &copies[0]["crc32"]),
                "{t}"
            );
        }
        assert_eq!(t["match"], true, "{t}");
    }
    assert_eq!(checksums[0]["nodes"][0]["rows"], 3);
    // The workload's rows and the transfer's event.
    assert_eq!(checksums[1]["nodes"][0]["rows"], 301);
    assert_eq!(summary["all_match"], true);
    assert_eq!(summary["workload"]["commits"], 300, "{summary}");

    // ds3's CCD history of accounts: the seed's three inserts, then the transfer's
    // two updates, in commit order.
    let history = &summary["history"];
    assert_eq!(history["table"], "accounts_history", "{history}");
    let ops: Vec<&str> = history["changes"]
        .as_array()
        .unwrap_or_else(|| panic!("no history in {summary}"))
        .iter()
        .map(|c| c[0].as_str().unwrap())
        .collect();
    assert_eq!(ops, ["I", "I", "I", "U", "U"], "{history}");
    assert_eq!(
        (&history["changes"][3][2], &history["changes"][3][3]),
        (&json!("Brian"), &json!("225.50")),
        "{history}"
    );

    // The conflict: ds3's later update holds on both; ds3 kept ds2's as a conflict.
    let c = &summary["conflict"];
    assert_eq!(c["resolved_equal"], true, "{c}");
    assert_eq!(c["holds"], json!([["ds2", "Chen"], ["ds3", "Chen"]]), "{c}");
    assert_eq!(c["recorded"][0][1], 0, "{c}");
    assert!(c["recorded"][1][1].as_u64().unwrap() >= 1, "{c}");

    // Return services: the master's counters when its node reports them, else null.
    let returns = &summary["returns"];
    assert!(
        returns.is_null() || returns["acknowledged"].is_u64(),
        "{returns}"
    );

    // The readable summary went to stderr, with its verdict per table.
    for section in [
        "CLUSTER",
        "SCHEME bank",
        "STREAMS",
        "RETURN SERVICES",
        "CHECKSUMS",
        "HISTORY",
        "CONFLICT",
    ] {
        assert!(stderr.contains(section), "no {section} in:\n{stderr}");
    }
    assert_eq!(stderr.matches("| match").count(), 2, "{stderr}");

    // Nothing the demo started still listens.
    for n in nodes.as_array().unwrap() {
        for key in ["grpc", "http"] {
            let addr = n[key].as_str().expect("an address");
            assert!(
                std::net::TcpStream::connect(addr).is_err(),
                "{} {key} at {addr} still accepts connections",
                n["name"]
            );
        }
    }
    // --data keeps every node's database and log.
    for name in ["ds1", "ds2", "ds3"] {
        assert!(data.join(name).join("identity.toml").exists(), "{name}");
        assert!(data.join(format!("{name}.log")).exists(), "{name}");
    }
}

#[test]
fn demo_refuses_a_data_directory_in_use_and_starts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("ds1")).unwrap();
    let (status, stdout, stderr) = demo(
        &["--exit-after", "--data", data.to_str().unwrap()],
        dir.path(),
    );
    assert!(!status.success());
    assert!(stdout.is_empty(), "{stdout}");
    assert!(stderr.contains("not empty"), "{stderr}");
    assert!(!data.join("ds1.log").exists());
}

#[test]
fn demo_failover_moves_the_master_and_brings_the_old_one_back_equal() {
    let dir = tempfile::tempdir().unwrap();
    let (status, stdout, stderr) = demo(
        &["--exit-after", "--writes", "200", "--failover"],
        dir.path(),
    );
    assert!(status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let summary: Value = serde_json::from_str(stdout.trim()).expect("one JSON object on stdout");
    let f = &summary["failover"];
    assert_eq!(f["killed"], "ds1", "{f}");
    // ds2 is ds1's RETURN TWOSAFE subscriber: it holds every acknowledged commit.
    assert_eq!(f["new_master"], "ds2", "{f}");
    assert!(f["write_after_ms"].as_u64().is_some_and(|ms| ms > 0), "{f}");
    assert_eq!(f["copies_equal"], true, "{f}");
    // The writers ran through the failover; every write acknowledged with TWOSAFE's
    // promise is on the new master.
    let load = &f["load"];
    assert!(load["acknowledged"].as_u64().unwrap() >= 100, "{f}");
    assert_eq!(load["lost_promised"], 0, "{f}");
    // The write made after the kill and the writers' are on every node, ds1 (rejoined)
    // included: the demo's 200 and the one after the kill, at least.
    for table in f["checksums"].as_array().unwrap() {
        if table[0] == "events" {
            for (_, sum) in table[1].as_array().unwrap().iter().map(|p| (&p[0], &p[1])) {
                assert!(sum["rows"].as_u64().unwrap() > 202, "{table}");
            }
        }
    }
    assert_eq!(summary["all_match"], true);
    assert!(stderr.contains("FAILOVER"), "{stderr}");
}
