//! `Link`, the reconnecting connection every metadata, data and peer call goes through:
//! callers that find no live connection make one between them, a closed one is never
//! handed out, and the count of connections made moves once per connection.
// A panic in a test helper fails the test, as unwrap in a #[test] does.
#![allow(clippy::unwrap_used)]

mod common;

use common::{endpoint, op, server};
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

/// Guards the failover of a link with several addresses: a server that stopped
/// listening is passed over for the next address in the same call, the address that
/// answered is kept, and a round with nobody listening fails instead of looping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_of_several_addresses_moves_on_from_one_that_is_down() {
    for backend in [Backend::Mem, Backend::Tcp] {
        let a = server(backend, TransportConfig::default()).await;
        let b = server(backend, TransportConfig::default()).await;
        let ep = endpoint(backend, TransportConfig::default());
        // Nobody listens on port 1: the first address is skipped at once.
        let link = Link::new(format!("127.0.0.1:1, {},{}", a.addr, b.addr));
        assert_eq!(link.addrs().len(), 3, "{backend:?}");
        let (conn, made) = link.get_counted(&ep).await.unwrap();
        assert_eq!(made, 1, "{backend:?}");
        assert_eq!(link.addr(), a.addr, "{backend:?}: the first that answered");

        // A goes away: its connection closes, the next call reaches B.
        let a_addr = a.addr.clone();
        drop(a);
        for _ in 0..200 {
            if conn.is_closed() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(conn.is_closed(), "{backend:?}: A's connection closed");
        let (_, made) = link.get_counted(&ep).await.unwrap();
        assert_eq!(made, 2, "{backend:?}");
        assert_eq!(link.addr(), b.addr, "{backend:?}: moved on to B");

        // Nobody left: one round, then the failure of an unreachable server.
        let b_addr = b.addr.clone();
        drop(b);
        let lonely = Link::new(format!("127.0.0.1:1,{a_addr},{b_addr}"));
        let err = lonely.get_counted(&ep).await.unwrap_err();
        assert!(err.never_connected(), "{backend:?}: {err:?}");
        assert_eq!(lonely.made(), 0, "{backend:?}");
    }
}

/// Guards against a link staying on a server that accepts its calls and never answers
/// (stopped with SIGSTOP, hung, its machine paused: the connection stays open): the call
/// that timed out closes the connection and points the link at the next address, so the
/// next call reaches the other server instead of timing out again, for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_timed_out_moves_the_link_to_the_next_address() {
    use bytes::Bytes;
    for backend in [Backend::Mem, Backend::Tcp] {
        let a = server(backend, TransportConfig::default()).await;
        let b = server(backend, TransportConfig::default()).await;
        let config = TransportConfig {
            call_timeout_ms: 300,
            ..TransportConfig::default()
        };
        let ep = endpoint(backend, config);
        let link = Link::new(format!("{},{}", a.addr, b.addr));
        let conn = link.get(&ep).await.unwrap();
        assert_eq!(link.addr(), a.addr, "{backend:?}");
        // A takes the call and says nothing.
        let err = conn
            .call(Bytes::from_static(&[op::HANG]))
            .await
            .unwrap_err();
        assert!(err.is_call_timeout(), "{backend:?}: {err:?}");
        link.call_failed(&conn, &err);
        assert!(
            conn.is_closed(),
            "{backend:?}: the silent connection is closed"
        );
        let (next, made) = link.get_counted(&ep).await.unwrap();
        assert_eq!(made, 2, "{backend:?}");
        assert_eq!(
            link.addr(),
            b.addr,
            "{backend:?}: B first after A's silence"
        );
        let echo = next.call(Bytes::from_static(&[op::ECHO, 7])).await.unwrap();
        assert_eq!(&echo[..], &[op::ECHO, 7], "{backend:?}: B answers");

        // Any other failure leaves the connection and the address alone.
        let other = transport::TransportError::InvalidArgument("not a timeout".into());
        link.call_failed(&next, &other);
        assert!(!next.is_closed(), "{backend:?}");
        assert_eq!(link.addr(), b.addr, "{backend:?}");
        // A timeout on a connection the link no longer holds closes it and moves
        // nothing: the link already moved on.
        link.call_failed(&conn, &err);
        assert_eq!(link.addr(), b.addr, "{backend:?}");
    }
}

/// Guards against a call timeout ending what the server holds for a client that lives
/// on: the connection given up after a timeout must reach the server as broken (it keeps
/// the client's open files and locks for its grace), not as closed by an ended process
/// (which ends them at once). A plain close still reaches it as closed by its peer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_given_up_after_a_timeout_is_broken_for_the_server() {
    use std::time::Duration;
    for backend in [Backend::Mem, Backend::Tcp] {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let server_ep = endpoint(backend, TransportConfig::default());
        let listener = server_ep
            .listen("127.0.0.1:0", Arc::new(common::Silent(tx)))
            .await
            .unwrap();
        let addr = listener.local_addr().to_string();
        let config = TransportConfig {
            call_timeout_ms: 200,
            ..TransportConfig::default()
        };
        let ep = endpoint(backend, config);
        let link = Link::new(addr.clone());
        let conn = link.get(&ep).await.unwrap();
        let err = conn
            .call(bytes::Bytes::from_static(b"x"))
            .await
            .unwrap_err();
        link.call_failed(&conn, &err);
        let how = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
        assert_eq!(how.unwrap(), Some(transport::Closed::Broken), "{backend:?}");
        // One address: the next call connects to it again.
        let again = link.get(&ep).await.unwrap();
        assert!(!again.is_closed(), "{backend:?}");
        again.close();
        let how = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
        assert_eq!(how.unwrap(), Some(transport::Closed::ByPeer), "{backend:?}");
    }
}
