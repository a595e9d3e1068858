//! The Raft log, vote and state machine, persisted through the store's [`KvEngine`].
//!
//! openraft's storage-v2 API splits storage in two: [`LogStore`]
//! ([`RaftLogStorage`]: vote, log entries, purge / truncate) and [`StateMachineStore`]
//! ([`RaftStateMachine`]: applied state, snapshots). Both write into one keyspace under
//! the prefix `rft/`, so the engine may be a dedicated one (the node opens
//! `<data>/raft`) or shared with other data:
//!
//! ```text
//! rft/v            vote                           JSON, flushed before save_vote returns
//! rft/c            last committed log id          JSON (a hint; losing it is harmless)
//! rft/p            last purged log id             JSON, written in the purge batch
//! rft/l<index>     log entry, index big-endian    JSON, flushed before the append is acked
//! rft/m            applied state machine          JSON {last_applied, membership, state}
//! rft/s            current snapshot's metadata    JSON
//! rft/d            current snapshot's data        JSON of the ClusterState
//! rft/x            this node's removal            JSON, flushed (crate::removal)
//! ```
//!
//! Durability order: a vote or an appended entry is flushed ([`KvEngine::flush`])
//! before openraft is told it is durable, because a vote or an acknowledged entry that a
//! crash forgets breaks Raft's safety. The state machine is written and flushed with
//! every applied batch, so a restart resumes from `last_applied` instead of replaying
//! the log; it is small (the cluster's configuration, not its data).
//!
//! A failed read or write is returned as openraft's [`StorageError`], which stops the
//! Raft instance: the node must treat that as fatal and restart.

// openraft's trait signatures fix the error type (`StorageError`, ~200 bytes); boxing it
// in the helpers would only add conversions.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::io::Cursor;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, OnceLock};

use hawser_store::{KvEngine, StoreError, WriteBatch};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    AnyError, EntryPayload, ErrorSubject, ErrorVerb, OptionalSend, RaftLogReader,
    RaftSnapshotBuilder, StorageIOError,
};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::removal::RemovalBook;
use crate::state::{self, ClusterState, Response};
use crate::types::{Entry, LogId, SnapshotMeta, StorageError, StoredMembership, TypeConfig, Vote};

const VOTE_KEY: &[u8] = b"rft/v";
const COMMITTED_KEY: &[u8] = b"rft/c";
const PURGED_KEY: &[u8] = b"rft/p";
const LOG_PREFIX: &[u8] = b"rft/l";
const SM_KEY: &[u8] = b"rft/m";
const SNAPSHOT_META_KEY: &[u8] = b"rft/s";
const SNAPSHOT_DATA_KEY: &[u8] = b"rft/d";

type StorageResult<T> = Result<T, StorageError>;

fn log_key(index: u64) -> Vec<u8> {
    let mut k = LOG_PREFIX.to_vec();
    k.extend_from_slice(&index.to_be_bytes());
    k
}

/// The first key after every log key.
fn log_end() -> Vec<u8> {
    let mut k = LOG_PREFIX.to_vec();
    k.push(0xff);
    k.extend_from_slice(&[0xff; 8]);
    k
}

fn read_err(e: &(impl std::error::Error + 'static)) -> StorageError {
    StorageIOError::read(AnyError::new(e)).into()
}

fn write_err(e: &(impl std::error::Error + 'static)) -> StorageError {
    StorageIOError::write(AnyError::new(e)).into()
}

fn get_json<T: for<'de> Deserialize<'de>>(
    engine: &dyn KvEngine,
    key: &[u8],
) -> Result<Option<T>, StorageError> {
    match engine.get(key).map_err(|e| read_err(&e))? {
        None => Ok(None),
        Some(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| read_err(&e)),
    }
}

fn to_json<T: Serialize>(value: &T) -> Result<Vec<u8>, StorageError> {
    serde_json::to_vec(value).map_err(|e| write_err(&e))
}

/// Makes everything applied so far durable, off the async threads: a sled flush is an
/// fsync and may take milliseconds.
async fn flush(engine: &Arc<dyn KvEngine>) -> Result<(), StoreError> {
    let engine = engine.clone();
    match tokio::task::spawn_blocking(move || engine.flush()).await {
        Ok(result) => result,
        Err(join) => Err(StoreError::Io {
            context: "flush".into(),
            source: Box::new(join),
        }),
    }
}

/// The Raft log and vote.
#[derive(Clone)]
pub struct LogStore {
    engine: Arc<dyn KvEngine>,
}

impl LogStore {
    /// The log stored in `engine` (empty on a new engine).
    pub fn new(engine: Arc<dyn KvEngine>) -> Self {
        Self { engine }
    }

    fn last_entry_id(&self) -> StorageResult<Option<LogId>> {
        let range = (Bound::Included(log_key(0)), Bound::Excluded(log_end()));
        match self.engine.scan(range, true).next() {
            None => Ok(None),
            Some(Err(e)) => Err(read_err(&e)),
            Some(Ok((_, bytes))) => {
                let entry: Entry = serde_json::from_slice(&bytes).map_err(|e| read_err(&e))?;
                Ok(Some(entry.log_id))
            }
        }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry>> {
        let start = match range.start_bound() {
            Bound::Included(i) => Bound::Included(log_key(*i)),
            Bound::Excluded(i) => Bound::Excluded(log_key(*i)),
            Bound::Unbounded => Bound::Included(log_key(0)),
        };
        let end = match range.end_bound() {
            Bound::Included(i) => Bound::Included(log_key(*i)),
            Bound::Excluded(i) => Bound::Excluded(log_key(*i)),
            Bound::Unbounded => Bound::Excluded(log_end()),
        };
        self.engine
            .scan((start, end), false)
            .map(|item| {
                let (_, bytes) = item.map_err(|e| read_err(&e))?;
                serde_json::from_slice(&bytes).map_err(|e| read_err(&e))
            })
            .collect()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let last_purged_log_id: Option<LogId> = get_json(&*self.engine, PURGED_KEY)?;
        // An empty log's last entry is the last purged one.
        let last_log_id = self.last_entry_id()?.or(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> StorageResult<()> {
        let mut batch = WriteBatch::new();
        batch.put(VOTE_KEY.to_vec(), to_json(vote)?);
        let vote_err = |e: &StoreError| -> StorageError {
            StorageIOError::new(ErrorSubject::Vote, ErrorVerb::Write, AnyError::new(e)).into()
        };
        self.engine.apply(batch).map_err(|e| vote_err(&e))?;
        // A vote must survive a crash before the node acts on it (answers the candidate).
        flush(&self.engine).await.map_err(|e| vote_err(&e))
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote>> {
        get_json(&*self.engine, VOTE_KEY)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> StorageResult<()> {
        // Not flushed: it only spares re-reading the log after a restart.
        let mut batch = WriteBatch::new();
        batch.put(COMMITTED_KEY.to_vec(), to_json(&committed)?);
        self.engine.apply(batch).map_err(|e| write_err(&e))
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId>> {
        Ok(get_json::<Option<LogId>>(&*self.engine, COMMITTED_KEY)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = WriteBatch::new();
        for entry in entries {
            batch.put(log_key(entry.log_id.index), to_json(&entry)?);
        }
        // 1. write: the entries are readable once apply returns.
        if let Err(e) = self.engine.apply(batch) {
            callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
            return Err(write_err(&e));
        }
        // 2. flush, 3. only then report them durable (the leader counts them toward a
        // quorum, a follower acknowledges them).
        match flush(&self.engine).await {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(write_err(&e))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> StorageResult<()> {
        // One atomic batch deletes [log_id.index, end): no hole can appear.
        let range = (
            Bound::Included(log_key(log_id.index)),
            Bound::Excluded(log_end()),
        );
        let mut batch = WriteBatch::new();
        for item in self.engine.scan(range, false) {
            let (key, _) = item.map_err(|e| read_err(&e))?;
            batch.delete(key);
        }
        self.engine.apply(batch).map_err(|e| write_err(&e))
    }

    async fn purge(&mut self, log_id: LogId) -> StorageResult<()> {
        // The purge mark and the deletions go in one atomic batch, so the log never
        // starts after a gap that the mark does not explain.
        let mut batch = WriteBatch::new();
        batch.put(PURGED_KEY.to_vec(), to_json(&log_id)?);
        let range = (
            Bound::Included(log_key(0)),
            Bound::Included(log_key(log_id.index)),
        );
        for item in self.engine.scan(range, false) {
            let (key, _) = item.map_err(|e| read_err(&e))?;
            batch.delete(key);
        }
        self.engine.apply(batch).map_err(|e| write_err(&e))
    }
}

/// What the state machine persists under `rft/m`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Applied {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    state: ClusterState,
}

/// The applied cluster state, its persistence and its snapshots.
///
/// Cheap to clone; clones share the state. [`StateMachineStore::subscribe`] gives a
/// watch of the state for readers outside Raft.
#[derive(Clone)]
pub struct StateMachineStore {
    engine: Arc<dyn KvEngine>,
    applied: Arc<RwLock<Applied>>,
    watch: Arc<watch::Sender<Arc<ClusterState>>>,
    /// Told of every applied state, to notice this node's own removal.
    removal: Arc<OnceLock<Arc<RemovalBook>>>,
}

impl StateMachineStore {
    /// The state machine stored in `engine`: the last applied state, or an empty one.
    pub fn open(engine: Arc<dyn KvEngine>) -> Result<Self, StorageError> {
        let applied: Applied = get_json(&*engine, SM_KEY)?.unwrap_or_default();
        let (tx, _) = watch::channel(Arc::new(applied.state.clone()));
        Ok(Self {
            engine,
            applied: Arc::new(RwLock::new(applied)),
            watch: Arc::new(tx),
            removal: Arc::default(),
        })
    }

    /// Has every applied state checked for this node's removal by `book`.
    pub(crate) fn watch_removal(&self, book: Arc<RemovalBook>) {
        let _ = self.removal.set(book);
    }

    /// The ids in the last applied (committed) membership, voters and learners.
    pub fn members(&self) -> std::collections::BTreeSet<u64> {
        self.applied
            .read()
            .membership
            .membership()
            .nodes()
            .map(|(id, _)| *id)
            .collect()
    }

    async fn publish(&self, state: Arc<ClusterState>) {
        if let Some(book) = self.removal.get() {
            book.observe(&state).await;
        }
        self.watch.send_replace(state);
    }

    /// A receiver that always holds the latest applied cluster state.
    pub fn subscribe(&self) -> watch::Receiver<Arc<ClusterState>> {
        self.watch.subscribe()
    }

    /// The cluster state as applied so far.
    pub fn state(&self) -> Arc<ClusterState> {
        self.watch.borrow().clone()
    }

    fn persist(&self, applied: &Applied) -> StorageResult<WriteBatch> {
        let mut batch = WriteBatch::new();
        batch.put(SM_KEY.to_vec(), to_json(applied)?);
        Ok(batch)
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<TypeConfig>> {
        // Data, last_applied and membership are taken under one lock so the snapshot
        // is exactly the state at `last_applied`.
        let (data, meta) = {
            let applied = self.applied.read();
            let data = to_json(&applied.state)?;
            let last = applied.last_applied;
            let snapshot_id = format!(
                "{}-{}-{}",
                last.map_or(0, |l| l.leader_id.term),
                last.map_or(0, |l| l.index),
                unique_suffix()
            );
            let meta = SnapshotMeta {
                last_log_id: last,
                last_membership: applied.membership.clone(),
                snapshot_id,
            };
            (data, meta)
        };
        let mut batch = WriteBatch::new();
        batch.put(SNAPSHOT_META_KEY.to_vec(), to_json(&meta)?);
        batch.put(SNAPSHOT_DATA_KEY.to_vec(), data.clone());
        let snap_err = |e: &StoreError| -> StorageError {
            StorageIOError::write_snapshot(Some(meta.signature()), AnyError::new(e)).into()
        };
        self.engine.apply(batch).map_err(|e| snap_err(&e))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

/// A suffix that makes snapshot ids unique across builds and restarts.
fn unique_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = StateMachineStore;

    async fn applied_state(&mut self) -> StorageResult<(Option<LogId>, StoredMembership)> {
        let applied = self.applied.read();
        Ok((applied.last_applied, applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<Response>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let (responses, batch, state) = {
            let mut applied = self.applied.write();
            let mut responses = Vec::new();
            for entry in entries {
                applied.last_applied = Some(entry.log_id);
                // One response per entry, blank and membership entries included.
                let response = match entry.payload {
                    EntryPayload::Blank => Response::Empty,
                    EntryPayload::Normal(cmd) => {
                        state::apply_at(&mut applied.state, &cmd, entry.log_id.index)
                    }
                    EntryPayload::Membership(m) => {
                        let voters = m.voter_ids().map(hawser_core::NodeId).collect();
                        applied.state.set_voters(&voters);
                        applied.membership = StoredMembership::new(Some(entry.log_id), m);
                        Response::Empty
                    }
                };
                responses.push(response);
            }
            (
                responses,
                self.persist(&applied)?,
                Arc::new(applied.state.clone()),
            )
        };
        let sm_err = |e: &StoreError| -> StorageError {
            StorageIOError::write_state_machine(AnyError::new(e)).into()
        };
        self.engine.apply(batch).map_err(|e| sm_err(&e))?;
        flush(&self.engine).await.map_err(|e| sm_err(&e))?;
        self.publish(state).await;
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    // What is installed was checked by `check_snapshot_data` when its last chunk came
    // (crate::service::SnapshotMirror): an error here stops the control plane.
    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StorageResult<()> {
        let data = snapshot.into_inner();
        let snap_err = |e: &(dyn std::error::Error + 'static)| -> StorageError {
            StorageIOError::read_snapshot(Some(meta.signature()), AnyError::from_dyn(e, None))
                .into()
        };
        let state: ClusterState = serde_json::from_slice(&data).map_err(|e| snap_err(&e))?;
        let new = Applied {
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
            state,
        };
        // The replaced state machine and the snapshot that replaced it land together.
        let mut batch = self.persist(&new)?;
        batch.put(SNAPSHOT_META_KEY.to_vec(), to_json(meta)?);
        batch.put(SNAPSHOT_DATA_KEY.to_vec(), data);
        self.engine.apply(batch).map_err(|e| snap_err(&e))?;
        flush(&self.engine).await.map_err(|e| snap_err(&e))?;
        let state = Arc::new(new.state.clone());
        *self.applied.write() = new;
        self.publish(state).await;
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<TypeConfig>>> {
        let Some(meta) = get_json::<SnapshotMeta>(&*self.engine, SNAPSHOT_META_KEY)? else {
            return Ok(None);
        };
        let data = self
            .engine
            .get(SNAPSHOT_DATA_KEY)
            .map_err(|e| read_err(&e))?
            .ok_or_else(|| {
                StorageError::from(StorageIOError::read_snapshot(
                    Some(meta.signature()),
                    AnyError::error("snapshot data missing beside its metadata"),
                ))
            })?;
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}

/// Opens the log and the state machine stored in `engine`.
pub fn open(engine: Arc<dyn KvEngine>) -> Result<(LogStore, StateMachineStore), StorageError> {
    Ok((
        LogStore::new(engine.clone()),
        StateMachineStore::open(engine)?,
    ))
}

/// Whether `data` is a snapshot [`RaftStateMachine::install_snapshot`] can install: the
/// JSON of a [`ClusterState`]. Checked before openraft is handed the last chunk, since
/// its failure there is fatal.
pub(crate) fn check_snapshot_data(data: &[u8]) -> Result<(), String> {
    serde_json::from_slice::<ClusterState>(data)
        .map(drop)
        .map_err(|e| e.to_string())
}
