//! Code only the `tessera` command line uses: its arguments and subcommands
//! (`commands`), starting and stopping a local cluster (`tessera up`, `tessera down`),
//! the admin calls behind `tessera status` and `tessera fsck`, and the mount helper
//! (`mount.fuse.tessera`) with its background mode (`daemon`).

pub mod admin;
pub mod commands;
pub mod daemon;
pub mod keys;
mod leftovers;
pub mod local_cluster;
pub mod mount_helper;
mod remount;
pub mod top;

/// Logs to standard error, filtered by `TESSERA_LOG` (default `info`): plain text to a
/// file or the journal, colours to a terminal. Called once, after a daemonizing fork.
pub fn init_logging() {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TESSERA_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}
