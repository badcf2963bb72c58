//! hypura's gateway as a library: the `hypura` binary (`main.rs`) only parses
//! its command line and calls [`cli::dispatch`].
//!
//! The way of a request, one module a step:
//! - [`api`]: one file per API family (Ollama, OpenAI) translating bodies
//!   into a [`core::request::InferRequest`] and events back into the wire
//!   format; `/api/pull`; the OpenAPI document.
//! - [`core`] (the `hypura-core` crate, `core/`): the dialect-neutral
//!   request, its validation, structured output and tools, the
//!   [`core::backend::ModelBackend`] trait every model is reached through,
//!   and [`core::infer`], the one inference path. A crate of its own, so it
//!   cannot name the layers above it.
//! - [`pool`]: the one door to every model ([`core::models::Models`]):
//!   model names → sources, loaded models with keep-alive, the global memory
//!   budget and its moves, the in-process llama-tiered backend
//!   ([`pool::local`]), and the upstreams: other servers (hypura peers,
//!   Ollama, OpenAI-compatible engines) models are routed to over HTTP, with
//!   probes and failover ([`pool::upstream`]).
//! - [`metrics`]: Prometheus `/metrics` (requests, latencies, tokens,
//!   tiers, budget, moves, streaming).
//! - [`security`]: who may drive the API (origins, hosts, keys) and what a
//!   pull may touch (model roots, allowed hosts, no private addresses).
//! - [`server`]: the axum application (routes, auth, CORS, limits) and its
//!   graceful shutdown; [`connections`]: accepting connections (timeouts,
//!   caps); [`bodies`]: request bodies read within their bounds (size,
//!   memory of all together, time); [`state`]: what every handler reaches.
//! - [`cli`], [`config`], [`fetch`]: the subcommands, the TOML settings and
//!   the default model's download.
//! - [`tenancy`]: named keys with limits, the fair queue in front of each
//!   model, usage per user.
//! - [`telemetry`]: log lines (text or JSON), the spans of requests, model
//!   loads and moves, and their OTLP export.
pub mod api;
pub mod bodies;
pub mod cli;
pub mod config;
pub mod connections;
pub mod fetch;
pub mod metrics;
pub mod pool;
pub mod security;
pub mod server;
pub mod state;
pub mod telemetry;
pub mod tenancy;

/// `crate::core::...` in the gateway names the `hypura-core` crate.
pub use hypura_core as core;
