//! The global memory budget, applied: one [`BudgetPolicy`] over every model
//! file the registry serves, and the model facts it needs.
//!
//! Each model has two placements under a budget:
//! - the **streaming placement** (experts or dense FFN on the STREAM tier,
//!   the rest in RAM, or on the GPU: see below), whose stream cache is the
//!   residency: `streaming` holds one layer's worth per decoding context,
//!   `partial` half of the streamed weights. Moving between those needs no
//!   reload: the cache is resized between decode steps and filled in the
//!   background;
//! - the **full placement** for `full`: nothing streamed, as many layers on
//!   the GPU as the GPU budget holds (the planner's order: output, then
//!   attention, then FFN, last layers first), the rest in RAM. No per-layer
//!   streaming hook runs, so it decodes at llama.cpp's own speed. Moving into
//!   or out of it loads the other placement beside the current one, switches
//!   the engine between two decode steps (requests in flight go on, KV cache
//!   copied), then frees the old ([`llama_tiered::engine::BatchEngine::switch_model`]);
//!   the policy charges both until then ([`ModelSpec::full_is_separate`]).
//!
//! **A model whose full placement cannot fit the budget**, even alone (a
//! model bigger than the budget: the case streaming is for), has no full
//! placement under it ([`BudgetedModel::within`]): its `full` is the
//! streaming placement with the largest stream cache the budget holds —
//! every streamed byte if they fit, else what the RAM budget leaves after
//! everything else that placement is charged (resident weights, contexts,
//! the runner's overhead; its GPU share is in the GPU column) — and its
//! `partial` is at most that. So such a model, hot and alone, streams
//! through the cache `hypura bench` plans under the same budgets, and its
//! moves between `streaming`, `partial` and `full` are all cache resizes
//! (no reload, charged the larger end while they run). `/api/ps` then shows
//! it `full` with bytes still on the STREAM tier. Its `full` is sized for
//! the model alone: beside another loaded model it stays at `partial` or
//! below until that one is unloaded. A model whose full placement fits the
//! budget alone keeps it as above.
//!
//! Charged per model and placement: resident weights per tier + what its
//! contexts hold (KV cache of every slot and of the embedding context, and
//! llama.cpp's compute buffers, measured with a metadata-only load
//! ([`llama_tiered::tiered::context_memory`])) + the stream cache.
//!
//! **The streaming placement's GPU share** ([`super::hybrid`]). With a GPU
//! budget (and a GPU), the streaming placement is the planner's hybrid: the
//! non-streamed tensors and as many last layers' experts as fit on the GPU,
//! the rest streamed through the RAM cache. Its GPU share is fixed when the
//! model is added to the budget, from what the GPU budget leaves: the budget
//! less the streaming placements of the models added before (their GPU
//! charge at `streaming`), less the model's runner's own GPU memory, less
//! its full placement's GPU when that placement fits the budget on its own
//! (a switch into it holds both). So the streaming placements of all models
//! fit the GPU budget together, as they fit its RAM (the policy refuses a
//! model that could not stream beside the pinned ones): every model can
//! always be loaded at `streaming`, and a request never waits for GPU memory
//! another model's streaming placement holds. The share is the same at
//! `streaming` and `partial` (only the cache differs), charged in the GPU
//! column at each; the full placement is sized to the whole GPU budget as
//! before, and the policy charges it when it is loaded. First come, first
//! served: a model added early may take the whole GPU budget for its
//! streaming placement; one added later then streams on the CPU (or with
//! what is left) until the server restarts. Without a GPU budget, or on a
//! machine without a GPU, the streaming placement holds nothing on the GPU,
//! exactly as before.
//!
//! Lock order: the policy's mutex is never held across an await, a load or
//! an engine call. Adding a model holds a mutex of its own while it plans
//! (no other lock held meanwhile), then the models' mutex, then the policy's.
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use hypura_scheduler::budget::{
    Admission, BudgetPolicy, Footprint, ModelId, ModelSpec, Move, PolicyConfig, Residency, Ticket,
};
use hypura_scheduler::plan::{Plan, PlanSettings};
use llama_tiered::tiered::footprint::StreamFootprint;
use llama_tiered::tiered::{GpuShare, Mode, TieredParams};
use tokio::sync::Notify;

use super::hybrid::{self, StreamingGpu};
use super::planner::{plan_model, ServerProfile};

/// The full placement of a model that streams otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FullPlacement {
    /// Which resident tensors go to the GPU.
    pub gpu: GpuShare,
    /// Weight bytes on the GPU and in RAM.
    pub weights: Footprint,
    /// What its contexts hold (KV cache, compute buffers) on each.
    pub contexts: Footprint,
}

/// What the budget knows of one model file.
#[derive(Debug, Clone)]
pub struct BudgetedModel {
    pub id: ModelId,
    /// The streaming placement.
    pub footprint: StreamFootprint,
    /// What the streaming placement's contexts hold, both tiers together
    /// (charged in RAM when it has no GPU share; with one, see
    /// [`StreamingGpu::contexts`]).
    pub streaming_contexts: u64,
    /// The streaming placement's GPU share, fixed when the model was added
    /// to the budget (module docs); `None`: it streams on the CPU alone.
    pub streaming_gpu: Option<StreamingGpu>,
    /// `None` for a model that cannot stream, or whose full placement
    /// cannot fit the budget ([`BudgetedModel::within`]): `full` is then
    /// its streaming placement with the largest cache the budget holds.
    pub full: Option<FullPlacement>,
    /// The largest stream cache the budget holds beside everything else
    /// the streaming placement is charged, set by [`BudgetedModel::within`]
    /// for a model without a full placement: it caps the cache at `full`
    /// and `partial`. `None`: no cap (a model with a full placement, or
    /// one not yet in a budget).
    pub cache_limit: Option<u64>,
    /// What the planner is asked for this model whatever its residency
    /// (budgets, context, sequences); each residency fixes the rest.
    pub settings: PlanSettings,
    /// The profile its placements are planned with.
    pub profile: Arc<ServerProfile>,
    /// Held whatever its residency once loaded: a runner process's own
    /// memory (zero for a model run in the server's process).
    pub overhead: Footprint,
    /// RAM its prompt cache may keep at `full` (half at `partial`, none at
    /// `streaming`: an idle model's conversations stay on disk); capped by
    /// [`BudgetedModel::within`].
    pub prompt_cache_bytes: u64,
    /// Tokens per prompt pass of its engine (`n_ubatch`; `0`: llama.cpp's
    /// default): the contexts above are measured with it.
    pub prompt_pass: u32,
}

impl BudgetedModel {
    /// Whether `level` is held in the full placement.
    pub fn is_full_placement(&self, level: Residency) -> bool {
        level == Residency::Full && self.full.is_some()
    }

    /// Weights the streaming placement streams: the streamed role less the
    /// layers its GPU share holds.
    pub fn stream_bytes(&self) -> u64 {
        self.streaming_gpu
            .map_or(self.footprint.stream_bytes, |g| g.stream_bytes)
    }

    /// Stream cache bytes at `level` (in the streaming placement).
    pub fn cache_bytes(&self, level: Residency) -> u64 {
        let minimum = self.footprint.minimum_cache_bytes;
        let most = self
            .stream_bytes()
            .min(self.cache_limit.unwrap_or(u64::MAX));
        match level {
            Residency::Unloaded => 0,
            _ if self.is_full_placement(level) => 0,
            Residency::Streaming => minimum,
            Residency::Partial => (self.stream_bytes() / 2).min(most).max(minimum),
            Residency::Full => most.max(minimum),
        }
    }

    /// Whether the stream cache at `level` is read in ahead of use once
    /// there: only when it is larger than the smallest, which holds just
    /// what the decoding contexts pin at once (a layer each) and is turned
    /// over by every token, so reading it in ahead buys nothing.
    pub fn fills(&self, level: Residency) -> bool {
        !self.is_full_placement(level)
            && level > Residency::Streaming
            && self.cache_bytes(level) > self.footprint.minimum_cache_bytes
    }

    /// The model as a budget of `limit` holds it: a full placement that
    /// cannot fit the budget even alone is dropped, and a model without one
    /// gets the cap on its stream cache that the RAM budget leaves beside
    /// everything else its streaming placement is charged (module docs).
    pub fn within(mut self, limit: Footprint) -> BudgetedModel {
        // The prompt cache never costs a model its full placement: it gets
        // what the budget leaves beside it, at most an eighth of the RAM.
        let wanted = std::mem::take(&mut self.prompt_cache_bytes);
        if self.full.is_some() && !self.footprint_at(Residency::Full).fits_in(limit) {
            self.full = None;
        }
        if self.full.is_none() {
            let beside = self.streaming_footprint(0).ram_bytes;
            self.cache_limit = Some(limit.ram_bytes.saturating_sub(beside));
        }
        let at_full = self.footprint_at(Residency::Full).ram_bytes;
        self.prompt_cache_bytes = wanted
            .min(limit.ram_bytes / 8)
            .min(limit.ram_bytes.saturating_sub(at_full));
        self
    }

    /// RAM the prompt cache may keep at `level`.
    pub fn prompt_cache_bytes(&self, level: Residency) -> u64 {
        match level {
            Residency::Full => self.prompt_cache_bytes,
            Residency::Partial => self.prompt_cache_bytes / 2,
            Residency::Streaming | Residency::Unloaded => 0,
        }
    }

    /// Memory held at `level`.
    pub fn footprint_at(&self, level: Residency) -> Footprint {
        let held = match self.full {
            _ if level == Residency::Unloaded => Footprint::ZERO,
            Some(full) if level == Residency::Full => Footprint::new(
                full.weights.gpu_bytes + full.contexts.gpu_bytes + self.overhead.gpu_bytes,
                full.weights.ram_bytes + full.contexts.ram_bytes + self.overhead.ram_bytes,
            ),
            _ => self.streaming_footprint(self.cache_bytes(level)),
        };
        Footprint::new(
            held.gpu_bytes,
            held.ram_bytes + self.prompt_cache_bytes(level),
        )
    }

    /// Memory held in the streaming placement with a stream cache of
    /// `cache_bytes`, the runner's overhead included.
    fn streaming_footprint(&self, cache_bytes: u64) -> Footprint {
        let placement = match self.streaming_gpu {
            Some(gpu) => gpu.footprint(cache_bytes),
            None => Footprint::new(
                0,
                self.footprint.resident_bytes + self.streaming_contexts + cache_bytes,
            ),
        };
        Footprint::new(
            placement.gpu_bytes + self.overhead.gpu_bytes,
            placement.ram_bytes + self.overhead.ram_bytes,
        )
    }

    /// What the planner is asked for the placement of `level`: its mode,
    /// GPU share and stream cache fixed (the budget policy charges them).
    pub fn plan_settings(&self, level: Residency) -> PlanSettings {
        let cache = self.cache_bytes(level);
        match (self.full, self.streaming_gpu) {
            (Some(full), _) if level == Residency::Full => full_settings(self.settings, full.gpu),
            (_, Some(gpu)) => hybrid::settings(self.settings, &self.footprint, gpu.share, cache),
            (_, None) => streaming_settings(self.settings, &self.footprint, cache),
        }
    }

    /// The planner's placement of the model at `path` for `level`, and how
    /// to load it.
    pub fn load_params(
        &self,
        path: &std::path::Path,
        level: Residency,
    ) -> Result<(Plan, TieredParams), String> {
        plan_model(path, &self.profile.get(), self.plan_settings(level))
    }

    /// Weight bytes per tier at `level`: `(gpu, ram, stream)`, the stream
    /// cache counted in RAM and out of STREAM.
    pub fn tier_bytes(&self, level: Residency, cached: u64) -> (u64, u64, u64) {
        match self.full {
            Some(full) if level == Residency::Full => {
                (full.weights.gpu_bytes, full.weights.ram_bytes, 0)
            }
            _ => {
                let (gpu, ram) = self
                    .streaming_gpu
                    .map_or((0, self.footprint.resident_bytes), |g| {
                        (g.weights.gpu_bytes, g.weights.ram_bytes)
                    });
                (
                    gpu,
                    ram + cached,
                    self.stream_bytes().saturating_sub(cached),
                )
            }
        }
    }
}

/// The streaming placement with a stream cache of `cache_bytes`: the
/// streamed role on STREAM, everything else in RAM.
pub fn streaming_settings(
    base: PlanSettings,
    footprint: &StreamFootprint,
    cache_bytes: u64,
) -> PlanSettings {
    PlanSettings {
        mode: Some(footprint.mode),
        gpu: Some(GpuShare::None),
        stream_cache_bytes: Some(cache_bytes),
        ..base
    }
}

/// The full placement with `gpu` on the GPU (nothing streamed, so the
/// empty cache is fixed too: the policy, not the planner, checks the fit).
pub fn full_settings(base: PlanSettings, gpu: GpuShare) -> PlanSettings {
    PlanSettings {
        mode: Some(Mode::FullResident),
        gpu: Some(gpu),
        stream_cache_bytes: Some(0),
        ..base
    }
}

/// A model's terms under the budget (from the configuration).
#[derive(Debug, Clone)]
pub struct Terms {
    pub name: String,
    /// Never demoted below this.
    pub pin: Residency,
    pub priority: i32,
    /// Unloaded this long after its last request; `None` = never.
    pub keep_alive: Option<Duration>,
}

/// The policy and the files it manages.
pub struct GlobalBudget {
    policy: Mutex<BudgetPolicy>,
    models: Mutex<HashMap<Arc<PathBuf>, BudgetedModel>>,
    /// Held while a model is planned and added ([`GlobalBudget::add_planned`]).
    adding: Mutex<()>,
    origin: Instant,
    /// Woken after every move done and request finished: waiting requests
    /// ask again.
    pub changed: Notify,
    /// Requests waiting for room now, per model ([`WaitingRequest`]).
    waiting: Mutex<HashMap<ModelId, usize>>,
    /// The most the policy charged at once since start, per tier: its
    /// charge after every change (each made under its lock, [`PolicyGuard`]).
    peak: [AtomicU64; 2],
}

/// The policy, locked; on release its charge raises the budget's peak.
pub struct PolicyGuard<'a> {
    policy: MutexGuard<'a, BudgetPolicy>,
    peak: &'a [AtomicU64; 2],
}

impl std::ops::Deref for PolicyGuard<'_> {
    type Target = BudgetPolicy;
    fn deref(&self) -> &BudgetPolicy {
        &self.policy
    }
}

impl std::ops::DerefMut for PolicyGuard<'_> {
    fn deref_mut(&mut self) -> &mut BudgetPolicy {
        &mut self.policy
    }
}

impl Drop for PolicyGuard<'_> {
    fn drop(&mut self) {
        let charged = self.policy.charged();
        self.peak[0].fetch_max(charged.gpu_bytes, Ordering::Relaxed);
        self.peak[1].fetch_max(charged.ram_bytes, Ordering::Relaxed);
    }
}

/// A request counted in flight by the policy: finished when dropped, unless
/// handed to a lease ([`InFlight::into_parts`]). So a request given up at
/// any await (a client gone while its model loads) never stays counted,
/// which would keep its model busy, unloadable, for ever.
pub struct InFlight {
    budget: Option<Arc<GlobalBudget>>,
    id: ModelId,
}

impl InFlight {
    /// Counts nothing itself: call once the policy has admitted a request.
    pub fn admitted(budget: &Arc<GlobalBudget>, id: ModelId) -> InFlight {
        InFlight {
            budget: Some(Arc::clone(budget)),
            id,
        }
    }

    /// The budget and model, for the lease that now finishes the request.
    pub fn into_parts(mut self) -> (Arc<GlobalBudget>, ModelId) {
        let budget = self.budget.take().expect("taken once");
        (budget, self.id)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(budget) = self.budget.take() {
            budget.finish(self.id);
        }
    }
}

/// A request waiting for room in the budget, counted per model while it
/// lives (`/api/ps`, `/api/status`, `/metrics`).
pub struct WaitingRequest {
    budget: Arc<GlobalBudget>,
    id: ModelId,
}

impl Drop for WaitingRequest {
    fn drop(&mut self) {
        self.budget.count_waiting(self.id, false);
    }
}

/// A request announced to the policy before it asks for its model
/// ([`BudgetPolicy::arrive`]: held at the model's fair gate meanwhile);
/// withdrawn when dropped, unless admitted by then.
pub struct Announced {
    budget: Arc<GlobalBudget>,
    pub id: ModelId,
    pub ticket: Ticket,
}

impl Announced {
    /// Whether it was announced to `budget`.
    pub fn is_of(&self, budget: &Arc<GlobalBudget>) -> bool {
        Arc::ptr_eq(&self.budget, budget)
    }
}

impl Drop for Announced {
    fn drop(&mut self) {
        if self.budget.policy().leave(self.id, self.ticket) {
            // Its model may be idle now, to requests waiting for room.
            self.budget.changed.notify_waiters();
        }
    }
}

impl GlobalBudget {
    pub fn new(gpu_bytes: u64, ram_bytes: u64, config: PolicyConfig) -> GlobalBudget {
        GlobalBudget {
            policy: Mutex::new(BudgetPolicy::new(
                Footprint::new(gpu_bytes, ram_bytes),
                config,
            )),
            models: Mutex::new(HashMap::new()),
            adding: Mutex::new(()),
            origin: Instant::now(),
            changed: Notify::new(),
            waiting: Mutex::new(HashMap::new()),
            peak: Default::default(),
        }
    }

    /// The most the policy has charged at once since start, per tier.
    pub fn peak_charged(&self) -> Footprint {
        let [gpu, ram] = &self.peak;
        Footprint::new(gpu.load(Ordering::Relaxed), ram.load(Ordering::Relaxed))
    }

    /// Counts a request for `id` waiting for room until the guard drops.
    pub fn start_waiting(self: &Arc<Self>, id: ModelId) -> WaitingRequest {
        self.count_waiting(id, true);
        WaitingRequest {
            budget: Arc::clone(self),
            id,
        }
    }

    fn count_waiting(&self, id: ModelId, more: bool) {
        let name = self.policy().spec(id).name.clone();
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        let count = waiting.entry(id).or_default();
        *count = if more {
            *count + 1
        } else {
            count.saturating_sub(1)
        };
        crate::metrics::budget_waiting(&name, *count);
    }

    /// Requests waiting for room now, by model name (models with none left
    /// out), sorted by name.
    pub fn waiting(&self) -> Vec<(String, usize)> {
        let counts: Vec<(ModelId, usize)> = self
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(_, &n)| n > 0)
            .map(|(&id, &n)| (id, n))
            .collect();
        let policy = self.policy();
        let mut named: Vec<(String, usize)> = counts
            .into_iter()
            .map(|(id, n)| (policy.spec(id).name.clone(), n))
            .collect();
        named.sort();
        named
    }

    /// Names of the busy models that hold the room a waiting request needs
    /// (they take no new request until it is in), for messages.
    pub fn draining(&self) -> Vec<String> {
        let now = self.now();
        let policy = self.policy();
        policy
            .draining_models(now)
            .into_iter()
            .map(|id| policy.spec(id).name.clone())
            .collect()
    }

    pub fn policy(&self) -> PolicyGuard<'_> {
        PolicyGuard {
            policy: self.policy.lock().unwrap_or_else(PoisonError::into_inner),
            peak: &self.peak,
        }
    }

    fn models(&self) -> MutexGuard<'_, HashMap<Arc<PathBuf>, BudgetedModel>> {
        self.models.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Time on the policy's clock.
    pub fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// Adds a model file (once; a second name for the same file shares it),
    /// as the budget holds it ([`BudgetedModel::within`]). Fails, naming
    /// the minimum, when it cannot stream within the budget.
    pub fn add(
        &self,
        path: &Arc<PathBuf>,
        model: BudgetedModel,
        terms: Terms,
    ) -> Result<(), String> {
        let mut models = self.models();
        if models.contains_key(path) {
            return Ok(());
        }
        let mut model = model.within(self.policy().budget());
        let spec = ModelSpec {
            name: terms.name,
            streaming: model.footprint_at(Residency::Streaming),
            partial: model.footprint_at(Residency::Partial),
            full: model.footprint_at(Residency::Full),
            full_is_separate: model.full.is_some(),
            pin: terms.pin,
            priority: terms.priority,
            keep_alive: terms.keep_alive,
        };
        let name = spec.name.clone();
        eprintln!(
            "hypura: {name} under the memory budget: at least {} (streaming), {} partial, {} full",
            spec.streaming, spec.partial, spec.full
        );
        model.id = self.policy().add_model(spec)?;
        models.insert(Arc::clone(path), model);
        // The series exists from the start, at 0.
        crate::metrics::budget_waiting(&name, 0);
        Ok(())
    }

    /// Adds the model file at `path` (once) as `plan` makes it, given the
    /// GPU bytes the streaming placements of the models added before leave
    /// (module docs). One model at a time: what is left cannot change
    /// between the planning and the adding.
    pub fn add_planned(
        &self,
        path: &Arc<PathBuf>,
        terms: Terms,
        plan: impl FnOnce(u64) -> Result<BudgetedModel, String>,
    ) -> Result<(), String> {
        let _adding = self.adding.lock().unwrap_or_else(PoisonError::into_inner);
        if self.models().contains_key(path) {
            return Ok(());
        }
        let model = plan(self.streaming_gpu_left())?;
        self.add(path, model, terms)
    }

    /// GPU bytes the streaming placements of the models added so far leave.
    pub fn streaming_gpu_left(&self) -> u64 {
        let held: u64 = self
            .models()
            .values()
            .map(|m| m.footprint_at(Residency::Streaming).gpu_bytes)
            .sum();
        self.policy().budget().gpu_bytes.saturating_sub(held)
    }

    pub fn model(&self, path: &PathBuf) -> Option<BudgetedModel> {
        self.models().get(path).cloned()
    }

    /// The file a policy id stands for.
    pub fn path_of(&self, id: ModelId) -> Option<Arc<PathBuf>> {
        self.models()
            .iter()
            .find(|(_, m)| m.id == id)
            .map(|(p, _)| Arc::clone(p))
    }

    /// Announces a request for `id` that will ask later (see [`Announced`]).
    pub fn announce(self: &Arc<Self>, id: ModelId) -> Announced {
        let now = self.now();
        let ticket = self.policy().arrive(id, now);
        Announced {
            budget: Arc::clone(self),
            id,
            ticket,
        }
    }

    /// A request for `id` asks, announced with `ticket` or not
    /// ([`BudgetPolicy::request_announced`]).
    pub fn request(&self, id: ModelId, ticket: Option<Ticket>) -> Admission {
        let now = self.now();
        self.policy().request_announced(id, now, ticket)
    }

    pub fn finish(&self, id: ModelId) {
        let now = self.now();
        self.policy().finish(id, now);
        self.changed.notify_waiters();
    }

    pub fn move_done(&self, mv: Move) {
        self.policy().move_done(mv);
        self.changed.notify_waiters();
    }

    pub fn move_failed(&self, mv: Move) {
        self.policy().move_failed(mv);
        self.changed.notify_waiters();
    }

    pub fn tick(&self) -> Vec<Move> {
        let now = self.now();
        self.policy().tick(now)
    }

    /// Whether a move of model `id` is under way (a load included).
    pub fn is_moving(&self, id: ModelId) -> bool {
        self.policy().moving_to(id).is_some()
    }

    /// See [`BudgetPolicy::request_move`].
    pub fn request_move(&self, id: ModelId, level: Residency) -> Result<Option<Move>, String> {
        self.policy().request_move(id, level)
    }

    pub fn set_keep_alive(&self, id: ModelId, keep_alive: Option<Duration>) {
        self.policy().set_keep_alive(id, keep_alive);
    }

    /// Residency now (the target while a move runs) of the file at `path`.
    pub fn residency(&self, path: &PathBuf) -> Option<Residency> {
        let id = self.model(path)?.id;
        let policy = self.policy();
        Some(policy.moving_to(id).unwrap_or(policy.residency(id)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hypura_scheduler::profile::HardwareProfile;

    fn model(full: Option<FullPlacement>) -> BudgetedModel {
        let profile = HardwareProfile::estimated("fixture".into(), 1, 1 << 30, 1 << 30, vec![]);
        BudgetedModel {
            id: 0,
            footprint: StreamFootprint {
                mode: Mode::DenseFfnStreaming,
                resident_bytes: 100,
                stream_bytes: 300,
                layer_bytes: 5,
                minimum_cache_bytes: 10,
            },
            streaming_contexts: 50,
            streaming_gpu: None,
            full,
            cache_limit: None,
            settings: PlanSettings {
                context_tokens: 512,
                sequences: 2,
                ..Default::default()
            },
            profile: ServerProfile::new(profile),
            overhead: Footprint::ZERO,
            prompt_cache_bytes: 0,
            prompt_pass: 0,
        }
    }

    /// The prompt cache is charged at `partial` and `full` (hot models),
    /// never at `streaming`, and never costs a model its full placement.
    #[test]
    fn the_prompt_cache_is_charged_when_hot_within_what_the_budget_leaves() {
        let full = FullPlacement {
            gpu: GpuShare::None,
            weights: Footprint::new(0, 400),
            contexts: Footprint::new(0, 20),
        };
        let wanting = |bytes| BudgetedModel {
            prompt_cache_bytes: bytes,
            prompt_pass: 0,
            ..model(Some(full))
        };
        // An eighth of the RAM at most: 100 of 800.
        let m = wanting(1 << 30).within(Footprint::new(0, 800));
        assert!(m.full.is_some());
        assert_eq!(m.prompt_cache_bytes(Residency::Full), 100);
        assert_eq!(m.footprint_at(Residency::Full).ram_bytes, 420 + 100);
        assert_eq!(m.footprint_at(Residency::Partial).ram_bytes, 300 + 50);
        assert_eq!(m.footprint_at(Residency::Streaming).ram_bytes, 160);
        // Only what is left beside the full placement: 440 - 420.
        let m = wanting(1 << 30).within(Footprint::new(0, 440));
        assert!(m.full.is_some(), "the full placement still fits");
        assert_eq!(m.prompt_cache_bytes(Residency::Full), 20);
        assert!(m
            .footprint_at(Residency::Full)
            .fits_in(Footprint::new(0, 440)));
        // Less wanted than the cap: what was asked.
        let m = wanting(30).within(Footprint::new(0, 800));
        assert_eq!(m.prompt_cache_bytes(Residency::Full), 30);
    }

    #[test]
    fn each_residency_charges_its_placement_contexts_and_cache() {
        let m = model(None);
        let ram = |level| m.footprint_at(level).ram_bytes;
        assert_eq!(ram(Residency::Unloaded), 0);
        assert_eq!(ram(Residency::Streaming), 160);
        assert_eq!(ram(Residency::Partial), 300);
        assert_eq!(ram(Residency::Full), 450);
        let full = m.plan_settings(Residency::Full);
        assert_eq!(full.mode, Some(Mode::DenseFfnStreaming));
        assert_eq!(full.stream_cache_bytes, Some(300));
        assert_eq!(full.gpu, Some(GpuShare::None));
        assert_eq!((full.context_tokens, full.sequences), (512, 2));
        assert_eq!(
            m.plan_settings(Residency::Streaming).stream_cache_bytes,
            Some(10)
        );

        let full = FullPlacement {
            gpu: GpuShare::BudgetBytes(250),
            weights: Footprint::new(250, 150),
            contexts: Footprint::new(30, 20),
        };
        let m = model(Some(full));
        assert_eq!(m.footprint_at(Residency::Full), Footprint::new(280, 170));
        assert_eq!(m.footprint_at(Residency::Partial), Footprint::new(0, 300));
        let settings = m.plan_settings(Residency::Full);
        assert_eq!(settings.mode, Some(Mode::FullResident));
        assert_eq!(settings.gpu, Some(GpuShare::BudgetBytes(250)));
        assert_eq!(settings.stream_cache_bytes, Some(0));
        assert_eq!(m.tier_bytes(Residency::Full, 0), (250, 150, 0));
        assert_eq!(m.tier_bytes(Residency::Streaming, 10), (0, 110, 290));
    }

    #[test]
    fn a_runners_overhead_is_charged_at_every_loaded_residency() {
        let mut m = model(None);
        m.overhead = Footprint::new(0, 7);
        let ram = |level| m.footprint_at(level).ram_bytes;
        assert_eq!(ram(Residency::Unloaded), 0);
        assert_eq!(ram(Residency::Streaming), 167);
        assert_eq!(ram(Residency::Full), 457);
    }

    fn terms(name: &str) -> Terms {
        Terms {
            name: name.into(),
            pin: Residency::Unloaded,
            priority: 0,
            keep_alive: None,
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// A dense model of `resident` + `stream` bytes of weights whose
    /// contexts hold `contexts` in either placement, run in a runner of
    /// `overhead` bytes, on the CPU alone.
    fn sized(resident: u64, stream: u64, contexts: u64, overhead: u64) -> BudgetedModel {
        let layer_bytes = stream / 30;
        BudgetedModel {
            footprint: StreamFootprint {
                mode: Mode::DenseFfnStreaming,
                resident_bytes: resident,
                stream_bytes: stream,
                layer_bytes,
                minimum_cache_bytes: 2 * layer_bytes,
            },
            streaming_contexts: contexts,
            full: Some(FullPlacement {
                gpu: GpuShare::None,
                weights: Footprint::new(0, resident + stream),
                contexts: Footprint::new(0, contexts),
            }),
            overhead: Footprint::new(0, overhead),
            ..model(None)
        }
    }

    /// Adds `models` to a budget of `limit`: the budget's view of each.
    fn add_all(limit: Footprint, models: Vec<BudgetedModel>) -> (GlobalBudget, Vec<BudgetedModel>) {
        let budget = GlobalBudget::new(limit.gpu_bytes, limit.ram_bytes, PolicyConfig::default());
        let mut added = Vec::new();
        for (i, m) in models.into_iter().enumerate() {
            let path = Arc::new(PathBuf::from(format!("/m/{i}.gguf")));
            budget.add(&path, m, terms(&format!("m{i}"))).unwrap();
            added.push(budget.model(&path).unwrap());
        }
        (budget, added)
    }

    #[test]
    fn a_model_too_big_for_the_budget_has_at_full_the_largest_stream_cache_it_holds() {
        // 100 resident + 300 streamed, contexts 50, runner 7, in RAM 400:
        // the full placement (457) cannot fit even alone.
        let limit = Footprint::new(0, 400);
        let (budget, added) = add_all(limit, vec![sized(100, 300, 50, 7)]);
        let m = &added[0];
        assert!(m.full.is_none(), "no full placement under this budget");
        // What the RAM budget leaves beside the resident weights, the
        // contexts and the runner: 400 - 100 - 50 - 7.
        assert_eq!(m.cache_bytes(Residency::Full), 243);
        assert_eq!(m.cache_bytes(Residency::Partial), 150);
        assert_eq!(m.cache_bytes(Residency::Streaming), 20);
        assert_eq!(m.footprint_at(Residency::Full), limit);
        // It loads as the streaming placement with that cache.
        let settings = m.plan_settings(Residency::Full);
        assert_eq!(settings.mode, Some(Mode::DenseFfnStreaming));
        assert_eq!(settings.stream_cache_bytes, Some(243));
        assert_eq!(m.tier_bytes(Residency::Full, 243), (0, 343, 57));
        // The policy charges it so: loaded alone, it takes the whole budget,
        // and every move between its residencies is a cache resize.
        let mut p = budget.policy().clone();
        assert!(!p.spec(0).full_is_separate);
        let Admission::Load { mv } = p.request(0, secs(0)) else {
            panic!("loads at once")
        };
        assert_eq!(mv.to, Residency::Full);
        assert_eq!(p.charged(), limit);
        p.move_done(mv);
        for (from, to) in [
            (Residency::Full, Residency::Streaming),
            (Residency::Streaming, Residency::Partial),
            (Residency::Partial, Residency::Full),
        ] {
            let mv = p.request_move(0, to).unwrap().unwrap();
            assert_eq!((mv.from, mv.to), (from, to));
            assert!(!p.spec(0).reloads(from, to));
            assert!(p.charged().fits_in(limit), "{}", p.charged());
            p.move_done(mv);
        }

        // All streamed bytes when they fit: here the full placement needs
        // more GPU memory than the budget has.
        let mut on_gpu = sized(100, 300, 50, 7);
        on_gpu.full = Some(FullPlacement {
            gpu: GpuShare::BudgetBytes(200),
            weights: Footprint::new(200, 200),
            contexts: Footprint::new(20, 50),
        });
        let limit = Footprint::new(100, 1000);
        let (_, added) = add_all(limit, vec![on_gpu]);
        let m = &added[0];
        assert!(m.full.is_none());
        assert_eq!(m.cache_bytes(Residency::Full), 300);
        assert_eq!(m.footprint_at(Residency::Full), Footprint::new(0, 457));

        // With a GPU share, what its weights and contexts hold in RAM is
        // charged beside the cache; its GPU memory in the GPU column.
        let mut hybrid = sized(100, 300, 50, 7);
        hybrid.streaming_gpu = Some(StreamingGpu {
            share: GpuShare::Prefix(80),
            weights: Footprint::new(80, 40),
            stream_bytes: 250,
            contexts: Footprint::new(30, 20),
        });
        let limit = Footprint::new(200, 300);
        let (_, added) = add_all(limit, vec![hybrid]);
        let m = &added[0];
        assert_eq!(m.cache_bytes(Residency::Full), 300 - 40 - 20 - 7);
        assert_eq!(m.footprint_at(Residency::Full), Footprint::new(110, 300));
        assert_eq!(
            m.footprint_at(Residency::Streaming).gpu_bytes,
            m.footprint_at(Residency::Full).gpu_bytes
        );
    }

    #[test]
    fn a_model_too_big_for_the_budget_shares_it_with_another_and_both_keep_answering() {
        // "big" can never be fully held in 1000; "small" can (230).
        let limit = Footprint::new(0, 1000);
        let models = vec![sized(200, 1200, 50, 0), sized(50, 150, 30, 0)];
        let (budget, added) = add_all(limit, models);
        let (big, small) = (0, 1);
        assert_eq!(added[big].footprint_at(Residency::Full), limit);
        assert!(added[small].full.is_some(), "its full placement fits");
        let mut p = budget.policy().clone();
        p.set_keep_alive(small, Some(secs(300)));
        let within = |p: &BudgetPolicy| {
            assert!(p.charged().fits_in(limit), "{} over {limit}", p.charged());
        };
        let apply = |p: &mut BudgetPolicy, moves: Vec<Move>| {
            for mv in moves {
                assert!(!(mv.model == big && p.spec(big).reloads(mv.from, mv.to)));
                within(p);
                p.move_done(mv);
                within(p);
            }
        };
        let admit = |p: &mut BudgetPolicy, id: ModelId, t: u64| loop {
            match p.request(id, secs(t)) {
                Admission::Ready => return,
                Admission::Load { mv } => {
                    within(p);
                    p.move_done(mv);
                    return;
                }
                Admission::Wait { moves } if !moves.is_empty() => apply(p, moves),
                other => panic!("{other:?}"),
            }
        };
        // A request for `id` every second of `seconds`, the policy's moves applied.
        let traffic = |p: &mut BudgetPolicy, id: ModelId, seconds: std::ops::Range<u64>| {
            for t in seconds {
                admit(p, id, t);
                p.finish(id, secs(t));
                let moves = p.tick(secs(t));
                apply(p, moves);
            }
        };

        // Alone and hot: the whole budget.
        admit(&mut p, big, 0);
        p.finish(big, secs(0));
        assert_eq!(p.residency(big), Residency::Full);
        assert_eq!(p.charged(), limit);
        // A request for the other demotes it to make room, and loads.
        admit(&mut p, small, 1);
        p.finish(small, secs(1));
        assert!(p.residency(big) < Residency::Full);
        assert!(p.residency(small) >= Residency::Streaming);
        // Traffic on the small one: promoted to its full placement, the
        // big one (cold now) demoted to streaming for it.
        traffic(&mut p, small, 2..200);
        assert_eq!(p.residency(small), Residency::Full);
        assert_eq!(p.residency(big), Residency::Streaming);
        // Then traffic on the big one: the small one is demoted, then
        // unloaded past its keep-alive, and the big one gets the whole
        // budget again.
        traffic(&mut p, big, 200..600);
        assert_eq!(p.residency(small), Residency::Unloaded);
        assert_eq!(p.residency(big), Residency::Full);
        assert_eq!(p.charged(), limit);
        // And the small one still gets in.
        admit(&mut p, small, 600);
        assert!(p.residency(small) >= Residency::Streaming);
        within(&p);
    }

    #[test]
    fn a_model_whose_full_placement_fits_the_budget_keeps_it() {
        let limit = Footprint::new(0, 1000);
        let alone = sized(100, 300, 50, 7);
        let (budget, added) = add_all(limit, vec![alone.clone()]);
        let m = &added[0];
        assert_eq!(m.full, alone.full);
        assert_eq!(m.cache_limit, None);
        for level in Residency::ALL {
            assert_eq!(m.cache_bytes(level), alone.cache_bytes(level), "{level}");
            assert_eq!(m.footprint_at(level), alone.footprint_at(level), "{level}");
        }
        assert_eq!(m.footprint_at(Residency::Full), Footprint::new(0, 457));
        assert_eq!(m.cache_bytes(Residency::Partial), 150);
        let settings = m.plan_settings(Residency::Full);
        assert_eq!(settings.mode, Some(Mode::FullResident));
        assert_eq!(settings.stream_cache_bytes, Some(0));
        assert!(budget.policy().spec(0).full_is_separate);
    }

    #[test]
    fn a_model_too_big_to_stream_is_refused_with_its_minimum() {
        let budget = GlobalBudget::new(0, 150, PolicyConfig::default());
        let path = Arc::new(PathBuf::from("/m/a.gguf"));
        let terms = Terms {
            name: "a:latest".into(),
            pin: Residency::Unloaded,
            priority: 0,
            keep_alive: None,
        };
        let err = budget.add(&path, model(None), terms).unwrap_err();
        assert!(err.contains("a:latest needs at least"), "{err}");
        assert!(budget.model(&path).is_none());
    }
}
