//! The accept loop of `rate-ctl serve`, fit for hostile clients (instead
//! of `axum::serve`, which reads headers without a deadline):
//!
//! - a request's head must arrive within [`HEADER_READ_TIMEOUT`] (also the
//!   wait for the next request on a kept-alive connection), else the
//!   connection is closed;
//! - a connection that moves no byte either way for [`IDLE_TIMEOUT`]
//!   (a body sent a byte a minute) is closed;
//! - at most `max_connections` connections are served at once; the next
//!   one is answered `503` with the API's JSON error body and closed.
//!
//! Body limits stay where they were (axum's per-route limits, applied
//! before the handler and so before its token check has any cost).

use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};
use tracing::{debug, warn};

/// Longest time a request's head may take to arrive.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest time a connection may move no byte while the server waits to
/// read (longer than the long-poll's hold).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default cap on connections served at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Descriptors kept out of the connection cap (store pool, log, listener).
const FD_RESERVE: u64 = 64;

/// Counters shown in `/metrics`.
#[derive(Default)]
pub struct ConnStats {
    /// Connections served now.
    pub open: AtomicU64,
    /// Connections refused with 503 because the cap was reached.
    pub refused: AtomicU64,
}

/// Raises this process's soft descriptor limit to its hard limit; returns
/// the soft limit in force.
pub fn raise_nofile() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the rlimit we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return 1024;
    }
    if r.rlim_cur < r.rlim_max {
        let want = libc::rlimit {
            rlim_cur: r.rlim_max,
            rlim_max: r.rlim_max,
        };
        // SAFETY: setrlimit reads the rlimit we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0 {
            r.rlim_cur = r.rlim_max;
        }
    }
    r.rlim_cur
}

/// The cap actually used: `wanted`, at most what the descriptor limit
/// leaves after [`FD_RESERVE`].
pub fn effective_cap(wanted: usize, nofile: u64) -> usize {
    let room = nofile.saturating_sub(FD_RESERVE).max(1);
    wanted
        .min(usize::try_from(room).unwrap_or(usize::MAX))
        .max(1)
}

const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
Content-Type: application/json\r\n\
Retry-After: 1\r\n\
Connection: close\r\n\
Content-Length: 95\r\n\
\r\n\
{\"error\":{\"field\":null,\"message\":\"too many connections: this server's cap is reached, retry\"}}\n";

/// A connection's byte stream: TCP, or TLS over TCP.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// Serves `router` on `listener` until the future is dropped; over TLS
/// when `tls` is given (the handshake must end within
/// [`HEADER_READ_TIMEOUT`]).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    max_connections: usize,
    stats: Arc<ConnStats>,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> io::Result<()> {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let slots = Arc::new(Semaphore::new(max_connections));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(true);
    let builder = Arc::new(builder);
    loop {
        let (mut sock, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Out of descriptors (or a connection reset before accept):
                // wait instead of spinning.
                debug!(error = %e, "accept failed");
                if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) {
                    warn!(error = %e, "accept: out of descriptors");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            stats.refused.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(2), async {
                    let _ = sock.write_all(BUSY).await;
                    let _ = sock.shutdown().await;
                })
                .await;
            });
            continue;
        };
        let _ = sock.set_nodelay(true);
        let router = router.clone();
        let builder = builder.clone();
        let stats = stats.clone();
        let acceptor = acceptor.clone();
        stats.open.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let stream: Box<dyn Stream> = match acceptor {
                None => Box::new(sock),
                Some(a) => match tokio::time::timeout(HEADER_READ_TIMEOUT, a.accept(sock)).await {
                    Ok(Ok(s)) => Box::new(s),
                    Ok(Err(e)) => {
                        debug!(%peer, error = %e, "TLS handshake failed");
                        stats.open.fetch_sub(1, Ordering::Relaxed);
                        return;
                    }
                    Err(_) => {
                        debug!(%peer, "TLS handshake timed out");
                        stats.open.fetch_sub(1, Ordering::Relaxed);
                        return;
                    }
                },
            };
            let io = TokioIo::new(Idle::new(stream, IDLE_TIMEOUT));
            let svc = WithPeer { router, peer };
            if let Err(e) = builder.serve_connection(io, svc).await {
                debug!(%peer, error = %e, "connection closed");
            }
            stats.open.fetch_sub(1, Ordering::Relaxed);
            drop(permit);
        });
    }
}

/// The router, with the connection's peer address put on every request
/// (the audit log records it).
struct WithPeer {
    router: Router,
    peer: std::net::SocketAddr,
}

impl hyper::service::Service<hyper::Request<hyper::body::Incoming>> for WithPeer {
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = axum::routing::future::RouteFuture<std::convert::Infallible>;

    fn call(&self, mut req: hyper::Request<hyper::body::Incoming>) -> Self::Future {
        req.extensions_mut()
            .insert(super::auth::ClientAddr(self.peer));
        let mut router = self.router.clone();
        // Router is always ready (axum documents poll_ready as Ready).
        tower_service::Service::call(&mut router, req.map(axum::body::Body::new))
    }
}

/// A stream that fails its pending read once no byte moved either way for
/// `idle`, and gives the answers hyper writes itself (a request it could
/// not parse: 400, 431, 505, with an empty body) the API's JSON error body.
struct Idle<S> {
    inner: S,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
    /// Bytes of a rewritten answer not yet written.
    pending: Vec<u8>,
}

impl<S> Idle<S> {
    fn new(inner: S, idle: Duration) -> Idle<S> {
        Idle {
            inner,
            idle,
            deadline: Box::pin(tokio::time::sleep(idle)),
            pending: Vec::new(),
        }
    }

    fn moved(&mut self) {
        self.deadline.as_mut().reset(Instant::now() + self.idle);
    }
}

/// The JSON version of `head` if it is a whole bodiless 4xx/5xx answer
/// (only hyper writes those: every answer of the router has a body).
pub fn with_json_body(head: &[u8]) -> Option<Vec<u8>> {
    if !head.ends_with(b"\r\n\r\n") || head.len() > 1024 {
        return None;
    }
    let text = std::str::from_utf8(head).ok()?;
    let status_line = text.lines().next()?;
    let code = status_line.strip_prefix("HTTP/1.1 ")?.get(..3)?;
    if !(code.starts_with('4') || code.starts_with('5')) {
        return None;
    }
    let lower = text.to_ascii_lowercase();
    if !lower.contains("\r\ncontent-length: 0\r\n") {
        return None;
    }
    let message = match code {
        "400" => "malformed request: the request line or a header is not valid HTTP/1.1 (e.g. a control character in a header value)",
        "431" => "request header fields too large",
        "505" => "HTTP version not supported",
        _ => status_line.get(13..).unwrap_or("error"),
    };
    let body = serde_json::json!({"error": {"field": null, "message": message}}).to_string();
    Some(
        format!(
            "{status_line}\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

impl<S: AsyncWrite + Unpin> Idle<S> {
    /// Writes what is pending; Ready(Ok) once nothing is.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.pending.is_empty() {
            match Pin::new(&mut self.inner).poll_write(cx, &self.pending) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => {
                    self.pending.drain(..n);
                    self.moved();
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Idle<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    self.moved();
                }
                Poll::Ready(r)
            }
            Poll::Pending => match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "idle connection closed",
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Idle<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.drain(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        }
        if let Some(json) = with_json_body(buf) {
            self.pending = json;
            // Accepted whole; written by this and the next calls.
            return match self.drain(cx) {
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                _ => Poll::Ready(Ok(buf.len())),
            };
        }
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.moved();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.drain(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut self.inner).poll_flush(cx),
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.drain(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut self.inner).poll_shutdown(cx),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_answer_is_well_formed() {
        let text = std::str::from_utf8(BUSY).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(body.len(), len);
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert!(v["error"]["message"].as_str().unwrap().contains("too many"));
    }

    #[test]
    fn hypers_bodiless_errors_get_the_json_body() {
        let head = b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\ndate: Fri, 27 Nov 2026 15:05:24 GMT\r\n\r\n";
        let out = String::from_utf8(with_json_body(head).unwrap()).unwrap();
        let (h, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(h.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{h}");
        assert!(
            h.contains(&format!("content-length: {}", body.len())),
            "{h}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("malformed"));
        // A router answer (with a body) or a 2xx is left alone.
        assert!(
            with_json_body(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\n\r\n").is_none()
        );
        assert!(with_json_body(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_none());
        assert!(
            with_json_body(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n{}").is_none()
        );
    }

    #[test]
    fn cap_leaves_room_for_the_reserve() {
        assert_eq!(effective_cap(4096, 1024), 960);
        assert_eq!(effective_cap(100, 1024), 100);
        assert_eq!(effective_cap(100, 10), 1);
    }
}
