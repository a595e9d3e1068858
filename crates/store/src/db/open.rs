//! Opening a database: the format marker, the machine's boot, recovery of the catalog,
//! sequences, marks and the in-memory log from what the engine holds.

use super::*;

impl Database {
    /// Opens a database on `engine`, creating an empty one when the keyspace is empty.
    ///
    /// Recovery happens here: the catalog and sequences are loaded, the next LSN is
    /// the one after the last log record and the next Gtid seq the one after this
    /// node's high-water. Because every commit is one atomic batch, whatever the engine
    /// recovered is a prefix of whole commits: nothing else needs repairing.
    pub fn open(engine: Arc<dyn KvEngine>, opts: DbOptions) -> Result<Database, StoreError> {
        check_format(engine.as_ref())?;
        let mut boot = read_boot(engine.as_ref(), opts.boot_id.as_deref())?;
        if let Some(what) = engine.salvaged() {
            // Commits past the cut are gone from this store, and a receiver may hold
            // them: as after a machine restart that lost some, never stream to one
            // that holds more of this node's commits than it has now.
            tracing::error!(
                what = %what,
                "this store opened from a salvaged log: it counts as restarted; a \
                 receiver holding more of its commits is refused until it is rebuilt"
            );
            boot.restarted = true;
        }
        let mut tables = BTreeMap::new();
        let mut max_id = 0;
        for kv in engine.scan(layout::prefix_range(&[layout::TABLE_PREFIX]), false) {
            let (k, v) = kv?;
            let (id, version, def) = codec::decode_table(&k, &v)?;
            max_id = max_id.max(id);
            tables.insert(
                def.name.clone(),
                TableRef {
                    id,
                    version,
                    def: Arc::new(def),
                },
            );
        }
        let next_table_id = match engine.get(NEXT_TABLE_ID_KEY)? {
            Some(v) => u64_value(NEXT_TABLE_ID_KEY, &v)?,
            None => max_id + 1,
        };
        let mut sequences = BTreeMap::new();
        for kv in engine.scan(layout::prefix_range(&[layout::SEQUENCE_PREFIX]), false) {
            let (k, v) = kv?;
            let (def, restart_at) = codec::decode_sequence(&k, &v)?;
            sequences.insert(
                def.name.clone(),
                Arc::new(Mutex::new(SequenceState::reopened(def, restart_at))),
            );
        }
        let last_lsn = match engine
            .scan(layout::prefix_range(&[layout::LOG_PREFIX]), true)
            .next()
            .transpose()?
        {
            Some((k, _)) => Lsn(layout::suffix_u64(&k)
                .ok_or_else(|| StoreError::corrupt(&k, "malformed log key"))?),
            None => Lsn::ZERO,
        };
        // High-water marks: the `H` keys hold every origin's mark as of the log
        // released so far; the records still held raise them to the last commit.
        // They also name each origin's newest released commit, the newest one held
        // when no record of that origin is left (the log raises it too).
        let mut marks = BTreeMap::new();
        let mut last_commits = HashMap::new();
        for kv in engine.scan(layout::prefix_range(&[layout::HIGH_WATER_PREFIX]), false) {
            let (k, v) = kv?;
            let origin = layout::suffix_u64(&k)
                .filter(|_| k.len() == 9)
                .ok_or_else(|| StoreError::corrupt(&k, "malformed high-water key"))?;
            let (seq, micros) = layout::decode_high_water(&k, &v)?;
            marks.insert(NodeId(origin), seq);
            if let Some(micros) = micros {
                note_last_commit(&mut last_commits, Gtid::new(NodeId(origin), seq), micros);
            }
        }
        // The log's first record and size, for retention ([`Database::release_log`]).
        let mut log_start = None;
        let mut log_sizes = LogSizes::default();
        let mut ddl_lsns = BTreeSet::new();
        for kv in engine.scan(layout::prefix_range(&[layout::LOG_PREFIX]), false) {
            let (k, v) = kv?;
            let lsn = layout::suffix_u64(&k)
                .ok_or_else(|| StoreError::corrupt(&k, "malformed log key"))?;
            let start = *log_start.get_or_insert(lsn);
            // LSNs are dense; a gap (none is known to happen) counts as empty records.
            while log_sizes.len() < lsn - start {
                log_sizes.push(0);
            }
            log_sizes.push((k.len() + v.len()) as u64);
            let head = codec::record_head(&k, &v)?;
            let gtid = head.gtid;
            if head.ddl {
                ddl_lsns.insert(lsn);
            }
            note_last_commit(&mut last_commits, gtid, head.commit_micros);
            let mark = marks.entry(gtid.origin).or_insert(0);
            *mark = (*mark).max(gtid.seq);
        }
        let log_start = log_start.unwrap_or(last_lsn.0 + 1);
        let log_retained_bytes = log_sizes.bytes_from(0);
        let last_seq = marks.remove(&opts.node_id).unwrap_or(0);
        let restart = note_boot(engine.as_ref(), &boot, last_seq)?;
        let stored = match engine.get(layout::SEQ_CEILING_KEY)? {
            Some(v) => SeqReservation::decode(&v)?,
            None => SeqReservation::default(),
        };
        let seqs = SeqReservation::opened(stored, boot.restarted);
        if seqs != stored {
            write_seqs(engine.as_ref(), &seqs)?;
        }
        let ahead = match engine.get(layout::AHEAD_KEY)? {
            Some(v) => crate::restart::decode_ahead(layout::AHEAD_KEY, &v)?,
            None => BTreeMap::new(),
        };
        let in_order = match engine.get(layout::COPY_ORDER_KEY)? {
            Some(v) => layout::decode_marks(layout::COPY_ORDER_KEY, &v)?,
            None => BTreeMap::new(),
        };
        let machine_restarted = boot.restarted;
        tracing::info!(
            node = %opts.node_id,
            tables = tables.len(),
            sequences = sequences.len(),
            last_lsn = last_lsn.0,
            log_start,
            log_retained_bytes,
            last_seq,
            seq_floor = seqs.floor,
            "store opened"
        );
        let inner = Inner {
            engine,
            opts,
            catalog: Catalog::new(tables, sequences),
            commit: Mutex::new(CommitState {
                last_lsn,
                last_seq,
                seqs,
                next_table_id,
            }),
            applied_lsn: AtomicU64::new(last_lsn.0),
            flush: GroupFlush::new(last_lsn),
            log: CommitLog::opened(log_start, log_sizes, ddl_lsns, last_commits),
            marks: Marks::new(marks),
            locks: LockManager::default(),
            epoch: AtomicU64::new(0),
            next_txn_id: AtomicU64::new(1),
            apply_lock: tokio::sync::Mutex::new(()),
            apply_metrics: crate::apply_metrics::ApplyMetrics::new(),
            conflicts: Default::default(),
            aggregates: Default::default(),
            held: crate::held::HeldRows::default(),
            refusals: RwLock::new(Refusals::default()),
            created_generation: AtomicU64::new(0),
            fence: RestartFence::new(machine_restarted, restart, ahead),
            in_order: RwLock::new(in_order),
            paused: RwLock::new(None),
            lease: crate::lease::LeaseGate::default(),
            space: std::sync::OnceLock::new(),
            counters: Counters::default(),
            metrics: Metrics::new(),
        };
        Ok(Database {
            inner: Arc::new(inner),
        })
    }

    /// Opens (or creates) a sled-backed database in `dir`.
    pub fn open_sled(dir: &Path, opts: DbOptions) -> Result<Database, StoreError> {
        let min_free = opts.min_free_bytes;
        let engine = SledEngine::open_salvaging(dir, opts.salvage)?;
        let db = Self::open(Arc::new(engine), opts)?;
        if min_free > 0 {
            let guard = SpaceGuard::start(dir, min_free)?;
            let _ = db.inner.space.set(guard);
        }
        Ok(db)
    }

    /// A fresh in-memory database.
    pub fn open_memory(opts: DbOptions) -> Result<Database, StoreError> {
        Self::open(Arc::new(MemEngine::new()), opts)
    }
}

/// Refuses a keyspace of another format; marks an empty one as ours.
fn check_format(engine: &dyn KvEngine) -> Result<(), StoreError> {
    match engine.get(FORMAT_KEY)? {
        Some(v) => {
            let version = v
                .strip_prefix(FORMAT_MAGIC)
                .and_then(|rest| <[u8; 4]>::try_from(rest).ok())
                .map(u32::from_be_bytes)
                .ok_or_else(|| {
                    StoreError::IncompatibleFormat(format!(
                        "the format marker reads {:?}, which is not a hawser store's",
                        printable_key(&v)
                    ))
                })?;
            if version == FORMAT_VERSION {
                Ok(())
            } else if (1..=3).contains(&version) {
                // Format 1 wrote every origin's high-water key with each commit; format
                // 2 derives the marks from the log and writes the keys only as log is
                // released. A format-1 store is a valid format-2 store (its keys are
                // current). Format 3 keeps the log keys in the sled engine's
                // write-ahead log; the engine still reads and deletes those an older
                // store left in sled. So both are upgraded by rewriting the marker: an
                // older build must not open the store afterwards (it would not find the
                // log, and would drop the log segments that hold it). Format 4 reads
                // an older `H` value (its seq alone) as it is.
                write_format_marker(engine)
            } else if version > FORMAT_VERSION {
                Err(StoreError::IncompatibleFormat(format!(
                    "written by a newer hawser (store format {version}; this build reads format {FORMAT_VERSION})"
                )))
            } else {
                Err(StoreError::IncompatibleFormat(format!(
                    "unknown store format {version} (this build reads format {FORMAT_VERSION})"
                )))
            }
        }
        None => {
            let any = engine
                .scan((Bound::Unbounded, Bound::Unbounded), false)
                .next()
                .transpose()?;
            if let Some((k, _)) = any {
                return Err(StoreError::IncompatibleFormat(format!(
                    "it holds data (first key {}) but no hawser format marker",
                    printable_key(&k)
                )));
            }
            write_format_marker(engine)
        }
    }
}

/// Writes this build's format marker, durably.
fn write_format_marker(engine: &dyn KvEngine) -> Result<(), StoreError> {
    let mut batch = WriteBatch::new();
    batch.put(FORMAT_KEY.to_vec(), layout::format_value());
    engine.apply(batch)?;
    engine.flush()
}

/// Where Linux tells the id of the running boot.
const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// The running boot's id, and whether the store was last opened under another one —
/// or under one that could not be read, which counts as a restart. A store opened for
/// the first time was not.
struct Boot {
    /// What to record: the running boot's id (empty when it cannot be read).
    current: Vec<u8>,
    changed: bool,
    restarted: bool,
}

fn read_boot(engine: &dyn KvEngine, boot_id: Option<&str>) -> Result<Boot, StoreError> {
    let current = match boot_id {
        Some(id) => Some(id.to_string()),
        None => std::fs::read_to_string(BOOT_ID_PATH)
            .ok()
            .map(|s| s.trim().to_string()),
    };
    let stored = engine.get(layout::BOOT_KEY)?;
    let restarted = match (&stored, &current) {
        (None, _) => false,
        (Some(before), Some(now)) => before.as_slice() != now.as_bytes(),
        (Some(_), None) => true,
    };
    let current = current.unwrap_or_default().into_bytes();
    Ok(Boot {
        changed: stored.as_deref() != Some(current.as_slice()),
        current,
        restarted,
    })
}

/// Records the running boot's id and, after a machine restart, a new restart point
/// at `last_seq` (this node's last own seq as opened) — in one durable batch, so a
/// crash before it is recorded leaves the next open to see the restart again. Returns
/// the restart point now in force (the stored one when the machine did not restart).
fn note_boot(
    engine: &dyn KvEngine,
    boot: &Boot,
    last_seq: u64,
) -> Result<Option<RestartPoint>, StoreError> {
    let stored = match engine.get(layout::RESTART_KEY)? {
        Some(v) => Some(RestartPoint::decode(layout::RESTART_KEY, &v)?),
        None => None,
    };
    let restart = if boot.restarted {
        Some(RestartPoint::after(stored.as_ref(), last_seq))
    } else {
        stored
    };
    if boot.changed || boot.restarted {
        let mut batch = WriteBatch::new();
        batch.put(layout::BOOT_KEY.to_vec(), boot.current.clone());
        if let Some(point) = restart.as_ref().filter(|_| boot.restarted) {
            batch.put(layout::RESTART_KEY.to_vec(), point.encode());
        }
        engine.apply(batch)?;
        engine.flush()?;
    }
    Ok(restart)
}
