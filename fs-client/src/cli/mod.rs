//! Code only the `tessera` command line uses: its arguments and subcommands
//! (`commands`), starting and stopping a local cluster (`tessera up`, `tessera down`)
//! and the admin calls behind `tessera status` and `tessera fsck`.

pub mod admin;
pub mod commands;
pub mod keys;
mod leftovers;
pub mod local_cluster;
