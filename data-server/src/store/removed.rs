//! The files whose chunks a store deleted, the latest of them: a copy a resync or
//! repair fetched before a deletion must not be installed after it.

use proto::InodeId;

/// How many deleted files a [`ChunkStore`](super::ChunkStore) remembers (about 16 bytes each, twice).
const REMOVED_KEPT: usize = 65_536;

/// The latest deleted files, oldest first, bounded by [`REMOVED_KEPT`].
#[derive(Default)]
pub(super) struct Removed {
    pub(super) set: std::collections::HashSet<InodeId>,
    order: std::collections::VecDeque<InodeId>,
}

impl Removed {
    /// Records that the chunks of `inode` were deleted, forgetting the oldest beyond
    /// [`REMOVED_KEPT`].
    pub(super) fn insert(&mut self, inode: InodeId) {
        if self.set.insert(inode) {
            self.order.push_back(inode);
            if self.order.len() > REMOVED_KEPT {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }
}
