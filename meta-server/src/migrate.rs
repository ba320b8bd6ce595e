//! Offline migration of a namespace from one store to another (`tessera-meta migrate`):
//! the embedded engines and etcd hold the same keys (the namespace is one ordered
//! key-value space, `namespace/keys.rs`), so a migration copies every key and value
//! through [`KvStore::scan`] and [`KvStore::commit`], in batches within the target's
//! transaction limits (etcd's 128 operations and 1.5 MiB), then reads both stores again
//! and compares them key for key.
//!
//! It runs with the metadata servers stopped. Everything that could refuse is checked
//! before the first write: the source exists and holds keys, no server holds either
//! store (an embedded store's file lock, etcd's owner key), and the target is empty
//! unless `overwrite` (then its keys are deleted first).

use crate::error::MigrateError;
use crate::kv::etcd::owner;
use crate::kv::{open_engine, EtcdConfig, KvError, KvPair, KvStore, StoreKind, WriteBatch};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Pairs read per scan call: bounds the memory a migration holds (a page of values).
pub const SCAN_PAGE_KEYS: usize = 512;
/// Keys per commit into an engine that sets no transaction limit (the embedded ones):
/// each commit costs an fsync, and a batch is held in memory whole.
pub const EMBEDDED_BATCH_KEYS: usize = 4096;
/// The end of a scan of every key: longer than any key the namespace writes (a name
/// is at most 255 bytes after a 9-byte prefix), and every key starts with a letter.
const ALL_KEYS_END: [u8; 1024] = [0xff; 1024];
/// How long a call to etcd is retried during a migration: an unreachable cluster is
/// reported within this, not after the server's longer default.
pub const ETCD_RETRY_FOR_MS: u64 = 10_000;
/// How long to wait for a TCP connection to an etcd member during a migration.
pub const ETCD_CONNECT_TIMEOUT_MS: u64 = 3_000;

/// One side of a migration: `redb:DIR`, `sled:DIR` or `etcd:URL,...[/PREFIX/]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreSpec {
    /// An embedded store in the metadata server's data directory.
    Embedded {
        /// The engine.
        kind: StoreKind,
        /// The data directory (`--data-dir` of the server).
        dir: PathBuf,
    },
    /// A prefix of an etcd cluster.
    Etcd(EtcdConfig),
}

impl std::fmt::Display for StoreSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreSpec::Embedded { kind, dir } => write!(f, "{}:{}", kind.name(), dir.display()),
            StoreSpec::Etcd(c) => {
                write!(f, "etcd:{} (prefix {:?})", c.endpoints.join(","), c.prefix)
            }
        }
    }
}

impl std::str::FromStr for StoreSpec {
    type Err = String;

    /// Parses `redb:DIR`, `sled:DIR` or `etcd:http://h:p,http://h:p[/prefix/]` (the
    /// prefix, after the last URL's address, defaults to the server's `tessera/`).
    fn from_str(s: &str) -> Result<StoreSpec, String> {
        let (engine, rest) = s
            .split_once(':')
            .ok_or_else(|| format!("{s:?}: expected ENGINE:WHERE (redb:DIR, etcd:URLS)"))?;
        let kind = StoreKind::from_name(engine)
            .ok_or_else(|| format!("{s:?}: unknown engine {engine:?} (redb, sled or etcd)"))?;
        if rest.is_empty() {
            return Err(format!("{s:?}: nothing after {engine}:"));
        }
        if kind != StoreKind::Etcd {
            let dir = PathBuf::from(rest);
            return Ok(StoreSpec::Embedded { kind, dir });
        }
        let mut endpoints: Vec<String> = rest.split(',').map(str::to_string).collect();
        let mut config = EtcdConfig {
            connect_timeout_ms: ETCD_CONNECT_TIMEOUT_MS,
            retry_for_ms: ETCD_RETRY_FOR_MS,
            ..EtcdConfig::default()
        };
        if let Some(last) = endpoints.last_mut() {
            let scheme = last.find("://").map_or(0, |i| i + 3);
            if let Some(slash) = last[scheme..].find('/').map(|i| i + scheme) {
                let prefix = last[slash + 1..].to_string();
                last.truncate(slash);
                if !prefix.is_empty() {
                    config.prefix = prefix;
                }
            }
        }
        config.endpoints = endpoints;
        config.validate().map_err(|e| format!("{s:?}: {e}"))?;
        Ok(StoreSpec::Etcd(config))
    }
}

/// What a migration did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MigrateReport {
    /// Keys copied (and compared after).
    pub keys: u64,
    /// Bytes of keys and values copied.
    pub bytes: u64,
    /// Commits into the target.
    pub commits: u64,
    /// Keys of the target deleted first (`overwrite`).
    pub replaced: u64,
}

impl std::fmt::Display for MigrateReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} keys ({} bytes) copied in {} commits and compared equal",
            self.keys, self.bytes, self.commits
        )?;
        if self.replaced > 0 {
            write!(f, "; {} keys of the target deleted first", self.replaced)?;
        }
        Ok(())
    }
}

/// Copies every key of `from` into `to`; see the module documentation.
pub fn migrate(
    from: &StoreSpec,
    to: &StoreSpec,
    overwrite: bool,
) -> Result<MigrateReport, MigrateError> {
    if overlap(from, to) {
        return Err(MigrateError::Refused(format!(
            "{from} and {to} overlap (the same store, or one etcd prefix inside the \
             other): a copy would read what it writes, or clear its own source"
        )));
    }
    let source = open_side(from, "source", true)?;
    let target = open_side(to, "target", false)?;
    if first_key(&*source, from)?.is_none() {
        return Err(MigrateError::Refused(format!(
            "the source {from} holds no key: nothing to migrate (wrong directory or prefix?)"
        )));
    }
    let mut report = MigrateReport::default();
    if first_key(&*target, to)?.is_some() {
        if !overwrite {
            return Err(MigrateError::Refused(format!(
                "the target {to} is not empty: nothing written. Pass --overwrite to \
                 replace what it holds"
            )));
        }
        report.replaced = clear(&*target, to)?;
    }
    copy((&*source, from), (&*target, to), &mut report)?;
    let compared = compare(&*source, &*target, from, to)?;
    if compared != report.keys {
        return Err(MigrateError::Differs(format!(
            "{} keys copied but {compared} compared: did something write to a store?",
            report.keys
        )));
    }
    Ok(report)
}

/// Whether `a` and `b` may name the same keys: one data directory (as given, or the
/// same directory by its real path), or etcd prefixes one of which starts with the
/// other, whatever the endpoints (two lists can name one cluster: `127.0.0.1` and
/// `localhost`, another order). Embedded and etcd never overlap.
fn overlap(a: &StoreSpec, b: &StoreSpec) -> bool {
    match (a, b) {
        (StoreSpec::Embedded { dir: x, .. }, StoreSpec::Embedded { dir: y, .. }) => {
            let real = |d: &Path| std::fs::canonicalize(d).unwrap_or_else(|_| d.to_path_buf());
            x == y || real(x) == real(y)
        }
        (StoreSpec::Etcd(x), StoreSpec::Etcd(y)) => {
            x.prefix.starts_with(&y.prefix) || y.prefix.starts_with(&x.prefix)
        }
        _ => false,
    }
}

fn store_err(spec: &StoreSpec, what: &str) -> impl FnOnce(KvError) -> MigrateError {
    let context = format!("{what} {spec}");
    move |source| MigrateError::Store { context, source }
}

/// Opens one side, refusing one that a metadata server holds. A source must exist: an
/// embedded engine would make an empty store in a mistyped directory.
fn open_side(
    spec: &StoreSpec,
    side: &str,
    must_exist: bool,
) -> Result<Arc<dyn KvStore>, MigrateError> {
    match spec {
        StoreSpec::Embedded { kind, dir } => {
            if must_exist && !embedded_files(*kind, dir).exists() {
                return Err(MigrateError::Refused(format!(
                    "the {side} {spec} holds no {} store ({} does not exist)",
                    kind.name(),
                    embedded_files(*kind, dir).display()
                )));
            }
            let store = open_engine(*kind, dir, &EtcdConfig::default()).map_err(|source| {
                MigrateError::Store {
                    context: format!(
                        "opening the {side} {spec} (a metadata server running on it holds \
                         its lock: stop it first)"
                    ),
                    source,
                }
            })?;
            Ok(store)
        }
        StoreSpec::Etcd(config) => {
            if let Some(holder) = owner::current_holder(config)
                .map_err(store_err(spec, &format!("reaching the {side}")))?
            {
                return Err(MigrateError::Refused(format!(
                    "the {side} {spec} is served by the metadata server {holder} (it holds \
                     the owner key): stop every metadata server on it first"
                )));
            }
            let store = open_engine(StoreKind::Etcd, Path::new(""), config)
                .map_err(store_err(spec, &format!("connecting to the {side}")))?;
            Ok(store)
        }
    }
}

/// The file or directory an embedded engine keeps its store in (see `kv::open_engine`).
fn embedded_files(kind: StoreKind, dir: &Path) -> PathBuf {
    match kind {
        StoreKind::Sled => dir.join("sled"),
        StoreKind::Redb | StoreKind::Etcd => dir.join("meta.redb"),
    }
}

fn first_key(store: &dyn KvStore, spec: &StoreSpec) -> Result<Option<KvPair>, MigrateError> {
    let page = store
        .scan(&[], &ALL_KEYS_END, 1)
        .map_err(store_err(spec, "reading"))?;
    Ok(page.into_iter().next())
}

/// Calls `each` with every page of `store`'s pairs, in key order.
fn pages(
    store: &dyn KvStore,
    spec: &StoreSpec,
    mut each: impl FnMut(Vec<KvPair>) -> Result<(), MigrateError>,
) -> Result<(), MigrateError> {
    let mut start = Vec::new();
    loop {
        let page = store
            .scan(&start, &ALL_KEYS_END, SCAN_PAGE_KEYS)
            .map_err(store_err(spec, "reading"))?;
        let Some((last, _)) = page.last() else {
            return Ok(());
        };
        // The smallest key after `last`.
        start = last.clone();
        start.push(0);
        let full = page.len() == SCAN_PAGE_KEYS;
        each(page)?;
        if !full {
            return Ok(());
        }
    }
}

/// Commits `batch` and starts a new one.
fn flush(
    target: &dyn KvStore,
    to: &StoreSpec,
    batch: &mut WriteBatch,
    commits: &mut u64,
) -> Result<(), MigrateError> {
    if batch.is_empty() {
        return Ok(());
    }
    target
        .commit(std::mem::take(batch))
        .map_err(store_err(to, "writing"))?;
    *commits += 1;
    Ok(())
}

/// Adds `op` to `batch`, committing `batch` first if the target would refuse it whole
/// (its transaction limits, [`KvStore::check_batch`]) or it holds
/// [`EMBEDDED_BATCH_KEYS`].
fn add(
    target: &dyn KvStore,
    to: &StoreSpec,
    batch: &mut WriteBatch,
    commits: &mut u64,
    op: impl Fn(&mut WriteBatch),
) -> Result<(), MigrateError> {
    let mut grown = batch.clone();
    op(&mut grown);
    let fits = grown.len() <= EMBEDDED_BATCH_KEYS && target.check_batch(&grown).is_ok();
    if fits {
        *batch = grown;
        return Ok(());
    }
    flush(target, to, batch, commits)?;
    op(batch);
    // Alone over the limit: the error names the limit.
    target.check_batch(batch).map_err(store_err(to, "writing"))
}

fn clear(target: &dyn KvStore, to: &StoreSpec) -> Result<u64, MigrateError> {
    let (mut batch, mut commits, mut n) = (WriteBatch::new(), 0, 0);
    pages(target, to, |page| {
        for (k, _) in page {
            add(target, to, &mut batch, &mut commits, |b| {
                b.delete(k.clone())
            })?;
            n += 1;
        }
        // Deleted before the next page is read: the scan starts after the last key.
        flush(target, to, &mut batch, &mut commits)
    })?;
    Ok(n)
}

fn copy(
    (source, from): (&dyn KvStore, &StoreSpec),
    (target, to): (&dyn KvStore, &StoreSpec),
    report: &mut MigrateReport,
) -> Result<(), MigrateError> {
    let mut batch = WriteBatch::new();
    pages(source, from, |page| {
        for (k, v) in page {
            report.keys += 1;
            report.bytes += (k.len() + v.len()) as u64;
            add(target, to, &mut batch, &mut report.commits, |b| {
                b.put(k.clone(), v.clone())
            })?;
        }
        Ok(())
    })?;
    flush(target, to, &mut batch, &mut report.commits)
}

/// The target's pairs, read a page at a time, in key order.
struct Cursor<'a> {
    store: &'a dyn KvStore,
    spec: &'a StoreSpec,
    /// The rest of the current page, reversed (the next pair last).
    page: Vec<KvPair>,
    /// Where the next page starts; `None` once a page came back short.
    next: Option<Vec<u8>>,
}

impl Cursor<'_> {
    fn pop(&mut self) -> Result<Option<KvPair>, MigrateError> {
        if self.page.is_empty() {
            if let Some(start) = self.next.take() {
                self.page = self
                    .store
                    .scan(&start, &ALL_KEYS_END, SCAN_PAGE_KEYS)
                    .map_err(store_err(self.spec, "reading"))?;
                if self.page.len() == SCAN_PAGE_KEYS {
                    self.next = self.page.last().map(|(k, _)| [k.as_slice(), &[0]].concat());
                }
                self.page.reverse();
            }
        }
        Ok(self.page.pop())
    }
}

/// Reads both stores again, page by page, and compares every key and value (and that
/// the target holds no other key); returns the number of keys compared.
fn compare(
    source: &dyn KvStore,
    target: &dyn KvStore,
    from: &StoreSpec,
    to: &StoreSpec,
) -> Result<u64, MigrateError> {
    let mut copied = Cursor {
        store: target,
        spec: to,
        page: Vec::new(),
        next: Some(Vec::new()),
    };
    let mut n = 0u64;
    pages(source, from, |page| {
        for (k, v) in page {
            match copied.pop()? {
                Some((tk, tv)) if tk == k && tv == v => n += 1,
                Some((tk, _)) if tk == k => {
                    return Err(MigrateError::Differs(format!(
                        "the value of key {} differs in {to}",
                        crate::kv::Escaped(&k)
                    )))
                }
                _ => {
                    return Err(MigrateError::Differs(format!(
                        "key {} of {from} is not in {to}",
                        crate::kv::Escaped(&k)
                    )))
                }
            }
        }
        Ok(())
    })?;
    if let Some((extra, _)) = copied.pop()? {
        return Err(MigrateError::Differs(format!(
            "{to} holds key {}, which {from} does not",
            crate::kv::Escaped(&extra)
        )));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn etcd(spec: &str) -> EtcdConfig {
        match spec.parse::<StoreSpec>().expect("parses") {
            StoreSpec::Etcd(c) => c,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn store_specs_name_an_engine_and_where() {
        assert_eq!(
            "redb:/var/lib/m".parse::<StoreSpec>(),
            Ok(StoreSpec::Embedded {
                kind: StoreKind::Redb,
                dir: "/var/lib/m".into()
            })
        );
        let c = etcd("etcd:http://a:1,http://b:2");
        assert_eq!(c.endpoints, ["http://a:1", "http://b:2"]);
        assert_eq!(c.prefix, "tessera/");
        assert_eq!(c.retry_for_ms, ETCD_RETRY_FOR_MS);
        let c = etcd("etcd:http://a:1,http://b:2/ns1/");
        assert_eq!(c.endpoints, ["http://a:1", "http://b:2"]);
        assert_eq!(c.prefix, "ns1/");
        assert_eq!(etcd("etcd:http://a:1/").prefix, "tessera/");
        for bad in ["redb", "redb:", "tikv:/x", "etcd:a:1", "etcd:http://a:1/ns"] {
            assert!(bad.parse::<StoreSpec>().is_err(), "{bad}");
        }
    }

    /// Guards against a migration whose target is its source under another name (it
    /// cleared the source with `--overwrite`), or a prefix inside the other (a copy
    /// into a child prefix is read back by its own scan, without end).
    #[test]
    fn overlapping_stores_are_refused_before_anything_is_opened() {
        let spec = |s: &str| s.parse::<StoreSpec>().expect("parses");
        for (a, b) in [
            (
                "etcd:http://127.0.0.1:2379/t/",
                "etcd:http://localhost:2379/t/",
            ),
            (
                "etcd:http://a:1,http://b:2/t/",
                "etcd:http://b:2,http://a:1/t/",
            ),
            ("etcd:http://a:1/t/", "etcd:http://a:1/t/new/"),
            ("etcd:http://a:1/t/v1/", "etcd:http://a:1/t/"),
            ("redb:/var/lib/m", "sled:/var/lib/m"),
        ] {
            let (a, b) = (spec(a), spec(b));
            assert!(overlap(&a, &b) && overlap(&b, &a), "{a} {b}");
            let e = migrate(&a, &b, true).unwrap_err();
            assert!(e.to_string().contains("overlap"), "{e}");
        }
        assert!(!overlap(
            &spec("etcd:http://a:1/t/"),
            &spec("etcd:http://a:1/u/")
        ));
        assert!(!overlap(&spec("redb:/a"), &spec("redb:/b")));
        assert!(!overlap(&spec("redb:/a"), &spec("etcd:http://a:1/")));
    }

    /// Guards the page walk: keys on both sides of a page's end are all copied, and a
    /// full copy compares equal, an altered one not.
    #[test]
    fn every_key_is_copied_across_pages_and_compared() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let spec = |d: &Path| StoreSpec::Embedded {
            kind: StoreKind::Redb,
            dir: d.to_path_buf(),
        };
        {
            let store = open_engine(StoreKind::Redb, &a, &EtcdConfig::default()).expect("open");
            let mut batch = WriteBatch::new();
            for i in 0..(2 * SCAN_PAGE_KEYS + 7) {
                batch.put(format!("I{i:06}").into_bytes(), vec![i as u8; i % 300]);
            }
            batch.put(vec![b'D', 0, 0xff], b"binary".to_vec());
            store.commit(batch).expect("commit");
        }
        let report = migrate(&spec(&a), &spec(&b), false).expect("migrates");
        assert_eq!(report.keys, 2 * SCAN_PAGE_KEYS as u64 + 8);
        let again = migrate(&spec(&a), &spec(&b), false).expect_err("target not empty");
        assert!(again.to_string().contains("not empty"), "{again}");
        {
            let store = open_engine(StoreKind::Redb, &b, &EtcdConfig::default()).expect("open");
            let mut batch = WriteBatch::new();
            batch.put(b"Zextra".to_vec(), b"x".to_vec());
            store.commit(batch).expect("commit");
        }
        let replaced = migrate(&spec(&a), &spec(&b), true).expect("overwrites");
        assert_eq!(replaced.replaced, report.keys + 1);
        assert_eq!(replaced.keys, report.keys);
        let source = open_engine(StoreKind::Redb, &a, &EtcdConfig::default()).expect("open");
        let target = open_engine(StoreKind::Redb, &b, &EtcdConfig::default()).expect("open");
        let mut batch = WriteBatch::new();
        batch.put(b"I000003".to_vec(), b"changed".to_vec());
        target.commit(batch).expect("commit");
        let differs = compare(&*source, &*target, &spec(&a), &spec(&b)).expect_err("differs");
        assert!(differs.to_string().contains("differs"), "{differs}");
    }
}
