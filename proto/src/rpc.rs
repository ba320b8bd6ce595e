//! The typed RPC layer: every request is its own type that names its reply type.
//!
//! A request struct (`meta::fs::Lookup`, `data::ReadChunk`, ...) implements [`Rpc`]: its
//! `Reply` is what a server answers with on success, its `Envelope` the enum it travels
//! in. On the wire a request is `postcard(Envelope)` and its answer
//! `postcard(Result<R::Reply, WireError>)`, so a caller decoding the answer as anything
//! but `R::Reply` does not compile, and no "unexpected reply" case exists to handle.
//!
//! postcard encodes `Err(e)` of every `Result<T, WireError>` the same way (the variant
//! tag, then the error), so [`answer`] can fall back to a bare error of any reply type.
//!
//! The subsystem enums and the `Rpc` impls come from one table per subsystem
//! ([`rpc_requests!`](crate::rpc_requests)); the request structs themselves are written out, with their docs.

use crate::codec;
use crate::error::{ErrorCode, ProtoError, WireError};
use serde::{de::DeserializeOwned, Serialize};
use std::fmt::Debug;
use std::marker::PhantomData;

/// A request type, its reply type, and the envelope it travels in.
pub trait Rpc: Serialize + DeserializeOwned + Clone + Debug + Send + 'static {
    /// What a successful call returns.
    type Reply: Serialize + DeserializeOwned + Debug + Send + 'static;
    /// The message type on the wire (one per server kind).
    type Envelope: Serialize + DeserializeOwned + Debug + Send + Sync + 'static;
    /// The request's name in logs and tracing spans.
    const NAME: &'static str;
    /// Whether applying the request twice has the effect of applying it once: a client
    /// resends it after a broken connection only then. Each request states it, so a new
    /// one cannot be added without deciding.
    const IDEMPOTENT: bool;
    /// Wraps the request in its envelope.
    fn into_envelope(self) -> Self::Envelope;
}

/// The answer to request `R`, as the wire carries it.
pub type RpcResult<R> = Result<<R as Rpc>::Reply, WireError>;

/// A request in its envelope, ready to be sent (and sent again) while remembering which
/// reply type it expects. Only [`Request::new`] makes one, so the envelope always holds
/// an `R`.
#[derive(Debug)]
pub struct Request<R: Rpc> {
    envelope: R::Envelope,
    _reply: PhantomData<fn() -> R>,
}

impl<R: Rpc> Request<R> {
    /// Wraps `req`.
    pub fn new(req: R) -> Request<R> {
        Request {
            envelope: req.into_envelope(),
            _reply: PhantomData,
        }
    }

    /// The envelope, for code that looks at requests of every type (client caches).
    pub fn envelope(&self) -> &R::Envelope {
        &self.envelope
    }

    /// Encodes the request, refusing more than `limit_bytes`.
    pub fn encode(&self, limit_bytes: usize) -> Result<Vec<u8>, ProtoError> {
        codec::encode(&self.envelope, limit_bytes)
    }

    /// Decodes the answer to this request.
    pub fn decode_reply(&self, bytes: &[u8]) -> Result<RpcResult<R>, ProtoError> {
        codec::decode(bytes)
    }

    /// Decodes the answer to this request and the metadata server's tail after it
    /// ([`crate::meta::ReplyTail`]), if it sent one.
    pub fn decode_reply_with_tail(
        &self,
        bytes: &[u8],
    ) -> Result<(RpcResult<R>, Option<crate::meta::ReplyTail>), ProtoError> {
        codec::decode_with_trailer(bytes)
    }
}

impl<R: Rpc<Envelope = crate::meta::MetaRequest>> Request<R> {
    /// Names the user a file-system call is made for (every [`crate::meta::fs`]
    /// request carries one; see [`crate::meta::FsCall`]). Cluster and admin calls name
    /// none: it is ignored for them.
    pub fn with_caller(mut self, caller: crate::meta::Caller) -> Request<R> {
        if let crate::meta::MetaRequest::Fs(call) = &mut self.envelope {
            call.caller = caller;
        }
        self
    }

    /// Gives a file-system change its id (see [`crate::meta::OpId`]); ignored for
    /// other calls.
    pub fn with_op(mut self, op: crate::meta::OpId) -> Request<R> {
        if let crate::meta::MetaRequest::Fs(call) = &mut self.envelope {
            call.op = Some(op);
        }
        self
    }

    /// The change's id, if it has one.
    pub fn op(&self) -> Option<crate::meta::OpId> {
        match &self.envelope {
            crate::meta::MetaRequest::Fs(call) => call.op,
            _ => None,
        }
    }

    /// This request to send again after it went unanswered: a change's id says so
    /// (the server then looks for its record). `None` for a request without an id.
    pub fn retried(&self) -> Option<Request<R>> {
        let mut op = self.op()?;
        op.retry = true;
        let req = Request {
            envelope: self.envelope.clone(),
            _reply: PhantomData,
        };
        Some(req.with_op(op))
    }

    /// This request with the namespace root replaced by `root`, for a mount of a
    /// subdirectory: the client's caches keep speaking of the root, and only what goes
    /// on the wire names the directory mounted (as a scoped key's server does). `None`
    /// when the request names no root and goes unchanged.
    pub fn rooted_at(&self, root: crate::InodeId) -> Option<Request<R>> {
        let crate::meta::MetaRequest::Fs(call) = &self.envelope else {
            return None;
        };
        let mut call = call.clone();
        let mut named = false;
        for ino in call.req.inodes_mut() {
            if *ino == crate::InodeId::ROOT {
                *ino = root;
                named = true;
            }
        }
        named.then_some(Request {
            envelope: crate::meta::MetaRequest::Fs(call),
            _reply: PhantomData,
        })
    }
}

/// Encodes a server's answer. One that does not fit `limit_bytes` becomes a `TooBig`
/// error, which always fits: a bare error carries nothing but its message.
pub fn answer<T: Serialize>(result: &Result<T, WireError>, limit_bytes: usize) -> Vec<u8> {
    match codec::encode(result, limit_bytes) {
        Ok(bytes) => bytes,
        Err(e) => {
            let err: Result<(), WireError> = Err(WireError::new(ErrorCode::TooBig, e.to_string()));
            codec::encode(&err, usize::MAX).unwrap_or_default()
        }
    }
}

/// Whether `answer`, as [`answer`] encoded it, is an error: postcard writes a
/// `Result`'s variant tag first, 1 for `Err` (for the servers' error counts).
pub fn is_error(answer: &[u8]) -> bool {
    answer.first() == Some(&1)
}

/// Declares one subsystem's request enum from a table of request types: the enum (one
/// tuple variant per request), `From` each request into it, and each request's [`Rpc`]
/// impl (reply type, name, idempotence, envelope).
///
/// ```text
/// rpc_requests! {
///     /// Docs of the enum.
///     pub enum FsRequest => MetaRequest {
///         Lookup => Attr, "lookup", idempotent: true;
///         ...
///     }
/// }
/// ```
#[macro_export]
macro_rules! rpc_requests {
    (
        $(#[$meta:meta])*
        $vis:vis enum $Enum:ident => $Env:ty {
            $( $Req:ident => $Reply:ty, $name:literal, idempotent: $idem:literal; )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
        $vis enum $Enum {
            $(
                #[doc = concat!("See [`", stringify!($Req), "`].")]
                $Req($Req),
            )*
        }

        impl $Enum {
            /// Every request type's name, in the table's order (for tests that must
            /// cover each kind).
            pub const NAMES: &'static [&'static str] = &[ $( $name, )* ];

            /// The request's name, for logs.
            pub fn name(&self) -> &'static str {
                match self {
                    $( $Enum::$Req(_) => $name, )*
                }
            }

            /// Decodes `bytes` as the answer to the request type numbered `which` (modulo
            /// their count, in the table's order), as a client does: for the fuzz targets.
            #[doc(hidden)]
            pub fn fuzz_reply(which: usize, bytes: &[u8]) -> bool {
                let decoders: &[fn(&[u8]) -> bool] = &[ $( $crate::fuzzing::reply::<$Req>, )* ];
                decoders[which % decoders.len()](bytes)
            }
        }

        $(
            impl From<$Req> for $Enum {
                fn from(r: $Req) -> $Enum {
                    $Enum::$Req(r)
                }
            }

            impl $crate::rpc::Rpc for $Req {
                type Reply = $Reply;
                type Envelope = $Env;
                const NAME: &'static str = $name;
                const IDEMPOTENT: bool = $idem;
                fn into_envelope(self) -> $Env {
                    <$Env>::from($Enum::$Req(self))
                }
            }
        )*
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::fs::Readlink;
    use crate::meta::MetaRequest;
    use crate::InodeId;

    #[test]
    fn a_too_big_answer_becomes_an_error_of_the_same_reply_type() {
        let req = Request::new(Readlink { ino: InodeId(3) });
        let big: RpcResult<Readlink> = Ok(vec![7; 64]);
        let bytes = answer(&big, 4);
        assert!(is_error(&bytes));
        assert!(!is_error(&answer(&RpcResult::<Readlink>::Ok(vec![1]), 64)));
        let back = req.decode_reply(&bytes).unwrap();
        assert_eq!(back.unwrap_err().code, ErrorCode::TooBig);
        // The envelope is what travels.
        let bytes = req.encode(1024).unwrap();
        assert!(matches!(
            codec::decode::<MetaRequest>(&bytes).unwrap(),
            MetaRequest::Fs(_)
        ));
    }

    #[test]
    fn rooted_at_maps_only_the_root_and_only_when_named() {
        use crate::meta::fs::{Lookup, Rename};
        use crate::meta::RenameMode;
        let s = InodeId(42);
        // Unchanged: a request naming no root is sent as it is.
        assert!(Request::new(Readlink { ino: InodeId(3) })
            .rooted_at(s)
            .is_none());
        let req = Request::new(Rename {
            parent: InodeId::ROOT,
            name: b"a".to_vec(),
            new_parent: InodeId(9),
            new_name: b"b".to_vec(),
            mode: RenameMode::Replace,
        });
        let MetaRequest::Fs(call) = req.rooted_at(s).unwrap().envelope else {
            panic!("not a file-system call");
        };
        let crate::meta::FsRequest::Rename(r) = call.req else {
            panic!("not a rename");
        };
        assert_eq!((r.parent, r.new_parent), (s, InodeId(9)));
        let lookup = Request::new(Lookup {
            parent: InodeId::ROOT,
            name: b"x".to_vec(),
        });
        assert!(lookup.rooted_at(s).is_some());
    }
}
