//! A batch resolved against the catalog before any lock is taken: its tables, each
//! change checked and encoded, the net operations per table, and the rows to lock.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use hawser_core::key::encode_key;
use hawser_core::{ChangeOp, QualName, Row};
use hawser_rtl::{NetOp, NetTable};

use super::ReplicatedTxn;
use crate::db::{Database, TableRef};
use crate::error::StoreError;
use crate::rows::{coerce_key, validate_row};

/// A row of the apply: index into [`Prepared::tables`] and encoded key.
pub(super) type Slot = (usize, Vec<u8>);

/// Row versions by slot: `Some(row)`, or `None` for absent.
pub(super) type RowVersions = BTreeMap<Slot, Option<Row>>;

/// One change, checked against its table and ready to apply.
pub(super) struct PreparedChange {
    /// Index into [`Prepared::tables`].
    pub(super) table: usize,
    pub(super) op: ChangeOp,
    /// The (coerced) key of the row the change applies to.
    pub(super) key: Row,
    pub(super) enc: Vec<u8>,
    /// Insert and update: the validated after-row, its key and encoded key.
    pub(super) after: Option<(Row, Row, Vec<u8>)>,
}

pub(super) struct PreparedTxn<'r> {
    pub(super) src: &'r ReplicatedTxn,
    pub(super) changes: Vec<PreparedChange>,
}

/// A batch resolved against the catalog, before any lock is taken.
pub(super) struct Prepared<'r> {
    pub(super) tables: Vec<TableRef>,
    pub(super) txns: Vec<PreparedTxn<'r>>,
    /// Net operations per table index, when writing compiled.
    pub(super) net: Option<Vec<(usize, &'r [NetOp])>>,
    pub(super) lock_keys: BTreeSet<Slot>,
}

pub(super) fn prepare<'r>(
    db: &Database,
    fresh: &[&'r ReplicatedTxn],
    net: Option<&'r [NetTable]>,
) -> Result<Prepared<'r>, StoreError> {
    let mut tables: Vec<TableRef> = Vec::new();
    let mut by_name: HashMap<QualName, usize> = HashMap::new();
    let mut resolve = |tables: &mut Vec<TableRef>, name: &QualName| -> Result<usize, StoreError> {
        if let Some(&i) = by_name.get(name) {
            return Ok(i);
        }
        tables.push(db.table_ref(name)?);
        by_name.insert(name.clone(), tables.len() - 1);
        Ok(tables.len() - 1)
    };
    let mut txns = Vec::with_capacity(fresh.len());
    let mut lock_keys = BTreeSet::new();
    for &src in fresh {
        let gtid = src.txn.gtid;
        let wrap = |source: StoreError| StoreError::Replicated {
            gtid,
            source: Box::new(source),
        };
        let mut changes = Vec::with_capacity(src.txn.changes.len());
        for (i, c) in src.txn.changes.iter().enumerate() {
            let table = resolve(&mut tables, &c.table).map_err(wrap)?;
            let def = &tables[table].def;
            let key = coerce_key(def, &c.key, false).map_err(wrap)?;
            let enc = encode_key(&key);
            let after = match (c.op, &c.after) {
                (ChangeOp::Delete, _) => None,
                (_, Some(row)) => {
                    let row = validate_row(def, row.clone()).map_err(wrap)?;
                    let row_key = def.key_of(&row);
                    let row_enc = encode_key(&row_key);
                    Some((row, row_key, row_enc))
                }
                (op, None) => {
                    return Err(StoreError::InvalidBatch(format!(
                    "transaction {gtid}, change {i}: {op:?} of table {} without its after-image",
                    c.table
                )))
                }
            };
            if let Some((_, _, row_enc)) = after.as_ref().filter(|(_, _, e)| *e != enc) {
                // An update that moves the row locks its new key too.
                lock_keys.insert((table, row_enc.clone()));
            }
            lock_keys.insert((table, enc.clone()));
            changes.push(PreparedChange {
                table,
                op: c.op,
                key,
                enc,
                after,
            });
        }
        txns.push(PreparedTxn { src, changes });
    }
    let net = match net {
        Some(net_tables) if !fresh.is_empty() => {
            let mut out = Vec::with_capacity(net_tables.len());
            for nt in net_tables {
                let table = *by_name.get(&nt.table).ok_or_else(|| {
                    StoreError::InvalidBatch(format!(
                        "the compilation writes table {}, which no transaction of the run changes",
                        nt.table
                    ))
                })?;
                for op in &nt.operations {
                    let key = coerce_key(&tables[table].def, op.key(), false)?;
                    lock_keys.insert((table, encode_key(&key)));
                }
                out.push((table, nt.operations.as_slice()));
            }
            Some(out)
        }
        _ => None,
    };
    Ok(Prepared {
        tables,
        txns,
        net,
        lock_keys,
    })
}
