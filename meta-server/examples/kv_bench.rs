//! Create-rate benchmark of the key-value engines, to choose the default by measurement.
//!
//! Each "create" is one durable batch of two puts, shaped like a file create in the
//! namespace (an inode record and a directory entry). Runs N creates one at a time, then
//! N creates from 4 threads at once, on each engine, in a fresh temp dir each time.
//!
//! ```text
//! cargo run --release -p meta-server --example kv_bench -- [N] [sled|redb]
//! ```

use meta_server::kv::{open_store, KvStore, StoreKind, WriteBatch};
use std::sync::Arc;
use std::time::{Duration, Instant};

const DEFAULT_CREATES: u64 = 20_000;
const THREADS: u64 = 4;

/// The two puts of one create of inode `ino` in directory 1.
fn create_batch(ino: u64) -> WriteBatch {
    let mut b = WriteBatch::new();
    let mut inode_key = vec![b'I'];
    inode_key.extend_from_slice(&ino.to_be_bytes());
    // About the size of an encoded regular-file inode record with a 3-server layout.
    b.put(inode_key, vec![0x5a; 72]);
    let mut dirent_key = vec![b'D'];
    dirent_key.extend_from_slice(&1u64.to_be_bytes());
    dirent_key.extend_from_slice(format!("file-{ino:08}.bin").as_bytes());
    b.put(dirent_key, vec![1, 0x80, 0x01, 1]);
    b
}

fn serial(store: &dyn KvStore, n: u64) -> Duration {
    let start = Instant::now();
    for ino in 0..n {
        store.commit(create_batch(ino)).expect("commit");
    }
    start.elapsed()
}

fn concurrent(store: &Arc<dyn KvStore>, n: u64) -> Duration {
    let start = Instant::now();
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let store = Arc::clone(store);
            std::thread::spawn(move || {
                for i in 0..n / THREADS {
                    store.commit(create_batch(i * THREADS + t)).expect("commit");
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    start.elapsed()
}

/// Appends of 100 bytes with an fdatasync each, per second: the floor any durable
/// commit pays on this disk, to read the engines' numbers against.
fn fdatasync_rate(dir: &std::path::Path, n: u64) -> f64 {
    use std::io::Write;
    let mut f = std::fs::File::create(dir.join("fsync-probe")).expect("probe file");
    let start = Instant::now();
    for _ in 0..n {
        f.write_all(&[7; 100]).expect("write");
        f.sync_data().expect("fdatasync");
    }
    rate(n, start.elapsed())
}

/// Bytes of all files under `dir`: the engine's space cost for the same data.
fn disk_bytes(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => disk_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

fn rate(n: u64, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .map(|a| a.parse().expect("N must be a number"))
        .unwrap_or(DEFAULT_CREATES);
    let only = args.next();
    let base = std::env::var_os("TESSERA_BENCH_DIR").map(std::path::PathBuf::from);
    println!("{n} creates (2 puts per durable commit), {THREADS} threads for the concurrent run");
    let probe = match &base {
        Some(b) => tempfile::tempdir_in(b),
        None => tempfile::tempdir(),
    }
    .expect("temp dir");
    println!(
        "disk: {:.0} appends+fdatasync/s",
        fdatasync_rate(probe.path(), 2000)
    );
    for kind in StoreKind::EMBEDDED {
        if only.as_deref().is_some_and(|o| o != kind.name()) {
            continue;
        }
        let dir = match &base {
            Some(b) => tempfile::tempdir_in(b),
            None => tempfile::tempdir(),
        }
        .expect("temp dir");
        let store = open_store(kind, &dir.path().join("serial")).expect("open");
        let one = serial(&*store, n);
        drop(store);
        let serial_mib = disk_bytes(&dir.path().join("serial")) as f64 / f64::from(1 << 20);
        let store: Arc<dyn KvStore> =
            open_store(kind, &dir.path().join("concurrent")).expect("open");
        let four = concurrent(&store, n);
        println!(
            "{:5} serial {:7.0} commits/s ({:5.2} s, {:6.1} MiB on disk)  \
             {THREADS} threads {:7.0} commits/s ({:5.2} s)",
            kind.name(),
            rate(n, one),
            one.as_secs_f64(),
            serial_mib,
            rate(n / THREADS * THREADS, four),
            four.as_secs_f64(),
        );
    }
}
