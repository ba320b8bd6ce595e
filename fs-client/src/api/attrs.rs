//! Changes of a path's attributes: `chmod`, `chown` and `utimensat` by path (links
//! followed), each one `setattr` on the metadata server, which applies the rules of a
//! local file system to the caller ([`crate::api`]'s caller).

use super::types::timestamp;
use super::{Result, Tessera};
use proto::{SetAttr, TimeSet};
use std::time::SystemTime;

impl Tessera {
    /// Sets the permission bits of what `path` names (links followed), as `chmod(2)`.
    pub fn set_permissions(&self, path: &str, mode: u32) -> Result<()> {
        let set = SetAttr {
            perm: Some(mode & 0o7777),
            ..SetAttr::default()
        };
        self.set_attr(path, set)
    }

    /// Sets the owner and group of what `path` names (`None`: left as it is), as
    /// `chown(2)`: a new owner only by root, a new group by the owner to a group it is
    /// in; the setuid and setgid bits of a file go as on a local file system.
    pub fn set_owner(&self, path: &str, uid: Option<u32>, gid: Option<u32>) -> Result<()> {
        let set = SetAttr {
            uid,
            gid,
            ..SetAttr::default()
        };
        self.set_attr(path, set)
    }

    /// Sets the access and modification times (`None`: left as they are), as
    /// `utimensat(2)`: explicit times only by the owner (or root).
    pub fn set_times(
        &self,
        path: &str,
        atime: Option<SystemTime>,
        mtime: Option<SystemTime>,
    ) -> Result<()> {
        let set = SetAttr {
            atime: atime.map(|t| TimeSet::At(timestamp(t))),
            mtime: mtime.map(|t| TimeSet::At(timestamp(t))),
            ..SetAttr::default()
        };
        self.set_attr(path, set)
    }

    /// Sets both times to the server's clock, as `utimensat(2)` with no times (`touch`):
    /// by the owner or anyone who may write the file.
    pub fn set_times_now(&self, path: &str) -> Result<()> {
        let set = SetAttr {
            atime: Some(TimeSet::Now),
            mtime: Some(TimeSet::Now),
            ..SetAttr::default()
        };
        self.set_attr(path, set)
    }

    fn set_attr(&self, path: &str, set: SetAttr) -> Result<()> {
        let sh = self.sh();
        sh.block_on(async {
            let attr = sh.paths.resolve(&sh.client, path, true).await?;
            sh.client.setattr(attr.ino, set).await.map(drop)
        })
    }
}
