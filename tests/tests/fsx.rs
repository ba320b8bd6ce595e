//! Random file operations on a real mount, each checked against an in-memory model of
//! the file, in the manner of fsx: buffered and `O_DIRECT` reads and writes, reads and
//! writes through a shared mapping, appends through an `O_APPEND` descriptor,
//! truncation both ways, `fallocate` (grow, keep size, punch, zero), `copy_file_range`
//! within the file, fsync, and closing and opening again (sometimes with the kernel's
//! caches dropped). After every operation the length `fstat` reports must be the
//! model's; the whole file is compared regularly and, caches dropped, at the end.
//! Once on a default mount and once with the kernel's writeback cache; and once from
//! two mounts in turn, each operation between an open and a close, where every open
//! must see the file as the last close on either mount left it (close-to-open).
//! The seed is printed; rerun one with `TESSERA_FSX_SEED=<n>`. Needs root and /dev/fuse.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use tessera_tests::posix::{fallocate, with_shared_map};
use tessera_tests::{ProcessCluster, Rng};
use transport::AlignedBuf;

/// Operations per run; each is a few system calls on a file of at most `MAX_LEN`.
const OPS: usize = 1500;
const MAX_LEN: u64 = 8 << 20;
/// `O_DIRECT` offsets and lengths are multiples of this.
const ALIGN: usize = 4096;

fn copy_range(f: &File, from: u64, to: u64, len: usize) -> std::io::Result<usize> {
    let (mut off_in, mut off_out) = (from as i64, to as i64);
    let fd = f.as_raw_fd();
    // SAFETY: valid descriptor and offset pointers for the duration of the call.
    let r = unsafe { libc::copy_file_range(fd, &mut off_in, fd, &mut off_out, len, 0) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// The file's bytes from the start, at most `max` (reads until end of file).
fn read_up_to(f: &File, max: usize) -> Vec<u8> {
    let mut got = vec![0u8; max];
    let mut n = 0;
    while n < got.len() {
        let r = f.read_at(&mut got[n..], n as u64).unwrap();
        if r == 0 {
            break;
        }
        n += r;
    }
    got.truncate(n);
    got
}

fn drop_caches() {
    std::fs::write("/proc/sys/vm/drop_caches", "3").expect("dropping the kernel's caches");
}

fn open_rw(path: &Path, flags: i32) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(flags)
        .open(path)
        .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()))
}

/// A length for a buffered operation: small, page-sized, odd and large ones.
fn some_len(rng: &mut Rng) -> u64 {
    match rng.below(4) {
        0 => *rng.pick(&[1, 7, 511, 4095, 4096, 4097, 65_536, 1 << 20]),
        _ => 1 + rng.below(300_000),
    }
}

struct Run {
    rng: Rng,
    model: Vec<u8>,
    path: std::path::PathBuf,
    file: File,
    direct: File,
    append: File,
    log: Vec<String>,
}

impl Run {
    fn fail(&self, what: String) -> ! {
        let recent = self.log.iter().rev().take(12).rev().cloned();
        panic!(
            "{what}\nlast operations:\n  {}",
            recent.collect::<Vec<_>>().join("\n  ")
        );
    }

    fn expect_bytes(&self, off: u64, got: &[u8], how: &str) {
        let end = (off as usize + got.len()).min(self.model.len());
        let want = self.model.get(off as usize..end).unwrap_or(&[]);
        if got != want {
            let at = got.iter().zip(want).position(|(a, b)| a != b);
            self.fail(format!(
                "{how} at {off}: {} bytes, model {}; first difference at {:?}",
                got.len(),
                want.len(),
                at.map(|i| off as usize + i)
            ));
        }
    }

    fn expect_len(&self, how: &str) {
        let len = self.file.metadata().unwrap().len();
        if len != self.model.len() as u64 {
            self.fail(format!(
                "after {how}: fstat length {len}, model {}",
                self.model.len()
            ));
        }
    }

    fn read_all(&self, f: &File, how: &str) {
        let got = read_up_to(f, self.model.len() + 4096);
        if got.len() != self.model.len() {
            self.fail(format!(
                "{how}: read {} bytes, model {}",
                got.len(),
                self.model.len()
            ));
        }
        self.expect_bytes(0, &got, how);
    }

    fn put(&mut self, off: u64, data: &[u8]) {
        let end = off as usize + data.len();
        if end > self.model.len() {
            self.model.resize(end, 0);
        }
        self.model[off as usize..end].copy_from_slice(data);
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        random_bytes(&mut self.rng, len)
    }

    fn step(&mut self, i: usize) {
        let size = self.model.len() as u64;
        let op = self.rng.below(100);
        match op {
            // Buffered read.
            0..=17 => {
                let off = self.rng.below(size + 1);
                let mut buf = vec![0u8; some_len(&mut self.rng) as usize];
                self.log.push(format!("{i}: read {off} +{}", buf.len()));
                let n = self.file.read_at(&mut buf, off).unwrap();
                self.expect_bytes(off, &buf[..n], "read");
                let want = (size.saturating_sub(off) as usize).min(buf.len());
                if n != want {
                    self.fail(format!("read at {off}: {n} bytes, want {want}"));
                }
            }
            // Buffered write, anywhere up to the largest length.
            18..=39 => {
                let off = self.rng.below(MAX_LEN);
                let len = some_len(&mut self.rng).min(MAX_LEN - off).max(1);
                let data = self.bytes(len as usize);
                self.log.push(format!("{i}: write {off} +{len}"));
                self.file.write_all_at(&data, off).unwrap();
                self.put(off, &data);
            }
            // Read through a mapping.
            40..=44 if size > 0 => {
                let off = self.rng.below(size) as usize;
                let len = (some_len(&mut self.rng) as usize).min(size as usize - off);
                self.log.push(format!("{i}: map read {off} +{len}"));
                let mut got = Vec::new();
                with_shared_map(&self.file, size as usize, true, |m| {
                    got = m[off..off + len].to_vec()
                });
                self.expect_bytes(off as u64, &got, "map read");
            }
            // Write through a mapping (the file grown first if needed).
            45..=49 => {
                let off = self.rng.below(MAX_LEN);
                let len = some_len(&mut self.rng).min(MAX_LEN - off).max(1);
                let end = off + len;
                self.log.push(format!("{i}: map write {off} +{len}"));
                if end > size {
                    self.file.set_len(end).unwrap();
                    self.model.resize(end as usize, 0);
                }
                let data = self.bytes(len as usize);
                let map_len = self.model.len();
                with_shared_map(&self.file, map_len, true, |m| {
                    m[off as usize..end as usize].copy_from_slice(&data)
                });
                self.put(off, &data);
            }
            // Truncate, down or up.
            50..=55 => {
                let len = self.rng.below(MAX_LEN);
                self.log.push(format!("{i}: truncate to {len}"));
                self.file.set_len(len).unwrap();
                self.model.resize(len as usize, 0);
            }
            // fallocate: grow, keep size, punch, zero.
            56..=64 => {
                let (keep, punch, zero) = (
                    libc::FALLOC_FL_KEEP_SIZE,
                    libc::FALLOC_FL_PUNCH_HOLE,
                    libc::FALLOC_FL_ZERO_RANGE,
                );
                let mode = *self.rng.pick(&[0, keep, punch | keep, zero, zero | keep]);
                let off = self.rng.below(MAX_LEN);
                let len = some_len(&mut self.rng).min(MAX_LEN - off).max(1);
                self.log
                    .push(format!("{i}: fallocate mode {mode:#x} {off} +{len}"));
                fallocate(&self.file, mode, off, len)
                    .unwrap_or_else(|e| self.fail(format!("fallocate {mode:#x}: {e}")));
                let end = (off + len) as usize;
                if mode & (punch | zero) != 0 {
                    let to = end.min(self.model.len());
                    if (off as usize) < to {
                        self.model[off as usize..to].fill(0);
                    }
                }
                if mode & keep == 0 && end > self.model.len() {
                    self.model.resize(end, 0);
                }
            }
            // copy_file_range within the file, ranges not overlapping.
            65..=69 if size > 0 => {
                let from = self.rng.below(size);
                let len = some_len(&mut self.rng).min(size - from);
                let to = self.rng.below(MAX_LEN - len);
                if to < from + len && from < to + len {
                    return;
                }
                self.log.push(format!("{i}: copy {from} -> {to} +{len}"));
                let n = copy_range(&self.file, from, to, len as usize)
                    .unwrap_or_else(|e| self.fail(format!("copy_file_range: {e}")));
                let data = self.model[from as usize..from as usize + n].to_vec();
                self.put(to, &data);
            }
            // O_DIRECT read and write, aligned.
            70..=74 if size > 0 => {
                let off = self.rng.below(size) & !(ALIGN as u64 - 1);
                let len = (1 + self.rng.index(64)) * ALIGN;
                let mut buf = AlignedBuf::zeroed(len);
                self.log.push(format!("{i}: direct read {off} +{len}"));
                let n = self.direct.read_at(&mut buf, off).unwrap();
                self.expect_bytes(off, &buf[..n], "direct read");
                let want = (size - off).min(len as u64) as usize;
                if n != want {
                    self.fail(format!("direct read at {off}: {n} bytes, want {want}"));
                }
            }
            75..=79 => {
                let off = self.rng.below(MAX_LEN) & !(ALIGN as u64 - 1);
                let len = ((1 + self.rng.index(64)) * ALIGN).min((MAX_LEN - off) as usize);
                let data = self.bytes(len);
                let mut buf = AlignedBuf::zeroed(len);
                buf.copy_from_slice(&data);
                self.log.push(format!("{i}: direct write {off} +{len}"));
                self.direct.write_all_at(&buf, off).unwrap();
                self.put(off, &data);
            }
            // Append through the O_APPEND descriptor.
            80..=85 if size < MAX_LEN => {
                let len = some_len(&mut self.rng).min(MAX_LEN - size).max(1);
                let data = self.bytes(len as usize);
                self.log.push(format!("{i}: append +{len} at {size}"));
                use std::io::Write;
                self.append.write_all(&data).unwrap();
                self.model.extend_from_slice(&data);
            }
            86..=88 => {
                self.log.push(format!("{i}: fsync"));
                self.file.sync_all().unwrap();
            }
            // Close everything and open again, sometimes with cold caches.
            89..=93 => {
                let cold = self.rng.below(3) == 0;
                self.log
                    .push(format!("{i}: reopen (caches dropped: {cold})"));
                self.reopen(cold);
            }
            94..=99 => {
                self.log.push(format!("{i}: compare whole file"));
                self.read_all(&self.file, "whole-file read");
            }
            _ => {}
        }
        self.expect_len(&self.log.last().cloned().unwrap_or_default());
    }

    fn reopen(&mut self, cold: bool) {
        // The new descriptors are opened before the old ones close, so the file is
        // never without one (the old ones drop on assignment).
        let (file, direct) = (open_rw(&self.path, 0), open_rw(&self.path, libc::O_DIRECT));
        let append = OpenOptions::new().append(true).open(&self.path).unwrap();
        self.file = file;
        self.direct = direct;
        self.append = append;
        if cold {
            drop_caches();
        }
    }
}

fn run(dir: &Path, seed: u64) {
    let path = dir.join(format!("fsx-{seed}"));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    let mut r = Run {
        rng: Rng::new(seed),
        model: Vec::new(),
        direct: open_rw(&path, libc::O_DIRECT),
        append: OpenOptions::new().append(true).open(&path).unwrap(),
        path,
        file,
        log: Vec::new(),
    };
    for i in 0..OPS {
        r.step(i);
    }
    r.read_all(&r.file, "final read");
    r.file.sync_all().unwrap();
    r.reopen(true);
    r.read_all(&r.file, "read after the caches were dropped");
}

fn seed() -> u64 {
    tessera_tests::client_io::seed_from_env("TESSERA_FSX_SEED")
}

/// Guards against any mismatch between what the file system returns and what was
/// written, across the whole set of ways a program can change and read a file.
#[test]
fn random_file_operations_match_the_model() {
    let cluster = ProcessCluster::start(3);
    let m = cluster.mount("a");
    run(&m.path, seed());
}

/// The same with the kernel's writeback cache, where the kernel holds written bytes
/// and the file's length: guards against `O_DIRECT` reads that miss bytes the page
/// cache holds and appends placed at the server's end instead of the kernel's.
#[test]
fn random_file_operations_match_the_model_with_the_writeback_cache() {
    let cluster = ProcessCluster::start(3);
    let m = cluster.mount_with_config("a", "writeback_cache = true\n");
    run(&m.path, seed());
}

fn random_bytes(rng: &mut Rng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for c in v.chunks_mut(8) {
        c.copy_from_slice(&rng.next_u64().to_le_bytes()[..c.len()]);
    }
    v
}

/// One step of the two-mount run: open the file on one mount, change or check it,
/// close it.
fn two_mount_step(
    rng: &mut Rng,
    model: &mut Vec<u8>,
    path: &Path,
    i: usize,
    mount: &str,
) -> String {
    use std::io::Write;
    let size = model.len() as u64;
    let what;
    match i % 7 {
        0 | 1 => {
            let off = rng.below(MAX_LEN / 2);
            let len = 1 + rng.index(300_000);
            let data = random_bytes(rng, len);
            what = format!("write {off} +{}", data.len());
            open_rw(path, 0).write_all_at(&data, off).unwrap();
            let end = off as usize + data.len();
            if end > model.len() {
                model.resize(end, 0);
            }
            model[off as usize..end].copy_from_slice(&data);
        }
        2 => {
            let len = 1 + rng.index(100_000);
            let data = random_bytes(rng, len);
            what = format!("append +{}", data.len());
            let mut f = OpenOptions::new().append(true).open(path).unwrap();
            f.write_all(&data).unwrap();
            model.extend_from_slice(&data);
        }
        3 => {
            let len = rng.below(MAX_LEN / 2);
            what = format!("truncate to {len}");
            open_rw(path, 0).set_len(len).unwrap();
            model.resize(len as usize, 0);
        }
        4 if size > 0 => {
            let off = rng.below(size) as usize;
            let len = (1 + rng.index(100_000)).min(size as usize - off);
            let data = random_bytes(rng, len);
            what = format!("map write {off} +{}", data.len());
            let f = open_rw(path, 0);
            // Checked before mapping: a shorter file would fault, not fail.
            let len = f.metadata().unwrap().len();
            assert_eq!(
                len, size,
                "fstat length at the open of {i}: {what} on {mount}"
            );
            with_shared_map(&f, size as usize, true, |m| {
                m[off..off + data.len()].copy_from_slice(&data)
            });
            model[off..off + data.len()].copy_from_slice(&data);
        }
        _ => what = "read".into(),
    }
    // Every open sees the last close's file: length by fstat, then every byte.
    let f = File::open(path).unwrap();
    let len = f.metadata().unwrap().len();
    let got = read_up_to(&f, model.len() + 4096);
    let step = format!("{i}: {what} on {mount}");
    assert_eq!(len, model.len() as u64, "fstat length after {step}");
    assert!(
        got == *model,
        "bytes after {step}: read {}, model {}",
        got.len(),
        model.len()
    );
    step
}

/// Guards against an open that shows attributes or bytes older than the last close on
/// another mount: a length kept from this mount's own earlier commit, a `stat` from
/// before the other mount's append, pages cached from before its write.
#[test]
fn operations_from_two_mounts_in_turn_match_the_model_at_every_open() {
    let cluster = ProcessCluster::start(3);
    let (a, b) = (cluster.mount("a"), cluster.mount("b"));
    let mut rng = Rng::new(seed());
    let name = "shared";
    File::create(a.path.join(name)).unwrap();
    let mut model = Vec::new();
    for i in 0..300 {
        // Each mount looks at the file now and then between its turns, as `ls -l`
        // would, so that its kernel holds attributes from before the other's change.
        let (m, other) = if rng.below(2) == 0 {
            (&a, &b)
        } else {
            (&b, &a)
        };
        if rng.below(3) == 0 {
            std::fs::metadata(other.path.join(name)).unwrap();
        }
        let label = if std::ptr::eq(m, &a) { "a" } else { "b" };
        two_mount_step(&mut rng, &mut model, &m.path.join(name), i, label);
    }
}
