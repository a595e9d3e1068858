//! Splitting a script into statements with sqlparser.
//!
//! The whole script is parsed before any of it runs, so a syntax error anywhere runs
//! nothing. sqlparser's `GenericDialect` is the one that accepts hawser's inputs as
//! written, including the Sybase forms `insert T values (1, 10)` and `delete T where
//! k = 1` (its MsSql dialect refuses the latter); [`crate::dialect`] bounds how deep its
//! statements nest.
//!
//! Replication DDL (`CREATE / ALTER / DROP REPLICATION`) is recognised by its first
//! tokens and kept as [`Parsed::Replication`] with its source text: its grammar is not
//! sqlparser's but the scheme language's, and it runs through the cluster control plane
//! (see [`crate::ReplicationDdl`]). `CALL` is read by [`crate::call`] (TimesTen's
//! built-in procedures take literals sqlparser does not know, such as `0x01`). Their
//! tokens are skipped up to the next `;`.
//!
//! Before anything is parsed, [`limits::screen`] refuses a statement whose nesting
//! could overflow the stack: it is reported as that statement's error (54001), in
//! order, once the statements before it have parsed.

use sqlparser::ast::Statement;
use sqlparser::keywords::Keyword;
use sqlparser::parser::{Parser, ParserError};
use sqlparser::tokenizer::{Location, Token, Tokenizer};

use crate::dialect::Dialect;
use crate::error::{Error, ErrorKind};
use crate::limits;

/// One statement of a script.
#[derive(Debug)]
pub enum Parsed {
    Sql(Box<Statement>),
    /// `CREATE / ALTER / DROP REPLICATION`, as written (without the final `;`).
    Replication(String),
    /// `CALL procedure(...)`, its literal arguments read ([`crate::call`]).
    Call(crate::call::Call),
    /// A statement recognised but not run here; the text says why.
    Rejected(String),
}

/// A statement with where it starts in the script.
#[derive(Debug)]
pub struct ScriptStatement {
    pub parsed: Parsed,
    pub at: Location,
}

/// A script that does not parse: the 1-based statement and the error.
#[derive(Debug)]
pub struct ScriptError {
    pub statement: usize,
    pub error: Error,
}

/// Why replication DDL is refused by an engine without a [`crate::ReplicationDdl`] hook.
pub const REPLICATION_REJECTED: &str =
    "replication DDL needs the cluster control plane, which this SQL engine is not connected to";

/// Parses every statement of `text`.
pub fn parse_script(text: &str) -> Result<Vec<ScriptStatement>, ScriptError> {
    let dialect = Dialect::default();
    let mut tokens = Tokenizer::new(&dialect, text)
        .tokenize_with_location()
        .map_err(|e| {
            let e = ParserError::from(e);
            ScriptError {
                statement: statement_at(text, &e),
                error: syntax(e),
            }
        })?;
    // The refused statement is never parsed: the parser sees the script up to it.
    let refused = limits::screen(&tokens, |a, b| foreign(a, b).is_some());
    if let Some(r) = refused {
        tokens.truncate(r.index);
    }
    let mut parser = Parser::new(&dialect)
        .with_recursion_limit(limits::PARSER_RECURSION_LIMIT)
        .with_tokens_with_locations(tokens);
    let mut out = Vec::new();
    loop {
        while parser.consume_token(&Token::SemiColon) {}
        let first = parser.peek_token();
        if first.token == Token::EOF {
            if let Some(r) = refused {
                return Err(ScriptError {
                    statement: out.len() + 1,
                    error: Error::from(limits::too_long()).or_at(r.at),
                });
            }
            break;
        }
        let at = first.span.start;
        let fail = |error: Error, n: usize| ScriptError {
            statement: n + 1,
            error,
        };
        let [a, b] = parser.peek_tokens_ref::<2>();
        if let Some(kind) = foreign(&a.token, &b.token) {
            // Skip to the end of the statement; its grammar is not sqlparser's.
            let mut end = at;
            loop {
                let next = parser.peek_token();
                match next.token {
                    Token::SemiColon | Token::EOF => break,
                    _ => {
                        end = next.span.end;
                        parser.advance_token();
                    }
                }
            }
            let parsed = match kind {
                Foreign::Replication => Parsed::Replication(slice(text, at, end).to_string()),
                Foreign::Call => match crate::call::parse_call(slice(text, at, end)) {
                    Ok(call) => Parsed::Call(call),
                    Err(message) => {
                        let error = Error::from(ErrorKind::Syntax(message)).or_at(at);
                        return Err(fail(error, out.len()));
                    }
                },
            };
            out.push(ScriptStatement { parsed, at });
            continue;
        }
        let stmt = dialect.statement(&mut parser).map_err(|e| {
            let error = match e {
                ParserError::RecursionLimitExceeded if dialect.refused() => {
                    Error::from(limits::too_nested()).or_at(at)
                }
                e => syntax(e),
            };
            fail(error, out.len())
        })?;
        let next = parser.peek_token();
        if !matches!(next.token, Token::SemiColon | Token::EOF) {
            let error = Error::from(ErrorKind::Syntax(format!(
                "expected ; or the end of the script, found {}",
                next.token
            )))
            .or_at(next.span.start);
            return Err(fail(error, out.len()));
        }
        out.push(ScriptStatement {
            parsed: Parsed::Sql(Box::new(stmt)),
            at,
        });
    }
    Ok(out)
}

/// A statement whose grammar is not sqlparser's.
enum Foreign {
    Replication,
    Call,
}

/// Whether the statement starting with these two tokens is one sqlparser must not parse.
fn foreign(first: &Token, second: &Token) -> Option<Foreign> {
    let Token::Word(w) = first else {
        return None;
    };
    match w.keyword {
        Keyword::CALL => Some(Foreign::Call),
        Keyword::CREATE | Keyword::ALTER | Keyword::DROP => match second {
            Token::Word(w2) if w2.value.eq_ignore_ascii_case("replication") => {
                Some(Foreign::Replication)
            }
            _ => None,
        },
        _ => None,
    }
}

/// The text between two sqlparser locations (1-based line, 1-based column in
/// characters; `end` is just past the last character).
fn slice(text: &str, start: Location, end: Location) -> &str {
    let offset = |loc: Location| -> usize {
        let mut line = 1u64;
        let mut column = 1u64;
        for (i, c) in text.char_indices() {
            if line == loc.line && column == loc.column {
                return i;
            }
            if c == '\n' {
                line += 1;
                column = 1;
            } else {
                column += 1;
            }
        }
        text.len()
    };
    let (a, b) = (offset(start), offset(end));
    text.get(a..b.max(a)).unwrap_or("")
}

/// A parser error as a syntax error, its "at Line: N, Column: M" turned into a location.
fn syntax(e: ParserError) -> Error {
    let text = match e {
        ParserError::TokenizerError(s) | ParserError::ParserError(s) => s,
        // The screen keeps statements from reaching sqlparser's limit; should one
        // still, it is the same condition.
        ParserError::RecursionLimitExceeded => return Error::from(limits::too_deep()),
    };
    let (message, at) = split_location(&text);
    let err = Error::from(ErrorKind::Syntax(message));
    match at {
        Some(loc) => err.or_at(loc),
        None => err,
    }
}

/// Splits `"... at Line: 3, Column: 7"` into the message and the location.
fn split_location(text: &str) -> (String, Option<Location>) {
    let Some(i) = text.rfind("Line: ") else {
        return (text.to_string(), None);
    };
    let tail = &text[i + "Line: ".len()..];
    let mut nums = tail
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u64>());
    match (nums.next(), nums.next()) {
        (Some(Ok(line)), Some(Ok(column))) => {
            let message = text[..i].trim_end().trim_end_matches(" at").trim_end();
            (message.to_string(), Some(Location::new(line, column)))
        }
        _ => (text.to_string(), None),
    }
}

/// For a tokenizer error (nothing parsed yet): the statement holding its location,
/// counted by the semicolons before it.
fn statement_at(text: &str, e: &ParserError) -> usize {
    let ParserError::TokenizerError(s) = e else {
        return 1;
    };
    let Some(loc) = split_location(s).1 else {
        return 1;
    };
    let mut n = 1;
    for (i, line) in text.lines().enumerate() {
        let line_no = i as u64 + 1;
        if line_no > loc.line {
            break;
        }
        let upto = if line_no == loc.line {
            line.chars()
                .take(loc.column.saturating_sub(1) as usize)
                .collect::<String>()
        } else {
            line.to_string()
        };
        n += upto.matches(';').count();
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_split_with_their_locations() {
        let s =
            parse_script("select 1;\n  insert T values (1, 10); ;delete T where k = 1").unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s[1].at, Location::new(2, 3));
        assert!(matches!(s[2].parsed, Parsed::Sql(_)));
    }

    #[test]
    fn replication_ddl_and_call_are_recognised_not_parsed() {
        let s = parse_script(
            "CREATE REPLICATION r ELEMENT e DATASTORE MASTER a ON \"h\" SUBSCRIBER b ON \"h2\";\n\
             call ttRepSyncSet(0x01, 45, 1); select 1",
        )
        .unwrap();
        assert_eq!(s.len(), 3);
        assert!(matches!(&s[0].parsed, Parsed::Replication(t)
            if t == "CREATE REPLICATION r ELEMENT e DATASTORE MASTER a ON \"h\" SUBSCRIBER b ON \"h2\""));
        assert!(matches!(&s[1].parsed, Parsed::Call(c)
            if c.name == "ttrepsyncset" && c.args.len() == 3));
        assert_eq!(s[1].at, Location::new(2, 1));
    }

    #[test]
    fn syntax_errors_carry_statement_line_and_column() {
        let e = parse_script("select 1;\nselect from where;").unwrap_err();
        assert_eq!(e.statement, 2);
        assert_eq!(e.error.kind.code(), "42601");
        assert_eq!(e.error.at.map(|l| l.line), Some(2));
        assert!(
            !e.error.kind.to_string().contains("Line:"),
            "{}",
            e.error.kind
        );
        let e = parse_script("select 1; select 'unterminated").unwrap_err();
        assert_eq!(e.statement, 2);
        assert_eq!(e.error.at.map(|l| l.column), Some(18));
        let e = parse_script("select 1 select 2").unwrap_err();
        assert_eq!(e.statement, 1);
    }

    #[test]
    fn nesting_past_the_limits_is_too_complex_not_a_syntax_error() {
        let e = syntax(ParserError::RecursionLimitExceeded);
        assert_eq!(e.kind.code(), "54001");
        let not = format!("select {}true", "not ".repeat(60));
        assert!(parse_script(&not).is_ok());
        let long = format!(
            "select 1; select 1{}",
            " + 1".repeat(limits::MAX_NESTING_TOKENS)
        );
        let e = parse_script(&long).unwrap_err();
        assert_eq!((e.statement, e.error.kind.code()), (2, "54001"));
        let explain = format!("{}select 1", "explain ".repeat(limits::MAX_STATEMENT_DEPTH));
        let e = parse_script(&explain).unwrap_err();
        assert_eq!((e.statement, e.error.kind.code()), (1, "54001"));
        assert!(
            e.error.kind.to_string().contains("statements nest"),
            "{}",
            e.error.kind
        );
    }

    #[test]
    fn location_suffix_is_split_off() {
        let (m, at) = split_location("Expected: FROM, found: where at Line: 1, Column: 10");
        assert_eq!(m, "Expected: FROM, found: where");
        assert_eq!(at, Some(Location::new(1, 10)));
    }
}
