//! Cluster membership as the namespace keeps it: the chains and map version in memory
//! and in the store, and the liveness that decides them. The rules themselves are a pure
//! function in [`crate::membership`]; this file reads the state it needs, calls it and
//! stores the result.
//!
//! Chains and the map version are stored (`C`, `V` keys), so membership survives a
//! restart; liveness is not: after a restart every server gets one lease to report.
//!
//! On a shared engine only the leader (`leader`) hears the data servers and applies
//! the rules; the other servers serve the chains as stored, read again when the stored
//! map version moves, and take a data server's state from its chains (a member is
//! offline exactly while its server is down, see `membership::reconcile`).

use super::keys;
use super::records::{decode, encode, ChainRecord};
use super::txn::Reads;
use super::{Namespace, MAX_NODES};
use crate::error::MetaError;
use crate::membership::{self, View, SERVING, SYNCING};
use proto::meta::{
    ChainInfo, ClusterMap, Member, MemberState, NodeInfo, NodeState, ResyncProgress, ResyncReport,
};
use proto::{ChainId, NodeId};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// How long a heartbeat being handled keeps its server live: a data server that died
/// with a beat stuck on the store is taken for dead this long after the beat arrived, at
/// the latest, plus its lease.
pub(crate) const MAX_BEAT_LIVE: Duration = Duration::from_secs(60);

/// When each data server was last heard from, and whose heartbeats are being handled.
#[derive(Default)]
pub(crate) struct Liveness {
    last: HashMap<NodeId, Instant>,
    /// Heartbeats under way per server, and when the oldest of them arrived. A beat
    /// waiting on this server's own store (an etcd without a quorum retries for
    /// `retry_for_ms`) holds its data server's next one back; that silence is the
    /// store's, not the data server's, and must not mark it offline (it would have to
    /// resync every chain once the store is back).
    in_flight: HashMap<NodeId, (u32, Instant)>,
}

impl Liveness {
    /// Records that `node` was heard from at `now`.
    pub(crate) fn heard(&mut self, node: NodeId, now: Instant) {
        self.last.insert(node, now);
    }

    /// Gives `node` a lease from `now` unless it was heard from already.
    fn heard_unless_known(&mut self, node: NodeId, now: Instant) {
        self.last.entry(node).or_insert(now);
    }

    /// A heartbeat of `node` arrived at `now` and is being handled.
    fn begin_beat(&mut self, node: NodeId, now: Instant) {
        self.heard(node, now);
        self.in_flight.entry(node).or_insert((0, now)).0 += 1;
    }

    /// A heartbeat of `node` was answered (or failed) at `now`.
    fn end_beat(&mut self, node: NodeId, now: Instant) {
        self.heard(node, now);
        debug_assert!(
            self.in_flight.contains_key(&node),
            "a beat ended that never began"
        );
        if let Some((n, _)) = self.in_flight.get_mut(&node) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.in_flight.remove(&node);
            }
        }
    }

    /// How long `node` has been silent at `now`: zero while one of its heartbeats is
    /// being handled (for at most [`MAX_BEAT_LIVE`] since the oldest arrived),
    /// `Duration::MAX` if it was never heard from.
    fn silence(&self, node: NodeId, now: Instant) -> Duration {
        if let Some(&(_, since)) = self.in_flight.get(&node) {
            if now.saturating_duration_since(since) < MAX_BEAT_LIVE {
                return Duration::ZERO;
            }
        }
        self.last
            .get(&node)
            .map_or(Duration::MAX, |&at| now.saturating_duration_since(at))
    }
}

/// A heartbeat being handled: `node` counts as live until it is dropped, and as heard
/// from at that moment.
pub(crate) struct BeatInFlight<'a> {
    ns: &'a Namespace,
    node: NodeId,
    /// The beat named no registered server: it leaves nothing behind.
    unknown: bool,
}

impl<'a> BeatInFlight<'a> {
    /// Marks a beat of `node` arrived now.
    pub(crate) fn begin(ns: &'a Namespace, node: NodeId) -> BeatInFlight<'a> {
        ns.liveness.lock().begin_beat(node, ns.clock.now());
        BeatInFlight {
            ns,
            node,
            unknown: false,
        }
    }

    /// The beat's server turned out not to be registered: its lease goes with the beat,
    /// so that beats with made-up ids do not grow the table of leases.
    pub(crate) fn unknown(&mut self) {
        self.unknown = true;
    }
}

impl Drop for BeatInFlight<'_> {
    fn drop(&mut self) {
        let now = self.ns.clock.now();
        let mut live = self.ns.liveness.lock();
        live.end_beat(self.node, now);
        if self.unknown && !live.in_flight.contains_key(&self.node) {
            live.last.remove(&self.node);
        }
    }
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
        m.version = self.stored_map_version()?;
        m.chains.clear();
        let prefix = keys::chain_prefix();
        for (k, v) in self
            .store
            .scan(&prefix, &keys::prefix_end(&prefix), MAX_NODES * 4)?
        {
            let id = keys::u32_at(&k, prefix.len())
                .ok_or_else(|| MetaError::Corrupt(format!("chain key {k:x?}")))?;
            m.chains.insert(id, decode(&v, "chain record")?);
        }
        let nodes = self.nodes()?;
        let now = self.clock.now();
        let mut live = self.liveness.lock();
        for (node, _) in nodes {
            live.heard_unless_known(node, now);
        }
        m.loaded = true;
        Ok(())
    }

    /// The map version as stored (0 before the first).
    fn stored_map_version(&self) -> Result<u64, MetaError> {
        match self.store.get(&keys::map_version())? {
            Some(v) => decode(&v, "map version"),
            None => Ok(0),
        }
    }

    /// Becoming the leader on a shared engine: the chains are read again; a data server
    /// up in them (not offline in every chain it is in) gets a lease from now, as after
    /// a restart (this server heard none of them before); one the last leader took for
    /// dead stays so, silent just past its lease (so it is replaced `replace_after_ms`
    /// from now at the latest, unless it beats again).
    pub(super) fn take_over_membership(&self) -> Result<(), MetaError> {
        let mut m = self.members.lock();
        m.loaded = false;
        m.resync.clear();
        self.load_members(&mut m)?;
        let nodes = self.nodes()?;
        let now = self.clock.now();
        let lease = Duration::from_millis(self.config.node_lease_ms);
        let dead_since = now
            .checked_sub(lease + Duration::from_millis(1))
            .unwrap_or(now);
        let mut live = self.liveness.lock();
        for (node, _) in &nodes {
            let at = match up_in_chains(&m, node.0) {
                true => now,
                false => dead_since,
            };
            live.heard(*node, at);
        }
        Ok(())
    }

    /// Applies the membership rules (see [`membership::reconcile`]) to the chains and
    /// the liveness of now; stores what changed; returns the current map. A follower on
    /// a shared engine applies none: it reads the chains again if the stored version
    /// moved.
    pub(crate) fn reconcile(&self) -> Result<Arc<ClusterMap>, MetaError> {
        let mut m = self.members.lock();
        let leads = self.leads();
        if !leads && m.loaded && self.stored_map_version()? != m.version {
            m.loaded = false;
        }
        self.load_members(&mut m)?;
        let nodes = self.nodes()?;
        let silence = self.silence(&nodes);
        let view = View {
            silence: &silence,
            target: usize::from(self.target_copies(nodes.len())),
            version: m.version,
            lease: Duration::from_millis(self.config.node_lease_ms),
            replace_after: Duration::from_millis(self.config.replace_after_ms),
        };
        if let Some(change) = membership::reconcile(&m.chains, &view).filter(|_| leads) {
            debug_assert_eq!(change.version, m.version + 1, "one version per change");
            m.chains = change.chains;
            self.persist(&mut m, &change.changed)?;
        }
        let map = Arc::new(build_map(&m, &nodes, &view, leads));
        *self.map.write() = map.clone();
        Ok(map)
    }

    /// Time since each registered server's last heartbeat, by the namespace's clock.
    fn silence(&self, nodes: &[(NodeId, super::records::NodeRecord)]) -> BTreeMap<u32, Duration> {
        let now = self.clock.now();
        let live = self.liveness.lock();
        nodes
            .iter()
            .map(|(n, _)| (n.0, live.silence(*n, now)))
            .collect()
    }

    /// The cluster map version as last loaded (0 before the map was first read), for
    /// the record grants carry.
    pub fn map_version(&self) -> u64 {
        self.members.lock().version
    }

    /// Runs `f` (a registration's transaction, which writes a new map version with
    /// [`next_map_version`] when it says so) under the membership lock, and notes the
    /// version it wrote.
    pub(crate) fn with_map_version<T>(
        &self,
        f: impl FnOnce(u64) -> Result<(T, bool), MetaError>,
    ) -> Result<T, MetaError> {
        let mut m = self.members.lock();
        self.load_members(&mut m)?;
        let (out, bumped) = self
            .leader_write(|| f(m.version))
            .inspect_err(|_| m.loaded = false)?;
        if bumped {
            m.version += 1;
            tracing::info!(version = m.version, "cluster map changed: a server moved");
        }
        Ok(out)
    }

    /// How many servers hold a lease (tests: beats of unknown servers leave none).
    #[cfg(test)]
    pub(crate) fn leases(&self) -> usize {
        self.liveness.lock().last.len()
    }

    /// A new map version with no chain changed (tests: a deposed leader's write).
    #[cfg(test)]
    pub(crate) fn bump_map_version(&self) -> Result<(), MetaError> {
        let mut m = self.members.lock();
        self.load_members(&mut m)?;
        self.persist(&mut m, &[])
    }

    /// Stores the changed chains and a new map version. On a shared engine only while
    /// this server leads and the stored version is the one it read: otherwise nothing is
    /// written, the chains are read again at the next use, and it follows.
    fn persist(&self, m: &mut Members, changed: &[u32]) -> Result<(), MetaError> {
        let r = self.leader_write(|| self.persist_checked(m, changed));
        if r.is_err() {
            // What is in memory may be ahead of the store now.
            m.loaded = false;
        }
        r
    }

    fn persist_checked(&self, m: &mut Members, changed: &[u32]) -> Result<(), MetaError> {
        let version = m.version + 1;
        debug_assert!(version > m.version, "map versions only grow");
        let mut rows = Vec::with_capacity(changed.len());
        for id in changed {
            if let Some(c) = m.chains.get(id) {
                rows.push((keys::chain(ChainId(*id)), encode(c)?));
            }
        }
        let read = m.version;
        self.mutate(|txn, _| {
            for (k, v) in rows.iter().cloned() {
                txn.put(k, v);
            }
            next_map_version(txn, read)
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
        let synced: Vec<u32> = report.synced.iter().map(|c| c.0).collect();
        let changed = membership::mark_synced(&mut m.chains, node.0, &synced, report.pass_version);
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
        // A follower hears no heartbeat: only the leader knows how long one was silent.
        if !self.leads() {
            return Vec::new();
        }
        let gone_after = Duration::from_millis(self.config.node_lease_ms)
            .saturating_add(Duration::from_millis(self.config.replace_after_ms));
        let now = self.clock.now();
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
                let silent = live.silence(n.node, now);
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

/// Writes map version `read + 1` into `txn`; on a shared engine only while this server
/// leads (`leader::confirm`) and the stored version is still `read`.
pub(super) fn next_map_version(txn: &mut super::txn::Txn<'_>, read: u64) -> Result<(), MetaError> {
    if txn.is_shared() {
        super::leader::confirm(txn)?;
        let stored: u64 = match txn.raw(&keys::map_version())? {
            Some(v) => decode(&v, "map version")?,
            None => 0,
        };
        if stored != read {
            return Err(MetaError::NotLeader(format!(
                "the map moved to version {stored} under another leader"
            )));
        }
    }
    txn.put(keys::map_version(), encode(&(read + 1))?);
    Ok(())
}

/// Whether data server `node` is up as `m`'s chains say: a member of some chain, and
/// not offline in all of them (the rules keep a member offline exactly while its server
/// is down, and a live server always heads a chain; one in none was taken out of its
/// chains for being dead too long).
fn up_in_chains(m: &Members, node: u32) -> bool {
    m.chains
        .values()
        .flat_map(|c| c.members.iter())
        .any(|x| x.node == node && x.state != membership::OFFLINE)
}

/// The map of `m`'s chains. A data server is up if its lease in `view` runs (`heard`:
/// this server hears the heartbeats), else as the chains say ([`up_in_chains`]: a
/// follower on a shared engine, which hears none).
fn build_map(
    m: &Members,
    nodes: &[(NodeId, super::records::NodeRecord)],
    view: &View<'_>,
    heard: bool,
) -> ClusterMap {
    let up = |n: u32| match heard {
        true => view.alive(n),
        false => up_in_chains(m, n),
    };
    ClusterMap {
        version: m.version,
        nodes: nodes
            .iter()
            .map(|(n, rec)| NodeInfo {
                node: *n,
                addr: rec.addr.clone(),
                state: if up(n.0) {
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

#[cfg(test)]
mod liveness_tests {
    use super::*;

    /// Guards against a data server taken for dead while its heartbeat waits on the
    /// metadata server's own store, and against one counted live for ever by a beat
    /// that never ends.
    #[test]
    fn a_server_whose_beat_is_being_handled_is_not_silent() {
        let t0 = Instant::now();
        let (a, b) = (NodeId(1), NodeId(2));
        let mut live = Liveness::default();
        assert_eq!(live.silence(a, t0), Duration::MAX, "never heard from");
        live.heard(b, t0);
        live.begin_beat(a, t0);
        live.begin_beat(a, t0);
        // A beat stuck on the store for longer than any lease: still live.
        let later = t0 + Duration::from_secs(30);
        assert_eq!(live.silence(a, later), Duration::ZERO);
        assert_eq!(live.silence(b, later), Duration::from_secs(30));
        live.end_beat(a, later);
        assert_eq!(
            live.silence(a, later + Duration::from_secs(1)),
            Duration::ZERO
        );
        // Its last beat answered: silent from that answer on.
        live.end_beat(a, later);
        assert_eq!(
            live.silence(a, later + Duration::from_secs(1)),
            Duration::from_secs(1)
        );
        live.heard_unless_known(a, t0);
        assert_eq!(
            live.silence(a, later),
            Duration::ZERO,
            "the later time kept"
        );
        // A beat stuck past the bound counts as silence again.
        live.begin_beat(b, t0);
        let past = t0 + MAX_BEAT_LIVE + Duration::from_secs(1);
        assert_eq!(
            live.silence(b, past),
            MAX_BEAT_LIVE + Duration::from_secs(1)
        );
    }
}
