//! Outbound and inbound stream status: as the gRPC status types show it, and as
//! `/metrics` gauges and counters.

use std::collections::BTreeMap;
use std::time::Instant;

use hawser_core::{Ident, NodeId, QualName};
use hawser_proto::v1;
use hawser_stream::{ReceiverService, SenderState};

use super::running::Running;
use crate::senders::Senders;

/// Per outbound stream, for `/metrics` (refreshed at every re-plan, at least once a
/// second): whether it streams, its lag in log records and seconds, the smoothed round
/// trip of its acks, time since the receiver was last heard, how long it has been held
/// for another stream's transaction (0 while it ships), and transactions and bytes (raw
/// and on the wire) sent.
pub(super) fn export_metrics(running: &BTreeMap<(QualName, Ident), Running>) {
    for ((scheme, receiver), r) in running {
        let s = r.handle.status().borrow().clone();
        let labels = [
            ("scheme", scheme.to_string()),
            ("receiver", receiver.to_string()),
        ];
        let streaming = matches!(s.state, SenderState::Streaming);
        metrics::gauge!("hawser_stream_up", &labels).set(f64::from(u8::from(streaming)));
        // The receiver cannot be caught up by this stream: it lacks log released here,
        // or diverged. Only a duplicate rebuilds it (alert HawserSubscriberNeedsRebuild).
        let needs_rebuild = matches!(
            s.state,
            SenderState::LogReleased { .. } | SenderState::Diverged { .. }
        );
        metrics::gauge!("hawser_stream_needs_rebuild", &labels)
            .set(f64::from(u8::from(needs_rebuild)));
        metrics::gauge!("hawser_stream_lag_records", &labels).set(s.lag_records as f64);
        metrics::gauge!("hawser_stream_lag_seconds", &labels).set(s.lag_micros as f64 / 1e6);
        metrics::gauge!("hawser_stream_ack_round_trip_seconds", &labels)
            .set(s.ack_micros_mean as f64 / 1e6);
        metrics::gauge!("hawser_stream_held_seconds", &labels).set(
            s.held
                .as_ref()
                .map_or(0.0, |h| h.since.elapsed().as_secs_f64()),
        );
        if let Some(t) = s.last_contact {
            metrics::gauge!("hawser_stream_seconds_since_contact", &labels)
                .set(t.elapsed().as_secs_f64());
        }
        metrics::counter!("hawser_stream_sent_transactions_total", &labels)
            .absolute(s.transactions_sent);
        metrics::counter!("hawser_stream_sent_raw_bytes_total", &labels).absolute(s.raw_bytes);
        metrics::counter!("hawser_stream_sent_wire_bytes_total", &labels).absolute(s.wire_bytes);
    }
}

/// The streams this node sends and receives, as status shows them.
pub(crate) fn streams_status(
    senders: &Senders,
    receiver: &ReceiverService,
) -> (Vec<v1::OutboundStream>, Vec<v1::InboundStream>) {
    use v1::StreamState as S;
    let marks = |m: &BTreeMap<NodeId, u64>| m.iter().map(|(n, seq)| (n.0, *seq)).collect();
    let millis = |t: Instant| t.elapsed().as_millis() as u64;
    let outbound = senders
        .lock()
        .iter()
        .map(|((scheme, receiver), handle)| {
            let s = handle.status().borrow().clone();
            let (state, reason) = match &s.state {
                SenderState::Connecting => (S::Connecting, None),
                SenderState::Streaming => (S::Streaming, None),
                SenderState::Backoff { error } => (S::Backoff, Some(error.clone())),
                SenderState::Refused { reason } => (S::Refused, Some(reason.clone())),
                SenderState::LogReleased { reason } => (S::LogReleased, Some(reason.clone())),
                SenderState::Diverged { reason, .. } => (S::Diverged, Some(reason.clone())),
                SenderState::Stopped => (S::Stopped, None),
            };
            v1::OutboundStream {
                scheme: scheme.to_string(),
                receiver: receiver.to_string(),
                state: state.into(),
                reason,
                last_error: s.last_error.clone(),
                millis_since_contact: s.last_contact.map(millis),
                acked_durable: marks(&s.acked_durable),
                acked_applied: marks(&s.acked_applied),
                acked_lsn: s.acked_lsn.0,
                sent_lsn: s.sent_lsn.0,
                lag_records: s.lag_records,
                lag_micros: s.lag_micros,
                ack_micros: s.ack_micros,
                ack_micros_mean: s.ack_micros_mean,
                transactions: s.transactions_sent,
                batches: s.batches_sent,
                compression: handle.codec_name(),
                raw_bytes: s.raw_bytes,
                wire_bytes: s.wire_bytes,
                sessions: s.sessions,
                held: s.held.as_ref().map(|h| v1::StreamHold {
                    gtid: h.gtid.to_string(),
                    millis: millis(h.since),
                    waits_for: h.waits_for.clone(),
                }),
            }
        })
        .collect();
    let inbound = receiver
        .status()
        .borrow()
        .iter()
        .map(|(sender, s)| v1::InboundStream {
            sender: sender.to_string(),
            connected: s.connected,
            refused: s.refused.clone(),
            millis_since_contact: s.last_contact.map(millis),
            millis_since_connect: s.connected_since.map(millis),
            through_lsn: s.through_lsn,
            batches: s.batches,
            transactions: s.transactions,
            transactions_skipped: s.transactions_skipped,
            row_changes: s.row_changes,
            rows_written: s.rows_written,
            rows_written_compiled: s.rows_written_compiled,
            runs_compiled: s.runs_compiled,
            runs_in_order: s.runs_in_order,
            apply_pauses: s.apply_pauses,
            raw_bytes: s.raw_bytes,
            wire_bytes: s.wire_bytes,
            targets: s
                .targets
                .iter()
                .map(|t| v1::TargetTable {
                    table: t.table.clone(),
                    kind: t.kind.clone(),
                    into: t.into.clone(),
                })
                .collect(),
        })
        .collect();
    (outbound, inbound)
}
