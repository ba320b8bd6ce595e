//! The client's error type.

use proto::{ErrorCode, WireError};
use transport::TransportError;

/// Everything a client operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A server answered with an error.
    #[error("{0}")]
    Remote(#[from] WireError),
    /// The transport failed (peer unreachable, timeout, refused access).
    #[error("{0}")]
    Transport(#[from] TransportError),
    /// A server answered with something that does not fit the request.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The caller asked for something invalid.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The configuration is unusable.
    #[error("configuration: {0}")]
    Config(String),
    /// The cluster map names no such data server or chain, or not yet: retried once the
    /// map changes.
    #[error("not in the cluster map: {0}")]
    NotInMap(String),
    /// The file's layout has no chain for the chunk to be written.
    #[error("no data servers: {0}")]
    NoDataServers(String),
    /// The data servers have less free space than an allocation needs.
    #[error("no space: {0}")]
    NoSpace(String),
    /// An offset or range ends past the largest file offset (`i64::MAX`).
    #[error("too large: {0}")]
    TooLarge(String),
    /// The client does not implement this mode of the operation.
    #[error("not supported: {0}")]
    NotSupported(String),
    /// The client's name cache knows the entry is absent, so no server was asked.
    #[error("not found: {0}")]
    KnownAbsent(String),
    /// The client knows the file has no such extended attribute, so no server was asked.
    #[error("no such extended attribute: {0}")]
    NoXattr(String),
    /// The file's open ended while the metadata server was away: committing its length
    /// now could cover bytes another client cut.
    #[error("open lost: {0}")]
    OpenLost(String),
    /// The metadata server is away and what the client knows cannot answer.
    #[error("metadata server away: {0}")]
    MetaAway(String),
    /// A signal came for the process waiting on a lock.
    #[error("interrupted: {0}")]
    Interrupted(String),
    /// A path named more symbolic links in a row than [`crate::api`] follows.
    #[error("too many levels of symbolic links: {0}")]
    SymlinkLoop(String),
    /// The client refused a call itself, with the code a server would have answered
    /// (the library API's path walk: a name that is not a directory, say).
    #[error("{0}")]
    Refused(WireError),
    /// `SEEK_DATA` or `SEEK_HOLE` from the file's end or past it, or `SEEK_DATA` with
    /// nothing but holes after the offset.
    #[error("no data or hole there: {0}")]
    PastEnd(String),
    /// A handle that is closed, not open for the call (a write through a read-only
    /// open), or a connection used in a process forked from the one that made it.
    #[error("bad handle: {0}")]
    BadHandle(String),
}

impl ClientError {
    /// The stable code of this error; the FUSE layer maps it to an errno.
    pub fn code(&self) -> ErrorCode {
        match self {
            ClientError::Remote(e) => e.code,
            ClientError::Transport(e) => e.code(),
            ClientError::Protocol(_) => ErrorCode::Malformed,
            ClientError::Invalid(_) | ClientError::Config(_) => ErrorCode::InvalidArgument,
            ClientError::NotInMap(_) | ClientError::MetaAway(_) => ErrorCode::Unavailable,
            ClientError::NoDataServers(_) | ClientError::NoSpace(_) => ErrorCode::NoSpace,
            ClientError::TooLarge(_) => ErrorCode::TooBig,
            ClientError::NotSupported(_) => ErrorCode::NotSupported,
            ClientError::KnownAbsent(_) => ErrorCode::NotFound,
            ClientError::NoXattr(_) => ErrorCode::NoData,
            ClientError::OpenLost(_) => ErrorCode::Io,
            ClientError::Interrupted(_) => ErrorCode::Interrupted,
            // No code of the wire's fits these (ELOOP, EBADF, ENXIO): `errno` tells them
            // apart, and the mount and the Python package answer with it. The first two
            // only the library API meets (the kernel resolves a mount's paths and checks
            // its handles itself), the third a mount's `SEEK_DATA`/`SEEK_HOLE`.
            ClientError::SymlinkLoop(_) | ClientError::BadHandle(_) | ClientError::PastEnd(_) => {
                ErrorCode::InvalidArgument
            }
            ClientError::Refused(e) => e.code,
        }
    }

    /// The errno an application sees for this error.
    pub fn errno(&self) -> i32 {
        match self {
            ClientError::SymlinkLoop(_) => libc::ELOOP,
            ClientError::BadHandle(_) => libc::EBADF,
            ClientError::PastEnd(_) => libc::ENXIO,
            e => errno(e.code()),
        }
    }
}

/// The errno an application sees for `code`, through the mount or the library API. Exhaustive on purpose: a new code does not
/// compile until someone decides what applications see for it.
pub fn errno(code: ErrorCode) -> i32 {
    match code {
        ErrorCode::NotFound => libc::ENOENT,
        ErrorCode::AlreadyExists => libc::EEXIST,
        ErrorCode::NotADirectory => libc::ENOTDIR,
        ErrorCode::IsADirectory => libc::EISDIR,
        ErrorCode::NotEmpty => libc::ENOTEMPTY,
        ErrorCode::InvalidArgument => libc::EINVAL,
        ErrorCode::NameTooLong => libc::ENAMETOOLONG,
        ErrorCode::PermissionDenied => libc::EACCES,
        ErrorCode::NotPermitted => libc::EPERM,
        ErrorCode::NoSpace => libc::ENOSPC,
        ErrorCode::Io => libc::EIO,
        // Never hand out bytes that failed their checksum: the read fails instead.
        ErrorCode::Corrupt => libc::EIO,
        ErrorCode::Stale => libc::ESTALE,
        ErrorCode::VersionMismatch => libc::EPROTO,
        ErrorCode::Malformed => libc::EPROTO,
        ErrorCode::UnknownMessage => libc::EPROTO,
        ErrorCode::Unavailable => libc::EIO,
        ErrorCode::TimedOut => libc::ETIMEDOUT,
        ErrorCode::TooBig => libc::EFBIG,
        ErrorCode::NoData => libc::ENODATA,
        ErrorCode::Range => libc::ERANGE,
        ErrorCode::NotSupported => libc::EOPNOTSUPP,
        ErrorCode::TooManyLinks => libc::EMLINK,
        ErrorCode::Busy => libc::EBUSY,
        ErrorCode::AccessViolation => libc::EIO,
        ErrorCode::Overloaded => libc::EAGAIN,
        ErrorCode::WouldBlock => libc::EAGAIN,
        ErrorCode::Deadlock => libc::EDEADLK,
        ErrorCode::Interrupted => libc::EINTR,
        ErrorCode::ReadOnly => libc::EROFS,
        // A data server refused the grant even after the client renewed it: the
        // metadata server no longer lets this client at the file.
        ErrorCode::GrantMissing
        | ErrorCode::GrantForged
        | ErrorCode::GrantExpired
        | ErrorCode::GrantWrongClient
        | ErrorCode::GrantWrongFile
        | ErrorCode::GrantWrongMode => libc::EACCES,
        ErrorCode::Unknown => libc::EIO,
    }
}

impl From<proto::ProtoError> for ClientError {
    fn from(e: proto::ProtoError) -> Self {
        ClientError::Protocol(e.to_string())
    }
}

/// Result of client operations.
pub type Result<T> = std::result::Result<T, ClientError>;
