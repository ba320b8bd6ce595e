//! Conversions between Tessera's attributes and the kernel's.

use fuser::{FileAttr, FileType, INodeNo};
use proto::{Attr, FileKind};
use std::time::SystemTime;

/// The kernel's file type for a Tessera kind.
pub fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::Regular => FileType::RegularFile,
        FileKind::Directory => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

/// The Tessera kind of a `mode`'s file type bits, if it names one.
pub fn kind_of_mode(mode: u32) -> Option<FileKind> {
    Some(match mode & libc::S_IFMT {
        libc::S_IFREG => FileKind::Regular,
        libc::S_IFDIR => FileKind::Directory,
        libc::S_IFLNK => FileKind::Symlink,
        libc::S_IFIFO => FileKind::Fifo,
        libc::S_IFSOCK => FileKind::Socket,
        libc::S_IFCHR => FileKind::CharDevice,
        libc::S_IFBLK => FileKind::BlockDevice,
        _ => return None,
    })
}

/// The kernel's attributes for `a`; `blksize` is the preferred I/O size `stat` reports
/// (tools such as `cp` and Python size their buffers by it).
pub fn fuse_attr(a: &Attr, blksize: u32) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino.0),
        size: a.size,
        blocks: a.blocks,
        atime: SystemTime::from(a.atime),
        mtime: SystemTime::from(a.mtime),
        ctime: SystemTime::from(a.ctime),
        crtime: SystemTime::from(a.ctime),
        kind: file_type(a.kind),
        perm: (a.perm & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize,
        flags: 0,
    }
}
