//! The disk guard: while the disk holding the store has less than
//! `disk_reserve_bytes` free, requests that add records (create, mkdir, mknod, symlink,
//! link, setxattr) fail with ENOSPC before they touch the store. Deletions, renames and
//! attribute changes still go through: they too need a little room in the store (its
//! pages are copied on write), and they are how a full disk gets space back. Without
//! it, a disk filled by file data made a store commit fail, and a failed commit stops
//! every later change until a restart, deletions included.

use crate::error::MetaError;
use std::path::PathBuf;

/// One `statvfs` per guarded request: a microsecond or two, beside the synchronous log
/// write the request then waits for.
#[derive(Default)]
pub(super) struct DiskGuard {
    /// The store's directory; `None`: no guard (a store not on a local disk, tests).
    dir: Option<PathBuf>,
    reserve: u64,
}

impl DiskGuard {
    pub(super) fn new(dir: PathBuf, reserve: u64) -> DiskGuard {
        DiskGuard {
            dir: Some(dir),
            reserve,
        }
    }

    /// Refuses a request that adds records (`Handle::ADDS_RECORDS`) with `NoSpace`
    /// while the disk is short of room.
    pub(super) fn check(&self) -> Result<(), MetaError> {
        let Some(dir) = &self.dir else {
            return Ok(());
        };
        if self.reserve == 0 {
            return Ok(());
        }
        // Unknown: let the store's own write tell.
        let Ok((_, free)) = transport::disk_space(dir) else {
            return Ok(());
        };
        if free < self.reserve {
            return Err(MetaError::NoSpace(format!(
                "the disk holding the metadata store has {free} bytes free, under the \
                 {} kept for deletions; remove files to make room",
                self.reserve
            )));
        }
        Ok(())
    }
}
