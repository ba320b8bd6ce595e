//! Directory listings, a page at a time, resumable after any name.

use super::records::DirentRecord;
use super::txn::Reads;
use super::{keys, DirPage, Namespace, MAX_READDIR_ENTRIES, READDIR_BUDGET_BYTES};
use crate::error::MetaError;
use proto::meta::DirEntry;
use proto::InodeId;

impl Namespace {
    /// Lists directory `ino` in name order, starting strictly after `after`.
    ///
    /// The cursor is a name, not a position, so entries added or removed between pages
    /// never make the listing repeat or skip an entry that stayed. A page holds at most
    /// `max_entries` (1 to [`MAX_READDIR_ENTRIES`]) entries and [`READDIR_BUDGET_BYTES`]
    /// of them encoded. `.` and `..` are not listed: the client adds them.
    ///
    /// A first page that holds the whole directory says at which ctime it does: read
    /// before and after the scan and equal, so no change came between (every change
    /// moves the ctime, and a change's entries and ctime are staged together).
    pub fn readdir(
        &self,
        ino: InodeId,
        after: Option<&[u8]>,
        max_entries: u32,
        plus: bool,
    ) -> Result<DirPage, MetaError> {
        let r = self.reads();
        let ctime = r.dir(ino)?.ctime;
        // Zero would make a client that pages until `done` loop forever: return one.
        let want = max_entries.clamp(1, MAX_READDIR_ENTRIES) as usize;
        let prefix = keys::dirent_prefix(ino);
        let start = match after {
            Some(name) => keys::successor(&keys::dirent(ino, name)),
            None => prefix.clone(),
        };
        // One row more than wanted tells whether anything follows the page.
        let rows = r.scan(&start, &keys::prefix_end(&prefix), want + 1)?;
        let mut done = rows.len() <= want;
        let mut entries = Vec::with_capacity(rows.len().min(want));
        let mut budget = READDIR_BUDGET_BYTES;
        for (k, v) in rows.into_iter().take(want) {
            let d: DirentRecord = super::records::decode(&v, "directory entry")?;
            let name = &k[prefix.len()..];
            let (mut child, mut kind) = (InodeId(d.ino), d.kind);
            let attr = if plus {
                match r.try_inode(child)? {
                    Some(rec) => Some(r.attr_of(child, &rec)?),
                    // Gone since the scan: unlinked meanwhile, or a rename put another
                    // inode under the name (on an embedded store the scan and the inode
                    // are two reads), which must not make the name look missing.
                    None => match self.lookup(ino, name) {
                        Ok(a) => {
                            (child, kind) = (a.ino, a.kind);
                            Some(a)
                        }
                        Err(MetaError::NotFound(_)) => continue,
                        Err(e) => return Err(e),
                    },
                }
            } else {
                None
            };
            let entry = DirEntry {
                name: name.to_vec(),
                ino: child,
                kind,
                attr,
            };
            let size = proto::codec::encode(&entry, usize::MAX)
                .map_err(|e| MetaError::Corrupt(format!("cannot encode an entry: {e}")))?
                .len();
            // The first entry always goes in, so every page makes progress.
            if size > budget && !entries.is_empty() {
                done = false;
                break;
            }
            budget = budget.saturating_sub(size);
            entries.push(entry);
        }
        let whole = done && after.is_none();
        let complete_at = match whole {
            true if r.dir(ino)?.ctime == ctime => Some(ctime),
            _ => None,
        };
        Ok(DirPage {
            entries,
            done,
            complete_at,
        })
    }
}
