//! The span of one generation or embedding, with the OpenTelemetry GenAI
//! semantic conventions: named `{gen_ai.operation.name} {gen_ai.request.model}`
//! (`chat smollm2:135m`, `text_completion ...`, `embeddings ...`), the
//! request's parameters when it starts, its usage and timings when it ends.
//!
//! Timings are `hypura.*` attributes in seconds: `load_seconds` (loading
//! the model for it), `queue_seconds` (waiting for a slot),
//! `prefill_seconds` (evaluating the prompt), `decode_seconds` (generating),
//! `time_to_first_token_seconds` (from arrival).
use std::time::Duration;

use opentelemetry::{Array, StringValue, Value};
use tracing::field::Empty;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::core::error::ApiError;
use crate::core::infer::{Ended, GenerationRecord};
use crate::core::request::{EmbedRequest, InferRequest, Prompt};

/// The GenAI operation a prompt stands for (`None`: a load, not a generation).
pub fn operation(prompt: &Prompt) -> Option<&'static str> {
    match prompt {
        Prompt::Messages { .. } => Some("chat"),
        Prompt::Text { .. } | Prompt::Tokens(_) => Some("text_completion"),
        Prompt::Load => None,
    }
}

/// The span of `request`'s generation (disabled for a request that only
/// loads or unloads its model). It ends when the generation is dropped.
pub fn generation_span(request: &InferRequest) -> Span {
    let Some(operation) = operation(&request.backend.prompt) else {
        return Span::none();
    };
    let params = &request.backend.params;
    let sampling = &params.sampling;
    tracing::info_span!(
        "generation",
        gen_ai.operation.name = operation,
        gen_ai.request.model = request.requested.as_str(),
        gen_ai.request.max_tokens = params.max_tokens.map(i64::from),
        gen_ai.request.temperature = decimal(sampling.temperature),
        gen_ai.request.top_p = decimal(sampling.top_p),
        gen_ai.request.top_k = sampling.top_k,
        gen_ai.request.seed = sampling.seed.map(i64::from),
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        hypura.ended = Empty,
        hypura.load_seconds = Empty,
        hypura.queue_seconds = Empty,
        hypura.prefill_seconds = Empty,
        hypura.decode_seconds = Empty,
        hypura.time_to_first_token_seconds = Empty,
        error.type = Empty,
        otel.name = format!("{operation} {}", request.requested),
        otel.status_code = Empty,
        otel.status_description = Empty,
    )
}

/// The span of `request`'s embeddings.
pub fn embeddings_span(request: &EmbedRequest) -> Span {
    tracing::info_span!(
        "embeddings",
        gen_ai.operation.name = "embeddings",
        gen_ai.request.model = request.requested.as_str(),
        gen_ai.embeddings.dimension.count = Empty,
        gen_ai.usage.input_tokens = Empty,
        hypura.inputs = count(request.batch.inputs.len()),
        hypura.load_seconds = Empty,
        error.type = Empty,
        otel.name = format!("embeddings {}", request.requested),
        otel.status_code = Empty,
        otel.status_description = Empty,
    )
}

/// Records how a generation ended on its span ([`crate::core::infer::finish`]).
pub fn record_generation(record: &GenerationRecord<'_>) {
    let span = record.span;
    if span.is_disabled() {
        return;
    }
    span.record("hypura.load_seconds", record.load.as_secs_f64());
    if let Some(queued) = record.queued {
        span.record("hypura.queue_seconds", queued.as_secs_f64());
    }
    if let Some(ttft) = record.time_to_first_token {
        span.record("hypura.time_to_first_token_seconds", ttft.as_secs_f64());
    }
    if let Some(finished) = record.finished {
        span.record("gen_ai.usage.input_tokens", count(finished.prompt_tokens));
        span.record(
            "gen_ai.usage.output_tokens",
            count(finished.generated_tokens),
        );
        span.record(
            "hypura.prefill_seconds",
            finished.prompt_eval_duration.as_secs_f64(),
        );
        span.record(
            "hypura.decode_seconds",
            finished.eval_duration.as_secs_f64(),
        );
    }
    let ended = match record.ended {
        Ended::Finished(reason) => {
            let reasons = vec![StringValue::from(reason.as_str())];
            span.set_attribute(
                "gen_ai.response.finish_reasons",
                Value::Array(Array::String(reasons)),
            );
            reason.as_str()
        }
        Ended::Failed => {
            span.record("error.type", "backend_failed");
            span.record("otel.status_code", "ERROR");
            "failed"
        }
        Ended::Cancelled => "cancelled",
    };
    span.record("hypura.ended", ended);
}

/// Records an error answered instead of a generation or embeddings.
pub fn record_error(span: &Span, error: &ApiError) {
    let status = error.status();
    span.record("error.type", status.as_str());
    if status.is_server_error() {
        span.record("otel.status_code", "ERROR");
        span.record("otel.status_description", error.to_string());
    }
}

/// Records embeddings made: the tokens they took, their dimensions and the load time.
pub fn record_embeddings(span: &Span, vectors: &[Vec<f32>], tokens: usize, load: Duration) {
    span.record("gen_ai.usage.input_tokens", count(tokens));
    if let Some(first) = vectors.first() {
        span.record("gen_ai.embeddings.dimension.count", count(first.len()));
    }
    span.record("hypura.load_seconds", load.as_secs_f64());
}

/// A count as an `i64`: the exporter sends integers only of that type (it
/// would send other integer types as strings).
pub fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// An `f32` parameter as the decimal the client wrote (`0.7`, not
/// `0.699999988079071`).
fn decimal(value: f32) -> f64 {
    value.to_string().parse().unwrap_or(f64::from(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_keep_the_decimals_written() {
        assert_eq!(decimal(0.7), 0.7);
        assert_eq!(decimal(0.0), 0.0);
        assert_eq!(decimal(1.25), 1.25);
    }
}
