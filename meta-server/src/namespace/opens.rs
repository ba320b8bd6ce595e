//! Which sessions have a file open, as every metadata server on a shared engine sees it.
//!
//! Off a shared engine the server's own memory knows every session (`State::open_counts`),
//! and that stays the rule there: no write per open. On a shared engine a file open
//! through one server may be unlinked through another, which must keep it (an orphan,
//! `O` key) until the last close anywhere. So there each open adds its session to the
//! file's `P` key and each close takes it out, in the transaction of the open or close;
//! an unlink (or a rename over the name) reads the key in its own transaction. A checked
//! commit fails when the key moved after that read: an open that lands between an
//! unlink's read and its commit sends the unlink round again, and it then keeps the file.
//!
//! A session is named by its id (ids are unique across servers: each takes its blocks
//! from the superblock), with the server that holds it and whether it writes. A server
//! takes out only the sessions it holds: one a client took back on another server
//! (`resume`, which names that server instead) is not ended by the first server's
//! grace running out. A server that died leaves its sessions named; a live one ends
//! them once the dead one's live key has been gone a grace (`sweep`), as a vanished
//! client's: the file freed if unlinked, its tail marked if the session wrote.
//!
//! Not yet: a session whose close failed to commit on a live server, or whose open
//! landed with its answer lost, stays named until that server stops (then the sweep
//! ends it).

use super::keys;
use super::records::{decode, encode};
use super::txn::{Holder, Reads, Txn};
use super::State;
use crate::error::MetaError;
use proto::{InodeId, SessionId};
use serde::{Deserialize, Serialize};

/// Most sessions that may have one file open at once on a shared engine: the key is
/// read and written whole by every open and close of the file (17 bytes a session,
/// about 70 KiB at most, well inside etcd's 1.5 MiB request). Past it an open is
/// refused (`NoSpace`).
pub(crate) const MAX_OPENERS: usize = 4096;

/// One session that has the file open.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Opener {
    pub session: u64,
    /// The server holding it (`Holder::id`).
    pub server: u64,
    /// Opened for writing: it may leave bytes past the length if it vanishes.
    pub write: bool,
}

/// The stored set, sorted by session.
#[derive(Default, Serialize, Deserialize)]
struct Openers {
    sessions: Vec<Opener>,
}

fn read(txn: &Txn<'_>, ino: InodeId) -> Result<Option<Openers>, MetaError> {
    match txn.raw(&keys::openers(ino))? {
        None => Ok(Some(Openers::default())),
        Some(v) => match decode::<Openers>(&v, "openers") {
            Ok(o) => Ok(Some(o)),
            Err(e) => {
                tracing::warn!(%ino, error = %e, "the file's open sessions are unreadable");
                Ok(None)
            }
        },
    }
}

fn read_whole(txn: &Txn<'_>, ino: InodeId) -> Result<Openers, MetaError> {
    read(txn, ino)?.ok_or_else(|| {
        MetaError::Corrupt(format!("{ino}: its open sessions' record does not decode"))
    })
}

fn store(txn: &mut Txn<'_>, ino: InodeId, o: &Openers) -> Result<(), MetaError> {
    if o.sessions.is_empty() {
        txn.delete(keys::openers(ino));
    } else {
        txn.put(keys::openers(ino), encode(o)?);
    }
    Ok(())
}

/// This server, fenced by its live key (see `Txn::holder_fenced`).
fn me(txn: &Txn<'_>) -> Result<Holder, MetaError> {
    txn.holder_fenced().ok_or_else(|| {
        MetaError::Store(crate::kv::KvError::Unavailable {
            engine: "shared",
            message: "this metadata server holds no live key in the engine yet".into(),
        })
    })
}

/// Whether a session of any server has `ino` open, as `txn` reads it. A key that does
/// not decode counts as open: a file is kept, never freed, on a doubt.
pub(super) fn open_anywhere(txn: &Txn<'_>, st: &State, ino: InodeId) -> Result<bool, MetaError> {
    if !txn.is_shared() {
        return Ok(st.is_open(ino));
    }
    Ok(txn.raw(&keys::openers(ino))?.is_some())
}

/// Adds `session` of this server to the openers of `ino` (on a shared engine; nothing
/// off it).
pub(super) fn opened(
    txn: &mut Txn<'_>,
    ino: InodeId,
    session: SessionId,
    write: bool,
) -> Result<(), MetaError> {
    if !txn.is_shared() {
        return Ok(());
    }
    let me = me(txn)?;
    let mut o = read_whole(txn, ino)?;
    let new = Opener {
        session: session.0,
        server: me.id,
        write,
    };
    match o.sessions.binary_search_by_key(&session.0, |s| s.session) {
        Ok(at) if o.sessions[at] == new => return Ok(()),
        Ok(at) => o.sessions[at] = new,
        Err(at) if o.sessions.len() < MAX_OPENERS => o.sessions.insert(at, new),
        Err(_) => {
            return Err(MetaError::NoSpace(format!(
                "{ino} is open {MAX_OPENERS} times, the most one file may be on a shared engine"
            )))
        }
    }
    store(txn, ino, &o)
}

/// Takes `session` of `ino` over for this server, opened for writing or not as
/// `write` says (a client resuming it here). Whether the key still names it: if not,
/// it ended (closed, or ended with its dead server) and is not taken.
pub(super) fn take_over(
    txn: &mut Txn<'_>,
    ino: InodeId,
    session: SessionId,
    write: bool,
) -> Result<bool, MetaError> {
    let named = read_whole(txn, ino)?
        .sessions
        .iter()
        .any(|s| s.session == session.0);
    if named {
        opened(txn, ino, session, write)?;
    }
    Ok(named)
}

/// What ending some of a file's sessions did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Closed {
    /// This server held at least one of them (not all were taken back elsewhere): what
    /// its end does to the file (a tail mark) is this server's to do.
    pub ended: bool,
    /// No session anywhere has the file open now: an orphan goes.
    pub unopened: bool,
}

/// Ends `sessions` of `ino` that this server holds. Off a shared engine the server's
/// memory is the whole truth: they end, and the file is unopened if they are all the
/// sessions it has.
pub(super) fn closing(
    txn: &mut Txn<'_>,
    st: &State,
    ino: InodeId,
    sessions: &[SessionId],
) -> Result<Closed, MetaError> {
    if !txn.is_shared() {
        let n = u32::try_from(sessions.len()).unwrap_or(u32::MAX);
        let unopened = st.open_counts.get(&ino) == Some(&n);
        return Ok(Closed {
            ended: true,
            unopened,
        });
    }
    // Unreadable: left as it is, the file kept (`tessera fsck` reports the key).
    let Some(mut o) = read(txn, ino)? else {
        return Ok(Closed {
            ended: true,
            unopened: false,
        });
    };
    // Another server's now (taken back there): its to end.
    let mine = txn.holder().map(|h| h.id);
    let before = o.sessions.len();
    o.sessions
        .retain(|s| Some(s.server) != mine || !sessions.iter().any(|e| e.0 == s.session));
    let ended = o.sessions.len() < before;
    if ended {
        store(txn, ino, &o)?;
    }
    Ok(Closed {
        ended,
        unopened: o.sessions.is_empty(),
    })
}

/// What ending the sessions of dead servers did to one file.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Ended {
    /// Sessions ended.
    pub sessions: usize,
    /// One of them was open for writing.
    pub wrote: bool,
    /// No session has the file open now.
    pub unopened: bool,
}

/// Ends the sessions of `ino` held by those of `servers` that have no live key as
/// `txn` reads it (checked at the commit: a server's key never comes back).
pub(super) fn end_dead(
    txn: &mut Txn<'_>,
    ino: InodeId,
    servers: &[u64],
) -> Result<Ended, MetaError> {
    let Some(o) = read(txn, ino)? else {
        return Ok(Ended::default());
    };
    let mut dead = Vec::new();
    for &s in servers {
        if txn.raw(&keys::server(s))?.is_none() {
            dead.push(s);
        }
    }
    let mut ended = Ended::default();
    let mut kept = Openers::default();
    for s in o.sessions {
        if dead.contains(&s.server) {
            ended.sessions += 1;
            ended.wrote |= s.write;
        } else {
            kept.sessions.push(s);
        }
    }
    if ended.sessions > 0 {
        store(txn, ino, &kept)?;
    }
    ended.unopened = kept.sessions.is_empty();
    Ok(ended)
}

/// The servers holding sessions in an openers key's value; `None` if it does not
/// decode.
pub(super) fn holders(v: &[u8]) -> Option<Vec<u64>> {
    let o = decode::<Openers>(v, "openers").ok()?;
    let mut servers: Vec<u64> = o.sessions.iter().map(|s| s.server).collect();
    servers.sort_unstable();
    servers.dedup();
    Some(servers)
}

/// The sessions `ino`'s key names (for the namespace check); `None` if it does not
/// decode.
pub(super) fn decode_sessions(v: &[u8]) -> Option<Vec<u64>> {
    decode::<Openers>(v, "openers")
        .ok()
        .map(|o| o.sessions.iter().map(|s| s.session).collect())
}
