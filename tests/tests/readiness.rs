//! Readiness for systemd (issue 26 item 5): the units in `packaging/systemd` are
//! `Type=notify`, so each process must send `READY=1` to `$NOTIFY_SOCKET` once it
//! serves: the metadata server once it listens, a data server once registered, a mount
//! once mounted. The test plays systemd's part with a datagram socket of its own.
//! Needs root and /dev/fuse (as every mount test). One test in this file: it sets
//! `NOTIFY_SOCKET` for the whole test process, which the servers it starts inherit.

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};
use tessera_tests::ProcessCluster;

/// The messages received within `limit`, waiting until there are `want`.
fn receive(sock: &UnixDatagram, want: usize, limit: Duration) -> Vec<String> {
    let deadline = Instant::now() + limit;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.len() < want && Instant::now() < deadline {
        sock.set_read_timeout(Some(deadline.saturating_duration_since(Instant::now())))
            .expect("a read timeout");
        if let Ok(n) = sock.recv(&mut buf) {
            got.push(String::from_utf8_lossy(&buf[..n]).trim_end().to_string());
        }
    }
    got
}

/// Guards against a unit being "started" before its process serves, or never: the
/// servers and the mount did not tell systemd they were ready.
#[test]
fn servers_and_mount_say_ready_once_they_serve() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify");
    let sock = UnixDatagram::bind(&path).unwrap();
    // The only test of this binary: nothing else reads the environment meanwhile.
    std::env::set_var("NOTIFY_SOCKET", &path);
    let cluster = ProcessCluster::start(1);
    // The start returns once the metadata server listens and the data server is
    // registered (their address files): both have said so by then, and no one else.
    let got = receive(&sock, 2, Duration::from_secs(20));
    assert_eq!(got, ["READY=1", "READY=1"], "meta and data servers");
    assert!(
        receive(&sock, 1, Duration::from_millis(300)).is_empty(),
        "a message before the mount started"
    );
    let m = cluster.mount("m");
    let got = receive(&sock, 1, Duration::from_secs(20));
    assert_eq!(got, ["READY=1"], "the mount");
    assert!(m.path.join(".").metadata().unwrap().is_dir());
}
