//! Early replies (`namespace::early`): changes answered before the log holds them land
//! again, with the same inode numbers, when their client sends them again to a server
//! that started after a crash lost them; nothing else is served before.

use super::once::create;
use super::{caller, code, engine_tests, touch, H, ROOT};
use crate::clock::SystemClock;
use crate::kv::{KvError, KvPair, KvStore, StoreKind, WriteBatch};
use crate::namespace::{ConnId, Knock, Namespace, Origin};
use parking_lot::{Condvar, Mutex};
use proto::meta::fs::{Commit, Create, Mkdir, SetAttr, Unlink};
use proto::meta::{Caller, OpId};
use proto::{ClientId, ErrorCode, InodeId, Timestamp};
use std::sync::Arc;
use std::time::Duration;

const C: ClientId = ClientId(1);
const OTHER: ClientId = ClientId(2);

/// A store whose log can be held (its writes wait) and then lost (they fail), as a
/// server killed while its group commit waits for the disk.
struct Stalling {
    inner: Arc<dyn KvStore>,
    /// (held, lost)
    state: Mutex<(bool, bool)>,
    moved: Condvar,
}

impl Stalling {
    fn new(inner: Arc<dyn KvStore>) -> Arc<Stalling> {
        Arc::new(Stalling {
            inner,
            state: Mutex::new((false, false)),
            moved: Condvar::new(),
        })
    }

    fn hold(&self) {
        self.state.lock().0 = true;
    }

    fn release(&self) {
        self.state.lock().0 = false;
        self.moved.notify_all();
    }

    fn lose(&self) {
        self.state.lock().1 = true;
        self.moved.notify_all();
    }
}

impl KvStore for Stalling {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        self.inner.get(key)
    }
    fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<KvPair>, KvError> {
        self.inner.scan(start, end, limit)
    }
    fn commit(&self, batch: WriteBatch) -> Result<(), KvError> {
        self.log_group(&[batch]).map(drop)
    }
    fn log_group(&self, batches: &[WriteBatch]) -> Result<bool, KvError> {
        let mut st = self.state.lock();
        // Bounded: a test that fails while the log is held ends (its store fails)
        // instead of waiting for ever in the namespace's drop.
        let until = std::time::Instant::now() + Duration::from_secs(20);
        while st.0 && !st.1 {
            if self.moved.wait_until(&mut st, until).timed_out() {
                st.1 = true;
            }
        }
        if st.1 {
            return Err(KvError::Engine {
                engine: "test",
                message: "killed".into(),
            });
        }
        drop(st);
        self.inner.log_group(batches)
    }
    fn apply_logged(&self, batch: &WriteBatch) -> Result<(), KvError> {
        self.inner.apply_logged(batch)
    }
    fn engine(&self) -> &'static str {
        self.inner.engine()
    }
}

/// Change `seq` of `client`, which takes early replies, on connection `conn`.
fn early(client: ClientId, seq: u64) -> Origin {
    Origin {
        conn: ConnId(u64::from(client.0 as u32)),
        caller: Caller::ROOT,
        who: None,
        op: Some(OpId {
            early: true,
            ..OpId::new(client, seq)
        }),
    }
}

/// The same change sent again to a restarted server, naming the inode it made.
fn again(client: ClientId, seq: u64, made: Option<InodeId>) -> Origin {
    let mut at = early(client, seq);
    if let Some(op) = &mut at.op {
        op.retry = true;
        op.made = made;
    }
    at
}

fn mkdir(name: &str) -> Mkdir {
    Mkdir {
        parent: ROOT,
        name: name.into(),
        perm: 0o755,
    }
}

fn unlink(name: &str) -> Unlink {
    Unlink {
        parent: ROOT,
        name: name.into(),
    }
}

/// A place for a store of `kind` with the default configuration, nothing opened yet.
fn unstarted(kind: StoreKind) -> H {
    H::unstarted(
        kind,
        crate::config::NamespaceConfig::default(),
        Arc::new(SystemClock),
    )
}

/// Opens a namespace on `h`'s store behind a [`Stalling`] log, with data servers.
fn open_stalling(h: &H) -> (Namespace, Arc<Stalling>) {
    let store = Stalling::new(h.open_store());
    let ns = Namespace::open_with_clock(
        store.clone() as Arc<dyn KvStore>,
        h.config.clone(),
        Arc::new(SystemClock),
    )
    .unwrap();
    with_nodes(&ns);
    // Direct calls leave their changes staged (requests wait for theirs).
    ns.sync().unwrap();
    (ns, store)
}

fn with_nodes(ns: &Namespace) {
    for i in 0..3 {
        ns.register_data(None, &format!("10.0.0.{i}:7000"), 1000, 10)
            .unwrap();
    }
}

/// Whether `admit_early` lets `knock` through within a moment.
fn admitted(ns: &Namespace, knock: Knock) -> bool {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_millis(100), ns.admit_early(knock))
            .await
            .is_ok()
    })
}

/// Guards against changes answered early being lost by a crash while their client
/// lives: a create, a mkdir and an unlink answered while the log was held, lost with
/// the server, are sent again to the next one, which serves nobody else meanwhile,
/// and land with the inode numbers the first replies gave.
fn changes_answered_early_land_again_after_a_crash(kind: StoreKind) {
    let mut h = unstarted(kind);
    let (ns, log) = open_stalling(&h);
    // The first change marks the client (durable before any early reply).
    let (first, _) = ns.handle_answered(mkdir("kept"), early(C, 1), true);
    first.unwrap();
    let old = touch(&ns, ROOT, "old");
    ns.sync().unwrap();

    log.hold();
    let (a, answered_a) = ns.handle_answered(create("a"), early(C, 2), true);
    let a = a.unwrap();
    assert!(
        answered_a.pending.is_some(),
        "answered early: {answered_a:?}"
    );
    assert_eq!(answered_a.made, Some(a.attr.ino));
    let (d, answered_d) = ns.handle_answered(mkdir("d"), early(C, 3), true);
    let d = d.unwrap();
    assert!(answered_d.pending.is_some());
    let (gone, answered_u) = ns.handle_answered(unlink("old"), early(C, 4), true);
    gone.unwrap();
    assert!(answered_u.pending.is_some());
    // Seen by everyone while staged.
    assert_eq!(ns.lookup(ROOT, b"a").unwrap().ino, a.attr.ino);

    // The server dies with them: its log never held them.
    log.lose();
    drop(ns);
    drop(log);
    h.restart();
    let ns = h.ns();
    with_nodes(ns);
    assert_eq!(code(ns.lookup(ROOT, b"a")), ErrorCode::NotFound);
    assert_eq!(ns.lookup(ROOT, b"old").unwrap().ino, old.ino);
    // Nobody but the client that kept them is served until it settled.
    assert!(!admitted(ns, Knock::Other));
    assert!(admitted(ns, Knock::Replay(C)));
    assert!(admitted(ns, Knock::Free));

    let (a2, _) = ns.handle_answered(create("a"), again(C, 2, Some(a.attr.ino)), true);
    assert_eq!(
        a2.unwrap().attr.ino,
        a.attr.ino,
        "the create made its number again"
    );
    let (d2, _) = ns.handle_answered(mkdir("d"), again(C, 3, Some(d.attr.ino)), true);
    assert_eq!(d2.unwrap().attr.ino, d.attr.ino);
    let (u2, _) = ns.handle_answered(unlink("old"), again(C, 4, None), true);
    u2.unwrap();
    ns.settle(C, ConnId(1), None).unwrap();
    assert!(admitted(ns, Knock::Other));

    assert_eq!(ns.lookup(ROOT, b"a").unwrap().ino, a.attr.ino);
    assert_eq!(ns.lookup(ROOT, b"d").unwrap().ino, d.attr.ino);
    assert_eq!(code(ns.lookup(ROOT, b"old")), ErrorCode::NotFound);
    // A new file gets a number past those kept for the changes sent again.
    let new = touch(ns, ROOT, "new");
    assert!(
        new.ino.0 >= a.attr.ino.0 + crate::namespace::early::REPLAY_GAP,
        "{new:?} after {:?}",
        a.attr.ino
    );
    // And a change sent again that the log did hold is answered from its record.
    let (k, _) = ns.handle_answered(mkdir("kept"), again(C, 1, None), true);
    k.unwrap();
}

/// Guards against a second crash, before the changes sent again were durable, giving
/// them other inode numbers: the numbers kept at the first restart stay kept (in the
/// client's mark) until the client settles.
fn numbers_kept_for_a_client_survive_a_second_crash(kind: StoreKind) {
    let h = unstarted(kind);
    let (ns, log) = open_stalling(&h);
    ns.handle_answered(mkdir("m"), early(C, 1), true).0.unwrap();
    ns.sync().unwrap();
    log.hold();
    let (d, answered) = ns.handle_answered(mkdir("d"), early(C, 2), true);
    let d = d.unwrap();
    assert!(answered.pending.is_some());
    log.lose();
    drop(ns);
    drop(log);
    // The second start: the change sent again, then a crash before its log write.
    let (ns, log) = open_stalling(&h);
    log.hold();
    let (d2, _) = ns.handle_answered(mkdir("d"), again(C, 2, Some(d.attr.ino)), true);
    assert_eq!(d2.unwrap().attr.ino, d.attr.ino);
    log.lose();
    drop(ns);
    drop(log);
    // The third start still keeps the first one's numbers.
    let (ns, _log) = open_stalling(&h);
    assert_eq!(code(ns.lookup(ROOT, b"d")), ErrorCode::NotFound);
    let (d3, _) = ns.handle_answered(mkdir("d"), again(C, 2, Some(d.attr.ino)), true);
    assert_eq!(
        d3.unwrap().attr.ino,
        d.attr.ino,
        "the number came back after two crashes"
    );
    ns.settle(C, ConnId(1), None).unwrap();
    assert_eq!(ns.lookup(ROOT, b"d").unwrap().ino, d.attr.ino);
}

/// Guards against a change answered early after another client's change that the log
/// does not hold yet (a crash would lose both, and the other client, answered later,
/// could not send its change again in the right order): such a reply waits for the log.
fn a_change_after_another_clients_waits_for_the_log(kind: StoreKind) {
    let h = unstarted(kind);
    let (ns, log) = open_stalling(&h);
    let ns = Arc::new(ns);
    ns.handle_answered(mkdir("c"), early(C, 1), true).0.unwrap();
    ns.handle_answered(mkdir("o"), early(OTHER, 1), true)
        .0
        .unwrap();
    ns.sync().unwrap();

    log.hold();
    let (_, mine) = ns.handle_answered(mkdir("c1"), early(C, 2), true);
    assert!(mine.pending.is_some(), "{mine:?}");
    let ns2 = ns.clone();
    let other = std::thread::spawn(move || ns2.handle_answered(mkdir("o1"), early(OTHER, 2), true));
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !other.is_finished(),
        "the other client's reply waits for the log"
    );
    log.release();
    let (r, theirs) = other.join().unwrap();
    r.unwrap();
    assert_eq!(theirs.pending, None);
    assert!(ns.lookup(ROOT, b"o1").is_ok() && ns.lookup(ROOT, b"c1").is_ok());
}

/// A namespace with `replay_grace_ms` of `grace_ms` where client `C` made a mkdir
/// ("x", its change 1) answered early, restarted as after a crash (its mark stays).
fn marked_then_restarted(kind: StoreKind, grace_ms: u64) -> H {
    let config = crate::config::NamespaceConfig {
        replay_grace_ms: grace_ms,
        ..Default::default()
    };
    let mut h = H::with_config(kind, config);
    h.ns()
        .handle_answered(mkdir("x"), early(C, 1), true)
        .0
        .unwrap();
    h.restart();
    h
}

/// Guards against a start waiting forever for a client that ended with the server: its
/// grace ends, its mark goes, and the next start serves at once.
fn a_client_that_does_not_come_back_is_waited_for_only_its_grace(kind: StoreKind) {
    let mut h = marked_then_restarted(kind, 1_000);
    assert!(!admitted(h.ns(), Knock::Other));
    std::thread::sleep(Duration::from_millis(1_100));
    assert!(admitted(h.ns(), Knock::Other));
    h.restart();
    assert!(admitted(h.ns(), Knock::Other), "no mark left");
}

/// Guards against a client that comes back after the restarted server stopped waiting
/// for it undoing what others did since: a change it sends again that the log did not
/// hold is refused, one the log held is answered from its record, until it settled.
fn a_client_back_after_its_grace_has_its_lost_changes_refused(kind: StoreKind) {
    let h = marked_then_restarted(kind, 300);
    std::thread::sleep(Duration::from_millis(400));
    assert!(admitted(h.ns(), Knock::Other));
    // Back after its grace: a change it sends again that the log did not hold is
    // refused (others may have changed the namespace since), until it settled.
    let (late, _) = h
        .ns()
        .handle_answered(mkdir("late"), again(C, 5, None), true);
    assert_eq!(late.map(drop).unwrap_err().code, ErrorCode::Stale);
    assert_eq!(code(h.ns().lookup(ROOT, b"late")), ErrorCode::NotFound);
    let (kept, _) = h.ns().handle_answered(mkdir("x"), again(C, 1, None), true);
    kept.expect("one the log held is answered from its record");
    h.ns().settle(C, ConnId(1), None).unwrap();
    let op = again(C, 6, None).op.unwrap();
    assert!(h.ns().sent_too_late(op).is_ok(), "it settled");
}

/// Guards against early replies given to a client that did not ask for them (it does
/// not keep its changes), or by a server configured without them.
fn only_a_client_that_keeps_its_changes_is_answered_early(kind: StoreKind) {
    // The client is marked by a server with early replies, which then restarts
    // without them.
    let mut h = unstarted(kind);
    let (ns, log) = open_stalling(&h);
    ns.handle_answered(mkdir("first"), early(C, 1), true)
        .0
        .unwrap();
    drop(ns);
    drop(log);
    h.config.early_replies = false;
    let (ns, log) = open_stalling(&h);
    log.hold();
    let ns = Arc::new(ns);
    let ns2 = ns.clone();
    let t = std::thread::spawn(move || ns2.handle_answered(mkdir("a"), early(C, 2), true));
    std::thread::sleep(Duration::from_millis(150));
    assert!(
        !t.is_finished(),
        "early replies are off: the reply waits for the log"
    );
    log.release();
    assert_eq!(t.join().unwrap().1.pending, None);

    let h = unstarted(kind);
    let (ns, log) = open_stalling(&h);
    // Marked (with the log free), so that only the request's own flag decides.
    ns.handle_answered(mkdir("first"), early(C, 1), true)
        .0
        .unwrap();
    ns.sync().unwrap();
    let mut plain = early(C, 2);
    if let Some(op) = &mut plain.op {
        op.early = false;
    }
    log.hold();
    let ns = Arc::new(ns);
    let ns2 = ns.clone();
    let t = std::thread::spawn(move || ns2.handle_answered(mkdir("a"), plain, true));
    std::thread::sleep(Duration::from_millis(150));
    assert!(
        !t.is_finished(),
        "the client keeps nothing: the reply waits for the log"
    );
    log.release();
    assert_eq!(t.join().unwrap().1.pending, None);
}

fn commit(ino: InodeId, size: u64) -> Commit {
    Commit {
        ino,
        commit: proto::meta::Commit::length(size, Timestamp { secs: 7, nanos: 0 }),
    }
}

/// Guards against a written file's length, committed at its close, and an attribute
/// change (`tar x`'s `utime` and `chmod` with the commit of what it wrote), answered
/// before the log held them, being lost by a crash while their writer lives: sent
/// again they land (before the writer's sessions are resumed); a commit that only an
/// open session allowed (the file's mode does not) and a truncation wait for the log.
fn commits_and_attribute_changes_answered_early_land_again(kind: StoreKind) {
    let mut h = unstarted(kind);
    let (ns, log) = open_stalling(&h);
    let (f, _) = ns.handle_answered(create("f"), early(C, 1), true);
    let f = f.unwrap().attr.ino;
    let g = touch(&ns, ROOT, "g").ino;
    // A file its maker may write only through its open (`open(O_CREAT, 0444)`).
    let mut user = early(C, 2);
    user.caller = Caller::new(1000, 100);
    let dir = ns
        .mkdir(ROOT, b"pub", 0o777, Caller::ROOT)
        .unwrap()
        .attr
        .ino;
    let made = Create {
        parent: dir,
        perm: 0o444,
        ..create("ro")
    };
    let ro = ns.handle_answered(made, user.clone(), true).0.unwrap();
    ns.sync().unwrap();

    log.hold();
    let (a, answered) = ns.handle_answered(commit(f, 4096), early(C, 3), true);
    assert_eq!(a.unwrap().size, 4096);
    assert!(answered.pending.is_some(), "answered early: {answered:?}");
    // By `g`'s owner, not root: the mode alone allows it, on any connection.
    let mut owner = early(C, 5);
    owner.caller = caller();
    let (s, answered) = ns.handle_answered(utime_chmod(g), owner, true);
    assert_eq!(s.unwrap().perm & 0o7777, 0o600);
    assert!(answered.pending.is_some(), "answered early: {answered:?}");
    let ns = Arc::new(ns);
    let waiting = |set: proto::SetAttr, seq: u64| {
        let ns = ns.clone();
        let req = SetAttr {
            ino: g,
            set,
            commit: None,
        };
        std::thread::spawn(move || ns.handle_answered(req, early(C, seq), true))
    };
    let cut = proto::SetAttr {
        size: Some(0),
        ..Default::default()
    };
    let truncation = waiting(cut, 6);
    let touch_now = proto::SetAttr {
        mtime: Some(proto::TimeSet::Now),
        ..Default::default()
    };
    let now = waiting(touch_now, 7);
    let ns2 = ns.clone();
    let mut at = user;
    at.op = early(C, 4).op;
    let by_open =
        std::thread::spawn(move || ns2.handle_answered(commit(ro.attr.ino, 10), at, true));
    std::thread::sleep(Duration::from_millis(150));
    assert!(
        !by_open.is_finished(),
        "a commit the mode alone does not allow waits for the log"
    );
    assert!(!truncation.is_finished(), "a truncation waits for the log");
    assert!(!now.is_finished(), "a time set to now waits for the log");
    log.lose();
    let _ = by_open.join().unwrap();
    let _ = truncation.join().unwrap();
    let _ = now.join().unwrap();
    drop(ns);
    drop(log);

    h.restart();
    let ns = h.ns();
    with_nodes(ns);
    assert_eq!(ns.getattr(f).unwrap().size, 0, "the crash lost the commit");
    assert_eq!(ns.getattr(g).unwrap().perm & 0o7777, 0o644);
    let (a2, _) = ns.handle_answered(commit(f, 4096), again(C, 3, None), true);
    assert_eq!(a2.unwrap().size, 4096);
    // Sent again on another connection, before any session is resumed.
    let mut owner = again(C, 5, None);
    owner.caller = caller();
    owner.conn = ConnId(99);
    let (s2, _) = ns.handle_answered(utime_chmod(g), owner, true);
    s2.unwrap();
    ns.settle(C, ConnId(1), None).unwrap();
    assert_eq!(ns.getattr(f).unwrap().size, 4096);
    assert_eq!(ns.getattr(f).unwrap().mtime.secs, 7);
    let g = ns.getattr(g).unwrap();
    assert_eq!((g.size, g.mtime.secs, g.perm & 0o7777), (3, 9, 0o600));
}

/// Guards against a data server deleting a file's chunks before the log holds the
/// file's removal (staged changes are visible at once): a crash then would bring the
/// file back without its bytes. A heartbeat hands out the deletion only once durable.
fn chunks_are_deleted_only_once_their_removal_is_durable(kind: StoreKind) {
    let h = unstarted(kind);
    let (ns, log) = open_stalling(&h);
    let f = touch(&ns, ROOT, "f");
    let written = proto::meta::Commit::length(4096, Timestamp { secs: 1, nanos: 0 });
    ns.commit(f.ino, written).unwrap();
    ns.sync().unwrap();
    let node = ns.cluster_map().unwrap().nodes[0].node;
    let ns = Arc::new(ns);
    let beat = || {
        let ns = ns.clone();
        std::thread::spawn(move || ns.heartbeat(node, 1000, 10, &[], 0, Default::default()))
    };
    let finishes = |t: &std::thread::JoinHandle<_>| {
        let until = std::time::Instant::now() + Duration::from_millis(300);
        while !t.is_finished() && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        t.is_finished()
    };
    log.hold();
    // With nothing to delete a beat waits for no log write (else this test could not
    // tell the wait below from the beat's own).
    let first = beat();
    let quiet = finishes(&first);
    if !quiet {
        log.release();
    }
    assert!(
        quiet,
        "a heartbeat with nothing to hand out waits for nothing"
    );
    assert!(first.join().unwrap().unwrap().0.is_empty());
    ns.unlink(ROOT, b"f").unwrap();
    let second = beat();
    let waited = !finishes(&second);
    log.release();
    assert!(
        waited,
        "the removal is not durable yet: no deletion handed out"
    );
    let (tasks, _) = second.join().unwrap().unwrap();
    assert!(
        tasks.contains(&proto::meta::GcTask::DeleteFile(f.ino)),
        "{tasks:?}"
    );
}

/// `tar x`'s attribute change of a file it wrote (3 bytes): the length committed with
/// the time and mode set.
fn utime_chmod(ino: InodeId) -> SetAttr {
    SetAttr {
        ino,
        set: proto::SetAttr {
            perm: Some(0o600),
            mtime: Some(proto::TimeSet::At(Timestamp { secs: 9, nanos: 0 })),
            ..Default::default()
        },
        commit: Some(proto::meta::Commit::length(
            3,
            Timestamp { secs: 8, nanos: 0 },
        )),
    }
}

engine_tests!(
    chunks_are_deleted_only_once_their_removal_is_durable,
    commits_and_attribute_changes_answered_early_land_again,
    changes_answered_early_land_again_after_a_crash,
    numbers_kept_for_a_client_survive_a_second_crash,
    a_change_after_another_clients_waits_for_the_log,
    a_client_that_does_not_come_back_is_waited_for_only_its_grace,
    a_client_back_after_its_grace_has_its_lost_changes_refused,
    only_a_client_that_keeps_its_changes_is_answered_early,
);
