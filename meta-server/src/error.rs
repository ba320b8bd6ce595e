//! The metadata server's one error type, and how it crosses the wire.

use crate::kv::KvError;
use proto::{ErrorCode, WireError};
use std::path::PathBuf;
use transport::TransportError;

/// Why `tessera-meta migrate` stopped (`migrate.rs`); nothing was written when it
/// refused.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// A check before the first write failed: the sentence says which and what to do.
    #[error("{0}")]
    Refused(String),
    /// A store call failed.
    #[error("{context}")]
    Store {
        /// What was being done to which store.
        context: String,
        /// The store's error.
        #[source]
        source: KvError,
    },
    /// The comparison after the copy found the stores different.
    #[error("the stores differ after the copy: {0}")]
    Differs(String),
}

/// Everything a namespace operation can fail with.
///
/// Each variant carries a sentence for logs; [`MetaError::code`] gives the stable wire
/// code that the client maps to an errno.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    /// No such inode, entry, node or session.
    #[error("not found: {0}")]
    NotFound(String),
    /// The name exists already.
    #[error("already exists: {0}")]
    AlreadyExists(String),
    /// A directory was needed.
    #[error("not a directory: {0}")]
    NotADirectory(String),
    /// A non-directory was needed.
    #[error("is a directory: {0}")]
    IsADirectory(String),
    /// The directory still has entries.
    #[error("directory not empty: {0}")]
    NotEmpty(String),
    /// An argument is malformed or contradicts another.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A name, xattr name or symlink target exceeds its limit.
    #[error("name too long: {0}")]
    NameTooLong(String),
    /// The operation is never allowed on this object (hard link to a directory), or
    /// only to its owner or root (EPERM).
    #[error("not permitted: {0}")]
    NotPermitted(String),
    /// The caller lacks a mode bit the operation needs (EACCES).
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// Out of data servers, store space, or per-inode room.
    #[error("no space: {0}")]
    NoSpace(String),
    /// The session is unknown (ended, or from before a restart).
    #[error("stale: {0}")]
    Stale(String),
    /// A value exceeds its size limit.
    #[error("too big: {0}")]
    TooBig(String),
    /// The extended attribute does not exist.
    #[error("no such attribute: {0}")]
    NoData(String),
    /// The operation or namespace is not supported.
    #[error("not supported: {0}")]
    NotSupported(String),
    /// The link count would exceed its limit.
    #[error("too many links: {0}")]
    TooManyLinks(String),
    /// The object is in use and cannot be removed.
    #[error("busy: {0}")]
    Busy(String),
    /// A lock is held by another owner.
    #[error("would block: {0}")]
    WouldBlock(String),
    /// Waiting for a lock would close a cycle of waits.
    #[error("deadlock: {0}")]
    Deadlock(String),
    /// A stored record could not be decoded, or records contradict each other.
    #[error("corrupt metadata: {0}")]
    Corrupt(String),
    /// The store was written by a build with another on-disk format.
    #[error("metadata store has format version {found}; this build reads version {expected}")]
    FormatVersion {
        /// The version found in the superblock.
        found: u32,
        /// The version this build writes and reads.
        expected: u32,
    },
    /// A change sent again was applied by its first try, whose answer was lost with
    /// the server that applied it (see `namespace::once`).
    #[error("answer lost: {0}")]
    AnswerLost(String),
    /// A try of the same change is still running on this server (see
    /// `namespace::once`).
    #[error("in flight: {0}")]
    InFlight(String),
    /// On a shared engine, a call only the leader takes (a data server's registration
    /// or heartbeat) reached a metadata server that does not lead; the data server
    /// asks another one.
    #[error("not the leader: {0}")]
    NotLeader(String),
    /// The key-value store failed.
    #[error(transparent)]
    Store(#[from] KvError),
}

impl MetaError {
    /// The stable wire code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            MetaError::NotFound(_) => ErrorCode::NotFound,
            MetaError::AlreadyExists(_) => ErrorCode::AlreadyExists,
            MetaError::NotADirectory(_) => ErrorCode::NotADirectory,
            MetaError::IsADirectory(_) => ErrorCode::IsADirectory,
            MetaError::NotEmpty(_) => ErrorCode::NotEmpty,
            MetaError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            MetaError::NameTooLong(_) => ErrorCode::NameTooLong,
            MetaError::NotPermitted(_) => ErrorCode::NotPermitted,
            MetaError::PermissionDenied(_) => ErrorCode::PermissionDenied,
            MetaError::NoSpace(_) => ErrorCode::NoSpace,
            MetaError::Stale(_) => ErrorCode::Stale,
            MetaError::TooBig(_) => ErrorCode::TooBig,
            MetaError::NoData(_) => ErrorCode::NoData,
            MetaError::NotSupported(_) => ErrorCode::NotSupported,
            MetaError::TooManyLinks(_) => ErrorCode::TooManyLinks,
            MetaError::Busy(_) => ErrorCode::Busy,
            MetaError::WouldBlock(_) => ErrorCode::WouldBlock,
            MetaError::Deadlock(_) => ErrorCode::Deadlock,
            MetaError::Corrupt(_) => ErrorCode::Corrupt,
            MetaError::FormatVersion { .. } => ErrorCode::NotSupported,
            MetaError::AnswerLost(_) => ErrorCode::Io,
            MetaError::InFlight(_) => ErrorCode::Unavailable,
            MetaError::NotLeader(_) => ErrorCode::Unavailable,
            MetaError::Store(KvError::NoSpace { .. }) => ErrorCode::NoSpace,
            MetaError::Store(KvError::Corruption { .. }) => ErrorCode::Corrupt,
            MetaError::Store(KvError::Engine { .. }) => ErrorCode::Io,
            // One server holds the namespace lock for now: a conflict means another
            // writer of the same etcd prefix, and the caller may try again.
            MetaError::Store(KvError::Conflict { .. }) => ErrorCode::Busy,
            MetaError::Store(KvError::TooLarge { .. }) => ErrorCode::TooBig,
            MetaError::Store(KvError::Unavailable { .. }) => ErrorCode::Unavailable,
        }
    }
}

impl MetaError {
    /// Whether the failure is this server's (its store unreachable or failing, damaged
    /// records) rather than the request's: worth a line in the server's log.
    pub fn is_server_fault(&self) -> bool {
        matches!(
            self,
            MetaError::Corrupt(_)
                | MetaError::Store(
                    KvError::Unavailable { .. }
                        | KvError::Engine { .. }
                        | KvError::Corruption { .. }
                )
        )
    }
}

impl From<MetaError> for WireError {
    fn from(e: MetaError) -> WireError {
        WireError::new(e.code(), e.to_string())
    }
}

/// Why the metadata server did not start. Kept apart from [`MetaError`], which a request
/// fails with and which crosses the wire: a bad data directory or a port in use is the
/// operator's to fix, and no client ever sees it.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration breaks a rule of `MetaConfig::validate`.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The data directory could not be created.
    #[error("creating the data directory {}", dir.display())]
    DataDir {
        /// The configured data directory.
        dir: PathBuf,
        /// The error the OS returned.
        #[source]
        source: std::io::Error,
    },
    /// The store or the namespace in the data directory could not be opened (locked by
    /// another server, another format version, damaged records).
    #[error("opening the namespace in {}", dir.display())]
    Open {
        /// The configured data directory.
        dir: PathBuf,
        /// Why the store or namespace refused to open.
        #[source]
        source: MetaError,
    },
    /// On etcd, the namespace's owner key could not be taken: another server holds it
    /// (the message names it), or etcd did not answer.
    #[error("taking the namespace's owner key on etcd")]
    Owner(#[source] crate::kv::KvError),
    /// The blocking task that opens the store panicked or was cancelled.
    #[error("the task opening the namespace did not finish")]
    Task(#[from] tokio::task::JoinError),
    /// The transport endpoint could not be made (an unusable backend or limits).
    #[error("making the transport endpoint")]
    Transport(#[source] TransportError),
    /// A key file could not be used (the message names it and the fix).
    #[error("{0}")]
    Key(TransportError),
    /// The listener could not be bound.
    #[error("listening on {addr}")]
    Listen {
        /// The configured listen address.
        addr: String,
        /// Why binding it failed.
        #[source]
        source: TransportError,
    },
    /// The metrics endpoint could not be started.
    #[error("starting the metrics endpoint")]
    Metrics(#[source] telemetry::TelemetryError),
}

/// A name for an error message: lossy UTF-8, cut short so a 10 KB name stays readable.
pub(crate) fn show(name: &[u8]) -> String {
    const MAX_SHOWN_BYTES: usize = 64;
    let cut = &name[..name.len().min(MAX_SHOWN_BYTES)];
    let mut s = format!("{:?}", String::from_utf8_lossy(cut));
    if name.len() > MAX_SHOWN_BYTES {
        s.push_str(&format!("... ({} bytes)", name.len()));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_errors_keep_their_kind_on_the_wire() {
        let full = MetaError::from(KvError::NoSpace {
            engine: "redb",
            message: "disk full".into(),
        });
        assert_eq!(WireError::from(full).code, ErrorCode::NoSpace);
        let io = MetaError::from(KvError::Engine {
            engine: "sled",
            message: "EIO".into(),
        });
        assert_eq!(io.code(), ErrorCode::Io);
    }

    #[test]
    fn long_names_are_cut_in_messages() {
        let s = show(&[b'a'; 10_000]);
        assert!(s.len() < 100, "{s}");
        assert!(s.contains("10000 bytes"));
    }
}
