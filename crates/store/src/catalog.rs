//! The catalog as the store holds it in memory: its tables, as transactions pin them,
//! and its sequences. Read by everyone; changed only by DDL, under the commit mutex and
//! once the change's batch is written (`crate::db`'s catalog operations).

use std::collections::BTreeMap;
use std::sync::Arc;

use hawser_core::{QualName, TableDef};
use parking_lot::{Mutex, RwLock};

use crate::sequence::SequenceState;

/// A table as a transaction pins it: id, catalog version and definition.
#[derive(Debug, Clone)]
pub(crate) struct TableRef {
    pub id: u64,
    pub version: u64,
    pub def: Arc<TableDef>,
}

/// A sequence's state, shared by its NEXTVAL callers.
pub(crate) type SharedSequence = Arc<Mutex<SequenceState>>;

/// The tables and sequences, each behind its own lock. A caller takes a handle (a
/// [`TableRef`], a [`SharedSequence`]) and lets go of the map before it uses it: NEXTVAL
/// holds a sequence's lock while it waits for the commit mutex, and DDL holds the
/// commit mutex while it waits for a map's write lock.
#[derive(Default)]
pub(crate) struct Catalog {
    tables: RwLock<BTreeMap<QualName, TableRef>>,
    sequences: RwLock<BTreeMap<QualName, SharedSequence>>,
}

impl Catalog {
    /// The catalog as an open read it.
    pub(crate) fn new(
        tables: BTreeMap<QualName, TableRef>,
        sequences: BTreeMap<QualName, SharedSequence>,
    ) -> Self {
        Self {
            tables: RwLock::new(tables),
            sequences: RwLock::new(sequences),
        }
    }

    pub(crate) fn table(&self, name: &QualName) -> Option<TableRef> {
        self.tables.read().get(name).cloned()
    }

    pub(crate) fn has_table(&self, name: &QualName) -> bool {
        self.tables.read().contains_key(name)
    }

    /// Every table's definition, by name.
    pub(crate) fn table_defs(&self) -> Vec<Arc<TableDef>> {
        self.tables.read().values().map(|t| t.def.clone()).collect()
    }

    /// Whether `t` is the catalog's table of its name (same id and version).
    pub(crate) fn is_current(&self, t: &TableRef) -> bool {
        self.tables
            .read()
            .get(&t.def.name)
            .is_some_and(|cur| cur.id == t.id && cur.version == t.version)
    }

    /// Installs `t` under its name, replacing what was there.
    pub(crate) fn put_table(&self, t: TableRef) {
        self.tables.write().insert(t.def.name.clone(), t);
    }

    pub(crate) fn remove_table(&self, name: &QualName) {
        self.tables.write().remove(name);
    }

    pub(crate) fn sequence(&self, name: &QualName) -> Option<SharedSequence> {
        self.sequences.read().get(name).cloned()
    }

    pub(crate) fn has_sequence(&self, name: &QualName) -> bool {
        self.sequences.read().contains_key(name)
    }

    /// Every sequence, by name.
    pub(crate) fn sequences(&self) -> Vec<SharedSequence> {
        self.sequences.read().values().cloned().collect()
    }

    pub(crate) fn put_sequence(&self, name: QualName, s: SharedSequence) {
        self.sequences.write().insert(name, s);
    }

    pub(crate) fn remove_sequence(&self, name: &QualName) {
        self.sequences.write().remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hawser_core::{ColumnDef, DataType, Ident};

    fn table(name: &str, id: u64, version: u64) -> TableRef {
        TableRef {
            id,
            version,
            def: Arc::new(TableDef {
                name: QualName::bare(name),
                columns: vec![ColumnDef {
                    name: Ident::unquoted("k"),
                    data_type: DataType::BigInt,
                    nullable: false,
                    default: None,
                }],
                primary_key: vec![0],
                explicit_key: true,
            }),
        }
    }

    #[test]
    fn a_pinned_table_is_current_only_while_the_catalog_holds_its_id_and_version() {
        let catalog = Catalog::default();
        let t = table("t", 7, 0);
        assert!(!catalog.is_current(&t), "not created yet");
        catalog.put_table(t.clone());
        assert!(catalog.is_current(&t) && catalog.has_table(&t.def.name));
        // ALTER: a new version under the same id.
        catalog.put_table(table("t", 7, 1));
        assert!(!catalog.is_current(&t));
        // DROP and CREATE again: another id.
        catalog.remove_table(&t.def.name);
        catalog.put_table(table("t", 8, 0));
        assert!(!catalog.is_current(&table("t", 7, 1)));
        assert_eq!(catalog.table_defs().len(), 1);
    }
}
