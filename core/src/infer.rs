//! The one inference path: every generation of every API family goes
//! through [`infer`], every embedding through [`embed`].
//!
//! [`infer`] resolves the model once through [`Models`] (the pool), checks the request
//! against the model's facts (tools, thinking), has the pool admit it (load,
//! budget), submits it to the model's [`ModelBackend`] (once more if that
//! backend was stopping under it) and hands back a [`Generation`]: its events
//! through the tool-call filter, ending in one [`InferEvent::Done`] with the
//! final usage or one [`InferEvent::Error`]. Dropping a [`Generation`]
//! (client gone) drops the backend's stream, which cancels the request.
//! [`finish`] records the end of every generation, whichever way it ends.
//!
//! Each generation and embedding runs in the span its [`Observer`] makes, a
//! child of the HTTP request's: model loads and log lines on the way are its
//! children, and [`finish`] has the observer record the usage and timings.
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use hypura_chat::tools::{ParsedReply, ToolCall, ToolStream};
use tracing::{Instrument as _, Span};

use super::backend::{
    BackendError, BackendEvent, EventStream, FinishReason, Finished, TokenLogprobs,
};
use super::error::ApiError;
pub use super::models::BackendLease;
use super::models::{Found, LeaseRequest, LocalModel, Models};
use super::observer::Observer;
use super::request::{EmbedRequest, InferRequest, Prompt};
use super::structured::{prepare_tools, Tools};
use super::truncate;
use super::validation::{self, ValidationError};

/// What every request runs through: the models, and who hears of the requests.
#[derive(Clone)]
pub struct Inference {
    pub models: Arc<dyn Models>,
    pub observer: Arc<dyn Observer>,
}

/// What [`infer`] answers.
pub enum Answer {
    /// The model is generating: read its events.
    Generating(Box<Generation>),
    /// A request without a prompt loaded the model (`"load"`) or, with a zero
    /// keep-alive, unloaded it (`"unload"`).
    Loaded {
        done_reason: &'static str,
        took: Duration,
    },
}

/// Runs `request` on its model. `arrived` is when the request reached the
/// server: durations reported to clients count from it.
pub async fn infer(
    inference: &Inference,
    request: InferRequest,
    arrived: Instant,
) -> Result<Answer, ApiError> {
    let span = inference.observer.generation_span(&request);
    let answer = resolve_and_start(inference, request, arrived)
        .instrument(span.clone())
        .await;
    if let Err(e) = &answer {
        inference.observer.failed(&span, e);
    }
    answer
}

/// [`infer`] in the generation's span.
async fn resolve_and_start(
    inference: &Inference,
    mut request: InferRequest,
    arrived: Instant,
) -> Result<Answer, ApiError> {
    let models = inference.models.as_ref();
    let local = match models.find(&request.name) {
        None => return Err(ApiError::ModelNotFound(request.requested.clone())),
        Some(Found::Remote(lease)) => {
            return start_remote(inference, lease, request, arrived).await
        }
        Some(Found::Local(local)) => local,
    };
    inference.observer.model_used(&request.name.display);
    if let Some(defaults) = &local.defaults {
        defaults.apply(&mut request.backend);
    }
    let tools = check_tools(&mut request, &local)?;
    check_thinking(&mut request, &local)?;
    check_context(&request, &local)?;
    if request.backend.prompt == Prompt::Load {
        return load_or_unload(models, &request).await;
    }
    // A reply with no limit of its own stops at the server's.
    let params = &mut request.backend.params;
    params.max_tokens.get_or_insert(models.default_max_tokens());
    let mut attempt = 0;
    loop {
        attempt += 1;
        let lease = models.lease(lease_request(&request)).await?;
        let observer = Arc::clone(&inference.observer);
        match Generation::start(lease, &request, tools.clone(), arrived, observer).await {
            // A keep-alive expiry raced this request: a second lease gets a fresh load.
            Err(ApiError::ShuttingDown(_)) if attempt == 1 => continue,
            other => return other.map(|g| Answer::Generating(Box::new(g))),
        }
    }
}

/// The tokens `request`'s prompt takes on its model, its template and
/// tools included (Anthropic's `count_tokens`); loads the model if it is not.
pub async fn count_prompt_tokens(
    inference: &Inference,
    mut request: InferRequest,
) -> Result<usize, ApiError> {
    let models = inference.models.as_ref();
    let local = match models.find(&request.name) {
        None => return Err(ApiError::ModelNotFound(request.requested.clone())),
        Some(Found::Remote(_)) => {
            return Err(ValidationError::NotSupportedYet(
                "counting tokens is not supported for a model another server runs",
            )
            .into())
        }
        Some(Found::Local(local)) => local,
    };
    if let Some(defaults) = &local.defaults {
        defaults.apply(&mut request.backend);
    }
    check_tools(&mut request, &local)?;
    check_thinking(&mut request, &local)?;
    let lease = models.lease(lease_request(&request)).await?;
    let backend = &lease.backend;
    Ok(crate::blocking::off_runtime(|| {
        backend.prompt_tokens(&request.backend)
    })?)
}

/// What `request` asks of the pool.
fn lease_request(request: &InferRequest) -> LeaseRequest<'_> {
    LeaseRequest {
        requested: &request.requested,
        name: &request.name,
        keep_alive: request.keep_alive,
        context: request.backend.params.num_ctx,
    }
}

/// Runs `request` on a model another server runs. Its constraint and tools
/// (with the tool choice) are passed on as data, and the calls come back
/// parsed ([`BackendEvent::ToolCalls`]); a request without a prompt answers
/// at once (the upstream loads on its first real request).
async fn start_remote(
    inference: &Inference,
    lease: BackendLease,
    mut request: InferRequest,
    arrived: Instant,
) -> Result<Answer, ApiError> {
    inference.observer.model_used(&request.name.display);
    if request.backend.prompt == Prompt::Load {
        let unload = request.keep_alive.is_some_and(|k| k.is_zero());
        return Ok(Answer::Loaded {
            done_reason: if unload { "unload" } else { "load" },
            took: arrived.elapsed(),
        });
    }
    if let (Some(offered), Prompt::Messages { tools, .. }) =
        (&request.tools, &mut request.backend.prompt)
    {
        *tools = Some(serde_json::Value::Array(offered.definitions.clone()));
        request.backend.params.tool_choice = Some((offered.choice.clone(), offered.parallel));
    }
    let observer = Arc::clone(&inference.observer);
    let generation = Generation::start(lease, &request, None, arrived, observer).await?;
    Ok(Answer::Generating(Box::new(generation)))
}

/// Checks the request's tools against the model's template; when some take
/// part, puts them in the prompt, their markers in the sampling and their
/// grammar (a forced call, the generic format) in the constraint.
fn check_tools(request: &mut InferRequest, info: &LocalModel) -> Result<Option<Tools>, ApiError> {
    let Some(offered) = &request.tools else {
        return Ok(None);
    };
    let tools = prepare_tools(
        Some(offered.definitions.as_slice()),
        &offered.choice,
        offered.parallel,
        info.chat_template.as_deref(),
    )?;
    if let Some(tools) = &tools {
        tools.apply(&mut request.backend.params)?;
        tools.render_into(&mut request.backend.prompt);
    }
    Ok(tools)
}

/// `num_ctx` may not pass the model's training context.
fn check_context(request: &InferRequest, info: &LocalModel) -> Result<(), ApiError> {
    let (Some(asked), Some(trained)) = (request.backend.params.num_ctx, info.context_length) else {
        return Ok(());
    };
    if u64::from(asked) > trained {
        return Err(ValidationError::NumCtxTooLarge {
            asked,
            model: request.requested.clone(),
            limit: u32::try_from(trained).unwrap_or(u32::MAX),
            why: "its training context",
        }
        .into());
    }
    Ok(())
}

/// `think: true` needs a model that thinks; the template learns the choice
/// through `enable_thinking` (models that do not think ignore `false`).
fn check_thinking(request: &mut InferRequest, info: &LocalModel) -> Result<(), ApiError> {
    let Some(wants) = request.think else {
        return Ok(());
    };
    if !info.capabilities.contains(&"thinking") {
        if wants {
            return Err(ValidationError::Unsupported {
                model: request.requested.clone(),
                capability: "thinking",
            }
            .into());
        }
        return Ok(());
    }
    if let Prompt::Messages { template_extra, .. } = &mut request.backend.prompt {
        template_extra.insert("enable_thinking".into(), wants.into());
    }
    Ok(())
}

/// No prompt: load the model, or unload it with a zero keep-alive.
async fn load_or_unload(models: &dyn Models, request: &InferRequest) -> Result<Answer, ApiError> {
    let started = Instant::now();
    let done_reason = if request.keep_alive.is_some_and(|k| k.is_zero()) {
        models.unload(&request.name);
        "unload"
    } else {
        drop(models.lease(lease_request(request)).await?);
        "load"
    };
    Ok(Answer::Loaded {
        done_reason,
        took: started.elapsed(),
    })
}

/// What a [`Generation`] yields, in order: text, then one `Done` or `Error`.
#[derive(Debug)]
pub enum InferEvent {
    Text(String),
    Done(Box<Outcome>),
    Error(ApiError),
}

/// The end of a generation, as the dialects report it.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub finished: Finished,
    /// With tools: the reply parsed into content and calls. Streaming, only
    /// the text the filter held back; collected, the whole reply.
    pub reply: Option<ParsedReply>,
    /// The whole text of the reply (all `Text` pieces).
    pub text: String,
    /// Log-probabilities of the reply's tokens, when asked: collected, all of
    /// them; streaming, those not yet taken ([`Generation::take_logprobs`]).
    pub logprobs: Vec<TokenLogprobs>,
    pub load_duration: Duration,
    /// From the request's arrival to its end.
    pub total_duration: Duration,
    /// From submission to the start of its prompt's evaluation.
    pub queued_for: Option<Duration>,
    /// From the request's arrival to its first token.
    pub time_to_first_token: Option<Duration>,
}

impl Outcome {
    /// The tool calls of the reply (none without tools).
    pub fn called_tools(&self) -> bool {
        self.reply
            .as_ref()
            .is_some_and(|r| !r.tool_calls.is_empty())
    }
}

/// The response header that says how many of the oldest messages were
/// dropped to fit the context window (present only when some were).
pub const TRUNCATED_MESSAGES_HEADER: &str = "x-hypura-truncated-messages";

/// One request running on a model.
pub struct Generation {
    events: EventStream,
    /// Messages dropped from the conversation to fit the context window
    /// (sent as [`TRUNCATED_MESSAGES_HEADER`]).
    pub truncated_messages: usize,
    /// Holds the model until the response is over.
    lease: BackendLease,
    tools: Option<Tools>,
    filter: Option<ToolStream>,
    /// Calls another server parsed ([`BackendEvent::ToolCalls`]).
    called: Vec<ToolCall>,
    text: String,
    /// Log-probabilities received and not yet taken.
    logprobs: Vec<TokenLogprobs>,
    model: String,
    arrived: Instant,
    queued_for: Option<Duration>,
    time_to_first_token: Option<Duration>,
    /// Set once [`finish`] recorded this generation.
    recorded: bool,
    /// Its span: the current one when it started ([`infer`]'s); it ends
    /// when the generation is dropped.
    span: Span,
    /// Hears of its end.
    observer: Arc<dyn Observer>,
}

/// The bytes of text a prompt will be tokenized from (messages: their
/// contents; the template adds a few per message).
fn prompt_bytes(prompt: &Prompt) -> usize {
    match prompt {
        Prompt::Text { text } => text.len(),
        Prompt::Messages { messages, .. } => messages.iter().map(|m| m.content.len()).sum(),
        Prompt::Load | Prompt::Tokens(_) => 0,
    }
}

impl Generation {
    /// Submits `request` to the leased backend.
    pub async fn start(
        lease: BackendLease,
        request: &InferRequest,
        tools: Option<Tools>,
        arrived: Instant,
        observer: Arc<dyn Observer>,
    ) -> Result<Generation, ApiError> {
        let slot = lease.backend.status().context_length;
        let asked = request.backend.params.num_ctx.map_or(slot, |n| n.min(slot));
        // The caller's cap (a key's max_context) narrows the window on every
        // route: the prompt is fitted to it, and the reply gets what it
        // leaves (the backend caps max_tokens to its num_ctx, as to its slot).
        let cap = observer.context_cap().filter(|&cap| cap < asked);
        let window = cap.unwrap_or(asked);
        validation::check_prompt_bytes(prompt_bytes(&request.backend.prompt), window)?;
        let mut backend_request = request.backend.clone();
        if let Some(cap) = cap {
            let params = &mut backend_request.params;
            params.num_ctx = Some(cap);
            // A model another server runs counts its prompt over there: its
            // reply at least stays within the cap.
            if !lease.backend.counts_tokens() {
                params.max_tokens = Some(params.max_tokens.map_or(cap, |m| m.min(cap)));
            }
        }
        // A model another server runs is fitted to its context over there.
        let truncated_messages = if lease.backend.counts_tokens() {
            truncate::fit(
                lease.backend.as_ref(),
                &mut backend_request,
                window,
                request.truncate,
            )?
        } else {
            0
        };
        if truncated_messages > 0 {
            tracing::info!(
                truncated_messages,
                window,
                "dropped the {truncated_messages} oldest messages to fit the context window"
            );
        }
        let events = lease
            .backend
            .generate(backend_request)
            .await
            .inspect_err(|e| {
                if let BackendError::Busy(_) = e {
                    observer.queue_full(&request.name.display);
                }
            })?;
        Ok(Generation {
            events,
            truncated_messages,
            lease,
            filter: tools.as_ref().map(Tools::stream),
            tools,
            called: Vec::new(),
            text: String::new(),
            logprobs: Vec::new(),
            model: request.requested.clone(),
            arrived,
            queued_for: None,
            time_to_first_token: None,
            recorded: false,
            span: Span::current(),
            observer,
        })
    }

    /// The next event, the tool-call filter applied: text it holds back (a
    /// call may be starting) is not yielded, empty pieces are skipped, and
    /// `Done` carries what it held, parsed. `None` after `Done` or `Error`.
    pub async fn next(&mut self) -> Option<InferEvent> {
        loop {
            return Some(match self.next_unfiltered().await? {
                InferEvent::Text(text) => {
                    let text = match self.filter.as_mut() {
                        Some(filter) => filter.push(&text),
                        None => text,
                    };
                    if text.is_empty() {
                        continue;
                    }
                    InferEvent::Text(text)
                }
                InferEvent::Done(mut outcome) => {
                    if let Some(filter) = self.filter.take() {
                        outcome.reply = Some(filter.finish());
                    }
                    InferEvent::Done(outcome)
                }
                error => error,
            });
        }
    }

    /// The log-probabilities of the tokens behind the text yielded so far
    /// (and of text the tool filter holds back), not taken before; empty
    /// unless the request asked for them. A streaming dialect takes them
    /// with each `Text`; `Done` carries the rest.
    pub fn take_logprobs(&mut self) -> Vec<TokenLogprobs> {
        std::mem::take(&mut self.logprobs)
    }

    /// Runs to the end: the whole reply (parsed when tools take part).
    pub async fn collect(mut self) -> Result<Outcome, ApiError> {
        while let Some(event) = self.next_unfiltered().await {
            match event {
                InferEvent::Text(_) => {}
                InferEvent::Done(mut outcome) => {
                    if let Some(tools) = &self.tools {
                        outcome.reply = Some(tools.parse(&outcome.text));
                    } else if let Some(reply) = &mut outcome.reply {
                        // Another server's calls: the text is the content.
                        reply.content = outcome.text.clone();
                    }
                    return Ok(*outcome);
                }
                InferEvent::Error(e) => return Err(e),
            }
        }
        Err(ApiError::Internal(
            "generation ended without a result".into(),
        ))
    }

    /// The backend's next event, timings noted and the end recorded.
    async fn next_unfiltered(&mut self) -> Option<InferEvent> {
        if self.recorded {
            return None;
        }
        loop {
            let event = self.events.next().await;
            return Some(match event {
                Some(BackendEvent::Started { queued_for }) => {
                    self.queued_for = Some(queued_for);
                    continue;
                }
                Some(BackendEvent::FirstToken) => {
                    self.time_to_first_token = Some(self.arrived.elapsed());
                    continue;
                }
                Some(BackendEvent::Text(text)) => {
                    self.text.push_str(&text);
                    InferEvent::Text(text)
                }
                Some(BackendEvent::Logprobs(logprobs)) => {
                    self.logprobs.extend(logprobs);
                    continue;
                }
                Some(BackendEvent::ToolCalls(calls)) => {
                    self.called.extend(calls.into_iter().map(|c| ToolCall {
                        name: c.name,
                        arguments: c.arguments,
                        id: c.id,
                        cut_arguments: None,
                    }));
                    continue;
                }
                Some(BackendEvent::Done(finished)) => {
                    let outcome = self.outcome(finished);
                    self.record_usage(
                        Ended::Finished(outcome.finished.finish_reason),
                        Some(&outcome.finished),
                    );
                    InferEvent::Done(Box::new(outcome))
                }
                Some(BackendEvent::Error(e)) => {
                    self.record(Ended::Failed);
                    InferEvent::Error(e.into())
                }
                None => {
                    self.record(Ended::Failed);
                    InferEvent::Error(ApiError::Internal(
                        "the engine dropped the request without an answer".into(),
                    ))
                }
            });
        }
    }

    fn outcome(&mut self, finished: Finished) -> Outcome {
        // Another server's calls: streamed, the text was all yielded.
        let reply = (!self.called.is_empty()).then(|| ParsedReply {
            content: String::new(),
            tool_calls: std::mem::take(&mut self.called),
        });
        Outcome {
            finished,
            reply,
            text: self.text.clone(),
            logprobs: self.take_logprobs(),
            load_duration: self.lease.load_duration,
            total_duration: self.arrived.elapsed(),
            queued_for: self.queued_for,
            time_to_first_token: self.time_to_first_token,
        }
    }

    fn record(&mut self, ended: Ended) {
        self.record_usage(ended, None);
    }

    fn record_usage(&mut self, ended: Ended, finished: Option<&Finished>) {
        self.recorded = true;
        finish(
            self.observer.as_ref(),
            &GenerationRecord {
                model: &self.model,
                ended,
                finished,
                span: &self.span,
                load: self.lease.load_duration,
                queued: self.queued_for,
                time_to_first_token: self.time_to_first_token,
                total: self.arrived.elapsed(),
            },
        );
    }
}

impl Drop for Generation {
    /// A generation dropped before its end was cancelled (client gone): it
    /// is recorded too.
    fn drop(&mut self) {
        if !self.recorded {
            self.record(Ended::Cancelled);
        }
    }
}

/// How a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Finished(FinishReason),
    /// The backend failed.
    Failed,
    /// Dropped before its end (client gone).
    Cancelled,
}

/// What [`finish`] records of one generation.
#[derive(Debug)]
pub struct GenerationRecord<'a> {
    /// The model as the client named it.
    pub model: &'a str,
    pub ended: Ended,
    /// The backend's account of a generation that finished (tokens, prefill
    /// and decode time); `None` when it failed or was cancelled.
    pub finished: Option<&'a Finished>,
    /// The generation's span ([`Observer::generation_span`]).
    pub span: &'a Span,
    pub load: Duration,
    /// Time in the model's queue (`None`: it never started).
    pub queued: Option<Duration>,
    /// From arrival to the first token (`None`: no token came).
    pub time_to_first_token: Option<Duration>,
    /// From arrival to the end.
    pub total: Duration,
}

/// Records the end of a generation: the one place every generation, of
/// every dialect, ends (the observer hears of it here).
pub fn finish(observer: &dyn Observer, record: &GenerationRecord<'_>) {
    observer.generation_ended(record);
    // Dropped (client gone), a generation ends outside its request's span.
    let _in = record.span.enter();
    let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1e3);
    tracing::info!(
        target: "hypura::generation",
        model = record.model,
        ended = ?record.ended,
        load_ms = record.load.as_secs_f64() * 1e3,
        queued_ms = ?ms(record.queued),
        ttft_ms = ?ms(record.time_to_first_token),
        total_ms = record.total.as_secs_f64() * 1e3,
        prompt_tokens = record.finished.map(|f| f.prompt_tokens),
        generated_tokens = record.finished.map(|f| f.generated_tokens),
        "generation ended"
    );
}

/// Embeds `request`'s texts: one L2-normalised vector each (cut to the first
/// `dimensions` when asked), the tokens they took, and the load time.
pub async fn embed(
    inference: &Inference,
    request: EmbedRequest,
) -> Result<(Vec<Vec<f32>>, usize, Duration), ApiError> {
    let observer = inference.observer.as_ref();
    let span = observer.embeddings_span(&request);
    let result = embed_texts(inference, request)
        .instrument(span.clone())
        .await;
    match &result {
        Ok((vectors, tokens, load)) => observer.embedded(&span, vectors, *tokens, *load),
        Err(e) => observer.failed(&span, e),
    }
    result
}

/// [`embed`] in its span.
async fn embed_texts(
    inference: &Inference,
    request: EmbedRequest,
) -> Result<(Vec<Vec<f32>>, usize, Duration), ApiError> {
    validation::check_embed_inputs(&request.batch.inputs)?;
    let models = inference.models.as_ref();
    let lease = match models.find(&request.name) {
        Some(Found::Remote(lease)) => lease,
        _ => {
            let want = LeaseRequest {
                requested: &request.requested,
                name: &request.name,
                keep_alive: request.keep_alive,
                context: None,
            };
            models.lease(want).await?
        }
    };
    inference.observer.model_used(&request.name.display);
    let (mut vectors, tokens) = if request.batch.inputs.is_empty() {
        (Vec::new(), 0)
    } else {
        let output = lease.backend.embed(request.batch).await?;
        (output.vectors, output.prompt_tokens)
    };
    shorten(&mut vectors, request.dimensions)?;
    Ok((vectors, tokens, lease.load_duration))
}

/// Keeps the first `n` dimensions and normalises again.
pub fn shorten(vectors: &mut [Vec<f32>], n: Option<usize>) -> Result<(), ApiError> {
    let Some(n) = n else { return Ok(()) };
    let max = vectors.first().map_or(usize::MAX, Vec::len);
    if n == 0 || n > max {
        return Err(ValidationError::Dimensions { value: n, max }.into());
    }
    for v in vectors.iter_mut() {
        if n < v.len() {
            v.truncate(n);
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            if norm > 0.0 {
                v.iter_mut().for_each(|x| *x /= norm);
            }
        }
    }
    Ok(())
}

/// Outcomes for the dialects' translation tests (feature `testing`: the
/// gateway's unit tests use them too).
#[cfg(any(test, feature = "testing"))]
pub mod testing {
    use std::time::Duration;

    use hypura_chat::tools::{ParsedReply, ToolCall};
    use hypura_chat::ChatMessage;
    use serde_json::{json, Value};

    use super::Outcome;
    use crate::backend::{FinishReason, Finished};
    use crate::request::{InferRequest, Prompt};

    /// The conversation a request renders (panics for other prompts).
    pub fn prompt_messages(infer: &InferRequest) -> &[ChatMessage] {
        match &infer.backend.prompt {
            Prompt::Messages { messages, .. } => messages,
            other => panic!("{other:?}"),
        }
    }

    /// Each SSE event of a stream with named events, as (its `event:` name,
    /// its data), the data's `type` checked against the name.
    pub fn named_sse_events(bytes: &[u8]) -> Vec<(String, Value)> {
        let text = std::str::from_utf8(bytes).unwrap();
        assert!(text.ends_with("\n\n"), "{text:?}");
        text.split_terminator("\n\n")
            .map(|event| {
                let (name, data) = event.split_once('\n').unwrap();
                let name = name.strip_prefix("event: ").unwrap().to_string();
                let data: Value =
                    serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                assert_eq!(data["type"], name.as_str());
                (name, data)
            })
            .collect()
    }

    /// A finished reply of `text` (3 prompt tokens, 2 generated, EOG 9 in the context).
    pub fn outcome(text: &str) -> Outcome {
        Outcome {
            finished: Finished {
                finish_reason: FinishReason::Stop,
                prompt_tokens: 3,
                generated_tokens: 2,
                prompt_eval_tokens: 3,
                prompt_eval_duration: Duration::from_millis(5),
                eval_duration: Duration::from_millis(7),
                context: vec![1, 2, 3, 4, 5, 9],
            },
            reply: None,
            text: text.to_string(),
            logprobs: Vec::new(),
            load_duration: Duration::from_millis(2),
            total_duration: Duration::from_millis(20),
            queued_for: Some(Duration::from_millis(1)),
            time_to_first_token: Some(Duration::from_millis(10)),
        }
    }

    /// A reply that called `get_weather` with `{"city": "Paris"}` after `content`.
    pub fn tool_outcome(content: &str) -> Outcome {
        let mut outcome = outcome("");
        let arguments = json!({"city": "Paris"})
            .as_object()
            .cloned()
            .unwrap_or_default();
        outcome.reply = Some(ParsedReply {
            content: content.to_string(),
            tool_calls: vec![ToolCall {
                name: "get_weather".into(),
                arguments,
                id: Some("call_1".into()),
                cut_arguments: None,
            }],
        });
        outcome
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use futures_util::future::BoxFuture;
    use futures_util::FutureExt;
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::UnboundedReceiverStream;

    use super::*;
    use crate::backend::{
        BackendError, BackendStatus, EmbedOutput, MemoryUse, ModelBackend, ModelFacts, Residency,
        TierBytes,
    };
    use crate::request::{BackendRequest, EmbedBatch, GenerationParams};
    use crate::structured::ToolChoice;
    use crate::validation::ModelName;

    /// A backend that plays back scripted events through a channel the test
    /// keeps, so it can see the stream being dropped.
    struct FakeBackend {
        script: Mutex<Option<Result<Vec<BackendEvent>, BackendError>>>,
        /// The sending half of the last generation's stream.
        sender: Mutex<Option<mpsc::UnboundedSender<BackendEvent>>>,
        /// The last request submitted.
        submitted: Mutex<Option<BackendRequest>>,
    }

    impl FakeBackend {
        fn new(script: Result<Vec<BackendEvent>, BackendError>) -> Arc<FakeBackend> {
            Arc::new(FakeBackend {
                script: Mutex::new(Some(script)),
                sender: Mutex::new(None),
                submitted: Mutex::new(None),
            })
        }

        fn stream_dropped(&self) -> bool {
            let sender = self.sender.lock().unwrap();
            sender.as_ref().is_some_and(|tx| tx.is_closed())
        }
    }

    impl ModelBackend for FakeBackend {
        fn generate(
            &self,
            request: BackendRequest,
        ) -> BoxFuture<'_, Result<EventStream, BackendError>> {
            *self.submitted.lock().unwrap() = Some(request);
            let script = self.script.lock().unwrap().take().unwrap_or(Ok(Vec::new()));
            let result = script.map(|events| {
                let (tx, rx) = mpsc::unbounded_channel();
                for event in events {
                    tx.send(event).unwrap();
                }
                // The sender stays open: the stream ends only with the script's last event.
                *self.sender.lock().unwrap() = Some(tx);
                UnboundedReceiverStream::new(rx).boxed()
            });
            std::future::ready(result).boxed()
        }

        fn embed(&self, _: EmbedBatch) -> BoxFuture<'_, Result<EmbedOutput, BackendError>> {
            std::future::ready(Err(BackendError::Failed("no embeddings".into()))).boxed()
        }

        fn count_tokens(&self, text: &str) -> Result<usize, BackendError> {
            Ok(text.split_whitespace().count())
        }

        fn status(&self) -> BackendStatus {
            BackendStatus {
                context_length: 64,
                active: 0,
                queued: 0,
                parallel: 1,
                decode_tokens_per_second: None,
            }
        }

        fn facts(&self) -> ModelFacts {
            ModelFacts {
                family: "fake".into(),
                parameter_size: "1K".into(),
                quantization: "F32".into(),
                context_length: Some(64),
                template: String::new(),
                capabilities: vec!["completion".into()],
                model_info: serde_json::Map::new(),
                size_bytes: 0,
                modified: std::time::SystemTime::UNIX_EPOCH,
                digest: String::new(),
            }
        }

        fn memory(&self) -> MemoryUse {
            MemoryUse {
                residency: Residency::Full,
                tier_bytes: TierBytes {
                    gpu: 0,
                    ram: 0,
                    stream: 0,
                },
            }
        }

        fn set_residency(&self, _: Residency) -> Result<(), BackendError> {
            Err(BackendError::Invalid("the fake stays where it is".into()))
        }
    }

    fn finished() -> Finished {
        testing::outcome("").finished
    }

    fn request() -> InferRequest {
        let name = ModelName::parse("fake", "model").unwrap();
        let prompt = Prompt::Text { text: "hi".into() };
        InferRequest::new("fake", name, prompt, GenerationParams::default())
    }

    async fn start(
        backend: &Arc<FakeBackend>,
        tools: Option<Tools>,
    ) -> Result<Generation, ApiError> {
        let lease = BackendLease {
            backend: Arc::clone(backend) as Arc<dyn ModelBackend>,
            load_duration: Duration::from_millis(3),
        };
        let observer = Arc::new(crate::observer::Unobserved);
        Generation::start(lease, &request(), tools, Instant::now(), observer).await
    }

    fn text(s: &str) -> BackendEvent {
        BackendEvent::Text(s.into())
    }

    fn started() -> BackendEvent {
        BackendEvent::Started {
            queued_for: Duration::from_millis(4),
        }
    }

    #[tokio::test]
    async fn events_come_in_order_and_done_carries_the_usage() {
        let script = vec![
            started(),
            BackendEvent::FirstToken,
            text("Hel"),
            text("lo"),
            BackendEvent::Done(finished()),
        ];
        let backend = FakeBackend::new(Ok(script));
        let mut generation = start(&backend, None).await.unwrap();
        let mut texts = Vec::new();
        let outcome = loop {
            match generation.next().await.unwrap() {
                InferEvent::Text(t) => texts.push(t),
                InferEvent::Done(outcome) => break outcome,
                InferEvent::Error(e) => panic!("{e}"),
            }
        };
        assert_eq!(texts, ["Hel", "lo"]);
        assert!(generation.next().await.is_none(), "nothing after Done");
        assert_eq!(outcome.text, "Hello");
        assert_eq!(outcome.finished, finished());
        assert_eq!(outcome.queued_for, Some(Duration::from_millis(4)));
        assert!(outcome.time_to_first_token.is_some());
        assert_eq!(outcome.load_duration, Duration::from_millis(3));
        assert!(outcome.reply.is_none());
        let submitted = backend.submitted.lock().unwrap().clone().unwrap();
        assert_eq!(submitted, request().backend);
    }

    #[tokio::test]
    async fn dropping_the_generation_cancels_the_backend_stream() {
        let backend = FakeBackend::new(Ok(vec![started(), BackendEvent::FirstToken, text("a")]));
        let mut generation = start(&backend, None).await.unwrap();
        assert!(matches!(generation.next().await, Some(InferEvent::Text(t)) if t == "a"));
        assert!(!backend.stream_dropped());
        drop(generation);
        assert!(
            backend.stream_dropped(),
            "the backend must see the cancellation"
        );
    }

    #[tokio::test]
    async fn an_error_before_submission_is_the_backends_status() {
        let backend = FakeBackend::new(Err(BackendError::Busy("queue full".into())));
        let e = start(&backend, None).await.err().unwrap();
        assert!(
            matches!(&e, ApiError::Unavailable(m) if m == "queue full"),
            "{e:?}"
        );
        let backend = FakeBackend::new(Err(BackendError::Invalid("too long".into())));
        let e = start(&backend, None).await.err().unwrap();
        assert_eq!(e.status(), axum::http::StatusCode::BAD_REQUEST);
    }

    #[tokio::test]
    async fn an_error_after_the_first_token_ends_the_stream() {
        let script = vec![
            started(),
            BackendEvent::FirstToken,
            text("par"),
            BackendEvent::Error(BackendError::Failed("decode failed".into())),
        ];
        let backend = FakeBackend::new(Ok(script));
        let mut generation = start(&backend, None).await.unwrap();
        assert!(matches!(generation.next().await, Some(InferEvent::Text(t)) if t == "par"));
        match generation.next().await {
            Some(InferEvent::Error(ApiError::Internal(m))) => assert_eq!(m, "decode failed"),
            other => panic!("{other:?}"),
        }
        assert!(generation.next().await.is_none());
    }

    #[tokio::test]
    async fn a_backend_that_ends_without_done_is_an_error() {
        let backend = FakeBackend::new(Ok(vec![started()]));
        let mut generation = start(&backend, None).await.unwrap();
        // The scripted sender closes with the backend's stream state.
        backend.sender.lock().unwrap().take();
        assert!(matches!(
            generation.next().await,
            Some(InferEvent::Error(ApiError::Internal(_)))
        ));
    }

    #[tokio::test]
    async fn collect_returns_the_whole_text() {
        let script = vec![
            started(),
            BackendEvent::FirstToken,
            text("a"),
            text("b"),
            BackendEvent::Done(finished()),
        ];
        let backend = FakeBackend::new(Ok(script));
        let outcome = start(&backend, None)
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        assert_eq!(outcome.text, "ab");
        assert_eq!(outcome.finished.generated_tokens, 2);
    }

    fn logprobs(token: i32) -> BackendEvent {
        let logprob = crate::backend::Logprob {
            token,
            bytes: vec![b'a'],
            logprob: -1.0,
        };
        BackendEvent::Logprobs(vec![TokenLogprobs {
            sampled: logprob,
            top: vec![],
        }])
    }

    fn ids(logprobs: &[TokenLogprobs]) -> Vec<i32> {
        logprobs.iter().map(|l| l.sampled.token).collect()
    }

    #[tokio::test]
    async fn logprobs_go_with_the_text_they_precede_and_the_rest_with_done() {
        let script = vec![
            started(),
            BackendEvent::FirstToken,
            logprobs(1),
            text("a"),
            logprobs(2),
            BackendEvent::Done(finished()),
        ];
        let backend = FakeBackend::new(Ok(script.clone()));
        let mut generation = start(&backend, None).await.unwrap();
        assert!(matches!(generation.next().await, Some(InferEvent::Text(t)) if t == "a"));
        assert_eq!(ids(&generation.take_logprobs()), [1]);
        assert!(generation.take_logprobs().is_empty(), "taken once");
        match generation.next().await {
            Some(InferEvent::Done(outcome)) => assert_eq!(ids(&outcome.logprobs), [2]),
            other => panic!("{other:?}"),
        }

        let backend = FakeBackend::new(Ok(script));
        let outcome = start(&backend, None)
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        assert_eq!(ids(&outcome.logprobs), [1, 2]);
    }

    fn hermes_tools() -> Tools {
        let tool = serde_json::json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}});
        let template = "{% if tools %}<tool_call>{% endif %}";
        prepare_tools(Some(&[tool]), &ToolChoice::Auto, true, Some(template))
            .unwrap()
            .unwrap()
    }

    #[tokio::test]
    async fn tool_calls_are_held_back_and_parsed_at_the_end() {
        let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let script = vec![
            started(),
            BackendEvent::FirstToken,
            text("Let me check. "),
            text(call),
            BackendEvent::Done(finished()),
        ];
        let backend = FakeBackend::new(Ok(script.clone()));
        let mut generation = start(&backend, Some(hermes_tools())).await.unwrap();
        let mut texts = String::new();
        let outcome = loop {
            match generation.next().await.unwrap() {
                InferEvent::Text(t) => texts.push_str(&t),
                InferEvent::Done(outcome) => break outcome,
                InferEvent::Error(e) => panic!("{e}"),
            }
        };
        assert!(!texts.contains("<tool_call>"), "{texts}");
        let reply = outcome.reply.unwrap();
        assert_eq!(reply.tool_calls.len(), 1);
        assert_eq!(reply.tool_calls[0].name, "get_weather");
        assert_eq!(reply.tool_calls[0].arguments["city"], "Paris");

        let backend = FakeBackend::new(Ok(script));
        let generation = start(&backend, Some(hermes_tools())).await.unwrap();
        let outcome = generation.collect().await.unwrap();
        let reply = outcome.reply.unwrap();
        assert_eq!(reply.content, "Let me check.");
        assert_eq!(reply.tool_calls[0].name, "get_weather");
    }
}
