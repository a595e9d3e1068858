//! SQL text → `hawser_sql::Session::execute` on a fresh in-memory database seeded with
//! tables, rows and a sequence (`hawser_fuzz::SQL_SEED`), on a 2 MiB tokio worker stack
//! as in a node. An error outcome is fine; a panic, a stack overflow, an abort, a hang
//! (past libFuzzer's `-timeout`) or running out of memory is a failure.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // A client's text arrives as a protobuf string: only valid UTF-8 gets this far.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    hawser_fuzz::run_sql(text.to_owned());
});
