//! A backlog: the batch just read and the batches already waiting behind it, gathered
//! without waiting for more ([`gather_backlog`]), and what is decided of it as a whole
//! before its records are read ([`BacklogPlan`]): what its ack answers, whether it is
//! compiled, and whether it is applied paced.

use std::time::Duration;

use tonic::Status;

use super::{CompilePolicy, Refusal};
use crate::pb::{self, sender_message, RefuseCode};

/// Messages queued by the stream's reader: a message, the end of the stream, or its
/// error.
pub(super) type Inbound = Result<Option<pb::SenderMessage>, Status>;

/// Moves every batch already queued into `backlog` without waiting for more, until the
/// backlog holds `max_bytes`. Heartbeats are dropped (the caller has just heard from
/// the sender); any other message, the end of the stream or an error is returned for
/// the caller to handle after the backlog.
pub(super) fn gather_backlog(
    queue: &mut tokio::sync::mpsc::Receiver<Inbound>,
    backlog: &mut Vec<pb::Batch>,
    max_bytes: u64,
) -> Option<Inbound> {
    let mut bytes: u64 = backlog.iter().map(run_bytes).sum();
    while bytes < max_bytes {
        // Empty: nothing more has arrived. Disconnected: the reader stopped, which the
        // caller's next receive sees.
        match queue.try_recv().ok()? {
            Ok(Some(pb::SenderMessage {
                msg: Some(sender_message::Msg::Batch(b)),
            })) => {
                bytes += run_bytes(&b);
                backlog.push(b);
            }
            Ok(Some(pb::SenderMessage {
                msg: Some(sender_message::Msg::Heartbeat(_)),
            })) => {}
            other => return Some(other),
        }
    }
    None
}

/// What a batch counts against [`super::ReceiverConfig::max_run_bytes`]: its
/// uncompressed size, or its wire size when that is larger.
fn run_bytes(b: &pb::Batch) -> u64 {
    b.raw_bytes.max(b.payload.len() as u64)
}

/// What is decided of a backlog as a whole, before its records are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct BacklogPlan {
    /// The last batch's `through_lsn`: what the backlog's ack answers.
    pub(super) through_lsn: u64,
    /// Records the batches say they carry; none is the sender asking where this
    /// store stands.
    pub(super) records: u64,
    /// Uncompressed payload bytes.
    pub(super) raw_bytes: u64,
    /// Payload bytes as they came over the wire.
    pub(super) wire_bytes: u64,
    /// Its transactions are compiled into net rows (each run may still go in log
    /// order: [`super::runs::run_mode`]).
    pub(super) compiles: bool,
    /// The last batch says its sender waits for another stream's transaction.
    pub(super) waiting: bool,
}

impl BacklogPlan {
    /// The plan of `backlog` under `policy`; an empty backlog is a protocol error.
    pub(super) fn new(backlog: &[pb::Batch], policy: &CompilePolicy) -> Result<Self, Refusal> {
        let Some(last) = backlog.last() else {
            return Err((RefuseCode::Protocol, "an empty backlog".into()));
        };
        let records: u64 = backlog.iter().map(|b| u64::from(b.count)).sum();
        let raw_bytes: u64 = backlog.iter().map(|b| b.raw_bytes).sum();
        Ok(Self {
            through_lsn: last.through_lsn,
            records,
            raw_bytes,
            wire_bytes: backlog.iter().map(|b| b.payload.len() as u64).sum(),
            compiles: policy.compiles(records, raw_bytes),
            waiting: last.waiting,
        })
    }
}

/// The slice a stream's applies are paced by: [`super::ReceiverConfig::apply_slice`],
/// unless a return service may wait on the stream (`returns_wait`), whose applies
/// never give way.
pub(super) fn stream_slice(apply_slice: Option<Duration>, returns_wait: bool) -> Option<Duration> {
    apply_slice.filter(|_| !returns_wait)
}

/// Whether a backlog (or a lazy flush) of a paced stream gives way to other work: only
/// when nothing more waits behind it (`more`: a message carried over from gathering,
/// or one queued), so that a stream that is behind catches up at full speed.
pub(super) fn paces(more: bool) -> bool {
    !more
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    fn batch(through: u64, raw: u64) -> pb::Batch {
        pb::Batch {
            through_lsn: through,
            count: 1,
            codec: pb::Codec::None as i32,
            raw_bytes: raw,
            payload: Default::default(),
            decided: 0,
            waiting: false,
            relayed: Vec::new(),
            chunk: None,
        }
    }

    fn msg(m: sender_message::Msg) -> Inbound {
        Ok(Some(pb::SenderMessage { msg: Some(m) }))
    }

    fn throughs(backlog: &[pb::Batch]) -> Vec<u64> {
        backlog.iter().map(|b| b.through_lsn).collect()
    }

    /// A queue holding `msgs`, its sender kept open (so "nothing more yet" is Empty).
    fn queued(msgs: Vec<Inbound>) -> (mpsc::Sender<Inbound>, mpsc::Receiver<Inbound>) {
        let (tx, rx) = mpsc::channel(16);
        for m in msgs {
            tx.try_send(m).expect("room");
        }
        (tx, rx)
    }

    #[test]
    fn a_backlog_takes_the_batches_already_there_and_stops_at_what_is_not() {
        use sender_message::Msg;
        let hb = || Msg::Heartbeat(pb::Heartbeat { sent_micros: 0 });
        // Queued batches and a heartbeat, then nothing ready: all batches taken.
        let (_tx, mut q) = queued(vec![
            msg(Msg::Batch(batch(2, 10))),
            msg(hb()),
            msg(Msg::Batch(batch(3, 10))),
        ]);
        let mut backlog = vec![batch(1, 10)];
        assert!(gather_backlog(&mut q, &mut backlog, 1 << 20).is_none());
        assert_eq!(throughs(&backlog), [1, 2, 3]);

        // The byte bound leaves the rest queued.
        let (_tx, mut q) = queued(vec![
            msg(Msg::Batch(batch(2, 10))),
            msg(Msg::Batch(batch(3, 10))),
        ]);
        let mut backlog = vec![batch(1, 10)];
        assert!(gather_backlog(&mut q, &mut backlog, 15).is_none());
        assert_eq!(throughs(&backlog), [1, 2]);
        let next = q.try_recv().ok().and_then(Result::ok).flatten();
        assert!(
            matches!(next, Some(pb::SenderMessage { msg: Some(Msg::Batch(b)) }) if b.through_lsn == 3)
        );

        // Anything else, or the end of the stream, is handed back after the batches.
        let (_tx, mut q) = queued(vec![
            msg(Msg::Batch(batch(2, 10))),
            msg(Msg::Hello(pb::Hello::default())),
            msg(Msg::Batch(batch(3, 10))),
        ]);
        let mut backlog = vec![batch(1, 10)];
        let carried = gather_backlog(&mut q, &mut backlog, 1 << 20);
        assert!(matches!(
            carried,
            Some(Ok(Some(pb::SenderMessage {
                msg: Some(Msg::Hello(_))
            })))
        ));
        assert_eq!(throughs(&backlog), [1, 2]);

        let (_tx, mut q) = queued(vec![msg(Msg::Batch(batch(2, 10))), Ok(None)]);
        let mut backlog = vec![batch(1, 10)];
        assert!(matches!(
            gather_backlog(&mut q, &mut backlog, 1 << 20),
            Some(Ok(None))
        ));
        assert_eq!(throughs(&backlog), [1, 2]);
    }

    #[test]
    fn a_backlog_counts_a_batch_by_its_wire_size_when_that_is_the_larger() {
        use sender_message::Msg;
        let big_wire = pb::Batch {
            payload: vec![0; 20].into(),
            ..batch(2, 1)
        };
        let (_tx, mut q) = queued(vec![
            msg(Msg::Batch(big_wire)),
            msg(Msg::Batch(batch(3, 1))),
        ]);
        let mut backlog = vec![batch(1, 1)];
        assert!(gather_backlog(&mut q, &mut backlog, 21).is_none());
        assert_eq!(throughs(&backlog), [1, 2]);
    }

    #[test]
    fn a_backlog_is_answered_through_its_last_batch_and_compiled_by_its_totals() {
        let policy = CompilePolicy {
            enabled: true,
            min_transactions: 3,
            min_bytes: 1000,
        };
        let mut last = batch(9, 10);
        last.waiting = true;
        last.payload = vec![0; 4].into();
        let plan = BacklogPlan::new(&[batch(7, 10), batch(8, 10), last], &policy).expect("a plan");
        assert_eq!(plan.through_lsn, 9);
        assert_eq!((plan.records, plan.raw_bytes, plan.wire_bytes), (3, 30, 4));
        assert!(
            plan.compiles,
            "three transactions together reach the threshold"
        );
        assert!(plan.waiting, "the last batch's flag counts");
        let two = BacklogPlan::new(&[batch(7, 10), batch(8, 10)], &policy).expect("a plan");
        assert!(!two.compiles);
        assert!(!two.waiting);
        let refusal = BacklogPlan::new(&[], &policy).expect_err("refused");
        assert_eq!(refusal.0, RefuseCode::Protocol);
    }

    #[test]
    fn only_a_stream_nobody_waits_on_is_paced_and_only_when_nothing_is_behind() {
        let slice = Some(Duration::from_micros(60));
        assert_eq!(stream_slice(slice, false), slice);
        assert_eq!(stream_slice(slice, true), None);
        assert_eq!(stream_slice(None, false), None);
        assert!(paces(false));
        assert!(
            !paces(true),
            "a stream that is behind catches up at full speed"
        );
    }
}
