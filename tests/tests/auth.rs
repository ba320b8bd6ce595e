//! Authentication of a whole cluster (issue 23): a client with no key, a wrong key or a
//! revoked key is refused by the metadata server and by a data server, in one line;
//! other clients go on; keys are managed through the real `tessera` binary; a server
//! refuses a non-loopback address without a key. Client keys are derived from the
//! cluster key: a data server checks one with its metadata server stopped, and refuses
//! a claim of capabilities the key was not derived for.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use data_server::keys::REVOCATION_POLL;
use proto::auth::{Caps, KeyId};
use proto::data::Usage;
use proto::{Request, PROTOCOL_VERSION};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_tests::{InProcessCluster, ProcessCluster};
use transport::{
    Backend, ClientKeyFile, Connection, Credentials, Endpoint, Key, TransportConfig, TransportError,
};

/// A client named `name` with the key in `key_file`.
async fn client_as(
    cluster: &InProcessCluster,
    name: &str,
    key_file: &Path,
) -> Result<Arc<fs_client::Client>, String> {
    let mut c = cluster.client_config();
    c.key_file = key_file.to_path_buf();
    c.client_name = name.to_string();
    fs_client::Client::connect(c)
        .await
        .map_err(|e| e.to_string())
}

/// Connects straight to `addr` with the transport with the key `who` (no key: `None`),
/// and makes one call.
async fn raw_conn(addr: &str, who: Option<ClientKeyFile>) -> Result<Connection, TransportError> {
    let mut ep = Endpoint::new(Backend::Tcp, TransportConfig::default(), PROTOCOL_VERSION)?;
    if let Some(file) = who {
        ep = ep.with_credentials(Credentials::client(file));
    }
    let conn = ep.connect(addr).await?;
    // A message the server does not know: served (answered) only once authenticated.
    conn.call(bytes::Bytes::from_static(&[0xee])).await?;
    Ok(conn)
}

async fn raw_connect(addr: &str, who: Option<ClientKeyFile>) -> Result<(), TransportError> {
    raw_conn(addr, who).await.map(drop)
}

fn one_line(msg: &str) {
    assert!(!msg.trim().contains('\n'), "one line: {msg}");
}

/// Derives a key for `name` from the cluster key, as `tessera key create` does, records
/// it at the metadata server and saves it as `<name>.key`.
async fn make_key(
    cluster: &InProcessCluster,
    admin: &fs_client::Client,
    name: &str,
) -> ClientKeyFile {
    cluster.make_client_key(admin, name, Caps::default()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_wrong_or_revoked_keys_are_refused_by_metadata_and_data_servers() {
    let cluster = InProcessCluster::start(1).await;
    let admin = cluster.client().await;
    let alice_key = make_key(&cluster, &admin, "alice").await;
    let bob_key = make_key(&cluster, &admin, "bob").await;
    let alice = client_as(&cluster, "alice", &cluster.dir().join("alice.key"))
        .await
        .unwrap();
    let bob = client_as(&cluster, "bob", &cluster.dir().join("bob.key"))
        .await
        .unwrap();
    alice.statfs().await.unwrap();
    bob.statfs().await.unwrap();
    let (meta, data) = (cluster.meta_addr(), cluster.data_addr(0));
    // A client's key is good at a data server too (derived there).
    raw_connect(&data, Some(alice_key.clone())).await.unwrap();

    // No key: one line that says the server requires authentication, on both servers.
    let mut c = cluster.client_config();
    c.key_file = Default::default();
    let err = fs_client::Client::connect(c)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("requires authentication"), "{err}");
    one_line(&err);
    let err = raw_connect(&data, None).await.unwrap_err().to_string();
    assert!(err.contains("requires authentication"), "{err}");
    one_line(&err);

    // A wrong key: refused, by name, without saying which part was wrong.
    let wrong = cluster.dir().join("wrong.key");
    let wrong_key = ClientKeyFile {
        key: Key::generate().unwrap(),
        ..alice_key.clone()
    };
    wrong_key.save(&wrong).unwrap();
    let err = client_as(&cluster, "alice", &wrong).await.err().unwrap();
    assert!(err.contains("refused key 'alice'"), "{err}");
    one_line(&err);
    let err = raw_connect(&data, Some(wrong_key)).await.unwrap_err();
    assert!(matches!(err, TransportError::Auth { .. }), "{err}");

    // A claim of a capability the key was not derived for (admin): refused by both.
    let mut claims_admin = alice_key.clone();
    claims_admin.claim.caps = Caps::admin();
    for addr in [&meta, &data] {
        let err = raw_connect(addr, Some(claims_admin.clone()))
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("refused key 'alice'"),
            "{addr}: {err}"
        );
    }

    // Revoked: bob's live connection closes at once, his next handshakes are refused
    // by the metadata server, and by the data server once it pulls the revocation list
    // (every REVOCATION_POLL), when it also closes his connection to it.
    let bob_at_data = raw_conn(&data, Some(bob_key.clone())).await.unwrap();
    admin.key_revoke("bob").await.unwrap();
    assert!(
        bob.statfs().await.is_err(),
        "bob's connection outlived his key"
    );
    let err = raw_connect(&meta, Some(bob_key.clone())).await.unwrap_err();
    assert!(err.to_string().contains("refused key 'bob'"), "{err}");
    let deadline = Instant::now() + REVOCATION_POLL + Duration::from_secs(5);
    let err = loop {
        // The data server takes bob until its next pull of the list.
        match raw_connect(&data, Some(bob_key.clone())).await {
            Err(e) => break e,
            Ok(()) => assert!(Instant::now() < deadline, "the data server still takes bob"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(err.to_string().contains("refused key 'bob'"), "{err}");
    one_line(&err.to_string());
    while !bob_at_data.is_closed() {
        assert!(
            Instant::now() < deadline,
            "the data server kept bob's connection"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Everyone else goes on; a key without the admin capability manages no keys.
    alice.statfs().await.unwrap();
    admin.statfs().await.unwrap();
    let err = alice
        .key_create("mallory", KeyId([7; 16]), Caps::default(), false)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not permitted"), "{err}");
    let names: Vec<_> = admin.key_list().await.unwrap();
    assert!(names.iter().any(|k| k.name == "bob" && k.revoked));
    assert!(names.iter().any(|k| k.name == "alice" && !k.revoked));
    assert!(!names.iter().any(|k| k.name == "mallory"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revoking_a_key_closes_the_clients_live_connection() {
    let cluster = InProcessCluster::start(1).await;
    let admin = cluster.client().await;
    let carol_key = make_key(&cluster, &admin, "carol").await;
    let ep = Endpoint::new(Backend::Tcp, TransportConfig::default(), PROTOCOL_VERSION)
        .unwrap()
        .with_credentials(Credentials::client(carol_key));
    let conn = ep.connect(&cluster.meta_addr()).await.unwrap();
    assert!(!conn.is_closed());
    admin.key_revoke("carol").await.unwrap();
    // The revocation's reply comes after the close: no waiting needed.
    assert!(conn.is_closed() || conn.call(bytes::Bytes::from_static(&[0])).await.is_err());
}

/// `tessera key create/list/revoke` through the binary, against real processes.
#[test]
fn key_commands_through_the_tessera_binary() {
    let cluster = ProcessCluster::start(1);
    let out_file = cluster.dir().join("dave.key");
    let out_arg = out_file.to_string_lossy().to_string();
    let create = [
        "key",
        "create",
        "dave",
        "--no-root-squash",
        "--out",
        &out_arg,
    ];
    let (code, text) = cluster.tessera(&create);
    assert_eq!(code, 0, "{text}");
    let mode = std::fs::metadata(&out_file).unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );
    let create = ["key", "create", "erin", "--path", "/teamA", "--read-only"];
    let (code, key) = cluster.tessera(&create);
    assert_eq!(code, 0);
    let erin = ClientKeyFile::from_line(key.trim()).unwrap();
    assert_eq!(erin.claim.caps.path, b"/teamA");
    // Made again by mistake, erin's key is refused and stays erin's; --replace rotates it.
    let again = Command::new(tessera_tests::process::bin_dir().join("tessera"))
        .args(create)
        .args(["--meta", cluster.meta_addr(), "--key-file"])
        .arg(cluster.key_file(tessera_tests::process::ADMIN_KEY))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        !again.status.success(),
        "a second key create replaced erin's key"
    );
    assert!(
        err.contains("has a valid key") && err.contains("--replace"),
        "{err}"
    );
    let (_, listed) = cluster.tessera(&["key", "list"]);
    assert!(listed.contains(&erin.claim.key_id.to_string()), "{listed}");
    let mut rotate = create.to_vec();
    rotate.push("--replace");
    let (code, key) = cluster.tessera(&rotate);
    assert_eq!(code, 0, "{key}");
    let erin = ClientKeyFile::from_line(key.trim()).unwrap();
    let dave = ClientKeyFile::load(&out_file).unwrap();
    let (code, text) = cluster.tessera(&["key", "list"]);
    assert_eq!(code, 0);
    let dave_line = format!("dave id={} path=/ rw\n", dave.claim.key_id);
    let erin_line = format!("erin id={} path=/teamA ro root_squash\n", erin.claim.key_id);
    assert!(text.contains(&dave_line), "{text}");
    assert!(text.contains(&erin_line), "{text}");
    // dave is no administrator: he may not list keys.
    let (code, _) = cluster.tessera(&["key", "list", "--key-file", &out_arg]);
    assert_ne!(code, 0, "a non-admin key listed the keys");
    // dave mounts with his key and works.
    let config = format!("key_file = {out_arg:?}\nclient_name = \"dave\"\n");
    let mount = cluster.mount_with_config("dave", &config);
    std::fs::write(mount.path.join("before"), b"x").unwrap();
    let (code, _) = cluster.tessera(&["key", "revoke", "dave"]);
    assert_eq!(code, 0);
    // His mount's connection is closed and its next handshake refused: EACCES.
    let err = std::fs::write(mount.path.join("after"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EACCES), "{err}");
    assert!(mount.log_text().contains("refused key 'dave'"));
    drop(mount);
    let (_, text) = cluster.tessera(&["key", "list"]);
    assert!(text.contains("path=/ rw REVOKED"), "{text}");

    // Without a cluster key file to derive from, `key create` fails in one line.
    let lone = cluster.dir().join("lone");
    std::fs::create_dir(&lone).unwrap();
    let admin_copy = lone.join("admin.key");
    ClientKeyFile::load(&cluster.key_file(tessera_tests::process::ADMIN_KEY))
        .unwrap()
        .save(&admin_copy)
        .unwrap();
    let out = Command::new(tessera_tests::process::bin_dir().join("tessera"))
        .args([
            "key",
            "create",
            "fred",
            "--meta",
            cluster.meta_addr(),
            "--key-file",
        ])
        .arg(&admin_copy)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--cluster-key-file"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// Guards against a server that listens beyond loopback with nobody authenticated.
#[test]
fn a_server_refuses_a_non_loopback_address_without_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let bin = tessera_tests::process::bin_dir();
    let data_dir = dir.path().join("meta").to_string_lossy().to_string();
    // Refused before it binds anything: no traffic leaves 127.0.0.1.
    let out = Command::new(bin.join("tessera-meta"))
        .args(["--listen", "0.0.0.0:0", "--data-dir", &data_dir])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--insecure") && err.contains("0.0.0.0:0"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let data = dir.path().join("data").to_string_lossy().to_string();
    let out = Command::new(bin.join("tessera-data"))
        .args(["--listen", "0.0.0.0:0", "--data-dir", &data])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--insecure"), "{err}");
}

/// `--insecure` (here on loopback, as every test server) runs without keys and says so
/// in the log at every start; clients without keys are served.
#[test]
fn an_insecure_cluster_serves_without_keys_and_warns_at_every_start() {
    let mut cluster = ProcessCluster::start_with(tessera_tests::ClusterOptions {
        data_servers: 1,
        insecure: true,
        ..Default::default()
    });
    let (code, text) = cluster.tessera(&["status"]);
    assert_eq!(code, 0, "{text}");
    cluster.restart_meta();
    let log = std::fs::read_to_string(cluster.dir().join("meta.log")).unwrap();
    assert_eq!(log.matches("WITHOUT authentication").count(), 2, "{log}");
    let log = std::fs::read_to_string(cluster.dir().join("data-0.log")).unwrap();
    assert!(log.contains("WITHOUT authentication"), "{log}");
}

/// The data server's address in a process cluster.
fn data_addr(cluster: &ProcessCluster, i: usize) -> String {
    let file = cluster.dir().join(format!("data-{i}.addr"));
    std::fs::read_to_string(file).unwrap().trim().to_string()
}

/// Connects to `addr` with the key file at `path` and asks for the disk usage (an
/// admin call): `Err` if the handshake fails, `Ok(Err)` if the call is refused.
async fn usage_with(
    addr: &str,
    key: ClientKeyFile,
) -> Result<Result<proto::data::DiskUsage, data_server::DataError>, TransportError> {
    let ep = Endpoint::new(Backend::Tcp, TransportConfig::default(), PROTOCOL_VERSION)?
        .with_credentials(Credentials::client(key));
    let conn = ep.connect(addr).await?;
    let limit = TransportConfig::default().max_msg_bytes;
    Ok(transport::rpc::call(&conn, &Request::new(Usage), limit).await)
}

/// Guards against a data server needing the metadata server to check a client (it
/// asked it for the key; during an outage a new client could not connect): with
/// tessera-meta stopped, a data server authenticates keys made before, derived by the
/// `tessera` binary, and serves them, and still refuses a wrong claim.
#[test]
fn a_data_server_checks_new_clients_with_the_metadata_server_stopped() {
    let mut cluster = ProcessCluster::start(1);
    let (ops, plain) = (
        cluster.dir().join("ops.key"),
        cluster.dir().join("plain.key"),
    );
    for (name, file, flag) in [("ops", &ops, "--admin"), ("plain", &plain, "--read-only")] {
        let out = file.to_string_lossy().to_string();
        let (code, text) = cluster.tessera(&["key", "create", name, flag, "--out", &out]);
        assert_eq!(code, 0, "{text}");
    }
    let data = data_addr(&cluster, 0);
    cluster.kill_meta();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // Served: the admin call answers the disk usage.
        let ops_key = ClientKeyFile::load(&ops).unwrap();
        let usage = usage_with(&data, ops_key).await.unwrap().unwrap();
        assert!(usage.capacity_bytes > 0, "{usage:?}");
        // Authenticated, and refused by the application only: plain is no admin.
        let plain_key = ClientKeyFile::load(&plain).unwrap();
        let refused = usage_with(&data, plain_key.clone()).await.unwrap();
        assert!(refused.unwrap_err().to_string().contains("admin"));
        // A claim of admin with plain's key fails the handshake itself.
        let mut claims_admin = plain_key;
        claims_admin.claim.caps = Caps::admin();
        let err = usage_with(&data, claims_admin).await.unwrap_err();
        assert!(err.to_string().contains("refused key 'plain'"), "{err}");
    });
}

/// Guards against a revoked or superseded key staying valid at a data server: within
/// the poll period every data server refuses it and closes its connections, and one
/// made again under the same name is served there while the old one is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_data_server_refuses_a_revoked_or_superseded_key_within_the_poll() {
    let cluster = InProcessCluster::start(2).await;
    let admin = cluster.client().await;
    let old = make_key(&cluster, &admin, "hank").await;
    let ivy = make_key(&cluster, &admin, "ivy").await;
    let addrs = [cluster.data_addr(0), cluster.data_addr(1)];
    let mut live = Vec::new();
    for addr in &addrs {
        live.push(raw_conn(addr, Some(old.clone())).await.unwrap());
        live.push(raw_conn(addr, Some(ivy.clone())).await.unwrap());
    }
    let new = make_key(&cluster, &admin, "hank").await;
    admin.key_revoke("ivy").await.unwrap();
    let t0 = Instant::now();
    let deadline = t0 + REVOCATION_POLL + Duration::from_secs(5);
    while live.iter().any(|c| !c.is_closed()) {
        assert!(
            Instant::now() < deadline,
            "a data server kept a revoked key's connection"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for addr in &addrs {
        for gone in [&old, &ivy] {
            let err = raw_connect(addr, Some(gone.clone())).await.unwrap_err();
            assert!(err.to_string().contains("refused key"), "{addr}: {err}");
        }
        raw_connect(addr, Some(new.clone())).await.unwrap();
    }
    eprintln!(
        "revocations reached every data server in {:?}",
        t0.elapsed()
    );
}

/// Guards against client keys living only in the metadata server's memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_keys_and_revocations_survive_a_metadata_server_restart() {
    let mut cluster = InProcessCluster::start(1).await;
    let admin = cluster.client().await;
    let frank_key = make_key(&cluster, &admin, "frank").await;
    make_key(&cluster, &admin, "gina").await;
    admin.key_revoke("gina").await.unwrap();
    drop(admin);
    cluster.restart_meta().await;
    let frank = client_as(&cluster, "frank", &cluster.dir().join("frank.key"))
        .await
        .unwrap();
    frank.statfs().await.unwrap();
    let err = client_as(&cluster, "gina", &cluster.dir().join("gina.key"))
        .await
        .err()
        .unwrap();
    assert!(err.contains("refused key 'gina'"), "{err}");
    raw_connect(&cluster.data_addr(0), Some(frank_key))
        .await
        .unwrap();
}
