//! The HTTP application: the routes of every API family ([`crate::api`]) over
//! one [`AppState`], and serving it until a signal.
//!
//! Layers, outermost first: the path's trailing slash trimmed, request id (`x-request-id`, generated when absent
//! and echoed), the request's span ([`HttpSpans`]: its id in every log line),
//! panic → 500, CORS, the origin check and bearer auth
//! ([`crate::security::guard`], each route's class from the route table
//! [`crate::api::routes`]), then, on routed requests only, the body read
//! whole under its bounds ([`crate::bodies`]: size, the memory of all bodies,
//! time; not on `/api/blobs` uploads, which their handler streams to disk and
//! caps at `[server] pull_max_bytes`): an unauthenticated or unrouted body is
//! never buffered. Routed requests are counted
//! ([`crate::metrics::http::track`]).
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};
use tower_http::normalize_path::NormalizePath;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::timeout::RequestBodyTimeoutLayer;
use tower_http::trace::TraceLayer;

use crate::api::routes::{family_error, Body, ROUTES};
use crate::bodies::{BodyBudget, Refusal};
use crate::core::error::{ApiError, OllamaError};
use crate::metrics;
use crate::pool::registry::Registry;
use crate::security::guard::{auth, origin_guard};
use crate::state::AppState;
use crate::telemetry::http::HttpSpans;

/// Server options beyond the models.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// The largest body of one request.
    pub max_body_bytes: usize,
    /// Bytes of request bodies in memory, all requests together.
    pub body_memory_bytes: usize,
    /// The longest a whole request body may take to arrive.
    pub body_timeout: Duration,
    pub connections: crate::connections::ConnectionLimits,
    /// How long a shutdown waits for in-flight requests before it cancels
    /// them (each then ends with an error line); the process is gone at most
    /// [`SHUTDOWN_HARD_STOP`] later.
    pub shutdown_grace: Duration,
}

/// After the grace period and the cancellation, the longest a shutdown may
/// still take (engines stopping) before the process exits anyway.
pub const SHUTDOWN_HARD_STOP: Duration = Duration::from_secs(5);

/// Headers browsers may send cross-origin: Ollama's list, which covers the
/// OpenAI SDK's `x-stainless-*` headers.
const CORS_HEADERS: &[&str] = &[
    "authorization",
    "content-type",
    "user-agent",
    "accept",
    "x-requested-with",
    "openai-beta",
    "x-api-key",
    "anthropic-version",
    "anthropic-beta",
    "anthropic-dangerous-direct-browser-access",
    "x-stainless-arch",
    "x-stainless-async",
    "x-stainless-custom-poll-interval",
    "x-stainless-helper-method",
    "x-stainless-lang",
    "x-stainless-os",
    "x-stainless-package-version",
    "x-stainless-poll-helper",
    "x-stainless-read-timeout",
    "x-stainless-retry-count",
    "x-stainless-runtime",
    "x-stainless-runtime-version",
    "x-stainless-timeout",
];

impl HttpSettings {
    /// The bound on the bodies in memory these settings ask for.
    pub fn body_budget(&self) -> BodyBudget {
        BodyBudget::new(
            self.body_memory_bytes,
            self.max_body_bytes,
            self.body_timeout,
        )
    }
}

/// The whole application, its request bodies read within `bodies`.
pub fn app(state: AppState, bodies: Arc<BodyBudget>) -> Router {
    let x_request_id = HeaderName::from_static("x-request-id");
    let origins = state.security.origins.clone();
    let cors = CorsLayer::new()
        .allow_origin(AllowOrigin::predicate(move |origin, parts| {
            let host = parts
                .headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok());
            origin
                .to_str()
                .is_ok_and(|o| origins.origin_allowed(o, host))
        }))
        .allow_methods([
            Method::GET,
            Method::POST,
            Method::PUT,
            Method::DELETE,
            Method::HEAD,
            Method::OPTIONS,
        ])
        .allow_headers(AllowHeaders::list(
            CORS_HEADERS.iter().map(|h| HeaderName::from_static(h)),
        ));
    // The table's routes ([`crate::api::routes`]); uploads are larger than
    // any other body: they have their own cap (`[server] pull_max_bytes`),
    // checked as they stream.
    let (mut routes, mut uploads) = (Router::new(), Router::new());
    for route in ROUTES.iter().filter(|r| r.enabled()) {
        match route.body {
            Body::Whole => routes = routes.route(route.path, route.method_router()),
            Body::Streamed => uploads = uploads.route(route.path, route.method_router()),
        }
    }
    let uploads = uploads
        .route_layer(middleware::from_fn(metrics::http::track))
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(RequestBodyTimeoutLayer::new(
            crate::connections::BODY_READ_TIMEOUT,
        ));
    let routes = routes
        // Keys' limits and the models' fair queues, on bodies read whole.
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            crate::tenancy::http::gate,
        ))
        .route_layer(middleware::from_fn_with_state(bodies, read_body))
        .route_layer(middleware::from_fn(metrics::http::track))
        .layer(middleware::from_fn(crate::pool::upstream::hop_guard))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(DefaultBodyLimit::disable())
        .merge(uploads)
        .layer(middleware::from_fn_with_state(state.clone(), origin_guard))
        .layer(cors)
        // A bug must cost one request a 500, never the server.
        .layer(CatchPanicLayer::custom(panic_response))
        .layer(PropagateRequestIdLayer::new(x_request_id.clone()))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(HttpSpans)
                .on_response(HttpSpans),
        )
        .layer(SetRequestIdLayer::new(x_request_id, MakeRequestUuid))
        .with_state(state);
    // `/api/tags/` is `/api/tags`, as Ollama answers it: the path loses its
    // trailing slash before routing (a layer on the routes would run after).
    Router::new().fallback_service(NormalizePath::trim_trailing_slash(routes))
}

fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let detail = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("unknown panic");
    tracing::error!("handler panicked: {detail}");
    OllamaError(ApiError::Internal(format!("internal error: {detail}"))).into_response()
}

async fn not_found(request: Request) -> Response {
    let path = request.uri().path().to_string();
    family_error(
        &path,
        ApiError::NotFound(format!("no route {} {path}", request.method())),
    )
}

/// Reads the body whole ([`BodyBudget::read`]) before the handler runs; a
/// refusal is answered in the route's family, and the connection closed
/// when its body was not read to its end.
async fn read_body(
    State(bodies): State<Arc<BodyBudget>>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    if axum::body::HttpBody::size_hint(&body).exact() == Some(0) {
        return next.run(Request::from_parts(parts, body)).await;
    }
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let expects_continue = parts.headers.contains_key(header::EXPECT);
    let refusal = match bodies.read(body, declared, expects_continue).await {
        Ok(bytes) => {
            let request = Request::from_parts(parts, axum::body::Body::from(bytes));
            return next.run(request).await;
        }
        Err(refusal) => refusal,
    };
    let message = refusal.to_string();
    let error = match refusal {
        Refusal::TooLarge { .. } => ApiError::PayloadTooLarge(message),
        Refusal::NoRoom { .. } => ApiError::Unavailable(message),
        Refusal::TimedOut { .. } => ApiError::RequestTimeout(message),
        Refusal::Broken(_) | Refusal::TooDeep { .. } => ApiError::bad_request(message),
        Refusal::TooManyValues { .. } => ApiError::PayloadTooLarge(message),
    };
    let mut response = family_error(parts.uri.path(), error);
    let headers = response.headers_mut();
    match refusal {
        Refusal::NoRoom { .. } => {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        // Read to its end: the connection can go on.
        Refusal::TooDeep { .. } | Refusal::TooManyValues { .. } => {}
        _ => {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
    }
    response
}

/// The body of a request (read whole before the handler by [`read_body`],
/// so an error here is a bug or a route outside it).
pub fn body_bytes(
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<axum::body::Bytes, ApiError> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge(format!("request body too large: {e}"))
        } else if timed_out(&e) {
            ApiError::RequestTimeout(format!(
                "the request body did not arrive within {} s",
                crate::connections::BODY_READ_TIMEOUT.as_secs()
            ))
        } else {
            ApiError::bad_request(format!("could not read the request body: {e}"))
        }
    })
}

/// Whether `error` comes from the body read timeout.
pub(crate) fn timed_out(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if e.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        cause = e.source();
    }
    false
}

/// Serves `app` on `addr` until SIGINT or SIGTERM, then stops accepting
/// connections, lets in-flight responses (streams included) finish for up to
/// `http.shutdown_grace`, cancels those still running (each ends with an
/// error line), and stops the engines; the process exits at most
/// [`SHUTDOWN_HARD_STOP`] after the grace period whatever happens. A second
/// signal exits at once.
pub async fn serve(addr: SocketAddr, state: AppState, http: HttpSettings) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    eprintln!("hypura: listening on http://{local}");
    crate::bodies::return_freed_memory();
    let bodies = Arc::new(http.body_budget());
    let registry = Arc::clone(&state.registry);
    let housekeeping = tokio::spawn({
        let registry = Arc::clone(&registry);
        let bodies = Arc::clone(&bodies);
        async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let registry = Arc::clone(&registry);
                let bodies = Arc::clone(&bodies);
                let _ = tokio::task::spawn_blocking(move || {
                    registry.run_pending_tasks();
                    bodies.trim_if_due();
                })
                .await;
            }
        }
    });
    crate::connections::serve(
        listener,
        app(state, bodies),
        http.connections,
        shutdown_signal(Arc::clone(&registry), http.shutdown_grace),
    )
    .await?;
    housekeeping.abort();
    eprintln!("hypura: requests finished, stopping the models");
    tokio::task::spawn_blocking(move || registry.shutdown())
        .await
        .map_err(std::io::Error::other)?;
    Ok(())
}

/// Takes SIGHUP over from its default disposition (ending the process at
/// once, streams cut), so that a closed terminal or a `kill -HUP` meant to
/// reload never stops the server: from this call on, each one is logged and
/// `reload` runs on a blocking thread, its outcome logged. Call it inside
/// the runtime, as early as possible.
pub fn handle_hangups(reload: impl Fn() -> String + Send + Sync + 'static) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = signal(SignalKind::hangup())?;
    let reload = Arc::new(reload);
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            let reload = Arc::clone(&reload);
            match tokio::task::spawn_blocking(move || reload()).await {
                Ok(outcome) => eprintln!("hypura: SIGHUP: {outcome}"),
                Err(e) => eprintln!("hypura: SIGHUP: reloading failed: {e}"),
            }
        }
    });
    Ok(())
}

async fn shutdown_signal(registry: Arc<Registry>, grace: Duration) {
    wait_for_signal().await;
    eprintln!(
        "hypura: shutting down, finishing in-flight requests for up to {} s (signal again to exit now)",
        grace.as_secs_f64()
    );
    tokio::spawn(async {
        wait_for_signal().await;
        eprintln!("hypura: exiting now");
        std::process::exit(130);
    });
    // Threads, not tasks: the runtime is busy ending the server meanwhile.
    std::thread::spawn(move || {
        std::thread::sleep(grace);
        eprintln!("hypura: grace period over, cancelling in-flight requests");
        registry.cancel_in_flight();
        std::thread::sleep(SHUTDOWN_HARD_STOP);
        eprintln!("hypura: shutdown took too long, exiting");
        std::process::exit(1);
    });
}

async fn wait_for_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
