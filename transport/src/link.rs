//! A connection that re-establishes itself, to one server or to the first that answers
//! of several (a metadata server and its standbys).

use crate::{Connection, Endpoint, TransportError};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::Mutex as AsyncMutex;
use tracing::{debug, info};

/// The addresses of a comma-separated list (`host:port,host:port`), spaces around
/// each trimmed, empty entries dropped. One address is a list of one.
pub fn split_addrs(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(String::from)
        .collect()
}

/// Which address a link tries next after a connect to address `tried` (of `n`)
/// failed, in a round of attempts that began at `started`: the next one round-robin, if
/// the failure says the server is unreachable (refused, no route, the connect timed
/// out: nothing was sent) and the round has not come back to where it began. `None`
/// ends the round with that failure: a server that answered and refused us (keys,
/// versions) is a configuration error the caller must see, not one to hide behind
/// another server; and one round tries each address once, so a call never loops.
pub fn next_addr(tried: usize, started: usize, n: usize, unreachable: bool) -> Option<usize> {
    if !unreachable || n == 0 {
        return None;
    }
    let next = (tried + 1) % n;
    (next != started).then_some(next)
}

/// The addresses of a link and the one it connects to first.
struct Addrs {
    list: Vec<String>,
    /// The address of the last connection made (or the first, before any).
    current: usize,
}

/// A connection to one server address, or to one of several, that is made on first use
/// and made again after it breaks. Callers decide whether a failed request may be
/// repeated.
pub struct Link {
    addrs: Mutex<Addrs>,
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
    /// A link to `addr`, or to the addresses of a comma-separated list (see
    /// [`split_addrs`]); connects on first use, to the first that answers.
    pub fn new(addr: String) -> Link {
        Link {
            addrs: Mutex::new(Addrs {
                list: split_addrs(&addr),
                current: 0,
            }),
            conn: Mutex::new(None),
            connecting: AsyncMutex::new(()),
            made: AtomicU64::new(0),
        }
    }

    /// Points the link at another address or list (a server that restarted elsewhere);
    /// the current connection is kept until it breaks.
    pub fn set_addr(&self, addr: &str) {
        *self.addrs.lock() = Addrs {
            list: split_addrs(addr),
            current: 0,
        };
    }

    /// The address the link connects to (or last connected to) first.
    pub fn addr(&self) -> String {
        let a = self.addrs.lock();
        a.list.get(a.current).cloned().unwrap_or_default()
    }

    /// Every address of the link, in order.
    pub fn addrs(&self) -> Vec<String> {
        self.addrs.lock().list.clone()
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
        let c = self.connect_round(ep).await?;
        let made = self.made.fetch_add(1, Ordering::AcqRel) + 1;
        // The connection replaced is dropped after the lock (its drop shuts it down).
        let old = self.conn.lock().replace((c.clone(), made));
        drop(old);
        Ok((c, made))
    }

    /// One round of connects, from the current address on, as [`next_addr`] decides;
    /// the address that answers becomes the current one.
    async fn connect_round(&self, ep: &Endpoint) -> Result<Connection, TransportError> {
        let (list, started) = {
            let a = self.addrs.lock();
            (a.list.clone(), a.current)
        };
        if list.is_empty() {
            return Err(TransportError::InvalidArgument(
                "no address to connect to".into(),
            ));
        }
        let mut i = started.min(list.len() - 1);
        loop {
            match ep.connect(&list[i]).await {
                Ok(c) => {
                    if i != started {
                        info!(addr = %list[i], from = %list[started], "connected to another address");
                    }
                    debug!(addr = %list[i], "connected");
                    let mut a = self.addrs.lock();
                    // Unless the list was replaced meanwhile.
                    if a.list == list {
                        a.current = i;
                    }
                    return Ok(c);
                }
                Err(e) => match next_addr(i, started, list.len(), e.never_connected()) {
                    Some(next) => {
                        debug!(addr = %list[i], error = %e, next = %list[next], "trying the next address");
                        i = next;
                    }
                    None => return Err(e),
                },
            }
        }
    }

    /// Tells the link that a call on `conn` (which it made) failed with `e`. A call that
    /// timed out gives the connection up (`Connection::abandon`: the server takes it for
    /// broken), so the next caller connects again, and points
    /// the link at the next address of its list: a server that stopped answering but
    /// keeps its connections open (stopped, hung, its machine paused) would otherwise
    /// hold every caller for a call timeout each, for as long as it stays so, while a
    /// standby serves. Calls in flight on the connection fail as disconnected.
    pub fn call_failed(&self, conn: &Connection, e: &TransportError) {
        if !e.is_call_timeout() {
            return;
        }
        // Given up, not closed: the server keeps this client's open files and locks for
        // its grace, as after a broken network, for the next connection to take back.
        self.leave(conn, Connection::abandon, "a call timed out");
    }

    /// Tells the link that the server on `conn` answered that another server of the
    /// list is the one to ask (a metadata server that does not lead, for a data
    /// server's heartbeat): the next caller connects to the next address first. The
    /// connection is left to the calls still on it, and closes once the last of them
    /// lets it go. Nothing with one address.
    pub fn ask_elsewhere(&self, conn: &Connection) {
        if self.addrs.lock().list.len() > 1 {
            self.leave(conn, |_| {}, "the server sent us elsewhere");
        }
    }

    /// Ends `conn` with `end` and, if it is still the link's connection, points the
    /// link at the next address. Only the first caller to report a connection moves
    /// the address on: the slot is emptied here, so a second report of the same moment
    /// finds it gone.
    fn leave(&self, conn: &Connection, end: fn(&Connection), why: &str) {
        let ours = {
            let mut slot = self.conn.lock();
            let ours = slot.as_ref().is_some_and(|(c, _)| c.same_as(conn));
            if ours {
                *slot = None;
            }
            ours
        };
        end(conn);
        if !ours {
            return;
        }
        let mut a = self.addrs.lock();
        if a.list.len() > 1 {
            let from = a.current;
            a.current = (from + 1) % a.list.len();
            info!(addr = %a.list[from], next = %a.list[a.current], why, "connecting again, to the next address first");
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_split_on_commas_and_one_address_is_a_list_of_one() {
        assert_eq!(split_addrs("127.0.0.1:7600"), ["127.0.0.1:7600"]);
        assert_eq!(split_addrs(" a:1 , b:2,,c:3 "), ["a:1", "b:2", "c:3"]);
        assert!(split_addrs(" , ").is_empty());
    }

    #[test]
    fn an_unreachable_address_moves_on_round_robin_once_per_round() {
        // Three addresses, a round from 1: 2, then 0, then back at 1: the round ends.
        assert_eq!(next_addr(1, 1, 3, true), Some(2));
        assert_eq!(next_addr(2, 1, 3, true), Some(0));
        assert_eq!(next_addr(0, 1, 3, true), None);
        // One address: nothing else to try.
        assert_eq!(next_addr(0, 0, 1, true), None);
        assert_eq!(next_addr(0, 0, 0, true), None);
    }

    #[test]
    fn a_server_that_answered_and_refused_ends_the_round() {
        assert_eq!(next_addr(0, 0, 3, false), None);
    }

    #[test]
    fn every_round_tries_each_address_exactly_once() {
        for n in 1..6 {
            for started in 0..n {
                let mut seen = vec![started];
                let mut i = started;
                while let Some(next) = next_addr(i, started, n, true) {
                    seen.push(next);
                    i = next;
                    assert!(seen.len() <= n, "n {n} from {started}: {seen:?}");
                }
                seen.sort_unstable();
                assert_eq!(seen, (0..n).collect::<Vec<_>>(), "n {n} from {started}");
            }
        }
    }
}
