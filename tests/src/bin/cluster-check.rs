//! `cluster-check`: a whole cluster of real processes over one transport, checked with
//! sha256 through a data server's death (see `tessera_tests::cluster_check`). Prints the
//! sums and rates and a last line `PASS` or `FAIL ...`; exits non-zero on failure. Every
//! process it starts is stopped when it ends, also on failure, panic, SIGINT or SIGTERM.

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;
use tessera_tests::cluster_check::{run, CheckOptions, Report};

/// Runs tessera-meta, three tessera-data and a client over one transport: writes a file,
/// reads it back, reads it again while killing a data server, compares sha256.
#[derive(Parser, Debug)]
struct Args {
    /// Transport of the servers and the client: tcp or rdma.
    #[arg(long, default_value = "tcp")]
    transport: String,
    /// Address the servers listen on (the port is picked).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Size of the file, in MiB.
    #[arg(long, default_value_t = 256)]
    size_mib: u64,
    /// Directory holding tessera-meta and tessera-data; default: this program's own.
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// The data server (0, 1 or 2) killed during the second read.
    #[arg(long, default_value_t = 1)]
    victim: usize,
    /// Seed of the file's pseudo-random bytes.
    #[arg(long, default_value_t = 27)]
    seed: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let bin_dir = args.bin_dir.clone().or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(PathBuf::from))
    });
    let opts = CheckOptions {
        transport: args.transport,
        host: args.host,
        size_bytes: args.size_mib << 20,
        bin_dir,
        victim: args.victim,
        seed: args.seed,
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            println!("FAIL: no runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let started = std::time::Instant::now();
    let outcome = rt.block_on(supervise(opts));
    let took = started.elapsed().as_secs_f64();
    match outcome {
        Ok(r) => {
            println!(
                "PASS: sha256 {} written, read back and read through the kill; \
                 write {:.1} MiB/s, read {:.1} MiB/s, read with failover {:.1} MiB/s \
                 ({} retries); {took:.1} s in all",
                r.written, r.write_mib_s, r.read_mib_s, r.failover_mib_s, r.retries
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("FAIL: {e} ({took:.1} s)");
            ExitCode::FAILURE
        }
    }
}

/// Runs the check in a task, so that a panic unwinds it (stopping the processes it
/// started) and a SIGINT or SIGTERM aborts it the same way.
async fn supervise(opts: CheckOptions) -> Result<Report, String> {
    use tokio::signal::unix::{signal, SignalKind};
    let (mut int, mut term) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(i), Ok(t)) => (i, t),
        (Err(e), _) | (_, Err(e)) => return Err(format!("no signal handler: {e}")),
    };
    let mut task = tokio::spawn(run(opts));
    let why = tokio::select! {
        r = &mut task => {
            return match r {
                Ok(Ok(report)) => Ok(report),
                Ok(Err(e)) => Err(format!("{e:#}")),
                Err(e) => Err(format!("the check panicked: {e}")),
            };
        }
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    };
    task.abort();
    let _ = task.await;
    Err(format!("stopped by {why}"))
}
