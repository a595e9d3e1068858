//! The write step of an apply, under the commit mutex: the log-order simulation that
//! gives every transaction its log record, the conflicts kept, and the row writes in
//! log order or compiled, all in one engine batch.

use std::collections::BTreeMap;

use hawser_core::key::encode_key;
use hawser_core::{Gtid, NodeId, QualName, Row, Transaction};

use super::compiled::net_writes;
use super::overlay::{apply_change, check_conflicts, Overlay};
use super::prepare::Prepared;
use super::ReplicatedTxn;
use crate::codec;
use crate::conflict::Found;
use crate::db::{ForeignAppend, Inner};
use crate::engine::WriteBatch;
use crate::error::StoreError;
use crate::layout;
use crate::log::LogEntry;
use crate::rows::{key_text, validate_row};

/// What the write step reports back.
pub(super) struct Outcome {
    pub(super) applied: u64,
    pub(super) row_changes: u64,
    pub(super) rows_written: u64,
    pub(super) compiled: bool,
    /// Conflicts found, published once the batch is written.
    pub(super) conflicts: Vec<crate::conflict::ConflictEvent>,
    /// BASE AGGREGATE groups, kept once the batch is written.
    pub(super) aggregated: Vec<(QualName, crate::aggregate::Done)>,
}

/// The write step, run under the commit mutex: re-checks the catalog and the
/// high-water marks, simulates the batch in log order (log records), and fills the
/// engine batch with the row writes, log order's or the compiled ones. With `part`,
/// a transaction at its origin's high-water is written too
/// ([`Database::apply_part`](crate::Database::apply_part)).
pub(super) fn write(
    inner: &Inner,
    own_seq: u64,
    p: &Prepared<'_>,
    part: bool,
) -> Result<(ForeignAppend, Outcome), StoreError> {
    // DDL takes the commit mutex too, so the tables cannot change from here to the
    // engine write.
    for t in &p.tables {
        inner.check_table_current(t)?;
    }
    let mut marks: BTreeMap<NodeId, u64> = BTreeMap::new();
    let mut ov = Overlay::new(inner, p.tables.len());
    let mut records = Vec::with_capacity(p.txns.len());
    let mut row_changes = 0;
    let rules = inner.conflicts.rules();
    let mut touched = crate::aggregate::Touched::new(inner, &p.tables)?;
    // Conflicts found, with their transaction and table: kept in the conflicts table.
    let mut conflicts: Vec<(&ReplicatedTxn, QualName, Found, bool)> = Vec::new();
    for pt in &p.txns {
        let Gtid { origin, seq } = pt.src.txn.gtid;
        let mark = match marks.get(&origin) {
            Some(&m) => m,
            None if origin == inner.opts.node_id => own_seq,
            None => inner.mark(origin),
        };
        if seq < mark || (seq == mark && !(part && origin != inner.opts.node_id)) {
            // Only this node's own origin can move between the first check and here
            // (local commits); the apply lock holds every other origin still.
            continue;
        }
        let found = if rules.is_empty() {
            Vec::new()
        } else {
            check_conflicts(&mut ov, &p.tables, pt, &rules)?
        };
        // ON EXCEPTION ROLLBACK WORK: nothing of the transaction is applied; NO
        // ACTION: all but the conflicting changes.
        let rollback = found.iter().any(|f| f.rollback);
        let mut effective = Vec::with_capacity(pt.changes.len());
        for (i, (c, src)) in pt.changes.iter().zip(&pt.src.txn.changes).enumerate() {
            if rollback || found.iter().any(|f| f.change_no == i) {
                continue;
            }
            let applied = apply_change(&mut ov, &p.tables, &src.table, c)?;
            if !touched.is_empty() {
                for a in &applied {
                    touched.note(a, pt.src.txn.commit_micros);
                }
            }
            effective.extend(applied);
        }
        for f in found {
            let table = pt.src.txn.changes[f.change_no].table.clone();
            crate::conflict::count(
                &table,
                if rollback {
                    "transaction rejected"
                } else {
                    "change rejected"
                },
            );
            tracing::info!(
                gtid = %pt.src.txn.gtid,
                table = %table,
                key = %key_text(&f.key),
                rollback,
                "a received change is older than the row here: conflict"
            );
            conflicts.push((pt.src, table, f, rollback));
        }
        row_changes += pt.changes.len() as u64;
        records.push((
            pt.src.epoch,
            LogEntry::Txn(Transaction {
                gtid: pt.src.txn.gtid,
                commit_micros: pt.src.txn.commit_micros,
                changes: effective,
            }),
        ));
        marks.insert(origin, seq);
    }
    let applied = records.len() as u64;
    // Net operations describe the whole run: if a transaction of this node's own
    // origin turned out to be here already, write in log order after all.
    // A rejected change is not in the net operations' view: then too in log order.
    let net = p
        .net
        .as_ref()
        .filter(|_| applied == p.txns.len() as u64 && conflicts.is_empty());
    let mut batch = WriteBatch::new();
    if !conflicts.is_empty() {
        // Kept beside the rows, without a log record: a conflict is this store's own
        // finding, not a change to replicate.
        let name = QualName::bare(crate::conflict::CONFLICTS_TABLE);
        let kept = inner.catalog.table(&name);
        match kept {
            Some(t) => {
                for (src, table, f, rolled_back) in &conflicts {
                    let row = crate::conflict::conflict_row(
                        src.txn.gtid,
                        src.txn.commit_micros,
                        table,
                        f,
                        *rolled_back,
                    );
                    let row = validate_row(&t.def, row)?;
                    let key = layout::row_key(t.id, &encode_key(&t.def.key_of(&row)));
                    batch.put(key, codec::encode_row(&row));
                }
            }
            None => tracing::warn!(
                conflicts = conflicts.len(),
                "conflicts found but the conflicts table is missing: counted and logged only"
            ),
        }
    }
    // BASE AGGREGATE rows of the groups the batch touched, beside its rows.
    let aggregated = touched.write(inner, &p.tables, &ov.after, &mut batch)?;
    let mut put = |table: usize, enc: &[u8], row: &Option<Row>| {
        let key = layout::row_key(p.tables[table].id, enc);
        match row {
            Some(row) => batch.put(key, codec::encode_row(row)),
            None => batch.delete(key),
        }
    };
    let rows_written = match net {
        Some(net) => {
            let writes = net_writes(&mut ov, &p.tables, net)?;
            for ((table, enc), row) in &writes {
                put(*table, enc, row);
            }
            writes.len()
        }
        None => {
            let mut written = 0;
            for (table, rows) in ov.after.iter().enumerate() {
                for (enc, row) in rows {
                    // Deleting a row that was not here writes nothing.
                    if row.is_some() || ov.before[table].get(enc).is_some_and(Option::is_some) {
                        put(table, enc, row);
                        written += 1;
                    }
                }
            }
            written
        }
    };
    Ok((
        ForeignAppend {
            batch,
            records,
            high_water: marks,
        },
        Outcome {
            applied,
            row_changes,
            rows_written: rows_written as u64,
            compiled: net.is_some(),
            aggregated,
            conflicts: conflicts
                .iter()
                .map(|(src, table, f, rolled_back)| {
                    crate::conflict::event(
                        src.txn.gtid,
                        src.txn.commit_micros,
                        table,
                        f,
                        *rolled_back,
                    )
                })
                .collect(),
        },
    ))
}
