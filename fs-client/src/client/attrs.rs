//! Attribute changes of the `Client`: `setattr` (with the commit of earlier writes and
//! the cut of a new size), the access time a read moves, and the setuid/setgid bits an
//! unprivileged write clears.

use super::{caller, Client};
use crate::cache::noxattrs::CAPABILITY;
use crate::config::AtimeMode;
use crate::error::Result;
use proto::meta::fs;
use proto::{Attr, ErrorCode, InodeId, Request, SetAttr};
use std::time::Duration;

impl Client {
    /// Changes attributes; a new size first cuts the chunks on the data servers.
    pub async fn setattr(&self, ino: InodeId, set: SetAttr) -> Result<Attr> {
        // Earlier writes are committed first, so that their mtime cannot later override
        // a time set here (`cp -a`, `touch -d` on an open file): in the same change when
        // nothing is cut (`tar x` sets the time, owner and mode of each file it wrote),
        // before the data servers cut the chunks otherwise.
        let live = self.live_file(ino);
        // Held to the end: no queued append is placed across a cut (`file/append.rs`).
        let mut _no_placement = None;
        let commit = match &live {
            Some(st) if set.size.is_none() => self.send_for_commit(st).await,
            Some(st) => {
                _no_placement = Some(self.hold_appends(st).await);
                self.commit_written(st).await?;
                None
            }
            None => None,
        };
        if let Some(size) = set.size {
            self.refuse_if_flagged(ino, "truncation").await?;
            if let Some(layout) = self.layout_of(ino).await? {
                self.data.truncate_data(ino, &layout, size, None).await?;
            }
            if let Some(st) = self.live_file(ino) {
                st.gate.changed().await;
                st.truncated(size);
            }
        }
        let generation = commit.as_ref().map(|(_, g)| *g);
        let req = fs::SetAttr {
            ino,
            set,
            commit: commit.map(|(c, _)| c),
        };
        // Without a cut it may be answered early (`tar x`'s `utime`, `chmod` and `chown`
        // of each file it wrote, with its commit); a cut waits for the log.
        let early = req.set.size.is_none();
        let (attr, since) = self.meta_early(req, early).await?;
        if let (Some(st), Some(generation)) = (&live, generation) {
            st.committed_with(generation, &attr);
        }
        // For the kernel's `getattr` before a `chown` that follows (see `dirattrs.rs`).
        self.keep_attr(attr.clone(), since);
        Ok(self.overlay(attr))
    }

    /// Reports a read of `ino` (file bytes or a directory listing) for its access time;
    /// the metadata server moves it as the mount's `atime` option says (nothing is sent
    /// with `noatime`). Best effort, as a lazily written atime is: a failure is logged,
    /// never returned.
    pub async fn accessed(&self, ino: InodeId) {
        let Some(strict) = self.atime_strictness() else {
            return;
        };
        // Best effort: not worth holding a read while the server is away.
        let req = Request::new(fs::Accessed { ino, strict }).with_caller(caller::current());
        if let Err(e) = self.meta_waiting(&req, Duration::ZERO).await {
            tracing::debug!(%ino, error = %e, "atime update failed");
        }
    }

    /// What a read asks of the access time: `None` moves none (a read-only key or
    /// mount, whose server would refuse it or which promised to change nothing, and
    /// `noatime`), else whether every read moves it (`strictatime`) or `relatime`'s
    /// rule decides.
    pub(crate) fn atime_strictness(&self) -> Option<bool> {
        if self.caps.read_only || self.config.read_only {
            return None;
        }
        match self.config().atime {
            AtimeMode::NoAtime => None,
            AtimeMode::RelAtime => Some(false),
            AtimeMode::StrictAtime => Some(true),
        }
    }

    /// Clears setuid, and setgid if group-exec is set, before an unprivileged process
    /// writes `ino`, as ext4's `file_remove_privs` does: otherwise anyone allowed to
    /// write a setuid-root program could change what it runs as root. A read and a
    /// conditional change: a chmod racing with the write may be undone, as it may be by
    /// the kernel's own getattr-then-setattr on the page cache path.
    pub async fn kill_suid(&self, ino: InodeId) -> Result<()> {
        self.kill_privs(ino, None).await
    }

    /// Whether `ino` is known, within the attribute TTL, to have no file capabilities
    /// (`security.capability`): a write then has none to remove.
    pub(crate) fn capability_known_absent(&self, ino: InodeId) -> bool {
        self.xattr_known_absent(ino, CAPABILITY)
    }

    /// Removes `ino`'s file capabilities before a write the kernel sends past its page
    /// cache (`O_DIRECT`, and this mount's `O_APPEND`): before a write through the page
    /// cache the kernel removes them itself (`file_remove_privs`, for any writer, root
    /// too), before a direct one it leaves it to the file system. A read (none when
    /// known absent), and a removal when there are some.
    pub async fn drop_capability(&self, ino: InodeId) -> Result<()> {
        let absent = |e: &crate::ClientError| e.code() == ErrorCode::NoData;
        match self.getxattr(ino, CAPABILITY).await {
            Ok(_) => match self.removexattr(ino, CAPABILITY).await {
                Err(e) if absent(&e) => Ok(()),
                r => r,
            },
            Err(e) if absent(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// [`Client::kill_suid`] for a writer whose groups are known (`groups`: its file
    /// system group and supplementary groups): setgid without group-exec goes too when
    /// the writer is not in the file's group, as Linux decides
    /// (`setattr_should_drop_sgid`).
    pub async fn kill_privs(&self, ino: InodeId, groups: Option<&[u32]>) -> Result<()> {
        let attr = self.getattr(ino).await?;
        let kill = privs_to_kill(attr.perm, attr.gid, groups);
        if kill == 0 {
            return Ok(());
        }
        let set = SetAttr {
            perm: Some(attr.perm & !kill),
            ..SetAttr::default()
        };
        self.setattr(ino, set).await.map(drop)
    }
}

/// The setuid and setgid bits an unprivileged change of a file's data clears, for a
/// file with permission bits `perm` and group `gid`: setuid always; setgid when
/// group-exec is set (it then marks a set-group-id program, not mandatory locking), or
/// when the writer, whose groups are `groups` if known, is not in the file's group.
fn privs_to_kill(perm: u32, gid: u32, groups: Option<&[u32]>) -> u32 {
    const S_ISUID: u32 = 0o4000;
    const S_ISGID: u32 = 0o2000;
    const S_IXGRP: u32 = 0o0010;
    let mut kill = perm & S_ISUID;
    if perm & S_ISGID != 0 && (perm & S_IXGRP != 0 || groups.is_some_and(|g| !g.contains(&gid))) {
        kill |= S_ISGID;
    }
    kill
}

#[cfg(test)]
mod tests {
    use super::privs_to_kill;

    #[test]
    fn setgid_without_group_exec_goes_only_for_a_writer_outside_the_group() {
        assert_eq!(privs_to_kill(0o6755, 7, None), 0o6000);
        assert_eq!(privs_to_kill(0o6745, 7, None), 0o4000);
        assert_eq!(privs_to_kill(0o2745, 7, Some(&[7, 8])), 0);
        assert_eq!(privs_to_kill(0o2745, 7, Some(&[8])), 0o2000);
        assert_eq!(privs_to_kill(0o0777, 7, Some(&[8])), 0);
    }
}
