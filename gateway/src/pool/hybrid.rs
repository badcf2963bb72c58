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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::{Arc, OnceLock};

    use hypura_gguf::GgufFile;
    use hypura_scheduler::budget::{Admission, PolicyConfig, Residency};
    use hypura_scheduler::plan::{Mode, Tier};
    use hypura_synth::{self as synth, SynthSpec};

    use super::*;
    use crate::pool::planner::ServerProfile;
    use crate::pool::residency::{BudgetedModel, GlobalBudget, Terms};

    const GIB: u64 = 1 << 30;

    /// The GPU machine's profile (one H200): what the planner prices.
    fn h200() -> HardwareProfile {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/profiles/h200.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn scratch() -> &'static Path {
        static DIR: OnceLock<PathBuf> = OnceLock::new();
        DIR.get_or_init(|| {
            let dir = std::env::temp_dir().join(format!("hypura-hybrid-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            dir
        })
    }

    /// A model-sized sparse GGUF of `spec` (header and tensor table; the
    /// data a hole): planned, never run.
    fn sparse(name: &str, spec: SynthSpec) -> PathBuf {
        let path = scratch().join(name);
        if !path.exists() {
            synth::write_sparse(&spec, &path).unwrap();
        }
        path
    }

    fn mixtral() -> PathBuf {
        sparse("mixtral-8x7b.gguf", SynthSpec::mixtral_8x7b())
    }

    /// What the server asks the planner for every model under
    /// `--gpu-budget 8GiB --ram-budget 12GiB` (`gpu` and `ram`).
    fn base(gpu: u64, ram: u64) -> PlanSettings {
        PlanSettings {
            budgets: Budgets {
                gpu_bytes: Some(gpu),
                ram_bytes: Some(ram),
            },
            context_tokens: 2048,
            sequences: 2,
            ..Default::default()
        }
    }

    fn footprint(path: &Path) -> StreamFootprint {
        StreamFootprint::of(&GgufFile::open(path).unwrap())
    }

    /// What the contexts of a hybrid placement hold on the GPU machine,
    /// stated: this machine's llama.cpp (no GPU) refuses to measure a
    /// placement with GPU tensors. The KV cache of 4,096 tokens at 128 KiB
    /// (every layer's attention is on the GPU) and compute buffers there,
    /// the host's share of the compute buffers in RAM.
    fn on_the_gpu_machine(_: TieredParams) -> Result<Footprint, String> {
        Ok(Footprint::new(GIB, 256 << 20))
    }

    /// The layers whose experts a placement puts on `tier`.
    fn expert_layers(plan: &hypura_scheduler::plan::Plan, tier: Tier) -> Vec<u32> {
        let mut layers: Vec<u32> = plan
            .tiers
            .iter()
            .filter(|(name, &t)| name.contains("_exps") && t == tier)
            .filter_map(|(name, _)| hypura_scheduler::roles::layer_index(name))
            .collect();
        layers.sort_unstable();
        layers.dedup();
        layers
    }

    /// The model the budget knows, its streaming placement given `gpu`.
    fn budgeted(path: &Path, settings: PlanSettings, gpu: Option<StreamingGpu>) -> BudgetedModel {
        BudgetedModel {
            id: 0,
            footprint: footprint(path),
            streaming_contexts: gpu.map_or(0, |g| g.contexts.gpu_bytes + g.contexts.ram_bytes),
            streaming_gpu: gpu,
            full: None,
            cache_limit: None,
            settings,
            profile: ServerProfile::new(h200()),
            overhead: Footprint::ZERO,
            prompt_cache_bytes: 0,
            prompt_pass: 0,
        }
    }

    fn terms() -> Terms {
        Terms {
            name: "mixtral".into(),
            pin: Residency::Unloaded,
            priority: 0,
            keep_alive: None,
        }
    }

    #[test]
    fn a_moe_too_big_for_the_budget_streams_beside_its_last_layers_experts_on_the_gpu() {
        let path = mixtral();
        let (gpu, ram) = (8 * GIB, 12 * GIB);
        let settings = base(gpu, ram);
        let f = footprint(&path);
        assert_eq!(f.mode, Mode::ExpertStreaming);
        assert_eq!(
            f.resident_bytes + f.stream_bytes,
            GgufFile::open(&path).unwrap().tensor_bytes()
        );
        let share = plan(&path, &h200(), settings, &f, gpu, on_the_gpu_machine)
            .unwrap()
            .expect("a GPU share");
        let layer_experts = f.layer_bytes;
        let on_gpu = f.stream_bytes - share.stream_bytes;
        assert!(on_gpu >= 5 * layer_experts, "{share:?}");
        assert_eq!(on_gpu % layer_experts, 0, "whole layers' experts");
        assert!(share.weights.gpu_bytes + share.contexts.gpu_bytes <= gpu);
        // Beside the experts, every resident tensor but the embeddings.
        assert!(share.weights.gpu_bytes - on_gpu + share.weights.ram_bytes == f.resident_bytes);

        // Each residency of the streaming placement loads that share: the
        // last layers' experts on the GPU, the others streamed, whatever
        // the cache; charged in the GPU column at each.
        let model = budgeted(&path, settings, Some(share));
        let streaming = model.footprint_at(Residency::Streaming);
        let partial = model.footprint_at(Residency::Partial);
        assert_eq!(streaming.gpu_bytes, partial.gpu_bytes);
        assert_eq!(
            streaming.gpu_bytes,
            share.weights.gpu_bytes + share.contexts.gpu_bytes
        );
        assert_eq!(
            partial.ram_bytes - streaming.ram_bytes,
            share.stream_bytes / 2 - f.minimum_cache_bytes
        );
        let layers = (on_gpu / layer_experts) as u32;
        for level in [Residency::Streaming, Residency::Partial] {
            let (loaded, _) = model.load_params(&path, level).unwrap();
            assert_eq!(loaded.mode, Mode::ExpertStreaming);
            assert_eq!(loaded.tier_bytes.gpu, share.weights.gpu_bytes, "{level}");
            assert_eq!(loaded.tier_bytes.stream, share.stream_bytes, "{level}");
            assert_eq!(loaded.stream_cache_bytes, model.cache_bytes(level));
            assert_eq!(
                expert_layers(&loaded, Tier::Gpu),
                ((32 - layers)..32).collect::<Vec<_>>()
            );
            assert_eq!(
                expert_layers(&loaded, Tier::Stream).len() as u32,
                32 - layers
            );
            // What `/api/ps` reports with a cache of that size.
            let cached = model.cache_bytes(level);
            assert_eq!(
                model.tier_bytes(level, cached),
                (
                    share.weights.gpu_bytes,
                    share.weights.ram_bytes + cached,
                    share.stream_bytes - cached
                )
            );
        }
        // Faster than the same cache with every expert streamed: fewer
        // bytes read per token.
        let (hybrid, _) = model.load_params(&path, Residency::Streaming).unwrap();
        let cpu = budgeted(&path, settings, None);
        let (all_streamed, _) = cpu.load_params(&path, Residency::Streaming).unwrap();
        assert_eq!(all_streamed.tier_bytes.gpu, 0);
        assert!(hybrid.nvme_bytes_per_token < all_streamed.nvme_bytes_per_token);
        assert!(
            hybrid.predicted_tokens_per_second() > all_streamed.predicted_tokens_per_second(),
            "{} vs {} tok/s",
            hybrid.predicted_tokens_per_second(),
            all_streamed.predicted_tokens_per_second()
        );
    }

    #[test]
    fn a_moe_too_big_for_the_budget_gets_at_full_the_stream_cache_the_planner_gives_it_alone() {
        // `--gpu-budget 8GiB --ram-budget 12GiB`, the model (26 GB) alone.
        let path = mixtral();
        let limit = Footprint::new(8 * GIB, 12 * GIB);
        let settings = base(limit.gpu_bytes, limit.ram_bytes);
        let f = footprint(&path);
        let profile = h200();
        let share = plan(
            &path,
            &profile,
            settings,
            &f,
            limit.gpu_bytes,
            on_the_gpu_machine,
        )
        .unwrap()
        .unwrap();
        let budget = GlobalBudget::new(limit.gpu_bytes, limit.ram_bytes, PolicyConfig::default());
        let file = Arc::new(path.clone());
        let mut model = budgeted(&path, settings, Some(share));
        // Its full placement: every weight in the two budgets' 20 GiB at most.
        let weights = GgufFile::open(&path).unwrap().tensor_bytes();
        model.full = Some(crate::pool::residency::FullPlacement {
            gpu: GpuShare::BudgetBytes(limit.gpu_bytes - GIB),
            weights: Footprint::new(limit.gpu_bytes - GIB, weights - (limit.gpu_bytes - GIB)),
            contexts: Footprint::new(GIB, 256 << 20),
        });
        budget.add(&file, model, terms()).unwrap();
        let model = budget.model(&file).unwrap();
        let cache = model.cache_bytes(Residency::Full);
        // The planner, given the same GPU share and what the contexts hold
        // in RAM, caches what the RAM budget leaves: the same bytes.
        let alone = PlanSettings {
            mode: Some(Mode::ExpertStreaming),
            gpu: Some(share.share),
            ram_other_bytes: share.contexts.ram_bytes,
            ..settings
        };
        let (planned, _) = plan_model(&path, &profile, alone).unwrap();
        assert_eq!(cache, planned.stream_cache_bytes);
        assert_eq!(
            cache,
            limit.ram_bytes - share.weights.ram_bytes - share.contexts.ram_bytes
        );
        // Well above half the streamed weights (the most it got before).
        assert!(cache > share.stream_bytes / 2 + 2 * GIB, "{cache}");
        // The placement loaded at `full` is the streaming one with it.
        let (loaded, _) = model.load_params(&path, Residency::Full).unwrap();
        assert_eq!(loaded.mode, Mode::ExpertStreaming);
        assert_eq!(loaded.stream_cache_bytes, cache);
        assert_eq!(loaded.tier_bytes.gpu, share.weights.gpu_bytes);
        // Loaded alone, the policy charges it the whole RAM budget.
        let Admission::Load { mv } = budget.request(model.id, None) else {
            panic!("loads at once")
        };
        assert_eq!(mv.to, Residency::Full);
        assert_eq!(budget.policy().charged().ram_bytes, limit.ram_bytes);
        assert!(budget.policy().charged().fits_in(limit));
    }

    #[test]
    fn what_the_contexts_put_on_the_gpu_shrinks_the_share_until_it_fits() {
        // The GPU machine's contexts: the KV cache of the GPU layers and
        // compute buffers there. Stated here (this machine has no GPU): 2
        // GiB, where the planner counts 512 MiB of KV cache (4,096 tokens of
        // 128 KiB).
        let path = mixtral();
        let gpu = 8 * GIB;
        let settings = base(gpu, 12 * GIB);
        let f = footprint(&path);
        let profile = h200();
        let contexts = |_| Ok(Footprint::new(2 * GIB, 200 << 20));
        let share = plan(&path, &profile, settings, &f, gpu, contexts)
            .unwrap()
            .expect("a GPU share");
        assert_eq!(share.contexts, Footprint::new(2 * GIB, 200 << 20));
        assert!(share.weights.gpu_bytes + share.contexts.gpu_bytes <= gpu);
        let roomy = plan(&path, &profile, settings, &f, gpu, on_the_gpu_machine)
            .unwrap()
            .unwrap();
        assert!(
            share.stream_bytes > roomy.stream_bytes,
            "fewer experts on the GPU"
        );
        assert!(share.weights.gpu_bytes > 0);

        // No GPU bytes: no share, the placement streams on the CPU alone.
        assert_eq!(plan(&path, &profile, settings, &f, 0, contexts), Ok(None));
    }

    #[test]
    fn two_models_share_the_gpu_budget_and_every_charge_fits() {
        // Added one after the other, each takes what the streaming
        // placements before it left: both stream at once, on both tiers
        // within the budget, each with experts on the GPU.
        let small = sparse("mixtral-8l.gguf", SynthSpec::mixtral_8x7b().with_layers(8));
        let big = mixtral();
        let limit = Footprint::new(16 * GIB, 24 * GIB);
        let budget = GlobalBudget::new(limit.gpu_bytes, limit.ram_bytes, PolicyConfig::default());
        let settings = base(limit.gpu_bytes, limit.ram_bytes);
        let terms = |name: &str| Terms {
            name: name.into(),
            ..terms()
        };
        let profile = h200();
        let mut lefts = Vec::new();
        for (name, path) in [("small", &small), ("big", &big)] {
            let add = |gpu_left| {
                lefts.push(gpu_left);
                let f = footprint(path);
                let room = room(gpu_left, Footprint::ZERO, None, limit);
                let gpu = plan(path, &profile, settings, &f, room, on_the_gpu_machine)?;
                Ok(budgeted(path, settings, gpu))
            };
            budget
                .add_planned(&Arc::new(path.clone()), terms(name), add)
                .unwrap();
        }
        let model = |path: &PathBuf| budget.model(path).unwrap();
        let (a, b) = (model(&small), model(&big));
        let (ga, gb) = (a.streaming_gpu.unwrap(), b.streaming_gpu.unwrap());
        assert!(ga.stream_bytes < a.footprint.stream_bytes);
        assert!(gb.stream_bytes < b.footprint.stream_bytes);
        let held_a = a.footprint_at(Residency::Streaming).gpu_bytes;
        assert_eq!(lefts, vec![limit.gpu_bytes, limit.gpu_bytes - held_a]);
        let held_b = b.footprint_at(Residency::Streaming).gpu_bytes;
        assert!(held_a + held_b <= limit.gpu_bytes);
        assert_eq!(
            budget.streaming_gpu_left(),
            limit.gpu_bytes - held_a - held_b
        );
        // Adding a file again changes nothing.
        budget
            .add_planned(&Arc::new(big.clone()), terms("again"), |_| {
                Err("not planned again".into())
            })
            .unwrap();

        // Both requested: each loads at the highest level that fits, and
        // the books never exceed the budget on either tier.
        for m in [&a, &b] {
            let Admission::Load { mv } = budget.request(m.id, None) else {
                panic!("{} must load at once", m.id);
            };
            assert!(budget.policy().charged().fits_in(limit));
            budget.move_done(mv);
            let level = budget.policy().residency(m.id);
            assert!(level >= Residency::Streaming);
            assert_eq!(
                budget.policy().charged_to(m.id).gpu_bytes,
                m.footprint_at(Residency::Streaming).gpu_bytes,
                "the same GPU share at {level}"
            );
        }
        let charged = budget.policy().charged();
        assert!(charged.fits_in(limit), "{charged} within {limit}");
        assert_eq!(charged.gpu_bytes, held_a + held_b);
    }

    #[test]
    fn without_gpu_budget_nothing_is_left_for_the_gpu() {
        let budget = GlobalBudget::new(0, 12 * GIB, PolicyConfig::default());
        assert_eq!(budget.streaming_gpu_left(), 0);
        assert_eq!(
            room(0, Footprint::ZERO, None, Footprint::new(0, 12 * GIB)),
            0
        );
        // A full placement that fits the budget alone keeps its GPU free of
        // the streaming placement; one that cannot fit leaves it.
        let limit = Footprint::new(8 * GIB, 12 * GIB);
        let overhead = Footprint::new(GIB / 2, 0);
        let fits = Footprint::new(5 * GIB, 6 * GIB);
        assert_eq!(room(8 * GIB, overhead, Some(fits), limit), 5 * GIB / 2);
        let too_big = Footprint::new(8 * GIB, 19 * GIB);
        assert_eq!(room(8 * GIB, overhead, Some(too_big), limit), 15 * GIB / 2);
    }
}
