//! Differential test of the namespace through a real mount: the same random sequence of
//! operations runs in a directory of the local file system and in one on the mount, and
//! every result (what it returned, or its errno) must be the same on both; the two trees
//! (names, kinds, modes, link counts, bytes, link targets) are compared every 50
//! operations and at the end. Paths are drawn from a few short names, so operations
//! collide: renames over files and directories, exchanges, links to names that exist,
//! removals of non-empty directories, writes through descriptors of renamed or unlinked
//! files. The seed is printed; rerun one with `TESSERA_NSDIFF_SEED=<n>`.
//! Needs root and /dev/fuse.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use tessera_tests::{ProcessCluster, Rng};

const NAMES: [&str; 5] = ["a", "b", "c", "dd", "e"];
const OPS: usize = 4000;
/// Symlink targets: relative, upward, dangling, through a directory. None is absolute
/// and each root sits one level below its own directory: a create through a dangling
/// link creates its target, which must stay inside the test's directories.
const TARGETS: [&str; 4] = ["a", "../b", "missing/x", "dd/e"];

/// What an operation gave: its result in a comparable form, or its errno.
type Outcome = Result<String, i32>;

fn errno(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

fn renameat2(from: &Path, to: &Path, flags: u32) -> std::io::Result<()> {
    let (f, t) = (
        CString::new(from.as_os_str().as_bytes()).unwrap(),
        CString::new(to.as_os_str().as_bytes()).unwrap(),
    );
    // SAFETY: two valid NUL-terminated paths, resolved from the working directory.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            flags,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// One operation, drawn once and run on both sides.
#[derive(Clone, Debug)]
enum Op {
    Mkdir(String),
    Rmdir(String),
    Create(String, bool, Vec<u8>),
    Unlink(String),
    Rename(String, String, u32),
    Link(String, String),
    Symlink(&'static str, String),
    Chmod(String, u32),
    Truncate(String, u64),
    Append(String, Vec<u8>),
    Hold(String),
    WriteHeld(String, u64, Vec<u8>),
    CloseHeld(String),
    Stat(String),
    Readlink(String),
    Read(String),
    List(String),
}

fn some_path(rng: &mut Rng) -> String {
    let depth = 1 + rng.index(3);
    (0..depth)
        .map(|_| *rng.pick(&NAMES))
        .collect::<Vec<_>>()
        .join("/")
}

fn some_bytes(rng: &mut Rng, max: usize) -> Vec<u8> {
    (0..rng.index(max)).map(|_| rng.next_u64() as u8).collect()
}

fn draw(rng: &mut Rng) -> Op {
    let p = some_path(rng);
    match rng.below(20) {
        0 | 1 => Op::Mkdir(p),
        2 => Op::Rmdir(p),
        3 | 4 => {
            let excl = rng.below(2) == 0;
            Op::Create(p, excl, some_bytes(rng, 3000))
        }
        5 => Op::Unlink(p),
        6 | 7 => {
            let flags = *rng.pick(&[0, 0, libc::RENAME_EXCHANGE, libc::RENAME_NOREPLACE]);
            Op::Rename(p, some_path(rng), flags)
        }
        8 => Op::Link(p, some_path(rng)),
        9 => {
            let target: &&'static str = rng.pick(&TARGETS);
            Op::Symlink(target, p)
        }
        10 => Op::Chmod(p, *rng.pick(&[0o644, 0o600, 0o755, 0o700, 0o4755])),
        11 => Op::Truncate(p, rng.below(5000)),
        12 => Op::Append(p, some_bytes(rng, 2000)),
        13 => Op::Hold(p),
        14 => {
            let at = rng.below(4000);
            Op::WriteHeld(p, at, some_bytes(rng, 2000))
        }
        15 => Op::CloseHeld(p),
        16 => Op::Readlink(p),
        17 => Op::Read(p),
        18 => Op::List(if rng.below(2) == 0 { String::new() } else { p }),
        _ => Op::Stat(p),
    }
}

/// One side: a root directory and the descriptors held open by path.
struct Side {
    root: PathBuf,
    held: HashMap<String, File>,
}

impl Side {
    fn run(&mut self, op: &Op) -> Outcome {
        let j = |p: &str| self.root.join(p);
        let unit = |r: std::io::Result<()>| r.map(|()| String::new()).map_err(errno);
        match op {
            Op::Mkdir(p) => unit(fs::create_dir(j(p))),
            Op::Rmdir(p) => unit(fs::remove_dir(j(p))),
            Op::Create(p, excl, data) => {
                let mut o = OpenOptions::new();
                o.write(true).mode(0o644);
                if *excl {
                    o.create_new(true);
                } else {
                    o.create(true);
                }
                unit(o.open(j(p)).and_then(|mut f| f.write_all(data)))
            }
            Op::Unlink(p) => unit(fs::remove_file(j(p))),
            Op::Rename(a, b, 0) => unit(fs::rename(j(a), j(b))),
            Op::Rename(a, b, flags) => unit(renameat2(&j(a), &j(b), *flags)),
            Op::Link(a, b) => unit(fs::hard_link(j(a), j(b))),
            Op::Symlink(target, p) => unit(std::os::unix::fs::symlink(target, j(p))),
            Op::Chmod(p, mode) => {
                unit(fs::set_permissions(j(p), fs::Permissions::from_mode(*mode)))
            }
            Op::Truncate(p, len) => unit(
                OpenOptions::new()
                    .write(true)
                    .open(j(p))
                    .and_then(|f| f.set_len(*len)),
            ),
            Op::Append(p, data) => unit(
                OpenOptions::new()
                    .append(true)
                    .open(j(p))
                    .and_then(|mut f| f.write_all(data)),
            ),
            Op::Hold(p) => {
                let f = OpenOptions::new().read(true).write(true).open(j(p));
                f.map(|f| {
                    self.held.insert(p.clone(), f);
                    String::new()
                })
                .map_err(errno)
            }
            Op::WriteHeld(p, at, data) => match self.held.get(p) {
                Some(f) => unit(f.write_all_at(data, *at)),
                None => Ok("nothing held".into()),
            },
            Op::CloseHeld(p) => match self.held.remove(p) {
                // What the descriptor shows before its close: the file it names, even
                // if renamed or unlinked since.
                Some(f) => f
                    .metadata()
                    .map(|m| format!("size {} links {}", m.len(), m.nlink()))
                    .map_err(errno),
                None => Ok("nothing held".into()),
            },
            Op::Stat(p) => fs::symlink_metadata(j(p)).map(describe).map_err(errno),
            Op::Readlink(p) => fs::read_link(j(p))
                .map(|t| t.display().to_string())
                .map_err(errno),
            Op::Read(p) => fs::read(j(p)).map(|b| format!("{b:?}")).map_err(errno),
            Op::List(p) => fs::read_dir(j(p))
                .and_then(|d| d.map(|e| e.map(|e| e.file_name())).collect())
                .map(|mut names: Vec<_>| {
                    names.sort();
                    format!("{names:?}")
                })
                .map_err(errno),
        }
    }
}

/// Kind, permission bits, and for a non-directory its link count and length.
fn describe(m: fs::Metadata) -> String {
    let kind = m.mode() & libc::S_IFMT;
    if m.is_dir() {
        format!("{kind:o} {:o}", m.mode() & 0o7777)
    } else {
        format!(
            "{kind:o} {:o} links {} size {}",
            m.mode() & 0o7777,
            m.nlink(),
            m.len()
        )
    }
}

/// Every entry under `root`, sorted: path, description, and bytes or link target.
fn tree(root: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in fs::read_dir(dir).unwrap() {
            let path = e.unwrap().path();
            let m = fs::symlink_metadata(&path).unwrap();
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            let extra = if m.is_file() {
                format!("{:?}", fs::read(&path).unwrap())
            } else if m.file_type().is_symlink() {
                fs::read_link(&path).unwrap().display().to_string()
            } else {
                String::new()
            };
            out.push(format!("{rel}: {} {extra}", describe(m)));
            if fs::symlink_metadata(&path).unwrap().is_dir() {
                walk(root, &path, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

/// Guards against any operation answering differently on the mount than on a local
/// file system: a wrong errno, a rename or link that leaves the tree in another state,
/// a descriptor that loses track of its file.
#[test]
fn random_namespace_operations_match_the_local_file_system() {
    let cluster = ProcessCluster::start(3);
    let m = cluster.mount("m");
    compare(&cluster, &m);
}

/// The same with the kernel's writeback cache, which keeps lengths and written bytes
/// of the files this mount writes.
#[test]
fn random_namespace_operations_match_the_local_file_system_with_the_writeback_cache() {
    let cluster = ProcessCluster::start(3);
    let m = cluster.mount_with_config("m", "writeback_cache = true\n");
    compare(&cluster, &m);
}

fn compare(cluster: &ProcessCluster, m: &tessera_tests::Mount) {
    let mut sides = [cluster.dir().join("local"), m.path.join("nsdiff")].map(|dir| {
        let root = dir.join("root");
        fs::create_dir_all(&root).unwrap();
        Side {
            root,
            held: HashMap::new(),
        }
    });
    let mut rng = Rng::from_env("TESSERA_NSDIFF_SEED");
    let mut log: Vec<String> = Vec::new();
    for i in 0..OPS {
        let op = draw(&mut rng);
        let want = sides[0].run(&op);
        let got = sides[1].run(&op);
        let short = |o: &Outcome| match o {
            Ok(s) if s.len() > 60 => format!("Ok({}...)", &s[..60]),
            o => format!("{o:?}"),
        };
        log.push(
            format!("{i}: {op:?} -> {}", short(&want))
                .chars()
                .take(200)
                .collect(),
        );
        let recent = || {
            log.iter()
                .rev()
                .take(10)
                .rev()
                .cloned()
                .collect::<Vec<_>>()
                .join("\n  ")
        };
        assert!(
            want == got,
            "op {i}: local {} but mount {}\nlast operations:\n  {}",
            short(&want),
            short(&got),
            recent()
        );
        if i % 50 == 49 || i == OPS - 1 {
            let (a, b) = (tree(&sides[0].root), tree(&sides[1].root));
            if a != b {
                let only_local: Vec<_> = a.iter().filter(|x| !b.contains(x)).take(5).collect();
                let only_mount: Vec<_> = b.iter().filter(|x| !a.contains(x)).take(5).collect();
                panic!(
                    "trees differ after op {i}: only local {only_local:?}, only on the \
                     mount {only_mount:?}\nlast operations:\n  {}",
                    recent()
                );
            }
        }
    }
}
