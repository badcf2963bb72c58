//! Accepting connections with limits: a connection that sends no complete
//! request head within [`HEADER_READ_TIMEOUT`] (slowloris, or a keep-alive
//! connection left idle that long) is closed; at most
//! [`ConnectionLimits::max_total`] connections are open at once, at most
//! [`ConnectionLimits::max_per_ip`] from one address, and one more is
//! answered 503 and closed. (Bodies have their own bounds:
//! [`crate::bodies`].) `axum::serve` sets no timer, so hyper's header
//! timeout never fires there; this loop is `axum::serve` with the timer, the
//! caps, the same graceful shutdown (stop accepting, let in-flight
//! responses finish) and nothing else.
use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceExt;

/// Longest wait for a request's head, from the connection's start or the
/// end of its previous response (so also the keep-alive idle limit).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest pause while an upload (`/api/blobs`) is arriving; other bodies
/// must arrive whole within `[server] body_timeout`.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// The default of `[server] max_connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// The default of `[server] max_connections_per_ip`.
pub const DEFAULT_MAX_CONNECTIONS_PER_IP: usize = 128;
/// Refused connections being answered at once; more are closed unanswered.
const MAX_REFUSALS: usize = 64;
/// How long a refused connection's request is read (and dropped) after its
/// 503, so that the client reads the 503 rather than a reset.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// Connections open at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub max_total: usize,
    pub max_per_ip: usize,
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            max_total: DEFAULT_MAX_CONNECTIONS,
            max_per_ip: DEFAULT_MAX_CONNECTIONS_PER_IP,
        }
    }
}

/// The connections open, in all and per client address.
#[derive(Debug, Default)]
struct Open {
    total: usize,
    per_ip: HashMap<IpAddr, usize>,
}

/// One open connection's place in the count, given back when dropped.
struct Slot {
    open: Arc<Mutex<Open>>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.total -= 1;
        if let Some(n) = open.per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.per_ip.remove(&self.ip);
            }
        }
    }
}

/// A place for one more connection from `ip`, or why there is none.
fn admit(open: &Arc<Mutex<Open>>, limits: ConnectionLimits, ip: IpAddr) -> Result<Slot, String> {
    let mut counts = open.lock().unwrap_or_else(PoisonError::into_inner);
    if counts.total >= limits.max_total {
        return Err(format!(
            "the server has {} connections open, its limit ([server] max_connections): retry \
             shortly",
            limits.max_total
        ));
    }
    let from_ip = counts.per_ip.entry(ip).or_default();
    if *from_ip >= limits.max_per_ip {
        return Err(format!(
            "this address has {} connections open, the limit per client ([server] \
             max_connections_per_ip): close some or retry shortly",
            limits.max_per_ip
        ));
    }
    *from_ip += 1;
    counts.total += 1;
    Ok(Slot {
        open: Arc::clone(open),
        ip,
    })
}

/// Answers a connection over the caps with a 503 (in Ollama's shape: its
/// route is not read) and closes it.
async fn refuse(mut stream: TcpStream, message: String) {
    let body = serde_json::json!({ "error": message }).to_string();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let linger = async {
        let _ = stream.write_all(answer.as_bytes()).await;
        let _ = stream.shutdown().await;
        let mut sink = [0u8; 4096];
        while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
    };
    let _ = tokio::time::timeout(REFUSAL_LINGER, linger).await;
}

/// Serves `app` on `listener` until `shutdown` resolves, then waits for the
/// connections' in-flight responses (idle ones close at once).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let open = Arc::new(Mutex::new(Open::default()));
    let refusals = Arc::new(tokio::sync::Semaphore::new(MAX_REFUSALS));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(true);
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // Out of file descriptors and the like: pause instead of spinning.
                Err(e) => {
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let slot = match admit(&open, limits, peer.ip()) {
            Ok(slot) => slot,
            Err(message) => {
                tracing::debug!("refused a connection from {}: {message}", peer.ip());
                if let Ok(permit) = Arc::clone(&refusals).try_acquire_owned() {
                    tokio::spawn(async move {
                        refuse(stream, message).await;
                        drop(permit);
                    });
                }
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let service =
            TowerToHyperService::new(app.clone().map_request(move |request: Request<Incoming>| {
                let mut request = request.map(Body::new);
                // What `into_make_service_with_connect_info` gives handlers.
                request.extensions_mut().insert(ConnectInfo(peer));
                request
            }));
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("connection ended: {e}");
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
