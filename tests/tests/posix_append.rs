//! Appends on real mounts (issue 28, item 4): a mount that is a file's only writer
//! places `O_APPEND` writes under its append lease, at plain-write cost; a second
//! writer recalls the lease; a holder that stops answering loses it.
//! They need root and /dev/fuse, as CI has.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use std::fs::{self, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tessera_tests::posix::PYTHON;
use tessera_tests::ProcessCluster;

/// One appender: records `first..first + n` of writer `w`, each one `write` on an
/// O_APPEND fd; with a third argument, `fsync` after `sync_after` records, then
/// `ready` on stdout after all, and the fd held open until killed.
const APPENDER: &str = r#"
import os, sys, time
path, w, first, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
sync_after = int(sys.argv[5]) if len(sys.argv) > 5 else -1
fd = os.open(path, os.O_WRONLY | os.O_APPEND)
for i in range(first, first + n):
    ln = (i * 37 + w * 11) % 700 + 1
    rec = ("<%d:%04d:%05d:" % (w, i, ln)).encode() + bytes([97 + w]) * ln + b">\n"
    assert os.write(fd, rec) == len(rec)
    if i + 1 - first == sync_after:
        os.fsync(fd)
if sync_after >= 0:
    print("ready", flush=True)
    while True:
        time.sleep(1)
os.close(fd)
"#;

/// Bytes of record `i` of writer `w`.
fn record_len(w: usize, i: usize) -> usize {
    (i * 37 + w * 11) % 700 + 1 + 16
}

fn record(w: usize, i: usize) -> Vec<u8> {
    let ln = record_len(w, i) - 16;
    let mut r = format!("<{w}:{i:04}:{ln:05}:").into_bytes();
    r.extend(std::iter::repeat_n(b'a' + w as u8, ln));
    r.extend_from_slice(b">\n");
    r
}

fn appender(path: &Path, w: usize, first: usize, n: usize, sync_after: Option<usize>) -> Child {
    let mut c = Command::new(PYTHON);
    c.arg("-I").arg("-c").arg(APPENDER).arg(path);
    for a in [w, first, n] {
        c.arg(a.to_string());
    }
    if let Some(s) = sync_after {
        c.arg(s.to_string()).stdout(Stdio::piped());
    }
    c.stdin(Stdio::null()).spawn().expect("appender starts")
}

/// Waits for appenders to end well, for at most `limit`.
fn wait_all(children: &mut [Child], limit: Duration) {
    let deadline = Instant::now() + limit;
    for c in children.iter_mut() {
        loop {
            if let Some(s) = c.try_wait().unwrap() {
                assert!(s.success(), "appender failed: {s}");
                break;
            }
            if Instant::now() > deadline {
                children.iter_mut().for_each(|c| drop(c.kill()));
                panic!("appenders still running after {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The records of the file in order, as (writer, index); panics at the first byte out
/// of place (a torn or overlapped record, a gap of zeros).
fn parse(data: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < data.len() {
        let head = std::str::from_utf8(&data[pos..(pos + 14).min(data.len())])
            .unwrap_or_else(|_| panic!("garbage at {pos}"));
        let f: Vec<&str> = head.trim_start_matches('<').split(':').collect();
        assert!(
            head.starts_with('<') && f.len() >= 3,
            "bad header at {pos}: {head:?}"
        );
        let (w, i): (usize, usize) = (f[0].parse().unwrap(), f[1].parse().unwrap());
        let len = record_len(w, i);
        assert_eq!(
            &data[pos..pos + len],
            &record(w, i)[..],
            "record {w}:{i} at {pos}"
        );
        out.push((w, i));
        pos += len;
    }
    out
}

/// The records of writer `w` among `recs`, in file order.
fn of(recs: &[(usize, usize)], w: usize) -> Vec<usize> {
    recs.iter().filter(|r| r.0 == w).map(|r| r.1).collect()
}

/// A mount's count of metadata calls (its root's `tessera.stats`).
fn meta_calls(root: &Path) -> u64 {
    let out = tessera_tests::posix::getxattr(root, "tessera.stats").expect("tessera.stats");
    let text = String::from_utf8(out).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("meta_calls")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no meta_calls in {text:?}"))
}

/// Sends SIGKILL to a process when dropped (a stopped mount, if a test fails).
struct KillOnDrop(libc::pid_t);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: kill has no memory preconditions; a pid reaped already gets ESRCH.
        unsafe { libc::kill(self.0, libc::SIGKILL) };
    }
}

fn drop_caches() {
    fs::write("/proc/sys/vm/drop_caches", "3").expect("dropping the kernel's caches");
}

/// Guards against a sole writer's appends costing a metadata round trip each (about
/// 415 appends/s), and against the appends it places itself going astray: content
/// and length right, also after the caches are dropped and after a remount.
#[test]
fn a_sole_writers_appends_need_no_metadata_call_each() {
    const RECORDS: usize = 2000;
    let cluster = ProcessCluster::start(3);
    let a = cluster.mount("a");
    let f = a.path.join("log");
    fs::write(&f, b"").unwrap();
    let before = meta_calls(&a.path);
    wait_all(
        &mut [appender(&f, 0, 0, RECORDS, None)],
        Duration::from_secs(120),
    );
    let calls = meta_calls(&a.path) - before;
    assert!(
        calls < 50,
        "{calls} metadata calls for {RECORDS} appends: one each means no lease"
    );
    let want: Vec<u8> = (0..RECORDS).flat_map(|i| record(0, i)).collect();
    assert_eq!(fs::metadata(&f).unwrap().len(), want.len() as u64);
    assert!(fs::read(&f).unwrap() == want, "the appends as written");
    drop_caches();
    assert!(
        fs::read(&f).unwrap() == want,
        "after the caches were dropped"
    );
    a.unmount();
    let again = cluster.mount("again");
    assert!(
        fs::read(again.path.join("log")).unwrap() == want,
        "after a remount"
    );
}

/// Guards against appends from two mounts overlapping or tearing once one of them
/// held the lease: every record once, whole, in each writer's order.
#[test]
fn two_mounts_appending_at_once_lose_and_overlap_nothing() {
    const RECORDS: usize = 2000;
    let cluster = ProcessCluster::start(3);
    let (a, b) = (cluster.mount("a"), cluster.mount("b"));
    fs::write(a.path.join("log"), b"").unwrap();
    let mut children = [
        appender(&a.path.join("log"), 0, 0, RECORDS, None),
        appender(&b.path.join("log"), 1, 0, RECORDS, None),
    ];
    wait_all(&mut children, Duration::from_secs(300));
    let data = fs::read(b.path.join("log")).unwrap();
    let want: usize = (0..2)
        .flat_map(|w| (0..RECORDS).map(move |i| record_len(w, i)))
        .sum();
    assert_eq!(data.len(), want, "no record lost, no gap");
    let recs = parse(&data);
    for w in 0..2 {
        assert_eq!(of(&recs, w), (0..RECORDS).collect::<Vec<_>>(), "writer {w}");
    }
    assert!(
        fs::read(a.path.join("log")).unwrap() == data,
        "both mounts agree"
    );
}

/// Guards against a mount that kept believing it held a lease its last close had ended
/// (that close went by the batched release, which ends the server's lease): its next
/// append, made while another mount had the file open for writing, went under no lease
/// and its length was refused, left to later opens of that mount only.
#[test]
fn an_append_after_the_close_that_ended_the_lease_is_committed() {
    let cluster = ProcessCluster::start(3);
    let (a, b) = (cluster.mount("a"), cluster.mount("b"));
    let (fa, fb) = (a.path.join("log"), b.path.join("log"));
    fs::write(&fa, b"").unwrap();
    let append = |data: &[u8]| {
        let mut f = OpenOptions::new().append(true).open(&fa).unwrap();
        f.write_all(data).unwrap();
        f.sync_all().expect("fsync of an append");
    };
    append(b"first\n");
    // Not a readiness wait: the close's session ends in a batch sent 2 ms after it,
    // and with it the server's lease; the other mount's open must come after that.
    std::thread::sleep(Duration::from_millis(100));
    let held = OpenOptions::new().write(true).open(&fb).unwrap();
    append(b"second\n");
    assert_eq!(
        fs::read(&fb).unwrap(),
        b"first\nsecond\n",
        "the other mount"
    );
    drop(held);
    assert_eq!(
        fs::read(&fa).unwrap(),
        b"first\nsecond\n",
        "the appending mount"
    );
}

/// Guards against a second writer's open that does not recall the lease: what the
/// holder placed under it must be committed (the newcomer reads it at once) and the
/// appends of both must follow each other, whole, in the order they were made.
#[test]
fn a_second_writer_recalls_the_lease() {
    let cluster = ProcessCluster::start(3);
    let (a, b) = (cluster.mount("a"), cluster.mount("b"));
    fs::write(a.path.join("log"), b"").unwrap();
    let open = |p: &Path| OpenOptions::new().append(true).open(p).unwrap();
    let mut ha = open(&a.path.join("log"));
    let before = meta_calls(&a.path);
    for i in 0..100 {
        ha.write_all(&record(0, i)).unwrap();
    }
    assert!(meta_calls(&a.path) - before < 10, "a holds the lease");
    let mut hb = open(&b.path.join("log"));
    let seen = fs::read(b.path.join("log")).unwrap();
    assert_eq!(
        of(&parse(&seen), 0),
        (0..100).collect::<Vec<_>>(),
        "committed by the recall"
    );
    for i in 0..100 {
        hb.write_all(&record(1, i)).unwrap();
    }
    for i in 100..200 {
        ha.write_all(&record(0, i)).unwrap();
    }
    for i in 100..200 {
        hb.write_all(&record(1, i)).unwrap();
    }
    drop((ha, hb));
    let recs = parse(&fs::read(a.path.join("log")).unwrap());
    let want: Vec<(usize, usize)> = [(0, 0..100), (1, 0..100), (0, 100..200), (1, 100..200)]
        .into_iter()
        .flat_map(|(w, r)| r.map(move |i| (w, i)))
        .collect();
    assert_eq!(recs, want);
}

/// Guards against a lease holder that stops answering (its mount stopped, then
/// killed) holding other writers off forever, or its unsynced appends coming back
/// over theirs: the other mount's open goes through once the lease runs out, its
/// appends follow what the holder synced, and `tessera fsck` is clean.
#[test]
fn a_stopped_lease_holder_loses_its_lease_and_the_other_writer_goes_on() {
    let cluster = ProcessCluster::start(3);
    let (mut a, b) = (cluster.mount("a"), cluster.mount("b"));
    let log = a.path.join("log");
    fs::write(&log, b"").unwrap();
    // 60 records, the first 40 fsynced, then the fd held open.
    let mut holder = appender(&log, 0, 0, 60, Some(40));
    let mut line = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let pid = a.pid() as libc::pid_t;
    // SAFETY: kill has no memory preconditions; the pid is our child's.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    // A stopped mount takes no SIGTERM: if the test fails from here, it is killed.
    let _unstop = KillOnDrop(pid);
    let started = Instant::now();
    let mut hb = OpenOptions::new()
        .append(true)
        .open(b.path.join("log"))
        .unwrap();
    let waited = started.elapsed();
    for i in 0..100 {
        hb.write_all(&record(1, i)).unwrap();
    }
    drop(hb);
    // SIGKILL ends a stopped process too; then the holder's close fails at once.
    a.kill_client();
    let _ = holder.kill();
    let _ = holder.wait();
    let recs = parse(&fs::read(b.path.join("log")).unwrap());
    let synced = of(&recs, 0);
    assert!(
        synced.len() >= 40 && synced == (0..synced.len()).collect::<Vec<_>>(),
        "the holder's synced appends stay, in order: {synced:?}"
    );
    assert_eq!(
        of(&recs, 1),
        (0..100).collect::<Vec<_>>(),
        "the other writer's"
    );
    assert!(
        recs.iter().position(|r| r.0 == 1) == Some(synced.len()),
        "the other writer's appends follow the holder's"
    );
    let (code, out) = cluster.tessera(&["fsck"]);
    assert_eq!(code, 0, "fsck: {out}");
    eprintln!("the open waited {waited:?} for the stopped holder's lease");
}
