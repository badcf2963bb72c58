//! A loaded llama.cpp model and its vocabulary.
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

use hypura_llama_sys as sys;

use super::backend::{gpu_devices, gpu_handles};
use super::stream::{LoadFile, LoadReport, StreamBufferType};
use crate::error::EngineError;

/// How a model's weights are read at load time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoadMode {
    /// Read the weights into anonymous memory (no page-cache mapping): the
    /// resident set is exactly what hypura placed.
    #[default]
    Read,
    /// Memory-map the file (llama.cpp's default; shares the page cache).
    Mmap,
}

/// Which weights one GPU holds, in llama.cpp's terms (`tiered::gpu` derives
/// it from a placement). Everything not named stays where llama.cpp puts it
/// for `n_gpu_layers`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuOffload {
    /// Index of the GPU among [`super::gpu_devices`].
    pub gpu_index: usize,
    /// llama.cpp's `n_gpu_layers`: the last this-many layers, their KV cache
    /// and their compute go to the GPU; more than the layer count also takes
    /// the output layer.
    pub n_gpu_layers: u32,
    /// Anchored regexes of tensors placed in GPU memory against that default.
    pub gpu_patterns: Vec<String>,
    /// Anchored regexes of tensors kept in host RAM against that default.
    pub ram_patterns: Vec<String>,
    /// Bytes of weights the GPU will hold, checked against its free memory.
    pub gpu_weight_bytes: u64,
}

impl GpuOffload {
    /// `n_gpu_layers` when no tensor is kept in host memory against it: the
    /// GPU then computes every layer those count.
    fn layers_if_none_on_host(&self) -> Option<u32> {
        self.ram_patterns.is_empty().then_some(self.n_gpu_layers)
    }
}

/// Options for [`Model::load`].
#[derive(Default)]
pub struct ModelParams<'a> {
    /// Layers to offload to a GPU (`-1` = all, `0` = none); ignored with `gpu`.
    pub n_gpu_layers: i32,
    /// Weights on one GPU (an error when this build sees no GPU).
    pub gpu: Option<GpuOffload>,
    pub load_mode: LoadMode,
    /// Keep weights in their file layout: no CPU "repack" buffer types. Those
    /// speed up some types (Q4_0, Q4_K, IQ4_NL, Q8_0 on x86) but cannot apply
    /// to streamed tensors, so exact comparisons with streaming modes need it.
    pub no_repack: bool,
    /// Called with the load fraction in `[0, 1]`; returning `false` aborts the load.
    pub progress: Option<&'a mut dyn FnMut(f32) -> bool>,
}

/// A model loaded by llama.cpp. Immutable after load, so it is shared between
/// threads and contexts (llama.cpp only reads it during decoding).
pub struct Model {
    raw: NonNull<sys::llama_model>,
    path: PathBuf,
    /// The STREAM buffer type its STREAM tensors live in; dropped after the model.
    _stream: Option<StreamBufferType>,
    /// The offload's `n_gpu_layers` when it keeps no tensor on the host and
    /// nothing streams ([`Model::host_input_only`]).
    gpu_layers_alone: Option<u32>,
}

/// llama.cpp's device and buffer-type settings for one load; the pointers
/// in `overrides` and `devices` point into this value, so it must stay put
/// until `llama_model_load_from_file*` returns.
struct DeviceSetup {
    _patterns: Vec<CString>,
    overrides: Vec<sys::llama_model_tensor_buft_override>,
    devices: Vec<sys::ggml_backend_dev_t>,
    n_gpu_layers: i32,
}

impl DeviceSetup {
    /// `stream`: the STREAM patterns and buffer type, matched after the GPU
    /// and RAM patterns (those name exact tensors, never STREAM ones).
    fn new(
        gpu: Option<&GpuOffload>,
        stream: Option<(&[String], sys::ggml_backend_buffer_type_t)>,
        default_n_gpu_layers: i32,
    ) -> Result<DeviceSetup, EngineError> {
        let mut rules: Vec<(&str, sys::ggml_backend_buffer_type_t)> = Vec::new();
        let mut devices = Vec::new();
        let mut n_gpu_layers = default_n_gpu_layers;
        if let Some(gpu) = gpu {
            let dev = gpu_device(gpu)?;
            // SAFETY: registry handles live as long as the process.
            let (gpu_buft, ram_buft) = unsafe {
                (
                    sys::ggml_backend_dev_buffer_type(dev),
                    // llama.cpp treats the plain CPU type as "the RAM tier":
                    // it then picks among host types as for a CPU layer.
                    sys::ggml_backend_cpu_buffer_type(),
                )
            };
            rules.extend(gpu.gpu_patterns.iter().map(|p| (p.as_str(), gpu_buft)));
            rules.extend(gpu.ram_patterns.iter().map(|p| (p.as_str(), ram_buft)));
            devices = vec![dev, std::ptr::null_mut()];
            n_gpu_layers = i32::try_from(gpu.n_gpu_layers).unwrap_or(i32::MAX);
        }
        if let Some((patterns, buft)) = stream {
            rules.extend(patterns.iter().map(|p| (p.as_str(), buft)));
        }
        let patterns: Vec<CString> = rules
            .iter()
            .map(|(p, _)| {
                CString::new(*p).map_err(|_| EngineError::InvalidArgument(format!("pattern {p:?}")))
            })
            .collect::<Result<_, _>>()?;
        let mut overrides: Vec<sys::llama_model_tensor_buft_override> = patterns
            .iter()
            .zip(&rules)
            .map(|(p, (_, buft))| sys::llama_model_tensor_buft_override {
                pattern: p.as_ptr(),
                buft: *buft,
            })
            .collect();
        overrides.push(sys::llama_model_tensor_buft_override {
            pattern: std::ptr::null(),
            buft: std::ptr::null_mut(),
        });
        Ok(DeviceSetup {
            _patterns: patterns,
            overrides,
            devices,
            n_gpu_layers,
        })
    }

    /// Sets the device fields of `params`; `self` must outlive the load call.
    fn apply(&mut self, params: &mut sys::llama_model_params) {
        params.n_gpu_layers = self.n_gpu_layers;
        if self.overrides.len() > 1 {
            params.tensor_buft_overrides = self.overrides.as_ptr();
        }
        if !self.devices.is_empty() {
            // One GPU: no layer split between devices.
            params.devices = self.devices.as_mut_ptr();
            params.split_mode = sys::LLAMA_SPLIT_MODE_NONE;
            params.main_gpu = 0;
        }
    }
}

/// The GPU `gpu` names, after checking it exists and has room for the weights.
fn gpu_device(gpu: &GpuOffload) -> Result<sys::ggml_backend_dev_t, EngineError> {
    let handles = gpu_handles();
    let devices = gpu_devices();
    let (Some(&dev), Some(info)) = (handles.get(gpu.gpu_index), devices.get(gpu.gpu_index)) else {
        return Err(EngineError::InvalidArgument(if devices.is_empty() {
            format!(
                "the placement puts {} bytes of weights on the GPU tier, but this build of hypura sees no GPU \
                 (a CPU-only llama.cpp, or no device found): drop --gpu-layers/--gpu-budget, or run hypura over a CUDA build of llama.cpp",
                gpu.gpu_weight_bytes
            )
        } else {
            format!(
                "GPU {} does not exist: this machine has {} ({})",
                gpu.gpu_index,
                devices.len(),
                devices
                    .iter()
                    .map(|d| d.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }));
    };
    if gpu.gpu_weight_bytes > info.free_bytes {
        return Err(EngineError::InvalidArgument(format!(
            "the placement puts {} bytes of weights on {} ({}), which has {} bytes free: lower --gpu-budget or --gpu-layers",
            gpu.gpu_weight_bytes, info.name, info.description, info.free_bytes
        )));
    }
    Ok(dev)
}

// SAFETY: a `llama_model` is not mutated after loading; llama.cpp's server
// shares one model between many contexts on many threads.
unsafe impl Send for Model {}
// SAFETY: as above, every method used through `&Model` only reads.
unsafe impl Sync for Model {}

unsafe extern "C" fn progress_trampoline(progress: f32, user_data: *mut c_void) -> bool {
    // SAFETY: `user_data` is the `&mut &mut dyn FnMut` set up in `Model::load`,
    // alive for the whole `llama_model_load_from_file` call.
    let callback = unsafe { &mut *(user_data as *mut &mut dyn FnMut(f32) -> bool) };
    callback(progress)
}

impl Model {
    /// Loads a GGUF file. The file is checked by hypura's own reader first
    /// (header, tensors inside the file, tokenizer sanity, architecture) so a
    /// malformed file is an error rather than a crash inside llama.cpp.
    pub fn load(path: &Path, params: ModelParams<'_>) -> Result<Model, EngineError> {
        hypura_gguf::GgufFile::open(path)?.validate()?;
        super::backend::init();
        let c_path = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| {
            EngineError::InvalidArgument(format!("path {} contains a NUL byte", path.display()))
        })?;

        let gpu_layers_alone = params
            .gpu
            .as_ref()
            .and_then(GpuOffload::layers_if_none_on_host);
        let mut devices = DeviceSetup::new(params.gpu.as_ref(), None, params.n_gpu_layers)?;
        // SAFETY: returns a plain struct of defaults.
        let mut raw_params = unsafe { sys::llama_model_default_params() };
        devices.apply(&mut raw_params);
        raw_params.use_extra_bufts = !params.no_repack;
        raw_params.load_mode = match params.load_mode {
            LoadMode::Read => sys::LLAMA_LOAD_MODE_NONE,
            LoadMode::Mmap => sys::LLAMA_LOAD_MODE_MMAP,
        };
        let mut progress = params.progress;
        let mut aborted_by_caller = false;
        let mut wrapped = |p: f32| match progress.as_mut() {
            Some(cb) => {
                let keep_going = cb(p);
                aborted_by_caller |= !keep_going;
                keep_going
            }
            None => true,
        };
        let mut callback: &mut dyn FnMut(f32) -> bool = &mut wrapped;
        raw_params.progress_callback = Some(progress_trampoline);
        raw_params.progress_callback_user_data = &mut callback as *mut _ as *mut c_void;

        // SAFETY: the path is NUL-terminated; the progress callback and its
        // data, and the device setup, outlive the call; llama.cpp catches its
        // own exceptions and returns NULL on failure.
        let raw = unsafe { sys::llama_model_load_from_file(c_path.as_ptr(), raw_params) };
        drop(devices);
        match NonNull::new(raw) {
            Some(raw) => Ok(Model {
                raw,
                path: path.to_path_buf(),
                _stream: None,
                gpu_layers_alone,
            }),
            None if aborted_by_caller => Err(EngineError::Cancelled),
            None => Err(EngineError::Load {
                path: path.to_path_buf(),
                reason: "llama.cpp could not load it (set RUST_LOG=llama.cpp=debug for its log)"
                    .into(),
            }),
        }
    }

    /// Loads a GGUF with some tensors on the STREAM tier: those whose names
    /// match one of `stream_patterns` (anchored regexes, first match wins) go
    /// to `stream_buft`, which places them at their file offsets, and their
    /// bytes (`stream_ranges` of the file) are not read; `tensor_starts`
    /// (the data offsets of all tensors) bound reads. Everything else is
    /// loaded by llama.cpp's own loader as in [`Model::load`] (read mode),
    /// on `gpu` where given (STREAM tensors always stay in host memory).
    #[allow(clippy::too_many_arguments)]
    pub fn load_tiered(
        path: &Path,
        tensor_starts: Vec<u64>,
        stream_ranges: Vec<(u64, u64)>,
        stream_patterns: &[String],
        stream_buft: StreamBufferType,
        gpu: Option<&GpuOffload>,
        no_repack: bool,
        progress: Option<&mut dyn FnMut(f32) -> bool>,
    ) -> Result<(Model, LoadReport), EngineError> {
        let mut progress = progress;
        let mut keep_going = |p: f32| progress.as_mut().is_none_or(|cb| cb(p));
        let mut callback: &mut dyn FnMut(f32) -> bool = &mut keep_going;
        super::backend::init();
        let load_error = |reason: String| EngineError::Load {
            path: path.to_path_buf(),
            reason,
        };
        let file = std::fs::File::open(path).map_err(|e| load_error(e.to_string()))?;
        let mut load_file = LoadFile::new(file, stream_ranges, tensor_starts)
            .map_err(|e| load_error(e.to_string()))?;

        let gpu_layers_alone = gpu
            .and_then(GpuOffload::layers_if_none_on_host)
            .filter(|_| stream_patterns.is_empty());
        let mut devices = DeviceSetup::new(gpu, Some((stream_patterns, stream_buft.handle())), 0)?;

        let fp = load_file.open().map_err(|e| load_error(e.to_string()))?;
        // SAFETY: plain defaults, then pointers that outlive the call: the
        // device setup (override list, patterns, device list), and the FILE
        // (closed right after).
        let raw = unsafe {
            let mut params = sys::llama_model_default_params();
            devices.apply(&mut params);
            params.load_mode = sys::LLAMA_LOAD_MODE_NONE;
            params.use_extra_bufts = !no_repack;
            params.progress_callback = Some(progress_trampoline);
            params.progress_callback_user_data = &mut callback as *mut _ as *mut c_void;
            sys::llama_model_load_from_file_ptr(fp.cast(), params)
        };
        drop(devices);
        let (report, read_error) = load_file.close(fp);
        stream_buft.finish_loading();
        let Some(raw) = NonNull::new(raw) else {
            return Err(load_error(read_error.map_or(
                "llama.cpp could not load it (RUST_LOG=llama.cpp=debug shows why)".into(),
                |e| e.to_string(),
            )));
        };
        let model = Model {
            raw,
            path: path.to_path_buf(),
            _stream: Some(stream_buft),
            gpu_layers_alone,
        };
        if let Some(e) = read_error {
            return Err(load_error(e.to_string()));
        }
        Ok((model, report))
    }

    /// llama.cpp's metadata-only load (`no_alloc`): the tensors are described
    /// and placed as [`Model::load`] (no `stream_patterns`) or
    /// [`Model::load_tiered`] would place them, with the same device setup,
    /// but no weight is allocated or read. A context over it simulates its
    /// own allocations and logs their sizes: that is its only use (see
    /// [`super::Context::measured`]); it must never decode. STREAM tensors
    /// go to a STREAM buffer type of their own, as in a real load, so
    /// contexts schedule them alike. The caller
    /// has validated the file (as [`crate::tiered::context_memory`] does).
    pub(crate) fn load_no_alloc(
        path: &Path,
        stream_patterns: &[String],
        gpu: Option<&GpuOffload>,
        no_repack: bool,
    ) -> Result<Model, EngineError> {
        super::backend::init();
        let load_error = |reason: String| EngineError::Load {
            path: path.to_path_buf(),
            reason,
        };
        let c_path = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| load_error("the path contains a NUL byte".into()))?;
        // Never asked to place a tensor (no allocation happens): an empty
        // table and a one-page region.
        let stream = if stream_patterns.is_empty() {
            None
        } else {
            let region = super::stream::StreamRegion::reserve(super::stream::PAGE)
                .map_err(|e| load_error(e.to_string()))?;
            Some(StreamBufferType::new(Arc::new(region), HashMap::new()))
        };
        let mut devices = DeviceSetup::new(
            gpu,
            stream.as_ref().map(|s| (stream_patterns, s.handle())),
            0,
        )?;
        // SAFETY: plain defaults, then the device setup, which outlives the
        // call; the path is NUL-terminated; llama.cpp returns NULL on failure.
        let raw = unsafe {
            let mut params = sys::llama_model_default_params();
            devices.apply(&mut params);
            // Read mode, as both loads: llama.cpp's mmap path cannot do `no_alloc`.
            params.load_mode = sys::LLAMA_LOAD_MODE_NONE;
            params.use_extra_bufts = !no_repack;
            params.no_alloc = true;
            sys::llama_model_load_from_file(c_path.as_ptr(), params)
        };
        drop(devices);
        // Host memory from here on, as after a real load: a context's
        // scheduler aborts on weights no backend can use.
        if let Some(stream) = &stream {
            stream.finish_loading();
        }
        let raw = NonNull::new(raw).ok_or_else(|| {
            load_error("llama.cpp could not read it (RUST_LOG=llama.cpp=debug shows why)".into())
        })?;
        Ok(Model {
            raw,
            path: path.to_path_buf(),
            _stream: stream,
            gpu_layers_alone: None,
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::llama_model {
        self.raw.as_ptr()
    }

    pub(super) fn vocab(&self) -> *const sys::llama_vocab {
        // SAFETY: the model is alive; the vocab lives as long as the model.
        unsafe { sys::llama_model_get_vocab(self.raw.as_ptr()) }
    }

    /// The file this model was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Context length the model was trained with.
    pub fn n_ctx_train(&self) -> u32 {
        // SAFETY: the model is alive.
        unsafe { sys::llama_model_n_ctx_train(self.raw.as_ptr()) }.max(0) as u32
    }

    /// Sliding-window attention width (`0`: every layer sees the whole context).
    pub fn n_swa(&self) -> u32 {
        // SAFETY: the model is alive.
        unsafe { sys::llama_model_n_swa(self.raw.as_ptr()) }.max(0) as u32
    }

    pub fn n_embd(&self) -> usize {
        // SAFETY: the model is alive.
        unsafe { sys::llama_model_n_embd(self.raw.as_ptr()) }.max(0) as usize
    }

    /// Whether the host computes nothing of a decode but the input
    /// embeddings' row lookup (llama.cpp keeps `token_embd` on the CPU):
    /// every layer and the output layer are on the GPU (more GPU layers than
    /// repeating layers: the output layer counts as one more), nothing is
    /// kept in host memory against that, and nothing streams.
    pub fn host_input_only(&self) -> bool {
        self.gpu_layers_alone
            .is_some_and(|n| n as usize > self.n_layer())
    }

    pub fn n_layer(&self) -> usize {
        // SAFETY: the model is alive.
        unsafe { sys::llama_model_n_layer(self.raw.as_ptr()) }.max(0) as usize
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        // SAFETY: the vocab is alive with the model.
        unsafe { sys::llama_vocab_n_tokens(self.vocab()) }.max(0) as usize
    }

    /// Bytes of all weights.
    pub fn size_bytes(&self) -> u64 {
        // SAFETY: the model is alive.
        unsafe { sys::llama_model_size(self.raw.as_ptr()) }
    }

    pub fn n_params(&self) -> u64 {
        // SAFETY: the model is alive.
        unsafe { sys::llama_model_n_params(self.raw.as_ptr()) }
    }

    /// A metadata value as a string (`None` when absent).
    pub fn meta(&self, key: &str) -> Option<String> {
        let key = CString::new(key).ok()?;
        let mut buf = vec![0u8; 256];
        loop {
            // SAFETY: `buf` is writable for `buf.len()` bytes; the key is NUL-terminated.
            let n = unsafe {
                sys::llama_model_meta_val_str(
                    self.raw.as_ptr(),
                    key.as_ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            };
            if n < 0 {
                return None;
            }
            let n = n as usize;
            if n < buf.len() {
                buf.truncate(n);
                return Some(String::from_utf8_lossy(&buf).into_owned());
            }
            buf.resize(n + 1, 0);
        }
    }

    /// Beginning-of-sequence token, if the vocabulary has one.
    pub fn token_bos(&self) -> Option<i32> {
        // SAFETY: the vocab is alive with the model.
        let t = unsafe { sys::llama_vocab_bos(self.vocab()) };
        (t >= 0).then_some(t)
    }

    pub fn token_eos(&self) -> Option<i32> {
        // SAFETY: the vocab is alive with the model.
        let t = unsafe { sys::llama_vocab_eos(self.vocab()) };
        (t >= 0).then_some(t)
    }

    /// True for end-of-generation tokens (EOS, EOT, `<|im_end|>`…).
    pub fn is_eog(&self, token: i32) -> bool {
        // SAFETY: the vocab is alive with the model.
        unsafe { sys::llama_vocab_is_eog(self.vocab(), token) }
    }

    /// Whether tokenizing with `add_special` prepends a BOS token.
    pub fn adds_bos(&self) -> bool {
        // SAFETY: the vocab is alive with the model.
        unsafe { sys::llama_vocab_get_add_bos(self.vocab()) }
    }

    /// The text of a token as stored in the vocabulary (special tokens verbatim).
    pub fn token_text(&self, token: i32) -> Option<String> {
        if token < 0 || token as usize >= self.n_vocab() {
            return None;
        }
        // SAFETY: the token id is in range; the returned string lives with the vocab.
        let p = unsafe { sys::llama_vocab_get_text(self.vocab(), token) };
        if p.is_null() {
            return None;
        }
        // SAFETY: llama.cpp returns a NUL-terminated string.
        Some(
            unsafe { std::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned(),
        )
    }

    /// Tokenizes `text`. `add_special` adds BOS/EOS as the model is configured
    /// to; `parse_special` turns special-token text (e.g. `<|im_start|>`) into
    /// those tokens, as needed for rendered chat templates.
    pub fn tokenize(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<i32>, EngineError> {
        let len = i32::try_from(text.len())
            .map_err(|_| EngineError::InvalidArgument("text longer than 2 GiB".into()))?;
        let mut tokens = vec![0i32; text.len() + 8];
        loop {
            // SAFETY: `text` is valid for `len` bytes; `tokens` is writable for its length.
            let n = unsafe {
                sys::llama_tokenize(
                    self.vocab(),
                    text.as_ptr().cast(),
                    len,
                    tokens.as_mut_ptr(),
                    tokens.len() as i32,
                    add_special,
                    parse_special,
                )
            };
            if n >= 0 {
                tokens.truncate(n as usize);
                return Ok(tokens);
            }
            if n == i32::MIN {
                return Err(EngineError::InvalidArgument(
                    "tokenization overflowed".into(),
                ));
            }
            tokens.resize((-n) as usize, 0);
        }
    }

    /// The bytes a token stands for. May be part of a UTF-8 character;
    /// control tokens render as their text only when `special` is set.
    pub fn token_to_bytes(&self, token: i32, special: bool) -> Vec<u8> {
        let mut buf = vec![0u8; 64];
        loop {
            // SAFETY: `buf` is writable for `buf.len()` bytes.
            let n = unsafe {
                sys::llama_token_to_piece(
                    self.vocab(),
                    token,
                    buf.as_mut_ptr().cast(),
                    buf.len() as i32,
                    0,
                    special,
                )
            };
            if n >= 0 {
                buf.truncate(n as usize);
                return buf;
            }
            buf.resize((-n) as usize, 0);
        }
    }

    /// Detokenizes a whole sequence (lossy for invalid UTF-8).
    pub fn detokenize(&self, tokens: &[i32], special: bool) -> String {
        let bytes: Vec<u8> = tokens
            .iter()
            .flat_map(|&t| self.token_to_bytes(t, special))
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: every `Context` holds an `Arc<Model>`, so no context outlives this.
        unsafe { sys::llama_model_free(self.raw.as_ptr()) }
    }
}
