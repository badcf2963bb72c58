//! OpenAI's API (`/v1/*`): models, chat completions, completions, embeddings.
//!
//! Streams are SSE: `data: {json}\n\n` per chunk, all with one `id` and
//! `created`; the first delta carries `role: "assistant"`, a last chunk with
//! an empty delta carries `finish_reason`, then (with
//! `stream_options.include_usage`) a chunk with `choices: []` and `usage`,
//! then `data: [DONE]`. Errors are `{"error": {"message", "type", "param",
//! "code"}}`, in a stream as one `data:` event.
use std::cell::Cell;
use std::convert::Infallible;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use futures_util::StreamExt;
use hypura_chat::ChatMessage;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::api::dialect::openai::{openai_tool_calls, OpenAiSampling};
use crate::api::logprobs::{self, ChoiceLogprobs, CompletionLogprobs};
use crate::core::backend::{FinishReason, TokenLogprobs};
use crate::core::error::{ApiError, OpenAiError};
use crate::core::infer::{self, infer, Answer, Generation, InferEvent, Outcome};
use crate::core::models::ListedModel;
use crate::core::request::{
    EmbedBatch, EmbedRequest, EmbedText, InferRequest, Prompt, ToolRequest,
};
use crate::core::structured::{self, ToolChoice};
use crate::core::validation::{
    self, parse_json, ModelName, StopSpec, ValidationError, MAX_CHOICES,
};
use crate::server::body_bytes;
use crate::state::AppState;

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
    /// hypura: the context per sequence the model is served with now, in
    /// tokens (what a request's prompt and reply share).
    pub context_length: u32,
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
    #[serde(
        default,
        deserialize_with = "crate::core::validation::integral::option"
    )]
    pub max_tokens: Option<u32>,
    /// Preferred over `max_tokens` when both are set.
    #[serde(
        default,
        deserialize_with = "crate::core::validation::integral::option"
    )]
    pub max_completion_tokens: Option<u32>,
    /// Default 1.0; 0 is greedy.
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    #[serde(
        default,
        deserialize_with = "crate::core::validation::integral::option"
    )]
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
    /// Function tools. Models whose chat template cannot describe tools get
    /// them in the system prompt, their replies held to a JSON format (a call
    /// or a response) by a grammar.
    #[schema(value_type = Vec<Object>)]
    pub tools: Option<Vec<Value>>,
    /// The model may call several tools in one reply (default true).
    pub parallel_tool_calls: Option<bool>,
    /// `"auto"` (default), `"none"` (tools left out), `"required"` or
    /// `{"type": "function", "function": {"name"}}` (a call forced by a grammar).
    #[schema(value_type = Object)]
    pub tool_choice: Option<Value>,
    /// Choices to generate, 1 (default) to 8; each is a generation of its own
    /// (with `seed`, choice i samples with seed + i).
    #[serde(
        default,
        deserialize_with = "crate::core::validation::integral::option"
    )]
    pub n: Option<u32>,
    /// hypura: drop the oldest messages (system messages and the last turn
    /// stay) when the conversation is too long for the context window
    /// (default true); false makes it a 400 `context_length_exceeded`.
    pub truncate: Option<bool>,
    /// Return each reply token's log-probability (`choices[].logprobs.content`).
    pub logprobs: Option<bool>,
    /// With `logprobs: true`: also this many most likely tokens per position, 0-20.
    #[serde(
        default,
        deserialize_with = "crate::core::validation::integral::option"
    )]
    pub top_logprobs: Option<i64>,
    /// llama-server's field: false reads the whole prompt and keeps no KV of
    /// it for a later request (default true: a conversation's next turn
    /// decodes only its new tokens).
    pub cache_prompt: Option<bool>,
    /// Token id (as text) → a bias in [-100, 100] added to its logit
    /// before sampling; -100 bans the token, 100 all but forces it.
    pub logit_bias: Option<std::collections::BTreeMap<String, f64>>,
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
    #[serde(
        default,
        deserialize_with = "crate::core::validation::integral::option"
    )]
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    #[serde(
        default,
        deserialize_with = "crate::core::validation::integral::option"
    )]
    pub seed: Option<i64>,
    #[schema(value_type = Object)]
    pub stop: Option<StopSpec>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub suffix: Option<String>,
    pub echo: Option<bool>,
    /// Choices to generate, 1 (default) to 8.
    #[serde(
        default,
        deserialize_with = "crate::core::validation::integral::option"
    )]
    pub n: Option<u32>,
    /// Return each generated token's log-probability and this many most
    /// likely tokens per position, 0-20 (`choices[].logprobs`; the prompt's
    /// tokens, even with `echo`, have none).
    #[serde(
        default,
        deserialize_with = "crate::core::validation::integral::option"
    )]
    pub logprobs: Option<i64>,
    /// llama-server's field: false reads the whole prompt and keeps no KV of it.
    pub cache_prompt: Option<bool>,
    /// Token id (as text) → a bias in [-100, 100] added to its logit
    /// before sampling; -100 bans the token, 100 all but forces it.
    pub logit_bias: Option<std::collections::BTreeMap<String, f64>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

/// OpenAI's breakdown of the prompt's tokens.
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose KV came from the prompt cache (not evaluated).
    pub cached_tokens: usize,
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
    /// With `logprobs: true`: the reply's tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<ChoiceLogprobs>,
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
    /// With `logprobs: true`: the tokens of this chunk's content.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<ChoiceLogprobs>,
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
    /// With `logprobs`: the tokens of `text` (`null` otherwise).
    pub logprobs: Option<CompletionLogprobs>,
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
    /// A string, a list of strings, a list of token ids, or a list of lists
    /// of token ids (what LangChain's `OpenAIEmbeddings` sends).
    #[schema(value_type = Object)]
    pub input: EmbeddingInput,
    /// `float` (default) or `base64` (little-endian f32).
    pub encoding_format: Option<String>,
    #[serde(
        default,
        deserialize_with = "crate::core::validation::integral::option"
    )]
    pub dimensions: Option<usize>,
}

/// `/v1/embeddings`' `input`, in each of its shapes.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum EmbeddingInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<i64>),
    TokenLists(Vec<Vec<i64>>),
}

impl EmbeddingInput {
    /// The inputs, token ids checked to be ids at all (the model checks
    /// them against its vocabulary).
    fn into_inputs(self) -> std::result::Result<Vec<EmbedText>, ValidationError> {
        let tokens = |list: Vec<i64>| {
            list.iter()
                .map(|&t| i32::try_from(t).ok().filter(|t| *t >= 0))
                .collect::<Option<Vec<i32>>>()
                .map(EmbedText::Tokens)
                .ok_or(ValidationError::TokenIds)
        };
        Ok(match self {
            EmbeddingInput::Text(text) => vec![EmbedText::Text(text)],
            EmbeddingInput::Texts(texts) => texts.into_iter().map(EmbedText::Text).collect(),
            EmbeddingInput::Tokens(list) => vec![tokens(list)?],
            EmbeddingInput::TokenLists(lists) => lists
                .into_iter()
                .map(tokens)
                .collect::<std::result::Result<_, _>>()?,
        })
    }
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
// Translation in: bodies → core requests
// ---------------------------------------------------------------------------------------------

fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn model_name(model: &str) -> Result<ModelName> {
    Ok(ModelName::parse(model, "model")?)
}

/// A message's content as text; images are refused (no vision models yet).
fn content_text(content: Option<&Content>, i: usize) -> Result<String> {
    let parts = match content {
        None => return Ok(String::new()),
        Some(Content::Text(t)) => return Ok(t.clone()),
        Some(Content::Parts(parts)) => parts,
    };
    let mut text = String::new();
    for part in parts {
        match part.kind.as_str() {
            "text" => text.push_str(part.text.as_deref().unwrap_or_default()),
            "image_url" | "input_image" => {
                return Err(ApiError::from(ValidationError::ImagePart(i)).into())
            }
            other => {
                return Err(ApiError::from(ValidationError::UnknownContentPart {
                    index: i,
                    kind: other.to_string(),
                })
                .into())
            }
        }
    }
    Ok(text)
}

fn chat_messages(messages: &[ChatCompletionMessage]) -> Result<Vec<ChatMessage>> {
    if messages.is_empty() {
        return Err(ApiError::from(ValidationError::EmptyMessages).into());
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let content = content_text(m.content.as_ref(), i)?;
            validation::check_role(i, &m.role, validation::OPENAI_ROLES).map_err(ApiError::from)?;
            let mut message = ChatMessage::new(m.role.as_str(), content);
            message.tool_calls = m.tool_calls.clone().filter(|v| !v.is_null());
            message.name = m.name.clone();
            message.tool_call_id = m.tool_call_id.clone();
            Ok(message)
        })
        .collect()
}

/// `n`: how many choices, 1 to [`MAX_CHOICES`].
fn choice_count(n: Option<u32>) -> Result<u32> {
    match n {
        None => Ok(1),
        Some(n @ 1..=MAX_CHOICES) => Ok(n),
        Some(n) => Err(ApiError::from(ValidationError::ChoiceCount(n)).into()),
    }
}

/// Chat's `logprobs` and `top_logprobs`: alternatives only with `logprobs: true`.
fn chat_logprobs(wanted: Option<bool>, top: Option<i64>) -> Result<Option<u32>> {
    let wanted = wanted.unwrap_or(false);
    if !wanted && top.is_some_and(|n| n > 0) {
        return Err(ApiError::from(ValidationError::TopLogprobsWithoutLogprobs).into());
    }
    Ok(validation::logprobs(wanted, "top_logprobs", top)?)
}

/// `logit_bias` as the sampler takes it (none when absent).
fn logit_bias(map: Option<&std::collections::BTreeMap<String, f64>>) -> Result<Vec<(i32, f32)>> {
    Ok(map
        .map(validation::logit_bias)
        .transpose()?
        .unwrap_or_default())
}

/// `/v1/chat/completions` → an [`InferRequest`].
pub fn chat_request(request: &ChatCompletionRequest) -> Result<InferRequest> {
    let name = model_name(&request.model)?;
    choice_count(request.n)?;
    let constraint = structured::openai_response_format(request.response_format.as_ref())?;
    let choice = ToolChoice::parse(request.tool_choice.as_ref())?;
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
    params.constraint = constraint;
    params.sampling.top_logprobs = chat_logprobs(request.logprobs, request.top_logprobs)?;
    params.sampling.logit_bias = logit_bias(request.logit_bias.as_ref())?;
    params.skip_prompt_cache = request.cache_prompt == Some(false);
    let mut infer = InferRequest::new(&request.model, name, Prompt::messages(messages), params);
    infer.tools = Some(ToolRequest {
        definitions: request.tools.clone().unwrap_or_default(),
        choice,
        parallel: request.parallel_tool_calls.unwrap_or(true),
    });
    infer.truncate = request.truncate.unwrap_or(true);
    Ok(infer)
}

/// `/v1/completions` → an [`InferRequest`] with a raw text prompt.
pub fn completion_request(request: &CompletionRequest) -> Result<InferRequest> {
    let name = model_name(&request.model)?;
    choice_count(request.n)?;
    if request.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::from(ValidationError::NotSupportedYet(
            "suffix is not supported yet: omit it",
        ))
        .into());
    }
    let text = match request.prompt.clone() {
        None => String::new(),
        Some(StopSpec::One(p)) => p,
        Some(StopSpec::Many(mut v)) if v.len() == 1 => v.remove(0),
        Some(StopSpec::Many(_)) => return Err(ApiError::from(ValidationError::PromptList).into()),
    };
    if text.is_empty() {
        return Err(ApiError::from(ValidationError::EmptyPrompt).into());
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
    let mut params = sampling.to_params()?;
    params.sampling.top_logprobs =
        validation::logprobs(request.logprobs.is_some(), "logprobs", request.logprobs)?;
    params.sampling.logit_bias = logit_bias(request.logit_bias.as_ref())?;
    params.skip_prompt_cache = request.cache_prompt == Some(false);
    Ok(InferRequest::new(
        &request.model,
        name,
        Prompt::Text { text },
        params,
    ))
}

/// `/v1/embeddings` → an [`EmbedRequest`], and whether vectors go out as base64.
pub fn embedding_request(request: EmbeddingRequest) -> Result<(EmbedRequest, bool)> {
    let name = model_name(&request.model)?;
    let base64 = match request.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::from(ValidationError::EncodingFormat(other.to_string())).into())
        }
    };
    let inputs = request.input.into_inputs().map_err(ApiError::from)?;
    if inputs.is_empty() || inputs.iter().any(EmbedText::is_empty) {
        return Err(ApiError::from(ValidationError::EmptyInput).into());
    }
    // As OpenAI does: an input longer than the context is an error.
    let embed = EmbedRequest {
        requested: request.model,
        name,
        batch: EmbedBatch {
            inputs,
            truncate: false,
            num_ctx: None,
        },
        dimensions: request.dimensions,
        keep_alive: None,
    };
    Ok((embed, base64))
}

// ---------------------------------------------------------------------------------------------
// Translation out: events → JSON and SSE
// ---------------------------------------------------------------------------------------------

pub fn usage(outcome: &Outcome) -> Usage {
    let prompt_tokens = outcome.finished.prompt_tokens;
    let completion_tokens = outcome.finished.generated_tokens;
    let cached_tokens = prompt_tokens.saturating_sub(outcome.finished.prompt_eval_tokens);
    Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: prompt_tokens + completion_tokens,
        prompt_tokens_details: PromptTokensDetails { cached_tokens },
    }
}

/// OpenAI's `finish_reason`: `tool_calls` when the reply called tools.
/// `length` when the token limit cut the reply, calls or not (OpenAI
/// reports a cut call so), else `tool_calls` when it called tools.
fn finish_reason(outcome: &Outcome) -> &'static str {
    if outcome.called_tools() && outcome.finished.finish_reason != FinishReason::Length {
        "tool_calls"
    } else {
        outcome.finished.finish_reason.as_str()
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

/// The usage of `n` choices of one prompt: the prompt once, every reply.
fn total_usage(usages: impl IntoIterator<Item = Usage>) -> Usage {
    usages.into_iter().fold(
        Usage {
            prompt_tokens: 0,
            completion_tokens: 0,
            total_tokens: 0,
            prompt_tokens_details: PromptTokensDetails::default(),
        },
        |sum, u| Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: sum.completion_tokens + u.completion_tokens,
            total_tokens: u.prompt_tokens + sum.completion_tokens + u.completion_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: sum
                    .prompt_tokens_details
                    .cached_tokens
                    .max(u.prompt_tokens_details.cached_tokens),
            },
        },
    )
}

/// One choice of a whole chat reply.
fn chat_choice(index: u32, outcome: &Outcome) -> ChatChoice {
    let (content, tool_calls) = match &outcome.reply {
        Some(reply) => (
            reply.content.clone(),
            openai_tool_calls(&reply.tool_calls, false),
        ),
        None => (outcome.text.clone(), Vec::new()),
    };
    ChatChoice {
        index,
        message: AssistantMessage {
            role: "assistant".into(),
            content: (tool_calls.is_empty() || !content.is_empty()).then_some(content),
            tool_calls: (!tool_calls.is_empty()).then_some(tool_calls),
        },
        finish_reason: finish_reason(outcome).into(),
        logprobs: None,
    }
}

/// A whole chat reply (`stream` unset or false), one choice per outcome.
pub fn chat_completion(model: &str, outcomes: &[Outcome]) -> ChatCompletion {
    ChatCompletion {
        id: structured::unique_id("chatcmpl-"),
        object: "chat.completion".into(),
        created: unix_seconds(SystemTime::now()),
        model: model.to_string(),
        system_fingerprint: SYSTEM_FINGERPRINT.into(),
        choices: (0..)
            .zip(outcomes)
            .map(|(i, o)| chat_choice(i, o))
            .collect(),
        usage: total_usage(outcomes.iter().map(usage)),
    }
}

/// A whole text completion, one choice per outcome; `echo` puts the prompt
/// before each reply.
pub fn text_completion(model: &str, outcomes: &[Outcome], echo: Option<&str>) -> TextCompletion {
    TextCompletion {
        id: structured::unique_id("cmpl-"),
        object: "text_completion".into(),
        created: unix_seconds(SystemTime::now()),
        model: model.to_string(),
        system_fingerprint: SYSTEM_FINGERPRINT.into(),
        choices: (0..)
            .zip(outcomes)
            .map(|(index, outcome)| CompletionChoice {
                text: format!("{}{}", echo.unwrap_or_default(), outcome.text),
                index,
                logprobs: None,
                finish_reason: Some(outcome.finished.finish_reason.as_str().into()),
            })
            .collect(),
        usage: Some(total_usage(outcomes.iter().map(usage))),
    }
}

/// The embeddings response; `base64` writes each vector as little-endian f32.
pub fn embedding_list(
    model: String,
    vectors: Vec<Vec<f32>>,
    tokens: usize,
    base64: bool,
) -> EmbeddingList {
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
    EmbeddingList {
        object: "list".into(),
        data,
        model,
        usage: EmbeddingUsage {
            prompt_tokens: tokens,
            total_tokens: tokens,
        },
    }
}

/// What differs between the chat and the text completion streams.
#[derive(Clone)]
pub struct StreamIds {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    chat: bool,
    /// The choice this stream's chunks are for.
    index: u32,
    /// Characters of a text completion sent so far (its `text_offset`s).
    chars_sent: Cell<usize>,
}

impl StreamIds {
    pub fn new(prefix: &str, model: &str, options: Option<&StreamOptions>, chat: bool) -> Self {
        StreamIds {
            id: structured::unique_id(&format!("{prefix}-")),
            created: unix_seconds(SystemTime::now()),
            model: model.to_string(),
            include_usage: options.and_then(|o| o.include_usage).unwrap_or(false),
            chat,
            index: 0,
            chars_sent: Cell::new(0),
        }
    }

    /// The same stream, for choice `index`.
    fn for_choice(&self, index: u32) -> StreamIds {
        StreamIds {
            index,
            ..self.clone()
        }
    }

    /// The first event: a chat stream opens with the assistant's role.
    pub fn head(&self) -> Option<Bytes> {
        self.chat
            .then(|| self.chunk(Some("assistant"), Some(String::new()), None))
    }

    pub fn chunk(
        &self,
        role: Option<&str>,
        content: Option<String>,
        finish: Option<&str>,
    ) -> Bytes {
        self.event(role, content, finish, &[])
    }

    /// A piece of the reply, with the log-probabilities of its tokens (none
    /// unless the request asked).
    pub fn text_chunk(&self, text: String, tokens: &[TokenLogprobs]) -> Bytes {
        self.event(None, Some(text), None, tokens)
    }

    /// A chunk; it has `logprobs` when `tokens` has some.
    fn event(
        &self,
        role: Option<&str>,
        content: Option<String>,
        finish: Option<&str>,
        tokens: &[TokenLogprobs],
    ) -> Bytes {
        if self.chat {
            let delta = Delta {
                role: role.map(str::to_string),
                content,
                tool_calls: None,
            };
            let logprobs = (!tokens.is_empty()).then(|| logprobs::openai_chat(tokens));
            self.chat_chunk(delta, finish, logprobs)
        } else {
            let logprobs = (!tokens.is_empty()).then(|| {
                let mut chars = self.chars_sent.get();
                let logprobs = logprobs::openai_completion(tokens, &mut chars);
                self.chars_sent.set(chars);
                logprobs
            });
            sse_event(&TextCompletion {
                id: self.id.clone(),
                object: "text_completion".into(),
                created: self.created,
                model: self.model.clone(),
                system_fingerprint: SYSTEM_FINGERPRINT.into(),
                choices: vec![CompletionChoice {
                    text: content.unwrap_or_default(),
                    index: self.index,
                    logprobs,
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
        self.chat_chunk(delta, None, None)
    }

    fn chat_chunk(
        &self,
        delta: Delta,
        finish: Option<&str>,
        logprobs: Option<ChoiceLogprobs>,
    ) -> Bytes {
        sse_event(&ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: SYSTEM_FINGERPRINT.into(),
            choices: vec![ChunkChoice {
                index: self.index,
                delta,
                finish_reason: finish.map(str::to_string),
                logprobs,
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

    /// The events after the last text of one choice, then the stream's end;
    /// the log-probabilities not sent yet go with the first of them.
    pub fn tail(&self, outcome: &Outcome) -> Bytes {
        [self.finish(outcome), self.end(usage(outcome))]
            .concat()
            .into()
    }

    /// The events after the last text of this choice: what the tool filter
    /// held back (text, then the calls whole), then its finish.
    fn finish(&self, outcome: &Outcome) -> Bytes {
        let mut out = Vec::new();
        let mut tokens = outcome.logprobs.as_slice();
        if let Some(reply) = &outcome.reply {
            if !reply.content.is_empty() {
                let content = reply.content.clone();
                out.extend_from_slice(&self.text_chunk(content, std::mem::take(&mut tokens)));
            }
            if !reply.tool_calls.is_empty() {
                let calls = openai_tool_calls(&reply.tool_calls, true);
                out.extend_from_slice(&self.tool_calls_chunk(calls));
            }
        }
        let finish = Some(finish_reason(outcome));
        out.extend_from_slice(&self.event(None, None, finish, tokens));
        Bytes::from(out)
    }

    /// The end of the stream, once every choice finished: usage (when
    /// asked), `[DONE]`.
    fn end(&self, usage: Usage) -> Bytes {
        let mut out = Vec::new();
        if self.include_usage {
            out.extend_from_slice(&self.usage_chunk(usage));
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
        Bytes::from(out)
    }

    /// A failure mid-stream: one error event, then `[DONE]`.
    pub fn error(&self, e: &ApiError) -> Bytes {
        let mut out = sse_event(&e.openai_body()).to_vec();
        out.extend_from_slice(b"data: [DONE]\n\n");
        Bytes::from(out)
    }
}

/// What one choice's stream yields.
enum Piece {
    Text(Bytes),
    /// Its last events, and its usage.
    Done(Bytes, Usage),
    /// An error event then `[DONE]`: the whole stream ends.
    Failed(Bytes),
}

/// The events of one choice.
fn choice_events(
    generation: Generation,
    ids: StreamIds,
) -> impl futures_util::Stream<Item = Piece> + Send {
    futures_util::stream::unfold(Some((generation, ids)), |state| async move {
        let (mut generation, ids) = state?;
        match generation.next().await? {
            InferEvent::Text(text) => {
                let event = ids.text_chunk(text, &generation.take_logprobs());
                Some((Piece::Text(event), Some((generation, ids))))
            }
            InferEvent::Done(outcome) => {
                Some((Piece::Done(ids.finish(&outcome), usage(&outcome)), None))
            }
            InferEvent::Error(e) => Some((Piece::Failed(ids.error(&e)), None)),
        }
    })
}

/// Streams generations (one per choice, interleaved, each chunk with its
/// choice's index) as SSE; the stream ends when the last choice finishes.
fn stream(generations: Vec<Generation>, ids: StreamIds) -> Response {
    let choices: Vec<_> = (0..)
        .zip(generations)
        .map(|(i, generation)| choice_events(generation, ids.for_choice(i)).boxed())
        .collect();
    let heads: Vec<Bytes> = (0..choices.len() as u32)
        .filter_map(|i| ids.for_choice(i).head())
        .collect();
    let start = Some((futures_util::stream::select_all(choices), Vec::new()));
    let events = futures_util::stream::unfold(start, move |state| {
        let ids = ids.clone();
        async move {
            let (mut choices, mut usages) = state?;
            match choices.next().await {
                Some(Piece::Text(event)) => Some((event, Some((choices, usages)))),
                Some(Piece::Done(events, usage)) => {
                    usages.push(usage);
                    Some((events, Some((choices, usages))))
                }
                Some(Piece::Failed(event)) => Some((event, None)),
                None => Some((ids.end(total_usage(usages)), None)),
            }
        }
    });
    let events = futures_util::stream::iter(heads).chain(events);
    sse_response(Body::from_stream(events.map(Ok::<_, Infallible>)))
}

/// Starts `n` generations of `request` (choice i with seed + i when a
/// seed is set); they run side by side in the model's slots.
async fn generations(
    state: &AppState,
    request: InferRequest,
    n: u32,
    arrived: Instant,
) -> Result<Vec<Generation>> {
    let mut started = Vec::new();
    for i in 0..n {
        let mut request = request.clone();
        let seed = &mut request.backend.params.sampling.seed;
        *seed = seed.map(|s| s.wrapping_add(i));
        started.push(generation(state, request, arrived).await?);
    }
    Ok(started)
}

/// Runs every generation to its end.
async fn collect(generations: Vec<Generation>) -> Result<Vec<Outcome>> {
    let outcomes =
        futures_util::future::try_join_all(generations.into_iter().map(Generation::collect));
    Ok(outcomes.await?)
}

/// Runs a request through [`infer`]; OpenAI requests always carry a prompt.
async fn generation(
    state: &AppState,
    request: InferRequest,
    arrived: Instant,
) -> Result<Generation> {
    match infer(&state.inference, request, arrived).await? {
        Answer::Generating(generation) => Ok(*generation),
        Answer::Loaded { .. } => {
            Err(ApiError::Internal("a request without a prompt reached generation".into()).into())
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Handlers
// ---------------------------------------------------------------------------------------------

/// A model the server can run, here or on an upstream (its context: the
/// one a request gets here, what the upstream says there, 0 when it says none).
fn model_object(listed: ListedModel) -> ModelObject {
    ModelObject {
        context_length: listed.context_length,
        created: unix_seconds(listed.facts.modified),
        id: listed.name,
        object: "model".into(),
        owned_by: "hypura".into(),
    }
}

/// Every model the server can run.
#[utoipa::path(get, path = "/v1/models", tag = "openai", responses((status = 200, body = ModelList)))]
pub async fn list_models(State(state): State<AppState>) -> Json<ModelList> {
    let data = state
        .inference
        .models
        .list()
        .into_iter()
        .map(model_object)
        .collect();
    Json(ModelList {
        object: "list".into(),
        data,
    })
}

/// One model.
#[utoipa::path(get, path = "/v1/models/{id}", tag = "openai",
    params(("id" = String, Path, description = "name:tag")),
    responses((status = 200, body = ModelObject), (status = 404, body = crate::core::error::OpenAiErrorBody)))]
pub async fn retrieve_model(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<ModelObject>> {
    let name = model_name(&id)?;
    let listed = state
        .inference
        .models
        .describe(&name)
        .ok_or_else(|| ApiError::ModelNotFound(id.clone()))?;
    Ok(Json(model_object(listed)))
}

/// A chat reply, whole or streamed as SSE, with `n` choices. A conversation
/// too long for the context window loses its oldest messages (system
/// messages and the last turn stay) unless `truncate` is false; a trailing
/// assistant message is continued (prefill).
#[utoipa::path(post, path = "/v1/chat/completions", tag = "openai", request_body = ChatCompletionRequest,
    responses(
        (status = 200, description = "A completion, or SSE chunks with stream: true", body = ChatCompletion,
            headers(("x-hypura-truncated-messages" = u32, description = "Messages dropped to fit the context window (absent when none)"))),
        (status = 400, description = "Invalid request; `code: context_length_exceeded` when the conversation does not fit the context window (with truncate: false, or its last turn alone)", body = crate::core::error::OpenAiErrorBody),
        (status = 404, description = "Unknown model (`code: model_not_found`)", body = crate::core::error::OpenAiErrorBody),
        (status = 503, body = crate::core::error::OpenAiErrorBody)))]
pub async fn chat_completions(
    State(state): State<AppState>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let arrived = Instant::now();
    let body = super::create::openai_body(&state.registry, body_bytes(body)?);
    let request: ChatCompletionRequest = parse_json(&body)?;
    let infer = chat_request(&request)?;
    let n = choice_count(request.n)?;
    let generations = generations(&state, infer, n, arrived).await?;
    let truncated = generations[0].truncated_messages;
    if request.stream.unwrap_or(false) {
        let options = request.stream_options.as_ref();
        let ids = StreamIds::new("chatcmpl", &request.model, options, true);
        return Ok(super::with_truncation(stream(generations, ids), truncated));
    }
    let outcomes = collect(generations).await?;
    let mut completion = chat_completion(&request.model, &outcomes);
    if request.logprobs == Some(true) {
        for (choice, outcome) in completion.choices.iter_mut().zip(&outcomes) {
            choice.logprobs = Some(logprobs::openai_chat(&outcome.logprobs));
        }
    }
    let response = Json(completion).into_response();
    Ok(super::with_truncation(response, truncated))
}

/// A raw text completion (no chat template).
#[utoipa::path(post, path = "/v1/completions", tag = "openai", request_body = CompletionRequest,
    responses(
        (status = 200, description = "A completion, or SSE chunks with stream: true", body = TextCompletion),
        (status = 400, body = crate::core::error::OpenAiErrorBody),
        (status = 404, body = crate::core::error::OpenAiErrorBody)))]
pub async fn completions(
    State(state): State<AppState>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let arrived = Instant::now();
    let body = super::create::openai_body(&state.registry, body_bytes(body)?);
    let request: CompletionRequest = parse_json(&body)?;
    let infer = completion_request(&request)?;
    let n = choice_count(request.n)?;
    let generations = generations(&state, infer, n, arrived).await?;
    if request.stream.unwrap_or(false) {
        let options = request.stream_options.as_ref();
        let ids = StreamIds::new("cmpl", &request.model, options, false);
        return Ok(stream(generations, ids));
    }
    let outcomes = collect(generations).await?;
    let echo = match &request.prompt {
        Some(StopSpec::One(p)) if request.echo.unwrap_or(false) => Some(p.as_str()),
        Some(StopSpec::Many(v)) if request.echo.unwrap_or(false) => v.first().map(String::as_str),
        _ => None,
    };
    let mut completion = text_completion(&request.model, &outcomes, echo);
    if request.logprobs.is_some() {
        for (choice, outcome) in completion.choices.iter_mut().zip(&outcomes) {
            let mut chars = echo.map_or(0, |e| e.chars().count());
            choice.logprobs = Some(logprobs::openai_completion(&outcome.logprobs, &mut chars));
        }
    }
    Ok(Json(completion).into_response())
}

/// Embeddings (L2-normalised), as floats or base64 little-endian f32.
#[utoipa::path(post, path = "/v1/embeddings", tag = "openai", request_body = EmbeddingRequest,
    responses((status = 200, body = EmbeddingList), (status = 400, body = crate::core::error::OpenAiErrorBody),
        (status = 404, body = crate::core::error::OpenAiErrorBody)))]
pub async fn embeddings(
    State(state): State<AppState>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Json<EmbeddingList>> {
    let request: EmbeddingRequest = parse_json(&body_bytes(body)?)?;
    let (embed, base64) = embedding_request(request)?;
    let model = embed.requested.clone();
    let (vectors, tokens, _) = infer::embed(&state.inference, embed).await?;
    Ok(Json(embedding_list(model, vectors, tokens, base64)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::core::infer::testing::{outcome, tool_outcome};

    fn body<T: serde::de::DeserializeOwned>(value: Value) -> T {
        parse_json(value.to_string().as_bytes()).unwrap()
    }

    /// The JSON of each `data:` event of an SSE body (`[DONE]` as a string).
    fn events(bytes: &[u8]) -> Vec<Value> {
        let text = std::str::from_utf8(bytes).unwrap();
        assert!(text.ends_with("\n\n"), "{text:?}");
        text.split_terminator("\n\n")
            .map(|event| {
                let data = event.strip_prefix("data: ").unwrap();
                serde_json::from_str(data).unwrap_or_else(|_| Value::from(data))
            })
            .collect()
    }

    /// `id` and `created` checked and blanked.
    fn blank(mut value: Value, prefix: &str) -> Value {
        assert!(value["id"].as_str().unwrap().starts_with(prefix), "{value}");
        assert!(value["created"].as_u64().unwrap() > 0);
        value["id"] = json!("ID");
        value["created"] = json!(0);
        value
    }

    #[test]
    fn chat_translates_into_one_infer_request() {
        let request: ChatCompletionRequest = body(json!({
            "model": "gpt-x", "max_tokens": 9, "max_completion_tokens": 7, "seed": 3,
            "stop": "END", "tool_choice": "required",
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
                {"role": "tool", "content": "42", "tool_call_id": "call_1"},
            ],
        }));
        let infer = chat_request(&request).unwrap();
        assert_eq!(infer.requested, "gpt-x");
        let Prompt::Messages { messages, .. } = &infer.backend.prompt else {
            panic!("{:?}", infer.backend.prompt)
        };
        assert_eq!(messages[0], ChatMessage::new("system", "Be brief."));
        assert_eq!(messages[1], ChatMessage::new("user", "Hi there"));
        assert_eq!(messages[2].tool_call_id.as_deref(), Some("call_1"));
        let params = &infer.backend.params;
        assert_eq!(params.max_tokens, Some(7));
        assert_eq!(params.stop, vec!["END"]);
        assert_eq!(params.sampling.temperature, 1.0);
        assert_eq!(params.sampling.top_k, 0);
        assert_eq!(params.sampling.seed, Some(3));
        let tools = infer.tools.unwrap();
        assert_eq!(tools.choice, ToolChoice::Required);
        assert_eq!(tools.definitions.len(), 1);
        assert!(tools.parallel);
        let one_at_a_time: ChatCompletionRequest = body(json!({"model": "m",
            "messages": [{"role": "user", "content": "x"}], "parallel_tool_calls": false}));
        assert!(
            !chat_request(&one_at_a_time)
                .unwrap()
                .tools
                .unwrap()
                .parallel
        );
    }

    #[test]
    fn chat_refuses_what_it_cannot_do() {
        for (request, message) in [
            (
                json!({"model": "m", "messages": []}),
                "messages must not be empty",
            ),
            (
                json!({"model": "m", "n": 9, "messages": [{"role": "user", "content": "x"}]}),
                "n must be between 1 and 8, got 9",
            ),
            (
                json!({"model": "m", "n": 0, "messages": [{"role": "user", "content": "x"}]}),
                "n must be between 1 and 8, got 0",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
                "messages[0]: this model does not support images",
            ),
            (
                json!({"model": "m", "temperature": 3, "messages": [{"role": "user", "content": "x"}]}),
                "temperature must be between 0 and 2, got 3",
            ),
        ] {
            let e = chat_request(&body(request)).err().unwrap();
            assert_eq!(e.0.status(), axum::http::StatusCode::BAD_REQUEST);
            assert_eq!(e.0.to_string(), message);
        }
    }

    #[test]
    fn completions_take_one_raw_prompt() {
        let request: CompletionRequest = body(json!({"model": "m", "prompt": ["1 2 3"]}));
        let infer = completion_request(&request).unwrap();
        assert_eq!(
            infer.backend.prompt,
            Prompt::Text {
                text: "1 2 3".into()
            }
        );
        assert_eq!(infer.backend.params.max_tokens, Some(16));
        let two: CompletionRequest = body(json!({"model": "m", "prompt": ["a", "b"]}));
        assert!(completion_request(&two).is_err());
    }

    #[test]
    fn a_whole_chat_reply_is_openais() {
        let reply = serde_json::to_value(chat_completion("gpt-x", &[outcome("Hello")])).unwrap();
        assert_eq!(
            blank(reply, "chatcmpl-"),
            json!({"id": "ID", "object": "chat.completion", "created": 0, "model": "gpt-x",
                "system_fingerprint": "fp_hypura",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello"},
                    "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                    "prompt_tokens_details": {"cached_tokens": 0}}})
        );
        let tools = serde_json::to_value(chat_completion("m", &[tool_outcome("")])).unwrap();
        assert_eq!(tools["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(
            tools["choices"][0]["message"],
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
                "type": "function", "function": {"name": "get_weather",
                "arguments": "{\"city\":\"Paris\"}"}}]})
        );
    }

    #[test]
    fn a_chat_stream_opens_with_the_role_and_ends_with_usage_and_done() {
        let options = StreamOptions {
            include_usage: Some(true),
        };
        let ids = StreamIds::new("chatcmpl", "gpt-x", Some(&options), true);
        let head = events(&ids.head().unwrap());
        let text = events(&ids.chunk(None, Some("Hi".into()), None));
        let tail = events(&ids.tail(&outcome("Hi")));
        let chunk = |delta: Value, finish: Value| {
            json!({"id": "ID", "object": "chat.completion.chunk", "created": 0,
                "model": "gpt-x", "system_fingerprint": "fp_hypura",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        };
        assert_eq!(
            blank(head[0].clone(), "chatcmpl-"),
            chunk(json!({"role": "assistant", "content": ""}), Value::Null)
        );
        assert_eq!(
            blank(text[0].clone(), "chatcmpl-"),
            chunk(json!({"content": "Hi"}), Value::Null)
        );
        assert_eq!(tail.len(), 3);
        assert_eq!(
            blank(tail[0].clone(), "chatcmpl-"),
            chunk(json!({}), json!("stop"))
        );
        assert_eq!(
            blank(tail[1].clone(), "chatcmpl-"),
            json!({"id": "ID", "object": "chat.completion.chunk", "created": 0,
                "model": "gpt-x", "system_fingerprint": "fp_hypura", "choices": [],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                    "prompt_tokens_details": {"cached_tokens": 0}}})
        );
        assert_eq!(tail[2], "[DONE]");
        let ids_of = |v: &Value| v["id"].clone();
        assert_eq!(
            ids_of(&head[0]),
            ids_of(&tail[1]),
            "one id for the whole stream"
        );
    }

    #[test]
    fn n_choices_each_have_their_index_and_the_usage_counts_the_prompt_once() {
        let whole = chat_completion("m", &[outcome("a"), outcome("b")]);
        let whole = serde_json::to_value(whole).unwrap();
        assert_eq!(whole["choices"][0]["index"], 0);
        assert_eq!(whole["choices"][1]["index"], 1);
        assert_eq!(whole["choices"][1]["message"]["content"], "b");
        assert_eq!(
            whole["usage"],
            json!({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7,
                "prompt_tokens_details": {"cached_tokens": 0}})
        );
        let ids = StreamIds::new("chatcmpl", "m", None, true).for_choice(1);
        let text = events(&ids.chunk(None, Some("b".into()), None));
        assert_eq!(text[0]["choices"][0]["index"], 1);
    }

    #[test]
    fn a_streamed_tool_call_comes_whole_with_its_index() {
        let ids = StreamIds::new("chatcmpl", "m", None, true);
        let tail = events(&ids.tail(&tool_outcome("")));
        assert_eq!(tail.len(), 3, "{tail:?}");
        assert_eq!(
            tail[0]["choices"][0]["delta"],
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]})
        );
        assert_eq!(tail[1]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(tail[2], "[DONE]");
    }

    #[test]
    fn text_completions_stream_and_answer_as_text_completion() {
        let ids = StreamIds::new("cmpl", "m", None, false);
        assert!(ids.head().is_none());
        let text = blank(
            events(&ids.chunk(None, Some("4".into()), None))[0].clone(),
            "cmpl-",
        );
        assert_eq!(
            text,
            json!({"id": "ID", "object": "text_completion", "created": 0, "model": "m",
                "system_fingerprint": "fp_hypura",
                "choices": [{"text": "4", "index": 0, "logprobs": null, "finish_reason": null}]})
        );
        let whole =
            serde_json::to_value(text_completion("m", &[outcome(" 4")], Some("2+2="))).unwrap();
        assert_eq!(whole["choices"][0]["text"], "2+2= 4");
        assert_eq!(whole["usage"]["total_tokens"], 5);
    }

    #[test]
    fn errors_mid_stream_are_one_event_then_done() {
        let ids = StreamIds::new("chatcmpl", "m", None, true);
        let out = events(&ids.error(&ApiError::Internal("boom".into())));
        assert_eq!(
            out,
            vec![
                json!({"error": {"message": "boom", "type": "api_error", "param": null, "code": null}}),
                json!("[DONE]")
            ]
        );
    }

    #[test]
    fn embeddings_translate_and_encode_base64() {
        let request: EmbeddingRequest =
            body(json!({"model": "e", "input": "hello", "encoding_format": "base64"}));
        let (embed, base64) = embedding_request(request).unwrap();
        assert!(base64);
        assert_eq!(embed.batch.inputs, [EmbedText::Text("hello".into())]);
        assert!(!embed.batch.truncate);
        let tokens = |input| embedding_request(body(json!({"model": "e", "input": input})));
        assert_eq!(
            tokens(json!([[1, 2], [3]])).unwrap().0.batch.inputs,
            [EmbedText::Tokens(vec![1, 2]), EmbedText::Tokens(vec![3])]
        );
        assert_eq!(
            tokens(json!([7, 8])).unwrap().0.batch.inputs,
            [EmbedText::Tokens(vec![7, 8])]
        );
        assert!(tokens(json!([-1])).is_err());
        assert!(tokens(json!([[4_294_967_296_i64]])).is_err());
        assert!(tokens(json!([[]])).is_err());
        let list = serde_json::to_value(embedding_list("e".into(), vec![vec![1.0, 0.0]], 2, true))
            .unwrap();
        assert_eq!(
            list,
            json!({"object": "list", "model": "e",
                "data": [{"object": "embedding", "embedding": "AACAPwAAAAA=", "index": 0}],
                "usage": {"prompt_tokens": 2, "total_tokens": 2}})
        );
        let empty: EmbeddingRequest = body(json!({"model": "e", "input": []}));
        assert!(embedding_request(empty).is_err());
    }

    fn token(text: &str, logprob: f32) -> TokenLogprobs {
        let sampled = crate::core::backend::Logprob {
            token: 1,
            bytes: text.as_bytes().to_vec(),
            logprob,
        };
        TokenLogprobs {
            top: vec![sampled.clone()],
            sampled,
        }
    }

    #[test]
    fn logprobs_are_asked_as_openai_defines_them() {
        let chat = |fields: Value| {
            let mut request = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
            request
                .as_object_mut()
                .unwrap()
                .extend(fields.as_object().unwrap().clone());
            chat_request(&body(request)).map(|r| r.backend.params.sampling.top_logprobs)
        };
        assert_eq!(chat(json!({})).unwrap(), None);
        assert_eq!(chat(json!({"logprobs": true})).unwrap(), Some(0));
        assert_eq!(
            chat(json!({"logprobs": true, "top_logprobs": 3})).unwrap(),
            Some(3)
        );
        assert_eq!(
            chat(json!({"logprobs": false, "top_logprobs": 0})).unwrap(),
            None
        );
        for (fields, message) in [
            (
                json!({"top_logprobs": 2}),
                "top_logprobs needs logprobs: true",
            ),
            (
                json!({"logprobs": true, "top_logprobs": 21}),
                "top_logprobs must be between 0 and 20, got 21",
            ),
        ] {
            let e = chat(fields).err().unwrap();
            assert_eq!(e.0.status(), axum::http::StatusCode::BAD_REQUEST);
            assert_eq!(e.0.to_string(), message);
        }
        let completion = |logprobs: Value| {
            let request = json!({"model": "m", "prompt": "x", "logprobs": logprobs});
            completion_request(&body(request)).map(|r| r.backend.params.sampling.top_logprobs)
        };
        assert_eq!(completion(Value::Null).unwrap(), None);
        assert_eq!(completion(json!(2)).unwrap(), Some(2));
        let e = completion(json!(-1)).err().unwrap();
        assert_eq!(e.0.to_string(), "logprobs must be between 0 and 20, got -1");
    }

    #[test]
    fn streamed_logprobs_go_with_their_text_and_the_rest_with_the_finish() {
        let ids = StreamIds::new("chatcmpl", "m", None, true);
        let text = events(&ids.text_chunk("Hi".into(), &[token("Hi", -0.5)]));
        assert_eq!(
            text[0]["choices"][0]["logprobs"],
            json!({"content": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105],
                "top_logprobs": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105]}]}]})
        );
        let mut last = outcome("Hi!");
        last.logprobs = vec![token("!", -2.0)];
        let tail = events(&ids.tail(&last));
        assert_eq!(tail[0]["choices"][0]["finish_reason"], "stop");
        assert_eq!(
            tail[0]["choices"][0]["logprobs"]["content"][0]["token"],
            "!"
        );
        let plain = events(&ids.chunk(None, Some("x".into()), None));
        assert!(plain[0]["choices"][0].get("logprobs").is_none());

        let ids = StreamIds::new("cmpl", "m", None, false);
        let first = events(&ids.text_chunk("Hé".into(), &[token("Hé", -0.5)]));
        let second = events(&ids.text_chunk(" x".into(), &[token(" x", -1.0)]));
        assert_eq!(
            first[0]["choices"][0]["logprobs"],
            json!({"tokens": ["Hé"], "token_logprobs": [-0.5],
                "top_logprobs": [{"Hé": -0.5}], "text_offset": [0]})
        );
        assert_eq!(
            second[0]["choices"][0]["logprobs"]["text_offset"],
            json!([2])
        );
    }
}
