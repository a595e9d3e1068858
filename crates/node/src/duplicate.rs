//! Duplicate: rebuild what this node receives in a scheme from another store
//! (`hawser duplicate`, TimesTen's `ttRepAdmin -duplicate`; docs/stream.md, "Duplicate").
//!
//! ```text
//!  checks: receiver STOP/FAILED, no origin or table shared with another scheme into
//!  this store, relays nothing ─► Copy from the source
//!   CopyStart(lsn, marks) ─► marks not above ours? ─► per table: merge each chunk,
//!   trim past the last ─► CopyEnd ─► raise marks to the copy's, in-order window to
//!   its end marks ─► receiver state START ─► streams resume
//! ```
//!
//! The copy is fuzzy (the source keeps committing); the streams resume from the copy's
//! point and the apply's exception rules make the overlap converge (see
//! `hawser_store::copy`). Not atomic: a failure leaves the receiver stopped and the
//! tables partly copied, and running the duplicate again starts over.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use hawser_control::state::ReceiverState;
use hawser_control::ClusterState;
use hawser_core::{Epoch, Ident, NodeId, QualName, Row, TableDef, Value};
use hawser_proto::v1;
use hawser_scheme::ast::{OwnerRole, StoreName};
use hawser_scheme::route::ResolvedTarget;
use hawser_store::CopyCursor;
use hawser_stream::copy::{decode_rows, from_pb};
use hawser_stream::pb as peer;
use hawser_target::Initial;
use tokio::sync::mpsc;
use tonic::Status;
use tracing::{info, warn};

use crate::NodeState;

/// How long a duplicate waits for this node to see its receiver stopped.
const STATE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The largest copy message accepted from the source.
const MAX_CHUNK_BYTES: usize = 64 * 1024 * 1024;

type Progress = mpsc::Sender<Result<v1::DuplicateProgress, Status>>;

/// What a duplicate copies, and from where.
struct Target {
    /// The store's receiver state in the scheme: STOP or FAILED to go on.
    receiver_state: ReceiverState,
    scheme: QualName,
    from: Ident,
    from_addr: String,
    tables: Vec<QualName>,
    /// The tables this store keeps as another target than a plain copy: the target,
    /// the node of the table's origin and the element's failover era (for a CCD's
    /// initial rows).
    targets: BTreeMap<QualName, (ResolvedTarget, Option<NodeId>, Epoch)>,
    /// The origins whose transactions the scheme brings this store: only their marks
    /// are checked and raised (another scheme may bring others). `None` when the plan
    /// here names none (a DATASTORE element this node lacks the tables of): every mark
    /// the source sends then counts, and no other scheme may bring this store anything.
    origins: Option<BTreeSet<NodeId>>,
}

impl Target {
    /// `marks` kept to the scheme's origins.
    fn own(&self, marks: BTreeMap<NodeId, u64>) -> BTreeMap<NodeId, u64> {
        match &self.origins {
            Some(origins) => marks
                .into_iter()
                .filter(|(o, _)| origins.contains(o))
                .collect(),
            None => marks,
        }
    }
}

/// How long an automatic rebuild that failed waits before it is tried again.
const REBUILD_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// Rebuilds this store in each scheme `wanted` names (the data plane names those where
/// it holds commits past a failover's fork point that its log no longer shows: no
/// other way to tell them apart from what the cluster agreed on): its receiver
/// stopped, a duplicate from the master that keeps every row it replaces in
/// `hawser_lost`, the receiver started again. A failure is logged and tried again
/// while the scheme is still wanted.
pub(crate) async fn auto_rebuild(
    state: Arc<NodeState>,
    mut wanted: tokio::sync::watch::Receiver<BTreeSet<QualName>>,
) {
    let store = state.config.name.clone();
    loop {
        let schemes = wanted.borrow_and_update().clone();
        for scheme in &schemes {
            let name = scheme.to_string();
            warn!(
                scheme = %name,
                "this store holds commits past a failover's fork point that its log no \
                 longer shows: rebuilding it from the master, keeping every row the copy \
                 replaces in hawser_lost"
            );
            if let Err(s) =
                crate::cluster::set_receiver_state(&state.plane, &name, &store, "stop").await
            {
                warn!(scheme = %name, error = %s.message(), "cannot stop this store's receiver to rebuild it");
                continue;
            }
            let (tx, mut rx) = mpsc::channel(16);
            let last = tokio::spawn(async move {
                let mut last = None;
                while let Some(Ok(p)) = rx.recv().await {
                    last = Some(p);
                }
                last
            });
            let result = run(state.clone(), name.clone(), String::new(), true, tx).await;
            let last: Option<v1::DuplicateProgress> = last.await.ok().flatten();
            match result {
                Ok(()) => warn!(
                    scheme = %name,
                    rows = last.as_ref().map_or(0, |p| p.rows),
                    kept = last.as_ref().map_or(0, |p| p.rows_kept),
                    rebuild = last.as_ref().map_or(0, |p| p.rebuild),
                    "rebuilt from the master; the rows it replaced are in hawser_lost \
                     (origin 0, seq = rebuild)"
                ),
                Err(s) => {
                    warn!(scheme = %name, error = %s.message(), "the rebuild failed; it is tried again")
                }
            }
        }
        let retry = tokio::time::sleep(REBUILD_RETRY);
        tokio::select! {
            _ = state.shutdown.cancelled() => return,
            changed = wanted.changed() => if changed.is_err() { return },
            _ = retry, if !schemes.is_empty() => {}
        }
    }
}

/// Runs a duplicate of `scheme` (empty: the one this store receives in) from `from`
/// (empty: the tables' master), reporting progress on `tx`. With `keep_replaced`,
/// every row of this node the copy replaces or removes is kept in `hawser_lost` first
/// ([`hawser_store::KeepReplaced`]).
pub(crate) async fn run(
    state: Arc<NodeState>,
    scheme: String,
    from: String,
    keep_replaced: bool,
    tx: Progress,
) -> Result<(), Status> {
    let Ok(_one_at_a_time) = state.duplicating.try_lock() else {
        return Err(Status::failed_precondition(
            "a duplicate is already running on this node; wait for it to end",
        ));
    };
    // 1 while this store is being rebuilt from another (alert HawserSubscriberRebuilding);
    // back to 0 however the duplicate ends.
    metrics::gauge!("hawser_duplicate_running").set(1.0);
    let _running = DuplicateRunning;
    let store = Ident::unquoted(&state.config.name);
    // `hawser receiver ... --state stop` returns once the leader applied it; this node
    // may apply it a moment later.
    let mut cluster = state.plane.subscribe();
    let deadline = tokio::time::Instant::now() + STATE_WAIT;
    // So may a node that just started (or restarted) apply the scheme itself.
    let target = loop {
        let now = cluster.borrow_and_update().clone();
        let planned = plan(&state, &now, scheme.trim(), from.trim());
        if let Ok(target) = &planned {
            if matches!(
                target.receiver_state,
                ReceiverState::Stop | ReceiverState::Failed
            ) {
                break planned?;
            }
        }
        if !matches!(
            tokio::time::timeout_at(deadline, cluster.changed()).await,
            Ok(Ok(()))
        ) {
            let target = planned?;
            let (scheme, st) = (&target.scheme, target.receiver_state);
            let st = format!("{st:?}").to_uppercase();
            return Err(Status::failed_precondition(format!(
                "{store}'s receiver state in scheme {scheme} is {st}: set it to stop first \
                 (hawser receiver --scheme {scheme} --subscriber {store} --state stop), so \
                 that no stream applies while the tables are copied"
            )));
        }
    };
    info!(scheme = %target.scheme, from = %target.from, tables = target.tables.len(), "duplicate starts");
    let endpoint = hawser_tls::endpoint(&target.from_addr, state.peer_tls.as_ref())
        .map_err(|e| Status::internal(format!("bad address of {}: {e}", target.from)))?;
    let channel = endpoint.connect().await.map_err(|e| {
        Status::unavailable(format!(
            "cannot reach {} at {}: {e}",
            target.from, target.from_addr
        ))
    })?;
    // A chunk is about a MiB of rows before compression; a row may be larger.
    let mut client = peer::replication_client::ReplicationClient::new(channel)
        .max_decoding_message_size(MAX_CHUNK_BYTES);
    let request = peer::CopyRequest {
        protocol_version: hawser_stream::PROTOCOL_VERSION,
        receiver_store: store.to_string(),
        receiver_node: state.node_id.0,
        tables: target.tables.iter().map(|t| t.to_string()).collect(),
        codec: peer::Codec::Lz4 as i32,
        scheme: target.scheme.to_string(),
    };
    let from = target.from.to_string();
    let mut inbound = client
        .copy(request)
        .await
        .map_err(|s| Status::new(s.code(), format!("{from}: {}", s.message())))?
        .into_inner();
    let mut progress = v1::DuplicateProgress {
        from: from.clone(),
        tables: target.tables.iter().map(|t| t.to_string()).collect(),
        ..Default::default()
    };
    let db = &state.db;
    let mut keep = match keep_replaced {
        true => Some(db.keep_replaced().await.map_err(|e| {
            Status::internal(format!("cannot keep the rows the copy replaces: {e}"))
        })?),
        false => None,
    };
    progress.rebuild = keep.as_ref().map_or(0, |k| k.rebuild());
    let mut point = None;
    let mut current: Option<Writing> = None;
    // The copy's time: a POINT IN TIME or CCD row's IBMSNAP_LOGMARKER.
    let copy_micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
    let end_marks = loop {
        let msg = inbound
            .message()
            .await
            .map_err(|s| Status::new(s.code(), format!("{from}: {}", s.message())))?
            .ok_or_else(|| {
                Status::unavailable(format!(
                    "{from} ended the copy before its end; run it again"
                ))
            })?;
        match msg.msg {
            Some(peer::copy_message::Msg::Start(start)) => {
                let marks = target.own(from_pb(&start.marks));
                if keep.is_some() {
                    // What this store holds past the source is what the copy is to keep
                    // (commits a failover forked off): said, not refused.
                    if let Err(ahead) = check_marks(&state, &marks, target.origins.as_ref()) {
                        warn!(reason = %ahead.message(), "rebuilding a store ahead of its source; the rows the copy replaces are kept in hawser_lost");
                    }
                } else {
                    check_marks(&state, &marks, target.origins.as_ref())?;
                }
                if !start.tables.is_empty() || !start.sequences.is_empty() {
                    progress.tables = start.tables.clone();
                    progress.sequences = start.sequences.clone();
                } else if target.tables.is_empty() {
                    // A source that predates CopyRequest.scheme copies what was
                    // named: nothing.
                    return Err(Status::failed_precondition(format!(
                        "{from} does not name the tables it copies (an older build), and \
                         {store} has none of the tables scheme {} routes to it: create them \
                         here and run the duplicate again",
                        target.scheme
                    )));
                }
                progress.copy_lsn = start.lsn;
                progress.rows_estimate = start.rows_estimate;
                point = Some(marks);
                send(&tx, &progress).await?;
            }
            Some(peer::copy_message::Msg::Rows(rows)) => {
                if point.is_none() {
                    return Err(Status::internal(format!(
                        "{from} sent rows before the copy's start"
                    )));
                }
                let chunk = decode_rows(&rows)
                    .map_err(|e| Status::internal(format!("a copy chunk from {from}: {e}")))?;
                if let Some((def, restart_at)) = chunk.sequence {
                    finish_table(db, current.take(), keep.as_mut(), &mut progress).await?;
                    let name = def.name.clone();
                    let created = db.copy_sequence(def, restart_at).await.map_err(|e| {
                        Status::internal(format!("setting sequence {name} as {from} has it: {e}"))
                    })?;
                    progress.sequences_created += u32::from(created);
                    progress.table.clear();
                    send(&tx, &progress).await?;
                    continue;
                }
                if let Some(def) = chunk.definition {
                    finish_table(db, current.take(), keep.as_mut(), &mut progress).await?;
                    progress.table = def.name.to_string();
                    let marks = point.as_ref().cloned().unwrap_or_default();
                    let kept_as = target.targets.get(&def.name);
                    current = Some(
                        Writing::start(db, def, kept_as, &marks, copy_micros, &from, &mut progress)
                            .await?,
                    );
                }
                let Some(writing) = &mut current else {
                    return Err(Status::internal(format!("{from} sent rows before a table")));
                };
                if chunk.table.as_ref().is_some_and(|t| *t != writing.source) {
                    return Err(Status::internal(format!(
                        "{from} sent rows of another table than {}",
                        writing.source
                    )));
                }
                let count = chunk.rows.len() as u64;
                let table = writing.table.clone();
                let merged = writing
                    .write(db, chunk.rows, keep.as_mut())
                    .await
                    .map_err(|e| Status::internal(format!("writing rows of {table}: {e}")))?;
                progress.rows += count;
                progress.rows_written += merged.written;
                progress.rows_unchanged += merged.unchanged;
                progress.rows_deleted += merged.deleted;
                progress.rows_kept = keep.as_ref().map_or(0, |k| k.kept);
                send(&tx, &progress).await?;
            }
            Some(peer::copy_message::Msg::End(end)) => {
                finish_table(db, current.take(), keep.as_mut(), &mut progress).await?;
                if end.rows != progress.rows {
                    return Err(Status::internal(format!(
                        "{from} says it sent {} rows; {} came",
                        end.rows, progress.rows
                    )));
                }
                break target.own(from_pb(&end.marks));
            }
            None => {
                return Err(Status::internal(format!(
                    "an empty copy message from {from}"
                )))
            }
        }
    };
    let marks = point.unwrap_or_default();
    db.copy_marks(&marks, &end_marks)
        .await
        .map_err(|e| Status::internal(format!("raising the marks: {e}")))?;
    // The copies BASE AGGREGATE targets are computed from changed without applies.
    db.refresh_aggregates()
        .await
        .map_err(|e| Status::internal(format!("bringing the aggregate tables up to date: {e}")))?;
    let names: BTreeMap<NodeId, String> = state
        .plane
        .state()
        .nodes
        .values()
        .map(|n| (n.id, n.store.to_string()))
        .collect();
    progress.marks = marks
        .iter()
        .filter(|(o, _)| **o != state.node_id)
        .map(|(o, s)| (names.get(o).cloned().unwrap_or_else(|| o.0.to_string()), *s))
        .collect();
    crate::cluster::set_receiver_state(
        &state.plane,
        &target.scheme.to_string(),
        store.as_str(),
        "start",
    )
    .await
    .map_err(|s| {
        Status::new(
            s.code(),
            format!(
                "the tables are copied, but setting the receiver state to START failed: {}; \
                 set it with hawser receiver",
                s.message()
            ),
        )
    })?;
    progress.table.clear();
    progress.done = true;
    info!(rows = progress.rows, "duplicate done; receiver state START");
    send(&tx, &progress).await
}

/// Ends a table's copy: deletes this node's rows past the last key copied.
/// Sets `hawser_duplicate_running` back to 0 when a duplicate ends, by any path.
struct DuplicateRunning;

impl Drop for DuplicateRunning {
    fn drop(&mut self) {
        metrics::gauge!("hawser_duplicate_running").set(0.0);
    }
}

async fn finish_table(
    db: &hawser_store::Database,
    current: Option<Writing>,
    mut keep: Option<&mut hawser_store::KeepReplaced>,
    progress: &mut v1::DuplicateProgress,
) -> Result<(), Status> {
    let Some(writing) = current else {
        return Ok(());
    };
    if let How::Merge { cursor, .. } = &writing.how {
        let table = &writing.table;
        progress.rows_deleted += db
            .copy_trim_keeping(table, cursor, keep.as_deref_mut())
            .await
            .map_err(|e| Status::internal(format!("deleting rows of {table}: {e}")))?;
    }
    progress.tables_done += 1;
    progress.rows_kept = keep.map_or(0, |k| k.kept);
    Ok(())
}

/// Where a copied table's rows go (docs/targets.md, "Duplicate").
struct Writing {
    /// The source table the rows are of.
    source: QualName,
    /// The table written.
    table: QualName,
    how: How,
}

enum How {
    /// Merged by key into `table` (a plain copy through this store's columns, or a
    /// target table with the source's key), the rest trimmed at the table's end.
    Merge {
        map: Option<ColumnMap>,
        /// A target table's: its target and the copy's time.
        target: Option<(ResolvedTarget, i64)>,
        cursor: CopyCursor,
    },
    /// A CCD COMPLETE: each row as an insert at the copy point, where absent.
    Add {
        target: ResolvedTarget,
        commit_seq: Vec<u8>,
        copy_micros: i64,
        done: usize,
    },
    /// Not kept here (CCD NONCOMPLETE, CHANGE AGGREGATE).
    Skip,
}

impl Writing {
    /// Where `def`'s rows go, `target` being this store's target of it; creates the
    /// table written when it is missing.
    async fn start(
        db: &hawser_store::Database,
        def: TableDef,
        target: Option<&(ResolvedTarget, Option<NodeId>, Epoch)>,
        marks: &BTreeMap<NodeId, u64>,
        copy_micros: i64,
        from: &str,
        progress: &mut v1::DuplicateProgress,
    ) -> Result<Writing, Status> {
        let source = def.name.clone();
        let initial = match target {
            None => Initial::Copy,
            Some((t, _, _)) => hawser_target::initial(&def, t)
                .map_err(|e| Status::failed_precondition(e.to_string()))?,
        };
        let (table, created) = match &initial {
            Initial::Skip => {
                return Ok(Writing {
                    table: source.clone(),
                    source,
                    how: How::Skip,
                })
            }
            Initial::Copy => (source.clone(), def.clone()),
            Initial::Into { def: shaped, .. } => (shaped.name.clone(), shaped.clone()),
        };
        match db.table(&table) {
            // A subscriber seeded by its first duplicate: the table as the source has
            // it, or as its target needs it.
            None => {
                db.create_table(created.clone()).await.map_err(|e| {
                    Status::internal(format!("creating {table} as {from} has it: {e}"))
                })?;
                progress.tables_created += 1;
            }
            Some(here) if !matches!(initial, Initial::Copy) => {
                hawser_target::check_shape(&here, &created)
                    .map_err(|e| Status::failed_precondition(e.to_string()))?;
            }
            Some(_) => {}
        }
        let how = match (initial, target) {
            (Initial::Into { replace: false, .. }, Some((t, origin, era))) => {
                let seq = origin.and_then(|o| marks.get(&o)).copied().unwrap_or(0);
                How::Add {
                    target: t.clone(),
                    commit_seq: hawser_target::commit_seq(*era, seq),
                    copy_micros,
                    done: 0,
                }
            }
            (Initial::Into { .. }, Some((t, _, _))) => How::Merge {
                map: None,
                target: Some((t.clone(), copy_micros)),
                cursor: CopyCursor::default(),
            },
            _ => How::Merge {
                map: Some(ColumnMap::new(db, &def, from)?),
                target: None,
                cursor: CopyCursor::default(),
            },
        };
        Ok(Writing { source, table, how })
    }

    /// Writes a chunk of the source's rows.
    async fn write(
        &mut self,
        db: &hawser_store::Database,
        rows: Vec<Row>,
        keep: Option<&mut hawser_store::KeepReplaced>,
    ) -> Result<hawser_store::MergeCounts, hawser_store::StoreError> {
        match &mut self.how {
            How::Skip => Ok(hawser_store::MergeCounts::default()),
            How::Merge {
                map,
                target,
                cursor,
            } => {
                let rows: Vec<Row> = match (map, target) {
                    (Some(map), _) => rows.into_iter().map(|r| map.apply(r)).collect(),
                    (None, Some((t, micros))) => {
                        hawser_target::initial_rows(t, rows, &[], *micros, 0)
                    }
                    (None, None) => rows,
                };
                db.copy_merge_keeping(&self.table, rows, cursor, keep).await
            }
            How::Add {
                target,
                commit_seq,
                copy_micros,
                done,
            } => {
                let n = rows.len();
                let rows =
                    hawser_target::initial_rows(target, rows, commit_seq, *copy_micros, *done);
                *done += n;
                db.copy_insert_absent(&self.table, rows).await
            }
        }
    }
}

async fn send(tx: &Progress, p: &v1::DuplicateProgress) -> Result<(), Status> {
    tx.send(Ok(p.clone()))
        .await
        .map_err(|_| Status::cancelled("the client went away"))
}

/// Works out what to copy and checks that a duplicate can do it.
///
/// The schemes this store receives in come from the elements as written: a DATASTORE
/// element's tables are planned from its master's catalog as the master last reported it
/// plus this node's own tables (`cluster::topology`), which may lag the master. The
/// source then names the tables (`CopyRequest.scheme`); the ones planned here are what
/// a source that predates that copies.
fn plan(
    state: &NodeState,
    cluster: &ClusterState,
    scheme: &str,
    from: &str,
) -> Result<Target, Status> {
    let store = Ident::unquoted(&state.config.name);
    let me = StoreName::Named(store.clone());
    let (topology, _) = crate::dataplane::local_topology(cluster, &state.db, &store);
    // Per scheme this store subscribes to in: the links into it as planned here (none
    // when the scheme cannot be planned from this node's catalog).
    let mut receives: BTreeMap<QualName, Vec<hawser_scheme::route::Link>> = BTreeMap::new();
    for (name, s) in &cluster.schemes {
        let planned = hawser_scheme::plan(&s.scheme, &topology);
        let relayed = match &planned {
            Ok(plan) => plan
                .links
                .iter()
                .filter(|l| l.sender == store)
                .find_map(|l| {
                    l.tables
                        .iter()
                        .find(|t| t.origin != store)
                        .map(|t| (t.origin.to_string(), l.receiver.to_string()))
                }),
            Err(_) => s
                .scheme
                .elements
                .iter()
                .find(|e| e.owner.name == me && e.owner_role == OwnerRole::Propagator)
                .map(|e| {
                    let to: Vec<String> =
                        e.subscriber_stores().map(|r| r.name.to_string()).collect();
                    ("other stores".to_string(), to.join(", "))
                }),
        };
        if let Some((origin, receiver)) = relayed {
            return Err(Status::failed_precondition(format!(
                "{store} relays {origin}'s transactions to {receiver} (scheme {name}): a \
                 duplicate gives it rows without their log records, which it could not pass \
                 on; rebuild it from an empty data directory instead"
            )));
        }
        let subscribes = s
            .scheme
            .elements
            .iter()
            .any(|e| e.subscriber_stores().any(|r| r.name == me));
        if subscribes {
            let inbound = planned
                .map(|plan| {
                    plan.links
                        .into_iter()
                        .filter(|l| l.receiver == store)
                        .collect()
                })
                .unwrap_or_default();
            receives.insert(name.clone(), inbound);
        }
    }
    let scheme = if scheme.is_empty() {
        match receives.keys().collect::<Vec<_>>().as_slice() {
            [one] => (*one).clone(),
            [] => {
                return Err(Status::failed_precondition(format!(
                    "{store} subscribes to no element of any scheme"
                )))
            }
            many => {
                let names: Vec<String> = many.iter().map(|n| n.to_string()).collect();
                return Err(Status::invalid_argument(format!(
                    "{store} subscribes in several schemes ({}): name one with --scheme",
                    names.join(", ")
                )));
            }
        }
    } else {
        QualName::parse_unquoted(scheme)
    };
    let Some(s) = cluster.schemes.get(&scheme) else {
        return Err(Status::not_found(format!(
            "replication scheme {scheme} does not exist"
        )));
    };
    let Some(links) = receives.get(&scheme) else {
        return Err(Status::failed_precondition(format!(
            "{store} subscribes to no element of scheme {scheme}"
        )));
    };
    // What each scheme brings this store: tables and the origins of their (and its
    // sequences') transactions.
    let brings = |links: &[hawser_scheme::route::Link]| {
        let tables: BTreeSet<QualName> = links
            .iter()
            .flat_map(|l| l.tables.iter())
            .filter(|t| t.origin != store)
            .map(|t| t.table.clone())
            .collect();
        let origins: BTreeSet<Ident> = links
            .iter()
            .flat_map(|l| {
                let tables = l.tables.iter().map(|t| &t.origin);
                tables.chain(l.sequences.iter().map(|s| &s.origin))
            })
            .filter(|o| **o != store)
            .cloned()
            .collect();
        (tables, origins)
    };
    let (our_tables, our_origins) = brings(links);
    for (other, other_links) in receives.iter().filter(|(n, _)| **n != scheme) {
        // Marks are per origin, shared by every scheme's streams into this store, and a
        // copy rewrites whole tables: another scheme may go on beside the copy only if
        // it brings none of this one's origins or tables.
        let (tables, origins) = brings(other_links);
        let shared = if our_origins.is_empty() || other_links.is_empty() {
            Some("what it brings cannot be planned here".to_string())
        } else if let Some(o) = origins.intersection(&our_origins).next() {
            Some(format!("{o}'s transactions"))
        } else {
            tables
                .intersection(&our_tables)
                .next()
                .map(|t| format!("table {t}"))
        };
        if let Some(shared) = shared {
            return Err(Status::failed_precondition(format!(
                "{store} also receives in scheme {other}, which shares {shared} with scheme \
                 {scheme}: a duplicate copies one scheme's tables and sets the marks of its \
                 origins, which the other scheme's streams share"
            )));
        }
    }
    let origins = if our_origins.is_empty() {
        None
    } else {
        let mut ids = BTreeSet::new();
        for o in &our_origins {
            let Some(node) = cluster.node_by_store(o) else {
                return Err(Status::not_found(format!(
                    "store {o} has no node in the cluster"
                )));
            };
            ids.insert(node.id);
        }
        Some(ids)
    };
    let receiver_state = s.receiver_state(&store);
    let routed = || {
        links
            .iter()
            .flat_map(|l| l.tables.iter())
            .filter(|t| t.origin != store)
    };
    let tables: BTreeSet<QualName> = routed().map(|t| t.table.clone()).collect();
    let targets = routed()
        .filter(|t| !hawser_target::is_plain(&t.table, &t.target))
        .map(|t| {
            let origin = cluster.node_by_store(&t.origin).map(|n| n.id);
            let era = s.elements.get(&t.element).map_or(Epoch(0), |e| e.epoch);
            (t.table.clone(), (t.target.clone(), origin, era))
        })
        .collect();
    let from = if from.is_empty() {
        // The tables' origins; where none is planned here, the stores that send this
        // store its elements.
        let mut sources: BTreeSet<Ident> = routed().map(|t| t.origin.clone()).collect();
        if sources.is_empty() {
            sources = s
                .scheme
                .elements
                .iter()
                .filter(|e| e.subscriber_stores().any(|r| r.name == me))
                .filter_map(|e| match &e.owner.name {
                    StoreName::Named(n) => Some(n.clone()),
                    StoreName::Local => None,
                })
                .collect();
        }
        match sources.into_iter().collect::<Vec<_>>().as_slice() {
            [one] => one.clone(),
            many => {
                let names: Vec<String> = many.iter().map(|n| n.to_string()).collect();
                return Err(Status::invalid_argument(format!(
                    "the tables {store} receives in {scheme} have several masters ({}): name \
                     the store to copy from with --from",
                    names.join(", ")
                )));
            }
        }
    } else {
        Ident::unquoted(from)
    };
    if from == store {
        return Err(Status::invalid_argument(format!(
            "{store} cannot copy from itself"
        )));
    }
    let Some(node) = cluster.node_by_store(&from) else {
        return Err(Status::not_found(format!(
            "store {from} has no node in the cluster"
        )));
    };
    Ok(Target {
        receiver_state,
        scheme,
        from_addr: node.grpc_addr.clone(),
        from,
        tables: tables.into_iter().collect(),
        targets,
        origins,
    })
}

/// What a copy this node serves for a scheme carries to a store (`CopyRequest.scheme`):
/// the tables and sequences the scheme routes to it, from other origins, as this node
/// plans the scheme (`cluster::topology`: its own catalog for its own store), so the
/// DATASTORE elements it masters cover the tables and sequences it has.
pub(crate) fn copy_plan(
    plane: hawser_control::ControlPlane,
    db: hawser_store::Database,
    node_store: Ident,
) -> hawser_stream::CopyPlan {
    Arc::new(move |scheme: &str, receiver: &Ident| {
        let cluster = plane.state();
        let name = QualName::parse_unquoted(scheme);
        let Some(s) = cluster.schemes.get(&name) else {
            return Err(Status::not_found(format!(
                "replication scheme {name} does not exist on {node_store}"
            )));
        };
        let (topology, _) = crate::dataplane::local_topology(&cluster, &db, &node_store);
        let plan = hawser_scheme::plan(&s.scheme, &topology).map_err(|errors| {
            let first = errors
                .first()
                .map(|e| e.message.clone())
                .unwrap_or_default();
            Status::failed_precondition(format!(
                "scheme {name}: {node_store} cannot plan its streams: {first}"
            ))
        })?;
        let into = || plan.links.iter().filter(|l| l.receiver == *receiver);
        let tables: BTreeSet<QualName> = into()
            .flat_map(|l| l.tables.iter())
            .filter(|t| t.origin != *receiver)
            .map(|t| t.table.clone())
            .collect();
        let sequences: BTreeSet<QualName> = into()
            .flat_map(|l| l.sequences.iter())
            .filter(|s| s.origin != *receiver)
            .map(|s| s.sequence.clone())
            .collect();
        if tables.is_empty() && sequences.is_empty() {
            return Err(Status::failed_precondition(format!(
                "scheme {name} routes nothing to {receiver} as {node_store} plans it"
            )));
        }
        Ok(hawser_stream::CopyObjects {
            tables: tables.into_iter().collect(),
            sequences: sequences.into_iter().collect(),
        })
    })
}

/// Refuses a copy whose marks are below this node's for some origin (of `origins`,
/// the scheme's, when known): this node holds commits the source does not have (they
/// were lost there), which a copy cannot take back out of its log.
fn check_marks(
    state: &NodeState,
    marks: &BTreeMap<NodeId, u64>,
    origins: Option<&BTreeSet<NodeId>>,
) -> Result<(), Status> {
    for (origin, mine) in state
        .db
        .high_waters()
        .map_err(|e| Status::internal(e.to_string()))?
    {
        if origin == state.node_id || origins.is_some_and(|o| !o.contains(&origin)) {
            continue;
        }
        let theirs = marks.get(&origin).copied().unwrap_or(0);
        if mine > theirs {
            return Err(Status::failed_precondition(format!(
                "this node holds node {origin}'s commits through seq {mine}, the source only \
                 through {theirs}: it holds commits the source does not have; rebuild it \
                 from an empty data directory instead, or keep them with --keep-replaced"
            )));
        }
    }
    Ok(())
}

/// From the source's columns to this node's, by name (TABLE DEFINITION CHECKING
/// RELAXED's rule; with EXACT the two are the same).
struct ColumnMap {
    /// For each of this node's columns, the source column it takes (None: NULL).
    from: Vec<Option<usize>>,
}

impl ColumnMap {
    fn new(db: &hawser_store::Database, source: &TableDef, from: &str) -> Result<Self, Status> {
        let name = &source.name;
        let Some(local) = db.table(name) else {
            return Err(Status::internal(format!(
                "table {name} is gone here during the duplicate"
            )));
        };
        let mut map = Vec::with_capacity(local.columns.len());
        for (i, c) in local.columns.iter().enumerate() {
            let found = source.column_index(&c.name);
            if found.is_none() && (!c.nullable || local.is_key_column(i)) {
                return Err(Status::failed_precondition(format!(
                    "table {name}: {from} has no column {} (NOT NULL or in the key here)",
                    c.name
                )));
            }
            map.push(found);
        }
        let key = |d: &TableDef| -> Vec<String> {
            d.primary_key
                .iter()
                .map(|i| d.columns[*i].name.to_string())
                .collect()
        };
        if key(&local) != key(source) {
            return Err(Status::failed_precondition(format!(
                "table {name}: the primary key is ({}) here and ({}) on {from}",
                key(&local).join(", "),
                key(source).join(", ")
            )));
        }
        Ok(Self { from: map })
    }

    fn apply(&self, mut row: Row) -> Row {
        self.from
            .iter()
            .map(|i| match i {
                Some(i) => std::mem::replace(&mut row[*i], Value::Null),
                None => Value::Null,
            })
            .collect()
    }
}
