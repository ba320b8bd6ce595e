//! Pause points: steps of a request at which the service tests hold it, to run another
//! request in its middle (the store's crash points stop an update the same way, see
//! `store/chunk.rs`). Outside tests nothing happens at them.

/// Steps of a request at which a test can hold it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PausePoint {
    /// A read about to take its chunk's lock (its map is known, nothing of the chunk
    /// has been looked at under the lock yet).
    ReadLock,
}

#[cfg(test)]
pub(super) use armed::Pauses;

#[cfg(test)]
mod armed {
    use super::PausePoint;
    use parking_lot::Mutex;
    use std::time::Duration;
    use tokio::sync::oneshot;

    /// How long a test waits for a request to reach its pause point.
    const REACH_TIMEOUT: Duration = Duration::from_secs(10);

    /// The pause armed on one service (per service, so that tests running in parallel
    /// do not stop each other's requests).
    #[derive(Default)]
    pub(in crate::service) struct Pauses {
        armed: Mutex<Option<Armed>>,
    }

    struct Armed {
        at: PausePoint,
        reached: oneshot::Sender<()>,
        go: oneshot::Receiver<()>,
    }

    /// The test's end of an armed pause.
    pub(in crate::service) struct Pause {
        at: PausePoint,
        reached: oneshot::Receiver<()>,
        go: oneshot::Sender<()>,
    }

    impl Pauses {
        /// Holds the next request that reaches `at` (only that one).
        pub(in crate::service) fn arm(&self, at: PausePoint) -> Pause {
            let (reached_tx, reached) = oneshot::channel();
            let (go, go_rx) = oneshot::channel();
            *self.armed.lock() = Some(Armed {
                at,
                reached: reached_tx,
                go: go_rx,
            });
            Pause { at, reached, go }
        }

        /// Called by a request at `at`: if armed there, reports and waits to be let go.
        pub(in crate::service) async fn wait(&self, at: PausePoint) {
            let armed = {
                let mut a = self.armed.lock();
                match a.as_ref() {
                    Some(x) if x.at == at => a.take(),
                    _ => None,
                }
            };
            if let Some(a) = armed {
                let _ = a.reached.send(());
                // A dropped `Pause` lets the request go too.
                let _ = a.go.await;
            }
        }
    }

    impl Pause {
        /// Returns once a request is held at the point; panics after [`REACH_TIMEOUT`].
        pub(in crate::service) async fn reached(&mut self) {
            let at = self.at;
            match tokio::time::timeout(REACH_TIMEOUT, &mut self.reached).await {
                Ok(Ok(())) => {}
                _ => panic!("no request reached {at:?} within {REACH_TIMEOUT:?}"),
            }
        }

        /// Lets the held request go on.
        pub(in crate::service) fn release(self) {
            let _ = self.go.send(());
        }
    }
}
