//! The in-process llama-tiered engine behind [`ModelBackend`]: the only
//! place in the gateway that touches a `Model` (tokenizer, BOS, EOG) or a
//! [`BatchEngine`].
//!
//! Cancellation: the engine's sink sends into a channel whose receiver lives
//! in the event stream. When the stream is dropped (client gone) the next
//! send fails, the sink returns `false` and the engine frees the slot;
//! dropping it also calls [`BatchEngine::cancel`] so a request still waiting
//! for a slot or in prompt evaluation ends at once.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};
use hypura_chat::{ChatMessage, ChatTemplate, RenderOptions};
use llama_tiered::engine::generate::{self, Completion, GenerateParams};
use llama_tiered::engine::prompt;
use llama_tiered::engine::{BatchEngine, GenerateRequest, GenerationEvent, RequestId};
use llama_tiered::llama::Model;
use llama_tiered::EngineError;
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use super::registry::{InProcess, ModelLease};
use crate::core::backend::{
    BackendError, BackendEvent, BackendStatus, DecodeRate, EmbedOutput, EventStream, FinishReason,
    Finished, KvCache, MemoryUse, ModelBackend, ModelFacts, Residency, StreamCounters,
};
use crate::core::error::ApiError;
use crate::core::request::{BackendRequest, EmbedBatch, EmbedText, GenerationParams, Prompt};
use crate::core::structured::constraint_grammar;
use crate::core::validation::{check_embed_bytes, fit_to_context};

/// A model loaded in this process, held by one request's lease: the model
/// stays loaded while this lives.
pub struct LocalBackend {
    lease: ModelLease,
    /// The lease's model's engine.
    local: Arc<InProcess>,
    tokenized: Tokenized,
}

/// `request` as llama.cpp takes it: its constraint (a JSON Schema, any
/// JSON object, the tools' grammar) made the sampler's GBNF grammar, the
/// schema checked and converted off the async runtime with its bounds
/// ([`crate::core::structured`]). Every local model's request passes here
/// before its engine (the runner's gateway side converts it).
pub fn with_grammar(mut request: BackendRequest) -> Result<BackendRequest, BackendError> {
    let Some(constraint) = request.params.constraint.take() else {
        return Ok(request);
    };
    let grammar = constraint_grammar(&constraint).map_err(|e| match e {
        ApiError::Validation(_) | ApiError::BadRequest(_) => BackendError::Invalid(e.to_string()),
        ApiError::Unavailable(_) => BackendError::Busy(e.to_string()),
        e => BackendError::Failed(e.to_string()),
    })?;
    request.params.sampling.grammar = Some(grammar);
    Ok(request)
}

impl LocalBackend {
    /// `local` is the engine of `lease`'s model.
    pub fn new(lease: ModelLease, local: Arc<InProcess>) -> LocalBackend {
        LocalBackend {
            lease,
            local,
            tokenized: Tokenized::default(),
        }
    }

    /// [`ModelBackend::generate`], synchronously: renders and tokenizes the
    /// prompt (unless its length was just asked) and queues it. A runner
    /// calls it on a thread of its own, off its read loop.
    pub fn submit(&self, request: BackendRequest) -> Result<EventStream, BackendError> {
        let request = with_grammar(request)?;
        let tokens = self.tokens(&request, true)?;
        let running = submit(&self.lease, &self.local, tokens, &request.params)?;
        Ok(record_rate(
            events(running),
            Arc::clone(&self.lease.decode_rate),
        ))
    }

    /// The request's tokens, tokenized once for its length check
    /// ([`ModelBackend::prompt_tokens`]) and its generation.
    fn tokens(&self, request: &BackendRequest, consume: bool) -> Result<Vec<i32>, BackendError> {
        if let Some(tokens) = self.tokenized.get(request, consume) {
            return Ok(tokens);
        }
        let tokens = prompt_tokens(&self.local, request)?;
        if !consume {
            self.tokenized.put(request, &tokens);
        }
        Ok(tokens)
    }
}

/// The last few prompts whose length was asked, with their tokens: a long
/// conversation's template and tokenizer cost milliseconds a turn (more
/// than its new tokens' prefill on a GPU), and every request is measured
/// against the context before it generates.
#[derive(Default)]
struct Tokenized(std::sync::Mutex<std::collections::VecDeque<TokenizedPrompt>>);

struct TokenizedPrompt {
    context: Vec<i32>,
    prompt: Prompt,
    tokens: Vec<i32>,
}

impl Tokenized {
    const ENTRIES: usize = 4;

    fn get(&self, request: &BackendRequest, consume: bool) -> Option<Vec<i32>> {
        let mut entries = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let at = entries
            .iter()
            .position(|e| e.context == request.context && e.prompt == request.prompt)?;
        if consume {
            entries.remove(at).map(|e| e.tokens)
        } else {
            Some(entries[at].tokens.clone())
        }
    }

    fn put(&self, request: &BackendRequest, tokens: &[i32]) {
        let mut entries = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() == Self::ENTRIES {
            entries.pop_front();
        }
        entries.push_back(TokenizedPrompt {
            context: request.context.clone(),
            prompt: request.prompt.clone(),
            tokens: tokens.to_vec(),
        });
    }
}

impl ModelBackend for LocalBackend {
    fn generate(
        &self,
        request: BackendRequest,
    ) -> BoxFuture<'_, Result<EventStream, BackendError>> {
        std::future::ready(self.submit(request)).boxed()
    }

    fn embed(&self, batch: EmbedBatch) -> BoxFuture<'_, Result<EmbedOutput, BackendError>> {
        let model = self.local.engine.model();
        let engine = self.local.engine.clone();
        async move {
            // Dropped with this future when the client goes away: the
            // blocking task stops at its next text.
            let gone = FlagOnDrop(Arc::new(AtomicBool::new(false)));
            let flag = Arc::clone(&gone.0);
            tokio::task::spawn_blocking(move || embed(&model, &engine, batch, &flag))
                .await
                .map_err(|e| BackendError::Failed(format!("embedding task failed: {e}")))?
        }
        .boxed()
    }

    fn count_tokens(&self, text: &str) -> Result<usize, BackendError> {
        Ok(prompt::tokenize_raw(&self.local.engine.model(), text)?.len())
    }

    fn prompt_tokens(&self, request: &BackendRequest) -> Result<usize, BackendError> {
        Ok(self.tokens(request, false)?.len())
    }

    fn status(&self) -> BackendStatus {
        let status = self.local.engine.status();
        BackendStatus {
            context_length: self.lease.n_ctx_per_seq,
            active: status.active,
            queued: status.queued,
            parallel: status.n_parallel,
            decode_tokens_per_second: self.lease.decode_rate.tokens_per_second(),
        }
    }

    fn facts(&self) -> ModelFacts {
        self.lease.info.facts()
    }

    fn memory(&self) -> MemoryUse {
        self.lease.memory()
    }

    fn set_residency(&self, level: Residency) -> Result<(), BackendError> {
        self.lease
            .set_residency(level)
            .map_err(BackendError::Invalid)
    }

    fn streaming(&self) -> Option<StreamCounters> {
        self.lease.stream_counters()
    }

    fn kv_cache(&self) -> Option<KvCache> {
        let status = self.local.engine.status();
        let cells = u64::from(status.n_parallel) * u64::from(status.n_ctx_per_seq);
        Some(KvCache {
            cells_used: status.kv_cells_used,
            cells,
            bytes: cells * self.lease.kv_bytes_per_token,
            prompt_cache: status.prompt_cache,
        })
    }
}

/// Counts each finished generation of `events` in the model's decode rate.
fn record_rate(events: EventStream, rate: Arc<DecodeRate>) -> EventStream {
    events
        .inspect(move |event| {
            if let BackendEvent::Done(finished) = event {
                rate.record(finished);
            }
        })
        .boxed()
}

fn invalid(message: impl Into<String>) -> BackendError {
    BackendError::Invalid(message.into())
}

/// The request's tokens: its `context` (checked against the vocabulary),
/// then the prompt (without BOS when it continues a context).
fn prompt_tokens(model: &InProcess, request: &BackendRequest) -> Result<Vec<i32>, BackendError> {
    let context = &request.context;
    let n_vocab = model.engine.model().n_vocab() as i32;
    if let Some(bad) = context.iter().find(|&&t| t < 0 || t >= n_vocab) {
        return Err(invalid(format!(
            "context holds token {bad}, outside the vocabulary of {n_vocab} tokens"
        )));
    }
    let continuing = !context.is_empty();
    let new_tokens = match &request.prompt {
        Prompt::Load => return Err(invalid("a load request has no prompt to generate from")),
        Prompt::Tokens(tokens) => tokens.clone(),
        Prompt::Text { text } if continuing => model.engine.model().tokenize(text, false, true)?,
        Prompt::Text { text } => prompt::tokenize_raw(&model.engine.model(), text)?,
        Prompt::Messages {
            messages,
            tools,
            template_override,
            template_extra,
        } => {
            let mut tokens = chat_prompt(
                model,
                messages,
                template_override.as_deref(),
                template_extra.clone(),
                tools.as_ref(),
            )?;
            // The conversation already began with BOS.
            let bos = model.engine.model().token_bos();
            if continuing && bos.is_some() && tokens.first().copied() == bos {
                tokens.remove(0);
            }
            tokens
        }
    };
    Ok([context.as_slice(), &new_tokens].concat())
}

/// Renders `messages` (and `tools`, an OpenAI tools array) with the
/// model's template (or `template_override`, a Jinja chat template) and
/// tokenizes the result.
fn chat_prompt(
    model: &InProcess,
    messages: &[ChatMessage],
    template_override: Option<&str>,
    extra: Map<String, Value>,
    tools: Option<&Value>,
) -> Result<Vec<i32>, BackendError> {
    let custom;
    let template = match template_override {
        Some(source) => {
            let text = |t: Option<i32>| t.and_then(|t| model.engine.model().token_text(t));
            let bos = text(model.engine.model().token_bos()).unwrap_or_default();
            let eos = text(model.engine.model().token_eos()).unwrap_or_default();
            custom = ChatTemplate::new(source, &bos, &eos)
                .map_err(|e| invalid(format!("template: {e}")))?;
            &custom
        }
        None => model.template.as_ref().map_err(|e| {
            invalid(format!(
                "the model's chat template cannot be used ({e}): send raw prompts or a \
                 `template` override"
            ))
        })?,
    };
    let options = RenderOptions {
        extra,
        tools: tools.cloned(),
        ..RenderOptions::default()
    };
    let (messages, prefill) = split_prefill(messages);
    let mut rendered = template
        .render(messages, &options)
        .map_err(|e| invalid(e.to_string()))?;
    rendered.push_str(prefill);
    Ok(prompt::tokenize_chat(&model.engine.model(), &rendered)?)
}

/// A conversation ending with an assistant message (without tool calls)
/// asks for that message to be continued, as llama.cpp's server and Ollama
/// do: the messages before it, rendered up to the opening of the
/// assistant's turn, then its text, so the reply goes on from there.
fn split_prefill(messages: &[ChatMessage]) -> (&[ChatMessage], &str) {
    match messages.split_last() {
        Some((last, before))
            if last.role == "assistant" && last.tool_calls.is_none() && !before.is_empty() =>
        {
            (before, last.content.as_str())
        }
        _ => (messages, ""),
    }
}

/// One request submitted to the engine: its events, and the guard that
/// cancels it when dropped before its end.
struct Running {
    /// The engine's events, each with when the worker sent it.
    events: mpsc::UnboundedReceiver<(Instant, GenerationEvent)>,
    guard: CancelOnDrop,
    model: Arc<Model>,
    prompt: Vec<i32>,
    submitted: Instant,
    started: bool,
    first_token: bool,
    /// Turns true when the server stops waiting for in-flight requests.
    shutdown: tokio::sync::watch::Receiver<bool>,
}

struct CancelOnDrop {
    engine: BatchEngine,
    id: RequestId,
    finished: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.finished {
            self.engine.cancel(self.id);
        }
    }
}

/// Submits `prompt` to the leased model. The prompt must fit the context
/// window: the model's per-sequence context, or `num_ctx` when smaller.
fn submit(
    lease: &ModelLease,
    local: &InProcess,
    prompt: Vec<i32>,
    params: &GenerationParams,
) -> Result<Running, BackendError> {
    if prompt.is_empty() {
        return Err(invalid("the prompt is empty after tokenization"));
    }
    // Before the engine: a bad id there would fail the generation after
    // its answer began (a stream's 200) instead of as a 400.
    params
        .sampling
        .check_vocabulary(local.engine.model().n_vocab())
        .map_err(|e| match e {
            EngineError::InvalidArgument(message) => invalid(message),
            e => e.into(),
        })?;
    let n_ctx = params
        .num_ctx
        .map_or(lease.n_ctx_per_seq, |n| n.min(lease.n_ctx_per_seq));
    let mut generate = GenerateParams {
        sampling: params.sampling.clone(),
        max_tokens: params.max_tokens,
        stop: params.stop.clone(),
        cache_prompt: !params.skip_prompt_cache,
    };
    fit_to_context(prompt.len(), &mut generate.max_tokens, n_ctx)
        .map_err(|e| invalid(e.to_string()))?;
    let (tx, rx) = mpsc::unbounded_channel();
    let request = GenerateRequest {
        prompt: prompt.clone(),
        params: generate,
    };
    let sink = Box::new(move |event: GenerationEvent| tx.send((Instant::now(), event)).is_ok());
    let submitted = Instant::now();
    let id = local.engine.submit(request, sink)?;
    Ok(Running {
        events: rx,
        guard: CancelOnDrop {
            engine: local.engine.clone(),
            id,
            finished: false,
        },
        model: local.engine.model(),
        prompt,
        submitted,
        started: false,
        first_token: false,
        shutdown: lease.shutdown_signal(),
    })
}

/// The engine's events as [`BackendEvent`]s, `Started` and `FirstToken` included.
fn events(running: Running) -> EventStream {
    futures_util::stream::unfold(Some(running), |state| async move {
        let mut running = state?;
        let (events, ended) = running.next_events().await;
        Some((events, (!ended).then_some(running)))
    })
    .flat_map(futures_util::stream::iter)
    .boxed()
}

/// Resolves once `signal` turns true; never if its sender is gone.
async fn shutdown(signal: &mut tokio::sync::watch::Receiver<bool>) {
    if signal.wait_for(|&stop| stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

impl Running {
    /// The last event of a request the server cancels as it shuts down.
    fn cancelled_by_shutdown(&mut self) -> BackendEvent {
        self.guard.engine.cancel(self.guard.id);
        self.guard.finished = true;
        BackendEvent::Error(BackendError::ShuttingDown(
            "the server is shutting down: this request was cancelled, send it again later".into(),
        ))
    }

    /// The events one engine event becomes, and whether it was the last.
    ///
    /// `Started` comes from the engine when the request takes a slot, before
    /// its prompt is evaluated: `queued_for` is the time from submission to
    /// then, as the worker saw it. `FirstToken` comes with the first text or
    /// log-probabilities (or with `Done` when the only sampled tokens made
    /// neither).
    async fn next_events(&mut self) -> (Vec<BackendEvent>, bool) {
        let mut out = Vec::new();
        let event = tokio::select! {
            biased;
            event = self.events.recv() => event,
            () = shutdown(&mut self.shutdown) => return (vec![self.cancelled_by_shutdown()], true),
        };
        let (at, event) = match event {
            Some((at, event)) => (at, Some(event)),
            None => (Instant::now(), None),
        };
        if !self.started && !matches!(event, Some(GenerationEvent::Error(_)) | None) {
            self.started = true;
            out.push(BackendEvent::Started {
                queued_for: at.saturating_duration_since(self.submitted),
            });
        }
        let sampled = match &event {
            Some(GenerationEvent::Text(_) | GenerationEvent::Logprobs(_)) => true,
            Some(GenerationEvent::Done(c)) => !c.tokens.is_empty(),
            _ => false,
        };
        if sampled && !self.first_token {
            self.first_token = true;
            out.push(BackendEvent::FirstToken);
        }
        let last = match event {
            Some(GenerationEvent::Started) => return (out, false),
            Some(GenerationEvent::Text(text)) => {
                out.push(BackendEvent::Text(text));
                return (out, false);
            }
            Some(GenerationEvent::Logprobs(logprobs)) => {
                out.push(BackendEvent::Logprobs(logprobs));
                return (out, false);
            }
            Some(GenerationEvent::Done(completion)) => {
                BackendEvent::Done(self.finished(completion))
            }
            Some(GenerationEvent::Error(e)) => BackendEvent::Error(e.into()),
            None => BackendEvent::Error(BackendError::Failed(
                "the engine dropped the request without an answer".into(),
            )),
        };
        self.guard.finished = true;
        out.push(last);
        (out, true)
    }

    fn finished(&self, completion: Completion) -> Finished {
        // The end-of-generation token is not text: it is not counted.
        let eog = completion
            .tokens
            .last()
            .is_some_and(|&t| self.model.is_eog(t));
        let t = completion.timings;
        Finished {
            finish_reason: match completion.finish_reason {
                generate::FinishReason::Stop => FinishReason::Stop,
                generate::FinishReason::Length => FinishReason::Length,
                generate::FinishReason::Cancelled => FinishReason::Cancelled,
            },
            prompt_tokens: self.prompt.len(),
            generated_tokens: completion.tokens.len() - usize::from(eog),
            prompt_eval_tokens: t.prompt_tokens,
            prompt_eval_duration: seconds(t.prompt_eval_seconds),
            eval_duration: seconds(t.eval_seconds),
            context: [self.prompt.as_slice(), &completion.tokens].concat(),
        }
    }
}

fn seconds(s: f64) -> Duration {
    Duration::try_from_secs_f64(s.max(0.0)).unwrap_or_default()
}

/// Most tokens of one embedding request, all texts together (OpenAI's limit).
pub const EMBED_MAX_TOTAL_TOKENS: usize = 300_000;

/// Sets its flag when dropped.
struct FlagOnDrop(Arc<AtomicBool>);

impl Drop for FlagOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Embeds each input as one vector, one at a time so that `gone` (the
/// client left) stops it between inputs and other requests get the
/// embedder in between. An input may hold as many tokens as the served
/// context (or `num_ctx`, when smaller); a longer one is cut to that many
/// (`truncate`, counted as cut) or refused.
fn embed(
    model: &Model,
    engine: &BatchEngine,
    mut batch: EmbedBatch,
    gone: &AtomicBool,
) -> Result<EmbedOutput, BackendError> {
    let went_away = || BackendError::Failed("the client went away".into());
    let served = engine.embed_n_ctx();
    let limit = batch.num_ctx.map_or(served, |n| n.clamp(1, served)) as usize;
    check_embed_bytes(&mut batch.inputs, batch.truncate, limit)
        .map_err(|e| invalid(e.to_string()))?;
    let mut inputs = Vec::with_capacity(batch.inputs.len());
    let mut token_count = 0;
    for (i, input) in batch.inputs.into_iter().enumerate() {
        if gone.load(Ordering::Relaxed) {
            return Err(went_away());
        }
        if token_count > EMBED_MAX_TOTAL_TOKENS {
            return Err(invalid(format!(
                "the inputs have more than {EMBED_MAX_TOTAL_TOKENS} tokens together: send \
                 fewer or shorter inputs per request"
            )));
        }
        let mut tokens = match input {
            // As the engine tokenizes texts to embed: BOS as the model wants, specials as text.
            EmbedText::Text(text) => model.tokenize(&text, true, false)?,
            EmbedText::Tokens(tokens) => tokens,
        };
        if tokens.is_empty() {
            return Err(invalid(format!("input {i} is empty: nothing to embed")));
        }
        let n_vocab = model.n_vocab();
        if let Some(bad) = tokens.iter().find(|&&t| t < 0 || t as usize >= n_vocab) {
            return Err(invalid(format!(
                "input {i} holds token {bad}, outside the vocabulary of {n_vocab} tokens"
            )));
        }
        if tokens.len() > limit {
            if !batch.truncate {
                return Err(invalid(format!(
                    "input {i} has {} tokens, more than the context of {limit} tokens \
                     embeddings take: shorten it (Ollama's /api/embed cuts it to the context \
                     with truncate: true)",
                    tokens.len()
                )));
            }
            tokens.truncate(limit);
        }
        token_count += tokens.len();
        inputs.push(tokens);
    }
    if token_count > EMBED_MAX_TOTAL_TOKENS {
        return Err(invalid(format!(
            "the inputs have {token_count} tokens together, more than {EMBED_MAX_TOTAL_TOKENS}: \
             send fewer or shorter inputs per request"
        )));
    }
    let mut vectors = Vec::with_capacity(inputs.len());
    for input in inputs.chunks(1) {
        if gone.load(Ordering::Relaxed) {
            return Err(went_away());
        }
        vectors.extend(engine.embed_tokens(input)?);
    }
    Ok(EmbedOutput {
        vectors,
        prompt_tokens: token_count,
    })
}
