//! One conformance suite for every [`KvStore`] engine.
//!
//! Each test is written once as a function of the engine and instantiated per engine by
//! `conformance_suite!`, so a failure names its engine (`kv::conformance::redb::...`).
//! The etcd cases run on one etcd member that this test process starts on 127.0.0.1
//! (data on tmpfs), each test under a key prefix of its own; they are skipped, saying
//! so, only where there is no `etcd` binary, and fail then under CI (which installs it).

use super::etcd::local::LocalEtcd;
use super::{open_engine, open_store, EtcdConfig, KvStore, StoreKind, TxnStore, WriteBatch};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// Where a test's store lives: a temp dir, and for etcd a member and a prefix.
pub(super) struct Place {
    pub kind: StoreKind,
    dir: TempDir,
    etcd: Option<(Arc<LocalEtcd>, EtcdConfig)>,
}

impl Place {
    /// A fresh place for `kind`; `None` (with the reason printed) where etcd is missing.
    pub fn new(kind: StoreKind) -> Option<Place> {
        let etcd = match kind {
            StoreKind::Etcd => {
                let etcd = shared_etcd()?;
                let config = etcd.config();
                Some((etcd, config))
            }
            _ => None,
        };
        Some(Place {
            kind,
            dir: tempfile::tempdir().expect("temp dir"),
            etcd,
        })
    }

    /// Opens (again) the store of this place.
    pub fn open(&self) -> Arc<dyn TxnStore> {
        let config = self
            .etcd
            .as_ref()
            .map(|(_, c)| c.clone())
            .unwrap_or_default();
        open_engine(self.kind, self.dir.path(), &config).expect("open store")
    }
}

/// The process's shared etcd member, or `None` where there is no etcd binary (a failure
/// under CI, which installs it).
pub(super) fn shared_etcd() -> Option<Arc<LocalEtcd>> {
    if !LocalEtcd::present_for_tests() {
        return None;
    }
    Some(LocalEtcd::shared().expect("starting etcd"))
}

fn fresh(kind: StoreKind) -> Option<(Place, Arc<dyn TxnStore>)> {
    let place = Place::new(kind)?;
    let store = place.open();
    Some((place, store))
}

fn put(store: &dyn KvStore, key: &[u8], value: &[u8]) {
    let mut b = WriteBatch::new();
    b.put(key, value);
    store.commit(b).expect("commit");
}

fn all(store: &dyn KvStore) -> Vec<(Vec<u8>, Vec<u8>)> {
    store.scan(&[], &[0xff; 16], usize::MAX).expect("scan")
}

fn get_missing_is_none(kind: StoreKind) {
    let Some((_dir, s)) = fresh(kind) else { return };
    assert_eq!(s.get(b"nope").unwrap(), None);
    assert_eq!(s.get(b"").unwrap(), None);
    assert_eq!(s.engine(), kind.name());
}

fn put_get_delete(kind: StoreKind) {
    let Some((_dir, s)) = fresh(kind) else { return };
    put(&*s, b"k", b"v");
    assert_eq!(s.get(b"k").unwrap(), Some(b"v".to_vec()));
    let mut b = WriteBatch::new();
    b.delete(b"k".to_vec());
    b.delete(b"never-there".to_vec());
    s.commit(b).unwrap();
    assert_eq!(s.get(b"k").unwrap(), None);
}

fn overwrite_replaces_value(kind: StoreKind) {
    let Some((_dir, s)) = fresh(kind) else { return };
    put(&*s, b"k", b"first, longer value");
    put(&*s, b"k", b"2nd");
    assert_eq!(s.get(b"k").unwrap(), Some(b"2nd".to_vec()));
    put(&*s, b"k", b"");
    assert_eq!(s.get(b"k").unwrap(), Some(Vec::new()));
}

fn empty_batch_commits(kind: StoreKind) {
    let Some((_dir, s)) = fresh(kind) else { return };
    s.commit(WriteBatch::new()).unwrap();
    assert!(all(&*s).is_empty());
}

fn batch_last_op_on_a_key_wins(kind: StoreKind) {
    let Some((_dir, s)) = fresh(kind) else { return };
    put(&*s, b"gone", b"x");
    let mut b = WriteBatch::new();
    b.put(b"a".to_vec(), b"1".to_vec());
    b.put(b"a".to_vec(), b"2".to_vec());
    b.put(b"b".to_vec(), b"1".to_vec());
    b.delete(b"b".to_vec());
    b.delete(b"c".to_vec());
    b.put(b"c".to_vec(), b"3".to_vec());
    b.put(b"gone".to_vec(), b"y".to_vec());
    b.delete(b"gone".to_vec());
    s.commit(b).unwrap();
    assert_eq!(s.get(b"a").unwrap(), Some(b"2".to_vec()));
    assert_eq!(s.get(b"b").unwrap(), None);
    assert_eq!(s.get(b"c").unwrap(), Some(b"3".to_vec()));
    assert_eq!(s.get(b"gone").unwrap(), None);
}

fn batch_applies_all_its_keys(kind: StoreKind) {
    let Some((_dir, s)) = fresh(kind) else { return };
    // As many keys as one transaction may write, with the put below.
    let n = s.limits().max_ops.map_or(500, |m| m.min(501) - 1) as u32;
    let mut b = WriteBatch::new();
    for i in 0..n {
        b.put(i.to_be_bytes().to_vec(), vec![i as u8; 100]);
    }
    s.commit(b).unwrap();
    assert_eq!(all(&*s).len(), n as usize);
    let mut b = WriteBatch::new();
    for i in 0..n {
        b.delete(i.to_be_bytes().to_vec());
    }
    b.put(b"only".to_vec(), b"1".to_vec());
    s.commit(b).unwrap();
    assert_eq!(all(&*s), vec![(b"only".to_vec(), b"1".to_vec())]);
}

/// Binary keys around the extremes of a byte: 0x00 and 0xff must order as unsigned.
fn binary_keys() -> Vec<Vec<u8>> {
    vec![
        vec![],
        vec![0x00],
        vec![0x00, 0x00],
        vec![0x00, 0xff],
        vec![0x01],
        vec![0x7f, 0xff],
        vec![0x80],
        vec![0xfe, 0xff, 0xff],
        vec![0xff],
        vec![0xff, 0x00],
        vec![0xff, 0xff],
        vec![0xff, 0xff, 0xff, 0xff],
    ]
}

fn scan_orders_binary_keys(kind: StoreKind) {
    let Some((_dir, s)) = fresh(kind) else { return };
    let keys = binary_keys();
    let mut b = WriteBatch::new();
    // Insert in reverse so the order comes from the engine, not from insertion.
    for (i, k) in keys.iter().enumerate().rev() {
        b.put(k.clone(), vec![i as u8]);
    }
    s.commit(b).unwrap();
    let got: Vec<Vec<u8>> = s
        .scan(&[], &[0xff; 5], usize::MAX)
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(got, keys);
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(s.get(k).unwrap(), Some(vec![i as u8]), "key {k:x?}");
    }
}

fn scan_bounds_are_half_open(kind: StoreKind) {
    let Some((_dir, s)) = fresh(kind) else { return };
    let keys = binary_keys();
    let mut b = WriteBatch::new();
    for k in &keys {
        b.put(k.clone(), k.clone());
    }
    s.commit(b).unwrap();
    for start in &keys {
        for end in &keys {
            let want: Vec<_> = keys
                .iter()
                .filter(|k| *k >= start && *k < end)
                .map(|k| (k.clone(), k.clone()))
                .collect();
            let got = s.scan(start, end, usize::MAX).unwrap();
            assert_eq!(got, want, "scan {start:x?}..{end:x?}");
        }
    }
    // A start between stored keys, and an end past every key.
    let got = s.scan(&[0x00, 0x00, 0x00], &[0xff, 0xff, 0xff, 0xff, 0x00], 100);
    assert_eq!(got.unwrap().len(), keys.len() - 3);
}

fn scan_respects_limit(kind: StoreKind) {
    let Some((_dir, s)) = fresh(kind) else { return };
    for part in 0u16..3 {
        let mut b = WriteBatch::new();
        for i in part * 100..(part + 1) * 100 {
            b.put(i.to_be_bytes().to_vec(), Vec::new());
        }
        s.commit(b).unwrap();
    }
    assert!(s.scan(&[], &[0xff], 0).unwrap().is_empty());
    let page = s.scan(&[], &[0xff], 7).unwrap();
    let want: Vec<Vec<u8>> = (0u16..7).map(|i| i.to_be_bytes().to_vec()).collect();
    assert_eq!(page.into_iter().map(|(k, _)| k).collect::<Vec<_>>(), want);
    // Paging by "start just after the last key" visits every key exactly once.
    let mut seen = Vec::new();
    let mut start = Vec::new();
    loop {
        let page = s.scan(&start, &[0xff], 64).unwrap();
        let Some((last, _)) = page.last() else { break };
        start = last.clone();
        start.push(0);
        seen.extend(page.into_iter().map(|(k, _)| k));
    }
    assert_eq!(seen.len(), 300);
    assert!(seen.windows(2).all(|w| w[0] < w[1]));
}

fn scan_of_inverted_range_is_empty(kind: StoreKind) {
    let Some((_dir, s)) = fresh(kind) else { return };
    put(&*s, b"m", b"1");
    assert!(s.scan(b"z", b"a", 10).unwrap().is_empty());
    assert!(s.scan(b"m", b"m", 10).unwrap().is_empty());
}

fn large_values_round_trip(kind: StoreKind) {
    let Some((dir, s)) = fresh(kind) else { return };
    let big: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 7 + i / 251) as u8).collect();
    put(&*s, b"big", &big);
    put(&*s, b"big2", &big[..(1 << 20) - 1]);
    assert_eq!(s.get(b"big").unwrap().as_deref(), Some(&big[..]));
    drop(s);
    let s = dir.open();
    assert_eq!(s.get(b"big").unwrap().as_deref(), Some(&big[..]));
    assert_eq!(s.get(b"big2").unwrap().unwrap().len(), (1 << 20) - 1);
}

fn reopen_keeps_everything(kind: StoreKind) {
    let Some((dir, s)) = fresh(kind) else { return };
    for i in 0u32..200 {
        let mut b = WriteBatch::new();
        b.put(i.to_be_bytes().to_vec(), format!("value {i}").into_bytes());
        if i % 10 == 0 && i > 0 {
            b.delete((i - 5).to_be_bytes().to_vec());
        }
        s.commit(b).unwrap();
    }
    let before = all(&*s);
    assert_eq!(before.len(), 200 - 19);
    drop(s);
    let s = dir.open();
    assert_eq!(all(&*s), before);
    put(&*s, b"after", b"reopen");
    drop(s);
    let s = dir.open();
    assert_eq!(s.get(b"after").unwrap(), Some(b"reopen".to_vec()));
    assert_eq!(all(&*s).len(), before.len() + 1);
}

fn concurrent_commits_all_land(kind: StoreKind) {
    let Some((_dir, s)) = fresh(kind) else { return };
    let threads: Vec<_> = (0u8..4)
        .map(|t| {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                for i in 0u8..50 {
                    let mut b = WriteBatch::new();
                    b.put(vec![t, i, 0], vec![i]);
                    b.put(vec![t, i, 1], vec![i]);
                    s.commit(b).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(all(&*s).len(), 4 * 50 * 2);
}

/// Env var that turns [`crash_child`] from a no-op into the crash test's writer process.
const CRASH_ENV: &str = "TESSERA_KV_CRASH_CHILD";
/// Keys each crash-test batch writes: all of them, or none, must survive a kill -9.
const CRASH_KEYS_PER_BATCH: u64 = 3;

fn crash_key(n: u64, part: u64) -> Vec<u8> {
    let mut k = b"n".to_vec();
    k.extend_from_slice(&n.to_be_bytes());
    k.extend_from_slice(&part.to_be_bytes());
    k
}

fn crash_tail_key(n: u64) -> Vec<u8> {
    let mut k = b"t".to_vec();
    k.extend_from_slice(&n.to_be_bytes());
    k
}

/// The writer side of the kill -9 test, run in a child process.
///
/// Without the env var this test does nothing (it is an ordinary, trivially passing test);
/// the crash test re-executes the test binary with the env var set and only this test
/// selected. Each batch `n` writes `CRASH_KEYS_PER_BATCH` keys, moves the tail marker
/// `t(n-1)` to `t(n)` (a delete and a put), and prints `ACK n` only after commit returned.
#[test]
fn crash_child() {
    let Ok(spec) = std::env::var(CRASH_ENV) else {
        return;
    };
    let (engine, dir) = spec.split_once(':').expect("engine:dir");
    let kind = StoreKind::ALL
        .into_iter()
        .find(|k| k.name() == engine)
        .unwrap();
    let store = open_store(kind, Path::new(dir)).unwrap();
    let first = crash_state(&*store) + 1;
    let deadline = Instant::now() + Duration::from_secs(60);
    for n in first..first + 100_000 {
        if Instant::now() > deadline {
            break;
        }
        let mut b = WriteBatch::new();
        for part in 0..CRASH_KEYS_PER_BATCH {
            b.put(crash_key(n, part), vec![part as u8; 64]);
        }
        b.delete(crash_tail_key(n - 1));
        b.put(crash_tail_key(n), Vec::new());
        store.commit(b).unwrap();
        println!("ACK {n}");
    }
}

/// Checks a store the crash child wrote and returns its highest batch.
///
/// Panics unless every batch is all-or-nothing, batches are contiguous from 1, and the
/// one tail marker names the highest batch.
fn crash_state(store: &dyn KvStore) -> u64 {
    let keys = store.scan(b"n", b"o", usize::MAX).unwrap();
    assert_eq!(keys.len() as u64 % CRASH_KEYS_PER_BATCH, 0, "a torn batch");
    let batches = keys.len() as u64 / CRASH_KEYS_PER_BATCH;
    for n in 1..=batches {
        for part in 0..CRASH_KEYS_PER_BATCH {
            let v = store.get(&crash_key(n, part)).unwrap();
            assert_eq!(v, Some(vec![part as u8; 64]), "batch {n} part {part}");
        }
    }
    let tails = store.scan(b"t", b"u", usize::MAX).unwrap();
    if batches == 0 {
        assert!(tails.is_empty());
    } else {
        assert_eq!(tails, vec![(crash_tail_key(batches), Vec::new())], "tail");
    }
    batches
}

/// Starts the crash child on `dir`, waits for `acks` acknowledgements, kills it with
/// SIGKILL, and returns the highest acknowledged batch.
fn run_crash_child(kind: StoreKind, dir: &Path, acks: u64) -> u64 {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args(["kv::conformance::crash_child", "--exact", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(CRASH_ENV, format!("{}:{}", kind.name(), dir.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            // The first ACK shares its line with libtest's "test ... " prefix.
            if let Some((_, n)) = line.split_once("ACK ") {
                if tx.send(n.parse::<u64>().unwrap()).is_err() {
                    break;
                }
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = 0;
    let mut seen = 0;
    while seen < acks {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(n) => {
                last = n;
                seen += 1;
            }
            Err(_) => break,
        }
    }
    // Child::kill sends SIGKILL: no destructor, no flush, no clean close of the store.
    child.kill().unwrap();
    child.wait().unwrap();
    drop(rx);
    reader.join().unwrap();
    assert!(seen >= acks.min(1), "the crash child acknowledged nothing");
    last
}

fn kill_9_keeps_every_acknowledged_batch(kind: StoreKind) {
    let dir = tempfile::tempdir().unwrap();
    let mut acked_total = 0;
    // Several rounds: each kill lands at another point, and each child starts on a store
    // that has already been recovered once.
    for acks in [40, 173, 311] {
        let acked = run_crash_child(kind, dir.path(), acks);
        let store = open_store(kind, dir.path()).unwrap();
        let highest = crash_state(&*store);
        assert!(
            highest >= acked,
            "acknowledged {acked}, found only {highest}"
        );
        assert!(acked > acked_total, "no progress in a round");
        acked_total = acked;
        eprintln!("{}: acknowledged {acked}, recovered {highest}", kind.name());
    }
}

macro_rules! conformance_suite {
    (every: [$($test:ident),* $(,)?], embedded: [$($local:ident),* $(,)?] $(,)?) => {
        mod sled {
            $(#[test]
            fn $test() {
                super::$test(super::StoreKind::Sled);
            })*
            $(#[test]
            fn $local() {
                super::$local(super::StoreKind::Sled);
            })*
        }
        mod redb {
            $(#[test]
            fn $test() {
                super::$test(super::StoreKind::Redb);
            })*
            $(#[test]
            fn $local() {
                super::$local(super::StoreKind::Redb);
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

// kill -9 of the writer is about the embedded engine's files; etcd keeps nothing in the
// writer's process, and its own crash is `conformance_txn`'s leader test.
conformance_suite!(
    every: [
        get_missing_is_none,
        put_get_delete,
        overwrite_replaces_value,
        empty_batch_commits,
        batch_last_op_on_a_key_wins,
        batch_applies_all_its_keys,
        scan_orders_binary_keys,
        scan_bounds_are_half_open,
        scan_respects_limit,
        scan_of_inverted_range_is_empty,
        large_values_round_trip,
        reopen_keeps_everything,
        concurrent_commits_all_land,
    ],
    embedded: [kill_9_keeps_every_acknowledged_batch],
);
