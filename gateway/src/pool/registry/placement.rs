//! Placement: what the planner is asked for a model (its engine's contexts,
//! the server's budgets: [`plan_settings`], the one place that builds them
//! for the pool), and what the global budget charges for it in each
//! residency ([`BudgetedModel`], planned and measured without loading a weight).

use std::path::Path;
use std::sync::Arc;

use hypura_gguf::GgufFile as HeaderFile;
use hypura_scheduler::budget::{Footprint, Residency};
use hypura_scheduler::plan::{
    least_read_pass, Budgets, Plan, PlanSettings, DEFAULT_UBATCH_TOKENS, MAX_STREAMED_UBATCH_TOKENS,
};
use llama_tiered::engine::BatchConfig;
use llama_tiered::tiered::footprint::StreamFootprint;
use llama_tiered::tiered::{context_memory, GpuShare, Mode};

use super::names::{ModelInfo, ModelSource, NamedModel};
use super::{EngineSettings, ModelPolicy, Pin, Registry};
use crate::core::validation::KeepAlive;
use crate::pool::hybrid;
use crate::pool::planner::{self, log_placement, plan_model};
use crate::pool::residency::{
    full_settings, streaming_settings, BudgetedModel, FullPlacement, Terms,
};

/// The model's training context from its metadata (unbounded when absent).
fn n_ctx_train(named: &NamedModel) -> u32 {
    named
        .info
        .context_length
        .map_or(u32::MAX, |n| n.min(u64::from(u32::MAX)) as u32)
}

/// The engine a model runs in (its context per sequence capped at the
/// model's training context).
pub(super) fn batch_config(named: &NamedModel, settings: &EngineSettings) -> BatchConfig {
    let n_ctx_per_seq = named
        .policy
        .n_ctx_per_seq
        .unwrap_or(settings.n_ctx_per_seq)
        .clamp(16, n_ctx_train(named).max(16));
    let n_parallel = named.policy.n_parallel.unwrap_or(settings.n_parallel);
    BatchConfig {
        n_parallel,
        n_ctx_per_seq,
        // Every generating sequence needs a place in each decode step.
        n_batch: settings.n_batch.max(n_parallel),
        n_ubatch: 0,
        n_threads: settings.n_threads,
        queue_limit: settings.queue_limit,
        prompt_cache: settings.prompt_cache.clone(),
    }
}

/// `config` with prompt passes of `pass` tokens (`0`: llama.cpp's default
/// pass, the config as it is): the batch grows to a pass, so one prompt of
/// up to `pass` tokens is one pass of the graph.
pub(super) fn with_prompt_pass(mut config: BatchConfig, pass: u32) -> BatchConfig {
    if pass > 0 {
        config.n_batch = config.n_batch.max(pass);
        config.n_ubatch = pass;
    }
    config
}

/// What the planner is asked for a model whatever its placement: the
/// server's budgets and the model's contexts. The GPU is used only when
/// given a budget (`--gpu-budget`); making it the default is this line.
pub(super) fn plan_settings(named: &NamedModel, settings: &EngineSettings) -> PlanSettings {
    let config = batch_config(named, settings);
    let budgets = Budgets {
        gpu_bytes: Some(settings.gpu_budget_bytes.unwrap_or(0)),
        ram_bytes: settings.ram_budget_bytes,
    };
    // Idle slots hold KV cache too.
    planner::plan_settings(budgets, config.n_ctx_per_seq, config.n_slots())
}

/// What the budget needs to know of a model: its streaming placement (with
/// a GPU share of at most what `gpu_left` leaves it: see
/// [`crate::pool::hybrid`]), and the full placement (as many layers on the
/// GPU as the GPU budget holds beside their KV cache and compute buffers),
/// both the planner's, each with what its contexts hold, measured by
/// llama.cpp without loading any weight. `limit`: the whole budget.
///
/// A MoE that streams experts reads, in each prompt pass of the graph, the
/// streamed experts its cache lacks: its prompts pass the graph in the pass
/// ([`least_read_pass`] over the context's worth of prompt) that reads the
/// least, each pass's larger compute buffers measured and charged and the
/// cache left beside them counted; llama.cpp's default pass where the cache
/// holds the experts anyway.
fn budgeted_model(
    named: &NamedModel,
    settings: &EngineSettings,
    limit: Footprint,
    gpu_left: u64,
) -> Result<BudgetedModel, String> {
    let file = HeaderFile::open(named.source.local_path().as_path()).map_err(|e| e.to_string())?;
    let footprint = StreamFootprint::of(&file);
    let default = budgeted_model_at(named, settings, limit, gpu_left, footprint, 0)?;
    let mut chosen = None;
    if footprint.mode == Mode::ExpertStreaming {
        let n_ctx = batch_config(named, settings).n_ctx_per_seq;
        // The stream cache the budget leaves a placement alone.
        let cache = |model: &BudgetedModel| {
            let least = model.footprint_at(Residency::Streaming);
            least.fits_in(limit).then(|| {
                (footprint.minimum_cache_bytes + limit.ram_bytes.saturating_sub(least.ram_bytes))
                    .min(footprint.stream_bytes)
            })
        };
        let default_pass = n_ctx.min(DEFAULT_UBATCH_TOKENS);
        let mut candidates: Vec<(u32, u64)> = cache(&default)
            .map(|c| (default_pass, c))
            .into_iter()
            .collect();
        let mut larger = Vec::new();
        let mut pass = n_ctx.min(MAX_STREAMED_UBATCH_TOKENS);
        while pass > default_pass {
            if let Ok(model) = budgeted_model_at(named, settings, limit, gpu_left, footprint, pass)
            {
                if let Some(c) = cache(&model) {
                    candidates.push((pass, c));
                    larger.push(model);
                }
            }
            pass /= 2;
        }
        let best = least_read_pass(n_ctx, footprint.stream_bytes, &candidates);
        chosen = larger.into_iter().find(|m| Some(m.prompt_pass) == best);
    }
    // The least it needs is the default pass's: with less room than a
    // larger pass needs, it gets the default one.
    log_plan_alone(named, &default, chosen.as_ref().map(|m| m.prompt_pass));
    Ok(chosen.unwrap_or(default))
}

/// [`budgeted_model`] with prompt passes of `pass` tokens
/// ([`with_prompt_pass`]).
fn budgeted_model_at(
    named: &NamedModel,
    settings: &EngineSettings,
    limit: Footprint,
    gpu_left: u64,
    footprint: StreamFootprint,
    pass: u32,
) -> Result<BudgetedModel, String> {
    let contexts =
        with_prompt_pass(batch_config(named, settings), pass).contexts(n_ctx_train(named));
    let base = plan_settings(named, settings);
    let profile = settings.profile.get();
    let named_error = |e: String| format!("{}: {e}", named.name);
    let plan = |s| plan_model(named.source.local_path(), &profile, s).map_err(named_error);
    let measure = |params| {
        context_memory(named.source.local_path(), &params, &contexts)
            .map_err(|e| format!("{}: {e}", named.name))
    };
    let gpu_budget = settings.gpu_budget_bytes.unwrap_or(0);
    let has_gpu = gpu_budget > 0 && !llama_tiered::llama::gpu_devices().is_empty();
    let full = if footprint.mode == Mode::FullResident {
        None
    } else {
        let mut gpu = if has_gpu {
            GpuShare::BudgetBytes(gpu_budget)
        } else {
            GpuShare::None
        };
        let (mut full_plan, params) = plan(full_settings(base, gpu))?;
        let mut contexts = measure(params)?;
        if contexts.gpu_bytes > 0 {
            // Room beside the weights for what the contexts put on the GPU
            // (fewer layers there only shrinks it).
            gpu = GpuShare::BudgetBytes(gpu_budget.saturating_sub(contexts.gpu_bytes));
            let (replanned, params) = plan(full_settings(base, gpu))?;
            full_plan = replanned;
            contexts = measure(params)?;
        }
        let weights = &full_plan.tier_bytes;
        Some(FullPlacement {
            gpu,
            weights: Footprint::new(weights.gpu, weights.ram),
            contexts: Footprint::new(contexts.gpu_bytes, contexts.ram_bytes),
        })
    };
    // Whole MiB: an idle runner's RSS varies by a few pages from one
    // measurement to the next, and the least a model needs is one figure
    // (the server's plan line and refusal, `inspect --plan`).
    let whole_mib = |bytes: u64| bytes.div_ceil(1 << 20) << 20;
    let overhead = settings.runners.as_ref().map_or(Footprint::ZERO, |r| {
        Footprint::new(
            whole_mib(r.overhead_gpu_bytes),
            whole_mib(r.overhead_ram_bytes),
        )
    });
    let full_holds = full.map(|full| {
        Footprint::new(
            full.weights.gpu_bytes + full.contexts.gpu_bytes + overhead.gpu_bytes,
            full.weights.ram_bytes + full.contexts.ram_bytes + overhead.ram_bytes,
        )
    });
    let streaming_gpu = if has_gpu {
        let room = hybrid::room(gpu_left, overhead, full_holds, limit);
        let contexts = |params| measure(params).map(|m| Footprint::new(m.gpu_bytes, m.ram_bytes));
        let path = named.source.local_path();
        hybrid::plan(path, &profile, base, &footprint, room, contexts).map_err(named_error)?
    } else {
        None
    };
    let streaming_contexts = match streaming_gpu {
        Some(gpu) => gpu.contexts.gpu_bytes + gpu.contexts.ram_bytes,
        None => {
            let cache = footprint.minimum_cache_bytes;
            let (_, params) = plan(streaming_settings(base, &footprint, cache))?;
            let streaming = measure(params)?;
            streaming.ram_bytes + streaming.gpu_bytes
        }
    };
    let model = BudgetedModel {
        id: 0,
        footprint,
        streaming_contexts,
        streaming_gpu,
        full,
        cache_limit: None,
        overhead,
        settings: base,
        profile: Arc::clone(&settings.profile),
        prompt_cache_bytes: settings.prompt_cache.ram_bytes,
        prompt_pass: pass,
    };
    Ok(model)
}

/// What the global budget charges the model file at `path` at the least
/// (its streaming placement: resident weights, contexts measured by
/// llama.cpp, the smallest stream cache, its runner) when served with
/// `settings`: the figure the server's plan line and its refusal name, for
/// `hypura inspect --plan`.
pub fn least_under_budget(path: &Path, settings: &EngineSettings) -> Result<Footprint, String> {
    let (named, limit) = alone_under_budget(path, settings)?;
    let footprint = StreamFootprint::of(&HeaderFile::open(path).map_err(|e| e.to_string())?);
    // The default prompt pass: the least room it runs in.
    let model = budgeted_model_at(&named, settings, limit, limit.gpu_bytes, footprint, 0)?;
    Ok(model.footprint_at(Residency::Streaming))
}

/// The plan `hypura serve` with `settings` loads the model file at `path`
/// with when the model is alone under the budgets and hot (full
/// residency), and its prompt pass in tokens (0: llama.cpp's default):
/// for `hypura inspect --plan --served`, whose predictions then price the
/// placement the server runs. (The planner's own choice under the budgets
/// charges no prompt pass's buffers to the GPU; a server whose prompts pass
/// the graph 4,096 tokens at a time keeps GBs fewer experts there.)
pub fn served_plan(path: &Path, settings: &EngineSettings) -> Result<(Plan, u32), String> {
    let (named, limit) = alone_under_budget(path, settings)?;
    let model = budgeted_model(&named, settings, limit, limit.gpu_bytes)?.within(limit);
    let (plan, _) = model.load_params(path, Residency::Full)?;
    Ok((plan, model.prompt_pass))
}

/// The model file at `path` as the server names it, and the budgets of
/// `settings` as one limit.
fn alone_under_budget(
    path: &Path,
    settings: &EngineSettings,
) -> Result<(NamedModel, Footprint), String> {
    let info = ModelInfo::read(path).map_err(|e| e.to_string())?;
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
    let named = NamedModel {
        name: stem.unwrap_or_default(),
        source: ModelSource::local(path.to_path_buf()),
        info: Arc::new(info),
        policy: ModelPolicy::default(),
        created: None,
    };
    let limit = Footprint::new(
        settings.gpu_budget_bytes.unwrap_or(0),
        settings.ram_budget_bytes.unwrap_or(u64::MAX),
    );
    Ok((named, limit))
}

/// Logs what the planner would choose for a model alone under the server's
/// budgets (what `hypura inspect --plan` shows for them); the budget policy
/// then shares the budgets between models by residency. It names what the
/// budget charges the model at the least (streaming, its contexts and runner
/// included: the figure its refusal names when it cannot fit), and its
/// prompt pass when that is not llama.cpp's default.
fn log_plan_alone(named: &NamedModel, model: &BudgetedModel, pass: Option<u32>) {
    let least = model.footprint_at(Residency::Streaming);
    let pass = match pass {
        None => String::new(),
        Some(tokens) => format!(
            "; its experts stream: prompts pass the graph {tokens} tokens at a time, \
             its contexts charged for it"
        ),
    };
    let alone = format!("alone under the budgets; at least {least} under the budget{pass}");
    match plan_model(
        named.source.local_path(),
        &model.profile.get(),
        model.settings,
    ) {
        Ok((plan, _)) => log_placement(&named.name, &alone, &plan),
        Err(e) => eprintln!("hypura: {} {alone}: {e}", named.name),
    }
}

impl Registry {
    /// Counts a model file in the global budget (if there is one): fails,
    /// naming the minimum, when it cannot stream within it.
    pub(super) fn add_to_budget(&self, named: &NamedModel) -> Result<(), String> {
        let Some(budget) = &self.budget else {
            return Ok(());
        };
        let keep_alive = match named
            .policy
            .keep_alive
            .unwrap_or(self.settings.default_keep_alive)
        {
            KeepAlive::Forever => None,
            KeepAlive::For(d) => Some(d),
        };
        let pin = match named.policy.pin {
            Pin::None => Residency::Unloaded,
            Pin::Streaming => Residency::Streaming,
            Pin::Partial => Residency::Partial,
            Pin::Full => Residency::Full,
        };
        let terms = Terms {
            name: named.name.clone(),
            pin,
            priority: named.policy.priority,
            keep_alive,
        };
        let limit = budget.policy().budget();
        budget.add_planned(named.source.local_path(), terms, |gpu_left| {
            budgeted_model(named, &self.settings, limit, gpu_left)
        })
    }

    /// The context per sequence `named` is served with: its load's when it
    /// is loaded, else what a load gets (the server's or the model's
    /// `context`, capped at its training context).
    pub fn served_context(&self, named: &NamedModel) -> u32 {
        let path = named.source.local_path();
        self.loaded
            .iter()
            .find(|(key, _)| key.as_path() == path.as_path())
            .map_or_else(
                || batch_config(named, &self.settings).n_ctx_per_seq,
                |(_, model)| model.n_ctx_per_seq,
            )
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing;
    use super::*;

    fn named(context: Option<u64>, policy: ModelPolicy) -> NamedModel {
        testing::named("smol", "/m/smol.gguf", context, policy)
    }

    #[test]
    fn the_context_is_the_servers_or_the_models_capped_at_its_training_context() {
        let settings = testing::settings(None, None);
        let config = batch_config(&named(Some(2048), ModelPolicy::default()), &settings);
        assert_eq!(config.n_ctx_per_seq, 2048);
        assert_eq!(config.n_parallel, 4);
        assert_eq!(
            config.n_batch, 4,
            "every generating sequence has a place in a step"
        );
        let policy = ModelPolicy {
            n_ctx_per_seq: Some(1024),
            n_parallel: Some(2),
            ..ModelPolicy::default()
        };
        let config = batch_config(&named(None, policy), &settings);
        assert_eq!(
            (config.n_ctx_per_seq, config.n_parallel, config.n_batch),
            (1024, 2, 2)
        );
        let tiny = ModelPolicy {
            n_ctx_per_seq: Some(1),
            ..ModelPolicy::default()
        };
        assert_eq!(
            batch_config(&named(Some(8), tiny), &settings).n_ctx_per_seq,
            16
        );
    }

    #[test]
    fn the_planner_is_asked_for_the_servers_budgets_and_the_models_context() {
        let settings = testing::settings(None, Some(1 << 30));
        let plan = plan_settings(&named(Some(2048), ModelPolicy::default()), &settings);
        assert_eq!(
            plan.budgets.gpu_bytes,
            Some(0),
            "no GPU without a GPU budget"
        );
        assert_eq!(plan.budgets.ram_bytes, Some(1 << 30));
        assert_eq!(plan.context_tokens, 2048);
        assert_eq!(plan.sequences, 4);
        assert_eq!(plan.mode, None);
    }

    #[test]
    fn a_model_not_loaded_is_served_with_what_a_load_gets() {
        let registry = Registry::new(testing::settings(None, None));
        let named = named(Some(2048), ModelPolicy::default());
        assert_eq!(registry.served_context(&named), 2048);
    }

    #[test]
    fn a_file_that_cannot_be_planned_is_listed_unfit_under_a_budget() {
        let (registry, ghost) = testing::with_ghost();
        let why = registry.unfit_reason(&ghost).expect("unfit");
        assert_eq!(registry.unfit(), [("ghost:latest".to_string(), why)]);
        assert!(registry.resolve(&ghost).is_some(), "listed all the same");
    }
}
