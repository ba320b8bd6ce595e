//! What chain replication keeps with each chunk: its chain, its version and whether this
//! copy is stale; listing a chain's chunks; copying a chunk whole (resync and repair).
//!
//! The replica fields live in the header page, in bytes the format leaves zero:
//!
//! | offset | size | contents |
//! | --- | --- | --- |
//! | 24 | 8 | version (u64), bumped by every write, truncation and hole |
//! | 32 | 4 | chain id (u32) |
//! | 36 | 1 | 1 if this copy missed a write and must be copied whole, else 0 |
//! | 37 | 3 | zero |
//! | 40 | 4 | crc32c of bytes 24..40 |
//!
//! Twenty zero bytes mean "never recorded" (a chunk written before replication, or by a
//! write that crashed before recording it): version 0, which never equals a version a
//! head hands out, so a resync copies such a chunk. The fields are one 20-byte `pwrite`
//! inside one page, so a crash leaves them old or new.
//!
//! A chain write's piece goes through [`ChunkStore::write_versioned`], which holds the
//! chunk's stripe lock across the three steps, so no other write, install or read of the
//! fields comes between them:
//!
//! 1. read the fields and decide whether this copy is stale ([`Stamp::judge`]);
//! 2. store the bytes (the three steps of a write, see the store's docs);
//! 3. record the new version, even if step 2 failed (its bytes may have changed in part).
//!
//! A crash after 2 and before 3 leaves the new bytes under the old version. A resync
//! pass compares versions, so it repairs that copy only once another member has recorded
//! a newer version: a write that crashed on every member before its version was recorded
//! (a multi-piece write whose head died) leaves copies that differ under one version, and
//! nothing finds them. The client was never answered for that write.

use super::chunk::{crash_point, CrashPoint, Opened};
use super::format::{bucket_of, read_full_at};
use super::io::{Found, IoOp};
use super::{scan, ChunkStore};
use crate::error::{DataError, IoContext};
use proto::data::ChunkMeta;
use proto::{ChainId, ChunkId, InodeId};
use std::os::unix::fs::FileExt;

pub(super) const AT: u64 = 24;
pub(super) const LEN: usize = 20;

/// The replica fields of one chunk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicaFields {
    /// The chunk's chain.
    pub chain: ChainId,
    /// Its version.
    pub version: u64,
    /// This copy missed a write.
    pub stale: bool,
}

pub(super) fn encode(f: ReplicaFields) -> [u8; LEN] {
    let mut b = [0u8; LEN];
    b[0..8].copy_from_slice(&f.version.to_le_bytes());
    b[8..12].copy_from_slice(&f.chain.0.to_le_bytes());
    b[12] = u8::from(f.stale);
    let crc = crc32c::crc32c(&b[..16]);
    b[16..20].copy_from_slice(&crc.to_le_bytes());
    b
}

pub(super) fn decode(chunk: ChunkId, b: &[u8; LEN]) -> Result<ReplicaFields, DataError> {
    if b.iter().all(|&x| x == 0) {
        return Ok(ReplicaFields::default());
    }
    let crc = u32::from_le_bytes([b[16], b[17], b[18], b[19]]);
    if crc != crc32c::crc32c(&b[..16]) || b[12] > 1 || b[13..16] != [0, 0, 0] {
        return Err(DataError::CorruptHeader {
            chunk,
            reason: "replica fields damaged".into(),
        });
    }
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[0..8]);
    Ok(ReplicaFields {
        version: u64::from_le_bytes(v),
        chain: ChainId(u32::from_le_bytes([b[8], b[9], b[10], b[11]])),
        stale: b[12] == 1,
    })
}

/// The version a chain write gives a copy, as its head decided it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// The chunk's chain.
    pub chain: ChainId,
    /// The chunk's version after the write.
    pub version: u64,
    /// The version the head had before it.
    pub base: u64,
    /// Whether this copy is stale, if known before storing (at the head: never).
    pub stale: Option<bool>,
}

impl Stamp {
    /// Whether a copy holding `have` before this write is stale after it. The same
    /// write may arrive again (a retry): the first moves the version from `base` to
    /// `version`, the others find `version` already.
    pub fn judge(&self, chunk: ChunkId, have: ReplicaFields) -> bool {
        let stale = have.stale || (have.version != self.base && have.version != self.version);
        if stale && !have.stale {
            tracing::info!(%chunk, have = have.version, base = self.base, "copy missed a write, marked stale");
        }
        stale
    }
}

/// Where the bytes of one piece of a write come from.
#[derive(Clone, Copy, Debug)]
pub enum Fill<'a> {
    /// These bytes.
    Bytes(&'a [u8]),
    /// This many zeros (written only over stored bytes: past them a chunk reads as zeros
    /// already, so punching a hole never allocates).
    Zeros(u32),
}

/// What [`ChunkStore::write_versioned`] did.
#[derive(Debug)]
pub struct Versioned {
    /// Whether the bytes were stored; the version is recorded either way.
    pub stored: Result<(), DataError>,
    /// Whether this copy is stale after the write.
    pub stale: bool,
}

/// Zeros are written at most this many bytes at a time, so that zeroing a whole chunk
/// takes a bounded buffer.
const ZERO_PIECE_BYTES: u32 = 1 << 20;

impl ChunkStore {
    /// Stores the pieces of a chain write given as `(offset, fill)`, in order, stopping
    /// at the first that fails (none: a write whose bytes never arrived still moves the
    /// version), and records `stamp`, deciding and writing under one lock (see the
    /// module docs for the order). Fails only if the fields cannot be read or recorded;
    /// a failure to store the bytes is in `stored`.
    pub fn write_versioned(
        &self,
        chunk: ChunkId,
        chunk_size: u32,
        fills: &[(u32, Fill<'_>)],
        stamp: Stamp,
    ) -> Result<Versioned, DataError> {
        let _excl = self.write_lock(chunk);
        self.check_open()?;
        let stale = match stamp.stale {
            Some(s) => s,
            None => stamp.judge(chunk, self.fields_locked(chunk)?),
        };
        // Bytes go in one store write (one pass over the table), zeros each on their own.
        let bytes: Option<Vec<(u32, &[u8])>> = fills
            .iter()
            .map(|&(at, f)| match f {
                Fill::Bytes(b) => Some((at, b)),
                Fill::Zeros(_) => None,
            })
            .collect();
        let stored = match bytes {
            Some(ranges) if ranges.len() > 1 => self.write_locked(chunk, chunk_size, &ranges),
            _ => fills
                .iter()
                .try_for_each(|&(at, f)| self.fill_locked(chunk, chunk_size, at, f)),
        };
        let fields = ReplicaFields {
            chain: stamp.chain,
            version: stamp.version,
            stale,
        };
        self.set_replica_locked(chunk, fields)?;
        Ok(Versioned { stored, stale })
    }

    /// Stores one piece of a write without recording a version (the version moves when
    /// the write's last piece is stored, with [`ChunkStore::write_versioned`]).
    pub fn write_fill(
        &self,
        chunk: ChunkId,
        chunk_size: u32,
        at: u32,
        fill: Fill<'_>,
    ) -> Result<(), DataError> {
        let _excl = self.write_lock(chunk);
        self.fill_locked(chunk, chunk_size, at, fill)
    }

    fn fill_locked(
        &self,
        chunk: ChunkId,
        chunk_size: u32,
        at: u32,
        fill: Fill<'_>,
    ) -> Result<(), DataError> {
        let len = match fill {
            Fill::Bytes(data) => return self.write_locked(chunk, chunk_size, &[(at, data)]),
            Fill::Zeros(n) => n,
        };
        let stored = match self.open_chunk(chunk)? {
            Opened::Chunk(cf) => cf.data_len,
            Opened::Missing | Opened::Empty(_) => 0,
        };
        let len = u64::from(len).min(stored.saturating_sub(u64::from(at))) as u32;
        let zeros = vec![0u8; ZERO_PIECE_BYTES.min(len) as usize];
        let mut done = 0u32;
        while done < len {
            let n = ZERO_PIECE_BYTES.min(len - done);
            let piece_at = at.checked_add(done).ok_or_else(|| {
                DataError::InvalidArgument(format!("zero range at {at} overflows"))
            })?;
            self.write_locked(chunk, chunk_size, &[(piece_at, &zeros[..n as usize])])?;
            done += n;
        }
        Ok(())
    }

    /// The replica fields of `chunk` (zero for a chunk without a file). Call holding its
    /// stripe lock.
    fn fields_locked(&self, chunk: ChunkId) -> Result<ReplicaFields, DataError> {
        Ok(self
            .meta_locked(chunk)?
            .map_or(ReplicaFields::default(), |m| ReplicaFields {
                chain: m.chain,
                version: m.version,
                stale: m.stale,
            }))
    }

    /// What this store holds of `chunk`: `None` if it holds no file for it.
    pub fn chunk_meta(&self, chunk: ChunkId) -> Result<Option<ChunkMeta>, DataError> {
        let _shared = self.read_lock(chunk);
        self.noted(Found::Header, self.meta_locked(chunk))
    }

    /// Asks the kernel to start reading the page that holds `chunk`'s replica fields,
    /// without waiting. A chunk file kept open (`cache.rs`) has no page of it in memory
    /// after the page cache was dropped or reclaimed; a read that checks the fields after
    /// its bytes then waits for one disk read, the two in flight together, instead of two
    /// one after the other. A file not kept open needs none: opening it reads that page
    /// with its header. Advice only: nothing changes if it fails.
    pub fn prefetch_fields(&self, chunk: ChunkId) {
        if let Some(((file, _), _)) = self.files.get(chunk) {
            super::chunk::advise(&file, AT, LEN, libc::POSIX_FADV_WILLNEED);
        }
    }

    fn meta_locked(&self, chunk: ChunkId) -> Result<Option<ChunkMeta>, DataError> {
        let Opened::Chunk(cf) = self.open_chunk(chunk)? else {
            return Ok(None);
        };
        let mut b = [0u8; LEN];
        read_full_at(&cf.file, &mut b, AT).ctx(|| format!("read {}", cf.path.display()))?;
        let f = decode(chunk, &b)?;
        Ok(Some(ChunkMeta {
            chunk,
            chain: f.chain,
            version: f.version,
            len: cf.data_len,
            chunk_size_bytes: cf.geo.chunk_size,
            stale: f.stale,
        }))
    }

    /// Records the replica fields of a chunk that has a file; a chunk without one (a
    /// hole never written) has nothing to record.
    pub fn set_replica(&self, chunk: ChunkId, fields: ReplicaFields) -> Result<(), DataError> {
        let _excl = self.write_lock(chunk);
        self.check_open()?;
        self.set_replica_locked(chunk, fields)
    }

    fn set_replica_locked(&self, chunk: ChunkId, fields: ReplicaFields) -> Result<(), DataError> {
        let Opened::Chunk(cf) = self.open_chunk(chunk)? else {
            return Ok(());
        };
        cf.file
            .write_all_at(&encode(fields), AT)
            .ctx(|| format!("write {}", cf.path.display()))
    }

    /// The whole chunk's bytes and its state, read under one lock so they agree.
    pub fn fetch(&self, chunk: ChunkId) -> Result<Option<(ChunkMeta, Vec<u8>)>, DataError> {
        let _shared = self.read_lock(chunk);
        let r = self.fetch_locked(chunk);
        self.noted(Found::Fetch, r)
    }

    fn fetch_locked(&self, chunk: ChunkId) -> Result<Option<(ChunkMeta, Vec<u8>)>, DataError> {
        let Some(meta) = self.meta_locked(chunk)? else {
            return Ok(None);
        };
        let Opened::Chunk(cf) = self.open_chunk(chunk)? else {
            return Ok(None);
        };
        let mut buf = vec![0u8; meta.len as usize];
        self.counted(IoOp::Read, meta.len, || cf.read(0, &mut buf))?;
        Ok(Some((meta, buf)))
    }

    /// Replaces this store's copy of a chunk by `data` with the given state.
    ///
    /// In place, never through a moment without the chunk's file: a crash between a
    /// removal and the new bytes left a member without the chunk, which reads as a hole
    /// (zeros) and carries no stale mark for the sweep to find. The copy is marked stale
    /// (and synced) first, then cut and rewritten: until the new fields are in, a crash
    /// leaves a stale copy, which reads refuse and the sweep copies again.
    /// A copy of a chunk of a file deleted here is not installed (see
    /// `ChunkStore::unless_removed`).
    pub fn install(
        &self,
        chunk: ChunkId,
        chunk_size: u32,
        data: &[u8],
        fields: ReplicaFields,
    ) -> Result<(), DataError> {
        self.unless_removed(chunk.inode, || {
            self.install_copy(chunk, chunk_size, data, fields)
        })
    }

    fn install_copy(
        &self,
        chunk: ChunkId,
        chunk_size: u32,
        data: &[u8],
        fields: ReplicaFields,
    ) -> Result<(), DataError> {
        match self.chunk_meta(chunk)? {
            Some(m) if m.chunk_size_bytes == chunk_size => {
                let stale = ReplicaFields {
                    chain: m.chain,
                    version: m.version,
                    stale: true,
                };
                self.set_replica(chunk, stale)?;
                self.fsync(&[chunk])?;
                self.cut(chunk, chunk_size)?;
                crash_point(CrashPoint::InstallCut);
            }
            // Another chunk size (not written by this file's layout): start afresh.
            Some(_) => {
                self.remove_chunk(chunk)?;
            }
            None => {}
        }
        // An empty chunk still gets a file, so that its version is recorded.
        if data.is_empty() {
            self.write(chunk, chunk_size, 0, &[0u8])?;
            self.cut(chunk, chunk_size)?;
        } else {
            self.write(chunk, chunk_size, 0, data)?;
        }
        crash_point(CrashPoint::InstallData);
        self.set_replica(chunk, fields)?;
        self.fsync(&[chunk])
    }

    /// Cuts a one-byte placeholder chunk back to zero bytes.
    fn cut(&self, chunk: ChunkId, chunk_size: u32) -> Result<(), DataError> {
        let geo = super::format::Geometry::new(chunk_size)?;
        self.cut_chunk(chunk, geo, 0)
    }

    /// Removes one chunk; returns whether it existed.
    pub fn delete_chunk(&self, chunk: ChunkId) -> Result<bool, DataError> {
        self.remove_chunk(chunk)
    }

    /// Up to `limit` chunks held here after `after`, in store order (bucket, inode,
    /// index), whatever their chain.
    pub fn list_after(
        &self,
        after: Option<ChunkId>,
        limit: usize,
    ) -> Result<Vec<ChunkId>, DataError> {
        let key = list_order;
        let start = after.map_or(0, |c| bucket_of(c.inode));
        let mut out = Vec::new();
        for b in start..=255u8 {
            for (inode, seen) in scan::bucket_inodes(&self.root, b)? {
                if after.is_some_and(|a| (b, inode) < (bucket_of(a.inode), a.inode)) {
                    continue;
                }
                let mut indexes = scan::chunks_seen(&self.root, inode, seen)?;
                indexes.sort_unstable();
                for index in indexes {
                    let c = ChunkId { inode, index };
                    if after.is_some_and(|a| key(c) <= key(a)) {
                        continue;
                    }
                    out.push(c);
                    if out.len() >= limit {
                        return Ok(out);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Up to `limit` chunks after `after` in store order that belong to `chain` (to any
    /// chain with `None`). A chunk whose replica fields cannot be read comes back as
    /// `Err(chunk)`: its chain is unknown, so it is listed whatever chain was asked for.
    pub fn chain_chunks(
        &self,
        chain: Option<ChainId>,
        after: Option<ChunkId>,
        limit: usize,
    ) -> Result<Vec<Result<ChunkMeta, ChunkId>>, DataError> {
        const PAGE: usize = 4096;
        let mut out = Vec::new();
        let mut cursor = after;
        while out.len() < limit {
            let page = self.list_after(cursor, PAGE)?;
            let Some(&last) = page.last() else { break };
            for c in page {
                match self.chunk_meta(c) {
                    Ok(Some(m)) if chain.is_none_or(|ch| ch == m.chain) => out.push(Ok(m)),
                    Ok(_) => {}
                    Err(_) => out.push(Err(c)),
                }
                if out.len() >= limit {
                    break;
                }
            }
            cursor = Some(last);
        }
        Ok(out)
    }
}

/// Where `chunk` comes in the order [`ChunkStore::list_after`] lists chunks: by bucket,
/// then inode, then index.
pub fn list_order(chunk: ChunkId) -> (u8, InodeId, u64) {
    (bucket_of(chunk.inode), chunk.inode, chunk.index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::InodeId;

    const C: ChunkId = ChunkId {
        inode: InodeId(5),
        index: 2,
    };

    #[test]
    fn fields_round_trip_and_zero_means_unrecorded() {
        let f = ReplicaFields {
            chain: ChainId(3),
            version: 77,
            stale: true,
        };
        assert_eq!(decode(C, &encode(f)).unwrap(), f);
        assert_eq!(decode(C, &[0; LEN]).unwrap(), ReplicaFields::default());
        let mut bad = encode(f);
        bad[3] ^= 1;
        assert!(decode(C, &bad).is_err());
    }

    /// The version/stale decision and the bytes under one lock: a copy at the head's
    /// base takes the write fresh, the same write again stays fresh, a copy that missed a
    /// write goes stale, and a write whose bytes never came still moves the version.
    #[test]
    fn a_versioned_write_judges_stores_and_records() {
        let dir = tempfile::tempdir().unwrap();
        let store = ChunkStore::open(dir.path(), 1 << 30).unwrap();
        let cs = 1 << 20;
        let stamp = |version, base| Stamp {
            chain: ChainId(2),
            version,
            base,
            stale: None,
        };
        let meta = |s: &ChunkStore| {
            let m = s.chunk_meta(C).unwrap().unwrap();
            (m.version, m.stale, m.len)
        };
        let v = store
            .write_versioned(C, cs, &[(0, Fill::Bytes(b"abcdef"))], stamp(1, 0))
            .unwrap();
        assert!(v.stored.is_ok() && !v.stale, "{v:?}");
        assert_eq!(meta(&store), (1, false, 6));
        let again = store
            .write_versioned(C, cs, &[(0, Fill::Bytes(b"abcdef"))], stamp(1, 0))
            .unwrap();
        assert!(!again.stale, "a retried write finds its own version");
        let v = store
            .write_versioned(C, cs, &[(2, Fill::Zeros(2))], stamp(2, 1))
            .unwrap();
        assert!(!v.stale);
        let mut buf = [9u8; 6];
        store.read(C, cs, 0, &mut buf).unwrap();
        assert_eq!(&buf, b"ab\0\0ef");
        let missed = store
            .write_versioned(C, cs, &[(0, Fill::Bytes(b"x"))], stamp(9, 8))
            .unwrap();
        assert!(
            missed.stale,
            "version 2 is neither base 8 nor 9: a write was missed"
        );
        assert_eq!(meta(&store), (9, true, 6));
        let v = store.write_versioned(C, cs, &[], stamp(10, 9)).unwrap();
        assert!(v.stale, "stale stays stale until copied whole");
        assert_eq!(meta(&store), (10, true, 6));
        store
            .write_fill(C, cs, 6, Fill::Zeros(1 << 19))
            .expect("zeros past the stored bytes are already there");
        assert_eq!(meta(&store), (10, true, 6), "no version, no growth");
    }

    #[test]
    fn versions_install_and_listing() {
        let dir = tempfile::tempdir().unwrap();
        let store = ChunkStore::open(dir.path(), 1 << 30).unwrap();
        let cs = 1 << 20;
        store.write(C, cs, 10, b"hello").unwrap();
        let f = ReplicaFields {
            chain: ChainId(4),
            version: 9,
            stale: false,
        };
        store.set_replica(C, f).unwrap();
        let m = store.chunk_meta(C).unwrap().unwrap();
        assert_eq!(
            (m.version, m.chain, m.len, m.stale),
            (9, ChainId(4), 15, false)
        );
        let (m2, bytes) = store.fetch(C).unwrap().unwrap();
        assert_eq!(m2, m);
        assert_eq!(&bytes[10..], b"hello");

        let other = ChunkId {
            inode: InodeId(300),
            index: 0,
        };
        store.install(other, cs, &bytes, f).unwrap();
        assert_eq!(store.fetch(other).unwrap().unwrap().1, bytes);
        let empty = ChunkId {
            inode: InodeId(300),
            index: 1,
        };
        store.install(empty, cs, &[], f).unwrap();
        assert_eq!(store.chunk_meta(empty).unwrap().unwrap().len, 0);
        assert_eq!(store.chunk_meta(empty).unwrap().unwrap().version, 9);
        // An empty copy is fetched as such (its whole length, no bytes, read nothing).
        let (m3, none) = store.fetch(empty).unwrap().unwrap();
        assert_eq!((m3.len, none.len()), (0, 0));

        let all = store.list_after(None, 100).unwrap();
        assert_eq!(all.len(), 3);
        let page1 = store.list_after(None, 2).unwrap();
        let page2 = store.list_after(Some(page1[1]), 2).unwrap();
        assert_eq!([page1, page2].concat(), all);
        let elsewhere = ChunkId {
            inode: InodeId(301),
            index: 0,
        };
        let f5 = ReplicaFields {
            chain: ChainId(5),
            ..f
        };
        store.install(elsewhere, cs, b"x", f5).unwrap();
        let of = |chain| store.chain_chunks(chain, None, usize::MAX).unwrap().len();
        assert_eq!(
            (of(Some(ChainId(4))), of(Some(ChainId(5))), of(None)),
            (3, 1, 4)
        );
        let first = store.chain_chunks(Some(ChainId(4)), None, 2).unwrap();
        let last = match first[1] {
            Ok(ref m) => m.chunk,
            Err(c) => c,
        };
        assert_eq!(
            store
                .chain_chunks(Some(ChainId(4)), Some(last), 9)
                .unwrap()
                .len(),
            1
        );
        assert!(store.delete_chunk(C).unwrap());
        assert_eq!(store.chunk_meta(C).unwrap(), None);
    }
}
