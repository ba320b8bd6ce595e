//! The authentication handshake on real sockets (tcp, 127.0.0.1) and on `mem`: who gets
//! in, what each side is told when someone does not, and what half-open handshakes
//! cannot take from served clients.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use proto::auth::{AuthReply, Caps, KeyId};
use std::io::Write;
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use transport::auth::{KeyRecord, Lookup, LookupFuture, Verifier};
use transport::frame::{Header, Hello, Kind, HEADER_LEN, HELLO_LEN, TRANSPORT_VERSION};
use transport::{
    Backend, ClientKeyFile, Connection, Credentials, Endpoint, Handler, HandlerFuture, Key,
    KeyTable, Listener, PeerIdentity, TransportConfig, TransportError,
};

const APP: u16 = 7;

/// Everything the tests' tracing writes, to find the servers' one-line reasons in.
static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOG.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_log() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        tracing_subscriber::fmt()
            .with_writer(|| LogWriter)
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .init();
    });
}

/// The log lines that contain every one of `parts`, waiting up to 5 s for one.
async fn log_lines(parts: &[&str]) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = String::from_utf8_lossy(&LOG.lock().unwrap()).to_string();
        let found: Vec<String> = text
            .lines()
            .filter(|l| parts.iter().all(|p| l.contains(p)))
            .map(str::to_string)
            .collect();
        if !found.is_empty() || Instant::now() > deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Answers every call with who the caller proved to be.
struct WhoAmI;

impl Handler for WhoAmI {
    fn handle(&self, conn: Connection, _request: Bytes) -> HandlerFuture {
        let who = format!("{:?}", conn.peer_identity());
        Box::pin(async move { Bytes::from(who) })
    }
}

fn config() -> TransportConfig {
    TransportConfig {
        call_timeout_ms: 5000,
        connect_timeout_ms: 2000,
        ..TransportConfig::default()
    }
}

fn plain(backend: Backend, config: TransportConfig) -> Endpoint {
    Endpoint::new(backend, config, APP).unwrap()
}

struct Server {
    listener: Listener,
    addr: String,
    table: Arc<KeyTable>,
    cluster: Key,
}

/// A server whose table knows `alice` ([`alice`]), and `bob` ([`bob`]), revoked.
async fn server(backend: Backend, config: TransportConfig, timeout_ms: u64) -> Server {
    let table = Arc::new(known_table());
    let ep = plain(backend, config)
        .with_verifier(table.clone())
        .with_handshake_timeout_ms(timeout_ms);
    let listener = ep.listen("127.0.0.1:0", Arc::new(WhoAmI)).await.unwrap();
    let addr = listener.local_addr().to_string();
    Server {
        listener,
        addr,
        table,
        cluster: cluster(),
    }
}

/// The table of [`server`].
fn known_table() -> KeyTable {
    let table = KeyTable::new(cluster());
    let record = |file: ClientKeyFile| KeyRecord {
        key_id: file.claim.key_id,
        caps: file.claim.caps,
        revoked: false,
    };
    table.insert("alice", record(alice()));
    table.insert("bob", record(bob()));
    table.revoke("bob");
    table
}

fn cluster() -> Key {
    Key::from_hex(&"c1".repeat(32)).unwrap()
}

/// Alice's key file: derived from [`cluster`] for the default capabilities.
fn alice() -> ClientKeyFile {
    ClientKeyFile::derive(&cluster(), "alice", KeyId([1; 16]), Caps::default())
}

/// Bob's, revoked on the [`server`].
fn bob() -> ClientKeyFile {
    ClientKeyFile::derive(&cluster(), "bob", KeyId([2; 16]), Caps::default())
}

fn client(backend: Backend, file: ClientKeyFile) -> Endpoint {
    plain(backend, config()).with_credentials(Credentials::client(file))
}

async fn call(conn: &Connection) -> Result<String, TransportError> {
    let reply = conn.call(Bytes::from_static(b"hi")).await?;
    Ok(String::from_utf8_lossy(&reply).to_string())
}

async fn good_key_gets_in_and_both_sides_know_who(backend: Backend) {
    let s = server(backend, config(), 5000).await;
    let conn = client(backend, alice()).connect(&s.addr).await.unwrap();
    let who = call(&conn).await.unwrap();
    assert!(
        who.contains("name: \"alice\"") && who.contains("Client(Caps"),
        "{who}"
    );
    let server_side = conn.peer_identity().unwrap();
    assert_eq!(server_side.role, transport::Role::Server);
    let srv = Credentials::server("data-1", s.cluster.clone());
    let ep = plain(backend, config()).with_credentials(srv);
    let who = call(&ep.connect(&s.addr).await.unwrap()).await.unwrap();
    assert!(
        who.contains("server/data-1") && who.contains("Server"),
        "{who}"
    );
}

async fn refusals_say_one_generic_line_to_the_client_and_the_reason_to_the_log(b: Backend) {
    capture_log();
    let s = server(b, config(), 5000).await;
    let carol = ClientKeyFile::derive(&cluster(), "carol", KeyId([3; 16]), Caps::default());
    let wrong_key = ClientKeyFile {
        key: Key::generate().unwrap(),
        ..alice()
    };
    let mut admin_claim = alice();
    admin_claim.claim.caps = Caps::admin();
    let cases = [
        (carol, "unknown client"),
        (wrong_key, "bad key"),
        (bob(), "revoked"),
        (admin_claim, "claims other capabilities"),
    ];
    let mut told = Vec::new();
    for (i, (file, reason)) in cases.into_iter().enumerate() {
        let name = file.name.clone();
        let name = name.as_str();
        let err = client(b, file).connect(&s.addr).await.unwrap_err();
        assert!(matches!(err, TransportError::Auth { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(!msg.contains('\n') && msg.contains(&s.addr), "{msg}");
        told.push(msg.replace(name, "NAME"));
        let from = match b {
            Backend::Mem => "from mem-client-",
            _ => "from 127.0.0.1:",
        };
        let server_says = format!("authentication of '{name}' {from}");
        let lines = log_lines(&[&server_says, &format!("refused: {reason}")]).await;
        assert_eq!(lines.len(), 1, "one server line for {name}: {lines:?}");
        let client_says = format!("the server at {} refused key '{name}'", s.addr);
        // Alice is refused twice: one line each time.
        let times = 1 + usize::from(i == 3);
        assert_eq!(
            log_lines(&[&client_says]).await.len(),
            times,
            "one client line"
        );
    }
    // The peer learns nothing more than "refused": the answers are the same.
    assert!(told.iter().all(|m| *m == told[0]), "{told:?}");
    assert!(!told[0].contains("bad key") && !told[0].contains("unknown client"));
    // The one who has the key is served all along.
    let conn = client(b, alice()).connect(&s.addr).await.unwrap();
    assert!(call(&conn).await.unwrap().contains("alice"));
    drop(s.table);
}

async fn keys_on_one_side_only_are_one_clear_line_on_both(b: Backend) {
    capture_log();
    let s = server(b, config(), 5000).await;
    let conn = plain(b, config()).connect(&s.addr).await.unwrap();
    let err = call(&conn).await.unwrap_err().to_string();
    assert!(
        err.contains("requires authentication") && !err.contains('\n'),
        "{err}"
    );
    let lines = log_lines(&["no key", &conn_peer_hint(b, &s)]).await;
    assert!(
        !lines.is_empty(),
        "the server says it refused a client without a key"
    );

    let insecure = plain(b, config());
    let open = insecure
        .listen("127.0.0.1:0", Arc::new(WhoAmI))
        .await
        .unwrap();
    let addr = open.local_addr().to_string();
    let err = client(b, alice()).connect(&addr).await.unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("without authentication") && msg.contains(&addr),
        "{msg}"
    );
    assert!(!msg.contains('\n'));
    assert!(!log_lines(&["refused a client that has a key"])
        .await
        .is_empty());
}

/// The server logs the peer's address; on mem that is the client endpoint's name, which
/// the test does not know, so it matches the refusal alone there.
fn conn_peer_hint(b: Backend, _s: &Server) -> String {
    match b {
        Backend::Mem => "refused".into(),
        _ => "127.0.0.1".into(),
    }
}

async fn a_silent_client_is_closed_at_the_handshake_timeout(b: Backend) {
    capture_log();
    let s = server(b, config(), 300).await;
    let t0 = Instant::now();
    let conn = plain(b, config()).connect(&s.addr).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !conn.is_closed() && b == Backend::Tcp {
        assert!(Instant::now() < deadline, "still open after 5 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!log_lines(&["timed out after 300 ms"]).await.is_empty());
    assert!(t0.elapsed() >= Duration::from_millis(300));
    // A request after the deadline finds the connection closed.
    assert!(call(&conn).await.is_err());
}

async fn half_open_flood_leaves_a_real_client_served(b: Backend) {
    let limited = TransportConfig {
        max_connections: 8,
        idle_close_ms: 0,
        ..config()
    };
    let s = server(b, limited, 500).await;
    let alice = client(b, alice()).connect(&s.addr).await.unwrap();
    let mut flood = Vec::new();
    for _ in 0..50 {
        if let Ok(c) = plain(b, config()).connect(&s.addr).await {
            flood.push(c);
        }
    }
    assert_eq!(
        flood.len(),
        7,
        "half-open handshakes count against max_connections"
    );
    for _ in 0..20 {
        assert!(call(&alice).await.unwrap().contains("alice"));
    }
    // The half-open ones time out and a new client gets in, before any deadline of ours.
    let carol = gets_in(b, &s.addr).await;
    assert!(call(&carol).await.unwrap().contains("alice"));
    assert!(call(&alice).await.unwrap().contains("alice"));
}

/// Guards against a half-open flood closing idle authenticated clients to make room
/// (the listener closed the idlest, a served mount, for each flood connection).
async fn a_flood_never_closes_an_idle_authenticated_client(b: Backend) {
    let limited = TransportConfig {
        max_connections: 8,
        max_unauthenticated_connections: 3,
        idle_close_ms: 100,
        ..config()
    };
    let s = server(b, limited, 500).await;
    let alice = client(b, alice()).connect(&s.addr).await.unwrap();
    assert!(call(&alice).await.unwrap().contains("alice"));
    // Alice goes idle past idle_close_ms, as an idle mount does: only time passing can.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut flood = Vec::new();
    for _ in 0..20 {
        if let Ok(c) = plain(b, config()).connect(&s.addr).await {
            flood.push(c);
        }
    }
    let served = call(&alice).await;
    assert!(served.is_ok(), "the flood closed alice: {served:?}");
    assert_eq!(
        flood.len(),
        3,
        "only max_unauthenticated_connections get in"
    );
    // Once the flood's handshakes time out, a new authenticated client gets in.
    let carol = gets_in(b, &s.addr).await;
    assert!(call(&carol).await.unwrap().contains("alice"));
    assert!(call(&alice).await.unwrap().contains("alice"));
}

/// A new client with alice's key, once one gets in (within 10 s: a flood's
/// handshakes time out first).
async fn gets_in(b: Backend, addr: &str) -> Connection {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match client(b, alice()).connect(addr).await {
            Ok(c) => return c,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("never got in: {e}"),
        }
    }
}

async fn revoking_closes_the_live_connection(b: Backend) {
    let s = server(b, config(), 5000).await;
    let conn = client(b, alice()).connect(&s.addr).await.unwrap();
    call(&conn).await.unwrap();
    s.table.revoke("alice");
    assert_eq!(s.listener.close_peer("alice"), 1);
    assert!(call(&conn).await.is_err());
    let err = client(b, alice()).connect(&s.addr).await.unwrap_err();
    assert!(err.to_string().contains("refused key 'alice'"), "{err}");
}

/// Guards against a key made again under the same name leaving the previous key valid,
/// or a revocation of the previous key closing the new key's connections.
async fn a_key_made_again_supersedes_the_previous_one(b: Backend) {
    let s = server(b, config(), 5000).await;
    let old = client(b, alice()).connect(&s.addr).await.unwrap();
    let new = ClientKeyFile::derive(&cluster(), "alice", KeyId([9; 16]), Caps::default());
    s.table.insert(
        "alice",
        KeyRecord {
            key_id: new.claim.key_id,
            caps: new.claim.caps.clone(),
            revoked: false,
        },
    );
    let fresh = client(b, new).connect(&s.addr).await.unwrap();
    let err = client(b, alice()).connect(&s.addr).await.unwrap_err();
    assert!(err.to_string().contains("refused key 'alice'"), "{err}");
    assert_eq!(s.listener.close_key("alice", &KeyId([1; 16])), 1);
    assert!(
        call(&old).await.is_err(),
        "the old key's connection is closed"
    );
    assert!(
        call(&fresh).await.unwrap().contains("alice"),
        "the new one is not"
    );
}

/// When a [`Racing`] verifier runs the revocation of the key being checked.
#[derive(Clone, Copy, Debug)]
enum Stage {
    /// After the `Hello`, as the `Proof` is checked: the lookup sees it.
    AtLookup,
    /// Just after the lookup read the table (a stale "known"), before the connection is
    /// marked as alice's: the revocation's closing finds nothing to close, so only the
    /// gate's check after marking it can refuse her.
    AfterLookup,
    /// Between the last check of the key and the end of the handshake: the check missed
    /// it, so the revocation's closing of the key's connections must reach this one.
    AfterCheck,
}

/// [`known_table`]'s verifier, revoking alice (her record, then her connections, as a
/// revocation does) at a chosen point of her handshake.
struct Racing {
    table: Arc<KeyTable>,
    listener: std::sync::OnceLock<std::sync::Weak<Listener>>,
    stage: Stage,
}

impl Racing {
    fn revoke_alice(&self) {
        self.table.revoke("alice");
        let l = self
            .listener
            .get()
            .and_then(std::sync::Weak::upgrade)
            .unwrap();
        l.close_peer("alice");
    }
}

impl Verifier for Racing {
    fn lookup(&self, name: &str, claim: Option<&proto::auth::Claim>) -> LookupFuture {
        if matches!(self.stage, Stage::AtLookup) && name == "alice" {
            self.revoke_alice();
        }
        if matches!(self.stage, Stage::AfterLookup) && name == "alice" {
            let stale = self.table.lookup_now(name, claim);
            self.revoke_alice();
            return Box::pin(async move { stale });
        }
        self.table.lookup(name, claim)
    }

    fn revoked(&self, who: &PeerIdentity) -> bool {
        let seen = self.table.revoked(who);
        if matches!(self.stage, Stage::AfterCheck) && who.name == "alice" {
            self.revoke_alice();
        }
        seen
    }
}

/// Guards against a handshake racing a revocation staying authenticated: revoked
/// between the `Hello` and the check of the `Proof`, just after the lookup, or right
/// after the last check, alice ends refused or closed, never served.
async fn a_handshake_racing_a_revocation_ends_refused_or_closed(b: Backend) {
    for stage in [Stage::AtLookup, Stage::AfterLookup, Stage::AfterCheck] {
        let racing = Arc::new(Racing {
            table: Arc::new(known_table()),
            listener: std::sync::OnceLock::new(),
            stage,
        });
        let ep = plain(b, config()).with_verifier(racing.clone());
        let listener = Arc::new(ep.listen("127.0.0.1:0", Arc::new(WhoAmI)).await.unwrap());
        racing.listener.set(Arc::downgrade(&listener)).unwrap();
        let addr = listener.local_addr().to_string();
        let served = match client(b, alice()).connect(&addr).await {
            Ok(conn) => call(&conn).await,
            Err(e) => Err(e),
        };
        assert!(
            served.is_err(),
            "{stage:?}: served after a revocation: {served:?}"
        );
        assert!(
            client(b, alice()).connect(&addr).await.is_err(),
            "{stage:?}"
        );
    }
}

/// A verifier that cannot tell now, as a data server whose metadata server is away.
struct Away;

impl Verifier for Away {
    fn lookup(&self, _name: &str, _claim: Option<&proto::auth::Claim>) -> LookupFuture {
        Box::pin(async { Lookup::Unavailable })
    }

    fn revoked(&self, _who: &PeerIdentity) -> bool {
        false
    }
}

/// Guards against a client taking "cannot check your key now" for a refusal of its key:
/// its first connection to a data server during a metadata outage failed with EACCES
/// (an fsync across a metadata restart) instead of waiting for the server.
async fn a_name_that_cannot_be_checked_now_is_a_server_away(b: Backend) {
    let ep = plain(b, config()).with_verifier(Arc::new(Away));
    let listener = ep.listen("127.0.0.1:0", Arc::new(WhoAmI)).await.unwrap();
    let err = client(b, alice())
        .connect(&listener.local_addr().to_string())
        .await
        .unwrap_err();
    assert!(err.never_connected(), "{err:?}");
    assert!(!err.to_string().contains("refused key"), "{err}");
}

macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        mod tcp {
            $(#[tokio::test]
            async fn $name() {
                super::$name(transport::Backend::Tcp).await
            })*
        }
        mod mem {
            $(#[tokio::test]
            async fn $name() {
                super::$name(transport::Backend::Mem).await
            })*
        }
    };
}

on_both!(
    good_key_gets_in_and_both_sides_know_who,
    refusals_say_one_generic_line_to_the_client_and_the_reason_to_the_log,
    keys_on_one_side_only_are_one_clear_line_on_both,
    a_silent_client_is_closed_at_the_handshake_timeout,
    half_open_flood_leaves_a_real_client_served,
    a_flood_never_closes_an_idle_authenticated_client,
    revoking_closes_the_live_connection,
    a_key_made_again_supersedes_the_previous_one,
    a_handshake_racing_a_revocation_ends_refused_or_closed,
    a_name_that_cannot_be_checked_now_is_a_server_away,
);

/// A fake server's connection (raw tcp frames): accepted, the client's transport
/// handshake read and answered as a Tessera server would.
async fn accept_with_hello(sock: &tokio::net::TcpListener) -> tokio::net::TcpStream {
    let (mut s, _) = sock.accept().await.unwrap();
    let mut hb = [0u8; HELLO_LEN];
    s.read_exact(&mut hb).await.unwrap();
    let hello = Hello {
        transport_version: TRANSPORT_VERSION,
        app_version: APP,
        max_msg_bytes: 1 << 20,
        status: 0,
    };
    s.write_all(&hello.encode()).await.unwrap();
    s
}

/// A fake server (raw tcp frames) that challenges but cannot prove the key.
#[tokio::test]
async fn a_server_that_cannot_prove_the_key_is_refused_by_the_client() {
    capture_log();
    let sock = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap().to_string();
    let fake = tokio::spawn(async move {
        let mut s = accept_with_hello(&sock).await;
        let replies = [
            AuthReply::Challenge { nonce: [9; 32] },
            AuthReply::Welcome { mac: [0; 32] },
        ];
        for reply in replies {
            let mut h = [0u8; HEADER_LEN];
            s.read_exact(&mut h).await.unwrap();
            let call = Header::decode(&h);
            let mut body = vec![0u8; call.len as usize];
            s.read_exact(&mut body).await.unwrap();
            let payload = proto::auth::encode_reply(&reply).unwrap();
            let mut r = Header::new(Kind::Reply, call.id);
            r.len = payload.len() as u32;
            s.write_all(&r.encode()).await.unwrap();
            s.write_all(&payload).await.unwrap();
        }
        s
    });
    let err = client(Backend::Tcp, alice())
        .connect(&addr)
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("did not prove the key") && msg.contains(&addr),
        "{msg}"
    );
    assert!(!log_lines(&["did not prove the key", &addr])
        .await
        .is_empty());
    drop(fake.await.unwrap());
}

/// Guards against a server that died between the transport's handshake and the key
/// exchange failing the caller's call for good: nothing was asked of it, so the
/// connect is one never made (a client moves on to the next address, or waits).
#[tokio::test]
async fn a_server_gone_before_the_key_exchange_was_never_connected() {
    let sock = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap().to_string();
    let fake = tokio::spawn(async move {
        let mut s = accept_with_hello(&sock).await;
        let mut h = [0u8; HEADER_LEN];
        s.read_exact(&mut h).await.unwrap();
    });
    let err = client(Backend::Tcp, alice())
        .connect(&addr)
        .await
        .unwrap_err();
    assert!(err.never_connected(), "{err:?}");
    assert!(err.to_string().contains("during the handshake"), "{err}");
    fake.await.unwrap();
}
