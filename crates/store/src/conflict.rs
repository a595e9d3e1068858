//! TimesTen's row-timestamp conflict checking (`CHECK CONFLICTS BY ROW TIMESTAMP`).
//!
//! A table with a rule keeps in a nullable `BINARY(8)` column the time its row was last
//! written. With `UPDATE BY SYSTEM` this store stamps it on every local insert and
//! update ([`StampClock`]); with `BY USER` the application does. A received change is
//! applied only when it is newer than the row here ([`verdict`]); otherwise it is a
//! conflict, kept in the [`CONFLICTS_TABLE`] table (in the same atomic batch as the
//! apply) and counted. `ON EXCEPTION ROLLBACK WORK` rejects the whole received
//! transaction, `NO ACTION` only the conflicting change.
//!
//! The comparisons, for an incoming change and the row here:
//!
//! | incoming | row here | applied when |
//! |---|---|---|
//! | insert | absent | always |
//! | insert / update | present | its timestamp is later; at equal timestamps its row sorts higher |
//! | update | absent (deleted here) | always (inserted, DB2's rule) |
//! | delete | present | the deleted row's timestamp is not earlier than the row here |
//! | delete | absent | (nothing to do) |
//!
//! A NULL timestamp is earlier than any. The tie-break compares whole rows, so two
//! stores that each hold one of two rows stamped alike both keep the same one.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering as AtomicOrdering};
use std::sync::Arc;

use hawser_core::{ChangeOp, DataType, Ident, QualName, Row, TableDef, Value};

/// The table conflicts are kept in.
pub const CONFLICTS_TABLE: &str = "hawser_conflicts";

/// How one table is checked, as the scheme says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConflictRule {
    /// The `BINARY(8)` timestamp column.
    pub column: Ident,
    /// `UPDATE BY SYSTEM`: this store stamps the column on local writes.
    pub by_system: bool,
    /// `ON EXCEPTION ROLLBACK [WORK]`: a conflict rejects the whole transaction.
    pub rollback: bool,
}

/// What to do with one received change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Apply,
    /// A conflict: the row here is newer.
    Conflict,
}

/// The timestamp at `column` of `row` (None: NULL, or not a timestamp value).
pub fn stamp_of(row: &[Value], column: usize) -> Option<&[u8]> {
    match row.get(column) {
        Some(Value::Bytes(b)) => Some(b),
        _ => None,
    }
}

/// Whether a received change of kind `op` — carrying `incoming` (its after-image, or a
/// delete's before-image, when it has one) — is applied over `here`, the row its key
/// holds now. See the module's table.
pub fn verdict(op: ChangeOp, incoming: Option<&Row>, here: Option<&Row>, column: usize) -> Verdict {
    let Some(here) = here else {
        return Verdict::Apply;
    };
    let theirs = incoming.and_then(|r| stamp_of(r, column));
    let ours = stamp_of(here, column);
    // Option's order puts None (NULL) first: earlier than any timestamp.
    match op {
        ChangeOp::Delete => {
            if theirs.cmp(&ours) == Ordering::Less {
                Verdict::Conflict
            } else {
                Verdict::Apply
            }
        }
        ChangeOp::Insert | ChangeOp::Update => match theirs.cmp(&ours) {
            Ordering::Greater => Verdict::Apply,
            Ordering::Less => Verdict::Conflict,
            Ordering::Equal => match incoming {
                Some(row) if row.as_slice() >= here.as_slice() => Verdict::Apply,
                _ => Verdict::Conflict,
            },
        },
    }
}

/// Microseconds since the Unix epoch by the system clock (0 before it).
fn unix_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// This store's clock for `UPDATE BY SYSTEM`: microseconds since the Unix epoch as 8
/// big-endian bytes (so byte order is time order), never going back on this node, even
/// if the system clock does.
#[derive(Debug, Default)]
pub struct StampClock {
    last: AtomicI64,
}

impl StampClock {
    /// The next stamp: now, or just after the last one given.
    pub fn next(&self) -> Vec<u8> {
        let now = unix_micros();
        let mut prev = self.last.load(AtomicOrdering::Relaxed);
        loop {
            let next = now.max(prev.saturating_add(1));
            match self.last.compare_exchange_weak(
                prev,
                next,
                AtomicOrdering::Relaxed,
                AtomicOrdering::Relaxed,
            ) {
                Ok(_) => return next.to_be_bytes().to_vec(),
                Err(seen) => prev = seen,
            }
        }
    }
}

/// A conflict an apply found and committed (in [`CONFLICTS_TABLE`]), as the node's
/// reporter gets it ([`crate::Database::subscribe_conflicts`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ConflictEvent {
    pub table: QualName,
    /// The received transaction: its origin node and seq there, its commit time.
    pub origin: hawser_core::NodeId,
    pub seq: u64,
    pub commit_micros: i64,
    pub change_no: usize,
    pub op: ChangeOp,
    pub key: Row,
    /// The received row (a delete's before-image) and the row here.
    pub incoming: Option<Row>,
    pub here: Option<Row>,
    pub incoming_stamp: Option<Vec<u8>>,
    pub local_stamp: Option<Vec<u8>>,
    /// Its whole transaction was rejected (ON EXCEPTION ROLLBACK WORK).
    pub rolled_back: bool,
}

/// Conflict events kept for a reporter that falls behind; older ones are lost to it
/// (never to the conflicts table).
const EVENTS_KEPT: usize = 1024;

/// A store's conflict checking: the rules the node sets from the schemes, the clock it
/// stamps with, and the committed conflicts it publishes. Owned by the database; read
/// by local writes (stamping) and by the apply (checking).
#[derive(Debug)]
pub(crate) struct Conflicts {
    rules: parking_lot::RwLock<Arc<HashMap<QualName, ConflictRule>>>,
    clock: StampClock,
    events: tokio::sync::broadcast::Sender<Arc<ConflictEvent>>,
}

impl Default for Conflicts {
    fn default() -> Self {
        Self {
            rules: Default::default(),
            clock: StampClock::default(),
            events: tokio::sync::broadcast::channel(EVENTS_KEPT).0,
        }
    }
}

impl Conflicts {
    pub(crate) fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Arc<ConflictEvent>> {
        self.events.subscribe()
    }

    /// Publishes conflicts an apply committed (nobody listening is fine).
    pub(crate) fn publish(&self, events: Vec<ConflictEvent>) {
        for e in events {
            let _ = self.events.send(Arc::new(e));
        }
    }

    pub(crate) fn rules(&self) -> Arc<HashMap<QualName, ConflictRule>> {
        self.rules.read().clone()
    }

    pub(crate) fn set(&self, rules: HashMap<QualName, ConflictRule>) {
        *self.rules.write() = Arc::new(rules);
    }

    /// Stamps `row` of table `def` when its rule says `UPDATE BY SYSTEM`.
    pub(crate) fn stamp(&self, def: &TableDef, row: &mut Row) {
        let rules = self.rules.read();
        let Some(rule) = rules.get(&def.name).filter(|r| r.by_system) else {
            return;
        };
        if let Some(i) = def.column_index(&rule.column) {
            row[i] = Value::Bytes(self.clock.next());
        }
    }
}

/// Counts a conflict of `table` (`action`: what was rejected).
pub(crate) fn count(table: &QualName, action: &'static str) {
    metrics::counter!(
        "hawser_conflicts_total",
        "table" => table.to_string(),
        "action" => action
    )
    .increment(1);
}

/// One conflict found by an apply, before it is written.
#[derive(Debug)]
pub(crate) struct Found {
    /// The change's place in its transaction.
    pub(crate) change_no: usize,
    pub(crate) op: ChangeOp,
    pub(crate) key: Row,
    pub(crate) incoming: Option<Row>,
    pub(crate) here: Option<Row>,
    pub(crate) column: usize,
    pub(crate) rollback: bool,
}

/// The [`ConflictEvent`] of `found`, a change of `table` in the transaction `gtid`.
pub(crate) fn event(
    gtid: hawser_core::Gtid,
    commit_micros: i64,
    table: &QualName,
    found: &Found,
    rolled_back: bool,
) -> ConflictEvent {
    let stamp = |row: &Option<Row>| {
        row.as_ref()
            .and_then(|r| stamp_of(r, found.column))
            .map(<[u8]>::to_vec)
    };
    ConflictEvent {
        table: table.clone(),
        origin: gtid.origin,
        seq: gtid.seq,
        commit_micros,
        change_no: found.change_no,
        op: found.op,
        key: found.key.clone(),
        incoming: found.incoming.clone(),
        here: found.here.clone(),
        incoming_stamp: stamp(&found.incoming),
        local_stamp: stamp(&found.here),
        rolled_back,
    }
}

/// The [`CONFLICTS_TABLE`] row of `found`, a change of `table` in the transaction
/// `gtid` committed at `commit_micros`; `rolled_back` when its whole transaction was
/// rejected.
pub(crate) fn conflict_row(
    gtid: hawser_core::Gtid,
    commit_micros: i64,
    table: &QualName,
    found: &Found,
    rolled_back: bool,
) -> Row {
    use crate::aside::{image, text};
    let stamp = |row: &Option<Row>| {
        row.as_ref()
            .and_then(|r| stamp_of(r, found.column))
            .map_or(Value::Null, |s| Value::Bytes(s.to_vec()))
    };
    let now = unix_micros();
    vec![
        Value::Int(gtid.origin.0 as i64),
        Value::Int(gtid.seq as i64),
        Value::Int(found.change_no as i64),
        Value::Timestamp(now),
        Value::Timestamp(commit_micros),
        text(table.to_string()),
        text(format!("{:?}", found.op).to_lowercase()),
        text(crate::rows::key_text(&found.key)),
        image(&found.incoming),
        image(&found.here),
        stamp(&found.incoming),
        stamp(&found.here),
        text(
            if rolled_back {
                "transaction rejected"
            } else {
                "change rejected"
            }
            .to_string(),
        ),
    ]
}

/// The longest image or key text kept (longer ones are cut).
pub(crate) const TEXT_LIMIT: u32 = crate::aside::TEXT_LIMIT;

/// The definition of [`CONFLICTS_TABLE`]: one row per conflicting received change.
pub fn conflicts_table_def() -> TableDef {
    let col = crate::aside::system_column;
    TableDef {
        name: QualName::bare(CONFLICTS_TABLE),
        columns: vec![
            col("origin", DataType::BigInt, false),
            col("seq", DataType::BigInt, false),
            col("change_no", DataType::Integer, false),
            col("detected_at", DataType::Timestamp, false),
            col("commit_time", DataType::Timestamp, false),
            col("table_name", DataType::Varchar(1024), false),
            col("op", DataType::Varchar(16), false),
            col("row_key", DataType::Varchar(TEXT_LIMIT), true),
            col("incoming_image", DataType::Varchar(TEXT_LIMIT), true),
            col("local_image", DataType::Varchar(TEXT_LIMIT), true),
            col("incoming_stamp", DataType::Varbinary(8), true),
            col("local_stamp", DataType::Varbinary(8), true),
            col("action", DataType::Varchar(32), false),
        ],
        primary_key: vec![0, 1, 2],
        explicit_key: true,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn row(k: i64, v: &str, stamp: Option<u64>) -> Row {
        vec![
            Value::Int(k),
            Value::Text(v.into()),
            stamp.map_or(Value::Null, |s| Value::Bytes(s.to_be_bytes().to_vec())),
        ]
    }

    #[test]
    fn the_later_write_wins_and_an_earlier_one_is_a_conflict() {
        let here = row(1, "here", Some(10));
        for op in [ChangeOp::Insert, ChangeOp::Update] {
            assert_eq!(
                verdict(op, Some(&row(1, "x", Some(11))), Some(&here), 2),
                Verdict::Apply
            );
            assert_eq!(
                verdict(op, Some(&row(1, "x", Some(9))), Some(&here), 2),
                Verdict::Conflict
            );
            assert_eq!(
                verdict(op, Some(&row(1, "x", None)), Some(&here), 2),
                Verdict::Conflict
            );
            assert_eq!(
                verdict(op, Some(&row(1, "x", Some(1))), None, 2),
                Verdict::Apply
            );
        }
        // A NULL stamp here is older than any.
        assert_eq!(
            verdict(
                ChangeOp::Update,
                Some(&row(1, "x", Some(0))),
                Some(&row(1, "n", None)),
                2
            ),
            Verdict::Apply
        );
    }

    #[test]
    fn a_delete_of_a_row_changed_here_since_is_a_conflict() {
        let here = row(1, "here", Some(10));
        let deleted = |s| row(1, "there", Some(s));
        assert_eq!(
            verdict(ChangeOp::Delete, Some(&deleted(9)), Some(&here), 2),
            Verdict::Conflict
        );
        assert_eq!(
            verdict(ChangeOp::Delete, Some(&deleted(10)), Some(&here), 2),
            Verdict::Apply
        );
        assert_eq!(
            verdict(ChangeOp::Delete, Some(&deleted(11)), Some(&here), 2),
            Verdict::Apply
        );
        assert_eq!(verdict(ChangeOp::Delete, None, None, 2), Verdict::Apply);
    }

    #[test]
    fn stamps_never_go_back() {
        let clock = StampClock::default();
        let mut last = clock.next();
        for _ in 0..1000 {
            let next = clock.next();
            assert!(next > last);
            assert_eq!(next.len(), 8);
            last = next;
        }
    }

    proptest! {
        /// Two stores each write one version of a row, then each receives the other's:
        /// whatever the stamps (ties included), both keep the same version.
        #[test]
        fn two_stores_receiving_each_others_write_keep_the_same_row(
            a in (0u64..4, "[ab]{1,2}"), b in (0u64..4, "[ab]{1,2}"),
        ) {
            let ra = row(1, &a.1, Some(a.0));
            let rb = row(1, &b.1, Some(b.0));
            let at_a = match verdict(ChangeOp::Update, Some(&rb), Some(&ra), 2) {
                Verdict::Apply => rb.clone(),
                Verdict::Conflict => ra.clone(),
            };
            let at_b = match verdict(ChangeOp::Update, Some(&ra), Some(&rb), 2) {
                Verdict::Apply => ra.clone(),
                Verdict::Conflict => rb.clone(),
            };
            prop_assert_eq!(at_a, at_b);
        }
    }
}
