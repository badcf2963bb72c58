//! The streaming placement's GPU share under `serve`'s budget: the hybrid
//! placement `run` and `bench` get from the planner (attention, norms,
//! routers, output and KV on the GPU, then whole layers' experts from the
//! last layer; the rest streamed through the RAM cache), fixed for the
//! model's time in the budget so that its residencies `streaming` and
//! `partial` stay one placement whose cache is resized in place.
//!
//! The share is chosen once, when the model is added to the budget
//! ([`plan`]): the planner prices every GPU prefix of its value-per-byte
//! order within the GPU bytes the model may hold ([`room`]) at the smallest
//! stream cache and keeps the fastest; what llama.cpp's contexts then put on
//! the GPU (the KV cache of the GPU layers, compute buffers) is measured and
//! the share planned again until weights and contexts fit. Every later load
//! of the placement asks the planner for exactly that share
//! ([`GpuShare::Prefix`]) with the cache of its residency.
use std::path::Path;

use hypura_scheduler::budget::Footprint;
use hypura_scheduler::plan::{Budgets, PlanSettings};
use hypura_scheduler::profile::HardwareProfile;
use llama_tiered::tiered::footprint::StreamFootprint;
use llama_tiered::tiered::{GpuShare, TieredParams};
use serde::{Deserialize, Serialize};

use super::planner::plan_model;
use super::residency::streaming_settings;

/// The streaming placement's GPU share and what it holds besides its
/// stream cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamingGpu {
    /// Its GPU tensors, whatever the cache ([`GpuShare::Prefix`]).
    pub share: GpuShare,
    /// Weights held: on the GPU (experts of the last layers among them) and
    /// in RAM (the resident ones the GPU does not hold).
    pub weights: Footprint,
    /// Weights streamed through the cache: the streamed role less the
    /// layers the GPU holds.
    pub stream_bytes: u64,
    /// What its contexts hold on each (KV cache, compute buffers), measured.
    pub contexts: Footprint,
}

impl StreamingGpu {
    /// Memory held with a stream cache of `cache_bytes`.
    pub fn footprint(&self, cache_bytes: u64) -> Footprint {
        Footprint::new(
            self.weights.gpu_bytes + self.contexts.gpu_bytes,
            self.weights.ram_bytes + self.contexts.ram_bytes + cache_bytes,
        )
    }
}

/// GPU bytes a model's streaming placement may hold: what the budget's
/// other streaming placements leave (`gpu_left`), less its runner's own GPU
/// memory (`overhead`), less its full placement's GPU (`full`, all it holds)
/// when that placement fits the budget on its own: moving between the two
/// holds both at once, and that must stay possible.
pub fn room(gpu_left: u64, overhead: Footprint, full: Option<Footprint>, budget: Footprint) -> u64 {
    let full_gpu = full
        .filter(|full| full.fits_in(budget))
        .map_or(0, |full| full.gpu_bytes);
    gpu_left
        .saturating_sub(overhead.gpu_bytes)
        .saturating_sub(full_gpu)
}

/// Plans of a share too large for its measured contexts, at most: the
/// first guess, then one or two corrections.
const ATTEMPTS: usize = 4;

/// The streaming placement of the model at `path` holding at most
/// `gpu_bytes` of GPU memory (weights and contexts), in `footprint`'s mode
/// with `base`'s contexts: the planner's fastest GPU prefix at the smallest
/// stream cache. `measure` gives what the contexts of a placement hold
/// ([`llama_tiered::tiered::context_memory`]). `None` when no share with
/// something on the GPU fits: the placement then streams on the CPU alone.
pub fn plan(
    path: &Path,
    profile: &HardwareProfile,
    base: PlanSettings,
    footprint: &StreamFootprint,
    gpu_bytes: u64,
    measure: impl Fn(TieredParams) -> Result<Footprint, String>,
) -> Result<Option<StreamingGpu>, String> {
    let mut planner_budget = gpu_bytes;
    for _ in 0..ATTEMPTS {
        if planner_budget == 0 {
            break;
        }
        let chosen = PlanSettings {
            budgets: Budgets {
                gpu_bytes: Some(planner_budget),
                ..base.budgets
            },
            mode: Some(footprint.mode),
            gpu: None,
            stream_cache_bytes: Some(footprint.minimum_cache_bytes),
            ..base
        };
        let (chosen, _) = plan_model(path, profile, chosen)?;
        if chosen.tier_bytes.gpu == 0 {
            break;
        }
        let share = GpuShare::Prefix(chosen.gpu_prefix_bytes());
        // Measured as it will load: the share fixed.
        let (plan, params) = plan_model(
            path,
            profile,
            settings(base, footprint, share, footprint.minimum_cache_bytes),
        )?;
        let contexts = measure(params)?;
        let holds = plan.tier_bytes.gpu + contexts.gpu_bytes;
        if holds <= gpu_bytes {
            return Ok(Some(StreamingGpu {
                share,
                weights: Footprint::new(plan.tier_bytes.gpu, plan.tier_bytes.ram),
                stream_bytes: plan.tier_bytes.stream,
                contexts,
            }));
        }
        // The planner counted its own KV estimate; take off what the
        // measurement adds beyond it.
        planner_budget = planner_budget.saturating_sub(holds - gpu_bytes);
    }
    Ok(None)
}

/// What the planner is asked for the streaming placement with `share` on
/// the GPU and a stream cache of `cache_bytes`.
pub fn settings(
    base: PlanSettings,
    footprint: &StreamFootprint,
    share: GpuShare,
    cache_bytes: u64,
) -> PlanSettings {
    PlanSettings {
        gpu: Some(share),
        ..streaming_settings(base, footprint, cache_bytes)
    }
}
