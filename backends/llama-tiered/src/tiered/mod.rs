//! Tiered weights: load a model with some tensors left on disk (the STREAM
//! tier) and stream them in exactly when llama.cpp needs them.
//!
//! - [`placement`]: tier per tensor and the mode it implies.
//! - [`streamer`]: the residency cache, reads and statistics.
//! - [`coact`]: expert co-activation statistics, persisted per model file.
//! - [`reads`]: the rate the streamer read each model's file at, persisted per model file.
//! - [`footprint`]: what a streamed model costs in memory, from its header.
//! - [`host`]: a plan that charges everything a load holds in host RAM.
//! - [`routing`]: records the experts a MoE's routers chose (bench, tests).
pub mod coact;
pub mod footprint;
pub mod gpu;
pub mod host;
pub mod pinning;
pub mod placement;
pub mod reads;
pub mod routing;
pub mod streamer;

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;

pub use hypura_scheduler::gpu::GpuShare;
use hypura_scheduler::plan::{Plan, PlanSettings};
pub use placement::{plan_file, Mode, Placement, Tier};
pub use streamer::{StreamStats, Streamer};

use crate::error::EngineError;
pub use crate::llama::ContextMemory;
use crate::llama::{
    Context, ContextParams, EvalHook, LoadReport, Model, ModelParams, StreamBufferType,
    StreamRegion,
};
use hypura_gguf::GgufFile;

/// A model loaded with a placement.
pub struct TieredModel {
    pub model: Arc<Model>,
    pub placement: Placement,
    /// Present unless the mode is full-resident.
    pub streamer: Option<Arc<Streamer>>,
    /// Bytes read at load, into resident tensors only.
    pub load_report: LoadReport,
    /// Bytes of resident (GPU + RAM) weights.
    pub resident_bytes: u64,
    /// Weight bytes placed on the GPU tier and the RAM tier (stream cache not included).
    pub gpu_bytes: u64,
    pub ram_bytes: u64,
}

/// Options of [`TieredModel::load`].
#[derive(Debug, Clone, Default)]
pub struct TieredParams {
    /// The planner's placement (`hypura_scheduler::plan::plan`, through
    /// [`placement::plan_file`] and [`PlannedLoad::from_plan`]); `None`
    /// holds every tensor in RAM, as plain llama.cpp does. The engine
    /// decides no placement of its own.
    pub plan: Option<PlannedLoad>,
    /// See [`ModelParams::no_repack`].
    pub no_repack: bool,
    /// Read ahead what the next layers will likely need (on by default in the CLI).
    pub prefetch: bool,
    /// Where expert co-activation statistics persist (default: `$HYPURA_CACHE_DIR`
    /// or `~/.cache/hypura`).
    pub cache_dir: Option<std::path::PathBuf>,
    /// Reads in flight when streaming a unit (1 MiB chunks); `None`: from the
    /// disk's measured profile ([`crate::hwprobe::default_read_queue_depth`]).
    pub read_queue_depth: Option<u32>,
}

/// What the planner (`hypura_scheduler::plan::plan`) decided for a load.
#[derive(Debug, Clone)]
pub struct PlannedLoad {
    /// Tier per tensor; its mode is the load's mode.
    pub placement: Placement,
    /// RAM for streamed weights: the expert cache, or the dense FFN pool.
    pub stream_cache_bytes: u64,
    /// The planner's read-ahead estimate. The streamer adapts its own depth
    /// from measured read and compute times; this is what it starts from
    /// (dense-FFN streaming; see [`Streamer::set_initial_prefetch_depth`]).
    pub prefetch_depth_layers: u32,
}

impl PlannedLoad {
    /// The engine's view of `plan`, checked against `file` (see
    /// [`Placement::from_plan`]).
    pub fn from_plan(file: &GgufFile, plan: &Plan) -> Result<PlannedLoad, EngineError> {
        Ok(PlannedLoad {
            placement: Placement::from_plan(file, plan).map_err(EngineError::InvalidArgument)?,
            stream_cache_bytes: plan.stream_cache_bytes,
            prefetch_depth_layers: plan.prefetch_depth_layers,
        })
    }
}

impl PlannedLoad {
    /// The planner's placement with everything fixed by the caller: `mode`,
    /// the GPU share, and a RAM budget for weights (resident tensors + stream
    /// cache; `None`: the whole streamed role cached), priced on this
    /// machine's [estimated](crate::hwprobe::estimated) profile. For tests
    /// and tools that pin a placement rather than ask for the best one.
    pub fn fixed(
        file: &GgufFile,
        mode: Mode,
        gpu: GpuShare,
        ram_budget_bytes: Option<u64>,
    ) -> Result<PlannedLoad, EngineError> {
        let profile = crate::hwprobe::estimated();
        let settings = |cache| PlanSettings {
            mode: Some(mode),
            gpu: Some(gpu),
            stream_cache_bytes: Some(cache),
            ..Default::default()
        };
        let all_cached = plan_file(file, &profile, settings(u64::MAX))?;
        let ram = all_cached.tier_bytes.ram;
        let cache = match ram_budget_bytes {
            None => all_cached.tier_bytes.stream,
            Some(budget) => budget.checked_sub(ram).ok_or_else(|| {
                EngineError::InvalidArgument(format!(
                    "{mode} keeps {ram} bytes of weights resident in RAM, more than the RAM budget of {budget} bytes"
                ))
            })?,
        };
        PlannedLoad::from_plan(file, &plan_file(file, &profile, settings(cache))?)
    }
}

/// The placement a load uses: the planner's, else every tensor in RAM.
fn placement_of(gguf: &GgufFile, params: &TieredParams) -> Result<Placement, EngineError> {
    match &params.plan {
        Some(plan) => Ok(plan.placement.clone()),
        None => Placement::for_mode(gguf, Mode::FullResident).map_err(EngineError::InvalidArgument),
    }
}

/// What `contexts` over the model at `path`, loaded with `params`, would hold
/// beside its weights (KV cache, compute and output buffers), summed, in host
/// RAM and GPU memory: measured before any weight is loaded. The model is
/// opened as [`TieredModel::load`] would place it (same GPU offload, tensor
/// overrides and STREAM buffer type, so the same scheduling), but
/// with llama.cpp's `no_alloc`: metadata only, no weight allocated or read;
/// each context is created with simulated allocations (only its small output
/// buffer is real) and its sizes taken from llama.cpp's log
/// ([`ContextMemory`]). Costs what reading the header costs (for SmolLM2
/// about 0.2 s, mostly llama.cpp building its vocabulary) plus some tens
/// of milliseconds per context, whatever the size of the weights.
///
/// Its `metadata_bytes` is what this process's resident set grew by while
/// the header was read and the metadata-only model and its contexts were
/// built, with the devices already set up (so their runtime is not in it):
/// a measure for a process that does nothing else meanwhile (`hypura run`,
/// `bench`), not for a server with other work in flight.
pub fn context_memory(
    path: &Path,
    params: &TieredParams,
    contexts: &[ContextParams],
) -> Result<ContextMemory, EngineError> {
    crate::llama::device::devices();
    let before = crate::hwprobe::host::rss_bytes();
    let gguf = GgufFile::open(path)?;
    gguf.validate()?;
    let placement = placement_of(&gguf, params)?;
    let model = Arc::new(Model::load_no_alloc(
        path,
        &placement.stream_patterns(),
        gpu::offload(&placement, &gguf).as_ref(),
        params.no_repack,
    )?);
    let mut total = ContextMemory::default();
    let mut held = Vec::with_capacity(contexts.len());
    for context in contexts {
        // Never decoded: a context over a `no_alloc` model must not.
        let (context, memory) = Context::measured(Arc::clone(&model), context, None)?;
        held.push(context);
        total += memory;
    }
    // With the contexts' own metadata (graph descriptions) and the code
    // that built them; their output buffers, also in `ram_bytes`, are
    // counted twice (small: one row of logits per sequence).
    let after = crate::hwprobe::host::rss_bytes();
    drop(held);
    total.metadata_bytes = after.zip(before).map_or(0, |(a, b)| a.saturating_sub(b));
    Ok(total)
}

/// Opens the model file read-only for streaming: O_DIRECT where the file
/// system allows it (no page-cache double buffering), else buffered with a warning.
fn open_for_streaming(path: &Path) -> std::io::Result<File> {
    match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(f) => Ok(f),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            tracing::warn!(
                "{}: O_DIRECT refused ({e}); streaming through the page cache",
                path.display()
            );
            File::open(path)
        }
        Err(e) => Err(e),
    }
}

impl TieredModel {
    pub fn load(path: &Path, params: &TieredParams) -> Result<TieredModel, EngineError> {
        TieredModel::load_with_progress(path, params, None)
    }

    /// [`TieredModel::load`] reporting the load fraction in `[0, 1]` to `progress`.
    pub fn load_with_progress(
        path: &Path,
        params: &TieredParams,
        progress: Option<&mut dyn FnMut(f32) -> bool>,
    ) -> Result<TieredModel, EngineError> {
        let gguf = GgufFile::open(path)?;
        gguf.validate()?;
        let placement = placement_of(&gguf, params)?;
        let mode = placement.mode;
        // What llama.cpp needs to put the GPU tier's tensors there.
        let gpu_offload = gpu::offload(&placement, &gguf);
        let tier_bytes = placement.tier_bytes(&gguf);
        let ram_bytes = tier_bytes.get(&Tier::Ram).copied().unwrap_or(0);
        let resident_bytes = ram_bytes + tier_bytes.get(&Tier::Gpu).copied().unwrap_or(0);

        if mode == Mode::FullResident {
            let model = Model::load(
                path,
                ModelParams {
                    no_repack: params.no_repack,
                    gpu: gpu_offload,
                    ..Default::default()
                },
            )?;
            let load_report = LoadReport {
                bytes_read: gguf.file_bytes(),
                stream_bytes_skipped: 0,
            };
            return Ok(TieredModel {
                model: Arc::new(model),
                placement,
                streamer: None,
                load_report,
                resident_bytes,
                gpu_bytes: resident_bytes - ram_bytes,
                ram_bytes,
            });
        }

        let io = |e: std::io::Error| EngineError::Load {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        let stream_offsets: HashMap<String, u64> = gguf
            .tensors()
            .iter()
            .filter(|t| placement.tier(&t.name) == Some(Tier::Stream))
            .map(|t| (t.name.clone(), t.offset_in_file))
            .collect();
        let region = Arc::new(StreamRegion::reserve(gguf.file_bytes()).map_err(io)?);
        let buft = StreamBufferType::new(Arc::clone(&region), stream_offsets);
        let stream_ranges: Vec<(u64, u64)> = gguf
            .tensors()
            .iter()
            .filter(|t| placement.tier(&t.name) == Some(Tier::Stream))
            .map(|t| (t.offset_in_file, t.offset_in_file + t.n_bytes))
            .collect();
        let mut tensor_starts: Vec<u64> = gguf.tensors().iter().map(|t| t.offset_in_file).collect();
        tensor_starts.push(gguf.data_offset());
        let (model, load_report) = Model::load_tiered(
            path,
            tensor_starts,
            stream_ranges,
            &placement.stream_patterns(),
            buft,
            gpu_offload.as_ref(),
            params.no_repack,
            progress,
        )?;
        // A streaming placement only comes from a plan.
        let cache_budget = params.plan.as_ref().map_or(0, |p| p.stream_cache_bytes);
        let streamer = Streamer::new(
            &gguf,
            &placement,
            region,
            open_for_streaming(path).map_err(io)?,
            cache_budget,
        )
        .map_err(EngineError::InvalidArgument)?;
        // Reads in flight per unit: as the cached `hypura profile` suggests.
        streamer.set_read_queue_depth(
            params
                .read_queue_depth
                .unwrap_or_else(crate::hwprobe::default_read_queue_depth),
        );
        if mode == Mode::ExpertStreaming {
            match coact::stats_path(path, gguf.data_offset(), params.cache_dir.as_deref()) {
                Ok(stats) => streamer.persist_coactivation(stats),
                Err(e) => tracing::warn!("co-activation statistics will not persist: {e}"),
            }
        }
        match reads::path(path, gguf.data_offset(), params.cache_dir.as_deref()) {
            Ok(at) => streamer.persist_reads(at),
            Err(e) => tracing::warn!("the stream's read rates will not persist: {e}"),
        }
        if let Some(plan) = &params.plan {
            streamer.set_initial_prefetch_depth(plan.prefetch_depth_layers);
        }
        // With a GPU computing a prompt's experts, the layers the cache
        // keeps are copied there from registered memory (see `pinning`).
        if mode == Mode::ExpertStreaming && gpu_offload.is_some() {
            if let Some(registrar) = crate::llama::device::HostRegistrar::find() {
                streamer.set_host_pinning(Arc::new(registrar));
            }
        }
        let streamer = Arc::new(streamer);
        if params.prefetch {
            streamer.start_prefetch();
        }
        Ok(TieredModel {
            model: Arc::new(model),
            placement,
            streamer: Some(streamer),
            load_report,
            resident_bytes,
            gpu_bytes: resident_bytes - ram_bytes,
            ram_bytes,
        })
    }

    pub fn mode(&self) -> Mode {
        self.placement.mode
    }

    /// A context that streams this model's STREAM tensors as it decodes.
    /// Several contexts may decode at once on different threads (e.g. a
    /// batch engine's and its embedding context): the streamer pins per
    /// decoding thread.
    pub fn new_context(&self, params: &ContextParams) -> Result<Context, EngineError> {
        Context::with_hook(Arc::clone(&self.model), params, self.hook())
    }

    /// [`TieredModel::new_context`], also returning what the context holds
    /// beside the weights, as llama.cpp logged its allocations.
    pub fn new_context_measured(
        &self,
        params: &ContextParams,
    ) -> Result<(Context, ContextMemory), EngineError> {
        Context::measured(Arc::clone(&self.model), params, self.hook())
    }

    /// The eval hook that streams this model's weights (`None` when fully
    /// resident): every context decoding this model must have it.
    pub fn hook(&self) -> Option<Arc<dyn EvalHook>> {
        self.streamer.clone().map(|s| s as Arc<dyn EvalHook>)
    }

    /// Streaming statistics (all zero for full-resident).
    pub fn stats(&self) -> StreamStats {
        let mut stats = match &self.streamer {
            Some(s) => s.stats(),
            None => StreamStats {
                mode: self.mode().to_string(),
                ..Default::default()
            },
        };
        stats.resident_gpu_bytes = self.gpu_bytes;
        stats.resident_ram_bytes = self.ram_bytes + stats.cache_bytes;
        stats
    }
}
