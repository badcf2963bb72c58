//! The OpenAPI document of every route (`GET /openapi.json`) and a docs page
//! rendering it (`GET /docs`, Scalar).
use axum::routing::get;
use axum::{Json, Router};
use utoipa::OpenApi;
use utoipa_scalar::{Scalar, Servable};

use super::{ollama, openai, pull};
use crate::core::error::{OllamaErrorBody, OpenAiErrorBody, OpenAiErrorDetail};
use crate::core::validation::{OllamaOptions, StopSpec};
use crate::server::AppState;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "hypura",
        description = "Ollama- and OpenAI-compatible inference over GGUF models. Durations are \
                       integer nanoseconds; timestamps RFC 3339. When the server has an API key, \
                       every route but `/` and `/api/version` needs `Authorization: Bearer <key>`."
    ),
    paths(
        ollama::root,
        ollama::version,
        ollama::tags,
        ollama::ps,
        ollama::show,
        ollama::generate,
        ollama::chat,
        ollama::embed,
        ollama::embeddings,
        ollama::delete_model,
        ollama::copy,
        pull::pull,
        openai::list_models,
        openai::retrieve_model,
        openai::chat_completions,
        openai::completions,
        openai::embeddings,
    ),
    components(schemas(
        OllamaErrorBody,
        OpenAiErrorBody,
        OpenAiErrorDetail,
        OllamaOptions,
        StopSpec,
    )),
    tags(
        (name = "ollama", description = "Ollama's API"),
        (name = "openai", description = "OpenAI's API, under /v1"),
    )
)]
pub struct ApiDoc;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/openapi.json", get(|| async { Json(ApiDoc::openapi()) }))
        .merge(Scalar::with_url("/docs", ApiDoc::openapi()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn document_lists_every_route() {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        let paths = doc["paths"].as_object().unwrap();
        for p in [
            "/",
            "/api/version",
            "/api/tags",
            "/api/ps",
            "/api/show",
            "/api/generate",
            "/api/chat",
            "/api/embed",
            "/api/embeddings",
            "/api/delete",
            "/api/copy",
            "/api/pull",
            "/v1/models",
            "/v1/models/{id}",
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/embeddings",
        ] {
            assert!(paths.contains_key(p), "{p} missing");
        }
    }
}
