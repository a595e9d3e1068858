//! End-to-end: a hawser cluster of real processes. Three nodes formed with `--join` and
//! `hawser init`; replication DDL through a follower seen everywhere; refusals that
//! change nothing; the Raft leader SIGKILLed and DDL accepted by its successor; every
//! node restarted on its data; a fourth node that joins after the log was purged gets
//! the state by snapshot; the Kubernetes manifest's way of forming a cluster. Every wait
//! is bounded and waits on a condition.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{poll_until, stderr, stdout, wait_for, Node};
use serde_json::Value;

/// Fast Raft timing, and a snapshot (with the log purged) every few entries.
const RAFT: &[&str] = &[
    "--raft-heartbeat",
    "50ms",
    "--raft-election-min",
    "200ms",
    "--raft-election-max",
    "400ms",
    "--raft-snapshot-every",
    "4",
    "--raft-log-keep",
    "0",
];

const WAIT: Duration = Duration::from_secs(20);

fn start(name: &str, dir: &Path, listen: &str, join: Option<&str>) -> Node {
    let mut args: Vec<&str> = RAFT.to_vec();
    if let Some(j) = join {
        args.extend(["--join", j]);
    }
    Node::start_at(name, &dir.join(name), listen, &args)
}

/// The rows of table t on `n`, when it answers.
fn rows_of_t(n: &Node) -> Option<u64> {
    let out = n.cli(&["sql", "--format", "json", "-e", "select count(*) from t"]);
    let v: Value = serde_json::from_str(stdout(&out).lines().next()?).ok()?;
    v["rows"][0][0].as_u64()
}

fn cluster(status: &Value) -> &Value {
    &status["cluster"]
}

/// The voters a node's status lists.
fn voters(status: &Value) -> usize {
    cluster(status)["nodes"]
        .as_array()
        .map(|n| n.iter().filter(|n| n["membership"] == "voter").count())
        .unwrap_or(0)
}

/// The leader id a node knows, if any.
fn leader(node: &Node) -> Option<u64> {
    node.try_status()
        .and_then(|s| cluster(&s)["leader_id"].as_u64())
}

fn scheme_show(node: &Node, name: Option<&str>) -> std::process::Output {
    let mut args = vec!["scheme", "show"];
    args.extend(name);
    node.cli(&args)
}

/// Runs replication DDL through `hawser sql` on `node`, retrying while the cluster has
/// no leader (57P03); returns the last output.
fn ddl(node: &Node, text: &str) -> std::process::Output {
    wait_for("DDL accepted or refused for good", WAIT, || {
        let out = node.cli(&["sql", "-e", text]);
        (!stderr(&out).contains("error[57P03]")).then_some(out)
    })
}

/// A scheme naming all three stores, with the host spelling the nodes advertise.
const R1: &str = "CREATE REPLICATION r1 \
    ELEMENT e TABLE t MASTER n1 ON \"127.0.0.1\" \
    SUBSCRIBER n2 ON \"127.0.0.1\", n3 ON \"127.0.0.1\"";

#[test]
fn three_node_cluster_ddl_failover_restart_and_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();

    // Form the cluster: n1 bootstrapped by init, n2 and n3 join through it.
    let n1 = start("n1", d, "127.0.0.1:0", None);
    // Before init there is no cluster to take DDL: a retryable error.
    let out = n1.cli(&["sql", "-e", R1]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("error[57P03]"), "{}", stderr(&out));
    // A node started with --join refuses to bootstrap a second cluster.
    let lost = start("lost", d, "127.0.0.1:0", Some("127.0.0.1:1"));
    let out = lost.cli(&["init"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--join"), "{}", stderr(&out));
    drop(lost);
    let out = n1.cli(&["init"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("initialized a new cluster"),
        "{}",
        stdout(&out)
    );
    let out = n1.cli(&["init"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("nothing changed"), "{}", stdout(&out));
    let n2 = start("n2", d, "127.0.0.1:0", Some(&n1.grpc));
    let n3 = start("n3", d, "127.0.0.1:0", Some(&n1.grpc));
    let mut nodes = vec![n1, n2, n3];
    three_voters_everywhere(&nodes);

    // CREATE REPLICATION through a follower; every node shows the same scheme.
    let leader_id = leader(&nodes[0]).expect("a leader");
    let follower = nodes.iter().find(|n| n.node_id != leader_id).unwrap();
    let out = ddl(follower, R1);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("CREATE REPLICATION"),
        "{}",
        stdout(&out)
    );
    // The node that ran it has applied it already.
    let shown = stdout(&scheme_show(follower, Some("r1")));
    assert!(shown.contains("MASTER n1"), "{shown}");
    for n in &nodes {
        wait_for("r1 on every node", WAIT, || {
            let text = stdout(&scheme_show(n, None));
            (text.contains("CREATE REPLICATION r1") && text.contains("SUBSCRIBER n2")).then_some(())
        });
        let status = n.status();
        let scheme = &cluster(&status)["schemes"][0];
        assert_eq!(scheme["name"], "r1");
        assert_eq!(scheme["elements"][0]["master_store"], "n1");
        assert_eq!(scheme["elements"][0]["epoch"], 0);
    }

    // Invalid DDL: the checker's code, nothing changed.
    let version = cluster(&follower.status())["state_version"].clone();
    let out = follower.cli(&[
        "sql",
        "-e",
        "CREATE REPLICATION r2 ELEMENT e TABLE t MASTER n1 SUBSCRIBER n1",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("error[TT8106]"), "{}", stderr(&out));
    let out = ddl(follower, R1);
    assert_eq!(out.status.code(), Some(1), "a second r1 is refused");
    assert!(stderr(&out).contains("already exists"), "{}", stderr(&out));
    assert!(!scheme_show(follower, Some("r2")).status.success());
    assert_eq!(cluster(&follower.status())["state_version"], version);

    // A node whose store name clashes with a member's is refused and stops.
    std::fs::create_dir_all(d.join("clash")).unwrap();
    let mut clash = start("n2", &d.join("clash"), "127.0.0.1:0", Some(&nodes[0].grpc));
    let exit = clash.wait_exit(WAIT).expect("the clashing node stops");
    assert!(!exit.success(), "the clashing node exits non-zero");
    assert!(clash.log().contains("clashes"), "{}", clash.log());
    assert_eq!(voters(&nodes[0].status()), 3);

    // SIGKILL the leader: another node leads and takes DDL.
    let leader_id = leader(&nodes[0]).expect("a leader");
    let dead = nodes.iter().position(|n| n.node_id == leader_id).unwrap();
    let dead_addr = nodes[dead].grpc.clone();
    nodes[dead].kill9();
    let survivor = nodes.iter().position(|n| n.node_id != leader_id).unwrap();
    let new_leader = wait_for("a new leader", WAIT, || {
        leader(&nodes[survivor]).filter(|&l| l != leader_id)
    });
    assert_ne!(new_leader, leader_id);
    let out = ddl(
        &nodes[survivor],
        "CREATE REPLICATION r3 ELEMENT s SEQUENCE q MASTER n2 SUBSCRIBER n3",
    );
    assert!(out.status.success(), "{}", stderr(&out));

    // The killed node comes back on its data and address and catches up.
    let name = nodes[dead].name.clone();
    let join = nodes[survivor].grpc.clone();
    nodes[dead] = start(
        &name,
        d,
        &dead_addr,
        (name != "n1").then_some(join.as_str()),
    );
    wait_for("the restarted node has r3", WAIT, || {
        stdout(&scheme_show(&nodes[dead], None))
            .contains("CREATE REPLICATION r3")
            .then_some(())
    });

    // SIGTERM everyone, restart everyone on the same data and addresses: state intact.
    let addrs: Vec<(String, String)> = nodes
        .iter()
        .map(|n| (n.name.clone(), n.grpc.clone()))
        .collect();
    for n in &mut nodes {
        let status = n.terminate().expect("stops on SIGTERM");
        assert!(status.success(), "clean exit: {status:?}\n{}", n.log());
    }
    let seed = addrs[0].1.clone();
    nodes = addrs
        .iter()
        .map(|(name, addr)| start(name, d, addr, (name != "n1").then_some(seed.as_str())))
        .collect();
    for n in &nodes {
        wait_for("a leader after the restart", WAIT, || leader(n));
        let text = stdout(&scheme_show(n, None));
        assert!(
            text.contains("CREATE REPLICATION r1") && text.contains("CREATE REPLICATION r3"),
            "{text}"
        );
        assert_eq!(voters(&n.status()), 3);
    }

    // The leader has purged its log behind a snapshot: a fourth node gets the state
    // by snapshot.
    let leader_id = wait_for("a leader", WAIT, || leader(&nodes[0]));
    let lead = nodes.iter().find(|n| n.node_id == leader_id).unwrap();
    let purged = cluster(&lead.status())["purged_index"].as_u64().unwrap();
    assert!(purged > 0, "the leader's log was purged");
    let n4 = start("n4", d, "127.0.0.1:0", Some(&nodes[1].grpc));
    let s4 = wait_for("n4 a voter with the schemes", WAIT, || {
        let s = n4.try_status()?;
        let c = cluster(&s);
        let me = c["nodes"]
            .as_array()?
            .iter()
            .find(|n| n["store"] == "n4")?
            .clone();
        (me["membership"] == "voter" && c["schemes"].as_array()?.len() == 2).then_some(s)
    });
    assert!(
        cluster(&s4)["snapshot_index"].as_u64().unwrap() >= purged,
        "n4 installed a snapshot covering the purged log: {s4}"
    );
    let text = stdout(&scheme_show(&n4, Some("r1")));
    assert!(text.contains("MASTER n1"), "{text}");

    // ALTER and DROP through other nodes; SELF is the store that runs the statement.
    let out = ddl(
        &nodes[2],
        "CREATE REPLICATION r4 ELEMENT x TABLE t4 MASTER SELF SUBSCRIBER n1",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&scheme_show(&nodes[2], Some("r4")));
    assert!(text.contains("MASTER n3"), "{text}");
    let out = ddl(
        &n4,
        "ALTER REPLICATION r1 ADD ELEMENT e2 TABLE t2 MASTER n2 SUBSCRIBER n3",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("ALTER REPLICATION"),
        "{}",
        stdout(&out)
    );
    let text = stdout(&scheme_show(&n4, Some("r1")));
    assert!(text.contains("ELEMENT e2 TABLE t2"), "{text}");
    let out = ddl(&nodes[0], "DROP REPLICATION r4");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!scheme_show(&nodes[0], Some("r4")).status.success());

    // Removal: refused for the master of an element, done for n4.
    let n1_id = nodes[0].node_id.to_string();
    let out = nodes[1].cli(&["node", "remove", "--node-id", &n1_id]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("move the role first"),
        "{}",
        stderr(&out)
    );
    let n4_id = n4.node_id.to_string();
    let out = nodes[2].cli(&["node", "remove", "--node-id", &n4_id]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_for("n4 gone from every member's view", WAIT, || {
        nodes
            .iter()
            .all(|n| {
                let s = n.status();
                cluster(&s)["nodes"].as_array().map(Vec::len) == Some(3) && voters(&s) == 3
            })
            .then_some(())
    });

    let (code, metrics) = common::http_get(&n4.http, "/metrics");
    assert_eq!(code, 200);
    assert!(metrics.contains("hawser_raft_term"), "{metrics}");
    assert!(metrics.contains("hawser_raft_apply_lag"), "{metrics}");
    let (_, metrics) = common::http_get(&lead.http, "/metrics");
    assert!(
        metrics.contains("hawser_raft_rpc_seconds") && metrics.contains("append_entries"),
        "{metrics}"
    );
    assert!(
        metrics.contains("hawser_raft_leader_changes_total"),
        "{metrics}"
    );
}

/// Waits until every node sees three voters; on a timeout the failure shows each
/// node's view and the end of its log (a join that stalls is otherwise a bare timeout).
fn three_voters_everywhere(nodes: &[Node]) {
    for n in nodes {
        if poll_until(WAIT, || (voters(&n.status()) == 3).then_some(())).is_none() {
            let views: Vec<String> = nodes
                .iter()
                .map(|m| {
                    let log = m.log();
                    let tail: Vec<&str> = log.lines().rev().take(30).collect();
                    let tail: Vec<&str> = tail.into_iter().rev().collect();
                    format!(
                        "{}: {} voters seen; log tail:\n{}",
                        m.name,
                        m.try_status().map_or(0, |s| voters(&s)),
                        tail.join("\n")
                    )
                })
                .collect();
            panic!(
                "timed out after {WAIT:?}: {} does not see three voters\n{}",
                n.name,
                views.join("\n\n")
            );
        }
    }
}

/// A free loopback address: bound to port 0 and released, for a node whose address the
/// others must know before it starts.
fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// The way `deploy/k8s/hawser.yaml` forms its cluster: the joining nodes start first,
/// with --join naming every node (themselves too) while no cluster exists yet; the first
/// starts without --join and `hawser init` runs on it (the manifest's Job). All three
/// become voters, and a joiner restarted on its data rejoins as the member it was.
#[test]
fn nodes_joining_through_every_members_address_form_one_cluster_once_the_first_is_initialized() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let addrs: Vec<String> = (0..3).map(|_| free_addr()).collect();
    let every = addrs.join(",");
    let joiner = |i: usize| start(&format!("k{i}"), d, &addrs[i], Some(&every));
    let mut nodes = vec![joiner(1), joiner(2)];
    // Nothing to join yet: they keep trying.
    assert_eq!(voters(&nodes[0].status()), 0);
    let first = start("k0", d, &addrs[0], None);
    let out = first.cli(&["init"]);
    assert!(out.status.success(), "{}", stderr(&out));
    nodes.insert(0, first);
    three_voters_everywhere(&nodes);
    let leader_id = leader(&nodes[0]).expect("a leader");
    assert!(nodes.iter().all(|n| leader(n) == Some(leader_id)));

    // A joiner restarted on its data, with the same list, is the member it was.
    let restarted = nodes[2].node_id;
    nodes[2].kill9();
    nodes[2] = joiner(2);
    assert_eq!(nodes[2].node_id, restarted);
    for n in &nodes {
        wait_for("three voters again", WAIT, || {
            let s = n.status();
            (voters(&s) == 3 && cluster(&s)["leader_id"].as_u64().is_some()).then_some(())
        });
    }
}

/// A node restarted on an empty data directory at a member's address is another node
/// (a new node id): it never adopts the vote or membership meant for the member it
/// replaces. The leader's Raft calls name the member they are for and are refused
/// there, saying so, and the replacement stays uninitialized; once the old member is
/// removed (`--keep-in-schemes`: the new node takes the store's place in the scheme) it
/// joins as a new one.
#[test]
fn a_node_restarted_on_an_empty_data_directory_is_not_taken_for_the_member_it_replaces() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let n1 = start("n1", d, "127.0.0.1:0", None);
    let out = n1.cli(&["init"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let n2 = start("n2", d, "127.0.0.1:0", Some(&n1.grpc));
    let n3 = start("n3", d, "127.0.0.1:0", Some(&n1.grpc));
    let mut nodes = vec![n1, n2, n3];
    three_voters_everywhere(&nodes);
    // n1 masters t, n3 subscribes; ten rows reach n3.
    for n in &nodes {
        let out = n.cli(&[
            "sql",
            "-e",
            "create table t (k bigint primary key, v varchar(20))",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let out = ddl(
        &nodes[0],
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER n1 SUBSCRIBER n3",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let insert = |n: &Node, k: i64| {
        n.cli(&["sql", "-e", &format!("insert into t values ({k}, 'row')")])
            .status
            .success()
    };
    for k in 0..10 {
        wait_for("an insert on the master", WAIT, || {
            insert(&nodes[0], k).then_some(())
        });
    }
    wait_for("ten rows on n3", WAIT, || {
        (rows_of_t(&nodes[2]) == Some(10)).then_some(())
    });
    let (old_id, addr) = (nodes[2].node_id, nodes[2].grpc.clone());
    nodes[2].kill9();
    std::fs::remove_dir_all(d.join("n3")).unwrap();
    // The same name and address on an empty directory, waiting uninitialized as the
    // manifest's first pod does: the leader's calls reach it.
    nodes[2] = start("n3", d, &addr, None);
    let fresh = nodes[2].node_id;
    assert_ne!(fresh, old_id);
    wait_for("the leader's calls refused by the new node", WAIT, || {
        nodes[2]
            .log()
            .contains(&format!(
                "meant for node {old_id}, but this is node {fresh}"
            ))
            .then_some(())
    });
    let st = nodes[2].status();
    assert_eq!(cluster(&st)["initialized"], false, "adopted: {st:#}");
    // The leader still knows the old member only, and not as healthy.
    wait_for("the old member unreachable", WAIT, || {
        let st = nodes[0].try_status()?;
        let members = cluster(&st)["nodes"].as_array()?.clone();
        assert!(
            !members.iter().any(|n| n["id"] == fresh),
            "the new node became a member: {st:#}"
        );
        members
            .iter()
            .any(|n| n["id"] == old_id && n["health"] == "unreachable")
            .then_some(())
    });
    // The documented way: remove the old member, leaving its store in the scheme for
    // the new node (a plain removal is refused: the scheme names n3), and start the
    // new node joining.
    let old = old_id.to_string();
    let out = nodes[0].cli(&["node", "remove", "--node-id", &old]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--keep-in-schemes"),
        "{}",
        stderr(&out)
    );
    let out = nodes[0].cli(&["node", "remove", "--node-id", &old, "--keep-in-schemes"]);
    assert!(out.status.success(), "{}", stderr(&out));
    nodes[2].kill9();
    nodes[2] = start("n3", d, &addr, Some(&nodes[0].grpc));
    assert_eq!(nodes[2].node_id, fresh, "the new node keeps its identity");
    three_voters_everywhere(&nodes);
    // The new n3 is streamed to from the log's start, not from where the old one
    // stood: it gets every row, never "streaming, lag 0" while empty.
    let out = nodes[2].cli(&[
        "sql",
        "-e",
        "create table t (k bigint primary key, v varchar(20))",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_for("ten rows on the new n3", WAIT, || {
        (rows_of_t(&nodes[2]) == Some(10)).then_some(())
    });
}

/// Three identical nodes, each started with `--join` naming all three and `--replace`,
/// as the Kubernetes manifest runs them: `hawser init` on any one of them bootstraps
/// once and never again, and a node restarted on an empty data directory takes the
/// place of its old self by itself, receiving the store's rows.
#[test]
fn identical_nodes_bootstrap_once_and_a_wiped_one_replaces_its_old_self() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Addresses fixed before any node starts: every node's --join names them all.
    let addrs: Vec<String> = (0..3)
        .map(|_| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        })
        .collect();
    let all = addrs.join(",");
    let start_one = |i: usize| {
        let name = format!("n{}", i + 1);
        Node::start_at(
            &name,
            &d.join(&name),
            &addrs[i],
            &[RAFT, &["--join", &all, "--replace"]].concat(),
        )
    };
    let mut nodes: Vec<Node> = (0..3).map(start_one).collect();
    // Any one may bootstrap, and at most one does: init on all three at once (two Jobs
    // racing, and an operator) bootstraps one cluster or none (each refused, saying
    // who else bootstraps); then init on the second node does.
    let outs: Vec<std::process::Output> = std::thread::scope(|s| {
        let runs: Vec<_> = nodes
            .iter()
            .map(|n| s.spawn(move || n.cli(&["init"])))
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let won = outs
        .iter()
        .filter(|o| o.status.success() && stdout(o).contains("initialized a new cluster"))
        .count();
    assert!(won <= 1, "two clusters bootstrapped: {outs:?}");
    // A loser is refused, or (having joined the winner's cluster at once) asked to
    // retry while the new cluster's leader settles.
    for o in outs.iter().filter(|o| !o.status.success()) {
        let e = stderr(o);
        assert!(
            e.contains("bootstrap")
                || e.contains("already belongs to a cluster")
                || e.contains("retry"),
            "{e}"
        );
    }
    if won == 0 {
        wait_for("init on the second node", WAIT, || {
            nodes[1].cli(&["init"]).status.success().then_some(())
        });
    }
    three_voters_everywhere(&nodes);
    // Again, on any node (as a re-run Job would): nothing changed. An uninitialized
    // node whose peers are in a cluster refuses instead (control::bootstrap).
    for n in &nodes {
        let out = n.cli(&["init"]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(stdout(&out).contains("nothing changed"), "{}", stdout(&out));
    }
    // Peers' HTTP addresses are what they advertise, never a wildcard.
    let st = nodes[0].status();
    for n in cluster(&st)["nodes"].as_array().unwrap() {
        assert!(
            n["http"].as_str().unwrap_or("").starts_with("127.0.0.1:"),
            "{st:#}"
        );
    }

    for n in &nodes {
        let out = n.cli(&["sql", "-e", "create table t (k bigint primary key)"]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    ddl(
        &nodes[0],
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER n1 SUBSCRIBER n3",
    );
    for k in 0..10 {
        wait_for("an insert on the master", WAIT, || {
            let out = nodes[0].cli(&["sql", "-e", &format!("insert into t values ({k})")]);
            out.status.success().then_some(())
        });
    }
    wait_for("ten rows on n3", WAIT, || {
        (rows_of_t(&nodes[2]) == Some(10)).then_some(())
    });

    // n3 loses its volume and comes back with the same command line.
    let old_id = nodes[2].node_id;
    nodes[2].kill9();
    std::fs::remove_dir_all(d.join("n3")).unwrap();
    nodes[2] = start_one(2);
    let fresh = nodes[2].node_id;
    assert_ne!(fresh, old_id);
    three_voters_everywhere(&nodes);
    let st = nodes[0].status();
    let ids: Vec<u64> = cluster(&st)["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["id"].as_u64())
        .collect();
    assert!(ids.contains(&fresh) && !ids.contains(&old_id), "{st:#}");
    assert!(
        nodes[0]
            .log()
            .contains("takes the place of the silent member")
            || nodes[1]
                .log()
                .contains("takes the place of the silent member"),
        "the leader did not say it replaced the member"
    );
    let out = nodes[2].cli(&["sql", "-e", "create table t (k bigint primary key)"]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_for("ten rows on the new n3", WAIT, || {
        (rows_of_t(&nodes[2]) == Some(10)).then_some(())
    });
    let out = nodes[0].cli(&["sql", "-e", "insert into t values (10)"]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_for("the next row on the new n3", WAIT, || {
        (rows_of_t(&nodes[2]) == Some(11)).then_some(())
    });
}
