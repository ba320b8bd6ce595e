//! Data servers check grants (issue 23 item 4): a chunk request with no grant, a grant
//! for another file, a forged, expired or another client's grant, and a read-only grant
//! used for a write are each refused with their own code, counted and logged once per
//! connection and reason; servers' and administrators' requests are kept to them; the
//! metadata server hands read-only opens read grants; a long-lived open file keeps
//! working across renewals.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use proto::auth::Caps;
use proto::data::{
    ChunkData, InlineBytes, ListChunks, Placement, ReadChunk, ReadInline, ReplicaData, Replicate,
    TruncateFile, WriteInline,
};
use proto::grant::{seal, unix_ms, Grant, GrantMode};
use proto::meta::{fs, Caller, MetaRequest, OpenAccess};
use proto::{codec, ChunkId, ErrorCode, InodeId, Request, WireError};
use std::io::Write;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;
use tessera_tests::{InProcessCluster, Setup, CLUSTER_KEY};
use transport::{Access, Backend, Connection, Key};

/// Every log line of this test process, for the checks of "logged once".
fn logs() -> &'static Mutex<Vec<u8>> {
    static LOGS: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();
    static INSTALLED: OnceLock<()> = OnceLock::new();
    let logs = LOGS.get_or_init(|| Mutex::new(Vec::new()));
    INSTALLED.get_or_init(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .with_writer(|| Capture)
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
    });
    logs
}

struct Capture;

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        logs().lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Log lines that refuse a grant for `reason` (`GrantFault::name`) on a request for
/// `ino` (each test uses inodes of its own: tests of this process run in parallel).
fn refusal_lines(reason: &str, ino: InodeId) -> usize {
    let text = String::from_utf8_lossy(&logs().lock().unwrap()).to_string();
    text.lines()
        .filter(|l| l.contains("chunk request refused") && l.contains(reason))
        .filter(|l| l.contains(&format!("ino={ino} ")))
        .count()
}

fn code_of(reply: &[u8]) -> Option<ErrorCode> {
    match codec::decode::<Result<(), WireError>>(reply) {
        Ok(Err(e)) => Some(e.code),
        _ => None,
    }
}

/// A typed file-system call made for root, whose refusal is the test's to check.
async fn rpc<R: proto::Rpc<Envelope = MetaRequest>>(
    conn: &Connection,
    req: R,
) -> Result<R::Reply, WireError> {
    let req = Request::new(req).with_caller(Caller::ROOT);
    let reply = conn
        .call(Bytes::from(req.encode(1 << 20).unwrap()))
        .await
        .unwrap();
    req.decode_reply(&reply).unwrap()
}

async fn call<R: proto::Rpc>(conn: &Connection, req: R) -> Option<ErrorCode> {
    let bytes = Bytes::from(Request::new(req).encode(1 << 20).unwrap());
    code_of(&conn.call(bytes).await.unwrap())
}

/// A cluster whose data servers take no clock margin, so an expired grant is refused
/// at once.
async fn cluster_on(transport: Backend, lifetime_ms: u64) -> InProcessCluster {
    let setup = Setup {
        grant_lifetime_ms: lifetime_ms,
        grant_clock_skew_ms: 0,
        ..Setup::on(transport)
    };
    InProcessCluster::start_setup(1, setup).await
}

fn refusals(cluster: &InProcessCluster, reason: &str) -> u64 {
    let all = cluster.data[0].grant_refusals();
    all.iter().find(|(r, _)| r == reason).map_or(0, |(_, n)| *n)
}

async fn bad_grants_are_refused(transport: Backend, ino: InodeId) {
    let _ = logs();
    let cluster = cluster_on(transport, 600_000).await;
    let map = cluster.client().await.cluster_map().await.unwrap();
    let place = Placement {
        chain: map.chains[0].chain,
        map_version: map.version,
        replicas: 1,
    };
    let ep = cluster.endpoint();
    let data = ep.connect(cluster.data[0].advertise()).await.unwrap();
    let mr = ep.register(1 << 16).unwrap();
    let window = data.grant(&mr, 0, 4096, Access::RemoteReadWrite).unwrap();
    let cluster_key = Key::load(&cluster.key_file(CLUSTER_KEY)).unwrap();
    let later = unix_ms() + 60_000;
    let sealed =
        |ino, who: &str, mode, expires| Some(seal(cluster_key.bytes(), ino, who, mode, expires, 0));
    let chunk = ChunkId {
        inode: ino,
        index: 0,
    };
    let read = |grant: Option<Grant>| ReadChunk {
        chunk,
        place,
        chunk_size_bytes: 4 << 20,
        offset: 0,
        len: 4096,
        dest: window.remote(),
        grant,
    };
    let write = |grant: Option<Grant>| WriteInline {
        chunk,
        place,
        chunk_size_bytes: 4 << 20,
        offset: 0,
        data: vec![1; 100],
        grant,
    };
    let mut forged = sealed(ino, "admin", GrantMode::ReadWrite, later).unwrap();
    forged.expires_ms += 1;
    let other_key = Key::generate().unwrap();
    let rw = GrantMode::ReadWrite;
    let reads = [
        ("missing", None, ErrorCode::GrantMissing),
        (
            "wrong_file",
            sealed(InodeId(ino.0 + 1), "admin", rw, later),
            ErrorCode::GrantWrongFile,
        ),
        ("forged", Some(forged), ErrorCode::GrantForged),
        (
            "forged",
            Some(seal(other_key.bytes(), ino, "admin", rw, later, 0)),
            ErrorCode::GrantForged,
        ),
        (
            "expired",
            sealed(ino, "admin", rw, unix_ms() - 1000),
            ErrorCode::GrantExpired,
        ),
        (
            "wrong_client",
            sealed(ino, "bob", rw, later),
            ErrorCode::GrantWrongClient,
        ),
    ];
    for (reason, grant, code) in reads {
        for _ in 0..3 {
            assert_eq!(
                call(&data, read(grant.clone())).await,
                Some(code),
                "{reason}"
            );
        }
    }
    let read_only = sealed(ino, "admin", GrantMode::Read, later);
    for _ in 0..3 {
        let refused = call(&data, write(read_only.clone())).await;
        assert_eq!(refused, Some(ErrorCode::GrantWrongMode));
    }
    // A small read answered inline takes the same grant as one into a buffer.
    let inline = |grant: Option<Grant>| ReadInline {
        chunk,
        place,
        chunk_size_bytes: 4 << 20,
        offset: 0,
        len: 4096,
        grant,
    };
    assert_eq!(
        call(&data, inline(None)).await,
        Some(ErrorCode::GrantMissing)
    );
    let request = Request::new(inline(read_only.clone()))
        .encode(1 << 20)
        .unwrap();
    let reply = data.call(Bytes::from(request)).await.unwrap();
    let answer: Result<InlineBytes, WireError> = codec::decode(&reply).unwrap();
    assert_eq!(
        answer.map(|r| r.data.len()),
        Ok(4096),
        "a read grant reads inline"
    );
    // Which blocks hold data (`SEEK_DATA`) is a read too.
    let blocks = |grant: Option<Grant>| ChunkData {
        chunk,
        place,
        chunk_size_bytes: 4 << 20,
        grant,
    };
    assert_eq!(
        call(&data, blocks(None)).await,
        Some(ErrorCode::GrantMissing)
    );
    assert_eq!(call(&data, blocks(read_only.clone())).await, None);
    // The same grants that are right pass: a read-only one reads, a writable one writes.
    assert_eq!(call(&data, read(read_only)).await, None);
    assert_eq!(
        call(&data, write(sealed(ino, "admin", rw, later))).await,
        None
    );

    for (reason, want) in [
        ("missing", 5),
        ("wrong_file", 3),
        ("forged", 6),
        ("expired", 3),
        ("wrong_client", 3),
        ("wrong_mode", 3),
    ] {
        assert_eq!(refusals(&cluster, reason), want, "count of {reason}");
    }
    // Logged once per connection and reason, not per request.
    for reason in ["missing", "wrong_file", "forged", "expired", "wrong_client"] {
        assert_eq!(refusal_lines(reason, ino), 1, "log lines of {reason}");
    }
    assert_eq!(refusal_lines("wrong_mode", ino), 1);
    // A new connection's first refusal is logged again.
    let again = ep.connect(cluster.data[0].advertise()).await.unwrap();
    assert_eq!(
        call(&again, read(None)).await,
        Some(ErrorCode::GrantMissing)
    );
    assert_eq!(refusal_lines("missing", ino), 2);
}

/// Guards against a data server serving a chunk request whose grant is missing, for
/// another file, forged, expired, another client's or read-only for a write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_grants_are_refused_counted_and_logged_once_on_tcp() {
    bad_grants_are_refused(Backend::Tcp, InodeId(777)).await;
}

/// As on tcp, on the in-process transport.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_grants_are_refused_counted_and_logged_once_on_mem() {
    bad_grants_are_refused(Backend::Mem, InodeId(888)).await;
}

/// Guards against a server's and an administrator's requests being open to any client.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chain_and_admin_requests_are_kept_to_servers_and_administrators() {
    let cluster = cluster_on(Backend::Mem, 600_000).await;
    let admin = cluster.client().await;
    let carol = cluster
        .make_client_key(&admin, "carol", Caps::default())
        .await;
    let map = admin.cluster_map().await.unwrap();
    let chain = map.chains[0].chain;
    let carol_ep = cluster
        .endpoint()
        .with_credentials(transport::Credentials::client(carol));
    let data = carol_ep.connect(cluster.data[0].advertise()).await.unwrap();
    let list = ListChunks {
        chain,
        after: None,
        limit: 10,
    };
    assert_eq!(
        call(&data, list.clone()).await,
        Some(ErrorCode::NotPermitted)
    );
    let replicate = Replicate {
        chunk: ChunkId {
            inode: InodeId(5),
            index: 0,
        },
        place: Placement {
            chain,
            map_version: map.version,
            replicas: 1,
        },
        chunk_size_bytes: 4 << 20,
        offset: 0,
        version: 1,
        base_version: 0,
        data: ReplicaData::Zeros(10),
    };
    assert_eq!(call(&data, replicate).await, Some(ErrorCode::NotPermitted));
    // The administrator lists.
    let admin_data = cluster
        .endpoint()
        .connect(cluster.data[0].advertise())
        .await
        .unwrap();
    assert_eq!(call(&admin_data, list).await, None);
}

/// Guards against a read-only open getting a writable grant, and against a grant being
/// renewed for a session of another connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn read_only_opens_get_read_grants_and_renewals_need_the_session() {
    let cluster = cluster_on(Backend::Tcp, 600_000).await;
    let admin = cluster.client().await;
    let caps = Caps {
        read_only: true,
        ..Caps::default()
    };
    let reader = cluster.make_client_key(&admin, "reader", caps).await;
    let reader_ep = cluster
        .endpoint()
        .with_credentials(transport::Credentials::client(reader));
    let admin_meta = cluster
        .endpoint()
        .connect(&cluster.meta_addr())
        .await
        .unwrap();
    let reader_meta = reader_ep.connect(&cluster.meta_addr()).await.unwrap();
    let id =
        |conn: Connection| async move { rpc(&conn, fs::Hello { name: "t".into() }).await.unwrap() };
    let admin_id = id(admin_meta.clone()).await;
    let create = fs::Create {
        parent: InodeId::ROOT,
        name: b"f".to_vec(),
        perm: 0o666,
        exclusive: true,
        access: OpenAccess::ReadWrite,
        append: false,
        client: admin_id,
    };
    let made = rpc(&admin_meta, create).await.unwrap();
    let g = made.grant.clone().unwrap();
    assert_eq!(
        (g.mode, g.inode, g.client.as_str()),
        (GrantMode::ReadWrite, made.attr.ino, "admin")
    );
    // The mode follows what the open asks: the administrator's read-only open reads.
    let admin_read = fs::Open {
        ino: made.attr.ino,
        client: admin_id,
        truncate: false,
        access: OpenAccess::Read,
        append: false,
    };
    let g = rpc(&admin_meta, admin_read).await.unwrap().grant.unwrap();
    assert_eq!(g.mode, GrantMode::Read);
    let reader_id = id(reader_meta.clone()).await;
    let open = fs::Open {
        ino: made.attr.ino,
        client: reader_id,
        truncate: false,
        access: OpenAccess::Read,
        append: false,
    };
    let opened = rpc(&reader_meta, open).await.unwrap();
    let g = opened.grant.unwrap();
    assert_eq!((g.mode, g.client.as_str()), (GrantMode::Read, "reader"));
    // A renewal keeps the mode; one for the admin's session on the reader's connection
    // is refused.
    let renewed = rpc(
        &reader_meta,
        fs::Regrant {
            session: opened.session,
        },
    )
    .await;
    assert_eq!(renewed.unwrap().unwrap().mode, GrantMode::Read);
    let stolen = rpc(
        &reader_meta,
        fs::Regrant {
            session: made.session,
        },
    )
    .await;
    assert_eq!(stolen.unwrap_err().code, ErrorCode::Stale);
}

/// Guards against an open file failing once its first grant runs out: the client
/// renews it (here every half second) while reads and writes go on, through a close
/// whose buffered writes go out last.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_lived_open_file_keeps_working_across_renewals() {
    let cluster = cluster_on(Backend::Tcp, 1000).await;
    let client = cluster.client().await;
    let caller = Caller::ROOT;
    let (attr, fh) = client
        .create(InodeId::ROOT, b"long", 0o644, caller, true, false)
        .await
        .unwrap();
    let block = vec![7u8; 64 << 10];
    let until = unix_ms() + 3000;
    let mut offset = 0u64;
    while unix_ms() < until {
        client.write(&fh, offset, &block).await.unwrap();
        client.fsync(&fh).await.unwrap();
        let back = client.read(&fh, offset, block.len()).await.unwrap();
        assert_eq!(back, block, "at {offset}");
        offset += block.len() as u64;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Buffered writes sent by the close, after the grant it started with ran out.
    client.write(&fh, offset, &block).await.unwrap();
    client.release(&fh).await.unwrap();
    let (_, fh) = client.open(attr.ino, false).await.unwrap();
    let back = client.read(&fh, offset, block.len()).await.unwrap();
    assert_eq!(back, block);
    client.release(&fh).await.unwrap();
    for (reason, n) in cluster.data[0].grant_refusals() {
        assert_eq!(n, 0, "refused for {reason}: renewals came too late");
    }
}

/// Guards against renewals tied to the newest open of a file: closing it made every
/// other open of the file fail (EACCES) once the grant ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn closing_one_open_keeps_the_other_opens_of_the_file_working() {
    let cluster = cluster_on(Backend::Tcp, 1000).await;
    let client = cluster.client().await;
    let (attr, writer) = client
        .create(InodeId::ROOT, b"shared", 0o644, Caller::ROOT, true, false)
        .await
        .unwrap();
    let (_, reader) = client
        .open_for(attr.ino, OpenAccess::Read, false)
        .await
        .unwrap();
    // A second writable open, the newest of the file, closed at once.
    let (_, brief) = client.open(attr.ino, false).await.unwrap();
    client.release(&brief).await.unwrap();
    let until = unix_ms() + 3000;
    let mut offset = 0u64;
    while unix_ms() < until {
        let block = vec![(offset >> 16) as u8; 64 << 10];
        client.write(&writer, offset, &block).await.unwrap();
        client.fsync(&writer).await.unwrap();
        let back = client.read(&reader, offset, block.len()).await.unwrap();
        assert_eq!(back, block, "at {offset}");
        offset += block.len() as u64;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The writer closes; the reader goes on alone with a renewed read grant.
    let last = vec![0xAB; 64 << 10];
    client.write(&writer, offset, &last).await.unwrap();
    client.release(&writer).await.unwrap();
    let until = unix_ms() + 2000;
    while unix_ms() < until {
        let back = client.read(&reader, offset, last.len()).await.unwrap();
        assert_eq!(back, last);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    client.release(&reader).await.unwrap();
    for (reason, n) in cluster.data[0].grant_refusals() {
        assert_eq!(
            n, 0,
            "refused for {reason}: a closed open took the renewals along"
        );
    }
}

/// Guards against the cut of what a vanished writer left past the committed length
/// needing a writable grant: a reader's open of such a file got one (and could write
/// the file with it until it ran out), and a read-only key could not open the file at
/// all (its cut was refused as a change). The open now gets a read grant and a grant
/// for the cut alone: a truncation to the committed length.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reader_that_must_cut_a_vanished_writers_tail_gets_no_write_grant() {
    let cluster = cluster_on(Backend::Tcp, 600_000).await;
    let admin = cluster.client().await;
    let caps = Caps {
        read_only: true,
        ..Caps::default()
    };
    let reader = cluster.make_client_key(&admin, "cut-reader", caps).await;
    let reader_ep = cluster
        .endpoint()
        .with_credentials(transport::Credentials::client(reader));
    // The writer's connection closes with the file open: the next open must cut.
    let writer = cluster
        .endpoint()
        .connect(&cluster.meta_addr())
        .await
        .unwrap();
    let writer_id = rpc(&writer, fs::Hello { name: "w".into() }).await.unwrap();
    let create = fs::Create {
        parent: InodeId::ROOT,
        name: b"left".to_vec(),
        perm: 0o644,
        exclusive: true,
        access: OpenAccess::ReadWrite,
        append: false,
        client: writer_id,
    };
    let made = rpc(&writer, create).await.unwrap();
    writer.close();

    let reader = reader_ep.connect(&cluster.meta_addr()).await.unwrap();
    let reader_id = rpc(&reader, fs::Hello { name: "r".into() }).await.unwrap();
    let open = fs::Open {
        ino: made.attr.ino,
        client: reader_id,
        truncate: false,
        access: OpenAccess::Read,
        append: false,
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let opened = loop {
        let o = rpc(&reader, open.clone())
            .await
            .expect("a read-only key opens it");
        if o.cut_tail || std::time::Instant::now() > deadline {
            break o;
        }
        // The server had not seen the writer's connection close yet.
        rpc(
            &reader,
            fs::Release {
                session: o.session,
                commit: None,
            },
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(opened.cut_tail, "the writer vanished with the file open");
    let (grant, cut) = (opened.grant.unwrap(), opened.cut_grant.unwrap());
    assert_eq!(grant.mode, GrantMode::Read, "a reader reads");
    let cut_to = GrantMode::CutTo(0, 4 << 20);
    assert_eq!(
        cut.mode, cut_to,
        "and cuts to the length, in the file's chunks, only"
    );

    let map = admin.cluster_map().await.unwrap();
    let place = Placement {
        chain: map.chains[0].chain,
        map_version: map.version,
        replicas: 1,
    };
    let data = reader_ep
        .connect(cluster.data[0].advertise())
        .await
        .unwrap();
    let ino = made.attr.ino;
    let write = |grant: &Grant| WriteInline {
        chunk: ChunkId {
            inode: ino,
            index: 0,
        },
        place,
        chunk_size_bytes: 4 << 20,
        offset: 0,
        data: vec![1; 100],
        grant: Some(grant.clone()),
    };
    assert_eq!(
        call(&data, write(&grant)).await,
        Some(ErrorCode::GrantWrongMode)
    );
    assert_eq!(
        call(&data, write(&cut)).await,
        Some(ErrorCode::GrantWrongMode)
    );
    let truncate_in = |size, chunk_size_bytes, grant: &Grant| TruncateFile {
        inode: ino,
        size,
        chunk_size_bytes,
        grant: Some(grant.clone()),
    };
    let truncate = |size, grant: &Grant| truncate_in(size, 4 << 20, grant);
    assert_eq!(
        call(&data, truncate(4096, &cut)).await,
        Some(ErrorCode::GrantWrongMode)
    );
    // Counted in larger chunks, a cut to the length would remove chunks below it.
    assert_eq!(
        call(&data, truncate_in(0, 64 << 20, &cut)).await,
        Some(ErrorCode::GrantWrongMode)
    );
    assert_eq!(
        call(&data, truncate(0, &grant)).await,
        Some(ErrorCode::GrantWrongMode)
    );
    assert_eq!(call(&data, truncate(0, &cut)).await, None, "the cut itself");
    let cut_done = fs::TailCut {
        ino,
        session: opened.session,
    };
    rpc(&reader, cut_done)
        .await
        .expect("a read-only key's cut is no change");
}
