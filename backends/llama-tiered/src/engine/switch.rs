//! [`BatchEngine::switch_model`]: every request moves onto another load of the same file
//! (another placement) between two decode steps, its KV cache copied, its sampler rebound.
use std::collections::VecDeque;
use std::sync::{Arc, PoisonError};

use super::queue::{BatchEngine, Counters, Current, GenerationEvent, Queued};
use super::worker::{send, Worker};
use crate::error::EngineError;
use crate::llama::{Context, EvalHook, Model, StateBuffers};

/// A context of the new model, handed to the worker to switch to.
pub(super) struct Switch {
    pub(super) ctx: Context,
    pub(super) done: std::sync::mpsc::SyncSender<Result<(), EngineError>>,
}

impl BatchEngine {
    /// Moves every request onto `model`, another load of the same file
    /// (another placement), between two decode steps, and returns once the
    /// worker decodes with it: each active sequence's KV cache is copied
    /// into a new context of `model` (whose weights `hook` streams, if they
    /// are streamed), samplers are rebound, and the old context is freed.
    /// The old model is free once the caller drops its last handle.
    ///
    /// Fails, with the engine still on the old model, when `model` is not
    /// the same shape, the new context cannot be made, a KV copy fails, the
    /// engine is shutting down, or it is called from an event sink (on the
    /// worker thread, which could not switch while waiting for itself).
    pub fn switch_model(
        &self,
        model: Arc<Model>,
        hook: Option<Arc<dyn EvalHook>>,
    ) -> Result<(), EngineError> {
        if std::thread::current().id() == self.inner.worker_thread {
            return Err(EngineError::InvalidArgument(
                "switch_model cannot be called from an event sink".into(),
            ));
        }
        let _one_at_a_time = self
            .inner
            .switching
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let old = self.inner.current();
        let was = &old.model;
        let same_file = model.path() == was.path()
            && model.n_vocab() == was.n_vocab()
            && model.n_embd() == was.n_embd()
            && model.n_layer() == was.n_layer();
        if !same_file {
            return Err(EngineError::InvalidArgument(format!(
                "a switch needs another load of {}, not of {}",
                was.path().display(),
                model.path().display()
            )));
        }
        let ctx = Context::with_hook(Arc::clone(&model), &self.inner.ctx_params, hook.clone())?;
        let (done, switched) = std::sync::mpsc::sync_channel(1);
        // New requests are made for the new model from now on; those queued
        // before are rebound by the worker when it switches.
        self.inner.set_current(Current { model, hook });
        let handed = {
            let mut state = self.inner.shared.lock();
            if state.accepting {
                state.switch = Some(Switch { ctx, done });
                true
            } else {
                false
            }
        };
        let result = if handed {
            self.inner.shared.wake.notify_all();
            // The sender is dropped unanswered only if the worker exits first.
            switched.recv().unwrap_or(Err(EngineError::ShuttingDown))
        } else {
            Err(EngineError::ShuttingDown)
        };
        if let Err(e) = result {
            self.inner.set_current(old);
            return Err(e);
        }
        // The embedding context is made again, on the new model, when next needed.
        let embedder = self
            .inner
            .embedder
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop(embedder);
        Ok(())
    }
}

impl Worker {
    /// Moves every slot's KV cache into `ctx` (a context of another load of
    /// the same file) and decodes with it from now on. On a failed copy the
    /// worker stays on its context and nothing changed.
    pub(super) fn switch(&mut self, mut ctx: Context) -> Result<(), EngineError> {
        for seq in 0..self.slots.len() {
            // Idle slots' kept conversations move too.
            if self.slots[seq].is_some() || self.holds_kept(seq) {
                let state = self.ctx.seq_state(seq as i32, &StateBuffers::default())?;
                ctx.set_seq_state(seq as i32, &state)?;
            }
        }
        let old = std::mem::replace(&mut self.ctx, ctx);
        // Queued requests: rebound now, so none keeps the old model alive.
        let failed: Vec<Queued> = {
            let mut state = self.shared.lock();
            let new = Arc::clone(self.ctx.model());
            let queue = std::mem::take(&mut state.queue);
            let (mut kept, mut failed) = (VecDeque::new(), Vec::new());
            for mut q in queue {
                match q.sequence.rebind(&new) {
                    Ok(()) => {
                        q.model = Arc::clone(&new);
                        kept.push_back(q);
                    }
                    Err(e) => failed.push((q, e)),
                }
            }
            state.queue = kept;
            failed
                .into_iter()
                .map(|(mut q, e)| {
                    send(&mut q.sink, GenerationEvent::Error(e));
                    q
                })
                .collect()
        };
        Counters::add(&self.shared.counters.failed, failed.len() as u64);
        drop(failed);
        for seq in 0..self.slots.len() {
            let rebound = match self.slots[seq].as_mut() {
                Some(slot) => {
                    // The new context samples on the device as the old one did.
                    let device = slot.sequence.wants_device_greedy();
                    self.ctx.set_device_greedy(seq as i32, device);
                    slot.sequence.rebind(self.ctx.model())
                }
                None => continue,
            };
            if let Err(e) = rebound {
                self.fail(seq, e);
            }
        }
        drop(old);
        Ok(())
    }
}
