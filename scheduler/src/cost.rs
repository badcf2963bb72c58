//! The decode cost model: seconds per generated token from the bytes each
//! tier touches per token and the rate at which that tier delivers them.
//!
//! Per token:
//! - `gpu_seconds` = weight bytes read from GPU memory ÷ the GPU's Q4_K
//!   matrix × vector rate;
//! - `ram_seconds` = weight bytes the CPU reads (RAM-resident tensors and the
//!   stream cache) ÷ `min(cpu.q4k_matvec_gbps, ram.read_gbps)`;
//! - `nvme_seconds` = bytes read from the model file ÷ the disk rate ([`disk_gbps`],
//!   or the rate the model's streamer measured here: [`Rates::with_measured_reads`])
//!   plus layers with a unit read × [`MISS_SECONDS`] (or, measured, a layer
//!   request's wait beyond its reads);
//! - `pcie_seconds` = hand-overs between GPU and CPU × ([`CROSSING_SECONDS`] +
//!   activation bytes ÷ the pinned host→device rate);
//! - `overhead_seconds` = [`TOKEN_OVERHEAD_SECONDS`] + layers × [`LAYER_OVERHEAD_SECONDS`]
//!   plus GPU layers × [`GPU_LAYER_OVERHEAD_SECONDS`] (graph build, sampling,
//!   thread barriers, kernel launches: what a tiny model spends per token)
//!   plus layers whose experts stream × [`STREAMED_LAYER_SECONDS`].
//!
//! llama.cpp runs GPU and CPU parts of a token one after the other, so
//! `compute = gpu + ram + pcie + overhead`. Streaming reads overlap compute
//! (prefetch) only in part: `seconds = max(compute, io) + f × min(compute, io)`
//! with `f` = [`DENSE_NON_OVERLAP`] for dense-FFN streaming (the next layers
//! are read ahead) and [`EXPERT_NON_OVERLAP`] for expert streaming (the
//! experts are known only once the router ran, so most reads stall).
//! The bottleneck is the largest of the gpu, ram, nvme and pcie terms.
//!
//! The constants are fitted to measurements: the per-token and per-layer
//! overheads with `scripts/bench-plan.sh` on 1–2 MiB models, whose time is
//! nearly all overhead (the GPU machine's CPU side, 16 threads;
//! `docs/lab/2026-11-29-cpu.md`), the per-GPU-layer overhead on the H200's
//! all-GPU plans (`docs/lab/2026-11-29-gpu-tier.md`). The non-overlap
//! fractions are estimates: streamed runs are I/O bound, where they matter
//! little. `docs/benchmarks.md` gives the model's current accuracy.
use serde::{Deserialize, Serialize};
use std::fmt;

use crate::profile::{DiskProfile, HardwareProfile};
use crate::reads::MeasuredReads;

/// Fixed cost of one decoded token outside the weight reads (graph build,
/// sampling, the decode call), seconds.
pub const TOKEN_OVERHEAD_SECONDS: f64 = 100e-6;
/// Per-layer cost outside the weight reads (a dozen small ops, each with a
/// thread barrier on the CPU backend), seconds.
pub const LAYER_OVERHEAD_SECONDS: f64 = 20e-6;
/// Per-layer cost of a layer computed on the GPU beyond its weight reads
/// (a dozen kernel launches and small ops), seconds. Fitted on the H200
/// (`scripts/gpu-bench.sh`: Llama-8B-shaped all on GPU left 31 µs per layer
/// unexplained by the matvec rate, Mixtral-shaped 49 µs).
pub const GPU_LAYER_OVERHEAD_SECONDS: f64 = 35e-6;
/// Fixed cost of one batch of streamed reads on demand (read threads, the
/// first O_DIRECT request's latency), seconds. A layer's misses are read as
/// one batch, several in flight ([`predict`]).
pub const MISS_SECONDS: f64 = 1e-3;
/// Smallest read the disk rate is taken from: the streamer reads whole
/// expert slices or layers, megabytes at a time.
pub const LARGE_READ_BYTES: u64 = 1 << 20;
/// One GPU↔CPU hand-over (a synchronisation and a small copy), seconds. An
/// estimate: not yet measured on the GPU machine.
pub const CROSSING_SECONDS: f64 = 15e-6;
/// Per token, each layer whose experts stream: llama.cpp stops the graph
/// after the layer's router so the streamer can read its choice (the eval
/// callback: a device synchronisation and a split of the graph), and the
/// streamer pins, counts and predicts. Fitted on the H200 (session 20,
/// 8 tokens decoded from an empty context): the time outside the stream's
/// stalls, less the modelled compute, came to 0.45 ms a streamed layer on
/// the Mixtral shape (32 layers, 2 experts of 99 MB used) and 1.1 ms on the
/// Qwen3-30B-A3B shape (48 layers, 8 of 2.4 MB). With the short OpenMP
/// spin (session 33, an H100 machine) the same came to 0.30 ms on Qwen3 and
/// 0.19–0.69 ms on Mixtral in two calls minutes apart: too spread to refit.
pub const STREAMED_LAYER_SECONDS: f64 = 0.7e-3;
/// Fraction of the shorter of compute and I/O that does not overlap the
/// longer one, dense-FFN streaming (k layers read ahead).
pub const DENSE_NON_OVERLAP: f64 = 0.5;
/// The same for expert streaming: a layer's experts are known only after its
/// router ran, and co-activation prediction starts cold.
pub const EXPERT_NON_OVERLAP: f64 = 1.0;

/// What bounds the decode speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Bottleneck {
    /// Weights read from GPU memory.
    GpuMemory,
    /// Weights read by the CPU from RAM (or its matrix kernels, whichever is slower).
    Ram,
    /// Streamed weights read from the model file.
    Nvme,
    /// Activations handed between GPU and CPU.
    Pcie,
    /// Per-token and per-layer fixed costs (tiny models).
    Overhead,
}

impl Bottleneck {
    pub fn as_str(self) -> &'static str {
        match self {
            Bottleneck::GpuMemory => "gpu-memory",
            Bottleneck::Ram => "ram",
            Bottleneck::Nvme => "nvme",
            Bottleneck::Pcie => "pcie",
            Bottleneck::Overhead => "overhead",
        }
    }

    /// Words for a table.
    pub fn describe(self) -> &'static str {
        match self {
            Bottleneck::GpuMemory => "GPU memory bandwidth",
            Bottleneck::Ram => "RAM bandwidth (CPU matrix kernels)",
            Bottleneck::Nvme => "NVMe reads",
            Bottleneck::Pcie => "PCIe hand-overs",
            Bottleneck::Overhead => "per-token overhead",
        }
    }
}

impl fmt::Display for Bottleneck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How streaming reads relate to compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlap {
    /// No streaming.
    None,
    /// Dense FFN layers read ahead by the prefetcher.
    ReadAhead,
    /// Experts read when the router picks them.
    OnDemand,
}

/// Bytes moved per decoded token, by where they come from.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TokenTraffic {
    pub gpu_bytes: f64,
    /// Read by the CPU: RAM-resident weights and streamed weights once cached.
    pub ram_bytes: f64,
    /// Read from the model file (stream misses).
    pub nvme_bytes: f64,
    /// Streamed units read per token (a layer's are read together: each
    /// layer with one costs [`MISS_SECONDS`] besides their bytes).
    pub misses: f64,
    /// GPU↔CPU hand-overs of the hidden state.
    pub crossings: u32,
    /// Bytes of one hand-over (the hidden state, f32).
    pub crossing_bytes: u64,
    pub n_layer: u32,
    /// Layers with tensors computed on the GPU.
    pub gpu_layers: u32,
    /// Layers whose experts stream (each costs [`STREAMED_LAYER_SECONDS`]).
    pub streamed_layers: u32,
}

/// The rates the cost model divides by, GB/s (10^9 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Rates {
    pub gpu_gbps: f64,
    /// `min(cpu.q4k_matvec_gbps, ram.read_gbps)`.
    pub cpu_gbps: f64,
    pub disk_gbps: f64,
    pub pcie_gbps: f64,
    /// The disk rate of whole-layer reads (a cold prompt pass): the best
    /// large-block point with up to 4 reads in flight.
    #[serde(default)]
    pub disk_sequential_gbps: f64,
    /// Host→device from pageable memory (weights in RAM or the stream cache
    /// that llama.cpp copies to the GPU for a prompt's batch).
    #[serde(default)]
    pub pageable_gbps: f64,
    /// The CPU's measured prompt matrix rate, GFLOP/s
    /// (`cpu.q4k_prompt_gflops`; 0: not measured).
    #[serde(default)]
    pub cpu_prompt_gflops: f64,
    /// `disk_gbps` is the rate this model's decodes read at here
    /// ([`Rates::with_measured_reads`]), not the profile's.
    #[serde(default)]
    pub disk_from_runs: bool,
    /// `disk_sequential_gbps` is the rate this model's cold prompt passes
    /// (its first, from an empty cache) read at here.
    #[serde(default)]
    pub disk_sequential_from_runs: bool,
    /// The disk rate of a warm prompt pass's reads (any pass but a model's
    /// first): the decode's rate, or what this model's warm passes read at
    /// here ([`Rates::with_measured_reads`]).
    #[serde(default)]
    pub disk_pass_gbps: f64,
    #[serde(default)]
    pub disk_pass_from_runs: bool,
    /// Fixed seconds of each layer whose units are read in a decode:
    /// [`MISS_SECONDS`], or what the model's decodes waited here a layer
    /// request beyond their reads ([`Rates::with_measured_reads`]).
    #[serde(default)]
    pub miss_seconds: f64,
}

impl Rates {
    /// Rates of `profile`.
    pub fn from_profile(profile: &HardwareProfile) -> Rates {
        let gpu = profile.gpus.first();
        let cpu = profile.cpu.q4k_matvec_gbps.min(profile.ram.read_gbps);
        let disk = disk_gbps(&profile.disk);
        Rates {
            gpu_gbps: gpu.map_or(0.0, |g| g.q4k_matvec_gbps),
            cpu_gbps: cpu,
            disk_gbps: disk,
            disk_sequential_gbps: streaming_reads(&profile.disk, u64::MAX).fold(0.0, f64::max),
            pcie_gbps: gpu.map_or(0.0, |g| g.host_to_device_pinned_gbps),
            pageable_gbps: gpu.map_or(0.0, |g| g.host_to_device_pageable_gbps),
            cpu_prompt_gflops: profile.cpu.q4k_prompt_gflops,
            disk_from_runs: false,
            disk_sequential_from_runs: false,
            disk_pass_gbps: disk,
            disk_pass_from_runs: false,
            miss_seconds: MISS_SECONDS,
        }
    }

    /// These rates with the disk's taken from what the model's streamer
    /// measured on this machine, phase by phase, where it read enough
    /// ([`crate::reads`]), each phase by its own reads: the decode by the
    /// decode's, a warm prompt pass by warm passes' (else by the decode's),
    /// a cold pass by cold passes'.
    pub fn with_measured_reads(mut self, reads: Option<&MeasuredReads>) -> Rates {
        let Some(reads) = reads else {
            return self;
        };
        if let Some(gbps) = reads.decode.gbps() {
            self.disk_gbps = gbps;
            self.disk_from_runs = true;
            self.disk_pass_gbps = gbps;
        }
        // The measured read seconds hold the first request's latency that
        // MISS_SECONDS stands for; what the waits held beyond the reads is
        // a request's own cost (0.23–0.28 ms on the H100 machine's Qwen3
        // shape, 0.51–0.66 on its Mixtral shape, where MISS_SECONDS says 1).
        if let Some(request) = reads.decode.request_seconds() {
            self.miss_seconds = request;
        }
        if let Some(gbps) = reads.prompt.gbps() {
            self.disk_pass_gbps = gbps;
            self.disk_pass_from_runs = true;
        }
        if let Some(gbps) = reads.cold_prompt.gbps() {
            self.disk_sequential_gbps = gbps;
            self.disk_sequential_from_runs = true;
        }
        self
    }
}

/// The disk rate for streaming: the median of the profile's points with
/// large blocks (at least [`LARGE_READ_BYTES`]) and up to 4 reads in
/// flight. The streamer reads any unit in pieces of at most 1 MiB, 4 at a
/// time, so no unit size reads faster than these points say; the median,
/// not the best: a throttled virtual disk bursts above its sustained rate
/// in a short probe, and decoding streams for minutes (the H200 machine's
/// 1 MiB point at 4 in flight read 2.29 GB/s, its neighbours 1.27–1.44,
/// and the streamer 1.0–1.6 GB/s). Falls back to the best point.
pub fn disk_gbps(disk: &DiskProfile) -> f64 {
    let mut rates: Vec<f64> = streaming_reads(disk, u64::MAX).collect();
    if rates.is_empty() {
        return disk.best_gbps();
    }
    rates.sort_by(f64::total_cmp);
    let mid = rates.len() / 2;
    if rates.len() % 2 == 1 {
        rates[mid]
    } else {
        (rates[mid - 1] + rates[mid]) / 2.0
    }
}

/// The profile's rates for the streamer's reads: blocks of at least
/// [`LARGE_READ_BYTES`] and at most `largest`, up to 4 in flight.
fn streaming_reads(disk: &DiskProfile, largest: u64) -> impl Iterator<Item = f64> + '_ {
    disk.reads
        .iter()
        .filter(move |p| p.block_bytes >= LARGE_READ_BYTES && p.block_bytes <= largest)
        .filter(|p| p.queue_depth <= 4)
        .map(|p| p.gbps)
}

/// Predicted decode speed and where the time goes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Prediction {
    pub tokens_per_second: f64,
    pub seconds_per_token: f64,
    pub bottleneck: Bottleneck,
    pub gpu_seconds: f64,
    pub ram_seconds: f64,
    pub nvme_seconds: f64,
    pub pcie_seconds: f64,
    pub overhead_seconds: f64,
}

impl Prediction {
    /// A token's time besides its reads: compute, hand-overs, overheads.
    pub fn work_seconds(&self) -> f64 {
        self.gpu_seconds + self.ram_seconds + self.pcie_seconds + self.overhead_seconds
    }
}

/// Seconds to move `bytes` at `gbps`; infinite when bytes must move at a zero rate.
fn seconds(bytes: f64, gbps: f64) -> f64 {
    if bytes <= 0.0 {
        0.0
    } else if gbps <= 0.0 {
        f64::INFINITY
    } else {
        bytes / (gbps * 1e9)
    }
}

/// Predicts one decoded token's time from its traffic.
pub fn predict(traffic: &TokenTraffic, rates: &Rates, overlap: Overlap) -> Prediction {
    let gpu_seconds = seconds(traffic.gpu_bytes, rates.gpu_gbps);
    let ram_seconds = seconds(traffic.ram_bytes, rates.cpu_gbps);
    // A layer's misses are read together, as one batch with several reads
    // in flight (`Streamer::ensure`): the fixed cost is per layer that
    // misses, not per unit (charged per unit, the Qwen3-30B-A3B shape's
    // 2.4 MB experts, ~3 misses a layer, cost 0.13 s a token in fixed
    // costs, a third of the prediction that missed the H200's decode by
    // −40%). Dense streaming's units are layers.
    let batches = if traffic.streamed_layers > 0 {
        traffic.misses.min(f64::from(traffic.streamed_layers))
    } else {
        traffic.misses
    };
    let nvme_seconds = seconds(traffic.nvme_bytes, rates.disk_gbps) + batches * rates.miss_seconds;
    let crossings = f64::from(traffic.crossings);
    let pcie_seconds = crossings
        * (CROSSING_SECONDS + seconds(traffic.crossing_bytes as f64, rates.pcie_gbps.max(1e-9)));
    let overhead_seconds = TOKEN_OVERHEAD_SECONDS
        + f64::from(traffic.n_layer) * LAYER_OVERHEAD_SECONDS
        + f64::from(traffic.gpu_layers) * GPU_LAYER_OVERHEAD_SECONDS
        + f64::from(traffic.streamed_layers) * STREAMED_LAYER_SECONDS;
    let compute = gpu_seconds + ram_seconds + pcie_seconds + overhead_seconds;
    let non_overlap = match overlap {
        Overlap::None => 0.0,
        Overlap::ReadAhead => DENSE_NON_OVERLAP,
        Overlap::OnDemand => EXPERT_NON_OVERLAP,
    };
    let seconds_per_token = compute.max(nvme_seconds) + non_overlap * compute.min(nvme_seconds);
    let terms = [
        (Bottleneck::GpuMemory, gpu_seconds),
        (Bottleneck::Ram, ram_seconds),
        (Bottleneck::Nvme, nvme_seconds),
        (Bottleneck::Pcie, pcie_seconds),
        (Bottleneck::Overhead, overhead_seconds),
    ];
    let bottleneck = terms
        .iter()
        .fold(terms[0], |best, &t| if t.1 > best.1 { t } else { best })
        .0;
    Prediction {
        tokens_per_second: if seconds_per_token > 0.0 {
            1.0 / seconds_per_token
        } else {
            0.0
        },
        seconds_per_token,
        bottleneck,
        gpu_seconds,
        ram_seconds,
        nvme_seconds,
        pcie_seconds,
        overhead_seconds,
    }
}

/// The prompt cost model: a prompt is decoded in passes of the graph of up
/// to `n_ubatch` tokens, and a pass costs
/// - `read_seconds`: the streamed bytes the stream cache lacks ÷ the disk
///   rate (a pass of [`PROMPT_BATCH_TOKENS`] tokens or more routes to nearly
///   every expert, so it reads each one the cache lacks once); a cold cache
///   lacks them all, read a whole layer at a time at the disk's sequential
///   rate;
/// - `copy_seconds`: with a GPU, the weights in host memory (the RAM tier
///   and the streamed ones) ÷ the pageable host→device rate: from
///   [`PROMPT_BATCH_TOKENS`] tokens on, llama.cpp copies a host weight to
///   the GPU for each op that uses it, from pageable memory;
/// - `compute_seconds`: tokens × 2 × the parameters a token touches (Q4_K:
///   [`PARAMS_PER_BYTE`] a byte) ÷ the matrix rate, taken as
///   [`PROMPT_FLOP_PER_MATVEC_BYTE`] × the GPU's Q4_K matvec rate when
///   there is one (expert matmuls at [`MOE_PROMPT_EFFICIENCY`] of that),
///   else the CPU's measured prompt matmul rate (experts at
///   [`CPU_MOE_PROMPT_EFFICIENCY`]): [`prompt_flops`];
///
/// and reads overlap the copies and compute in part (the next layers are
/// read while one computes): `max(io, work) + `[`PROMPT_NON_OVERLAP`]` ×
/// min(io, work)`. The constants are fitted on the H200
/// (`docs/benchmarks.md`): an 8B all on the GPU recomputed 7.1k tokens in
/// 0.81 s; the Mixtral shape at 8 GiB GPU + 12 GiB RAM took 4.27 s for 512
/// tokens and 5.52 s for 2,048 in one pass each (session 18), and its
/// server's cold first prompt of 2,223 tokens 10.20 s (session 16); the
/// Qwen3-30B-A3B shape at 4 GiB + 8 GiB 3.00–3.54 s for 512 tokens and
/// 4.91 s for 2,048 in two passes (session 18).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PromptPrediction {
    pub tokens_per_second: f64,
    pub seconds: f64,
    pub passes: u32,
    pub read_seconds: f64,
    pub copy_seconds: f64,
    pub compute_seconds: f64,
}

/// Tokens of a batch from which llama.cpp computes host weights on the GPU
/// (its `op_offload` threshold) and a streamed pass routes to nearly every
/// expert.
pub const PROMPT_BATCH_TOKENS: u32 = 32;
/// Parameters per byte of a Q4_K weight (4.5 bits a parameter).
pub const PARAMS_PER_BYTE: f64 = 8.0 / 4.5;
/// A device's prompt matrix rate (flop/s) per byte/s of its Q4_K matvec
/// rate. Fitted on the H200: the 8B recompute above is 144 TFLOP/s against
/// its 1,850 GB/s matvec counting the output layer's flops for every token,
/// 135 without them (a pass computes the output layer for its last token
/// only; 6.5% of the 8B's bytes).
pub const PROMPT_FLOP_PER_MATVEC_BYTE: f64 = 73.0;
/// The same for a CPU whose profile predates `cpu.q4k_prompt_gflops`.
/// Fitted on the 2-core dev machine: SmolLM2-135M's pp512 at 248 tok/s
/// against a 2.75 GB/s matvec. (The matvec rate is a poor guide: the same
/// machine measured 11 and 33 GB/s on different days, its prompt matmul
/// 236–240 GFLOP/s.)
pub const CPU_PROMPT_FLOP_PER_MATVEC_BYTE: f64 = 21.0;
/// Expert matmuls (`mul_mat_id`, each expert a slice of the batch) against
/// dense ones: 0.46 s for the 1,536 tokens the Mixtral shape's pp2048 took
/// beyond its pp512, about 87 TFLOP/s.
pub const MOE_PROMPT_EFFICIENCY: f64 = 0.6;
/// Expert matmuls on the CPU (`mul_mat_id`: each expert a slice of the
/// batch) against the profile's prompt matrix rate
/// (`cpu.q4k_prompt_gflops`, one weight times 512 columns). Measured on the
/// 2-core dev machine, pp512 all in RAM, the output layer not counted:
/// 0.98 of it on an 8-layer Mixtral-8x7B cut (8 experts, 2 used: 128
/// tokens an expert), 0.75 on an 8-layer Qwen3-30B-A3B cut (128, 8 used:
/// 32 tokens an expert; the probe at 32 columns gives 0.9 of 512's, the
/// rest is `mul_mat_id`'s own cost); dense 8B layers 1.15. 0.85 puts both
/// MoE shapes within 15%.
pub const CPU_MOE_PROMPT_EFFICIENCY: f64 = 0.85;
/// Fraction of the shorter of a pass's reads and its work (copies and
/// compute) that does not overlap the longer one. With reads one layer
/// ahead of compute the Mixtral shape's pp512, pp2048 and cold prompt gave
/// 0.46, 0.87 and 0.6; with reads up to three layers ahead (session 18,
/// H200) its pp512 and pp2048 gave 0.1–0.24 and 0.43, the Qwen3-30B-A3B
/// shape's pp512 0.12–0.36 and its pp2048 (two passes) below 0: 0.2
/// keeps each of those within 25%.
pub const PROMPT_NON_OVERLAP: f64 = 0.2;

/// What the prompt model needs of a plan ([`predict_prompt`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PromptTraffic {
    /// Weight bytes one token touches (all tiers).
    pub touched_bytes_per_token: f64,
    /// Weight bytes in host memory: the RAM tier and the streamed weights.
    pub host_weight_bytes: u64,
    /// Streamed weight bytes, and the stream cache that holds part of them.
    pub stream_bytes: u64,
    pub stream_cache_bytes: u64,
    /// Layers with streamed weights: a pass's window is a share of them.
    pub stream_layers: u32,
    pub moe: bool,
    /// Share of a layer's streamed units one token uses: `n_expert_used /
    /// n_expert` for experts, 1 for dense layers.
    pub unit_choice_share: f64,
    /// A decoded token's time besides its reads (the decode model's
    /// compute, hand-overs and overheads): what a short pass's token costs.
    pub decode_work_seconds: f64,
}

/// Share of a layer's streamed units that a pass of `tokens` uses: each
/// token picks `choice` of them, independently (`1 − (1 − choice)^tokens`):
/// one Mixtral token 1/4 of its experts, one Qwen3-30B-A3B token 1/16, a
/// pass of 32 nearly all of Mixtral's and 87% of Qwen3's.
pub fn pass_unit_share(choice: f64, tokens: u32) -> f64 {
    1.0 - (1.0 - choice.clamp(0.0, 1.0)).powf(f64::from(tokens))
}

/// Layers of streamed weights a prompt pass holds beside the cache's
/// other contents: the layer computing (its units pinned) and the one read
/// ahead (the streamer reads past the next layer only while less than a
/// layer's average reads are ahead). Room for them comes from the layers
/// just computed, which the next pass then lacks: a pass over `n` streamed
/// layers reads what the cache lacks times `1 / (1 − w/n)`. Measured on the
/// dev machine (Qwen3 shape, 8 layers, cache 53% of the streamed bytes,
/// passes of 512 and 1,024 tokens): 1.33× what the cache lacked (1.38× on
/// random-token prompts), `w` = 2.
pub const PASS_WINDOW_LAYERS: f64 = 2.0;

/// What a warm pass reads: the streamed bytes the cache lacks, more by the
/// pass's window ([`PASS_WINDOW_LAYERS`]), at most every streamed byte.
pub fn pass_read_bytes(traffic: &PromptTraffic) -> u64 {
    let lacking = traffic
        .stream_bytes
        .saturating_sub(traffic.stream_cache_bytes);
    let n = f64::from(traffic.stream_layers.max(1));
    let window = (PASS_WINDOW_LAYERS / n).min(0.5);
    ((lacking as f64 / (1.0 - window)) as u64).min(traffic.stream_bytes)
}

/// The rate (flop/s) at which a plan's prompt passes compute: a GPU's
/// (every pass's weights go to it) by its matvec rate
/// ([`PROMPT_FLOP_PER_MATVEC_BYTE`]); without one, the CPU's measured
/// matrix rate ([`CPU_MOE_PROMPT_EFFICIENCY`] of it for experts), or for a
/// profile that did not measure it, one derived from the matvec rate.
pub fn prompt_flops(rates: &Rates, moe: bool) -> f64 {
    let gflops = if rates.gpu_gbps > 0.0 {
        let efficiency = if moe { MOE_PROMPT_EFFICIENCY } else { 1.0 };
        PROMPT_FLOP_PER_MATVEC_BYTE * rates.gpu_gbps * efficiency
    } else if rates.cpu_prompt_gflops > 0.0 {
        let efficiency = if moe { CPU_MOE_PROMPT_EFFICIENCY } else { 1.0 };
        rates.cpu_prompt_gflops * efficiency
    } else {
        let efficiency = if moe { MOE_PROMPT_EFFICIENCY } else { 1.0 };
        CPU_PROMPT_FLOP_PER_MATVEC_BYTE * rates.cpu_gbps * efficiency
    };
    gflops * 1e9
}

/// Predicts a prompt of `tokens` decoded in passes of `n_ubatch`; `cold`:
/// the stream cache starts empty (a model's first prompt).
pub fn predict_prompt(
    traffic: &PromptTraffic,
    rates: &Rates,
    tokens: u32,
    n_ubatch: u32,
    cold: bool,
) -> PromptPrediction {
    let tokens = tokens.max(1);
    let pass = n_ubatch.max(1);
    let passes = tokens.div_ceil(pass);
    let gpu = rates.gpu_gbps > 0.0;
    let flops = prompt_flops(rates, traffic.moe);
    let flop_per_token = 2.0 * PARAMS_PER_BYTE * traffic.touched_bytes_per_token;
    let (mut read_seconds, mut copy_seconds, mut compute_seconds, mut total) = (0.0, 0.0, 0.0, 0.0);
    for i in 0..passes {
        let n = if i + 1 < passes {
            pass
        } else {
            tokens - pass * (passes - 1)
        };
        // A cold pass reads every expert of every layer, each layer one
        // sequential run; a warm one the experts the cache lacks. Each at
        // its own rate.
        let (lacking, gbps) = if cold && i == 0 {
            (traffic.stream_bytes, rates.disk_sequential_gbps)
        } else {
            (pass_read_bytes(traffic), rates.disk_pass_gbps)
        };
        let gbps = if gbps > 0.0 { gbps } else { rates.disk_gbps };
        // A pass reads the lacking units its tokens chose.
        let share = pass_unit_share(traffic.unit_choice_share, n);
        let read = seconds(lacking as f64 * share, gbps);
        // Below llama.cpp's offload threshold a pass computes host weights
        // where they lie, token by token, as a decode does.
        let batched = n >= PROMPT_BATCH_TOKENS;
        let copy = if gpu && batched {
            seconds(traffic.host_weight_bytes as f64, rates.pageable_gbps)
        } else {
            0.0
        };
        let matrix = f64::from(n) * flop_per_token / flops.max(1.0);
        let compute = if batched {
            matrix
        } else {
            matrix.max(f64::from(n) * traffic.decode_work_seconds)
        };
        let work = copy + compute;
        // A short pass's experts are read as a decode's are, once its
        // router has chosen them: its work waits for them.
        let non_overlap = if batched || traffic.unit_choice_share >= 1.0 {
            PROMPT_NON_OVERLAP
        } else {
            EXPERT_NON_OVERLAP
        };
        total += read.max(work) + non_overlap * read.min(work);
        read_seconds += read;
        copy_seconds += copy;
        compute_seconds += compute;
    }
    PromptPrediction {
        tokens_per_second: f64::from(tokens) / total.max(1e-12),
        seconds: total,
        passes,
        read_seconds,
        copy_seconds,
        compute_seconds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rates() -> Rates {
        Rates {
            gpu_gbps: 1000.0,
            cpu_gbps: 50.0,
            disk_gbps: 1.0,
            disk_sequential_gbps: 2.0,
            pcie_gbps: 50.0,
            pageable_gbps: 6.0,
            cpu_prompt_gflops: 0.0,
            disk_from_runs: false,
            disk_sequential_from_runs: false,
            disk_pass_gbps: 1.0,
            disk_pass_from_runs: false,
            miss_seconds: MISS_SECONDS,
        }
    }

    #[test]
    fn a_models_measured_reads_replace_the_probes_disk_phase_by_phase() {
        use crate::reads::{MeasuredReads, ReadTotals};
        let decoded = MeasuredReads {
            decode: ReadTotals {
                bytes: 5e9,
                seconds: 2.0,
                layer_requests: 1000.0,
                stall_seconds: 2.25,
            },
            // Too little to trust: a warm pass reads at the decode's rate,
            // a cold one at the probe's sequential rate.
            prompt: ReadTotals {
                bytes: 5e8,
                seconds: 0.1,
                ..Default::default()
            },
            cold_prompt: ReadTotals {
                bytes: 5e8,
                seconds: 0.1,
                ..Default::default()
            },
        };
        let r = rates().with_measured_reads(Some(&decoded));
        assert_eq!((r.disk_gbps, r.disk_from_runs), (2.5, true));
        assert_eq!((r.disk_pass_gbps, r.disk_pass_from_runs), (2.5, false));
        assert!((r.miss_seconds - 0.25e-3).abs() < 1e-15, "{r:?}");
        assert_eq!(
            (r.disk_sequential_gbps, r.disk_sequential_from_runs),
            (2.0, false)
        );
        // Passes that read enough are priced by their own rates, warm and
        // cold apart.
        let passed = MeasuredReads {
            prompt: ReadTotals {
                bytes: 6e9,
                seconds: 2.0,
                ..Default::default()
            },
            cold_prompt: ReadTotals {
                bytes: 3e9,
                seconds: 2.0,
                ..Default::default()
            },
            ..decoded
        };
        let p = rates().with_measured_reads(Some(&passed));
        assert_eq!((p.disk_gbps, p.disk_pass_gbps), (2.5, 3.0));
        assert_eq!(
            (p.disk_sequential_gbps, p.disk_sequential_from_runs),
            (1.5, true)
        );
        assert!(p.disk_pass_from_runs);
        assert_eq!(rates().with_measured_reads(None), rates());
        // The decode's reads then take the measured time.
        let t = TokenTraffic {
            nvme_bytes: 1e9,
            misses: 10.0,
            ..Default::default()
        };
        let p = predict(&t, &r, Overlap::OnDemand);
        assert!(
            (p.nvme_seconds - (0.4 + 10.0 * 0.25e-3)).abs() < 1e-12,
            "{p:?}"
        );
    }

    #[test]
    fn terms_are_bytes_over_rates() {
        let t = TokenTraffic {
            gpu_bytes: 1e9,
            ram_bytes: 5e9,
            n_layer: 0,
            ..Default::default()
        };
        let p = predict(&t, &rates(), Overlap::None);
        assert!((p.gpu_seconds - 1e-3).abs() < 1e-12);
        assert!((p.ram_seconds - 0.1).abs() < 1e-12);
        assert_eq!(p.bottleneck, Bottleneck::Ram);
        let expected = 1e-3 + 0.1 + TOKEN_OVERHEAD_SECONDS;
        assert!((p.seconds_per_token - expected).abs() < 1e-12);
    }

    #[test]
    fn a_layers_misses_pay_one_fixed_cost_together() {
        // 120 experts read a token over 40 streamed layers: 40 batches.
        let experts = TokenTraffic {
            nvme_bytes: 1e9,
            misses: 120.0,
            streamed_layers: 40,
            ..Default::default()
        };
        let p = predict(&experts, &rates(), Overlap::None);
        assert!((p.nvme_seconds - (1.0 + 40.0 * MISS_SECONDS)).abs() < 1e-12);
        // Fewer misses than layers: one batch each.
        let few = TokenTraffic {
            misses: 10.0,
            ..experts
        };
        let p = predict(&few, &rates(), Overlap::None);
        assert!((p.nvme_seconds - (1.0 + 10.0 * MISS_SECONDS)).abs() < 1e-12);
        // Dense streaming's units are layers.
        let dense = TokenTraffic {
            streamed_layers: 0,
            ..experts
        };
        let p = predict(&dense, &rates(), Overlap::None);
        assert!((p.nvme_seconds - (1.0 + 120.0 * MISS_SECONDS)).abs() < 1e-12);
    }

    #[test]
    fn io_overlaps_compute_in_part() {
        let t = TokenTraffic {
            ram_bytes: 5e9,
            nvme_bytes: 2e9,
            ..Default::default()
        };
        let compute = 0.1 + TOKEN_OVERHEAD_SECONDS;
        let dense = predict(&t, &rates(), Overlap::ReadAhead);
        assert_eq!(dense.bottleneck, Bottleneck::Nvme);
        assert!((dense.seconds_per_token - (2.0 + DENSE_NON_OVERLAP * compute)).abs() < 1e-9);
        let experts = predict(&t, &rates(), Overlap::OnDemand);
        assert!((experts.seconds_per_token - (2.0 + EXPERT_NON_OVERLAP * compute)).abs() < 1e-9);
    }

    #[test]
    fn disk_rate_is_the_median_of_large_reads() {
        use crate::profile::DiskReadPoint;
        let point = |block_bytes, queue_depth, gbps| DiskReadPoint {
            block_bytes,
            queue_depth,
            gbps,
        };
        let disk = DiskProfile {
            path: "/models".into(),
            o_direct: true,
            reads: vec![
                point(64 << 10, 1, 9.0), // small blocks: ignored
                point(1 << 20, 1, 1.1),
                point(4 << 20, 4, 2.5), // a burst
                point(16 << 20, 1, 1.3),
                point(16 << 20, 32, 3.0), // deeper than the streamer goes
            ],
        };
        assert_eq!(disk_gbps(&disk), 1.3);
    }

    #[test]
    fn bytes_without_a_device_take_forever() {
        let t = TokenTraffic {
            gpu_bytes: 1.0,
            ..Default::default()
        };
        let no_gpu = Rates {
            gpu_gbps: 0.0,
            ..rates()
        };
        assert_eq!(predict(&t, &no_gpu, Overlap::None).tokens_per_second, 0.0);
    }

    fn mixtral_prompt() -> PromptTraffic {
        PromptTraffic {
            touched_bytes_per_token: 7.3e9,
            host_weight_bytes: 18_000_000_000,
            stream_bytes: 18_000_000_000,
            stream_cache_bytes: 12_000_000_000,
            stream_layers: 30,
            moe: true,
            unit_choice_share: 0.25,
            decode_work_seconds: 0.1,
        }
    }

    #[test]
    fn a_short_pass_reads_the_experts_its_tokens_chose_and_computes_as_a_decode() {
        let r = rates();
        let t = mixtral_prompt();
        let lacking = pass_read_bytes(&t) as f64 / 1e9;
        // One token: a quarter of the lacking experts, and a decoded
        // token's work, not a batch's matrix rate or its copies.
        let one = predict_prompt(&t, &r, 1, 512, false);
        assert!((one.read_seconds - 0.25 * lacking).abs() < 1e-9, "{one:?}");
        assert_eq!(one.copy_seconds, 0.0);
        assert!((one.compute_seconds - 0.1).abs() < 1e-9, "{one:?}");
        // Its experts are read on demand, as a decode's: the work waits.
        assert!(
            (one.seconds - (one.read_seconds + 0.1)).abs() < 1e-9,
            "{one:?}"
        );
        // Two tokens: 1 − 0.75² of them; ten: each token's work.
        let two = predict_prompt(&t, &r, 2, 512, false);
        assert!((two.read_seconds - 0.4375 * lacking).abs() < 1e-9);
        let ten = predict_prompt(&t, &r, 10, 512, false);
        assert!((ten.compute_seconds - 1.0).abs() < 1e-9);
        // A dense layer is read whole by any pass.
        let dense = PromptTraffic {
            unit_choice_share: 1.0,
            ..t
        };
        let one = predict_prompt(&dense, &r, 1, 512, false);
        assert!((one.read_seconds - lacking).abs() < 1e-9);
        // Qwen3-30B-A3B's 8 of 128: a pass of 32 uses 87% of them.
        assert!((pass_unit_share(8.0 / 128.0, 32) - 0.873).abs() < 1e-3);
    }

    #[test]
    fn a_pass_reads_more_than_the_cache_lacks_by_its_window() {
        let t = mixtral_prompt();
        // 6 GB lacking; the window holds 2 of 30 layers: 6 / (1 − 2/30).
        assert_eq!(pass_read_bytes(&t), 6_428_571_428);
        // The fewer the streamed layers, the larger the window's share.
        let eight = PromptTraffic {
            stream_layers: 8,
            ..t
        };
        assert_eq!(pass_read_bytes(&eight), 8_000_000_000);
        // Never more than every streamed byte.
        let small_cache = PromptTraffic {
            stream_cache_bytes: 1_000_000_000,
            stream_layers: 4,
            ..t
        };
        assert_eq!(pass_read_bytes(&small_cache), 18_000_000_000);
    }

    #[test]
    fn a_streamed_prompt_pass_reads_what_the_cache_lacks_once_and_copies_host_weights_once() {
        let r = rates();
        let t = mixtral_prompt();
        let one = predict_prompt(&t, &r, 512, 512, false);
        assert_eq!(one.passes, 1);
        // 6.43 GB read (what the cache lacks and its window) at 1 GB/s;
        // 18 GB copied at 6 GB/s.
        let read = pass_read_bytes(&t) as f64 / 1e9;
        assert!((one.read_seconds - read).abs() < 1e-9);
        assert!((one.copy_seconds - 3.0).abs() < 1e-9);
        let work = one.copy_seconds + one.compute_seconds;
        let expected = read + PROMPT_NON_OVERLAP * work;
        assert!((one.seconds - expected).abs() < 1e-9, "{one:?}");
        // Four passes of 512 cost four reads and four copies; one pass of
        // 2,048 costs one of each and four times the compute.
        let four = predict_prompt(&t, &r, 2048, 512, false);
        assert_eq!(four.passes, 4);
        assert!((four.read_seconds - 4.0 * read).abs() < 1e-9);
        let whole = predict_prompt(&t, &r, 2048, 2048, false);
        assert!((whole.read_seconds - read).abs() < 1e-9);
        assert!((whole.compute_seconds - 4.0 * one.compute_seconds).abs() < 1e-9);
        assert!(whole.seconds < four.seconds / 2.0);
        // A cold cache lacks every streamed byte in its first pass only,
        // read at the cold passes' (sequential) rate.
        let cold = predict_prompt(&t, &r, 1024, 512, true);
        assert!((cold.read_seconds - (18.0 / 2.0 + read)).abs() < 1e-9);
        // Warm passes read at their own rate where measured.
        let measured = Rates {
            disk_pass_gbps: 4.0,
            ..r
        };
        let warm = predict_prompt(&t, &measured, 512, 512, false);
        assert!((warm.read_seconds - read / 4.0).abs() < 1e-9);
        let cold = predict_prompt(&t, &measured, 1024, 512, true);
        assert!((cold.read_seconds - (18.0 / 2.0 + read / 4.0)).abs() < 1e-9);
    }

    #[test]
    fn without_a_gpu_a_prompt_copies_nothing_and_computes_on_the_cpu() {
        let no_gpu = Rates {
            gpu_gbps: 0.0,
            pcie_gbps: 0.0,
            pageable_gbps: 0.0,
            ..rates()
        };
        let dense = PromptTraffic {
            touched_bytes_per_token: 1e8,
            host_weight_bytes: 1e8 as u64,
            stream_bytes: 0,
            stream_cache_bytes: 0,
            stream_layers: 0,
            moe: false,
            unit_choice_share: 1.0,
            decode_work_seconds: 0.0,
        };
        let p = predict_prompt(&dense, &no_gpu, 100, 512, false);
        assert_eq!((p.copy_seconds, p.read_seconds), (0.0, 0.0));
        // A profile without the CPU's prompt rate: derived from its matvec.
        let flops = CPU_PROMPT_FLOP_PER_MATVEC_BYTE * 50.0e9;
        let expected = 100.0 * 2.0 * PARAMS_PER_BYTE * 1e8 / flops;
        assert!((p.seconds - expected).abs() < 1e-12, "{p:?}");
        // With it measured, the measure decides, whatever the matvec says.
        let measured = Rates {
            cpu_prompt_gflops: 400.0,
            cpu_gbps: 5.0,
            ..no_gpu
        };
        let p = predict_prompt(&dense, &measured, 100, 512, false);
        let expected = 100.0 * 2.0 * PARAMS_PER_BYTE * 1e8 / 400e9;
        assert!((p.seconds - expected).abs() < 1e-12, "{p:?}");
        let moe = PromptTraffic { moe: true, ..dense };
        let p = predict_prompt(&moe, &measured, 100, 512, false);
        assert!((p.seconds - expected / CPU_MOE_PROMPT_EFFICIENCY).abs() < 1e-12);
        // A prompt shorter than a GPU batch copies no weights either.
        let short = predict_prompt(&dense, &rates(), 8, 512, false);
        assert_eq!(short.copy_seconds, 0.0);
    }
}
