//! Where the last machine restart left this node's own commits.
//!
//! A flush writes a commit ahead of its sync and return-service senders may ship it in
//! between (docs/stream.md, "Shipping before the sync"), so a crash of the machine can
//! lose commits a receiver already holds. The store keeps, from the first open after
//! such a restart, the node's last own seq at that open and which receivers have since
//! been checked against it: a receiver whose first answer holds more of this node's
//! origin than that seq holds commits this node lost, and streaming to it again would
//! hand it new commits under the seqs it already has — which it would skip as
//! duplicates. Kept under [`crate::layout::RESTART_KEY`] until the next machine
//! restart replaces it, so neither a restart of the process nor a receiver that was
//! stopped meanwhile gets past the check.

use std::collections::BTreeSet;

use crate::error::StoreError;

/// The last machine restart's point (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestartPoint {
    /// This node's last own seq when the store opened after the restart: commits of
    /// its origin above it that a receiver holds were lost here.
    pub seq: u64,
    /// Whether the node has taken writes of its own since (its restart fence lifted).
    pub lifted: bool,
    /// Receivers (store names) whose first answer after the restart held no more than
    /// `seq` of this node's origin: everything they get from here on is new to them.
    pub checked: BTreeSet<String>,
}

impl RestartPoint {
    /// Whether a receiver answering that it holds `holds` of this node's origin may be
    /// streamed to: it was checked already, or it holds nothing this node lost.
    pub fn admits(&self, receiver: &str, holds: u64) -> bool {
        self.checked.contains(receiver) || holds <= self.seq
    }

    /// `[seq u64 BE][lifted u8]` then per checked receiver `[length u16 BE][name]`.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(9 + self.checked.len() * 8);
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.push(u8::from(self.lifted));
        for name in &self.checked {
            let len = u16::try_from(name.len()).expect("store names are short");
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(name.as_bytes());
        }
        out
    }

    pub(crate) fn decode(key: &[u8], v: &[u8]) -> Result<Self, StoreError> {
        let bad = |what: &str| StoreError::corrupt(key, what);
        if v.len() < 9 {
            return Err(bad("restart point shorter than its header"));
        }
        let seq = u64::from_be_bytes(v[..8].try_into().expect("8 bytes"));
        let lifted = match v[8] {
            0 => false,
            1 => true,
            _ => return Err(bad("restart point's lifted flag is not 0 or 1")),
        };
        let mut checked = BTreeSet::new();
        let mut rest = &v[9..];
        while !rest.is_empty() {
            if rest.len() < 2 {
                return Err(bad("restart point ends inside a name length"));
            }
            let len = u16::from_be_bytes([rest[0], rest[1]]) as usize;
            let name = rest
                .get(2..2 + len)
                .ok_or_else(|| bad("restart point ends inside a name"))?;
            let name = std::str::from_utf8(name)
                .map_err(|_| bad("restart point names a receiver in bytes that are not UTF-8"))?;
            checked.insert(name.to_string());
            rest = &rest[2 + len..];
        }
        Ok(RestartPoint {
            seq,
            lifted,
            checked,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::RestartPoint;

    #[test]
    fn a_restart_point_reads_back_and_admits_only_what_it_should() {
        let mut p = RestartPoint {
            seq: 7,
            lifted: false,
            checked: Default::default(),
        };
        assert!(p.admits("ds2", 7));
        assert!(!p.admits("ds2", 8));
        p.checked.insert("ds2".into());
        p.checked.insert("ds3_long_name".into());
        p.lifted = true;
        assert!(p.admits("ds2", 100), "checked once, for good");
        assert!(!p.admits("ds4", 8));
        let back = RestartPoint::decode(b"Mrestart", &p.encode()).unwrap();
        assert_eq!(back, p);
        for bad in [
            &b"short"[..],
            &[0, 0, 0, 0, 0, 0, 0, 1, 2][..],
            &[0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 5, b'a'][..],
        ] {
            let e = RestartPoint::decode(b"Mrestart", bad).unwrap_err();
            assert!(e.to_string().contains("restart point"), "{e}");
        }
    }
}
