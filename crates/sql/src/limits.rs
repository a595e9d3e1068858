//! How complex a statement may be.
//!
//! Binding, planning, evaluation and printing each recurse once per level of an
//! expression, on the stack of the thread that runs the session: a tokio worker, 2 MiB.
//! Overflowing it aborts the whole node, not just the statement, so nesting is bounded
//! before any of them runs. A statement past a bound fails with SQLSTATE 54001
//! (statement too complex) and changes nothing:
//!
//! * [`MAX_EXPR_DEPTH`] is the limit a user meets: an expression nests at most this many
//!   levels. Operators nest left to right, so a chain of N terms (`1 + 1 + ... + 1`,
//!   `a OR b OR ...`) is N levels deep, as are N nested parentheses or N `NOT`s. It is
//!   checked once, while the planner binds the parsed expression, so no later pass
//!   sees a deeper tree. Long flat lists (select lists, IN lists, VALUES rows,
//!   function arguments) are not depth.
//! * [`screen`] runs before sqlparser. It reads an operator chain in a loop, so a chain
//!   of any length parses, but the tree it builds is as deep as the chain is long, and
//!   even dropping that tree recurses (a 100 KB `1+1+...` overflowed 2 MiB). No part of
//!   an expression can nest deeper than it has tokens, so a statement whose tokens
//!   along some run of nested parts exceed [`MAX_NESTING_TOKENS`] is refused unparsed.
//!   That bound is [`MAX_EXPR_DEPTH`] times 16, so it refuses an expression within the
//!   depth limit only if that has over 16 tokens a level outside brackets and commas
//!   (a CASE with a thousand WHENs).
//! * [`MAX_STATEMENT_DEPTH`] bounds statements inside statements (`EXPLAIN EXPLAIN ...`),
//!   the one recursion sqlparser does not make stack-safe (see [`crate::dialect`]).
//!
//! `docs/sql.md` ("Statement complexity") has the user's side of this.

use std::mem;

use sqlparser::tokenizer::{Location, Token, TokenWithSpan};

use crate::error::ErrorKind;

/// How many levels an expression may nest. In a debug build a statement this deep
/// needs at most 780 KB of stack (nested function calls or CASEs; 600 KB for operator
/// chains), under 40 % of a tokio worker's 2 MiB; an optimised build needs less. The
/// measurement is in `docs/sql.md`.
pub const MAX_EXPR_DEPTH: usize = 256;

/// How many tokens a run of nested parts of one statement may hold before it is
/// parsed (see [`screen`]).
pub const MAX_NESTING_TOKENS: usize = 16 * MAX_EXPR_DEPTH;

/// How deep statements may nest: `EXPLAIN ANALYZE SELECT ...` is 2.
pub const MAX_STATEMENT_DEPTH: usize = 4;

/// sqlparser's recursion limit. The screen keeps statements from reaching it: its
/// default of 50 refused 50 nested `NOT`s, and sqlparser reported that as a syntax
/// error (it reads a `NOT` it cannot parse as a column named NOT). Every level of its
/// recursion consumes a token, and a statement level two.
pub const PARSER_RECURSION_LIMIT: usize = MAX_NESTING_TOKENS + 2 * MAX_STATEMENT_DEPTH + 16;

/// The error for an expression deeper than [`MAX_EXPR_DEPTH`].
pub fn too_deep() -> ErrorKind {
    ErrorKind::TooComplex(format!(
        "an expression nests more than {MAX_EXPR_DEPTH} levels deep (each operator of a \
         chain such as a + b + c, each NOT and each parenthesis is a level); split it up"
    ))
}

/// The error for statements nested deeper than [`MAX_STATEMENT_DEPTH`].
pub fn too_nested() -> ErrorKind {
    ErrorKind::TooComplex(format!(
        "statements nest more than {MAX_STATEMENT_DEPTH} deep (as in EXPLAIN EXPLAIN ...)"
    ))
}

/// The error for a statement refused by [`screen`].
pub fn too_long() -> ErrorKind {
    ErrorKind::TooComplex(format!(
        "an expression runs to more than {MAX_NESTING_TOKENS} tokens without a separating \
         comma, so it could nest deeper than the {MAX_EXPR_DEPTH} levels allowed; it was \
         not parsed"
    ))
}

/// A statement [`screen`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    /// The index, in the script's tokens, of the statement's first token.
    pub index: usize,
    /// Where the statement starts.
    pub at: Location,
}

/// The first statement of a tokenised script whose nesting could exceed
/// [`MAX_NESTING_TOKENS`]. Statements sqlparser does not parse (`skip`, given their
/// first two tokens) are not screened.
pub fn screen(tokens: &[TokenWithSpan], skip: impl Fn(&Token, &Token) -> bool) -> Option<Refused> {
    let eof = Token::EOF;
    let mut start = 0;
    while start < tokens.len() {
        let end = tokens[start..]
            .iter()
            .position(|t| t.token == Token::SemiColon)
            .map_or(tokens.len(), |i| start + i);
        let statement = &tokens[start..end];
        let mut words = statement
            .iter()
            .enumerate()
            .filter(|(_, t)| !matches!(t.token, Token::Whitespace(_)));
        if let Some((first, t)) = words.next() {
            let second = words.next().map_or(&eof, |(_, t)| &t.token);
            if !skip(&t.token, second) && exceeds(statement) {
                return Some(Refused {
                    index: start + first,
                    at: t.span.start,
                });
            }
        }
        start = end + 1;
    }
    None
}

/// Whether a statement's nesting bound exceeds [`MAX_NESTING_TOKENS`].
///
/// Every level of an expression tree consumes a token its children do not contain
/// (an operator, a keyword, a bracket), so the depth below a node is at most the
/// tokens of the brackets it lies in, counted at each bracket level only within the
/// comma-separated element that contains the node: the elements of a list are
/// siblings, not nested. The bound is the most such tokens along any run of brackets.
fn exceeds(statement: &[TokenWithSpan]) -> bool {
    /// One bracket level: the tokens of its current element, the largest bound of the
    /// brackets within that element, and the largest bound of its finished elements.
    #[derive(Default)]
    struct Level {
        here: usize,
        inner: usize,
        widest: usize,
    }
    impl Level {
        fn bound(&self) -> usize {
            self.widest.max(self.here + self.inner)
        }
    }
    let mut top = Level::default();
    let mut outer: Vec<Level> = Vec::new();
    // The tokens counted so far along the open brackets: a lower bound of the result,
    // so a pathological statement is refused before its brackets pile up in `outer`.
    let mut running = 0usize;
    for t in statement {
        match t.token {
            Token::Whitespace(_) => continue,
            Token::LParen | Token::LBracket | Token::LBrace => {
                top.here += 1;
                running += 1;
                outer.push(mem::take(&mut top));
            }
            Token::RParen | Token::RBracket | Token::RBrace => {
                // An unmatched closing bracket is a syntax error the parser reports.
                if let Some(parent) = outer.pop() {
                    running -= top.here;
                    let inner = top.bound();
                    top = parent;
                    top.inner = top.inner.max(inner);
                }
                top.here += 1;
                running += 1;
            }
            Token::Comma => {
                running -= top.here;
                top.widest = top.bound();
                top.here = 0;
                top.inner = 0;
            }
            _ => {
                top.here += 1;
                running += 1;
            }
        }
        if running > MAX_NESTING_TOKENS {
            return true;
        }
    }
    // Brackets left open (also a syntax error) close at the end.
    while let Some(parent) = outer.pop() {
        let inner = top.bound();
        top = parent;
        top.inner = top.inner.max(inner);
    }
    top.bound() > MAX_NESTING_TOKENS
}

#[cfg(test)]
mod tests {
    use sqlparser::dialect::GenericDialect;
    use sqlparser::tokenizer::Tokenizer;

    use super::*;

    fn refused(sql: &str) -> Option<Refused> {
        let tokens = Tokenizer::new(&GenericDialect {}, sql)
            .tokenize_with_location()
            .expect("tokenizes");
        screen(
            &tokens,
            |t, _| matches!(t, Token::Word(w) if w.value == "skipped"),
        )
    }

    fn chain(op: &str, n: usize) -> String {
        vec!["1"; n].join(op)
    }

    #[test]
    fn long_chains_are_refused_and_flat_lists_are_not() {
        let n = MAX_NESTING_TOKENS;
        assert!(refused(&format!("select {}", chain("+", n / 2 + 1))).is_some());
        assert!(refused(&format!("select {}", chain("+", n / 4))).is_none());
        // Commas separate siblings, at any level.
        assert!(refused(&format!("select {}", chain(",", n * 4))).is_none());
        assert!(refused(&format!("select 1 in ({})", chain(",", n * 4))).is_none());
        let rows = vec!["(1, 'a', 2 + 3)"; n].join(", ");
        assert!(refused(&format!("insert into t values {rows}")).is_none());
        // Brackets add up along a run, wherever the tokens stand in their element.
        let nested = format!("select {}1{}", "(1 + ".repeat(n / 3), ")".repeat(n / 3));
        assert!(refused(&nested).is_some());
        let parens = format!("select {}1{}", "(".repeat(n / 2 + 1), ")".repeat(n / 2 + 1));
        assert!(refused(&parens).is_some());
        let after = format!("select (1){}", " + 1".repeat(n / 2));
        assert!(refused(&after).is_some());
        let unclosed = format!("select {}", "(".repeat(n + 1));
        assert!(refused(&unclosed).is_some());
    }

    #[test]
    fn the_refused_statement_is_located_and_foreign_ones_are_skipped() {
        let long = chain(" or ", MAX_NESTING_TOKENS);
        let r = refused(&format!("select 1;;\n  select {long}; select 2")).expect("refused");
        assert_eq!(r.at, Location::new(2, 3));
        assert!(refused(&format!("skipped {long}; select 1")).is_none());
    }
}
