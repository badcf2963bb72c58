//! Loading: a model's placement planned and its engine started, in this
//! process ([`InProcess`]) or in a runner process of its own; and a load
//! replaced once, whoever asks first, when it is stale (a dead runner, a
//! context too small).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use hypura_gguf::GgufFile as HeaderFile;
use hypura_scheduler::budget::Residency;
use llama_tiered::engine::{prompt, BatchEngine};
use llama_tiered::tiered::TieredModel;
use moka::sync::Cache;

use super::leases::{Engine, InProcess, LoadedModel};
use super::names::NamedModel;
use super::placement::{batch_config, plan_settings, with_prompt_pass};
use super::EngineSettings;
use crate::core::backend::StreamCounters;
use crate::core::models::ModelsError;
use crate::pool::planner::{log_placement, plan_model};
use crate::pool::residency::BudgetedModel;
use crate::pool::runner;
use crate::telemetry::pool as spans;

/// The model at `key`, loaded anew if its runner died (once, whoever asks
/// first: a request that finds a live one takes it).
pub(super) fn replace_dead(
    loaded: &Cache<Arc<PathBuf>, Arc<LoadedModel>>,
    key: Arc<PathBuf>,
    load: impl FnOnce() -> Result<Arc<LoadedModel>, ModelsError>,
) -> Result<Arc<LoadedModel>, ModelsError> {
    replace_stale(loaded, key, LoadedModel::is_dead, load)
}

/// The model at `key`, loaded anew if it is `stale` (its runner died, or its
/// context is too small), once whoever asks first. The replaced load is
/// shut down by the cache's eviction listener: its requests in flight finish.
pub(super) fn replace_stale<V: Send + Sync + 'static>(
    loaded: &Cache<Arc<PathBuf>, Arc<V>>,
    key: Arc<PathBuf>,
    stale: impl Fn(&V) -> bool,
    load: impl FnOnce() -> Result<Arc<V>, ModelsError>,
) -> Result<Arc<V>, ModelsError> {
    use moka::ops::compute::{CompResult, Op};
    let result = loaded
        .entry(key)
        .and_try_compute_with(|entry| match entry {
            Some(entry) if !stale(entry.value()) => Ok(Op::Nop),
            _ => load().map(Op::Put),
        })?;
    match result {
        CompResult::Inserted(entry)
        | CompResult::ReplacedWith(entry)
        | CompResult::Unchanged(entry) => Ok(entry.into_value()),
        CompResult::StillNone(_) | CompResult::Removed(_) => Err(ModelsError::Failed(
            "the model was unloaded while it was reloaded: retry".into(),
        )),
    }
}

/// Loads a model in the planner's placement: for the server's budgets and
/// the model's contexts, or (under a global budget) for `budgeted`'s
/// residency; in its span, a child of the current one.
pub fn load(
    named: &NamedModel,
    settings: &EngineSettings,
    budgeted: Option<(BudgetedModel, Residency)>,
) -> Result<Arc<LoadedModel>, ModelsError> {
    let residency = budgeted
        .as_ref()
        .map_or("no budget".to_string(), |(_, level)| level.to_string());
    let span = spans::load_span(&named.name, &residency);
    let _in = span.enter();
    let loaded = load_engine(named, settings, budgeted);
    if let Err(e) = &loaded {
        spans::record_failure(&span, e);
    }
    loaded
}

fn load_engine(
    named: &NamedModel,
    settings: &EngineSettings,
    budgeted: Option<(BudgetedModel, Residency)>,
) -> Result<Arc<LoadedModel>, ModelsError> {
    tracing::info!(
        "loading {} from {}",
        named.name,
        named.source.local_path().display()
    );
    let started = Instant::now();
    let is_budgeted = budgeted.is_some();
    let (engine, n_ctx_per_seq) = match &settings.runners {
        Some(runners) => {
            let spec = runner::load_spec(named, settings, budgeted);
            let (runner, n_ctx_per_seq) = runners.load(spec).map_err(|e| {
                ModelsError::Failed(format!("could not load model '{}': {e}", named.name))
            })?;
            (Engine::Runner(runner), n_ctx_per_seq)
        }
        None => {
            let (local, n_ctx_per_seq) = load_in_process(named, settings, budgeted)?;
            (Engine::InProcess(Arc::new(local)), n_ctx_per_seq)
        }
    };
    Ok(Arc::new(LoadedModel {
        name: named.name.clone(),
        asked_as: Mutex::new(named.name.clone()),
        path: Arc::clone(named.source.local_path()),
        info: Arc::clone(&named.info),
        engine,
        n_ctx_per_seq,
        decode_rate: Arc::default(),
        active: AtomicUsize::new(0),
        keep_alive: Mutex::new(
            named
                .policy
                .keep_alive
                .unwrap_or(settings.default_keep_alive),
        ),
        expires_at: Mutex::new(None),
        budgeted: is_budgeted,
        id: NEXT_LOAD_ID.fetch_add(1, Ordering::Relaxed),
        kv_bytes_per_token: HeaderFile::open(named.source.local_path().as_path())
            .ok()
            .and_then(|file| llama_tiered::tiered::placement::plan_inputs(&file).ok())
            .map_or(0, |(_, facts)| facts.kv_bytes_per_token),
    }))
    .inspect(|_| crate::metrics::model_loaded(&named.name, started.elapsed()))
}

/// Loads a model's placement in this process and starts its engine; its
/// context per sequence.
fn load_in_process(
    named: &NamedModel,
    settings: &EngineSettings,
    budgeted: Option<(BudgetedModel, Residency)>,
) -> Result<(InProcess, u32), ModelsError> {
    let failed = |e: &dyn std::fmt::Display| {
        ModelsError::Failed(format!("could not load model '{}': {e}", named.name))
    };
    // Same kernels as `hypura run` and every streaming mode: no CPU repacking,
    // so a prompt gets the same tokens whichever way the model is held.
    let (plan, params, level) = match &budgeted {
        None => {
            let profile = settings.profile.get();
            let (plan, params) = plan_model(
                named.source.local_path(),
                &profile,
                plan_settings(named, settings),
            )
            .map_err(|e| failed(&e))?;
            (plan, params, None)
        }
        Some((budgeted, level)) => {
            let (plan, params) = budgeted
                .load_params(named.source.local_path(), *level)
                .map_err(|e| failed(&e))?;
            (plan, params, Some(*level))
        }
    };
    let residency = level.map_or("no budget".to_string(), |l| l.to_string());
    log_placement(&named.name, &residency, &plan);
    let tiered = TieredModel::load(named.source.local_path(), &params).map_err(|e| failed(&e))?;
    let hook = tiered.hook();
    let streamer = tiered.streamer.clone();
    if budgeted.as_ref().is_some_and(|(b, level)| b.fills(*level)) {
        if let Some(s) = streamer.clone() {
            std::thread::spawn(move || s.fill());
        }
    }
    let model = Arc::clone(&tiered.model);
    let mut config = batch_config(named, settings);
    config.n_ctx_per_seq = config.n_ctx_per_seq.min(model.n_ctx_train().max(16));
    if let Some((budgeted, level)) = &budgeted {
        config.prompt_cache.ram_bytes = budgeted.prompt_cache_bytes(*level);
        config = with_prompt_pass(config, budgeted.prompt_pass);
    }
    let n_ctx_per_seq = config.n_ctx_per_seq;
    let template = prompt::model_template(&model).map_err(|e| e.to_string());
    let engine = BatchEngine::start_with_hook(Arc::clone(&model), config, hook)
        .map_err(|e| ModelsError::Failed(format!("could not start model '{}': {e}", named.name)))?;
    Ok((
        InProcess {
            engine,
            template,
            placement: spans::Placement::of(&plan),
            streamer: Mutex::new(streamer),
            stream_before: Mutex::new(None),
        },
        n_ctx_per_seq,
    ))
}

/// Numbers the loads ([`LoadedModel::id`]).
static NEXT_LOAD_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The engine's streaming statistics as the gateway reports them.
pub(super) fn stream_counters(stats: &llama_tiered::tiered::StreamStats) -> StreamCounters {
    StreamCounters {
        nvme_bytes_read: stats.nvme_bytes_read,
        read_seconds: stats.read_seconds,
        expert_hits: stats.expert_hits,
        expert_misses: stats.expert_misses,
        prefetch_hits: stats.prefetch_hits,
        prefetch_wasted_bytes: stats.prefetch_wasted_bytes,
        io_stall_seconds: stats.io_stall_seconds,
        evictions: stats.evictions,
        cache_bytes: stats.cache_bytes,
        cache_budget_bytes: stats.cache_budget_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing;
    use super::*;
    use crate::pool::registry::ModelPolicy;

    #[test]
    fn a_stale_load_is_replaced_and_a_fresh_one_kept() {
        let cache: Cache<Arc<PathBuf>, Arc<u32>> = Cache::new(4);
        let key = Arc::new(PathBuf::from("/m/a.gguf"));
        let got = replace_stale(&cache, Arc::clone(&key), |_| false, || Ok(Arc::new(1)));
        assert_eq!(*got.unwrap(), 1, "nothing loaded: loads");
        let got = replace_stale(
            &cache,
            Arc::clone(&key),
            |_| false,
            || panic!("a fresh load is kept"),
        );
        assert_eq!(*got.unwrap(), 1);
        let got = replace_stale(&cache, Arc::clone(&key), |v| *v == 1, || Ok(Arc::new(2)));
        assert_eq!(*got.unwrap(), 2, "stale: loaded anew");
        assert_eq!(cache.get(&key).map(|v| *v), Some(2));
        let failed = ModelsError::Failed("no".into());
        let got = replace_stale(&cache, key, |_| true, || Err(failed.clone()));
        assert_eq!(got.unwrap_err(), failed);
    }

    #[test]
    fn a_model_that_cannot_be_planned_fails_to_load_naming_it() {
        let settings = testing::settings(None, None);
        let path = "/nonexistent/ghost.gguf";
        let named = testing::named("ghost", path, None, ModelPolicy::default());
        let Err(ModelsError::Failed(why)) = load(&named, &settings, None) else {
            panic!("loaded a file that does not exist");
        };
        assert!(
            why.starts_with("could not load model 'ghost:latest': "),
            "{why}"
        );
    }
}
