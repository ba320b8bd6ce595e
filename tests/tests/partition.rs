//! A network partition of one data server, made with a network namespace and a veth pair
//! that this test creates and removes: the cluster takes the server out, keeps serving
//! reads and writes, and takes it back (after a resync) once the partition heals.
//!
//! Addresses are this test's own: 10.213.N.1 on the host side (the metadata server, two
//! data servers, the client) and 10.213.N.2 inside the namespace (the third data server).
//! Needs root and `ip` (iproute2), as CI has.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use fs_client::{Client, ClientConfig};
use proto::meta::MemberState;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_tests::client_io::{read_whole, write_fsync};
use tessera_tests::{pseudo_random, ClusterOptions, ProcessCluster};

const MIB: usize = 1 << 20;
const HEAL: Duration = Duration::from_secs(120);

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running ip {args:?} (iproute2 is needed): {e}"));
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace joined to the host by a veth pair; removed on drop (which also
/// removes the pair).
struct Netns {
    name: String,
    inner_if: String,
    host_addr: String,
    inner_addr: String,
}

impl Netns {
    fn create() -> Netns {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(euid, 0, "the partition test needs root");
        let id = std::process::id() % 10_000;
        let net = 1 + std::process::id() % 250;
        let n = Netns {
            name: format!("tsr-part-{id}"),
            inner_if: format!("tsrn{id}"),
            host_addr: format!("10.213.{net}.1"),
            inner_addr: format!("10.213.{net}.2"),
        };
        let host_if = format!("tsrh{id}");
        let _ = Command::new("ip").args(["netns", "del", &n.name]).output();
        ip(&["netns", "add", &n.name]);
        // From here on the guard removes what exists.
        ip(&[
            "link",
            "add",
            &host_if,
            "type",
            "veth",
            "peer",
            "name",
            &n.inner_if,
        ]);
        ip(&["link", "set", &n.inner_if, "netns", &n.name]);
        ip(&[
            "addr",
            "add",
            &format!("{}/30", n.host_addr),
            "dev",
            &host_if,
        ]);
        ip(&["link", "set", &host_if, "up"]);
        n.exec(&[
            "ip",
            "addr",
            "add",
            &format!("{}/30", n.inner_addr),
            "dev",
            &n.inner_if,
        ]);
        n.exec(&["ip", "link", "set", &n.inner_if, "up"]);
        n.exec(&["ip", "link", "set", "lo", "up"]);
        n
    }

    fn exec(&self, cmd: &[&str]) {
        let mut args = vec!["netns", "exec", &self.name];
        args.extend_from_slice(cmd);
        ip(&args);
    }

    /// Cuts the namespace off: its end of the pair goes down.
    fn partition(&self) {
        self.exec(&["ip", "link", "set", &self.inner_if, "down"]);
    }

    fn heal(&self) {
        self.exec(&["ip", "link", "set", &self.inner_if, "up"]);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Waits until `node`'s memberships are all in `state` (and, for serving, every chain
/// is whole again).
async fn wait_member(c: &Client, node: proto::NodeId, state: MemberState) {
    let deadline = Instant::now() + HEAL;
    loop {
        let map = c.cluster_map().await.unwrap();
        let all = map
            .chains
            .iter()
            .flat_map(|ch| ch.members.iter())
            .filter(|m| m.node == node)
            .all(|m| m.state == state);
        let whole = state != MemberState::Serving || tessera_tests::healthy(&map);
        if all && whole {
            return;
        }
        assert!(Instant::now() < deadline, "{node} never {state:?}: {map:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partitioned_data_server_is_taken_out_and_back_while_the_cluster_serves() {
    let ns = Netns::create();
    let mut opts = ClusterOptions {
        data_servers: 3,
        namespace_toml: "node_lease_ms = 1500".into(),
        heartbeat_ms: 200,
        data_toml: "[transport_limits]\ncall_timeout_ms = 3000\nconnect_timeout_ms = 2000".into(),
        host: ns.host_addr.clone(),
        ..ClusterOptions::default()
    };
    let prefix = ["ip", "netns", "exec", &ns.name].map(String::from).to_vec();
    opts.data_hosts.insert(2, (prefix, ns.inner_addr.clone()));
    let cluster = ProcessCluster::start_with(opts);
    let mut config = ClientConfig {
        ..cluster.client_config()
    };
    config.transport_limits.call_timeout_ms = 3000;
    config.transport_limits.connect_timeout_ms = 2000;
    let c: Arc<Client> = Client::connect(config).await.unwrap();
    let map = c.cluster_map().await.unwrap();
    let inner = map
        .nodes
        .iter()
        .find(|n| n.addr.starts_with(&ns.inner_addr))
        .expect("the namespaced server registered")
        .node;
    wait_member(&c, inner, MemberState::Serving).await;
    let before = pseudo_random(12 * MIB, 1);
    write_fsync(&c, "before.bin", &before).await.unwrap();

    ns.partition();
    eprintln!("partitioned {inner}");
    wait_member(&c, inner, MemberState::Offline).await;
    // The cluster keeps serving: reads of old data, new writes.
    assert!(read_whole(&c, "before.bin").await.unwrap() == before);
    let during = pseudo_random(12 * MIB, 2);
    write_fsync(&c, "during.bin", &during).await.unwrap();
    assert!(read_whole(&c, "during.bin").await.unwrap() == during);

    ns.heal();
    eprintln!("healed");
    wait_member(&c, inner, MemberState::Serving).await;
    let (code, out) = cluster.tessera(&["fsck"]);
    assert_eq!(code, 0, "tessera fsck after the partition healed:\n{out}");
    let fresh = Client::connect(ClientConfig {
        ..cluster.client_config()
    })
    .await
    .unwrap();
    assert!(read_whole(&fresh, "before.bin").await.unwrap() == before);
    assert!(read_whole(&fresh, "during.bin").await.unwrap() == during);
    drop(cluster);
    drop(ns);
}
