//! The data server's error type and its mapping onto the stable wire codes.

use proto::{ChunkId, ErrorCode, ProtoError, WireError};
use std::io;
use std::path::PathBuf;
use transport::TransportError;

/// Everything the chunk store and the data service can fail with. It becomes a
/// [`WireError`] only at the wire, in the service's one answer function.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A stored block (or its checksum table entry) failed verification; its bytes are
    /// never returned.
    #[error("{chunk}: block {block} failed its checksum")]
    Corrupt {
        /// The chunk holding the block.
        chunk: ChunkId,
        /// Index of the block within the chunk.
        block: u32,
    },
    /// A chunk file's header is damaged or of an unknown format.
    #[error("{chunk}: damaged chunk header: {reason}")]
    CorruptHeader {
        /// The chunk whose header is damaged.
        chunk: ChunkId,
        /// What is wrong with it.
        reason: String,
    },
    /// A chunk file of a format version this server does not read (e.g. version 1, whose
    /// blocks a crash could leave unreadable). There is no conversion: such files come
    /// from before any deployment and are to be removed.
    #[error(
        "{chunk}: chunk file has format version {version}, this server reads only versions \
         2 and {supported}",
        supported = crate::store::format::FORMAT_VERSION
    )]
    UnsupportedFormat {
        /// The chunk whose file has the other version.
        chunk: ChunkId,
        /// The version its header records.
        version: u32,
    },
    /// The chunk tree records a layout version this server does not know (written by a
    /// newer build, or damaged).
    #[error("{}: chunk tree version {version:?}; this server reads version 1 and 2", path.display())]
    UnsupportedTree {
        /// The file recording the version.
        path: PathBuf,
        /// What it holds.
        version: String,
    },
    /// The chunk tree holds what no build of this store leaves (a chunk in two places).
    #[error("{}: chunk tree damaged: {reason}", path.display())]
    TreeConflict {
        /// The entry in question.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The file holding this server's node id is damaged.
    #[error("{}: damaged node id file: {reason}", path.display())]
    CorruptNodeId {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A request is out of range or contradicts what is stored (e.g. another chunk size).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The store's capacity or the disk is full.
    #[error("no space: {0}")]
    NoSpace(String),
    /// Another store (in this or another process) holds the data directory.
    #[error("data directory {} is locked by another chunk store", path.display())]
    Locked {
        /// The data directory.
        path: PathBuf,
    },
    /// The store was closed (the server is stopping): it takes no more changes.
    #[error("chunk store in {} is closed: the server is stopping", path.display())]
    Closed {
        /// The data directory.
        path: PathBuf,
    },
    /// An operating system error on the local disk.
    #[error("{context}: {source}")]
    Io {
        /// What the store was doing.
        context: String,
        /// The error the OS returned.
        #[source]
        source: io::Error,
    },
    /// The request names a cluster map, chain member or copy that is out of date (or
    /// this copy is stale or still syncing): the sender refreshes its map and retries.
    #[error("{0}")]
    Stale(String),
    /// Another change of the chunk is under way.
    #[error("{0}")]
    Busy(String),
    /// A server the request needs (a successor, the source of a copy) cannot be reached
    /// or stopped answering.
    #[error("{0}")]
    Unavailable(String),
    /// The chunk is not held here.
    #[error("{0}")]
    NotFound(String),
    /// A size limit was exceeded (inline bytes, a buffer too small for a chunk).
    #[error("{0}")]
    TooBig(String),
    /// A blocking store task failed to run to its end.
    #[error("{0}")]
    Task(String),
    /// A connection or a one-sided transfer failed (a bad key is `AccessViolation`).
    #[error("{0}")]
    Transport(#[from] TransportError),
    /// A message could not be encoded or decoded.
    #[error("{0}")]
    Codec(#[from] ProtoError),
    /// Another server refused a request this one sent: its error, passed on as it is.
    #[error("{0}")]
    Remote(WireError),
    /// A chunk request's grant was refused (see `service::grants`).
    #[error("grant refused ({}): {why}", fault.name())]
    Grant {
        /// What was wrong with it.
        fault: proto::grant::GrantFault,
        /// For the client's log.
        why: String,
    },
    /// The request needs a server of the cluster, or a client with the admin capability.
    #[error("not permitted: {0}")]
    NotPermitted(String),
}

impl From<WireError> for DataError {
    fn from(e: WireError) -> Self {
        DataError::Remote(e)
    }
}

impl DataError {
    /// Whether this is a checksum failure found here: a block whose crc32c did not
    /// match, or a damaged chunk header (not one a peer reported).
    pub fn is_checksum_failure(&self) -> bool {
        matches!(
            self,
            DataError::Corrupt { .. } | DataError::CorruptHeader { .. }
        )
    }

    /// The stable wire code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            // A chunk file this server cannot read is, for its readers, as lost as a
            // corrupt one: the data is to come from another replica.
            DataError::Corrupt { .. }
            | DataError::CorruptHeader { .. }
            | DataError::UnsupportedFormat { .. }
            | DataError::UnsupportedTree { .. }
            | DataError::TreeConflict { .. }
            | DataError::CorruptNodeId { .. } => ErrorCode::Corrupt,
            DataError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            DataError::NoSpace(_) => ErrorCode::NoSpace,
            DataError::Locked { .. } => ErrorCode::Busy,
            DataError::Closed { .. } => ErrorCode::Unavailable,
            DataError::Io { .. } | DataError::Task(_) => ErrorCode::Io,
            DataError::Stale(_) => ErrorCode::Stale,
            DataError::Busy(_) => ErrorCode::Busy,
            DataError::Unavailable(_) => ErrorCode::Unavailable,
            DataError::NotFound(_) => ErrorCode::NotFound,
            DataError::TooBig(_) => ErrorCode::TooBig,
            DataError::Transport(e) => e.code(),
            DataError::Codec(e) => match e {
                ProtoError::Malformed(_) => ErrorCode::Malformed,
                ProtoError::UnknownMessage => ErrorCode::UnknownMessage,
                ProtoError::TooBig { .. } => ErrorCode::TooBig,
            },
            DataError::Remote(e) => e.code,
            DataError::Grant { fault, .. } => fault.code(),
            DataError::NotPermitted(_) => ErrorCode::NotPermitted,
        }
    }

    /// Wraps an OS error; a full disk or quota becomes [`DataError::NoSpace`] so that the
    /// client sees ENOSPC rather than EIO.
    pub fn io(context: impl Into<String>, source: io::Error) -> DataError {
        let full = matches!(
            source.kind(),
            io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
        ) || matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT));
        if full {
            DataError::NoSpace(format!("{}: {source}", context.into()))
        } else {
            DataError::Io {
                context: context.into(),
                source,
            }
        }
    }
}

impl From<DataError> for WireError {
    fn from(e: DataError) -> Self {
        match e {
            // Passed on unchanged: the code and words of the server that refused.
            DataError::Remote(w) => w,
            e => WireError::new(e.code(), e.to_string()),
        }
    }
}

/// Why the data server did not start. Kept apart from [`DataError`], which a request
/// fails with and which crosses the wire: a bad data directory or a port in use is the
/// operator's to fix, and no client ever sees it.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration breaks a rule of `DataConfig::validate`.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The data directory could not be created.
    #[error("creating the data directory {}", dir.display())]
    DataDir {
        /// The configured data directory.
        dir: PathBuf,
        /// The error the OS returned.
        #[source]
        source: io::Error,
    },
    /// The size of the disk under the data directory could not be read (it is the
    /// capacity when `capacity_bytes` is 0).
    #[error("reading the size of the disk under {}", dir.display())]
    DiskSize {
        /// The configured data directory.
        dir: PathBuf,
        /// The error the OS returned.
        #[source]
        source: io::Error,
    },
    /// The chunk store in the data directory could not be opened (locked by another
    /// server, a damaged node id file).
    #[error("opening the chunk store in {}", dir.display())]
    Store {
        /// The configured data directory.
        dir: PathBuf,
        /// Why the store refused to open.
        #[source]
        source: DataError,
    },
    /// The blocking task that opens the store panicked or was cancelled.
    #[error("the task opening the chunk store did not finish")]
    Task(#[from] tokio::task::JoinError),
    /// The transport endpoint could not be made (an unusable backend or limits).
    #[error("making the transport endpoint")]
    Transport(#[source] TransportError),
    /// A key file could not be used (the message names it and the fix).
    #[error("{0}")]
    Key(TransportError),
    /// The I/O buffers could not be allocated or registered with the transport.
    #[error("registering the I/O buffers")]
    Buffers(#[source] TransportError),
    /// The metrics endpoint could not be started.
    #[error("starting the metrics endpoint")]
    Metrics(#[source] telemetry::TelemetryError),
    /// The listener could not be bound.
    #[error("listening on {addr}")]
    Listen {
        /// The configured listen address.
        addr: String,
        /// Why binding it failed.
        #[source]
        source: TransportError,
    },
}

/// Adds what the store was doing to an `io::Result`, built only on the error path.
pub(crate) trait IoContext<T> {
    /// Converts the error with [`DataError::io`], calling `what` for the context.
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T, DataError>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T, DataError> {
        self.map_err(|e| DataError::io(what(), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::InodeId;

    #[test]
    fn codes_and_wire_conversion() {
        let chunk = ChunkId {
            inode: InodeId(7),
            index: 3,
        };
        let corrupt = DataError::Corrupt { chunk, block: 5 };
        assert_eq!(corrupt.code(), ErrorCode::Corrupt);
        let wire = WireError::from(corrupt);
        assert_eq!(wire.code, ErrorCode::Corrupt);
        assert!(wire.message.contains("chunk:7.3") && wire.message.contains("block 5"));
        let invalid = DataError::InvalidArgument("x".into());
        assert_eq!(invalid.code(), ErrorCode::InvalidArgument);
        let v1 = DataError::UnsupportedFormat { chunk, version: 1 };
        assert_eq!(v1.code(), ErrorCode::Corrupt);
        assert!(v1
            .to_string()
            .contains("version 1, this server reads only versions 2 and 3"));
        let locked = DataError::Locked { path: "/d".into() };
        assert_eq!(locked.code(), ErrorCode::Busy);
    }

    /// Guards against a peer's refusal losing its code or words on its way back to the
    /// client, and the service's own refusals getting other codes than before.
    #[test]
    fn service_errors_keep_their_codes_at_the_wire() {
        let peer = WireError::new(ErrorCode::Stale, "map 7 is older than 9");
        assert_eq!(WireError::from(DataError::from(peer.clone())), peer);
        let stale = WireError::from(DataError::Stale("not the head".into()));
        assert_eq!(
            (stale.code, stale.message.as_str()),
            (ErrorCode::Stale, "not the head")
        );
        let cases = [
            (DataError::Busy(String::new()), ErrorCode::Busy),
            (
                DataError::Unavailable(String::new()),
                ErrorCode::Unavailable,
            ),
            (DataError::NotFound(String::new()), ErrorCode::NotFound),
            (DataError::TooBig(String::new()), ErrorCode::TooBig),
            (DataError::Task(String::new()), ErrorCode::Io),
            (
                DataError::Codec(ProtoError::UnknownMessage),
                ErrorCode::UnknownMessage,
            ),
        ];
        for (e, code) in cases {
            assert_eq!(WireError::from(e).code, code);
        }
    }

    #[test]
    fn a_full_disk_is_no_space_not_io() {
        let enospc = io::Error::from_raw_os_error(libc::ENOSPC);
        assert_eq!(DataError::io("write", enospc).code(), ErrorCode::NoSpace);
        let edquot = io::Error::from_raw_os_error(libc::EDQUOT);
        assert_eq!(DataError::io("write", edquot).code(), ErrorCode::NoSpace);
        let eio = io::Error::from_raw_os_error(libc::EIO);
        let e = DataError::io("read chunk", eio);
        assert_eq!(e.code(), ErrorCode::Io);
        assert!(e.to_string().starts_with("read chunk: "));
    }
}
