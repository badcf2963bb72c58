//! [`Recorder`]: the [`Observer`] of the server's requests, feeding their
//! spans ([`super::genai`]) and the Prometheus metrics ([`crate::metrics`]).
use std::time::Duration;

use tracing::Span;

use super::genai;
use crate::core::error::ApiError;
use crate::core::infer::GenerationRecord;
use crate::core::observer::Observer;
use crate::core::request::{EmbedRequest, InferRequest};

/// Records every request in the traces and the metrics.
pub struct Recorder;

impl Observer for Recorder {
    fn generation_span(&self, request: &InferRequest) -> Span {
        genai::generation_span(request)
    }

    fn embeddings_span(&self, request: &EmbedRequest) -> Span {
        genai::embeddings_span(request)
    }

    fn model_used(&self, model: &str) {
        crate::metrics::note_model(model);
    }

    fn queue_full(&self, model: &str) {
        crate::metrics::rejected(model, crate::metrics::Rejection::QueueFull);
    }

    fn generation_ended(&self, record: &GenerationRecord<'_>) {
        genai::record_generation(record);
        crate::metrics::generation_ended(record);
    }

    fn embedded(&self, span: &Span, vectors: &[Vec<f32>], tokens: usize, load: Duration) {
        genai::record_embeddings(span, vectors, tokens, load);
    }

    fn failed(&self, span: &Span, error: &ApiError) {
        genai::record_error(span, error);
    }

    fn context_cap(&self) -> Option<u32> {
        crate::tenancy::usage::context_cap()
    }
}
