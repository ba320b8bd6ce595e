//! Tessera's wire vocabulary: typed ids, the messages exchanged with the metadata server
//! and the data servers, stable numeric error codes, and the one codec that turns them
//! into bytes.
//!
//! This crate does no I/O and knows nothing of tokio; the `transport` crate moves the
//! bytes it produces.

pub mod attr;
pub mod auth;
pub mod codec;
pub mod data;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod grant;
pub mod ids;
pub mod mac;
pub mod meta;
pub mod rpc;
pub mod runs;

pub use attr::{Attr, FileKind, InodeFlags, Layout, SetAttr, TimeSet, Timestamp};
pub use error::{ErrorCode, ProtoError, WireError};
pub use ids::{ChainId, ChunkId, ClientId, InodeId, MrKey, NodeId, SessionId, Version};
pub use rpc::{Request, Rpc, RpcResult};

/// Version of the Tessera application protocol (the messages in [`meta`] and [`data`]).
///
/// Both ends announce it in the connection handshake; a peer speaking another version is
/// refused before any message is exchanged. 11: one type per request, each naming its
/// reply, and subsystem envelopes instead of one request and one reply enum. 12: every
/// file-system call names its caller (uid, gid, supplementary groups) in its envelope,
/// and create-like requests no longer carry an owner of their own. 13: chunk requests
/// carry the metadata server's grant ([`grant`]). 14: client keys are derived from the
/// cluster key: `Hello` carries the key id and capabilities, `KeyCreate` records them
/// without a key, and data servers pull revocations instead of asking for keys. 15:
/// `Resume` names each session's open mode and its reply carries new grants. 16:
/// `LookupParent` (a directory's parent, for file handles). 17: `Resume` carries each
/// session's grant (a scoped key's proof that it reached the file). 18: `RenameMode`'s
/// whiteout modes (`RENAME_WHITEOUT`) and `TmpFile` (`O_TMPFILE`). 19: `Attr::blocks`,
/// and the chunks a `Commit` wrote and punched. 20: `SetLock::reclaim` (a client takes
/// back its locks from a restarted or standby server). 21: `OpenAt` (a lookup and an
/// open, and the first read's access time, in one call). 22: `data::ReadInline` (a small
/// read's bytes in the reply). 23: `FsCall::op` (a change's id, applied once). 24:
/// `Link::kernel_checked` (the mount's kernel applied its hard-link rule). 25:
/// `data::WriteRanges` and `ReplicaData::Ranges` (separate small ranges of a chunk in one
/// chain write). 26: `cluster::InodeCopies` (a resync asks how many copies a file has).
/// 27: `Caller::umask` (the server applies it, or a directory's default ACL instead),
/// and the POSIX ACL attribute names. 28: `Unlink` answers `Unlinked` (the file and its
/// links left, beside the directory's change). 29: `XattrMode::Neither` (both
/// `setxattr` flags). 30: `SetLock::waits` and `ErrorCode::Deadlock` (`F_SETLKW`
/// deadlock detection). 31: `ChunkData` (`SEEK_DATA`, `SEEK_HOLE`). 32: `GetFlags`,
/// `SetFlags` (`chattr +i`, `+a`) and the `append` (`O_APPEND`) of `Open`, `Create`
/// and `OpenAt`. 33: early replies (`OpId::early`, `OpId::made`, `ReplyTail` after a
/// file-system call's answer, `Settle`).
pub const PROTOCOL_VERSION: u16 = 33;

/// Longest name of one directory entry, in bytes (as ext4 and `NAME_MAX`).
pub const MAX_NAME_BYTES: usize = 255;

/// Longest symlink target, in bytes (`PATH_MAX`).
pub const MAX_SYMLINK_BYTES: usize = 4096;

/// The largest length a file may have, and so the furthest a byte of it may end: the
/// largest `off_t` (`i64::MAX`). Past it Linux answers `EFBIG`, and so do the client and
/// the metadata server.
pub const MAX_FILE_BYTES: u64 = i64::MAX as u64;

/// The end of `len` bytes at `offset`, if it is within [`MAX_FILE_BYTES`].
pub fn file_end(offset: u64, len: u64) -> Option<u64> {
    offset.checked_add(len).filter(|&e| e <= MAX_FILE_BYTES)
}

/// Namespaces an extended attribute name may start with. Of `system.` only the two
/// POSIX ACL names are kept ([`ACL_ACCESS_XATTR`], [`ACL_DEFAULT_XATTR`]), which the
/// metadata server enforces; its other names mean something to a kernel's own file
/// system only, and are refused, so `cp -a` and `rsync -A` report "not supported".
pub const XATTR_NAMESPACES: [&[u8]; 3] = [b"user.", b"trusted.", b"security."];

/// The attribute holding a file's POSIX access ACL, in the kernel's format.
pub const ACL_ACCESS_XATTR: &[u8] = b"system.posix_acl_access";

/// The attribute holding a directory's POSIX default ACL.
pub const ACL_DEFAULT_XATTR: &[u8] = b"system.posix_acl_default";

/// Why an extended attribute name is refused ([`xattr_name_fault`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XattrNameFault {
    /// Longer than [`MAX_NAME_BYTES`].
    TooLong,
    /// Empty, or a NUL in it.
    Malformed,
    /// Not in one of [`XATTR_NAMESPACES`].
    Namespace,
    /// A namespace and nothing after it.
    NoName,
}

/// The attribute that holds a file's capabilities: a write of the file removes it (the
/// kernel before a write through its page cache, a mount before one past it), and a
/// writer may remove it on the metadata server for that.
pub const CAPABILITY_XATTR: &[u8] = b"security.capability";

/// The rule for an extended attribute name, kept by the metadata server and known to
/// clients that answer for names the server would store: a known namespace prefix and a
/// non-empty rest, at most [`MAX_NAME_BYTES`] bytes, no NUL.
pub fn xattr_name_fault(name: &[u8]) -> Option<XattrNameFault> {
    if name.len() > MAX_NAME_BYTES {
        return Some(XattrNameFault::TooLong);
    }
    if name.is_empty() || name.contains(&0) {
        return Some(XattrNameFault::Malformed);
    }
    if name == ACL_ACCESS_XATTR || name == ACL_DEFAULT_XATTR {
        return None;
    }
    match XATTR_NAMESPACES.iter().find(|p| name.starts_with(p)) {
        None => Some(XattrNameFault::Namespace),
        Some(prefix) if name.len() == prefix.len() => Some(XattrNameFault::NoName),
        Some(_) => None,
    }
}

/// Largest extended attribute value, in bytes (Linux `XATTR_SIZE_MAX`).
pub const MAX_XATTR_VALUE_BYTES: usize = 65536;

/// A slice of a peer's registered memory that one-sided operations may target.
///
/// `addr` is the address inside the peer's address space (as with RDMA), `key` the key the
/// peer granted for it on one connection. The owner checks both on every access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct RemoteBuf {
    /// Start address of the slice in the owner's address space.
    pub addr: u64,
    /// Length of the slice in bytes.
    pub len: u64,
    /// Remote key granted by the owner for this slice.
    pub key: MrKey,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_ends_at_the_largest_off_t() {
        assert_eq!(file_end(MAX_FILE_BYTES - 1, 1), Some(MAX_FILE_BYTES));
        assert_eq!(file_end(MAX_FILE_BYTES, 0), Some(MAX_FILE_BYTES));
        assert_eq!(file_end(MAX_FILE_BYTES, 1), None);
        assert_eq!(file_end(u64::MAX, 1), None);
        assert_eq!(file_end(4096, 4096), Some(8192));
    }
}
