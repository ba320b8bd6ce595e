//! The conformance cases of [`TxnStore`] (revisions and conditional commits), on every
//! engine, and the etcd engine on a 3-member cluster with its leader killed.

use super::conformance::{shared_etcd, Place};
use super::etcd::local::LocalEtcd;
use super::{
    open_engine, GroupCommit, KvError, KvStore, ReadCheck, Revision, StoreKind, TxnStore,
    WriteBatch,
};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

fn fresh(kind: StoreKind) -> Option<(Place, Arc<dyn TxnStore>)> {
    let place = Place::new(kind)?;
    let store = place.open();
    Some((place, store))
}

fn put(key: &[u8], value: &[u8]) -> WriteBatch {
    let mut b = WriteBatch::new();
    b.put(key, value);
    b
}

fn is_conflict_on(r: Result<(), KvError>, key: &[u8]) -> bool {
    matches!(r, Err(KvError::Conflict { key: k, .. }) if k == key)
}

fn revisions_move_with_every_write(kind: StoreKind) {
    let Some((_p, s)) = fresh(kind) else { return };
    assert_eq!(s.get_versioned(b"k").unwrap(), None);
    s.commit(put(b"k", b"1")).unwrap();
    let first = s.get_versioned(b"k").unwrap().unwrap();
    assert_eq!(first.value, b"1");
    s.commit(put(b"other", b"x")).unwrap();
    assert_eq!(
        s.get_versioned(b"k").unwrap().unwrap().revision,
        first.revision
    );
    s.commit(put(b"k", b"1")).unwrap();
    let second = s.get_versioned(b"k").unwrap().unwrap();
    assert!(second.revision > first.revision, "rewriting the same value");
}

fn a_commit_over_an_unchanged_read_applies(kind: StoreKind) {
    let Some((_p, s)) = fresh(kind) else { return };
    s.commit(put(b"a", b"1")).unwrap();
    let a = s.get_versioned(b"a").unwrap();
    let b = s.get_versioned(b"b").unwrap();
    let mut batch = put(b"a", b"2");
    batch.put(b"b".to_vec(), b"new".to_vec());
    let checks = [
        ReadCheck::of(b"a".to_vec(), &a),
        ReadCheck::of(b"b".to_vec(), &b),
    ];
    s.commit_if(&checks, batch).unwrap();
    assert_eq!(s.get(b"a").unwrap(), Some(b"2".to_vec()));
    assert_eq!(s.get(b"b").unwrap(), Some(b"new".to_vec()));
    // Without checks it is a plain commit.
    s.commit_if(&[], put(b"c", b"3")).unwrap();
    assert_eq!(s.get(b"c").unwrap(), Some(b"3".to_vec()));
}

fn a_stale_read_conflicts_and_writes_nothing(kind: StoreKind) {
    let Some((_p, s)) = fresh(kind) else { return };
    s.commit(put(b"a", b"1")).unwrap();
    let read = s.get_versioned(b"a").unwrap();
    s.commit(put(b"a", b"changed")).unwrap();
    let mut batch = put(b"a", b"mine");
    batch.put(b"side".to_vec(), b"effect".to_vec());
    let r = s.commit_if(&[ReadCheck::of(b"a".to_vec(), &read)], batch);
    assert!(is_conflict_on(r, b"a"));
    assert_eq!(s.get(b"a").unwrap(), Some(b"changed".to_vec()));
    assert_eq!(
        s.get(b"side").unwrap(),
        None,
        "nothing of a conflicting commit lands"
    );
}

fn two_conflicting_transactions_one_wins(kind: StoreKind) {
    let Some((_p, s)) = fresh(kind) else { return };
    s.commit(put(b"n", b"0")).unwrap();
    let read = s.get_versioned(b"n").unwrap();
    let barrier = Arc::new(Barrier::new(2));
    let tries: Vec<_> = [b"x", b"y"]
        .into_iter()
        .map(|who| {
            let (s, read, barrier) = (s.clone(), read.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                s.commit_if(&[ReadCheck::of(b"n".to_vec(), &read)], put(b"n", who))
            })
        })
        .collect();
    let results: Vec<_> = tries.into_iter().map(|t| t.join().unwrap()).collect();
    let won: Vec<_> = results.iter().filter(|r| r.is_ok()).collect();
    assert_eq!(won.len(), 1, "exactly one wins: {results:?}");
    assert!(results
        .iter()
        .any(|r| matches!(r, Err(KvError::Conflict { .. }))));
}

fn a_create_of_one_absent_key_has_one_winner(kind: StoreKind) {
    // Guards against two metadata servers both creating one name.
    let Some((_p, s)) = fresh(kind) else { return };
    let threads: Vec<_> = (0u8..4)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                // A create: the name must be absent, as read, at the commit.
                if s.get_versioned(b"name").unwrap().is_some() {
                    return false;
                }
                s.commit_if(
                    &[ReadCheck::of(b"name".to_vec(), &None)],
                    put(b"name", &[t]),
                )
                .is_ok()
            })
        })
        .collect();
    let wins: Vec<bool> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(wins.iter().filter(|w| **w).count(), 1, "{wins:?}");
    assert!(s.get(b"name").unwrap().is_some());
    // Once it exists, a create that read it absent conflicts.
    let r = s.commit_if(
        &[ReadCheck::of(b"name".to_vec(), &None)],
        put(b"name", b"late"),
    );
    assert!(is_conflict_on(r, b"name"));
}

fn a_key_deleted_meanwhile_conflicts(kind: StoreKind) {
    let Some((_p, s)) = fresh(kind) else { return };
    s.commit(put(b"d", b"1")).unwrap();
    let read = s.get_versioned(b"d").unwrap();
    let mut del = WriteBatch::new();
    del.delete(b"d".to_vec());
    s.commit(del).unwrap();
    let r = s.commit_if(&[ReadCheck::of(b"d".to_vec(), &read)], put(b"e", b"1"));
    assert!(is_conflict_on(r, b"d"));
    assert_eq!(s.get(b"e").unwrap(), None);
    // A revision that never was conflicts too.
    let bogus = ReadCheck {
        key: b"e".to_vec(),
        revision: Some(Revision(u64::MAX >> 2)),
    };
    assert!(is_conflict_on(
        s.commit_if(&[bogus], WriteBatch::new()),
        b"e"
    ));
}

fn increments_under_contention_lose_nothing(kind: StoreKind) {
    // Guards against a lost update: every successful read-modify-write is counted.
    let Some((_p, s)) = fresh(kind) else { return };
    s.commit(put(b"count", &0u64.to_be_bytes())).unwrap();
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let s = s.clone();
            std::thread::spawn(move || {
                let mut conflicts = 0;
                for _ in 0..20 {
                    loop {
                        let read = s.get_versioned(b"count").unwrap().unwrap();
                        let n = u64::from_be_bytes(read.value.clone().try_into().unwrap());
                        let check = ReadCheck::of(b"count".to_vec(), &Some(read));
                        match s.commit_if(&[check], put(b"count", &(n + 1).to_be_bytes())) {
                            Ok(()) => break,
                            Err(KvError::Conflict { .. }) => conflicts += 1,
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
                conflicts
            })
        })
        .collect();
    let conflicts: u32 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let n = u64::from_be_bytes(s.get(b"count").unwrap().unwrap().try_into().unwrap());
    assert_eq!(n, 60, "after {conflicts} conflicts");
}

fn limits_are_refused_with_a_clear_error(kind: StoreKind) {
    let Some((_p, s)) = fresh(kind) else { return };
    let limits = s.limits();
    // Ten thousand keys, or one more than the engine allows.
    let n = limits.max_ops.map_or(10_000, |m| m + 1);
    let mut many = WriteBatch::new();
    for i in 0..n as u32 {
        many.put(i.to_be_bytes().to_vec(), b"v".to_vec());
    }
    let r = s.commit(many.clone());
    match limits.max_ops {
        None => {
            r.unwrap();
            assert_eq!(s.scan(&[], &[0xff], usize::MAX).unwrap().len(), n);
            return;
        }
        Some(max) => {
            let e = r.unwrap_err();
            assert!(matches!(e, KvError::TooLarge { .. }), "{e}");
            assert!(
                e.to_string().contains(&max.to_string()),
                "names the limit: {e}"
            );
        }
    }
    assert_eq!(s.get(&0u32.to_be_bytes()).unwrap(), None, "nothing written");
    assert!(matches!(
        s.commit_if(&[], many.clone()),
        Err(KvError::TooLarge { .. })
    ));
    // The same key many times is one write: the last one.
    let mut same = WriteBatch::new();
    for i in 0..n as u32 {
        same.put(b"same".to_vec(), i.to_be_bytes().to_vec());
    }
    s.commit(same).unwrap();
    assert_eq!(
        s.get(b"same").unwrap(),
        Some((n as u32 - 1).to_be_bytes().to_vec())
    );
    let bytes = limits.max_bytes.unwrap_or(1 << 20);
    let e = s.commit(put(b"big", &vec![7u8; bytes])).unwrap_err();
    assert!(e.to_string().contains("max_txn_bytes"), "{e}");
    // Group commit refuses such a batch to its caller only, and goes on.
    let group = GroupCommit::new(s.clone());
    assert!(matches!(group.commit(many), Err(KvError::TooLarge { .. })));
    group.commit(put(b"after", b"1")).unwrap();
    assert_eq!(s.get(b"after").unwrap(), Some(b"1".to_vec()));
}

fn group_commit_packs_many_batches(kind: StoreKind) {
    // Guards against a group of more writes than one etcd transaction takes failing.
    let Some((_p, s)) = fresh(kind) else { return };
    let group = Arc::new(GroupCommit::new(s.clone()));
    let threads: Vec<_> = (0u8..4)
        .map(|t| {
            let group = group.clone();
            std::thread::spawn(move || {
                for i in 0u8..100 {
                    let mut b = WriteBatch::new();
                    b.put(vec![b'g', t, i, 0], vec![i]);
                    b.put(vec![b'g', t, i, 1], vec![i]);
                    group.commit(b).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    group.sync().unwrap();
    assert_eq!(s.scan(b"g", b"h", usize::MAX).unwrap().len(), 800);
}

fn reads_at_a_revision_see_one_moment(kind: StoreKind) {
    let Some((_p, s)) = fresh(kind) else { return };
    let mut b = put(b"a", b"1");
    b.put(b"b".to_vec(), b"1".to_vec());
    s.commit(b).unwrap();
    let (a, at) = s.get_at(b"a", None).unwrap();
    assert_eq!(a.map(|v| v.value), Some(b"1".to_vec()));
    let mut later = put(b"a", b"2");
    later.delete(b"b".to_vec());
    later.put(b"c".to_vec(), b"3".to_vec());
    s.commit(later).unwrap();
    let value = |key: &[u8], at| s.get_at(key, at).unwrap().0.map(|v| v.value);
    let names = |at| -> Vec<Vec<u8>> {
        let (rows, _) = s.scan_at(b"a", b"z", 10, at).unwrap();
        rows.into_iter().map(|(k, _)| k).collect()
    };
    let Some(at) = at else {
        // An engine without store-wide revisions reads now.
        assert_eq!(value(b"a", None), Some(b"2".to_vec()));
        assert_eq!(names(None), [b"a".to_vec(), b"c".to_vec()]);
        return;
    };
    assert_eq!(value(b"a", Some(at)), Some(b"1".to_vec()));
    assert_eq!(value(b"b", Some(at)), Some(b"1".to_vec()));
    assert_eq!(value(b"c", Some(at)), None);
    assert_eq!(names(Some(at)), [b"a".to_vec(), b"b".to_vec()]);
    let (now, newer) = s.get_at(b"a", None).unwrap();
    assert_eq!(now.map(|v| v.value), Some(b"2".to_vec()));
    assert!(newer > Some(at), "{newer:?} after {at:?}");
    assert_eq!(names(None), [b"a".to_vec(), b"c".to_vec()]);
    // A scan answers the revision it read at, as a get does (other tests share the
    // cluster: it may have moved on since).
    assert!(s.scan_at(b"a", b"z", 10, None).unwrap().1 >= newer);
}

macro_rules! txn_suite {
    ($($test:ident),* $(,)?) => {
        mod sled {
            $(#[test]
            fn $test() {
                super::$test(super::StoreKind::Sled);
            })*
        }
        mod redb {
            $(#[test]
            fn $test() {
                super::$test(super::StoreKind::Redb);
            })*
        }
        mod etcd {
            $(#[test]
            fn $test() {
                super::$test(super::StoreKind::Etcd);
            })*
        }
    };
}

txn_suite!(
    revisions_move_with_every_write,
    a_commit_over_an_unchanged_read_applies,
    a_stale_read_conflicts_and_writes_nothing,
    two_conflicting_transactions_one_wins,
    a_create_of_one_absent_key_has_one_winner,
    a_key_deleted_meanwhile_conflicts,
    increments_under_contention_lose_nothing,
    limits_are_refused_with_a_clear_error,
    group_commit_packs_many_batches,
    reads_at_a_revision_see_one_moment,
);

/// Commits of the loop below; bounded in count and in time.
const LEADER_LOOP_COMMITS: u32 = 300;
const LEADER_LOOP_DEADLINE: Duration = Duration::from_secs(120);

/// A 3-member cluster: its leader killed in the middle of a loop of commits, each
/// commit a pause at most, none an error, every one present afterwards.
#[test]
fn etcd_cluster_leader_killed_during_commits() {
    // Guards against an error or a lost commit when etcd's leader dies.
    if shared_etcd().is_none() {
        return;
    }
    let mut cluster = LocalEtcd::start(3).expect("starting 3 etcd members");
    let mut config = cluster.config();
    config.request_timeout_ms = 2_000;
    let store = open_engine(StoreKind::Etcd, std::path::Path::new("."), &config).unwrap();
    let started = Instant::now();
    let mut longest = Duration::ZERO;
    let mut killed = None;
    for i in 0..LEADER_LOOP_COMMITS {
        assert!(
            started.elapsed() < LEADER_LOOP_DEADLINE,
            "the loop took too long"
        );
        if i == LEADER_LOOP_COMMITS / 3 {
            let leader = cluster.leader().expect("a leader");
            cluster.kill(leader);
            killed = Some(leader);
        }
        let t = Instant::now();
        let last = store.get_versioned(b"last").unwrap().map(|v| v.value);
        let want = i.checked_sub(1).map(|p| p.to_be_bytes().to_vec());
        assert_eq!(last, want, "the previous commit is there");
        let mut b = put(&i.to_be_bytes(), b"v");
        b.put(b"last".to_vec(), i.to_be_bytes().to_vec());
        store.commit(b).unwrap();
        longest = longest.max(t.elapsed());
    }
    let all = store.scan(&[], &[0xff], usize::MAX).unwrap();
    assert_eq!(
        all.len() as u32,
        LEADER_LOOP_COMMITS + 1,
        "every commit present"
    );
    let new_leader = cluster.leader().expect("a new leader");
    assert_ne!(Some(new_leader), killed);
    eprintln!(
        "leader {killed:?} killed, then {new_leader}; longest commit {} ms; loop {} ms",
        longest.as_millis(),
        started.elapsed().as_millis()
    );
    // The killed member comes back and catches up.
    let k = killed.unwrap();
    cluster.restart(k).unwrap();
    cluster.wait_ready().unwrap();
    store.commit(put(b"after", b"restart")).unwrap();
}

/// The transaction cases on a 3-member cluster: a conflict is found whichever member
/// each side talks to.
#[test]
fn etcd_cluster_conflicts_across_members() {
    if shared_etcd().is_none() {
        return;
    }
    let cluster = LocalEtcd::start(3).expect("starting 3 etcd members");
    let base = cluster.config();
    let on = |i: usize| {
        let mut c = base.clone();
        c.endpoints = vec![cluster.endpoint(i)];
        open_engine(StoreKind::Etcd, std::path::Path::new("."), &c).unwrap()
    };
    let (a, b) = (on(0), on(2));
    a.commit(put(b"k", b"0")).unwrap();
    let read_a = a.get_versioned(b"k").unwrap();
    let read_b = b.get_versioned(b"k").unwrap();
    assert_eq!(read_a, read_b, "linearizable reads agree across members");
    b.commit_if(&[ReadCheck::of(b"k".to_vec(), &read_b)], put(b"k", b"b"))
        .unwrap();
    let r = a.commit_if(&[ReadCheck::of(b"k".to_vec(), &read_a)], put(b"k", b"a"));
    assert!(is_conflict_on(r, b"k"));
    assert_eq!(a.get(b"k").unwrap(), Some(b"b".to_vec()));
}

/// A group of more writes than one transaction takes is committed whole, in several.
#[test]
fn etcd_a_large_group_is_packed_into_several_transactions() {
    // Guards against group commit failing the store on a busy moment's large group.
    let Some(etcd) = shared_etcd() else { return };
    let store = open_engine(StoreKind::Etcd, std::path::Path::new("."), &etcd.config()).unwrap();
    let batches: Vec<WriteBatch> = (0u16..300)
        .map(|i| {
            let mut b = put(&i.to_be_bytes(), b"v");
            b.put(b"shared".to_vec(), i.to_be_bytes().to_vec());
            b
        })
        .collect();
    assert!(
        !store.log_group(&batches).unwrap(),
        "etcd applies as it logs"
    );
    assert_eq!(
        store.scan(&[], &[0xff, 0xff], usize::MAX).unwrap().len(),
        301
    );
    assert_eq!(
        store.get(b"shared").unwrap(),
        Some(299u16.to_be_bytes().to_vec())
    );
}

/// Two of three members stopped: a commit waits, then fails with `Unavailable` within
/// its configured time; with one member back the cluster goes on.
#[test]
fn etcd_cluster_without_quorum_fails_in_time_then_recovers() {
    // Guards against a call hanging past its timeout when etcd has no quorum.
    if shared_etcd().is_none() {
        return;
    }
    let mut cluster = LocalEtcd::start(3).expect("starting 3 etcd members");
    let mut config = cluster.config();
    config.request_timeout_ms = 1_000;
    config.retry_for_ms = 2_000;
    let store = open_engine(StoreKind::Etcd, std::path::Path::new("."), &config).unwrap();
    store.commit(put(b"before", b"1")).unwrap();
    cluster.kill(1);
    cluster.kill(2);
    let t = Instant::now();
    let e = store.commit(put(b"during", b"1")).unwrap_err();
    let took = t.elapsed();
    assert!(matches!(e, KvError::Unavailable { .. }), "{e}");
    assert!(
        e.to_string().contains("retry_for_ms"),
        "says which setting: {e}"
    );
    // retry_for_ms, one attempt and one pause past it at most.
    assert!(took < Duration::from_millis(4_000), "took {took:?}");
    eprintln!("no quorum: failed after {} ms: {e}", took.as_millis());
    cluster.restart(1).unwrap();
    cluster.wait_ready().unwrap();
    let mut config = config.clone();
    config.retry_for_ms = 20_000;
    let store = open_engine(StoreKind::Etcd, std::path::Path::new("."), &config).unwrap();
    store.commit(put(b"after", b"1")).unwrap();
    assert_eq!(store.get(b"before").unwrap(), Some(b"1".to_vec()));
}

/// A read at a revision etcd compacted away is a conflict (the namespace then runs its
/// request again, reading from now), not an engine failure.
#[test]
fn etcd_a_read_at_a_compacted_revision_is_a_conflict() {
    if shared_etcd().is_none() {
        return;
    }
    // A cluster of its own: compacting the shared one would fail other tests' reads.
    let cluster = LocalEtcd::start(1).expect("starting an etcd member");
    let config = cluster.config();
    let store = open_engine(StoreKind::Etcd, std::path::Path::new("."), &config).unwrap();
    store.commit(put(b"k", b"1")).unwrap();
    let (_, at) = store.get_at(b"k", None).unwrap();
    store.commit(put(b"k", b"2")).unwrap();
    let (_, now) = store.get_at(b"k", None).unwrap();
    let endpoints = config.endpoints.clone();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        let mut client = etcd_client::Client::connect(endpoints, None).await.unwrap();
        let r = now.unwrap().0 as i64;
        client.compact(r, None).await.unwrap();
    });
    // Named by no key, so never taken for a conflict on a key the caller wrote.
    let e = store.get_at(b"k", at).unwrap_err();
    assert!(is_conflict_on(Err(e), b""));
    let e = store.scan_at(b"a", b"z", 10, at).unwrap_err();
    assert!(is_conflict_on(Err(e), b""));
    let (read, _) = store.get_at(b"k", None).unwrap();
    assert_eq!(read.map(|v| v.value), Some(b"2".to_vec()));
}
