//! OpenAI's Responses API (`POST /v1/responses`): translation only, into the
//! one [`InferRequest`] path, as Ollama serves it (`openai/responses.go`).
//!
//! `input` is a string (one user message) or a list of items: messages
//! (`input_text`/`output_text` parts, or a string), `function_call` items
//! (the assistant's earlier calls) and `function_call_output` items (their
//! results). `instructions` become a leading system message; `tools` are
//! function tools in the flat Responses shape (`{"type": "function", "name",
//! "parameters"}`); `text.format` `json_schema`/`json_object` constrain the
//! reply with a grammar.
//!
//! Nothing is stored: `previous_response_id`, `conversation` and `background`
//! are a 400 (send the whole conversation in `input`); `store` is ignored and
//! every response says `"store": false`.
//!
//! A reply cut by `max_output_tokens` has `status: "incomplete"` and
//! `incomplete_details.reason: "max_output_tokens"`; streamed, it still ends
//! with `response.completed` (what the SDKs wait for), carrying that status.
//! Streams are SSE `event: <type>\ndata: {json}\n\n`, each event with its
//! `type` and a `sequence_number` counting from 0.
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use hypura_chat::ChatMessage;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use utoipa::ToSchema;

use super::SseEvents;
use crate::api::dialect::openai::{openai_tool_calls, OpenAiSampling};
use crate::core::backend::FinishReason;
use crate::core::error::{ApiError, OpenAiError};
use crate::core::infer::{infer, Answer, Generation, Outcome};
use crate::core::request::{Constraint, InferRequest, Prompt, ToolRequest};
use crate::core::structured::{self, ToolChoice};
use crate::core::validation::{self, parse_json, ModelName, ValidationError};
use crate::server::body_bytes;
use crate::state::AppState;

type Result<T> = std::result::Result<T, OpenAiError>;

// ---------------------------------------------------------------------------------------------
// Types
// ---------------------------------------------------------------------------------------------

/// `input`: a string (one user message) or a list of items.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged, expecting = "expected a string or an array of input items")]
pub enum ResponsesInput {
    Text(String),
    #[schema(value_type = Vec<Object>)]
    Items(Vec<Value>),
}

/// `text`: how the reply is written.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
pub struct TextConfig {
    /// `{"type": "text"}` (default), `{"type": "json_object"}` or
    /// `{"type": "json_schema", "name", "schema", "strict"}` (the schema is
    /// always enforced by a grammar, `strict` or not).
    #[schema(value_type = Object)]
    pub format: Option<Value>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct ResponsesRequest {
    pub model: String,
    #[schema(value_type = Object)]
    pub input: Option<ResponsesInput>,
    /// A system message before the input.
    pub instructions: Option<String>,
    pub stream: Option<bool>,
    /// Most tokens to generate.
    #[serde(
        default,
        deserialize_with = "crate::core::validation::integral::option"
    )]
    pub max_output_tokens: Option<u32>,
    /// Default 1.0; 0 is greedy.
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub text: Option<TextConfig>,
    /// Function tools: `{"type": "function", "name", "description", "parameters"}`.
    #[schema(value_type = Vec<Object>)]
    pub tools: Option<Vec<Value>>,
    /// `"auto"` (default), `"none"`, `"required"` or `{"type": "function", "name"}`.
    #[schema(value_type = Object)]
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// Not supported (nothing is stored): a 400.
    pub previous_response_id: Option<String>,
    /// Ignored: nothing is stored.
    pub store: Option<bool>,
    /// Not supported: a 400 when true.
    pub background: Option<bool>,
    /// Not supported: a 400.
    #[schema(value_type = Object)]
    pub conversation: Option<Value>,
    /// Echoed in the response.
    #[schema(value_type = Object)]
    pub metadata: Option<Value>,
    /// hypura (llama-server's field): false reads the whole prompt and keeps
    /// no KV of it. Default true.
    pub cache_prompt: Option<bool>,
}

/// One part of an output message: always `output_text`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct OutputText {
    /// `output_text`.
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
    #[schema(value_type = Vec<Object>)]
    pub annotations: Vec<Value>,
    #[schema(value_type = Vec<Object>)]
    pub logprobs: Vec<Value>,
}

/// An item of `output`: the assistant's message, or one function call.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    Message {
        id: String,
        /// `in_progress` or `completed`.
        status: String,
        role: String,
        content: Vec<OutputText>,
    },
    FunctionCall {
        id: String,
        status: String,
        /// What a `function_call_output` item answers.
        call_id: String,
        name: String,
        /// The arguments as JSON text.
        arguments: String,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ResponsesUsage {
    pub input_tokens: usize,
    pub output_tokens: usize,
    pub total_tokens: usize,
    /// `{"cached_tokens"}`: prompt tokens a cache held.
    #[schema(value_type = Object)]
    pub input_tokens_details: Value,
    /// `{"reasoning_tokens": 0}`.
    #[schema(value_type = Object)]
    pub output_tokens_details: Value,
}

/// A response object: the whole reply, or its state in a stream event.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ResponseObject {
    #[schema(example = "resp_1a2b3c")]
    pub id: String,
    /// `response`.
    pub object: String,
    /// Unix seconds.
    pub created_at: u64,
    pub completed_at: Option<u64>,
    /// `in_progress`, `completed` or `incomplete` (cut by `max_output_tokens`).
    pub status: String,
    /// `{"reason": "max_output_tokens"}` when incomplete.
    #[schema(value_type = Object)]
    pub incomplete_details: Option<Value>,
    pub model: String,
    /// Always null: nothing is stored.
    pub previous_response_id: Option<String>,
    pub instructions: Option<String>,
    pub output: Vec<OutputItem>,
    #[schema(value_type = Object)]
    pub error: Option<Value>,
    #[schema(value_type = Vec<Object>)]
    pub tools: Vec<Value>,
    #[schema(value_type = Object)]
    pub tool_choice: Value,
    pub parallel_tool_calls: bool,
    pub truncation: String,
    /// `{"format": …}` as asked.
    #[schema(value_type = Object)]
    pub text: Value,
    pub temperature: f32,
    pub top_p: f32,
    pub max_output_tokens: Option<u32>,
    /// Always false.
    pub store: bool,
    pub background: bool,
    #[schema(value_type = Object)]
    pub metadata: Value,
    pub usage: Option<ResponsesUsage>,
}

// ---------------------------------------------------------------------------------------------
// Translation in
// ---------------------------------------------------------------------------------------------

/// An input item, by its `type` (a message may omit it).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum InputItem {
    Message {
        role: String,
        content: MessageContent,
    },
    FunctionCall {
        call_id: String,
        name: String,
        #[serde(default)]
        arguments: String,
    },
    FunctionCallOutput {
        call_id: String,
        output: MessageContent,
    },
    /// An earlier reply's reasoning: nothing here thinks aloud, so it is dropped.
    Reasoning {},
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

fn bad(message: String) -> OpenAiError {
    ApiError::BadRequest(message).into()
}

/// A message's text; `where_` names it in errors (`input[2]`).
fn content_text(content: &MessageContent, where_: &str) -> Result<String> {
    let parts = match content {
        MessageContent::Text(text) => return Ok(text.clone()),
        MessageContent::Parts(parts) => parts,
    };
    let mut text = String::new();
    for (i, part) in parts.iter().enumerate() {
        match part.kind.as_str() {
            "input_text" | "output_text" | "text" => {
                text.push_str(part.text.as_deref().unwrap_or_default())
            }
            "refusal" => {}
            "input_image" => {
                return Err(bad(format!(
                    "{where_}.content[{i}]: this model does not support images"
                )))
            }
            "input_file" => {
                return Err(bad(format!(
                "{where_}.content[{i}]: file inputs are not supported: send the text as input_text"
            )))
            }
            other => {
                return Err(bad(format!(
                    "{where_}.content[{i}]: unknown content type {other:?}: use input_text"
                )))
            }
        }
    }
    Ok(text)
}

/// `input` and `instructions` → the conversation. Consecutive function calls
/// join the assistant message before them, as one turn with several calls.
pub fn input_messages(
    input: Option<&ResponsesInput>,
    instructions: Option<&str>,
) -> Result<Vec<ChatMessage>> {
    let mut messages = Vec::new();
    if let Some(instructions) = instructions.filter(|i| !i.is_empty()) {
        messages.push(ChatMessage::new("system", instructions));
    }
    let items = match input {
        None => return Err(ValidationError::MissingField("input".into()).into()),
        Some(ResponsesInput::Text(text)) => {
            messages.push(ChatMessage::new("user", text.as_str()));
            return Ok(messages);
        }
        // OpenAI names `input` (hypura's `messages` is internal).
        Some(ResponsesInput::Items(items)) if items.is_empty() => {
            return Err(ValidationError::EmptyInput.into())
        }
        Some(ResponsesInput::Items(items)) => items,
    };
    for (i, item) in items.iter().enumerate() {
        let where_ = format!("input[{i}]");
        let mut item = item.clone();
        // `{"role", "content"}` without a type is a message.
        if let Some(object) = item.as_object_mut() {
            if !object.contains_key("type") && object.contains_key("role") {
                object.insert("type".into(), "message".into());
            }
        }
        let item: InputItem = serde_json::from_value(item).map_err(|e| {
            bad(format!(
                "{where_}: {e}: items are messages, function_call or function_call_output"
            ))
        })?;
        match item {
            InputItem::Message { role, content } => {
                let text = content_text(&content, &where_)?;
                validation::check_role(i, &role, validation::OPENAI_ROLES)
                    .map_err(ApiError::from)?;
                messages.push(ChatMessage::new(role, text));
            }
            InputItem::FunctionCall {
                call_id,
                name,
                arguments,
            } => {
                let arguments = if arguments.is_empty() {
                    "{}".into()
                } else {
                    arguments
                };
                let call = json!({"id": call_id, "type": "function",
                    "function": {"name": name, "arguments": arguments}});
                push_call(&mut messages, call);
            }
            InputItem::FunctionCallOutput { call_id, output } => {
                let mut message = ChatMessage::new("tool", content_text(&output, &where_)?);
                message.tool_call_id = Some(call_id);
                messages.push(message);
            }
            InputItem::Reasoning {} => {}
        }
    }
    if messages.is_empty() {
        return Err(ApiError::from(ValidationError::EmptyInput).into());
    }
    Ok(messages)
}

/// Adds a call to the last assistant message, or starts one.
fn push_call(messages: &mut Vec<ChatMessage>, call: Value) {
    if let Some(last) = messages.last_mut().filter(|m| m.role == "assistant") {
        match last.tool_calls.as_mut().and_then(Value::as_array_mut) {
            Some(calls) => calls.push(call),
            None => last.tool_calls = Some(Value::Array(vec![call])),
        }
        return;
    }
    let mut message = ChatMessage::new("assistant", "");
    message.tool_calls = Some(Value::Array(vec![call]));
    messages.push(message);
}

/// A flat Responses tool → the chat shape (`{"type": "function", "function": {…}}`).
/// Tools already in the chat shape pass as they are.
pub fn chat_tool(tool: &Value, index: usize) -> Result<Value> {
    let kind = tool.get("type").and_then(Value::as_str);
    if kind != Some("function") {
        return Err(bad(format!(
            "tools[{index}]: only function tools are supported, got type {}",
            tool.get("type").unwrap_or(&Value::Null)
        )));
    }
    if tool.get("function").is_some() {
        return Ok(tool.clone());
    }
    let mut function = tool.as_object().cloned().unwrap_or_default();
    function.remove("type");
    Ok(json!({"type": "function", "function": function}))
}

/// `tool_choice`: `{"type": "function", "name"}` is the flat form of the chat one.
pub fn tool_choice(choice: Option<&Value>) -> Result<ToolChoice> {
    let flat = choice
        .filter(|c| c.get("type").and_then(Value::as_str) == Some("function"))
        .and_then(|c| c.get("name"))
        .map(|name| json!({"type": "function", "function": {"name": name}}));
    Ok(ToolChoice::parse(flat.as_ref().or(choice))?)
}

/// `text.format` → the constraint.
pub fn text_format(format: Option<&Value>) -> Result<Option<Constraint>> {
    let Some(format) = format.filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Constraint::JsonObject)),
        Some("json_schema") => {
            let schema = format
                .get("schema")
                .filter(|s| !s.is_null())
                .ok_or_else(|| {
                    bad(
                        "text.format.schema is required with \"type\": \"json_schema\": give \
                         the JSON Schema the reply must follow"
                            .into(),
                    )
                })?;
            Ok(Some(structured::schema_constraint(
                schema,
                "text.format.schema",
            )?))
        }
        _ => Err(bad(format!(
            "invalid text.format {format}: \"type\" must be \"text\", \"json_object\" or \
             \"json_schema\""
        ))),
    }
}

/// Refuses what needs stored responses.
fn nothing_stored(request: &ResponsesRequest) -> Result<()> {
    let refusal = if request.previous_response_id.is_some() {
        Some("previous_response_id")
    } else if request.conversation.as_ref().is_some_and(|c| !c.is_null()) {
        Some("conversation")
    } else if request.background == Some(true) {
        Some("background")
    } else {
        None
    };
    match refusal {
        Some(field) => Err(bad(format!(
            "{field} is not supported: this server stores no responses; send the whole \
             conversation in input"
        ))),
        None => Ok(()),
    }
}

/// `/v1/responses` → an [`InferRequest`].
pub fn responses_request(request: &ResponsesRequest) -> Result<InferRequest> {
    let name = ModelName::parse(&request.model, "model")?;
    nothing_stored(request)?;
    let format = request.text.as_ref().and_then(|t| t.format.as_ref());
    let constraint = text_format(format)?;
    let choice = tool_choice(request.tool_choice.as_ref())?;
    let definitions = request
        .tools
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, tool)| chat_tool(tool, i))
        .collect::<Result<Vec<_>>>()?;
    let messages = input_messages(request.input.as_ref(), request.instructions.as_deref())?;
    let sampling = OpenAiSampling {
        temperature: request.temperature,
        top_p: request.top_p,
        seed: None,
        frequency_penalty: None,
        presence_penalty: None,
        max_tokens: request.max_output_tokens,
        stop: None,
    };
    let mut params = sampling.to_params()?;
    params.constraint = constraint;
    params.skip_prompt_cache = request.cache_prompt == Some(false);
    let mut infer = InferRequest::new(&request.model, name, Prompt::messages(messages), params);
    infer.tools = Some(ToolRequest {
        definitions,
        choice,
        parallel: request.parallel_tool_calls.unwrap_or(true),
    });
    Ok(infer)
}

// ---------------------------------------------------------------------------------------------
// Translation out
// ---------------------------------------------------------------------------------------------

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn output_text(text: &str) -> OutputText {
    OutputText {
        kind: "output_text".into(),
        text: text.to_string(),
        annotations: Vec::new(),
        logprobs: Vec::new(),
    }
}

fn message_item(id: &str, status: &str, content: Vec<OutputText>) -> OutputItem {
    OutputItem::Message {
        id: id.to_string(),
        status: status.into(),
        role: "assistant".into(),
        content,
    }
}

/// The reply's function calls as output items.
fn call_items(outcome: &Outcome) -> Vec<OutputItem> {
    let calls = outcome
        .reply
        .as_ref()
        .map(|r| openai_tool_calls(&r.tool_calls, false))
        .unwrap_or_default();
    calls
        .into_iter()
        .map(|call| OutputItem::FunctionCall {
            id: structured::unique_id("fc_"),
            status: "completed".into(),
            call_id: call["id"].as_str().unwrap_or_default().to_string(),
            name: call["function"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            arguments: call["function"]["arguments"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        })
        .collect()
}

fn usage(outcome: &Outcome) -> ResponsesUsage {
    let finished = &outcome.finished;
    ResponsesUsage {
        input_tokens: finished.prompt_tokens,
        output_tokens: finished.generated_tokens,
        total_tokens: finished.prompt_tokens + finished.generated_tokens,
        input_tokens_details: json!({
            "cached_tokens": finished.prompt_tokens.saturating_sub(finished.prompt_eval_tokens)
        }),
        output_tokens_details: json!({"reasoning_tokens": 0}),
    }
}

/// What a response echoes of its request; the response object in progress.
#[derive(Debug, Clone)]
pub struct Echo(ResponseObject);

impl Echo {
    pub fn new(request: &ResponsesRequest) -> Echo {
        let format = request
            .text
            .as_ref()
            .and_then(|t| t.format.clone())
            .filter(|f| !f.is_null())
            .unwrap_or_else(|| json!({"type": "text"}));
        Echo(ResponseObject {
            id: structured::unique_id("resp_"),
            object: "response".into(),
            created_at: unix_now(),
            completed_at: None,
            status: "in_progress".into(),
            incomplete_details: None,
            model: request.model.clone(),
            previous_response_id: None,
            instructions: request.instructions.clone(),
            output: Vec::new(),
            error: None,
            tools: request.tools.clone().unwrap_or_default(),
            tool_choice: request.tool_choice.clone().unwrap_or_else(|| json!("auto")),
            parallel_tool_calls: request.parallel_tool_calls.unwrap_or(true),
            truncation: "disabled".into(),
            text: json!({ "format": format }),
            temperature: request.temperature.unwrap_or(1.0),
            top_p: request.top_p.unwrap_or(1.0),
            max_output_tokens: request.max_output_tokens,
            store: false,
            background: false,
            metadata: request.metadata.clone().unwrap_or_else(|| json!({})),
            usage: None,
        })
    }

    /// The finished response with `output`.
    fn finished(&self, outcome: &Outcome, output: Vec<OutputItem>) -> ResponseObject {
        let cut = outcome.finished.finish_reason == FinishReason::Length;
        ResponseObject {
            completed_at: Some(unix_now()),
            status: if cut { "incomplete" } else { "completed" }.into(),
            incomplete_details: cut.then(|| json!({"reason": "max_output_tokens"})),
            output,
            usage: Some(usage(outcome)),
            ..self.0.clone()
        }
    }
}

/// A whole response (`stream` unset or false).
pub fn response_object(echo: &Echo, outcome: &Outcome) -> ResponseObject {
    let content = match &outcome.reply {
        Some(reply) => reply.content.as_str(),
        None => outcome.text.as_str(),
    };
    let calls = call_items(outcome);
    let mut output = Vec::new();
    if !content.is_empty() || calls.is_empty() {
        let id = structured::unique_id("msg_");
        output.push(message_item(&id, "completed", vec![output_text(content)]));
    }
    output.extend(calls);
    echo.finished(outcome, output)
}

/// The events of one streamed response, numbered in order.
pub struct ResponseStream {
    echo: Echo,
    sequence_number: u64,
    message_id: String,
    /// The message's text so far; `None` until the message item is added.
    text: Option<String>,
}

impl ResponseStream {
    pub fn new(echo: Echo) -> Self {
        ResponseStream {
            echo,
            sequence_number: 0,
            message_id: structured::unique_id("msg_"),
            text: None,
        }
    }

    fn event(&mut self, kind: &str, mut data: Value) -> Vec<u8> {
        data["type"] = kind.into();
        data["sequence_number"] = self.sequence_number.into();
        self.sequence_number += 1;
        format!("event: {kind}\ndata: {data}\n\n").into_bytes()
    }

    fn response_event(&mut self, kind: &str, response: &ResponseObject) -> Vec<u8> {
        let response = serde_json::to_value(response).unwrap_or(Value::Null);
        self.event(kind, json!({ "response": response }))
    }

    /// `response.created` and `response.in_progress`.
    pub fn head(&mut self) -> Bytes {
        let response = self.echo.0.clone();
        let mut out = self.response_event("response.created", &response);
        out.extend(self.response_event("response.in_progress", &response));
        Bytes::from(out)
    }

    fn item_done(&mut self, index: usize, item: &OutputItem) -> Vec<u8> {
        let item = serde_json::to_value(item).unwrap_or(Value::Null);
        self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        )
    }

    /// A whole function call: added, its arguments in one delta, done.
    fn call_events(&mut self, index: usize, call: &OutputItem) -> Vec<u8> {
        let OutputItem::FunctionCall { id, arguments, .. } = call else {
            return Vec::new();
        };
        let mut added = serde_json::to_value(call).unwrap_or(Value::Null);
        added["status"] = "in_progress".into();
        added["arguments"] = "".into();
        let at = json!({"item_id": id, "output_index": index});
        let mut out = self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": added}),
        );
        let mut delta = at.clone();
        delta["delta"] = arguments.as_str().into();
        out.extend(self.event("response.function_call_arguments.delta", delta));
        let mut done = at;
        done["arguments"] = arguments.as_str().into();
        out.extend(self.event("response.function_call_arguments.done", done));
        out.extend(self.item_done(index, call));
        out
    }
}

impl SseEvents for ResponseStream {
    /// A piece of the message's text (the message and its part added first).
    fn text(&mut self, delta: &str) -> Bytes {
        let mut out = Vec::new();
        if self.text.is_none() {
            self.text = Some(String::new());
            let item = message_item(&self.message_id, "in_progress", Vec::new());
            let item = serde_json::to_value(item).unwrap_or(Value::Null);
            out.extend(self.event(
                "response.output_item.added",
                json!({"output_index": 0, "item": item}),
            ));
            out.extend(self.event(
                "response.content_part.added",
                json!({"item_id": self.message_id, "output_index": 0, "content_index": 0,
                    "part": output_text("")}),
            ));
        }
        if let Some(text) = self.text.as_mut() {
            text.push_str(delta);
        }
        out.extend(self.event(
            "response.output_text.delta",
            json!({"item_id": self.message_id, "output_index": 0, "content_index": 0,
                "delta": delta, "logprobs": []}),
        ));
        Bytes::from(out)
    }

    /// What the tool filter held back, the message closed, each function
    /// call, and `response.completed`.
    fn tail(&mut self, outcome: &Outcome) -> Bytes {
        let mut out = Vec::new();
        let calls = call_items(outcome);
        let held = outcome.reply.as_ref().map_or("", |r| r.content.as_str());
        if !held.is_empty() || (self.text.is_none() && calls.is_empty()) {
            out.extend_from_slice(&self.text(held));
        }
        let mut output = Vec::new();
        if let Some(text) = self.text.clone() {
            let item = message_item(&self.message_id, "completed", vec![output_text(&text)]);
            let at = json!({"item_id": self.message_id, "output_index": 0, "content_index": 0});
            let mut done = at.clone();
            done["text"] = text.clone().into();
            done["logprobs"] = json!([]);
            out.extend(self.event("response.output_text.done", done));
            let mut part = at;
            part["part"] = serde_json::to_value(output_text(&text)).unwrap_or(Value::Null);
            out.extend(self.event("response.content_part.done", part));
            out.extend(self.item_done(0, &item));
            output.push(item);
        }
        for call in calls {
            let index = output.len();
            out.extend(self.call_events(index, &call));
            output.push(call);
        }
        let response = self.echo.finished(outcome, output);
        out.extend(self.response_event("response.completed", &response));
        Bytes::from(out)
    }

    /// A failure mid-stream: one `error` event (the SDKs raise it).
    fn error(&mut self, e: ApiError) -> Bytes {
        let body = e.openai_body();
        let data = json!({"code": body["error"]["type"], "message": e.to_string(),
            "param": null, "error": body["error"]});
        Bytes::from(self.event("error", data))
    }
}

fn stream(generation: Generation, mut events: ResponseStream) -> Response {
    let first = events.head();
    super::sse_stream(first, generation, events)
}

// ---------------------------------------------------------------------------------------------
// Handler
// ---------------------------------------------------------------------------------------------

/// A reply in the Responses API's shape, whole or streamed as SSE events.
#[utoipa::path(post, path = "/v1/responses", tag = "openai", request_body = ResponsesRequest,
    responses(
        (status = 200, description = "A response, or SSE events (response.created … response.completed) with stream: true", body = ResponseObject),
        (status = 400, body = crate::core::error::OpenAiErrorBody),
        (status = 404, body = crate::core::error::OpenAiErrorBody)))]
pub async fn create_response(
    State(state): State<AppState>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let arrived = Instant::now();
    let request: ResponsesRequest = parse_json(&body_bytes(body)?)?;
    let infer_request = responses_request(&request)?;
    let generation = match infer(&state.inference, infer_request, arrived).await? {
        Answer::Generating(generation) => *generation,
        Answer::Loaded { .. } => {
            return Err(
                ApiError::Internal("a request without a prompt reached generation".into()).into(),
            )
        }
    };
    let echo = Echo::new(&request);
    if request.stream.unwrap_or(false) {
        return Ok(stream(generation, ResponseStream::new(echo)));
    }
    let outcome = generation.collect().await?;
    Ok(Json(response_object(&echo, &outcome)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::infer::testing::{
        named_sse_events as events, outcome, prompt_messages as messages, tool_outcome,
    };

    fn request(value: Value) -> ResponsesRequest {
        parse_json(value.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn a_string_input_is_one_user_message_after_the_instructions() {
        let infer = responses_request(&request(json!({"model": "m", "input": "Hi",
            "instructions": "Be brief.", "max_output_tokens": 7, "temperature": 0,
            "top_p": 0.5})))
        .unwrap();
        assert_eq!(
            messages(&infer),
            [
                ChatMessage::new("system", "Be brief."),
                ChatMessage::new("user", "Hi")
            ]
        );
        let params = &infer.backend.params;
        assert_eq!(params.max_tokens, Some(7));
        assert_eq!(params.sampling.temperature, 0.0);
        assert_eq!(params.sampling.top_p, 0.5);
        assert!(params.constraint.is_none());
    }

    #[test]
    fn items_become_messages_calls_and_tool_results() {
        let infer = responses_request(&request(json!({"model": "m", "input": [
            {"role": "developer", "content": "Use tools."},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "Weather in "}, {"type": "input_text", "text": "Rome?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                "arguments": "{\"city\":\"Rome\"}"},
            {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "21 C"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Warm."}]},
        ]}))).unwrap();
        let m = messages(&infer);
        assert_eq!(m.len(), 5, "{m:?}");
        assert_eq!(m[0], ChatMessage::new("developer", "Use tools."));
        assert_eq!(m[1], ChatMessage::new("user", "Weather in Rome?"));
        assert_eq!(
            (m[2].role.as_str(), m[2].content.as_str()),
            ("assistant", "")
        );
        assert_eq!(
            m[2].tool_calls,
            Some(json!([
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}},
                {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
            ]))
        );
        assert_eq!(
            (m[3].role.as_str(), m[3].content.as_str()),
            ("tool", "21 C")
        );
        assert_eq!(m[3].tool_call_id.as_deref(), Some("call_1"));
        assert_eq!(m[4], ChatMessage::new("assistant", "Warm."));
    }

    #[test]
    fn flat_tools_and_tool_choice_take_the_chat_shape() {
        let infer = responses_request(&request(json!({"model": "m", "input": "x",
            "tools": [{"type": "function", "name": "get_weather", "description": "Weather",
                "parameters": {"type": "object"}, "strict": true}],
            "tool_choice": {"type": "function", "name": "get_weather"}})))
        .unwrap();
        let tools = infer.tools.unwrap();
        assert_eq!(
            tools.definitions,
            [
                json!({"type": "function", "function": {"name": "get_weather",
                "description": "Weather", "parameters": {"type": "object"}, "strict": true}})
            ]
        );
        assert_eq!(tools.choice, ToolChoice::Function("get_weather".into()));
        assert_eq!(
            tool_choice(Some(&json!("required"))).unwrap(),
            ToolChoice::Required
        );
        assert_eq!(tool_choice(None).unwrap(), ToolChoice::Auto);
    }

    #[test]
    fn a_json_schema_text_format_becomes_a_grammar() {
        let schema = json!({"type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"]});
        let infer = responses_request(&request(json!({"model": "m", "input": "x",
            "text": {"format": {"type": "json_schema", "name": "c", "schema": schema}}})))
        .unwrap();
        let constraint = infer.backend.params.constraint.unwrap();
        let grammar = structured::constraint_grammar(&constraint).unwrap();
        assert!(grammar.contains("city"), "{grammar}");
        let object = text_format(Some(&json!({"type": "json_object"}))).unwrap();
        assert_eq!(object, Some(Constraint::JsonObject));
        assert_eq!(text_format(Some(&json!({"type": "text"}))).unwrap(), None);
    }

    #[test]
    fn what_cannot_be_done_is_a_400_that_says_why() {
        for (body, message) in [
            (json!({"model": "m"}), "input is required"),
            (json!({"model": "m", "input": "x", "previous_response_id": "resp_1"}),
                "previous_response_id is not supported: this server stores no responses; send the whole conversation in input"),
            (json!({"model": "m", "input": "x", "background": true}),
                "background is not supported: this server stores no responses; send the whole conversation in input"),
            (json!({"model": "m", "input": [{"type": "message", "role": "user",
                "content": [{"type": "input_image", "image_url": "x"}]}]}),
                "input[0].content[0]: this model does not support images"),
            (json!({"model": "m", "input": [{"type": "web_search_call"}]}),
                "input[0]: unknown variant `web_search_call`, expected one of `message`, `function_call`, `function_call_output`, `reasoning`: items are messages, function_call or function_call_output"),
            (json!({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}),
                "tools[0]: only function tools are supported, got type \"web_search\""),
            (json!({"model": "m", "input": "x", "text": {"format": {"type": "json_schema"}}}),
                "text.format.schema is required with \"type\": \"json_schema\": give the JSON Schema the reply must follow"),
            (json!({"model": "m", "input": "x", "temperature": 5}),
                "temperature must be between 0 and 2, got 5"),
        ] {
            let e = responses_request(&request(body)).err().unwrap();
            assert_eq!(e.0.status(), axum::http::StatusCode::BAD_REQUEST);
            assert_eq!(e.0.to_string(), message);
        }
    }

    #[test]
    fn a_whole_response_has_one_message_or_the_calls() {
        let echo = Echo::new(&request(
            json!({"model": "m", "input": "x", "instructions": "I"}),
        ));
        let r = serde_json::to_value(response_object(&echo, &outcome("Hello"))).unwrap();
        assert!(r["id"].as_str().unwrap().starts_with("resp_"));
        assert_eq!(r["object"], "response");
        assert_eq!(r["status"], "completed");
        assert_eq!(r["instructions"], "I");
        assert_eq!(r["store"], false);
        assert_eq!(r["text"], json!({"format": {"type": "text"}}));
        assert_eq!(r["output"].as_array().unwrap().len(), 1);
        let message = &r["output"][0];
        assert_eq!(message["type"], "message");
        assert_eq!(message["role"], "assistant");
        assert_eq!(message["status"], "completed");
        assert_eq!(
            message["content"],
            json!([{"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []}])
        );
        assert_eq!(
            r["usage"],
            json!({"input_tokens": 3, "output_tokens": 2, "total_tokens": 5,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0}})
        );

        let r = serde_json::to_value(response_object(&echo, &tool_outcome(""))).unwrap();
        let output = r["output"].as_array().unwrap();
        assert_eq!(output.len(), 1, "{r}");
        assert_eq!(output[0]["type"], "function_call");
        assert_eq!(output[0]["call_id"], "call_1");
        assert_eq!(output[0]["name"], "get_weather");
        assert_eq!(output[0]["arguments"], "{\"city\":\"Paris\"}");
        assert!(output[0]["id"].as_str().unwrap().starts_with("fc_"));

        let mut cut = outcome("Hel");
        cut.finished.finish_reason = FinishReason::Length;
        let r = serde_json::to_value(response_object(&echo, &cut)).unwrap();
        assert_eq!(r["status"], "incomplete");
        assert_eq!(
            r["incomplete_details"],
            json!({"reason": "max_output_tokens"})
        );
    }

    #[test]
    fn a_stream_adds_the_message_streams_its_text_and_completes() {
        let echo = Echo::new(&request(json!({"model": "m", "input": "x"})));
        let mut stream = ResponseStream::new(echo);
        let mut bytes = stream.head().to_vec();
        bytes.extend_from_slice(&stream.text("Hel"));
        bytes.extend_from_slice(&stream.text("lo"));
        bytes.extend_from_slice(&stream.tail(&outcome("Hello")));
        let events = events(&bytes);
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let numbers: Vec<u64> = events
            .iter()
            .map(|(_, d)| d["sequence_number"].as_u64().unwrap())
            .collect();
        assert_eq!(numbers, (0..10).collect::<Vec<u64>>());
        assert_eq!(events[0].1["response"]["status"], "in_progress");
        assert_eq!(events[4].1["delta"], "Hel");
        assert_eq!(events[6].1["text"], "Hello");
        let completed = &events[9].1["response"];
        assert_eq!(completed["status"], "completed");
        assert_eq!(completed["id"], events[0].1["response"]["id"]);
        assert_eq!(completed["output"][0]["content"][0]["text"], "Hello");
        assert_eq!(completed["output"][0]["id"], events[2].1["item"]["id"]);
        assert_eq!(completed["usage"]["total_tokens"], 5);
    }

    #[test]
    fn a_streamed_call_comes_as_function_call_events() {
        let echo = Echo::new(&request(json!({"model": "m", "input": "x"})));
        let mut stream = ResponseStream::new(echo);
        let mut bytes = stream.head().to_vec();
        bytes.extend_from_slice(&stream.tail(&tool_outcome("")));
        let events = events(&bytes);
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        assert_eq!(events[2].1["item"]["type"], "function_call");
        assert_eq!(events[2].1["item"]["arguments"], "");
        assert_eq!(events[3].1["delta"], "{\"city\":\"Paris\"}");
        let output = &events[6].1["response"]["output"];
        assert_eq!(output.as_array().unwrap().len(), 1);
        assert_eq!(output[0]["name"], "get_weather");
        assert_eq!(output[0]["id"], events[2].1["item"]["id"]);
    }

    #[test]
    fn an_error_mid_stream_is_an_error_event() {
        let echo = Echo::new(&request(json!({"model": "m", "input": "x"})));
        let mut stream = ResponseStream::new(echo);
        let events = events(&stream.error(ApiError::Internal("boom".into())));
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].1["message"], "boom");
        assert_eq!(events[0].1["error"]["message"], "boom");
    }
}
