//! Read-around for small random reads: the rest of a 64 KiB block goes into the kernel's
//! page cache.
//!
//! Buffered random reads come back to neighbouring pages (a local file system's
//! fault-around bets the same), and the kernel asks for each page again otherwise; a
//! 64 KiB read costs the data server's disk about twice a 4 KiB one. When the kernel
//! reads less than a block at a random offset, the client reads the whole block (clamped
//! to the file's end), answers the kernel's range, and hands the block to the kernel's
//! page cache with a FUSE store notification. Sequential reads have their own readahead
//! and are left alone.
//!
//! Pushing bytes into the page cache is only right if nobody wrote them since they were
//! read: the kernel fills a writer's pages *before* the write reaches this client, so a
//! store racing with a write could put old bytes over new ones. Hence [`StoreGate`]: a
//! block is read around only while no handle of the file is open for writing on this
//! mount, and stored only if no writable open, truncation or close of one happened
//! since the read started; the check and the store happen under one lock, which every
//! writable open and truncation also takes, so a writer's first page fill (and the
//! kernel's new length after a truncation) comes after any store. Other clients'
//! writes are seen at the next open (close-to-open), as for any page the kernel
//! caches; a store already checked when such an open arrives may still land.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Size of the block read around a small random read in a large file (the data server's
/// checksum block before format version 3).
pub(crate) const AROUND_BYTES: u64 = 64 << 10;

/// Size of the block read around in a file that fits [`FITS_FRACTION`] of memory.
///
/// Random reads over such a file (a data loader picking samples out of a shard, an index
/// probed at random) come back to the same blocks while they are still cached, so the
/// cache is worth filling fast. Filling is bound by bytes per second, and larger requests
/// move more of them; once filled, random reads are answered from the cache instead of
/// one round trip each. In a file that does not fit, a block is likely evicted before it
/// is read again, and a larger block would only read more that nobody uses.
pub(crate) const AROUND_FITS_BYTES: u64 = 256 << 10;

/// A file of at most 1 / `FITS_FRACTION` of the machine's memory counts as fitting.
const FITS_FRACTION: u64 = 4;

/// The read-around block size for a file of `size` bytes on a machine with `mem` bytes.
pub(crate) fn around_bytes(size: u64, mem: u64) -> u64 {
    if size <= mem / FITS_FRACTION {
        AROUND_FITS_BYTES
    } else {
        AROUND_BYTES
    }
}

/// The machine's memory in bytes (`MemTotal`); 0 if unknown, so that every file counts
/// as large.
pub(crate) fn machine_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib << 10)
        })
        .unwrap_or(0)
}

/// Whether `[offset, offset + len)` is small enough to read around in blocks of `unit`
/// bytes and lies in one block; returns the block's start.
pub(crate) fn block_of(offset: u64, len: usize, unit: u64) -> Option<u64> {
    let start = offset - offset % unit;
    (len > 0 && (len as u64) < unit && offset + len as u64 <= start + unit).then_some(start)
}

/// Writable opens and changes of one file on this mount; see the module documentation.
///
/// The store runs on a blocking thread and holds `lock` while it checks and stores:
/// the kernel may make it wait for a page that a read in flight holds locked, and that
/// read needs the async workers, so a writable open waits for the lock asynchronously
/// (never blocking a worker), and closes and other changes only bump counters.
#[derive(Default)]
pub(crate) struct StoreGate {
    lock: tokio::sync::Mutex<()>,
    /// Handles open for writing.
    writers: AtomicU32,
    /// Bumped by every writable open and close and every truncation.
    changes: AtomicU64,
}

impl StoreGate {
    /// A stamp to read around with, or `None` while a handle is open for writing.
    pub(crate) fn stamp(&self) -> Option<u64> {
        let changes = self.changes.load(Ordering::SeqCst);
        (self.writers.load(Ordering::SeqCst) == 0).then_some(changes)
    }

    /// Runs `store` if nothing changed since `stamp`, holding the gate so that no
    /// writable open can complete between the check and the store. Blocking: call it
    /// off the async workers.
    pub(crate) fn store_if_unchanged(&self, stamp: u64, store: impl FnOnce()) -> bool {
        let _held = self.lock.blocking_lock();
        let unchanged = self.writers.load(Ordering::SeqCst) == 0
            && self.changes.load(Ordering::SeqCst) == stamp;
        if unchanged {
            store();
        }
        unchanged
    }

    /// Handles open for writing.
    pub(crate) fn writers(&self) -> u32 {
        self.writers.load(Ordering::SeqCst)
    }

    /// Whether a handle is open for writing.
    pub(crate) fn has_writers(&self) -> bool {
        self.writers.load(Ordering::SeqCst) > 0
    }

    /// A handle opens for writing: waits for a store under way, then counts it.
    pub(crate) async fn writer_opened(&self) {
        let _held = self.lock.lock().await;
        self.writers.fetch_add(1, Ordering::SeqCst);
        self.changes.fetch_add(1, Ordering::SeqCst);
    }

    /// A writable handle closed. No store can be under way while it was open.
    pub(crate) fn writer_closed(&self) {
        // A close without a matching open would be a bug; never wrap below zero.
        let _ = self
            .writers
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| w.checked_sub(1));
        self.changes.fetch_add(1, Ordering::SeqCst);
    }

    /// The file's length changes other than by a write (truncation): waits for a store
    /// under way, which must not grow the kernel's length back after it.
    pub(crate) async fn changed(&self) {
        let _held = self.lock.lock().await;
        self.changes.fetch_add(1, Ordering::SeqCst);
    }

    /// The file changed on another client (seen at an open): later stores are refused.
    pub(crate) fn changed_elsewhere(&self) {
        self.changes.fetch_add(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_small_reads_inside_one_block_are_read_around() {
        let u = AROUND_BYTES;
        assert_eq!(block_of(0, 4096, u), Some(0));
        assert_eq!(block_of(70_000, 4096, u), Some(65_536));
        assert_eq!(block_of(65_536 - 4096, 4096, u), Some(65_536 - 65_536));
        assert_eq!(
            block_of(65_536 - 2048, 4096, u),
            None,
            "straddles two blocks"
        );
        assert_eq!(block_of(0, 65_536, u), None, "a whole block gains nothing");
        assert_eq!(block_of(0, 0, u), None);
        assert_eq!(block_of(300_000, 4096, AROUND_FITS_BYTES), Some(262_144));
    }

    #[test]
    fn files_that_fit_a_quarter_of_memory_get_the_larger_block() {
        let gib = 1u64 << 30;
        assert_eq!(around_bytes(4 * gib, 24 * gib), AROUND_FITS_BYTES);
        assert_eq!(around_bytes(6 * gib, 24 * gib), AROUND_FITS_BYTES);
        assert_eq!(around_bytes(6 * gib + 1, 24 * gib), AROUND_BYTES);
        assert_eq!(
            around_bytes(1, 0),
            AROUND_BYTES,
            "unknown memory: small blocks"
        );
        assert!(machine_memory() > 0, "/proc/meminfo has MemTotal");
    }

    #[tokio::test]
    async fn any_writable_open_or_change_since_the_stamp_stops_the_store() {
        let g = std::sync::Arc::new(StoreGate::default());
        let check = |g: &std::sync::Arc<StoreGate>, s: u64| {
            let g = g.clone();
            std::thread::spawn(move || g.store_if_unchanged(s, || ()))
                .join()
                .unwrap()
        };
        let s = g.stamp().unwrap();
        assert!(check(&g, s));
        g.writer_opened().await;
        assert_eq!(g.stamp(), None, "no read-around while a writer is open");
        assert!(!check(&g, s), "stored under a writer");
        g.writer_closed();
        assert!(!check(&g, s), "stored over a closed writer's bytes");
        let s = g.stamp().unwrap();
        g.changed().await;
        assert!(!check(&g, s), "stored across a truncation");
        let s = g.stamp().unwrap();
        g.changed_elsewhere();
        assert!(!check(&g, s), "stored across a change elsewhere");
    }
}
