//! The receiver's messages, read by a task of their own.
//!
//! A session that ships a large transaction spends seconds in its send (encoding, and
//! waiting on HTTP/2 flow control while the receiver takes the chunks in). Were the
//! receiver's messages read only between turns, its heartbeats would wait unread and
//! the session would take a busy receiver for a dead one. The reader notes each
//! message as it arrives ([`crate::liveness`]), whatever the session is doing, and the
//! session's sends give up on a receiver silent past the timeout rather than waiting
//! on a full channel forever.

use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::Status;

use crate::error::StreamError;
use crate::liveness::{self, AbortOnDrop, Ear, Heard};
use crate::pb::{self, receiver_message};

/// Messages read ahead of the session at most: acks and the like. Heartbeats are not
/// queued (hearing one is all they say).
const READ_AHEAD: usize = 64;

/// The session's side of the reader: the messages it queued, and when the receiver was
/// last heard from. Dropping it stops the reader.
pub(super) struct Inbound {
    rx: mpsc::Receiver<Result<pb::ReceiverMessage, Status>>,
    heard: Heard,
    _reader: AbortOnDrop,
}

impl Inbound {
    /// Starts reading `stream`, the receiver heard from at `now`.
    pub(super) fn start<S>(stream: S, now: Instant) -> Self
    where
        S: Stream<Item = Result<pb::ReceiverMessage, Status>> + Send + Unpin + 'static,
    {
        let (tx, rx) = mpsc::channel(READ_AHEAD);
        let (ear, heard) = liveness::ear(now);
        let reader = AbortOnDrop::spawn(read(stream, tx, ear));
        Self {
            rx,
            heard,
            _reader: reader,
        }
    }

    /// The next message that says more than that the receiver is alive; `Ok(None)`
    /// once the stream has ended.
    pub(super) async fn message(&mut self) -> Result<Option<pb::ReceiverMessage>, StreamError> {
        match self.rx.recv().await {
            Some(Ok(msg)) => Ok(Some(msg)),
            Some(Err(status)) => Err(StreamError::Rpc(status)),
            None => Ok(None),
        }
    }

    /// When the receiver was last heard from.
    pub(super) fn heard(&self) -> &Heard {
        &self.heard
    }
}

/// Reads the stream until it ends or the session is gone, noting each message's
/// arrival.
async fn read<S>(mut stream: S, tx: mpsc::Sender<Result<pb::ReceiverMessage, Status>>, ear: Ear)
where
    S: Stream<Item = Result<pb::ReceiverMessage, Status>> + Unpin,
{
    while let Some(item) = stream.next().await {
        if let Ok(msg) = &item {
            ear.heard(Instant::now());
            if matches!(msg.msg, Some(receiver_message::Msg::Heartbeat(_))) {
                continue;
            }
        }
        let failed = item.is_err();
        ear.queueing();
        if tx.send(item).await.is_err() || failed {
            return;
        }
        ear.listening(Instant::now());
    }
}

/// Sends `msg` on `tx`, unless the receiver falls silent past `timeout` while the
/// channel stays full: a receiver that neither reads nor speaks is gone, and HTTP/2
/// would hold the send forever. One that keeps heartbeating while it applies is waited
/// for.
pub(super) async fn send_while_heard<T>(
    tx: &mpsc::Sender<T>,
    msg: T,
    heard: &Heard,
    timeout: Duration,
) -> Result<(), StreamError> {
    let send = tx.send(msg);
    tokio::pin!(send);
    // Checked a few times per timeout; the send itself wakes this at once.
    let mut check = tokio::time::interval(timeout / 4);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            sent = &mut send => return sent.map_err(|_| StreamError::Closed),
            _ = check.tick() => {
                if heard.silent(Instant::now(), timeout) {
                    return Err(StreamError::PeerTimeout);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::wrappers::ReceiverStream;

    fn heartbeat() -> pb::ReceiverMessage {
        pb::ReceiverMessage {
            msg: Some(receiver_message::Msg::Heartbeat(pb::Heartbeat {
                sent_micros: 1,
            })),
        }
    }

    fn ack(through: u64) -> pb::ReceiverMessage {
        pb::ReceiverMessage {
            msg: Some(receiver_message::Msg::Ack(pb::Ack {
                through_lsn: through,
                ..Default::default()
            })),
        }
    }

    /// The case of a large transaction: the session does not read while it ships, and
    /// the receiver's heartbeats meanwhile still count as contact.
    #[tokio::test(start_paused = true)]
    async fn heartbeats_count_while_the_session_does_not_read() {
        let (peer, stream) = mpsc::channel(1024);
        let t0 = Instant::now();
        let mut inbound = Inbound::start(ReceiverStream::new(stream), t0);
        tokio::time::advance(Duration::from_secs(5)).await;
        for _ in 0..200 {
            peer.send(Ok(heartbeat())).await.unwrap();
        }
        peer.send(Ok(ack(7))).await.unwrap();
        // Let the reader run; nothing here reads the session's queue.
        let later = (t0 + Duration::from_secs(5)).into_std();
        while inbound.heard().last() != later {
            tokio::task::yield_now().await;
        }
        assert!(!inbound
            .heard()
            .silent(Instant::now(), Duration::from_secs(1)));
        // Heartbeats are noted, not queued: the ack is the first message, and none
        // was lost behind 200 heartbeats in a queue of 64.
        let first = inbound.message().await.unwrap().unwrap();
        assert!(matches!(first.msg, Some(receiver_message::Msg::Ack(ref a)) if a.through_lsn == 7));
        drop(peer);
        assert!(inbound.message().await.unwrap().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_of_the_stream_reaches_the_session_and_ends_it() {
        let (peer, stream) = mpsc::channel(4);
        let mut inbound = Inbound::start(ReceiverStream::new(stream), Instant::now());
        peer.send(Err(Status::unavailable("gone"))).await.unwrap();
        assert!(matches!(inbound.message().await, Err(StreamError::Rpc(_))));
        assert!(inbound.message().await.unwrap().is_none());
    }

    /// A full channel and a receiver that still heartbeats: the send waits for it.
    /// Once the heartbeats stop, the send gives up after the timeout.
    #[tokio::test(start_paused = true)]
    async fn a_send_on_a_full_channel_waits_while_heard_and_not_past_silence() {
        let timeout = Duration::from_secs(1);
        let (tx, mut rx) = mpsc::channel::<u32>(1);
        tx.send(0).await.unwrap();
        let (peer, stream) = mpsc::channel(1024);
        let inbound = Inbound::start(ReceiverStream::new(stream), Instant::now());
        let heard = inbound.heard().clone();
        let send = tokio::spawn(async move { send_while_heard(&tx, 1, &heard, timeout).await });
        // Three seconds of heartbeats, every 250 ms: the send still waits.
        for _ in 0..12 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            peer.send(Ok(heartbeat())).await.unwrap();
        }
        assert!(!send.is_finished());
        // Room again: it goes through.
        assert_eq!(rx.recv().await, Some(0));
        send.await.unwrap().unwrap();
        assert_eq!(rx.recv().await, Some(1));

        // Full again, and the receiver silent from now on.
        let (tx, _rx) = mpsc::channel::<u32>(1);
        tx.send(0).await.unwrap();
        let heard = inbound.heard().clone();
        let started = Instant::now();
        let r = send_while_heard(&tx, 1, &heard, timeout).await;
        assert!(matches!(r, Err(StreamError::PeerTimeout)), "{r:?}");
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(750), "{waited:?}");
        assert!(waited <= timeout + timeout / 2, "{waited:?}");
    }
}
