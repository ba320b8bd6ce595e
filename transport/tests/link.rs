//! `Link`, the reconnecting connection every metadata, data and peer call goes through:
//! callers that find no live connection make one between them, a closed one is never
//! handed out, and the count of connections made moves once per connection.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

mod common;

use common::{endpoint, server};
use std::sync::Arc;
use transport::{Backend, Link, TransportConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_share_one_connection_and_one_reconnect() {
    for backend in [Backend::Mem, Backend::Tcp] {
        let srv = server(backend, TransportConfig::default()).await;
        let ep = endpoint(backend, TransportConfig::default());
        let link = Arc::new(Link::new(srv.addr.clone()));
        assert!(
            !link.is_open(),
            "{backend:?}: nothing before the first call"
        );

        let calls = |link: Arc<Link>| {
            let ep = ep.clone();
            tokio::spawn(async move { link.get_counted(&ep).await.unwrap() })
        };
        let first: Vec<_> = (0..16).map(|_| calls(link.clone())).collect();
        for c in first {
            let (conn, made) = c.await.unwrap();
            assert_eq!(made, 1, "{backend:?}: sixteen callers, one connection");
            assert!(!conn.is_closed());
        }
        assert!(link.is_open());

        // The connection breaks: the next callers make exactly one new one, and none
        // of them gets the closed one.
        let (old, _) = link.get_counted(&ep).await.unwrap();
        old.close();
        assert!(
            !link.is_open(),
            "{backend:?}: a closed connection is not open"
        );
        let again: Vec<_> = (0..16).map(|_| calls(link.clone())).collect();
        for c in again {
            let (conn, made) = c.await.unwrap();
            assert_eq!(made, 2, "{backend:?}: one reconnect between them");
            assert!(
                !conn.is_closed(),
                "{backend:?}: never the closed connection"
            );
        }

        // A connect that fails counts nothing.
        link.get(&ep).await.unwrap().close();
        link.set_addr("127.0.0.1:1");
        assert!(link.get_counted(&ep).await.is_err());
        link.set_addr(&srv.addr);
        assert_eq!(link.get_counted(&ep).await.unwrap().1, 3, "{backend:?}");
    }
}
