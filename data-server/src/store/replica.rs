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

use super::chunk::{crash_point, CrashPoint, Opened};
use super::format::{bucket_dir, bucket_of, inode_dir, parse_hex16, read_full_at};
use super::{scan, ChunkStore};
use crate::error::{DataError, IoContext};
use proto::data::ChunkMeta;
use proto::{ChainId, ChunkId, InodeId};
use std::fs;
use std::os::unix::fs::FileExt;

const AT: u64 = 24;
const LEN: usize = 20;

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

fn encode(f: ReplicaFields) -> [u8; LEN] {
    let mut b = [0u8; LEN];
    b[0..8].copy_from_slice(&f.version.to_le_bytes());
    b[8..12].copy_from_slice(&f.chain.0.to_le_bytes());
    b[12] = u8::from(f.stale);
    let crc = crc32c::crc32c(&b[..16]);
    b[16..20].copy_from_slice(&crc.to_le_bytes());
    b
}

fn decode(chunk: ChunkId, b: &[u8; LEN]) -> Result<ReplicaFields, DataError> {
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

impl ChunkStore {
    /// What this store holds of `chunk`: `None` if it holds no file for it.
    pub fn chunk_meta(&self, chunk: ChunkId) -> Result<Option<ChunkMeta>, DataError> {
        let _shared = self.read_lock(chunk);
        self.meta_locked(chunk)
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
        let Some(meta) = self.meta_locked(chunk)? else {
            return Ok(None);
        };
        let Opened::Chunk(cf) = self.open_chunk(chunk)? else {
            return Ok(None);
        };
        let mut buf = vec![0u8; meta.len as usize];
        cf.read(0, &mut buf)?;
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
        let key = |c: ChunkId| (bucket_of(c.inode), c.inode, c.index);
        let start = after.map_or(0, |c| bucket_of(c.inode));
        let mut out = Vec::new();
        for b in start..=255u8 {
            let dir = bucket_dir(&self.root, b);
            let mut inodes = Vec::new();
            for entry in fs::read_dir(&dir).ctx(|| format!("list {}", dir.display()))? {
                let entry = entry.ctx(|| format!("list {}", dir.display()))?;
                let inode = entry
                    .file_name()
                    .to_str()
                    .and_then(parse_hex16)
                    .map(InodeId);
                if let Some(inode) = inode.filter(|&i| inode_dir(&self.root, i) == entry.path()) {
                    inodes.push(inode);
                }
            }
            inodes.sort_unstable();
            for inode in inodes {
                if after.is_some_and(|a| (b, inode) < (bucket_of(a.inode), a.inode)) {
                    continue;
                }
                let mut indexes = scan::list_chunks(&self.root, inode)?;
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

#[cfg(test)]
mod tests {
    use super::*;

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
