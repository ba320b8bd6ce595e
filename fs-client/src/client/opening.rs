//! Opening files: `open`, `create`, the brief open behind a truncation of a file this
//! client has not open, and the cut of bytes a vanished writer may have left.
//!
//! A writer puts bytes on the data servers before it commits the file's length, at
//! close or `fsync`. If its client dies in between, those bytes stay past the length,
//! invisible until the file grows over them: a truncation upwards or a write past the
//! end would then show them where zeros belong. The metadata server marks every file a
//! client had open when its connection closed, and the next open that finds the file
//! closed everywhere is asked to cut its chunks at its length first
//! (`proto::meta::fs::Opened::cut_tail`); other opens wait meanwhile (`Busy`).

use super::Client;
use crate::error::{ClientError, Result};
use crate::file::{FileHandle, FileState};
use crate::rpc::MetaCall;
use proto::grant::Grant;
use proto::meta::fs::{self, Opened, OpenedAt};
use proto::meta::{Caller, OpenAccess};
use proto::{Attr, ErrorCode, FileKind, InodeId, Layout, SessionId, SetAttr};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// What [`Client::open_at`] found at the name.
pub enum OpenedByName {
    /// A regular file, now open.
    File(Attr, FileHandle),
    /// Not a regular file (a directory, a symbolic link, a device): its attributes;
    /// nothing was opened.
    Other(Attr),
}

/// How long an open waits at most while another client cuts the same file.
const CUT_WAIT: Duration = Duration::from_secs(10);
/// How often it asks again meanwhile.
const CUT_POLL: Duration = Duration::from_millis(20);

impl Client {
    /// Creates (or, unless `exclusive`, opens an existing) regular file and opens it; an
    /// existing file is emptied if `truncate` (`O_TRUNC`). The kernel sends a create when
    /// its lookup found no such name, which another client may have made since: the
    /// caller then gets that file, emptied as `open(2)` would, never its old bytes
    /// under a writer that expects an empty file.
    pub async fn create(
        &self,
        parent: InodeId,
        name: &[u8],
        perm: u32,
        caller: Caller,
        exclusive: bool,
        truncate: bool,
    ) -> Result<(Attr, FileHandle)> {
        let how = (exclusive, truncate, OpenAccess::ReadWrite, false);
        self.create_for(parent, name, perm, caller, how).await
    }

    /// [`Client::create`] with the open's access (`O_ACCMODE`), which an existing
    /// file's mode must allow: `how` is `(exclusive, truncate, access, append)`
    /// (`append`: `O_APPEND`, without which an append-only file opens for reading only).
    pub async fn create_for(
        &self,
        parent: InodeId,
        name: &[u8],
        perm: u32,
        caller: Caller,
        (exclusive, truncate, access, append): (bool, bool, OpenAccess, bool),
    ) -> Result<(Attr, FileHandle)> {
        let req = fs::Create {
            parent,
            name: name.to_vec(),
            perm,
            exclusive,
            client: self.id,
            access,
            append,
        };
        let reply = self.meta_opening(req, Some(caller.clone())).await?;
        let existed = matches!(&reply.parent, Some(c) if !c.changed());
        let (attr, fh) = self.opened(reply, access.writes(), caller).await?;
        self.emptied_if(truncate && existed, attr, fh).await
    }

    /// Makes an unnamed regular file in `parent` and opens it for `access`
    /// (`O_TMPFILE`); `linkable` (no `O_EXCL`) lets a link name it later. It has no
    /// link: the metadata server frees it at its last close.
    pub async fn tmpfile_for(
        &self,
        parent: InodeId,
        perm: u32,
        caller: Caller,
        (linkable, access): (bool, OpenAccess),
    ) -> Result<(Attr, FileHandle)> {
        let req = fs::TmpFile {
            parent,
            perm,
            linkable,
            access,
            client: self.id,
        };
        let reply = self.meta_opening(req, Some(caller.clone())).await?;
        self.opened(reply, access.writes(), caller).await
    }

    /// Opens an existing inode for reading and writing; `truncate` empties it first
    /// (`O_TRUNC`).
    pub async fn open(&self, ino: InodeId, truncate: bool) -> Result<(Attr, FileHandle)> {
        self.open_for(ino, OpenAccess::ReadWrite, truncate).await
    }

    /// Opens an existing inode for `access`, which its mode must allow; `truncate`
    /// empties it first (`O_TRUNC`, which needs write permission).
    pub async fn open_for(
        &self,
        ino: InodeId,
        access: OpenAccess,
        truncate: bool,
    ) -> Result<(Attr, FileHandle)> {
        self.open_named(ino, (access, truncate, false), false).await
    }

    /// [`Client::open_for`], for a kernel that reached `ino` through a name it keeps
    /// (`by_name`; not through a descriptor of a file whose last name it removed). Then a
    /// file that is gone, or has no link left, is not opened (nor emptied) but answered
    /// Stale, and the listing pages forget it: the name was kept from before another
    /// client removed the file, and on Stale the kernel looks it up afresh (as over NFS),
    /// so `open(O_CREAT)` makes a new file, as on a local disk, where ENOENT failed it.
    /// `append`: `O_APPEND` (see [`Client::create_for`]).
    pub async fn open_named(
        &self,
        ino: InodeId,
        (access, truncate, append): (OpenAccess, bool, bool),
        by_name: bool,
    ) -> Result<(Attr, FileHandle)> {
        let req = fs::Open {
            ino,
            client: self.id,
            truncate: false,
            access,
            append,
        };
        let stale = |why: &str| {
            self.scans.gone(ino);
            let why = format!("{ino} {why}: look its name up again");
            ClientError::Remote(proto::WireError::new(ErrorCode::Stale, why))
        };
        let reply = match self.meta_opening(req, None).await {
            Err(e) if by_name && e.code() == ErrorCode::NotFound => return Err(stale("is gone")),
            r => r?,
        };
        let caller = super::caller::current();
        let (attr, fh) = self.opened(reply, access.writes(), caller).await?;
        if by_name && attr.nlink == 0 && attr.kind != FileKind::Directory {
            if let Err(e) = self.release(&fh).await {
                tracing::debug!(error = %e, "release of an unlinked file's open");
            }
            return Err(stale("has been unlinked"));
        }
        let regular = attr.kind == FileKind::Regular;
        self.emptied_if(truncate && regular, attr, fh).await
    }

    /// Opens `name` in `parent` for `access` if it names a regular file: the lookup and
    /// the open in one call. `reading`: the caller reads the file at once (a whole-file
    /// read), so the access time the first read would move moves in the same call.
    /// `append`: `O_APPEND` (see [`Client::create_for`]).
    pub async fn open_at(
        &self,
        parent: InodeId,
        name: &[u8],
        (access, append): (OpenAccess, bool),
        reading: bool,
    ) -> Result<OpenedByName> {
        let accessed = if reading && access != OpenAccess::Write {
            self.atime_strictness()
        } else {
            None
        };
        let req = fs::OpenAt {
            parent,
            name: name.to_vec(),
            client: self.id,
            access,
            accessed,
            append,
        };
        match self.meta_opening(req, None).await? {
            OpenedAt::Found(attr) => Ok(OpenedByName::Other(attr)),
            OpenedAt::Opened(reply) => {
                let caller = super::caller::current();
                let (attr, fh) = self.opened(*reply, access.writes(), caller).await?;
                if accessed.is_some() {
                    fh.atime_settled();
                }
                Ok(OpenedByName::File(attr, fh))
            }
        }
    }

    /// The open file, cut to length 0 first if `empty` (`O_TRUNC` on a regular file).
    async fn emptied_if(
        &self,
        empty: bool,
        attr: Attr,
        fh: FileHandle,
    ) -> Result<(Attr, FileHandle)> {
        if !empty {
            return Ok((attr, fh));
        }
        let set = SetAttr {
            size: Some(0),
            ..SetAttr::default()
        };
        match self.setattr(attr.ino, set).await {
            Ok(attr) => Ok((attr, fh)),
            Err(e) => {
                // The open failed: its session must not stay open (nor be resumed).
                if let Err(r) = self.release(&fh).await {
                    tracing::debug!(ino = %attr.ino, error = %r, "release after a failed truncation");
                }
                Err(e)
            }
        }
    }

    /// Takes an open's reply: the file's state, shared by this client's opens of it,
    /// and a handle; first the cut of what a vanished writer left, if the server asks.
    /// `writes`: the open was for writing, by `caller` (a resume names both).
    async fn opened(
        &self,
        reply: Opened,
        writes: bool,
        caller: Caller,
    ) -> Result<(Attr, FileHandle)> {
        let Opened {
            attr,
            session,
            layout,
            parent,
            cut_tail,
            grant,
            cut_grant,
        } = reply;
        self.data.grants.put(grant.clone(), session);
        if cut_tail {
            // On failure the session ends with the caller's error (the handle is not
            // made), and with it the duty: the next open is asked to cut.
            let cut = self.cut_tail(&attr, &layout, session, cut_grant).await;
            if let Err(e) = &cut {
                tracing::warn!(ino = %attr.ino, error = %e, "cutting what a vanished writer left failed");
                self.release_unmade(session).await;
            }
            cut?;
        }
        if let Some(parent) = parent {
            self.dir_attrs.put(parent.after);
        }
        let mut files = self.files.lock();
        let state = match files.get(&attr.ino).and_then(Weak::upgrade) {
            Some(st) => {
                st.opened(&attr);
                st
            }
            None => {
                let st = Arc::new(FileState::new(&attr, layout));
                files.insert(attr.ino, Arc::downgrade(&st));
                st
            }
        };
        if files.len() > 4096 {
            files.retain(|_, w| w.strong_count() > 0);
        }
        drop(files);
        if writes {
            // The server let a write open through: not immutable now (another mount
            // may have cleared what this one knew).
            state.set_immutable(false);
        }
        let mut attr = attr;
        state.overlay(&mut attr);
        let fh = FileHandle::new(state, session, &attr, self.config().atime);
        let open = fs::OpenSession {
            session,
            ino: attr.ino,
            writes,
            grant,
        };
        self.session_opened(open, caller);
        Ok((attr, fh))
    }

    /// An open or create, asked again while the server answers `Busy` (another client
    /// is cutting the file), for at most [`CUT_WAIT`].
    /// `caller` names whom the call is made for, if not the current request's.
    async fn meta_opening<R: MetaCall>(&self, req: R, caller: Option<Caller>) -> Result<R::Reply> {
        let deadline = Instant::now() + CUT_WAIT;
        let caller = caller.unwrap_or_else(super::caller::current);
        loop {
            match self
                .meta_keeping_as(req.clone(), caller.clone())
                .await
                .map(|(r, _)| r)
            {
                Err(e) if e.code() == ErrorCode::Busy && Instant::now() < deadline => {
                    tokio::time::sleep(CUT_POLL).await;
                }
                reply => return reply,
            }
        }
    }

    /// Cuts the chunks of `attr`'s file at its length on every member of its chains
    /// (with the open's `grant` for the cut), then tells the server, which forgets the
    /// vanished writer.
    async fn cut_tail(
        &self,
        attr: &Attr,
        layout: &Layout,
        session: SessionId,
        grant: Option<Grant>,
    ) -> Result<()> {
        tracing::info!(ino = %attr.ino, size = attr.size, "cutting what a vanished writer left past the end");
        let (ino, size) = (attr.ino, attr.size);
        self.data
            .truncate_data(ino, layout, size, grant.as_ref())
            .await?;
        let req = fs::TailCut {
            ino: attr.ino,
            session,
        };
        self.meta(req).await.map(drop)
    }

    /// Ends a session that no file handle stands for (a brief open, or an open that
    /// failed after the server had started it).
    async fn release_unmade(&self, session: SessionId) {
        self.data.grants.ended(session);
        let req = fs::Release {
            session,
            commit: None,
        };
        if let Err(e) = self.meta(req).await {
            tracing::debug!(%session, error = %e, "release after a failed open");
        }
    }

    /// The layout of a regular file (`None` for other kinds): this client's open of it,
    /// or a brief open, which also cuts what a vanished writer left before the caller
    /// changes the length.
    pub(super) async fn layout_of(&self, ino: InodeId) -> Result<Option<Layout>> {
        // A file this client has open only for reading holds a read grant, which the
        // data servers refuse for the truncation: it takes a brief open for writing too.
        if let Some(st) = self
            .live_file(ino)
            .filter(|_| self.data.grants.writable(ino))
        {
            return Ok(Some(st.layout.clone()));
        }
        // Asked before a truncation, which needs write permission anyway (and which an
        // append-only file refuses, as this open without `O_APPEND` is).
        let req = fs::Open {
            ino,
            client: self.id,
            truncate: false,
            access: OpenAccess::Write,
            append: false,
        };
        let Opened {
            attr,
            session,
            layout,
            cut_tail: cut,
            grant,
            cut_grant,
            ..
        } = self.meta_opening(req, None).await?;
        self.data.grants.put(grant, session);
        let cut = match cut {
            true => self.cut_tail(&attr, &layout, session, cut_grant).await,
            false => Ok(()),
        };
        self.release_unmade(session).await;
        cut?;
        Ok((attr.kind == FileKind::Regular).then_some(layout))
    }
}
