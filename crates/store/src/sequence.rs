//! Sequences: definitions and the pure arithmetic of handing out values.
//!
//! A sequence hands out `START WITH`, then steps by `INCREMENT BY` (negative counts
//! down) within `[MINVALUE, MAXVALUE]`; past a bound it wraps to the other bound when it
//! CYCLEs and is exhausted (SQLSTATE 2200H) otherwise. `NEXTVAL` is not transactional,
//! as in Oracle and TimesTen: a rolled-back transaction does not give its values back.
//!
//! Persistence is by blocks of [`BLOCK_SIZE`] values: before handing out the first
//! value of a block the store durably records where the *next* block starts, so a
//! restart resumes there and may skip what was left of the block (as Oracle's and
//! TimesTen's sequence caches do), but never hands out a value twice.

use hawser_core::QualName;

use crate::error::StoreError;

/// How many values one durable reservation covers.
pub const BLOCK_SIZE: u32 = 20;

/// A sequence as CREATE SEQUENCE defines it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceDef {
    pub name: QualName,
    pub increment: i64,
    pub min_value: i64,
    pub max_value: i64,
    pub start: i64,
    pub cycle: bool,
}

impl SequenceDef {
    /// Oracle's defaults for what CREATE SEQUENCE leaves out: INCREMENT BY 1, ascending
    /// from MINVALUE 1 to the largest BIGINT; a descending sequence (`increment < 0`)
    /// counts down from -1 to the smallest BIGINT. START WITH defaults to MINVALUE for
    /// ascending and MAXVALUE for descending sequences.
    pub fn with_defaults(
        name: QualName,
        increment: Option<i64>,
        min_value: Option<i64>,
        max_value: Option<i64>,
        start: Option<i64>,
        cycle: bool,
    ) -> Self {
        let increment = increment.unwrap_or(1);
        let (dmin, dmax) = if increment < 0 {
            (i64::MIN, -1)
        } else {
            (1, i64::MAX)
        };
        let min_value = min_value.unwrap_or(dmin);
        let max_value = max_value.unwrap_or(dmax);
        let start = start.unwrap_or(if increment < 0 { max_value } else { min_value });
        Self {
            name,
            increment,
            min_value,
            max_value,
            start,
            cycle,
        }
    }

    /// Checks the definition is usable.
    pub fn validate(&self) -> Result<(), StoreError> {
        let bad = |reason: &str| {
            Err(StoreError::InvalidSequenceDef {
                name: self.name.clone(),
                reason: reason.to_string(),
            })
        };
        if self.increment == 0 {
            return bad("INCREMENT BY must not be zero");
        }
        if self.min_value >= self.max_value {
            return bad("MINVALUE must be less than MAXVALUE");
        }
        if self.start < self.min_value || self.start > self.max_value {
            return bad("START WITH must lie between MINVALUE and MAXVALUE");
        }
        if self.increment.unsigned_abs() > self.max_value.abs_diff(self.min_value) {
            return bad("INCREMENT BY must be smaller than MAXVALUE - MINVALUE");
        }
        Ok(())
    }

    /// The value after `v`, wrapping when the sequence cycles; `None` when exhausted.
    pub fn step(&self, v: i64) -> Option<i64> {
        match v.checked_add(self.increment) {
            Some(n) if (self.min_value..=self.max_value).contains(&n) => Some(n),
            _ if self.cycle => Some(if self.increment > 0 {
                self.min_value
            } else {
                self.max_value
            }),
            _ => None,
        }
    }

    /// The bound an exhausted sequence reached, for the error message.
    pub fn limit(&self) -> i64 {
        if self.increment > 0 {
            self.max_value
        } else {
            self.min_value
        }
    }
}

/// The in-memory state of one sequence.
#[derive(Debug, Clone)]
pub(crate) struct SequenceState {
    pub def: SequenceDef,
    /// The next value to hand out; `None` once exhausted.
    pub next: Option<i64>,
    /// Values left in the current durable block.
    pub left_in_block: u32,
    /// What was last recorded as the restart point (`next` of a fresh open).
    pub restart_at: Option<i64>,
}

impl SequenceState {
    /// A sequence just created: nothing reserved yet.
    pub fn new(def: SequenceDef) -> Self {
        let start = def.start;
        Self {
            def,
            next: Some(start),
            left_in_block: 0,
            restart_at: Some(start),
        }
    }

    /// A sequence after a restart: it resumes at the recorded restart point.
    pub fn reopened(def: SequenceDef, restart_at: Option<i64>) -> Self {
        Self {
            def,
            next: restart_at,
            left_in_block: 0,
            restart_at,
        }
    }

    /// Where the next block starts if one is reserved now: `BLOCK_SIZE` steps ahead.
    pub fn next_block_start(&self) -> Option<i64> {
        let mut v = self.next;
        for _ in 0..BLOCK_SIZE {
            v = v.and_then(|x| self.def.step(x));
        }
        v
    }

    /// Hands out the next value of the current block. The caller has made sure the
    /// block is reserved (`left_in_block > 0`).
    pub fn take(&mut self) -> Result<i64, StoreError> {
        let v = self.next.ok_or_else(|| StoreError::SequenceExhausted {
            name: self.def.name.clone(),
            limit: self.def.limit(),
        })?;
        self.next = self.def.step(v);
        self.left_in_block = self.left_in_block.saturating_sub(1);
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(inc: i64, min: i64, max: i64, start: i64, cycle: bool) -> SequenceDef {
        SequenceDef {
            name: QualName::bare("s"),
            increment: inc,
            min_value: min,
            max_value: max,
            start,
            cycle,
        }
    }

    #[test]
    fn steps_wrap_only_when_cycling() {
        assert_eq!(seq(2, 1, 5, 1, false).step(5), None);
        assert_eq!(seq(2, 1, 5, 1, false).step(3), Some(5));
        assert_eq!(seq(2, 1, 5, 1, true).step(5), Some(1));
        assert_eq!(seq(-1, -3, 3, 3, true).step(-3), Some(3));
        assert_eq!(seq(1, 1, i64::MAX, 1, false).step(i64::MAX), None);
    }

    #[test]
    fn defaults_follow_oracle() {
        let d = SequenceDef::with_defaults(QualName::bare("s"), Some(-1), None, None, None, false);
        assert_eq!((d.max_value, d.start), (-1, -1));
        d.validate().unwrap();
        let bad = seq(0, 1, 5, 1, false).validate().unwrap_err();
        assert_eq!(bad.code(), "22023");
        assert!(seq(1, 1, 5, 9, false).validate().is_err());
    }

    #[test]
    fn a_block_reaches_twenty_steps_ahead() {
        let s = SequenceState::new(seq(1, 1, 100, 1, false));
        assert_eq!(s.next_block_start(), Some(21));
        let s = SequenceState::new(seq(1, 1, 10, 1, false));
        assert_eq!(s.next_block_start(), None);
    }
}
