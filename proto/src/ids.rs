//! Newtype ids: the compiler tells an inode from a chunk from a node.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident($inner:ty), $prefix:literal) => {
        $(#[$doc])*
        #[derive(
            Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
        )]
        pub struct $name(pub $inner);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

id_type!(
    /// An inode number. Never reused: the metadata server hands them out from a counter.
    InodeId(u64),
    "ino:"
);
id_type!(
    /// A data server's id, assigned by the metadata server at its first registration.
    NodeId(u32),
    "node:"
);
id_type!(
    /// A replication chain of data servers.
    ChainId(u32),
    "chain:"
);
id_type!(
    /// A version number (of a chunk, or of the cluster map).
    Version(u64),
    "v"
);
id_type!(
    /// An open-file session on the metadata server (one per `open`).
    SessionId(u64),
    "session:"
);
id_type!(
    /// A client (mount) as known to the metadata server.
    ClientId(u64),
    "client:"
);
id_type!(
    /// A memory key: names registered memory (or a window onto it) to a peer.
    MrKey(u32),
    "key:"
);

impl InodeId {
    /// The root directory of the namespace.
    pub const ROOT: InodeId = InodeId(1);
}

/// One chunk of one file: the file's inode and the chunk's index within the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ChunkId {
    /// The file the chunk belongs to.
    pub inode: InodeId,
    /// Index of the chunk: it covers bytes `[index * chunk_size, (index + 1) * chunk_size)`.
    pub index: u64,
}

impl fmt::Display for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "chunk:{}.{}", self.inode.0, self.index)
    }
}
