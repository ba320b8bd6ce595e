//! `tessera-data`: runs one data server until SIGINT or SIGTERM.

use anyhow::Context;
use clap::Parser;
use data_server::{DataConfig, DataServer};
use std::path::PathBuf;
use std::time::Duration;

/// Tessera data server: stores file chunks and moves them with one-sided transfers.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Configuration file (TOML); flags below override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address to listen on (host:port; port 0 picks one).
    #[arg(long)]
    listen: Option<String>,
    /// Metadata server address (host:port), or several, comma-separated.
    #[arg(long)]
    meta: Option<String>,
    /// Directory for chunks.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Capacity in bytes (0: size of the file system).
    #[arg(long)]
    capacity_bytes: Option<u64>,
    /// Write the bound address here once registered.
    #[arg(long)]
    addr_file: Option<PathBuf>,
    /// Transport backend: tcp, rdma, or auto (rdma when a device is usable, else tcp).
    #[arg(long)]
    transport: Option<String>,
    /// The cluster key file (mode 0600); every connection must then authenticate.
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// Serve without authentication even on a non-loopback address (warned about).
    #[arg(long)]
    insecure: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics (host:port); `metrics.listen`.
    #[arg(long)]
    metrics_listen: Option<String>,
    /// Write the metrics endpoint's bound address here; `metrics.addr_file`.
    #[arg(long)]
    metrics_addr_file: Option<PathBuf>,
}

fn load(args: &Args) -> anyhow::Result<DataConfig> {
    let mut c: DataConfig = match &args.config {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {p:?}"))?;
            toml::from_str(&text).with_context(|| format!("parsing {p:?}"))?
        }
        None => DataConfig::default(),
    };
    if let Some(v) = &args.listen {
        c.listen = v.clone();
    }
    if let Some(v) = &args.meta {
        c.meta_addr = v.clone();
    }
    if let Some(v) = &args.data_dir {
        c.data_dir = v.clone();
    }
    if let Some(v) = args.capacity_bytes {
        c.capacity_bytes = v;
    }
    if let Some(v) = &args.addr_file {
        c.addr_file = v.clone();
    }
    if let Some(v) = &args.transport {
        c.transport = v.parse().map_err(anyhow::Error::msg)?;
    }
    if let Some(v) = &args.key_file {
        c.key_file = v.clone();
    }
    c.insecure |= args.insecure;
    if let Some(v) = &args.metrics_listen {
        c.metrics.listen = v.clone();
    }
    if let Some(v) = &args.metrics_addr_file {
        c.metrics.addr_file = v.clone();
    }
    // Resolve `auto` and check `rdma` now, so a host without RDMA gets one clear
    // sentence before anything starts.
    c.transport = c.transport.resolve_for_process(&c.transport_limits)?;
    c.validate().map_err(anyhow::Error::msg)?;
    Ok(c)
}

fn write_addr_file(path: &std::path::Path, addr: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, addr).with_context(|| format!("writing {tmp:?}"))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {path:?}"))?;
    Ok(())
}

async fn run(config: DataConfig) -> anyhow::Result<()> {
    let server = DataServer::start(config.clone()).await?;
    // Scripts wait for the address file, systemd (`Type=notify`) for the readiness
    // message: both only once the server is registered.
    let notify = std::env::var_os("NOTIFY_SOCKET").is_some();
    if !config.addr_file.as_os_str().is_empty() || notify {
        let node = loop {
            if let Some(n) = server.wait_registered(Duration::from_secs(1)).await {
                break n;
            }
        };
        tracing::info!(%node, "ready");
    }
    if !config.addr_file.as_os_str().is_empty() {
        write_addr_file(&config.addr_file, server.advertise())?;
    }
    if notify {
        if let Err(e) = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]) {
            tracing::warn!(error = %e, "could not tell systemd the server is ready");
        }
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("stopping");
    server.shutdown();
    // Saves the store's usage, so the next start need not count every chunk. A failure
    // only costs that count.
    let store = server.store().clone();
    let closed = tokio::task::spawn_blocking(move || store.close())
        .await
        .map_err(anyhow::Error::from)
        .and_then(|r| r.map_err(anyhow::Error::from));
    if let Err(e) = closed {
        tracing::warn!(error = %e, "usage not saved: the next start counts");
    }
    Ok(())
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TESSERA_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        // A log file gets plain text, a terminal colours.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = Args::try_parse()
        .map_err(|e| e.exit())
        .and_then(|args| load(&args))
        .and_then(|config| {
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the runtime")?
                .block_on(run(config))
        });
    if let Err(e) = result {
        eprintln!("tessera-data: {}", telemetry::errors::one_line(e.as_ref()));
        std::process::exit(1);
    }
}
