//! Writes the seed corpora under `corpus/<target>/`: SQL and scheme text taken from the
//! tests of `crates/sql` and `crates/scheme`, and encoded records, rows, catalog
//! entries, protobuf messages and Raft payloads made with hawser's own encoders, each
//! behind the mode byte its target reads first. Existing files are kept; file names are
//! a hash of the content, so running it again adds nothing twice.
//!
//! `cargo run --example seeds` from `crates/fuzz` (a normal build, no fuzzing flags).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use hawser_control::failover::{Echo, HealthReport};
use hawser_control::health::Report;
use hawser_control::state::{ClusterState, Command, FailoverPause, ReceiverState};
use hawser_control::types::{Entry, TypeConfig};
use hawser_control::{
    JoinReply, JoinRequest, Learned, PeerError, Removal, RemovalMode, RemoveRequest, Response,
};
use hawser_core::{
    ChangeOp, ColumnDef, DataType, Epoch, Gtid, Ident, Lsn, NodeId, QualName, RowChange, TableDef,
    Transaction, Value,
};
use hawser_store::{fuzzing, DdlOp, LogEntry, LogRecord, SequenceDef, WriteBatch};
use hawser_stream::codec::{self, Compression, WireRecord};
use hawser_stream::pb;
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use openraft::{CommittedLeaderId, EntryPayload, LogId, Membership, SnapshotMeta, Vote};
use prost::Message;

fn main() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR"));
    let repo = fuzz.join("../..");
    let corpus = fuzz.join("corpus");
    let n = write(&corpus.join("sql"), sql_seeds(&repo));
    println!("sql: {n} new");
    let n = write(&corpus.join("scheme"), scheme_seeds(&repo));
    println!("scheme: {n} new");
    let n = write(&corpus.join("wire"), wire_seeds());
    println!("wire: {n} new");
    let n = write(&corpus.join("log_record"), log_seeds());
    println!("log_record: {n} new");
    let n = write(&corpus.join("raft_payload"), raft_seeds());
    println!("raft_payload: {n} new");
}

/// Writes each seed to `dir` under its content's hash; answers how many were new.
fn write(dir: &Path, seeds: Vec<Vec<u8>>) -> usize {
    fs::create_dir_all(dir).expect("create the corpus directory");
    let mut new = 0;
    for seed in seeds {
        let path: PathBuf = dir.join(format!("{:016x}", fnv(&seed)));
        if !path.exists() {
            fs::write(&path, &seed).expect("write a seed");
            new += 1;
        }
    }
    new
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn with_mode(mode: u8, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![mode];
    out.extend_from_slice(bytes);
    out
}

// ---- text taken from the tests -------------------------------------------------

/// The string literals of a Rust source file (plain and raw), unescaped.
fn literals(source: &str) -> Vec<String> {
    let b = source.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'\'' => {
                // A char literal ('"', '\'') or a lifetime: skip the char literal whole.
                if b.get(i + 2) == Some(&b'\'') {
                    i += 3;
                } else if b.get(i + 1) == Some(&b'\\') && b.get(i + 3) == Some(&b'\'') {
                    i += 4;
                } else {
                    i += 1;
                }
            }
            b'r' if matches!(b.get(i + 1), Some(b'"') | Some(b'#'))
                && (i == 0 || !b[i - 1].is_ascii_alphanumeric()) =>
            {
                let mut j = i + 1;
                let mut hashes = 0;
                while b.get(j) == Some(&b'#') {
                    hashes += 1;
                    j += 1;
                }
                if b.get(j) != Some(&b'"') {
                    i += 1;
                    continue;
                }
                let close = format!("\"{}", "#".repeat(hashes));
                let start = j + 1;
                let Some(len) = source[start..].find(&close) else {
                    break;
                };
                out.push(source[start..start + len].to_string());
                i = start + len + close.len();
            }
            b'"' => {
                let mut s = String::new();
                let mut chars = source[i + 1..].char_indices();
                let mut end = source.len();
                while let Some((k, c)) = chars.next() {
                    match c {
                        '"' => {
                            end = i + 1 + k + 1;
                            break;
                        }
                        '\\' => match chars.next().map(|(_, c)| c) {
                            Some('n') => s.push('\n'),
                            Some('t') => s.push('\t'),
                            Some('0') => s.push('\0'),
                            Some('\n') => {
                                // A line continuation skips the next line's indentation.
                                let rest = chars.as_str();
                                let skip = rest.len() - rest.trim_start().len();
                                for _ in 0..rest[..skip].chars().count() {
                                    chars.next();
                                }
                            }
                            Some(c) => s.push(c),
                            None => {}
                        },
                        c => s.push(c),
                    }
                }
                out.push(s);
                i = end;
            }
            _ => i += 1,
        }
    }
    out
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "rs"));
    files.sort();
    files
}

const SQL_STARTS: &[&str] = &[
    "select",
    "insert",
    "update",
    "delete",
    "create",
    "drop",
    "alter",
    "begin",
    "start",
    "commit",
    "rollback",
    "explain",
    "call",
    "savepoint",
];

fn sql_seeds(repo: &Path) -> Vec<Vec<u8>> {
    let mut found = BTreeSet::new();
    for file in rust_files(&repo.join("crates/sql/tests")) {
        // Its literals are templates of a grammar, not statements.
        if file.ends_with("random_sql.rs") {
            continue;
        }
        let source = fs::read_to_string(&file).expect("read a test file");
        for lit in literals(&source) {
            let lower = lit.trim_start().to_lowercase();
            if lit.len() <= 2000 && SQL_STARTS.iter().any(|k| lower.starts_with(k)) {
                found.insert(lit);
            }
        }
    }
    // Shapes near the complexity limits (crates/sql/src/limits.rs), which tests build
    // with format! rather than write out.
    let chain = |op: &str, n: usize| vec!["1"; n].join(op);
    found.insert(format!("select {}", chain(" + ", 255)));
    found.insert(format!("select * from t where {}", chain(" or k = ", 255)));
    found.insert(format!("select {}1{}", "(".repeat(255), ")".repeat(255)));
    found.insert(format!("select {}true", "not ".repeat(255)));
    found.insert(format!("select {}1{}", "abs(".repeat(200), ")".repeat(200)));
    found.insert(format!(
        "select {}1{}",
        "case when true then ".repeat(100),
        " end".repeat(100)
    ));
    found.insert(format!(
        "explain explain explain select {}",
        chain(" || ", 100)
    ));
    found.insert("insert into t (k, v) values (4, 1 + 1 * 2 - 3 / 4 % 5)".into());
    found.insert("update t set v = v + 1 where k between 1 and 2 returning k".into());
    found.insert("select q.nextval, q.currval from dual; select count(*) from u".into());
    found.into_iter().map(String::into_bytes).collect()
}

fn scheme_seeds(repo: &Path) -> Vec<Vec<u8>> {
    let mut found = BTreeSet::new();
    let fixture = repo.join("crates/scheme/tests/fixtures/timesten-seed.sql");
    let text = fs::read_to_string(fixture).expect("read the scheme fixture");
    for statement in text.split(";\n") {
        let statement = statement.trim();
        if statement.to_uppercase().contains("REPLICATION") {
            found.insert(format!("{statement};"));
        }
    }
    for file in rust_files(&repo.join("crates/scheme/tests")) {
        let source = fs::read_to_string(&file).expect("read a test file");
        for lit in literals(&source) {
            if lit.to_uppercase().contains("REPLICATION") && lit.len() <= 4000 {
                found.insert(lit.replace('§', ""));
            }
        }
    }
    found.insert(hawser_fuzz::SCHEME.trim().to_string());
    found.into_iter().map(String::into_bytes).collect()
}

// ---- records, rows and messages ------------------------------------------------

fn name(n: &str) -> QualName {
    QualName::bare(n)
}

fn table_def() -> TableDef {
    let col = |n: &str, data_type, nullable| ColumnDef {
        name: Ident::unquoted(n),
        data_type,
        nullable,
        default: None,
    };
    let mut with_default = col(
        "d",
        DataType::Decimal {
            precision: Some(10),
            scale: 2,
        },
        true,
    );
    with_default.default = Some(Value::Decimal("1.25".parse().expect("a decimal")));
    TableDef {
        name: QualName::parse_unquoted("app.t"),
        columns: vec![
            col("k", DataType::Integer, false),
            col("s", DataType::Varchar(20), true),
            with_default,
            col("b", DataType::Boolean, true),
            col("ts", DataType::Timestamp, true),
        ],
        primary_key: vec![0],
        explicit_key: true,
    }
}

fn row() -> Vec<Value> {
    vec![
        Value::Int(7),
        Value::Text("héllo".into()),
        Value::Decimal("-12.340".parse().expect("a decimal")),
        Value::Bool(true),
        Value::Timestamp(1_700_000_000_000_000),
    ]
}

fn sequence() -> SequenceDef {
    SequenceDef::with_defaults(name("q"), Some(3), None, Some(1000), Some(5), true)
}

fn entries() -> Vec<LogEntry> {
    let gtid = |seq| Gtid::new(NodeId(1), seq);
    vec![
        LogEntry::Txn(Transaction {
            gtid: gtid(1),
            commit_micros: 1_700_000_000_000_000,
            changes: vec![
                RowChange {
                    table: table_def().name,
                    op: ChangeOp::Insert,
                    key: vec![Value::Int(7)],
                    before: None,
                    after: Some(row()),
                },
                RowChange {
                    table: name("u"),
                    op: ChangeOp::Update,
                    key: vec![Value::Int(1), Value::Text("a".into())],
                    before: Some(vec![Value::Null, Value::Double(1.5), Value::Date(-3)]),
                    after: Some(vec![Value::Bytes(vec![0, 255]), Value::Double(-0.0)]),
                },
                RowChange {
                    table: name("u"),
                    op: ChangeOp::Delete,
                    key: vec![Value::Int(2)],
                    before: Some(vec![Value::Int(2)]),
                    after: None,
                },
            ],
        }),
        LogEntry::Ddl {
            gtid: gtid(2),
            commit_micros: 5,
            op: DdlOp::CreateTable(table_def()),
        },
        LogEntry::Ddl {
            gtid: gtid(3),
            commit_micros: 6,
            op: DdlOp::AddColumn {
                table: name("t"),
                column: table_def().columns[2].clone(),
            },
        },
        LogEntry::Ddl {
            gtid: gtid(4),
            commit_micros: 7,
            op: DdlOp::CreateSequence(sequence()),
        },
        LogEntry::Ddl {
            gtid: gtid(5),
            commit_micros: 8,
            op: DdlOp::DropTable(name("t")),
        },
        LogEntry::SequenceBlock {
            gtid: gtid(6),
            commit_micros: 9,
            name: name("q"),
            restart_at: Some(65),
        },
    ]
}

fn wire_records() -> Vec<WireRecord> {
    entries()
        .into_iter()
        .map(|entry| WireRecord {
            epoch: Epoch(2),
            entry,
        })
        .collect()
}

fn compressed(c: Compression, raw: &[u8]) -> (i32, Vec<u8>) {
    let codec = match c {
        Compression::None => pb::Codec::None,
        Compression::Lz4 => pb::Codec::Lz4,
        Compression::Zstd => pb::Codec::Zstd,
    };
    (codec as i32, codec::compress(c, raw.to_vec()))
}

fn wire_seeds() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    let all = codec::encode_records(&wire_records());
    seeds.push(with_mode(0, &all));
    for r in wire_records() {
        seeds.push(with_mode(0, &codec::encode_records(&[r])));
    }
    seeds.push(with_mode(1, &codec::encode_table_def(&table_def())));
    for (i, c) in [Compression::None, Compression::Lz4, Compression::Zstd]
        .into_iter()
        .enumerate()
    {
        let (_, payload) = compressed(c, &all);
        let mut seed = vec![2, i as u8];
        seed.extend_from_slice(&(all.len() as u32).to_le_bytes());
        seed.extend_from_slice(&payload);
        seeds.push(seed);
    }
    let hello = pb::SenderMessage {
        msg: Some(pb::sender_message::Msg::Hello(pb::Hello {
            protocol_version: 1,
            sender_node: 1,
            sender_store: "masterds".into(),
            receiver_store: "subscriber1".into(),
            tables: vec![pb::TableSpec {
                element: "e".into(),
                definition: codec::encode_table_def(&table_def()),
                ..Default::default()
            }],
            ..Default::default()
        })),
    };
    seeds.push(with_mode(3, &hello.encode_to_vec()));
    let (codec_id, payload) = compressed(Compression::Lz4, &all);
    let batch = pb::Batch {
        through_lsn: 9,
        count: 6,
        codec: codec_id,
        raw_bytes: all.len() as u64,
        payload: payload.into(),
        ..Default::default()
    };
    let message = |b: pb::Batch| pb::SenderMessage {
        msg: Some(pb::sender_message::Msg::Batch(b)),
    };
    seeds.push(with_mode(3, &message(batch.clone()).encode_to_vec()));
    let mut stream = Vec::new();
    message(batch.clone())
        .encode_length_delimited(&mut stream)
        .expect("encode into a Vec");
    for chunk in hawser_stream::chunks::split(batch, 64) {
        message(chunk)
            .encode_length_delimited(&mut stream)
            .expect("encode into a Vec");
    }
    seeds.push(with_mode(5, &stream));
    // A copied table: its definition, then rows; and a copied sequence.
    let copy = |records: Vec<LogEntry>| {
        let refs: Vec<(Epoch, &LogEntry)> = records.iter().map(|e| (Epoch(1), e)).collect();
        let raw = codec::encode_entries(&refs);
        let (codec_id, payload) = compressed(Compression::Zstd, &raw);
        pb::CopyMessage {
            msg: Some(pb::copy_message::Msg::Rows(pb::CopyRows {
                codec: codec_id,
                raw_bytes: raw.len() as u64,
                payload,
                rows: 1,
            })),
        }
        .encode_to_vec()
    };
    let e = entries();
    seeds.push(with_mode(4, &copy(vec![e[1].clone(), e[0].clone()])));
    seeds.push(with_mode(4, &copy(vec![e[3].clone(), e[5].clone()])));
    seeds
}

fn log_seeds() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    for (i, entry) in entries().into_iter().enumerate() {
        let record = LogRecord {
            lsn: Lsn(i as u64 + 1),
            epoch: Epoch(1),
            entry,
        };
        seeds.push(with_mode(0, &fuzzing::encode_record(&record)));
    }
    seeds.push(with_mode(1, &fuzzing::encode_row(&row())));
    seeds.push(with_mode(
        1,
        &fuzzing::encode_row(&[Value::Null, Value::Double(f64::NAN)]),
    ));
    seeds.push(with_mode(2, &fuzzing::encode_table(4, 2, &table_def())));
    seeds.push(with_mode(
        3,
        &fuzzing::encode_sequence(&sequence(), Some(65)),
    ));
    let mut batch = WriteBatch::new();
    batch.put(b"Rkey".to_vec(), fuzzing::encode_row(&row()));
    batch.delete(b"Rgone".to_vec());
    seeds.push(with_mode(4, &fuzzing::encode_wal_batch(&batch)));
    seeds
}

fn json<T: serde::Serialize>(mode: u8, value: &T) -> Vec<u8> {
    with_mode(mode, &serde_json::to_vec(value).expect("serialize to JSON"))
}

fn commands() -> Vec<Command> {
    let mut cmds = vec![
        Command::RegisterNode(hawser_fuzz::node(4, "other")),
        Command::SetMaster {
            scheme: name("r1"),
            element: Ident::unquoted("e"),
            node: NodeId(2),
            epoch: Epoch(2),
            fork_point: Some(Gtid::new(NodeId(1), 10)),
        },
        Command::SetReceiverState {
            scheme: name("r1"),
            store: Ident::unquoted("subscriber2"),
            state: ReceiverState::Pause,
        },
        Command::SetFailoverPause {
            pause: Some(FailoverPause {
                reason: "maintenance".into(),
                since_unix_ms: 1,
            }),
        },
    ];
    cmds.extend(
        Command::from_ddl(
            "ALTER REPLICATION r1 ALTER ELEMENT e DROP SUBSCRIBER subscriber2 ON \"server3\";
             DROP REPLICATION r1;",
        )
        .expect("the seed DDL parses"),
    );
    cmds.extend(Command::from_ddl(hawser_fuzz::SCHEME).expect("the seed scheme parses"));
    cmds
}

fn raft_seeds() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    let leader = CommittedLeaderId::new(3, 1);
    let log_id = |index| LogId::new(leader, index);
    let voters: BTreeSet<u64> = [1, 2].into_iter().collect();
    let membership: Membership<u64, openraft::BasicNode> = Membership::new(
        vec![voters],
        [1u64, 2, 3]
            .into_iter()
            .map(|id| (id, openraft::BasicNode::new(format!("10.0.0.{id}:7000"))))
            .collect::<std::collections::BTreeMap<_, _>>(),
    );
    let mut entries: Vec<Entry> = vec![
        Entry {
            log_id: log_id(10),
            payload: EntryPayload::Blank,
        },
        Entry {
            log_id: log_id(11),
            payload: EntryPayload::Membership(membership.clone()),
        },
    ];
    for (i, cmd) in commands().into_iter().enumerate() {
        entries.push(Entry {
            log_id: log_id(12 + i as u64),
            payload: EntryPayload::Normal(cmd.clone()),
        });
        seeds.push(json(4, &cmd));
    }
    let append: AppendEntriesRequest<TypeConfig> = AppendEntriesRequest {
        vote: Vote::new_committed(3, 1),
        prev_log_id: Some(log_id(9)),
        entries,
        leader_commit: Some(log_id(9)),
    };
    seeds.push(json(0, &append));
    let vote: VoteRequest<u64> = VoteRequest::new(Vote::new(4, 2), Some(log_id(20)));
    seeds.push(json(1, &vote));
    // A snapshot of the seeded cluster in two chunks, one JSON value after the other.
    let state: ClusterState = hawser_fuzz::seeded_cluster();
    let data = serde_json::to_vec(&state).expect("serialize the state");
    seeds.push(with_mode(7, &data));
    let meta: SnapshotMeta<u64, openraft::BasicNode> = SnapshotMeta {
        last_log_id: Some(log_id(30)),
        last_membership: openraft::StoredMembership::new(Some(log_id(11)), membership),
        snapshot_id: "3-1-30-1".into(),
    };
    let half = data.len() / 2;
    let mut chunks = vec![2u8];
    for (offset, part, done) in [(0, &data[..half], false), (half, &data[half..], true)] {
        let req: InstallSnapshotRequest<TypeConfig> = InstallSnapshotRequest {
            vote: Vote::new_committed(3, 1),
            meta: meta.clone(),
            offset: offset as u64,
            data: part.to_vec(),
            done,
        };
        chunks.extend(serde_json::to_vec(&req).expect("serialize a chunk"));
        chunks.push(b'\n');
    }
    seeds.push(chunks);
    seeds.push(json(
        3,
        &JoinRequest {
            node: hawser_fuzz::node(5, "newcomer"),
            fresh: true,
            replace: false,
        },
    ));
    seeds.push(json(5, &3u64));
    seeds.push(json(
        5,
        &RemoveRequest {
            node: NodeId(3),
            mode: RemovalMode::Force,
        },
    ));
    seeds.push(json(
        8,
        &Removal {
            node: NodeId(3),
            cluster_id: 1,
            log_index: 40,
            at_unix_ms: 1_700_000_000_000,
            learned: Learned::Told { by: NodeId(1) },
        },
    ));
    seeds.push(json(
        8,
        &hawser_control::bootstrap::InitIntent {
            from: 2,
            release: false,
        },
    ));
    let report = Report {
        to: NodeId(1),
        health: HealthReport {
            node: NodeId(2),
            own_seq: 40,
            high_water: [(NodeId(1), 99), (NodeId(2), 40)].into_iter().collect(),
            state_version: 7,
            lease_released: false,
            echo: Some(Echo {
                leader: NodeId(1),
                term: 3,
                micros: 8_000_000,
            }),
        },
    };
    seeds.push(json(6, &report));
    let replies: [Vec<u8>; 4] = [
        serde_json::to_vec(&Ok::<_, PeerError>(JoinReply {
            leader: NodeId(1),
            voter: true,
        })),
        serde_json::to_vec(&Ok::<_, PeerError>(Response::Applied { version: 3 })),
        serde_json::to_vec(&Err::<(), _>(PeerError::Failed("no".into()))),
        serde_json::to_vec(&Ok::<_, PeerError>(
            openraft::raft::AppendEntriesResponse::<u64>::Success,
        )),
    ]
    .map(|r| r.expect("serialize a reply"));
    for reply in replies {
        seeds.push(with_mode(9, &reply));
    }
    seeds
}
