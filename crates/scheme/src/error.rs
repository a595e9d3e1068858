//! The one error type of the crate and its codes.
//!
//! A [`SchemeError`] is a diagnostic: a stable [`ErrorCode`], a message for people and
//! the [`Span`] it is about. Codes are TimesTen's error numbers (`TT8101`) wherever the
//! TimesTen documentation gives one for the condition, so that people who know TimesTen
//! recognise them, and hawser's own numbers (`HW…`) otherwise. `docs/scheme.md` lists
//! every code; the `codes_are_documented` test keeps that list honest.
//!
//! Numbering of hawser codes: `HW0xxx` text (lexer, parser), `HW1xxx` a scheme that
//! parses but breaks a rule, `HW2xxx` an ALTER that does not fit the scheme it is
//! applied to, `HW3xxx` routing against catalogs.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::span::Span;

macro_rules! codes {
    ($($variant:ident = $text:literal : $doc:literal,)*) => {
        /// A stable diagnostic code.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum ErrorCode {
            $(#[doc = $doc] $variant,)*
        }

        impl ErrorCode {
            /// Every code, in documentation order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The code as printed: `TT8101`, `HW0002`.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $text,)*
                }
            }

            /// One line saying what the code means.
            pub fn summary(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $doc,)*
                }
            }
        }
    };
}

codes! {
    Lex = "HW0001": "the text cannot be split into tokens (stray character, unterminated string, comment or quoted name, number too large)",
    Syntax = "HW0002": "the statement does not follow the grammar",
    OutOfRange = "HW0003": "a number is outside the range its attribute allows",
    TargetNotOnTable = "HW1001": "an AS target clause on a DATASTORE or SEQUENCE element",
    UnknownStore = "HW1002": "a STORE or ROUTE clause names a database that no element of the scheme uses",
    PropagatorWithoutSource = "HW1003": "a PROPAGATOR element whose propagator does not subscribe to the same objects from a master",
    DuplicateRoute = "HW1004": "a ROUTE repeats an address, or the same master/subscriber pair is routed twice",
    TooManySubscribers = "HW1005": "more than 255 subscriber databases in one scheme",
    InvalidTarget = "HW1006": "an aggregate target repeats a column or alias, groups by an aggregated column, or (BASE AGGREGATE) has no INTO naming another table",
    ElementNotFound = "HW2001": "ALTER or DROP names an element the scheme does not have",
    SubscriberNotFound = "HW2002": "ALTER SUBSCRIBER / DROP SUBSCRIBER names a database that does not subscribe to the element",
    NoElementOwnedBy = "HW2003": "ELEMENT * IN store matches no element",
    SchemeMismatch = "HW2004": "the ALTER is for a different scheme",
    RouteNotFound = "HW2005": "DROP ROUTE names a route or address the scheme does not have",
    LastSubscriber = "HW2006": "DROP SUBSCRIBER would leave an element without subscribers",
    LastElement = "HW2007": "DROP ELEMENT would leave the scheme without elements (use DROP REPLICATION)",
    UnresolvedSelf = "HW3001": "SELF cannot be resolved in a cluster-wide routing plan",
    MissingCatalog = "HW3002": "the routing plan needs the catalog of a master that has not reported one",
    ElementNameDuplicate = "TT8101": "duplicate element name, the same object owned twice by one database, or an element altered in the statement that adds it",
    StoreAttributeDuplicate = "TT8103": "a store attribute given twice, or added again for a store that already has it",
    AlterAfterDrop = "TT8104": "ALTER or DROP of an element dropped earlier in the same statement",
    OwnerIsSubscriber = "TT8106": "the database that owns an element also subscribes to it",
    DatastoreOverlap = "TT8107": "a DATASTORE element and a TABLE or SEQUENCE element of the same master cover the same object",
    NondurableNotDatastore = "TT8120": "TRANSMIT NONDURABLE on an element that is not a DATASTORE element",
    ExcludeNotInElement = "TT8135": "EXCLUDE of an object that the DATASTORE element does not contain",
    InclusionTwice = "TT8146": "more than one INCLUDE / EXCLUDE clause for one object type in an element",
    InclusionNotDatastore = "TT8147": "INCLUDE / EXCLUDE on an element that is not a DATASTORE element",
    SchemeExists = "TT8154": "CREATE REPLICATION of a scheme that already exists",
    SubscriberTwice = "TT8155": "a database subscribes to one element more than once",
    HostMismatch = "TT8172": "one database named with two different host names",
    ConflictCheckMismatch = "TT8176": "elements over the same table with different CHECK CONFLICTS settings",
    NondurableDrop = "TT8177": "objects cannot be dropped from a TRANSMIT NONDURABLE DATASTORE element",
    TwosafePropagator = "TT8194": "RETURN TWOSAFE on a PROPAGATOR element",
    SystemObject = "TT8207": "replicating an object owned by SYS or TTREP",
    IncludedObjectMissing = "TT17000": "INCLUDE or EXCLUDE names an object the master's catalog does not have",
    IncludedTwice = "TT17001": "the same object listed twice in INCLUDE / EXCLUDE",
    ExcludesEverything = "TT17002": "a DATASTORE element that excludes every object",
    ConflictCheckNotTable = "TT17005": "conflict checking on an element that is not a TABLE element",
    ReturnOnSequence = "TT17006": "a return service on a SEQUENCE element",
    CycleSequence = "TT17007": "a sequence created with CYCLE named for replication",
    CycleSequenceSkipped = "TT17008": "(warning) a DATASTORE element leaves out a sequence created with CYCLE",
    ConflictReportingDatastore = "TT17035": "CONFLICT REPORTING SUSPEND / RESUME in a scheme with a DATASTORE element",
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A problem found in scheme text, a scheme, an ALTER or a routing input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[error("{code}: {message}")]
pub struct SchemeError {
    pub code: ErrorCode,
    pub message: String,
    /// Where in the source the problem is; for nodes built in code, a default span.
    pub span: Span,
}

impl SchemeError {
    pub fn new(code: ErrorCode, span: Span, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            span,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_documented_and_unique() {
        let docs = include_str!("../../../docs/scheme.md");
        let mut seen = std::collections::BTreeSet::new();
        for code in ErrorCode::ALL {
            assert!(seen.insert(code.as_str()), "{code} twice");
            assert!(
                docs.contains(&format!("| `{code}` |")),
                "{code} is missing from docs/scheme.md"
            );
        }
    }
}
