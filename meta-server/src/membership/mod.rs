//! Cluster membership as a decision: which data servers serve each replication chain,
//! decided from the chains as stored, how long each server has been silent, the number
//! of copies wanted and the map version. Pure functions of those inputs, so property
//! tests drive them over random histories; the namespace reads the state, calls
//! [`reconcile`] and stores what it returns (see `namespace/membership.rs`).
//!
//! Rules, applied on every heartbeat, registration and map request:
//!
//! - every registered server heads one chain of its own (made when it registers);
//! - a server whose lease ran out goes `Offline` in every chain; when it heartbeats again
//!   it goes `Syncing`, and `Serving` once it reports a resync pass, started at or after
//!   that change, that found the chain identical to a serving member ([`mark_synced`]);
//! - a chain with no serving member promotes its first syncing member, one that came
//!   back (nothing better exists);
//! - a member offline longer than `replace_after` leaves the chain;
//! - a chain with fewer members than the target (the replication factor, capped by the
//!   number of servers) takes an up server that is not a member yet, syncing, choosing
//!   the server with the fewest chains; but only while a member serves, or once every
//!   member has left: a newcomer holds none of the chain's bytes, and must never serve
//!   while a member that holds them is only away.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

#[cfg(test)]
mod tests;

/// A member that serves reads and heads writes.
pub(crate) const SERVING: u8 = 1;
/// A member that takes writes and is being brought up to date.
pub(crate) const SYNCING: u8 = 2;
/// A member whose server's lease ran out.
pub(crate) const OFFLINE: u8 = 3;

/// One member of a chain record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MemberRecord {
    pub node: u32,
    /// 1 serving, 2 syncing, 3 offline.
    pub state: u8,
    /// Map version at which it started syncing (it joined the chain or came back), so
    /// that only a resync pass started since counts; 0 unless syncing.
    pub since: u64,
}

/// One replication chain, stored under key `C`+chain.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ChainRecord {
    /// Head first.
    pub members: Vec<MemberRecord>,
}

/// Everything [`reconcile`] decides from besides the chains.
#[derive(Clone, Debug)]
pub(crate) struct View<'a> {
    /// Every registered server and the time since its last heartbeat (`Duration::MAX`
    /// for one never heard from).
    pub silence: &'a BTreeMap<u32, Duration>,
    /// Members each chain should have.
    pub target: usize,
    /// The current map version.
    pub version: u64,
    /// How long a server stays up after its last heartbeat.
    pub lease: Duration,
    /// How long a down server keeps its places in chains past its lease.
    pub replace_after: Duration,
}

impl View<'_> {
    /// Whether `node` heartbeat within its lease.
    pub fn alive(&self, node: u32) -> bool {
        self.silence.get(&node).is_some_and(|t| *t <= self.lease)
    }

    /// Whether `node` has been silent long enough to leave its chains.
    fn gone(&self, node: u32) -> bool {
        let after = self.lease.saturating_add(self.replace_after);
        self.silence.get(&node).is_some_and(|t| *t >= after)
    }
}

/// New chains and the map version they make.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Change {
    /// Every chain, changed or not.
    pub chains: BTreeMap<u32, ChainRecord>,
    /// The chains that changed, to be stored.
    pub changed: Vec<u32>,
    /// The new map version, one past the old.
    pub version: u64,
}

/// Applies the membership rules to `chains`; `None` when nothing changes (the map
/// version then stays, so servers that hold the map need not fetch it again).
pub(crate) fn reconcile(chains: &BTreeMap<u32, ChainRecord>, view: &View<'_>) -> Option<Change> {
    let next = view.version + 1;
    let mut out = chains.clone();
    let mut changed = BTreeSet::new();
    for &n in view.silence.keys() {
        if let std::collections::btree_map::Entry::Vacant(e) = out.entry(n) {
            let head = MemberRecord {
                node: n,
                state: SERVING,
                since: 0,
            };
            e.insert(ChainRecord {
                members: vec![head],
            });
            changed.insert(n);
        }
    }
    let mut load: HashMap<u32, usize> = HashMap::new();
    for c in out.values() {
        for m in &c.members {
            *load.entry(m.node).or_default() += 1;
        }
    }
    for (&id, chain) in out.iter_mut() {
        let before = chain.clone();
        mark_liveness(chain, view, next);
        leave_if_gone(id, chain, view, &mut load);
        // Only a member holds what the chain stored: one comes back before anyone new
        // is let in.
        promote_if_none_serves(id, chain);
        let emptied = chain.members.is_empty();
        if emptied || chain.members.iter().any(|m| m.state == SERVING) {
            fill(id, chain, view, next, &mut load);
        }
        if emptied {
            // Every member stayed away past `replace_after` and left: what they held is
            // gone with them, and the chain starts again on new servers.
            promote_if_none_serves(id, chain);
        }
        debug_check(chain, view);
        if *chain != before {
            changed.insert(id);
        }
    }
    (!changed.is_empty()).then(|| Change {
        chains: out,
        changed: changed.into_iter().collect(),
        version: next,
    })
}

/// Down servers go offline; offline ones heard from again sync from version `next`.
fn mark_liveness(chain: &mut ChainRecord, view: &View<'_>, next: u64) {
    for m in chain.members.iter_mut() {
        let up = view.alive(m.node);
        if !up && m.state != OFFLINE {
            m.state = OFFLINE;
            m.since = 0;
        } else if up && m.state == OFFLINE {
            m.state = SYNCING;
            m.since = next;
        }
    }
}

/// Members away too long leave, so that another server can take their place.
fn leave_if_gone(
    id: u32,
    chain: &mut ChainRecord,
    view: &View<'_>,
    load: &mut HashMap<u32, usize>,
) {
    chain.members.retain(|m| {
        let gone = m.state == OFFLINE && view.gone(m.node);
        if gone {
            tracing::warn!(
                chain = id,
                node = m.node,
                "member offline too long, leaving the chain"
            );
            if let Some(l) = load.get_mut(&m.node) {
                *l = l.saturating_sub(1);
            }
        }
        !gone
    });
}

/// A chain with no serving member serves from its first syncing one, a member that
/// came back: nothing better exists, and a chain nobody serves cannot be read or written
/// at all. A server that joins a chain never takes this way while one of the chain's
/// members is only away (see `reconcile`): it holds none of the chain's bytes, and a
/// member resyncing from it on its return would delete its own copies to match.
fn promote_if_none_serves(id: u32, chain: &mut ChainRecord) {
    if chain.members.iter().any(|m| m.state == SERVING) {
        return;
    }
    if let Some(first) = chain.members.iter_mut().find(|m| m.state == SYNCING) {
        tracing::warn!(
            chain = id,
            node = first.node,
            "no serving member: promoting a syncing one"
        );
        first.state = SERVING;
        first.since = 0;
    }
}

/// Up to the target, up servers that are not members join, the least loaded first.
fn fill(
    id: u32,
    chain: &mut ChainRecord,
    view: &View<'_>,
    next: u64,
    load: &mut HashMap<u32, usize>,
) {
    while chain.members.len() < view.target {
        let pick = view
            .silence
            .keys()
            .filter(|&&n| view.alive(n) && !chain.members.iter().any(|m| m.node == n))
            .min_by_key(|&&n| (load.get(&n).copied().unwrap_or(0), n));
        let Some(&pick) = pick else {
            break;
        };
        // Syncing: it copies from the serving member (or, in a chain that lost every
        // member, the promotion that follows makes it serve).
        chain.members.push(MemberRecord {
            node: pick,
            state: SYNCING,
            since: next,
        });
        *load.entry(pick).or_default() += 1;
        tracing::info!(chain = id, node = pick, "server joins the chain");
    }
}

/// What the rules leave true of every chain they went over.
fn debug_check(chain: &ChainRecord, view: &View<'_>) {
    debug_assert!(
        chain
            .members
            .iter()
            .all(|m| (m.state == OFFLINE) != view.alive(m.node)),
        "a member's state must follow its server's lease: {chain:?}"
    );
    debug_assert!(
        chain.members.iter().all(|m| m.state == OFFLINE)
            || chain.members.iter().any(|m| m.state == SERVING),
        "a chain with an up member must have a serving one: {chain:?}"
    );
    debug_assert!(
        chain
            .members
            .iter()
            .all(|m| m.state == SYNCING || m.since == 0),
        "only a syncing member has a version it syncs from: {chain:?}"
    );
    debug_assert!(
        chain
            .members
            .iter()
            .enumerate()
            .all(|(i, m)| chain.members[..i].iter().all(|o| o.node != m.node)),
        "a server is a member of a chain at most once: {chain:?}"
    );
}

/// Takes `node`'s report of a resync pass that started at map version `pass_version`
/// and found each chain in `synced` identical to a serving member: its syncing places
/// there that began at or before that version serve again. Returns the chains changed.
pub(crate) fn mark_synced(
    chains: &mut BTreeMap<u32, ChainRecord>,
    node: u32,
    synced: &[u32],
    pass_version: u64,
) -> Vec<u32> {
    let mut changed = Vec::new();
    for id in synced {
        let Some(c) = chains.get_mut(id) else {
            continue;
        };
        for m in c.members.iter_mut() {
            // A pass that started before the member came back compared it against
            // writes it may have missed since: it proves nothing.
            if m.node == node && m.state == SYNCING && m.since <= pass_version {
                m.state = SERVING;
                m.since = 0;
                changed.push(*id);
                tracing::info!(chain = id, node, "resync done: member serves again");
            }
        }
    }
    changed
}
