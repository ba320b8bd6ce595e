//! The chunks a regular file holds (`H` keys) and the blocks its attributes report.

use super::{code, engine_tests, touch, H, ROOT};
use crate::kv::StoreKind;
use crate::namespace::keys;
use crate::namespace::txn::{Reads, StoreReads};
use proto::meta::Commit;
use proto::runs::{covered, touched, ChunkRuns, MAX_COMMIT_RUNS};
use proto::{ErrorCode, SetAttr, Timestamp};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn commit(size: u64, wrote: ChunkRuns, punched: ChunkRuns) -> Commit {
    Commit {
        wrote,
        punched,
        ..Commit::length(size, Timestamp::now())
    }
}

fn cut(size: u64) -> SetAttr {
    SetAttr {
        size: Some(size),
        ..Default::default()
    }
}

/// Guards against `st_blocks` counting the holes of a sparse file (`du` showed a sparse
/// 1 GiB file as 1 GiB).
fn sparse_writes_punches_and_cuts_move_the_blocks(kind: StoreKind) {
    let mut h = H::with_nodes(kind, 1);
    let cs = u64::from(h.config.chunk_size_bytes);
    let f = touch(h.ns(), ROOT, "f");
    let size = GIB + MIB;
    let mut wrote = touched(0, MIB, cs);
    wrote.union(&touched(GIB, size, cs));
    let a = h
        .ns()
        .commit(f.ino, commit(size, wrote, ChunkRuns::default()))
        .unwrap();
    // The first chunk whole (the file goes on past it) and the last one's 1 MiB.
    assert_eq!(a.blocks, cs / 512 + MIB / 512);
    assert!(h.has_key(&keys::held(f.ino)));
    h.restart();
    assert_eq!(h.ns().getattr(f.ino).unwrap().blocks, cs / 512 + MIB / 512);
    assert!(h.ns().check_namespace().unwrap().is_empty());
    // A punch of the first chunk whole frees it; one of part of a chunk frees nothing.
    let punched = covered(0, cs, cs);
    let a = h
        .ns()
        .commit(f.ino, commit(size, ChunkRuns::default(), punched))
        .unwrap();
    assert_eq!(a.blocks, MIB / 512);
    let part = covered(GIB, GIB + 4096, cs);
    let a = h
        .ns()
        .commit(f.ino, commit(size, ChunkRuns::default(), part))
        .unwrap();
    assert_eq!(a.blocks, MIB / 512);
    // A cut into the hole leaves nothing held; the key stays (the file is all hole).
    assert_eq!(h.ns().setattr(f.ino, &cut(2 * cs)).unwrap().blocks, 0);
    // Grown again, the old tail is a hole (the data servers cut it).
    assert_eq!(h.ns().setattr(f.ino, &cut(size)).unwrap().blocks, 0);
    assert!(h.ns().check_namespace().unwrap().is_empty());
    // Filled densely, the key goes: a dense file needs none.
    let all = ChunkRuns::range(0, u64::MAX);
    let a = h
        .ns()
        .commit(f.ino, commit(size, all, ChunkRuns::default()))
        .unwrap();
    assert_eq!(a.blocks, size / 512);
    assert!(!h.has_key(&keys::held(f.ino)));
    h.ns().setattr(f.ino, &cut(cs + 1)).unwrap();
    h.ns().setattr(f.ino, &cut(4 * cs)).unwrap();
    // A held chunk counts whole below the length: the one cut to a byte too (a chunk
    // is the unit; this errs towards more).
    assert_eq!(h.ns().getattr(f.ino).unwrap().blocks, 2 * cs / 512);
    // Unlinked, the key goes with the inode.
    h.ns().unlink(ROOT, b"f").unwrap();
    assert!(!h.has_key(&keys::held(f.ino)));
    assert!(h.ns().check_namespace().unwrap().is_empty());
}

/// Guards against a file with no record (written before records existed) reporting
/// fewer blocks than its data.
fn files_without_a_record_count_their_whole_length(kind: StoreKind) {
    let mut h = H::with_nodes(kind, 1);
    let f = touch(h.ns(), ROOT, "old");
    // As a store of the previous version leaves it: a length and no key.
    let mut batch = crate::kv::WriteBatch::default();
    let mut rec = StoreReads::new(h.store(), None).inode(f.ino).unwrap();
    rec.size = 10 * MIB + 1;
    batch.put(
        keys::inode(f.ino),
        crate::namespace::records::encode(&rec).unwrap(),
    );
    h.store().commit(batch).unwrap();
    h.restart();
    let ns = h.ns();
    assert_eq!(
        ns.getattr(f.ino).unwrap().blocks,
        (10 * MIB + 1).div_ceil(512)
    );
    // An append (whose bytes the server places) keeps a dense file dense.
    let at = ns.append(f.ino, MIB).unwrap();
    assert_eq!(at, 10 * MIB + 1);
    assert_eq!(
        ns.getattr(f.ino).unwrap().blocks,
        (11 * MIB + 1).div_ceil(512)
    );
    assert!(!h.has_key(&keys::held(f.ino)));
    // `O_TRUNC` empties it and a write far out then makes it sparse.
    let o = ns.open_inode(f.ino, true, super::owner(1)).unwrap();
    assert_eq!(o.attr.blocks, 0);
    let cs = u64::from(o.layout.chunk_size_bytes);
    let far = touched(100 * cs, 100 * cs + 1, cs);
    let a = ns
        .commit(f.ino, commit(100 * cs + 1, far, ChunkRuns::default()))
        .unwrap();
    assert_eq!(a.blocks, 1);
}

/// Guards against a peer's oversized report growing a record without bound.
fn a_commit_over_the_run_bound_is_refused(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let f = touch(h.ns(), ROOT, "f");
    let mut many = ChunkRuns::default();
    for i in 0..=MAX_COMMIT_RUNS as u64 {
        many.insert(2 * i, 2 * i + 1);
    }
    let c = commit(GIB, many, ChunkRuns::default());
    assert_eq!(code(h.ns().commit(f.ino, c)), ErrorCode::InvalidArgument);
}

/// Guards against `st_blocks` counting less than the data a reader finds: a writer that
/// vanished with the file open wrote chunks no commit named (after `truncate -s 1G`, a
/// dead writer's chunk counted 0 blocks, and `tar --sparse` would skip its data).
fn a_vanished_writer_leaves_the_file_counted_dense(kind: StoreKind) {
    let h = H::with_nodes(kind, 1);
    let ns = h.ns();
    let cs = u64::from(h.config.chunk_size_bytes);
    let f = touch(ns, ROOT, "f");
    ns.setattr(f.ino, &cut(GIB)).unwrap();
    assert_eq!(ns.getattr(f.ino).unwrap().blocks, 0, "all hole");
    let owner = crate::namespace::SessionOwner {
        client: proto::ClientId(3),
        conn: crate::namespace::ConnId(7),
        access: proto::meta::OpenAccess::ReadWrite,
        append: false,
    };
    ns.open_inode(f.ino, false, owner).unwrap();
    // Its writes of chunk 100 reached the data servers; its commit never came.
    ns.connection_closed(crate::namespace::ConnId(7));
    assert!(h.has_key(&keys::tail(f.ino)), "a vanished writer's file");
    assert!(!h.has_key(&keys::held(f.ino)), "its held set kept");
    assert_eq!(ns.getattr(f.ino).unwrap().blocks, GIB / 512);
    // Still dense after another writer's commit while the mark stays.
    let c = commit(GIB, touched(0, cs, cs), ChunkRuns::default());
    assert_eq!(ns.commit(f.ino, c).unwrap().blocks, GIB / 512);
}

engine_tests!(
    a_vanished_writer_leaves_the_file_counted_dense,
    sparse_writes_punches_and_cuts_move_the_blocks,
    files_without_a_record_count_their_whole_length,
    a_commit_over_the_run_bound_is_refused,
);
