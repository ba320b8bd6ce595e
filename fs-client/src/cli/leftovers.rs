//! `tessera fsck`'s look for chunks the namespace no longer accounts for: copies on data
//! servers of files that are gone and have no deletion queued (space that would leak
//! until a data server's sweep, every few minutes, or its restart).

use super::admin::FsckReport;
use crate::client::Client;
use crate::error::Result;
use crate::rpc;
use proto::data::{DeleteFile, ListChunks};
use proto::meta::cluster::InodesExist;
use proto::meta::ClusterMap;
use proto::{ChunkId, InodeId, NodeId};
use std::collections::BTreeMap;

/// Chunks asked for per `ListChunks` (the data server's own cap).
const LIST_PAGE: u32 = 1024;
/// Inodes asked about per `InodesExist` (the metadata server's cap).
const EXIST_BATCH: usize = 4096;

impl Client {
    /// Adds a problem line per file that is gone while data servers still hold chunks
    /// of it, naming the servers and the count; with `repair`, has those servers
    /// delete them. Servers that cannot be reached are skipped (the chunk check
    /// reports them).
    pub(crate) async fn check_leftovers(
        &self,
        map: &ClusterMap,
        repair: bool,
        report: &mut FsckReport,
    ) -> Result<()> {
        let mut held: BTreeMap<InodeId, BTreeMap<NodeId, u64>> = BTreeMap::new();
        for node in &map.nodes {
            let Ok(conn) = self.data_conn(node.node).await else {
                continue;
            };
            let chains = map
                .chains
                .iter()
                .filter(|c| c.members.iter().any(|m| m.node == node.node));
            for chain in chains {
                let mut after: Option<ChunkId> = None;
                loop {
                    let req = ListChunks {
                        chain: chain.chain,
                        after,
                        limit: LIST_PAGE,
                    };
                    let Ok(page) = rpc::data_call(&self.ep, &conn, req).await else {
                        break;
                    };
                    for c in &page {
                        *held
                            .entry(c.chunk.inode)
                            .or_default()
                            .entry(node.node)
                            .or_default() += 1;
                    }
                    match page.last() {
                        Some(last) if page.len() == LIST_PAGE as usize => after = Some(last.chunk),
                        _ => break,
                    }
                }
            }
        }
        let inodes: Vec<InodeId> = held.keys().copied().collect();
        for batch in inodes.chunks(EXIST_BATCH) {
            let req = InodesExist {
                inodes: batch.to_vec(),
            };
            let exist = self.meta(req).await?;
            for (ino, _) in batch.iter().zip(exist).filter(|(_, e)| !e) {
                let Some(nodes) = held.get(ino) else { continue };
                self.leftover(*ino, nodes, repair, report).await;
            }
        }
        Ok(())
    }

    /// Reports (and with `repair` deletes) the chunks of removed file `ino`.
    async fn leftover(
        &self,
        ino: InodeId,
        nodes: &BTreeMap<NodeId, u64>,
        repair: bool,
        report: &mut FsckReport,
    ) {
        let on: Vec<String> = nodes.iter().map(|(n, c)| format!("{c} on {n}")).collect();
        report.problems.push(format!(
            "{ino}: removed, but chunks are left ({}) with no deletion queued",
            on.join(", ")
        ));
        if !repair {
            return;
        }
        for &node in nodes.keys() {
            let req = DeleteFile { inode: ino };
            let r = match self.data_conn(node).await {
                Ok(conn) => rpc::data_call(&self.ep, &conn, req).await,
                Err(e) => Err(e),
            };
            match r {
                Ok(()) => report.repaired += 1,
                Err(e) => report.problems.push(format!(
                    "{ino} on {node}: deleting the left chunks failed: {e}"
                )),
            }
        }
    }
}
