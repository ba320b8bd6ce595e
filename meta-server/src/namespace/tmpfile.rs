//! Unnamed files (`O_TMPFILE`): made open with no link, as a file unlinked while open.
//!
//! The new inode carries the orphan mark from its first batch, so the machinery of
//! files unlinked while open frees it: its last session's end deletes it and queues its
//! chunks' deletion, and a restart purges it (no session survives one). A link names
//! it and takes the mark away, but only for a file opened without `O_EXCL` and still
//! open: the kernel refuses the others first, this keeps a client speaking the wire
//! itself to the same rule.

use super::files::reserve_session;
use super::txn::Reads;
use super::{keys, Namespace, Opened, SessionOwner};
use crate::error::MetaError;
use proto::meta::Caller;
use proto::InodeId;

impl Namespace {
    /// Makes an unnamed regular file with `parent`'s layout for `caller` and opens it
    /// for `owner`; `linkable` lets a later [`Namespace::link`] name it.
    pub fn tmpfile(
        &self,
        parent: InodeId,
        perm: u32,
        caller: Caller,
        linkable: bool,
        owner: SessionOwner,
    ) -> Result<Opened, MetaError> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let mut txn = self.begin(st);
        let parent_rec = txn.dir(parent)?;
        let (ino, mut rec) = self.new_inode(&mut txn, parent, &parent_rec, perm, caller)?;
        rec.nlink = 0;
        txn.put_inode(ino, &rec)?;
        txn.put(keys::orphan(ino), super::records::encode(&())?);
        let session = reserve_session(st, &mut txn, ino, owner.access.writes())?;
        self.answer_open_with_mark(&txn, (ino, &rec), session, None, false)?;
        Self::commit_txn(st, txn)?;
        let opened = self.start_session(st, session, ino, &rec, owner, false);
        if linkable {
            // Files closed since (freed, or linked) leave the set here: it holds open
            // ones only, so it is bounded by the open sessions.
            let open = &st.open_counts;
            st.linkable.retain(|i| open.get(i).is_some_and(|&n| n > 0));
            st.linkable.insert(ino);
        }
        tracing::debug!(%ino, %parent, linkable, "unnamed file made");
        Ok(opened)
    }
}
