//! The `/metrics` endpoint (HTTP/1.1 through hyper) and the scraper `tessera top` and
//! the tests read it with.

use crate::{Metrics, TelemetryError};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Connections served at once; more are closed as they come (a scraper is a handful
/// of Prometheus servers and `tessera top`, never a crowd).
pub const MAX_CONCURRENT_SCRAPES: usize = 8;

/// How long a connection may take to send its request's head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// How long one connection to the endpoint may last, or one scrape may take.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest answer [`scrape`] reads.
pub const MAX_SCRAPE_BYTES: usize = 16 << 20;

/// The endpoint, serving until dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl MetricsServer {
    /// Binds `listen` and serves `metrics` on the current tokio runtime.
    pub async fn start(
        listen: &str,
        metrics: Arc<Metrics>,
    ) -> Result<MetricsServer, TelemetryError> {
        let bind_err = |source| TelemetryError::Bind {
            addr: listen.to_string(),
            source,
        };
        let listener = TcpListener::bind(listen).await.map_err(bind_err)?;
        let addr = listener.local_addr().map_err(bind_err)?;
        let task = tokio::spawn(accept_loop(listener, metrics));
        tracing::info!(%addr, "metrics endpoint serving /metrics");
        if !addr.ip().is_loopback() {
            tracing::warn!(%addr, "the metrics endpoint is reachable from other hosts, \
                           without authentication (paths never appear in it)");
        }
        Ok(MetricsServer { addr, task })
    }

    /// Starts the endpoint `config` asks for (`None` when it asks for none) and writes
    /// its address to `config.addr_file`, if set.
    pub async fn from_config(
        config: &crate::MetricsConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Option<MetricsServer>, TelemetryError> {
        if !config.enabled() {
            return Ok(None);
        }
        let server = MetricsServer::start(&config.listen, metrics).await?;
        let path = &config.addr_file;
        if !path.as_os_str().is_empty() {
            let fail = |source| TelemetryError::AddrFile {
                path: path.clone(),
                source,
            };
            let mut tmp = path.clone().into_os_string();
            tmp.push(".tmp");
            let tmp = std::path::PathBuf::from(tmp);
            std::fs::write(&tmp, server.local_addr().to_string()).map_err(fail)?;
            std::fs::rename(&tmp, path).map_err(fail)?;
        }
        Ok(Some(server))
    }

    /// The address the endpoint is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

async fn accept_loop(listener: TcpListener, metrics: Arc<Metrics>) {
    let turns = Arc::new(Semaphore::new(MAX_CONCURRENT_SCRAPES));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of descriptors, most likely: wait instead of spinning.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        // All turns taken (perhaps by idle connections): this one is closed at once
        // rather than left to wait, so a few idle peers cannot stall the accept loop.
        let Ok(turn) = turns.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| answer(req, metrics.clone()));
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(SCRAPE_TIMEOUT, conn).await;
            drop(turn);
        });
    }
}

async fn answer(
    req: Request<Incoming>,
    metrics: Arc<Metrics>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let reply = |status, kind: &'static str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        if let Ok(v) = kind.parse() {
            r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
        }
        Ok(r)
    };
    if req.uri().path() != "/metrics" {
        return reply(StatusCode::NOT_FOUND, "text/plain", "see /metrics\n".into());
    }
    // The hooks may read a store: off the async workers.
    match tokio::task::spawn_blocking(move || metrics.render()).await {
        Ok(text) => reply(StatusCode::OK, "text/plain; version=0.0.4", text),
        Err(e) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            e.to_string(),
        ),
    }
}

/// Fetches `http://{addr}/metrics` and returns its text.
pub async fn scrape(addr: &str) -> Result<String, TelemetryError> {
    let fail = |msg: String| TelemetryError::Scrape {
        addr: addr.to_string(),
        msg,
    };
    let get = async {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| fail(e.to_string()))?;
        tokio::spawn(conn);
        let req = Request::get("/metrics")
            .header(hyper::header::HOST, addr)
            .body(Full::new(Bytes::new()))
            .map_err(|e| fail(e.to_string()))?;
        let res = send
            .send_request(req)
            .await
            .map_err(|e| fail(e.to_string()))?;
        if res.status() != StatusCode::OK {
            return Err(fail(format!("status {}", res.status())));
        }
        let limited = http_body_util::Limited::new(res.into_body(), MAX_SCRAPE_BYTES);
        let body = limited.collect().await.map_err(|e| fail(e.to_string()))?;
        String::from_utf8(body.to_bytes().to_vec()).map_err(|e| fail(e.to_string()))
    };
    tokio::time::timeout(SCRAPE_TIMEOUT, get)
        .await
        .map_err(|_| fail("timed out".into()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_scrape_over_http_reads_what_the_registry_renders() {
        let m = Metrics::new().unwrap();
        let c = m.counter("t_seen_total", "seen").unwrap();
        c.inc_by(5);
        let server = MetricsServer::start("127.0.0.1:0", m).await.unwrap();
        let addr = server.local_addr().to_string();
        let s = crate::text::parse(&scrape(&addr).await.unwrap()).unwrap();
        assert_eq!(s.sum("t_seen_total"), 5.0);
        drop(server);
        // Dropped: the port answers no more.
        tokio::time::timeout(Duration::from_secs(5), async {
            while scrape(&addr).await.is_ok() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap();
    }
}
