//! The data callbacks of [`TesseraFs`] (read, write, lseek, flush, release): the
//! `fuser::Filesystem` impl in `ops.rs` hands them here, where each answers at once
//! when it can (a write that fits the buffers, a close with nothing to send) and
//! spawns its work otherwise.

use super::replies::{finish, ino};
use super::{errno_of, TesseraFs};
use crate::file::Seek;
use fuser::{
    Errno, FileHandle as Fh, INodeNo, LockOwner, OpenFlags, ReplyData, ReplyEmpty, ReplyLseek,
    ReplyWrite, Request, WriteFlags,
};
use tracing::debug;

impl TesseraFs {
    pub(super) fn read_op(
        &self,
        req: &Request,
        fh: Fh,
        offset: u64,
        size: u32,
        flags: OpenFlags,
        reply: ReplyData,
    ) {
        // An O_DIRECT reader asks for these bytes and keeps no page cache: reading a
        // block around them (up to 256 KiB for a 4 KiB read) and storing it in the
        // kernel's cache would only cost time, moved bytes and memory.
        let around = flags.0 & libc::O_DIRECT == 0;
        let inner = self.inner.clone();
        self.spawn(req, async move {
            let file = match inner.file(fh.0) {
                Ok(f) => f,
                Err(e) => return reply.error(errno_of(&e)),
            };
            let r = inner
                .client
                .read_buf_with(&file, offset, size as usize, around)
                .await;
            finish(reply, r, |reply, buf| {
                buf.with(|b| reply.data(b));
                // After the answer, so that the reader does not wait for it.
                buf.with_block(|start, block, stamp| {
                    inner.store_around(&file, start, block, stamp)
                });
            })
        });
    }

    // The kernel's write as fuser hands it, less what it does not use.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn write_op(
        &self,
        req: &Request,
        fh: Fh,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        reply: ReplyWrite,
    ) {
        let append = self.inner.server_append(flags.0);
        // Written past the page cache (`FOPEN_DIRECT_IO`): cached pages of the range
        // that other handles read are dropped after it. An append is queued and placed
        // later (`file/append.rs`): the pages from the end this mount knew are dropped
        // when a write starts a new batch, and any read of this mount places the queue
        // before it reads, so no page it caches again misses an append.
        // With the writeback cache the kernel does that itself (`Inner::direct_open`).
        let direct = flags.0 & libc::O_DIRECT != 0 && !self.inner.writeback_on();
        // The kernel clears setuid/setgid itself before writes through the page cache,
        // but leaves it to us for direct I/O (O_DIRECT and, here, O_APPEND files) by an
        // unprivileged writer.
        let kill_suid = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        // File capabilities likewise, for any writer: past the page cache they are ours
        // to remove (`Client::drop_capability`), unless known absent.
        let past_cache = append || direct || self.inner.direct_io(fh.0);
        let file = self.inner.file(fh.0);
        // A write-back of pages dirtied before the file became immutable goes through.
        if !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE) {
            if let Err(e) = file.as_ref().map_or(Ok(()), |f| f.state.check_mutable()) {
                return finish(reply, Err(e), |reply, n: usize| reply.written(n as u32));
            }
        }
        let drop_caps = past_cache
            && file
                .as_ref()
                .is_ok_and(|f| !self.inner.client.capability_known_absent(f.ino()));
        if !kill_suid && !direct && !drop_caps {
            // Most writes fit the buffers (or the append queue) at once: answer here,
            // sparing a copy and a task.
            if let Ok(file) = file {
                let client = &self.inner.client;
                let now = if append {
                    client.try_append_now(&file, data)
                } else {
                    client.try_write_now(&file, offset, data)
                };
                if let Some(r) = now {
                    return finish(reply, r, |reply, n| reply.written(n as u32));
                }
            }
        }
        let (inner, data) = (self.inner.clone(), data.to_vec());
        self.spawn(req, async move {
            let file = async {
                let file = inner.file(fh.0)?;
                if kill_suid {
                    inner.client.kill_suid(file.ino()).await?;
                }
                if drop_caps {
                    inner.client.drop_capability(file.ino()).await?;
                }
                Ok(file)
            }
            .await;
            let r = match file {
                Ok(file) => {
                    // The range whose cached pages are stale (length 0: to the end).
                    let r = if append {
                        let n = data.len();
                        let r = inner.client.append_queued(&file, &data).await;
                        r.map(|stale| (stale.map(|from| (from, 0)), n))
                    } else {
                        let r = inner.client.write(&file, offset, &data).await;
                        r.map(|n| (direct.then_some((offset, n as u64)), n))
                    };
                    if let Ok((Some((at, len)), _)) = &r {
                        if inner.direct_io(fh.0) {
                            inner.drop_pages(file.ino(), *at, *len).await;
                        } else {
                            // O_APPEND or O_DIRECT set after the open (fcntl): the
                            // kernel holds the written pages locked until this reply.
                            inner.drop_pages_later(file.ino(), *at, *len);
                        }
                    }
                    r
                }
                Err(e) => Err(e),
            };
            finish(reply, r, |reply, (_, n)| reply.written(n as u32))
        });
    }

    /// The kernel asks only for `SEEK_DATA` and `SEEK_HOLE` (it answers the other
    /// whences itself), without writing its dirty pages back first. With the writeback
    /// cache those pages hold writes the mount has not seen, so the answer would skip
    /// them: ENOSYS then makes the kernel answer every later one itself (all data, a
    /// hole at its own end of the file), which is always right.
    pub(super) fn lseek_op(
        &self,
        req: &Request,
        fh: Fh,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        if self.inner.writeback_on() {
            return reply.error(Errno::ENOSYS);
        }
        let what = match whence {
            libc::SEEK_DATA => Seek::Data,
            libc::SEEK_HOLE => Seek::Hole,
            _ => return reply.error(Errno::EINVAL),
        };
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(Errno::ENXIO);
        };
        let inner = self.inner.clone();
        self.spawn(req, async move {
            let r = match inner.file(fh.0) {
                Ok(file) => inner.client.seek(&file, offset, what).await,
                Err(e) => Err(e),
            };
            finish(reply, r, |reply, at| match i64::try_from(at) {
                Ok(at) => reply.offset(at),
                // A length past what `lseek` can return (only a server's error).
                Err(_) => reply.error(Errno::EOVERFLOW),
            })
        });
    }

    pub(super) fn flush_op(
        &self,
        req: &Request,
        i: INodeNo,
        fh: Fh,
        owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing to send and no lock ever taken on the file through this mount: answer
        // here (every close of a file read, or created and left empty).
        if !self.inner.locked.lock().contains(&ino(i)) {
            if let Ok(file) = self.inner.file(fh.0) {
                if file.settled() {
                    self.inner.forget_lock_owner(fh.0, owner.0);
                    return reply.ok();
                }
            }
        }
        let inner = self.inner.clone();
        self.spawn(req, async move {
            // Closing any descriptor drops the process's POSIX locks on the file.
            inner.forget_lock_owner(fh.0, owner.0);
            if let Err(e) = inner.unlock_owner(ino(i), owner.0).await {
                return reply.error(errno_of(&e));
            }
            let r = match inner.file(fh.0) {
                Ok(file) => inner.flushed(&file, inner.client.flush(&file).await),
                Err(e) => Err(e),
            };
            finish(reply, r, |reply, ()| reply.ok())
        });
    }

    pub(super) fn release_op(
        &self,
        req: &Request,
        i: INodeNo,
        fh: Fh,
        lock_owner: Option<LockOwner>,
        reply: ReplyEmpty,
    ) {
        // No lock ever taken on the file through this mount and nothing to send or
        // commit: the session ends in the next batch (`Client::release_later`), and the
        // answer goes from here.
        if !self.inner.locked.lock().contains(&ino(i)) {
            if let Some(file) = self.inner.file(fh.0).ok().filter(|f| f.settled()) {
                self.inner.lock_owners.lock().remove(&fh.0);
                self.inner.files.lock().remove(&fh.0);
                self.inner.client.release_later(file.session);
                drop(file);
                self.inner.linked_or_closed(ino(i), false);
                return reply.ok();
            }
        }
        // Lock calls of this mount read after this release wait for it (see
        // `releases`): `close` returned before the kernel sent it.
        let releasing = self.inner.releases.start(ino(i));
        let inner = self.inner.clone();
        self.spawn(req, async move {
            // The last close of an open file drops its flock (the kernel names the owner)
            // and its OFD locks (the kernel does not: see `Inner::lock_owners`).
            let mut owners = inner.lock_owners.lock().remove(&fh.0).unwrap_or_default();
            owners.extend(lock_owner.map(|o| o.0));
            for owner in owners {
                if let Err(e) = inner.unlock_owner(ino(i), owner).await {
                    debug!(error = %e, "releasing flock and OFD locks failed");
                }
            }
            drop(releasing);
            let file = inner.files.lock().remove(&fh.0).map(|o| o.file);
            let r = match file {
                Some(file) => inner.client.release(&file).await,
                None => Ok(()),
            };
            inner.linked_or_closed(ino(i), false);
            finish(reply, r, |reply, ()| reply.ok())
        });
    }
}
