//! Admission: a request for a model becomes a [`ModelLease`]. Without a
//! budget the model loads (once, whoever asks first) if it is not loaded or
//! its context is too small; under the global budget the policy admits the
//! request, makes room by moves, or has it wait (up to
//! [`ADMISSION_TIMEOUT`]).
//!
//! A request the server holds before it asks (at its model's fair gate,
//! while the model's slots are busy) is an [`Arrival`] from the moment it
//! came: counted waiting for its model ([`Registry::waiting`]) and, under
//! the budget, announced to the policy, so that the model is not idle to
//! requests for other models that came after it and it keeps its place
//! among the waiters ([`hypura_scheduler::budget::BudgetPolicy::arrive`]).
//! The gate runs the request's handler in the arrival's scope
//! ([`Arrival::scope`]): its admission here finds it there.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hypura_scheduler::budget::{Admission, Move, Residency};

use super::leases::{LoadedModel, ModelLease};
use super::loading::{load, replace_dead, replace_stale};
use super::moves::execute_moves;
use super::names::NamedModel;
use super::placement::batch_config;
use super::Registry;
use crate::core::models::ModelsError;
use crate::core::validation::{KeepAlive, ModelName};
use crate::pool::residency::{Announced, GlobalBudget, InFlight};

/// How long a request waits for room in the global budget.
const ADMISSION_TIMEOUT: Duration = Duration::from_secs(300);

/// Requests held at each model's fair gate, by the name they asked for.
pub(super) type GateCounts = Arc<Mutex<HashMap<String, usize>>>;

tokio::task_local! {
    /// The request being handled, when it came through its model's gate.
    static ARRIVAL: Arrival;
}

/// A request for a model, from when the server took it in until it asks
/// for the model (module docs); dropped, it counts no more.
pub struct Arrival {
    /// The name it is counted under while held at the gate, and the counts.
    at_gate: Option<(String, GateCounts)>,
    announced: Option<Announced>,
}

impl Arrival {
    /// It passed the gate: no longer counted waiting there (still
    /// announced until its admission).
    pub fn passed_gate(&mut self) {
        if let Some((name, counts)) = self.at_gate.take() {
            let mut counts = super::lock(&counts);
            if let Some(n) = counts.get_mut(&name) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    counts.remove(&name);
                }
            }
        }
    }

    /// Runs `handler` (the request's) with this arrival: its admission
    /// takes the place the arrival gave it.
    pub fn scope<F: Future>(self, handler: F) -> impl Future<Output = F::Output> {
        ARRIVAL.scope(self, handler)
    }
}

impl Drop for Arrival {
    fn drop(&mut self) {
        self.passed_gate();
    }
}

impl Registry {
    /// A request for `model` (a name the pool lists) came: see [`Arrival`].
    pub fn arrive(&self, model: &str) -> Arrival {
        *super::lock(&self.at_gate)
            .entry(model.to_string())
            .or_default() += 1;
        let announced = self.budget.as_ref().and_then(|budget| {
            let name = ModelName::parse(model, "model").ok()?;
            let named = self.resolve(&name)?;
            let id = budget.model(named.source.local_path())?.id;
            Some(budget.announce(id))
        });
        Arrival {
            at_gate: Some((model.to_string(), Arc::clone(&self.at_gate))),
            announced,
        }
    }

    /// Requests waiting for their model now, per model name (models with
    /// none left out), sorted by name: held at its fair gate (its slots
    /// busy), or waiting for room in the global budget to load it.
    pub fn waiting(&self) -> Vec<(String, usize)> {
        let mut all: HashMap<String, usize> = super::lock(&self.at_gate).clone();
        if let Some(budget) = &self.budget {
            for (name, n) in budget.waiting() {
                *all.entry(name).or_default() += n;
            }
        }
        let mut all: Vec<(String, usize)> = all.into_iter().filter(|&(_, n)| n > 0).collect();
        all.sort();
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
        let name_asked = named.name.clone();
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
        *super::lock(&model.asked_as) = name_asked;
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
        // Announced when it came, if it came through the gate.
        let ticket = ARRIVAL
            .try_with(|arrival| {
                let announced = arrival.announced.as_ref()?;
                (announced.is_of(budget) && announced.id == id).then_some(announced.ticket)
            })
            .ok()
            .flatten();
        let deadline = Instant::now() + ADMISSION_TIMEOUT;
        let mut waiting = None;
        loop {
            let changed = budget.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match budget.request(id, ticket) {
                Admission::Ready => {
                    let in_flight = InFlight::admitted(budget, id);
                    match self.loaded_by_now(budget, id, &path, deadline).await {
                        Some(model) if model.is_dead() => {
                            let model = self.revive(budget, &named).await?;
                            return Ok((model, in_flight));
                        }
                        Some(model) => return Ok((model, in_flight)),
                        None if !budget.is_moving(id)
                            && budget.residency(&path) > Some(Residency::Unloaded) =>
                        {
                            // Loaded in the books but gone from the cache
                            // (a pull replaced the file): load it again.
                            let model = self.revive(budget, &named).await?;
                            return Ok((model, in_flight));
                        }
                        // Its load failed, or is not done by the deadline:
                        // ask again, uncounted meanwhile.
                        None => {}
                    }
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

    /// The model at `path` once it is in the cache of loaded models: at
    /// once, or when the load under way (another request's) is done. The
    /// request waits counted in flight, as admitted when it came: a request
    /// for another model that comes meanwhile finds this one busy and waits
    /// behind it, never the other way round (uncounted, a request that came
    /// during its model's load lost its place to every request that came
    /// after it, and waited for their loads and work). `None` when the load
    /// failed, the model is not loading, or at the deadline.
    async fn loaded_by_now(
        &self,
        budget: &GlobalBudget,
        id: hypura_scheduler::budget::ModelId,
        path: &Arc<std::path::PathBuf>,
        deadline: Instant,
    ) -> Option<Arc<LoadedModel>> {
        loop {
            // A load's end is a change.
            let changed = budget.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(model) = self.loaded.get(path) {
                return Some(model);
            }
            if !budget.is_moving(id) || Instant::now() >= deadline {
                return None;
            }
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
}

#[cfg(test)]
mod tests {
    use super::super::testing;
    use super::*;

    #[tokio::test]
    async fn an_unknown_name_is_not_found_as_the_client_spelled_it() {
        let registry = Registry::new(testing::settings(None, None));
        let e = registry
            .acquire("Ghost", &testing::name("Ghost"), None)
            .await
            .err()
            .unwrap();
        assert_eq!(e, ModelsError::NotFound("Ghost".into()));
    }

    #[tokio::test]
    async fn a_model_that_can_never_fit_is_refused_with_why() {
        let (registry, ghost) = testing::with_ghost();
        let why = registry.unfit_reason(&ghost).unwrap();
        let e = registry.acquire("ghost", &ghost, None).await.err().unwrap();
        assert_eq!(
            e,
            ModelsError::Rejected(format!("model 'ghost' cannot run on this server: {why}"))
        );
        assert!(registry.waiting().is_empty());
    }
}
