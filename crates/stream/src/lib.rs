//! hawser's data plane (docs/design.md §3, §4).
//!
//! Committed transactions flow from a master (or propagator) to each receiver over one
//! gRPC bidirectional stream, and acknowledgements flow back so that return services
//! can hold commits until the subscribers have what the scheme promises.
//!
//! ```text
//!  master node                                        receiver node
//!  commit log ─► StreamSender ══ Replicate ══► ReceiverService ─► Database::apply_*
//!       ▲            │  Hello / Batch / Heartbeat     │  HelloReply / Ack / Heartbeat
//!       │            ▼  (SenderStatus watch: acks)    │
//!  commit path ◄─ ReturnTracker ◄──────────── acks ◄──┘
//! ```
//!
//! * [`returns`]: return-service accounting, a pure state machine.
//! * [`codec`]: log records to batch bytes and back, with compression.
//! * [`chunks`]: a batch larger than a message cut into chunks, and joined again.
//! * [`link`]: what one stream carries (routing plan → filter) and table checking.
//! * `liveness`: heartbeats and the judging of a peer's silence, apart from the work.
//! * [`paths`]: how far each sender has decided about each origin at a receiver.
//! * [`sender`]: the sending task, with reconnection, backoff and bounded in-flight data.
//! * [`receiver`]: the gRPC service that checks senders and applies their batches.
//! * [`pb`]: the generated `hawser.replication.v1` messages and service (peers only).

pub mod chunks;
pub mod codec;
pub mod copy;
pub mod error;
pub mod link;
mod liveness;
pub mod paths;
pub mod receiver;
pub mod returns;
pub mod sender;

/// Generated code for package `hawser.replication.v1` (peers-only service).
#[allow(clippy::all, rust_2018_idioms, missing_docs)]
pub mod pb {
    tonic::include_proto!("hawser.replication.v1");
}

/// The wire codec enum for a compression.
pub(crate) fn codec_to_pb(c: Compression) -> pb::Codec {
    match c {
        Compression::None => pb::Codec::None,
        Compression::Lz4 => pb::Codec::Lz4,
        Compression::Zstd => pb::Codec::Zstd,
    }
}

/// The compression a wire codec value names; `None` for a value this build does not know.
pub(crate) fn codec_from_pb(value: i32) -> Option<Compression> {
    match pb::Codec::try_from(value) {
        Ok(pb::Codec::None) => Some(Compression::None),
        Ok(pb::Codec::Lz4) => Some(Compression::Lz4),
        Ok(pb::Codec::Zstd) => Some(Compression::Zstd),
        Err(_) => None,
    }
}

/// The `Hello.protocol_version` (and `CopyRequest.protocol_version`) this build speaks.
/// A receiver refuses a sender of another version with the reason, so a cluster of
/// mixed builds shows refused streams rather than streams without the guarantees one
/// side does not know of.
///
/// * 1: Hello / Batch / Ack.
/// * 2: the two-path fields (`TableSpec.completing`, `Hello.decided`, `Batch.decided`,
///   `Batch.waiting`, `Ack.decided`, `Ack.connected_senders`: docs/stream.md, "Two
///   paths from one origin to one receiver") and `Copy` (a duplicate).
/// * 3: relays decide too (`Batch.relayed`), acks list the marks per (origin, sender)
///   (`Ack.decided_paths`, in place of `Ack.decided`), and a relay beside another relay
///   of an origin ships parts of split transactions (`Hello.ships_parts`).
/// * 4: a transaction larger than a batch may be goes in chunks (`Batch.chunk`), and
///   the receiver says its message limit (`HelloReply.max_message_bytes`).
///   A receiver of version 3 would take a chunk for a whole batch and fail to decode it.
pub const PROTOCOL_VERSION: u32 = 4;

pub use codec::{CodecError, Compression, WireRecord};
pub use copy::{CopiedRows, CopyHolds, CopyObjects, CopyPlan};
pub use error::StreamError;
pub use link::{
    check_table, DatastoreRule, ForkedRange, LinkConfig, LinkError, SenderTuning, TableMismatch,
    DEFAULT_MAX_MESSAGE_BYTES,
};
pub use paths::DecidedMarks;
pub use receiver::{
    CompilePolicy, InboundStatus, ReceiverConfig, ReceiverService, TargetInfo, DEFAULT_APPLY_SLICE,
};
pub use returns::{
    AckMarks, Await, Release, ReplicationState, ReturnEvent, ReturnLevel, ReturnOutcome,
    ReturnRoutes, ReturnSettings, ReturnTracker, ReturnWait, Step, SyncOptions, XactState,
};
pub use sender::{
    AckHook, Held, SenderHandle, SenderStart, SenderState, SenderStatus, StreamSender,
};
