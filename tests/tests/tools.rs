//! Tools people point at a file system, on a real mount: `git clone` followed by
//! `git fsck` and a clean `git status`, and `tar` of a source tree out and back.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use tessera_tests::posix::check_output;
use tessera_tests::{pseudo_random, ProcessCluster};

/// Far above what either test takes (a few seconds): past it the mount is deadlocked.
const LIMIT: Duration = Duration::from_secs(300);

fn run(cmd: &str, cwd: &Path) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .current_dir(cwd)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", cwd)
        .output()
        .expect("sh runs");
    check_output(cmd, &out)
}

/// A source tree with nested directories, text and binary files, a symlink, an
/// executable and an empty file.
fn make_tree(root: &Path) {
    for d in ["src/net", "src/fs/deep/deeper", "docs", "empty-dir"] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    for i in 0..40 {
        let text = format!("// file {i}\n{}\n", "fn main() {}\n".repeat(i * 7));
        fs::write(root.join(format!("src/net/m{i}.rs")), text).unwrap();
    }
    fs::write(
        root.join("src/fs/deep/deeper/blob.bin"),
        pseudo_random(3 << 20, 77),
    )
    .unwrap();
    fs::write(root.join("docs/README"), "hello\n").unwrap();
    fs::write(root.join("empty"), "").unwrap();
    fs::write(root.join("run.sh"), "#!/bin/sh\necho hi\n").unwrap();
    run("chmod 755 run.sh && ln -s docs/README link-to-readme", root);
}

/// Guards against the namespace or data path breaking git: object files written, renamed
/// and read back, packs, index locks, hard links refused or accepted consistently.
#[test]
fn git_clone_onto_the_mount_then_fsck_and_status_are_clean() {
    let cluster = ProcessCluster::start(3);
    let m = cluster.mount("mnt");
    let _dog = m.watchdog(LIMIT);
    let origin = cluster.dir().join("origin");
    fs::create_dir_all(&origin).unwrap();
    make_tree(&origin);
    let id = "-c user.name=t -c user.email=t@example.invalid";
    run(
        &format!("git init -q . && git add -A && git {id} commit -qm one"),
        &origin,
    );
    fs::write(origin.join("docs/README"), "hello again\n").unwrap();
    run(&format!("git {id} commit -qam two && git tag v2"), &origin);
    run(
        &format!("git clone -q '{}' repo", origin.display()),
        &m.path,
    );
    let repo = m.path.join("repo");
    run("git fsck --full --strict", &repo);
    assert_eq!(
        run("git status --porcelain", &repo),
        "",
        "a fresh clone is clean"
    );
    assert_eq!(run("git log --oneline | wc -l", &repo).trim(), "2");
    // Work in the clone: a commit, a branch switch and a gc (repack) on the mount.
    fs::write(repo.join("new.txt"), "new\n").unwrap();
    run(
        &format!("git add new.txt && git {id} commit -qm three"),
        &repo,
    );
    run(
        "git checkout -q v2 && git checkout -q - && git gc -q",
        &repo,
    );
    run("git fsck --full --strict", &repo);
    assert_eq!(run("git status --porcelain", &repo), "");
    assert_eq!(
        fs::read(repo.join("src/fs/deep/deeper/blob.bin")).unwrap(),
        pseudo_random(3 << 20, 77)
    );
}

/// Guards against tar's mix of creates, writes, utimes, chmod and symlinks losing
/// anything on the way in or out.
#[test]
fn tar_of_a_source_tree_out_and_back_is_identical() {
    let cluster = ProcessCluster::start(3);
    let m = cluster.mount("mnt");
    let _dog = m.watchdog(LIMIT);
    let src = cluster.dir().join("src-tree");
    fs::create_dir_all(&src).unwrap();
    make_tree(&src);
    let dir = cluster.dir().display().to_string();
    run(
        &format!("tar -C '{dir}' -cf - src-tree | tar -xpf - -C ."),
        &m.path,
    );
    run(&format!("tar -C . -cf '{dir}/back.tar' src-tree"), &m.path);
    fs::create_dir_all(cluster.dir().join("back")).unwrap();
    run(
        &format!("tar -C '{dir}/back' -xpf '{dir}/back.tar'"),
        cluster.dir(),
    );
    run(
        &format!("diff -r --no-dereference '{dir}/src-tree' '{dir}/back/src-tree'"),
        cluster.dir(),
    );
    // Same names, sizes, modes and mtimes, as tar lists them.
    let list = |c: &str| run(&format!("tar -tvf {c} | sort"), cluster.dir());
    run(
        &format!("tar -C '{dir}' -cf '{dir}/orig.tar' src-tree"),
        cluster.dir(),
    );
    assert_eq!(list("orig.tar"), list("back.tar"));
}
