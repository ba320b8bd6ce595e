//! Deadlines and retries of the etcd engine's calls: which failures may be tried again,
//! and for how long.

use super::ENGINE;
use crate::kv::KvError;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// First pause between two attempts; it doubles up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(20);
/// Longest pause between two attempts (an etcd election takes about a second).
pub const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// How long one attempt, and all of them, may take.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// One attempt.
    pub attempt: Duration,
    /// From the first attempt to the start of the last.
    pub retry_for: Duration,
    /// The end of the window of the request the call is made for (`retry_for` from its
    /// arrival, see `kv::deadline`): the call ends there too if etcd is [`Silence`]d when
    /// it starts, each attempt cut to it, none started with less than [`MIN_ATTEMPT`]
    /// left.
    pub until: Option<Instant>,
}

/// Least time worth an attempt: a call with less left of its request's window fails
/// without one (an attempt cut that short fails on a healthy etcd too).
pub const MIN_ATTEMPT: Duration = Duration::from_millis(50);

/// Whether etcd is silent: a call's retries ran out with no answer, and no call has
/// had one since. Requests that queued behind such calls (a namespace change holds the
/// namespace's lock across its reads) then bound their reads by their own arrival
/// (`EtcdStore::read_timing`); a healthy etcd bounds nothing, so a long request (a
/// check of a large namespace) is never cut.
#[derive(Debug, Default)]
pub struct Silence(AtomicBool);

impl Silence {
    /// Whether etcd is silent now.
    pub fn is_silent(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    fn answered(&self) {
        if self.is_silent() {
            self.0.store(false, Ordering::Relaxed);
        }
    }

    fn unanswered(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl Timing {
    /// When a call starting now must give up, `until` its request's window ends; an
    /// error if that window is spent already.
    fn deadline(&self, until: Option<Instant>, what: &str) -> Result<Instant, KvError> {
        let start = Instant::now();
        match until {
            Some(u) if start + MIN_ATTEMPT >= u => Err(KvError::Unavailable {
                engine: ENGINE,
                message: format!(
                    "{what}: not tried: etcd does not answer, and its request came \
                     etcd.retry_for_ms ({} ms) ago",
                    self.retry_for.as_millis()
                ),
            }),
            Some(u) => Ok(u.min(start + self.retry_for)),
            None => Ok(start + self.retry_for),
        }
    }
    /// How long a caller waits for the whole call: every attempt and pause, and a margin.
    pub fn backstop(&self) -> Duration {
        self.retry_for + self.attempt + MAX_BACKOFF + Duration::from_secs(1)
    }
}

/// Which failures a call may be tried again after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// Any failure that may pass (reads; commits whose replay is harmless).
    Always,
    /// Only a failure that shows the request never reached etcd (conditional commits).
    IfNotSent,
}

/// What a failed attempt tells.
#[derive(Debug, PartialEq, Eq)]
enum Failure {
    /// The request did not reach a member: a retry is safe for every call.
    NotSent(String),
    /// It may pass, but the request may have been applied.
    Unknown(String),
    /// Over etcd's limits: the same request fails again.
    TooLarge(String),
    /// Anything else: the same request fails again.
    Refused(String),
    /// A read at a revision etcd no longer keeps (compacted) or does not have yet: the
    /// same read fails again, one from now would not.
    NotAtRevision(String),
}

/// Runs `attempt` until it succeeds, fails for good, or [`Timing::retry_for`] is spent.
pub async fn retrying<T, F, Fut>(
    timing: Timing,
    silence: &Silence,
    retry: Retry,
    what: &str,
    mut attempt: F,
) -> Result<T, KvError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    let started = Instant::now();
    let until = timing.until.filter(|_| silence.is_silent());
    let deadline = timing.deadline(until, what)?;
    let least_left = until.map_or(Duration::ZERO, |_| MIN_ATTEMPT);
    let mut backoff = FIRST_BACKOFF;
    let mut tries = 0u32;
    loop {
        tries += 1;
        let this_try = match until {
            Some(_) => timing
                .attempt
                .min(deadline.saturating_duration_since(Instant::now())),
            None => timing.attempt,
        };
        let failure = match tokio::time::timeout(this_try, attempt()).await {
            Ok(Ok(v)) => {
                silence.answered();
                return Ok(v);
            }
            Ok(Err(e)) => classify(&e),
            Err(_) => Failure::Unknown(format!("no answer within {} ms", this_try.as_millis())),
        };
        let why = match failure {
            Failure::TooLarge(message) => {
                return Err(KvError::TooLarge {
                    engine: ENGINE,
                    message,
                })
            }
            Failure::Refused(message) => {
                return Err(KvError::Engine {
                    engine: ENGINE,
                    message: format!("{what}: {message}"),
                })
            }
            // Named by no key: a conflict on a server's live key or a change's record
            // means something else to the namespace (`retry_on_conflict`).
            Failure::NotAtRevision(message) => {
                tracing::debug!(what, %message, "read at a revision etcd does not keep");
                return Err(KvError::Conflict {
                    engine: ENGINE,
                    key: Vec::new(),
                });
            }
            Failure::Unknown(why) if retry == Retry::IfNotSent => {
                return Err(KvError::Unavailable {
                    engine: ENGINE,
                    message: format!("{what}: {why}; it may have been applied"),
                })
            }
            Failure::NotSent(why) => (why, ""),
            Failure::Unknown(why) => (why, "; it may have been applied"),
        };
        if Instant::now() + backoff + least_left >= deadline {
            let (why, outcome) = why;
            silence.unanswered();
            return Err(KvError::Unavailable {
                engine: ENGINE,
                message: format!(
                    "{what}: {why} (tried {tries} times in {} ms; etcd.retry_for_ms){outcome}",
                    started.elapsed().as_millis()
                ),
            });
        }
        let why = why.0;
        tracing::debug!(what, tries, error = %why, "etcd call failed; retrying");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Sorts an etcd client error by what a retry would do (etcd's gRPC errors:
/// `api/v3rpc/rpctypes`). Only what etcd answers for a request it will refuse again is
/// final; anything else may pass, since a member killed under a request fails it in
/// many ways (a reset stream, a broken pipe, an early end of the body) whose codes say
/// nothing about the request.
fn classify(e: &etcd_client::Error) -> Failure {
    use etcd_client::Error as E;
    use tonic::Code;
    match e {
        // Made before a request is written: the channel could not reach a member.
        E::TransportError(t) => Failure::NotSent(t.to_string()),
        E::GRpcStatus(s) => {
            let m = s.message().to_string();
            match s.code() {
                Code::Unavailable if is_connect_failure(&m) => Failure::NotSent(m),
                // "too many requests": refused before it was proposed.
                Code::ResourceExhausted if !m.contains("larger than max") => Failure::NotSent(m),
                Code::ResourceExhausted => Failure::TooLarge(m),
                Code::InvalidArgument
                    if m.contains("too large") || m.contains("too many operations") =>
                {
                    Failure::TooLarge(m)
                }
                // Made on this side from a failed connection or stream, with that error
                // kept as the status's source: whatever its code, the request may have
                // landed.
                _ if std::error::Error::source(s).is_some() => Failure::Unknown(m),
                Code::OutOfRange
                    if m.contains("has been compacted") || m.contains("future revision") =>
                {
                    Failure::NotAtRevision(m)
                }
                // etcd's answers for a request it refuses as it is (a bad argument, a
                // lease or revision it does not have, no permission, a corrupt member).
                Code::InvalidArgument
                | Code::FailedPrecondition
                | Code::NotFound
                | Code::AlreadyExists
                | Code::PermissionDenied
                | Code::Unauthenticated
                | Code::Unimplemented
                | Code::OutOfRange
                | Code::DataLoss => Failure::Refused(format!("{:?}: {m}", s.code())),
                // "leader changed", "request timed out", "no leader", a reset stream:
                // the proposal may or may not have been committed.
                _ => Failure::Unknown(m),
            }
        }
        E::IoError(io) => Failure::Unknown(io.to_string()),
        other => Failure::Refused(other.to_string()),
    }
}

/// Whether `e` is etcd's own answer to the request (it refused it as it is), rather
/// than a failure on the way (a connection refused or broken, a member without a
/// leader or out of time): after those another member may do better.
pub(super) fn answered_by_etcd(e: &etcd_client::Error) -> bool {
    matches!(
        classify(e),
        Failure::TooLarge(_) | Failure::Refused(_) | Failure::NotAtRevision(_)
    )
}

/// Whether a gRPC `Unavailable` says the connection was never made.
fn is_connect_failure(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "connection refused",
        "tcp connect error",
        "error trying to connect",
    ]
    .iter()
    .any(|p| m.contains(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: tonic::Code, m: &str) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(tonic::Status::new(code, m))
    }

    #[test]
    fn only_failures_before_sending_are_safe_for_conditional_commits() {
        use tonic::Code;
        let sent = |c, m| matches!(classify(&status(c, m)), Failure::NotSent(_));
        assert!(sent(
            Code::Unavailable,
            "tcp connect error: Connection refused"
        ));
        assert!(sent(
            Code::ResourceExhausted,
            "etcdserver: too many requests"
        ));
        assert!(!sent(Code::Unavailable, "etcdserver: leader changed"));
        assert!(!sent(Code::Unavailable, "etcdserver: request timed out"));
        let too_large = status(Code::InvalidArgument, "etcdserver: request is too large");
        assert!(matches!(classify(&too_large), Failure::TooLarge(_)));
        let dup = status(
            Code::InvalidArgument,
            "etcdserver: duplicate key given in txn request",
        );
        assert!(matches!(classify(&dup), Failure::Refused(_)));
    }

    /// Guards against a request that failed on this side of the connection (a member
    /// killed under it) counting as refused by etcd: it may have landed, and a retry
    /// may pass. tonic makes a broken pipe `Internal` (no source), and keeps the error
    /// a status was found in as its source, whatever code that status has.
    #[test]
    fn a_stream_broken_on_this_side_may_pass_whatever_its_code() {
        use std::io::{Error as IoError, ErrorKind};
        let pipe = tonic::Status::from(IoError::from(ErrorKind::BrokenPipe));
        assert_eq!(pipe.code(), tonic::Code::Internal);
        let pipe = etcd_client::Error::GRpcStatus(pipe);
        assert!(matches!(classify(&pipe), Failure::Unknown(_)), "{pipe}");

        #[derive(Debug)]
        struct Broken(tonic::Status);
        impl std::fmt::Display for Broken {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "stream broken")
            }
        }
        impl std::error::Error for Broken {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let found = tonic::Status::from_error(Box::new(Broken(tonic::Status::out_of_range(
            "unexpected end",
        ))));
        assert_eq!(found.code(), tonic::Code::OutOfRange);
        assert!(std::error::Error::source(&found).is_some());
        let found = etcd_client::Error::GRpcStatus(found);
        assert!(matches!(classify(&found), Failure::Unknown(_)), "{found}");

        // What etcd answers for a revision it compacted is final for that revision.
        let compacted = status(
            tonic::Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted",
        );
        assert!(matches!(classify(&compacted), Failure::NotAtRevision(_)));
        let other = status(tonic::Code::OutOfRange, "etcdserver: something else");
        assert!(matches!(classify(&other), Failure::Refused(_)));
    }

    /// Guards against a read of a request that queued behind others (the namespace lock,
    /// held across reads) retrying a whole `retry_for` of its own while etcd does not
    /// answer: its window ends `retry_for` after the request arrived, an attempt is cut
    /// to it, and past it the read is not tried at all.
    #[tokio::test]
    async fn a_read_ends_within_its_request_window() {
        use std::sync::atomic::AtomicUsize;
        let (tries, silence) = (AtomicUsize::new(0), Silence::default());
        // Earlier calls ran out of retries unanswered.
        silence.unanswered();
        let timing = |until| Timing {
            attempt: Duration::from_secs(5),
            retry_for: Duration::from_secs(30),
            until,
        };
        let failing = |until| {
            retrying(timing(until), &silence, Retry::Always, "get", || {
                tries.fetch_add(1, Ordering::SeqCst);
                async { Err::<(), _>(status(tonic::Code::Unavailable, "etcdserver: no leader")) }
            })
        };
        let t = Instant::now();
        let err = failing(Some(t + Duration::from_millis(300)))
            .await
            .expect_err("no answer");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert!(
            tries.load(Ordering::SeqCst) >= 2,
            "retried within the window"
        );
        assert!(matches!(err, KvError::Unavailable { .. }), "{err}");
        assert!(silence.is_silent(), "retries ran out unanswered");

        // An attempt that would hang is cut to the window.
        let t = Instant::now();
        let hung = retrying(
            timing(Some(t + Duration::from_millis(300))),
            &silence,
            Retry::Always,
            "get",
            std::future::pending::<Result<(), etcd_client::Error>>,
        );
        assert!(hung.await.is_err());
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());

        let before = tries.load(Ordering::SeqCst);
        let err = failing(Some(Instant::now()))
            .await
            .expect_err("past the window");
        assert_eq!(tries.load(Ordering::SeqCst), before, "not tried");
        assert!(err.to_string().contains("does not answer"), "{err}");

        // An answer ends the silence, and with it the bound: a request's window that is
        // spent no longer stops its reads.
        let ok = retrying(timing(None), &silence, Retry::Always, "get", || async {
            Ok::<(), etcd_client::Error>(())
        });
        assert!(ok.await.is_ok());
        assert!(!silence.is_silent());
        let late = retrying(
            timing(Some(Instant::now())),
            &silence,
            Retry::Always,
            "get",
            || async { Ok::<(), etcd_client::Error>(()) },
        );
        assert!(late.await.is_ok(), "a healthy etcd bounds nothing");
    }
}
