//! The model registry: `name:tag` → GGUF file, and the models loaded now.
//!
//! Names live in a [`DashMap`] (lower-case key → [`NamedModel`]); several
//! names may point at one file (`/api/copy`). Loaded models live in a moka
//! cache keyed by file path, one [`BatchEngine`] each, with a per-entry
//! time-to-idle: while a request holds a [`ModelLease`] the entry never
//! expires; when the last lease ends, it expires after the `keep_alive` of the
//! latest request (unloaded at once for 0, never for a negative value).
//! Loading runs `try_get_with` on a blocking thread: concurrent requests for
//! one model wait for one load, and requests for other models never wait on it.
//! Model files are only read.
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use dashmap::DashMap;
use hypura_chat::ChatTemplate;
use hypura_gguf::inspect::file_type_name;
use hypura_gguf::{GgufFile, GgufValue};
use llama_tiered::engine::prompt;
use llama_tiered::engine::{BatchConfig, BatchEngine};
use moka::sync::Cache;
use moka::Expiry;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use hypura_gguf::GgufFile as HeaderFile;
use hypura_scheduler::budget::{Admission, Footprint, Move, PolicyConfig, Residency};
use hypura_scheduler::plan::{Budgets, PlanSettings};
use hypura_scheduler::profile::HardwareProfile;
use llama_tiered::tiered::footprint::StreamFootprint;
use llama_tiered::tiered::{context_memory, GpuShare, Mode, Streamer, TieredModel};

use super::manifest::Manifest;
use super::runner::{self, RunnerProcess, Runners};
use crate::core::backend::{DecodeRate, MemoryUse, ModelFacts, StreamCounters};
use crate::core::models::ModelsError;
use crate::core::validation::{KeepAlive, ModelName};
use crate::pool::hybrid;
use crate::pool::planner::{log_placement, plan_model, ServerProfile};
use crate::pool::residency::{
    full_settings, streaming_settings, BudgetedModel, FullPlacement, GlobalBudget, InFlight, Terms,
};
use crate::telemetry::pool as spans;

/// How every model is run (from the command line).
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// Context per sequence in tokens, capped at each model's training context.
    pub n_ctx_per_seq: u32,
    /// Sequences decoded together per model.
    pub n_parallel: u32,
    pub n_batch: u32,
    /// Decode threads (0 = one per core).
    pub n_threads: u32,
    /// Requests waiting for a slot before new ones get 503.
    pub queue_limit: usize,
    pub default_keep_alive: KeepAlive,
    /// Under a budget, a model idle this long is demoted to streaming.
    pub demote_after: Duration,
    /// GPU memory all models together may use, in bytes (`None`: no limit set).
    pub gpu_budget_bytes: Option<u64>,
    /// Host RAM all models together may use, in bytes (`None`: no limit set).
    pub ram_budget_bytes: Option<u64>,
    /// The hardware profile every placement is planned with.
    pub profile: Arc<ServerProfile>,
    /// Runs each model in a runner process of its own (`None`: in this process).
    pub runners: Option<Arc<Runners>>,
    /// Most tokens a reply may take when its request sets no limit.
    pub default_max_tokens: u32,
    /// Each model's prompt cache below its slots: RAM bytes, the NVMe folder and cap.
    pub prompt_cache: llama_tiered::engine::PromptCacheConfig,
}

/// The residency floor of a model: the budget scheduler never demotes it below
/// this. Ordered from the weakest floor to the strongest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pin {
    /// No floor: the model may be demoted to streaming and unloaded.
    #[default]
    None,
    /// Stays loaded, at least streaming its weights from disk.
    Streaming,
    /// Keeps at least the tensors its plan holds resident in RAM or GPU memory.
    Partial,
    /// Stays fully resident in RAM or GPU memory.
    Full,
}

/// Per-model settings (from the configuration file); the default leaves the
/// server's settings in force.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelPolicy {
    /// Keep-alive when a request sets none (`None`: the server's).
    pub keep_alive: Option<KeepAlive>,
    pub pin: Pin,
    /// Higher keeps memory longer when the budget is short.
    pub priority: i32,
    /// Context per sequence in tokens (`None`: the server's).
    pub n_ctx_per_seq: Option<u32>,
    /// Sequences decoded together (`None`: the server's).
    pub n_parallel: Option<u32>,
}

/// What a GGUF header says about a model, read once at registration.
#[derive(Debug)]
pub struct ModelInfo {
    pub architecture: String,
    /// `"135M"`, `"7.2B"`: Ollama's `parameter_size`.
    pub parameter_size: String,
    /// `"Q4_1"`: Ollama's `quantization_level`.
    pub quantization: String,
    pub context_length: Option<u64>,
    pub file_bytes: u64,
    pub modified: SystemTime,
    /// sha256 of the file's identity (path, size, mtime), not of its bytes:
    /// hashing a many-GiB file at start-up would be too slow.
    pub digest: String,
    pub chat_template: Option<String>,
    /// Scalar metadata (arrays as `null`), for `/api/show`'s `model_info`.
    pub model_info: Map<String, Value>,
    pub capabilities: Vec<&'static str>,
}

/// Where a named model is served from. Only local files for now; a model
/// run by a child process (`Runner`) and one served by another machine
/// (`Remote`) come next, each behind its own [`ModelBackend`] implementation.
///
/// [`ModelBackend`]: crate::core::backend::ModelBackend
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ModelSource {
    /// A GGUF file run by the in-process engine.
    Local(Arc<PathBuf>),
}

impl ModelSource {
    pub fn local(path: PathBuf) -> ModelSource {
        ModelSource::Local(Arc::new(path))
    }

    /// The file the in-process engine loads. Every caller that needs a path
    /// goes through here: a new source kind is a compile error at each one.
    pub fn local_path(&self) -> &Arc<PathBuf> {
        match self {
            ModelSource::Local(path) => path,
        }
    }
}

impl std::fmt::Display for ModelSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModelSource::Local(path) => write!(f, "{}", path.display()),
        }
    }
}

/// A model under one name.
#[derive(Debug, Clone)]
pub struct NamedModel {
    pub name: String,
    pub source: ModelSource,
    pub info: Arc<ModelInfo>,
    pub policy: ModelPolicy,
    /// Made by `/api/create`: its template, system prompt and default
    /// options (`None`: served from a file as it is).
    pub created: Option<Arc<Manifest>>,
}

impl ModelInfo {
    /// Reads and validates the GGUF header and tensor table of `path`.
    pub fn read(path: &Path) -> Result<ModelInfo, hypura_gguf::GgufError> {
        let file = GgufFile::open(path)?;
        file.validate()?;
        let meta = std::fs::metadata(path).ok();
        let modified = meta
            .as_ref()
            .and_then(|m| m.modified().ok())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let architecture = file.architecture().unwrap_or("unknown").to_string();
        let parameters = file.parameter_count();
        let chat_template = file.get_str("tokenizer.chat_template").map(str::to_string);
        let mut model_info = Map::new();
        for (key, value) in file.metadata() {
            if key == "tokenizer.chat_template" {
                continue;
            }
            model_info.insert(key.to_string(), json_value(value));
        }
        model_info.insert("general.parameter_count".into(), parameters.into());
        let mut capabilities = vec!["completion"];
        if chat_template
            .as_deref()
            .is_some_and(|t| t.contains("enable_thinking") || t.contains("<think>"))
        {
            capabilities.push("thinking");
        }
        // Templates that cannot describe tools get llama.cpp's generic format.
        capabilities.push("tools");
        let mut hasher = Sha256::new();
        hasher.update(path.as_os_str().as_encoded_bytes());
        hasher.update(file.file_bytes().to_le_bytes());
        let since_epoch = modified
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        hasher.update(since_epoch.as_nanos().to_le_bytes());
        Ok(ModelInfo {
            parameter_size: parameter_size(parameters),
            quantization: file
                .get_u64("general.file_type")
                .map(file_type_name)
                .unwrap_or_else(|| "unknown".into()),
            context_length: file.arch_u64("context_length"),
            file_bytes: file.file_bytes(),
            architecture,
            modified,
            digest: hex(&hasher.finalize()),
            chat_template,
            model_info,
            capabilities,
        })
    }
}

impl ModelInfo {
    /// What `/api/show`, `/api/tags` and `/v1/models` say of the model: the
    /// template is its own, or ChatML (what it is prompted with) when it has none.
    pub fn facts(&self) -> ModelFacts {
        ModelFacts {
            family: self.architecture.clone(),
            parameter_size: self.parameter_size.clone(),
            quantization: self.quantization.clone(),
            context_length: self.context_length,
            template: self
                .chat_template
                .clone()
                .unwrap_or_else(|| prompt::CHATML_TEMPLATE.to_string()),
            capabilities: self.capabilities.iter().map(|c| c.to_string()).collect(),
            model_info: self.model_info.clone(),
            size_bytes: self.file_bytes,
            modified: self.modified,
            digest: self.digest.clone(),
        }
    }
}

fn json_value(value: &GgufValue) -> Value {
    match value {
        GgufValue::F32(v) => Value::from(*v as f64),
        GgufValue::F64(v) => Value::from(*v),
        GgufValue::Bool(v) => Value::from(*v),
        GgufValue::String(s) => Value::from(s.to_string_lossy().into_owned()),
        GgufValue::Array(_) => Value::Null,
        other => other
            .as_i64()
            .map(Value::from)
            .or_else(|| other.as_u64().map(Value::from))
            .unwrap_or(Value::Null),
    }
}

/// Ollama's human-readable parameter count: `135M`, `1.2B`.
pub fn parameter_size(parameters: u64) -> String {
    let p = parameters as f64;
    if p >= 1e9 {
        format!("{:.1}B", p / 1e9)
    } else if p >= 1e6 {
        format!("{:.0}M", p / 1e6)
    } else {
        format!("{:.0}K", p / 1e3)
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

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
    streamer: Mutex<Option<Arc<Streamer>>>,
    /// Streaming counters of the placements it ran in before this one.
    stream_before: Mutex<Option<StreamCounters>>,
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
    pub path: Arc<PathBuf>,
    pub info: Arc<ModelInfo>,
    pub engine: Engine,
    pub n_ctx_per_seq: u32,
    /// Tokens per second of its recent generations.
    pub decode_rate: Arc<DecodeRate>,
    /// Leases held now; the entry does not expire while this is above 0.
    active: AtomicUsize,
    keep_alive: Mutex<KeepAlive>,
    /// When it will be unloaded if idle; `None` = never.
    expires_at: Mutex<Option<SystemTime>>,
    /// Loaded under a global budget (the policy decides when it goes).
    budgeted: bool,
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

    pub fn expires_at(&self) -> Option<SystemTime> {
        *lock(&self.expires_at)
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
        // Under a budget the policy decides when it goes (see `residency`).
        if self.active.load(Ordering::SeqCst) > 0 || self.budgeted {
            return None;
        }
        match *lock(&self.keep_alive) {
            KeepAlive::Forever => None,
            KeepAlive::For(d) => Some(d),
        }
    }

    fn set_keep_alive(&self, keep_alive: KeepAlive) {
        *lock(&self.keep_alive) = keep_alive;
        *lock(&self.expires_at) = match keep_alive {
            KeepAlive::Forever => None,
            KeepAlive::For(d) => Some(SystemTime::now() + d),
        };
    }
}

/// Poisoning cannot leave these plain values inconsistent: keep going.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct KeepAliveExpiry;

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
    model: Arc<LoadedModel>,
    loaded: Cache<Arc<PathBuf>, Arc<LoadedModel>>,
    /// Time this request spent loading the model (zero when it was loaded).
    pub load_duration: Duration,
    /// The global budget this request is counted in, if any.
    budget: Option<(Arc<GlobalBudget>, hypura_scheduler::budget::ModelId)>,
    /// Turns true when the server stops waiting for in-flight requests.
    cancel: tokio::sync::watch::Receiver<bool>,
    /// Counted as a request (false: a view for `/api/ps`, which neither
    /// keeps the model loaded nor renews its keep-alive).
    counted: bool,
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

/// Names → files, and the loaded models.
pub struct Registry {
    names: DashMap<String, NamedModel>,
    loaded: Cache<Arc<PathBuf>, Arc<LoadedModel>>,
    settings: EngineSettings,
    /// Set when `--gpu-budget` or `--ram-budget` is: every model then streams
    /// and shares it ([`GlobalBudget`]).
    budget: Option<Arc<GlobalBudget>>,
    /// Sends true to end every lease's generation ([`Registry::cancel_in_flight`]).
    cancel: tokio::sync::watch::Sender<bool>,
    /// Other servers models are routed to ([`crate::pool::upstream`]), set once at start-up.
    upstreams: std::sync::OnceLock<Arc<crate::pool::upstream::Upstreams>>,
    /// Model files served by name that can never run within the global
    /// budget, and why (naming the minimum): listed, refused when asked for.
    unfit: DashMap<Arc<PathBuf>, String>,
}

impl Registry {
    pub fn new(settings: EngineSettings) -> Registry {
        let loaded = Cache::builder()
            .expire_after(KeepAliveExpiry)
            .eviction_listener(|path: Arc<Arc<PathBuf>>, model: Arc<LoadedModel>, cause| {
                tracing::info!("unloading {} ({cause:?})", path.display());
                crate::metrics::model_unloaded(&model.name);
                // Finishes what is in flight; memory goes with the last lease.
                std::thread::spawn(move || {
                    model.shutdown();
                    crate::metrics::model_gone(&model.name, model.id, model.stream_counters());
                });
            })
            .build();
        let budget = (settings.gpu_budget_bytes.is_some() || settings.ram_budget_bytes.is_some())
            .then(|| {
                Arc::new(GlobalBudget::new(
                    settings.gpu_budget_bytes.unwrap_or(0),
                    settings.ram_budget_bytes.unwrap_or(u64::MAX),
                    PolicyConfig {
                        demote_after: settings.demote_after,
                        ..PolicyConfig::default()
                    },
                ))
            });
        Registry {
            names: DashMap::new(),
            loaded,
            settings,
            budget,
            cancel: tokio::sync::watch::Sender::new(false),
            upstreams: std::sync::OnceLock::new(),
            unfit: DashMap::new(),
        }
    }

    /// Routes the models of `upstreams` too (once; a second call is ignored).
    pub fn attach_upstreams(&self, upstreams: Arc<crate::pool::upstream::Upstreams>) {
        let _ = self.upstreams.set(upstreams);
    }

    /// The upstreams, when any are configured.
    pub fn upstreams(&self) -> Option<&Arc<crate::pool::upstream::Upstreams>> {
        self.upstreams.get()
    }

    /// Ends every generation in flight now: each answers its client with a
    /// final error ("shutting down") and frees its slot. For shutdown only.
    pub fn cancel_in_flight(&self) {
        self.cancel.send_replace(true);
    }

    pub fn settings(&self) -> &EngineSettings {
        &self.settings
    }

    /// The global budget's limit and what it charges now, per tier (`None`
    /// without a budget).
    pub fn budget_books(&self) -> Option<(Footprint, Footprint)> {
        let policy = self.budget.as_ref()?.policy();
        Some((policy.budget(), policy.charged()))
    }

    /// Serves `path` as `name`; fails if the name is taken by another file.
    pub fn register(
        &self,
        name: ModelName,
        path: PathBuf,
        info: Arc<ModelInfo>,
    ) -> Result<(), String> {
        self.register_with(name, path, info, ModelPolicy::default())
    }

    /// [`Registry::register`] with per-model settings.
    pub fn register_with(
        &self,
        name: ModelName,
        path: PathBuf,
        info: Arc<ModelInfo>,
        policy: ModelPolicy,
    ) -> Result<(), String> {
        if let Some(existing) = self.names.get(&name.key) {
            if **existing.source.local_path() != path {
                return Err(format!(
                    "two models are named {}: {} and {}",
                    name.display,
                    existing.source,
                    path.display()
                ));
            }
            return Ok(());
        }
        let named = NamedModel {
            name: name.display,
            source: ModelSource::local(path),
            info,
            policy,
            created: None,
        };
        if let Err(why) = self.add_to_budget(&named) {
            // Listed all the same: a request for it is refused with why.
            eprintln!("hypura: {why}: listed, and refused when asked for");
            self.unfit
                .insert(Arc::clone(named.source.local_path()), why);
        }
        self.names.insert(name.key, named);
        Ok(())
    }

    /// Why the model named `name` can never run within the global budget
    /// (`None`: it can, or there is no budget).
    pub fn unfit_reason(&self, name: &ModelName) -> Option<String> {
        self.unfit_reason_of(&self.resolve(name)?)
    }

    /// Why the model `named` can never run within the global budget.
    pub fn unfit_reason_of(&self, named: &NamedModel) -> Option<String> {
        self.unfit
            .get(named.source.local_path())
            .map(|why| why.clone())
    }

    /// Every model served by name that can never run within the budget,
    /// with why, sorted by name.
    pub fn unfit(&self) -> Vec<(String, String)> {
        let mut all: Vec<(String, String)> = self
            .names
            .iter()
            .filter_map(|e| {
                let why = self.unfit.get(e.source.local_path())?;
                Some((e.name.clone(), why.clone()))
            })
            .collect();
        all.sort();
        all
    }

    /// Requests waiting for room in the global budget now, per model name
    /// (models with none left out; empty without a budget).
    pub fn waiting_for_room(&self) -> Vec<(String, usize)> {
        self.budget
            .as_ref()
            .map_or_else(Vec::new, |budget| budget.waiting())
    }

    /// Counts a model file in the global budget (if there is one): fails,
    /// naming the minimum, when it cannot stream within it.
    fn add_to_budget(&self, named: &NamedModel) -> Result<(), String> {
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

    /// `/api/pull`: serves `path` as `name` with fresh `info`, replacing an
    /// entry of the same file (its bytes may have changed: a loaded copy is
    /// unloaded); fails if the name is taken by another file.
    pub fn register_pulled(
        &self,
        name: ModelName,
        path: PathBuf,
        info: Arc<ModelInfo>,
    ) -> Result<(), String> {
        let policy = match self.names.get(&name.key) {
            Some(existing) if **existing.source.local_path() != path => {
                return Err(format!(
                    "the name {} is taken by {}: pull under another name",
                    name.display, existing.source
                ))
            }
            Some(existing) => existing.policy,
            None => ModelPolicy::default(),
        };
        let source = ModelSource::local(path);
        self.loaded.invalidate(source.local_path());
        let named = NamedModel {
            name: name.display,
            source,
            info,
            policy,
            created: None,
        };
        self.add_to_budget(&named)?;
        self.names.insert(name.key, named);
        Ok(())
    }

    /// `/api/create`: serves `manifest` as `name`, with the settings of the
    /// models already served from its file (if any), replacing a created
    /// model of that name; fails if a model served from a file as it is
    /// has the name.
    pub fn register_created(
        &self,
        name: ModelName,
        info: Arc<ModelInfo>,
        manifest: Arc<Manifest>,
    ) -> Result<(), String> {
        let taken_by = self
            .names
            .get(&name.key)
            .filter(|existing| existing.created.is_none())
            .map(|existing| existing.source.to_string());
        if let Some(file) = taken_by {
            return Err(format!(
                "the name {} is taken by the model served from {file}: give another name",
                name.display
            ));
        }
        let source = ModelSource::local(manifest.weights.clone());
        let sibling = self
            .names
            .iter()
            .find(|e| e.source == source)
            .map(|e| e.policy);
        let named = NamedModel {
            name: name.display,
            source,
            info,
            policy: sibling.unwrap_or_default(),
            created: Some(manifest),
        };
        if sibling.is_none() {
            self.add_to_budget(&named)?;
        }
        self.names.insert(name.key, named);
        Ok(())
    }

    /// What is known of the file at `path`, when a model is served from it.
    pub fn info_of(&self, path: &Path) -> Option<Arc<ModelInfo>> {
        self.names
            .iter()
            .find(|e| e.source.local_path().as_path() == path)
            .map(|e| Arc::clone(&e.info))
    }

    pub fn resolve(&self, name: &ModelName) -> Option<NamedModel> {
        self.names.get(&name.key).map(|e| e.value().clone())
    }

    /// Every name, sorted.
    pub fn list(&self) -> Vec<NamedModel> {
        let mut all: Vec<NamedModel> = self.names.iter().map(|e| e.value().clone()).collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// The models in memory now, by name.
    pub fn loaded(&self) -> Vec<Arc<LoadedModel>> {
        let mut all: Vec<Arc<LoadedModel>> = self.loaded.iter().map(|(_, v)| v).collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Loads the model named `name` unless it is loaded, and holds it for one
    /// request. `keep_alive` (default: the server's) applies after the request.
    pub async fn acquire(
        &self,
        requested: &str,
        name: &ModelName,
        keep_alive: Option<KeepAlive>,
    ) -> Result<ModelLease, ModelsError> {
        self.acquire_with_context(requested, name, keep_alive, None)
            .await
    }

    /// [`Registry::acquire`] with at least `context` tokens per sequence, as
    /// Ollama honours `num_ctx`: a model loaded with a smaller context is
    /// loaded again with this one (requests in flight finish on the old
    /// load), and keeps it until it unloads; smaller asks run in the larger
    /// slots. Under a global budget, whose books were made for the
    /// configured context, a larger one is refused naming the limit.
    pub async fn acquire_with_context(
        &self,
        requested: &str,
        name: &ModelName,
        keep_alive: Option<KeepAlive>,
        context: Option<u32>,
    ) -> Result<ModelLease, ModelsError> {
        let mut named = self
            .resolve(name)
            .ok_or_else(|| ModelsError::NotFound(requested.to_string()))?;
        if let Some(why) = self.unfit.get(named.source.local_path()) {
            return Err(ModelsError::Rejected(format!(
                "model '{requested}' cannot run on this server: {}",
                why.value()
            )));
        }
        let configured = batch_config(&named, &self.settings).n_ctx_per_seq;
        let needed = context.unwrap_or(0).max(configured);
        if needed > configured {
            if self.budget.is_some() {
                return Err(ModelsError::Rejected(format!(
                    "options.num_ctx {needed} is more than model '{requested}' is served with \
                     under the memory budget: at most {configured} tokens (raise it with \
                     --context or the model's `context` in the configuration)"
                )));
            }
            named.policy.n_ctx_per_seq = Some(needed);
        }
        let started = Instant::now();
        let default_keep_alive = named
            .policy
            .keep_alive
            .unwrap_or(self.settings.default_keep_alive);
        let keep_alive = keep_alive.unwrap_or(default_keep_alive);
        let (model, budget) = match &self.budget {
            Some(budget) => {
                let (model, in_flight) = self.admit(budget, named, keep_alive).await?;
                (model, Some(in_flight))
            }
            None => {
                let loaded = self.loaded.clone();
                let settings = self.settings.clone();
                let key = Arc::clone(named.source.local_path());
                let span = tracing::Span::current();
                let model = tokio::task::spawn_blocking(move || {
                    span.in_scope(|| {
                        let model = loaded
                            .try_get_with(Arc::clone(&key), || load(&named, &settings, None))
                            .map_err(|e| (*e).clone())?;
                        let stale = |m: &LoadedModel| m.is_dead() || m.n_ctx_per_seq < needed;
                        if !stale(&model) {
                            return Ok(model);
                        }
                        replace_stale(&loaded, key, stale, || load(&named, &settings, None))
                    })
                })
                .await
                .map_err(|e| ModelsError::Failed(format!("model load task failed: {e}")))??;
                (model, None)
            }
        };
        let load_duration = started.elapsed();
        model.active.fetch_add(1, Ordering::SeqCst);
        // From here the lease finishes the request (no await in between).
        let budget = budget.map(InFlight::into_parts);
        model.set_keep_alive(keep_alive);
        // A read recomputes the expiry: none while the lease lives.
        let _ = self.loaded.get(&model.path);
        Ok(ModelLease {
            model,
            loaded: self.loaded.clone(),
            load_duration,
            budget,
            cancel: self.cancel.subscribe(),
            counted: true,
        })
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

    /// Admission under the global budget: the model is loaded (streaming at
    /// least) and the request counted in flight once this returns (the
    /// [`InFlight`] finishes it when dropped). Waits for room while other
    /// models are busy, up to [`ADMISSION_TIMEOUT`], counted as waiting
    /// meanwhile. Dropped at any await (a client gone), it leaves the books
    /// right: a load it started is reported by the load's own thread.
    async fn admit(
        &self,
        budget: &Arc<GlobalBudget>,
        named: NamedModel,
        keep_alive: KeepAlive,
    ) -> Result<(Arc<LoadedModel>, InFlight), ModelsError> {
        let path = Arc::clone(named.source.local_path());
        let id = budget
            .model(&path)
            .ok_or_else(|| ModelsError::Failed(format!("{} is not in the budget", named.name)))?
            .id;
        budget.set_keep_alive(
            id,
            match keep_alive {
                KeepAlive::Forever => None,
                KeepAlive::For(d) => Some(d),
            },
        );
        let deadline = Instant::now() + ADMISSION_TIMEOUT;
        let mut waiting = None;
        loop {
            let changed = budget.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match budget.request(id) {
                Admission::Ready => {
                    let in_flight = InFlight::admitted(budget, id);
                    match self.loaded.get(&path) {
                        Some(model) if model.is_dead() => {
                            let model = self.revive(budget, &named).await?;
                            return Ok((model, in_flight));
                        }
                        Some(model) => return Ok((model, in_flight)),
                        None if !budget.is_moving(id) => {
                            // Loaded in the books but gone from the cache
                            // (a pull replaced the file): load it again.
                            let model = self.revive(budget, &named).await?;
                            return Ok((model, in_flight));
                        }
                        None => {}
                    }
                    // Another request is loading it: wait for that load
                    // (its end is a change), not counted meanwhile.
                    drop(in_flight);
                    let loaded = budget.changed.notified();
                    tokio::pin!(loaded);
                    loaded.as_mut().enable();
                    if !self.loaded.contains_key(&path) {
                        let _ = tokio::time::timeout(Duration::from_secs(1), loaded).await;
                    }
                    continue;
                }
                Admission::Load { mv } => {
                    let in_flight = InFlight::admitted(budget, id);
                    let model = self.load_admitted(budget, &named, mv).await?;
                    return Ok((model, in_flight));
                }
                Admission::Wait { moves } => {
                    waiting.get_or_insert_with(|| budget.start_waiting(id));
                    execute_moves(budget, &self.loaded, moves);
                }
                Admission::Reject(why) => return Err(ModelsError::Rejected(why)),
            }
            if Instant::now() >= deadline {
                let draining = budget.draining();
                let held_by = if draining.is_empty() {
                    "moves of other models are under way".to_string()
                } else {
                    format!("{} busy", draining.join(", "))
                };
                return Err(ModelsError::NoRoom(format!(
                    "no room in the memory budget for {} after {} s ({held_by}); retry later",
                    named.name,
                    ADMISSION_TIMEOUT.as_secs()
                )));
            }
            // Woken by a finished request or move; time alone can also make
            // room (a waiter that gave up stops counting), so look again each second.
            let _ = tokio::time::timeout(Duration::from_secs(1), changed).await;
        }
    }

    /// Loads a model the policy admitted a request for with `mv`, and
    /// reports the move on the loading thread, whatever becomes of the
    /// request meanwhile (a move never reported would hold its charge, and
    /// the model, for ever).
    async fn load_admitted(
        &self,
        budget: &Arc<GlobalBudget>,
        named: &NamedModel,
        mv: Move,
    ) -> Result<Arc<LoadedModel>, ModelsError> {
        let loaded = self.loaded.clone();
        let settings = self.settings.clone();
        let key = Arc::clone(named.source.local_path());
        let budgeted = budget.model(&key).map(|m| (m, mv.to));
        let (named, budget) = (named.clone(), Arc::clone(budget));
        let span = tracing::Span::current();
        tokio::task::spawn_blocking(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                span.in_scope(|| {
                    loaded
                        .try_get_with(key, || load(&named, &settings, budgeted))
                        .map_err(|e| (*e).clone())
                })
            }))
            .unwrap_or_else(|_| Err(ModelsError::Failed("the model load panicked".into())));
            match &result {
                Ok(_) => budget.move_done(mv),
                Err(_) => budget.move_failed(mv),
            }
            result
        })
        .await
        .map_err(|e| ModelsError::Failed(format!("model load task failed: {e}")))?
    }

    /// Reloads a model whose runner crashed, at its residency under the
    /// budget (which still counts it loaded there).
    async fn revive(
        &self,
        budget: &Arc<GlobalBudget>,
        named: &NamedModel,
    ) -> Result<Arc<LoadedModel>, ModelsError> {
        let path = Arc::clone(named.source.local_path());
        let budgeted = budget
            .model(&path)
            .ok_or_else(|| ModelsError::Failed(format!("{} is not in the budget", named.name)))?;
        let level = budget
            .residency(&path)
            .unwrap_or(Residency::Streaming)
            .max(Residency::Streaming);
        let (loaded, settings, named) = (self.loaded.clone(), self.settings.clone(), named.clone());
        let span = tracing::Span::current();
        tokio::task::spawn_blocking(move || {
            span.in_scope(|| {
                replace_dead(&loaded, path, || {
                    load(&named, &settings, Some((budgeted, level)))
                })
            })
        })
        .await
        .map_err(|e| ModelsError::Failed(format!("model load task failed: {e}")))?
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
    fn unload_file(&self, path: &Arc<PathBuf>) {
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

    /// `/api/copy`: `destination` names the same file as `source`.
    pub fn copy(&self, source: &ModelName, destination: ModelName) -> Result<(), ModelsError> {
        let named = self
            .resolve(source)
            .ok_or_else(|| ModelsError::NotFound(source.display.clone()))?;
        self.names.insert(
            destination.key,
            NamedModel {
                name: destination.display,
                ..named
            },
        );
        Ok(())
    }

    /// `/api/delete`: forgets the name (the file is left alone); the model is
    /// unloaded when no other name serves its file. What the name served.
    pub fn delete(&self, name: &ModelName) -> Result<NamedModel, ModelsError> {
        let (_, named) = self
            .names
            .remove(&name.key)
            .ok_or_else(|| ModelsError::NotFound(name.display.clone()))?;
        if !self.names.iter().any(|e| e.source == named.source) {
            self.unload_file(named.source.local_path());
        }
        Ok(named)
    }

    /// Expires idle models whose keep-alive has passed (moka evicts lazily).
    pub fn run_pending_tasks(&self) {
        self.loaded.run_pending_tasks();
        if let Some(budget) = &self.budget {
            let moves = budget.tick();
            execute_moves(budget, &self.loaded, moves);
        }
    }

    /// Stops every engine: in-flight requests finish, new ones are refused.
    pub fn shutdown(&self) {
        for (_, model) in self.loaded.iter() {
            model.shutdown();
        }
    }
}

/// The model at `key`, loaded anew if its runner died (once, whoever asks
/// first: a request that finds a live one takes it).
fn replace_dead(
    loaded: &Cache<Arc<PathBuf>, Arc<LoadedModel>>,
    key: Arc<PathBuf>,
    load: impl FnOnce() -> Result<Arc<LoadedModel>, ModelsError>,
) -> Result<Arc<LoadedModel>, ModelsError> {
    replace_stale(loaded, key, LoadedModel::is_dead, load)
}

/// The model at `key`, loaded anew if it is `stale` (its runner died, or its
/// context is too small), once whoever asks first. The replaced load is
/// shut down by the cache's eviction listener: its requests in flight finish.
fn replace_stale(
    loaded: &Cache<Arc<PathBuf>, Arc<LoadedModel>>,
    key: Arc<PathBuf>,
    stale: impl Fn(&LoadedModel) -> bool,
    load: impl FnOnce() -> Result<Arc<LoadedModel>, ModelsError>,
) -> Result<Arc<LoadedModel>, ModelsError> {
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

/// How long a request waits for room in the global budget.
const ADMISSION_TIMEOUT: Duration = Duration::from_secs(300);

pub use crate::core::backend::TierBytes;

/// The model's training context from its metadata (unbounded when absent).
fn n_ctx_train(named: &NamedModel) -> u32 {
    named
        .info
        .context_length
        .map_or(u32::MAX, |n| n.min(u64::from(u32::MAX)) as u32)
}

/// The engine a model runs in (its context per sequence capped at the
/// model's training context).
fn batch_config(named: &NamedModel, settings: &EngineSettings) -> BatchConfig {
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
        n_threads: settings.n_threads,
        queue_limit: settings.queue_limit,
        prompt_cache: settings.prompt_cache.clone(),
    }
}

/// What the planner is asked for a model whatever its placement: the
/// server's budgets and the model's contexts. The GPU is used only when
/// given a budget (`--gpu-budget`); making it the default is this line.
fn plan_settings(named: &NamedModel, settings: &EngineSettings) -> PlanSettings {
    let config = batch_config(named, settings);
    PlanSettings {
        budgets: Budgets {
            gpu_bytes: Some(settings.gpu_budget_bytes.unwrap_or(0)),
            ram_bytes: settings.ram_budget_bytes,
        },
        context_tokens: config.n_ctx_per_seq,
        sequences: config.n_parallel,
        ..Default::default()
    }
}

/// What the budget needs to know of a model: its streaming placement (with
/// a GPU share of at most what `gpu_left` leaves it: see
/// [`crate::pool::hybrid`]), and the full placement (as many layers on the
/// GPU as the GPU budget holds beside their KV cache and compute buffers),
/// both the planner's, each with what its contexts hold, measured by
/// llama.cpp without loading any weight. `limit`: the whole budget.
fn budgeted_model(
    named: &NamedModel,
    settings: &EngineSettings,
    limit: Footprint,
    gpu_left: u64,
) -> Result<BudgetedModel, String> {
    let file = HeaderFile::open(named.source.local_path().as_path()).map_err(|e| e.to_string())?;
    let footprint = StreamFootprint::of(&file);
    let contexts = batch_config(named, settings).contexts(n_ctx_train(named));
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
    };
    let least = model.footprint_at(Residency::Streaming);
    log_plan_alone(named, &profile, base, least);
    Ok(model)
}

/// What the global budget charges the model file at `path` at the least
/// (its streaming placement: resident weights, contexts measured by
/// llama.cpp, the smallest stream cache, its runner) when served with
/// `settings`: the figure the server's plan line and its refusal name, for
/// `hypura inspect --plan`.
pub fn least_under_budget(path: &Path, settings: &EngineSettings) -> Result<Footprint, String> {
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
    let model = budgeted_model(&named, settings, limit, limit.gpu_bytes)?;
    Ok(model.footprint_at(Residency::Streaming))
}

/// Logs what the planner would choose for a model alone under the server's
/// budgets (what `hypura inspect --plan` shows for them); the budget policy
/// then shares the budgets between models by residency. `least`: what the
/// budget charges it at the least (streaming, its contexts and runner
/// included), the figure its refusal names when it cannot fit.
fn log_plan_alone(
    named: &NamedModel,
    profile: &HardwareProfile,
    base: PlanSettings,
    least: Footprint,
) {
    let alone = format!("alone under the budgets; at least {least} under the budget");
    match plan_model(named.source.local_path(), profile, base) {
        Ok((plan, _)) => log_placement(&named.name, &alone, &plan),
        Err(e) => eprintln!("hypura: {} {alone}: {e}", named.name),
    }
}

/// Carries out the budget's moves: cache resizes at once (a promotion then
/// fills the cache on a background thread), switches of placement on a
/// background thread (the new one loaded beside the old, the engine switched
/// between decode steps, the old freed), unloads through the cache of
/// loaded models (the engine finishes in-flight work; the policy never
/// unloads a model with requests in flight).
fn execute_moves(
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
fn stream_counters(stats: &llama_tiered::tiered::StreamStats) -> StreamCounters {
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
    use super::*;

    #[test]
    fn parameter_sizes_read_like_ollamas() {
        assert_eq!(parameter_size(134_515_008), "135M");
        assert_eq!(parameter_size(7_241_732_096), "7.2B");
        assert_eq!(parameter_size(950_000), "950K");
    }
}
