//! The transport's error type.

use proto::{ErrorCode, WireError};

/// Everything that can go wrong moving bytes between two endpoints.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The peer could not be reached.
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        /// The address tried.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// A server could not listen at its address (taken by another process, not an
    /// address of this machine, a port below 1024 without the right).
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address asked for.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The connection handshake failed (not a Tessera peer, or a broken one).
    #[error("handshake with {peer} failed: {why}")]
    Handshake {
        /// The peer.
        peer: String,
        /// Why.
        why: String,
    },
    /// The peer speaks another version of the transport or of the application protocol.
    #[error(
        "{peer} speaks transport v{their_transport}/protocol v{their_app}, \
         we speak v{our_transport}/v{our_app}"
    )]
    VersionMismatch {
        /// The peer.
        peer: String,
        /// Its transport version.
        their_transport: u16,
        /// Its application protocol version.
        their_app: u16,
        /// Our transport version.
        our_transport: u16,
        /// Our application protocol version.
        our_app: u16,
    },
    /// Authentication failed: refused by the server, the server did not prove the key,
    /// or one side has keys and the other has none. One line, for the operator.
    #[error("{why}")]
    Auth {
        /// The peer.
        peer: String,
        /// Why, naming the peer's address.
        why: String,
    },
    /// A key file could not be used (missing, malformed, readable by others).
    #[error("key file {path}: {why}")]
    KeyFile {
        /// The file.
        path: String,
        /// Why, with the fix.
        why: String,
    },
    /// The connection is closed (peer died, closed it, or broke the protocol).
    #[error("connection to {peer} is closed: {why}")]
    Disconnected {
        /// The peer.
        peer: String,
        /// Why it closed.
        why: String,
    },
    /// An operation did not complete in time.
    #[error("{op} to {peer} timed out after {ms} ms")]
    TimedOut {
        /// The operation.
        op: &'static str,
        /// The peer.
        peer: String,
        /// The timeout.
        ms: u64,
    },
    /// A message or transfer is larger than the configured limit.
    #[error("{what} of {size} bytes exceeds the limit of {limit} bytes")]
    TooBig {
        /// What was too big.
        what: &'static str,
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// A one-sided access was refused: unknown or revoked key, out of bounds, wrong access.
    #[error("access refused: {0}")]
    AccessViolation(String),
    /// The peer's engine refused a call (overloaded, no handler, unknown frame).
    #[error("peer refused the request ({code:?}): {message}")]
    Refused {
        /// Why, as a stable code.
        code: ErrorCode,
        /// Why, for people.
        message: String,
    },
    /// An invalid argument given to a local operation.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The requested backend cannot run on this host.
    #[error("{0}")]
    Unsupported(String),
    /// A verbs call failed (the `rdma` backend): its name and the errno it set.
    #[error("{call} failed: {} ({})", os_error(*errno), crate::rdma_common::errno_name(*errno))]
    Verbs {
        /// The verbs function (`ibv_create_qp`, ...).
        call: &'static str,
        /// The errno it reported.
        errno: i32,
    },
    /// A local I/O error (socket set-up).
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

fn os_error(errno: i32) -> std::io::Error {
    std::io::Error::from_raw_os_error(errno)
}

/// The `op` of a [`TransportError::TimedOut`] for a connection attempt that did not
/// complete: no request was sent on it.
pub(crate) const OP_CONNECT: &str = "connect";
/// The `op` of a [`TransportError::TimedOut`] for a call whose reply did not come in
/// `call_timeout_ms`: the request may have been applied.
pub(crate) const OP_CALL: &str = "call";

impl TransportError {
    /// Whether no connection was made (refused, unreachable, or an attempt that timed
    /// out): no request reached the peer, so sending it again elsewhere or later is safe.
    pub fn never_connected(&self) -> bool {
        match self {
            TransportError::Connect { .. } => true,
            TransportError::TimedOut { op, .. } => *op == OP_CONNECT,
            _ => false,
        }
    }

    /// A connection that closed before its handshake was answered: one never made.
    /// Nothing was asked of the server, so the caller may try again or move on to the
    /// next address. A server killed while the connection waited in its listener's
    /// queue (taken by the kernel, never by the process) closes it this way.
    pub(crate) fn cut_in_handshake(addr: &str, e: std::io::Error) -> TransportError {
        TransportError::Connect {
            addr: addr.to_string(),
            source: std::io::Error::new(e.kind(), format!("closed during the handshake: {e}")),
        }
    }

    /// Whether a call's reply did not come within `call_timeout_ms`: the peer took the
    /// request (it may have been applied) and then said nothing. A peer that stops
    /// answering while keeping its connection open (stopped, hung, paused) shows this
    /// way only.
    pub fn is_call_timeout(&self) -> bool {
        matches!(self, TransportError::TimedOut { op, .. } if *op == OP_CALL)
    }

    /// The stable code this error is reported with.
    pub fn code(&self) -> ErrorCode {
        match self {
            TransportError::Connect { .. }
            | TransportError::Listen { .. }
            | TransportError::Disconnected { .. } => ErrorCode::Unavailable,
            TransportError::Handshake { .. } => ErrorCode::Malformed,
            TransportError::Auth { .. } => ErrorCode::PermissionDenied,
            TransportError::KeyFile { .. } => ErrorCode::InvalidArgument,
            TransportError::VersionMismatch { .. } => ErrorCode::VersionMismatch,
            TransportError::TimedOut { .. } => ErrorCode::TimedOut,
            TransportError::TooBig { .. } => ErrorCode::TooBig,
            TransportError::AccessViolation(_) => ErrorCode::AccessViolation,
            TransportError::Refused { code, .. } => *code,
            TransportError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            TransportError::Unsupported(_) => ErrorCode::NotSupported,
            TransportError::Verbs { .. } => ErrorCode::Io,
            TransportError::Io(_) => ErrorCode::Io,
        }
    }
}

impl From<TransportError> for WireError {
    fn from(e: TransportError) -> Self {
        WireError::new(e.code(), e.to_string())
    }
}
