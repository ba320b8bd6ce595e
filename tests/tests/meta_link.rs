//! A client cut off from the metadata server while it lives on: its connection is reset
//! (by a relay between them, on 127.0.0.1, that closes both sockets with RST as a
//! failing network or firewall would). Within the server's grace the client takes its
//! open files back on a new connection, and what it wrote past the committed length
//! survives another client's open; past the grace its open is lost, and its close fails
//! instead of committing a length over bytes another client cut.
//!
//! Each test runs twice: on `tcp` through the relay, and on the `mem` transport, where
//! the link between the client and the metadata server first loses every message (a
//! partition, for a time the seed picks) and is then broken, and while it is down new
//! connections are reset (seeds printed, `TESSERA_META_LINK_SEED` replays).
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use fs_client::{Client, ClientConfig, FileHandle};
use proto::meta::Caller;
use proto::InodeId;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tessera_tests::{mem_faults, pseudo_random, wait_until, InProcessCluster, Setup};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;
use transport::mem::{self, FilterGuard, OpKind, Packet, Verdict};
use transport::Backend;

const ROOT_CALLER: Caller = Caller::ROOT;
const MIB: usize = 1 << 20;
/// Every wait in these tests gives up after this long.
const PATIENCE: Duration = Duration::from_secs(20);

/// Forwards TCP connections to `target`; `cut` resets every connection it carries.
struct Relay {
    addr: String,
    pairs: Arc<Mutex<Vec<AbortHandle>>>,
    /// While set, new connections are reset as they arrive (the network is down).
    down: Arc<AtomicBool>,
    accept: AbortHandle,
}

/// Makes closing `s` send a reset instead of an orderly end (SO_LINGER of 0).
fn reset_on_close(s: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket descriptor and a correctly sized option value.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "setting SO_LINGER");
}

impl Relay {
    async fn start(target: String) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("relay binds");
        let addr = listener.local_addr().unwrap().to_string();
        let pairs: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let kept = pairs.clone();
        let down = Arc::new(AtomicBool::new(false));
        let is_down = down.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((mut a, _)) = listener.accept().await else {
                    return;
                };
                if is_down.load(Ordering::SeqCst) {
                    reset_on_close(&a);
                    continue;
                }
                let Ok(mut b) = TcpStream::connect(&target).await else {
                    continue;
                };
                reset_on_close(&a);
                reset_on_close(&b);
                let pair = tokio::spawn(async move {
                    let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
                });
                kept.lock().unwrap().push(pair.abort_handle());
            }
        });
        Relay {
            addr,
            pairs,
            down,
            accept: accept.abort_handle(),
        }
    }

    /// Takes the network down (new connections are reset) or up again.
    fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// Resets every connection carried so far; new ones are carried again.
    fn cut(&self) -> usize {
        let pairs = std::mem::take(&mut *self.pairs.lock().unwrap());
        pairs.iter().for_each(AbortHandle::abort);
        pairs.len()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// The link between client A and the metadata server, on `mem`.
struct MemLink {
    client: String,
    meta: String,
    /// While set, A's connects to the metadata server are reset (the network is down).
    down: Mutex<Option<FilterGuard>>,
}

/// Where client A's link to the metadata server can be cut: a relay on `tcp`, the
/// fabric's filters on `mem`.
enum Link {
    Tcp(Relay),
    Mem(MemLink),
}

impl Link {
    /// Client A, whose link this is, and the link.
    async fn open(cluster: &InProcessCluster) -> (Arc<Client>, Link) {
        match cluster.transport() {
            Backend::Mem => {
                let (a, client) = mem_faults::named_client(cluster).await;
                let link = MemLink {
                    client,
                    meta: cluster.meta_addr(),
                    down: Mutex::new(None),
                };
                (a, Link::Mem(link))
            }
            _ => {
                let relay = Relay::start(cluster.meta_addr()).await;
                (client_through(&relay, cluster).await, Link::Tcp(relay))
            }
        }
    }

    /// Takes the network down (new connections are reset) or up again.
    fn set_down(&self, down: bool) {
        match self {
            Link::Tcp(relay) => relay.set_down(down),
            Link::Mem(m) => {
                let (client, meta) = (m.client.clone(), m.meta.clone());
                let reset = move |p: &Packet<'_>| match p.kind == OpKind::Connect
                    && p.from == client
                    && p.to == meta
                {
                    true => Verdict::Kill,
                    false => Verdict::Deliver,
                };
                *m.down.lock().unwrap() = down.then(|| mem::add_filter(reset));
            }
        }
    }

    /// Breaks every connection between A and the metadata server; on `mem`, after
    /// losing every message on it for `silence` (what a failing network does before
    /// the reset). Returns how many were broken.
    async fn cut(&self, silence: Duration) -> usize {
        match self {
            Link::Tcp(relay) => relay.cut(),
            Link::Mem(m) => {
                let lost = mem::partition(&[m.client.as_str()], &[m.meta.as_str()]);
                tokio::time::sleep(silence).await;
                let broken = mem::kill_between(&m.client, &m.meta);
                drop(lost);
                broken
            }
        }
    }
}

async fn wait_for(what: &str, ready: impl FnMut() -> bool) {
    wait_until(what, PATIENCE, ready).await
}

fn seed() -> u64 {
    tessera_tests::client_io::seed_from_env("TESSERA_META_LINK_SEED")
}

/// A cluster of three data servers on `transport`, with these namespace settings.
async fn cluster_on(
    transport: Backend,
    namespace: meta_server::NamespaceConfig,
) -> InProcessCluster {
    let setup = Setup {
        namespace,
        ..Setup::on(transport)
    };
    InProcessCluster::start_setup(3, setup).await
}

/// Chunk files of chunk `index` of `ino` on the data servers.
fn chunk_copies(dirs: &[std::path::PathBuf], ino: InodeId, index: u64) -> usize {
    dirs.iter()
        .filter(|d| tessera_tests::chunk_tree::chunk_file(d, ino.0, index).exists())
        .count()
}

/// Client A (through the relay) commits 8 MiB of `f`, writes 8 MiB more past that
/// without committing, and waits until those bytes sit on every data server. Returns
/// the file, A's handle and the 16 MiB.
async fn write_past_the_commit(
    cluster: &InProcessCluster,
    a: &Client,
    seed: u64,
) -> (InodeId, FileHandle, Vec<u8>) {
    let data = pseudo_random(16 * MIB, seed);
    let (attr, fh) = a
        .create(InodeId::ROOT, b"f", 0o644, ROOT_CALLER, true, false)
        .await
        .unwrap();
    for (i, part) in data.chunks(MIB).enumerate() {
        a.write(&fh, (i * MIB) as u64, part).await.unwrap();
        if i == 7 {
            a.fsync(&fh).await.unwrap();
        }
    }
    // 4 MiB chunks: bytes 8-16 MiB are chunks 2 and 3, sent as their segments filled.
    wait_for("the uncommitted chunks on the data servers", || {
        chunk_copies(&cluster.data_dirs, attr.ino, 3) == 3
    })
    .await;
    (attr.ino, fh, data)
}

async fn cut_off(cluster: &InProcessCluster, link: &Link, seed: u64) {
    // The silence stays well within the grace of the first test (60 s).
    let silence = Duration::from_millis(seed % 500);
    assert!(
        link.cut(silence).await > 0,
        "the client's connection went through the link"
    );
    let ns = cluster.meta().namespace().clone();
    wait_for("the server to see the connection break", move || {
        ns.waiting_resume() == 1
    })
    .await;
}

async fn client_through(relay: &Relay, cluster: &InProcessCluster) -> Arc<Client> {
    Client::connect(ClientConfig {
        meta_addr: relay.addr.clone(),
        ..cluster.client_config()
    })
    .await
    .expect("client connects through the relay")
}

/// Within the grace: another client's open finds A's open still there and cuts
/// nothing, and A's close (on a new connection) commits all 16 MiB.
async fn cut_off_briefly(transport: Backend) {
    let seed = seed();
    let cluster = cluster_on(transport, InProcessCluster::namespace_config()).await;
    let (a, link) = Link::open(&cluster).await;
    let b = cluster.client().await;
    let (ino, fh, data) = write_past_the_commit(&cluster, &a, seed).await;

    cut_off(&cluster, &link, seed).await;
    let (_, seen) = b.open(ino, false).await.unwrap();
    b.release(&seen).await.unwrap();
    a.release(&fh)
        .await
        .expect("A's close commits after resuming");
    let ns = cluster.meta().namespace().clone();
    wait_for("A's sessions resumed", move || ns.waiting_resume() == 0).await;

    let got = tessera_tests::client_io::read_whole(&b, "f").await.unwrap();
    assert_eq!(got.len(), data.len());
    assert!(got == data, "every byte A wrote, also past the old commit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_cut_off_briefly_keeps_what_it_wrote_past_the_commit() {
    cut_off_briefly(Backend::Tcp).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_mem_a_client_cut_off_briefly_keeps_what_it_wrote_past_the_commit() {
    cut_off_briefly(Backend::Mem).await
}

/// Past the grace: B's open cuts at the committed 8 MiB, and A's flush (close) fails
/// (EIO) without committing 16 MiB over the cut bytes.
async fn cut_off_past_the_grace(transport: Backend) {
    let seed = seed();
    let namespace = meta_server::NamespaceConfig {
        session_grace_ms: 300,
        ..InProcessCluster::namespace_config()
    };
    let cluster = cluster_on(transport, namespace).await;
    let (a, link) = Link::open(&cluster).await;
    let b = cluster.client().await;
    let (ino, fh, data) = write_past_the_commit(&cluster, &a, seed).await;

    // The network stays down past the grace: A cannot come back in time.
    link.set_down(true);
    cut_off(&cluster, &link, seed).await;
    let ns = cluster.meta().namespace().clone();
    wait_for("the grace to run out", move || ns.waiting_resume() == 0).await;
    let (_, cutter) = b.open(ino, false).await.unwrap();
    b.release(&cutter).await.unwrap();
    link.set_down(false);
    // A flush (what `close` sends) commits by inode, with no session to refuse it.
    let flushed = a.flush(&fh).await;
    assert!(flushed.is_err(), "A's flush must fail: {flushed:?}");
    let _ = a.release(&fh).await;

    let got = tessera_tests::client_io::read_whole(&b, "f").await.unwrap();
    assert_eq!(
        got.len(),
        8 * MIB,
        "the committed length, nothing over cut bytes"
    );
    assert!(got[..] == data[..8 * MIB]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_cut_off_past_the_grace_is_told_and_commits_nothing() {
    cut_off_past_the_grace(Backend::Tcp).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_mem_a_client_cut_off_past_the_grace_is_told_and_commits_nothing() {
    cut_off_past_the_grace(Backend::Mem).await
}
