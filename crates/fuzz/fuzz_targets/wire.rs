//! Bytes from a peer → the replication data plane's decoders (`hawser_stream`): the
//! batch codec (`decode_records`, `decode_table_def`, `decompress`), the protobuf
//! messages of the Replicate and Copy streams as a receiver takes them (a `Batch` through
//! the chunk `Joiner`, then decompressed and decoded; a `Hello`'s table definitions; a
//! `CopyRows` through `copy::decode_rows`). The first byte picks the entry point.
//! Errors are fine; a panic, a hang or running out of memory is a failure, and so is a
//! batch that decodes but does not encode back to the same bytes.
#![no_main]

use hawser_stream::chunks::Joiner;
use hawser_stream::codec::{self, Compression};
use hawser_stream::pb;
use libfuzzer_sys::fuzz_target;
use prost::Message;

/// What a receiver takes as one batch at most by default (`max_transaction_bytes`).
const MAX_BATCH: u64 = codec::MAX_RAW_BATCH;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 6 {
        0 => records(rest),
        1 => {
            if let Ok(def) = codec::decode_table_def(rest) {
                assert_eq!(codec::encode_table_def(&def), rest, "table definition");
            }
        }
        2 => {
            // [codec][raw size, u32 little endian][payload], as a Batch carries them.
            let Some((&c, rest)) = rest.split_first() else {
                return;
            };
            let (Some(size), Some(payload)) = (rest.get(..4), rest.get(4..)) else {
                return;
            };
            let size = u32::from_le_bytes([size[0], size[1], size[2], size[3]]);
            let codec = [Compression::None, Compression::Lz4, Compression::Zstd][c as usize % 3];
            if let Ok(raw) = codec::decompress(codec, payload, u64::from(size)) {
                let _ = codec::decode_records(&raw);
            }
        }
        3 => {
            if let Ok(msg) = pb::SenderMessage::decode(rest) {
                sender_message(msg, &mut Joiner::new(MAX_BATCH));
            }
        }
        4 => {
            if let Ok(pb::CopyMessage {
                msg: Some(pb::copy_message::Msg::Rows(rows)),
            }) = pb::CopyMessage::decode(rest)
            {
                let _ = hawser_stream::copy::decode_rows(&rows);
            }
        }
        _ => {
            // A stream: length-delimited SenderMessages through one Joiner.
            let mut joiner = Joiner::new(MAX_BATCH);
            let mut buf = rest;
            while let Ok(msg) = pb::SenderMessage::decode_length_delimited(&mut buf) {
                sender_message(msg, &mut joiner);
            }
        }
    }
});

/// Decodes a batch's raw bytes; what decodes must encode to the same bytes.
fn records(raw: &[u8]) {
    if let Ok(records) = codec::decode_records(raw) {
        assert_eq!(codec::encode_records(&records), raw, "records");
        let size: u64 = records
            .iter()
            .map(|r| codec::record_size(r.epoch, &r.entry))
            .sum();
        assert_eq!(size + codec::BATCH_HEADER_BYTES, raw.len() as u64);
    }
}

/// What a receiver does with one message of a Replicate stream before applying it.
fn sender_message(msg: pb::SenderMessage, joiner: &mut Joiner) {
    match msg.msg {
        Some(pb::sender_message::Msg::Hello(hello)) => {
            for spec in &hello.tables {
                let _ = codec::decode_table_def(&spec.definition);
            }
        }
        Some(pb::sender_message::Msg::Batch(batch)) => {
            if let Ok(Some(whole)) = joiner.push(batch) {
                let codec = match pb::Codec::try_from(whole.codec) {
                    Ok(pb::Codec::None) => Compression::None,
                    Ok(pb::Codec::Lz4) => Compression::Lz4,
                    Ok(pb::Codec::Zstd) => Compression::Zstd,
                    Err(_) => return,
                };
                if let Ok(raw) = codec::decompress(codec, &whole.payload, whole.raw_bytes) {
                    let _ = codec::decode_records(&raw);
                }
            }
        }
        _ => {}
    }
}
