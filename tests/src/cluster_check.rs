//! The cluster check: `tessera-meta`, three `tessera-data` processes and a client (the
//! `Client` API, no FUSE) over one transport: `tcp` on the host, `rdma` inside the
//! soft-RoCE VM of `scripts/rdma-vm.sh`. It writes a file of pseudo-random bytes, reads
//! it back, then reads it again while one data server is killed with SIGKILL, and checks
//! both reads' sha256 against the written bytes'. The `cluster-check` binary runs it; a
//! test runs it over tcp with a smaller file.

use crate::process::{ClusterOptions, ProcessCluster};
use anyhow::{bail, ensure, Context, Result};
use fs_client::{Client, ClientConfig};
use proto::meta::Caller;
use proto::InodeId;
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Bytes of one write call and of one read call.
pub const IO_BYTES: usize = 8 << 20;
/// How long the cluster may take to have every chain whole after its start.
const HEALTHY_LIMIT: Duration = Duration::from_secs(120);
/// How long one pass over the file (write, read) may take: soft-RoCE in an emulated
/// VM moves a few MiB/s, so this is far above 256 MiB at that rate.
const PASS_LIMIT: Duration = Duration::from_secs(900);
/// The file's name in the root directory.
const NAME: &[u8] = b"cluster-check.bin";
const ROOT_CALLER: Caller = Caller::ROOT;
const MIB: f64 = (1u64 << 20) as f64;

/// What to run.
#[derive(Clone, Debug)]
pub struct CheckOptions {
    /// Transport of every server and of the client (`tcp`, `rdma`).
    pub transport: String,
    /// Address the servers listen on (an IP address, no port).
    pub host: String,
    /// Size of the file, in bytes.
    pub size_bytes: u64,
    /// Where `tessera-meta` and `tessera-data` are; `None`: the workspace's target
    /// directory.
    pub bin_dir: Option<PathBuf>,
    /// The data server (0, 1 or 2) killed during the second read.
    pub victim: usize,
    /// Seed of the file's bytes.
    pub seed: u64,
}

/// What a passed check measured.
#[derive(Clone, Debug)]
pub struct Report {
    /// sha256 of the bytes written.
    pub written: String,
    /// Write throughput (writes, fsync and close), in MiB/s.
    pub write_mib_s: f64,
    /// Read throughput of the first read, in MiB/s.
    pub read_mib_s: f64,
    /// Read throughput of the read during which a data server was killed, in MiB/s.
    pub failover_mib_s: f64,
    /// Reads the client tried again on another member during that read.
    pub retries: u64,
}

/// Starts the cluster, runs the check, stops every process it started (also when the
/// check fails or panics: `ProcessCluster` stops them when dropped).
pub async fn run(opts: CheckOptions) -> Result<Report> {
    ensure!(opts.victim < 3, "the victim is data server 0, 1 or 2");
    ensure!(
        opts.size_bytes >= 4 * IO_BYTES as u64,
        "the file must span at least four reads, so that the kill lands mid-read"
    );
    let started = Instant::now();
    let mut cluster = ProcessCluster::start_with(ClusterOptions {
        data_servers: 3,
        host: opts.host.clone(),
        transport: Some(opts.transport.clone()),
        bin_dir: opts.bin_dir.clone(),
        ..ClusterOptions::default()
    });
    println!(
        "cluster up over {} on {} in {:.1} s (meta at {})",
        opts.transport,
        opts.host,
        started.elapsed().as_secs_f64(),
        cluster.meta_addr()
    );
    let result = check(&mut cluster, &opts).await;
    if result.is_err() {
        cluster.print_log_tails(40);
    }
    result
}

async fn check(cluster: &mut ProcessCluster, opts: &CheckOptions) -> Result<Report> {
    let c = connect(cluster, &opts.transport).await?;
    wait_healthy(&c).await?;
    let t = Instant::now();
    let written = write_file(&c, opts.size_bytes, opts.seed).await?;
    let write_mib_s = rate(opts.size_bytes, t.elapsed());
    println!(
        "wrote {}: sha256 {written} ({write_mib_s:.1} MiB/s)",
        size(opts)
    );

    let t = Instant::now();
    let (tx, _rx) = watch::channel(0);
    let back = read_file(&c, opts.size_bytes, &tx).await?;
    let read_mib_s = rate(opts.size_bytes, t.elapsed());
    println!(
        "read {}:  sha256 {back} ({read_mib_s:.1} MiB/s)",
        size(opts)
    );
    ensure!(
        back == written,
        "the read returned other bytes than written"
    );

    // The same into memory lent to the transport (the library's whole-file reads): over
    // rdma the NIC writes into a `Vec` the client pinned for the read.
    let (lent, took) = read_file_lent(&c, opts.size_bytes).await?;
    println!(
        "read {} into lent memory: sha256 {lent} ({:.1} MiB/s, the read alone)",
        size(opts),
        rate(opts.size_bytes, took)
    );
    ensure!(
        lent == written,
        "the read into lent memory returned other bytes than written"
    );

    let before = c.rpc_counts().retries;
    let t = Instant::now();
    let again = read_killing(cluster, &c, opts).await?;
    let failover_mib_s = rate(opts.size_bytes, t.elapsed());
    let retries = c.rpc_counts().retries - before;
    println!(
        "read {} with data server {} killed: sha256 {again} ({failover_mib_s:.1} MiB/s, \
         {retries} reads retried on another member)",
        size(opts),
        opts.victim
    );
    ensure!(
        again == written,
        "the read during the kill returned other bytes"
    );
    // Without a retry, no read reached the dead server: the failover was not tested.
    ensure!(retries > 0, "no read was retried after the kill");
    Ok(Report {
        written,
        write_mib_s,
        read_mib_s,
        failover_mib_s,
        retries,
    })
}

fn size(opts: &CheckOptions) -> String {
    format!("{} MiB", opts.size_bytes >> 20)
}

fn rate(bytes: u64, took: Duration) -> f64 {
    bytes as f64 / MIB / took.as_secs_f64().max(1e-9)
}

async fn connect(cluster: &ProcessCluster, transport: &str) -> Result<Arc<Client>> {
    let mut config = ClientConfig {
        ..cluster.client_config()
    };
    config.transport = transport
        .parse::<transport::Backend>()
        .map_err(anyhow::Error::msg)?
        .resolve_for_process(&config.transport_limits)?;
    Client::connect(config).await.context("client connects")
}

/// Waits until every chain has all its members serving.
async fn wait_healthy(c: &Client) -> Result<()> {
    let deadline = Instant::now() + HEALTHY_LIMIT;
    loop {
        let map = c.cluster_map().await.context("cluster map")?;
        if crate::healthy(&map) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("cluster not healthy in {HEALTHY_LIMIT:?}: {map:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The bytes of the file at read number `i` (each read's bytes have their own seed, so
/// no pass holds the whole file in memory).
fn piece(i: u64, len: usize, seed: u64) -> Vec<u8> {
    crate::pseudo_random(len, seed ^ i.wrapping_mul(0x9E37_79B9))
}

fn pieces(size_bytes: u64) -> impl Iterator<Item = (u64, u64, usize)> {
    (0..size_bytes.div_ceil(IO_BYTES as u64)).map(move |i| {
        let off = i * IO_BYTES as u64;
        (i, off, (size_bytes - off).min(IO_BYTES as u64) as usize)
    })
}

fn hex(h: Sha256) -> String {
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Creates the file, writes it, fsyncs and closes it; returns the bytes' sha256.
async fn write_file(c: &Client, size_bytes: u64, seed: u64) -> Result<String> {
    let (_, fh) = c
        .create(InodeId::ROOT, NAME, 0o644, ROOT_CALLER, true, false)
        .await
        .context("create")?;
    let mut h = Sha256::new();
    let work = async {
        for (i, off, len) in pieces(size_bytes) {
            let data = piece(i, len, seed);
            h.update(&data);
            let n = c.write(&fh, off, &data).await.context("write")?;
            ensure!(n == len, "a write at {off} took {n} of {len} bytes");
        }
        c.fsync(&fh).await.context("fsync")
    };
    let written = tokio::time::timeout(PASS_LIMIT, work).await;
    c.release(&fh).await.context("close")?;
    written.context("the write did not finish in time")??;
    Ok(hex(h))
}

/// Reads the whole file, telling `progress` the bytes read so far; returns their sha256.
async fn read_file(c: &Client, size_bytes: u64, progress: &watch::Sender<u64>) -> Result<String> {
    let attr = c.lookup(InodeId::ROOT, NAME).await.context("lookup")?;
    ensure!(attr.size == size_bytes, "the file is {} bytes", attr.size);
    let (_, fh) = c.open(attr.ino, false).await.context("open")?;
    let mut h = Sha256::new();
    let work = async {
        for (_, off, len) in pieces(size_bytes) {
            let data = c.read(&fh, off, len).await.context("read")?;
            ensure!(
                data.len() == len,
                "a read at {off} got {} bytes",
                data.len()
            );
            h.update(&data);
            progress.send_replace(off + len as u64);
        }
        Ok(())
    };
    let read = tokio::time::timeout(PASS_LIMIT, work).await;
    c.release(&fh).await.context("close")?;
    read.context("the read did not finish in time")??;
    Ok(hex(h))
}

/// Reads the whole file into a buffer lent to the client's endpoint
/// (`Client::read_into_region`) and takes the buffer back; returns the bytes' sha256 and
/// how long the read took (not the buffer's first touch: its pages are set before).
async fn read_file_lent(c: &Client, size_bytes: u64) -> Result<(String, Duration)> {
    let attr = c.lookup(InodeId::ROOT, NAME).await.context("lookup")?;
    let (_, fh) = c.open(attr.ino, false).await.context("open")?;
    let len = usize::try_from(size_bytes)?;
    let mr = match c.endpoint().lend(vec![0xa5u8; len]) {
        Ok(mr) => mr,
        Err((e, _)) => bail!("lending {len} bytes: {e}"),
    };
    let t = Instant::now();
    let read = tokio::time::timeout(PASS_LIMIT, c.read_into_region(&fh, &mr, 0)).await;
    let took = t.elapsed();
    c.release(&fh).await.context("close")?;
    let n = read.context("the read did not finish in time")??;
    ensure!(
        n == Some(len),
        "the read into lent memory gave {n:?} of {len} bytes"
    );
    let Ok(back) = mr.reclaim::<Vec<u8>>() else {
        bail!("the transport still held the lent memory after the read");
    };
    Ok((hex(Sha256::new_with_prefix(&back)), took))
}

/// Reads the whole file again and kills the victim once a quarter of it is read, while
/// the reads go on; returns the bytes' sha256.
async fn read_killing(
    cluster: &mut ProcessCluster,
    c: &Arc<Client>,
    opts: &CheckOptions,
) -> Result<String> {
    let (tx, mut rx) = watch::channel(0);
    let reader = {
        let (c, size) = (c.clone(), opts.size_bytes);
        tokio::spawn(async move { read_file(&c, size, &tx).await })
    };
    let kill_at = opts.size_bytes / 4;
    // Ends with an error when the reader is gone (it failed or read everything).
    let reached = rx.wait_for(|&done| done >= kill_at).await.map(|d| *d);
    let at = match reached {
        Ok(at) if at < opts.size_bytes => at,
        _ => {
            let r = reader.await.context("the reader panicked")?;
            bail!("the read ended before the kill: {r:?}");
        }
    };
    let t = Instant::now();
    cluster.kill_data(opts.victim);
    println!(
        "killed data server {} (SIGKILL) after {} MiB of the read",
        opts.victim,
        at >> 20
    );
    let sum = reader.await.context("the reader panicked")??;
    println!(
        "the read finished {:.1} s after the kill",
        t.elapsed().as_secs_f64()
    );
    Ok(sum)
}
