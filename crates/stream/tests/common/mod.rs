//! Helpers shared by the stream crate's integration tests.

#![allow(dead_code)]

use hawser_core::{Ident, TableDef};
use hawser_stream::codec::encode_table_def;
use hawser_stream::pb;
use hawser_stream::PROTOCOL_VERSION;

pub fn id(s: &str) -> Ident {
    Ident::unquoted(s)
}

/// The Hello a master (node 1, store `master`) sends to store `s1` for element `e` at
/// epoch 1, carrying `def`, uncompressed, with EXACT table checking.
pub fn hello(def: &TableDef) -> pb::Hello {
    pb::Hello {
        protocol_version: PROTOCOL_VERSION,
        sender_node: 1,
        sender_store: "master".into(),
        receiver_store: "s1".into(),
        scheme_version: 1,
        elements: vec![pb::ElementEpoch {
            element: "e".into(),
            epoch: 1,
        }],
        tables: vec![pb::TableSpec {
            element: "e".into(),
            definition: encode_table_def(def),
            dropped_at: None,
            completing: false,
        }],
        codec: pb::Codec::None as i32,
        table_check: pb::TableCheck::Exact as i32,
        carries_ddl: false,
        returns_wait: true,
        restart_probe: None,
        decided: 0,
        ships_parts: false,
        receiver_node: 0,
    }
}
