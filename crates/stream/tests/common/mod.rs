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

/// The senders a test starts, stopped together.
#[derive(Default)]
pub struct Senders {
    pub tracker: tokio_util::task::TaskTracker,
    pub shutdown: tokio_util::sync::CancellationToken,
}

impl Senders {
    /// A sender of `master` on `link` to `endpoint`, from the log's start.
    pub fn spawn(
        &self,
        link: hawser_stream::LinkConfig,
        master: &hawser_store::Database,
        endpoint: tonic::transport::Endpoint,
    ) -> hawser_stream::SenderHandle {
        self.spawn_from(
            link,
            master,
            endpoint,
            hawser_stream::SenderStart::default(),
        )
    }

    /// A sender of `master` on `link` to `endpoint`, starting as `start` says.
    pub fn spawn_from(
        &self,
        link: hawser_stream::LinkConfig,
        master: &hawser_store::Database,
        endpoint: tonic::transport::Endpoint,
        start: hawser_stream::SenderStart,
    ) -> hawser_stream::SenderHandle {
        hawser_stream::StreamSender::spawn(
            link,
            master.clone(),
            endpoint,
            start,
            &self.tracker,
            self.shutdown.clone(),
        )
    }

    /// Stops every sender and waits until their tasks have ended.
    pub async fn stop(&self) {
        self.shutdown.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}

/// Waits (at most `deadline`) until `handle`'s status satisfies `cond`; fails naming
/// `what` and the last status, or when the sender ends.
pub async fn wait_status_within(
    handle: &hawser_stream::SenderHandle,
    what: &str,
    deadline: std::time::Duration,
    mut cond: impl FnMut(&hawser_stream::SenderStatus) -> bool,
) -> anyhow::Result<hawser_stream::SenderStatus> {
    let mut rx = handle.status();
    let waited = tokio::time::timeout(deadline, async {
        loop {
            {
                let s = rx.borrow_and_update();
                if cond(&s) {
                    return Ok(s.clone());
                }
            }
            if rx.changed().await.is_err() {
                anyhow::bail!("sender ended");
            }
        }
    })
    .await;
    match waited {
        Ok(r) => r,
        Err(_) => anyhow::bail!(
            "timed out waiting for {what}; last status {:?}",
            rx.borrow()
        ),
    }
}
