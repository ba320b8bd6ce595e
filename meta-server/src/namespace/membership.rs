//! Cluster membership: which data servers are up, the replication chains and the state
//! of each member, and the map version that changes with any of them.
//!
//! Rules, applied by [`Namespace::reconcile`] on every heartbeat, registration and map
//! request:
//!
//! - every registered server heads one chain of its own (made when it registers);
//! - a server whose lease ran out goes `Offline` in every chain; when it heartbeats again
//!   it goes `Syncing`, and `Serving` once it reports a resync pass, started at or after
//!   that change, that found the chain identical to a serving member;
//! - a chain with no serving member promotes its first syncing member (nothing better
//!   exists);
//! - a member offline longer than `replace_after_ms` leaves the chain;
//! - a chain with fewer members than the target (the replication factor, capped by the
//!   number of servers) takes an up server that is not a member yet, syncing, choosing
//!   the server with the fewest chains.
//!
//! Chains and the map version are stored (`C`, `V` keys), so membership survives a
//! restart; liveness is not: after a restart every server gets one lease to report.

use super::keys;
use super::records::{decode, encode, ChainRecord, MemberRecord};
use super::{Namespace, MAX_NODES};
use crate::error::MetaError;
use proto::meta::{
    ChainInfo, ClusterMap, Member, MemberState, NodeInfo, NodeState, ResyncProgress, ResyncReport,
};
use proto::{ChainId, NodeId};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SERVING: u8 = 1;
const SYNCING: u8 = 2;
const OFFLINE: u8 = 3;

/// Membership as the metadata server keeps it in memory (a mirror of the `C` and `V`
/// keys, plus what is not stored).
#[derive(Default)]
pub(crate) struct Members {
    loaded: bool,
    version: u64,
    chains: BTreeMap<u32, ChainRecord>,
    /// The last resync report of each server.
    resync: HashMap<u32, ResyncReport>,
}

fn member_state(code: u8) -> MemberState {
    match code {
        SERVING => MemberState::Serving,
        SYNCING => MemberState::Syncing,
        _ => MemberState::Offline,
    }
}

impl Namespace {
    /// Loads chains and the map version on first use; every known server gets a lease
    /// starting now.
    fn load_members(&self, m: &mut Members) -> Result<(), MetaError> {
        if m.loaded {
            return Ok(());
        }
        if let Some(v) = self.store.get(&keys::map_version())? {
            m.version = decode(&v, "map version")?;
        }
        let prefix = keys::chain_prefix();
        for (k, v) in self
            .store
            .scan(&prefix, &keys::prefix_end(&prefix), MAX_NODES * 4)?
        {
            let id = keys::u32_at(&k, prefix.len())
                .ok_or_else(|| MetaError::Corrupt(format!("chain key {k:x?}")))?;
            m.chains.insert(id, decode(&v, "chain record")?);
        }
        let now = Instant::now();
        let mut live = self.liveness.lock();
        for (node, _) in self.nodes()? {
            live.entry(node).or_insert(now);
        }
        m.loaded = true;
        Ok(())
    }

    /// Applies the membership rules; returns the current map.
    pub(crate) fn reconcile(&self) -> Result<Arc<ClusterMap>, MetaError> {
        let mut m = self.members.lock();
        self.load_members(&mut m)?;
        let nodes = self.nodes()?;
        let lease = Duration::from_millis(self.config.node_lease_ms);
        let replace_after = Duration::from_millis(self.config.replace_after_ms);
        // Time since each server's last heartbeat: up within the lease, gone for good
        // once down for `replace_after` more.
        let silent: HashMap<u32, Duration> = {
            let live = self.liveness.lock();
            nodes
                .iter()
                .map(|(n, _)| (n.0, live.get(n).map_or(Duration::MAX, Instant::elapsed)))
                .collect()
        };
        let alive: HashMap<u32, bool> = silent.iter().map(|(&n, &t)| (n, t <= lease)).collect();
        let gone_after = lease.saturating_add(replace_after);
        let next = m.version + 1;
        let mut changed: Vec<u32> = Vec::new();
        // Every server heads a chain of its own.
        for (n, _) in &nodes {
            if let std::collections::btree_map::Entry::Vacant(e) = m.chains.entry(n.0) {
                let members = vec![MemberRecord {
                    node: n.0,
                    state: SERVING,
                    since: 0,
                }];
                e.insert(ChainRecord { members });
                changed.push(n.0);
            }
        }
        let target = usize::from(self.target_copies(nodes.len()));
        let mut load: HashMap<u32, usize> = HashMap::new();
        for c in m.chains.values() {
            for mem in &c.members {
                *load.entry(mem.node).or_default() += 1;
            }
        }
        for (&id, chain) in m.chains.iter_mut() {
            let before = chain.clone();
            for mem in chain.members.iter_mut() {
                let up = alive.get(&mem.node).copied().unwrap_or(false);
                if !up && mem.state != OFFLINE {
                    mem.state = OFFLINE;
                    mem.since = 0;
                } else if up && mem.state == OFFLINE {
                    mem.state = SYNCING;
                    mem.since = next;
                }
            }
            // Members away too long leave, so that another server can take their place.
            chain.members.retain(|mem| {
                let gone =
                    mem.state == OFFLINE && silent.get(&mem.node).is_some_and(|t| *t >= gone_after);
                if gone {
                    tracing::warn!(
                        chain = id,
                        node = mem.node,
                        "member offline too long, leaving the chain"
                    );
                    if let Some(l) = load.get_mut(&mem.node) {
                        *l = l.saturating_sub(1);
                    }
                }
                !gone
            });
            if !chain.members.iter().any(|x| x.state == SERVING) {
                if let Some(first) = chain.members.iter_mut().find(|x| x.state == SYNCING) {
                    tracing::warn!(
                        chain = id,
                        node = first.node,
                        "no serving member: promoting a syncing one"
                    );
                    first.state = SERVING;
                    first.since = 0;
                }
            }
            while chain.members.len() < target {
                let mut candidates: Vec<u32> = alive
                    .iter()
                    .filter(|(n, up)| **up && !chain.members.iter().any(|x| x.node == **n))
                    .map(|(n, _)| *n)
                    .collect();
                candidates.sort_by_key(|n| (load.get(n).copied().unwrap_or(0), *n));
                let Some(&pick) = candidates.first() else {
                    break;
                };
                // An empty chain has nothing to copy: the new member serves at once.
                let state = if chain.members.is_empty() {
                    SERVING
                } else {
                    SYNCING
                };
                chain.members.push(MemberRecord {
                    node: pick,
                    state,
                    since: next,
                });
                *load.entry(pick).or_default() += 1;
                tracing::info!(chain = id, node = pick, "server joins the chain");
            }
            if *chain != before {
                changed.push(id);
            }
        }
        if !changed.is_empty() {
            self.persist(&mut m, &changed)?;
        }
        let map = Arc::new(build_map(&m, &nodes, &alive));
        *self.map.write() = map.clone();
        Ok(map)
    }

    /// A new map version with no chain changed: a server's address changed.
    pub(crate) fn bump_map_version(&self) -> Result<(), MetaError> {
        let mut m = self.members.lock();
        self.load_members(&mut m)?;
        self.persist(&mut m, &[])
    }

    /// Stores the changed chains and a new map version.
    fn persist(&self, m: &mut Members, changed: &[u32]) -> Result<(), MetaError> {
        let version = m.version + 1;
        let mut rows = Vec::with_capacity(changed.len());
        for id in changed {
            if let Some(c) = m.chains.get(id) {
                rows.push((keys::chain(ChainId(*id)), encode(c)?));
            }
        }
        self.mutate(|txn, _| {
            for (k, v) in rows {
                txn.put(k, v);
            }
            txn.put(keys::map_version(), encode(&version)?);
            Ok(())
        })?;
        m.version = version;
        tracing::info!(version, chains = ?changed, "cluster map changed");
        Ok(())
    }

    /// Takes a server's resync report: chains it found identical become serving.
    pub(crate) fn resync_report(
        &self,
        node: NodeId,
        report: ResyncReport,
    ) -> Result<(), MetaError> {
        let mut m = self.members.lock();
        self.load_members(&mut m)?;
        let mut changed = Vec::new();
        for chain in &report.synced {
            let Some(c) = m.chains.get_mut(&chain.0) else {
                continue;
            };
            for mem in c.members.iter_mut() {
                if mem.node == node.0 && mem.state == SYNCING && mem.since <= report.pass_version {
                    mem.state = SERVING;
                    mem.since = 0;
                    changed.push(chain.0);
                    tracing::info!(%chain, %node, "resync done: member serves again");
                }
            }
        }
        m.resync.insert(node.0, report);
        if !changed.is_empty() {
            self.persist(&mut m, &changed)?;
        }
        Ok(())
    }

    /// The chains a new file is spread over (none before any data server registered).
    pub(crate) fn chain_ids(&self) -> Vec<u32> {
        self.map.read().chains.iter().map(|c| c.chain.0).collect()
    }

    /// Each DOWN server still in a chain of `map`, and the milliseconds until `reconcile`
    /// takes it out of its chains (its lease plus `replace_after_ms` after its last
    /// heartbeat).
    pub(crate) fn replaced_in(&self, map: &ClusterMap) -> Vec<(NodeId, u64)> {
        let gone_after = Duration::from_millis(self.config.node_lease_ms)
            .saturating_add(Duration::from_millis(self.config.replace_after_ms));
        let live = self.liveness.lock();
        map.nodes
            .iter()
            .filter(|n| n.state == NodeState::Down)
            .filter(|n| {
                map.chains
                    .iter()
                    .any(|c| c.members.iter().any(|m| m.node == n.node))
            })
            .map(|n| {
                let silent = live.get(&n.node).map_or(Duration::MAX, Instant::elapsed);
                let left = gone_after.saturating_sub(silent);
                (n.node, u64::try_from(left.as_millis()).unwrap_or(u64::MAX))
            })
            .collect()
    }

    /// The last resync report of each server that is syncing somewhere, with the chunks
    /// of the chains it syncs (`chunks_per_chain`) as the total a pass compares.
    pub(crate) fn resyncs(
        &self,
        map: &ClusterMap,
        chunks_per_chain: &HashMap<ChainId, u64>,
    ) -> Vec<ResyncProgress> {
        let m = self.members.lock();
        let mut out: Vec<ResyncProgress> = m
            .resync
            .iter()
            .filter_map(|(n, r)| {
                let syncing: Vec<ChainId> = map
                    .chains
                    .iter()
                    .filter(|c| {
                        c.members
                            .iter()
                            .any(|x| x.node.0 == *n && x.state == MemberState::Syncing)
                    })
                    .map(|c| c.chain)
                    .collect();
                (!syncing.is_empty()).then(|| ResyncProgress {
                    node: NodeId(*n),
                    compared: r.checked,
                    copied: r.copied,
                    total: syncing
                        .iter()
                        .map(|c| chunks_per_chain.get(c).copied().unwrap_or(0))
                        .sum(),
                })
            })
            .collect();
        out.sort_by_key(|p| p.node);
        out
    }
}

fn build_map(
    m: &Members,
    nodes: &[(NodeId, super::records::NodeRecord)],
    alive: &HashMap<u32, bool>,
) -> ClusterMap {
    ClusterMap {
        version: m.version,
        nodes: nodes
            .iter()
            .map(|(n, rec)| NodeInfo {
                node: *n,
                addr: rec.addr.clone(),
                state: if alive.get(&n.0).copied().unwrap_or(false) {
                    NodeState::Up
                } else {
                    NodeState::Down
                },
            })
            .collect(),
        chains: m
            .chains
            .iter()
            .map(|(id, c)| ChainInfo {
                chain: ChainId(*id),
                members: c
                    .members
                    .iter()
                    .map(|x| Member {
                        node: NodeId(x.node),
                        state: member_state(x.state),
                    })
                    .collect(),
            })
            .collect(),
    }
}
