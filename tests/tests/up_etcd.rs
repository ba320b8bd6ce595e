//! `tessera up --engine etcd`: the local HA cluster (3 etcd members, 2 metadata servers
//! on one prefix, the data servers and the mount, each given both metadata addresses)
//! survives a `kill -9` of the serving metadata server: the standby takes over and an
//! open file keeps writing; `up` brings back a killed etcd member and the killed server
//! (a standby now); `tessera down` then leaves no process, no mount and nothing on
//! /dev/shm. Real processes, a real FUSE mount, real etcd members.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use meta_server::kv::etcd::local::LocalEtcd;
use std::fs;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use tessera_tests::process::UpGuard;

/// How long the standby may take to serve after the kill: the owner lease (5 s) and
/// its polling, with room for a loaded machine.
const TAKEOVER: Duration = Duration::from_secs(30);

fn run(args: &[&str]) -> Output {
    let bin = tessera_tests::process::bin_dir().join("tessera");
    Command::new(&bin)
        .args(args)
        .output()
        .expect("tessera runs")
}

fn tessera(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "tessera {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Makes file `path`, writes and fsyncs a line, kills (SIGKILL) the metadata server
/// `up` recorded as `meta` under `state`, writes and fsyncs a second line through the
/// same descriptor, and checks both read back; returns how long the write and fsync
/// after the kill took.
fn write_across_the_kill_of_meta(state: &Path, path: &Path) -> Duration {
    let mut open = fs::OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    open.write_all(b"before the kill\n").unwrap();
    open.sync_all().unwrap();
    kill_recorded(state, "meta");
    let killed = Instant::now();
    open.write_all(b"after the kill\n").unwrap();
    open.sync_all().unwrap();
    let took = killed.elapsed();
    eprintln!("write + fsync after the kill took {took:?}");
    let mut back = String::new();
    open.rewind().unwrap();
    open.read_to_string(&mut back).unwrap();
    assert_eq!(back, "before the kill\nafter the kill\n");
    took
}

/// `(role, pid)` of every process `up` recorded.
fn pids(state: &Path) -> Vec<(String, i32)> {
    fs::read_to_string(state.join("pids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.to_string(), w.next()?.parse().ok()?))
        })
        .collect()
}

/// Kills (SIGKILL) the process `up` recorded as `role` under `state`.
fn kill_recorded(state: &Path, role: &str) {
    let (_, pid) = pids(state)
        .into_iter()
        .find(|(r, _)| r == role)
        .unwrap_or_else(|| panic!("up recorded no {role}"));
    // SAFETY: kill(2) on a PID `up` recorded for a process it started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0, "kill {role}");
}

/// Whether `pid` runs (a zombie waiting for its parent does not).
fn running(pid: i32) -> bool {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit(')')
        .next()
        .is_some_and(|r| !r.trim_start().is_empty() && !r.trim_start().starts_with('Z'))
}

/// The line `status` prints for metadata server `role`.
fn meta_line(status: &str, role: &str) -> String {
    let prefix = format!("  {role} ");
    status
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_default()
        .to_string()
}

#[test]
fn up_on_etcd_keeps_the_mount_through_a_kill_of_the_serving_metadata_server() {
    if !LocalEtcd::present_for_tests() {
        return;
    }
    tessera_tests::process::require_fuse();
    let dir = tempfile::tempdir().unwrap();
    let (mnt, state) = (dir.path().join("mnt"), dir.path().join("state"));
    let _down = UpGuard {
        mnt: mnt.clone(),
        state: state.clone(),
    };
    let (m, s) = (mnt.to_string_lossy(), state.to_string_lossy());
    // A state directory with an earlier cluster's data is refused before anything
    // starts: `down` would remove those directories with the new namespace.
    fs::create_dir_all(state.join("data-0")).unwrap();
    let out = run(&["up", &m, "--state-dir", &s, "--engine", "etcd"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("earlier cluster"),
        "{err}"
    );
    assert!(pids(&state).is_empty() && !state.join("etcd.dir").exists());
    fs::remove_dir(state.join("data-0")).unwrap();
    let started = Instant::now();
    let out = tessera(&["up", &m, "--state-dir", &s, "--engine", "etcd"]);
    eprintln!("up on etcd took {:?}", started.elapsed());
    assert!(out.contains("mounted"), "{out}");
    let roles: Vec<String> = pids(&state).into_iter().map(|(r, _)| r).collect();
    assert_eq!(
        roles,
        [
            "etcd-m0", "etcd-m1", "etcd-m2", "meta", "meta-1", "data-0", "data-1", "data-2",
            "mount"
        ]
    );
    let etcd_dir = PathBuf::from(fs::read_to_string(state.join("etcd.dir")).unwrap());
    assert!(
        etcd_dir.starts_with("/dev/shm"),
        "tmpfs by default: {etcd_dir:?}"
    );
    // Every client and data server knows both metadata addresses.
    let addrs = fs::read_to_string(state.join("meta.addrs")).unwrap();
    assert_eq!(addrs.split(',').count(), 2, "{addrs}");
    let mount_cmd = fs::read_to_string(state.join("cmd/mount")).unwrap();
    let data_cmd = fs::read_to_string(state.join("cmd/data-0")).unwrap();
    assert!(mount_cmd.lines().any(|l| l == addrs), "{mount_cmd}");
    assert!(data_cmd.lines().any(|l| l == addrs), "{data_cmd}");

    let status = tessera(&["status", &m, "--state-dir", &s]);
    assert_eq!(status.matches(": answers").count(), 3, "{status}");
    assert!(meta_line(&status, "meta").ends_with("serves"), "{status}");
    assert!(meta_line(&status, "meta-1").contains("standby"), "{status}");

    fs::create_dir(mnt.join("dir")).unwrap();
    let big = tessera_tests::pseudo_random(9 << 20, 24);
    fs::write(mnt.join("dir/big"), &big).unwrap();
    let took = write_across_the_kill_of_meta(&state, &mnt.join("dir/open"));
    assert!(took < TAKEOVER, "{took:?}");
    fs::write(mnt.join("dir/new"), b"made on the standby").unwrap();
    assert_eq!(
        fs::read(mnt.join("dir/new")).unwrap(),
        b"made on the standby"
    );
    assert_eq!(fs::read(mnt.join("dir/big")).unwrap(), big);
    let status = tessera(&["status", &m, "--state-dir", &s]);
    assert!(meta_line(&status, "meta-1").ends_with("serves"), "{status}");
    assert!(!meta_line(&status, "meta").ends_with("serves"), "{status}");

    // `up` brings back a killed etcd member on its data, and the killed metadata
    // server as a standby of the one serving now.
    kill_recorded(&state, "etcd-m1");
    let started = Instant::now();
    let out = tessera(&["up", &m, "--state-dir", &s]);
    eprintln!("up bringing back took {:?}", started.elapsed());
    assert!(out.contains("brought back etcd-m1"), "{out}");
    assert!(out.contains("brought back meta "), "{out}");
    let status = tessera(&["status", &m, "--state-dir", &s]);
    assert_eq!(status.matches(": answers").count(), 3, "{status}");
    assert!(meta_line(&status, "meta").contains("standby"), "{status}");
    assert!(meta_line(&status, "meta-1").ends_with("serves"), "{status}");
    fs::write(mnt.join("dir/after"), b"after the bring-back").unwrap();
    assert_eq!(
        fs::read(mnt.join("dir/after")).unwrap(),
        b"after the bring-back"
    );

    let before: Vec<(String, i32)> = pids(&state);
    let started = Instant::now();
    let out = tessera(&["down", &m, "--state-dir", &s]);
    eprintln!("down took {:?}", started.elapsed());
    assert!(out.contains("etcd-m0") && out.contains("meta-1"), "{out}");
    assert!(!fs_client::cli::local_cluster::is_mounted(&mnt));
    for (role, pid) in before {
        assert!(!running(pid), "{role} (pid {pid}) still runs after down");
    }
    assert!(!etcd_dir.exists(), "{etcd_dir:?} removed");
    let name = etcd_dir.file_name().unwrap();
    assert!(
        !Path::new("/dev/shm").join(name).exists(),
        "nothing left on /dev/shm"
    );
    assert!(!state.join("data-0").exists() && !state.join("meta").exists());
}

/// `tessera up --engine etcd --etcd-shared`: both metadata servers serve at once; the
/// mount goes on through the second when the first is killed, and `up` brings the
/// killed one back serving, not as a standby.
#[test]
fn up_on_etcd_shared_serves_through_both_servers_and_brings_a_killed_one_back_serving() {
    if !LocalEtcd::present_for_tests() {
        return;
    }
    tessera_tests::process::require_fuse();
    let dir = tempfile::tempdir().unwrap();
    let (mnt, state) = (dir.path().join("mnt"), dir.path().join("state"));
    let _down = UpGuard {
        mnt: mnt.clone(),
        state: state.clone(),
    };
    let (m, s) = (mnt.to_string_lossy(), state.to_string_lossy());
    let out = run(&["up", &m, "--state-dir", &s, "--etcd-shared"]);
    assert!(!out.status.success(), "--etcd-shared without --engine etcd");
    let out = tessera(&[
        "up",
        &m,
        "--state-dir",
        &s,
        "--engine",
        "etcd",
        "--etcd-shared",
    ]);
    assert!(out.contains("mounted"), "{out}");
    let status = tessera(&["status", &m, "--state-dir", &s]);
    assert!(meta_line(&status, "meta").ends_with("serves"), "{status}");
    assert!(meta_line(&status, "meta-1").ends_with("serves"), "{status}");

    write_across_the_kill_of_meta(&state, &mnt.join("open"));

    let out = tessera(&["up", &m, "--state-dir", &s]);
    assert!(out.contains("brought back meta "), "{out}");
    let status = tessera(&["status", &m, "--state-dir", &s]);
    assert!(meta_line(&status, "meta").ends_with("serves"), "{status}");
    assert!(meta_line(&status, "meta-1").ends_with("serves"), "{status}");
    fs::write(mnt.join("after"), b"after the bring-back").unwrap();
    assert_eq!(
        fs::read(mnt.join("after")).unwrap(),
        b"after the bring-back"
    );
    let out = tessera(&["down", &m, "--state-dir", &s]);
    assert!(out.contains("meta-1"), "{out}");
    assert!(!fs_client::cli::local_cluster::is_mounted(&mnt));
}
