//! `tessera-meta`: runs the metadata server until SIGINT or SIGTERM.

use anyhow::{bail, Context};
use clap::Parser;
use meta_server::server::{MetaConfig, MetaServer};
use meta_server::StoreKind;
use std::path::PathBuf;

/// Tessera metadata server: the namespace, file layouts and data-server membership.
#[derive(Parser, Debug)]
#[command(version, args_conflicts_with_subcommands = true)]
struct Args {
    /// A tool instead of the server.
    #[command(subcommand)]
    tool: Option<Tool>,
    /// Configuration file (TOML); flags below override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address to listen on (host:port; port 0 picks one).
    #[arg(long)]
    listen: Option<String>,
    /// Directory of the embedded store.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Store engine: redb, sled (embedded) or etcd (with --etcd).
    #[arg(long)]
    store: Option<String>,
    /// etcd client URLs, comma-separated (http://host:port,...); `etcd.endpoints`.
    #[arg(long, value_delimiter = ',')]
    etcd: Option<Vec<String>>,
    /// Key prefix of this namespace in etcd; `etcd.prefix`.
    #[arg(long)]
    etcd_prefix: Option<String>,
    /// Write the bound address here once serving.
    #[arg(long)]
    addr_file: Option<PathBuf>,
    /// Transport backend: tcp, rdma, or auto (rdma when a device is usable, else tcp).
    #[arg(long)]
    transport: Option<String>,
    /// Copies of each chunk of new files (1 to 8; `namespace.replicas`).
    #[arg(long)]
    replicas: Option<u8>,
    /// The cluster key file (mode 0600); every connection must then authenticate.
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// The administrator's key file, to check that it is the key derived from the
    /// cluster key (the start is refused if not).
    #[arg(long)]
    admin_key_file: Option<PathBuf>,
    /// Serve without authentication even on a non-loopback address (warned about).
    #[arg(long)]
    insecure: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics (host:port); `metrics.listen`.
    #[arg(long)]
    metrics_listen: Option<String>,
    /// Write the metrics endpoint's bound address here; `metrics.addr_file`.
    #[arg(long)]
    metrics_addr_file: Option<PathBuf>,
    /// How long a server waits for another's owner key on etcd to go (a standby:
    /// long); `etcd.owner_wait_ms`.
    #[arg(long)]
    etcd_owner_wait_ms: Option<u64>,
    /// Serve the etcd prefix beside other metadata servers, all at once (each started
    /// with this flag); `etcd.shared`.
    #[arg(long)]
    etcd_shared: bool,
}

#[derive(clap::Subcommand, Debug)]
enum Tool {
    /// Copy a stopped namespace from one store to another, then compare them key for
    /// key: STORE is redb:DIR, sled:DIR or etcd:URL,...[/PREFIX/] (the prefix defaults
    /// to tessera/). Every metadata server on either store must be stopped.
    Migrate {
        /// The store copied from.
        #[arg(long)]
        from: meta_server::migrate::StoreSpec,
        /// The store copied into; refused if it holds keys, unless --overwrite.
        #[arg(long)]
        to: meta_server::migrate::StoreSpec,
        /// Delete what the target holds first.
        #[arg(long)]
        overwrite: bool,
    },
    /// Start a local etcd cluster on 127.0.0.1 (free ports) with its data in a new
    /// directory under DIR, and leave it running: prints the directory, then one line
    /// per member, `NAME PID CLIENT_URL`. `tessera up --engine etcd` runs this.
    LocalEtcd {
        /// Number of members.
        #[arg(long, default_value_t = 3)]
        members: usize,
        /// Where the cluster's directory is made (default: /dev/shm, a tmpfs).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

/// The most members `local-etcd` starts (etcd advises at most 7 per cluster).
const MAX_LOCAL_ETCD_MEMBERS: usize = 7;

fn run_tool(tool: Tool) -> anyhow::Result<()> {
    match tool {
        Tool::Migrate {
            from,
            to,
            overwrite,
        } => {
            let report = meta_server::migrate::migrate(&from, &to, overwrite)?;
            println!("migrated {from} to {to}: {report}");
        }
        Tool::LocalEtcd { members, dir } => {
            use meta_server::kv::etcd::local::{default_base, LocalEtcd};
            if !(1..=MAX_LOCAL_ETCD_MEMBERS).contains(&members) {
                bail!("--members must be between 1 and {MAX_LOCAL_ETCD_MEMBERS}");
            }
            let base = dir.unwrap_or_else(default_base);
            std::fs::create_dir_all(&base).with_context(|| format!("creating {base:?}"))?;
            let etcd = LocalEtcd::start_in(members, &base, true).map_err(anyhow::Error::msg)?;
            println!("{}", etcd.dir().display());
            for m in etcd.detach() {
                println!("{} {} {}", m.name, m.pid, m.client_url);
            }
        }
    }
    Ok(())
}

fn load(args: &Args) -> anyhow::Result<MetaConfig> {
    let mut c: MetaConfig = match &args.config {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {p:?}"))?;
            toml::from_str(&text).with_context(|| format!("parsing {p:?}"))?
        }
        None => MetaConfig::default(),
    };
    if let Some(v) = &args.listen {
        c.listen = v.clone();
    }
    if let Some(v) = &args.data_dir {
        c.data_dir = v.clone();
    }
    if let Some(v) = &args.store {
        c.store = match StoreKind::from_name(v) {
            Some(kind) => kind,
            None => bail!("unknown store {v:?}: choose \"redb\", \"sled\" or \"etcd\""),
        };
    }
    if let Some(v) = &args.etcd {
        c.etcd.endpoints = v.clone();
    }
    if let Some(v) = &args.etcd_prefix {
        c.etcd.prefix = v.clone();
    }
    if let Some(v) = &args.addr_file {
        c.addr_file = v.clone();
    }
    if let Some(v) = &args.transport {
        c.transport = v.parse().map_err(anyhow::Error::msg)?;
    }
    if let Some(v) = args.replicas {
        c.namespace.replicas = v;
    }
    if let Some(v) = &args.key_file {
        c.key_file = v.clone();
    }
    if let Some(v) = &args.admin_key_file {
        c.admin_key_file = v.clone();
    }
    c.insecure |= args.insecure;
    if let Some(v) = &args.metrics_listen {
        c.metrics.listen = v.clone();
    }
    if let Some(v) = &args.metrics_addr_file {
        c.metrics.addr_file = v.clone();
    }
    if let Some(v) = args.etcd_owner_wait_ms {
        c.etcd.owner_wait_ms = v;
    }
    c.etcd.shared |= args.etcd_shared;
    // Resolve `auto` and check `rdma` now, so a host without RDMA gets one clear
    // sentence before anything starts.
    c.transport = c.transport.resolve_for_process(&c.transport_limits)?;
    c.validate().map_err(anyhow::Error::msg)?;
    Ok(c)
}

async fn run(config: MetaConfig) -> anyhow::Result<()> {
    let server = MetaServer::start(config.clone()).await?;
    if !config.addr_file.as_os_str().is_empty() {
        let path = &config.addr_file;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, server.local_addr().to_string())
            .with_context(|| format!("writing {tmp:?}"))?;
        std::fs::rename(&tmp, path).with_context(|| format!("renaming to {path:?}"))?;
    }
    // systemd (`Type=notify`): started once serving; nothing without NOTIFY_SOCKET.
    if let Err(e) = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]) {
        tracing::warn!(error = %e, "could not tell systemd the server is ready");
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        _ = server.owner_lost() => {
            server.shutdown();
            anyhow::bail!("lost the namespace's owner key (or, shared, this server's live \
                           key) on etcd: other metadata servers may have taken over what \
                           it held, so this one stops");
        }
    }
    tracing::info!("stopping");
    server.shutdown();
    // A stop in order logs everything answered before the store closes: no client
    // needs to send anything again to the next start, which then waits for nobody.
    let ns = server.namespace().clone();
    if let Err(e) = tokio::task::spawn_blocking(move || ns.forget_early_marks()).await {
        tracing::warn!(error = %e, "forgetting early-reply marks failed");
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
    let args = Args::try_parse().unwrap_or_else(|e| e.exit());
    if let Some(tool) = args.tool {
        if let Err(e) = run_tool(tool) {
            eprintln!("tessera-meta: {}", telemetry::errors::one_line(e.as_ref()));
            std::process::exit(1);
        }
        return;
    }
    let result = load(&args).and_then(|config| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("starting the runtime")?
            .block_on(run(config))
    });
    if let Err(e) = result {
        eprintln!("tessera-meta: {}", telemetry::errors::one_line(e.as_ref()));
        std::process::exit(1);
    }
}
