//! SQL names.
//!
//! hawser folds unquoted identifiers to lower case, as PostgreSQL and CockroachDB do;
//! a double-quoted identifier keeps its case. Names compare by their folded form, so
//! `TAB`, `tab` and `"tab"` are one table and `"Tab"` is another. Qualified names are
//! `[owner.]name`; hawser has no users, so an unqualified name has no implicit owner
//! and `repl.tab` and `tab` are different objects (`docs/naming.md`).

use std::fmt;

use serde::{Deserialize, Serialize};

/// One identifier, already folded.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Ident(String);

impl Ident {
    /// An identifier written without quotes: folded to lower case.
    pub fn unquoted(s: &str) -> Self {
        Ident(s.to_lowercase())
    }

    /// An identifier written in double quotes: kept as written.
    pub fn quoted(s: &str) -> Self {
        Ident(s.to_string())
    }

    /// The folded text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether printing this identifier needs double quotes to read back the same.
    pub fn needs_quotes(&self) -> bool {
        let mut chars = self.0.chars();
        match chars.next() {
            Some(c) if c.is_ascii_lowercase() || c == '_' => {}
            _ => return true,
        }
        !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '$' | '#'))
    }
}

impl fmt::Display for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.needs_quotes() {
            write!(f, "\"{}\"", self.0.replace('"', "\"\""))
        } else {
            f.write_str(&self.0)
        }
    }
}

/// `[owner.]name` of a table, sequence or replication scheme.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct QualName {
    pub owner: Option<Ident>,
    pub name: Ident,
}

impl QualName {
    pub fn new(owner: Option<Ident>, name: Ident) -> Self {
        Self { owner, name }
    }

    /// An unqualified name from unquoted text (`"t"` → `t`).
    pub fn bare(name: &str) -> Self {
        Self {
            owner: None,
            name: Ident::unquoted(name),
        }
    }

    /// Parses `name` or `owner.name` written without quotes (a convenience for tests
    /// and command-line flags; SQL text goes through the real parsers).
    pub fn parse_unquoted(s: &str) -> Self {
        match s.split_once('.') {
            Some((owner, name)) => Self::new(Some(Ident::unquoted(owner)), Ident::unquoted(name)),
            None => Self::bare(s),
        }
    }
}

impl fmt::Display for QualName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.owner {
            Some(owner) => write!(f, "{owner}.{}", self.name),
            None => write!(f, "{}", self.name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unquoted_names_fold_and_print_bare() {
        assert_eq!(Ident::unquoted("TAB"), Ident::quoted("tab"));
        assert_eq!(Ident::unquoted("TAB").to_string(), "tab");
        assert_eq!(Ident::quoted("Tab").to_string(), "\"Tab\"");
        assert_eq!(QualName::parse_unquoted("Repl.Tab").to_string(), "repl.tab");
    }
}
