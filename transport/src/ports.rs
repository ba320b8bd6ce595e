//! Fixed ports for servers started later on this machine (local clusters, tests): a
//! server whose address its clients must know before it listens (a standby metadata
//! server, an etcd member) is given a port now and binds it later.
//!
//! Such a port is taken below the kernel's ephemeral range
//! (`net.ipv4.ip_local_port_range`): every outgoing connection draws its own port from
//! that range, so a port found free there can be a new connection's by the time the
//! server binds it (seen in CI: a standby metadata server's port taken meanwhile by one
//! of the test's own connections).

use std::collections::BTreeSet;
use std::hash::{BuildHasher, RandomState};
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::sync::Mutex;

/// Lowest port handed out: above the well-known and most registered services' ports.
pub const FIRST_FIXED_PORT: u16 = 20_000;
/// Ports tried at random before the kernel is asked for one of its own.
const TRIES: u32 = 256;

/// Ports this process handed out already: two servers of one process (two tests at
/// once, or a member killed and started again) never get the same one.
static HANDED: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// The first port of the kernel's ephemeral range (Linux's default when unreadable).
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768)
}

/// An address on `host` (an IP address, `127.0.0.1` or `::1`) whose port was free a
/// moment ago, chosen at random between [`FIRST_FIXED_PORT`] and the ephemeral range,
/// and never handed out before by this process. If every try is taken, a port the
/// kernel chooses (in the ephemeral range: the old behaviour, rarely racy).
pub fn fixed_addr(host: &str) -> io::Result<SocketAddr> {
    let span = ephemeral_start().saturating_sub(FIRST_FIXED_PORT).max(1024);
    let random = RandomState::new();
    let mut handed = HANDED
        .lock()
        .map_err(|_| io::Error::other("the port registry's lock is poisoned"))?;
    for attempt in 0..TRIES {
        let port = FIRST_FIXED_PORT + (random.hash_one(attempt) % u64::from(span)) as u16;
        if handed.contains(&port) {
            continue;
        }
        if let Ok(l) = TcpListener::bind((host, port)) {
            handed.insert(port);
            return l.local_addr();
        }
    }
    let l = TcpListener::bind((host, 0))?;
    let addr = l.local_addr()?;
    handed.insert(addr.port());
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_ports_are_outside_the_ephemeral_range_and_never_repeat() {
        let start = ephemeral_start();
        let mut seen = BTreeSet::new();
        for _ in 0..64 {
            let a = fixed_addr("127.0.0.1").expect("a port");
            assert!(a.ip().is_loopback(), "{a}");
            assert!(seen.insert(a.port()), "port {} handed out twice", a.port());
            if start > FIRST_FIXED_PORT + 1024 {
                assert!(
                    (FIRST_FIXED_PORT..start).contains(&a.port()),
                    "{a} outside {FIRST_FIXED_PORT}..{start}"
                );
            }
            // Free when handed out: a server can bind it.
            TcpListener::bind(a).expect("bind the handed-out port");
        }
    }
}
