//! Bringing copies up to date: serving whole chunks to a peer, copying one from a peer,
//! and the background task that resyncs the chains this server is syncing in, repairs
//! copies marked stale, and drops chunks of chains it is no longer a member of.

use super::{blocking, call_peer, Inner, MAX_LIST_CHUNKS};
use crate::error::DataError;
use crate::metrics::OneSided;
use crate::store::list_order;
use crate::store::ReplicaFields;
use parking_lot::Mutex;
use proto::data::{ChunkInfo, ChunkMeta, FetchChunk, ListChunks};
use proto::meta::cluster::{InodeCopies, InodesExist, MAX_COPIES_QUERY};
use proto::meta::{ClusterMap, MemberState, ResyncReport};
use proto::{ChainId, ChunkId, ErrorCode, NodeId, RemoteBuf};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};
use transport::{Access, Connection};

/// Copies of one chunk a repair tries before giving up until the next pass (the source
/// may change the chunk while it is copied).
const REPAIR_ATTEMPTS: u32 = 3;
/// How often, at the latest, a server walks all its chunks looking for chunks of
/// chains it left, stale copies and chunks of files that no longer exist (also after
/// every map change and every copy found stale).
const SWEEP_EVERY: Duration = Duration::from_secs(300);
/// Inodes asked about in one `InodesExist` call.
const EXIST_BATCH: usize = 1024;

impl Inner {
    /// Serves `FetchChunk`: the whole chunk into the caller's buffer, with its state.
    pub(super) async fn fetch(
        &self,
        conn: &Connection,
        chunk: ChunkId,
        dest: RemoteBuf,
    ) -> Result<ChunkMeta, DataError> {
        let _lock = self.locks.read(chunk).await;
        let store = self.store.clone();
        let Some((meta, bytes)) = blocking(move || store.fetch(chunk)).await? else {
            return Err(DataError::NotFound(format!("{chunk} is not here")));
        };
        if meta.len > dest.len {
            return Err(DataError::TooBig(format!(
                "{chunk} holds {} bytes, the buffer {}",
                meta.len, dest.len
            )));
        }
        super::check_span(&dest)?;
        let step = self.pool.buffer_bytes();
        for (i, part) in bytes.chunks(step).enumerate() {
            let buf = self.pool.take().await;
            let mr = buf.mr().clone();
            mr.lock()[..part.len()].copy_from_slice(part);
            let at = (i * step) as u64;
            let target = RemoteBuf {
                addr: dest.addr + at,
                len: part.len() as u64,
                key: dest.key,
            };
            let write = conn.write(target, &mr, 0);
            self.one_sided(conn, OneSided::Write, part.len() as u64, write)
                .await
                .map_err(DataError::from)?;
        }
        Ok(meta)
    }

    /// Replaces the local copy of `chunk` by the one at `from`. A source without the
    /// chunk makes the local copy go too. A copy newer than the source's is fetched
    /// again; found newer twice against the same source version, the source's replaces
    /// it if the source still serves the chain ([`Repaired::ReplacedNewer`], see below).
    ///
    /// With `may_drop` false, a source without the chunk leaves the local copy alone
    /// (an error says so): a member that may never have held it (see [`Holders`]).
    pub(super) async fn repair_from(
        &self,
        from: &str,
        chunk: ChunkId,
        chain: ChainId,
        may_drop: bool,
    ) -> Result<Repaired, DataError> {
        let conn = self.view.peer_at(from).await?;
        // The source's version when it was found older than this copy.
        let mut behind = None;
        for _ in 0..REPAIR_ATTEMPTS {
            let Some(info) = info(&conn, chunk).await? else {
                if !may_drop {
                    return Err(DataError::Stale(format!(
                        "{chunk}: {from} has no copy, and may never have held one"
                    )));
                }
                let _lock = self.locks.write(chunk).await;
                let store = self.store.clone();
                blocking(move || store.delete_chunk(chunk)).await?;
                return Ok(Repaired::Copied);
            };
            if info.stale {
                return Err(DataError::Stale(format!(
                    "{chunk}: the copy at {from} is stale too"
                )));
            }
            // Room for some growth while the copy is under way; never more than a chunk
            // can hold, whatever the source says.
            let room = info
                .len
                .saturating_add(1 << 20)
                .min(u64::from(info.chunk_size_bytes))
                .min(u64::from(crate::store::format::MAX_CHUNK_SIZE_BYTES))
                .max(1);
            let mr = self
                .view
                .endpoint()
                .register(room as usize)
                .map_err(DataError::from)?;
            let grant = conn
                .grant(&mr, 0, room as usize, Access::RemoteWrite)
                .map_err(DataError::from)?;
            let req = FetchChunk {
                chunk,
                dest: grant.remote(),
            };
            let got = match call_peer(&conn, req).await {
                Ok(m) => m,
                // It grew past the room: measure again.
                Err(e) if e.code() == ErrorCode::TooBig => continue,
                Err(e) => return Err(e),
            };
            drop(grant);
            let _lock = self.locks.write(chunk).await;
            let have = self.local_fields(chunk).await?;
            let ahead = !have.stale && have.version > got.version && have.chain == chain;
            if ahead && behind != Some(got.version) {
                // A newer write arrived here meanwhile: fetch again.
                behind = Some(got.version);
                continue;
            }
            // The source answered the same older version twice: it never had this
            // copy's newest writes (it was brought back to serve after missing them,
            // README "Not yet"), and what it holds is what the chain serves, if it
            // still serves it (the map may have moved on since the pass began, and a
            // member that left may answer with what it had). Copying it lets the chain
            // heal instead of retrying forever; the caller's pass still fails, so the
            // next one checks the copy again, in case a change was only slow to land at
            // the source (a truncation reaches the members one by one).
            if ahead && !serves(&self.view.current(), chain, from) {
                return Err(DataError::Stale(format!(
                    "{chunk}: {from} no longer serves {chain}"
                )));
            }
            let fields = ReplicaFields {
                chain,
                version: got.version,
                stale: false,
            };
            let store = self.store.clone();
            let cs = got.chunk_size_bytes;
            // The source wrote at most the room it was granted: a longer length is a
            // broken or hostile source, refused rather than read past the region.
            let len = usize::try_from(got.len)
                .ok()
                .filter(|&n| n as u64 <= room)
                .ok_or_else(|| {
                    DataError::InvalidArgument(format!(
                        "{chunk}: {from} claims {} bytes in a room of {room}",
                        got.len
                    ))
                })?;
            blocking(move || store.install(chunk, cs, &mr.lock()[..len], fields)).await?;
            if ahead {
                warn!(%chunk, ours = have.version, theirs = got.version, %from,
                    "a copy newer than the serving member's was replaced by it");
                return Ok(Repaired::ReplacedNewer);
            }
            return Ok(Repaired::Copied);
        }
        Err(DataError::Unavailable(format!(
            "{chunk}: kept changing while copied from {from}"
        )))
    }
}

async fn info(conn: &Connection, chunk: ChunkId) -> Result<Option<ChunkMeta>, DataError> {
    let req = ChunkInfo {
        chunk,
        verify: false,
    };
    call_peer(conn, req).await
}

/// The background resync of one data server; its progress goes out with heartbeats.
#[derive(Clone)]
pub struct Resync {
    inner: Arc<Inner>,
    interval: Duration,
    report: Arc<Mutex<ResyncReport>>,
}

impl Resync {
    pub(super) fn new(inner: Arc<Inner>, interval: Duration) -> Resync {
        Resync {
            inner,
            interval,
            report: Arc::new(Mutex::new(ResyncReport::default())),
        }
    }

    /// What the next heartbeat reports.
    pub fn report(&self) -> ResyncReport {
        self.report.lock().clone()
    }

    /// Runs until the task is aborted.
    pub async fn run(self) {
        let mut last_seen = 0u64;
        let mut swept: Option<(u64, std::time::Instant)> = None;
        loop {
            let woken = self.inner.stale_found.notified();
            let stale = tokio::time::timeout(self.interval, woken).await.is_ok();
            let map = self.inner.view.current();
            let Some(me) = self.inner.view.me() else {
                continue;
            };
            if map.version == 0 {
                continue;
            }
            let syncing: Vec<ChainId> = chains_where(&map, me, MemberState::Syncing);
            if !syncing.is_empty() && map.version != last_seen {
                // Let every head learn the map that makes this server a member before
                // the pass starts: writes sent with an older map miss this server.
                last_seen = map.version;
                tokio::time::sleep(self.interval * 2).await;
                continue;
            }
            self.sync_pass(&map, me, &syncing).await;
            let due = stale
                || swept.is_none_or(|(v, at)| v != map.version || at.elapsed() >= SWEEP_EVERY);
            if due {
                let orphans = swept.is_none_or(|(_, at)| at.elapsed() >= SWEEP_EVERY);
                if let Err(e) = self.sweep(&map, me, orphans).await {
                    warn!(error = %e, "sweep of the chunk store failed");
                }
                swept = Some((map.version, std::time::Instant::now()));
            }
        }
    }

    /// Compares every syncing chain with a serving member and reports which are equal.
    async fn sync_pass(&self, map: &ClusterMap, me: NodeId, syncing: &[ChainId]) {
        if !syncing.is_empty() {
            // Counted per pass: `tessera status` shows them against the chunks one pass
            // compares.
            let mut r = self.report.lock();
            r.checked = 0;
            r.copied = 0;
        }
        let mut synced = Vec::new();
        for &chain in syncing {
            let Some(src) = source(map, chain, me) else {
                continue;
            };
            match self.sync_chain(map, chain, src).await {
                Ok(()) => synced.push(chain),
                Err(e) => warn!(%chain, error = %e, "resync of chain failed, retrying"),
            }
        }
        if !synced.is_empty() {
            info!(chains = ?synced, version = map.version, "resync pass complete");
        }
        let mut r = self.report.lock();
        r.pass_version = map.version;
        r.synced = synced;
    }

    /// Copies every chunk of `chain` whose version here differs from `src`'s, and drops
    /// chunks `src` does not have, each as [`Holders::decide`] says for its file.
    async fn sync_chain(
        &self,
        map: &ClusterMap,
        chain: ChainId,
        src: Source,
    ) -> Result<(), DataError> {
        let addr = map
            .addr(src.node)
            .ok_or_else(|| DataError::Stale(format!("{} has no address", src.node)))?
            .to_string();
        let conn = self.inner.view.peer(map, src.node).await?;
        let mut theirs = HashSet::new();
        let mut after = None;
        let mut clean = true;
        let mut replaced = 0u64;
        loop {
            let req = ListChunks {
                chain,
                after,
                limit: MAX_LIST_CHUNKS,
            };
            let page = call_peer(&conn, req).await?;
            let Some(last) = page.last().map(|m| m.chunk) else {
                break;
            };
            // Each page ends past the one before (in the store's order: bucket, inode,
            // index): a source whose pages do not move on (broken, or hostile) would
            // keep this pass going forever.
            if after.is_some_and(|a| list_order(last) <= list_order(a)) {
                return Err(DataError::InvalidArgument(format!(
                    "{}: a page of {chain}'s chunks did not move past {}",
                    src.node,
                    after.map_or_else(String::new, |a| a.to_string())
                )));
            }
            let mut differ = Vec::new();
            for m in page {
                theirs.insert(m.chunk);
                self.report.lock().checked += 1;
                if m.stale {
                    clean = false;
                    continue;
                }
                let have = self.inner.local_fields(m.chunk).await?;
                if have.version == m.version && !have.stale && have.chain == chain {
                    continue;
                }
                differ.push(m.chunk);
            }
            let copies = self.copies(&differ).await?;
            for (chunk, n) in differ.into_iter().zip(copies) {
                match src.holders.decide(n, true) {
                    Action::Copy => {
                        let r = self.inner.repair_from(&addr, chunk, chain, true).await?;
                        if r == Repaired::ReplacedNewer {
                            replaced += 1;
                        }
                        self.report.lock().copied += 1;
                    }
                    Action::Drop => self.drop_chunk(chunk).await?,
                    Action::Keep => {}
                }
            }
            after = Some(last);
        }
        // Ours that the source lacks: deleted or cut away while this server was out, if
        // the source holds the file's chunks; else this server's own (or not its to
        // hold).
        let lacking: Vec<ChunkId> = self
            .own_chunks(Some(chain))
            .await?
            .into_iter()
            .map(|c| c.chunk)
            .filter(|c| !theirs.contains(c))
            .collect();
        let copies = self.copies(&lacking).await?;
        for (chunk, n) in lacking.into_iter().zip(copies) {
            match src.holders.decide(n, false) {
                Action::Copy => {
                    self.inner.repair_from(&addr, chunk, chain, true).await?;
                }
                Action::Drop => self.drop_chunk(chunk).await?,
                Action::Keep => {}
            }
        }
        if !clean {
            return Err(DataError::Stale(format!(
                "{chain}: the source has stale copies"
            )));
        }
        if replaced > 0 {
            return Err(DataError::Unavailable(format!(
                "{chain}: {replaced} copies here newer than the source's replaced by its; \
                 checking again"
            )));
        }
        Ok(())
    }

    /// How many copies each chunk's file asks for (`None`: the file is gone), from the
    /// metadata server, which is asked once per file (a 24 MiB file has 6 chunks).
    async fn copies(&self, chunks: &[ChunkId]) -> Result<Vec<Option<u8>>, DataError> {
        let mut inodes: Vec<_> = chunks.iter().map(|c| c.inode).collect();
        inodes.sort_unstable();
        inodes.dedup();
        let mut asked = HashMap::with_capacity(inodes.len());
        for batch in inodes.chunks(MAX_COPIES_QUERY) {
            let req = InodeCopies {
                inodes: batch.to_vec(),
            };
            let got = self.inner.view.meta_call(req).await?;
            if got.len() != batch.len() {
                let why = format!("{} answers to InodeCopies of {}", got.len(), batch.len());
                return Err(DataError::Codec(proto::ProtoError::Malformed(why)));
            }
            asked.extend(batch.iter().copied().zip(got));
        }
        Ok(chunks.iter().map(|c| asked[&c.inode]).collect())
    }

    /// Deletes the local copy of `chunk` (one this server does not hold a place for).
    async fn drop_chunk(&self, chunk: ChunkId) -> Result<(), DataError> {
        let _lock = self.inner.locks.write(chunk).await;
        let store = self.inner.store.clone();
        if blocking(move || store.delete_chunk(chunk)).await? {
            info!(%chunk, "dropped a copy this member holds no place for (or of a file gone)");
        }
        Ok(())
    }

    /// Repairs stale copies of chains this server serves, removes chunks of chains it
    /// is not a member of any more and, with `orphans`, chunks of files that are gone
    /// (a deletion that a crash kept from reaching this server).
    async fn sweep(&self, map: &ClusterMap, me: NodeId, orphans: bool) -> Result<(), DataError> {
        let own = self.own_chunks(None).await?;
        if orphans {
            self.drop_orphans(&own).await?;
        }
        for c in own {
            let Some(info) = map.chain(c.chain) else {
                continue;
            };
            let member = info.members.iter().find(|m| m.node == me);
            match member {
                None if c.chain != ChainId(0) => {
                    let _lock = self.inner.locks.write(c.chunk).await;
                    // A write under a newer map may have made this server a member.
                    let now = self.inner.view.current();
                    let member_now = now
                        .chain(c.chain)
                        .is_some_and(|i| i.members.iter().any(|m| m.node == me));
                    if member_now {
                        continue;
                    }
                    let store = self.inner.store.clone();
                    let chunk = c.chunk;
                    blocking(move || store.delete_chunk(chunk)).await?;
                    info!(chunk = %c.chunk, chain = %c.chain, "dropped a chunk of a chain this server left");
                }
                Some(m) if m.state == MemberState::Serving && c.stale => {
                    if let Some(src) = source(map, c.chain, me) {
                        let addr = map.addr(src.node).unwrap_or_default().to_string();
                        // A source without it may never have held it: the copy stays
                        // (a deleted file's chunks go by the orphan sweep).
                        let repair = self.inner.repair_from(&addr, c.chunk, c.chain, false);
                        if let Err(e) = repair.await {
                            warn!(chunk = %c.chunk, error = %e, "repair of a stale copy failed");
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Removes the chunks of inodes the metadata server no longer has.
    async fn drop_orphans(&self, own: &[ChunkMeta]) -> Result<(), DataError> {
        let mut inodes: Vec<proto::InodeId> = own.iter().map(|c| c.chunk.inode).collect();
        inodes.dedup();
        for batch in inodes.chunks(EXIST_BATCH) {
            let req = InodesExist {
                inodes: batch.to_vec(),
            };
            let exist = self.inner.view.meta_call(req).await?;
            if exist.len() != batch.len() {
                let why = format!("{} answers to InodesExist of {}", exist.len(), batch.len());
                return Err(DataError::Codec(proto::ProtoError::Malformed(why)));
            }
            for (&inode, _) in batch.iter().zip(exist).filter(|(_, e)| !e) {
                let store = self.inner.store.clone();
                blocking(move || store.delete_file(inode)).await?;
                info!(%inode, "dropped the chunks of a file that no longer exists");
            }
        }
        Ok(())
    }

    /// This server's chunks (of one chain, or all).
    async fn own_chunks(&self, chain: Option<ChainId>) -> Result<Vec<ChunkMeta>, DataError> {
        let store = self.inner.store.clone();
        let all = blocking(move || store.chain_chunks(chain, None, usize::MAX)).await?;
        // Unreadable headers are left to fsck: their chain is unknown.
        Ok(all.into_iter().filter_map(Result::ok).collect())
    }
}

/// Chains in which `me` has `state`.
fn chains_where(map: &ClusterMap, me: NodeId, state: MemberState) -> Vec<ChainId> {
    map.chains
        .iter()
        .filter(|c| c.members.iter().any(|m| m.node == me && m.state == state))
        .map(|c| c.chain)
        .collect()
}

/// What [`Inner::repair_from`] did to the local copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Repaired {
    /// Made like the source's: copied, or gone as the source lacks it.
    Copied,
    /// A copy newer than the serving source's, which the source never had, replaced by
    /// the source's.
    ReplacedNewer,
}

/// Whether the member at `addr` serves `chain` in `map`.
fn serves(map: &ClusterMap, chain: ChainId, addr: &str) -> bool {
    map.chain(chain).is_some_and(|c| {
        c.members
            .iter()
            .any(|m| m.state == MemberState::Serving && map.addr(m.node) == Some(addr))
    })
}

/// The member a chain is resynced or repaired from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Source {
    pub node: NodeId,
    pub holders: Holders,
}

/// The serving member of `chain` other than `me` nearest its head, whose server is up.
/// A file asking for `n` copies lives on the chain's first `n` members: the one nearest
/// the head holds every file that any later member holds.
pub(super) fn source(map: &ClusterMap, chain: ChainId, me: NodeId) -> Option<Source> {
    let members = &map.chain(chain)?.members;
    let up = |n: NodeId| map.nodes.iter().any(|i| i.node == n && i.alive());
    let at = |n: NodeId| members.iter().position(|m| m.node == n);
    let src = members
        .iter()
        .find(|m| m.node != me && m.state == MemberState::Serving && up(m.node))?;
    Some(Source {
        node: src.node,
        holders: Holders {
            me: at(me)?,
            source: at(src.node)?,
        },
    })
}

/// The positions in a chain of the member being brought up to date and of its source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Holders {
    pub me: usize,
    pub source: usize,
}

/// What a resync does with one chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Action {
    /// Make the local copy like the source's (copy it, or drop it as the source lacks
    /// it).
    Copy,
    /// Drop the local copy: this position holds no copy of the file.
    Drop,
    /// Leave it.
    Keep,
}

impl Holders {
    /// What to do with a chunk of a file asking for `copies` copies (`None`: the file is
    /// gone) that the source lists with another version (`listed`), or that only this
    /// server has (`!listed`).
    pub(super) fn decide(&self, copies: Option<u8>, listed: bool) -> Action {
        let Some(n) = copies else {
            // Gone: its chunks go (the source's by its own sweep).
            return if listed { Action::Keep } else { Action::Drop };
        };
        let holds = |at: usize| at < usize::from(n.max(1));
        match (listed, holds(self.me), holds(self.source)) {
            // Not this position's to hold: a copy made here before (by a resync that
            // did not ask) goes, none is made.
            (_, false, _) => Action::Drop,
            (true, true, _) => Action::Copy,
            // The source holds the file's chunks and lacks this one: deleted or cut
            // while this server was away.
            (false, true, true) => Action::Copy,
            // The source never held it: this may be the only copy.
            (false, true, false) => Action::Keep,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_that_never_held_a_file_does_not_make_its_copy_go() {
        // This server heads the chain; its source is the second member.
        let head = Holders { me: 0, source: 1 };
        assert_eq!(head.decide(Some(1), false), Action::Keep, "the only copy");
        assert_eq!(head.decide(Some(2), false), Action::Copy, "cut while away");
        assert_eq!(head.decide(Some(3), true), Action::Copy);
        assert_eq!(head.decide(None, false), Action::Drop, "the file is gone");
        assert_eq!(head.decide(None, true), Action::Keep);
        // The third member, synced from the head.
        let tail = Holders { me: 2, source: 0 };
        assert_eq!(tail.decide(Some(1), true), Action::Drop, "not its to hold");
        assert_eq!(tail.decide(Some(2), false), Action::Drop);
        assert_eq!(tail.decide(Some(3), true), Action::Copy);
        assert_eq!(tail.decide(Some(3), false), Action::Copy);
        // More copies than members: every member holds the file.
        assert_eq!(tail.decide(Some(8), false), Action::Copy);
    }

    fn map(states: &[(u32, MemberState, bool)]) -> ClusterMap {
        use proto::meta::{ChainInfo, Member, NodeInfo, NodeState};
        ClusterMap {
            version: 1,
            nodes: states
                .iter()
                .map(|&(n, _, up)| NodeInfo {
                    node: NodeId(n),
                    addr: format!("127.0.0.1:{}", 9000 + n),
                    state: if up { NodeState::Up } else { NodeState::Down },
                })
                .collect(),
            chains: vec![ChainInfo {
                chain: ChainId(1),
                members: states
                    .iter()
                    .map(|&(n, state, _)| Member {
                        node: NodeId(n),
                        state,
                    })
                    .collect(),
            }],
        }
    }

    #[test]
    fn the_source_is_the_serving_member_nearest_the_head_whose_server_is_up() {
        use MemberState::{Serving, Syncing};
        let m = map(&[(1, Syncing, true), (2, Serving, true), (3, Serving, true)]);
        let s = source(&m, ChainId(1), NodeId(1)).unwrap();
        assert_eq!(
            (s.node, s.holders),
            (NodeId(2), Holders { me: 0, source: 1 })
        );
        let m = map(&[(1, Serving, true), (2, Serving, true), (3, Syncing, true)]);
        let s = source(&m, ChainId(1), NodeId(3)).unwrap();
        assert_eq!(
            (s.node, s.holders),
            (NodeId(1), Holders { me: 2, source: 0 })
        );
        let m = map(&[(1, Serving, false), (2, Serving, true), (3, Syncing, true)]);
        assert_eq!(source(&m, ChainId(1), NodeId(3)).unwrap().node, NodeId(2));
        let m = map(&[(1, Syncing, true), (2, Serving, false)]);
        assert_eq!(source(&m, ChainId(1), NodeId(1)), None);
    }
}
