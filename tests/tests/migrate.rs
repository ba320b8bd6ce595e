//! `tessera-meta migrate`: a namespace made through a real cluster on redb (files,
//! directories, symbolic and hard links, extended attributes, modes) moves to etcd; a
//! cluster started on etcd serves the same tree through its mount and `tessera fsck`
//! finds it clean; back to redb it is equal key for key. The refusals write nothing: a
//! store a running server holds, an unreachable etcd, a non-empty target, a prefix a
//! metadata server serves.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use meta_server::kv::etcd::local::LocalEtcd;
use meta_server::{open_engine, EtcdConfig, KvPair, StoreKind, WriteBatch};
use sha2::Digest;
use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Instant;
use tessera_tests::process::UpGuard;

fn run(bin: &str, args: &[&str]) -> Output {
    let bin = tessera_tests::process::bin_dir().join(bin);
    Command::new(&bin).args(args).output().expect("runs")
}

fn ok(bin: &str, args: &[&str]) -> String {
    let out = run(bin, args);
    assert!(
        out.status.success(),
        "{bin} {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `tessera-meta migrate ARGS`, which must fail; returns its error output.
fn refused(args: &[&str]) -> String {
    let mut all = vec!["migrate"];
    all.extend_from_slice(args);
    let out = run("tessera-meta", &all);
    assert!(!out.status.success(), "migrate {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn set_xattr(p: &Path, name: &str, value: &[u8]) {
    let name = CString::new(name).unwrap();
    // SAFETY: valid C strings and a buffer of the given length.
    let r = unsafe {
        libc::lsetxattr(
            cstr(p).as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(r, 0, "setxattr {p:?}: {}", std::io::Error::last_os_error());
}

/// Every extended attribute of `p` (not following a link), sorted.
fn xattrs(p: &Path) -> Vec<(String, Vec<u8>)> {
    let mut names = vec![0u8; 64 << 10];
    // SAFETY: the buffer is as long as the length passed.
    let n = unsafe { libc::llistxattr(cstr(p).as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    assert!(
        n >= 0,
        "listxattr {p:?}: {}",
        std::io::Error::last_os_error()
    );
    let mut out = Vec::new();
    for name in names[..n as usize]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
    {
        let c = CString::new(name).unwrap();
        let mut value = vec![0u8; 64 << 10];
        // SAFETY: as above.
        let len = unsafe {
            libc::lgetxattr(
                cstr(p).as_ptr(),
                c.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        assert!(len >= 0, "getxattr {p:?}");
        value.truncate(len as usize);
        out.push((String::from_utf8_lossy(name).into_owned(), value));
    }
    out.sort();
    out
}

/// What the tree under `root` looks like: per path, its inode, type, mode, owner, links,
/// size, modification time, contents (a digest) or link target, and attributes.
fn tree(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let md = fs::symlink_metadata(&p).unwrap();
            let what = if md.is_dir() {
                todo.push(p.clone());
                "dir".to_string()
            } else if md.file_type().is_symlink() {
                format!("link -> {:?}", fs::read_link(&p).unwrap())
            } else {
                format!("{:x}", sha2::Sha256::digest(fs::read(&p).unwrap()))
            };
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let desc = format!(
                "ino {} mode {:o} uid {} gid {} nlink {} size {} mtime {}.{} {what} {:?}",
                md.ino(),
                md.mode(),
                md.uid(),
                md.gid(),
                md.nlink(),
                md.len(),
                md.mtime(),
                md.mtime_nsec(),
                xattrs(&p)
            );
            out.insert(rel, desc);
        }
    }
    out
}

/// Every pair of the store `open` opens.
fn all_pairs(kind: StoreKind, dir: &Path, etcd: &EtcdConfig) -> Vec<KvPair> {
    let store = open_engine(kind, dir, etcd).unwrap();
    store.scan(&[], &[0xff; 64], usize::MAX).unwrap()
}

fn etcd_at(url: &str, prefix: &str) -> EtcdConfig {
    EtcdConfig {
        endpoints: vec![url.to_string()],
        prefix: prefix.to_string(),
        retry_for_ms: 10_000,
        ..EtcdConfig::default()
    }
}

fn make_tree(mnt: &Path) {
    fs::create_dir_all(mnt.join("a/b")).unwrap();
    fs::set_permissions(mnt.join("a/b"), fs::Permissions::from_mode(0o750)).unwrap();
    fs::write(mnt.join("a/small"), b"a small file").unwrap();
    fs::write(
        mnt.join("a/b/big"),
        tessera_tests::pseudo_random(9 << 20, 5),
    )
    .unwrap();
    fs::write(mnt.join("a/private"), b"mode 600").unwrap();
    fs::set_permissions(mnt.join("a/private"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::File::create(mnt.join("a/empty")).unwrap();
    std::os::unix::fs::symlink("small", mnt.join("a/link")).unwrap();
    fs::hard_link(mnt.join("a/small"), mnt.join("a/b/hard")).unwrap();
    set_xattr(&mnt.join("a/small"), "user.origin", b"redb");
    set_xattr(&mnt.join("a"), "user.dir", &[0, 1, 2, 255]);
    for i in 0..300 {
        fs::write(mnt.join(format!("a/n{i:03}")), i.to_string()).unwrap();
    }
}

#[test]
fn a_namespace_moves_from_redb_to_etcd_and_back() {
    if !LocalEtcd::present_for_tests() {
        return;
    }
    tessera_tests::process::require_fuse();
    let etcd = LocalEtcd::start(1).unwrap();
    let url = etcd.endpoint(0);
    let dir = tempfile::tempdir().unwrap();
    let (mnt, state) = (dir.path().join("mnt"), dir.path().join("state"));
    let _down = UpGuard {
        mnt: mnt.clone(),
        state: state.clone(),
    };
    let (m, s) = (mnt.to_string_lossy(), state.to_string_lossy());
    let redb_dir = state.join("meta");
    let redb = format!("redb:{}", redb_dir.display());
    ok("tessera", &["up", &m, "--state-dir", &s]);
    make_tree(&mnt);
    let before = tree(&mnt);
    assert_eq!(before.len(), 308, "{before:#?}");

    // The running server holds the store's lock: refused, nothing written to etcd.
    let err = refused(&["--from", &redb, "--to", &format!("etcd:{url}/held/")]);
    assert!(err.contains("lock"), "{err}");
    assert!(all_pairs(StoreKind::Etcd, dir.path(), &etcd_at(&url, "held/")).is_empty());
    ok("tessera", &["down", &m, "--state-dir", &s]);

    // Unreachable etcd: a free port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = refused(&[
        "--from",
        &redb,
        "--to",
        &format!("etcd:http://127.0.0.1:{port}/"),
    ]);
    assert!(err.contains("reaching the target"), "{err}");
    // A non-empty target is left as it was.
    let full = etcd_at(&url, "full/");
    let store = open_engine(StoreKind::Etcd, dir.path(), &full).unwrap();
    let mut batch = WriteBatch::new();
    batch.put(b"Zsomething".to_vec(), b"else".to_vec());
    store.commit(batch).unwrap();
    drop(store);
    let err = refused(&["--from", &redb, "--to", &format!("etcd:{url}/full/")]);
    assert!(err.contains("not empty"), "{err}");
    assert_eq!(all_pairs(StoreKind::Etcd, dir.path(), &full).len(), 1);

    // To etcd under the prefix the server uses, and a second copy left untouched for
    // the way back.
    let started = Instant::now();
    let out = ok(
        "tessera-meta",
        &[
            "migrate",
            "--from",
            &redb,
            "--to",
            &format!("etcd:{url}/tessera/"),
        ],
    );
    eprintln!("redb -> etcd: {out} in {:?}", started.elapsed());
    ok(
        "tessera-meta",
        &[
            "migrate",
            "--from",
            &redb,
            "--to",
            &format!("etcd:{url}/rt/"),
        ],
    );
    let redb_pairs = all_pairs(StoreKind::Redb, &redb_dir, &EtcdConfig::default());
    assert!(redb_pairs.len() > 600, "{} keys", redb_pairs.len());
    let on_etcd = all_pairs(StoreKind::Etcd, dir.path(), &etcd_at(&url, "tessera/"));
    assert!(on_etcd == redb_pairs, "etcd holds the same keys and values");

    // A cluster on etcd serves the same tree; fsck is clean.
    ok(
        "tessera",
        &[
            "up",
            &m,
            "--state-dir",
            &s,
            "--store",
            "etcd",
            "--etcd",
            &url,
        ],
    );
    let after = tree(&mnt);
    for (path, desc) in &before {
        assert_eq!(after.get(path), Some(desc), "{path}");
    }
    assert_eq!(after.len(), before.len());
    let fsck = ok("tessera", &["fsck", &m, "--state-dir", &s]);
    eprintln!("{fsck}");
    assert!(fsck.contains(" 0 problems"), "{fsck}");
    // The prefix is served now: refused as a source.
    let back = dir.path().join("back");
    let err = refused(&[
        "--from",
        &format!("etcd:{url}/tessera/"),
        "--to",
        &format!("redb:{}", back.display()),
    ]);
    assert!(err.contains("served by"), "{err}");
    assert!(!back.exists(), "nothing made for the refused target");
    ok("tessera", &["down", &m, "--state-dir", &s]);

    // Back to redb from the untouched copy: equal key for key.
    let to_back = format!("redb:{}", back.display());
    ok(
        "tessera-meta",
        &[
            "migrate",
            "--from",
            &format!("etcd:{url}/rt/"),
            "--to",
            &to_back,
        ],
    );
    let back_pairs = all_pairs(StoreKind::Redb, &back, &EtcdConfig::default());
    assert_eq!(back_pairs.len(), redb_pairs.len());
    assert!(
        back_pairs == redb_pairs,
        "redb -> etcd -> redb changed a key or value"
    );
}
