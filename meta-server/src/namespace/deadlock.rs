//! Deadlock detection for waited `fcntl` locks (`F_SETLKW`), as Linux does it: a wait
//! whose lock's holder waits, directly or through up to ten others, for a lock of the
//! caller is refused with EDEADLK instead of waiting for good.
//!
//! A client waits out a refused lock by asking again (with backoff, every 200 ms at
//! most), so a wait here is a note that a lock owner asked for a range and was refused,
//! kept while it keeps asking: [`WAIT_FRESH`] after its last refusal it is forgotten (the
//! waiter's client died). A grant, an unlock, the owner's release, the end of its
//! connection and any lock call of the owner that does not wait (the last ask a client
//! makes when the waiter got a signal) forget it at once. Off a shared engine every
//! wait and lock is seen; on a shared engine the waits are this server's clients' only
//! (a cycle through another server's waiter is not found, and waits as before).

use super::locks::{conflicting, Held};
use super::{ConnId, Namespace};
use crate::error::MetaError;
use proto::meta::LockSpec;
use proto::{ClientId, InodeId};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a refused waiter counts as waiting after its last refusal: five times the
/// client's longest pause between two asks.
pub const WAIT_FRESH: Duration = Duration::from_secs(1);

/// Most waits noted at once; past it a new wait goes unnoted (it is not checked as a
/// link of others' cycles), after the stale ones are dropped.
pub const MAX_WAITS: usize = 65_536;

/// Most owners followed from a waiter (Linux's `MAX_DEADLK_ITERATIONS`).
const MAX_STEPS: usize = 10;

/// A lock owner: the client and the kernel's owner within it.
type Owner = (ClientId, u64);

#[derive(Clone, Copy, Debug)]
struct Wait {
    ino: InodeId,
    want: LockSpec,
    conn: ConnId,
    at: Instant,
}

/// The owners refused a lock they wait for.
#[derive(Default)]
pub struct Waits {
    waits: HashMap<Owner, Wait>,
}

impl Waits {
    /// Notes that `owner` waits for `want` on `ino` (asked over `conn`) as of `now`.
    fn note(&mut self, owner: Owner, conn: ConnId, ino: InodeId, want: LockSpec, now: Instant) {
        if self.waits.len() >= MAX_WAITS && !self.waits.contains_key(&owner) {
            self.waits
                .retain(|_, w| now.duration_since(w.at) < WAIT_FRESH);
            if self.waits.len() >= MAX_WAITS {
                return;
            }
        }
        let at = now;
        self.waits.insert(
            owner,
            Wait {
                ino,
                want,
                conn,
                at,
            },
        );
    }

    /// What `owner` waits for as of `now`, if it still does.
    fn of(&self, owner: Owner, now: Instant) -> Option<(InodeId, LockSpec)> {
        self.waits
            .get(&owner)
            .filter(|w| now.duration_since(w.at) < WAIT_FRESH)
            .map(|w| (w.ino, w.want))
    }

    /// `owner` waits no more (granted, unlocked, released).
    pub fn done(&mut self, client: ClientId, owner: u64) {
        self.waits.remove(&(client, owner));
    }

    /// The waits asked over `conn`, which closed.
    pub fn release_conn(&mut self, conn: ConnId) {
        self.waits.retain(|_, w| w.conn != conn);
    }

    /// Waits noted.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.waits.len()
    }
}

/// Whether `me`, refused by a lock of `blocker`, would wait in a cycle: following each
/// owner to the holder of the lock it waits for (`waits_for`, then `holder`) reaches
/// `me` within [`MAX_STEPS`].
fn closes_cycle(
    me: Owner,
    blocker: Owner,
    waits_for: impl Fn(Owner) -> Option<(InodeId, LockSpec)>,
    mut holder: impl FnMut(InodeId, Owner, &LockSpec) -> Option<Owner>,
) -> bool {
    let mut cur = blocker;
    for _ in 0..MAX_STEPS {
        if cur == me {
            return true;
        }
        let Some((ino, want)) = waits_for(cur) else {
            return false;
        };
        let Some(next) = holder(ino, cur, &want) else {
            return false;
        };
        cur = next;
    }
    false
}

impl Namespace {
    /// A waited lock was refused with `refusal`: `Deadlock` if waiting would close a
    /// cycle of waits, else the refusal, with the wait noted.
    pub(super) fn lock_refused(
        &self,
        ino: InodeId,
        client: ClientId,
        conn: ConnId,
        want: LockSpec,
        refusal: MetaError,
    ) -> MetaError {
        let now = self.clock.now();
        let me = (client, want.owner);
        let holder = |ino: InodeId, who: Owner, want: &LockSpec| -> Option<Owner> {
            let held = self.file_locks(ino).ok()?;
            conflicting(&held, who.0, want).map(|h: &Held| (h.client, h.spec.owner))
        };
        let Some(blocker) = holder(ino, me, &want) else {
            return refusal;
        };
        let waits_for = |who: Owner| self.locks.lock().waits.of(who, now);
        if closes_cycle(me, blocker, waits_for, holder) {
            self.locks.lock().waits.done(client, want.owner);
            return MetaError::Deadlock(format!(
                "{ino} bytes {}..={}: their holder waits for a lock of this owner",
                want.start, want.end
            ));
        }
        self.locks.lock().waits.note(me, conn, ino, want, now);
        refusal
    }

    /// `owner` of `client` waits for no lock any more.
    pub(super) fn lock_wait_over(&self, client: ClientId, owner: u64) {
        self.locks.lock().waits.done(client, owner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::meta::LockKind;

    fn spec(owner: u64, start: u64, end: u64) -> LockSpec {
        LockSpec {
            owner,
            pid: owner as u32,
            start,
            end,
            kind: LockKind::Write,
        }
    }

    const C: ClientId = ClientId(1);
    const F: InodeId = InodeId(5);

    /// Guards against a deadlock detector that misses a cycle (two owners, or three
    /// through two files), finds one where a waiter has gone, or follows forever.
    #[test]
    fn cycles_of_waits_are_found_and_stale_or_open_chains_are_not() {
        let t0 = Instant::now();
        let mut w = Waits::default();
        // Owner 1 holds 0-9 and waits for 10-19; owner 2 holds 10-19.
        let held = [
            (1, spec(1, 0, 9)),
            (2, spec(2, 10, 19)),
            (3, spec(3, 20, 29)),
        ];
        let holder = |_: InodeId, who: Owner, want: &LockSpec| {
            held.iter()
                .find(|(o, h)| *o != who.1 && h.start <= want.end && want.start <= h.end)
                .map(|(o, _)| (C, *o))
        };
        w.note((C, 1), ConnId(1), F, spec(1, 10, 19), t0);
        fn of(w: &Waits, now: Instant) -> impl Fn(Owner) -> Option<(InodeId, LockSpec)> + '_ {
            move |o| w.of(o, now)
        }
        // Owner 2 asking for 0-9 (held by 1, who waits for 2): a cycle.
        assert!(closes_cycle((C, 2), (C, 1), of(&w, t0), holder));
        // Owner 3 asking for 0-9: 1 waits for 2, who waits for nothing.
        assert!(!closes_cycle((C, 3), (C, 1), of(&w, t0), holder));
        // Three owners: 2 waits for 20-29 (3's); 3 asking for 0-9 closes 3->1->2->3.
        w.note((C, 2), ConnId(1), F, spec(2, 20, 29), t0);
        assert!(closes_cycle((C, 3), (C, 1), of(&w, t0), holder));
        // Once the waits are stale (the waiters stopped asking), no cycle.
        let later = t0 + WAIT_FRESH;
        assert!(!closes_cycle((C, 3), (C, 1), of(&w, later), holder));
        // A granted waiter waits no more.
        w.done(C, 1);
        assert!(!closes_cycle((C, 2), (C, 1), of(&w, t0), holder));
        // A cycle not through the asker ends after MAX_STEPS.
        let mut w = Waits::default();
        w.note((C, 1), ConnId(1), F, spec(1, 10, 19), t0);
        w.note((C, 2), ConnId(1), F, spec(2, 0, 9), t0);
        assert!(!closes_cycle((C, 3), (C, 1), of(&w, t0), holder));
        // A closed connection's waits go.
        w.release_conn(ConnId(1));
        assert_eq!(w.len(), 0);
    }
}
