//! OpenAI's API (`/v1/*`): models, chat completions, completions, embeddings.
//!
//! Streams are SSE: `data: {json}\n\n` per chunk, all with one `id` and
//! `created`; the first delta carries `role: "assistant"`, a last chunk with
//! an empty delta carries `finish_reason`, then (with
//! `stream_options.include_usage`) a chunk with `choices: []` and `usage`,
//! then `data: [DONE]`. Errors are `{"error": {"message", "type", "param",
//! "code"}}`, in a stream as one `data:` event.
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use futures_util::StreamExt;
use llama_tiered::chat::ChatMessage;
use llama_tiered::generate::{Completion, GenerateParams};
use llama_tiered::tools::ToolStream;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use super::body_bytes;
use super::error::{ApiError, OpenAiError};
use super::infer::{self, finish_reason, Filtered, Generation};
use super::ollama::{embed_texts, shorten, EmbedInput};
use super::registry::LoadedModel;
use super::structured::{self, ToolChoice};
use super::validation::{parse_json, ModelName, OpenAiSampling, StopSpec};
use super::AppState;

type Result<T> = std::result::Result<T, OpenAiError>;

const SYSTEM_FINGERPRINT: &str = "fp_hypura";

// ---------------------------------------------------------------------------------------------
// Types
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Serialize, ToSchema)]
pub struct ModelObject {
    #[schema(example = "SmolLM2-135M-Instruct.Q4_1:latest")]
    pub id: String,
    /// Always `model`.
    pub object: String,
    /// Unix seconds (the file's modification time).
    pub created: u64,
    pub owned_by: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ModelList {
    /// Always `list`.
    pub object: String,
    pub data: Vec<ModelObject>,
}

/// One content part: `{"type":"text","text"}` or `{"type":"image_url",…}`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

/// A message's content: a string or a list of parts.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged, expecting = "expected a string or an array of content parts")]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ChatCompletionMessage {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    #[schema(value_type = Object)]
    pub content: Option<Content>,
    pub name: Option<String>,
    #[schema(value_type = Object)]
    pub tool_calls: Option<Value>,
    pub tool_call_id: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct ChatCompletionRequest {
    pub model: String,
    pub messages: Vec<ChatCompletionMessage>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<u32>,
    /// Preferred over `max_tokens` when both are set.
    pub max_completion_tokens: Option<u32>,
    /// Default 1.0; 0 is greedy.
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub seed: Option<i64>,
    #[schema(value_type = Object)]
    pub stop: Option<StopSpec>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    /// `{"type": "text"}`, `{"type": "json_object"}` or `{"type":
    /// "json_schema", "json_schema": {"name", "schema", "strict"}}`: the
    /// reply is constrained by a grammar (the schema always, `strict` or not).
    #[schema(value_type = Object)]
    pub response_format: Option<Value>,
    /// Function tools, for models whose template supports them (others answer 400).
    #[schema(value_type = Vec<Object>)]
    pub tools: Option<Vec<Value>>,
    /// `"auto"` (default), `"none"` (tools left out), `"required"` or
    /// `{"type": "function", "function": {"name"}}` (a call forced by a grammar).
    #[schema(value_type = Object)]
    pub tool_choice: Option<Value>,
    /// Only 1.
    pub n: Option<u32>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct CompletionRequest {
    pub model: String,
    /// A string, or a list holding one string.
    #[schema(value_type = Object)]
    pub prompt: Option<StopSpec>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// Default 16, as OpenAI's.
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub seed: Option<i64>,
    #[schema(value_type = Object)]
    pub stop: Option<StopSpec>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub suffix: Option<String>,
    pub echo: Option<bool>,
    pub n: Option<u32>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AssistantMessage {
    pub role: String,
    /// `null` when the model only called tools.
    pub content: Option<String>,
    /// `[{"id", "type": "function", "function": {"name", "arguments": "<JSON>"}}]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub tool_calls: Option<Vec<Value>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    /// `stop`, `length` or `tool_calls`.
    pub finish_reason: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChatCompletion {
    #[schema(example = "chatcmpl-1a2b3c")]
    pub id: String,
    /// `chat.completion`.
    pub object: String,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// The reply's tool calls, whole, each with its `index`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub tool_calls: Option<Vec<Value>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub finish_reason: Option<String>,
}

/// One SSE event of a streamed chat completion.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChatCompletionChunk {
    pub id: String,
    /// `chat.completion.chunk`.
    pub object: String,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<ChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CompletionChoice {
    pub text: String,
    pub index: u32,
    pub logprobs: Option<Value>,
    pub finish_reason: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TextCompletion {
    pub id: String,
    /// `text_completion`.
    pub object: String,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct EmbeddingRequest {
    pub model: String,
    #[schema(value_type = Object)]
    pub input: EmbedInput,
    /// `float` (default) or `base64` (little-endian f32).
    pub encoding_format: Option<String>,
    pub dimensions: Option<usize>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EmbeddingObject {
    /// `embedding`.
    pub object: String,
    /// A list of floats, or a base64 string of little-endian f32.
    #[schema(value_type = Object)]
    pub embedding: Value,
    pub index: usize,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EmbeddingUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EmbeddingList {
    pub object: String,
    pub data: Vec<EmbeddingObject>,
    pub model: String,
    pub usage: EmbeddingUsage,
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A fresh id: prefix, time and a process-wide counter.
fn new_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{nanos:x}{n:04x}")
}

fn model_name(model: &str) -> Result<ModelName> {
    Ok(ModelName::parse(model, "model")?)
}

/// Tokens the reply used (the end-of-generation token is not counted).
fn completion_tokens(c: &Completion, model: &LoadedModel) -> usize {
    let eog = c.tokens.last().is_some_and(|&t| model.model().is_eog(t));
    c.tokens.len() - usize::from(eog)
}

fn usage(c: &Completion, generation: &Generation) -> Usage {
    let completion_tokens = completion_tokens(c, &generation.lease);
    let prompt_tokens = generation.prompt_tokens.len();
    Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: prompt_tokens + completion_tokens,
    }
}

fn sse_event<T: Serialize>(value: &T) -> Bytes {
    let json = serde_json::to_string(value).unwrap_or_else(|e| {
        format!("{{\"error\":{{\"message\":\"{e}\",\"type\":\"api_error\"}}}}")
    });
    Bytes::from(format!("data: {json}\n\n"))
}

fn sse_response(body: Body) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

fn chat_messages(messages: &[ChatCompletionMessage]) -> Result<Vec<ChatMessage>> {
    if messages.is_empty() {
        return Err(ApiError::bad_request("messages must not be empty").into());
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let content = match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for part in parts {
                        match part.kind.as_str() {
                            "text" => text.push_str(part.text.as_deref().unwrap_or_default()),
                            "image_url" | "input_image" => {
                                return Err(ApiError::bad_request(format!(
                                    "messages[{i}]: this model does not support images"
                                ))
                                .into())
                            }
                            other => {
                                return Err(ApiError::bad_request(format!(
                                    "messages[{i}]: unsupported content part type {other:?}"
                                ))
                                .into())
                            }
                        }
                    }
                    text
                }
            };
            if m.role.trim().is_empty() {
                return Err(ApiError::bad_request(format!("messages[{i}].role is empty")).into());
            }
            let mut message = ChatMessage::new(m.role.as_str(), content);
            message.tool_calls = m.tool_calls.clone().filter(|v| !v.is_null());
            message.name = m.name.clone();
            message.tool_call_id = m.tool_call_id.clone();
            Ok(message)
        })
        .collect()
}

fn only_one_choice(n: Option<u32>) -> Result<()> {
    match n {
        None | Some(1) => Ok(()),
        Some(n) => Err(ApiError::bad_request(format!("n must be 1, got {n}")).into()),
    }
}

async fn run(
    state: &AppState,
    requested: &str,
    params: GenerateParams,
    started: Instant,
    build: impl Fn(&LoadedModel) -> std::result::Result<Vec<i32>, ApiError>,
) -> Result<Generation> {
    let name = model_name(requested)?;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let lease = state.registry.acquire(requested, &name, None).await?;
        let prompt = build(&lease)?;
        match infer::start(lease, prompt, params.clone(), None, started) {
            Err(e) if attempt == 1 && infer::is_shutting_down(&e) => continue,
            other => return Ok(other?),
        }
    }
}

/// What differs between the chat and the text completion streams.
#[derive(Clone)]
struct StreamIds {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    chat: bool,
}

impl StreamIds {
    fn new(prefix: &str, model: &str, options: Option<&StreamOptions>, chat: bool) -> Self {
        StreamIds {
            id: new_id(prefix),
            created: unix_seconds(SystemTime::now()),
            model: model.to_string(),
            include_usage: options.and_then(|o| o.include_usage).unwrap_or(false),
            chat,
        }
    }

    fn chunk(&self, role: Option<&str>, content: Option<String>, finish: Option<&str>) -> Bytes {
        if self.chat {
            let delta = Delta {
                role: role.map(str::to_string),
                content,
                tool_calls: None,
            };
            self.chat_chunk(delta, finish)
        } else {
            sse_event(&TextCompletion {
                id: self.id.clone(),
                object: "text_completion".into(),
                created: self.created,
                model: self.model.clone(),
                system_fingerprint: SYSTEM_FINGERPRINT.into(),
                choices: vec![CompletionChoice {
                    text: content.unwrap_or_default(),
                    index: 0,
                    logprobs: None,
                    finish_reason: finish.map(str::to_string),
                }],
                usage: None,
            })
        }
    }

    /// A chat delta carrying the reply's tool calls.
    fn tool_calls_chunk(&self, tool_calls: Vec<Value>) -> Bytes {
        let delta = Delta {
            role: None,
            content: None,
            tool_calls: Some(tool_calls),
        };
        self.chat_chunk(delta, None)
    }

    fn chat_chunk(&self, delta: Delta, finish: Option<&str>) -> Bytes {
        sse_event(&ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: SYSTEM_FINGERPRINT.into(),
            choices: vec![ChunkChoice {
                index: 0,
                delta,
                finish_reason: finish.map(str::to_string),
            }],
            usage: None,
        })
    }

    fn usage_chunk(&self, usage: Usage) -> Bytes {
        let mut value = serde_json::json!({
            "id": self.id,
            "object": if self.chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": [],
        });
        value["usage"] = serde_json::to_value(usage).unwrap_or(Value::Null);
        sse_event(&value)
    }

    /// The events after the last text: finish, usage, `[DONE]`.
    fn tail(&self, completion: &Completion, generation: &Generation, called_tools: bool) -> Bytes {
        let reason = if called_tools {
            "tool_calls"
        } else {
            finish_reason(completion.finish_reason)
        };
        let mut out = self.chunk(None, None, Some(reason)).to_vec();
        if self.include_usage {
            out.extend_from_slice(&self.usage_chunk(usage(completion, generation)));
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
        Bytes::from(out)
    }
}

/// Streams a generation as SSE. With tools (`filter`), text from where a
/// tool call may begin is held back; the calls come whole in one delta.
fn stream(generation: Generation, ids: StreamIds, filter: Option<ToolStream>) -> Response {
    let first = if ids.chat {
        Some(ids.chunk(Some("assistant"), Some(String::new()), None))
    } else {
        None
    };
    let start = Some((generation, ids, filter));
    let events = futures_util::stream::unfold(start, |state| async move {
        let (mut generation, ids, mut filter) = state?;
        match generation.next_filtered(&mut filter).await? {
            Filtered::Text(text) => {
                let event = ids.chunk(None, Some(text), None);
                Some((event, Some((generation, ids, filter))))
            }
            Filtered::Done(completion, held) => {
                let mut out = Vec::new();
                let mut called_tools = false;
                if let Some(reply) = held {
                    if !reply.content.is_empty() {
                        out.extend_from_slice(&ids.chunk(None, Some(reply.content), None));
                    }
                    if !reply.tool_calls.is_empty() {
                        called_tools = true;
                        let calls = structured::openai_tool_calls(&reply.tool_calls, true);
                        out.extend_from_slice(&ids.tool_calls_chunk(calls));
                    }
                }
                out.extend_from_slice(&ids.tail(&completion, &generation, called_tools));
                Some((Bytes::from(out), None))
            }
            Filtered::Error(e) => {
                let mut out = sse_event(&e.openai_body()).to_vec();
                out.extend_from_slice(b"data: [DONE]\n\n");
                Some((Bytes::from(out), None))
            }
        }
    });
    let events = futures_util::stream::iter(first).chain(events);
    sse_response(Body::from_stream(events.map(Ok::<_, Infallible>)))
}

// ---------------------------------------------------------------------------------------------
// Handlers
// ---------------------------------------------------------------------------------------------

fn model_object(name: String, modified: SystemTime) -> ModelObject {
    ModelObject {
        id: name,
        object: "model".into(),
        created: unix_seconds(modified),
        owned_by: "hypura".into(),
    }
}

/// Every model the server can run.
#[utoipa::path(get, path = "/v1/models", tag = "openai", responses((status = 200, body = ModelList)))]
pub async fn list_models(State(state): State<AppState>) -> Json<ModelList> {
    let data = state
        .registry
        .list()
        .into_iter()
        .map(|m| model_object(m.name, m.info.modified))
        .collect();
    Json(ModelList {
        object: "list".into(),
        data,
    })
}

/// One model.
#[utoipa::path(get, path = "/v1/models/{id}", tag = "openai",
    params(("id" = String, Path, description = "name:tag")),
    responses((status = 200, body = ModelObject), (status = 404, body = super::error::OpenAiErrorBody)))]
pub async fn retrieve_model(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<ModelObject>> {
    let name = model_name(&id)?;
    let named = state
        .registry
        .resolve(&name)
        .ok_or_else(|| ApiError::ModelNotFound(id.clone()))?;
    Ok(Json(model_object(named.name, named.info.modified)))
}

/// A chat reply, whole or streamed as SSE.
#[utoipa::path(post, path = "/v1/chat/completions", tag = "openai", request_body = ChatCompletionRequest,
    responses(
        (status = 200, description = "A completion, or SSE chunks with stream: true", body = ChatCompletion),
        (status = 400, body = super::error::OpenAiErrorBody),
        (status = 404, body = super::error::OpenAiErrorBody),
        (status = 503, body = super::error::OpenAiErrorBody)))]
pub async fn chat_completions(
    State(state): State<AppState>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let started = Instant::now();
    let request: ChatCompletionRequest = parse_json(&body_bytes(body)?)?;
    let name = model_name(&request.model)?;
    only_one_choice(request.n)?;
    let named = state
        .registry
        .resolve(&name)
        .ok_or_else(|| ApiError::ModelNotFound(request.model.clone()))?;
    let grammar = structured::openai_response_format(request.response_format.as_ref())?;
    let tools = structured::prepare_tools(
        request.tools.as_deref(),
        &ToolChoice::parse(request.tool_choice.as_ref())?,
        named.info.chat_template.as_deref(),
        &request.model,
    )?;
    let messages = chat_messages(&request.messages)?;
    let sampling = OpenAiSampling {
        temperature: request.temperature,
        top_p: request.top_p,
        seed: request.seed,
        frequency_penalty: request.frequency_penalty,
        presence_penalty: request.presence_penalty,
        max_tokens: request.max_completion_tokens.or(request.max_tokens),
        stop: request.stop.clone(),
    };
    let mut params = sampling.to_params()?;
    params.sampling.grammar = grammar;
    if let Some(tools) = &tools {
        tools.apply(&mut params.sampling)?;
    }
    let definitions = tools.as_ref().map(|t| &t.definitions);
    let build =
        |model: &LoadedModel| infer::chat_prompt(model, &messages, None, Map::new(), definitions);
    let generation = run(&state, &request.model, params, started, build).await?;
    if request.stream.unwrap_or(false) {
        let ids = StreamIds::new(
            "chatcmpl",
            &request.model,
            request.stream_options.as_ref(),
            true,
        );
        return Ok(stream(generation, ids, tools.as_ref().map(|t| t.stream())));
    }
    let (completion, generation) = generation.collect().await?;
    let usage = usage(&completion, &generation);
    let (content, tool_calls) = match &tools {
        Some(tools) => {
            let reply = tools.parse(&completion.text);
            let calls = structured::openai_tool_calls(&reply.tool_calls, false);
            (reply.content, calls)
        }
        None => (completion.text, Vec::new()),
    };
    let reason = if tool_calls.is_empty() {
        finish_reason(completion.finish_reason)
    } else {
        "tool_calls"
    };
    Ok(Json(ChatCompletion {
        id: new_id("chatcmpl"),
        object: "chat.completion".into(),
        created: unix_seconds(SystemTime::now()),
        model: request.model,
        system_fingerprint: SYSTEM_FINGERPRINT.into(),
        choices: vec![ChatChoice {
            index: 0,
            message: AssistantMessage {
                role: "assistant".into(),
                content: (tool_calls.is_empty() || !content.is_empty()).then_some(content),
                tool_calls: (!tool_calls.is_empty()).then_some(tool_calls),
            },
            finish_reason: reason.into(),
        }],
        usage,
    })
    .into_response())
}

/// A raw text completion (no chat template).
#[utoipa::path(post, path = "/v1/completions", tag = "openai", request_body = CompletionRequest,
    responses(
        (status = 200, description = "A completion, or SSE chunks with stream: true", body = TextCompletion),
        (status = 400, body = super::error::OpenAiErrorBody),
        (status = 404, body = super::error::OpenAiErrorBody)))]
pub async fn completions(
    State(state): State<AppState>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let started = Instant::now();
    let request: CompletionRequest = parse_json(&body_bytes(body)?)?;
    model_name(&request.model)?;
    only_one_choice(request.n)?;
    if request.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::bad_request("suffix is not supported yet: omit it").into());
    }
    let prompt = match request.prompt.clone() {
        None => String::new(),
        Some(StopSpec::One(p)) => p,
        Some(StopSpec::Many(mut v)) if v.len() == 1 => v.remove(0),
        Some(StopSpec::Many(_)) => {
            return Err(
                ApiError::bad_request("prompt must be a string or a list of one string").into(),
            )
        }
    };
    if prompt.is_empty() {
        return Err(ApiError::bad_request("prompt must not be empty").into());
    }
    let sampling = OpenAiSampling {
        temperature: request.temperature,
        top_p: request.top_p,
        seed: request.seed,
        frequency_penalty: request.frequency_penalty,
        presence_penalty: request.presence_penalty,
        max_tokens: Some(request.max_tokens.unwrap_or(16)),
        stop: request.stop.clone(),
    };
    let build = |model: &LoadedModel| infer::raw_prompt(model, &prompt);
    let generation = run(
        &state,
        &request.model,
        sampling.to_params()?,
        started,
        build,
    )
    .await?;
    if request.stream.unwrap_or(false) {
        let ids = StreamIds::new(
            "cmpl",
            &request.model,
            request.stream_options.as_ref(),
            false,
        );
        return Ok(stream(generation, ids, None));
    }
    let (completion, generation) = generation.collect().await?;
    let usage = usage(&completion, &generation);
    let text = if request.echo.unwrap_or(false) {
        format!("{prompt}{}", completion.text)
    } else {
        completion.text
    };
    Ok(Json(TextCompletion {
        id: new_id("cmpl"),
        object: "text_completion".into(),
        created: unix_seconds(SystemTime::now()),
        model: request.model,
        system_fingerprint: SYSTEM_FINGERPRINT.into(),
        choices: vec![CompletionChoice {
            text,
            index: 0,
            logprobs: None,
            finish_reason: Some(finish_reason(completion.finish_reason).into()),
        }],
        usage: Some(usage),
    })
    .into_response())
}

/// Embeddings (L2-normalised), as floats or base64 little-endian f32.
#[utoipa::path(post, path = "/v1/embeddings", tag = "openai", request_body = EmbeddingRequest,
    responses((status = 200, body = EmbeddingList), (status = 400, body = super::error::OpenAiErrorBody),
        (status = 404, body = super::error::OpenAiErrorBody)))]
pub async fn embeddings(
    State(state): State<AppState>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Json<EmbeddingList>> {
    let request: EmbeddingRequest = parse_json(&body_bytes(body)?)?;
    let name = model_name(&request.model)?;
    let base64 = match request.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "encoding_format must be \"float\" or \"base64\", got {other:?}"
            ))
            .into())
        }
    };
    let texts = request.input.into_vec();
    if texts.is_empty() || texts.iter().any(String::is_empty) {
        return Err(
            ApiError::bad_request("input must be a non-empty string or list of them").into(),
        );
    }
    let (mut vectors, tokens, _) =
        embed_texts(&state, &request.model, &name, None, texts, true).await?;
    shorten(&mut vectors, request.dimensions)?;
    let data = vectors
        .into_iter()
        .enumerate()
        .map(|(index, v)| EmbeddingObject {
            object: "embedding".into(),
            embedding: if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                Value::from(v)
            },
            index,
        })
        .collect();
    Ok(Json(EmbeddingList {
        object: "list".into(),
        data,
        model: request.model,
        usage: EmbeddingUsage {
            prompt_tokens: tokens,
            total_tokens: tokens,
        },
    }))
}
