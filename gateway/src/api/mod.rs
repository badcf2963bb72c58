//! The API dialects: translation only. Each turns its request bodies into the
//! dialect-neutral [`crate::core::request`] types and the events of
//! [`crate::core::infer`] into its wire format; neither imports the other.
//!
//! - [`ollama`]: `/`, `/api/*` (NDJSON streams).
//! - [`openai`]: `/v1/*` (SSE streams).
//! - [`responses`]: OpenAI's Responses API, `/v1/responses` (SSE events).
//! - [`anthropic`]: Anthropic's Messages API, `/v1/messages` (SSE events).
//! - [`pull`] serves `/api/pull`.
//! - [`create`] serves `/api/create` and `/api/push`, [`blobs`] `/api/blobs/:digest`;
//!   [`modelfile`] reads and writes Ollama's Modelfile text.
//! - [`debug`]: test-only routes (with `HYPURA_RUNNER_TEST_HOOKS=1`).
//! - [`openapi`]: the OpenAPI document (`/openapi.json`) and the docs page (`/docs`).
pub mod anthropic;
pub mod blobs;
pub mod create;
pub mod debug;
pub mod modelfile;
pub mod ollama;
pub mod openai;
pub mod openapi;
pub mod pull;
pub mod responses;
