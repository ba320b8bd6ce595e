//! Open-file sessions and what goes with them: create, open, the writer's length
//! commits, release, setattr, and the freeing of files unlinked while open.

use super::entries::{add_entry, delete_inode, inherit_setgid};
use super::held;
use super::names::check_name;
use super::opens;
use super::perm;
use super::records::{InodeRecord, StoredLayout};
use super::txn::{Reads, Txn};
use super::{dirlayout, keys, now, ConnId, Namespace, Opened, Session, State, ID_BLOCK};
use crate::error::{show, MetaError};
use proto::attr::TimeSet;
use proto::meta::{Caller, Commit, DirChange, OpenAccess};
use proto::{Attr, ClientId, FileKind, InodeId, Layout, SessionId, SetAttr};
use std::collections::{HashMap, HashSet};

/// Who a new session belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionOwner {
    /// The client (mount) that asked, from its `Hello`.
    pub client: ClientId,
    /// The connection it asked on; the session ends when that connection closes.
    pub conn: ConnId,
    /// What the open asked to do with the file.
    pub access: OpenAccess,
    /// Whether it asked for `O_APPEND` (an append-only file opens for writing only so).
    pub append: bool,
}

/// What a create names: the file `name` in `parent`, its permission bits if it is new,
/// and whether an existing one is an error (`O_EXCL`).
#[derive(Clone, Copy)]
pub(super) struct NewFile<'a> {
    pub(super) parent: InodeId,
    pub(super) name: &'a [u8],
    pub(super) perm: u32,
    pub(super) exclusive: bool,
}

impl Namespace {
    /// Creates regular file `name` in `parent` for `caller` and opens it; opens an
    /// existing regular file of that name instead, unless `exclusive`. No permission
    /// check: `create_as` is the request's.
    pub fn create(
        &self,
        parent: InodeId,
        name: &[u8],
        perm: u32,
        caller: Caller,
        exclusive: bool,
        owner: SessionOwner,
    ) -> Result<Opened, MetaError> {
        let file = NewFile {
            parent,
            name,
            perm,
            exclusive,
        };
        self.create_as(&file, caller, owner, false)
    }

    /// [`Self::create`], with the caller's permissions checked (`checked`) under the
    /// lock and on the records the create acts on, in `open(O_CREAT)`'s order: search
    /// on the directory, then (an existing file) `O_EXCL`'s EEXIST and the open's
    /// access to the file, or (a new file) write on the directory. A new file is
    /// opened whatever its mode.
    pub(super) fn create_as(
        &self,
        file: &NewFile<'_>,
        caller: Caller,
        owner: SessionOwner,
        checked: bool,
    ) -> Result<Opened, MetaError> {
        let NewFile {
            parent,
            name,
            perm,
            exclusive,
        } = *file;
        check_name(name)?;
        let mut st = self.state.lock();
        let mut txn = self.begin(&st);
        let parent_rec = txn.dir(parent)?;
        if checked {
            let m = super::access::mode_of(&txn, parent, &parent_rec)?;
            perm::check(&caller, &m, perm::X, "search the directory")?;
        }
        let existing = txn.dirent(parent, name)?;
        let (ino, rec, parent_after) = match existing {
            Some(_) if exclusive => {
                return Err(MetaError::AlreadyExists(format!(
                    "{} in {parent}",
                    show(name)
                )));
            }
            Some(d) if d.kind == FileKind::Directory => {
                return Err(MetaError::IsADirectory(format!("create of {}", show(name))));
            }
            Some(d) if d.kind != FileKind::Regular => {
                return Err(MetaError::AlreadyExists(format!(
                    "{} is a {:?}",
                    show(name),
                    d.kind
                )));
            }
            Some(d) => {
                let rec = txn.inode(InodeId(d.ino))?;
                if checked {
                    let m = super::access::mode_of(&txn, InodeId(d.ino), &rec)?;
                    let how = super::access::OpenHow::of(&owner);
                    super::access::check_open(&caller, &m, how)?;
                }
                (InodeId(d.ino), rec, parent_rec.clone())
            }
            None => {
                if checked {
                    let m = super::access::mode_of(&txn, parent, &parent_rec)?;
                    perm::may_create(&caller, &m)?;
                }
                self.new_file(&mut txn, parent, &parent_rec, name, perm, caller)?
            }
        };
        let cut_tail = tail_duty(&st, &txn, ino, &rec)?;
        let session = reserve_session(&st, &mut txn, ino, owner.access.writes())?;
        let change = DirChange {
            before: parent_rec.ctime,
            after: parent_after.attr(parent),
        };
        self.answer_open_with_mark(&txn, (ino, &rec), session, Some(&change), cut_tail)?;
        Self::commit_txn(&mut st, txn)?;
        let opened = self.start_session(&mut st, session, ino, &rec, owner, cut_tail);
        Ok(Opened {
            parent: Some(change),
            ..opened
        })
    }

    /// Puts the answer of an open that makes a file (`create`, `tmpfile`) in the change's
    /// mark (`once::answer_with_mark`), as `start_session` will give it, if the request
    /// carries one; a retry answered from it gets a grant of its own
    /// (`Namespace::reopened`).
    pub(super) fn answer_open_with_mark(
        &self,
        txn: &Txn<'_>,
        (ino, rec): (InodeId, &InodeRecord),
        session: SessionId,
        parent: Option<&DirChange>,
        cut_tail: bool,
    ) -> Result<(), MetaError> {
        if !super::once::marked() {
            return Ok(());
        }
        let opened = Opened {
            attr: txn.attr_of(ino, rec)?,
            session,
            layout: self.layout_of(rec),
            parent: parent.cloned(),
            cut_tail,
            grant: None,
            cut_grant: None,
        };
        super::once::answer_with_mark(&opened)
    }

    /// Writes a new regular file with its layout; the caller commits. Returns the file
    /// and the directory's new record.
    fn new_file(
        &self,
        txn: &mut Txn<'_>,
        parent: InodeId,
        parent_rec: &InodeRecord,
        name: &[u8],
        perm: u32,
        caller: Caller,
    ) -> Result<(InodeId, InodeRecord, InodeRecord), MetaError> {
        let (ino, rec) = self.new_inode(txn, parent, parent_rec, perm, caller)?;
        txn.put_inode(ino, &rec)?;
        let parent_after = add_entry(txn, parent, name, ino, FileKind::Regular, rec.ctime)?;
        Ok((ino, rec, parent_after))
    }

    /// A new regular file's number and record (owner, mode, layout) as `parent`'s
    /// settings make it, not yet stored.
    pub(super) fn new_inode(
        &self,
        txn: &mut Txn<'_>,
        parent: InodeId,
        parent_rec: &InodeRecord,
        perm: u32,
        caller: Caller,
    ) -> Result<(InodeId, InodeRecord), MetaError> {
        let chains = self.chain_ids();
        if chains.is_empty() {
            return Err(MetaError::NoSpace("no data servers registered".into()));
        }
        let (replicas, chunk_size_bytes) = dirlayout::for_new_file(txn, parent, &self.config)?;
        let now = now();
        let ino = txn.alloc_inode()?;
        let mut rec = InodeRecord::new(FileKind::Regular, perm, caller.uid, caller.gid, now);
        inherit_setgid(parent_rec, &mut rec);
        let new = (ino, &mut rec);
        super::xattr::inherit_acls(txn, (parent, parent_rec), new, caller.umask)?;
        rec.perm = perm::new_file_mode(&caller, rec.gid, rec.perm);
        rec.layout = Some(StoredLayout {
            chunk_size_bytes,
            first: (ino.0 % chains.len() as u64) as u32,
            chains,
            replicas,
        });
        Ok((ino, rec))
    }

    /// Opens `ino` and starts a session; `truncate` empties a regular file first.
    pub fn open_inode(
        &self,
        ino: InodeId,
        truncate: bool,
        owner: SessionOwner,
    ) -> Result<Opened, MetaError> {
        let mut st = self.state.lock();
        let mut txn = self.begin(&st);
        let mut rec = txn.inode(ino)?;
        if truncate {
            match rec.kind {
                FileKind::Directory => {
                    return Err(MetaError::IsADirectory(format!("truncating open of {ino}")));
                }
                // As Linux: O_TRUNC on a regular file sets mtime and ctime even when it
                // is empty already; on FIFOs, devices and sockets it is ignored.
                FileKind::Regular => {
                    let now = now();
                    let old_size = rec.size;
                    rec.size = 0;
                    rec.mtime = now;
                    rec.changed_at(now);
                    txn.put_inode(ino, &rec)?;
                    held::update(&mut txn, ino, old_size, &rec, held::Change::default())?;
                }
                _ => {}
            }
        }
        let cut_tail = tail_duty(&st, &txn, ino, &rec)?;
        let session = reserve_session(&st, &mut txn, ino, owner.access.writes())?;
        Self::commit_txn(&mut st, txn)?;
        Ok(self.start_session(&mut st, session, ino, &rec, owner, cut_tail))
    }

    /// The layout an open of `rec` answers: its own, or the defaults for a file that
    /// has none yet.
    fn layout_of(&self, rec: &InodeRecord) -> Layout {
        match &rec.layout {
            Some(l) => Layout::from(l),
            None => Layout {
                chunk_size_bytes: self.config.chunk_size_bytes,
                chains: Vec::new(),
                first: 0,
                replicas: self.config.replicas,
            },
        }
    }

    /// Records a session whose batch has committed (with the cut of the file's tail,
    /// if given), and builds the reply.
    pub(super) fn start_session(
        &self,
        st: &mut State,
        session: SessionId,
        ino: InodeId,
        rec: &InodeRecord,
        owner: SessionOwner,
        cut_tail: bool,
    ) -> Opened {
        st.next_session = session.0 + 1;
        if session.0 >= st.session_end {
            st.session_end = session.0 + ID_BLOCK;
        }
        if cut_tail {
            st.cutting.insert(ino, session);
            tracing::info!(%session, %ino, client = %owner.client, "a client vanished with this file open: its opener cuts the chunks past the length");
        }
        let s = Session {
            ino,
            conn: owner.conn,
            client: owner.client,
            write: owner.access.writes(),
        };
        st.sessions.insert(session, s);
        *st.open_counts.entry(ino).or_insert(0) += 1;
        tracing::debug!(%session, %ino, client = %owner.client, "session opened");
        let layout = self.layout_of(rec);
        // Read after the batch is staged, which reads see; a record that does not
        // decode counts the file dense rather than fail an open that has happened.
        let attr = self.reads().attr_of(ino, rec).unwrap_or_else(|e| {
            tracing::warn!(%ino, error = %e, "reading the held chunks failed");
            rec.attr(ino)
        });
        Opened {
            attr,
            session,
            layout,
            parent: None,
            cut_tail,
            grant: None,
            cut_grant: None,
        }
    }

    /// The client of `session` cut `ino`'s chunks at its length, as its open was asked
    /// to: the file's `T` mark goes. A session that was not given the cut (its claim
    /// ended with its connection, and another opener may be cutting now) is `Stale`.
    pub fn tail_cut(&self, ino: InodeId, session: SessionId) -> Result<(), MetaError> {
        let mut st = self.state.lock();
        if st.cutting.get(&ino) != Some(&session) {
            return Err(MetaError::Stale(format!(
                "{session} was not given the cut of {ino}"
            )));
        }
        let mut txn = self.begin(&st);
        txn.delete(keys::tail(ino));
        Self::commit_txn(&mut st, txn)?;
        st.cutting.remove(&ino);
        Ok(())
    }

    /// Records a writer's length and mtime for regular file `ino`.
    pub fn commit(&self, ino: InodeId, commit: Commit) -> Result<Attr, MetaError> {
        self.commit_as(ino, commit, None)
    }

    /// [`Namespace::commit`] by `by` (a caller on a connection), checked under the
    /// lock on the record it changes (see [`may_commit_in`]).
    pub(super) fn commit_as(
        &self,
        ino: InodeId,
        commit: Commit,
        by: Option<(&Caller, ConnId)>,
    ) -> Result<Attr, MetaError> {
        // The answer goes with the change (see `once`): one batch, which an early reply
        // counts as one (`MAX_EARLY`).
        self.mutate_answering(|txn, st| {
            if let Some((c, conn)) = by {
                may_commit_in(txn, st, ino, c, conn)?;
            }
            apply_commit(txn, ino, &commit)
        })
    }

    /// Ends `session`, applying a last length commit first; frees the file if it was
    /// unlinked while open and this was its last session.
    pub fn release(&self, session: SessionId, commit: Option<Commit>) -> Result<(), MetaError> {
        let mut st = self.state.lock();
        let s = *st
            .sessions
            .get(&session)
            .ok_or_else(|| MetaError::Stale(format!("no {session}")))?;
        let mut txn = self.begin(&st);
        // A directory removed while open has no inode left to commit to; nothing is lost.
        if let Some(commit) = commit {
            if txn.try_inode(s.ino)?.is_some() {
                apply_commit(&mut txn, s.ino, &commit)?;
            }
        }
        if opens::closing(&mut txn, &st, s.ino, &[session])?.unopened {
            purge_if_orphan(&mut txn, s.ino)?;
        }
        // One transaction: its answer goes with it (see `Namespace::mutate_answering`).
        super::once::answer_with_mark(&())?;
        Self::commit_txn(&mut st, txn)?;
        end_session(&mut st, session);
        Ok(())
    }

    /// Ends sessions without a commit (the client batches such closes). A session that
    /// is already gone (its connection closed meanwhile) is skipped; the first other
    /// failure is returned after every session was tried.
    pub fn release_many(&self, sessions: &[SessionId]) -> Result<(), MetaError> {
        if sessions.len() > proto::meta::MAX_RELEASES {
            return Err(MetaError::InvalidArgument(format!(
                "{} sessions in one release, at most {}",
                sessions.len(),
                proto::meta::MAX_RELEASES
            )));
        }
        let mut first_error = None;
        for &s in sessions {
            // Each close commits on its own: on a shared engine one that conflicts runs
            // again alone (a close already made ends its session, and is `Stale` after).
            match self.retry_conflicts("release", || self.release(s, None)) {
                Ok(()) | Err(MetaError::Stale(_)) => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Reserves `len` bytes at the end of regular file `ino` for an `O_APPEND` write and
    /// returns where they start; the new length is durable before the reply.
    pub fn append(&self, ino: InodeId, len: u64) -> Result<u64, MetaError> {
        self.mutate_answering(|txn, _| {
            let mut rec = txn.inode(ino)?;
            if rec.kind != FileKind::Regular {
                return Err(MetaError::InvalidArgument(format!(
                    "append to a {:?}",
                    rec.kind
                )));
            }
            let offset = rec.size;
            rec.size = proto::file_end(offset, len)
                .ok_or_else(|| MetaError::TooBig(format!("append of {len} bytes to {ino}")))?;
            let now = now();
            rec.mtime = now;
            rec.changed_at(now);
            txn.put_inode(ino, &rec)?;
            let cs = rec
                .layout
                .as_ref()
                .map_or(1, |l| u64::from(l.chunk_size_bytes));
            let wrote = proto::runs::touched(offset, rec.size, cs);
            let change = held::Change {
                wrote: Some(&wrote),
                punched: None,
            };
            held::update(txn, ino, offset, &rec, change)?;
            Ok(offset)
        })
    }

    /// Records a read of `ino` the way `relatime` does: the access time moves to now only
    /// if it is older than the last change or more than a day old (always if `strict`,
    /// as `strictatime` says), and the change time stays (reading is not a change).
    /// Returns the attributes either way.
    pub fn accessed(&self, ino: InodeId, strict: bool) -> Result<Attr, MetaError> {
        const DAY_SECS: i64 = 24 * 3600;
        let rec = self.getattr(ino)?;
        let now = now();
        let due = strict
            || rec.atime <= rec.mtime
            || rec.atime <= rec.ctime
            || rec.atime.secs.saturating_add(DAY_SECS) <= now.secs;
        if !due {
            return Ok(rec);
        }
        self.mutate(|txn, _| {
            let mut rec = txn.inode(ino)?;
            rec.atime = now;
            txn.put_inode(ino, &rec)?;
            txn.attr_of(ino, &rec)
        })
    }

    /// Ends every session opened over connection `conn` (it closed), freeing the files
    /// that were unlinked while open and have no session left.
    pub fn connection_closed(&self, conn: ConnId) {
        if self.stopping.load(std::sync::atomic::Ordering::Acquire) {
            // The server closes every connection as it stops: its clients live on and
            // may still commit what they write. Sessions end with the process anyway,
            // and orphans are purged at the next start.
            return;
        }
        self.end_sessions_of(conn);
        // Locks last: a waiter granted one may open the file next, and must find it
        // marked by then.
        self.release_conn_locks(conn);
        self.unmark_conn(conn);
    }

    /// Stops treating closed connections as vanished clients: the server is stopping
    /// and closes them itself.
    pub fn stop(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Ends the sessions of a closed connection; its files get a `T` mark, since the
    /// client may have left bytes past their length.
    fn end_sessions_of(&self, conn: ConnId) {
        let mut st = self.state.lock();
        let ended: Vec<(SessionId, InodeId, bool)> = st
            .sessions
            .iter()
            .filter(|(_, s)| s.conn == conn)
            .map(|(&id, s)| (id, s.ino, s.write))
            .collect();
        if ended.is_empty() {
            return;
        }
        let mut closing: HashMap<InodeId, Vec<SessionId>> = HashMap::new();
        for (session, ino, _) in &ended {
            closing.entry(*ino).or_default().push(*session);
        }
        // Only a writer can leave bytes past the committed length: a reader's vanished
        // session leaves no tail to cut (and so hands the next opener no cut grant).
        let written: HashSet<InodeId> = ended.iter().filter(|e| e.2).map(|e| e.1).collect();
        // The sessions end either way: the connection is gone. An orphan whose purge
        // failed keeps its `O` key and is purged at the next start (on a shared engine,
        // where nothing is purged at start, its `P` key keeps the ended sessions until
        // this server stops and another one's sweep ends them). On a shared engine the
        // change is read and tried again while it conflicts with another server's.
        // On a shared engine one transaction per file (each writes the file's `P` key,
        // and an engine transaction holds 128 writes at most); one for all otherwise.
        let groups: Vec<HashMap<InodeId, Vec<SessionId>>> = match self.checked {
            Some(_) => closing.into_iter().map(|e| HashMap::from([e])).collect(),
            None => vec![closing],
        };
        for group in &groups {
            let freed = self.retry_conflicts("closing a connection's sessions", || {
                let mut txn = self.begin(&st);
                let ended = purge_closing(&mut txn, &st, group)?;
                // Not a file whose sessions a client took back on another server: it
                // writes there still.
                mark_tails(&mut txn, written.iter().filter(|i| ended.contains(i)))?;
                Self::commit_txn(&mut st, txn)
            });
            if let Err(e) = freed {
                tracing::warn!(conn = conn.0, error = %e, "freeing orphans or marking the files left open failed");
            }
        }
        for (session, _, _) in ended {
            end_session(&mut st, session);
        }
        drop(st);
        // Nobody waits for a reply here, but a staged change is committed by the thread
        // that waits for it (this one is off the async workers).
        if let Some(t) = crate::kv::take_pending() {
            if let Err(e) = self.store.wait(t) {
                tracing::warn!(conn = conn.0, error = %e, "committing the ended sessions failed");
            }
        }
        tracing::debug!(conn = conn.0, "connection's sessions ended");
    }

    /// Changes attributes of `ino`; ctime is always set to now.
    pub fn setattr(&self, ino: InodeId, set: &SetAttr) -> Result<Attr, MetaError> {
        self.commit_and_setattr(ino, None, set)
    }

    /// Applies a writer's length commit to `ino` (if any), then changes its attributes,
    /// as one change: a `utime`, `chown` or `chmod` of a file just written (`tar x`,
    /// `cp -a`) costs one durable change, not two.
    pub fn commit_and_setattr(
        &self,
        ino: InodeId,
        commit: Option<Commit>,
        set: &SetAttr,
    ) -> Result<Attr, MetaError> {
        self.commit_and_setattr_as(ino, commit, set, None)
    }

    /// [`Self::commit_and_setattr`] of a request by `caller` on connection `conn`
    /// (`None`: no request's, unchecked). The permission rules
    /// ([`perm::check_setattr`]) and what they change are decided on the record read
    /// here, under the lock (a refusal drops the length commit with the rest), so
    /// that a chmod or chown landing meanwhile is neither missed nor undone: a chmod's
    /// setgid bit
    /// ([`perm::chmod_mode`]), and a chown that carries no mode (a mount's kernel sends
    /// the mode it computed; the library has no kernel) dropping setuid, setgid and the
    /// file's capabilities as Linux does ([`perm::chown_mode`]).
    pub(super) fn commit_and_setattr_as(
        &self,
        ino: InodeId,
        commit: Option<Commit>,
        set: &SetAttr,
        caller: Option<(&Caller, ConnId)>,
    ) -> Result<Attr, MetaError> {
        // The answer goes with the change (see `once`): one batch, which an early
        // reply counts as one (`MAX_EARLY`).
        self.mutate_answering(|txn, st| {
            if let Some(c) = &commit {
                if let Some((caller, conn)) = caller {
                    may_commit_in(txn, st, ino, caller, conn)?;
                }
                apply_commit(txn, ino, c)?;
            }
            let now = now();
            let mut rec = txn.inode(ino)?;
            let mut set = set.clone();
            if let Some((c, conn)) = caller {
                let m = super::access::mode_of(txn, ino, &rec)?;
                let held = perm::Held {
                    write_session: set.size.is_some()
                        && !perm::may(c, &m, perm::W)
                        && st.holds(ino, conn, true),
                };
                perm::check_setattr(c, &m, &set, held)?;
                let gid = set.gid.unwrap_or(rec.gid);
                set.perm = set.perm.map(|p| perm::chmod_mode(c, gid, p));
                super::xattr::chown_effects(txn, ino, &mut rec, c, &set)?;
            }
            let old_size = rec.size;
            if let Some(size) = set.size {
                match rec.kind {
                    FileKind::Regular => {
                        rec.size = checked_size(size, ino)?;
                        rec.mtime = now;
                    }
                    FileKind::Directory => {
                        return Err(MetaError::IsADirectory(format!("size of {ino}")));
                    }
                    kind => {
                        return Err(MetaError::InvalidArgument(format!("size of a {kind:?}")));
                    }
                }
            }
            if let Some(perm) = set.perm {
                rec.perm = perm & 0o7777;
                super::xattr::chmod_acl(txn, ino, &rec)?;
            }
            rec.uid = set.uid.unwrap_or(rec.uid);
            rec.gid = set.gid.unwrap_or(rec.gid);
            let at = |t: TimeSet| match t {
                TimeSet::Now => now,
                TimeSet::At(t) => t,
            };
            rec.atime = set.atime.map_or(rec.atime, at);
            rec.mtime = set.mtime.map_or(rec.mtime, at);
            rec.changed_at(now);
            txn.put_inode(ino, &rec)?;
            held::update(txn, ino, old_size, &rec, held::Change::default())
        })
    }

    /// Frees every orphan left by the previous run.
    ///
    /// Sessions live in memory only, so after a restart no orphan (a file unlinked while
    /// open) has a session any more, and nothing else would ever free it.
    pub(super) fn purge_orphans(&self) -> Result<(), MetaError> {
        // One batch per orphan: its purge is a few writes, more with xattrs and data
        // servers, and a batch must fit one engine transaction (etcd takes 128 writes),
        // which several orphans together could pass. Group commit still makes one
        // durable commit of the page's batches.
        const PAGE: usize = 16;
        let prefix = keys::orphan_prefix();
        let end = keys::prefix_end(&prefix);
        loop {
            let page = self.store.scan(&prefix, &end, PAGE)?;
            if page.is_empty() {
                return Ok(());
            }
            let mut st = self.state.lock();
            for (k, _) in &page {
                let mut txn = self.begin(&st);
                match keys::u64_at(k, prefix.len()).map(InodeId) {
                    Some(ino) => purge_if_orphan(&mut txn, ino)?,
                    // A key we cannot read is of no use: drop it rather than loop on it.
                    None => txn.delete(k.clone()),
                }
                Self::commit_txn(&mut st, txn)?;
            }
            tracing::info!(count = page.len(), "purged orphans of the previous run");
        }
    }
}

/// `size` as a regular file's length: at most [`proto::MAX_FILE_BYTES`], as an append's
/// end is (EFBIG beyond, as Linux answers a length past what a file can hold).
fn checked_size(size: u64, ino: InodeId) -> Result<u64, MetaError> {
    if size > proto::MAX_FILE_BYTES {
        return Err(MetaError::TooBig(format!(
            "a length of {size} bytes for {ino}"
        )));
    }
    Ok(size)
}

/// Whether `c` may commit writes to `ino` through connection `conn`: by the file's
/// mode, or through a session of `conn` opened for writing (one opened before the file
/// was flagged still commits what it wrote). Decided under the lock, on the record
/// the change is made to. Only the first may be answered early: a commit sent again
/// after a crash comes before its client's sessions are resumed, so one that only a
/// session allowed waits for the log (`early::wait_for_log`).
fn may_commit_in(
    txn: &Txn<'_>,
    st: &State,
    ino: InodeId,
    c: &Caller,
    conn: ConnId,
) -> Result<(), MetaError> {
    let rec = txn.inode(ino)?;
    match perm::check_commit(c, &super::access::mode_of(txn, ino, &rec)?) {
        Ok(()) => Ok(()),
        Err(_) if st.holds(ino, conn, true) => {
            super::early::wait_for_log();
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Applies a writer's commit to regular file `ino`: length grows to `commit.size`.
/// Returns its attributes after it.
fn apply_commit(txn: &mut Txn<'_>, ino: InodeId, c: &Commit) -> Result<Attr, MetaError> {
    let mut rec = txn.inode(ino)?;
    match rec.kind {
        FileKind::Regular => {}
        FileKind::Directory => return Err(MetaError::IsADirectory(format!("commit to {ino}"))),
        kind => return Err(MetaError::InvalidArgument(format!("commit to a {kind:?}"))),
    }
    let old_size = rec.size;
    rec.size = rec.size.max(checked_size(c.size, ino)?);
    rec.mtime = c.mtime;
    rec.changed_at(now());
    txn.put_inode(ino, &rec)?;
    let cs = rec
        .layout
        .as_ref()
        .map_or(1, |l| u64::from(l.chunk_size_bytes));
    let punched = held::punch_within(&c.punched, c.size, old_size, cs);
    let change = held::Change {
        wrote: Some(&c.wrote),
        punched: Some(&punched),
    };
    held::update(txn, ino, old_size, &rec, change)
}

/// Ends the sessions of `closing` (inode -> sessions ending) and purges the orphans
/// left with no session.
fn purge_closing(
    txn: &mut Txn<'_>,
    st: &State,
    closing: &HashMap<InodeId, Vec<SessionId>>,
) -> Result<HashSet<InodeId>, MetaError> {
    let mut ended = HashSet::new();
    for (ino, sessions) in closing {
        let closed = opens::closing(txn, st, *ino, sessions)?;
        if closed.unopened {
            purge_if_orphan(txn, *ino)?;
        }
        if closed.ended {
            ended.insert(*ino);
        }
    }
    Ok(ended)
}

/// Marks the regular files among `inos` that still exist (`T` key): a client vanished
/// with them open, and whatever it wrote past their length may be on the data servers.
/// Their held-chunk sets go too (dense from then on): the vanished writer's chunks
/// inside the length were never reported, and `st_blocks` must not count less than the
/// data a reader finds.
pub(super) fn mark_tails<'i>(
    txn: &mut Txn<'_>,
    inos: impl Iterator<Item = &'i InodeId>,
) -> Result<(), MetaError> {
    for &ino in inos {
        if txn
            .try_inode(ino)?
            .is_some_and(|r| r.kind == FileKind::Regular)
        {
            txn.put(keys::tail(ino), super::records::encode(&())?);
            txn.delete(keys::held(ino));
        }
    }
    Ok(())
}

/// Whether an open of `ino` (record `rec`) is to cut its chunks at its length first: it
/// carries a `T` mark and no session has it open. `Busy` while another opener cuts.
fn tail_duty(
    st: &State,
    txn: &Txn<'_>,
    ino: InodeId,
    rec: &InodeRecord,
) -> Result<bool, MetaError> {
    if rec.kind != FileKind::Regular || txn.raw(&keys::tail(ino))?.is_none() {
        return Ok(false);
    }
    if st.cutting.contains_key(&ino) {
        return Err(MetaError::Busy(format!(
            "{ino}: another client is cutting what a vanished writer left past its end"
        )));
    }
    // Sessions still open may be writing past the end themselves: the mark stays for
    // an open that finds the file closed.
    Ok(!opens::open_anywhere(txn, st, ino)?)
}

/// Deletes `ino` (and queues its chunks' deletion) if it carries an orphan mark.
pub(super) fn purge_if_orphan(txn: &mut Txn<'_>, ino: InodeId) -> Result<(), MetaError> {
    if txn.raw(&keys::orphan(ino))?.is_none() {
        return Ok(());
    }
    match txn.try_inode(ino)? {
        Some(rec) => delete_inode(txn, ino, &rec),
        None => {
            txn.delete(keys::orphan(ino));
            Ok(())
        }
    }
}

/// The id of the next session, a session that opens `ino`; reserves a new block in the
/// superblock (written with the caller's batch) when the current one is used up, and
/// on a shared engine names the session among the file's openers (`opens`).
pub(super) fn reserve_session(
    st: &State,
    txn: &mut Txn<'_>,
    ino: InodeId,
    write: bool,
) -> Result<SessionId, MetaError> {
    let mut id = st.next_session;
    if id >= st.session_end {
        // A new block above every block reserved before, by any server (see `hello`);
        // `start_session` takes it once the transaction has committed.
        let sb = txn.sb()?;
        id = id.max(sb.session_ceiling);
        sb.session_ceiling = id + ID_BLOCK;
    }
    opens::opened(txn, ino, SessionId(id), write)?;
    Ok(SessionId(id))
}

pub(super) fn end_session(st: &mut State, session: SessionId) {
    let Some(s) = st.sessions.remove(&session) else {
        return;
    };
    // A cut never reported stays to do: the mark is still there for the next open.
    if st.cutting.get(&s.ino) == Some(&session) {
        st.cutting.remove(&s.ino);
    }
    if let Some(n) = st.open_counts.get_mut(&s.ino) {
        *n -= 1;
        if *n == 0 {
            st.open_counts.remove(&s.ino);
        }
    }
    tracing::debug!(%session, ino = %s.ino, client = %s.client, "session ended");
}

impl Namespace {
    /// The file of `session` and whether it was opened for writing, if it is open on
    /// connection `conn` (a grant is renewed only for the connection that holds it).
    pub fn session_file(
        &self,
        session: SessionId,
        conn: ConnId,
    ) -> Result<(InodeId, bool), MetaError> {
        match self.state.lock().sessions.get(&session) {
            Some(s) if s.conn == conn => Ok((s.ino, s.write)),
            _ => Err(MetaError::Stale(format!("no {session} on this connection"))),
        }
    }
}
