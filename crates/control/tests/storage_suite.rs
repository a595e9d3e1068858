//! openraft's storage conformance suite against the control plane's log and state
//! machine, over both engines of the store.

use std::sync::Arc;

use hawser_control::store::{self, LogStore, StateMachineStore};
use hawser_control::types::{StorageError, TypeConfig};
use hawser_store::{KvEngine, MemEngine, SledEngine};
use openraft::testing::{StoreBuilder, Suite};

struct MemBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore> for MemBuilder {
    async fn build(&self) -> Result<((), LogStore, StateMachineStore), StorageError> {
        let engine: Arc<dyn KvEngine> = Arc::new(MemEngine::new());
        let (log, sm) = store::open(engine)?;
        Ok(((), log, sm))
    }
}

/// Each store gets its own sled directory; the guard keeps it until the test ends.
struct SledBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for SledBuilder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError> {
        let dir = tempfile::tempdir().expect("temp dir");
        let engine: Arc<dyn KvEngine> = Arc::new(SledEngine::open(dir.path()).expect("open sled"));
        let (log, sm) = store::open(engine)?;
        Ok((dir, log, sm))
    }
}

#[test]
fn memory_engine_passes_the_openraft_storage_suite() {
    if let Err(e) = Suite::test_all(MemBuilder) {
        panic!("storage suite failed on the memory engine: {e}");
    }
}

#[test]
fn sled_engine_passes_the_openraft_storage_suite() {
    if let Err(e) = Suite::test_all(SledBuilder) {
        panic!("storage suite failed on the sled engine: {e}");
    }
}
