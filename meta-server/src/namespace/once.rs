//! Changes applied once however often they arrive (issue 24: request ids).
//!
//! A client whose metadata server died, or stopped answering, under a change cannot
//! tell whether the change was applied. Sending it again is safe only for a change that
//! is idempotent; any other (a create, a rename, an append) would be applied twice, or
//! answered as if it had failed (`EEXIST` for the file the first try made). So every
//! change that is not idempotent carries an id ([`OpId`]: the client's id and its count
//! of changes), as does a length commit or attribute change of a client that takes
//! early replies (see `early`; a retry after a timeout then cannot land after a later
//! change), and the server keeps, in the engine, what it did with it:
//!
//! - the change's first transaction also writes the id's record, "applied" (the
//!   `MARK` that [`take_mark`] hands to `Txn::commit`): the change and its mark land
//!   together or not at all;
//! - once the handler has its reply, the record is written again with the reply, in the
//!   next batch of the same request (waited for before the reply is sent). A change
//!   whose reply is known before its one transaction commits puts it in the mark
//!   already ([`answer_with_mark`]) and writes no second record: its answer lands with
//!   it, and on a shared engine its reply waits for one commit, not two. Every change
//!   of a file or directory does so.
//!
//! A change sent again (`retry`) first waits for a try of the same id still running on
//! this server, then reads the record: the reply recorded is answered again
//! ([`Handle::replayed`] moves an open's session to the new connection); a record
//! "applied" with no reply (the server died between the two batches) is a clear error,
//! never a second application; no record means the change never landed, and it runs.
//!
//! Records live in [`OP_SLOTS`] slots per client, the id's count modulo the slots, so a
//! client costs at most that many keys. A client starts change n only once change
//! n - [`OP_SLOTS`] has ended (`fs-client`'s `client/ops.rs`), and this server runs one
//! change per slot of a client at a time and refuses a first try that far behind the
//! client's latest, so a slot holding an earlier count than the one asked about means
//! the change never landed, and a later one cannot tell, and says so.
//! A record says when it was written; records older than [`OP_RECORD_TTL`] (more than
//! any client waits to send a change again) are deleted by a periodic purge
//! ([`Namespace::purge_op_records`]). Whether a client has ended cannot be told from
//! its connection (a client gives up a connection that timed out, and on rdma that
//! looks like an orderly close).

use super::keys;
use super::records::{decode, encode};
use super::{Handle, Namespace, Origin};
use crate::error::MetaError;
use crate::kv::{KvError, ReadCheck, TxnStore, WriteBatch};
use parking_lot::{Condvar, Mutex};
use proto::meta::OpId;
pub use proto::meta::OP_SLOTS;
use proto::ClientId;
use serde::{Deserialize, Serialize};
use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// How long a change's record is kept: longer than a client waits for its metadata
/// server before it gives a change up (`meta_wait_ms`, at most an hour).
pub const OP_RECORD_TTL: Duration = Duration::from_secs(2 * 3600);
/// Records looked at per page of the purge.
const PURGE_PAGE: usize = 64;
/// Records deleted per batch of the purge (within an etcd transaction's operations).
const PURGE_BATCH: usize = 64;

/// How long a retry waits for a try of the same change still running on this server.
const OP_WAIT: Duration = Duration::from_secs(30);
/// How long a try waits for another server's answer to a change that server applied
/// and whose mark carried no answer (it records it right after the change, a round
/// trip later; every change of a file or directory carries it): well within a client's
/// call timeout (30 s by default), so that the client hears a clear error, not a
/// timeout, when that server died between the two.
const ELSEWHERE_WAIT: Duration = Duration::from_secs(10);

/// What the engine keeps of one change.
#[derive(Debug, Serialize, Deserialize)]
struct OpRecord {
    /// The change's count (the slot is the count modulo [`OP_SLOTS`]).
    seq: u64,
    /// When it was written, in seconds since the epoch (for the purge).
    at: u64,
    /// Its reply, encoded; `None` while only its application is recorded.
    reply: Option<Vec<u8>>,
}

/// Seconds since the epoch, by the server's clock (`namespace::now`).
fn epoch_secs() -> u64 {
    u64::try_from(super::now().secs).unwrap_or(0)
}

/// The "applied" record of a running change, which its first transaction writes.
pub(super) struct Mark {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    /// On a shared engine, the slot as this server read it before the change ran: the
    /// transaction holds only if no other server's try of a change in the slot landed
    /// since (the retry of a change, sent to another server while its first try was
    /// still running, would otherwise apply it twice).
    pub check: Option<ReadCheck>,
    /// `value` holds the change's reply ([`answer_with_mark`]).
    pub answered: bool,
}

thread_local! {
    /// The record that the running change's first transaction writes (see the module
    /// docs); taken by `Txn::commit`.
    static MARK: RefCell<Option<Mark>> = const { RefCell::new(None) };
    /// The running change's mark was written with its reply in it ([`mark_written`]).
    static ANSWER_WRITTEN: Cell<bool> = const { Cell::new(false) };
}

/// Says that `mark` was committed (durable on a shared engine, staged otherwise: the
/// request waits for it before its reply): if it carries the reply, the change records
/// no answer of its own after it (`Namespace::once`).
pub(super) fn mark_written(mark: &Mark) {
    ANSWER_WRITTEN.with(|w| w.set(mark.answered));
}

/// The "applied" record of the change running on this thread, once: its first
/// non-empty transaction writes it.
pub(super) fn take_mark() -> Option<Mark> {
    MARK.with(|m| m.borrow_mut().take())
}

/// Whether `key` is a change record's.
pub(super) fn is_record(key: &[u8]) -> bool {
    key.starts_with(&keys::op_record_prefix())
}

/// Puts back the mark a transaction took and did not commit (a conflict on a shared
/// engine): the change runs again, and its first transaction must carry it.
pub(super) fn restore_mark(mark: Mark) {
    MARK.with(|m| {
        m.borrow_mut().get_or_insert(mark);
    });
}

/// Whether a change's mark is waiting for its first transaction (see [`take_mark`]).
pub(super) fn marked() -> bool {
    MARK.with(|m| m.borrow().is_some())
}

/// Records `reply` in the running change's mark, for a change whose answer is known
/// before its one transaction commits (`Namespace::mutate_answering`): the change and
/// its answer then land together, and a retry that reaches another server after this
/// one died between the change and its answer's own record is answered from the mark
/// instead of failing (`AnswerLost`). `reply` must be of the request's own reply type:
/// a retry decodes it as that.
pub(super) fn answer_with_mark<T: Serialize>(reply: &T) -> Result<(), MetaError> {
    MARK.with(|m| {
        let mut m = m.borrow_mut();
        let Some(mark) = m.as_mut() else {
            return Ok(());
        };
        let mut record: OpRecord = decode(&mark.value, "change record")?;
        record.reply = Some(encode(reply)?);
        mark.value = encode(&record)?;
        mark.answered = true;
        Ok(())
    })
}

/// Where a checked commit that carried the change's mark stands when etcd did not
/// answer it ("may have been applied"), from its slot as read afterwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Landed {
    /// The slot holds this try's mark: the commit landed whole.
    Yes,
    /// The slot is as this change read it before it ran: the commit did not land, and
    /// cannot land later over a try that reruns it (which checks the same slot).
    No,
    /// Another server's try of a change in the slot wrote it since.
    Elsewhere,
}

/// [`Landed`] of a commit that carried `mark`, whose slot now reads `now`. A pure
/// function. `None` when the mark checked no slot (off a shared engine).
///
/// The mark's bytes are the change's count and the second it ran: another server's try
/// of the same change in the same second writes the same bytes, and is taken for this
/// one (the change landed once either way; the reply this one sends may differ, on a
/// connection the client gave up for that other try).
pub(super) fn landed(mark: &Mark, now: Option<&crate::kv::Versioned>) -> Option<Landed> {
    let before = mark.check.as_ref()?.revision;
    Some(match now {
        Some(v) if v.value == mark.value => Landed::Yes,
        Some(v) if Some(v.revision) != before => Landed::Elsewhere,
        // As before, or gone: a purge deletes only records hours old (checked against
        // its own read), never the mark this try would have written.
        _ => Landed::No,
    })
}

/// Reads of the slot, and fences of it, that settling one unanswered commit makes at
/// most: each fence that conflicts (the slot moved since it was read) reads it again.
const SETTLE_ROUNDS: usize = 3;

/// Settles a commit that carried `mark` and that etcd did not answer: reads the slot
/// back ([`landed`]), and when the commit has not landed, fences it out for good
/// before the change may run again. A proposal still under way in etcd may land after
/// the read; the fence rewrites the slot as it is (an earlier change's record, or a
/// record of no change where it was empty), checked against the revision the unanswered
/// try checks, so that try, landing later, fails its check. The next try's mark then
/// checks the slot's new revision. `None` when the mark checked no slot; an error when
/// the engine fails to answer the read or the fence (the change's outcome is unknown).
pub(super) fn settle_marked(
    engine: &dyn TxnStore,
    mark: &mut Mark,
) -> Result<Option<Landed>, KvError> {
    for _ in 0..SETTLE_ROUNDS {
        let now = engine.get_versioned(&mark.key)?;
        let Some(check) = mark.check.clone() else {
            return Ok(None);
        };
        match landed(mark, now.as_ref()) {
            Some(Landed::No) => {}
            other => return Ok(other),
        }
        let same = match &now {
            Some(v) => v.value.clone(),
            None => encode(&OpRecord {
                seq: 0,
                at: epoch_secs(),
                reply: None,
            })
            .map_err(|e| KvError::Engine {
                engine: engine.engine(),
                message: e.to_string(),
            })?,
        };
        let mut batch = WriteBatch::new();
        batch.put(mark.key.clone(), same);
        match engine.commit_if(&[check], batch) {
            Ok(()) => {
                let fenced = engine.get_versioned(&mark.key)?;
                mark.check = Some(ReadCheck::of(mark.key.clone(), &fenced));
                return Ok(Some(Landed::No));
            }
            // The slot moved since it was read: the try landed, or another did.
            Err(KvError::Conflict { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Err(KvError::Unavailable {
        engine: engine.engine(),
        message: format!("the change's slot kept moving over {SETTLE_ROUNDS} reads"),
    })
}

/// Clears the mark when the change ends, however it ends.
struct Marked;

impl Drop for Marked {
    fn drop(&mut self) {
        MARK.with(|m| m.borrow_mut().take());
    }
}

/// The ids of the changes running on this server.
#[derive(Default)]
pub(super) struct Ops {
    running: Mutex<Running>,
    done: Condvar,
    /// Held (shared) by every change from its mark to its answer's record, and
    /// (exclusively) by the purge while it deletes a page: it never deletes a record
    /// written after it read it.
    purging: parking_lot::RwLock<()>,
}

/// Clients whose highest count [`Running::highest`] keeps; past it the map starts over
/// (only a try older than its client's last [`OP_SLOTS`] changes is then not refused).
const CLIENTS_KEPT: usize = 65_536;

/// Ids of changes that arrived here lately: whether a try of a change arrived before
/// this one (its first try may arrive after the retry it caused: a slow server's queue).
const RECENT_IDS: usize = 65_536;

/// The changes running on this server, and those that arrived lately.
#[derive(Default)]
struct Running {
    /// The slots (client, count modulo [`OP_SLOTS`]) of the changes running: one at a
    /// time per slot.
    now: HashSet<(ClientId, u64)>,
    recent: HashSet<(ClientId, u64)>,
    /// `recent` in arrival order, to forget the oldest.
    order: std::collections::VecDeque<(ClientId, u64)>,
    /// The highest count of each client that arrived here: a first try this far
    /// behind it would share its slot with a later change (a client keeps its changes
    /// in flight within [`OP_SLOTS`] counts, so only a try it gave up on, still queued
    /// on a slow server, can), and is refused rather than overwrite that record.
    highest: std::collections::HashMap<ClientId, u64>,
}

/// A change's place in [`Ops::running`], left when dropped.
struct Entered<'a> {
    ops: &'a Ops,
    /// Its slot in [`Running::now`].
    slot: (ClientId, u64),
    /// Another try of the same change arrived before: look for its record.
    again: bool,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        self.ops.running.lock().now.remove(&self.slot);
        self.ops.done.notify_all();
    }
}

impl Ops {
    /// Enters change `op`, first waiting (at most [`OP_WAIT`]) while a try of it runs.
    fn enter(&self, op: OpId) -> Result<Entered<'_>, MetaError> {
        let id = (op.client, op.seq);
        let slot = (op.client, op.seq % OP_SLOTS);
        let deadline = Instant::now() + OP_WAIT;
        let mut running = self.running.lock();
        // The same change, or another of the same client in the same slot (one the
        // client gave up on while it still ran here): its record would be overwritten.
        if running.now.contains(&slot) {
            drop(running);
            running = super::early::blocking(|| {
                let mut running = self.running.lock();
                while running.now.contains(&slot) {
                    if self.done.wait_until(&mut running, deadline).timed_out() {
                        return Err(MetaError::InFlight(format!(
                            "change {} of {} is still running on this server",
                            op.seq, op.client
                        )));
                    }
                }
                Ok(running)
            })?;
        }
        let highest = running.highest.get(&op.client).copied().unwrap_or(0);
        if !op.retry && op.seq.saturating_add(OP_SLOTS) <= highest {
            return Err(MetaError::Stale(format!(
                "change {} of {} arrived after change {highest} of the same client: \
                 too late to apply",
                op.seq, op.client
            )));
        }
        if running.highest.len() >= CLIENTS_KEPT && !running.highest.contains_key(&op.client) {
            running.highest.clear();
        }
        running.highest.insert(op.client, highest.max(op.seq));
        running.now.insert(slot);
        let again = !running.recent.insert(id);
        if !again {
            running.order.push_back(id);
            if running.order.len() > RECENT_IDS {
                if let Some(old) = running.order.pop_front() {
                    running.recent.remove(&old);
                }
            }
        }
        Ok(Entered {
            ops: self,
            slot,
            again,
        })
    }
}

/// The recorded `reply` of change `op`, answered to `req` from `at`: a retry's open
/// moves to its connection ([`Handle::replayed`]); a first try that arrived after its
/// retry moves nothing (its connection was given up, and the open is the retry's).
fn answer_again<R: Handle>(
    ns: &Namespace,
    op: OpId,
    req: R,
    reply: R::Reply,
    at: &Origin,
) -> Result<R::Reply, MetaError> {
    match op.retry {
        true => req.replayed(reply, ns, at),
        false => Ok(reply),
    }
}

/// The key of the slot of `op`.
fn slot_key(op: OpId) -> Vec<u8> {
    keys::op_record(op.client, op.seq % OP_SLOTS)
}

impl Namespace {
    /// Runs change `op` (`run`) once: see the module docs.
    pub(super) fn once<R: Handle>(
        &self,
        op: OpId,
        at: &Origin,
        req: R,
        run: impl FnOnce(R) -> Result<R::Reply, MetaError>,
    ) -> Result<R::Reply, MetaError> {
        if op.seq == 0 {
            return Err(MetaError::InvalidArgument(
                "a change's count starts at 1".into(),
            ));
        }
        self.may_name_client(op.client, at.who.as_deref())?;
        let entered = self.ops.enter(op)?;
        // The purge holds it across its log waits: on an async worker (`early`), a
        // change waiting for it lets the worker's other tasks go on.
        let _unpurged = super::early::read_lock(&self.ops.purging);
        let key = slot_key(op);
        // On a shared engine the slot is read first, with its revision, whatever the
        // try: another server may have applied this change already (its retry, or its
        // first try), which this server's memory cannot tell; the change's commit then
        // holds only if the slot is still as read here.
        let slot = match &self.checked {
            Some(engine) => Some(engine.get_versioned(&key)?),
            None => None,
        };
        let look = op.retry || entered.again || slot.as_ref().is_some_and(|s| s.is_some());
        if look {
            let bytes = match &slot {
                Some(read) => read.as_ref().map(|v| v.value.clone()),
                None => self.store.get(&key)?,
            };
            let recorded = match self.recorded_in::<R>(op, bytes) {
                // On a shared engine, applied without an answer yet is most likely
                // another server still running it: wait for its answer.
                Err(MetaError::AnswerLost(_)) if self.checked.is_some() => {
                    drop(entered);
                    return self.answered_elsewhere(op, &key, req, at);
                }
                r => r?,
            };
            if let Some(reply) = recorded {
                // What was read may still be only staged (a group etcd did not answer
                // goes back to the queue): answer only once it is durable.
                super::early::blocking(|| self.sync())?;
                tracing::info!(client = %op.client, seq = op.seq, "a change sent again: answered from its record");
                return answer_again(self, op, req, reply, at);
            }
            self.sent_too_late(op)?;
        }
        let mark = encode(&OpRecord {
            seq: op.seq,
            at: epoch_secs(),
            reply: None,
        })?;
        let check = slot.map(|read| ReadCheck::of(key.clone(), &read));
        MARK.with(|m| {
            *m.borrow_mut() = Some(Mark {
                key: key.clone(),
                value: mark,
                check,
                answered: false,
            })
        });
        ANSWER_WRITTEN.with(|w| w.set(false));
        let marked = Marked;
        // Kept for an answer from another server's record: only a shared engine's
        // commit can conflict on the slot.
        let spare = self.checked.is_some().then(|| req.clone());
        let result = run(req);
        drop(marked);
        if let Some(req) = spare.filter(|_| {
            matches!(&result, Err(MetaError::Store(KvError::Conflict { key: k, .. })) if *k == key)
        }) {
            // Another server's try of this change landed after this one read the slot:
            // answer what it answers.
            drop(entered);
            return self.answered_elsewhere(op, &key, req, at);
        }
        // A reply that went with the change in its mark is recorded already: on a
        // shared engine a second record would cost a second commit the reply waits for.
        let recorded = match &result {
            Ok(_) if ANSWER_WRITTEN.with(Cell::get) => Ok(()),
            Ok(reply) => self.record_answer(op, key, reply),
            Err(_) => Ok(()),
        };
        // Durable before another try of the same change may read the record, whatever
        // failed; or, answered early, durable soon (a try reading the record then waits
        // for the log before it answers, above), its wait left to the caller.
        let durable = if super::early::answering_early() {
            Ok(())
        } else {
            self.wait_pending()
        };
        drop(entered);
        recorded?;
        durable?;
        result
    }

    /// Stages the record of change `op`'s answer `reply` in its slot `key`.
    fn record_answer<T: Serialize>(
        &self,
        op: OpId,
        key: Vec<u8>,
        reply: &T,
    ) -> Result<(), MetaError> {
        let record = OpRecord {
            seq: op.seq,
            at: epoch_secs(),
            reply: Some(encode(reply)?),
        };
        let mut batch = WriteBatch::new();
        batch.put(key, encode(&record)?);
        self.store.stage(batch)?;
        Ok(())
    }

    /// A recorded open (`opened`, by `client`'s create, for writing if `writes`)
    /// answered again on `at`'s connection: its session moves there (or, made by a
    /// server that has stopped since, is opened again), with a new grant. A session
    /// that cannot be taken back fails the answer: the file exists, its open is lost.
    pub(super) fn reopened(
        &self,
        client: ClientId,
        mut opened: proto::meta::fs::Opened,
        writes: bool,
        at: &Origin,
    ) -> Result<proto::meta::fs::Opened, MetaError> {
        let session = proto::meta::fs::OpenSession {
            session: opened.session,
            ino: opened.attr.ino,
            writes,
            grant: opened.grant.clone(),
        };
        // The asker sent the create's own id: the session is its own, wherever it is.
        let r = self.resume_taking(client, &[session], at.conn, &at.caller, true)?;
        let Some(&(_, _, kept_writes)) = r.kept.first() else {
            return Err(MetaError::AnswerLost(format!(
                "the create of {} was applied, but its open {} was lost with the server \
                 that made it",
                opened.attr.ino, opened.session
            )));
        };
        if let Some((_, grant)) = self.resume_grants(at, &r.kept).into_iter().next() {
            opened.grant = Some(grant);
        }
        if kept_writes != writes {
            // Opened again for reading only (the caller may no longer write it): end
            // it rather than leave an open the client does not know of.
            let _ = self.release(opened.session, None);
            return Err(MetaError::AnswerLost(format!(
                "the create of {} was applied, but its open could be taken back only for \
                 reading",
                opened.attr.ino
            )));
        }
        Ok(opened)
    }

    /// The reply recorded for `op` in its slot `key`; `None` if the change never landed.
    fn recorded<R: Handle>(&self, op: OpId, key: &[u8]) -> Result<Option<R::Reply>, MetaError> {
        self.recorded_in::<R>(op, self.store.get(key)?)
    }

    /// [`Namespace::recorded`] of the slot's value `bytes`, as read.
    fn recorded_in<R: Handle>(
        &self,
        op: OpId,
        bytes: Option<Vec<u8>>,
    ) -> Result<Option<R::Reply>, MetaError> {
        let Some(bytes) = bytes else {
            return Ok(None);
        };
        let record: OpRecord = decode(&bytes, "change record")?;
        match record.seq.cmp(&op.seq) {
            std::cmp::Ordering::Less => Ok(None),
            std::cmp::Ordering::Greater => Err(MetaError::Stale(format!(
                "change {} of {} is too old to tell whether it was applied: {} later \
                 changes of the client were recorded since",
                op.seq, op.client, OP_SLOTS
            ))),
            std::cmp::Ordering::Equal => match record.reply {
                Some(reply) => Ok(Some(decode(&reply, "recorded reply")?)),
                None => Err(MetaError::AnswerLost(format!(
                    "change {} of {} was applied, but the metadata server stopped before \
                     it recorded the answer",
                    op.seq, op.client
                ))),
            },
        }
    }

    /// The answer of a try of change `op` that another server applied: its recorded
    /// reply, once that server has written it (it writes the mark first, the reply
    /// next), waited for at most [`ELSEWHERE_WAIT`].
    fn answered_elsewhere<R: Handle>(
        &self,
        op: OpId,
        key: &[u8],
        req: R,
        at: &Origin,
    ) -> Result<R::Reply, MetaError> {
        let until = Instant::now() + ELSEWHERE_WAIT;
        loop {
            match self.recorded::<R>(op, key) {
                Ok(Some(reply)) => {
                    tracing::info!(client = %op.client, seq = op.seq, "a change applied by another server: answered from its record");
                    return answer_again(self, op, req, reply, at);
                }
                // Not answered yet there (or the slot moved on): wait a little.
                Ok(None) | Err(MetaError::AnswerLost(_)) if Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(None) | Err(MetaError::AnswerLost(_)) => {
                    return Err(MetaError::Store(KvError::Unavailable {
                        engine: self.store.engine(),
                        message: format!(
                            "change {} of {} was applied by another metadata server, \
                             which did not record its answer within {ELSEWHERE_WAIT:?}",
                            op.seq, op.client
                        ),
                    }));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Deletes the change records written more than two hours ago (`OP_RECORD_TTL`); returns
    /// how many. The server runs it every few minutes. A page at a time: each key is
    /// read again and deleted while no change can write a record (see `Ops::purging`).
    pub fn purge_op_records(&self) -> Result<usize, MetaError> {
        let cutoff = epoch_secs().saturating_sub(OP_RECORD_TTL.as_secs());
        let is_old = |v: &[u8]| {
            // An undecodable record is garbage too.
            decode::<OpRecord>(v, "change record").map_or(true, |r| r.at < cutoff)
        };
        let prefix = keys::op_record_prefix();
        let end = keys::prefix_end(&prefix);
        let mut start = prefix;
        let mut purged = 0;
        loop {
            // A stopping server writes nothing more (its owner lease may be gone: the
            // fence would refuse the write, and fail the store).
            if self.stopping.load(std::sync::atomic::Ordering::Acquire) {
                break;
            }
            let page = self.store.scan(&start, &end, PURGE_PAGE)?;
            if page.iter().any(|(_, v)| is_old(v)) {
                purged += self.purge_page(&start, &end, &is_old)?;
            }
            match page.last() {
                Some((k, _)) if page.len() == PURGE_PAGE => start = keys::successor(k),
                _ => break,
            }
        }
        if purged > 0 {
            tracing::info!(records = purged, "old change records deleted");
        }
        Ok(purged)
    }

    /// Deletes the old records of the page from `start`: read again and staged while no
    /// change can write a record (a record written after this read is never deleted),
    /// made durable after (staged deletes are seen at once, and a later record lands
    /// after them). Returns how many.
    fn purge_page(
        &self,
        start: &[u8],
        end: &[u8],
        is_old: &dyn Fn(&[u8]) -> bool,
    ) -> Result<usize, MetaError> {
        if let Some(engine) = &self.checked {
            // Other servers write records too, and this server's lock does not hold
            // them off: each delete holds only if the record is still the old one read.
            let mut purged = 0;
            for (k, v) in self.store.scan(start, end, PURGE_PAGE)? {
                if !is_old(&v) {
                    continue;
                }
                let read = engine.get_versioned(&k)?;
                if !read.as_ref().is_some_and(|r| is_old(&r.value)) {
                    continue;
                }
                let mut batch = WriteBatch::new();
                batch.delete(k.clone());
                match engine.commit_if(&[ReadCheck::of(k, &read)], batch) {
                    Ok(()) => purged += 1,
                    Err(KvError::Conflict { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            return Ok(purged);
        }
        let mut tickets = Vec::new();
        let mut purged = 0;
        {
            let _alone = self.ops.purging.write();
            let page = self.store.scan(start, end, PURGE_PAGE)?;
            let old: Vec<&Vec<u8>> = page
                .iter()
                .filter(|(_, v)| is_old(v))
                .map(|(k, _)| k)
                .collect();
            for chunk in old.chunks(PURGE_BATCH) {
                let mut batch = WriteBatch::new();
                for &k in chunk {
                    batch.delete(k.clone());
                }
                purged += chunk.len();
                if self.store.check_batch(&batch).is_ok() {
                    tickets.extend(self.store.stage(batch)?);
                } else {
                    // An engine configured for smaller transactions: one at a time.
                    for &k in chunk {
                        let mut one = WriteBatch::new();
                        one.delete(k.clone());
                        tickets.extend(self.store.stage(one)?);
                    }
                }
            }
        }
        for t in tickets {
            self.store.wait(t)?;
        }
        Ok(purged)
    }
}

/// Leaves only the mark of `client`'s change `seq`, as a server that stopped between
/// the change and the record of its answer does.
#[cfg(test)]
pub(super) fn forget_answer(ns: &Namespace, client: ClientId, seq: u64) {
    let op = OpId::new(client, seq);
    let mut batch = WriteBatch::new();
    let mark = OpRecord {
        seq,
        at: epoch_secs(),
        reply: None,
    };
    batch.put(slot_key(op), encode(&mark).unwrap());
    ns.store.commit(batch).unwrap();
}

/// Sets the time of `client`'s record in slot `slot` to `at` (seconds since the epoch),
/// as if it were written then.
#[cfg(test)]
pub(super) fn age_record(ns: &Namespace, client: ClientId, slot: u64, at: u64) {
    let key = keys::op_record(client, slot);
    let bytes = ns.store.get(&key).unwrap().unwrap();
    let mut record: OpRecord = decode(&bytes, "change record").unwrap();
    record.at = at;
    let mut batch = WriteBatch::new();
    batch.put(key, encode(&record).unwrap());
    ns.store.commit(batch).unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{Revision, Versioned};

    #[test]
    fn an_unanswered_commit_is_told_from_its_slot() {
        let mark = |before: Option<u64>| Mark {
            key: b"slot".to_vec(),
            value: b"mine".to_vec(),
            check: Some(ReadCheck {
                key: b"slot".to_vec(),
                revision: before.map(Revision),
            }),
            answered: false,
        };
        let now = |value: &[u8], revision| Versioned {
            value: value.to_vec(),
            revision: Revision(revision),
        };
        // Was absent: absent still, or now holding this try's mark, or another's.
        assert_eq!(landed(&mark(None), None), Some(Landed::No));
        assert_eq!(
            landed(&mark(None), Some(&now(b"mine", 9))),
            Some(Landed::Yes)
        );
        let theirs = now(b"theirs", 9);
        assert_eq!(landed(&mark(None), Some(&theirs)), Some(Landed::Elsewhere));
        // Held an older change's record: unchanged, or rewritten.
        assert_eq!(
            landed(&mark(Some(5)), Some(&now(b"old", 5))),
            Some(Landed::No)
        );
        assert_eq!(
            landed(&mark(Some(5)), Some(&theirs)),
            Some(Landed::Elsewhere)
        );
        assert_eq!(landed(&mark(Some(5)), None), Some(Landed::No), "purged");
        // Off a shared engine a mark checks nothing, and nothing is told.
        let unchecked = Mark {
            check: None,
            ..mark(None)
        };
        assert_eq!(landed(&unchecked, None), None);
    }
}
