//! Directories read in name order, one lookup at a time: the entries ahead of the
//! last name looked up, fetched with their attributes in one listing page.
//!
//! `rsync`, `tar c`, `git status`, `du`, a data loader that checks each file's size,
//! `ls` after a dropped cache: each `stat` is a kernel `LOOKUP`, and each lookup a
//! round trip to the metadata server, though the names come in listing order. Here a
//! lookup that comes after another of a smaller name in the same directory (the sign of
//! a walk in name order) asks for a page of the listing with attributes instead
//! (`ReadDir` with `plus`, from just before the name), which holds the name and the
//! ones after it; the lookups that follow are answered from it. A page whose last
//! entry was looked up is followed by the next, twice as long, up to
//! [`MAX_WINDOW`]: a walk costs one call per page, not one per name. Several walks
//! in one directory (processes going through their own names) keep a page each, up
//! to [`MAX_PAGES`].
//!
//! What a page says is trusted as the kernel trusts a lookup's reply: for the entry
//! TTL since the server read it, and the kernel is told only what is left of that time
//! ([`Hit::age`]), so an entry is never trusted past the TTL from the server's read.
//! A page never says a name is missing (a name it lacks is asked for). This client's
//! own changes go first: a change of one inode's attributes drops what pages say of
//! that inode, and any other change (a new or removed name, a rename) drops every
//! page. A page sent for before one of those changes and answered after it is not
//! kept.

use parking_lot::Mutex;
use proto::meta::fs::{self, FsRequest};
use proto::meta::DirEntry;
use proto::{Attr, InodeId};
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Entries in a walk's first page: a lookup that only looked like a walk costs the
/// server this many inode reads instead of one.
pub(crate) const FIRST_WINDOW: u32 = 16;
/// Entries in a page at most (the server's own bound is larger).
pub(crate) const MAX_WINDOW: u32 = 512;
/// Pages kept per directory: the walks through it at once.
const MAX_PAGES: usize = 4;
/// Directories with pages; past it, all are dropped.
const MAX_DIRS: usize = 256;
/// Inodes whose attributes this client changed while pages were kept; past it, every
/// page is dropped.
const MAX_CHANGED: usize = 4096;
/// Lookups in a directory whose pages went unused before it asks for one again.
const MAX_SKIP: u32 = 64;

/// A page of one directory's listing, with attributes.
struct Page {
    /// Its entries are every name strictly after this one (`None`: from the top) ...
    after: Option<Vec<u8>>,
    /// ... in name order, up to the last one here, or to the end if `done`.
    entries: Vec<DirEntry>,
    done: bool,
    /// When it was asked for (the server read it after that).
    at: Instant,
    /// The epoch when it was asked for.
    epoch: u64,
    /// Its length as asked for.
    window: u32,
    /// Whether its last entry was looked up: a walk that reached its end.
    finished: bool,
    /// Lookups it answered.
    hits: u32,
}

impl Page {
    fn last(&self) -> Option<&[u8]> {
        self.entries.last().map(|e| e.name.as_slice())
    }

    /// Whether `name` falls in the range this page lists.
    fn covers(&self, name: &[u8]) -> bool {
        self.after.as_deref().is_none_or(|a| a < name)
            && (self.done || self.last().is_some_and(|l| name <= l))
    }
}

#[derive(Default)]
struct Dir {
    pages: VecDeque<Page>,
    /// The last name looked up here with a plain lookup.
    seed: Option<Vec<u8>>,
    /// A page was refused (a caller who may search the directory but not list it):
    /// lookups here stay plain.
    refused: bool,
    /// Pages in a row that went unused (lookups in no order that only looked like a
    /// walk): each doubles the lookups a new walk waits for, up to [`MAX_SKIP`].
    unused: u32,
    /// Lookups left before the next page a seed may ask for.
    skip: u32,
}

impl Dir {
    /// Drops the pages `keep` refuses, counting those that answered nothing.
    fn drop_pages(&mut self, mut keep: impl FnMut(&Page) -> bool) {
        let mut unused = self.unused;
        self.pages.retain(|p| {
            let kept = keep(p);
            if !kept {
                unused = if p.hits == 0 { unused + 1 } else { 0 };
            }
            kept
        });
        self.unused = unused;
    }
}

#[derive(Default)]
struct State {
    dirs: HashMap<InodeId, Dir>,
    /// Counts this client's changes.
    epoch: u64,
    /// The epoch of each inode's last change by this client: what a page asked for
    /// before it says of the inode is not used.
    changed: HashMap<InodeId, u64>,
    /// The epoch at which every page was last dropped: a page asked for before it is
    /// not kept.
    dropped: u64,
}

impl State {
    /// `dir`'s state, made if new; past [`MAX_DIRS`] directories, every one goes first.
    fn dir(&mut self, dir: InodeId) -> &mut Dir {
        if self.dirs.len() >= MAX_DIRS && !self.dirs.contains_key(&dir) {
            self.drop_all();
            self.dirs.clear();
        }
        self.dirs.entry(dir).or_default()
    }

    /// Drops every page, and refuses those on their way. What each directory's
    /// lookups looked like stays: it says nothing of what is in the directory.
    /// Notes `inos` as changed at the current epoch: what pages asked for before say of
    /// them is not used. Past [`MAX_CHANGED`] notes every page goes instead.
    fn mark_changed(&mut self, inos: Vec<InodeId>) {
        if self.changed.len() + inos.len() > MAX_CHANGED {
            self.drop_all();
            return;
        }
        for ino in inos {
            self.changed.insert(ino, self.epoch);
        }
    }

    fn drop_all(&mut self) {
        for d in self.dirs.values_mut() {
            d.pages.clear();
        }
        self.changed.clear();
        self.dropped = self.epoch;
    }
}

/// `entry`'s attributes, unless this client changed the inode after `asked`.
fn usable(changed: &HashMap<InodeId, u64>, entry: &DirEntry, asked: u64) -> Option<Attr> {
    let attr = entry.attr.clone()?;
    let after = changed.get(&attr.ino).is_some_and(|&e| e > asked);
    (!after).then_some(attr)
}

/// An entry found in a page.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Hit {
    pub attr: Attr,
    /// How long ago the page was asked for: the kernel may trust the entry for the
    /// rest of the TTL only.
    pub age: Duration,
}

/// What to do for a lookup.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Plan {
    /// Answered from a page.
    Hit(Hit),
    /// Ask for a page: `ReadDir { after, max_entries: window, plus: true }`, then
    /// [`Scans::fetched`] with this plan.
    Fetch(Fetch),
    /// A plain `Lookup`.
    Lookup,
}

/// A page to ask for.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Fetch {
    /// List strictly after this name.
    pub after: Vec<u8>,
    /// Entries at most.
    pub window: u32,
    /// The epoch it is asked at.
    epoch: u64,
}

/// What a page just fetched says of the name looked up.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Found {
    /// There, with these attributes.
    Attr(Attr),
    /// Not in the range the page lists: the directory had no such name when the server
    /// read the page.
    Absent,
    /// The page does not tell (it ends before the name, or a change of this client's
    /// crossed it): a plain lookup must.
    Unknown,
}

pub(crate) struct Scans {
    ttl: Duration,
    state: Mutex<State>,
}

impl Scans {
    /// Pages trusted for `ttl` (zero: none asked for).
    pub(crate) fn new(ttl: Duration) -> Scans {
        Scans {
            ttl,
            state: Mutex::new(State::default()),
        }
    }

    /// How to look `name` up in `dir` now.
    pub(crate) fn plan(&self, dir: InodeId, name: &[u8]) -> Plan {
        self.decide(dir, name, true)
    }

    /// `name`'s entry in a page of `dir`, if one holds it: [`Scans::plan`] without
    /// the pages to ask for (which it leaves for the call that follows a miss).
    pub(crate) fn hit(&self, dir: InodeId, name: &[u8]) -> Option<Hit> {
        match self.decide(dir, name, false) {
            Plan::Hit(hit) => Some(hit),
            _ => None,
        }
    }

    fn decide(&self, dir: InodeId, name: &[u8], may_ask: bool) -> Plan {
        if self.ttl.is_zero() {
            return Plan::Lookup;
        }
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let epoch = state.epoch;
        let State { dirs, changed, .. } = state;
        let Some(d) = dirs.get_mut(&dir).filter(|d| !d.refused) else {
            return Plan::Lookup;
        };
        let ttl = self.ttl;
        d.drop_pages(|p| p.at.elapsed() < ttl);
        if let Some(page) = d.pages.iter_mut().find(|p| p.covers(name)) {
            let at = page
                .entries
                .binary_search_by(|e| e.name.as_slice().cmp(name));
            let Ok(i) = at else {
                // Made since, perhaps: a page never says a name is missing.
                return Plan::Lookup;
            };
            page.finished |= i + 1 == page.entries.len();
            page.hits += 1;
            let (entry, asked, age) = (&page.entries[i], page.epoch, page.at.elapsed());
            return match usable(changed, entry, asked) {
                Some(attr) => Plan::Hit(Hit { attr, age }),
                None => Plan::Lookup,
            };
        }
        if !may_ask {
            return Plan::Lookup;
        }
        // The page whose end a walk reached, if this name comes after it.
        let walked = d
            .pages
            .iter()
            .filter(|p| !p.done && p.last().is_some_and(|l| l < name))
            .max_by(|a, b| a.last().cmp(&b.last()));
        match walked {
            Some(p) if p.finished => Plan::Fetch(Fetch {
                after: p.last().unwrap_or_default().to_vec(),
                window: (p.window * 2).min(MAX_WINDOW),
                epoch,
            }),
            _ if d.seed.as_deref().is_some_and(|s| s < name) && d.skip > 0 => {
                d.skip -= 1;
                Plan::Lookup
            }
            _ if d.seed.as_deref().is_some_and(|s| s < name) => match cursor_before(name) {
                Some(after) => {
                    d.skip = (1u32 << d.unused.min(MAX_SKIP.ilog2())) - 1;
                    Plan::Fetch(Fetch {
                        after,
                        window: FIRST_WINDOW,
                        epoch,
                    })
                }
                None => Plan::Lookup,
            },
            _ => Plan::Lookup,
        }
    }

    /// Notes that a plain lookup found `name` in `dir`: a later lookup of a name after
    /// it asks for a page.
    pub(crate) fn found(&self, dir: InodeId, name: &[u8]) {
        if self.ttl.is_zero() {
            return;
        }
        self.state.lock().dir(dir).seed = Some(name.to_vec());
    }

    /// Notes that the server refused a page of `dir`.
    pub(crate) fn refused(&self, dir: InodeId) {
        if let Some(d) = self.state.lock().dirs.get_mut(&dir) {
            d.refused = true;
            d.pages.clear();
        }
    }

    /// Keeps the page `fetch` asked for, `asked` the time it was sent, unless this
    /// client changed a name since; returns what it says of `name`.
    pub(crate) fn fetched(
        &self,
        dir: InodeId,
        name: &[u8],
        fetch: Fetch,
        page: fs::DirPage,
        asked: Instant,
    ) -> Found {
        let mut state = self.state.lock();
        if state.dropped > fetch.epoch {
            return Found::Unknown;
        }
        let at = page
            .entries
            .binary_search_by(|e| e.name.as_slice().cmp(name));
        let found = match at {
            Ok(i) => usable(&state.changed, &page.entries[i], fetch.epoch)
                .map_or(Found::Unknown, Found::Attr),
            Err(i) if i < page.entries.len() || page.done => Found::Absent,
            Err(_) => Found::Unknown,
        };
        let d = state.dir(dir);
        if found == Found::Absent {
            // Not a walk through names that exist (files being made one by one).
            d.seed = None;
        }
        // A walk's next page replaces the one it continues.
        d.drop_pages(|p| p.last() != Some(fetch.after.as_slice()));
        if d.pages.len() >= MAX_PAGES {
            let mut first = true;
            d.drop_pages(|_| !std::mem::take(&mut first));
        }
        let finished = at.is_ok_and(|i| i + 1 == page.entries.len());
        d.pages.push_back(Page {
            after: Some(fetch.after),
            entries: page.entries,
            done: page.done,
            at: asked,
            epoch: fetch.epoch,
            window: fetch.window,
            finished,
            hits: 0,
        });
        found
    }

    /// The metadata server no longer has `ino` (a call naming it found nothing, as
    /// when another client removed it): what pages say of it goes, so that the lookup
    /// the kernel sends next asks the server.
    pub(crate) fn gone(&self, ino: InodeId) {
        let mut state = self.state.lock();
        state.epoch += 1;
        state.mark_changed(vec![ino]);
    }

    /// Forgets what `req`, about to be sent, may change.
    pub(crate) fn before(&self, req: &FsRequest) {
        use FsRequest as R;
        let keeps = super::changes_nothing(req);
        if keeps {
            return;
        }
        let mut guard = self.state.lock();
        let state = &mut *guard;
        state.epoch += 1;
        let mut changed = Vec::with_capacity(2);
        let known = match req {
            // Changes of one inode's attributes.
            R::Append(fs::Append { ino, .. })
            | R::Open(fs::Open { ino, .. })
            | R::Commit(fs::Commit { ino, .. })
            | R::TailCut(fs::TailCut { ino, .. })
            | R::SetAttr(fs::SetAttr { ino, .. })
            | R::SetXattr(fs::SetXattr { ino, .. })
            | R::RemoveXattr(fs::RemoveXattr { ino, .. })
            | R::Accessed(fs::Accessed { ino, .. }) => {
                changed.push(*ino);
                true
            }
            // A new name changes its directory's times; a page never says a name is
            // missing, so none is wrong about the new one.
            R::Create(fs::Create { parent, .. })
            | R::Mkdir(fs::Mkdir { parent, .. })
            | R::MkNod(fs::MkNod { parent, .. })
            | R::Symlink(fs::Symlink { parent, .. }) => {
                changed.push(*parent);
                true
            }
            R::Link(fs::Link {
                ino, new_parent, ..
            }) => {
                changed.extend([*ino, *new_parent]);
                true
            }
            // A name removed: its entry goes, and its inode (another name of it may be
            // in a page: its link count moved) counts as changed, if a page of the
            // directory says which inode it was (`rm -r` and the like look it up
            // first); if none does, every page goes.
            R::Unlink(fs::Unlink { parent, name }) | R::Rmdir(fs::Rmdir { parent, name }) => {
                changed.push(*parent);
                let gone = state.dirs.get_mut(parent).and_then(|d| {
                    d.pages.iter_mut().find_map(|p| {
                        let i = p.entries.binary_search_by(|e| e.name.cmp(name)).ok()?;
                        // Kept without attributes (looked up again if asked for): the
                        // page's end still tells where a walk goes on.
                        p.entries[i].attr = None;
                        Some(p.entries[i].ino)
                    })
                });
                changed.extend(gone);
                gone.is_some()
            }
            // A rename, and whatever else may move a name or change an inode the
            // request does not name.
            _ => false,
        };
        if !known {
            state.drop_all();
            return;
        }
        state.mark_changed(changed);
    }
}

/// A cursor just before `name`: a listing strictly after it starts with `name`, or
/// with the few names that extend the cursor. `None` for a name whose last byte is zero
/// (no file name has one).
fn cursor_before(name: &[u8]) -> Option<Vec<u8>> {
    let (&last, head) = name.split_last()?;
    let mut c = head.to_vec();
    c.push(last.checked_sub(1)?);
    Some(c)
}

#[cfg(test)]
mod tests;
