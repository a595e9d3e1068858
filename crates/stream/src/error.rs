//! Why a stream session ended.
//!
//! A sender retries every one of these after a backoff; [`StreamError::Refused`] is the
//! one a person may need to act on (a table definition, a stale epoch), and its reason
//! is what status shows.

use thiserror::Error;

use crate::codec::CodecError;

#[derive(Debug, Error)]
pub enum StreamError {
    #[error("cannot connect: {0}")]
    Connect(#[from] tonic::transport::Error),
    #[error("stream failed: {0}")]
    Rpc(#[from] tonic::Status),
    #[error("refused by the receiver: {reason}")]
    Refused { code: i32, reason: String },
    #[error("the peer was silent past the timeout")]
    PeerTimeout,
    #[error("the stream was closed")]
    Closed,
    #[error("protocol violation: {0}")]
    Protocol(String),
    #[error(
        "the log this receiver needs was released: it acknowledged through LSN {acked} and \
         the log now starts at LSN {log_start}, and the receiver's marks do not reach what was \
         released; the subscriber needs a duplicate (hawser duplicate)"
    )]
    LogReleased {
        acked: hawser_core::Lsn,
        log_start: hawser_core::Lsn,
    },
    #[error(
        "the receiver holds this node's commits through seq {holds}, but this node's own \
         commits stopped at seq {restart_seq} when its machine restarted: the rest were lost \
         here, and new commits would reach the receiver under seqs it already has; rebuild \
         the subscriber from this node (a new store), or make it the master"
    )]
    Diverged { holds: u64, restart_seq: u64 },
    #[error(
        "the receiver holds this node's commits through seq {holds}, but this node's own \
         commits end at seq {own}: it holds commits this node no longer has (lost in a crash \
         with --durable-commits false, or a data directory put back from a copy), and new \
         commits would reach it under seqs it already has; rebuild the subscriber from this \
         node (a new store), or make it the master"
    )]
    Ahead { holds: u64, own: u64 },
    #[error(
        "the receiver holds this node's commit seq {holds} made at {theirs} (µs since the \
         epoch), but this node's commit seq {holds} was made at {ours}: this node gave the \
         seq to another commit and lost the one the receiver has (a data directory put back \
         from a copy, say), and the receiver would skip this node's commits under seqs it \
         already has; rebuild the subscriber from this node (a new store), or make it the \
         master"
    )]
    Reused { holds: u64, theirs: i64, ours: i64 },
    #[error(
        "the receiver holds this node's commit seq {holds}, but this node gave the seq to \
         another commit (found when it last streamed to it): it holds commits this node \
         lost, and would skip this node's commits under seqs it already has; rebuild the \
         subscriber from this node (a new store), or make it the master"
    )]
    GaveAgain { holds: u64 },
    #[error("reading the log: {0}")]
    Store(#[from] hawser_store::StoreError),
    #[error(transparent)]
    Codec(#[from] CodecError),
}
