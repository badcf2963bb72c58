//! The model pool, the one door to every model: names → sources, the models
//! loaded now, the global memory budget and the moves between residencies,
//! and the upstreams models are routed to. It implements
//! [`crate::core::models::Models`] ([`models`]): local models first, then the
//! upstreams.
//!
//! - [`registry`]: `name:tag` → model source and facts; loaded models with keep-alive; leases.
//! - [`residency`]: the global budget (promotions, demotions, placements).
//! - [`hybrid`]: the GPU share of a model's streaming placement under the budget.
//! - [`local`]: the in-process llama-tiered engine behind [`crate::core::backend::ModelBackend`].
//! - [`runner`]: a model in a child process of its own behind the same trait.
//! - [`manifest`]: models made by `/api/create` (a file's weights with their own defaults).
//! - [`upstream`]: other servers models are routed to over HTTP.
//! - [`models`]: the pool behind [`crate::core::models::Models`]; one listing of local and remote models.
//! - [`planner`]: the hardware profile the server plans with, and its placements.
pub mod hybrid;
pub mod local;
pub mod manifest;
pub mod models;
pub mod planner;
pub mod registry;
pub mod residency;
pub mod runner;
pub mod upstream;

use std::sync::Arc;
use std::time::SystemTime;

use crate::core::backend::{ModelBackend, ModelFacts};
use crate::core::models::{BackendLease, ModelsError};
use crate::core::validation::{KeepAlive, ModelName};

impl registry::Registry {
    /// The model named `name`, loaded (or admitted under the budget) with at
    /// least `context` tokens per sequence (see
    /// [`registry::Registry::acquire_with_context`]) and held for one
    /// request, behind its [`crate::core::backend::ModelBackend`].
    /// `keep_alive` (default: the model's) applies after the request.
    pub async fn backend_with_context(
        &self,
        requested: &str,
        name: &ModelName,
        keep_alive: Option<KeepAlive>,
        context: Option<u32>,
    ) -> Result<BackendLease, ModelsError> {
        let lease = self
            .acquire_with_context(requested, name, keep_alive, context)
            .await
            .inspect_err(|e| {
                if let ModelsError::NoRoom(_) = e {
                    crate::metrics::rejected(
                        &name.display,
                        crate::metrics::Rejection::BudgetTimeout,
                    );
                }
            })?;
        Ok(BackendLease {
            load_duration: lease.load_duration,
            backend: backend_of(lease),
        })
    }

    /// The models in memory now, by name, each behind its backend (a view:
    /// it neither keeps the model loaded nor renews its keep-alive).
    pub fn loaded_backends(&self) -> Vec<LoadedBackend> {
        self.loaded()
            .into_iter()
            .map(|model| LoadedBackend {
                name: model.name.clone(),
                id: model.id,
                expires_at: model.expires_at(),
                backend: backend_of(self.observe(model)),
            })
            .collect()
    }
}

/// The backend of a leased model: where it runs.
fn backend_of(lease: registry::ModelLease) -> Arc<dyn ModelBackend> {
    match &lease.engine {
        registry::Engine::InProcess(local) => {
            let local = Arc::clone(local);
            Arc::new(local::LocalBackend::new(lease, local))
        }
        registry::Engine::Runner(process) => {
            let process = Arc::clone(process);
            Arc::new(runner::client::RunnerBackend::new(lease, process))
        }
    }
}

/// A model in memory, for `/api/ps`.
pub struct LoadedBackend {
    /// The name it was loaded under.
    pub name: String,
    /// Unique to this load of it (a reload gets another).
    pub id: u64,
    /// When it unloads if idle; `None` = never.
    pub expires_at: Option<SystemTime>,
    pub backend: Arc<dyn ModelBackend>,
}

impl registry::NamedModel {
    /// What the model is, from its source, without loading it.
    pub fn facts(&self) -> ModelFacts {
        let mut facts = match &self.source {
            registry::ModelSource::Local(_) => self.info.facts(),
        };
        if let Some(template) = self.created.as_ref().and_then(|m| m.template.clone()) {
            facts.template = template;
        }
        facts
    }
}
