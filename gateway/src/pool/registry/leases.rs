//! Loaded models and leases: a model in memory ([`LoadedModel`]: where it
//! runs, its keep-alive), the moka expiry that unloads it when idle, and a
//! request's hold on it ([`ModelLease`]): while one lives the model stays.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use hypura_chat::ChatTemplate;
use hypura_scheduler::budget::Residency;
use llama_tiered::engine::BatchEngine;
use llama_tiered::tiered::Streamer;
use moka::sync::Cache;
use moka::Expiry;

use super::loading::stream_counters;
use super::moves::execute_moves;
use super::names::ModelInfo;
use super::{lock, Registry, TierBytes};
use crate::core::backend::{DecodeRate, MemoryUse, StreamCounters};
use crate::core::validation::KeepAlive;
use crate::pool::residency::{BudgetedModel, GlobalBudget};
use crate::pool::runner::RunnerProcess;
use crate::telemetry::pool as spans;

/// Where a loaded model runs.
pub enum Engine {
    /// In this process.
    InProcess(Arc<InProcess>),
    /// In a runner process of its own ([`crate::pool::runner`]).
    Runner(Arc<RunnerProcess>),
}

/// A model run by this process: its engine and compiled chat template.
pub struct InProcess {
    pub engine: BatchEngine,
    /// The model's own template (ChatML when it has none), or why it does not compile.
    pub template: Result<ChatTemplate, String>,
    /// The placement it was loaded in.
    pub placement: spans::Placement,
    /// Streams its weights (under a global budget, in its streaming
    /// placement): the cache to resize on promotion and demotion. Replaced
    /// when the engine switches placement.
    pub(super) streamer: Mutex<Option<Arc<Streamer>>>,
    /// Streaming counters of the placements it ran in before this one.
    pub(super) stream_before: Mutex<Option<StreamCounters>>,
}

impl InProcess {
    pub fn streamer(&self) -> Option<Arc<Streamer>> {
        lock(&self.streamer).clone()
    }

    /// Streaming counters since load, across switches of placement (`None`
    /// when it never streamed).
    pub fn stream_counters(&self) -> Option<StreamCounters> {
        let now = self.streamer().map(|s| stream_counters(&s.stats()));
        match (lock(&self.stream_before).clone(), now) {
            (Some(before), Some(now)) => Some(before.then(&now)),
            (before, now) => now.or(before),
        }
    }

    /// Weight bytes per tier in the placement loaded now (during a switch,
    /// the old one).
    pub fn tier_bytes(&self, budgeted: &BudgetedModel) -> TierBytes {
        let streamer = self.streamer();
        let loaded = if streamer.is_none() {
            Residency::Full
        } else {
            Residency::Streaming
        };
        let cached = streamer.map_or(0, |s| s.stats().cache_bytes);
        let (gpu, ram, stream) = budgeted.tier_bytes(loaded, cached);
        TierBytes { gpu, ram, stream }
    }
}

/// A model in memory: where it runs, and its keep-alive state.
pub struct LoadedModel {
    /// The name it was loaded under.
    pub name: String,
    /// The name its latest request asked for (several names may share one
    /// load: a copy, an alias, a model `/api/create` made from it).
    pub(super) asked_as: Mutex<String>,
    pub path: Arc<PathBuf>,
    pub info: Arc<ModelInfo>,
    pub engine: Engine,
    pub n_ctx_per_seq: u32,
    /// Tokens per second of its recent generations.
    pub decode_rate: Arc<DecodeRate>,
    /// Leases held now; the entry does not expire while this is above 0.
    pub(super) active: AtomicUsize,
    pub(super) keep_alive: Mutex<KeepAlive>,
    /// When it will be unloaded if idle; `None` = never.
    pub(super) expires_at: Mutex<Option<SystemTime>>,
    /// Loaded under a global budget (the policy decides when it goes).
    pub(super) budgeted: bool,
    /// Unique to this load: tells one load's counters from the next's.
    pub id: u64,
    /// KV cache bytes per token of context (f16 keys and values, all layers).
    pub kv_bytes_per_token: u64,
}

impl LoadedModel {
    /// Whether its runner process is gone (a crash): it reloads on the next request.
    pub fn is_dead(&self) -> bool {
        match &self.engine {
            Engine::InProcess(_) => false,
            Engine::Runner(runner) => runner.is_dead(),
        }
    }

    /// Lets in-flight requests finish and refuses new ones.
    pub fn shutdown(&self) {
        match &self.engine {
            Engine::InProcess(local) => local.engine.shutdown(),
            Engine::Runner(runner) => runner.shutdown(),
        }
    }

    pub fn expires_at(&self) -> Option<SystemTime> {
        *lock(&self.expires_at)
    }

    /// The name its latest request asked for: what `/api/ps` lists, as
    /// Ollama lists the model in use (its load's name until one came).
    pub fn asked_as(&self) -> String {
        lock(&self.asked_as).clone()
    }

    /// Streaming counters since load, across switches of placement (`None`
    /// when it never streamed, or its runner is gone).
    pub fn stream_counters(&self) -> Option<StreamCounters> {
        match &self.engine {
            Engine::InProcess(local) => local.stream_counters(),
            Engine::Runner(runner) => runner.streaming(),
        }
    }

    fn idle_ttl(&self) -> Option<Duration> {
        let active = self.active.load(Ordering::SeqCst);
        idle_ttl(active, self.budgeted, *lock(&self.keep_alive))
    }

    pub(super) fn set_keep_alive(&self, keep_alive: KeepAlive) {
        *lock(&self.keep_alive) = keep_alive;
        *lock(&self.expires_at) = expiry(keep_alive, SystemTime::now());
    }
}

/// How long a loaded model may stay idle before it is unloaded: never while
/// `active` leases hold it, nor under a budget (the policy decides when it
/// goes, see `residency`); else its keep-alive.
fn idle_ttl(active: usize, budgeted: bool, keep_alive: KeepAlive) -> Option<Duration> {
    if active > 0 || budgeted {
        return None;
    }
    match keep_alive {
        KeepAlive::Forever => None,
        KeepAlive::For(d) => Some(d),
    }
}

/// When a model idle from `now` on unloads (`None`: never).
fn expiry(keep_alive: KeepAlive, now: SystemTime) -> Option<SystemTime> {
    match keep_alive {
        KeepAlive::Forever => None,
        KeepAlive::For(d) => Some(now + d),
    }
}

pub(super) struct KeepAliveExpiry;

impl Expiry<Arc<PathBuf>, Arc<LoadedModel>> for KeepAliveExpiry {
    fn expire_after_create(
        &self,
        _: &Arc<PathBuf>,
        model: &Arc<LoadedModel>,
        _: Instant,
    ) -> Option<Duration> {
        model.idle_ttl()
    }

    fn expire_after_read(
        &self,
        _: &Arc<PathBuf>,
        model: &Arc<LoadedModel>,
        _: Instant,
        _: Option<Duration>,
        _: Instant,
    ) -> Option<Duration> {
        model.idle_ttl()
    }

    fn expire_after_update(
        &self,
        _: &Arc<PathBuf>,
        model: &Arc<LoadedModel>,
        _: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        model.idle_ttl()
    }
}

/// A request's hold on a loaded model: the model stays loaded while it lives.
pub struct ModelLease {
    pub(super) model: Arc<LoadedModel>,
    pub(super) loaded: Cache<Arc<PathBuf>, Arc<LoadedModel>>,
    /// Time this request spent loading the model (zero when it was loaded).
    pub load_duration: Duration,
    /// The global budget this request is counted in, if any.
    pub(super) budget: Option<(Arc<GlobalBudget>, hypura_scheduler::budget::ModelId)>,
    /// Turns true when the server stops waiting for in-flight requests.
    pub(super) cancel: tokio::sync::watch::Receiver<bool>,
    /// Counted as a request (false: a view for `/api/ps`, which neither
    /// keeps the model loaded nor renews its keep-alive).
    pub(super) counted: bool,
}

impl ModelLease {
    /// Residency (`full` without a budget) and bytes per tier.
    pub fn memory(&self) -> MemoryUse {
        let global = self.budget.as_ref().map(|(budget, _)| budget);
        memory_of(global, &self.model)
    }

    /// Asks the budget to move the model to `level` and starts the move
    /// (see [`execute_moves`]); without a budget the model is always full.
    pub fn set_residency(&self, level: Residency) -> Result<(), String> {
        let Some((budget, id)) = &self.budget else {
            return match level {
                Residency::Full => Ok(()),
                _ => Err(format!(
                    "{}: residency is managed only under a memory budget \
                     (--gpu-budget or --ram-budget); without one every model is full",
                    self.model.name
                )),
            };
        };
        if let Some(mv) = budget.request_move(*id, level)? {
            execute_moves(budget, &self.loaded, vec![mv]);
        }
        Ok(())
    }

    /// A lease on `model` outside any registry (a runner's one model):
    /// never counted, no budget, never cancelled by a shutdown.
    pub fn standalone(model: Arc<LoadedModel>) -> ModelLease {
        ModelLease {
            model,
            loaded: Cache::new(0),
            load_duration: Duration::ZERO,
            budget: None,
            cancel: tokio::sync::watch::channel(false).1,
            counted: false,
        }
    }

    /// Turns true when the server cancels in-flight requests (shutdown past
    /// its grace period); never before.
    pub fn shutdown_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.cancel.clone()
    }
}

impl std::ops::Deref for ModelLease {
    type Target = LoadedModel;
    fn deref(&self) -> &LoadedModel {
        &self.model
    }
}

impl Drop for ModelLease {
    fn drop(&mut self) {
        if !self.counted {
            return;
        }
        let last = self.model.active.fetch_sub(1, Ordering::SeqCst) == 1;
        let keep_alive = *lock(&self.model.keep_alive);
        if last {
            self.model.set_keep_alive(keep_alive);
        }
        if let Some((budget, id)) = &self.budget {
            // Every lease was counted in flight by the policy: each one
            // finishes (only the last finishing would leave the model busy
            // for ever, never unloaded, and every waiter for its room stuck).
            budget.finish(*id);
            if last && keep_alive.is_zero() {
                let moves = budget.tick();
                execute_moves(budget, &self.loaded, moves);
            }
            return;
        }
        if !last {
            return;
        }
        // A read recomputes the entry's expiry, now that it is idle. A
        // reload (a larger context, a dead runner) may have replaced this load.
        let current = self.loaded.get(&self.model.path);
        if keep_alive.is_zero() && current.is_some_and(|m| m.id == self.model.id) {
            self.loaded.invalidate(&self.model.path);
        }
    }
}

/// Residency (`full` without a budget) and bytes per tier of a loaded model.
fn memory_of(budget: Option<&Arc<GlobalBudget>>, model: &LoadedModel) -> MemoryUse {
    let Some(budgeted) = budget.and_then(|b| b.model(&model.path)) else {
        return MemoryUse {
            residency: Residency::Full,
            tier_bytes: TierBytes {
                gpu: 0,
                ram: model.info.file_bytes,
                stream: 0,
            },
        };
    };
    let residency = budget
        .and_then(|b| b.residency(&model.path))
        .unwrap_or(Residency::Unloaded);
    let tier_bytes = match &model.engine {
        Engine::InProcess(local) => local.tier_bytes(&budgeted),
        // A runner gone holds nothing.
        Engine::Runner(runner) => runner.memory().unwrap_or(TierBytes {
            gpu: 0,
            ram: 0,
            stream: 0,
        }),
    };
    MemoryUse {
        residency,
        tier_bytes,
    }
}

impl Registry {
    /// The models in memory now, by name.
    pub fn loaded(&self) -> Vec<Arc<LoadedModel>> {
        let mut all: Vec<Arc<LoadedModel>> = self.loaded.iter().map(|(_, v)| v).collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// A lease on a loaded model that is not a request: reads its state
    /// (`/api/ps`) without keeping it loaded or renewing its keep-alive.
    pub fn observe(&self, model: Arc<LoadedModel>) -> ModelLease {
        let budget = self.budget.as_ref().and_then(|budget| {
            let id = budget.model(&model.path)?.id;
            Some((Arc::clone(budget), id))
        });
        ModelLease {
            model,
            loaded: self.loaded.clone(),
            load_duration: Duration::ZERO,
            budget,
            cancel: self.cancel.subscribe(),
            counted: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_model_unloads_after_its_keep_alive_and_never_while_held() {
        let five = Duration::from_secs(5);
        assert_eq!(idle_ttl(0, false, KeepAlive::For(five)), Some(five));
        assert_eq!(
            idle_ttl(1, false, KeepAlive::For(five)),
            None,
            "a lease holds it"
        );
        assert_eq!(
            idle_ttl(0, true, KeepAlive::For(five)),
            None,
            "the budget decides"
        );
        assert_eq!(idle_ttl(0, false, KeepAlive::Forever), None);
        let now = SystemTime::UNIX_EPOCH;
        assert_eq!(expiry(KeepAlive::For(five), now), Some(now + five));
        assert_eq!(expiry(KeepAlive::Forever, now), None);
    }
}
