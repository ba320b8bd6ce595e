//! POSIX point 7 on a real mount: a directory of many entries is listed completely with
//! plain `readdir` (`ls -f`) and with `readdirplus` (`ls -l`), across many pages of the
//! metadata server, and removed by `rm -rf`, which unlinks while it lists. The full
//! 1,000,000-entry run with memory figures is `scripts/bigdir.sh`; this test keeps the
//! same paths in every CI run at a size that takes seconds.
//! It needs root and /dev/fuse, as CI has.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use tessera_tests::posix::{check_output, mknod};
use tessera_tests::ProcessCluster;

/// Many pages of the server (512 names each) and of the kernel's listing buffer.
const ENTRIES: usize = 3000;

fn name(i: usize) -> String {
    format!("entry-{i:05}")
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("command runs");
    check_output(&format!("{cmd:?}"), &out)
}

fn fill(dir: &Path) {
    fs::create_dir(dir).unwrap();
    for i in 0..ENTRIES {
        let p = dir.join(name(i));
        // Some entries have bytes, so `ls -l` has sizes to show.
        if i.is_multiple_of(100) {
            fs::write(&p, vec![7u8; i]).unwrap();
        } else {
            mknod(&p, libc::S_IFREG | 0o644, 0).unwrap();
        }
    }
}

/// Guards against listings that lose, repeat or invent names past the first page, and
/// against `readdirplus` attributes that disagree with `stat` (`ls -l`, `rsync` and
/// `find -size` trust them without a lookup).
#[test]
fn a_directory_of_thousands_of_entries_lists_completely_both_ways() {
    let cluster = ProcessCluster::start(1);
    let m = cluster.mount("mnt");
    let dir = m.path.join("big");
    fill(&dir);
    let want: BTreeSet<String> = (0..ENTRIES).map(name).collect();

    let plain = run(Command::new("ls").arg("-f").arg(&dir));
    let mut seen: Vec<&str> = plain.lines().filter(|l| !l.starts_with('.')).collect();
    assert_eq!(seen.len(), ENTRIES, "ls -f: every name once");
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), ENTRIES, "ls -f repeated a name");
    assert!(
        seen.iter().all(|n| want.contains(*n)),
        "ls -f invented a name"
    );

    // `ls -l` on a fresh mount: its first listing is where the kernel uses readdirplus.
    drop(m);
    let m = cluster.mount("mnt2");
    let dir = m.path.join("big");
    let long = run(Command::new("ls")
        .args(["-l", "--time-style=+%s"])
        .arg(&dir));
    let mut rows = 0;
    for line in long.lines().filter(|l| l.starts_with('-')) {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let (size, file) = (cols[4], cols[6]);
        let i: usize = file["entry-".len()..].parse().unwrap();
        let expected = if i.is_multiple_of(100) { i } else { 0 };
        assert_eq!(size, expected.to_string(), "size of {file}");
        rows += 1;
    }
    assert_eq!(rows, ENTRIES, "ls -l: one row per file");
    let st = fs::metadata(dir.join(name(1500))).unwrap();
    assert_eq!((st.size(), st.mode() & 0o777), (1500, 0o644));
    assert_eq!(fs::metadata(&dir).unwrap().nlink(), 2, "no subdirectories");
}

/// Guards against a removal that skips names: `rm -rf` reads a batch, unlinks it and
/// reads on from its position, so a listing that shifted as names went away would leave
/// the directory non-empty and `rm` would fail with ENOTEMPTY.
#[test]
fn rm_rf_removes_a_directory_of_thousands_of_entries() {
    let cluster = ProcessCluster::start(1);
    let m = cluster.mount("mnt");
    let dir = m.path.join("big");
    fill(&dir);
    fs::create_dir(dir.join("sub")).unwrap();
    fs::write(dir.join("sub/f"), b"x").unwrap();
    run(Command::new("rm").arg("-rf").arg(&dir));
    assert!(!dir.exists(), "rm -rf left the directory");
    assert_eq!(fs::read_dir(&m.path).unwrap().count(), 0);
}
