//! Test harnesses: a whole cluster inside the test process ([`InProcessCluster`]) and a
//! cluster of real processes with real FUSE mounts ([`ProcessCluster`]). Both bind
//! 127.0.0.1 port 0, wait on readiness with deadlines, and stop everything they started
//! when dropped, also when a test fails.

pub mod agent;
pub mod change_loop;
pub mod chunk_tree;
pub mod client_io;
pub mod cluster_check;
mod inprocess;
pub mod mem_faults;
pub mod posix;
pub mod process;
pub mod serial;
pub mod wire;

pub use agent::Agent;
pub use inprocess::{InProcessCluster, Setup, CLUSTER_KEY};
pub use process::{ClusterOptions, Mount, ProcessCluster, Watchdog};

use sha2::{Digest, Sha256};
use std::time::{Duration, Instant};

/// How often [`wait_until`] and [`wait_until_blocking`] look at their condition.
const POLL_EVERY: Duration = Duration::from_millis(20);

/// Waits until `cond` holds, looking every 20 ms; fails the test (naming `what`) once
/// `within` has passed without it. For waits in async tests: the runtime's other tasks
/// run meanwhile.
pub async fn wait_until(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "waited {within:?} for {what}");
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// As [`wait_until`], blocking the calling thread (tests of real mounts and processes).
pub fn wait_until_blocking(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "waited {within:?} for {what}");
        std::thread::sleep(POLL_EVERY);
    }
}

/// Runs `f` on a thread of its own and waits at most `limit` for it: a call stuck on
/// a mount fails the test (whose guards then unmount and stop everything) instead of
/// hanging it. Prints how long it took.
pub fn bounded<T: Send + 'static>(
    what: &str,
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    let start = Instant::now();
    let out = rx
        .recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{what}: no answer within {limit:?}"));
    eprintln!("{what}: {:?}", start.elapsed());
    out
}

/// Hex sha256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Deterministic pseudo-random bytes (xorshift), so tests need no fixtures.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A small deterministic generator (xorshift64*), so that a seed replays a test's
/// operations exactly.
pub struct Rng(u64);

impl Rng {
    /// A generator started from `seed` (0 is moved to 1: xorshift stays at 0).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    /// A generator seeded from environment variable `var` (see
    /// [`client_io::seed_from_env`]).
    pub fn from_env(var: &str) -> Rng {
        Rng::new(client_io::seed_from_env(var))
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// An index in `0..n` (0 when `n` is 0).
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.index(v.len())]
    }
}

/// Waits at most `within` until every chain of the cluster `client` talks to has all its
/// members serving; a map call that fails (a server busy or failing over) is asked again
/// until then.
pub async fn wait_healthy(client: &fs_client::Client, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let map = client.cluster_map().await;
        if map.as_ref().is_ok_and(|m| healthy(m)) {
            return;
        }
        assert!(Instant::now() < deadline, "cluster not healthy: {map:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A metadata server's configuration lines for a namespace on etcd with settings `c`
/// (every field of the `[etcd]` table, as the server reads it).
pub fn etcd_meta_toml(c: &meta_server::kv::EtcdConfig) -> String {
    let table = toml::to_string(c).expect("etcd settings as TOML");
    format!("store = \"etcd\"\n[etcd]\n{table}")
}

/// Whether every chain of `map` has `min(3, servers up)` members, all serving.
pub fn healthy(map: &proto::meta::ClusterMap) -> bool {
    map.healthy(3)
}
