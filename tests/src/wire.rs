//! A hand-made client of the metadata server: one authenticated connection, no kernel,
//! no caches, each call naming the user it is made for. Tests of what the server itself
//! refuses (permissions, capabilities, grants) speak the wire through it.

use crate::InProcessCluster;
use proto::meta::{fs, Caller, MetaRequest, OpenAccess};
use proto::{Attr, ClientId, InodeId, ProtoError, Request, Rpc, WireError};
use transport::{Connection, Endpoint, TransportError};

/// Largest request a wire client sends (the transport's default message limit).
const LIMIT_BYTES: usize = 1 << 17;

/// One connection to the metadata server and the client id its `Hello` got.
pub struct WireClient {
    /// The connection.
    pub conn: Connection,
    /// This client's id, for requests that name one (open, create, locks).
    pub client: ClientId,
    _ep: Endpoint,
}

impl WireClient {
    /// Connects through `ep` (with its credentials) and says hello as `name`.
    pub async fn on(ep: Endpoint, cluster: &InProcessCluster, name: &str) -> WireClient {
        let conn = ep
            .connect(&cluster.meta_addr())
            .await
            .expect("connect to the metadata server");
        let mut w = WireClient {
            conn,
            client: ClientId(0),
            _ep: ep,
        };
        let hello = fs::Hello { name: name.into() };
        w.client = w.call(&Caller::NOBODY, hello).await.expect("hello");
        w
    }

    /// A client holding the cluster's administrator key (every capability, no squash):
    /// the user each call names is what the server judges.
    pub async fn admin(cluster: &InProcessCluster, name: &str) -> WireClient {
        WireClient::on(cluster.endpoint(), cluster, name).await
    }

    /// Sends `req` as it is (with whatever caller it names, or none). A refusal is the
    /// server's error; a failed connection or codec fails the test.
    pub async fn send<R: Rpc<Envelope = MetaRequest>>(
        &self,
        req: &Request<R>,
    ) -> Result<R::Reply, WireError> {
        transport::rpc::call(&self.conn, req, LIMIT_BYTES)
            .await
            .map_err(|e: Refusal| e.0)
    }

    /// Sends `req` made for `who`.
    pub async fn call<R: Rpc<Envelope = MetaRequest>>(
        &self,
        who: &Caller,
        req: R,
    ) -> Result<R::Reply, WireError> {
        self.send(&Request::new(req).with_caller(who.clone())).await
    }

    /// Makes directory `name` in `parent` for `who`.
    pub async fn mkdir(&self, who: &Caller, parent: InodeId, name: &str, perm: u32) -> InodeId {
        let name = name.as_bytes().to_vec();
        let made = self.call(who, fs::Mkdir { parent, name, perm }).await;
        made.expect("mkdir").attr.ino
    }

    /// Creates file `name` in `parent` for `who`, and closes it.
    pub async fn create(&self, who: &Caller, parent: InodeId, name: &str, perm: u32) -> Attr {
        let req = fs::Create {
            parent,
            name: name.as_bytes().to_vec(),
            perm,
            exclusive: true,
            client: self.client,
            access: OpenAccess::ReadWrite,
            append: false,
        };
        let opened = self.call(who, req).await.expect("create");
        self.close(who, opened.session).await;
        opened.attr
    }

    /// Ends an open session.
    pub async fn close(&self, who: &Caller, session: proto::SessionId) {
        let release = fs::Release {
            session,
            commit: None,
        };
        self.call(who, release).await.expect("release");
    }
}

/// A wire call's refusal; a broken connection or codec panics instead.
struct Refusal(WireError);

impl From<WireError> for Refusal {
    fn from(e: WireError) -> Refusal {
        Refusal(e)
    }
}

impl From<TransportError> for Refusal {
    fn from(e: TransportError) -> Refusal {
        panic!("the connection failed: {e}")
    }
}

impl From<ProtoError> for Refusal {
    fn from(e: ProtoError) -> Refusal {
        panic!("the codec failed: {e}")
    }
}
