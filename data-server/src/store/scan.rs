//! The directory tree of a store: creating it durably, listing it, counting its usage.

use super::chunk::measure;
use super::dirs::{fsync_dir, remove_if_present, save_atomically, syncfs};
use super::format::{
    bucket_dir, chunk_path, first_chunk_path, inode_dir, nested_first_chunk_path, parse_chunk_name,
    parse_hex16,
};
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

/// Indexes of the chunk files of one inode, in no particular order: its first chunk in
/// the bucket, the others in its inode directory.
pub(super) fn list_chunks(root: &Path, inode: InodeId) -> Result<Vec<u64>, DataError> {
    let seen = Seen {
        first: present(&first_chunk_path(root, inode))?,
        dir: true,
    };
    chunks_seen(root, inode, seen)
}

/// What a bucket's listing showed of one inode: its first chunk, its directory.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Seen {
    first: bool,
    dir: bool,
}

/// [`list_chunks`] for an inode whose bucket entries are known: no `stat` of its first
/// chunk, and no look into a directory it does not have.
pub(super) fn chunks_seen(root: &Path, inode: InodeId, seen: Seen) -> Result<Vec<u64>, DataError> {
    let mut out = Vec::new();
    if seen.first {
        out.push(0);
    }
    if !seen.dir {
        return Ok(out);
    }
    let dir = inode_dir(root, inode);
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(DataError::io(format!("list {}", dir.display()), e)),
    };
    for entry in entries {
        let entry = entry.ctx(|| format!("list {}", dir.display()))?;
        match entry.file_name().to_str().and_then(parse_chunk_name) {
            // Chunk 0 lives in the bucket since the tree's version 2 (`migrate_tree`).
            Some(index) if index > 0 => out.push(index),
            _ => tracing::warn!(path = %entry.path().display(), "stray file in chunk tree"),
        }
    }
    Ok(out)
}

/// The inodes holding chunks in bucket `b` (a first chunk, an inode directory, or
/// both), sorted, with what the listing showed of each.
pub(super) fn bucket_inodes(root: &Path, b: u8) -> Result<Vec<(InodeId, Seen)>, DataError> {
    let bucket = bucket_dir(root, b);
    let mut out = std::collections::BTreeMap::<u64, Seen>::new();
    for entry in fs::read_dir(&bucket).ctx(|| format!("list {}", bucket.display()))? {
        let entry = entry.ctx(|| format!("list {}", bucket.display()))?;
        let name = entry.file_name();
        let name = name.to_str().unwrap_or_default();
        let (inode, first) = match (parse_chunk_name(name), parse_hex16(name)) {
            (Some(i), _) if first_chunk_path(root, InodeId(i)) == entry.path() => (i, true),
            (None, Some(i)) if inode_dir(root, InodeId(i)) == entry.path() => (i, false),
            _ => {
                tracing::warn!(path = %entry.path().display(), "stray entry in chunk tree");
                continue;
            }
        };
        let seen = out.entry(inode).or_default();
        if first {
            seen.first = true;
        } else {
            seen.dir = true;
        }
    }
    Ok(out
        .into_iter()
        .map(|(i, seen)| (InodeId(i), seen))
        .collect())
}

/// Bytes charged to all chunk files under `root`, and their number.
pub(super) fn count_usage(root: &Path) -> Result<(u64, u64), DataError> {
    let (mut used, mut chunks) = (0u64, 0u64);
    for b in 0..=255u8 {
        for (inode, seen) in bucket_inodes(root, b)? {
            for index in chunks_seen(root, inode, seen)? {
                let chunk = ChunkId { inode, index };
                used = used.saturating_add(measure(&chunk_path(root, chunk), chunk)?);
                chunks += 1;
            }
        }
    }
    Ok((used, chunks))
}

/// The chunk tree's layout version, in `<dir>/chunk_tree`: 2 puts each inode's chunk 0
/// in its bucket. A store without the file has version 1 (every chunk in its inode's
/// directory), or is new.
const TREE_FILE: &str = "chunk_tree";
const TREE_TMP: &str = "chunk_tree.tmp";
const TREE_VERSION: &str = "2\n";

/// Brings the chunk tree under `root` to the current layout: a tree of version 1 has its
/// first chunks moved into their buckets (a rename each, inode directories left empty
/// removed), the file system synced once, then the version recorded. Run at open, with
/// the store's lock held, before anything reads the tree; only while the version file is
/// missing (once per store: a few minutes for millions of files, logged). A crash in the
/// middle leaves each chunk in one place or the other, and the next open finishes the
/// move. There is no way back: a build of the earlier layout does not see first chunks
/// in their buckets.
pub(super) fn migrate_tree(dir: &Path, root: &Path) -> Result<(), DataError> {
    let marker = dir.join(TREE_FILE);
    match fs::read_to_string(&marker) {
        Ok(v) if v == TREE_VERSION => return Ok(()),
        Ok(v) => {
            return Err(DataError::UnsupportedTree {
                path: marker,
                version: v.trim().to_owned(),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(DataError::io(format!("read {}", marker.display()), e)),
    }
    let mut moved = 0u64;
    for b in 0..=255u8 {
        moved += move_first_chunks(root, b)?;
        if moved > 0 && b % 32 == 31 {
            tracing::info!(
                buckets_done = u32::from(b) + 1,
                moved,
                "chunk tree: moving first chunks into their buckets"
            );
        }
    }
    if moved > 0 {
        // One sync for every rename and removal: a directory fsync each would be a
        // journal commit per file.
        syncfs(root)?;
        tracing::info!(root = %root.display(), moved, "chunk tree: first chunks moved into their buckets");
    }
    remove_if_present(&dir.join(TREE_TMP))?;
    save_atomically(dir, TREE_FILE, TREE_TMP, TREE_VERSION.as_bytes())
}

/// Whether `path` exists; errors other than "not found" are errors.
fn present(path: &Path) -> Result<bool, DataError> {
    match fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(DataError::io(format!("stat {}", path.display()), e)),
    }
}

/// Moves each inode directory's chunk 0 of bucket `b` to the bucket; returns how many.
fn move_first_chunks(root: &Path, b: u8) -> Result<u64, DataError> {
    let bucket = bucket_dir(root, b);
    let mut moved = 0;
    for entry in fs::read_dir(&bucket).ctx(|| format!("list {}", bucket.display()))? {
        let entry = entry.ctx(|| format!("list {}", bucket.display()))?;
        let Some(inode) = entry
            .file_name()
            .to_str()
            .and_then(parse_hex16)
            .map(InodeId)
        else {
            continue;
        };
        let (from, to) = (
            nested_first_chunk_path(root, inode),
            first_chunk_path(root, inode),
        );
        match (present(&from)?, present(&to)?) {
            (true, true) => {
                // Never left by a move; a build of the earlier layout run on a moved
                // store writes a second chunk 0 there. Which one holds the file's bytes
                // is for an operator to decide: nothing is served until then.
                return Err(DataError::TreeConflict {
                    path: from,
                    reason: format!("{} exists too", to.display()),
                });
            }
            (true, false) => {
                fs::rename(&from, &to)
                    .ctx(|| format!("move {} to {}", from.display(), to.display()))?;
                moved += 1;
            }
            // Moved before a crash, maybe with its directory left: removed below.
            (false, true) => {}
            (false, false) => continue,
        }
        let dir = inode_dir(root, inode);
        match fs::remove_dir(&dir) {
            // The file's other chunks keep it.
            Err(e) if e.kind() != std::io::ErrorKind::DirectoryNotEmpty => {
                return Err(DataError::io(format!("remove {}", dir.display()), e))
            }
            _ => {}
        }
    }
    Ok(moved)
}
