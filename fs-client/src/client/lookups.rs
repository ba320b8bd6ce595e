//! Finding a name in a directory: answered without a call where the client knows
//! (`cache/dirnames.rs`: a missing name; `cache/scans.rs`: a name ahead of a walk in
//! name order), else one call to the metadata server, a plain `Lookup` or, for a walk,
//! a page of the listing with attributes that answers the lookups that follow.

use super::Client;
use crate::cache::scans::{Found, Plan};
use crate::error::{ClientError, Result};
use proto::meta::fs;
use proto::{Attr, InodeId};
use std::time::{Duration, Instant};

impl Client {
    /// Finds `name` in `parent`.
    pub async fn lookup(&self, parent: InodeId, name: &[u8]) -> Result<Attr> {
        self.lookup_aged(parent, name).await.map(|(attr, _)| attr)
    }

    /// `name`'s attributes in `parent` if a page of a walk holds them and they need no
    /// call (no appends of this client's wait to be placed), with their age: what the
    /// mount answers on its own thread. `None` leaves it to [`Client::lookup_aged`].
    pub(crate) fn lookup_kept(&self, parent: InodeId, name: &[u8]) -> Option<(Attr, Duration)> {
        // A name whose removal is on its way: the page still shows it.
        if matches!(name, b"." | b"..") || self.removes.is_pending(parent, name) {
            return None;
        }
        let hit = self.scans.hit(parent, name)?;
        if self
            .live_file(hit.attr.ino)
            .is_some_and(|st| !st.appends_idle())
        {
            return None;
        }
        Some((self.overlay(hit.attr), hit.age))
    }

    /// [`Client::lookup`], with the age of what answered it: how long ago the server
    /// was asked (zero for a call made now), so that the kernel trusts it only for the
    /// rest of the entry TTL.
    pub(crate) async fn lookup_aged(
        &self,
        parent: InodeId,
        name: &[u8],
    ) -> Result<(Attr, Duration)> {
        // The kernel turns a file handle into an inode with a lookup of "." in the
        // inode it names, and finds a directory's parent with one of ".." (export
        // operations: `open_by_handle_at`, NFS); no name lookup asks either.
        match name {
            b"." => return Ok((self.getattr(parent).await?, Duration::ZERO)),
            b".." => {
                let attr = self.meta(fs::LookupParent { dir: parent }).await?;
                return Ok((self.overlay(attr), Duration::ZERO));
            }
            _ => {}
        }
        // What this client keeps may show a name whose removal is on its way.
        self.removes
            .wait(super::removes::Fence::Name(parent, name))
            .await;
        if self.name_known_absent(parent, name) {
            return Err(absent(parent, name));
        }
        match self.scans.plan(parent, name) {
            Plan::Hit(hit) => return Ok((self.fresh_overlay(hit.attr).await?, hit.age)),
            Plan::Fetch(fetch) => {
                let req = fs::ReadDir {
                    ino: parent,
                    after: Some(fetch.after.clone()),
                    max_entries: fetch.window,
                    plus: true,
                };
                let asked = Instant::now();
                // A directory this caller may search but not list answers plain lookups
                // all the same: any failure is left to one.
                match self.meta(req).await {
                    Ok(page) => match self.scans.fetched(parent, name, fetch, page, asked) {
                        Found::Attr(attr) => {
                            return Ok((self.fresh_overlay(attr).await?, asked.elapsed()))
                        }
                        Found::Absent => return Err(absent(parent, name)),
                        Found::Unknown => {}
                    },
                    Err(_) => self.scans.refused(parent),
                }
            }
            Plan::Lookup => {}
        }
        let req = fs::Lookup {
            parent,
            name: name.to_vec(),
        };
        let attr = self.meta(req).await?;
        self.scans.found(parent, name);
        Ok((self.fresh_overlay(attr).await?, Duration::ZERO))
    }
}

fn absent(parent: InodeId, name: &[u8]) -> ClientError {
    ClientError::KnownAbsent(format!("no {} in {parent}", String::from_utf8_lossy(name)))
}
