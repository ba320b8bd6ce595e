//! Authentication of a whole cluster (issue 23): a client with no key, a wrong key or a
//! revoked key is refused by the metadata server and by a data server, in one line;
//! other clients go on; keys are managed through the real `tessera` binary; a server
//! refuses a non-loopback address without a key.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use data_server::keys::CLIENT_KEY_TTL;
use proto::auth::Caps;
use proto::PROTOCOL_VERSION;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_tests::{InProcessCluster, ProcessCluster};
use transport::{Backend, Connection, Credentials, Endpoint, Key, TransportConfig, TransportError};

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

/// Connects straight to `addr` with the transport as `name`/`key` (no key: `None`),
/// and makes one call.
async fn raw_conn(addr: &str, who: Option<(&str, Key)>) -> Result<Connection, TransportError> {
    let mut ep = Endpoint::new(Backend::Tcp, TransportConfig::default(), PROTOCOL_VERSION)?;
    if let Some((name, key)) = who {
        ep = ep.with_credentials(Credentials {
            name: name.to_string(),
            key,
        });
    }
    let conn = ep.connect(addr).await?;
    // A message the server does not know: served (answered) only once authenticated.
    conn.call(bytes::Bytes::from_static(&[0xee])).await?;
    Ok(conn)
}

async fn raw_connect(addr: &str, who: Option<(&str, Key)>) -> Result<(), TransportError> {
    raw_conn(addr, who).await.map(drop)
}

fn one_line(msg: &str) {
    assert!(!msg.trim().contains('\n'), "one line: {msg}");
}

async fn make_key(cluster: &InProcessCluster, admin: &fs_client::Client, name: &str) -> Key {
    let hex = admin.key_create(name, Caps::default()).await.unwrap();
    let key = Key::from_hex(&hex).unwrap();
    key.save(&cluster.dir().join(format!("{name}.key")))
        .unwrap();
    key
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
    // A client's key is good at a data server too (it asks the metadata server).
    raw_connect(&data, Some(("alice", alice_key)))
        .await
        .unwrap();

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
    Key::generate().unwrap().save(&wrong).unwrap();
    let err = client_as(&cluster, "alice", &wrong).await.err().unwrap();
    assert!(err.contains("refused key 'alice'"), "{err}");
    one_line(&err);
    let err = raw_connect(&data, Some(("alice", Key::generate().unwrap())))
        .await
        .unwrap_err();
    assert!(matches!(err, TransportError::Auth { .. }), "{err}");

    // Revoked: bob's live connection closes at once, his next handshakes are refused
    // by the metadata server and by the data server, which asks it; the data server
    // closes his connection to it when it asks again.
    let bob_at_data = raw_conn(&data, Some(("bob", bob_key.clone())))
        .await
        .unwrap();
    admin.key_revoke("bob").await.unwrap();
    assert!(
        bob.statfs().await.is_err(),
        "bob's connection outlived his key"
    );
    let err = raw_connect(&meta, Some(("bob", bob_key.clone())))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("refused key 'bob'"), "{err}");
    let deadline = Instant::now() + 2 * CLIENT_KEY_TTL + Duration::from_secs(5);
    let err = loop {
        // The data server may still have bob's key from before, for CLIENT_KEY_TTL.
        match raw_connect(&data, Some(("bob", bob_key.clone()))).await {
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
        .key_create("mallory", Caps::default())
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
        .with_credentials(Credentials {
            name: "carol".into(),
            key: carol_key,
        });
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
    assert!(Key::from_hex(key.trim()).is_some(), "printed: {key}");
    let (code, text) = cluster.tessera(&["key", "list"]);
    assert_eq!(code, 0);
    assert!(text.contains("dave path=/ rw\n"), "{text}");
    assert!(text.contains("erin path=/teamA ro root_squash\n"), "{text}");
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
    assert!(text.contains("dave path=/ rw REVOKED"), "{text}");
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
    raw_connect(&cluster.data_addr(0), Some(("frank", frank_key)))
        .await
        .unwrap();
}
