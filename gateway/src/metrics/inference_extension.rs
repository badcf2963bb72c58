//! The gauges a cluster gateway reads to pick a model server: the Gateway
//! API Inference Extension's model-server protocol
//! (`docs/proposals/003-model-server-protocol`) names them by vLLM's
//! metrics, which its reference endpoint picker scrapes. They are exported
//! here under those names, as aliases of hypura's own gauges, per model
//! (label `model_name`, as vLLM labels them):
//!
//! | protocol metric | exported as | alias of |
//! |---|---|---|
//! | TotalQueuedRequests | `vllm:num_requests_waiting` | `hypura_requests_waiting` |
//! | TotalRunningRequests | `vllm:num_requests_running` | `hypura_requests_running` |
//! | KVCacheUtilization | `vllm:gpu_cache_usage_perc` (0 to 1, as vLLM) | `hypura_kv_cache_usage_ratio` |
use std::sync::OnceLock;

use prometheus::{GaugeVec, IntGaugeVec};

use super::{float_gauge, gauge, metrics};

struct Aliases {
    waiting: IntGaugeVec,
    running: IntGaugeVec,
    kv_cache_usage: GaugeVec,
}

fn aliases() -> &'static Aliases {
    static ALIASES: OnceLock<Aliases> = OnceLock::new();
    ALIASES.get_or_init(|| {
        let r = &metrics().registry;
        let label = &["model_name"];
        Aliases {
            waiting: gauge(
                r,
                "vllm:num_requests_waiting",
                "Requests waiting for a slot (alias of hypura_requests_waiting for the Gateway API Inference Extension).",
                label,
            ),
            running: gauge(
                r,
                "vllm:num_requests_running",
                "Requests generating now (alias of hypura_requests_running for the Gateway API Inference Extension).",
                label,
            ),
            kv_cache_usage: float_gauge(
                r,
                "vllm:gpu_cache_usage_perc",
                "KV cache cells in use, 0 to 1 (alias of hypura_kv_cache_usage_ratio for the Gateway API Inference Extension).",
                label,
            ),
        }
    })
}

/// Clears every model's values before a scrape sets them again.
pub fn reset() {
    let a = aliases();
    a.waiting.reset();
    a.running.reset();
    a.kv_cache_usage.reset();
}

/// A loaded model's values now; `kv_cache_usage` when the backend knows it.
pub fn set(model: &str, waiting: usize, running: usize, kv_cache_usage: Option<f64>) {
    let a = aliases();
    let label = [model];
    a.waiting.with_label_values(&label).set(waiting as i64);
    a.running.with_label_values(&label).set(running as i64);
    if let Some(usage) = kv_cache_usage {
        a.kv_cache_usage.with_label_values(&label).set(usage);
    }
}
