//! A batch larger than one message may carry, cut into chunks and joined again.
//!
//! ```text
//!  sender:   Batch{payload: 40 MiB} ──split(1 MiB)──► Batch{chunk 0/40} … Batch{chunk 39/40}
//!  receiver: Joiner::push(chunk 0) … push(chunk 38) → None; push(chunk 39) → Batch{40 MiB}
//! ```
//!
//! gRPC refuses a message past the receiver's limit (`hawser start --max-message-bytes`,
//! 16 MiB by default) before hawser sees it, so a transaction whose batch was larger
//! could never be replicated: the stream broke at it, the sender reconnected and sent it
//! again, for ever. The sender cuts such a batch's payload — as sent: encoded and
//! compressed — into pieces of at most its batch size (1 MiB by default, never more than
//! [`payload_budget`]: half the receiver's limit), each in a `Batch` of its own
//! with the same other fields and a `BatchChunk` saying which piece it is. The receiver
//! joins them before anything else sees the batch, so a transaction is applied whole or
//! not at all, and a stream that ends between two chunks leaves nothing of it (the
//! joiner goes with the stream).
//!
//! The receiver bounds what it joins ([`Joiner::new`]), and refuses a batch past that
//! at its first chunk, by the sizes the chunk announces, before it has read the rest.

use thiserror::Error;

use crate::pb;

/// The smallest payload budget, whatever limit a receiver names: a receiver with a
/// tiny limit gets many chunks rather than none that fit.
const MIN_PAYLOAD: usize = 1024;

/// The most payload bytes one message carries to a receiver that reads messages of up
/// to `max_message_bytes`: half of it. The rest of the message is a few dozen bytes
/// (and a mark per relayed origin), so half leaves room to spare for them, for a
/// compressor that grows incompressible bytes (lz4 by up to 0.4 %, zstd less) and for
/// whatever a later field adds, without sizing each message's other fields exactly.
pub fn payload_budget(max_message_bytes: u64) -> usize {
    usize::try_from(max_message_bytes / 2)
        .unwrap_or(usize::MAX)
        .max(MIN_PAYLOAD)
}

/// Cuts `batch` into messages whose payloads hold at most `max_payload` bytes each
/// (at least 1), in order, each with the batch's other fields and its chunk: the batch
/// as it is when its payload fits.
pub fn split(mut batch: pb::Batch, max_payload: usize) -> Vec<pb::Batch> {
    let max_payload = max_payload.max(1);
    if batch.payload.len() <= max_payload {
        batch.chunk = None;
        return vec![batch];
    }
    let payload = std::mem::take(&mut batch.payload);
    let count = u32::try_from(payload.len().div_ceil(max_payload)).unwrap_or(u32::MAX);
    let payload_bytes = payload.len() as u64;
    // Each piece is a view of the one payload, not a copy.
    (0..payload.len())
        .step_by(max_payload)
        .enumerate()
        .map(|(index, at)| pb::Batch {
            payload: payload.slice(at..(at + max_payload).min(payload.len())),
            chunk: Some(pb::BatchChunk {
                index: u32::try_from(index).unwrap_or(u32::MAX),
                count,
                payload_bytes,
            }),
            ..batch.clone()
        })
        .collect()
}

/// Why a batch message could not be taken. Each says what arrived against what was
/// expected, with the sizes, for the receiver's log and the sender's status.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ChunkError {
    #[error(
        "the batch through LSN {through_lsn} is {raw_bytes} bytes ({payload_bytes} bytes \
         as sent, in {count} chunks), past the {max} bytes this receiver takes for one \
         batch: a transaction that large cannot be replicated to it"
    )]
    TooLarge {
        through_lsn: u64,
        raw_bytes: u64,
        payload_bytes: u64,
        count: u32,
        max: u64,
    },
    #[error(
        "chunk {index} of {count} of the batch through LSN {through_lsn} came where chunk \
         {expected} was due"
    )]
    OutOfOrder {
        through_lsn: u64,
        index: u32,
        count: u32,
        expected: u32,
    },
    #[error(
        "chunk {index} of the batch through LSN {through_lsn} does not match the chunks \
         before it (another batch's header, count or size)"
    )]
    Mismatch { through_lsn: u64, index: u32 },
    #[error(
        "a whole batch (through LSN {through_lsn}) came while the batch through LSN \
         {pending} had {missing} of its chunks to come"
    )]
    Interrupted {
        through_lsn: u64,
        pending: u64,
        missing: u32,
    },
    #[error(
        "the chunks of the batch through LSN {through_lsn} hold {got} bytes, its first \
         chunk announced {expected}"
    )]
    SizeMismatch {
        through_lsn: u64,
        expected: u64,
        got: u64,
    },
}

/// A batch whose chunks are arriving.
#[derive(Debug)]
struct Pending {
    /// The first chunk, its payload taken out into `payload`.
    batch: pb::Batch,
    /// The payloads joined so far.
    payload: Vec<u8>,
    /// The chunk due next.
    next: u32,
}

/// Joins the chunks of one stream's batches as they arrive; one per stream, dropped
/// with it (and with it whatever part of a batch it held).
#[derive(Debug)]
pub struct Joiner {
    max_bytes: u64,
    pending: Option<Pending>,
}

impl Joiner {
    /// A joiner that refuses a batch of more than `max_bytes`, as sent or decompressed.
    pub fn new(max_bytes: u64) -> Self {
        Self {
            max_bytes,
            pending: None,
        }
    }

    /// Whether part of a batch is held, waiting for its other chunks.
    pub fn pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Takes the stream's next batch message: the whole batch once its last chunk has
    /// come (a batch that came whole, as it is), `None` while chunks are missing.
    pub fn push(&mut self, batch: pb::Batch) -> Result<Option<pb::Batch>, ChunkError> {
        let Some(chunk) = batch.chunk else {
            return match &self.pending {
                None => Ok(Some(batch)),
                Some(p) => Err(ChunkError::Interrupted {
                    through_lsn: batch.through_lsn,
                    pending: p.batch.through_lsn,
                    missing: chunk_count(&p.batch) - p.next,
                }),
            };
        };
        let through_lsn = batch.through_lsn;
        let expected = self.pending.as_ref().map_or(0, |p| p.next);
        if chunk.index != expected || chunk.count < 2 || chunk.index >= chunk.count {
            return Err(ChunkError::OutOfOrder {
                through_lsn,
                index: chunk.index,
                count: chunk.count,
                expected,
            });
        }
        match &mut self.pending {
            None => {
                let largest = chunk.payload_bytes.max(batch.raw_bytes);
                if largest > self.max_bytes {
                    return Err(ChunkError::TooLarge {
                        through_lsn,
                        raw_bytes: batch.raw_bytes,
                        payload_bytes: chunk.payload_bytes,
                        count: chunk.count,
                        max: self.max_bytes,
                    });
                }
                let mut first = batch;
                // Bounded by `max_bytes` just above: one allocation, no regrowth.
                let mut payload =
                    Vec::with_capacity(usize::try_from(chunk.payload_bytes).unwrap_or(0));
                payload.extend_from_slice(&std::mem::take(&mut first.payload));
                self.pending = Some(Pending {
                    batch: first,
                    payload,
                    next: 1,
                });
            }
            Some(p) => {
                let head = &p.batch;
                let same = head.through_lsn == batch.through_lsn
                    && head.count == batch.count
                    && head.codec == batch.codec
                    && head.raw_bytes == batch.raw_bytes
                    && head.chunk.is_some_and(|c| {
                        c.count == chunk.count && c.payload_bytes == chunk.payload_bytes
                    });
                if !same {
                    return Err(ChunkError::Mismatch {
                        through_lsn,
                        index: chunk.index,
                    });
                }
                p.payload.extend_from_slice(&batch.payload);
                p.next += 1;
            }
        }
        let Some(p) = self.pending.as_ref() else {
            return Ok(None);
        };
        let got = p.payload.len() as u64;
        let last = p.next == chunk.count;
        if got > chunk.payload_bytes || (last && got != chunk.payload_bytes) {
            self.pending = None;
            return Err(ChunkError::SizeMismatch {
                through_lsn,
                expected: chunk.payload_bytes,
                got,
            });
        }
        if !last {
            return Ok(None);
        }
        Ok(self.pending.take().map(|p| pb::Batch {
            payload: p.payload.into(),
            chunk: None,
            ..p.batch
        }))
    }
}

fn chunk_count(batch: &pb::Batch) -> u32 {
    batch.chunk.map_or(1, |c| c.count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn batch(payload: Vec<u8>) -> pb::Batch {
        pb::Batch {
            through_lsn: 42,
            count: 1,
            codec: pb::Codec::Lz4 as i32,
            raw_bytes: payload.len() as u64 + 7,
            payload: payload.into(),
            decided: 9,
            waiting: false,
            relayed: vec![pb::OriginMark { origin: 3, seq: 5 }],
            chunk: None,
        }
    }

    fn bytes(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 % 251) as u8).collect()
    }

    fn join(joiner: &mut Joiner, chunks: Vec<pb::Batch>) -> Result<Option<pb::Batch>, ChunkError> {
        let mut out = None;
        for c in chunks {
            assert!(out.is_none(), "a batch came out before its last chunk");
            out = joiner.push(c)?;
        }
        Ok(out)
    }

    #[test]
    fn the_budget_is_half_the_limit_and_never_tiny() {
        assert_eq!(payload_budget(16 * 1024 * 1024), 8 * 1024 * 1024);
        assert_eq!(payload_budget(64 * 1024), 32 * 1024);
        assert_eq!(payload_budget(100), MIN_PAYLOAD);
        assert_eq!(payload_budget(0), MIN_PAYLOAD);
    }

    #[test]
    fn a_batch_that_fits_goes_whole() {
        let b = batch(bytes(1000));
        assert_eq!(split(b.clone(), 1000), vec![b.clone()]);
        assert_eq!(Joiner::new(1 << 20).push(b.clone()), Ok(Some(b)));
    }

    #[test]
    fn split_batches_join_back_whatever_the_cut() {
        for (len, max) in [
            (1001, 1000),
            (2000, 1000),
            (2001, 1000),
            (10, 1),
            (7 * 1024 + 3, 1024),
        ] {
            let b = batch(bytes(len));
            let chunks = split(b.clone(), max);
            assert_eq!(chunks.len(), len.div_ceil(max), "{len} by {max}");
            for (i, c) in chunks.iter().enumerate() {
                assert!(c.payload.len() <= max);
                assert_eq!(c.through_lsn, b.through_lsn);
                assert_eq!(c.relayed, b.relayed);
                let chunk = c.chunk.expect("a chunk");
                assert_eq!(
                    (chunk.index as usize, chunk.count as usize),
                    (i, chunks.len())
                );
                assert_eq!(chunk.payload_bytes, len as u64);
            }
            let mut joiner = Joiner::new(1 << 20);
            assert_eq!(join(&mut joiner, chunks), Ok(Some(b)), "{len} by {max}");
            assert!(!joiner.pending());
        }
    }

    #[test]
    fn every_message_stays_within_the_limit_it_was_cut_for() {
        let limit = 64 * 1024;
        let mut b = batch(bytes(1_000_000));
        // Many relayed origins: the largest header a batch has.
        b.relayed = (0..64)
            .map(|o| pb::OriginMark {
                origin: u64::MAX - o,
                seq: u64::MAX,
            })
            .collect();
        for c in split(b, payload_budget(limit)) {
            let msg = pb::SenderMessage {
                msg: Some(pb::sender_message::Msg::Batch(c)),
            };
            assert!(msg.encoded_len() as u64 <= limit, "{}", msg.encoded_len());
        }
    }

    #[test]
    fn a_batch_past_the_receivers_bound_is_refused_at_its_first_chunk() {
        let chunks = split(batch(bytes(5000)), 1000);
        let mut joiner = Joiner::new(4096);
        let e = joiner.push(chunks[0].clone()).unwrap_err();
        assert!(matches!(
            e,
            ChunkError::TooLarge {
                payload_bytes: 5000,
                max: 4096,
                count: 5,
                ..
            }
        ));
        assert!(e.to_string().contains("5000 bytes as sent"), "{e}");
        assert!(!joiner.pending());
    }

    #[test]
    fn chunks_out_of_order_mixed_or_missing_are_refused() {
        let chunks = split(batch(bytes(3000)), 1000);
        // The second chunk first.
        let mut j = Joiner::new(1 << 20);
        assert!(matches!(
            j.push(chunks[1].clone()),
            Err(ChunkError::OutOfOrder {
                index: 1,
                expected: 0,
                ..
            })
        ));
        // A chunk twice.
        let mut j = Joiner::new(1 << 20);
        assert_eq!(j.push(chunks[0].clone()), Ok(None));
        assert!(matches!(
            j.push(chunks[0].clone()),
            Err(ChunkError::OutOfOrder {
                index: 0,
                expected: 1,
                ..
            })
        ));
        // A whole batch between two chunks.
        let mut j = Joiner::new(1 << 20);
        assert_eq!(j.push(chunks[0].clone()), Ok(None));
        assert!(j.pending());
        assert!(matches!(
            j.push(batch(bytes(10))),
            Err(ChunkError::Interrupted { missing: 2, .. })
        ));
        // Another batch's chunk.
        let mut j = Joiner::new(1 << 20);
        assert_eq!(j.push(chunks[0].clone()), Ok(None));
        let mut other = chunks[1].clone();
        other.through_lsn += 1;
        assert!(matches!(
            j.push(other),
            Err(ChunkError::Mismatch { index: 1, .. })
        ));
        // A chunk that announces less than the pieces hold.
        let mut j = Joiner::new(1 << 20);
        let mut lying = chunks.clone();
        for c in &mut lying {
            if let Some(chunk) = c.chunk.as_mut() {
                chunk.payload_bytes = 2500;
            }
        }
        assert_eq!(j.push(lying[0].clone()), Ok(None));
        assert_eq!(j.push(lying[1].clone()), Ok(None));
        assert!(matches!(
            j.push(lying[2].clone()),
            Err(ChunkError::SizeMismatch {
                expected: 2500,
                got: 3000,
                ..
            })
        ));
        // A single "chunk" is no chunk.
        let mut one = batch(bytes(10));
        one.chunk = Some(pb::BatchChunk {
            index: 0,
            count: 1,
            payload_bytes: 10,
        });
        assert!(matches!(
            Joiner::new(1 << 20).push(one),
            Err(ChunkError::OutOfOrder { count: 1, .. })
        ));
    }

    #[test]
    fn a_joiner_dropped_between_chunks_gives_nothing_and_a_new_one_starts_clean() {
        let b = batch(bytes(3000));
        let chunks = split(b.clone(), 1000);
        let mut j = Joiner::new(1 << 20);
        assert_eq!(j.push(chunks[0].clone()), Ok(None));
        assert_eq!(j.push(chunks[1].clone()), Ok(None));
        drop(j);
        // The sender's next session sends the batch again, from its first chunk.
        let mut j = Joiner::new(1 << 20);
        assert_eq!(join(&mut j, chunks), Ok(Some(b)));
    }
}
