//! The etcd v3 engine: every key under one prefix of an etcd cluster, every commit one
//! `Txn` (issue 24).
//!
//! The store's calls are synchronous and the namespace makes them from its own threads
//! (the blocking pool, group commit's leader), sometimes from an async worker of the
//! server's runtime (point reads; `KvStore::reads_are_local` says `false` here so the
//! server stops doing that). The client is async, so the store owns a small runtime of
//! its own ([`RUNTIME_THREADS`] workers): a call spawns its future there and waits on a
//! plain channel. Waiting on a channel (rather than `block_on`) works from any thread,
//! a worker of another runtime included, and the store's own workers only ever run
//! futures, so a slow etcd never stalls them, nor the server's.
//!
//! Every call has a deadline: each attempt `request_timeout_ms`, retries (with backoff)
//! for at most `retry_for_ms`; while etcd is silent, a read made for a request ends
//! `retry_for_ms` from the request's arrival (`kv::deadline`: requests queued behind
//! the namespace's lock do not wait a window each). What is retried depends on whether
//! a second try is safe (`retry`): reads always; an unconditional commit too (its puts and deletes carry
//! whole values, so applying it twice ends in the same state, and one metadata server
//! writes the namespace for now); a conditional commit only when the request surely did
//! not reach etcd, since a first try that was applied would make the second one conflict.
//!
//! Limits: etcd refuses a `Txn` of more than `--max-txn-ops` (128) compares or
//! operations, or of more than `--max-request-bytes` (1.5 MiB), and a `Txn` that names a
//! key twice. A batch keeps its last operation per key (the order rule of
//! [`WriteBatch`]), is measured ([`txn_bytes`]) and refused whole with
//! [`KvError::TooLarge`] past [`EtcdConfig::max_txn_ops`] or
//! [`EtcdConfig::max_txn_bytes`]; group commit asks first (`check_batch`), and packs the
//! batches of a group into as few transactions as fit, cutting only between batches.

pub mod local;
mod members;
pub mod owner;
mod retry;

/// What tests learn of the commits this thread made.
#[cfg(test)]
pub(crate) mod test_hooks {
    use std::cell::Cell;

    thread_local! {
        static FIRST: Cell<Option<i64>> = const { Cell::new(None) };
    }

    /// Notes the etcd revision of a conditional commit that held and wrote, if none is
    /// noted.
    pub(super) fn committed_at(revision: i64) {
        FIRST.with(|f| {
            if f.get().is_none() {
                f.set(Some(revision));
            }
        });
    }

    /// The revision of this thread's first conditional commit since the last call: the
    /// place of a change in etcd's one order of every change.
    pub(crate) fn take_first_commit() -> Option<i64> {
        FIRST.with(|f| f.take())
    }
}

use self::members::Members;
use self::retry::{retrying, Retry, Silence, Timing};
use super::{
    BatchOp, KvError, KvPair, KvStore, LiveKey, ReadCheck, Revision, TxnLimits, TxnStore,
    Versioned, WriteBatch,
};
use etcd_client::{Compare, CompareOp, ConnectOptions, GetOptions, Txn, TxnOp};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub(crate) const ENGINE: &str = "etcd";

/// Worker threads of the store's own runtime: the calls are network waits, not work.
pub const RUNTIME_THREADS: usize = 2;
/// Keys asked for per range request of a scan; a scan reads its pages at the revision
/// of the first, so it is one snapshot.
pub const SCAN_PAGE_KEYS: usize = 256;
/// Largest reply the client decodes (a page of [`SCAN_PAGE_KEYS`] large values).
pub const MAX_REPLY_BYTES: usize = 64 << 20;
/// Bytes counted per compare or operation on top of its key and value: the protobuf
/// framing of a request op, a put or range request and their fields (under 32).
pub const OP_OVERHEAD_BYTES: usize = 32;
/// Bytes counted per transaction on top of its operations (the request's header).
pub const TXN_OVERHEAD_BYTES: usize = 256;

/// Where the etcd cluster is and how to use it; the `[etcd]` section of the metadata
/// server's configuration, read when `store = "etcd"`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EtcdConfig {
    /// Client URLs of the cluster's members (`http://host:port`); a call goes to any of
    /// them and moves on when one fails.
    pub endpoints: Vec<String>,
    /// Every key of this namespace starts with these bytes, so one cluster can hold
    /// several namespaces (and the tests one each). Not empty.
    pub prefix: String,
    /// How long to wait for a TCP connection to a member.
    pub connect_timeout_ms: u64,
    /// How long one attempt of a call may take.
    pub request_timeout_ms: u64,
    /// How long a call is retried (where a retry is safe) before it fails.
    pub retry_for_ms: u64,
    /// Compares, and operations, per transaction: etcd's `--max-txn-ops`.
    pub max_txn_ops: usize,
    /// Bytes per transaction as [`txn_bytes`] counts them: at most etcd's
    /// `--max-request-bytes`.
    pub max_txn_bytes: usize,
    /// Lease of the owner key a serving metadata server holds (see `owner`): how long
    /// after a server died a standby may take over. etcd counts whole seconds.
    pub owner_lease_ms: u64,
    /// How long a starting server waits for another's owner key to go before it
    /// refuses to start; a standby started beside a live server sets it long.
    pub owner_wait_ms: u64,
    /// Several metadata servers serve this prefix at once (issue 24): no owner key;
    /// each server holds a live key under a lease of `owner_lease_ms`, every change is
    /// a checked transaction, and one elected leader runs membership (see
    /// `namespace::leader`). Every server of a prefix must say the same.
    pub shared: bool,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            prefix: "tessera/".into(),
            connect_timeout_ms: 5_000,
            request_timeout_ms: 5_000,
            retry_for_ms: 30_000,
            max_txn_ops: 128,
            max_txn_bytes: 1_572_864,
            owner_lease_ms: 5_000,
            // Past one lease: a server started right after another died waits it out.
            owner_wait_ms: 15_000,
            shared: false,
        }
    }
}

impl EtcdConfig {
    /// Checks the values; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.endpoints.is_empty() {
            return Err("etcd.endpoints must name at least one member".into());
        }
        if let Some(e) = self.endpoints.iter().find(|e| !e.starts_with("http://")) {
            return Err(format!(
                "etcd.endpoints: {e:?} is not an http:// URL (TLS is not supported yet)"
            ));
        }
        // Without a separator at its end, one prefix is the start of another
        // (`ns1`, `ns10`) and a scan of one would return the other's keys.
        if !self.prefix.ends_with('/') || self.prefix.len() < 2 {
            return Err(format!(
                "etcd.prefix {:?} must be a name ending in '/' (\"/tessera/\")",
                self.prefix
            ));
        }
        for (name, v) in [
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("request_timeout_ms", self.request_timeout_ms),
            ("retry_for_ms", self.retry_for_ms),
        ] {
            if !(1..=3_600_000).contains(&v) {
                return Err(format!("etcd.{name} must be between 1 and 3600000"));
            }
        }
        if !(1_000..=600_000).contains(&self.owner_lease_ms) {
            return Err("etcd.owner_lease_ms must be between 1000 and 600000".into());
        }
        if self.owner_wait_ms > 86_400_000 {
            return Err("etcd.owner_wait_ms must be at most 86400000 (a day)".into());
        }
        if self.max_txn_ops == 0 || self.max_txn_bytes < 4096 {
            return Err("etcd.max_txn_ops must be at least 1, max_txn_bytes 4096".into());
        }
        Ok(())
    }

    fn timing(&self) -> Timing {
        Timing {
            attempt: Duration::from_millis(self.request_timeout_ms),
            retry_for: Duration::from_millis(self.retry_for_ms),
            until: None,
        }
    }
}

/// A [`TxnStore`] on an etcd v3 cluster; see the module documentation.
pub struct EtcdStore {
    /// `None` only while dropping.
    runtime: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
    members: Arc<Members>,
    prefix: Vec<u8>,
    config: EtcdConfig,
    /// The owner key and the lease this server holds it under (see `owner.rs`): every
    /// transaction applies only while etcd still has the key under that lease, so a
    /// server that lost it (stalled past its lease, cut off) writes nothing more.
    fence: Option<(String, i64)>,
    /// Whether etcd is silent (see [`Silence`]).
    silence: std::sync::Arc<Silence>,
}

impl EtcdStore {
    /// Fences every commit by the owner key `key` held under `lease`.
    pub fn fenced_by(mut self, key: String, lease: i64) -> EtcdStore {
        self.fence = Some((key, lease));
        self
    }

    /// The compare that fences a transaction, if the store is fenced.
    fn fence_compare(&self) -> Vec<Compare> {
        self.fence
            .iter()
            .map(|(key, lease)| Compare::lease(key.clone(), CompareOp::Equal, *lease))
            .collect()
    }

    /// The error of a transaction the fence refused.
    fn fenced(&self) -> KvError {
        let key = self.fence.as_ref().map_or("", |(k, _)| k.as_str());
        KvError::Engine {
            engine: ENGINE,
            message: format!(
                "the owner key {key} is no longer this server's (its lease ended): another \
                 metadata server may serve the namespace, so this one writes nothing more"
            ),
        }
    }

    /// Whether the owner key is still under this server's lease, in the reply to a
    /// failed transaction whose last read is the key.
    fn still_owner(&self, resp: &etcd_client::TxnResponse) -> bool {
        let Some((_, lease)) = &self.fence else {
            return true;
        };
        match resp.op_responses().last() {
            Some(etcd_client::TxnOpResponse::Get(g)) => {
                g.kvs().first().is_some_and(|kv| kv.lease() == *lease)
            }
            _ => false,
        }
    }
    /// Connects to the cluster `config` names (the first call waits for a member).
    pub fn connect(config: &EtcdConfig) -> Result<EtcdStore, KvError> {
        config.validate().map_err(|message| KvError::Engine {
            engine: ENGINE,
            message,
        })?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RUNTIME_THREADS)
            .thread_name("etcd-client")
            .enable_all()
            .build()
            .map_err(|e| KvError::from_io(ENGINE, &e))?;
        let handle = runtime.handle().clone();
        let options = ConnectOptions::default()
            .with_connect_timeout(Duration::from_millis(config.connect_timeout_ms))
            .with_timeout(Duration::from_millis(config.request_timeout_ms));
        let endpoints = config.endpoints.clone();
        let connect = async move {
            Members::connect(&endpoints, &options, MAX_REPLY_BYTES)
                .await
                .map_err(|e| KvError::Unavailable {
                    engine: ENGINE,
                    message: format!("connecting: {e}"),
                })
        };
        let members = wait_for(&handle, config.timing().backstop(), connect)?;
        Ok(EtcdStore {
            runtime: Some(runtime),
            handle,
            members: Arc::new(members),
            prefix: config.prefix.as_bytes().to_vec(),
            config: config.clone(),
            fence: None,
            silence: Default::default(),
        })
    }

    /// The timing of a read, with the window of the request being served (see
    /// `kv::deadline`), which bounds each call that starts while etcd is silent.
    fn read_timing(&self) -> Timing {
        let mut timing = self.config.timing();
        timing.until = super::deadline::request_started()
            .map(|t| tokio::time::Instant::from_std(t) + timing.retry_for);
        timing
    }

    fn key(&self, key: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.prefix.len() + key.len());
        k.extend_from_slice(&self.prefix);
        k.extend_from_slice(key);
        k
    }

    /// Runs `fut` on the store's runtime and waits for it here.
    fn run<T: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<T, KvError>> + Send + 'static,
    ) -> Result<T, KvError> {
        wait_for(&self.handle, self.config.timing().backstop(), fut)
    }

    /// The last operation of each key of `batches`, in key order, prefixed.
    fn collapse<'a>(&self, batches: impl IntoIterator<Item = &'a WriteBatch>) -> Ops {
        let mut ops = BTreeMap::new();
        for op in batches.into_iter().flat_map(|b| b.ops()) {
            let (k, v) = match op {
                BatchOp::Put(k, v) => (k, Some(v.clone())),
                BatchOp::Delete(k) => (k, None),
            };
            ops.insert(self.key(k), v);
        }
        ops
    }

    /// Refuses a transaction over the configured limits.
    fn check_limits(&self, checks: &[ReadCheck], ops: &Ops) -> Result<(), KvError> {
        let (max_ops, max_bytes) = (self.config.max_txn_ops, self.config.max_txn_bytes);
        let too_large = |message: String| {
            Err(KvError::TooLarge {
                engine: ENGINE,
                message,
            })
        };
        if checks.len() > max_ops || ops.len() > max_ops {
            return too_large(format!(
                "{} checks and {} keys written, over etcd.max_txn_ops = {max_ops} \
                 (etcd's --max-txn-ops)",
                checks.len(),
                ops.len()
            ));
        }
        let bytes = txn_bytes(self.prefix.len(), checks, ops);
        if bytes > max_bytes {
            return too_large(format!(
                "{bytes} bytes, over etcd.max_txn_bytes = {max_bytes} (etcd's \
                 --max-request-bytes)"
            ));
        }
        Ok(())
    }

    /// Commits `ops` unconditionally, as one `Txn`.
    fn put_all(&self, ops: Ops) -> Result<(), KvError> {
        if ops.is_empty() {
            return Ok(());
        }
        let (members, timing) = (self.members.clone(), self.config.timing());
        let silence = self.silence.clone();
        let fence = self.fence_compare();
        let resp = self.run(async move {
            retrying(timing, &silence, Retry::Always, "commit", || {
                let txn = Txn::new().when(fence.clone()).and_then(txn_ops(&ops));
                members.call(|mut kv| async move { kv.txn(txn).await })
            })
            .await
        })?;
        // With no compare (not fenced) a transaction always succeeds.
        if !resp.succeeded() {
            return Err(self.fenced());
        }
        Ok(())
    }
}

/// Keys to write (prefixed) and their new value (`None`: deleted).
type Ops = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

fn txn_ops(ops: &Ops) -> Vec<TxnOp> {
    ops.iter()
        .map(|(k, v)| match v {
            Some(v) => TxnOp::put(k.clone(), v.clone(), None),
            None => TxnOp::delete(k.clone(), None),
        })
        .collect()
}

/// The size of a transaction as the limits count it: every key (with the prefix, once
/// in a compare and once in its operation) and value, plus [`OP_OVERHEAD_BYTES`] each
/// and [`TXN_OVERHEAD_BYTES`]. A failed `commit_if` also reads its checked keys back,
/// which the same count covers.
pub fn txn_bytes(prefix_len: usize, checks: &[ReadCheck], ops: &Ops) -> usize {
    let compares: usize = checks
        .iter()
        .map(|c| 2 * (prefix_len + c.key.len() + OP_OVERHEAD_BYTES))
        .sum();
    let writes: usize = ops.iter().map(|(k, v)| op_bytes(k, v)).sum();
    TXN_OVERHEAD_BYTES + compares + writes
}

/// What one write adds to [`txn_bytes`].
fn op_bytes(key: &[u8], value: &Option<Vec<u8>>) -> usize {
    key.len() + value.as_ref().map_or(0, Vec::len) + OP_OVERHEAD_BYTES
}

/// The store-wide revision an answer was read at.
fn header_revision(resp: &etcd_client::GetResponse) -> Option<Revision> {
    let r = resp.header()?.revision();
    u64::try_from(r).ok().filter(|&r| r > 0).map(Revision)
}

/// Spawns `fut` on `handle` and waits for its answer on a channel, for at most
/// `backstop` (each future has its own deadline; this only bounds a lost answer).
fn wait_for<T: Send + 'static>(
    handle: &tokio::runtime::Handle,
    backstop: Duration,
    fut: impl Future<Output = Result<T, KvError>> + Send + 'static,
) -> Result<T, KvError> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    handle.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv_timeout(backstop).unwrap_or_else(|_| {
        Err(KvError::Unavailable {
            engine: ENGINE,
            message: format!("no answer within {} ms", backstop.as_millis()),
        })
    })
}

impl KvStore for EtcdStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        Ok(self.get_versioned(key)?.map(|v| v.value))
    }

    fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<KvPair>, KvError> {
        Ok(self.scan_at(start, end, limit, None)?.0)
    }

    fn commit(&self, batch: WriteBatch) -> Result<(), KvError> {
        let ops = self.collapse([&batch]);
        self.check_limits(&[], &ops)?;
        self.put_all(ops)
    }

    fn log_group(&self, batches: &[WriteBatch]) -> Result<bool, KvError> {
        // Whole batches into each transaction while they fit: each batch stays atomic.
        // What a batch adds is counted against the pending ones' keys (a key written
        // twice is one write), so the packing is linear in the group's operations.
        let mut pending = Ops::new();
        let mut bytes = TXN_OVERHEAD_BYTES;
        for batch in batches {
            let own = self.collapse([batch]);
            self.check_limits(&[], &own)?;
            let (mut n, mut after) = (pending.len(), bytes);
            for (k, v) in &own {
                match pending.get(k) {
                    Some(old) => after = after - op_bytes(k, old) + op_bytes(k, v),
                    None => {
                        n += 1;
                        after += op_bytes(k, v);
                    }
                }
            }
            if n > self.config.max_txn_ops || after > self.config.max_txn_bytes {
                self.put_all(std::mem::take(&mut pending))?;
                bytes = TXN_OVERHEAD_BYTES;
            }
            for (k, v) in own {
                bytes += op_bytes(&k, &v);
                if let Some(old) = pending.insert(k.clone(), v) {
                    bytes -= op_bytes(&k, &old);
                }
            }
        }
        self.put_all(pending)?;
        Ok(false)
    }

    fn check_batch(&self, batch: &WriteBatch) -> Result<(), KvError> {
        self.check_limits(&[], &self.collapse([batch]))
    }

    fn reads_are_local(&self) -> bool {
        false
    }

    fn engine(&self) -> &'static str {
        ENGINE
    }
}

impl TxnStore for EtcdStore {
    fn hold_live(&self, key: &[u8], value: &[u8]) -> Result<LiveKey, KvError> {
        let holder = owner::Owner::register(&self.config, self.key(key), value)?;
        let revision = self
            .get_versioned(key)?
            .ok_or_else(|| KvError::Engine {
                engine: ENGINE,
                message: "a live key vanished as it was put".into(),
            })?
            .revision;
        Ok(LiveKey::new(revision, Box::new(holder)))
    }

    fn get_versioned(&self, key: &[u8]) -> Result<Option<Versioned>, KvError> {
        Ok(self.get_at(key, None)?.0)
    }

    fn commit_if(&self, checks: &[ReadCheck], batch: WriteBatch) -> Result<(), KvError> {
        let ops = self.collapse([&batch]);
        self.check_limits(checks, &ops)?;
        let mut compares: Vec<Compare> = checks
            .iter()
            .map(|c| match c.revision {
                // An absent key was never created (etcd's idiom for "does not exist").
                None => Compare::create_revision(self.key(&c.key), CompareOp::Equal, 0),
                Some(r) => Compare::mod_revision(self.key(&c.key), CompareOp::Equal, r.0 as i64),
            })
            .collect();
        compares.extend(self.fence_compare());
        // On failure the same transaction reads the checked keys, to name one that moved,
        // and last the owner key, to tell a fenced server from a conflict.
        let mut reads: Vec<TxnOp> = checks
            .iter()
            .map(|c| TxnOp::get(self.key(&c.key), None))
            .collect();
        if let Some((key, _)) = &self.fence {
            reads.push(TxnOp::get(key.clone(), None));
        }
        let (members, timing) = (self.members.clone(), self.config.timing());
        let writes = txn_ops(&ops);
        let silence = self.silence.clone();
        let resp = self.run(async move {
            retrying(
                timing,
                &silence,
                Retry::IfNotSent,
                "conditional commit",
                || {
                    let txn = Txn::new()
                        .when(compares.clone())
                        .and_then(writes.clone())
                        .or_else(reads.clone());
                    members.call(|mut kv| async move { kv.txn(txn).await })
                },
            )
            .await
        })?;
        if resp.succeeded() {
            // Checks alone wrote nothing: no place in the order of changes to note.
            #[cfg(test)]
            if let Some(h) = resp.header().filter(|_| !ops.is_empty()) {
                test_hooks::committed_at(h.revision());
            }
            return Ok(());
        }
        if !self.still_owner(&resp) {
            return Err(self.fenced());
        }
        let moved = checks.iter().zip(resp.op_responses()).find(|(c, r)| {
            let now = match r {
                etcd_client::TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.mod_revision()),
                _ => None,
            };
            now.map(|r| Revision(r as u64)) != c.revision
        });
        let key = moved
            .map(|(c, _)| c.key.clone())
            .or_else(|| checks.first().map(|c| c.key.clone()))
            .unwrap_or_default();
        Err(KvError::Conflict {
            engine: ENGINE,
            key,
        })
    }

    fn limits(&self) -> TxnLimits {
        TxnLimits {
            max_ops: Some(self.config.max_txn_ops),
            max_bytes: Some(self.config.max_txn_bytes),
        }
    }

    fn get_at(
        &self,
        key: &[u8],
        at: Option<Revision>,
    ) -> Result<(Option<Versioned>, Option<Revision>), KvError> {
        let (members, timing) = (self.members.clone(), self.read_timing());
        let (silence, key) = (self.silence.clone(), self.key(key));
        let opts = at.map(|r| GetOptions::new().with_revision(r.0 as i64));
        self.run(async move {
            let resp = retrying(timing, &silence, Retry::Always, "get", || {
                let (key, opts) = (key.clone(), opts.clone());
                members.call(|mut kv| async move { kv.get(key, opts).await })
            })
            .await?;
            let read = resp.kvs().first().map(|kv| Versioned {
                value: kv.value().to_vec(),
                revision: Revision(kv.mod_revision() as u64),
            });
            Ok((read, at.or_else(|| header_revision(&resp))))
        })
    }

    fn scan_at(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        at: Option<Revision>,
    ) -> Result<(Vec<KvPair>, Option<Revision>), KvError> {
        if start >= end || limit == 0 {
            return Ok((Vec::new(), at));
        }
        let (members, timing) = (self.members.clone(), self.read_timing());
        let silence = self.silence.clone();
        let (mut from, to, skip) = (self.key(start), self.key(end), self.prefix.len());
        self.run(async move {
            let mut out: Vec<KvPair> = Vec::new();
            // Every page at the revision of the first, so the scan is one snapshot.
            let mut at_revision = at;
            while out.len() < limit {
                let page = (limit - out.len()).min(SCAN_PAGE_KEYS);
                let mut opts = GetOptions::new()
                    .with_range(to.clone())
                    .with_limit(page as i64);
                if let Some(r) = at_revision {
                    opts = opts.with_revision(r.0 as i64);
                }
                let resp = retrying(timing, &silence, Retry::Always, "scan", || {
                    let (from, opts) = (from.clone(), opts.clone());
                    members.call(|mut kv| async move { kv.get(from, Some(opts)).await })
                })
                .await?;
                at_revision = at_revision.or_else(|| header_revision(&resp));
                let kvs = resp.kvs();
                for kv in kvs {
                    // etcd answers the range asked, all under the prefix; anything else
                    // is a corrupt answer, not a reason to panic.
                    let key = kv.key().get(skip..).ok_or_else(|| KvError::Corruption {
                        engine: "etcd",
                        message: "a key outside the prefix in a scan's answer".into(),
                    })?;
                    out.push((key.to_vec(), kv.value().to_vec()));
                }
                match kvs.last() {
                    Some(last) if kvs.len() == page => {
                        from = last.key().to_vec();
                        from.push(0);
                    }
                    _ => break,
                }
            }
            Ok((out, at_revision))
        })
    }
}

impl Drop for EtcdStore {
    /// Shuts the runtime down without waiting: the store may be dropped on an async
    /// worker, where a blocking shutdown would panic.
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}
