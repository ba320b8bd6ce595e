//! `tessera`: mount a cluster, or start and stop a local one. The subcommands live in
//! `fs_client::cli::commands`; this file parses, runs and reports. Called by the name
//! `mount.fuse.tessera` (what `mount -t fuse.tessera` runs), it is the mount helper.

use clap::Parser;
use fs_client::cli::{self, commands, mount_helper};

fn main() {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv
        .first()
        .is_some_and(|a| mount_helper::invoked_as_helper(a))
    {
        let args: Vec<String> = argv[1..]
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        // Logging starts in the helper, after it forks.
        std::process::exit(mount_helper::run(&args));
    }
    cli::init_logging();
    let args = commands::Args::try_parse().unwrap_or_else(|e| e.exit());
    if let Err(e) = commands::run(args) {
        let causes = e.chain().map(|c| c.to_string());
        eprintln!("tessera: {}", telemetry::errors::each_cause_once(causes));
        std::process::exit(1);
    }
}
