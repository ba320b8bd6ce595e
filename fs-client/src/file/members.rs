//! Which chain members a data request goes to, and what a failure calls for: pure
//! decisions over the cluster map, which `replicas.rs` applies with calls and retries.

use crate::error::{ClientError, Result};
use proto::meta::{ChainInfo, ClusterMap};
use proto::{ChainId, ChunkId, ErrorCode, Layout, NodeId};
use std::collections::{BTreeMap, BTreeSet};
use transport::TransportError;

/// What a failure calls for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// Our map is old: refresh and retry now.
    Refresh,
    /// A server is unreachable: wait for the map to change, then retry.
    Wait,
    /// The server is at its limit of calls: retry shortly.
    Pause,
    /// The head's copy of this chunk is being repaired from another member: retry,
    /// waiting longer each time, until the failover deadline.
    Repairing,
    /// Nothing to retry.
    Fail,
}

/// What the failure `e` of a data request calls for.
pub(super) fn classify(e: &ClientError) -> Next {
    match e {
        ClientError::Remote(w) => match w.code {
            ErrorCode::Stale => Next::Refresh,
            ErrorCode::Unavailable | ErrorCode::TimedOut => Next::Wait,
            ErrorCode::Busy => Next::Repairing,
            ErrorCode::Overloaded => Next::Pause,
            _ => Next::Fail,
        },
        ClientError::Transport(
            TransportError::Disconnected { .. }
            | TransportError::Connect { .. }
            | TransportError::Handshake { .. }
            | TransportError::TimedOut { .. },
        ) => Next::Wait,
        ClientError::NotInMap(_) => Next::Wait,
        _ => Next::Fail,
    }
}

impl Next {
    /// Whether a failure calling for this counts against a request's tries: a repair
    /// under way (the head answers `Busy` only while another member serves the chain to
    /// copy from) ends by itself, so only the failover deadline bounds its pauses.
    pub(super) fn counts_as_try(self) -> bool {
        !matches!(self, Next::Repairing)
    }
}

/// Not in the map (errno as `Unavailable`): retried once the map changes.
pub(super) fn unavailable(msg: String) -> ClientError {
    ClientError::NotInMap(msg)
}

/// `chain` as `map` knows it; a chain the map lacks is `Unavailable` (retried once the
/// map changes).
fn chain_in(map: &ClusterMap, chain: ChainId) -> Result<&ChainInfo> {
    map.chain(chain)
        .ok_or_else(|| unavailable(format!("{chain} is not in cluster map {}", map.version)))
}

/// The member a write of `chain` goes to: the head of its write order (a serving
/// member when there is one), which forwards down the chain.
pub(super) fn write_head(map: &ClusterMap, replicas: u8, chain: ChainId) -> Result<NodeId> {
    chain_in(map, chain)?
        .write_order(replicas)
        .first()
        .copied()
        .ok_or_else(|| unavailable(format!("{chain} has no member up")))
}

/// The members a read of `chain` tries, in order: its serving members, the first one
/// first. Consecutive chunks lie on consecutive chains, and every server heads one
/// chain, so this spreads a file's chunks evenly over the servers. (Picking the member
/// by chunk index too, as before, sent two thirds of a file's reads to one of three
/// servers.)
pub(super) fn read_order(map: &ClusterMap, replicas: u8, chain: ChainId) -> Result<Vec<NodeId>> {
    let readers = chain_in(map, chain)?.readers(replicas);
    if readers.is_empty() {
        return Err(unavailable(format!("{chain} has no serving member")));
    }
    Ok(readers)
}

/// Per member, the chunks an fsync makes durable there: every member of each chain
/// that takes writes.
pub(super) fn sync_targets(
    map: &ClusterMap,
    replicas: u8,
    chunks: &BTreeMap<ChainId, BTreeSet<ChunkId>>,
) -> Result<BTreeMap<NodeId, Vec<ChunkId>>> {
    let mut per_node: BTreeMap<NodeId, Vec<ChunkId>> = BTreeMap::new();
    for (chain, set) in chunks {
        let members = chain_in(map, *chain)?.write_order(replicas);
        if members.is_empty() {
            return Err(unavailable(format!("{chain} has no member up")));
        }
        for node in members {
            per_node
                .entry(node)
                .or_default()
                .extend(set.iter().copied());
        }
    }
    Ok(per_node)
}

/// The members a truncation of a file with `layout` cuts: every member of its chains
/// that takes writes.
pub(super) fn truncate_targets(map: &ClusterMap, layout: &Layout) -> Result<BTreeSet<NodeId>> {
    let mut nodes = BTreeSet::new();
    for chain in &layout.chains {
        nodes.extend(chain_in(map, *chain)?.write_order(layout.replicas));
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::meta::{Member, MemberState, NodeInfo, NodeState};
    use proto::{InodeId, WireError};

    /// Chains 1..=3 over nodes 1..=3, each headed by its own node; `states` gives the
    /// members' states of chain 1.
    fn map(states: [MemberState; 3]) -> ClusterMap {
        let node = |n| NodeInfo {
            node: NodeId(n),
            addr: format!("127.0.0.1:{n}"),
            state: NodeState::Up,
        };
        let chain = |c: u32, states: [MemberState; 3]| ChainInfo {
            chain: ChainId(c),
            members: (0..3u32)
                .map(|i| Member {
                    node: NodeId((c - 1 + i) % 3 + 1),
                    state: states[i as usize],
                })
                .collect(),
        };
        let serving = [MemberState::Serving; 3];
        ClusterMap {
            version: 7,
            nodes: (1..=3).map(node).collect(),
            chains: vec![chain(1, states), chain(2, serving), chain(3, serving)],
        }
    }

    const S: MemberState = MemberState::Serving;

    fn chunk(index: u64) -> ChunkId {
        ChunkId {
            inode: InodeId(42),
            index,
        }
    }

    #[test]
    fn a_write_goes_to_the_first_serving_member_and_a_syncing_one_only_as_a_last_resort() {
        let m = map([S, S, S]);
        assert_eq!(write_head(&m, 3, ChainId(1)).ok(), Some(NodeId(1)));
        assert_eq!(write_head(&m, 3, ChainId(2)).ok(), Some(NodeId(2)));
        let m = map([MemberState::Syncing, S, S]);
        assert_eq!(
            write_head(&m, 3, ChainId(1)).ok(),
            Some(NodeId(2)),
            "a syncing head is passed over for a serving member"
        );
        let m = map([MemberState::Syncing, S, S]);
        assert_eq!(
            write_head(&m, 1, ChainId(1)).ok(),
            Some(NodeId(1)),
            "one copy: the only member used, syncing or not"
        );
        let e = write_head(&m, 3, ChainId(9)).err();
        assert_eq!(e.map(|e| classify(&e)), Some(Next::Wait), "unknown chain");
    }

    #[test]
    fn a_read_tries_the_serving_members_of_the_copies_the_file_uses_in_chain_order() {
        let m = map([S, MemberState::Syncing, S]);
        assert_eq!(
            read_order(&m, 3, ChainId(1)).ok(),
            Some(vec![NodeId(1), NodeId(3)])
        );
        assert_eq!(read_order(&m, 2, ChainId(1)).ok(), Some(vec![NodeId(1)]));
        let m = map([MemberState::Syncing, S, S]);
        let e = read_order(&m, 1, ChainId(1)).err();
        assert_eq!(
            e.map(|e| classify(&e)),
            Some(Next::Wait),
            "no serving member"
        );
    }

    #[test]
    fn an_fsync_reaches_every_member_that_takes_writes_once_per_member() {
        let m = map([S, MemberState::Syncing, S]);
        let mut chunks = BTreeMap::new();
        chunks.insert(ChainId(1), BTreeSet::from([chunk(0), chunk(3)]));
        chunks.insert(ChainId(2), BTreeSet::from([chunk(1)]));
        let t = sync_targets(&m, 3, &chunks).ok();
        let want = BTreeMap::from([
            (NodeId(1), vec![chunk(0), chunk(3), chunk(1)]),
            (NodeId(2), vec![chunk(0), chunk(3), chunk(1)]),
            (NodeId(3), vec![chunk(0), chunk(3), chunk(1)]),
        ]);
        assert_eq!(t, Some(want));
        let t = sync_targets(&m, 1, &chunks).ok();
        let want = BTreeMap::from([
            (NodeId(1), vec![chunk(0), chunk(3)]),
            (NodeId(2), vec![chunk(1)]),
        ]);
        assert_eq!(t, Some(want), "one copy: the heads only");
    }

    #[test]
    fn a_truncation_cuts_every_member_of_every_chain_of_the_file() {
        let m = map([S, S, S]);
        let layout = |chains: Vec<u32>, replicas| Layout {
            chunk_size_bytes: 1 << 20,
            chains: chains.into_iter().map(ChainId).collect(),
            first: 0,
            replicas,
        };
        let all = BTreeSet::from([NodeId(1), NodeId(2), NodeId(3)]);
        assert_eq!(truncate_targets(&m, &layout(vec![1], 3)).ok(), Some(all));
        let heads = BTreeSet::from([NodeId(1), NodeId(3)]);
        assert_eq!(
            truncate_targets(&m, &layout(vec![1, 3], 1)).ok(),
            Some(heads)
        );
        assert!(truncate_targets(&m, &layout(vec![4], 3)).is_err());
    }

    #[test]
    fn failures_are_retried_as_their_cause_says() {
        let remote = |code| ClientError::Remote(WireError::new(code, "x"));
        assert_eq!(classify(&remote(ErrorCode::Stale)), Next::Refresh);
        assert_eq!(classify(&remote(ErrorCode::Unavailable)), Next::Wait);
        assert_eq!(classify(&remote(ErrorCode::TimedOut)), Next::Wait);
        assert_eq!(classify(&remote(ErrorCode::Busy)), Next::Repairing);
        assert_eq!(classify(&remote(ErrorCode::Overloaded)), Next::Pause);
        assert_eq!(classify(&remote(ErrorCode::Corrupt)), Next::Fail);
        assert_eq!(classify(&unavailable("x".into())), Next::Wait);
        assert_eq!(classify(&ClientError::Protocol("x".into())), Next::Fail);
        // A busy chunk is waited for until the deadline; the rest use up tries.
        assert!(!Next::Repairing.counts_as_try());
        assert!(Next::Pause.counts_as_try() && Next::Wait.counts_as_try());
    }
}
