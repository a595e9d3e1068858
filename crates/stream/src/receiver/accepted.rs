//! A stream that passed Hello: what it knows of the sender's tables, kept up to date
//! with the DDL it carries, and how its transactions are made into this store's.
//!
//! Pure: this node's tables are read through [`Catalog`], which the store implements
//! and the tests fake, so the rules of column maps, doomed tables and DDL following are
//! unit-tested without a store.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use hawser_core::{Epoch, Ident, NodeId, QualName, TableDef, Transaction, Value};
use hawser_scheme::ast::TableDefinitionChecking;
use hawser_store::{Database, DdlOp};
use hawser_target::TargetPlan;

use super::Refusal;
use crate::link::{check_table, TableMismatch};
use crate::pb::RefuseCode;

/// What the Hello and DDL checks read of this node's store.
pub(super) trait Catalog {
    /// This node's definition of table `name`, when it has the table.
    fn local_table(&self, name: &QualName) -> Option<Arc<TableDef>>;
    /// The seq through which this store holds `origin`'s transactions; `None` when the
    /// store cannot say.
    fn held_through(&self, origin: NodeId) -> Option<u64>;
}

impl Catalog for Database {
    fn local_table(&self, name: &QualName) -> Option<Arc<TableDef>> {
        self.table(name)
    }

    fn held_through(&self, origin: NodeId) -> Option<u64> {
        self.high_water(origin).ok()
    }
}

/// A stream that passed Hello.
pub(super) struct Accepted {
    /// The sender's store, which names the stream in status and metrics.
    pub(super) sender: Ident,
    /// The sender's node, whose own commits and decisions the stream carries.
    pub(super) sender_node: NodeId,
    /// A return service may wait on this stream: every apply is flushed before its ack.
    /// Otherwise applies do not wait for the flush, and durable marks follow a flush
    /// every [`super::acks::LAZY_FLUSH_EVERY`].
    pub(super) returns_wait: bool,
    /// The elements the stream carries, at the epochs its Hello gave.
    pub(super) elements: BTreeMap<Ident, Epoch>,
    /// Column maps of tables whose columns are in another order (RELAXED).
    pub(super) maps: BTreeMap<QualName, Vec<usize>>,
    /// The sender's table definitions as of Hello, kept up to date with the DDL the
    /// stream carries, and how they are checked: a replicated ADD COLUMN or DROP /
    /// CREATE TABLE changes a table's column map from its next row on.
    pub(super) remote: BTreeMap<QualName, TableDef>,
    /// Tables this stream drops before it creates them again in the sender's layout
    /// (`TableSpec.dropped_at`): their row changes are not applied until the drop,
    /// which would remove them.
    pub(super) doomed: BTreeSet<QualName>,
    /// How the sender's table definitions are checked against this node's.
    pub(super) mode: TableDefinitionChecking,
    /// The sender relays an origin beside another relay of it and ships its part of
    /// a transaction split between them (`Hello.ships_parts`): one at an origin's
    /// high-water here may be the rest of it ([`super::runs::may_be_second_part`]).
    pub(super) ships_parts: bool,
    /// The tables written into a target table (`hawser_target`): each transaction is
    /// rewritten before it is applied, and runs are applied in log order.
    pub(super) targets: TargetPlan,
    /// Target tables to create before the first batch (absent at Hello).
    pub(super) create: Vec<TableDef>,
}

impl Accepted {
    /// Follows a DDL record this stream just applied: the sender's definition of the
    /// table changed, and so did this node's (read from `catalog`), so its column map
    /// is computed again.
    pub(super) fn follow_ddl(&mut self, catalog: &impl Catalog, op: &DdlOp) -> Result<(), Refusal> {
        let name = match op {
            DdlOp::CreateTable(def) => {
                self.remote.insert(def.name.clone(), def.clone());
                &def.name
            }
            DdlOp::DropTable(name) => {
                self.remote.remove(name);
                self.maps.remove(name);
                self.doomed.remove(name);
                return Ok(());
            }
            DdlOp::AddColumn { table, column } => {
                // Hello described the table as the sender has it now, which may
                // already include this column (this node was behind).
                if let Some(def) = self.remote.get_mut(table) {
                    if !def.columns.iter().any(|c| c.name == column.name) {
                        def.columns.push(column.clone());
                    }
                }
                table
            }
            DdlOp::CreateSequence(_) | DdlOp::DropSequence(_) => return Ok(()),
        };
        match (catalog.local_table(name), self.remote.get(name)) {
            (Some(local), Some(remote)) => match check_as_of(&local, remote, true, self.mode) {
                Ok(Some(map)) => {
                    self.maps.insert(name.clone(), map);
                }
                Ok(None) => {
                    self.maps.remove(name);
                }
                Err(e) => return Err((RefuseCode::TableMismatch, e.to_string())),
            },
            // A table the Hello did not describe: its rows arrive in this node's order.
            _ => {
                self.maps.remove(name);
            }
        }
        Ok(())
    }

    /// Makes a received transaction this store's: the changes of doomed tables left
    /// out, rows put in this node's column order, and changes of tables written into a
    /// target table rewritten into it (the names the log here records). `store` names
    /// this node's store in a refusal.
    pub(super) fn prepare(
        &self,
        mut txn: Transaction,
        epoch: Epoch,
        store: &Ident,
    ) -> Result<Transaction, Refusal> {
        if !self.doomed.is_empty() {
            txn.changes.retain(|c| !self.doomed.contains(&c.table));
        }
        for c in &mut txn.changes {
            if let Some(map) = self.maps.get(&c.table) {
                for row in [&mut c.before, &mut c.after].into_iter().flatten() {
                    *row = remap(row, map).ok_or_else(|| {
                        (
                            RefuseCode::Protocol,
                            format!(
                                "transaction {}: a row of {} has too few values",
                                txn.gtid, c.table
                            ),
                        )
                    })?;
                }
            }
        }
        self.targets
            .rewrite(txn, epoch)
            .map_err(|e| (RefuseCode::TableMismatch, format!("store {store}: {e}")))
    }
}

/// [`check_table`] of this node's definition against the sender's, where the sender's
/// may be ahead: on a stream that carries DDL, columns the sender has beyond this node's
/// count were added by ADD COLUMN records this node has yet to receive (columns are
/// only ever added at the end), so the check is against the sender's table as it was
/// then — its first columns.
pub(super) fn check_as_of(
    local: &TableDef,
    remote: &TableDef,
    carries_ddl: bool,
    mode: TableDefinitionChecking,
) -> Result<Option<Vec<usize>>, TableMismatch> {
    if carries_ddl && remote.columns.len() > local.columns.len() {
        let mut then = remote.clone();
        then.columns.truncate(local.columns.len());
        return check_table(local, &then, mode);
    }
    check_table(local, remote, mode)
}

/// A sender's row in this node's column order: for each of this node's columns, the
/// sender's value at the position `map` gives. `None` when the row has too few values.
pub(super) fn remap(row: &[Value], map: &[usize]) -> Option<Vec<Value>> {
    map.iter().map(|&j| row.get(j).cloned()).collect()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use hawser_core::{ChangeOp, ColumnDef, DataType, Gtid, RowChange};

    /// A store's tables and high-waters, as the checks read them.
    #[derive(Default)]
    pub(crate) struct FakeCatalog {
        pub(crate) tables: BTreeMap<QualName, TableDef>,
        pub(crate) held: BTreeMap<NodeId, u64>,
    }

    impl Catalog for FakeCatalog {
        fn local_table(&self, name: &QualName) -> Option<Arc<TableDef>> {
            self.tables.get(name).cloned().map(Arc::new)
        }

        fn held_through(&self, origin: NodeId) -> Option<u64> {
            self.held.get(&origin).copied()
        }
    }

    pub(crate) fn col(name: &str) -> ColumnDef {
        ColumnDef {
            name: Ident::unquoted(name),
            data_type: DataType::Integer,
            nullable: true,
            default: None,
        }
    }

    /// Table `name` with `cols`, keyed on its first column.
    pub(crate) fn table(name: &str, cols: &[&str]) -> TableDef {
        TableDef {
            name: QualName::bare(name),
            columns: cols.iter().map(|c| col(c)).collect(),
            primary_key: vec![0],
            explicit_key: true,
        }
    }

    fn accepted(mode: TableDefinitionChecking) -> Accepted {
        Accepted {
            sender: Ident::unquoted("a"),
            sender_node: NodeId(1),
            returns_wait: false,
            elements: BTreeMap::new(),
            maps: BTreeMap::new(),
            remote: BTreeMap::new(),
            doomed: BTreeSet::new(),
            mode,
            ships_parts: false,
            targets: TargetPlan::default(),
            create: Vec::new(),
        }
    }

    fn insert(table: &str, row: Vec<i64>) -> RowChange {
        let row: Vec<Value> = row.into_iter().map(Value::Int).collect();
        RowChange {
            table: QualName::bare(table),
            op: ChangeOp::Insert,
            key: vec![row[0].clone()],
            before: None,
            after: Some(row),
        }
    }

    fn txn(changes: Vec<RowChange>) -> Transaction {
        Transaction {
            gtid: Gtid::new(NodeId(1), 1),
            commit_micros: 0,
            changes,
        }
    }

    #[test]
    fn a_sender_ahead_by_added_columns_is_checked_as_it_was_before_them() {
        let local = table("t", &["k", "a"]);
        let remote = table("t", &["k", "a", "b"]);
        let exact = TableDefinitionChecking::Exact;
        assert_eq!(check_as_of(&local, &remote, true, exact), Ok(None));
        // Without DDL on the stream the extra column is a mismatch.
        assert!(check_as_of(&local, &remote, false, exact).is_err());
        // Columns this node has that the sender lacks are never excused.
        assert!(check_as_of(&remote, &local, true, exact).is_err());
    }

    #[test]
    fn rows_are_put_in_this_nodes_column_order_and_doomed_tables_left_out() {
        let mut a = accepted(TableDefinitionChecking::Relaxed);
        // This node has (k, b, a); the sender (k, a, b).
        a.maps.insert(QualName::bare("t"), vec![0, 2, 1]);
        a.doomed.insert(QualName::bare("gone"));
        let store = Ident::unquoted("s");
        let t = a
            .prepare(
                txn(vec![insert("t", vec![1, 10, 20]), insert("gone", vec![1])]),
                Epoch(1),
                &store,
            )
            .expect("prepared");
        assert_eq!(t.changes.len(), 1, "the doomed table's change is left out");
        let after = t.changes[0].after.clone().expect("an insert");
        assert_eq!(after, [Value::Int(1), Value::Int(20), Value::Int(10)]);
    }

    #[test]
    fn a_row_with_too_few_values_for_its_column_map_is_refused_as_a_protocol_error() {
        let mut a = accepted(TableDefinitionChecking::Relaxed);
        a.maps.insert(QualName::bare("t"), vec![0, 2, 1]);
        let refusal = a
            .prepare(
                txn(vec![insert("t", vec![1, 10])]),
                Epoch(1),
                &Ident::unquoted("s"),
            )
            .expect_err("refused");
        assert_eq!(refusal.0, RefuseCode::Protocol);
        assert!(refusal.1.contains("too few values"), "{}", refusal.1);
        assert_eq!(remap(&[Value::Int(1)], &[0]), Some(vec![Value::Int(1)]));
    }

    #[test]
    fn an_added_column_the_hello_already_described_is_not_added_twice() {
        let mut a = accepted(TableDefinitionChecking::Exact);
        let name = QualName::bare("t");
        a.remote.insert(name.clone(), table("t", &["k", "a"]));
        let catalog = FakeCatalog {
            tables: BTreeMap::from([(name.clone(), table("t", &["k", "a"]))]),
            ..FakeCatalog::default()
        };
        let op = DdlOp::AddColumn {
            table: name.clone(),
            column: col("a"),
        };
        a.follow_ddl(&catalog, &op).expect("followed");
        assert_eq!(a.remote[&name].columns.len(), 2);
        let op = DdlOp::AddColumn {
            table: name.clone(),
            column: col("b"),
        };
        // This node's table has yet to get the column: the sender is checked as of then.
        a.follow_ddl(&catalog, &op).expect("followed");
        assert_eq!(a.remote[&name].columns.len(), 3);
        assert!(!a.maps.contains_key(&name));
    }

    #[test]
    fn a_created_table_in_another_column_order_gets_a_map_and_a_drop_forgets_it() {
        let mut a = accepted(TableDefinitionChecking::Relaxed);
        let name = QualName::bare("t");
        a.doomed.insert(name.clone());
        let catalog = FakeCatalog {
            tables: BTreeMap::from([(name.clone(), table("t", &["k", "b", "a"]))]),
            ..FakeCatalog::default()
        };
        a.follow_ddl(&catalog, &DdlOp::CreateTable(table("t", &["k", "a", "b"])))
            .expect("followed");
        assert_eq!(a.maps.get(&name), Some(&vec![0, 2, 1]));
        a.follow_ddl(&catalog, &DdlOp::DropTable(name.clone()))
            .expect("followed");
        assert!(a.maps.is_empty() && a.remote.is_empty() && a.doomed.is_empty());
    }

    #[test]
    fn a_created_table_that_does_not_fit_this_nodes_refuses_the_stream() {
        let mut a = accepted(TableDefinitionChecking::Exact);
        let name = QualName::bare("t");
        let catalog = FakeCatalog {
            tables: BTreeMap::from([(name.clone(), table("t", &["k", "b", "a"]))]),
            ..FakeCatalog::default()
        };
        let refusal = a
            .follow_ddl(&catalog, &DdlOp::CreateTable(table("t", &["k", "a", "b"])))
            .expect_err("refused");
        assert_eq!(refusal.0, RefuseCode::TableMismatch);
        // A table this node does not have: its rows come in this node's order.
        a.maps.insert(QualName::bare("u"), vec![1, 0]);
        a.follow_ddl(&catalog, &DdlOp::CreateTable(table("u", &["k", "a"])))
            .expect("followed");
        assert!(!a.maps.contains_key(&QualName::bare("u")));
    }
}
