//! The grants this client holds, one per file: attached to every chunk request of the
//! file, renewed at half their lifetime before use, and at once when a data server
//! answers that one is missing, expired or forged (the request is then retried once).
//!
//! A file's grant comes with its open (or a brief open, for a truncation); opens of the
//! same file share it, a writable one replacing a read-only one. The book keeps every
//! open session of the file with its mode, and renews with any one still open of the
//! grant's mode (a read-only one once no writable open is left): each open is a server
//! session of its own, and closing one must not take the others' renewals along. The
//! grant outlives the close that sends the last buffered writes: those go before the
//! session ends, within its lifetime.

use parking_lot::Mutex;
use proto::grant::{unix_ms, Grant, GrantMode};
use proto::{ErrorCode, InodeId, SessionId};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Files whose grants are kept at most; past it, expired ones of closed files are
/// dropped, then all.
pub(crate) const MAX_HELD_GRANTS: usize = 65_536;

/// How long a run-out grant of an open file is used before its renewal is tried again
/// after one failed (the metadata server is away: data servers take the grant meanwhile).
const RENEW_RETRY: Duration = Duration::from_secs(1);

/// One file's grant.
#[derive(Clone)]
struct Held {
    grant: Grant,
    /// The file's open sessions and the mode of the grant each came with (renewals
    /// name one of them).
    sessions: HashMap<SessionId, GrantMode>,
    /// When to renew it (half its lifetime after it came).
    renew_at: Instant,
    /// When it runs out, by this machine's clock.
    ends_at: Instant,
}

impl Held {
    /// An open session to renew with: one of the grant's mode, else any.
    fn renewer(&self) -> Option<SessionId> {
        let of_mode = self.sessions.iter().find(|(_, &m)| m == self.grant.mode);
        of_mode
            .or_else(|| self.sessions.iter().next())
            .map(|(&s, _)| s)
    }

    fn writable_open(&self) -> bool {
        self.sessions.values().any(|&m| m == GrantMode::ReadWrite)
    }
}

/// What a chunk request of a file is to carry, and whether to renew first.
pub(crate) enum Attach {
    /// This grant (or none: the cluster runs without keys).
    Use(Option<Grant>),
    /// Renew with this session first.
    Renew(SessionId, Option<Grant>),
}

#[derive(Default)]
struct Book {
    held: HashMap<InodeId, Held>,
    /// The file of every session in `held`, to forget a session by its id alone.
    files: HashMap<SessionId, InodeId>,
}

/// The grants of one client, by file.
#[derive(Default)]
pub(crate) struct GrantBook {
    book: Mutex<Book>,
}

impl GrantBook {
    /// Keeps `grant`, given with `session`, for its file, and the session as one to
    /// renew with until it ends (a read-only grant does not replace a writable one that
    /// is still good while a writable open is left).
    pub(crate) fn put(&self, grant: Option<Grant>, session: SessionId) {
        let Some(grant) = grant else { return };
        let now = Instant::now();
        let life = Duration::from_millis(grant.expires_ms.saturating_sub(unix_ms()));
        let (ino, mode) = (grant.inode, grant.mode);
        let mut book = self.book.lock();
        if book.held.len() >= MAX_HELD_GRANTS && !book.held.contains_key(&ino) {
            book.make_room(now);
        }
        let Book { held, files } = &mut *book;
        files.insert(session, ino);
        let held = held.entry(ino).or_insert_with(|| Held {
            grant: grant.clone(),
            sessions: HashMap::new(),
            renew_at: now,
            ends_at: now,
        });
        // A session keeps the mode it opened with: a renewal of a writable open that
        // comes back read-only (resumed after a metadata server restart) does not end
        // the writable grant before it runs out.
        held.sessions.entry(session).or_insert(mode);
        let keep_old = held.grant.mode == GrantMode::ReadWrite
            && mode == GrantMode::Read
            && held.ends_at > now
            && held.writable_open();
        if keep_old {
            // Not asked again for every request until the old grant runs out.
            held.renew_at = held.ends_at.min(now + life / 2);
        } else {
            held.grant = grant;
            held.renew_at = now + life / 2;
            held.ends_at = now + life;
        }
    }

    /// What a request of `ino` carries now. One request renews at a time: the one
    /// told to renew moves the next renewal [`RENEW_RETRY`] on, so that the others
    /// carry the grant held meanwhile instead of each queueing a renewal behind a
    /// metadata server that does not answer.
    pub(crate) fn attach(&self, ino: InodeId) -> Attach {
        let mut book = self.book.lock();
        let Some(h) = book.held.get_mut(&ino) else {
            return Attach::Use(None);
        };
        let now = Instant::now();
        match h.renewer() {
            Some(s) if now >= h.renew_at => {
                h.renew_at = now + RENEW_RETRY;
                Attach::Renew(s, Some(h.grant.clone()))
            }
            _ => Attach::Use(Some(h.grant.clone())),
        }
    }

    /// Whether a write to `ino` carries a grant that allows it: a writable grant held,
    /// or none held at all (a cluster without keys hands out none).
    pub(crate) fn writable(&self, ino: InodeId) -> bool {
        let book = self.book.lock();
        book.held
            .get(&ino)
            .is_none_or(|h| h.grant.mode == GrantMode::ReadWrite && h.writable_open())
    }

    /// An open session of `ino` to renew its grant with.
    pub(crate) fn session_of(&self, ino: InodeId) -> Option<SessionId> {
        self.book.lock().held.get(&ino).and_then(Held::renewer)
    }

    /// `session` ended (its open closed): renewals no longer name it. Its file's grant
    /// stays until it runs out, for writes the close sent last.
    pub(crate) fn ended(&self, session: SessionId) {
        let mut book = self.book.lock();
        let Some(ino) = book.files.remove(&session) else {
            return;
        };
        if let Some(h) = book.held.get_mut(&ino) {
            h.sessions.remove(&session);
        }
    }

    /// A renewal with `session` failed; `gone`: the server no longer has the session,
    /// and renewals no longer name it (another open of the file renews at the next
    /// request). With none left to ask, or the server failing, the grant is kept until
    /// it runs out without asking again before then; once it has, a file with no open
    /// left drops it (a request then fails at once instead of asking for every request),
    /// and an open file keeps using it, asking again every [`RENEW_RETRY`] (data
    /// servers take it while the metadata server is away).
    pub(crate) fn renewal_failed(&self, ino: InodeId, session: SessionId, gone: bool) {
        if gone {
            self.ended(session);
        }
        let mut book = self.book.lock();
        let now = Instant::now();
        let ran_out = match book.held.get_mut(&ino) {
            None => false,
            Some(h) if gone && !h.sessions.is_empty() => false,
            Some(h) if now < h.ends_at => {
                h.renew_at = h.ends_at;
                false
            }
            Some(h) if h.sessions.is_empty() => true,
            Some(h) => {
                h.renew_at = now + RENEW_RETRY;
                false
            }
        };
        if ran_out {
            book.held.remove(&ino);
        }
    }
}

impl Book {
    /// Drops the run-out grants of closed files, then, if still full, all.
    fn make_room(&mut self, now: Instant) {
        self.held
            .retain(|_, h| h.ends_at > now || !h.sessions.is_empty());
        if self.held.len() >= MAX_HELD_GRANTS {
            self.held.clear();
            self.files.clear();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(mode: GrantMode, life_ms: u64) -> Option<Grant> {
        Some(Grant {
            inode: InodeId(7),
            client: "c".into(),
            mode,
            expires_ms: unix_ms() + life_ms,
            map_version: 1,
            mac: [0; proto::grant::GRANT_MAC_BYTES],
        })
    }

    /// Guards against renewals tied to the newest open of a file: once it closed, the
    /// file's other opens had no session to renew with.
    #[test]
    fn renewals_name_an_open_still_open_of_the_grants_mode() {
        let (a, b, r) = (SessionId(1), SessionId(2), SessionId(3));
        let book = GrantBook::default();
        book.put(grant(GrantMode::ReadWrite, 60_000), a);
        book.put(grant(GrantMode::Read, 60_000), r);
        book.put(grant(GrantMode::ReadWrite, 60_000), b);
        book.ended(b);
        assert_eq!(book.session_of(InodeId(7)), Some(a));
        // The server lost `a`: the reader renews, and its read grant replaces.
        book.renewal_failed(InodeId(7), a, true);
        assert_eq!(book.session_of(InodeId(7)), Some(r));
        book.put(grant(GrantMode::Read, 60_000), r);
        match book.attach(InodeId(7)) {
            Attach::Use(Some(g)) => assert_eq!(g.mode, GrantMode::Read),
            _ => panic!("expected the read grant, not yet to renew"),
        }
        book.ended(r);
        assert_eq!(book.session_of(InodeId(7)), None);
        assert!(matches!(book.attach(InodeId(7)), Attach::Use(Some(_))));
    }

    /// A read grant does not replace a writable one while a writable open is left.
    #[test]
    fn a_writable_grant_stays_while_a_writer_is_open() {
        let book = GrantBook::default();
        book.put(grant(GrantMode::ReadWrite, 60_000), SessionId(1));
        book.put(grant(GrantMode::Read, 60_000), SessionId(2));
        let Attach::Use(Some(g)) = book.attach(InodeId(7)) else {
            panic!("expected a grant")
        };
        assert_eq!(g.mode, GrantMode::ReadWrite);
        // Renewing at once: half of a zero lifetime has passed.
        book.put(grant(GrantMode::ReadWrite, 0), SessionId(1));
        assert!(matches!(
            book.attach(InodeId(7)),
            Attach::Renew(SessionId(1), _)
        ));
    }

    /// Guards against every request renewing at once (each queued behind a metadata
    /// server that does not answer, I/O nearly stopped): one renews, the others carry
    /// the grant held until it answers or [`RENEW_RETRY`] passes.
    #[test]
    fn one_request_renews_at_a_time() {
        let book = GrantBook::default();
        book.put(grant(GrantMode::ReadWrite, 0), SessionId(1));
        assert!(matches!(book.attach(InodeId(7)), Attach::Renew(..)));
        for _ in 0..3 {
            assert!(matches!(book.attach(InodeId(7)), Attach::Use(Some(_))));
        }
    }
}
