//! Paths to inodes for the library API: one lookup per name, symbolic links followed,
//! the directories walked kept for a while (as the kernel keeps a mount's dentries).

use super::path::{canonical, components, spliced, split_last};
use crate::client::Client;
use crate::error::{ClientError, Result};
use parking_lot::Mutex;
use proto::{Attr, FileKind, InodeId};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Symbolic links followed in one resolution at most, as Linux's `MAXSYMLINKS`.
const MAX_SYMLINKS: usize = 40;
/// Directories kept at most; past it the map is emptied and fills again.
const MAX_KEPT_DIRS: usize = 16_384;

/// Resolves paths, keeping the inode of each directory walked for `ttl`.
pub(super) struct Resolver {
    ttl: Duration,
    dirs: Mutex<HashMap<String, (InodeId, Instant)>>,
}

impl Resolver {
    pub(super) fn new(ttl: Duration) -> Resolver {
        Resolver {
            ttl,
            dirs: Mutex::new(HashMap::new()),
        }
    }

    /// Forgets every directory kept: after a rename or removal of one by this client
    /// (the kernel drops such dentries at once too; other clients' changes are seen
    /// after the TTL, as through a mount).
    pub(super) fn forget(&self) {
        self.dirs.lock().clear();
    }

    fn kept(&self, key: &str) -> Option<InodeId> {
        let mut dirs = self.dirs.lock();
        match dirs.get(key) {
            Some(&(ino, at)) if at.elapsed() < self.ttl => Some(ino),
            Some(_) => {
                dirs.remove(key);
                None
            }
            None => None,
        }
    }

    fn keep(&self, key: String, ino: InodeId) {
        if self.ttl.is_zero() {
            return;
        }
        let mut dirs = self.dirs.lock();
        if dirs.len() >= MAX_KEPT_DIRS {
            dirs.clear();
        }
        dirs.insert(key, (ino, Instant::now()));
    }

    /// The attributes of what `path` names; a symbolic link at its end is followed if
    /// `follow`, those before it always.
    pub(super) async fn resolve(&self, client: &Client, path: &str, follow: bool) -> Result<Attr> {
        let names: Vec<String> = components(path)?.into_iter().map(str::to_string).collect();
        self.walk(client, path, names, follow).await
    }

    /// The directory holding `path`'s last name, and that name.
    pub(super) async fn parent(&self, client: &Client, path: &str) -> Result<(InodeId, String)> {
        let (dir, name) = split_last(path)?;
        let name = name.to_string();
        if dir.is_empty() {
            return Ok((InodeId::ROOT, name));
        }
        let dir: Vec<String> = dir.into_iter().map(str::to_string).collect();
        let attr = self.walk(client, path, dir, true).await?;
        if attr.kind != FileKind::Directory {
            return Err(super::not_a_directory(path));
        }
        Ok((attr.ino, name))
    }

    /// Walks `names` from the root. After a symbolic link the walk starts again from
    /// the root with the link's target spliced in (the directories on the way are
    /// kept, so that costs no calls).
    async fn walk(
        &self,
        client: &Client,
        path: &str,
        mut names: Vec<String>,
        follow: bool,
    ) -> Result<Attr> {
        let mut links = 0;
        'walk: loop {
            let mut dir = InodeId::ROOT;
            for i in 0..names.len() {
                let last = i + 1 == names.len();
                let key = canonical(&str_refs(&names[..=i]));
                if !last {
                    if let Some(ino) = self.kept(&key) {
                        dir = ino;
                        continue;
                    }
                }
                let attr = client.lookup(dir, names[i].as_bytes()).await?;
                match attr.kind {
                    FileKind::Symlink if !last || follow => {
                        links += 1;
                        if links > MAX_SYMLINKS {
                            return Err(ClientError::SymlinkLoop(path.to_string()));
                        }
                        let target = client.readlink(attr.ino).await?;
                        let target = String::from_utf8(target).map_err(|_| {
                            ClientError::Invalid(format!("{path:?}: a link's target is not UTF-8"))
                        })?;
                        let refs = str_refs(&names);
                        let next = spliced(&refs[..i], &target, &refs[i + 1..]);
                        names = next.into_iter().map(str::to_string).collect();
                        continue 'walk;
                    }
                    _ if last => return Ok(attr),
                    FileKind::Directory => {
                        self.keep(key, attr.ino);
                        dir = attr.ino;
                    }
                    _ => return Err(super::not_a_directory(path)),
                }
            }
            // No names (the root itself, or a link to it).
            return client.getattr(InodeId::ROOT).await;
        }
    }
}

fn str_refs(names: &[String]) -> Vec<&str> {
    names.iter().map(String::as_str).collect()
}
