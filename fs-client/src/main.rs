//! `tessera`: mount a cluster, or start and stop a local one. The subcommands live in
//! `fs_client::cli::commands`; this file parses, runs and reports.

use clap::Parser;
use fs_client::cli::commands::{self, Args};

fn main() {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TESSERA_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        // A log file gets plain text, a terminal colours.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let args = Args::try_parse().unwrap_or_else(|e| e.exit());
    if let Err(e) = commands::run(args) {
        let causes = e.chain().map(|c| c.to_string());
        eprintln!("tessera: {}", fs_client::error::each_cause_once(causes));
        std::process::exit(1);
    }
}
