//! How a backlog's records become runs, and how each run is applied: pure rules.
//!
//! A backlog is read record by record ([`decode_batch`]); a record a failover forked
//! off ends the stream ([`check_forked`]). Transactions gather into a run, which DDL
//! and the second part of a transaction that came in parts cut
//! ([`join_part`], [`may_be_second_part`], [`rest_of`]). Each run is compiled or
//! applied in log order, paced or not ([`compiles_run`], [`run_mode`]); a paced run
//! goes in slices ([`slice_len`], [`add_slice`]), and what every apply wrote is
//! counted by mode ([`Tally`]).

use std::collections::{BTreeMap, BTreeSet};

use hawser_core::{Gtid, NodeId, QualName, TableDef, Transaction};
use hawser_rtl::{Compilation, CompileError, Compiler};
use hawser_store::{ApplyInfo, ReplicatedTxn};

use super::Refusal;
use crate::codec::{self, decode_records, decompress, WireRecord};
use crate::link::ForkedRange;
use crate::pb::{self, RefuseCode};

/// The row changes a paced apply writes at least between two chances to pause.
pub(super) const PACED_ROWS: usize = 4;

/// Log records looked back over for the parts of a transaction here: the first part is
/// applied just before the second, unless transactions of other origins came between.
pub(super) const LOOK_BACK: usize = 4096;

/// Decompresses and decodes one batch.
pub(super) fn decode_batch(batch: &pb::Batch) -> Result<Vec<WireRecord>, Refusal> {
    let proto = |e: codec::CodecError| {
        (
            RefuseCode::Protocol,
            format!("batch through LSN {}: {e}", batch.through_lsn),
        )
    };
    let Some(codec) = crate::codec_from_pb(batch.codec) else {
        return Err((
            RefuseCode::Protocol,
            format!("unknown codec {}", batch.codec),
        ));
    };
    let raw = decompress(codec, &batch.payload, batch.raw_bytes).map_err(proto)?;
    decode_records(&raw).map_err(proto)
}

/// Refuses `record` when one of the `forked` ranges holds it: a deposed master's
/// commit past the fork point is never applied, whoever sends it.
pub(super) fn check_forked(forked: &[ForkedRange], record: &WireRecord) -> Result<(), Refusal> {
    match forked.iter().find(|f| f.holds(record.epoch, &record.entry)) {
        Some(f) => Err((
            RefuseCode::StaleEpoch,
            format!(
                "record {} was committed under failover era {} by a deposed \
                 master after the fork point (seq {}, era {}): a failover forked it off",
                record.entry.gtid(),
                record.epoch,
                f.after_seq,
                f.before_epoch
            ),
        )),
        None => Ok(()),
    }
}

/// Notes `gtid` in `received`, the highest seq of each origin in a backlog: what the
/// marks move to once every run of it has returned.
pub(super) fn note_received(received: &mut BTreeMap<NodeId, u64>, gtid: Gtid) {
    let seq = received.entry(gtid.origin).or_insert(0);
    *seq = (*seq).max(gtid.seq);
}

/// Joins `txn` to the run's transaction with the same Gtid, when the run's last one of
/// its origin is that: a sender that got a transaction in two parts ships both records
/// (`Hello.ships_parts`), and a batch must not hold one Gtid twice. The changes of
/// tables the first part lacks are added to it (a part's tables are its own); whether
/// they were.
pub(super) fn join_part(run: &mut [ReplicatedTxn], txn: &mut Transaction) -> bool {
    let origin = txn.gtid.origin;
    let Some(first) = run.iter_mut().rev().find(|r| r.txn.gtid.origin == origin) else {
        return false;
    };
    if first.txn.gtid != txn.gtid {
        return false;
    }
    let have: BTreeSet<QualName> = first.txn.changes.iter().map(|c| c.table.clone()).collect();
    first.txn.changes.extend(
        std::mem::take(&mut txn.changes)
            .into_iter()
            .filter(|c| !have.contains(&c.table)),
    );
    true
}

/// Whether a transaction `gtid` from a stream of `sender` may be the rest of one that
/// reached this store (node `me`) in parts, before its origin's high-water here is
/// read: two propagators relaying one origin's tables to this store each ship their
/// own part of a transaction that writes tables of both (docs/stream.md, "Two blind
/// relays"), and the part applied first made its seq the origin's high-water here.
///
/// Only from a relay that ships parts (`ships_parts`), and never of the sender's own
/// commits or this node's: from any other stream a transaction at the high-water is a
/// resend — and a resend's delete of a row that was missing here, which left no change
/// in the record, must not delete a row written here since. The caller then checks
/// that the seq is the origin's high-water here (below it, a resend, skipped as a
/// duplicate; above it, a transaction of its own).
pub(super) fn may_be_second_part(
    ships_parts: bool,
    sender: NodeId,
    me: NodeId,
    gtid: Gtid,
) -> bool {
    ships_parts && gtid.origin != sender && gtid.origin != me
}

/// The rest of `txn` whose records here write the tables `here`: the changes of other
/// tables, as a transaction of the same Gtid; `None` when there are none (a resend of
/// a part is found here whole, and skipped).
pub(super) fn rest_of(txn: &Transaction, here: &BTreeSet<QualName>) -> Option<Transaction> {
    let rest: Vec<_> = txn
        .changes
        .iter()
        .filter(|c| !here.contains(&c.table))
        .cloned()
        .collect();
    (!rest.is_empty()).then_some(Transaction {
        gtid: txn.gtid,
        commit_micros: txn.commit_micros,
        changes: rest,
    })
}

/// Whether a run of a backlog that compiles (`backlog_compiles`) is compiled: not when
/// the stream writes target tables (`writes_targets`: a noncondensed CCD keeps every
/// change, which compilation would net away), nor when a transaction of it is one a
/// duplicate's copy may reflect in part (at or below `in_order_through` of its origin),
/// which must go in log order.
pub(super) fn compiles_run(
    backlog_compiles: bool,
    writes_targets: bool,
    run: &[ReplicatedTxn],
    in_order_through: impl Fn(NodeId) -> u64,
) -> bool {
    backlog_compiles
        && !writes_targets
        && !run
            .iter()
            .any(|r| r.txn.gtid.seq <= in_order_through(r.txn.gtid.origin))
}

/// How one run is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RunMode {
    /// As RTL net rows, in one batch (in log order if the compiler cannot read it).
    Compiled,
    /// In log order, in slices with pauses between them.
    Paced,
    /// In log order, in one go.
    InOrder,
}

/// How a run is applied: compiled when [`compiles_run`] says so; otherwise paced when
/// the backlog is (`paced`) and nobody waits on the stream's applies (`lazy`), else in
/// log order in one go.
pub(super) fn run_mode(compiles: bool, lazy: bool, paced: bool) -> RunMode {
    if compiles {
        RunMode::Compiled
    } else if paced && lazy {
        RunMode::Paced
    } else {
        RunMode::InOrder
    }
}

/// How many of `run`'s first transactions make one slice of a paced apply: enough to
/// reach [`PACED_ROWS`] row changes, or all of them.
pub(super) fn slice_len(run: &[ReplicatedTxn]) -> usize {
    let mut rows = 0;
    run.iter()
        .position(|r| {
            rows += r.txn.changes.len();
            rows >= PACED_ROWS
        })
        .map_or(run.len(), |i| i + 1)
}

/// Adds a later slice's apply (`info`) to what a paced apply did so far (`total`): the
/// counts add up, the run is durable only if every slice was, and the high-waters are
/// the last slice's.
pub(super) fn add_slice(total: &mut ApplyInfo, info: ApplyInfo) {
    total.applied += info.applied;
    total.skipped += info.skipped;
    total.row_changes += info.row_changes;
    total.rows_written += info.rows_written;
    total.last_lsn = total.last_lsn.max(info.last_lsn);
    total.durable &= info.durable;
    total.high_water = info.high_water;
}

/// Compiles a run into net row operations against `catalog`.
pub(super) fn compile_run(
    run: &[ReplicatedTxn],
    catalog: &[TableDef],
) -> Result<Compilation, CompileError> {
    let mut compiler = Compiler::new(catalog);
    for r in run {
        compiler.push_transaction(&r.txn)?;
    }
    Ok(compiler.finish())
}

/// Counts of one backlog's apply.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Tally {
    /// Transactions received.
    pub(super) transactions: u64,
    /// Transactions received that were already here, skipped.
    pub(super) skipped: u64,
    /// Row changes the transactions received carry.
    pub(super) row_changes: u64,
    /// Rows written by compiled runs.
    pub(super) rows_compiled: u64,
    /// Rows written by runs in log order.
    pub(super) rows_in_order: u64,
    /// Runs applied as compiled net rows.
    pub(super) runs_compiled: u64,
    /// Runs applied in log order.
    pub(super) runs_in_order: u64,
}

impl Tally {
    /// Counts a run's apply by the mode the store applied it in (a run meant to be
    /// compiled that the compiler could not read went in log order).
    pub(super) fn count_run(&mut self, info: &ApplyInfo) {
        self.skipped += info.skipped;
        if info.compiled {
            self.runs_compiled += 1;
            self.rows_compiled += info.rows_written;
        } else {
            self.runs_in_order += 1;
            self.rows_in_order += info.rows_written;
        }
    }

    /// Counts the apply of the rest of a transaction that came in parts: in log order.
    pub(super) fn count_part(&mut self, info: &ApplyInfo) {
        self.skipped += info.skipped;
        self.runs_in_order += 1;
        self.rows_in_order += info.rows_written;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hawser_core::{ChangeOp, Epoch, Lsn, RowChange, Value};
    use hawser_store::LogEntry;

    fn change(table: &str, k: i64) -> RowChange {
        RowChange {
            table: QualName::bare(table),
            op: ChangeOp::Insert,
            key: vec![Value::Int(k)],
            before: None,
            after: Some(vec![Value::Int(k)]),
        }
    }

    fn txn(origin: u64, seq: u64, tables: &[&str]) -> Transaction {
        Transaction {
            gtid: Gtid::new(NodeId(origin), seq),
            commit_micros: 7,
            changes: tables.iter().map(|t| change(t, 1)).collect(),
        }
    }

    fn rt(t: Transaction) -> ReplicatedTxn {
        ReplicatedTxn {
            txn: t,
            epoch: Epoch(1),
        }
    }

    fn tables(t: &Transaction) -> Vec<String> {
        t.changes.iter().map(|c| c.table.to_string()).collect()
    }

    fn info(rows_written: u64, compiled: bool, durable: bool) -> ApplyInfo {
        ApplyInfo {
            applied: 1,
            skipped: 2,
            row_changes: 3,
            rows_written,
            compiled,
            last_lsn: Lsn(rows_written),
            durable,
            high_water: BTreeMap::from([(NodeId(1), rows_written)]),
        }
    }

    #[test]
    fn a_second_part_joins_the_runs_last_transaction_of_its_origin_with_its_own_tables_only() {
        let mut run = vec![rt(txn(1, 5, &["a"])), rt(txn(2, 9, &["x"]))];
        let mut second = txn(1, 5, &["a", "b"]);
        assert!(join_part(&mut run, &mut second));
        assert_eq!(
            tables(&run[0].txn),
            ["a", "b"],
            "a's change was the first part's"
        );
        assert!(second.changes.is_empty());
        // Another seq of the origin is a transaction of its own.
        let mut other = txn(1, 6, &["b"]);
        assert!(!join_part(&mut run, &mut other));
        assert_eq!(tables(&other), ["b"]);
        // Only the run's last transaction of the origin is joined.
        run.push(rt(txn(1, 6, &["c"])));
        let mut late = txn(1, 5, &["d"]);
        assert!(!join_part(&mut run, &mut late));
        assert!(!join_part(&mut [], &mut txn(1, 5, &["a"])));
    }

    #[test]
    fn only_a_relay_that_ships_parts_may_send_the_second_part_of_another_origins_transaction() {
        let (sender, me) = (NodeId(2), NodeId(3));
        let of = |origin| Gtid::new(NodeId(origin), 5);
        assert!(may_be_second_part(true, sender, me, of(1)));
        assert!(!may_be_second_part(false, sender, me, of(1)), "a resend");
        assert!(
            !may_be_second_part(true, sender, me, of(2)),
            "the sender's own"
        );
        assert!(
            !may_be_second_part(true, sender, me, of(3)),
            "this node's own"
        );
    }

    #[test]
    fn the_rest_of_a_transaction_here_in_part_is_the_changes_of_the_tables_it_lacks() {
        let t = txn(1, 5, &["a", "b", "c"]);
        let rest = rest_of(&t, &BTreeSet::from([QualName::bare("b")])).expect("a rest");
        assert_eq!(tables(&rest), ["a", "c"]);
        assert_eq!((rest.gtid, rest.commit_micros), (t.gtid, t.commit_micros));
        // Found here whole: a resend, nothing to apply.
        let all = ["a", "b", "c"].map(QualName::bare).into();
        assert_eq!(rest_of(&t, &all), None);
    }

    #[test]
    fn a_run_with_target_tables_or_partly_here_from_a_copy_is_never_compiled() {
        let run = [rt(txn(1, 5, &["a"])), rt(txn(2, 9, &["b"]))];
        let nothing_in_order = |_| 0;
        assert!(compiles_run(true, false, &run, nothing_in_order));
        assert!(!compiles_run(false, false, &run, nothing_in_order));
        assert!(!compiles_run(true, true, &run, nothing_in_order));
        // Origin 2's copy reflects transactions through 9 in part.
        let copied = |o: NodeId| if o == NodeId(2) { 9 } else { 0 };
        assert!(!compiles_run(true, false, &run, copied));
        let copied_before = |o: NodeId| if o == NodeId(2) { 8 } else { 0 };
        assert!(compiles_run(true, false, &run, copied_before));
    }

    #[test]
    fn only_an_uncompiled_run_of_a_paced_lazy_stream_is_paced() {
        assert_eq!(run_mode(true, true, true), RunMode::Compiled);
        assert_eq!(run_mode(false, true, true), RunMode::Paced);
        assert_eq!(run_mode(false, false, true), RunMode::InOrder);
        assert_eq!(run_mode(false, true, false), RunMode::InOrder);
    }

    #[test]
    fn a_paced_slice_ends_at_the_transaction_that_reaches_four_row_changes() {
        let run = [
            rt(txn(1, 1, &["a"])),
            rt(txn(1, 2, &["a", "b"])),
            rt(txn(1, 3, &["a"])),
            rt(txn(1, 4, &["a"])),
        ];
        assert_eq!(slice_len(&run), 3);
        let big = [
            rt(txn(1, 1, &["a", "b", "c", "d", "e"])),
            rt(txn(1, 2, &["a"])),
        ];
        assert_eq!(
            slice_len(&big),
            1,
            "one transaction past the bound is a slice"
        );
        assert_eq!(slice_len(&run[..2]), 2, "under the bound: the whole run");
        assert_eq!(slice_len(&[]), 0);
    }

    #[test]
    fn a_paced_applys_slices_add_up_and_are_durable_only_if_every_slice_was() {
        let mut total = info(5, false, true);
        add_slice(&mut total, info(3, false, false));
        assert_eq!(
            (
                total.applied,
                total.skipped,
                total.row_changes,
                total.rows_written
            ),
            (2, 4, 6, 8)
        );
        assert!(!total.durable);
        assert_eq!(total.last_lsn, Lsn(5), "the highest LSN written");
        assert_eq!(
            total.high_water,
            BTreeMap::from([(NodeId(1), 3)]),
            "the last slice's"
        );
    }

    #[test]
    fn a_runs_writes_are_counted_by_the_mode_the_store_applied_it_in() {
        let mut t = Tally::default();
        t.count_run(&info(10, true, true));
        t.count_run(&info(4, false, true));
        t.count_part(&info(1, false, true));
        assert_eq!((t.runs_compiled, t.rows_compiled), (1, 10));
        assert_eq!((t.runs_in_order, t.rows_in_order), (2, 5));
        assert_eq!(t.skipped, 6, "skips of runs and parts alike");
    }

    #[test]
    fn a_record_past_a_fork_point_under_an_older_era_is_refused_as_stale() {
        let forked = [ForkedRange {
            origin: NodeId(1),
            after_seq: 10,
            before_epoch: Epoch(3),
            tables: None,
        }];
        let record = |seq, epoch| WireRecord {
            epoch: Epoch(epoch),
            entry: LogEntry::Txn(txn(1, seq, &["a"])),
        };
        let refusal = check_forked(&forked, &record(11, 2)).expect_err("refused");
        assert_eq!(refusal.0, RefuseCode::StaleEpoch);
        assert!(
            check_forked(&forked, &record(10, 2)).is_ok(),
            "at the fork point"
        );
        assert!(check_forked(&forked, &record(11, 3)).is_ok(), "the new era");
        assert!(check_forked(&[], &record(11, 2)).is_ok());
    }

    #[test]
    fn a_batch_of_an_unknown_codec_or_undecodable_payload_is_refused_as_protocol() {
        let batch = |codec, payload: Vec<u8>| pb::Batch {
            through_lsn: 4,
            count: 1,
            codec,
            raw_bytes: payload.len() as u64,
            payload: payload.into(),
            ..pb::Batch::default()
        };
        let refusal = decode_batch(&batch(99, Vec::new())).expect_err("refused");
        assert_eq!(refusal, (RefuseCode::Protocol, "unknown codec 99".into()));
        let refusal =
            decode_batch(&batch(pb::Codec::None as i32, vec![0xff; 8])).expect_err("refused");
        assert_eq!(refusal.0, RefuseCode::Protocol);
        assert!(
            refusal.1.starts_with("batch through LSN 4"),
            "{}",
            refusal.1
        );
        // What the sender encodes decodes.
        let records = [WireRecord {
            epoch: Epoch(1),
            entry: LogEntry::Txn(txn(1, 1, &["a"])),
        }];
        let raw = codec::encode_records(&records);
        let decoded = decode_batch(&batch(pb::Codec::None as i32, raw)).expect("decoded");
        assert_eq!(decoded.len(), 1);
        assert_eq!(decoded[0].entry.gtid(), Gtid::new(NodeId(1), 1));
    }

    #[test]
    fn a_backlog_moves_each_origins_mark_to_its_highest_seq() {
        let mut received = BTreeMap::new();
        for (o, s) in [(1, 5), (2, 3), (1, 4), (1, 7)] {
            note_received(&mut received, Gtid::new(NodeId(o), s));
        }
        assert_eq!(received, BTreeMap::from([(NodeId(1), 7), (NodeId(2), 3)]));
    }
}
