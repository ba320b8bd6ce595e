//! `tessera up` and `tessera down`: the one-command local cluster, restarted on the same
//! state directory, brings every file back; `up` on a running cluster brings back killed
//! members on their old addresses; `down` stops what belongs to the cluster, only that,
//! and leaves nothing running or mounted.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// How long a killed process may take to disappear, or a by-hand server to start.
const WAIT: Duration = Duration::from_secs(60);

/// Runs `tessera` with `args`, whatever its exit status.
fn run(args: &[&str]) -> Output {
    let bin = tessera_tests::process::bin_dir().join("tessera");
    Command::new(&bin)
        .args(args)
        .output()
        .expect("tessera runs")
}

fn tessera(args: &[&str]) -> String {
    let bin = tessera_tests::process::bin_dir().join("tessera");
    let out = Command::new(&bin)
        .args(args)
        .output()
        .expect("tessera runs");
    assert!(
        out.status.success(),
        "tessera {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `tessera down` when dropped, so a failing test leaves nothing behind.
struct Down(Vec<String>);

impl Drop for Down {
    fn drop(&mut self) {
        let args: Vec<&str> = self.0.iter().map(String::as_str).collect();
        let bin = tessera_tests::process::bin_dir().join("tessera");
        let _ = Command::new(bin).args(&args).output();
    }
}

/// A scratch mount point and state directory, and `tessera down` of them on drop.
struct Local {
    mnt: std::path::PathBuf,
    state: std::path::PathBuf,
    m: String,
    s: String,
    // Dropped before the directory it names (fields drop in order).
    _guard: Down,
    dir: tempfile::TempDir,
}

fn local() -> Local {
    tessera_tests::process::require_fuse();
    let dir = tempfile::tempdir().unwrap();
    let (mnt, state) = (dir.path().join("mnt"), dir.path().join("state"));
    let (m, s) = (
        mnt.to_string_lossy().into_owned(),
        state.to_string_lossy().into_owned(),
    );
    // `--forget`: `up --state-dir` records the state directory under the default state
    // root for the mount point (`/var/lib/tessera/...` as root); test runs leave nothing
    // outside their temporary directory.
    let guard = Down(vec![
        "down".into(),
        "--forget".into(),
        m.clone(),
        "--state-dir".into(),
        s.clone(),
    ]);
    Local {
        mnt,
        state,
        m,
        s,
        _guard: guard,
        dir,
    }
}

fn pids(state: &std::path::Path) -> Vec<i32> {
    fs::read_to_string(state.join("pids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect()
}

#[test]
fn up_down_up_keeps_every_file() {
    let local_dir = local();
    let Local {
        mnt, state, m, s, ..
    } = &local_dir;
    let out = tessera(&["up", m, "--state-dir", s]);
    assert!(out.contains("mounted"), "{out}");
    assert!(fs_client::cli::local_cluster::is_mounted(mnt));
    // Recorded, so that `status` and `down` without --state-dir find it.
    let resolved = fs_client::cli::local_cluster::resolve_mount(mnt);
    let record = fs_client::cli::local_cluster::default_state_dir(&resolved).join("redirect");
    assert_eq!(
        fs::canonicalize(fs::read_to_string(&record).unwrap().trim()).unwrap(),
        fs::canonicalize(state).unwrap()
    );
    assert_eq!(pids(state).len(), 5, "meta, 3 data servers, mount");
    fs::create_dir(mnt.join("dir")).unwrap();
    let data = tessera_tests::pseudo_random(9 << 20, 11);
    fs::write(mnt.join("dir/file"), &data).unwrap();

    let started = pids(state);
    tessera(&["down", m, "--state-dir", s]);
    assert!(!fs_client::cli::local_cluster::is_mounted(mnt));
    for pid in started {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let running = stat
            .rsplit(')')
            .next()
            .is_some_and(|r| !r.trim_start().starts_with('Z'));
        assert!(stat.is_empty() || !running, "pid {pid} stopped");
    }
    // A data server stopped by SIGTERM saves its usage for its next start, which takes it.
    let usage_files = || -> Vec<bool> {
        (0..3)
            .map(|i| state.join(format!("data-{i}/usage")).exists())
            .collect()
    };
    assert_eq!(usage_files(), [true; 3], "usage saved at the stop");

    tessera(&["up", m, "--state-dir", s]);
    assert_eq!(usage_files(), [false; 3], "usage taken at the start");
    assert_eq!(fs::read(mnt.join("dir/file")).unwrap(), data);
    // The servers came back on new ports: writes after the restart (every chain gets
    // some) must succeed and read back. (That peers learn the new addresses at all is
    // checked in the metadata server's unit tests: a moved server bumps the map version.)
    for i in 0..24u64 {
        let path = mnt.join(format!("dir/after-{i}"));
        let bytes = tessera_tests::pseudo_random(300 << 10, 100 + i);
        fs::write(&path, &bytes).unwrap_or_else(|e| panic!("writing {path:?}: {e}"));
        assert_eq!(fs::read(&path).unwrap(), bytes);
    }
    // The state directory names its mount point: `down` needs nothing else.
    let out = tessera(&["down", "--state-dir", s]);
    assert!(out.contains("unmounted"), "{out}");
    assert!(!fs_client::cli::local_cluster::is_mounted(mnt));
    assert!(record.exists(), "a plain down keeps the record");
    // Forgotten on request, also with nothing left running (as a script's cleanup), but
    // not for another state directory than the one recorded.
    let elsewhere = local_dir.dir.path().join("elsewhere");
    let out = run(&[
        "down",
        "--forget",
        m,
        "--state-dir",
        &elsewhere.to_string_lossy(),
    ]);
    assert!(!out.status.success(), "nothing was running");
    assert!(record.exists(), "the record names another state directory");
    // A state directory no `up` used names no mount point: `down` says so.
    let out = run(&["down", "--state-dir", &elsewhere.to_string_lossy()]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("records no mount point"),
        "{said}"
    );
    let out = run(&["down", "--forget", m, "--state-dir", s]);
    assert!(!out.status.success(), "nothing was running");
    assert!(!record.exists() && !record.parent().unwrap().exists());
    assert!(
        state.join("meta").exists(),
        "the state directory itself is kept"
    );
}

/// Start time of `pid` (field 22 of its stat), `None` once it is gone or a zombie.
fn start_time(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    if fields.next()? == "Z" {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "{what} within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn pid_of(state: &Path, role: &str) -> i32 {
    fs::read_to_string(state.join("pids"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next()? == role).then(|| w.next()?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("{role} in the pids file"))
}

fn kill9(pid: i32) {
    // SAFETY: kill(2) of a server of the test's own cluster, by the PID `up` recorded.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    wait_until("the killed process is gone", || start_time(pid).is_none());
}

fn addr(state: &Path, role: &str) -> String {
    fs::read_to_string(state.join(format!("{role}.addr")))
        .unwrap_or_else(|e| panic!("{role}.addr: {e}"))
        .trim()
        .to_string()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A child killed and reaped when dropped.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Guards against `down` trusting the pids file: any live process named `tessera*` at a
/// recorded PID got SIGTERM, and a path never mounted was "down" with exit status 0.
#[test]
fn down_leaves_a_foreign_tessera_process_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (mnt, state) = (dir.path().join("mnt"), dir.path().join("state"));
    fs::create_dir_all(&mnt).unwrap();
    fs::create_dir_all(&state).unwrap();
    // Another cluster's "data server": a copy of sleep named like ours.
    let fake = dir.path().join("tessera-data");
    let sleep = ["/usr/bin/sleep", "/bin/sleep"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("sleep is installed");
    // Copied by `cp`, not by this process: a file this process has open for writing
    // can be inherited by a child another test thread is starting, and exec of it then
    // fails with ETXTBSY until that child execs.
    let copied = Command::new("cp").arg(sleep).arg(&fake).status();
    assert!(copied.is_ok_and(|s| s.success()), "copying {sleep}");
    let mut foreign = KillOnDrop(Command::new(&fake).arg("600").spawn().unwrap());
    let pid = foreign.0.id() as i32;
    let start = start_time(pid).expect("running");
    // A pids file naming it: with its true start time, and in the old format without one.
    fs::write(
        state.join("pids"),
        format!("meta {pid}\ndata-0 {pid} {start}\n"),
    )
    .unwrap();
    let (m, s) = (mnt.to_string_lossy(), state.to_string_lossy());
    let out = run(&["down", &m, "--state-dir", &s]);
    assert!(
        foreign.0.try_wait().unwrap().is_none(),
        "the foreign process is left alone"
    );
    assert!(!out.status.success(), "nothing was running: a failure");
    assert!(stderr(&out).contains("nothing to stop"), "{}", stderr(&out));
    // A path that was never mounted, with no state directory at all.
    let never = dir.path().join("never-mounted");
    let out = run(&["down", &never.to_string_lossy()]);
    assert!(!out.status.success(), "{out:?}");
    assert!(stderr(&out).contains("nothing to stop"), "{}", stderr(&out));
}

/// Guards against `up` refusing a running cluster with a dead member (the only way back
/// was the command line from `ps`, and a metadata server on a new port strands clients),
/// and against `status`/`fsck` knowing only 127.0.0.1:7600.
#[test]
fn up_brings_back_killed_servers_on_their_old_addresses() {
    let local_dir = local();
    let Local {
        mnt, state, m, s, ..
    } = &local_dir;
    let up = tessera(&["up", m, "--state-dir", s]);
    let meta = addr(state, "meta");
    let before = tessera_tests::pseudo_random(3 << 20, 5);
    fs::write(mnt.join("before"), &before).unwrap();

    // A data server killed: `up` brings it back on its address.
    let data_addr = addr(state, "data-1");
    let old = pid_of(state, "data-1");
    kill9(old);
    let out = tessera(&["up", m, "--state-dir", s]);
    assert!(out.contains("brought back data-1"), "{out}");
    assert!(
        !out.contains("brought back meta"),
        "the running ones are left: {out}"
    );
    assert_eq!(addr(state, "data-1"), data_addr);
    assert_ne!(pid_of(state, "data-1"), old);
    let status = tessera(&["status", "--state-dir", s]);
    let line = status
        .lines()
        .find(|l| l.contains("data-1 (node:") && l.contains(&data_addr))
        .unwrap_or_else(|| panic!("data-1 at {data_addr} in:\n{status}"));
    assert!(line.trim_end().ends_with(" up"), "{line}");
    write_and_check(mnt, "after-data", 1);
    assert_eq!(fs::read(mnt.join("before")).unwrap(), before);

    // The metadata server killed: back on the same port, so the mount carries on.
    let old = pid_of(state, "meta");
    kill9(old);
    let out = tessera(&["up", m, "--state-dir", s]);
    assert!(out.contains("brought back meta"), "{out}");
    assert_eq!(addr(state, "meta"), meta);
    write_and_check(mnt, "after-meta", 2);
    let names: Vec<String> = fs::read_dir(mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.contains(&"after-meta".to_string()), "{names:?}");
    assert_eq!(fs::read(mnt.join("before")).unwrap(), before);
    // The mount process killed: its mount point is dead (ENOTCONN) until `up` remounts.
    kill9(pid_of(state, "mount"));
    let out = tessera(&["up", m, "--state-dir", s]);
    assert!(out.contains("brought back mount"), "{out}");
    assert_eq!(fs::read(mnt.join("before")).unwrap(), before);
    let out = tessera(&["up", m, "--state-dir", s]);
    assert!(out.contains("nothing to bring back"), "{out}");

    // `up` says where the metadata server and the logs are; `status` and `fsck` find
    // it from the mount point or the state directory.
    assert!(up.contains(&format!("metadata server: {meta}")), "{up}");
    assert!(up.contains(&format!("logs: {s}/logs")), "{up}");
    let status = tessera(&["status", m]);
    for i in 0..3 {
        let line = format!("data-{i} (node:");
        assert!(status.contains(&line), "{line} in:\n{status}");
    }
    let fsck = tessera(&["fsck", "--state-dir", s]);
    assert!(fsck.contains(" 0 problems"), "{fsck}");
    let fsck = tessera(&["fsck", m]);
    assert!(fsck.contains(" 0 problems"), "{fsck}");
    // A server whose lease ran out is DOWN: status says when it will be replaced and
    // how to bring it back.
    kill9(pid_of(state, "data-2"));
    let mut status = String::new();
    wait_until("status shows data-2 DOWN", || {
        status = tessera(&["status", m]);
        status
            .lines()
            .any(|l| l.contains("data-2 (node:") && l.contains("DOWN (replaced in 9m"))
    });
    assert!(status.contains("`tessera up MOUNTPOINT`"), "{status}");
    let out = tessera(&["up", m]);
    assert!(out.contains("brought back data-2"), "{out}");
    tessera(&["down", m, "--state-dir", s]);
    assert!(!fs_client::cli::local_cluster::is_mounted(mnt));

    // Mounting over files hides them: refused unless asked for.
    fs::write(mnt.join("hidden"), b"x").unwrap();
    let out = run(&["up", m, "--state-dir", s]);
    assert!(!out.status.success(), "a non-empty mount point is refused");
    assert!(stderr(&out).contains("--nonempty"), "{}", stderr(&out));
    assert!(!fs_client::cli::local_cluster::is_mounted(mnt));
    tessera(&["up", m, "--state-dir", s, "--nonempty"]);
    assert_eq!(fs::read(mnt.join("before")).unwrap(), before);
    tessera(&["down", m, "--state-dir", s]);
    assert_eq!(
        fs::read(mnt.join("hidden")).unwrap(),
        b"x",
        "kept under the mount"
    );
}

fn write_and_check(mnt: &Path, name: &str, seed: u64) {
    let path = mnt.join(name);
    let bytes = tessera_tests::pseudo_random(2 << 20, seed);
    fs::write(&path, &bytes).unwrap_or_else(|e| panic!("writing {path:?}: {e}"));
    assert_eq!(fs::read(&path).unwrap(), bytes);
}

/// Guards against `down` saying "is down" while a server restarted by hand (not in the
/// pids file) kept running, against the "Failed to umount filesystem: Invalid argument"
/// logged at every clean unmount, and against colour codes in log files.
#[test]
fn down_stops_a_server_restarted_by_hand() {
    let local_dir = local();
    let Local {
        mnt, state, m, s, ..
    } = &local_dir;
    tessera(&["up", m, "--state-dir", s]);
    fs::write(mnt.join("file"), b"data").unwrap();
    // Restarted by hand from the command line `ps` shows, as an operator would.
    let pid = pid_of(state, "data-0");
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let argv: Vec<String> = cmdline
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    kill9(pid);
    fs::remove_file(state.join("data-0.addr")).unwrap();
    let log = fs::File::create(local_dir.dir.path().join("by-hand.log")).unwrap();
    let mut by_hand = KillOnDrop(
        Command::new(&argv[0])
            .args(&argv[1..])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let by_hand_log = local_dir.dir.path().join("by-hand.log");
    let deadline = Instant::now() + WAIT;
    while !state.join("data-0.addr").exists() {
        let exited = by_hand.0.try_wait().ok().flatten();
        assert!(
            exited.is_none() && Instant::now() < deadline,
            "the server started by hand is not ready within {WAIT:?} (exit: {exited:?}):\n{}\n\
             -- meta.log:\n{}",
            fs::read_to_string(&by_hand_log).unwrap_or_default(),
            fs::read_to_string(state.join("logs/meta.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = tessera(&["down", m, "--state-dir", s]);
    let deadline = Instant::now() + WAIT;
    while by_hand.0.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "down stops the server started by hand"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(out.contains("data-0"), "{out}");
    assert!(!fs_client::cli::local_cluster::is_mounted(mnt));
    for entry in fs::read_dir(state.join("logs")).unwrap() {
        let path = entry.unwrap().path();
        let text = fs::read_to_string(&path).unwrap();
        assert!(
            !text.contains('\x1b'),
            "no colour codes in {path:?}:\n{text}"
        );
        assert!(!text.contains("Failed to umount"), "{path:?}:\n{text}");
        assert!(!text.contains("Unmount failed"), "{path:?}:\n{text}");
    }
}

/// Guards against errors that repeat their cause ("cannot connect...: refused: cannot
/// connect...: refused: refused"), and against `tessera mount` hiding a non-empty
/// directory's files without a word.
#[test]
fn errors_say_each_cause_once_and_mount_refuses_a_nonempty_directory() {
    let dir = tempfile::tempdir().unwrap();
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let meta = format!("127.0.0.1:{port}");
    let out = run(&["status", "--meta", &meta]);
    assert!(!out.status.success());
    let err = stderr(&out);
    let line = err
        .lines()
        .find(|l| l.starts_with("tessera: "))
        .unwrap_or_else(|| panic!("an error line in:\n{err}"));
    assert_eq!(line.to_lowercase().matches("refused").count(), 1, "{line}");

    let mnt = dir.path().join("full");
    fs::create_dir_all(&mnt).unwrap();
    fs::write(mnt.join("kept"), b"x").unwrap();
    let out = run(&["mount", "--meta", &meta, &mnt.to_string_lossy()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("not empty"), "{}", stderr(&out));
    assert!(!fs_client::cli::local_cluster::is_mounted(&mnt));
}
