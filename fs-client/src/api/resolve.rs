//! Paths to inodes for the library API: one lookup per name, symbolic links followed,
//! the directories walked kept for a while (as the kernel keeps a mount's dentries).

use super::path::{canonical, components, spliced};
use crate::client::Client;
use crate::error::{ClientError, Result};
use parking_lot::Mutex;
use proto::{Attr, ErrorCode, FileKind, InodeId};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Symbolic links followed in one resolution at most, as Linux's `MAXSYMLINKS`.
const MAX_SYMLINKS: usize = 40;
/// Directories kept at most; past it the map is emptied and fills again.
const MAX_KEPT_DIRS: usize = 16_384;

/// What a walk found at the last name.
enum Found {
    /// Looked up: its attributes.
    Looked(Attr),
    /// A directory known from the kept ones (only where the caller needs its inode).
    KeptDir(InodeId),
}

impl Found {
    fn ino_and_kind(&self) -> (InodeId, FileKind) {
        match self {
            Found::Looked(a) => (a.ino, a.kind),
            Found::KeptDir(ino) => (*ino, FileKind::Directory),
        }
    }
}

/// The target of the symbolic link `ino` (reached through `path`, named in errors).
pub(super) async fn link_target(client: &Client, ino: InodeId, path: &str) -> Result<String> {
    let target = client.readlink(ino).await?;
    String::from_utf8(target)
        .map_err(|_| ClientError::Invalid(format!("{path:?}: a link's target is not UTF-8")))
}

/// Resolves paths, keeping the inode of each directory walked for `ttl`.
pub(super) struct Resolver {
    ttl: Duration,
    dirs: Mutex<Kept>,
}

/// The directories kept, and a generation that every forget moves: a walk that began
/// before a forget keeps nothing it found (it may have seen the old name).
#[derive(Default)]
struct Kept {
    by_path: HashMap<String, (InodeId, Instant)>,
    generation: u64,
}

impl Resolver {
    pub(super) fn new(ttl: Duration) -> Resolver {
        Resolver {
            ttl,
            dirs: Mutex::new(Kept::default()),
        }
    }

    /// Forgets the directories at and under `path` (canonical): before and after this
    /// client renames or removes it (the kernel drops such dentries at once too; other
    /// clients' changes are seen after the TTL, as through a mount).
    pub(super) fn forget_under(&self, path: &str) {
        let mut kept = self.dirs.lock();
        kept.generation += 1;
        let under = format!("{}/", path.trim_end_matches('/'));
        kept.by_path
            .retain(|k, _| k != path && !k.starts_with(&under));
    }

    /// Forgets every directory kept.
    fn forget_all(&self) {
        let mut kept = self.dirs.lock();
        kept.generation += 1;
        kept.by_path.clear();
    }

    fn generation(&self) -> u64 {
        self.dirs.lock().generation
    }

    fn kept(&self, key: &str) -> Option<InodeId> {
        let mut kept = self.dirs.lock();
        match kept.by_path.get(key) {
            Some(&(ino, at)) if at.elapsed() < self.ttl => Some(ino),
            Some(_) => {
                kept.by_path.remove(key);
                None
            }
            None => None,
        }
    }

    /// Keeps `key`'s inode, unless a forget came since the walk began (`generation`).
    fn keep(&self, key: String, ino: InodeId, generation: u64) {
        if self.ttl.is_zero() {
            return;
        }
        let mut kept = self.dirs.lock();
        if kept.generation != generation {
            return;
        }
        if kept.by_path.len() >= MAX_KEPT_DIRS {
            kept.by_path.clear();
        }
        kept.by_path.insert(key, (ino, Instant::now()));
    }

    /// The attributes of what `path` names; a symbolic link at its end is followed if
    /// `follow`, those before it always.
    pub(super) async fn resolve(&self, client: &Client, path: &str, follow: bool) -> Result<Attr> {
        let names: Vec<String> = components(path)?.into_iter().map(str::to_string).collect();
        match self.walk_again(client, path, names, follow, false).await? {
            Found::Looked(attr) => Ok(attr),
            // Asked for no kept answer at the last name: the root, read afresh.
            Found::KeptDir(ino) => client.getattr(ino).await,
        }
    }

    /// The inode of the directory `names` (from the root) lead to, links followed; a
    /// kept one answers without a call.
    pub(super) async fn dir(&self, client: &Client, path: &str, names: &[&str]) -> Result<InodeId> {
        if names.is_empty() {
            return Ok(InodeId::ROOT);
        }
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let (ino, kind) = self
            .walk_again(client, path, names, true, true)
            .await?
            .ino_and_kind();
        if kind != FileKind::Directory {
            return Err(super::not_a_directory(path));
        }
        Ok(ino)
    }

    /// [`Resolver::walk`], once more from scratch if a lookup under a kept directory
    /// found nothing: the directory may have been renamed or removed by another client
    /// within the TTL (through a mount, the kernel revalidates such a dentry).
    async fn walk_again(
        &self,
        client: &Client,
        path: &str,
        names: Vec<String>,
        follow: bool,
        dir_ok: bool,
    ) -> Result<Found> {
        let mut used_kept = false;
        match self
            .walk(client, path, names.clone(), follow, dir_ok, &mut used_kept)
            .await
        {
            Err(e) if used_kept && matches!(e.code(), ErrorCode::NotFound | ErrorCode::Stale) => {
                self.forget_all();
                let mut again = false;
                self.walk(client, path, names, follow, dir_ok, &mut again)
                    .await
            }
            r => r,
        }
    }

    /// Walks `names` from the root. After a symbolic link the walk starts again from
    /// the root with the link's target spliced in (the directories on the way are
    /// kept, so that costs no calls). `dir_ok`: the last name may be answered from the
    /// kept directories too. `used_kept` is set when a kept directory was used.
    async fn walk(
        &self,
        client: &Client,
        path: &str,
        mut names: Vec<String>,
        follow: bool,
        dir_ok: bool,
        used_kept: &mut bool,
    ) -> Result<Found> {
        let generation = self.generation();
        let mut links = 0;
        'walk: loop {
            let mut dir = InodeId::ROOT;
            for i in 0..names.len() {
                let last = i + 1 == names.len();
                let key = canonical(&str_refs(&names[..=i]));
                if !last || dir_ok {
                    if let Some(ino) = self.kept(&key) {
                        *used_kept = true;
                        if last {
                            return Ok(Found::KeptDir(ino));
                        }
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
                        let target = link_target(client, attr.ino, path).await?;
                        let refs = str_refs(&names);
                        let next = spliced(&refs[..i], &target, &refs[i + 1..]);
                        names = next.into_iter().map(str::to_string).collect();
                        continue 'walk;
                    }
                    FileKind::Directory => {
                        self.keep(key, attr.ino, generation);
                        if last {
                            return Ok(Found::Looked(attr));
                        }
                        dir = attr.ino;
                    }
                    _ if last => return Ok(Found::Looked(attr)),
                    _ => return Err(super::not_a_directory(path)),
                }
            }
            // No names (the root itself, or a link to it).
            return Ok(Found::KeptDir(InodeId::ROOT));
        }
    }
}

fn str_refs(names: &[String]) -> Vec<&str> {
    names.iter().map(String::as_str).collect()
}
