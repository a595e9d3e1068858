//! What one stream carries, and whether two table definitions may replicate.
//!
//! [`LinkConfig`] is the sender's view of one (sender, receiver) pair, built from the
//! routing plan's [`Link`] plus what the control plane knows (node ids, epochs, scheme
//! version). [`LinkConfig::filter`] decides record by record what goes on the wire:
//! never a transaction back to its origin node, never one the receiver already has,
//! only the changes of the tables the link carries from that origin.
//!
//! [`check_table`] is TABLE DEFINITION CHECKING on the receiver: EXACT wants the same
//! columns in the same order; RELAXED wants the same key, the same number of columns
//! and the same names and types in any order, and maps columns by name.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use hawser_core::{Epoch, Gtid, Ident, NodeId, QualName, RowChange, TableDef, Transaction};
use hawser_scheme::ast::{ReturnService, TableDefinitionChecking};
use hawser_scheme::route::Link;
use hawser_store::{DdlOp, LogEntry};
use thiserror::Error;

use crate::codec::Compression;

/// The largest gRPC message a receiver reads unless told otherwise: the node's default
/// `--max-message-bytes`.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// How a sender paces itself. Defaults suit a LAN; every bound is explicit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SenderTuning {
    /// Log records read per batch at most.
    pub max_batch_records: usize,
    /// Encoded bytes per batch at most, counted exactly (`codec::record_size`): a
    /// record that would take a batch past it starts the next one, and a single larger
    /// record goes alone, in chunks of this size (`Batch.chunk`). Never more than half
    /// the receiver's message limit (see `max_message_bytes`). Also about what a sender
    /// behind the log's in-memory tail reads and decodes at a time.
    pub max_batch_bytes: usize,
    /// The largest gRPC message the receiver reads, as far as this sender knows before
    /// the receiver says its own (`HelloReply.max_message_bytes`; the lower of the two
    /// counts). A message's payload is at most half of it
    /// ([`crate::chunks::payload_budget`]); a larger batch goes in chunks. The default
    /// is the node's default `--max-message-bytes`.
    pub max_message_bytes: usize,
    /// Wire bytes sent and not yet acknowledged at most.
    pub max_in_flight_bytes: u64,
    /// Batches sent and not yet acknowledged at most.
    pub max_in_flight_batches: usize,
    /// Heartbeat period when idle.
    pub heartbeat: Duration,
    /// Silence after which the receiver is taken for dead and the stream reopened.
    pub peer_timeout: Duration,
    /// Deadline for connecting and for the receiver's answer to Hello.
    pub connect_timeout: Duration,
    /// Reconnect backoff: the first wait, doubled at each failed attempt up to
    /// `backoff_max` after a refusal (by the receiver, or this node's own checks) and
    /// up to `reconnect_max` when the receiver could not be reached (refused
    /// connection, reset, silence): a connection attempt costs next to nothing, and a
    /// peer that restarts is then streamed to again within `reconnect_max` of its
    /// start, where a wait grown to 5 s once kept a TWOSAFE subscriber that restarted
    /// in 0.05 s without an ack for 3.3 s. Reset after a session that streamed.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    pub reconnect_max: Duration,
    /// How often a sender looks for new log records besides the times
    /// [`crate::SenderHandle::wake`] tells it to (a look that finds nothing new reads
    /// only the log's end position).
    pub poll_interval: Duration,
    /// How often the position of log the receiver gets nothing of is sent on its own
    /// (a record-less batch), so its acknowledged position keeps up while idle.
    pub position_every: Duration,
    /// On a stream no return service waits on: how long a commit may wait for others
    /// to share its batch, unless `linger_records` are ready sooner. Zero ships every
    /// commit as soon as it is durable, as streams a return service waits on always do.
    /// The poll does not cut a linger short. Each ship costs both nodes a task run, an
    /// HTTP/2 frame, a socket write and a wake-up of the receiver; `docs/stream.md`
    /// has the measured trade against async lag.
    pub linger: Duration,
    pub linger_records: usize,
    /// How long a sibling's sender may have no stream to the receiver before this
    /// node's own stream takes over the node's transactions the sibling would relay
    /// there ([`LinkConfig::takes_over`]).
    pub takeover_after: Duration,
    /// The zstd level of a stream compressed with zstd ([`crate::codec::ZSTD_LEVELS`]).
    pub zstd_level: i32,
}

impl Default for SenderTuning {
    fn default() -> Self {
        Self {
            max_batch_records: 512,
            max_batch_bytes: 1024 * 1024,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            max_in_flight_bytes: 8 * 1024 * 1024,
            max_in_flight_batches: 32,
            heartbeat: Duration::from_millis(250),
            peer_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_secs(5),
            reconnect_max: Duration::from_millis(250),
            poll_interval: Duration::from_millis(5),
            position_every: Duration::from_millis(20),
            linger: Duration::from_millis(5),
            linger_records: 128,
            takeover_after: Duration::from_secs(2),
            zstd_level: crate::codec::ZSTD_DEFAULT_LEVEL,
        }
    }
}

/// Everything a sender needs to know about its stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkConfig {
    pub sender_node: NodeId,
    pub sender_store: Ident,
    pub receiver_store: Ident,
    /// The receiver's node: its own transactions are never sent back to it.
    pub receiver_node: NodeId,
    pub scheme_version: u64,
    /// The elements the stream carries, with their current epochs.
    pub elements: BTreeMap<Ident, Epoch>,
    /// (table, origin node) pairs carried, with the element that carries each.
    pub tables: BTreeMap<(QualName, NodeId), Ident>,
    /// (sequence, origin node) pairs carried, with their element: their blocks of
    /// reserved values are shipped so the receiver's sequence stays ahead.
    pub sequences: BTreeMap<(QualName, NodeId), Ident>,
    /// Ship DDL of the carried origins (DATASTORE elements).
    pub replicate_ddl: bool,
    /// A return service (RECEIPT or TWOSAFE, by request or not) covers a table of the
    /// stream: the receiver flushes every batch before its ack (Hello.returns_wait).
    pub returns_wait: bool,
    /// DATASTORE elements by rule: a table of the origin created after this config was
    /// planned is carried too, if the element's INCLUDE / EXCLUDE lets it in.
    pub datastore: Vec<DatastoreRule>,
    pub compression: Compression,
    pub table_check: TableDefinitionChecking,
    pub tuning: SenderTuning,
    /// The other streams to the same receiver node — from this sender (other schemes)
    /// and from other senders (a propagator beside a master's own stream) — with empty
    /// `siblings` of their own. The receiver keeps one high-water per origin, so it must
    /// get each origin's transactions in seq order across all of them: this stream does
    /// not move past a transaction a sibling carries until the receiver has it
    /// ([`LinkConfig::waits_for_sibling`]; docs/stream.md, "Two paths from one origin to
    /// one receiver").
    pub siblings: Vec<LinkConfig>,
    /// Origins whose transactions this stream relays while a sibling (the origin's
    /// own stream to the same receiver, or another relay's) carries tables of that
    /// origin this node does not receive: this node's log lacks those transactions,
    /// so the stream cannot see them to wait for them. It waits instead, before each
    /// transaction of such an origin, until the siblings carrying the origin have
    /// decided about it (`Ack.decided_paths`: delivered whatever of it they carry, or
    /// found nothing of it).
    pub blind: BTreeSet<NodeId>,
    /// Per origin other than this node's, the sender nodes of the streams into this
    /// node that carry its transactions: how far they have decided (this node's
    /// receiver's marks) is how far this node holds the origin, which the stream
    /// tells siblings that wait for it (`Batch.relayed`).
    pub upstream: BTreeMap<NodeId, BTreeSet<NodeId>>,
    /// The receiver relays transactions this stream carries of another origin than
    /// this node to a store that also gets that origin from another sender: what this
    /// stream decides about them (`Batch.relayed`) is how far the receiver holds them,
    /// which its relay tells the streams beside it. A propagator chain into a blind
    /// relay needs it; without it the relay could only say what it passed.
    pub feeds_relay: bool,
    /// A sibling is blind for an origin this stream relays because of this stream (it
    /// does not receive a table this one carries): it waits for what this stream decides
    /// about that origin (`Batch.relayed`).
    pub read_by_siblings: bool,
    /// Origins this node gets in parts (from two relays that each carry tables the
    /// other does not receive): its log may hold two records of one transaction, and
    /// the stream ships the second even at the receiver's high-water
    /// ([`LinkConfig::ships_parts`]).
    pub parts: BTreeSet<NodeId>,
    /// Transactions a failover forked off: never shipped (see [`ForkedRange`]).
    pub forked: Vec<ForkedRange>,
}

/// The transactions a failover forked off: those of `origin` after `after_seq` (the
/// fork point: what the promoted subscriber had of it) whose log record carries an
/// epoch before `before_epoch` — records carry the cluster's failover era their
/// committer knew, and this is the era the failover started — committed by the
/// deposed master before it heard of the failover, that touch the failed-over
/// element's `tables` (`None`: a DATASTORE element, any table). No survivor that took
/// over has them; the deposed store keeps them in its log even once rebuilt, and must
/// never ship them if it masters again: receivers would take them as new.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ForkedRange {
    pub origin: NodeId,
    pub after_seq: u64,
    pub before_epoch: Epoch,
    pub tables: Option<Vec<QualName>>,
}

impl ForkedRange {
    /// Whether the record of `entry`, committed under `epoch`, is one of these. A
    /// transaction that also wrote tables of an element the deposed master kept is
    /// one of these whole.
    pub fn holds(&self, epoch: Epoch, entry: &LogEntry) -> bool {
        let gtid = entry.gtid();
        if gtid.origin != self.origin || gtid.seq <= self.after_seq || epoch >= self.before_epoch {
            return false;
        }
        match (&self.tables, entry) {
            (None, _) => true,
            (Some(tables), LogEntry::Txn(t)) => t.changes.iter().any(|c| tables.contains(&c.table)),
            (Some(tables), LogEntry::Ddl { op, .. }) => match op {
                DdlOp::CreateTable(def) => tables.contains(&def.name),
                DdlOp::DropTable(name) | DdlOp::AddColumn { table: name, .. } => {
                    tables.contains(name)
                }
                DdlOp::CreateSequence(_) | DdlOp::DropSequence(_) => false,
            },
            (Some(_), LogEntry::SequenceBlock { .. }) => false,
        }
    }
}

/// The tables a DATASTORE element carries, as its INCLUDE / EXCLUDE says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatastoreRule {
    pub element: Ident,
    /// The element's master's node: only its transactions follow the rule.
    pub origin: NodeId,
    /// INCLUDE TABLE names; `None` = every table.
    pub include: Option<BTreeSet<QualName>>,
    /// EXCLUDE TABLE names.
    pub exclude: BTreeSet<QualName>,
}

impl DatastoreRule {
    /// Whether the element carries `table` of `origin`.
    pub fn carries(&self, table: &QualName, origin: NodeId) -> bool {
        origin == self.origin
            && self.include.as_ref().is_none_or(|i| i.contains(table))
            && !self.exclude.contains(table)
    }
}

/// A link that cannot be streamed yet.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum LinkError {
    #[error("store {0} has no node yet")]
    UnknownStore(Ident),
    #[error("element {0} has no epoch")]
    UnknownElement(Ident),
}

impl LinkConfig {
    /// Whether this link carries any transactions of `origin` ([`carried_origins`]
    /// without building the set).
    ///
    /// [`carried_origins`]: LinkConfig::carried_origins
    pub fn carries_origin(&self, origin: NodeId) -> bool {
        self.tables
            .keys()
            .chain(self.sequences.keys())
            .any(|(_, o)| *o == origin)
            || self.datastore.iter().any(|d| d.origin == origin)
    }

    /// The origins whose transactions this link carries (tables, sequences, DATASTORE
    /// elements).
    pub fn carried_origins(&self) -> BTreeSet<NodeId> {
        self.tables
            .keys()
            .chain(self.sequences.keys())
            .map(|(_, o)| *o)
            .chain(self.datastore.iter().map(|d| d.origin))
            .collect()
    }

    /// Builds the config of a routing-plan link. `nodes` maps store names to nodes,
    /// `epochs` gives each element's current epoch. Compression follows the sender's
    /// COMPRESS TRAFFIC (lz4 when on), table checking the receiver's setting.
    pub fn from_link(
        link: &Link,
        scheme_version: u64,
        nodes: &BTreeMap<Ident, NodeId>,
        epochs: &BTreeMap<Ident, Epoch>,
    ) -> Result<Self, LinkError> {
        let node = |s: &Ident| {
            nodes
                .get(s)
                .copied()
                .ok_or(LinkError::UnknownStore(s.clone()))
        };
        let mut elements = BTreeMap::new();
        let mut tables = BTreeMap::new();
        for t in &link.tables {
            let epoch = epochs
                .get(&t.element)
                .copied()
                .ok_or(LinkError::UnknownElement(t.element.clone()))?;
            elements.insert(t.element.clone(), epoch);
            tables.insert((t.table.clone(), node(&t.origin)?), t.element.clone());
        }
        let mut sequences = BTreeMap::new();
        for q in &link.sequences {
            let epoch = epochs
                .get(&q.element)
                .copied()
                .ok_or(LinkError::UnknownElement(q.element.clone()))?;
            elements.insert(q.element.clone(), epoch);
            sequences.insert((q.sequence.clone(), node(&q.origin)?), q.element.clone());
        }
        Ok(Self {
            sender_node: node(&link.sender)?,
            sender_store: link.sender.clone(),
            receiver_store: link.receiver.clone(),
            receiver_node: node(&link.receiver)?,
            scheme_version,
            elements,
            tables,
            sequences,
            replicate_ddl: false,
            returns_wait: link
                .tables
                .iter()
                .any(|t| t.return_service != ReturnService::NoReturn),
            datastore: Vec::new(),
            compression: if link.sender_settings.compress_traffic {
                Compression::Lz4
            } else {
                Compression::None
            },
            table_check: link.receiver_settings.table_definition_checking,
            tuning: SenderTuning::default(),
            siblings: Vec::new(),
            blind: BTreeSet::new(),
            upstream: BTreeMap::new(),
            feeds_relay: false,
            read_by_siblings: false,
            parts: BTreeSet::new(),
            forked: Vec::new(),
        })
    }

    /// Whether the record of `entry`, committed under `epoch`, was forked off by a
    /// failover ([`LinkConfig::forked`]): it is never shipped.
    pub fn forked_off(&self, epoch: Epoch, entry: &LogEntry) -> bool {
        self.forked.iter().any(|f| f.holds(epoch, entry))
    }

    /// Whether any of `entry` goes to the receiver on this stream, the receiver's
    /// high-water aside.
    pub fn carries(&self, entry: &LogEntry) -> bool {
        let gtid = entry.gtid();
        if gtid.origin == self.receiver_node {
            return false;
        }
        match entry {
            LogEntry::Txn(t) => t
                .changes
                .iter()
                .any(|c| self.carries_table(&c.table, gtid.origin)),
            LogEntry::Ddl { op, .. } => {
                let carried = match op {
                    DdlOp::CreateTable(def) => self.carries_table(&def.name, gtid.origin),
                    DdlOp::DropTable(name) | DdlOp::AddColumn { table: name, .. } => {
                        self.carries_table(name, gtid.origin)
                    }
                    DdlOp::CreateSequence(_) | DdlOp::DropSequence(_) => {
                        self.origins().contains(&gtid.origin)
                    }
                };
                self.replicate_ddl && carried
            }
            LogEntry::SequenceBlock { name, .. } => {
                self.sequences.contains_key(&(name.clone(), gtid.origin))
            }
        }
    }

    /// Whether this stream must stop before `entry`: another stream to the same
    /// receiver carries it, this one does not, and the receiver (with `high_water`)
    /// does not have it yet. Moving past it would let this stream deliver a later
    /// transaction of the same origin first, after which the receiver would take the
    /// sibling's for a duplicate.
    ///
    /// A transaction split between two streams (part of it on each) goes whole on the
    /// origin's own stream, if one of them is that ([`LinkConfig::filter_ref`]): any
    /// other stream carrying a part of it also stops before it until the receiver has
    /// it, and then leaves it (the filter drops what the receiver has). Without that,
    /// the part delivered first would raise the receiver's mark and the other part be
    /// skipped as a duplicate.
    ///
    /// An origin in [`LinkConfig::blind`]: the stream also stops before each of its
    /// transactions until the siblings that carry the origin have decided about it
    /// (`decided`, by (origin, sender node): the receiver's `Ack.decided_paths`). The
    /// origin's own stream must have decided about the transaction itself (it ships a
    /// transaction it carries part of whole); another relay only about the ones
    /// before it — each relay ships its own part of a transaction split between them,
    /// and neither could decide about it before the other.
    pub fn waits_for_sibling(
        &self,
        entry: &LogEntry,
        high_water: &BTreeMap<NodeId, u64>,
        decided: &BTreeMap<(NodeId, NodeId), u64>,
    ) -> bool {
        if self.siblings.is_empty() {
            return false;
        }
        let gtid = entry.gtid();
        if gtid.origin == self.receiver_node
            || gtid.seq <= high_water.get(&gtid.origin).copied().unwrap_or(0)
        {
            return false;
        }
        let relays = self.sender_node != gtid.origin;
        if self.undecided(gtid, decided).next().is_some() {
            return true;
        }
        let mine = self.carries(entry);
        self.siblings
            .iter()
            .any(|s| s.carries(entry) && (!mine || (relays && s.sender_node == gtid.origin)))
    }

    /// The siblings a blind relay waits for before `gtid` ([`LinkConfig::blind`]):
    /// those carrying its origin that have not decided far enough — the origin's own
    /// stream about `gtid` itself, another relay about every transaction before it.
    fn undecided<'a>(
        &'a self,
        gtid: Gtid,
        decided: &'a BTreeMap<(NodeId, NodeId), u64>,
    ) -> impl Iterator<Item = &'a LinkConfig> + 'a {
        let blind = self.sender_node != gtid.origin && self.blind.contains(&gtid.origin);
        self.siblings
            .iter()
            .filter(move |s| {
                blind && s.sender_node != self.sender_node && s.carries_origin(gtid.origin)
            })
            .filter(move |s| {
                let need = if s.sender_node == gtid.origin {
                    gtid.seq
                } else {
                    gtid.seq - 1
                };
                decided
                    .get(&(gtid.origin, s.sender_node))
                    .copied()
                    .unwrap_or(0)
                    < need
            })
    }

    /// What this stream, stopped before `entry` ([`LinkConfig::waits_for_sibling`]),
    /// waits for, in words for status: the siblings whose decision it needs, or the
    /// receiver to get the transaction from a sibling.
    pub fn waits_for(
        &self,
        entry: &LogEntry,
        high_water: &BTreeMap<NodeId, u64>,
        decided: &BTreeMap<(NodeId, NodeId), u64>,
    ) -> String {
        let gtid = entry.gtid();
        let name = |n: NodeId| {
            if n == self.sender_node {
                return self.sender_store.to_string();
            }
            self.siblings
                .iter()
                .find(|s| s.sender_node == n)
                .map_or_else(|| format!("node {}", n.0), |s| s.sender_store.to_string())
        };
        let origin = name(gtid.origin);
        let undecided: BTreeSet<String> = self
            .undecided(gtid, decided)
            .map(|s| s.sender_store.to_string())
            .collect();
        if !undecided.is_empty() {
            let list: Vec<String> = undecided.into_iter().collect();
            return format!(
                "{} to say it has sent {}'s transactions before {gtid} ({} cannot see them)",
                list.join(" and "),
                origin,
                self.sender_store
            );
        }
        let carriers: BTreeSet<String> = self
            .siblings
            .iter()
            .filter(|s| s.carries(entry))
            .map(|s| s.sender_store.to_string())
            .collect();
        let list: Vec<String> = carriers.into_iter().collect();
        let has = high_water.get(&gtid.origin).copied().unwrap_or(0);
        format!(
            "{} to get {}'s transaction {gtid} from {} (it has {} through seq {has})",
            self.receiver_store,
            origin,
            list.join(" or "),
            origin
        )
    }

    /// Whether this stream, stopped before its own node's transaction `entry` (it
    /// carries none of it, a sibling does), has still decided about it: no other
    /// stream of this node's to the receiver carries it (only relays of it do, which
    /// wait for this decision).
    pub fn decides_while_waiting(&self, entry: &LogEntry) -> bool {
        entry.gtid().origin == self.sender_node
            && !self.carries(entry)
            && !self
                .siblings
                .iter()
                .any(|s| s.sender_node == self.sender_node && s.carries(entry))
    }

    /// Whether this stream, stopped before its own node's transaction `entry` that only
    /// other nodes' streams carry (propagators relaying it), ships it itself: every
    /// one of those senders is in `absent` (no stream to the receiver for a while).
    /// Otherwise a propagator that is down would hold this stream — and the receiver's
    /// tables this stream carries — until it is back. The receiver gets the same rows
    /// either way; the propagator, back, finds them there (its receiver's mark has
    /// passed them). Row changes and sequence blocks (which only set the receiver's
    /// sequence ahead); DDL waits.
    pub fn takes_over(&self, entry: &LogEntry, absent: &BTreeSet<NodeId>) -> bool {
        let own = self.sender_node;
        if let LogEntry::Ddl { .. } = entry {
            return false;
        }
        if entry.gtid().origin != own || self.carries(entry) {
            return false;
        }
        let mut carriers = self.siblings.iter().filter(|s| s.carries(entry)).peekable();
        carriers.peek().is_some()
            && carriers.all(|s| s.sender_node != own && absent.contains(&s.sender_node))
    }

    /// Whether this stream ships `table` of its own sender's commits only as part of
    /// transactions it carries for other tables: a sibling stream carries `table` to
    /// the same receiver, this one does not ([`LinkConfig::filter_ref`]). Hello
    /// describes such tables too, so the receiver checks them (and maps their columns)
    /// as it does the stream's own.
    pub fn completes(&self, table: &QualName) -> bool {
        let own = self.sender_node;
        !self.carries_table(table, own) && self.sibling_carries(table, own)
    }

    /// Whether this stream relays `origin`'s transactions beside another relay of
    /// them that carries tables this node does not receive: a transaction of `origin`
    /// writing tables of both reaches the receiver in two parts, and this stream's part
    /// goes even when the receiver's high-water is the transaction's own seq already
    /// (the other part came first; the receiver takes the tables it lacks:
    /// docs/stream.md, "Two blind relays").
    /// A stream from a node that got `origin` in parts ([`LinkConfig::parts`]) ships
    /// both records of such a transaction the same way.
    pub fn ships_parts(&self, origin: NodeId) -> bool {
        self.sender_node != origin
            && (self.parts.contains(&origin)
                || self.blind.contains(&origin)
                    && self.siblings.iter().any(|s| {
                        s.sender_node != origin
                            && s.sender_node != self.sender_node
                            && s.carries_origin(origin)
                    }))
    }

    fn sibling_carries(&self, table: &QualName, origin: NodeId) -> bool {
        self.siblings.iter().any(|s| s.carries_table(table, origin))
    }

    /// Whether rows of `table` committed at `origin` go to the receiver.
    fn carries_table(&self, table: &QualName, origin: NodeId) -> bool {
        self.tables.contains_key(&(table.clone(), origin))
            || self.datastore.iter().any(|r| r.carries(table, origin))
    }

    fn origins(&self) -> BTreeSet<NodeId> {
        self.tables.keys().map(|(_, o)| *o).collect()
    }

    /// What of `entry` goes to the receiver, which has `high_water` of each origin:
    /// `None` when nothing does. Takes the entry by value so that what is kept moves on
    /// to the wire without a copy (the sender owns the records it read).
    pub fn filter(&self, entry: LogEntry, high_water: &BTreeMap<NodeId, u64>) -> Option<LogEntry> {
        self.filter_ref(&entry, high_water).map(Cow::into_owned)
    }

    /// What of this node's own transaction `entry` the receiver gets by this stream or
    /// a sibling: what this stream ships when it takes over ([`LinkConfig::takes_over`]).
    pub fn filter_whole<'a>(
        &self,
        entry: &'a LogEntry,
        high_water: &BTreeMap<NodeId, u64>,
    ) -> Option<Cow<'a, LogEntry>> {
        let gtid = entry.gtid();
        let LogEntry::Txn(t) = entry else {
            let fresh = gtid.seq > high_water.get(&gtid.origin).copied().unwrap_or(0);
            if let LogEntry::SequenceBlock { .. } = entry {
                if fresh
                    && gtid.origin == self.sender_node
                    && self.siblings.iter().any(|s| s.carries(entry))
                {
                    return Some(Cow::Borrowed(entry));
                }
            }
            return self.filter_ref(entry, high_water);
        };
        if gtid.origin != self.sender_node
            || gtid.seq <= high_water.get(&gtid.origin).copied().unwrap_or(0)
        {
            return self.filter_ref(entry, high_water);
        }
        kept(entry, t, |c| {
            self.carries_table(&c.table, gtid.origin) || self.sibling_carries(&c.table, gtid.origin)
        })
    }

    /// [`LinkConfig::filter`] on a borrowed entry: the entry itself when all of it goes
    /// (the common case: no copy), a copy with the carried changes when only some do.
    pub fn filter_ref<'a>(
        &self,
        entry: &'a LogEntry,
        high_water: &BTreeMap<NodeId, u64>,
    ) -> Option<Cow<'a, LogEntry>> {
        let gtid = entry.gtid();
        let mark = high_water.get(&gtid.origin).copied().unwrap_or(0);
        if gtid.origin == self.receiver_node
            || gtid.seq < mark
            || (gtid.seq == mark && !self.ships_parts(gtid.origin))
        {
            return None;
        }
        match entry {
            LogEntry::Txn(t) => {
                let origin = gtid.origin;
                let carried = t
                    .changes
                    .iter()
                    .filter(|c| self.carries_table(&c.table, origin))
                    .count();
                if carried == t.changes.len() {
                    Some(Cow::Borrowed(entry))
                } else if carried == 0 {
                    None
                } else {
                    // The sender's own transaction, split with a sibling stream to the
                    // same receiver: this stream takes the sibling's part too, so the
                    // receiver gets all of it at once (the sibling waits for it and
                    // then leaves it: `waits_for_sibling`). A relay has only what it
                    // received, so it ships its own part only.
                    let whole = origin == self.sender_node;
                    kept(entry, t, |c| {
                        self.carries_table(&c.table, origin)
                            || (whole && self.sibling_carries(&c.table, origin))
                    })
                }
            }
            // A table's DDL goes where its rows go (EXCLUDEd tables stay home); a
            // sequence's blocks go where the sequence does.
            other => self.carries(other).then_some(Cow::Borrowed(other)),
        }
    }
}

/// The changes of transaction `t` (which is `entry`) that `keep` keeps: `entry` itself
/// when all are kept (no copy), a copy with the kept ones when some are, `None` when none.
fn kept<'a>(
    entry: &'a LogEntry,
    t: &Transaction,
    keep: impl Fn(&RowChange) -> bool,
) -> Option<Cow<'a, LogEntry>> {
    if t.changes.iter().all(&keep) {
        return Some(Cow::Borrowed(entry));
    }
    let mut t = t.clone();
    t.changes.retain(|c| keep(c));
    (!t.changes.is_empty()).then_some(Cow::Owned(LogEntry::Txn(t)))
}

/// Why a sender's table definition does not fit the receiver's.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("table {table}: {reason}")]
pub struct TableMismatch {
    pub table: QualName,
    pub reason: String,
}

/// Checks the sender's definition of a table against the receiver's under `mode`.
/// Returns, when the columns are in another order (RELAXED only), for each of the
/// receiver's columns the position of the sender's column that fills it.
pub fn check_table(
    local: &TableDef,
    remote: &TableDef,
    mode: TableDefinitionChecking,
) -> Result<Option<Vec<usize>>, TableMismatch> {
    let fail = |reason: String| TableMismatch {
        table: local.name.clone(),
        reason,
    };
    if local.columns.len() != remote.columns.len() {
        return Err(fail(format!(
            "the sender has {} columns, this node {}",
            remote.columns.len(),
            local.columns.len()
        )));
    }
    let key_names = |t: &TableDef| -> Vec<Ident> {
        t.primary_key
            .iter()
            .filter_map(|&i| t.columns.get(i).map(|c| c.name.clone()))
            .collect()
    };
    if key_names(local) != key_names(remote) {
        return Err(fail("the primary keys differ".into()));
    }
    match mode {
        TableDefinitionChecking::Exact => {
            for (i, (l, r)) in local.columns.iter().zip(&remote.columns).enumerate() {
                if l.name != r.name || l.data_type != r.data_type || l.nullable != r.nullable {
                    return Err(fail(format!(
                        "column {} is {} {}{} here and {} {}{} at the sender (EXACT)",
                        i + 1,
                        l.name,
                        l.data_type,
                        if l.nullable { "" } else { " NOT NULL" },
                        r.name,
                        r.data_type,
                        if r.nullable { "" } else { " NOT NULL" },
                    )));
                }
            }
            Ok(None)
        }
        TableDefinitionChecking::Relaxed => {
            let mut map = Vec::with_capacity(local.columns.len());
            for l in &local.columns {
                let Some(j) = remote.column_index(&l.name) else {
                    return Err(fail(format!("the sender has no column {}", l.name)));
                };
                if remote.columns[j].data_type != l.data_type {
                    return Err(fail(format!(
                        "column {} is {} here and {} at the sender",
                        l.name, l.data_type, remote.columns[j].data_type
                    )));
                }
                map.push(j);
            }
            let identity = map.iter().enumerate().all(|(i, &j)| i == j);
            Ok((!identity).then_some(map))
        }
    }
}

/// Links for the crate's unit tests (this module's and the sender's).
#[cfg(test)]
pub(crate) mod testing {
    use std::collections::{BTreeMap, BTreeSet};

    use hawser_core::{Ident, NodeId, QualName};
    use hawser_scheme::ast::TableDefinitionChecking;

    use super::{LinkConfig, SenderTuning};
    use crate::codec::Compression;

    /// A stream from `m` to `s` carrying `tables`, with no DDL, sequences or siblings.
    pub(crate) fn test_link(
        m: NodeId,
        s: NodeId,
        tables: BTreeMap<(QualName, NodeId), Ident>,
    ) -> LinkConfig {
        LinkConfig {
            sender_node: m,
            sender_store: Ident::unquoted("m"),
            receiver_store: Ident::unquoted("s"),
            receiver_node: s,
            scheme_version: 1,
            elements: BTreeMap::new(),
            tables,
            sequences: BTreeMap::new(),
            replicate_ddl: false,
            returns_wait: true,
            datastore: Vec::new(),
            compression: Compression::None,
            table_check: TableDefinitionChecking::Exact,
            tuning: SenderTuning::default(),
            siblings: Vec::new(),
            blind: BTreeSet::new(),
            upstream: BTreeMap::new(),
            feeds_relay: false,
            read_by_siblings: false,
            parts: BTreeSet::new(),
            forked: Vec::new(),
        }
    }

    /// The demo's shape: `m` sends its t1 to `s` itself (the first) while `p` relays
    /// m's t2 to `s` (the second), each the other's sibling.
    pub(crate) fn demo_shape(m: NodeId, s: NodeId, p: NodeId) -> (LinkConfig, LinkConfig) {
        let carrying = |sender: NodeId, table: &str| {
            test_link(
                sender,
                s,
                BTreeMap::from([((QualName::bare(table), m), Ident::unquoted("e"))]),
            )
        };
        let (mut direct, mut relay) = (carrying(m, "t1"), carrying(p, "t2"));
        direct.siblings = vec![relay.clone()];
        relay.siblings = vec![direct.clone()];
        (direct, relay)
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{demo_shape, test_link};
    use super::*;
    use hawser_core::{ColumnDef, DataType, Gtid, RowChange, Transaction, Value};

    fn col(name: &str, t: DataType) -> ColumnDef {
        ColumnDef {
            name: Ident::unquoted(name),
            data_type: t,
            nullable: true,
            default: None,
        }
    }

    fn table(cols: Vec<ColumnDef>, key: Vec<usize>) -> TableDef {
        TableDef {
            name: QualName::bare("t"),
            columns: cols,
            primary_key: key,
            explicit_key: true,
        }
    }

    #[test]
    fn a_forked_off_commit_is_one_past_the_fork_point_under_an_older_epoch() {
        let (x, y) = (NodeId(1), NodeId(2));
        let tables = BTreeMap::from([((QualName::bare("t"), x), Ident::unquoted("e"))]);
        let mut link = test_link(y, NodeId(3), tables);
        link.forked = vec![ForkedRange {
            origin: x,
            after_seq: 10,
            before_epoch: Epoch(1),
            tables: Some(vec![QualName::bare("t")]),
        }];
        // The deposed master's commit past the fork, under its old epoch: forked off.
        assert!(link.forked_off(Epoch(0), &txn(x, 11, &["t"])));
        // Up to the fork point the survivors have it; from the failover's epoch on it
        // is a later commit of the same origin, master again.
        assert!(!link.forked_off(Epoch(0), &txn(x, 10, &["t"])));
        assert!(!link.forked_off(Epoch(2), &txn(x, 12, &["t"])));
        assert!(!link.forked_off(Epoch(0), &txn(y, 11, &["t"])));
        // A table of an element the deposed master kept is not forked off.
        assert!(!link.forked_off(Epoch(0), &txn(x, 11, &["u"])));
        assert!(link.forked_off(Epoch(0), &txn(x, 11, &["u", "t"])));
    }

    #[test]
    fn exact_wants_the_same_columns_in_the_same_order() {
        let a = table(
            vec![col("k", DataType::Integer), col("v", DataType::Varchar(10))],
            vec![0],
        );
        let b = table(
            vec![col("v", DataType::Varchar(10)), col("k", DataType::Integer)],
            vec![1],
        );
        assert_eq!(
            check_table(&a, &a, TableDefinitionChecking::Exact),
            Ok(None)
        );
        let e = check_table(&a, &b, TableDefinitionChecking::Exact).unwrap_err();
        assert!(e.reason.contains("EXACT"), "{e}");
        // RELAXED maps by name: local column 0 (k) is the sender's column 1.
        assert_eq!(
            check_table(&a, &b, TableDefinitionChecking::Relaxed),
            Ok(Some(vec![1, 0]))
        );
    }

    #[test]
    fn relaxed_still_wants_names_types_count_and_key() {
        let a = table(
            vec![col("k", DataType::Integer), col("v", DataType::Varchar(10))],
            vec![0],
        );
        let other_type = table(
            vec![col("k", DataType::Integer), col("v", DataType::Varchar(20))],
            vec![0],
        );
        let other_key = table(
            vec![col("k", DataType::Integer), col("v", DataType::Varchar(10))],
            vec![1],
        );
        let more = table(
            vec![
                col("k", DataType::Integer),
                col("v", DataType::Varchar(10)),
                col("w", DataType::Integer),
            ],
            vec![0],
        );
        for bad in [other_type, other_key, more] {
            assert!(check_table(&a, &bad, TableDefinitionChecking::Relaxed).is_err());
        }
    }

    /// The tables a filtered entry's changes write.
    fn tables(e: Option<LogEntry>) -> Vec<String> {
        match e {
            Some(LogEntry::Txn(t)) => t.changes.iter().map(|c| c.table.to_string()).collect(),
            _ => Vec::new(),
        }
    }

    /// An insert of one row into `t`.
    fn change(t: &str) -> RowChange {
        RowChange {
            table: QualName::bare(t),
            op: hawser_core::ChangeOp::Insert,
            key: vec![Value::Int(1)],
            before: None,
            after: Some(vec![Value::Int(1)]),
        }
    }

    /// A transaction of `origin` inserting one row into each of `tables`.
    fn txn(origin: NodeId, seq: u64, tables: &[&str]) -> LogEntry {
        LogEntry::Txn(Transaction {
            gtid: Gtid::new(origin, seq),
            commit_micros: 0,
            changes: tables.iter().map(|t| change(t)).collect(),
        })
    }

    #[test]
    fn a_stream_stops_before_what_a_sibling_to_the_same_receiver_carries() {
        let (m, s) = (NodeId(1), NodeId(2));
        let link = |table: &str| {
            test_link(
                m,
                s,
                BTreeMap::from([((QualName::bare(table), m), Ident::unquoted("e"))]),
            )
        };
        let txn = |origin: NodeId, seq: u64, table: &str| txn(origin, seq, &[table]);
        let mut t3 = link("t3");
        let hw = BTreeMap::from([(m, 5)]);
        let none = BTreeMap::new();
        // Alone, a stream skips what it does not carry.
        assert!(!t3.waits_for_sibling(&txn(m, 6, "t1"), &hw, &none));
        t3.siblings = vec![link("t1")];
        // The t1 stream carries seq 6 and the receiver lacks it: t3's stream waits.
        assert!(t3.waits_for_sibling(&txn(m, 6, "t1"), &hw, &none));
        // Not once the receiver has it, not for its own tables, not for tables nobody
        // carries, not for the receiver's own transactions.
        assert!(!t3.waits_for_sibling(&txn(m, 5, "t1"), &hw, &none));
        assert!(!t3.waits_for_sibling(&txn(m, 6, "t3"), &hw, &none));
        assert!(!t3.waits_for_sibling(&txn(m, 6, "t9"), &hw, &none));
        assert!(!t3.waits_for_sibling(&txn(s, 6, "t1"), &hw, &none));
        assert!(t3.carries(&txn(m, 1, "t3")) && !t3.carries(&txn(m, 1, "t1")));
    }

    #[test]
    fn a_split_transaction_goes_whole_on_the_origins_stream_and_the_relay_waits_for_it() {
        // The demo's shape: m sends t1 to s itself, p relays m's t2 to s.
        let (m, s, p) = (NodeId(1), NodeId(2), NodeId(3));
        let (direct, relay) = demo_shape(m, s, p);
        let hw = BTreeMap::from([(m, 5)]);
        let none = BTreeMap::new();
        let split = txn(m, 6, &["t1", "t2", "t9"]);
        // The origin's stream ships every part the receiver gets, by either stream
        // (t9 goes nowhere), and does not wait.
        assert!(!direct.waits_for_sibling(&split, &hw, &none));
        assert_eq!(tables(direct.filter(split.clone(), &hw)), ["t1", "t2"]);
        assert!(direct.completes(&QualName::bare("t2")));
        assert!(!direct.completes(&QualName::bare("t1")));
        // The relay has all of it too (it receives t1), but ships only its own part,
        // and only if the receiver does not have the transaction by then: it waits.
        assert!(relay.waits_for_sibling(&split, &hw, &none));
        assert_eq!(tables(relay.filter(split.clone(), &hw)), ["t2"]);
        let has = BTreeMap::from([(m, 6)]);
        assert!(!relay.waits_for_sibling(&split, &has, &none));
        assert!(relay.filter(split, &has).is_none());
        assert!(!relay.completes(&QualName::bare("t1")));
        // A transaction of the relay's tables only: it does not wait, and the
        // origin's stream ships none of it.
        let relays_only = txn(m, 6, &["t2"]);
        assert!(!relay.waits_for_sibling(&relays_only, &hw, &none));
        assert!(direct.filter(relays_only, &hw).is_none());
    }

    #[test]
    fn the_origins_stream_takes_over_what_an_absent_relay_would_relay() {
        // The demo's shape: m sends t1 to s itself, p relays m's t2 to s.
        let (m, s, p) = (NodeId(1), NodeId(2), NodeId(3));
        let (direct, relay) = demo_shape(m, s, p);
        let hw = BTreeMap::from([(m, 5)]);
        let relayed = txn(m, 6, &["t2", "t9"]);
        let gone = BTreeSet::from([p]);
        assert!(!direct.takes_over(&relayed, &BTreeSet::new()));
        assert!(direct.takes_over(&relayed, &gone));
        // What it ships then: the relay's part (t9 goes nowhere).
        let Some(Cow::Owned(LogEntry::Txn(t))) = direct.filter_whole(&relayed, &hw) else {
            panic!("the relay's part, copied")
        };
        assert_eq!(t.changes, vec![change("t2")]);
        assert!(direct
            .filter_whole(&relayed, &BTreeMap::from([(m, 6)]))
            .is_none());
        // Not its own tables' (it ships those anyway), not another origin's, not a
        // transaction nobody else carries, not for a relay that is there.
        assert!(!direct.takes_over(&txn(m, 6, &["t1", "t2"]), &gone));
        assert!(!direct.takes_over(&txn(p, 6, &["t2"]), &gone));
        assert!(!direct.takes_over(&txn(m, 6, &["t9"]), &gone));
        assert!(!direct.takes_over(&relayed, &BTreeSet::from([NodeId(7)])));
        // A relay never takes over: it has only what it received.
        assert!(!relay.takes_over(&txn(m, 6, &["t1"]), &BTreeSet::from([m])));
        // A block of a sequence only the relay carries goes too, whole; DDL waits.
        let (mut direct, mut relay) = demo_shape(m, s, p);
        let q = QualName::bare("q");
        relay.sequences.insert((q.clone(), m), Ident::unquoted("e"));
        direct.siblings = vec![relay.clone()];
        let block = LogEntry::SequenceBlock {
            gtid: Gtid::new(m, 6),
            commit_micros: 0,
            name: q,
            restart_at: Some(40),
        };
        assert!(!direct.takes_over(&block, &BTreeSet::new()));
        assert!(direct.takes_over(&block, &gone));
        assert_eq!(direct.filter_whole(&block, &hw).as_deref(), Some(&block));
        assert!(direct
            .filter_whole(&block, &BTreeMap::from([(m, 6)]))
            .is_none());
        let ddl = LogEntry::Ddl {
            gtid: Gtid::new(m, 6),
            commit_micros: 0,
            op: DdlOp::DropTable(QualName::bare("t2")),
        };
        assert!(!direct.takes_over(&ddl, &gone));
    }

    #[test]
    fn a_blind_relay_waits_until_the_origins_stream_has_decided() {
        // m sends t1 to s itself; p relays m's t2 to s and does not receive t1.
        let (m, s, p) = (NodeId(1), NodeId(2), NodeId(3));
        let (mut direct, mut relay) = demo_shape(m, s, p);
        let hw = BTreeMap::from([(m, 5)]);
        let decided = |seq| BTreeMap::from([((m, m), seq)]);
        // What the relay holds of m's seq 7 (seq 6, t1 only, never reached it).
        let seen = txn(m, 7, &["t2"]);
        assert!(!relay.waits_for_sibling(&seen, &hw, &decided(5)));
        relay.blind = BTreeSet::from([m]);
        assert!(relay.waits_for_sibling(&seen, &hw, &decided(5)));
        assert!(relay.waits_for_sibling(&seen, &hw, &decided(6)));
        assert!(!relay.waits_for_sibling(&seen, &hw, &decided(7)));
        assert!(!relay.waits_for_sibling(&seen, &BTreeMap::from([(m, 7)]), &decided(0)));
        // The origin's stream, stopped before seq 7 (the relay's), has decided it: no
        // other stream of m's carries it.
        assert!(direct.waits_for_sibling(&seen, &hw, &decided(0)));
        assert!(direct.decides_while_waiting(&seen));
        // Another scheme's stream of m's that carries t2 to s: that one decides.
        let mut again = relay.clone();
        again.sender_node = m;
        again.siblings.clear();
        direct.siblings.push(again);
        assert!(!direct.decides_while_waiting(&seen));
        assert!(!relay.decides_while_waiting(&seen));
        // What another node says it decided about m does not count for m's stream.
        assert!(relay.waits_for_sibling(&seen, &hw, &BTreeMap::from([((m, p), 9)])));
    }

    #[test]
    fn two_blind_relays_wait_for_what_the_other_decided_before_each_transaction() {
        // No stream of m's own to s: p relays m's t1, q relays m's t2, neither
        // receives the other's table.
        let (m, s, p, q) = (NodeId(1), NodeId(2), NodeId(3), NodeId(4));
        let carrying = |sender: NodeId, table: &str| {
            let mut c = test_link(
                sender,
                s,
                BTreeMap::from([((QualName::bare(table), m), Ident::unquoted("e"))]),
            );
            c.blind = BTreeSet::from([m]);
            c.sender_store = Ident::unquoted(if sender == p { "p" } else { "q" });
            c
        };
        let (mut by_p, mut by_q) = (carrying(p, "t1"), carrying(q, "t2"));
        by_p.siblings = vec![by_q.clone()];
        by_q.siblings = vec![by_p.clone()];
        let hw = BTreeMap::from([(m, 5)]);
        let from_q = |seq| BTreeMap::from([((m, q), seq)]);
        // p holds m's seq 8: it waits until q has decided about everything of m's
        // before it (6 and 7 may be q's)...
        let eight = txn(m, 8, &["t1"]);
        assert!(by_p.waits_for_sibling(&eight, &hw, &BTreeMap::new()));
        assert!(by_p.waits_for_sibling(&eight, &hw, &from_q(6)));
        assert!(!by_p.waits_for_sibling(&eight, &hw, &from_q(7)));
        // ... and not about 8 itself: were it split, q's part of it would wait for
        // p's decision in turn, and neither would move.
        let split = txn(m, 8, &["t1", "t2"]);
        let both = BTreeMap::from([((m, q), 7), ((m, p), 7)]);
        assert!(!by_p.waits_for_sibling(&split, &hw, &both));
        assert!(!by_q.waits_for_sibling(&split, &hw, &both));
        // A sibling that carries nothing of m's is not waited for.
        let mut other = test_link(
            NodeId(9),
            s,
            BTreeMap::from([((QualName::bare("t3"), NodeId(9)), Ident::unquoted("e"))]),
        );
        other.siblings.clear();
        by_p.siblings.push(other);
        assert!(!by_p.waits_for_sibling(&eight, &hw, &from_q(7)));
        // Status says whom it waits for.
        assert_eq!(
            by_p.waits_for(&eight, &hw, &from_q(6)),
            "q to say it has sent node 1's transactions before 1:8 (p cannot see them)"
        );
        // Its part of a transaction at the receiver's high-water still goes: the other
        // relay's part came first (the receiver takes the tables it lacks).
        assert!(by_p.ships_parts(m));
        let at_mark = BTreeMap::from([(m, 8)]);
        assert_eq!(tables(by_p.filter(split.clone(), &at_mark)), ["t1"]);
        assert!(by_p
            .filter(split.clone(), &BTreeMap::from([(m, 9)]))
            .is_none());
        // Beside the origin's own stream (which ships a split transaction whole), a
        // relay leaves what the receiver has.
        let (_, mut relay) = demo_shape(m, s, p);
        relay.blind = BTreeSet::from([m]);
        assert!(!relay.ships_parts(m));
        assert!(relay.filter(txn(m, 8, &["t2"]), &at_mark).is_none());
    }

    #[test]
    fn filter_keeps_carried_changes_and_never_echoes() {
        let (m, s, x) = (NodeId(1), NodeId(2), NodeId(3));
        let mut tables = BTreeMap::new();
        tables.insert((QualName::bare("a"), m), Ident::unquoted("e"));
        tables.insert((QualName::bare("b"), x), Ident::unquoted("e"));
        let cfg = test_link(m, s, tables);
        let hw = BTreeMap::from([(m, 5)]);
        // Only the carried table's change goes.
        let LogEntry::Txn(t) = cfg.filter(txn(m, 6, &["a", "b"]), &hw).unwrap() else {
            panic!("a transaction stays a transaction")
        };
        assert_eq!(t.changes, vec![change("a")]);
        // At or below the receiver's high-water: already there.
        assert!(cfg.filter(txn(m, 5, &["a"]), &hw).is_none());
        // b is carried from origin x only; never back to the receiver's own origin.
        assert!(cfg.filter(txn(m, 7, &["b"]), &hw).is_none());
        assert!(cfg.filter(txn(x, 1, &["b"]), &hw).is_some());
        assert!(cfg.filter(txn(s, 9, &["a", "b"]), &hw).is_none());
        // Borrowed: a transaction that goes whole is not copied, a partial one is.
        let whole = txn(m, 6, &["a"]);
        assert!(matches!(cfg.filter_ref(&whole, &hw), Some(Cow::Borrowed(e)) if *e == whole));
        let partial = txn(m, 6, &["a", "b"]);
        assert!(matches!(cfg.filter_ref(&partial, &hw), Some(Cow::Owned(_))));

        // A DATASTORE rule carries tables planned after the config, except EXCLUDEd ones.
        let cfg = LinkConfig {
            datastore: vec![DatastoreRule {
                element: Ident::unquoted("d"),
                origin: m,
                include: None,
                exclude: BTreeSet::from([QualName::bare("secret")]),
            }],
            ..cfg
        };
        let LogEntry::Txn(t) = cfg.filter(txn(m, 8, &["new", "secret"]), &hw).unwrap() else {
            panic!("a transaction stays a transaction")
        };
        assert_eq!(t.changes, vec![change("new")]);
        assert!(cfg.filter(txn(x, 2, &["new"]), &hw).is_none());
        let only = DatastoreRule {
            element: Ident::unquoted("d"),
            origin: m,
            include: Some(BTreeSet::from([QualName::bare("a")])),
            exclude: BTreeSet::new(),
        };
        assert!(only.carries(&QualName::bare("a"), m));
        assert!(!only.carries(&QualName::bare("new"), m));
    }
}
