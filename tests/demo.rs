//! End-to-end: `hawser demo --exit-after`, the README's first command, prints a JSON
//! summary and leaves nothing running or listening.

mod common;

use std::process::Command;

use common::{hawser_bin, stderr, stdout};

#[test]
fn demo_exit_after_prints_a_summary_and_stops_its_node() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(hawser_bin())
        .args(["demo", "--exit-after", "--writes", "400", "--data"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "stdout:\n{}\nstderr:\n{}",
        stdout(&out),
        stderr(&out)
    );
    let summary: serde_json::Value =
        serde_json::from_str(stdout(&out).trim()).expect("one JSON object on stdout");
    assert_eq!(summary["accounts"], 3, "{summary}");
    assert_eq!(summary["events"], 400, "{summary}");
    assert_eq!(summary["workload"]["commits"], 400, "{summary}");
    assert!(
        summary["store"]["commits"].as_u64().unwrap() >= 400,
        "{summary}"
    );

    // The node it started is gone: its gRPC port no longer accepts connections.
    let grpc = summary["node"]["grpc"].as_str().expect("node address");
    assert!(
        std::net::TcpStream::connect(grpc).is_err(),
        "the demo node at {grpc} is still listening"
    );
    // --data keeps the demo's database for a second look.
    assert!(dir.path().join("demo").join("identity.toml").exists());
}
