//! Behaviour of the store on healthy disks: reads, writes, holes, truncation, deletion,
//! durability bookkeeping and restarts, partly checked against an in-memory model.

use super::*;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use transport::{AlignedBuf, REGION_ALIGN_BYTES};

pub(super) const MIB: u32 = 1 << 20;
pub(super) const KIB64: u32 = 64 << 10;
pub(super) const BIG: u64 = 1 << 40;

pub(super) fn chunk(inode: u64, index: u64) -> ChunkId {
    ChunkId {
        inode: InodeId(inode),
        index,
    }
}

/// A small deterministic PRNG (splitmix64), so a failing seed can be replayed.
pub(super) struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

pub(super) fn read_vec(s: &ChunkStore, c: ChunkId, cs: u32, off: u32, len: usize) -> Vec<u8> {
    // Pre-filled with a pattern, so that bytes the store forgot to set show up. Page-aligned
    // as a transport's region is, so block-aligned reads of large chunks take O_DIRECT.
    let mut buf = AlignedBuf::zeroed(len);
    buf.fill(0xA5);
    s.read(c, cs, off, &mut buf).unwrap();
    buf.to_vec()
}

/// Writes `data` at `off` from a region placed as the client's would be: the chunk's page
/// boundaries fall on page boundaries of memory, so its whole blocks can go O_DIRECT.
fn write_aligned(s: &ChunkStore, c: ChunkId, cs: u32, off: u32, data: &[u8]) {
    let shift = off as usize % REGION_ALIGN_BYTES;
    let mut buf = AlignedBuf::zeroed(shift + data.len());
    buf[shift..].copy_from_slice(data);
    s.write(c, cs, off, &buf[shift..]).unwrap();
}

/// The whole file as the model expects it, one chunk at a time: chunk `i` covers file
/// bytes `[i * cs, (i + 1) * cs)`.
struct Model {
    cs: u32,
    files: HashMap<u64, Vec<u8>>,
    chunks: BTreeSet<ChunkId>,
}

impl Model {
    fn write(&mut self, c: ChunkId, off: u32, data: &[u8]) {
        let file = self.files.entry(c.inode.0).or_default();
        let start = (c.index * u64::from(self.cs) + u64::from(off)) as usize;
        if file.len() < start + data.len() {
            file.resize(start + data.len(), 0);
        }
        file[start..start + data.len()].copy_from_slice(data);
        self.chunks.insert(c);
    }

    fn expect(&self, c: ChunkId, off: u32, len: usize) -> Vec<u8> {
        let empty = Vec::new();
        let file = self.files.get(&c.inode.0).unwrap_or(&empty);
        let start = (c.index * u64::from(self.cs) + u64::from(off)) as usize;
        (start..start + len)
            .map(|i| file.get(i).copied().unwrap_or(0))
            .collect()
    }

    fn truncate(&mut self, inode: u64, size: u64) {
        if let Some(file) = self.files.get_mut(&inode) {
            file.truncate(file.len().min(size as usize));
        }
        let cs = u64::from(self.cs);
        self.chunks
            .retain(|c| c.inode.0 != inode || c.index * cs < size);
    }
}

/// A random range inside a chunk, often starting or ending near a block boundary.
fn random_range(rng: &mut Rng, cs: u32) -> (u32, usize) {
    let bs = u64::from(format::Geometry::new(cs).unwrap().block_size);
    let off = match rng.below(3) {
        0 => rng.below(u64::from(cs)),
        1 => (rng.below(u64::from(cs) / bs) * bs + rng.below(16)).min(u64::from(cs) - 1),
        _ => (rng.below(u64::from(cs) / bs) * bs).saturating_sub(rng.below(16)),
    };
    let room = u64::from(cs) - off;
    let len = match rng.below(3) {
        0 => rng.below(room.min(64)) + 1,
        1 => rng.below(room.min(3 * bs)) + 1,
        _ => rng.below(room) + 1,
    };
    (off as u32, len as usize)
}

/// Two to eight ranges with their bytes, in order, not overlapping (some touching), often
/// several in one block and some across block boundaries.
fn random_ranges(rng: &mut Rng, cs: u32) -> Vec<(u32, Vec<u8>)> {
    let bs = u64::from(format::Geometry::new(cs).unwrap().block_size);
    let mut at = rng.below(u64::from(cs));
    let mut out = Vec::new();
    for _ in 0..2 + rng.below(7) {
        let room = u64::from(cs) - at;
        if room == 0 {
            break;
        }
        let len = match rng.below(3) {
            0 => rng.below(room.min(600)) + 1,
            1 => rng.below(room.min(2 * bs)) + 1,
            _ => rng.below(room.min(8 * bs)) + 1,
        };
        out.push((at as u32, rng.bytes(len as usize)));
        at += len;
        at += match rng.below(3) {
            0 => 0,
            1 => rng.below(bs / 2),
            _ => rng.below(3 * bs),
        };
        if at >= u64::from(cs) {
            break;
        }
    }
    out
}

#[test]
fn random_writes_reads_and_truncates_match_a_model() {
    model_run(4 * KIB64, 0x7E55_E7A5);
}

/// Chunks over 1 MiB also move whole blocks with O_DIRECT (where the file system
/// allows it): the same model check on 2 MiB chunks covers that path.
#[test]
fn random_writes_reads_and_truncates_of_large_chunks_match_a_model() {
    model_run(2 * MIB, 0x000D_1EC7);
}

/// Files of format version 2 (64 KiB blocks), as an earlier build left them, are read,
/// written and cut as before; 16 MiB chunks have blocks of 16 KiB in version 3.
#[test]
fn version_2_files_and_larger_blocks_match_the_model_too() {
    model_run_v2(4 * KIB64, 0x0002_7E55, usize::MAX);
    model_run_v2(2 * MIB, 0x0002_D1EC, usize::MAX);
    model_run(16 * MIB, 0x0016_D1EC);
}

/// Version 2 files an earlier build left, then written, read, cut and recounted by this
/// build, whose requests' geometry (version 3) is not theirs.
#[test]
fn version_2_files_keep_their_geometry_under_this_builds_requests() {
    model_run_v2(4 * KIB64, 0x0023_7E55, 100);
    model_run_v2(4 * MIB, 0x0023_D1EC, 100);
}

fn model_run(cs: u32, seed: u64) {
    model_run_v2(cs, seed, 0);
}

/// The model run, its chunk files made as version 2 in its first `v2_steps` steps.
fn model_run_v2(cs: u32, seed: u64, v2_steps: usize) {
    format::NEW_FILES_V2.with(|v2| v2.set(v2_steps > 0));
    let tmp = tempfile::tempdir().unwrap();
    let mut store = ChunkStore::open(tmp.path(), BIG).unwrap();
    let mut model = Model {
        cs,
        files: HashMap::new(),
        chunks: BTreeSet::new(),
    };
    let mut rng = Rng(seed);
    // The format version each chunk's file was made with: a write makes a file of the
    // version new files have then; later writes, cuts and restarts keep it.
    let mut made_as: HashMap<ChunkId, u32> = HashMap::new();
    for step in 0..400 {
        if step == v2_steps {
            format::NEW_FILES_V2.with(|v2| v2.set(false));
        }
        let c = chunk(1 + rng.below(3), rng.below(4));
        match rng.below(10) {
            0..=4 => {
                let pieces = if rng.below(3) == 0 {
                    random_ranges(&mut rng, cs)
                } else {
                    let (off, len) = random_range(&mut rng, cs);
                    vec![(off, rng.bytes(len))]
                };
                if let [(off, data)] = pieces.as_slice() {
                    write_aligned(&store, c, cs, *off, data);
                } else {
                    // Several ranges as one write (a chain write of ranges stores so).
                    let ranges: Vec<(u32, &[u8])> =
                        pieces.iter().map(|(o, d)| (*o, d.as_slice())).collect();
                    store.write_locked(c, cs, &ranges).unwrap();
                }
                if !model.chunks.contains(&c) {
                    made_as.insert(c, if step < v2_steps { 2 } else { 3 });
                }
                for (off, data) in &pieces {
                    model.write(c, *off, data);
                }
            }
            5..=7 => {
                let (off, len) = random_range(&mut rng, cs);
                let got = read_vec(&store, c, cs, off, len);
                assert!(
                    got == model.expect(c, off, len),
                    "step {step}: {c} {off}+{len}"
                );
            }
            8 => {
                let size = rng.below(5 * u64::from(cs));
                store.truncate_file(c.inode, size, cs).unwrap();
                model.truncate(c.inode.0, size);
                made_as.retain(|c, _| model.chunks.contains(c));
                assert_eq!(store.usage().unwrap().chunks, model.chunks.len() as u64);
            }
            _ => {
                // Restart: the usage recounted from disk must equal the running count.
                let before = store.usage().unwrap();
                drop(store);
                store = ChunkStore::open(tmp.path(), BIG).unwrap();
                assert_eq!(store.usage().unwrap(), before, "step {step}");
            }
        }
    }
    let mut versions = BTreeSet::new();
    for c in model.chunks.clone() {
        assert_eq!(
            read_vec(&store, c, cs, 0, cs as usize),
            model.expect(c, 0, cs as usize)
        );
        // Each file has the geometry (format version, block size) it was made with.
        let path = chunk_path(&chunks_root(tmp.path()), c);
        match chunk::ChunkFile::open(&path, c, false).unwrap() {
            chunk::Opened::Chunk(cf) => {
                assert_eq!(Some(&cf.geo.version), made_as.get(&c), "{c}");
                versions.insert(cf.geo.version);
            }
            _ => panic!("{c}: no chunk file"),
        }
    }
    format::NEW_FILES_V2.with(|v2| v2.set(false));
    if (1..400).contains(&v2_steps) {
        // Else the run did not mix them (a seed to change).
        assert_eq!(
            versions,
            BTreeSet::from([2, 3]),
            "files of both versions at the end"
        );
    }
    assert_eq!(store.usage().unwrap().chunks, model.chunks.len() as u64);
    // The usage recounted from every file, whatever its version, is the running count.
    let before = store.usage().unwrap();
    drop(store);
    let store = ChunkStore::open(tmp.path(), BIG).unwrap();
    assert_eq!(store.usage().unwrap(), before);
}

/// Pages of `path` in `[from, from + len)` that are in the page cache (`mincore` of a
/// read-only mapping).
fn resident_pages(path: &std::path::Path, from: u64, len: usize) -> usize {
    use std::os::unix::io::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    let page = 4096u64;
    let start = from / page * page;
    let span = (from + len as u64 - start) as usize;
    let mut vec = vec![0u8; span.div_ceil(page as usize)];
    // SAFETY: a read-only shared mapping of an open file, unmapped before returning;
    // `vec` has one byte per page of the mapping, as mincore writes.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            start as libc::off_t,
        );
        assert_ne!(p, libc::MAP_FAILED);
        assert_eq!(libc::mincore(p, span, vec.as_mut_ptr()), 0);
        libc::munmap(p, span);
    }
    vec.iter().filter(|&&b| b & 1 == 1).count()
}

/// Guards against a data server keeping in its page cache the bytes of small chunks it
/// sends: the reading client's kernel caches them, and a data set read once through a
/// mount filled the memory with both copies and ran at half speed reclaiming them.
#[test]
fn bytes_read_from_a_small_chunk_leave_this_servers_page_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    let c = chunk(8, 0);
    let data = Rng(8).bytes(300_000);
    s.write(c, 4 * MIB, 0, &data).unwrap();
    s.fsync(&[c]).unwrap();
    let path = chunk_path(&chunks_root(tmp.path()), c);
    let data_at = std::fs::metadata(&path).unwrap().len() - data.len() as u64;
    // Read back through the page cache first (clean pages, as after a write settled).
    let _ = std::fs::read(&path).unwrap();
    assert!(
        resident_pages(&path, data_at, data.len()) > 0,
        "the file is cached before"
    );
    assert_eq!(read_vec(&s, c, 4 * MIB, 0, data.len()), data);
    assert_eq!(
        resident_pages(&path, data_at, data.len()),
        0,
        "pages of the bytes read stay cached"
    );
    // With direct_io off, this server caches what it reads, for other clients.
    let s = s.direct_io(false);
    assert_eq!(read_vec(&s, c, 4 * MIB, 0, data.len()), data);
    assert!(
        resident_pages(&path, data_at, data.len()) > 0,
        "kept with direct_io off"
    );
}

#[test]
fn holes_and_missing_chunks_read_as_zeros() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    let c = chunk(5, 0);
    assert_eq!(read_vec(&s, c, MIB, 0, 4096), vec![0; 4096]);
    assert_eq!(s.usage().unwrap().chunks, 0, "a read creates nothing");
    s.write(c, MIB, 200_000, &[7; 1000]).unwrap();
    let got = read_vec(&s, c, MIB, 0, 300_000);
    assert!(got[..200_000].iter().all(|&b| b == 0));
    assert!(got[200_000..201_000].iter().all(|&b| b == 7));
    assert!(got[201_000..].iter().all(|&b| b == 0));
    // A hole left between two written blocks.
    s.write(c, MIB, 900_000, &[9; 10]).unwrap();
    assert_eq!(read_vec(&s, c, MIB, 500_000, 4), vec![0; 4]);
    // Empty reads and writes are fine and create nothing.
    s.write(chunk(6, 0), MIB, 10, &[]).unwrap();
    assert_eq!(read_vec(&s, chunk(6, 0), MIB, 10, 0), Vec::<u8>::new());
    assert_eq!(s.usage().unwrap().chunks, 1);
}

/// Guards `SEEK_DATA`/`SEEK_HOLE` against holes where bytes are: blocks never written
/// and blocks written with zeros are holes, a block with one byte of data is data, and
/// a missing chunk has no blocks at all.
#[test]
fn data_blocks_name_the_blocks_with_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    let c = chunk(8, 0);
    assert_eq!(s.data_blocks(c, MIB).unwrap(), None);
    s.write(c, MIB, 0, &[1; 8192]).unwrap();
    s.write(c, MIB, 8192, &[0; 8192]).unwrap();
    s.write(c, MIB, 5 * 4096 + 4095, &[2]).unwrap();
    s.write(c, MIB, 40_000, &[3; 10]).unwrap();
    let got = s.data_blocks(c, MIB).unwrap().unwrap();
    assert_eq!(got.block_bytes, 4096);
    assert_eq!(got.runs, [(0, 2), (5, 6), (9, 10)]);
    // Data zeroed again is a hole; an empty chunk holds none.
    s.write(c, MIB, 0, &[0; 8192]).unwrap();
    assert_eq!(
        s.data_blocks(c, MIB).unwrap().unwrap().runs,
        [(5, 6), (9, 10)]
    );
    s.write(chunk(9, 0), MIB, 10, &[]).unwrap();
    let empty = s.data_blocks(chunk(9, 0), MIB).unwrap();
    assert!(
        empty.as_ref().is_none_or(|b| b.runs.is_empty()),
        "{empty:?}"
    );
}

#[test]
fn partial_block_writes_merge_with_what_is_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    let c = chunk(9, 3);
    s.write(c, MIB, 0, &vec![1; 3 * KIB64 as usize]).unwrap();
    // Straddles the boundary of blocks 0 and 1, then a few bytes inside block 2.
    s.write(c, MIB, KIB64 - 5, &[2; 10]).unwrap();
    s.write(c, MIB, 2 * KIB64 + 100, &[3; 3]).unwrap();
    let got = read_vec(&s, c, MIB, 0, 3 * KIB64 as usize);
    let mut want = vec![1u8; 3 * KIB64 as usize];
    want[KIB64 as usize - 5..KIB64 as usize + 5].fill(2);
    want[2 * KIB64 as usize + 100..2 * KIB64 as usize + 103].fill(3);
    assert!(got == want);
    // Reads that start and end inside blocks.
    assert_eq!(read_vec(&s, c, MIB, KIB64 - 6, 3), vec![1, 2, 2]);
}

#[test]
fn reads_past_the_chunk_end_are_zeros() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    let c = chunk(2, 0);
    s.write(c, MIB, 0, &[4; 100]).unwrap();
    let got = read_vec(&s, c, MIB, 50, 2 * KIB64 as usize);
    assert_eq!(&got[..50], &[4; 50]);
    assert!(got[50..].iter().all(|&b| b == 0));
    // Up to the last byte of the chunk.
    assert_eq!(read_vec(&s, c, MIB, MIB - 1, 1), vec![0]);
}

#[test]
fn truncate_down_then_extend_reads_zeros() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    let c = chunk(3, 0);
    for keep in [70_000u32, KIB64, 1] {
        s.write(c, MIB, 0, &vec![0xFF; 200_000]).unwrap();
        s.truncate_file(c.inode, u64::from(keep), MIB).unwrap();
        s.write(c, MIB, 300_000, &[8]).unwrap();
        let got = read_vec(&s, c, MIB, 0, 400_000);
        let k = keep as usize;
        assert!(got[..k].iter().all(|&b| b == 0xFF), "keep {keep}");
        assert!(got[k..300_000].iter().all(|&b| b == 0), "keep {keep}");
        assert_eq!(got[300_000], 8);
        assert!(got[300_001..].iter().all(|&b| b == 0));
    }
}

#[test]
fn truncate_across_chunks_removes_later_chunks() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    let ino = 77;
    for i in 0..5 {
        s.write(chunk(ino, i), KIB64, 0, &vec![i as u8 + 1; KIB64 as usize])
            .unwrap();
    }
    s.truncate_file(InodeId(ino), 2 * u64::from(KIB64) + 10, KIB64)
        .unwrap();
    assert_eq!(s.usage().unwrap().chunks, 3);
    assert!(!s.chunk_file_path(chunk(ino, 3)).exists());
    assert!(!s.chunk_file_path(chunk(ino, 4)).exists());
    assert_eq!(read_vec(&s, chunk(ino, 1), KIB64, 0, 3), vec![2; 3]);
    let tail = read_vec(&s, chunk(ino, 2), KIB64, 0, 20);
    assert_eq!(&tail[..10], &[3; 10]);
    assert_eq!(&tail[10..], &[0; 10]);
    assert_eq!(read_vec(&s, chunk(ino, 4), KIB64, 0, 3), vec![0; 3]);
    // Exactly at a chunk boundary: chunk 1 stays whole, chunk 2 goes.
    s.truncate_file(InodeId(ino), u64::from(KIB64) * 2, KIB64)
        .unwrap();
    assert_eq!(s.usage().unwrap().chunks, 2);
    assert_eq!(read_vec(&s, chunk(ino, 1), KIB64, KIB64 - 1, 1), vec![2]);
    s.truncate_file(InodeId(ino), 0, KIB64).unwrap();
    assert_eq!(s.usage().unwrap().chunks, 0);
    // Offsets near u64::MAX overflow nothing: the last chunk a u64 size can reach is cut
    // to the bytes below u64::MAX, a chunk past it (start > u64::MAX) is dropped.
    let last = u64::MAX / u64::from(KIB64);
    s.write(chunk(ino, last), KIB64, KIB64 - 2, &[1, 2])
        .unwrap();
    s.write(chunk(ino, u64::MAX), KIB64, 0, &[1]).unwrap();
    s.truncate_file(InodeId(ino), u64::MAX, KIB64).unwrap();
    assert_eq!(
        read_vec(&s, chunk(ino, last), KIB64, KIB64 - 2, 2),
        vec![1, 0]
    );
    assert_eq!(s.usage().unwrap().chunks, 1);
    s.truncate_file(InodeId(ino), 1, KIB64).unwrap();
    assert_eq!(s.usage().unwrap().chunks, 0);
}

#[test]
fn delete_file_is_idempotent_and_frees_space() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    for i in 0..3 {
        s.write(chunk(10, i), MIB, 0, &[1; 5000]).unwrap();
    }
    s.write(chunk(11, 0), MIB, 0, &[2; 5000]).unwrap();
    let one_chunk = s.usage().unwrap().used_bytes / 4;
    s.delete_file(InodeId(10)).unwrap();
    assert!(!s.inode_path(InodeId(10)).exists());
    assert!(!s.chunk_file_path(chunk(10, 0)).exists());
    let u = s.usage().unwrap();
    assert_eq!((u.chunks, u.used_bytes), (1, one_chunk));
    assert_eq!(read_vec(&s, chunk(10, 1), MIB, 0, 4), vec![0; 4]);
    s.delete_file(InodeId(10)).unwrap();
    s.delete_file(InodeId(12345)).unwrap();
    assert_eq!(s.usage().unwrap().chunks, 1);
    assert_eq!(read_vec(&s, chunk(11, 0), MIB, 0, 2), vec![2; 2]);
    // The file can be written again after its deletion.
    s.write(chunk(10, 0), MIB, 0, &[3]).unwrap();
    assert_eq!(read_vec(&s, chunk(10, 0), MIB, 0, 1), vec![3]);
}

/// Guards against a resync or repair bringing back a chunk of a file deleted while its
/// copy was on the way (fetched before the deletion, installed after it): the chunk
/// stayed, space no deletion freed until a sweep.
#[test]
fn a_copy_of_a_deleted_files_chunk_is_not_installed() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    let fields = ReplicaFields {
        chain: proto::ChainId(1),
        version: 2,
        stale: false,
    };
    s.install(chunk(20, 0), MIB, &[7; 100], fields).unwrap();
    assert_eq!(read_vec(&s, chunk(20, 0), MIB, 0, 2), vec![7; 2]);
    s.delete_file(InodeId(20)).unwrap();
    s.install(chunk(20, 1), MIB, &[8; 100], fields).unwrap();
    assert!(
        !s.inode_path(InodeId(20)).exists(),
        "a deleted file's chunk came back"
    );
    assert_eq!(s.usage().unwrap().chunks, 0);
    // Another file's copy still goes in.
    s.install(chunk(21, 0), MIB, &[9; 100], fields).unwrap();
    assert_eq!(read_vec(&s, chunk(21, 0), MIB, 0, 2), vec![9; 2]);
}

#[test]
fn reopen_keeps_data_and_usage() {
    let tmp = tempfile::tempdir().unwrap();
    let data = Rng(11).bytes(3 * KIB64 as usize + 123);
    let usage = {
        let s = ChunkStore::open(tmp.path(), BIG).unwrap();
        s.write(chunk(4, 1), MIB, 777, &data).unwrap();
        s.fsync(&[chunk(4, 1)]).unwrap();
        s.usage().unwrap()
    };
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    assert_eq!(s.usage().unwrap(), usage);
    assert!(read_vec(&s, chunk(4, 1), MIB, 777, data.len()) == data);
}

#[test]
fn a_close_saves_the_usage_for_one_open_and_refuses_changes_after_it() {
    let tmp = tempfile::tempdir().unwrap();
    let saved = {
        let s = ChunkStore::open(tmp.path(), BIG).unwrap();
        for i in 0..3 {
            s.write(chunk(7, i), MIB, 0, &[7; 5000]).unwrap();
        }
        s.close().unwrap();
        let refused = |r: Result<(), DataError>| matches!(r, Err(DataError::Closed { .. }));
        assert!(refused(s.write(chunk(7, 3), MIB, 0, &[1])));
        assert!(refused(s.truncate_file(InodeId(7), 100, MIB)));
        assert!(refused(s.delete_file(InodeId(7))));
        assert_eq!(
            read_vec(&s, chunk(7, 0), MIB, 0, 2),
            vec![7; 2],
            "reads go on"
        );
        s.usage().unwrap()
    };
    assert_eq!((saved.chunks, saved.used_bytes > 0), (3, true));
    assert!(tmp.path().join("usage").exists());
    // A chunk file removed while the server is down shows which count an open uses: the
    // saved one the first time (nothing read the chunks), a fresh count after that (the
    // first open took the file away).
    fs::remove_file(chunk_path(&chunks_root(tmp.path()), chunk(7, 2))).unwrap();
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    assert_eq!(s.usage().unwrap(), saved, "the saved usage");
    assert!(!tmp.path().join("usage").exists(), "taken at open");
    drop(s);
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    let counted = s.usage().unwrap();
    assert_eq!(counted.chunks, 2, "counted after a stop without close");
    assert_eq!(counted.used_bytes, saved.used_bytes / 3 * 2);
}

#[test]
fn a_directory_is_opened_by_one_store_at_a_time() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    let second = ChunkStore::open(tmp.path(), BIG);
    assert!(matches!(second, Err(DataError::Locked { .. })));
    drop(s);
    ChunkStore::open(tmp.path(), BIG).unwrap();
}

#[test]
fn node_id_survives_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    {
        let s = ChunkStore::open(tmp.path(), BIG).unwrap();
        assert_eq!(s.load_node_id().unwrap(), None);
        s.save_node_id(NodeId(3)).unwrap();
    }
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    assert_eq!(s.load_node_id().unwrap(), Some(NodeId(3)));
}

#[test]
fn fsync_syncs_the_directories_that_changed() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    let (a, b) = (chunk(300, 0), chunk(300, 1));
    s.write(a, MIB, 0, &[1]).unwrap();
    // A first chunk's file is named in the bucket.
    assert_eq!(s.dirty_dirs(), 1);
    // The new inode directory (in the bucket) and the new file (in the inode directory).
    s.write(b, MIB, 0, &[1]).unwrap();
    assert_eq!(s.dirty_dirs(), 2);
    s.fsync(&[a, b, a, chunk(300, 9), chunk(999, 0)]).unwrap();
    assert_eq!(s.dirty_dirs(), 0);
    // Overwrites change no directory.
    s.write(a, MIB, 0, &[2]).unwrap();
    assert_eq!(s.dirty_dirs(), 0);
}

#[test]
fn concurrent_writes_into_one_block_lose_nothing() {
    // Guards against a read-modify-write race: two writers merging into the same block
    // must not overwrite each other's bytes or checksums.
    let tmp = tempfile::tempdir().unwrap();
    let s = Arc::new(ChunkStore::open(tmp.path(), BIG).unwrap());
    let c = chunk(42, 0);
    let threads: Vec<_> = (0..8u8)
        .map(|t| {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                for round in 0..16u32 {
                    let off = (round * 8 + u32::from(t)) * 500;
                    s.write(c, MIB, off, &[t + 1; 500]).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let got = read_vec(&s, c, MIB, 0, 128 * 500);
    for (i, piece) in got.chunks(500).enumerate() {
        assert!(piece.iter().all(|&b| b == (i % 8) as u8 + 1), "piece {i}");
    }
}

#[test]
fn a_removed_chunk_file_is_not_written_through_the_cache() {
    // Guards against a stale cached descriptor: a write after a delete or a truncation
    // would go to the removed file and vanish with its last close.
    let tmp = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    let (a, b) = (chunk(50, 0), chunk(50, 1));
    s.write(a, MIB, 0, &[1; 10]).unwrap();
    s.write(b, MIB, 0, &[1; 10]).unwrap();
    assert_eq!(read_vec(&s, a, MIB, 0, 1), vec![1]);
    s.delete_file(InodeId(50)).unwrap();
    s.write(a, MIB, 0, &[2]).unwrap();
    s.write(b, MIB, 0, &[2]).unwrap();
    s.truncate_file(InodeId(50), 1, MIB).unwrap();
    s.write(b, MIB, 1, &[3]).unwrap();
    assert_eq!(s.open_files(), 2);
    drop(s);
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    assert_eq!(read_vec(&s, a, MIB, 0, 2), vec![2, 0]);
    assert_eq!(read_vec(&s, b, MIB, 0, 2), vec![0, 3]);
    assert_eq!(s.usage().unwrap().chunks, 2);
}

#[test]
fn open_files_are_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    let n = cache::DEFAULT_OPEN_CHUNK_FILES as u64 + 20;
    for i in 0..n {
        s.write(chunk(60, i), KIB64, 0, &i.to_le_bytes()).unwrap();
    }
    assert_eq!(s.open_files(), cache::DEFAULT_OPEN_CHUNK_FILES);
    for i in (0..n).rev() {
        assert_eq!(read_vec(&s, chunk(60, i), KIB64, 0, 8), i.to_le_bytes());
    }
    assert_eq!(s.open_files(), cache::DEFAULT_OPEN_CHUNK_FILES);
}

#[test]
fn only_chunks_over_a_mebibyte_get_an_o_direct_descriptor() {
    // A small file's chunk is read and written buffered anyway: a second (O_DIRECT) open
    // of it would only cost time on every member of every small file's chain.
    let tmp = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    let direct = |c: ChunkId| s.files.get(c).expect("cached").0 .1.is_some();
    let (small, large) = (chunk(70, 0), chunk(71, 0));
    let cs = 4 * MIB;
    write_aligned(&s, small, cs, 0, &Rng(1).bytes(100_000));
    write_aligned(&s, large, cs, 0, &Rng(2).bytes(2 * MIB as usize));
    assert!(!direct(small));
    // Where the file system refuses O_DIRECT, no chunk gets one, and nothing else changes.
    let supported = direct(large);
    // Grown past the threshold, the cached file gets one at its next open.
    let more = Rng(3).bytes(MIB as usize);
    write_aligned(&s, small, cs, MIB, &more);
    assert_eq!(read_vec(&s, small, cs, MIB, more.len()), more);
    assert_eq!(direct(small), supported);
    drop(s);
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    assert_eq!(read_vec(&s, small, cs, MIB, more.len()), more);
    assert_eq!(s.files.get(small).unwrap().0 .1.is_some(), supported);
}

/// Guards against chunks lost or unreadable when a store of the first tree layout (every
/// chunk in its inode's directory) is opened by this build: each chunk 0 moves into its
/// bucket, the directory of a one-chunk file goes, the rest stays, usage and listings
/// see every chunk; a tree version this build does not know is refused.
#[test]
fn a_version_1_tree_gets_its_first_chunks_moved_into_the_buckets() {
    let tmp = tempfile::tempdir().unwrap();
    let (small, big) = (chunk(40, 0), [chunk(41, 0), chunk(41, 1)]);
    {
        let s = ChunkStore::open(tmp.path(), BIG).unwrap();
        s.write(small, MIB, 0, &[4; 3000]).unwrap();
        for c in big {
            s.write(c, MIB, 0, &[5; 3000]).unwrap();
        }
    }
    // Back to the first layout: chunk 0 in the inode directories, no version file, no
    // saved usage (so the open counts the tree).
    let root = chunks_root(tmp.path());
    for ino in [40, 41] {
        let inode = InodeId(ino);
        fs::create_dir_all(inode_dir(&root, inode)).unwrap();
        fs::rename(
            format::first_chunk_path(&root, inode),
            format::nested_first_chunk_path(&root, inode),
        )
        .unwrap();
    }
    fs::remove_file(tmp.path().join("chunk_tree")).unwrap();
    assert!(!tmp.path().join("usage").exists());

    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    assert_eq!(
        fs::read_to_string(tmp.path().join("chunk_tree")).unwrap(),
        "2\n"
    );
    assert!(s.chunk_file_path(small).exists());
    assert!(
        !s.inode_path(InodeId(40)).exists(),
        "an empty inode directory"
    );
    assert!(!format::nested_first_chunk_path(&root, InodeId(41)).exists());
    assert_eq!(read_vec(&s, small, MIB, 2998, 3), vec![4, 4, 0]);
    for c in big {
        assert_eq!(read_vec(&s, c, MIB, 2999, 1), vec![5]);
    }
    assert_eq!(s.usage().unwrap().chunks, 3);
    assert_eq!(s.list_after(None, 10).unwrap(), vec![small, big[0], big[1]]);
    s.truncate_file(InodeId(41), 0, MIB).unwrap();
    assert_eq!(s.list_after(None, 10).unwrap(), vec![small]);
    drop(s);

    // A move a crash cut short: the chunk moved, its empty directory left behind.
    fs::create_dir(inode_dir(&root, InodeId(40))).unwrap();
    fs::remove_file(tmp.path().join("chunk_tree")).unwrap();
    drop(ChunkStore::open(tmp.path(), BIG).unwrap());
    assert!(!inode_dir(&root, InodeId(40)).exists());
    // Chunk 0 in both places (an older build run on a moved store): refused, both kept.
    fs::create_dir(inode_dir(&root, InodeId(40))).unwrap();
    let nested = format::nested_first_chunk_path(&root, InodeId(40));
    fs::copy(format::first_chunk_path(&root, InodeId(40)), &nested).unwrap();
    fs::remove_file(tmp.path().join("chunk_tree")).unwrap();
    assert!(matches!(
        ChunkStore::open(tmp.path(), BIG),
        Err(DataError::TreeConflict { .. })
    ));
    assert!(nested.exists() && format::first_chunk_path(&root, InodeId(40)).exists());

    fs::write(tmp.path().join("chunk_tree"), "3\n").unwrap();
    assert!(matches!(
        ChunkStore::open(tmp.path(), BIG),
        Err(DataError::UnsupportedTree { .. })
    ));
}
