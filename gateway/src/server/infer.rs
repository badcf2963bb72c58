//! What both API families share between a checked request and the engine:
//! prompts (chat template or raw text → tokens), submitting to the model's
//! [`BatchEngine`], and the stream of events coming back.
//!
//! Cancellation: the engine's sink sends into a channel whose receiver lives
//! in the response stream. When the client goes away the server drops that
//! stream, the next send fails, the sink returns `false` and the engine frees
//! the slot; dropping the stream also calls [`BatchEngine::cancel`] so a
//! request still waiting for a slot or in prompt evaluation ends at once.
use std::time::Instant;

use llama_tiered::batch::{BatchEngine, GenerateRequest, GenerationEvent, RequestId};
use llama_tiered::chat::{ChatMessage, ChatTemplate, RenderOptions};
use llama_tiered::generate::{Completion, FinishReason, GenerateParams};
use llama_tiered::prompt;
use llama_tiered::tools::{ParsedReply, ToolStream};
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use super::error::ApiError;
use super::registry::{LoadedModel, ModelLease};
use super::validation::fit_to_context;

/// Renders `messages` (and `tools`, an OpenAI tools array) with the
/// model's template (or `template_override`, a Jinja chat template) and
/// tokenizes the result.
pub fn chat_prompt(
    model: &LoadedModel,
    messages: &[ChatMessage],
    template_override: Option<&str>,
    extra: Map<String, Value>,
    tools: Option<&Value>,
) -> Result<Vec<i32>, ApiError> {
    let custom;
    let template = match template_override {
        Some(source) => {
            let text = |t: Option<i32>| t.and_then(|t| model.model().token_text(t));
            let bos = text(model.model().token_bos()).unwrap_or_default();
            let eos = text(model.model().token_eos()).unwrap_or_default();
            custom = ChatTemplate::new(source, &bos, &eos)
                .map_err(|e| ApiError::bad_request(format!("template: {e}")))?;
            &custom
        }
        None => model.template.as_ref().map_err(|e| {
            ApiError::bad_request(format!(
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
    let rendered = template
        .render(messages, &options)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok(prompt::tokenize_chat(&model.model(), &rendered)?)
}

/// Tokenizes raw text (BOS added when the model wants it, special-token text parsed).
pub fn raw_prompt(model: &LoadedModel, text: &str) -> Result<Vec<i32>, ApiError> {
    Ok(prompt::tokenize_raw(&model.model(), text)?)
}

/// One request running on a model's engine.
pub struct Generation {
    events: mpsc::UnboundedReceiver<GenerationEvent>,
    guard: CancelOnDrop,
    /// Keeps the model loaded until the response is over.
    pub lease: ModelLease,
    pub prompt_tokens: Vec<i32>,
    pub started: Instant,
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
/// window: the server's per-sequence context, or `num_ctx` when smaller.
pub fn start(
    lease: ModelLease,
    prompt: Vec<i32>,
    mut params: GenerateParams,
    num_ctx: Option<u32>,
    started: Instant,
) -> Result<Generation, ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::bad_request(
            "the prompt is empty after tokenization",
        ));
    }
    let n_ctx = num_ctx.map_or(lease.n_ctx_per_seq, |n| n.min(lease.n_ctx_per_seq));
    fit_to_context(prompt.len(), &mut params, n_ctx)?;
    let (tx, rx) = mpsc::unbounded_channel();
    let request = GenerateRequest {
        prompt: prompt.clone(),
        params,
    };
    let sink = Box::new(move |event: GenerationEvent| tx.send(event).is_ok());
    let id = lease.engine.submit(request, sink)?;
    Ok(Generation {
        events: rx,
        guard: CancelOnDrop {
            engine: lease.engine.clone(),
            id,
            finished: false,
        },
        lease,
        prompt_tokens: prompt,
        started,
    })
}

/// What [`Generation::next_filtered`] yields: text to send, then `Done`
/// with the held-back reply (when there was a filter), or `Error`.
pub enum Filtered {
    Text(String),
    Done(Completion, Option<ParsedReply>),
    Error(ApiError),
}

/// What a [`Generation`] yields, in order: text pieces, then one `Done` or `Error`.
pub enum Step {
    Text(String),
    Done(Completion),
    Error(ApiError),
}

impl Generation {
    /// The next event; `None` after `Done` or `Error`.
    pub async fn next(&mut self) -> Option<Step> {
        if self.guard.finished {
            return None;
        }
        let event = tokio::select! {
            biased;
            event = self.events.recv() => event,
            // Shutdown past its grace period: the guard cancels the request.
            () = self.lease.cancelled() => return self.cancelled_by_shutdown(),
        };
        let step = match event {
            Some(GenerationEvent::Text(text)) => return Some(Step::Text(text)),
            Some(GenerationEvent::Done(completion)) => Step::Done(completion),
            Some(GenerationEvent::Error(e)) => Step::Error(e.into()),
            None => Step::Error(ApiError::Internal(
                "the engine dropped the request without an answer".into(),
            )),
        };
        self.guard.finished = true;
        Some(step)
    }

    /// The last step of a request the server cancels as it shuts down.
    fn cancelled_by_shutdown(&mut self) -> Option<Step> {
        self.guard.engine.cancel(self.guard.id);
        self.guard.finished = true;
        Some(Step::Error(ApiError::ShuttingDown(
            "the server is shutting down: this request was cancelled, send it again later".into(),
        )))
    }

    /// [`Generation::next`] through the tool-call filter of a request with
    /// tools: text the filter holds back (a call may be starting) is not
    /// yielded, empty pieces are skipped, and `Done` carries what it held,
    /// parsed into content and calls.
    pub async fn next_filtered(&mut self, filter: &mut Option<ToolStream>) -> Option<Filtered> {
        loop {
            return Some(match self.next().await? {
                Step::Text(text) => {
                    let text = match filter.as_mut() {
                        Some(filter) => filter.push(&text),
                        None => text,
                    };
                    if text.is_empty() {
                        continue;
                    }
                    Filtered::Text(text)
                }
                Step::Done(completion) => {
                    Filtered::Done(completion, filter.take().map(ToolStream::finish))
                }
                Step::Error(e) => Filtered::Error(e),
            });
        }
    }

    /// Runs to the end: the whole completion (its `text` holds all the text).
    pub async fn collect(mut self) -> Result<(Completion, Generation), ApiError> {
        let mut text = String::new();
        while let Some(step) = self.next().await {
            match step {
                Step::Text(piece) => text.push_str(&piece),
                Step::Done(mut completion) => {
                    if completion.text.is_empty() {
                        completion.text = text;
                    }
                    return Ok((completion, self));
                }
                Step::Error(e) => return Err(e),
            }
        }
        Err(ApiError::Internal(
            "generation ended without a result".into(),
        ))
    }
}

/// Submits once more if the engine was being unloaded (a keep-alive expiry
/// racing this request): the second lease gets a freshly loaded engine.
pub fn is_shutting_down(e: &ApiError) -> bool {
    matches!(e, ApiError::ShuttingDown(_))
}

/// Ollama's and OpenAI's name for why generation ended.
pub fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop | FinishReason::Cancelled => "stop",
        FinishReason::Length => "length",
    }
}

/// Seconds → integer nanoseconds (Ollama's durations).
pub fn nanos(seconds: f64) -> u64 {
    (seconds.max(0.0) * 1e9) as u64
}
