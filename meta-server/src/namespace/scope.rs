//! Whether an inode lies inside a client's scope (the directory its key names as its
//! root), read from the store.
//!
//! A directory is inside when its parent chain reaches the scope's root. Files have no
//! parent (hard links give them several), so a file is inside when this client reached
//! it through a name inside: a lookup, a listing or a create on a connection of the same
//! key (the server notes every non-directory such replies name, see [`Scope::note`]).
//! Limits, written down in README "Security": the noted set holds at most
//! [`MAX_SCOPED_FILES`] inodes and is emptied when full (the kernel then finds a file it
//! still knows refused with ENOENT, and looks its name up again); a file reached inside
//! and then renamed or linked out of the scope by another client stays reachable by
//! number to this one until the server restarts.

use super::txn::Reads;
use super::Namespace;
use crate::error::MetaError;
use proto::InodeId;
use std::collections::HashSet;
use std::sync::Mutex;

/// Most files one scoped key's noted set holds before it is emptied.
pub const MAX_SCOPED_FILES: usize = 1 << 20;

/// Longest parent chain walked to decide whether a directory is inside; a deeper
/// directory is taken to be outside.
pub const MAX_SCOPE_DEPTH: usize = 4096;

/// One scoped key's root and the files it reached through names inside.
#[derive(Debug)]
pub struct Scope {
    /// The directory the client sees as `/`.
    pub root: InodeId,
    files: Mutex<HashSet<InodeId>>,
}

impl Scope {
    /// A scope rooted at `root`, with no file noted yet.
    pub fn new(root: InodeId) -> Scope {
        Scope {
            root,
            files: Mutex::new(HashSet::new()),
        }
    }

    /// Notes non-directory `ino` as reached through a name inside.
    pub fn note(&self, ino: InodeId) {
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        if files.len() >= MAX_SCOPED_FILES {
            files.clear();
        }
        files.insert(ino);
    }

    fn noted(&self, ino: InodeId) -> bool {
        let files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        files.contains(&ino)
    }
}

impl Namespace {
    /// The directory an absolute `path` names, walked from the root without following
    /// symlinks.
    pub fn resolve_dir(&self, path: &[u8]) -> Result<InodeId, MetaError> {
        let r = self.reads();
        let mut at = InodeId::ROOT;
        for name in path.split(|&b| b == b'/').filter(|n| !n.is_empty()) {
            r.dir(at)?;
            at = InodeId(r.entry(at, name)?.ino);
        }
        r.dir(at)?;
        Ok(at)
    }

    /// Whether `ino` is inside `scope` (see the module doc). An inode that does not
    /// exist is not.
    pub fn inside(&self, scope: &Scope, ino: InodeId) -> Result<bool, MetaError> {
        if ino == scope.root {
            return Ok(true);
        }
        let r = self.reads();
        let Some(rec) = r.try_inode(ino)? else {
            return Ok(false);
        };
        if !rec.is_dir() {
            return Ok(scope.noted(ino));
        }
        let mut parent = InodeId(rec.parent);
        for _ in 0..MAX_SCOPE_DEPTH {
            if parent == scope.root {
                return Ok(true);
            }
            // The root is its own parent; 0 would be a record without one.
            if parent == InodeId::ROOT || parent.0 == 0 {
                return Ok(false);
            }
            match r.try_inode(parent)? {
                Some(rec) => parent = InodeId(rec.parent),
                None => return Ok(false),
            }
        }
        Ok(false)
    }
}
