//! Code only the `tessera` command line uses: starting and stopping a local cluster
//! (`tessera up`, `tessera down`) and the admin commands (`tessera status`, `tessera fsck`).

pub mod admin;
mod leftovers;
pub mod local_cluster;
