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
    conn: AsyncMutex<Option<Connection>>,
    /// Connections made so far: a caller that must act once per new connection (say
    /// hello again) compares it with the count it last acted on.
    made: AtomicU64,
}

impl Link {
    /// A link to `addr`; connects on first use.
    pub fn new(addr: String) -> Link {
        Link {
            addr: Mutex::new(addr),
            conn: AsyncMutex::new(None),
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
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok((c.clone(), self.made.load(Ordering::Acquire)));
        }
        let addr = self.addr();
        let c = ep.connect(&addr).await?;
        debug!(%addr, "connected");
        *slot = Some(c.clone());
        let made = self.made.fetch_add(1, Ordering::AcqRel) + 1;
        Ok((c, made))
    }

    /// Connections made so far (see [`Link::get_counted`]).
    pub fn made(&self) -> u64 {
        self.made.load(Ordering::Acquire)
    }
}
