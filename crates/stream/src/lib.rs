//! hawser's data plane (DESIGN.md §3, §4).
//!
//! Committed transactions flow from a master (or propagator) to each receiver over one
//! gRPC bidirectional stream, and acknowledgements flow back so that return services
//! can hold commits until the subscribers have what the scheme promises.
//!
//! ```text
//!  master node                                      receiver node
//!  commit log ─► StreamSender ══ Replicate ══► ReceiverService ─► Database::apply_*
//!       ▲            │  Hello/Batch/Heartbeat      │  HelloReply/Ack/Heartbeat
//!       │            ▼                             │
//!  commit path ◄─ ReturnTracker ◄── acks ◄─────────┘
//! ```
//!
//! * [`returns`]: return-service accounting, a pure state machine.
//! * [`codec`]: log records to batch bytes and back, with compression.

pub mod codec;
pub mod returns;

pub use returns::{
    AckMarks, Await, Release, ReplicationState, ReturnEvent, ReturnLevel, ReturnOutcome,
    ReturnRoutes, ReturnSettings, ReturnTracker, ReturnWait, Step, SyncOptions, XactState,
};
