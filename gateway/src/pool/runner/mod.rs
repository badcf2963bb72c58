//! Runner processes: each model `serve` loads runs in a child process of
//! its own (`hypura runner`), so that a crash in llama.cpp (a failed
//! `GGML_ASSERT`, a CUDA error) or in our unsafe code ends that model's
//! in-flight requests only, never the server.
//!
//! The gateway keeps the registry, the budget and its policy; a runner holds
//! one model placement, in-process there ([`crate::pool::local`] over the
//! registry's loader), and does what the gateway asks over a Unix socket
//! ([`protocol`]): generate, embed, count tokens, report its status and its
//! memory by tier, move between residencies.
//!
//! - [`protocol`]: the frames, versioned, one JSON line each.
//! - [`process`]: starting a runner, its stderr, its death (logged with its
//!   last stderr lines, counted); children die with the gateway.
//! - [`client`]: the gateway's side of the connection and
//!   [`client::RunnerBackend`], a runner's model behind
//!   [`crate::core::backend::ModelBackend`].
//! - [`host`]: the runner's side (`hypura runner`).
//!
//! A runner that died stays in the registry until the next request for its
//! model, which loads it in a new runner (at the residency the budget holds
//! it at).
pub mod client;
pub mod host;
pub mod process;
pub mod protocol;

use std::sync::Arc;

use hypura_scheduler::budget::Residency;
use llama_tiered::tiered::footprint::StreamFootprint;

pub use process::{RunnerProcess, Runners};
use protocol::{BudgetedSpec, EngineSpec, FullSpec, LoadSpec};

use super::planner::ServerProfile;
use super::registry::{EngineSettings, ModelInfo, ModelPolicy, ModelSource, NamedModel, Registry};
use super::residency::{BudgetedModel, FullPlacement};
use crate::core::validation::{KeepAlive, ModelName};

/// What a runner is asked to load for `named`.
pub fn load_spec(
    named: &NamedModel,
    settings: &EngineSettings,
    budgeted: Option<(BudgetedModel, Residency)>,
) -> LoadSpec {
    LoadSpec {
        name: named.name.clone(),
        path: named.source.local_path().to_path_buf(),
        engine: EngineSpec {
            n_ctx_per_seq: settings.n_ctx_per_seq,
            n_parallel: settings.n_parallel,
            n_batch: settings.n_batch,
            n_threads: settings.n_threads,
            queue_limit: settings.queue_limit,
            gpu_budget_bytes: settings.gpu_budget_bytes,
            ram_budget_bytes: settings.ram_budget_bytes,
            profile: (*settings.profile.get()).clone(),
            model_n_ctx_per_seq: named.policy.n_ctx_per_seq,
            model_n_parallel: named.policy.n_parallel,
            prompt_cache: settings.prompt_cache.clone(),
        },
        budgeted: budgeted.map(|(model, level)| BudgetedSpec {
            level,
            streaming_contexts: model.streaming_contexts,
            streaming_gpu: model.streaming_gpu,
            full: model.full.map(|full| FullSpec {
                gpu: full.gpu,
                weights: full.weights,
                contexts: full.contexts,
            }),
            cache_limit: model.cache_limit,
            settings: model.settings,
            overhead: model.overhead,
            prompt_cache_bytes: model.prompt_cache_bytes,
            prompt_pass: model.prompt_pass,
        }),
    }
}

/// What a runner loads, as the registry's loader takes it: the model (its
/// header read here), the engine settings, and its placements under the
/// budget with the residency to load.
pub type Loadable = (
    NamedModel,
    EngineSettings,
    Option<(BudgetedModel, Residency)>,
);

/// The runner's side of [`load_spec`].
pub fn from_spec(spec: LoadSpec) -> Result<Loadable, String> {
    let info = ModelInfo::read(&spec.path).map_err(|e| format!("{}: {e}", spec.name))?;
    let e = spec.engine;
    let profile = ServerProfile::new(e.profile);
    let named = NamedModel {
        name: spec.name,
        source: ModelSource::local(spec.path),
        info: Arc::new(info),
        policy: ModelPolicy {
            n_ctx_per_seq: e.model_n_ctx_per_seq,
            n_parallel: e.model_n_parallel,
            ..ModelPolicy::default()
        },
        created: None,
    };
    let settings = EngineSettings {
        n_ctx_per_seq: e.n_ctx_per_seq,
        n_parallel: e.n_parallel,
        n_batch: e.n_batch,
        n_threads: e.n_threads,
        queue_limit: e.queue_limit,
        default_keep_alive: KeepAlive::Forever,
        // The gateway's budget decides moves; a runner has none of its own.
        demote_after: std::time::Duration::MAX,
        gpu_budget_bytes: e.gpu_budget_bytes,
        ram_budget_bytes: e.ram_budget_bytes,
        profile: Arc::clone(&profile),
        runners: None,
        // The gateway applies it before a request reaches the runner.
        default_max_tokens: u32::MAX,
        prompt_cache: e.prompt_cache.clone(),
    };
    let budgeted = match spec.budgeted {
        None => None,
        Some(b) => {
            let file = hypura_gguf::GgufFile::open(named.source.local_path().as_path())
                .map_err(|e| format!("{}: {e}", named.name))?;
            let model = BudgetedModel {
                id: 0,
                footprint: StreamFootprint::of(&file),
                streaming_contexts: b.streaming_contexts,
                streaming_gpu: b.streaming_gpu,
                full: b.full.map(|full| FullPlacement {
                    gpu: full.gpu,
                    weights: full.weights,
                    contexts: full.contexts,
                }),
                cache_limit: b.cache_limit,
                settings: b.settings,
                profile,
                overhead: b.overhead,
                prompt_cache_bytes: b.prompt_cache_bytes,
                prompt_pass: b.prompt_pass,
            };
            Some((model, b.level))
        }
    };
    Ok((named, settings, budgeted))
}

impl Registry {
    /// Runner processes that crashed since the server started (0 when
    /// models run in the server's process).
    pub fn runner_crashes(&self) -> u64 {
        self.settings().runners.as_ref().map_or(0, |r| r.crashes())
    }

    /// Test hook: makes the runner of the model named `name` abort, as a
    /// failed assertion in llama.cpp would. `Ok(false)`: the model is not
    /// loaded in a runner. The runner refuses unless it runs with
    /// `HYPURA_RUNNER_TEST_HOOKS=1`.
    pub fn abort_runner(&self, name: &ModelName) -> Result<bool, String> {
        match self.live_runner(name) {
            Some(runner) => runner.abort().map(|()| true).map_err(|e| e.to_string()),
            None => Ok(false),
        }
    }

    /// Test hook: makes the runner of the model named `name` take and keep
    /// `bytes` of memory besides the model's. `Ok(false)`: the model is not
    /// loaded in a live runner. Refused unless the runner runs with
    /// `HYPURA_RUNNER_TEST_HOOKS=1`.
    pub fn runner_ballast(&self, name: &ModelName, bytes: u64) -> Result<bool, String> {
        match self.live_runner(name) {
            Some(runner) => runner
                .ballast(bytes)
                .map(|()| true)
                .map_err(|e| e.to_string()),
            None => Ok(false),
        }
    }

    /// The live runner of the model named `name`, if it runs in one. A
    /// runner that crashed (its model not yet reloaded) is not live.
    fn live_runner(&self, name: &ModelName) -> Option<Arc<RunnerProcess>> {
        let named = self.resolve(name)?;
        let path = named.source.local_path();
        self.loaded().into_iter().find_map(|m| match &m.engine {
            super::registry::Engine::Runner(r) if &m.path == path && !r.is_dead() => {
                Some(Arc::clone(r))
            }
            _ => None,
        })
    }
}
