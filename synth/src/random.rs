//! Synthetic GGUF models for tests and benchmarks, written through llama.cpp's gguf API.
//!
//! Two kinds:
//! - [`write`]: random weights in the shapes of real models (Llama-8B/70B,
//!   Mixtral-8x7B, Qwen3-30B-A3B, or tiny ones), any size, written at disk
//!   speed. The weights are valid quantized blocks (finite scales) copied from
//!   a small pool quantized once per type, at block-aligned random offsets
//!   chosen by a seeded generator: the same spec gives the same bytes.
//! - [`derive_moe_from_dense`]: a real MoE built from a dense llama model by
//!   copying its FFN into E slightly perturbed experts behind a random router,
//!   so routing is real and text stays coherent.
//!
//! Files are streamed: tensor data never has to fit in memory.
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use llama_tiered::llama::gguf_write::{
    dequantize, quantize_rows, quantize_rows_into, GgmlType, GgufBuilder, GgufError, GgufReader,
    GgufStreamWriter, TensorInfo,
};
use llama_tiered::rng::Rng;

use crate::routing::{self, Routing, RoutingPlan, CONTROL_DIMS, Y_DIMS};

/// What went wrong while writing a synthetic or derived model.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("invalid synthetic model spec: {0}")]
    Spec(String),
    #[error("cannot derive a MoE from {path}: {reason}")]
    Source { path: PathBuf, reason: String },
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Model architecture of a synthetic model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Dense llama (`general.architecture = "llama"`).
    Llama,
    /// Mixtral: arch `llama` with `llama.expert_count`, as llama.cpp loads Mixtral.
    Mixtral { n_expert: u32, n_expert_used: u32 },
    /// Qwen3 MoE (`qwen3moe`): per-head Q/K norms, experts of `n_ff_expert`.
    Qwen3Moe {
        n_expert: u32,
        n_expert_used: u32,
        n_ff_expert: u32,
    },
}

impl Arch {
    /// The `general.architecture` value, also the prefix of the hparam keys.
    pub fn gguf_name(self) -> &'static str {
        match self {
            Arch::Llama | Arch::Mixtral { .. } => "llama",
            Arch::Qwen3Moe { .. } => "qwen3moe",
        }
    }

    /// `(n_expert, n_expert_used)`, `None` for dense models.
    pub fn experts(self) -> Option<(u32, u32)> {
        match self {
            Arch::Llama => None,
            Arch::Mixtral {
                n_expert,
                n_expert_used,
            }
            | Arch::Qwen3Moe {
                n_expert,
                n_expert_used,
                ..
            } => Some((n_expert, n_expert_used)),
        }
    }
}

/// Shapes and types of a synthetic model.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthSpec {
    pub name: String,
    pub arch: Arch,
    pub n_layer: u32,
    pub n_embd: u32,
    /// `feed_forward_length`: the dense FFN width, and the expert width of Mixtral.
    pub n_ff: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    /// Per-head dimension (also the RoPE dimension).
    pub head_dim: u32,
    pub n_vocab: u32,
    pub n_ctx_train: u32,
    pub rope_freq_base: f32,
    pub rms_norm_eps: f32,
    /// Type of the big matrices and `token_embd`; norms and routers are F32.
    pub weight_type: GgmlType,
    /// Type of `output` (Q6_K for K-quant models, as Q4_K_M files have).
    pub output_type: GgmlType,
    pub seed: u64,
    /// How a MoE's routers choose ([`Routing::Random`] for dense models).
    pub routing: Routing,
}

impl SynthSpec {
    fn llama(
        name: &str,
        n_layer: u32,
        n_embd: u32,
        n_ff: u32,
        n_head: u32,
        n_head_kv: u32,
    ) -> Self {
        Self {
            name: name.to_string(),
            arch: Arch::Llama,
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim: n_embd / n_head,
            n_vocab: 128_256,
            n_ctx_train: 8192,
            rope_freq_base: 500_000.0,
            rms_norm_eps: 1e-5,
            weight_type: GgmlType::Q4_K,
            output_type: GgmlType::Q6_K,
            seed: 0,
            routing: Routing::Random,
        }
    }

    /// Llama-3-8B: 32 layers, 4096 wide, FFN 14336, GQA 32/8, vocab 128256.
    pub fn llama_8b() -> Self {
        Self::llama("synthetic-llama-8b", 32, 4096, 14336, 32, 8)
    }

    /// Llama-3-70B: 80 layers, 8192 wide, FFN 28672, GQA 64/8, vocab 128256.
    pub fn llama_70b() -> Self {
        Self::llama("synthetic-llama-70b", 80, 8192, 28672, 64, 8)
    }

    /// Mixtral-8x7B: 32 layers, 4096 wide, 8 experts of 14336, 2 used, vocab 32000.
    pub fn mixtral_8x7b() -> Self {
        Self {
            arch: Arch::Mixtral {
                n_expert: 8,
                n_expert_used: 2,
            },
            n_vocab: 32_000,
            n_ctx_train: 32_768,
            rope_freq_base: 1_000_000.0,
            ..Self::llama("synthetic-mixtral-8x7b", 32, 4096, 14336, 32, 8)
        }
    }

    /// Qwen3-30B-A3B: 48 layers, 2048 wide, 128 experts of 768, 8 used,
    /// 32 heads of 128 (4 KV), vocab 151936.
    pub fn qwen3_30b_a3b() -> Self {
        Self {
            arch: Arch::Qwen3Moe {
                n_expert: 128,
                n_expert_used: 8,
                n_ff_expert: 768,
            },
            head_dim: 128,
            n_vocab: 151_936,
            n_ctx_train: 40_960,
            rope_freq_base: 1_000_000.0,
            rms_norm_eps: 1e-6,
            ..Self::llama("synthetic-qwen3-30b-a3b", 48, 2048, 6144, 32, 4)
        }
    }

    /// A dense llama of about 1 MiB at Q4_K: 2 layers, 256 wide, vocab 1024.
    pub fn tiny_llama() -> Self {
        Self {
            n_vocab: 1024,
            n_ctx_train: 512,
            rope_freq_base: 10_000.0,
            ..Self::llama("synthetic-tiny-llama", 2, 256, 512, 4, 2)
        }
    }

    /// [`Self::tiny_llama`] with 4 experts, 2 used (Mixtral layout).
    pub fn tiny_mixtral() -> Self {
        Self {
            name: "synthetic-tiny-mixtral".to_string(),
            arch: Arch::Mixtral {
                n_expert: 4,
                n_expert_used: 2,
            },
            ..Self::tiny_llama()
        }
    }

    /// A Qwen3-MoE layout of 64 experts, 4 used, 3 layers of 256 wide, for
    /// routing tests (with fewer experts, Qwen3's popularity alone overlaps
    /// more than its target).
    pub fn tiny_qwen3_moe() -> Self {
        Self {
            name: "synthetic-tiny-qwen3moe-routing".into(),
            arch: Arch::Qwen3Moe {
                n_expert: 64,
                n_expert_used: 4,
                n_ff_expert: 64,
            },
            head_dim: 64,
            n_head: 8,
            n_head_kv: 2,
            n_layer: 3,
            ..Self::tiny_llama()
        }
    }

    /// The same model with `n_layer` layers.
    pub fn with_layers(mut self, n_layer: u32) -> Self {
        self.n_layer = n_layer;
        self
    }

    /// The same model with big matrices of `ty`; `output` becomes Q6_K for
    /// K-quants (like Q4_K_M files) and `ty` otherwise.
    pub fn with_weight_type(mut self, ty: GgmlType) -> Self {
        self.weight_type = ty;
        self.output_type = if [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q3_K].contains(&ty) {
            GgmlType::Q6_K
        } else {
            ty
        };
        self
    }

    /// The same MoE with routers of `routing` (see [`crate::routing`]).
    pub fn with_routing(mut self, routing: Routing) -> Self {
        self.routing = routing;
        self
    }

    /// Whether the control channels of [`crate::routing`] are written.
    fn routed(&self) -> bool {
        self.routing.profile().is_some()
    }

    /// The same model with another seed (other weights, same shapes).
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// `general.file_type` (`enum llama_ftype`) for the weight type.
    fn file_type(&self) -> u32 {
        match self.weight_type {
            t if t == GgmlType::F32 => 0,
            t if t == GgmlType::F16 => 1,
            t if t == GgmlType::Q4_0 => 2,
            t if t == GgmlType::Q4_1 => 3,
            t if t == GgmlType::Q8_0 => 7,
            t if t == GgmlType::Q4_K && self.output_type == GgmlType::Q6_K => 15,
            t if t == GgmlType::Q4_K => 14,
            t if t == GgmlType::Q6_K => 18,
            _ => 1024, // LLAMA_FTYPE_GUESSED: llama.cpp then names the type from the tensors
        }
    }

    fn validate(&self) -> Result<(), SynthError> {
        let bad = |msg: String| Err(SynthError::Spec(msg));
        if self.n_layer == 0
            || self.n_embd == 0
            || self.n_ff == 0
            || self.n_head == 0
            || self.n_head_kv == 0
        {
            return bad("n_layer, n_embd, n_ff, n_head and n_head_kv must all be positive".into());
        }
        if self.n_head.checked_rem(self.n_head_kv) != Some(0) {
            return bad(format!(
                "n_head {} is not a multiple of n_head_kv {}",
                self.n_head, self.n_head_kv
            ));
        }
        if self.head_dim == 0 || self.head_dim.checked_rem(2) != Some(0) {
            return bad(format!(
                "head_dim {} must be positive and even (RoPE)",
                self.head_dim
            ));
        }
        let min_vocab = base_vocab().len() as u32;
        if self.n_vocab < min_vocab {
            return bad(format!(
                "n_vocab {} is below the {min_vocab} base tokens of the synthetic vocab",
                self.n_vocab
            ));
        }
        for ty in [self.weight_type, self.output_type] {
            if !ty.can_quantize() {
                return bad(format!(
                    "weight type {ty} cannot be generated; use q4_k, q8_0, q4_0 or f16"
                ));
            }
        }
        if self.routed() {
            if self.arch.experts().is_none() {
                return bad(format!("routing {} needs a MoE model", self.routing.name()));
            }
            for ty in [self.weight_type, self.output_type] {
                if control_len(ty, self.n_embd as usize).is_none() {
                    return bad(format!(
                        "routing {} needs n_embd >= {} rounded to {ty}'s block",
                        self.routing.name(),
                        CONTROL_DIMS
                    ));
                }
            }
        }
        if let Some((n_expert, used)) = self.arch.experts() {
            if n_expert == 0 || used == 0 || used > n_expert || n_expert > 1024 {
                return bad(format!(
                    "need 0 < n_expert_used ({used}) <= n_expert ({n_expert}) <= 1024"
                ));
            }
        }
        // Row lengths (innermost dims) of the quantized matrices.
        let mut rows = vec![self.n_embd, self.n_head * self.head_dim, self.ffn_width()];
        rows.dedup();
        for n in rows {
            for ty in [self.weight_type, self.output_type] {
                if ty.row_bytes(n as usize).is_none() {
                    return bad(format!(
                        "row length {n} is not a multiple of {ty}'s block of {}",
                        ty.block_elements()
                    ));
                }
            }
        }
        Ok(())
    }

    /// Width of each FFN (of each expert for MoE).
    fn ffn_width(&self) -> u32 {
        match self.arch {
            Arch::Qwen3Moe { n_ff_expert, .. } => n_ff_expert,
            _ => self.n_ff,
        }
    }

    /// Tensors in file order, with how each one is filled.
    fn plan(&self) -> Vec<Planned> {
        let (e, w, f32t) = (self.n_embd as u64, self.weight_type, GgmlType::F32);
        let (q, kv, ff) = (
            (self.n_head * self.head_dim) as u64,
            (self.n_head_kv * self.head_dim) as u64,
            self.ffn_width() as u64,
        );
        let routed = self.routed();
        let (norm, zero_rows) = if routed {
            (Fill::NormControl, Fill::PoolZeroRows)
        } else {
            (Fill::Norm, Fill::Pool)
        };
        let mut out = vec![
            Planned::new(
                "token_embd.weight",
                w,
                &[e, self.n_vocab as u64],
                if routed { Fill::TokenEmbd } else { Fill::Pool },
            ),
            Planned::new("output_norm.weight", f32t, &[e], norm),
            Planned::new(
                "output.weight",
                self.output_type,
                &[e, self.n_vocab as u64],
                if routed { Fill::Output } else { Fill::Pool },
            ),
        ];
        for i in 0..self.n_layer {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            out.push(Planned::norm(&n("attn_norm"), &[e]));
            out.push(Planned::pool(&n("attn_q"), w, &[e, q]));
            out.push(Planned::pool(&n("attn_k"), w, &[e, kv]));
            out.push(Planned::pool(&n("attn_v"), w, &[e, kv]));
            out.push(Planned::new(&n("attn_output"), w, &[q, e], zero_rows));
            if matches!(self.arch, Arch::Qwen3Moe { .. }) {
                out.push(Planned::norm(&n("attn_q_norm"), &[self.head_dim as u64]));
                out.push(Planned::norm(&n("attn_k_norm"), &[self.head_dim as u64]));
            }
            out.push(Planned::new(&n("ffn_norm"), f32t, &[e], norm));
            match self.arch.experts() {
                None => {
                    out.push(Planned::pool(&n("ffn_gate"), w, &[e, ff]));
                    out.push(Planned::pool(&n("ffn_up"), w, &[e, ff]));
                    out.push(Planned::pool(&n("ffn_down"), w, &[ff, e]));
                }
                Some((x, _)) => {
                    let x = x as u64;
                    let router = if routed {
                        Fill::Router(i as usize)
                    } else {
                        Fill::Random { std: ROUTER_STD }
                    };
                    out.push(Planned::new(&n("ffn_gate_inp"), f32t, &[e, x], router));
                    out.push(Planned::pool(&n("ffn_gate_exps"), w, &[e, ff, x]));
                    out.push(Planned::pool(&n("ffn_up_exps"), w, &[e, ff, x]));
                    out.push(Planned::new(&n("ffn_down_exps"), w, &[ff, e, x], zero_rows));
                }
            }
        }
        out
    }

    fn set_kvs(&self, b: &mut GgufBuilder) -> Result<(), SynthError> {
        let a = self.arch.gguf_name();
        let k = |s: &str| format!("{a}.{s}");
        b.set_str("general.architecture", a)?;
        b.set_str("general.name", &self.name)?;
        b.set_u32("general.file_type", self.file_type())?;
        b.set_u32("general.quantization_version", 2)?;
        b.set_u32(&k("context_length"), self.n_ctx_train)?;
        b.set_u32(&k("embedding_length"), self.n_embd)?;
        b.set_u32(&k("block_count"), self.n_layer)?;
        b.set_u32(&k("feed_forward_length"), self.n_ff)?;
        b.set_u32(&k("attention.head_count"), self.n_head)?;
        b.set_u32(&k("attention.head_count_kv"), self.n_head_kv)?;
        b.set_f32(&k("attention.layer_norm_rms_epsilon"), self.rms_norm_eps)?;
        b.set_f32(&k("rope.freq_base"), self.rope_freq_base)?;
        b.set_u32(&k("rope.dimension_count"), self.head_dim)?;
        b.set_u32(&k("vocab_size"), self.n_vocab)?;
        if self.head_dim * self.n_head != self.n_embd {
            b.set_u32(&k("attention.key_length"), self.head_dim)?;
            b.set_u32(&k("attention.value_length"), self.head_dim)?;
        }
        if let Some((n_expert, used)) = self.arch.experts() {
            b.set_u32(&k("expert_count"), n_expert)?;
            b.set_u32(&k("expert_used_count"), used)?;
            b.set_str(ROUTING_KEY, self.routing.name())?;
        }
        if let Arch::Qwen3Moe { n_ff_expert, .. } = self.arch {
            b.set_u32(&k("expert_feed_forward_length"), n_ff_expert)?;
        }
        set_tokenizer(b, self.n_vocab as usize)
    }
}

/// The metadata key naming a synthetic MoE's routing profile (`hypura bench`
/// reports it).
pub use llama_tiered::tiered::routing::SYNTH_ROUTING_KEY as ROUTING_KEY;

/// Standard deviation of random weights (typical of trained LLM matrices).
const WEIGHT_STD: f32 = 0.02;
/// Standard deviation of synthetic router weights: logits of O(1) for unit-RMS inputs
/// of a few thousand dims, so different tokens pick different experts.
const ROUTER_STD: f32 = 0.02;
/// Quantized bytes per pool: small enough to make in a fraction of a second.
const POOL_BYTES: usize = 1 << 20;
/// Bytes copied from the pool per random offset.
const COPY_CHUNK_BYTES: usize = 64 << 10;
/// Bytes assembled in memory before each write.
const WRITE_CHUNK_BYTES: usize = 8 << 20;

#[derive(Clone, Copy)]
enum Fill {
    /// Blocks copied from the pool of the tensor's type.
    Pool,
    /// F32 values near 1 (norm weights).
    Norm,
    /// F32 values, normal with this standard deviation.
    Random { std: f32 },
    /// Routed models ([`crate::routing`]): norm weights exactly 1 on the
    /// control channels.
    NormControl,
    /// Pool blocks, but each matrix's rows for the control channels (its
    /// outputs there) are zero: no layer writes them.
    PoolZeroRows,
    /// Each token's control values, then pool blocks.
    TokenEmbd,
    /// Each token's row reads the key y of its predecessor on the tour.
    Output,
    /// Layer N's router over the control channels.
    Router(usize),
}

struct Planned {
    name: String,
    ty: GgmlType,
    dims: Vec<u64>,
    fill: Fill,
}

impl Planned {
    fn new(name: &str, ty: GgmlType, dims: &[u64], fill: Fill) -> Self {
        Self {
            name: name.to_string(),
            ty,
            dims: dims.to_vec(),
            fill,
        }
    }
    fn pool(name: &str, ty: GgmlType, dims: &[u64]) -> Self {
        Self::new(name, ty, dims, Fill::Pool)
    }
    fn norm(name: &str, dims: &[u64]) -> Self {
        Self::new(name, GgmlType::F32, dims, Fill::Norm)
    }
}

/// Outcome of writing a model file.
#[derive(Clone, Debug)]
pub struct WriteReport {
    pub path: PathBuf,
    pub bytes: u64,
    pub tensors: usize,
    /// Wall time, including the final sync to disk.
    pub seconds: f64,
}

impl WriteReport {
    /// Write speed in MB/s (10^6 bytes per second).
    pub fn mb_per_s(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.seconds.max(1e-9)
    }
}

/// The header of `spec` (metadata and tensor table) and its tensors' plan.
fn header(spec: &SynthSpec) -> Result<(GgufBuilder, Vec<Planned>), SynthError> {
    spec.validate()?;
    let plan = spec.plan();
    let mut b = GgufBuilder::new();
    spec.set_kvs(&mut b)?;
    for t in &plan {
        b.add_tensor(&t.name, t.ty, &t.dims)?;
    }
    Ok((b, plan))
}

/// Writes the synthetic model `spec` to `path` (replacing it).
pub fn write(spec: &SynthSpec, path: &Path) -> Result<WriteReport, SynthError> {
    let start = Instant::now();
    let (b, plan) = header(spec)?;
    let mut w = b.create(path)?;
    let pools = Pools::new(spec.seed, &[spec.weight_type, spec.output_type])?;
    let mut buf = Vec::with_capacity(WRITE_CHUNK_BYTES);
    let infos = w.tensors().to_vec();
    let routing = routing_plan(spec);
    for (i, (t, info)) in plan.iter().zip(&infos).enumerate() {
        let mut rng = Rng::new(mix(spec.seed, i as u64 + 1));
        let controls = || {
            routing
                .as_ref()
                .expect("routed fills come with a routing plan")
        };
        match t.fill {
            Fill::NormControl => {
                let mut values = vec![0f32; info.n_elements() as usize];
                rng.fill_normal(&mut values, 1.0, WEIGHT_STD);
                values[..CONTROL_DIMS].fill(1.0);
                w.write_data(&f32_bytes(&values))?;
            }
            Fill::PoolZeroRows => {
                let row = t.ty.row_bytes(t.dims[0] as usize).expect("validated row") as u64;
                let matrices = t.dims.get(2).copied().unwrap_or(1);
                let zero = vec![0u8; row as usize * CONTROL_DIMS];
                for _ in 0..matrices {
                    w.write_data(&zero)?;
                    let rest = (t.dims[1] - CONTROL_DIMS as u64) * row;
                    stream_pool(&mut w, pools.get(t.ty), t.ty, rest, &mut rng, &mut buf)?;
                }
            }
            Fill::TokenEmbd => {
                let plan = controls();
                write_control_rows(&mut w, t, pools.get(t.ty), &mut rng, |tok, out| {
                    out[..CONTROL_DIMS].copy_from_slice(&plan.token_controls[tok]);
                    true
                })?;
            }
            Fill::Output => {
                let plan = controls();
                write_control_rows(&mut w, t, &[], &mut rng, |tok, out| {
                    match plan.output_keys[tok] {
                        Some(pred) => {
                            out[Y_DIMS]
                                .copy_from_slice(&plan.token_controls[pred as usize][Y_DIMS]);
                            true
                        }
                        None => false,
                    }
                })?;
            }
            Fill::Router(layer) => {
                let mut values = vec![0f32; info.n_elements() as usize];
                let e = t.dims[0] as usize;
                for (row, ctrl) in values.chunks_exact_mut(e).zip(&controls().routers[layer]) {
                    row[..CONTROL_DIMS].copy_from_slice(ctrl);
                }
                w.write_data(&f32_bytes(&values))?;
            }
            Fill::Pool => stream_pool(
                &mut w,
                pools.get(t.ty),
                t.ty,
                info.size_bytes,
                &mut rng,
                &mut buf,
            )?,
            Fill::Norm => stream_f32(&mut w, info.n_elements(), &mut rng, 1.0, WEIGHT_STD)?,
            Fill::Random { std } => stream_f32(&mut w, info.n_elements(), &mut rng, 0.0, std)?,
        }
    }
    if let Some(r) = &routing {
        tracing::info!(
            rho = r.rho,
            simulated_overlap = r.simulated_overlap,
            "routing {}",
            spec.routing.name()
        );
    }
    let bytes = w.finish()?;
    let report = WriteReport {
        path: path.to_path_buf(),
        bytes,
        tensors: plan.len(),
        seconds: start.elapsed().as_secs_f64(),
    };
    tracing::info!(
        path = %path.display(),
        bytes,
        mb_per_s = report.mb_per_s(),
        "wrote synthetic model {}",
        spec.name
    );
    Ok(report)
}

/// Writes `spec` as a sparse file: the header and tensor table, then a hole
/// to the full size. A valid GGUF whose tensor data reads as zeros, written
/// in milliseconds and taking no disk space: for planning and inspecting
/// model-sized files (not for running them: zero scales give zero outputs).
pub fn write_sparse(spec: &SynthSpec, path: &Path) -> Result<WriteReport, SynthError> {
    let start = Instant::now();
    let (b, plan) = header(spec)?;
    let meta = b.meta_bytes();
    let alignment = b.alignment() as u64;
    let data_bytes = b
        .tensors()
        .last()
        .map_or(0, |t| (t.offset + t.size_bytes).next_multiple_of(alignment));
    let io = |e: std::io::Error| {
        SynthError::Gguf(GgufError::Io {
            path: path.to_path_buf(),
            source: e,
        })
    };
    let mut file = std::fs::File::create(path).map_err(io)?;
    std::io::Write::write_all(&mut file, &meta).map_err(io)?;
    let bytes = meta.len() as u64 + data_bytes;
    file.set_len(bytes).map_err(io)?;
    Ok(WriteReport {
        path: path.to_path_buf(),
        bytes,
        tensors: plan.len(),
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Elements of a row's leading blocks that hold the control channels,
/// `None` when the row is too short.
fn control_len(ty: GgmlType, n_embd: usize) -> Option<usize> {
    let len = CONTROL_DIMS.next_multiple_of(ty.block_elements());
    (len <= n_embd).then_some(len)
}

/// The routing plan of a routed MoE `spec`.
fn routing_plan(spec: &SynthSpec) -> Option<RoutingPlan> {
    let profile = spec.routing.profile()?;
    let (n_expert, used) = spec.arch.experts()?;
    let normal: Vec<bool> = build_vocab(spec.n_vocab as usize)
        .iter()
        .map(|(_, ty)| *ty == TOKEN_NORMAL)
        .collect();
    let plan = routing::plan(
        &profile,
        &normal,
        spec.n_layer as usize,
        n_expert as usize,
        used as usize,
        spec.seed,
    );
    if let Some(want) = profile.overlap {
        if (plan.simulated_overlap - want).abs() > 0.02 {
            tracing::warn!(
                "routing {}: overlap {want} is out of reach for {n_expert} experts, {used} used: \
                 popularity alone gives {:.3}",
                spec.routing.name(),
                plan.simulated_overlap
            );
        }
    }
    Some(plan)
}

/// Writes a `[n_embd, n_vocab]` matrix whose row `t` starts with blocks
/// quantized from the values `fill(t, ..)` sets (zeros elsewhere), and
/// continues with `pool` blocks (zeros when `pool` is empty). A row whose
/// `fill` returns false is all zeros.
fn write_control_rows(
    w: &mut GgufStreamWriter,
    t: &Planned,
    pool: &[u8],
    rng: &mut Rng,
    mut fill: impl FnMut(usize, &mut [f32]) -> bool,
) -> Result<(), SynthError> {
    let (n_embd, n_rows) = (t.dims[0] as usize, t.dims[1] as usize);
    let head = control_len(t.ty, n_embd).expect("validated control length");
    let head_bytes = t.ty.row_bytes(head).expect("whole blocks");
    let tail_bytes = t.ty.row_bytes(n_embd).expect("whole blocks") - head_bytes;
    const ROWS: usize = 4096;
    let mut values = vec![0f32; ROWS * head];
    let mut keep = vec![false; ROWS];
    let zeros = vec![0u8; tail_bytes.max(head_bytes)];
    let mut out = Vec::new();
    for start in (0..n_rows).step_by(ROWS) {
        let n = ROWS.min(n_rows - start);
        values[..n * head].fill(0.0);
        for r in 0..n {
            keep[r] = fill(start + r, &mut values[r * head..(r + 1) * head]);
        }
        let heads = quantize_rows(t.ty, &values[..n * head], head)?;
        out.clear();
        for r in 0..n {
            if keep[r] {
                out.extend_from_slice(&heads[r * head_bytes..(r + 1) * head_bytes]);
            } else {
                out.extend_from_slice(&zeros[..head_bytes]);
            }
            if pool.is_empty() || tail_bytes == 0 {
                out.extend_from_slice(&zeros[..tail_bytes]);
            } else {
                let block = t.ty.block_bytes();
                let at = rng.below((pool.len() - tail_bytes) / block + 1) * block;
                out.extend_from_slice(&pool[at..at + tail_bytes]);
            }
        }
        w.write_data(&out)?;
    }
    Ok(())
}

/// Pools of valid quantized blocks, one per weight type.
struct Pools(Vec<(GgmlType, Vec<u8>)>);

impl Pools {
    fn new(seed: u64, types: &[GgmlType]) -> Result<Self, SynthError> {
        let mut pools: Vec<(GgmlType, Vec<u8>)> = Vec::new();
        for &ty in types {
            if pools.iter().any(|(t, _)| *t == ty) {
                continue;
            }
            let n_per_row = 4096;
            let row = ty
                .row_bytes(n_per_row)
                .expect("4096 is a whole number of blocks of every type");
            let rows = (POOL_BYTES / row).max(1);
            let mut values = vec![0f32; rows * n_per_row];
            Rng::new(mix(seed, 0x9001 ^ (u64::from(ty.raw()) << 32))).fill_normal(
                &mut values,
                0.0,
                WEIGHT_STD,
            );
            pools.push((ty, quantize_rows(ty, &values, n_per_row)?));
        }
        Ok(Self(pools))
    }

    fn get(&self, ty: GgmlType) -> &[u8] {
        let found = self.0.iter().find(|(t, _)| *t == ty);
        &found.expect("a pool is made for every planned type").1
    }
}

/// Streams `size` bytes of `ty` blocks, copied from `pool` at random block offsets.
fn stream_pool(
    w: &mut GgufStreamWriter,
    pool: &[u8],
    ty: GgmlType,
    size: u64,
    rng: &mut Rng,
    buf: &mut Vec<u8>,
) -> Result<(), SynthError> {
    let block = ty.block_bytes();
    let pool_blocks = pool.len() / block;
    let chunk_blocks = (COPY_CHUNK_BYTES / block).clamp(1, pool_blocks);
    let mut remaining_blocks = size / block as u64;
    while remaining_blocks > 0 {
        buf.clear();
        while buf.len() + block <= WRITE_CHUNK_BYTES && remaining_blocks > 0 {
            let room = (WRITE_CHUNK_BYTES - buf.len()) / block;
            let n = chunk_blocks.min(room).min(remaining_blocks as usize);
            let at = rng.below(pool_blocks - n + 1) * block;
            buf.extend_from_slice(&pool[at..at + n * block]);
            remaining_blocks -= n as u64;
        }
        w.write_data(buf)?;
    }
    Ok(())
}

/// Streams `n` F32 values, normal around `mean` with deviation `std`.
fn stream_f32(
    w: &mut GgufStreamWriter,
    n: u64,
    rng: &mut Rng,
    mean: f32,
    std: f32,
) -> Result<(), SynthError> {
    let mut values = vec![0f32; (n as usize).min(1 << 20)];
    let mut left = n as usize;
    while left > 0 {
        let chunk = &mut values[..left.min(1 << 20)];
        rng.fill_normal(chunk, mean, std);
        w.write_data(&f32_bytes(chunk))?;
        left -= chunk.len();
    }
    Ok(())
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A seed for stream `stream` of generator `seed`.
fn mix(seed: u64, stream: u64) -> u64 {
    Rng::new(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03)).next_u64()
}

// --- tokenizer -------------------------------------------------------------

/// SentencePiece token types (`enum llama_token_type`).
const TOKEN_NORMAL: i32 = 1;
const TOKEN_UNKNOWN: i32 = 2;
const TOKEN_CONTROL: i32 = 3;
const TOKEN_BYTE: i32 = 6;
/// SentencePiece's word-start marker (U+2581), which the tokenizer puts for spaces.
const SPACE: char = '\u{2581}';

/// ChatML, which llama.cpp also recognizes by its `<|im_start|>` marker.
const CHAT_TEMPLATE: &str = r"{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Common English words: whole-word pieces (with all their prefixes) in every vocab.
#[rustfmt::skip]
const WORDS: &[&str] = &[
    "hello", "world", "the", "of", "and", "to", "in", "is", "it", "you", "that", "he", "was", "for",
    "on", "are", "with", "as", "I", "his", "they", "be", "at", "one", "have", "this", "from", "or",
    "had", "by", "hot", "word", "but", "what", "some", "we", "can", "out", "other", "were", "all",
    "there", "when", "up", "use", "your", "how", "said", "an", "each", "she", "which", "do",
    "their", "time", "if", "will", "way", "about", "many", "then", "them", "write", "would", "like",
    "so", "these", "her", "long", "make", "thing", "see", "him", "two", "has", "look", "more",
    "day", "could", "go", "come", "did", "number", "sound", "no", "most", "people", "my", "over",
    "know", "water", "than", "call", "first", "who", "may", "down", "side", "been", "now", "find",
    "model", "capital", "city", "France", "Paris", "name", "question", "answer", "user",
    "assistant", "system", "good", "new", "yes", "please", "thank", "help", "tell", "story", "once",
    "upon", "a", "very", "little", "big", "cat", "dog", "house", "sun",
];

/// The tokens every synthetic vocab starts with: specials, the 256 byte
/// tokens (llama.cpp's SPM tokenizer falls back to them and looks up `<0x0A>`
/// for newline), ChatML markers, and every printable ASCII char with and
/// without the word-start marker.
fn base_vocab() -> Vec<(String, i32)> {
    let mut v = vec![
        ("<unk>".to_string(), TOKEN_UNKNOWN),
        ("<s>".to_string(), TOKEN_CONTROL),
        ("</s>".to_string(), TOKEN_CONTROL),
    ];
    v.extend((0..=255u8).map(|b| (format!("<0x{b:02X}>"), TOKEN_BYTE)));
    v.push(("<|im_start|>".to_string(), TOKEN_CONTROL));
    v.push(("<|im_end|>".to_string(), TOKEN_CONTROL));
    v.push((SPACE.to_string(), TOKEN_NORMAL));
    for c in '!'..='~' {
        v.push((format!("{SPACE}{c}"), TOKEN_NORMAL));
        v.push((c.to_string(), TOKEN_NORMAL));
    }
    v
}

const ID_BOS: u32 = 1;
const ID_EOS: u32 = 2;
const ID_UNK: u32 = 0;
const ID_IM_END: u32 = 3 + 256 + 1;

/// `n_vocab` unique pieces: [`base_vocab`], then words with every prefix (the
/// SPM tokenizer only merges adjacent pieces into pieces that exist), then
/// lowercase letter strings until the vocab is full.
fn build_vocab(n_vocab: usize) -> Vec<(String, i32)> {
    let mut vocab = base_vocab();
    let mut seen: HashSet<String> = vocab.iter().map(|(t, _)| t.clone()).collect();
    let mut push = |piece: String, vocab: &mut Vec<(String, i32)>| {
        if vocab.len() < n_vocab && seen.insert(piece.clone()) {
            vocab.push((piece, TOKEN_NORMAL));
        }
    };
    for word in WORDS {
        let mut cap = word.chars();
        let capitalized: String = cap
            .next()
            .map(|c| c.to_ascii_uppercase())
            .into_iter()
            .chain(cap)
            .collect();
        for form in [word.to_string(), capitalized] {
            for with_space in [format!("{SPACE}{form}"), form] {
                let chars: Vec<char> = with_space.chars().collect();
                for end in 2..=chars.len() {
                    push(chars[..end].iter().collect(), &mut vocab);
                }
            }
        }
    }
    let letters: Vec<char> = ('a'..='z').collect();
    let mut len = 2;
    while vocab.len() < n_vocab {
        let mut idx = vec![0usize; len];
        loop {
            let s: String = idx.iter().map(|&i| letters[i]).collect();
            push(format!("{SPACE}{s}"), &mut vocab);
            push(s, &mut vocab);
            if vocab.len() >= n_vocab || !next_combination(&mut idx, letters.len()) {
                break;
            }
        }
        len += 1;
    }
    vocab
}

/// Odometer increment over digits in [0, base); false after the last one.
fn next_combination(idx: &mut [usize], base: usize) -> bool {
    for d in idx.iter_mut().rev() {
        *d += 1;
        if *d < base {
            return true;
        }
        *d = 0;
    }
    false
}

fn set_tokenizer(b: &mut GgufBuilder, n_vocab: usize) -> Result<(), SynthError> {
    let vocab = build_vocab(n_vocab);
    let tokens: Vec<&str> = vocab.iter().map(|(t, _)| t.as_str()).collect();
    let types: Vec<i32> = vocab.iter().map(|(_, ty)| *ty).collect();
    // SPM merges the adjacent pair whose result scores highest: earlier pieces win.
    let scores: Vec<f32> = (0..vocab.len())
        .map(|i| {
            if types[i] == TOKEN_NORMAL {
                -(i as f32)
            } else {
                0.0
            }
        })
        .collect();
    b.set_str("tokenizer.ggml.model", "llama")?;
    b.set_arr_str("tokenizer.ggml.tokens", &tokens)?;
    b.set_arr_f32("tokenizer.ggml.scores", &scores)?;
    b.set_arr_i32("tokenizer.ggml.token_type", &types)?;
    b.set_u32("tokenizer.ggml.bos_token_id", ID_BOS)?;
    b.set_u32("tokenizer.ggml.eos_token_id", ID_EOS)?;
    b.set_u32("tokenizer.ggml.unknown_token_id", ID_UNK)?;
    b.set_u32("tokenizer.ggml.eot_token_id", ID_IM_END)?;
    b.set_bool("tokenizer.ggml.add_bos_token", true)?;
    b.set_bool("tokenizer.ggml.add_eos_token", false)?;
    b.set_str("tokenizer.chat_template", CHAT_TEMPLATE)?;
    Ok(())
}

// --- MoE derived from a dense model ------------------------------------------

/// Default number of experts of a derived MoE.
pub const DERIVE_DEFAULT_EXPERTS: u32 = 4;
/// Default number of experts used per token.
pub const DERIVE_DEFAULT_USED: u32 = 2;
/// Default relative perturbation of each expert's weights.
pub const DERIVE_DEFAULT_PERTURB: f32 = 0.01;

/// Role of a source tensor in the derived model.
enum Derived {
    Copy,
    /// `blk.N.ffn_{gate,up,down}.weight` → the stacked `_exps` tensor.
    Experts {
        layer: u32,
        kind: &'static str,
    },
}

fn classify(name: &str) -> Result<Derived, String> {
    let Some(rest) = name.strip_prefix("blk.") else {
        return Ok(Derived::Copy);
    };
    let Some((layer, tail)) = rest.split_once('.') else {
        return Ok(Derived::Copy);
    };
    let Ok(layer) = layer.parse::<u32>() else {
        return Ok(Derived::Copy);
    };
    match tail {
        "ffn_gate.weight" => Ok(Derived::Experts {
            layer,
            kind: "gate",
        }),
        "ffn_up.weight" => Ok(Derived::Experts { layer, kind: "up" }),
        "ffn_down.weight" => Ok(Derived::Experts {
            layer,
            kind: "down",
        }),
        "ffn_norm.weight" => Ok(Derived::Copy),
        t if t.starts_with("ffn_") => Err(format!(
            "tensor {name} has no MoE counterpart in llama.cpp's llama MoE"
        )),
        _ => Ok(Derived::Copy),
    }
}

/// Builds the SmolLM2-style MoE of `docs/design.md` from the dense llama GGUF `src`:
/// every KV and non-FFN tensor is copied; each layer's FFN becomes
/// `ffn_{gate,up,down}_exps` of `n_expert` experts, expert e being the
/// original weights × (1 + `perturb`·noise) requantized to the source type
/// (an exact copy when `perturb` is 0), behind a random F32 router
/// `ffn_gate_inp`. Deterministic for a given `seed`.
pub fn derive_moe_from_dense(
    src: &Path,
    dst: &Path,
    n_expert: u32,
    n_expert_used: u32,
    perturb: f32,
    seed: u64,
) -> Result<WriteReport, SynthError> {
    let start = Instant::now();
    let source_err = |reason: String| SynthError::Source {
        path: src.to_path_buf(),
        reason,
    };
    if n_expert == 0 || n_expert_used == 0 || n_expert_used > n_expert || n_expert > 1024 {
        return Err(SynthError::Spec(format!(
            "need 0 < experts used ({n_expert_used}) <= experts ({n_expert}) <= 1024"
        )));
    }
    if !(0.0..1.0).contains(&perturb) {
        return Err(SynthError::Spec(format!(
            "perturb {perturb} must be in [0, 1)"
        )));
    }
    let file = GgufReader::open(src)?;
    let arch = file.get_str("general.architecture")?.unwrap_or_default();
    if arch != "llama" {
        return Err(source_err(format!(
            "architecture is {arch:?}; only dense \"llama\" models can be derived"
        )));
    }
    if file.get_u32("llama.expert_count")?.unwrap_or(0) > 0 {
        return Err(source_err(
            "it is already a MoE (llama.expert_count > 0)".into(),
        ));
    }
    let n_embd = file
        .get_u32("llama.embedding_length")?
        .ok_or_else(|| source_err("llama.embedding_length is missing".into()))?;

    let mut b = GgufBuilder::new();
    b.copy_kvs_from(&file)?;
    let name = file
        .get_str("general.name")
        .ok()
        .flatten()
        .unwrap_or_else(|| "model".into());
    b.set_str(
        "general.name",
        &format!("{name} MoE {n_expert}x (top-{n_expert_used}, derived)"),
    )?;
    b.set_u32("llama.expert_count", n_expert)?;
    b.set_u32("llama.expert_used_count", n_expert_used)?;

    let sources = file.tensors();
    let mut jobs = Vec::new();
    for t in &sources {
        match classify(&t.name).map_err(source_err)? {
            Derived::Copy => {
                b.add_tensor(&t.name, t.ty, &t.dims)?;
                jobs.push(Job::Copy(t.clone()));
            }
            Derived::Experts { layer, kind } => {
                if t.dims.len() != 2 || !t.ty.can_quantize() || !t.ty.can_dequantize() {
                    return Err(source_err(format!(
                        "{} is {} of type {}: need a 2-D tensor of a type ggml can quantize",
                        t.name,
                        format_dims(&t.dims),
                        t.ty
                    )));
                }
                if kind == "gate" {
                    let router = format!("blk.{layer}.ffn_gate_inp.weight");
                    b.add_tensor(
                        &router,
                        GgmlType::F32,
                        &[u64::from(n_embd), u64::from(n_expert)],
                    )?;
                    jobs.push(Job::Router);
                }
                let dims = [t.dims[0], t.dims[1], u64::from(n_expert)];
                b.add_tensor(&format!("blk.{layer}.ffn_{kind}_exps.weight"), t.ty, &dims)?;
                jobs.push(Job::Experts(t.clone()));
            }
        }
    }
    let routers = jobs.iter().filter(|j| matches!(j, Job::Router)).count();
    let n_layer = file.get_u32("llama.block_count")?.unwrap_or(0) as usize;
    if routers != n_layer {
        return Err(source_err(format!(
            "{routers} of its {n_layer} layers have ffn_gate/ffn_up/ffn_down weights; all must"
        )));
    }
    let mut w = b.create(dst)?;
    // Router logits of O(1) for inputs of unit RMS: tokens pick different experts.
    let router_std = 1.0 / (n_embd as f32).sqrt();
    for (i, job) in jobs.iter().enumerate() {
        let stream_seed = mix(seed, i as u64 + 1);
        match job {
            Job::Copy(t) => w.write_data(&file.read_tensor(t)?)?,
            Job::Router => {
                let n = u64::from(n_embd) * u64::from(n_expert);
                stream_f32(&mut w, n, &mut Rng::new(stream_seed), 0.0, router_std)?;
            }
            Job::Experts(t) => write_experts(&mut w, &file, t, n_expert, perturb, stream_seed)?,
        }
    }
    let bytes = w.finish()?;
    Ok(WriteReport {
        path: dst.to_path_buf(),
        bytes,
        tensors: jobs.len(),
        seconds: start.elapsed().as_secs_f64(),
    })
}

enum Job {
    Copy(TensorInfo),
    Router,
    Experts(TensorInfo),
}

/// Writes `n_expert` perturbed copies of the dense matrix `t`, stacked.
fn write_experts(
    w: &mut GgufStreamWriter,
    file: &GgufReader,
    t: &TensorInfo,
    n_expert: u32,
    perturb: f32,
    seed: u64,
) -> Result<(), SynthError> {
    let bytes = file.read_tensor(t)?;
    if perturb == 0.0 {
        for _ in 0..n_expert {
            w.write_data(&bytes)?;
        }
        return Ok(());
    }
    let base = dequantize(t.ty, &bytes)?;
    let mut values = vec![0f32; base.len()];
    let mut out = vec![0u8; bytes.len()];
    // Uniform noise in [-√3, √3): unit variance, cheaper than normal noise.
    let amplitude = perturb * 3f32.sqrt();
    for e in 0..n_expert {
        let mut rng = Rng::new(mix(seed, u64::from(e)));
        for (v, &x) in values.iter_mut().zip(&base) {
            *v = x * (1.0 + amplitude * (2.0 * rng.unit() - 1.0));
        }
        quantize_rows_into(t.ty, &values, t.dims[0] as usize, &mut out)?;
        w.write_data(&out)?;
    }
    Ok(())
}

fn format_dims(dims: &[u64]) -> String {
    let parts: Vec<String> = dims.iter().map(u64::to_string).collect();
    format!("[{}]", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use llama_tiered::llama::gguf_write::dequantize_into;
    use llama_tiered::llama::{Batch, Context, ContextParams, Model, ModelParams};

    use super::*;

    /// A file in the temp dir, unique per process and call, removed on drop.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(tag: &str) -> Self {
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let name = format!("hypura-synth-{tag}-{}-{n}.gguf", std::process::id());
            Self(std::env::temp_dir().join(name))
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// What a greedy run through llama.cpp gave.
    struct Greedy {
        prompt_tokens: Vec<i32>,
        generated: Vec<i32>,
        text: String,
        expert_count: Option<String>,
    }

    /// Loads `path` with llama.cpp's defaults, decodes `prompt` (with BOS) and
    /// greedily generates up to `n_gen` tokens, asserting every logit is finite.
    fn greedy(path: &Path, prompt: &str, n_gen: usize) -> Greedy {
        let model = Arc::new(
            Model::load(path, ModelParams::default())
                .unwrap_or_else(|e| panic!("llama.cpp could not load {}: {e}", path.display())),
        );
        let params = ContextParams {
            n_ctx: 128,
            n_batch: 128,
            n_threads: 2,
            ..Default::default()
        };
        let mut ctx = Context::new(Arc::clone(&model), &params).expect("a context");
        let prompt_tokens = model.tokenize(prompt, true, false).expect("tokenize");
        assert!(!prompt_tokens.is_empty(), "tokenize returned nothing");

        let mut batch = Batch::new(128);
        let (mut generated, mut text) = (Vec::new(), Vec::new());
        let mut next_input = prompt_tokens.clone();
        let mut pos = 0;
        for _ in 0..n_gen {
            batch.clear();
            let mut row = 0;
            for (i, &token) in next_input.iter().enumerate() {
                row = batch
                    .push(token, pos, 0, i + 1 == next_input.len())
                    .expect("batch room");
                pos += 1;
            }
            ctx.decode(&batch).expect("llama_decode");
            let logits = ctx.logits(row).expect("logits of the last token");
            assert!(logits.iter().all(|l| l.is_finite()), "non-finite logits");
            let next = (0..logits.len())
                .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
                .unwrap() as i32;
            generated.push(next);
            if model.is_eog(next) {
                break;
            }
            text.extend_from_slice(&model.token_to_bytes(next, false));
            next_input = vec![next];
        }
        Greedy {
            prompt_tokens,
            generated,
            text: String::from_utf8_lossy(&text).into_owned(),
            expert_count: model.meta("llama.expert_count"),
        }
    }

    fn id_of(n_vocab: usize, piece: &str) -> i32 {
        build_vocab(n_vocab)
            .iter()
            .position(|(t, _)| t == piece)
            .unwrap() as i32
    }

    /// Writes `spec`, runs it, and checks tokens, finiteness and the expert count.
    fn write_and_run(spec: SynthSpec) {
        let file = TempFile::new(&spec.name);
        let report = write(&spec, &file.0).unwrap();
        assert_eq!(report.bytes, std::fs::metadata(&file.0).unwrap().len());
        let run = greedy(&file.0, "Hello world", 8);
        let v = spec.n_vocab as usize;
        let want = vec![
            ID_BOS as i32,
            id_of(v, "\u{2581}Hello"),
            id_of(v, "\u{2581}world"),
        ];
        assert_eq!(run.prompt_tokens, want);
        assert!(!run.generated.is_empty());
        let experts = spec.arch.experts().map(|(n, _)| n.to_string());
        if spec.arch.gguf_name() == "llama" {
            assert_eq!(run.expert_count, experts);
        }
    }

    #[test]
    fn synth_tiny_dense_q4_k() {
        write_and_run(SynthSpec::tiny_llama().with_weight_type(GgmlType::Q4_K));
    }

    #[test]
    fn synth_tiny_dense_q8_0() {
        write_and_run(SynthSpec::tiny_llama().with_weight_type(GgmlType::Q8_0));
    }

    #[test]
    fn synth_tiny_dense_f16() {
        write_and_run(SynthSpec::tiny_llama().with_weight_type(GgmlType::F16));
    }

    #[test]
    fn synth_tiny_moe_q4_k() {
        write_and_run(SynthSpec::tiny_mixtral().with_weight_type(GgmlType::Q4_K));
    }

    #[test]
    fn synth_tiny_moe_q8_0() {
        write_and_run(SynthSpec::tiny_mixtral().with_weight_type(GgmlType::Q8_0));
    }

    #[test]
    fn synth_tiny_moe_f16() {
        write_and_run(SynthSpec::tiny_mixtral().with_weight_type(GgmlType::F16));
    }

    #[test]
    fn synth_tiny_qwen3moe_loads() {
        let spec = SynthSpec {
            name: "synthetic-tiny-qwen3moe".into(),
            arch: Arch::Qwen3Moe {
                n_expert: 8,
                n_expert_used: 2,
                n_ff_expert: 256,
            },
            head_dim: 64,
            n_head: 8,
            n_head_kv: 2,
            ..SynthSpec::tiny_llama()
        }
        .with_weight_type(GgmlType::Q8_0);
        write_and_run(spec);
    }

    /// The real-size presets, cut to one layer, load and run in llama.cpp.
    /// Slow (about 3 GB written): `cargo test --release synth_presets_load -- --ignored`.
    #[test]
    #[ignore]
    fn synth_presets_load_with_one_layer() {
        for spec in [
            SynthSpec::llama_8b(),
            SynthSpec::mixtral_8x7b(),
            SynthSpec::qwen3_30b_a3b(),
        ] {
            write_and_run(spec.with_layers(1));
        }
    }

    #[test]
    fn synth_same_seed_same_bytes_other_seed_other_bytes() {
        let spec = SynthSpec::tiny_mixtral().with_seed(42);
        let (a, b, c) = (
            TempFile::new("seed-a"),
            TempFile::new("seed-b"),
            TempFile::new("seed-c"),
        );
        write(&spec, &a.0).unwrap();
        write(&spec, &b.0).unwrap();
        write(&spec.clone().with_seed(43), &c.0).unwrap();
        let (a, b, c) = (
            std::fs::read(&a.0).unwrap(),
            std::fs::read(&b.0).unwrap(),
            std::fs::read(&c.0).unwrap(),
        );
        assert!(a == b, "same seed gave different bytes");
        assert_eq!(a.len(), c.len());
        assert!(a != c, "another seed gave the same bytes");
    }

    #[test]
    fn synth_derived_smollm2_moe_says_paris() {
        let src = llama_tiered::test_models::smollm2();
        let dst = TempFile::new("smollm2-moe");
        let report = derive_moe_from_dense(&src, &dst.0, 4, 2, 0.01, 7).unwrap();
        eprintln!("derived {} bytes in {:.2} s", report.bytes, report.seconds);
        let derived = GgufReader::open(&dst.0).unwrap();
        let gate = derived.tensor("blk.0.ffn_gate_exps.weight").unwrap();
        assert_eq!(gate.dims[2], 4);
        assert_eq!(
            derived.tensor("blk.0.ffn_gate_inp.weight").unwrap().ty,
            GgmlType::F32
        );
        assert!(derived.tensor("blk.0.ffn_gate.weight").is_none());
        let run = greedy(&dst.0, "The capital of France is", 8);
        assert_eq!(run.expert_count.as_deref(), Some("4"));
        eprintln!("greedy continuation: {:?}", run.text);
        assert!(run.text.contains("Paris"), "greedy text: {:?}", run.text);
    }

    #[test]
    fn synth_stream_writer_round_trips_through_gguf() {
        let file = TempFile::new("roundtrip");
        let mut b = GgufBuilder::new();
        b.set_str("general.architecture", "test").unwrap();
        b.set_u32("test.n", 7).unwrap();
        b.set_arr_str("test.words", &["a", "b"]).unwrap();
        assert!(b.set_u32("general.alignment", 64).is_err());
        b.add_tensor("a", GgmlType::F32, &[3]).unwrap();
        b.add_tensor("b", GgmlType::Q8_0, &[64, 2]).unwrap();
        assert!(matches!(
            b.add_tensor("a", GgmlType::F32, &[1]),
            Err(GgufError::DuplicateTensor { .. })
        ));
        assert!(matches!(
            b.add_tensor("c", GgmlType::Q4_K, &[100]),
            Err(GgufError::BadShape { .. })
        ));
        let values: Vec<f32> = (0..128).map(|i| i as f32 / 64.0 - 1.0).collect();
        let q = quantize_rows(GgmlType::Q8_0, &values, 64).unwrap();
        assert_eq!(q.len(), 2 * 2 * 34); // 2 rows of 2 blocks of 34 bytes
        let mut w = b.create(&file.0).unwrap();
        w.write_data(&f32_bytes(&[1.0, 2.0])).unwrap();
        w.write_data(&f32_bytes(&[3.0])).unwrap();
        w.write_data(&q).unwrap();
        assert!(matches!(
            w.write_data(&[0]),
            Err(GgufError::Overflow { .. })
        ));
        w.finish().unwrap();

        let r = GgufReader::open(&file.0).unwrap();
        assert_eq!(r.get_u32("test.n").unwrap(), Some(7));
        assert!(r.get_str("test.n").is_err());
        assert_eq!(r.get_arr_str("test.words").unwrap().unwrap(), ["a", "b"]);
        let a = r.tensor("a").unwrap();
        assert_eq!(r.read_tensor(&a).unwrap(), f32_bytes(&[1.0, 2.0, 3.0]));
        let tb = r.tensor("b").unwrap();
        assert_eq!((tb.offset, tb.dims.as_slice()), (32, &[64u64, 2][..]));
        let back = dequantize(GgmlType::Q8_0, &r.read_tensor(&tb).unwrap()).unwrap();
        assert!(back.iter().zip(&values).all(|(x, y)| (x - y).abs() < 0.01));
        let mut short = vec![0f32; 10];
        assert!(dequantize_into(GgmlType::Q8_0, &q, &mut short).is_err());
    }

    #[test]
    fn synth_incomplete_file_is_an_error() {
        let file = TempFile::new("incomplete");
        let mut b = GgufBuilder::new();
        b.add_tensor("a", GgmlType::F32, &[4]).unwrap();
        let mut w = b.create(&file.0).unwrap();
        w.write_data(&[0; 8]).unwrap();
        assert!(matches!(
            w.finish(),
            Err(GgufError::Incomplete { written: 8, .. })
        ));
    }

    #[test]
    fn synth_vocab_is_unique_and_full() {
        for n in [base_vocab().len(), 1024, 151_936] {
            let v = build_vocab(n);
            assert_eq!(v.len(), n);
            let unique: HashSet<&str> = v.iter().map(|(t, _)| t.as_str()).collect();
            assert_eq!(unique.len(), n);
        }
        assert_eq!(build_vocab(1024)[ID_IM_END as usize].0, "<|im_end|>");
        assert_eq!(build_vocab(1024)[3 + 0x0A].0, "<0x0A>");
    }

    #[test]
    fn synth_presets_are_valid() {
        for spec in [
            SynthSpec::llama_8b(),
            SynthSpec::llama_70b(),
            SynthSpec::mixtral_8x7b(),
            SynthSpec::qwen3_30b_a3b(),
            SynthSpec::tiny_llama(),
            SynthSpec::tiny_mixtral(),
        ] {
            for ty in [
                GgmlType::Q4_K,
                GgmlType::Q8_0,
                GgmlType::F16,
                GgmlType::Q4_0,
            ] {
                spec.clone().with_weight_type(ty).validate().unwrap();
            }
        }
        let bad = SynthSpec {
            n_embd: 100,
            ..SynthSpec::tiny_llama()
        };
        assert!(matches!(bad.validate(), Err(SynthError::Spec(_))));
    }
}
