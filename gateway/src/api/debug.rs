//! Test-only routes, present only when the server runs with
//! `HYPURA_RUNNER_TEST_HOOKS=1` (never listed in the OpenAPI document;
//! the route table, [`super::routes`], marks them).
//!
//! `POST /api/debug/abort-runner {"model": NAME}`: the runner of that model
//! aborts, as a failed `GGML_ASSERT` would (404 when the model is not loaded
//! in a live runner).
//!
//! `POST /api/debug/runner-ballast {"model": NAME, "bytes": N}`: the runner of
//! that model takes and keeps N bytes of memory besides the model's (as
//! memory its budget does not see would), for tests of the host limit.
use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::core::error::{ApiError, OllamaError};
use crate::core::validation::ModelName;
use crate::pool::registry::Registry;
use crate::state::AppState;

#[derive(Deserialize)]
pub(crate) struct RunnerBallast {
    model: String,
    bytes: u64,
}

pub(crate) async fn runner_ballast(
    State(state): State<AppState>,
    Json(body): Json<RunnerBallast>,
) -> Result<Json<Value>, OllamaError> {
    let bytes = body.bytes;
    on_live_runner(&state, &body.model, move |registry, name| {
        registry.runner_ballast(name, bytes)
    })
    .await?;
    Ok(Json(json!({"model": body.model, "bytes": body.bytes})))
}

#[derive(Deserialize)]
pub(crate) struct AbortRunner {
    model: String,
}

pub(crate) async fn abort_runner(
    State(state): State<AppState>,
    Json(body): Json<AbortRunner>,
) -> Result<Json<Value>, OllamaError> {
    on_live_runner(&state, &body.model, |registry, name| {
        registry.abort_runner(name)
    })
    .await?;
    Ok(Json(json!({"aborted": body.model})))
}

/// Runs `hook` on the registry for the model named `model` (off the async
/// runtime): 404 when it is not loaded in a live runner (`hook` gives
/// `Ok(false)`).
async fn on_live_runner(
    state: &AppState,
    model: &str,
    hook: impl FnOnce(&Registry, &ModelName) -> Result<bool, String> + Send + 'static,
) -> Result<(), OllamaError> {
    let name = ModelName::parse(model, "model").map_err(OllamaError::from)?;
    let registry = std::sync::Arc::clone(&state.registry);
    let done = tokio::task::spawn_blocking(move || hook(&registry, &name))
        .await
        .map_err(|e| OllamaError(ApiError::Internal(e.to_string())))?
        .map_err(|e| OllamaError(ApiError::Internal(e)))?;
    if !done {
        return Err(OllamaError(ApiError::NotFound(format!(
            "model '{model}' is not loaded in a live runner"
        ))));
    }
    Ok(())
}
