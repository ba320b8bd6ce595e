//! On a shared engine, one metadata server leads: it alone takes the data servers'
//! registrations and heartbeats and runs the membership rules (`membership`), so the
//! chains and the map version have one writer. The others follow: they serve the
//! chains and map version as stored, read again whenever the stored version moves, and
//! answer a data server's registration or heartbeat `NotLeader` (`Unavailable`), so it
//! asks another server.
//!
//! The leader is the server the `E` key names, as long as that server's live key
//! (`sweep`) stands. Each server looks every tick (`campaign`): a key that is absent
//! or names a server without a live key is taken, in a checked transaction that reads
//! both keys (so two servers taking it at once: one wins, the other reads again and
//! follows) and checks the taker's own live key. A leader whose live key went loses its
//! place to the next server that looks; until it learns so, its membership writes fail:
//! each is checked against the `E` key naming it, its live key and the stored map
//! version (`Namespace::persist`). A new leader reloads the chains and gives every data
//! server a lease from its start, as a restarted server does.
//!
//! Off a shared engine the one server always leads.

use super::records::{decode, encode};
use super::txn::{Reads, Txn};
use super::{keys, Namespace};
use crate::error::MetaError;
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;

/// What the `E` key holds.
#[derive(Serialize, Deserialize)]
struct LeaderRecord {
    /// The leading server's id (`Holder::id`).
    server: u64,
}

/// The server the `E` key names, as `txn` reads it.
fn named(txn: &Txn<'_>) -> Result<Option<u64>, MetaError> {
    match txn.raw(&keys::leader())? {
        Some(v) => Ok(Some(decode::<LeaderRecord>(&v, "leader")?.server)),
        None => Ok(None),
    }
}

/// Refuses the membership change `txn` carries unless the `E` key names this server
/// (checked at the commit, with the server's live key).
pub(super) fn confirm(txn: &Txn<'_>) -> Result<(), MetaError> {
    let Some(me) = txn.holder_fenced() else {
        return Ok(());
    };
    match named(txn)? {
        Some(s) if s == me.id => Ok(()),
        other => Err(MetaError::NotLeader(format!(
            "this metadata server (id {}) no longer leads; the leader is {}",
            me.id,
            describe(other)
        ))),
    }
}

fn describe(leader: Option<u64>) -> String {
    leader.map_or_else(|| "not elected yet".into(), |s| format!("server id {s}"))
}

impl Namespace {
    /// On a shared engine, looks at the `E` key and takes it if it is free or names a
    /// server whose live key is gone; returns whether this server leads now. Off a
    /// shared engine: always leads. Becoming the leader reloads the chains and starts
    /// the lease of every data server not offline in all its chains afresh.
    pub fn campaign(&self) -> Result<bool, MetaError> {
        let Some(me) = self.state.lock().shared.me else {
            return Ok(true);
        };
        if self.live_key_lost() {
            self.leading.store(false, Ordering::Release);
            return Ok(false);
        }
        let leads = self.retry_conflicts("electing the leader", || {
            let mut st = self.state.lock();
            let mut txn = self.begin(&st);
            match named(&txn)? {
                Some(s) if s == me.id => return Ok(true),
                Some(s) if txn.raw(&keys::server(s))?.is_some() => return Ok(false),
                _ => {}
            }
            txn.holder_fenced();
            txn.put(keys::leader(), encode(&LeaderRecord { server: me.id })?);
            Self::commit_txn(&mut st, txn)?;
            Ok(true)
        })?;
        let was = self.leading.load(Ordering::Acquire);
        if leads && !was {
            // Leads only once the chains are read again and the leases set from them:
            // a heartbeat let in before would run the rules on what this server heard
            // while it followed (nothing), and take every data server for dead. Failed,
            // it is tried again at the next look.
            self.take_over_membership()?;
            self.leading.store(true, Ordering::Release);
            tracing::info!(
                server = me.id,
                "this metadata server leads: it runs membership now"
            );
        } else if was && !leads {
            self.leading.store(false, Ordering::Release);
            tracing::warn!(server = me.id, "this metadata server no longer leads");
        }
        Ok(leads)
    }

    /// Whether this server runs membership (off a shared engine: always).
    pub fn leads(&self) -> bool {
        self.checked.is_none() || self.leading.load(Ordering::Acquire)
    }

    /// Refuses a call only the leader takes.
    pub(crate) fn must_lead(&self, what: &str) -> Result<(), MetaError> {
        if self.leads() {
            return Ok(());
        }
        let leader = self
            .store
            .get(&keys::leader())
            .ok()
            .flatten()
            .and_then(|v| decode::<LeaderRecord>(&v, "leader").ok())
            .map(|r| r.server);
        Err(MetaError::NotLeader(format!(
            "{what} goes to the leading metadata server ({})",
            describe(leader)
        )))
    }

    /// Runs a membership write (`f`); if it found another leader, this server follows
    /// from now on.
    pub(super) fn leader_write<T>(
        &self,
        f: impl FnOnce() -> Result<T, MetaError>,
    ) -> Result<T, MetaError> {
        let r = f();
        if let Err(MetaError::NotLeader(_)) = &r {
            self.deposed();
        }
        r
    }

    /// Marks this server deposed (its membership write found another leader).
    fn deposed(&self) {
        if self.leading.swap(false, Ordering::AcqRel) {
            tracing::warn!("this metadata server no longer leads");
        }
    }
}
