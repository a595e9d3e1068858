//! Any input, valid UTF-8 or not, must go through the parser, validator, ALTER
//! application, printer and report rendering without panicking; and whatever parses must
//! print to text that parses back to the same statements.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let report = hawser_scheme::check_source("fuzz.sql", &text);
    let _ = report.render_text();
    let _ = report.to_json();
    if let Ok(statements) = hawser_scheme::parse(&text) {
        let printed = hawser_scheme::print_statements(&statements);
        let again = hawser_scheme::parse(&printed).expect("canonical text parses");
        assert_eq!(again, statements);
    }
});
