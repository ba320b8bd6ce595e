//! Each request type's handler: the namespace method it runs and what the server needs
//! to know about it (where it runs, whether it adds records, how it is written).
//!
//! One `impl` per request type; its reply type comes from `proto` ([`Rpc::Reply`]), so a
//! handler answering with another type does not compile.

use super::perm::XattrAccess;
use super::{Namespace, Origin, SessionOwner};
use crate::error::MetaError;
use proto::meta::{admin, cluster, fs, LockKind};
use proto::Rpc;

/// A request the namespace answers.
pub trait Handle: Rpc {
    /// A few cached key reads that change nothing (path walks, `stat`): the server runs
    /// them on the async worker that received them as they are; the rest there too, but
    /// with the worker's other tasks handed to another thread while they run (or on the
    /// blocking pool, over etcd: `service.rs` `run`).
    const POINT_READ: bool = false;
    /// Adds records to the store: refused while its disk is short of room (`space`).
    const ADDS_RECORDS: bool = false;
    /// Its changes are written lazily, as a local file system writes an access time
    /// back with the inode later: the reply does not wait for the sync.
    const LAZY: bool = false;
    /// Its change may be answered before the log holds it, to a client that keeps it
    /// to send again (see `early`): one that makes or removes a name, commits a length
    /// or changes attributes, whose second run after a crash lands as the first did
    /// (what would not, it asks to wait for the log: `early::wait_for_log`).
    const EARLY: bool = false;
    /// An early reply needs it to have made an inode (a create that opened an
    /// existing file waits for the log: its truncation is the client's to redo).
    const MAKES: bool = false;
    /// The id the request's tracing span carries (inode, node, session or a count).
    fn span_id(&self) -> u64;
    /// Whether running it again after a commit etcd did not answer, which may have
    /// landed, answers as one run would (`txn::settle`): a request that may be applied
    /// twice, unless a second run answers otherwise (an exclusive setxattr's EEXIST) or
    /// leaves something behind (an open's second session, held until its connection
    /// closes).
    fn runs_again_alike(&self) -> bool {
        Self::IDEMPOTENT
    }
    /// Runs the request that came from `at`, checking first that its caller may.
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError>;
    /// The reply a change recorded, answered again to the same change sent again from
    /// `at` (see `once`): an open moves its session to `at`'s connection.
    fn replayed(
        &self,
        reply: Self::Reply,
        _ns: &Namespace,
        _at: &Origin,
    ) -> Result<Self::Reply, MetaError> {
        Ok(reply)
    }
}

impl Handle for fs::Hello {
    fn span_id(&self) -> u64 {
        0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        ns.hello(&self.name, at.who.as_deref())
    }
}

impl Handle for fs::Lookup {
    const POINT_READ: bool = true;
    fn span_id(&self) -> u64 {
        self.parent.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        ns.may_search(&at.caller, self.parent)?;
        ns.lookup(self.parent, &self.name)
    }
}

impl Handle for fs::LookupParent {
    const POINT_READ: bool = true;
    fn span_id(&self) -> u64 {
        self.dir.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        // As a lookup of ".." in it: searching the directory is what is checked.
        ns.may_search(&at.caller, self.dir)?;
        ns.lookup_parent(self.dir)
    }
}

impl Handle for fs::GetAttr {
    const POINT_READ: bool = true;
    fn span_id(&self) -> u64 {
        self.ino.0
    }
    fn run(self, ns: &Namespace, _: &Origin) -> Result<Self::Reply, MetaError> {
        ns.getattr(self.ino)
    }
}

impl Handle for fs::SetAttr {
    const EARLY: bool = true;
    fn span_id(&self) -> u64 {
        self.ino.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        // What a second run after a crash would not make as the first did waits for
        // the log: a cut (its chunks were cut on the data servers before, and an open
        // may be what allows it) and a time set to "now" (another now then). A commit
        // that only a session allows waits too (`may_commit_in`).
        let now = Some(proto::TimeSet::Now);
        if self.set.size.is_some() || self.set.atime == now || self.set.mtime == now {
            super::early::wait_for_log();
        }
        // Every check is made under the lock, on the record the change is made to.
        let by = Some((&at.caller, at.conn));
        ns.commit_and_setattr_as(self.ino, self.commit, &self.set, by)
    }
}

impl Handle for fs::Create {
    const ADDS_RECORDS: bool = true;
    const EARLY: bool = true;
    const MAKES: bool = true;
    fn span_id(&self) -> u64 {
        self.parent.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        ns.may_name_client(self.client, at.who.as_deref())?;
        let owner = SessionOwner {
            client: self.client,
            conn: at.conn,
            access: self.access,
            append: self.append,
        };
        let file = super::files::NewFile {
            parent: self.parent,
            name: &self.name,
            perm: self.perm,
            exclusive: self.exclusive,
        };
        let mut opened = ns.create_as(&file, at.caller.clone(), owner, true)?;
        ns.attach_grant(at, &mut opened, self.access.writes());
        Ok(opened)
    }
    fn replayed(
        &self,
        opened: fs::Opened,
        ns: &Namespace,
        at: &Origin,
    ) -> Result<fs::Opened, MetaError> {
        ns.reopened(self.client, opened, self.access.writes(), at)
    }
}

impl Handle for fs::TmpFile {
    const ADDS_RECORDS: bool = true;
    fn span_id(&self) -> u64 {
        self.parent.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        ns.may_name_client(self.client, at.who.as_deref())?;
        ns.may_make_tmpfile(&at.caller, self.parent)?;
        let owner = SessionOwner {
            client: self.client,
            conn: at.conn,
            access: self.access,
            append: false,
        };
        let caller = at.caller.clone();
        let mut opened = ns.tmpfile(self.parent, self.perm, caller, self.linkable, owner)?;
        ns.attach_grant(at, &mut opened, self.access.writes());
        Ok(opened)
    }
    fn replayed(
        &self,
        opened: fs::Opened,
        ns: &Namespace,
        at: &Origin,
    ) -> Result<fs::Opened, MetaError> {
        ns.reopened(self.client, opened, self.access.writes(), at)
    }
}

impl Handle for fs::MkNod {
    const ADDS_RECORDS: bool = true;
    const EARLY: bool = true;
    const MAKES: bool = true;
    fn span_id(&self) -> u64 {
        self.parent.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        let r = self;
        ns.may_add(&at.caller, r.parent, &r.name)?;
        super::perm::may_mknod(&at.caller, r.kind)?;
        ns.mknod(r.parent, &r.name, r.kind, r.perm, r.rdev, at.caller.clone())
    }
}

impl Handle for fs::Mkdir {
    const ADDS_RECORDS: bool = true;
    const EARLY: bool = true;
    const MAKES: bool = true;
    fn span_id(&self) -> u64 {
        self.parent.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        ns.may_add(&at.caller, self.parent, &self.name)?;
        ns.mkdir(self.parent, &self.name, self.perm, at.caller.clone())
    }
}

impl Handle for fs::Symlink {
    const ADDS_RECORDS: bool = true;
    const EARLY: bool = true;
    const MAKES: bool = true;
    fn span_id(&self) -> u64 {
        self.parent.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        ns.may_add(&at.caller, self.parent, &self.name)?;
        ns.symlink(self.parent, &self.name, &self.target, at.caller.clone())
    }
}

impl Handle for fs::Readlink {
    const POINT_READ: bool = true;
    fn span_id(&self) -> u64 {
        self.ino.0
    }
    fn run(self, ns: &Namespace, _: &Origin) -> Result<Self::Reply, MetaError> {
        ns.readlink(self.ino)
    }
}

impl Handle for fs::Link {
    const ADDS_RECORDS: bool = true;
    fn span_id(&self) -> u64 {
        self.ino.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        let to = (self.new_parent, &self.new_name[..]);
        ns.may_link(&at.caller, self.ino, to, self.kernel_checked)?;
        let by = (!self.kernel_checked).then_some(&at.caller);
        ns.link_as(self.ino, to, by)
    }
}

impl Handle for fs::Unlink {
    const EARLY: bool = true;
    fn span_id(&self) -> u64 {
        self.parent.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        ns.may_remove(&at.caller, self.parent, &self.name)?;
        ns.unlink(self.parent, &self.name)
    }
}

impl Handle for fs::Rmdir {
    const EARLY: bool = true;
    fn span_id(&self) -> u64 {
        self.parent.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        ns.may_remove(&at.caller, self.parent, &self.name)?;
        ns.rmdir(self.parent, &self.name)
    }
}

impl Handle for fs::Rename {
    fn span_id(&self) -> u64 {
        self.parent.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        let r = self;
        let (from, to) = ((r.parent, &r.name[..]), (r.new_parent, &r.new_name[..]));
        ns.may_rename(&at.caller, from, to, r.mode)?;
        if r.mode.whiteout() {
            // A whiteout is a device node: only root may make one, as mknod.
            super::perm::may_mknod(&at.caller, proto::FileKind::CharDevice)?;
        }
        ns.rename_as(from, to, r.mode, (at.caller.uid, at.caller.gid))
    }
}

impl Handle for fs::ReadDir {
    fn span_id(&self) -> u64 {
        self.ino.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        ns.may_list(&at.caller, self.ino)?;
        ns.readdir(self.ino, self.after.as_deref(), self.max_entries, self.plus)
    }
}

impl Handle for fs::StatFs {
    fn span_id(&self) -> u64 {
        0
    }
    fn run(self, ns: &Namespace, _: &Origin) -> Result<Self::Reply, MetaError> {
        ns.statfs()
    }
}

impl Handle for fs::Open {
    fn span_id(&self) -> u64 {
        self.ino.0
    }
    fn runs_again_alike(&self) -> bool {
        false
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        ns.may_name_client(self.client, at.who.as_deref())?;
        let how = super::access::OpenHow {
            access: self.access,
            truncate: self.truncate,
            append: self.append,
        };
        ns.may_open(&at.caller, self.ino, how)?;
        let owner = SessionOwner {
            client: self.client,
            conn: at.conn,
            access: self.access,
            append: self.append,
        };
        let mut opened = ns.open_inode(self.ino, self.truncate, owner)?;
        ns.attach_grant(at, &mut opened, self.access.writes());
        Ok(opened)
    }
}

impl Handle for fs::OpenAt {
    fn span_id(&self) -> u64 {
        self.parent.0
    }
    fn runs_again_alike(&self) -> bool {
        false
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        ns.may_search(&at.caller, self.parent)?;
        let found = ns.lookup(self.parent, &self.name)?;
        if found.kind != proto::FileKind::Regular {
            return Ok(fs::OpenedAt::Found(found));
        }
        let ino = found.ino;
        // Then exactly an `Open` of what was found: its checks, session and grant.
        let open = fs::Open {
            ino,
            client: self.client,
            truncate: false,
            access: self.access,
            append: self.append,
        };
        let mut opened = open.run(ns, at)?;
        // An open that may read was allowed to, which is what `Accessed` checks. The
        // access time is written lazily, as `Accessed` writes it (the reply waits for
        // the open's changes only), and the open stands if it cannot move: best effort,
        // as the client's own `Accessed` is. Only the atime is taken from its reply:
        // the grants were sealed for the attributes the open saw.
        if let (Some(strict), true) = (self.accessed, self.access != proto::meta::OpenAccess::Write)
        {
            match crate::kv::lazily_within(|| ns.accessed(ino, strict)) {
                Ok(attr) => opened.attr.atime = attr.atime,
                Err(e) => tracing::debug!(%ino, error = %e, "atime update of an open failed"),
            }
        }
        Ok(fs::OpenedAt::Opened(Box::new(opened)))
    }
}

impl Handle for fs::Regrant {
    // A look at the session in memory, and a MAC.
    const POINT_READ: bool = true;
    fn span_id(&self) -> u64 {
        self.session.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        ns.regrant(self.session, at)
    }
}

impl Handle for fs::MyCaps {
    const POINT_READ: bool = true;
    fn span_id(&self) -> u64 {
        0
    }
    fn run(self, _: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        Ok(crate::gate::caps_of(at.who.as_deref()))
    }
}

impl Handle for fs::Settle {
    fn span_id(&self) -> u64 {
        self.client.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        ns.settle(self.client, at.conn, at.who.as_deref())
    }
}

impl Handle for fs::Commit {
    const EARLY: bool = true;
    fn span_id(&self) -> u64 {
        self.ino.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        // Checked under the lock; one only a session allows waits for the log.
        ns.commit_as(self.ino, self.commit, Some((&at.caller, at.conn)))
    }
}

impl Handle for fs::Release {
    fn span_id(&self) -> u64 {
        self.session.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        ns.may_end(&at.caller, self.session, at.conn, self.commit.is_some())?;
        ns.release(self.session, self.commit)
    }
}

impl Handle for fs::TailCut {
    fn span_id(&self) -> u64 {
        self.ino.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        ns.may_end(&at.caller, self.session, at.conn, false)?;
        ns.tail_cut(self.ino, self.session)
    }
}

impl Handle for fs::ReleaseMany {
    fn span_id(&self) -> u64 {
        self.sessions.len() as u64
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        ns.release_many(&ns.own_sessions(&self.sessions, at.conn))
    }
}

impl Handle for fs::GetXattr {
    const POINT_READ: bool = true;
    fn span_id(&self) -> u64 {
        self.ino.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        ns.may_xattr(&at.caller, self.ino, &self.name, XattrAccess::Read)?;
        ns.getxattr(self.ino, &self.name)
    }
}

impl Handle for fs::SetXattr {
    const ADDS_RECORDS: bool = true;
    fn span_id(&self) -> u64 {
        self.ino.0
    }
    fn runs_again_alike(&self) -> bool {
        self.mode != proto::meta::XattrMode::Create
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        let attr = (&self.name[..], &self.value[..]);
        ns.setxattr_as(self.ino, attr, self.mode, Some(&at.caller))
    }
}

impl Handle for fs::ListXattr {
    fn span_id(&self) -> u64 {
        self.ino.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        let mut names = ns.listxattr(self.ino)?;
        names.retain(|n| super::perm::lists_xattr(&at.caller, n));
        Ok(names)
    }
}

impl Handle for fs::RemoveXattr {
    fn span_id(&self) -> u64 {
        self.ino.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        ns.removexattr_as(self.ino, &self.name, Some(&at.caller))
    }
}

impl Handle for fs::GetFlags {
    const POINT_READ: bool = true;
    fn span_id(&self) -> u64 {
        self.ino.0
    }
    fn run(self, ns: &Namespace, _: &Origin) -> Result<Self::Reply, MetaError> {
        // Whoever reached the inode may read its flags, as its attributes (`lsattr`
        // opens the file first: the kernel checks that open).
        ns.getflags(self.ino)
    }
}

impl Handle for fs::SetFlags {
    // Not refused while the store is short of room: a flagged file cannot be removed
    // until its flags are cleared (and setting them adds one attribute of a few bytes).
    fn span_id(&self) -> u64 {
        self.ino.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        ns.setflags_as(self.ino, self.flags, Some(&at.caller))
    }
}

impl Handle for fs::Append {
    fn span_id(&self) -> u64 {
        self.ino.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        ns.may_commit(&at.caller, self.ino, at.conn)?;
        ns.append(self.ino, self.len)
    }
}

impl Handle for fs::Accessed {
    const LAZY: bool = true;
    fn span_id(&self) -> u64 {
        self.ino.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        // An access time is moved by a read: only a caller who may read the file.
        ns.may_open(&at.caller, self.ino, super::access::OpenHow::read())?;
        ns.accessed(self.ino, self.strict)
    }
}

impl Handle for fs::SetLock {
    fn span_id(&self) -> u64 {
        self.ino.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        ns.may_name_client(self.client, at.who.as_deref())?;
        if self.lock.kind != LockKind::Unlock {
            ns.may_lock(self.ino, at.conn)?;
            if !self.reclaim {
                ns.check_lock_grace()?;
            }
        }
        match ns.set_lock(self.ino, self.client, at.conn, self.lock) {
            Err(e @ MetaError::WouldBlock(_)) if self.waits => {
                Err(ns.lock_refused(self.ino, self.client, at.conn, self.lock, e))
            }
            r => {
                ns.lock_wait_over(self.client, self.lock.owner);
                r
            }
        }
    }
}

impl Handle for fs::GetLock {
    fn span_id(&self) -> u64 {
        self.ino.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        ns.may_name_client(self.client, at.who.as_deref())?;
        // As a lock is taken, a lock is probed on an open descriptor (`F_GETLK`): the
        // file must be open on this connection, so its open's checks were passed.
        ns.may_lock(self.ino, at.conn)?;
        ns.lock_conflict(self.ino, self.client, &self.lock)
    }
}

impl Handle for fs::ReleaseLocks {
    fn span_id(&self) -> u64 {
        self.ino.0
    }
    fn run(self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        ns.may_name_client(self.client, at.who.as_deref())?;
        ns.release_lock_owner(self.ino, self.client, self.owner)
    }
}

impl Handle for fs::Resume {
    fn span_id(&self) -> u64 {
        self.sessions.len() as u64
    }
    fn run(mut self, ns: &Namespace, at: &Origin) -> Result<Self::Reply, MetaError> {
        ns.may_name_client(self.client, at.who.as_deref())?;
        if crate::gate::caps_of(at.who.as_deref()).read_only {
            // A read-only key opens nothing for writing (an `Open` would be EROFS).
            self.sessions.iter_mut().for_each(|o| o.writes = false);
        }
        let r = ns.resume(self.client, &self.sessions, at.conn, &at.caller)?;
        Ok(fs::Resumed {
            grants: ns.resume_grants(at, &r.kept),
            lost: r.lost,
        })
    }
}

impl Handle for cluster::RegisterData {
    fn span_id(&self) -> u64 {
        self.node.map_or(0, |n| u64::from(n.0))
    }
    fn run(self, ns: &Namespace, _: &Origin) -> Result<Self::Reply, MetaError> {
        let r = self;
        ns.register_data(r.node, &r.addr, r.capacity_bytes, r.used_bytes)
    }
}

impl Handle for cluster::Heartbeat {
    fn span_id(&self) -> u64 {
        u64::from(self.node.0)
    }
    fn run(self, ns: &Namespace, _: &Origin) -> Result<Self::Reply, MetaError> {
        let r = self;
        let (cap, used) = (r.capacity_bytes, r.used_bytes);
        let (gc, map) = ns.heartbeat(r.node, cap, used, &r.done, r.map_version, r.resync)?;
        Ok(cluster::Beat { gc, map })
    }
}

impl Handle for cluster::GetMap {
    fn span_id(&self) -> u64 {
        0
    }
    fn run(self, ns: &Namespace, _: &Origin) -> Result<Self::Reply, MetaError> {
        ns.cluster_map()
    }
}

impl Handle for cluster::ListFiles {
    fn span_id(&self) -> u64 {
        self.after.0
    }
    fn run(self, ns: &Namespace, _: &Origin) -> Result<Self::Reply, MetaError> {
        let (files, done) = ns.list_files(self.after, self.limit)?;
        Ok(cluster::FilesPage { files, done })
    }
}

impl Handle for cluster::InodesExist {
    fn span_id(&self) -> u64 {
        self.inodes.len() as u64
    }
    fn run(self, ns: &Namespace, _: &Origin) -> Result<Self::Reply, MetaError> {
        ns.inodes_exist(&self.inodes)
    }
}

impl Handle for cluster::InodeCopies {
    fn span_id(&self) -> u64 {
        self.inodes.len() as u64
    }
    fn run(self, ns: &Namespace, _: &Origin) -> Result<Self::Reply, MetaError> {
        ns.inode_copies(&self.inodes)
    }
}

impl Handle for admin::Status {
    fn span_id(&self) -> u64 {
        0
    }
    fn run(self, ns: &Namespace, _: &Origin) -> Result<Self::Reply, MetaError> {
        ns.status()
    }
}

impl Handle for admin::CheckNamespace {
    fn span_id(&self) -> u64 {
        0
    }
    fn run(self, ns: &Namespace, _: &Origin) -> Result<Self::Reply, MetaError> {
        ns.check_namespace()
    }
}
