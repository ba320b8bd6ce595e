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
//! A session is named by its id: ids are unique across servers (each takes its blocks
//! from the superblock).
//!
//! A session a client takes back on another server (`resume`) is named again there.
//!
//! Not yet (the next step of issue 24 puts each server's sessions under an engine lease,
//! with the server that holds each): the first server, if it still runs and its grace
//! for the session ends after the other server took it back, takes it out of the key
//! (an unlink then frees the file under the resumed session); sessions whose
//! end never reached the engine (a server that died, a close whose commit failed, an
//! open whose answer was lost) stay in the key, so their file is never freed and a
//! vanished writer's bytes past its length are never cut.

use super::keys;
use super::records::{decode, encode};
use super::txn::{Reads, Txn};
use super::State;
use crate::error::MetaError;
use proto::{InodeId, SessionId};
use serde::{Deserialize, Serialize};

/// Most sessions that may have one file open at once on a shared engine: the key is
/// read and written whole by every open and close of the file (8 bytes a session, 32 KiB
/// at most, well inside etcd's 1.5 MiB request). Past it an open is refused (`NoSpace`).
pub(crate) const MAX_OPENERS: usize = 4096;

/// The stored set: session ids, sorted.
#[derive(Default, Serialize, Deserialize)]
struct Openers {
    sessions: Vec<u64>,
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

fn write(txn: &mut Txn<'_>, ino: InodeId, o: &Openers) -> Result<(), MetaError> {
    if o.sessions.is_empty() {
        txn.delete(keys::openers(ino));
    } else {
        txn.put(keys::openers(ino), encode(o)?);
    }
    Ok(())
}

/// Whether a session of any server has `ino` open, as `txn` reads it. A key that does
/// not decode counts as open: a file is kept, never freed, on a doubt.
pub(super) fn open_anywhere(txn: &Txn<'_>, st: &State, ino: InodeId) -> Result<bool, MetaError> {
    if !txn.is_shared() {
        return Ok(st.is_open(ino));
    }
    Ok(txn.raw(&keys::openers(ino))?.is_some())
}

/// Adds `session` to the openers of `ino` (on a shared engine; nothing off it).
pub(super) fn opened(txn: &mut Txn<'_>, ino: InodeId, session: SessionId) -> Result<(), MetaError> {
    if !txn.is_shared() {
        return Ok(());
    }
    let mut o = read(txn, ino)?.ok_or_else(|| {
        MetaError::Corrupt(format!("{ino}: its open sessions' record does not decode"))
    })?;
    match o.sessions.binary_search(&session.0) {
        Ok(_) => return Ok(()),
        Err(at) if o.sessions.len() < MAX_OPENERS => o.sessions.insert(at, session.0),
        Err(_) => {
            return Err(MetaError::NoSpace(format!(
                "{ino} is open {MAX_OPENERS} times, the most one file may be on a shared engine"
            )))
        }
    }
    write(txn, ino, &o)
}

/// Ends `sessions` of `ino`; answers whether no session anywhere has it open after
/// them (then an orphan goes). Off a shared engine: whether they are all this server
/// holds, its memory being the whole truth there.
pub(super) fn closing(
    txn: &mut Txn<'_>,
    st: &State,
    ino: InodeId,
    sessions: &[SessionId],
) -> Result<bool, MetaError> {
    if !txn.is_shared() {
        let n = u32::try_from(sessions.len()).unwrap_or(u32::MAX);
        return Ok(st.open_counts.get(&ino) == Some(&n));
    }
    // Unreadable: left as it is, the file kept (`tessera fsck` reports the key).
    let Some(mut o) = read(txn, ino)? else {
        return Ok(false);
    };
    o.sessions.retain(|s| !sessions.iter().any(|e| e.0 == *s));
    write(txn, ino, &o)?;
    Ok(o.sessions.is_empty())
}

/// The sessions `ino`'s key names (for the namespace check); `None` if it does not
/// decode.
pub(super) fn decode_sessions(v: &[u8]) -> Option<Vec<u64>> {
    decode::<Openers>(v, "openers").ok().map(|o| o.sessions)
}
