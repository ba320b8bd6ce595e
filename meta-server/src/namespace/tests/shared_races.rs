//! Two servers on one shared engine, one race at a time: the other server's change lands
//! at a chosen point of this server's request (a hook in this server's engine), where
//! the random test of `shared.rs` would meet it only by chance.
//!
//! The engine is redb's (its revisions are this process's, see `kv/revisions.rs`), shared
//! by both namespaces; `Hooked` runs the hook once, right after the read it waits for.

use super::once::at;
use super::{caller, owner, touch, H, ROOT};
use crate::clock::SystemClock;
use crate::config::NamespaceConfig;
use crate::kv::{
    BatchOp, KvError, KvPair, KvStore, ReadCheck, StoreKind, TxnLimits, TxnStore, Versioned,
    WriteBatch,
};
use crate::namespace::{keys, ClientRecord, ConnId, Namespace, OP_SLOTS};
use parking_lot::Mutex;
use proto::auth::{Caps, KeyId};
use proto::meta::{fs, RenameMode, XattrMode};
use proto::{ClientId, ErrorCode};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

type Hook = Box<dyn FnOnce() + Send>;

/// An engine that runs a hook after a read of one key (or a scan from it).
pub(super) struct Hooked {
    pub(super) inner: Arc<dyn TxnStore>,
    /// The key, how many of its reads to let pass first, the hook.
    pub(super) hook: Mutex<Option<(Vec<u8>, usize, Hook)>>,
    /// The next conditional commit that holds answers "unavailable, may have been
    /// applied", as etcd does when its answer is lost.
    lose_answer: AtomicBool,
    /// The next conditional commit that writes is not applied, and answers as
    /// `lose_answer` makes it (a request lost on its way to etcd's old leader); it is
    /// kept in `dropped`, for a test to apply late.
    drop_commit: AtomicBool,
    dropped: Mutex<Option<(Vec<ReadCheck>, WriteBatch)>>,
    /// Plain (unchecked) commits that wrote a change's record: an answer recorded
    /// after its change, in a commit of its own.
    plain_records: AtomicUsize,
    /// Conditional commits refused for a key that moved.
    conflicts: AtomicUsize,
    /// Most checks one conditional commit may carry (etcd's is 128), if set.
    max_checks: Mutex<Option<usize>>,
}

impl Hooked {
    fn after_read_of(&self, key: &[u8]) {
        let fire = {
            let mut h = self.hook.lock();
            match h.as_mut() {
                Some((k, skip, _)) if k == key && *skip > 0 => {
                    *skip -= 1;
                    None
                }
                Some((k, _, _)) if k == key => h.take(),
                _ => None,
            }
        };
        if let Some((_, _, f)) = fire {
            f();
        }
    }
}

impl KvStore for Hooked {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        let r = self.inner.get(key);
        self.after_read_of(key);
        r
    }
    fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<KvPair>, KvError> {
        let r = self.inner.scan(start, end, limit);
        self.after_read_of(start);
        r
    }
    fn commit(&self, batch: WriteBatch) -> Result<(), KvError> {
        let record = keys::op_record_prefix();
        let writes_record = batch.ops().iter().any(|op| match op {
            BatchOp::Put(k, _) | BatchOp::Delete(k) => k.starts_with(&record),
        });
        if writes_record {
            self.plain_records.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.commit(batch)
    }
    fn engine(&self) -> &'static str {
        self.inner.engine()
    }
}

impl TxnStore for Hooked {
    fn get_versioned(&self, key: &[u8]) -> Result<Option<Versioned>, KvError> {
        let r = self.inner.get_versioned(key);
        self.after_read_of(key);
        r
    }
    fn commit_if(&self, checks: &[ReadCheck], batch: WriteBatch) -> Result<(), KvError> {
        if let Some(most) = *self.max_checks.lock() {
            if checks.len() > most {
                return Err(KvError::TooLarge {
                    engine: "test",
                    message: format!("{} checks, at most {most}", checks.len()),
                });
            }
        }
        if !batch.is_empty() && self.drop_commit.swap(false, Ordering::SeqCst) {
            *self.dropped.lock() = Some((checks.to_vec(), batch));
            return Err(KvError::Unavailable {
                engine: "test",
                message: "conditional commit unanswered; it may have been applied".into(),
            });
        }
        let r = self.inner.commit_if(checks, batch);
        if matches!(r, Err(KvError::Conflict { .. })) {
            self.conflicts.fetch_add(1, Ordering::SeqCst);
        }
        if r.is_ok() && self.lose_answer.swap(false, Ordering::SeqCst) {
            return Err(KvError::Unavailable {
                engine: "test",
                message: "conditional commit unanswered; it may have been applied".into(),
            });
        }
        r
    }
    fn limits(&self) -> TxnLimits {
        match *self.max_checks.lock() {
            Some(most) => TxnLimits {
                max_ops: Some(most),
                ..self.inner.limits()
            },
            None => self.inner.limits(),
        }
    }
}

/// Server A (hooked) and server B on `h`'s store, which must be stopped.
pub(super) fn two_on(h: &H) -> (Arc<Hooked>, Arc<Namespace>, Arc<Namespace>) {
    let engine = h.open_store();
    let hooked = Arc::new(Hooked {
        inner: engine.clone(),
        hook: Mutex::new(None),
        lose_answer: AtomicBool::new(false),
        drop_commit: AtomicBool::new(false),
        dropped: Mutex::new(None),
        plain_records: AtomicUsize::new(0),
        conflicts: AtomicUsize::new(0),
        max_checks: Mutex::new(None),
    });
    let open = |e: Arc<dyn TxnStore>| {
        Arc::new(
            Namespace::open_shared(e, NamespaceConfig::default(), Arc::new(SystemClock)).unwrap(),
        )
    };
    let a = open(hooked.clone());
    (hooked, a, open(engine))
}

/// Server A (hooked) and server B on a namespace with three data servers' chains
/// (made before the two start: a new shared namespace forms none yet).
pub(super) fn two() -> (H, Arc<Hooked>, Arc<Namespace>, Arc<Namespace>) {
    let mut h = H::with_nodes(StoreKind::Redb, 3);
    h.stop();
    let (hooked, a, b) = two_on(&h);
    (h, hooked, a, b)
}

/// The hook: `f` runs right after server A reads `key`, on a thread of its own (as
/// server B's request would: a request's marks are kept per thread).
fn when_read(hooked: &Hooked, key: Vec<u8>, f: impl FnOnce() + Send + 'static) {
    when_read_again(hooked, key, 0, f);
}

/// [`when_read`] after `skip` reads of `key` have passed.
pub(super) fn when_read_again(
    hooked: &Hooked,
    key: Vec<u8>,
    skip: usize,
    f: impl FnOnce() + Send + 'static,
) {
    let other = move || std::thread::spawn(f).join().expect("server B's change");
    *hooked.hook.lock() = Some((key, skip, Box::new(other)));
}

#[test]
fn an_rmdir_that_found_the_directory_empty_loses_to_a_mkdir_in_it() {
    let (_h, hooked, a, b) = two();
    let x = a.mkdir(ROOT, b"x", 0o755, caller()).unwrap().attr.ino;
    let b2 = b.clone();
    when_read(&hooked, keys::dirent_prefix(x), move || {
        b2.mkdir(x, b"child", 0o755, caller()).unwrap();
    });
    let r = a.handle(
        fs::Rmdir {
            parent: ROOT,
            name: b"x".to_vec(),
        },
        ConnId(1),
    );
    assert_eq!(r.unwrap_err().code, ErrorCode::NotEmpty);
    assert!(b.lookup(x, b"child").is_ok());
    assert_eq!(b.check_namespace().unwrap(), Vec::<String>::new());
}

#[test]
fn a_rename_over_an_empty_directory_loses_to_a_mkdir_in_it() {
    let (_h, hooked, a, b) = two();
    a.mkdir(ROOT, b"src", 0o755, caller()).unwrap();
    let dst = a.mkdir(ROOT, b"dst", 0o755, caller()).unwrap().attr.ino;
    let b2 = b.clone();
    when_read(&hooked, keys::dirent_prefix(dst), move || {
        b2.mkdir(dst, b"child", 0o755, caller()).unwrap();
    });
    let r = a.handle(
        fs::Rename {
            parent: ROOT,
            name: b"src".to_vec(),
            new_parent: ROOT,
            new_name: b"dst".to_vec(),
            mode: RenameMode::Replace,
        },
        ConnId(1),
    );
    assert_eq!(r.unwrap_err().code, ErrorCode::NotEmpty);
    assert_eq!(b.check_namespace().unwrap(), Vec::<String>::new());
}

#[test]
fn a_change_sent_again_to_another_server_while_its_first_try_lands_is_applied_once() {
    let mut h = H::with_nodes(StoreKind::Redb, 1);
    let ino = touch(h.ns(), ROOT, "f").ino;
    h.stop();
    let (hooked, a, b) = two_on(&h);
    // The first try is slow on B; the client sends it again to A, and B's try lands
    // right after A read the change's slot.
    let b2 = b.clone();
    let slot = keys::op_record(ClientId(1), 7 % OP_SLOTS);
    when_read(&hooked, slot, move || {
        let first = b2.handle(fs::Append { ino, len: 100 }, at(2, 7, false));
        assert_eq!(first.unwrap(), 0);
    });
    let retry = a.handle(fs::Append { ino, len: 100 }, at(3, 7, true));
    assert_eq!(retry.unwrap(), 0, "answered as the first try was");
    assert_eq!(b.getattr(ino).unwrap().size, 100, "applied once");
}

#[test]
fn a_commit_that_landed_unanswered_does_not_hand_its_inode_number_out_again() {
    let (_h, hooked, a, b) = two();
    a.mkdir(ROOT, b"first", 0o755, caller()).unwrap();
    hooked.lose_answer.store(true, Ordering::SeqCst);
    assert!(a.mkdir(ROOT, b"x", 0o755, caller()).is_err());
    let y = a.mkdir(ROOT, b"y", 0o755, caller()).unwrap().attr.ino;
    let x = b.lookup(ROOT, b"x").unwrap().ino;
    assert_ne!(x, y, "two names, one inode number");
    assert_eq!(b.check_namespace().unwrap(), Vec::<String>::new());
}

fn mkdir_x() -> fs::Mkdir {
    fs::Mkdir {
        parent: ROOT,
        name: b"x".to_vec(),
        perm: 0o755,
    }
}

/// Guards against an error for a change whose commit etcd applied but whose answer
/// was lost (its leader killed): the change's mark, read back, says it landed.
#[test]
fn an_unanswered_change_that_landed_is_answered_as_applied() {
    let (_h, hooked, a, b) = two();
    hooked.lose_answer.store(true, Ordering::SeqCst);
    let made = a.handle(mkdir_x(), at(1, 1, false)).unwrap();
    assert!(
        !hooked.lose_answer.load(Ordering::SeqCst),
        "an answer was lost"
    );
    assert_eq!(b.lookup(ROOT, b"x").unwrap().ino, made.attr.ino);
    // Sent again to the other server: answered from the record, not applied again.
    let again = b.handle(mkdir_x(), at(2, 1, true)).unwrap();
    assert_eq!(again.attr.ino, made.attr.ino);
    assert_eq!(b.check_namespace().unwrap(), Vec::<String>::new());
}

/// Guards against an error for a change whose commit never reached etcd while its
/// answer was awaited: its slot read back is as before, so it runs again, once.
#[test]
fn an_unanswered_change_that_did_not_land_runs_again_once() {
    let (_h, hooked, a, b) = two();
    hooked.drop_commit.store(true, Ordering::SeqCst);
    let made = a.handle(mkdir_x(), at(1, 1, false)).unwrap();
    assert!(
        !hooked.drop_commit.load(Ordering::SeqCst),
        "a commit was lost"
    );
    assert_eq!(b.lookup(ROOT, b"x").unwrap().ino, made.attr.ino);
    let again = b.handle(mkdir_x(), at(2, 1, true)).unwrap();
    assert_eq!(again.attr.ino, made.attr.ino);
    assert_eq!(b.readdir(ROOT, None, 10, false).unwrap().entries.len(), 1);
    assert_eq!(b.check_namespace().unwrap(), Vec::<String>::new());
}

/// Guards against an unanswered try that lands after it was read back as not landed
/// (a proposal still under way in etcd), before the change's next try commits: the
/// read-back fenced the slot, so the late try fails its check, and the next try lands.
#[test]
fn an_unanswered_try_that_lands_late_is_refused_by_the_fence() {
    let (_h, hooked, a, b) = two();
    hooked.drop_commit.store(true, Ordering::SeqCst);
    // Reads of the slot: the change's own before it runs, the read-back, and the one
    // after the fence; the lost try lands right after that.
    let slot = keys::op_record(ClientId(1), 1 % OP_SLOTS);
    let late = hooked.clone();
    when_read_again(&hooked, slot, 2, move || {
        let (checks, batch) = late.dropped.lock().take().expect("a dropped commit");
        let r = late.inner.commit_if(&checks, batch);
        assert!(matches!(r, Err(KvError::Conflict { .. })), "{r:?}");
    });
    let made = a.handle(mkdir_x(), at(1, 1, false)).unwrap();
    assert!(hooked.hook.lock().is_none(), "the late try was applied");
    assert_eq!(b.lookup(ROOT, b"x").unwrap().ino, made.attr.ino);
    assert_eq!(b.readdir(ROOT, None, 10, false).unwrap().entries.len(), 1);
    assert_eq!(b.check_namespace().unwrap(), Vec::<String>::new());
}

/// Guards against a change whose answer is recorded after it, in a commit of its own:
/// on a shared engine a second commit its reply waits for, and a server that died
/// between the two left the retry nothing to answer from (it failed after 10 s). Each
/// change of a file or directory commits once, its answer in its mark, and its retry
/// on the other server is answered from it, applied once.
#[test]
fn a_change_commits_once_with_its_answer_and_its_retry_is_answered_from_it() {
    let (_h, hooked, a, b) = two();
    let ino = touch(&a, ROOT, "log").ino;
    let records = || hooked.plain_records.load(Ordering::SeqCst);
    let before = records();
    let first = a.handle(fs::Append { ino, len: 10 }, at(1, 1, false));
    let again = b.handle(fs::Append { ino, len: 10 }, at(2, 1, true));
    assert_eq!((first.unwrap(), again.unwrap()), (0, 0), "answered alike");
    assert_eq!(b.getattr(ino).unwrap().size, 10, "applied once");
    // A create's answer (its open) goes with it too; the retry takes the open over.
    let made = a
        .handle(super::once::create("new"), at(1, 2, false))
        .unwrap();
    let again = b
        .handle(super::once::create("new"), at(2, 2, true))
        .unwrap();
    assert_eq!(
        (made.attr.ino, b.lookup(ROOT, b"new").unwrap().ino),
        (again.attr.ino, again.attr.ino)
    );
    b.release(again.session, None).unwrap();
    let link = |to: &str| fs::Link {
        ino,
        new_parent: ROOT,
        new_name: to.into(),
        kernel_checked: false,
    };
    a.handle(link("log2"), at(1, 3, false)).unwrap();
    let made = b.handle(link("log2"), at(2, 3, true)).unwrap();
    assert_eq!((made.attr.ino, made.attr.nlink), (ino, 2), "linked once");
    // A close with its length commit.
    let session = a.open_inode(ino, true, owner(1)).unwrap().session;
    let close = || fs::Release {
        session,
        commit: Some(proto::meta::Commit::length(17, proto::Timestamp::now())),
    };
    a.handle(close(), at(1, 4, false)).unwrap();
    b.handle(close(), at(2, 4, true)).unwrap();
    assert_eq!(b.getattr(ino).unwrap().size, 17, "its length committed");
    // A removexattr.
    a.setxattr(ino, b"user.k", b"v", XattrMode::Upsert).unwrap();
    let remove = || fs::RemoveXattr {
        ino,
        name: b"user.k".to_vec(),
    };
    a.handle(remove(), at(1, 5, false)).unwrap();
    b.handle(remove(), at(2, 5, true)).unwrap();
    assert!(b.listxattr(ino).unwrap().is_empty(), "removed");
    // An unnamed file (`O_TMPFILE`).
    let unnamed = || fs::TmpFile {
        parent: ROOT,
        perm: 0o600,
        linkable: false,
        access: proto::meta::OpenAccess::ReadWrite,
        client: proto::ClientId(1),
    };
    let made = a.handle(unnamed(), at(1, 6, false)).unwrap();
    let again = b.handle(unnamed(), at(2, 6, true)).unwrap();
    assert_eq!(made.attr.ino, again.attr.ino, "made once");
    b.release(again.session, None).unwrap();
    assert_eq!(
        b.getattr(again.attr.ino).unwrap_err().code(),
        ErrorCode::NotFound,
        "freed at its only close"
    );
    assert_eq!(records(), before, "an answer recorded after its change");
    assert_eq!(b.check_namespace().unwrap(), Vec::<String>::new());
}

/// A change without a mark (a request that may be applied twice) runs again after an
/// unanswered commit, landed or not; one that may not, and carries no mark (called
/// outside a request), stays an error (see the inode-number test above).
#[test]
fn an_unanswered_idempotent_change_runs_again() {
    let (_h, hooked, a, b) = two();
    let ino = touch(&a, ROOT, "f").ino;
    for (lost, perm) in [(&hooked.lose_answer, 0o600), (&hooked.drop_commit, 0o640)] {
        lost.store(true, Ordering::SeqCst);
        let set = fs::SetAttr {
            ino,
            set: proto::attr::SetAttr {
                perm: Some(perm),
                ..Default::default()
            },
            commit: None,
        };
        let attr = a.handle(set, ConnId(1)).unwrap();
        assert!(!lost.load(Ordering::SeqCst), "a commit was lost");
        assert_eq!((attr.perm, b.getattr(ino).unwrap().perm), (perm, perm));
    }
}

#[test]
fn two_revocations_on_two_servers_take_two_versions() {
    let (_h, hooked, a, b) = two();
    for (name, id) in [("alice", 1), ("bob", 2)] {
        let rec = ClientRecord::new(KeyId([id; 16]), Caps::default());
        a.put_client_key(name, &rec, true).unwrap();
    }
    let b2 = b.clone();
    when_read(&hooked, keys::revocation(1), move || {
        b2.revoke_client_key("bob").unwrap();
    });
    a.revoke_client_key("alice").unwrap();
    let (list, _) = b.revocations(0, 10).unwrap();
    let names: Vec<&str> = list.iter().map(|(_, r)| r.name.as_str()).collect();
    assert_eq!(names, ["bob", "alice"]);
}

/// Unlinks `name` from the root through `ns`'s request path (checked, retried).
pub(super) fn unlink(ns: &Namespace, name: &[u8]) {
    let r = ns.handle(
        fs::Unlink {
            parent: ROOT,
            name: name.to_vec(),
        },
        ConnId(1),
    );
    r.unwrap();
}

#[test]
fn a_file_open_on_one_server_and_unlinked_on_the_other_stays_until_its_last_close() {
    let (_h, _hooked, a, b) = two();
    let ino = touch(&a, ROOT, "f").ino;
    let first = a.open_inode(ino, false, owner(1)).unwrap().session;
    let second = a.open_inode(ino, false, owner(2)).unwrap().session;
    unlink(&b, b"f");
    // Both servers still answer for the file; the check finds an orphan, no fault.
    assert_eq!(b.getattr(ino).unwrap().nlink, 0);
    assert_eq!(b.check_namespace().unwrap(), Vec::<String>::new());
    a.release(first, None).unwrap();
    assert!(b.getattr(ino).is_ok(), "freed while A still had it open");
    a.release(second, None).unwrap();
    assert_eq!(b.getattr(ino).unwrap_err().code(), ErrorCode::NotFound);
    assert_eq!(a.check_namespace().unwrap(), Vec::<String>::new());
}

#[test]
fn an_unlink_that_found_the_file_closed_loses_to_an_open_on_the_other_server() {
    let (_h, hooked, a, b) = two();
    let ino = touch(&a, ROOT, "f").ino;
    let b2 = b.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    when_read(&hooked, keys::openers(ino), move || {
        let s = b2.open_inode(ino, false, owner(2)).unwrap().session;
        tx.send(s).unwrap();
    });
    unlink(&a, b"f");
    let on_b = rx
        .try_recv()
        .expect("the hook ran: server B opened the file");
    assert!(b.getattr(ino).is_ok(), "freed while B had it open");
    b.release(on_b, None).unwrap();
    assert_eq!(a.getattr(ino).unwrap_err().code(), ErrorCode::NotFound);
    assert_eq!(a.check_namespace().unwrap(), Vec::<String>::new());
}

#[test]
fn a_connection_that_closes_frees_what_only_it_held_open_on_a_shared_engine() {
    let (_h, _hooked, a, b) = two();
    let f = touch(&a, ROOT, "f").ino;
    let g = touch(&a, ROOT, "g").ino;
    a.open_inode(f, false, owner(5)).unwrap();
    a.open_inode(g, false, owner(5)).unwrap();
    let on_b = b.open_inode(g, false, owner(6)).unwrap().session;
    unlink(&b, b"f");
    unlink(&b, b"g");
    assert!(b.getattr(f).is_ok(), "f freed while A had it open");
    a.connection_closed(ConnId(5));
    assert_eq!(b.getattr(f).unwrap_err().code(), ErrorCode::NotFound);
    assert!(b.getattr(g).is_ok(), "g freed while B had it open");
    b.release(on_b, None).unwrap();
    assert_eq!(a.getattr(g).unwrap_err().code(), ErrorCode::NotFound);
    assert_eq!(a.check_namespace().unwrap(), Vec::<String>::new());
}

/// Renames `from` over `to` in the root through `ns`'s request path.
fn rename(ns: &Namespace, from: &[u8], to: &[u8]) -> Result<(), ErrorCode> {
    let r = ns.handle(
        fs::Rename {
            parent: ROOT,
            name: from.to_vec(),
            new_parent: ROOT,
            new_name: to.to_vec(),
            mode: RenameMode::Replace,
        },
        ConnId(1),
    );
    r.map(|_| ()).map_err(|e| e.code)
}

/// Guards against an answer that wrote nothing going unchecked: A's rename of x over y
/// read x, then B's same rename landed, then A read y and found x's inode there (two
/// names of one inode, as it seemed): "nothing to do", answered without a commit, so
/// with reads no order of the changes gives (x gone before, or there after).
#[test]
fn a_rename_that_writes_nothing_still_checks_what_it_read() {
    let (_h, hooked, a, b) = two();
    let x = touch(&a, ROOT, "x").ino;
    touch(&a, ROOT, "y");
    let b2 = b.clone();
    // The first read of x is the permission check's, before the change's transaction.
    when_read_again(&hooked, keys::dirent(ROOT, b"x"), 1, move || {
        rename(&b2, b"x", b"y").unwrap();
    });
    assert_eq!(rename(&a, b"x", b"y"), Err(ErrorCode::NotFound));
    // Found out by the check, not by a try that began after B's change.
    assert!(hooked.conflicts.load(Ordering::SeqCst) >= 1);
    assert_eq!(b.lookup(ROOT, b"y").unwrap().ino, x);
    assert_eq!(a.check_namespace().unwrap(), Vec::<String>::new());
}

/// Guards against a refusal made of reads that do not hold together: A's rename of
/// file x to the free name y read x, then B moved x away and made a directory y, then
/// A read y: "a file over a directory" (EISDIR), an answer no order gives (before B's
/// changes the rename succeeds, after them x is missing). The refusal's reads are
/// checked; A runs again and answers ENOENT.
#[test]
fn a_refusal_checks_what_it_read() {
    let (_h, hooked, a, b) = two();
    touch(&a, ROOT, "x");
    let b2 = b.clone();
    when_read_again(&hooked, keys::dirent(ROOT, b"x"), 1, move || {
        rename(&b2, b"x", b"z").unwrap();
        super::mkdir(&b2, ROOT, "y");
    });
    assert_eq!(rename(&a, b"x", b"y"), Err(ErrorCode::NotFound));
    assert!(hooked.conflicts.load(Ordering::SeqCst) >= 1);
    assert_eq!(a.check_namespace().unwrap(), Vec::<String>::new());
}

/// Guards against a refusal's checks passing the engine's limit on one transaction:
/// a directory moved into its own subtree, deep, reads a key a level (more than etcd
/// takes in one commit); the checks go in several, and the answer stays EINVAL.
#[test]
fn a_refusal_that_read_more_keys_than_one_commit_takes_is_still_checked() {
    let (_h, hooked, a, b) = two();
    let top = super::mkdir(&b, ROOT, "top").ino;
    let mut deep = top;
    for i in 0..12 {
        deep = super::mkdir(&b, deep, &format!("l{i}")).ino;
    }
    *hooked.max_checks.lock() = Some(8);
    let r = a.handle(
        fs::Rename {
            parent: ROOT,
            name: b"top".to_vec(),
            new_parent: deep,
            new_name: b"inside".to_vec(),
            mode: RenameMode::Replace,
        },
        ConnId(1),
    );
    assert_eq!(r.unwrap_err().code, ErrorCode::InvalidArgument);
}

/// Guards against the server a session was taken from ending it in its file's openers
/// after the take-back: A's connection broke, the client took its session back on B,
/// then A's grace for the broken connection ran out and A ended what it had of it; an
/// unlink through A must still find the file open (B holds the session in the key),
/// and A must not mark the file's tail for a cut.
#[test]
fn a_session_taken_back_on_the_other_server_keeps_its_file() {
    let (_h, _hooked, a, b) = two();
    let ino = touch(&a, ROOT, "f").ino;
    let session = a.open_inode(ino, false, owner(5)).unwrap().session;
    a.connection_broken(ConnId(5));
    let r = b
        .resume(
            ClientId(1),
            &[taken_back(session, ino)],
            ConnId(9),
            &caller(),
        )
        .unwrap();
    assert!(r.lost.is_empty(), "{:?}", r.lost);
    assert_eq!(a.expire_detached(a.now() + Duration::from_secs(3600)), 1);
    // A's end of it marks no tail either: the session (opened for writing) writes on.
    assert!(_hooked.inner.get(&keys::tail(ino)).unwrap().is_none());
    unlink(&a, b"f");
    assert!(
        b.getattr(ino).is_ok(),
        "freed under the session B took back"
    );
    b.release(session, None).unwrap();
    assert_eq!(a.getattr(ino).unwrap_err().code(), ErrorCode::NotFound);
    assert_eq!(a.check_namespace().unwrap(), Vec::<String>::new());
}

/// A session its server ended (the client's connection closed in order) is over
/// everywhere: taken back on another server it is lost, as on its own after a restart.
#[test]
fn a_session_ended_on_one_server_is_lost_on_the_other() {
    let (_h, _hooked, a, b) = two();
    let ino = touch(&a, ROOT, "f").ino;
    let session = a.open_inode(ino, false, owner(5)).unwrap().session;
    a.connection_closed(ConnId(5));
    let r = b
        .resume(
            ClientId(1),
            &[taken_back(session, ino)],
            ConnId(9),
            &caller(),
        )
        .unwrap();
    assert_eq!(r.lost, vec![session]);
    unlink(&a, b"f");
    assert_eq!(b.getattr(ino).unwrap_err().code(), ErrorCode::NotFound);
    assert_eq!(a.check_namespace().unwrap(), Vec::<String>::new());
}

/// What a client names when it takes `session` (of `ino`, read-only) back.
pub(super) fn taken_back(
    session: proto::SessionId,
    ino: proto::InodeId,
) -> proto::meta::fs::OpenSession {
    proto::meta::fs::OpenSession {
        session,
        ino,
        writes: false,
        grant: None,
    }
}

/// Takes `ns`'s live key out of the engine, as its lease running out does on etcd.
pub(super) fn lose_live_key(hooked: &Hooked, ns: &Namespace) {
    let mut b = WriteBatch::new();
    b.delete(keys::server(ns.server_id().unwrap()));
    hooked.inner.commit(b).unwrap();
}

/// The session grace of the default configuration.
pub(super) fn grace() -> Duration {
    Duration::from_millis(NamespaceConfig::default().session_grace_ms)
}
