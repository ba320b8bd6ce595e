//! `fuser::Filesystem` for [`TesseraFs`]: every callback hands its work to
//! `TesseraFs::spawn`, which replies once it is done; the data callbacks (read, write,
//! flush, release) are in `io.rs`.

use super::attr::{file_type, fuse_attr, kind_of_mode};
use super::replies::{
    dot_attr, finish, ino, lock_spec, lock_type, open_access, opened_with, time_set,
    unprivileged_groups, xattr_reply,
};
use super::{errno, is_stats_xattr, Freshness, TesseraFs};
use crate::client::LockHow;
use crate::config::AtimeMode;
use crate::error::ClientError;
use fuser::{
    AccessFlags, Errno, FileHandle as Fh, FopenFlags, Generation, INodeNo, IoctlFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLock, ReplyLseek,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use proto::meta::{LockKind, RenameMode, XattrMode};
use proto::{ErrorCode, FileKind, InodeId, SetAttr};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

impl fuser::Filesystem for TesseraFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let io = self.inner.blksize;
        // Ask for 1 MiB (the buffer size) reads and writes; the kernel may grant less.
        let _ = config.set_max_write(io);
        let _ = config.set_max_readahead(io);
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        use fuser::InitFlags as F;
        // POSIX and flock locks come to us, so that they hold across mounts.
        let caps = [
            F::FUSE_PARALLEL_DIROPS,
            // The page cache is dropped by this mount when another one changed the
            // file (`Inner::revalidate`), not by the kernel at every mtime change.
            F::FUSE_EXPLICIT_INVAL_DATA,
            F::FUSE_CACHE_SYMLINKS,
            F::FUSE_POSIX_LOCKS,
            F::FUSE_FLOCK_LOCKS,
            // Every listing with attributes (see "Directory listings" in
            // ARCHITECTURE.md).
            F::FUSE_DO_READDIRPLUS,
            // Shared mappings of files opened with FOPEN_DIRECT_IO (O_DIRECT, O_APPEND:
            // `Inner::direct_open`); the kernel (6.6+) writes back and drops the
            // mapped pages a direct read or write covers, so they stay coherent.
            F::FUSE_DIRECT_IO_ALLOW_MMAP,
            // File handles that outlive the kernel's cache and a remount: the kernel
            // looks up "." in the inode a handle names and ".." in a directory
            // (`Client::lookup`). Node ids are inode numbers, never reused.
            F::FUSE_EXPORT_SUPPORT,
        ];
        for cap in caps {
            let _ = config.add_capabilities(cap);
        }
        if self.inner.client.config().acl {
            // The kernel checks access with each file's ACL (fetched with `getxattr`,
            // dropped at each refresh of the file's attributes), and sends modes
            // unmasked, with the umask beside them: the metadata server applies a
            // directory's default ACL, or the umask where there is none. Without
            // `FUSE_DONT_MASK` the modes come masked, and a default ACL then applies
            // to the masked bits (stricter than Linux).
            for cap in [F::FUSE_POSIX_ACL, F::FUSE_DONT_MASK] {
                if config.add_capabilities(cap).is_err() {
                    tracing::warn!(?cap, "the kernel refused a capability POSIX ACLs need");
                }
            }
        }
        if self.inner.client.config().writeback_cache {
            if config.add_capabilities(F::FUSE_WRITEBACK_CACHE).is_ok() {
                self.inner.set_writeback();
            } else {
                tracing::warn!("the kernel refused the writeback cache; writes go through");
            }
        }
        Ok(())
    }

    fn destroy(&mut self) {
        self.forget_mount();
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        // The lookup before each create in a directory this mount made or listed:
        // answered here, with no hand-off to a task. Not cached by the kernel (no
        // negative entry), as a miss the server answers is not.
        if self
            .inner
            .client
            .name_known_absent(ino(parent), name.as_bytes())
        {
            return reply.error(errno(ErrorCode::NotFound));
        }
        // A name ahead of a walk in name order, in a page (`cache/scans.rs`): here too.
        if let Some((mut a, age)) = self.inner.client.lookup_kept(ino(parent), name.as_bytes()) {
            if Some(a.ino) == self.inner.client.subdir_root() {
                a.ino = InodeId::ROOT;
            }
            self.inner.shown.note(ino(parent), name.as_bytes(), &a, age);
            if self.inner.note_seen_unless_writing(&a) != Freshness::Changed {
                return self.inner.aged_entry(reply, Ok(a), age);
            }
            let inner = self.inner.clone();
            return self.spawn(req, async move {
                inner.changed(&a).await;
                inner.aged_entry(reply, Ok(a), age)
            });
        }
        let (inner, name) = (self.inner.clone(), name.as_bytes().to_vec());
        self.spawn(req, async move {
            let r = inner.client.lookup_aged(ino(parent), &name).await;
            let age = r.as_ref().map_or(Duration::ZERO, |(_, age)| *age);
            let mut r = r.map(|(a, _)| a);
            if let Ok(a) = &mut r {
                // `..` of a top-level directory of a subdirectory mount (the kernel's
                // export operations ask it): the kernel knows that directory as the root.
                if Some(a.ino) == inner.client.subdir_root() {
                    a.ino = InodeId::ROOT;
                }
                inner.shown.note(ino(parent), &name, a, age);
                inner.revalidate(a).await;
            }
            inner.aged_entry(reply, r, age)
        });
    }

    fn getattr(&self, req: &Request, i: INodeNo, _fh: Option<Fh>, reply: ReplyAttr) {
        // Answered here when a create, unlink or commit brought them (`dirattrs.rs`):
        // no task, no hand-off to another thread.
        if let Some(a) = self.inner.client.take_kept_attr(ino(i)) {
            self.inner.note_own(&a);
            return self.inner.attr(reply, Ok(a));
        }
        let inner = self.inner.clone();
        self.spawn(req, async move {
            let r = match inner.client.getattr(ino(i)).await {
                Err(e) if e.code() == ErrorCode::NotFound => {
                    inner.removed_dir_attr(ino(i)).ok_or(e)
                }
                r => r,
            };
            if let Ok(a) = &r {
                inner.revalidate(a).await;
            }
            inner.attr(reply, r)
        });
    }

    fn setattr(
        &self,
        req: &Request,
        i: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<Fh>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            perm: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
        };
        // A new mtime or length is this mount's own change (`utime` after `tar x`
        // wrote the file); a chmod or chown shows the file as the server has it.
        let own = set.mtime.is_some() || set.size.is_some();
        let inner = self.inner.clone();
        self.spawn(req, async move {
            let r = inner.client.setattr(ino(i), set).await;
            match &r {
                Ok(a) if own => inner.note_own(a),
                Ok(a) => inner.revalidate(a).await,
                Err(_) => {}
            }
            inner.attr(reply, r)
        });
    }

    fn readlink(&self, req: &Request, i: INodeNo, reply: ReplyData) {
        let inner = self.inner.clone();
        self.spawn(req, async move {
            let r = inner.client.readlink(ino(i)).await;
            finish(reply, r, |reply, t| reply.data(&t))
        });
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let (inner, name, who) = (
            self.inner.clone(),
            name.as_bytes().to_vec(),
            self.callers.of(req).with_umask(umask),
        );
        // Unmasked (`FUSE_DONT_MASK`): the server takes the umask away, or applies the
        // directory's default ACL instead.
        let perm = mode & 0o7777;
        self.spawn(req, async move {
            let c = &inner.client;
            let r = match kind_of_mode(mode) {
                Some(FileKind::Regular) => {
                    match c.create(ino(parent), &name, perm, who, true, false).await {
                        Ok((attr, fh)) => c.release(&fh).await.map(|_| attr),
                        Err(e) => Err(e),
                    }
                }
                Some(kind) if kind != FileKind::Directory && kind != FileKind::Symlink => {
                    c.mknod(ino(parent), &name, kind, perm, rdev, who).await
                }
                _ => Err(ClientError::Invalid(format!("mknod of mode {mode:o}"))),
            };
            if let Ok(a) = &r {
                inner.shown.note(ino(parent), &name, a, Duration::ZERO);
            }
            inner.entry(reply, r)
        });
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let (inner, name, who) = (
            self.inner.clone(),
            name.as_bytes().to_vec(),
            self.callers.of(req).with_umask(umask),
        );
        // Unmasked (`FUSE_DONT_MASK`): the server takes the umask away, or applies the
        // directory's default ACL instead.
        let perm = mode & 0o7777;
        self.spawn(req, async move {
            let r = inner.client.mkdir(ino(parent), &name, perm, who).await;
            inner.entry(reply, r)
        });
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if self
            .inner
            .unlink_at_once(ino(parent), name.as_bytes(), self.callers.of(req))
        {
            return reply.ok();
        }
        let (inner, name) = (self.inner.clone(), name.as_bytes().to_vec());
        self.spawn(req, async move {
            let r = inner.client.unlink(ino(parent), &name).await;
            if let Ok(done) = &r {
                if done.nlink == 0 && inner.has_open(done.ino) {
                    inner.unlinked_here(done.ino);
                }
            }
            finish(reply, r, |reply, _| reply.ok())
        });
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (inner, name) = (self.inner.clone(), name.as_bytes().to_vec());
        self.spawn(req, async move {
            let r = inner.client.rmdir(ino(parent), &name).await;
            finish(reply, r, |reply, ()| reply.ok())
        });
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let inner = self.inner.clone();
        let (name, target) = (
            link_name.as_bytes().to_vec(),
            target.as_os_str().as_bytes().to_vec(),
        );
        let who = self.callers.of(req);
        self.spawn(req, async move {
            let r = inner.client.symlink(ino(parent), &name, &target, who).await;
            if let Ok(a) = &r {
                inner.shown.note(ino(parent), &name, a, Duration::ZERO);
            }
            inner.entry(reply, r)
        });
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let Some(mode) = rename_mode(flags) else {
            return reply.error(Errno::EINVAL);
        };
        let inner = self.inner.clone();
        let (name, newname) = (name.as_bytes().to_vec(), newname.as_bytes().to_vec());
        inner.shown.forget(ino(parent), &name);
        inner.shown.forget(ino(newparent), &newname);
        self.spawn(req, async move {
            let r = inner
                .client
                .rename(ino(parent), &name, ino(newparent), &newname, mode)
                .await;
            finish(reply, r, |reply, ()| reply.ok())
        });
    }

    fn link(
        &self,
        req: &Request,
        i: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let (inner, name) = (self.inner.clone(), newname.as_bytes().to_vec());
        self.spawn(req, async move {
            let r = inner.client.link(ino(i), ino(newparent), &name, true).await;
            if let Ok(a) = &r {
                inner.linked_or_closed(ino(i), true);
                inner.shown.note(ino(newparent), &name, a, Duration::ZERO);
            }
            inner.entry(reply, r)
        });
    }

    fn open(&self, req: &Request, i: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let inner = self.inner.clone();
        let truncate = flags.0 & libc::O_TRUNC != 0;
        let direct = inner.direct_open(flags.0);
        self.spawn(req, async move {
            let since = inner.client.attr_epoch();
            // A file whose last name this mount removed while holding it open, or made
            // without one (`O_TMPFILE`), has no name in this kernel: the open came
            // through a descriptor (`/proc/self/fd`). Any other came through a name,
            // which may be kept from before another mount removed the file, and would
            // reach a file no name leads to (another open keeps it, or this mount's own
            // batched release): `open_named` answers it Stale (ESTALE).
            let by_name = !inner.was_unlinked_here(ino(i));
            let append = flags.0 & libc::O_APPEND != 0;
            let how = (open_access(flags.0), truncate, append);
            let r = inner.client.open_named(ino(i), how, by_name).await;
            let mut skipped = false;
            if let Ok((_, fh)) = &r {
                skipped = opened_with(fh, flags.0).await;
            }
            // An `O_NOATIME` open of a file whose access time is due reads past the page
            // cache: pages it left there would answer the next open's first read, which
            // must move the access time, without reaching the mount.
            let reads = flags.0 & libc::O_ACCMODE != libc::O_WRONLY;
            let moves = inner.client.atime_strictness().is_some();
            let direct = direct || (skipped && reads && moves && !inner.writeback_on());
            finish(reply, r, |reply, (attr, fh)| {
                let mut fopen = FopenFlags::empty();
                // With `strictatime` the kernel's cached pages go at every open, so that
                // the open's first read reaches the mount and moves the access time.
                let strict = inner.client.config().atime == AtimeMode::StrictAtime;
                let since = (!truncate).then_some(since);
                if inner.freshness(&attr, since) == Freshness::Same && !strict {
                    fopen |= FopenFlags::FOPEN_KEEP_CACHE;
                }
                if direct {
                    fopen |= FopenFlags::FOPEN_DIRECT_IO;
                }
                reply.opened(Fh(inner.add_file(fh, direct)), fopen)
            })
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let (inner, name, who) = (
            self.inner.clone(),
            name.as_bytes().to_vec(),
            self.callers.of(req).with_umask(umask),
        );
        // Unmasked (`FUSE_DONT_MASK`): the server takes the umask away, or applies the
        // directory's default ACL instead.
        let perm = mode & 0o7777;
        let exclusive = flags & libc::O_EXCL != 0;
        let truncate = flags & libc::O_TRUNC != 0;
        let direct = inner.direct_open(flags);
        self.spawn(req, async move {
            let (c, access) = (&inner.client, open_access(flags));
            let r = if name == TMPFILE_NAME {
                // `O_TMPFILE`, which `O_EXCL` makes never linkable.
                let how = (!exclusive, access);
                let r = c.tmpfile_for(ino(parent), perm, who, how).await;
                if let Ok((attr, _)) = &r {
                    inner.unlinked_here(attr.ino);
                }
                r
            } else {
                let how = (exclusive, truncate, access, flags & libc::O_APPEND != 0);
                c.create_for(ino(parent), &name, perm, who, how).await
            };
            if let Ok((_, fh)) = &r {
                opened_with(fh, flags).await;
            }
            finish(reply, r, |reply, (attr, fh)| {
                if name != TMPFILE_NAME {
                    inner.shown.note(ino(parent), &name, &attr, Duration::ZERO);
                }
                inner.note_created(&attr);
                let n = inner.add_file(fh, direct);
                let mut fopen = FopenFlags::empty();
                if direct {
                    fopen |= FopenFlags::FOPEN_DIRECT_IO;
                }
                let (ttl, blk) = (inner.entry_ttl, inner.blksize);
                reply.created(&ttl, &fuse_attr(&attr, blk), Generation(0), Fh(n), fopen)
            })
        });
    }

    fn read(
        &self,
        req: &Request,
        _i: INodeNo,
        fh: Fh,
        offset: u64,
        size: u32,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.read_op(req, fh, offset, size, flags, reply)
    }

    fn write(
        &self,
        req: &Request,
        _i: INodeNo,
        fh: Fh,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.write_op(req, fh, offset, data, write_flags, flags, reply)
    }

    fn flush(&self, req: &Request, i: INodeNo, fh: Fh, owner: LockOwner, reply: ReplyEmpty) {
        self.flush_op(req, i, fh, owner, reply)
    }

    fn release(
        &self,
        req: &Request,
        i: INodeNo,
        fh: Fh,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.release_op(req, i, fh, lock_owner, reply)
    }

    fn fsync(&self, req: &Request, _i: INodeNo, fh: Fh, _datasync: bool, reply: ReplyEmpty) {
        let inner = self.inner.clone();
        self.spawn(req, async move {
            let r = match inner.file(fh.0) {
                Ok(file) => inner.flushed(&file, inner.client.fsync(&file).await),
                Err(e) => Err(e),
            };
            finish(reply, r, |reply, ()| reply.ok())
        });
    }

    fn opendir(&self, _req: &Request, i: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let n = self.inner.open_dir(ino(i));
        reply.opened(Fh(n), FopenFlags::empty());
    }

    fn readdir(&self, req: &Request, i: INodeNo, fh: Fh, offset: u64, reply: ReplyDirectory) {
        let inner = self.inner.clone();
        self.spawn(req, async move {
            // The reply buffer holds a few hundred names; ask for a page-sized slice.
            let Some(r) = inner.list(i, fh, offset, 256, false).await else {
                return reply.error(Errno::EBADF);
            };
            finish(reply, r, |mut reply, entries| {
                for e in entries {
                    let name = OsStr::from_bytes(&e.name);
                    if reply.add(INodeNo(e.ino.0), e.next_offset, file_type(e.kind), name) {
                        break;
                    }
                }
                reply.ok()
            });
        });
    }

    fn readdirplus(
        &self,
        req: &Request,
        i: INodeNo,
        fh: Fh,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        let inner = self.inner.clone();
        self.spawn(req, async move {
            // Entries with attributes are about three times larger: a smaller slice.
            let Some(r) = inner.list(i, fh, offset, 96, true).await else {
                return reply.error(Errno::EBADF);
            };
            if let Ok(entries) = &r {
                for e in entries {
                    if let Some(a) = &e.attr {
                        inner.shown.note(ino(i), &e.name, a, Duration::ZERO);
                        inner.note_dir(a);
                        inner.revalidate(a).await;
                    }
                }
            }
            let (ttl, blk) = (inner.entry_ttl, inner.blksize);
            finish(reply, r, |mut reply, entries| {
                for e in entries {
                    let name = OsStr::from_bytes(&e.name);
                    // "." and ".." carry no attributes; the kernel does not look at them.
                    let attr = e.attr.unwrap_or_else(|| dot_attr(e.ino, e.kind));
                    let full = reply.add(
                        INodeNo(e.ino.0),
                        e.next_offset,
                        name,
                        &ttl,
                        &fuse_attr(&attr, blk),
                        Generation(0),
                    );
                    if full {
                        break;
                    }
                }
                reply.ok()
            });
        });
    }

    fn releasedir(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: Fh,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.inner.dirs.lock().remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, req: &Request, i: INodeNo, _fh: Fh, _datasync: bool, reply: ReplyEmpty) {
        // Changes answered early (see `client::held`) are durable once settled; every
        // other change was durable before its reply. Unlinks answered before the server
        // had them are on their way until then; a refusal of one is reported here.
        let inner = self.inner.clone();
        self.spawn(req, async move {
            // Not in `settle`, which a removal on its way may itself wait for (its
            // place in the window of changes kept).
            inner.client.removes_sent().await;
            let r = match inner.client.settle().await {
                Ok(()) => inner.client.take_remove_failure(ino(i)).map_or(Ok(()), Err),
                Err(e) => Err(e),
            };
            finish(reply, r, |reply, ()| reply.ok())
        });
    }

    fn statfs(&self, req: &Request, _i: INodeNo, reply: ReplyStatfs) {
        let inner = self.inner.clone();
        self.spawn(req, async move {
            let r = inner.client.statfs().await;
            finish(reply, r, |reply, s| {
                let bsize = 4096u64;
                let ffree = u64::from(u32::MAX).saturating_sub(s.files);
                reply.statfs(
                    s.total_bytes / bsize,
                    s.free_bytes / bsize,
                    s.free_bytes / bsize,
                    s.files + ffree,
                    ffree,
                    bsize as u32,
                    proto::MAX_NAME_BYTES as u32,
                    bsize as u32,
                )
            })
        });
    }

    fn setxattr(
        &self,
        req: &Request,
        i: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let Some(mode) = XattrMode::from_flags(flags) else {
            return reply.error(Errno::EINVAL);
        };
        if is_stats_xattr(ino(i), name.as_bytes()) {
            return reply.error(Errno::EPERM);
        }
        let inner = self.inner.clone();
        let (name, value) = (name.as_bytes().to_vec(), value.to_vec());
        self.spawn(req, async move {
            let r = inner.client.setxattr(ino(i), &name, &value, mode).await;
            finish(reply, r, |reply, ()| reply.ok())
        });
    }

    fn getxattr(&self, req: &Request, i: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if is_stats_xattr(ino(i), name.as_bytes()) {
            return xattr_reply(reply, size, self.inner.stats_text());
        }
        // The check before every write, `ls -l`'s label: answered here when the inode
        // is known to have none, with no hand-off to a task.
        if self
            .inner
            .client
            .xattr_known_absent(ino(i), name.as_bytes())
        {
            return reply.error(fuser::Errno::ENODATA);
        }
        let (inner, name) = (self.inner.clone(), name.as_bytes().to_vec());
        self.spawn(req, async move {
            let r = inner.client.getxattr(ino(i), &name).await;
            finish(reply, r, |reply, v| xattr_reply(reply, size, v))
        });
    }

    fn listxattr(&self, req: &Request, i: INodeNo, size: u32, reply: ReplyXattr) {
        let inner = self.inner.clone();
        self.spawn(req, async move {
            let r = inner.client.listxattr(ino(i)).await;
            finish(reply, r, |reply, names| {
                let mut out = Vec::new();
                for n in names {
                    out.extend_from_slice(&n);
                    out.push(0);
                }
                xattr_reply(reply, size, out)
            })
        });
    }

    fn removexattr(&self, req: &Request, i: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if is_stats_xattr(ino(i), name.as_bytes()) {
            return reply.error(Errno::EPERM);
        }
        let (inner, name) = (self.inner.clone(), name.as_bytes().to_vec());
        self.spawn(req, async move {
            let r = inner.client.removexattr(ino(i), &name).await;
            finish(reply, r, |reply, ()| reply.ok())
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn ioctl(
        &self,
        req: &Request,
        i: INodeNo,
        _fh: Fh,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        self.ioctl_op(req, i, cmd, in_data, reply)
    }

    fn poll(
        &self,
        _req: &Request,
        _i: INodeNo,
        _fh: Fh,
        _ph: fuser::PollNotifier,
        _events: fuser::PollEvents,
        _flags: fuser::PollFlags,
        reply: fuser::ReplyPoll,
    ) {
        // ENOSYS, quietly (fuser's default logs a warning): the kernel stops asking and
        // answers "always ready" itself, which is right for regular files.
        reply.error(Errno::ENOSYS);
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: Fh,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: Fh,
        _offset_out: u64,
        _len: u64,
        _flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        // ENOSYS, quietly: the kernel stops asking and copies through reads and writes
        // of the mount (no server-side copy yet).
        reply.error(Errno::ENOSYS);
    }

    fn fallocate(
        &self,
        req: &Request,
        _i: INodeNo,
        fh: Fh,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let inner = self.inner.clone();
        // The kernel clears setuid/setgid before writes, but not before an fallocate.
        let groups = unprivileged_groups(req);
        self.spawn(req, async move {
            let r = match inner.file(fh.0) {
                Ok(file) => {
                    let mut r = inner.client.fallocate(&file, offset, length, mode).await;
                    if let (Ok(()), Some(g)) = (&r, &groups) {
                        r = inner.client.kill_privs(file.ino(), Some(g)).await;
                    }
                    let zeroed = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
                    if r.is_ok() && mode & zeroed != 0 {
                        inner.drop_pages(file.ino(), offset, length).await;
                    }
                    r
                }
                Err(e) => Err(e),
            };
            finish(reply, r, |reply, ()| reply.ok())
        });
    }

    fn lseek(
        &self,
        req: &Request,
        _i: INodeNo,
        fh: Fh,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.lseek_op(req, fh, offset, whence, reply)
    }

    fn getlk(
        &self,
        req: &Request,
        i: INodeNo,
        _fh: Fh,
        owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        let Some(lock) = lock_spec(owner, start, end, typ, pid) else {
            return reply.error(Errno::EINVAL);
        };
        let inner = self.inner.clone();
        self.spawn(req, async move {
            inner.releases.settled(ino(i)).await;
            let r = inner.client.getlk(ino(i), lock).await;
            finish(reply, r, |reply, held| match held {
                Some(h) => reply.locked(h.start, h.end, lock_type(h.kind), h.pid),
                None => reply.locked(start, end, libc::F_UNLCK, 0),
            })
        });
    }

    fn setlk(
        &self,
        req: &Request,
        i: INodeNo,
        fh: Fh,
        owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        flock: bool,
        reply: ReplyEmpty,
    ) {
        let how = LockHow { wait: sleep, flock };
        let Some(lock) = lock_spec(owner, start, end, typ, pid) else {
            return reply.error(Errno::EINVAL);
        };
        let inner = self.inner.clone();
        self.spawn(req, async move {
            inner.releases.settled(ino(i)).await;
            if lock.kind != LockKind::Unlock {
                inner.locked.lock().insert(ino(i));
                let mut owners = inner.lock_owners.lock();
                owners.entry(fh.0).or_default().insert(lock.owner);
            }
            let r = inner.client.setlk(ino(i), lock, how).await;
            if r.is_ok() && lock.kind != LockKind::Unlock {
                inner.fresh_under_lock(ino(i)).await;
            }
            finish(reply, r, |reply, ()| reply.ok())
        });
    }

    fn access(&self, _req: &Request, _i: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // With default_permissions the kernel checks access itself.
        reply.ok();
    }
}

/// The name a create carries when it is the kernel's `FUSE_TMPFILE` (`O_TMPFILE`), which
/// the patched fuser hands to `create` (vendor/fuser/TESSERA.md): the kernel names an
/// unnamed file's dentry "/", which no entry can be named.
const TMPFILE_NAME: &[u8] = b"/";

/// The rename `renameat2`'s flags ask for; `None` for a combination it refuses (the
/// kernel already refuses `RENAME_EXCHANGE` with either other flag).
fn rename_mode(flags: RenameFlags) -> Option<RenameMode> {
    const NOREPLACE: RenameFlags = RenameFlags::RENAME_NOREPLACE;
    const WHITEOUT: RenameFlags = RenameFlags::RENAME_WHITEOUT;
    Some(match flags {
        f if f.is_empty() => RenameMode::Replace,
        RenameFlags::RENAME_EXCHANGE => RenameMode::Exchange,
        NOREPLACE => RenameMode::NoReplace,
        WHITEOUT => RenameMode::Whiteout,
        f if f == NOREPLACE | WHITEOUT => RenameMode::WhiteoutNoReplace,
        _ => return None,
    })
}
