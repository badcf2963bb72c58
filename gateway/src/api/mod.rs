//! The API dialects: translation only. Each turns its request bodies into the
//! dialect-neutral [`crate::core::request`] types and the events of
//! [`crate::core::infer`] into its wire format; neither imports the other.
//!
//! - [`ollama`]: `/`, `/api/*` (NDJSON streams).
//! - [`openai`]: `/v1/*` (SSE streams).
//! - [`responses`]: OpenAI's Responses API, `/v1/responses` (SSE events).
//! - [`anthropic`]: Anthropic's Messages API, `/v1/messages` (SSE events).
//! - [`logprobs`]: token log-probabilities in each dialect's shape.
//! - [`pull`] serves `/api/pull`.
//! - [`create`] serves `/api/create` and `/api/push`, [`blobs`] `/api/blobs/:digest`;
//!   [`modelfile`] reads and writes Ollama's Modelfile text.
//! - [`health`]: `/health` and `/ready`.
//! - [`debug`]: test-only routes (with `HYPURA_RUNNER_TEST_HOOKS=1`).
//! - [`openapi`]: the OpenAPI document (`/openapi.json`) and the docs page (`/docs`).
pub mod anthropic;
pub mod blobs;
pub mod create;
pub mod debug;
pub mod health;
pub mod logprobs;
pub mod modelfile;
pub mod ollama;
pub mod openai;
pub mod openapi;
pub mod pull;
pub mod responses;

use axum::http::HeaderValue;
use axum::response::Response;

use crate::core::infer::TRUNCATED_MESSAGES_HEADER;

/// `response` with [`TRUNCATED_MESSAGES_HEADER`] when `truncated_messages`
/// of the conversation were dropped to fit the context window.
pub fn with_truncation(mut response: Response, truncated_messages: usize) -> Response {
    if truncated_messages > 0 {
        response.headers_mut().insert(
            TRUNCATED_MESSAGES_HEADER,
            HeaderValue::from(truncated_messages),
        );
    }
    response
}
