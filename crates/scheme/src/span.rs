//! Source positions.
//!
//! Every AST node that a diagnostic may point at carries a [`Span`]: a half-open byte
//! range into the text it was parsed from. Spans are *not* part of a node's identity: two
//! schemes that say the same thing are equal however they were laid out, which is what
//! the printer round-trip, `apply` and the Raft state machine (which stores schemes, not
//! their text) all want. So `Span`'s `PartialEq` is always true and its `Hash` is empty.
//!
//! [`LineIndex`] turns a byte offset into a 1-based line and column (columns count
//! characters, not bytes) for `FILE:LINE:COL` diagnostics.

use std::hash::{Hash, Hasher};

use serde::{Deserialize, Serialize};

/// A half-open byte range `start..end` into the source text.
///
/// Equality ignores the positions on purpose (see the module docs); compare
/// `(a.start, a.end)` when the positions themselves matter.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

impl Span {
    pub fn new(start: usize, end: usize) -> Self {
        Self { start, end }
    }

    /// The smallest span covering both.
    pub fn to(self, other: Span) -> Span {
        Span::new(self.start.min(other.start), self.end.max(other.end))
    }

    /// Same start and end (the `PartialEq` impl deliberately does not check this).
    pub fn same_position(&self, other: &Span) -> bool {
        self.start == other.start && self.end == other.end
    }
}

impl PartialEq for Span {
    fn eq(&self, _other: &Span) -> bool {
        true
    }
}

impl Eq for Span {}

impl Hash for Span {
    fn hash<H: Hasher>(&self, _state: &mut H) {}
}

/// A 1-based line and column; the column counts characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineCol {
    pub line: usize,
    pub col: usize,
}

/// Maps byte offsets of one source text to lines and columns.
#[derive(Debug, Clone)]
pub struct LineIndex<'a> {
    source: &'a str,
    /// Byte offset where each line starts.
    line_starts: Vec<usize>,
}

impl<'a> LineIndex<'a> {
    pub fn new(source: &'a str) -> Self {
        let mut line_starts = vec![0];
        line_starts.extend(source.match_indices('\n').map(|(i, _)| i + 1));
        Self {
            source,
            line_starts,
        }
    }

    /// Line and column of byte `offset` (clamped to the text, and to a char boundary).
    pub fn line_col(&self, offset: usize) -> LineCol {
        let offset = self.floor_char_boundary(offset.min(self.source.len()));
        let line = match self.line_starts.binary_search(&offset) {
            Ok(i) => i,
            Err(i) => i - 1,
        };
        let start = self.line_starts[line];
        let col = self.source[start..offset].chars().count() + 1;
        LineCol {
            line: line + 1,
            col,
        }
    }

    /// The text of 1-based `line`, without its line terminator.
    pub fn line_text(&self, line: usize) -> &'a str {
        let Some(&start) = self.line_starts.get(line.wrapping_sub(1)) else {
            return "";
        };
        let end = self
            .line_starts
            .get(line)
            .map(|&next| next - 1)
            .unwrap_or(self.source.len());
        self.source[start..end].trim_end_matches('\r')
    }

    fn floor_char_boundary(&self, mut offset: usize) -> usize {
        while !self.source.is_char_boundary(offset) {
            offset -= 1;
        }
        offset
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_compare_equal_regardless_of_position() {
        assert_eq!(Span::new(1, 2), Span::new(5, 9));
        assert!(!Span::new(1, 2).same_position(&Span::new(5, 9)));
    }

    #[test]
    fn line_col_counts_characters_from_one() {
        let idx = LineIndex::new("ab\ncé d\n");
        assert_eq!(idx.line_col(0), LineCol { line: 1, col: 1 });
        assert_eq!(idx.line_col(3), LineCol { line: 2, col: 1 });
        // 'é' is two bytes; "d" starts at byte 7 and is the 4th character.
        assert_eq!(idx.line_col(7), LineCol { line: 2, col: 4 });
        assert_eq!(idx.line_text(2), "cé d");
        assert_eq!(idx.line_text(9), "");
    }
}
