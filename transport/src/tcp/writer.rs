//! The sending side of a `tcp` connection.
//!
//! A small frame is written by the task that sends it, at once, when nothing is queued
//! and the writer task is idle: a call or a reply then costs one `write` and no hand-off
//! between tasks, which is most of a round trip's cost on loopback. Everything else
//! (bulk payloads, frames sent while others wait, the rest of a short write) is queued
//! for the writer task, which sends it in batches. Inline writes happen only while the
//! queue is empty and the writer idle, both checked under one lock, so frames never
//! overtake each other.

use crate::conn::Dest;
use crate::frame::{Header, HEADER_LEN};
use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::io::{ErrorKind, IoSlice};
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::Notify;

/// Bytes the writer batches into one `write`.
const BATCH_BYTES: usize = 256 * 1024;
/// Payloads up to this size are copied into a batch (or written inline); larger ones
/// are sent from where they are.
pub(super) const INLINE_PAYLOAD_BYTES: usize = 64 * 1024;

pub(super) enum Payload {
    Bytes(Bytes),
    /// Bytes of registered memory, read when the frame is written.
    Region(Dest),
}

impl Payload {
    pub(super) fn len(&self) -> usize {
        match self {
            Payload::Bytes(b) => b.len(),
            Payload::Region(d) => d.len,
        }
    }

    /// Runs `f` on the bytes; a region stays locked only while `f` runs.
    fn with<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        match self {
            Payload::Bytes(b) => f(b),
            Payload::Region(d) => f(&d.mr.buf.lock()[d.off..d.off + d.len]),
        }
    }
}

enum Out {
    Frame {
        header: Header,
        payload: Payload,
        /// Queued by the engine (a completion), counted against the peer's credits.
        response: bool,
    },
    /// The unwritten end of an inline write.
    Rest { bytes: Bytes, response: bool },
    /// Write what is queued, then close the stream.
    Close,
}

struct Queue {
    items: VecDeque<Out>,
    /// The writer task owns the socket's sending side (it has items in hand).
    busy: bool,
    closed: bool,
}

/// The `tcp` half of a connection.
pub(crate) struct TcpWire {
    sock: OwnedWriteHalf,
    queue: Mutex<Queue>,
    wake: Notify,
    /// Completions queued for the peer and not yet written: bounded by its credits.
    pub(super) queued_responses: AtomicUsize,
}

impl TcpWire {
    pub(super) fn new(sock: OwnedWriteHalf) -> TcpWire {
        TcpWire {
            sock,
            queue: Mutex::new(Queue {
                items: VecDeque::new(),
                busy: false,
                closed: false,
            }),
            wake: Notify::new(),
            queued_responses: AtomicUsize::new(0),
        }
    }

    /// Sends a frame: inline when possible, else through the writer task.
    pub(super) fn send(&self, header: Header, payload: Payload, response: bool) {
        if response {
            self.queued_responses.fetch_add(1, Ordering::Relaxed);
        }
        let mut q = self.queue.lock();
        if q.closed {
            return;
        }
        let small = matches!(&payload, Payload::Bytes(b) if b.len() <= INLINE_PAYLOAD_BYTES);
        if small && q.items.is_empty() && !q.busy {
            let Payload::Bytes(body) = payload else {
                unreachable!("checked above")
            };
            let head = header.encode();
            let sent = self.try_write_now(&head, &body);
            if sent == head.len() + body.len() {
                self.done(response);
                return;
            }
            let mut rest = BytesMut::with_capacity(head.len() + body.len() - sent);
            rest.extend_from_slice(head.get(sent..).unwrap_or(&[]));
            rest.extend_from_slice(&body[sent.saturating_sub(head.len())..]);
            q.items.push_back(Out::Rest {
                bytes: rest.freeze(),
                response,
            });
        } else {
            q.items.push_back(Out::Frame {
                header,
                payload,
                response,
            });
        }
        if !q.busy {
            q.busy = true;
            self.wake.notify_one();
        }
    }

    /// Writes as much of `head` and `body` as the socket takes without waiting. An
    /// error is left for the writer task to meet and report.
    fn try_write_now(&self, head: &[u8], body: &[u8]) -> usize {
        let mut sent = 0;
        let total = head.len() + body.len();
        while sent < total {
            let res = if sent < head.len() {
                let bufs = [IoSlice::new(&head[sent..]), IoSlice::new(body)];
                self.sock.try_write_vectored(&bufs)
            } else {
                self.sock.try_write(&body[sent - head.len()..])
            };
            match res {
                Ok(n) if n > 0 => sent += n,
                _ => break,
            }
        }
        sent
    }

    fn done(&self, response: bool) {
        if response {
            self.queued_responses.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Queues the end of the stream after what is queued.
    pub(super) fn close(&self) {
        let mut q = self.queue.lock();
        if q.closed {
            return;
        }
        q.closed = true;
        q.items.push_back(Out::Close);
        if !q.busy {
            q.busy = true;
            self.wake.notify_one();
        }
    }

    /// Takes everything queued, or marks the writer idle when nothing is.
    fn take(&self) -> Option<Vec<Out>> {
        let mut q = self.queue.lock();
        if q.items.is_empty() {
            q.busy = false;
            return None;
        }
        Some(q.items.drain(..).collect())
    }

    /// Writes `batch` and then `tail` with as few system calls as the socket allows.
    async fn flush(&self, batch: &mut Vec<u8>, tail: &Payload) -> std::io::Result<()> {
        let total = batch.len() + tail.len();
        let mut sent = 0;
        while sent < total {
            self.sock.writable().await?;
            let res = tail.with(|t| {
                if sent < batch.len() {
                    let bufs = [IoSlice::new(&batch[sent..]), IoSlice::new(t)];
                    self.sock.try_write_vectored(&bufs)
                } else {
                    self.sock.try_write(&t[sent - batch.len()..])
                }
            });
            match res {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        batch.clear();
        Ok(())
    }

    /// The writer task's work: sends what is queued until the stream is closed or a
    /// write fails. Returns `Ok` after a clean close.
    pub(super) async fn run(&self) -> std::io::Result<()> {
        let empty = Payload::Bytes(Bytes::new());
        let mut batch = Vec::with_capacity(BATCH_BYTES);
        loop {
            self.wake.notified().await;
            while let Some(items) = self.take() {
                for item in items {
                    let (header, payload, response) = match item {
                        Out::Close => {
                            self.flush(&mut batch, &empty).await?;
                            let sock: &tokio::net::TcpStream = self.sock.as_ref();
                            let _ =
                                socket2::SockRef::from(sock).shutdown(std::net::Shutdown::Write);
                            return Ok(());
                        }
                        Out::Rest { bytes, response } => {
                            batch.extend_from_slice(&bytes);
                            self.done(response);
                            continue;
                        }
                        Out::Frame {
                            header,
                            payload,
                            response,
                        } => (header, payload, response),
                    };
                    batch.extend_from_slice(&header.encode());
                    let inline = payload.len() <= INLINE_PAYLOAD_BYTES
                        && batch.len() + payload.len() <= BATCH_BYTES;
                    if inline {
                        payload.with(|p| batch.extend_from_slice(p));
                    } else {
                        self.flush(&mut batch, &payload).await?;
                    }
                    // A region's clone goes once its bytes are taken (see `BufferPool`).
                    drop(payload);
                    self.done(response);
                    if batch.len() + HEADER_LEN + INLINE_PAYLOAD_BYTES > BATCH_BYTES {
                        self.flush(&mut batch, &empty).await?;
                    }
                }
                self.flush(&mut batch, &empty).await?;
            }
        }
    }
}
