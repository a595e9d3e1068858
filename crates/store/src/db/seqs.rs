//! Which seqs of its own origin this node may still hand out: reserved a block ahead,
//! durably, and continued above every reservation after a loss.

use crate::engine::{KvEngine, WriteBatch};
use crate::error::StoreError;
use crate::layout;

/// How many seqs one reservation covers: one synced write per this many local commits.
const SEQ_BLOCK: u64 = 1 << 16;

/// Which seqs of its own origin this node may still hand out.
///
/// A flush writes a commit before its sync and senders may ship it in between, so a
/// machine crash (or a salvage) can lose commits a receiver holds; handing their seqs
/// out again would name two transactions by one Gtid. So seqs are reserved in blocks,
/// the reservation synced before the first seq above the previous one is used, and a
/// store that opens after such a loss continues above everything ever reserved. Kept
/// under [`layout::SEQ_CEILING_KEY`] as `[ceiling u64 BE][floor u64 BE]`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SeqReservation {
    /// Durably reserved through this seq.
    pub(super) ceiling: u64,
    /// Seqs at or below it are not handed out: the ceiling found by the last open that
    /// may have lost commits, kept until commits pass it.
    pub(super) floor: u64,
}

impl SeqReservation {
    pub(super) fn decode(v: &[u8]) -> Result<SeqReservation, StoreError> {
        let bad = || StoreError::corrupt(layout::SEQ_CEILING_KEY, "not a ceiling and a floor");
        let word = |b: &[u8]| -> Result<u64, StoreError> {
            Ok(u64::from_be_bytes(b.try_into().map_err(|_| bad())?))
        };
        if v.len() != 16 {
            return Err(bad());
        }
        Ok(SeqReservation {
            ceiling: word(&v[..8])?,
            floor: word(&v[8..])?,
        })
    }

    pub(super) fn encode(&self) -> Vec<u8> {
        let mut v = self.ceiling.to_be_bytes().to_vec();
        v.extend_from_slice(&self.floor.to_be_bytes());
        v
    }

    /// The reservation of a store opened with `stored`; `lost` when commits may have
    /// been lost since they were handed out (a machine restart, a salvage): nothing
    /// reserved until now is handed out any more.
    pub(crate) fn opened(stored: SeqReservation, lost: bool) -> SeqReservation {
        SeqReservation {
            floor: if lost { stored.ceiling } else { stored.floor },
            ..stored
        }
    }

    /// The next local seq after `last_seq`, and the reservation to make durable first
    /// when that seq lies above the current ceiling.
    pub(crate) fn next(&self, last_seq: u64) -> (u64, Option<SeqReservation>) {
        let seq = last_seq.max(self.floor) + 1;
        let raise = (seq > self.ceiling).then_some(SeqReservation {
            ceiling: seq - 1 + SEQ_BLOCK,
            floor: self.floor,
        });
        (seq, raise)
    }
}

/// Makes `seqs` the durable reservation ([`SeqReservation`]).
pub(super) fn write_seqs(engine: &dyn KvEngine, seqs: &SeqReservation) -> Result<(), StoreError> {
    let mut batch = WriteBatch::new();
    batch.put(layout::SEQ_CEILING_KEY.to_vec(), seqs.encode());
    engine.apply(batch)?;
    engine.flush()
}

#[cfg(test)]
mod tests {
    use super::{SeqReservation, SEQ_BLOCK};

    #[test]
    fn seqs_are_reserved_a_block_ahead_and_an_open_after_a_loss_continues_above_them() {
        let fresh = SeqReservation::opened(SeqReservation::default(), false);
        // The first seq needs a reservation, which covers a block.
        let (seq, raised) = fresh.next(0);
        assert_eq!(seq, 1);
        let r = raised.expect("a reservation");
        assert_eq!(r.ceiling, SEQ_BLOCK);
        // Within it, none.
        assert_eq!(r.next(SEQ_BLOCK - 1), (SEQ_BLOCK, None));
        // Past it, the next block.
        let (seq, raised) = r.next(SEQ_BLOCK);
        assert_eq!(seq, SEQ_BLOCK + 1);
        assert_eq!(raised.map(|r| r.ceiling), Some(2 * SEQ_BLOCK));
        // An open that may have lost commits (whatever was handed out up to 40 is
        // recovered as 10) continues above the whole reservation, and keeps doing so
        // at later opens until a commit passes it.
        let lost = SeqReservation::opened(r, true);
        let (seq, raised) = lost.next(10);
        assert_eq!(seq, SEQ_BLOCK + 1);
        let raised = raised.expect("a new block");
        assert_eq!(raised.floor, SEQ_BLOCK);
        let reopened = SeqReservation::opened(lost, false);
        assert_eq!(reopened.next(10).0, SEQ_BLOCK + 1);
        // Encoded and decoded whole.
        assert_eq!(SeqReservation::decode(&raised.encode()).unwrap(), raised);
        assert!(SeqReservation::decode(&[0; 8]).is_err());
    }
}
