//! The apply's counters, registered once per database and counted by every apply.

/// The apply's counters; `mode` is `log` or `compiled`.
pub(crate) struct ApplyMetrics {
    pub(crate) rows_log: metrics::Counter,
    pub(crate) rows_compiled: metrics::Counter,
    pub(crate) changes: metrics::Counter,
    pub(crate) applied: metrics::Counter,
    pub(crate) skipped: metrics::Counter,
}

impl ApplyMetrics {
    pub(crate) fn new() -> Self {
        metrics::describe_counter!(
            "hawser_store_apply_rows_total",
            "row puts and deletes written by replicated apply, by mode (log order or compiled)"
        );
        metrics::describe_counter!(
            "hawser_store_apply_changes_total",
            "row changes carried by applied replicated transactions"
        );
        metrics::describe_counter!(
            "hawser_store_apply_transactions_total",
            "replicated transactions, applied or skipped as already present"
        );
        Self {
            rows_log: metrics::counter!("hawser_store_apply_rows_total", "mode" => "log"),
            rows_compiled: metrics::counter!("hawser_store_apply_rows_total", "mode" => "compiled"),
            changes: metrics::counter!("hawser_store_apply_changes_total"),
            applied: metrics::counter!("hawser_store_apply_transactions_total", "result" => "applied"),
            skipped: metrics::counter!("hawser_store_apply_transactions_total", "result" => "skipped"),
        }
    }
}
