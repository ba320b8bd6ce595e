//! Deadlines and retries of the etcd engine's calls: which failures may be tried again,
//! and for how long.

use super::ENGINE;
use crate::kv::KvError;
use std::future::Future;
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
}

impl Timing {
    /// How long a caller waits for the whole call: every attempt and pause, and a margin.
    pub fn backstop(&self) -> Duration {
        self.retry_for + self.attempt + MAX_BACKOFF + Duration::from_secs(1)
    }
}

/// How often, while etcd is known not to answer ([`Outage`]), one call tries it again
/// (a single attempt); the others fail at once.
pub const PROBE_EVERY: Duration = Duration::from_millis(250);

/// An etcd outage as the store's calls saw it: begun when a call's retries ran out
/// with no answer, ended by the next answer. Meanwhile calls fail at once, saying why,
/// but one every [`PROBE_EVERY`] makes a single attempt. Requests that reach the store
/// one after another (a namespace change holds the namespace's lock across its reads)
/// then fail within about `retry_for_ms` of the outage's start, as the configuration
/// says, rather than each waiting `retry_for_ms` in turn behind the one before.
#[derive(Debug, Default)]
pub struct Outage(parking_lot::Mutex<Option<Down>>);

#[derive(Debug)]
struct Down {
    why: String,
    since: Instant,
    next_probe: Instant,
}

/// What [`Outage::admit`] lets a call do.
#[derive(Debug, PartialEq, Eq)]
enum Admit {
    /// Retry for `retry_for_ms`, as usual.
    Retrying,
    /// One attempt, for an outage.
    Probe,
    /// Fail now, for this reason.
    Refuse(String),
}

impl Outage {
    fn admit(&self, now: Instant) -> Admit {
        let mut down = self.0.lock();
        match down.as_mut() {
            None => Admit::Retrying,
            Some(d) if now >= d.next_probe => {
                d.next_probe = now + PROBE_EVERY;
                Admit::Probe
            }
            Some(d) => Admit::Refuse(format!(
                "etcd has not answered for {} ms ({}); asked again every {} ms",
                now.saturating_duration_since(d.since).as_millis(),
                d.why,
                PROBE_EVERY.as_millis()
            )),
        }
    }

    fn answered(&self) {
        let mut down = self.0.lock();
        if let Some(d) = down.take() {
            tracing::info!(
                after_ms = d.since.elapsed().as_millis() as u64,
                "etcd answers again"
            );
        }
    }

    fn unanswered(&self, why: &str, now: Instant) {
        let mut down = self.0.lock();
        match down.as_mut() {
            Some(d) => {
                d.why = why.to_owned();
                d.next_probe = now + PROBE_EVERY;
            }
            None => {
                tracing::warn!(
                    error = why,
                    "etcd does not answer: calls fail at once until it does"
                );
                *down = Some(Down {
                    why: why.to_owned(),
                    since: now,
                    next_probe: now + PROBE_EVERY,
                });
            }
        }
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
}

/// Runs `attempt` until it succeeds, fails for good, or [`Timing::retry_for`] is spent;
/// during an `outage`, once or not at all.
pub async fn retrying<T, F, Fut>(
    timing: Timing,
    outage: &Outage,
    retry: Retry,
    what: &str,
    mut attempt: F,
) -> Result<T, KvError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    let probe = match outage.admit(Instant::now()) {
        Admit::Retrying => false,
        Admit::Probe => true,
        Admit::Refuse(why) => {
            return Err(KvError::Unavailable {
                engine: ENGINE,
                message: format!("{what}: {why}"),
            })
        }
    };
    let deadline = Instant::now() + timing.retry_for;
    let mut backoff = FIRST_BACKOFF;
    let mut tries = 0u32;
    loop {
        tries += 1;
        let failure = match tokio::time::timeout(timing.attempt, attempt()).await {
            Ok(Ok(v)) => {
                outage.answered();
                return Ok(v);
            }
            Ok(Err(e)) => classify(&e),
            Err(_) => Failure::Unknown(format!(
                "no answer within {} ms",
                timing.attempt.as_millis()
            )),
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
            Failure::Unknown(why) if retry == Retry::IfNotSent => {
                return Err(KvError::Unavailable {
                    engine: ENGINE,
                    message: format!("{what}: {why}; it may have been applied"),
                })
            }
            Failure::NotSent(why) => (why, ""),
            Failure::Unknown(why) => (why, "; it may have been applied"),
        };
        if probe || Instant::now() + backoff >= deadline {
            let (why, outcome) = why;
            outage.unanswered(&why, Instant::now());
            return Err(KvError::Unavailable {
                engine: ENGINE,
                message: format!(
                    "{what}: {why} (tried {tries} times in {} ms; etcd.retry_for_ms){outcome}",
                    timing.retry_for.as_millis()
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
                // Made on this side from a failed connection or stream (tonic keeps that
                // error as the status's source): whatever its code (a broken pipe is
                // `Internal`, an early end `OutOfRange`), the request may have landed.
                _ if std::error::Error::source(s).is_some() => Failure::Unknown(m),
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

    /// A member killed under a request fails its stream with errors that tonic turns
    /// into `Internal` (a broken pipe) or `OutOfRange` (an early end) on this side:
    /// the request may have landed, and a retry may pass.
    #[test]
    fn a_stream_broken_on_this_side_may_pass_whatever_its_code() {
        use std::io::{Error as IoError, ErrorKind};
        for kind in [ErrorKind::BrokenPipe, ErrorKind::UnexpectedEof] {
            let broken = tonic::Status::from_error(Box::new(IoError::from(kind)));
            assert!(std::error::Error::source(&broken).is_some(), "{broken:?}");
            let e = etcd_client::Error::GRpcStatus(broken);
            assert!(matches!(classify(&e), Failure::Unknown(_)), "{kind:?}: {e}");
        }
        let internal = etcd_client::Error::GRpcStatus(tonic::Status::from(IoError::from(
            ErrorKind::BrokenPipe,
        )));
        // Without a source (as etcd would send it) an `Internal` may pass too.
        assert!(matches!(classify(&internal), Failure::Unknown(_)));
        // What etcd answers for a revision it compacted is final.
        let compacted = status(
            tonic::Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted",
        );
        assert!(matches!(classify(&compacted), Failure::Refused(_)));
    }

    /// Guards against every request queued behind a call to an etcd without a quorum
    /// waiting `retry_for_ms` in turn: once one call's retries ran out, the next fail at
    /// once without trying, one every `PROBE_EVERY` tries once, and an answer ends it.
    #[tokio::test]
    async fn after_an_outage_calls_fail_at_once_and_one_probes() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let timing = Timing {
            attempt: Duration::from_millis(20),
            retry_for: Duration::from_millis(200),
        };
        let outage = Outage::default();
        let (tries, up) = (AtomicUsize::new(0), AtomicBool::new(false));
        let call = || {
            retrying(timing, &outage, Retry::Always, "get", || {
                tries.fetch_add(1, Ordering::SeqCst);
                let up = up.load(Ordering::SeqCst);
                async move {
                    match up {
                        true => Ok(()),
                        false => Err(status(tonic::Code::Unavailable, "tcp connect error")),
                    }
                }
            })
        };
        let t = Instant::now();
        assert!(call().await.is_err());
        assert!(
            t.elapsed() >= Duration::from_millis(100),
            "{:?}",
            t.elapsed()
        );
        assert!(tries.load(Ordering::SeqCst) > 1, "retried");

        // Down: no attempt at all.
        let before = tries.load(Ordering::SeqCst);
        let t = Instant::now();
        let err = call().await.expect_err("refused");
        assert!(t.elapsed() < Duration::from_millis(20), "{:?}", t.elapsed());
        assert!(err.to_string().contains("has not answered"), "{err}");
        assert_eq!(tries.load(Ordering::SeqCst), before);

        // A probe: one attempt, then refused again until the next.
        tokio::time::sleep(PROBE_EVERY).await;
        assert!(call().await.is_err());
        assert_eq!(tries.load(Ordering::SeqCst), before + 1);
        assert!(call().await.is_err());
        assert_eq!(tries.load(Ordering::SeqCst), before + 1);

        // etcd is back: the next probe's answer ends the outage.
        up.store(true, Ordering::SeqCst);
        tokio::time::sleep(PROBE_EVERY).await;
        assert!(call().await.is_ok());
        assert_eq!(outage.admit(Instant::now()), Admit::Retrying);
    }
}
