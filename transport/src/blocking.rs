//! Blocking work of a server's request (a disk read or write, a store commit), run
//! where the request is: on a multi-threaded runtime on the worker that holds the
//! request, once that worker's other tasks are handed to another thread
//! (`block_in_place`). Handed to the blocking pool instead, a short call cost two
//! thread wakes (the pool thread's, then the request task's), which on a busy machine
//! were more than the call itself. Both servers run their store work through
//! [`in_place`]; the caller yields first when it may still be inside the transport's
//! first poll of its handler (see [`crate::Handler`]).

use crate::conn::multi_thread_runtime;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Calls at most that block their worker in place at once, in this process; the rest
/// go to the blocking pool. Each one in place has handed its worker's other tasks to a
/// thread of that pool: were all of the pool's threads (tokio's 512) held by calls
/// waiting for a stalled disk, a worker's tasks would have no thread to move to and the
/// async side would stop with them.
pub const MAX_IN_PLACE: usize = 16;

/// Calls blocking their worker in place now.
static IN_PLACE: AtomicUsize = AtomicUsize::new(0);

/// Why blocking work gave no result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockingFailed {
    /// It panicked (caught: the caller answers with an error).
    Panicked,
    /// The blocking pool did not run it to its end (the runtime is shutting down).
    Pool(String),
}

impl fmt::Display for BlockingFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlockingFailed::Panicked => write!(f, "panicked"),
            BlockingFailed::Pool(e) => write!(f, "failed: {e}"),
        }
    }
}

/// Runs `f`, which may block: in place on a multi-threaded runtime while fewer than
/// [`MAX_IN_PLACE`] calls are, else (a current-thread runtime, where
/// `block_in_place` panics, or past the cap) on the blocking pool. A panic in `f` is
/// an error either way, as the pool makes it.
pub async fn in_place<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, BlockingFailed> {
    if multi_thread_runtime() {
        if IN_PLACE.fetch_add(1, Ordering::AcqRel) < MAX_IN_PLACE {
            let run = || std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            let r = tokio::task::block_in_place(run);
            IN_PLACE.fetch_sub(1, Ordering::AcqRel);
            return r.map_err(|_| BlockingFailed::Panicked);
        }
        IN_PLACE.fetch_sub(1, Ordering::AcqRel);
    }
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        if e.is_panic() {
            BlockingFailed::Panicked
        } else {
            BlockingFailed::Pool(e.to_string())
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards blocking work on a current-thread runtime, where running it in place
    /// would panic: it runs on a pool thread and answers.
    #[tokio::test]
    async fn on_a_current_thread_runtime_it_runs_on_the_pool() {
        let here = std::thread::current().id();
        let there = in_place(|| std::thread::current().id()).await;
        assert_ne!(there.unwrap(), here, "on a thread of the blocking pool");
        let failed = in_place(|| -> () { panic!("a test's panic") }).await;
        assert_eq!(failed, Err(BlockingFailed::Panicked));
    }

    /// Guards blocking work on a multi-threaded runtime: it runs on the thread of the
    /// task that asked, and a panic in it is an error, not an unwind through the task.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_a_multi_threaded_runtime_it_runs_in_place() {
        let (here, there) = tokio::spawn(async {
            let there = in_place(|| std::thread::current().id()).await;
            (std::thread::current().id(), there.unwrap())
        })
        .await
        .unwrap();
        assert_eq!(here, there, "on the worker that holds the request");
        let failed = in_place(|| -> () { panic!("a test's panic") }).await;
        assert_eq!(failed, Err(BlockingFailed::Panicked));
    }
}
