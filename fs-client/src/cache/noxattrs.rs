//! Files known to carry no extended attributes, or no `security.capability`.
//!
//! Three requests the kernel sends are usually for attributes a file does not have, and
//! each was a metadata round trip: before each `write(2)` the kernel checks whether the
//! file has file capabilities to drop (FUSE inodes never get `S_NOSEC`, so the check is
//! a `getxattr("security.capability")` per write, a round trip on every small write);
//! `ls -l` reads `security.selinux` of every entry; `cp -a` and `tar --xattrs` list every
//! file's attributes. Every attribute reply of the metadata server carries the inode's
//! count of extended attributes: with 0, the answer "none" is kept for the attribute TTL
//! (the time the kernel trusts what it was sent), and a capability's absence is kept
//! after the server said so. A change of an inode's attributes through this client
//! forgets what was known; one through another client is seen once the answer expires,
//! as a new mode or owner is.

use crate::cache::ttlmap::TtlMap;
use proto::{Attr, InodeId};
use std::time::Duration;

/// The attribute the kernel asks for before writes.
pub(crate) use proto::CAPABILITY_XATTR as CAPABILITY;

/// Files remembered at most: a listing of this many entries followed by `ls -l`'s reads
/// is answered here (about 40 bytes each).
const MAX_FILES: usize = 262_144;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Known {
    /// No `security.capability` (other attributes unknown).
    NoCapability,
    /// No extended attribute at all.
    Nothing,
}

/// What is known per inode; the map's epoch moves when this client is about to change
/// an inode's attributes: a reply to a request sent before may show the count from
/// before the change.
pub(crate) struct NoXattrs {
    map: TtlMap<Known>,
}

impl NoXattrs {
    pub(crate) fn new(ttl: Duration) -> NoXattrs {
        NoXattrs {
            map: TtlMap::new(ttl, MAX_FILES),
        }
    }

    /// Read before sending a request whose reply's attributes go to [`NoXattrs::note`].
    pub(crate) fn epoch(&self) -> u64 {
        self.map.epoch()
    }

    /// `attr` came with the reply to a request sent at `epoch`.
    pub(crate) fn note(&self, attr: &Attr, epoch: u64) {
        if attr.xattr_count == 0 {
            self.map.put_since(attr.ino, Known::Nothing, epoch);
        } else {
            self.map.remove(attr.ino);
        }
    }

    /// The metadata server just said `ino` has no capability attribute.
    pub(crate) fn no_capability(&self, ino: InodeId) {
        if self.map.get(ino).is_none() {
            self.map.put(ino, Known::NoCapability);
        }
    }

    /// Whether `name` of `ino` is known, within the TTL, to be absent. A name the
    /// server would refuse (another namespace, too long) goes to it, for its error.
    pub(crate) fn absent(&self, ino: InodeId, name: &[u8]) -> bool {
        if proto::xattr_name_fault(name).is_some() {
            return false;
        }
        match self.map.get(ino) {
            Some(Known::Nothing) => true,
            Some(Known::NoCapability) => name == CAPABILITY,
            None => false,
        }
    }

    /// Whether `ino` is known, within the TTL, to have no attribute at all.
    pub(crate) fn none(&self, ino: InodeId) -> bool {
        self.map.get(ino) == Some(Known::Nothing)
    }

    /// This client is about to set or remove an attribute of `ino`.
    pub(crate) fn changing(&self, ino: InodeId) {
        self.map.forget(ino);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::FileKind;

    fn attr(ino: u64, xattr_count: u32) -> Attr {
        let mut a = crate::fuse::dot_attr(InodeId(ino), FileKind::Regular);
        a.xattr_count = xattr_count;
        a
    }

    // Expiry, the zero TTL and the bound are `TtlMap`'s, tested there.
    #[test]
    fn a_count_of_zero_answers_every_name_and_a_change_forgets_it() {
        let c = NoXattrs::new(Duration::from_secs(60));
        assert!(!c.absent(InodeId(5), CAPABILITY));
        c.note(&attr(5, 0), c.epoch());
        assert!(c.absent(InodeId(5), b"security.selinux") && c.none(InodeId(5)));
        // The kernel's look for an ACL, before its first access check of a file.
        assert!(c.absent(InodeId(5), proto::ACL_ACCESS_XATTR));
        // Names the server refuses go to it, for its error.
        for refused in [&b"system.nfs4_acl"[..], b"user.", b"other.x", &[b'u'; 300]] {
            assert!(!c.absent(InodeId(5), refused), "{refused:?}");
        }
        c.note(&attr(5, 2), c.epoch());
        assert!(!c.absent(InodeId(5), b"security.selinux") && !c.none(InodeId(5)));
        c.note(&attr(5, 0), c.epoch());
        c.changing(InodeId(5));
        assert!(!c.absent(InodeId(5), CAPABILITY), "a change forgets");
    }

    #[test]
    fn a_reply_to_a_request_sent_before_a_change_is_not_kept() {
        let c = NoXattrs::new(Duration::from_secs(60));
        let sent = c.epoch();
        c.changing(InodeId(7));
        c.note(&attr(7, 0), sent);
        assert!(!c.absent(InodeId(7), b"user.x"));
    }

    #[test]
    fn a_missing_capability_answers_that_name_only() {
        let c = NoXattrs::new(Duration::from_secs(60));
        c.no_capability(InodeId(9));
        assert!(c.absent(InodeId(9), CAPABILITY));
        assert!(!c.absent(InodeId(9), b"user.x") && !c.none(InodeId(9)));
        // It does not narrow what a count of zero said.
        c.note(&attr(9, 0), c.epoch());
        c.no_capability(InodeId(9));
        assert!(c.none(InodeId(9)));
    }
}
