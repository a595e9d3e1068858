//! The offline checker behind `hawser scheme check` and `hawser scheme fmt`.
//!
//! [`check_source`] parses a file, validates every CREATE, checks every ALTER on its own
//! and — when the file created the scheme earlier — applies it, and removes schemes the
//! file drops; so a file that creates a scheme twice gets TT8154, and an ALTER that does
//! not fit a scheme created above it gets its error. An ALTER or DROP of a scheme the
//! file does not create is checked only on its own (the scheme may live in a cluster).
//!
//! The [`CheckReport`] renders like a compiler:
//!
//! ```text
//! scheme.sql:3:11: error[TT8101]: element name a is used twice
//!   ELEMENT a DATASTORE
//!           ^
//! scheme.sql: 1 statement, 1 error
//! ```
//!
//! and as JSON with the same content. Valid input renders as one summary line.

use std::collections::BTreeMap;

use hawser_core::QualName;
use serde::Serialize;
use serde_json::Value;

use crate::alter::apply;
use crate::ast::{Scheme, Statement};
use crate::error::{ErrorCode, SchemeError};
use crate::parser::parse_recovering;
use crate::print::print_statements;
use crate::span::LineIndex;
use crate::validate::{validate, validate_alter};

/// One problem, located.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    pub code: ErrorCode,
    pub message: String,
    /// 1-based line and column (in characters) of the start of the problem.
    pub line: usize,
    pub column: usize,
    /// Where the problem ends (exclusive), same units.
    pub end_line: usize,
    pub end_column: usize,
    /// The text of `line`.
    pub source_line: String,
}

/// What the checker found in one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckReport {
    /// The name diagnostics are prefixed with.
    pub file: String,
    pub statements: usize,
    /// Distinct schemes the file creates.
    pub schemes: usize,
    pub diagnostics: Vec<Diagnostic>,
}

impl CheckReport {
    pub fn is_ok(&self) -> bool {
        self.diagnostics.is_empty()
    }

    /// `FILE:LINE:COL: error[CODE]: message`, the source line and a caret line for each
    /// problem, then a summary line; only the summary line for valid input.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        for d in &self.diagnostics {
            out.push_str(&format!(
                "{}:{}:{}: error[{}]: {}\n",
                self.file, d.line, d.column, d.code, d.message
            ));
            out.push_str(&format!("  {}\n", d.source_line));
            // Keep tabs so the caret lines up under the same characters.
            let pad: String = d
                .source_line
                .chars()
                .take(d.column - 1)
                .map(|c| if c == '\t' { '\t' } else { ' ' })
                .collect();
            let line_len = d.source_line.chars().count();
            let width = if d.end_line == d.line {
                d.end_column.saturating_sub(d.column)
            } else {
                line_len.saturating_sub(d.column - 1)
            }
            .max(1);
            out.push_str(&format!("  {pad}{}\n", "^".repeat(width)));
        }
        out.push_str(&self.summary());
        out.push('\n');
        out
    }

    /// `FILE: 3 statements, 2 schemes, OK` or `FILE: 3 statements, 2 errors`.
    pub fn summary(&self) -> String {
        let plural = |n: usize, word: &str| {
            if n == 1 {
                format!("{n} {word}")
            } else {
                format!("{n} {word}s")
            }
        };
        if self.is_ok() {
            format!(
                "{}: {}, {}, OK",
                self.file,
                plural(self.statements, "statement"),
                plural(self.schemes, "scheme")
            )
        } else {
            format!(
                "{}: {}, {}",
                self.file,
                plural(self.statements, "statement"),
                plural(self.diagnostics.len(), "error")
            )
        }
    }

    /// The same content as [`render_text`](Self::render_text), as JSON.
    pub fn to_json(&self) -> Value {
        let diagnostics: Vec<Value> = self
            .diagnostics
            .iter()
            .map(|d| {
                serde_json::json!({
                    "file": self.file,
                    "line": d.line,
                    "column": d.column,
                    "end_line": d.end_line,
                    "end_column": d.end_column,
                    "severity": "error",
                    "code": d.code.as_str(),
                    "message": d.message,
                    "source_line": d.source_line,
                })
            })
            .collect();
        serde_json::json!({
            "file": self.file,
            "ok": self.is_ok(),
            "statements": self.statements,
            "schemes": self.schemes,
            "diagnostics": diagnostics,
            "summary": self.summary(),
        })
    }
}

/// Checks one file's text.
pub fn check_source(file_name: &str, source: &str) -> CheckReport {
    let (statements, mut errors) = parse_recovering(source);
    let mut schemes: BTreeMap<QualName, Scheme> = BTreeMap::new();
    let mut created = std::collections::BTreeSet::new();
    for statement in &statements {
        match statement {
            Statement::Create(scheme) => {
                if let Err(found) = validate(scheme) {
                    errors.extend(found);
                }
                if schemes.contains_key(&scheme.name) {
                    errors.push(SchemeError::new(
                        ErrorCode::SchemeExists,
                        scheme.name_span,
                        format!("scheme {} is already created above", scheme.name),
                    ));
                }
                created.insert(scheme.name.clone());
                schemes.insert(scheme.name.clone(), scheme.clone());
            }
            Statement::Alter(alter) => {
                if let Err(found) = validate_alter(alter) {
                    errors.extend(found);
                } else if let Some(scheme) = schemes.get(&alter.name) {
                    match apply(scheme, alter) {
                        Ok(next) => {
                            schemes.insert(alter.name.clone(), next);
                        }
                        Err(e) => errors.push(e),
                    }
                }
            }
            Statement::Drop(drop) => {
                schemes.remove(&drop.name);
            }
        }
    }
    errors.sort_by_key(|e| e.span.start);
    report(file_name, source, statements.len(), created.len(), errors)
}

fn report(
    file_name: &str,
    source: &str,
    statements: usize,
    schemes: usize,
    errors: Vec<SchemeError>,
) -> CheckReport {
    let index = LineIndex::new(source);
    let diagnostics = errors
        .into_iter()
        .map(|e| {
            let start = index.line_col(e.span.start);
            let end = index.line_col(e.span.end.max(e.span.start));
            Diagnostic {
                code: e.code,
                message: e.message,
                line: start.line,
                column: start.col,
                end_line: end.line,
                end_column: end.col,
                source_line: index.line_text(start.line).to_string(),
            }
        })
        .collect();
    CheckReport {
        file: file_name.to_string(),
        statements,
        schemes,
        diagnostics,
    }
}

/// The canonical form of `source` (what `hawser scheme fmt` prints), or the syntax
/// problems that prevent formatting it. Comments are not kept. The report's `file` is
/// `-`; set it before rendering.
pub fn format_source(source: &str) -> Result<String, CheckReport> {
    let (statements, errors) = parse_recovering(source);
    if errors.is_empty() {
        Ok(print_statements(&statements))
    } else {
        Err(report("-", source, statements.len(), 0, errors))
    }
}
