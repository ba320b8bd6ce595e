//! Stable numeric error codes that cross the wire, and this crate's own error type.
//!
//! The numbers are part of the protocol: never renumber a code, only add new ones. The
//! client maps each code to an errno in exactly one `match` (in `fs-client`).

use serde::{Deserialize, Serialize};
use std::fmt;

/// An error kind that crosses the wire, with a stable number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "u16", into = "u16")]
#[repr(u16)]
pub enum ErrorCode {
    /// No such file, directory, chunk or session (ENOENT).
    NotFound = 1,
    /// The name already exists (EEXIST).
    AlreadyExists = 2,
    /// A path component or the target is not a directory (ENOTDIR).
    NotADirectory = 3,
    /// The target is a directory where a non-directory was needed (EISDIR).
    IsADirectory = 4,
    /// The directory is not empty (ENOTEMPTY).
    NotEmpty = 5,
    /// An argument is out of range or contradicts another (EINVAL).
    InvalidArgument = 6,
    /// A name or symlink target is longer than allowed (ENAMETOOLONG).
    NameTooLong = 7,
    /// Permission bits forbid the access (EACCES).
    PermissionDenied = 8,
    /// The operation is not permitted to this caller (EPERM).
    NotPermitted = 9,
    /// No space left on a data server or in the metadata store (ENOSPC).
    NoSpace = 10,
    /// An I/O error on a server's disk (EIO).
    Io = 11,
    /// Stored bytes failed their checksum; they are never returned (EIO).
    Corrupt = 12,
    /// The file handle or session is no longer valid (ESTALE).
    Stale = 13,
    /// The peer speaks another protocol version.
    VersionMismatch = 14,
    /// A message could not be decoded.
    Malformed = 15,
    /// A message type the receiver does not know.
    UnknownMessage = 16,
    /// A server needed for the operation is unreachable (EIO to applications).
    Unavailable = 17,
    /// The operation did not finish within its timeout (ETIMEDOUT).
    TimedOut = 18,
    /// A size limit was exceeded: message, file or attribute (EFBIG / E2BIG).
    TooBig = 19,
    /// The extended attribute does not exist (ENODATA).
    NoData = 20,
    /// A caller's buffer is too small for the result (ERANGE).
    Range = 21,
    /// The operation is not supported (EOPNOTSUPP).
    NotSupported = 22,
    /// Too many hard links (EMLINK).
    TooManyLinks = 23,
    /// The resource is busy (EBUSY).
    Busy = 24,
    /// A memory key or bounds check failed on a one-sided access.
    AccessViolation = 25,
    /// Too many requests in flight on one connection.
    Overloaded = 26,
    /// A lock is held by someone else and the caller asked not to wait (EAGAIN).
    WouldBlock = 27,
    /// The waiting process was sent a signal (EINTR).
    Interrupted = 28,
    /// The client's key is read-only: every change is refused (EROFS).
    ReadOnly = 29,
    /// Waiting for the lock would never end: its holder waits, directly or through
    /// others, for a lock the caller holds (EDEADLK).
    Deadlock = 30,
    /// A chunk request carried no grant for its file (EACCES).
    GrantMissing = 40,
    /// A chunk request's grant is not sealed by the cluster key (EACCES).
    GrantForged = 41,
    /// A chunk request's grant has run out: the client renews it and retries (EACCES).
    GrantExpired = 42,
    /// A chunk request's grant was given to another client (EACCES).
    GrantWrongClient = 43,
    /// A chunk request's grant is for another file (EACCES).
    GrantWrongFile = 44,
    /// A write carried a read-only grant (EACCES).
    GrantWrongMode = 45,
    /// A code this build does not know (sent by a newer peer).
    Unknown = 65535,
}

impl ErrorCode {
    const ALL: [ErrorCode; 36] = [
        ErrorCode::NotFound,
        ErrorCode::AlreadyExists,
        ErrorCode::NotADirectory,
        ErrorCode::IsADirectory,
        ErrorCode::NotEmpty,
        ErrorCode::InvalidArgument,
        ErrorCode::NameTooLong,
        ErrorCode::PermissionDenied,
        ErrorCode::NotPermitted,
        ErrorCode::NoSpace,
        ErrorCode::Io,
        ErrorCode::Corrupt,
        ErrorCode::Stale,
        ErrorCode::VersionMismatch,
        ErrorCode::Malformed,
        ErrorCode::UnknownMessage,
        ErrorCode::Unavailable,
        ErrorCode::TimedOut,
        ErrorCode::TooBig,
        ErrorCode::NoData,
        ErrorCode::Range,
        ErrorCode::NotSupported,
        ErrorCode::TooManyLinks,
        ErrorCode::Busy,
        ErrorCode::AccessViolation,
        ErrorCode::Overloaded,
        ErrorCode::WouldBlock,
        ErrorCode::Interrupted,
        ErrorCode::ReadOnly,
        ErrorCode::Deadlock,
        ErrorCode::GrantMissing,
        ErrorCode::GrantForged,
        ErrorCode::GrantExpired,
        ErrorCode::GrantWrongClient,
        ErrorCode::GrantWrongFile,
        ErrorCode::GrantWrongMode,
    ];

    /// The stable number of this code.
    pub fn number(self) -> u16 {
        self as u16
    }
}

impl From<u16> for ErrorCode {
    fn from(n: u16) -> Self {
        ErrorCode::ALL
            .iter()
            .copied()
            .find(|c| c.number() == n)
            .unwrap_or(ErrorCode::Unknown)
    }
}

impl From<ErrorCode> for u16 {
    fn from(c: ErrorCode) -> u16 {
        c.number()
    }
}

/// An error as it crosses the wire: a stable code and a sentence for people.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code:?} ({}): {message}", code.number())]
pub struct WireError {
    /// What kind of error it is; the client maps it to an errno.
    pub code: ErrorCode,
    /// A human-readable explanation, for logs.
    pub message: String,
}

impl WireError {
    /// Builds an error from a code and a message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        WireError {
            code,
            message: message.into(),
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

/// Errors of the codec.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    /// The bytes are not a valid encoding of the expected message.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// A type tag (of the message or of an enum inside it) that this build does not know.
    #[error("unknown message type or enum value")]
    UnknownMessage,
    /// An encoded message exceeds the limit it is sent under.
    #[error("message of {size} bytes exceeds the limit of {limit} bytes")]
    TooBig {
        /// Size of the encoded message.
        size: usize,
        /// The limit it was checked against.
        limit: usize,
    },
}

impl From<ProtoError> for WireError {
    fn from(e: ProtoError) -> Self {
        let code = match e {
            ProtoError::Malformed(_) => ErrorCode::Malformed,
            ProtoError::UnknownMessage => ErrorCode::UnknownMessage,
            ProtoError::TooBig { .. } => ErrorCode::TooBig,
        };
        WireError::new(code, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_through_their_numbers() {
        for c in ErrorCode::ALL {
            assert_eq!(ErrorCode::from(c.number()), c);
        }
        // Guards against a renumbering slipping in: these numbers are on the wire.
        assert_eq!(ErrorCode::NotFound.number(), 1);
        assert_eq!(ErrorCode::Overloaded.number(), 26);
        assert_eq!(ErrorCode::from(4242), ErrorCode::Unknown);
    }
}
