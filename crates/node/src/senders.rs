//! The running senders, shared by the data plane (which starts and stops them) and the
//! commit paths (which wake them): its own module so that neither imports the other.

use std::collections::BTreeMap;
use std::sync::Arc;

use hawser_core::{Ident, QualName};
use hawser_stream::SenderHandle;

/// The running senders, by (scheme, receiver store): for status reports and for the
/// commit paths to wake.
pub(crate) type Senders = Arc<parking_lot::Mutex<BTreeMap<(QualName, Ident), SenderHandle>>>;

/// Tells every sender there may be new log (called after client writes, so shipping
/// does not wait for the sender's poll).
pub(crate) fn wake_all(senders: &Senders) {
    for handle in senders.lock().values() {
        handle.wake();
    }
}
