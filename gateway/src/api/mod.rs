//! The API dialects: translation only. Each turns its request bodies into the
//! dialect-neutral [`crate::core::request`] types and the events of
//! [`crate::core::infer`] into its wire format; neither imports the other.
//!
//! - [`ollama`]: `/`, `/api/*` (NDJSON streams).
//! - [`openai`]: `/v1/*` (SSE streams).
//! - [`responses`]: OpenAI's Responses API, `/v1/responses` (SSE events).
//! - [`anthropic`]: Anthropic's Messages API, `/v1/messages` (SSE events).
//! - [`logprobs`]: token log-probabilities in each dialect's shape.
//! - [`dialect`]: what one family's routes share (Ollama's `options`, OpenAI's sampling and tool calls).
//! - [`pull`] serves `/api/pull`.
//! - [`create`] serves `/api/create` and `/api/push`, [`blobs`] `/api/blobs/:digest`;
//!   [`modelfile`] reads and writes Ollama's Modelfile text.
//! - [`health`]: `/health` and `/ready`.
//! - [`debug`]: test-only routes (with `HYPURA_RUNNER_TEST_HOOKS=1`).
//! - [`routes`]: the route table (path, methods, auth, whether it runs a model),
//!   read by the router and the key check.
//! - [`openapi`]: the OpenAPI document (`/openapi.json`) and the docs page (`/docs`).
pub mod anthropic;
pub mod blobs;
pub mod create;
pub mod debug;
pub mod dialect;
pub mod health;
pub mod logprobs;
pub mod modelfile;
pub mod ollama;
pub mod openai;
pub mod openapi;
pub mod pull;
pub mod responses;
pub mod routes;

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;

use crate::core::error::ApiError;
use crate::core::infer::{Generation, InferEvent, Outcome, TRUNCATED_MESSAGES_HEADER};

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

/// How a dialect that streams a reply as SSE events (`/v1/responses`,
/// `/v1/messages`) writes each event of a generation.
pub trait SseEvents: Send + 'static {
    /// A piece of text.
    fn text(&mut self, text: &str) -> Bytes;
    /// The end of the reply.
    fn tail(&mut self, outcome: &Outcome) -> Bytes;
    /// A failure mid-stream.
    fn error(&mut self, e: ApiError) -> Bytes;
}

/// A `text/event-stream` response: `first`, then each event of `generation`
/// as `events` writes it, ending after its tail or error.
pub fn sse_stream<E: SseEvents>(first: Bytes, generation: Generation, events: E) -> Response {
    let start = Some((generation, events));
    let body = futures_util::stream::unfold(start, |state| async move {
        let (mut generation, mut events) = state?;
        match generation.next().await? {
            InferEvent::Text(text) => {
                let bytes = events.text(&text);
                Some((bytes, Some((generation, events))))
            }
            InferEvent::Done(outcome) => Some((events.tail(&outcome), None)),
            InferEvent::Error(e) => Some((events.error(e), None)),
        }
    });
    let body = futures_util::stream::iter([first]).chain(body);
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body.map(Ok::<_, Infallible>)),
    )
        .into_response()
}
