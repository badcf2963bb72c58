//! Moves: what the global budget decides carried out. Cache resizes happen
//! at once, switches of placement and runner moves on a thread of their own
//! (the new placement loaded beside the old), unloads through the cache of
//! loaded models; each is reported to the budget whatever happens.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hypura_scheduler::budget::{Move, Residency};
use llama_tiered::tiered::TieredModel;
use moka::sync::Cache;

use super::leases::{Engine, InProcess, LoadedModel};
use super::loading::stream_counters;
use super::{lock, Registry};
use crate::core::validation::ModelName;
use crate::pool::planner::log_placement;
use crate::pool::residency::{BudgetedModel, GlobalBudget};
use crate::telemetry::pool as spans;

/// Carries out the budget's moves: cache resizes at once (a promotion then
/// fills the cache on a background thread), switches of placement on a
/// background thread (the new one loaded beside the old, the engine switched
/// between decode steps, the old freed), unloads through the cache of
/// loaded models (the engine finishes in-flight work; the policy never
/// unloads a model with requests in flight).
pub(super) fn execute_moves(
    budget: &Arc<GlobalBudget>,
    loaded: &Cache<Arc<PathBuf>, Arc<LoadedModel>>,
    moves: Vec<Move>,
) {
    for mv in moves {
        let Some(path) = budget.path_of(mv.model) else {
            budget.move_failed(mv);
            continue;
        };
        let budgeted = budget.model(&path);
        let switch = budgeted
            .as_ref()
            .is_some_and(|b| b.is_full_placement(mv.from) != b.is_full_placement(mv.to));
        let name = budget.policy().spec(mv.model).name.clone();
        let span = spans::move_span(
            &name,
            mv.from,
            mv.to,
            spans::move_kind(mv.from, mv.to, switch),
        );
        let _in = span.enter();
        tracing::info!("{}: {} → {}", path.display(), mv.from, mv.to);
        if mv.to == Residency::Unloaded {
            loaded.invalidate(&path);
            budget.move_done(mv);
            continue;
        }
        let (Some(model), Some(budgeted)) = (loaded.get(&path), budgeted) else {
            spans::record_failure(&span, &"the model is not loaded");
            budget.move_failed(mv);
            continue;
        };
        if switch || matches!(model.engine, Engine::Runner(_)) {
            let budget = Arc::clone(budget);
            let span = span.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                let _in = span.enter();
                // Reported whatever happens, a panic included: a move never
                // reported would hold both placements' charge for ever.
                let moved = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    move_model(&model, &budgeted, mv)
                }))
                .unwrap_or_else(|_| Err("the move panicked".into()));
                let switched = switch.then(|| started.elapsed());
                report_move(&budget, &model, mv, moved, switched, &span);
            });
            continue;
        }
        let moved = move_model(&model, &budgeted, mv);
        report_move(budget, &model, mv, moved, None, &span);
    }
}

/// Moves `model` where it runs: in this process, or in its runner.
fn move_model(model: &LoadedModel, budgeted: &BudgetedModel, mv: Move) -> Result<(), String> {
    match &model.engine {
        Engine::InProcess(_) => model.move_in_process(budgeted, mv.from, mv.to),
        Engine::Runner(runner) => runner.set_residency(mv.from, mv.to),
    }
}

/// Tells the budget (and the metrics, and the move's span) how a move
/// went; `switched`: how long a switch of placement took.
fn report_move(
    budget: &GlobalBudget,
    model: &LoadedModel,
    mv: Move,
    moved: Result<(), String>,
    switched: Option<Duration>,
    span: &tracing::Span,
) {
    match moved {
        Ok(()) => {
            budget.move_done(mv);
            crate::metrics::model_moved(&model.name, mv.from, mv.to, switched);
        }
        Err(e) => {
            tracing::error!("{}: {} → {}: {e}", model.path.display(), mv.from, mv.to);
            spans::record_failure(span, &e);
            budget.move_failed(mv);
        }
    }
}

/// Loads `model`'s placement for `level` beside the one it runs in and
/// switches its engine to it between two decode steps; the old placement is
/// freed when this returns (once in-flight handles to it are gone).
fn switch_placement(
    model: &LoadedModel,
    local: &InProcess,
    budgeted: &BudgetedModel,
    level: Residency,
) -> Result<(), String> {
    let (plan, params) = budgeted.load_params(&model.path, level)?;
    log_placement(&model.name, &level.to_string(), &plan);
    let tiered = TieredModel::load(&model.path, &params).map_err(|e| e.to_string())?;
    local
        .engine
        .switch_model(Arc::clone(&tiered.model), tiered.hook())
        .map_err(|e| e.to_string())?;
    local
        .engine
        .set_prompt_cache_ram_bytes(budgeted.prompt_cache_bytes(level));
    let old = std::mem::replace(&mut *lock(&local.streamer), tiered.streamer.clone());
    if let Some(old) = old {
        // A fill still running on the old cache stops at its next unit.
        if let Err(e) = old.set_cache_budget(old.minimum_budget_bytes()) {
            tracing::warn!("{}: emptying the old stream cache: {e}", model.name);
        }
        // Its counts stay the model's (the metrics count since load).
        let mut before = lock(&local.stream_before);
        let old = stream_counters(&old.stats());
        *before = Some(before.take().unwrap_or_default().then(&old));
    }
    if level > Residency::Streaming {
        if let Some(streamer) = tiered.streamer.clone() {
            std::thread::spawn(move || streamer.fill());
        }
    }
    tracing::info!("{}: now in its {level} placement", model.name);
    Ok(())
}

impl LoadedModel {
    /// Moves a model run here from `from` to `to` under the budget: a
    /// switch of placement (blocking until the engine runs the new one) or
    /// a stream-cache resize (a promotion then fills the cache on a
    /// background thread).
    pub fn move_in_process(
        &self,
        budgeted: &BudgetedModel,
        from: Residency,
        to: Residency,
    ) -> Result<(), String> {
        let Engine::InProcess(local) = &self.engine else {
            return Err(format!("{}: runs in a runner process", self.name));
        };
        if budgeted.is_full_placement(from) != budgeted.is_full_placement(to) {
            return switch_placement(self, local, budgeted, to);
        }
        local
            .engine
            .set_prompt_cache_ram_bytes(budgeted.prompt_cache_bytes(to));
        let streamer = local
            .streamer()
            .ok_or_else(|| format!("{}: has no stream cache to resize", self.name))?;
        streamer
            .set_cache_budget(budgeted.cache_bytes(to))
            .map_err(|e| format!("{}: {e}", self.name))?;
        if to > from && budgeted.fills(to) {
            // The promotion's span lasts until its cache is filled.
            let span = tracing::Span::current();
            std::thread::spawn(move || span.in_scope(|| streamer.fill()));
        }
        Ok(())
    }
}

impl Registry {
    /// Unloads the model named `name` if it is loaded (in-flight requests finish).
    pub fn unload(&self, name: &ModelName) -> bool {
        let Some(named) = self.resolve(name) else {
            return false;
        };
        let was_loaded = self.loaded.contains_key(named.source.local_path());
        self.unload_file(named.source.local_path());
        was_loaded
    }

    /// Unloads a file now (under a budget: as soon as it is idle, through the
    /// policy, so the budget's books stay right).
    pub(super) fn unload_file(&self, path: &Arc<PathBuf>) {
        let Some(budget) = &self.budget else {
            self.loaded.invalidate(path);
            return;
        };
        if let Some(m) = budget.model(path) {
            budget.set_keep_alive(m.id, Some(Duration::ZERO));
            let moves = budget.tick();
            execute_moves(budget, &self.loaded, moves);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing;
    use super::*;

    #[test]
    fn unloading_a_model_that_is_not_loaded_says_so() {
        let registry = Registry::new(testing::settings(None, None));
        assert!(!registry.unload(&testing::name("ghost")), "unknown");
        let smol = testing::name("smol");
        registry
            .register(smol.clone(), "/m/smol.gguf".into(), testing::info(None))
            .unwrap();
        assert!(!registry.unload(&smol), "not loaded");
        assert!(registry.resolve(&smol).is_some(), "the name stays");
    }
}
