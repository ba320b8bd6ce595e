//! `tessera status` and `tessera fsck`: the cluster's health, and a check that every
//! chunk the metadata points to is on its replicas, whole, and the same everywhere.

use crate::client::Client;
use crate::error::{ClientError, Result};
use crate::rpc;
use proto::data::{ChunkInfo, ChunkMeta, Repair};
use proto::meta::admin::{CheckNamespace, Status};
use proto::meta::cluster::{FilesPage, ListFiles};
use proto::meta::{ClusterMap, ClusterStatus, MemberState, NodeState};
use proto::{ChainId, ChunkId, InodeId, NodeId};
use std::fmt::Write as _;

/// What `status` says under a DOWN server: what happens next and how to bring it back.
const DOWN_HINT: &str = "  A DOWN server's chains go on without it. After the metadata \
server's\n  replace_after_ms (default 10 min) it leaves them and another server takes its \
place.\n  Bring it back before then (a local cluster: `tessera up MOUNTPOINT`) and it \
resyncs.";

/// Files one `ListFiles` call asks for.
const FILES_PER_PAGE: u32 = 256;

impl Client {
    /// The cluster's health from the metadata server.
    pub async fn status(&self) -> Result<ClusterStatus> {
        self.meta(Status).await
    }
}

/// How a server is called: by its role in a local cluster (`data-0`, as its log and the
/// pids file call it) next to its node id, when `names` (address, role) knows it.
fn server_name(map: &ClusterMap, node: NodeId, names: &[(String, String)]) -> String {
    let role = map
        .addr(node)
        .and_then(|a| names.iter().find(|(addr, _)| addr == a))
        .map(|(_, role)| role);
    match role {
        Some(r) => format!("{r} ({node})"),
        None => node.to_string(),
    }
}

/// `status` as text, one line per server and chain; `bar` adds a progress bar of the
/// replicated share of the chunks. `names` (address, role) names the servers of a local
/// cluster as its logs do.
pub fn render_status(s: &ClusterStatus, bar: bool, names: &[(String, String)]) -> String {
    let mut out = String::new();
    let map = &s.map;
    let name = |node: NodeId| server_name(map, node, names);
    let up = map
        .nodes
        .iter()
        .filter(|n| n.state == NodeState::Up)
        .count();
    let _ = writeln!(
        out,
        "cluster map v{}: {} data servers ({up} up), {} chains, {} copies per chunk",
        map.version,
        map.nodes.len(),
        map.chains.len(),
        s.target_replicas
    );
    for n in &map.nodes {
        let state = match n.state {
            NodeState::Up => "up".to_string(),
            NodeState::Down => match s.replaced_in_ms.iter().find(|(x, _)| *x == n.node) {
                Some((_, ms)) => format!("DOWN (replaced in {})", duration_text(*ms)),
                None => "DOWN".to_string(),
            },
        };
        let _ = writeln!(out, "  {:<18} {:<24} {state}", name(n.node), n.addr);
    }
    if map.nodes.iter().any(|n| n.state == NodeState::Down) {
        let _ = writeln!(out, "{DOWN_HINT}");
    }
    for c in &map.chains {
        let members: Vec<String> = c
            .members
            .iter()
            .map(|m| {
                let st = match m.state {
                    MemberState::Serving => "serving",
                    MemberState::Syncing => "syncing",
                    MemberState::Offline => "OFFLINE",
                };
                format!("{} {st}", name(m.node))
            })
            .collect();
        let _ = writeln!(out, "  {:<18} {}", c.chain.to_string(), members.join(", "));
    }
    let _ = writeln!(
        out,
        "under-replicated chunks: {} of {}",
        s.under_replicated_chunks, s.chunks
    );
    for r in &s.resync {
        let _ = writeln!(
            out,
            "resync {}: {} of {} chunks compared, {} copied",
            name(r.node),
            r.compared,
            r.total,
            r.copied
        );
    }
    if bar {
        let done = s.chunks.saturating_sub(s.under_replicated_chunks);
        let _ = writeln!(out, "{}", progress_bar(done, s.chunks, 40));
    }
    out
}

/// `1h 02m`, `9m 30s`, `12s`: a countdown for people.
fn duration_text(ms: u64) -> String {
    let s = ms.div_ceil(1000);
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, min, sec) => format!("{min}m {sec:02}s"),
        (h, min, _) => format!("{h}h {min:02}m"),
    }
}

/// `[#####.....] 50%`
pub fn progress_bar(done: u64, total: u64, width: usize) -> String {
    let frac = if total == 0 {
        1.0
    } else {
        done as f64 / total as f64
    };
    let filled = ((frac * width as f64).round() as usize).min(width);
    format!(
        "[{}{}] {:>3}% replicated",
        "#".repeat(filled),
        ".".repeat(width - filled),
        (frac * 100.0).floor() as u64
    )
}

/// What `fsck` found.
#[derive(Debug, Default)]
pub struct FsckReport {
    /// Regular files walked.
    pub files: u64,
    /// Chunk copies checked.
    pub copies: u64,
    /// One line per problem.
    pub problems: Vec<String>,
    /// Copies replaced from a good one (with `repair`).
    pub repaired: u64,
}

impl FsckReport {
    /// Nothing wrong.
    pub fn clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// One copy's state as fsck sees it.
enum Copy {
    Good(ChunkMeta),
    Missing,
    Bad(String),
}

impl Client {
    /// Checks the namespace, then every chunk of every regular file on every member of
    /// its chain: present where any copy exists, every block's checksum valid, the same
    /// version everywhere, not stale. With `repair`, a bad copy is replaced by a good
    /// one (the serving member with the highest version). Last, chunks of files that
    /// are gone with no deletion queued (see `leftovers.rs`).
    pub async fn fsck(&self, repair: bool) -> Result<FsckReport> {
        let mut report = FsckReport::default();
        let problems = self.meta(CheckNamespace).await?;
        report
            .problems
            .extend(problems.into_iter().map(|p| format!("namespace: {p}")));
        let map = self.cluster_map().await?;
        let mut after = InodeId(0);
        loop {
            let req = ListFiles {
                after,
                limit: FILES_PER_PAGE,
            };
            let FilesPage { files, done } = self.meta(req).await?;
            for f in &files {
                report.files += 1;
                let cs = u64::from(f.layout.chunk_size_bytes.max(1));
                for index in 0..f.size.div_ceil(cs) {
                    let Some(chain) = f.layout.chain_for(index) else {
                        report
                            .problems
                            .push(format!("{}: no chains in its layout", f.ino));
                        break;
                    };
                    let chunk = ChunkId {
                        inode: f.ino,
                        index,
                    };
                    self.check_chunk(&map, chain, f.layout.replicas, chunk, repair, &mut report)
                        .await?;
                }
            }
            match files.last() {
                Some(last) if !done => after = last.ino,
                _ => break,
            }
        }
        self.check_leftovers(&map, repair, &mut report).await?;
        Ok(report)
    }

    async fn check_chunk(
        &self,
        map: &ClusterMap,
        chain: ChainId,
        replicas: u8,
        chunk: ChunkId,
        repair: bool,
        report: &mut FsckReport,
    ) -> Result<()> {
        let Some(info) = map.chain(chain) else {
            report
                .problems
                .push(format!("{chunk}: {chain} is not in the cluster map"));
            return Ok(());
        };
        let mut copies: Vec<(NodeId, Copy)> = Vec::new();
        for m in info.used(replicas) {
            if m.state != MemberState::Serving {
                report
                    .problems
                    .push(format!("{chunk}: {} is {:?} in {chain}", m.node, m.state));
                continue;
            }
            report.copies += 1;
            copies.push((m.node, self.probe(m.node, chunk).await));
        }
        let best = copies
            .iter()
            .filter_map(|(n, c)| match c {
                Copy::Good(meta) => Some((*n, meta.version)),
                _ => None,
            })
            .max_by_key(|(_, v)| *v);
        let any_copy = copies.iter().any(|(_, c)| !matches!(c, Copy::Missing));
        if !any_copy {
            return Ok(()); // a hole: no member holds it, and none should.
        }
        for (node, copy) in &copies {
            let wrong = match (copy, best) {
                (Copy::Good(m), Some((_, v))) if m.version == v && !m.stale => None,
                (Copy::Good(m), Some((_, v))) => Some(format!(
                    "version {}{}, the best copy has {v}",
                    m.version,
                    if m.stale { " (stale)" } else { "" }
                )),
                (Copy::Good(_), None) => None,
                (Copy::Missing, _) => Some("missing".to_string()),
                (Copy::Bad(e), _) => Some(e.clone()),
            };
            let Some(what) = wrong else { continue };
            report.problems.push(format!("{chunk} on {node}: {what}"));
            if let (true, Some((from, _))) = (repair, best) {
                let from_addr = map.addr(from).unwrap_or_default().to_string();
                let conn = self.data_conn(*node).await?;
                let req = Repair {
                    chunk,
                    chain,
                    from: from_addr,
                };
                match rpc::data_call(&self.ep, &conn, req).await {
                    Ok(_) => report.repaired += 1,
                    Err(e) => report
                        .problems
                        .push(format!("{chunk} on {node}: repair failed: {e}")),
                }
            }
        }
        Ok(())
    }

    /// One copy, read whole and verified by its server.
    async fn probe(&self, node: NodeId, chunk: ChunkId) -> Copy {
        let conn = match self.data_conn(node).await {
            Ok(c) => c,
            Err(e) => return Copy::Bad(format!("unreachable: {e}")),
        };
        let req = ChunkInfo {
            chunk,
            verify: true,
        };
        match rpc::data_call(&self.ep, &conn, req).await {
            Ok(Some(m)) => Copy::Good(m),
            Ok(None) => Copy::Missing,
            Err(ClientError::Remote(e)) => Copy::Bad(format!("{:?}: {}", e.code, e.message)),
            Err(e) => Copy::Bad(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::meta::{ChainInfo, Member, NodeInfo, ResyncProgress};

    fn status(down: bool) -> ClusterStatus {
        let node = |n: u32, state| NodeInfo {
            node: NodeId(n),
            addr: format!("127.0.0.1:{}", 4000 + n),
            state,
        };
        let member = |n: u32, state| Member {
            node: NodeId(n),
            state,
        };
        let second = if down { NodeState::Down } else { NodeState::Up };
        ClusterStatus {
            map: ClusterMap {
                version: 3,
                nodes: vec![node(1, NodeState::Up), node(2, second)],
                chains: vec![ChainInfo {
                    chain: ChainId(1),
                    members: vec![
                        member(1, MemberState::Serving),
                        member(2, MemberState::Syncing),
                    ],
                }],
            },
            target_replicas: 2,
            under_replicated_chunks: 5,
            chunks: 10,
            resync: vec![ResyncProgress {
                node: NodeId(2),
                compared: 4,
                copied: 1,
                total: 5,
            }],
            replaced_in_ms: if down {
                vec![(NodeId(2), 570_000)]
            } else {
                Vec::new()
            },
        }
    }

    /// Guards against `status` calling servers `node:2` while the logs and the pids file
    /// say `data-0`, and a DOWN server without a word on what happens next.
    #[test]
    fn status_names_servers_as_their_logs_do_and_explains_down() {
        let names = vec![("127.0.0.1:4002".to_string(), "data-0".to_string())];
        let text = render_status(&status(true), false, &names);
        assert!(text.contains("data-0 (node:2)    127.0.0.1:4002"), "{text}");
        assert!(text.contains("data-0 (node:2) syncing"), "{text}");
        assert!(
            text.contains("resync data-0 (node:2): 4 of 5 chunks compared, 1 copied"),
            "{text}"
        );
        assert!(
            text.contains("node:1 serving"),
            "unnamed servers keep their id: {text}"
        );
        assert!(text.contains("replace_after_ms"), "{text}");
        assert!(text.contains("DOWN (replaced in 9m 30s)"), "{text}");
        assert!(text.contains("tessera up MOUNTPOINT"), "{text}");
        let text = render_status(&status(false), false, &[]);
        assert!(
            !text.contains("replace_after_ms"),
            "no hint without a DOWN server"
        );
    }

    #[test]
    fn countdowns_read_as_hours_minutes_seconds() {
        assert_eq!(duration_text(0), "0s");
        assert_eq!(duration_text(11_001), "12s");
        assert_eq!(duration_text(570_000), "9m 30s");
        assert_eq!(duration_text(3_720_000), "1h 02m");
    }
}
