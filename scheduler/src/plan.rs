//! The placement planner: which tier every tensor lives on, the mode that
//! follows, the stream cache size, and the decode speed to expect.
//!
//! Inputs: the tensors (name, role, layer, bytes), a few model facts (layers,
//! experts, KV bytes per token), the budgets, the context size and the
//! [`HardwareProfile`]. The KV cache counts against the budget of the tier
//! that holds its layer's attention.
//!
//! Value per byte decides who gets the faster tier: tensors are ordered
//! norms/routers, attention (with its KV cache) and the output head, dense FFN,
//! then experts (whose value per byte is `n_expert_used / n_expert`), each
//! class from the last layer down (see [`layer_key`]); the GPU takes a prefix
//! of that order, RAM the rest.
//! Token embeddings stay in RAM (llama.cpp keeps `token_embd` on the CPU).
//! In a streaming mode the streamed role (experts, or dense FFN) is STREAM
//! as a whole and what RAM has left is its cache: the engine's streamer keeps
//! the most useful units there, so "the first N layers resident" and "N
//! layers cached" cost the same.
//!
//! Every feasible (mode, GPU prefix) is priced with [`cost::predict`] and the
//! fastest wins; so more budget never predicts a slower plan (a larger budget
//! only adds candidates and enlarges caches).
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::cost::{self, Bottleneck, Overlap, Prediction, Rates, TokenTraffic};
pub use crate::gpu::GpuShare;
use crate::popularity::ExpertPopularity;
use crate::profile::HardwareProfile;
use crate::reads::MeasuredReads;
use crate::roles::{classify, layer_index, TensorRole};
use crate::size::format_bytes;

/// Where a tensor's bytes live while the model serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    Gpu,
    Ram,
    /// Left in the file; read on demand into the STREAM region.
    Stream,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Gpu => "gpu",
            Tier::Ram => "ram",
            Tier::Stream => "stream",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a model's weights are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Every tensor resident; no I/O after load.
    FullResident,
    /// MoE: expert tensors streamed per selected expert through a RAM cache.
    ExpertStreaming,
    /// Dense: FFN weights streamed layer by layer through a pool of slots.
    DenseFfnStreaming,
}

impl Mode {
    pub const ALL: [Mode; 3] = [
        Mode::FullResident,
        Mode::ExpertStreaming,
        Mode::DenseFfnStreaming,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::FullResident => "full-resident",
            Mode::ExpertStreaming => "expert-streaming",
            Mode::DenseFfnStreaming => "dense-ffn-streaming",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "full-resident" => Ok(Mode::FullResident),
            "expert-streaming" => Ok(Mode::ExpertStreaming),
            "dense-ffn-streaming" => Ok(Mode::DenseFfnStreaming),
            other => Err(format!(
                "unknown mode '{other}': use full-resident, expert-streaming or dense-ffn-streaming"
            )),
        }
    }
}

/// Where `mode` puts a tensor before any GPU share: STREAM for the streamed
/// role ([`is_streamed`]), RAM for everything else.
pub fn mode_tier(mode: Mode, name: &str) -> Tier {
    if is_streamed(mode, name) {
        Tier::Stream
    } else {
        Tier::Ram
    }
}

/// Whether `mode` streams tensor `name`: stacked expert tensors
/// (`blk.N.ffn_{gate,up,down,gate_up}_exps.weight`) in expert-streaming,
/// dense FFN matrices (`blk.N.ffn_{gate,up,down}.weight`) in dense-FFN streaming.
/// The engine's `tensor_buft_overrides` patterns match exactly these names.
pub fn is_streamed(mode: Mode, name: &str) -> bool {
    let Some(rest) = name.strip_prefix("blk.") else {
        return false;
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return false;
    }
    let Some(tensor) = rest[digits..]
        .strip_prefix('.')
        .and_then(|r| r.strip_suffix(".weight"))
    else {
        return false;
    };
    let role = classify(name);
    match mode {
        Mode::FullResident => false,
        Mode::ExpertStreaming => {
            role == TensorRole::Experts
                && matches!(
                    tensor,
                    "ffn_gate_exps" | "ffn_up_exps" | "ffn_down_exps" | "ffn_gate_up_exps"
                )
        }
        Mode::DenseFfnStreaming => {
            role == TensorRole::Ffn && matches!(tensor, "ffn_gate" | "ffn_up" | "ffn_down")
        }
    }
}

/// One tensor as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanTensor {
    pub name: String,
    pub role: TensorRole,
    pub layer: Option<u32>,
    pub bytes: u64,
}

impl PlanTensor {
    /// Role and layer judged from the name.
    pub fn new(name: impl Into<String>, bytes: u64) -> PlanTensor {
        let name = name.into();
        PlanTensor {
            role: classify(&name),
            layer: layer_index(&name),
            name,
            bytes,
        }
    }
}

/// The layers of `tiers` (tensor name → tier) with a tensor left in the
/// file (streamed), ascending.
pub fn stream_layers(tiers: &BTreeMap<String, Tier>) -> BTreeSet<u32> {
    tiers
        .iter()
        .filter(|(_, &tier)| tier == Tier::Stream)
        .filter_map(|(name, _)| crate::roles::layer_index(name))
        .collect()
}

/// What the planner needs to know about a model beyond its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelFacts {
    pub n_layer: u32,
    /// 0 for a dense model.
    pub n_expert: u32,
    pub n_expert_used: u32,
    /// Width of the hidden state (what crosses between GPU and CPU).
    pub n_embd: u32,
    pub n_vocab: u32,
    /// KV cache bytes per token of context over all layers.
    pub kv_bytes_per_token: u64,
}

impl ModelFacts {
    /// KV bytes per token of context with f16 K and V: `n_layer × n_head_kv ×
    /// (key_length + value_length) × 2`.
    pub fn f16_kv_bytes_per_token(
        n_layer: u32,
        n_head_kv: u32,
        key_length: u32,
        value_length: u32,
    ) -> u64 {
        u64::from(n_layer) * u64::from(n_head_kv) * u64::from(key_length + value_length) * 2
    }

    /// KV cache bytes for a context of `n_ctx` tokens.
    pub fn kv_bytes(&self, n_ctx: u32) -> u64 {
        self.kv_bytes_per_token * u64::from(n_ctx)
    }
}

/// Most bytes each tier may hold; `None` takes the profile's free capacity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budgets {
    pub gpu_bytes: Option<u64>,
    pub ram_bytes: Option<u64>,
}

/// GPU memory kept back for the CUDA context and compute buffers.
pub const GPU_RESERVE_BYTES: u64 = 1 << 30;
/// Share of the available RAM the default RAM budget takes (the rest is left
/// to the system and the compute buffers).
pub const DEFAULT_RAM_SHARE: f64 = 0.9;

/// llama.cpp's default micro-batch (`n_ubatch`): tokens per pass of the graph.
pub const DEFAULT_UBATCH_TOKENS: u32 = 512;
/// Most tokens of one prompt pass when experts stream.
pub const MAX_STREAMED_UBATCH_TOKENS: u32 = 4096;

/// Tokens per pass of the graph over a prompt (llama.cpp's `n_ubatch`) for a
/// context of `n_batch` tokens under `mode`. Expert streaming reads every
/// expert the cache lacks once per pass (a prompt chunk routes to nearly
/// all of them), so a pass costs a read of the streamed experts the cache
/// does not hold, while a larger pass costs only compute buffers: the pass
/// takes the whole batch, up to [`MAX_STREAMED_UBATCH_TOKENS`], halved
/// until `fits` (the caller's measure of the plan with that micro-batch's
/// buffers charged) says it fits. Other modes read nothing per pass:
/// llama.cpp's default.
pub fn prompt_ubatch_tokens(mode: Mode, n_batch: u32, mut fits: impl FnMut(u32) -> bool) -> u32 {
    let default = n_batch.clamp(1, DEFAULT_UBATCH_TOKENS);
    if mode != Mode::ExpertStreaming {
        return default;
    }
    let mut tokens = n_batch.min(MAX_STREAMED_UBATCH_TOKENS);
    while tokens > default && !fits(tokens) {
        tokens = (tokens / 2).max(default);
    }
    tokens.max(default)
}

/// The prompt pass (`n_ubatch`) of `candidates` that reads the fewest
/// streamed bytes over a prompt of `prompt_tokens`: each pass of the graph
/// reads the streamed weights its cache lacks once, so a candidate
/// `(pass tokens, the stream cache its placement leaves)` reads
/// `ceil(prompt / pass) × (stream − cache)`. The first candidate is the
/// default pass; a larger pass takes larger compute buffers, which the
/// cache pays for, and a smaller cache slows every decoded token too: a
/// larger pass is a candidate only while it keeps [`PASS_CACHE_SHARE`] of
/// the default pass's cache. Ties go to the smaller pass (smaller buffers,
/// shorter steps for the sequences decoding beside a prompt). `None`
/// without candidates.
pub fn least_read_pass(
    prompt_tokens: u32,
    stream_bytes: u64,
    candidates: &[(u32, u64)],
) -> Option<u32> {
    let reads = |&(pass, cache): &(u32, u64)| {
        let passes = u64::from(prompt_tokens.max(1).div_ceil(pass.max(1)));
        passes * stream_bytes.saturating_sub(cache)
    };
    let &(_, default_cache) = candidates.first()?;
    candidates
        .iter()
        .filter(|&&(_, cache)| cache as f64 >= PASS_CACHE_SHARE * default_cache as f64)
        .min_by_key(|c| (reads(c), c.0))
        .map(|&(pass, _)| pass)
}

/// The share of the default prompt pass's stream cache a larger pass must
/// keep ([`least_read_pass`]): on a model far bigger than its budget (the
/// case larger passes are for) its buffers cost a few percent of the cache.
pub const PASS_CACHE_SHARE: f64 = 0.9;

impl Budgets {
    /// The budgets in force on `profile`: as given, capped by its capacity
    /// (GPU: total less [`GPU_RESERVE_BYTES`]; RAM: total); absent ones take
    /// what is free there.
    pub fn effective(&self, profile: &HardwareProfile) -> (u64, u64) {
        let gpu_capacity = profile.gpu_total_bytes().saturating_sub(GPU_RESERVE_BYTES);
        let gpu_free: u64 = profile.gpus.iter().map(|g| g.free_bytes).sum();
        let gpu = self
            .gpu_bytes
            .unwrap_or(gpu_free.saturating_sub(GPU_RESERVE_BYTES))
            .min(gpu_capacity);
        let ram_default = (profile.ram.available_bytes as f64 * DEFAULT_RAM_SHARE) as u64;
        let ram = self
            .ram_bytes
            .unwrap_or(ram_default)
            .min(profile.ram.total_bytes);
        (gpu, ram)
    }
}

/// What the caller of [`plan`] sets: the budgets, the contexts, and what it
/// fixes instead of leaving it to the planner. A fixed quantity is the
/// caller's to fit: the planner prices it but checks only what it chooses
/// (the server's budget policy, for one, charges each residency itself).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PlanSettings {
    pub budgets: Budgets,
    /// Context per sequence in tokens (the KV cache of every sequence counts
    /// against the budgets).
    pub context_tokens: u32,
    /// Sequences decoded together (0 counts as 1).
    pub sequences: u32,
    /// Plan only this mode (`None`: the fastest that fits).
    pub mode: Option<Mode>,
    /// The GPU's share by rule (`None`: the planner prices every GPU prefix
    /// of its value-per-byte order within the GPU budget).
    pub gpu: Option<GpuShare>,
    /// The stream cache (`None`: what the RAM budget leaves).
    pub stream_cache_bytes: Option<u64>,
    /// Host RAM the load holds beside weights, KV cache and stream cache:
    /// llama.cpp's compute and output buffers in host memory, the model's
    /// metadata (vocabulary, tensor descriptions). Charged against the RAM
    /// budget, so the stream cache is what is left after it (measured by
    /// the engine: `llama_tiered::tiered::host::plan_charged`).
    #[serde(default)]
    pub ram_other_bytes: u64,
}

impl PlanSettings {
    /// Tokens of KV cache over all sequences.
    pub fn kv_tokens(&self) -> u32 {
        self.context_tokens.saturating_mul(self.sequences.max(1))
    }
}

/// Everything the planner takes: the model (its tensors and facts), the
/// machine, and the caller's settings.
#[derive(Debug, Clone, Copy)]
pub struct PlanRequest<'a> {
    pub tensors: &'a [PlanTensor],
    pub facts: ModelFacts,
    pub profile: &'a HardwareProfile,
    pub settings: PlanSettings,
    /// The model's measured expert popularity, once it has run (an MoE's
    /// decode is then priced by its own routing); `None`: never run, or dense.
    pub popularity: Option<&'a ExpertPopularity>,
    /// How fast the model's streamer read its file on this machine, once it
    /// has streamed (its disk rates then replace the profile's); `None`:
    /// never streamed here.
    pub reads: Option<&'a MeasuredReads>,
}

/// Bytes of weights per tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierBytes {
    pub gpu: u64,
    pub ram: u64,
    pub stream: u64,
}

impl TierBytes {
    pub fn total(&self) -> u64 {
        self.gpu + self.ram + self.stream
    }
}

/// The planner's answer.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub mode: Mode,
    pub tiers: BTreeMap<String, Tier>,
    pub tier_bytes: TierBytes,
    pub gpu_budget_bytes: u64,
    pub ram_budget_bytes: u64,
    /// Context per sequence, and sequences.
    pub context_tokens: u32,
    pub sequences: u32,
    /// llama.cpp's `n_gpu_layers` for these tiers ([`crate::gpu::gpu_layers`]).
    pub gpu_layers: u32,
    /// KV cache bytes, and the part held in GPU memory.
    pub kv_cache_bytes: u64,
    pub kv_cache_gpu_bytes: u64,
    /// RAM for streamed weights (the expert cache, or the dense FFN pool).
    pub stream_cache_bytes: u64,
    /// [`PlanSettings::ram_other_bytes`]: charged in RAM beside the above.
    pub ram_other_bytes: u64,
    /// Units the cache holds: expert slices (expert-streaming) or layers (dense).
    pub pool_slots: u64,
    /// Layers read ahead (dense), or 1 (experts: the next layer's likely experts).
    pub prefetch_depth_layers: u32,
    /// Expected share of streamed-unit lookups already cached.
    pub expected_hit_rate: f64,
    /// Bytes read from the file per decoded token.
    pub nvme_bytes_per_token: f64,
    pub rates: Rates,
    pub prediction: Prediction,
    /// Weight bytes a prompt token computes with, over every tier (the
    /// prompt model's compute): all a decoded token touches but the output
    /// layer, which a pass computes only for the rows it returns (one a
    /// sequence), not for every token (40% of an 8-layer Qwen3 cut's
    /// bytes, 4% of the 32-layer Mixtral's).
    pub prompt_bytes_per_token: f64,
    /// A mixture-of-experts model.
    pub moe: bool,
    /// Share of a streamed layer's units one token uses
    /// ([`cost::PromptTraffic::unit_choice_share`]).
    pub unit_choice_share: f64,
}

impl Plan {
    pub fn predicted_tokens_per_second(&self) -> f64 {
        self.prediction.tokens_per_second
    }

    /// The prompt model's prediction ([`cost::predict_prompt`]) for a prompt
    /// of `tokens` in passes of `n_ubatch`; `cold`: the stream cache starts
    /// empty.
    pub fn predict_prompt(&self, tokens: u32, n_ubatch: u32, cold: bool) -> cost::PromptPrediction {
        let traffic = cost::PromptTraffic {
            touched_bytes_per_token: self.prompt_bytes_per_token,
            host_weight_bytes: self.tier_bytes.ram + self.tier_bytes.stream,
            stream_bytes: self.tier_bytes.stream,
            stream_cache_bytes: self.stream_cache_bytes,
            stream_layers: stream_layers(&self.tiers).len() as u32,
            moe: self.moe,
            unit_choice_share: self.unit_choice_share,
            decode_work_seconds: self.prediction.work_seconds(),
        };
        cost::predict_prompt(&traffic, &self.rates, tokens, n_ubatch, cold)
    }

    pub fn bottleneck(&self) -> Bottleneck {
        self.prediction.bottleneck
    }

    /// Host RAM this plan charges against the RAM budget: weights in RAM,
    /// the KV cache not on the GPU, the stream cache and
    /// [`Plan::ram_other_bytes`]. A process holding it peaks at most this
    /// plus the fixed host overhead (`HardwareProfile::host_overhead`).
    pub fn ram_charged_bytes(&self) -> u64 {
        self.tier_bytes.ram
            + (self.kv_cache_bytes - self.kv_cache_gpu_bytes)
            + self.stream_cache_bytes
            + self.ram_other_bytes
    }

    /// What fixes this plan's GPU tensors again ([`GpuShare::Prefix`]): its
    /// GPU weights and the KV cache there. For a plan whose GPU share the
    /// planner chose (every such share is a prefix of its order).
    pub fn gpu_prefix_bytes(&self) -> u64 {
        self.tier_bytes.gpu + self.kv_cache_gpu_bytes
    }
}

/// The headline of a plan (everything but the per-tensor tiers and the
/// cost model's terms): what `hypura serve` logs for each placement it
/// loads, and what `hypura inspect --plan --json` prints for the same inputs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PlanSummary {
    pub mode: Mode,
    pub tier_bytes: TierBytes,
    pub gpu_layers: u32,
    pub stream_cache_bytes: u64,
    pub prefetch_depth_layers: u32,
    pub kv_cache_bytes: u64,
    pub kv_cache_gpu_bytes: u64,
    pub context_tokens: u32,
    pub sequences: u32,
    pub gpu_budget_bytes: u64,
    pub ram_budget_bytes: u64,
    pub predicted_tokens_per_second: f64,
    pub bottleneck: Bottleneck,
}

impl Plan {
    pub fn summary(&self) -> PlanSummary {
        PlanSummary {
            mode: self.mode,
            tier_bytes: self.tier_bytes,
            gpu_layers: self.gpu_layers,
            stream_cache_bytes: self.stream_cache_bytes,
            prefetch_depth_layers: self.prefetch_depth_layers,
            kv_cache_bytes: self.kv_cache_bytes,
            kv_cache_gpu_bytes: self.kv_cache_gpu_bytes,
            context_tokens: self.context_tokens,
            sequences: self.sequences,
            gpu_budget_bytes: self.gpu_budget_bytes,
            ram_budget_bytes: self.ram_budget_bytes,
            predicted_tokens_per_second: self.prediction.tokens_per_second,
            bottleneck: self.prediction.bottleneck,
        }
    }
}

impl fmt::Display for PlanSummary {
    /// One line: `dense-ffn-streaming: GPU 0 B, RAM 40.1 MiB, STREAM 52.0 MiB,
    /// 0 GPU layers, cache 3.5 MiB, prefetch 1 layers, 31.2 tok/s predicted`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.tier_bytes;
        write!(
            f,
            "{}: GPU {}, RAM {}, STREAM {}, {} GPU layers, cache {}, prefetch {} layers, {:.2} tok/s predicted",
            self.mode,
            format_bytes(b.gpu),
            format_bytes(b.ram),
            format_bytes(b.stream),
            self.gpu_layers,
            format_bytes(self.stream_cache_bytes),
            self.prefetch_depth_layers,
            self.predicted_tokens_per_second
        )
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("the model cannot run within the budget: {detail}")]
    DoesNotFit {
        /// Fewest bytes of GPU + RAM the model needs in its leanest mode.
        minimum_bytes: u64,
        budget_bytes: u64,
        detail: String,
    },
    #[error("{0}")]
    ModeNotApplicable(String),
    #[error("the model has no tensors")]
    Empty,
}

/// Tensors placed together: one tensor, or a layer's attention with its KV cache.
struct Item {
    tensors: Vec<usize>,
    weight_bytes: u64,
    kv_bytes: u64,
    /// Weight bytes read per decoded token.
    touched: f64,
    layer: Option<u32>,
    /// Part of a layer's FFN (dense or experts): decides where the layer's second half runs.
    ffn: bool,
    /// A layer's streamed experts (expert-streaming): off the GPU they are
    /// STREAM, not RAM.
    streams: bool,
}

impl Item {
    fn bytes(&self) -> u64 {
        self.weight_bytes + self.kv_bytes
    }
}

/// Order of the faster tiers: lower first.
fn class(role: TensorRole) -> u8 {
    match role {
        TensorRole::Norm | TensorRole::Router | TensorRole::Other => 0,
        TensorRole::Attention | TensorRole::Output | TensorRole::SharedExperts => 1,
        TensorRole::Ffn => 2,
        TensorRole::Experts => 3,
        TensorRole::Embedding => 4,
    }
}

fn touched_per_token(t: &PlanTensor, facts: &ModelFacts) -> f64 {
    match t.role {
        TensorRole::Experts if facts.n_expert > 0 => {
            t.bytes as f64 * f64::from(facts.n_expert_used) / f64::from(facts.n_expert)
        }
        // One row per token.
        TensorRole::Embedding => t.bytes as f64 / f64::from(facts.n_vocab.max(1)),
        _ => t.bytes as f64,
    }
}

/// Sort key of a layer within a class: global tensors first, then layers
/// from the last. llama.cpp offloads the *last* `n_gpu_layers` layers and
/// their KV cache, so a GPU prefix in this order is such a suffix and the KV
/// cache lands where the planner counted it. (Without co-activation
/// statistics no layer's experts are known to be hotter than another's.)
fn layer_key(layer: Option<u32>) -> u32 {
    layer.map_or(0, |l| u32::MAX - l)
}

/// Candidates for the faster tiers in value-per-byte order (embeddings
/// excluded), and the embeddings' indices. A layer's expert stacks form one
/// item (the GPU takes whole layers' experts, as llama.cpp's `--n-cpu-moe`
/// does); in expert-streaming that item streams when it is not on the GPU.
/// Dense-FFN streaming's streamed tensors are no candidates.
fn resident_items(req: &PlanRequest, mode: Mode, kv_per_layer: u64) -> (Vec<Item>, Vec<usize>) {
    let mut grouped: BTreeMap<(u8, u32), Item> = BTreeMap::new();
    let mut singles: Vec<(u8, u32, usize)> = Vec::new();
    let mut embeddings = Vec::new();
    for (i, t) in req.tensors.iter().enumerate() {
        let streams = is_streamed(mode, &t.name);
        if streams && mode != Mode::ExpertStreaming {
            continue;
        }
        match (t.role, t.layer) {
            (TensorRole::Embedding, _) => embeddings.push(i),
            (role @ (TensorRole::Attention | TensorRole::Experts), Some(layer)) => {
                let experts = role == TensorRole::Experts;
                let item = grouped.entry((class(role), layer)).or_insert_with(|| Item {
                    tensors: Vec::new(),
                    weight_bytes: 0,
                    kv_bytes: if experts { 0 } else { kv_per_layer },
                    touched: 0.0,
                    layer: Some(layer),
                    ffn: experts,
                    streams,
                });
                item.tensors.push(i);
                item.weight_bytes += t.bytes;
                item.touched += touched_per_token(t, &req.facts);
            }
            (role, layer) => singles.push((class(role), layer_key(layer), i)),
        }
    }
    let mut keyed: Vec<((u8, u32, usize), Item)> = grouped
        .into_iter()
        .map(|((c, _), item)| ((c, layer_key(item.layer), item.tensors[0]), item))
        .collect();
    for (c, layer_key, i) in singles {
        let t = &req.tensors[i];
        keyed.push((
            (c, layer_key, i),
            Item {
                tensors: vec![i],
                weight_bytes: t.bytes,
                kv_bytes: 0,
                touched: touched_per_token(t, &req.facts),
                layer: t.layer,
                ffn: matches!(t.role, TensorRole::Ffn | TensorRole::Experts),
                streams: false,
            },
        ));
    }
    keyed.sort_by_key(|(k, _)| *k);
    (
        keyed.into_iter().map(|(_, item)| item).collect(),
        embeddings,
    )
}

/// The streamed part of a mode: bytes, per-layer bytes, unit size.
struct Streamed {
    bytes: u64,
    /// Streamed bytes per layer.
    per_layer: BTreeMap<u32, u64>,
    /// Most bytes one layer streams (all its experts, or its FFN): the smallest cache.
    layer_bytes: u64,
    layers: u32,
    /// Bytes of one unit (an expert of a layer, or a layer's FFN).
    unit_bytes: u64,
    /// Share of a layer's units one token uses: the used experts' share, 1
    /// for a layer's FFN.
    unit_share: f64,
    /// Bytes touched per token (experts: the used share).
    touched: f64,
}

/// The streamed part of `mode` but the layers in `gpu_layers` (whose experts
/// are on the GPU).
fn streamed(req: &PlanRequest, mode: Mode, gpu_layers: &BTreeSet<u32>) -> Streamed {
    let mut per_layer: BTreeMap<u32, u64> = BTreeMap::new();
    for t in req
        .tensors
        .iter()
        .filter(|t| is_streamed(mode, &t.name) && !t.layer.is_some_and(|l| gpu_layers.contains(&l)))
    {
        *per_layer.entry(t.layer.unwrap_or(0)).or_insert(0) += t.bytes;
    }
    let bytes: u64 = per_layer.values().sum();
    let layer_bytes = per_layer.values().copied().max().unwrap_or(0);
    let layers = per_layer.len() as u32;
    let (unit_bytes, unit_share) = if mode == Mode::ExpertStreaming && req.facts.n_expert > 0 {
        (
            layer_bytes / u64::from(req.facts.n_expert),
            f64::from(req.facts.n_expert_used) / f64::from(req.facts.n_expert),
        )
    } else {
        (layer_bytes, 1.0)
    };
    Streamed {
        bytes,
        per_layer,
        layer_bytes,
        layers,
        unit_bytes,
        unit_share,
        touched: bytes as f64 * unit_share,
    }
}

/// The streamed traffic of a cache of `cache_bytes`: (hit rate, bytes read
/// per token, slots, units read per token). Experts: a token's experts are
/// the token before's in a share `r` of its choices (resident: just used),
/// and the rest hit the cache with the chance `g` that a choice falls on a
/// cached expert: `hit = r + (1 − r) g`.
/// - The model's popularity unknown (never run): `g` is the cached share
///   `f` and `r` is [`DECODE_EXPERT_REUSE`], which stands for popularity and
///   overlap together.
/// - Known ([`ExpertPopularity`]): `g = f + `[`POPULARITY_CONVERGENCE`]` ×
///   (top − f)`, where `top` is the share of choices the popular `f` of the
///   experts take, and `r` is [`KNOWN_POPULARITY_REUSE`]. The cache holds
///   the popular experts only in part: a decode that follows a prompt has
///   not converged to them (the whole `top` promised the H200's Qwen3
///   decodes +64% to +108%).
///
/// Dense: layers are used in a cycle and the streamer evicts the layer
/// needed last, so `S` slots give `S − 1` hits per token.
fn stream_traffic(
    s: &Streamed,
    mode: Mode,
    cache_bytes: u64,
    popularity: Option<&ExpertPopularity>,
) -> (f64, f64, u64, f64) {
    if s.bytes == 0 {
        return (1.0, 0.0, 0, 0.0);
    }
    let slots = cache_bytes / s.unit_bytes.max(1);
    match mode {
        Mode::ExpertStreaming => {
            let share = (cache_bytes as f64 / s.bytes as f64).min(1.0);
            let (reuse, cached) = match popularity {
                Some(p) => (
                    KNOWN_POPULARITY_REUSE,
                    share + POPULARITY_CONVERGENCE * (p.top_share(share) - share),
                ),
                None => (DECODE_EXPERT_REUSE, share),
            };
            let hit = reuse + (1.0 - reuse) * cached;
            let read = s.touched * (1.0 - hit);
            (hit, read, slots, read / s.unit_bytes.max(1) as f64)
        }
        _ => {
            let layers = u64::from(s.layers);
            let misses = if slots >= layers {
                0
            } else {
                layers - slots.saturating_sub(1)
            };
            let hit = 1.0 - misses as f64 / layers as f64;
            (hit, (misses * s.unit_bytes) as f64, slots, misses as f64)
        }
    }
}

/// Share of a decoded token's experts found resident because the token
/// before chose them too (per layer): real routers keep some of a token's
/// experts for the next (Jiang et al. 2024, "Mixtral of Experts" §5:
/// consecutive tokens repeat their experts well above chance; Liang et al.
/// 2025, arXiv:2505.16056: Qwen3-MoE-like models the most locally
/// consistent), which uniform routing (the cached share) ignores.
/// Refitted on the H200 in session 27, after the streamer began evicting
/// by chance of use (which keeps more of the token before's experts) and
/// recycling evicted pages: 16 tokens decoded after pp512, pp2048 and a
/// 1-token prompt read 954–985 MB a token on the Mixtral shape (`mixtral`
/// routing; 0.2 predicted 1,114) and 108–142 MB on the Qwen3-30B-A3B shape
/// (`qwen3` routing; 0.2 predicted 231–249, its shorter non-read time,
/// 0.045 s modelled against 0.075–0.104 measured, offsetting part). 0.35
/// puts the six decodes within −16% to +19% (0.2: −11% to −29%; Qwen3's
/// two decodes of one plan measured 3.68 and 5.22 tok/s, so no constant
/// fits closer than ±17%). `hypura bench --routing` measures a model's own
/// overlap.
pub const DECODE_EXPERT_REUSE: f64 = 0.35;

/// With the model's popularity known, the share of a decoded token's
/// experts found resident as the token before's ([`stream_traffic`]), and
/// how far the cache has gone from holding a uniform `f` of the experts
/// toward holding the popular `f`. Fitted on the bytes a token read in
/// session 29's H100 run (which matched session 27's on the H200: the bytes
/// are the routing's and the cache's, not the machine's): the Qwen3-30B-A3B
/// shape at a cached share of 0.642 read 126–142 MB a token (hit 0.83–0.84;
/// the popular 0.642 of its experts take 0.922 of the choices in its
/// measured counts), the Mixtral shape at 0.694 read 948–991 MB (hit 0.79;
/// top 0.781). Checked on dev at a share of 0.44, not fitted there: a
/// 24-layer Qwen3 cut read 134.8 MB a token (101–152 over four decodes),
/// predicted 144.6 (186.8 with [`DECODE_EXPERT_REUSE`] alone), and an
/// 8-layer Mixtral cut 650.4 MB, predicted 645.0 (572.1).
pub const KNOWN_POPULARITY_REUSE: f64 = 0.17;
pub const POPULARITY_CONVERGENCE: f64 = 0.58;

/// GPU↔CPU hand-overs per token when `on_gpu[i]` items are on the GPU:
/// the token walks embedding (CPU) → each layer's attention → its FFN → output.
/// Streamed tensors run on the CPU.
fn crossings(items: &[Item], on_gpu: &[bool], s: &Streamed, req: &PlanRequest) -> u32 {
    if !on_gpu.contains(&true) {
        return 0;
    }
    let n = req.facts.n_layer as usize;
    // Per layer: (attention bytes on GPU, total), (FFN bytes on GPU, total).
    let mut attn = vec![(0u64, 0u64); n];
    let mut ffn = vec![(0u64, 0u64); n];
    for (&l, &bytes) in &s.per_layer {
        if let Some(slot) = ffn.get_mut(l as usize) {
            slot.1 += bytes;
        }
    }
    let mut output_on_gpu = false;
    for (i, item) in items.iter().enumerate() {
        let gpu = on_gpu[i];
        if item.streams && !gpu {
            continue; // in `s`
        }
        match item.layer.map(|l| l as usize) {
            Some(l) if l < n => {
                let slot = if item.ffn { &mut ffn[l] } else { &mut attn[l] };
                slot.1 += item.weight_bytes;
                if gpu {
                    slot.0 += item.weight_bytes;
                }
            }
            _ => {
                let t = &req.tensors[item.tensors[0]];
                if t.role == TensorRole::Output {
                    output_on_gpu = gpu;
                }
            }
        }
    }
    let mut count = 0;
    let mut here_gpu = false;
    let mut visit = |gpu: bool| {
        if gpu != here_gpu {
            count += 1;
            here_gpu = gpu;
        }
    };
    for l in 0..n {
        for (on, total) in [attn[l], ffn[l]] {
            if total > 0 {
                visit(2 * on > total);
            }
        }
    }
    visit(output_on_gpu);
    visit(false); // sampling reads the logits on the CPU
    count
}

/// Plans a model. See the module documentation.
pub fn plan(req: &PlanRequest) -> Result<Plan, PlanError> {
    if req.tensors.is_empty() {
        return Err(PlanError::Empty);
    }
    let (gpu_budget, ram_budget) = req.settings.budgets.effective(req.profile);
    let modes: Vec<Mode> = match req.settings.mode {
        Some(mode) => {
            check_applicable(req, mode)?;
            vec![mode]
        }
        None => Mode::ALL
            .into_iter()
            .filter(|&m| check_applicable(req, m).is_ok())
            .collect(),
    };
    let mut best: Option<Plan> = None;
    for &mode in &modes {
        if let Some(candidate) = best_of_mode(req, mode, gpu_budget, ram_budget) {
            // Clearly faster only: equal plans keep the simpler mode (listed first).
            let faster = best.as_ref().is_none_or(|b| {
                candidate.prediction.seconds_per_token
                    < b.prediction.seconds_per_token * (1.0 - 1e-9)
            });
            if faster {
                best = Some(candidate);
            }
        }
    }
    best.ok_or_else(|| does_not_fit(req, &modes, gpu_budget, ram_budget))
}

fn check_applicable(req: &PlanRequest, mode: Mode) -> Result<(), PlanError> {
    if mode == Mode::FullResident || req.tensors.iter().any(|t| is_streamed(mode, &t.name)) {
        return Ok(());
    }
    Err(PlanError::ModeNotApplicable(match mode {
        Mode::ExpertStreaming => {
            "expert-streaming needs a mixture-of-experts model; this one has no expert tensors"
                .into()
        }
        _ => format!("{mode} found no dense FFN tensors in this model"),
    }))
}

/// One way to hold a mode's resident items: which are on the GPU, and the
/// stream cache beside them, priced.
struct Candidate {
    on_gpu: Vec<bool>,
    cache: u64,
    prediction: Prediction,
    touched: f64,
    hit: f64,
    nvme: f64,
    slots: u64,
}

/// The items a fixed GPU share puts on the GPU: a prefix of `items`, or
/// what [`crate::gpu::assign`] moves (a layer's non-FFN tensors together,
/// so an item never splits).
fn fixed_gpu_items(req: &PlanRequest, mode: Mode, items: &[Item], share: GpuShare) -> Vec<bool> {
    if let GpuShare::Prefix(bytes) = share {
        let mut used = 0u64;
        return items
            .iter()
            .map(|item| {
                used = used.saturating_add(item.bytes());
                used <= bytes
            })
            .collect();
    }
    let mut tiers: BTreeMap<String, Tier> = req
        .tensors
        .iter()
        .map(|t| (t.name.clone(), mode_tier(mode, &t.name)))
        .collect();
    crate::gpu::assign(req.tensors, req.facts.n_layer, &mut tiers, share);
    items
        .iter()
        .map(|item| {
            item.tensors
                .iter()
                .all(|&t| tiers.get(&req.tensors[t].name) == Some(&Tier::Gpu))
        })
        .collect()
}

/// The fastest feasible candidate of `mode` (every GPU prefix, or the fixed
/// share), or `None` if nothing fits.
fn best_of_mode(req: &PlanRequest, mode: Mode, gpu_budget: u64, ram_budget: u64) -> Option<Plan> {
    let settings = &req.settings;
    let n_layer = req.facts.n_layer.max(1);
    let kv_total = req.facts.kv_bytes(settings.kv_tokens());
    let kv_per_layer = kv_total / u64::from(n_layer);
    let (items, embeddings) = resident_items(req, mode, kv_per_layer);
    let all_streamed = streamed(req, mode, &BTreeSet::new());
    let embedding_bytes: u64 = embeddings.iter().map(|&i| req.tensors[i].bytes).sum();
    let embedding_touched: f64 = embeddings
        .iter()
        .map(|&i| touched_per_token(&req.tensors[i], &req.facts))
        .sum();
    let output_touched: f64 = req
        .tensors
        .iter()
        .filter(|t| t.role == TensorRole::Output)
        .map(|t| touched_per_token(t, &req.facts))
        .sum();
    // KV of layers without attention tensors (unusual) stays in RAM.
    let kv_unplaced =
        kv_total - kv_per_layer * items.iter().filter(|i| i.kv_bytes > 0).count() as u64;
    let rates = Rates::from_profile(req.profile).with_measured_reads(req.reads);
    let overlap = match mode {
        Mode::FullResident => Overlap::None,
        Mode::ExpertStreaming => Overlap::OnDemand,
        Mode::DenseFfnStreaming => Overlap::ReadAhead,
    };

    // `None`: over the GPU budget (later prefixes are too); `Some(None)`:
    // RAM too short for this one.
    let evaluate = |on_gpu: Vec<bool>, check_gpu: bool| -> Option<Option<Candidate>> {
        let (mut gpu_bytes, mut gpu_touched) = (0u64, 0f64);
        let (mut ram_bytes, mut ram_touched) = (0u64, 0f64);
        let mut gpu_layers = BTreeSet::new();
        // Layers whose streamed experts are on the GPU instead.
        let mut gpu_expert_layers = BTreeSet::new();
        for (item, &gpu) in items.iter().zip(&on_gpu) {
            if gpu {
                gpu_bytes += item.bytes();
                gpu_touched += item.touched;
                gpu_layers.extend(item.layer);
                if item.streams {
                    gpu_expert_layers.extend(item.layer);
                }
            } else if !item.streams {
                ram_bytes += item.bytes();
                ram_touched += item.touched;
            }
        }
        if check_gpu && gpu_bytes > gpu_budget {
            return None;
        }
        let s = streamed(req, mode, &gpu_expert_layers);
        if mode != Mode::FullResident && s.bytes == 0 {
            return Some(None); // nothing left to stream: full-resident's plan
        }
        let ram_resident = ram_bytes + embedding_bytes + kv_unplaced + settings.ram_other_bytes;
        let cache = match settings.stream_cache_bytes {
            _ if mode == Mode::FullResident => 0,
            Some(fixed) => fixed,
            None => match ram_budget.checked_sub(ram_resident) {
                Some(cache) if cache >= s.layer_bytes => cache.min(s.bytes),
                _ => return Some(None),
            },
        };
        if mode == Mode::FullResident
            && settings.stream_cache_bytes.is_none()
            && ram_resident > ram_budget
        {
            return Some(None);
        }
        let (hit, nvme, slots, misses) =
            stream_traffic(&s, mode, cache.min(s.bytes), req.popularity);
        let traffic = TokenTraffic {
            gpu_bytes: gpu_touched,
            ram_bytes: ram_touched + embedding_touched + s.touched,
            nvme_bytes: nvme,
            misses,
            crossings: crossings(&items, &on_gpu, &s, req),
            crossing_bytes: u64::from(req.facts.n_embd) * 4,
            n_layer: req.facts.n_layer,
            gpu_layers: gpu_layers.len() as u32,
            streamed_layers: if mode == Mode::ExpertStreaming {
                s.layers
            } else {
                0
            },
        };
        let prediction = cost::predict(&traffic, &rates, overlap);
        Some(Some(Candidate {
            on_gpu,
            cache,
            prediction,
            touched: traffic.gpu_bytes + traffic.ram_bytes,
            hit,
            nvme,
            slots,
        }))
    };

    let best = match settings.gpu {
        Some(share) => evaluate(fixed_gpu_items(req, mode, &items, share), false).flatten(),
        None => {
            let mut best: Option<Candidate> = None;
            for k in 0..=items.len() {
                let on_gpu = (0..items.len()).map(|i| i < k).collect();
                let Some(candidate) = evaluate(on_gpu, true) else {
                    break;
                };
                // Ties go to more GPU (later k): it leaves RAM for the system.
                if let Some(c) = candidate {
                    let faster = best.as_ref().is_none_or(|b| {
                        c.prediction.seconds_per_token <= b.prediction.seconds_per_token
                    });
                    if faster {
                        best = Some(c);
                    }
                }
            }
            best
        }
    }?;

    let mut tiers = BTreeMap::new();
    let mut tier_bytes = TierBytes::default();
    for (item, &gpu) in items.iter().zip(&best.on_gpu) {
        let tier = match (gpu, item.streams) {
            (true, _) => Tier::Gpu,
            (false, true) => Tier::Stream,
            (false, false) => Tier::Ram,
        };
        for &t in &item.tensors {
            tiers.insert(req.tensors[t].name.clone(), tier);
        }
        *tier_slot(&mut tier_bytes, tier) += item.weight_bytes;
    }
    for &i in &embeddings {
        tiers.insert(req.tensors[i].name.clone(), Tier::Ram);
        tier_bytes.ram += req.tensors[i].bytes;
    }
    // Dense-FFN streaming's streamed tensors (no candidates for the GPU).
    for t in req.tensors {
        if !tiers.contains_key(&t.name) {
            tiers.insert(t.name.clone(), Tier::Stream);
            tier_bytes.stream += t.bytes;
        }
    }
    let kv_cache_gpu_bytes = items
        .iter()
        .zip(&best.on_gpu)
        .filter(|(_, &g)| g)
        .map(|(i, _)| i.kv_bytes)
        .sum();
    let gpu_layers = crate::gpu::gpu_layers(
        req.tensors.iter().map(|t| t.name.as_str()),
        &tiers,
        req.facts.n_layer,
    );
    Some(Plan {
        mode,
        tiers,
        tier_bytes,
        gpu_budget_bytes: gpu_budget,
        ram_budget_bytes: ram_budget,
        context_tokens: settings.context_tokens,
        sequences: settings.sequences.max(1),
        gpu_layers,
        kv_cache_bytes: kv_total,
        kv_cache_gpu_bytes,
        stream_cache_bytes: best.cache,
        ram_other_bytes: settings.ram_other_bytes,
        pool_slots: best.slots,
        prefetch_depth_layers: prefetch_depth(
            mode,
            &all_streamed,
            best.slots,
            &best.prediction,
            &rates,
        ),
        expected_hit_rate: best.hit,
        nvme_bytes_per_token: best.nvme,
        rates,
        prediction: best.prediction,
        prompt_bytes_per_token: (best.touched - output_touched).max(0.0),
        moe: req.facts.n_expert > 0,
        unit_choice_share: all_streamed.unit_share,
    })
}

fn tier_slot(bytes: &mut TierBytes, tier: Tier) -> &mut u64 {
    match tier {
        Tier::Gpu => &mut bytes.gpu,
        Tier::Ram => &mut bytes.ram,
        Tier::Stream => &mut bytes.stream,
    }
}

/// Dense: enough layers ahead that reading one layer's FFN overlaps the
/// compute of the layers before it, within the free slots. Experts: 1.
fn prefetch_depth(mode: Mode, s: &Streamed, slots: u64, p: &Prediction, rates: &Rates) -> u32 {
    match mode {
        Mode::FullResident => 0,
        Mode::ExpertStreaming => 1,
        Mode::DenseFfnStreaming => {
            let compute_per_layer =
                (p.gpu_seconds + p.ram_seconds + p.overhead_seconds) / f64::from(s.layers.max(1));
            let read_per_layer = s.unit_bytes as f64 / (rates.disk_gbps.max(1e-9) * 1e9);
            let k = (read_per_layer / compute_per_layer.max(1e-9)).ceil() as u64;
            let most = slots
                .saturating_sub(1)
                .max(1)
                .min(u64::from(s.layers.max(2) - 1));
            k.clamp(1, most) as u32
        }
    }
}

/// The error for a model that fits no mode: the leanest mode's minimum.
fn does_not_fit(req: &PlanRequest, modes: &[Mode], gpu_budget: u64, ram_budget: u64) -> PlanError {
    let kv = req.facts.kv_bytes(req.settings.kv_tokens());
    let budget = gpu_budget + ram_budget;
    let leanest = modes
        .iter()
        .map(|&mode| {
            let s = streamed(req, mode, &BTreeSet::new());
            let total: u64 = req.tensors.iter().map(|t| t.bytes).sum();
            let resident = total - s.bytes;
            (
                resident + kv + s.layer_bytes + req.settings.ram_other_bytes,
                mode,
                resident,
                s.layer_bytes,
            )
        })
        .min_by_key(|m| m.0);
    let Some((minimum, mode, resident, cache)) = leanest else {
        return PlanError::Empty;
    };
    let mut detail = format!(
        "{mode} needs at least {} of GPU + RAM ({} of resident weights + {} of KV cache for {} tokens",
        format_bytes(minimum),
        format_bytes(resident),
        format_bytes(kv),
        req.settings.kv_tokens()
    );
    if cache > 0 {
        detail.push_str(&format!(
            " + {} of stream cache for one layer",
            format_bytes(cache)
        ));
    }
    if req.settings.ram_other_bytes > 0 {
        detail.push_str(&format!(
            " + {} of compute buffers and model metadata",
            format_bytes(req.settings.ram_other_bytes)
        ));
    }
    detail.push_str(&format!(
        "), but the budgets allow {} (GPU {} + RAM {})",
        format_bytes(budget),
        format_bytes(gpu_budget),
        format_bytes(ram_budget)
    ));
    if minimum <= budget {
        detail.push_str(
            "; RAM is too small for what must stay on the CPU (token embeddings, the stream cache)",
        );
    }
    detail.push_str("; raise --ram-budget or --gpu-budget, or lower --context");
    PlanError::DoesNotFit {
        minimum_bytes: minimum,
        budget_bytes: budget,
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{CpuProfile, DiskProfile, DiskReadPoint, GpuProfile, RamProfile};

    const GIB: u64 = 1 << 30;

    fn profile(gpu_bytes: Option<u64>) -> HardwareProfile {
        HardwareProfile {
            version: crate::profile::PROFILE_VERSION,
            measured_at: "2025-01-01T00:00:00Z".into(),
            host: "fixture".into(),
            cpu: CpuProfile {
                model: "fixture".into(),
                threads: 16,
                q4k_matvec_gbps: 61.0,
                q4k_prompt_gflops: 0.0,
            },
            ram: RamProfile {
                total_bytes: 125 * GIB,
                available_bytes: 120 * GIB,
                read_gbps: 100.0,
            },
            gpus: gpu_bytes
                .map(|b| GpuProfile {
                    name: "CUDA0".into(),
                    description: "fixture".into(),
                    total_bytes: b,
                    free_bytes: b,
                    q4k_matvec_gbps: 1240.0,
                    host_to_device_pinned_gbps: 55.0,
                    host_to_device_pageable_gbps: 15.0,
                })
                .into_iter()
                .collect(),
            disk: DiskProfile {
                path: "/models".into(),
                o_direct: true,
                reads: vec![DiskReadPoint {
                    block_bytes: 16 << 20,
                    queue_depth: 4,
                    gbps: 1.25,
                }],
            },
            host_overhead: None,
        }
    }

    /// Tensors in the shape of a Q4_K model (4.5 bits per weight).
    fn model(n_layer: u32, n_embd: u64, n_ff: u64, n_kv: u64, experts: u32) -> Vec<PlanTensor> {
        let q4k = |n: u64| n * 9 / 16;
        let mut t = vec![
            PlanTensor::new("token_embd.weight", q4k(n_embd * 32_000)),
            PlanTensor::new("output_norm.weight", n_embd * 4),
            PlanTensor::new("output.weight", q4k(n_embd * 32_000)),
        ];
        for l in 0..n_layer {
            let n = |s: &str| format!("blk.{l}.{s}.weight");
            t.push(PlanTensor::new(n("attn_norm"), n_embd * 4));
            t.push(PlanTensor::new(n("attn_q"), q4k(n_embd * n_embd)));
            t.push(PlanTensor::new(n("attn_k"), q4k(n_embd * n_kv)));
            t.push(PlanTensor::new(n("attn_v"), q4k(n_embd * n_kv)));
            t.push(PlanTensor::new(n("attn_output"), q4k(n_embd * n_embd)));
            t.push(PlanTensor::new(n("ffn_norm"), n_embd * 4));
            if experts == 0 {
                for m in ["ffn_gate", "ffn_up", "ffn_down"] {
                    t.push(PlanTensor::new(n(m), q4k(n_embd * n_ff)));
                }
            } else {
                let e = u64::from(experts);
                t.push(PlanTensor::new(n("ffn_gate_inp"), n_embd * e * 4));
                for m in ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"] {
                    t.push(PlanTensor::new(n(m), q4k(n_embd * n_ff * e)));
                }
            }
        }
        t
    }

    fn facts(n_layer: u32, experts: u32) -> ModelFacts {
        ModelFacts {
            n_layer,
            n_expert: experts,
            n_expert_used: if experts > 0 { 2 } else { 0 },
            n_embd: 4096,
            n_vocab: 32_000,
            kv_bytes_per_token: ModelFacts::f16_kv_bytes_per_token(n_layer, 8, 128, 128),
        }
    }

    fn request<'a>(
        tensors: &'a [PlanTensor],
        facts: ModelFacts,
        profile: &'a HardwareProfile,
        gpu: u64,
        ram: u64,
    ) -> PlanRequest<'a> {
        PlanRequest {
            tensors,
            facts,
            profile,
            settings: PlanSettings {
                budgets: Budgets {
                    gpu_bytes: Some(gpu),
                    ram_bytes: Some(ram),
                },
                context_tokens: 4096,
                ..Default::default()
            },
            popularity: None,
            reads: None,
        }
    }

    /// 10 streamed layers of 10 experts of 10 bytes; a token uses 2 a layer.
    fn ten_layers_of_experts() -> Streamed {
        Streamed {
            bytes: 1000,
            per_layer: BTreeMap::new(),
            layer_bytes: 100,
            layers: 10,
            unit_bytes: 10,
            unit_share: 0.2,
            touched: 200.0,
        }
    }

    #[test]
    fn a_decode_hits_the_token_befores_experts_and_the_cached_share_of_the_rest() {
        let s = ten_layers_of_experts();
        let (hit, read, slots, misses) = stream_traffic(&s, Mode::ExpertStreaming, 400, None);
        let want = DECODE_EXPERT_REUSE + (1.0 - DECODE_EXPERT_REUSE) * 0.4;
        assert!((hit - want).abs() < 1e-12);
        assert!((read - 200.0 * (1.0 - want)).abs() < 1e-9);
        assert_eq!(slots, 40);
        assert!((misses - read / 10.0).abs() < 1e-12);
        // A cache holding every expert misses nothing.
        assert_eq!(stream_traffic(&s, Mode::ExpertStreaming, 1000, None).0, 1.0);
    }

    #[test]
    fn a_known_popular_router_hits_more_and_a_uniform_one_as_its_reuse_says() {
        let s = ten_layers_of_experts();
        // Uniform, measured: the cached share, with the smaller reuse.
        let uniform = ExpertPopularity::from_selections(&vec![vec![100; 10]; 4]).unwrap();
        let (hit, ..) = stream_traffic(&s, Mode::ExpertStreaming, 400, Some(&uniform));
        let want = KNOWN_POPULARITY_REUSE + (1.0 - KNOWN_POPULARITY_REUSE) * 0.4;
        assert!((hit - want).abs() < 1e-12);
        // Skewed: the top 4 of 10 experts take 0.8 of the choices; the cache
        // is priced part of the way from 0.4 toward 0.8.
        let skewed =
            ExpertPopularity::from_selections(&[vec![300, 200, 200, 100, 50, 50, 50, 25, 25, 0]])
                .unwrap();
        assert!((skewed.top_share(0.4) - 0.8).abs() < 1e-12);
        let (hit, read, ..) = stream_traffic(&s, Mode::ExpertStreaming, 400, Some(&skewed));
        let cached = 0.4 + POPULARITY_CONVERGENCE * 0.4;
        let want = KNOWN_POPULARITY_REUSE + (1.0 - KNOWN_POPULARITY_REUSE) * cached;
        assert!((hit - want).abs() < 1e-12);
        assert!((read - 200.0 * (1.0 - want)).abs() < 1e-9);
        let (unknown, ..) = stream_traffic(&s, Mode::ExpertStreaming, 400, None);
        assert!(hit > unknown, "{hit} against {unknown}");
    }

    #[test]
    fn a_prompt_computes_every_layer_per_token_but_the_output_for_one_row() {
        let p = profile(None);
        let plan_of =
            |tensors: &[PlanTensor]| plan(&request(tensors, facts(4, 0), &p, 0, 64 * GIB)).unwrap();
        let tensors = model(4, 4096, 14336, 1024, 0);
        let base = plan_of(&tensors);
        // The same model with an output layer four times bigger.
        let mut wide = tensors.clone();
        let output = wide.iter_mut().find(|t| t.name == "output.weight").unwrap();
        let output_bytes = output.bytes;
        output.bytes *= 4;
        let wide = plan_of(&wide);
        // A decoded token reads the whole output layer: slower.
        assert!(
            wide.predicted_tokens_per_second() < base.predicted_tokens_per_second(),
            "{} against {}",
            wide.predicted_tokens_per_second(),
            base.predicted_tokens_per_second()
        );
        // A prompt token computes none of it.
        assert_eq!(wide.prompt_bytes_per_token, base.prompt_bytes_per_token);
        let layers: u64 = tensors
            .iter()
            .filter(|t| t.name.starts_with("blk.") || t.name == "output_norm.weight")
            .map(|t| t.bytes)
            .sum();
        let embedding_row = (4096 * 32_000 * 9 / 16) as f64 / 32_000.0;
        let want = layers as f64 + embedding_row;
        assert!(
            (base.prompt_bytes_per_token - want).abs() < 1.0,
            "{} against {want} (output {output_bytes})",
            base.prompt_bytes_per_token
        );
        let pp = |plan: &Plan| plan.predict_prompt(512, 512, false).seconds;
        assert_eq!(pp(&wide), pp(&base));
    }

    #[test]
    fn kv_bytes_follow_the_formula() {
        // Mixtral: 32 layers × 8 KV heads × (128 + 128) × 2 bytes = 128 KiB per token.
        let f = facts(32, 8);
        assert_eq!(f.kv_bytes_per_token, 32 * 8 * 256 * 2);
        assert_eq!(f.kv_bytes(4096), 512 << 20);
    }

    #[test]
    fn value_per_byte_order_fills_the_gpu() {
        let tensors = model(4, 4096, 14336, 1024, 8);
        let p = profile(Some(80 * GIB));
        let attention_and_small: u64 = tensors
            .iter()
            .filter(|t| !matches!(t.role, TensorRole::Experts | TensorRole::Embedding))
            .map(|t| t.bytes)
            .sum();
        let kv = facts(4, 8).kv_bytes(4096);
        // Room for the attention, norms, routers, output and KV, plus the
        // last layer's experts and half of another's: experts go by whole layers.
        let layer_experts: u64 = tensors
            .iter()
            .filter(|t| t.role == TensorRole::Experts && t.layer == Some(3))
            .map(|t| t.bytes)
            .sum();
        let gpu = attention_and_small + kv + layer_experts + layer_experts / 2;
        let plan = plan(&request(&tensors, facts(4, 8), &p, gpu, 64 * GIB)).unwrap();
        assert_eq!(plan.mode, Mode::FullResident);
        for t in &tensors {
            let expected = match (t.role, t.layer) {
                (TensorRole::Embedding, _) => Tier::Ram,
                (TensorRole::Experts, Some(3)) => Tier::Gpu,
                (TensorRole::Experts, _) => Tier::Ram,
                _ => Tier::Gpu,
            };
            assert_eq!(plan.tiers[&t.name], expected, "{}", t.name);
        }
        assert_eq!(plan.kv_cache_gpu_bytes, kv);
    }

    #[test]
    fn dense_ffn_goes_to_the_gpu_before_experts() {
        let mut tensors = model(2, 1024, 4096, 256, 4);
        // Layer 1 has a dense FFN instead of experts (as some MoE models' first layers do).
        tensors.retain(|t| !t.name.starts_with("blk.1.ffn_"));
        for m in ["ffn_gate", "ffn_up", "ffn_down"] {
            tensors.push(PlanTensor::new(
                format!("blk.1.{m}.weight"),
                1024 * 4096 * 9 / 16,
            ));
        }
        let p = profile(Some(80 * GIB));
        let resident: u64 = tensors
            .iter()
            .filter(|t| !matches!(t.role, TensorRole::Experts | TensorRole::Embedding))
            .map(|t| t.bytes)
            .sum();
        let f = ModelFacts {
            n_embd: 1024,
            ..facts(2, 4)
        };
        let gpu = resident + f.kv_bytes(4096);
        let mut req = request(&tensors, f, &p, gpu, 64 * GIB);
        req.settings.mode = Some(Mode::FullResident);
        let full = plan(&req).unwrap().prediction;
        req.settings.mode = Some(Mode::ExpertStreaming);
        // Streamed experts run on the CPU too: the same hand-overs, the same time.
        assert_eq!(
            plan(&req).unwrap().prediction.pcie_seconds,
            full.pcie_seconds
        );
        let plan = plan(&request(&tensors, f, &p, gpu, 64 * GIB)).unwrap();
        assert_eq!(plan.tiers["blk.1.ffn_down.weight"], Tier::Gpu);
        assert_eq!(plan.tiers["blk.0.ffn_gate_exps.weight"], Tier::Ram);
    }

    #[test]
    fn kv_cache_counts_against_the_budget() {
        let tensors = model(4, 4096, 14336, 1024, 0);
        let p = profile(None);
        let weights: u64 = tensors.iter().map(|t| t.bytes).sum();
        let f = facts(4, 0);
        let kv = f.kv_bytes(4096);
        let fits = plan(&request(&tensors, f, &p, 0, weights + kv)).unwrap();
        assert_eq!(fits.mode, Mode::FullResident);
        assert_eq!(fits.kv_cache_bytes, kv);
        // One byte less and the FFN must stream.
        let short = plan(&request(&tensors, f, &p, 0, weights + kv - 1)).unwrap();
        assert_eq!(short.mode, Mode::DenseFfnStreaming);
    }

    #[test]
    fn other_host_memory_comes_out_of_the_stream_cache() {
        let tensors = model(4, 4096, 14336, 1024, 8);
        let p = profile(None);
        let mut req = request(&tensors, facts(4, 8), &p, 0, 2 * GIB);
        req.settings.mode = Some(Mode::ExpertStreaming);
        let without = plan(&req).unwrap();
        assert_eq!(without.ram_charged_bytes(), 2 * GIB);
        req.settings.ram_other_bytes = 300 << 20;
        let with = plan(&req).unwrap();
        assert_eq!(
            with.stream_cache_bytes,
            without.stream_cache_bytes - (300 << 20)
        );
        assert_eq!(with.ram_other_bytes, 300 << 20);
        // Everything charged still adds up to the budget.
        assert_eq!(with.ram_charged_bytes(), 2 * GIB);
        // Too much of it for one layer's cache: no plan, and the error says why.
        req.settings.ram_other_bytes = 4 * GIB;
        let err = plan(&req).unwrap_err().to_string();
        assert!(err.contains("compute buffers and model metadata"), "{err}");
    }

    #[test]
    fn budgets_are_capped_by_the_profile() {
        let p = profile(Some(20 * GIB));
        let b = Budgets {
            gpu_bytes: Some(64 * GIB),
            ram_bytes: Some(1 << 50),
        };
        assert_eq!(b.effective(&p), (19 * GIB, 125 * GIB));
        let defaults = Budgets::default().effective(&p);
        assert_eq!(defaults.0, 19 * GIB);
        assert_eq!(defaults.1, (120.0 * GIB as f64 * DEFAULT_RAM_SHARE) as u64);
        assert_eq!(
            Budgets {
                gpu_bytes: Some(8 * GIB),
                ram_bytes: None
            }
            .effective(&profile(None))
            .0,
            0
        );
    }

    #[test]
    fn tier_bytes_sum_to_the_tensors() {
        let tensors = model(8, 4096, 14336, 1024, 8);
        let total: u64 = tensors.iter().map(|t| t.bytes).sum();
        let p = profile(Some(80 * GIB));
        for (gpu, ram) in [(0, 4 * GIB), (2 * GIB, 3 * GIB), (8 * GIB, 8 * GIB)] {
            let plan = plan(&request(&tensors, facts(8, 8), &p, gpu, ram)).unwrap();
            assert_eq!(plan.tier_bytes.total(), total);
            assert_eq!(plan.tiers.len(), tensors.len());
            assert!(plan.tier_bytes.gpu + plan.kv_cache_gpu_bytes <= plan.gpu_budget_bytes);
        }
    }

    #[test]
    fn more_budget_never_predicts_slower() {
        let p = profile(Some(141_000_000_000));
        for (tensors, f) in [
            (model(32, 4096, 14336, 1024, 8), facts(32, 8)),
            (model(16, 8192, 28672, 1024, 0), facts(16, 0)),
        ] {
            let mut last_by_ram: Vec<f64> = Vec::new();
            for g in 0..=8u64 {
                let mut last = 0.0f64;
                for r in 1..=10u64 {
                    let req = request(&tensors, f, &p, g * 2 * GIB, r * 2 * GIB);
                    let tps = plan(&req).map_or(0.0, |p| p.predicted_tokens_per_second());
                    assert!(tps >= last, "gpu {g}×2GiB ram {r}×2GiB: {tps} < {last}");
                    if let Some(&before) = last_by_ram.get(r as usize - 1) {
                        assert!(tps >= before, "gpu {g}×2GiB ram {r}×2GiB: {tps} < {before}");
                    }
                    if last_by_ram.len() < r as usize {
                        last_by_ram.push(tps);
                    } else {
                        last_by_ram[r as usize - 1] = tps;
                    }
                    last = tps;
                }
            }
        }
    }

    #[test]
    fn streaming_modes_follow_the_budget() {
        let moe = model(8, 4096, 14336, 1024, 8);
        let p = profile(None);
        let plan_moe = plan(&request(&moe, facts(8, 8), &p, 0, 4 * GIB)).unwrap();
        assert_eq!(plan_moe.mode, Mode::ExpertStreaming);
        assert_eq!(plan_moe.prediction.bottleneck, Bottleneck::Nvme);
        assert!(plan_moe.expected_hit_rate > 0.0 && plan_moe.expected_hit_rate < 1.0);
        let experts: u64 = moe
            .iter()
            .filter(|t| t.role == TensorRole::Experts)
            .map(|t| t.bytes)
            .sum();
        assert_eq!(plan_moe.tier_bytes.stream, experts);
        assert_eq!(
            plan_moe.stream_cache_bytes,
            4 * GIB - plan_moe.tier_bytes.ram - plan_moe.kv_cache_bytes
        );
    }

    /// The Mixtral shape under a GPU budget too small for every expert and a
    /// RAM budget too small for the rest: the last layers' experts on the
    /// GPU, the others streamed through what RAM holds.
    fn hybrid_case() -> (Vec<PlanTensor>, ModelFacts, HardwareProfile, u64) {
        let tensors = model(32, 4096, 14336, 1024, 8);
        let f = facts(32, 8);
        let non_expert: u64 = tensors
            .iter()
            .filter(|t| !matches!(t.role, TensorRole::Experts | TensorRole::Embedding))
            .map(|t| t.bytes)
            .sum();
        let layer_experts: u64 = tensors
            .iter()
            .filter(|t| t.role == TensorRole::Experts && t.layer == Some(0))
            .map(|t| t.bytes)
            .sum();
        // Room beside attention, norms, output and KV for 5.5 layers' experts.
        let gpu = non_expert + f.kv_bytes(4096) + layer_experts * 11 / 2;
        (tensors, f, profile(Some(141_000_000_000)), gpu)
    }

    #[test]
    fn expert_layers_the_gpu_holds_stay_there_and_the_rest_stream() {
        let (tensors, f, p, gpu) = hybrid_case();
        let plan = plan(&request(&tensors, f, &p, gpu, 12 * GIB)).unwrap();
        assert_eq!(plan.mode, Mode::ExpertStreaming);
        for t in &tensors {
            let expected = match (t.role, t.layer) {
                (TensorRole::Embedding, _) => Tier::Ram,
                // The last five layers' experts: 5.5 layers fit, experts go by whole layers.
                (TensorRole::Experts, Some(l)) if l >= 27 => Tier::Gpu,
                (TensorRole::Experts, _) => Tier::Stream,
                _ => Tier::Gpu,
            };
            assert_eq!(plan.tiers[&t.name], expected, "{}", t.name);
        }
        assert!(plan.tier_bytes.gpu + plan.kv_cache_gpu_bytes <= gpu);
        let stream: u64 = tensors
            .iter()
            .filter(|t| plan.tiers[&t.name] == Tier::Stream)
            .map(|t| t.bytes)
            .sum();
        assert_eq!(plan.tier_bytes.stream, stream);
        // The cache takes what RAM leaves, for the streamed layers only.
        assert_eq!(
            plan.stream_cache_bytes,
            12 * GIB - plan.tier_bytes.ram - (plan.kv_cache_bytes - plan.kv_cache_gpu_bytes)
        );
        assert_eq!(plan.gpu_layers, 33, "every layer and the output layer");

        // Faster than streaming every layer's experts beside the same attention.
        let mut all_streamed = request(&tensors, f, &p, gpu, 12 * GIB);
        all_streamed.settings.mode = Some(Mode::ExpertStreaming);
        all_streamed.settings.gpu = Some(GpuShare::Layers(99));
        let all_streamed = super::plan(&all_streamed).unwrap();
        assert_eq!(
            all_streamed.tier_bytes.stream,
            plan.tier_bytes.stream + plan.tier_bytes.gpu - all_streamed.tier_bytes.gpu
        );
        assert!(
            plan.predicted_tokens_per_second() > all_streamed.predicted_tokens_per_second(),
            "{} vs {}",
            plan.predicted_tokens_per_second(),
            all_streamed.predicted_tokens_per_second()
        );
    }

    #[test]
    fn full_resident_under_the_same_gpu_budget_puts_the_same_tensors_on_the_gpu() {
        // What the GPU exactness check compares: the hybrid plan against
        // full-resident with the same GPU tensors, experts in RAM.
        let (tensors, f, p, gpu) = hybrid_case();
        let hybrid = plan(&request(&tensors, f, &p, gpu, 12 * GIB)).unwrap();
        let mut req = request(&tensors, f, &p, gpu, 64 * GIB);
        req.settings.mode = Some(Mode::FullResident);
        let full = plan(&req).unwrap();
        for t in &tensors {
            let (h, r) = (hybrid.tiers[&t.name], full.tiers[&t.name]);
            assert_eq!(h == Tier::Gpu, r == Tier::Gpu, "{}", t.name);
        }
        assert_eq!(hybrid.gpu_layers, full.gpu_layers);
    }

    #[test]
    fn a_chosen_gpu_share_fixed_as_a_prefix_keeps_its_tensors_under_another_cache() {
        // The server's streaming placement: the share chosen at the smallest
        // cache, then the cache resized (Streaming ↔ Partial) without reload.
        let (tensors, f, p, gpu) = hybrid_case();
        let mut req = request(&tensors, f, &p, gpu, 12 * GIB);
        req.settings.mode = Some(Mode::ExpertStreaming);
        req.settings.stream_cache_bytes = Some(GIB);
        let chosen = plan(&req).unwrap();
        assert!(chosen.tier_bytes.gpu > 0);
        assert_eq!(
            chosen.gpu_prefix_bytes(),
            chosen.tier_bytes.gpu + chosen.kv_cache_gpu_bytes
        );
        for cache in [GIB, 5 * GIB, 40 * GIB] {
            req.settings.gpu = Some(GpuShare::Prefix(chosen.gpu_prefix_bytes()));
            req.settings.stream_cache_bytes = Some(cache);
            // Priced, not checked: a GPU budget of nothing changes nothing.
            req.settings.budgets.gpu_bytes = Some(0);
            let fixed = plan(&req).unwrap();
            assert_eq!(fixed.tiers, chosen.tiers, "cache {cache}");
            assert_eq!(fixed.tier_bytes, chosen.tier_bytes);
            assert_eq!(fixed.kv_cache_gpu_bytes, chosen.kv_cache_gpu_bytes);
            assert_eq!(fixed.gpu_layers, chosen.gpu_layers);
            assert_eq!(fixed.stream_cache_bytes, cache);
        }
        // One byte less drops the last item of the prefix: a layer's experts.
        req.settings.gpu = Some(GpuShare::Prefix(chosen.gpu_prefix_bytes() - 1));
        let less = plan(&req).unwrap();
        assert!(less.tier_bytes.gpu < chosen.tier_bytes.gpu);
        assert_eq!(
            less.tier_bytes.stream - chosen.tier_bytes.stream,
            chosen.tier_bytes.gpu - less.tier_bytes.gpu
        );
    }

    #[test]
    fn a_model_too_big_names_its_minimum() {
        let tensors = model(4, 4096, 14336, 1024, 0);
        let p = profile(None);
        let err = plan(&request(&tensors, facts(4, 0), &p, 0, 100 << 20)).unwrap_err();
        let PlanError::DoesNotFit {
            minimum_bytes,
            detail,
            ..
        } = &err
        else {
            panic!("{err}");
        };
        let non_ffn: u64 = tensors
            .iter()
            .filter(|t| t.role != TensorRole::Ffn)
            .map(|t| t.bytes)
            .sum();
        let one_layer_ffn = 3 * (4096 * 14336 * 9 / 16);
        assert_eq!(
            *minimum_bytes,
            non_ffn + facts(4, 0).kv_bytes(4096) + one_layer_ffn
        );
        assert!(
            detail.contains("dense-ffn-streaming needs at least"),
            "{detail}"
        );
        assert!(detail.contains(&format_bytes(*minimum_bytes)), "{detail}");
    }

    #[test]
    fn a_forced_mode_must_apply() {
        let tensors = model(2, 1024, 4096, 256, 0);
        let p = profile(None);
        let mut req = request(&tensors, facts(2, 0), &p, 0, 64 * GIB);
        req.settings.mode = Some(Mode::ExpertStreaming);
        assert!(matches!(plan(&req), Err(PlanError::ModeNotApplicable(_))));
        req.settings.mode = Some(Mode::DenseFfnStreaming);
        assert_eq!(plan(&req).unwrap().mode, Mode::DenseFfnStreaming);
    }

    #[test]
    fn sequences_multiply_the_kv_cache() {
        let tensors = model(2, 1024, 4096, 256, 0);
        let p = profile(None);
        let mut req = request(&tensors, facts(2, 0), &p, 0, 64 * GIB);
        let one = plan(&req).unwrap();
        req.settings.sequences = 4;
        let four = plan(&req).unwrap();
        assert_eq!(four.kv_cache_bytes, 4 * one.kv_cache_bytes);
        assert_eq!((four.context_tokens, four.sequences), (4096, 4));
    }

    #[test]
    fn a_fixed_placement_is_priced_not_checked() {
        // The server's residencies: mode, GPU share and cache all fixed, in
        // budgets they do not fit (its budget policy charges them itself).
        let tensors = model(4, 4096, 14336, 1024, 8);
        let p = profile(Some(80 * GIB));
        let mut req = request(&tensors, facts(4, 8), &p, 0, 1 << 20);
        req.settings.mode = Some(Mode::ExpertStreaming);
        req.settings.gpu = Some(GpuShare::None);
        req.settings.stream_cache_bytes = Some(12345);
        let streaming = plan(&req).unwrap();
        assert_eq!(streaming.stream_cache_bytes, 12345);
        assert_eq!(streaming.tier_bytes.gpu, 0);
        assert_eq!(streaming.gpu_layers, 0);
        assert!(streaming.predicted_tokens_per_second() > 0.0);

        req.settings.mode = Some(Mode::FullResident);
        req.settings.gpu = Some(GpuShare::Layers(99));
        req.settings.stream_cache_bytes = Some(0);
        let full = plan(&req).unwrap();
        assert_eq!(full.stream_cache_bytes, 0);
        assert_eq!(full.gpu_layers, 5, "every layer and the output");
        let embeddings: u64 = tensors
            .iter()
            .filter(|t| t.role == TensorRole::Embedding)
            .map(|t| t.bytes)
            .sum();
        assert_eq!(full.tier_bytes.ram, embeddings);
        assert_eq!(full.kv_cache_gpu_bytes, full.kv_cache_bytes);
        // The same share with the RAM left to the planner must fit.
        req.settings.stream_cache_bytes = None;
        assert!(matches!(plan(&req), Err(PlanError::DoesNotFit { .. })));
    }

    #[test]
    fn a_fixed_gpu_share_takes_the_tensors_of_its_rule() {
        let tensors = model(4, 1024, 4096, 256, 0);
        let p = profile(Some(80 * GIB));
        let mut req = request(&tensors, facts(4, 0), &p, 0, 64 * GIB);
        req.settings.gpu = Some(GpuShare::Layers(3));
        let placed = plan(&req).unwrap();
        assert_eq!(placed.mode, Mode::FullResident);
        let mut expected: BTreeMap<String, Tier> = tensors
            .iter()
            .map(|t| (t.name.clone(), Tier::Ram))
            .collect();
        crate::gpu::assign(&tensors, 4, &mut expected, GpuShare::Layers(3));
        assert_eq!(placed.tiers, expected);
        assert_eq!(placed.gpu_layers, 3);
        // Free, the same budgets give the planner's own GPU prefix instead.
        req.settings.gpu = None;
        let free = plan(&req).unwrap();
        assert_eq!(
            free.gpu_layers,
            crate::gpu::gpu_layers(tensors.iter().map(|t| t.name.as_str()), &free.tiers, 4)
        );
    }

    #[test]
    fn names_streamed_per_mode() {
        assert!(is_streamed(
            Mode::ExpertStreaming,
            "blk.3.ffn_up_exps.weight"
        ));
        assert!(!is_streamed(
            Mode::ExpertStreaming,
            "blk.3.ffn_gate_inp.weight"
        ));
        assert!(is_streamed(
            Mode::DenseFfnStreaming,
            "blk.0.ffn_down.weight"
        ));
        assert!(!is_streamed(
            Mode::DenseFfnStreaming,
            "blk.0.ffn_norm.weight"
        ));
        assert!(!is_streamed(Mode::FullResident, "blk.0.ffn_down.weight"));
    }

    #[test]
    fn a_streamed_moe_prompt_takes_one_pass_while_its_compute_buffers_fit() {
        // Buffers of 100 MiB a 512 tokens, 400 MiB of room: up to 2048 tokens.
        let fits = |tokens: u32| u64::from(tokens) * (100 << 20) / 512 <= 400 << 20;
        let streaming = |n_batch| prompt_ubatch_tokens(Mode::ExpertStreaming, n_batch, fits);
        assert_eq!(streaming(1260), 1260);
        assert_eq!(streaming(2048), 2048);
        assert_eq!(streaming(4096), 2048);
        assert_eq!(streaming(100_000), 2048);
        // Never below llama.cpp's default, nor above the batch.
        assert_eq!(
            prompt_ubatch_tokens(Mode::ExpertStreaming, 4096, |_| false),
            512
        );
        assert_eq!(
            prompt_ubatch_tokens(Mode::ExpertStreaming, 64, |_| false),
            64
        );
        // Modes that read nothing per pass keep the default, unasked.
        for mode in [Mode::FullResident, Mode::DenseFfnStreaming] {
            assert_eq!(prompt_ubatch_tokens(mode, 4096, |_| panic!("asked")), 512);
        }
    }

    #[test]
    fn the_prompt_pass_that_reads_least_wins_and_a_cache_that_holds_all_keeps_the_small_one() {
        let gib = 1u64 << 30;
        // Mixtral-like: 24 GiB streamed, a cache of 10 GiB at 512, 9 at 4096.
        let big = [(512, 10 * gib), (1024, 10 * gib - gib / 4), (4096, 9 * gib)];
        assert_eq!(least_read_pass(4096, 24 * gib, &big), Some(4096));
        // A pass whose buffers take half the cache: decode would pay.
        let costly = [(512, 200 << 20), (1024, 98 << 20)];
        assert_eq!(least_read_pass(4096, 430 << 20, &costly), Some(512));
        // A cache that holds every streamed weight at 512 reads nothing.
        let held = [(512, 300 << 20), (2048, 200 << 20)];
        assert_eq!(least_read_pass(4096, 243 << 20, &held), Some(512));
        // Short prompts: one pass whichever, the smaller pass reads less.
        assert_eq!(least_read_pass(300, 24 * gib, &big), Some(512));
        assert_eq!(least_read_pass(300, 24 * gib, &[]), None);
    }
}
