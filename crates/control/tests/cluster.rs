//! In-process clusters: real tonic servers on loopback ports, memory engines, fast Raft
//! timing. Every wait is bounded and waits on a condition.

use std::sync::Arc;
use std::time::Duration;

use hawser_control::{
    ClusterState, Command, ControlConfig, ControlPlane, Learned, PlaneError, RemovalMode,
};
use hawser_core::{Ident, NodeId, QualName};
use hawser_store::{KvEngine, MemEngine};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_stream::wrappers::TcpListenerStream;

const WAIT: Duration = Duration::from_secs(10);

/// Pause between retries of a call refused as retryable (no leader yet): short, so
/// tests stay fast, but not a spin that starves the cluster of the CPU it needs.
async fn retry_backoff() {
    tokio::time::sleep(Duration::from_millis(10)).await;
}

struct TestNode {
    plane: ControlPlane,
    addr: String,
    engine: Arc<dyn KvEngine>,
    stop: Option<oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<()>,
}

impl TestNode {
    async fn start(id: u64, snapshot_every: u64) -> TestNode {
        Self::start_as(id, id, snapshot_every).await
    }

    /// A node with id `id` and store name `store{store}`.
    async fn start_as(id: u64, store: u64, snapshot_every: u64) -> TestNode {
        Self::start_on(id, store, snapshot_every, Arc::new(MemEngine::new())).await
    }

    /// A node on `engine` (a restart keeps its Raft state there).
    async fn start_on(
        id: u64,
        store: u64,
        snapshot_every: u64,
        engine: Arc<dyn KvEngine>,
    ) -> TestNode {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let mut cfg = ControlConfig::new(
            NodeId(id),
            Ident::unquoted(&format!("store{store}")),
            "127.0.0.1",
            addr.clone(),
            format!("127.0.0.1:{}", 18000 + id),
        );
        cfg.heartbeat_interval = Duration::from_millis(50);
        cfg.election_timeout_min = Duration::from_millis(200);
        cfg.election_timeout_max = Duration::from_millis(400);
        cfg.snapshot_every = snapshot_every;
        cfg.max_in_snapshot_log_to_keep = 0;
        let plane = ControlPlane::start(cfg, engine.clone()).await.unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let service = plane.raft_service();
        let server = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        TestNode {
            plane,
            addr,
            engine,
            stop: Some(stop),
            server,
        }
    }

    async fn kill(&mut self) {
        self.plane.shutdown().await.unwrap();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.server).await.unwrap();
    }
}

/// Waits until `pred` holds for the node's applied state.
async fn wait_state(plane: &ControlPlane, what: &str, pred: impl Fn(&ClusterState) -> bool) {
    let mut rx = plane.subscribe();
    let found = tokio::time::timeout(WAIT, async {
        loop {
            if pred(&rx.borrow_and_update()) {
                return;
            }
            rx.changed().await.unwrap();
        }
    })
    .await;
    assert!(found.is_ok(), "timed out waiting for {what}");
}

async fn join_retrying(node: &TestNode, members: &[String]) {
    let joined = tokio::time::timeout(WAIT, async {
        loop {
            match node.plane.join(members).await {
                Ok(reply) => return reply,
                Err(e) if e.is_retryable() => {
                    // Bounded by the outer timeout; back off briefly while a leader
                    // shows up instead of spinning on a core the cluster needs.
                    retry_backoff().await;
                }
                Err(e) => panic!("join refused: {e}"),
            }
        }
    })
    .await
    .expect("join within the deadline");
    assert!(joined.voter);
}

fn scheme_ddl(name: &str) -> Command {
    Command::from_ddl(&format!(
        "CREATE REPLICATION {name} ELEMENT e TABLE t MASTER store1 SUBSCRIBER store2 RETURN TWOSAFE;"
    ))
    .unwrap()
    .remove(0)
}

async fn propose_retrying(plane: &ControlPlane, cmd: Command) -> u64 {
    tokio::time::timeout(WAIT, async {
        loop {
            match plane.propose(cmd.clone()).await {
                Ok(v) => return v,
                Err(e) if e.is_retryable() => retry_backoff().await,
                Err(e) => panic!("proposal failed: {e}"),
            }
        }
    })
    .await
    .expect("proposal within the deadline")
}

async fn three_nodes(snapshot_every: u64) -> Vec<TestNode> {
    let mut nodes = Vec::new();
    for id in 1..=3 {
        nodes.push(TestNode::start(id, snapshot_every).await);
    }
    nodes[0].plane.initialize().await.unwrap();
    // Initializing again is a harmless no-op.
    nodes[0].plane.initialize().await.unwrap();
    let seeds = vec![nodes[0].addr.clone()];
    join_retrying(&nodes[1], &seeds).await;
    // The third node joins through a follower, which forwards to the leader.
    join_retrying(&nodes[2], &[nodes[1].addr.clone()]).await;
    for n in &nodes {
        wait_state(&n.plane, "three registered voters", |s| {
            s.nodes.len() == 3 && s.nodes.values().all(|n| n.voter)
        })
        .await;
    }
    nodes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_form_a_cluster_and_a_follower_proposal_reaches_all() {
    let nodes = three_nodes(1000).await;
    let leader = nodes[0].plane.metrics().leader.expect("a leader");
    let follower = nodes
        .iter()
        .find(|n| n.plane.metrics().node != leader)
        .unwrap();
    let version = propose_retrying(&follower.plane, scheme_ddl("r1")).await;
    for n in &nodes {
        let st = n.plane.wait_for_version(version, WAIT).await.unwrap();
        assert!(st.schemes.contains_key(&QualName::bare("r1")));
    }
    // Bad DDL is refused with the checker's finding and is not retryable.
    let bad = Command::from_ddl(
        "CREATE REPLICATION r2 ELEMENT e TABLE t MASTER store1 SUBSCRIBER store1;",
    )
    .unwrap()
    .remove(0);
    match follower.plane.propose(bad).await {
        Err(PlaneError::Rejected(e)) => assert!(e.to_string().contains("TT8106"), "{e}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // A new node that claims a live member's store name is refused.
    let mut twin = TestNode::start_as(9, 1, 1000).await;
    match twin.plane.join(&[nodes[0].addr.clone()]).await {
        Err(PlaneError::Rejected(e)) => assert!(e.to_string().contains("clashes"), "{e}"),
        other => panic!("expected an identity clash, got {other:?}"),
    }
    twin.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_is_elected_after_the_leader_stops_and_proposals_still_work() {
    let mut nodes = three_nodes(1000).await;
    let version = propose_retrying(&nodes[2].plane, scheme_ddl("before")).await;
    for n in &nodes {
        n.plane.wait_for_version(version, WAIT).await.unwrap();
    }
    let old = nodes[0].plane.metrics().leader.expect("a leader");
    let idx = nodes
        .iter()
        .position(|n| n.plane.metrics().node == old)
        .unwrap();
    nodes[idx].kill().await;
    let survivors: Vec<&TestNode> = nodes
        .iter()
        .filter(|n| n.plane.metrics().node != old)
        .collect();
    for n in &survivors {
        n.plane
            .raft()
            .wait(Some(WAIT))
            .metrics(
                |m| m.current_leader.is_some_and(|l| l != old.0),
                "a new leader",
            )
            .await
            .unwrap();
    }
    let version = propose_retrying(&survivors[0].plane, scheme_ddl("after")).await;
    for n in &survivors {
        let st = n.plane.wait_for_version(version, WAIT).await.unwrap();
        assert!(st.schemes.contains_key(&QualName::bare("after")));
        assert!(st.schemes.contains_key(&QualName::bare("before")));
    }
    for n in nodes.iter_mut().filter(|n| n.plane.metrics().node != old) {
        n.kill().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joining_after_the_log_was_purged_receives_a_snapshot() {
    // A snapshot every 3 entries and no log kept behind it.
    let mut nodes = three_nodes(3).await;
    let mut version = 0;
    for i in 0..8 {
        version = propose_retrying(&nodes[1].plane, scheme_ddl(&format!("s{i}"))).await;
    }
    let leader = nodes[0].plane.metrics().leader.unwrap();
    let leader_node = nodes
        .iter()
        .find(|n| n.plane.metrics().node == leader)
        .unwrap();
    leader_node
        .plane
        .raft()
        .wait(Some(WAIT))
        .metrics(|m| m.purged.is_some_and(|p| p.index > 3), "the log purged")
        .await
        .unwrap();
    let fourth = TestNode::start(4, 3).await;
    join_retrying(&fourth, &[nodes[2].addr.clone()]).await;
    let st = fourth.plane.wait_for_version(version, WAIT).await.unwrap();
    assert_eq!(st.schemes.len(), 8);
    // The snapshot brings the schemes; the entry that adds this node to the members may
    // be applied a moment later (seen under a CPU hog): waited for, bounded.
    let mut states = fourth.plane.subscribe();
    let joined = tokio::time::timeout(
        WAIT,
        states.wait_for(|st| st.nodes.contains_key(&NodeId(4))),
    )
    .await;
    assert!(
        matches!(joined, Ok(Ok(_))),
        "node 4 never saw itself among the members: {:?}",
        fourth.plane.state().nodes.keys().collect::<Vec<_>>()
    );
    // Raft's metrics follow the installed snapshot a moment after the state machine
    // has it: waited for (bounded), not read once.
    let installed = fourth
        .plane
        .raft()
        .wait(Some(WAIT))
        .metrics(|m| m.snapshot.is_some(), "a snapshot installed")
        .await;
    assert!(
        installed.is_ok(),
        "the fourth node was brought up by a snapshot: {:?}",
        fourth.plane.metrics()
    );
    nodes.push(fourth);
    for n in &mut nodes {
        n.kill().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_on_its_sled_directory_keeps_its_identity_and_state() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ControlConfig::new(
        NodeId(1),
        Ident::unquoted("store1"),
        "127.0.0.1",
        "127.0.0.1:1",
        "127.0.0.1:2",
    );
    let version = {
        let engine: Arc<dyn KvEngine> =
            Arc::new(hawser_store::SledEngine::open(dir.path()).unwrap());
        let plane = ControlPlane::start(cfg.clone(), engine).await.unwrap();
        plane.initialize().await.unwrap();
        let v = propose_retrying(&plane, scheme_ddl("kept")).await;
        plane.shutdown().await.unwrap();
        v
    };
    // openraft's state-machine task lets go of the engine (and so of sled's directory
    // lock) shortly after shutdown returns: poll the open, bounded by the deadline.
    let engine: Arc<dyn KvEngine> = tokio::time::timeout(WAIT, async {
        loop {
            match hawser_store::SledEngine::open(dir.path()) {
                Ok(engine) => return Arc::new(engine),
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    })
    .await
    .expect("the sled directory is released after shutdown");
    let plane = ControlPlane::start(cfg, engine).await.unwrap();
    let st = plane.state();
    assert!(st.version >= version);
    assert!(st.schemes.contains_key(&QualName::bare("kept")));
    assert_eq!(st.nodes[&NodeId(1)].store.as_str(), "store1");
    // Still a one-voter cluster: it elects itself and takes proposals, no init needed.
    let v = propose_retrying(&plane, scheme_ddl("after_restart")).await;
    assert!(v > version);
    plane.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_join_as_voters_up_to_five_and_as_learners_after() {
    let mut nodes = Vec::new();
    for id in 1..=6 {
        nodes.push(TestNode::start(id, 1000).await);
    }
    nodes[0].plane.initialize().await.unwrap();
    let seeds = vec![nodes[0].addr.clone()];
    for n in &nodes[1..5] {
        join_retrying(n, &seeds).await;
    }
    let sixth = tokio::time::timeout(WAIT, async {
        loop {
            match nodes[5].plane.join(&seeds).await {
                Ok(reply) => return reply,
                Err(e) if e.is_retryable() => retry_backoff().await,
                Err(e) => panic!("join refused: {e}"),
            }
        }
    })
    .await
    .expect("the sixth node joins within the deadline");
    assert!(!sixth.voter, "a sixth member joins as a learner");
    wait_state(&nodes[0].plane, "five voters and one learner", |s| {
        s.nodes.len() == 6 && s.nodes.values().filter(|n| n.voter).count() == 5
    })
    .await;
    let learner = &nodes[0].plane.state().nodes[&NodeId(6)];
    assert!(!learner.voter);
    for n in &mut nodes {
        n.kill().await;
    }
}

/// Removes `id` through `plane`, retrying while the cluster has no leader.
async fn remove_retrying(plane: &ControlPlane, id: u64, mode: RemovalMode) {
    tokio::time::timeout(WAIT, async {
        loop {
            match plane.remove_node(NodeId(id), mode).await {
                Ok(_) => return,
                Err(e) if e.is_retryable() => retry_backoff().await,
                Err(e) => panic!("removal failed: {e}"),
            }
        }
    })
    .await
    .expect("removal within the deadline")
}

/// Waits until `node` knows it was removed; returns how it learned it.
async fn wait_removed(node: &TestNode) -> Learned {
    let mut rx = node.plane.removal_watch();
    let removal = tokio::time::timeout(WAIT, rx.wait_for(Option::is_some))
        .await
        .expect("the node learns it was removed")
        .unwrap()
        .clone()
        .unwrap();
    removal.learned
}

/// Waits until `plane` has applied a membership of exactly `voters`.
async fn wait_voters(plane: &ControlPlane, voters: &[u64]) {
    let want: std::collections::BTreeSet<NodeId> = voters.iter().copied().map(NodeId).collect();
    plane
        .raft()
        .wait(Some(WAIT))
        .metrics(
            |m| {
                let got: std::collections::BTreeSet<NodeId> = m
                    .membership_config
                    .membership()
                    .voter_ids()
                    .map(NodeId)
                    .collect();
                got == want && m.membership_config.membership().learner_ids().count() == 0
            },
            "the membership without the removed node",
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_node_that_is_up_learns_it_and_refuses_to_propose() {
    let mut nodes = three_nodes(1000).await;
    let leader = nodes[0].plane.metrics().leader.expect("a leader").0;
    let gone = nodes
        .iter()
        .position(|n| n.plane.metrics().node.0 != leader)
        .unwrap();
    let gone_id = nodes[gone].plane.metrics().node.0;
    let other = nodes
        .iter()
        .position(|n| ![leader, gone_id].contains(&n.plane.metrics().node.0))
        .unwrap();
    // Through the third node: the request goes to the leader.
    remove_retrying(&nodes[other].plane, gone_id, RemovalMode::Refuse).await;
    let learned = wait_removed(&nodes[gone]).await;
    // Up and a member when the entry committed, it applied it (or the leader's word
    // came first).
    assert!(
        matches!(learned, Learned::Applied | Learned::Told { .. }),
        "{learned:?}"
    );
    let removal = nodes[gone].plane.removal().unwrap();
    assert!(
        removal.log_index > 0 && removal.at_unix_ms > 0,
        "{removal:?}"
    );
    assert_eq!(removal.cluster_id, nodes[0].plane.state().cluster_id);
    let rest: Vec<u64> = [leader, nodes[other].plane.metrics().node.0].into();
    for n in nodes.iter().filter(|n| n.plane.metrics().node.0 != gone_id) {
        wait_voters(&n.plane, &rest).await;
        assert!(n.plane.state().removed.contains_key(&NodeId(gone_id)));
        assert!(n.plane.removal().is_none());
    }
    match nodes[gone].plane.propose(scheme_ddl("late")).await {
        Err(PlaneError::Removed(r)) => assert_eq!(r.node, NodeId(gone_id)),
        other => panic!("expected the removal, got {other:?}"),
    }
    // The two left still commit.
    let v = propose_retrying(&nodes[other].plane, scheme_ddl("after")).await;
    nodes[leader_index(&nodes, leader)]
        .plane
        .wait_for_version(v, WAIT)
        .await
        .unwrap();
    for n in &mut nodes {
        n.kill().await;
    }
}

fn leader_index(nodes: &[TestNode], leader: u64) -> usize {
    nodes
        .iter()
        .position(|n| n.plane.metrics().node.0 == leader)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_removed_while_down_learns_it_from_its_refused_vote_and_never_campaigns_again() {
    let mut nodes = three_nodes(1000).await;
    let leader = nodes[0].plane.metrics().leader.expect("a leader").0;
    let gone = nodes
        .iter()
        .position(|n| n.plane.metrics().node.0 != leader)
        .unwrap();
    let gone_id = nodes[gone].plane.metrics().node.0;
    let engine = nodes[gone].engine.clone();
    nodes[gone].kill().await;
    let li = leader_index(&nodes, leader);
    remove_retrying(&nodes[li].plane, gone_id, RemovalMode::Refuse).await;
    // Back on its Raft state, it still thinks itself a voter of three, and campaigns:
    // the members refuse its vote, saying it was removed.
    nodes[gone] = TestNode::start_on(gone_id, gone_id, 1000, engine.clone()).await;
    let learned = wait_removed(&nodes[gone]).await;
    assert!(matches!(learned, Learned::Refused { .. }), "{learned:?}");
    // Elections are off from then on: its term stays where it is.
    let term = nodes[gone].plane.metrics().term;
    let campaigned = nodes[gone]
        .plane
        .raft()
        .wait(Some(Duration::from_millis(1500)))
        .metrics(|m| m.current_term > term, "another election")
        .await;
    assert!(campaigned.is_err(), "a removed node campaigned again");
    // And so after a restart: the record is read before Raft starts.
    nodes[gone].kill().await;
    nodes[gone] = TestNode::start_on(gone_id, gone_id, 1000, engine).await;
    let removal = nodes[gone]
        .plane
        .removal()
        .expect("kept across the restart");
    assert!(matches!(removal.learned, Learned::Refused { .. }));
    // Raft's metrics start at term 0 and show the stored vote once it runs.
    let started = nodes[gone]
        .plane
        .raft()
        .wait(Some(WAIT))
        .metrics(|m| m.last_applied.is_some(), "Raft running on its log")
        .await
        .unwrap();
    let term = started.current_term;
    let campaigned = nodes[gone]
        .plane
        .raft()
        .wait(Some(Duration::from_millis(1500)))
        .metrics(|m| m.current_term > term, "an election")
        .await;
    assert!(
        campaigned.is_err(),
        "a removed node campaigned after a restart (term {term}): {campaigned:?}"
    );
    match nodes[gone].plane.join(&[nodes[li].addr.clone()]).await {
        Err(PlaneError::Removed(_)) => {}
        other => panic!("a removed node may not join again: {other:?}"),
    }
    for n in &mut nodes {
        n.kill().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_removing_itself_hands_over_and_learns_it() {
    let mut nodes = three_nodes(1000).await;
    let leader = nodes[0].plane.metrics().leader.expect("a leader").0;
    let li = leader_index(&nodes, leader);
    remove_retrying(&nodes[li].plane, leader, RemovalMode::Refuse).await;
    wait_removed(&nodes[li]).await;
    let rest: Vec<u64> = nodes
        .iter()
        .map(|n| n.plane.metrics().node.0)
        .filter(|&id| id != leader)
        .collect();
    for n in nodes.iter().filter(|n| n.plane.metrics().node.0 != leader) {
        wait_voters(&n.plane, &rest).await;
        n.plane
            .raft()
            .wait(Some(WAIT))
            .metrics(
                |m| m.current_leader.is_some_and(|l| l != leader),
                "a new leader",
            )
            .await
            .unwrap();
    }
    let survivor = nodes
        .iter()
        .position(|n| n.plane.metrics().node.0 != leader)
        .unwrap();
    propose_retrying(&nodes[survivor].plane, scheme_ddl("after")).await;
    for n in &mut nodes {
        n.kill().await;
    }
}

/// A whole snapshot whose bytes are no cluster state, sent to a follower with the
/// leader's own vote: refused before openraft installs it (an error there is fatal to
/// openraft, and the node's control plane would stop for good), and the follower goes
/// on applying what the leader commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_of_garbage_is_refused_and_the_follower_keeps_working() {
    use hawser_control::network::{CLUSTER, FROM_NODE, TO_NODE};
    use hawser_control::pb::{raft_peer_client::RaftPeerClient, Payload};

    let nodes = three_nodes(1000).await;
    let leader = nodes[0].plane.metrics().leader.expect("a leader");
    let follower = nodes
        .iter()
        .find(|n| n.plane.metrics().node != leader)
        .unwrap();
    let me = follower.plane.metrics().node.0;
    let vote = follower.plane.raft_metrics().borrow().vote;
    let cluster = follower.plane.state().cluster_id;
    let mut client = RaftPeerClient::connect(format!("http://{}", follower.addr))
        .await
        .unwrap();
    let chunk = |snapshot_id: &str, offset: u64, data: &[u8], done: bool| {
        let rpc = serde_json::json!({
            "vote": vote,
            "meta": {"last_log_id": null,
                     "last_membership": {"log_id": null, "membership": {"configs": [], "nodes": {}}},
                     "snapshot_id": snapshot_id},
            "offset": offset, "data": data, "done": done,
        });
        let mut req = tonic::Request::new(Payload {
            json: serde_json::to_vec(&rpc).unwrap(),
        });
        for (k, v) in [(FROM_NODE, leader.0), (TO_NODE, me), (CLUSTER, cluster)] {
            req.metadata_mut().insert(k, v.to_string().parse().unwrap());
        }
        req
    };
    // In one chunk, and in two.
    let status = client
        .install_snapshot(chunk("junk-1", 0, b"not json", true))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("not a cluster state"),
        "{status:?}"
    );
    client
        .install_snapshot(chunk("junk-2", 0, b"{\"nodes\":", false))
        .await
        .unwrap();
    let status = client
        .install_snapshot(chunk("junk-2", 9, b"42}", true))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");

    // Still a working member: it applies what is committed after.
    let version = propose_retrying(&nodes[0].plane, scheme_ddl("after_junk")).await;
    let st = follower
        .plane
        .wait_for_version(version, WAIT)
        .await
        .unwrap();
    assert!(st.schemes.contains_key(&QualName::bare("after_junk")));
    assert!(follower.plane.raft_metrics().borrow().running_state.is_ok());
}
