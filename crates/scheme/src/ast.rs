//! The typed syntax tree of the replication-scheme language.
//!
//! One [`Statement`] per `CREATE` / `ALTER` / `DROP REPLICATION`. A CREATE statement *is*
//! a [`Scheme`]: the cluster stores schemes in its Raft state machine, so every type here
//! is `Clone + Debug + PartialEq + Serialize + Deserialize`.
//!
//! The tree keeps what was written, not what it means: an omitted option is `None`, not
//! its default, so that the printer can reproduce a statement without inventing clauses
//! (the routing plan fills in defaults). Names are [`Ident`] / [`QualName`], already
//! folded. Host names are folded to lower case (host names are case-insensitive, RFC
//! 4343). Spans never take part in equality (see [`crate::span`]).

use hawser_core::{Ident, QualName};
use serde::{Deserialize, Serialize};

use crate::span::Span;

/// One statement of the language.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Statement {
    Create(Scheme),
    Alter(AlterReplication),
    Drop(DropReplication),
}

impl Statement {
    /// The scheme the statement is about.
    pub fn scheme_name(&self) -> &QualName {
        match self {
            Statement::Create(s) => &s.name,
            Statement::Alter(a) => &a.name,
            Statement::Drop(d) => &d.name,
        }
    }

    pub fn span(&self) -> Span {
        match self {
            Statement::Create(s) => s.span,
            Statement::Alter(a) => a.span,
            Statement::Drop(d) => d.span,
        }
    }
}

/// A replication scheme: the content of `CREATE REPLICATION`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scheme {
    pub name: QualName,
    pub name_span: Span,
    pub elements: Vec<Element>,
    pub stores: Vec<StoreClause>,
    pub routes: Vec<Route>,
    pub span: Span,
}

/// `ELEMENT name kind (MASTER | PROPAGATOR) store [TRANSMIT ...] SUBSCRIBER ... [INCLUDE|EXCLUDE ...]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Element {
    pub name: Ident,
    pub name_span: Span,
    pub kind: ElementKind,
    /// The database that owns the element and whether it masters or propagates it.
    pub owner_role: OwnerRole,
    pub owner: StoreRef,
    pub transmit: Option<Transmit>,
    pub transmit_span: Span,
    pub subscribers: Vec<SubscriberClause>,
    pub inclusions: Vec<Inclusion>,
    pub span: Span,
}

impl Element {
    /// Every subscribing store, in the order written.
    pub fn subscriber_stores(&self) -> impl Iterator<Item = &StoreRef> {
        self.subscribers.iter().flat_map(|c| c.stores.iter())
    }

    /// The return service written for `store`'s subscription, if any.
    pub fn subscription_of(&self, store: &StoreName) -> Option<&SubscriberClause> {
        self.subscribers
            .iter()
            .find(|c| c.stores.iter().any(|s| &s.name == store))
    }
}

/// What an element replicates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ElementKind {
    /// The whole database, narrowed by the element's INCLUDE / EXCLUDE clauses.
    Datastore,
    Table {
        table: QualName,
        table_span: Span,
        check: Option<CheckConflicts>,
    },
    Sequence {
        sequence: QualName,
        sequence_span: Span,
    },
}

impl ElementKind {
    pub fn keyword(&self) -> &'static str {
        match self {
            ElementKind::Datastore => "DATASTORE",
            ElementKind::Table { .. } => "TABLE",
            ElementKind::Sequence { .. } => "SEQUENCE",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OwnerRole {
    Master,
    Propagator,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Transmit {
    Durable,
    Nondurable,
}

/// A database as a scheme names it: `SELF` or `name [ON host]`.
///
/// Inside a scheme a database is identified by its name alone; the host, when given,
/// must be the same everywhere the name appears (TT8172). See `docs/scheme.md`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreRef {
    pub name: StoreName,
    /// Host name folded to lower case, as written without quotes.
    pub host: Option<String>,
    pub span: Span,
}

impl StoreRef {
    /// A store reference built in code (no source position).
    pub fn named(name: &str, host: Option<&str>) -> Self {
        Self {
            name: StoreName::Named(Ident::unquoted(name)),
            host: host.map(str::to_lowercase),
            span: Span::default(),
        }
    }
}

/// The database part of a [`StoreRef`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum StoreName {
    /// `SELF`: the database executing the statement.
    Local,
    Named(Ident),
}

impl std::fmt::Display for StoreName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreName::Local => f.write_str("SELF"),
            StoreName::Named(n) => f.write_str(n.as_str()),
        }
    }
}

/// `SUBSCRIBER store [, store]... [return service] [AS target [INTO table]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubscriberClause {
    pub stores: Vec<StoreRef>,
    pub return_service: Option<ReturnService>,
    pub return_span: Span,
    /// hawser's DB2 target-table extension.
    pub target: Option<TargetSpec>,
    pub span: Span,
}

/// A return-service attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReturnService {
    /// `RETURN RECEIPT [BY REQUEST]`: commit waits for the subscriber's durable receipt.
    Receipt { by_request: bool },
    /// `RETURN TWOSAFE [BY REQUEST]`: commit waits for the subscriber's commit.
    Twosafe { by_request: bool },
    /// `NO RETURN`: asynchronous (also the meaning of no attribute at all).
    NoReturn,
}

/// `CHECK CONFLICTS BY ROW TIMESTAMP ...` or `NO CHECK`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CheckConflicts {
    ByRowTimestamp {
        column: Ident,
        update_by: Option<UpdateBy>,
        on_exception: Option<OnException>,
        report: Option<Report>,
    },
    NoCheck,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum UpdateBy {
    System,
    User,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OnException {
    /// `ROLLBACK [WORK]`: the whole replicated transaction is rejected.
    Rollback,
    /// `NO ACTION`: only the conflicting operation is skipped.
    NoAction,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Report {
    To {
        file: String,
        format: Option<ReportFormat>,
    },
    NoReport,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReportFormat {
    Xml,
    Standard,
}

/// `INCLUDE | EXCLUDE group [, group]...`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inclusion {
    pub action: InclusionAction,
    pub groups: Vec<ObjectGroup>,
    pub span: Span,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum InclusionAction {
    Include,
    Exclude,
}

/// `TABLE [name, ...]` or `SEQUENCE [name, ...]` inside INCLUDE / EXCLUDE.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ObjectGroup {
    pub object_type: ObjectType,
    pub names: Vec<NamedObject>,
    pub span: Span,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ObjectType {
    Table,
    Sequence,
}

/// An object name with its position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NamedObject {
    pub name: QualName,
    pub span: Span,
}

/// `STORE store attribute...`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreClause {
    pub store: StoreRef,
    pub attributes: Vec<StoreAttribute>,
    pub span: Span,
}

/// One store attribute with its position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreAttribute {
    pub attr: StoreAttr,
    pub span: Span,
}

/// A STORE attribute (TimesTen defaults in `docs/scheme.md` and [`crate::route`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StoreAttr {
    /// `DISABLE RETURN SUBSCRIBER|ALL n`: stop waiting after `n` consecutive timeouts.
    DisableReturn { scope: DisableScope, failures: u32 },
    /// `RETURN SERVICES ON|OFF WHEN [REPLICATION] STOPPED`.
    ReturnServicesWhenStopped(bool),
    /// `DURABLE COMMIT ON|OFF`.
    DurableCommit(bool),
    /// `RESUME RETURN ms`.
    ResumeReturn(u32),
    /// `RETURN WAIT TIME s`.
    ReturnWaitTime(u32),
    /// `LOCAL COMMIT ACTION NO ACTION|COMMIT`.
    LocalCommitAction(LocalAction),
    /// `COMPRESS TRAFFIC ON|OFF`.
    CompressTraffic(bool),
    /// `FAILOVER ON|OFF` (hawser's extension): whether the cluster fails over the
    /// elements this store masters when it goes silent (default ON).
    Failover(bool),
    /// `PORT n`.
    Port(u16),
    /// `TIMEOUT s`.
    Timeout(u32),
    /// `FAILTHRESHOLD n` (0 = no limit).
    FailThreshold(u32),
    /// `CONFLICT REPORTING SUSPEND AT n`.
    ConflictReportingSuspendAt(u32),
    /// `CONFLICT REPORTING RESUME AT n`.
    ConflictReportingResumeAt(u32),
    /// `TABLE DEFINITION CHECKING EXACT|RELAXED`.
    TableDefinitionChecking(TableDefinitionChecking),
}

impl StoreAttr {
    /// Which attribute this is, for "given twice" checks.
    pub fn key(&self) -> &'static str {
        match self {
            StoreAttr::DisableReturn { .. } => "DISABLE RETURN",
            StoreAttr::ReturnServicesWhenStopped(_) => "RETURN SERVICES WHEN REPLICATION STOPPED",
            StoreAttr::DurableCommit(_) => "DURABLE COMMIT",
            StoreAttr::ResumeReturn(_) => "RESUME RETURN",
            StoreAttr::ReturnWaitTime(_) => "RETURN WAIT TIME",
            StoreAttr::LocalCommitAction(_) => "LOCAL COMMIT ACTION",
            StoreAttr::CompressTraffic(_) => "COMPRESS TRAFFIC",
            StoreAttr::Failover(_) => "FAILOVER",
            StoreAttr::Port(_) => "PORT",
            StoreAttr::Timeout(_) => "TIMEOUT",
            StoreAttr::FailThreshold(_) => "FAILTHRESHOLD",
            StoreAttr::ConflictReportingSuspendAt(_) => "CONFLICT REPORTING SUSPEND AT",
            StoreAttr::ConflictReportingResumeAt(_) => "CONFLICT REPORTING RESUME AT",
            StoreAttr::TableDefinitionChecking(_) => "TABLE DEFINITION CHECKING",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DisableScope {
    Subscriber,
    All,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LocalAction {
    NoAction,
    Commit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TableDefinitionChecking {
    Exact,
    Relaxed,
}

/// `ROUTE MASTER store SUBSCRIBER store address...`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Route {
    pub master: StoreRef,
    pub subscriber: StoreRef,
    pub addresses: Vec<RouteAddress>,
    pub span: Span,
}

/// `MASTERIP host PRIORITY n` or `SUBSCRIBERIP host PRIORITY n`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteAddress {
    pub side: RouteSide,
    pub host: String,
    /// 1–99, lower is tried first.
    pub priority: u8,
    pub span: Span,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RouteSide {
    MasterIp,
    SubscriberIp,
}

/// hawser's extension: `AS target [INTO [owner.]table]` (DB2 SQL Replication target types).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetSpec {
    pub kind: TargetKind,
    /// The table the subscriber writes; `None` is the replicated table's own name.
    pub into: Option<QualName>,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum TargetKind {
    UserCopy,
    PointInTime,
    Replica,
    /// `CCD [CONDENSED|NONCONDENSED] [COMPLETE|NONCOMPLETE]`; `None` = not written.
    Ccd {
        condensed: Option<bool>,
        complete: Option<bool>,
    },
    BaseAggregate {
        aggregates: Vec<Aggregate>,
        group_by: Vec<Ident>,
    },
    ChangeAggregate {
        aggregates: Vec<Aggregate>,
        group_by: Vec<Ident>,
    },
}

/// One aggregate column of an aggregate target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Aggregate {
    pub func: AggFunc,
    pub alias: Option<Ident>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AggFunc {
    CountStar,
    Sum(Ident),
    Min(Ident),
    Max(Ident),
    Avg(Ident),
}

impl AggFunc {
    /// The aggregated column (`None` for `COUNT(*)`).
    pub fn column(&self) -> Option<&Ident> {
        match self {
            AggFunc::CountStar => None,
            AggFunc::Sum(c) | AggFunc::Min(c) | AggFunc::Max(c) | AggFunc::Avg(c) => Some(c),
        }
    }
}

/// `ALTER REPLICATION name operation...`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlterReplication {
    pub name: QualName,
    pub name_span: Span,
    pub ops: Vec<AlterOp>,
    pub span: Span,
}

/// One operation of an ALTER REPLICATION.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AlterOp {
    AddElement(Element),
    AlterElement {
        target: ElementTarget,
        action: ElementAction,
        span: Span,
    },
    DropElement {
        target: ElementTarget,
        span: Span,
    },
    /// `ADD STORE store attribute...`.
    AddStore(StoreClause),
    /// `ALTER STORE store SET attribute...`.
    AlterStore(StoreClause),
    AddRoute(Route),
    DropRoute(DropRoute),
}

/// Which elements an ALTER / DROP ELEMENT names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ElementTarget {
    Named {
        name: Ident,
        span: Span,
    },
    /// `* IN store`: every element that `store` owns (as master or propagator).
    AllIn(StoreRef),
}

/// What an `ALTER ELEMENT` does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ElementAction {
    /// `ADD SUBSCRIBER store, ... [return service] [AS target]`.
    AddSubscriber(SubscriberClause),
    /// `ALTER SUBSCRIBER store, ... SET return service`.
    AlterSubscriber {
        stores: Vec<StoreRef>,
        return_service: ReturnService,
    },
    /// `SET return service` for every subscriber of the element.
    SetReturnService(ReturnService),
    DropSubscriber(Vec<StoreRef>),
    /// `SET MASTER store` (only with `* IN store`).
    SetMaster(StoreRef),
    /// `SET PROPAGATOR store` (only with `* IN store`).
    SetPropagator(StoreRef),
    SetName {
        name: Ident,
        span: Span,
    },
    SetCheckConflicts(CheckConflicts),
    /// `INCLUDE ...` or `EXCLUDE ...` on a DATASTORE element.
    Inclusion(Inclusion),
}

/// `DROP ROUTE MASTER store SUBSCRIBER store (MASTERIP host | SUBSCRIBERIP host)...`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DropRoute {
    pub master: StoreRef,
    pub subscriber: StoreRef,
    pub addresses: Vec<(RouteSide, String)>,
    pub span: Span,
}

/// `DROP REPLICATION name`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DropReplication {
    pub name: QualName,
    pub span: Span,
}
