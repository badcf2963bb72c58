//! Spans of the model pool's work: loading a model (`load {model}`) and the
//! memory budget's moves (`promote {model}`, `demote {model}`,
//! `switch {model}`, `unload {model}`), each a child of the request that
//! caused it, or a root span when the budget's clock did. A placement
//! planned inside one records its mode and bytes per tier ([`record_plan`]).
use hypura_scheduler::budget::Residency;
use hypura_scheduler::plan::Plan;
use tracing::field::Empty;
use tracing::Span;

/// The span of loading `model` (`residency`: the budget's level, or `no budget`).
pub fn load_span(model: &str, residency: &str) -> Span {
    tracing::info_span!(
        "model_load",
        hypura.model = model,
        hypura.residency = residency,
        hypura.mode = Empty,
        hypura.gpu_bytes = Empty,
        hypura.ram_bytes = Empty,
        hypura.stream_bytes = Empty,
        error.type = Empty,
        otel.name = format!("load {model}"),
        otel.status_code = Empty,
        otel.status_description = Empty,
    )
}

/// What a move from `from` to `to` is; `switch`: the placement changes
/// (into or out of the full placement), which loads the model anew.
pub fn move_kind(from: Residency, to: Residency, switch: bool) -> &'static str {
    if to == Residency::Unloaded {
        "unload"
    } else if switch {
        "switch"
    } else if to > from {
        "promote"
    } else {
        "demote"
    }
}

/// The span of one budget move of `model`; a promotion's lasts until its
/// stream cache is filled.
pub fn move_span(model: &str, from: Residency, to: Residency, kind: &str) -> Span {
    tracing::info_span!(
        "model_move",
        hypura.model = model,
        hypura.move.kind = kind,
        hypura.move.from = from.as_str(),
        hypura.move.to = to.as_str(),
        hypura.mode = Empty,
        hypura.gpu_bytes = Empty,
        hypura.ram_bytes = Empty,
        hypura.stream_bytes = Empty,
        error.type = Empty,
        otel.name = format!("{kind} {model}"),
        otel.status_code = Empty,
        otel.status_description = Empty,
    )
}

/// Records the placement `plan` on the current span (a load's or a switch's).
pub fn record_plan(plan: &Plan) {
    Placement::of(plan).record();
}

/// What a span records of a placement: its mode and bytes per tier (sent
/// by a runner, which plans its model itself, to the gateway's span).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Placement {
    pub mode: String,
    pub gpu_bytes: u64,
    pub ram_bytes: u64,
    pub stream_bytes: u64,
}

impl Placement {
    pub fn of(plan: &Plan) -> Placement {
        Placement {
            mode: plan.mode.as_str().to_string(),
            gpu_bytes: plan.tier_bytes.gpu,
            ram_bytes: plan.tier_bytes.ram,
            stream_bytes: plan.tier_bytes.stream,
        }
    }

    /// Records it on the current span.
    pub fn record(&self) {
        let span = Span::current();
        span.record("hypura.mode", self.mode.as_str());
        let bytes = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        span.record("hypura.gpu_bytes", bytes(self.gpu_bytes));
        span.record("hypura.ram_bytes", bytes(self.ram_bytes));
        span.record("hypura.stream_bytes", bytes(self.stream_bytes));
    }
}

/// Marks `span` failed with `error`.
pub fn record_failure(span: &Span, error: &dyn std::fmt::Display) {
    span.record("error.type", "failed");
    span.record("otel.status_code", "ERROR");
    span.record("otel.status_description", error.to_string());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_are_named_by_kind() {
        use Residency::*;
        assert_eq!(move_kind(Streaming, Partial, false), "promote");
        assert_eq!(move_kind(Full, Partial, false), "demote");
        assert_eq!(move_kind(Partial, Full, true), "switch");
        assert_eq!(move_kind(Full, Unloaded, true), "unload");
    }
}
