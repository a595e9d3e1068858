//! `hawser sql`: runs SQL against one node, from the command line or in an interactive
//! shell.
//!
//! Everything goes through one [`Session`], so a transaction opened by one `-e` (or one
//! line of the shell) is still open for the next. Scripts run in order: every `-e` in the
//! order given, then the `-f` file, then — when neither is given — standard input: the
//! interactive shell on a terminal, otherwise the whole input as one script. The first
//! statement error stops the run with exit status 1. A script over [`MAX_REQUEST_SQL`]
//! goes in pieces of whole statements ([`pieces`]).
//!
//! A write refused because the node receives the table (25006) names the table's master.
//! With `--follow-master`, while the session holds nothing that would not move with it
//! (no transaction, no `CALL` setting), the session moves there and the script goes on
//! from the refused statement, which did nothing where it was refused
//! ([`follow_master`]): `hawser sql` pointed at any node writes through whichever node
//! masters the table, also after a failover. Without it the refusal is the answer, as
//! TimesTen gives it.
//!
//! The shell's line editing (rustyline) blocks, so it runs on a thread of its own that hands
//! complete statements to the async side and waits for the answer before it prompts again:
//!
//! ```text
//!   line editor thread ── Statement(sql) ──► session task ── Execute ──► node
//!                      ◄── in_transaction ──
//! ```

use std::io::{self, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc as std_mpsc;

use anyhow::Context;
use hawser_client::{Client, ClientError, ScriptOutcome, Session, StatementResult};
use hawser_proto::v1;
use rustyline::error::ReadlineError;
use serde_json::json;
use tokio::sync::mpsc;

use crate::output::{self, connect_error_text, error_text, Align, Format};

/// Arguments of `hawser sql`.
#[derive(clap::Args, Debug)]
pub struct SqlArgs {
    /// The node to connect to.
    #[arg(
        long,
        value_name = "HOST:PORT",
        env = "HAWSER_HOST",
        default_value = "127.0.0.1:7420"
    )]
    pub host: String,
    /// A script to run (statements separated by `;`). Repeatable: each runs in the same
    /// session, in the order given, before any -f file.
    #[arg(short = 'e', long = "execute", value_name = "SQL")]
    pub execute: Vec<String>,
    /// A file of statements to run after the -e scripts. A long one (a dump to load) is
    /// sent in pieces of whole statements on the same session, so its size is not
    /// bound by the node's --max-message-bytes; errors still name their statement and
    /// line in the file.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// How to print results.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// When a write is refused because this node receives the table (25006), move the
    /// session to the table's master (the node names it) and go on there from that
    /// statement — only while no transaction or CALL setting ties the session to its
    /// node. Statements after the move, reads included, run on the master.
    #[arg(long, env = "HAWSER_FOLLOW_MASTER")]
    pub follow_master: bool,
}

/// A script and where it came from, for error messages.
struct Script {
    source: String,
    sql: String,
}

/// Runs `hawser sql`. Exit status 1 on a statement error, a lost or refused connection, or
/// an unreadable file.
pub async fn run(args: SqlArgs) -> anyhow::Result<ExitCode> {
    let mut scripts: Vec<Script> = args
        .execute
        .iter()
        .enumerate()
        .map(|(i, sql)| Script {
            source: format!("-e #{}", i + 1),
            sql: sql.clone(),
        })
        .collect();
    // Read the file before connecting, so a typo in its name costs no connection.
    if let Some(path) = &args.file {
        let sql = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read SQL file {}", path.display()))?;
        scripts.push(Script {
            source: path.display().to_string(),
            sql,
        });
    }
    let interactive = scripts.is_empty() && io::stdin().is_terminal();
    if scripts.is_empty() && !interactive {
        let mut sql = String::new();
        io::stdin()
            .read_to_string(&mut sql)
            .context("cannot read SQL from standard input")?;
        scripts.push(Script {
            source: "standard input".into(),
            sql,
        });
    }

    let mut conn = match open_session(&args.host).await {
        Ok(session) => Conn::new(session, &args.host, args.follow_master),
        Err(e) => {
            eprintln!("error: {}", connect_error_text(&args.host, &e));
            return Ok(ExitCode::FAILURE);
        }
    };
    let mut printer = Printer {
        format: args.format,
        out: io::stdout(),
    };

    if interactive {
        return shell(&mut conn, &mut printer).await;
    }
    let numbered = scripts.len() > 1;
    let (mut in_transaction, mut left_open) = (false, false);
    for script in &scripts {
        // A long script (a dump to load) goes in pieces of whole statements, one after
        // the other in the same session: errors still name their place in the script.
        for piece in pieces(&script.sql, MAX_REQUEST_SQL) {
            let mut outcome = match conn.execute(piece.sql).await {
                Ok(outcome) => outcome,
                Err(e) => {
                    eprintln!("{}", session_failure_text(&conn.host, &e));
                    return Ok(ExitCode::FAILURE);
                }
            };
            if let Some(e) = &mut outcome.error {
                if e.statement > 0 {
                    e.statement += piece.statements_before;
                }
                e.line = e.line.map(|l| l + piece.lines_before);
            }
            in_transaction = outcome.in_transaction;
            left_open = outcome.left_open;
            let source = numbered.then_some(script.source.as_str());
            if !printer.outcome(&outcome, source)? {
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    if left_open {
        eprintln!("warning: {LEFT_OPEN_ENDED}");
    } else if in_transaction {
        eprintln!("warning: the input ended inside a transaction; it was rolled back");
    }
    Ok(ExitCode::SUCCESS)
}

async fn open_session(host: &str) -> Result<Session, ClientError> {
    Client::connect(host).await?.session().await
}

/// The most times one request's session moves to a table's master: a cluster in the
/// middle of a failover may name a master that has just lost the role.
const MAX_MOVES: usize = 3;

/// The session and the node it is on; it moves to a table's master after a refused
/// write where nothing ties it to its node ([`follow_master`]).
struct Conn {
    session: Session,
    host: String,
    /// Whether the session holds state that would not move with it: a transaction, or
    /// a setting a `CALL` made (ttRepSyncSet). Without `--follow-master` it never moves.
    pinned: bool,
}

impl Conn {
    fn new(session: Session, host: &str, follow: bool) -> Self {
        Conn {
            session,
            host: host.to_string(),
            pinned: !follow,
        }
    }

    /// Runs `sql`, moving to a table's master (and going on there from the refused
    /// statement) when [`follow_master`] says so. Statements and lines are numbered
    /// from the start of `sql` wherever they ran.
    async fn execute(&mut self, sql: &str) -> Result<ScriptOutcome, ClientError> {
        let mut done: Vec<StatementResult> = Vec::new();
        let (mut rest, mut statements_before) = (sql.to_string(), 0u32);
        for moves in 0..=MAX_MOVES {
            let mut outcome = self.session.execute(&rest).await?;
            self.pinned |= outcome.in_transaction
                || outcome
                    .results
                    .iter()
                    .any(|r| matches!(r.tag.as_str(), "BEGIN" | "CALL"));
            let target = (moves < MAX_MOVES)
                .then(|| follow_master(outcome.error.as_ref(), self.pinned))
                .flatten()
                .and_then(|(addr, statement)| {
                    Some((addr, statement, from_statement(&rest, statement)?))
                });
            if let Some((addr, statement, resumed)) = target {
                let e = outcome.error.as_ref().expect("follow_master saw an error");
                match open_session(&addr).await {
                    Ok(session) => {
                        eprintln!(
                            "note: statement {} writes a table store {} masters (epoch {}); \
                             the session moves from {} to {addr} and goes on there",
                            statements_before + statement,
                            e.master_store,
                            e.master_epoch,
                            self.host
                        );
                        done.append(&mut outcome.results);
                        statements_before += statement - 1;
                        rest = resumed;
                        self.session = session;
                        self.host = addr;
                        continue;
                    }
                    Err(err) => eprintln!(
                        "note: store {} masters the table, but {}",
                        e.master_store,
                        connect_error_text(&addr, &err)
                    ),
                }
            }
            if let Some(e) = &mut outcome.error {
                if e.statement > 0 {
                    e.statement += statements_before;
                }
            }
            done.append(&mut outcome.results);
            outcome.results = done;
            return Ok(outcome);
        }
        unreachable!("the last try never moves")
    }
}

/// Where the rest of a request goes after `error`: the address of the table's master
/// and the (1-based) statement to go on from there, when the statement was a write
/// refused because this node receives the table (25006, which did nothing here), the
/// node named the master, and the session is not `pinned` (nothing of it would be lost
/// by moving: each statement before the refused one ran and committed on its own).
fn follow_master(error: Option<&v1::SqlError>, pinned: bool) -> Option<(String, u32)> {
    let e = error?;
    (e.code == "25006" && !e.master_addr.is_empty() && e.statement > 0 && !pinned)
        .then(|| (e.master_addr.clone(), e.statement))
}

/// `sql` from its `statement`-th statement (1-based, counting statements that hold
/// code, as a node does), with what comes before it blanked to newlines and spaces so
/// that a node numbers its lines and columns as in `sql`. `None` when `sql` has fewer
/// statements.
fn from_statement(sql: &str, statement: u32) -> Option<String> {
    let mut ends: Vec<usize> = Vec::new();
    let mut has_code = false;
    walk_code(sql, |i, c| {
        if c == ';' {
            if has_code {
                ends.push(i + 1);
            }
            has_code = false;
        } else if !c.is_whitespace() {
            has_code = true;
        }
    });
    let statements = ends.len() + usize::from(has_code);
    if statement == 0 || statement as usize > statements {
        return None;
    }
    let start = match statement {
        1 => 0,
        k => *ends.get(k as usize - 2)?,
    };
    let blanked: String = sql[..start]
        .chars()
        .map(|c| if c == '\n' { '\n' } else { ' ' })
        .collect();
    Some(blanked + &sql[start..])
}

/// Why a session call failed. Any failure ends the session's stream, and with it the
/// transaction; a status the server attached a SQLSTATE to reads `error[CODE]: message`.
fn session_failure_text(host: &str, e: &ClientError) -> String {
    match e {
        ClientError::Status(s) if hawser_client::sqlstate(s).is_some() => {
            format!("{e} (the session with {host} ended)")
        }
        _ => format!("error: the session with {host} ended: {}", error_text(e)),
    }
}

/// Prints results in the chosen format: results on stdout, warnings and errors on stderr.
struct Printer<W: Write> {
    format: Format,
    out: W,
}

impl<W: Write> Printer<W> {
    /// Prints what a script did, then the error that stopped it if any; returns whether the
    /// script succeeded. `source` names the script in the error when there are several.
    fn outcome(&mut self, outcome: &ScriptOutcome, source: Option<&str>) -> io::Result<bool> {
        for result in &outcome.results {
            self.result(result)?;
        }
        self.out.flush()?;
        match &outcome.error {
            Some(e) => {
                eprintln!("{}", error_line(e, source));
                Ok(false)
            }
            None => Ok(true),
        }
    }

    fn result(&mut self, r: &StatementResult) -> io::Result<()> {
        match self.format {
            Format::Json => writeln!(self.out, "{}", result_json(r)),
            Format::Table => {
                self.out.write_all(result_text(r).as_bytes())?;
                for w in &r.warnings {
                    eprintln!("warning[{}]: {}", w.code, w.message);
                }
                Ok(())
            }
        }
    }
}

/// The text form of one result: a table and a `(N rows)` footer for a query, the tag and
/// the count for DML (`INSERT 3`), the tag alone for anything else.
fn result_text(r: &StatementResult) -> String {
    if r.columns.is_empty() && r.tag != "SELECT" {
        return match r.tag.as_str() {
            "INSERT" | "UPDATE" | "DELETE" => format!("{} {}\n", r.tag, r.rows_affected),
            tag => format!("{tag}\n"),
        };
    }
    let headers: Vec<String> = r.columns.iter().map(|c| c.name.clone()).collect();
    let aligns: Vec<Align> = (0..headers.len())
        .map(|i| {
            let mut values = r
                .rows
                .iter()
                .filter_map(|row| row.get(i))
                .filter(|v| !v.is_null());
            let mut any = false;
            let numeric = values.all(|v| {
                any = true;
                output::is_numeric(v)
            });
            if any && numeric {
                Align::Right
            } else {
                Align::Left
            }
        })
        .collect();
    let rows: Vec<Vec<String>> = r
        .rows
        .iter()
        .map(|row| row.iter().map(output::cell_text).collect())
        .collect();
    let mut text = output::render_table(&headers, &aligns, &rows);
    let n = r.rows.len();
    text.push_str(&format!(
        "({n} {})\n\n",
        if n == 1 { "row" } else { "rows" }
    ));
    text
}

/// The JSON form of one result, one line.
fn result_json(r: &StatementResult) -> serde_json::Value {
    json!({
        "tag": r.tag,
        "columns": r.columns.iter()
            .map(|c| json!({"name": c.name, "type": c.data_type}))
            .collect::<Vec<_>>(),
        "rows": r.rows.iter()
            .map(|row| row.iter().map(output::value_json).collect::<Vec<_>>())
            .collect::<Vec<_>>(),
        "rows_affected": r.rows_affected,
        "warnings": r.warnings.iter()
            .map(|w| json!({"code": w.code, "message": w.message}))
            .collect::<Vec<_>>(),
    })
}

/// `error[CODE]: message (statement N, line L, column C)`, each part of the position only
/// where the server knew it; `source` names the script when there are several.
fn error_line(e: &v1::SqlError, source: Option<&str>) -> String {
    let mut place = Vec::new();
    if e.statement > 0 {
        place.push(format!("statement {}", e.statement));
    }
    if let Some(line) = e.line {
        place.push(format!("line {line}"));
    }
    if let Some(column) = e.column {
        place.push(format!("column {column}"));
    }
    let mut text = format!("error[{}]: {}", e.code, e.message);
    match (source, place.is_empty()) {
        (Some(src), true) => text.push_str(&format!(" (in {src})")),
        (Some(src), false) => text.push_str(&format!(" (in {src}: {})", place.join(", "))),
        (None, false) => text.push_str(&format!(" ({})", place.join(", "))),
        (None, true) => {}
    }
    text
}

// ------------------------------------------------------------------ the interactive shell

const HELP: &str = "\
Type SQL statements ending with `;` (they may span lines); BEGIN ... COMMIT spans statements.
  \\q, quit, exit, Ctrl-D   leave (an open transaction is rolled back; a TWOSAFE commit
                           left open by LOCAL COMMIT ACTION NO ACTION stays committed)
  Ctrl-C                   discard the statement being typed
  \\?, help                 this text";

/// A shell command recognised at the start of a statement.
#[derive(Debug, PartialEq, Eq)]
enum Meta {
    Quit,
    Help,
}

fn meta_command(line: &str) -> Option<Meta> {
    let word = line.trim().trim_end_matches(';').trim_end();
    match word.to_ascii_lowercase().as_str() {
        "\\q" | "quit" | "exit" => Some(Meta::Quit),
        "\\?" | "help" => Some(Meta::Help),
        _ => None,
    }
}

/// Runs the interactive shell until the user leaves or the connection is lost.
async fn shell<W: Write>(conn: &mut Conn, printer: &mut Printer<W>) -> anyhow::Result<ExitCode> {
    eprintln!(
        "connected to hawser at {}; \\? for help, \\q to leave",
        conn.host
    );
    let (inputs_tx, mut inputs) = mpsc::channel::<String>(1);
    let (states, states_rx) = std_mpsc::channel::<bool>();
    let editor = std::thread::Builder::new()
        .name("line-editor".into())
        .spawn(move || line_editor(history_file(), inputs_tx, states_rx))
        .context("cannot start the line editor")?;

    let mut lost = false;
    let (mut in_transaction, mut left_open) = (false, false);
    while let Some(sql) = inputs.recv().await {
        match conn.execute(&sql).await {
            Ok(outcome) => {
                in_transaction = outcome.in_transaction;
                left_open = outcome.left_open;
                printer.outcome(&outcome, None)?;
            }
            Err(e) => {
                eprintln!("{}", session_failure_text(&conn.host, &e));
                lost = true;
                break;
            }
        }
        if states.send(in_transaction).is_err() {
            break; // The editor is gone; its error, if any, comes from the join below.
        }
    }
    // Dropping our ends stops the editor if it is waiting for us; it then saves history.
    drop(states);
    drop(inputs);
    let joined = tokio::task::spawn_blocking(move || editor.join()).await?;
    match joined {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e).context("line editor failed"),
        Err(_) => anyhow::bail!("the line editor panicked"),
    }
    if lost {
        return Ok(ExitCode::FAILURE);
    }
    if left_open {
        eprintln!("warning: {LEFT_OPEN_ENDED}");
    } else if in_transaction {
        eprintln!("warning: the open transaction was rolled back");
    }
    Ok(ExitCode::SUCCESS)
}

/// What ending a session with a commit left open does.
const LEFT_OPEN_ENDED: &str = "the session ended with a RETURN TWOSAFE commit left open by \
    LOCAL COMMIT ACTION NO ACTION (TT8170 above): it is committed on the node and reaches \
    the subscriber when it catches up";

/// `~/.hawser_history` when the home directory is known and the file can be written;
/// otherwise the shell keeps history for the session only.
fn history_file() -> Option<PathBuf> {
    let path = Path::new(&std::env::var_os("HOME")?).join(".hawser_history");
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&path)
        .ok()?;
    Some(path)
}

/// The blocking side of the shell: reads lines until a statement is complete, hands it over
/// and waits for the transaction state to show in the next prompt.
fn line_editor(
    history: Option<PathBuf>,
    inputs: mpsc::Sender<String>,
    states: std_mpsc::Receiver<bool>,
) -> rustyline::Result<()> {
    let mut editor = rustyline::DefaultEditor::new()?;
    if let Some(path) = &history {
        // A missing or unreadable history file only means no history yet.
        let _ = editor.load_history(path);
    }
    let mut buffer = String::new();
    let mut in_transaction = false;
    loop {
        let prompt = prompt(in_transaction, !buffer.is_empty());
        let line = match editor.readline(prompt) {
            Ok(line) => line,
            Err(ReadlineError::Interrupted) => {
                buffer.clear();
                continue;
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e),
        };
        if buffer.is_empty() {
            match meta_command(&line) {
                Some(Meta::Quit) => break,
                Some(Meta::Help) => {
                    eprintln!("{HELP}");
                    continue;
                }
                None => {}
            }
            if line.trim().is_empty() {
                continue;
            }
        } else {
            buffer.push('\n');
        }
        buffer.push_str(&line);
        if !statement_complete(&buffer) {
            continue;
        }
        let _ = editor.add_history_entry(buffer.as_str());
        if inputs.blocking_send(std::mem::take(&mut buffer)).is_err() {
            break;
        }
        match states.recv() {
            Ok(state) => in_transaction = state,
            Err(_) => break, // The session ended (connection lost).
        }
    }
    if let Some(path) = &history {
        // History is a convenience: failing to save it must not fail the session.
        let _ = editor.save_history(path);
    }
    Ok(())
}

/// `hawser> `, `hawser*> ` inside a transaction, and a continuation prompt of the same width
/// while a statement is incomplete.
fn prompt(in_transaction: bool, continuing: bool) -> &'static str {
    match (in_transaction, continuing) {
        (false, false) => "hawser> ",
        (true, false) => "hawser*> ",
        (false, true) => "     -> ",
        (true, true) => "      *> ",
    }
}

/// Whether `sql` ends with a `;` that is outside quotes and comments (comments and blanks
/// may follow it).
fn statement_complete(sql: &str) -> bool {
    let mut ends_with_semicolon = false;
    let outside = walk_code(sql, |_, c| {
        if c == ';' {
            ends_with_semicolon = true;
        } else if !c.is_whitespace() {
            ends_with_semicolon = false;
        }
    });
    ends_with_semicolon && outside
}

/// Walks `sql`, calling `code(i, c)` for each character outside literals and comments
/// (with its byte offset), and for the quote that opens a literal; returns whether the
/// walk ended outside a literal and a block comment. Understands `'...'` with `''`
/// escapes, `"..."` identifiers, `-- ...` line comments and nested `/* ... */` block
/// comments.
fn walk_code(sql: &str, mut code: impl FnMut(usize, char)) -> bool {
    #[derive(PartialEq)]
    enum State {
        Code,
        Single,
        Double,
        Line,
        Block(u32),
    }
    let mut state = State::Code;
    let mut chars = sql.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let next = chars.peek().map(|(_, n)| *n);
        match state {
            State::Code => match c {
                '-' if next == Some('-') => {
                    chars.next();
                    state = State::Line;
                }
                '/' if next == Some('*') => {
                    chars.next();
                    state = State::Block(1);
                }
                _ => {
                    code(i, c);
                    if c == '\'' {
                        state = State::Single;
                    } else if c == '"' {
                        state = State::Double;
                    }
                }
            },
            // A doubled quote inside a literal closes and reopens it, which this handles
            // as two transitions with the same result.
            State::Single if c == '\'' => state = State::Code,
            State::Double if c == '"' => state = State::Code,
            State::Line if c == '\n' => state = State::Code,
            State::Block(depth) => {
                if c == '*' && next == Some('/') {
                    chars.next();
                    state = if depth == 1 {
                        State::Code
                    } else {
                        State::Block(depth - 1)
                    };
                } else if c == '/' && next == Some('*') {
                    chars.next();
                    state = State::Block(depth + 1);
                }
            }
            State::Single | State::Double | State::Line => {}
        }
    }
    matches!(state, State::Code | State::Line)
}

/// The most SQL one request carries: a node refuses messages over its
/// `--max-message-bytes` (16 MiB by default), so a longer script goes in pieces — small
/// enough for a node whose limit was lowered, large enough that a request costs nothing
/// next to the statements it carries.
const MAX_REQUEST_SQL: usize = 1024 * 1024;

/// A piece of a script sent in one request, with the statements and lines of the script
/// before it (a node numbers statements and lines from the start of each request).
#[derive(Debug, PartialEq, Eq)]
struct Piece<'a> {
    sql: &'a str,
    statements_before: u32,
    lines_before: u64,
}

/// `script` cut after whole statements into pieces of at most `max` bytes where it can
/// be (a single statement longer than that stays whole).
fn pieces(script: &str, max: usize) -> Vec<Piece<'_>> {
    let piece = |sql, statements_before, lines_before| Piece {
        sql,
        statements_before,
        lines_before,
    };
    if script.len() <= max {
        return vec![piece(script, 0, 0)];
    }
    // Where each statement ends, and whether it holds anything but blanks and comments
    // (a node does not count those).
    let mut ends: Vec<(usize, bool)> = Vec::new();
    let mut has_code = false;
    walk_code(script, |i, c| {
        if c == ';' {
            ends.push((i + 1, has_code));
            has_code = false;
        } else if !c.is_whitespace() {
            has_code = true;
        }
    });
    ends.push((script.len(), has_code));
    let mut out = Vec::new();
    let (mut start, mut statements, mut lines) = (0usize, 0u32, 0u64);
    // The end of the last statement in the current piece, and how many it counts.
    let (mut cut, mut counted) = (0usize, 0u32);
    for (end, real) in ends {
        if end - start > max && cut > start {
            out.push(piece(&script[start..cut], statements, lines));
            lines += script[start..cut].matches('\n').count() as u64;
            statements += counted;
            (start, counted) = (cut, 0);
        }
        cut = end;
        counted += u32::from(real);
    }
    if start < script.len() {
        out.push(piece(&script[start..], statements, lines));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hawser_core::Value;

    #[test]
    fn a_long_script_is_cut_after_whole_statements_and_keeps_its_numbering() {
        let script = "insert into t values (1, 'a;b');\n-- c;\ninsert into t values (2, 'x');\n\
                      /* ; */ insert into t values (3, 'y'); insert into t values (4, 'z');\n";
        assert_eq!(pieces(script, script.len()).len(), 1, "short enough: whole");
        let cut = pieces(script, 40);
        let joined: String = cut.iter().map(|p| p.sql).collect();
        assert_eq!(joined, script, "nothing lost or doubled");
        for p in &cut {
            assert!(p.sql.len() <= 40, "{p:?}");
            assert!(
                p.sql.trim().is_empty() || p.sql.trim_end().ends_with(';'),
                "{p:?}"
            );
        }
        assert_eq!(
            cut.iter()
                .map(|p| (p.statements_before, p.lines_before))
                .collect::<Vec<_>>(),
            vec![(0, 0), (1, 0), (2, 2), (3, 3)],
            "{cut:?}"
        );
        assert!(cut[1].sql.contains("(2, 'x')"), "{cut:?}");
        // A statement longer than the limit goes whole.
        let long = format!("insert into t values (1, '{}'); select 1;", "x".repeat(100));
        let cut = pieces(&long, 50);
        assert_eq!(cut.len(), 2, "{cut:?}");
        assert!(cut[0].sql.ends_with("');"), "{cut:?}");
        assert_eq!((cut[1].statements_before, cut[1].sql), (1, " select 1;"));
    }

    #[test]
    fn a_statement_is_complete_at_a_semicolon_outside_quotes_and_comments() {
        assert!(statement_complete("select 1;"));
        assert!(statement_complete("select 1;  \n"));
        assert!(statement_complete("select 1; -- trailing comment"));
        assert!(statement_complete("select 1; /* note */"));
        assert!(statement_complete("insert into t values ('a;b');"));
        assert!(statement_complete("insert into t values ('it''s');"));
        assert!(statement_complete("select 1; select 2;"));

        assert!(!statement_complete("select 1"));
        assert!(!statement_complete("select 1; select 2"));
        assert!(!statement_complete("insert into t values ('a;"));
        assert!(!statement_complete("insert into t values ('it'';"));
        assert!(!statement_complete("select \"odd;"));
        assert!(!statement_complete("select 1 -- not the end;"));
        assert!(!statement_complete("select 1 /* ; */"));
        assert!(!statement_complete("select 1; /* unfinished"));
        assert!(!statement_complete("select 1 /* outer /* inner */ ; */"));
        assert!(statement_complete("select 1 /* outer /* inner */ */;"));
        assert!(!statement_complete(""));
    }

    #[test]
    fn a_comment_line_then_a_statement_completes_on_a_later_line() {
        assert!(!statement_complete("-- first a comment;"));
        assert!(statement_complete("-- first a comment;\nselect 1;"));
    }

    #[test]
    fn a_refused_write_moves_the_session_to_the_master_unless_something_pins_it() {
        let refused = v1::SqlError {
            code: "25006".into(),
            message: "table t is received here".into(),
            statement: 2,
            master_addr: "10.0.0.2:7420".into(),
            master_store: "ds2".into(),
            master_epoch: 3,
            ..Default::default()
        };
        assert_eq!(
            follow_master(Some(&refused), false),
            Some(("10.0.0.2:7420".into(), 2))
        );
        assert_eq!(follow_master(Some(&refused), true), None, "pinned");
        let unknown = v1::SqlError {
            master_addr: String::new(),
            ..refused.clone()
        };
        assert_eq!(
            follow_master(Some(&unknown), false),
            None,
            "no master known"
        );
        let other = v1::SqlError {
            code: "23505".into(),
            ..refused
        };
        assert_eq!(follow_master(Some(&other), false), None);
        assert_eq!(follow_master(None, false), None);
    }

    #[test]
    fn the_rest_of_a_script_keeps_its_lines_and_columns() {
        let sql = "insert into a values (1);\n -- x;\n insert into t values ('a;b'); insert into t values (3);";
        assert_eq!(from_statement(sql, 1).as_deref(), Some(sql));
        let second = from_statement(sql, 2).expect("two statements");
        assert_eq!(second.len(), sql.len());
        assert_eq!(second.lines().count(), sql.lines().count());
        assert_eq!(second.trim_start(), &sql[sql.find("-- x").unwrap()..]);
        let third = from_statement(sql, 3).expect("three statements");
        assert_eq!(third.trim_start(), "insert into t values (3);");
        assert_eq!(third.find("insert"), sql.rfind("insert"));
        assert_eq!(from_statement(sql, 4), None);
        assert_eq!(from_statement(sql, 0), None);
    }

    #[test]
    fn meta_commands_are_recognised() {
        assert_eq!(meta_command("\\q"), Some(Meta::Quit));
        assert_eq!(meta_command("  QUIT; "), Some(Meta::Quit));
        assert_eq!(meta_command("exit"), Some(Meta::Quit));
        assert_eq!(meta_command("help"), Some(Meta::Help));
        assert_eq!(meta_command("select 1;"), None);
        assert_eq!(meta_command("exit_code;"), None);
    }

    fn column(name: &str, data_type: &str) -> v1::Column {
        v1::Column {
            name: name.into(),
            data_type: data_type.into(),
            nullable: true,
        }
    }

    fn select_result() -> StatementResult {
        StatementResult {
            tag: "SELECT".into(),
            columns: vec![column("id", "BIGINT"), column("name", "VARCHAR(10)")],
            rows: vec![
                vec![Value::Int(1), Value::Text("alice".into())],
                vec![Value::Int(20), Value::Null],
            ],
            rows_affected: 2,
            warnings: vec![],
        }
    }

    #[test]
    fn select_prints_a_table_with_a_row_count() {
        let expected = concat!(
            " id | name\n",
            "----+-------\n",
            "  1 | alice\n",
            " 20 | NULL\n",
            "(2 rows)\n",
            "\n",
        );
        assert_eq!(result_text(&select_result()), expected);
        let one = StatementResult {
            rows: vec![vec![Value::Int(1)]],
            ..select_result()
        };
        assert!(result_text(&one).ends_with("(1 row)\n\n"));
    }

    #[test]
    fn dml_prints_tag_and_count_and_ddl_the_tag() {
        let insert = StatementResult {
            tag: "INSERT".into(),
            columns: vec![],
            rows: vec![],
            rows_affected: 3,
            warnings: vec![],
        };
        assert_eq!(result_text(&insert), "INSERT 3\n");
        let create = StatementResult {
            tag: "CREATE TABLE".into(),
            rows_affected: 0,
            ..insert
        };
        assert_eq!(result_text(&create), "CREATE TABLE\n");
    }

    #[test]
    fn json_result_has_columns_rows_count_and_warnings() {
        let mut r = select_result();
        r.warnings.push(v1::Warning {
            code: "01004".into(),
            message: "truncated".into(),
        });
        let line = result_json(&r).to_string();
        assert!(!line.contains('\n'));
        let parsed: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            parsed,
            json!({
                "tag": "SELECT",
                "columns": [{"name": "id", "type": "BIGINT"}, {"name": "name", "type": "VARCHAR(10)"}],
                "rows": [[1, "alice"], [20, null]],
                "rows_affected": 2,
                "warnings": [{"code": "01004", "message": "truncated"}],
            })
        );
    }

    #[test]
    fn errors_name_code_and_position_where_known() {
        let e = v1::SqlError {
            code: "42601".into(),
            message: "syntax error".into(),
            statement: 2,
            line: Some(3),
            column: Some(7),
            ..Default::default()
        };
        assert_eq!(
            error_line(&e, None),
            "error[42601]: syntax error (statement 2, line 3, column 7)"
        );
        assert_eq!(
            error_line(&e, Some("-e #2")),
            "error[42601]: syntax error (in -e #2: statement 2, line 3, column 7)"
        );
        let status = ClientError::SessionClosed;
        assert_eq!(
            session_failure_text("h:1", &status),
            "error: the session with h:1 ended: the session stream ended"
        );
        let bare = v1::SqlError {
            statement: 0,
            line: None,
            column: None,
            ..e
        };
        assert_eq!(error_line(&bare, None), "error[42601]: syntax error");
    }

    #[test]
    fn printer_reports_failure_after_printing_earlier_results() {
        let outcome = ScriptOutcome {
            results: vec![select_result()],
            error: Some(v1::SqlError {
                code: "42P01".into(),
                message: "no such table".into(),
                statement: 2,
                line: None,
                column: None,
                ..Default::default()
            }),
            in_transaction: false,
            left_open: false,
        };
        let mut printer = Printer {
            format: Format::Json,
            out: Vec::new(),
        };
        assert!(!printer.outcome(&outcome, None).unwrap());
        let text = String::from_utf8(printer.out).unwrap();
        assert_eq!(text.lines().count(), 1);
        assert!(text.contains("\"alice\""));
    }
}
