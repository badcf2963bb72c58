//! The global memory budget, applied: one [`BudgetPolicy`] over every model
//! file the registry serves, and the model facts it needs.
//!
//! With a budget, every model is loaded in its streaming placement (experts
//! or dense FFN on the STREAM tier) and its residency is the size of its
//! stream cache: `streaming` holds one layer's worth, `partial` half of the
//! streamed weights, `full` all of them (filled in the background after a
//! promotion). Moving between those needs no reload: the registry changes
//! the cache budget between decode steps ([`crate::server::registry`]).
//! Only loading and unloading change what is loaded.
//!
//! Charged per model: resident weights + KV cache of every slot (and of the
//! embedding context) + the stream cache of its residency. llama.cpp's
//! compute buffers are not counted (tens of MiB for small models).
//!
//! Lock order: the policy's mutex is never held across an await, a load or
//! an engine call.
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use hypura_scheduler::budget::{
    Admission, BudgetPolicy, Footprint, ModelId, ModelSpec, Move, PolicyConfig, Residency,
};
use llama_tiered::tiered::footprint::StreamFootprint;
use tokio::sync::Notify;

/// What the budget knows of one model file.
#[derive(Debug, Clone)]
pub struct BudgetedModel {
    pub id: ModelId,
    pub footprint: StreamFootprint,
    /// KV cache bytes of the engine's contexts.
    pub kv_bytes: u64,
}

impl BudgetedModel {
    /// Stream cache bytes at `level`.
    pub fn cache_bytes(&self, level: Residency) -> u64 {
        let f = &self.footprint;
        match level {
            Residency::Unloaded => 0,
            Residency::Streaming => f.minimum_cache_bytes,
            Residency::Partial => (f.stream_bytes / 2).max(f.minimum_cache_bytes),
            Residency::Full => f.stream_bytes.max(f.minimum_cache_bytes),
        }
    }

    /// Bytes in RAM at `level`.
    pub fn ram_bytes(&self, level: Residency) -> u64 {
        if level == Residency::Unloaded {
            return 0;
        }
        self.footprint.resident_bytes + self.kv_bytes + self.cache_bytes(level)
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
    origin: Instant,
    /// Woken after every move done and request finished: waiting requests
    /// ask again.
    pub changed: Notify,
}

impl GlobalBudget {
    pub fn new(gpu_bytes: u64, ram_bytes: u64) -> GlobalBudget {
        GlobalBudget {
            policy: Mutex::new(BudgetPolicy::new(
                Footprint::new(gpu_bytes, ram_bytes),
                PolicyConfig::default(),
            )),
            models: Mutex::new(HashMap::new()),
            origin: Instant::now(),
            changed: Notify::new(),
        }
    }

    pub fn policy(&self) -> MutexGuard<'_, BudgetPolicy> {
        self.policy.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn models(&self) -> MutexGuard<'_, HashMap<Arc<PathBuf>, BudgetedModel>> {
        self.models.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Time on the policy's clock.
    pub fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// Adds a model file (once; a second name for the same file shares it).
    /// Fails, naming the minimum, when it cannot stream within the budget.
    pub fn add(
        &self,
        path: &Arc<PathBuf>,
        footprint: StreamFootprint,
        kv_bytes: u64,
        terms: Terms,
    ) -> Result<(), String> {
        let mut models = self.models();
        if models.contains_key(path) {
            return Ok(());
        }
        let mut model = BudgetedModel {
            id: 0,
            footprint,
            kv_bytes,
        };
        let spec = ModelSpec {
            name: terms.name,
            streaming: Footprint::new(0, model.ram_bytes(Residency::Streaming)),
            partial: Footprint::new(0, model.ram_bytes(Residency::Partial)),
            full: Footprint::new(0, model.ram_bytes(Residency::Full)),
            pin: terms.pin,
            priority: terms.priority,
            keep_alive: terms.keep_alive,
        };
        model.id = self.policy().add_model(spec)?;
        models.insert(Arc::clone(path), model);
        Ok(())
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

    pub fn request(&self, id: ModelId) -> Admission {
        let now = self.now();
        self.policy().request(id, now)
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
    use llama_tiered::tiered::Mode;

    fn footprint() -> StreamFootprint {
        StreamFootprint {
            mode: Mode::DenseFfnStreaming,
            resident_bytes: 100,
            stream_bytes: 300,
            minimum_cache_bytes: 10,
            kv_bytes_per_token: 1,
        }
    }

    #[test]
    fn each_residency_charges_resident_kv_and_its_cache() {
        let m = BudgetedModel {
            id: 0,
            footprint: footprint(),
            kv_bytes: 50,
        };
        assert_eq!(m.ram_bytes(Residency::Unloaded), 0);
        assert_eq!(m.ram_bytes(Residency::Streaming), 160);
        assert_eq!(m.ram_bytes(Residency::Partial), 300);
        assert_eq!(m.ram_bytes(Residency::Full), 450);
    }

    #[test]
    fn a_model_too_big_to_stream_is_refused_with_its_minimum() {
        let budget = GlobalBudget::new(0, 150);
        let path = Arc::new(PathBuf::from("/m/a.gguf"));
        let terms = Terms {
            name: "a:latest".into(),
            pin: Residency::Unloaded,
            priority: 0,
            keep_alive: None,
        };
        let err = budget.add(&path, footprint(), 50, terms).unwrap_err();
        assert!(err.contains("a:latest needs at least"), "{err}");
        assert!(budget.model(&path).is_none());
    }
}
