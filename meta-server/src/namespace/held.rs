//! Which chunks of a regular file hold data, and the `st_blocks` that follows.
//!
//! The set lives under its own key (`H`+ino), not in the inode record: a length commit
//! that adds no chunk (appends inside the last chunk, rewrites) leaves it untouched, and
//! the inode record keeps its format. No key means every chunk below the length holds
//! data: a dense file (the common case) never has one, and a file written before the
//! key existed counts as it always did, never less than the data it may hold. Writers
//! report the chunks they wrote and punched in their commits (`proto::meta::Commit`);
//! length changes the server sees itself (truncation, `O_TRUNC`, `Append`) are applied
//! here. Every change errs towards counting a chunk: a run bound merges runs, never
//! drops one; a file a vanished writer had open counts dense (see `files::mark_tails`).
//! README "Not yet" lists the ways known to count less.

use super::keys;
use super::records::{decode, encode, InodeRecord};
use super::txn::{Reads, Txn};
use crate::error::MetaError;
use proto::runs::{self, ChunkRuns, MAX_COMMIT_RUNS};
use proto::{Attr, FileKind, InodeId};
use serde::{Deserialize, Serialize};

/// Most runs kept for one file (about 80 KiB at most); past it the runs with the
/// smallest gaps merge, counting those holes as held.
pub(crate) const MAX_HELD_RUNS: usize = 4096;

/// The stored set: runs `[start, end)` of chunk indexes.
#[derive(Serialize, Deserialize)]
struct HeldRecord {
    runs: Vec<(u64, u64)>,
}

/// The chunks of `ino` that hold data, `None` for every chunk below its length. A key
/// that does not decode counts as dense (logged; `tessera fsck` reports it): a stat or
/// a listing must not fail for a count.
pub(crate) fn read<R: Reads + ?Sized>(r: &R, ino: InodeId) -> Result<Option<ChunkRuns>, MetaError> {
    let Some(v) = r.raw(&keys::held(ino))? else {
        return Ok(None);
    };
    let runs = decode::<HeldRecord>(&v, "held chunks").and_then(|rec| {
        ChunkRuns::try_from(rec.runs)
            .map_err(|e| MetaError::Corrupt(format!("held chunks of {ino}: {e}")))
    });
    match runs {
        Ok(r) => Ok(Some(r)),
        Err(e) => {
            tracing::warn!(%ino, error = %e, "held chunks unreadable: counted as dense");
            Ok(None)
        }
    }
}

/// The attributes of `ino` (record `rec`) with its blocks: a regular file's read from
/// its held chunks, any other kind's from its length.
pub(crate) fn attr<R: Reads + ?Sized>(
    r: &R,
    ino: InodeId,
    rec: &InodeRecord,
) -> Result<Attr, MetaError> {
    let counted = rec.kind == FileKind::Regular && rec.layout.is_some() && rec.size > 0;
    let held = if counted { read(r, ino)? } else { None };
    Ok(attr_with(ino, rec, held.as_ref()))
}

/// The attributes of `ino` (record `rec`) whose held chunks are `held` (`None`: every
/// chunk below the length).
fn attr_with(ino: InodeId, rec: &InodeRecord, held: Option<&ChunkRuns>) -> Attr {
    let mut attr = rec.attr(ino);
    if let (FileKind::Regular, Some(layout)) = (rec.kind, &rec.layout) {
        let cs = u64::from(layout.chunk_size_bytes);
        attr.blocks = runs::blocks(held, rec.size, cs);
    }
    attr
}

/// What a change does to a file's chunks besides its length.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Change<'a> {
    /// Chunks written: they hold data.
    pub wrote: Option<&'a ChunkRuns>,
    /// Chunks punched whole: they hold none.
    pub punched: Option<&'a ChunkRuns>,
}

/// The chunks of `punched` a writer that knows the file as `seen` bytes long may take
/// out, on a file `size` bytes long at the server: the chunks whole below `seen`, and
/// the last one it knows in part only if nothing lies past `seen` (another mount may
/// have grown the file and written there since this writer looked). A pure function.
pub(crate) fn punch_within(punched: &ChunkRuns, seen: u64, size: u64, cs: u64) -> ChunkRuns {
    let mut p = punched.clone();
    let end = if size <= seen {
        runs::chunks_of(seen, cs)
    } else {
        seen / cs.max(1)
    };
    p.clip(end);
    p
}

/// The held set after a change of a file from `old_size` to `new_size` bytes (chunks of
/// `cs`) that wrote and punched what `change` says; `None` when every chunk below the
/// new length holds data (no key). A pure function of its inputs.
pub(crate) fn next(
    old: Option<ChunkRuns>,
    old_size: u64,
    new_size: u64,
    cs: u64,
    change: Change<'_>,
) -> Option<ChunkRuns> {
    let n = runs::chunks_of(new_size, cs);
    if n == 0 {
        return None;
    }
    let mut held = old.unwrap_or_else(|| ChunkRuns::range(0, runs::chunks_of(old_size, cs)));
    if let Some(w) = change.wrote {
        held.union(w);
    }
    if let Some(p) = change.punched {
        held.subtract(p);
    }
    // Chunks past the end were cut on the data servers: a file grown again over them
    // reads zeros there.
    held.clip(n);
    held.cap_merging(MAX_HELD_RUNS);
    (!held.covers(n)).then_some(held)
}

/// Applies a change of regular file `ino` from `old_size` to `rec`'s length (and the
/// chunks `change` wrote and punched) to its held key; writes only what differs.
/// Returns the file's attributes after it, their blocks from the set just computed
/// (the key is not read twice).
pub(crate) fn update(
    txn: &mut Txn<'_>,
    ino: InodeId,
    old_size: u64,
    rec: &InodeRecord,
    change: Change<'_>,
) -> Result<Attr, MetaError> {
    let Some(layout) = rec
        .layout
        .as_ref()
        .filter(|_| rec.kind == FileKind::Regular)
    else {
        return Ok(rec.attr(ino));
    };
    for (what, r) in [("written", change.wrote), ("punched", change.punched)] {
        if let Some(r) = r.filter(|r| r.len() > MAX_COMMIT_RUNS) {
            return Err(MetaError::InvalidArgument(format!(
                "{} runs of chunks {what} in one commit, at most {MAX_COMMIT_RUNS}",
                r.len()
            )));
        }
    }
    let nothing = change.wrote.is_none_or(ChunkRuns::is_empty)
        && change.punched.is_none_or(ChunkRuns::is_empty);
    if nothing && old_size == rec.size {
        return attr(&*txn, ino, rec);
    }
    // A vanished writer's chunks (the file is marked) may hold data no commit named: the
    // file stays dense until its next opener has cut what lies past the length.
    if txn.raw(&keys::tail(ino))?.is_some() {
        txn.delete(keys::held(ino));
        return Ok(attr_with(ino, rec, None));
    }
    let old = read(&*txn, ino)?;
    let cs = u64::from(layout.chunk_size_bytes);
    let new = next(old.clone(), old_size, rec.size, cs, change);
    if new != old {
        match &new {
            Some(held) => {
                let value = encode(&HeldRecord {
                    runs: held.runs().to_vec(),
                })?;
                txn.put(keys::held(ino), value);
            }
            None => txn.delete(keys::held(ino)),
        }
    }
    Ok(attr_with(ino, rec, new.as_ref()))
}

/// Checks one held key `k` (value `v`) against the inodes (for `fsck`): it decodes,
/// belongs to a regular file and names no chunk at or past its length. `inode` gives an
/// inode's kind, length and chunk size; each problem is one line to `note`.
pub(crate) fn check(
    k: &[u8],
    v: &[u8],
    inode: impl Fn(InodeId) -> Option<(FileKind, u64, u64)>,
    note: &mut impl FnMut(String),
) {
    let Some(ino) = keys::u64_at(k, 1).map(InodeId) else {
        note(format!("held-chunks key {k:x?} names no inode"));
        return;
    };
    let runs = match decode::<HeldRecord>(v, "held chunks")
        .map_err(|e| e.to_string())
        .and_then(|r| ChunkRuns::try_from(r.runs))
    {
        Ok(r) => r,
        Err(e) => return note(format!("held chunks of inode {ino}: {e}")),
    };
    match inode(ino) {
        None => note(format!("held chunks of missing inode {ino}")),
        Some((FileKind::Regular, size, cs)) => {
            let n = runs::chunks_of(size, cs);
            if runs.runs().last().is_some_and(|&(_, e)| e > n) {
                note(format!("inode {ino} holds chunks past its {n} chunks"));
            }
        }
        Some((kind, _, _)) => note(format!("held chunks of {kind:?} inode {ino}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CS: u64 = 1 << 20;

    fn runs(r: &[(u64, u64)]) -> ChunkRuns {
        ChunkRuns::try_from(r.to_vec()).unwrap()
    }

    #[test]
    fn a_punch_takes_out_only_what_its_writer_saw() {
        let to_end = runs(&[(1, 100)]);
        // The file as the writer saw it: whole chunks 1 and 2, and chunk 3 in part.
        assert_eq!(
            punch_within(&to_end, 3 * CS + 5, 3 * CS + 5, CS),
            runs(&[(1, 4)])
        );
        // Grown meanwhile by another mount: its part of chunk 3 may hold that data.
        assert_eq!(
            punch_within(&to_end, 3 * CS + 5, 8 * CS, CS),
            runs(&[(1, 3)])
        );
        assert!(punch_within(&to_end, 0, 8 * CS, CS).is_empty());
    }

    #[test]
    fn dense_files_keep_no_set_and_sparse_ones_do() {
        let wrote = ChunkRuns::range(0, 3);
        let dense = Change {
            wrote: Some(&wrote),
            punched: None,
        };
        assert_eq!(next(None, 0, 3 * CS, CS, dense), None);
        // A write past a hole (1 GiB in) keeps a set of the chunks written.
        let far = ChunkRuns::range(1024, 1025);
        let sparse = Change {
            wrote: Some(&far),
            punched: None,
        };
        let held = next(None, CS, 1025 * CS, CS, sparse);
        assert_eq!(held, Some(runs(&[(0, 1), (1024, 1025)])));
        // Filling the hole makes it dense again: the key goes.
        let fill = ChunkRuns::range(1, 1024);
        let filled = Change {
            wrote: Some(&fill),
            punched: None,
        };
        assert_eq!(next(held, 1025 * CS, 1025 * CS, CS, filled), None);
    }

    #[test]
    fn growing_a_file_without_writing_adds_a_hole() {
        // `truncate -s` of a dense (or unrecorded) file: the old chunks stay held.
        let grown = next(None, 2 * CS, 10 * CS, CS, Change::default());
        assert_eq!(grown, Some(runs(&[(0, 2)])));
        // From empty, nothing is held.
        assert_eq!(
            next(None, 0, 10 * CS, CS, Change::default()),
            Some(ChunkRuns::default())
        );
    }

    #[test]
    fn cutting_drops_chunks_past_the_end_and_punching_whole_chunks() {
        let held = Some(runs(&[(0, 2), (5, 9)]));
        assert_eq!(
            next(held.clone(), 9 * CS, 6 * CS + 1, CS, Change::default()),
            Some(runs(&[(0, 2), (5, 7)]))
        );
        assert_eq!(next(held.clone(), 9 * CS, 0, CS, Change::default()), None);
        // Cut into the hole: what is left is dense.
        assert_eq!(
            next(held.clone(), 9 * CS, 2 * CS, CS, Change::default()),
            None
        );
        let punch = ChunkRuns::range(5, 8);
        let punched = Change {
            wrote: None,
            punched: Some(&punch),
        };
        assert_eq!(
            next(held, 9 * CS, 9 * CS, CS, punched),
            Some(runs(&[(0, 2), (8, 9)]))
        );
        // A punch of a dense file's middle makes a set.
        let middle = ChunkRuns::range(1, 2);
        let hole = Change {
            wrote: None,
            punched: Some(&middle),
        };
        assert_eq!(
            next(None, 3 * CS, 3 * CS, CS, hole),
            Some(runs(&[(0, 1), (2, 3)]))
        );
    }

    #[test]
    fn too_many_runs_merge_into_held_holes() {
        let mut many = ChunkRuns::default();
        for i in 0..(MAX_HELD_RUNS as u64 + 10) {
            many.insert(2 * i, 2 * i + 1);
        }
        let size = 2 * CS * (MAX_HELD_RUNS as u64 + 10);
        let wrote = Change {
            wrote: Some(&many),
            punched: None,
        };
        let held = next(Some(ChunkRuns::default()), size, size, CS, wrote).unwrap();
        assert!(held.len() <= MAX_HELD_RUNS);
        for &(s, e) in many.runs() {
            assert!((s..e).all(|i| held.contains(i)), "{s}..{e} dropped");
        }
    }
}
