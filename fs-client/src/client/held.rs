//! Changes the metadata server answered early (see `proto::meta::ReplyTail`): kept
//! until a reply of the same server run says its log holds them, sent again in order
//! to a server that restarted before (on each new connection, before the sessions are
//! resumed), and settled (`Settle`) at `fsync` and once kept a second. So an answered
//! change is lost only with this client.

use super::Client;
use crate::error::{ClientError, Result};
use proto::meta::{fs, MetaRequest, ReplyTail, OP_SLOTS};
use proto::{codec, rpc, InodeId, Request, SessionId, WireError};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// A change kept this long is settled by the client's periodic check (a busy client's
/// replies let go of its changes within a log write; an idle one's would stay).
const SETTLE_AFTER: Duration = Duration::from_secs(1);

/// A change starts only while every kept change is less than this many counts older:
/// the server keeps a change's record in slot `seq % OP_SLOTS`, and a kept change must
/// find its own record when it is sent again.
const KEPT_SPAN: u64 = OP_SLOTS - 8;

/// One change answered early.
struct Kept {
    /// Counts the changes kept, from 1: what a settle covers.
    id: u64,
    /// The server run and log position of its early reply.
    run: u64,
    pending: u64,
    /// The change's count (`OpId::seq`).
    seq: u64,
    /// The request as sent (with its id).
    req: MetaRequest,
    /// The inode it made, which a replay makes again.
    made: Option<InodeId>,
    /// The session a create opened: a replay that opens another ends that one.
    session: Option<SessionId>,
    /// When it was kept.
    at: Instant,
}

/// A kept change as sent again.
struct Resend {
    req: MetaRequest,
    made: Option<InodeId>,
    session: Option<SessionId>,
}

/// The changes this client keeps, oldest first.
#[derive(Default)]
pub(crate) struct Held {
    inner: parking_lot::Mutex<Inner>,
    /// A server answered a change early (this client has a mark to settle after a
    /// crash: its periodic check reconnects for that).
    took: std::sync::atomic::AtomicBool,
    /// A change answered early could not be made again: the next `fsync` (or
    /// `fsyncdir`) fails, once.
    lost: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Inner {
    /// The server run the last tail came from, and how far its log was durable.
    run: u64,
    durable: u64,
    kept: VecDeque<Kept>,
    /// The last [`Kept::id`] given.
    last_id: u64,
}

impl Held {
    /// Notes a tail: drops what it says is durable, and keeps `req` if it was answered
    /// early (`session`: the one its reply opened).
    pub(crate) fn note(&self, req: &MetaRequest, tail: &ReplyTail, session: Option<SessionId>) {
        let mut h = self.inner.lock();
        if tail.run != h.run {
            h.run = tail.run;
            h.durable = 0;
        }
        h.durable = h.durable.max(tail.durable);
        let (run, durable) = (h.run, h.durable);
        h.kept.retain(|k| k.run != run || k.pending > durable);
        if let Some(pending) = tail.pending {
            self.took.store(true, std::sync::atomic::Ordering::Relaxed);
            let seq = match req {
                MetaRequest::Fs(call) => call.op.map_or(0, |op| op.seq),
                _ => 0,
            };
            h.last_id += 1;
            let id = h.last_id;
            h.kept.push_back(Kept {
                id,
                run: tail.run,
                pending,
                seq,
                req: req.clone(),
                made: tail.made,
                session,
                at: Instant::now(),
            });
        }
    }

    /// Whether a server ever answered this client early.
    pub(crate) fn took_early(&self) -> bool {
        self.took.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many changes are kept.
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().kept.len()
    }

    /// Whether the oldest kept change was kept `age` or longer ago.
    fn kept_since(&self, age: Duration) -> bool {
        self.inner
            .lock()
            .kept
            .front()
            .is_some_and(|k| k.at.elapsed() >= age)
    }

    /// Whether a kept change is [`KEPT_SPAN`] counts or more older than `seq`.
    fn spans(&self, seq: u64) -> bool {
        self.inner
            .lock()
            .kept
            .iter()
            .any(|k| k.seq + KEPT_SPAN <= seq)
    }

    /// The id of the newest change kept (0: none kept ever).
    fn newest(&self) -> u64 {
        self.inner.lock().kept.back().map_or(0, |k| k.id)
    }

    /// The kept changes, oldest first, for a replay; and the newest one's id.
    fn snapshot(&self) -> (Vec<Resend>, u64) {
        let h = self.inner.lock();
        let kept = h
            .kept
            .iter()
            .map(|k| Resend {
                req: k.req.clone(),
                made: k.made,
                session: k.session,
            })
            .collect();
        (kept, h.kept.back().map_or(0, |k| k.id))
    }

    /// Drops the changes up to id `through` (settled by server run `run`): only those
    /// that run answered, or with `resent` all (they were sent to it again). Says
    /// whether changes of other runs are still kept (they must be sent again).
    fn settled(&self, through: u64, run: u64, resent: bool) -> bool {
        let mut h = self.inner.lock();
        h.kept
            .retain(|k| k.id > through || (k.run != run && !resent));
        h.kept.iter().any(|k| k.run != run)
    }
}

/// A resent change's answer, as `T` (postcard encodes every `Err` alike, so `()`
/// reads any refusal), its tail set aside.
fn answer_of<T: serde::de::DeserializeOwned>(
    answer: &[u8],
) -> Result<std::result::Result<T, WireError>> {
    let (r, _) =
        codec::decode_with_trailer::<std::result::Result<T, WireError>, ReplyTail>(answer)?;
    Ok(r)
}

impl Client {
    /// Before change `seq` starts: settles first if a kept change is nearly
    /// `OP_SLOTS` counts older (its record slot would be the new one's).
    pub(crate) async fn keep_window(&self, seq: u64) -> Result<()> {
        if self.held.spans(seq) {
            self.settle().await?;
        }
        Ok(())
    }

    /// Settles changes kept [`SETTLE_AFTER`] or longer (the periodic check).
    pub(crate) async fn settle_old(&self) -> Result<()> {
        if self.held.kept_since(SETTLE_AFTER) {
            self.settle().await?;
        }
        Ok(())
    }

    /// Waits until every change answered early so far is durable (`fsync`); fails
    /// (once) if one was lost with a server and could not be made again.
    pub async fn settle(&self) -> Result<()> {
        let lost = || {
            if self
                .held
                .lost
                .swap(false, std::sync::atomic::Ordering::Relaxed)
            {
                return Err(ClientError::Remote(WireError::new(
                    proto::ErrorCode::Io,
                    "a change the metadata server answered early was lost with it and \
                     could not be made again (see the mount's log)"
                        .to_string(),
                )));
            }
            Ok(())
        };
        if self.held.len() == 0 {
            return lost();
        }
        let through = self.held.newest();
        let req = Request::new(fs::Settle { client: self.id });
        let (run, _) = self.meta_waiting(&req, self.meta_wait()).await?;
        if self.held.settled(through, run, false) {
            // Answered by an earlier run, noted after the resend on this connection:
            // the server may have lost them. One resend at a time (`resume_lock`).
            let _one = self.resume_lock.lock().await;
            self.replay_held().await?;
        }
        lost()
    }

    /// Sends again, in order, every change kept, then `Settle`, all on one
    /// connection: the first thing on a new metadata connection, before the sessions
    /// are resumed (a create's session is taken back only once its file is there
    /// again).
    pub(crate) async fn replay_held(&self) -> Result<()> {
        let (kept, through) = self.held.snapshot();
        if kept.is_empty() && !self.config.early_replies {
            return Ok(());
        }
        let conn = self.meta.get(&self.ep).await?;
        let limit = self.ep.config().max_msg_bytes;
        let mut lost = 0;
        // Sessions to end once settled: before, the server serves nothing but replays.
        let mut extra = Vec::new();
        for k in &kept {
            let mut req = k.req.clone();
            if let MetaRequest::Fs(call) = &mut req {
                if let Some(op) = &mut call.op {
                    op.retry = true;
                    op.made = k.made;
                }
                // A mount of a subdirectory names its root as the namespace's.
                if let Some(root) = self.ep.root() {
                    for ino in call.req.inodes_mut() {
                        if *ino == InodeId::ROOT {
                            *ino = root;
                        }
                    }
                }
            }
            let bytes = codec::encode(&req, limit)?;
            let answer = conn.call(bytes.into()).await?;
            if rpc::is_error(&answer) {
                if let Err(e) = answer_of::<()>(&answer)? {
                    // A create the log held, whose file this client has closed since:
                    // the server answers from its record but cannot open it again (an
                    // I/O error naming the lost open); the create itself stands.
                    let closed_create = matches!(&req, MetaRequest::Fs(c) if matches!(c.req, fs::FsRequest::Create(_)))
                        && e.code == proto::ErrorCode::Io
                        && !k
                            .session
                            .is_some_and(|s| self.sessions.lock().contains_key(&s));
                    if closed_create {
                        tracing::debug!(error = %e, "a create sent again stands; its open had ended");
                    } else {
                        lost += 1;
                        tracing::error!(request = req.name(), error = %e,
                            "a change answered early was lost with the metadata server and could not be made again");
                    }
                }
                continue;
            }
            let made = match &req {
                MetaRequest::Fs(call) => match call.req {
                    fs::FsRequest::Create(_) => {
                        answer_of::<fs::Opened>(&answer)?.ok().map(|o| {
                            // A create sent again opens its session again: the one its
                            // first reply gave (answered from its record), or a new
                            // one (made again). The resume takes back the first if its
                            // file is still open here; any other ends.
                            let open_here = self.sessions.lock().contains_key(&o.session);
                            if Some(o.session) != k.session || !open_here {
                                extra.push(o.session);
                            }
                            o.attr.ino
                        })
                    }
                    fs::FsRequest::Mkdir(_)
                    | fs::FsRequest::MkNod(_)
                    | fs::FsRequest::Symlink(_) => {
                        answer_of::<fs::Made>(&answer)?.ok().map(|m| m.attr.ino)
                    }
                    _ => None,
                },
                _ => None,
            };
            if let (Some(want), Some(got)) = (k.made, made) {
                if want != got {
                    lost += 1;
                    tracing::error!(request = req.name(), %want, %got,
                        "a change answered early was made again as another inode");
                }
            }
        }
        let settle = Request::new(fs::Settle { client: self.id });
        let answer = conn.call(settle.encode(limit)?.into()).await?;
        match settle.decode_reply(&answer)? {
            Ok(run) => {
                self.held.settled(through, run, true);
            }
            Err(e) => tracing::warn!(error = %e, "settling changes sent again failed"),
        }
        if !extra.is_empty() {
            let release = Request::new(fs::ReleaseMany { sessions: extra });
            if let Err(e) = crate::rpc::meta_call(&self.ep, &self.meta, &release).await {
                tracing::debug!(error = %e, "ending the sessions of creates made again failed");
            }
        }
        if lost > 0 {
            self.held
                .lost
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        if !kept.is_empty() {
            tracing::info!(
                sent = kept.len(),
                lost,
                "changes answered early sent again to the metadata server"
            );
        }
        Ok(())
    }
}
