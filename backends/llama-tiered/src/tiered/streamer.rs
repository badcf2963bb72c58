//! The streamer: makes STREAM weights resident just before llama.cpp uses
//! them, within a RAM budget, and counts honestly what that cost.
//!
//! Units of residency: in expert-streaming one unit is one expert of one
//! layer (its slices of the stacked gate/up/down tensors); in
//! dense-FFN-streaming one unit is one layer's FFN matrices. A unit needed by
//! the node being computed is pinned (refcount) and never evicted; pins are
//! dropped when the same thread's next layer's request arrives, which
//! llama.cpp only makes after the previous layer's matmuls ran (graph order
//! on one thread), or when its decode ends. Pins are kept per decoding
//! thread, so several contexts (one per thread) may share a streamer.
//!
//! Prefetch: a background thread reads units predicted to be needed next
//! while the decoding thread computes — the next `k` layers in
//! dense-FFN-streaming (`k` adapted to measured read vs compute time), the
//! experts layer L+1 most often selected together with layer L's choice in
//! expert-streaming (co-activation counts), where a right guess pays for the
//! wrong ones ([`prefetch_min_chance`]). A unit being read is `Loading`;
//! a request for it waits for the read instead of reading it again.
//!
//! Prompt chunks (expert-streaming): a ubatch of at least
//! [`PROMPT_UBATCH_TOKENS`] tokens routes to nearly every expert of every
//! layer, so it is served layer by layer as a pass over the file: a layer's
//! request reads each expert it lacks once, in file order, while the
//! prefetcher reads the layers after it in file order (overlapping this
//! layer's compute) as far as room from the layers computed allows; room is
//! made by evicting the layer needed last in the pass (the one just
//! computed), so a cache smaller than the pass keeps the same layers across
//! chunks instead of cycling all of them. Their reads and waits are counted
//! apart ([`StreamStats::prompt_stream`]).
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, OnceLock, Weak};
use std::thread::ThreadId;
use std::time::Instant;

use hypura_scheduler::reads::{MeasuredReads, ReadTotals};
use serde::Serialize;

use super::coact::Coactivation;
use super::pinning::Registered;
use super::placement::{Mode, Placement, Tier};
use crate::llama::device::HostPinning;
use crate::llama::{recycling_split_points, EvalHook, Node, StreamRegion, PAGE};
use hypura_gguf::GgufFile;

/// `(layer, expert)`; dense units use expert 0.
type UnitKey = (u32, u32);

/// Tokens of a ubatch from which expert-streaming serves it as a prompt
/// chunk (see the module doc): with 8 experts, 2 used, 32 tokens route to
/// each expert with probability 1 − (3/4)^32 > 0.9999; with 128, 8 used,
/// 0.87. llama.cpp's own threshold for copying host weights to a GPU.
pub const PROMPT_UBATCH_TOKENS: usize = 32;

/// Target of the debug events that trace each prompt pass layer by layer
/// (`RUST_LOG=hypura::pass=debug`): each layer's request (hits, misses,
/// bytes read on demand, stall), each read ahead (layer, bytes, time) and
/// the pass's end; their timestamps show where the disk idles.
pub const PASS_TRACE: &str = "hypura::pass";

/// Target of a trace event per unit evicted (`RUST_LOG=hypura::evict=trace`):
/// its layer and expert, the layer computing, and whether a prompt pass
/// evicted it; what emptied a layer between two passes shows there.
pub const EVICT_TRACE: &str = "hypura::evict";

/// What the prefetch thread is asked to read.
enum Ahead {
    /// One unit (a decode's prediction).
    Unit(UnitKey),
    /// The `.1` units of a layer most used so far (all of them for a large
    /// chunk), those that fit, in file order (a prompt chunk's next layer).
    Layer(u32, usize),
}

/// What [`Streamer::claim_layer`] found in a layer.
enum LayerClaim {
    /// Nothing to read: every unit asked for is resident (or being read).
    Whole,
    /// Units claimed for a read.
    Units(Claim),
    /// No room for any: the pass's read-ahead stops here.
    NoRoom,
}

/// Units of one layer claimed for a read ahead: loading, their room made.
struct Claim {
    layer: u32,
    /// Every unit asked for (else room ran out: the read-ahead stops after).
    all: bool,
    taken: Vec<UnitKey>,
    bytes: u64,
    /// Their ranges in file order.
    ranges: Vec<(u64, u64)>,
    /// Time taken choosing them and making their room.
    claim_seconds: f64,
    /// Bytes of their pages populated ahead of the read (counted arrived).
    populated: Option<u64>,
    /// Claimed for a cold pass ([`State::cold_pass`]).
    cold: bool,
}

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
    /// Seconds spent in reads, on the decoding thread and the prefetcher (summed).
    pub read_seconds: f64,
    /// `nvme_bytes_read / read_seconds`, in GB/s.
    pub read_gbps: f64,
    /// Bytes of units resident now, and the most ever resident at once.
    pub cache_bytes: u64,
    pub cache_peak_bytes: u64,
    /// The budget in force: the one set, or less under a host limit
    /// ([`Streamer::set_host_limit`]).
    pub cache_budget_bytes: u64,
    pub evictions: u64,
    /// Bytes of loads backed by pages moved from the units evicted for
    /// them ([`StreamRegion::adopt`]) instead of fresh ones.
    pub recycled_bytes: u64,
    /// Expert-streaming: layers whose experts were all resident when the
    /// router ran, so no expert lookup was made (nor counted above) and no
    /// sync was needed.
    pub resident_layer_skips: u64,
    /// Layers that asked the streamer for their units (each waited in
    /// `io_stall_seconds`), decodes' and prompt passes'.
    pub layer_requests: u64,
    /// Stream cache bytes registered with the GPU's driver now (see
    /// [`super::pinning`]), layers registered so far, and the seconds their
    /// registrations took (on a thread of their own).
    pub registered_bytes: u64,
    pub registrations: u64,
    pub register_seconds: f64,
    /// Weights resident per tier now (set by [`super::TieredModel::stats`]):
    /// GPU, and RAM including the stream cache.
    pub resident_gpu_bytes: u64,
    pub resident_ram_bytes: u64,
    /// Of the counters above, what prompt chunks cost (expert-streaming:
    /// the decodes of ubatches of at least [`PROMPT_UBATCH_TOKENS`] tokens,
    /// and the read-ahead they asked for); the rest is decode's.
    pub prompt_stream: PromptStreamStats,
}

/// What prompt chunks cost the stream (see [`StreamStats::prompt_stream`]).
#[derive(Debug, Clone, Default, Serialize)]
pub struct PromptStreamStats {
    /// Bytes read for prompt chunks, by their requests and their read-ahead.
    pub nvme_bytes_read: u64,
    /// Of those, bytes the read-ahead read (while a layer computed).
    pub read_ahead_bytes: u64,
    /// Seconds spent in those reads (request and read-ahead summed).
    pub read_seconds: f64,
    /// Of those bytes and seconds, the reads of cold passes: passes begun
    /// before the cache's first eviction (a model's first), which read
    /// slower than later ones (see [`hypura_scheduler::reads`]).
    pub cold_bytes_read: u64,
    pub cold_read_seconds: f64,
    /// `nvme_bytes_read / read_seconds`, in GB/s.
    pub read_gbps: f64,
    /// Time prompt chunks' decoding threads waited for reads.
    pub io_stall_seconds: f64,
    pub expert_hits: u64,
    pub expert_misses: u64,
    /// Of the hits, units the read-ahead brought in.
    pub prefetch_hits: u64,
    /// Layer requests of prompt chunks (one per layer with an expert to
    /// read, per chunk).
    pub layer_requests: u64,
    /// Bytes evicted to make room for prompt chunks' reads, and of those,
    /// bytes of layers the chunk had not computed yet: what it reads again
    /// later in the same pass (beyond the pass's window, a sign the cache
    /// is not keeping what the next pass needs).
    pub evicted_bytes: u64,
    pub evicted_ahead_bytes: u64,
}

impl PromptStreamStats {
    fn since(&self, earlier: &PromptStreamStats) -> PromptStreamStats {
        let read_seconds = (self.read_seconds - earlier.read_seconds).max(0.0);
        let nvme_bytes_read = self.nvme_bytes_read.saturating_sub(earlier.nvme_bytes_read);
        PromptStreamStats {
            nvme_bytes_read,
            read_ahead_bytes: self
                .read_ahead_bytes
                .saturating_sub(earlier.read_ahead_bytes),
            read_seconds,
            cold_bytes_read: self.cold_bytes_read.saturating_sub(earlier.cold_bytes_read),
            cold_read_seconds: (self.cold_read_seconds - earlier.cold_read_seconds).max(0.0),
            read_gbps: gbps(nvme_bytes_read, read_seconds),
            io_stall_seconds: (self.io_stall_seconds - earlier.io_stall_seconds).max(0.0),
            expert_hits: self.expert_hits.saturating_sub(earlier.expert_hits),
            expert_misses: self.expert_misses.saturating_sub(earlier.expert_misses),
            prefetch_hits: self.prefetch_hits.saturating_sub(earlier.prefetch_hits),
            layer_requests: self.layer_requests.saturating_sub(earlier.layer_requests),
            evicted_bytes: self.evicted_bytes.saturating_sub(earlier.evicted_bytes),
            evicted_ahead_bytes: self
                .evicted_ahead_bytes
                .saturating_sub(earlier.evicted_ahead_bytes),
        }
    }
}

/// `bytes / seconds` in GB/s (0 without time).
fn gbps(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 / seconds / 1e9
    } else {
        0.0
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Residency {
    Absent,
    /// Being read by the prefetcher; bytes already counted in the cache.
    Loading,
    Resident,
}

impl StreamStats {
    /// The reads as the planner prices them ([`hypura_scheduler::reads`]):
    /// warm prompt passes', cold ones', and the rest (decodes, and a dense
    /// model's every read).
    pub fn measured_reads(&self) -> MeasuredReads {
        let prompt = &self.prompt_stream;
        let cold_seconds = prompt.cold_read_seconds.min(prompt.read_seconds);
        MeasuredReads {
            decode: ReadTotals {
                bytes: self.nvme_bytes_read.saturating_sub(prompt.nvme_bytes_read) as f64,
                seconds: (self.read_seconds - prompt.read_seconds).max(0.0),
                layer_requests: self.layer_requests.saturating_sub(prompt.layer_requests) as f64,
                stall_seconds: (self.io_stall_seconds - prompt.io_stall_seconds).max(0.0),
            },
            prompt: ReadTotals {
                bytes: prompt
                    .nvme_bytes_read
                    .saturating_sub(prompt.cold_bytes_read) as f64,
                seconds: prompt.read_seconds - cold_seconds,
                // Cold passes' requests and waits too: the planner prices
                // no pass by them ([`ReadTotals::request_seconds`] is the
                // decode's).
                layer_requests: prompt.layer_requests as f64,
                stall_seconds: prompt.io_stall_seconds,
            },
            cold_prompt: ReadTotals {
                bytes: prompt.cold_bytes_read as f64,
                seconds: cold_seconds,
                ..Default::default()
            },
        }
    }

    /// What happened between `earlier` and this snapshot (e.g. one token:
    /// take a snapshot after each decode). Gauges (cache bytes, peak, budget)
    /// keep this snapshot's value; rates are recomputed for the interval.
    pub fn since(&self, earlier: &StreamStats) -> StreamStats {
        let io_stall_seconds = (self.io_stall_seconds - earlier.io_stall_seconds).max(0.0);
        let read_seconds = (self.read_seconds - earlier.read_seconds).max(0.0);
        let nvme_bytes_read = self.nvme_bytes_read.saturating_sub(earlier.nvme_bytes_read);
        StreamStats {
            mode: self.mode.clone(),
            nvme_bytes_read,
            expert_hits: self.expert_hits.saturating_sub(earlier.expert_hits),
            expert_misses: self.expert_misses.saturating_sub(earlier.expert_misses),
            prefetch_hits: self.prefetch_hits.saturating_sub(earlier.prefetch_hits),
            prefetch_wasted_bytes: self
                .prefetch_wasted_bytes
                .saturating_sub(earlier.prefetch_wasted_bytes),
            io_stall_seconds,
            read_seconds,
            read_gbps: gbps(nvme_bytes_read, read_seconds),
            cache_bytes: self.cache_bytes,
            cache_peak_bytes: self.cache_peak_bytes,
            cache_budget_bytes: self.cache_budget_bytes,
            evictions: self.evictions.saturating_sub(earlier.evictions),
            recycled_bytes: self.recycled_bytes.saturating_sub(earlier.recycled_bytes),
            resident_layer_skips: self
                .resident_layer_skips
                .saturating_sub(earlier.resident_layer_skips),
            layer_requests: self.layer_requests.saturating_sub(earlier.layer_requests),
            registered_bytes: self.registered_bytes,
            registrations: self.registrations.saturating_sub(earlier.registrations),
            register_seconds: (self.register_seconds - earlier.register_seconds).max(0.0),
            resident_gpu_bytes: self.resident_gpu_bytes,
            resident_ram_bytes: self.resident_ram_bytes,
            prompt_stream: self.prompt_stream.since(&earlier.prompt_stream),
        }
    }
}

struct Unit {
    /// File byte ranges of the unit's slices.
    ranges: Vec<(u64, u64)>,
    bytes: u64,
    residency: Residency,
    /// Brought in by the prefetcher and not used since.
    prefetched: bool,
    pins: u32,
    /// Decode uses, each decaying by half per token (see [`use_chance`]).
    recent: f64,
    /// Decode uses, each decaying by half in 64 tokens ([`RATE_DECAY`]).
    score: f64,
    last_use: u64,
}

struct State {
    units: HashMap<UnitKey, Unit>,
    /// The model's layers, streamed or not: a pass's distances count every
    /// layer, and a layer held on another tier is still computed (and asked
    /// about) between two streamed ones.
    n_layers: u32,
    n_experts: u32,
    /// Layers with a streamed unit.
    stream_layers: u32,
    /// Expert-streaming: co-activation counts between consecutive layers.
    coact: Coactivation,
    /// Where `coact` is loaded from and saved to (on drop).
    coact_path: Option<PathBuf>,
    /// Where the reads' totals go when the streamer is dropped.
    reads_path: Option<PathBuf>,
    /// The previous request's layer and units (for co-activation counts).
    last_request: Option<(u32, Vec<u32>)>,
    /// Moving averages: seconds to read one unit, seconds between requests.
    read_seconds_per_unit: f64,
    compute_seconds_per_layer: f64,
    /// Dense lookahead until both averages exist (see
    /// [`Streamer::set_initial_prefetch_depth`]).
    initial_prefetch_depth_layers: u32,
    last_request_end: Option<Instant>,
    /// Layer of the latest request.
    current_layer: u32,
    /// Units each decoding thread uses now (one context per thread): pinned
    /// until that thread's next request or the end of its decode.
    pinned: HashMap<ThreadId, Vec<UnitKey>>,
    /// Threads decoding a prompt chunk now (until their decode ends): the
    /// last layer of a chunk routes only the tokens whose output is asked
    /// for, and is still the chunk's.
    prompt_threads: HashSet<ThreadId>,
    /// The prompt pass under way began before the cache's first eviction
    /// (a model's first pass): its reads count as cold.
    cold_pass: bool,
    /// Most bytes of units held at once; changed by [`Streamer::set_cache_budget`].
    budget_bytes: u64,
    /// The process's memory limit, if one is kept ([`Streamer::set_host_limit`]).
    host_limit_bytes: Option<u64>,
    /// What the process holds besides the cache, as last sampled.
    host_other_bytes: u64,
    /// Bytes of units marked `Loading` that `cache_bytes` counts.
    loading_bytes: u64,
    /// Bytes of units pinned by at least one thread.
    pinned_bytes: u64,
    /// Bytes of every unit.
    total_bytes: u64,
    /// The least budget that holds what one layer may need at once.
    minimum_budget_bytes: u64,
    cache_bytes: u64,
    clock: u64,
    /// Streamed layers a decode asked for or found resident since the
    /// units' uses last aged: a token's worth (a step's, for a batch) is
    /// every streamed layer once.
    decode_layers_since_ageing: u32,
    stats: StreamStats,
    error: Option<String>,
    /// Layers registered with the GPU's driver ([`super::pinning`]).
    registered: Registered,
    /// The registering thread holds pins on a layer while it registers it.
    registering: bool,
}

/// Most bytes the STREAM region holds beyond the resident units' own
/// bytes: the pages that straddle a boundary between two units' slices (or
/// a slice and a neighbouring tensor). A read fills such a page whole and
/// an eviction releases only the pages wholly inside its unit, so each may
/// stay resident: at most one page per unaligned slice boundary of
/// `placement`'s STREAM tensors.
pub fn boundary_page_bytes(gguf: &GgufFile, placement: &Placement) -> u64 {
    let mut pages = std::collections::HashSet::new();
    for t in gguf.tensors() {
        if placement.tier(&t.name) != Some(Tier::Stream) {
            continue;
        }
        let n_expert = if placement.mode == Mode::ExpertStreaming {
            t.dims.get(2).copied().unwrap_or(1).max(1)
        } else {
            1
        };
        let slice = t.n_bytes / n_expert;
        for e in 0..=n_expert {
            let boundary = t.offset_in_file + e * slice;
            if boundary % PAGE != 0 {
                pages.insert(boundary / PAGE);
            }
        }
    }
    pages.len() as u64 * PAGE
}

pub struct Streamer {
    mode: Mode,
    region: Arc<StreamRegion>,
    file: File,
    state: Mutex<State>,
    /// Signalled when a prefetch read finishes.
    loaded: Condvar,
    prefetch_tx: Mutex<Option<mpsc::Sender<Ahead>>>,
    failed: AtomicBool,
    /// Bytes that reads in flight have delivered so far (resident already,
    /// though their units are still `Loading`).
    arrived_bytes: AtomicU64,
    /// Reads of one unit in flight at once (see [`Streamer::set_read_queue_depth`]).
    read_queue_depth: AtomicU32,
    /// [`boundary_page_bytes`] of this streamer's units.
    boundary_bytes: u64,
    /// Registers kept layers with the GPU's driver ([`Streamer::set_host_pinning`]).
    pinning: OnceLock<Arc<dyn HostPinning>>,
    /// Layers for the registering thread.
    register_tx: Mutex<Option<mpsc::Sender<u32>>>,
}

impl Streamer {
    /// Builds the unit table of `placement`'s STREAM tensors. Fails when
    /// `budget_bytes` cannot hold what one layer may need at once.
    pub fn new(
        gguf: &GgufFile,
        placement: &Placement,
        region: Arc<StreamRegion>,
        file: File,
        budget_bytes: u64,
    ) -> Result<Streamer, String> {
        let mode = placement.mode;
        let mut units: HashMap<UnitKey, Unit> = HashMap::new();
        for t in gguf.tensors() {
            if placement.tier(&t.name) != Some(Tier::Stream) {
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
                    residency: Residency::Absent,
                    prefetched: false,
                    pins: 0,
                    recent: 0.0,
                    score: 0.0,
                    last_use: 0,
                });
                unit.ranges.push((start, start + slice));
                unit.bytes += slice;
            }
        }
        // Per layer: its units' bytes and file ranges.
        let mut per_layer: HashMap<u32, (u64, usize)> = HashMap::new();
        for ((layer, _), u) in &units {
            let sums = per_layer.entry(*layer).or_insert((0, 0));
            sums.0 += u.bytes;
            sums.1 += u.ranges.len();
        }
        let minimum = per_layer.values().map(|l| l.0).max().unwrap_or(0);
        // `HYPURA_STREAM_RECYCLE=0` releases evicted pages as before: for
        // measuring what recycling is worth on a machine, in one run.
        let recycle = std::env::var("HYPURA_STREAM_RECYCLE").map_or(true, |v| v != "0");
        if recycle {
            // Room for a layer's evictions: the most one request makes.
            let unit_most = units.values().map(|u| u.bytes).max().unwrap_or(0);
            let unit_ranges = units.values().map(|u| u.ranges.len()).max().unwrap_or(0);
            let max_runs = per_layer.values().map(|l| l.1).max().unwrap_or(0) + unit_ranges;
            let ranges: Vec<(u64, u64)> = units
                .values()
                .flat_map(|u| u.ranges.iter().copied())
                .collect();
            let wanted = recycling_split_points(&ranges);
            match region.open_bank(minimum + unit_most, max_runs) {
                Ok(most) if most < wanted => tracing::info!(
                    "evicted pages back later loads only within {most} of the {wanted} mapping splits \
                     recycling them everywhere takes (vm.max_map_count leaves no more)"
                ),
                Ok(most) => tracing::debug!(
                    "evicted pages back later loads: {wanted} mapping splits of {most} free"
                ),
                Err(e) => tracing::warn!("evicted pages are released, not reused: {e}"),
            }
        }
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
        let total_bytes = units.values().map(|u| u.bytes).sum();
        let n_layers = units.keys().map(|k| k.0 + 1).max().unwrap_or(0);
        let n_experts = units.keys().map(|k| k.1 + 1).max().unwrap_or(0);
        // Sized by the model, not the streamed layers, so statistics saved
        // under one placement load under another.
        let model_layers = gguf
            .arch_u64("block_count")
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0)
            .max(n_layers);
        let coact = Coactivation::new(
            if mode == Mode::ExpertStreaming {
                model_layers
            } else {
                0
            },
            n_experts,
        );
        Ok(Streamer {
            mode,
            region,
            file,
            loaded: Condvar::new(),
            prefetch_tx: Mutex::new(None),
            state: Mutex::new(State {
                units,
                n_layers: model_layers,
                n_experts,
                stream_layers: per_layer.len() as u32,
                coact,
                coact_path: None,
                reads_path: None,
                last_request: None,
                read_seconds_per_unit: 0.0,
                compute_seconds_per_layer: 0.0,
                initial_prefetch_depth_layers: 1,
                last_request_end: None,
                current_layer: 0,
                pinned: HashMap::new(),
                prompt_threads: HashSet::new(),
                cold_pass: false,
                budget_bytes,
                host_limit_bytes: None,
                host_other_bytes: 0,
                loading_bytes: 0,
                pinned_bytes: 0,
                total_bytes,
                minimum_budget_bytes: minimum,
                cache_bytes: 0,
                clock: 0,
                decode_layers_since_ageing: 0,
                stats,
                error: None,
                registered: Registered::default(),
                registering: false,
            }),
            failed: AtomicBool::new(false),
            arrived_bytes: AtomicU64::new(0),
            read_queue_depth: AtomicU32::new(DEFAULT_READ_QUEUE_DEPTH),
            boundary_bytes: boundary_page_bytes(gguf, placement),
            pinning: OnceLock::new(),
            register_tx: Mutex::new(None),
        })
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Registers the layers a prompt pass finds resident with the GPU's
    /// driver through `pinning` ([`super::pinning`]), from
    /// [`Streamer::start_prefetch`] on. Set once, before that.
    pub fn set_host_pinning(&self, pinning: Arc<dyn HostPinning>) {
        let _ = self.pinning.set(pinning);
    }

    /// Sets how many reads of [`READ_CHUNK_BYTES`] one unit's read keeps in
    /// flight (one thread each; at least 1). Default [`DEFAULT_READ_QUEUE_DEPTH`].
    pub fn set_read_queue_depth(&self, depth: u32) {
        self.read_queue_depth.store(depth.max(1), Ordering::Relaxed);
    }

    pub fn read_queue_depth(&self) -> u32 {
        self.read_queue_depth.load(Ordering::Relaxed)
    }

    /// Sets how many layers dense-FFN streaming reads ahead until it has
    /// measured both a unit's read time and a layer's compute time (then the
    /// lookahead follows their ratio). Default 1; the planner's
    /// `prefetch_depth_layers` where there is a plan. Still bounded by the
    /// cache's slots.
    pub fn set_initial_prefetch_depth(&self, layers: u32) {
        self.lock().initial_prefetch_depth_layers = layers.max(1);
    }

    /// Bytes of every streamed unit: the cache budget that holds them all.
    pub fn stream_bytes(&self) -> u64 {
        self.lock().total_bytes
    }

    /// The smallest cache budget [`Streamer::new`] and
    /// [`Streamer::set_cache_budget`] accept: what one layer may need at once.
    pub fn minimum_budget_bytes(&self) -> u64 {
        self.lock().minimum_budget_bytes
    }

    /// Changes the cache budget (promotion or demotion without a reload).
    /// Shrinking evicts unpinned units at once; units in use stay until their
    /// decode step ends, then go as soon as a request needs room. Fails below
    /// [`Streamer::minimum_budget_bytes`].
    pub fn set_cache_budget(&self, budget_bytes: u64) -> Result<(), String> {
        let mut state = self.lock();
        if budget_bytes < state.minimum_budget_bytes {
            return Err(format!(
                "a stream cache of {budget_bytes} bytes is below the {} bytes one layer may need at once",
                state.minimum_budget_bytes
            ));
        }
        state.budget_bytes = budget_bytes;
        self.make_room(&mut state, 0, None, false);
        Ok(())
    }

    /// Keeps this process's resident set, with the kernel's page tables for
    /// it, within `limit_bytes` (the RAM budget plus the host overhead): from
    /// now on the cache holds at most `limit_bytes` less what the process
    /// holds besides it, less the region's boundary pages, and never less
    /// than one layer's worth ([`Streamer::minimum_budget_bytes`]), nor more
    /// than the cache budget. What the process holds besides the cache is
    /// read from the kernel now and again before each read into the cache
    /// and after each decode, so memory the process takes later (a first
    /// decode's buffers and kernels, heap) is given back by the cache
    /// before it is read into. Shrinking evicts unpinned units at once.
    pub fn set_host_limit(&self, limit_bytes: u64) {
        let mut state = self.lock();
        state.host_limit_bytes = Some(limit_bytes);
        self.sample_host(&mut state);
        self.make_room(&mut state, 0, None, false);
    }

    /// The cache budget in force: the budget, or less under a host limit.
    fn budget_now(&self, state: &State) -> u64 {
        match state.host_limit_bytes {
            None => state.budget_bytes,
            Some(limit) => limit
                .saturating_sub(state.host_other_bytes)
                .saturating_sub(self.boundary_bytes)
                .min(state.budget_bytes)
                .max(state.minimum_budget_bytes),
        }
    }

    /// Reads what the process holds besides the cache: its resident set
    /// and the page tables mapping it (8 bytes per 4 KiB page, as a cgroup
    /// charges them), less the units' bytes resident now (reads in flight
    /// count what has arrived). Kept as it was where `/proc` cannot say.
    fn sample_host(&self, state: &mut State) {
        if state.host_limit_bytes.is_none() {
            return;
        }
        let Some(rss) = crate::hwprobe::host::statm_rss_bytes() else {
            return;
        };
        let cached = state.cache_bytes.saturating_sub(state.loading_bytes)
            + self.arrived_bytes.load(Ordering::Relaxed);
        state.host_other_bytes = (rss + rss / 512).saturating_sub(cached);
    }

    /// Whether the cache budget in force holds every streamed unit at once.
    /// Then [`Streamer::fill`] leaves no layer with an expert to read, and
    /// the hook asks for no router choice: decoding pays no sync at all
    /// (a layer with one expert never chosen so far is otherwise asked
    /// about on every token).
    pub fn holds_every_unit(&self) -> bool {
        let state = self.lock();
        self.budget_now(&state) >= state.total_bytes
    }

    /// Reads streamed units into the cache, layer by layer, until it is full
    /// or every unit is resident (a promotion, so the first tokens after it
    /// need no I/O). Runs on the caller's thread; decoding goes on meanwhile.
    /// Returns the bytes read. A failed read stops the fill (the unit is read
    /// again, and the error surfaced, if a request needs it).
    pub fn fill(&self) -> u64 {
        let mut keys: Vec<UnitKey> = self.lock().units.keys().copied().collect();
        keys.sort_unstable();
        let mut read = 0;
        for key in keys {
            let (bytes, room) = {
                let state = self.lock();
                let unit = &state.units[&key];
                if unit.residency != Residency::Absent {
                    continue;
                }
                (
                    unit.bytes,
                    self.budget_now(&state).saturating_sub(state.cache_bytes),
                )
            };
            if bytes > room {
                break;
            }
            match self.read_unit(key, false) {
                Some(Ok(n)) => read += n,
                Some(Err(_)) => break,
                None => {}
            }
        }
        read
    }

    /// Starts from the statistics saved at `path` (if they match this model)
    /// and saves them there when the streamer is dropped.
    pub fn persist_coactivation(&self, path: PathBuf) {
        let mut state = self.lock();
        let (n_layers, n_experts) = (state.coact.n_layers, state.coact.n_experts);
        if let Some(saved) = Coactivation::load(&path, n_layers, n_experts) {
            state.coact = saved;
        }
        state.coact_path = Some(path);
    }

    /// Adds this streamer's reads to the totals saved at `path` when it is
    /// dropped ([`super::reads`]).
    pub fn persist_reads(&self, path: PathBuf) {
        self.lock().reads_path = Some(path);
    }

    /// Co-activation counts gathered so far (including loaded ones).
    pub fn coactivation(&self) -> Coactivation {
        self.lock().coact.clone()
    }

    pub fn stats(&self) -> StreamStats {
        let state = self.lock();
        let mut stats = state.stats.clone();
        stats.cache_bytes = state.cache_bytes;
        stats.cache_budget_bytes = self.budget_now(&state);
        stats.read_gbps = gbps(stats.nvme_bytes_read, stats.read_seconds);
        stats.registered_bytes = state.registered.bytes();
        let prompt = &mut stats.prompt_stream;
        prompt.read_gbps = gbps(prompt.nvme_bytes_read, prompt.read_seconds);
        stats
    }

    /// Most bytes the region may hold beyond the resident units' own
    /// ([`boundary_page_bytes`]).
    pub fn boundary_bytes(&self) -> u64 {
        self.boundary_bytes
    }

    /// The cache budget as set ([`Streamer::new`], [`Streamer::set_cache_budget`]);
    /// under a host limit the budget in force may be less
    /// ([`StreamStats::cache_budget_bytes`]).
    pub fn cache_budget_bytes(&self) -> u64 {
        self.lock().budget_bytes
    }

    /// Bytes of the STREAM region actually in memory (from the kernel), for
    /// checking the accounting. Read under the state lock, which every
    /// eviction and load holds while it moves pages: the kernel hands out
    /// `smaps` a few mappings a read, so pages a load moved from a part of
    /// the region already counted into one not yet counted were counted
    /// twice (a CI run saw one 1.6 MB layer too many).
    pub fn region_resident_bytes(&self) -> u64 {
        let _moves = self.lock();
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

    /// Starts the prefetch thread, and the registering thread when layers
    /// are registered ([`Streamer::set_host_pinning`]); they end when the
    /// streamer is dropped.
    pub fn start_prefetch(self: &Arc<Self>) {
        self.serve(
            "hypura-prefetch",
            &self.prefetch_tx,
            |streamer, ahead| match ahead {
                Ahead::Unit(key) => streamer.prefetch(key),
                Ahead::Layer(layer, count) => streamer.prefetch_pass(layer, count),
            },
        );
        if self.pinning.get().is_some() {
            self.serve(
                "hypura-register",
                &self.register_tx,
                Streamer::register_layer,
            );
        }
    }

    /// A thread `name` doing `work` for each message sent through `slot`,
    /// holding the streamer only while it works.
    fn serve<T: Send + 'static>(
        self: &Arc<Self>,
        name: &str,
        slot: &Mutex<Option<mpsc::Sender<T>>>,
        work: fn(&Streamer, T),
    ) {
        let (tx, rx) = mpsc::channel::<T>();
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        let weak: Weak<Streamer> = Arc::downgrade(self);
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                while let Ok(message) = rx.recv() {
                    let Some(streamer) = weak.upgrade() else {
                        return;
                    };
                    work(&streamer, message);
                }
            })
            .ok();
    }

    /// Registers `layer` with the GPU's driver when every unit of it is
    /// resident and it is not registered yet ([`super::pinning`]). Its
    /// units are pinned by this thread meanwhile, so none is evicted while
    /// the driver pins its pages; a thread that needs room waits for it.
    fn register_layer(&self, layer: u32) {
        let Some(pinning) = self.pinning.get() else {
            return;
        };
        let spans = {
            let mut state = self.lock();
            let keys: Vec<UnitKey> = (0..state.n_experts)
                .map(|e| (layer, e))
                .filter(|k| state.units.contains_key(k))
                .collect();
            if keys.is_empty()
                || state.registered.holds(layer)
                || keys
                    .iter()
                    .any(|k| state.units[k].residency != Residency::Resident)
            {
                return;
            }
            let spans = state.registered.free_spans(
                keys.iter()
                    .flat_map(|k| state.units[k].ranges.clone())
                    .collect::<Vec<_>>(),
            );
            for key in keys {
                pin(&mut state, key);
            }
            state.registering = true;
            spans
        };
        let started = Instant::now();
        let base = self.region.base();
        let done: Vec<(u64, u64)> = spans
            .into_iter()
            // SAFETY (of the pointer arithmetic): spans lie inside the
            // region, which mirrors the file; the units are resident and
            // pinned, so their pages stay mapped until unregistered.
            .filter(|&(a, b)| pinning.register(base.wrapping_add(a as usize), (b - a) as usize))
            .collect();
        let mut state = self.lock();
        state.stats.registrations += 1;
        state.stats.register_seconds += started.elapsed().as_secs_f64();
        state.registered.insert(layer, done);
        state.registering = false;
        unpin_thread(&mut state);
        drop(state);
        self.loaded.notify_all();
    }

    /// Unregisters `layer` if registered: before any of its pages is released.
    fn unregister_layer(&self, state: &mut State, layer: u32) {
        if let Some(pinning) = self.pinning.get() {
            for (a, _) in state.registered.remove(layer) {
                pinning.unregister(self.region.base().wrapping_add(a as usize));
            }
        }
    }

    /// Makes the units `(layer, e)` for every `e` in `experts` resident and
    /// pins them until the next request; drops the previous request's pins.
    /// `rows`: the tokens the layer routed; from [`PROMPT_UBATCH_TOKENS`] on
    /// (expert-streaming) the request is a prompt chunk's, and so is every
    /// later one of the same decode (see the module doc).
    fn ensure(&self, layer: u32, experts: &[u32], rows: usize) {
        let started = Instant::now();
        let mut state = self.lock();
        if let Some(end) = state.last_request_end {
            let compute = end.elapsed().as_secs_f64();
            state.compute_seconds_per_layer = ema(state.compute_seconds_per_layer, compute);
        }
        unpin_thread(&mut state);
        let prompt = self.mode == Mode::ExpertStreaming
            && (rows >= PROMPT_UBATCH_TOKENS
                || state.prompt_threads.contains(&std::thread::current().id()));
        if prompt {
            // A pass starts with a thread's first chunk request, or where
            // the layers start again (the next chunk of the same decode).
            let started = state.prompt_threads.insert(std::thread::current().id())
                || layer < state.current_layer;
            if started {
                state.cold_pass = state.stats.evictions == 0;
            }
            state.stats.prompt_stream.layer_requests += 1;
        }
        state.clock += 1;
        state.stats.layer_requests += 1;
        state.current_layer = layer;
        let clock = state.clock;
        let keys: Vec<UnitKey> = experts
            .iter()
            .map(|&e| (layer, e))
            .filter(|k| state.units.contains_key(k))
            .collect();
        for key in &keys {
            pin(&mut state, *key);
            let unit = state.units.get_mut(key).expect("filtered");
            unit.last_use = clock;
            // A decode's choices only: a prompt chunk touches nearly every
            // expert once whatever the tokens chose, and counting that
            // would wash out what decoding uses most.
            if !prompt {
                unit.recent += 1.0;
                unit.score += 1.0;
            }
        }
        if !prompt {
            state.decode_layers_since_ageing += 1;
            self.age(&mut state);
        }

        // Wait for units the prefetcher is reading rather than reading them twice.
        while keys
            .iter()
            .any(|k| state.units[k].residency == Residency::Loading)
        {
            state = self.loaded.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        let mut misses = Vec::new();
        let (mut hits, mut prefetch_hits) = (0, 0);
        for key in &keys {
            let unit = state.units.get_mut(key).expect("filtered");
            let prefetched = std::mem::take(&mut unit.prefetched);
            if unit.residency == Residency::Resident {
                hits += 1;
                prefetch_hits += prefetched as u64;
            } else {
                // Loading from now on (under this same lock): the prefetcher
                // and other decoding threads wait for this thread's read
                // rather than reading it too or computing with pages still
                // arriving.
                unit.residency = Residency::Loading;
                misses.push((*key, unit.bytes, unit.ranges.clone()));
            }
        }
        state.stats.expert_hits += hits;
        state.stats.prefetch_hits += prefetch_hits;
        state.stats.expert_misses += misses.len() as u64;
        if prompt {
            let p = &mut state.stats.prompt_stream;
            p.expert_hits += hits;
            p.prefetch_hits += prefetch_hits;
            p.expert_misses += misses.len() as u64;
        }
        let needed: u64 = misses.iter().map(|m| m.1).sum();
        if needed > 0 {
            self.sample_host(&mut state);
        }
        // Units others are reading count against the budget but cannot be
        // evicted mid-read: wait for them when nothing else can make room.
        let miss_ranges: Vec<(u64, u64)> =
            misses.iter().flat_map(|m| m.2.iter().copied()).collect();
        let mut moved = Vec::new();
        loop {
            if let Some(m) = self.make_room_for(&mut state, &miss_ranges, needed, None, prompt) {
                moved = m;
                break;
            }
            let others_loading = state.registering
                || state.units.iter().any(|(k, u)| {
                    u.residency == Residency::Loading && !misses.iter().any(|m| m.0 == *k)
                });
            if !others_loading {
                tracing::error!("stream cache over budget: every resident unit is in use");
                break;
            }
            state = self.loaded.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        let cold = prompt && state.cold_pass;
        state.cache_bytes += needed;
        state.loading_bytes += needed;
        state.stats.cache_peak_bytes = state.stats.cache_peak_bytes.max(state.cache_bytes);
        let mut ahead: Vec<Ahead> = if prompt {
            // Co-activation counts are per token: a chunk's union of every
            // token's choice says nothing about pairs.
            state.last_request = None;
            vec![Ahead::Layer(layer + 1, keys.len())]
        } else {
            self.predict_next(&mut state, layer, experts)
                .into_iter()
                .map(Ahead::Unit)
                .collect()
        };
        drop(state);
        // A chunk's read-ahead starts now, beside this layer's own read: the
        // disk sets a pass's pace where layers lack units, and a read ahead
        // claimed (and queued) while this one runs keeps it busy through
        // this layer's compute. (Sent after the read, it left the disk idle
        // for that compute and the claim: at the H200's pass start, each
        // layer's.) A decode's predictions wait for its own read, which its
        // token waits for.
        if prompt {
            self.send_ahead(std::mem::take(&mut ahead));
        }

        if !misses.is_empty() {
            let slices = misses.iter().flat_map(|m| m.2.iter().copied());
            // A prompt chunk's misses are most of a layer: one sorted pass.
            // A decode's few experts are read as before, unit by unit.
            let reads: Vec<(u64, u64)> = if prompt {
                file_order(slices)
            } else {
                slices.collect()
            };
            let moved_bytes = self.count_arrived(&moved);
            let read_started = Instant::now();
            let (arrived, result) = self.read_ranges(&reads, false, &moved);
            let mut state = self.lock();
            self.arrived_bytes
                .fetch_sub(arrived + moved_bytes, Ordering::Relaxed);
            state.loading_bytes -= needed;
            let read_seconds = read_started.elapsed().as_secs_f64();
            state.stats.read_seconds += read_seconds;
            if prompt {
                state.stats.prompt_stream.read_seconds += read_seconds;
            }
            if cold {
                state.stats.prompt_stream.cold_read_seconds += read_seconds;
            }
            let per_unit = read_seconds / misses.len() as f64;
            state.read_seconds_per_unit = ema(state.read_seconds_per_unit, per_unit);
            match result {
                Ok(bytes) => {
                    state.stats.nvme_bytes_read += bytes;
                    if prompt {
                        state.stats.prompt_stream.nvme_bytes_read += bytes;
                    }
                    if cold {
                        state.stats.prompt_stream.cold_bytes_read += bytes;
                    }
                    for (key, _, _) in &misses {
                        state.units.get_mut(key).expect("exists").residency = Residency::Resident;
                    }
                }
                Err(e) => {
                    // Never leave a unit marked resident with bytes that did not arrive.
                    for (key, bytes, ranges) in &misses {
                        state.units.get_mut(key).expect("exists").residency = Residency::Absent;
                        for &(a, b) in ranges {
                            self.region.release(a, b);
                        }
                        state.cache_bytes -= bytes;
                    }
                    state.error = Some(e);
                    self.failed.store(true, Ordering::SeqCst);
                }
            }
        }
        if !misses.is_empty() {
            self.loaded.notify_all();
        }
        let mut state = self.lock();
        let stall = started.elapsed().as_secs_f64();
        state.stats.io_stall_seconds += stall;
        if prompt {
            state.stats.prompt_stream.io_stall_seconds += stall;
            tracing::debug!(
                target: PASS_TRACE,
                layer,
                hits,
                misses = misses.len(),
                read_mb = needed as f64 / 1e6,
                stall_ms = stall * 1e3,
                cache_mb = state.cache_bytes as f64 / 1e6,
                "pass layer asked"
            );
        }
        state.last_request_end = Some(Instant::now());
        drop(state);
        self.send_ahead(ahead);
    }

    /// Hands `ahead` to the prefetch thread, if it runs.
    fn send_ahead(&self, ahead: Vec<Ahead>) {
        if let Some(tx) = self
            .prefetch_tx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            for a in ahead {
                let _ = tx.send(a);
            }
        }
    }

    /// A prompt chunk's read-ahead: `first`, then each layer after it to
    /// the pass's end, while room for its reads is free or comes from the
    /// layers the chunk has computed (needed again only by the next pass,
    /// after every layer ahead), never from a layer ahead: that the chunk
    /// would read twice. So the disk reads on through the layers the cache
    /// holds whole, where the compute alone sets the pace (on the H200,
    /// Qwen3's layers 6 to 21 of a pass: 0.9 s of 5.5 s with the disk idle
    /// while the read-ahead stopped three layers ahead), at no cost in
    /// bytes. The pass ends at the last layer (the next chunk's first
    /// layers are read when it comes).
    ///
    /// One layer's read is in flight while the next layer is claimed
    /// (chosen, room made, marked loading): claiming a layer evicts a
    /// layer's worth of units, which took ~20 ms per layer on the H200
    /// with the disk idle (a tenth of a layer's read) when done between
    /// the reads.
    ///
    /// A request can wait in the queue while the chunk computes on (reads
    /// slower than compute): a layer the chunk has reached by then is read
    /// by the chunk's own request, or was and is evicted again; read here, it
    /// would be the next pass's, read a pass early at the expense of this
    /// pass's (on the H200, 2.4 of a 9.9 GB Mixtral pass).
    fn prefetch_pass(&self, first: u32, count: usize) {
        std::thread::scope(|scope| {
            let mut reading: Option<std::thread::ScopedJoinHandle<bool>> = None;
            let mut layer = first;
            loop {
                {
                    let state = self.lock();
                    if state.prompt_threads.is_empty()
                        || !pass_reads_on(layer, state.current_layer, state.n_layers)
                    {
                        break;
                    }
                }
                match self.claim_layer(layer, count) {
                    // Found whole: registered (see `pinning` for why only then).
                    LayerClaim::Whole => self.ask_register(layer),
                    LayerClaim::NoRoom => break,
                    LayerClaim::Units(mut claim) => {
                        // Its pages are faulted in while the layer before reads.
                        claim.populated = self.populate(&claim.ranges);
                        // The layer read before is read (and settled) before
                        // this one starts; after a failed read, this is the last.
                        let read_before = reading
                            .take()
                            .is_none_or(|read| read.join().unwrap_or(false));
                        let last = !claim.all || !read_before;
                        reading = Some(scope.spawn(move || self.read_claim(claim)));
                        if last {
                            break;
                        }
                    }
                }
                layer += 1;
            }
            if let Some(read) = reading {
                let _ = read.join();
            }
        });
    }

    /// Claims for a read the `count` units of `layer` most used so far
    /// (by decode use rate, `score`; ties in file order) that are absent and that
    /// room can be made for: a prompt chunk's next layer, `count` being how
    /// many experts the chunk's layer before chose (a large chunk needs
    /// nearly all of them; a smaller one, under skewed routing, mostly the
    /// popular ones). Room comes only from free room and the layers the
    /// chunk has computed ([`Streamer::prefetch_pass`]). Claimed units are
    /// loading (a request for them waits) until [`Streamer::read_claim`].
    fn claim_layer(&self, layer: u32, count: usize) -> LayerClaim {
        let started = Instant::now();
        let mut state = self.lock();
        let mut keys: Vec<UnitKey> = (0..state.n_experts)
            .map(|e| (layer, e))
            .filter(|k| state.units.contains_key(k))
            .collect();
        keys.sort_by(|a, b| state.units[b].score.total_cmp(&state.units[a].score));
        keys.truncate(count);
        keys.retain(|k| state.units[k].residency == Residency::Absent);
        if keys.is_empty() {
            return LayerClaim::Whole;
        }
        keys.sort_by_key(|k| state.units[k].ranges.first().map_or(0, |r| r.0));
        // Layers the chunk has computed are the ones a pass needs
        // further than every layer after the one computing.
        let computed = state.n_layers - 1 - state.current_layer.min(state.n_layers - 1);
        self.sample_host(&mut state);
        let (mut taken, mut bytes, wanted) = (Vec::new(), 0, keys.len());
        for key in keys {
            let unit_bytes = state.units[&key].bytes;
            let ranges = state.units[&key].ranges.clone();
            // Moved pages are counted with the claim's when it populates.
            let room =
                self.make_room_for(&mut state, &ranges, unit_bytes, Some((computed, 0.0)), true);
            if room.is_none() {
                break;
            }
            let unit = state.units.get_mut(&key).expect("exists");
            unit.residency = Residency::Loading;
            unit.prefetched = true;
            state.cache_bytes += unit_bytes;
            state.loading_bytes += unit_bytes;
            bytes += unit_bytes;
            taken.push(key);
        }
        state.stats.cache_peak_bytes = state.stats.cache_peak_bytes.max(state.cache_bytes);
        if taken.is_empty() {
            tracing::debug!(target: PASS_TRACE, layer, wanted, "pass read ahead: no room");
            return LayerClaim::NoRoom;
        }
        let ranges = file_order(
            taken
                .iter()
                .flat_map(|k| state.units[k].ranges.iter().copied())
                .collect::<Vec<_>>(),
        );
        LayerClaim::Units(Claim {
            layer,
            all: taken.len() == wanted,
            taken,
            bytes,
            ranges,
            claim_seconds: started.elapsed().as_secs_f64(),
            populated: None,
            cold: state.cold_pass,
        })
    }

    /// Reads a claimed layer's units, in file order and as one read, and
    /// settles them: resident, or absent again if the read failed (not an
    /// error yet: a request that needs them reads them again and surfaces
    /// it). Reads count as the prompt's. Whether the read succeeded.
    fn read_claim(&self, claim: Claim) -> bool {
        let Claim {
            layer,
            taken,
            bytes,
            ranges,
            claim_seconds,
            populated,
            cold,
            ..
        } = claim;
        let read_started = Instant::now();
        let (read_arrived, result) = self.read_ranges(&ranges, populated.is_some(), &[]);
        let arrived = read_arrived + populated.unwrap_or(0);
        let mut state = self.lock();
        self.arrived_bytes.fetch_sub(arrived, Ordering::Relaxed);
        let read_seconds = read_started.elapsed().as_secs_f64();
        state.stats.read_seconds += read_seconds;
        state.stats.prompt_stream.read_seconds += read_seconds;
        if cold {
            state.stats.prompt_stream.cold_read_seconds += read_seconds;
        }
        state.loading_bytes -= bytes;
        tracing::debug!(
            target: PASS_TRACE,
            layer,
            current = state.current_layer,
            units = taken.len(),
            read_mb = bytes as f64 / 1e6,
            claim_ms = claim_seconds * 1e3,
            read_ms = read_seconds * 1e3,
            "pass read ahead"
        );
        let ok = match result {
            Ok(n) => {
                state.stats.nvme_bytes_read += n;
                state.stats.prompt_stream.nvme_bytes_read += n;
                state.stats.prompt_stream.read_ahead_bytes += n;
                if cold {
                    state.stats.prompt_stream.cold_bytes_read += n;
                }
                for key in &taken {
                    state.units.get_mut(key).expect("exists").residency = Residency::Resident;
                }
                true
            }
            Err(e) => {
                tracing::warn!("prefetch failed: {e}");
                for key in &taken {
                    let unit = state.units.get_mut(key).expect("exists");
                    unit.residency = Residency::Absent;
                    unit.prefetched = false;
                    for &(a, b) in &unit.ranges.clone() {
                        self.region.release(a, b);
                    }
                }
                state.cache_bytes -= bytes;
                false
            }
        };
        drop(state);
        self.loaded.notify_all();
        ok
    }

    /// Whether the hook asks for `layer`'s router choice over `rows`
    /// tokens. A decode asks only where a read may be needed: a sync per
    /// layer costs more than the bookkeeping here, so a layer found
    /// resident is pinned and computed unasked ([`Streamer::pin_if_resident`]).
    /// A prompt chunk asks at every layer while the cache cannot hold
    /// every unit (a sync per layer is nothing beside a chunk's compute):
    /// each request unpins the layers computed before it, whose room the
    /// read-ahead takes. (Pinned from its ask to the next request, a run
    /// of resident layers held its units through its compute: on the H200
    /// Qwen3's layers 9 to 25, which stopped the read-ahead for lack of
    /// room three layers into them.)
    fn asks_at(&self, layer: u32, rows: usize) -> bool {
        if rows >= PROMPT_UBATCH_TOKENS && !self.holds_every_unit() {
            return true;
        }
        !self.pin_if_resident(layer)
    }

    /// Hands `layer` to the registering thread, if it runs: a prompt pass
    /// found every unit it asked for resident.
    fn ask_register(&self, layer: u32) {
        if let Some(tx) = self
            .register_tx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            let _ = tx.send(layer);
        }
    }

    /// Asked before `layer`'s router choice is computed: when every unit of
    /// the layer is resident (or it streams nothing: its experts live on
    /// another tier), pins them until this thread's next request or the end of
    /// its decode, and returns true: the layer needs no read, so no sync to
    /// learn its choice. The next request comes after a sync that follows
    /// this layer's expert matmuls (graph order), so the pins outlive their use.
    ///
    /// llama.cpp asks about every node up to the next one wanted before it
    /// computes any of them, so such pins add up over the layers of a
    /// decode. They may hold the whole cache only when it holds every unit
    /// (then no thread needs room); otherwise they stop one layer's worth
    /// short of the budget in force, so that another context decoding at the
    /// same time can always evict for its own layer. Past that the layer is
    /// asked for: its request drops this thread's earlier pins (their layers
    /// are computed by then) and pins only the experts chosen.
    fn pin_if_resident(&self, layer: u32) -> bool {
        let mut state = self.lock();
        let keys: Vec<UnitKey> = (0..state.n_experts)
            .map(|e| (layer, e))
            .filter(|k| state.units.contains_key(k))
            .collect();
        if keys
            .iter()
            .any(|k| state.units[k].residency != Residency::Resident)
        {
            return false;
        }
        if keys.is_empty() {
            return true;
        }
        let all_resident = state.loading_bytes == 0 && state.cache_bytes >= state.total_bytes;
        let newly_pinned: u64 = keys
            .iter()
            .filter(|k| state.units[k].pins == 0)
            .map(|k| state.units[k].bytes)
            .sum();
        let room_for_others = self
            .budget_now(&state)
            .saturating_sub(state.minimum_budget_bytes);
        if !all_resident && state.pinned_bytes + newly_pinned > room_for_others {
            return false;
        }
        for k in keys {
            pin(&mut state, k);
            // Used: not wasted if evicted.
            state.units.get_mut(&k).expect("filtered").prefetched = false;
        }
        state.stats.resident_layer_skips += 1;
        state.decode_layers_since_ageing += 1;
        self.age(&mut state);
        true
    }

    /// Units to read ahead after a request for `layer`.
    fn predict_next(&self, state: &mut State, layer: u32, experts: &[u32]) -> Vec<UnitKey> {
        if state.n_layers == 0 {
            return Vec::new();
        }
        match self.mode {
            Mode::DenseFfnStreaming => {
                let unit_bytes = state.units.get(&(layer, 0)).map_or(1, |u| u.bytes.max(1));
                let slots = (state.budget_bytes / unit_bytes).max(1);
                // Lookahead k: enough layers that reading overlaps computing,
                // bounded by the slots not holding the current layer.
                let measured =
                    state.read_seconds_per_unit > 0.0 && state.compute_seconds_per_layer > 0.0;
                let k = if measured {
                    (state.read_seconds_per_unit / state.compute_seconds_per_layer).ceil() as u64
                } else {
                    state.initial_prefetch_depth_layers as u64
                };
                let k = k
                    .clamp(1, slots.saturating_sub(1).max(1))
                    .min(u64::from(state.stream_layers.saturating_sub(1)));
                // The next k streamed layers, the next token's first ones
                // after the last.
                (1..state.n_layers)
                    .map(|d| ((layer + d) % state.n_layers, 0))
                    .filter(|key| state.units.contains_key(key))
                    .take(k as usize)
                    .collect()
            }
            Mode::ExpertStreaming => {
                let n = state.n_experts as usize;
                if let Some((prev_layer, prev)) = state.last_request.take() {
                    if prev_layer + 1 == layer {
                        let table = &mut state.coact.counts[prev_layer as usize];
                        for &a in &prev {
                            for &b in experts {
                                table[a as usize * n + b as usize] += 1;
                            }
                        }
                    }
                }
                state.last_request = Some((layer, experts.to_vec()));
                let next = layer + 1;
                if next >= state.n_layers {
                    return Vec::new();
                }
                let table = &state.coact.counts[layer as usize];
                let mut scores: Vec<(u32, u32)> = (0..n as u32)
                    .map(|b| {
                        (
                            experts
                                .iter()
                                .map(|&a| table[a as usize * n + b as usize])
                                .sum(),
                            b,
                        )
                    })
                    .filter(|&(score, _)| score > 0)
                    .collect();
                scores.sort_unstable_by(|x, y| y.cmp(x));
                // `b`'s chance of being chosen: of the next layer's choices
                // after these experts, the share that were `b`, times how
                // many it chooses.
                let total: u64 = scores.iter().map(|&(s, _)| u64::from(s)).sum();
                let k = experts.len() as f64;
                let least = prefetch_min_chance(
                    state.read_seconds_per_unit,
                    state.compute_seconds_per_layer,
                );
                scores
                    .into_iter()
                    .take(experts.len())
                    .filter(|&(s, _)| k * f64::from(s) >= least * total as f64)
                    .map(|(_, b)| (next, b))
                    .collect()
            }
            Mode::FullResident => Vec::new(),
        }
    }

    /// Reads one predicted unit in the background, if it is absent and room
    /// can be made without touching units in use.
    fn prefetch(&self, key: UnitKey) {
        if let Some(Err(e)) = self.read_unit(key, true) {
            // A failed prefetch is not an error yet: the unit is read again
            // (and the error surfaced) if a request needs it.
            tracing::warn!("prefetch failed: {e}");
        }
    }

    /// Reads an absent unit ahead of need (prefetch or fill). With `limit`,
    /// it only evicts what is needed later than it (see
    /// [`Streamer::make_room`]); without, it only uses free room. `None` when
    /// the unit was not read (present already, or no room).
    fn read_unit(&self, key: UnitKey, limit: bool) -> Option<Result<u64, String>> {
        let ranges = {
            let mut state = self.lock();
            let unit = state.units.get(&key)?;
            if unit.residency != Residency::Absent {
                return None;
            }
            let n_layers = state.n_layers.max(1);
            let distance = (key.0 + n_layers - state.current_layer) % n_layers;
            let bytes = unit.bytes;
            let ranges = unit.ranges.clone();
            // As `make_room` prices its candidates.
            let wait = decode_wait(
                unit,
                pass_distance(key.0, state.current_layer, n_layers),
                n_layers,
            );
            self.sample_host(&mut state);
            let moved = if limit {
                self.make_room_for(&mut state, &ranges, bytes, Some((distance, wait)), false)?
            } else if state.cache_bytes + bytes <= self.budget_now(&state) {
                Vec::new()
            } else {
                return None;
            };
            let unit = state.units.get_mut(&key).expect("exists");
            unit.residency = Residency::Loading;
            unit.prefetched = true;
            state.cache_bytes += bytes;
            state.loading_bytes += bytes;
            state.stats.cache_peak_bytes = state.stats.cache_peak_bytes.max(state.cache_bytes);
            (ranges, moved)
        };
        let (ranges, moved) = ranges;
        let moved_bytes = self.count_arrived(&moved);
        let read_started = Instant::now();
        let (arrived, result) = self.read_ranges(&ranges, false, &moved);
        let mut state = self.lock();
        self.arrived_bytes
            .fetch_sub(arrived + moved_bytes, Ordering::Relaxed);
        state.stats.read_seconds += read_started.elapsed().as_secs_f64();
        state.loading_bytes -= state.units[&key].bytes;
        let unit = state.units.get_mut(&key).expect("exists");
        match &result {
            Ok(bytes) => {
                unit.residency = Residency::Resident;
                state.stats.nvme_bytes_read += bytes;
            }
            Err(_) => {
                unit.residency = Residency::Absent;
                unit.prefetched = false;
                let bytes = unit.bytes;
                for &(a, b) in &ranges {
                    self.region.release(a, b);
                }
                state.cache_bytes -= bytes;
            }
        }
        drop(state);
        self.loaded.notify_all();
        Some(result)
    }

    /// Reads ranges as chunks of at most [`READ_CHUNK_BYTES`] (see
    /// [`read_chunks`]), up to the read queue depth of them at once. Each
    /// chunk's bytes are added to `arrived_bytes` as it lands, but for
    /// pages counted already: all of them where `populated` (populated and
    /// counted, [`Streamer::populate`]), else those inside `counted` (page
    /// aligned file ranges: moved pages, [`Streamer::make_room_for`]).
    /// Returns the bytes so added (the caller takes them off again once the
    /// units' residency is settled) and the read's result.
    fn read_ranges(
        &self,
        ranges: &[(u64, u64)],
        populated: bool,
        counted: &[(u64, u64)],
    ) -> (u64, Result<u64, String>) {
        let added = AtomicU64::new(0);
        let read = |&(a, b): &(u64, u64)| {
            let n = self
                .region
                .read_from(&self.file, a, b)
                .map_err(|e| format!("reading the model file at {a}..{b}: {e}"))?;
            if !populated {
                let new = n.saturating_sub(pages_within(a, b, counted));
                self.arrived_bytes.fetch_add(new, Ordering::Relaxed);
                added.fetch_add(new, Ordering::Relaxed);
            }
            Ok::<u64, String>(n)
        };
        let chunks = read_chunks(ranges, READ_CHUNK_BYTES);
        let threads = (self.read_queue_depth() as usize).clamp(1, chunks.len().max(1));
        let result = if threads == 1 {
            chunks
                .iter()
                .try_fold(0u64, |sum, c| read(c).map(|n| sum + n))
        } else {
            let next = AtomicUsize::new(0);
            std::thread::scope(|scope| {
                let handles: Vec<_> = (0..threads)
                    .map(|_| {
                        let (read, next, chunks) = (&read, &next, &chunks);
                        scope.spawn(move || {
                            let mut sum = 0u64;
                            while let Some(c) = chunks.get(next.fetch_add(1, Ordering::Relaxed)) {
                                sum += read(c)?;
                            }
                            Ok::<u64, String>(sum)
                        })
                    })
                    .collect();
                handles.into_iter().try_fold(0u64, |sum, h| {
                    h.join()
                        .map_err(|_| "a read thread panicked".to_string())?
                        .map(|n| sum + n)
                })
            })
        };
        (added.into_inner(), result)
    }

    /// Counts `moved` (pages a load took from evicted units: present before
    /// its read lands) as arrived, as [`Streamer::populate`] counts its
    /// pages; returns their bytes, for the caller to take off again once
    /// the load settles.
    fn count_arrived(&self, moved: &[(u64, u64)]) -> u64 {
        let bytes = moved.iter().map(|(a, b)| b - a).sum();
        self.arrived_bytes.fetch_add(bytes, Ordering::Relaxed);
        bytes
    }

    /// Backs `ranges`' pages with memory ahead of their read, off the
    /// disk's critical path (see [`StreamRegion::populate`]), and counts
    /// them as arrived: the host sample charges them to the cache, not to
    /// the rest of the process. `None` (nothing populated or counted) where
    /// the kernel cannot.
    fn populate(&self, ranges: &[(u64, u64)]) -> Option<u64> {
        let mut bytes = 0;
        for &(a, b) in ranges {
            match self.region.populate(a, b) {
                Ok(n) => {
                    bytes += n;
                    self.arrived_bytes.fetch_add(n, Ordering::Relaxed);
                }
                Err(_) => {
                    self.arrived_bytes.fetch_sub(bytes, Ordering::Relaxed);
                    return None;
                }
            }
        }
        Some(bytes)
    }

    /// Every token's worth of decoding (each streamed layer asked for or
    /// found resident once), halves every unit's `recent` and ages its
    /// `score` by [`RATE_DECAY`].
    fn age(&self, state: &mut State) {
        if state.decode_layers_since_ageing >= state.stream_layers.max(1) {
            state.decode_layers_since_ageing = 0;
            for u in state.units.values_mut() {
                u.recent *= 0.5;
                u.score *= RATE_DECAY;
            }
        }
    }

    /// Evicts unpinned resident units until `needed` more bytes fit in the
    /// budget; false when that is impossible. Experts, in a decode: the unit
    /// a decode is expected to need last ([`decode_wait`]: Belady's choice
    /// with the future estimated), ties (units no decode has used, after a
    /// prompt pass) to the highest layer, then the least recently used. (By
    /// use alone, the oldest were the pass's first layers, so each decode
    /// between two passes emptied the layers the next pass starts with,
    /// which it then read on demand with nothing computed to overlap: on
    /// the H200, Qwen3's layers 0 to 4, 1.34 GB after an 8-token decode.)
    /// Dense layers are used in a cycle, so the victim is the layer needed
    /// last (Belady); so is a prompt chunk's (`pass`: experts served as a
    /// pass over the layers, [`pass_distance`]), ties to the lowest score.
    /// `limit` (prefetches): evict only layers needed later than `distance`
    /// layers from now, or (experts, outside a pass) units whose
    /// [`decode_wait`] exceeds `wait`, so read-ahead never pushes out
    /// something more useful than what it brings in.
    fn make_room(
        &self,
        state: &mut State,
        needed: u64,
        limit: Option<(u32, f64)>,
        pass: bool,
    ) -> bool {
        let room = self.evict_for_room(state, needed, limit, pass);
        self.region.drain_bank();
        room
    }

    /// [`Streamer::make_room`] for a load of `ranges`, which takes the
    /// evicted units' pages where the region keeps them
    /// ([`StreamRegion::adopt`]): its read then lands in pages present, not
    /// fresh ones faulted in and zeroed. The file ranges so backed (to count
    /// as arrived), or `None` without room.
    fn make_room_for(
        &self,
        state: &mut State,
        ranges: &[(u64, u64)],
        needed: u64,
        limit: Option<(u32, f64)>,
        pass: bool,
    ) -> Option<Vec<(u64, u64)>> {
        let room = self.evict_for_room(state, needed, limit, pass);
        let moved = room.then(|| {
            ranges
                .iter()
                .map(|&(a, b)| self.region.adopt(a, b))
                .filter(|(a, b)| b > a)
                .collect::<Vec<_>>()
        });
        self.region.drain_bank();
        if let Some(moved) = &moved {
            state.stats.recycled_bytes += moved.iter().map(|(a, b)| b - a).sum::<u64>();
        }
        moved
    }

    /// [`Streamer::make_room`]'s evictions, their pages retired to the
    /// region's bank (drained by the caller).
    fn evict_for_room(
        &self,
        state: &mut State,
        needed: u64,
        limit: Option<(u32, f64)>,
        pass: bool,
    ) -> bool {
        let dense = self.mode == Mode::DenseFfnStreaming;
        let n_layers = state.n_layers.max(1);
        let current = state.current_layer;
        let distance = |layer: u32| {
            if dense {
                (layer + n_layers - current) % n_layers
            } else {
                pass_distance(layer, current, n_layers)
            }
        };
        let by_distance = dense || pass;
        let budget = self.budget_now(state);
        // A registered layer with a unit in use may have a copy from it in
        // flight: none of its units goes until that use ends.
        let busy: HashSet<u32> = state
            .registered
            .layers()
            .filter(|&l| {
                (0..state.n_experts).any(|e| state.units.get(&(l, e)).is_some_and(|u| u.pins > 0))
            })
            .collect();
        while state.cache_bytes + needed > budget {
            let victim = state
                .units
                .iter()
                .filter(|(_, u)| u.residency == Residency::Resident && u.pins == 0)
                .filter(|(k, _)| !busy.contains(&k.0))
                .filter(|(k, u)| {
                    limit.is_none_or(|(d, wait)| {
                        if by_distance {
                            distance(k.0) > d
                        } else {
                            decode_wait(u, distance(k.0), n_layers) > wait
                        }
                    })
                })
                .min_by(|(ka, a), (kb, b)| {
                    let by_score = || {
                        a.score
                            .total_cmp(&b.score)
                            .then(a.last_use.cmp(&b.last_use))
                    };
                    if by_distance {
                        distance(kb.0).cmp(&distance(ka.0)).then_with(by_score)
                    } else {
                        // A decode: the unit needed last; alike, the unit
                        // of the highest layer, which the next prompt pass
                        // needs last (see `make_room`'s doc).
                        let wait = |k: &UnitKey, u: &Unit| decode_wait(u, distance(k.0), n_layers);
                        wait(kb, b)
                            .total_cmp(&wait(ka, a))
                            .then(kb.0.cmp(&ka.0))
                            .then(a.last_use.cmp(&b.last_use))
                    }
                })
                .map(|(k, _)| *k);
            let Some(key) = victim else {
                return false;
            };
            tracing::trace!(
                target: EVICT_TRACE,
                layer = key.0,
                expert = key.1,
                current,
                pass,
                "evicted"
            );
            self.unregister_layer(state, key.0);
            let unit = state.units.get_mut(&key).expect("victim exists");
            unit.residency = Residency::Absent;
            let wasted = std::mem::take(&mut unit.prefetched);
            let (bytes, ranges) = (unit.bytes, unit.ranges.clone());
            // Last range first: the bank hands out its runs last in, first
            // out, so a load of a unit shaped alike (a layer's experts all
            // are) takes each range's pages whole from the same tensor's,
            // splitting the region's mapping only at the ranges' ends.
            for (a, b) in ranges.into_iter().rev() {
                self.region.retire(a, b);
            }
            state.cache_bytes -= bytes;
            state.stats.evictions += 1;
            if pass {
                let p = &mut state.stats.prompt_stream;
                p.evicted_bytes += bytes;
                if key.0 > current {
                    p.evicted_ahead_bytes += bytes;
                }
            }
            if wasted {
                state.stats.prefetch_wasted_bytes += bytes;
            }
        }
        true
    }
}

/// The least chance of being chosen at which a decode's guess at the next
/// layer's expert is worth reading ahead, `read` being the seconds a unit
/// takes to read and `compute` those between two layers' requests: a right
/// guess saves the stall of its read, up to the compute it overlaps; a
/// wrong one holds the disk for the rest of its read while the next layer
/// reads what it chose. Worth it when p·c > (1 − p)·(r − c), so p > 1 − c/r;
/// any guess where a read fits in the compute or neither is measured yet.
/// (The Mixtral shape's 99 MB experts on the H200: ~80 ms a read against
/// ~5 ms of compute a layer, so a guess needs 94%; co-activation guessed
/// right 36% of the time on `mixtral` routing, dev machine, and its wrong
/// reads added 7.7% to a decode's bytes.)
fn prefetch_min_chance(read: f64, compute: f64) -> f64 {
    if read <= 0.0 || compute <= 0.0 || read <= compute {
        0.0
    } else {
        1.0 - compute / read
    }
}

/// Weight of a unit's use by the last token or two in [`use_chance`]; the
/// rest goes to its long-run rate.
const RECENT_WEIGHT: f64 = 0.3;

/// Per decoded token, what a use's weight in a unit's `score` keeps:
/// 0.5^(1/64), so a use counts half after 64 tokens and `score` is a use
/// rate (a router's popularity) over the last ~92 in [`use_chance`].
/// Written out because `use_chance` runs for every candidate of every
/// eviction.
const RATE_DECAY: f64 = 0.989_228_013_193_975_5;

/// The chance that the next decoded token chooses `unit`, estimated from
/// its decode uses: real routers repeat the token before's experts well
/// above chance (its `recent` uses) and prefer some experts over others
/// (its `score`, a use rate over the last ~92 tokens, [`RATE_DECAY`]).
/// Neither alone serves both: replaying 256 decoded tokens' recorded
/// routing (`scripts/bench/cache_replay.py`, 8-layer cuts of the two shapes)
/// at the cache shares of the H200's runs, frequency alone (the policy
/// before) read 21–23% more units per token on `mixtral` routing and
/// 2–3% more on `qwen3`'s; recency alone (LRU) 4–7% more on `qwen3`'s.
fn use_chance(unit: &Unit) -> f64 {
    RECENT_WEIGHT * unit.recent.min(1.0) + (1.0 - RECENT_WEIGHT) * unit.score * (1.0 - RATE_DECAY)
}

/// Layer steps until a decode is expected to next use `unit`, `distance`
/// layers after the one computing, of `n_layers`: `distance` if the token
/// now decoding chooses it, else a token later for each token that does
/// not (expected 1/p − 1 of them, p = [`use_chance`]); infinite for a unit
/// no decode has used.
fn decode_wait(unit: &Unit, distance: u32, n_layers: u32) -> f64 {
    let p = use_chance(unit);
    if p <= 0.0 {
        return f64::INFINITY;
    }
    f64::from(distance) + f64::from(n_layers) * (1.0 / p - 1.0)
}

/// How many layers after `current` a pass over `n_layers` layers next needs
/// `layer`: 1 for the next layer, `n_layers` for `current` itself (its
/// units in use are pinned; the others wait for the next chunk).
fn pass_distance(layer: u32, current: u32, n_layers: u32) -> u32 {
    let n = n_layers.max(1);
    (layer + n - current % n - 1) % n + 1
}

/// Whether a prompt pass computing `current` reads `next` ahead: a layer
/// after `current` in this pass, not one it has reached, nor the next
/// chunk's first layers (read when it comes).
fn pass_reads_on(next: u32, current: u32, n_layers: u32) -> bool {
    next > current && next < n_layers
}

/// `ranges` sorted by file offset, those that touch or overlap merged: one
/// sequential read per run of neighbouring slices.
fn file_order(ranges: impl IntoIterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = ranges.into_iter().collect();
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (a, b) in ranges {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

fn ema(avg: f64, sample: f64) -> f64 {
    if avg == 0.0 {
        sample
    } else {
        0.8 * avg + 0.2 * sample
    }
}

impl Drop for Streamer {
    fn drop(&mut self) {
        let mut state = self.lock();
        let layers: Vec<u32> = state.registered.layers().collect();
        for layer in layers {
            self.unregister_layer(&mut state, layer);
        }
        if let Some(path) = &state.reads_path {
            let run = state.stats.measured_reads();
            if run.decode.bytes + run.prompt.bytes > 0.0 {
                if let Err(e) = super::reads::save_run(path, run) {
                    tracing::warn!("could not save read rates to {}: {e}", path.display());
                }
            }
        }
        if let Some(path) = &state.coact_path {
            if state.coact.total() > 0 {
                if let Err(e) = state.coact.save(path) {
                    tracing::warn!(
                        "could not save co-activation statistics to {}: {e}",
                        path.display()
                    );
                }
            }
        }
    }
}

/// Pins `key` for the calling thread (until [`unpin_thread`]).
fn pin(state: &mut State, key: UnitKey) {
    let unit = state.units.get_mut(&key).expect("a unit of this streamer");
    unit.pins += 1;
    if unit.pins == 1 {
        state.pinned_bytes += unit.bytes;
    }
    state
        .pinned
        .entry(std::thread::current().id())
        .or_default()
        .push(key);
}

/// Releases the pins the calling thread's previous request took.
fn unpin_thread(state: &mut State) {
    let Some(keys) = state.pinned.remove(&std::thread::current().id()) else {
        return;
    };
    for key in keys {
        if let Some(u) = state.units.get_mut(&key) {
            if u.pins == 1 {
                state.pinned_bytes -= u.bytes;
            }
            u.pins = u.pins.saturating_sub(1);
        }
    }
}

/// Largest read issued for a unit, bytes (a page multiple).
pub const READ_CHUNK_BYTES: u64 = 1 << 20;
/// Bytes of the whole pages of `[a, b)` (rounded out to pages, as
/// [`StreamRegion::read_from`] counts a read) inside `ranges` (page
/// aligned, disjoint).
fn pages_within(a: u64, b: u64, ranges: &[(u64, u64)]) -> u64 {
    let (a, b) = (a - a % PAGE, round_up(b, PAGE));
    ranges
        .iter()
        .map(|&(x, y)| y.min(b).saturating_sub(x.max(a)))
        .sum()
}
/// Reads in flight per unit when nothing else is configured.
pub const DEFAULT_READ_QUEUE_DEPTH: u32 = 4;

/// `ranges` cut into reads of at most `chunk` bytes (a page multiple),
/// counted from each range's first page: the cuts are page aligned, so the
/// pieces' page-rounded reads never overlap inside a range and together
/// cover the same pages the whole ranges would, and a range no longer than
/// a chunk is one read wherever it starts. (Cutting at multiples of `chunk`
/// from the file's start split most sub-chunk ranges, such as a 0.9 MB
/// expert slice, into two reads.)
fn read_chunks(ranges: &[(u64, u64)], chunk: u64) -> Vec<(u64, u64)> {
    let chunk = round_up(chunk.max(1), PAGE);
    let mut out = Vec::new();
    for &(a, b) in ranges {
        let mut start = a;
        let mut cut = a - a % PAGE;
        while start < b {
            cut += chunk;
            let end = cut.min(b);
            out.push((start, end));
            start = end;
        }
    }
    out
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
    fn wants(&self, name: &[u8], node: &Node) -> bool {
        match self.mode {
            Mode::ExpertStreaming => layer_of(name, b"ffn_moe_topk-")
                .is_some_and(|layer| self.asks_at(layer, node.n_rows())),
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
                self.ensure(layer, &experts, node.n_rows());
            }
            Mode::DenseFfnStreaming => {
                if let Some(layer) = layer_of(name, b"ffn_norm-") {
                    self.ensure(layer, &[0], node.n_rows());
                }
            }
            Mode::FullResident => {}
        }
    }

    fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    fn decode_done(&self) {
        let mut state = self.lock();
        unpin_thread(&mut state);
        if state.prompt_threads.remove(&std::thread::current().id()) {
            tracing::debug!(target: PASS_TRACE, "pass done");
        }
        if state.host_limit_bytes.is_some() {
            self.sample_host(&mut state);
            self.make_room(&mut state, 0, None, false);
        }
    }

    fn take_error(&self) -> Option<String> {
        let error = self.lock().error.take();
        if error.is_some() {
            self.failed.store(false, Ordering::SeqCst);
        }
        error
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A streamer over a 4-layer tiny Mixtral written to a temporary file,
    /// with a cache of `layers` layers' bytes (`None`: unlimited).
    fn tiny_streamer(name: &str, layers: Option<u64>) -> (Streamer, PathBuf) {
        tiny_streamer_placed(name, layers, |_| {})
    }

    /// [`tiny_streamer`] with its expert-streaming placement changed by
    /// `place` first.
    fn tiny_streamer_placed(
        name: &str,
        layers: Option<u64>,
        place: impl FnOnce(&mut Placement),
    ) -> (Streamer, PathBuf) {
        tiny_streamer_sized(name, |layer| layers.map_or(u64::MAX, |n| n * layer), place)
    }

    /// [`tiny_streamer_placed`] with a budget of `budget(one layer's bytes)`.
    fn tiny_streamer_sized(
        name: &str,
        budget: impl FnOnce(u64) -> u64,
        place: impl FnOnce(&mut Placement),
    ) -> (Streamer, PathBuf) {
        let path = std::env::temp_dir().join(format!(
            "hypura-streamer-{name}-{}.gguf",
            std::process::id()
        ));
        let spec = hypura_synth::SynthSpec::tiny_mixtral().with_layers(4);
        hypura_synth::write(&spec, &path).unwrap();
        let gguf = GgufFile::open(&path).unwrap();
        let mut placement = Placement::for_mode(&gguf, Mode::ExpertStreaming).unwrap();
        place(&mut placement);
        let new = |budget| {
            let region = Arc::new(StreamRegion::reserve(gguf.file_bytes()).unwrap());
            Streamer::new(
                &gguf,
                &placement,
                region,
                File::open(&path).unwrap(),
                budget,
            )
        };
        let layer = new(u64::MAX).unwrap().minimum_budget_bytes();
        (new(budget(layer)).unwrap(), path)
    }

    /// A tiny streamer with room for two layers, filled by decoding layers
    /// 2 and 3; with every expert's index.
    fn decoded_layers_2_and_3(name: &str) -> (Streamer, PathBuf, Vec<u32>) {
        let (streamer, path) = tiny_streamer(name, Some(2));
        let every: Vec<u32> = (0..streamer.lock().n_experts).collect();
        streamer.ensure(2, &every, 1);
        streamer.ensure(3, &every, 1);
        streamer.decode_done();
        (streamer, path, every)
    }

    #[test]
    fn a_prompt_pass_leaves_the_decode_scores_alone() {
        let (streamer, path) = tiny_streamer("scores", None);
        let every: Vec<u32> = (0..streamer.lock().n_experts).collect();
        // A decode's choice counts; a prompt chunk's (64 rows) does not.
        streamer.ensure(0, &[1], 1);
        streamer.decode_done();
        streamer.ensure(0, &every, 64);
        streamer.ensure(1, &every, 64);
        streamer.decode_done();
        let state = streamer.lock();
        for e in &every {
            let want = if *e == 1 { 1.0 } else { 0.0 };
            assert_eq!(state.units[&(0, *e)].score, want, "layer 0 expert {e}");
            assert_eq!(state.units[&(1, *e)].score, 0.0, "layer 1 expert {e}");
        }
        // Both passes still read what they lacked.
        assert!(
            state
                .units
                .values()
                .filter(|u| u.residency == Residency::Resident)
                .count()
                >= 8
        );
        drop(state);
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_pass_counts_what_it_evicts_from_layers_it_has_not_reached() {
        // Decoding leaves layers 2 and 3 in the full cache.
        let (streamer, path, every) = decoded_layers_2_and_3("evicted");
        let layer = streamer.minimum_budget_bytes();
        // A pass's first layer evicts layer 3, which it has not reached.
        streamer.ensure(0, &every, 64);
        let p = streamer.stats().prompt_stream;
        assert_eq!((p.evicted_bytes, p.evicted_ahead_bytes), (layer, layer));
        // Its second evicts layer 0, just computed.
        streamer.ensure(1, &every, 64);
        streamer.decode_done();
        let p = streamer.stats().prompt_stream;
        assert_eq!((p.evicted_bytes, p.evicted_ahead_bytes), (2 * layer, layer));
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_pass_reads_ahead_to_its_end_with_room_from_the_layers_it_computed() {
        let (streamer, path) = tiny_streamer("ahead", Some(3));
        let every: Vec<u32> = (0..streamer.lock().n_experts).collect();
        let layer = streamer.minimum_budget_bytes();
        let whole = |l: u32| {
            let state = streamer.lock();
            every
                .iter()
                .all(|&e| state.units[&(l, e)].residency == Residency::Resident)
        };
        // A first pass leaves layers 0, 1 and 3 (layer 2, read last, goes
        // for layer 3).
        for l in 0..4 {
            streamer.ensure(l, &every, 64);
        }
        streamer.decode_done();
        assert!(whole(0) && whole(1) && !whole(2) && whole(3));
        // The next one computes layer 1: its read-ahead reads layer 2 in
        // the room of layer 0 (computed), not of layer 3 (ahead), and goes
        // on to the pass's end.
        streamer.ensure(0, &every, 64);
        streamer.ensure(1, &every, 64);
        let before = streamer.stats().prompt_stream;
        streamer.prefetch_pass(2, every.len());
        let p = streamer.stats().prompt_stream.since(&before);
        // One layer's bytes (reads round out to whole pages).
        assert!((layer..layer + 8 * PAGE).contains(&p.read_ahead_bytes));
        assert!(!whole(0) && whole(2) && whole(3));
        streamer.decode_done();
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_first_passs_reads_count_as_cold_and_later_passes_warm() {
        let (streamer, path) = tiny_streamer("cold", Some(3));
        let every: Vec<u32> = (0..streamer.lock().n_experts).collect();
        let layer = streamer.minimum_budget_bytes();
        let about = |bytes: u64, layers: u64| {
            (layers * layer..layers * (layer + 8 * PAGE) + 1).contains(&bytes)
        };
        // A first pass fills the cache with layers 0 to 2, then evicts for
        // layer 3: all of it is cold.
        for l in 0..4 {
            streamer.ensure(l, &every, 64);
        }
        streamer.decode_done();
        let p = streamer.stats().prompt_stream;
        assert!(about(p.cold_bytes_read, 4), "{p:?}");
        assert_eq!(p.cold_bytes_read, p.nvme_bytes_read);
        assert_eq!(p.cold_read_seconds, p.read_seconds);
        // The next pass, begun after an eviction, is warm; so is a pass
        // that starts again at layer 0 on the same thread (the next chunk
        // of one decode).
        for _ in 0..2 {
            for l in 0..4 {
                streamer.ensure(l, &every, 64);
            }
        }
        streamer.decode_done();
        let q = streamer.stats().prompt_stream;
        assert_eq!(q.cold_bytes_read, p.cold_bytes_read);
        assert!(q.nvme_bytes_read - q.cold_bytes_read >= 2 * layer, "{q:?}");
        // The planner sees the two apart.
        let reads = streamer.stats().measured_reads();
        assert_eq!(reads.cold_prompt.bytes, q.cold_bytes_read as f64);
        assert_eq!(
            reads.prompt.bytes,
            (q.nvme_bytes_read - q.cold_bytes_read) as f64
        );
        assert_eq!(reads.cold_prompt.seconds, q.cold_read_seconds);
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_pass_that_has_computed_nothing_reads_ahead_only_into_free_room() {
        // Decoding filled the cache with layers 2 and 3.
        let (streamer, path, every) = decoded_layers_2_and_3("ahead-start");
        // A pass's first layer needs one expert (room from layer 3, needed
        // last); nothing else the cache holds has been computed.
        streamer.ensure(0, &[0], 64);
        let before = streamer.stats();
        streamer.prefetch_pass(1, every.len());
        let after = streamer.stats();
        assert_eq!(after.nvme_bytes_read, before.nvme_bytes_read);
        assert_eq!(after.evictions, before.evictions);
        let state = streamer.lock();
        assert!(every
            .iter()
            .all(|&e| state.units[&(2, e)].residency == Residency::Resident));
        drop(state);
        streamer.decode_done();
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_decode_keeps_the_token_befores_expert_over_one_used_often_long_ago() {
        // Room for 9 of the 16 units (4 layers of 4 experts, each 1/4 of a layer).
        let (streamer, path) = tiny_streamer_sized("decode-recent", |layer| 9 * layer / 4, |_| {});
        // Layers 0 to 2 choose experts 0 and 1 at every token; layer 3
        // chooses expert 1 for 6 tokens, expert 0 for 12, then expert 2.
        let token = |last: u32| {
            for layer in 0..3 {
                streamer.ensure(layer, &[0, 1], 1);
            }
            streamer.ensure(3, &[last], 1);
            streamer.decode_done();
        };
        (0..6).for_each(|_| token(1));
        (0..12).for_each(|_| token(0));
        token(2);
        // Full: expert 3 takes the room of expert 1 (used 6 times, 13
        // tokens ago: by use count alone the one to keep), not of expert 2
        // (used once, by the token before: a real router repeats it more
        // often than it returns to one it left).
        token(3);
        let state = streamer.lock();
        let resident = |e: u32| state.units[&(3, e)].residency == Residency::Resident;
        assert!(!resident(1), "the expert left long ago stays");
        assert!(resident(0) && resident(2) && resident(3));
        assert!(
            (0..3).all(|l| (0..2).all(|e| state.units[&(l, e)].residency == Residency::Resident))
        );
        drop(state);
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_decode_guesses_the_next_layer_only_where_a_right_guess_pays() {
        let (streamer, path) = tiny_streamer("decode-guess", None);
        // Layer 0 chooses experts 0 and 1 at every token; layer 1 follows
        // with 2 and 3 always (chance 1) or, alternately, 0 and 1 (chance 1/2).
        let guesses = |always: bool, read: f64, compute: f64| {
            for t in 0..8 {
                streamer.ensure(0, &[0, 1], 1);
                let next: &[u32] = if always || t % 2 == 0 {
                    &[2, 3]
                } else {
                    &[0, 1]
                };
                streamer.ensure(1, next, 1);
                streamer.decode_done();
            }
            let mut state = streamer.lock();
            state.last_request = None;
            state.read_seconds_per_unit = read;
            state.compute_seconds_per_layer = compute;
            let mut guessed = streamer.predict_next(&mut state, 0, &[0, 1]);
            state.coact.counts.iter_mut().for_each(|t| t.fill(0));
            guessed.sort();
            guessed
        };
        // A read 16 times the compute: worth it only above 15/16.
        assert_eq!(guesses(true, 0.08, 0.005), vec![(1, 2), (1, 3)]);
        assert!(guesses(false, 0.08, 0.005).is_empty());
        // A read that fits in the compute, or none measured: any guess.
        assert_eq!(guesses(false, 0.004, 0.005).len(), 2);
        assert_eq!(guesses(false, 0.0, 0.0).len(), 2);
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn use_chance_weighs_the_last_tokens_and_the_long_run_rate() {
        let unit = |recent: f64, score: f64| Unit {
            ranges: Vec::new(),
            bytes: 1,
            residency: Residency::Resident,
            prefetched: false,
            pins: 0,
            recent,
            score,
            last_use: 0,
        };
        // Chosen at every token for long: a use rate of 1, certain.
        assert!((RATE_DECAY.powi(64) - 0.5).abs() < 1e-12);
        let steady = 1.0 / (1.0 - RATE_DECAY);
        assert!((use_chance(&unit(2.0, steady)) - 1.0).abs() < 1e-9);
        // Never used by a decode: needed never, evicted first.
        assert_eq!(decode_wait(&unit(0.0, 0.0), 1, 32), f64::INFINITY);
        // Alike in chance, the one needed later in the token waits longer.
        let u = unit(1.0, 10.0);
        assert!(decode_wait(&u, 5, 32) > decode_wait(&u, 1, 32));
        // A layer's worth of distance weighs less than a token's chance.
        assert!(decode_wait(&unit(1.0, 10.0), 32, 32) < decode_wait(&unit(0.5, 10.0), 1, 32));
    }

    #[test]
    fn a_decode_evicts_what_the_next_pass_needs_last_among_units_alike() {
        // A pass leaves layers 0 and 1 in a cache of two layers, unscored.
        let (streamer, path) = tiny_streamer("decode-victim", Some(2));
        let every: Vec<u32> = (0..streamer.lock().n_experts).collect();
        streamer.ensure(0, &every, 64);
        streamer.ensure(1, &every, 64);
        streamer.decode_done();
        // A decode's miss at layer 2 takes the room of layer 1 (the next
        // pass needs it after layer 0), not of layer 0 (used longest ago).
        streamer.ensure(2, &every[..1], 1);
        streamer.decode_done();
        let state = streamer.lock();
        let resident = |l: u32| {
            every
                .iter()
                .filter(|&&e| state.units[&(l, e)].residency == Residency::Resident)
                .count()
        };
        assert_eq!(resident(0), every.len());
        assert!(resident(1) < every.len());
        assert_eq!(resident(2), 1);
        drop(state);
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn layers_pinned_without_asking_leave_another_context_room_for_its_layer() {
        // Room for two layers: one per context decoding at once.
        let (streamer, path) = tiny_streamer("pins", Some(2));
        let layer = streamer.minimum_budget_bytes();
        let every: Vec<u32> = (0..streamer.lock().n_experts).collect();
        // One decode reads layers 0 and 1; the cache is full.
        streamer.ensure(0, &every, 1);
        streamer.ensure(1, &every, 1);
        streamer.decode_done();
        // The next decode is asked about both layers before computing either:
        // the first is pinned without a sync, the second would hold the
        // whole cache, so it is asked for.
        assert!(streamer.pin_if_resident(0));
        assert!(!streamer.pin_if_resident(1));
        // Meanwhile another context needs layer 2: it evicts layer 1, not the
        // pinned layer 0, and stays within the budget.
        std::thread::scope(|s| s.spawn(|| streamer.ensure(2, &every, 1)).join().unwrap());
        let stats = streamer.stats();
        assert!(stats.cache_peak_bytes <= 2 * layer, "{stats:?}");
        assert_eq!(stats.evictions as usize, every.len(), "{stats:?}");
        let state = streamer.lock();
        assert!(
            (0..every.len() as u32).all(|e| state.units[&(0, e)].residency == Residency::Resident)
        );
        assert!(
            (0..every.len() as u32).all(|e| state.units[&(1, e)].residency == Residency::Absent)
        );
        drop(state);
        std::fs::remove_file(&path).ok();
    }

    /// Records registrations like a driver would refuse misuse: a page
    /// registered twice fails the test, and at each unregistration the span
    /// must still hold the file's bytes (no page of it released first).
    struct Recorder {
        file: Vec<u8>,
        base: usize,
        spans: Mutex<HashMap<usize, usize>>,
    }

    impl HostPinning for Recorder {
        fn register(&self, ptr: *mut u8, len: usize) -> bool {
            let mut spans = self.spans.lock().unwrap();
            let (a, b) = (ptr as usize, ptr as usize + len);
            assert!(a.is_multiple_of(PAGE as usize) && len.is_multiple_of(PAGE as usize));
            assert!(
                !spans.iter().any(|(&c, &l)| a < c + l && c < b),
                "a page registered twice"
            );
            spans.insert(a, len);
            true
        }

        fn unregister(&self, ptr: *mut u8) {
            let len = self
                .spans
                .lock()
                .unwrap()
                .remove(&(ptr as usize))
                .expect("registered");
            let at = ptr as usize - self.base;
            let end = (at + len).min(self.file.len());
            // SAFETY (test): the span lies in the region, still mapped.
            let held = unsafe { std::slice::from_raw_parts(ptr, end - at) };
            assert!(
                held == &self.file[at..end],
                "a page was released before it was unregistered"
            );
        }
    }

    #[test]
    fn kept_layers_are_registered_and_unregistered_before_their_pages_go() {
        let path = std::env::temp_dir().join(format!(
            "hypura-streamer-register-{}.gguf",
            std::process::id()
        ));
        let spec = hypura_synth::SynthSpec::tiny_mixtral().with_layers(4);
        hypura_synth::write(&spec, &path).unwrap();
        let gguf = GgufFile::open(&path).unwrap();
        let placement = Placement::for_mode(&gguf, Mode::ExpertStreaming).unwrap();
        let region = Arc::new(StreamRegion::reserve(gguf.file_bytes()).unwrap());
        let recorder = Arc::new(Recorder {
            file: std::fs::read(&path).unwrap(),
            base: region.base() as usize,
            spans: Mutex::default(),
        });
        let streamer = Streamer::new(
            &gguf,
            &placement,
            region,
            File::open(&path).unwrap(),
            u64::MAX,
        )
        .unwrap();
        streamer.set_host_pinning(Arc::clone(&recorder) as Arc<dyn HostPinning>);
        streamer.fill();
        let layer_bytes = streamer.minimum_budget_bytes();
        streamer.register_layer(1);
        streamer.register_layer(1);
        let stats = streamer.stats();
        assert_eq!(stats.registrations, 1, "registered once");
        assert!(stats.registered_bytes >= layer_bytes, "{stats:?}");
        assert!(!recorder.spans.lock().unwrap().is_empty());
        // Layer 1 in use (a unit pinned by this thread): shrinking the cache
        // to one layer evicts the others, never the registered layer in use.
        let every: Vec<u32> = (0..streamer.lock().n_experts).collect();
        streamer.ensure(1, &[0], 1);
        streamer.set_cache_budget(layer_bytes).unwrap();
        {
            let state = streamer.lock();
            assert!(every
                .iter()
                .all(|&e| state.units[&(1, e)].residency == Residency::Resident));
            assert!(every
                .iter()
                .all(|&e| state.units[&(0, e)].residency == Residency::Absent));
        }
        // Its use over, layer 2's request evicts it: unregistered first
        // (the recorder checks its bytes are still there).
        streamer.decode_done();
        streamer.ensure(2, &every, 1);
        assert!(recorder.spans.lock().unwrap().is_empty());
        assert_eq!(streamer.stats().registered_bytes, 0);
        // What is still registered when the streamer goes is unregistered.
        streamer.decode_done();
        streamer.register_layer(2);
        assert!(!recorder.spans.lock().unwrap().is_empty());
        drop(streamer);
        assert!(recorder.spans.lock().unwrap().is_empty());
        std::fs::remove_file(&path).ok();
    }

    #[test]
    fn dense_lookahead_starts_at_the_planned_depth_then_follows_measurements() {
        let path = crate::test_models::smollm2();
        let gguf = GgufFile::open(&path).unwrap();
        let region = Arc::new(StreamRegion::reserve(gguf.file_bytes()).unwrap());
        let file = File::open(&path).unwrap();
        let budget = gguf.tensor_bytes(); // room for every layer: k is not bounded by slots
        let placement = Placement::for_mode(&gguf, Mode::DenseFfnStreaming).unwrap();
        let streamer = Streamer::new(&gguf, &placement, region, file, budget).unwrap();
        let layers = |ks: Vec<UnitKey>| ks.into_iter().map(|(l, _)| l).collect::<Vec<_>>();
        let predict = |layer| layers(streamer.predict_next(&mut streamer.lock(), layer, &[0]));

        assert_eq!(predict(3), vec![4], "default depth 1");
        streamer.set_initial_prefetch_depth(5);
        assert_eq!(predict(3), vec![4, 5, 6, 7, 8]);
        assert_eq!(
            predict(28),
            vec![29, 0, 1, 2, 3],
            "wraps to the next token's layers"
        );
        // One measurement alone is not a ratio yet.
        streamer.lock().read_seconds_per_unit = 0.010;
        assert_eq!(predict(3), vec![4, 5, 6, 7, 8]);
        // read / compute = 0.010 / 0.004 = 2.5: 3 layers.
        streamer.lock().compute_seconds_per_layer = 0.004;
        assert_eq!(predict(3), vec![4, 5, 6]);
    }

    #[test]
    fn a_pass_reads_in_file_order_and_evicts_the_layer_it_needs_last() {
        // Slices of three units out of order, two of them neighbours: one
        // sorted read per run of neighbouring bytes.
        let ranges = [(300, 400), (0, 100), (100, 200), (500, 600), (550, 700)];
        assert_eq!(file_order(ranges), vec![(0, 200), (300, 400), (500, 700)]);
        // Computing layer 2 of 6: layer 3 is needed next, layer 2's unused
        // experts and layer 1 only in the next chunk, the current last.
        let order: Vec<u32> = (0..6).map(|l| pass_distance(l, 2, 6)).collect();
        assert_eq!(order, vec![4, 5, 6, 1, 2, 3]);
    }

    #[test]
    fn a_pass_reads_ahead_within_the_pass_only() {
        // Computing layer 2 of 8: every later layer is read ahead.
        let on: Vec<u32> = (0..9).filter(|&l| pass_reads_on(l, 2, 8)).collect();
        assert_eq!(on, vec![3, 4, 5, 6, 7]);
        // Never a layer the compute reached or went past (it read that
        // layer itself), nor into the next chunk's.
        assert!(!pass_reads_on(2, 2, 8));
        assert!(!pass_reads_on(0, 7, 8));
    }

    #[test]
    fn a_read_ahead_request_the_pass_has_overtaken_reads_nothing() {
        let (streamer, path) = tiny_streamer("overtaken", None);
        let every = streamer.lock().n_experts as usize;
        // The chunk's layer 0 needed one expert; it computes layer 1 now.
        streamer.ensure(0, &[0], 64);
        streamer.ensure(1, &[0], 64);
        let read = |s: &Streamer| s.stats().prompt_stream.nvme_bytes_read;
        let before = read(&streamer);
        // The request layer 0's compute queued comes late: nothing is read.
        streamer.prefetch_pass(0, every);
        assert_eq!(read(&streamer), before);
        assert!(streamer.lock().units[&(0, 1)].residency == Residency::Absent);
        // One for the layer after the compute is read.
        streamer.prefetch_pass(2, every);
        assert!(read(&streamer) > before);
        assert!(streamer.lock().units[&(2, 1)].residency == Residency::Resident);
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_prompt_chunk_asks_at_every_layer_and_pins_none_unasked() {
        let (streamer, path, _) = decoded_layers_2_and_3("asks");
        // A decode computes resident layer 2 unasked, its units pinned
        // until the thread's next request.
        assert!(!streamer.asks_at(2, 1));
        assert!(streamer.lock().pinned_bytes > 0);
        streamer.decode_done();
        // A chunk asks there, so its request unpins the layers it computed.
        assert!(streamer.asks_at(2, PROMPT_UBATCH_TOKENS));
        assert!(streamer.asks_at(3, PROMPT_UBATCH_TOKENS));
        assert_eq!(streamer.lock().pinned_bytes, 0);
        let _ = std::fs::remove_file(path);
        // With every unit held no layer is ever read: a chunk need not ask.
        let (streamer, path) = tiny_streamer("asks-all", None);
        let every: Vec<u32> = (0..streamer.lock().n_experts).collect();
        streamer.ensure(0, &every, 1);
        streamer.decode_done();
        assert!(!streamer.asks_at(0, PROMPT_UBATCH_TOKENS));
        streamer.decode_done();
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_pass_at_a_layer_held_on_another_tier_evicts_what_the_next_pass_needs_last() {
        // Layers 0 to 2 stream; layer 3's experts are held in RAM.
        let (streamer, path) = tiny_streamer_placed("tier", Some(2), |placement| {
            for (name, tier) in placement.tiers.iter_mut() {
                if name.starts_with("blk.3.") {
                    *tier = Tier::Ram;
                }
            }
        });
        let layer = streamer.minimum_budget_bytes();
        assert_eq!(streamer.lock().n_layers, 4);
        let every: Vec<u32> = (0..streamer.lock().n_experts).collect();
        // A pass: layer 2 evicts layer 1 (the next pass needs layer 0 first).
        streamer.ensure(0, &every, 64);
        streamer.ensure(1, &every, 64);
        streamer.ensure(2, &every, 64);
        // Layer 3 holds nothing to read: the chunk is there now.
        streamer.ensure(3, &every, 64);
        streamer.decode_done();
        // Room for one layer: the next pass needs layer 2 last.
        let mut state = streamer.lock();
        assert!(streamer.make_room(&mut state, layer, None, true));
        let resident = |l: u32| {
            (0..state.n_experts).all(|e| state.units[&(l, e)].residency == Residency::Resident)
        };
        assert!(resident(0), "layer 0, needed first, was evicted");
        assert!(!resident(2));
        drop(state);
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn ranges_are_cut_into_chunks_from_their_first_page() {
        let mib = 1 << 20;
        // Unaligned start and end, a range inside one chunk, an empty range.
        let ranges = [(100, 2 * mib + 5), (3 * mib + 1, 3 * mib + 9), (7, 7)];
        assert_eq!(
            read_chunks(&ranges, mib),
            vec![
                (100, mib),
                (mib, 2 * mib),
                (2 * mib, 2 * mib + 5),
                (3 * mib + 1, 3 * mib + 9),
            ]
        );
        // Interior cuts are page aligned, so page-rounded reads do not overlap.
        for (a, b) in read_chunks(&[(4095, 10 * mib + 3)], mib) {
            assert!(a == 4095 || a % PAGE == 0, "{a}");
            assert!(b == 10 * mib + 3 || b % PAGE == 0, "{b}");
        }
        // A chunk that is no page multiple is rounded up to one.
        assert_eq!(read_chunks(&[(0, 8192)], 5000), vec![(0, 8192)]);
        // A range shorter than a chunk across a chunk multiple of the file
        // is one read; a longer one is cut a chunk from its first page.
        let short = (mib - 2 * PAGE + 10, 2 * mib - 3 * PAGE);
        assert_eq!(read_chunks(&[short], mib), vec![short]);
        let long = (mib - 2 * PAGE + 10, 3 * mib);
        assert_eq!(
            read_chunks(&[long], mib),
            vec![
                (long.0, 2 * mib - 2 * PAGE),
                (2 * mib - 2 * PAGE, 3 * mib - 2 * PAGE),
                (3 * mib - 2 * PAGE, 3 * mib),
            ]
        );
    }
}
