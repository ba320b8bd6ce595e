//! Behaviour of the store on damaged disks and bad requests: checksums catch flipped
//! bytes, peers cannot make it panic or overrun, capacity is enforced.

use super::tests::{chunk, read_vec, Rng, BIG, KIB64};
use super::*;
use std::os::unix::fs::FileExt;

/// The chunk size of these tests: its blocks are 64 KiB (as every block of a version 2
/// file was), which the offsets below are placed around.
const CS: u32 = 64 << 20;

/// XORs one byte of a file, as bit rot or a stray write would.
fn flip(path: &Path, pos: u64) {
    let f = File::options().read(true).write(true).open(path).unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, pos).unwrap();
    f.write_all_at(&[b[0] ^ 0x40], pos).unwrap();
}

fn data_offset(cs: u32) -> u64 {
    Geometry::new(cs).unwrap().data_offset
}

fn is_corrupt(r: Result<(), DataError>, c: ChunkId, b: u32) -> bool {
    matches!(r, Err(DataError::Corrupt { chunk, block }) if chunk == c && block == b)
}

#[test]
fn a_flipped_data_byte_fails_only_its_block() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    let c = chunk(1, 0);
    let data = Rng(5).bytes(4 * KIB64 as usize);
    s.write(c, CS, 0, &data).unwrap();
    flip(
        &s.chunk_file_path(c),
        data_offset(CS) + 2 * u64::from(KIB64) + 17,
    );
    let mut buf = vec![0xA5; 4 * KIB64 as usize];
    assert!(is_corrupt(s.read(c, CS, 0, &mut buf), c, 2));
    assert!(
        buf.iter().all(|&b| b == 0),
        "no bytes of a failed read are returned"
    );
    let mut small = [0xA5; 1];
    assert!(is_corrupt(
        s.read(c, CS, 2 * KIB64 + 9000, &mut small),
        c,
        2
    ));
    assert_eq!(small, [0]);
    // The other blocks still read fine, also right up to the damaged one.
    let below = read_vec(&s, c, CS, 0, 2 * KIB64 as usize);
    assert!(below[..] == data[..2 * KIB64 as usize]);
    assert!(read_vec(&s, c, CS, 3 * KIB64, 10) == data[3 * KIB64 as usize..][..10]);
    // A partial write into the damaged block is refused...
    assert!(is_corrupt(s.write(c, CS, 2 * KIB64 + 1, &[0]), c, 2));
    // ...a write of the whole block replaces it.
    s.write(c, CS, 2 * KIB64, &[6; KIB64 as usize]).unwrap();
    assert_eq!(read_vec(&s, c, CS, 2 * KIB64, 2), vec![6, 6]);
}

#[test]
fn a_flipped_table_byte_is_caught() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    let c = chunk(2, 0);
    s.write(c, CS, 0, &[9; 2 * KIB64 as usize]).unwrap();
    let path = s.chunk_file_path(c);
    let entry = |b: u64| format::HEADER_BYTES + format::ENTRY_BYTES as u64 * b;
    // A byte of block 0's crc.
    flip(&path, entry(0) + 1);
    let mut buf = [0u8; 4];
    assert!(is_corrupt(s.read(c, CS, 0, &mut buf), c, 0));
    // The byte holding block 1's kind: must not turn into a hole of zeros.
    let f = File::options().read(true).write(true).open(&path).unwrap();
    f.write_all_at(&[0], entry(1) + 8).unwrap();
    assert!(is_corrupt(s.read(c, CS, KIB64, &mut buf), c, 1));
    // A damaged entry does not stop a write of the whole block, which replaces it.
    s.write(c, CS, KIB64, &[4; KIB64 as usize]).unwrap();
    assert_eq!(read_vec(&s, c, CS, KIB64, 2), vec![4, 4]);
    // An entry of a block never written, set by damage.
    flip(&path, entry(5) + 6);
    assert!(is_corrupt(s.read(c, CS, 5 * KIB64, &mut buf), c, 5));
    assert!(is_corrupt(s.write(c, CS, 5 * KIB64, &[1]), c, 5));
}

#[test]
fn a_damaged_header_is_detected() {
    let tmp = tempfile::tempdir().unwrap();
    let positions = [0u64, 9, 13, 17, 22];
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    for (i, pos) in positions.into_iter().enumerate() {
        let c = chunk(3, i as u64);
        s.write(c, CS, 0, &[1; 10]).unwrap();
        flip(&s.chunk_file_path(c), pos);
    }
    // A header is checked when its file is opened, not while the store keeps it open (the
    // geometry it read then is still the right one): the restart opens every file again.
    drop(s);
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    for (i, pos) in positions.into_iter().enumerate() {
        let c = chunk(3, i as u64);
        let mut buf = [0u8; 4];
        let err = s.read(c, CS, 0, &mut buf).unwrap_err();
        assert!(
            matches!(err, DataError::CorruptHeader { .. }),
            "byte {pos}: {err}"
        );
        assert_eq!(err.code(), proto::ErrorCode::Corrupt);
        assert!(s.write(c, CS, 0, &[2]).is_err());
    }
    // Its space is still counted, and deleting the file removes it.
    assert_eq!(s.usage().unwrap().chunks, 5);
    s.delete_file(InodeId(3)).unwrap();
    let u = s.usage().unwrap();
    assert_eq!((u.used_bytes, u.chunks), (0, 0));
}

#[test]
fn bad_sizes_and_ranges_are_invalid_arguments() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    let c = chunk(4, 0);
    let invalid = |r: Result<(), DataError>| matches!(r, Err(DataError::InvalidArgument(_)));
    let mut buf = [0u8; 8];
    for cs in [0, 1000, 32 << 10, (1 << 20) + 1, 128 << 20, u32::MAX] {
        assert!(invalid(s.write(c, cs, 0, &[1])), "chunk size {cs}");
        assert!(invalid(s.read(c, cs, 0, &mut buf)), "chunk size {cs}");
        assert!(invalid(s.truncate_file(c.inode, 0, cs)), "chunk size {cs}");
    }
    assert!(invalid(s.write(c, CS, CS - 4, &[0; 5])));
    assert!(invalid(s.write(c, CS, u32::MAX, &[0])));
    assert!(invalid(s.read(c, CS, CS, &mut buf)));
    assert!(invalid(s.read(c, KIB64, u32::MAX - 2, &mut buf)));
    // A chunk written with one chunk size refuses another one.
    s.write(c, CS, 0, &[1; 8]).unwrap();
    s.write(chunk(4, 1), CS, 0, &[1]).unwrap();
    assert!(invalid(s.write(c, CS / 2, 0, &[1])));
    assert!(invalid(s.read(c, CS / 2, 0, &mut buf)));
    // Refused before it removes chunk 1 (which starts past 3 bytes at either size).
    assert!(invalid(s.truncate_file(c.inode, 3, CS / 2)));
    assert_eq!(read_vec(&s, c, CS, 0, 8), vec![1; 8]);
    let chunks = s.usage().unwrap().chunks;
    assert_eq!(chunks, 2, "refused requests create and remove nothing");
}

#[test]
fn writes_past_the_capacity_fail_with_no_space() {
    let tmp = tempfile::tempdir().unwrap();
    let one_block = data_offset(CS) + u64::from(KIB64);
    let s = ChunkStore::open(tmp.path(), 2 * one_block).unwrap();
    s.write(chunk(1, 0), CS, 0, &[1; KIB64 as usize]).unwrap();
    s.write(chunk(2, 0), CS, 0, &[2; KIB64 as usize]).unwrap();
    assert_eq!(s.usage().unwrap().used_bytes, 2 * one_block);
    let full = s.write(chunk(3, 0), CS, 0, &[3]);
    assert!(matches!(full, Err(DataError::NoSpace(_))));
    assert!(
        !s.chunk_file_path(chunk(3, 0)).exists(),
        "no file left behind"
    );
    let grow = s.write(chunk(1, 0), CS, KIB64, &[3]);
    assert_eq!(grow.unwrap_err().code(), proto::ErrorCode::NoSpace);
    // Overwriting what is stored needs no new space, even when full.
    s.write(chunk(1, 0), CS, 10, &[4; 100]).unwrap();
    assert_eq!(read_vec(&s, chunk(1, 0), CS, 9, 3), vec![1, 4, 4]);
    assert_eq!(read_vec(&s, chunk(1, 0), CS, KIB64, 1), vec![0]);
    s.delete_file(InodeId(2)).unwrap();
    s.write(chunk(3, 0), CS, 0, &[3]).unwrap();
    assert_eq!(s.usage().unwrap().chunks, 2);
}

#[test]
fn truncating_a_damaged_block_does_not_launder_it() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    let c = chunk(6, 0);
    s.write(c, CS, 0, &[5; 2 * KIB64 as usize]).unwrap();
    flip(&s.chunk_file_path(c), data_offset(CS) + 10);
    s.truncate_file(c.inode, 1000, CS).unwrap();
    let mut buf = [0u8; 4];
    assert!(is_corrupt(s.read(c, CS, 0, &mut buf), c, 0));
}

#[test]
fn stray_bytes_in_an_unwritten_block_read_as_zeros() {
    // A crash can leave data on disk whose table entry was never written: the block was
    // never acknowledged, so it reads as zeros and later partial writes see zeros too.
    let tmp = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    let c = chunk(7, 0);
    s.write(c, CS, 0, &[1; 10]).unwrap();
    let f = File::options()
        .write(true)
        .open(s.chunk_file_path(c))
        .unwrap();
    f.write_all_at(&[0xEE; 300], data_offset(CS) + u64::from(KIB64))
        .unwrap();
    assert_eq!(read_vec(&s, c, CS, KIB64, 300), vec![0; 300]);
    s.write(c, CS, KIB64 + 100, &[2; 5]).unwrap();
    let got = read_vec(&s, c, CS, KIB64, 300);
    assert!(got[..100].iter().all(|&b| b == 0));
    assert_eq!(&got[100..105], &[2; 5]);
    assert!(got[105..].iter().all(|&b| b == 0));
}

#[test]
fn an_empty_chunk_file_left_by_a_crash_is_reused() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    let c = chunk(8, 2);
    std::fs::create_dir_all(s.inode_path(c.inode)).unwrap();
    File::create(s.chunk_file_path(c)).unwrap();
    drop(s);
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    assert_eq!(read_vec(&s, c, CS, 0, 4), vec![0; 4]);
    s.write(c, CS, 1, &[3]).unwrap();
    assert_eq!(read_vec(&s, c, CS, 0, 2), vec![0, 3]);
    let used = s.usage().unwrap();
    drop(s);
    assert_eq!(
        ChunkStore::open(tmp.path(), BIG).unwrap().usage().unwrap(),
        used
    );
}

#[test]
fn writes_that_would_eat_the_disk_reserve_fail_with_no_space() {
    // Guards against data servers filling the disk to the last byte, which left the
    // metadata store (same disk in a local cluster) unable to commit even a deletion.
    let tmp = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    s.write(chunk(1, 0), CS, 0, &[1; KIB64 as usize]).unwrap();
    // More than any disk has free: always short of room.
    let s = s.disk_reserve(u64::MAX / 2);
    let grow = s.write(chunk(2, 0), CS, 0, &[2]);
    assert!(matches!(grow, Err(DataError::NoSpace(_))), "{grow:?}");
    assert!(
        !s.chunk_file_path(chunk(2, 0)).exists(),
        "no file left behind"
    );
    // Overwriting stored bytes takes no new room; deleting gives room back.
    s.write(chunk(1, 0), CS, 10, &[4; 100]).unwrap();
    assert_eq!(read_vec(&s, chunk(1, 0), CS, 9, 3), vec![1, 4, 4]);
    s.delete_file(InodeId(1)).unwrap();
    let s = s.disk_reserve(0);
    s.write(chunk(2, 0), CS, 0, &[2]).unwrap();
}

/// Guards against a chunk file grown past its chunk size (damage, or a hostile disk)
/// being taken at its length: a whole-chunk fetch allocated that many bytes.
#[test]
fn a_chunk_file_longer_than_its_chunk_size_is_corrupt() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ChunkStore::open(tmp.path(), BIG).unwrap();
    let c = chunk(4, 0);
    s.write(c, CS, 0, &[1; 10]).unwrap();
    drop(s);
    let path = tmp.path().to_owned();
    let s = ChunkStore::open(&path, BIG).unwrap();
    let f = File::options()
        .write(true)
        .open(s.chunk_file_path(c))
        .unwrap();
    // Sparse: a terabyte of length costs no disk.
    f.set_len(data_offset(CS) + (1 << 40)).unwrap();
    drop(s);
    let s = ChunkStore::open(&path, BIG).unwrap();
    let err = s.fetch(c).unwrap_err();
    assert!(matches!(err, DataError::CorruptHeader { .. }), "{err}");
    let mut buf = [0u8; 4];
    assert!(matches!(
        s.read(c, CS, 0, &mut buf),
        Err(DataError::CorruptHeader { .. })
    ));
}

/// Guards against the store's I/O metrics missing an operation, counting the bytes of
/// a failed read, or a checksum failure under the wrong operation.
#[test]
fn a_counting_store_counts_its_io_and_where_each_checksum_failure_was_found() {
    let tmp = tempfile::tempdir().unwrap();
    let m = telemetry::Metrics::new().unwrap();
    let io = StoreIo::register(&m).unwrap();
    let s = ChunkStore::open(tmp.path(), BIG).unwrap().count_io(io);
    let c = chunk(3, 0);
    s.write(c, CS, 0, &[7; 2 * KIB64 as usize]).unwrap();
    s.fsync(&[c]).unwrap();
    assert_eq!(read_vec(&s, c, CS, 0, 100), vec![7; 100]);
    flip(&s.chunk_file_path(c), data_offset(CS) + 5);
    let mut buf = [0u8; 10];
    assert!(is_corrupt(s.read(c, CS, 0, &mut buf), c, 0));
    assert!(is_corrupt(s.write(c, CS, 1, &[0]), c, 0));
    assert!(s.fetch(c).is_err());
    let t = telemetry::text::parse(&m.render()).unwrap();
    let v = |name: &str, op: &str| t.value(name, &[("op", op)]).unwrap_or(-1.0);
    let ops = "tessera_data_store_operations_total";
    assert_eq!(v(ops, "write"), 2.0, "the write and the refused one");
    assert_eq!(v(ops, "fsync"), 1.0);
    assert_eq!(v(ops, "read"), 3.0, "two reads and the fetch's");
    let bytes = "tessera_data_store_bytes_total";
    assert_eq!(v(bytes, "write"), 2.0 * f64::from(KIB64));
    assert_eq!(v(bytes, "read"), 100.0, "failed reads move no bytes");
    let secs = "tessera_data_store_duration_seconds_count";
    assert_eq!(v(secs, "fsync"), 1.0);
    let failures = "tessera_data_checksum_failures_total";
    for (op, n) in [
        ("read", 1.0),
        ("write", 1.0),
        ("fetch", 1.0),
        ("header", 0.0),
    ] {
        let found = t.value(failures, &[("found", op)]).unwrap_or(-1.0);
        assert_eq!(found, n, "{op}");
    }
    assert_eq!(t.kind(failures), Some("counter"));
    assert_eq!(
        t.kind("tessera_data_store_duration_seconds"),
        Some("histogram")
    );
}
