//! A path's attributes: `chmod`, `chown` and `utimensat` (links followed), each one
//! `setattr` on the metadata server, and extended attributes (`getxattr`, `setxattr`,
//! `listxattr`, `removexattr`). The metadata server applies the rules of a local file
//! system to the caller, as for a mount's requests.

use super::types::timestamp;
use super::{Result, Tessera};
pub use proto::meta::XattrMode;
use proto::{InodeId, SetAttr, TimeSet};
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

    /// The value of extended attribute `name` of `path` (its link's own with
    /// `follow` false, as `lgetxattr(2)`); `NoData` (ENODATA) when it has none.
    pub fn get_xattr(&self, path: &str, name: &[u8], follow: bool) -> Result<Vec<u8>> {
        let sh = self.sh();
        sh.block_on(async {
            let ino = self.inode_of(path, follow).await?;
            sh.client.getxattr(ino, name).await
        })
    }

    /// Sets extended attribute `name` of `path` to `value`, as `setxattr(2)` with the
    /// flags `mode` stands for. Names are namespaced as on Linux (`user.`,
    /// `trusted.`, `security.`); `user.tessera.replicas` sets how many copies a file
    /// (or a directory's new files) keeps.
    pub fn set_xattr(
        &self,
        path: &str,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
        follow: bool,
    ) -> Result<()> {
        let sh = self.sh();
        sh.block_on(async {
            let ino = self.inode_of(path, follow).await?;
            sh.client.setxattr(ino, name, value, mode).await
        })
    }

    /// The names of `path`'s extended attributes that the caller may see.
    pub fn list_xattr(&self, path: &str, follow: bool) -> Result<Vec<Vec<u8>>> {
        let sh = self.sh();
        sh.block_on(async {
            let ino = self.inode_of(path, follow).await?;
            sh.client.listxattr(ino).await
        })
    }

    /// Removes extended attribute `name` of `path`; `NoData` when it has none.
    pub fn remove_xattr(&self, path: &str, name: &[u8], follow: bool) -> Result<()> {
        let sh = self.sh();
        sh.block_on(async {
            let ino = self.inode_of(path, follow).await?;
            sh.client.removexattr(ino, name).await
        })
    }

    async fn inode_of(&self, path: &str, follow: bool) -> Result<InodeId> {
        let sh = self.sh();
        Ok(sh.paths.resolve(&sh.client, path, follow).await?.ino)
    }

    fn set_attr(&self, path: &str, set: SetAttr) -> Result<()> {
        let sh = self.sh();
        sh.block_on(async {
            let ino = self.inode_of(path, true).await?;
            sh.client.setattr(ino, set).await.map(drop)
        })
    }
}
