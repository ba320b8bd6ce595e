//! Namespace tests, each run on every engine (`...::sled::name`, `...::redb::name`,
//! `...::etcd::name`, on one etcd member this process starts, a key prefix per test).

mod changes;
mod client_keys;
mod cluster;
mod early;
mod flags;
mod held;
mod model;
mod once;
mod ops;
mod owners;
mod perms;
mod readdir;
mod rename;
mod resume;
mod sessions;
mod shared;
mod shared_leader;
mod shared_locks;
mod shared_races;
mod shared_sweep;
mod space;
mod tails;

use super::{ConnId, Namespace, SessionOwner};
use crate::clock::{Clock, SystemClock};
use crate::config::NamespaceConfig;
use crate::error::MetaError;
use crate::kv::etcd::local::LocalEtcd;
use crate::kv::{open_engine, EtcdConfig, KvStore, StoreKind, TxnStore};
use proto::meta::{Caller, OpenAccess};
use proto::{Attr, ClientId, ErrorCode, InodeId};
use std::collections::BTreeMap;
use std::sync::Arc;
use tempfile::TempDir;

/// Sends each request (of any type) to `ns` on connection 1: its debug form and its
/// result, the reply dropped.
macro_rules! each_result {
    ($ns:expr, [$($req:expr),* $(,)?]) => {
        vec![$({
            let req = $req;
            (format!("{req:?}"), $ns.handle(req, super::super::ConnId(1)).map(drop))
        }),*]
    };
}
pub(crate) use each_result;

/// Instantiates each listed `fn(StoreKind)` once per engine.
macro_rules! engine_tests {
    ($($test:ident),* $(,)?) => {
        mod sled {
            $(#[test]
            fn $test() {
                super::$test(crate::kv::StoreKind::Sled);
            })*
        }
        mod redb {
            $(#[test]
            fn $test() {
                super::$test(crate::kv::StoreKind::Redb);
            })*
        }
        mod etcd {
            $(#[test]
            fn $test() {
                if !crate::kv::etcd::local::LocalEtcd::present_for_tests() {
                    return;
                }
                super::$test(crate::kv::StoreKind::Etcd);
            })*
        }
    };
}
pub(crate) use engine_tests;

pub(super) const ROOT: InodeId = InodeId::ROOT;

/// The network layer shares one namespace between its connection tasks.
#[test]
fn namespace_is_send_and_sync() {
    fn shareable<T: Send + Sync + 'static>() {}
    shareable::<Namespace>();
}

/// A namespace on a store in a temp dir, which can be restarted.
pub(super) struct H {
    pub kind: StoreKind,
    pub dir: TempDir,
    pub config: NamespaceConfig,
    clock: Arc<dyn Clock>,
    ns: Option<Namespace>,
    store: Option<Arc<dyn KvStore>>,
    /// With etcd: the member, kept running while this namespace lives, and its prefix.
    etcd: Option<(Arc<LocalEtcd>, EtcdConfig)>,
}

impl H {
    pub fn new(kind: StoreKind) -> H {
        H::with_config(kind, NamespaceConfig::default())
    }

    pub fn with_config(kind: StoreKind, config: NamespaceConfig) -> H {
        H::with_clock(kind, config, Arc::new(SystemClock))
    }

    /// A namespace whose leases and graces run on `clock`.
    pub fn with_clock(kind: StoreKind, config: NamespaceConfig, clock: Arc<dyn Clock>) -> H {
        let mut h = H::unstarted(kind, config, clock);
        h.start();
        h
    }

    /// A place for a store of `kind`, with nothing opened on it yet.
    pub fn unstarted(kind: StoreKind, config: NamespaceConfig, clock: Arc<dyn Clock>) -> H {
        let dir = tempfile::tempdir().unwrap();
        let etcd = (kind == StoreKind::Etcd).then(|| {
            let etcd = LocalEtcd::shared().expect("starting etcd");
            let config = etcd.config();
            (etcd, config)
        });
        H {
            kind,
            dir,
            config,
            clock,
            ns: None,
            store: None,
            etcd,
        }
    }

    /// A namespace with `n` registered data servers (ids 1..=n).
    pub fn with_nodes(kind: StoreKind, n: u32) -> H {
        let h = H::new(kind);
        for i in 0..n {
            h.ns()
                .register_data(None, &format!("10.0.0.{i}:7000"), 1000, 10)
                .unwrap();
        }
        h
    }

    /// Opens this place's store, on its own (the namespace's must be stopped).
    pub fn open_store(&self) -> Arc<dyn TxnStore> {
        let etcd = self
            .etcd
            .as_ref()
            .map(|(_, c)| c.clone())
            .unwrap_or_default();
        open_engine(self.kind, self.dir.path(), &etcd).unwrap()
    }

    fn start(&mut self) {
        let store: Arc<dyn KvStore> = self.open_store();
        let ns = Namespace::open_with_clock(
            Arc::clone(&store),
            self.config.clone(),
            Arc::clone(&self.clock),
        );
        self.ns = Some(ns.unwrap());
        self.store = Some(store);
    }

    pub fn ns(&self) -> &Namespace {
        self.ns.as_ref().unwrap()
    }

    /// The raw store, to look at keys the API does not show.
    pub fn store(&self) -> &dyn KvStore {
        // Direct method calls stage their changes; make them durable before peeking.
        self.ns().sync().unwrap();
        &**self.store.as_ref().unwrap()
    }

    /// Drops the namespace and its store (as a process exit would) and opens them again.
    pub fn restart(&mut self) {
        self.stop();
        self.start();
    }

    /// Drops the namespace and the store, leaving the files.
    pub fn stop(&mut self) {
        self.ns = None;
        self.store = None;
    }

    /// Whether `key` exists in the store.
    pub fn has_key(&self, key: &[u8]) -> bool {
        self.store().get(key).unwrap().is_some()
    }
}

pub(super) fn caller() -> Caller {
    Caller::new(1000, 100)
}

pub(super) fn owner(conn: u64) -> SessionOwner {
    SessionOwner {
        client: ClientId(1),
        conn: ConnId(conn),
        access: OpenAccess::ReadWrite,
        append: false,
    }
}

/// The wire code of a result that must be an error.
pub(super) fn code<T: std::fmt::Debug>(r: Result<T, MetaError>) -> ErrorCode {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.code(),
    }
}

pub(super) fn mkdir(ns: &Namespace, parent: InodeId, name: &str) -> Attr {
    ns.mkdir(parent, name.as_bytes(), 0o755, caller())
        .unwrap()
        .attr
}

/// Commits `size` bytes as written to regular file `ino` (a file with bytes has chunks
/// to collect when it goes).
pub(super) fn written(ns: &Namespace, ino: InodeId, size: u64) {
    let mut commit = proto::meta::Commit::length(size, proto::Timestamp::now());
    commit.wrote = proto::runs::ChunkRuns::range(0, u64::MAX); // every chunk
    ns.commit(ino, commit).unwrap();
}

/// Creates and releases a regular file.
pub(super) fn touch(ns: &Namespace, parent: InodeId, name: &str) -> Attr {
    let o = ns
        .create(parent, name.as_bytes(), 0o644, caller(), true, owner(1))
        .unwrap();
    ns.release(o.session, None).unwrap();
    ns.getattr(o.attr.ino).unwrap()
}

/// Every name of directory `ino`, through readdir paging.
pub(super) fn list(ns: &Namespace, ino: InodeId) -> Vec<Vec<u8>> {
    let mut names = Vec::new();
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = ns.readdir(ino, after.as_deref(), 1024, false).unwrap();
        names.extend(page.entries.iter().map(|e| e.name.clone()));
        after = page.entries.last().map(|e| e.name.clone()).or(after);
        if page.done {
            return names;
        }
    }
}

/// What a tree shows of one inode, time stamps aside.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Seen {
    pub ino: InodeId,
    pub kind: proto::FileKind,
    pub perm: u32,
    pub nlink: u32,
    pub size: u64,
    pub target: Vec<u8>,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// The whole tree under the root: path -> what it shows. Checks on the way that each
/// entry's kind and each directory's parent pointer agree with the listing.
pub(super) fn walk(ns: &Namespace) -> BTreeMap<Vec<u8>, Seen> {
    let mut out = BTreeMap::new();
    let mut todo = vec![(Vec::new(), ROOT)];
    while let Some((path, dir)) = todo.pop() {
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = ns.readdir(dir, after.as_deref(), 100, true).unwrap();
            for e in &page.entries {
                let attr = e.attr.clone().unwrap();
                assert_eq!(attr.kind, e.kind);
                let mut p = path.clone();
                p.push(b'/');
                p.extend_from_slice(&e.name);
                out.insert(p.clone(), seen(ns, &attr));
                if e.kind == proto::FileKind::Directory {
                    todo.push((p, e.ino));
                }
            }
            after = page.entries.last().map(|e| e.name.clone()).or(after);
            if page.done {
                break;
            }
        }
    }
    out
}

pub(super) fn seen(ns: &Namespace, attr: &Attr) -> Seen {
    let target = match attr.kind {
        proto::FileKind::Symlink => ns.readlink(attr.ino).unwrap(),
        _ => Vec::new(),
    };
    let xattrs = ns
        .listxattr(attr.ino)
        .unwrap()
        .into_iter()
        .map(|n| {
            let v = ns.getxattr(attr.ino, &n).unwrap();
            (n, v)
        })
        .collect();
    Seen {
        ino: attr.ino,
        kind: attr.kind,
        perm: attr.perm,
        nlink: attr.nlink,
        size: attr.size,
        target,
        xattrs,
    }
}
