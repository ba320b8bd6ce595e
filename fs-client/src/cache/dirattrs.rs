//! Attributes the metadata server sent with a reply: a directory's with a call that
//! made or removed a name in it (create, mkdir, mknod, symlink, link, unlink, rmdir), a
//! file's with a length commit.
//!
//! After such a call the kernel drops its copy of the directory's attributes (the
//! directory's times moved) and asks for them again before the next change in that
//! directory, to check the caller's permission: one more round trip per file for
//! `tar x`, a data-set writer or `rm -r`. The server now sends the directory's attributes
//! with those replies; the next `getattr` of the directory takes them from here instead.
//! Likewise after a file was written and closed, the kernel asks for its attributes
//! before the `utime`, `chmod` or `chown` that `tar x` and `cp -a` send next; the
//! commit's reply carries them (this client's later writes are laid over them). And a
//! `chown` makes the kernel ask for the file's attributes first (to recompute the
//! setuid bits from a fresh mode): the reply to the `utime` before it has them.
//!
//! A copy is used only within the attribute TTL, the time the kernel itself would have
//! trusted it, and a file's at most once. A change of one inode's attributes (setattr, xattrs,
//! atime) drops that inode's copy, and a new name in a directory that directory's;
//! any other request that may change a directory (rename, link, unlink, rmdir, ...)
//! empties the whole cache, so this client never answers with attributes older than
//! one of its own changes.

use crate::cache::ttlmap::TtlMap;
use proto::meta::fs::{self, FsRequest};
use proto::{Attr, InodeId};
use std::time::Duration;

/// Inodes remembered at most.
const MAX_DIRS: usize = 1024;

/// Copies keyed by inode; the map's epoch moves at every request that forgets copies:
/// a reply to a request sent before may carry attributes older than that change (a
/// commit answered just before an append through another handle) and is not kept.
pub(crate) struct DirAttrs {
    map: TtlMap<Attr>,
}

impl DirAttrs {
    pub(crate) fn new(ttl: Duration) -> DirAttrs {
        DirAttrs {
            map: TtlMap::new(ttl, MAX_DIRS),
        }
    }

    /// Remembers `attr`, just received from the metadata server.
    pub(crate) fn put(&self, attr: Attr) {
        self.map.put(attr.ino, attr);
    }

    /// Where [`DirAttrs::put_since`] counts from: read before sending the request whose
    /// reply is to be kept.
    pub(crate) fn epoch(&self) -> u64 {
        self.map.epoch()
    }

    /// Remembers `attr`, received in reply to a request sent at `epoch`, unless a
    /// request that forgets copies went out since: then the copy of that inode kept
    /// before goes too (the reply is newer than it).
    pub(crate) fn put_since(&self, attr: Attr, epoch: u64) {
        self.map.put_since(attr.ino, attr, epoch);
    }

    /// The remembered attributes of `ino`, if still within the TTL. A file's copy is
    /// handed out once; a directory's as often as the kernel asks within the TTL: it
    /// asks after every change in the directory from any process of this mount (two
    /// processes removing in one directory ask twice per reply that brings a copy),
    /// and every change of this mount there forgets the copy before it is sent and
    /// keeps the one its reply brings.
    pub(crate) fn take(&self, ino: InodeId) -> Option<Attr> {
        let a = self.map.get(ino)?;
        match a.kind {
            proto::FileKind::Directory => Some(a),
            _ => self.map.take(ino),
        }
    }

    /// Forgets everything if `req` may change a directory's attributes (or a file's
    /// after its commit: a release carrying a later commit), else the copies of the
    /// inodes it changes; the callers of create, mkdir, unlink, setattr and commit keep
    /// the copy their reply brings. Cluster and
    /// administration calls change no attributes: they are not shown here.
    pub(crate) fn before(&self, req: &FsRequest) {
        use FsRequest as R;
        let keeps = super::changes_nothing(req);
        let forget = match req {
            // A create (or mkdir, mknod, symlink) changes its directory and a new inode
            // nothing was kept of; the caller keeps the directory's new copy. An
            // unlink also changes the link count of the inode it unlinks, which the
            // request does not name, so it forgets every copy (below): a copy kept from
            // that file's last setattr or commit showed one link to `fstat` on a
            // descriptor held across the unlink.
            R::Create(fs::Create { parent, .. })
            | R::Mkdir(fs::Mkdir { parent, .. })
            | R::MkNod(fs::MkNod { parent, .. })
            | R::Symlink(fs::Symlink { parent, .. }) => Some(Some(*parent)),
            // An append or an open with `O_TRUNC` moves the file's length on the
            // server: a copy kept from the commit or setattr before would show the old
            // one. Attribute changes of one inode leave its directory's copy (`tar x`
            // sets the time, owner and mode of each file between two creates in it).
            R::Append(fs::Append { ino, .. })
            | R::Open(fs::Open {
                ino,
                truncate: true,
                ..
            })
            | R::SetAttr(fs::SetAttr { ino, .. })
            | R::SetXattr(fs::SetXattr { ino, .. })
            | R::RemoveXattr(fs::RemoveXattr { ino, .. })
            | R::Accessed(fs::Accessed { ino, .. })
            // A length commit too (its caller keeps the reply's copy): a reply to a
            // request sent before it (a `setattr`, a `getattr` under a lock) must not
            // be kept after it with the old length.
            | R::Commit(fs::Commit { ino, .. })
            | R::TailCut(fs::TailCut { ino, .. }) => Some(Some(*ino)),
            _ if !keeps => Some(None),
            _ => None,
        };
        match forget {
            Some(Some(ino)) => self.map.forget(ino),
            Some(None) => self.map.forget_all(),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::FileKind;

    fn dir(ino: u64, perm: u32) -> Attr {
        let mut a = crate::fuse::dot_attr(InodeId(ino), FileKind::Directory);
        a.perm = perm;
        a
    }

    #[test]
    fn a_files_copy_is_used_once_and_changes_forget_copies() {
        let c = DirAttrs::new(Duration::from_secs(60));
        c.put(dir(5, 0o755));
        assert_eq!(c.take(InodeId(5)).map(|a| a.perm), Some(0o755));
        assert!(c.take(InodeId(5)).is_some(), "a directory's, while fresh");
        let mut file = dir(8, 0o644);
        file.kind = FileKind::Regular;
        c.put(file);
        assert!(c.take(InodeId(8)).is_some());
        assert_eq!(c.take(InodeId(8)), None, "a file's, once");
        c.put(dir(5, 0o755));
        c.before(&FsRequest::GetAttr(fs::GetAttr { ino: InodeId(9) }));
        assert!(c.take(InodeId(5)).is_some(), "a read keeps it");
        c.put(dir(5, 0o755));
        c.before(&FsRequest::Rmdir(fs::Rmdir {
            parent: InodeId(5),
            name: b"x".to_vec(),
        }));
        assert_eq!(c.take(InodeId(5)), None, "a change forgets it");
        c.put(dir(5, 0o755));
        c.put(dir(6, 0o644));
        c.before(&FsRequest::Unlink(fs::Unlink {
            parent: InodeId(5),
            name: b"x".to_vec(),
        }));
        assert_eq!(c.take(InodeId(5)), None, "an unlink in it replaces it");
        // The unlinked inode's link count moved, and the request does not name it.
        assert_eq!(c.take(InodeId(6)), None, "an unlink forgets every copy");
        // A release without a commit changes nothing; one with a commit may change
        // a file whose commit reply is kept here.
        c.put(dir(5, 0o755));
        let release = |commit| {
            FsRequest::Release(fs::Release {
                session: proto::SessionId(1),
                commit,
            })
        };
        c.before(&release(None));
        assert!(c.take(InodeId(5)).is_some(), "a plain release keeps it");
        c.put(dir(5, 0o755));
        let commit = proto::meta::Commit::length(1, proto::Timestamp::now());
        c.before(&release(Some(commit)));
        assert_eq!(
            c.take(InodeId(5)),
            None,
            "a release with a commit forgets it"
        );
        // An append forgets the file's copy (from the commit before it), not others.
        c.put(dir(5, 0o755));
        c.put(dir(6, 0o644));
        c.before(&FsRequest::Append(fs::Append {
            ino: InodeId(6),
            len: 10,
        }));
        assert_eq!(
            c.take(InodeId(6)),
            None,
            "an append forgets the file's copy"
        );
        assert!(c.take(InodeId(5)).is_some(), "and keeps the others");
        // A commit forgets the file's copy while it is under way (its caller keeps the
        // reply's), and leaves the others; a reply to a request sent before it is not
        // kept after it.
        c.put(dir(5, 0o755));
        c.put(dir(6, 0o644));
        let before_commit = c.epoch();
        c.before(&FsRequest::Commit(fs::Commit {
            ino: InodeId(6),
            commit: proto::meta::Commit::length(1, proto::Timestamp::now()),
        }));
        assert_eq!(c.take(InodeId(6)), None, "a commit forgets the file's copy");
        assert!(c.take(InodeId(5)).is_some(), "and keeps the others");
        c.put_since(dir(6, 0o600), before_commit);
        assert_eq!(c.take(InodeId(6)), None, "an answer sent before the commit");
    }

    #[test]
    fn a_reply_to_a_request_sent_before_a_change_is_not_kept() {
        let c = DirAttrs::new(Duration::from_secs(60));
        // A commit goes out, an append through another handle follows, then the
        // commit's reply (with the length from before the append) comes back.
        let since = c.epoch();
        c.before(&FsRequest::Append(fs::Append {
            ino: InodeId(6),
            len: 10,
        }));
        c.put_since(dir(6, 0o644), since);
        assert_eq!(c.take(InodeId(6)), None, "the older reply is not kept");
        // Reads in between change nothing.
        let since = c.epoch();
        c.before(&FsRequest::GetAttr(fs::GetAttr { ino: InodeId(9) }));
        c.put_since(dir(6, 0o644), since);
        assert!(
            c.take(InodeId(6)).is_some(),
            "a reply with no change since is kept"
        );
    }
}
