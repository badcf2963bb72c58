//! A plan that charges everything its load holds in host RAM.
//!
//! The planner charges the weights it places in RAM, the KV cache off the
//! GPU and the stream cache. A load also holds llama.cpp's compute and
//! output buffers in host memory and the model's metadata (vocabulary,
//! tensor descriptions, the GGUF header as read): [`plan_charged`] measures
//! those for the planned placement ([`super::context_memory`]) and plans
//! again with them charged ([`PlanSettings::ram_other_bytes`]), so the
//! stream cache gets only what is left. What a process holds beyond the
//! plan's [`Plan::ram_charged_bytes`] is then the fixed host overhead
//! `hypura profile` measures ([`crate::hwprobe::host::measure_overhead`]).
//!
//! Once loaded, [`TieredModel::fit_stream_cache`] holds the process to
//! the plan: what it holds besides the stream cache is read from the
//! kernel before every read into the cache and after every decode, and the
//! cache shrinks if the plan under-charged (heap that a header copy or a
//! freed buffer left behind, code pages and buffers a first decode
//! touched), so that the process's peak stays within the RAM budget plus
//! the overhead. The check runs all the time, not once after a warm-up:
//! a warm-up fills the cache while the process's own buffers grow, so a
//! single late check finds the peak already past the limit.
//!
//! Weights are read into anonymous memory, never memory-mapped, so each
//! resident byte is counted once, in the RSS; the STREAM region is
//! anonymous too (its resident pages are the stream cache), and streaming
//! reads bypass the page cache (O_DIRECT). The page cache that the load's
//! buffered reads leave behind is the kernel's, reclaimable, and not in the
//! RSS (a cgroup counts it, and reclaims it at its limit).
use hypura_gguf::GgufFile;
use hypura_scheduler::plan::{
    least_read_pass, Budgets, Plan, PlanSettings, DEFAULT_UBATCH_TOKENS, GPU_RESERVE_BYTES,
    MAX_STREAMED_UBATCH_TOKENS,
};
use hypura_scheduler::profile::HardwareProfile;

use super::streamer::boundary_page_bytes;
use super::{
    context_memory, plan_file, Mode, Placement, PlannedLoad, Tier, TieredModel, TieredParams,
};
use crate::error::EngineError;
use crate::llama::{ContextMemory, ContextParams};

/// Rounds of measuring and planning again: the charge can move tensors
/// between GPU and RAM, which changes the host compute buffer a little.
const ROUNDS: usize = 3;

/// The planner's plan of `file` with `settings`, charging besides what the
/// planner places the host memory of `contexts` over it (compute and output
/// buffers) and of the model's metadata, as measured by
/// [`context_memory`] in this process (with `no_repack` as the load will
/// use it), and the STREAM region's pages beyond its units
/// ([`boundary_page_bytes`]). Returns the plan and the last measurement. The charge is the
/// largest measured (a later measurement in the same process can reuse
/// memory the first one freed), and at least `settings.ram_other_bytes`.
pub fn plan_charged(
    file: &GgufFile,
    profile: &HardwareProfile,
    settings: PlanSettings,
    contexts: &[ContextParams],
    no_repack: bool,
) -> Result<(Plan, ContextMemory), EngineError> {
    let mut settings = settings;
    let mut plan = plan_file(file, profile, settings)?;
    let mut memory = ContextMemory::default();
    for _ in 0..ROUNDS {
        let params = TieredParams {
            plan: Some(PlannedLoad::from_plan(file, &plan)?),
            no_repack,
            ..Default::default()
        };
        memory = context_memory(file.path(), &params, contexts)?;
        let placement = &params.plan.as_ref().expect("set above").placement;
        let charge = memory.ram_other_bytes() + boundary_page_bytes(file, placement);
        if charge <= settings.ram_other_bytes {
            break;
        }
        settings.ram_other_bytes = charge;
        plan = plan_file(file, profile, settings)?;
    }
    Ok((plan, memory))
}

/// [`plan_charged`] for one generation context whose micro-batch
/// (`n_ubatch`) reads the fewest streamed bytes over a prompt of the
/// context's batch ([`least_read_pass`]): with streamed experts each pass
/// of the graph reads the experts the cache lacks, so a 2k-token prompt in
/// one pass reads them once where two passes of 1,024 read them twice.
/// Candidates are the default pass and the batch (at most
/// [`MAX_STREAMED_UBATCH_TOKENS`]) halved down to it. A larger pass fits
/// when its plan, with its buffers measured and charged, still streams
/// experts with a cache of at least two layers' worth (the layer a pass
/// computes and the next, read ahead; or as much as the default pass
/// left). Its GPU compute buffers beyond the memory kept back for them
/// ([`GPU_RESERVE_BYTES`]) are charged to the GPU budget: fewer experts
/// stay on the GPU and more stream, which [`least_read_pass`] weighs
/// (a pass that would stream much more is no candidate: decode pays for
/// it too). Returns the plan, its measurement and the context to create.
pub fn plan_charged_prompt(
    file: &GgufFile,
    profile: &HardwareProfile,
    settings: PlanSettings,
    context: &ContextParams,
    no_repack: bool,
) -> Result<(Plan, ContextMemory, ContextParams), EngineError> {
    let mut context = context.clone();
    context.n_ubatch = 0;
    let (plan, memory) = plan_charged(file, profile, settings, &[context.clone()], no_repack)?;
    if plan.mode != Mode::ExpertStreaming {
        return Ok((plan, memory, context));
    }
    let placement = PlannedLoad::from_plan(file, &plan)?.placement;
    let cache_floor = plan
        .stream_cache_bytes
        .min(2 * max_layer_stream_bytes(file, &placement));
    let default_pass = context.n_batch.clamp(1, DEFAULT_UBATCH_TOKENS);
    let stream_bytes = plan.tier_bytes.stream;
    let mut candidates = vec![(default_pass, plan.stream_cache_bytes)];
    let mut larger = Vec::new();
    let mut pass = context.n_batch.min(MAX_STREAMED_UBATCH_TOKENS);
    while pass > default_pass {
        let candidate = ContextParams {
            n_ubatch: pass,
            ..context.clone()
        };
        match plan_charged_pass(file, profile, settings, &candidate, no_repack) {
            Ok(Some((grown, grown_memory)))
                if grown.mode == plan.mode && grown.stream_cache_bytes >= cache_floor =>
            {
                // What it reads a pass, as a cache over the default plan's streamed bytes.
                let reads = grown
                    .tier_bytes
                    .stream
                    .saturating_sub(grown.stream_cache_bytes);
                candidates.push((pass, stream_bytes.saturating_sub(reads)));
                larger.push((grown, grown_memory, candidate));
            }
            Ok(_) => {}
            // Too large to plan at all: a smaller pass may fit.
            Err(e) => tracing::debug!("a prompt pass of {pass} tokens does not plan: {e}"),
        }
        pass /= 2;
    }
    let best = least_read_pass(context.n_batch, stream_bytes, &candidates);
    Ok(larger
        .into_iter()
        .find(|(_, _, c)| Some(c.n_ubatch) == best)
        .unwrap_or((plan, memory, context)))
}

/// [`plan_charged`] for `context`, its GPU compute buffers beyond
/// [`GPU_RESERVE_BYTES`] taken off the GPU budget (`None` when they exceed
/// the budget itself).
fn plan_charged_pass(
    file: &GgufFile,
    profile: &HardwareProfile,
    settings: PlanSettings,
    context: &ContextParams,
    no_repack: bool,
) -> Result<Option<(Plan, ContextMemory)>, EngineError> {
    let contexts = std::slice::from_ref(context);
    let (plan, memory) = plan_charged(file, profile, settings, contexts, no_repack)?;
    let excess = gpu_compute_bytes(&memory).saturating_sub(GPU_RESERVE_BYTES);
    if excess == 0 {
        return Ok(Some((plan, memory)));
    }
    let gpu_budget = settings.budgets.effective(profile).0;
    if excess >= gpu_budget {
        return Ok(None);
    }
    let charged = PlanSettings {
        budgets: Budgets {
            gpu_bytes: Some(gpu_budget - excess),
            ..settings.budgets
        },
        ..settings
    };
    let (plan, memory) = plan_charged(file, profile, charged, contexts, no_repack)?;
    // Fewer layers on the GPU leave its compute buffers as they were; where
    // they still grew past what was charged, this pass is no candidate.
    let still = gpu_compute_bytes(&memory).saturating_sub(GPU_RESERVE_BYTES);
    Ok((still <= excess).then_some((plan, memory)))
}

/// The GPU's share of a measurement's compute buffers.
fn gpu_compute_bytes(memory: &ContextMemory) -> u64 {
    memory
        .compute_bytes
        .saturating_sub(memory.ram_bytes.saturating_sub(memory.ram_kv_bytes))
}

/// The most bytes one layer streams under `placement`.
fn max_layer_stream_bytes(file: &GgufFile, placement: &Placement) -> u64 {
    let mut per_layer = std::collections::HashMap::new();
    for t in file.tensors() {
        if placement.tier(&t.name) != Some(Tier::Stream) {
            continue;
        }
        if let Some(layer) = hypura_scheduler::roles::layer_index(&t.name) {
            *per_layer.entry(layer).or_insert(0u64) += t.n_bytes;
        }
    }
    per_layer.into_values().max().unwrap_or(0)
}

/// What [`TieredModel::fit_stream_cache`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheFit {
    /// This process's resident set when checked, and the STREAM region's part of it.
    pub rss_bytes: u64,
    pub region_bytes: u64,
    /// The cache budget (as planned, or as set since) and the budget in
    /// force under the limit.
    pub before_bytes: u64,
    pub after_bytes: u64,
}

impl TieredModel {
    /// Holds this process, from now on, to `limit_bytes` (the RAM budget
    /// plus the host overhead): the stream cache gives back what the
    /// process holds besides it ([`Streamer::set_host_limit`]), checked
    /// before every read into the cache and after every decode, so memory a
    /// first decode takes (its buffers and kernels, heap a header copy left
    /// behind) shrinks the cache before the cache is read into, never after
    /// the process has gone past the limit. Never grows the cache past its
    /// budget, never below what one layer needs (then the limit cannot be
    /// kept, and the returned fit says so). Returns the cache budget before
    /// and in force now; `None` for a model that streams nothing or where
    /// `/proc` cannot say.
    ///
    /// [`Streamer::set_host_limit`]: super::streamer::Streamer::set_host_limit
    pub fn fit_stream_cache(&self, limit_bytes: u64) -> Option<CacheFit> {
        let streamer = self.streamer.as_ref()?;
        let before_bytes = streamer.cache_budget_bytes();
        streamer.set_host_limit(limit_bytes);
        let rss_bytes = crate::hwprobe::host::rss_bytes()?;
        let region_bytes = streamer.region_resident_bytes();
        let after_bytes = streamer.stats().cache_budget_bytes;
        let minimum = streamer.minimum_budget_bytes();
        let others = rss_bytes.saturating_sub(region_bytes);
        if after_bytes == minimum && others + minimum > limit_bytes {
            tracing::warn!(
                "the memory limit of {limit_bytes} bytes cannot be kept: {others} bytes are resident \
                 besides the stream cache, which needs at least {minimum} bytes (raise --ram-budget)"
            );
        }
        if after_bytes < before_bytes {
            tracing::info!(
                "stream cache {before_bytes} -> {after_bytes} bytes: {others} bytes resident besides it, limit {limit_bytes}"
            );
        }
        Some(CacheFit {
            rss_bytes,
            region_bytes,
            before_bytes,
            after_bytes,
        })
    }
}
