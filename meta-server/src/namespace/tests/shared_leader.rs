//! One leader among the metadata servers of a shared engine (`leader`): it alone takes
//! the data servers' registrations and heartbeats and changes the chains; the others
//! serve the chains as stored, and one of them leads once the leader's live key went.

use super::shared_races::{lose_live_key, two, two_on, when_read_again};
use super::H;
use crate::clock::SystemClock;
use crate::config::NamespaceConfig;
use crate::error::MetaError;
use crate::kv::WriteBatch;
use crate::namespace::{keys, Namespace};
use proto::meta::{NodeState, ResyncReport};
use proto::{ErrorCode, NodeId};
use std::sync::Arc;

fn beat(ns: &Namespace, node: u32) -> Result<(), MetaError> {
    let version = ns.map_version();
    ns.heartbeat(
        NodeId(node),
        1000,
        10,
        &[],
        version,
        ResyncReport::default(),
    )
    .map(|_| ())
}

fn not_leader<T: std::fmt::Debug>(r: Result<T, MetaError>) {
    match r {
        Err(e @ MetaError::NotLeader(_)) => assert_eq!(e.code(), ErrorCode::Unavailable),
        other => panic!("expected NotLeader, got {other:?}"),
    }
}

/// The first server to start leads; the second follows, and refuses the data servers'
/// calls (they go to the leader).
#[test]
fn one_server_leads_and_the_others_refuse_the_data_servers() {
    let (_h, _hooked, a, b) = two();
    assert!(a.leads() && !b.leads());
    assert!(
        a.campaign().unwrap() && !b.campaign().unwrap(),
        "leadership moved"
    );
    beat(&a, 1).unwrap();
    not_leader(beat(&b, 1));
    not_leader(b.register_data(None, "10.0.0.9:7000", 1000, 0));
}

/// A data server registered through the leader gets its chain, and a follower's map
/// shows it at the same version, its server up.
#[test]
fn a_followers_map_is_the_leaders() {
    let (_h, _hooked, a, b) = two();
    let before = b.cluster_map().unwrap();
    let node = a.register_data(None, "10.0.0.9:7000", 1000, 0).unwrap();
    let led = a.cluster_map().unwrap();
    assert!(led.version > before.version);
    assert!(
        led.chains
            .iter()
            .any(|c| c.members.iter().any(|m| m.node == node)),
        "the new server is in no chain: {led:?}"
    );
    let followed = b.cluster_map().unwrap();
    assert_eq!(followed.version, led.version);
    assert_eq!(followed.chains, led.chains);
    assert_eq!(followed.nodes, led.nodes);
    assert!(
        followed.nodes.iter().all(|n| n.state == NodeState::Up),
        "{followed:?}"
    );
}

/// The leader's live key goes: the next server to look leads, takes the heartbeats,
/// and starts every data server's lease afresh (none is taken for dead for the silence
/// it never heard); the old leader, until it learns so, changes no membership.
#[test]
fn leadership_passes_when_the_leaders_live_key_goes() {
    let (_h, hooked, a, b) = two();
    let version = b.cluster_map().unwrap().version;
    lose_live_key(&hooked, &a);
    assert!(b.campaign().unwrap());
    beat(&b, 1).unwrap();
    let map = b.cluster_map().unwrap();
    assert!(
        map.nodes.iter().all(|n| n.state == NodeState::Up),
        "{map:?}"
    );
    // A still takes itself for the leader; its change is refused all the same.
    assert!(a.leads());
    let r = a.register_data(Some(NodeId(1)), "10.0.0.1:7001", 1000, 10);
    assert!(
        r.is_err(),
        "a deposed leader registered a data server: {r:?}"
    );
    let map = b.cluster_map().unwrap();
    assert_eq!(map.version, version, "the map moved");
    assert_ne!(
        map.nodes[0].addr, "10.0.0.1:7001",
        "the moved address was stored"
    );
    assert!(!a.campaign().unwrap());
    not_leader(beat(&a, 1));
}

/// A leader whose place was taken while it looked away (its key came back as the
/// other's) is told so by its first membership write, writes nothing, and follows.
#[test]
fn a_deposed_leaders_membership_write_is_refused_and_it_follows() {
    let (_h, hooked, a, b) = two();
    // B takes the `E` key as if A's live key had gone for a moment.
    let mut batch = WriteBatch::new();
    let record = super::super::records::encode(&(b.server_id().unwrap(),)).unwrap();
    batch.put(keys::leader(), record);
    hooked.inner.commit(batch).unwrap();
    assert!(b.campaign().unwrap());
    let version = b.cluster_map().unwrap().version;
    not_leader(a.bump_map_version());
    assert!(!a.leads());
    not_leader(a.register_data(None, "10.0.0.9:7000", 1000, 0));
    assert_eq!(b.cluster_map().unwrap().version, version);
    assert_eq!(a.cluster_map().unwrap().version, version);
}

/// Two servers taking a free leader key at once: one wins, the other reads the key
/// again and follows.
#[test]
fn of_two_servers_taking_the_leader_key_at_once_one_leads() {
    let mut h = H::with_nodes(crate::kv::StoreKind::Redb, 3);
    h.stop();
    let (hooked, a, b) = two_on(&h);
    assert!(a.leads());
    lose_live_key(&hooked, &a);
    drop(a);
    // A new server on the hooked engine: B takes the key right after it read it.
    let b2 = b.clone();
    when_read_again(&hooked, keys::leader(), 0, move || {
        assert!(b2.campaign().unwrap())
    });
    let c = Namespace::open_shared(
        hooked.clone(),
        NamespaceConfig::default(),
        Arc::new(SystemClock),
    )
    .unwrap();
    assert!(hooked.hook.lock().is_none(), "the hook did not run");
    assert!(b.leads() && !c.leads());
    assert!(!c.campaign().unwrap());
}

/// Data servers the leader stops hearing go down in its map, and in a follower's,
/// which hears none of them and takes their state from the chains the leader wrote.
#[test]
fn a_data_server_the_leader_takes_for_dead_is_down_in_a_followers_map() {
    let mut h = H::with_nodes(crate::kv::StoreKind::Redb, 3);
    h.stop();
    let engine = h.open_store();
    let config = NamespaceConfig {
        node_lease_ms: 100,
        ..NamespaceConfig::default()
    };
    let open = || Namespace::open_shared(engine.clone(), config.clone(), Arc::new(SystemClock));
    let (a, b) = (open().unwrap(), open().unwrap());
    assert!(a.leads());
    let up = b.cluster_map().unwrap();
    assert!(up.nodes.iter().all(|n| n.state == NodeState::Up), "{up:?}");
    // Node 1 beats on (were a beat late on a busy machine, the next brings it back);
    // 2 and 3 fall silent past their lease.
    for _ in 0..6 {
        std::thread::sleep(std::time::Duration::from_millis(50));
        beat(&a, 1).unwrap();
    }
    let led = a.cluster_map().unwrap();
    let followed = b.cluster_map().unwrap();
    let states = |m: &proto::meta::ClusterMap| -> Vec<NodeState> {
        m.nodes.iter().map(|n| n.state).collect()
    };
    assert_eq!(states(&led)[1..], [NodeState::Down, NodeState::Down]);
    assert_eq!(followed.version, led.version);
    assert_eq!(states(&followed), states(&led));
}

/// Guards against a new leader taking every data server for dead: it heard none of
/// them while it followed (here for twice their lease), and gives each a lease from
/// the moment it leads.
#[test]
fn a_new_leader_gives_every_data_server_a_lease_from_its_start() {
    let (_h, engine, clock, a, b) = two_on_a_manual_clock();
    assert!(a.leads() && !b.leads());
    let lease = NamespaceConfig::default().node_lease_ms;
    clock.advance(std::time::Duration::from_millis(2 * lease));
    let mut gone = WriteBatch::new();
    gone.delete(keys::server(a.server_id().unwrap()));
    engine.commit(gone).unwrap();
    assert!(b.campaign().unwrap());
    let map = b.cluster_map().unwrap();
    assert!(
        map.nodes.iter().all(|n| n.state == NodeState::Up),
        "{map:?}"
    );
    clock.advance(std::time::Duration::from_millis(2 * lease));
    let map = b.cluster_map().unwrap();
    assert!(
        map.nodes.iter().all(|n| n.state == NodeState::Down),
        "{map:?}"
    );
}

/// Guards against a new leader bringing back data servers the last one took for dead
/// (a fresh lease for all: a dead server back in its chains' write path for a lease,
/// its replacement clock restarted), and against a follower showing up a server taken
/// out of every chain.
#[test]
fn a_data_server_taken_for_dead_stays_down_across_a_change_of_leader() {
    let (_h, engine, clock, a, b) = two_on_a_manual_clock();
    let config = NamespaceConfig::default();
    let (lease, replace) = (config.node_lease_ms, config.replace_after_ms);
    let states = |m: &proto::meta::ClusterMap| -> Vec<NodeState> {
        m.nodes.iter().map(|n| n.state).collect()
    };
    let (up, down) = (NodeState::Up, NodeState::Down);
    // Node 3 falls silent; 1 and 2 beat on.
    clock.advance(std::time::Duration::from_millis(lease + 1));
    beat(&a, 1).unwrap();
    beat(&a, 2).unwrap();
    assert_eq!(states(&a.cluster_map().unwrap()), [up, up, down]);
    assert_eq!(states(&b.cluster_map().unwrap()), [up, up, down]);
    // Past its replacement: out of every chain.
    clock.advance(std::time::Duration::from_millis(replace));
    beat(&a, 1).unwrap();
    beat(&a, 2).unwrap();
    let led = a.cluster_map().unwrap();
    assert!(
        !led.chains
            .iter()
            .any(|c| c.members.iter().any(|m| m.node == NodeId(3))),
        "{led:?}"
    );
    assert_eq!(
        states(&b.cluster_map().unwrap()),
        [up, up, down],
        "the follower"
    );
    // A goes; B leads and keeps node 3 down, 1 and 2 up.
    let mut gone = WriteBatch::new();
    gone.delete(keys::server(a.server_id().unwrap()));
    engine.commit(gone).unwrap();
    assert!(b.campaign().unwrap());
    assert_eq!(
        states(&b.cluster_map().unwrap()),
        [up, up, down],
        "the new leader"
    );
}

/// Servers A (leading) and B on a store with three data servers, both reading the time
/// from one manual clock; the store is returned to be written behind their backs.
fn two_on_a_manual_clock() -> (
    H,
    Arc<dyn crate::kv::TxnStore>,
    Arc<crate::ManualClock>,
    Namespace,
    Namespace,
) {
    let mut h = H::with_nodes(crate::kv::StoreKind::Redb, 3);
    h.stop();
    let (engine, clock) = (h.open_store(), Arc::new(crate::ManualClock::new()));
    let open = || {
        let c: Arc<dyn crate::clock::Clock> = clock.clone();
        Namespace::open_shared(engine.clone(), NamespaceConfig::default(), c).unwrap()
    };
    let (a, b) = (open(), open());
    (h, engine, clock, a, b)
}
