//! Prometheus metrics: `GET /metrics` in the text format, every name
//! `hypura_*` (but the standard `process_*`), base units (seconds, bytes),
//! `_total` on counters, a `model` label where one applies.
//!
//! Two kinds of values:
//! - counters and histograms recorded as things happen: requests by route
//!   and status ([`http`]), each generation's end ([`generation_ended`],
//!   called by [`crate::core::infer::finish`]), rejections, model loads,
//!   unloads and moves;
//! - values read when Prometheus scrapes ([`scrape`]): requests running and
//!   waiting, slots, bytes per tier, residency, the budget's books, and the
//!   streaming counters each backend reports ([`crate::core::backend::ModelBackend::streaming`]),
//!   turned into exact counters by a ledger of what each load reported last.
//!
//! The families live in one process-wide [`Metrics`] ([`metrics`]): the hooks
//! are called from places that hold no server state (the end of a
//! generation, a model's eviction).
pub mod http;
pub mod inference_extension;
pub mod prompt_cache;
pub mod scrape;
pub mod status;
pub mod upstream;
pub mod users;

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use prometheus::{
    Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

use crate::core::backend::{FinishReason, Residency};
use crate::core::infer::{Ended, GenerationRecord};
use crate::core::validation::ModelName;

/// vLLM's boundaries for time to first token, in seconds.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's boundaries for inter-token latency (time per output token), in seconds.
pub const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's boundaries for request latencies (end to end, queue, prefill,
/// decode), in seconds; also used for model loads and switches.
pub const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// vLLM's 1-2-5 boundaries for token counts, up to `max` (vLLM stops at the
/// model's length; one set for every model here, up to 1M tokens).
pub fn token_buckets(max: u64) -> Vec<f64> {
    let mut buckets = Vec::new();
    let mut exponent = 1u64;
    loop {
        for m in [1, 2, 5] {
            let value = m * exponent;
            if value > max {
                return buckets;
            }
            buckets.push(value as f64);
        }
        exponent *= 10;
    }
}

/// Why a request was refused before it ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// The model's queue was full (503).
    QueueFull,
    /// No room in the memory budget before the admission timeout (503).
    BudgetTimeout,
}

impl Rejection {
    fn as_str(self) -> &'static str {
        match self {
            Rejection::QueueFull => "queue_full",
            Rejection::BudgetTimeout => "budget_timeout",
        }
    }
}

/// Every family, registered in one [`Registry`].
pub struct Metrics {
    pub registry: Registry,
    // Requests.
    pub requests: IntCounterVec,
    pub running: IntGaugeVec,
    pub waiting: IntGaugeVec,
    pub success: IntCounterVec,
    pub aborted: IntCounterVec,
    pub rejected: IntCounterVec,
    // Latencies and sizes.
    pub ttft: HistogramVec,
    pub itl: HistogramVec,
    pub e2e: HistogramVec,
    pub queue_time: HistogramVec,
    pub prefill_time: HistogramVec,
    pub decode_time: HistogramVec,
    pub prompt_tokens_per_request: HistogramVec,
    pub generation_tokens_per_request: HistogramVec,
    // Throughput.
    pub prompt_tokens: IntCounterVec,
    pub generation_tokens: IntCounterVec,
    // Slots and KV cache.
    pub slots_busy: IntGaugeVec,
    pub slots_total: IntGaugeVec,
    pub kv_cache_bytes: IntGaugeVec,
    pub kv_cache_usage: GaugeVec,
    pub decode_rate: GaugeVec,
    // Tiers and budget.
    pub resident_bytes: IntGaugeVec,
    pub residency: IntGaugeVec,
    pub budget_limit: IntGaugeVec,
    pub budget_charged: IntGaugeVec,
    pub budget_waiting: IntGaugeVec,
    pub moves: IntCounterVec,
    pub move_duration: HistogramVec,
    pub loaded_models: IntGauge,
    pub runner_crashes: IntCounterVec,
    // Streaming.
    pub stream_read_bytes: IntCounterVec,
    pub stream_read_seconds: prometheus::CounterVec,
    pub expert_hits: IntCounterVec,
    pub expert_misses: IntCounterVec,
    pub prefetch_hits: IntCounterVec,
    pub prefetch_wasted_bytes: IntCounterVec,
    pub io_stall_seconds: prometheus::CounterVec,
    pub evictions: IntCounterVec,
    pub stream_cache_bytes: IntGaugeVec,
    pub stream_cache_budget_bytes: IntGaugeVec,
    // Process.
    pub build_info: IntGaugeVec,
    pub start_time: Gauge,
    pub resident_memory: IntGauge,
    /// What each load's streaming counters were at the last look.
    pub(crate) ledger: scrape::StreamLedger,
    pub prompt_cache: prompt_cache::PromptCacheMetrics,
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("a valid counter");
    registry.register(Box::new(c.clone())).expect("a new name");
    c
}

fn float_counter(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::CounterVec {
    let c = prometheus::CounterVec::new(Opts::new(name, help), labels).expect("a valid counter");
    registry.register(Box::new(c.clone())).expect("a new name");
    c
}

fn gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("a valid gauge");
    registry.register(Box::new(g.clone())).expect("a new name");
    g
}

fn float_gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let g = GaugeVec::new(Opts::new(name, help), labels).expect("a valid gauge");
    registry.register(Box::new(g.clone())).expect("a new name");
    g
}

fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: &[f64],
    labels: &[&str],
) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    let h = HistogramVec::new(opts, labels).expect("a valid histogram");
    registry.register(Box::new(h.clone())).expect("a new name");
    h
}

impl Metrics {
    fn new() -> Metrics {
        let r = Registry::new();
        let m = &["model"];
        let tokens = token_buckets(1_000_000);
        let metrics = Metrics {
            requests: counter(
                &r,
                "hypura_requests_total",
                "HTTP requests answered, by model (empty when none applies), API family, route and status code.",
                &["model", "api", "route", "status"],
            ),
            running: gauge(&r, "hypura_requests_running", "Requests generating now (holding a slot).", m),
            waiting: gauge(&r, "hypura_requests_waiting", "Requests waiting for a slot.", m),
            success: counter(
                &r,
                "hypura_request_success_total",
                "Generations that finished, by finish reason (stop, length).",
                &["model", "finish_reason"],
            ),
            aborted: counter(
                &r,
                "hypura_request_aborted_total",
                "Generations that did not finish: cancelled (client gone) or error.",
                &["model", "reason"],
            ),
            rejected: counter(
                &r,
                "hypura_requests_rejected_total",
                "Requests refused with 503 before running: queue_full or budget_timeout.",
                &["model", "reason"],
            ),
            ttft: histogram(
                &r,
                "hypura_time_to_first_token_seconds",
                "From a request's arrival to its first generated token.",
                TTFT_BUCKETS,
                m,
            ),
            itl: histogram(
                &r,
                "hypura_inter_token_latency_seconds",
                "Mean time between output tokens of one finished generation (decode time / (tokens - 1)), one observation per generation of 2 tokens or more.",
                ITL_BUCKETS,
                m,
            ),
            e2e: histogram(
                &r,
                "hypura_e2e_request_latency_seconds",
                "From a request's arrival to the end of its generation (finished generations).",
                REQUEST_LATENCY_BUCKETS,
                m,
            ),
            queue_time: histogram(
                &r,
                "hypura_request_queue_time_seconds",
                "Time a finished generation waited for a slot.",
                REQUEST_LATENCY_BUCKETS,
                m,
            ),
            prefill_time: histogram(
                &r,
                "hypura_request_prefill_time_seconds",
                "Time a finished generation spent evaluating its prompt.",
                REQUEST_LATENCY_BUCKETS,
                m,
            ),
            decode_time: histogram(
                &r,
                "hypura_request_decode_time_seconds",
                "Time a finished generation spent generating tokens.",
                REQUEST_LATENCY_BUCKETS,
                m,
            ),
            prompt_tokens_per_request: histogram(
                &r,
                "hypura_request_prompt_tokens",
                "Prompt tokens of each finished generation.",
                &tokens,
                m,
            ),
            generation_tokens_per_request: histogram(
                &r,
                "hypura_request_generation_tokens",
                "Generated tokens of each finished generation.",
                &tokens,
                m,
            ),
            prompt_tokens: counter(
                &r,
                "hypura_prompt_tokens_total",
                "Prompt tokens of finished generations.",
                m,
            ),
            generation_tokens: counter(
                &r,
                "hypura_generation_tokens_total",
                "Tokens generated by finished generations (an end-of-generation token not counted).",
                m,
            ),
            slots_busy: gauge(&r, "hypura_slots_busy", "Sequence slots in use.", m),
            slots_total: gauge(&r, "hypura_slots", "Sequence slots (requests decoded together).", m),
            kv_cache_bytes: gauge(
                &r,
                "hypura_kv_cache_bytes",
                "Bytes of KV cache allocated for the model's slots.",
                m,
            ),
            kv_cache_usage: float_gauge(
                &r,
                "hypura_kv_cache_usage_ratio",
                "Share of the KV cache's cells holding tokens (0 to 1).",
                m,
            ),
            decode_rate: float_gauge(
                &r,
                "hypura_decode_tokens_per_second",
                "Recent decode rate of finished generations (exponentially weighted).",
                m,
            ),
            resident_bytes: gauge(
                &r,
                "hypura_model_resident_bytes",
                "Bytes of a loaded model's weights per tier: gpu, ram, or stream (left on disk, read on demand).",
                &["model", "tier"],
            ),
            residency: gauge(
                &r,
                "hypura_model_residency",
                "1 for a loaded model's residency now (full, partial, streaming), 0 for the others.",
                &["model", "state"],
            ),
            budget_limit: gauge(
                &r,
                "hypura_budget_limit_bytes",
                "The global memory budget per tier (gpu, ram); absent without one.",
                &["tier"],
            ),
            budget_charged: gauge(
                &r,
                "hypura_budget_charged_bytes",
                "Bytes the global budget charges now per tier (models, their contexts, moves under way).",
                &["tier"],
            ),
            budget_waiting: gauge(
                &r,
                "hypura_budget_waiting_requests",
                "Requests waiting for room in the global memory budget to load their model.",
                m,
            ),
            moves: counter(
                &r,
                "hypura_model_moves_total",
                "Residency moves by kind: load, unload, promotion, demotion, and switch (a promotion or demotion that loaded another placement; also counted as one of those).",
                &["model", "kind"],
            ),
            move_duration: histogram(
                &r,
                "hypura_model_move_duration_seconds",
                "Time to load a model (kind=load) or to switch its placement (kind=switch).",
                REQUEST_LATENCY_BUCKETS,
                &["model", "kind"],
            ),
            loaded_models: {
                let g = IntGauge::new("hypura_models_loaded", "Models loaded now.").unwrap();
                r.register(Box::new(g.clone())).unwrap();
                g
            },
            runner_crashes: counter(
                &r,
                "hypura_runner_crashes_total",
                "Runner processes of a model that crashed (its model reloads on its next request).",
                &["model"],
            ),
            stream_read_bytes: counter(
                &r,
                "hypura_stream_read_bytes_total",
                "Bytes of streamed weights read from the model file (NVMe) after load.",
                m,
            ),
            stream_read_seconds: float_counter(
                &r,
                "hypura_stream_read_seconds_total",
                "Seconds spent reading streamed weights (decoding thread and prefetcher summed); bytes over seconds is the read rate.",
                m,
            ),
            expert_hits: counter(
                &r,
                "hypura_expert_cache_hits_total",
                "Streamed-unit lookups (an expert, or a dense layer's FFN) found resident.",
                m,
            ),
            expert_misses: counter(
                &r,
                "hypura_expert_cache_misses_total",
                "Streamed-unit lookups that had to be read from disk.",
                m,
            ),
            prefetch_hits: counter(
                &r,
                "hypura_prefetch_hits_total",
                "Units the prefetcher read that were then used.",
                m,
            ),
            prefetch_wasted_bytes: counter(
                &r,
                "hypura_prefetch_wasted_bytes_total",
                "Bytes the prefetcher read that were evicted unused.",
                m,
            ),
            io_stall_seconds: float_counter(
                &r,
                "hypura_io_stall_seconds_total",
                "Seconds the decoding thread waited for streamed weights.",
                m,
            ),
            evictions: counter(
                &r,
                "hypura_stream_cache_evictions_total",
                "Streamed units evicted from the stream cache.",
                m,
            ),
            stream_cache_bytes: gauge(
                &r,
                "hypura_stream_cache_bytes",
                "Bytes of streamed units resident now.",
                m,
            ),
            stream_cache_budget_bytes: gauge(
                &r,
                "hypura_stream_cache_budget_bytes",
                "The stream cache's limit in bytes.",
                m,
            ),
            build_info: gauge(
                &r,
                "hypura_build_info",
                "1, labelled with the version of hypura.",
                &["version"],
            ),
            start_time: {
                let g = Gauge::new(
                    "process_start_time_seconds",
                    "Start time of the process since the Unix epoch, in seconds.",
                )
                .unwrap();
                r.register(Box::new(g.clone())).unwrap();
                g
            },
            resident_memory: {
                let g = IntGauge::new(
                    "process_resident_memory_bytes",
                    "Resident memory size of the process, in bytes.",
                )
                .unwrap();
                r.register(Box::new(g.clone())).unwrap();
                g
            },
            ledger: scrape::StreamLedger::default(),
            prompt_cache: prompt_cache::PromptCacheMetrics::new(&r),
            registry: r,
        };
        metrics
            .build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        metrics.start_time.set(scrape::process_start_seconds());
        metrics
    }
}

/// The process's metrics, created on first use.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

/// A model's label: the name as the registry shows it (`name:tag`).
fn label(model: &str) -> String {
    ModelName::parse(model, "model").map_or_else(|_| model.to_string(), |n| n.display)
}

/// Records the end of a generation (from [`crate::core::infer::finish`]).
pub fn generation_ended(record: &GenerationRecord<'_>) {
    crate::tenancy::usage::generation_ended(record);
    let m = metrics();
    let model = label(record.model);
    let model = [model.as_str()];
    if let Some(ttft) = record.time_to_first_token {
        m.ttft.with_label_values(&model).observe(ttft.as_secs_f64());
    }
    let reason = match record.ended {
        Ended::Finished(FinishReason::Cancelled) | Ended::Cancelled => Some("cancelled"),
        Ended::Failed => Some("error"),
        Ended::Finished(_) => None,
    };
    if let Some(reason) = reason {
        m.aborted.with_label_values(&[model[0], reason]).inc();
        return;
    }
    let Ended::Finished(finish_reason) = record.ended else {
        return;
    };
    m.success
        .with_label_values(&[model[0], finish_reason.as_str()])
        .inc();
    m.e2e
        .with_label_values(&model)
        .observe(record.total.as_secs_f64());
    if let Some(queued) = record.queued {
        m.queue_time
            .with_label_values(&model)
            .observe(queued.as_secs_f64());
    }
    let Some(finished) = record.finished else {
        return;
    };
    m.prefill_time
        .with_label_values(&model)
        .observe(finished.prompt_eval_duration.as_secs_f64());
    m.decode_time
        .with_label_values(&model)
        .observe(finished.eval_duration.as_secs_f64());
    m.prompt_tokens
        .with_label_values(&model)
        .inc_by(finished.prompt_tokens as u64);
    m.generation_tokens
        .with_label_values(&model)
        .inc_by(finished.generated_tokens as u64);
    m.prompt_tokens_per_request
        .with_label_values(&model)
        .observe(finished.prompt_tokens as f64);
    m.generation_tokens_per_request
        .with_label_values(&model)
        .observe(finished.generated_tokens as f64);
    if finished.generated_tokens >= 2 {
        let per_token =
            finished.eval_duration.as_secs_f64() / (finished.generated_tokens - 1) as f64;
        m.itl.with_label_values(&model).observe(per_token);
    }
}

/// Counts a request refused before it ran.
pub fn rejected(model: &str, why: Rejection) {
    metrics()
        .rejected
        .with_label_values(&[label(model).as_str(), why.as_str()])
        .inc();
}

/// Counts a model load and its duration.
pub fn model_loaded(model: &str, took: Duration) {
    let m = metrics();
    m.moves.with_label_values(&[model, "load"]).inc();
    m.move_duration
        .with_label_values(&[model, "load"])
        .observe(took.as_secs_f64());
}

/// Requests for `model` waiting for room in the global budget now.
pub fn budget_waiting(model: &str, count: usize) {
    metrics()
        .budget_waiting
        .with_label_values(&[&label(model)])
        .set(count as i64);
}

/// Counts a model leaving memory (its engine finishes what is in flight).
pub fn model_unloaded(model: &str) {
    metrics().moves.with_label_values(&[model, "unload"]).inc();
}

/// Counts a move between two loaded residencies; `switched` is the time a
/// switch of placement took (`None`: a resize of the stream cache).
pub fn model_moved(model: &str, from: Residency, to: Residency, switched: Option<Duration>) {
    let m = metrics();
    let kind = if to > from { "promotion" } else { "demotion" };
    m.moves.with_label_values(&[model, kind]).inc();
    if let Some(took) = switched {
        m.moves.with_label_values(&[model, "switch"]).inc();
        m.move_duration
            .with_label_values(&[model, "switch"])
            .observe(took.as_secs_f64());
    }
}

/// Counts a crash of the runner process of `model`.
pub fn runner_crashed(model: &str) {
    metrics()
        .runner_crashes
        .with_label_values(&[label(model).as_str()])
        .inc();
}

/// The last streaming counters of a load now gone (from the pool, once its
/// engine stopped): what it counted since the last scrape is not lost.
pub fn model_gone(model: &str, id: u64, last: Option<crate::core::backend::StreamCounters>) {
    let m = metrics();
    if let Some(last) = last {
        m.ledger.observe(m, model, id, &last);
    }
    m.ledger.forget(id);
    m.prompt_cache.forget(id);
}

/// Seconds since the Unix epoch.
fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

pub use http::note_model;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::backend::StreamCounters;

    #[test]
    fn token_buckets_go_one_two_five_up_to_the_limit() {
        assert_eq!(
            token_buckets(1000),
            [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0]
        );
        assert_eq!(token_buckets(30), [1.0, 2.0, 5.0, 10.0, 20.0]);
    }

    fn counters(bytes: u64, seconds: f64) -> StreamCounters {
        StreamCounters {
            nvme_bytes_read: bytes,
            read_seconds: seconds,
            ..Default::default()
        }
    }

    #[test]
    fn the_ledger_adds_what_each_load_counted_since_it_was_last_seen() {
        let m = Metrics::new();
        let read = |model: &str| m.stream_read_bytes.with_label_values(&[model]).get();
        m.ledger.observe(&m, "a", 1, &counters(100, 0.5));
        m.ledger.observe(&m, "a", 1, &counters(250, 1.0));
        assert_eq!(read("a"), 250);
        // A reload counts from zero; the first load's last counts stay.
        m.ledger.observe(&m, "a", 1, &counters(300, 1.0));
        m.ledger.forget(1);
        m.ledger.observe(&m, "a", 2, &counters(40, 0.1));
        assert_eq!(read("a"), 340);
        assert!((m.stream_read_seconds.with_label_values(&["a"]).get() - 1.1).abs() < 1e-12);
        // Another model is apart.
        m.ledger.observe(&m, "b", 3, &counters(7, 0.0));
        assert_eq!(read("b"), 7);
        assert_eq!(read("a"), 340);
    }

    #[test]
    fn stream_counters_of_two_placements_add_up_and_keep_the_later_gauges() {
        let first = StreamCounters {
            expert_hits: 3,
            cache_bytes: 10,
            ..counters(100, 1.0)
        };
        let later = StreamCounters {
            expert_hits: 4,
            cache_bytes: 20,
            ..counters(50, 0.5)
        };
        let both = first.then(&later);
        assert_eq!(both.nvme_bytes_read, 150);
        assert_eq!(both.expert_hits, 7);
        assert_eq!(both.read_seconds, 1.5);
        assert_eq!(both.cache_bytes, 20);
    }
}
