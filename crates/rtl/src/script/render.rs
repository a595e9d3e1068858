//! Printing a compiled script: the net statements (or the log, when the run is not
//! compilable) as SQL in the script's own spelling, and the same as JSON.

use hawser_core::Value;
use serde_json::json;

use super::{ScriptOutput, Spelling};
use crate::change::{Assignment, Change, ChangeKind};
use crate::compile::{fmt_key, NetOp, Outcome};

impl ScriptOutput {
    /// The net statements per table in the script's own Sybase style, after a comment
    /// line with the counts; for a run that is not compilable, the reason and the
    /// statements in log order.
    pub fn render_sql(&self) -> String {
        let counts = &self.compilation.counts;
        let mut out = String::new();
        match &self.compilation.outcome {
            Outcome::Compiled { tables } => {
                out.push_str(&format!(
                    "-- {} in, {} net row {} out\n",
                    self.counts_in(),
                    counts.net_operations,
                    plural(counts.net_operations, "operation", "operations"),
                ));
                for table in tables {
                    let Some(spelling) = self.tables.get(&table.table) else {
                        continue;
                    };
                    for op in &table.operations {
                        for line in spelling.render_op(op) {
                            out.push_str(&line);
                            out.push('\n');
                        }
                    }
                }
            }
            Outcome::NotCompilable(_) => {
                out.push_str(&format!(
                    "-- not compilable: {}; apply in log order\n",
                    self.describe_refusal()
                ));
                out.push_str(&format!("-- {} in\n", self.counts_in()));
                for logged in &self.log {
                    if let Some(spelling) = self.tables.get(&logged.change.table) {
                        out.push_str(&spelling.render_change(&logged.change));
                        out.push('\n');
                    }
                }
            }
        }
        out
    }

    /// The result as pretty-printed JSON: counts, and either the net operations per
    /// table with values keyed by column name, or why the run is not compilable.
    pub fn to_json(&self) -> String {
        let counts = &self.compilation.counts;
        let doc = match &self.compilation.outcome {
            Outcome::Compiled { tables } => json!({
                "compiled": true,
                "counts": counts,
                "tables": tables
                    .iter()
                    .filter_map(|t| {
                        let spelling = self.tables.get(&t.table)?;
                        Some(json!({
                            "table": spelling.name,
                            "operations": t
                                .operations
                                .iter()
                                .map(|op| spelling.op_json(op))
                                .collect::<Vec<_>>(),
                        }))
                    })
                    .collect::<Vec<_>>(),
            }),
            Outcome::NotCompilable(refused) => {
                let logged = self.log.get(refused.transaction);
                json!({
                    "compiled": false,
                    "counts": counts,
                    "not_compilable": {
                        "table": self.tables.get(&refused.table).map_or_else(
                            || refused.table.to_string(),
                            |s| s.name.clone(),
                        ),
                        "key": refused.key.iter().map(json_value).collect::<Vec<_>>(),
                        "reason": refused.reason.to_string(),
                        "statement": logged.map(|l| l.statement),
                        "line": logged.map(|l| l.line),
                    },
                    "log": self
                        .log
                        .iter()
                        .filter_map(|l| {
                            Some(self.tables.get(&l.change.table)?.render_change(&l.change))
                        })
                        .collect::<Vec<_>>(),
                })
            }
        };
        // A `serde_json::Value` has only string map keys, so printing it cannot fail.
        serde_json::to_string_pretty(&doc).unwrap_or_default()
    }

    fn counts_in(&self) -> String {
        let c = &self.compilation.counts;
        format!(
            "{} {}, {} row {}",
            c.transactions,
            plural(c.transactions, "transaction", "transactions"),
            c.row_changes,
            plural(c.row_changes, "change", "changes"),
        )
    }

    fn describe_refusal(&self) -> String {
        let Outcome::NotCompilable(refused) = &self.compilation.outcome else {
            return String::new();
        };
        let name = self
            .tables
            .get(&refused.table)
            .map_or_else(|| refused.table.to_string(), |s| s.name.clone());
        let mut text = format!(
            "table {name}, key {}: {}",
            fmt_key(&refused.key),
            refused.reason
        );
        if let Some(logged) = self.log.get(refused.transaction) {
            text.push_str(&format!(
                " at statement {} (line {})",
                logged.statement, logged.line
            ));
        }
        text
    }
}

fn plural(n: u64, one: &'static str, many: &'static str) -> &'static str {
    if n == 1 {
        one
    } else {
        many
    }
}

fn json_value(v: &Value) -> serde_json::Value {
    match v {
        Value::Null => serde_json::Value::Null,
        Value::Bool(b) => json!(b),
        Value::Int(i) => json!(i),
        Value::Double(d) if d.is_finite() => json!(d),
        // Decimals print as strings to stay exact; the rest as their SQL text.
        other => json!(other.to_string()),
    }
}

impl Spelling {
    fn where_clause(&self, key: &[Value]) -> String {
        self.def
            .primary_key
            .iter()
            .zip(key)
            .map(|(&c, v)| match v {
                Value::Null => format!("{} is null", self.columns[c]),
                v => format!("{} = {}", self.columns[c], v.to_sql_literal()),
            })
            .collect::<Vec<_>>()
            .join(" and ")
    }

    fn insert_sql(&self, row: &[Value]) -> String {
        let values: Vec<String> = row.iter().map(Value::to_sql_literal).collect();
        format!("insert {} values ({})", self.name, values.join(", "))
    }

    fn update_sql(&self, key: &[Value], set: &[Assignment]) -> String {
        let set: Vec<String> = set
            .iter()
            .map(|a| format!("{} = {}", self.columns[a.column], a.value.to_sql_literal()))
            .collect();
        format!(
            "update {} set {} where {}",
            self.name,
            set.join(", "),
            self.where_clause(key)
        )
    }

    fn delete_sql(&self, key: &[Value]) -> String {
        format!("delete {} where {}", self.name, self.where_clause(key))
    }

    fn render_op(&self, op: &NetOp) -> Vec<String> {
        match op {
            NetOp::Insert { row, .. } => vec![self.insert_sql(row)],
            NetOp::Update { key, set, .. } => vec![self.update_sql(key, set)],
            NetOp::Delete { key, .. } => vec![self.delete_sql(key)],
            NetOp::Replace { key, row, .. } => vec![self.delete_sql(key), self.insert_sql(row)],
        }
    }

    fn render_change(&self, change: &Change) -> String {
        match &change.kind {
            ChangeKind::Insert { row } => self.insert_sql(row),
            ChangeKind::Update { set, .. } => self.update_sql(&change.key, set),
            ChangeKind::Delete { .. } => self.delete_sql(&change.key),
        }
    }

    fn named(&self, positions: impl Iterator<Item = (usize, Value)>) -> serde_json::Value {
        let map: serde_json::Map<String, serde_json::Value> = positions
            .map(|(c, v)| (self.columns[c].clone(), json_value(&v)))
            .collect();
        serde_json::Value::Object(map)
    }

    fn key_json(&self, key: &[Value]) -> serde_json::Value {
        self.named(
            self.def
                .primary_key
                .iter()
                .copied()
                .zip(key.iter().cloned()),
        )
    }

    fn row_json(&self, row: &[Value]) -> serde_json::Value {
        self.named(row.iter().cloned().enumerate())
    }

    fn op_json(&self, op: &NetOp) -> serde_json::Value {
        match op {
            NetOp::Insert { key, row } => {
                json!({"op": "insert", "key": self.key_json(key), "row": self.row_json(row)})
            }
            NetOp::Update { key, set, .. } => json!({
                "op": "update",
                "key": self.key_json(key),
                "set": self.named(set.iter().map(|a| (a.column, a.value.clone()))),
            }),
            NetOp::Delete { key, .. } => json!({"op": "delete", "key": self.key_json(key)}),
            NetOp::Replace { key, row, .. } => {
                json!({"op": "replace", "key": self.key_json(key), "row": self.row_json(row)})
            }
        }
    }
}
