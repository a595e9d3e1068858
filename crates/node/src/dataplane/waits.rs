//! `ttRepSubscriberWait` over this node's senders: waits until the named subscribers
//! acknowledged everything committed before the call.

use hawser_core::{Ident, QualName};
use hawser_sql::{BoxFuture, ReplicationError};
use hawser_store::Database;
use hawser_stream::returns::ReturnWait;
use hawser_stream::SenderHandle;

use crate::returns::SubscriberWait;
use crate::senders::Senders;

/// `ttRepSubscriberWait` over this node's senders: everything committed before the
/// call acknowledged by the named subscribers.
pub(crate) struct SenderWaits {
    pub(crate) senders: Senders,
    pub(crate) db: Database,
}

impl SubscriberWait for SenderWaits {
    fn wait<'a>(
        &'a self,
        scheme: Option<String>,
        subscriber: Option<String>,
        wait: ReturnWait,
    ) -> BoxFuture<'a, Result<bool, ReplicationError>> {
        Box::pin(async move {
            let target = self.db.last_lsn();
            let scheme = scheme.map(|s| QualName::parse_unquoted(&s));
            let subscriber = subscriber.map(|s| Ident::unquoted(&s));
            let handles: Vec<SenderHandle> = self
                .senders
                .lock()
                .iter()
                .filter(|((sc, rcv), _)| {
                    scheme.as_ref().is_none_or(|s| s == sc)
                        && subscriber.as_ref().is_none_or(|s| s == rcv)
                })
                .map(|(_, h)| h.clone())
                .collect();
            if handles.is_empty() {
                return Err(ReplicationError {
                    code: "42704".into(),
                    message: format!(
                        "ttRepSubscriberWait: this node sends to no subscriber{}{}",
                        subscriber.map(|s| format!(" {s}")).unwrap_or_default(),
                        scheme
                            .map(|s| format!(" in scheme {s}"))
                            .unwrap_or_default()
                    ),
                });
            }
            let all = async {
                for h in handles {
                    let mut status = h.status();
                    // A closed watch means the sender stopped: it cannot catch up.
                    if status.wait_for(|s| s.acked_lsn >= target).await.is_err() {
                        return false;
                    }
                }
                true
            };
            Ok(match wait {
                ReturnWait::NoWait => {
                    tokio::time::timeout(std::time::Duration::ZERO, all).await == Ok(true)
                }
                ReturnWait::For(d) => tokio::time::timeout(d, all).await == Ok(true),
                ReturnWait::Forever => all.await,
            })
        })
    }
}
