//! Endpoints: register memory, connect to peers, listen for them, on the chosen backend.

use crate::auth::{AuthSetup, Credentials, Gate, PeerIdentity, Verifier, HANDSHAKE_TIMEOUT_MS};
use crate::backend::Backend;
use crate::config::TransportConfig;
use crate::conn::{since_start_ms, Closed, ConnCore, ConnId, Connection, Handler};
use crate::error::TransportError;
use crate::mr::{AlignedBuf, MemoryRegion, StableBytes};
use parking_lot::Mutex;
use proto::auth::KeyId;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::task::AbortHandle;
use tracing::warn;

/// Largest single memory registration.
pub const MAX_REGION_BYTES: usize = 1 << 30;

/// A transport endpoint (like an RDMA device context plus protection domain): it
/// registers memory and makes connections that share its limits.
#[derive(Clone)]
pub struct Endpoint {
    backend: Backend,
    config: Arc<TransportConfig>,
    app_version: u16,
    /// How `mem` fault filters name this endpoint: its listen address once it listens.
    local_name: Arc<Mutex<String>>,
    /// Keys: how `connect` authenticates, how `listen` checks its peers.
    auth: AuthSetup,
    #[cfg(feature = "rdma")]
    rdma: Option<Arc<crate::rdma::Device>>,
}

static NEXT_ENDPOINT: AtomicU64 = AtomicU64::new(1);

impl Endpoint {
    /// An endpoint on `backend` speaking application protocol `app_version`.
    ///
    /// `Backend::Auto` becomes `rdma` when a usable device exists and `tcp` otherwise
    /// (logging why); `Backend::Rdma` on a host without RDMA is an
    /// [`TransportError::Unsupported`] error whose message names the `tcp` transport.
    pub fn new(
        backend: Backend,
        config: TransportConfig,
        app_version: u16,
    ) -> Result<Endpoint, TransportError> {
        config.validate().map_err(TransportError::InvalidArgument)?;
        let backend = backend.resolve(&config)?;
        #[cfg(feature = "rdma")]
        let rdma = match backend {
            Backend::Rdma => Some(crate::rdma::Device::open(&config)?),
            _ => None,
        };
        Ok(Endpoint {
            backend,
            config: Arc::new(config),
            app_version,
            local_name: Arc::new(Mutex::new(format!(
                "mem-client-{}",
                NEXT_ENDPOINT.fetch_add(1, Ordering::Relaxed)
            ))),
            auth: AuthSetup {
                handshake_timeout_ms: HANDSHAKE_TIMEOUT_MS,
                ..AuthSetup::default()
            },
            #[cfg(feature = "rdma")]
            rdma,
        })
    }

    /// Authenticates every connection this endpoint makes as `credentials` (see
    /// [`crate::auth`]): `connect` returns only once the server proved the same key.
    pub fn with_credentials(mut self, credentials: Credentials) -> Endpoint {
        self.auth.credentials = Some(credentials);
        self
    }

    /// Requires every connection to this endpoint's listeners to authenticate with a
    /// key `verifier` knows before any of its requests reaches the application.
    pub fn with_verifier(mut self, verifier: Arc<dyn Verifier>) -> Endpoint {
        self.auth.verifier = Some(verifier);
        self
    }

    /// How long an accepted connection may take to authenticate (and `connect` may wait
    /// for the server's side of the handshake); [`HANDSHAKE_TIMEOUT_MS`] unless set.
    pub fn with_handshake_timeout_ms(mut self, ms: u64) -> Endpoint {
        self.auth.handshake_timeout_ms = ms;
        self
    }

    /// Whether this endpoint's listeners require authentication.
    pub fn verifies(&self) -> bool {
        self.auth.verifier.is_some()
    }

    pub(crate) fn handshake_timeout_ms(&self) -> u64 {
        self.auth.handshake_timeout_ms
    }

    /// The backend in use (never `Auto`: that is resolved when the endpoint is made).
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The limits every connection of this endpoint obeys.
    pub fn config(&self) -> &TransportConfig {
        &self.config
    }

    pub(crate) fn config_arc(&self) -> Arc<TransportConfig> {
        self.config.clone()
    }

    pub(crate) fn app_version(&self) -> u16 {
        self.app_version
    }

    pub(crate) fn local_name(&self) -> String {
        self.local_name.lock().clone()
    }

    pub(crate) fn set_local_name(&self, name: &str) {
        *self.local_name.lock() = name.to_string();
    }

    #[cfg(feature = "rdma")]
    pub(crate) fn rdma_device(&self) -> Option<&Arc<crate::rdma::Device>> {
        self.rdma.as_ref()
    }

    /// One line on what this endpoint runs on: the backend, and for `rdma` the device,
    /// port, addressing and the grant path the device's attributes chose.
    pub fn describe(&self) -> String {
        #[cfg(feature = "rdma")]
        if let Some(d) = &self.rdma {
            return format!("rdma on {}", d.describe());
        }
        self.backend.to_string()
    }

    /// Allocates and registers `len` zeroed bytes.
    pub fn register(&self, len: usize) -> Result<MemoryRegion, TransportError> {
        if len > MAX_REGION_BYTES {
            return Err(TransportError::TooBig {
                what: "memory registration",
                size: len,
                limit: MAX_REGION_BYTES,
            });
        }
        #[cfg(feature = "rdma")]
        if let Some(dev) = &self.rdma {
            return dev.register(len);
        }
        Ok(MemoryRegion::new(len))
    }

    /// Registers memory the caller owns, as [`Endpoint::register`] registers memory of
    /// its own: a peer granted a slice of it writes straight into `memory`, with no copy
    /// out of a buffer of the transport's. [`MemoryRegion::reclaim`] gives it back.
    /// Refused with `memory` given back (too large; a device that cannot pin it).
    pub fn lend<T: StableBytes>(&self, memory: T) -> Result<MemoryRegion, (TransportError, T)> {
        let buf = AlignedBuf::lent(memory);
        let given_back = |e, buf: AlignedBuf| match buf.into_lent() {
            Ok(memory) => (e, memory),
            Err(_) => unreachable!("the buffer was made of a `T` above"),
        };
        if buf.len() > MAX_REGION_BYTES {
            let e = TransportError::TooBig {
                what: "memory registration",
                size: buf.len(),
                limit: MAX_REGION_BYTES,
            };
            return Err(given_back(e, buf));
        }
        #[cfg(feature = "rdma")]
        if let Some(dev) = &self.rdma {
            return dev
                .register_over(buf)
                .map_err(|(e, buf)| given_back(e, buf));
        }
        Ok(MemoryRegion::plain(buf))
    }

    /// Connects to a listening peer at `addr` (`host:port`).
    /// With credentials, the handshake runs before it returns: a server that refuses
    /// the key, or cannot prove it, is a [`TransportError::Auth`] of one line.
    pub async fn connect(&self, addr: &str) -> Result<Connection, TransportError> {
        let conn = match self.backend {
            Backend::Mem => crate::mem::connect(self, addr).await?,
            #[cfg(feature = "rdma")]
            Backend::Rdma => crate::rdma::connect(self, addr).await?,
            _ => crate::tcp::connect(self, addr).await?,
        };
        if let Some(creds) = &self.auth.credentials {
            let ms = self.auth.handshake_timeout_ms;
            let hs = crate::auth::client_handshake(&conn, creds, addr);
            match tokio::time::timeout(Duration::from_millis(ms), hs).await {
                Ok(r) => r?,
                Err(_) => {
                    // Nothing was asked of the server yet: a connect that timed out, so
                    // a link moves on to its next address (a server stopped or hung
                    // keeps accepting connections in the kernel, and answers none).
                    conn.close();
                    warn!("the server at {addr} did not finish the handshake in {ms} ms");
                    return Err(TransportError::TimedOut {
                        op: crate::error::OP_CONNECT,
                        peer: addr.to_string(),
                        ms,
                    });
                }
            }
        }
        Ok(conn)
    }

    /// Listens on `addr` (port 0 picks a free port); every call that arrives is handed to
    /// `handler`. Stops when the returned [`Listener`] is dropped.
    pub async fn listen(
        &self,
        addr: &str,
        handler: Arc<dyn Handler>,
    ) -> Result<Listener, TransportError> {
        let handler = Arc::new(Gate::new(handler, self.auth.verifier.clone()));
        match self.backend {
            Backend::Mem => crate::mem::listen(self, addr, handler),
            #[cfg(feature = "rdma")]
            Backend::Rdma => crate::rdma::listen(self, addr, handler).await,
            _ => crate::tcp::listen(self, addr, handler).await,
        }
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Endpoint({})", self.backend)
    }
}

/// A listener's live connections by the role their peer proved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerCounts {
    /// Servers of the cluster (data servers).
    pub servers: usize,
    /// Clients (mounts and tools).
    pub clients: usize,
    /// Peers that proved no key: in their handshake, or on a listener without keys.
    pub unauthenticated: usize,
}

impl PeerCounts {
    /// `(peer kind, count)` pairs, for a metric's `peer` label.
    pub fn by_kind(&self) -> [(&'static str, usize); 3] {
        [
            ("server", self.servers),
            ("client", self.clients),
            ("unauthenticated", self.unauthenticated),
        ]
    }
}

/// The connections a listener accepted, so it can bound and close them. Connections
/// still in their handshake count against `max_connections` like the others, and
/// against `max_unauthenticated_connections` besides.
#[derive(Clone, Default)]
pub(crate) struct ConnSet(Arc<Mutex<ConnSetInner>>);

#[derive(Default)]
struct ConnSetInner {
    /// With a verifier: how long a connection may stay unauthenticated.
    handshake_timeout_ms: Option<u64>,
    conns: HashMap<ConnId, Weak<ConnCore>>,
    /// Set by the listener's shutdown. A handshake that was already under way then must
    /// not add a live connection: its task would keep the handler (and whatever the
    /// handler owns, such as an open store) alive after the listener is gone.
    closed: bool,
}

impl ConnSet {
    /// The set of a listener of `ep`.
    pub(crate) fn for_endpoint(ep: &Endpoint) -> ConnSet {
        let set = ConnSet::default();
        set.0.lock().handshake_timeout_ms = ep.verifies().then(|| ep.handshake_timeout_ms());
        set
    }

    /// The live connections, each as the identity its peer proved (`None`: still in
    /// its handshake, or no keys on this listener).
    pub(crate) fn peers(&self) -> Vec<Option<Arc<PeerIdentity>>> {
        let inner = self.0.lock();
        let live = inner.conns.values().filter_map(Weak::upgrade);
        live.map(|c| c.identity().cloned()).collect()
    }

    /// Closes the connections whose peer proved a key of `name` (with `key_id`: that key
    /// only), authenticated or about to be; returns how many.
    pub(crate) fn close_identity(&self, name: &str, key_id: Option<&KeyId>, why: &str) -> usize {
        let matches = |i: &PeerIdentity| {
            i.name == name && key_id.is_none_or(|id| i.key_id.as_ref() == Some(id))
        };
        let victims: Vec<_> = self
            .0
            .lock()
            .conns
            .values()
            .filter_map(Weak::upgrade)
            .filter(|c| c.claimed().is_some_and(|i| matches(i)))
            .collect();
        for c in &victims {
            c.shutdown_as(why.to_string(), Closed::Locally);
        }
        victims.len()
    }

    /// Whether another connection fits under `config.max_connections` (forgetting
    /// closed ones first). When the set is full, the connection idle longest, if idle
    /// for `idle_close_ms` at least, is closed to make room: idle connections cannot
    /// keep every slot from the peers that have work. Its peer, if alive, connects
    /// again when it needs to (a metadata server keeps its open files for the grace).
    ///
    /// With a verifier every new connection starts unauthenticated: it is refused when
    /// `max_unauthenticated_connections` are already, and only an unauthenticated one is
    /// closed to make room for it, so a flood of half-open handshakes can neither push
    /// authenticated clients out nor keep them out past the handshake timeout.
    pub(crate) fn has_room(&self, config: &TransportConfig) -> bool {
        let victim = {
            let mut c = self.0.lock();
            c.conns
                .retain(|_, w| w.upgrade().is_some_and(|c| !c.is_closed()));
            if c.closed {
                return false;
            }
            let verifies = c.handshake_timeout_ms.is_some();
            let live: Vec<_> = c.conns.values().filter_map(Weak::upgrade).collect();
            let unauthenticated = live.iter().filter(|core| core.identity().is_none());
            if verifies && unauthenticated.count() >= config.max_unauthenticated_connections {
                let limit = config.max_unauthenticated_connections;
                warn!(
                    limit,
                    "unauthenticated connection limit reached: refusing one more"
                );
                return false;
            }
            if c.conns.len() < config.max_connections {
                return true;
            }
            match idlest(live, config, verifies) {
                Some((idle, core)) => {
                    c.conns.remove(&core.id);
                    (idle, core)
                }
                None => return false,
            }
        };
        let (idle_ms, core) = victim;
        let peer = &core.peer;
        warn!(%peer, idle_ms, "connection limit reached: closing the idlest connection");
        let why = format!("idle for {idle_ms} ms, closed to make room for a new connection");
        core.shutdown_as(why, Closed::Broken);
        true
    }

    /// Adds an accepted connection, or closes it at once if the listener has shut down.
    pub(crate) fn insert(&self, core: &Arc<ConnCore>) {
        let mut c = self.0.lock();
        if c.closed {
            drop(c);
            core.shutdown_as("listener shut down".to_string(), Closed::Locally);
            return;
        }
        c.conns.insert(core.id, Arc::downgrade(core));
        if let Some(ms) = c.handshake_timeout_ms {
            tokio::spawn(handshake_deadline(Arc::downgrade(core), ms));
        }
    }

    fn close_all(&self, why: &str) {
        let conns: Vec<_> = {
            let mut c = self.0.lock();
            c.closed = true;
            c.conns.drain().collect()
        };
        for (_, c) in conns {
            if let Some(c) = c.upgrade() {
                c.shutdown_as(why.to_string(), Closed::Locally);
            }
        }
    }
}

/// The connection idle longest among `live`, if idle `idle_close_ms` at least (never
/// with `idle_close_ms` 0). With `verifies` only unauthenticated connections qualify:
/// the newcomer is unauthenticated and must not cost an authenticated client its slot.
fn idlest(
    live: Vec<Arc<ConnCore>>,
    config: &TransportConfig,
    verifies: bool,
) -> Option<(u64, Arc<ConnCore>)> {
    if config.idle_close_ms == 0 {
        return None;
    }
    let now = since_start_ms();
    live.into_iter()
        .filter(|core| !verifies || core.identity().is_none())
        .filter_map(|core| core.idle_ms(now).map(|idle| (idle, core)))
        .max_by_key(|(idle, _)| *idle)
        .filter(|(idle, _)| *idle >= config.idle_close_ms)
}

/// Closes a connection that has not authenticated `ms` after it was accepted, so that
/// half-open handshakes cannot hold `max_connections` slots for long.
async fn handshake_deadline(core: Weak<ConnCore>, ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
    let Some(core) = core.upgrade() else { return };
    if core.identity().is_none() && !core.is_closed() {
        let peer = &core.peer;
        warn!("authentication of the client at {peer} refused: timed out after {ms} ms");
        core.shutdown(format!("did not authenticate within {ms} ms"));
    }
}

type OnShutdown = Box<dyn FnOnce() + Send>;

/// A listening endpoint. Dropping it stops accepting and closes every connection it
/// accepted.
pub struct Listener {
    local_addr: SocketAddr,
    accept: Option<AbortHandle>,
    conns: ConnSet,
    on_shutdown: Mutex<Option<OnShutdown>>,
}

impl Listener {
    pub(crate) fn new(
        local_addr: SocketAddr,
        accept: Option<AbortHandle>,
        conns: ConnSet,
        on_shutdown: Option<OnShutdown>,
    ) -> Listener {
        Listener {
            local_addr,
            accept,
            conns,
            on_shutdown: Mutex::new(on_shutdown),
        }
    }

    /// The address it listens on (with the port chosen for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The live accepted connections, counted by the role their peer proved: for the
    /// servers' metrics.
    pub fn peer_counts(&self) -> PeerCounts {
        let mut n = PeerCounts::default();
        for who in self.conns.peers() {
            match who.as_deref().map(|w| &w.role) {
                Some(crate::Role::Server) => n.servers += 1,
                Some(crate::Role::Client(_)) => n.clients += 1,
                None => n.unauthenticated += 1,
            }
        }
        n
    }

    /// Closes every connection whose peer authenticated as `name`, whichever key of it
    /// (a client just revoked); returns how many there were.
    pub fn close_peer(&self, name: &str) -> usize {
        self.conns.close_identity(name, None, "its key was revoked")
    }

    /// Closes every connection whose peer authenticated with key `key_id` of `name` (a
    /// key revoked, or superseded by a new key of the name); returns how many.
    pub fn close_key(&self, name: &str, key_id: &KeyId) -> usize {
        self.conns
            .close_identity(name, Some(key_id), "its key was revoked")
    }

    /// Stops accepting and closes every accepted connection.
    pub fn shutdown(&self) {
        if let Some(a) = &self.accept {
            a.abort();
        }
        if let Some(f) = self.on_shutdown.lock().take() {
            f();
        }
        self.conns.close_all("listener shut down");
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.shutdown();
    }
}
