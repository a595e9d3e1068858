//! Long synchronous work (the store's reads and writes, encoding a large transaction)
//! kept from holding up a runtime's other tasks.
//!
//! A tokio worker that runs a stretch of synchronous work for a second runs nothing
//! else meanwhile: the Raft heartbeats, the streams' heartbeats and every other task
//! queued on it wait. On a node with two workers, two such stretches stop it. Work
//! that may take long is run with [`tokio::task::block_in_place`], which hands the
//! worker's tasks to another thread first.

/// The bytes of work past which a synchronous stretch leaves its worker: handing the
/// tasks on costs more than a smaller stretch takes.
pub const OFF_WORKER_BYTES: usize = 1 << 20;

/// Runs `f`, which may block for long, without holding up the other tasks of a
/// multi-threaded runtime: this worker hands them on first. Elsewhere (no runtime, or a
/// current-thread one, where `block_in_place` is refused) it just runs.
pub fn off_the_runtime<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// Runs `f`, a stretch of work on about `bytes` bytes: [`off_the_runtime`] from
/// [`OFF_WORKER_BYTES`] on, inline below.
pub fn sized<T>(bytes: usize, f: impl FnOnce() -> T) -> T {
    if bytes >= OFF_WORKER_BYTES {
        off_the_runtime(f)
    } else {
        f()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A task spawned while both workers of a runtime run long stretches still runs
    /// meanwhile, because each stretch handed its worker's tasks on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn other_tasks_run_while_large_stretches_block_every_worker() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{mpsc, Arc};
        let ran = Arc::new(AtomicBool::new(false));
        let (started_tx, started) = mpsc::channel();
        let stretches: Vec<_> = (0..2)
            .map(|_| {
                let (ran, started_tx) = (ran.clone(), started_tx.clone());
                tokio::spawn(async move {
                    sized(OFF_WORKER_BYTES, || {
                        started_tx.send(()).unwrap();
                        std::thread::sleep(Duration::from_millis(300));
                        ran.load(Ordering::SeqCst)
                    })
                })
            })
            .collect();
        // The test's own thread is not a worker: it may wait here.
        started.recv().unwrap();
        started.recv().unwrap();
        let flag = ran.clone();
        tokio::spawn(async move { flag.store(true, Ordering::SeqCst) });
        for s in stretches {
            assert!(s.await.unwrap(), "a task waited behind two blocked workers");
        }
    }

    #[test]
    fn without_a_runtime_it_just_runs() {
        assert_eq!(sized(OFF_WORKER_BYTES, || 7), 7);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert_eq!(rt.block_on(async { sized(usize::MAX, || 8) }), 8);
    }
}
