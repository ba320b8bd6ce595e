//! Read-around (`fs-client/src/file/around.rs`) on real mounts: a small random read
//! hands the read-around block around it (64 or 256 KiB) to the kernel's page cache. These tests guard
//! against the cache ever holding bytes the file does not have: wrong offsets, bytes
//! past the end, bytes older than a write or a truncation made through the same mount.
//! They need root and /dev/fuse, as CI has.

use std::fs::{self, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tessera_tests::client_io::seed_from_env;
use tessera_tests::{pseudo_random, sha256_hex, wait_until_blocking, ProcessCluster, Rng};

const PAGE: usize = 4096;
/// Random reads made before the truncation, and again after it, while it is checked.
const READS_AROUND_CUT: u64 = 200;
/// Reads the reader makes at most, so that it ends whatever happens.
const MAX_READS_AROUND_CUT: u64 = 200_000;

/// Random 4 KiB reads on a mount that never saw the file; afterwards every byte the
/// mount serves (most of it now from blocks stored around those reads) is the file's,
/// and the length did not grow past the file's odd-sized tail.
#[test]
fn random_reads_fill_the_page_cache_with_the_right_bytes() {
    let seed = seed_from_env("TESSERA_AROUND_SEED");
    let cluster = ProcessCluster::start(3);
    let (a, b) = (cluster.mount("a"), cluster.mount("b"));
    // Not a multiple of the block: the last block is short.
    let data = pseudo_random((8 << 20) + 12_345, seed);
    fs::write(a.path.join("f"), &data).unwrap();

    let f = fs::File::open(b.path.join("f")).unwrap();
    let mut rng = Rng::new(seed | 1);
    let mut page = vec![0u8; PAGE];
    for _ in 0..600 {
        let at = rng.index(data.len() - PAGE);
        f.read_exact_at(&mut page, at as u64).unwrap();
        assert_eq!(page, data[at..at + PAGE], "4 KiB read at {at}");
    }
    // The short tail block, read around too.
    let tail = data.len() - 100;
    let mut end = vec![0u8; 100];
    f.read_exact_at(&mut end, tail as u64).unwrap();
    assert_eq!(end, data[tail..]);
    assert_eq!(f.metadata().unwrap().len(), data.len() as u64);
    let back = fs::read(b.path.join("f")).unwrap();
    assert_eq!(back.len(), data.len(), "length as written");
    assert_eq!(
        sha256_hex(&back),
        sha256_hex(&data),
        "every byte as written"
    );
}

/// A writer rewrites random pages while readers of the same mount read at random (each
/// read may store a block); once all are done, every page shows its last write. The
/// race it guards against is narrow: without the store gate, about one run in three
/// fails here.
/// Then a truncation while reads go on: the length stays the cut one.
#[test]
fn writes_and_truncation_through_the_mount_are_never_undone_by_a_stored_block() {
    let seed = seed_from_env("TESSERA_AROUND_SEED");
    let cluster = ProcessCluster::start(3);
    let m = cluster.mount("m");
    let path = m.path.join("g");
    let pages = 1024;
    let mut expect = vec![0u8; pages * PAGE];
    for (i, p) in expect.chunks_mut(PAGE).enumerate() {
        p.fill((i % 251) as u8);
    }
    fs::write(&path, &expect).unwrap();
    let expect = Arc::new(Mutex::new(expect));
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_secs(4);

    let readers: Vec<_> = (0..3u64)
        .map(|r| {
            let (path, stop) = (path.clone(), stop.clone());
            std::thread::spawn(move || {
                let f = fs::File::open(&path).unwrap();
                let mut rng = Rng::new(seed ^ ((r + 1) * 0x9E37_79B9));
                let mut page = vec![0u8; PAGE];
                let mut reads = 0u64;
                while !stop.load(Ordering::Relaxed) && reads < 200_000 {
                    let at = rng.index(pages) * PAGE;
                    f.read_exact_at(&mut page, at as u64).unwrap();
                    reads += 1;
                    if reads.is_multiple_of(64) {
                        // Drop the file's clean cached pages, so that reads keep going
                        // to the client and storing blocks while the writer writes.
                        // SAFETY: an open descriptor; advice only, no memory touched.
                        unsafe {
                            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED)
                        };
                    }
                }
                reads
            })
        })
        .collect();
    let mut rng = Rng::new(seed.rotate_left(17) | 1);
    let mut writes = 0u64;
    while Instant::now() < deadline && writes < 20_000 {
        // A fresh writable open each round, as a checkpointing loop would.
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        for _ in 0..40 {
            writes += 1;
            let i = rng.index(pages);
            let fill = (writes % 255) as u8 + 1;
            let page = vec![fill; PAGE];
            f.write_at(&page, (i * PAGE) as u64).unwrap();
            expect.lock().unwrap()[i * PAGE..(i + 1) * PAGE].copy_from_slice(&page);
        }
        drop(f);
        // A pause on purpose: the readers get the mount between rounds of writes.
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    let reads: u64 = readers.into_iter().map(|t| t.join().unwrap()).sum();
    eprintln!("seed {seed}: {writes} page writes, {reads} random reads");
    assert!(reads > 0 && writes > 0);
    let back = fs::read(&path).unwrap();
    let expect = expect.lock().unwrap().clone();
    let stale: Vec<usize> = (0..pages)
        .filter(|i| back[i * PAGE..(i + 1) * PAGE] != expect[i * PAGE..(i + 1) * PAGE])
        .collect();
    assert!(
        stale.is_empty(),
        "pages older than their last write: {stale:?}"
    );

    // Truncation by path (no writable open) while reads go on: some before the cut,
    // some after it.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let reader = {
        let (path, stop, done) = (path.clone(), stop.clone(), done.clone());
        std::thread::spawn(move || {
            let f = fs::File::open(&path).unwrap();
            let mut rng = Rng::new(seed | 3);
            let mut page = vec![0u8; PAGE];
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) && n < MAX_READS_AROUND_CUT {
                // Past the cut the reads come back short or empty: fine.
                let _ = f.read_at(&mut page, (rng.index(pages) * PAGE) as u64);
                n += 1;
                done.store(n, Ordering::Relaxed);
            }
        })
    };
    let reads_past = |n: u64| {
        let done = done.clone();
        let what = format!("{n} reads around the cut");
        wait_until_blocking(&what, Duration::from_secs(60), move || {
            done.load(Ordering::Relaxed) >= n
        });
    };
    reads_past(READS_AROUND_CUT);
    let cut = (pages / 4 * PAGE + 1000) as u64;
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; truncate(2) reads it and nothing else.
    let rc = unsafe { libc::truncate(c_path.as_ptr(), cut as libc::off_t) };
    assert_eq!(rc, 0, "truncate: {}", std::io::Error::last_os_error());
    reads_past((done.load(Ordering::Relaxed) + READS_AROUND_CUT).min(MAX_READS_AROUND_CUT));
    stop.store(true, Ordering::Relaxed);
    reader.join().unwrap();
    assert_eq!(
        fs::metadata(&path).unwrap().len(),
        cut,
        "length after the cut"
    );
    let back = fs::read(&path).unwrap();
    assert_eq!(back.len() as u64, cut);
    assert_eq!(back[..], expect[..cut as usize]);
}

/// Pages of `len` bytes at `map` that are in the page cache (`mincore`).
fn resident_pages(map: *mut libc::c_void, len: usize) -> usize {
    let mut vec = vec![0u8; len.div_ceil(PAGE)];
    // SAFETY: `map` is a live mapping of `len` bytes and `vec` has one byte per page
    // of it, as mincore(2) writes.
    let rc = unsafe { libc::mincore(map, len, vec.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    vec.iter().filter(|&&v| v & 1 != 0).count()
}

/// An `O_DIRECT` reader gets the bytes it asked for and nothing is read around them:
/// before, each 4 KiB `O_DIRECT` read fetched a whole block (256 KiB in a file that fits
/// memory) and stored it in the kernel's page cache, which such a reader never uses.
#[test]
fn o_direct_reads_store_nothing_in_the_page_cache() {
    use std::os::unix::fs::OpenOptionsExt;
    let cluster = ProcessCluster::start(3);
    let (a, b) = (cluster.mount("a"), cluster.mount("b"));
    let data = pseudo_random(8 << 20, 77);
    fs::write(a.path.join("f"), &data).unwrap();
    let path = b.path.join("f");
    // A mapping of the file on the reading mount: its pages are the cache the reads
    // below would fill.
    let mapped = fs::File::open(&path).unwrap();
    let len = data.len();
    // SAFETY: a new shared read-only mapping of an open file; unmapped below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            mapped.as_raw_fd(),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
    let direct = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .unwrap();
    // O_DIRECT needs an aligned buffer: a page of its own.
    // SAFETY: a new private anonymous mapping of one page; unmapped below.
    let buf = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(buf, libc::MAP_FAILED);
    // SAFETY: `buf` is a writable mapping of PAGE bytes that nothing else uses.
    let page = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), PAGE) };
    let mut rng = Rng::new(77);
    for _ in 0..32 {
        let at = rng.index(len / PAGE) * PAGE;
        assert_eq!(direct.read_at(page, at as u64).unwrap(), PAGE);
        assert!(page[..] == data[at..at + PAGE], "4 KiB read at {at}");
    }
    let resident = resident_pages(map, len);
    // SAFETY: both mappings were made above and are not used after this.
    unsafe {
        libc::munmap(buf, PAGE);
        libc::munmap(map, len);
    }
    assert_eq!(
        resident, 0,
        "pages of the file cached after 32 O_DIRECT reads of 4 KiB"
    );
}
