//! What the client remembers between calls so that it need not ask the metadata server:
//! attributes of fresh directory entries, the names in directories it holds, the files
//! known to have no extended attributes, pages of directories walked in name order, and
//! the time-bounded map they are built on.

pub(crate) mod dirattrs;
pub(crate) mod dirnames;
pub(crate) mod noxattrs;
pub(crate) mod scans;
pub(crate) mod ttlmap;

use proto::meta::fs::{self, FsRequest};

/// Whether `req` changes nothing a cache here keeps (reads, opens without `O_TRUNC`,
/// closes without a commit, locks). Cluster and administration calls change no
/// attributes: they are not shown here.
pub(crate) fn changes_nothing(req: &FsRequest) -> bool {
    use FsRequest as R;
    matches!(
        req,
        R::Hello(fs::Hello { .. })
            | R::Lookup(fs::Lookup { .. })
            | R::LookupParent(fs::LookupParent { .. })
            // With `accessed`, the access time of an inode the request does not name
            // may move.
            | R::OpenAt(fs::OpenAt { accessed: None, .. })
            | R::GetAttr(fs::GetAttr { .. })
            | R::Readlink(fs::Readlink { .. })
            | R::ReadDir(fs::ReadDir { .. })
            | R::StatFs(fs::StatFs)
            | R::Open(fs::Open {
                truncate: false,
                ..
            })
            | R::Release(fs::Release { commit: None, .. })
            | R::ReleaseMany(fs::ReleaseMany { .. })
            | R::GetXattr(fs::GetXattr { .. })
            | R::ListXattr(fs::ListXattr { .. })
            | R::SetLock(fs::SetLock { .. })
            | R::GetLock(fs::GetLock { .. })
            | R::ReleaseLocks(fs::ReleaseLocks { .. })
            | R::MyCaps(fs::MyCaps)
    )
}
