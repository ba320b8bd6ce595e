//! Unlinks a mount answers before the metadata server has them (`defer_removes`, see
//! `fs_client`'s `client/removes.rs`), on real mounts: every later call of that mount
//! sees the name gone (a lookup, a listing, a create of the same name, the `rmdir` of
//! the emptied directory) and the directory's times moved; `fsync` of the directory
//! makes the removals visible everywhere; a removal the server refuses after all (a flag
//! set through another mount meanwhile) loses nothing and is reported at the directory's
//! `fsync`; with `defer_removes = false` the refusal comes with the unlink.
//! They need root, /dev/fuse and `chattr` (e2fsprogs), as CI has.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use tessera_tests::ProcessCluster;

/// The mount's count of unlinks it answered before the server had them.
fn deferred(cluster: &ProcessCluster, mount: &str) -> f64 {
    let addr = cluster
        .metrics_addr(mount)
        .expect("the mount's metrics address");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let body = rt.block_on(telemetry::scrape(&addr)).unwrap();
    let scrape = telemetry::text::parse(&body).unwrap();
    scrape.sum("tessera_client_deferred_removes_total")
}

fn fsync_dir(p: &Path) -> io::Result<()> {
    fs::File::open(p)?.sync_all()
}

fn chattr(flag: &str, p: &Path) {
    let out = Command::new("chattr").arg(flag).arg(p).output().unwrap();
    assert!(
        out.status.success(),
        "chattr {flag} {}: {out:?}",
        p.display()
    );
}

/// (ctime, its nanoseconds) of `p`.
fn ctime(p: &Path) -> (i64, i64) {
    let m = fs::metadata(p).unwrap();
    (m.ctime(), m.ctime_nsec())
}

/// Guards against a removal on its way showing: `rm -r` goes on to the `rmdir`, `tar`
/// and editors make the name again at once, `ls` lists what is left, and POSIX says
/// the directory's times move with each removal.
#[test]
fn a_removed_name_is_gone_for_every_later_call_of_its_mount() {
    const FILES: usize = 300;
    let cluster = ProcessCluster::start(3);
    let conf = format!(
        "[metrics]\nlisten = \"127.0.0.1:0\"\naddr_file = \"{}\"\n",
        cluster.dir().join("a.metrics").display()
    );
    let (a, b) = (cluster.mount_with_config("a", &conf), cluster.mount("b"));
    let d = a.path.join("d");
    fs::create_dir(&d).unwrap();
    let name = |i: usize| d.join(format!("f{i:03}"));
    for i in 0..FILES {
        fs::write(name(i), b"x").unwrap();
    }
    assert_eq!(fs::read_dir(&d).unwrap().count(), FILES);
    for i in 0..FILES {
        let before = ctime(&d);
        fs::remove_file(name(i)).unwrap();
        // Asked while the removal may still be on its way.
        assert!(ctime(&d) > before, "the directory's ctime did not move");
        assert!(!name(i).exists(), "f{i:03} still found");
        if i % 50 == 0 {
            // Made again under the same name, exclusively, and removed again.
            let f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(name(i));
            drop(f.unwrap());
            fs::remove_file(name(i)).unwrap();
        }
        if i % 100 == 99 {
            let left: Vec<String> = fs::read_dir(&d)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            assert_eq!(left.len(), FILES - i - 1, "listed after f{i:03}: {left:?}");
            assert!(left
                .iter()
                .all(|n| n.as_str() > format!("f{i:03}").as_str()));
        }
    }
    fs::remove_dir(&d).unwrap();
    // Most of them: one finds no place while 8 changes answered early are kept.
    assert!(
        deferred(&cluster, "a") >= (FILES / 2) as f64,
        "the unlinks were answered before the server had them"
    );
    // The directory's removal waited for the names' own: the other mount, which
    // never saw the directory, finds nothing.
    assert!(!b.path.join("d").exists());
    fsync_dir(&a.path).unwrap();
}

/// Guards against an unlink answered early losing a file the server kept, or the
/// refusal going unreported: another mount made the file immutable after this one
/// looked it up (this mount's TTLs long, so that neither it nor the kernel asks again).
#[test]
fn a_removal_refused_after_all_keeps_the_file_and_fails_the_directory_s_fsync() {
    let cluster = ProcessCluster::start(3);
    let a = cluster.mount_with_config("a", "entry_ttl_ms = 60000\nattr_ttl_ms = 60000\n");
    let b = cluster.mount("b");
    let c = cluster.mount_with_config("c", "defer_removes = false\n");
    let f = a.path.join("kept");
    fs::write(&f, b"data").unwrap();
    assert_eq!(fs::metadata(&f).unwrap().len(), 4);
    assert!(c.path.join("kept").exists());
    chattr("+i", &b.path.join("kept"));

    // Mount a had no way to know: the unlink is answered, the refusal comes later.
    fs::remove_file(&f).unwrap();
    let e = fsync_dir(&a.path).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
    fsync_dir(&a.path).unwrap();
    // Nothing lost, on any mount; mount a finds the file again.
    assert_eq!(fs::read(b.path.join("kept")).unwrap(), b"data");
    assert_eq!(fs::read(&f).unwrap(), b"data");

    // Without deferred removes the unlink itself fails.
    let e = fs::remove_file(c.path.join("kept")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
    // Mount a now knows the file has attributes: its unlink waits for the server too.
    let e = fs::remove_file(&f).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");

    chattr("-i", &b.path.join("kept"));
    fs::remove_file(&f).unwrap();
    assert!(!f.exists());
    fsync_dir(&a.path).unwrap();
}
