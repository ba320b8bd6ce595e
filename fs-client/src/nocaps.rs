//! Files known to carry no `security.capability` attribute.
//!
//! Before each `write(2)` the kernel checks whether the file has file capabilities to
//! drop (as it drops setuid bits). FUSE inodes never get `S_NOSEC`, so the check is a
//! `getxattr("security.capability")` on every write: one metadata round trip, more than
//! a buffered write itself costs (4 KiB writes ran at ~190 us each, 15-20 MB/s). The
//! answer "none" is remembered per file for the attribute TTL, the time the kernel
//! trusts attributes it was sent; a `setxattr` of that name through this client forgets
//! it at once. A capability set through another client is seen once the copy expires.

use crate::ttlmap::TtlMap;
use proto::InodeId;
use std::time::Duration;

/// The attribute the kernel asks for before writes.
pub(crate) const CAPABILITY: &[u8] = b"security.capability";

/// Files remembered at most.
const MAX_FILES: usize = 4096;

pub(crate) struct NoCaps(TtlMap<()>);

impl NoCaps {
    pub(crate) fn new(ttl: Duration) -> NoCaps {
        NoCaps(TtlMap::new(ttl, MAX_FILES))
    }

    /// The metadata server just said `ino` has no capability attribute (or made it).
    pub(crate) fn put(&self, ino: InodeId) {
        self.0.put(ino, ());
    }

    /// Whether `ino` is known, within the TTL, to have no capability attribute.
    pub(crate) fn known(&self, ino: InodeId) -> bool {
        self.0.get(ino).is_some()
    }

    /// `ino` may carry one now.
    pub(crate) fn forget(&self, ino: InodeId) {
        self.0.remove(ino);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expiry, the zero TTL and the bound are `TtlMap`'s, tested there.
    #[test]
    fn an_answer_is_kept_until_forgotten() {
        let c = NoCaps::new(Duration::from_secs(60));
        assert!(!c.known(InodeId(5)));
        c.put(InodeId(5));
        assert!(
            c.known(InodeId(5)) && c.known(InodeId(5)),
            "kept, not used up"
        );
        c.forget(InodeId(5));
        assert!(!c.known(InodeId(5)));
    }
}
