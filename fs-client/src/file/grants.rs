//! The grants this client holds, one per file: attached to every chunk request of the
//! file, renewed at half their lifetime before use, and at once when a data server
//! answers that one is missing, expired or forged (the request is then retried once).
//!
//! A file's grant comes with its open (or a brief open, for a truncation); opens of the
//! same file share it, a writable one replacing a read-only one. It outlives the close
//! that sends the last buffered writes: those go before the session ends, within its
//! lifetime.

use parking_lot::Mutex;
use proto::grant::{unix_ms, Grant, GrantMode};
use proto::{ErrorCode, InodeId, SessionId};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Files whose grants are kept at most; past it, expired ones are dropped, then all.
pub(crate) const MAX_HELD_GRANTS: usize = 65_536;

/// One file's grant.
#[derive(Clone)]
struct Held {
    grant: Grant,
    /// The session it was given with (renewals name it).
    session: SessionId,
    /// When to renew it (half its lifetime after it came).
    renew_at: Instant,
    /// When it runs out, by this machine's clock.
    ends_at: Instant,
}

/// What a chunk request of a file is to carry, and whether to renew first.
pub(crate) enum Attach {
    /// This grant (or none: the cluster runs without keys).
    Use(Option<Grant>),
    /// Renew with this session first.
    Renew(SessionId, Option<Grant>),
}

/// The grants of one client, by file.
#[derive(Default)]
pub(crate) struct GrantBook {
    held: Mutex<HashMap<InodeId, Held>>,
}

impl GrantBook {
    /// Keeps `grant`, given with `session`, for its file (a read-only one does not
    /// replace a writable one that is still good).
    pub(crate) fn put(&self, grant: Option<Grant>, session: SessionId) {
        let Some(grant) = grant else { return };
        let now = Instant::now();
        let life = Duration::from_millis(grant.expires_ms.saturating_sub(unix_ms()));
        let new = Held {
            renew_at: now + life / 2,
            ends_at: now + life,
            grant,
            session,
        };
        let mut held = self.held.lock();
        if held.len() >= MAX_HELD_GRANTS {
            held.retain(|_, h| h.ends_at > now);
            if held.len() >= MAX_HELD_GRANTS {
                held.clear();
            }
        }
        let keep_old = held.get(&new.grant.inode).is_some_and(|old| {
            old.grant.mode == GrantMode::ReadWrite
                && new.grant.mode == GrantMode::Read
                && old.ends_at > now
        });
        if !keep_old {
            held.insert(new.grant.inode, new);
        }
    }

    /// What a request of `ino` carries now.
    pub(crate) fn attach(&self, ino: InodeId) -> Attach {
        match self.held.lock().get(&ino) {
            None => Attach::Use(None),
            Some(h) if Instant::now() >= h.renew_at => {
                Attach::Renew(h.session, Some(h.grant.clone()))
            }
            Some(h) => Attach::Use(Some(h.grant.clone())),
        }
    }

    /// The session `ino`'s grant was given with.
    pub(crate) fn session_of(&self, ino: InodeId) -> Option<SessionId> {
        self.held.lock().get(&ino).map(|h| h.session)
    }

    /// A renewal failed (the session ended): keep the grant until it runs out, without
    /// asking again before then; drop it once it has (a request then fails at once
    /// instead of asking for every request).
    pub(crate) fn renewal_failed(&self, ino: InodeId) {
        let mut held = self.held.lock();
        let ended = match held.get_mut(&ino) {
            Some(h) if Instant::now() < h.ends_at => {
                h.renew_at = h.ends_at;
                false
            }
            Some(_) => true,
            None => false,
        };
        if ended {
            held.remove(&ino);
        }
    }
}

/// Whether a data server's refusal is one a renewed grant may cure: expired, missing,
/// or sealed under a cluster key the servers no longer hold (the key was rotated).
pub(crate) fn renewable(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::GrantExpired | ErrorCode::GrantMissing | ErrorCode::GrantForged
    )
}
