//! Model-based test: random sequences of namespace operations through the `Client` API,
//! each checked against an in-memory model (expected result or error code), the whole
//! tree compared with the model regularly, and the metadata server restarted at random
//! points. The seed is printed; rerun one with `TESSERA_MODEL_SEED=<n>`.

use proto::meta::{Caller, RenameMode, XattrMode};
use proto::{Attr, ErrorCode, FileKind, InodeId, SetAttr};
use std::collections::{BTreeMap, HashMap};
use tessera_tests::{InProcessCluster, Rng};

const ROOT: Caller = Caller::ROOT;
const NAMES: [&str; 5] = ["a", "b", "c", "dd", "e"];
const STEPS: usize = 300;

#[derive(Clone, Debug, PartialEq)]
enum Node {
    Dir {
        perm: u32,
    },
    /// A regular file: `tag` names the inode, shared by its hard links.
    File {
        tag: u64,
    },
    /// A symlink: `tag` names its inode too (a symlink can have hard links).
    Symlink {
        tag: u64,
        target: String,
    },
}

#[derive(Clone, Debug, Default, PartialEq)]
struct FileData {
    perm: u32,
    size: u64,
    xattrs: BTreeMap<String, Vec<u8>>,
}

/// What the namespace should be: paths ("" is the root, "a/b" below it) to nodes.
#[derive(Default)]
struct Model {
    nodes: BTreeMap<String, Node>,
    files: HashMap<u64, FileData>,
    next_tag: u64,
}

fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
}

fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

impl Model {
    fn new() -> Model {
        let mut m = Model::default();
        m.nodes.insert(String::new(), Node::Dir { perm: 0o755 });
        m
    }
    fn dirs(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|(_, n)| matches!(n, Node::Dir { .. }))
            .map(|(p, _)| p.clone())
            .collect()
    }
    fn children(&self, dir: &str) -> Vec<String> {
        self.nodes
            .keys()
            .filter(|p| !p.is_empty() && split(p).0 == dir)
            .cloned()
            .collect()
    }
    fn links(&self, tag: u64) -> usize {
        self.nodes
            .values()
            .filter(|n| match n {
                Node::File { tag: t } | Node::Symlink { tag: t, .. } => *t == tag,
                Node::Dir { .. } => false,
            })
            .count()
    }
    /// Moves `from` (and, for a directory, everything below it) to `to`.
    fn move_tree(&mut self, from: &str, to: &str) {
        let prefix = format!("{from}/");
        let moved: Vec<String> = self
            .nodes
            .keys()
            .filter(|p| *p == from || p.starts_with(&prefix))
            .cloned()
            .collect();
        for p in moved {
            let n = self.nodes.remove(&p).expect("listed");
            self.nodes.insert(format!("{to}{}", &p[from.len()..]), n);
        }
    }
    fn remove(&mut self, path: &str) {
        if let Some(Node::File { tag }) = self.nodes.remove(path) {
            if self.links(tag) == 0 {
                self.files.remove(&tag);
            }
        }
    }
}

async fn resolve(c: &fs_client::Client, path: &str) -> Result<Attr, ErrorCode> {
    let mut attr = c.getattr(InodeId::ROOT).await.map_err(|e| e.code())?;
    for name in path.split('/').filter(|s| !s.is_empty()) {
        attr = c
            .lookup(attr.ino, name.as_bytes())
            .await
            .map_err(|e| e.code())?;
    }
    Ok(attr)
}

fn outcome<T>(r: Result<T, fs_client::ClientError>) -> Result<(), ErrorCode> {
    r.map(drop).map_err(|e| e.code())
}

/// The expected result of renaming `src` to `dst` in the model (and applies it).
fn model_rename(m: &mut Model, src: &str, dst: &str) -> Result<(), ErrorCode> {
    let Some(s) = m.nodes.get(src).cloned() else {
        return Err(ErrorCode::NotFound);
    };
    if src == dst {
        return Ok(());
    }
    if dst.starts_with(&format!("{src}/")) {
        return Err(ErrorCode::InvalidArgument);
    }
    match (m.nodes.get(dst).cloned(), &s) {
        (None, _) => {}
        // Two names of one inode: POSIX says succeed and do nothing.
        (Some(d), _) if d == s && !matches!(s, Node::Dir { .. }) => return Ok(()),
        (Some(Node::Dir { .. }), Node::Dir { .. }) => {
            if !m.children(dst).is_empty() {
                return Err(ErrorCode::NotEmpty);
            }
            m.nodes.remove(dst);
        }
        (Some(Node::Dir { .. }), _) => return Err(ErrorCode::IsADirectory),
        (Some(_), Node::Dir { .. }) => return Err(ErrorCode::NotADirectory),
        (Some(_), _) => m.remove(dst),
    }
    m.move_tree(src, dst);
    Ok(())
}

/// Runs one random operation against the cluster and the model; both must agree.
async fn step(c: &fs_client::Client, m: &mut Model, rng: &mut Rng) -> (String, bool) {
    let dirs = m.dirs();
    let parent = rng.pick(&dirs).clone();
    let name = *rng.pick(&NAMES);
    let path = join(&parent, name);
    let paths: Vec<String> = m.nodes.keys().filter(|p| !p.is_empty()).cloned().collect();
    let existing = if paths.is_empty() {
        path.clone()
    } else {
        rng.pick(&paths).clone()
    };
    let pino = resolve(c, &parent).await.expect("model dirs exist").ino;
    let op = rng.index(11);
    let (what, got, want): (String, Result<(), ErrorCode>, Result<(), ErrorCode>) = match op {
        0 => {
            let got = match c
                .create(pino, name.as_bytes(), 0o640, ROOT, true, false)
                .await
            {
                Ok((_, fh)) => outcome(c.release(&fh).await),
                Err(e) => Err(e.code()),
            };
            let want = if m.nodes.contains_key(&path) {
                Err(ErrorCode::AlreadyExists)
            } else {
                m.next_tag += 1;
                m.nodes.insert(path.clone(), Node::File { tag: m.next_tag });
                m.files.insert(
                    m.next_tag,
                    FileData {
                        perm: 0o640,
                        ..Default::default()
                    },
                );
                Ok(())
            };
            (format!("create {path}"), got, want)
        }
        1 => {
            let got = outcome(c.mkdir(pino, name.as_bytes(), 0o750, ROOT).await);
            let want = if m.nodes.contains_key(&path) {
                Err(ErrorCode::AlreadyExists)
            } else {
                m.nodes.insert(path.clone(), Node::Dir { perm: 0o750 });
                Ok(())
            };
            (format!("mkdir {path}"), got, want)
        }
        2 => {
            let target = format!("t-{}", rng.index(100));
            let got = outcome(
                c.symlink(pino, name.as_bytes(), target.as_bytes(), ROOT)
                    .await,
            );
            let want = if m.nodes.contains_key(&path) {
                Err(ErrorCode::AlreadyExists)
            } else {
                m.next_tag += 1;
                m.nodes.insert(
                    path.clone(),
                    Node::Symlink {
                        tag: m.next_tag,
                        target,
                    },
                );
                Ok(())
            };
            (format!("symlink {path}"), got, want)
        }
        3 => {
            let src = resolve(c, &existing).await;
            let got = match &src {
                Ok(a) => outcome(c.link(a.ino, pino, name.as_bytes(), false).await),
                Err(e) => Err(*e),
            };
            // As link(2): an existing new name (EEXIST, `filename_create`) before the
            // rule that a directory has no hard links (EPERM, `vfs_link`).
            let want = match m.nodes.get(&existing).cloned() {
                None => Err(ErrorCode::NotFound),
                Some(_) if m.nodes.contains_key(&path) => Err(ErrorCode::AlreadyExists),
                Some(Node::Dir { .. }) => Err(ErrorCode::NotPermitted),
                Some(n) => {
                    m.nodes.insert(path.clone(), n);
                    Ok(())
                }
            };
            (format!("link {existing} -> {path}"), got, want)
        }
        4 => {
            let (sp, sn) = split(&existing);
            let sino = resolve(c, sp).await.map(|a| a.ino);
            let got = match sino {
                Ok(s) => outcome(
                    c.rename(s, sn.as_bytes(), pino, name.as_bytes(), RenameMode::Replace)
                        .await,
                ),
                Err(e) => Err(e),
            };
            let want = model_rename(m, &existing, &path);
            (format!("rename {existing} -> {path}"), got, want)
        }
        5 => {
            let (dp, dn) = split(&existing);
            let dino = resolve(c, dp).await.expect("parent exists").ino;
            let got = outcome(c.unlink(dino, dn.as_bytes()).await);
            let want = match m.nodes.get(&existing) {
                None => Err(ErrorCode::NotFound),
                Some(Node::Dir { .. }) => Err(ErrorCode::IsADirectory),
                Some(_) => {
                    m.remove(&existing);
                    Ok(())
                }
            };
            (format!("unlink {existing}"), got, want)
        }
        6 => {
            let (dp, dn) = split(&existing);
            let dino = resolve(c, dp).await.expect("parent exists").ino;
            let got = outcome(c.rmdir(dino, dn.as_bytes()).await);
            let want = match m.nodes.get(&existing) {
                None => Err(ErrorCode::NotFound),
                Some(Node::Dir { .. }) if !m.children(&existing).is_empty() => {
                    Err(ErrorCode::NotEmpty)
                }
                Some(Node::Dir { .. }) => {
                    m.nodes.remove(&existing);
                    Ok(())
                }
                Some(_) => Err(ErrorCode::NotADirectory),
            };
            (format!("rmdir {existing}"), got, want)
        }
        7 | 8 => file_step(c, m, rng, &existing, op == 7).await,
        _ => xattr_step(c, m, rng, &existing).await,
    };
    assert_eq!(got, want, "{what}");
    (what, got.is_ok())
}

/// chmod, or a write / truncate (through an open, as applications do).
async fn file_step(
    c: &fs_client::Client,
    m: &mut Model,
    rng: &mut Rng,
    path: &str,
    chmod: bool,
) -> (String, Result<(), ErrorCode>, Result<(), ErrorCode>) {
    let Some(Node::File { tag }) = m.nodes.get(path).cloned() else {
        return (format!("skip {path}"), Ok(()), Ok(()));
    };
    let ino = resolve(c, path).await.expect("exists").ino;
    let f = m.files.get_mut(&tag).expect("file data");
    if chmod {
        let perm = 0o600 | (rng.index(8) as u32) << 3;
        f.perm = perm;
        let set = SetAttr {
            perm: Some(perm),
            ..Default::default()
        };
        return (
            format!("chmod {path}"),
            outcome(c.setattr(ino, set).await),
            Ok(()),
        );
    }
    let (_, fh) = c.open(ino, false).await.expect("open");
    let got = if rng.index(2) == 0 {
        let at = rng.index(70_000) as u64;
        let data = vec![7u8; 1 + rng.index(5000)];
        f.size = f.size.max(at + data.len() as u64);
        outcome(c.write(&fh, at, &data).await)
    } else {
        let size = rng.index(90_000) as u64;
        f.size = size;
        outcome(
            c.setattr(
                ino,
                SetAttr {
                    size: Some(size),
                    ..Default::default()
                },
            )
            .await,
        )
    };
    c.release(&fh).await.expect("release");
    (format!("write/truncate {path}"), got, Ok(()))
}

async fn xattr_step(
    c: &fs_client::Client,
    m: &mut Model,
    rng: &mut Rng,
    path: &str,
) -> (String, Result<(), ErrorCode>, Result<(), ErrorCode>) {
    let Some(Node::File { tag }) = m.nodes.get(path).cloned() else {
        return (format!("skip {path}"), Ok(()), Ok(()));
    };
    let ino = resolve(c, path).await.expect("exists").ino;
    let key = format!("user.k{}", rng.index(3));
    let f = m.files.get_mut(&tag).expect("file data");
    if rng.index(3) == 0 {
        let got = outcome(c.removexattr(ino, key.as_bytes()).await);
        let want = f.xattrs.remove(&key).map(drop).ok_or(ErrorCode::NoData);
        return (format!("removexattr {path} {key}"), got, want);
    }
    let value = vec![rng.index(256) as u8; rng.index(300)];
    f.xattrs.insert(key.clone(), value.clone());
    let got = outcome(
        c.setxattr(ino, key.as_bytes(), &value, XattrMode::Upsert)
            .await,
    );
    (format!("setxattr {path} {key}"), got, Ok(()))
}

/// Walks the whole namespace and compares it with the model.
async fn check_tree(c: &fs_client::Client, m: &Model, seed: u64) {
    let mut seen = BTreeMap::new();
    let mut stack = vec![(String::new(), InodeId::ROOT)];
    while let Some((path, ino)) = stack.pop() {
        for e in c.readdir_all(ino).await.expect("readdir") {
            let p = join(&path, std::str::from_utf8(&e.name).expect("utf-8 names"));
            let attr = c.getattr(e.ino).await.expect("getattr of a listed entry");
            if e.kind == FileKind::Directory {
                stack.push((p.clone(), e.ino));
            }
            seen.insert(p, (e.kind, attr));
        }
    }
    let want: Vec<&String> = m.nodes.keys().filter(|p| !p.is_empty()).collect();
    assert_eq!(
        seen.keys().collect::<Vec<_>>(),
        want,
        "seed {seed}: the set of paths"
    );
    for (p, (kind, attr)) in &seen {
        match &m.nodes[p] {
            Node::Dir { perm } => {
                let subdirs = m
                    .children(p)
                    .iter()
                    .filter(|c| matches!(m.nodes[*c], Node::Dir { .. }))
                    .count();
                assert_eq!(
                    (*kind, attr.perm, attr.nlink),
                    (FileKind::Directory, *perm, 2 + subdirs as u32),
                    "seed {seed}: {p}"
                );
            }
            Node::File { tag } => {
                let f = &m.files[tag];
                assert_eq!(
                    (*kind, attr.perm, attr.size),
                    (FileKind::Regular, f.perm, f.size),
                    "seed {seed}: {p}"
                );
                assert_eq!(
                    attr.nlink as usize,
                    m.links(*tag),
                    "seed {seed}: links of {p}"
                );
                let names: Vec<String> = c
                    .listxattr(attr.ino)
                    .await
                    .expect("listxattr")
                    .into_iter()
                    .map(|n| String::from_utf8(n).expect("utf-8"))
                    .collect();
                assert_eq!(
                    names,
                    f.xattrs.keys().cloned().collect::<Vec<_>>(),
                    "seed {seed}: xattrs of {p}"
                );
            }
            Node::Symlink { tag, target } => {
                assert_eq!(*kind, FileKind::Symlink, "seed {seed}: {p}");
                assert_eq!(
                    attr.nlink as usize,
                    m.links(*tag),
                    "seed {seed}: links of {p}"
                );
                assert_eq!(
                    c.readlink(attr.ino).await.expect("readlink"),
                    target.as_bytes(),
                    "seed {seed}: {p}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_namespace_operations_match_the_model_across_metadata_restarts() {
    let seed: u64 = std::env::var("TESSERA_MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                | 1
        });
    eprintln!("model test seed {seed} (rerun with TESSERA_MODEL_SEED={seed})");
    let mut cluster = InProcessCluster::start(2).await;
    let client = cluster.client().await;
    let (mut model, mut rng) = (Model::new(), Rng::new(seed));
    let (mut restarts, mut succeeded) = (0, 0);
    let trace = std::env::var_os("TESSERA_MODEL_TRACE").is_some();
    for i in 0..STEPS {
        let (what, ok) = step(&client, &mut model, &mut rng).await;
        succeeded += usize::from(ok && !what.starts_with("skip"));
        if trace {
            eprintln!("{i}: {what} -> {}", if ok { "ok" } else { "error" });
        }
        if rng.index(25) == 0 {
            cluster.restart_meta().await;
            restarts += 1;
            if trace {
                eprintln!("{i}: metadata server restarted");
            }
            // The next idempotent call notices the old connection is gone and reconnects,
            // so later non-idempotent calls are not lost to a dead socket.
            client
                .getattr(InodeId::ROOT)
                .await
                .expect("reconnect after restart");
            check_tree(&client, &model, seed).await;
        }
        if i % 50 == 49 {
            check_tree(&client, &model, seed).await;
        }
    }
    check_tree(&client, &model, seed).await;
    eprintln!("seed {seed}: {succeeded} of {STEPS} operations changed the namespace, {restarts} restarts, {} paths", model.nodes.len());
    // Guards against a vacuous run where every operation fails the same way in both.
    assert!(
        succeeded > STEPS / 4,
        "seed {seed}: only {succeeded} operations succeeded"
    );
    assert!(
        restarts > 0 || STEPS < 25,
        "seed {seed}: the run restarted the metadata server"
    );
}
