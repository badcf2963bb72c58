//! `/health` and `/ready`, for load balancers and cluster gateways (open
//! without the API key; they say nothing about the models).
//!
//! - `/health`: 200 while the process serves HTTP.
//! - `/ready`: 200 when a request could be served now: a model of its own,
//!   or an upstream answering its probe that serves one; 503 otherwise.
use axum::extract::State;
use axum::http::StatusCode;

use crate::state::AppState;

/// Liveness.
#[utoipa::path(get, path = "/health", tag = "health",
    responses((status = 200, description = "The server is up", body = String, content_type = "text/plain")))]
pub async fn health() -> &'static str {
    "ok"
}

/// Readiness: some model can be served now.
#[utoipa::path(get, path = "/ready", tag = "health",
    responses(
        (status = 200, description = "A model can be served", body = String, content_type = "text/plain"),
        (status = 503, description = "No model can be served now", body = String, content_type = "text/plain")))]
pub async fn ready(State(state): State<AppState>) -> (StatusCode, &'static str) {
    let local = !state.registry.list().is_empty();
    let remote = state.registry.upstreams().is_some_and(|u| {
        u.nodes()
            .iter()
            .any(|n| n.available() && !n.models().is_empty())
    });
    if local || remote {
        (StatusCode::OK, "ready")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "no model can be served now",
        )
    }
}
