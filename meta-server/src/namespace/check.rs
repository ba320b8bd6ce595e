//! What `tessera status` and `tessera fsck` ask: the cluster's health, the files and
//! their layouts, the namespace's own consistency, and which inodes still exist.

use super::keys;
use super::records::{decode, DirentRecord, InodeRecord, Superblock};
use super::Namespace;
use crate::error::MetaError;
use proto::meta::{ChainInfo, ClusterStatus, FileLayout};
use proto::{ChainId, FileKind, InodeId, Layout, NodeId};
use std::collections::HashMap;

/// Keys one scan step reads.
const PAGE: usize = 4096;
/// Most files one `ListFiles` answer carries (each carries its chain list).
pub const MAX_LIST_FILES: u32 = 256;
/// Most inodes one `InodesExist` asks about.
pub const MAX_EXIST_QUERY: usize = 4096;
/// Most problems one `CheckNamespace` reports (the count of the rest is added).
const MAX_PROBLEMS: usize = 1000;

impl Namespace {
    /// Calls `f` on every key and value under `prefix`, in order, a page at a time.
    fn for_each(
        &self,
        prefix: &[u8],
        mut f: impl FnMut(&[u8], &[u8]) -> Result<(), MetaError>,
    ) -> Result<(), MetaError> {
        let end = keys::prefix_end(prefix);
        self.scan_while(prefix.to_vec(), &end, |k, v| f(k, v).map(|()| true))?;
        Ok(())
    }

    /// Calls `f` on the keys from `start` to `end`, in order, a page at a time, while it
    /// returns true; returns whether it stopped before the end.
    fn scan_while(
        &self,
        mut start: Vec<u8>,
        end: &[u8],
        mut f: impl FnMut(&[u8], &[u8]) -> Result<bool, MetaError>,
    ) -> Result<bool, MetaError> {
        loop {
            let rows = self.store.scan(&start, end, PAGE)?;
            for (k, v) in &rows {
                if !f(k, v)? {
                    return Ok(true);
                }
            }
            match rows.last() {
                Some((k, _)) if rows.len() == PAGE => {
                    start = k.clone();
                    start.push(0);
                }
                _ => return Ok(false),
            }
        }
    }

    /// The map, counts of chunks and under-replicated chunks, resyncs under way.
    pub fn status(&self) -> Result<ClusterStatus, MetaError> {
        let map = self.reconcile()?;
        let chains: HashMap<ChainId, &ChainInfo> =
            map.chains.iter().map(|c| (c.chain, c)).collect();
        let target = self.target_copies(map.nodes.len());
        let (mut chunks, mut under) = (0u64, 0u64);
        let mut per_chain: HashMap<ChainId, u64> = HashMap::new();
        self.for_each(&keys::inode_prefix(), |_, v| {
            let rec: InodeRecord = decode(v, "inode record")?;
            let Some(l) = rec
                .layout
                .as_ref()
                .filter(|_| rec.kind == FileKind::Regular)
            else {
                return Ok(());
            };
            let layout = Layout::from(l);
            let n = rec.size.div_ceil(u64::from(layout.chunk_size_bytes.max(1)));
            let want = usize::from(layout.replicas.min(target).max(1));
            // Per chain: how many chunks of this file it holds.
            let k = layout.chains.len() as u64;
            for (pos, chain) in layout.chains.iter().enumerate() {
                let start = (pos as u64 + k - u64::from(layout.first) % k.max(1)) % k.max(1);
                let count = if n > start {
                    (n - start).div_ceil(k)
                } else {
                    0
                };
                // Saturating: a file's length is a client's to set, up to 2^64 - 1.
                chunks = chunks.saturating_add(count);
                let on_chain = per_chain.entry(*chain).or_default();
                *on_chain = on_chain.saturating_add(count);
                let good = chains
                    .get(chain)
                    .map_or(0, |c| c.readers(layout.replicas).len());
                if good < want {
                    under = under.saturating_add(count);
                }
            }
            Ok(())
        })?;
        let resync = self.resyncs(&map, &per_chain);
        let replaced_in_ms = self.replaced_in(&map);
        Ok(ClusterStatus {
            map: (*map).clone(),
            target_replicas: target,
            under_replicated_chunks: under,
            chunks,
            resync,
            replaced_in_ms,
        })
    }

    /// Up to `limit` regular files after `after`, with their layouts.
    pub fn list_files(
        &self,
        after: InodeId,
        limit: u32,
    ) -> Result<(Vec<FileLayout>, bool), MetaError> {
        let limit = limit.clamp(1, MAX_LIST_FILES) as usize;
        let start = keys::inode(InodeId(after.0.saturating_add(1)));
        let end = keys::prefix_end(&keys::inode_prefix());
        let mut out = Vec::new();
        let stopped = self.scan_while(start, &end, |k, v| {
            let rec: InodeRecord = decode(v, "inode record")?;
            if let (FileKind::Regular, Some(l)) = (rec.kind, rec.layout.as_ref()) {
                let ino = keys::u64_at(k, 1)
                    .ok_or_else(|| MetaError::Corrupt(format!("inode key {k:x?}")))?;
                out.push(FileLayout {
                    ino: InodeId(ino),
                    size: rec.size,
                    layout: Layout::from(l),
                });
            }
            Ok(out.len() < limit)
        })?;
        Ok((out, !stopped))
    }

    /// Whether each inode exists, or was removed and still has chunk deletions queued
    /// for some data server: the chunks of an inode this says `false` of are left over
    /// (a data server's sweep drops them; `tessera fsck` reports them).
    pub fn inodes_exist(&self, inodes: &[InodeId]) -> Result<Vec<bool>, MetaError> {
        if inodes.len() > MAX_EXIST_QUERY {
            return Err(MetaError::InvalidArgument(format!(
                "{} inodes asked about, at most {MAX_EXIST_QUERY}",
                inodes.len()
            )));
        }
        let nodes: Vec<NodeId> = self.nodes()?.into_iter().map(|(n, _)| n).collect();
        inodes
            .iter()
            .map(|&i| {
                if self.store.get(&keys::inode(i))?.is_some() {
                    return Ok(true);
                }
                for &node in &nodes {
                    if self.store.get(&keys::gc(node, i))?.is_some() {
                        return Ok(true);
                    }
                }
                Ok(false)
            })
            .collect()
    }

    /// How many copies each inode's file asks for; `None` for an inode that does not
    /// exist or is not a regular file.
    pub fn inode_copies(&self, inodes: &[InodeId]) -> Result<Vec<Option<u8>>, MetaError> {
        if inodes.len() > proto::meta::cluster::MAX_COPIES_QUERY {
            return Err(MetaError::InvalidArgument(format!(
                "{} inodes asked about, at most {}",
                inodes.len(),
                proto::meta::cluster::MAX_COPIES_QUERY
            )));
        }
        inodes
            .iter()
            .map(|&i| match self.store.get(&keys::inode(i))? {
                Some(v) => {
                    let rec: InodeRecord = decode(&v, "inode record")?;
                    Ok(rec.layout.map(|l| l.replicas))
                }
                None => Ok(None),
            })
            .collect()
    }

    /// Checks entries against inodes under the namespace lock (no change runs meanwhile):
    /// every entry names an inode of its kind, link counts match the entries, every
    /// directory's parent holds it, every inode is reachable or an open orphan, counts
    /// its extended attributes right, and the superblock's inode count is right. One
    /// line per problem.
    pub fn check_namespace(&self) -> Result<Vec<String>, MetaError> {
        let st = self.state.lock();
        let mut inodes: HashMap<u64, InodeRecord> = HashMap::new();
        self.for_each(&keys::inode_prefix(), |k, v| {
            let ino = keys::u64_at(k, 1).ok_or_else(|| MetaError::Corrupt(format!("{k:x?}")))?;
            inodes.insert(ino, decode(v, "inode record")?);
            Ok(())
        })?;
        let mut problems = Vec::new();
        let mut note = |p: String| {
            if problems.len() <= MAX_PROBLEMS {
                problems.push(p);
            }
        };
        let mut links: HashMap<u64, u32> = HashMap::new();
        let mut subdirs: HashMap<u64, u32> = HashMap::new();
        let mut parent_of: HashMap<u64, u64> = HashMap::new();
        self.for_each(&keys::dirent_all_prefix(), |k, v| {
            let parent = keys::u64_at(k, 1).ok_or_else(|| MetaError::Corrupt(format!("{k:x?}")))?;
            let name = String::from_utf8_lossy(&k[9..]).into_owned();
            let d: DirentRecord = decode(v, "directory entry")?;
            match inodes.get(&d.ino) {
                None => note(format!(
                    "entry {parent}/{name} names missing inode {}",
                    d.ino
                )),
                Some(rec) if rec.kind != d.kind => note(format!(
                    "entry {parent}/{name} says {:?}, inode {} is {:?}",
                    d.kind, d.ino, rec.kind
                )),
                Some(_) => {}
            }
            if !inodes
                .get(&parent)
                .is_some_and(|r| r.kind == FileKind::Directory)
            {
                note(format!(
                    "entry {parent}/{name} is in a missing or non-directory inode"
                ));
            }
            *links.entry(d.ino).or_default() += 1;
            if d.kind == FileKind::Directory {
                *subdirs.entry(parent).or_default() += 1;
                parent_of.insert(d.ino, parent);
            }
            Ok(())
        })?;
        let mut orphans = std::collections::HashSet::new();
        self.for_each(&keys::orphan_prefix(), |k, _| {
            if let Some(ino) = keys::u64_at(k, 1) {
                orphans.insert(ino);
            }
            Ok(())
        })?;
        // Clients trust an inode's count of extended attributes: with 0 they answer
        // reads of any of them themselves.
        let mut xattrs: HashMap<u64, u32> = HashMap::new();
        self.for_each(&keys::xattr_all_prefix(), |k, _| {
            let ino = keys::u64_at(k, 1).ok_or_else(|| MetaError::Corrupt(format!("{k:x?}")))?;
            *xattrs.entry(ino).or_default() += 1;
            Ok(())
        })?;
        for (&ino, &n) in &xattrs {
            if !inodes.contains_key(&ino) {
                note(format!("{n} extended attributes of missing inode {ino}"));
            }
        }
        let root = InodeId::ROOT.0;
        for (&ino, rec) in &inodes {
            let stored = xattrs.get(&ino).copied().unwrap_or(0);
            if rec.xattr_count != stored {
                note(format!(
                    "inode {ino} counts {} extended attributes, {stored} exist",
                    rec.xattr_count
                ));
            }
            let named = links.get(&ino).copied().unwrap_or(0);
            if rec.kind == FileKind::Directory {
                let want = 2 + subdirs.get(&ino).copied().unwrap_or(0);
                if rec.nlink != want {
                    note(format!(
                        "directory {ino} has nlink {}, expected {want}",
                        rec.nlink
                    ));
                }
                if ino != root {
                    match parent_of.get(&ino) {
                        Some(&p) if p == rec.parent => {}
                        Some(&p) => note(format!(
                            "directory {ino} records parent {}, is in {p}",
                            rec.parent
                        )),
                        None => note(format!("directory {ino} is in no directory")),
                    }
                }
            } else if rec.nlink != named {
                note(format!(
                    "inode {ino} has nlink {}, {named} entries name it",
                    rec.nlink
                ));
            }
            if named == 0 && ino != root && !orphans.contains(&ino) {
                note(format!("inode {ino} is unreachable and not an orphan"));
            }
        }
        self.check_held(&inodes, &mut note)?;
        self.check_openers(&inodes, &mut note)?;
        let sb: Superblock = decode(
            &self
                .store
                .get(&keys::superblock())?
                .ok_or_else(|| MetaError::Corrupt("superblock missing".into()))?,
            "superblock",
        )?;
        let counted = self.inode_count(&sb)?;
        if counted != inodes.len() as u64 {
            note(format!(
                "the inode count says {counted} inodes, {} exist",
                inodes.len()
            ));
        }
        drop(st);
        Ok(problems)
    }

    /// Checks every held-chunks key against `inodes` (see `held::check`).
    fn check_held(
        &self,
        inodes: &HashMap<u64, InodeRecord>,
        note: &mut impl FnMut(String),
    ) -> Result<(), MetaError> {
        let inode = |ino: InodeId| {
            inodes.get(&ino.0).map(|r| {
                let cs = r
                    .layout
                    .as_ref()
                    .map_or(1, |l| u64::from(l.chunk_size_bytes));
                (r.kind, r.size, cs)
            })
        };
        self.for_each(&keys::held_prefix(), |k, v| {
            super::held::check(k, v, inode, note);
            Ok(())
        })
    }

    /// Checks every openers key (`opens`) and locks key (`shared_locks`): it decodes,
    /// and its file exists (an inode deleted takes its keys with it).
    fn check_openers(
        &self,
        inodes: &HashMap<u64, InodeRecord>,
        note: &mut impl FnMut(String),
    ) -> Result<(), MetaError> {
        self.for_each(&keys::openers_prefix(), |k, v| {
            let Some(ino) = keys::u64_at(k, 1) else {
                note(format!("openers key {k:x?} names no inode"));
                return Ok(());
            };
            match super::opens::decode_sessions(v) {
                None => note(format!("the open sessions of inode {ino} do not decode")),
                Some(_) if !inodes.contains_key(&ino) => {
                    note(format!("open sessions of missing inode {ino}"))
                }
                Some(_) => {}
            }
            Ok(())
        })?;
        self.for_each(&keys::locks_prefix(), |k, v| {
            match keys::u64_at(k, 1) {
                None => note(format!("locks key {k:x?} names no inode")),
                Some(_) if !super::shared_locks::decodes(v) => {
                    note(format!("the locks key {k:x?} does not decode"))
                }
                Some(ino) if !inodes.contains_key(&ino) => {
                    note(format!("locks of missing inode {ino}"))
                }
                Some(_) => {}
            }
            Ok(())
        })
    }
}
