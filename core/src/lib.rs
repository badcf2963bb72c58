//! What every dialect shares, from a checked request to the end of its generation.
//!
//! - [`request`]: [`request::InferRequest`] and [`request::EmbedRequest`], dialect-neutral and serializable.
//! - [`validation`]: bodies, names, durations and options → checked values.
//! - [`bounds`]: limits on what a JSON Schema may ask of llama.cpp's grammar parser.
//! - [`schema_cost`]: what a JSON Schema's conversion into a grammar costs, bounded before it runs.
//! - [`convert`]: JSON Schema → grammar conversions on threads of their own, off the async runtime.
//! - [`blocking`]: waiting in synchronous code without holding up the async runtime.
//! - [`structured`]: `format` / `response_format` → grammars; `tools` → prompts and tool calls.
//! - [`backend`]: the [`backend::ModelBackend`] trait between the gateway and every model, and its events.
//! - [`truncate`]: fitting a conversation into its context window (oldest messages dropped).
//! - [`models`]: the [`models::Models`] trait, the one door to every model (the pool implements it), and its error.
//! - [`observer`]: the [`observer::Observer`] trait the inference path reports to (metrics and traces implement it).
//! - [`infer`]: the one inference path (resolve, admit, submit, stream, cancel, finish).
//! - [`error`]: one error enum; its status and body per API family.
pub mod backend;
pub mod blocking;
pub mod bounds;
pub mod convert;
pub mod error;
pub mod infer;
pub mod models;
pub mod observer;
pub mod request;
pub mod schema_cost;
pub mod structured;
pub mod truncate;
pub mod validation;
