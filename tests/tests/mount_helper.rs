//! `mount -t fuse.tessera` and fstab (issue 26 item 4): the helper `mount.fuse.tessera`
//! (the `tessera` binary called by that name) mounts `META:/path`, returns once the
//! mount is usable with the mount process in the background, takes mount options and
//! client settings by name, mounts a subdirectory, and `umount` ends the process. An
//! error (no server, no such directory) is one line on `mount`'s standard error, with
//! nothing mounted and nothing left running.
//!
//! `mount(8)` finds helpers in `/sbin` only, so the test links `/sbin/mount.fuse.tessera`
//! to the built binary for its run (and removes the link after). Needs root and
//! /dev/fuse (as every mount test).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::Duration;
use tessera_tests::posix::wait_until;
use tessera_tests::ProcessCluster;

const HELPER: &str = "/sbin/mount.fuse.tessera";

/// The tests share the one helper link.
static HELPER_LOCK: Mutex<()> = Mutex::new(());

/// The helper link, removed on drop.
struct HelperLink;

impl HelperLink {
    fn install() -> HelperLink {
        let target = tessera_tests::process::bin_dir().join("tessera");
        if let Ok(old) = fs::read_link(HELPER) {
            // A link a test run left (from any checkout) is replaced; the package's
            // link to /usr/bin/tessera is not.
            assert!(
                !old.starts_with("/usr"),
                "{HELPER} links to {} (an installed Tessera?): not replacing it",
                old.display()
            );
            let _ = fs::remove_file(HELPER);
        }
        assert!(
            !Path::new(HELPER).exists(),
            "{HELPER} exists and is not a link (an installed Tessera?): not replacing it"
        );
        std::os::unix::fs::symlink(&target, HELPER).expect("linking the helper into /sbin");
        HelperLink
    }
}

impl Drop for HelperLink {
    fn drop(&mut self) {
        let _ = fs::remove_file(HELPER);
    }
}

/// What every test here holds: the helper lock, a cluster of one data server, and the
/// helper link (dropped in that order: the link, then the servers, then the lock).
struct Fixture {
    cluster: ProcessCluster,
    _link: HelperLink,
    _lock: std::sync::MutexGuard<'static, ()>,
}

impl Fixture {
    fn start() -> Fixture {
        let lock = HELPER_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let cluster = ProcessCluster::start(1);
        Fixture {
            cluster,
            _link: HelperLink::install(),
            _lock: lock,
        }
    }

    /// New empty mount points `names` in the cluster's directory, and their cleanup.
    fn mount_points<const N: usize>(&self, names: [&str; N]) -> ([PathBuf; N], Cleanup) {
        let dirs = names.map(|n| self.cluster.dir().join(n));
        for d in &dirs {
            fs::create_dir(d).expect("a mount point");
        }
        let cleanup = Cleanup(dirs.to_vec());
        (dirs, cleanup)
    }

    /// The administrator's key file.
    fn key(&self) -> PathBuf {
        self.cluster.key_file("admin.key")
    }
}

/// `mount -t fuse.tessera SOURCE DIR -o OPTS`, its output once it returned.
fn mount_t(source: &str, dir: &Path, opts: &str) -> Output {
    run(Command::new("mount")
        .args(["-t", "fuse.tessera", source])
        .arg(dir)
        .args(["-o", opts]))
}

/// Unmounts (lazily) and stops the helper processes of the mount points it holds, also
/// when a test fails half-way.
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for dir in &self.0 {
            if mount_entry(dir).is_some() {
                let _ = Command::new("umount").arg("-l").arg(dir).status();
            }
            for pid in helper_pids(dir) {
                // SAFETY: kill has no memory preconditions; the pid is a helper of ours.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

/// Processes running the helper for mount point `dir`.
fn helper_pids(dir: &Path) -> Vec<i32> {
    let dir = dir.to_string_lossy().to_string();
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let cmd = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
            args.first()
                .is_some_and(|a| a.ends_with(b"mount.fuse.tessera"))
                && args.contains(&dir.as_bytes())
        })
        .collect()
}

/// The `/proc/self/mounts` fields (source, type, options) of the mount at `dir`.
fn mount_entry(dir: &Path) -> Option<(String, String, Vec<String>)> {
    let mounts = fs::read_to_string("/proc/self/mounts").expect("/proc/self/mounts");
    let dir = dir.to_string_lossy();
    mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.get(1) == Some(&&*dir)).then(|| {
            let opts = f[3].split(',').map(String::from).collect();
            (f[0].to_string(), f[2].to_string(), opts)
        })
    })
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("running a command")
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Unmounts `dir` with `umount` and waits for its helper process to end.
fn umount_and_wait(dir: &Path) {
    let pids = helper_pids(dir);
    assert_eq!(pids.len(), 1, "one helper process serves {}", dir.display());
    let out = run(Command::new("umount").arg(dir));
    assert!(out.status.success(), "umount: {}", text(&out));
    wait_until("the helper process ends", Duration::from_secs(20), || {
        helper_pids(dir).is_empty()
    });
    assert!(
        mount_entry(dir).is_none(),
        "{} still mounted",
        dir.display()
    );
}

/// Guards against `mount -t fuse.tessera` not mounting, blocking in the foreground, or
/// leaving its process behind after `umount`.
#[test]
fn mount_t_fuse_tessera_mounts_in_the_background_and_umount_ends_it() {
    let f = Fixture::start();
    let ([dir], _cleanup) = f.mount_points(["m"]);
    let (cluster, key) = (&f.cluster, f.key());
    let log = cluster.dir().join("helper.log");
    let source = format!("{}:/", cluster.meta_addr());
    let opts = format!(
        "noexec,attr_ttl_ms=500,key_file={},log_file={}",
        key.display(),
        log.display()
    );
    // `output()` waits for standard output and error to close: it returns only if the
    // background process let go of them.
    let out = mount_t(&source, &dir, &opts);
    assert!(out.status.success(), "mount: {}", text(&out));
    let (src, fstype, options) = mount_entry(&dir).expect("mounted");
    assert_eq!(
        (src.as_str(), fstype.as_str()),
        (source.as_str(), "fuse.tessera")
    );
    assert!(options.contains(&"noexec".to_string()), "{options:?}");
    fs::create_dir(dir.join("data")).unwrap();
    fs::write(dir.join("data/a"), b"through the helper").unwrap();
    assert_eq!(fs::read(dir.join("data/a")).unwrap(), b"through the helper");
    umount_and_wait(&dir);
    let logged = fs::read_to_string(&log).unwrap_or_default();
    assert!(logged.contains("mounted"), "the log file: {logged}");
}

/// Guards against fstab lines not mounting (`mount -a`), options being ignored, the
/// subdirectory of `META:/path` not becoming the root, `noauto` lines mounting, and a
/// line naming two metadata servers (`A+B`, as `/proc/mounts` shows it) being mounted
/// again by a second `mount -a`.
#[test]
fn fstab_lines_mount_with_mount_a_a_subdirectory_read_only() {
    let f = Fixture::start();
    let cluster = &f.cluster;
    let admin = cluster.mount("admin");
    fs::create_dir_all(admin.path.join("sets/images")).unwrap();
    fs::write(admin.path.join("sets/images/0.jpg"), b"pixels").unwrap();
    fs::write(admin.path.join("top"), b"above the subdirectory").unwrap();
    let ([sub, skipped], _cleanup) = f.mount_points(["sub", "skipped"]);
    let key = f.key();
    let conf = cluster.dir().join("client.toml");
    fs::write(&conf, format!("key_file = {:?}\n", key.to_string_lossy())).unwrap();
    let log = cluster.dir().join("fstab.log");
    let addr = cluster.meta_addr();
    // A standby that is not there (nothing listens on port 1): the list is the point.
    let addrs = format!("{addr}+127.0.0.1:1");
    let fstab = cluster.dir().join("fstab");
    fs::write(
        &fstab,
        format!(
            "# Tessera, as an operator writes it\n\
             {addrs}:/sets {} fuse.tessera _netdev,ro,noatime,config={},log_file={} 0 0\n\
             {addr}:/ {} fuse.tessera _netdev,noauto,config={} 0 0\n",
            sub.display(),
            conf.display(),
            log.display(),
            skipped.display(),
            conf.display()
        ),
    )
    .unwrap();
    let mount_a = || run(Command::new("mount").arg("-a").arg("-T").arg(&fstab));
    let out = mount_a();
    assert!(out.status.success(), "mount -a: {}", text(&out));
    let (src, _, options) = mount_entry(&sub).expect("the fstab line mounted");
    assert_eq!(src, format!("{addrs}:/sets"));
    assert!(options.contains(&"ro".to_string()), "{options:?}");
    assert!(mount_entry(&skipped).is_none(), "a noauto line was mounted");
    assert_eq!(fs::read(sub.join("images/0.jpg")).unwrap(), b"pixels");
    assert!(
        !sub.join("top").exists(),
        "the root above the subdirectory shows"
    );
    let e = fs::write(sub.join("images/new"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    // Already mounted: a second `mount -a` leaves it as it is.
    let out = mount_a();
    assert!(out.status.success(), "mount -a again: {}", text(&out));
    assert_eq!(
        helper_pids(&sub).len(),
        1,
        "mount -a mounted the line twice"
    );
    umount_and_wait(&sub);
}

/// Guards against a failed mount hanging `mount`, reporting nothing, or leaving a
/// process: no server at the address, and a subdirectory that does not exist.
#[test]
fn a_mount_that_cannot_be_made_fails_with_the_reason() {
    let f = Fixture::start();
    let ([dir], _cleanup) = f.mount_points(["m"]);
    let (cluster, key) = (&f.cluster, f.key());
    let log = cluster.dir().join("helper.log");
    let opts = format!("key_file={},log_file={}", key.display(), log.display());
    let mount = |source: &str, opts: &str| mount_t(source, &dir, opts);
    // A port just closed: nothing listens there.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .to_string();
    let cases = [
        (
            format!("{}:/nope", cluster.meta_addr()),
            opts.clone(),
            "nope",
        ),
        (format!("{closed}:/"), opts.clone(), closed.as_str()),
        (
            format!("{}:/", cluster.meta_addr()),
            format!("{opts},no_such_setting=1"),
            "no_such_setting",
        ),
    ];
    for (source, opts, named) in cases {
        let out = mount(&source, &opts);
        let code = out.status.code();
        assert_eq!(code, Some(32), "mount(8)'s mount failure: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(named), "{source}: {err}");
        assert!(mount_entry(&dir).is_none(), "{source}: mounted anyway");
        wait_until("no helper process left", Duration::from_secs(10), || {
            helper_pids(&dir).is_empty()
        });
    }
}

/// Guards against a read-only mount still writing access times, and against the helper
/// keeping a caller's pipe open when `JOURNAL_STREAM` is inherited but standard error is
/// not the journal (a script capturing `mount`'s output then waited for the unmount).
#[test]
fn an_ro_mount_moves_no_atime_and_a_stale_journal_stream_is_not_kept() {
    let f = Fixture::start();
    let cluster = &f.cluster;
    let admin = cluster.mount("admin");
    fs::write(admin.path.join("f"), b"read me").unwrap();
    let before = fs::metadata(admin.path.join("f"))
        .unwrap()
        .accessed()
        .unwrap();
    let ([dir], _cleanup) = f.mount_points(["ro"]);
    let key = f.key();
    // No log_file: the default log, named after the mount point, removed below.
    let log = fs_client::cli::daemon::default_log(&dir);
    let out = run(Command::new("mount")
        .env("JOURNAL_STREAM", "1:1")
        .args(["-t", "fuse.tessera", &format!("{}:/", cluster.meta_addr())])
        .arg(&dir)
        .args(["-o", &format!("ro,strictatime,key_file={}", key.display())]));
    assert!(out.status.success(), "mount: {}", text(&out));
    assert_eq!(fs::read(dir.join("f")).unwrap(), b"read me");
    umount_and_wait(&dir);
    let logged = fs::read_to_string(&log).unwrap_or_default();
    let _ = fs::remove_file(&log);
    assert!(
        logged.contains("mounted"),
        "the default log {}: {logged}",
        log.display()
    );
    // Seen from another mount, whose cache holds nothing of the file.
    let m2 = cluster.mount("check");
    let after = fs::metadata(m2.path.join("f")).unwrap().accessed().unwrap();
    assert_eq!(
        before, after,
        "a read through an ro mount moved the access time"
    );
}

/// Guards against `mount -o remount,...` of a Tessera mount failing (the helper took
/// `remount` for an unknown setting), starting a second mount process, or not changing
/// the kernel's flags: read-only refuses a create with EROFS and keeps reads, read-write
/// again takes writes, and `dev` asked for takes `nodev` away.
#[test]
fn a_remount_changes_the_mounts_flags_in_place() {
    let f = Fixture::start();
    let ([dir], _cleanup) = f.mount_points(["m"]);
    let source = format!("{}:/", f.cluster.meta_addr());
    let out = mount_t(&source, &dir, &format!("key_file={}", f.key().display()));
    assert!(out.status.success(), "mount: {}", text(&out));
    fs::write(dir.join("kept"), b"before the remount").unwrap();
    let opts_of = |dir: &Path| mount_entry(dir).expect("still mounted").2;
    let remount = |opts: &str| {
        let out = run(Command::new("mount").args(["-o", opts]).arg(&dir));
        assert!(out.status.success(), "mount -o {opts}: {}", text(&out));
    };

    remount("remount,ro");
    let opts = opts_of(&dir);
    assert!(opts.contains(&"ro".to_string()), "{opts:?}");
    assert!(opts.contains(&"nodev".to_string()), "kept: {opts:?}");
    let e = fs::write(dir.join("new"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    assert_eq!(fs::read(dir.join("kept")).unwrap(), b"before the remount");

    remount("remount,rw,dev");
    let opts = opts_of(&dir);
    assert!(opts.contains(&"rw".to_string()), "{opts:?}");
    assert!(!opts.contains(&"nodev".to_string()), "{opts:?}");
    assert!(opts.contains(&"nosuid".to_string()), "kept: {opts:?}");
    fs::write(dir.join("new"), b"after").unwrap();
    assert_eq!(fs::read(dir.join("new")).unwrap(), b"after");
    // The one mount process served it all: umount_and_wait checks there is one.
    umount_and_wait(&dir);
}
