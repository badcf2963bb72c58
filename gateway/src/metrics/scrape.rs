//! What `/metrics` reads when Prometheus scrapes: the pool's models (their
//! slots, tiers, residency and streaming counters), the budget's books and
//! the process; then the text encoding of every family.
use std::collections::HashMap;
use std::sync::Mutex;

use prometheus::{Encoder, TextEncoder};

use super::{metrics, unix_seconds, Metrics};
use crate::core::backend::{Residency, StreamCounters};
use crate::pool::registry::Registry;

/// Turns the cumulative streaming counters each load reports into exact
/// Prometheus counters: what a load counted since it was last looked at is
/// added to its model's counters. A load's entry goes with it
/// ([`super::model_gone`]), after its last counts were added.
#[derive(Default)]
pub(crate) struct StreamLedger {
    seen: Mutex<HashMap<u64, StreamCounters>>,
}

impl StreamLedger {
    pub(crate) fn observe(&self, m: &Metrics, model: &str, id: u64, now: &StreamCounters) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let before = seen.entry(id).or_default();
        let model = [model];
        let add = |c: &prometheus::IntCounterVec, now: u64, before: u64| {
            c.with_label_values(&model)
                .inc_by(now.saturating_sub(before));
        };
        let add_seconds = |c: &prometheus::CounterVec, now: f64, before: f64| {
            let delta = now - before;
            if delta > 0.0 {
                c.with_label_values(&model).inc_by(delta);
            } else {
                // Present from the first look, even at zero.
                c.with_label_values(&model);
            }
        };
        add(
            &m.stream_read_bytes,
            now.nvme_bytes_read,
            before.nvme_bytes_read,
        );
        add(&m.expert_hits, now.expert_hits, before.expert_hits);
        add(&m.expert_misses, now.expert_misses, before.expert_misses);
        add(&m.prefetch_hits, now.prefetch_hits, before.prefetch_hits);
        add(
            &m.prefetch_wasted_bytes,
            now.prefetch_wasted_bytes,
            before.prefetch_wasted_bytes,
        );
        add(&m.evictions, now.evictions, before.evictions);
        add_seconds(
            &m.stream_read_seconds,
            now.read_seconds,
            before.read_seconds,
        );
        add_seconds(
            &m.io_stall_seconds,
            now.io_stall_seconds,
            before.io_stall_seconds,
        );
        *before = now.clone();
    }

    pub(crate) fn forget(&self, id: u64) {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    }
}

/// The values read at scrape time are reset and set under this lock, so
/// that two scrapes at once never see each other's half.
static SCRAPE: Mutex<()> = Mutex::new(());

/// Reads the pool and the process into the gauges and the streaming
/// counters, and encodes every family in Prometheus's text format.
pub fn render(pool: &Registry) -> String {
    let _guard = SCRAPE.lock().unwrap_or_else(|p| p.into_inner());
    let m = metrics();
    read_pool(m, pool);
    m.resident_memory
        .set(resident_memory_bytes().unwrap_or(0) as i64);
    let mut out = Vec::new();
    TextEncoder::new()
        .encode(&m.registry.gather(), &mut out)
        .expect("the text encoder writes to memory");
    String::from_utf8(out).expect("the text format is UTF-8")
}

fn read_pool(m: &Metrics, pool: &Registry) {
    for family in [
        &m.running,
        &m.waiting,
        &m.slots_busy,
        &m.slots_total,
        &m.kv_cache_bytes,
        &m.resident_bytes,
        &m.residency,
        &m.budget_limit,
        &m.budget_charged,
        &m.stream_cache_bytes,
        &m.stream_cache_budget_bytes,
    ] {
        family.reset();
    }
    m.kv_cache_usage.reset();
    m.prompt_cache.reset_gauges();
    m.decode_rate.reset();
    super::inference_extension::reset();
    let loaded = pool.loaded_backends();
    m.loaded_models.set(loaded.len() as i64);
    let runners = pool.settings().runners.is_some();
    for model in &loaded {
        let name = [model.name.as_str()];
        if runners {
            // Present from the model's first load, even at zero.
            m.runner_crashes.with_label_values(&name);
        }
        zero_series(m, &model.name);
        let status = model.backend.status();
        m.running.with_label_values(&name).set(status.active as i64);
        // Requests wait at the model's fair queue, the engine's stays empty.
        let waiting = status.queued + super::users::fair_waiting_total(&model.name);
        m.waiting.with_label_values(&name).set(waiting as i64);
        m.slots_busy
            .with_label_values(&name)
            .set(status.active as i64);
        m.slots_total
            .with_label_values(&name)
            .set(i64::from(status.parallel));
        if let Some(rate) = status.decode_tokens_per_second {
            m.decode_rate.with_label_values(&name).set(rate);
        }
        let kv = model.backend.kv_cache();
        let kv_cells = kv.map(|kv| (kv.cells_used, kv.cells));
        super::inference_extension::set(&model.name, waiting, status.active, kv_cells);
        if let Some(kv) = kv {
            m.kv_cache_bytes
                .with_label_values(&name)
                .set(kv.bytes as i64);
            let usage = kv.cells_used as f64 / kv.cells.max(1) as f64;
            m.kv_cache_usage.with_label_values(&name).set(usage);
            m.prompt_cache
                .observe(&model.name, model.id, &kv.prompt_cache);
        }
        let memory = model.backend.memory();
        let tiers = memory.tier_bytes;
        for (tier, bytes) in [
            ("gpu", tiers.gpu),
            ("ram", tiers.ram),
            ("stream", tiers.stream),
        ] {
            m.resident_bytes
                .with_label_values(&[model.name.as_str(), tier])
                .set(bytes as i64);
        }
        for state in [Residency::Streaming, Residency::Partial, Residency::Full] {
            m.residency
                .with_label_values(&[model.name.as_str(), state.as_str()])
                .set(i64::from(memory.residency == state));
        }
        // A model that streams nothing holds 0 bytes of streamed units.
        m.stream_cache_bytes.with_label_values(&name).set(0);
        m.stream_cache_budget_bytes.with_label_values(&name).set(0);
        if let Some(stream) = model.backend.streaming() {
            m.ledger.observe(m, &model.name, model.id, &stream);
            m.stream_cache_bytes
                .with_label_values(&name)
                .set(stream.cache_bytes as i64);
            m.stream_cache_budget_bytes
                .with_label_values(&name)
                .set(stream.cache_budget_bytes as i64);
        }
    }
    if let Some((limit, charged)) = pool.budget_books() {
        for (tier, limit, charged) in [
            ("gpu", limit.gpu_bytes, charged.gpu_bytes),
            ("ram", limit.ram_bytes, charged.ram_bytes),
        ] {
            // No RAM limit is u64::MAX: left out rather than a huge number.
            if limit != u64::MAX {
                m.budget_limit.with_label_values(&[tier]).set(limit as i64);
            }
            m.budget_charged
                .with_label_values(&[tier])
                .set(charged as i64);
        }
    }
}

/// Makes every per-model series of a loaded model exist, at 0 until its
/// first event, so that no dashboard panel of a healthy server says "No
/// data" (Prometheus's advice: initialise the series you know of).
fn zero_series(m: &Metrics, model: &str) {
    let name = [model];
    for reason in ["cancelled", "error"] {
        m.aborted.with_label_values(&[model, reason]);
    }
    for reason in ["queue_full", "budget_timeout"] {
        m.rejected.with_label_values(&[model, reason]);
    }
    for reason in ["stop", "length"] {
        m.success.with_label_values(&[model, reason]);
    }
    for kind in ["load", "unload", "promotion", "demotion", "switch"] {
        m.moves.with_label_values(&[model, kind]);
    }
    for kind in ["load", "switch"] {
        m.move_duration.with_label_values(&[model, kind]);
    }
    for histogram in [
        &m.ttft,
        &m.itl,
        &m.e2e,
        &m.queue_time,
        &m.prefill_time,
        &m.decode_time,
        &m.prompt_tokens_per_request,
        &m.generation_tokens_per_request,
    ] {
        histogram.with_label_values(&name);
    }
    for counter in [
        &m.prompt_tokens,
        &m.generation_tokens,
        &m.runner_crashes,
        &m.stream_read_bytes,
        &m.expert_hits,
        &m.expert_misses,
        &m.prefetch_hits,
        &m.prefetch_wasted_bytes,
        &m.evictions,
    ] {
        counter.with_label_values(&name);
    }
    m.stream_read_seconds.with_label_values(&name);
    m.io_stall_seconds.with_label_values(&name);
    m.budget_waiting.with_label_values(&name);
    super::users::fair_waiting_total(model);
}

/// The process's resident set, from `/proc/self/status` (`None` elsewhere).
fn resident_memory_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// When the process started, in seconds since the Unix epoch: from
/// `/proc/self/stat` and the boot time where there is a `/proc`, else when
/// the metrics were first used (at server start).
pub(crate) fn process_start_seconds() -> f64 {
    proc_start_seconds().unwrap_or_else(|| unix_seconds(std::time::SystemTime::now()))
}

fn proc_start_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')')?.1;
    // starttime is field 22; `rest` begins at field 3.
    let ticks: f64 = rest.split_whitespace().nth(19)?.parse().ok()?;
    let boot: f64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // USER_HZ is 100 on every Linux architecture Rust targets.
    Some(boot + ticks / 100.0)
}
