//! What the client remembers between calls so that it need not ask the metadata server:
//! attributes of fresh directory entries, the names in directories it holds, the files
//! known to have no extended attributes, pages of directories walked in name order, and
//! the time-bounded map they are built on.

pub(crate) mod dirattrs;
pub(crate) mod dirnames;
pub(crate) mod noxattrs;
pub(crate) mod scans;
pub(crate) mod ttlmap;
