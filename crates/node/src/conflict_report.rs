//! Conflict report files: `CHECK CONFLICTS ... REPORT TO 'file' [FORMAT XML | STANDARD]`
//! and the store's `CONFLICT REPORTING SUSPEND AT n / RESUME AT m` (docs/conflicts.md).
//!
//! ```text
//!  store apply ─► committed ConflictEvent (broadcast) ─► run: plan of the table
//!     (from the schemes) ─► RateGate (suspend / resume) ─► STANDARD or XML text
//!     ─► appended to the file
//! ```
//!
//! The plan, the gate and the formats are pure and unit-tested; `run` does the I/O. A
//! conflict is always in the `hawser_conflicts` table; the file is a report of it.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hawser_control::{ClusterState, ControlPlane};
use hawser_core::{Ident, QualName, Row};
use hawser_scheme::ast::{CheckConflicts, Report, ReportFormat};
use hawser_scheme::route::StoreSettings;
use hawser_store::{ConflictEvent, Database};
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// Where one table's conflicts are reported, and when reporting pauses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReportTo {
    pub(crate) file: PathBuf,
    pub(crate) xml: bool,
    /// CONFLICT REPORTING SUSPEND AT / RESUME AT of this store (0: never suspend).
    pub(crate) suspend_at: u32,
    pub(crate) resume_at: u32,
}

/// The report of each table `store` checks conflicts of with `REPORT TO`, from the
/// schemes; a relative file name is under `data_dir`.
pub(crate) fn plan(
    state: &ClusterState,
    store: &Ident,
    data_dir: &Path,
) -> BTreeMap<QualName, ReportTo> {
    let mut out = BTreeMap::new();
    for (scheme, table, check) in crate::dataplane::checked_tables(state, store) {
        let CheckConflicts::ByRowTimestamp {
            report: Some(Report::To { file, format }),
            ..
        } = check
        else {
            continue;
        };
        let settings = StoreSettings::of(scheme, store);
        out.entry(table.clone()).or_insert_with(|| ReportTo {
            file: data_dir.join(file),
            xml: *format == Some(ReportFormat::Xml),
            suspend_at: settings.conflict_reporting_suspend_at,
            resume_at: settings.conflict_reporting_resume_at,
        });
    }
    out
}

/// CONFLICT REPORTING SUSPEND AT / RESUME AT: reporting stops while more than
/// `suspend_at` conflicts a second arrive, and starts again once fewer than `resume_at`
/// do (the rate: conflicts in the last second, counted as each arrives).
#[derive(Debug, Default)]
pub(crate) struct RateGate {
    recent: VecDeque<Instant>,
    suspended: bool,
}

/// What to do with one conflict's report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    Write,
    /// Not written: reporting is suspended (`started`: by this conflict).
    Suspended {
        started: bool,
    },
    /// Written, and reporting resumes with it.
    Resumed,
}

impl RateGate {
    pub(crate) fn admit(&mut self, now: Instant, suspend_at: u32, resume_at: u32) -> Admit {
        self.recent.push_back(now);
        while self
            .recent
            .front()
            .is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(1))
        {
            self.recent.pop_front();
        }
        let rate = self.recent.len() as u32;
        if self.suspended {
            // The rate before this conflict: RESUME AT 0 or 1 resumes after a quiet second.
            if rate - 1 < resume_at.max(1) {
                self.suspended = false;
                return Admit::Resumed;
            }
            return Admit::Suspended { started: false };
        }
        if suspend_at > 0 && rate > suspend_at {
            self.suspended = true;
            return Admit::Suspended { started: true };
        }
        Admit::Write
    }
}

fn show(row: &Option<Row>) -> String {
    match row {
        Some(r) => format!("({})", hawser_store::db::key_text(r)),
        None => "none".to_string(),
    }
}

fn stamp(s: &Option<Vec<u8>>) -> String {
    match s {
        Some(b) => b.iter().map(|x| format!("{x:02X}")).collect(),
        None => "NULL".to_string(),
    }
}

fn when(micros: i64) -> String {
    hawser_core::Value::Timestamp(micros).to_string()
}

/// A conflict as TimesTen's STANDARD report writes one (plain text, a blank line after).
pub(crate) fn standard(store: &Ident, e: &ConflictEvent, now_micros: i64) -> String {
    let op = format!("{:?}", e.op).to_lowercase();
    format!(
        "Conflict detected at {}\n\
         Datastore : {store}\n\
         Transmitting node : {}\n\
         Table : {}\n\
         Conflicting {op}, transaction {}:{} change {} committed at {}\n\
         Conflicting tuple timestamp : {}\n\
         Existing tuple timestamp : {}\n\
         The existing tuple : {}\n\
         The conflicting tuple : {}\n\
         The key columns for the tuple : {}\n\
         {}\n\n",
        when(now_micros),
        e.origin,
        e.table,
        e.origin,
        e.seq,
        e.change_no,
        when(e.commit_micros),
        stamp(&e.incoming_stamp),
        stamp(&e.local_stamp),
        show(&e.here),
        show(&e.incoming),
        hawser_store::db::key_text(&e.key),
        if e.rolled_back {
            "Transaction containing this operation was rolled back"
        } else {
            "This operation was skipped"
        }
    )
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A conflict as one `<conflict>` element (FORMAT XML), one per line.
pub(crate) fn xml(store: &Ident, e: &ConflictEvent, now_micros: i64) -> String {
    let op = format!("{:?}", e.op).to_lowercase();
    format!(
        "<conflict detected=\"{}\" datastore=\"{}\" table=\"{}\" operation=\"{op}\" \
         origin=\"{}\" seq=\"{}\" change=\"{}\" committed=\"{}\" action=\"{}\">\
         <key>{}</key><existing timestamp=\"{}\">{}</existing>\
         <conflicting timestamp=\"{}\">{}</conflicting></conflict>\n",
        xml_escape(&when(now_micros)),
        xml_escape(store.as_str()),
        xml_escape(&e.table.to_string()),
        e.origin,
        e.seq,
        e.change_no,
        xml_escape(&when(e.commit_micros)),
        if e.rolled_back { "rollback" } else { "skip" },
        xml_escape(&hawser_store::db::key_text(&e.key)),
        stamp(&e.local_stamp),
        xml_escape(&show(&e.here)),
        stamp(&e.incoming_stamp),
        xml_escape(&show(&e.incoming)),
    )
}

fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// Writes each conflict `db` commits to its table's report file until `shutdown`.
pub(crate) async fn run(
    db: Database,
    plane: ControlPlane,
    store: Ident,
    data_dir: PathBuf,
    shutdown: CancellationToken,
) {
    let mut events = db.subscribe_conflicts();
    let mut gates: BTreeMap<PathBuf, RateGate> = BTreeMap::new();
    let mut failing: Option<PathBuf> = None;
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => return,
            e = events.recv() => e,
        };
        let event: Arc<ConflictEvent> = match event {
            Ok(e) => e,
            Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                warn!(missed = n, "conflicts came faster than their reports were written: not reported (they are in hawser_conflicts)");
                continue;
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        };
        let plan = plan(&plane.state(), &store, &data_dir);
        let Some(to) = plan.get(&event.table) else {
            continue;
        };
        let gate = gates.entry(to.file.clone()).or_default();
        match gate.admit(Instant::now(), to.suspend_at, to.resume_at) {
            Admit::Suspended { started: true } => {
                warn!(
                    file = %to.file.display(),
                    suspend_at = to.suspend_at,
                    "conflict reporting stopping: more than SUSPEND AT conflicts a second (TT17051)"
                );
                continue;
            }
            Admit::Suspended { started: false } => continue,
            Admit::Resumed => {
                tracing::info!(file = %to.file.display(), "conflict reporting resumed");
            }
            Admit::Write => {}
        }
        let text = if to.xml {
            xml(&store, &event, now_micros())
        } else {
            standard(&store, &event, now_micros())
        };
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&to.file)
            .and_then(|mut f| f.write_all(text.as_bytes()));
        match written {
            Ok(()) => failing = None,
            Err(e) if failing.as_ref() != Some(&to.file) => {
                warn!(file = %to.file.display(), error = %e, "cannot write the conflict report (the conflict is in hawser_conflicts)");
                failing = Some(to.file.clone());
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use hawser_core::{ChangeOp, NodeId, Value};

    use super::*;

    fn event() -> ConflictEvent {
        ConflictEvent {
            table: QualName::bare("accounts"),
            origin: NodeId(7),
            seq: 4,
            commit_micros: 0,
            change_no: 0,
            op: ChangeOp::Update,
            key: vec![Value::Text("ann".into())],
            incoming: Some(vec![Value::Text("ann".into()), Value::Int(1)]),
            here: Some(vec![Value::Text("ann".into()), Value::Int(2)]),
            incoming_stamp: Some(vec![0, 1]),
            local_stamp: Some(vec![0, 2]),
            rolled_back: true,
        }
    }

    #[test]
    fn reports_say_both_rows_both_stamps_and_what_was_done() {
        let s = standard(&Ident::unquoted("eastds"), &event(), 0);
        for part in [
            "Datastore : eastds",
            "Table : accounts",
            "Conflicting tuple timestamp : 0001",
            "Existing tuple timestamp : 0002",
            "The existing tuple : ('ann', 2)",
            "The conflicting tuple : ('ann', 1)",
            "rolled back",
        ] {
            assert!(s.contains(part), "{part} not in {s}");
        }
        let x = xml(&Ident::unquoted("eastds"), &event(), 0);
        assert!(
            x.starts_with("<conflict ") && x.ends_with("</conflict>\n"),
            "{x}"
        );
        assert!(
            x.contains("action=\"rollback\"") && x.contains("<key>'ann'</key>"),
            "{x}"
        );
    }

    #[test]
    fn reporting_suspends_above_suspend_at_and_resumes_below_resume_at() {
        let t0 = Instant::now();
        let mut g = RateGate::default();
        let ms = |n| t0 + Duration::from_millis(n);
        assert_eq!(g.admit(ms(0), 2, 1), Admit::Write);
        assert_eq!(g.admit(ms(10), 2, 1), Admit::Write);
        assert_eq!(g.admit(ms(20), 2, 1), Admit::Suspended { started: true });
        assert_eq!(g.admit(ms(30), 2, 1), Admit::Suspended { started: false });
        // After a quiet second, the next conflict resumes reporting.
        assert_eq!(g.admit(ms(5000), 2, 1), Admit::Resumed);
        assert_eq!(g.admit(ms(5010), 2, 1), Admit::Write);
        let mut never = RateGate::default();
        for i in 0..100 {
            assert_eq!(never.admit(ms(i), 0, 0), Admit::Write);
        }
    }
}
