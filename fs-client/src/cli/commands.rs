//! The `tessera` command line: its arguments, and what each subcommand does. `main.rs`
//! only parses and reports; the work is here, where the library's types are.

use super::local_cluster::{self, UpOptions};
use super::top::MIN_INTERVAL_MS;
use crate::{Client, ClientConfig};
use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use telemetry::MetricsServer;

/// Data servers `tessera up` starts at most.
const MAX_UP_DATA_SERVERS: usize = 64;

/// Tessera: a distributed file system for AI clusters.
#[derive(Parser, Debug)]
#[command(version)]
pub struct Args {
    /// The subcommand.
    #[command(subcommand)]
    pub cmd: Cmd,
}

/// What `tessera` is asked to do; each variant's doc is its line in `tessera --help`.
#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Mount a cluster and serve the mount in the foreground until unmounted, SIGINT or
    /// SIGTERM.
    Mount {
        /// Where to mount.
        mountpoint: PathBuf,
        /// Client configuration file (TOML); flags override it.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Metadata server address (host:port), or several, comma-separated.
        #[arg(long)]
        meta: Option<String>,
        /// Transport backend: tcp, rdma, or auto (rdma when a device is usable, else tcp).
        #[arg(long)]
        transport: Option<String>,
        /// Mount even if the mount point holds files (hidden while mounted).
        #[arg(long)]
        nonempty: bool,
        /// Mount options, comma-separated: noatime, relatime (the default), strictatime;
        /// dev, suid (the mount is nodev,nosuid unless told); ro, noexec.
        #[arg(short = 'o')]
        options: Vec<String>,
        /// This client's key file (`key_file`), which names its client.
        #[arg(long)]
        key_file: Option<PathBuf>,
        /// The name the key was created under (`client_name`): checked against the key
        /// file's.
        #[arg(long)]
        client_name: Option<String>,
        /// Serve the mount's Prometheus metrics at http://ADDR/metrics (host:port);
        /// `metrics.listen`.
        #[arg(long)]
        metrics_listen: Option<String>,
        /// Write the metrics endpoint's bound address here; `metrics.addr_file`.
        #[arg(long)]
        metrics_addr_file: Option<PathBuf>,
    },
    /// Show the RDMA devices, ports, link layers and GIDs of this host, and the
    /// transport that `auto` would pick.
    TransportInfo {
        /// Client configuration file (TOML) whose `[transport_limits.rdma]` to apply.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Start a local cluster (one metadata server, data servers on 127.0.0.1) and mount
    /// it; returns once the mount is usable. On a running cluster, brings back the
    /// members that are missing, on their old addresses.
    Up {
        /// Where to mount.
        mountpoint: PathBuf,
        /// State directory (default: derived from the mount point).
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Number of data servers.
        #[arg(long, default_value_t = 3)]
        data_servers: usize,
        /// Metadata store engine: redb, sled, or etcd (3 local etcd members and 2
        /// metadata servers, one a standby; with --etcd, an etcd already running).
        #[arg(long, visible_alias = "engine")]
        store: Option<String>,
        /// With --store etcd: client URLs of a running etcd cluster (comma-separated).
        #[arg(long)]
        etcd: Option<String>,
        /// With --store etcd and no --etcd: where the local etcd members keep their data
        /// (default: /dev/shm, a tmpfs; `tessera down` removes it either way).
        #[arg(long, conflicts_with = "etcd")]
        etcd_dir: Option<PathBuf>,
        /// With --store etcd: both metadata servers serve the namespace at once
        /// (`tessera-meta --etcd-shared`) instead of one serving and one standing by.
        #[arg(long)]
        etcd_shared: bool,
        /// Copies of each chunk (1 to 8, capped by the data servers; default 3).
        #[arg(long)]
        replicas: Option<u8>,
        /// Mount even if the mount point holds files (hidden while mounted).
        #[arg(long)]
        nonempty: bool,
    },
    /// Show the data servers, the chains and their members' states, the number of
    /// under-replicated chunks and the resyncs under way.
    Status {
        /// The cluster asked.
        #[command(flatten)]
        cluster: ClusterArgs,
        /// Refresh every second until no chunk is under-replicated (or --timeout).
        #[arg(long)]
        watch: bool,
        /// Seconds `--watch` waits at most.
        #[arg(long, default_value_t = 3600)]
        timeout: u64,
        /// Print the status once as JSON (the map, chains, replication and resyncs).
        #[arg(long, conflicts_with = "watch")]
        json: bool,
    },
    /// Watch mounts and servers live from their metrics endpoints: requests per second
    /// by type, bytes per second, latency percentiles, CPU and memory of each.
    Top {
        /// Mount point of a cluster started by `tessera up`: every member's endpoint.
        mountpoint: Option<PathBuf>,
        /// State directory of a cluster started by `tessera up`.
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// A metrics endpoint to watch (host:port of `metrics.listen`); repeatable.
        #[arg(long = "endpoint")]
        endpoints: Vec<String>,
        /// Show one interval, then exit.
        #[arg(long)]
        once: bool,
        /// Print each interval as JSON.
        #[arg(long)]
        json: bool,
        /// Milliseconds between refreshes.
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
    },
    /// Check the namespace and every chunk copy (present, checksums valid, same version
    /// on every replica); exits 1 if anything is wrong.
    Fsck {
        /// The cluster asked.
        #[command(flatten)]
        cluster: ClusterArgs,
        /// Replace each bad copy by a good one.
        #[arg(long)]
        repair: bool,
    },
    /// Create, list or revoke client keys (needs an administrator's key).
    Key {
        /// What to do.
        #[command(subcommand)]
        action: KeyCmd,
    },
    /// Unmount and stop everything `tessera up` started for a mount point.
    Down {
        /// The mount point given to `up`; with --state-dir it may be left out (the
        /// state directory records it).
        #[arg(required_unless_present = "state_dir")]
        mountpoint: Option<PathBuf>,
        /// State directory, if `up` was given one.
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Also forget the state directory `up --state-dir` recorded for the mount point
        /// (under /var/lib/tessera, or ~/.local/state/tessera): for a state directory
        /// about to be deleted (a script's temporary cluster). Done once everything
        /// stopped, or nothing was running, and only if the record names --state-dir
        /// when it is given; the state directory itself is left as it is.
        #[arg(long)]
        forget: bool,
    },
}

/// `tessera key ...`.
#[derive(Subcommand, Debug)]
pub enum KeyCmd {
    /// Make a client key, derived here from the cluster key (it never travels: the
    /// metadata server is told its name, id and capabilities); prints the key file's
    /// line, or writes it to --out (mode 0600). A name that holds a valid key is
    /// refused unless --replace.
    Create {
        /// The client's name: letters, digits, '.', '_', '-'.
        name: String,
        /// The directory the client sees as its root.
        #[arg(long, default_value = "/")]
        path: String,
        /// Every change fails with EROFS.
        #[arg(long)]
        read_only: bool,
        /// Do not map uid/gid 0 to nobody (squashed by default unless --admin).
        #[arg(long)]
        no_root_squash: bool,
        /// May manage keys and run status and fsck.
        #[arg(long)]
        admin: bool,
        /// Replace the name's valid key (a rotation): the previous one is revoked.
        #[arg(long)]
        replace: bool,
        /// Write the key to this new file (mode 0600) instead of printing it.
        #[arg(long)]
        out: Option<PathBuf>,
        /// The cluster key file to derive the key from (default: the one `tessera up`
        /// keeps beside the administrator's key in the cluster's state directory).
        #[arg(long)]
        cluster_key_file: Option<PathBuf>,
        /// The cluster asked.
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// List the client keys (names, capabilities, revoked), never the keys.
    List {
        /// The cluster asked.
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Revoke a client key: refused from now on, its connections closed.
    Revoke {
        /// The client's name.
        name: String,
        /// The cluster asked.
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

impl KeyCmd {
    /// Takes out the cluster the command asks.
    fn cluster(&mut self) -> ClusterArgs {
        let c = match self {
            KeyCmd::Create { cluster, .. }
            | KeyCmd::List { cluster }
            | KeyCmd::Revoke { cluster, .. } => cluster,
        };
        std::mem::take(c)
    }
}

/// Which cluster `status` and `fsck` talk to.
#[derive(clap::Args, Debug, Default)]
pub struct ClusterArgs {
    /// Mount point of a cluster started by `tessera up`: its metadata address.
    mountpoint: Option<PathBuf>,
    /// State directory of a cluster started by `tessera up`.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Metadata server address (host:port), or several, comma-separated.
    #[arg(long)]
    meta: Option<String>,
    /// Client configuration file (TOML).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The key file to authenticate with (default: the configuration's, else the
    /// administrator's key of a cluster `tessera up` started).
    #[arg(long)]
    key_file: Option<PathBuf>,
}

impl ClusterArgs {
    /// The client configuration that reaches the named cluster, and its state directory
    /// if one was named.
    fn client_config(self) -> anyhow::Result<(ClientConfig, Option<PathBuf>)> {
        let (meta, state) = local_cluster::meta_of(self.mountpoint, self.state_dir, self.meta)?;
        let mut c = client_config(&self.config, &meta, &None)?;
        if let Some(k) = self.key_file {
            c.key_file = k;
        } else if let Some(s) = state.as_ref().filter(|_| c.key_file.as_os_str().is_empty()) {
            let admin = local_cluster::state::admin_key_file(s);
            if admin.exists() {
                c.key_file = admin;
            }
        }
        Ok((c, state))
    }
}

/// The client configuration: the file at `path` (or the defaults), then the flags.
pub fn client_config(
    path: &Option<PathBuf>,
    meta: &Option<String>,
    transport: &Option<String>,
) -> anyhow::Result<ClientConfig> {
    let mut c: ClientConfig = match path {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {p:?}"))?;
            toml::from_str(&text).with_context(|| format!("parsing {p:?}"))?
        }
        None => ClientConfig::default(),
    };
    if let Some(m) = meta {
        c.meta_addr = m.clone();
    }
    if let Some(t) = transport {
        c.transport = t.parse().map_err(anyhow::Error::msg)?;
    }
    c.validate()
        .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
    Ok(c)
}

/// Connects, mounts and serves until unmounted. `mounted` runs once the mount is in
/// place; systemd (a `Type=notify` unit) is told then too.
pub fn mount(
    mountpoint: PathBuf,
    config: ClientConfig,
    mounted: impl FnOnce(),
) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let (meta, metrics) = (config.meta_addr.clone(), config.metrics.clone());
    let client = rt
        .block_on(Client::connect(config))
        .with_context(|| format!("connecting to the metadata server at {meta}"))?;
    // Serves until the mount ends (dropped on return).
    let _endpoint = rt
        .block_on(MetricsServer::from_config(
            &metrics,
            client.metrics().registry().clone(),
        ))
        .context("starting the metrics endpoint")?;
    let ready = || {
        notify_ready();
        mounted();
    };
    crate::fuse::mount_and_serve(client, &mountpoint, &rt, ready)
        .with_context(|| format!("mounting {}", mountpoint.display()))?;
    Ok(())
}

/// Tells systemd the service is ready, when it runs under a `Type=notify` unit
/// (`NOTIFY_SOCKET` set); a no-op elsewhere.
pub fn notify_ready() {
    if let Err(e) = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]) {
        tracing::warn!(error = %e, "could not tell systemd the service is ready");
    }
}

/// Runs `f` with a client on a new runtime.
fn with_client<T, F, Fut>(config: ClientConfig, f: F) -> anyhow::Result<T>
where
    F: FnOnce(std::sync::Arc<Client>) -> Fut,
    Fut: std::future::Future<Output = crate::Result<T>>,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let meta = config.meta_addr.clone();
    rt.block_on(async move {
        let client = Client::connect(config)
            .await
            .with_context(|| format!("connecting to the metadata server at {meta}"))?;
        Ok(f(client).await?)
    })
}

/// Prints the status once, or until nothing is under-replicated with `watch`; on a
/// terminal the progress bar is redrawn in place.
async fn status(
    client: &Client,
    watch: bool,
    timeout: u64,
    names: &[(String, String)],
) -> crate::Result<()> {
    use std::io::IsTerminal;
    let tty = std::io::stdout().is_terminal();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(timeout);
    let mut last_lines = 0;
    loop {
        let s = client.status().await?;
        let text = super::admin::render_status(&s, watch || tty, names);
        if tty && last_lines > 0 {
            // Move up over the previous report and clear it.
            print!("\x1b[{last_lines}A\x1b[J");
        }
        print!("{text}");
        last_lines = text.lines().count();
        if !watch || s.under_replicated_chunks == 0 || std::time::Instant::now() >= deadline {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// Runs one subcommand to its end.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.cmd {
        Cmd::Mount {
            mountpoint,
            config,
            meta,
            transport,
            nonempty,
            options,
            key_file,
            client_name,
            metrics_listen,
            metrics_addr_file,
        } => {
            local_cluster::check_mountpoint(&mountpoint, nonempty)?;
            let mut c = client_config(&config, &meta, &transport)?;
            c.key_file = key_file.unwrap_or(c.key_file);
            c.client_name = client_name.unwrap_or(c.client_name);
            c.metrics.listen = metrics_listen.unwrap_or(c.metrics.listen);
            c.metrics.addr_file = metrics_addr_file.unwrap_or(c.metrics.addr_file);
            c.validate().map_err(anyhow::Error::msg)?;
            for o in &options {
                c.apply_mount_options(o).map_err(anyhow::Error::msg)?;
            }
            // Resolve `auto` and check `rdma` before mounting: one clear sentence on a
            // host without RDMA.
            c.transport = c.transport.resolve_for_process(&c.transport_limits)?;
            mount(mountpoint, c, || {})
        }
        Cmd::TransportInfo { config } => {
            let c = client_config(&config, &None, &None)?;
            print!("{}", transport::info::report(&c.transport_limits));
            Ok(())
        }
        Cmd::Up {
            mountpoint,
            state_dir,
            data_servers,
            store,
            etcd,
            etcd_dir,
            etcd_shared,
            replicas,
            nonempty,
        } => {
            if !(1..=MAX_UP_DATA_SERVERS).contains(&data_servers) {
                bail!("--data-servers must be between 1 and {MAX_UP_DATA_SERVERS}");
            }
            let etcd_only = etcd.is_some() || etcd_dir.is_some() || etcd_shared;
            if etcd_only && store.as_deref() != Some("etcd") {
                bail!("--etcd, --etcd-dir and --etcd-shared go with --store etcd (--engine etcd)");
            }
            let opts = UpOptions {
                mountpoint,
                state_dir,
                data_servers,
                store,
                etcd,
                etcd_dir,
                etcd_shared,
                bin_dir: None,
                replicas,
                nonempty,
            };
            print!("{}", local_cluster::up(&opts)?);
            Ok(())
        }
        Cmd::Status {
            cluster,
            json: true,
            ..
        } => {
            let (c, _) = cluster.client_config()?;
            let s = with_client(c, |client| async move { client.status().await })?;
            println!("{}", serde_json::to_string_pretty(&s)?);
            Ok(())
        }
        Cmd::Top {
            mountpoint,
            state_dir,
            mut endpoints,
            once,
            json,
            interval_ms,
        } => {
            if let Some(state) = local_cluster::state_of(mountpoint, state_dir) {
                let recorded = local_cluster::state::metrics_addrs(&state);
                endpoints.extend(recorded.into_iter().map(|(_, addr)| addr));
            }
            let interval = std::time::Duration::from_millis(interval_ms.max(MIN_INTERVAL_MS));
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the runtime")?;
            rt.block_on(super::top::run(endpoints, interval, once, json))
        }
        Cmd::Status {
            cluster,
            watch,
            timeout,
            json: false,
        } => {
            let (c, state) = cluster.client_config()?;
            // On etcd: its members, and which metadata server serves.
            if let Some(etcd) = state.as_deref().and_then(local_cluster::etcd::describe) {
                print!("{etcd}");
            }
            let names = state
                .map(|s| local_cluster::state::data_names(&s))
                .unwrap_or_default();
            with_client(c, |client| async move {
                status(&client, watch, timeout, &names).await
            })
        }
        Cmd::Fsck { cluster, repair } => {
            let (c, _) = cluster.client_config()?;
            if !with_client(c, |client| async move { fsck(&client, repair).await })? {
                std::process::exit(1);
            }
            Ok(())
        }
        Cmd::Key { mut action } => {
            let (c, state) = action.cluster().client_config()?;
            // The cluster key `tessera up` keeps, or one beside the key file used.
            let state_key = state.map(|s| local_cluster::state::cluster_key_file(&s));
            let beside = c.key_file.parent().map(|d| d.join("cluster.key"));
            let cluster_key = state_key.into_iter().chain(beside).find(|p| p.exists());
            with_client(c, |client| async move {
                super::keys::run(&client, action, cluster_key).await
            })
        }
        Cmd::Down {
            mountpoint,
            state_dir,
            forget,
        } => {
            // Clap asks for one of the two; the state directory names the mount point.
            let mountpoint = match mountpoint {
                Some(m) => m,
                None => {
                    let s = state_dir.as_deref().unwrap_or(Path::new("."));
                    local_cluster::state::recorded_mountpoint(s).ok_or_else(|| {
                        local_cluster::ClusterError::Other(format!(
                            "{} records no mount point (no `tessera up` ran with it): \
                             name the mount point",
                            s.display()
                        ))
                    })?
                }
            };
            let down = local_cluster::down(&mountpoint, state_dir.as_deref());
            // Not while something may still run (a member that did not stop, a failed
            // unmount): the record is how a later `down` finds it.
            let stopped = matches!(
                &down,
                Ok(_) | Err(local_cluster::ClusterError::NothingRunning { .. })
            );
            if forget && stopped {
                if let Err(e) =
                    local_cluster::forget_recorded_state(&mountpoint, state_dir.as_deref())
                {
                    eprintln!("tessera down: {e}");
                }
            }
            print!("{}", down?);
            Ok(())
        }
    }
}

/// Checks every file and copy, prints what is wrong and a summary; true when clean.
async fn fsck(client: &Client, repair: bool) -> crate::Result<bool> {
    let report = client.fsck(repair).await?;
    for p in &report.problems {
        println!("{p}");
    }
    println!(
        "fsck: {} files, {} chunk copies checked, {} problems, {} copies repaired",
        report.files,
        report.copies,
        report.problems.len(),
        report.repaired
    );
    Ok(report.clean())
}
