//! Files known to carry no `security.capability` attribute.
//!
//! Before each `write(2)` the kernel checks whether the file has file capabilities to
//! drop (as it drops setuid bits). FUSE inodes never get `S_NOSEC`, so the check is a
//! `getxattr("security.capability")` on every write: one metadata round trip, more than
//! a buffered write itself costs (4 KiB writes ran at ~190 us each, 15-20 MB/s). The
//! answer "none" is remembered per file for the attribute TTL, the time the kernel
//! trusts attributes it was sent; a `setxattr` of that name through this client forgets
//! it at once. A capability set through another client is seen once the copy expires.

use parking_lot::Mutex;
use proto::InodeId;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The attribute the kernel asks for before writes.
pub(crate) const CAPABILITY: &[u8] = b"security.capability";

/// Files remembered at most; a full cache drops its expired entries, then all.
const MAX_FILES: usize = 4096;

pub(crate) struct NoCaps {
    ttl: Duration,
    map: Mutex<HashMap<InodeId, Instant>>,
}

impl NoCaps {
    pub(crate) fn new(ttl: Duration) -> NoCaps {
        NoCaps {
            ttl,
            map: Mutex::new(HashMap::new()),
        }
    }

    /// The metadata server just said `ino` has no capability attribute.
    pub(crate) fn put(&self, ino: InodeId) {
        if self.ttl.is_zero() {
            return;
        }
        let mut map = self.map.lock();
        if map.len() >= MAX_FILES {
            let ttl = self.ttl;
            map.retain(|_, at| at.elapsed() < ttl);
            if map.len() >= MAX_FILES {
                map.clear();
            }
        }
        map.insert(ino, Instant::now());
    }

    /// Whether `ino` is known, within the TTL, to have no capability attribute.
    pub(crate) fn known(&self, ino: InodeId) -> bool {
        self.map
            .lock()
            .get(&ino)
            .is_some_and(|at| at.elapsed() < self.ttl)
    }

    /// `ino` may carry one now.
    pub(crate) fn forget(&self, ino: InodeId) {
        self.map.lock().remove(&ino);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_kept_for_the_ttl_and_forgotten_on_demand() {
        let c = NoCaps::new(Duration::from_secs(60));
        assert!(!c.known(InodeId(5)));
        c.put(InodeId(5));
        assert!(
            c.known(InodeId(5)) && c.known(InodeId(5)),
            "kept, not used up"
        );
        c.forget(InodeId(5));
        assert!(!c.known(InodeId(5)));
        let c = NoCaps::new(Duration::from_millis(20));
        c.put(InodeId(5));
        std::thread::sleep(Duration::from_millis(40));
        assert!(!c.known(InodeId(5)), "expired");
        let c = NoCaps::new(Duration::ZERO);
        c.put(InodeId(5));
        assert!(!c.known(InodeId(5)), "a zero TTL keeps nothing");
    }

    #[test]
    fn the_cache_stays_bounded() {
        let c = NoCaps::new(Duration::from_secs(60));
        for i in 0..(3 * MAX_FILES as u64) {
            c.put(InodeId(i));
            assert!(c.map.lock().len() <= MAX_FILES);
        }
    }
}
