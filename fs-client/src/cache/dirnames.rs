//! Directories whose every name this client knows, so that it can answer the lookup of
//! a missing name itself.
//!
//! Creating a file costs the kernel a `LOOKUP` of the new name, which fails, then the
//! `CREATE`, both under the directory's lock: processes creating files in one directory
//! wait for each other's round trips, and half of them only confirm that a name is
//! free. This client learns every name of a directory when it makes the directory
//! (empty) or lists it whole in one page (`ls`, `cp -r` into it), and keeps the list
//! through its own calls that make or remove one name there (create, mkdir, mknod,
//! symlink, link, unlink, rmdir). Each of those replies carries the directory's ctime
//! just before and just after the change (`DirChange`); the server never gives a
//! directory's ctime the same value twice, so `before` equal to the ctime the list was
//! taken at means that no one else changed the directory in between. Any other sign of
//! a change drops the list: another ctime in any reply, a name found that the list
//! lacks, a failed call, or a rename (which reports neither directory's change).
//!
//! Replies cross: another process's lookup of the directory itself may show the ctime
//! of a create of this client's whose own reply is still on its way, or one that left
//! before a change show the ctime the list had before it. A ctime the list went through
//! is taken as old news; an unknown one seen while a change of this client's is in
//! flight there is held until those changes are answered, and drops the list unless one
//! of them led to it. The list answers nothing while it holds one.
//!
//! Another client's new name is not seen while a list is trusted: like the kernel's own
//! cache of names, a list answers only within the entry TTL since the server last
//! confirmed it. An expired list is kept, and a reply showing the directory's ctime
//! unchanged (the kernel's `getattr` of the directory before each create) confirms it
//! again. A create is never wrong for it: it goes to the server, which opens a file of
//! that name made meanwhile (with `O_TRUNC` the client then empties it) or refuses it
//! under `O_EXCL`.

use crate::rpc::Seen;
use parking_lot::Mutex;
use proto::meta::fs::{self, DirPage, FsRequest, Made, Opened};
use proto::meta::DirChange;
use proto::{Attr, FileKind, InodeId, Timestamp};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// Names kept over all directories (~100 bytes each with the set's overhead): past it,
/// a directory whose list would grow is dropped instead.
const MAX_NAMES: usize = 262_144;
/// Directories with a list; past it, the expired lists go, then all.
const MAX_DIRS: usize = 4096;
/// Earlier ctimes a list remembers, to know a late reply's ctime for old news.
const MAX_PAST: usize = 4;
/// Unknown ctimes a list holds while this client's changes are in flight; one more
/// drops it.
const MAX_UNSURE: usize = 4;

/// Every name of one directory, as of the directory's ctime `ctime`.
struct Known {
    ctime: Timestamp,
    names: HashSet<Vec<u8>>,
    /// When the server last showed the directory at `ctime`.
    confirmed: Instant,
    /// The ctimes the list was at before `ctime`, latest last.
    past: Vec<Timestamp>,
    /// This client's calls that make or remove a name here, sent and not yet answered.
    in_flight: u32,
    /// Ctimes shown while `in_flight` that none of those calls has reached yet.
    unsure: Vec<Timestamp>,
}

impl Known {
    fn new(ctime: Timestamp, names: HashSet<Vec<u8>>) -> Known {
        Known {
            ctime,
            names,
            confirmed: Instant::now(),
            past: Vec::new(),
            in_flight: 0,
            unsure: Vec::new(),
        }
    }
}

#[derive(Default)]
struct Lists {
    dirs: HashMap<InodeId, Known>,
    /// Names over all of `dirs`.
    names: usize,
    /// Requests sent that make, remove or move a name: a listing is taken as whole
    /// only if none went out while it was on its way.
    moves: u64,
}

impl Lists {
    fn drop_dir(&mut self, dir: InodeId) {
        if let Some(k) = self.dirs.remove(&dir) {
            self.names -= k.names.len();
        }
    }
}

pub(crate) struct DirNames {
    ttl: Duration,
    lists: Mutex<Lists>,
}

impl DirNames {
    /// Lists trusted for `ttl` after each confirmation (zero: never used nor kept).
    pub(crate) fn new(ttl: Duration) -> DirNames {
        DirNames {
            ttl,
            lists: Mutex::new(Lists::default()),
        }
    }

    /// Whether `name` is known to be missing from `dir` now.
    pub(crate) fn absent(&self, dir: InodeId, name: &[u8]) -> bool {
        let lists = self.lists.lock();
        lists.dirs.get(&dir).is_some_and(|k| {
            k.unsure.is_empty() && k.confirmed.elapsed() < self.ttl && !k.names.contains(name)
        })
    }

    /// Called before `req` is sent; returns the token to hand to [`DirNames::after`].
    /// Drops what a request is about to change without the list following it (a
    /// rename moves names between two directories and reports neither's change). The
    /// calls that make or remove one name are followed through their replies.
    pub(crate) fn before(&self, req: &FsRequest) -> u64 {
        let mut lists = self.lists.lock();
        if let FsRequest::Rename(fs::Rename {
            parent, new_parent, ..
        }) = req
        {
            lists.moves += 1;
            lists.drop_dir(*parent);
            lists.drop_dir(*new_parent);
        } else if let Some((dir, _, _)) = name_change(req) {
            lists.moves += 1;
            if let Some(k) = lists.dirs.get_mut(&dir) {
                k.in_flight += 1;
            }
        }
        lists.moves
    }

    /// Learns from the answer to `req` (`None`: it failed or was not answered), sent
    /// after [`DirNames::before`] gave `token`.
    pub(crate) fn after(&self, req: &FsRequest, reply: Option<Seen<'_>>, token: u64) {
        use FsRequest as R;
        use Seen as P;
        let mut lists = self.lists.lock();
        if let Some((dir, name, present)) = name_change(req) {
            if let Some(k) = lists.dirs.get_mut(&dir) {
                k.in_flight = k.in_flight.saturating_sub(1);
            }
            match reply {
                Some(
                    P::Opened(Opened {
                        parent: Some(c), ..
                    })
                    | P::Made(Made { parent: c, .. })
                    | P::Removed(c),
                ) => self.follow(&mut lists, dir, c, name, present),
                // Whether it happened is unknown, or the list was wrong (`O_EXCL`).
                _ => lists.drop_dir(dir),
            }
            // A ctime shown meanwhile that none of this client's changes led to.
            if lists
                .dirs
                .get(&dir)
                .is_some_and(|k| k.in_flight == 0 && !k.unsure.is_empty())
            {
                lists.drop_dir(dir);
            }
        }
        match (req, reply) {
            (R::Mkdir(fs::Mkdir { .. }), Some(P::Made(Made { attr, .. })))
                if attr.kind == FileKind::Directory =>
            {
                self.insert(&mut lists, attr.ino, attr.ctime, HashSet::new())
            }
            (
                R::ReadDir(fs::ReadDir {
                    ino, after: None, ..
                }),
                Some(P::Dir(DirPage {
                    entries,
                    complete_at: Some(ctime),
                    ..
                })),
            ) => {
                // A change of this client's own may have crossed the listing.
                if lists.moves == token {
                    let names = entries.iter().map(|e| e.name.clone()).collect();
                    self.insert(&mut lists, *ino, *ctime, names);
                }
                for a in entries.iter().filter_map(|e| e.attr.as_ref()) {
                    self.seen(&mut lists, a);
                }
            }
            (R::Lookup(fs::Lookup { parent, name }), Some(P::Attr(a)))
            | (
                R::OpenAt(fs::OpenAt { parent, name, .. }),
                Some(P::Attr(a) | P::Opened(Opened { attr: a, .. })),
            ) => {
                // Made by someone else since the list was confirmed.
                if lists
                    .dirs
                    .get(parent)
                    .is_some_and(|k| !k.names.contains(name))
                {
                    lists.drop_dir(*parent);
                }
                self.seen(&mut lists, a);
            }
            (
                _,
                Some(
                    P::Attr(a) | P::Opened(Opened { attr: a, .. }) | P::Made(Made { attr: a, .. }),
                ),
            ) => self.seen(&mut lists, a),
            (_, Some(P::Dir(DirPage { entries, .. }))) => {
                for a in entries.iter().filter_map(|e| e.attr.as_ref()) {
                    self.seen(&mut lists, a);
                }
            }
            _ => {}
        }
    }

    /// Every name of `dir` as of its ctime `ctime`, just learnt: a directory this
    /// client made (empty), or a whole listing.
    fn insert(&self, lists: &mut Lists, dir: InodeId, ctime: Timestamp, names: HashSet<Vec<u8>>) {
        if self.ttl.is_zero() {
            return;
        }
        lists.drop_dir(dir);
        if lists.names + names.len() > MAX_NAMES {
            return;
        }
        if lists.dirs.len() >= MAX_DIRS {
            let ttl = self.ttl;
            lists.dirs.retain(|_, k| k.confirmed.elapsed() < ttl);
            if lists.dirs.len() >= MAX_DIRS {
                lists.dirs.clear();
            }
            lists.names = lists.dirs.values().map(|k| k.names.len()).sum();
        }
        lists.names += names.len();
        lists.dirs.insert(dir, Known::new(ctime, names));
    }

    /// Attributes from any reply: the same ctime confirms a list, another drops it.
    fn seen(&self, lists: &mut Lists, attr: &Attr) {
        if attr.kind != FileKind::Directory {
            return;
        }
        let Some(k) = lists.dirs.get_mut(&attr.ino) else {
            return;
        };
        if k.ctime == attr.ctime {
            k.confirmed = Instant::now();
        } else if k.past.contains(&attr.ctime) || k.unsure.contains(&attr.ctime) {
            // Old news, or already held.
        } else if k.in_flight > 0 && k.unsure.len() < MAX_UNSURE {
            k.unsure.push(attr.ctime);
        } else {
            lists.drop_dir(attr.ino);
        }
    }

    /// A call of this client's that made (`present`) or removed `name` in `dir` did
    /// `change`.
    fn follow(
        &self,
        lists: &mut Lists,
        dir: InodeId,
        change: &DirChange,
        name: &[u8],
        present: bool,
    ) {
        let Some(k) = lists.dirs.get_mut(&dir) else {
            return;
        };
        let unchanged = !change.changed();
        // Someone else changed the directory first, or nothing changed although the
        // list expected a change (a create that opened a file the list did not have).
        if k.ctime != change.before || (unchanged && k.names.contains(name) != present) {
            lists.drop_dir(dir);
            return;
        }
        if present && !k.names.contains(name) && lists.names >= MAX_NAMES {
            lists.drop_dir(dir);
            return;
        }
        let moved = if present {
            k.names.insert(name.to_vec())
        } else {
            k.names.remove(name)
        };
        if k.ctime != change.after.ctime {
            if k.past.len() == MAX_PAST {
                k.past.remove(0);
            }
            k.past.push(k.ctime);
        }
        k.ctime = change.after.ctime;
        k.confirmed = Instant::now();
        k.unsure.retain(|c| *c != k.ctime);
        match (moved, present) {
            (true, true) => lists.names += 1,
            (true, false) => lists.names -= 1,
            _ => {}
        }
    }
}

/// The directory, name and whether the name is made (`true`) or removed, of a request
/// that makes or removes one name.
fn name_change(req: &FsRequest) -> Option<(InodeId, &[u8], bool)> {
    use FsRequest as R;
    match req {
        R::Create(fs::Create { parent, name, .. })
        | R::Mkdir(fs::Mkdir { parent, name, .. })
        | R::MkNod(fs::MkNod { parent, name, .. })
        | R::Symlink(fs::Symlink { parent, name, .. }) => Some((*parent, name, true)),
        R::Link(fs::Link {
            new_parent,
            new_name,
            ..
        }) => Some((*new_parent, new_name, true)),
        R::Unlink(fs::Unlink { parent, name }) | R::Rmdir(fs::Rmdir { parent, name }) => {
            Some((*parent, name, false))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::Replied;
    use proto::meta::DirEntry;

    fn dir(ino: u64, ctime: u32) -> Attr {
        let mut a = crate::fuse::dot_attr(InodeId(ino), FileKind::Directory);
        a.ctime = Timestamp {
            secs: 1,
            nanos: ctime,
        };
        a
    }

    fn mkdir(parent: u64) -> FsRequest {
        FsRequest::Mkdir(fs::Mkdir {
            parent: InodeId(parent),
            name: b"d".to_vec(),
            perm: 0o755,
        })
    }

    fn create(d: u64, name: &str) -> FsRequest {
        FsRequest::Create(fs::Create {
            parent: InodeId(d),
            name: name.as_bytes().to_vec(),
            perm: 0o644,
            exclusive: false,
            client: proto::ClientId(1),
            access: proto::meta::OpenAccess::ReadWrite,
            append: false,
        })
    }

    fn created(d: u64, before: u32, after: u32) -> Reply {
        Reply::Opened(Box::new(fs::Opened {
            attr: dir(99, 0),
            session: proto::SessionId(1),
            layout: proto::Layout {
                chunk_size_bytes: 1 << 20,
                chains: vec![],
                first: 0,
                replicas: 1,
            },
            parent: Some(DirChange {
                before: dir(d, before).ctime,
                after: dir(d, after),
            }),
            cut_tail: false,
            grant: None,
            cut_grant: None,
        }))
    }

    /// The reply to a call that made a name for `attr` in `d` (ctime `before` ->
    /// `after`).
    fn made(d: u64, before: u32, after: u32, attr: Attr) -> Reply {
        Reply::Made(fs::Made {
            attr,
            parent: DirChange {
                before: dir(d, before).ctime,
                after: dir(d, after),
            },
        })
    }

    /// The reply to a mkdir in `parent` that made directory `d` at ctime `ctime`.
    fn made_dir(parent: u64, d: u64, ctime: u32) -> Reply {
        made(parent, 1, 2, dir(d, ctime))
    }

    fn removed(d: u64, before: u32, after: u32) -> Reply {
        Reply::Removed(DirChange {
            before: dir(d, before).ctime,
            after: dir(d, after),
        })
    }

    fn unlink(d: u64, name: &str) -> FsRequest {
        FsRequest::Unlink(fs::Unlink {
            parent: InodeId(d),
            name: name.as_bytes().to_vec(),
        })
    }

    /// Sends `req` and takes `reply` in, as the client does.
    fn call(n: &DirNames, req: &FsRequest, reply: Option<&Reply>) {
        let token = n.before(req);
        n.after(req, reply.map(Reply::seen), token);
    }

    /// The replies these tests send, owned.
    enum Reply {
        Attr(Attr),
        Opened(Box<fs::Opened>),
        Made(fs::Made),
        Removed(DirChange),
        Dir(fs::DirPage),
    }

    impl Reply {
        fn seen(&self) -> Seen<'_> {
            match self {
                Reply::Attr(a) => a.seen(),
                Reply::Opened(o) => o.seen(),
                Reply::Made(m) => m.seen(),
                Reply::Removed(c) => c.seen(),
                Reply::Dir(d) => d.seen(),
            }
        }
    }

    /// A list of directory 5, empty at ctime 10.
    fn with_empty_dir() -> DirNames {
        let n = DirNames::new(Duration::from_secs(60));
        call(&n, &mkdir(1), Some(&made_dir(1, 5, 10)));
        n
    }

    #[test]
    fn own_creates_and_unlinks_keep_the_list() {
        let n = with_empty_dir();
        assert!(n.absent(InodeId(5), b"a"), "a new directory is empty");
        assert!(!n.absent(InodeId(1), b"a"), "its parent is not known");
        call(&n, &create(5, "a"), Some(&created(5, 10, 11)));
        assert!(!n.absent(InodeId(5), b"a"), "made here");
        assert!(n.absent(InodeId(5), b"b"));
        call(&n, &create(5, "b"), Some(&created(5, 11, 12)));
        call(&n, &unlink(5, "a"), Some(&removed(5, 12, 13)));
        assert!(n.absent(InodeId(5), b"a"), "removed here");
        assert!(!n.absent(InodeId(5), b"b"));
        assert_eq!(n.lists.lock().names, 1);
    }

    #[test]
    fn another_clients_change_drops_the_list() {
        // A create whose `before` is not the list's ctime: someone changed it first.
        let n = with_empty_dir();
        call(&n, &create(5, "a"), Some(&created(5, 11, 12)));
        assert!(!n.absent(InodeId(5), b"b"));
        // Attributes showing another ctime.
        let n = with_empty_dir();
        call(
            &n,
            &FsRequest::GetAttr(fs::GetAttr { ino: InodeId(5) }),
            Some(&Reply::Attr(dir(5, 11))),
        );
        assert!(!n.absent(InodeId(5), b"b"));
        // A name found that the list lacks.
        let n = with_empty_dir();
        let lookup = FsRequest::Lookup(fs::Lookup {
            parent: InodeId(5),
            name: b"x".to_vec(),
        });
        call(&n, &lookup, Some(&Reply::Attr(dir(7, 3))));
        assert!(!n.absent(InodeId(5), b"b"));
        // A create that opened a file the list did not have.
        let n = with_empty_dir();
        call(&n, &create(5, "a"), Some(&created(5, 10, 10)));
        assert!(!n.absent(InodeId(5), b"b"));
        // A failed create: it may have happened, or the list was wrong.
        let n = with_empty_dir();
        call(&n, &create(5, "a"), None);
        assert!(!n.absent(InodeId(5), b"b"));
    }

    #[test]
    fn a_reply_crossing_an_own_change_keeps_the_list() {
        let getattr = FsRequest::GetAttr(fs::GetAttr { ino: InodeId(5) });
        let shows = |n: &DirNames, ctime: u32| call(n, &getattr, Some(&Reply::Attr(dir(5, ctime))));
        // Another process's lookup of the directory shows the create's ctime before the
        // create's own reply is in: held, and the reply resolves it.
        let n = with_empty_dir();
        let req = create(5, "a");
        let token = n.before(&req);
        shows(&n, 11);
        assert!(!n.absent(InodeId(5), b"b"), "nothing answered while unsure");
        n.after(&req, Some(created(5, 10, 11).seen()), token);
        assert!(n.absent(InodeId(5), b"b") && !n.absent(InodeId(5), b"a"));
        // A reply that left before the create shows its old ctime: old news.
        shows(&n, 10);
        assert!(n.absent(InodeId(5), b"b"));
        // A ctime that no change of this client's led to drops the list once they are
        // answered.
        let n = with_empty_dir();
        let token = n.before(&req);
        shows(&n, 12);
        n.after(&req, Some(created(5, 10, 11).seen()), token);
        assert!(!n.absent(InodeId(5), b"b"));
        // As does one more unknown ctime than a list holds.
        let n = with_empty_dir();
        let token = n.before(&req);
        for c in 0..=MAX_UNSURE as u32 {
            shows(&n, 20 + c);
        }
        assert!(!n.lists.lock().dirs.contains_key(&InodeId(5)));
        n.after(&req, Some(created(5, 10, 20).seen()), token);
        assert!(!n.absent(InodeId(5), b"b"));
        // With nothing of this client's in flight, an unknown ctime drops it at once.
        let n = with_empty_dir();
        call(&n, &req, Some(&created(5, 10, 11)));
        shows(&n, 9);
        assert!(!n.absent(InodeId(5), b"b"));
    }

    #[test]
    fn every_call_that_makes_or_removes_one_name_is_followed() {
        let n = with_empty_dir();
        let in5 = |name: &str| (InodeId(5), name.as_bytes().to_vec());
        let (parent, name) = in5("sub");
        let mkdir = FsRequest::Mkdir(fs::Mkdir {
            parent,
            name,
            perm: 0o755,
        });
        call(&n, &mkdir, Some(&made(5, 10, 11, dir(6, 11))));
        assert!(!n.absent(InodeId(5), b"sub") && n.absent(InodeId(5), b"x"));
        assert!(
            n.absent(InodeId(6), b"x"),
            "the new directory is known empty"
        );
        let (new_parent, new_name) = in5("h");
        let link = FsRequest::Link(fs::Link {
            ino: InodeId(9),
            new_parent,
            new_name,
            kernel_checked: true,
        });
        call(&n, &link, Some(&made(5, 11, 12, dir(9, 3))));
        assert!(!n.absent(InodeId(5), b"h"));
        let (parent, name) = in5("sub");
        call(
            &n,
            &FsRequest::Rmdir(fs::Rmdir { parent, name }),
            Some(&removed(5, 12, 13)),
        );
        assert!(n.absent(InodeId(5), b"sub") && !n.absent(InodeId(5), b"h"));
        // A failed one drops the list: it may have happened.
        let (parent, name) = in5("l");
        let symlink = FsRequest::Symlink(fs::Symlink {
            parent,
            name,
            target: b"t".to_vec(),
        });
        call(&n, &symlink, None);
        assert!(!n.absent(InodeId(5), b"x"));
    }

    #[test]
    fn a_rename_drops_both_lists_and_reads_keep_them() {
        let n = with_empty_dir();
        call(&n, &mkdir(1), Some(&made_dir(1, 7, 10)));
        n.before(&FsRequest::Rename(fs::Rename {
            parent: InodeId(7),
            name: b"x".to_vec(),
            new_parent: InodeId(5),
            new_name: b"x".to_vec(),
            mode: proto::meta::RenameMode::Replace,
        }));
        assert!(!n.absent(InodeId(5), b"y") && !n.absent(InodeId(7), b"y"));
        let n = with_empty_dir();
        n.before(&create(5, "x"));
        n.before(&FsRequest::GetAttr(fs::GetAttr { ino: InodeId(5) }));
        assert!(n.absent(InodeId(5), b"x"), "others keep it");
    }

    #[test]
    fn a_whole_listing_gives_the_names_unless_a_change_crossed_it() {
        let list = |names: &[&str], complete: Option<u32>| {
            Reply::Dir(fs::DirPage {
                entries: names
                    .iter()
                    .map(|x| DirEntry {
                        name: x.as_bytes().to_vec(),
                        ino: InodeId(50),
                        kind: FileKind::Regular,
                        attr: None,
                    })
                    .collect(),
                done: true,
                complete_at: complete.map(|c| dir(5, c).ctime),
            })
        };
        let readdir = |after: Option<&str>| {
            FsRequest::ReadDir(fs::ReadDir {
                ino: InodeId(5),
                after: after.map(|a| a.as_bytes().to_vec()),
                max_entries: 512,
                plus: false,
            })
        };
        let n = DirNames::new(Duration::from_secs(60));
        call(&n, &readdir(None), Some(&list(&["a", "b"], Some(10))));
        assert!(!n.absent(InodeId(5), b"a") && n.absent(InodeId(5), b"c"));
        call(&n, &create(5, "c"), Some(&created(5, 10, 11)));
        assert!(
            !n.absent(InodeId(5), b"c"),
            "followed like a list of its own"
        );
        // A listing not whole, or not from the top, gives nothing.
        for (req, reply) in [
            (readdir(None), list(&["a"], None)),
            (readdir(Some("a")), list(&["b"], Some(10))),
        ] {
            let n = DirNames::new(Duration::from_secs(60));
            call(&n, &req, Some(&reply));
            assert!(!n.absent(InodeId(5), b"zz"), "{req:?}");
        }
        // Nor one that a change of this client's crossed.
        let n = DirNames::new(Duration::from_secs(60));
        let token = n.before(&readdir(None));
        n.before(&create(5, "d"));
        n.after(&readdir(None), Some(list(&["a"], Some(10)).seen()), token);
        assert!(!n.absent(InodeId(5), b"zz"));
    }

    #[test]
    fn a_list_answers_within_the_ttl_and_the_same_ctime_confirms_it() {
        let n = DirNames::new(Duration::from_millis(50));
        call(&n, &mkdir(1), Some(&made_dir(1, 5, 10)));
        std::thread::sleep(Duration::from_millis(80));
        assert!(!n.absent(InodeId(5), b"a"), "expired");
        call(
            &n,
            &FsRequest::GetAttr(fs::GetAttr { ino: InodeId(5) }),
            Some(&Reply::Attr(dir(5, 10))),
        );
        assert!(n.absent(InodeId(5), b"a"), "confirmed again");
        let off = DirNames::new(Duration::ZERO);
        call(&off, &mkdir(1), Some(&made_dir(1, 5, 10)));
        assert!(!off.absent(InodeId(5), b"a"), "a zero TTL keeps nothing");
    }

    #[test]
    fn the_number_of_names_is_bounded() {
        let n = with_empty_dir();
        n.lists.lock().names = MAX_NAMES;
        call(&n, &create(5, "a"), Some(&created(5, 10, 11)));
        assert!(!n.absent(InodeId(5), b"b"), "a full cache drops the list");
        assert_eq!(n.lists.lock().names, MAX_NAMES);
    }
}
