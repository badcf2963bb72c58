//! The OpenAPI document of every route (`GET /openapi.json`) and a docs page
//! rendering it (`GET /docs`, Scalar).
use axum::routing::get;
use axum::{Json, Router};
use utoipa::OpenApi;
use utoipa_scalar::{Scalar, Servable};

use super::{anthropic, blobs, create, health, ollama, openai, pull, responses};
use crate::api::dialect::ollama::OllamaOptions;
use crate::core::error::{OllamaErrorBody, OpenAiErrorBody, OpenAiErrorDetail};
use crate::core::validation::StopSpec;
use crate::state::AppState;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "hypura",
        description = "Ollama- and OpenAI-compatible inference over GGUF models. Durations are \
                       integer nanoseconds; timestamps RFC 3339. When the server has an API key, \
                       every route but `/` and `/api/version` needs `Authorization: Bearer <key>` \
                       (or `x-api-key: <key>`). A path with a trailing slash is the same route. \
                       Chat routes drop the oldest messages of a conversation too long for the \
                       context window (`x-hypura-truncated-messages` counts them) unless \
                       `truncate` is false."
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
        create::create,
        create::push,
        blobs::head_blob,
        blobs::post_blob,
        openai::list_models,
        openai::retrieve_model,
        openai::chat_completions,
        openai::completions,
        openai::embeddings,
        responses::create_response,
        anthropic::messages,
        anthropic::count_tokens,
        health::health,
        health::ready,
    ),
    components(schemas(
        OllamaErrorBody,
        OpenAiErrorBody,
        OpenAiErrorDetail,
        OllamaOptions,
        StopSpec,
        anthropic::AnthropicErrorBody,
    )),
    tags(
        (name = "ollama", description = "Ollama's API"),
        (name = "openai", description = "OpenAI's API, under /v1"),
        (name = "anthropic", description = "Anthropic's Messages API, /v1/messages"),
        (name = "health", description = "Liveness and readiness for load balancers"),
    )
)]
pub struct ApiDoc;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/openapi.json", get(|| async { Json(document()) }))
        .merge(Scalar::with_url("/docs", document()))
}

/// Routes open without the API key.
const OPEN_ROUTES: &[&str] = &["/", "/api/version", "/health", "/ready"];
/// Routes that change which models exist (the admin key, when set).
const ADMIN_ROUTES: &[&str] = &["/api/pull", "/api/copy", "/api/delete"];
/// Routes that run a model: they may queue (503) and fail mid-way (500).
const MODEL_ROUTES: &[&str] = &[
    "/api/generate",
    "/api/chat",
    "/api/embed",
    "/api/embeddings",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
];

/// The document with, on every operation, the statuses the server's layers
/// answer besides the handler's own: 400 (a body that breaks a rule: JSON,
/// names, options, schema bounds, sizes), 401 (API key), 403 (a foreign
/// web origin or `Host`, or a route needing the admin key), 413 (the body
/// limit), 503 (a full queue), 500.
pub fn document() -> utoipa::openapi::OpenApi {
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
    let mut doc = ApiDoc::openapi();
    let error = |description: &str, body: &str| {
        ResponseBuilder::new()
            .description(description)
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name(body)))
                    .build(),
            )
            .build()
    };
    for (path, item) in doc.paths.paths.iter_mut() {
        let body = match path.as_str() {
            "/v1/messages" | "/v1/messages/count_tokens" => "AnthropicErrorBody",
            p if p.starts_with("/v1") => "OpenAiErrorBody",
            _ => "OllamaErrorBody",
        };
        let operations = [
            item.get.as_mut(),
            item.post.as_mut(),
            item.delete.as_mut(),
            item.head.as_mut(),
        ];
        for operation in operations.into_iter().flatten() {
            let has_body = operation.request_body.is_some();
            let mut add = |status: &str, description: &str| {
                operation
                    .responses
                    .responses
                    .entry(status.to_string())
                    .or_insert_with(|| error(description, body).into());
            };
            if has_body {
                add(
                    "400",
                    "The body breaks a rule (JSON, a field's type or range, a model name, a \
                     JSON Schema's bounds, a prompt or input too large); the message says which",
                );
                add(
                    "413",
                    "The body is larger than the server's limit (--max-body-bytes, 32 MiB by default)",
                );
            }
            add(
                "403",
                "The request comes from a web page whose origin is not allowed, names a Host the \
                 server does not answer to, or needs the admin key",
            );
            if !OPEN_ROUTES.contains(&path.as_str()) {
                add("401", "An API key is set and the request lacks it");
            }
            if ADMIN_ROUTES.contains(&path.as_str()) {
                add("404", "No model of that name");
            }
            if MODEL_ROUTES.contains(&path.as_str()) {
                add("404", "No model of that name");
                add(
                    "503",
                    "The model's queue is full, or it is stopping: retry later",
                );
                add("500", "The model failed");
            }
        }
    }
    doc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_lists_the_statuses_of_the_layers() {
        let doc = serde_json::to_value(document()).unwrap();
        let status = |path: &str, method: &str, code: &str| {
            doc["paths"][path][method]["responses"].get(code).is_some()
        };
        for (path, method) in [
            ("/api/generate", "post"),
            ("/api/chat", "post"),
            ("/api/pull", "post"),
            ("/v1/chat/completions", "post"),
            ("/v1/embeddings", "post"),
        ] {
            for code in ["200", "400", "401", "403", "413"] {
                assert!(status(path, method, code), "{method} {path} {code}");
            }
        }
        assert!(status("/api/generate", "post", "503"));
        assert!(status("/api/tags", "get", "403"));
        assert!(!status("/api/version", "get", "401"));
        assert_eq!(
            doc["paths"]["/v1/chat/completions"]["post"]["responses"]["400"]["content"]
                ["application/json"]["schema"]["$ref"],
            "#/components/schemas/OpenAiErrorBody"
        );
        assert_eq!(
            doc["paths"]["/v1/messages"]["post"]["responses"]["401"]["content"]["application/json"]
                ["schema"]["$ref"],
            "#/components/schemas/AnthropicErrorBody"
        );
    }

    #[test]
    fn logprobs_are_in_every_dialects_schemas() {
        let doc = serde_json::to_value(document()).unwrap();
        let schemas = &doc["components"]["schemas"];
        // A schema with a flattened field is an `allOf` of parts.
        let property = |schema: &str, name: &str| {
            let s = &schemas[schema];
            let parts = s["allOf"].as_array().cloned().unwrap_or_default();
            std::iter::once(s)
                .chain(&parts)
                .any(|part| part["properties"].get(name).is_some())
        };
        for schema in ["GenerateRequest", "ChatRequest", "ChatCompletionRequest"] {
            assert!(property(schema, "logprobs"), "{schema}");
            assert!(property(schema, "top_logprobs"), "{schema}");
        }
        for schema in [
            "CompletionRequest",
            "GenerateChunk",
            "ChatChunk",
            "ChatChoice",
            "CompletionChoice",
        ] {
            assert!(property(schema, "logprobs"), "{schema}");
        }
        assert!(property("TokenLogprob", "top_logprobs"));
        assert!(property("CompletionLogprobs", "text_offset"));
    }

    #[test]
    fn document_lists_every_route() {
        let doc = serde_json::to_value(document()).unwrap();
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
            "/api/create",
            "/api/push",
            "/api/blobs/{digest}",
            "/v1/models",
            "/v1/models/{id}",
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/embeddings",
            "/v1/responses",
            "/v1/messages",
            "/health",
            "/ready",
        ] {
            assert!(paths.contains_key(p), "{p} missing");
        }
    }
}
