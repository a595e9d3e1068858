//! The catalog through the database: tables and sequences read, and changed by DDL
//! (local or replicated) as commits of their own; conflict rules, write refusals and
//! the store names they name.

use super::*;

impl Database {
    pub fn table(&self, name: &QualName) -> Option<Arc<TableDef>> {
        self.inner.catalog.table(name).map(|t| t.def)
    }

    /// Every table, by name.
    pub fn tables(&self) -> Vec<Arc<TableDef>> {
        self.inner.catalog.table_defs()
    }

    pub(crate) fn table_ref(&self, name: &QualName) -> Result<TableRef, StoreError> {
        self.inner
            .catalog
            .table(name)
            .ok_or_else(|| StoreError::UndefinedTable(name.clone()))
    }

    /// Creates a table. A table declared without a primary key (`explicit_key` false)
    /// keys on all its columns; explicit key columns become NOT NULL.
    pub async fn create_table(&self, def: TableDef) -> Result<CommitInfo, StoreError> {
        self.create_table_as(def, Origin::Local).await
    }

    pub(crate) async fn create_table_as(
        &self,
        def: TableDef,
        origin: Origin,
    ) -> Result<CommitInfo, StoreError> {
        let def = normalize_table_def(def)?;
        let name = def.name.clone();
        let (gtid, lsn) = self.inner.append_as(
            |state, gtid, micros| {
                if self.inner.catalog.has_table(&name) {
                    return Err(StoreError::DuplicateTable(name.clone()));
                }
                let id = state.next_table_id;
                state.next_table_id += 1;
                let mut batch = WriteBatch::new();
                batch.put(layout::table_key(id), codec::encode_table(id, 0, &def));
                batch.put(
                    NEXT_TABLE_ID_KEY.to_vec(),
                    state.next_table_id.to_be_bytes().to_vec(),
                );
                let entry = LogEntry::Ddl {
                    gtid,
                    commit_micros: micros,
                    op: DdlOp::CreateTable(def.clone()),
                };
                let install = move || {
                    // Another master's table: refused to client writes from the moment
                    // it exists, not only once the next plan has seen it.
                    if gtid.origin != self.node_id() {
                        self.inner.refuse_created(&name, gtid.origin);
                    }
                    self.inner.catalog.put_table(TableRef {
                        id,
                        version: 0,
                        def: Arc::new(def),
                    });
                    if gtid.origin != self.node_id() {
                        self.inner.count_created(&name);
                    }
                };
                Ok((batch, entry, install))
            },
            DdlKind::Ddl,
            origin,
        )?;
        self.ddl_durable(gtid, lsn).await
    }

    /// Drops a table and all its rows.
    pub async fn drop_table(&self, name: &QualName) -> Result<CommitInfo, StoreError> {
        self.drop_table_as(name, Origin::Local).await
    }

    pub(crate) async fn drop_table_as(
        &self,
        name: &QualName,
        origin: Origin,
    ) -> Result<CommitInfo, StoreError> {
        let (gtid, lsn) = self.inner.append_as(
            |_, gtid, micros| {
                let t = self.table_ref(name)?;
                let mut batch = WriteBatch::new();
                batch.delete(layout::table_key(t.id));
                let prefix = layout::row_prefix(t.id);
                for kv in self.inner.engine.scan(layout::prefix_range(&prefix), false) {
                    batch.delete(kv?.0);
                }
                let entry = LogEntry::Ddl {
                    gtid,
                    commit_micros: micros,
                    op: DdlOp::DropTable(name.clone()),
                };
                let install = move || {
                    self.inner.catalog.remove_table(name);
                    self.inner.refusals.write().created.remove(name);
                };
                Ok((batch, entry, install))
            },
            DdlKind::Ddl,
            origin,
        )?;
        self.ddl_durable(gtid, lsn).await
    }

    /// Adds a column at the end. Existing rows read the column's default (NULL when it
    /// has none); they are not rewritten. A NOT NULL column without a default can only
    /// be added to an empty table. Tables keyed on all columns cannot grow a column
    /// (it would change every row's key).
    pub async fn add_column(
        &self,
        table: &QualName,
        col: ColumnDef,
    ) -> Result<CommitInfo, StoreError> {
        self.add_column_as(table, col, Origin::Local).await
    }

    pub(crate) async fn add_column_as(
        &self,
        table: &QualName,
        col: ColumnDef,
        origin: Origin,
    ) -> Result<CommitInfo, StoreError> {
        let (gtid, lsn) = self.inner.append_as(
            |_, gtid, micros| {
                let t = self.table_ref(table)?;
                if !t.def.explicit_key {
                    return Err(StoreError::NotSupported(format!(
                        "ADD COLUMN on table {table}, which has no PRIMARY KEY and keys on all its columns"
                    )));
                }
                if t.def.column_index(&col.name).is_some() {
                    return Err(StoreError::DuplicateColumn {
                        table: table.clone(),
                        column: col.name.clone(),
                    });
                }
                let col = normalize_column(table, col.clone())?;
                if !col.nullable && col.default.is_none() {
                    let prefix = layout::row_prefix(t.id);
                    let mut rows = self.inner.engine.scan(layout::prefix_range(&prefix), false);
                    if rows.next().transpose()?.is_some() {
                        return Err(StoreError::InvalidTableDef {
                            table: table.clone(),
                            reason: format!(
                                "column {} is NOT NULL without a default and the table has rows",
                                col.name
                            ),
                        });
                    }
                }
                let mut def = (*t.def).clone();
                def.columns.push(col.clone());
                let version = t.version + 1;
                let mut batch = WriteBatch::new();
                batch.put(
                    layout::table_key(t.id),
                    codec::encode_table(t.id, version, &def),
                );
                let entry = LogEntry::Ddl {
                    gtid,
                    commit_micros: micros,
                    op: DdlOp::AddColumn {
                        table: table.clone(),
                        column: col,
                    },
                };
                let install = move || {
                    self.inner.catalog.put_table(TableRef {
                        id: t.id,
                        version,
                        def: Arc::new(def),
                    });
                };
                Ok((batch, entry, install))
            },
            DdlKind::Ddl,
            origin,
        )?;
        self.ddl_durable(gtid, lsn).await
    }

    pub async fn create_sequence(&self, def: SequenceDef) -> Result<CommitInfo, StoreError> {
        self.create_sequence_as(def, Origin::Local).await
    }

    pub(crate) async fn create_sequence_as(
        &self,
        def: SequenceDef,
        origin: Origin,
    ) -> Result<CommitInfo, StoreError> {
        def.validate()?;
        let (gtid, lsn) = self.inner.append_as(
            |_, gtid, micros| {
                if self.inner.catalog.has_sequence(&def.name) {
                    return Err(StoreError::DuplicateSequence(def.name.clone()));
                }
                let mut batch = WriteBatch::new();
                batch.put(
                    layout::sequence_key(&def.name),
                    codec::encode_sequence(&def, Some(def.start)),
                );
                let entry = LogEntry::Ddl {
                    gtid,
                    commit_micros: micros,
                    op: DdlOp::CreateSequence(def.clone()),
                };
                let install = move || {
                    self.inner.catalog.put_sequence(
                        def.name.clone(),
                        Arc::new(Mutex::new(SequenceState::new(def))),
                    );
                };
                Ok((batch, entry, install))
            },
            DdlKind::Ddl,
            origin,
        )?;
        self.ddl_durable(gtid, lsn).await
    }

    pub async fn drop_sequence(&self, name: &QualName) -> Result<CommitInfo, StoreError> {
        self.drop_sequence_as(name, Origin::Local).await
    }

    pub(crate) async fn drop_sequence_as(
        &self,
        name: &QualName,
        origin: Origin,
    ) -> Result<CommitInfo, StoreError> {
        let (gtid, lsn) = self.inner.append_as(
            |_, gtid, micros| {
                if !self.inner.catalog.has_sequence(name) {
                    return Err(StoreError::UndefinedSequence(name.clone()));
                }
                let mut batch = WriteBatch::new();
                batch.delete(layout::sequence_key(name));
                let entry = LogEntry::Ddl {
                    gtid,
                    commit_micros: micros,
                    op: DdlOp::DropSequence(name.clone()),
                };
                let install = move || {
                    self.inner.catalog.remove_sequence(name);
                };
                Ok((batch, entry, install))
            },
            DdlKind::Ddl,
            origin,
        )?;
        self.ddl_durable(gtid, lsn).await
    }

    pub fn sequence(&self, name: &QualName) -> Option<SequenceDef> {
        // The handle, the map's lock let go, before the sequence's lock (see Catalog).
        let seq = self.inner.catalog.sequence(name)?;
        let def = seq.lock().def.clone();
        Some(def)
    }

    pub fn sequences(&self) -> Vec<SequenceDef> {
        let all = self.inner.catalog.sequences();
        all.iter().map(|s| s.lock().def.clone()).collect()
    }

    /// The next value of a sequence. Not transactional (a rollback does not return
    /// it). Every [`BLOCK_SIZE`] values it durably records where the next block starts
    /// (a log record plus a flush, on the calling thread); the other calls touch only
    /// memory.
    pub fn next_val(&self, name: &QualName) -> Result<i64, StoreError> {
        let seq = self
            .inner
            .catalog
            .sequence(name)
            .ok_or_else(|| StoreError::UndefinedSequence(name.clone()))?;
        let mut state = seq.lock();
        if state.left_in_block == 0 && state.next.is_some() {
            let restart_at = state.next_block_start();
            let def = state.def.clone();
            let (_, lsn) = self.inner.append(
                |_, gtid, micros| {
                    // A DROP SEQUENCE may have won the race for the commit mutex.
                    let current = self.inner.catalog.sequence(name);
                    if !current.is_some_and(|c| Arc::ptr_eq(&c, &seq)) {
                        return Err(StoreError::UndefinedSequence(name.clone()));
                    }
                    let mut batch = WriteBatch::new();
                    batch.put(
                        layout::sequence_key(name),
                        codec::encode_sequence(&def, restart_at),
                    );
                    let entry = LogEntry::SequenceBlock {
                        gtid,
                        commit_micros: micros,
                        name: name.clone(),
                        restart_at,
                    };
                    Ok((batch, entry, || {}))
                },
                DdlKind::Sequence,
            )?;
            // The reservation must be durable before any value of the block is handed
            // out, or a crash could hand the same values out again.
            self.inner.flush_through(lsn)?;
            state.restart_at = restart_at;
            state.left_in_block = BLOCK_SIZE;
        }
        state.take()
    }

    /// A replicated sequence block: the master reserved values up to `restart_at`, so
    /// this store's sequence moves at least that far ahead (never back), durably. A
    /// subscriber that takes over as master then hands out only values the old master
    /// never did (TimesTen sets the subscriber ahead every 20 NEXTVAL references).
    pub(crate) async fn advance_sequence_as(
        &self,
        name: &QualName,
        restart_at: Option<i64>,
        origin: Origin,
    ) -> Result<CommitInfo, StoreError> {
        let seq = self
            .inner
            .catalog
            .sequence(name)
            .ok_or_else(|| StoreError::UndefinedSequence(name.clone()))?;
        let (gtid, lsn) = {
            let mut state = seq.lock();
            let ahead = match (state.next, restart_at) {
                // Exhausted on the master: exhausted here too.
                (_, None) | (None, _) => None,
                (Some(here), Some(there)) if state.def.increment > 0 => Some(here.max(there)),
                (Some(here), Some(there)) => Some(here.min(there)),
            };
            let def = state.def.clone();
            let installed = std::cell::Cell::new(false);
            let pos = self.inner.append_as(
                |_, gtid, micros| {
                    let mut batch = WriteBatch::new();
                    batch.put(
                        layout::sequence_key(name),
                        codec::encode_sequence(&def, ahead),
                    );
                    let entry = LogEntry::SequenceBlock {
                        gtid,
                        commit_micros: micros,
                        name: name.clone(),
                        restart_at,
                    };
                    Ok((batch, entry, || installed.set(true)))
                },
                DdlKind::Sequence,
                origin,
            )?;
            if installed.get() {
                // The values of the current local block are not handed out any more:
                // the next NEXTVAL here reserves a block from `ahead`.
                state.next = ahead;
                state.restart_at = ahead;
                state.left_in_block = 0;
            }
            pos
        };
        self.ddl_durable(gtid, lsn).await
    }

    /// Sets the tables this store receives from a master, each with the reason a
    /// client write to it is refused (naming the master). Replaces the previous set;
    /// replicated applies are not affected.
    ///
    /// `seen` is what [`Database::catalog_generation`] said before the caller read
    /// the catalog it planned from. A table created by replicated DDL is refused from
    /// the moment it exists, before any plan has seen it; that refusal is kept until a
    /// plan that saw the table replaces it (by refusing it with its own reason, or by
    /// leaving it writable where this store masters it too).
    /// Checks conflicts of received changes by row timestamp, and stamps local writes,
    /// as `rules` say per table (the node sets them from the schemes). Creates the
    /// conflicts table when a rule needs it.
    pub async fn set_conflict_rules(
        &self,
        rules: HashMap<QualName, crate::conflict::ConflictRule>,
    ) -> Result<(), StoreError> {
        let name = QualName::bare(crate::conflict::CONFLICTS_TABLE);
        if !rules.is_empty() && self.table(&name).is_none() {
            match self
                .create_table(crate::conflict::conflicts_table_def())
                .await
            {
                Ok(_) => {}
                // Made meanwhile by another caller.
                Err(_) if self.table(&name).is_some() => {}
                Err(e) => return Err(e),
            }
        }
        if *self.inner.conflicts.rules() != rules {
            self.inner.conflicts.set(rules);
        }
        Ok(())
    }

    /// The conflicts applies find from now on, once committed (a reporter writes them
    /// to the scheme's report files).
    pub fn subscribe_conflicts(
        &self,
    ) -> tokio::sync::broadcast::Receiver<std::sync::Arc<crate::conflict::ConflictEvent>> {
        self.inner.conflicts.subscribe()
    }

    pub fn set_write_refusals(&self, refusals: HashMap<QualName, String>, seen: u64) {
        let mut r = self.inner.refusals.write();
        r.planned = refusals;
        r.created.retain(|_, (_, counted)| *counted > seen);
    }

    /// The store names of the cluster's nodes, for the reason a write to a table
    /// created by replicated DDL is refused with before a plan has seen it (it names
    /// the origin's store; by node id when the name is not known).
    pub fn set_store_names(&self, names: HashMap<NodeId, String>) {
        self.inner.refusals.write().stores = names;
    }

    /// A count of the tables created here by replicated DDL so far, taken before
    /// reading the catalog to plan write refusals from (see
    /// [`Database::set_write_refusals`]): a table counted in it is in the catalog.
    pub fn catalog_generation(&self) -> u64 {
        self.inner.created_generation.load(Ordering::Acquire)
    }

    /// DDL is always durable before it is acknowledged.
    async fn ddl_durable(&self, gtid: Gtid, lsn: Lsn) -> Result<CommitInfo, StoreError> {
        self.inner.wait_durable(lsn, Flusher::Commit, true).await?;
        Ok(CommitInfo {
            gtid,
            lsn,
            durable: true,
        })
    }
}
