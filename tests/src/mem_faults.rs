//! Faults between the servers and clients of an [`InProcessCluster`] on the `mem`
//! transport, through `transport::mem`'s filters (as TiKV's cluster tests use their
//! simulated transport): message drops between chosen ends, and a client's own name on
//! the fabric so that one client's links can be cut and not another's.

use crate::InProcessCluster;
use fs_client::Client;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use transport::mem::{self, FilterGuard, OpKind, Packet, Verdict};

/// Drops messages between an address in `a` and one in `b` (both ways): each call,
/// reply and one-sided operation with probability `1 / one_in`, decided by a generator
/// seeded with `seed`. Connects are let through: a dropped one costs the whole connect
/// timeout and tests no more than a dropped call. Returns the filter (dropping it heals
/// the link) and the count of messages dropped so far, so a test can check that the
/// fault happened. Which messages are dropped depends on the order tasks send them in,
/// so a seed replays the choice of ends and rate, not each single drop.
pub fn drop_between(
    a: &[String],
    b: &[String],
    one_in: u64,
    seed: u64,
) -> (FilterGuard, Arc<AtomicU64>) {
    let (a, b) = (a.to_vec(), b.to_vec());
    let rng = Mutex::new(crate::Rng::new(seed));
    let dropped = Arc::new(AtomicU64::new(0));
    let count = dropped.clone();
    let guard = mem::add_filter(move |p: &Packet<'_>| {
        let across = |x: &[String], y: &[String]| {
            x.iter().any(|s| s == p.from) && y.iter().any(|s| s == p.to)
        };
        if p.kind == OpKind::Connect || !(across(&a, &b) || across(&b, &a)) {
            return Verdict::Deliver;
        }
        let lose = rng.lock().expect("drop generator").below(one_in) == 0;
        if lose {
            count.fetch_add(1, Ordering::Relaxed);
            return Verdict::Drop;
        }
        Verdict::Deliver
    });
    (guard, dropped)
}

/// A client of `cluster` (on `mem`) and the name its connections carry on the fabric,
/// which filters match. A client's endpoint gets its name when made, and the name is
/// not public: it is read off the client's first connect to the metadata server.
pub async fn named_client(cluster: &InProcessCluster) -> (Arc<Client>, String) {
    let meta = cluster.meta_addr();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let record = seen.clone();
    let watch = mem::add_filter(move |p: &Packet<'_>| {
        if p.kind == OpKind::Connect && p.to == meta && p.from.starts_with("mem-client-") {
            record.lock().expect("names").push(p.from.to_string());
        }
        Verdict::Deliver
    });
    let client = cluster.client().await;
    drop(watch);
    let mut names = seen.lock().expect("names").clone();
    names.dedup();
    // Nothing else of this cluster connects to its metadata server meanwhile (its data
    // servers carry their listen addresses), so one name is the client's.
    assert_eq!(names.len(), 1, "client names seen: {names:?}");
    (client, names.remove(0))
}
