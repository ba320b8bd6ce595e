//! `transport-bench`: latency of two-sided calls and bandwidth of one-sided reads and
//! writes on one backend, printed as a table.
//!
//! ```text
//! transport-bench [--backend tcp|mem|rdma|auto] [--inflight N] [--secs S]
//!                 [--threads T] [--rows calls|bulk|all] [--serve ADDR | --connect ADDR]
//! ```
//! `--threads` sets the tokio worker threads of each process (default: one per core;
//! 1 runs a single-threaded runtime, as a latency-bound client may).
//! Without `--serve`/`--connect` the server is a child process on 127.0.0.1 (port 0), as
//! servers and clients are separate processes in a cluster (`mem` runs in-process).
//! On `tcp` a plain TCP ping-pong of 64 bytes (blocking sockets, no framing) is measured
//! too, as the floor a call's round trip is compared with.

use bytes::Bytes;
use parking_lot::Mutex;
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};
use transport::{
    Access, Backend, Connection, Endpoint, Grant, Handler, HandlerFuture, MemoryRegion, MrKey,
    RemoteBuf, TransportConfig,
};

const APP: u16 = 0xbe;
/// Largest one-sided transfer measured; the server's region is this large.
const MAX_BULK_BYTES: usize = 16 << 20;
const CALL_SIZES: [usize; 6] = [64, 256, 1024, 4096, 16384, 65536];
const BULK_SIZES: [usize; 5] = [4096, 65536, 1 << 20, 4 << 20, 16 << 20];
/// Untimed calls before each latency row (the same for the plain ping-pong).
const WARM_UP: Duration = Duration::from_millis(250);
/// Most calls timed per size (bounds a run when calls are fast).
const MAX_SAMPLES: usize = 200_000;

struct Opts {
    backend: Backend,
    inflight: usize,
    secs: f64,
    threads: usize,
    /// Which tables: calls, bulk or all.
    rows: String,
    serve: Option<String>,
    connect: Option<String>,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        backend: Backend::Tcp,
        inflight: 8,
        secs: 1.0,
        threads: 0,
        rows: "all".into(),
        serve: None,
        connect: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--backend" => o.backend = val()?.parse()?,
            "--inflight" => o.inflight = val()?.parse().map_err(|e| format!("--inflight: {e}"))?,
            "--secs" => o.secs = val()?.parse().map_err(|e| format!("--secs: {e}"))?,
            "--threads" => o.threads = val()?.parse().map_err(|e| format!("--threads: {e}"))?,
            "--rows" => o.rows = val()?,
            "--serve" => o.serve = Some(val()?),
            "--connect" => o.connect = Some(val()?),
            "-h" | "--help" => return Err("usage: see the top of transport-bench.rs".into()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if !(1..=64).contains(&o.inflight) || !(0.05..=60.0).contains(&o.secs) || o.threads > 64 {
        return Err("--inflight must be 1 to 64, --secs 0.05 to 60, --threads 0 to 64".into());
    }
    Ok(o)
}

/// Echoes calls; a call starting with byte 0xff asks for a grant of the whole region.
struct Bench {
    region: MemoryRegion,
    grants: Mutex<Vec<Grant>>,
}

impl Handler for Bench {
    fn handle(&self, conn: Connection, req: Bytes) -> HandlerFuture {
        if req.first() != Some(&0xff) {
            return Box::pin(async move { req });
        }
        let reply = match conn.grant(&self.region, 0, MAX_BULK_BYTES, Access::RemoteReadWrite) {
            Ok(g) => {
                let r = g.remote();
                self.grants.lock().push(g);
                let mut v = r.addr.to_le_bytes().to_vec();
                v.extend_from_slice(&r.len.to_le_bytes());
                v.extend_from_slice(&r.key.0.to_le_bytes());
                Bytes::from(v)
            }
            Err(e) => Bytes::from(format!("err {e}")),
        };
        Box::pin(async move { reply })
    }
}

fn config() -> TransportConfig {
    TransportConfig {
        max_one_sided_bytes: MAX_BULK_BYTES,
        ..TransportConfig::default()
    }
}

async fn serve(ep: &Endpoint, addr: &str) -> Result<transport::Listener, String> {
    let region = ep.register(MAX_BULK_BYTES).map_err(|e| e.to_string())?;
    let bench = Bench {
        region,
        grants: Mutex::new(Vec::new()),
    };
    ep.listen(addr, Arc::new(bench))
        .await
        .map_err(|e| e.to_string())
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

async fn call_latency(conn: &Connection, size: usize, secs: f64) -> Result<Vec<Duration>, String> {
    let msg = Bytes::from(vec![7u8; size]);
    // Untimed warm-up: the first row would otherwise also time the runtimes' threads
    // waking from their idle parking and cold caches on both sides.
    let warm = Instant::now() + WARM_UP;
    while Instant::now() < warm {
        conn.call(msg.clone()).await.map_err(|e| e.to_string())?;
    }
    let mut samples = Vec::new();
    let end = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < end && samples.len() < MAX_SAMPLES {
        let t = Instant::now();
        let r = conn.call(msg.clone()).await.map_err(|e| e.to_string())?;
        samples.push(t.elapsed());
        if r.len() != size {
            return Err(format!("echo of {size} bytes came back as {}", r.len()));
        }
    }
    samples.sort();
    Ok(samples)
}

/// Bytes per second of one-sided `op`s of `size` with `inflight` in flight.
async fn bandwidth(
    conn: &Connection,
    local: &MemoryRegion,
    remote: RemoteBuf,
    op: Access,
    size: usize,
    inflight: usize,
    secs: f64,
) -> Result<f64, String> {
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    let slots = (MAX_BULK_BYTES / size).max(1);
    for i in 0..inflight {
        let (conn, local) = (conn.clone(), local.clone());
        let slot = (i % slots) * size;
        let r = RemoteBuf {
            addr: remote.addr + slot as u64,
            len: size as u64,
            key: remote.key,
        };
        tasks.push(tokio::spawn(async move {
            let mut bytes = 0u64;
            while Instant::now() < end {
                match op {
                    Access::RemoteRead => conn.read(r, &local, slot).await,
                    _ => conn.write(r, &local, slot).await,
                }
                .map_err(|e| e.to_string())?;
                bytes += size as u64;
            }
            Ok::<u64, String>(bytes)
        }));
    }
    let mut total = 0u64;
    for t in tasks {
        total += t.await.map_err(|e| e.to_string())??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// Round trips of 64 bytes over a plain TCP connection on loopback: the floor.
fn plain_pingpong(secs: f64) -> std::io::Result<Vec<Duration>> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = l.accept()?;
        s.set_nodelay(true)?;
        let mut b = [0u8; 64];
        while s.read_exact(&mut b).is_ok() {
            s.write_all(&b)?;
        }
        Ok(())
    });
    let mut c = std::net::TcpStream::connect(addr)?;
    c.set_nodelay(true)?;
    let mut b = [7u8; 64];
    let warm = Instant::now() + WARM_UP;
    while Instant::now() < warm {
        c.write_all(&b)?;
        c.read_exact(&mut b)?;
    }
    let mut samples = Vec::new();
    let end = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < end && samples.len() < MAX_SAMPLES {
        let t = Instant::now();
        c.write_all(&b)?;
        c.read_exact(&mut b)?;
        samples.push(t.elapsed());
    }
    drop(c);
    let _ = echo.join();
    samples.sort();
    Ok(samples)
}

fn human(size: usize) -> String {
    match size {
        s if s >= 1 << 20 => format!("{} MiB", s >> 20),
        s if s >= 1024 => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

async fn run_client(o: &Opts, ep: &Endpoint, addr: &str) -> Result<(), String> {
    let conn = ep.connect(addr).await.map_err(|e| e.to_string())?;
    let threads = match o.threads {
        0 => "one per core".to_string(),
        n => n.to_string(),
    };
    println!(
        "transport-bench: backend {}, peer {addr}, runtime threads per process: {threads}",
        ep.backend()
    );
    if o.rows != "bulk" {
        calls(o, &conn, ep.backend()).await?;
    }
    if o.rows != "calls" {
        bulk(o, ep, &conn).await?;
    }
    Ok(())
}

async fn calls(o: &Opts, conn: &Connection, backend: Backend) -> Result<(), String> {
    println!("\ntwo-sided calls (echo, one in flight)");
    println!(
        "{:>8}  {:>10}  {:>10}  {:>10}",
        "size", "median us", "p99 us", "calls/s"
    );
    for size in CALL_SIZES {
        let s = call_latency(conn, size, o.secs).await?;
        let rate = s.len() as f64 / s.iter().map(Duration::as_secs_f64).sum::<f64>();
        let (p50, p99) = (percentile(&s, 0.5), percentile(&s, 0.99));
        println!("{:>8}  {p50:>10.1}  {p99:>10.1}  {rate:>10.0}", human(size));
    }
    if backend == Backend::Tcp {
        let s = plain_pingpong(o.secs).map_err(|e| e.to_string())?;
        let (p50, p99) = (percentile(&s, 0.5), percentile(&s, 0.99));
        println!(
            "{:>8}  {p50:>10.1}  {p99:>10.1}  (plain TCP ping-pong)",
            "64 B"
        );
    }
    Ok(())
}

/// Asks the server for a grant of its region, then measures reads and writes into it.
async fn bulk(o: &Opts, ep: &Endpoint, conn: &Connection) -> Result<(), String> {
    let r = conn
        .call(Bytes::from_static(&[0xff]))
        .await
        .map_err(|e| e.to_string())?;
    if r.len() != 20 {
        return Err(format!("no grant: {}", String::from_utf8_lossy(&r)));
    }
    let remote = RemoteBuf {
        addr: u64::from_le_bytes(r[0..8].try_into().expect("8 bytes")),
        len: u64::from_le_bytes(r[8..16].try_into().expect("8 bytes")),
        key: MrKey(u32::from_le_bytes(r[16..20].try_into().expect("4 bytes"))),
    };
    let local = ep.register(MAX_BULK_BYTES).map_err(|e| e.to_string())?;
    println!("\none-sided ({} in flight)", o.inflight);
    println!("{:>8}  {:>12}  {:>12}", "size", "read MiB/s", "write MiB/s");
    for size in BULK_SIZES {
        let n = o.inflight;
        let rd = bandwidth(conn, &local, remote, Access::RemoteRead, size, n, o.secs).await?;
        let wr = bandwidth(conn, &local, remote, Access::RemoteWrite, size, n, o.secs).await?;
        let mib = |b: f64| b / (1 << 20) as f64;
        println!("{:>8}  {:>12.0}  {:>12.0}", human(size), mib(rd), mib(wr));
    }
    Ok(())
}

async fn run(o: Opts) -> Result<(), String> {
    let ep = Endpoint::new(o.backend, config(), APP).map_err(|e| e.to_string())?;
    if let Some(addr) = &o.serve {
        let l = serve(&ep, addr).await?;
        println!(
            "serving on {} ({}); stop with Ctrl-C",
            l.local_addr(),
            ep.backend()
        );
        let _ = tokio::signal::ctrl_c().await;
        return Ok(());
    }
    match (&o.connect, ep.backend()) {
        (Some(addr), _) => run_client(&o, &ep, addr).await,
        (None, Backend::Mem) => {
            let l = serve(&ep, "127.0.0.1:0").await?;
            run_client(&o, &ep, &l.local_addr().to_string()).await
        }
        (None, backend) => {
            let mut child = ServerChild::start(backend, o.threads)?;
            let addr = child.addr()?;
            run_client(&o, &ep, &addr).await
        }
    }
}

/// This program started again with `--serve`, killed when dropped.
struct ServerChild(std::process::Child);

impl ServerChild {
    fn start(backend: Backend, threads: usize) -> Result<ServerChild, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let threads = threads.to_string();
        let child = std::process::Command::new(exe)
            .args(["--backend", backend.name(), "--serve", "127.0.0.1:0"])
            .args(["--threads", &threads])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting the server: {e}"))?;
        Ok(ServerChild(child))
    }

    /// The address from the child's first line ("serving on ADDR (...)").
    fn addr(&mut self) -> Result<String, String> {
        let out = self.0.stdout.take().ok_or("the server has no stdout")?;
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line)
            .map_err(|e| e.to_string())?;
        line.split_whitespace()
            .nth(2)
            .map(str::to_string)
            .ok_or_else(|| format!("the server said {line:?}"))
    }
}

impl Drop for ServerChild {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() {
    let result = parse().and_then(|o| {
        let mut rt = match o.threads {
            1 => tokio::runtime::Builder::new_current_thread(),
            _ => tokio::runtime::Builder::new_multi_thread(),
        };
        if o.threads > 1 {
            rt.worker_threads(o.threads);
        }
        // Run on a worker, as servers and clients run their requests: `block_on` alone
        // would run the client on this thread, off the runtime's workers, and every
        // completion would have to wake it from another thread.
        let rt = rt.enable_all().build().map_err(|e| e.to_string())?;
        rt.block_on(async { tokio::spawn(run(o)).await })
            .map_err(|e| e.to_string())?
    });
    if let Err(e) = result {
        eprintln!("transport-bench: {e}");
        std::process::exit(1);
    }
}
