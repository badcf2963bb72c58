//! Inference contexts (KV cache + compute state) and token batches.
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use hypura_llama_sys as sys;

use super::model::Model;
use super::stream::{eval_trampoline, EvalHook};
use crate::error::EngineError;

/// `LLAMA_TOKEN_NULL` of llama.h (a macro bindgen does not export).
const LLAMA_TOKEN_NULL: i32 = -1;

/// Options for [`Context::new`].
#[derive(Debug, Clone)]
pub struct ContextParams {
    /// Context length in tokens, shared by all sequences (`0` = the model's training length).
    pub n_ctx: u32,
    /// Most tokens submitted in one [`Context::decode`] call.
    pub n_batch: u32,
    /// Most tokens computed in one pass of the graph (llama.cpp's
    /// micro-batch), at most `n_batch`; `0`: `min(n_batch, 512)`,
    /// llama.cpp's default. Embeddings always take `n_batch`. With streamed
    /// experts each pass reads the experts the cache lacks, so a prompt
    /// is best one pass ([`hypura_scheduler::plan::prompt_ubatch_tokens`]).
    pub n_ubatch: u32,
    /// Most sequences decoded together.
    pub n_seq_max: u32,
    /// Most tokens of one batch that produce logits (`0`: every token of
    /// the batch, llama.cpp's default). llama.cpp reserves the compute
    /// buffers of a pass for this many rows of the output layer, `n_vocab`
    /// floats each: for a 2,048-token pass of Qwen3's 151,936-token vocabulary,
    /// 1.24 GB that a generation context, which needs one row per sequence,
    /// never uses. A batch asking for more is refused ([`Context::decode`]),
    /// never computed (llama.cpp would abort). Embeddings ignore it.
    pub n_outputs_max: u32,
    /// Threads for decoding (`0` = one per available core).
    pub n_threads: u32,
    /// Compute embeddings instead of (or beside) logits.
    pub embeddings: bool,
    /// With `embeddings`: one embedding per sequence, the mean over its
    /// tokens (`LLAMA_POOLING_TYPE_MEAN`); otherwise the model's own pooling.
    pub mean_pooling: bool,
}

impl Default for ContextParams {
    fn default() -> Self {
        ContextParams {
            n_ctx: 4096,
            n_batch: 512,
            n_ubatch: 0,
            n_seq_max: 1,
            n_outputs_max: 0,
            n_threads: 0,
            embeddings: false,
            mean_pooling: false,
        }
    }
}

/// Timings llama.cpp kept for a context since its last reset, in milliseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct PerfTimings {
    pub load_ms: f64,
    pub prompt_eval_ms: f64,
    pub prompt_tokens: u32,
    pub eval_ms: f64,
    pub eval_tokens: u32,
}

/// One llama.cpp context over a shared [`Model`]. Not shareable between
/// threads at once (decoding mutates it), but movable to another thread.
pub struct Context {
    raw: NonNull<sys::llama_context>,
    // Boxed: its address is handed to llama.cpp's abort callback.
    abort: Box<AbortState>,
    // Boxed so the address handed to llama.cpp's eval callback is stable.
    _hook: Option<Box<Arc<dyn EvalHook>>>,
    n_vocab: usize,
    /// [`ContextParams::n_outputs_max`] as made (`0`: no limit of ours).
    n_outputs_max: u32,
    model: Arc<Model>,
    /// Greedy samplers llama.cpp runs inside the decode graph, by sequence
    /// id ([`Context::set_device_greedy`]); owned here, freed after the
    /// context that points at them.
    device_greedy: BTreeMap<i32, NonNull<sys::llama_sampler>>,
}

// SAFETY: a context is used by one thread at a time (`&mut self` for every
// mutating call); llama.cpp has no thread affinity.
unsafe impl Send for Context {}

/// What llama.cpp's abort callback looks at: the caller's cancel flag and
/// whether the eval hook failed.
struct AbortState {
    flag: Arc<AtomicBool>,
    hook: Option<Arc<dyn EvalHook>>,
}

unsafe extern "C" fn abort_trampoline(data: *mut c_void) -> bool {
    // SAFETY: `data` points at the context's boxed AbortState, which
    // outlives every decode call.
    let state = unsafe { &*(data as *const AbortState) };
    state.flag.load(Ordering::Relaxed) || state.hook.as_ref().is_some_and(|h| h.failed())
}

pub fn default_threads() -> u32 {
    std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(4)
}

impl Context {
    pub fn new(model: Arc<Model>, params: &ContextParams) -> Result<Context, EngineError> {
        Context::with_hook(model, params, None)
    }

    /// A context whose graph nodes are shown to `hook` while decoding (the
    /// STREAM tier makes weights resident this way just before they are used).
    pub fn with_hook(
        model: Arc<Model>,
        params: &ContextParams,
        hook: Option<Arc<dyn EvalHook>>,
    ) -> Result<Context, EngineError> {
        if params.n_batch == 0 || params.n_seq_max == 0 {
            return Err(EngineError::InvalidArgument(
                "n_batch and n_seq_max must be at least 1".into(),
            ));
        }
        let abort = Box::new(AbortState {
            flag: Arc::new(AtomicBool::new(false)),
            hook: hook.clone(),
        });
        let threads = if params.n_threads == 0 {
            default_threads()
        } else {
            params.n_threads
        } as i32;
        // SAFETY: returns a plain struct of defaults.
        let mut raw_params = unsafe { sys::llama_context_default_params() };
        raw_params.n_ctx = params.n_ctx;
        raw_params.n_batch = params.n_batch;
        // An embedding batch is pooled per decode, and a non-causal model
        // must see all of it in one micro-batch (llama-server's n_ubatch =
        // n_batch for embeddings).
        raw_params.n_ubatch = if params.embeddings {
            params.n_batch
        } else if params.n_ubatch > 0 {
            params.n_ubatch.min(params.n_batch)
        } else {
            params.n_batch.min(512)
        };
        raw_params.n_seq_max = params.n_seq_max;
        let n_outputs_max = if params.embeddings {
            0
        } else {
            params.n_outputs_max
        };
        raw_params.n_outputs_max = n_outputs_max;
        // A batch of one token (a decode step of one sequence) is computed
        // with `n_threads`, larger ones with `n_threads_batch`. When the host
        // computes only the input row lookup, one thread does it: waking the
        // others and waiting for them at the end costs more than the row.
        raw_params.n_threads = if model.host_input_only() { 1 } else { threads };
        raw_params.n_threads_batch = threads;
        raw_params.embeddings = params.embeddings;
        if params.mean_pooling {
            raw_params.pooling_type = sys::LLAMA_POOLING_TYPE_MEAN;
        }
        raw_params.no_perf = false;
        // llama.cpp's `op_offload` (its default) stays on, STREAM tensors
        // included: for batches of 32 tokens or more a GPU computes ops whose
        // weights are in host memory, copying them at the start of the split
        // that uses them. The scheduler starts a new split at each such use,
        // and the eval hook has made the weights resident by then: it runs
        // when the router's choice (or a dense layer's FFN norm) is computed,
        // in an earlier split, and its pins hold until the next layer's
        // request. Turned off, a streamed model's long prompts ran their
        // experts on the CPU while the full-resident placement ran them on
        // the GPU, and the two gave different tokens (GPU machine,
        // Mixtral-8L, a 60-token prompt).
        raw_params.op_offload = true;
        raw_params.abort_callback = Some(abort_trampoline);
        raw_params.abort_callback_data = &*abort as *const AbortState as *mut c_void;
        let hook = hook.map(Box::new);
        if let Some(hook) = &hook {
            raw_params.cb_eval = Some(eval_trampoline);
            raw_params.cb_eval_user_data = &**hook as *const Arc<dyn EvalHook> as *mut c_void;
        }
        // SAFETY: the model is alive (we keep an Arc); the abort data outlives the context.
        let raw = unsafe { sys::llama_init_from_model(model.as_ptr(), raw_params) };
        let raw = NonNull::new(raw).ok_or_else(|| {
            EngineError::Context(format!(
                "llama.cpp could not create a context of {} tokens (out of memory?)",
                params.n_ctx
            ))
        })?;
        let n_vocab = model.n_vocab();
        Ok(Context {
            raw,
            abort,
            _hook: hook,
            n_vocab,
            n_outputs_max,
            model,
            device_greedy: BTreeMap::new(),
        })
    }

    /// [`Context::with_hook`], also returning the memory the context holds
    /// beside the weights, as llama.cpp reports it while creating it. Over a
    /// metadata-only model (llama.cpp's `no_alloc`, as
    /// `tiered::context_memory` loads it) nothing is allocated but the output
    /// buffer, and the context must be dropped unused.
    pub fn measured(
        model: Arc<Model>,
        params: &ContextParams,
        hook: Option<Arc<dyn EvalHook>>,
    ) -> Result<(Context, ContextMemory), EngineError> {
        let (context, lines) =
            super::backend::capture_log(|| Context::with_hook(model, params, hook));
        let context = context?;
        let mut memory = ContextMemory::from_log(&lines).map_err(EngineError::Context)?;
        if params.embeddings {
            // llama.cpp outputs every token of a batch when computing
            // embeddings (`output_all`), so on first use the output buffer
            // grows from `n_seq_max` rows to `n_batch` rows of logits and
            // embeddings (`llama_context::output_reserve`), in host memory.
            let rows = u64::from(params.n_batch.saturating_sub(params.n_seq_max));
            let row_bytes = (context.n_vocab + context.model.n_embd()) as u64 * 4;
            memory.ram_bytes += rows * row_bytes;
        }
        Ok((context, memory))
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Context length in tokens.
    pub fn n_ctx(&self) -> u32 {
        // SAFETY: the context is alive.
        unsafe { sys::llama_n_ctx(self.raw.as_ptr()) }
    }

    /// Threads computing a batch of one token, and larger batches.
    pub fn threads(&self) -> (u32, u32) {
        // SAFETY: the context is alive.
        let (one, batch) = unsafe {
            (
                sys::llama_n_threads(self.raw.as_ptr()),
                sys::llama_n_threads_batch(self.raw.as_ptr()),
            )
        };
        (one.max(0) as u32, batch.max(0) as u32)
    }

    pub fn n_batch(&self) -> u32 {
        // SAFETY: the context is alive.
        unsafe { sys::llama_n_batch(self.raw.as_ptr()) }
    }

    /// Tokens computed in one pass of the graph (llama.cpp's micro-batch).
    pub fn n_ubatch(&self) -> u32 {
        // SAFETY: the context is alive.
        unsafe { sys::llama_n_ubatch(self.raw.as_ptr()) }
    }

    /// A flag that, once set, makes the running and every later
    /// [`Context::decode`] fail with [`EngineError::Cancelled`] until cleared.
    pub fn abort_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.abort.flag)
    }

    /// Runs the model over a batch. Logits of the tokens marked for output are
    /// then readable with [`Context::logits`].
    pub fn decode(&mut self, batch: &Batch) -> Result<(), EngineError> {
        if batch.is_empty() {
            return Ok(());
        }
        let outputs = batch.n_outputs();
        if self.n_outputs_max > 0 && outputs > self.n_outputs_max as usize {
            return Err(EngineError::InvalidArgument(format!(
                "a batch asks for {outputs} rows of logits; this context gives at most {}",
                self.n_outputs_max
            )));
        }
        // SAFETY: the batch's arrays hold `n_tokens` valid entries; the context is alive.
        let rc = unsafe { sys::llama_decode(self.raw.as_ptr(), batch.raw) };
        if rc == 0 {
            // With GPU layers llama_decode returns before the GPU is done:
            // wait here, so the decode's time is its own (not the next
            // logits read's) and the hook hears of the end of the compute.
            // SAFETY: the context is alive.
            unsafe { sys::llama_synchronize(self.raw.as_ptr()) };
        }
        if let Some(hook) = &self.abort.hook {
            hook.decode_done();
        }
        match rc {
            0 => Ok(()),
            1 => Err(EngineError::ContextFull),
            2 => match self.abort.hook.as_ref().and_then(|h| h.take_error()) {
                Some(reason) => Err(EngineError::Stream(reason)),
                None => Err(EngineError::Cancelled),
            },
            rc => Err(EngineError::Decode(rc)),
        }
    }

    /// The logits of output row `i` of the last batch (`-1` = the last row).
    pub fn logits(&self, i: i32) -> Result<&[f32], EngineError> {
        // SAFETY: the context is alive; llama.cpp returns NULL for an invalid index.
        let p = unsafe { sys::llama_get_logits_ith(self.raw.as_ptr(), i) };
        if p.is_null() {
            return Err(EngineError::InvalidArgument(format!(
                "no logits for batch row {i}"
            )));
        }
        // SAFETY: a non-null result points at `n_vocab` floats owned by the
        // context, valid until the next decode (which needs `&mut self`).
        Ok(unsafe { std::slice::from_raw_parts(p, self.n_vocab) })
    }

    /// Has llama.cpp take the argmax of sequence `seq`'s logits inside the
    /// decode graph, on the device that computes the output (its backend
    /// sampling, with hypura's two-stage argmax: [`super::argmax`]), or
    /// stops it. With it on, a decode copies no logits of
    /// that sequence to the host: [`Context::sampled_token`] gives the
    /// token, and [`Context::logits`] has nothing for its rows. Every
    /// change makes llama.cpp reserve its compute graphs again on the next
    /// decode, so callers keep it on across requests that want it. Returns
    /// whether it is on now (llama.cpp may decline, e.g. with a model split
    /// by tensor over several GPUs).
    pub fn set_device_greedy(&mut self, seq: i32, on: bool) -> bool {
        if on == self.device_greedy.contains_key(&seq) {
            return on;
        }
        if !on {
            if let Some(chain) = self.device_greedy.remove(&seq) {
                // SAFETY: detaches the sampler (llama.cpp stops using it at
                // once), then frees the chain and the greedy sampler it owns.
                unsafe {
                    sys::llama_set_sampler(self.raw.as_ptr(), seq, std::ptr::null_mut());
                    sys::llama_sampler_free(chain.as_ptr());
                }
            }
            return false;
        }
        // SAFETY: a new chain owning a new greedy sampler; the context
        // keeps a pointer to it, so it lives in `device_greedy` until
        // detached or until the context is freed.
        let chain = unsafe {
            let mut params = sys::llama_sampler_chain_default_params();
            params.no_perf = true;
            let chain = sys::llama_sampler_chain_init(params);
            if !chain.is_null() {
                let greedy = super::argmax::new_sampler(self.n_vocab)
                    .unwrap_or_else(|| sys::llama_sampler_init_greedy());
                sys::llama_sampler_chain_add(chain, greedy);
            }
            chain
        };
        let Some(chain) = NonNull::new(chain) else {
            return false;
        };
        // SAFETY: both alive; see above for the chain's lifetime.
        if unsafe { sys::llama_set_sampler(self.raw.as_ptr(), seq, chain.as_ptr()) } {
            self.device_greedy.insert(seq, chain);
            true
        } else {
            // SAFETY: llama.cpp declined it and keeps no pointer to it.
            unsafe { sys::llama_sampler_free(chain.as_ptr()) };
            false
        }
    }

    /// Whether sequence `seq` is sampled greedily inside the decode graph.
    pub fn device_greedy(&self, seq: i32) -> bool {
        self.device_greedy.contains_key(&seq)
    }

    /// The sampler taking sequence `seq`'s argmax inside the decode graph:
    /// `greedy-two-stage` ([`super::argmax`]), or llama.cpp's `greedy` where
    /// the vocabulary size has no split.
    pub fn device_greedy_name(&self, seq: i32) -> Option<String> {
        let chain = self.device_greedy.get(&seq)?;
        // SAFETY: the chain is alive and holds one sampler; its name is a
        // static C string.
        unsafe {
            let greedy = sys::llama_sampler_chain_get(chain.as_ptr(), 0);
            let name = sys::llama_sampler_name(greedy);
            (!name.is_null()).then(|| {
                std::ffi::CStr::from_ptr(name)
                    .to_string_lossy()
                    .into_owned()
            })
        }
    }

    /// The token llama.cpp's own sampler chose for output row `i` of the
    /// last decode ([`Context::set_device_greedy`]), if it chose one.
    pub fn sampled_token(&self, i: i32) -> Option<i32> {
        // SAFETY: the context is alive; LLAMA_TOKEN_NULL when nothing was sampled.
        let token = unsafe { sys::llama_get_sampled_token_ith(self.raw.as_ptr(), i) };
        (token != LLAMA_TOKEN_NULL).then_some(token)
    }

    /// The pooled embedding of a sequence (contexts made with `embeddings`).
    pub fn embeddings_seq(&self, seq: i32) -> Option<&[f32]> {
        // SAFETY: the context is alive; NULL when there is no such embedding.
        let p = unsafe { sys::llama_get_embeddings_seq(self.raw.as_ptr(), seq) };
        if p.is_null() {
            return None;
        }
        // SAFETY: points at `n_embd` floats owned by the context until the next decode.
        Some(unsafe { std::slice::from_raw_parts(p, self.model.n_embd()) })
    }

    /// Forgets the KV cache of `seq` from position `from` on (`-1` = all of it).
    pub fn clear_seq(&mut self, seq: i32, from: i32) {
        // SAFETY: the context and its memory are alive.
        unsafe {
            let mem = sys::llama_get_memory(self.raw.as_ptr());
            sys::llama_memory_seq_rm(mem, seq, from, -1);
        }
    }

    /// Forgets the KV cache of `seq` from position `from` on, keeping the
    /// positions before it usable: false (and `seq` emptied) when the memory
    /// cannot cut a sequence there (recurrent state), or when a sliding
    /// window already dropped cells the kept prefix's next tokens would
    /// attend to (as llama-server decides it).
    pub fn trim_seq(&mut self, seq: i32, from: i32) -> bool {
        let n_swa = self.model.n_swa().max(1) as i32;
        // SAFETY: the context and its memory are alive.
        let (pos_min, cut) = unsafe {
            let mem = sys::llama_get_memory(self.raw.as_ptr());
            let pos_min = sys::llama_memory_seq_pos_min(mem, seq);
            (pos_min, sys::llama_memory_seq_rm(mem, seq, from, -1))
        };
        let window_intact = pos_min <= (from - n_swa).max(0);
        if cut && window_intact {
            return true;
        }
        self.clear_seq(seq, -1);
        false
    }

    /// Makes `dst` hold a copy of `src`'s KV cache (`dst`'s own is
    /// dropped): false, and nothing done, for a model whose memory is not a
    /// plain KV cache (recurrent or hybrid state). Across streams llama.cpp
    /// copies the whole stream at the start of the next decode, so `src`'s
    /// cells must not be written before then (a state load into `src`
    /// would be copied instead).
    pub fn copy_seq(&mut self, src: i32, dst: i32) -> bool {
        // SAFETY: the model is alive while the context is.
        let plain = unsafe {
            let model = self.model.as_ptr();
            !sys::llama_model_is_recurrent(model) && !sys::llama_model_is_hybrid(model)
        };
        if !plain {
            return false;
        }
        self.clear_seq(dst, -1);
        // SAFETY: the context and its memory are alive; both ids are below
        // the context's `n_seq_max` (the worker's slots).
        unsafe {
            let mem = sys::llama_get_memory(self.raw.as_ptr());
            sys::llama_memory_seq_cp(mem, src, dst, -1, -1);
        }
        true
    }

    /// Empties the whole KV cache.
    pub fn clear_all(&mut self) {
        // SAFETY: the context and its memory are alive.
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(self.raw.as_ptr()), true) }
    }

    pub fn perf(&self) -> PerfTimings {
        // SAFETY: the context is alive.
        let p = unsafe { sys::llama_perf_context(self.raw.as_ptr()) };
        PerfTimings {
            load_ms: p.t_load_ms,
            prompt_eval_ms: p.t_p_eval_ms,
            prompt_tokens: p.n_p_eval.max(0) as u32,
            eval_ms: p.t_eval_ms,
            eval_tokens: p.n_eval.max(0) as u32,
        }
    }

    pub fn reset_perf(&mut self) {
        // SAFETY: the context is alive.
        unsafe { sys::llama_perf_context_reset(self.raw.as_ptr()) }
    }

    pub(crate) fn as_ptr(&mut self) -> *mut sys::llama_context {
        self.raw.as_ptr()
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the context is alive and dropped once; the model outlives
        // it. The device samplers it pointed at are freed after it.
        unsafe {
            sys::llama_free(self.raw.as_ptr());
            for chain in self.device_greedy.values() {
                sys::llama_sampler_free(chain.as_ptr());
            }
        }
    }
}

/// Memory a context holds beside the model's weights: its KV cache (and
/// recurrent state), its compute buffers and its output buffer (logits and
/// embeddings, sized for one output per sequence; llama.cpp grows it when a
/// batch asks for more outputs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ContextMemory {
    /// Bytes in host RAM (buffer types `CPU`, `CUDA_Host`…).
    pub ram_bytes: u64,
    /// Bytes in GPU memory, all GPUs together (`CUDA0`…).
    pub gpu_bytes: u64,
    /// Of `ram_bytes + gpu_bytes`: the KV cache and recurrent state.
    pub kv_bytes: u64,
    /// Of `ram_bytes + gpu_bytes`: the compute buffers.
    pub compute_bytes: u64,
    /// Of `ram_bytes`: the KV cache and recurrent state in host memory.
    pub ram_kv_bytes: u64,
    /// Host memory the model's metadata holds, outside `ram_bytes`: what
    /// the process's resident set grew by over a metadata-only load of it
    /// (vocabulary, tensor descriptions, the GGUF header as read). Only
    /// [`crate::tiered::context_memory`] measures it (0 elsewhere), once
    /// for all its contexts.
    pub metadata_bytes: u64,
}

impl std::ops::AddAssign for ContextMemory {
    fn add_assign(&mut self, other: ContextMemory) {
        self.ram_bytes += other.ram_bytes;
        self.gpu_bytes += other.gpu_bytes;
        self.kv_bytes += other.kv_bytes;
        self.compute_bytes += other.compute_bytes;
        self.ram_kv_bytes += other.ram_kv_bytes;
        self.metadata_bytes += other.metadata_bytes;
    }
}

/// One line of llama.cpp's log that tells a size (see [`ContextMemory::from_log`]).
#[derive(Debug, PartialEq)]
enum SizeLine<'a> {
    /// `<func>: <buffer type> <kind> buffer size = <x> MiB`, kind being
    /// `KV`, `RS`, `compute` or `output`.
    Buffer {
        buffer_type: &'a str,
        kind: &'a str,
        bytes: u64,
    },
    /// `llama_kv_cache: layer <i>: dev = <device>` (debug level): the device
    /// of one layer's KV cache (`CPU` when not offloaded).
    Layer { device: &'a str },
    /// `<func>: size = <x> MiB (<n> cells, …)`: the total of one cache, which
    /// follows its layer and buffer lines.
    CacheTotal { bytes: u64 },
}

/// `"   24.00 MiB…"` → bytes (llama.cpp prints MiB with two decimals: ±5 KiB).
fn parse_mib(text: &str) -> Option<u64> {
    let mib: f64 = text
        .trim_start()
        .split(" MiB")
        .next()?
        .trim()
        .parse()
        .ok()?;
    (mib.is_finite() && mib >= 0.0).then(|| (mib * 1024.0 * 1024.0).round() as u64)
}

fn parse_size_line(line: &str) -> Option<SizeLine<'_>> {
    if let Some((left, right)) = line.split_once(" buffer size = ") {
        let mut words = left.split_whitespace().rev();
        let kind = words.next()?;
        let buffer_type = words.next()?;
        return Some(SizeLine::Buffer {
            buffer_type,
            kind,
            bytes: parse_mib(right)?,
        });
    }
    if let Some((left, device)) = line.split_once(": dev = ") {
        return left.contains("layer").then_some(SizeLine::Layer {
            device: device.trim(),
        });
    }
    let (_, right) = line.split_once(": size = ")?;
    right.contains(" cells").then_some(())?;
    Some(SizeLine::CacheTotal {
        bytes: parse_mib(right)?,
    })
}

impl ContextMemory {
    /// Host memory charged beside the weights and the KV cache: compute and
    /// output buffers in RAM, and the model's metadata.
    pub fn ram_other_bytes(&self) -> u64 {
        (self.ram_bytes - self.ram_kv_bytes) + self.metadata_bytes
    }

    fn add_kv(&mut self, buffer_type: &str, bytes: u64) {
        self.kv_bytes += bytes;
        if super::backend::is_host_memory(buffer_type) {
            self.ram_kv_bytes += bytes;
        }
    }

    /// Sums the sizes llama.cpp logged while creating one context (lines
    /// it does not recognise are ignored). A KV cache whose buffer lines say
    /// 0 bytes (llama.cpp's metadata-only `no_alloc` mode logs its dummy
    /// buffers) is charged its logged total instead, split between devices
    /// by the number of its layers on each (exact when its layers are all
    /// alike, as in nearly every model). Fails when no compute buffer size
    /// was logged: then this llama.cpp logs differently and nothing can be
    /// measured.
    pub(crate) fn from_log(lines: &[String]) -> Result<ContextMemory, String> {
        let mut by_type: BTreeMap<&str, u64> = BTreeMap::new();
        let mut memory = ContextMemory::default();
        let mut compute_lines = 0;
        // The cache being logged: its layers per device and its buffer lines.
        let mut layers: BTreeMap<&str, u64> = BTreeMap::new();
        let mut buffers: BTreeMap<&str, u64> = BTreeMap::new();
        for line in lines {
            match parse_size_line(line) {
                Some(SizeLine::Buffer {
                    buffer_type,
                    kind,
                    bytes,
                }) => match kind {
                    "KV" | "RS" => *buffers.entry(buffer_type).or_default() += bytes,
                    "compute" | "output" => {
                        if kind == "compute" {
                            compute_lines += 1;
                            memory.compute_bytes += bytes;
                        }
                        *by_type.entry(buffer_type).or_default() += bytes;
                    }
                    _ => {}
                },
                Some(SizeLine::Layer { device }) => *layers.entry(device).or_default() += 1,
                Some(SizeLine::CacheTotal { bytes }) => {
                    let cache = if buffers.values().sum::<u64>() > 0 || bytes == 0 {
                        std::mem::take(&mut buffers)
                    } else {
                        split_by_layers(bytes, &layers).ok_or_else(|| {
                            format!("llama.cpp logged a cache of {bytes} bytes but not the devices of its layers")
                        })?
                    };
                    for (buffer_type, bytes) in cache {
                        memory.add_kv(buffer_type, bytes);
                        *by_type.entry(buffer_type).or_default() += bytes;
                    }
                    layers.clear();
                    buffers.clear();
                }
                None => {}
            }
        }
        // Buffer lines of a cache whose total was not logged.
        for (buffer_type, bytes) in buffers {
            memory.add_kv(buffer_type, bytes);
            *by_type.entry(buffer_type).or_default() += bytes;
        }
        if compute_lines == 0 {
            return Err(
                "llama.cpp logged no compute buffer size while creating the context, so its memory cannot be measured"
                    .into(),
            );
        }
        for (buffer_type, bytes) in by_type {
            if super::backend::is_host_memory(buffer_type) {
                memory.ram_bytes += bytes;
            } else {
                memory.gpu_bytes += bytes;
            }
        }
        Ok(memory)
    }
}

/// `bytes` shared between devices in proportion to their layer counts (the
/// rounding remainder goes to the last); `None` without any layer.
fn split_by_layers<'a>(
    bytes: u64,
    layers: &BTreeMap<&'a str, u64>,
) -> Option<BTreeMap<&'a str, u64>> {
    let total: u64 = layers.values().sum();
    if total == 0 {
        return None;
    }
    let mut left = bytes;
    let mut shares: BTreeMap<&str, u64> = BTreeMap::new();
    for (i, (&device, &n)) in layers.iter().enumerate() {
        let share = if i + 1 == layers.len() {
            left
        } else {
            (bytes as u128 * n as u128 / total as u128) as u64
        };
        left -= share;
        shares.insert(device, share);
    }
    Some(shares)
}

/// A batch of tokens, each with its position, sequence and output flag.
pub struct Batch {
    raw: sys::llama_batch,
    capacity: usize,
}

// SAFETY: the batch owns its arrays; nothing else points into them.
unsafe impl Send for Batch {}

impl Batch {
    /// A batch of at most `capacity` tokens, each in one sequence.
    pub fn new(capacity: usize) -> Batch {
        let capacity = capacity.max(1);
        // SAFETY: allocates arrays for `capacity` tokens with one seq id each.
        let raw = unsafe { sys::llama_batch_init(capacity as i32, 0, 1) };
        Batch { raw, capacity }
    }

    pub fn len(&self) -> usize {
        self.raw.n_tokens as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn clear(&mut self) {
        self.raw.n_tokens = 0;
    }

    /// Tokens that ask for logits.
    pub fn n_outputs(&self) -> usize {
        // SAFETY: the first `len()` entries of `logits` were written by `push`.
        (0..self.len())
            .filter(|&i| unsafe { *self.raw.logits.add(i) } != 0)
            .count()
    }

    /// Appends a token; returns its row (for [`Context::logits`] when `output`).
    pub fn push(
        &mut self,
        token: i32,
        pos: i32,
        seq: i32,
        output: bool,
    ) -> Result<i32, EngineError> {
        let i = self.len();
        if i >= self.capacity {
            return Err(EngineError::InvalidArgument(format!(
                "batch full ({} tokens)",
                self.capacity
            )));
        }
        // SAFETY: `i < capacity`, and every array was allocated for `capacity`
        // entries (seq_id rows for one id each).
        unsafe {
            *self.raw.token.add(i) = token;
            *self.raw.pos.add(i) = pos;
            *self.raw.n_seq_id.add(i) = 1;
            *(*self.raw.seq_id.add(i)) = seq;
            *self.raw.logits.add(i) = output as i8;
        }
        self.raw.n_tokens += 1;
        Ok(i as i32)
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        // SAFETY: the arrays were allocated by `llama_batch_init` and freed once.
        unsafe { sys::llama_batch_free(self.raw) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(|l| l.trim().to_owned()).collect()
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn size_lines_are_recognised_and_others_ignored() {
        assert_eq!(
            parse_size_line("llama_context:        CPU  output buffer size =     0.75 MiB"),
            Some(SizeLine::Buffer {
                buffer_type: "CPU",
                kind: "output",
                bytes: 3 * MIB / 4
            })
        );
        assert_eq!(
            parse_size_line("sched_reserve:  CUDA_Host compute buffer size =   102.14 MiB"),
            Some(SizeLine::Buffer {
                buffer_type: "CUDA_Host",
                kind: "compute",
                bytes: (102.14 * MIB as f64).round() as u64
            })
        );
        assert_eq!(
            parse_size_line("llama_kv_cache: layer  29: dev = CUDA0"),
            Some(SizeLine::Layer { device: "CUDA0" })
        );
        assert_eq!(
            parse_size_line("llama_kv_cache: size =   45.00 MiB (   512 cells,  30 layers,  4/4 seqs), K (f16):   22.50 MiB, V (f16):   22.50 MiB"),
            Some(SizeLine::CacheTotal { bytes: 45 * MIB })
        );
        for other in [
            "~llama_context:        CPU compute buffer size is 102.1445 MiB, matches expectation of 102.1445 MiB",
            "llama_context: n_ctx                 = 2048",
            "sched_reserve: reserve took 4.29 ms, sched copies = 1",
            "llama_context:        CPU compute buffer size =   lots MiB",
        ] {
            assert_eq!(parse_size_line(other), None, "{other}");
        }
    }

    #[test]
    fn real_kv_buffers_are_taken_as_logged() {
        let memory = ContextMemory::from_log(&lines(
            "llama_context:        CPU  output buffer size =     0.75 MiB
             llama_kv_cache: layer   0: dev = CPU
             llama_kv_cache: layer   1: dev = CUDA0
             llama_kv_cache:      CUDA0 KV buffer size =    30.00 MiB
             llama_kv_cache:        CPU KV buffer size =    10.00 MiB
             llama_kv_cache: size =   40.00 MiB (   512 cells,  2 layers,  4/4 seqs), K (f16):   20.00 MiB, V (f16):   20.00 MiB
             sched_reserve:      CUDA0 compute buffer size =   100.00 MiB
             sched_reserve:  CUDA_Host compute buffer size =     4.00 MiB",
        ))
        .unwrap();
        assert_eq!(
            memory,
            ContextMemory {
                ram_bytes: 10 * MIB + 4 * MIB + 3 * MIB / 4,
                gpu_bytes: 30 * MIB + 100 * MIB,
                kv_bytes: 40 * MIB,
                compute_bytes: 104 * MIB,
                ram_kv_bytes: 10 * MIB,
                metadata_bytes: 0,
            }
        );
    }

    #[test]
    fn simulated_kv_buffers_are_split_by_layer_devices() {
        // `no_alloc`: dummy KV buffers of 0 bytes; two caches (as with
        // sliding-window attention), each split by its own layers.
        let memory = ContextMemory::from_log(&lines(
            "llama_kv_cache: layer   0: dev = CPU
             llama_kv_cache: layer   1: dev = CUDA0
             llama_kv_cache: layer   2: dev = CUDA0
             llama_kv_cache: layer   3: dev = CUDA0
             llama_kv_cache:        CPU KV buffer size =     0.00 MiB
             llama_kv_cache:      CUDA0 KV buffer size =     0.00 MiB
             llama_kv_cache: size =   40.00 MiB (   512 cells,  4 layers,  1/1 seqs), K (f16):   20.00 MiB, V (f16):   20.00 MiB
             llama_kv_cache: layer   4: dev = CUDA0
             llama_kv_cache:      CUDA0 KV buffer size =     0.00 MiB
             llama_kv_cache: size =    2.00 MiB (   256 cells,  1 layers,  1/1 seqs), K (f16):    1.00 MiB, V (f16):    1.00 MiB
             sched_reserve:        CPU compute buffer size =     8.00 MiB",
        ))
        .unwrap();
        assert_eq!(memory.kv_bytes, 42 * MIB);
        assert_eq!(memory.ram_bytes, 10 * MIB + 8 * MIB);
        assert_eq!(memory.gpu_bytes, 30 * MIB + 2 * MIB);
    }

    #[test]
    fn no_compute_line_or_no_device_is_an_error() {
        let err = ContextMemory::from_log(&lines(
            "llama_kv_cache:        CPU KV buffer size =    45.00 MiB",
        ))
        .unwrap_err();
        assert!(err.contains("no compute buffer size"), "{err}");
        let err = ContextMemory::from_log(&lines(
            "llama_kv_cache: size =   40.00 MiB (   512 cells,  4 layers,  1/1 seqs), K (f16):   20.00 MiB, V (f16):   20.00 MiB
             sched_reserve:        CPU compute buffer size =     8.00 MiB",
        ))
        .unwrap_err();
        assert!(err.contains("devices of its layers"), "{err}");
    }

    #[test]
    fn buffer_names_are_split_between_host_and_gpu() {
        for host in ["CPU", "CUDA_Host", "CPU_REPACK"] {
            assert!(super::super::backend::is_host_memory(host), "{host}");
        }
        for gpu in ["CUDA0", "CUDA1"] {
            assert!(!super::super::backend::is_host_memory(gpu), "{gpu}");
        }
    }
}
