//! On a shared engine, the sessions of metadata servers that died, ended by the live
//! ones.
//!
//! Each server holds a live key (`keys::server`, its id) under an engine lease while it
//! runs (`TxnStore::hold_live`), and names itself with every session it puts in a
//! file's `P` key (`opens`). A server that dies (kill -9, its machine lost, cut off past
//! its lease) leaves sessions there that no close will take out: the files would never
//! be freed once unlinked, and what a writer left past a file's length never cut. So
//! every live server looks at the live keys each tick; when one it knew is gone (and at
//! its start, and every [`FULL_SCAN_EVERY`] in case one lived and died between two
//! looks) it reads the `P` and `W` keys, and ends the sessions and locks of each server
//! whose key has been gone for the session grace (`session_grace_ms`): the time its
//! clients have to take them back on another server (`resume`, which names the new
//! server; locks by `SetLock::reclaim`). Ending them is what a vanished client's end
//! does: an unlinked file with no session left is freed, a file a dead writer had open
//! gets a `T` mark, the locks are dropped.
//!
//! Two servers may sweep at once: each ending is a checked transaction that reads the
//! dead server's live key absent (and the `P` key), so the second finds nothing to do.
//! A server whose own key went while it lived (stalled past its lease) gives no session
//! any more: each commit that names one checks its key (`Txn::holder_fenced`).

use super::{files, keys, opens, shared_locks, Namespace};
use crate::error::MetaError;
use proto::InodeId;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// How often the `P` keys are read even when no known server went.
pub const FULL_SCAN_EVERY: Duration = Duration::from_secs(60);
/// `P` and `W` keys read per page of the scan.
const SCAN_PAGE: usize = 256;

/// Reads the servers named in a `P` or `W` key's value (`None`: it does not decode).
type Holders = fn(&[u8]) -> Option<Vec<u64>>;

/// What a server may have left in a file's keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Record {
    /// Open sessions (`P`, `opens`).
    Opens,
    /// Locks (`W`, `shared_locks`).
    Locks,
}

/// What a server remembers between its looks at the live keys.
#[derive(Debug, Default)]
pub(super) struct Sweeper {
    /// The live servers of the last look.
    known: BTreeSet<u64>,
    /// Servers found holding sessions with no live key, since when (by this server's
    /// clock).
    gone_since: HashMap<u64, Instant>,
    /// When the `P` keys were last read (`None`: not since this start).
    last_scan: Option<Instant>,
}

/// Whether a look at the live keys (`live`, at `now`) calls for a read of the `P`
/// keys: at the first look, when a server known alive went, when a dead server's grace
/// is over, and every [`FULL_SCAN_EVERY`]. Remembers `live` for the next look.
pub(super) fn scan_due(
    sw: &mut Sweeper,
    live: &BTreeSet<u64>,
    now: Instant,
    grace: Duration,
) -> bool {
    let went = sw.known.difference(live).next().is_some();
    sw.known = live.clone();
    let graced = sw.gone_since.values().any(|&t| t + grace <= now);
    let stale = sw.last_scan.is_none_or(|t| t + FULL_SCAN_EVERY <= now);
    went || graced || stale
}

/// From one read of the `P` and `W` keys (each file's record with the servers named
/// in it) and a list of the live keys made after it (`live`): the records to change
/// now, with the servers whose part ends. Servers
/// without a live key are noted gone from `now` on first sight; their sessions end once
/// they have been gone `grace`. Servers no file names any more are forgotten.
pub(super) fn due(
    sw: &mut Sweeper,
    live: &BTreeSet<u64>,
    me: u64,
    held: &[(Record, InodeId, Vec<u64>)],
    now: Instant,
    grace: Duration,
) -> BTreeMap<(Record, InodeId), Vec<u64>> {
    sw.last_scan = Some(now);
    // The newer list: a server that started since the look that called for this scan
    // is known from now on, so that its going calls for the next.
    sw.known = live.clone();
    let mut named = BTreeSet::new();
    let mut out: BTreeMap<(Record, InodeId), Vec<u64>> = BTreeMap::new();
    for (record, ino, servers) in held {
        for &s in servers {
            if s == me || live.contains(&s) {
                continue;
            }
            named.insert(s);
            let since = *sw.gone_since.entry(s).or_insert(now);
            if since + grace <= now {
                out.entry((*record, *ino)).or_default().push(s);
            }
        }
    }
    sw.gone_since.retain(|s, _| named.contains(s));
    out
}

impl Namespace {
    /// On a shared engine, ends the sessions of servers whose live key has been gone
    /// for the session grace (see the module); nothing elsewhere. Returns how many it
    /// ended. `now` comes from the caller's clock, as for [`Namespace::expire_detached`].
    pub fn sweep_dead_servers(&self, now: Instant) -> Result<usize, MetaError> {
        let Some(me) = self.state.lock().shared.me else {
            return Ok(0);
        };
        if self.live_key_lost() {
            // Others may be ending this server's sessions: its view is of no use.
            return Err(MetaError::Store(crate::kv::KvError::Unavailable {
                engine: "shared",
                message: "this metadata server's live key is gone: it must restart".into(),
            }));
        }
        let live = self.live_servers()?;
        let grace = Duration::from_millis(self.config.session_grace_ms);
        if !scan_due(&mut self.sweeper.lock(), &live, now, grace) {
            return Ok(0);
        }
        let held = self.held_by_servers()?;
        // Listed again: a server that started after the first list may have opened
        // files the scan saw, and is no dead one. A server named in the scan had its
        // key before its first open; missing now, it died.
        let live = self.live_servers()?;
        let due = due(&mut self.sweeper.lock(), &live, me.id, &held, now, grace);
        let mut ended = 0;
        for ((record, ino), servers) in due {
            let r = match record {
                Record::Opens => self.end_sessions_of_dead(ino, &servers),
                Record::Locks => self.end_locks_of_dead(ino, &servers),
            };
            match r {
                Ok(n) => ended += n,
                Err(e) => {
                    tracing::warn!(%ino, ?record, error = %e, "ending what a dead server held of a file failed; tried again later")
                }
            }
        }
        if ended > 0 {
            tracing::info!(
                ended,
                "sessions and locks of metadata servers that died ended"
            );
        }
        Ok(ended)
    }

    /// Drops the namespace as a process killed with SIGKILL ends: its live key is not
    /// released, and goes only when the engine's lease for it runs out. For tests.
    #[cfg(test)]
    pub(crate) fn crash(mut self) {
        if let Some(key) = self.live.take() {
            key.abandon();
        }
    }

    /// This server's id on a shared engine (its live key's), for tests.
    #[cfg(test)]
    pub(crate) fn server_id(&self) -> Option<u64> {
        self.state.lock().shared.me.map(|h| h.id)
    }

    /// Whether this server runs on a shared engine (several servers on one namespace).
    pub fn is_shared(&self) -> bool {
        self.checked.is_some()
    }

    /// Whether this server's live key is known gone from the shared engine (its lease
    /// expired, or was not renewed in time): other servers may end its sessions now,
    /// and its commits that give sessions fail, so it must stop serving.
    pub fn live_key_lost(&self) -> bool {
        self.live.as_ref().is_some_and(|k| k.lost())
    }

    /// The ids of the servers holding a live key.
    fn live_servers(&self) -> Result<BTreeSet<u64>, MetaError> {
        let prefix = keys::server_prefix();
        let mut live = BTreeSet::new();
        self.scan_all(&prefix, |k, _| {
            if let Some(id) = keys::u64_at(k, prefix.len()) {
                live.insert(id);
            }
        })?;
        Ok(live)
    }

    /// Every file with a `P` or `W` key, and the servers its sessions or locks are
    /// held through (a key that does not decode is left to `tessera fsck`).
    fn held_by_servers(&self) -> Result<Vec<(Record, InodeId, Vec<u64>)>, MetaError> {
        let mut held = Vec::new();
        let kinds: [(Record, Vec<u8>, Holders); 2] = [
            (Record::Opens, keys::openers_prefix(), opens::holders),
            (Record::Locks, keys::locks_prefix(), shared_locks::holders),
        ];
        for (record, prefix, holders) in kinds {
            self.scan_all(&prefix, |k, v| {
                if let (Some(ino), Some(servers)) = (keys::u64_at(k, prefix.len()), holders(v)) {
                    held.push((record, InodeId(ino), servers));
                }
            })?;
        }
        Ok(held)
    }

    /// Calls `f` on every key under `prefix`, a page at a time.
    fn scan_all(&self, prefix: &[u8], mut f: impl FnMut(&[u8], &[u8])) -> Result<(), MetaError> {
        let end = keys::prefix_end(prefix);
        let mut from = prefix.to_vec();
        loop {
            let page = self.store.scan(&from, &end, SCAN_PAGE)?;
            for (k, v) in &page {
                f(k, v);
            }
            match page.last() {
                Some((k, _)) if page.len() == SCAN_PAGE => from = keys::successor(k),
                _ => return Ok(()),
            }
        }
    }

    /// Ends the sessions of `ino` held by `servers`, each still without a live key as
    /// the transaction reads it; frees the file if it was unlinked and nobody else has
    /// it open, marks its tail if one of them wrote. How many sessions it ended.
    fn end_sessions_of_dead(&self, ino: InodeId, servers: &[u64]) -> Result<usize, MetaError> {
        self.retry_conflicts("ending a dead server's sessions", || {
            let mut st = self.state.lock();
            let mut txn = self.begin(&st);
            let ended = opens::end_dead(&mut txn, ino, servers)?;
            if ended.sessions == 0 {
                return Ok(0);
            }
            if ended.unopened {
                files::purge_if_orphan(&mut txn, ino)?;
            }
            if ended.wrote {
                files::mark_tails(&mut txn, [ino].iter())?;
            }
            Self::commit_txn(&mut st, txn)?;
            tracing::info!(%ino, sessions = ended.sessions, ?servers, "ended the sessions of dead metadata servers");
            Ok(ended.sessions)
        })
    }

    /// Drops the locks of `ino` held through `servers`, each still without a live key
    /// as the transaction reads it. How many it dropped.
    fn end_locks_of_dead(&self, ino: InodeId, servers: &[u64]) -> Result<usize, MetaError> {
        self.retry_conflicts("dropping a dead server's locks", || {
            let mut st = self.state.lock();
            let mut txn = self.begin(&st);
            let ended = shared_locks::end_dead(&mut txn, ino, servers)?;
            if ended == 0 {
                return Ok(0);
            }
            Self::commit_txn(&mut st, txn)?;
            tracing::info!(%ino, locks = ended, ?servers, "dropped the locks of dead metadata servers");
            Ok(ended)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[u64]) -> BTreeSet<u64> {
        ids.iter().copied().collect()
    }

    #[test]
    fn the_openers_are_read_at_start_when_a_server_goes_and_when_a_grace_ends() {
        let (t0, grace) = (Instant::now(), Duration::from_secs(10));
        let mut sw = Sweeper::default();
        assert!(scan_due(&mut sw, &set(&[1, 2]), t0, grace), "first look");
        let held = vec![(Record::Opens, InodeId(7), vec![2, 3])];
        // Server 3 has no live key: noted, not yet due.
        assert!(due(&mut sw, &set(&[1, 2]), 1, &held, t0, grace).is_empty());
        let t1 = t0 + Duration::from_secs(1);
        assert!(
            !scan_due(&mut sw, &set(&[1, 2]), t1, grace),
            "nothing changed"
        );
        // Server 2 goes: read again; 3 is still within its grace, 2 just noted.
        assert!(scan_due(&mut sw, &set(&[1]), t1, grace));
        assert!(due(&mut sw, &set(&[1]), 1, &held, t1, grace).is_empty());
        // 3's grace ends first, then 2's.
        let t2 = t0 + grace;
        assert!(scan_due(&mut sw, &set(&[1]), t2, grace));
        let d = due(&mut sw, &set(&[1]), 1, &held, t2, grace);
        assert_eq!(d, BTreeMap::from([((Record::Opens, InodeId(7)), vec![3])]));
        let t3 = t1 + grace;
        assert!(scan_due(&mut sw, &set(&[1]), t3, grace));
        let d = due(&mut sw, &set(&[1]), 1, &held, t3, grace);
        assert_eq!(
            d,
            BTreeMap::from([((Record::Opens, InodeId(7)), vec![2, 3])])
        );
        // Once no file names them, they are forgotten, and nothing is due.
        assert!(due(&mut sw, &set(&[1]), 1, &[], t3, grace).is_empty());
        assert!(sw.gone_since.is_empty());
        let t4 = t3 + Duration::from_secs(1);
        assert!(!scan_due(&mut sw, &set(&[1]), t4, grace));
        assert!(
            scan_due(&mut sw, &set(&[1]), t3 + FULL_SCAN_EVERY, grace),
            "the backstop"
        );
    }

    #[test]
    fn a_server_never_ends_its_own_sessions_or_a_live_servers() {
        let t0 = Instant::now();
        let mut sw = Sweeper::default();
        let held = vec![
            (Record::Opens, InodeId(1), vec![1, 2]),
            (Record::Locks, InodeId(1), vec![4]),
        ];
        let d = due(&mut sw, &set(&[2]), 1, &held, t0, Duration::ZERO);
        assert_eq!(d, BTreeMap::from([((Record::Locks, InodeId(1)), vec![4])]));
    }
}
