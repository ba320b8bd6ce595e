//! Stored values: one format-version byte, then postcard.
//!
//! Records use their own types rather than the wire types, so a change of a wire message
//! can never silently change what is on disk; the kind of an inode is stored as an
//! explicit number for the same reason.

use crate::error::MetaError;
use proto::{Attr, ChainId, FileKind, InodeId, Layout, Timestamp};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// Version of the on-disk format, kept in the superblock; a mismatch refuses to open.
pub(crate) const FORMAT_VERSION: u32 = 1;

/// First byte of every stored value: the format version (which fits a byte).
const RECORD_VERSION: u8 = FORMAT_VERSION as u8;

/// Encodes a record with its version byte.
pub(crate) fn encode<T: Serialize>(record: &T) -> Result<Vec<u8>, MetaError> {
    let body = proto::codec::encode(record, usize::MAX)
        .map_err(|e| MetaError::Corrupt(format!("cannot encode a record: {e}")))?;
    let mut out = Vec::with_capacity(body.len() + 1);
    out.push(RECORD_VERSION);
    out.extend_from_slice(&body);
    Ok(out)
}

/// Decodes a record, refusing an unknown version byte or trailing bytes.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, MetaError> {
    match bytes.split_first() {
        Some((&RECORD_VERSION, body)) => {
            proto::codec::decode(body).map_err(|e| MetaError::Corrupt(format!("{what}: {e}")))
        }
        Some((v, _)) => Err(MetaError::Corrupt(format!("{what}: record version {v}"))),
        None => Err(MetaError::Corrupt(format!("{what}: empty record"))),
    }
}

/// Counters and the format version, under key `S`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Superblock {
    /// On-disk format of the whole store.
    pub format_version: u32,
    /// Next inode number to hand out; numbers are never reused.
    pub next_inode: u64,
    /// Next data server id to hand out.
    pub next_node: u32,
    /// Inodes in use (for statfs), updated in the batch that adds or removes one.
    pub inode_count: u64,
    /// Session ids below this may have been handed out before; see `Namespace::open`.
    pub session_ceiling: u64,
    /// Client ids below this may have been handed out before.
    pub client_ceiling: u64,
}

impl Superblock {
    /// The superblock of a store holding only the root directory.
    pub(crate) fn initial() -> Superblock {
        Superblock {
            format_version: FORMAT_VERSION,
            next_inode: InodeId::ROOT.0 + 1,
            next_node: 1,
            inode_count: 1,
            session_ceiling: 1,
            client_ceiling: 1,
        }
    }
}

/// Where a regular file's chunks live, as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredLayout {
    pub chunk_size_bytes: u32,
    /// Replication chains, by id.
    pub chains: Vec<u32>,
    pub first: u32,
    pub replicas: u8,
}

impl From<&StoredLayout> for Layout {
    fn from(l: &StoredLayout) -> Layout {
        Layout {
            chunk_size_bytes: l.chunk_size_bytes,
            chains: l.chains.iter().map(|&c| ChainId(c)).collect(),
            first: l.first,
            replicas: l.replicas,
        }
    }
}

/// One inode, under key `I`+ino.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct InodeRecord {
    #[serde(with = "kind_code")]
    pub kind: FileKind,
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub rdev: u32,
    /// A directory's parent (the root is its own); 0 for other kinds, which may have
    /// several parents through hard links.
    pub parent: u64,
    /// A symlink's target; empty for other kinds.
    pub target: Vec<u8>,
    /// A regular file's layout.
    pub layout: Option<StoredLayout>,
    /// Number of `X` keys of this inode, so limits need no scan.
    pub xattr_count: u32,
}

impl InodeRecord {
    /// A new inode of `kind` with every time stamp at `now`.
    pub(crate) fn new(kind: FileKind, perm: u32, uid: u32, gid: u32, now: Timestamp) -> Self {
        InodeRecord {
            kind,
            perm: perm & 0o7777,
            uid,
            gid,
            nlink: 1,
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            rdev: 0,
            parent: 0,
            target: Vec::new(),
            layout: None,
            xattr_count: 0,
        }
    }

    /// The attributes as `stat` shows them, with blocks as a dense file's: a regular
    /// file's come from its held chunks (`held::attr`).
    pub(crate) fn attr(&self, ino: InodeId) -> Attr {
        Attr {
            ino,
            kind: self.kind,
            perm: self.perm,
            nlink: self.nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: self.rdev,
            size: self.size,
            atime: self.atime,
            mtime: self.mtime,
            ctime: self.ctime,
            xattr_count: self.xattr_count,
            blocks: self.size.div_ceil(proto::runs::BLOCK_BYTES),
        }
    }

    /// Records a change at `now`. The ctime moves forward even when the clock did not
    /// (two changes within its resolution, or a clock stepped back), so that one value
    /// of a directory's ctime names one state of its entries: clients compare it to
    /// know whether their list of its names is still whole (`proto::meta::DirChange`).
    pub(crate) fn changed_at(&mut self, now: Timestamp) {
        self.ctime = now.max(self.ctime.next());
    }

    /// Whether this is a directory.
    pub(crate) fn is_dir(&self) -> bool {
        self.kind == FileKind::Directory
    }
}

/// One directory entry, under key `D`+parent+name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DirentRecord {
    pub ino: u64,
    #[serde(with = "kind_code")]
    pub kind: FileKind,
}

/// Chain records belong to membership, which decides them; stored here like the rest.
pub(crate) use crate::membership::ChainRecord;

/// One data server, under key `N`+node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct NodeRecord {
    pub addr: String,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
}

/// Stores a [`FileKind`] as a fixed number, independent of the wire enum's order.
mod kind_code {
    use proto::FileKind;
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    const KINDS: [(FileKind, u8); 7] = [
        (FileKind::Regular, 1),
        (FileKind::Directory, 2),
        (FileKind::Symlink, 3),
        (FileKind::Fifo, 4),
        (FileKind::Socket, 5),
        (FileKind::CharDevice, 6),
        (FileKind::BlockDevice, 7),
    ];

    pub fn serialize<S: Serializer>(kind: &FileKind, s: S) -> Result<S::Ok, S::Error> {
        let code = KINDS.iter().find(|(k, _)| k == kind).map_or(0, |(_, c)| *c);
        s.serialize_u8(code)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<FileKind, D::Error> {
        let code = u8::deserialize(d)?;
        KINDS
            .iter()
            .find(|(_, c)| *c == code)
            .map(|(k, _)| *k)
            .ok_or_else(|| D::Error::custom(format!("unknown file kind {code}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_carry_their_version() {
        let mut rec = InodeRecord::new(FileKind::Symlink, 0o17777, 5, 6, Timestamp::now());
        rec.target = b"/x".to_vec();
        rec.layout = Some(StoredLayout {
            chunk_size_bytes: 1 << 22,
            chains: vec![1, 2],
            first: 1,
            replicas: 3,
        });
        assert_eq!(rec.perm, 0o7777);
        let bytes = encode(&rec).unwrap();
        assert_eq!(bytes[0], RECORD_VERSION);
        assert_eq!(decode::<InodeRecord>(&bytes, "inode").unwrap(), rec);
    }

    #[test]
    fn bad_records_are_corrupt_not_panics() {
        let good = encode(&DirentRecord {
            ino: 3,
            kind: FileKind::Fifo,
        })
        .unwrap();
        let mut wrong_version = good.clone();
        wrong_version[0] = 9;
        let mut bad_kind = good.clone();
        *bad_kind.last_mut().unwrap() = 99;
        for bytes in [&[][..], &wrong_version, &bad_kind, &good[..good.len() - 1]] {
            let e = decode::<DirentRecord>(bytes, "dirent").unwrap_err();
            assert!(matches!(e, MetaError::Corrupt(_)), "{e}");
        }
    }
}
