//! Directory handles: a window of entries paged from the metadata server with a stable
//! name cursor, so a directory of any size is listed in bounded memory.

use crate::client::Client;
use crate::error::Result;
use proto::meta::DirEntry;
use proto::InodeId;

/// Entries asked for per page.
const PAGE_ENTRIES: u32 = 512;

/// The listing state of one `opendir`.
///
/// Offsets given to the kernel: 1 is ".", 2 is "..", and `3 + i` the i-th entry of the
/// listing. The handle keeps one page: sequential reads page forward by name cursor; a
/// rewind (an offset before the page) restarts from the top.
pub struct DirHandle {
    ino: InodeId,
    parent: InodeId,
    /// Listing position of `page[0]`.
    base: u64,
    page: Vec<DirEntry>,
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
}

impl DirHandle {
    /// A handle on directory `ino` whose parent is `parent`.
    pub fn new(ino: InodeId, parent: InodeId) -> DirHandle {
        DirHandle {
            ino,
            parent,
            base: 0,
            page: Vec::new(),
            done: false,
        }
    }

    /// Entries from listing position `offset` on, at most `max` of them.
    pub async fn entries_from(
        &mut self,
        client: &Client,
        offset: u64,
        max: usize,
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
            });
        }
        let mut index = pos - 2;
        if index < self.base {
            self.base = 0;
            self.page.clear();
            self.done = false;
        }
        while out.len() < max {
            if index >= self.base + self.page.len() as u64 {
                if !self.next_page(client).await? {
                    break;
                }
                continue;
            }
            let e = &self.page[(index - self.base) as usize];
            index += 1;
            out.push(Listed {
                next_offset: index + 2,
                ino: e.ino,
                kind: e.kind,
                name: e.name.clone(),
            });
        }
        Ok(out)
    }

    /// Replaces the page by the next one; `false` at the end of the listing.
    async fn next_page(&mut self, client: &Client) -> Result<bool> {
        if self.done {
            return Ok(false);
        }
        let after = self.page.last().map(|e| e.name.clone());
        let (page, done) = client
            .readdir_page(self.ino, after, PAGE_ENTRIES, false)
            .await?;
        self.base += self.page.len() as u64;
        // An empty page ends the listing even if the server did not say so: never spin.
        self.done = done || page.is_empty();
        self.page = page;
        Ok(!self.page.is_empty())
    }
}
