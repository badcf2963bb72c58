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
//!
//! One module a concern, each over the one [`Registry`]:
//! - [`names`]: `name:tag` → model source and what its GGUF header says;
//!   registering, copying and deleting names.
//! - [`leases`]: the models loaded now, their keep-alive, and a request's
//!   hold on one ([`ModelLease`]).
//! - [`admission`]: a request admitted to its model, with or without the
//!   global budget (waiting for room, loading, reviving a dead runner).
//! - [`loading`]: a model's engine started, in this process or a runner.
//! - [`moves`]: the budget's moves carried out (cache resizes, switches of
//!   placement, unloads).
//! - [`placement`]: what the planner is asked for a model, and what the
//!   budget charges for it.

pub mod admission;
pub mod leases;
pub mod loading;
pub mod moves;
pub mod names;
pub mod placement;

pub use admission::Arrival;
pub use leases::{Engine, InProcess, LoadedModel, ModelLease};
pub use loading::load;
pub use names::{hex, parameter_size, ModelInfo, ModelSource, NamedModel};
pub use placement::{least_under_budget, served_plan};

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;
use hypura_scheduler::budget::{Footprint, PolicyConfig};
use moka::sync::Cache;

use crate::core::validation::KeepAlive;
use crate::pool::planner::ServerProfile;
use crate::pool::residency::GlobalBudget;
use crate::pool::runner::Runners;
use leases::KeepAliveExpiry;
use moves::execute_moves;

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

/// Poisoning cannot leave these plain values inconsistent: keep going.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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
    /// Requests held at each model's fair gate now, by the name they asked
    /// for ([`Arrival`]).
    at_gate: admission::GateCounts,
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
            at_gate: Arc::default(),
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

    /// The most the global budget has charged at once since start, per
    /// tier (`None` without a budget).
    pub fn budget_peak(&self) -> Option<Footprint> {
        Some(self.budget.as_ref()?.peak_charged())
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

pub use crate::core::backend::TierBytes;

/// Settings, facts and names for the modules' tests (no model file is read).
#[cfg(test)]
pub(super) mod testing {
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    use super::{EngineSettings, ModelInfo, ModelPolicy, ModelSource, NamedModel};
    use crate::core::validation::{KeepAlive, ModelName};
    use crate::pool::planner::ServerProfile;

    /// The server's settings: 4096 tokens a sequence, 4 sequences, batches of
    /// 2, and the budgets given (none: no global budget).
    pub fn settings(
        gpu_budget_bytes: Option<u64>,
        ram_budget_bytes: Option<u64>,
    ) -> EngineSettings {
        EngineSettings {
            n_ctx_per_seq: 4096,
            n_parallel: 4,
            n_batch: 2,
            n_threads: 0,
            queue_limit: 8,
            default_keep_alive: KeepAlive::For(Duration::from_secs(300)),
            demote_after: Duration::from_secs(60),
            gpu_budget_bytes,
            ram_budget_bytes,
            profile: ServerProfile::new(llama_tiered::hwprobe::estimated()),
            runners: None,
            default_max_tokens: 128,
            prompt_cache: Default::default(),
        }
    }

    /// What a header with this training context says (no file read).
    pub fn info(context_length: Option<u64>) -> Arc<ModelInfo> {
        Arc::new(ModelInfo {
            architecture: "llama".into(),
            parameter_size: "135M".into(),
            quantization: "Q4_1".into(),
            context_length,
            file_bytes: 1000,
            modified: SystemTime::UNIX_EPOCH,
            digest: "d".into(),
            chat_template: None,
            model_info: serde_json::Map::new(),
            capabilities: vec!["completion"],
        })
    }

    pub fn name(raw: &str) -> ModelName {
        ModelName::parse(raw, "model").unwrap()
    }

    /// A registry under a 1 GiB RAM budget (no GPU) that names `ghost`, a
    /// file that does not exist and so can never be planned.
    pub fn with_ghost() -> (super::Registry, ModelName) {
        let registry = super::Registry::new(settings(Some(0), Some(1 << 30)));
        let ghost = name("ghost");
        registry
            .register(ghost.clone(), "/nonexistent/ghost.gguf".into(), info(None))
            .unwrap();
        (registry, ghost)
    }

    /// `name` served from `path`, with this training context and policy.
    pub fn named(name: &str, path: &str, context: Option<u64>, policy: ModelPolicy) -> NamedModel {
        NamedModel {
            name: self::name(name).display,
            source: ModelSource::local(path.into()),
            info: info(context),
            policy,
            created: None,
        }
    }
}
