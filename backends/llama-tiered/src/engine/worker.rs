//! Continuous batching: up to `n_parallel` requests decoded together in one
//! llama.cpp context, as llama-server's slots do it.
//!
//! One worker thread owns the [`Context`]. Each step it drops cancelled
//! requests, admits queued ones into free slots (sequence ids
//! `0..n_parallel`), builds one [`Batch`] holding the next token of every
//! generating sequence plus chunks of the prompts still being read (so a long
//! prompt never stalls the others), decodes it once, and samples every
//! sequence that got logits from its own row with its own sampler.
//!
//! Each sequence keeps its own positions and its own KV stream: the context
//! uses llama.cpp's non-unified KV cache (its default), so a greedy
//! generation gives the same tokens alone or among others. With `kv_unified`
//! the sequences share one KV buffer: a sequence's cells sit at other indices,
//! among the others' masked cells, so attention sums in another order, and
//! greedy outputs on SmolLM2 part from the solo ones within 4 to 15 tokens
//! for some prompts (measured). The price of separate streams: llama.cpp
//! splits a batch over them into micro-batches with equal tokens per
//! sequence, so prompts of different lengths read in one step take several
//! micro-batches.
//!
//! [`BatchEngine::switch_model`] moves the engine onto another load of the
//! same file (another placement: layers moved to or from the GPU, weights no
//! longer streamed) between two decode steps: the worker copies every
//! sequence's KV cache into a context of the new model, rebinds the samplers
//! and goes on; requests in flight never notice, and the old model is free
//! once its caller drops it.
//!
//! Lock order: the request state (`Shared::state`), the embedding context
//! (`Inner::embedder`) and the current model (`Inner::current`) are never
//! held together; the worker holds no lock while it decodes or calls a sink.
use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::EngineError;
use crate::generate::{
    check_prompt, Completion, FinishReason, GenerateParams, Next, Sequence, Timings,
};
use crate::llama::{Batch, Context, ContextParams, EvalHook, Model};

/// Most sequences one llama.cpp context holds (`LLAMA_MAX_SEQ`).
const MAX_PARALLEL: u32 = 256;

/// Context length of the embedding context: every text is decoded in one
/// micro-batch (mean pooling needs all its tokens at once), and llama.cpp
/// computes logits for each of them, so this stays small.
pub const EMBED_N_CTX: u32 = 512;

/// How a [`BatchEngine`] shares its context between requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BatchConfig {
    /// Sequences decoded together (slots), `1..=256`.
    pub n_parallel: u32,
    /// Context tokens per sequence (prompt and generated tokens). The llama
    /// context gets `n_ctx_per_seq * n_parallel`, `n_seq_max = n_parallel`.
    pub n_ctx_per_seq: u32,
    /// Most tokens per decode step; prompt chunks of several sequences share
    /// it. At least `n_parallel`, so every generating sequence fits each step.
    pub n_batch: u32,
    /// Decoding threads (`0` = one per available core).
    pub n_threads: u32,
    /// Requests waiting for a slot beyond which [`BatchEngine::submit`]
    /// fails with [`EngineError::QueueFull`].
    pub queue_limit: usize,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            n_parallel: 4,
            n_ctx_per_seq: 4096,
            n_batch: 512,
            n_threads: 0,
            queue_limit: 64,
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
        if self.n_ctx_per_seq.checked_mul(self.n_parallel).is_none() {
            return invalid(format!(
                "n_ctx_per_seq * n_parallel ({} * {}) is too large",
                self.n_ctx_per_seq, self.n_parallel
            ));
        }
        Ok(())
    }

    /// The engine's contexts: generation, and embeddings for a model
    /// trained on `n_ctx_train` tokens (what a memory budget must count).
    pub fn contexts(&self, n_ctx_train: u32) -> [ContextParams; 2] {
        [
            self.generation_context(),
            embed_context(n_ctx_train, self.n_threads),
        ]
    }

    fn generation_context(&self) -> ContextParams {
        ContextParams {
            n_ctx: self.n_ctx_per_seq * self.n_parallel,
            n_batch: self.n_batch,
            n_seq_max: self.n_parallel,
            n_threads: self.n_threads,
            ..Default::default()
        }
    }
}

/// The embedding context of a model trained on `n_ctx_train` tokens.
fn embed_context(n_ctx_train: u32, n_threads: u32) -> ContextParams {
    let n_ctx = EMBED_N_CTX.min(n_ctx_train.max(1));
    ContextParams {
        n_ctx,
        n_batch: n_ctx,
        n_seq_max: 1,
        n_threads,
        embeddings: true,
        mean_pooling: true,
    }
}

/// What a request's [`EventSink`] receives, in order: any number of `Text`,
/// then one `Done` or one `Error`.
#[derive(Debug)]
pub enum GenerationEvent {
    /// Text now final (whole UTF-8 chars, never a prefix of a possible stop string).
    Text(String),
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
}

/// A continuous-batching engine over one model: cheap to clone, shareable
/// between threads. The last clone dropped shuts it down as
/// [`BatchEngine::shutdown`] does.
#[derive(Clone)]
pub struct BatchEngine {
    inner: Arc<Inner>,
}

struct Inner {
    /// The model decoded now and the hook streaming its weights (if they
    /// are streamed); replaced by [`BatchEngine::switch_model`].
    current: Mutex<Current>,
    config: BatchConfig,
    /// Parameters of the generation context (a switch makes another).
    ctx_params: ContextParams,
    shared: Arc<Shared>,
    next_id: AtomicU64,
    worker: Mutex<Option<JoinHandle<()>>>,
    worker_thread: ThreadId,
    /// Created on the first [`BatchEngine::embed`].
    embedder: Mutex<Option<Embedder>>,
    /// Held through a [`BatchEngine::switch_model`]: one at a time.
    switching: Mutex<()>,
    #[cfg(test)]
    abort: Arc<std::sync::atomic::AtomicBool>,
}

#[derive(Clone)]
struct Current {
    model: Arc<Model>,
    /// Streams the weights of every context of this engine, if they are streamed.
    hook: Option<Arc<dyn EvalHook>>,
}

/// A context of the new model, handed to the worker to switch to.
struct Switch {
    ctx: Context,
    done: std::sync::mpsc::SyncSender<Result<(), EngineError>>,
}

/// What the submitting threads and the worker share.
struct Shared {
    state: Mutex<State>,
    /// Signalled when a request is queued or shutdown begins.
    wake: Condvar,
    counters: Counters,
}

struct State {
    queue: VecDeque<Queued>,
    /// Requests holding a slot.
    active: HashSet<RequestId>,
    /// Active requests to drop before the next step.
    cancelled: HashSet<RequestId>,
    /// False once shutdown began or the worker stopped.
    accepting: bool,
    /// A switch of model for the worker to make before its next step.
    switch: Option<Switch>,
}

#[derive(Default)]
struct Counters {
    tokens_generated: AtomicU64,
    prompt_tokens: AtomicU64,
    decode_steps: AtomicU64,
    completed: AtomicU64,
    cancelled: AtomicU64,
    failed: AtomicU64,
}

impl Counters {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// A validated request waiting for a slot.
struct Queued {
    id: RequestId,
    prompt: Vec<i32>,
    sequence: Sequence,
    sink: EventSink,
    /// The model its sequence was made with (rebound after a switch).
    /// Declared after `sequence`, so dropped after its sampler.
    model: Arc<Model>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock; a poisoned state is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl BatchEngine {
    /// Creates the context (`n_ctx_per_seq * n_parallel` tokens) and spawns
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
        }
    }

    /// The model decoded now (another after [`BatchEngine::switch_model`]).
    pub fn model(&self) -> Arc<Model> {
        Arc::clone(&self.inner.current().model)
    }

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

    pub fn config(&self) -> &BatchConfig {
        &self.inner.config
    }

    /// Rejects new requests, lets the worker finish every accepted one
    /// (active and queued), and waits for it to exit. Called from a sink (on
    /// the worker thread) it does not wait.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }

    /// One embedding per text: the mean of its tokens' final hidden states,
    /// L2-normalized (as Ollama's `/api/embed` returns them). Texts are
    /// tokenized with BOS as the model wants it and special-token text left
    /// as text; one longer than 512 tokens (or the model's training context)
    /// fails with [`EngineError::PromptTooLong`], an empty one with
    /// [`EngineError::InvalidArgument`].
    ///
    /// Runs on the caller's thread, in a separate small context created on
    /// first use and kept behind a mutex: concurrent calls take turns, and
    /// generation on the worker goes on meanwhile (sharing the cores).
    pub fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EngineError> {
        let model = self.model();
        let model = &model;
        let params = embed_context(model.n_ctx_train(), self.inner.config.n_threads);
        let n_ctx = params.n_ctx;
        let tokenized = texts
            .iter()
            .enumerate()
            .map(|(i, text)| {
                let tokens = model.tokenize(text, true, false)?;
                if tokens.is_empty() {
                    return Err(EngineError::InvalidArgument(format!(
                        "text {i} is empty: nothing to embed"
                    )));
                }
                if tokens.len() > n_ctx as usize {
                    return Err(EngineError::PromptTooLong {
                        prompt_tokens: tokens.len(),
                        n_ctx,
                    });
                }
                Ok(tokens)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut guard = self
            .inner
            .embedder
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // The model now (read under the embedder's lock): one switched to
        // meanwhile gets its own embedding context.
        let Current { model, hook } = self.inner.current();
        if guard
            .as_ref()
            .is_some_and(|e| !Arc::ptr_eq(e.ctx.model(), &model))
        {
            *guard = None;
        }
        let embedder = match guard.as_mut() {
            Some(embedder) => embedder,
            None => guard.insert(Embedder::new(&model, &params, hook)?),
        };
        tokenized.iter().map(|t| embedder.embed(t)).collect()
    }
}

impl Inner {
    fn current(&self) -> Current {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_current(&self, current: Current) {
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = current;
    }

    fn shutdown(&self) {
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

/// A request in a slot.
struct Slot {
    id: RequestId,
    sink: EventSink,
    sequence: Sequence,
    prompt: Vec<i32>,
    /// Prompt tokens already in the KV cache.
    n_prompt_decoded: usize,
    /// The sampled token to decode next, once the prompt is in.
    next_token: Option<i32>,
    /// Prompt tokens in the current batch.
    step_prompt_tokens: usize,
    /// Row of this sequence's logits in the current batch.
    step_row: Option<i32>,
    prompt_eval: Duration,
    eval: Duration,
}

impl Slot {
    fn new(id: RequestId, prompt: Vec<i32>, sequence: Sequence, sink: EventSink) -> Slot {
        Slot {
            id,
            sink,
            sequence,
            prompt,
            n_prompt_decoded: 0,
            next_token: None,
            step_prompt_tokens: 0,
            step_row: None,
            prompt_eval: Duration::ZERO,
            eval: Duration::ZERO,
        }
    }

    fn in_batch(&self) -> bool {
        self.next_token.is_some() || self.step_prompt_tokens > 0
    }
}

/// The worker thread's state: the context and the slots (index = sequence id).
struct Worker {
    shared: Arc<Shared>,
    ctx: Context,
    batch: Batch,
    slots: Vec<Option<Slot>>,
    n_batch: usize,
}

/// Marks the engine stopped when the worker exits, even by a panic, and
/// fails the requests still queued then.
struct ExitGuard(Arc<Shared>);

impl Drop for ExitGuard {
    fn drop(&mut self) {
        let (queued, switch): (Vec<Queued>, _) = {
            let mut state = self.0.lock();
            state.accepting = false;
            (state.queue.drain(..).collect(), state.switch.take())
        };
        drop(switch);
        for mut q in queued {
            Counters::add(&self.0.counters.failed, 1);
            send(
                &mut q.sink,
                GenerationEvent::Error(EngineError::ShuttingDown),
            );
        }
    }
}

impl Worker {
    fn new(shared: Arc<Shared>, ctx: Context, config: &BatchConfig) -> Worker {
        Worker {
            shared,
            ctx,
            batch: Batch::new(config.n_batch as usize),
            slots: (0..config.n_parallel).map(|_| None).collect(),
            n_batch: config.n_batch as usize,
        }
    }

    fn run(mut self) {
        let _guard = ExitGuard(Arc::clone(&self.shared));
        while self.wait_for_work() {
            if self.slots.iter().any(Option::is_some) {
                self.step();
            }
        }
    }

    /// Drops cancelled requests and fills free slots from the queue, blocking
    /// while there is nothing to do. False when the worker should exit
    /// (shutting down, and no request left).
    fn wait_for_work(&mut self) -> bool {
        let mut admitted = Vec::new();
        let mut dropped = Vec::new();
        let (keep_running, switch) = {
            let mut state = self.shared.lock();
            let keep_running = loop {
                for (seq, slot) in self.slots.iter_mut().enumerate() {
                    if slot
                        .as_ref()
                        .is_some_and(|s| state.cancelled.contains(&s.id))
                    {
                        if let Some(s) = slot.take() {
                            state.active.remove(&s.id);
                            dropped.push((seq, s));
                        }
                    }
                }
                state.cancelled.clear();
                for (seq, slot) in self.slots.iter().enumerate() {
                    if slot.is_some() {
                        continue;
                    }
                    let Some(q) = state.queue.pop_front() else {
                        break;
                    };
                    state.active.insert(q.id);
                    admitted.push((seq, q));
                }
                let busy = !admitted.is_empty() || self.slots.iter().any(Option::is_some);
                // Dropped slots still need their KV cleared (outside the lock).
                if busy || !dropped.is_empty() || state.switch.is_some() {
                    break true;
                }
                if !state.accepting && state.queue.is_empty() {
                    break false;
                }
                state = self
                    .shared
                    .wake
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            };
            (keep_running, state.switch.take())
        };
        for (seq, slot) in dropped {
            self.ctx.clear_seq(seq as i32, -1);
            Counters::add(&self.shared.counters.cancelled, 1);
            drop(slot);
        }
        if let Some(Switch { ctx, done }) = switch {
            let _ = done.send(self.switch(ctx));
        }
        for (seq, mut q) in admitted {
            self.ctx.clear_seq(seq as i32, -1);
            if !Arc::ptr_eq(&q.model, self.ctx.model()) {
                // Queued before a switch: its sampler knows the old model.
                if let Err(e) = q.sequence.rebind(self.ctx.model()) {
                    self.shared.lock().active.remove(&q.id);
                    Counters::add(&self.shared.counters.failed, 1);
                    send(&mut q.sink, GenerationEvent::Error(e));
                    continue;
                }
            }
            let Queued {
                id,
                prompt,
                sequence,
                sink,
                ..
            } = q;
            self.slots[seq] = Some(Slot::new(id, prompt, sequence, sink));
        }
        keep_running
    }

    /// Moves every slot's KV cache into `ctx` (a context of another load of
    /// the same file) and decodes with it from now on. On a failed copy the
    /// worker stays on its context and nothing changed.
    fn switch(&mut self, mut ctx: Context) -> Result<(), EngineError> {
        for seq in 0..self.slots.len() {
            if self.slots[seq].is_some() {
                let state = self.ctx.seq_state(seq as i32)?;
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
                Some(slot) => slot.sequence.rebind(self.ctx.model()),
                None => continue,
            };
            if let Err(e) = rebound {
                self.fail(seq, e);
            }
        }
        drop(old);
        Ok(())
    }

    /// One decode step over every active sequence.
    fn step(&mut self) {
        let result = self.fill_batch().and_then(|()| {
            let started = Instant::now();
            self.ctx.decode(&self.batch).map(|()| started.elapsed())
        });
        Counters::add(&self.shared.counters.decode_steps, 1);
        match result {
            Ok(elapsed) => self.after_decode(elapsed),
            Err(e) => self.fail_batch(&e),
        }
    }

    /// Shares the batch: one token for each generating sequence first, the
    /// rest for prompts in slot order.
    fn plan_batch(&mut self) {
        let n_generating = self
            .slots
            .iter()
            .flatten()
            .filter(|s| s.next_token.is_some())
            .count();
        let mut budget = self.n_batch.saturating_sub(n_generating);
        for slot in self.slots.iter_mut().flatten() {
            slot.step_row = None;
            slot.step_prompt_tokens = 0;
            if slot.next_token.is_none() {
                let remaining = slot.prompt.len().saturating_sub(slot.n_prompt_decoded);
                let take = remaining.min(budget);
                slot.step_prompt_tokens = take;
                budget -= take;
            }
        }
    }

    /// Writes the planned tokens in sequence-id order: llama.cpp splits a
    /// batch over a non-unified KV cache into micro-batches of consecutive
    /// sequence ids, so this order gives the fewest.
    fn fill_batch(&mut self) -> Result<(), EngineError> {
        self.plan_batch();
        self.batch.clear();
        for (seq, slot) in self.slots.iter_mut().enumerate() {
            let Some(slot) = slot else { continue };
            let seq = seq as i32;
            if let Some(token) = slot.next_token {
                let row = self
                    .batch
                    .push(token, slot.sequence.next_pos(), seq, true)?;
                slot.step_row = Some(row);
                continue;
            }
            let start = slot.n_prompt_decoded;
            for (i, &token) in slot.prompt[start..start + slot.step_prompt_tokens]
                .iter()
                .enumerate()
            {
                let pos = start + i;
                let last = pos + 1 == slot.prompt.len();
                let row = self.batch.push(token, pos as i32, seq, last)?;
                if last {
                    slot.step_row = Some(row);
                }
            }
        }
        Ok(())
    }

    /// Samples every sequence that got logits, streams its text, and frees
    /// the slots of those that ended.
    fn after_decode(&mut self, elapsed: Duration) {
        let shared = Arc::clone(&self.shared);
        let counters = &shared.counters;
        for seq in 0..self.slots.len() {
            let Some(slot) = self.slots[seq].as_mut() else {
                continue;
            };
            if !slot.in_batch() {
                continue;
            }
            if slot.next_token.take().is_some() {
                slot.eval += elapsed;
            } else {
                slot.prompt_eval += elapsed;
                slot.n_prompt_decoded += slot.step_prompt_tokens;
                Counters::add(&counters.prompt_tokens, slot.step_prompt_tokens as u64);
            }
            slot.step_prompt_tokens = 0;
            let Some(row) = slot.step_row.take() else {
                continue;
            };
            let before = slot.sequence.n_generated();
            let sink = &mut slot.sink;
            let next = slot.sequence.advance(&mut self.ctx, row, &mut |text| {
                send(sink, GenerationEvent::Text(text.to_string()))
            });
            let sampled = slot.sequence.n_generated() - before;
            Counters::add(&counters.tokens_generated, sampled as u64);
            match next {
                Next::Decode(token) => slot.next_token = Some(token),
                Next::Finish(reason) => self.finish(seq, reason),
                Next::Fail(error) => self.fail(seq, error),
            }
        }
    }

    /// Frees a slot and, unless the request was cancelled, sends its result.
    fn finish(&mut self, seq: usize, reason: FinishReason) {
        let Some(slot) = self.release(seq) else {
            return;
        };
        let counters = &self.shared.counters;
        if reason == FinishReason::Cancelled {
            Counters::add(&counters.cancelled, 1);
            return;
        }
        Counters::add(&counters.completed, 1);
        let timings = Timings {
            prompt_eval_seconds: slot.prompt_eval.as_secs_f64(),
            eval_seconds: slot.eval.as_secs_f64(),
            ..Default::default()
        };
        let Slot {
            mut sink, sequence, ..
        } = slot;
        let completion = sequence.complete(reason, timings, &mut |text| {
            send(&mut sink, GenerationEvent::Text(text.to_string()))
        });
        send(&mut sink, GenerationEvent::Done(completion));
    }

    /// One sequence failed (its sampler): it gets the error and its slot back.
    fn fail(&mut self, seq: usize, error: EngineError) {
        if let Some(mut slot) = self.release(seq) {
            Counters::add(&self.shared.counters.failed, 1);
            send(&mut slot.sink, GenerationEvent::Error(error));
        }
    }

    /// A failed decode: every sequence in the batch gets the error and its
    /// slot back; the others (prompts not in this batch) go on.
    fn fail_batch(&mut self, error: &EngineError) {
        tracing::warn!("decode step failed: {error}");
        for seq in 0..self.slots.len() {
            if !self.slots[seq].as_ref().is_some_and(Slot::in_batch) {
                continue;
            }
            if let Some(mut slot) = self.release(seq) {
                Counters::add(&self.shared.counters.failed, 1);
                send(&mut slot.sink, GenerationEvent::Error(copy_error(error)));
            }
        }
    }

    /// Empties slot `seq` and its KV cache; the slot is free for the next step.
    fn release(&mut self, seq: usize) -> Option<Slot> {
        let slot = self.slots[seq].take()?;
        self.ctx.clear_seq(seq as i32, -1);
        self.shared.lock().active.remove(&slot.id);
        Some(slot)
    }
}

/// Calls a sink; a panic inside it counts as "stop sending".
fn send(sink: &mut EventSink, event: GenerationEvent) -> bool {
    catch_unwind(AssertUnwindSafe(|| sink(event))).unwrap_or_else(|_| {
        tracing::error!("an event sink panicked: its request is cancelled");
        false
    })
}

/// The same error for another sequence of a failed batch (`EngineError` is not `Clone`).
fn copy_error(error: &EngineError) -> EngineError {
    match error {
        EngineError::ContextFull => EngineError::ContextFull,
        EngineError::Cancelled => EngineError::Cancelled,
        EngineError::Decode(rc) => EngineError::Decode(*rc),
        other => EngineError::Context(other.to_string()),
    }
}

/// The embedding context: one text at a time in sequence 0.
struct Embedder {
    ctx: Context,
    batch: Batch,
}

impl Embedder {
    fn new(
        model: &Arc<Model>,
        params: &ContextParams,
        hook: Option<Arc<dyn EvalHook>>,
    ) -> Result<Embedder, EngineError> {
        Ok(Embedder {
            ctx: Context::with_hook(Arc::clone(model), params, hook)?,
            batch: Batch::new(params.n_ctx as usize),
        })
    }

    fn embed(&mut self, tokens: &[i32]) -> Result<Vec<f32>, EngineError> {
        self.ctx.clear_all();
        self.batch.clear();
        for (pos, &token) in tokens.iter().enumerate() {
            self.batch.push(token, pos as i32, 0, true)?;
        }
        self.ctx.decode(&self.batch)?;
        let pooled = self
            .ctx
            .embeddings_seq(0)
            .ok_or_else(|| EngineError::Context("llama.cpp returned no pooled embedding".into()))?;
        Ok(l2_normalized(pooled))
    }
}

fn l2_normalized(v: &[f32]) -> Vec<f32> {
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    if norm == 0.0 {
        return v.to_vec();
    }
    v.iter().map(|&x| (f64::from(x) / norm) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::sync::OnceLock;

    use crate::llama::{ModelParams, SamplingParams};

    fn smollm2() -> Arc<Model> {
        static MODEL: OnceLock<Arc<Model>> = OnceLock::new();
        MODEL
            .get_or_init(|| {
                let path = crate::test_models::smollm2();
                Arc::new(Model::load(&path, ModelParams::default()).expect("load SmolLM2"))
            })
            .clone()
    }

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
        ];
        for config in bad {
            let err = config.validate().unwrap_err();
            assert!(matches!(err, EngineError::InvalidArgument(_)), "{err}");
        }
        BatchConfig::default().validate().unwrap();
    }

    #[test]
    fn l2_normalized_has_unit_norm() {
        let v = l2_normalized(&[3.0, 4.0]);
        assert_eq!(v, vec![0.6, 0.8]);
        assert_eq!(l2_normalized(&[0.0, 0.0]), vec![0.0, 0.0]);
    }

    /// A failed decode (here: llama.cpp's abort flag) fails the sequences
    /// in that batch and leaves the worker serving later requests.
    #[test]
    fn decode_failure_fails_the_batch_and_the_worker_goes_on() {
        let model = smollm2();
        let prompt = model
            .tokenize("The capital of France is", true, true)
            .unwrap();
        let config = BatchConfig {
            n_parallel: 2,
            n_ctx_per_seq: 256,
            n_batch: 64,
            n_threads: 2,
            queue_limit: 4,
        };
        let engine = BatchEngine::start(Arc::clone(&model), config).unwrap();
        let request = GenerateRequest {
            prompt: prompt.clone(),
            params: GenerateParams {
                sampling: SamplingParams::greedy(),
                max_tokens: Some(16),
                stop: vec![],
            },
        };
        // The sink holds the worker on its first event while the abort flag is set.
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        let (held_tx, held_rx) = mpsc::channel::<()>();
        let (tx, rx) = mpsc::channel();
        let mut first = true;
        let sink: EventSink = Box::new(move |event| {
            if first {
                first = false;
                held_tx.send(()).unwrap();
                gate_rx.recv_timeout(Duration::from_secs(60)).unwrap();
            }
            tx.send(event).is_ok()
        });
        engine.submit(request.clone(), sink).unwrap();
        held_rx.recv_timeout(Duration::from_secs(60)).unwrap();
        engine.inner.abort.store(true, Ordering::SeqCst);
        gate_tx.send(()).unwrap();
        let deadline = Duration::from_secs(60);
        let mut saw_error = false;
        while let Ok(event) = rx.recv_timeout(deadline) {
            match event {
                GenerationEvent::Text(_) => {}
                GenerationEvent::Error(e) => {
                    assert!(matches!(e, EngineError::Cancelled), "{e}");
                    saw_error = true;
                }
                GenerationEvent::Done(c) => panic!("unexpected completion {c:?}"),
            }
        }
        assert!(saw_error);
        assert_eq!(engine.status().requests_failed_total, 1);
        assert_eq!(engine.status().active, 0);

        engine.inner.abort.store(false, Ordering::SeqCst);
        let (tx, rx) = mpsc::channel();
        engine
            .submit(request, Box::new(move |e| tx.send(e).is_ok()))
            .unwrap();
        let done = loop {
            match rx.recv_timeout(deadline).unwrap() {
                GenerationEvent::Done(c) => break c,
                GenerationEvent::Text(_) => {}
                GenerationEvent::Error(e) => panic!("{e}"),
            }
        };
        assert_eq!(done.tokens.len(), 16);
        assert!(done.text.starts_with(" Paris"), "{:?}", done.text);
    }

    /// Each slot samples with its own grammar: two requests decoded together
    /// follow two different schemas.
    #[test]
    fn grammars_constrain_each_sequence_on_its_own() {
        let model = smollm2();
        let config = BatchConfig {
            n_parallel: 2,
            n_ctx_per_seq: 512,
            n_batch: 128,
            n_threads: 2,
            queue_limit: 4,
        };
        let engine = BatchEngine::start(Arc::clone(&model), config).unwrap();
        let schema = |values: &str| {
            crate::llama::json_schema_to_grammar(&format!(
                r#"{{"type":"object","properties":{{"answer":{{"enum":{values}}}}},"required":["answer"]}}"#
            ))
            .unwrap()
        };
        let prompt =
            crate::prompt::tokenize_raw(&model, "Is Paris in France? Answer in JSON:").unwrap();
        let receivers: Vec<_> = [schema(r#"["yes","no"]"#), schema("[1,2,3]")]
            .into_iter()
            .map(|grammar| {
                let (tx, rx) = mpsc::channel();
                let params = GenerateParams {
                    sampling: SamplingParams {
                        grammar: Some(grammar),
                        ..SamplingParams::greedy()
                    },
                    max_tokens: Some(64),
                    stop: vec![],
                };
                let request = GenerateRequest {
                    prompt: prompt.clone(),
                    params,
                };
                engine
                    .submit(request, Box::new(move |e| tx.send(e).is_ok()))
                    .unwrap();
                rx
            })
            .collect();
        let answers: Vec<serde_json::Value> = receivers
            .into_iter()
            .map(|rx| loop {
                match rx.recv_timeout(Duration::from_secs(120)).unwrap() {
                    GenerationEvent::Done(c) => {
                        assert_eq!(c.finish_reason, FinishReason::Stop, "{:?}", c.text);
                        break serde_json::from_str(&c.text).unwrap();
                    }
                    GenerationEvent::Text(_) => {}
                    GenerationEvent::Error(e) => panic!("{e}"),
                }
            })
            .collect();
        let first = answers[0]["answer"].as_str().unwrap();
        assert!(["yes", "no"].contains(&first), "{answers:?}");
        let second = answers[1]["answer"].as_i64().unwrap();
        assert!((1..=3).contains(&second), "{answers:?}");
        assert_eq!(answers[0].as_object().unwrap().len(), 1);
        assert_eq!(answers[1].as_object().unwrap().len(), 1);

        let bad = GenerateRequest {
            prompt,
            params: GenerateParams {
                sampling: SamplingParams {
                    grammar: Some("root ::= missing-rule".into()),
                    ..SamplingParams::greedy()
                },
                ..Default::default()
            },
        };
        let err = engine.submit(bad, Box::new(|_| true)).unwrap_err();
        assert!(matches!(err, EngineError::InvalidArgument(_)), "{err}");
    }
}
