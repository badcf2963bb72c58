//! What [`crate::infer`] tells the outside about the requests it runs:
//! the [`Observer`] trait. Metrics and traces implement it; core calls it at
//! the few points every request passes (its start, the model it names, a full
//! queue, its end) and knows nothing of what they record. It asks one thing
//! back: the context cap of whoever the request is served for.
use std::time::Duration;

use tracing::Span;

use super::error::ApiError;
use super::infer::GenerationRecord;
use super::request::{EmbedRequest, InferRequest};

/// Hears of every generation and embedding. Every method has a default that
/// records nothing, so an observer implements only what it records.
pub trait Observer: Send + Sync {
    /// The span a generation runs in (its loads and log lines are children).
    fn generation_span(&self, _request: &InferRequest) -> Span {
        Span::none()
    }

    /// The span an embedding runs in.
    fn embeddings_span(&self, _request: &EmbedRequest) -> Span {
        Span::none()
    }

    /// A request named `model` (as the client spelled it, display form) and found it.
    fn model_used(&self, _model: &str) {}

    /// `model`'s queue was full: the request was refused.
    fn queue_full(&self, _model: &str) {}

    /// A generation ended, whichever way ([`crate::infer::finish`]).
    fn generation_ended(&self, _record: &GenerationRecord<'_>) {}

    /// An embedding request ended with `vectors` from `tokens` tokens.
    fn embedded(&self, _span: &Span, _vectors: &[Vec<f32>], _tokens: usize, _load: Duration) {}

    /// A request failed before it produced anything.
    fn failed(&self, _span: &Span, _error: &ApiError) {}

    /// The most tokens the generation starting now may take, prompt and
    /// reply together, when whoever the request is served for is capped (a
    /// key's `max_context`, known to the server around the route, not to
    /// core): [`crate::infer::Generation::start`] fits the prompt into it
    /// and caps the reply at what it leaves. The one question core asks.
    fn context_cap(&self) -> Option<u32> {
        None
    }
}

/// An observer that records nothing (tools and tests).
pub struct Unobserved;

impl Observer for Unobserved {}
