//! The live status page: `GET /status` (one HTML file with its script,
//! embedded in the binary: no build step, nothing fetched from elsewhere)
//! and `GET /api/status`, the JSON it polls: each loaded model's residency,
//! bytes per tier, slots, decode rate and cumulative streaming counters
//! (the page turns two polls into hit rates and GB/s), and the budget.
use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use crate::core::backend::{StreamCounters, TierBytes};
use crate::state::AppState;

/// The page, as written in `status.html`.
const PAGE: &str = include_str!("status.html");

/// `GET /status`.
pub async fn page() -> Response {
    ([(header::CACHE_CONTROL, "no-store")], Html(PAGE)).into_response()
}

#[derive(Debug, Serialize)]
pub struct StatusResponse {
    pub models: Vec<ModelStatus>,
    /// The global budget (absent without one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetStatus>,
    /// Requests waiting for their model (a slot, or room to load it).
    pub waiting: BudgetWaiting,
    /// Models served by name that can never run within the budget, and why.
    pub unavailable: Vec<UnavailableModel>,
    pub version: &'static str,
}

/// Requests waiting for their model: held at its fair gate while its
/// slots are busy, or waiting for room in the global memory budget to load
/// it: `/api/ps`, `/api/status`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BudgetWaiting {
    /// All of them.
    pub total: usize,
    /// Per model with any, by name.
    pub models: Vec<WaitingModel>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct WaitingModel {
    pub name: String,
    pub requests: usize,
}

impl BudgetWaiting {
    pub fn of(registry: &crate::pool::registry::Registry) -> BudgetWaiting {
        let models: Vec<WaitingModel> = registry
            .waiting()
            .into_iter()
            .map(|(name, requests)| WaitingModel { name, requests })
            .collect();
        BudgetWaiting {
            total: models.iter().map(|m| m.requests).sum(),
            models,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct UnavailableModel {
    pub name: String,
    /// Why, naming the least memory it needs.
    pub reason: String,
}

#[derive(Debug, Serialize)]
pub struct ModelStatus {
    pub name: String,
    pub residency: String,
    pub tier_bytes: TierBytes,
    pub active: usize,
    pub queued: usize,
    pub parallel: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode_tokens_per_second: Option<f64>,
    /// Counters since load (absent for a model that never streamed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub streaming: Option<StreamCounters>,
    /// The prompt cache's counters since load and bytes per tier.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_cache: Option<llama_tiered::engine::PromptCacheStatus>,
}

#[derive(Debug, Serialize)]
pub struct BudgetStatus {
    pub gpu_limit_bytes: u64,
    /// Absent when RAM has no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ram_limit_bytes: Option<u64>,
    pub gpu_charged_bytes: u64,
    pub ram_charged_bytes: u64,
    /// The most charged at once since start.
    pub gpu_peak_charged_bytes: u64,
    pub ram_peak_charged_bytes: u64,
}

/// `GET /api/status`.
pub async fn data(State(state): State<AppState>) -> Json<StatusResponse> {
    let registry = &state.registry;
    let models = registry
        .loaded_backends()
        .into_iter()
        .map(|m| {
            let status = m.backend.status();
            let memory = m.backend.memory();
            ModelStatus {
                name: m.name,
                residency: memory.residency.to_string(),
                tier_bytes: memory.tier_bytes,
                active: status.active,
                queued: status.queued,
                parallel: status.parallel,
                decode_tokens_per_second: status.decode_tokens_per_second,
                streaming: m.backend.streaming(),
                prompt_cache: m.backend.kv_cache().map(|kv| kv.prompt_cache),
            }
        })
        .collect();
    let peak = registry.budget_peak().unwrap_or_default();
    let budget = registry
        .budget_books()
        .map(|(limit, charged)| BudgetStatus {
            gpu_limit_bytes: limit.gpu_bytes,
            ram_limit_bytes: (limit.ram_bytes != u64::MAX).then_some(limit.ram_bytes),
            gpu_charged_bytes: charged.gpu_bytes,
            ram_charged_bytes: charged.ram_bytes,
            gpu_peak_charged_bytes: peak.gpu_bytes,
            ram_peak_charged_bytes: peak.ram_bytes,
        });
    let unavailable = registry
        .unfit()
        .into_iter()
        .map(|(name, reason)| UnavailableModel { name, reason })
        .collect();
    Json(StatusResponse {
        models,
        budget,
        waiting: BudgetWaiting::of(registry),
        unavailable,
        version: env!("CARGO_PKG_VERSION"),
    })
}
