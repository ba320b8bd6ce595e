//! The registry of clients and data servers: hello, registration, heartbeats with their
//! garbage collection tasks, the cluster map, and statfs over the registered capacity.

use super::membership::BeatInFlight;
use super::records::{decode, encode, NodeRecord, Superblock};
use super::txn::Reads;
use super::MAX_GC_TASKS_PER_HEARTBEAT;
use super::{keys, FsStats, Namespace, GC_DONE_PER_COMMIT, ID_BLOCK, MAX_ADDR_BYTES};
use super::{Txn, MAX_NODES};
use crate::error::MetaError;
use proto::meta::{ClusterMap, GcTask, ResyncReport};
use proto::{ClientId, InodeId, NodeId};
use std::collections::BTreeMap;
use std::sync::Arc;
use transport::PeerIdentity;

/// Most client ids bound to their key at once; past it the oldest binding is dropped
/// (its id, if still used, is answered `Stale` and its client says hello again).
pub const MAX_BOUND_CLIENTS: usize = 65_536;

/// Binds `client` to key `name`, dropping the oldest binding if the table is full.
fn bind_client(owners: &mut BTreeMap<ClientId, Arc<str>>, client: ClientId, name: &str) {
    if owners.len() >= MAX_BOUND_CLIENTS {
        owners.pop_first();
    }
    owners.insert(client, Arc::from(name));
}

impl Namespace {
    /// Welcomes a client with a new id, bound to the key `who` authenticated with (none
    /// on a cluster without keys): only that key may name the id (see
    /// [`Namespace::may_name_client`]). `name` only goes to the log.
    pub fn hello(&self, name: &str, who: Option<&PeerIdentity>) -> Result<ClientId, MetaError> {
        let mut st = self.state.lock();
        let mut id = st.next_client;
        if id >= st.client_end {
            // Same scheme as sessions: ids come from blocks recorded in the superblock,
            // so they are never reused across restarts (nor, on a shared engine, by
            // another server): a new block starts above every block reserved before.
            let mut txn = self.begin(&st);
            let sb = txn.sb()?;
            id = id.max(sb.client_ceiling);
            sb.client_ceiling = id + ID_BLOCK;
            Self::commit_txn(&mut st, txn)?;
            st.client_end = id + ID_BLOCK;
        }
        st.next_client = id + 1;
        let client = ClientId(id);
        if let Some(who) = who {
            bind_client(&mut st.owners, client, &who.key_label());
        }
        let shown: String = name.chars().take(128).collect();
        tracing::info!(%client, name = %shown, "client connected");
        Ok(client)
    }

    /// Refuses a request naming `client` unless it comes from the key the id is bound to:
    /// client ids are handed out in order, so any key could otherwise name another's and
    /// resume its sessions, take or drop its locks. EPERM: the caller is not unknown or
    /// late, it is not that client. An id of a previous start (bindings live in memory)
    /// is bound to the first key that names it; one of this start with no binding was
    /// dropped for room (`MAX_BOUND_CLIENTS`) and is `Stale`: its client says hello
    /// again. A cluster without keys names no key and binds nothing.
    pub fn may_name_client(
        &self,
        client: ClientId,
        who: Option<&PeerIdentity>,
    ) -> Result<(), MetaError> {
        let Some(who) = who else { return Ok(()) };
        let mut st = self.state.lock();
        match st.owners.get(&client) {
            Some(owner) if **owner == *who.key_label() => Ok(()),
            Some(owner) => {
                tracing::warn!(%client, key = %who.name, owner = %owner,
                               "a request naming another key's client refused");
                Err(MetaError::NotPermitted(format!(
                    "{client} belongs to another key"
                )))
            }
            None if client.0 >= st.client_floor => Err(MetaError::Stale(format!(
                "{client} is not known to this server"
            ))),
            None => {
                bind_client(&mut st.owners, client, &who.key_label());
                Ok(())
            }
        }
    }

    /// Registers a data server: a new id when `node` is `None`, else an update of a
    /// known one (`NotFound` if the store does not know it, e.g. after a wipe).
    pub fn register_data(
        &self,
        node: Option<NodeId>,
        addr: &str,
        capacity_bytes: u64,
        used_bytes: u64,
    ) -> Result<NodeId, MetaError> {
        self.must_lead("a data server's registration")?;
        if addr.is_empty() || addr.len() > MAX_ADDR_BYTES {
            return Err(MetaError::InvalidArgument(format!(
                "data server address of {} bytes (1 to {MAX_ADDR_BYTES})",
                addr.len()
            )));
        }
        let rec = NodeRecord {
            addr: addr.to_string(),
            capacity_bytes,
            used_bytes,
        };
        // The record and, if the server moved, a new map version in one transaction:
        // peers compare map versions only, so a server back on a new port (a restart
        // with port 0) must be a new version, or those holding the old map keep
        // forwarding chain writes to its old address.
        let node = self.with_map_version(|version| {
            self.mutate(|txn, _| {
                // A leader deposed since the check above registers nobody.
                super::leader::confirm(txn)?;
                let (node, moved) = match node {
                    Some(node) => (node, load_node(txn, node)?.addr != addr),
                    None => (new_node_id(txn)?, false),
                };
                txn.put(keys::node(node), encode(&rec)?);
                if moved {
                    super::membership::next_map_version(txn, version)?;
                }
                Ok((node, moved))
            })
        })?;
        self.liveness.lock().heard(node, self.clock.now());
        tracing::info!(%node, addr, "data server registered");
        self.reconcile()?;
        Ok(node)
    }

    /// Renews `node`'s lease, records its usage and resync progress, forgets the
    /// deletions it has done, and returns up to [`MAX_GC_TASKS_PER_HEARTBEAT`] pending
    /// ones, with the cluster map if the server's is not current.
    ///
    /// Tasks stay pending until reported done, so a lost reply only repeats them; data
    /// servers must treat a repeated deletion as done.
    pub fn heartbeat(
        &self,
        node: NodeId,
        capacity_bytes: u64,
        used_bytes: u64,
        done: &[GcTask],
        map_version: u64,
        resync: ResyncReport,
    ) -> Result<(Vec<GcTask>, Option<ClusterMap>), MetaError> {
        self.must_lead("a data server's heartbeat")?;
        // Alive from the beat's arrival until its reply: a slow commit below (the disk
        // busy with chunk writes, an etcd without a quorum) must not count against the
        // server's lease.
        let mut beat = BeatInFlight::begin(self, node);
        let mut chunks: Vec<&[GcTask]> = done.chunks(GC_DONE_PER_COMMIT).collect();
        let last = chunks.pop().unwrap_or_default();
        for chunk in chunks {
            self.mutate(|txn, _| {
                super::leader::confirm(txn)?;
                for GcTask::DeleteFile(ino) in chunk {
                    txn.delete(keys::gc(node, *ino));
                }
                Ok(())
            })?;
        }
        let wrote = self.leader_write(|| {
            self.mutate(|txn, _| {
                // A leader deposed since the check above writes nothing of the beat.
                super::leader::confirm(txn)?;
                let mut rec = load_node(txn, node)?;
                for GcTask::DeleteFile(ino) in last {
                    txn.delete(keys::gc(node, *ino));
                }
                // Usage rarely changes between beats; skip the durable write when it did not.
                if (rec.capacity_bytes, rec.used_bytes) != (capacity_bytes, used_bytes) {
                    rec.capacity_bytes = capacity_bytes;
                    rec.used_bytes = used_bytes;
                    txn.put(keys::node(node), encode(&rec)?);
                }
                Ok(())
            })
        });
        if let Err(MetaError::NotFound(_)) = &wrote {
            beat.unknown();
        }
        wrote?;
        self.resync_report(node, resync)?;
        let map = self.reconcile()?;
        let prefix = keys::gc_prefix(node);
        let end = keys::prefix_end(&prefix);
        let rows = self.store.scan(&prefix, &end, MAX_GC_TASKS_PER_HEARTBEAT)?;
        let gc = rows
            .into_iter()
            .map(|(k, _)| match keys::u64_at(&k, prefix.len()) {
                Some(ino) => Ok(GcTask::DeleteFile(InodeId(ino))),
                None => Err(MetaError::Corrupt(format!("gc key {k:x?}"))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let map = (map.version != map_version).then(|| (*map).clone());
        // Durable before the guard lets go: a commit stuck on the store is the store's
        // silence too.
        self.wait_pending()?;
        // The scan sees staged changes: a deletion is handed out only once the removal
        // that asked for it is durable. A crash before would bring the file back (its
        // change lost, or answered early and sent again by a client that then ends
        // too) without its chunks. So is a new map (a start after a crash could make
        // another under the same version).
        if !gc.is_empty() || map.is_some() {
            self.group.settle()?;
        }
        Ok((gc, map))
    }

    /// The cluster map as last reconciled, without reconciling it (for metrics).
    pub fn current_map(&self) -> Arc<ClusterMap> {
        self.map.read().clone()
    }

    /// The cluster map: every registered data server with its state, and the chains.
    pub fn cluster_map(&self) -> Result<ClusterMap, MetaError> {
        Ok((*self.reconcile()?).clone())
    }

    /// Capacity and free space over the registered data servers, divided by the default
    /// number of copies (capped by the servers, as chains are), so `df` shows what files
    /// can hold rather than the raw disks; and the inode count.
    pub fn statfs(&self) -> Result<FsStats, MetaError> {
        let sb_bytes = self
            .store
            .get(&keys::superblock())?
            .ok_or_else(|| MetaError::Corrupt("superblock missing".into()))?;
        let sb: Superblock = decode(&sb_bytes, "superblock")?;
        let mut stats = FsStats {
            total_bytes: 0,
            free_bytes: 0,
            files: self.inode_count(&sb)?,
        };
        let nodes = self.nodes()?;
        for (_, rec) in &nodes {
            stats.total_bytes = stats.total_bytes.saturating_add(rec.capacity_bytes);
            let free = rec.capacity_bytes.saturating_sub(rec.used_bytes);
            stats.free_bytes = stats.free_bytes.saturating_add(free);
        }
        let copies = u64::from(self.target_copies(nodes.len()));
        stats.total_bytes /= copies;
        stats.free_bytes /= copies;
        Ok(stats)
    }

    /// Copies each chunk gets by default with `nodes` data servers: the configured
    /// number, capped by the servers (chains have no more members), at least one.
    pub(crate) fn target_copies(&self, nodes: usize) -> u8 {
        let servers = u8::try_from(nodes).unwrap_or(u8::MAX);
        self.config.replicas.min(servers).max(1)
    }

    /// Every node record, by id.
    pub(crate) fn nodes(&self) -> Result<Vec<(NodeId, NodeRecord)>, MetaError> {
        let prefix = keys::node_prefix();
        let rows = self
            .store
            .scan(&prefix, &keys::prefix_end(&prefix), MAX_NODES)?;
        let mut out = Vec::with_capacity(rows.len());
        for (k, v) in rows {
            let node = keys::u32_at(&k, prefix.len())
                .ok_or_else(|| MetaError::Corrupt(format!("node key {k:x?}")))?;
            out.push((NodeId(node), decode(&v, "node record")?));
        }
        Ok(out)
    }
}

/// Node `node`'s record, or `NotFound`.
fn load_node(txn: &Txn<'_>, node: NodeId) -> Result<NodeRecord, MetaError> {
    match txn.raw(&keys::node(node))? {
        Some(v) => decode(&v, "node record"),
        None => Err(MetaError::NotFound(format!("unknown data server {node}"))),
    }
}

/// A new data server id, refused past [`MAX_NODES`].
fn new_node_id(txn: &mut Txn<'_>) -> Result<NodeId, MetaError> {
    let prefix = keys::node_prefix();
    let known = txn
        .scan(&prefix, &keys::prefix_end(&prefix), MAX_NODES)?
        .len();
    let sb = txn.sb()?;
    if known >= MAX_NODES || sb.next_node == u32::MAX {
        return Err(MetaError::NoSpace(format!(
            "{known} data servers, the limit"
        )));
    }
    let node = NodeId(sb.next_node);
    sb.next_node += 1;
    Ok(node)
}
