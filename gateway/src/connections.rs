//! Accepting connections with time limits: a connection that sends no
//! complete request head within [`HEADER_READ_TIMEOUT`] (slowloris, or a
//! keep-alive connection left idle that long) is closed, and a request body
//! that stops arriving for [`BODY_READ_TIMEOUT`] fails. `axum::serve` sets
//! no timer, so hyper's header timeout never fires there; this loop is
//! `axum::serve` with the timer, the same graceful shutdown (stop
//! accepting, let in-flight responses finish) and nothing else.
use std::future::Future;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::ServiceExt;

/// Longest wait for a request's head, from the connection's start or the
/// end of its previous response (so also the keep-alive idle limit).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest pause while a request body is arriving.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves `app` on `listener` until `shutdown` resolves, then waits for the
/// connections' in-flight responses (idle ones close at once).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
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
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
