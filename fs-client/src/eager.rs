//! Work started where it is asked for: a future polled once on the calling thread before
//! it gets a task of its own.
//!
//! A future's first poll writes its server call to the socket (the transport writes a
//! small frame from the sending task), while spawning it first puts a runtime worker's
//! wake before the call: on a busy machine that wake is a good part of a small call's
//! time. What is left after the first poll is spawned and polled again with a real waker
//! (every future here registers its waker on each poll, as tokio's and the transport's
//! own do).

use std::future::Future;
use std::task::{Context, Poll, Waker};
use tokio::runtime::Handle;

/// Polls `f` once on this thread, inside `rt`'s context, and spawns it on `rt` unless
/// that poll finished it. Returns false if the poll panicked (`f` is then dropped, as a
/// panicking task is). The caller holds no lock `f` may take.
#[must_use = "a panic in the first poll is reported only through the result"]
pub(crate) fn spawn(rt: &Handle, f: impl Future<Output = ()> + Send + 'static) -> bool {
    let mut work = Box::pin(f);
    let polled = {
        let _in_runtime = rt.enter();
        let mut cx = Context::from_waker(Waker::noop());
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work.as_mut().poll(&mut cx)))
    };
    match polled {
        Ok(Poll::Ready(())) => true,
        Ok(Poll::Pending) => {
            drop(rt.spawn(work));
            true
        }
        Err(_) => false,
    }
}
