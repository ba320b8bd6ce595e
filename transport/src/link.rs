//! A connection that re-establishes itself.

use crate::{Connection, Endpoint, TransportError};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::Mutex as AsyncMutex;
use tracing::debug;

/// A connection to one server address that is made on first use and made again after
/// it breaks. Callers decide whether a failed request may be repeated.
pub struct Link {
    addr: Mutex<String>,
    /// The connection last made and its number (see `made`); it may have closed since.
    /// A plain mutex, held for a clone: a call on a live connection waits for nothing.
    conn: Mutex<Option<(Connection, u64)>>,
    /// Held while connecting, so that callers finding the connection gone make one
    /// new connection between them.
    connecting: AsyncMutex<()>,
    /// Connections made so far: a caller that must act once per new connection (say
    /// hello again) compares it with the count it last acted on.
    made: AtomicU64,
}

impl Link {
    /// A link to `addr`; connects on first use.
    pub fn new(addr: String) -> Link {
        Link {
            addr: Mutex::new(addr),
            conn: Mutex::new(None),
            connecting: AsyncMutex::new(()),
            made: AtomicU64::new(0),
        }
    }

    /// Points the link at another address (a server that restarted elsewhere); the
    /// current connection is kept until it breaks.
    pub fn set_addr(&self, addr: &str) {
        *self.addr.lock() = addr.to_string();
    }

    /// The address the link connects to.
    pub fn addr(&self) -> String {
        self.addr.lock().clone()
    }

    /// The live connection, connecting if there is none or it closed.
    pub async fn get(&self, ep: &Endpoint) -> Result<Connection, TransportError> {
        self.get_counted(ep).await.map(|(c, _)| c)
    }

    /// As [`Link::get`], with the number of connections made so far, this one
    /// included (1 for the first).
    pub async fn get_counted(&self, ep: &Endpoint) -> Result<(Connection, u64), TransportError> {
        if let Some(live) = self.live() {
            return Ok(live);
        }
        let _one = self.connecting.lock().await;
        // Another caller may have connected while this one waited.
        if let Some(live) = self.live() {
            return Ok(live);
        }
        let addr = self.addr();
        let c = ep.connect(&addr).await?;
        debug!(%addr, "connected");
        let made = self.made.fetch_add(1, Ordering::AcqRel) + 1;
        // The connection replaced is dropped after the lock (its drop shuts it down).
        let old = self.conn.lock().replace((c.clone(), made));
        drop(old);
        Ok((c, made))
    }

    /// The connection and its number, if one is open.
    fn live(&self) -> Option<(Connection, u64)> {
        self.conn
            .lock()
            .as_ref()
            .filter(|(c, _)| !c.is_closed())
            .cloned()
    }

    /// Whether a connection is open now (for the metrics: no connecting, no waiting).
    pub fn is_open(&self) -> bool {
        self.conn
            .lock()
            .as_ref()
            .is_some_and(|(c, _)| !c.is_closed())
    }

    /// Connections made so far (see [`Link::get_counted`]).
    pub fn made(&self) -> u64 {
        self.made.load(Ordering::Acquire)
    }
}
