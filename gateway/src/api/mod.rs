//! The API dialects: translation only. Each turns its request bodies into the
//! dialect-neutral [`crate::core::request`] types and the events of
//! [`crate::core::infer`] into its wire format; neither imports the other.
//!
//! - [`ollama`]: `/`, `/api/*` (NDJSON streams).
//! - [`openai`]: `/v1/*` (SSE streams).
//! - [`pull`] serves `/api/pull`.
//! - [`health`]: `/health` and `/ready`.
//! - [`debug`]: test-only routes (with `HYPURA_RUNNER_TEST_HOOKS=1`).
//! - [`openapi`]: the OpenAPI document (`/openapi.json`) and the docs page (`/docs`).
pub mod debug;
pub mod health;
pub mod ollama;
pub mod openai;
pub mod openapi;
pub mod pull;
