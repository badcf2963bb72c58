//! The prompt cache's families: prefix-cache queries and hits in tokens
//! (vLLM's `prefix_cache_queries`/`prefix_cache_hits` meaning), restores by
//! tier and their seconds, saves, and bytes and entries per tier. Each
//! runner reports its engine's cumulative counts with its KV cache
//! ([`crate::core::backend::KvCache::prompt_cache`]); a ledger of what each
//! load reported last turns them into counters that never go back.
use std::collections::HashMap;
use std::sync::Mutex;

use llama_tiered::engine::PromptCacheStatus;
use prometheus::{CounterVec, IntCounterVec, IntGaugeVec, Registry};

pub struct PromptCacheMetrics {
    pub query_tokens: IntCounterVec,
    pub hit_tokens: IntCounterVec,
    pub restores: IntCounterVec,
    pub restore_seconds: CounterVec,
    pub saves: IntCounterVec,
    pub save_seconds: CounterVec,
    pub bytes: IntGaugeVec,
    pub entries: IntGaugeVec,
    pub limit_bytes: IntGaugeVec,
    seen: Mutex<HashMap<u64, PromptCacheStatus>>,
}

impl PromptCacheMetrics {
    pub(super) fn new(r: &Registry) -> PromptCacheMetrics {
        let model = &["model"];
        PromptCacheMetrics {
            query_tokens: super::counter(
                r,
                "hypura_prefix_cache_queries_total",
                "Prompt tokens looked up in the prompt cache.",
                model,
            ),
            hit_tokens: super::counter(
                r,
                "hypura_prefix_cache_hits_total",
                "Prompt tokens found in the prompt cache (not evaluated).",
                model,
            ),
            restores: super::counter(
                r,
                "hypura_prompt_cache_restores_total",
                "Requests that started from a cached prefix, by tier: slot (its own KV), ram, disk.",
                &["model", "tier"],
            ),
            restore_seconds: super::float_counter(
                r,
                "hypura_prompt_cache_restore_seconds_total",
                "Seconds spent loading saved KV states into slots (ram and disk restores).",
                model,
            ),
            saves: super::counter(
                r,
                "hypura_prompt_cache_saves_total",
                "Conversations saved from a slot before another took it.",
                model,
            ),
            save_seconds: super::float_counter(
                r,
                "hypura_prompt_cache_save_seconds_total",
                "Seconds spent copying conversations' KV states out of slots (on the path of the request that took the slot).",
                model,
            ),
            bytes: super::gauge(
                r,
                "hypura_prompt_cache_bytes",
                "Bytes of saved KV states per tier (ram, disk).",
                &["model", "tier"],
            ),
            entries: super::gauge(
                r,
                "hypura_prompt_cache_entries",
                "Saved KV states per tier (ram, disk).",
                &["model", "tier"],
            ),
            limit_bytes: super::gauge(
                r,
                "hypura_prompt_cache_limit_bytes",
                "Bytes the RAM tier of a model's prompt cache may hold now.",
                model,
            ),
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Clears the gauges before a scrape sets those of the loaded models.
    pub(crate) fn reset_gauges(&self) {
        self.bytes.reset();
        self.entries.reset();
        self.limit_bytes.reset();
    }

    /// Adds what load `id` of `model` counted since it was last seen, and
    /// sets its gauges.
    pub(crate) fn observe(&self, model: &str, id: u64, now: &PromptCacheStatus) {
        let before = {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            seen.insert(id, *now).unwrap_or_default()
        };
        let add = |c: &IntCounterVec, labels: &[&str], now: u64, before: u64| {
            c.with_label_values(labels)
                .inc_by(now.saturating_sub(before));
        };
        let m = [model];
        add(
            &self.query_tokens,
            &m,
            now.query_tokens_total,
            before.query_tokens_total,
        );
        add(
            &self.hit_tokens,
            &m,
            now.hit_tokens_total,
            before.hit_tokens_total,
        );
        add(&self.saves, &m, now.saves_total, before.saves_total);
        for (tier, now, before) in [
            ("slot", now.slot_hits_total, before.slot_hits_total),
            ("ram", now.ram_restores_total, before.ram_restores_total),
            ("disk", now.disk_restores_total, before.disk_restores_total),
        ] {
            add(&self.restores, &[model, tier], now, before);
        }
        let add_seconds = |c: &CounterVec, now_micros: u64, before_micros: u64| {
            let micros = now_micros.saturating_sub(before_micros);
            c.with_label_values(&m).inc_by(micros as f64 / 1e6);
        };
        add_seconds(
            &self.restore_seconds,
            now.restore_micros_total,
            before.restore_micros_total,
        );
        add_seconds(
            &self.save_seconds,
            now.save_micros_total,
            before.save_micros_total,
        );
        for (tier, bytes, entries) in [
            ("ram", now.ram_bytes, now.ram_entries),
            ("disk", now.disk_bytes, now.disk_entries),
        ] {
            let labels = [model, tier];
            self.bytes.with_label_values(&labels).set(bytes as i64);
            self.entries.with_label_values(&labels).set(entries as i64);
        }
        self.limit_bytes
            .with_label_values(&m)
            .set(now.ram_limit_bytes as i64);
    }

    /// A load gone: its last counts were observed, nothing more will come.
    pub(crate) fn forget(&self, id: u64) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_add_each_loads_progress_and_a_new_load_starts_from_zero() {
        let registry = Registry::new();
        let m = PromptCacheMetrics::new(&registry);
        let status = |queries, hits, ram| PromptCacheStatus {
            query_tokens_total: queries,
            hit_tokens_total: hits,
            ram_restores_total: ram,
            ram_bytes: 5,
            ..Default::default()
        };
        m.observe("a", 1, &status(100, 40, 1));
        m.observe("a", 1, &status(150, 80, 2));
        m.forget(1);
        m.observe("a", 2, &status(30, 10, 0));
        let get = |c: &IntCounterVec, l: &[&str]| c.with_label_values(l).get();
        assert_eq!(get(&m.query_tokens, &["a"]), 180);
        assert_eq!(get(&m.hit_tokens, &["a"]), 90);
        assert_eq!(get(&m.restores, &["a", "ram"]), 2);
        assert_eq!(get(&m.restores, &["a", "disk"]), 0);
        assert_eq!(m.bytes.with_label_values(&["a", "ram"]).get(), 5);
    }
}
