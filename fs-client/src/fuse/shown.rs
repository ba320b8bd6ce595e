//! The names this mount showed the kernel, with the inode each led to, and the unlinks
//! answered with their help before the metadata server has them (`client::removes`).
//!
//! `FUSE_UNLINK` names a directory and a name only. Whether the server could refuse it
//! depends on the inode the name leads to (open here, flags), which the kernel looked up
//! through this mount within the entry TTL: a lookup, a `readdirplus` entry or a create
//! told it, and the same answer is kept here for as long as the kernel may trust it.

use super::Inner;
use parking_lot::Mutex;
use proto::meta::Caller;
use proto::{Attr, FileKind, InodeId, Timestamp};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Names kept at most (~120 bytes each): past it, all go.
const MAX_SHOWN: usize = 65_536;

/// What a name led to when this mount last showed it.
#[derive(Clone, Copy, Debug)]
struct Led {
    ino: InodeId,
    kind: FileKind,
    nlink: u32,
    at: Instant,
}

/// Names shown to the kernel, by directory and name.
pub(super) struct Shown {
    names: Mutex<HashMap<(InodeId, Vec<u8>), Led>>,
    /// Whether unlinks may be answered early at all: if not, nothing is kept (no work
    /// on every lookup for nothing).
    kept: bool,
}

impl Shown {
    /// Names kept only if `kept` (see `Client::may_defer_removes`).
    pub(super) fn new(kept: bool) -> Shown {
        Shown {
            names: Mutex::default(),
            kept,
        }
    }

    /// Records that `name` in `dir` led to `attr`, as the server said `age` ago.
    pub(super) fn note(&self, dir: InodeId, name: &[u8], attr: &Attr, age: Duration) {
        if !self.kept {
            return;
        }
        let now = Instant::now();
        let led = Led {
            ino: attr.ino,
            kind: attr.kind,
            nlink: attr.nlink,
            at: now.checked_sub(age).unwrap_or(now),
        };
        let mut names = self.names.lock();
        if names.len() >= MAX_SHOWN {
            names.clear();
        }
        names.insert((dir, name.to_vec()), led);
    }

    /// Forgets `name` in `dir` (renamed, removed).
    pub(super) fn forget(&self, dir: InodeId, name: &[u8]) {
        self.names.lock().remove(&(dir, name.to_vec()));
    }

    /// What `name` in `dir` led to, if shown within `ttl`; forgotten here.
    fn take(&self, dir: InodeId, name: &[u8], ttl: Duration) -> Option<Led> {
        let led = self.names.lock().remove(&(dir, name.to_vec()))?;
        (led.at.elapsed() < ttl).then_some(led)
    }
}

/// The attributes of a directory just after a change at `now`, from `seen`, what the
/// kernel last saw of it: its times moved, never backwards (the server's own replace
/// them with the reply).
pub(super) fn moved_times(mut seen: Attr, now: Timestamp) -> Attr {
    let t = now.max(seen.ctime.next()).max(seen.mtime.next());
    seen.mtime = t;
    seen.ctime = t;
    seen
}

impl Inner {
    /// Answers the unlink of `name` in `dir` for `caller` without waiting for the
    /// metadata server, if it cannot refuse it (see `client::removes`): the name was shown
    /// within the entry TTL and led to a non-directory with one link (a lookup of
    /// another name of it would not wait) that is not open here, and
    /// both it and the directory are known to have no extended attributes (flags are
    /// one; what this client knows of them is forgotten when it changes any, a `chattr`
    /// included). `false`: the caller sends it and waits, as before.
    pub(super) fn unlink_at_once(&self, dir: InodeId, name: &[u8], caller: Caller) -> bool {
        let Some(led) = self.shown.take(dir, name, self.entry_ttl) else {
            return false;
        };
        let no_xattrs = |ino| self.client.known_without_xattrs(ino);
        if led.kind == FileKind::Directory
            || led.nlink != 1
            || self.has_open(led.ino)
            || !no_xattrs(led.ino)
        {
            return false;
        }
        let Some(seen) = self.dirs_seen.lock().get(&dir).cloned() else {
            return false;
        };
        if seen.ino != dir || !no_xattrs(dir) {
            return false;
        }
        // The kernel asks for the directory's attributes before its next change there.
        let shown = moved_times(seen, Timestamp::now());
        self.client.unlink_later(dir, name, led.ino, caller, shown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuse::replies::dot_attr;

    #[test]
    fn a_name_is_known_for_the_entry_ttl_and_once() {
        let shown = Shown::new(true);
        let a = dot_attr(InodeId(7), FileKind::Regular);
        let (fresh, ttl) = (Duration::ZERO, Duration::from_secs(1));
        shown.note(InodeId(1), b"f", &a, fresh);
        let led = shown.take(InodeId(1), b"f", ttl).unwrap();
        assert_eq!((led.ino, led.kind), (InodeId(7), FileKind::Regular));
        assert!(shown.take(InodeId(1), b"f", ttl).is_none());
        shown.note(InodeId(1), b"f", &a, fresh);
        assert!(
            shown.take(InodeId(1), b"f", Duration::ZERO).is_none(),
            "too old"
        );
        shown.note(InodeId(1), b"f", &a, Duration::from_secs(2));
        assert!(
            shown.take(InodeId(1), b"f", ttl).is_none(),
            "read too long ago"
        );
        shown.note(InodeId(1), b"g", &a, fresh);
        shown.forget(InodeId(1), b"g");
        assert!(shown.take(InodeId(1), b"g", ttl).is_none());
    }

    #[test]
    fn a_directory_s_times_move_forward_only() {
        let mut a = dot_attr(InodeId(1), FileKind::Directory);
        a.mtime = Timestamp {
            secs: 100,
            nanos: 5,
        };
        a.ctime = Timestamp {
            secs: 100,
            nanos: 7,
        };
        let later = moved_times(
            a.clone(),
            Timestamp {
                secs: 200,
                nanos: 0,
            },
        );
        assert_eq!(
            (later.mtime, later.ctime),
            (
                later.ctime,
                Timestamp {
                    secs: 200,
                    nanos: 0
                }
            )
        );
        // A clock behind the server's: still after what the kernel saw.
        let behind = moved_times(a, Timestamp { secs: 50, nanos: 0 });
        assert_eq!(
            behind.ctime,
            Timestamp {
                secs: 100,
                nanos: 8
            }
        );
        assert_eq!(behind.mtime, behind.ctime);
    }
}
