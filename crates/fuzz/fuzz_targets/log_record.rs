//! Bytes as they come off disk → the store's decoders (`hawser_store::fuzzing`): a commit
//! log record (whole, and its head alone, as reopening reads high-water marks), a stored
//! row, a table's and a sequence's catalog entry, and a write-ahead log frame's batch.
//! The first byte picks the decoder. An error (`XX001` corrupt) is fine; a panic, a hang
//! or running out of memory is a failure, and so is a record that decodes but does not
//! encode back to the same bytes, or whose head disagrees with it.
#![no_main]

use hawser_store::fuzzing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, bytes)) = data.split_first() else {
        return;
    };
    match mode % 5 {
        0 => {
            let head = fuzzing::record_head(bytes);
            if let Ok(record) = fuzzing::decode_record(bytes) {
                assert_eq!(fuzzing::encode_record(&record), bytes, "record");
                let (gtid, micros, ddl) = head.expect("a record that decodes has a head");
                assert_eq!(gtid, record.gtid());
                assert_eq!(micros, record.entry.commit_micros());
                assert_eq!(
                    ddl,
                    matches!(record.entry, hawser_store::LogEntry::Ddl { .. })
                );
            }
        }
        1 => {
            if let Ok(row) = fuzzing::decode_row(bytes) {
                assert_eq!(fuzzing::encode_row(&row), bytes, "row");
            }
        }
        2 => {
            if let Ok((id, version, def)) = fuzzing::decode_table(bytes) {
                assert_eq!(fuzzing::encode_table(id, version, &def), bytes, "table");
            }
        }
        3 => {
            if let Ok((def, restart_at)) = fuzzing::decode_sequence(bytes) {
                assert_eq!(
                    fuzzing::encode_sequence(&def, restart_at),
                    bytes,
                    "sequence"
                );
            }
        }
        _ => {
            if let Ok(batch) = fuzzing::decode_wal_batch(bytes) {
                assert_eq!(fuzzing::encode_wal_batch(&batch), bytes, "batch");
            }
        }
    }
});
