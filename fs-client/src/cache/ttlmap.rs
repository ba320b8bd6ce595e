//! A small per-inode cache of answers the metadata server gave, each trusted for the
//! attribute TTL (the time the kernel itself trusts what it was sent) and bounded in
//! size: a full map drops its expired entries, then everything.
//!
//! An answer may be older than a change this client sent while it was on its way (a
//! commit's reply crossing an append, a listing's crossing a setxattr): each forget
//! moves an epoch, and [`TtlMap::put_since`] refuses an answer to a request sent
//! before the epoch last moved, and drops the entry put before it.

use parking_lot::Mutex;
use proto::InodeId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub(crate) struct TtlMap<V> {
    ttl: Duration,
    max: usize,
    map: Mutex<HashMap<InodeId, (V, Instant)>>,
    /// Moves at every [`TtlMap::forget`] and [`TtlMap::forget_all`].
    epoch: AtomicU64,
}

impl<V: Clone> TtlMap<V> {
    /// A map of at most `max` entries, each valid for `ttl` (zero keeps nothing).
    pub(crate) fn new(ttl: Duration, max: usize) -> TtlMap<V> {
        TtlMap {
            ttl,
            max,
            map: Mutex::new(HashMap::new()),
            epoch: AtomicU64::new(0),
        }
    }

    /// Remembers `v` for `ino`, as of now.
    pub(crate) fn put(&self, ino: InodeId, v: V) {
        self.put_if(ino, v, || true)
    }

    /// Where [`TtlMap::put_since`] counts from: read before sending the request whose
    /// answer is to be remembered.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Remembers `v`, the answer to a request sent at `epoch`, unless a forget came
    /// since; then drops the entry of `ino` instead.
    pub(crate) fn put_since(&self, ino: InodeId, v: V, epoch: u64) {
        self.put_if(ino, v, || self.epoch() == epoch)
    }

    /// Remembers `v` for `ino` like [`TtlMap::put`] if `still` holds, checked under the
    /// map's lock (a forget waiting for the lock comes after).
    fn put_if(&self, ino: InodeId, v: V, still: impl FnOnce() -> bool) {
        if self.ttl.is_zero() {
            return;
        }
        let mut map = self.map.lock();
        if !still() {
            // The answer is newer than any entry of `ino` put before its request went
            // out: that entry must not outlive it (in `DirAttrs`, a length kept from an
            // `O_TRUNC` open answered the `getattr` after the close's commit, whose own
            // answer another process's request had kept out: the file read back
            // empty).
            map.remove(&ino);
            return;
        }
        if map.len() >= self.max {
            let ttl = self.ttl;
            map.retain(|_, (_, at)| at.elapsed() < ttl);
            if map.len() >= self.max {
                map.clear();
            }
        }
        map.insert(ino, (v, Instant::now()));
    }

    /// The entry of `ino` if still within the TTL, removed.
    pub(crate) fn take(&self, ino: InodeId) -> Option<V> {
        let (v, at) = self.map.lock().remove(&ino)?;
        (at.elapsed() < self.ttl).then_some(v)
    }

    /// The entry of `ino` if still within the TTL, kept.
    pub(crate) fn get(&self, ino: InodeId) -> Option<V> {
        let map = self.map.lock();
        let (v, at) = map.get(&ino)?;
        (at.elapsed() < self.ttl).then(|| v.clone())
    }

    /// Drops the entry of `ino`, as an answer that says nothing about it now.
    pub(crate) fn remove(&self, ino: InodeId) {
        self.map.lock().remove(&ino);
    }

    /// Drops the entry of `ino` before this client changes it. The epoch moves before
    /// the entry goes, so a `put_since` checking it under the map's lock either sees it
    /// moved or puts an entry that is then removed.
    pub(crate) fn forget(&self, ino: InodeId) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.remove(ino);
    }

    /// Drops every entry, as [`TtlMap::forget`] does one.
    pub(crate) fn forget_all(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.map.lock().clear();
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_expire_are_taken_once_and_a_zero_ttl_keeps_none() {
        let m = TtlMap::new(Duration::from_secs(60), 8);
        m.put(InodeId(5), 'a');
        assert_eq!(m.get(InodeId(5)), Some('a'));
        assert_eq!(m.get(InodeId(5)), Some('a'), "get keeps it");
        assert_eq!(m.take(InodeId(5)), Some('a'));
        assert_eq!(m.take(InodeId(5)), None, "take removes it");
        m.put(InodeId(6), 'b');
        m.remove(InodeId(6));
        assert_eq!(m.get(InodeId(6)), None);
        let m = TtlMap::new(Duration::from_millis(20), 8);
        m.put(InodeId(5), 'a');
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!((m.get(InodeId(5)), m.take(InodeId(5))), (None, None));
        let m = TtlMap::new(Duration::ZERO, 8);
        m.put(InodeId(5), 'a');
        assert_eq!(m.get(InodeId(5)), None);
    }

    #[test]
    fn an_answer_to_a_request_sent_before_a_forget_is_not_kept() {
        let m = TtlMap::new(Duration::from_secs(60), 8);
        let sent = m.epoch();
        m.forget(InodeId(9));
        m.put_since(InodeId(5), 'a', sent);
        assert_eq!(m.get(InodeId(5)), None, "any forget since refuses it");
        let sent = m.epoch();
        m.remove(InodeId(9));
        m.put_since(InodeId(5), 'a', sent);
        assert_eq!(m.get(InodeId(5)), Some('a'), "a plain remove does not");
        m.forget_all();
        assert_eq!(m.get(InodeId(5)), None);
        // A refused answer drops the older copy it would have replaced.
        m.put(InodeId(5), 'o');
        let sent = m.epoch();
        m.forget(InodeId(9));
        m.put_since(InodeId(5), 'n', sent);
        assert_eq!(
            m.get(InodeId(5)),
            None,
            "neither the old copy nor the refused one"
        );
    }

    #[test]
    fn the_map_stays_bounded() {
        let m = TtlMap::new(Duration::from_secs(60), 100);
        for i in 0..300 {
            m.put(InodeId(i), ());
            assert!(m.len() <= 100);
        }
    }
}
