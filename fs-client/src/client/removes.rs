//! Removes a mount answers before the metadata server has them (`defer_removes`).
//!
//! `rm -r`, a data-set cleanup, `git clean` or `tar` replacing a tree remove names one at
//! a time, each under its directory's lock: every unlink waited for its round trip, so
//! two processes removing in one directory went at the speed of one reply each. The
//! kernel has already decided such an unlink (its permission checks run on the mount,
//! `default_permissions`); what the server could still refuse the mount knows too: a
//! read-only key or mount, root squashed, flags on the file or its directory (held as an
//! extended attribute: an inode the client knows to have none has none). Such an unlink
//! is answered at once and sent at once; a task waits for its reply.
//!
//! Until the reply comes, no call of this client may see the server without it: a call
//! that names the removed name, its inode or its directory waits for it first
//! ([`fence_of`]: a lookup of that name, any call on that inode or directory, a create
//! there), and one whose reach is not named in it (rename, link, rmdir, a commit at a
//! close, `statfs`) waits for every removal on its way. A lookup of the name does not
//! take the answers the client keeps (`dirnames.rs`, `scans.rs`) before then either.
//! The kernel's `getattr` of the directory after each unlink is answered, while
//! removals there are on their way, from what it saw last with the times moved to now
//! (kept here, not in `dirattrs.rs`, whose copies any change forgets); once the last
//! of them is answered, from the newest attributes the server sent with them. A clock
//! ahead of the server's can make the directory's ctime go back then, by that much.
//!
//! At most [`MAX_DEFERRED`] are on their way, and an unlink waits for its reply while as
//! many changes the server answered early are kept (`client::held`): a burst of
//! removals would fill that window, and each further change wait for a `Settle`. That
//! bound is also what another mount may not see yet right after an `unlink` returned
//! here: at most 8 removals, each until the server has it (well under a millisecond on
//! loopback).
//!
//! A removal the server refuses after all (another client set a flag on the file or
//! changed the directory's permissions in between, or moved it out of a scoped key's
//! reach) is logged, counted and reported at the next `fsync` of the directory (as a
//! write-behind failure is at the file's); "no such name" only if a lookup then still
//! finds the same inode under the name. The file is then still there, and a lookup finds it again. `fsync` of the
//! directory and the unmount wait for every removal on its way (`sync` and `syncfs`
//! do not reach a FUSE daemon): it is durable
//! then, as an answered change is.

use crate::error::ClientError;
use parking_lot::Mutex;
use proto::meta::fs::{self, FsRequest};
use proto::{Attr, InodeId, WireError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// Removes on their way at most: past it, an unlink is sent and waited for as before.
/// Half of `proto::meta::MAX_EARLY`, the changes a server answers early per client.
pub(crate) const MAX_DEFERRED: usize = 8;
/// Directories with a refusal kept for their `fsync` at most; past it, a refusal is
/// only logged and counted.
const MAX_FAILED: usize = 4096;

/// Which removals on their way a call must wait for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fence<'a> {
    /// None: the call cannot see a removed name or inode.
    Free,
    /// The removal of this name in this directory.
    Name(InodeId, &'a [u8]),
    /// Any removal in this directory, or of this inode.
    Inode(InodeId),
    /// Every one.
    All,
}

/// What `req` must wait for. Unlinks wait for none: the deferred ones are sent while
/// on their way themselves, and [`super::Client::unlink`] waits for its directory.
pub(crate) fn fence_of(req: &FsRequest) -> Fence<'_> {
    use FsRequest as R;
    match req {
        R::Hello(_)
        | R::MyCaps(_)
        | R::Resume(_)
        | R::Regrant(_)
        | R::Settle(_)
        | R::ReleaseMany(_)
        | R::Unlink(_)
        | R::Release(fs::Release { commit: None, .. }) => Fence::Free,
        R::Lookup(fs::Lookup { parent, name }) => Fence::Name(*parent, name),
        R::GetAttr(fs::GetAttr { ino })
        | R::SetAttr(fs::SetAttr { ino, .. })
        | R::Readlink(fs::Readlink { ino })
        | R::ReadDir(fs::ReadDir { ino, .. })
        | R::Open(fs::Open { ino, .. })
        | R::Commit(fs::Commit { ino, .. })
        | R::TailCut(fs::TailCut { ino, .. })
        | R::GetXattr(fs::GetXattr { ino, .. })
        | R::SetXattr(fs::SetXattr { ino, .. })
        | R::ListXattr(fs::ListXattr { ino })
        | R::RemoveXattr(fs::RemoveXattr { ino, .. })
        | R::Append(fs::Append { ino, .. })
        | R::Accessed(fs::Accessed { ino, .. })
        | R::SetLock(fs::SetLock { ino, .. })
        | R::GetLock(fs::GetLock { ino, .. })
        | R::ReleaseLocks(fs::ReleaseLocks { ino, .. })
        | R::GetFlags(fs::GetFlags { ino })
        | R::SetFlags(fs::SetFlags { ino, .. }) => Fence::Inode(*ino),
        R::Create(fs::Create { parent, .. })
        | R::MkNod(fs::MkNod { parent, .. })
        | R::Mkdir(fs::Mkdir { parent, .. })
        | R::Symlink(fs::Symlink { parent, .. }) => Fence::Inode(*parent),
        // What they change or see is not all named in them (the inode a rename moves
        // over, a link's count, the free inodes): they wait for every removal. No `_`
        // arm, as in `proto::meta::effects`: a new request must be decided here.
        R::TmpFile(_)
        | R::Link(_)
        | R::Rmdir(_)
        | R::Rename(_)
        | R::StatFs(_)
        | R::LookupParent(_)
        | R::OpenAt(_)
        | R::Release(fs::Release {
            commit: Some(_), ..
        }) => Fence::All,
    }
}

/// Takes one from `key`'s count, dropping it at zero.
fn uncount<K, Q>(counts: &mut HashMap<K, u32>, key: &Q)
where
    K: std::borrow::Borrow<Q> + std::hash::Hash + Eq,
    Q: std::hash::Hash + Eq + ?Sized,
{
    if let Some(n) = counts.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            counts.remove(key);
        }
    }
}

/// What is shown of a directory while removals there are on their way.
struct Shown {
    /// Its attributes with the times of the latest removal.
    now: Attr,
    /// The newest the server sent with a reply meanwhile (by ctime).
    replied: Option<Attr>,
}

/// The removals on their way, by directory and name, and by inode.
#[derive(Default)]
struct Pending {
    dirs: HashMap<InodeId, HashMap<Vec<u8>, u32>>,
    inos: HashMap<InodeId, u32>,
    shown: HashMap<InodeId, Shown>,
    /// The first refusal per directory since its last `fsync`.
    failed: HashMap<InodeId, WireError>,
}

impl Pending {
    fn blocks(&self, fence: Fence<'_>) -> bool {
        match fence {
            Fence::Free => false,
            Fence::Name(dir, name) => self.dirs.get(&dir).is_some_and(|n| n.contains_key(name)),
            Fence::Inode(ino) => self.dirs.contains_key(&ino) || self.inos.contains_key(&ino),
            Fence::All => !self.inos.is_empty(),
        }
    }

    fn add(&mut self, dir: InodeId, name: &[u8], ino: InodeId) {
        *self
            .dirs
            .entry(dir)
            .or_default()
            .entry(name.to_vec())
            .or_default() += 1;
        *self.inos.entry(ino).or_default() += 1;
    }

    /// Ends a removal; the server's newest attributes of `dir` once it was the last
    /// there.
    fn remove(&mut self, dir: InodeId, name: &[u8], ino: InodeId) -> Option<Attr> {
        let mut last = None;
        if let Some(names) = self.dirs.get_mut(&dir) {
            uncount(names, name);
            if names.is_empty() {
                self.dirs.remove(&dir);
                last = self.shown.remove(&dir).and_then(|s| s.replied);
            }
        }
        uncount(&mut self.inos, &ino);
        last
    }

    /// Keeps `e` as `dir`'s first refusal since its last `fsync`; `false` if
    /// [`MAX_FAILED`] directories have one kept already.
    fn keep_failure(&mut self, dir: InodeId, e: WireError) -> bool {
        if self.failed.len() >= MAX_FAILED && !self.failed.contains_key(&dir) {
            return false;
        }
        self.failed.entry(dir).or_insert(e);
        true
    }

    /// Notes the server's attributes of `dir` from a reply, if newer than any before.
    fn replied(&mut self, dir: InodeId, attr: Attr) {
        if let Some(s) = self.shown.get_mut(&dir) {
            if s.replied.as_ref().is_none_or(|r| r.ctime < attr.ctime) {
                s.replied = Some(attr);
            }
        }
    }
}

/// The client's removals on their way (see the module's documentation).
pub(crate) struct Removes {
    pending: Mutex<Pending>,
    /// How many are on their way: read without the lock by every call.
    count: AtomicUsize,
    /// Woken at every reply.
    changed: Notify,
    slots: Arc<Semaphore>,
}

impl Default for Removes {
    fn default() -> Self {
        Removes {
            pending: Mutex::new(Pending::default()),
            count: AtomicUsize::new(0),
            changed: Notify::new(),
            slots: Arc::new(Semaphore::new(MAX_DEFERRED)),
        }
    }
}

/// A removal on its way: ends it when dropped, also if its task panicked, so that no
/// call waits for it forever.
pub(crate) struct OnItsWay {
    removes: Arc<Removes>,
    dir: InodeId,
    name: Vec<u8>,
    ino: InodeId,
    ended: bool,
    _slot: OwnedSemaphorePermit,
}

impl OnItsWay {
    /// Ends the removal; `after`: the directory's attributes its reply brought. If no
    /// removal there is left on its way, `keep` gets the newest the server sent for the
    /// directory (what its next `getattr` shows), before any call waiting for this
    /// removal goes on: one that changes the directory must come after it.
    pub(crate) fn end(mut self, after: Option<Attr>, keep: impl FnOnce(Attr)) {
        self.close(after, keep, None);
    }

    /// The one way a removal ends: `failure` kept for the directory's `fsync`.
    fn close(&mut self, after: Option<Attr>, keep: impl FnOnce(Attr), failure: Option<WireError>) {
        self.ended = true;
        {
            let mut p = self.removes.pending.lock();
            if let Some(a) = after {
                p.replied(self.dir, a);
            }
            if let Some(newest) = p.remove(self.dir, &self.name, self.ino) {
                keep(newest);
            }
            if let Some(e) = failure {
                p.keep_failure(self.dir, e);
            }
        }
        self.removes.count.fetch_sub(1, Ordering::AcqRel);
        self.removes.changed.notify_waiters();
    }
}

impl Drop for OnItsWay {
    /// A removal not ended (its task panicked): whether the server has it is unknown,
    /// so the directory's next `fsync` fails.
    fn drop(&mut self) {
        if !self.ended {
            let e = WireError::new(
                proto::ErrorCode::Io,
                format!("a removal in {} ended without its reply", self.dir),
            );
            self.close(None, |_| {}, Some(e));
        }
    }
}

impl Removes {
    /// Records the removal of `name` (inode `ino`) from `dir` as on its way, `shown`
    /// the directory's attributes to answer its `getattr` with meanwhile; `None` when
    /// [`MAX_DEFERRED`] are already.
    pub(crate) fn start(
        self: &Arc<Self>,
        dir: InodeId,
        name: &[u8],
        ino: InodeId,
        shown: Attr,
    ) -> Option<OnItsWay> {
        let slot = self.slots.clone().try_acquire_owned().ok()?;
        {
            let mut p = self.pending.lock();
            p.add(dir, name, ino);
            match p.shown.get_mut(&dir) {
                Some(s) => s.now = shown,
                None => {
                    p.shown.insert(
                        dir,
                        Shown {
                            now: shown,
                            replied: None,
                        },
                    );
                }
            }
        }
        self.count.fetch_add(1, Ordering::AcqRel);
        Some(OnItsWay {
            removes: self.clone(),
            dir,
            name: name.to_vec(),
            ino,
            ended: false,
            _slot: slot,
        })
    }

    /// What directory `dir` shows while removals there are on their way.
    pub(crate) fn shown(&self, dir: InodeId) -> Option<Attr> {
        if self.count.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.pending.lock().shown.get(&dir).map(|s| s.now.clone())
    }

    /// Whether the removal of `name` from `dir` is on its way.
    pub(crate) fn is_pending(&self, dir: InodeId, name: &[u8]) -> bool {
        self.count.load(Ordering::Acquire) > 0 && self.pending.lock().blocks(Fence::Name(dir, name))
    }

    /// Returns once no removal that `fence` names is on its way.
    pub(crate) async fn wait(&self, fence: Fence<'_>) {
        loop {
            if self.count.load(Ordering::Acquire) == 0 {
                return;
            }
            // Registered before the check, so that a reply between the two wakes it.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if !self.pending.lock().blocks(fence) {
                return;
            }
            changed.await;
        }
    }

    /// Keeps the first refusal in `dir` for its next `fsync`; `false` if
    /// [`MAX_FAILED`] directories have one kept already.
    pub(crate) fn failed(&self, dir: InodeId, e: WireError) -> bool {
        self.pending.lock().keep_failure(dir, e)
    }

    /// The refusal kept for `dir`, once.
    pub(crate) fn take_failure(&self, dir: InodeId) -> Option<ClientError> {
        self.pending
            .lock()
            .failed
            .remove(&dir)
            .map(ClientError::Remote)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ino(n: u64) -> InodeId {
        InodeId(n)
    }

    #[test]
    fn a_call_waits_only_for_what_it_can_see() {
        let mut p = Pending::default();
        assert!(!p.blocks(Fence::All), "nothing on its way");
        p.add(ino(10), b"a", ino(20));
        assert!(p.blocks(Fence::Name(ino(10), b"a")));
        assert!(!p.blocks(Fence::Name(ino(10), b"b")), "another name there");
        assert!(!p.blocks(Fence::Name(ino(11), b"a")), "that name elsewhere");
        assert!(p.blocks(Fence::Inode(ino(10))), "the directory");
        assert!(p.blocks(Fence::Inode(ino(20))), "the removed inode");
        assert!(!p.blocks(Fence::Inode(ino(21))));
        assert!(p.blocks(Fence::All));
        assert!(!p.blocks(Fence::Free));
        // The same name removed twice (made again in between by another client).
        p.add(ino(10), b"a", ino(22));
        p.remove(ino(10), b"a", ino(20));
        assert!(p.blocks(Fence::Name(ino(10), b"a")));
        assert!(!p.blocks(Fence::Inode(ino(20))));
        p.remove(ino(10), b"a", ino(22));
        assert!(!p.blocks(Fence::All));
        assert!(p.dirs.is_empty() && p.inos.is_empty());
    }

    #[test]
    fn calls_are_fenced_by_what_they_name() {
        let lookup = FsRequest::Lookup(fs::Lookup {
            parent: ino(1),
            name: b"x".to_vec(),
        });
        assert_eq!(fence_of(&lookup), Fence::Name(ino(1), b"x"));
        let readdir = FsRequest::ReadDir(fs::ReadDir {
            ino: ino(1),
            after: None,
            max_entries: 10,
            plus: true,
        });
        assert_eq!(fence_of(&readdir), Fence::Inode(ino(1)));
        let mkdir = FsRequest::Mkdir(fs::Mkdir {
            parent: ino(2),
            name: b"d".to_vec(),
            perm: 0o755,
        });
        assert_eq!(fence_of(&mkdir), Fence::Inode(ino(2)));
        let rmdir = FsRequest::Rmdir(fs::Rmdir {
            parent: ino(1),
            name: b"d".to_vec(),
        });
        assert_eq!(fence_of(&rmdir), Fence::All);
        let unlink = FsRequest::Unlink(fs::Unlink {
            parent: ino(1),
            name: b"x".to_vec(),
        });
        assert_eq!(fence_of(&unlink), Fence::Free);
    }

    fn dir_attr(n: u64, ctime: i64) -> Attr {
        let mut a = crate::fuse::dot_attr(ino(n), proto::FileKind::Directory);
        a.ctime = proto::Timestamp {
            secs: ctime,
            nanos: 0,
        };
        a
    }

    #[test]
    fn a_directory_shows_its_latest_removal_then_the_newest_reply() {
        let r = Arc::new(Removes::default());
        let one = r.start(ino(1), b"a", ino(5), dir_attr(1, 100)).unwrap();
        let two = r.start(ino(1), b"b", ino(6), dir_attr(1, 101)).unwrap();
        assert_eq!(r.shown(ino(1)).unwrap().ctime.secs, 101);
        assert!(r.shown(ino(2)).is_none());
        // Replies cross: the newer first; neither is the last on its way alone.
        let mut kept = Vec::new();
        two.end(Some(dir_attr(1, 99)), |a| kept.push(a));
        assert!(kept.is_empty());
        assert_eq!(r.shown(ino(1)).unwrap().ctime.secs, 101, "still on its way");
        one.end(Some(dir_attr(1, 98)), |a| kept.push(a));
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].ctime.secs, 99, "the newest the server sent");
        assert!(r.shown(ino(1)).is_none());
        assert!(r.take_failure(ino(1)).is_none());
        // A panicked task's guard ends it too, with nothing to show, and its
        // directory's next fsync fails.
        let three = r.start(ino(1), b"c", ino(7), dir_attr(1, 102)).unwrap();
        drop(three);
        assert!(r.shown(ino(1)).is_none() && !r.is_pending(ino(1), b"c"));
        assert!(r.take_failure(ino(1)).is_some());
        assert!(r.take_failure(ino(1)).is_none(), "reported once");
    }

    #[tokio::test]
    async fn a_waiting_call_goes_on_when_the_removal_ends() {
        let r = Arc::new(Removes::default());
        let way = r.start(ino(1), b"x", ino(5), dir_attr(1, 1)).unwrap();
        assert!(r.is_pending(ino(1), b"x"));
        let waiter = {
            let r = r.clone();
            tokio::spawn(async move { r.wait(Fence::Inode(ino(5))).await })
        };
        tokio::task::yield_now().await;
        assert!(
            !waiter.is_finished(),
            "waits while the removal is on its way"
        );
        // Not fenced: goes at once.
        r.wait(Fence::Name(ino(1), b"y")).await;
        drop(way);
        waiter.await.unwrap();
        assert!(!r.is_pending(ino(1), b"x"));
        r.wait(Fence::All).await;
    }

    #[test]
    fn no_more_than_the_limit_are_on_their_way() {
        let r = Arc::new(Removes::default());
        let ways: Vec<OnItsWay> = (0..MAX_DEFERRED as u64)
            .map(|i| {
                r.start(ino(1), &i.to_le_bytes(), ino(100 + i), dir_attr(1, 1))
                    .unwrap()
            })
            .collect();
        assert!(r
            .start(ino(1), b"one more", ino(7), dir_attr(1, 1))
            .is_none());
        drop(ways);
        assert!(r
            .start(ino(1), b"one more", ino(7), dir_attr(1, 1))
            .is_some());
    }
}
