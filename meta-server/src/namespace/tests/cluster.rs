//! Data server registration, heartbeats, membership of chains, the cluster map and statfs.

use super::{code, engine_tests, H};
use crate::kv::StoreKind;
use crate::namespace::ConnId;
use crate::{ManualClock, NamespaceConfig};
use proto::meta::cluster::{GetMap, Heartbeat};
use proto::meta::{ClusterMap, MemberState, ResyncReport};
use proto::{ChainId, ErrorCode, NodeId};
use std::sync::Arc;
use std::time::Duration;

fn beat(h: &H, node: NodeId) -> ClusterMap {
    h.ns()
        .heartbeat(node, 1, 0, &[], 0, ResyncReport::default())
        .unwrap();
    h.ns().cluster_map().unwrap()
}

/// Reports a finished resync pass of every chain `node` syncs in, at `map`'s version.
fn synced(h: &H, node: NodeId, map: &ClusterMap) -> ClusterMap {
    let chains = map
        .chains
        .iter()
        .filter(|c| {
            c.members
                .iter()
                .any(|m| m.node == node && m.state == MemberState::Syncing)
        })
        .map(|c| c.chain)
        .collect();
    let report = ResyncReport {
        pass_version: map.version,
        synced: chains,
        checked: 0,
        copied: 0,
    };
    h.ns().heartbeat(node, 1, 0, &[], 0, report).unwrap();
    h.ns().cluster_map().unwrap()
}

/// Registers three servers and lets each report a finished resync: every member serves.
fn three_serving(h: &H) -> (Vec<NodeId>, ClusterMap) {
    let nodes: Vec<NodeId> = ["a:1", "b:1", "c:1"]
        .iter()
        .map(|a| h.ns().register_data(None, a, 1, 0).unwrap())
        .collect();
    let mut map = h.ns().cluster_map().unwrap();
    for &n in &nodes {
        map = synced(h, n, &map);
    }
    (nodes, map)
}

fn states(map: &ClusterMap, chain: u32) -> Vec<(u32, MemberState)> {
    map.chain(ChainId(chain))
        .unwrap()
        .members
        .iter()
        .map(|m| (m.node.0, m.state))
        .collect()
}

fn register_assigns_and_updates(kind: StoreKind) {
    let mut h = H::new(kind);
    let ns = h.ns();
    let a = ns.register_data(None, "10.0.0.1:7000", 1000, 100).unwrap();
    let b = ns.register_data(None, "10.0.0.2:7000", 2000, 0).unwrap();
    assert_eq!((a, b), (NodeId(1), NodeId(2)));
    let first = ns.cluster_map().unwrap().version;
    ns.register_data(Some(b), "10.0.0.2:7000", 2000, 0).unwrap();
    assert_eq!(
        ns.cluster_map().unwrap().version,
        first,
        "the same address again is the same map"
    );
    assert_eq!(
        ns.register_data(Some(a), "10.0.0.9:7001", 1000, 500)
            .unwrap(),
        a
    );
    let map = ns.cluster_map().unwrap();
    // Servers holding the old map learn the new address only from a new version.
    assert!(
        map.version > first,
        "a moved server makes a new map version"
    );
    assert_eq!(map.nodes.len(), 2);
    assert_eq!(
        (
            map.nodes[0].node,
            map.nodes[0].addr.as_str(),
            map.nodes[0].alive()
        ),
        (a, "10.0.0.9:7001", true)
    );
    assert_eq!(
        code(ns.register_data(Some(NodeId(9)), "x:1", 1, 0)),
        ErrorCode::NotFound
    );
    assert_eq!(
        code(ns.register_data(None, "", 1, 0)),
        ErrorCode::InvalidArgument
    );
    assert_eq!(
        code(ns.register_data(None, &"a".repeat(300), 1, 0)),
        ErrorCode::InvalidArgument
    );
    // Space over the copies: three by default, capped at the two servers.
    let stats = ns.statfs().unwrap();
    assert_eq!(
        (stats.total_bytes, stats.free_bytes, stats.files),
        (1500, 1250, 1)
    );
    // A restart keeps registrations and chains; every server gets one lease to report.
    let before = ns.cluster_map().unwrap();
    h.restart();
    let ns = h.ns();
    let after = ns.cluster_map().unwrap();
    assert!(after.nodes.iter().all(|n| n.alive()));
    assert_eq!(
        (after.version, &after.chains),
        (before.version, &before.chains)
    );
    ns.heartbeat(b, 4000, 4500, &[], 0, ResyncReport::default())
        .unwrap();
    let stats = ns.statfs().unwrap();
    assert_eq!(
        (stats.total_bytes, stats.free_bytes),
        (2500, 250),
        "used > capacity counts 0"
    );
    assert_eq!(ns.register_data(None, "c:1", 1, 0).unwrap(), NodeId(3));
}

fn heartbeat_of_unknown_node_is_not_found(kind: StoreKind) {
    let h = H::new(kind);
    let leases = h.ns().leases();
    for id in 1..=50 {
        assert_eq!(
            code(
                h.ns()
                    .heartbeat(NodeId(id), 1, 1, &[], 0, ResyncReport::default())
            ),
            ErrorCode::NotFound
        );
    }
    // Made-up ids leave no lease behind (the table would grow with each).
    assert_eq!(h.ns().leases(), leases);
    let reply = h.ns().handle(
        Heartbeat {
            node: NodeId(0),
            capacity_bytes: 0,
            used_bytes: 0,
            done: vec![],
            map_version: 0,
            resync: ResyncReport::default(),
        },
        ConnId(1),
    );
    assert_eq!(reply.unwrap_err().code, ErrorCode::NotFound);
}

fn chains_fill_up_and_members_sync(kind: StoreKind) {
    let h = H::new(kind);
    let a = h.ns().register_data(None, "a:1", 1, 0).unwrap();
    let map = h.ns().cluster_map().unwrap();
    assert_eq!(states(&map, 1), vec![(1, MemberState::Serving)]);
    let b = h.ns().register_data(None, "b:1", 1, 0).unwrap();
    let c = h.ns().register_data(None, "c:1", 1, 0).unwrap();
    let map = h.ns().cluster_map().unwrap();
    assert_eq!(map.chains.len(), 3, "one chain per server");
    for chain in &map.chains {
        assert_eq!(chain.members.len(), 3, "{chain:?}");
        assert_eq!(
            chain.members[0].node.0, chain.chain.0,
            "each server heads its chain"
        );
    }
    // A report of a pass that started before the member joined does not count.
    let old = ResyncReport {
        pass_version: 1,
        synced: vec![ChainId(1)],
        ..ResyncReport::default()
    };
    h.ns().heartbeat(b, 1, 0, &[], 0, old).unwrap();
    assert_eq!(
        states(&h.ns().cluster_map().unwrap(), 1)[1].1,
        MemberState::Syncing
    );
    let map = synced(&h, b, &map);
    let map = synced(&h, c, &map);
    let map = synced(&h, a, &map);
    for chain in &map.chains {
        assert!(
            chain
                .members
                .iter()
                .all(|m| m.state == MemberState::Serving),
            "{chain:?}"
        );
        assert_eq!(chain.write_order(3).len(), 3);
        assert_eq!(
            chain.readers(2).len(),
            2,
            "a file asking for 2 copies uses 2"
        );
    }
}

fn a_lost_lease_takes_a_server_out_and_it_resyncs_back(kind: StoreKind) {
    let config = NamespaceConfig {
        node_lease_ms: 300,
        replace_after_ms: 600_000,
        ..NamespaceConfig::default()
    };
    let clock = Arc::new(ManualClock::new());
    let h = H::with_clock(kind, config, clock.clone());
    let (nodes, _) = three_serving(&h);
    // Node 3 stops beating; the others keep theirs, every 100 ms of the manual clock.
    let mut map = ClusterMap::default();
    for _ in 0..4 {
        clock.advance(Duration::from_millis(100));
        map = beat(&h, nodes[0]);
        beat(&h, nodes[1]);
    }
    assert_eq!(states(&map, 1)[2].1, MemberState::Offline, "lease expired");
    assert!(!map.nodes[2].alive());
    assert_eq!(
        map.chain(ChainId(1)).unwrap().write_order(3),
        vec![nodes[0], nodes[1]]
    );
    // Back: syncing (writes reach it, reads do not), then serving after a pass.
    map = beat(&h, nodes[2]);
    assert_eq!(states(&map, 1)[2].1, MemberState::Syncing);
    assert_eq!(
        map.chain(ChainId(1)).unwrap().readers(3),
        vec![nodes[0], nodes[1]]
    );
    assert_eq!(
        map.chain(ChainId(3)).unwrap().write_order(3)[2],
        nodes[2],
        "syncing goes last"
    );
    map = synced(&h, nodes[2], &map);
    assert!(map.chains.iter().all(|c| c.readers(3).len() == 3));
    let reply = h.ns().handle(GetMap, ConnId(1)).unwrap();
    assert_eq!(reply.version, map.version);
}

fn a_server_away_too_long_is_replaced(kind: StoreKind) {
    let config = NamespaceConfig {
        node_lease_ms: 200,
        replace_after_ms: 400,
        replicas: 2,
        ..NamespaceConfig::default()
    };
    let clock = Arc::new(ManualClock::new());
    let h = H::with_clock(kind, config, clock.clone());
    let (nodes, mut map) = three_serving(&h);
    let holding = |m: &ClusterMap, n: NodeId| {
        m.chains
            .iter()
            .filter(|c| c.members.iter().any(|x| x.node == n))
            .count()
    };
    assert!(holding(&map, nodes[2]) > 0);
    // Beats every 100 ms of the manual clock, as long as lease and replacement take.
    for _ in 0..6 {
        clock.advance(Duration::from_millis(100));
        map = beat(&h, nodes[0]);
        beat(&h, nodes[1]);
    }
    assert_eq!(holding(&map, nodes[2]), 0, "never replaced");
    for chain in &map.chains {
        assert_eq!(chain.members.len(), 2, "{chain:?} back to two members");
    }
}

/// Leases on a manual clock: a silent server goes offline once its lease has passed and
/// leaves its chains after `replace_after_ms` more, with no wait in real time.
fn a_manual_clock_drives_down_marking_and_replacement(kind: StoreKind) {
    let config = NamespaceConfig {
        node_lease_ms: 1_000,
        replace_after_ms: 5_000,
        replicas: 2,
        ..NamespaceConfig::default()
    };
    let clock = Arc::new(ManualClock::new());
    let h = H::with_clock(kind, config, clock.clone());
    let (nodes, map) = three_serving(&h);
    let places = |m: &ClusterMap| {
        m.chains
            .iter()
            .filter(|c| c.members.iter().any(|x| x.node == nodes[2]))
            .count()
    };
    assert!(places(&map) > 0);
    clock.advance(Duration::from_millis(1_000));
    beat(&h, nodes[0]);
    let map = beat(&h, nodes[1]);
    assert!(
        map.nodes[2].alive(),
        "the lease's last instant still counts"
    );
    clock.advance(Duration::from_millis(1));
    beat(&h, nodes[0]);
    let map = beat(&h, nodes[1]);
    assert!(!map.nodes[2].alive(), "down one tick past its lease");
    assert_eq!(states(&map, 3)[0], (3, MemberState::Offline));
    assert_eq!(h.ns().replaced_in(&map), vec![(nodes[2], 4_999)]);
    clock.advance(Duration::from_millis(4_999));
    beat(&h, nodes[0]);
    let map = beat(&h, nodes[1]);
    assert_eq!(places(&map), 0, "replaced at lease + replace_after");
    for chain in &map.chains {
        assert_eq!(chain.members.len(), 2, "{chain:?} back to two members");
    }
}

fn directory_layout_settings_reach_new_files_and_subdirectories(kind: StoreKind) {
    use super::{caller, mkdir, owner};
    use proto::meta::XattrMode;
    let h = H::with_nodes(kind, 3);
    let ns = h.ns();
    let root = proto::InodeId::ROOT;
    let d = mkdir(ns, root, "ckpt");
    for (name, bad) in [
        (&b"user.tessera.replicas"[..], &b"9"[..]),
        (b"user.tessera.replicas", b"two"),
        (b"user.tessera.chunk_size", b"100000"),
        (b"user.tessera.chunk_size", b"1024"),
    ] {
        assert_eq!(
            code(ns.setxattr(d.ino, name, bad, XattrMode::Upsert)),
            ErrorCode::InvalidArgument,
            "{bad:?}"
        );
    }
    ns.setxattr(d.ino, b"user.tessera.replicas", b"2", XattrMode::Upsert)
        .unwrap();
    ns.setxattr(
        d.ino,
        b"user.tessera.chunk_size",
        b"1048576",
        XattrMode::Upsert,
    )
    .unwrap();
    let sub = mkdir(ns, d.ino, "sub");
    for dir in [d.ino, sub.ino] {
        let o = ns
            .create(dir, b"f", 0o644, caller(), true, owner(1))
            .unwrap();
        assert_eq!((o.layout.replicas, o.layout.chunk_size_bytes), (2, 1 << 20));
    }
    let o = ns
        .create(root, b"f", 0o644, caller(), true, owner(1))
        .unwrap();
    assert_eq!((o.layout.replicas, o.layout.chunk_size_bytes), (3, 4 << 20));
    assert_eq!(
        ns.getxattr(sub.ino, b"user.tessera.replicas").unwrap(),
        b"2"
    );
}

fn check_namespace_reports_a_damaged_store(kind: StoreKind) {
    use super::{mkdir, touch};
    let mut h = H::with_nodes(kind, 1);
    let root = proto::InodeId::ROOT;
    let d = mkdir(h.ns(), root, "d");
    let f = touch(h.ns(), d.ino, "f");
    touch(h.ns(), d.ino, "g");
    assert!(h.ns().check_namespace().unwrap().is_empty());
    // A crash-free store never looks like this: an entry without its inode, and an
    // extended attribute its inode does not count.
    let mut batch = crate::kv::WriteBatch::default();
    batch.delete(crate::namespace::keys::inode(f.ino));
    batch.put(
        crate::namespace::keys::xattr(d.ino, b"user.x"),
        b"v".to_vec(),
    );
    h.store().commit(batch).unwrap();
    h.restart();
    let problems = h.ns().check_namespace().unwrap();
    assert!(
        problems.iter().any(|p| p.contains("names missing inode")),
        "{problems:?}"
    );
    assert!(
        problems.iter().any(|p| p.contains("the inode count says")),
        "{problems:?}"
    );
    let wrong = format!("inode {} counts 0 extended attributes, 1 exist", d.ino.0);
    assert!(problems.contains(&wrong), "{problems:?}");
}

engine_tests!(
    check_namespace_reports_a_damaged_store,
    directory_layout_settings_reach_new_files_and_subdirectories,
    register_assigns_and_updates,
    heartbeat_of_unknown_node_is_not_found,
    chains_fill_up_and_members_sync,
    a_lost_lease_takes_a_server_out_and_it_resyncs_back,
    a_server_away_too_long_is_replaced,
    a_manual_clock_drives_down_marking_and_replacement,
);
