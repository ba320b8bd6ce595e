//! A mount that made a directory knows every name in it and answers the lookup of a
//! missing name itself (the lookup the kernel sends before each create): what another
//! mount does in that directory must still come out right. Real mounts of one cluster;
//! they need root and /dev/fuse, as CI has.

use std::fs::{self, OpenOptions};
use std::io::{ErrorKind, Write};
use std::time::{Duration, Instant};
use tessera_tests::ProcessCluster;

/// A file made by another mount while this one trusts its list of names: a create
/// still goes to the server, so `O_EXCL` fails and `O_TRUNC` empties that file instead
/// of leaving its old bytes under the new ones; the list is dropped then, and the name
/// is found.
#[test]
fn a_create_over_a_name_another_mount_made_meanwhile_is_right() {
    let cluster = ProcessCluster::start(2);
    // A TTL far longer than the test: the lists are trusted throughout.
    let a = cluster.mount_with_config("a", "attr_ttl_ms = 60000\nentry_ttl_ms = 60000\n");
    let b = cluster.mount("b");
    let old: &[u8] = b"written by b, longer than the new bytes";
    // Each directory just before its create: a change elsewhere (another mkdir) would
    // send the kernel's next `getattr` of the directory to the server, whose answer
    // shows b's change and drops the list: that path is not the one tested here.
    let made_here_then_by_b = |d: &str| {
        fs::create_dir(a.path.join(d)).unwrap();
        fs::write(a.path.join(d).join("first"), b"1").unwrap();
        fs::write(b.path.join(d).join("x"), old).unwrap();
    };

    // A truncating create empties b's file: no old bytes after the new ones.
    made_here_then_by_b("d1");
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(a.path.join("d1/x"))
        .unwrap();
    f.write_all(b"new").unwrap();
    drop(f);
    assert_eq!(fs::read(a.path.join("d1/x")).unwrap(), b"new");
    assert_eq!(
        fs::read(b.path.join("d1/x")).unwrap(),
        b"new",
        "as b reads it"
    );

    // An exclusive create fails, and the name is found from then on.
    made_here_then_by_b("d2");
    let excl = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(a.path.join("d2/x"));
    assert_eq!(
        excl.map(drop).map_err(|e| e.kind()),
        Err(ErrorKind::AlreadyExists),
        "O_EXCL over another mount's file"
    );
    assert_eq!(fs::read(a.path.join("d2/x")).unwrap(), old);

    // Names this mount removed are gone; the listing has what both made.
    fs::remove_file(a.path.join("d2/first")).unwrap();
    assert_eq!(
        fs::metadata(a.path.join("d2/first"))
            .map(drop)
            .map_err(|e| e.kind()),
        Err(ErrorKind::NotFound)
    );
    let names: Vec<_> = fs::read_dir(a.path.join("d2"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["x"]);
}

/// Another mount's new name shows here once the entry TTL has run out: the expired
/// list is checked against the directory's attributes, which moved.
#[test]
fn another_mounts_new_name_shows_after_the_entry_ttl() {
    let cluster = ProcessCluster::start(2);
    let ttl = Duration::from_millis(300);
    let a = cluster.mount_with_config("a", "attr_ttl_ms = 300\nentry_ttl_ms = 300\n");
    let b = cluster.mount("b");
    let dir = a.path.join("d");
    fs::create_dir(&dir).unwrap();
    for i in 0..20 {
        fs::write(dir.join(format!("a{i}")), b"a").unwrap();
    }
    let made = Instant::now();
    fs::write(b.path.join("d/from_b"), b"b").unwrap();
    // Within the TTL this mount may still say it is missing; past it, it must find it.
    std::thread::sleep(ttl.saturating_sub(made.elapsed()) + Duration::from_millis(100));
    assert_eq!(fs::read(dir.join("from_b")).unwrap(), b"b");
    // And the same for a name b removes: a list of a's own is not trusted past the TTL
    // either (b's unlink moved the directory).
    fs::write(dir.join("again"), b"a").unwrap();
    fs::remove_file(b.path.join("d/a0")).unwrap();
    std::thread::sleep(ttl + Duration::from_millis(100));
    assert_eq!(
        fs::metadata(dir.join("a0")).map(drop).map_err(|e| e.kind()),
        Err(ErrorKind::NotFound)
    );
    assert!(fs::metadata(dir.join("again")).is_ok());
}

/// Files each of two threads makes in [`creates_beside_stats_of_their_directory_send_no_lookups`].
const CREATED: usize = 300;
/// `stat`s of the directory at most, back to back while the creates run.
const STATS: usize = 5000;

/// Two threads create files in one directory while a third `stat`s it: a `getattr`
/// answered while a create is on its way back shows the create's ctime before the
/// create's own reply does. The mount keeps its list of names through that, so the
/// kernel's lookup before each create is answered by the mount, not the server. It
/// dropped the list at the first such crossing and then sent a lookup per create.
#[test]
fn creates_beside_stats_of_their_directory_send_no_lookups() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let cluster = ProcessCluster::start(2);
    // No attributes kept, so every stat reaches the server; names and the list are
    // trusted throughout. Before the fix: about one lookup per create (598 of 600).
    let a = cluster.mount_with_config("a", "attr_ttl_ms = 0\nentry_ttl_ms = 60000\n");
    let dir = a.path.join("many");
    fs::create_dir(&dir).unwrap();
    let before = a.counts().lookups;
    let done = AtomicBool::new(false);
    let stats = std::thread::scope(|s| {
        let creators: Vec<_> = (0..2)
            .map(|t| {
                let dir = &dir;
                s.spawn(move || {
                    for i in 0..CREATED {
                        let path = dir.join(format!("t{t}-{i:03}"));
                        let made = OpenOptions::new().write(true).create_new(true).open(path);
                        made.unwrap_or_else(|e| panic!("create t{t}-{i:03}: {e}"));
                    }
                })
            })
            .collect();
        let stat = s.spawn(|| {
            let mut n = 0;
            while !done.load(Ordering::Relaxed) && n < STATS {
                fs::metadata(&dir).unwrap();
                n += 1;
            }
            n
        });
        for c in creators {
            c.join().unwrap();
        }
        done.store(true, Ordering::Relaxed);
        stat.join().unwrap()
    });
    let sent = a.counts().lookups - before;
    assert!(stats > 10, "the stats ran beside the creates ({stats})");
    assert!(
        sent <= 2,
        "{sent} lookups for {} creates beside {stats} stats",
        2 * CREATED
    );
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 2 * CREATED);
}
