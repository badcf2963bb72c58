//! Anthropic's Messages API (`POST /v1/messages`): translation only, into
//! the one [`InferRequest`] path, as Ollama serves it (its `anthropic/`).
//!
//! `system` (a string or text blocks) becomes a leading system message;
//! `tool_use` blocks become the assistant's tool calls and `tool_result`
//! blocks `tool` messages (before the user's text, as Ollama orders them);
//! `tools` (`{"name", "description", "input_schema"}`) and `tool_choice`
//! (`auto`, `any`, `tool`, `none`) map onto the OpenAI-style tools the chat
//! templates read. `max_tokens` is required, as Anthropic's.
//!
//! `stop_reason`: `end_turn`, `max_tokens`, `tool_use`, or `stop_sequence`
//! when a stop sequence ended the reply (`stop_sequence` then names it when
//! only one was given, else null: the engine does not say which matched).
//! `thinking` and `metadata` are accepted and ignored (nothing here thinks
//! aloud). Streams are SSE `event: <type>\ndata: {json}\n\n`; errors are
//! `{"type": "error", "error": {"type", "message"}}`, in a stream as one
//! `error` event.
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use hypura_chat::ChatMessage;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use utoipa::ToSchema;

use super::SseEvents;
use crate::api::dialect::openai::OpenAiSampling;
use crate::core::backend::FinishReason;
use crate::core::error::ApiError;
use crate::core::infer::{infer, Answer, Generation, Outcome};
use crate::core::request::{InferRequest, Prompt, ToolRequest};
use crate::core::structured::{self, ToolChoice};
use crate::core::validation::{parse_json, ModelName, StopSpec, ValidationError};
use crate::server::body_bytes;
use crate::state::AppState;

type Result<T> = std::result::Result<T, AnthropicError>;

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// An [`ApiError`] written as Anthropic does:
/// `{"type": "error", "error": {"type", "message"}}`.
#[derive(Debug)]
pub struct AnthropicError(pub ApiError);

/// Anthropic's error body.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"type": "error", "error": {"type": "not_found_error", "message": "model 'x:latest' not found"}}))]
pub struct AnthropicErrorBody {
    /// `error`.
    #[serde(rename = "type")]
    pub kind: String,
    #[schema(value_type = Object)]
    pub error: Value,
}

impl AnthropicError {
    /// Anthropic's `error.type` for the status.
    fn kind(&self) -> &'static str {
        match self.0.status() {
            StatusCode::BAD_REQUEST => "invalid_request_error",
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
            StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
            _ => "api_error",
        }
    }

    pub fn body(&self) -> AnthropicErrorBody {
        AnthropicErrorBody {
            kind: "error".into(),
            error: json!({"type": self.kind(), "message": self.0.message()}),
        }
    }
}

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

impl From<ValidationError> for AnthropicError {
    fn from(e: ValidationError) -> Self {
        AnthropicError(e.into())
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        (self.0.status(), Json(self.body())).into_response()
    }
}

fn bad(message: String) -> AnthropicError {
    AnthropicError(ApiError::BadRequest(message))
}

// ---------------------------------------------------------------------------------------------
// Types
// ---------------------------------------------------------------------------------------------

/// A message's `content`: a string or a list of blocks.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(
    untagged,
    expecting = "expected a string or an array of content blocks"
)]
pub enum Content {
    Text(String),
    #[schema(value_type = Vec<Object>)]
    Blocks(Vec<Block>),
}

/// A content block of a request.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    Text {
        text: String,
    },
    Image {},
    Document {},
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Value,
    },
    ToolResult {
        tool_use_id: String,
        #[serde(default)]
        content: Option<Content>,
        #[serde(default)]
        is_error: bool,
    },
    /// Earlier thinking: dropped.
    Thinking {},
    RedactedThinking {},
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct MessageParam {
    /// `user` or `assistant`.
    pub role: String,
    #[schema(value_type = Object)]
    pub content: Content,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct MessagesRequest {
    pub model: String,
    /// Required: the most tokens to generate.
    #[serde(
        default,
        deserialize_with = "crate::core::validation::integral::option"
    )]
    pub max_tokens: Option<u32>,
    pub messages: Vec<MessageParam>,
    /// A string or a list of text blocks.
    #[schema(value_type = Object)]
    pub system: Option<Content>,
    pub stream: Option<bool>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    #[serde(
        default,
        deserialize_with = "crate::core::validation::integral::option"
    )]
    pub top_k: Option<i32>,
    pub stop_sequences: Option<Vec<String>>,
    /// `{"name", "description", "input_schema"}`.
    #[schema(value_type = Vec<Object>)]
    pub tools: Option<Vec<Value>>,
    /// `{"type": "auto" | "any" | "none"}` or `{"type": "tool", "name"}`.
    #[schema(value_type = Object)]
    pub tool_choice: Option<Value>,
    /// hypura (llama-server's field): false reads the whole prompt and keeps
    /// no KV of it. Default true.
    pub cache_prompt: Option<bool>,
}

/// A content block of a reply.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ReplyBlock {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        #[schema(value_type = Object)]
        input: Value,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct MessagesUsage {
    /// Prompt tokens evaluated: as Anthropic counts, those read from the
    /// cache are not among them (the prompt is both together).
    pub input_tokens: usize,
    pub output_tokens: usize,
    /// Prompt tokens the prompt cache held.
    pub cache_read_input_tokens: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct MessagesResponse {
    #[schema(example = "msg_1a2b3c")]
    pub id: String,
    /// `message`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `assistant`.
    pub role: String,
    pub model: String,
    pub content: Vec<ReplyBlock>,
    /// `end_turn`, `max_tokens`, `stop_sequence` or `tool_use`.
    pub stop_reason: Option<String>,
    pub stop_sequence: Option<String>,
    pub usage: MessagesUsage,
}

// ---------------------------------------------------------------------------------------------
// Translation in
// ---------------------------------------------------------------------------------------------

/// The text of a `system` or `tool_result` content.
fn plain_text(content: &Content, where_: &str) -> Result<String> {
    let blocks = match content {
        Content::Text(text) => return Ok(text.clone()),
        Content::Blocks(blocks) => blocks,
    };
    let mut text = String::new();
    for (i, block) in blocks.iter().enumerate() {
        match block {
            Block::Text { text: t } => text.push_str(t),
            _ => {
                return Err(bad(format!(
                    "{where_}[{i}]: only text blocks are supported here"
                )))
            }
        }
    }
    Ok(text)
}

/// One Anthropic message → chat messages: the tool results first (each a
/// `tool` message), then the text with the tool calls.
fn convert_message(message: &MessageParam, index: usize) -> Result<Vec<ChatMessage>> {
    let where_ = format!("messages[{index}]");
    let role = message.role.as_str();
    if role != "user" && role != "assistant" {
        return Err(bad(format!(
            "{where_}.role must be \"user\" or \"assistant\", got {role:?}: put system text in system"
        )));
    }
    let blocks = match &message.content {
        Content::Text(text) => return Ok(vec![ChatMessage::new(role, text.as_str())]),
        Content::Blocks(blocks) => blocks,
    };
    let mut text = String::new();
    let mut calls = Vec::new();
    let mut results = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        match block {
            Block::Text { text: t } => text.push_str(t),
            Block::ToolUse { id, name, input } => {
                let arguments = if input.is_null() {
                    json!({})
                } else {
                    input.clone()
                };
                calls.push(json!({"id": id, "type": "function",
                    "function": {"name": name, "arguments": arguments}}));
            }
            Block::ToolResult {
                tool_use_id,
                content,
                is_error,
            } => {
                let place = format!("{where_}.content[{i}].content");
                let mut output = match content {
                    Some(content) => plain_text(content, &place)?,
                    None => String::new(),
                };
                if *is_error {
                    output = format!("Error: {output}");
                }
                let mut result = ChatMessage::new("tool", output);
                result.tool_call_id = Some(tool_use_id.clone());
                results.push(result);
            }
            Block::Image {} | Block::Document {} => {
                return Err(bad(format!(
                    "{where_}.content[{i}]: this model does not support images or documents"
                )))
            }
            Block::Thinking {} | Block::RedactedThinking {} => {}
        }
    }
    let mut messages = results;
    if !text.is_empty() || !calls.is_empty() || messages.is_empty() {
        let mut message = ChatMessage::new(role, text);
        message.tool_calls = (!calls.is_empty()).then_some(Value::Array(calls));
        messages.push(message);
    }
    Ok(messages)
}

/// An Anthropic tool → the chat shape the templates read.
pub fn chat_tool(tool: &Value, index: usize) -> Result<Value> {
    if let Some(kind) = tool
        .get("type")
        .and_then(Value::as_str)
        .filter(|k| *k != "custom")
    {
        return Err(bad(format!(
            "tools[{index}]: tool type {kind:?} is not supported: only custom tools \
             (name, description, input_schema)"
        )));
    }
    let name = tool.get("name").and_then(Value::as_str).unwrap_or_default();
    if name.is_empty() {
        return Err(bad(format!("tools[{index}].name is required")));
    }
    let mut function = Map::new();
    function.insert("name".into(), name.into());
    if let Some(description) = tool.get("description") {
        function.insert("description".into(), description.clone());
    }
    let parameters = tool
        .get("input_schema")
        .cloned()
        .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
    function.insert("parameters".into(), parameters);
    Ok(json!({"type": "function", "function": function}))
}

/// Anthropic's `tool_choice` → OpenAI's.
pub fn tool_choice(choice: Option<&Value>) -> Result<ToolChoice> {
    let Some(choice) = choice.filter(|c| !c.is_null()) else {
        return Ok(ToolChoice::Auto);
    };
    let name = choice.get("name").and_then(Value::as_str);
    match (choice.get("type").and_then(Value::as_str), name) {
        (Some("auto"), _) => Ok(ToolChoice::Auto),
        (Some("any"), _) => Ok(ToolChoice::Required),
        (Some("none"), _) => Ok(ToolChoice::None),
        (Some("tool"), Some(name)) => Ok(ToolChoice::Function(name.to_string())),
        _ => Err(bad(format!(
            "invalid tool_choice {choice}: use {{\"type\": \"auto\"}}, {{\"type\": \"any\"}}, \
             {{\"type\": \"none\"}} or {{\"type\": \"tool\", \"name\": …}}"
        ))),
    }
}

/// `/v1/messages` → an [`InferRequest`].
pub fn messages_request(request: &MessagesRequest) -> Result<InferRequest> {
    let name = ModelName::parse(&request.model, "model")?;
    let max_tokens = request
        .max_tokens
        .ok_or_else(|| ValidationError::MissingField("max_tokens".into()))?;
    if request.messages.is_empty() {
        return Err(ValidationError::EmptyMessages.into());
    }
    let mut messages = Vec::new();
    if let Some(system) = &request.system {
        let system = plain_text(system, "system")?;
        if !system.is_empty() {
            messages.push(ChatMessage::new("system", system));
        }
    }
    for (i, message) in request.messages.iter().enumerate() {
        messages.extend(convert_message(message, i)?);
    }
    let definitions = request
        .tools
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, tool)| chat_tool(tool, i))
        .collect::<Result<Vec<_>>>()?;
    let choice = tool_choice(request.tool_choice.as_ref())?;
    let sampling = OpenAiSampling {
        temperature: request.temperature,
        top_p: request.top_p,
        seed: None,
        frequency_penalty: None,
        presence_penalty: None,
        max_tokens: Some(max_tokens),
        stop: request.stop_sequences.clone().map(StopSpec::Many),
    };
    let mut params = sampling.to_params()?;
    params.skip_prompt_cache = request.cache_prompt == Some(false);
    if let Some(top_k) = request.top_k {
        params.sampling.top_k = top_k;
    }
    let mut infer = InferRequest::new(&request.model, name, Prompt::messages(messages), params);
    infer.tools = Some(ToolRequest {
        definitions,
        choice,
        parallel: request
            .tool_choice
            .as_ref()
            .and_then(|c| c["disable_parallel_tool_use"].as_bool())
            != Some(true),
    });
    Ok(infer)
}

// ---------------------------------------------------------------------------------------------
// Translation out
// ---------------------------------------------------------------------------------------------

/// Whether a stop sequence (not an end-of-generation token) ended the reply:
/// the end token is in `context` but not counted in `generated_tokens`, a
/// stop sequence's tokens are in both.
fn stopped_by_sequence(outcome: &Outcome) -> bool {
    let finished = &outcome.finished;
    finished.finish_reason == FinishReason::Stop
        && finished.context.len() == finished.prompt_tokens + finished.generated_tokens
}

/// `stop_reason` and `stop_sequence`. A reply the token limit cut is
/// `max_tokens` even inside a tool call (its `tool_use` block then holds
/// the arguments as far as they go), as Anthropic reports it.
fn stop_reason(outcome: &Outcome, stop_sequences: &[String]) -> (String, Option<String>) {
    if outcome.finished.finish_reason == FinishReason::Length {
        return ("max_tokens".into(), None);
    }
    if outcome.called_tools() {
        return ("tool_use".into(), None);
    }
    if !stop_sequences.is_empty() && stopped_by_sequence(outcome) {
        let which = (stop_sequences.len() == 1).then(|| stop_sequences[0].clone());
        return ("stop_sequence".into(), which);
    }
    ("end_turn".into(), None)
}

fn tool_blocks(outcome: &Outcome) -> Vec<ReplyBlock> {
    let Some(reply) = &outcome.reply else {
        return Vec::new();
    };
    reply
        .tool_calls
        .iter()
        .map(|call| ReplyBlock::ToolUse {
            id: call
                .id
                .clone()
                .unwrap_or_else(|| structured::unique_id("toolu_")),
            name: call.name.clone(),
            input: Value::Object(call.arguments.clone()),
        })
        .collect()
}

fn usage(outcome: &Outcome) -> MessagesUsage {
    let finished = &outcome.finished;
    MessagesUsage {
        input_tokens: finished.prompt_eval_tokens.min(finished.prompt_tokens),
        output_tokens: finished.generated_tokens,
        cache_read_input_tokens: finished
            .prompt_tokens
            .saturating_sub(finished.prompt_eval_tokens),
    }
}

/// A whole reply (`stream` unset or false).
pub fn messages_response(model: &str, outcome: &Outcome, stop: &[String]) -> MessagesResponse {
    let text = match &outcome.reply {
        Some(reply) => reply.content.clone(),
        None => outcome.text.clone(),
    };
    let mut content = Vec::new();
    if !text.is_empty() {
        content.push(ReplyBlock::Text { text });
    }
    content.extend(tool_blocks(outcome));
    let (stop_reason, stop_sequence) = stop_reason(outcome, stop);
    MessagesResponse {
        id: structured::unique_id("msg_"),
        kind: "message".into(),
        role: "assistant".into(),
        model: model.to_string(),
        content,
        stop_reason: Some(stop_reason),
        stop_sequence,
        usage: usage(outcome),
    }
}

fn event(kind: &str, data: Value) -> Vec<u8> {
    format!("event: {kind}\ndata: {data}\n\n").into_bytes()
}

/// The events of one streamed reply.
pub struct MessageStream {
    id: String,
    model: String,
    stop: Vec<String>,
    /// The index of the next content block.
    next_index: usize,
    /// Whether a text block is open (always the first block).
    text_open: bool,
}

impl MessageStream {
    pub fn new(model: &str, stop: Vec<String>) -> Self {
        MessageStream {
            id: structured::unique_id("msg_"),
            model: model.to_string(),
            stop,
            next_index: 0,
            text_open: false,
        }
    }

    /// `message_start`: the message with no content yet (its input tokens
    /// come in `message_delta`, once counted).
    pub fn head(&self) -> Bytes {
        let message = json!({"id": self.id, "type": "message", "role": "assistant",
            "model": self.model, "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 0, "output_tokens": 0}});
        Bytes::from(event(
            "message_start",
            json!({"type": "message_start", "message": message}),
        ))
    }

    fn stop_block(&mut self) -> Vec<u8> {
        let out = event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": self.next_index}),
        );
        self.next_index += 1;
        out
    }
}

impl SseEvents for MessageStream {
    /// A piece of text (its block started first).
    fn text(&mut self, text: &str) -> Bytes {
        let mut out = Vec::new();
        if !self.text_open {
            self.text_open = true;
            out.extend(event(
                "content_block_start",
                json!({"type": "content_block_start", "index": self.next_index,
                    "content_block": {"type": "text", "text": ""}}),
            ));
        }
        out.extend(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": self.next_index,
                "delta": {"type": "text_delta", "text": text}}),
        ));
        Bytes::from(out)
    }

    /// What the tool filter held back, each tool call as a `tool_use` block,
    /// `message_delta` (stop reason, usage) and `message_stop`.
    fn tail(&mut self, outcome: &Outcome) -> Bytes {
        let mut out = Vec::new();
        let held = outcome.reply.as_ref().map_or("", |r| r.content.as_str());
        if !held.is_empty() {
            out.extend_from_slice(&self.text(held));
        }
        if self.text_open {
            self.text_open = false;
            out.extend(self.stop_block());
        }
        for block in tool_blocks(outcome) {
            let ReplyBlock::ToolUse { id, name, input } = block else {
                continue;
            };
            out.extend(event(
                "content_block_start",
                json!({"type": "content_block_start", "index": self.next_index,
                    "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
            ));
            out.extend(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": self.next_index,
                    "delta": {"type": "input_json_delta", "partial_json": input.to_string()}}),
            ));
            out.extend(self.stop_block());
        }
        let (stop_reason, stop_sequence) = stop_reason(outcome, &self.stop);
        let usage = usage(outcome);
        out.extend(event(
            "message_delta",
            json!({"type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                    "cache_read_input_tokens": usage.cache_read_input_tokens}}),
        ));
        out.extend(event("message_stop", json!({"type": "message_stop"})));
        Bytes::from(out)
    }

    /// A failure mid-stream: one `error` event.
    fn error(&mut self, e: ApiError) -> Bytes {
        let body = serde_json::to_value(AnthropicError(e).body()).unwrap_or(Value::Null);
        Bytes::from(event("error", body))
    }
}

fn stream(generation: Generation, events: MessageStream) -> Response {
    let first = events.head();
    super::sse_stream(first, generation, events)
}

// ---------------------------------------------------------------------------------------------
// Handler
// ---------------------------------------------------------------------------------------------

/// A reply in Anthropic's Messages shape, whole or streamed as SSE events.
/// Takes the API key as `x-api-key` or `Authorization: Bearer`.
#[utoipa::path(post, path = "/v1/messages", tag = "anthropic", request_body = MessagesRequest,
    responses(
        (status = 200, description = "A message, or SSE events (message_start … message_stop) with stream: true", body = MessagesResponse),
        (status = 400, body = AnthropicErrorBody),
        (status = 404, body = AnthropicErrorBody)))]
pub async fn messages(
    State(state): State<AppState>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let arrived = Instant::now();
    let request: MessagesRequest = parse_json(&body_bytes(body)?)?;
    let infer_request = messages_request(&request)?;
    let generation = match infer(&state.inference, infer_request, arrived).await? {
        Answer::Generating(generation) => *generation,
        Answer::Loaded { .. } => {
            return Err(
                ApiError::Internal("a request without a prompt reached generation".into()).into(),
            )
        }
    };
    let stop = request.stop_sequences.clone().unwrap_or_default();
    if request.stream.unwrap_or(false) {
        return Ok(stream(generation, MessageStream::new(&request.model, stop)));
    }
    let outcome = generation.collect().await?;
    Ok(Json(messages_response(&request.model, &outcome, &stop)).into_response())
}

/// `/v1/messages/count_tokens`' reply.
#[derive(Debug, Serialize, ToSchema)]
pub struct CountTokensResponse {
    /// Tokens of the prompt the request's messages, system text and tools
    /// make with the model's template.
    pub input_tokens: usize,
}

/// The tokens a Messages request's prompt would take (its `max_tokens` is
/// not needed).
#[utoipa::path(post, path = "/v1/messages/count_tokens", tag = "anthropic",
    request_body = MessagesRequest,
    responses(
        (status = 200, body = CountTokensResponse),
        (status = 400, body = AnthropicErrorBody),
        (status = 404, body = AnthropicErrorBody)))]
pub async fn count_tokens(
    State(state): State<AppState>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Json<CountTokensResponse>> {
    let mut request: MessagesRequest = parse_json(&body_bytes(body)?)?;
    request.max_tokens.get_or_insert(1);
    let infer_request = messages_request(&request)?;
    let input_tokens =
        crate::core::infer::count_prompt_tokens(&state.inference, infer_request).await?;
    Ok(Json(CountTokensResponse { input_tokens }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::infer::testing::{
        named_sse_events as events, outcome, prompt_messages as messages, tool_outcome,
    };

    fn request(value: Value) -> MessagesRequest {
        parse_json(value.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn system_messages_and_sampling_translate() {
        let infer = messages_request(&request(json!({"model": "claude-x", "max_tokens": 9,
            "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
            "temperature": 0, "top_k": 5, "stop_sequences": ["END", "STOP"],
            "messages": [{"role": "user", "content": "Hi"},
                {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]},
                {"role": "user", "content": [{"type": "text", "text": "Bye"}]}]})))
        .unwrap();
        assert_eq!(
            messages(&infer),
            [
                ChatMessage::new("system", "Be brief."),
                ChatMessage::new("user", "Hi"),
                ChatMessage::new("assistant", "Hello"),
                ChatMessage::new("user", "Bye"),
            ]
        );
        let params = &infer.backend.params;
        assert_eq!(params.max_tokens, Some(9));
        assert_eq!(params.stop, ["END", "STOP"]);
        assert_eq!(params.sampling.temperature, 0.0);
        assert_eq!(params.sampling.top_k, 5);
    }

    #[test]
    fn tool_use_and_tool_result_blocks_become_calls_and_tool_messages() {
        let infer = messages_request(&request(json!({"model": "m", "max_tokens": 9,
            "tools": [{"name": "get_weather", "description": "Weather",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "tool", "name": "get_weather"},
            "messages": [
                {"role": "user", "content": "Weather in Rome?"},
                {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Rome"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "21 C"}]},
                    {"type": "text", "text": "And?"}]},
            ]})))
        .unwrap();
        let m = messages(&infer);
        assert_eq!(m.len(), 4, "{m:?}");
        assert_eq!(m[1].content, "Let me look.");
        assert_eq!(
            m[1].tool_calls,
            Some(json!([{"id": "toolu_1", "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]))
        );
        assert_eq!(
            (m[2].role.as_str(), m[2].content.as_str()),
            ("tool", "21 C")
        );
        assert_eq!(m[2].tool_call_id.as_deref(), Some("toolu_1"));
        assert_eq!(m[3], ChatMessage::new("user", "And?"));
        let tools = infer.tools.unwrap();
        assert_eq!(
            tools.definitions,
            [
                json!({"type": "function", "function": {"name": "get_weather", "description": "Weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
            ]
        );
        assert_eq!(tools.choice, ToolChoice::Function("get_weather".into()));
        assert_eq!(
            tool_choice(Some(&json!({"type": "any"}))).unwrap(),
            ToolChoice::Required
        );
        assert_eq!(
            tool_choice(Some(&json!({"type": "none"}))).unwrap(),
            ToolChoice::None
        );
    }

    #[test]
    fn what_cannot_be_done_is_a_400_that_says_why() {
        let user = json!([{"role": "user", "content": "x"}]);
        for (body, message) in [
            (json!({"model": "m", "messages": user}), "max_tokens is required"),
            (json!({"model": "m", "max_tokens": 5, "messages": []}), "messages must not be empty"),
            (json!({"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}),
                "messages[0].role must be \"user\" or \"assistant\", got \"system\": put system text in system"),
            (json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "data": ""}}]}]}),
                "messages[0].content[0]: this model does not support images or documents"),
            (json!({"model": "m", "max_tokens": 5, "messages": user,
                "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
                "tools[0]: tool type \"web_search_20250305\" is not supported: only custom tools (name, description, input_schema)"),
            (json!({"model": "m", "max_tokens": 5, "messages": user, "tool_choice": {"type": "tool"}}),
                "invalid tool_choice {\"type\":\"tool\"}: use {\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": \"none\"} or {\"type\": \"tool\", \"name\": …}"),
        ] {
            let e = messages_request(&request(body)).err().unwrap();
            assert_eq!(e.0.status(), StatusCode::BAD_REQUEST);
            assert_eq!(e.0.to_string(), message);
        }
    }

    #[test]
    fn errors_take_anthropics_shape() {
        let not_found = AnthropicError(ApiError::ModelNotFound("x".into())).body();
        assert_eq!(
            serde_json::to_value(not_found).unwrap(),
            json!({"type": "error", "error": {"type": "not_found_error", "message": "model 'x' not found"}})
        );
        let busy = AnthropicError(ApiError::Unavailable("full".into()));
        assert_eq!(busy.body().error["type"], "overloaded_error");
        let key = AnthropicError(ApiError::Unauthorized("no".into()));
        assert_eq!(key.body().error["type"], "authentication_error");
    }

    #[test]
    fn a_whole_reply_has_its_blocks_stop_reason_and_usage() {
        let r =
            serde_json::to_value(messages_response("claude-x", &outcome("Hello"), &[])).unwrap();
        assert!(r["id"].as_str().unwrap().starts_with("msg_"));
        assert_eq!(r["type"], "message");
        assert_eq!(r["role"], "assistant");
        assert_eq!(r["model"], "claude-x");
        assert_eq!(r["content"], json!([{"type": "text", "text": "Hello"}]));
        assert_eq!(r["stop_reason"], "end_turn");
        assert!(r["stop_sequence"].is_null());
        assert_eq!(
            r["usage"],
            json!({"input_tokens": 3, "output_tokens": 2, "cache_read_input_tokens": 0})
        );
        let tools =
            serde_json::to_value(messages_response("m", &tool_outcome("Sure."), &[])).unwrap();
        assert_eq!(tools["stop_reason"], "tool_use");
        assert_eq!(
            tools["content"],
            json!([{"type": "text", "text": "Sure."},
                {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}])
        );
        let mut cut = outcome("Hel");
        cut.finished.finish_reason = FinishReason::Length;
        let r = serde_json::to_value(messages_response("m", &cut, &[])).unwrap();
        assert_eq!(r["stop_reason"], "max_tokens");
        // A call the limit cut: its block as far as it goes, `max_tokens`.
        let mut cut_call = tool_outcome("");
        cut_call.finished.finish_reason = FinishReason::Length;
        let r = serde_json::to_value(messages_response("m", &cut_call, &[])).unwrap();
        assert_eq!(r["stop_reason"], "max_tokens");
        assert_eq!(
            r["content"],
            json!([{"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}])
        );
    }

    #[test]
    fn a_stop_sequence_is_told_from_an_end_token() {
        let stop = ["END".to_string()];
        // The test outcome ends with an end token (context = prompt + generated + 1).
        let (reason, which) = stop_reason(&outcome("x"), &stop);
        assert_eq!((reason.as_str(), which), ("end_turn", None));
        let mut by_sequence = outcome("x");
        by_sequence.finished.context.pop();
        let (reason, which) = stop_reason(&by_sequence, &stop);
        assert_eq!(
            (reason.as_str(), which.as_deref()),
            ("stop_sequence", Some("END"))
        );
        let two = ["A".to_string(), "B".to_string()];
        assert_eq!(stop_reason(&by_sequence, &two).1, None);
    }

    #[test]
    fn a_stream_opens_streams_text_then_tool_use_and_stops() {
        let mut stream = MessageStream::new("m", Vec::new());
        let mut bytes = stream.head().to_vec();
        bytes.extend_from_slice(&stream.text("Su"));
        bytes.extend_from_slice(&stream.tail(&tool_outcome("re.")));
        let events = events(&bytes);
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        assert_eq!(events[0].1["message"]["content"], json!([]));
        assert_eq!(
            events[1].1["content_block"],
            json!({"type": "text", "text": ""})
        );
        assert_eq!(
            events[3].1["delta"],
            json!({"type": "text_delta", "text": "re."})
        );
        assert_eq!(events[4].1["index"], 0);
        assert_eq!(
            events[5].1["content_block"],
            json!({"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}})
        );
        assert_eq!(events[6].1["index"], 1);
        assert_eq!(
            events[6].1["delta"],
            json!({"type": "input_json_delta", "partial_json": "{\"city\":\"Paris\"}"})
        );
        assert_eq!(
            events[8].1["delta"],
            json!({"stop_reason": "tool_use", "stop_sequence": null})
        );
        assert_eq!(events[8].1["usage"]["output_tokens"], 2);
        assert_eq!(events[8].1["usage"]["input_tokens"], 3);
    }

    #[test]
    fn an_error_mid_stream_is_an_error_event() {
        let mut stream = MessageStream::new("m", Vec::new());
        let events = events(&stream.error(ApiError::Internal("boom".into())));
        assert_eq!(
            events[0].1,
            json!({"type": "error", "error": {"type": "api_error", "message": "boom"}})
        );
    }
}
