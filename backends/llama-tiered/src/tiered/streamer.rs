//! The streamer: makes STREAM weights resident just before llama.cpp uses
//! them, within a RAM budget, and counts honestly what that cost.
//!
//! Units of residency: in expert-streaming one unit is one expert of one
//! layer (its slices of the stacked gate/up/down tensors); in
//! dense-FFN-streaming one unit is one layer's FFN matrices. A unit needed by
//! the node being computed is pinned (refcount) and never evicted; pins are
//! dropped when the next layer's request arrives, which llama.cpp only makes
//! after the previous layer's matmuls ran (graph order on one thread).
use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;

use super::placement::Mode;
use crate::gguf::GgufFile;
use crate::llama::{EvalHook, Node, StreamRegion, PAGE};

/// `(layer, expert)`; dense units use expert 0.
type UnitKey = (u32, u32);

/// Counters of one model's streaming, cumulative since load.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StreamStats {
    pub mode: String,
    /// Bytes the kernel delivered from the model file after load.
    pub nvme_bytes_read: u64,
    /// Unit lookups (per expert, or per dense layer, per ubatch) already resident.
    pub expert_hits: u64,
    /// Unit lookups that had to be read.
    pub expert_misses: u64,
    pub prefetch_hits: u64,
    pub prefetch_wasted_bytes: u64,
    /// Time the decoding thread waited for reads.
    pub io_stall_seconds: f64,
    /// `nvme_bytes_read / io_stall_seconds`, in GB/s.
    pub read_gbps: f64,
    /// Bytes of units resident now, and the most ever resident at once.
    pub cache_bytes: u64,
    pub cache_peak_bytes: u64,
    pub cache_budget_bytes: u64,
    pub evictions: u64,
}

struct Unit {
    /// File byte ranges of the unit's slices.
    ranges: Vec<(u64, u64)>,
    bytes: u64,
    resident: bool,
    pins: u32,
    score: f64,
    last_use: u64,
}

struct State {
    units: HashMap<UnitKey, Unit>,
    pinned: Vec<UnitKey>,
    cache_bytes: u64,
    clock: u64,
    accesses_since_ageing: u64,
    stats: StreamStats,
    error: Option<String>,
}

pub struct Streamer {
    mode: Mode,
    region: Arc<StreamRegion>,
    file: File,
    budget_bytes: u64,
    state: Mutex<State>,
    failed: AtomicBool,
}

impl Streamer {
    /// Builds the unit table of `mode` from the file's tensors. Fails when
    /// `budget_bytes` cannot hold what one layer may need at once.
    pub fn new(
        gguf: &GgufFile,
        mode: Mode,
        region: Arc<StreamRegion>,
        file: File,
        budget_bytes: u64,
    ) -> Result<Streamer, String> {
        let mut units: HashMap<UnitKey, Unit> = HashMap::new();
        for t in gguf.tensors() {
            if !super::placement::is_streamed(mode, &t.name) {
                continue;
            }
            let layer = hypura_scheduler::roles::layer_index(&t.name)
                .ok_or(format!("{} has no layer", t.name))?;
            let n_expert = if mode == Mode::ExpertStreaming {
                t.dims.get(2).copied().unwrap_or(1).max(1)
            } else {
                1
            };
            let slice = t.n_bytes / n_expert;
            for e in 0..n_expert {
                let start = t.offset_in_file + e * slice;
                let unit = units.entry((layer, e as u32)).or_insert_with(|| Unit {
                    ranges: Vec::new(),
                    bytes: 0,
                    resident: false,
                    pins: 0,
                    score: 0.0,
                    last_use: 0,
                });
                unit.ranges.push((start, start + slice));
                unit.bytes += slice;
            }
        }
        let mut per_layer: HashMap<u32, u64> = HashMap::new();
        for ((layer, _), u) in &units {
            *per_layer.entry(*layer).or_insert(0) += u.bytes;
        }
        let minimum = per_layer.values().copied().max().unwrap_or(0);
        if budget_bytes < minimum {
            return Err(format!(
                "the RAM budget for streamed weights ({budget_bytes} bytes) is below the {minimum} bytes one layer may need at once ({mode})"
            ));
        }
        let stats = StreamStats {
            mode: mode.to_string(),
            cache_budget_bytes: budget_bytes,
            ..Default::default()
        };
        Ok(Streamer {
            mode,
            region,
            file,
            budget_bytes,
            state: Mutex::new(State {
                units,
                pinned: Vec::new(),
                cache_bytes: 0,
                clock: 0,
                accesses_since_ageing: 0,
                stats,
                error: None,
            }),
            failed: AtomicBool::new(false),
        })
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn stats(&self) -> StreamStats {
        let state = self.lock();
        let mut stats = state.stats.clone();
        stats.cache_bytes = state.cache_bytes;
        stats.read_gbps = if stats.io_stall_seconds > 0.0 {
            stats.nvme_bytes_read as f64 / stats.io_stall_seconds / 1e9
        } else {
            0.0
        };
        stats
    }

    /// Bytes of the STREAM region actually in memory (from the kernel), for
    /// checking the accounting.
    pub fn region_resident_bytes(&self) -> u64 {
        self.region.resident_bytes()
    }

    /// The page-rounded span a unit's read covers (what a miss costs in bytes read).
    pub fn unit_read_bytes(ranges: &[(u64, u64)]) -> u64 {
        ranges
            .iter()
            .map(|&(a, b)| round_up(b, PAGE) - (a & !(PAGE - 1)))
            .sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Makes the units `(layer, e)` for every `e` in `experts` resident and
    /// pins them until the next request; drops the previous request's pins.
    fn ensure(&self, layer: u32, experts: &[u32]) {
        let started = Instant::now();
        let misses = {
            let mut state = self.lock();
            let pinned = std::mem::take(&mut state.pinned);
            for key in pinned {
                if let Some(u) = state.units.get_mut(&key) {
                    u.pins = u.pins.saturating_sub(1);
                }
            }
            state.clock += 1;
            let clock = state.clock;
            let mut misses = Vec::new();
            for &e in experts {
                let key = (layer, e);
                let Some(unit) = state.units.get_mut(&key) else {
                    continue;
                };
                unit.pins += 1;
                unit.score += 1.0;
                unit.last_use = clock;
                let (resident, bytes, ranges) = (unit.resident, unit.bytes, unit.ranges.clone());
                state.pinned.push(key);
                state.accesses_since_ageing += 1;
                if resident {
                    state.stats.expert_hits += 1;
                } else {
                    state.stats.expert_misses += 1;
                    misses.push((key, bytes, ranges));
                }
            }
            self.age(&mut state);
            let needed: u64 = misses.iter().map(|m| m.1).sum();
            self.make_room(&mut state, needed);
            for (key, bytes, _) in &misses {
                if let Some(u) = state.units.get_mut(key) {
                    u.resident = true;
                }
                state.cache_bytes += bytes;
            }
            state.stats.cache_peak_bytes = state.stats.cache_peak_bytes.max(state.cache_bytes);
            misses
        };
        if misses.is_empty() {
            return;
        }
        let reads: Vec<(u64, u64)> = misses.iter().flat_map(|m| m.2.iter().copied()).collect();
        let result = self.read_ranges(&reads);
        let mut state = self.lock();
        match result {
            Ok(bytes) => state.stats.nvme_bytes_read += bytes,
            Err(e) => {
                // Never leave a unit marked resident with bytes that did not arrive.
                for (key, bytes, ranges) in &misses {
                    if let Some(u) = state.units.get_mut(key) {
                        u.resident = false;
                    }
                    for &(a, b) in ranges {
                        self.region.release(a, b);
                    }
                    state.cache_bytes -= bytes;
                }
                state.error = Some(e);
                self.failed.store(true, Ordering::SeqCst);
            }
        }
        state.stats.io_stall_seconds += started.elapsed().as_secs_f64();
    }

    /// Reads ranges, spread over a few threads when there are several.
    fn read_ranges(&self, ranges: &[(u64, u64)]) -> Result<u64, String> {
        let read = |&(a, b): &(u64, u64)| {
            self.region
                .read_from(&self.file, a, b)
                .map_err(|e| format!("reading the model file at {a}..{b}: {e}"))
        };
        if ranges.len() == 1 {
            return read(&ranges[0]);
        }
        let threads = ranges.len().min(4);
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let read = &read;
                    scope.spawn(move || {
                        ranges
                            .iter()
                            .skip(t)
                            .step_by(threads)
                            .try_fold(0u64, |sum, r| read(r).map(|n| sum + n))
                    })
                })
                .collect();
            handles.into_iter().try_fold(0u64, |sum, h| {
                h.join()
                    .map_err(|_| "a read thread panicked".to_string())?
                    .map(|n| sum + n)
            })
        })
    }

    /// Frequency with ageing: every few passes over the table, halve all scores.
    fn age(&self, state: &mut State) {
        if state.accesses_since_ageing >= 4 * state.units.len() as u64 {
            state.accesses_since_ageing = 0;
            for u in state.units.values_mut() {
                u.score *= 0.5;
            }
        }
    }

    /// Evicts unpinned units until `needed` more bytes fit in the budget.
    /// Lowest score goes first; ties go to the least recently used expert,
    /// or, for dense layers (used in a cycle), the most recently used one.
    fn make_room(&self, state: &mut State, needed: u64) {
        while state.cache_bytes + needed > self.budget_bytes {
            let dense = self.mode == Mode::DenseFfnStreaming;
            let victim = state
                .units
                .iter()
                .filter(|(_, u)| u.resident && u.pins == 0)
                .min_by(|(_, a), (_, b)| {
                    a.score.total_cmp(&b.score).then(if dense {
                        b.last_use.cmp(&a.last_use)
                    } else {
                        a.last_use.cmp(&b.last_use)
                    })
                })
                .map(|(k, _)| *k);
            let Some(key) = victim else {
                // Everything resident is pinned: cannot happen when the
                // budget passed the per-layer minimum checked in `new`.
                tracing::error!("stream cache over budget: every resident unit is in use");
                return;
            };
            let unit = state.units.get_mut(&key).expect("victim exists");
            unit.resident = false;
            let (bytes, ranges) = (unit.bytes, unit.ranges.clone());
            for (a, b) in ranges {
                self.region.release(a, b);
            }
            state.cache_bytes -= bytes;
            state.stats.evictions += 1;
        }
    }
}

fn round_up(x: u64, to: u64) -> u64 {
    x.div_ceil(to) * to
}

fn layer_of(name: &[u8], prefix: &[u8]) -> Option<u32> {
    std::str::from_utf8(name.strip_prefix(prefix)?)
        .ok()?
        .parse()
        .ok()
}

impl EvalHook for Streamer {
    fn wants(&self, name: &[u8]) -> bool {
        match self.mode {
            Mode::ExpertStreaming => name.starts_with(b"ffn_moe_topk-"),
            Mode::DenseFfnStreaming => name.starts_with(b"ffn_norm-"),
            Mode::FullResident => false,
        }
    }

    fn computed(&self, name: &[u8], node: &Node) {
        match self.mode {
            Mode::ExpertStreaming => {
                let Some(layer) = layer_of(name, b"ffn_moe_topk-") else {
                    return;
                };
                let mut experts: Vec<u32> = node
                    .i32_rows()
                    .into_iter()
                    .flatten()
                    .filter(|&e| e >= 0)
                    .map(|e| e as u32)
                    .collect();
                experts.sort_unstable();
                experts.dedup();
                self.ensure(layer, &experts);
            }
            Mode::DenseFfnStreaming => {
                if let Some(layer) = layer_of(name, b"ffn_norm-") {
                    self.ensure(layer, &[0]);
                }
            }
            Mode::FullResident => {}
        }
    }

    fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    fn take_error(&self) -> Option<String> {
        let error = self.lock().error.take();
        if error.is_some() {
            self.failed.store(false, Ordering::SeqCst);
        }
        error
    }
}
