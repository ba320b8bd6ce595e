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
}

impl ClientError {
    /// The stable code of this error; the FUSE layer maps it to an errno.
    pub fn code(&self) -> ErrorCode {
        match self {
            ClientError::Remote(e) => e.code,
            ClientError::Transport(e) => e.code(),
            ClientError::Protocol(_) => ErrorCode::Malformed,
            ClientError::Invalid(_) | ClientError::Config(_) => ErrorCode::InvalidArgument,
        }
    }
}

impl From<proto::ProtoError> for ClientError {
    fn from(e: proto::ProtoError) -> Self {
        ClientError::Protocol(e.to_string())
    }
}

/// Result of client operations.
pub type Result<T> = std::result::Result<T, ClientError>;
