//! The directory tree of a store: creating it durably, listing it, counting its usage.

use super::chunk::measure;
use super::dirs::fsync_dir;
use super::format::{bucket_dir, chunk_path, inode_dir, parse_chunk_name, parse_hex16};
use crate::error::{DataError, IoContext};
use proto::{ChunkId, InodeId};
use std::fs;
use std::path::Path;

/// Creates `path` if needed: a directory just made is durable only once its parent is
/// synced, so each parent of a directory created here is fsynced.
pub(super) fn create_dir_durably(path: &Path) -> Result<(), DataError> {
    let missing: Vec<&Path> = path.ancestors().take_while(|p| !p.exists()).collect();
    fs::create_dir_all(path).ctx(|| format!("create {}", path.display()))?;
    for dir in missing.iter().rev() {
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            fsync_dir(parent)?;
        }
    }
    Ok(())
}

/// Makes `<dir>/chunks` and its 256 buckets. Making every bucket up front means a chunk's
/// creation changes at most two directories (its inode directory and its bucket).
pub(super) fn create_tree(dir: &Path, root: &Path) -> Result<(), DataError> {
    if make_dir(root)? {
        fsync_dir(dir)?;
    }
    let mut created = false;
    for b in 0..=255u8 {
        created |= make_dir(&bucket_dir(root, b))?;
    }
    if created {
        fsync_dir(root)?;
    }
    Ok(())
}

/// Creates one directory; returns whether it was created (false: it existed).
fn make_dir(path: &Path) -> Result<bool, DataError> {
    match fs::create_dir(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && path.is_dir() => Ok(false),
        Err(e) => Err(DataError::io(format!("create {}", path.display()), e)),
    }
}

/// Indexes of the chunk files of one inode, in no particular order.
pub(super) fn list_chunks(root: &Path, inode: InodeId) -> Result<Vec<u64>, DataError> {
    let dir = inode_dir(root, inode);
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(DataError::io(format!("list {}", dir.display()), e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.ctx(|| format!("list {}", dir.display()))?;
        match entry.file_name().to_str().and_then(parse_chunk_name) {
            Some(index) => out.push(index),
            None => tracing::warn!(path = %entry.path().display(), "stray file in chunk tree"),
        }
    }
    Ok(out)
}

/// Bytes charged to all chunk files under `root`, and their number.
pub(super) fn count_usage(root: &Path) -> Result<(u64, u64), DataError> {
    let (mut used, mut chunks) = (0u64, 0u64);
    for b in 0..=255u8 {
        let bucket = bucket_dir(root, b);
        let entries = fs::read_dir(&bucket).ctx(|| format!("list {}", bucket.display()))?;
        for entry in entries {
            let entry = entry.ctx(|| format!("list {}", bucket.display()))?;
            let name = entry.file_name();
            let inode = name.to_str().and_then(parse_hex16).map(InodeId);
            let Some(inode) = inode.filter(|&i| inode_dir(root, i) == entry.path()) else {
                tracing::warn!(path = %entry.path().display(), "stray entry in chunk tree");
                continue;
            };
            for index in list_chunks(root, inode)? {
                let chunk = ChunkId { inode, index };
                used = used.saturating_add(measure(&chunk_path(root, chunk), chunk)?);
                chunks += 1;
            }
        }
    }
    Ok((used, chunks))
}
