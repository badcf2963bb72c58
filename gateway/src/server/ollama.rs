//! Ollama's API (`/`, `/api/*`), as its own docs and clients define it.
//!
//! Generation streams NDJSON (`application/x-ndjson`, one object a line) by
//! default; `stream: false` answers one object, the final chunk with all the
//! text. Durations are integer nanoseconds, timestamps RFC 3339 with
//! nanoseconds, and every `model` field echoes the request's model string.
use std::convert::Infallible;
use std::time::{Instant, SystemTime};

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, SecondsFormat, Utc};
use futures_util::StreamExt;
use llama_tiered::chat::ChatMessage;
use llama_tiered::generate::Completion;
use llama_tiered::tools::{self, ToolFamily, ToolStream};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use utoipa::ToSchema;

use super::body_bytes;
use super::error::{ApiError, OllamaError};
use super::infer::{self, finish_reason, nanos, Filtered, Generation};
use super::registry::{LoadedModel, ModelInfo, NamedModel};
use super::structured::{self, ToolChoice};
use super::validation::{parse_json, CheckedParams, KeepAlive, ModelName, OllamaOptions};
use super::AppState;

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
    pub tier_bytes: super::registry::TierBytes,
    /// hypura: the engine's slots now.
    pub slots: PsSlots,
}

/// Requests decoding (`active`, at most `parallel`) and waiting (`queued`).
#[derive(Debug, Serialize, ToSchema)]
pub struct PsSlots {
    pub active: usize,
    pub queued: usize,
    pub parallel: u32,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PsResponse {
    pub models: Vec<PsModel>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct ShowRequest {
    pub model: Option<String>,
    /// Legacy spelling of `model` (OpenClaw sends it).
    pub name: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ShowResponse {
    pub modelfile: String,
    pub parameters: String,
    /// The chat template (Jinja, from the GGUF).
    pub template: String,
    pub details: ModelDetails,
    /// GGUF metadata; always has `<architecture>.context_length` when the file states it.
    #[schema(value_type = Object)]
    pub model_info: Map<String, Value>,
    #[schema(example = json!(["completion"]))]
    pub capabilities: Vec<String>,
    pub modified_at: String,
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
    /// OpenAI-style function tools, for models whose template supports
    /// them (others answer 400); calls come back in `message.tool_calls`.
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
}

/// `input`: one string or several.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged, expecting = "expected a string or an array of strings")]
pub enum EmbedInput {
    One(String),
    Many(Vec<String>),
}

impl EmbedInput {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            EmbedInput::One(s) => vec![s],
            EmbedInput::Many(v) => v,
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct EmbedRequest {
    pub model: String,
    #[schema(value_type = Object)]
    pub input: Option<EmbedInput>,
    /// Cut inputs longer than the context (default true); false makes them a 400.
    pub truncate: Option<bool>,
    /// Keep the first N dimensions (re-normalised).
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
// Small helpers
// ---------------------------------------------------------------------------------------------

pub fn rfc3339(t: SystemTime) -> String {
    DateTime::<Utc>::from(t).to_rfc3339_opts(SecondsFormat::Nanos, true)
}

fn now() -> String {
    rfc3339(SystemTime::now())
}

pub fn details(info: &ModelInfo) -> ModelDetails {
    ModelDetails {
        parent_model: String::new(),
        format: "gguf".into(),
        family: info.architecture.clone(),
        families: vec![info.architecture.clone()],
        parameter_size: info.parameter_size.clone(),
        quantization_level: info.quantization.clone(),
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

fn params(options: Option<&OllamaOptions>) -> Result<CheckedParams> {
    Ok(options.cloned().unwrap_or_default().to_params()?)
}

/// `think`: true or a level asks for thinking, which the model must support.
fn thinking(
    think: Option<&Value>,
    named: &NamedModel,
    requested: &str,
) -> Result<Map<String, Value>> {
    let mut extra = Map::new();
    let wants = match think {
        None | Some(Value::Null) => return Ok(extra),
        Some(Value::Bool(b)) => *b,
        Some(Value::String(level)) if ["low", "medium", "high"].contains(&level.as_str()) => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "invalid think {other}: use true, false, \"low\", \"medium\" or \"high\""
            ))
            .into())
        }
    };
    if !named.info.capabilities.contains(&"thinking") {
        if wants {
            return Err(ApiError::bad_request(format!(
                "\"{requested}\" does not support thinking"
            ))
            .into());
        }
        return Ok(extra);
    }
    extra.insert("enable_thinking".into(), wants.into());
    Ok(extra)
}

fn resolve(state: &AppState, requested: &str, name: &ModelName) -> Result<NamedModel> {
    state
        .registry
        .resolve(name)
        .ok_or_else(|| ApiError::ModelNotFound(requested.to_string()).into())
}

fn stats(
    completion: &Completion,
    generation: &Generation,
    reason: &str,
    eval_count: usize,
) -> FinalStats {
    let t = &completion.timings;
    FinalStats {
        done_reason: reason.to_string(),
        total_duration: generation.started.elapsed().as_nanos() as u64,
        load_duration: generation.lease.load_duration.as_nanos() as u64,
        prompt_eval_count: t.prompt_tokens,
        prompt_eval_duration: nanos(t.prompt_eval_seconds),
        eval_count,
        eval_duration: nanos(t.eval_seconds),
    }
}

/// Tokens counted as generated: the end-of-generation token is not text.
fn eval_count(completion: &Completion, model: &LoadedModel) -> usize {
    let ends_with_eog = completion
        .tokens
        .last()
        .is_some_and(|&t| model.model().is_eog(t));
    completion.tokens.len() - usize::from(ends_with_eog)
}

fn ndjson_line<T: Serialize>(value: &T) -> Bytes {
    let mut line = serde_json::to_vec(value).unwrap_or_else(|e| {
        serde_json::to_vec(&json!({"error": format!("could not serialize a chunk: {e}")}))
            .unwrap_or_default()
    });
    line.push(b'\n');
    Bytes::from(line)
}

/// Which route's chunks a stream writes.
#[derive(Clone)]
enum Route {
    Generate {
        model: String,
        raw: bool,
    },
    /// `tools`: the tool-call syntax to parse replies with, when tools were given.
    Chat {
        model: String,
        tools: Option<ToolFamily>,
    },
}

impl Route {
    fn tool_stream(&self) -> Option<ToolStream> {
        match self {
            Route::Chat {
                tools: Some(family),
                ..
            } => Some(ToolStream::new(*family)),
            _ => None,
        }
    }

    /// A whole reply's text → content and Ollama `tool_calls`.
    fn split_reply(&self, text: String) -> (String, Vec<Value>) {
        match self {
            Route::Chat {
                tools: Some(family),
                ..
            } => {
                let reply = tools::parse(*family, &text);
                (
                    reply.content,
                    structured::ollama_tool_calls(&reply.tool_calls),
                )
            }
            _ => (text, Vec::new()),
        }
    }

    /// The intermediate chunk carrying a reply's tool calls, whole.
    fn tool_calls_chunk(&self, tool_calls: Vec<Value>) -> Bytes {
        ndjson_line(&ChatChunk {
            model: self.model().to_string(),
            created_at: now(),
            message: ReplyMessage {
                role: "assistant".into(),
                content: String::new(),
                tool_calls: Some(tool_calls),
            },
            done: false,
            stats: None,
        })
    }

    fn model(&self) -> &str {
        match self {
            Route::Generate { model, .. } | Route::Chat { model, .. } => model,
        }
    }

    fn text_chunk(&self, text: String) -> Bytes {
        match self {
            Route::Generate { model, .. } => ndjson_line(&GenerateChunk {
                model: model.clone(),
                created_at: now(),
                response: text,
                done: false,
                stats: None,
                context: None,
            }),
            Route::Chat { model, .. } => ndjson_line(&ChatChunk {
                model: model.clone(),
                created_at: now(),
                message: ReplyMessage {
                    role: "assistant".into(),
                    content: text,
                    tool_calls: None,
                },
                done: false,
                stats: None,
            }),
        }
    }

    /// The final chunk; `text` is empty and `tool_calls` too when streaming
    /// (they were sent already).
    fn final_chunk(
        &self,
        text: String,
        tool_calls: Vec<Value>,
        completion: &Completion,
        generation: &Generation,
    ) -> Bytes {
        let reason = finish_reason(completion.finish_reason);
        let stats = stats(
            completion,
            generation,
            reason,
            eval_count(completion, &generation.lease),
        );
        match self {
            Route::Generate { model, raw } => {
                let context = (!raw).then(|| {
                    let mut context = generation.prompt_tokens.clone();
                    context.extend_from_slice(&completion.tokens);
                    context
                });
                ndjson_line(&GenerateChunk {
                    model: model.clone(),
                    created_at: now(),
                    response: text,
                    done: true,
                    stats: Some(stats),
                    context,
                })
            }
            Route::Chat { model, .. } => ndjson_line(&ChatChunk {
                model: model.clone(),
                created_at: now(),
                message: ReplyMessage {
                    role: "assistant".into(),
                    content: text,
                    tool_calls: (!tool_calls.is_empty()).then_some(tool_calls),
                },
                done: true,
                stats: Some(stats),
            }),
        }
    }
}

fn ndjson_response(body: Body) -> Response {
    ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response()
}

/// Streams a generation as NDJSON; a failure mid-stream is one `{"error"}`
/// line. With tools, text from where a tool call may begin is held back and
/// the calls come whole in one chunk before the final one.
fn stream(generation: Generation, route: Route) -> Response {
    let filter = route.tool_stream();
    let start = Some((generation, route, filter));
    let chunks = futures_util::stream::unfold(start, |state| async move {
        let (mut generation, route, mut filter) = state?;
        match generation.next_filtered(&mut filter).await? {
            Filtered::Text(text) => {
                let chunk = route.text_chunk(text);
                Some((chunk, Some((generation, route, filter))))
            }
            Filtered::Done(completion, held) => {
                let mut out = Vec::new();
                if let Some(reply) = held {
                    if !reply.content.is_empty() {
                        out.extend_from_slice(&route.text_chunk(reply.content));
                    }
                    if !reply.tool_calls.is_empty() {
                        let calls = structured::ollama_tool_calls(&reply.tool_calls);
                        out.extend_from_slice(&route.tool_calls_chunk(calls));
                    }
                }
                let last = route.final_chunk(String::new(), Vec::new(), &completion, &generation);
                out.extend_from_slice(&last);
                Some((Bytes::from(out), None))
            }
            Filtered::Error(e) => Some((ndjson_line(&json!({"error": e.to_string()})), None)),
        }
    });
    ndjson_response(Body::from_stream(chunks.map(Ok::<_, Infallible>)))
}

/// Runs a generation to its end and answers one JSON object.
async fn whole(generation: Generation, route: Route) -> Result<Response> {
    let (completion, generation) = generation.collect().await?;
    let (text, tool_calls) = route.split_reply(completion.text.clone());
    let line = route.final_chunk(text, tool_calls, &completion, &generation);
    Ok((
        [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
        line,
    )
        .into_response())
}

async fn respond(generation: Generation, route: Route, streaming: bool) -> Result<Response> {
    if streaming {
        Ok(stream(generation, route))
    } else {
        whole(generation, route).await
    }
}

/// Empty prompt or messages: load the model, or unload it with `keep_alive: 0`.
async fn load_or_unload(
    state: &AppState,
    requested: &str,
    name: &ModelName,
    keep_alive: Option<KeepAlive>,
    route: &Route,
) -> Result<Response> {
    let started = Instant::now();
    let reason = if keep_alive.is_some_and(|k| k.is_zero()) {
        resolve(state, requested, name)?;
        state.registry.unload(name);
        "unload"
    } else {
        drop(state.registry.acquire(requested, name, keep_alive).await?);
        "load"
    };
    let stats = FinalStats {
        done_reason: reason.into(),
        total_duration: started.elapsed().as_nanos() as u64,
        load_duration: started.elapsed().as_nanos() as u64,
        prompt_eval_count: 0,
        prompt_eval_duration: 0,
        eval_count: 0,
        eval_duration: 0,
    };
    let body = match route {
        Route::Generate { model, .. } => serde_json::to_value(GenerateChunk {
            model: model.clone(),
            created_at: now(),
            response: String::new(),
            done: true,
            stats: Some(stats),
            context: None,
        }),
        Route::Chat { model, .. } => serde_json::to_value(ChatChunk {
            model: model.clone(),
            created_at: now(),
            message: ReplyMessage {
                role: "assistant".into(),
                content: String::new(),
                tool_calls: None,
            },
            done: true,
            stats: Some(stats),
        }),
    }
    .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(Json(body).into_response())
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
        .registry
        .list()
        .into_iter()
        .map(|m| TagModel {
            model: m.name.clone(),
            name: m.name,
            modified_at: rfc3339(m.info.modified),
            size: m.info.file_bytes,
            digest: m.info.digest.clone(),
            details: details(&m.info),
        })
        .collect();
    Json(TagsResponse { models })
}

/// The models in memory now.
#[utoipa::path(get, path = "/api/ps", tag = "ollama",
    responses((status = 200, body = PsResponse)))]
pub async fn ps(State(state): State<AppState>) -> Json<PsResponse> {
    // Kept forever: a date far ahead, as Ollama writes it.
    let forever = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(10_000_000_000);
    let models = state
        .registry
        .loaded()
        .into_iter()
        .map(|m| {
            let (residency, tier_bytes) = state.registry.residency(&m);
            let status = m.engine.status();
            PsModel {
                name: m.name.clone(),
                model: m.name.clone(),
                size: tier_bytes.gpu + tier_bytes.ram,
                digest: m.info.digest.clone(),
                details: details(&m.info),
                expires_at: rfc3339(m.expires_at().unwrap_or(forever)),
                size_vram: tier_bytes.gpu,
                context_length: m.n_ctx_per_seq,
                residency: residency.to_string(),
                tier_bytes,
                slots: PsSlots {
                    active: status.active,
                    queued: status.queued,
                    parallel: status.n_parallel,
                },
            }
        })
        .collect();
    Json(PsResponse { models })
}

/// A model's template, parameters, metadata and capabilities (reads only the GGUF header).
#[utoipa::path(post, path = "/api/show", tag = "ollama", request_body = ShowRequest,
    responses((status = 200, body = ShowResponse), (status = 404, body = super::error::OllamaErrorBody)))]
pub async fn show(
    State(state): State<AppState>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Json<ShowResponse>> {
    let request: ShowRequest = parse_json(&body_bytes(body)?)?;
    let (requested, name) = either_name(request.model.as_deref(), request.name.as_deref())?;
    let named = resolve(&state, &requested, &name)?;
    let info = &named.info;
    let template = info
        .chat_template
        .clone()
        .unwrap_or_else(|| llama_tiered::prompt::CHATML_TEMPLATE.to_string());
    let context = state
        .registry
        .settings()
        .n_ctx_per_seq
        .min(info.context_length.unwrap_or(u64::MAX).min(u32::MAX as u64) as u32);
    Ok(Json(ShowResponse {
        modelfile: format!(
            "# Modelfile generated by hypura\nFROM {}\nPARAMETER num_ctx {context}\n",
            named.path.display()
        ),
        parameters: format!("num_ctx {context}"),
        template,
        details: details(info),
        model_info: info.model_info.clone(),
        capabilities: info.capabilities.iter().map(|c| c.to_string()).collect(),
        modified_at: rfc3339(info.modified),
    }))
}

/// Completes a prompt (chat-templated unless `raw`).
#[utoipa::path(post, path = "/api/generate", tag = "ollama", request_body = GenerateRequest,
    responses(
        (status = 200, description = "NDJSON chunks, or one object with stream: false", body = GenerateChunk, content_type = "application/x-ndjson"),
        (status = 400, body = super::error::OllamaErrorBody),
        (status = 404, body = super::error::OllamaErrorBody),
        (status = 503, description = "Queue full", body = super::error::OllamaErrorBody)))]
pub async fn generate(
    State(state): State<AppState>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let started = Instant::now();
    let request: GenerateRequest = parse_json(&body_bytes(body)?)?;
    let name = ModelName::parse(&request.model, "model")?;
    let keep_alive = keep_alive(request.keep_alive.as_ref())?;
    let raw = request.raw.unwrap_or(false);
    let route = Route::Generate {
        model: request.model.clone(),
        raw,
    };
    let grammar = structured::ollama_format(request.format.as_ref())?;
    if request.images.as_ref().is_some_and(|i| !i.is_empty()) {
        return Err(ApiError::bad_request(format!(
            "\"{}\" does not support images",
            request.model
        ))
        .into());
    }
    if request.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(
            ApiError::bad_request("suffix (fill-in-the-middle) is not supported yet").into(),
        );
    }
    let mut checked = params(request.options.as_ref())?;
    checked.generate.sampling.grammar = grammar;
    let named = resolve(&state, &request.model, &name)?;
    let extra = thinking(request.think.as_ref(), &named, &request.model)?;
    let prompt_text = request.prompt.clone().unwrap_or_default();
    if prompt_text.is_empty() && request.context.as_ref().is_none_or(|c| c.is_empty()) {
        return load_or_unload(&state, &request.model, &name, keep_alive, &route).await;
    }
    let build = |model: &LoadedModel| generate_tokens(model, &request, &prompt_text, &extra);
    let generation = run(
        &state,
        &request.model,
        &name,
        keep_alive,
        checked,
        started,
        build,
    )
    .await?;
    respond(generation, route, request.stream.unwrap_or(true)).await
}

/// `/api/generate`'s prompt: the `context` tokens of an earlier reply, then
/// the prompt, raw or rendered with the chat template (or the `template`
/// override) after the `system` message.
fn generate_tokens(
    model: &LoadedModel,
    request: &GenerateRequest,
    prompt: &str,
    extra: &Map<String, Value>,
) -> std::result::Result<Vec<i32>, ApiError> {
    let context = request.context.clone().unwrap_or_default();
    let n_vocab = model.model().n_vocab() as i32;
    if let Some(bad) = context.iter().find(|&&t| t < 0 || t >= n_vocab) {
        return Err(ApiError::bad_request(format!(
            "context holds token {bad}, outside the vocabulary of {n_vocab} tokens"
        )));
    }
    let continuing = !context.is_empty();
    let new_tokens = if request.raw.unwrap_or(false) {
        if continuing {
            model.model().tokenize(prompt, false, true)?
        } else {
            infer::raw_prompt(model, prompt)?
        }
    } else {
        let mut messages = Vec::new();
        if let Some(system) = &request.system {
            messages.push(ChatMessage::new("system", system.as_str()));
        }
        messages.push(ChatMessage::new("user", prompt));
        let mut tokens = infer::chat_prompt(
            model,
            &messages,
            request.template.as_deref(),
            extra.clone(),
            None,
        )?;
        // The conversation already began with BOS.
        let bos = model.model().token_bos();
        if continuing && bos.is_some() && tokens.first().copied() == bos {
            tokens.remove(0);
        }
        tokens
    };
    Ok([context, new_tokens].concat())
}

/// Acquires the model, builds the prompt and submits it; once more if the
/// engine was being unloaded under this request.
async fn run(
    state: &AppState,
    requested: &str,
    name: &ModelName,
    keep_alive: Option<KeepAlive>,
    checked: CheckedParams,
    started: Instant,
    build: impl Fn(&LoadedModel) -> std::result::Result<Vec<i32>, ApiError>,
) -> Result<Generation> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let lease = state.registry.acquire(requested, name, keep_alive).await?;
        let prompt = build(&lease)?;
        match infer::start(
            lease,
            prompt,
            checked.generate.clone(),
            checked.num_ctx,
            started,
        ) {
            Err(e) if attempt == 1 && infer::is_shutting_down(&e) => continue,
            other => return Ok(other?),
        }
    }
}

/// Converts Ollama messages for the chat template.
fn chat_messages(messages: &[Message], requested: &str) -> Result<Vec<ChatMessage>> {
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            if m.role.trim().is_empty() {
                return Err(ApiError::bad_request(format!("messages[{i}].role is empty")).into());
            }
            if m.images.as_ref().is_some_and(|v| !v.is_empty()) {
                return Err(ApiError::bad_request(format!(
                    "\"{requested}\" does not support images"
                ))
                .into());
            }
            let mut message = ChatMessage::new(m.role.as_str(), m.content.as_str());
            message.tool_calls = structured::ollama_input_tool_calls(m.tool_calls.as_ref());
            message.name = m.tool_name.clone();
            Ok(message)
        })
        .collect()
}

/// Continues a conversation with the model's chat template.
#[utoipa::path(post, path = "/api/chat", tag = "ollama", request_body = ChatRequest,
    responses(
        (status = 200, description = "NDJSON chunks, or one object with stream: false", body = ChatChunk, content_type = "application/x-ndjson"),
        (status = 400, body = super::error::OllamaErrorBody),
        (status = 404, body = super::error::OllamaErrorBody),
        (status = 503, description = "Queue full", body = super::error::OllamaErrorBody)))]
pub async fn chat(
    State(state): State<AppState>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let started = Instant::now();
    let request: ChatRequest = parse_json(&body_bytes(body)?)?;
    let name = ModelName::parse(&request.model, "model")?;
    let keep_alive = keep_alive(request.keep_alive.as_ref())?;
    let mut checked = params(request.options.as_ref())?;
    checked.generate.sampling.grammar = structured::ollama_format(request.format.as_ref())?;
    let named = resolve(&state, &request.model, &name)?;
    let tools = structured::prepare_tools(
        request.tools.as_deref(),
        &ToolChoice::Auto,
        named.info.chat_template.as_deref(),
        &request.model,
    )?;
    if let Some(tools) = &tools {
        tools.apply(&mut checked.generate.sampling)?;
    }
    let route = Route::Chat {
        model: request.model.clone(),
        tools: tools.as_ref().map(|t| t.family),
    };
    let extra = thinking(request.think.as_ref(), &named, &request.model)?;
    let messages = request.messages.as_deref().unwrap_or_default();
    if messages.is_empty() {
        return load_or_unload(&state, &request.model, &name, keep_alive, &route).await;
    }
    let messages = chat_messages(messages, &request.model)?;
    let definitions = tools.as_ref().map(|t| &t.definitions);
    let build = |model: &LoadedModel| {
        infer::chat_prompt(model, &messages, None, extra.clone(), definitions)
    };
    let generation = run(
        &state,
        &request.model,
        &name,
        keep_alive,
        checked,
        started,
        build,
    )
    .await?;
    respond(generation, route, request.stream.unwrap_or(true)).await
}

/// Most tokens per embedded text: the engine's embedding context
/// (`llama_tiered::batch`, 512 tokens or the model's training context).
const EMBED_MAX_TOKENS: usize = 512;

/// Embeds each input (cut to the context unless `truncate: false`) as one vector.
pub async fn embed_texts(
    state: &AppState,
    requested: &str,
    name: &ModelName,
    keep_alive: Option<KeepAlive>,
    texts: Vec<String>,
    truncate: bool,
) -> std::result::Result<(Vec<Vec<f32>>, usize, std::time::Duration), ApiError> {
    let lease = state.registry.acquire(requested, name, keep_alive).await?;
    let load_duration = lease.load_duration;
    if texts.is_empty() {
        return Ok((Vec::new(), 0, load_duration));
    }
    tokio::task::spawn_blocking(move || {
        let model = lease.model();
        let limit = EMBED_MAX_TOKENS.min(model.n_ctx_train().max(1) as usize);
        let mut inputs = Vec::with_capacity(texts.len());
        let mut token_count = 0;
        for (i, text) in texts.into_iter().enumerate() {
            // As the engine tokenizes texts to embed: BOS as the model wants, specials as text.
            let tokens = model.tokenize(&text, true, false)?;
            if tokens.len() > limit {
                if !truncate {
                    return Err(ApiError::bad_request(format!(
                        "input {i} has {} tokens, more than the context of {limit}: shorten it \
                         or set truncate: true",
                        tokens.len()
                    )));
                }
                // A few tokens of margin: the cut text may tokenize a little differently.
                let end = limit.saturating_sub(8).max(1);
                let start = usize::from(model.token_bos() == tokens.first().copied());
                inputs.push(model.detokenize(&tokens[start..end.max(start)], false));
                token_count += end;
            } else {
                token_count += tokens.len();
                inputs.push(text);
            }
        }
        let vectors = lease.engine.embed(&inputs)?;
        Ok((vectors, token_count, load_duration))
    })
    .await
    .map_err(|e| ApiError::Internal(format!("embedding task failed: {e}")))?
}

/// Keeps the first `n` dimensions and normalises again.
pub fn shorten(vectors: &mut [Vec<f32>], n: Option<usize>) -> std::result::Result<(), ApiError> {
    let Some(n) = n else { return Ok(()) };
    if n == 0 {
        return Err(ApiError::bad_request("dimensions must be at least 1"));
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

/// Embeddings, L2-normalised, one per input.
#[utoipa::path(post, path = "/api/embed", tag = "ollama", request_body = EmbedRequest,
    responses((status = 200, body = EmbedResponse), (status = 400, body = super::error::OllamaErrorBody),
        (status = 404, body = super::error::OllamaErrorBody)))]
pub async fn embed(
    State(state): State<AppState>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Json<EmbedResponse>> {
    let started = Instant::now();
    let request: EmbedRequest = parse_json(&body_bytes(body)?)?;
    let name = ModelName::parse(&request.model, "model")?;
    let keep_alive = keep_alive(request.keep_alive.as_ref())?;
    params(request.options.as_ref())?;
    let texts = request.input.map(EmbedInput::into_vec).unwrap_or_default();
    let (mut embeddings, count, load) = embed_texts(
        &state,
        &request.model,
        &name,
        keep_alive,
        texts,
        request.truncate.unwrap_or(true),
    )
    .await?;
    shorten(&mut embeddings, request.dimensions)?;
    Ok(Json(EmbedResponse {
        model: request.model,
        embeddings,
        total_duration: started.elapsed().as_nanos() as u64,
        load_duration: load.as_nanos() as u64,
        prompt_eval_count: count,
    }))
}

/// Legacy: one embedding for `prompt`.
#[utoipa::path(post, path = "/api/embeddings", tag = "ollama", request_body = EmbeddingsRequest,
    responses((status = 200, body = EmbeddingsResponse), (status = 404, body = super::error::OllamaErrorBody)))]
pub async fn embeddings(
    State(state): State<AppState>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Json<EmbeddingsResponse>> {
    let request: EmbeddingsRequest = parse_json(&body_bytes(body)?)?;
    let name = ModelName::parse(&request.model, "model")?;
    let keep_alive = keep_alive(request.keep_alive.as_ref())?;
    params(request.options.as_ref())?;
    let texts: Vec<String> = request
        .prompt
        .into_iter()
        .filter(|p| !p.is_empty())
        .collect();
    let (embeddings, _, _) =
        embed_texts(&state, &request.model, &name, keep_alive, texts, true).await?;
    Ok(Json(EmbeddingsResponse {
        embedding: embeddings.into_iter().next().unwrap_or_default(),
    }))
}

/// Forgets a model name (the file on disk is never touched).
#[utoipa::path(delete, path = "/api/delete", tag = "ollama", request_body = DeleteRequest,
    responses((status = 200), (status = 404, body = super::error::OllamaErrorBody)))]
pub async fn delete_model(
    State(state): State<AppState>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<StatusCode> {
    let request: DeleteRequest = parse_json(&body_bytes(body)?)?;
    let (requested, name) = either_name(request.model.as_deref(), request.name.as_deref())?;
    state
        .registry
        .delete(&name)
        .map_err(|_| ApiError::ModelNotFound(requested))?;
    Ok(StatusCode::OK)
}

/// Gives a model a second name.
#[utoipa::path(post, path = "/api/copy", tag = "ollama", request_body = CopyRequest,
    responses((status = 200), (status = 404, body = super::error::OllamaErrorBody)))]
pub async fn copy(
    State(state): State<AppState>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<StatusCode> {
    let request: CopyRequest = parse_json(&body_bytes(body)?)?;
    let source = ModelName::parse(&request.source, "source")?;
    let destination = ModelName::parse(&request.destination, "destination")?;
    state
        .registry
        .copy(&source, destination)
        .map_err(|_| ApiError::ModelNotFound(request.source.clone()))?;
    Ok(StatusCode::OK)
}
