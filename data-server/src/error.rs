//! The data server's error type and its mapping onto the stable wire codes.

use proto::{ChunkId, ErrorCode, WireError};
use std::io;
use std::path::PathBuf;

/// Everything the chunk store can fail with.
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
        "{chunk}: chunk file has format version {version}, this server reads only version \
         {supported}",
        supported = crate::store::format::FORMAT_VERSION
    )]
    UnsupportedFormat {
        /// The chunk whose file has the other version.
        chunk: ChunkId,
        /// The version its header records.
        version: u32,
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
}

impl DataError {
    /// The stable wire code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            // A chunk file this server cannot read is, for its readers, as lost as a
            // corrupt one: the data is to come from another replica.
            DataError::Corrupt { .. }
            | DataError::CorruptHeader { .. }
            | DataError::UnsupportedFormat { .. }
            | DataError::CorruptNodeId { .. } => ErrorCode::Corrupt,
            DataError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            DataError::NoSpace(_) => ErrorCode::NoSpace,
            DataError::Locked { .. } => ErrorCode::Busy,
            DataError::Closed { .. } => ErrorCode::Unavailable,
            DataError::Io { .. } => ErrorCode::Io,
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
        WireError::new(e.code(), e.to_string())
    }
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
            .contains("version 1, this server reads only version 2"));
        let locked = DataError::Locked { path: "/d".into() };
        assert_eq!(locked.code(), ErrorCode::Busy);
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
