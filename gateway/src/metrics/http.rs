//! The HTTP side: counting every routed request by model, API family, route
//! and status ([`track`]), and serving `GET /metrics` ([`handler`]).
//!
//! The model is known only deep in a handler (after its body is parsed and
//! the name resolved): [`crate::core::infer`] notes it with [`note_model`]
//! in a slot [`track`] opens for the request (a task-local).
use std::sync::{Arc, Mutex};

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::metrics;
use crate::state::AppState;

tokio::task_local! {
    static MODEL: Arc<Mutex<Option<String>>>;
}

/// Names the model the current request runs on (no effect outside [`track`]).
pub fn note_model(model: &str) {
    let _ = MODEL.try_with(|slot| {
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(model.to_string());
    });
}

/// The API family of a path: `ollama` (`/api/…`), `openai` (`/v1/…`) or `other`.
fn api_of(path: &str) -> &'static str {
    if path.starts_with("/api/") {
        "ollama"
    } else if path == "/v1" || path.starts_with("/v1/") {
        "openai"
    } else {
        "other"
    }
}

/// Middleware on the routes: counts each request once its response head is
/// ready (a stream's status is its first line's).
pub async fn track(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    let slot = Arc::new(Mutex::new(None));
    let response = MODEL.scope(Arc::clone(&slot), next.run(request)).await;
    let model = slot
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .unwrap_or_default();
    metrics()
        .requests
        .with_label_values(&[
            model.as_str(),
            api_of(&route),
            route.as_str(),
            response.status().as_str(),
        ])
        .inc();
    response
}

/// `GET /metrics`: every family in Prometheus's text format.
pub async fn handler(State(state): State<AppState>) -> Response {
    let registry = Arc::clone(&state.registry);
    match tokio::task::spawn_blocking(move || super::scrape::render(&registry)).await {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => crate::core::error::OllamaError(crate::core::error::ApiError::Internal(format!(
            "collecting the metrics failed: {e}"
        )))
        .into_response(),
    }
}
