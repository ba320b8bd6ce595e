//! Crash points on the disk path. Each test stops an update right after one of its steps
//! as a kill -9 would (what the earlier steps wrote stays in the page cache, nothing later
//! runs), or builds the state of a `pwrite` cut short, then restarts the store and checks
//! what reads and retried requests see. The steps are listed in the module docs.

use super::chunk::CrashPoint::{self, TruncateIntent, TruncateLength, WriteData, WriteIntent};
use super::tests::{chunk, read_vec, Rng, BIG, KIB64, MIB};
use super::*;
use std::cell::Cell;
use std::os::unix::fs::FileExt;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

/// The chunk size of these tests: its blocks are 64 KiB (as every block of a version 2
/// file was), which the offsets below are placed around.
const CS: u32 = 64 << 20;

thread_local! {
    /// The step at which the next update on this thread stops; per thread, because tests
    /// run in parallel.
    static CRASH_AT: Cell<Option<CrashPoint>> = const { Cell::new(None) };
}

/// Called by the store at each crash point: unwinds out of the store at the chosen one.
pub(super) fn maybe_crash(at: CrashPoint) {
    if CRASH_AT.with(|c| c.get()) == Some(at) {
        CRASH_AT.with(|c| c.set(None));
        // Not `panic!`: no hook, no message; this is the expected way out.
        resume_unwind(Box::new(at));
    }
}

/// Runs `op` on `store` until it reaches `at`, then drops the store, as a kill -9 at that
/// point would.
fn kill_at(store: ChunkStore, at: CrashPoint, op: impl FnOnce(&ChunkStore)) {
    CRASH_AT.with(|c| c.set(Some(at)));
    let outcome = catch_unwind(AssertUnwindSafe(|| op(&store)));
    CRASH_AT.with(|c| c.set(None));
    assert!(outcome.is_err(), "the operation never reached {at:?}");
}

fn restart(dir: &Path) -> ChunkStore {
    ChunkStore::open(dir, BIG).unwrap()
}

/// The file of chunk `c` in the store in `dir`, opened behind the store's back (which
/// then must be restarted, to count the space again).
fn raw_file(dir: &Path, c: ChunkId) -> File {
    let path = chunk_path(&chunks_root(dir), c);
    File::options().write(true).open(path).unwrap()
}

/// How a crashed write ends: stopped after one of its steps, or in the middle of its data
/// `pwrite`, which then stored only the first half of the new bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    At(CrashPoint),
    TornData,
}

const WRITE_CUTS: [Cut; 3] = [Cut::At(WriteIntent), Cut::TornData, Cut::At(WriteData)];

/// Crashes `write(c, CS, off, data)` as `cut` says and restarts the store.
fn crash_write(
    dir: &Path,
    s: ChunkStore,
    cut: Cut,
    c: ChunkId,
    off: u32,
    data: &[u8],
) -> ChunkStore {
    crash_write_of(dir, s, cut, (c, CS), off, data)
}

/// [`crash_write`] of a chunk `c` of chunk size `cs`.
fn crash_write_of(
    dir: &Path,
    s: ChunkStore,
    cut: Cut,
    (c, cs): (ChunkId, u32),
    off: u32,
    data: &[u8],
) -> ChunkStore {
    let at = match cut {
        Cut::At(at) => at,
        Cut::TornData => WriteIntent,
    };
    kill_at(s, at, |s| drop(s.write(c, cs, off, data)));
    if cut == Cut::TornData {
        let pos = Geometry::new(cs).unwrap().data_offset + u64::from(off);
        raw_file(dir, c)
            .write_all_at(&data[..data.len() / 2], pos)
            .unwrap();
    }
    restart(dir)
}

/// A store holding `old` at the start of chunk `c`, fsynced.
fn synced_store(dir: &Path, c: ChunkId, old: &[u8]) -> ChunkStore {
    synced_store_of(dir, (c, CS), old)
}

/// [`synced_store`] of a chunk `c` of chunk size `cs`.
fn synced_store_of(dir: &Path, (c, cs): (ChunkId, u32), old: &[u8]) -> ChunkStore {
    let s = ChunkStore::open(dir, BIG).unwrap();
    s.write(c, cs, 0, old).unwrap();
    s.fsync(&[c]).unwrap();
    s
}

fn is_corrupt(r: Result<(), DataError>, c: ChunkId, b: u32) -> bool {
    matches!(r, Err(DataError::Corrupt { chunk, block }) if chunk == c && block == b)
}

/// Restarts the store and checks that it counts the same usage and reads the same bytes.
fn restart_keeps(dir: &Path, s: ChunkStore, c: ChunkId, want: &[u8]) {
    restart_keeps_of(dir, s, (c, CS), want);
}

/// [`restart_keeps`] of a chunk `c` of chunk size `cs`.
fn restart_keeps_of(dir: &Path, s: ChunkStore, (c, cs): (ChunkId, u32), want: &[u8]) {
    let usage = s.usage().unwrap();
    drop(s);
    let s = ChunkStore::open(dir, BIG).unwrap();
    assert_eq!(s.usage().unwrap(), usage);
    assert!(read_vec(&s, c, cs, 0, want.len()) == want);
}

/// The chunk sizes the update tests run with, and their blocks: version 3's 64 KiB
/// blocks of 64 MiB chunks and 4 KiB blocks of the default 4 MiB chunks.
const SIZES: [(u32, u32); 2] = [(CS, KIB64), (4 * MIB, 4096)];

#[test]
fn a_partial_overwrite_keeps_the_fsynced_bytes_around_it() {
    // Guards against the v1 bug: a crash between a partial overwrite's data and its crc
    // made the untouched, fsynced bytes of the block read as corrupt.
    for ((cs, block), at) in SIZES
        .into_iter()
        .flat_map(|z| [(z, WriteIntent), (z, WriteData)])
    {
        assert_eq!(Geometry::new(cs).unwrap().block_size, block);
        let tmp = tempfile::tempdir().unwrap();
        let c = chunk(1, 0);
        let mut want = Rng(1).bytes(4 * block as usize);
        let s = synced_store_of(tmp.path(), (c, cs), &want);
        // From the middle of block 1 to the middle of block 3: partial, whole, partial.
        let (off, new) = (block * 3 / 2, Rng(2).bytes(2 * block as usize));
        let range = off as usize..off as usize + new.len();
        let s = crash_write_of(tmp.path(), s, Cut::At(at), (c, cs), off, &new);
        let got = read_vec(&s, c, cs, 0, want.len());
        let mut expect = want.clone();
        if at == WriteData {
            expect[range.clone()].copy_from_slice(&new);
        }
        assert!(got == expect, "{block} {at:?}");
        s.write(c, cs, off, &new).unwrap();
        want[range].copy_from_slice(&new);
        assert!(read_vec(&s, c, cs, 0, want.len()) == want, "{block} {at:?}");
        restart_keeps_of(tmp.path(), s, (c, cs), &want);
    }
}

#[test]
fn a_torn_partial_overwrite_reads_as_corrupt_never_as_a_mix() {
    let tmp = tempfile::tempdir().unwrap();
    let c = chunk(2, 0);
    let old = Rng(3).bytes(3 * KIB64 as usize);
    let s = synced_store(tmp.path(), c, &old);
    // Inside block 1, across five pages.
    let (off, new) = (KIB64 + 100, Rng(4).bytes(20_000));
    let s = crash_write(tmp.path(), s, Cut::TornData, c, off, &new);
    let mut buf = vec![0xA5; old.len()];
    assert!(is_corrupt(s.read(c, CS, 0, &mut buf), c, 1));
    assert!(
        buf.iter().all(|&b| b == 0),
        "no byte of the mix is returned"
    );
    // The limit of this design (see the module docs): the block's bytes outside the
    // torn write go with it.
    assert!(is_corrupt(s.read(c, CS, KIB64, &mut buf[..10]), c, 1));
    assert!(read_vec(&s, c, CS, 0, KIB64 as usize) == old[..KIB64 as usize]);
    assert!(read_vec(&s, c, CS, 2 * KIB64, KIB64 as usize) == old[2 * KIB64 as usize..]);
    // A partial write cannot know the block's other bytes: refused; a whole one replaces it.
    assert!(is_corrupt(s.write(c, CS, off, &new), c, 1));
    let whole = Rng(5).bytes(KIB64 as usize);
    s.write(c, CS, KIB64, &whole).unwrap();
    assert!(read_vec(&s, c, CS, KIB64, KIB64 as usize) == whole);
}

#[test]
fn a_whole_block_overwrite_survives_every_crash_point() {
    for ((cs, block), cut) in SIZES
        .into_iter()
        .flat_map(|z| WRITE_CUTS.map(|cut| (z, cut)))
    {
        let tmp = tempfile::tempdir().unwrap();
        let c = chunk(3, 0);
        let old = Rng(6).bytes(3 * block as usize);
        let s = synced_store_of(tmp.path(), (c, cs), &old);
        let new = Rng(7).bytes(2 * block as usize);
        let s = crash_write_of(tmp.path(), s, cut, (c, cs), block, &new);
        // Blocks whose new bytes are stored: none, block 1 (the torn `pwrite` stopped at
        // the boundary between the two blocks), both.
        let stored = match cut {
            Cut::At(WriteIntent) => 0,
            Cut::TornData => block as usize,
            Cut::At(_) => new.len(),
        };
        let mut expect = old.clone();
        expect[block as usize..][..stored].copy_from_slice(&new[..stored]);
        assert!(
            read_vec(&s, c, cs, 0, old.len()) == expect,
            "{block} {cut:?}"
        );
        s.write(c, cs, block, &new).unwrap();
        let mut want = old.clone();
        want[block as usize..].copy_from_slice(&new);
        restart_keeps_of(tmp.path(), s, (c, cs), &want);
    }
}

#[test]
fn a_torn_whole_block_overwrite_is_corrupt_until_rewritten() {
    let tmp = tempfile::tempdir().unwrap();
    let c = chunk(4, 0);
    let s = synced_store(tmp.path(), c, &Rng(8).bytes(KIB64 as usize));
    let new = Rng(9).bytes(KIB64 as usize);
    let s = crash_write(tmp.path(), s, Cut::TornData, c, 0, &new);
    let mut buf = [0u8; 4];
    assert!(is_corrupt(s.read(c, CS, 0, &mut buf), c, 0));
    // The retried write reads the block to learn which version it holds (neither).
    s.write(c, CS, 0, &new).unwrap();
    restart_keeps(tmp.path(), s, c, &new);
}

#[test]
fn a_first_write_into_an_unwritten_block_survives_every_crash_point() {
    for cut in WRITE_CUTS {
        let tmp = tempfile::tempdir().unwrap();
        let c = chunk(5, 0);
        eprintln!("CUT {cut:?}");
        let block0 = Rng(10).bytes(KIB64 as usize);
        let s = synced_store(tmp.path(), c, &block0);
        let (off, new) = (KIB64 + 1000, Rng(11).bytes(5000));
        let s = crash_write(tmp.path(), s, cut, c, off, &new);
        let mut want = block0.clone();
        want.resize(2 * KIB64 as usize, 0);
        // Its only old version is zeros, which is what a torn write of it reads as too.
        let at = off as usize..off as usize + new.len();
        let mut expect = want.clone();
        if cut == Cut::At(WriteData) {
            expect[at.clone()].copy_from_slice(&new);
        }
        assert!(read_vec(&s, c, CS, 0, want.len()) == expect, "{cut:?}");
        s.write(c, CS, off, &new).unwrap();
        want[at].copy_from_slice(&new);
        restart_keeps(tmp.path(), s, c, &want);
    }
}

#[test]
fn a_crash_in_the_first_write_of_a_chunk_leaves_a_usable_file() {
    for at in [WriteIntent, WriteData] {
        let tmp = tempfile::tempdir().unwrap();
        let c = chunk(6, 1);
        let s = ChunkStore::open(tmp.path(), BIG).unwrap();
        let new = Rng(12).bytes(3000);
        let s = crash_write(tmp.path(), s, Cut::At(at), c, 500, &new);
        let got = read_vec(&s, c, CS, 500, new.len());
        assert!(
            got == if at == WriteData {
                new.clone()
            } else {
                vec![0; new.len()]
            }
        );
        assert_eq!(s.usage().unwrap().chunks, 1);
        s.write(c, CS, 500, &new).unwrap();
        let mut want = vec![0; 500];
        want.extend_from_slice(&new);
        restart_keeps(tmp.path(), s, c, &want);
    }
}

#[test]
fn a_second_crash_keeps_the_version_the_first_one_left() {
    // Guards against trusting a pending entry's "old" crc: after a crash left a block's new
    // bytes under a pending entry, the next update must keep the crc of those bytes.
    for (off, len) in [(100u32, 100usize), (0, KIB64 as usize)] {
        let tmp = tempfile::tempdir().unwrap();
        let c = chunk(7, 0);
        let mut v1 = Rng(13).bytes(KIB64 as usize);
        let s = synced_store(tmp.path(), c, &v1);
        let (p1, p2) = (Rng(14).bytes(len), Rng(15).bytes(len));
        let s = crash_write(tmp.path(), s, Cut::At(WriteData), c, off, &p1);
        v1[off as usize..][..len].copy_from_slice(&p1);
        assert!(read_vec(&s, c, CS, 0, v1.len()) == v1, "{len}");
        let s = crash_write(tmp.path(), s, Cut::At(WriteIntent), c, off, &p2);
        assert!(read_vec(&s, c, CS, 0, v1.len()) == v1, "{len}");
        let s = crash_write(tmp.path(), s, Cut::At(WriteData), c, off, &p2);
        let mut v2 = v1.clone();
        v2[off as usize..][..len].copy_from_slice(&p2);
        assert!(read_vec(&s, c, CS, 0, v2.len()) == v2, "{len}");
        s.write(c, CS, off, &p2).unwrap();
        restart_keeps(tmp.path(), s, c, &v2);
    }
}

#[test]
fn a_truncation_survives_every_crash_point() {
    // Guards against the v1 bug: a crash between cutting the file and rewriting the table
    // left the kept bytes of the boundary block corrupt, and a retry did not repair them.
    for at in [TruncateIntent, TruncateLength] {
        let tmp = tempfile::tempdir().unwrap();
        let c = chunk(8, 0);
        let old = Rng(16).bytes(4 * KIB64 as usize);
        let s = synced_store(tmp.path(), c, &old);
        let keep = KIB64 as usize + 1000;
        kill_at(s, at, |s| drop(s.truncate_file(c.inode, keep as u64, CS)));
        let s = restart(tmp.path());
        let got = read_vec(&s, c, CS, 0, old.len());
        assert!(got[..keep] == old[..keep], "{at:?}");
        // The rest of the boundary block: old bytes until the file is cut, then zeros.
        let tail = keep..2 * KIB64 as usize;
        if at == TruncateIntent {
            assert!(got[tail.clone()] == old[tail.clone()]);
        } else {
            assert!(got[tail.clone()].iter().all(|&b| b == 0));
        }
        assert!(got[tail.end..].iter().all(|&b| b == 0), "{at:?}");
        s.truncate_file(c.inode, keep as u64, CS).unwrap();
        // Bytes past the end read as zeros also after the chunk grows again.
        s.write(c, CS, 3 * KIB64 + 5, &[7]).unwrap();
        let mut want = old[..keep].to_vec();
        want.resize(3 * KIB64 as usize + 6, 0);
        want[3 * KIB64 as usize + 5] = 7;
        restart_keeps(tmp.path(), s, c, &want);
    }
}

#[test]
fn a_retried_truncation_clears_entries_left_past_the_end() {
    // After a power loss the new file length can reach the disk without the table: the
    // entries of the blocks cut off then cover zeros. A retry must clear them, although
    // the file is already short enough.
    let tmp = tempfile::tempdir().unwrap();
    let c = chunk(9, 0);
    let old = Rng(17).bytes(4 * KIB64 as usize);
    drop(synced_store(tmp.path(), c, &old));
    raw_file(tmp.path(), c)
        .set_len(Geometry::new(CS).unwrap().data_offset + 2 * u64::from(KIB64))
        .unwrap();
    let s = restart(tmp.path());
    let mut buf = [0u8; 4];
    assert!(is_corrupt(s.read(c, CS, 2 * KIB64, &mut buf), c, 2));
    s.truncate_file(c.inode, 2 * u64::from(KIB64), CS).unwrap();
    s.write(c, CS, 3 * KIB64 + 1, &[1]).unwrap();
    let mut want = old[..2 * KIB64 as usize].to_vec();
    want.resize(4 * KIB64 as usize, 0);
    want[3 * KIB64 as usize + 1] = 1;
    restart_keeps(tmp.path(), s, c, &want);
}

#[test]
fn a_repair_that_crashes_leaves_a_stale_copy_never_a_missing_one() {
    // Guards against a repair (install of a whole copy) that removed the old file first:
    // a crash before the new bytes left the member without the chunk, read as zeros.
    for at in [CrashPoint::InstallCut, CrashPoint::InstallData] {
        let tmp = tempfile::tempdir().unwrap();
        let c = chunk(9, 0);
        let s = synced_store(tmp.path(), c, &Rng(21).bytes(3 * KIB64 as usize));
        let chain = proto::ChainId(1);
        let missed = ReplicaFields {
            chain,
            version: 4,
            stale: true,
        };
        s.set_replica(c, missed).unwrap();
        let new = Rng(22).bytes(2 * KIB64 as usize + 100);
        let fields = ReplicaFields {
            chain,
            version: 7,
            stale: false,
        };
        kill_at(s, at, |s| drop(s.install(c, CS, &new, fields)));
        let s = restart(tmp.path());
        let m = s.chunk_meta(c).unwrap().expect("the chunk keeps its file");
        assert!(
            m.stale,
            "{at:?}: a copy without its new fields reads as stale"
        );
        // The sweep copies it again.
        s.install(c, CS, &new, fields).unwrap();
        let m = s.chunk_meta(c).unwrap().unwrap();
        assert_eq!((m.version, m.stale, m.len), (7, false, new.len() as u64));
        restart_keeps(tmp.path(), s, c, &new);
    }
}

#[test]
fn a_write_of_several_ranges_reads_all_old_or_all_new_after_a_crash() {
    for (cs, bs) in SIZES {
        for at in [WriteIntent, WriteData] {
            let tmp = tempfile::tempdir().unwrap();
            let c = chunk(9, 0);
            let b = bs as usize;
            let old = Rng(20).bytes(3 * b);
            let s = synced_store_of(tmp.path(), (c, cs), &old);
            // Two ranges in block 0, one across blocks 1 and 2, one past the stored bytes.
            let pieces = [
                (100u32, Rng(21).bytes(200)),
                (400, Rng(22).bytes(300)),
                (bs + bs / 2, Rng(23).bytes(b)),
                (3 * bs + 10, Rng(24).bytes(50)),
            ];
            let ranges: Vec<(u32, &[u8])> =
                pieces.iter().map(|(o, d)| (*o, d.as_slice())).collect();
            kill_at(s, at, |s| drop(s.write_locked(c, cs, &ranges)));
            let s = restart(tmp.path());
            let mut new = old.clone();
            new.resize(3 * b + 60, 0);
            for (o, d) in &pieces {
                new[*o as usize..][..d.len()].copy_from_slice(d);
            }
            let mut before = old.clone();
            before.resize(new.len(), 0);
            let want = if at == WriteData { &new } else { &before };
            assert!(read_vec(&s, c, cs, 0, new.len()) == *want, "{cs} {at:?}");
            s.write_locked(c, cs, &ranges).unwrap();
            restart_keeps_of(tmp.path(), s, (c, cs), &new);
        }
    }
}
