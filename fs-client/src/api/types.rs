//! What the library API answers with: attributes, kinds and listings, and the time
//! conversions between the wire's time stamps and `SystemTime`.

use proto::{Attr, FileKind, Timestamp};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What kind of inode a path names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileType {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (seen only by [`Tessera::symlink_metadata`](super::Tessera::symlink_metadata) and listings).
    Symlink,
    /// A FIFO, socket or device node.
    Other,
}

impl From<FileKind> for FileType {
    fn from(k: FileKind) -> FileType {
        match k {
            FileKind::Regular => FileType::File,
            FileKind::Directory => FileType::Dir,
            FileKind::Symlink => FileType::Symlink,
            _ => FileType::Other,
        }
    }
}

/// A file's attributes, as `stat(2)` reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Metadata {
    /// The inode number (`st_ino`).
    pub ino: u64,
    /// The kind of inode.
    pub kind: FileType,
    /// `st_mode`: the file type bits and the permission bits.
    pub mode: u32,
    /// Length in bytes.
    pub size: u64,
    /// Hard links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Space held, in 512-byte blocks (holes hold none).
    pub blocks: u64,
    /// Last access.
    pub atime: SystemTime,
    /// Last change of the contents.
    pub mtime: SystemTime,
    /// Last change of the inode.
    pub ctime: SystemTime,
}

impl Metadata {
    /// Whether it is a directory.
    pub fn is_dir(&self) -> bool {
        self.kind == FileType::Dir
    }

    /// Whether it is a regular file.
    pub fn is_file(&self) -> bool {
        self.kind == FileType::File
    }
}

/// `ts` as a `SystemTime` (times before 1970 included; one past what `SystemTime`
/// holds is clamped to the epoch rather than panicking).
fn system_time(ts: Timestamp) -> SystemTime {
    let nanos = Duration::from_nanos(u64::from(ts.nanos));
    let secs = Duration::from_secs(ts.secs.unsigned_abs());
    let t = if ts.secs >= 0 {
        UNIX_EPOCH.checked_add(secs)
    } else {
        UNIX_EPOCH.checked_sub(secs)
    };
    t.and_then(|t| t.checked_add(nanos)).unwrap_or(UNIX_EPOCH)
}

/// `t` as a time stamp (before 1970 as negative seconds).
pub(super) fn timestamp(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp {
            secs: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            nanos: d.subsec_nanos(),
        },
        Err(e) => {
            let d = e.duration();
            let (secs, nanos) = (
                i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                d.subsec_nanos(),
            );
            match nanos {
                0 => Timestamp {
                    secs: -secs,
                    nanos: 0,
                },
                n => Timestamp {
                    secs: -secs - 1,
                    nanos: 1_000_000_000 - n,
                },
            }
        }
    }
}

impl From<&Attr> for Metadata {
    fn from(a: &Attr) -> Metadata {
        let type_bits = match a.kind {
            FileKind::Regular => libc::S_IFREG,
            FileKind::Directory => libc::S_IFDIR,
            FileKind::Symlink => libc::S_IFLNK,
            FileKind::Fifo => libc::S_IFIFO,
            FileKind::Socket => libc::S_IFSOCK,
            FileKind::CharDevice => libc::S_IFCHR,
            FileKind::BlockDevice => libc::S_IFBLK,
        };
        Metadata {
            ino: a.ino.0,
            kind: a.kind.into(),
            mode: type_bits | (a.perm & 0o7777),
            size: a.size,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            blocks: a.blocks,
            atime: system_time(a.atime),
            mtime: system_time(a.mtime),
            ctime: system_time(a.ctime),
        }
    }
}

/// One name in a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// The name (a name that is not UTF-8 shows U+FFFD where its bytes are not).
    pub name: String,
    /// The inode it names.
    pub ino: u64,
    /// The kind of that inode.
    pub kind: FileType,
    /// Its attributes, from [`Tessera::read_dir_plus`](super::Tessera::read_dir_plus) (not following a link).
    pub metadata: Option<Metadata>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::InodeId;

    #[test]
    fn metadata_carries_the_type_bits_in_its_mode() {
        let t = proto::Timestamp { secs: 1, nanos: 0 };
        let a = Attr {
            ino: InodeId(9),
            kind: FileKind::Directory,
            perm: 0o4755,
            nlink: 2,
            uid: 1,
            gid: 2,
            rdev: 0,
            size: 0,
            atime: t,
            mtime: t,
            ctime: t,
            xattr_count: 0,
            blocks: 0,
        };
        let m = Metadata::from(&a);
        assert_eq!(m.mode, libc::S_IFDIR | 0o4755);
        assert!(m.is_dir() && !m.is_file());
        assert_eq!(m.ino, 9);
    }

    #[test]
    fn times_before_1970_stay_before_it() {
        let t = system_time(Timestamp {
            secs: -2,
            nanos: 500_000_000,
        });
        assert_eq!(
            UNIX_EPOCH.duration_since(t).unwrap(),
            Duration::from_millis(1500)
        );
    }

    #[test]
    fn times_convert_both_ways_around_1970() {
        for (secs, nanos) in [(0, 0), (1_700_000_000, 5), (-2, 500_000_000), (-1, 1)] {
            let ts = Timestamp { secs, nanos };
            assert_eq!(timestamp(system_time(ts)), ts);
        }
        let far = Timestamp {
            secs: i64::MAX,
            nanos: 999_999_999,
        };
        assert!(system_time(far) > UNIX_EPOCH, "no panic at the edge");
        let before = Timestamp {
            secs: i64::MIN,
            nanos: 0,
        };
        let _ = system_time(before);
    }
}
