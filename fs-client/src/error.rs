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

/// An error and its causes as one line, each cause once: most errors here show their
/// source in their own message too, so printing every link of the chain would say each
/// cause two or three times ("cannot connect to A: refused: cannot connect to A:
/// refused: refused"). A cause that an earlier part already says is left out.
pub fn each_cause_once(causes: impl IntoIterator<Item = String>) -> String {
    let mut parts: Vec<String> = Vec::new();
    for c in causes {
        if !c.is_empty() && !parts.iter().any(|p| p.contains(&c)) {
            parts.push(c);
        }
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::each_cause_once;

    #[test]
    fn each_cause_is_said_once() {
        let chain = [
            "connecting to the metadata server at 127.0.0.1:9",
            "cannot connect to 127.0.0.1:9: Connection refused (os error 111)",
            "cannot connect to 127.0.0.1:9: Connection refused (os error 111)",
            "Connection refused (os error 111)",
        ]
        .map(String::from);
        assert_eq!(
            each_cause_once(chain),
            "connecting to the metadata server at 127.0.0.1:9: cannot connect to \
             127.0.0.1:9: Connection refused (os error 111)"
        );
        let distinct = ["reading x", "permission denied"].map(String::from);
        assert_eq!(each_cause_once(distinct), "reading x: permission denied");
    }
}
