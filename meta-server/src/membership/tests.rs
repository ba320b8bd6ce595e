//! The membership rules over random histories of registrations, heartbeats, resync
//! reports and time passing, each step followed by a reconcile as the server runs one.

use super::*;
use proptest::prelude::*;

const LEASE_MS: u64 = 100;
const REPLACE_AFTER_MS: u64 = 300;

#[derive(Clone, Debug)]
enum Event {
    /// A new server registers (and so heartbeats).
    Register,
    /// Server number `i % servers` heartbeats.
    Beat(usize),
    /// Time passes.
    Advance(u64),
    /// Server `i % servers` reports a pass over every chain it syncs in, started at the
    /// current version (`fresh`) or at the one before.
    Resync(usize, bool),
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        1 => Just(Event::Register),
        6 => any::<usize>().prop_map(Event::Beat),
        3 => (1u64..=250).prop_map(Event::Advance),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(i, f)| Event::Resync(i, f)),
    ]
}

/// The cluster as the metadata server sees it, moved by events.
struct Model {
    replicas: usize,
    now_ms: u64,
    last_beat_ms: BTreeMap<u32, u64>,
    chains: BTreeMap<u32, ChainRecord>,
    version: u64,
}

impl Model {
    fn silence(&self) -> BTreeMap<u32, Duration> {
        self.last_beat_ms
            .iter()
            .map(|(&n, &at)| (n, Duration::from_millis(self.now_ms - at)))
            .collect()
    }

    fn apply(&mut self, e: &Event) {
        let servers: Vec<u32> = self.last_beat_ms.keys().copied().collect();
        let pick = |i: usize| servers.get(i % servers.len().max(1)).copied();
        match *e {
            Event::Register => {
                let id = u32::try_from(servers.len()).unwrap() + 1;
                self.last_beat_ms.insert(id, self.now_ms);
            }
            Event::Beat(i) => {
                if let Some(n) = pick(i) {
                    self.last_beat_ms.insert(n, self.now_ms);
                }
            }
            Event::Advance(ms) => self.now_ms += ms,
            Event::Resync(i, fresh) => {
                if let Some(n) = pick(i) {
                    let mine: Vec<u32> = self
                        .chains
                        .iter()
                        .filter(|(_, c)| {
                            c.members.iter().any(|m| m.node == n && m.state == SYNCING)
                        })
                        .map(|(&id, _)| id)
                        .collect();
                    let pass = if fresh {
                        self.version
                    } else {
                        self.version.saturating_sub(1)
                    };
                    let before = self.chains.clone();
                    let changed = mark_synced(&mut self.chains, n, &mine, pass);
                    check_synced(&before, &self.chains, n, pass, &changed);
                    if !changed.is_empty() {
                        self.version += 1;
                    }
                }
            }
        }
    }

    /// One reconcile, with every property checked against the chains before it.
    fn reconcile(&mut self) {
        let silence = self.silence();
        let target = self.replicas.min(silence.len()).max(1);
        let view = View {
            silence: &silence,
            target,
            version: self.version,
            lease: Duration::from_millis(LEASE_MS),
            replace_after: Duration::from_millis(REPLACE_AFTER_MS),
        };
        let change = reconcile(&self.chains, &view);
        let after = change.as_ref().map_or(&self.chains, |c| &c.chains);
        check_rules(&self.chains, after, &view);
        if let Some(c) = &change {
            assert_eq!(
                c.version,
                self.version + 1,
                "versions only grow, one per change"
            );
            assert_ne!(&self.chains, after, "a change changes something");
            for id in after.keys() {
                let differs = self.chains.get(id) != after.get(id);
                assert_eq!(differs, c.changed.contains(id), "chain {id}: changed list");
            }
            assert!(
                reconcile(
                    &c.chains,
                    &View {
                        version: c.version,
                        ..view.clone()
                    }
                )
                .is_none(),
                "a second reconcile at the same instant changes nothing (no version churn)"
            );
        }
        if let Some(c) = change {
            self.chains = c.chains;
            self.version = c.version;
        }
    }
}

/// The properties of one reconcile from `before` to `after`.
fn check_rules(
    before: &BTreeMap<u32, ChainRecord>,
    after: &BTreeMap<u32, ChainRecord>,
    view: &View<'_>,
) {
    let up: Vec<u32> = view
        .silence
        .keys()
        .copied()
        .filter(|&n| view.alive(n))
        .collect();
    for &n in view.silence.keys() {
        assert!(
            after.contains_key(&n),
            "server {n} heads a chain of its own"
        );
    }
    for (id, chain) in after {
        let serving =
            |c: &ChainRecord, n: u32| c.members.iter().any(|m| m.node == n && m.state == SERVING);
        for m in &chain.members {
            assert_eq!(
                m.state == OFFLINE,
                !view.alive(m.node),
                "chain {id}: {m:?} vs lease"
            );
            assert!(
                !view.gone(m.node),
                "chain {id}: {m:?} silent too long, still a member"
            );
            assert!(
                m.since <= view.version + 1,
                "chain {id}: {m:?} from a future version"
            );
        }
        // Never fewer serving members than possible.
        if chain.members.iter().any(|m| view.alive(m.node)) {
            assert!(
                chain.members.iter().any(|m| m.state == SERVING),
                "chain {id} serves none: {chain:?}"
            );
        }
        let old = before.get(id);
        if let Some(old) = old {
            for m in &old.members {
                if m.state == SERVING && view.alive(m.node) {
                    assert!(
                        serving(chain, m.node),
                        "chain {id}: up server {} demoted",
                        m.node
                    );
                }
            }
        }
        let serves = chain.members.iter().any(|m| m.state == SERVING);
        if chain.members.len() < view.target && (serves || chain.members.is_empty()) {
            assert!(
                up.iter()
                    .all(|n| chain.members.iter().any(|m| m.node == *n)),
                "chain {id} short of members while an up server is not one: {chain:?}"
            );
        }
        // Never a stale member promoted while a fresh one exists.
        let fresh_before = old.is_some_and(|o| {
            o.members
                .iter()
                .any(|m| m.state == SERVING && view.alive(m.node))
        });
        for m in &chain.members {
            let was_member = old.is_some_and(|o| o.members.iter().any(|x| x.node == m.node));
            let promoted =
                m.state == SERVING && was_member && !old.is_some_and(|o| serving(o, m.node));
            assert!(
                !(promoted && fresh_before),
                "chain {id}: {} promoted while a serving member was up: {old:?} -> {chain:?}",
                m.node
            );
        }
        // Never a server that holds none of the chain's bytes serving while a member
        // that does is only away (it would be resynced from, and delete its copies).
        if let Some(old) = old {
            let kept = old
                .members
                .iter()
                .any(|x| chain.members.iter().any(|m| m.node == x.node));
            for m in &chain.members {
                let joined = !old.members.iter().any(|x| x.node == m.node);
                assert!(
                    !(joined && kept && m.state == SERVING),
                    "chain {id}: {} joined and serves while a member is away: {old:?} -> {chain:?}",
                    m.node
                );
            }
        }
        let mut nodes: Vec<u32> = chain.members.iter().map(|m| m.node).collect();
        nodes.sort_unstable();
        nodes.dedup();
        assert_eq!(
            nodes.len(),
            chain.members.len(),
            "chain {id}: a server twice"
        );
    }
}

/// A resync report promotes only `node`'s syncing places whose syncing began by `pass`.
fn check_synced(
    before: &BTreeMap<u32, ChainRecord>,
    after: &BTreeMap<u32, ChainRecord>,
    node: u32,
    pass: u64,
    changed: &[u32],
) {
    for (id, chain) in after {
        let old = &before[id];
        assert_eq!(old.members.len(), chain.members.len());
        for (o, m) in old.members.iter().zip(&chain.members) {
            if o != m {
                assert!(changed.contains(id));
                assert!(
                    o.node == node && o.state == SYNCING && o.since <= pass,
                    "{o:?} -> {m:?}"
                );
                assert_eq!(m.state, SERVING);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn membership_rules_hold_over_random_histories(
        replicas in 1usize..=4,
        events in proptest::collection::vec(event(), 1..120),
    ) {
        let mut m = Model {
            replicas,
            now_ms: 0,
            last_beat_ms: BTreeMap::new(),
            chains: BTreeMap::new(),
            version: 0,
        };
        for e in &events {
            m.apply(e);
            m.reconcile();
        }
    }
}

/// A server back from an outage syncs, and serves only after a pass started since.
#[test]
fn a_returning_server_syncs_before_it_serves() {
    let lease = Duration::from_millis(LEASE_MS);
    let view = |silence, version| View {
        silence,
        target: 2,
        version,
        lease,
        replace_after: Duration::from_secs(60),
    };
    let both: BTreeMap<u32, Duration> = [(1, Duration::ZERO), (2, Duration::ZERO)].into();
    let c = reconcile(&BTreeMap::new(), &view(&both, 0)).unwrap();
    let mut chains = c.chains;
    mark_synced(&mut chains, 1, &[2], c.version);
    mark_synced(&mut chains, 2, &[1], c.version);
    let down: BTreeMap<u32, Duration> = [(1, Duration::ZERO), (2, lease * 2)].into();
    let c = reconcile(&chains, &view(&down, 2)).unwrap();
    assert_eq!(c.chains[&2].members[0].state, OFFLINE);
    assert_eq!(
        c.chains[&2].members[1].state, SERVING,
        "the only up member serves"
    );
    let c = reconcile(&c.chains, &view(&both, c.version)).unwrap();
    let back = c.chains[&1].members[1];
    assert_eq!((back.node, back.state, back.since), (2, SYNCING, 4));
    let mut chains = c.chains;
    assert!(
        mark_synced(&mut chains, 2, &[1], 3).is_empty(),
        "a pass from before it came back"
    );
    assert_eq!(mark_synced(&mut chains, 2, &[1], 4), vec![1]);
    assert_eq!(chains[&1].members[1].state, SERVING);
}
