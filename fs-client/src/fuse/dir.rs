//! Directory handles: a window of entries paged from the metadata server with a stable
//! name cursor, so a directory of any size is listed in bounded memory.

use crate::client::Client;
use crate::error::Result;
use proto::meta::DirEntry;
use proto::Attr;
use proto::InodeId;

/// Entries asked for per page.
const PAGE_ENTRIES: u32 = 512;

/// The listing state of one `opendir`.
///
/// Offsets given to the kernel: 1 is ".", 2 is "..", and `3 + i` the i-th entry of the
/// listing. The handle keeps one page: sequential reads page forward by name cursor; a
/// rewind (an offset before the page) restarts from the top.
///
/// The kernel asks with `readdirplus` (entries with attributes, which spares `ls -l` a
/// lookup per name; the mount asks it to, always) or with plain `readdir`, and may
/// switch between them within one listing. A page is fetched in the mode asked for; on
/// a switch the rest of the page is fetched again, from the last name handed out, in
/// the new mode.
pub struct DirHandle {
    ino: InodeId,
    parent: InodeId,
    /// Listing position of `page[0]`.
    base: u64,
    page: Vec<DirEntry>,
    /// The name `page` was fetched after (`None`: from the top).
    page_after: Option<Vec<u8>>,
    /// Whether `page` carries attributes.
    page_plus: bool,
    done: bool,
}

/// One entry to hand to the kernel.
pub struct Listed {
    /// The offset of the entry that follows it.
    pub next_offset: u64,
    /// The entry's inode.
    pub ino: InodeId,
    /// Its kind.
    pub kind: proto::FileKind,
    /// Its name.
    pub name: Vec<u8>,
    /// Its attributes, in a `plus` listing (not for "." and "..").
    pub attr: Option<Attr>,
}

impl DirHandle {
    /// A handle on directory `ino` whose parent is `parent`.
    pub fn new(ino: InodeId, parent: InodeId) -> DirHandle {
        DirHandle {
            ino,
            parent,
            base: 0,
            page: Vec::new(),
            page_after: None,
            page_plus: false,
            done: false,
        }
    }

    /// Entries from listing position `offset` on, at most `max` of them; with their
    /// attributes if `plus`.
    pub async fn entries_from(
        &mut self,
        client: &Client,
        offset: u64,
        max: usize,
        plus: bool,
    ) -> Result<Vec<Listed>> {
        let mut out = Vec::new();
        let mut pos = offset;
        while pos < 2 && out.len() < max {
            let (name, ino) = if pos == 0 {
                (b".".to_vec(), self.ino)
            } else {
                (b"..".to_vec(), self.parent)
            };
            pos += 1;
            out.push(Listed {
                next_offset: pos,
                ino,
                kind: proto::FileKind::Directory,
                name,
                attr: None,
            });
        }
        let mut index = pos - 2;
        if index < self.base {
            self.base = 0;
            self.page.clear();
            self.page_after = None;
            self.done = false;
        }
        if self.page_plus != plus && index < self.base + self.page.len() as u64 {
            self.refetch_from(client, index, plus).await?;
        }
        while out.len() < max {
            if index >= self.base + self.page.len() as u64 {
                if !self.next_page(client, plus).await? {
                    break;
                }
                continue;
            }
            let e = &self.page[(index - self.base) as usize];
            index += 1;
            // A failure to ask again (the file just went) answers with the page's.
            let attr = match e.attr.clone() {
                Some(a) => Some(match client.fresh_overlay(a.clone()).await {
                    Ok(fresh) => fresh,
                    Err(_) => client.overlay(a),
                }),
                None => None,
            };
            out.push(Listed {
                next_offset: index + 2,
                ino: e.ino,
                kind: e.kind,
                name: e.name.clone(),
                attr,
            });
        }
        Ok(out)
    }

    /// Replaces the page by the next one; `false` at the end of the listing.
    async fn next_page(&mut self, client: &Client, plus: bool) -> Result<bool> {
        if self.done {
            return Ok(false);
        }
        let after = self
            .page
            .last()
            .map(|e| e.name.clone())
            .or(self.page_after.take());
        let base = self.base + self.page.len() as u64;
        self.fetch(client, base, after, plus).await?;
        Ok(!self.page.is_empty())
    }

    /// Fetches the page again from listing position `index` (inside the page) in the
    /// other mode: what follows the last name handed out, so nothing is skipped or
    /// repeated even if entries changed meanwhile.
    async fn refetch_from(&mut self, client: &Client, index: u64, plus: bool) -> Result<()> {
        let i = (index - self.base) as usize;
        let after = match i {
            0 => self.page_after.clone(),
            _ => Some(self.page[i - 1].name.clone()),
        };
        self.fetch(client, index, after, plus).await
    }

    async fn fetch(
        &mut self,
        client: &Client,
        base: u64,
        after: Option<Vec<u8>>,
        plus: bool,
    ) -> Result<()> {
        let (page, done) = client
            .readdir_page(self.ino, after.clone(), PAGE_ENTRIES, plus)
            .await?;
        self.base = base;
        self.page_after = after;
        self.page_plus = plus;
        // An empty page ends the listing even if the server did not say so: never spin.
        self.done = done || page.is_empty();
        self.page = page;
        Ok(())
    }
}
