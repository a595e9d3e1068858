//! Recursive-descent parser for CREATE / ALTER / DROP REPLICATION.
//!
//! One file past the ~1,000-line rule: it is one recursive-descent parser over one
//! grammar, whose functions share one token cursor and call each other throughout
//! (ALTER REPLICATION reuses CREATE's element, subscriber, STORE, ROUTE and CHECK
//! CONFLICTS clauses).
//!
//! ```text
//! source ──tokenize──► tokens ──Parser──► Vec<Statement>
//! ```
//!
//! Keywords are contextual: a bare word is a keyword only where the grammar expects one,
//! so TimesTen's own examples with a database called `subscriber` or a scheme called
//! `propagator` parse. Where a list of names is optional (INCLUDE / EXCLUDE) or may be
//! followed by another clause, the clause-starting words end the list; the printer puts
//! such names in double quotes, so canonical text is never ambiguous.
//!
//! The grammar is TimesTen's (`docs/scheme.md` lists where hawser reads it differently)
//! plus hawser's `AS target [INTO table]` after a subscriber's return service.

use hawser_core::{Ident, QualName};

use crate::ast::*;
use crate::error::{ErrorCode, SchemeError};
use crate::lexer::{tokenize, Token, TokenKind};
use crate::span::Span;

type PResult<T> = Result<T, SchemeError>;

/// Parses every statement of `source`; stops at the first problem.
pub fn parse(source: &str) -> Result<Vec<Statement>, SchemeError> {
    let (statements, mut errors) = parse_recovering(source);
    if errors.is_empty() {
        Ok(statements)
    } else {
        Err(errors.swap_remove(0))
    }
}

/// Parses `source`, which must hold exactly one statement.
pub fn parse_statement(source: &str) -> Result<Statement, SchemeError> {
    let mut statements = parse(source)?;
    match statements.len() {
        1 => Ok(statements.remove(0)),
        n => Err(SchemeError::new(
            ErrorCode::Syntax,
            Span::new(0, source.len()),
            format!("expected exactly one statement, found {n}"),
        )),
    }
}

/// Parses every statement it can and reports every problem: after a syntax error the
/// parser skips to the next `;`. A statement that contains a lexical error is reported
/// only by its lexical error and left out of the result.
pub fn parse_recovering(source: &str) -> (Vec<Statement>, Vec<SchemeError>) {
    let (tokens, lex_errors) = tokenize(source);
    let mut parser = Parser {
        tokens: &tokens,
        pos: 0,
        end: source.len(),
    };
    let mut statements = Vec::new();
    let mut errors = Vec::new();
    let lex_error_in = |from: usize, to: usize| {
        lex_errors
            .iter()
            .any(|e| e.span.start >= from && e.span.start <= to)
    };
    loop {
        while parser.eat(&TokenKind::Semicolon).is_some() {}
        let Some(first) = parser.peek() else { break };
        let start = first.span.start;
        let result = parser.statement().and_then(|statement| {
            if parser.peek().is_some() {
                parser.expect(&TokenKind::Semicolon, "`;` or end of input")?;
            }
            Ok(statement)
        });
        let stop = parser.last_end();
        match result {
            Ok(statement) => {
                if !lex_error_in(start, stop) {
                    statements.push(statement);
                }
            }
            Err(error) => {
                parser.skip_past_semicolon();
                if !lex_error_in(start, parser.last_end()) {
                    errors.push(error);
                }
            }
        }
    }
    let mut all = lex_errors;
    all.extend(errors);
    all.sort_by_key(|e| e.span.start);
    (statements, all)
}

/// Words that end an optional list of names: they start the next clause.
const CLAUSE_WORDS: &[&str] = &[
    "ELEMENT", "STORE", "ROUTE", "INCLUDE", "EXCLUDE", "TABLE", "SEQUENCE", "ADD", "ALTER", "DROP",
];

struct Parser<'t> {
    tokens: &'t [Token],
    pos: usize,
    /// Length of the source, where "end of input" points.
    end: usize,
}

impl Parser<'_> {
    // ---- token plumbing ----

    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn peek_at(&self, n: usize) -> Option<&Token> {
        self.tokens.get(self.pos + n)
    }

    fn here(&self) -> Span {
        self.peek()
            .map(|t| t.span)
            .unwrap_or(Span::new(self.end, self.end))
    }

    fn last_end(&self) -> usize {
        self.pos
            .checked_sub(1)
            .and_then(|i| self.tokens.get(i))
            .map(|t| t.span.end)
            .unwrap_or(0)
    }

    /// Span from `start` to the end of the last consumed token.
    fn since(&self, start: Span) -> Span {
        Span::new(start.start, self.last_end().max(start.start))
    }

    fn bump(&mut self) -> Span {
        let span = self.here();
        self.pos += 1;
        span
    }

    fn is_kw_at(&self, n: usize, kw: &str) -> bool {
        matches!(self.peek_at(n), Some(Token { kind: TokenKind::Word(w), .. }) if w.eq_ignore_ascii_case(kw))
    }

    fn is_kw(&self, kw: &str) -> bool {
        self.is_kw_at(0, kw)
    }

    fn eat_kw(&mut self, kw: &str) -> Option<Span> {
        self.is_kw(kw).then(|| self.bump())
    }

    fn expect_kw(&mut self, kw: &str) -> PResult<Span> {
        self.eat_kw(kw)
            .ok_or_else(|| self.unexpected(&format!("`{kw}`")))
    }

    /// Expects the keywords `kws` in sequence.
    fn expect_kws(&mut self, kws: &[&str]) -> PResult<Span> {
        let start = self.here();
        for kw in kws {
            self.expect_kw(kw)?;
        }
        Ok(self.since(start))
    }

    fn is(&self, kind: &TokenKind) -> bool {
        self.peek().is_some_and(|t| &t.kind == kind)
    }

    fn eat(&mut self, kind: &TokenKind) -> Option<Span> {
        self.is(kind).then(|| self.bump())
    }

    fn expect(&mut self, kind: &TokenKind, what: &str) -> PResult<Span> {
        self.eat(kind).ok_or_else(|| self.unexpected(what))
    }

    fn unexpected(&self, expected: &str) -> SchemeError {
        let found = match self.peek() {
            Some(t) => t.kind.describe(),
            None => "end of input".to_string(),
        };
        SchemeError::new(
            ErrorCode::Syntax,
            self.here(),
            format!("expected {expected}, found {found}"),
        )
    }

    fn skip_past_semicolon(&mut self) {
        while let Some(t) = self.peek() {
            let done = t.kind == TokenKind::Semicolon;
            self.pos += 1;
            if done {
                break;
            }
        }
    }

    // ---- names ----

    /// A name that may start here without being mistaken for the next clause.
    fn at_optional_name(&self) -> bool {
        match self.peek() {
            Some(Token {
                kind: TokenKind::Word(w),
                ..
            }) => !CLAUSE_WORDS.iter().any(|k| w.eq_ignore_ascii_case(k)),
            Some(Token {
                kind: TokenKind::Quoted(_),
                ..
            }) => true,
            _ => false,
        }
    }

    fn ident(&mut self, what: &str) -> PResult<(Ident, Span)> {
        match self.peek() {
            Some(Token {
                kind: TokenKind::Word(w),
                span,
            }) => {
                let out = (Ident::unquoted(w), *span);
                self.pos += 1;
                Ok(out)
            }
            Some(Token {
                kind: TokenKind::Quoted(q),
                span,
            }) => {
                let out = (Ident::quoted(q), *span);
                self.pos += 1;
                Ok(out)
            }
            _ => Err(self.unexpected(what)),
        }
    }

    fn qual_name(&mut self, what: &str) -> PResult<(QualName, Span)> {
        let (first, span) = self.ident(what)?;
        if self.eat(&TokenKind::Dot).is_some() {
            let (name, end) = self.ident(what)?;
            Ok((QualName::new(Some(first), name), span.to(end)))
        } else {
            Ok((QualName::new(None, first), span))
        }
    }

    /// `SELF | name [ON host]`.
    fn store_ref(&mut self) -> PResult<StoreRef> {
        let start = self.here();
        let name = if self.is_kw("SELF") {
            self.bump();
            StoreName::Local
        } else {
            StoreName::Named(self.ident("a database name")?.0)
        };
        let host = if self.eat_kw("ON").is_some() {
            Some(self.host()?)
        } else {
            None
        };
        Ok(StoreRef {
            name,
            host,
            span: self.since(start),
        })
    }

    /// `"host"`, or a bare host name / IP address written without spaces.
    fn host(&mut self) -> PResult<String> {
        if let Some(Token {
            kind: TokenKind::Quoted(q),
            ..
        }) = self.peek()
        {
            let host = q.to_lowercase();
            self.pos += 1;
            return Ok(host);
        }
        let mut text = String::new();
        let mut last_end = None;
        while let Some(t) = self.peek() {
            if last_end.is_some_and(|end| end != t.span.start) {
                break;
            }
            match &t.kind {
                TokenKind::Word(w) => text.push_str(w),
                TokenKind::Int(n) => text.push_str(&n.to_string()),
                TokenKind::Dot if last_end.is_some() => text.push('.'),
                _ => break,
            }
            last_end = Some(t.span.end);
            self.pos += 1;
        }
        if text.is_empty() {
            return Err(self.unexpected("a host name"));
        }
        Ok(text.to_lowercase())
    }

    fn uint(&mut self, what: &str) -> PResult<(u64, Span)> {
        match self.peek() {
            Some(Token {
                kind: TokenKind::Int(n),
                span,
            }) => {
                let out = (*n, *span);
                self.pos += 1;
                Ok(out)
            }
            _ => Err(self.unexpected(what)),
        }
    }

    fn u32_in(&mut self, what: &str, max: u64) -> PResult<u32> {
        let (n, span) = self.uint(what)?;
        if n > max {
            return Err(SchemeError::new(
                ErrorCode::OutOfRange,
                span,
                format!("{what} must be at most {max}, found {n}"),
            ));
        }
        u32::try_from(n)
            .map_err(|_| SchemeError::new(ErrorCode::OutOfRange, span, format!("{what} too large")))
    }

    fn on_off(&mut self) -> PResult<bool> {
        if self.eat_kw("ON").is_some() {
            Ok(true)
        } else if self.eat_kw("OFF").is_some() {
            Ok(false)
        } else {
            Err(self.unexpected("`ON` or `OFF`"))
        }
    }

    // ---- statements ----

    fn statement(&mut self) -> PResult<Statement> {
        if self.is_kw("CREATE") {
            self.create().map(Statement::Create)
        } else if self.is_kw("ALTER") {
            self.alter().map(Statement::Alter)
        } else if self.is_kw("DROP") {
            let start = self.bump();
            self.expect_kw("REPLICATION")?;
            let (name, _) = self.qual_name("a replication scheme name")?;
            Ok(Statement::Drop(DropReplication {
                name,
                span: self.since(start),
            }))
        } else {
            Err(self.unexpected("CREATE, ALTER or DROP REPLICATION"))
        }
    }

    fn create(&mut self) -> PResult<Scheme> {
        let start = self.expect_kw("CREATE")?;
        self.expect_kw("REPLICATION")?;
        let (name, name_span) = self.qual_name("a replication scheme name")?;
        let mut elements = Vec::new();
        let mut stores = Vec::new();
        let mut routes = Vec::new();
        // TimesTen writes elements, then STORE, then ROUTE clauses; hawser accepts them
        // in any order and prints them in that order.
        loop {
            if self.is_kw("ELEMENT") {
                elements.push(self.element()?);
            } else if self.is_kw("STORE") {
                stores.push(self.store_clause()?);
            } else if self.is_kw("ROUTE") {
                routes.push(self.route()?);
            } else {
                break;
            }
        }
        if elements.is_empty() {
            return Err(self.unexpected("ELEMENT"));
        }
        Ok(Scheme {
            name,
            name_span,
            elements,
            stores,
            routes,
            span: self.since(start),
        })
    }

    fn element(&mut self) -> PResult<Element> {
        let start = self.expect_kw("ELEMENT")?;
        let (name, name_span) = self.ident("an element name")?;
        let kind = if self.eat_kw("DATASTORE").is_some() {
            ElementKind::Datastore
        } else if self.eat_kw("TABLE").is_some() {
            let (table, table_span) = self.qual_name("a table name")?;
            let check = if self.is_kw("CHECK") || (self.is_kw("NO") && self.is_kw_at(1, "CHECK")) {
                Some(self.check_conflicts()?)
            } else {
                None
            };
            ElementKind::Table {
                table,
                table_span,
                check,
            }
        } else if self.eat_kw("SEQUENCE").is_some() {
            let (sequence, sequence_span) = self.qual_name("a sequence name")?;
            ElementKind::Sequence {
                sequence,
                sequence_span,
            }
        } else {
            return Err(self.unexpected("DATASTORE, TABLE or SEQUENCE"));
        };
        let owner_role = if self.eat_kw("MASTER").is_some() {
            OwnerRole::Master
        } else if self.eat_kw("PROPAGATOR").is_some() {
            OwnerRole::Propagator
        } else {
            return Err(self.unexpected("MASTER or PROPAGATOR"));
        };
        let owner = self.store_ref()?;
        let transmit_start = self.here();
        let transmit = if self.eat_kw("TRANSMIT").is_some() {
            if self.eat_kw("DURABLE").is_some() {
                Some(Transmit::Durable)
            } else if self.eat_kw("NONDURABLE").is_some() {
                Some(Transmit::Nondurable)
            } else {
                return Err(self.unexpected("DURABLE or NONDURABLE"));
            }
        } else {
            None
        };
        let transmit_span = self.since(transmit_start);
        let mut subscribers = vec![self.subscriber_clause()?];
        loop {
            if self.is_kw("SUBSCRIBER") {
                subscribers.push(self.subscriber_clause()?);
            } else if self.is(&TokenKind::Comma) && self.subscriber_clause_follows_comma() {
                self.bump();
                subscribers.push(self.subscriber_clause()?);
            } else {
                break;
            }
        }
        let mut inclusions = Vec::new();
        while self.is_kw("INCLUDE") || self.is_kw("EXCLUDE") {
            inclusions.push(self.inclusion()?);
        }
        Ok(Element {
            name,
            name_span,
            kind,
            owner_role,
            owner,
            transmit,
            transmit_span,
            subscribers,
            inclusions,
            span: self.since(start),
        })
    }

    /// At `, SUBSCRIBER x`: is `SUBSCRIBER` a new clause (CREATE allows commas between
    /// clauses) or a database called `subscriber`? A clause iff a database name follows.
    fn subscriber_clause_follows_comma(&self) -> bool {
        if !self.is_kw_at(1, "SUBSCRIBER") {
            return false;
        }
        match self.peek_at(2).map(|t| &t.kind) {
            Some(TokenKind::Quoted(_)) => true,
            Some(TokenKind::Word(w)) => ![
                "ON",
                "RETURN",
                "NO",
                "AS",
                "ELEMENT",
                "STORE",
                "ROUTE",
                "INCLUDE",
                "EXCLUDE",
                "SUBSCRIBER",
            ]
            .iter()
            .any(|k| w.eq_ignore_ascii_case(k)),
            _ => false,
        }
    }

    /// `SUBSCRIBER store [, store]... [return service] [AS target]`.
    fn subscriber_clause(&mut self) -> PResult<SubscriberClause> {
        let start = self.expect_kw("SUBSCRIBER")?;
        let mut stores = vec![self.store_ref()?];
        while self.is(&TokenKind::Comma) && !self.subscriber_clause_follows_comma() {
            self.bump();
            stores.push(self.store_ref()?);
        }
        let (return_service, return_span) = self.opt_return_service()?;
        let target = if self.is_kw("AS") {
            Some(self.target()?)
        } else {
            None
        };
        Ok(SubscriberClause {
            stores,
            return_service,
            return_span,
            target,
            span: self.since(start),
        })
    }

    fn opt_return_service(&mut self) -> PResult<(Option<ReturnService>, Span)> {
        let start = self.here();
        if self.is_kw("RETURN") || (self.is_kw("NO") && self.is_kw_at(1, "RETURN")) {
            let rs = self.return_service()?;
            Ok((Some(rs), self.since(start)))
        } else {
            Ok((None, Span::new(start.start, start.start)))
        }
    }

    fn return_service(&mut self) -> PResult<ReturnService> {
        if self.eat_kw("NO").is_some() {
            self.expect_kw("RETURN")?;
            return Ok(ReturnService::NoReturn);
        }
        self.expect_kw("RETURN")?;
        let twosafe = if self.eat_kw("RECEIPT").is_some() {
            false
        } else if self.eat_kw("TWOSAFE").is_some() {
            true
        } else {
            return Err(self.unexpected("RECEIPT or TWOSAFE"));
        };
        let by_request = if self.eat_kw("BY").is_some() {
            self.expect_kw("REQUEST")?;
            true
        } else {
            false
        };
        Ok(if twosafe {
            ReturnService::Twosafe { by_request }
        } else {
            ReturnService::Receipt { by_request }
        })
    }

    /// `AS target [INTO [owner.]table]` (hawser extension).
    fn target(&mut self) -> PResult<TargetSpec> {
        let start = self.expect_kw("AS")?;
        let kind = if self.eat_kw("USER").is_some() {
            self.expect_kw("COPY")?;
            TargetKind::UserCopy
        } else if self.eat_kw("POINT").is_some() {
            self.expect_kws(&["IN", "TIME"])?;
            TargetKind::PointInTime
        } else if self.eat_kw("REPLICA").is_some() {
            TargetKind::Replica
        } else if self.eat_kw("CCD").is_some() {
            let condensed = if self.eat_kw("CONDENSED").is_some() {
                Some(true)
            } else if self.eat_kw("NONCONDENSED").is_some() {
                Some(false)
            } else {
                None
            };
            let complete = if self.eat_kw("COMPLETE").is_some() {
                Some(true)
            } else if self.eat_kw("NONCOMPLETE").is_some() {
                Some(false)
            } else {
                None
            };
            TargetKind::Ccd {
                condensed,
                complete,
            }
        } else if self.eat_kw("BASE").is_some() {
            self.expect_kw("AGGREGATE")?;
            let (aggregates, group_by) = self.aggregate_body()?;
            TargetKind::BaseAggregate {
                aggregates,
                group_by,
            }
        } else if self.eat_kw("CHANGE").is_some() {
            self.expect_kw("AGGREGATE")?;
            let (aggregates, group_by) = self.aggregate_body()?;
            TargetKind::ChangeAggregate {
                aggregates,
                group_by,
            }
        } else {
            return Err(self.unexpected(
                "USER COPY, POINT IN TIME, REPLICA, CCD, BASE AGGREGATE or CHANGE AGGREGATE",
            ));
        };
        let into = if self.eat_kw("INTO").is_some() {
            Some(self.qual_name("a target table name")?.0)
        } else {
            None
        };
        Ok(TargetSpec {
            kind,
            into,
            span: self.since(start),
        })
    }

    fn aggregate_body(&mut self) -> PResult<(Vec<Aggregate>, Vec<Ident>)> {
        self.expect(&TokenKind::LParen, "`(`")?;
        let mut aggregates = vec![self.aggregate()?];
        while self.eat(&TokenKind::Comma).is_some() {
            aggregates.push(self.aggregate()?);
        }
        self.expect(&TokenKind::RParen, "`,` or `)`")?;
        let mut group_by = Vec::new();
        if self.eat_kw("GROUP").is_some() {
            self.expect_kw("BY")?;
            group_by.push(self.ident("a column name")?.0);
            while self.eat(&TokenKind::Comma).is_some() {
                group_by.push(self.ident("a column name")?.0);
            }
        }
        Ok((aggregates, group_by))
    }

    fn aggregate(&mut self) -> PResult<Aggregate> {
        let func = if self.eat_kw("COUNT").is_some() {
            self.expect(&TokenKind::LParen, "`(`")?;
            self.expect(&TokenKind::Star, "`*`")?;
            self.expect(&TokenKind::RParen, "`)`")?;
            AggFunc::CountStar
        } else {
            let make: fn(Ident) -> AggFunc = if self.eat_kw("SUM").is_some() {
                AggFunc::Sum
            } else if self.eat_kw("MIN").is_some() {
                AggFunc::Min
            } else if self.eat_kw("MAX").is_some() {
                AggFunc::Max
            } else if self.eat_kw("AVG").is_some() {
                AggFunc::Avg
            } else {
                return Err(self.unexpected("COUNT, SUM, MIN, MAX or AVG"));
            };
            self.expect(&TokenKind::LParen, "`(`")?;
            let (column, _) = self.ident("a column name")?;
            self.expect(&TokenKind::RParen, "`)`")?;
            make(column)
        };
        let alias = if self.eat_kw("AS").is_some() {
            Some(self.ident("an alias")?.0)
        } else {
            None
        };
        Ok(Aggregate { func, alias })
    }

    fn check_conflicts(&mut self) -> PResult<CheckConflicts> {
        if self.eat_kw("NO").is_some() {
            self.expect_kw("CHECK")?;
            return Ok(CheckConflicts::NoCheck);
        }
        self.expect_kws(&["CHECK", "CONFLICTS", "BY", "ROW", "TIMESTAMP", "COLUMN"])?;
        let (column, _) = self.ident("a column name")?;
        let mut update_by = None;
        let mut on_exception = None;
        let mut report = None;
        loop {
            let here = self.here();
            let twice = || {
                SchemeError::new(
                    ErrorCode::Syntax,
                    here,
                    "option given twice in CHECK CONFLICTS",
                )
            };
            if self.is_kw("UPDATE") {
                if update_by.is_some() {
                    return Err(twice());
                }
                self.expect_kws(&["UPDATE", "BY"])?;
                update_by = Some(if self.eat_kw("SYSTEM").is_some() {
                    UpdateBy::System
                } else if self.eat_kw("USER").is_some() {
                    UpdateBy::User
                } else {
                    return Err(self.unexpected("SYSTEM or USER"));
                });
            } else if self.is_kw("ON") && self.is_kw_at(1, "EXCEPTION") {
                if on_exception.is_some() {
                    return Err(twice());
                }
                self.expect_kws(&["ON", "EXCEPTION"])?;
                on_exception = Some(if self.eat_kw("ROLLBACK").is_some() {
                    self.eat_kw("WORK");
                    OnException::Rollback
                } else if self.eat_kw("NO").is_some() {
                    self.expect_kw("ACTION")?;
                    OnException::NoAction
                } else {
                    return Err(self.unexpected("ROLLBACK or NO ACTION"));
                });
            } else if self.is_kw("REPORT") || (self.is_kw("NO") && self.is_kw_at(1, "REPORT")) {
                if report.is_some() {
                    return Err(twice());
                }
                if self.eat_kw("NO").is_some() {
                    self.expect_kw("REPORT")?;
                    report = Some(Report::NoReport);
                } else {
                    self.expect_kws(&["REPORT", "TO"])?;
                    let file = match self.peek() {
                        Some(Token {
                            kind: TokenKind::Str(s),
                            ..
                        }) => s.clone(),
                        _ => return Err(self.unexpected("a 'file name'")),
                    };
                    self.bump();
                    let format = if self.eat_kw("FORMAT").is_some() {
                        if self.eat_kw("XML").is_some() {
                            Some(ReportFormat::Xml)
                        } else if self.eat_kw("STANDARD").is_some() {
                            Some(ReportFormat::Standard)
                        } else {
                            return Err(self.unexpected("XML or STANDARD"));
                        }
                    } else {
                        None
                    };
                    report = Some(Report::To { file, format });
                }
            } else {
                break;
            }
        }
        Ok(CheckConflicts::ByRowTimestamp {
            column,
            update_by,
            on_exception,
            report,
        })
    }

    /// `INCLUDE | EXCLUDE group [, group]...`.
    fn inclusion(&mut self) -> PResult<Inclusion> {
        let start = self.here();
        let action = if self.eat_kw("INCLUDE").is_some() {
            InclusionAction::Include
        } else {
            self.expect_kw("EXCLUDE")?;
            InclusionAction::Exclude
        };
        let mut groups = vec![self.object_group()?];
        while self.is(&TokenKind::Comma)
            && (self.is_kw_at(1, "TABLE") || self.is_kw_at(1, "SEQUENCE"))
        {
            self.bump();
            groups.push(self.object_group()?);
        }
        Ok(Inclusion {
            action,
            groups,
            span: self.since(start),
        })
    }

    fn object_group(&mut self) -> PResult<ObjectGroup> {
        let start = self.here();
        let object_type = if self.eat_kw("TABLE").is_some() {
            ObjectType::Table
        } else if self.eat_kw("SEQUENCE").is_some() {
            ObjectType::Sequence
        } else {
            return Err(self.unexpected("TABLE or SEQUENCE"));
        };
        let mut names = Vec::new();
        if self.at_optional_name() {
            loop {
                let (name, span) = self.qual_name("an object name")?;
                names.push(NamedObject { name, span });
                if self.is(&TokenKind::Comma)
                    && !(self.is_kw_at(1, "TABLE") || self.is_kw_at(1, "SEQUENCE"))
                {
                    self.bump();
                } else {
                    break;
                }
            }
        }
        Ok(ObjectGroup {
            object_type,
            names,
            span: self.since(start),
        })
    }

    /// `STORE store attribute...`.
    fn store_clause(&mut self) -> PResult<StoreClause> {
        let start = self.expect_kw("STORE")?;
        let store = self.store_ref()?;
        let attributes = self.store_attributes()?;
        Ok(StoreClause {
            store,
            attributes,
            span: self.since(start),
        })
    }

    fn at_store_attribute(&self, n: usize) -> bool {
        [
            "DISABLE",
            "DURABLE",
            "RESUME",
            "LOCAL",
            "COMPRESS",
            "FAILOVER",
            "PORT",
            "TIMEOUT",
            "FAILTHRESHOLD",
            "CONFLICT",
        ]
        .iter()
        .any(|k| self.is_kw_at(n, k))
            || (self.is_kw_at(n, "RETURN")
                && (self.is_kw_at(n + 1, "SERVICES") || self.is_kw_at(n + 1, "WAIT")))
            || (self.is_kw_at(n, "TABLE") && self.is_kw_at(n + 1, "DEFINITION"))
    }

    /// Attributes separated by whitespace (22.1) or commas (6.0).
    fn store_attributes(&mut self) -> PResult<Vec<StoreAttribute>> {
        let mut attributes = Vec::new();
        loop {
            if self.is(&TokenKind::Comma) && !attributes.is_empty() && self.at_store_attribute(1) {
                self.bump();
            }
            if !self.at_store_attribute(0) {
                break;
            }
            let start = self.here();
            let attr = self.store_attribute()?;
            attributes.push(StoreAttribute {
                attr,
                span: self.since(start),
            });
        }
        Ok(attributes)
    }

    fn store_attribute(&mut self) -> PResult<StoreAttr> {
        const MAX: u64 = u32::MAX as u64;
        if self.eat_kw("DISABLE").is_some() {
            self.expect_kw("RETURN")?;
            let scope = if self.eat_kw("SUBSCRIBER").is_some() {
                DisableScope::Subscriber
            } else if self.eat_kw("ALL").is_some() {
                DisableScope::All
            } else {
                return Err(self.unexpected("SUBSCRIBER or ALL"));
            };
            let failures = self.u32_in("DISABLE RETURN failure count", MAX)?;
            return Ok(StoreAttr::DisableReturn { scope, failures });
        }
        if self.is_kw("RETURN") && self.is_kw_at(1, "SERVICES") {
            self.expect_kws(&["RETURN", "SERVICES"])?;
            let on = self.on_off()?;
            self.expect_kw("WHEN")?;
            self.eat_kw("REPLICATION");
            self.expect_kw("STOPPED")?;
            return Ok(StoreAttr::ReturnServicesWhenStopped(on));
        }
        if self.is_kw("RETURN") {
            self.expect_kws(&["RETURN", "WAIT", "TIME"])?;
            return Ok(StoreAttr::ReturnWaitTime(
                self.u32_in("RETURN WAIT TIME", MAX)?,
            ));
        }
        if self.eat_kw("DURABLE").is_some() {
            self.expect_kw("COMMIT")?;
            return Ok(StoreAttr::DurableCommit(self.on_off()?));
        }
        if self.eat_kw("RESUME").is_some() {
            self.expect_kw("RETURN")?;
            return Ok(StoreAttr::ResumeReturn(self.u32_in("RESUME RETURN", MAX)?));
        }
        if self.eat_kw("LOCAL").is_some() {
            self.expect_kws(&["COMMIT", "ACTION"])?;
            let action = if self.eat_kw("COMMIT").is_some() {
                LocalAction::Commit
            } else if self.eat_kw("NO").is_some() {
                self.expect_kw("ACTION")?;
                LocalAction::NoAction
            } else {
                return Err(self.unexpected("NO ACTION or COMMIT"));
            };
            return Ok(StoreAttr::LocalCommitAction(action));
        }
        if self.eat_kw("COMPRESS").is_some() {
            self.expect_kw("TRAFFIC")?;
            return Ok(StoreAttr::CompressTraffic(self.on_off()?));
        }
        if self.eat_kw("FAILOVER").is_some() {
            return Ok(StoreAttr::Failover(self.on_off()?));
        }
        if self.eat_kw("PORT").is_some() {
            let port = self.u32_in("PORT", u16::MAX as u64)?;
            // u32_in bounded it by u16::MAX.
            return Ok(StoreAttr::Port(port as u16));
        }
        if self.eat_kw("TIMEOUT").is_some() {
            return Ok(StoreAttr::Timeout(self.u32_in("TIMEOUT", MAX)?));
        }
        if self.eat_kw("FAILTHRESHOLD").is_some() {
            return Ok(StoreAttr::FailThreshold(self.u32_in("FAILTHRESHOLD", MAX)?));
        }
        if self.eat_kw("CONFLICT").is_some() {
            self.expect_kw("REPORTING")?;
            if self.eat_kw("SUSPEND").is_some() {
                self.expect_kw("AT")?;
                let n = self.u32_in("CONFLICT REPORTING SUSPEND AT", MAX)?;
                return Ok(StoreAttr::ConflictReportingSuspendAt(n));
            }
            self.expect_kws(&["RESUME", "AT"])?;
            let n = self.u32_in("CONFLICT REPORTING RESUME AT", MAX)?;
            return Ok(StoreAttr::ConflictReportingResumeAt(n));
        }
        self.expect_kws(&["TABLE", "DEFINITION", "CHECKING"])?;
        let mode = if self.eat_kw("EXACT").is_some() {
            TableDefinitionChecking::Exact
        } else if self.eat_kw("RELAXED").is_some() {
            TableDefinitionChecking::Relaxed
        } else {
            return Err(self.unexpected("EXACT or RELAXED"));
        };
        Ok(StoreAttr::TableDefinitionChecking(mode))
    }

    /// `ROUTE MASTER store SUBSCRIBER store (MASTERIP | SUBSCRIBERIP) host PRIORITY n ...`.
    fn route(&mut self) -> PResult<Route> {
        let start = self.expect_kw("ROUTE")?;
        let (master, subscriber) = self.route_pair()?;
        let mut addresses = Vec::new();
        loop {
            let addr_start = self.here();
            let Some(side) = self.opt_route_side() else {
                break;
            };
            let host = self.host()?;
            self.expect_kw("PRIORITY")?;
            let (priority, span) = self.uint("a priority")?;
            if !(1..=99).contains(&priority) {
                return Err(SchemeError::new(
                    ErrorCode::OutOfRange,
                    span,
                    format!("PRIORITY must be between 1 and 99, found {priority}"),
                ));
            }
            addresses.push(RouteAddress {
                side,
                host,
                priority: priority as u8,
                span: self.since(addr_start),
            });
        }
        if addresses.is_empty() {
            return Err(self.unexpected("MASTERIP or SUBSCRIBERIP"));
        }
        Ok(Route {
            master,
            subscriber,
            addresses,
            span: self.since(start),
        })
    }

    fn route_pair(&mut self) -> PResult<(StoreRef, StoreRef)> {
        self.expect_kw("MASTER")?;
        let master = self.store_ref()?;
        self.expect_kw("SUBSCRIBER")?;
        let subscriber = self.store_ref()?;
        Ok((master, subscriber))
    }

    fn opt_route_side(&mut self) -> Option<RouteSide> {
        if self.eat_kw("MASTERIP").is_some() {
            Some(RouteSide::MasterIp)
        } else if self.eat_kw("SUBSCRIBERIP").is_some() {
            Some(RouteSide::SubscriberIp)
        } else {
            None
        }
    }

    // ---- ALTER ----

    fn alter(&mut self) -> PResult<AlterReplication> {
        let start = self.expect_kw("ALTER")?;
        self.expect_kw("REPLICATION")?;
        let (name, name_span) = self.qual_name("a replication scheme name")?;
        let mut ops = vec![self.alter_op()?];
        while self.is_kw("ADD") || self.is_kw("ALTER") || self.is_kw("DROP") {
            ops.push(self.alter_op()?);
        }
        Ok(AlterReplication {
            name,
            name_span,
            ops,
            span: self.since(start),
        })
    }

    fn alter_op(&mut self) -> PResult<AlterOp> {
        let start = self.here();
        if self.eat_kw("ADD").is_some() {
            if self.is_kw("ELEMENT") {
                return Ok(AlterOp::AddElement(self.element()?));
            }
            if self.is_kw("STORE") {
                let mut clause = self.store_clause()?;
                clause.span = self.since(start);
                return Ok(AlterOp::AddStore(clause));
            }
            if self.is_kw("ROUTE") {
                let mut route = self.route()?;
                route.span = self.since(start);
                return Ok(AlterOp::AddRoute(route));
            }
            return Err(self.unexpected("ELEMENT, STORE or ROUTE"));
        }
        if self.eat_kw("ALTER").is_some() {
            if self.eat_kw("STORE").is_some() {
                let store = self.store_ref()?;
                self.expect_kw("SET")?;
                let attributes = self.store_attributes()?;
                if attributes.is_empty() {
                    return Err(self.unexpected("a store attribute"));
                }
                return Ok(AlterOp::AlterStore(StoreClause {
                    store,
                    attributes,
                    span: self.since(start),
                }));
            }
            self.expect_kw("ELEMENT")?;
            let target = self.element_target()?;
            let action = self.element_action(&target)?;
            return Ok(AlterOp::AlterElement {
                target,
                action,
                span: self.since(start),
            });
        }
        self.expect_kw("DROP")?;
        if self.eat_kw("ELEMENT").is_some() {
            let target = self.element_target()?;
            return Ok(AlterOp::DropElement {
                target,
                span: self.since(start),
            });
        }
        if self.eat_kw("ROUTE").is_some() {
            let (master, subscriber) = self.route_pair()?;
            let mut addresses = Vec::new();
            while let Some(side) = self.opt_route_side() {
                addresses.push((side, self.host()?));
            }
            if addresses.is_empty() {
                return Err(self.unexpected("MASTERIP or SUBSCRIBERIP"));
            }
            return Ok(AlterOp::DropRoute(DropRoute {
                master,
                subscriber,
                addresses,
                span: self.since(start),
            }));
        }
        Err(self.unexpected("ELEMENT or ROUTE"))
    }

    fn element_target(&mut self) -> PResult<ElementTarget> {
        if self.eat(&TokenKind::Star).is_some() {
            self.expect_kw("IN")?;
            return Ok(ElementTarget::AllIn(self.store_ref()?));
        }
        let (name, span) = self.ident("an element name or `*`")?;
        Ok(ElementTarget::Named { name, span })
    }

    fn store_list(&mut self) -> PResult<Vec<StoreRef>> {
        let mut stores = vec![self.store_ref()?];
        while self.eat(&TokenKind::Comma).is_some() {
            stores.push(self.store_ref()?);
        }
        Ok(stores)
    }

    fn element_action(&mut self, target: &ElementTarget) -> PResult<ElementAction> {
        let start = self.here();
        if self.eat_kw("ADD").is_some() {
            self.expect_kw("SUBSCRIBER")?;
            let stores = self.store_list()?;
            let (return_service, return_span) = self.opt_return_service()?;
            let target = if self.is_kw("AS") {
                Some(self.target()?)
            } else {
                None
            };
            return Ok(ElementAction::AddSubscriber(SubscriberClause {
                stores,
                return_service,
                return_span,
                target,
                span: self.since(start),
            }));
        }
        if self.eat_kw("ALTER").is_some() {
            self.expect_kw("SUBSCRIBER")?;
            let stores = self.store_list()?;
            self.expect_kw("SET")?;
            let return_service = self.return_service()?;
            return Ok(ElementAction::AlterSubscriber {
                stores,
                return_service,
            });
        }
        if self.is_kw("DROP") && self.is_kw_at(1, "SUBSCRIBER") {
            self.expect_kws(&["DROP", "SUBSCRIBER"])?;
            return Ok(ElementAction::DropSubscriber(self.store_list()?));
        }
        if self.is_kw("INCLUDE") || self.is_kw("EXCLUDE") {
            return Ok(ElementAction::Inclusion(self.inclusion()?));
        }
        self.expect_kw("SET")?;
        let all_in = matches!(target, ElementTarget::AllIn(_));
        if all_in && self.eat_kw("MASTER").is_some() {
            return Ok(ElementAction::SetMaster(self.store_ref()?));
        }
        if all_in && self.eat_kw("PROPAGATOR").is_some() {
            return Ok(ElementAction::SetPropagator(self.store_ref()?));
        }
        if !all_in && self.eat_kw("NAME").is_some() {
            let (name, span) = self.ident("a new element name")?;
            return Ok(ElementAction::SetName { name, span });
        }
        if !all_in && (self.is_kw("CHECK") || (self.is_kw("NO") && self.is_kw_at(1, "CHECK"))) {
            return Ok(ElementAction::SetCheckConflicts(self.check_conflicts()?));
        }
        if self.is_kw("RETURN") || (self.is_kw("NO") && self.is_kw_at(1, "RETURN")) {
            return Ok(ElementAction::SetReturnService(self.return_service()?));
        }
        Err(self.unexpected(if all_in {
            "MASTER, PROPAGATOR or a return service"
        } else {
            "NAME, CHECK CONFLICTS, NO CHECK or a return service"
        }))
    }
}
