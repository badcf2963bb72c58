//! The API dialects: translation only. Each turns its request bodies into the
//! dialect-neutral [`crate::core::request`] types and the events of
//! [`crate::core::infer`] into its wire format; neither imports the other.
//!
//! - [`ollama`]: `/`, `/api/*` (NDJSON streams).
//! - [`openai`]: `/v1/*` (SSE streams).
//! - [`logprobs`]: token log-probabilities in each dialect's shape.
//! - [`pull`] serves `/api/pull`.
//! - [`debug`]: test-only routes (with `HYPURA_RUNNER_TEST_HOOKS=1`).
//! - [`openapi`]: the OpenAPI document (`/openapi.json`) and the docs page (`/docs`).
pub mod debug;
pub mod logprobs;
pub mod ollama;
pub mod openai;
pub mod openapi;
pub mod pull;
