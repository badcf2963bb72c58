//! Ollama's API (`/`, `/api/*`), as its own docs and clients define it.
//!
//! Generation streams NDJSON (`application/x-ndjson`, one object a line) by
//! default; `stream: false` answers one object, the final chunk with all the
//! text. Durations are integer nanoseconds, timestamps RFC 3339 with
//! nanoseconds, and every `model` field echoes the request's model string.
use std::convert::Infallible;
use std::time::{Duration, Instant, SystemTime};

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, SecondsFormat, Utc};
use futures_util::StreamExt;
use hypura_chat::ChatMessage;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use utoipa::ToSchema;

use crate::api::dialect::ollama::{ollama_format, OllamaOptions};
use crate::api::logprobs::{self, TokenLogprob};
use crate::core::backend::{ModelFacts, TierBytes, TokenLogprobs};
use crate::core::error::{ApiError, OllamaError};
use crate::core::infer::{self, infer, Answer, Generation, InferEvent, Outcome};
use crate::core::models::RunningModel;
use crate::core::request::{
    EmbedBatch, EmbedInput, EmbedRequest, EmbedText, GenerationParams, InferRequest, Prompt,
    ToolRequest,
};
use crate::core::structured::{self, ToolChoice};
use crate::core::validation::{self, parse_json, KeepAlive, ModelName, ValidationError};
use crate::server::body_bytes;
use crate::state::AppState;

/// The version reported to clients: dotted digits only (Open WebUI parses it).
pub const OLLAMA_VERSION: &str = "0.12.0";

type Result<T> = std::result::Result<T, OllamaError>;

// ---------------------------------------------------------------------------------------------
// Types
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Serialize, ToSchema)]
pub struct VersionResponse {
    /// hypura's Ollama API level, `X.Y.Z`.
    #[schema(example = "0.12.0")]
    pub version: String,
}

/// What a model is, as Ollama describes it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelDetails {
    pub parent_model: String,
    #[schema(example = "gguf")]
    pub format: String,
    #[schema(example = "llama")]
    pub family: String,
    pub families: Vec<String>,
    #[schema(example = "135M")]
    pub parameter_size: String,
    #[schema(example = "Q4_1")]
    pub quantization_level: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TagModel {
    /// `name:tag`.
    #[schema(example = "SmolLM2-135M-Instruct.Q4_1:latest")]
    pub name: String,
    /// Same as `name`.
    pub model: String,
    pub modified_at: String,
    /// File size in bytes.
    pub size: u64,
    pub digest: String,
    pub details: ModelDetails,
    /// hypura: why the model can never run on this server (it needs more
    /// memory than the budget); absent when it can.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TagsResponse {
    pub models: Vec<TagModel>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PsModel {
    pub name: String,
    pub model: String,
    /// Bytes of weights in memory.
    pub size: u64,
    pub digest: String,
    pub details: ModelDetails,
    /// When it unloads if idle (far future when kept forever).
    pub expires_at: String,
    /// Bytes of weights in GPU memory.
    pub size_vram: u64,
    /// Context per sequence, in tokens.
    pub context_length: u32,
    /// hypura: `full`, `partial` or `streaming` (see the global budget).
    pub residency: String,
    /// hypura: bytes of weights per tier (`stream` = left on disk, read on demand).
    pub tier_bytes: TierBytes,
    /// hypura: the engine's slots now.
    pub slots: PsSlots,
    /// hypura: the upstream server it is loaded on (absent: this one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// Requests decoding (`active`, at most `parallel`) and waiting (`queued`).
#[derive(Debug, Serialize, ToSchema)]
pub struct PsSlots {
    pub active: usize,
    pub queued: usize,
    pub parallel: u32,
    /// hypura: recent decode rate of finished generations, in tokens per
    /// second (absent before the first one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode_tokens_per_second: Option<f64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PsResponse {
    pub models: Vec<PsModel>,
    /// hypura: requests waiting for a model: held at its fair gate (its slots busy) or waiting for room in the memory budget, per model and in total.
    pub waiting: crate::metrics::status::BudgetWaiting,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct ShowRequest {
    pub model: Option<String>,
    /// Legacy spelling of `model` (OpenClaw sends it).
    pub name: Option<String>,
    /// Also list the model's tensors (`tensors`).
    pub verbose: Option<bool>,
}

/// One tensor of a model's GGUF, as `/api/show` with `verbose` lists it.
#[derive(Debug, Serialize, ToSchema)]
pub struct ShowTensor {
    #[schema(example = "blk.0.attn_q.weight")]
    pub name: String,
    /// ggml's type name, upper case as Ollama writes it (`Q4_K`, `F32`).
    #[schema(example = "Q4_1")]
    pub r#type: String,
    /// Elements per dimension, innermost first.
    pub shape: Vec<u64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ShowResponse {
    pub modelfile: String,
    pub parameters: String,
    /// The chat template (Jinja, from the GGUF).
    pub template: String,
    /// The system prompt of a model made by `/api/create`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    pub details: ModelDetails,
    /// GGUF metadata; always has `<architecture>.context_length` when the file states it.
    #[schema(value_type = Object)]
    pub model_info: Map<String, Value>,
    #[schema(example = json!(["completion"]))]
    pub capabilities: Vec<String>,
    pub modified_at: String,
    /// With `verbose`: the tensors of a model whose file is here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensors: Option<Vec<ShowTensor>>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct GenerateRequest {
    #[schema(example = "SmolLM2-135M-Instruct.Q4_1:latest")]
    pub model: String,
    /// Empty or absent: load the model (or unload it with `keep_alive: 0`).
    #[schema(example = "Why is the sky blue?")]
    pub prompt: Option<String>,
    /// Fill-in-the-middle suffix (not supported yet: must be empty).
    pub suffix: Option<String>,
    pub system: Option<String>,
    /// A Jinja chat template overriding the model's.
    pub template: Option<String>,
    /// Send the prompt as is, without a template; no `context` is returned.
    pub raw: Option<bool>,
    /// Tokens returned by a previous call, to continue that conversation.
    pub context: Option<Vec<i32>>,
    pub images: Option<Vec<String>>,
    /// `"json"` (any JSON object) or a JSON Schema: the reply is constrained to it by a grammar.
    #[schema(value_type = Object)]
    pub format: Option<Value>,
    pub options: Option<OllamaOptions>,
    /// Default true.
    pub stream: Option<bool>,
    /// Seconds or a duration (`"5m"`); 0 unloads after the request, negative keeps loaded.
    #[schema(value_type = Object)]
    pub keep_alive: Option<Value>,
    /// Ask thinking models to think (`true`/`false`, or `"low"|"medium"|"high"`).
    #[schema(value_type = Object)]
    pub think: Option<Value>,
    /// Return each generated token's log-probability (chunks' `logprobs`).
    pub logprobs: Option<bool>,
    /// With `logprobs`: also this many most likely tokens per position, 0-20.
    #[serde(
        default,
        deserialize_with = "crate::core::validation::integral::option"
    )]
    pub top_logprobs: Option<i64>,
    /// hypura (llama-server's field): false reads the whole prompt and keeps
    /// no KV of it for a later request. Default true.
    pub cache_prompt: Option<bool>,
}

/// One chat message, Ollama style.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct Message {
    #[schema(example = "user")]
    pub role: String,
    #[serde(default)]
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Object)]
    pub tool_calls: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct ChatRequest {
    pub model: String,
    /// Empty or absent: load the model (or unload it with `keep_alive: 0`).
    pub messages: Option<Vec<Message>>,
    /// OpenAI-style function tools; calls come back in `message.tool_calls`.
    /// Models whose chat template cannot describe tools get them in the
    /// system prompt, their replies held to a JSON format by a grammar.
    #[schema(value_type = Vec<Object>)]
    pub tools: Option<Vec<Value>>,
    /// `"json"` or a JSON Schema, as in `/api/generate`.
    #[schema(value_type = Object)]
    pub format: Option<Value>,
    pub options: Option<OllamaOptions>,
    pub stream: Option<bool>,
    #[schema(value_type = Object)]
    pub keep_alive: Option<Value>,
    #[schema(value_type = Object)]
    pub think: Option<Value>,
    /// Drop the oldest messages (system messages and the last turn stay)
    /// when the conversation is too long for the context window (default
    /// true); false makes it a 400. The response's
    /// `x-hypura-truncated-messages` header counts the messages dropped.
    pub truncate: Option<bool>,
    /// Return each generated token's log-probability (chunks' `logprobs`).
    pub logprobs: Option<bool>,
    /// With `logprobs`: also this many most likely tokens per position, 0-20.
    #[serde(
        default,
        deserialize_with = "crate::core::validation::integral::option"
    )]
    pub top_logprobs: Option<i64>,
    /// hypura (llama-server's field): false reads the whole prompt and keeps
    /// no KV of it for a later request. Default true.
    pub cache_prompt: Option<bool>,
}

/// Fields of the last chunk (`done: true`).
#[derive(Debug, Serialize, ToSchema)]
pub struct FinalStats {
    /// `stop`, `length`, `load` or `unload`.
    pub done_reason: String,
    /// Nanoseconds from the request's arrival to its end.
    pub total_duration: u64,
    pub load_duration: u64,
    pub prompt_eval_count: usize,
    pub prompt_eval_duration: u64,
    pub eval_count: usize,
    pub eval_duration: u64,
}

/// One `/api/generate` chunk (the last one has `done: true` and the stats).
#[derive(Debug, Serialize, ToSchema)]
pub struct GenerateChunk {
    pub model: String,
    pub created_at: String,
    pub response: String,
    pub done: bool,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub stats: Option<FinalStats>,
    /// Prompt and reply tokens, to continue with (absent for `raw`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<Vec<i32>>,
    /// With `logprobs: true`: this chunk's tokens (with `stream: false`, all).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<TokenLogprob>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ReplyMessage {
    pub role: String,
    pub content: String,
    /// `[{"function": {"index", "name", "arguments": {…}}}]`, when the model called tools.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub tool_calls: Option<Vec<Value>>,
}

/// One `/api/chat` chunk.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChatChunk {
    pub model: String,
    pub created_at: String,
    pub message: ReplyMessage,
    pub done: bool,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub stats: Option<FinalStats>,
    /// With `logprobs: true`: this chunk's tokens (with `stream: false`, all).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<TokenLogprob>>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = EmbedRequest)]
pub struct OllamaEmbedRequest {
    pub model: String,
    #[schema(value_type = Object)]
    pub input: Option<EmbedInput>,
    /// Cut inputs longer than the context (default true); false makes them a 400.
    pub truncate: Option<bool>,
    /// Keep the first N dimensions (re-normalised).
    #[serde(
        default,
        deserialize_with = "crate::core::validation::integral::option"
    )]
    pub dimensions: Option<usize>,
    pub options: Option<OllamaOptions>,
    #[schema(value_type = Object)]
    pub keep_alive: Option<Value>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EmbedResponse {
    pub model: String,
    /// One L2-normalised vector per input.
    pub embeddings: Vec<Vec<f32>>,
    pub total_duration: u64,
    pub load_duration: u64,
    pub prompt_eval_count: usize,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct EmbeddingsRequest {
    pub model: String,
    pub prompt: Option<String>,
    pub options: Option<OllamaOptions>,
    #[schema(value_type = Object)]
    pub keep_alive: Option<Value>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EmbeddingsResponse {
    pub embedding: Vec<f32>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct DeleteRequest {
    pub model: Option<String>,
    pub name: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct CopyRequest {
    pub source: String,
    pub destination: String,
}

// ---------------------------------------------------------------------------------------------
// Translation in: bodies → core requests
// ---------------------------------------------------------------------------------------------

pub fn rfc3339(t: SystemTime) -> String {
    DateTime::<Utc>::from(t).to_rfc3339_opts(SecondsFormat::Nanos, true)
}

fn now() -> String {
    rfc3339(SystemTime::now())
}

pub fn details(facts: &ModelFacts) -> ModelDetails {
    ModelDetails {
        parent_model: String::new(),
        format: "gguf".into(),
        family: facts.family.clone(),
        families: vec![facts.family.clone()],
        parameter_size: facts.parameter_size.clone(),
        quantization_level: facts.quantization.clone(),
    }
}

/// The model name of a request with both `model` and legacy `name`.
fn either_name(model: Option<&str>, name: Option<&str>) -> Result<(String, ModelName)> {
    let raw = model
        .filter(|m| !m.is_empty())
        .or(name)
        .unwrap_or_default()
        .to_string();
    let parsed = ModelName::parse(&raw, "model")?;
    Ok((raw, parsed))
}

fn keep_alive(value: Option<&Value>) -> Result<Option<KeepAlive>> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(v) => Ok(Some(KeepAlive::from_json(v)?)),
    }
}

fn params(options: Option<&OllamaOptions>) -> Result<GenerationParams> {
    Ok(options.cloned().unwrap_or_default().to_params()?)
}

/// `logprobs` and `top_logprobs` (checked even without `logprobs`, as Ollama does).
fn asked_logprobs(wanted: Option<bool>, top: Option<i64>) -> Result<Option<u32>> {
    Ok(validation::logprobs(
        wanted.unwrap_or(false),
        "top_logprobs",
        top,
    )?)
}

/// `think`: true or a level asks for thinking, false turns it off.
fn think(value: Option<&Value>) -> Result<Option<bool>> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(Value::String(level)) if ["low", "medium", "high"].contains(&level.as_str()) => {
            Ok(Some(true))
        }
        Some(other) => Err(ApiError::from(ValidationError::InvalidThink(other.to_string())).into()),
    }
}

fn no_images(images: Option<&Vec<String>>, requested: &str) -> Result<()> {
    if images.is_some_and(|i| !i.is_empty()) {
        return Err(ApiError::from(ValidationError::Unsupported {
            model: requested.to_string(),
            capability: "images",
        })
        .into());
    }
    Ok(())
}

/// `/api/generate` → an [`InferRequest`]: the prompt raw, or as a user turn
/// after `system` for the chat template (or the `template` override), after
/// the `context` of an earlier reply; no prompt and no context loads the model.
pub fn generate_request(request: &GenerateRequest) -> Result<InferRequest> {
    let name = ModelName::parse(&request.model, "model")?;
    let keep_alive = keep_alive(request.keep_alive.as_ref())?;
    let constraint = ollama_format(request.format.as_ref())?;
    no_images(request.images.as_ref(), &request.model)?;
    if request.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::from(ValidationError::NotSupportedYet(
            "suffix (fill-in-the-middle) is not supported yet",
        ))
        .into());
    }
    let mut params = params(request.options.as_ref())?;
    params.constraint = constraint;
    params.sampling.top_logprobs = asked_logprobs(request.logprobs, request.top_logprobs)?;
    params.skip_prompt_cache = request.cache_prompt == Some(false);
    let text = request.prompt.clone().unwrap_or_default();
    let context = request.context.clone().unwrap_or_default();
    let prompt = if text.is_empty() && context.is_empty() {
        Prompt::Load
    } else if request.raw.unwrap_or(false) {
        Prompt::Text { text }
    } else {
        let mut messages = Vec::new();
        if let Some(system) = &request.system {
            messages.push(ChatMessage::new("system", system.as_str()));
        }
        messages.push(ChatMessage::new("user", text));
        Prompt::Messages {
            messages,
            tools: None,
            template_override: request.template.clone(),
            template_extra: Map::new(),
        }
    };
    let mut infer = InferRequest::new(&request.model, name, prompt, params);
    infer.backend.context = context;
    infer.keep_alive = keep_alive;
    infer.think = think(request.think.as_ref())?;
    Ok(infer)
}

/// `/api/chat` → an [`InferRequest`]; no messages loads the model.
pub fn chat_request(request: &ChatRequest) -> Result<InferRequest> {
    let name = ModelName::parse(&request.model, "model")?;
    let keep_alive = keep_alive(request.keep_alive.as_ref())?;
    let mut params = params(request.options.as_ref())?;
    params.constraint = ollama_format(request.format.as_ref())?;
    params.sampling.top_logprobs = asked_logprobs(request.logprobs, request.top_logprobs)?;
    params.skip_prompt_cache = request.cache_prompt == Some(false);
    let messages = request.messages.as_deref().unwrap_or_default();
    let prompt = if messages.is_empty() {
        Prompt::Load
    } else {
        Prompt::messages(chat_messages(messages, &request.model)?)
    };
    let mut infer = InferRequest::new(&request.model, name, prompt, params);
    infer.tools = request.tools.clone().map(|definitions| ToolRequest {
        definitions,
        choice: ToolChoice::Auto,
        parallel: true,
    });
    infer.keep_alive = keep_alive;
    infer.think = think(request.think.as_ref())?;
    infer.truncate = request.truncate.unwrap_or(true);
    Ok(infer)
}

/// Converts Ollama messages for the chat template.
fn chat_messages(messages: &[Message], requested: &str) -> Result<Vec<ChatMessage>> {
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            validation::check_role(i, &m.role, validation::OLLAMA_ROLES).map_err(ApiError::from)?;
            no_images(m.images.as_ref(), requested)?;
            let mut message = ChatMessage::new(m.role.as_str(), m.content.as_str());
            message.tool_calls = structured::ollama_input_tool_calls(m.tool_calls.as_ref());
            message.name = m.tool_name.clone();
            Ok(message)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Translation out: events → NDJSON chunks
// ---------------------------------------------------------------------------------------------

fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}

/// The statistics of the final chunk.
pub fn final_stats(outcome: &Outcome) -> FinalStats {
    let f = &outcome.finished;
    FinalStats {
        done_reason: f.finish_reason.as_str().to_string(),
        total_duration: nanos(outcome.total_duration),
        load_duration: nanos(outcome.load_duration),
        prompt_eval_count: f.prompt_eval_tokens,
        prompt_eval_duration: nanos(f.prompt_eval_duration),
        eval_count: f.generated_tokens,
        eval_duration: nanos(f.eval_duration),
    }
}

fn ndjson_line<T: Serialize>(value: &T) -> Bytes {
    let mut line = serde_json::to_vec(value).unwrap_or_else(|e| {
        serde_json::to_vec(&json!({"error": format!("could not serialize a chunk: {e}")}))
            .unwrap_or_default()
    });
    line.push(b'\n');
    Bytes::from(line)
}

/// A chunk of either generation route.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Chunk {
    Generate(GenerateChunk),
    Chat(ChatChunk),
}

impl Chunk {
    /// The chunk with the log-probabilities of its tokens (left out when there are none).
    pub fn with_logprobs(mut self, tokens: &[TokenLogprobs]) -> Chunk {
        let field = match &mut self {
            Chunk::Generate(chunk) => &mut chunk.logprobs,
            Chunk::Chat(chunk) => &mut chunk.logprobs,
        };
        *field = logprobs::ollama(tokens);
        self
    }
}

/// Which route's chunks a stream writes, for the model named as the client did.
#[derive(Clone)]
pub enum Route {
    Generate { model: String, raw: bool },
    Chat { model: String },
}

impl Route {
    fn message(text: String, tool_calls: Vec<Value>) -> ReplyMessage {
        ReplyMessage {
            role: "assistant".into(),
            content: text,
            tool_calls: (!tool_calls.is_empty()).then_some(tool_calls),
        }
    }

    /// A chunk of the route: `stats` and `context` only on the final one.
    fn chunk(
        &self,
        text: String,
        tool_calls: Vec<Value>,
        stats: Option<FinalStats>,
        context: Option<Vec<i32>>,
    ) -> Chunk {
        let done = stats.is_some();
        match self {
            Route::Generate { model, .. } => Chunk::Generate(GenerateChunk {
                model: model.clone(),
                created_at: now(),
                response: text,
                done,
                stats,
                context,
                logprobs: None,
            }),
            Route::Chat { model } => Chunk::Chat(ChatChunk {
                model: model.clone(),
                created_at: now(),
                message: Self::message(text, tool_calls),
                done,
                stats,
                logprobs: None,
            }),
        }
    }

    /// An intermediate chunk of text (or, on `/api/chat`, of whole tool calls).
    pub fn text_chunk(&self, text: String, tool_calls: Vec<Value>) -> Chunk {
        self.chunk(text, tool_calls, None, None)
    }

    /// The final chunk; `text` is empty and `tool_calls` too when streaming
    /// (they were sent already).
    pub fn final_chunk(&self, text: String, tool_calls: Vec<Value>, outcome: &Outcome) -> Chunk {
        let context = match self {
            Route::Generate { raw: false, .. } => Some(outcome.finished.context.clone()),
            _ => None,
        };
        self.chunk(text, tool_calls, Some(final_stats(outcome)), context)
            .with_logprobs(&outcome.logprobs)
    }

    /// The one object answering a request without a prompt.
    pub fn loaded_chunk(&self, done_reason: &str, took: Duration) -> Chunk {
        let stats = FinalStats {
            done_reason: done_reason.into(),
            total_duration: nanos(took),
            load_duration: nanos(took),
            prompt_eval_count: 0,
            prompt_eval_duration: 0,
            eval_count: 0,
            eval_duration: 0,
        };
        self.chunk(String::new(), Vec::new(), Some(stats), None)
    }

    /// The chunks a streamed reply ends with: what the tool filter held
    /// back (text, then the calls whole), then the final chunk.
    pub fn last_chunks(&self, outcome: &Outcome) -> Vec<Chunk> {
        let mut chunks = Vec::new();
        if let Some(reply) = &outcome.reply {
            if !reply.content.is_empty() {
                chunks.push(self.text_chunk(reply.content.clone(), Vec::new()));
            }
            if !reply.tool_calls.is_empty() {
                let calls = structured::ollama_tool_calls(&reply.tool_calls);
                chunks.push(self.text_chunk(String::new(), calls));
            }
        }
        chunks.push(self.final_chunk(String::new(), Vec::new(), outcome));
        chunks
    }

    /// The one object of a reply with `stream: false`.
    pub fn whole(&self, outcome: &Outcome) -> Chunk {
        let (text, calls) = match &outcome.reply {
            Some(reply) => (
                reply.content.clone(),
                structured::ollama_tool_calls(&reply.tool_calls),
            ),
            None => (outcome.text.clone(), Vec::new()),
        };
        self.final_chunk(text, calls, outcome)
    }
}

fn ndjson_response(body: Body) -> Response {
    ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response()
}

/// Streams a generation as NDJSON; a failure mid-stream is one `{"error"}` line.
fn stream(generation: Generation, route: Route) -> Response {
    let start = Some((generation, route));
    let chunks = futures_util::stream::unfold(start, |state| async move {
        let (mut generation, route) = state?;
        match generation.next().await? {
            InferEvent::Text(text) => {
                let chunk = route
                    .text_chunk(text, Vec::new())
                    .with_logprobs(&generation.take_logprobs());
                Some((ndjson_line(&chunk), Some((generation, route))))
            }
            InferEvent::Done(outcome) => {
                let lines: Vec<u8> = route
                    .last_chunks(&outcome)
                    .iter()
                    .flat_map(|c| ndjson_line(c).to_vec())
                    .collect();
                Some((Bytes::from(lines), None))
            }
            InferEvent::Error(e) => Some((ndjson_line(&json!({"error": e.to_string()})), None)),
        }
    });
    ndjson_response(Body::from_stream(chunks.map(Ok::<_, Infallible>)))
}

/// Runs a request through [`infer`] and answers as the route does: NDJSON,
/// one object with `stream: false`, one object for a load or unload.
async fn respond(
    state: &AppState,
    request: InferRequest,
    route: Route,
    streaming: bool,
    arrived: Instant,
) -> Result<Response> {
    let generation = match infer(&state.inference, request, arrived).await? {
        Answer::Loaded { done_reason, took } => {
            return Ok(Json(route.loaded_chunk(done_reason, took)).into_response())
        }
        Answer::Generating(generation) => *generation,
    };
    let truncated = generation.truncated_messages;
    if streaming {
        return Ok(super::with_truncation(stream(generation, route), truncated));
    }
    let outcome = generation.collect().await?;
    let response = (
        [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
        ndjson_line(&route.whole(&outcome)),
    )
        .into_response();
    Ok(super::with_truncation(response, truncated))
}

/// `/api/embed` and `/api/embeddings` → an [`EmbedRequest`].
fn embed_request(
    requested: &str,
    keep_alive_value: Option<&Value>,
    options: Option<&OllamaOptions>,
    texts: Vec<String>,
    truncate: bool,
    dimensions: Option<usize>,
) -> Result<EmbedRequest> {
    let name = ModelName::parse(requested, "model")?;
    let keep_alive = keep_alive(keep_alive_value)?;
    let num_ctx = params(options)?.num_ctx;
    Ok(EmbedRequest {
        requested: requested.to_string(),
        name,
        batch: EmbedBatch {
            inputs: texts.into_iter().map(EmbedText::Text).collect(),
            truncate,
            num_ctx,
        },
        dimensions,
        keep_alive,
    })
}

// ---------------------------------------------------------------------------------------------
// Handlers
// ---------------------------------------------------------------------------------------------

/// Liveness: `Ollama is running` (clients probe it).
#[utoipa::path(get, path = "/", tag = "ollama",
    responses((status = 200, description = "The server is up", body = String, content_type = "text/plain")))]
pub async fn root() -> &'static str {
    "Ollama is running"
}

#[utoipa::path(get, path = "/api/version", tag = "ollama",
    responses((status = 200, body = VersionResponse)))]
pub async fn version() -> Json<VersionResponse> {
    Json(VersionResponse {
        version: OLLAMA_VERSION.into(),
    })
}

/// Every model the server can run.
#[utoipa::path(get, path = "/api/tags", tag = "ollama",
    responses((status = 200, body = TagsResponse)))]
pub async fn tags(State(state): State<AppState>) -> Json<TagsResponse> {
    let models = state
        .inference
        .models
        .list()
        .into_iter()
        .map(|m| TagModel {
            model: m.name.clone(),
            name: m.name,
            modified_at: rfc3339(m.facts.modified),
            size: m.facts.size_bytes,
            digest: m.facts.digest.clone(),
            details: details(&m.facts),
            unavailable: m.unavailable,
        })
        .collect();
    Json(TagsResponse { models })
}

/// The models in memory now.
#[utoipa::path(get, path = "/api/ps", tag = "ollama",
    responses((status = 200, body = PsResponse)))]
pub async fn ps(State(state): State<AppState>) -> Json<PsResponse> {
    let models = state
        .inference
        .models
        .loaded()
        .into_iter()
        .map(ps_model)
        .collect();
    let waiting = crate::metrics::status::BudgetWaiting::of(&state.registry);
    Json(PsResponse { models, waiting })
}

/// A model in memory, here or on an upstream (`node` names it), as `/api/ps` lists it.
fn ps_model(m: RunningModel) -> PsModel {
    // Kept forever (or not known here): a date far ahead, as Ollama writes it.
    let forever = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(10_000_000_000);
    let tier_bytes = m.memory.tier_bytes;
    PsModel {
        name: m.name.clone(),
        model: m.name,
        size: m.size_bytes,
        digest: m.facts.digest.clone(),
        details: details(&m.facts),
        expires_at: rfc3339(m.expires_at.unwrap_or(forever)),
        size_vram: tier_bytes.gpu,
        context_length: m.status.context_length,
        residency: m.memory.residency.to_string(),
        tier_bytes,
        slots: PsSlots {
            active: m.status.active,
            queued: m.status.queued,
            parallel: m.status.parallel,
            decode_tokens_per_second: m.status.decode_tokens_per_second,
        },
        node: m.node,
    }
}

/// A model's template, parameters, metadata and capabilities (reads only the GGUF header).
#[utoipa::path(post, path = "/api/show", tag = "ollama", request_body = ShowRequest,
    responses((status = 200, body = ShowResponse), (status = 404, body = crate::core::error::OllamaErrorBody)))]
pub async fn show(
    State(state): State<AppState>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Json<ShowResponse>> {
    let request: ShowRequest = parse_json(&body_bytes(body)?)?;
    let (requested, name) = either_name(request.model.as_deref(), request.name.as_deref())?;
    let listed = state
        .inference
        .models
        .describe(&name)
        .ok_or_else(|| ApiError::ModelNotFound(requested.clone()))?;
    let context = listed.context_length;
    let mut response = show_response(&listed.facts, &listed.from, context);
    let named = state.registry.resolve(&name);
    // A model made by `/api/create` shows its own defaults.
    if let Some(created) = named.as_ref().and_then(|n| n.created.clone()) {
        super::create::show_created(&mut response, &created, context);
    }
    if request.verbose == Some(true) {
        if let Some(named) = named {
            let path = std::sync::Arc::clone(named.source.local_path());
            response.tensors = tokio::task::spawn_blocking(move || tensors(&path))
                .await
                .map_err(|e| ApiError::Internal(format!("reading the model's tensors: {e}")))?;
        }
    }
    Ok(Json(response))
}

/// The tensors of the GGUF at `path` (`None` when it cannot be read).
fn tensors(path: &std::path::Path) -> Option<Vec<ShowTensor>> {
    let file = hypura_gguf::GgufFile::open(path).ok()?;
    let listed = file
        .tensors()
        .iter()
        .map(|t| ShowTensor {
            name: t.name.clone(),
            r#type: t
                .type_info()
                .map_or_else(|| t.ggml_type.to_string(), |ty| ty.name.to_uppercase()),
            shape: t.dims.clone(),
        })
        .collect();
    Some(listed)
}

/// `/api/show`'s answer for a model whose weights come `from` (a file).
fn show_response(facts: &ModelFacts, from: &str, context: u32) -> ShowResponse {
    ShowResponse {
        modelfile: format!(
            "# Modelfile generated by hypura\nFROM {from}\nPARAMETER num_ctx {context}\n"
        ),
        parameters: format!("num_ctx {context}"),
        template: facts.template.clone(),
        system: None,
        details: details(facts),
        model_info: facts.model_info.clone(),
        capabilities: facts.capabilities.clone(),
        modified_at: rfc3339(facts.modified),
        tensors: None,
    }
}

/// Completes a prompt (chat-templated unless `raw`).
#[utoipa::path(post, path = "/api/generate", tag = "ollama", request_body = GenerateRequest,
    responses(
        (status = 200, description = "NDJSON chunks, or one object with stream: false", body = GenerateChunk, content_type = "application/x-ndjson"),
        (status = 400, body = crate::core::error::OllamaErrorBody),
        (status = 404, body = crate::core::error::OllamaErrorBody),
        (status = 503, description = "Queue full", body = crate::core::error::OllamaErrorBody)))]
pub async fn generate(
    State(state): State<AppState>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let arrived = Instant::now();
    let body = super::create::ollama_body(&state.registry, body_bytes(body)?);
    let request: GenerateRequest = parse_json(&body)?;
    let infer = generate_request(&request)?;
    let route = Route::Generate {
        model: request.model.clone(),
        raw: request.raw.unwrap_or(false),
    };
    respond(
        &state,
        infer,
        route,
        request.stream.unwrap_or(true),
        arrived,
    )
    .await
}

/// Continues a conversation with the model's chat template. A conversation
/// too long for the context window loses its oldest messages (system
/// messages and the last turn stay) unless `truncate` is false (then 400);
/// a trailing assistant message is continued (prefill).
#[utoipa::path(post, path = "/api/chat", tag = "ollama", request_body = ChatRequest,
    responses(
        (status = 200, description = "NDJSON chunks, or one object with stream: false", body = ChatChunk, content_type = "application/x-ndjson",
            headers(("x-hypura-truncated-messages" = u32, description = "Messages dropped to fit the context window (absent when none)"))),
        (status = 400, description = "Invalid request; or the conversation does not fit the context window (with truncate: false, or its last turn alone), or options.num_ctx is above the model's training context", body = crate::core::error::OllamaErrorBody),
        (status = 404, body = crate::core::error::OllamaErrorBody),
        (status = 503, description = "Queue full", body = crate::core::error::OllamaErrorBody)))]
pub async fn chat(
    State(state): State<AppState>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let arrived = Instant::now();
    let body = super::create::ollama_body(&state.registry, body_bytes(body)?);
    let request: ChatRequest = parse_json(&body)?;
    let infer = chat_request(&request)?;
    let route = Route::Chat {
        model: request.model.clone(),
    };
    respond(
        &state,
        infer,
        route,
        request.stream.unwrap_or(true),
        arrived,
    )
    .await
}

/// Embeddings, L2-normalised, one per input.
#[utoipa::path(post, path = "/api/embed", tag = "ollama", request_body = OllamaEmbedRequest,
    responses((status = 200, body = EmbedResponse), (status = 400, body = crate::core::error::OllamaErrorBody),
        (status = 404, body = crate::core::error::OllamaErrorBody)))]
pub async fn embed(
    State(state): State<AppState>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Json<EmbedResponse>> {
    let arrived = Instant::now();
    let request: OllamaEmbedRequest = parse_json(&body_bytes(body)?)?;
    let texts = request.input.map(EmbedInput::into_vec).unwrap_or_default();
    let embed = embed_request(
        &request.model,
        request.keep_alive.as_ref(),
        request.options.as_ref(),
        texts,
        request.truncate.unwrap_or(true),
        request.dimensions,
    )?;
    let (embeddings, count, load) = infer::embed(&state.inference, embed).await?;
    Ok(Json(EmbedResponse {
        model: request.model,
        embeddings,
        total_duration: nanos(arrived.elapsed()),
        load_duration: nanos(load),
        prompt_eval_count: count,
    }))
}

/// Legacy: one embedding for `prompt`.
#[utoipa::path(post, path = "/api/embeddings", tag = "ollama", request_body = EmbeddingsRequest,
    responses((status = 200, body = EmbeddingsResponse), (status = 404, body = crate::core::error::OllamaErrorBody)))]
pub async fn embeddings(
    State(state): State<AppState>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Json<EmbeddingsResponse>> {
    let request: EmbeddingsRequest = parse_json(&body_bytes(body)?)?;
    let texts: Vec<String> = request
        .prompt
        .into_iter()
        .filter(|p| !p.is_empty())
        .collect();
    let embed = embed_request(
        &request.model,
        request.keep_alive.as_ref(),
        request.options.as_ref(),
        texts,
        true,
        None,
    )?;
    let (embeddings, _, _) = infer::embed(&state.inference, embed).await?;
    Ok(Json(EmbeddingsResponse {
        embedding: embeddings.into_iter().next().unwrap_or_default(),
    }))
}

/// Forgets a model name (the GGUF file is never touched, but for an uploaded
/// blob no model uses any more); a created model's manifest goes with it.
#[utoipa::path(delete, path = "/api/delete", tag = "ollama", request_body = DeleteRequest,
    responses((status = 200), (status = 404, body = crate::core::error::OllamaErrorBody)))]
pub async fn delete_model(
    State(state): State<AppState>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<StatusCode> {
    let request: DeleteRequest = parse_json(&body_bytes(body)?)?;
    let (requested, name) = either_name(request.model.as_deref(), request.name.as_deref())?;
    let removed = state
        .registry
        .delete(&name)
        .map_err(|_| ApiError::ModelNotFound(requested))?;
    super::create::forget(&state, &name, &removed);
    Ok(StatusCode::OK)
}

/// Gives a model a second name.
#[utoipa::path(post, path = "/api/copy", tag = "ollama", request_body = CopyRequest,
    responses((status = 200), (status = 404, body = crate::core::error::OllamaErrorBody)))]
pub async fn copy(
    State(state): State<AppState>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<StatusCode> {
    let request: CopyRequest = parse_json(&body_bytes(body)?)?;
    let source = ModelName::parse(&request.source, "source")?;
    let destination = ModelName::parse(&request.destination, "destination")?;
    state
        .registry
        .copy(&source, destination.clone())
        .map_err(|_| ApiError::ModelNotFound(request.source.clone()))?;
    super::create::copied(&state, &destination);
    Ok(StatusCode::OK)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::core::infer::testing::{outcome, tool_outcome};

    use crate::core::backend::{
        BackendError, BackendStatus, EmbedOutput, EventStream, MemoryUse, ModelBackend, Residency,
    };
    use crate::core::request::{BackendRequest, EmbedBatch};
    use crate::pool::LoadedBackend;
    use futures_util::future::BoxFuture;

    fn facts() -> ModelFacts {
        let mut model_info = Map::new();
        model_info.insert("llama.context_length".into(), json!(8192));
        ModelFacts {
            family: "llama".into(),
            parameter_size: "135M".into(),
            quantization: "Q4_1".into(),
            context_length: Some(8192),
            template: "{{ messages }}".into(),
            capabilities: vec!["completion".into(), "tools".into()],
            model_info,
            size_bytes: 98_000_000,
            modified: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            digest: "b179c9523d0e".into(),
        }
    }

    /// A loaded model that only reports its state.
    struct Still;

    impl ModelBackend for Still {
        fn generate(
            &self,
            _: BackendRequest,
        ) -> BoxFuture<'_, std::result::Result<EventStream, BackendError>> {
            unreachable!("not generating")
        }
        fn embed(
            &self,
            _: EmbedBatch,
        ) -> BoxFuture<'_, std::result::Result<EmbedOutput, BackendError>> {
            unreachable!("not embedding")
        }
        fn count_tokens(&self, _: &str) -> std::result::Result<usize, BackendError> {
            unreachable!("not counting")
        }
        fn status(&self) -> BackendStatus {
            BackendStatus {
                context_length: 4096,
                active: 1,
                queued: 2,
                parallel: 4,
                decode_tokens_per_second: Some(41.5),
            }
        }
        fn facts(&self) -> ModelFacts {
            facts()
        }
        fn memory(&self) -> MemoryUse {
            MemoryUse {
                residency: Residency::Partial,
                tier_bytes: TierBytes {
                    gpu: 10,
                    ram: 20,
                    stream: 30,
                },
            }
        }
        fn set_residency(&self, _: Residency) -> std::result::Result<(), BackendError> {
            unreachable!("not moving")
        }
    }

    #[test]
    fn show_answers_from_the_facts() {
        let show = serde_json::to_value(show_response(&facts(), "/m/smol.gguf", 2048)).unwrap();
        assert_eq!(
            show,
            json!({
                "modelfile": "# Modelfile generated by hypura\nFROM /m/smol.gguf\nPARAMETER num_ctx 2048\n",
                "parameters": "num_ctx 2048",
                "template": "{{ messages }}",
                "details": {"parent_model": "", "format": "gguf", "family": "llama",
                            "families": ["llama"], "parameter_size": "135M", "quantization_level": "Q4_1"},
                "model_info": {"llama.context_length": 8192},
                "capabilities": ["completion", "tools"],
                "modified_at": "2023-11-14T22:13:20.000000000Z",
            })
        );
    }

    #[test]
    fn ps_lists_a_model_from_its_backends_memory_status_and_facts() {
        let loaded = LoadedBackend {
            name: "smol:latest".into(),
            id: 1,
            expires_at: None,
            backend: std::sync::Arc::new(Still),
        };
        let loaded = crate::pool::models::running_here(loaded);
        assert_eq!(
            serde_json::to_value(ps_model(loaded)).unwrap(),
            json!({
                "name": "smol:latest", "model": "smol:latest", "size": 30, "digest": "b179c9523d0e",
                "details": {"parent_model": "", "format": "gguf", "family": "llama",
                            "families": ["llama"], "parameter_size": "135M", "quantization_level": "Q4_1"},
                "expires_at": "2286-11-20T17:46:40.000000000Z", "size_vram": 10, "context_length": 4096,
                "residency": "partial", "tier_bytes": {"gpu": 10, "ram": 20, "stream": 30},
                "slots": {"active": 1, "queued": 2, "parallel": 4, "decode_tokens_per_second": 41.5},
            })
        );
    }

    fn body<T: serde::de::DeserializeOwned>(value: Value) -> T {
        parse_json(value.to_string().as_bytes()).unwrap()
    }

    /// A chunk as JSON, its timestamp checked and blanked.
    fn json_of(chunk: &Chunk) -> Value {
        let mut value = serde_json::to_value(chunk).unwrap();
        let created = value["created_at"].as_str().unwrap().to_string();
        assert!(DateTime::parse_from_rfc3339(&created).is_ok(), "{created}");
        value["created_at"] = json!("T");
        value
    }

    #[test]
    fn generate_translates_into_one_infer_request() {
        let request: GenerateRequest = body(json!({
            "model": "SmolLM2", "prompt": "Why?", "system": "Be brief.",
            "options": {"num_predict": 5, "temperature": 0, "num_ctx": 256, "stop": ["\n"]},
            "keep_alive": "10m", "context": [1, 2], "think": false,
        }));
        let infer = generate_request(&request).unwrap();
        assert_eq!(infer.requested, "SmolLM2");
        assert_eq!(infer.name.display, "SmolLM2:latest");
        assert_eq!(
            infer.backend.prompt,
            Prompt::Messages {
                messages: vec![
                    ChatMessage::new("system", "Be brief."),
                    ChatMessage::new("user", "Why?")
                ],
                tools: None,
                template_override: None,
                template_extra: Map::new(),
            }
        );
        assert_eq!(infer.backend.context, vec![1, 2]);
        let params = &infer.backend.params;
        assert_eq!(params.max_tokens, Some(5));
        assert_eq!(params.num_ctx, Some(256));
        assert_eq!(params.stop, vec!["\n"]);
        assert_eq!(params.sampling.temperature, 0.0);
        assert_eq!(params.sampling.top_k, 40);
        assert_eq!(
            infer.keep_alive,
            Some(KeepAlive::For(Duration::from_secs(600)))
        );
        assert_eq!(infer.think, Some(false));
        assert!(infer.tools.is_none());
    }

    #[test]
    fn generate_raw_is_text_and_no_prompt_is_a_load() {
        let raw: GenerateRequest = body(json!({"model": "m", "prompt": "1 2 3", "raw": true}));
        let prompt = generate_request(&raw).unwrap().backend.prompt;
        assert_eq!(
            prompt,
            Prompt::Text {
                text: "1 2 3".into()
            }
        );
        let load: GenerateRequest = body(json!({"model": "m", "keep_alive": 0}));
        let infer = generate_request(&load).unwrap();
        assert_eq!(infer.backend.prompt, Prompt::Load);
        assert!(infer.keep_alive.unwrap().is_zero());
    }

    #[test]
    fn generate_refuses_what_it_cannot_do() {
        for (request, message) in [
            (
                json!({"model": "m", "prompt": "x", "images": ["aGk="]}),
                "\"m\" does not support images",
            ),
            (
                json!({"model": "m", "prompt": "x", "suffix": "y"}),
                "suffix (fill-in-the-middle) is not supported yet",
            ),
            (
                json!({"model": "m", "prompt": "x", "think": "max"}),
                "invalid think \"max\": use true, false, \"low\", \"medium\" or \"high\"",
            ),
            (json!({"model": "", "prompt": "x"}), "model is required"),
        ] {
            let e = generate_request(&body(request)).err().unwrap();
            assert_eq!(e.0.status(), StatusCode::BAD_REQUEST);
            assert_eq!(e.0.to_string(), message);
        }
    }

    #[test]
    fn chat_translates_messages_and_tools() {
        let tool = json!({"type": "function", "function": {"name": "f"}});
        let request: ChatRequest = body(json!({
            "model": "m",
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
                {"role": "tool", "content": "42", "tool_name": "f"},
            ],
            "tools": [tool], "think": "high",
        }));
        let infer = chat_request(&request).unwrap();
        let Prompt::Messages { messages, .. } = &infer.backend.prompt else {
            panic!("{:?}", infer.backend.prompt)
        };
        assert_eq!(messages[0], ChatMessage::new("user", "hi"));
        assert_eq!(
            messages[1].tool_calls,
            Some(json!([{"type": "function", "function": {"name": "f", "arguments": {}}}]))
        );
        assert_eq!(messages[2].name.as_deref(), Some("f"));
        assert_eq!(
            infer.tools,
            Some(ToolRequest {
                definitions: vec![tool],
                choice: ToolChoice::Auto,
                parallel: true,
            })
        );
        assert_eq!(infer.think, Some(true));
        let empty: ChatRequest = body(json!({"model": "m", "messages": []}));
        assert_eq!(chat_request(&empty).unwrap().backend.prompt, Prompt::Load);
    }

    #[test]
    fn generate_chunks_are_ollamas() {
        let route = Route::Generate {
            model: "SmolLM2".into(),
            raw: false,
        };
        let text = json_of(&route.text_chunk("Hi".into(), Vec::new()));
        assert_eq!(
            text,
            json!({"model": "SmolLM2", "created_at": "T", "response": "Hi", "done": false})
        );
        let last = route.last_chunks(&outcome("Hi there"));
        assert_eq!(last.len(), 1);
        assert_eq!(
            json_of(&last[0]),
            json!({"model": "SmolLM2", "created_at": "T", "response": "", "done": true,
                "done_reason": "stop", "total_duration": 20_000_000u64,
                "load_duration": 2_000_000u64, "prompt_eval_count": 3,
                "prompt_eval_duration": 5_000_000u64, "eval_count": 2,
                "eval_duration": 7_000_000u64, "context": [1, 2, 3, 4, 5, 9]})
        );
        let whole = json_of(&route.whole(&outcome("Hi there")));
        assert_eq!(whole["response"], "Hi there");
        assert_eq!(whole["done"], true);
        let raw = Route::Generate {
            model: "m".into(),
            raw: true,
        };
        assert!(json_of(&raw.whole(&outcome("x"))).get("context").is_none());
    }

    #[test]
    fn chat_chunks_carry_the_role_and_whole_tool_calls() {
        let route = Route::Chat { model: "m".into() };
        assert_eq!(
            json_of(&route.text_chunk("Hi".into(), Vec::new())),
            json!({"model": "m", "created_at": "T",
                "message": {"role": "assistant", "content": "Hi"}, "done": false})
        );
        let last: Vec<Value> = route
            .last_chunks(&tool_outcome("Checking."))
            .iter()
            .map(json_of)
            .collect();
        assert_eq!(last.len(), 3);
        assert_eq!(
            last[0]["message"],
            json!({"role": "assistant", "content": "Checking."})
        );
        assert_eq!(
            last[1],
            json!({"model": "m", "created_at": "T", "done": false, "message": {
                "role": "assistant", "content": "",
                "tool_calls": [{"function": {"index": 0, "name": "get_weather",
                    "arguments": {"city": "Paris"}}}]}})
        );
        assert_eq!(last[2]["done"], true);
        assert_eq!(
            last[2]["message"],
            json!({"role": "assistant", "content": ""})
        );
        let whole = json_of(&route.whole(&tool_outcome("Checking.")));
        assert_eq!(whole["message"]["content"], "Checking.");
        assert_eq!(
            whole["message"]["tool_calls"][0]["function"]["name"],
            "get_weather"
        );
    }

    #[test]
    fn loads_and_unloads_answer_one_final_object() {
        let route = Route::Chat { model: "m".into() };
        let chunk = json_of(&route.loaded_chunk("unload", Duration::from_nanos(5)));
        assert_eq!(
            chunk,
            json!({"model": "m", "created_at": "T",
                "message": {"role": "assistant", "content": ""}, "done": true,
                "done_reason": "unload", "total_duration": 5, "load_duration": 5,
                "prompt_eval_count": 0, "prompt_eval_duration": 0, "eval_count": 0,
                "eval_duration": 0})
        );
    }

    #[test]
    fn embed_bodies_translate_into_embed_requests() {
        let request: OllamaEmbedRequest =
            body(json!({"model": "m", "input": ["a", "b"], "truncate": false, "dimensions": 4}));
        let texts = request
            .input
            .clone()
            .map(EmbedInput::into_vec)
            .unwrap_or_default();
        let embed = embed_request(
            &request.model,
            None,
            None,
            texts,
            request.truncate.unwrap_or(true),
            request.dimensions,
        )
        .unwrap();
        assert_eq!(
            embed.batch.inputs,
            [EmbedText::Text("a".into()), EmbedText::Text("b".into())]
        );
        assert!(!embed.batch.truncate);
        assert_eq!(embed.dimensions, Some(4));
        assert_eq!(embed.name.display, "m:latest");
    }

    #[test]
    fn logprobs_are_asked_and_answered_as_ollama_does() {
        let chat = |fields: Value| {
            let mut request = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
            request
                .as_object_mut()
                .unwrap()
                .extend(fields.as_object().unwrap().clone());
            chat_request(&body(request)).map(|r| r.backend.params.sampling.top_logprobs)
        };
        assert_eq!(chat(json!({})).unwrap(), None);
        assert_eq!(chat(json!({"top_logprobs": 5})).unwrap(), None);
        assert_eq!(
            chat(json!({"logprobs": true, "top_logprobs": 5})).unwrap(),
            Some(5)
        );
        let e = chat(json!({"top_logprobs": 21})).err().unwrap();
        assert_eq!(e.0.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            e.0.to_string(),
            "top_logprobs must be between 0 and 20, got 21"
        );
        let generate = json!({"model": "m", "prompt": "x", "logprobs": true});
        let infer = generate_request(&body(generate)).unwrap();
        assert_eq!(infer.backend.params.sampling.top_logprobs, Some(0));

        let route = Route::Chat { model: "m".into() };
        let sampled = crate::core::backend::Logprob {
            token: 1,
            bytes: b"Hi".to_vec(),
            logprob: -0.5,
        };
        let tokens = [TokenLogprobs {
            sampled,
            top: vec![],
        }];
        let chunk = json_of(
            &route
                .text_chunk("Hi".into(), Vec::new())
                .with_logprobs(&tokens),
        );
        assert_eq!(
            chunk["logprobs"],
            json!([{"token": "Hi", "logprob": -0.5, "bytes": [72, 105]}])
        );
        let mut whole = outcome("Hi");
        whole.logprobs = tokens.to_vec();
        assert_eq!(json_of(&route.whole(&whole))["logprobs"][0]["token"], "Hi");
        assert!(json_of(&route.whole(&outcome("Hi")))
            .get("logprobs")
            .is_none());
    }
}
