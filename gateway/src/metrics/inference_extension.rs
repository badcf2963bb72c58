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
//! | KVCacheUtilization | `vllm:kv_cache_usage_perc` (0 to 1, as vLLM), and its older name `vllm:gpu_cache_usage_perc` | `hypura_kv_cache_usage_ratio` |
//! | [optional] BlockSize, NumGPUBlocks | `vllm:cache_config_info{block_size, num_gpu_blocks}` = 1 | llama.cpp's KV cells are one token each: `block_size` 1, `num_gpu_blocks` the cells |
//! | LoRA adapters | `vllm:lora_requests_info{max_lora="0", running_lora_adapters="", waiting_lora_adapters=""}` = scrape time | hypura serves no adapters: the endpoint picker's LoRA affinity sees none |
//!
//! `TotalQueuedRequests` counts the requests waiting at the model's fair
//! queue ([`crate::tenancy::fair`]) and in its engine; the readiness the
//! protocol's Deployment probes is `GET /ready`. `gateway/tests/observability/inference_extension.rs`
//! holds `/metrics` to this table.
use std::sync::OnceLock;

use prometheus::{GaugeVec, IntGaugeVec};

use super::{float_gauge, gauge, metrics};

struct Aliases {
    waiting: IntGaugeVec,
    running: IntGaugeVec,
    kv_cache_usage: GaugeVec,
    kv_cache_usage_old: GaugeVec,
    cache_config: IntGaugeVec,
    lora: GaugeVec,
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
                "vllm:kv_cache_usage_perc",
                "KV cache cells in use, 0 to 1 (alias of hypura_kv_cache_usage_ratio for the Gateway API Inference Extension).",
                label,
            ),
            kv_cache_usage_old: float_gauge(
                r,
                "vllm:gpu_cache_usage_perc",
                "KV cache cells in use, 0 to 1 (vLLM's older name of vllm:kv_cache_usage_perc).",
                label,
            ),
            cache_config: gauge(
                r,
                "vllm:cache_config_info",
                "1, labelled with the KV cache's block size in tokens (1: llama.cpp's cells) and its blocks, per model.",
                &["model_name", "block_size", "num_gpu_blocks"],
            ),
            lora: float_gauge(
                r,
                "vllm:lora_requests_info",
                "When last updated (Unix seconds), labelled with the LoRA adapters loaded and waiting: none in hypura.",
                &["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
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
    a.kv_cache_usage_old.reset();
    a.cache_config.reset();
    a.lora
        .with_label_values(&["0", "", ""])
        .set(super::unix_seconds(std::time::SystemTime::now()));
}

/// A loaded model's values now; the KV cache's `(cells used, cells)` when
/// the backend knows them.
pub fn set(model: &str, waiting: usize, running: usize, kv_cells: Option<(u64, u64)>) {
    let a = aliases();
    let label = [model];
    a.waiting.with_label_values(&label).set(waiting as i64);
    a.running.with_label_values(&label).set(running as i64);
    if let Some((used, cells)) = kv_cells {
        let usage = used as f64 / cells.max(1) as f64;
        a.kv_cache_usage.with_label_values(&label).set(usage);
        a.kv_cache_usage_old.with_label_values(&label).set(usage);
        a.cache_config
            .with_label_values(&[model, "1", &cells.to_string()])
            .set(1);
    }
}
