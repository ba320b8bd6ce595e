//! File attributes, attribute changes and file layouts as they cross the wire.

use crate::ids::{ChainId, InodeId};
use serde::{Deserialize, Serialize};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point in time: seconds and nanoseconds since the Unix epoch.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Timestamp {
    /// Whole seconds since 1970-01-01T00:00:00Z (negative before it).
    pub secs: i64,
    /// Nanoseconds within the second, below 1e9.
    pub nanos: u32,
}

impl Timestamp {
    /// The current wall-clock time.
    pub fn now() -> Timestamp {
        Timestamp::from(SystemTime::now())
    }

    /// The earliest time after this one: one nanosecond later.
    pub fn next(self) -> Timestamp {
        if self.nanos >= 999_999_999 {
            Timestamp {
                secs: self.secs.saturating_add(1),
                nanos: 0,
            }
        } else {
            Timestamp {
                secs: self.secs,
                nanos: self.nanos + 1,
            }
        }
    }
}

impl From<SystemTime> for Timestamp {
    fn from(t: SystemTime) -> Self {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Timestamp {
                secs: d.as_secs() as i64,
                nanos: d.subsec_nanos(),
            },
            Err(e) => {
                let d = e.duration();
                let (secs, nanos) = if d.subsec_nanos() == 0 {
                    (-(d.as_secs() as i64), 0)
                } else {
                    (-(d.as_secs() as i64) - 1, 1_000_000_000 - d.subsec_nanos())
                };
                Timestamp { secs, nanos }
            }
        }
    }
}

impl From<Timestamp> for SystemTime {
    fn from(t: Timestamp) -> Self {
        let nanos = Duration::from_nanos(u64::from(t.nanos.min(999_999_999)));
        if t.secs >= 0 {
            UNIX_EPOCH + Duration::from_secs(t.secs as u64) + nanos
        } else {
            UNIX_EPOCH - Duration::from_secs(t.secs.unsigned_abs()) + nanos
        }
    }
}

/// The kind of an inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FileKind {
    /// A regular file whose bytes live in chunks on data servers.
    Regular,
    /// A directory.
    Directory,
    /// A symbolic link; its target is kept by the metadata server.
    Symlink,
    /// A named pipe (metadata only).
    Fifo,
    /// A Unix socket (metadata only).
    Socket,
    /// A character device node (metadata only).
    CharDevice,
    /// A block device node (metadata only).
    BlockDevice,
}

/// Attributes of one inode, as `stat` shows them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attr {
    /// The inode number.
    pub ino: InodeId,
    /// What kind of inode it is.
    pub kind: FileKind,
    /// Permission bits including setuid, setgid and sticky (`mode & 0o7777`).
    pub perm: u32,
    /// Number of hard links (directories: 2 + number of subdirectories).
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number of a device node, else 0.
    pub rdev: u32,
    /// Length in bytes (a symlink: length of its target).
    pub size: u64,
    /// Last access.
    pub atime: Timestamp,
    /// Last change of the contents.
    pub mtime: Timestamp,
    /// Last change of the inode. The server moves it forward at every change, also
    /// when its clock did not (see [`crate::meta::DirChange`]).
    pub ctime: Timestamp,
    /// How many extended attributes it has. With none, a client may answer a read or
    /// listing of them itself for the attribute TTL (`ls -l` reads `security.selinux`
    /// of every entry, `cp -a` lists each file's).
    pub xattr_count: u32,
    /// Space it takes, in 512-byte blocks (`st_blocks`): for a regular file, the bytes
    /// below its length of the chunks that hold data, so holes count nothing.
    pub blocks: u64,
}

/// How a time stamp is to be set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimeSet {
    /// The server's clock at the time of the change.
    Now,
    /// An explicit time.
    At(Timestamp),
}

/// A change of attributes (`chmod`, `chown`, `truncate`, `utimensat`); `None` keeps a field.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttr {
    /// New permission bits (`& 0o7777`).
    pub perm: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New length; the client has already cut the chunks on the data servers.
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<TimeSet>,
    /// New modification time.
    pub mtime: Option<TimeSet>,
}

/// An inode's attribute flags (`chattr`, `lsattr`; `FS_IOC_GETFLAGS`): the two Linux
/// enforces for every file system, `i` (immutable: no change of data, attributes,
/// names or extended attributes, by anyone) and `a` (append only: data is only added
/// at the end; no truncation, rename, unlink, link, chmod, chown or extended attribute
/// change). Only regular files and directories carry them; a new inode has none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct InodeFlags {
    /// `FS_IMMUTABLE_FL`.
    pub immutable: bool,
    /// `FS_APPEND_FL`.
    pub append: bool,
}

impl InodeFlags {
    /// `FS_IMMUTABLE_FL` of `FS_IOC_GETFLAGS`.
    pub const FS_IMMUTABLE_FL: u32 = 0x10;
    /// `FS_APPEND_FL` of `FS_IOC_GETFLAGS`.
    pub const FS_APPEND_FL: u32 = 0x20;
    /// `FS_XFLAG_IMMUTABLE` of `FS_IOC_FSGETXATTR`.
    pub const FS_XFLAG_IMMUTABLE: u32 = 0x8;
    /// `FS_XFLAG_APPEND` of `FS_IOC_FSGETXATTR`.
    pub const FS_XFLAG_APPEND: u32 = 0x10;

    /// Whether no flag is set.
    pub fn is_empty(self) -> bool {
        self == InodeFlags::default()
    }

    /// The flags of an `FS_IOC_SETFLAGS` word, or the bits of it this file system does
    /// not keep (`chattr` of another attribute: EOPNOTSUPP, as ext4 answers for one it
    /// lacks).
    pub fn from_fs_flags(word: u32) -> Result<InodeFlags, u32> {
        Self::from_word(word, Self::FS_IMMUTABLE_FL, Self::FS_APPEND_FL)
    }

    /// The `FS_IOC_GETFLAGS` word.
    pub fn fs_flags(self) -> u32 {
        self.word(Self::FS_IMMUTABLE_FL, Self::FS_APPEND_FL)
    }

    /// The flags of an `FS_IOC_FSSETXATTR` `fsx_xflags`, or the bits not kept.
    pub fn from_xflags(word: u32) -> Result<InodeFlags, u32> {
        Self::from_word(word, Self::FS_XFLAG_IMMUTABLE, Self::FS_XFLAG_APPEND)
    }

    /// The `fsx_xflags` of `FS_IOC_FSGETXATTR`.
    pub fn xflags(self) -> u32 {
        self.word(Self::FS_XFLAG_IMMUTABLE, Self::FS_XFLAG_APPEND)
    }

    fn from_word(word: u32, immutable: u32, append: u32) -> Result<InodeFlags, u32> {
        let other = word & !(immutable | append);
        if other != 0 {
            return Err(other);
        }
        Ok(InodeFlags {
            immutable: word & immutable != 0,
            append: word & append != 0,
        })
    }

    fn word(self, immutable: u32, append: u32) -> u32 {
        let bit = |on: bool, b: u32| if on { b } else { 0 };
        bit(self.immutable, immutable) | bit(self.append, append)
    }
}

/// Where a regular file's chunks live.
///
/// Chunk `i` belongs to replication chain `chains[(first + i) % chains.len()]`:
/// round-robin over the chains from a per-file start, so one large file is read from
/// every data server at once. The chain's members come from the cluster map; the file
/// uses the first `replicas` of them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// Size of every chunk of the file in bytes (a power of two).
    pub chunk_size_bytes: u32,
    /// The replication chains the chunks are spread over, in order.
    pub chains: Vec<ChainId>,
    /// Position in `chains` of chunk 0.
    pub first: u32,
    /// Copies of each chunk the file asks for (capped by each chain's length).
    pub replicas: u8,
}

impl Layout {
    /// The chain that holds chunk `index`, or `None` for a layout without chains.
    pub fn chain_for(&self, index: u64) -> Option<ChainId> {
        if self.chains.is_empty() {
            return None;
        }
        let n = self.chains.len() as u64;
        let pos = (u64::from(self.first) + index) % n;
        Some(self.chains[pos as usize])
    }

    /// Index of the chunk that holds byte `offset`.
    pub fn chunk_index(&self, offset: u64) -> u64 {
        offset / u64::from(self.chunk_size_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_round_trip_through_system_time() {
        for t in [
            Timestamp { secs: 0, nanos: 0 },
            Timestamp {
                secs: 1_700_000_000,
                nanos: 123_456_789,
            },
            Timestamp {
                secs: -1,
                nanos: 500,
            },
            Timestamp {
                secs: -86_400,
                nanos: 0,
            },
        ] {
            assert_eq!(Timestamp::from(SystemTime::from(t)), t);
        }
    }

    #[test]
    fn inode_flags_take_the_two_kept_bits_and_refuse_others() {
        let both = InodeFlags {
            immutable: true,
            append: true,
        };
        assert_eq!(InodeFlags::from_fs_flags(0x30), Ok(both));
        assert_eq!(both.fs_flags(), 0x30);
        assert_eq!(InodeFlags::from_xflags(0x18), Ok(both));
        assert_eq!(both.xflags(), 0x18);
        let append = InodeFlags::from_fs_flags(0x20).unwrap();
        assert!(append.append && !append.immutable);
        assert_eq!(append.xflags(), InodeFlags::FS_XFLAG_APPEND);
        assert!(InodeFlags::from_fs_flags(0).unwrap().is_empty());
        // chattr +A (noatime, 0x80) and ext4's extents bit (0x80000) are not kept.
        assert_eq!(InodeFlags::from_fs_flags(0x80 | 0x10), Err(0x80));
        assert_eq!(InodeFlags::from_fs_flags(0x80000), Err(0x80000));
        assert_eq!(InodeFlags::from_xflags(0x20), Err(0x20));
    }

    #[test]
    fn the_next_timestamp_is_one_nanosecond_later() {
        let t = |secs, nanos| Timestamp { secs, nanos };
        assert_eq!(t(5, 7).next(), t(5, 8));
        assert_eq!(t(5, 999_999_999).next(), t(6, 0));
        assert_eq!(t(-1, 999_999_999).next(), t(0, 0));
        assert!(t(5, 7).next() > t(5, 7));
    }

    #[test]
    fn layout_places_chunks_round_robin_from_first() {
        let l = Layout {
            chunk_size_bytes: 4 << 20,
            chains: vec![ChainId(7), ChainId(8), ChainId(9)],
            first: 2,
            replicas: 3,
        };
        let chains: Vec<_> = (0..4).map(|i| l.chain_for(i).unwrap().0).collect();
        assert_eq!(chains, vec![9, 7, 8, 9]);
        assert_eq!(l.chunk_index((4 << 20) + 1), 1);
        let empty = Layout {
            chains: vec![],
            ..l
        };
        assert_eq!(empty.chain_for(0), None);
    }
}
