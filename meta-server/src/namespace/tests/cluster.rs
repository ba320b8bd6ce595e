//! Data server registration, heartbeats, the cluster map and statfs.

use super::{code, engine_tests, H};
use crate::kv::StoreKind;
use crate::namespace::ConnId;
use crate::NamespaceConfig;
use proto::meta::{MetaReply, MetaRequest};
use proto::{ErrorCode, NodeId};
use std::time::{Duration, Instant};

fn register_assigns_and_updates(kind: StoreKind) {
    let mut h = H::new(kind);
    let ns = h.ns();
    let a = ns.register_data(None, "10.0.0.1:7000", 1000, 100).unwrap();
    let b = ns.register_data(None, "10.0.0.2:7000", 2000, 0).unwrap();
    assert_eq!((a, b), (NodeId(1), NodeId(2)));
    assert_eq!(
        ns.register_data(Some(a), "10.0.0.9:7001", 1000, 500)
            .unwrap(),
        a
    );
    let map = ns.cluster_map().unwrap();
    assert_eq!(map.len(), 2);
    assert_eq!(
        (map[0].node, map[0].addr.as_str(), map[0].alive),
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
    let stats = ns.statfs().unwrap();
    assert_eq!(
        (stats.total_bytes, stats.free_bytes, stats.files),
        (3000, 2500, 1)
    );
    // A restart keeps registrations but not liveness: a node must heartbeat again.
    h.restart();
    let ns = h.ns();
    assert!(ns.cluster_map().unwrap().iter().all(|n| !n.alive));
    ns.heartbeat(b, 4000, 4500, &[]).unwrap();
    let map = ns.cluster_map().unwrap();
    assert_eq!(
        map.iter().map(|n| n.alive).collect::<Vec<_>>(),
        vec![false, true]
    );
    let stats = ns.statfs().unwrap();
    assert_eq!(
        (stats.total_bytes, stats.free_bytes),
        (5000, 500),
        "used > capacity counts 0"
    );
    assert_eq!(ns.register_data(None, "c:1", 1, 0).unwrap(), NodeId(3));
}

fn heartbeat_of_unknown_node_is_not_found(kind: StoreKind) {
    let h = H::new(kind);
    assert_eq!(
        code(h.ns().heartbeat(NodeId(1), 1, 1, &[])),
        ErrorCode::NotFound
    );
    let reply = h.ns().handle(
        MetaRequest::Heartbeat {
            node: NodeId(0),
            capacity_bytes: 0,
            used_bytes: 0,
            done: vec![],
        },
        ConnId(1),
    );
    assert_eq!(reply.unwrap_err().code, ErrorCode::NotFound);
}

fn lease_expires_without_heartbeats(kind: StoreKind) {
    let config = NamespaceConfig {
        node_lease_ms: 100,
        ..NamespaceConfig::default()
    };
    let h = H::with_config(kind, config);
    let node = h.ns().register_data(None, "a:1", 1, 0).unwrap();
    assert!(h.ns().cluster_map().unwrap()[0].alive);
    // Wait on the condition with a deadline rather than a fixed sleep.
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.ns().cluster_map().unwrap()[0].alive {
        assert!(Instant::now() < deadline, "lease never expired");
        std::thread::sleep(Duration::from_millis(20));
    }
    h.ns().heartbeat(node, 1, 0, &[]).unwrap();
    let reply = h.ns().handle(MetaRequest::ClusterMap, ConnId(1)).unwrap();
    assert!(matches!(reply, MetaReply::Map { nodes } if nodes[0].alive));
}

engine_tests!(
    register_assigns_and_updates,
    heartbeat_of_unknown_node_is_not_found,
    lease_expires_without_heartbeats,
);
