//! The engine's handle and what its callers and the worker share: configuration, requests
//! and their events, the queue of requests waiting for a slot, counters.
use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{JoinHandle, ThreadId};

use serde::{Deserialize, Serialize};

use super::embed::{embed_context, Embedder};
use super::generate::{check_prompt, Completion, GenerateParams, Sequence, TokenLogprobs};
use super::prompt_cache::{self, PromptCacheConfig, PromptCacheStatus};
use super::switch::Switch;
use super::worker::Worker;
use crate::error::EngineError;
use crate::llama::{Context, ContextParams, EvalHook, Model};

/// Most sequences one llama.cpp context holds (`LLAMA_MAX_SEQ`).
pub const MAX_PARALLEL: u32 = 256;

/// How a [`BatchEngine`] shares its context between requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BatchConfig {
    /// Sequences decoded together, `1..=256`.
    pub n_parallel: u32,
    /// Context tokens per sequence (prompt and generated tokens). The llama
    /// context gets `n_ctx_per_seq` for each slot ([`BatchConfig::n_slots`]).
    pub n_ctx_per_seq: u32,
    /// Most tokens per decode step; prompt chunks of several sequences share
    /// it. At least `n_parallel`, so every generating sequence fits each step.
    pub n_batch: u32,
    /// Tokens per pass of the graph over a prompt (llama.cpp's `n_ubatch`),
    /// at most `n_batch`; `0`: llama.cpp's default (`min(n_batch, 512)`).
    /// A model whose experts stream reads each streamed expert once per
    /// pass, so it is best one pass per prompt
    /// ([`hypura_scheduler::plan::prompt_ubatch_tokens`]).
    pub n_ubatch: u32,
    /// Decoding threads (`0` = one per available core).
    pub n_threads: u32,
    /// Requests waiting for a slot beyond which [`BatchEngine::submit`]
    /// fails with [`EngineError::QueueFull`].
    pub queue_limit: usize,
    /// The RAM and NVMe tiers of the prompt cache (the slots always keep
    /// finished conversations' KV until they are needed).
    pub prompt_cache: PromptCacheConfig,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            n_parallel: 4,
            n_ctx_per_seq: 4096,
            n_batch: 512,
            n_ubatch: 0,
            n_threads: 0,
            queue_limit: 64,
            prompt_cache: PromptCacheConfig::default(),
        }
    }
}

impl BatchConfig {
    /// Rejects configurations the engine cannot run.
    pub fn validate(&self) -> Result<(), EngineError> {
        let invalid = |msg: String| Err(EngineError::InvalidArgument(msg));
        if self.n_parallel == 0 || self.n_parallel > MAX_PARALLEL {
            return invalid(format!(
                "n_parallel must be in 1..={MAX_PARALLEL}, got {}",
                self.n_parallel
            ));
        }
        if self.n_slots() > MAX_PARALLEL {
            return invalid(format!(
                "n_parallel + idle slots must be at most {MAX_PARALLEL}, got {} + {}",
                self.n_parallel, self.prompt_cache.idle_slots
            ));
        }
        if self.n_ctx_per_seq < 2 {
            return invalid(format!(
                "n_ctx_per_seq must be at least 2, got {}",
                self.n_ctx_per_seq
            ));
        }
        if self.n_batch < self.n_parallel {
            return invalid(format!(
                "n_batch ({}) must be at least n_parallel ({}): every generating sequence needs a place in each step",
                self.n_batch, self.n_parallel
            ));
        }
        if self.n_ubatch > self.n_batch {
            return invalid(format!(
                "n_ubatch ({}) must be at most n_batch ({})",
                self.n_ubatch, self.n_batch
            ));
        }
        if self.n_ctx_per_seq.checked_mul(self.n_slots()).is_none() {
            return invalid(format!(
                "n_ctx_per_seq * slots ({} * {}) is too large",
                self.n_ctx_per_seq,
                self.n_slots()
            ));
        }
        Ok(())
    }

    /// Sequences the context holds: the decoding ones and the idle ones
    /// of the prompt cache.
    pub fn n_slots(&self) -> u32 {
        self.n_parallel.saturating_add(self.prompt_cache.idle_slots)
    }

    /// The engine's contexts: generation, and embeddings for a model
    /// trained on `n_ctx_train` tokens (what a memory budget must count).
    pub fn contexts(
        &self,
        n_ctx_train: u32,
    ) -> [ContextParams; crate::tiered::footprint::DECODING_CONTEXTS as usize] {
        [
            self.generation_context(),
            // Charged as a causal model's (pieces of EMBED_N_CTX tokens): a
            // non-causal encoder's batch is its whole context.
            embed_context(
                self.n_ctx_per_seq.min(n_ctx_train.max(1)),
                true,
                self.n_threads,
            ),
        ]
    }

    pub(super) fn generation_context(&self) -> ContextParams {
        ContextParams {
            n_ctx: self.n_ctx_per_seq * self.n_slots(),
            n_batch: self.n_batch,
            n_ubatch: self.n_ubatch,
            n_seq_max: self.n_slots(),
            // A batch asks for logits at one token of each sequence in it.
            n_outputs_max: self.n_slots(),
            n_threads: self.n_threads,
            ..Default::default()
        }
    }
}

/// What a request's [`EventSink`] receives, in order: `Started` once it has
/// a slot, any number of `Text` (each after the `Logprobs` of its tokens,
/// when they were asked), then one `Done` or one `Error` (an `Error` may also
/// come without `Started`, when the request never got a slot).
#[derive(Debug)]
pub enum GenerationEvent {
    /// The request left the queue and took a sequence slot; its prompt is
    /// evaluated next. The time from submission to this event is queue time.
    Started,
    /// Text now final (whole UTF-8 chars, never a prefix of a possible stop string).
    Text(String),
    /// With [`SamplingParams::top_logprobs`](crate::llama::SamplingParams::top_logprobs):
    /// the log-probabilities of the tokens the next `Text` begins (or, just
    /// before `Done`, of tokens that made no text).
    Logprobs(Vec<TokenLogprobs>),
    /// Generation ended normally (EOG, stop string, max tokens, full context) or was cancelled.
    Done(Completion),
    /// Generation failed; no further events.
    Error(EngineError),
}

/// Receives the events of one request; returning false cancels the request
/// (client gone): its slot is freed before the next decode step. Called on
/// the worker thread, so it must not block for long: every other request
/// waits meanwhile. A panic inside it cancels its request only.
pub type EventSink = Box<dyn FnMut(GenerationEvent) -> bool + Send>;

/// One generation: prompt tokens and how to sample after them.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt: Vec<i32>,
    pub params: GenerateParams,
}

/// Identifies a submitted request (unique per engine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A snapshot of a [`BatchEngine`]; the `_total` counters count since start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BatchStatus {
    /// Requests holding a slot.
    pub active: usize,
    /// Requests waiting for a slot.
    pub queued: usize,
    pub n_parallel: u32,
    pub n_ctx_per_seq: u32,
    pub tokens_generated_total: u64,
    /// Prompt tokens decoded.
    pub prompt_tokens_total: u64,
    /// `llama_decode` calls.
    pub decode_steps_total: u64,
    /// Requests that ended with [`GenerationEvent::Done`].
    pub requests_completed_total: u64,
    /// Requests cancelled (by [`BatchEngine::cancel`] or their sink).
    pub requests_cancelled_total: u64,
    /// Requests that ended with [`GenerationEvent::Error`].
    pub requests_failed_total: u64,
    /// True once [`BatchEngine::shutdown`] began (or the worker stopped).
    pub shutting_down: bool,
    /// KV cache cells holding tokens now, all slots together (of
    /// `n_slots × n_ctx_per_seq`).
    pub kv_cells_used: u64,
    pub prompt_cache: PromptCacheStatus,
}

/// A continuous-batching engine over one model: cheap to clone, shareable
/// between threads. The last clone dropped shuts it down as
/// [`BatchEngine::shutdown`] does.
#[derive(Clone)]
pub struct BatchEngine {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    /// The model decoded now and the hook streaming its weights (if they
    /// are streamed); replaced by [`BatchEngine::switch_model`].
    pub(super) current: Mutex<Current>,
    pub(super) config: BatchConfig,
    /// Parameters of the generation context (a switch makes another).
    pub(super) ctx_params: ContextParams,
    pub(super) shared: Arc<Shared>,
    pub(super) next_id: AtomicU64,
    pub(super) worker: Mutex<Option<JoinHandle<()>>>,
    pub(super) worker_thread: ThreadId,
    /// Created on the first [`BatchEngine::embed`].
    pub(super) embedder: Mutex<Option<Embedder>>,
    /// Held through a [`BatchEngine::switch_model`]: one at a time.
    pub(super) switching: Mutex<()>,
    #[cfg(test)]
    pub(super) abort: Arc<std::sync::atomic::AtomicBool>,
}

#[derive(Clone)]
pub(super) struct Current {
    pub(super) model: Arc<Model>,
    /// Streams the weights of every context of this engine, if they are streamed.
    pub(super) hook: Option<Arc<dyn EvalHook>>,
}

/// What the submitting threads and the worker share.
pub(super) struct Shared {
    pub(super) state: Mutex<State>,
    /// Signalled when a request is queued or shutdown begins.
    pub(super) wake: Condvar,
    pub(super) counters: Counters,
}

pub(super) struct State {
    pub(super) queue: VecDeque<Queued>,
    /// Requests holding a slot.
    pub(super) active: HashSet<RequestId>,
    /// Active requests to drop before the next step.
    pub(super) cancelled: HashSet<RequestId>,
    /// False once shutdown began or the worker stopped.
    pub(super) accepting: bool,
    /// A switch of model for the worker to make before its next step.
    pub(super) switch: Option<Switch>,
    /// A new RAM limit for the prompt cache, for the worker to apply.
    pub(super) prompt_cache_ram_bytes: Option<u64>,
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) tokens_generated: AtomicU64,
    pub(super) prompt_tokens: AtomicU64,
    pub(super) decode_steps: AtomicU64,
    pub(super) completed: AtomicU64,
    pub(super) cancelled: AtomicU64,
    pub(super) failed: AtomicU64,
    /// A gauge: KV cells holding tokens of the slots now (set by the worker).
    pub(super) kv_cells: AtomicU64,
    pub(super) prompt_cache: prompt_cache::Counters,
}

impl Counters {
    pub(super) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// A validated request waiting for a slot.
pub(super) struct Queued {
    pub(super) id: RequestId,
    pub(super) prompt: Vec<i32>,
    pub(super) sequence: Sequence,
    pub(super) sink: EventSink,
    /// [`GenerateParams::cache_prompt`].
    pub(super) cache_prompt: bool,
    /// The model its sequence was made with (rebound after a switch).
    /// Declared after `sequence`, so dropped after its sampler.
    pub(super) model: Arc<Model>,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock; a poisoned state is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl BatchEngine {
    /// Creates the context (`n_ctx_per_seq` tokens a slot) and spawns
    /// the worker thread that owns it.
    pub fn start(model: Arc<Model>, config: BatchConfig) -> Result<BatchEngine, EngineError> {
        BatchEngine::start_with_hook(model, config, None)
    }

    /// [`BatchEngine::start`] for a model whose weights are streamed: every
    /// context it creates (generation and embeddings) runs `hook`
    /// ([`crate::tiered::TieredModel::hook`]).
    pub fn start_with_hook(
        model: Arc<Model>,
        config: BatchConfig,
        hook: Option<Arc<dyn EvalHook>>,
    ) -> Result<BatchEngine, EngineError> {
        config.validate()?;
        let ctx_params = config.generation_context();
        let ctx = Context::with_hook(Arc::clone(&model), &ctx_params, hook.clone())?;
        #[cfg(test)]
        let abort = ctx.abort_flag();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                active: HashSet::new(),
                cancelled: HashSet::new(),
                accepting: true,
                switch: None,
                prompt_cache_ram_bytes: None,
            }),
            wake: Condvar::new(),
            counters: Counters::default(),
        });
        let worker = Worker::new(Arc::clone(&shared), ctx, &config);
        let handle = std::thread::Builder::new()
            .name("hypura-batch".into())
            .spawn(move || worker.run())
            .map_err(|e| EngineError::Context(format!("could not start the batch worker: {e}")))?;
        Ok(BatchEngine {
            inner: Arc::new(Inner {
                current: Mutex::new(Current { model, hook }),
                config,
                ctx_params,
                shared,
                next_id: AtomicU64::new(0),
                worker_thread: handle.thread().id(),
                worker: Mutex::new(Some(handle)),
                embedder: Mutex::new(None),
                switching: Mutex::new(()),
                #[cfg(test)]
                abort,
            }),
        })
    }

    /// Validates and queues a request; its events go to `sink` on the worker
    /// thread. Fails at once for an empty prompt, one of `n_ctx_per_seq`
    /// tokens or more ([`EngineError::PromptTooLong`]), token ids outside the
    /// vocabulary, bad sampling options, a full queue
    /// ([`EngineError::QueueFull`]) or a shutdown ([`EngineError::ShuttingDown`]).
    pub fn submit(
        &self,
        request: GenerateRequest,
        sink: EventSink,
    ) -> Result<RequestId, EngineError> {
        let config = &self.inner.config;
        check_prompt(&request.prompt, config.n_ctx_per_seq)?;
        let model = self.model();
        let n_vocab = model.n_vocab();
        if let Some(&bad) = request
            .prompt
            .iter()
            .find(|&&t| t < 0 || t as usize >= n_vocab)
        {
            return Err(EngineError::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary (0..{n_vocab})"
            )));
        }
        let sequence = Sequence::new(
            &request.params,
            &request.prompt,
            &model,
            config.n_ctx_per_seq,
        )?;
        let mut state = self.inner.shared.lock();
        if !state.accepting {
            return Err(EngineError::ShuttingDown);
        }
        let capacity = (config.n_parallel as usize).saturating_add(config.queue_limit);
        if state.queue.len() + state.active.len() >= capacity {
            return Err(EngineError::QueueFull);
        }
        let id = RequestId(self.inner.next_id.fetch_add(1, Ordering::Relaxed));
        state.queue.push_back(Queued {
            id,
            model,
            cache_prompt: request.params.cache_prompt,
            prompt: request.prompt,
            sequence,
            sink,
        });
        drop(state);
        self.inner.shared.wake.notify_one();
        Ok(id)
    }

    /// Cancels a request: a queued one is removed at once, an active one is
    /// dropped before the next decode step (its KV cleared). No further
    /// events are delivered once it is dropped. Unknown or finished ids are ignored.
    pub fn cancel(&self, id: RequestId) {
        let removed = {
            let mut state = self.inner.shared.lock();
            match state.queue.iter().position(|q| q.id == id) {
                Some(i) => state.queue.remove(i),
                None => {
                    if state.active.contains(&id) {
                        state.cancelled.insert(id);
                    }
                    None
                }
            }
        };
        if removed.is_some() {
            Counters::add(&self.inner.shared.counters.cancelled, 1);
        }
        // The sink is dropped here, outside the lock.
        drop(removed);
    }

    pub fn status(&self) -> BatchStatus {
        let (active, queued, accepting) = {
            let state = self.inner.shared.lock();
            (state.active.len(), state.queue.len(), state.accepting)
        };
        let c = &self.inner.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        BatchStatus {
            active,
            queued,
            n_parallel: self.inner.config.n_parallel,
            n_ctx_per_seq: self.inner.config.n_ctx_per_seq,
            tokens_generated_total: get(&c.tokens_generated),
            prompt_tokens_total: get(&c.prompt_tokens),
            decode_steps_total: get(&c.decode_steps),
            requests_completed_total: get(&c.completed),
            requests_cancelled_total: get(&c.cancelled),
            requests_failed_total: get(&c.failed),
            shutting_down: !accepting,
            kv_cells_used: get(&c.kv_cells),
            prompt_cache: c.prompt_cache.snapshot(),
        }
    }

    /// Sets the bytes the prompt cache's RAM tier may hold (the memory
    /// budget's share for it); the worker evicts down to it before its
    /// next step.
    pub fn set_prompt_cache_ram_bytes(&self, bytes: u64) {
        self.inner.shared.lock().prompt_cache_ram_bytes = Some(bytes);
        self.inner.shared.wake.notify_all();
    }

    /// The model decoded now (another after [`BatchEngine::switch_model`]).
    pub fn model(&self) -> Arc<Model> {
        Arc::clone(&self.inner.current().model)
    }

    pub fn config(&self) -> &BatchConfig {
        &self.inner.config
    }

    /// Rejects new requests, lets the worker finish every accepted one
    /// (active and queued), and waits for it to exit. Called from a sink (on
    /// the worker thread) it does not wait.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }
}

impl Inner {
    pub(super) fn current(&self) -> Current {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn set_current(&self, current: Current) {
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = current;
    }

    pub(super) fn shutdown(&self) {
        self.shared.lock().accepting = false;
        self.shared.wake.notify_all();
        if std::thread::current().id() == self.worker_thread {
            // A sink shutting the engine down: the worker exits by itself
            // once its requests are done; joining here would deadlock.
            return;
        }
        let handle = self
            .worker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(handle) = handle {
            if handle.join().is_err() {
                tracing::error!("the batch worker panicked");
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_validation_names_the_bad_field() {
        let bad = [
            BatchConfig {
                n_parallel: 0,
                ..Default::default()
            },
            BatchConfig {
                n_parallel: 8,
                n_batch: 4,
                ..Default::default()
            },
            BatchConfig {
                n_ctx_per_seq: 1 << 30,
                n_parallel: 16,
                ..Default::default()
            },
            BatchConfig {
                n_ubatch: 1024,
                ..Default::default()
            },
        ];
        for config in bad {
            let err = config.validate().unwrap_err();
            assert!(matches!(err, EngineError::InvalidArgument(_)), "{err}");
        }
        BatchConfig::default().validate().unwrap();
    }
}
