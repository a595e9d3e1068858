//! How the CLI's commands print: the `--format` choice, psql-style aligned text tables for a
//! person, and the JSON form of SQL values for a program.
//!
//! Keeping both renderings in one place means `hawser sql`, `hawser status` and
//! `hawser bench` agree on how a value looks. Everything here is pure (strings in, strings
//! out) so it is tested without a server.

use chrono::DateTime;
use hawser_client::ClientError;
use hawser_core::Value;
use serde_json::Value as Json;

/// The output format of a command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned text for a person.
    #[default]
    Table,
    /// One JSON object per line for a program.
    Json,
}

/// Horizontal alignment of a table column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Left,
    /// For numbers, so digits line up.
    Right,
}

/// Renders an aligned table the way psql does: centred headers, a `-+-` rule, one space of
/// padding each side of `|`. The last column is not padded when left-aligned, so lines carry
/// no trailing blanks. Cells should already be one line (see [`cell_text`]); widths count
/// characters. Each line, the last included, ends with `\n`.
pub fn render_table(headers: &[String], aligns: &[Align], rows: &[Vec<String>]) -> String {
    let ncols = headers.len();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let align_of = |i: usize| aligns.get(i).copied().unwrap_or(Align::Left);
    let mut out = String::new();

    let header_cells: Vec<String> = headers
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let pad = widths[i] - h.chars().count();
            let left = pad / 2;
            let right = if i + 1 == ncols { 0 } else { pad - left };
            format!("{}{h}{}", " ".repeat(left), " ".repeat(right))
        })
        .collect();
    push_line(&mut out, &header_cells);

    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(w + 2)).collect();
    out.push_str(&rule.join("+"));
    out.push('\n');

    for row in rows {
        let cells: Vec<String> = (0..ncols)
            .map(|i| {
                let cell = row.get(i).map(String::as_str).unwrap_or("");
                let pad = " ".repeat(widths[i] - cell.chars().count());
                match align_of(i) {
                    Align::Right => format!("{pad}{cell}"),
                    Align::Left if i + 1 == ncols => cell.to_string(),
                    Align::Left => format!("{cell}{pad}"),
                }
            })
            .collect();
        push_line(&mut out, &cells);
    }
    out
}

/// Joins padded cells with ` | `, a leading space and no trailing blanks.
fn push_line(out: &mut String, cells: &[String]) {
    let line = format!(" {}", cells.join(" | "));
    out.push_str(line.trim_end_matches(' '));
    out.push('\n');
}

/// The text of a value in a table cell: as [`Value`]'s `Display` prints it, with control
/// characters escaped (`\n`, `\t`, `\u{1b}`) so that one row stays one line and the
/// columns stay aligned.
pub fn cell_text(v: &Value) -> String {
    let text = v.to_string();
    if !text.chars().any(char::is_control) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&c.escape_unicode().to_string()),
            c => out.push(c),
        }
    }
    out
}

/// Whether a value is a number, for right-aligning numeric columns.
pub fn is_numeric(v: &Value) -> bool {
    matches!(v, Value::Int(_) | Value::Decimal(_) | Value::Double(_))
}

/// The JSON form of a value: integers and finite doubles as numbers; decimals as strings
/// (JSON numbers would lose their exactness in most readers); NULL as `null`; text as a
/// string; bytes as upper-case hex; dates and timestamps in ISO 8601
/// (`2026-01-02`, `2026-01-02T03:04:05.000123`). Non-finite doubles, which JSON cannot
/// hold, become the strings `NaN`, `inf` and `-inf`.
pub fn value_json(v: &Value) -> Json {
    match v {
        Value::Null => Json::Null,
        Value::Bool(b) => Json::Bool(*b),
        Value::Int(i) => Json::from(*i),
        Value::Double(d) => serde_json::Number::from_f64(*d)
            .map(Json::Number)
            .unwrap_or_else(|| Json::String(d.to_string())),
        Value::Timestamp(us) => Json::String(iso_timestamp(*us)),
        Value::Decimal(_) | Value::Text(_) | Value::Bytes(_) | Value::Date(_) => {
            Json::String(v.to_string())
        }
    }
}

/// A timestamp (microseconds since the epoch, no zone) in ISO 8601 with a `T`; the
/// fraction is printed only when there is one. Out of chrono's range it falls back to
/// [`Value`]'s own text.
fn iso_timestamp(us: i64) -> String {
    match DateTime::from_timestamp_micros(us) {
        Some(t) if us.rem_euclid(1_000_000) == 0 => t.format("%Y-%m-%dT%H:%M:%S").to_string(),
        Some(t) => t.format("%Y-%m-%dT%H:%M:%S%.6f").to_string(),
        None => Value::Timestamp(us).to_string(),
    }
}

/// One line about a failed call: the message, then the causes it wraps.
pub fn error_text(e: &ClientError) -> String {
    e.text()
}

/// Why a command could not reach `host`, naming it once.
pub fn connect_error_text(host: &str, e: &ClientError) -> String {
    match e {
        // These already name the address.
        ClientError::Connect { .. } | ClientError::BadAddress { .. } => error_text(e),
        other => format!("cannot connect to {host}: {}", error_text(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn table_aligns_columns_like_psql() {
        let t = render_table(
            &strings(&["id", "name"]),
            &[Align::Right, Align::Left],
            &[strings(&["1", "alice"]), strings(&["1234", "bo"])],
        );
        let expected = concat!(
            "  id  | name\n",
            "------+-------\n",
            "    1 | alice\n",
            " 1234 | bo\n",
        );
        assert_eq!(t, expected);
    }

    #[test]
    fn table_widths_count_characters_not_bytes() {
        let t = render_table(
            &strings(&["a", "b"]),
            &[Align::Left, Align::Left],
            &[strings(&["žluť", "x"]), strings(&["ab", "y"])],
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[2], " žluť | x");
        assert_eq!(lines[3], " ab   | y");
    }

    #[test]
    fn table_with_no_rows_has_header_and_rule() {
        let t = render_table(&strings(&["count"]), &[Align::Right], &[]);
        assert_eq!(t, " count\n-------\n");
    }

    #[test]
    fn cells_escape_control_characters() {
        assert_eq!(cell_text(&Value::Text("a\nb\tc".into())), "a\\nb\\tc");
        assert_eq!(cell_text(&Value::Text("\u{1b}[0m".into())), "\\u{1b}[0m");
        assert_eq!(cell_text(&Value::Null), "NULL");
    }

    #[test]
    fn json_values_follow_the_documented_forms() {
        assert_eq!(value_json(&Value::Int(-7)), serde_json::json!(-7));
        assert_eq!(
            value_json(&Value::Int(i64::MAX)),
            serde_json::json!(i64::MAX)
        );
        assert_eq!(
            value_json(&Value::Decimal("12.50".parse().unwrap())),
            serde_json::json!("12.50")
        );
        assert_eq!(value_json(&Value::Null), Json::Null);
        assert_eq!(value_json(&Value::Bool(true)), serde_json::json!(true));
        assert_eq!(
            value_json(&Value::Text("it's".into())),
            serde_json::json!("it's")
        );
        assert_eq!(
            value_json(&Value::Bytes(vec![0, 0xab])),
            serde_json::json!("00AB")
        );
        assert_eq!(value_json(&Value::Double(1.5)), serde_json::json!(1.5));
        assert_eq!(
            value_json(&Value::Double(f64::NAN)),
            serde_json::json!("NaN")
        );
        assert_eq!(value_json(&Value::Date(0)), serde_json::json!("1970-01-01"));
    }

    #[test]
    fn error_text_shows_a_status_message_once() {
        let status = tonic::Status::aborted("lock timeout");
        assert_eq!(
            error_text(&ClientError::Status(status)),
            "Aborted: lock timeout"
        );
    }

    #[test]
    fn json_timestamps_are_iso_with_a_t() {
        assert_eq!(
            value_json(&Value::Timestamp(0)),
            serde_json::json!("1970-01-01T00:00:00")
        );
        assert_eq!(
            value_json(&Value::Timestamp(1_500_000)),
            serde_json::json!("1970-01-01T00:00:01.500000")
        );
        assert_eq!(
            value_json(&Value::Timestamp(-1)),
            serde_json::json!("1969-12-31T23:59:59.999999")
        );
    }
}
