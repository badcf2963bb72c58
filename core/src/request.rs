//! The dialect-neutral requests every API family translates into.
//!
//! An [`InferRequest`] holds everything a generation needs and nothing of the
//! wire format it came in: the Ollama and OpenAI routes both build one, it is
//! validated once ([`crate::infer::infer`] checks it against the model's
//! facts), and the part a model needs ([`BackendRequest`]) crosses the
//! [`crate::backend::ModelBackend`] boundary. Every type here is
//! serializable so a runner process or a remote backend can take it as is.
use hypura_chat::ChatMessage;
use llama_tiered::llama::SamplingParams;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::structured::ToolChoice;
/// Embedding `input` on Ollama's routes: a string or several (the shape of `stop`).
pub use super::validation::StopSpec as EmbedInput;
use super::validation::{KeepAlive, ModelName};

/// What to generate after: the backend renders templates and tokenizes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Prompt {
    /// No prompt: load the model (or unload it with a zero keep-alive).
    Load,
    /// A conversation, rendered with the model's chat template (or
    /// `template_override`, a Jinja chat template).
    Messages {
        messages: Vec<ChatMessage>,
        /// An OpenAI `tools` array for the template (`None`: no tools take part).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tools: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        template_override: Option<String>,
        /// Extra template variables (`enable_thinking`).
        #[serde(default, skip_serializing_if = "Map::is_empty")]
        template_extra: Map<String, Value>,
    },
    /// Text tokenized as is (BOS added when the model wants it, special-token text parsed).
    Text { text: String },
    /// Token ids, submitted unchanged.
    Tokens(Vec<i32>),
}

impl Prompt {
    /// A conversation without tools, override or extra variables.
    pub fn messages(messages: Vec<ChatMessage>) -> Prompt {
        Prompt::Messages {
            messages,
            tools: None,
            template_override: None,
            template_extra: Map::new(),
        }
    }
}

/// What the reply must be, as data: a local backend makes it a grammar
/// for llama.cpp ([`crate::structured::constraint_grammar`]), an
/// upstream passes it on in its own dialect (`format`, `response_format`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Constraint {
    /// Any JSON object (Ollama's `"json"`, OpenAI's `json_object`).
    JsonObject,
    /// A JSON Schema, already checked against the rules and bounds of
    /// [`crate::structured`] (its conversion's cost included).
    JsonSchema {
        schema: Value,
        /// The request field it came in, for errors (`format`,
        /// `response_format.json_schema.schema`).
        field: String,
    },
    /// A grammar in llama.cpp's GBNF, made from the request's tools for the
    /// local model's template (a forced call, or the generic tool format).
    Grammar(String),
}

/// How to sample and when to stop, checked ([`crate::validation`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerationParams {
    /// Temperature, top-k/p, penalties, seed; its grammar is set only by a
    /// local backend, from `constraint`, right before the engine.
    pub sampling: SamplingParams,
    /// What the reply must be (`format`, `response_format`, a forced tool
    /// call), as data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraint: Option<Constraint>,
    /// For a model another server runs: the request's `tool_choice` and
    /// `parallel_tool_calls`, passed on with its tools (for a local model
    /// the tools are in the prompt and a forced call is a grammar).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<(ToolChoice, bool)>,
    /// Most tokens to generate (`None`: until the context is full).
    pub max_tokens: Option<u32>,
    /// Generation ends before the first of these strings (not returned).
    pub stop: Vec<String>,
    /// Context window for this request, in tokens (`None`: the model's
    /// per-sequence context). A larger one than the model is loaded with
    /// reloads it with that context, up to its training context (the pool
    /// does, asked through [`crate::models::LeaseRequest::context`]).
    pub num_ctx: Option<u32>,
    /// The request asked not to use the prompt cache (llama-server's
    /// `cache_prompt: false`): its prompt is read whole and its KV is not
    /// kept afterwards.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skip_prompt_cache: bool,
}

/// What a model generates from: the part of an [`InferRequest`] a
/// [`crate::backend::ModelBackend`] needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackendRequest {
    pub prompt: Prompt,
    /// Tokens of an earlier reply (Ollama's `context`) the prompt continues:
    /// submitted first, and the new prompt then begins without BOS.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub context: Vec<i32>,
    pub params: GenerationParams,
}

/// Tools offered to the model, not yet checked against its template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolRequest {
    /// OpenAI-style function tools (`{"type": "function", "function": {…}}`).
    pub definitions: Vec<Value>,
    pub choice: ToolChoice,
    /// The model may call several tools in one reply (OpenAI's
    /// `parallel_tool_calls`, default true).
    #[serde(default = "parallel_by_default")]
    pub parallel: bool,
}

fn parallel_by_default() -> bool {
    true
}

/// One generation, whichever API family asked for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InferRequest {
    /// The model name as the client sent it (echoed in every response).
    pub requested: String,
    /// The parsed name the pool resolves.
    pub name: ModelName,
    pub backend: BackendRequest,
    /// Tools; replies are parsed into tool calls when some take part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<ToolRequest>,
    /// Ollama's `think`: `Some(true)` asks a thinking model to think (400 for
    /// others); `Some(false)` turns thinking off where the template allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub think: Option<bool>,
    /// How long the model stays loaded afterwards (`None`: its default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_alive: Option<KeepAlive>,
    /// Higher is served first when the budget is short (0: normal).
    #[serde(default)]
    pub priority: i32,
    /// Drops the oldest messages of a conversation too long for the context
    /// window ([`crate::truncate`]); `false` makes it a 400.
    #[serde(default = "yes")]
    pub truncate: bool,
}

fn yes() -> bool {
    true
}

impl InferRequest {
    /// A request with the given prompt and parameters, and nothing else set.
    pub fn new(requested: &str, name: ModelName, prompt: Prompt, params: GenerationParams) -> Self {
        InferRequest {
            requested: requested.to_string(),
            name,
            backend: BackendRequest {
                prompt,
                context: Vec::new(),
                params,
            },
            tools: None,
            think: None,
            keep_alive: None,
            priority: 0,
            truncate: true,
        }
    }
}

/// Texts to embed, whichever API family asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbedRequest {
    pub requested: String,
    pub name: ModelName,
    pub batch: EmbedBatch,
    /// Keep the first N dimensions (re-normalised).
    pub dimensions: Option<usize>,
    pub keep_alive: Option<KeepAlive>,
}

/// What a backend embeds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbedBatch {
    pub inputs: Vec<EmbedText>,
    /// Cut inputs longer than the context to its length (else they are an error).
    pub truncate: bool,
    /// Ollama's `options.num_ctx`: the context inputs are measured
    /// against, when smaller than the served one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_ctx: Option<u32>,
}

/// One input to embed: text (tokenized with BOS as the model wants it), or
/// token ids embedded as they are (OpenAI's `input` may be either; on the
/// wire, a string or an array of integers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EmbedText {
    Text(String),
    Tokens(Vec<i32>),
}

impl EmbedText {
    pub fn is_empty(&self) -> bool {
        match self {
            EmbedText::Text(text) => text.is_empty(),
            EmbedText::Tokens(tokens) => tokens.is_empty(),
        }
    }
}
