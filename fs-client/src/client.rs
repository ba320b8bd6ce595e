//! The `Client` API: the namespace operations of one mount, over the transport.

use crate::cache::dirattrs::DirAttrs;
use crate::cache::dirnames::DirNames;
use crate::cache::noxattrs::{NoXattrs, CAPABILITY};
use crate::cache::scans::Scans;
use crate::config::ClientConfig;
use crate::error::{ClientError, Result};
use crate::file::datapath::{DataPath, GrantFetch, MapFetch, MapSource, Pools};
use crate::file::FileState;
use crate::metrics::ClientMetrics;
use crate::rpc::{self, MetaCall, Replied, RpcCounts, RpcEndpoint, Seen};
use crate::segpool::SegPool;

mod attrs;
mod away;
mod caller;
mod held;
mod locks;
mod lookups;
mod opening;
mod ops;
mod removes;
pub use locks::LockHow;
pub use opening::OpenedByName;

pub use caller::acting_as;
pub(crate) use caller::current as current_caller;
mod resume;
mod watch;
use parking_lot::Mutex;
use proto::meta::cluster::GetMap;
use proto::meta::{
    fs, Caller, ClusterMap, DirEntry, LockSpec, MetaRequest, RenameMode, XattrMode, MAX_RELEASES,
};
use proto::{
    Attr, ClientId, ErrorCode, FileKind, InodeFlags, InodeId, NodeId, Request, SessionId,
    WireError, PROTOCOL_VERSION,
};
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;
use transport::BufferPool;
use transport::{Connection, Endpoint, Link};

/// File system totals, as `statfs` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsStats {
    /// Capacity of all data servers, in bytes.
    pub total_bytes: u64,
    /// Free bytes over all data servers.
    pub free_bytes: u64,
    /// Inodes in use.
    pub files: u64,
}

/// How long a close without a commit waits for others to share its `ReleaseMany`.
const RELEASE_DELAY: Duration = Duration::from_millis(2);

/// A connection to one Tessera cluster: what a mount uses, and what tests and tools use
/// without a mount.
pub struct Client {
    /// Shared with the data path: one set of call counts per client.
    pub(crate) ep: Arc<RpcEndpoint>,
    pub(crate) config: ClientConfig,
    meta: Link,
    /// Buffer pools, data-server links, the cluster map and failover.
    pub(crate) data: DataPath,
    /// This client, for the background tasks it starts (fetches, segment sends).
    me: Weak<Client>,
    /// The runtime those tasks run on; FUSE threads are not part of it.
    pub(crate) rt: tokio::runtime::Handle,
    pub(crate) id: ClientId,
    /// The capabilities of this client's key, as the metadata server told them.
    caps: proto::auth::Caps,
    pub(crate) files: Mutex<HashMap<InodeId, Weak<FileState>>>,
    /// Attributes sent with replies: a directory's with create and unlink, a file's
    /// with a length commit.
    dir_attrs: DirAttrs,
    /// Files known to have no extended attributes, or no file capabilities (asked
    /// before every write).
    no_xattrs: NoXattrs,
    /// Directories whose every name is known: a lookup of a missing name there is
    /// answered without a call (the lookup before each create).
    dir_names: DirNames,
    /// Directories walked in name order: lookups answered from a listing page.
    scans: Scans,
    /// Sessions whose close carries no commit, waiting to be ended in one call.
    releases: Mutex<Vec<SessionId>>,
    /// Sessions with a live handle, their files, open modes and openers: what a new
    /// metadata connection resumes (see `client::resume`).
    sessions: Mutex<HashMap<SessionId, resume::Opener>>,
    /// The locks this client holds, by file: what a new metadata connection takes back
    /// (see `client::locks`).
    held_locks: Mutex<HashMap<InodeId, Vec<LockSpec>>>,
    /// Changes the metadata server answered early, kept until durable (see `held`).
    held: held::Held,
    /// The metadata connection (`Link::made` count) the sessions were last resumed on.
    resumed: std::sync::atomic::AtomicU64,
    /// One resume at a time.
    resume_lock: tokio::sync::Mutex<()>,
    /// The counts of changes sent with an id, kept within a window (see `client::ops`).
    ops: ops::OpWindow,
    /// The free bytes the last `statfs` answered, and when: what `fallocate` checks
    /// small allocations against (`file::space_seen_suffices`).
    pub(crate) free_seen: Mutex<Option<(std::time::Instant, u64)>>,
    /// Unlinks answered before the server had them, on their way (see `client::removes`).
    removes: Arc<removes::Removes>,
}

/// With a `key_file`, every connection (metadata and data servers) authenticates.
fn with_key(ep: Endpoint, config: &ClientConfig) -> Result<Endpoint> {
    if config.key_file.as_os_str().is_empty() {
        return Ok(ep);
    }
    let file = transport::ClientKeyFile::load(&config.key_file)?;
    let name = &config.client_name;
    if !name.is_empty() && *name != file.name {
        return Err(ClientError::Config(format!(
            "the key file {} is the key of '{}', but client_name is '{name}': leave \
             client_name out (the key file names its client) or give the key of '{name}'",
            config.key_file.display(),
            file.name
        )));
    }
    Ok(ep.with_credentials(transport::Credentials::client(file)))
}

/// The directory `config.subdir` names, looked up from the root (`None`: the root).
async fn subdir_root(
    ep: &RpcEndpoint,
    meta: &Link,
    config: &ClientConfig,
) -> Result<Option<InodeId>> {
    let names = config.subdir_names().map_err(ClientError::Config)?;
    let mut at = None;
    for name in names {
        let parent = at.unwrap_or(InodeId::ROOT);
        let req = Request::new(fs::Lookup {
            parent,
            name: name.as_bytes().to_vec(),
        })
        .with_caller(caller::current());
        let attr = rpc::meta_call(ep, meta, &req)
            .await
            .map_err(|e| ClientError::Config(format!("subdir {}: {name}: {e}", config.subdir)))?;
        if attr.kind != FileKind::Directory {
            return Err(ClientError::Config(format!(
                "subdir {}: {name} is not a directory",
                config.subdir
            )));
        }
        at = Some(attr.ino);
    }
    Ok(at)
}

impl Client {
    /// Connects to the metadata server named in `config` and learns the data servers.
    pub async fn connect(config: ClientConfig) -> Result<Arc<Client>> {
        config.validate().map_err(ClientError::Config)?;
        let ep = Endpoint::new(
            config.transport,
            config.transport_limits.clone(),
            PROTOCOL_VERSION,
        )?;
        let metrics = ClientMetrics::new().map_err(|e| ClientError::Config(e.to_string()))?;
        let ep = Arc::new(RpcEndpoint::new(with_key(ep, &config)?, metrics));
        let seg = config.segment_bytes;
        let pools = Pools {
            io: BufferPool::new(&ep, config.io_buffers, config.io_buffer_bytes)?,
            read: SegPool::new((**ep).clone(), seg, config.readahead_mount_bytes),
            write: SegPool::new((**ep).clone(), seg, config.write_buffer_mount_bytes),
        };
        let watched = ep.metrics().watch_pools(&pools.read, &pools.write);
        watched.map_err(|e| ClientError::Config(e.to_string()))?;
        let failover = Duration::from_millis(config.failover_timeout_ms);
        let meta = Link::new(config.meta_addr.clone());
        let dir_ttl = Duration::from_millis(config.attr_ttl_ms);
        let entry_ttl = Duration::from_millis(config.entry_ttl_ms);
        let name = format!("fs-client pid {}", std::process::id());
        let id = rpc::meta_call(&ep, &meta, &Request::new(fs::Hello { name })).await?;
        let caps = rpc::meta_call(&ep, &meta, &Request::new(fs::MyCaps)).await?;
        if let Some(dir) = subdir_root(&ep, &meta, &config).await? {
            ep.set_root(dir);
        }
        // The connection that said hello needs no resume.
        let hello_conn = meta.made();
        let client = Arc::new_cyclic(|me: &Weak<Client>| Client {
            data: DataPath::new(ep.clone(), pools, failover, me.clone()),
            ep,
            config,
            meta,
            me: me.clone(),
            rt: tokio::runtime::Handle::current(),
            id,
            caps,
            files: Mutex::new(HashMap::new()),
            dir_attrs: DirAttrs::new(dir_ttl),
            no_xattrs: NoXattrs::new(dir_ttl),
            dir_names: DirNames::new(entry_ttl),
            scans: Scans::new(entry_ttl),
            releases: Mutex::new(Vec::new()),
            sessions: Mutex::new(HashMap::new()),
            held_locks: Mutex::new(HashMap::new()),
            held: held::Held::default(),
            resumed: std::sync::atomic::AtomicU64::new(hello_conn),
            ops: ops::OpWindow::default(),
            free_seen: Mutex::new(None),
            resume_lock: tokio::sync::Mutex::new(()),
            removes: Arc::default(),
        });
        client.data.refresh_map().await?;
        client.watch_links()?;
        client.spawn_resume_check();
        Ok(client)
    }

    /// This client as an `Arc`, for a task that outlives the call starting it.
    pub(crate) fn arc(&self) -> Arc<Client> {
        self.me
            .upgrade()
            .expect("a Client is only used through the Arc that `connect` returns")
    }

    /// The files this client has open.
    pub(crate) fn open_files(&self) -> Vec<Arc<FileState>> {
        self.files
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// The state of `ino` if this client has it open.
    pub(crate) fn open_file(&self, ino: InodeId) -> Option<Arc<FileState>> {
        self.files.lock().get(&ino).and_then(Weak::upgrade)
    }

    /// The capabilities of this client's key (a server without keys: every one).
    pub fn caps(&self) -> &proto::auth::Caps {
        &self.caps
    }

    /// The directory a mount of a subdirectory shows as its root (`subdir`), if any.
    pub fn subdir_root(&self) -> Option<InodeId> {
        self.ep.root()
    }

    /// The configuration in use.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// Calls sent so far to the metadata server and to data servers (the round trips
    /// that `tests/tests/round_trips.rs` bounds).
    pub fn rpc_counts(&self) -> RpcCounts {
        self.ep.counts()
    }

    /// The endpoint this client's transfers go through: memory lent to it
    /// ([`transport::Endpoint::lend`]) is what [`Client::read_into_region`] reads into.
    pub fn endpoint(&self) -> &transport::Endpoint {
        &self.ep
    }

    /// This client's metrics (a mount serves them on `[metrics] listen`).
    pub fn metrics(&self) -> &ClientMetrics {
        self.ep.metrics()
    }

    /// Sends `req`, waiting up to `meta_wait_ms` for a server that is away.
    pub(crate) async fn meta<R: MetaCall>(&self, req: R) -> Result<R::Reply> {
        self.meta_keeping(req).await.map(|(reply, _)| reply)
    }

    /// [`Client::meta`], also returning [`Client::attr_epoch`] as it was once the
    /// request had dropped the kept copies it changes: a reply's attributes may be kept
    /// (`keep_attr`) unless another such request went out meanwhile.
    pub(crate) async fn meta_keeping<R: MetaCall>(&self, req: R) -> Result<(R::Reply, u64)> {
        self.meta_keeping_as(req, caller::current()).await
    }

    /// [`Client::meta_keeping`] made for `caller` (see `client/caller.rs`).
    pub(crate) async fn meta_keeping_as<R: MetaCall>(
        &self,
        req: R,
        caller: Caller,
    ) -> Result<(R::Reply, u64)> {
        self.meta_sent(req, caller, !R::IDEMPOTENT, self.config.early_replies)
            .await
    }

    /// [`Client::meta_keeping`] for a change that lands alike however often it is sent
    /// (a length commit, an attribute change); with `early`, sent as a change (with an
    /// id) while early replies are on, so that the server may answer it before its log
    /// holds it: a small file's close then waits for no sync.
    pub(crate) async fn meta_early<R: MetaCall>(
        &self,
        req: R,
        early: bool,
    ) -> Result<(R::Reply, u64)> {
        let as_change = !R::IDEMPOTENT || (early && self.config.early_replies);
        self.meta_sent(req, caller::current(), as_change, self.config.early_replies)
            .await
    }

    /// Sends `req`; `as_change`: with an id (see below), and `early`: one the server may
    /// answer before its log holds it.
    async fn meta_sent<R: MetaCall>(
        &self,
        req: R,
        caller: Caller,
        as_change: bool,
        early: bool,
    ) -> Result<(R::Reply, u64)> {
        let req = Request::new(req).with_caller(caller);
        // Before the window of changes: a removal this call waits for may need a place
        // in it to be sent.
        if let MetaRequest::Fs(call) = req.envelope() {
            self.removes_fence(&call.req).await;
        }
        if !as_change {
            return self.meta_waiting(&req, self.meta_wait()).await;
        }
        // Applied once however often it is sent (see `proto::meta::OpId`), under a
        // count within the window of those in flight (see `client::ops`).
        let ticket = self.ops.enter().await;
        self.keep_window(ticket.seq).await?;
        // Every change's reply says how far the server's log is durable, which lets
        // go of the changes answered early before it (see `client::held`).
        let req = req.with_op(proto::meta::OpId {
            early,
            ..proto::meta::OpId::new(self.id, ticket.seq)
        });
        self.meta_waiting(&req, self.meta_wait()).await
    }

    /// One try of [`Client::meta_keeping`], on the connection the caller resumed.
    async fn meta_once<R: MetaCall>(&self, req: &Request<R>) -> Result<(R::Reply, u64)> {
        // The caches follow the file-system calls only.
        let fs_req = match req.envelope() {
            MetaRequest::Fs(call) => Some(&call.req),
            MetaRequest::Cluster(_) | MetaRequest::Admin(_) => None,
        };
        let token = fs_req.map(|r| {
            self.dir_attrs.before(r);
            self.scans.before(r);
            self.dir_names.before(r)
        });
        let since = self.attr_epoch();
        let epoch = self.no_xattrs.epoch();
        let (reply, tail) = rpc::meta_call_tailed(&self.ep, &self.meta, req).await;
        if let Some(tail) = &tail {
            let session = match reply.as_ref().ok().map(Replied::seen) {
                Some(Seen::Opened(o)) => Some(o.session),
                _ => None,
            };
            self.held.note(req.envelope(), tail, session);
        }
        if let (Some(r), Some(token)) = (fs_req, token) {
            let seen = reply.as_ref().ok().map(Replied::seen);
            self.dir_names.after(r, seen, token);
        }
        let reply = reply?;
        // Every attribute reply says whether the inode has extended attributes.
        match reply.seen() {
            Seen::Attr(a) => self.no_xattrs.note(a, epoch),
            Seen::Opened(o) => {
                for a in std::iter::once(&o.attr).chain(o.parent.as_ref().map(|c| &c.after)) {
                    self.no_xattrs.note(a, epoch);
                }
            }
            Seen::Made(m) => {
                self.no_xattrs.note(&m.attr, epoch);
                self.no_xattrs.note(&m.parent.after, epoch);
            }
            // What a removal in the directory next needs to know of it
            // (`client::removes`): removals there may go on without a `getattr`.
            Seen::Removed(change) => self.no_xattrs.note(&change.after, epoch),
            Seen::Dir(fs::DirPage { entries, .. }) => {
                for a in entries.iter().filter_map(|e| e.attr.as_ref()) {
                    self.no_xattrs.note(a, epoch);
                }
            }
            _ => {}
        }
        Ok((reply, since))
    }

    /// Ends `session` a moment later, in one `ReleaseMany` with the other closes of
    /// that moment: a data loader or `tar x` closes a file per few hundred microseconds,
    /// and each close was a round trip of its own. Only closes without a commit wait
    /// (the length of a written file is committed at its close, as before), so no
    /// other client can tell: a session only keeps an unlinked file's inode and chunks
    /// alive, for at most [`RELEASE_DELAY`] longer.
    pub(crate) fn release_later(&self, session: SessionId) {
        // Ended for this client now: a new metadata connection must not resume it.
        self.session_closed(session);
        let (first, full) = {
            let mut q = self.releases.lock();
            q.push(session);
            (q.len() == 1, q.len() >= MAX_RELEASES)
        };
        if !first && !full {
            return;
        }
        let me = self.me.clone();
        let delay = if full { Duration::ZERO } else { RELEASE_DELAY };
        self.rt.spawn(async move {
            tokio::time::sleep(delay).await;
            if let Some(client) = me.upgrade() {
                client.send_releases().await;
            }
        });
    }

    /// Ends every session `release_later` holds. Failures are logged: the sessions end
    /// with the connection anyway. A client about to disconnect calls it: the server
    /// takes files still open when a connection closes for ones a vanished writer may
    /// have left bytes past the end of, and has the next opener cut them.
    pub async fn send_releases(&self) {
        loop {
            let sessions: Vec<SessionId> = {
                let mut q = self.releases.lock();
                let n = q.len().min(MAX_RELEASES);
                q.drain(..n).collect()
            };
            if sessions.is_empty() {
                return;
            }
            let count = sessions.len();
            // No waiting for a server that is away: its restart ends these sessions
            // anyway, and an unmount must not stall on them.
            let req = Request::new(fs::ReleaseMany { sessions }).with_caller(caller::current());
            if let Err(e) = self.meta_waiting(&req, Duration::ZERO).await {
                tracing::warn!(error = %e, count, "ending sessions failed");
            }
        }
    }

    /// The cluster map, fresh from the metadata server.
    pub async fn cluster_map(&self) -> Result<Arc<ClusterMap>> {
        self.data.refresh_map().await?;
        Ok(self.data.map())
    }

    /// A live connection to data server `node`, refreshing the map if it is unknown.
    pub(crate) async fn data_conn(&self, node: NodeId) -> Result<Connection> {
        self.data.data_conn(node).await
    }

    /// Applies what this client knows and the server does not yet (uncommitted writes).
    pub(crate) fn overlay(&self, mut attr: Attr) -> Attr {
        if let Some(st) = self.live_file(attr.ino) {
            st.overlay(&mut attr);
        }
        attr
    }

    pub(crate) fn live_file(&self, ino: InodeId) -> Option<Arc<FileState>> {
        self.files.lock().get(&ino).and_then(Weak::upgrade)
    }

    /// [`Client::overlay`] for attributes a lookup or listing brought: while appends to
    /// the file wait to be placed, their length is in neither, so they are placed and
    /// the attributes asked for again.
    pub(crate) async fn fresh_overlay(&self, attr: Attr) -> Result<Attr> {
        match self.live_file(attr.ino) {
            Some(st) if !st.appends_idle() => self.getattr(attr.ino).await,
            _ => Ok(self.overlay(attr)),
        }
    }

    /// The attributes a create, unlink or commit reply brought, if fresh (taken), with
    /// this client's later writes laid over them; `None` while appends to the file wait
    /// to be placed (their length is not in them).
    pub(crate) fn take_kept_attr(&self, ino: InodeId) -> Option<Attr> {
        if self.live_file(ino).is_some_and(|st| !st.appends_idle()) {
            return None;
        }
        if let Some(a) = self.removes.shown(ino) {
            return Some(a);
        }
        self.dir_attrs.take(ino).map(|a| self.overlay(a))
    }

    /// Keeps a file's attributes, from the reply to a request sent when
    /// [`Client::attr_epoch`] was `since`, for the next `getattr`.
    pub(crate) fn keep_attr(&self, attr: Attr, since: u64) {
        self.dir_attrs.put_since(attr, since);
    }

    /// Read before sending a request whose reply's attributes may be kept.
    pub(crate) fn attr_epoch(&self) -> u64 {
        self.dir_attrs.epoch()
    }

    /// Whether `parent` is known to have no entry `name`, without asking: a directory
    /// this mount made or listed whole (`dirnames.rs`). `.` and `..` are never absent.
    pub(crate) fn name_known_absent(&self, parent: InodeId, name: &[u8]) -> bool {
        !matches!(name, b"." | b"..") && self.dir_names.absent(parent, name)
    }

    /// Whether `name` of `ino` is known to be absent without asking: the kernel's check
    /// for file capabilities before each write, `ls -l`'s for a security label (see
    /// `noxattrs.rs`).
    pub(crate) fn xattr_known_absent(&self, ino: InodeId, name: &[u8]) -> bool {
        self.no_xattrs.absent(ino, name)
    }

    /// Makes a name (mkdir, mknod, symlink, link); keeps the directory's new attributes
    /// for the kernel's `getattr` that follows, as a create does.
    async fn entry<R: MetaCall<Reply = fs::Made>>(&self, req: R, caller: Caller) -> Result<Attr> {
        let (made, _) = self.meta_keeping_as(req, caller).await?;
        self.dir_attrs.put(made.parent.after);
        Ok(made.attr)
    }

    /// Creates a directory.
    pub async fn mkdir(
        &self,
        parent: InodeId,
        name: &[u8],
        perm: u32,
        caller: Caller,
    ) -> Result<Attr> {
        let name = name.to_vec();
        self.entry(fs::Mkdir { parent, name, perm }, caller).await
    }

    /// Creates a FIFO, socket or device node.
    pub async fn mknod(
        &self,
        parent: InodeId,
        name: &[u8],
        kind: FileKind,
        perm: u32,
        rdev: u32,
        caller: Caller,
    ) -> Result<Attr> {
        let name = name.to_vec();
        let req = fs::MkNod {
            parent,
            name,
            kind,
            perm,
            rdev,
        };
        self.entry(req, caller).await
    }

    /// Creates a symbolic link.
    pub async fn symlink(
        &self,
        parent: InodeId,
        name: &[u8],
        target: &[u8],
        caller: Caller,
    ) -> Result<Attr> {
        let (name, target) = (name.to_vec(), target.to_vec());
        self.entry(
            fs::Symlink {
                parent,
                name,
                target,
            },
            caller,
        )
        .await
    }

    /// Reads a symlink's target.
    pub async fn readlink(&self, ino: InodeId) -> Result<Vec<u8>> {
        self.meta(fs::Readlink { ino }).await
    }

    /// Adds a hard link; `kernel_checked`: the caller's kernel applied its hard-link
    /// rule (`fs.protected_hardlinks`) already (see `fs::Link`).
    pub async fn link(
        &self,
        ino: InodeId,
        new_parent: InodeId,
        new_name: &[u8],
        kernel_checked: bool,
    ) -> Result<Attr> {
        let new_name = new_name.to_vec();
        let attr = self
            .entry(
                fs::Link {
                    ino,
                    new_parent,
                    new_name,
                    kernel_checked,
                },
                caller::current(),
            )
            .await?;
        Ok(self.overlay(attr))
    }

    /// Removes a name of a non-directory.
    pub async fn unlink(&self, parent: InodeId, name: &[u8]) -> Result<fs::Unlinked> {
        self.removes.wait(removes::Fence::Inode(parent)).await;
        let name = name.to_vec();
        let done = self.meta(fs::Unlink { parent, name }).await?;
        self.dir_attrs.put(done.parent.after.clone());
        Ok(done)
    }

    /// Whether this client may answer an unlink before the server has it (see
    /// `client::removes`): the server could refuse it for none of the reasons this
    /// client cannot see (a read-only key or mount, root squashed).
    pub(crate) fn may_defer_removes(&self) -> bool {
        self.config.defer_removes
            && !self.caps.read_only
            && !self.config.read_only
            && !self.caps.root_squash
    }

    /// Sends the unlink of `name` (inode `ino`) from `parent` for `caller` and returns
    /// without its reply; `shown`: the directory's attributes to answer its `getattr`
    /// with until then. `false` if [`removes::MAX_DEFERRED`] are on their way already
    /// (nothing was sent). Until the reply, calls that could see the server without it
    /// wait for it.
    pub(crate) fn unlink_later(
        &self,
        parent: InodeId,
        name: &[u8],
        ino: InodeId,
        caller: Caller,
        shown: Attr,
    ) -> bool {
        // Within the changes answered early and kept (`client::held`): past them each
        // further change would wait for a `Settle` first.
        if self.held.len() >= removes::MAX_DEFERRED {
            return false;
        }
        let Some(way) = self.removes.start(parent, name, ino, shown) else {
            return false;
        };
        self.metrics().deferred_remove();
        let me = self.arc();
        let name = name.to_vec();
        let work = async move {
            let req = fs::Unlink {
                parent,
                name: name.clone(),
            };
            let r = me.meta_keeping_as(req, caller).await;
            let after = r.as_ref().ok().map(|(done, _)| done.parent.after.clone());
            way.end(after, |newest| me.dir_attrs.put(newest));
            if let Err(e) = r {
                me.removal_failed(parent, &name, ino, e).await;
            }
        };
        if !crate::eager::spawn(&self.rt, work) {
            // Its guard ended it and kept the failure for the directory's fsync.
            tracing::error!(%parent, "a deferred unlink panicked");
            self.metrics().deferred_remove_failed();
        }
        true
    }

    /// An unlink answered before the server had it failed there with `e`: kept for the
    /// directory's next `fsync`, unless the name is gone all the same.
    async fn removal_failed(&self, parent: InodeId, name: &[u8], ino: InodeId, e: ClientError) {
        if e.code() == ErrorCode::NotFound {
            // Removed by another client meanwhile (perhaps made again, as another
            // inode), or the directory moved out of this key's reach: only a lookup
            // can tell.
            let req = fs::Lookup {
                parent,
                name: name.to_vec(),
            };
            match self.meta(req).await {
                Ok(a) if a.ino != ino => return,
                Err(l) if l.code() == ErrorCode::NotFound => {
                    tracing::debug!(%parent, error = %e, "a deferred unlink found no name");
                    return;
                }
                _ => {}
            }
        }
        tracing::warn!(
            %parent,
            name = %String::from_utf8_lossy(name),
            error = %e,
            "an unlink answered before the metadata server had it failed there: the \
             file may still be there (the directory's next fsync fails)"
        );
        self.metrics().deferred_remove_failed();
        let kept = self.removes.failed(
            parent,
            WireError::new(e.code(), format!("a removal in {parent}: {e}")),
        );
        if !kept {
            tracing::warn!(%parent, "too many directories with a failed removal: not kept for fsync");
        }
    }

    /// Whether `ino` is known, within the attribute TTL, to have no extended attribute
    /// (so no flags either): forgotten when this client changes one.
    pub(crate) fn known_without_xattrs(&self, ino: InodeId) -> bool {
        self.no_xattrs.none(ino)
    }

    /// The refusal of an unlink answered early in `dir`, since its last `fsync`.
    pub(crate) fn take_remove_failure(&self, dir: InodeId) -> Option<ClientError> {
        self.removes.take_failure(dir)
    }

    /// Returns once no removal on its way that `req` could see is (see
    /// `client::removes`).
    pub(crate) async fn removes_fence(&self, req: &fs::FsRequest) {
        self.removes.wait(removes::fence_of(req)).await
    }

    /// Returns once every unlink answered before the server had it is answered.
    pub async fn removes_sent(&self) {
        self.removes.wait(removes::Fence::All).await
    }

    /// Removes an empty directory.
    pub async fn rmdir(&self, parent: InodeId, name: &[u8]) -> Result<()> {
        let name = name.to_vec();
        let change = self.meta(fs::Rmdir { parent, name }).await?;
        self.dir_attrs.put(change.after);
        Ok(())
    }

    /// Renames atomically.
    pub async fn rename(
        &self,
        parent: InodeId,
        name: &[u8],
        new_parent: InodeId,
        new_name: &[u8],
        mode: RenameMode,
    ) -> Result<()> {
        let req = fs::Rename {
            parent,
            name: name.to_vec(),
            new_parent,
            new_name: new_name.to_vec(),
            mode,
        };
        self.meta(req).await.map(drop)
    }

    /// One page of a directory listing after the name `after`; `true` when it is the last.
    pub async fn readdir_page(
        &self,
        ino: InodeId,
        after: Option<Vec<u8>>,
        max_entries: u32,
        plus: bool,
    ) -> Result<(Vec<DirEntry>, bool)> {
        let req = fs::ReadDir {
            ino,
            after,
            max_entries,
            plus,
        };
        let page = self.meta(req).await?;
        Ok((page.entries, page.done))
    }

    /// The whole listing of a directory (for tools and tests; the mount pages).
    pub async fn readdir_all(&self, ino: InodeId) -> Result<Vec<DirEntry>> {
        self.readdir_all_plus(ino, false).await
    }

    /// [`Client::readdir_all`], with each entry's attributes if `plus`.
    pub async fn readdir_all_plus(&self, ino: InodeId, plus: bool) -> Result<Vec<DirEntry>> {
        let mut all: Vec<DirEntry> = Vec::new();
        loop {
            let after = all.last().map(|e| e.name.clone());
            let (page, done) = self.readdir_page(ino, after, 1024, plus).await?;
            all.extend(page);
            if done {
                return Ok(all);
            }
        }
    }

    /// File system totals.
    pub async fn statfs(&self) -> Result<FsStats> {
        let s = self.meta(fs::StatFs).await?;
        *self.free_seen.lock() = Some((std::time::Instant::now(), s.free_bytes));
        Ok(FsStats {
            total_bytes: s.total_bytes,
            free_bytes: s.free_bytes,
            files: s.files,
        })
    }

    /// Reads an extended attribute.
    pub async fn getxattr(&self, ino: InodeId, name: &[u8]) -> Result<Vec<u8>> {
        let caps = name == CAPABILITY;
        if self.xattr_known_absent(ino, name) {
            return Err(ClientError::NoXattr(format!("{ino}")));
        }
        let req = Request::new(fs::GetXattr {
            ino,
            name: name.to_vec(),
        })
        .with_caller(caller::current());
        let (r, guessed) = self.getxattr_call(ino, &req, caps).await;
        match r {
            // Only the server's own answer is kept, not one guessed while it was away.
            Err(e) if caps && !guessed && e.code() == ErrorCode::NoData => {
                self.no_xattrs.no_capability(ino);
                Err(e)
            }
            r => r,
        }
    }

    /// Sets an extended attribute.
    pub async fn setxattr(
        &self,
        ino: InodeId,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
    ) -> Result<()> {
        self.no_xattrs.changing(ino);
        let req = fs::SetXattr {
            ino,
            name: name.to_vec(),
            value: value.to_vec(),
            mode,
        };
        self.meta(req).await.map(drop)
    }

    /// Lists extended attribute names.
    pub async fn listxattr(&self, ino: InodeId) -> Result<Vec<Vec<u8>>> {
        if self.no_xattrs.none(ino) {
            return Ok(Vec::new());
        }
        self.meta(fs::ListXattr { ino }).await
    }

    /// Removes an extended attribute.
    pub async fn removexattr(&self, ino: InodeId, name: &[u8]) -> Result<()> {
        self.no_xattrs.changing(ino);
        let req = fs::RemoveXattr {
            ino,
            name: name.to_vec(),
        };
        self.meta(req).await.map(drop)
    }

    /// The attribute flags of `ino` (`lsattr`).
    pub async fn getflags(&self, ino: InodeId) -> Result<InodeFlags> {
        let flags = self.meta(fs::GetFlags { ino }).await?;
        self.flags_known(ino, flags);
        Ok(flags)
    }

    /// Sets the attribute flags of `ino` (`chattr`); answers its attributes.
    pub async fn setflags(&self, ino: InodeId, flags: InodeFlags) -> Result<Attr> {
        // The server keeps them as an attribute: "no attributes" is no longer known.
        self.no_xattrs.changing(ino);
        let attr = self.meta(fs::SetFlags { ino, flags }).await?;
        self.flags_known(ino, flags);
        Ok(attr)
    }

    /// Tells this mount's open handles of `ino` whether it is immutable now.
    fn flags_known(&self, ino: InodeId, flags: InodeFlags) {
        if let Some(st) = self.live_file(ino) {
            st.set_immutable(flags.immutable);
        }
    }

    /// Refuses with EPERM a cut of `ino`'s bytes (`what`: a truncation, a punched or
    /// zeroed range) if it is immutable or append only, before the data servers cut
    /// anything: the metadata server judges only the length, after them. It matters
    /// for a descriptor opened for writing before the flag was set (an open after it is
    /// refused already). Free for a file this mount knows, within the attribute TTL,
    /// to have no extended attributes (where the flags are kept); one call otherwise.
    pub(crate) async fn refuse_if_flagged(&self, ino: InodeId, what: &str) -> Result<()> {
        if self.no_xattrs.none(ino) {
            return Ok(());
        }
        let flags = self.getflags(ino).await?;
        if flags.immutable || flags.append {
            return Err(ClientError::Refused(WireError::new(
                ErrorCode::NotPermitted,
                format!("{ino} is immutable or append only: no {what}"),
            )));
        }
        Ok(())
    }
}

impl MapSource for Client {
    /// The map through the metadata connection, waiting for a server that is away as
    /// every metadata call does.
    fn fetch_map(&self) -> MapFetch<'_> {
        Box::pin(async move { self.meta(GetMap).await })
    }

    /// One try, no waiting for a server that is away: the grant held is used
    /// meanwhile, and data servers take it past its expiry while they cannot reach the
    /// server either (reads and writes of open files must not wait on it).
    fn regrant(&self, session: proto::SessionId) -> GrantFetch<'_> {
        Box::pin(async move {
            let req = Request::new(fs::Regrant { session }).with_caller(caller::current());
            let (grant, _) = self.meta_waiting(&req, Duration::ZERO).await?;
            Ok(grant)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::locks::signal_pending;

    #[test]
    fn a_live_quiet_process_has_no_signal_pending_and_a_dead_one_counts_as_signalled() {
        assert!(!signal_pending(std::process::id()));
        assert!(signal_pending(u32::MAX - 1));
        assert!(!signal_pending(0));
    }
}
