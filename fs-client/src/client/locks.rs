//! File locks (`fcntl`, `flock`, OFD) through the metadata server, and the record of
//! the locks this client holds: on a new metadata connection (a restarted server, or a
//! standby that took over) the client takes them back (`SetLock::reclaim`) after its
//! open files, within the server's lock grace, during which the server refuses every
//! other new lock. A lock the server gives to nobody else is thereby held across the
//! loss of the server by the owner that took it, as an open file is.

use super::{caller, Client};
use crate::error::{ClientError, Result};
use crate::rpc;
use proto::meta::{fs, LockKind, LockSpec};
use proto::{InodeId, Request};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How a lock call was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockHow {
    /// Waits out another owner's conflicting lock (`F_SETLKW`, `flock` without
    /// `LOCK_NB`); else fails at once, `WouldBlock` (EAGAIN). An `fcntl` wait whose
    /// lock's holder waits, directly or through others, for a lock of the caller fails
    /// with `Deadlock` (EDEADLK), as on Linux.
    pub wait: bool,
    /// A `flock(2)` lock: never refused as a deadlock (Linux finds none), and a
    /// conversion (shared to exclusive or back) that conflicts drops the owner's lock
    /// before it waits or fails, as on Linux (where two shared holders that both ask for
    /// exclusive do not wait for each other for good).
    pub flock: bool,
}

impl Client {
    /// Takes or releases a lock, as `how` says; a wait lasts for as long as process
    /// `pid` lives and has no signal pending.
    pub async fn setlk(&self, ino: InodeId, lock: LockSpec, how: LockHow) -> Result<()> {
        const FIRST_WAIT: Duration = Duration::from_millis(5);
        const LONGEST_WAIT: Duration = Duration::from_millis(200);
        if lock.kind == LockKind::Unlock {
            self.publish_before_unlock(ino).await;
        }
        let mut pause = FIRST_WAIT;
        let mut waits = how.wait && !how.flock;
        // The last ask after a signal is under way (see below).
        let mut last_ask = false;
        let mut dropped = false;
        loop {
            let req = fs::SetLock {
                ino,
                client: self.id,
                lock,
                reclaim: false,
                waits,
            };
            let sent_on = self.meta.made();
            match self.meta(req).await {
                Ok(_) => {
                    // Noted while no resume runs: a resume that took its list of locks
                    // before this note, on a connection made since this call was sent,
                    // may have missed this lock (its grant came from the server before),
                    // so it is taken back here.
                    let missed = {
                        let _no_resume = self.resume_lock.lock().await;
                        self.note_lock(ino, &lock);
                        self.resumed.load(Ordering::Acquire) > sent_on
                    };
                    if missed && lock.kind != LockKind::Unlock {
                        self.reclaim(ino, lock).await?;
                    }
                    return Ok(());
                }
                Err(e) if e.code() == proto::ErrorCode::WouldBlock => {
                    if how.flock && !dropped && lock.kind != LockKind::Unlock {
                        dropped = true;
                        self.drop_converted_flock(ino, lock).await?;
                    }
                    if !how.wait {
                        return Err(e);
                    }
                    if last_ask {
                        // The last ask after a signal was refused: it told the server
                        // that this owner waits no more.
                        return Err(interrupted(lock.pid));
                    }
                    // fuser does not pass FUSE_INTERRUPT on: look for a signal ourselves,
                    // or a waiter that was killed would hang in the kernel for good.
                    if signal_pending(lock.pid) {
                        if !waits {
                            return Err(interrupted(lock.pid));
                        }
                        // One last ask, not waiting: the server forgets the wait (or the
                        // lock is free by now, and taken, as if granted before the
                        // signal), so that no later wait of another owner is refused as a
                        // deadlock through this one.
                        waits = false;
                        last_ask = true;
                        continue;
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(LONGEST_WAIT);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Before a conflicting `flock` conversion waits or fails: the owner's lock on `ino`
    /// goes, if it holds one.
    async fn drop_converted_flock(&self, ino: InodeId, lock: LockSpec) -> Result<()> {
        let holds = self
            .held_locks
            .lock()
            .get(&ino)
            .is_some_and(|l| l.iter().any(|h| h.owner == lock.owner));
        if !holds {
            return Ok(());
        }
        self.publish_before_unlock(ino).await;
        let unlock = LockSpec {
            kind: LockKind::Unlock,
            start: 0,
            end: u64::MAX,
            ..lock
        };
        let req = fs::SetLock {
            ino,
            client: self.id,
            lock: unlock,
            reclaim: false,
            waits: false,
        };
        self.meta(req).await?;
        let _no_resume = self.resume_lock.lock().await;
        self.note_lock(ino, &unlock);
        Ok(())
    }

    /// The lock of another owner that would conflict with `lock`, if any (`F_GETLK`).
    pub async fn getlk(&self, ino: InodeId, lock: LockSpec) -> Result<Option<LockSpec>> {
        let req = fs::GetLock {
            ino,
            client: self.id,
            lock,
        };
        self.meta(req).await
    }

    /// Drops every lock the kernel's lock owner `owner` holds on `ino`.
    pub async fn release_locks(&self, ino: InodeId, owner: u64) -> Result<()> {
        // Forgotten first: whatever the answer, the owner wants none of them back.
        self.forget_locks(ino, owner);
        self.publish_before_unlock(ino).await;
        let req = fs::ReleaseLocks {
            ino,
            client: self.id,
            owner,
        };
        self.meta(req).await.map(drop)
    }

    /// Before a lock on `ino` is released: what this client appended and wrote to the
    /// file reaches the data servers and the length the metadata server keeps, so the
    /// next holder, on any mount, finds it (as an NFS client flushes before an unlock).
    /// Queued appends especially: they are answered before they are placed, and a
    /// writer that appends under a lock counts on the next holder seeing its records.
    /// A failure is left for the file's next fsync or close to report; the unlock goes
    /// on (a lock must never outlive its release).
    async fn publish_before_unlock(&self, ino: InodeId) {
        let Some(st) = self.open_file(ino) else {
            return;
        };
        if let Err(e) = self.commit_pending(&st).await {
            tracing::warn!(%ino, error = %e, "writes made under a lock were not committed before its release");
        }
    }

    /// Records a lock the server granted (or an unlock it applied), as the server's
    /// table holds it.
    fn note_lock(&self, ino: InodeId, lock: &LockSpec) {
        let mut held = self.held_locks.lock();
        let mine = held.remove(&ino).unwrap_or_default();
        let now =
            proto::meta::set_lock_range(mine, lock, |l| l.owner == lock.owner, |l| l, || *lock);
        if !now.is_empty() {
            held.insert(ino, now);
        }
    }

    /// Forgets the locks of `owner` on `ino`.
    fn forget_locks(&self, ino: InodeId, owner: u64) {
        let mut held = self.held_locks.lock();
        if let Some(locks) = held.get_mut(&ino) {
            locks.retain(|l| l.owner != owner);
            if locks.is_empty() {
                held.remove(&ino);
            }
        }
    }

    /// Takes back every lock this client holds, on a new metadata connection whose
    /// open files were resumed (their opens are what a lock needs). A lock the server
    /// refuses (another client took it while this one was away, past the server's lock
    /// grace) is lost: logged, and forgotten. Fails on a transport error (the caller
    /// tries again on the next connection).
    pub(super) async fn reclaim_locks(&self) -> Result<()> {
        let held: Vec<(InodeId, LockSpec)> = self
            .held_locks
            .lock()
            .iter()
            .flat_map(|(&ino, locks)| locks.iter().map(move |l| (ino, *l)))
            .collect();
        let (mut kept, mut lost) = (0, 0);
        for (ino, lock) in held {
            match self.reclaim(ino, lock).await? {
                true => kept += 1,
                false => lost += 1,
            }
        }
        if kept + lost > 0 {
            tracing::info!(kept, lost, "locks taken back on a new metadata connection");
        }
        Ok(())
    }

    /// Takes back one lock on the current metadata connection, without waiting for a
    /// server that is away (the caller's resume does that). `Ok(false)`: the server
    /// refused it, and it is forgotten (logged as lost).
    async fn reclaim(&self, ino: InodeId, lock: LockSpec) -> Result<bool> {
        let req = Request::new(fs::SetLock {
            ino,
            client: self.id,
            lock,
            reclaim: true,
            waits: false,
        })
        .with_caller(caller::current());
        match rpc::meta_call(&self.ep, &self.meta, &req).await {
            Ok(()) => Ok(true),
            Err(e @ ClientError::Transport(_)) => Err(e),
            Err(e) => {
                tracing::warn!(%ino, pid = lock.pid, start = lock.start, end = lock.end, error = %e,
                    "a lock held before the metadata connection was lost could not be taken back");
                let mut unlock = lock;
                unlock.kind = LockKind::Unlock;
                self.note_lock(ino, &unlock);
                Ok(false)
            }
        }
    }
}

/// A lock wait of process `pid` ended by a signal (EINTR).
fn interrupted(pid: u32) -> ClientError {
    ClientError::Interrupted(format!("pid {pid} got a signal while waiting for a lock"))
}

/// Whether process `pid` has a signal pending that it neither blocks nor ignores (or is
/// gone): a lock wait must then end with EINTR, as `F_SETLKW` does on a local file.
pub(super) fn signal_pending(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return true;
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0)
    };
    const SIGKILL_BIT: u64 = 1 << (libc::SIGKILL - 1);
    let pending = field("SigPnd:") | field("ShdPnd:");
    pending & SIGKILL_BIT != 0 || pending & !field("SigBlk:") & !field("SigIgn:") != 0
}
