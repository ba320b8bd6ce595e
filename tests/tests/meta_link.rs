//! A client cut off from the metadata server while it lives on: its connection is reset
//! (by a relay between them, on 127.0.0.1, that closes both sockets with RST as a
//! failing network or firewall would). Within the server's grace the client takes its
//! open files back on a new connection, and what it wrote past the committed length
//! survives another client's open; past the grace its open is lost, and its close fails
//! instead of committing a length over bytes another client cut.

use fs_client::{Client, ClientConfig, FileHandle};
use proto::meta::Caller;
use proto::InodeId;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tessera_tests::{pseudo_random, InProcessCluster};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

const ROOT_CALLER: Caller = Caller { uid: 0, gid: 0 };
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

async fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(start.elapsed() < PATIENCE, "waited {PATIENCE:?} for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Chunk files of chunk `index` of `ino` on the data servers.
fn chunk_copies(dirs: &[std::path::PathBuf], ino: InodeId, index: u64) -> usize {
    let name = format!("{index:016x}.chunk");
    let ino_dir = format!("{:016x}", ino.0);
    dirs.iter()
        .filter(|d| {
            let buckets = std::fs::read_dir(d.join("chunks"))
                .into_iter()
                .flatten()
                .flatten();
            buckets
                .into_iter()
                .any(|b| Path::new(&b.path()).join(&ino_dir).join(&name).exists())
        })
        .count()
}

/// Client A (through the relay) commits 8 MiB of `f`, writes 8 MiB more past that
/// without committing, and waits until those bytes sit on every data server. Returns
/// the file, A's handle and the 16 MiB.
async fn write_past_the_commit(
    cluster: &InProcessCluster,
    a: &Client,
) -> (InodeId, FileHandle, Vec<u8>) {
    let data = pseudo_random(16 * MIB, 0x5eed);
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

async fn cut_off(cluster: &InProcessCluster, relay: &Relay) {
    assert!(
        relay.cut() > 0,
        "the client's connection went through the relay"
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
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_cut_off_briefly_keeps_what_it_wrote_past_the_commit() {
    let cluster = InProcessCluster::start(3).await;
    let relay = Relay::start(cluster.meta_addr()).await;
    let a = client_through(&relay, &cluster).await;
    let b = cluster.client().await;
    let (ino, fh, data) = write_past_the_commit(&cluster, &a).await;

    cut_off(&cluster, &relay).await;
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

/// Past the grace: B's open cuts at the committed 8 MiB, and A's flush (close) fails
/// (EIO) without committing 16 MiB over the cut bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_cut_off_past_the_grace_is_told_and_commits_nothing() {
    let cluster = InProcessCluster::start_with(
        3,
        meta_server::NamespaceConfig {
            session_grace_ms: 300,
            ..InProcessCluster::namespace_config()
        },
    )
    .await;
    let relay = Relay::start(cluster.meta_addr()).await;
    let a = client_through(&relay, &cluster).await;
    let b = cluster.client().await;
    let (ino, fh, data) = write_past_the_commit(&cluster, &a).await;

    // The network stays down past the grace: A cannot come back in time.
    relay.set_down(true);
    cut_off(&cluster, &relay).await;
    let ns = cluster.meta().namespace().clone();
    wait_for("the grace to run out", move || ns.waiting_resume() == 0).await;
    let (_, cutter) = b.open(ino, false).await.unwrap();
    b.release(&cutter).await.unwrap();
    relay.set_down(false);
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
